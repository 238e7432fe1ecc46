//! Events (SPEC 10): what happened to a reservation, in the order readers receive it. The
//! database appends one in the transaction of every change (the outbox, `store/events.rs`);
//! readers and sinks resume after a [`Event::sequence`].

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::Reservation;

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
    /// The reservation as the change left it (its branches as read with the event). Its
    /// `state` is the stored state, not the lazily expired one.
    pub reservation: Reservation,
    /// The principal the reservation belongs to (SPEC 7.2).
    pub owner: String,
    /// On a `RESERVATION_HELD`: a waitlist offer placed it.
    pub from_queue: bool,
}
