//! `GET /v1/reservations/{id}:watch` as server-sent events, read as they arrive (a deadline
//! on each, failing with what was read); the probes and the security headers.

use std::time::{Duration, Instant};

use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::json;
use sqlx::PgPool;

use super::{get, post, spawn_http};
use crate::common::{settings, spawn_fakes};

/// The events of a stream until `end` or `error`: (event name, data).
async fn events(url: &str) -> Vec<(String, serde_json::Value)> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = axum::http::Request::get(url)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut body = response.into_body();
    let mut text = String::new();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let frame = tokio::time::timeout(left, body.frame())
            .await
            .unwrap_or_else(|_| panic!("no end of stream within 30 s; read so far:\n{text}"));
        let Some(frame) = frame else { break };
        if let Ok(data) = frame.unwrap().into_data() {
            text.push_str(&String::from_utf8_lossy(&data));
        }
        while let Some(end) = text.find("\n\n") {
            let block: String = text.drain(..end + 2).collect();
            let mut name = String::new();
            let mut data = String::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event: ") {
                    name = v.to_owned();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data = v.to_owned();
                }
            }
            if name.is_empty() {
                continue; // a keep-alive comment
            }
            let done = name == "end" || name == "error";
            out.push((name, serde_json::from_str(&data).unwrap()));
            if done {
                return out;
            }
        }
    }
    out
}

/// A hold of two seconds, watched: HELD first, then EXPIRED when it lapses, then `end`.
#[sqlx::test]
async fn a_watch_streams_each_change_until_the_reservation_ends(pool: PgPool) {
    let fakes = spawn_fakes(&["seats"]).await;
    let app = spawn_http(pool, settings(&[("seats", &fakes.get("seats").url)])).await;
    let held = post(
        &app,
        "/v1/reservations",
        None,
        &json!({"request_id": "w-1", "holder": "h", "ttl": "2s",
                "holds": [{"participant": "seats", "resource": "A1", "quantity": 1}]}),
    )
    .await
    .ok();
    let id = held["id"].as_str().unwrap();
    let got = events(&format!("{}/v1/reservations/{id}:watch", app.base)).await;
    let states: Vec<&str> = got
        .iter()
        .filter(|(name, _)| name == "reservation")
        .map(|(_, r)| r["state"].as_str().unwrap())
        .collect();
    assert_eq!(states.first(), Some(&"HELD"), "{got:?}");
    assert_eq!(states.last(), Some(&"EXPIRED"), "{got:?}");
    assert_eq!(got.last().map(|(n, _)| n.as_str()), Some("end"), "{got:?}");
    let text = format!("{got:?}");
    assert!(
        !text.contains(held["hold_token"].as_str().unwrap()),
        "a token in the stream"
    );

    // A watch of nothing is an ordinary JSON error, not a stream.
    let unknown = get(
        &app,
        "/v1/reservations/0193a5b2-7c1e-7000-8000-000000000000:watch",
        None,
    )
    .await;
    unknown.assert_error(404, "NOT_FOUND", "RESERVATION_NOT_FOUND");
}

#[sqlx::test]
async fn probes_metrics_and_security_headers(pool: PgPool) {
    let app = spawn_http(pool, settings(&[])).await;
    assert_eq!(get(&app, "/healthz", None).await.status, 200);
    let ready = get(&app, "/readyz", None).await;
    assert_eq!((ready.status, ready.text.as_str()), (200, "ready\n"));
    let metrics = get(&app, "/metrics", None).await;
    assert_eq!(metrics.status, 200);
    assert!(
        metrics.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let page = get(&app, "/", None).await;
    assert_eq!(page.status, 200);
    assert!(
        page.text.contains("<script src=\"/console.js\""),
        "{}",
        page.text
    );
    let csp = page.headers["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("default-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(page.headers["x-content-type-options"], "nosniff");
    // API answers carry them too.
    let api = get(&app, "/v1/reservations", None).await;
    assert_eq!(api.headers["x-content-type-options"], "nosniff");
}
