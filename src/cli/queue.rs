//! `holdfast admin queue PARTICIPANT RESOURCE`: a resource's waitlist (SPEC 11) in offer order,
//! read through Admin `ListQueue` page after page until the last, then printed whole: a table
//! (position, reservation, holder, quantity, since, until) and the queue's length, or with
//! `--json` one object `{"entries": [...], "length": N}`.

use chrono::{DateTime, Utc};

use super::target::CliChannel;
use super::{CliError, Target, json, out, render};
use crate::proto::{self, admin_client::AdminClient};

/// What `admin queue` asks for.
#[derive(clap::Args, Clone, Debug)]
pub struct QueueQuery {
    /// The participant's registered name.
    participant: String,
    /// The resource id at that participant.
    resource: String,
    /// The slot, for slot resources: START/END, two RFC 3339 instants.
    #[arg(long, value_parser = parse_interval)]
    during: Option<proto::Interval>,
    /// Entries per call (1..500); every page is read.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i32).range(1..=500))]
    page_size: i32,
}

/// The whole queue: every page's entries, and the length the last page said.
struct Queue {
    entries: Vec<proto::QueuedReservation>,
    length: i64,
}

/// Reads every page of the queue and prints it.
pub(super) async fn run(
    query: QueueQuery,
    target: &Target,
    admin: &mut AdminClient<CliChannel>,
) -> Result<(), CliError> {
    let queue = read(&query, admin)
        .await
        .map_err(|s| CliError::from_status(&s, &target.coordinator))?;
    if target.json {
        let entries: Vec<_> = queue.entries.iter().map(json::queued_reservation).collect();
        let v = serde_json::json!({ "entries": entries, "length": queue.length });
        out(&format!("{v}\n"));
    } else {
        out(&table(&queue, Utc::now()));
    }
    Ok(())
}

async fn read(
    args: &QueueQuery,
    admin: &mut AdminClient<CliChannel>,
) -> Result<Queue, tonic::Status> {
    let mut queue = Queue {
        entries: Vec::new(),
        length: 0,
    };
    let mut page_token = String::new();
    loop {
        let request = proto::ListQueueRequest {
            participant: args.participant.clone(),
            resource: args.resource.clone(),
            during: args.during,
            page_size: args.page_size,
            page_token,
        };
        let page = admin.list_queue(request).await?.into_inner();
        queue.entries.extend(page.entries);
        queue.length = page.length;
        if page.next_page_token.is_empty() {
            return Ok(queue);
        }
        page_token = page.next_page_token;
    }
}

/// The queue as a table, head first, and its length (or that nobody waits).
fn table(queue: &Queue, now: DateTime<Utc>) -> String {
    let rows: Vec<Vec<String>> = queue
        .entries
        .iter()
        .map(|e| {
            vec![
                e.position.to_string(),
                e.reservation_id.clone(),
                e.holder.clone(),
                e.quantity.to_string(),
                render::at(e.since.as_ref()),
                render::until(e.until.as_ref(), now),
            ]
        })
        .collect();
    if rows.is_empty() {
        return "nobody is waiting (length 0)\n".to_owned();
    }
    let mut text = render::table(
        &["POSITION", "RESERVATION", "HOLDER", "QTY", "SINCE", "UNTIL"],
        &rows,
    );
    text.push_str(&format!("\nlength: {}\n", queue.length));
    text
}

/// `START/END`: a slot as two RFC 3339 instants.
pub(super) fn parse_interval(s: &str) -> Result<proto::Interval, String> {
    let (start, end) = s
        .split_once('/')
        .ok_or_else(|| format!("{s:?} is not START/END (two RFC 3339 instants)"))?;
    let start = super::parse_time(start)?;
    let end = super::parse_time(end)?;
    if end <= start {
        return Err(format!("{s:?}: the end must be after the start"));
    }
    Ok(proto::Interval {
        start: Some(super::timestamp(start)),
        end: Some(super::timestamp(end)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_two_instants_in_order() {
        let slot = parse_interval("2026-12-01T10:00:00Z/2026-12-01T11:00:00Z").unwrap();
        assert_eq!(slot.start.map(|t| t.seconds), Some(1_796_119_200));
        assert_eq!(slot.end.map(|t| t.seconds), Some(1_796_122_800));
        assert!(parse_interval("2026-12-01T10:00:00Z").is_err());
        assert!(parse_interval("2026-12-01T11:00:00Z/2026-12-01T10:00:00Z").is_err());
        assert!(parse_interval("noon/2026-12-01T10:00:00Z").is_err());
    }

    #[test]
    fn an_empty_queue_says_nobody_waits() {
        let empty = Queue {
            entries: Vec::new(),
            length: 0,
        };
        assert_eq!(table(&empty, Utc::now()), "nobody is waiting (length 0)\n");
    }
}
