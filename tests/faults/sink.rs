//! A webhook receiver on a loopback port for the coordinators of a schedule (SPEC 10): every
//! coordinator the plan starts delivers the event log to it, kills and backend terminations
//! included, so the check after quiescence can hold what arrived against the log.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use holdfast::sinks::Sink;
use holdfast::sinks::webhook::{Webhook, WebhookSecret, WebhookSettings};
use sqlx::PgPool;
use tokio::sync::watch;

/// Every POST taken, in arrival order: (sequence, event id).
#[derive(Default)]
struct Taken {
    posts: Mutex<Vec<(i64, String)>>,
    /// The body of each event id's last POST (for a violation's report).
    bodies: Mutex<BTreeMap<String, String>>,
}

/// The receiver and what it took.
pub struct EventReceiver {
    pub url: String,
    taken: Arc<Taken>,
    arrivals: watch::Receiver<usize>,
}

impl EventReceiver {
    pub async fn start() -> EventReceiver {
        let taken = Arc::new(Taken::default());
        let (tx, arrivals) = watch::channel(0);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the receiver");
        let url = format!("http://{}/events", listener.local_addr().expect("addr"));
        let router = axum::Router::new()
            .route("/events", axum::routing::post(receive))
            .with_state((taken.clone(), Arc::new(tx)));
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        EventReceiver {
            url,
            taken,
            arrivals,
        }
    }

    /// A webhook to this receiver, as each coordinator of the schedule gets.
    pub fn sink(url: &str) -> Arc<dyn Sink> {
        Arc::new(
            Webhook::new(WebhookSettings {
                name: "faults".into(),
                url: url.into(),
                types: None,
                secret: WebhookSecret::new(b"faults-secret".to_vec()).expect("a secret"),
                give_up: Duration::from_secs(24 * 3600),
                ca: None,
            })
            .expect("a webhook"),
        )
    }

    fn posts(&self) -> Vec<(i64, String)> {
        self.taken
            .posts
            .lock()
            .expect("the receiver's lock")
            .clone()
    }

    /// Once every numbered event of the log has arrived (or a minute passed): what is wrong
    /// with what arrived. Delivery is at least once (a coordinator killed between a POST and
    /// its cursor write posts again), so an event may arrive twice, never out of order the
    /// first time, never missing, never one the log does not hold.
    pub async fn check(&self, pool: &PgPool) -> Vec<(String, String)> {
        let log: BTreeMap<i64, String> = sqlx::query_as::<_, (i64, String)>(
            "SELECT sequence, event_id::text FROM events WHERE sequence IS NOT NULL",
        )
        .fetch_all(pool)
        .await
        .unwrap_or_else(|e| panic!("reading the event log: {e}"))
        .into_iter()
        .collect();
        let want: BTreeSet<&String> = log.values().collect();
        let mut arrivals = self.arrivals.clone();
        let _ = tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                arrivals.borrow_and_update();
                let got: BTreeSet<String> = self.posts().into_iter().map(|p| p.1).collect();
                if want.iter().all(|id| got.contains(*id)) {
                    return;
                }
                if arrivals.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
        let mut v = Vec::new();
        let mut first_seen = BTreeSet::new();
        let mut highest = 0;
        for (sequence, id) in self.posts() {
            if log.get(&sequence) != Some(&id) {
                let body = self
                    .taken
                    .bodies
                    .lock()
                    .expect("the receiver's lock")
                    .get(&id)
                    .cloned()
                    .unwrap_or_default();
                v.push((
                    id.clone(),
                    format!("webhook got {id} as {sequence}, not in the log: {body}"),
                ));
            }
            if first_seen.insert(id.clone()) {
                if sequence < highest {
                    v.push((id, format!("webhook got {sequence} first after {highest}")));
                }
                highest = highest.max(sequence);
            }
        }
        for (sequence, id) in &log {
            if !first_seen.contains(id) {
                v.push((
                    id.clone(),
                    format!("event {sequence} never reached the webhook"),
                ));
            }
        }
        v
    }
}

async fn receive(
    State((taken, arrivals)): State<(Arc<Taken>, Arc<watch::Sender<usize>>)>,
    headers: HeaderMap,
    body: String,
) -> StatusCode {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (Some(id), Some(sequence)) = (header("holdfast-event-id"), header("holdfast-sequence"))
    else {
        return StatusCode::BAD_REQUEST;
    };
    let Ok(sequence) = sequence.parse::<i64>() else {
        return StatusCode::BAD_REQUEST;
    };
    let count = {
        let mut posts = taken.posts.lock().expect("the receiver's lock");
        posts.push((sequence, id.clone()));
        posts.len()
    };
    taken
        .bodies
        .lock()
        .expect("the receiver's lock")
        .insert(id, body);
    arrivals.send_replace(count);
    StatusCode::OK
}
