//! The one place coordinator errors become gRPC statuses, each with a `google.rpc.ErrorInfo`
//! (domain `tcc.v1`) whose reason clients can switch on.

use std::collections::HashMap;

use tonic::{Code, Status};
use tonic_types::{ErrorDetail, ErrorInfo, FieldViolation, StatusExt};

use crate::coordinator::Error;

/// The ErrorInfo domain of every holdfast error.
pub const DOMAIN: &str = "tcc.v1";

fn status(
    code: Code,
    reason: &str,
    message: String,
    mut metadata: HashMap<String, String>,
    err: &Error,
) -> Status {
    if let Some(id) = err.reservation_id() {
        metadata.insert("reservation_id".into(), id.to_string());
    }
    let mut details: Vec<ErrorDetail> = vec![ErrorInfo::new(reason, DOMAIN, metadata).into()];
    if let Error::InvalidArgument(fe) = err {
        details.push(
            tonic_types::BadRequest::new(vec![FieldViolation::new(&fe.field, &fe.problem)]).into(),
        );
    }
    Status::with_error_details_vec(code, message, details)
}

impl From<Error> for Status {
    fn from(err: Error) -> Status {
        let message = err.to_string();
        let meta = |pairs: &[(&str, String)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect()
        };
        match &err {
            Error::InvalidArgument(fe) => status(
                Code::InvalidArgument,
                "INVALID_ARGUMENT",
                message,
                meta(&[("field", fe.field.clone())]),
                &err,
            ),
            Error::NotFound(_) => status(
                Code::NotFound,
                "RESERVATION_NOT_FOUND",
                message,
                HashMap::new(),
                &err,
            ),
            Error::UnknownParticipant { field, name } => status(
                Code::NotFound,
                "UNKNOWN_PARTICIPANT",
                message,
                meta(&[("field", field.clone()), ("participant", name.clone())]),
                &err,
            ),
            Error::TokenMismatch(_) => status(
                Code::PermissionDenied,
                "HOLD_TOKEN_MISMATCH",
                message,
                HashMap::new(),
                &err,
            ),
            Error::InsufficientCapacity { rejection, .. } => status(
                Code::FailedPrecondition,
                "INSUFFICIENT_CAPACITY",
                message,
                meta(&[
                    ("participant", rejection.participant.clone()),
                    ("resource", rejection.resource.clone()),
                ]),
                &err,
            ),
            Error::ParticipantUnavailable { participant, .. } => status(
                Code::Unavailable,
                "PARTICIPANT_UNAVAILABLE",
                message,
                meta(&[("participant", participant.clone())]),
                &err,
            ),
            Error::HoldExpired(_) => status(
                Code::FailedPrecondition,
                "HOLD_EXPIRED",
                message,
                HashMap::new(),
                &err,
            ),
            Error::Closed { state, .. } => status(
                Code::FailedPrecondition,
                "RESERVATION_CLOSED",
                message,
                meta(&[("state", state.as_str().to_owned())]),
                &err,
            ),
            Error::NotHeld(_) => status(
                Code::FailedPrecondition,
                "RESERVATION_NOT_HELD",
                message,
                HashMap::new(),
                &err,
            ),
            Error::ExtensionLimit { used, max, .. } => status(
                Code::FailedPrecondition,
                "EXTENSION_LIMIT_REACHED",
                message,
                meta(&[
                    ("extensions_used", used.to_string()),
                    ("max_extensions", max.to_string()),
                ]),
                &err,
            ),
            Error::RequestIdReused {
                holder, request_id, ..
            } => status(
                Code::AlreadyExists,
                "REQUEST_ID_REUSED",
                message,
                meta(&[
                    ("holder", holder.clone()),
                    ("request_id", request_id.clone()),
                ]),
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
                meta(&[
                    ("holder", holder.clone()),
                    ("limit", limit.to_string()),
                    (
                        "scope",
                        match scope {
                            crate::store::LimitScope::Holder => "holder".into(),
                            crate::store::LimitScope::Total => "total".into(),
                        },
                    ),
                ]),
                &err,
            ),
            Error::Store(e) => {
                // Details stay in the log: a caller can only retry.
                tracing::error!(error = %e, "storage failure");
                Status::unavailable("storage is unavailable; retry with the same request")
            }
            Error::Internal(e) => {
                tracing::error!(error = %e, "internal error");
                Status::internal("internal error")
            }
        }
    }
}
