//! Events (SPEC 10): what happened to a reservation, in the order readers receive it. The
//! database appends one in the transaction of every change (the outbox, `store/events.rs`);
//! readers and sinks resume after a [`Event::sequence`].

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{BranchState, Reservation};

/// What an event says happened. The names are SPEC 10's (`tcc.v1.Event.Type`), stored as
/// they are shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    Trying,
    Held,
    Queued,
    Confirming,
    Confirmed,
    Cancelling,
    Cancelled,
    Expired,
    Rejected,
    Failed,
    Extended,
    PaymentRecorded,
    RefundPending,
    RefundRefunded,
    RefundFailed,
    AdminAction,
    /// Not stored: a live stream's sign of life, carrying the latest sequence.
    Heartbeat,
}

impl EventType {
    /// Every type, for parsing and tests.
    pub const ALL: [EventType; 17] = [
        EventType::Trying,
        EventType::Held,
        EventType::Queued,
        EventType::Confirming,
        EventType::Confirmed,
        EventType::Cancelling,
        EventType::Cancelled,
        EventType::Expired,
        EventType::Rejected,
        EventType::Failed,
        EventType::Extended,
        EventType::PaymentRecorded,
        EventType::RefundPending,
        EventType::RefundRefunded,
        EventType::RefundFailed,
        EventType::AdminAction,
        EventType::Heartbeat,
    ];

    /// The name stored in the database and shown in the API (`RESERVATION_HELD`).
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Trying => "RESERVATION_TRYING",
            EventType::Held => "RESERVATION_HELD",
            EventType::Queued => "RESERVATION_QUEUED",
            EventType::Confirming => "RESERVATION_CONFIRMING",
            EventType::Confirmed => "RESERVATION_CONFIRMED",
            EventType::Cancelling => "RESERVATION_CANCELLING",
            EventType::Cancelled => "RESERVATION_CANCELLED",
            EventType::Expired => "RESERVATION_EXPIRED",
            EventType::Rejected => "RESERVATION_REJECTED",
            EventType::Failed => "RESERVATION_FAILED",
            EventType::Extended => "RESERVATION_EXTENDED",
            EventType::PaymentRecorded => "PAYMENT_RECORDED",
            EventType::RefundPending => "REFUND_PENDING",
            EventType::RefundRefunded => "REFUND_REFUNDED",
            EventType::RefundFailed => "REFUND_FAILED",
            EventType::AdminAction => "ADMIN_ACTION",
            EventType::Heartbeat => "HEARTBEAT",
        }
    }

    /// Parses a stored or shown name.
    pub fn parse(s: &str) -> Option<EventType> {
        EventType::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// The NATS subject's last part: the name in lower case (`reservation_held`).
    pub fn subject_suffix(self) -> String {
        self.as_str().to_ascii_lowercase()
    }
}

/// One entry of the log.
#[derive(Clone, Debug)]
pub struct Event {
    /// Strictly increasing in the order readers receive events; a reader resumes after it.
    pub sequence: i64,
    /// Unique per event; NATS's `Nats-Msg-Id`, a webhook's `Holdfast-Event-Id`.
    pub event_id: Uuid,
    pub event_type: EventType,
    /// When the change was written (database clock).
    pub occurred_at: DateTime<Utc>,
    /// The reservation as the change left it. Its `state` is the stored state, not the lazily
    /// expired one; its branches are read with the event, their states as the change left
    /// them where the lifecycle fixes them ([`Event::with_branch_states_of_its_change`]).
    pub reservation: Reservation,
    /// The principal the reservation belongs to (SPEC 7.2).
    pub owner: String,
    /// On a `RESERVATION_HELD`: a waitlist offer placed it.
    pub from_queue: bool,
}

impl Event {
    /// The event with its branches' states as its change left them where the lifecycle fixes
    /// them, since a reader reads the branches when it reads the event, maybe after later
    /// changes: `TRYING`, every branch `PENDING` (nothing tried yet); `HELD`, `CONFIRMING`,
    /// `EXTENDED`, every branch `HELD` (each happens only while every branch holds). Other
    /// types keep the states as read: a terminal reservation's branches no longer change, and
    /// the rest (`CANCELLING`, payments, refunds, operator actions) show what they led to.
    /// `attempts` and `last_error` are always as read.
    pub(crate) fn with_branch_states_of_its_change(mut self) -> Event {
        let state = match self.event_type {
            EventType::Trying => BranchState::Pending,
            EventType::Held | EventType::Confirming | EventType::Extended => BranchState::Held,
            _ => return self,
        };
        for branch in &mut self.reservation.branches {
            branch.state = state;
        }
        self
    }
}

/// What a reader wants: every given criterion must match; an empty one matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EventFilter {
    /// Reservations of any of these holders.
    pub holders: Vec<String>,
    /// Reservations carrying every one of these labels.
    pub labels: BTreeMap<String, String>,
    /// Any of these types.
    pub types: Vec<EventType>,
    /// Reservations holding at any of these participants.
    pub participants: Vec<String>,
}

impl EventFilter {
    /// Whether `event` is one the reader wants.
    pub fn matches(&self, event: &Event) -> bool {
        let r = &event.reservation;
        (self.types.is_empty() || self.types.contains(&event.event_type))
            && (self.holders.is_empty() || self.holders.contains(&r.holder))
            && self
                .labels
                .iter()
                .all(|(k, v)| r.labels.get(k).is_some_and(|have| have == v))
            && (self.participants.is_empty()
                || r.branches
                    .iter()
                    .any(|b| self.participants.contains(&b.hold.participant)))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::domain::{Branch, BranchState, Hold, State, TokenCheck};

    fn event(event_type: EventType, holder: &str, participant: &str) -> Event {
        let now = chrono::Utc::now();
        let reservation = Reservation {
            id: uuid::Uuid::nil(),
            request_id: "r".into(),
            holder: holder.into(),
            state: State::Held,
            stored_state: State::Held,
            release_outcome: None,
            owner: String::new(),
            token: TokenCheck {
                digest: [0; 32],
                key_id: None,
            },
            ttl: Duration::from_secs(60),
            created_at: now,
            expires_at: now,
            extensions_used: 0,
            labels: [("shop".to_owned(), "eu".to_owned())].into(),
            branches: vec![branch(participant)],
            rejection: None,
            late_payment_honored: false,
            version: 1,
            payment: None,
            refund: None,
            generation: 0,
            audit: Vec::new(),
            further_payments: None,
            queue: None,
        };
        Event {
            sequence: 1,
            event_id: uuid::Uuid::nil(),
            event_type,
            occurred_at: now,
            reservation,
            owner: String::new(),
            from_queue: false,
        }
    }

    fn branch(participant: &str) -> Branch {
        Branch {
            branch_id: uuid::Uuid::nil(),
            hold: Hold {
                participant: participant.into(),
                resource: "A1".into(),
                quantity: 1,
                during: None,
            },
            state: BranchState::Held,
            attempts: 0,
            last_error: None,
        }
    }

    #[test]
    fn every_given_criterion_must_match() {
        let held = event(EventType::Held, "alice", "seats");
        assert!(EventFilter::default().matches(&held));
        let by = |f: EventFilter| f.matches(&held);
        assert!(by(EventFilter {
            holders: vec!["bob".into(), "alice".into()],
            types: vec![EventType::Held, EventType::Expired],
            participants: vec!["rooms".into(), "seats".into()],
            labels: [("shop".to_owned(), "eu".to_owned())].into(),
        }));
        assert!(!by(EventFilter {
            holders: vec!["bob".into()],
            ..Default::default()
        }));
        assert!(!by(EventFilter {
            types: vec![EventType::Confirmed],
            ..Default::default()
        }));
        assert!(!by(EventFilter {
            participants: vec!["rooms".into()],
            ..Default::default()
        }));
        assert!(!by(EventFilter {
            labels: [
                ("shop".to_owned(), "eu".to_owned()),
                ("tier".to_owned(), "gold".to_owned())
            ]
            .into(),
            ..Default::default()
        }));
    }
}
