//! How a CLI command fails: what it prints (the error's reason first, as a table user and a
//! script both need it) and the exit code it leaves (SPEC 8.2). An answer from the coordinator
//! is printed as the HTTP API prints it ([`crate::json::error`]), one shape for both.

use std::process::ExitCode;

use serde_json::Value;
use tonic::{Code, Status};
use tonic_types::StatusExt;

/// Why a CLI command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A flag or argument is wrong; nothing was sent. Exit code 2.
    #[error("{0}")]
    Usage(String),
    /// The coordinator could not be reached (or did not answer in time). Exit code 3.
    #[error("cannot reach the coordinator at {url}: {message}")]
    Unreachable { url: String, message: String },
    /// The coordinator answered with an error. Exit code 1.
    #[error("{}", refusal_line(.0))]
    Refused(Box<Status>),
    /// No reservation id starts with the prefix given. Exit code 1, as a missing id.
    #[error("RESERVATION_NOT_FOUND: no reservation id starts with {0:?}")]
    NoMatch(String),
    /// More than one reservation id starts with the prefix given (the candidates are printed
    /// on stdout). Exit code 4.
    #[error(
        "AMBIGUOUS_ID: {}{shown} reservation ids start with {prefix:?}; give more of the id",
        if *.more { "more than " } else { "" }
    )]
    Ambiguous {
        prefix: String,
        shown: usize,
        more: bool,
    },
}

/// `REASON: message [key=value]...`; the code's name stands in for a missing reason.
fn refusal_line(status: &Status) -> String {
    let v = crate::json::error(status);
    let mut line = format!(
        "{}: {}",
        v["reason"]
            .as_str()
            .unwrap_or(v["code"].as_str().unwrap_or("")),
        status.message()
    );
    if let Some(metadata) = v["metadata"].as_object() {
        for (k, value) in metadata {
            line.push_str(&format!(" [{k}={}]", value.as_str().unwrap_or_default()));
        }
    }
    line
}

impl CliError {
    /// The error an answer `status` from the coordinator at `url` means.
    pub fn from_status(status: &Status, url: &str) -> CliError {
        let transport = matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded)
            && status.get_details_error_info().is_none();
        if transport {
            return CliError::Unreachable {
                url: url.to_owned(),
                message: status.message().to_owned(),
            };
        }
        CliError::Refused(Box::new(status.clone()))
    }

    /// The process's exit code for this error.
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(match self {
            CliError::Refused(_) | CliError::NoMatch(_) => 1,
            CliError::Usage(_) => 2,
            CliError::Unreachable { .. } => 3,
            CliError::Ambiguous { .. } => 4,
        })
    }

    /// The error as JSON, for `--json`: the SPEC's `{"code","reason","message","metadata"}`.
    pub(crate) fn to_json(&self) -> Value {
        match self {
            CliError::Refused(status) => crate::json::error(status),
            CliError::Usage(message) => serde_json::json!({
                "code": "INVALID_ARGUMENT",
                "reason": "USAGE",
                "message": message,
                "metadata": {},
            }),
            CliError::NoMatch(prefix) => serde_json::json!({
                "code": "NOT_FOUND",
                "reason": "RESERVATION_NOT_FOUND",
                "message": self.to_string(),
                "metadata": { "id_prefix": prefix },
            }),
            CliError::Ambiguous { prefix, .. } => serde_json::json!({
                "code": "FAILED_PRECONDITION",
                "reason": "AMBIGUOUS_ID",
                "message": self.to_string(),
                "metadata": { "id_prefix": prefix },
            }),
            CliError::Unreachable { url, message } => serde_json::json!({
                "code": "UNAVAILABLE",
                "reason": "UNREACHABLE",
                "message": message,
                "metadata": { "coordinator": url },
            }),
        }
    }
}
