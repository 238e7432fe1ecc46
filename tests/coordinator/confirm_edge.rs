//! Confirm at the expiry edge: hundreds of real concurrent clients, each reserving with a ttl
//! of 1 s and confirming around the instant its hold lapses, against a real coordinator on
//! PostgreSQL whose database answers a few milliseconds away (a relay, `common/latency.rs`).
//! The store judges a Confirm on a row read without a lock and writes it with one UPDATE
//! (many at once under load) guarded by the version read and by the database clock: the
//! clock at the UPDATE, not at the read, says whether the hold is still live. The relay puts a
//! round trip between the read and the UPDATE, so on every run some holds lapse in between;
//! those must be answered `HOLD_EXPIRED` (and released), never confirmed.
//!
//! What the database itself saw is checked too: a trigger records each row the coordinator
//! moved `HELD -> CONFIRMING` (not as an honoured late payment) by a statement that began at or
//! after the row's `expires_at` - a Confirm written after the hold lapsed. The statement's
//! start precedes every clock reading inside it, so a write guarded by the clock is never
//! recorded, and one that is not is on every run.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use holdfast::proto;
use holdfast::proto::coordinator_client::CoordinatorClient;
use holdfast::proto::reservation::State;
use sqlx::PgPool;
use tonic::Code;

use crate::common::*;

/// Concurrent clients, one reservation each.
const CLIENTS: usize = 300;
/// Client `i` starts `i` times this after the first, so the Confirms keep coming rather than
/// queue up in one burst.
const STAGGER: Duration = Duration::from_millis(10);
/// Each reservation's ttl: the shortest a Reserve may ask for.
const TTL: Duration = Duration::from_secs(1);
/// Each Confirm is sent so that, taking as long as the Confirms answered lately, it is
/// judged around its hold's deadline: from this long before the deadline ...
const EARLIEST_MS: i64 = -60;
/// ... to this long after it, in steps of [`STEP_MS`] over the clients.
const LATEST_MS: i64 = 20;
const STEP_MS: i64 = 4;
/// What a Confirm is expected to take before any was answered.
const FIRST_GUESS: Duration = Duration::from_millis(100);
/// How many of the latest Confirms' durations the expectation is the median of.
const RECENT: usize = 32;

/// PostgreSQL's answers reach the coordinator this late (a database in another zone): the
/// read that judges a Confirm and the UPDATE that writes it are a round trip apart at least.
const DATABASE_LATENCY: Duration = Duration::from_millis(5);

/// The trigger that records Confirms written after their hold lapsed, by the database clock.
const CONFIRMED_AFTER_EXPIRY: &str = "\
    CREATE TABLE confirmed_after_expiry (id uuid NOT NULL, expires_at timestamptz NOT NULL, \
                                         written_at timestamptz NOT NULL); \
    CREATE FUNCTION note_late_confirm() RETURNS trigger LANGUAGE plpgsql AS $$ \
    BEGIN \
      INSERT INTO confirmed_after_expiry VALUES (NEW.id, OLD.expires_at, statement_timestamp()); \
      RETURN NULL; \
    END $$; \
    CREATE TRIGGER note_late_confirm AFTER UPDATE ON reservations FOR EACH ROW \
      WHEN (OLD.state = 'HELD' AND NEW.state = 'CONFIRMING' AND NOT NEW.late_payment_honored \
            AND statement_timestamp() >= OLD.expires_at) \
      EXECUTE FUNCTION note_late_confirm();";

crate::parallel::parallel_test!(confirms_at_the_expiry_edge_confirm_or_expire_on_postgres => on_postgres);

async fn on_postgres(pool: PgPool) {
    let distant = pool_at_distance(&pool.connect_options(), 32, DATABASE_LATENCY).await;
    let fakes = spawn_fakes(&["p1"]).await;
    let app = spawn_app(distant, settings(&[("p1", &fakes.get("p1").url)])).await;
    sqlx::raw_sql(CONFIRMED_AFTER_EXPIRY)
        .execute(&pool)
        .await
        .unwrap();
    let edges = confirm_at_the_edge(app.addr).await;
    check_answers(&edges, &fakes).await;
    let late: Vec<(
        uuid::Uuid,
        chrono::DateTime<chrono::Utc>,
        chrono::DateTime<chrono::Utc>,
    )> = sqlx::query_as("SELECT id, expires_at, written_at FROM confirmed_after_expiry")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert!(
        late.is_empty(),
        "{} Confirms written by a statement that began after the hold lapsed \
         (id, expires_at, statement start): {late:#?}",
        late.len()
    );
}

/// One client's reservation and its Confirm's answer.
struct Edge {
    reserved: proto::Reservation,
    resource: String,
    confirmed: Result<proto::Reservation, tonic::Status>,
}

/// How long the latest Confirms took, send to answer: when to send the next one so it is
/// judged at its hold's deadline, whatever this machine's speed and load.
#[derive(Default)]
struct Took(Mutex<VecDeque<Duration>>);

impl Took {
    fn note(&self, took: Duration) {
        let mut recent = self.0.lock().unwrap();
        if recent.len() == RECENT {
            recent.pop_front();
        }
        recent.push_back(took);
    }

    /// The median of the latest durations.
    fn expected(&self) -> Duration {
        let mut recent: Vec<_> = self.0.lock().unwrap().iter().copied().collect();
        recent.sort();
        recent.get(recent.len() / 2).copied().unwrap_or(FIRST_GUESS)
    }
}

/// Runs the clients against the coordinator at `addr` (participant `p1`): their answers.
async fn confirm_at_the_edge(addr: std::net::SocketAddr) -> Vec<Edge> {
    let start = Arc::new(tokio::sync::Barrier::new(CLIENTS));
    let took = Arc::new(Took::default());
    let steps = (LATEST_MS - EARLIEST_MS) / STEP_MS + 1;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let (start, took) = (start.clone(), took.clone());
            tokio::spawn(async move {
                let mut client = CoordinatorClient::connect(format!("http://{addr}"))
                    .await
                    .unwrap();
                start.wait().await;
                tokio::time::sleep(STAGGER * i as u32).await;
                let offset = EARLIEST_MS + STEP_MS * (i as i64 % steps);
                confirm_near_deadline(&mut client, i, offset, &took).await
            })
        })
        .collect();
    let mut edges = Vec::with_capacity(CLIENTS);
    for client in clients {
        edges.extend(client.await.expect("a client's task"));
    }
    assert!(
        edges.len() >= CLIENTS / 2,
        "only {} of {CLIENTS} Reserves answered before their hold lapsed",
        edges.len()
    );
    edges
}

/// Each answer is the Confirm (`CONFIRMING` or `CONFIRMED`) or `HOLD_EXPIRED`, and every hold
/// answered `HOLD_EXPIRED` is released at the participant.
async fn check_answers(edges: &[Edge], fakes: &Fakes) {
    let mut wrong = Vec::new();
    let mut expired = Vec::new();
    for edge in edges {
        match &edge.confirmed {
            Ok(r) if matches!(state_of(r), State::Confirming | State::Confirmed) => {}
            Ok(r) => wrong.push(format!("{}: answered {:?}", r.id, state_of(r))),
            Err(e) if e.code() == Code::FailedPrecondition && reason(e) == "HOLD_EXPIRED" => {
                expired.push(edge.resource.clone());
            }
            Err(e) => wrong.push(format!("{}: {e:?}", edge.reserved.id)),
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} Confirms at the edge answered neither the Confirm nor HOLD_EXPIRED: {wrong:#?}",
        wrong.len(),
        edges.len()
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let held = fakes.get("p1").held();
        let still: Vec<_> = expired.iter().filter(|r| held.contains(r)).collect();
        if still.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "answered HOLD_EXPIRED yet still held at the participant: {still:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "{} of {} Confirms at the edge confirmed, {} expired",
        edges.len() - expired.len(),
        edges.len(),
        expired.len()
    );
}

/// Reserves resource `R{i}` with a ttl of [`TTL`] and confirms it so that it is expected to be
/// judged `offset_ms` from its deadline (the database's clock, which is this host's); `None`
/// if the Reserve answered after the hold had lapsed already.
async fn confirm_near_deadline(
    client: &mut CoordinatorClient<tonic::transport::Channel>,
    i: usize,
    offset_ms: i64,
    took: &Took,
) -> Option<Edge> {
    let resource = format!("R{i}");
    let mut request = reserve_request(&format!("edge-{i}"), vec![hold("p1", &resource)]);
    request.holder = format!("holder-{i}");
    request.ttl = Some(proto_duration(TTL));
    let reserved = client.reserve(request).await.expect("reserve").into_inner();
    if state_of(&reserved) != State::Held {
        // Placed after its ttl ran out (a loaded machine): no edge to confirm at.
        return None;
    }
    let expected = chrono::Duration::from_std(took.expected()).unwrap();
    let at = time(&reserved.expires_at) + chrono::Duration::milliseconds(offset_ms) - expected;
    if let Ok(wait) = (at - chrono::Utc::now()).to_std() {
        tokio::time::sleep(wait).await;
    }
    let sent = Instant::now();
    let confirmed = client
        .confirm(Decide::on(&reserved).confirm())
        .await
        .map(tonic::Response::into_inner);
    took.note(sent.elapsed());
    Some(Edge {
        reserved,
        resource,
        confirmed,
    })
}

fn time(ts: &Option<prost_types::Timestamp>) -> chrono::DateTime<chrono::Utc> {
    let ts = ts.as_ref().expect("a timestamp");
    chrono::DateTime::from_timestamp(ts.seconds, ts.nanos as u32).expect("in range")
}
