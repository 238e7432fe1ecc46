//! The HTTP listener (SPEC 8.4) against a real coordinator (fresh Postgres database, in-test
//! participants on loopback): the JSON API endpoint by endpoint (`api.rs`), its errors and
//! refusals of bad input (`input.rs`), authentication (`auth.rs`), the Watch stream as
//! server-sent events and the probes (`stream.rs`), the event feed (`events.rs`), waitlists
//! (`waitlist.rs`), and the console in headless Chromium over WebDriver (`browser.rs`,
//! `browser_find.rs`, `browser_queue.rs`).

mod api;
mod auth;
mod browser;
mod browser_find;
mod browser_queue;
mod events;
mod input;
mod inventory;
mod lookup;
mod origin;
mod payments;
mod ready;
mod stream;
mod waitlist;

use std::time::Duration;

use axum::body::Bytes;
use holdfast::app::{self, CoordinatorSettings};
use holdfast::proto::coordinator_client::CoordinatorClient;
use holdfast::store::PgStore;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::transport::Channel;

/// A coordinator serving gRPC and HTTP on loopback ports of its own.
pub struct HttpApp {
    pub grpc: CoordinatorClient<Channel>,
    /// `http://127.0.0.1:PORT`
    pub base: String,
    shutdown: Option<oneshot::Sender<()>>,
}

impl Drop for HttpApp {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// Starts a coordinator with its HTTP listener on 127.0.0.1:0.
pub async fn spawn_http(pool: PgPool, settings: CoordinatorSettings) -> HttpApp {
    spawn_http_allowing(pool, settings, Default::default()).await
}

/// [`spawn_http`] with hosts and origins allowed beyond the listener's own
/// (`--http-allowed-host`, `--http-allowed-origin`).
pub async fn spawn_http_allowing(
    pool: PgPool,
    settings: CoordinatorSettings,
    allowed: holdfast::http::AllowedCallers,
) -> HttpApp {
    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc_addr = grpc.local_addr().unwrap();
    let base = format!("http://{}", http.local_addr().unwrap());
    let store = PgStore::from_pool(pool);
    store.migrate().await.unwrap();
    let (tx, rx) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let http = holdfast::http::HttpListener {
            listener: http.into(),
            allowed,
        };
        app::serve_coordinator_with_http(settings, store, grpc, Some(http), async {
            let _ = rx.await;
        })
        .await
        .unwrap();
    });
    HttpApp::connect(grpc_addr, base, tx).await
}

impl HttpApp {
    /// The app whose gRPC port is `grpc_addr` and HTTP listener `base`; `shutdown` stops it.
    pub async fn connect(
        grpc_addr: std::net::SocketAddr,
        base: String,
        shutdown: oneshot::Sender<()>,
    ) -> HttpApp {
        let client = CoordinatorClient::connect(format!("http://{grpc_addr}"))
            .await
            .unwrap();
        HttpApp {
            grpc: client,
            base,
            shutdown: Some(shutdown),
        }
    }
}

/// An HTTP answer: status, headers, body text (and the body as JSON, `Null` if it is not).
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: axum::http::HeaderMap,
    pub text: String,
    pub json: serde_json::Value,
}

impl Answer {
    /// The error's reason (`null` when it has none).
    pub fn reason(&self) -> &str {
        self.json["reason"].as_str().unwrap_or("")
    }

    /// Asserts the status and error reason, showing the answer if not.
    #[track_caller]
    pub fn assert_error(&self, status: u16, code: &str, reason: &str) {
        assert_eq!(
            (self.status, self.json["code"].as_str(), self.reason()),
            (status, Some(code), reason),
            "{self:?}"
        );
    }

    #[track_caller]
    pub fn ok(self) -> serde_json::Value {
        assert_eq!(self.status, 200, "{self:?}");
        self.json
    }
}

/// One request to `base` + `path`, with `key` as a bearer credential and `body` as JSON.
pub async fn call(method: &str, url: &str, key: Option<&str>, body: Option<&str>) -> Answer {
    let bearer = key.map(|key| format!("Bearer {key}"));
    let mut headers = Vec::new();
    if let Some(bearer) = &bearer {
        headers.push(("authorization", bearer.as_str()));
    }
    if body.is_some() {
        headers.push(("content-type", "application/json"));
    }
    send(method, url, &headers, body).await
}

/// One request with exactly these `headers` (and `Host` from `url` unless given).
pub async fn send(method: &str, url: &str, headers: &[(&str, &str)], body: Option<&str>) -> Answer {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut request = axum::http::Request::builder().method(method).uri(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(Bytes::from(body.unwrap_or("").to_owned())))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(30), client.request(request))
        .await
        .expect("an answer within 30 s")
        .unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let json = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
    Answer {
        status,
        headers,
        text,
        json,
    }
}

/// `GET`.
pub async fn get(app: &HttpApp, path: &str, key: Option<&str>) -> Answer {
    call("GET", &format!("{}{path}", app.base), key, None).await
}

/// `POST` with a JSON body.
pub async fn post(
    app: &HttpApp,
    path: &str,
    key: Option<&str>,
    body: &serde_json::Value,
) -> Answer {
    call(
        "POST",
        &format!("{}{path}", app.base),
        key,
        Some(&body.to_string()),
    )
    .await
}

/// A Reserve body: one seat, for `holder`.
pub fn reserve_body(request_id: &str, holder: &str, seat: &str) -> serde_json::Value {
    serde_json::json!({
        "request_id": request_id,
        "holder": holder,
        "holds": [{"participant": "seats", "resource": seat, "quantity": 1}],
    })
}
