//! The one place coordinator errors become gRPC statuses. Every status carries a
//! `google.rpc.ErrorInfo` (domain `tcc.v1`) whose reason clients can switch on; field errors add
//! a `google.rpc.BadRequest`, errors about a refunded payment add the `tcc.v1.Refund`, and
//! `UNAVAILABLE`/`RESOURCE_EXHAUSTED` add a `google.rpc.RetryInfo` (here only, [`retry_delay`]).

use std::collections::HashMap;

use prost::Message;
use tonic::{Code, Status};

use crate::coordinator::{Error, WatchScope};
use crate::domain::policy::LimitScope;
use crate::proto;

/// The ErrorInfo domain of every holdfast error.
pub const DOMAIN: &str = "tcc.v1";

fn any<M: Message>(type_name: &str, msg: &M) -> prost_types::Any {
    prost_types::Any {
        type_url: format!("type.googleapis.com/{type_name}"),
        value: msg.encode_to_vec(),
    }
}

/// How long a caller should wait before repeating a request refused with `code` for `reason`
/// (`google.rpc.RetryInfo`): only `UNAVAILABLE` and `RESOURCE_EXHAUSTED` are worth repeating
/// as they are. A participant or the database being back, or another replica taking the call,
/// is a matter of a second; a hold or watch slot frees when a holder settles, later.
fn retry_delay(code: Code, reason: &str) -> Option<std::time::Duration> {
    use std::time::Duration;
    match (code, reason) {
        (Code::Unavailable, "SHUTTING_DOWN") => Some(Duration::from_millis(500)),
        (Code::Unavailable, _) => Some(Duration::from_secs(1)),
        (Code::ResourceExhausted, "HOLD_LIMIT_EXCEEDED") => Some(Duration::from_secs(10)),
        (Code::ResourceExhausted, _) => Some(Duration::from_secs(5)),
        _ => None,
    }
}

/// Builds a status with ErrorInfo (plus the error's BadRequest or Refund details).
fn status(
    code: Code,
    reason: &str,
    message: String,
    pairs: &[(&str, String)],
    err: &Error,
) -> Status {
    let mut metadata: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect();
    if let Some(id) = err.reservation_id() {
        metadata.insert("reservation_id".into(), id.to_string());
    }
    let mut details = Vec::new();
    if let Some(refund) = err.refund() {
        metadata.insert("refund_id".into(), refund.refund_id.to_string());
        metadata.insert("refund_state".into(), refund.state.as_str().to_owned());
    }
    details.push(any(
        "google.rpc.ErrorInfo",
        &tonic_types::pb::ErrorInfo {
            reason: reason.to_owned(),
            domain: DOMAIN.to_owned(),
            metadata,
        },
    ));
    if let Some(delay) = retry_delay(code, reason) {
        details.push(any(
            "google.rpc.RetryInfo",
            &tonic_types::pb::RetryInfo {
                retry_delay: Some(prost_types::Duration {
                    seconds: i64::try_from(delay.as_secs()).unwrap_or(i64::MAX),
                    nanos: i32::try_from(delay.subsec_nanos()).unwrap_or(0),
                }),
            },
        ));
    }
    if let Error::InvalidArgument(fe) = err {
        details.push(any(
            "google.rpc.BadRequest",
            &tonic_types::pb::BadRequest {
                field_violations: vec![tonic_types::pb::bad_request::FieldViolation {
                    field: fe.field.clone(),
                    description: fe.problem.clone(),
                    ..Default::default()
                }],
            },
        ));
    }
    if let Some(refund) = err.refund() {
        details.push(any("tcc.v1.Refund", &super::convert::refund(refund)));
    }
    let encoded = tonic_types::pb::Status {
        code: code as i32,
        message: message.clone(),
        details,
    }
    .encode_to_vec();
    Status::with_details(code, message, encoded.into())
}

impl From<Error> for Status {
    fn from(err: Error) -> Status {
        let message = err.to_string();
        match &err {
            Error::InvalidArgument(fe) => status(
                Code::InvalidArgument,
                "INVALID_ARGUMENT",
                message,
                &[("field", fe.field.clone())],
                &err,
            ),
            Error::NotFound(_) => {
                status(Code::NotFound, "RESERVATION_NOT_FOUND", message, &[], &err)
            }
            Error::UnknownWebhook(name) => status(
                Code::NotFound,
                "UNKNOWN_WEBHOOK",
                message,
                &[("field", "name".to_owned()), ("webhook", name.clone())],
                &err,
            ),
            Error::UnknownParticipant { field, name } => status(
                Code::NotFound,
                "UNKNOWN_PARTICIPANT",
                message,
                &[("field", field.clone()), ("participant", name.clone())],
                &err,
            ),
            Error::TokenMismatch(_) => status(
                Code::PermissionDenied,
                "HOLD_TOKEN_MISMATCH",
                message,
                &[],
                &err,
            ),
            Error::InsufficientCapacity { rejection, .. } => status(
                Code::FailedPrecondition,
                "INSUFFICIENT_CAPACITY",
                message,
                &[
                    ("participant", rejection.participant.clone()),
                    ("resource", rejection.resource.clone()),
                ],
                &err,
            ),
            // SPEC 3.2: a sold-out fast path's refusal records nothing.
            Error::SoldOut(hit) => status(
                Code::FailedPrecondition,
                "INSUFFICIENT_CAPACITY",
                message,
                &[
                    ("participant", hit.participant.clone()),
                    ("resource", hit.resource.clone()),
                    ("recorded", "false".into()),
                ],
                &err,
            ),
            Error::ParticipantUnavailable { participant, .. } => status(
                Code::Unavailable,
                "PARTICIPANT_UNAVAILABLE",
                message,
                &[("participant", participant.clone())],
                &err,
            ),
            Error::PaymentMismatch { check, .. } => status(
                Code::InvalidArgument,
                "PAYMENT_MISMATCH",
                message,
                &[("field", "payment".into()), ("check", (*check).to_owned())],
                &err,
            ),
            Error::PaymentUnverified { participant, .. }
            | Error::ExtendUnavailable { participant, .. } => status(
                Code::Unavailable,
                "PARTICIPANT_UNAVAILABLE",
                message,
                &[("participant", participant.clone())],
                &err,
            ),
            Error::HoldExpired { .. } => {
                status(Code::FailedPrecondition, "HOLD_EXPIRED", message, &[], &err)
            }
            Error::Closed { state, .. } => status(
                Code::FailedPrecondition,
                "RESERVATION_CLOSED",
                message,
                &[("state", state.as_str().to_owned())],
                &err,
            ),
            Error::NotHeld(_) => status(
                Code::FailedPrecondition,
                "RESERVATION_NOT_HELD",
                message,
                &[],
                &err,
            ),
            Error::NotFailed { state, .. } => status(
                Code::FailedPrecondition,
                "RESERVATION_NOT_FAILED",
                message,
                &[("state", state.as_str().to_owned())],
                &err,
            ),
            // Decided already: closed to expiry, as a Confirm would find it.
            Error::NotExpirable { state, .. } => status(
                Code::FailedPrecondition,
                "RESERVATION_CLOSED",
                message,
                &[("state", state.as_str().to_owned())],
                &err,
            ),
            Error::InProgress { .. } => status(
                Code::Aborted,
                "LATE_PAYMENT_IN_PROGRESS",
                message,
                &[],
                &err,
            ),
            Error::ExtensionLimit { used, max, .. } => status(
                Code::FailedPrecondition,
                "EXTENSION_LIMIT_REACHED",
                message,
                &[
                    ("extensions_used", used.to_string()),
                    ("max_extensions", max.to_string()),
                ],
                &err,
            ),
            Error::RequestIdReused {
                holder, request_id, ..
            } => status(
                Code::AlreadyExists,
                "REQUEST_ID_REUSED",
                message,
                &[
                    ("holder", holder.clone()),
                    ("request_id", request_id.clone()),
                ],
                &err,
            ),
            Error::HoldLimit {
                holder,
                limit,
                scope,
            } => status(
                Code::ResourceExhausted,
                "HOLD_LIMIT_EXCEEDED",
                message,
                &[
                    ("holder", holder.clone()),
                    ("limit", limit.to_string()),
                    (
                        "scope",
                        match scope {
                            LimitScope::Holder => "holder".into(),
                            LimitScope::Total => "total".into(),
                        },
                    ),
                ],
                &err,
            ),
            Error::QueueFull { queue, limit, .. } => status(
                Code::ResourceExhausted,
                "QUEUE_FULL",
                message,
                &[("queue", queue.clone()), ("limit", limit.to_string())],
                &err,
            ),
            Error::WatchLimit { limit, scope } => status(
                Code::ResourceExhausted,
                "WATCH_LIMIT_EXCEEDED",
                message,
                &[
                    ("limit", limit.to_string()),
                    (
                        "scope",
                        match scope {
                            WatchScope::Process => "process".into(),
                            WatchScope::Connection => "connection".into(),
                            WatchScope::Principal => "principal".into(),
                        },
                    ),
                ],
                &err,
            ),
            Error::ShuttingDown => status(Code::Unavailable, "SHUTTING_DOWN", message, &[], &err),
            Error::StoreUnavailable(e) => {
                // Details stay in the log: a caller can only retry.
                tracing::warn!(error = %e, "storage unavailable");
                status(
                    Code::Unavailable,
                    "STORAGE_UNAVAILABLE",
                    "storage is unavailable; retry with the same request".into(),
                    &[],
                    &err,
                )
            }
            Error::OutOfRange(e) => {
                // Validation names the field of every value it knows to be out of range; this
                // is what got past it. The database's words stay in the log.
                tracing::warn!(error = %e, "a request value storage cannot hold");
                status(
                    Code::InvalidArgument,
                    "INVALID_ARGUMENT",
                    "a value in the request is out of the range the coordinator can store \
                     (timestamps lie in 0001-01-01..9999-12-31, durations within --max-ttl)"
                        .into(),
                    &[],
                    &err,
                )
            }
            Error::Store(e) => internal(&format!("storage failed: {e}")),
            Error::Internal(e) => internal(e),
        }
    }
}

/// An INTERNAL status: the detail is logged under a reference the message gives, so an operator
/// can find it; the caller learns nothing of the internals.
fn internal(detail: &str) -> Status {
    let reference = uuid::Uuid::new_v4().simple().to_string();
    tracing::error!(error = %detail, %reference, "internal error");
    Status::internal(format!(
        "internal error (reference {reference} in the coordinator's log); the request may be \
         retried unchanged"
    ))
}

/// Decodes the `tcc.v1.Refund` detail of an error status, if it has one (for clients and tests).
pub fn refund_detail(status: &Status) -> Option<proto::Refund> {
    let decoded = tonic_types::pb::Status::decode(status.details()).ok()?;
    decoded
        .details
        .iter()
        .find(|a| a.type_url.ends_with("/tcc.v1.Refund"))
        .and_then(|a| proto::Refund::decode(a.value.as_slice()).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_types::StatusExt;

    #[test]
    fn retry_info_only_where_a_repeat_may_succeed() {
        let limit: Status = Error::HoldLimit {
            holder: "h".into(),
            limit: 5,
            scope: LimitScope::Holder,
        }
        .into();
        let info = limit.get_details_retry_info().expect("RetryInfo");
        assert_eq!(info.retry_delay, Some(std::time::Duration::from_secs(10)));
        let down: Status = Error::ShuttingDown.into();
        assert!(down.get_details_retry_info().is_some());
        let participant: Status = Error::ParticipantUnavailable {
            reservation_id: uuid::Uuid::nil(),
            participant: "seats".into(),
            detail: "down".into(),
        }
        .into();
        assert_eq!(participant.code(), Code::Unavailable);
        assert!(participant.get_details_retry_info().is_some());
        assert!(participant.get_details_error_info().is_some());
        let closed: Status = Error::NotFound(uuid::Uuid::nil()).into();
        assert!(closed.get_details_retry_info().is_none());
    }
}
