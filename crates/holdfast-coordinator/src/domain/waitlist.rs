//! Waitlists (SPEC 11): the key of a resource's queue, where a `QUEUED` reservation waits,
//! and the rules of a Reserve's `queue` option. Pure types; the queues themselves live in the
//! store (`store/waitlist.rs`) and the offers in `coordinator/waitlist.rs`.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::field::FieldError;
use super::{Hold, Interval};

/// `rejection.reason` of a queued reservation whose wait ended (SPEC 11).
pub const QUEUE_WAIT_ENDED: &str = "QUEUE_WAIT_ENDED";

/// One resource's queue: per (participant, resource, slot), first queued, first offered.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueKey {
    pub participant: String,
    pub resource: String,
    pub during: Option<Interval>,
}

impl QueueKey {
    /// The queue a hold waits in.
    pub fn of(hold: &Hold) -> QueueKey {
        QueueKey {
            participant: hold.participant.clone(),
            resource: hold.resource.clone(),
            during: hold.during,
        }
    }

    /// The slot as the store keys it: `""` for a stock resource, `"<start>/<end>"` in
    /// microseconds since the epoch for a slot resource.
    pub fn slot(&self) -> String {
        match self.during {
            None => String::new(),
            Some(d) => format!(
                "{}/{}",
                d.start.timestamp_micros(),
                d.end.timestamp_micros()
            ),
        }
    }

    /// Whether `hold` waits in this queue.
    pub fn holds(&self, hold: &Hold) -> bool {
        hold.participant == self.participant
            && hold.resource == self.resource
            && hold.during == self.during
    }
}

impl fmt::Display for QueueKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.participant, self.resource)?;
        if let Some(d) = self.during {
            write!(f, "@{}..{}", d.start.to_rfc3339(), d.end.to_rfc3339())?;
        }
        Ok(())
    }
}

/// Where a `QUEUED` reservation waits: the first queue it joined.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuePlace {
    /// 1 for the head: the next to be offered.
    pub position: i64,
    pub key: QueueKey,
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
}

/// One reservation waiting in a queue, as Admin `ListQueue` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuedReservation {
    /// The queue's own order (store sequence); a page token resumes after it.
    pub seq: i64,
    pub position: i64,
    pub reservation_id: Uuid,
    pub holder: String,
    pub quantity: i64,
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
}

/// A page of a queue in offer order, and its length.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueuePage {
    pub entries: Vec<QueuedReservation>,
    pub length: i64,
}

/// A Reserve's `queue` option as the caller sent it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueOptions {
    pub wait_up_to: Option<Duration>,
}

/// The waitlist settings (`--max-queue-length`, `--queue-sweep`; `--max-queue-wait` is a
/// validation limit, `Limits::max_queue_wait`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueuePolicy {
    /// The most reservations one resource's queue takes; then `QUEUE_FULL`.
    pub max_length: u32,
    /// How often capacity that came back another way (PutResources, another replica) is
    /// looked for, and ended waits are rejected.
    pub sweep: Duration,
}

impl Default for QueuePolicy {
    fn default() -> Self {
        QueuePolicy {
            max_length: 10_000,
            sweep: Duration::from_secs(2),
        }
    }
}

/// Checks a Reserve's `queue.wait_up_to`: present, positive, at most `max_wait`.
pub fn wait_up_to(wait: Option<Duration>, max_wait: Duration) -> Result<Duration, FieldError> {
    let field = "queue.wait_up_to";
    match wait {
        None => Err(FieldError::new(field, "is required when queue is given")),
        Some(w) if w.is_zero() => Err(FieldError::new(field, "must be positive")),
        Some(w) if w > max_wait => Err(FieldError::new(
            field,
            format!(
                "must be at most {}s (--max-queue-wait; got {}s)",
                max_wait.as_secs(),
                w.as_secs_f64()
            ),
        )),
        Some(w) => Ok(w),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_up_to_is_required_positive_and_bounded() {
        let max = Duration::from_secs(60);
        assert_eq!(wait_up_to(None, max).unwrap_err().field, "queue.wait_up_to");
        assert!(wait_up_to(Some(Duration::ZERO), max).is_err());
        assert!(wait_up_to(Some(Duration::from_secs(61)), max).is_err());
        assert_eq!(
            wait_up_to(Some(Duration::from_secs(60)), max).unwrap(),
            Duration::from_secs(60)
        );
    }

    #[test]
    fn a_slot_keys_its_queue_apart_from_the_resource_alone() {
        let start = DateTime::from_timestamp(1_000, 0).unwrap();
        let end = DateTime::from_timestamp(2_000, 0).unwrap();
        let stock = QueueKey {
            participant: "rooms".into(),
            resource: "r1".into(),
            during: None,
        };
        let slot = QueueKey {
            during: Some(Interval { start, end }),
            ..stock.clone()
        };
        assert_eq!(stock.slot(), "");
        assert_eq!(slot.slot(), "1000000000/2000000000");
    }
}
