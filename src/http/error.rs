//! The one place a `tonic::Status` becomes an HTTP answer: `{"code","reason","message",
//! "metadata"}` with the status the standard gRPC -> HTTP mapping gives (google.rpc.Code's
//! table: INVALID_ARGUMENT 400, UNAUTHENTICATED 401, PERMISSION_DENIED 403, NOT_FOUND 404,
//! ALREADY_EXISTS 409, FAILED_PRECONDITION 400, RESOURCE_EXHAUSTED 429, UNAVAILABLE 503, ...).
//! `reason` and `metadata` come from the status's `google.rpc.ErrorInfo` (what gRPC clients
//! switch on), plus the field a `google.rpc.BadRequest` names and a `google.rpc.RetryInfo`'s
//! delay (`retry_after_seconds`, and the `Retry-After` header). This module's own refusals
//! (malformed JSON, an unknown field, an oversize body) are built as statuses too, so they
//! pass through here and look like every other error.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tonic::Code;
use tonic_types::StatusExt;

/// The ErrorInfo reason of a body over the size limit (answered 413, not 429: the request,
/// not the server, is too big).
pub(crate) const BODY_TOO_LARGE: &str = "BODY_TOO_LARGE";

/// An error answer: a status, rendered by [`respond`].
#[derive(Debug)]
pub(crate) struct ApiError(pub tonic::Status);

impl From<tonic::Status> for ApiError {
    fn from(status: tonic::Status) -> ApiError {
        ApiError(status)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        respond(&self.0)
    }
}

/// The HTTP status of a gRPC code (the standard mapping), and of [`BODY_TOO_LARGE`].
pub(crate) fn http_status(code: Code, reason: Option<&str>) -> StatusCode {
    if reason == Some(BODY_TOO_LARGE) {
        return StatusCode::PAYLOAD_TOO_LARGE;
    }
    match code {
        Code::Ok => StatusCode::OK,
        // 499 Client Closed Request, as google.rpc.Code maps CANCELLED.
        Code::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            StatusCode::BAD_REQUEST
        }
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The HTTP answer of `status`: [`crate::json::error`] with its [`http_status`] (and `WWW-Authenticate:
/// Bearer` on 401).
pub(crate) fn respond(status: &tonic::Status) -> Response {
    let body = crate::json::error(status);
    let code = http_status(status.code(), body["reason"].as_str());
    let mut response = (
        code,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body.to_string(),
    )
        .into_response();
    if let Some(seconds) = body["metadata"]["retry_after_seconds"]
        .as_str()
        .and_then(|s| HeaderValue::from_str(s).ok())
    {
        response.headers_mut().insert(header::RETRY_AFTER, seconds);
    }
    if code == StatusCode::UNAUTHORIZED {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}

/// Bad input found here (the JSON, the query string): `INVALID_ARGUMENT` with ErrorInfo
/// reason `INVALID_ARGUMENT` and the field, like the gRPC service's own field errors.
pub fn invalid(field: &str, problem: impl std::fmt::Display) -> tonic::Status {
    let message = if field.is_empty() {
        problem.to_string()
    } else {
        format!("{field}: {problem}")
    };
    let mut metadata = std::collections::HashMap::new();
    if !field.is_empty() {
        metadata.insert("field".to_owned(), field.to_owned());
    }
    let details =
        tonic_types::ErrorDetails::with_error_info("INVALID_ARGUMENT", "tcc.v1", metadata);
    tonic::Status::with_error_details(Code::InvalidArgument, message, details)
}

/// A body over the size limit.
pub(crate) fn too_large(limit: usize) -> tonic::Status {
    let details = tonic_types::ErrorDetails::with_error_info(
        BODY_TOO_LARGE,
        "tcc.v1",
        std::collections::HashMap::from([("limit_bytes".to_owned(), limit.to_string())]),
    );
    tonic::Status::with_error_details(
        Code::InvalidArgument,
        format!("the request body is larger than {limit} bytes"),
        details,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::error as body;

    #[test]
    fn codes_map_to_the_standard_http_statuses() {
        let table = [
            (Code::InvalidArgument, 400),
            (Code::FailedPrecondition, 400),
            (Code::Unauthenticated, 401),
            (Code::PermissionDenied, 403),
            (Code::NotFound, 404),
            (Code::AlreadyExists, 409),
            (Code::ResourceExhausted, 429),
            (Code::Internal, 500),
            (Code::Unimplemented, 501),
            (Code::Unavailable, 503),
            (Code::DeadlineExceeded, 504),
        ];
        for (code, http) in table {
            assert_eq!(http_status(code, None).as_u16(), http, "{code:?}");
        }
        assert_eq!(
            http_status(Code::InvalidArgument, Some(BODY_TOO_LARGE)).as_u16(),
            413
        );
    }

    #[test]
    fn a_retry_delay_becomes_retry_after() {
        let details = tonic_types::ErrorDetails::with_retry_info(Some(
            std::time::Duration::from_millis(1500),
        ));
        let status = tonic::Status::with_error_details(Code::Unavailable, "busy", details);
        let response = respond(&status);
        assert_eq!(response.status().as_u16(), 503);
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
        assert_eq!(body(&status)["metadata"]["retry_after_seconds"], "2");
    }

    #[test]
    fn a_field_error_names_its_field_in_reason_and_metadata() {
        let v = body(&invalid("holds[0].quantity", "must be a number"));
        assert_eq!(v["code"], "INVALID_ARGUMENT");
        assert_eq!(v["reason"], "INVALID_ARGUMENT");
        assert_eq!(v["metadata"]["field"], "holds[0].quantity");
        assert_eq!(v["message"], "holds[0].quantity: must be a number");
    }
}
