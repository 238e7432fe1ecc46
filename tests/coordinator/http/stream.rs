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

/// Opens `url` as an event stream with `key` and reads its first event: the open response,
/// its body kept by the caller.
async fn open_stream(url: &str, key: &str) -> axum::body::Body {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = axum::http::Request::get(url)
        .header("authorization", format!("Bearer {key}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = client.request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let first = tokio::time::timeout(Duration::from_secs(10), body.frame())
        .await
        .expect("a first event within 10 s")
        .expect("a first event")
        .unwrap();
    let first = String::from_utf8_lossy(first.data_ref().expect("data")).into_owned();
    assert!(first.starts_with("event: reservation"), "{first}");
    axum::body::Body::new(body)
}

/// The JSON error a watch of `url` asked with `key` is answered; fails at once if a stream
/// opens instead.
async fn refused_watch(url: &str, key: &str) -> super::Answer {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let request = axum::http::Request::get(url)
        .header("authorization", format!("Bearer {key}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = client.request(request).await.unwrap();
    let status = response.status().as_u16();
    assert_ne!(status, 200, "the watch was not refused: a stream opened");
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let json = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
    super::Answer {
        status,
        headers,
        text,
        json,
    }
}

/// Settings with the cast's principals and `watch` caps.
fn capped(
    cast: &crate::auth::Cast,
    seats: &str,
    watch: holdfast::coordinator::WatchLimits,
) -> holdfast::app::CoordinatorSettings {
    let mut s = crate::auth::secured_settings(cast, &[("seats", seats)]);
    s.policy.watch = watch;
    s
}

/// A reservation of `principal` (by key), over gRPC.
async fn reserved_by(app: &super::HttpApp, key: &str, id: &str) -> String {
    let request = crate::auth::reserve_seat(id, &format!("h-{id}"), id);
    app.grpc
        .clone()
        .reserve(crate::auth::keyed(request, key))
        .await
        .unwrap()
        .into_inner()
        .id
}

#[sqlx::test]
async fn the_principal_cap_counts_sse_and_grpc_watches_together(pool: PgPool) {
    let fakes = spawn_fakes(&["seats"]).await;
    let cast = crate::auth::Cast::new();
    let limits = holdfast::coordinator::WatchLimits {
        per_process: 100,
        per_connection: 100,
        per_principal: 2,
        poll: Duration::from_millis(250),
    };
    let app = spawn_http(pool, capped(&cast, &fakes.get("seats").url, limits)).await;
    let (shop, stranger) = (cast.shop.key.as_str(), cast.stranger.key.as_str());
    let mine = [
        reserved_by(&app, shop, "A1").await,
        reserved_by(&app, shop, "A2").await,
        reserved_by(&app, shop, "A3").await,
    ];
    let theirs = reserved_by(&app, stranger, "B1").await;
    let watch_url = |id: &str| format!("{}/v1/reservations/{id}:watch", app.base);

    // One stream over gRPC and one as SSE: the principal's cap is reached.
    let mut grpc = app
        .grpc
        .clone()
        .watch_reservation(crate::auth::keyed(
            holdfast::proto::WatchReservationRequest {
                reservation_id: mine[0].clone(),
            },
            shop,
        ))
        .await
        .unwrap()
        .into_inner();
    grpc.message().await.unwrap().expect("a first image");
    let _sse = open_stream(&watch_url(&mine[1]), shop).await;
    // The next, as SSE on a connection of its own, is refused naming the cap.
    let refused = refused_watch(&watch_url(&mine[2]), shop).await;
    refused.assert_error(429, "RESOURCE_EXHAUSTED", "WATCH_LIMIT_EXCEEDED");
    assert_eq!(
        refused.json["metadata"]["scope"], "principal",
        "{refused:?}"
    );
    assert!(
        refused.text.contains("--max-watches-per-principal"),
        "{refused:?}"
    );
    // Another principal still watches.
    let _theirs = open_stream(&watch_url(&theirs), stranger).await;
}

#[sqlx::test]
async fn an_sse_stream_counts_against_its_http_connection(pool: PgPool) {
    let fakes = spawn_fakes(&["seats"]).await;
    let cast = crate::auth::Cast::new();
    // No stream allowed on any one connection: an SSE stream is refused only if it is
    // counted against its HTTP connection.
    let limits = holdfast::coordinator::WatchLimits {
        per_process: 100,
        per_connection: 0,
        per_principal: 100,
        poll: Duration::from_millis(250),
    };
    let app = spawn_http(pool, capped(&cast, &fakes.get("seats").url, limits)).await;
    let shop = cast.shop.key.as_str();
    let id = reserved_by(&app, shop, "A1").await;
    let url = format!("{}/v1/reservations/{id}:watch", app.base);
    let refused = refused_watch(&url, shop).await;
    refused.assert_error(429, "RESOURCE_EXHAUSTED", "WATCH_LIMIT_EXCEEDED");
    assert_eq!(
        refused.json["metadata"]["scope"], "connection",
        "{refused:?}"
    );
}
