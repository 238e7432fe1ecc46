//! `GET /v1/events` (long poll) and `GET /v1/events:stream` (server-sent events) against a
//! real coordinator: an answer at once when there are events, a wait that ends when an event
//! lands, an empty answer when none does; filters as query parameters; the stream's ids,
//! names and resumption with `Last-Event-ID`; bad parameters; a client key sees its own.

use std::time::{Duration, Instant};

use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use sqlx::PgPool;

use super::{HttpApp, get, post, reserve_body, spawn_http};
use crate::auth::{Cast, secured_settings};
use crate::common::{settings, spawn_fakes};

/// Polls from `after` until an event of `id` of type `until` is among the answers; every
/// event answered, in order.
async fn poll_until(app: &HttpApp, key: Option<&str>, id: &str, until: &str) -> Vec<Value> {
    let mut after = 0;
    let mut out: Vec<Value> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let answer = get(app, &format!("/v1/events?after={after}&wait=5s"), key)
            .await
            .ok();
        after = answer["next_after"].as_i64().unwrap();
        out.extend(answer["events"].as_array().unwrap().iter().cloned());
        if out
            .iter()
            .any(|e| e["type"] == until && e["reservation"]["id"] == id)
        {
            return out;
        }
    }
    panic!("no {until} of {id} within 20 s: {out:#?}");
}

async fn reserve(app: &HttpApp, key: Option<&str>, request_id: &str, seat: &str) -> String {
    let held = post(
        app,
        "/v1/reservations",
        key,
        &reserve_body(request_id, "h", seat),
    )
    .await
    .ok();
    held["id"].as_str().unwrap().to_owned()
}

#[sqlx::test]
async fn the_long_poll_answers_at_once_waits_for_an_event_or_times_out_empty(pool: PgPool) {
    let fakes = spawn_fakes(&["seats"]).await;
    let app = spawn_http(pool, settings(&[("seats", &fakes.get("seats").url)])).await;
    let first = reserve(&app, None, "p-1", "A1").await;
    let seen = poll_until(&app, None, &first, "RESERVATION_HELD").await;
    let last = seen.last().unwrap()["sequence"].as_i64().unwrap();

    // Events after `after`: answered at once, the backlog in order, in the JSON API's shape.
    let started = Instant::now();
    let answer = get(&app, "/v1/events?after=0&wait=20s", None).await.ok();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(answer["events"], Value::Array(seen.clone()));
    assert_eq!(
        (answer["next_after"].as_i64(), answer["latest"].as_i64()),
        (Some(last), Some(last))
    );
    let latest = get(&app, "/v1/events:latest", None).await.ok();
    assert_eq!(latest, serde_json::json!({ "sequence": last }));
    let held = &seen[seen.len() - 1];
    assert_eq!(held["reservation"]["state"], "HELD");
    assert!(held["event_id"].as_str().is_some_and(|id| id.len() == 36));
    // Filters as query parameters.
    let held_only = get(&app, "/v1/events?type=reservation_held&wait=1s", None)
        .await
        .ok();
    let types: Vec<&Value> = held_only["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["type"])
        .collect();
    assert_eq!(types, ["RESERVATION_HELD"]);

    // Nothing after `after`: an empty answer once `wait` is over, resuming where it was.
    let started = Instant::now();
    let empty = get(&app, &format!("/v1/events?after={last}&wait=1s"), None)
        .await
        .ok();
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!(empty["events"], serde_json::json!([]));
    assert_eq!(empty["next_after"].as_i64(), Some(last));

    // Waiting: the answer comes when the next event lands.
    let base = app.base.clone();
    let waiting = tokio::spawn(async move {
        let started = Instant::now();
        let answer = super::call(
            "GET",
            &format!("{base}/v1/events?after={last}&wait=25s"),
            None,
            None,
        )
        .await;
        (answer.ok(), started.elapsed())
    });
    let second = reserve(&app, None, "p-2", "A2").await;
    let (answer, took) = waiting.await.unwrap();
    assert!(took < Duration::from_secs(20), "{took:?}");
    let events = answer["events"].as_array().unwrap();
    assert_eq!(events[0]["reservation"]["id"], second.as_str());
    assert_eq!(events[0]["type"], "RESERVATION_TRYING");
    assert!(events[0]["sequence"].as_i64().unwrap() > last);
    assert_eq!(answer["next_after"], events.last().unwrap()["sequence"]);

    // Bad parameters name themselves.
    for (query, field) in [
        ("type=nope", "type"),
        ("after=-3", "after"),
        ("wait=soon", "wait"),
        ("colour=red", "colour"),
    ] {
        get(&app, &format!("/v1/events?{query}"), None)
            .await
            .assert_error(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT");
        let answer = get(&app, &format!("/v1/events?{query}"), None).await;
        assert_eq!(answer.json["metadata"]["field"], field, "{answer:?}");
    }
}

/// A server-sent event: its id, name and data.
type Frame = (Option<i64>, String, Value);

/// The events of an SSE response until `done` says so of those read.
async fn stream_events(
    url: &str,
    last_event_id: Option<&str>,
    done: impl Fn(&[Frame]) -> bool,
) -> Vec<Frame> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut request = axum::http::Request::get(url);
    if let Some(id) = last_event_id {
        request = request.header("last-event-id", id);
    }
    let response = client
        .request(request.body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut body = response.into_body();
    let (mut text, mut out) = (String::new(), Vec::new());
    while !done(&out) {
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .unwrap_or_else(|_| panic!("no event within 10 s; read so far: {out:?}"))
            .expect("the stream goes on")
            .unwrap();
        if let Ok(data) = frame.into_data() {
            text.push_str(&String::from_utf8_lossy(&data));
        }
        while let Some(end) = text.find("\n\n") {
            let block: String = text.drain(..end + 2).collect();
            let (mut id, mut name, mut data) = (None, String::new(), Value::Null);
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = Some(v.parse().unwrap());
                } else if let Some(v) = line.strip_prefix("event: ") {
                    name = v.to_owned();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data = serde_json::from_str(v).unwrap();
                }
            }
            out.push((id, name, data));
        }
    }
    out
}

/// Whether `frames` hold `count` events that are no heartbeat.
fn events_read(count: usize) -> impl Fn(&[Frame]) -> bool {
    move |frames| {
        frames
            .iter()
            .filter(|(_, name, _)| name != "HEARTBEAT")
            .count()
            >= count
    }
}

#[sqlx::test]
async fn the_event_stream_names_each_event_and_resumes_after_last_event_id(pool: PgPool) {
    let fakes = spawn_fakes(&["seats"]).await;
    let app = spawn_http(pool, settings(&[("seats", &fakes.get("seats").url)])).await;
    let url = format!("{}/v1/events:stream", app.base);
    let id = reserve(&app, None, "s-1", "A1").await;
    let got = stream_events(&url, None, events_read(2)).await;
    let events: Vec<_> = got.iter().filter(|(_, n, _)| n != "HEARTBEAT").collect();
    let names: Vec<&str> = events.iter().map(|(_, n, _)| n.as_str()).collect();
    assert_eq!(names, ["RESERVATION_TRYING", "RESERVATION_HELD"]);
    for (seq, name, data) in &events {
        assert_eq!(data["sequence"].as_i64(), *seq);
        assert_eq!(data["type"], name.as_str());
        assert_eq!(data["reservation"]["id"], id.as_str());
    }
    // Resumed after the first: the second comes first, then what happens next.
    let first = events[0].0.unwrap().to_string();
    let second = reserve(&app, None, "s-2", "A2").await;
    let resumed = stream_events(&format!("{url}?after=0"), Some(&first), events_read(3)).await;
    let resumed: Vec<_> = resumed
        .iter()
        .filter(|(_, n, _)| n != "HEARTBEAT")
        .collect();
    assert_eq!(resumed[0].0, events[1].0);
    assert_eq!(resumed[1].2["reservation"]["id"], second.as_str());
    assert_eq!(resumed[1].1, "RESERVATION_TRYING");
    // A heartbeat carries how far the stream read, as its id: past what did not match.
    let last = resumed[resumed.len() - 1].0.unwrap();
    let quiet = stream_events(&format!("{url}?type=RESERVATION_EXPIRED"), None, |frames| {
        frames
            .iter()
            .any(|(id, _, _)| id.is_some_and(|id| id >= last))
    })
    .await;
    assert!(
        quiet.iter().all(|(_, name, _)| name == "HEARTBEAT"),
        "{quiet:?}"
    );
    let bad = get(&app, "/v1/events:stream?after=1&wait=1s", None).await;
    bad.assert_error(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT");
    let bad = super::send("GET", &url, &[("last-event-id", "x")], None).await;
    assert_eq!(bad.json["metadata"]["field"], "Last-Event-ID", "{bad:?}");
}

#[sqlx::test]
async fn a_client_key_polls_the_events_of_its_own_reservations(pool: PgPool) {
    let cast = Cast::new();
    let fakes = spawn_fakes(&["seats"]).await;
    let app = spawn_http(
        pool,
        secured_settings(&cast, &[("seats", &fakes.get("seats").url)]),
    )
    .await;
    let shops = reserve(&app, Some(&cast.shop.key), "k-1", "A1").await;
    let strangers = reserve(&app, Some(&cast.stranger.key), "k-2", "A2").await;
    let all = poll_until(&app, Some(&cast.admin.key), &strangers, "RESERVATION_HELD").await;
    assert!(all.iter().any(|e| e["reservation"]["id"] == shops.as_str()));
    let own = poll_until(&app, Some(&cast.shop.key), &shops, "RESERVATION_HELD").await;
    assert!(own.iter().all(|e| e["owner"] == "shop"), "{own:#?}");
    get(&app, "/v1/events", None)
        .await
        .assert_error(401, "UNAUTHENTICATED", "UNAUTHENTICATED");
}
