//! `holdfast participant-check URL`: a black-box conformance run against any
//! `tcc.v1.Participant` (any language) - the barrier rules of SPEC 3.3 checked from outside,
//! with a resource the author names (`--resource R --capacity N`; created through
//! `tcc.v1.ResourceAdmin` when the participant offers it). A gRPC client of the participant
//! only: it never uses the SDK, the reference participants, a store or the coordinator.
//!
//! Inside: `target.rs` (URL, `--api-key`, TLS flags, channels), `subject.rs` (what the
//! participant offers, found out once; per-case resources), `cases/` (the cases by topic),
//! `runner.rs` (the case list and the bounded run), `report.rs` (table and JSON). Exit codes
//! as the CLI's: 0 every case passed or was skipped, 1 a case failed, 2 usage, 3 the
//! participant could not be reached.

pub mod cases;
pub mod report;
pub mod runner;
pub mod subject;
pub mod target;

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

pub use report::{Report, Row, Verdict};
pub use runner::CASES;
pub use target::Target;

/// `holdfast participant-check`'s flags.
#[derive(clap::Args, Clone, Debug)]
pub struct CheckArgs {
    #[command(flatten)]
    pub target: Target,
    /// The resource the cases hold (a seat, SKU, room, account). With --capacity and a
    /// participant offering ResourceAdmin/PutResources, each case gets a fresh resource named
    /// R-<run>-<n>; otherwise every case uses R itself, which must exist.
    #[arg(long)]
    pub resource: String,
    /// The resource's capacity in units (seats and rooms: 1; payments: the balance). Without
    /// it the capacity cases are skipped.
    #[arg(long)]
    pub capacity: Option<i64>,
    /// Units each Try holds (seats and rooms: 1; payments: an amount in minor units).
    #[arg(long, default_value_t = 1)]
    pub quantity: i64,
    /// Items carry a time slot of this length (slot resources such as rooms), covering now.
    #[arg(long, value_parser = crate::config::parse_duration)]
    pub slot: Option<Duration>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Why a run could not judge the participant.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// A flag is wrong, or the participant refused the resource the flags describe. Exit 2.
    #[error("{0}")]
    Usage(String),
    /// The participant did not answer. Exit 3.
    #[error("cannot reach the participant at {url}: {message}")]
    Unreachable { url: String, message: String },
}

impl CheckError {
    /// The process's exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            CheckError::Usage(_) => 2,
            CheckError::Unreachable { .. } => 3,
        }
    }
}

/// Runs every case against the participant `args` names.
pub async fn check(args: CheckArgs) -> Result<Report, CheckError> {
    let subject = subject::Subject::connect(args).await?;
    Ok(runner::run_all(&subject).await)
}

/// The subcommand: runs the check, prints the table (or JSON), answers the exit code.
pub async fn run(args: CheckArgs) -> ExitCode {
    let json = args.json;
    match check(args).await {
        Ok(report) => {
            let text = if json {
                format!("{}\n", report.to_json())
            } else {
                report.table()
            };
            let mut stdout = std::io::stdout().lock();
            let _ = stdout
                .write_all(text.as_bytes())
                .and_then(|()| stdout.flush());
            if report.count(Verdict::Fail) > 0 {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            if json {
                let (reason, code) = match &e {
                    CheckError::Usage(_) => ("USAGE", "INVALID_ARGUMENT"),
                    CheckError::Unreachable { .. } => ("UNREACHABLE", "UNAVAILABLE"),
                };
                eprintln!(
                    "{}",
                    serde_json::json!({"code": code, "reason": reason, "message": e.to_string(), "metadata": {}})
                );
            } else {
                eprintln!("holdfast: {e}");
            }
            ExitCode::from(e.exit_code())
        }
    }
}
