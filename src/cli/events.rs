//! `holdfast events tail|latest` (SPEC 10): the event feed on the command line, a client of
//! `tcc.v1.Events`. `tail` prints each event as one line (sequence, time, type, reservation,
//! holder, state; with `--json` the JSON API's event, one per line) and follows live; when the
//! stream drops (`UNAVAILABLE`: the coordinator restarting, the network) it subscribes again
//! after the last sequence it read, so no event is printed twice or left out.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{CliError, Target, json, out};
use crate::proto::{self, events_client::EventsClient};

/// The first wait before subscribing again; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// `holdfast events ...`.
#[derive(clap::Subcommand, Debug)]
pub enum EventsCommand {
    /// Print events as they happen (yours; with an admin key, everyone's), until interrupted.
    Tail(TailArgs),
    /// Print the latest sequence of the event log (0 when it is empty).
    Latest {
        #[command(flatten)]
        target: Target,
    },
}

/// `holdfast events tail`.
#[derive(clap::Args, Debug)]
pub struct TailArgs {
    /// Start after this sequence (0: from the oldest event kept); default: only new events.
    #[arg(long)]
    pub after: Option<i64>,
    /// Only events of this type (e.g. reservation_expired; repeatable).
    #[arg(long = "type", value_parser = parse_type)]
    pub types: Vec<proto::event::Type>,
    /// Only events of this holder's reservations (repeatable).
    #[arg(long = "holder")]
    pub holders: Vec<String>,
    /// Only events of reservations holding at this participant (repeatable).
    #[arg(long = "participant")]
    pub participants: Vec<String>,
    #[command(flatten)]
    pub target: Target,
}

impl EventsCommand {
    pub(crate) fn target(&self) -> &Target {
        match self {
            EventsCommand::Tail(args) => &args.target,
            EventsCommand::Latest { target } => target,
        }
    }
}

/// An event type by name, any case; not HEARTBEAT.
fn parse_type(s: &str) -> Result<proto::event::Type, String> {
    match proto::event::Type::from_str_name(&s.to_ascii_uppercase()) {
        Some(proto::event::Type::Unspecified | proto::event::Type::Heartbeat) | None => {
            Err(format!(
                "{s:?} is not an event type: reservation_held, reservation_expired, payment_recorded, refund_pending, admin_action, ..."
            ))
        }
        Some(t) => Ok(t),
    }
}

pub(crate) async fn run(command: EventsCommand) -> Result<(), CliError> {
    match command {
        EventsCommand::Latest { target } => {
            let latest = latest(&target).await?;
            if target.json {
                out(&format!("{}\n", serde_json::json!({ "sequence": latest })));
            } else {
                out(&format!("{latest}\n"));
            }
            Ok(())
        }
        EventsCommand::Tail(args) => tail(args).await,
    }
}

async fn latest(target: &Target) -> Result<i64, CliError> {
    Ok(EventsClient::new(target.channel()?)
        .get_latest_sequence(proto::GetLatestSequenceRequest::default())
        .await
        .map_err(|s| CliError::from_status(&s, &target.coordinator))?
        .into_inner()
        .sequence)
}

/// Follows the feed until interrupted (or refused).
async fn tail(args: TailArgs) -> Result<(), CliError> {
    let target = &args.target;
    let mut after = match args.after {
        Some(n) if n < 0 => return Err(CliError::Usage("--after must be >= 0".into())),
        Some(n) => n,
        None => latest(target).await?,
    };
    let filter = proto::EventFilter {
        holders: args.holders.clone(),
        labels: Default::default(),
        types: args.types.iter().map(|t| *t as i32).collect(),
        participants: args.participants.clone(),
    };
    let mut client = EventsClient::new(target.stream_channel()?);
    let mut backoff = FIRST_BACKOFF;
    loop {
        let request = proto::SubscribeRequest {
            after_sequence: after,
            filter: Some(filter.clone()),
        };
        let dropped = match client.subscribe(request).await {
            Ok(stream) => {
                let mut stream = stream.into_inner();
                print_until_dropped(target, &mut stream, &mut after, &mut backoff).await
            }
            Err(status) => status,
        };
        if dropped.code() != tonic::Code::Unavailable {
            return Err(CliError::from_status(&dropped, &target.coordinator));
        }
        eprintln!(
            "holdfast: event stream lost ({}); subscribing again after sequence {after}",
            dropped.message()
        );
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Prints what `stream` sends, moving `after`; answers why it ended.
async fn print_until_dropped(
    target: &Target,
    stream: &mut tonic::Streaming<proto::Event>,
    after: &mut i64,
    backoff: &mut Duration,
) -> tonic::Status {
    loop {
        let e = match stream.message().await {
            Ok(Some(e)) => e,
            Ok(None) => return tonic::Status::unavailable("the coordinator ended the stream"),
            Err(status) => return status,
        };
        *backoff = FIRST_BACKOFF;
        *after = (*after).max(e.sequence);
        if e.r#type() == proto::event::Type::Heartbeat {
            continue;
        }
        let line = if target.json {
            json::event(&e).to_string()
        } else {
            event_line(&e)
        };
        out(&format!("{line}\n"));
    }
}

/// `SEQUENCE  TIME  TYPE  RESERVATION  HOLDER  STATE`.
fn event_line(e: &proto::Event) -> String {
    let at = e
        .occurred_at
        .as_ref()
        .and_then(|t| DateTime::<Utc>::from_timestamp(t.seconds, u32::try_from(t.nanos).ok()?))
        .map(|t| t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
        .unwrap_or_else(|| "-".to_owned());
    let (id, holder, state) = match &e.reservation {
        Some(r) => (r.id.as_str(), r.holder.as_str(), r.state().as_str_name()),
        None => ("-", "-", "-"),
    };
    format!(
        "{}  {at}  {}  {id}  {holder}  {state}",
        e.sequence,
        e.r#type().as_str_name()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_parse_in_any_case_and_heartbeat_is_refused() {
        assert_eq!(
            parse_type("reservation_held"),
            Ok(proto::event::Type::ReservationHeld)
        );
        assert!(parse_type("HEARTBEAT").is_err());
        assert!(parse_type("type_unspecified").is_err());
        assert!(parse_type("held").is_err());
    }
}
