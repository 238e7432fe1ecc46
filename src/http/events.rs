//! `tcc.v1.Events` as JSON (SPEC 10): `GET /v1/events?after=N&...&wait=30s`, a long poll, and
//! `GET /v1/events:stream?after=N&...`, server-sent events; both a Subscribe in-process, with
//! the filter as query parameters (`type`, `holder`, `participant` and `label=K=V`, each
//! repeatable). `GET /v1/events:latest` is GetLatestSequence (`{"sequence": N}`).
//!
//! - The long poll answers at once when there are events after `after` (the backlog up to
//!   [`MAX_ANSWER`]), else waits up to `wait` (default and at most 30 s) for the first, and
//!   answers `{"events": [...], "next_after": N, "latest": L}`: `next_after` is where to resume
//!   (every event up to it was answered or did not match), `latest` the log's latest sequence.
//! - The stream sends each event as `id: <sequence>`, `event: <type>`, `data: <event JSON>`,
//!   and the server's heartbeats as `event: HEARTBEAT` (`id:` its sequence, so a browser's
//!   `EventSource` resumes past events it did not want); `Last-Event-ID` (what an
//!   `EventSource` sends when it reconnects) wins over `after`. A failed stream ends with
//!   `event: error` (the coordinator shutting down, for one: resume after the last `id`).

use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;
use axum::routing::get;
use futures_util::{FutureExt, StreamExt};
use tokio::time::Instant;

use super::Shared;
use super::body;
use super::credentials::Credentials;
use super::error::{ApiError, invalid};
use super::grpc::events;
use super::reservations::ok;
use crate::proto;

/// The gRPC method both endpoints call (auth admits them as it).
const SUBSCRIBE: &str = "/tcc.v1.Events/Subscribe";

/// The longest and default `wait` of the long poll.
const MAX_WAIT: Duration = Duration::from_secs(30);

/// Events one long-poll answer carries at most.
const MAX_ANSWER: usize = 500;

/// How long the long poll waits for the backlog to be read.
const BACKLOG_WAIT: Duration = Duration::from_secs(30);

const FILTER_PARAMS: &[&str] = &["type", "holder", "participant", "label"];

pub fn routes() -> Router<Shared> {
    Router::new()
        .route("/v1/events", get(poll))
        .route("/v1/events:stream", get(stream))
        .route("/v1/events:latest", get(latest))
}

/// A query's Subscribe message and `wait`.
struct EventsQuery {
    message: proto::SubscribeRequest,
    wait: Duration,
}

/// Parses the query string of either endpoint (`wait` only where `long_poll`).
fn events_query(raw: Option<&str>, long_poll: bool) -> Result<EventsQuery, tonic::Status> {
    let mut known = vec!["after"];
    known.extend_from_slice(FILTER_PARAMS);
    if long_poll {
        known.push("wait");
    }
    let params = body::query(raw, &known, FILTER_PARAMS)?;
    let all = |name: &str| params.get(name).cloned().unwrap_or_default();
    let after = match body::one(&params, "after").filter(|v| !v.is_empty()) {
        Some(v) => sequence("after", v)?,
        None => 0,
    };
    let wait = match body::one(&params, "wait").filter(|v| !v.is_empty()) {
        Some(v) => {
            // Digits only: neither part is negative.
            let d = body::duration("wait", v)?;
            let seconds = u64::try_from(d.seconds).unwrap_or(u64::MAX);
            Duration::new(
                seconds.min(MAX_WAIT.as_secs()),
                u32::try_from(d.nanos).unwrap_or(0),
            )
        }
        None => MAX_WAIT,
    };
    let mut types = Vec::new();
    for name in all("type") {
        types.push(event_type(&name)? as i32);
    }
    let mut labels = std::collections::HashMap::new();
    for pair in all("label") {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| invalid("label", format!("{pair:?} is not KEY=VALUE")))?;
        labels.insert(k.to_owned(), v.to_owned());
    }
    Ok(EventsQuery {
        message: proto::SubscribeRequest {
            after_sequence: after,
            filter: Some(proto::EventFilter {
                holders: all("holder"),
                labels,
                types,
                participants: all("participant"),
            }),
        },
        wait: wait.min(MAX_WAIT),
    })
}

/// A sequence to resume after, named `field`.
fn sequence(field: &str, text: &str) -> Result<i64, tonic::Status> {
    text.trim()
        .parse::<i64>()
        .ok()
        .filter(|n| *n >= 0)
        .ok_or_else(|| {
            invalid(
                field,
                format!("{text:?} is not a sequence (a whole number >= 0)"),
            )
        })
}

/// An event type by name, any case (`reservation_held`); not HEARTBEAT.
fn event_type(name: &str) -> Result<proto::event::Type, tonic::Status> {
    proto::event::Type::from_str_name(&name.to_ascii_uppercase())
        .filter(|t| !matches!(t, proto::event::Type::Unspecified | proto::event::Type::Heartbeat))
        .ok_or_else(|| {
            invalid(
                "type",
                format!("{name:?} is not an event type (RESERVATION_HELD, RESERVATION_EXPIRED, PAYMENT_RECORDED, ...)"),
            )
        })
}

fn is_heartbeat(e: &proto::Event) -> bool {
    e.r#type() == proto::event::Type::Heartbeat
}

/// `GET /v1/events`: the long poll.
async fn poll(
    State(service): State<Shared>,
    RawQuery(raw): RawQuery,
    credentials: Credentials,
) -> Result<Response, ApiError> {
    let query = events_query(raw.as_deref(), true)
        .map_err(|bad| service.refuse(&credentials, SUBSCRIBE, bad))?;
    let mut next_after = query.message.after_sequence;
    let mut stream = events(&service.grpc)
        .subscribe(credentials.request(query.message)?)
        .await?
        .into_inner();
    let mut found = Vec::new();
    // The backlog, until the stream says it caught up (its first heartbeat).
    let caught_up = Instant::now() + BACKLOG_WAIT;
    while found.len() < MAX_ANSWER {
        let Ok(message) = tokio::time::timeout_at(caught_up, stream.message()).await else {
            break;
        };
        match message? {
            Some(e) if is_heartbeat(&e) => {
                next_after = next_after.max(e.sequence);
                break;
            }
            Some(e) => {
                next_after = e.sequence;
                found.push(e);
            }
            None => break,
        }
    }
    if found.is_empty() {
        wait_for_events(&mut stream, query.wait, &mut found, &mut next_after).await?;
    }
    let latest = events(&service.grpc)
        .get_latest_sequence(credentials.request(proto::GetLatestSequenceRequest::default())?)
        .await?
        .into_inner()
        .sequence;
    Ok(ok(serde_json::json!({
        "events": found.iter().map(crate::json::event).collect::<Vec<_>>(),
        "next_after": next_after,
        "latest": latest.max(next_after),
    })))
}

/// Waits up to `wait` for the first live event, then takes those already sent with it.
async fn wait_for_events(
    stream: &mut tonic::Streaming<proto::Event>,
    wait: Duration,
    found: &mut Vec<proto::Event>,
    next_after: &mut i64,
) -> Result<(), tonic::Status> {
    let deadline = Instant::now() + wait;
    while found.is_empty() {
        let Ok(message) = tokio::time::timeout_at(deadline, stream.message()).await else {
            return Ok(());
        };
        match message? {
            Some(e) if is_heartbeat(&e) => *next_after = (*next_after).max(e.sequence),
            Some(e) => {
                *next_after = e.sequence;
                found.push(e);
            }
            None => return Ok(()),
        }
    }
    while found.len() < MAX_ANSWER {
        match stream.message().now_or_never() {
            Some(Ok(Some(e))) if !is_heartbeat(&e) => {
                *next_after = e.sequence;
                found.push(e);
            }
            Some(Ok(Some(e))) => *next_after = (*next_after).max(e.sequence),
            _ => break,
        }
    }
    Ok(())
}

/// `GET /v1/events:latest`.
async fn latest(
    State(service): State<Shared>,
    RawQuery(raw): RawQuery,
    credentials: Credentials,
) -> Result<Response, ApiError> {
    const METHOD: &str = "/tcc.v1.Events/GetLatestSequence";
    let params = body::query(raw.as_deref(), &["back"], &[])
        .map_err(|bad| service.refuse(&credentials, METHOD, bad))?;
    let back =
        body::int32(&params, "back").map_err(|bad| service.refuse(&credentials, METHOD, bad))?;
    let answer = events(&service.grpc)
        .get_latest_sequence(credentials.request(proto::GetLatestSequenceRequest { back })?)
        .await?
        .into_inner();
    Ok(ok(serde_json::json!({ "sequence": answer.sequence })))
}

/// One server-sent event.
fn sse(id: Option<i64>, name: &str, data: &serde_json::Value) -> Bytes {
    let id = id.map(|n| format!("id: {n}\n")).unwrap_or_default();
    Bytes::from(format!("{id}event: {name}\ndata: {data}\n\n"))
}

/// `GET /v1/events:stream`: server-sent events.
async fn stream(
    State(service): State<Shared>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    credentials: Credentials,
) -> Result<Response, ApiError> {
    let resume = |mut query: EventsQuery| -> Result<EventsQuery, tonic::Status> {
        if let Some(last) = headers.get("last-event-id") {
            let text = last.to_str().unwrap_or("");
            query.message.after_sequence = sequence("Last-Event-ID", text)?;
        }
        Ok(query)
    };
    let query = events_query(raw.as_deref(), false)
        .and_then(resume)
        .map_err(|bad| service.refuse(&credentials, SUBSCRIBE, bad))?;
    let feed = events(&service.grpc)
        .subscribe(credentials.request(query.message)?)
        .await?
        .into_inner();
    // The state: the gRPC stream while it is open, `None` once an error was sent.
    let frames = futures_util::stream::unfold(Some(feed), |open| async move {
        let mut feed = open?;
        match feed.next().await? {
            Ok(e) if is_heartbeat(&e) => {
                let data = serde_json::json!({ "sequence": e.sequence });
                Some((sse(Some(e.sequence), "HEARTBEAT", &data), Some(feed)))
            }
            Ok(e) => {
                let name = e.r#type().as_str_name();
                Some((
                    sse(Some(e.sequence), name, &crate::json::event(&e)),
                    Some(feed),
                ))
            }
            Err(status) => Some((sse(None, "error", &crate::json::error(&status)), None)),
        }
    })
    .map(Ok::<_, std::convert::Infallible>);
    let mut response = Response::new(Body::from_stream(frames));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn field(raw: &str, long_poll: bool) -> String {
        let status = events_query(Some(raw), long_poll).err().unwrap();
        crate::json::error(&status)["metadata"]["field"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    #[test]
    fn queries_become_subscriptions_and_bad_ones_name_the_parameter() {
        let q = events_query(
            Some("after=7&type=reservation_held&type=PAYMENT_RECORDED&holder=a&holder=b&label=shop=eu&participant=seats&wait=2.5s"),
            true,
        )
        .unwrap();
        assert_eq!(q.message.after_sequence, 7);
        assert_eq!(q.wait, Duration::from_millis(2500));
        let f = q.message.filter.unwrap();
        assert_eq!(f.types, vec![2, 12]);
        assert_eq!(f.holders, vec!["a", "b"]);
        assert_eq!(f.labels["shop"], "eu");
        assert_eq!(f.participants, vec!["seats"]);
        assert_eq!(
            events_query(Some("wait=600s"), true).unwrap().wait,
            MAX_WAIT
        );
        assert_eq!(events_query(None, true).unwrap().wait, MAX_WAIT);
        assert_eq!(field("after=-1", true), "after");
        assert_eq!(field("after=x", true), "after");
        assert_eq!(field("type=heartbeat", true), "type");
        assert_eq!(field("type=sold", true), "type");
        assert_eq!(field("label=x", true), "label");
        assert_eq!(field("wait=1m", true), "wait");
        assert_eq!(field("wait=1s", false), "wait");
        assert_eq!(field("after=1&after=2", true), "after");
    }
}
