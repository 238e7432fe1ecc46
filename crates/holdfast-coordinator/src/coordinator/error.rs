//! The coordinator's errors: every way a request can fail, in domain terms. The API layer maps
//! them to gRPC statuses in one place (`api::error`).

use uuid::Uuid;

use super::WatchScope;
use crate::domain::policy::LimitScope;
use crate::domain::validate::FieldError;
use crate::domain::{Refund, RefundState, Rejection, Reservation, State};
use crate::store::StoreError;
use crate::store::fault::Fault;

/// How an error message tells about the payment's refund, if there is one.
/// What a Confirm answered `LATE_PAYMENT_IN_PROGRESS` should do: repeat it, unless its own
/// payment is another one, which is refunded.
fn in_progress_note(refund: Option<&Refund>) -> String {
    match refund {
        None => "retry shortly".to_owned(),
        Some(_) => format!(
            "this Confirm's payment is another one and is not applied{}",
            refund_note(refund)
        ),
    }
}

fn refund_note(refund: Option<&Refund>) -> String {
    match refund {
        Some(r) if r.state == RefundState::Refunded => {
            format!("; the payment was refunded (refund {})", r.refund_id)
        }
        Some(r) if r.state == RefundState::Failed => format!(
            "; the payment's refund {} was refused by the payment service and needs a person",
            r.refund_id
        ),
        Some(r) => format!("; the payment is being refunded (refund {})", r.refund_id),
        None => String::new(),
    }
}

/// Why a coordinator operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    InvalidArgument(#[from] FieldError),

    #[error("reservation {0} not found")]
    NotFound(Uuid),

    #[error("name: no webhook named {0:?} is configured")]
    UnknownWebhook(String),

    #[error("{field}: no participant named {name:?} is registered")]
    UnknownParticipant { field: String, name: String },

    #[error("hold_token does not match reservation {0}; nothing was changed")]
    TokenMismatch(Uuid),

    #[error(
        "reservation {id} was rejected: {participant} cannot hold {resource}: {reason}; nothing is held",
        id = .reservation.id,
        participant = .rejection.participant,
        resource = .rejection.resource,
        reason = .rejection.reason
    )]
    InsufficientCapacity {
        reservation: Box<Reservation>,
        rejection: Rejection,
    },

    #[error(
        "{participant} cannot hold {quantity_note}{resource}: {reason} (refused {age_ms} ms ago, no unit released since); nothing was recorded, try again later",
        participant = .0.participant,
        resource = .0.resource,
        reason = .0.reason,
        quantity_note = if .0.quantity > 1 { format!("{} or more of ", .0.quantity) } else { String::new() },
        age_ms = .0.age.as_millis()
    )]
    SoldOut(super::sold_out::SoldOutHit),

    #[error(
        "participant {participant} could not be reached while placing reservation {reservation_id} ({detail}); nothing stays held"
    )]
    ParticipantUnavailable {
        reservation_id: Uuid,
        participant: String,
        detail: String,
    },

    #[error("the hold of reservation {id} expired; reserve again{}", refund_note(refund.as_ref()))]
    HoldExpired { id: Uuid, refund: Option<Refund> },

    #[error("reservation {id} is {state}: it can no longer be changed this way{}", refund_note(refund.as_ref()))]
    Closed {
        id: Uuid,
        state: State,
        refund: Option<Refund>,
    },

    /// The Confirm's payment is not one this reservation may record (SPEC 7.3): `check` names
    /// which check failed (`exists`, `reservation`, `currency`, `amount`, `payments_service`,
    /// `payment_ref`).
    #[error("payment does not match reservation {id}: {problem}; nothing was changed")]
    PaymentMismatch {
        id: Uuid,
        check: &'static str,
        problem: String,
    },

    #[error(
        "payment participant {participant} could not be reached to check the payment for reservation {id} ({detail}); nothing was changed, retry"
    )]
    PaymentUnverified {
        id: Uuid,
        participant: String,
        detail: String,
    },

    /// A participant could not be told an extension (Extend tells every participant before it
    /// records the new deadline): nothing was recorded.
    #[error(
        "participant {participant} could not be reached to extend reservation {id} ({detail}); the reservation was not extended, retry"
    )]
    ExtendUnavailable {
        id: Uuid,
        participant: String,
        detail: String,
    },

    /// Another late payment is being honoured. `refund`: this Confirm's own payment, recorded
    /// and refunded (it is not applied, SPEC 3.1).
    #[error("a late payment for reservation {id} is being processed; {}", in_progress_note(refund.as_ref()))]
    InProgress { id: Uuid, refund: Option<Refund> },

    #[error("reservation {0} is still placing its holds; retry once it is HELD")]
    NotHeld(Uuid),

    /// `Resolve` settles only a `FAILED` reservation.
    #[error(
        "reservation {id} is {state}, not FAILED: only a FAILED reservation can be resolved; nothing was changed"
    )]
    NotFailed { id: Uuid, state: State },

    /// `ExpireNow` (test mode) expires only a `TRYING` or `HELD` reservation.
    #[error(
        "reservation {id} is {state}: only a TRYING or HELD reservation can be expired; nothing was changed"
    )]
    NotExpirable { id: Uuid, state: State },

    #[error(
        "reservation {id} cannot be extended further (extensions used: {used}, max_extensions: {max}, max_ttl: {max_ttl_secs}s)"
    )]
    ExtensionLimit {
        id: Uuid,
        used: i32,
        max: i32,
        max_ttl_secs: u64,
    },

    #[error(
        "request_id {request_id:?} of holder {holder:?} was already used for reservation {existing} with a different request body"
    )]
    RequestIdReused {
        holder: String,
        request_id: String,
        existing: Uuid,
    },

    #[error(
        "the waitlist of {queue} already holds {limit} reservations (--max-queue-length); reservation {reservation_id} was rejected"
    )]
    QueueFull {
        reservation_id: Uuid,
        queue: String,
        limit: u32,
    },

    #[error("{}", match scope {
        LimitScope::Holder => format!("holder {holder:?} already has {limit} live reservations (max_active_holds_per_holder); confirm or cancel one first"),
        LimitScope::Total => format!("the coordinator already has {limit} live reservations (global cap); retry later"),
    })]
    HoldLimit {
        holder: String,
        limit: u32,
        scope: LimitScope,
    },

    #[error("{}", match scope {
        WatchScope::Process => format!("this coordinator already serves {limit} streams (WatchReservation and Events/Subscribe, --max-watches); retry later or on another replica"),
        WatchScope::Connection => format!("this connection already has {limit} open streams (WatchReservation and Events/Subscribe, --max-watches-per-connection); close one first"),
        WatchScope::Principal => format!("this principal already has {limit} open streams (WatchReservation and Events/Subscribe, --max-watches-per-principal); close one first"),
    })]
    WatchLimit { limit: usize, scope: WatchScope },

    #[error("server shutting down")]
    ShuttingDown,

    /// A transient database fault (connection, pool timeout, serialization failure,
    /// deadlock): the same request may be retried.
    #[error("storage unavailable: {0}")]
    StoreUnavailable(StoreError),

    /// The request holds a value the database cannot store, which validation did not catch.
    #[error("a value is out of the range storage can hold: {0}")]
    OutOfRange(StoreError),

    /// Any other storage failure (a bug, a broken database): details are logged only.
    #[error("storage failed: {0}")]
    Store(StoreError),

    #[error("internal error: {0}")]
    Internal(String),
}

impl From<StoreError> for Error {
    /// Classified once, by [`StoreError::fault`].
    fn from(e: StoreError) -> Error {
        match e.fault() {
            Fault::Transient => Error::StoreUnavailable(e),
            Fault::OutOfRange => Error::OutOfRange(e),
            Fault::Internal => Error::Store(e),
        }
    }
}

impl Error {
    /// The refund the error tells about, when there is one.
    pub fn refund(&self) -> Option<&Refund> {
        match self {
            Error::HoldExpired { refund, .. }
            | Error::Closed { refund, .. }
            | Error::InProgress { refund, .. } => refund.as_ref(),
            _ => None,
        }
    }

    /// The reservation the error is about, when there is one.
    pub fn reservation_id(&self) -> Option<Uuid> {
        match self {
            Error::NotFound(id)
            | Error::TokenMismatch(id)
            | Error::HoldExpired { id, .. }
            | Error::InProgress { id, .. }
            | Error::NotHeld(id)
            | Error::NotFailed { id, .. }
            | Error::Closed { id, .. }
            | Error::NotExpirable { id, .. }
            | Error::ExtensionLimit { id, .. }
            | Error::PaymentMismatch { id, .. }
            | Error::PaymentUnverified { id, .. }
            | Error::ExtendUnavailable { id, .. } => Some(*id),
            Error::InsufficientCapacity { reservation, .. } => Some(reservation.id),
            Error::ParticipantUnavailable { reservation_id, .. }
            | Error::QueueFull { reservation_id, .. } => Some(*reservation_id),
            Error::RequestIdReused { existing, .. } => Some(*existing),
            Error::InvalidArgument(_)
            | Error::SoldOut(_)
            | Error::UnknownParticipant { .. }
            | Error::UnknownWebhook(_)
            | Error::HoldLimit { .. }
            | Error::WatchLimit { .. }
            | Error::ShuttingDown
            | Error::StoreUnavailable(_)
            | Error::OutOfRange(_)
            | Error::Store(_)
            | Error::Internal(_) => None,
        }
    }
}
