//! The command line of a running coordinator (SPEC 8.2): `holdfast get|list|watch`,
//! `holdfast admin stuck|retry|force-cancel|resolve|audit|sinks|queue` and `holdfast events tail|latest`
//! ([`events`]), gRPC clients of `tcc.v1.Coordinator`, `tcc.v1.Admin` and `tcc.v1.Events` with the TLS and API-key flags ([`target`]).
//! Human tables by default ([`render`]), `--json` for scripts ([`json`]); exit code 0 on
//! success, else the error's reason on stderr and 1 (refused, or no id with the prefix given),
//! 2 (usage), 3 (unreachable) or 4 (an id prefix with several matches) ([`error`]). `get` and
//! `watch` take an id or its first characters ([`find`]).

pub mod admin;
pub mod error;
pub mod events;
mod find;
mod queue;
pub use crate::json;
pub mod render;
pub mod target;
pub mod watch;

use std::io::Write;
use std::process::ExitCode;

use chrono::{DateTime, Utc};
pub(crate) use error::CliError;
pub use target::Target;

use crate::proto::{self, reservation::State};

/// The CLI's commands (flattened into the binary's).
#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Show one reservation: state, expiry, branches (attempts, last error), refund, audit.
    Get {
        /// The reservation's id, or its first characters (at least 4 hex digits).
        id: String,
        #[command(flatten)]
        target: Target,
    },
    /// List reservations, newest first (yours; with an admin key, everyone's).
    List(ListArgs),
    /// Follow one reservation until it ends: a live countdown to its expiry and a line per
    /// state change.
    Watch {
        /// The reservation's id, or its first characters (at least 4 hex digits).
        id: String,
        #[command(flatten)]
        target: Target,
    },
    /// Operator actions (tcc.v1.Admin; the key needs the admin role).
    #[command(subcommand)]
    Admin(admin::AdminCommand),
    /// The event feed (tcc.v1.Events): `tail` follows it, `latest` prints its latest sequence.
    #[command(subcommand)]
    Events(events::EventsCommand),
}

/// `holdfast list`.
#[derive(clap::Args, Debug)]
pub struct ListArgs {
    /// Only this holder's reservations.
    #[arg(long)]
    pub holder: Option<String>,
    /// Only reservations in this state (e.g. held, queued, confirmed, failed).
    #[arg(long, value_parser = parse_state)]
    pub state: Option<State>,
    /// Only reservations with a branch at this participant.
    #[arg(long)]
    pub participant: Option<String>,
    /// Only reservations created at or after this instant (RFC 3339).
    #[arg(long, value_parser = parse_time)]
    pub created_after: Option<DateTime<Utc>>,
    /// Only reservations created before this instant (RFC 3339).
    #[arg(long, value_parser = parse_time)]
    pub created_before: Option<DateTime<Utc>>,
    /// Only reservations with this label (KEY=VALUE; repeatable).
    #[arg(long = "label", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// Results per page (at most 500).
    #[arg(long, default_value_t = 50)]
    pub page_size: i32,
    /// Continue from a previous page.
    #[arg(long, default_value = "")]
    pub page_token: String,
    #[command(flatten)]
    pub target: Target,
}

impl Command {
    fn target(&self) -> &Target {
        match self {
            Command::Get { target, .. } | Command::Watch { target, .. } => target,
            Command::List(args) => &args.target,
            Command::Admin(command) => command.target(),
            Command::Events(command) => command.target(),
        }
    }
}

/// Runs one command; prints its result or its error, and answers the exit code.
pub async fn run(command: Command) -> ExitCode {
    let json = command.target().json;
    match execute(command).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if json {
                eprintln!("{}", e.to_json());
            } else {
                eprintln!("holdfast: {e}");
            }
            e.exit_code()
        }
    }
}

async fn execute(command: Command) -> Result<(), CliError> {
    match command {
        Command::Get { id, target } => {
            let id = find::full_id(&target, id).await?;
            let mut client = target.coordinator()?;
            let r = client
                .get_reservation(proto::GetReservationRequest { reservation_id: id })
                .await
                .map_err(|s| CliError::from_status(&s, &target.coordinator))?
                .into_inner();
            print_reservation(&target, &r);
            Ok(())
        }
        Command::List(args) => list(args).await,
        Command::Watch { id, target } => {
            let id = find::full_id(&target, id).await?;
            watch::run(&target, id).await
        }
        Command::Admin(command) => admin::run(command).await,
        Command::Events(command) => events::run(command).await,
    }
}

async fn list(args: ListArgs) -> Result<(), CliError> {
    let target = &args.target;
    let mut client = target.coordinator()?;
    let page = client
        .list_reservations(proto::ListReservationsRequest {
            holder: args.holder.unwrap_or_default(),
            state: args.state.map_or(0, |s| s as i32),
            page_size: args.page_size,
            page_token: args.page_token,
            participant: args.participant.unwrap_or_default(),
            created_after: args.created_after.map(timestamp),
            created_before: args.created_before.map(timestamp),
            labels: args.labels.into_iter().collect(),
            ..Default::default()
        })
        .await
        .map_err(|s| CliError::from_status(&s, &target.coordinator))?
        .into_inner();
    print_page(target, &page.reservations, &page.next_page_token);
    Ok(())
}

/// Prints one reservation as `target` asks.
fn print_reservation(target: &Target, r: &proto::Reservation) {
    if target.json {
        out(&format!("{}\n", json::reservation(r)));
    } else {
        out(&render::reservation(r, Utc::now()));
    }
}

/// Prints a page of reservations as `target` asks (the next page's flag on stderr).
fn print_page(target: &Target, list: &[proto::Reservation], next_page_token: &str) {
    if target.json {
        out(&format!("{}\n", json::reservations(list, next_page_token)));
        return;
    }
    out(&render::reservations(list, Utc::now()));
    if !next_page_token.is_empty() {
        eprintln!("more: --page-token {next_page_token}");
    }
}

/// Writes to stdout; a closed pipe (`holdfast list | head`) is not an error.
fn out(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush());
}

fn timestamp(t: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.timestamp(),
        nanos: i32::try_from(t.timestamp_subsec_nanos()).unwrap_or(0),
    }
}

/// A reservation state by name, any case.
pub fn parse_state(s: &str) -> Result<State, String> {
    match State::from_str_name(&s.to_ascii_uppercase()) {
        Some(State::Unspecified) | None => Err(format!(
            "{s:?} is not a state: trying, held, confirming, confirmed, cancelling, cancelled, expired, rejected, failed or queued"
        )),
        Some(state) => Ok(state),
    }
}

fn parse_time(s: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("{s:?} is not an RFC 3339 instant such as 2026-12-01T10:00:00Z: {e}"))
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_parse_in_any_case_and_unspecified_is_refused() {
        assert_eq!(parse_state("held"), Ok(State::Held));
        assert_eq!(parse_state("FAILED"), Ok(State::Failed));
        assert_eq!(parse_state("queued"), Ok(State::Queued));
        assert!(parse_state("state_unspecified").is_err());
        assert!(parse_state("sold").is_err());
        assert!(parse_label("=x").is_err());
        assert_eq!(parse_label("a=b=c"), Ok(("a".into(), "b=c".into())));
    }
}
