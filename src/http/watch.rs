//! `GET /v1/reservations/{id}:watch`: `WatchReservation` as server-sent events
//! (`text/event-stream`). Each change is an `event: reservation` whose data is the reservation
//! ([`crate::json`]'s shape); the stream ends after a terminal state with `event: end`, or with
//! `event: error` carrying the error JSON ([`crate::json::error`]) when the gRPC stream fails
//! (the coordinator shutting down, for one). A refusal before the first event (no key, not
//! found) is an ordinary JSON error answer. A comment line every 15 s keeps proxies from
//! closing a quiet stream.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::Response;
use futures_util::StreamExt;

use super::HttpService;
use super::credentials::Credentials;
use super::error::ApiError;
use super::grpc::coordinator;
use crate::proto;

/// How long a stream may be quiet before a keep-alive comment.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// One event.
fn event(name: &str, data: &serde_json::Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

pub async fn stream(
    service: &HttpService,
    credentials: &Credentials,
    id: &str,
) -> Result<Response, ApiError> {
    let message = proto::WatchReservationRequest {
        reservation_id: id.to_owned(),
    };
    let changes = coordinator(&service.grpc)
        .watch_reservation(credentials.request(message)?)
        .await?
        .into_inner();
    // The state: the gRPC stream while it is open, `None` once the last event is sent.
    let events = futures_util::stream::unfold(Some(changes), |open| async move {
        let mut changes = open?;
        let chunk = match tokio::time::timeout(KEEP_ALIVE, changes.next()).await {
            Err(_) => {
                return Some((Bytes::from_static(b": keep-alive\n\n"), Some(changes)));
            }
            Ok(Some(Ok(r))) => event("reservation", &crate::json::reservation(&r)),
            Ok(Some(Err(status))) => {
                return Some((event("error", &crate::json::error(&status)), None));
            }
            Ok(None) => {
                return Some((event("end", &serde_json::json!({})), None));
            }
        };
        Some((chunk, Some(changes)))
    })
    .map(Ok::<_, std::convert::Infallible>);
    let mut response = Response::new(Body::from_stream(events));
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    // Proxies that buffer (nginx) would hold the events back.
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}
