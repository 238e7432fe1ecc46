//! What a failed call means: the gRPC code, the [`Reason`] from the ErrorInfo holdfast sends
//! (SPEC 3.2), the reservation it concerns and the server's retry hint.

use std::collections::HashMap;
use std::time::Duration;

use tonic::Code;
use tonic_types::StatusExt;
use uuid::Uuid;

/// Why a call failed, as holdfast names it (ErrorInfo `reason`, domain `tcc.v1`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reason {
    /// A missing or malformed field; the message names it.
    InvalidArgument,
    ReservationNotFound,
    UnknownParticipant,
    HoldTokenMismatch,
    /// Reserve was refused (sold out, slot taken): the reservation is REJECTED.
    InsufficientCapacity,
    HoldExpired,
    /// The reservation is terminal (or decided) and cannot change this way.
    ReservationClosed,
    ReservationNotHeld,
    ExtensionLimitReached,
    RequestIdReused,
    HoldLimitExceeded,
    WatchLimitExceeded,
    ParticipantUnavailable,
    PaymentMismatch,
    LatePaymentInProgress,
    ShuttingDown,
    /// Too many requests in flight: refused before any work (RetryInfo says when to repeat).
    Overloaded,
    /// The coordinator's database is unreachable for now.
    StorageUnavailable,
    /// Resolve of a reservation that is not FAILED.
    ReservationNotFailed,
    Unauthenticated,
    PermissionDenied,
    /// A reason this version of the client does not know.
    Other(String),
    /// No ErrorInfo: a transport failure, a deadline, an overloaded server.
    Unspecified,
}

impl Reason {
    fn parse(reason: &str) -> Reason {
        match reason {
            "INVALID_ARGUMENT" => Reason::InvalidArgument,
            "RESERVATION_NOT_FOUND" => Reason::ReservationNotFound,
            "UNKNOWN_PARTICIPANT" => Reason::UnknownParticipant,
            "HOLD_TOKEN_MISMATCH" => Reason::HoldTokenMismatch,
            "INSUFFICIENT_CAPACITY" => Reason::InsufficientCapacity,
            "HOLD_EXPIRED" => Reason::HoldExpired,
            "RESERVATION_CLOSED" => Reason::ReservationClosed,
            "RESERVATION_NOT_HELD" => Reason::ReservationNotHeld,
            "EXTENSION_LIMIT_REACHED" => Reason::ExtensionLimitReached,
            "REQUEST_ID_REUSED" => Reason::RequestIdReused,
            "HOLD_LIMIT_EXCEEDED" => Reason::HoldLimitExceeded,
            "WATCH_LIMIT_EXCEEDED" => Reason::WatchLimitExceeded,
            "PARTICIPANT_UNAVAILABLE" => Reason::ParticipantUnavailable,
            "PAYMENT_MISMATCH" => Reason::PaymentMismatch,
            "LATE_PAYMENT_IN_PROGRESS" => Reason::LatePaymentInProgress,
            "SHUTTING_DOWN" => Reason::ShuttingDown,
            "OVERLOADED" => Reason::Overloaded,
            "STORAGE_UNAVAILABLE" => Reason::StorageUnavailable,
            "RESERVATION_NOT_FAILED" => Reason::ReservationNotFailed,
            "UNAUTHENTICATED" => Reason::Unauthenticated,
            "PERMISSION_DENIED" => Reason::PermissionDenied,
            other => Reason::Other(other.to_owned()),
        }
    }
}

/// A failed call: small (one pointer), its parts behind accessors.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{:?} {:?}: {}", .0.code, .0.reason, .0.message)]
pub struct Error(Box<Parts>);

#[derive(Clone, Debug)]
struct Parts {
    code: Code,
    reason: Reason,
    message: String,
    reservation_id: Option<Uuid>,
    metadata: HashMap<String, String>,
    retry_after: Option<Duration>,
}

impl Error {
    /// The gRPC status code (`INVALID_ARGUMENT` for settings refused before any call).
    pub fn code(&self) -> Code {
        self.0.code
    }

    pub fn reason(&self) -> &Reason {
        &self.0.reason
    }

    /// What a person can act on.
    pub fn message(&self) -> &str {
        &self.0.message
    }

    /// The reservation concerned, when the server said.
    pub fn reservation_id(&self) -> Option<Uuid> {
        self.0.reservation_id
    }

    /// The ErrorInfo metadata (e.g. `participant`, `resource`, `state`).
    pub fn metadata(&self) -> &HashMap<String, String> {
        &self.0.metadata
    }

    /// How long the server asked the caller to wait before retrying (RetryInfo).
    pub fn retry_after(&self) -> Option<Duration> {
        self.0.retry_after
    }

    fn of(code: Code, reason: Reason, message: String) -> Error {
        Error(Box::new(Parts {
            code,
            reason,
            message,
            reservation_id: None,
            metadata: HashMap::new(),
            retry_after: None,
        }))
    }
}

impl Error {
    pub(crate) fn from_status(status: &tonic::Status) -> Error {
        let details = status.get_error_details();
        let (reason, metadata) = match details.error_info() {
            Some(info) => (Reason::parse(&info.reason), info.metadata.clone()),
            None => (Reason::Unspecified, HashMap::new()),
        };
        let reservation_id = metadata
            .get("reservation_id")
            .and_then(|id| Uuid::parse_str(id).ok());
        let retry_after = details
            .retry_info()
            .and_then(|r| r.retry_delay)
            .filter(|d| !d.is_zero());
        Error(Box::new(Parts {
            code: status.code(),
            reason,
            message: status.message().to_owned(),
            reservation_id,
            metadata,
            retry_after,
        }))
    }

    /// A setting refused before any call.
    pub(crate) fn config(message: String) -> Error {
        Error::of(Code::InvalidArgument, Reason::InvalidArgument, message)
    }

    /// The server answered something this client cannot read (a bad id, a missing time).
    pub(crate) fn malformed(what: &str) -> Error {
        Error::of(
            Code::Internal,
            Reason::Other("MALFORMED_ANSWER".to_owned()),
            format!("the coordinator answered a malformed {what}"),
        )
    }
}

#[cfg(test)]
impl Error {
    pub(crate) fn for_test(code: Code, reason: Reason, retry_after: Option<Duration>) -> Error {
        let mut e = Error::of(code, reason, String::new());
        e.0.retry_after = retry_after;
        e
    }
}
