//! Extend at the expiry edge (issue 40, item 3): hundreds of real concurrent clients, each
//! reserving with a ttl of 1 s and extending around the instant its hold lapses, against a
//! real coordinator on PostgreSQL and on SQLite. The store judges an Extend with the row
//! locked and then writes it with an UPDATE guarded by the database clock; a hold that lapses
//! between the two must be answered as lapsed (`HOLD_EXPIRED`, released), never as an Extend
//! that changed nothing. So each answer is either the extension (a later `expires_at`,
//! `extensions_used` + 1) or `HOLD_EXPIRED` with the hold then released at the participant.
//!
//! On PostgreSQL the coordinator's database answers a few milliseconds away (a relay,
//! `common/latency.rs`), as in a deployment across zones, so the read and the UPDATE are round
//! trips apart and some Extends meet the edge between them on every run; on SQLite both run
//! microseconds apart on the writer thread, so there the same checks guard the same code.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use holdfast::proto;
use holdfast::proto::coordinator_client::CoordinatorClient;
use holdfast::proto::reservation::State;
use holdfast::store::SqliteStore;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tonic::Code;

use crate::common::*;

/// Concurrent clients, one reservation each.
const CLIENTS: usize = 300;
/// Client `i` starts `i` times this after the first, so the Extends keep coming rather than
/// queue up in one burst.
const STAGGER: Duration = Duration::from_millis(10);
/// Each reservation's ttl: the shortest a Reserve may ask for.
const TTL: Duration = Duration::from_secs(1);
/// What each Extend adds.
const BY: Duration = Duration::from_secs(30);
/// Each Extend is sent so that, taking as long as the Extends answered lately, it is judged
/// around its hold's deadline: from this long before the deadline ...
const EARLIEST_MS: i64 = -60;
/// ... to this long after it, in steps of [`STEP_MS`] over the clients.
const LATEST_MS: i64 = 40;
const STEP_MS: i64 = 10;
/// What an Extend is expected to take before any was answered.
const FIRST_GUESS: Duration = Duration::from_millis(100);
/// How many of the latest Extends' durations the expectation is the median of.
const RECENT: usize = 32;

/// PostgreSQL's answers reach the coordinator this late (a database in another zone): the
/// time between the locked read that judges an Extend and the UPDATE that writes it is a few
/// round trips, so some of the holds lapse in between.
const DATABASE_LATENCY: Duration = Duration::from_millis(5);

crate::parallel::parallel_test!(extends_at_the_expiry_edge_extend_or_expire_on_postgres => on_postgres);

async fn on_postgres(pool: PgPool) {
    let distant = pool_at_distance(&pool.connect_options(), 32, DATABASE_LATENCY).await;
    let fakes = spawn_fakes(&["p1"]).await;
    let app = spawn_app(distant, settings(&[("p1", &fakes.get("p1").url)])).await;
    extends_at_the_edge(app.addr, &fakes).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn extends_at_the_expiry_edge_extend_or_expire_on_sqlite() {
    let path =
        std::env::temp_dir().join(format!("holdfast-extend-edge-{}.db", uuid::Uuid::new_v4()));
    let store = SqliteStore::connect(&format!("sqlite://{}", path.display()), 8)
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let fakes = spawn_fakes(&["p1"]).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(holdfast::app::serve_coordinator(
        settings(&[("p1", &fakes.get("p1").url)]),
        store,
        listener,
        async {
            let _ = stopped.await;
        },
    ));
    extends_at_the_edge(addr, &fakes).await;
    let _ = stop.send(());
    let _ = server.await;
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.clone().into_os_string();
        file.push(suffix);
        let _ = std::fs::remove_file(file);
    }
}

/// One client's reservation and its Extend's answer.
struct Edge {
    reserved: proto::Reservation,
    resource: String,
    extended: Result<proto::Reservation, tonic::Status>,
}

/// How long the latest Extends took, send to answer: when to send the next one so it is
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

/// Runs the clients against the coordinator at `addr` (participant `p1`, a fake) and checks
/// every answer.
async fn extends_at_the_edge(addr: std::net::SocketAddr, fakes: &Fakes) {
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
                extend_at_edge(&mut client, i, offset, &took).await
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

    let mut wrong = Vec::new();
    let mut expired = Vec::new();
    for edge in &edges {
        match &edge.extended {
            Ok(r) => {
                let later =
                    time(&edge.reserved.expires_at) + chrono::Duration::from_std(BY).unwrap();
                if state_of(r) != State::Held
                    || r.extensions_used != edge.reserved.extensions_used + 1
                    || time(&r.expires_at) != later
                {
                    wrong.push(format!(
                        "{}: answered {:?} with extensions_used {} and expires_at {} (held until {})",
                        r.id,
                        state_of(r),
                        r.extensions_used,
                        time(&r.expires_at),
                        time(&edge.reserved.expires_at),
                    ));
                }
            }
            Err(e) if e.code() == Code::FailedPrecondition && reason(e) == "HOLD_EXPIRED" => {
                expired.push(edge.resource.clone());
            }
            Err(e) => wrong.push(format!("{}: {e:?}", edge.reserved.id)),
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} Extends at the edge answered neither the extension nor HOLD_EXPIRED: {wrong:#?}",
        wrong.len(),
        edges.len()
    );
    // Every hold answered HOLD_EXPIRED is released (by the Extend's own decision or by the
    // reaper that expired it first).
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
        "{} of {} Extends at the edge extended, {} expired",
        edges.len() - expired.len(),
        edges.len(),
        expired.len()
    );
}

/// Reserves resource `R{i}` with a ttl of [`TTL`] and extends it so that it is expected to be
/// judged `offset_ms` from its deadline (the database's clock, which is this host's); `None`
/// if the Reserve answered after the hold had lapsed already.
async fn extend_at_edge(
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
        // Placed after its ttl ran out (a loaded machine): no edge to extend at.
        return None;
    }
    let expected = chrono::Duration::from_std(took.expected()).unwrap();
    let at = time(&reserved.expires_at) + chrono::Duration::milliseconds(offset_ms) - expected;
    if let Ok(wait) = (at - chrono::Utc::now()).to_std() {
        tokio::time::sleep(wait).await;
    }
    let sent = Instant::now();
    let extended = client
        .extend(Decide::on(&reserved).extend(Some(BY), &format!("x-{i}")))
        .await
        .map(tonic::Response::into_inner);
    took.note(sent.elapsed());
    Some(Edge {
        reserved,
        resource,
        extended,
    })
}

fn time(ts: &Option<prost_types::Timestamp>) -> chrono::DateTime<chrono::Utc> {
    let ts = ts.as_ref().expect("a timestamp");
    chrono::DateTime::from_timestamp(ts.seconds, ts.nanos as u32).expect("in range")
}
