//! Webhooks (SPEC 10) against a real HTTP receiver on a loopback port: a coordinator (fresh
//! Postgres database) with the real stock participant runs Reserve, Confirm and Cancel, and
//! its delivery loop POSTs every event of the log, signed, once, in sequence order; a receiver
//! that fails for a while gets the same events again until it takes them, still in order; one
//! that fails past the give-up period pauses the webhook (ListSinks, the metric) until Admin
//! ResumeWebhook; a filter passes other types over while the cursor moves; two replicas on one
//! database deliver each event once (the sink's lease).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use holdfast::app::{Beside, serve_coordinator_beside};
use holdfast::participants::Kind;
use holdfast::proto;
use holdfast::proto::admin_client::AdminClient;
use holdfast::proto::coordinator_client::CoordinatorClient;
use holdfast::proto::event::Type;
use holdfast::sinks::Sink;
use holdfast::sinks::webhook::{Webhook, WebhookError, WebhookSecret, WebhookSettings};
use holdfast::store::events::{EventLog, EventPage};
use holdfast::store::{AnyStore, PgStore, SqliteStore};
use holdfast::telemetry::ops::ops_names::{
    EVENTS_DELIVERED, EVENTS_LAG, SINK_PAUSED, WEBHOOK_FAILURES,
};
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tonic::transport::Channel;

use crate::common::{Decide, hold, put_resources, reserve_request, settings, spawn_participant};

const SECRET: &[u8] = b"webhook-test-secret";

/// Upper bound of every wait here.
const PATIENCE: Duration = Duration::from_secs(60);

/// One POST the receiver took (answered 2xx).
#[derive(Clone, Debug)]
struct Received {
    event_id: String,
    sequence: i64,
    signature: String,
    content_type: String,
    body: String,
    json: serde_json::Value,
}

/// What the receiver saw, shared with its handler.
struct Seen {
    taken: Mutex<Vec<Received>>,
    attempts: AtomicUsize,
    /// Answer 500 to this many more requests before answering 200 again.
    failing: AtomicUsize,
    /// Moves on every request, for waiting without polling.
    requests: watch::Sender<usize>,
}

/// An HTTP server on 127.0.0.1 that records what it is POSTed.
struct Receiver {
    url: String,
    seen: Arc<Seen>,
}

impl Receiver {
    async fn start() -> Receiver {
        let seen = Arc::new(Seen {
            taken: Mutex::new(Vec::new()),
            attempts: AtomicUsize::new(0),
            failing: AtomicUsize::new(0),
            requests: watch::channel(0).0,
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hooks/holdfast", listener.local_addr().unwrap());
        let router = axum::Router::new()
            .route("/hooks/holdfast", axum::routing::post(receive))
            .with_state(seen.clone());
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        Receiver { url, seen }
    }

    fn fail_next(&self, n: usize) {
        self.seen.failing.store(n, Ordering::SeqCst);
    }

    fn taken(&self) -> Vec<Received> {
        self.seen.taken.lock().unwrap().clone()
    }

    fn attempts(&self) -> usize {
        self.seen.attempts.load(Ordering::SeqCst)
    }

    /// Waits until `done` holds of what was taken and the number of attempts.
    async fn until(&self, what: &str, done: impl Fn(&[Received], usize) -> bool) {
        let mut requests = self.seen.requests.subscribe();
        let waited = tokio::time::timeout(PATIENCE, async {
            loop {
                requests.borrow_and_update();
                if done(&self.taken(), self.attempts()) {
                    return;
                }
                requests.changed().await.unwrap();
            }
        })
        .await;
        assert!(
            waited.is_ok(),
            "waited {PATIENCE:?} for {what}; taken: {:#?}",
            self.taken()
        );
    }
}

async fn receive(State(seen): State<Arc<Seen>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    seen.attempts.fetch_add(1, Ordering::SeqCst);
    let failing = seen
        .failing
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if !failing {
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let body = String::from_utf8(body.to_vec()).unwrap();
        seen.taken.lock().unwrap().push(Received {
            event_id: header("holdfast-event-id"),
            sequence: header("holdfast-sequence").parse().unwrap_or(-1),
            signature: header("holdfast-signature"),
            content_type: header("content-type"),
            json: serde_json::from_str(&body).unwrap_or_default(),
            body,
        });
    }
    seen.requests.send_modify(|n| *n += 1);
    if failing {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::NO_CONTENT
    }
}

/// Checks `Holdfast-Signature` with the receiver's check README.md shows ("Reacting to
/// reservations", in Rust), and the headers against the body.
fn assert_signed(r: &Received) {
    assert!(
        verified(SECRET, &r.signature, r.body.as_bytes(), 300),
        "{r:?}"
    );
    assert!(!verified(
        b"another secret",
        &r.signature,
        r.body.as_bytes(),
        300
    ));
    assert!(!verified(SECRET, &r.signature, b"{}", 300));
    assert_eq!(r.content_type, "application/json");
    assert_eq!(r.json["event_id"], r.event_id.as_str(), "{r:?}");
    assert_eq!(r.json["sequence"], r.sequence, "{r:?}");
}

// README.md's Rust snippet, as it is there.

/// Whether `signature` (the `Holdfast-Signature` header) signs `body` with `secret`, made
/// within `tolerance_secs` of now.
fn verified(secret: &[u8], signature: &str, body: &[u8], tolerance_secs: u64) -> bool {
    let Some((t, v1)) = signature
        .strip_prefix("t=")
        .and_then(|rest| rest.split_once(",v1="))
    else {
        return false;
    };
    let (Ok(t), Some(tag)) = (t.parse::<u64>(), hex(v1)) else {
        return false;
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if now.abs_diff(t) > tolerance_secs {
        return false;
    }
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    let signed = [t.to_string().as_bytes(), b".", body].concat();
    ring::hmac::verify(&key, &signed, &tag).is_ok()
}

fn hex(s: &str) -> Option<Vec<u8>> {
    s.len().is_multiple_of(2).then_some(())?;
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn webhook(name: &str, url: &str, types: Option<Vec<Type>>, give_up: Duration) -> Arc<dyn Sink> {
    Arc::new(
        Webhook::new(WebhookSettings {
            name: name.into(),
            url: url.into(),
            types,
            secret: WebhookSecret::new(SECRET.to_vec()).unwrap(),
            give_up,
            ca: None,
        })
        .unwrap(),
    )
}

/// A coordinator delivering to `sinks`, with `stock` registered.
struct Replica {
    /// `http://127.0.0.1:PORT`: gRPC.
    url: String,
    /// `http://127.0.0.1:PORT`: the console and JSON API.
    http: String,
    client: CoordinatorClient<Channel>,
    admin: AdminClient<Channel>,
    _stop: oneshot::Sender<()>,
}

async fn replica(pool: &PgPool, stock: &str, sinks: Vec<Arc<dyn Sink>>) -> Replica {
    replica_on(PgStore::from_pool(pool.clone()).into(), stock, sinks).await
}

/// A coordinator on `store` (either database) delivering to `sinks`, with `stock` registered.
async fn replica_on(store: AnyStore, stock: &str, sinks: Vec<Arc<dyn Sink>>) -> Replica {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    store.migrate().await.unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let http_tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http = format!("http://{}", http_tcp.local_addr().unwrap());
    let http_listener = holdfast::http::HttpListener {
        listener: http_tcp.into(),
        allowed: Default::default(),
    };
    let beside = Beside {
        http: Some(http_listener),
        sinks,
    };
    let settings = settings(&[("stock", stock)]);
    tokio::spawn(async move {
        serve_coordinator_beside(settings, store, listener, beside, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    let url = format!("http://{addr}");
    Replica {
        client: CoordinatorClient::connect(url.clone()).await.unwrap(),
        admin: AdminClient::connect(url.clone()).await.unwrap(),
        url,
        http,
        _stop: stop,
    }
}

/// The real stock participant, with 100 units of `sku-1`.
async fn stock(pool: &PgPool) -> String {
    let url = spawn_participant(Kind::Stock, pool).await;
    put_resources(&url, &[("sku-1", 100)]).await;
    url
}

/// Reserve + Confirm, Reserve + Cancel (request ids prefixed by `run`); the cancelled id.
async fn script(client: &mut CoordinatorClient<Channel>, run: &str) -> String {
    let a = client
        .reserve(reserve_request(
            &format!("{run}-a"),
            vec![hold("stock", "sku-1")],
        ))
        .await
        .unwrap()
        .into_inner();
    client.confirm(Decide::on(&a).confirm()).await.unwrap();
    let b = client
        .reserve(reserve_request(
            &format!("{run}-b"),
            vec![hold("stock", "sku-1")],
        ))
        .await
        .unwrap()
        .into_inner();
    client.cancel(Decide::on(&b).cancel()).await.unwrap();
    b.id
}

/// Every readable event in the log, once `id`'s CANCELLED is among them.
async fn log_through_cancel_of(store: &impl EventLog, id: &str) -> Vec<holdfast::domain::Event> {
    tokio::time::timeout(PATIENCE, async {
        loop {
            let page = EventPage {
                after: 0,
                owner: None,
                limit: 1000,
            };
            let events = store.events_after(&page).await.unwrap();
            let cancelled = events.iter().any(|e| {
                e.reservation.id.to_string() == id
                    && e.event_type.as_str() == "RESERVATION_CANCELLED"
            });
            if cancelled {
                return events;
            }
            // The log is read again until the run is readable.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the log holds the scripted run")
}

fn assert_once_in_order(taken: &[Received], log: &[holdfast::domain::Event]) {
    let sequences: Vec<i64> = taken.iter().map(|r| r.sequence).collect();
    let expected: Vec<i64> = log.iter().map(|e| e.sequence).collect();
    assert_eq!(sequences, expected, "each event once, in sequence order");
    for (r, e) in taken.iter().zip(log) {
        assert_eq!(r.event_id, e.event_id.to_string());
        assert_eq!(r.json["type"], e.event_type.as_str());
        assert_signed(r);
    }
}

#[sqlx::test(migrations = false)]
async fn every_event_arrives_once_in_order_signed(pool: PgPool) {
    let store = PgStore::from_pool(pool.clone());
    every_event_arrives_once(&pool, store.clone().into(), &store, "orders").await;
}

/// The same with the coordinator's log on SQLite (the stock participant stays on PostgreSQL).
#[sqlx::test(migrations = false)]
async fn every_event_arrives_once_in_order_signed_on_sqlite(pool: PgPool) {
    let path = std::env::temp_dir().join(format!("holdfast-webhooks-{}.db", uuid::Uuid::new_v4()));
    let store = SqliteStore::connect(&format!("sqlite://{}", path.display()), 8)
        .await
        .unwrap();
    every_event_arrives_once(&pool, store.clone().into(), &store, "orders-sqlite").await;
    let _ = std::fs::remove_file(&path);
}

/// A scripted run on `store` reaches the webhook `name`: every event once, in order, signed.
async fn every_event_arrives_once(pool: &PgPool, store: AnyStore, log: &impl EventLog, name: &str) {
    let receiver = Receiver::start().await;
    let stock = stock(pool).await;
    let hook = webhook(name, &receiver.url, None, Duration::from_secs(3600));
    let mut replica = replica_on(store, &stock, vec![hook]).await;
    let cancelled = script(&mut replica.client, "once").await;
    let log = log_through_cancel_of(log, &cancelled).await;
    let last = log.last().unwrap().sequence;
    receiver
        .until("the whole run", |taken, _| {
            taken.last().is_some_and(|r| r.sequence >= last)
        })
        .await;
    assert_once_in_order(&receiver.taken(), &log);
    let sink = format!("webhook:{name}");
    until_sink(&mut replica.admin, &sink, |s| s.delivered_through >= last).await;
    let delivered = metric_line(EVENTS_DELIVERED, &format!("sink=\"{sink}\"")).unwrap();
    assert!(
        delivered.ends_with(&format!(" {}", log.len())),
        "{delivered}"
    );
    let types: Vec<String> = receiver
        .taken()
        .iter()
        .map(|r| r.json["type"].as_str().unwrap().to_owned())
        .collect();
    for t in [
        "RESERVATION_HELD",
        "RESERVATION_CONFIRMED",
        "RESERVATION_CANCELLED",
    ] {
        assert!(types.iter().any(|x| x == t), "{t} in {types:?}");
    }
}

#[sqlx::test(migrations = false)]
async fn a_failing_receiver_gets_the_events_again_in_order_until_it_takes_them(pool: PgPool) {
    let receiver = Receiver::start().await;
    receiver.fail_next(3);
    let stock = stock(&pool).await;
    let hook = webhook("retried", &receiver.url, None, Duration::from_secs(3600));
    let mut replica = replica(&pool, &stock, vec![hook]).await;
    let cancelled = script(&mut replica.client, "retry").await;
    let log = log_through_cancel_of(&PgStore::from_pool(pool.clone()), &cancelled).await;
    let last = log.last().unwrap().sequence;
    receiver
        .until("the whole run after the failures", |taken, _| {
            taken.last().is_some_and(|r| r.sequence >= last)
        })
        .await;
    assert_once_in_order(&receiver.taken(), &log);
    assert_eq!(
        receiver.attempts(),
        log.len() + 3,
        "3 refused, then each once"
    );
    // Recorded once the POSTs are answered: no longer failing, caught up.
    until_sink(&mut replica.admin, "webhook:retried", |s| {
        s.delivered_through >= last && s.failing_since.is_none() && !s.paused
    })
    .await;
}

async fn list_sinks(admin: &mut AdminClient<Channel>) -> Vec<proto::Sink> {
    admin
        .list_sinks(proto::ListSinksRequest {})
        .await
        .unwrap()
        .into_inner()
        .sinks
}

/// Waits until ListSinks shows `name` as `check` wants it (the sink's state is the database's:
/// nothing to await but the answer).
async fn until_sink(
    admin: &mut AdminClient<Channel>,
    name: &str,
    check: impl Fn(&proto::Sink) -> bool,
) -> proto::Sink {
    tokio::time::timeout(PATIENCE, async {
        loop {
            let sinks = list_sinks(admin).await;
            if let Some(sink) = sinks.into_iter().find(|s| s.name == name && check(s)) {
                return sink;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{name} never got there"))
}

/// Runs the `holdfast` binary with `args` (none of the caller's environment); its stdout,
/// asserting it succeeded.
async fn cli(args: &[&str]) -> String {
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .args(args)
        .env_clear()
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "holdfast {args:?}: {stdout}\n{stderr}"
    );
    stdout
}

/// The line of series `name` whose labels contain `label` (`sink="webhook:x"`).
fn metric_line(name: &str, label: &str) -> Option<String> {
    holdfast::telemetry::metrics_handle()
        .render()
        .lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .map(str::to_owned)
}

#[sqlx::test(migrations = false)]
async fn failing_past_the_give_up_period_pauses_until_resumed(pool: PgPool) {
    let receiver = Receiver::start().await;
    receiver.fail_next(usize::MAX);
    let stock = stock(&pool).await;
    let hook = webhook("paused", &receiver.url, None, Duration::from_secs(1));
    let mut replica = replica(&pool, &stock, vec![hook]).await;
    let cancelled = script(&mut replica.client, "pause").await;
    let log = log_through_cancel_of(&PgStore::from_pool(pool.clone()), &cancelled).await;
    let sink = until_sink(&mut replica.admin, "webhook:paused", |s| s.paused).await;
    assert_eq!(sink.delivered_through, 0, "{sink:?}");
    assert!(sink.last_error.contains("500"), "{sink:?}");
    assert_eq!(
        metric_line(SINK_PAUSED, "sink=\"webhook:paused\"").as_deref(),
        Some("holdfast_events_sink_paused{sink=\"webhook:paused\"} 1")
    );
    assert!(metric_line(WEBHOOK_FAILURES, "endpoint=\"paused\"").is_some());
    assert!(metric_line(EVENTS_LAG, "sink=\"webhook:paused\"").is_some());
    assert!(receiver.taken().is_empty());
    // The operator's view: `holdfast admin sinks`.
    let listed = cli(&["admin", "sinks", "--json", "--coordinator", &replica.url]).await;
    let listed = &serde_json::from_str::<serde_json::Value>(&listed).unwrap()["sinks"];
    let shown = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "webhook:paused")
        .unwrap_or_else(|| panic!("{listed}"));
    assert_eq!(shown["paused"], true, "{shown}");
    assert_eq!(shown["delivered_through"], 0, "{shown}");
    let table = cli(&["admin", "sinks", "--coordinator", &replica.url]).await;
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("webhook:paused") && l.contains("PAUSED")),
        "{table}"
    );
    // The console's view: the JSON API.
    let listed = crate::http::call(
        "GET",
        &format!("{}/v1/admin/sinks", replica.http),
        None,
        None,
    )
    .await
    .ok();
    let shown = listed["sinks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "webhook:paused")
        .unwrap_or_else(|| panic!("{listed}"))
        .clone();
    assert_eq!(shown["paused"], true, "{shown}");
    let unknown = format!("{}/v1/admin/webhooks/nobody:resume", replica.http);
    let refused = crate::http::call("POST", &unknown, None, Some("{}")).await;
    assert_eq!(refused.status, 404, "{refused:?}");
    receiver.fail_next(0);
    let resumed = replica
        .admin
        .resume_webhook(proto::ResumeWebhookRequest {
            name: "paused".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .sink
        .unwrap();
    assert!(!resumed.paused, "{resumed:?}");
    // Resuming a webhook nobody configured is refused by name.
    let unknown = tokio::process::Command::new(env!("CARGO_BIN_EXE_holdfast"))
        .args([
            "admin",
            "resume-webhook",
            "nobody",
            "--coordinator",
            &replica.url,
        ])
        .env_clear()
        .output()
        .await
        .unwrap();
    assert!(!unknown.status.success());
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("nobody"),
        "{unknown:?}"
    );
    let last = log.last().unwrap().sequence;
    receiver
        .until("the run after the resume", |taken, _| {
            taken.last().is_some_and(|r| r.sequence >= last)
        })
        .await;
    assert_once_in_order(&receiver.taken(), &log);
    until_sink(&mut replica.admin, "webhook:paused", |s| {
        s.delivered_through >= last && !s.paused
    })
    .await;
}

#[sqlx::test(migrations = false)]
async fn a_filter_sends_only_its_types_and_the_cursor_moves_past_the_rest(pool: PgPool) {
    let receiver = Receiver::start().await;
    let stock = stock(&pool).await;
    let types = Some(vec![Type::ReservationConfirmed, Type::ReservationCancelled]);
    let hook = webhook("filtered", &receiver.url, types, Duration::from_secs(3600));
    let mut replica = replica(&pool, &stock, vec![hook]).await;
    let cancelled = script(&mut replica.client, "filter").await;
    let log = log_through_cancel_of(&PgStore::from_pool(pool.clone()), &cancelled).await;
    let last = log.last().unwrap().sequence;
    let wanted: Vec<_> = log
        .iter()
        .filter(|e| {
            matches!(
                e.event_type.as_str(),
                "RESERVATION_CONFIRMED" | "RESERVATION_CANCELLED"
            )
        })
        .cloned()
        .collect();
    assert_eq!(wanted.len(), 2, "{log:?}");
    receiver
        .until("the confirmation and the cancellation", |taken, _| {
            taken.len() >= 2
        })
        .await;
    assert_once_in_order(&receiver.taken(), &wanted);
    until_sink(&mut replica.admin, "webhook:filtered", |s| {
        s.delivered_through >= last
    })
    .await;
    assert_eq!(receiver.taken().len(), 2);
}

#[sqlx::test(migrations = false)]
async fn two_replicas_with_the_same_webhook_deliver_each_event_once(pool: PgPool) {
    let receiver = Receiver::start().await;
    let stock = stock(&pool).await;
    let give_up = Duration::from_secs(3600);
    let mut first = replica(
        &pool,
        &stock,
        vec![webhook("shared", &receiver.url, None, give_up)],
    )
    .await;
    let mut second = replica(
        &pool,
        &stock,
        vec![webhook("shared", &receiver.url, None, give_up)],
    )
    .await;
    script(&mut first.client, "one").await;
    let cancelled = script(&mut second.client, "two").await;
    let mut log = log_through_cancel_of(&PgStore::from_pool(pool.clone()), &cancelled).await;
    // The first run's events are all numbered before the second run's cancellation.
    log.sort_by_key(|e| e.sequence);
    let last = log.last().unwrap().sequence;
    receiver
        .until("both runs", |taken, _| {
            taken.last().is_some_and(|r| r.sequence >= last)
        })
        .await;
    assert_once_in_order(&receiver.taken(), &log);
    assert_eq!(receiver.attempts(), log.len(), "no event was POSTed twice");
}

#[test]
fn a_webhook_url_that_cannot_work_is_refused_naming_it() {
    let settings = |url: &str| WebhookSettings {
        name: "bad".into(),
        url: url.into(),
        types: None,
        secret: WebhookSecret::new(SECRET.to_vec()).unwrap(),
        give_up: Duration::from_secs(60),
        ca: None,
    };
    for url in ["ftp://x/", "http://user:pw@x/", "https://"] {
        let refused = Webhook::new(settings(url)).err().unwrap();
        assert!(
            matches!(&refused, WebhookError::Url { name, .. } if name == "bad"),
            "{refused}"
        );
        assert!(
            refused.to_string().starts_with("--webhook bad="),
            "{refused}"
        );
    }
    assert!(WebhookSecret::new(Vec::new()).is_err());
}
