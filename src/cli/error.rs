//! How a CLI command fails: what it prints (the error's reason first, as a table user and a
//! script both need it) and the exit code it leaves (SPEC 8.2).

use std::collections::BTreeMap;
use std::process::ExitCode;

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
    #[error("{0}")]
    Refused(Box<Refusal>),
}

/// An error answer, as the SPEC's JSON errors spell it (`{"code","reason","message","metadata"}`).
#[derive(Debug)]
pub struct Refusal {
    /// The gRPC status code's name, e.g. `NOT_FOUND`.
    pub code: String,
    /// The ErrorInfo reason, e.g. `RESERVATION_NOT_FOUND` (the code's name when there is none).
    pub reason: String,
    pub message: String,
    pub metadata: BTreeMap<String, String>,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.reason, self.message)?;
        for (k, v) in &self.metadata {
            write!(f, " [{k}={v}]")?;
        }
        Ok(())
    }
}

impl CliError {
    /// The error an answer `status` from the coordinator at `url` means.
    pub fn from_status(status: &Status, url: &str) -> CliError {
        let info = status.get_details_error_info();
        let transport =
            matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded) && info.is_none();
        if transport {
            return CliError::Unreachable {
                url: url.to_owned(),
                message: status.message().to_owned(),
            };
        }
        let code = code_name(status.code()).to_owned();
        let (reason, metadata) = match info {
            Some(info) => (info.reason, info.metadata.into_iter().collect()),
            None => (code.clone(), BTreeMap::new()),
        };
        CliError::Refused(Box::new(Refusal {
            code,
            reason,
            message: status.message().to_owned(),
            metadata,
        }))
    }

    /// The process's exit code for this error.
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(match self {
            CliError::Refused(_) => 1,
            CliError::Usage(_) => 2,
            CliError::Unreachable { .. } => 3,
        })
    }

    /// The error as JSON, for `--json`.
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            CliError::Refused(r) => serde_json::json!({
                "code": r.code,
                "reason": r.reason,
                "message": r.message,
                "metadata": r.metadata,
            }),
            CliError::Usage(message) => serde_json::json!({
                "code": "INVALID_ARGUMENT",
                "reason": "USAGE",
                "message": message,
                "metadata": {},
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

/// gRPC's canonical name of `code`.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}
