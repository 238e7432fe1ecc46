//! The NATS JetStream sink (SPEC 10) against the real nats-server: a coordinator (fresh Postgres
//! database, or a SQLite file) with the real stock participant runs Reserve, Confirm, Cancel
//! and an expiry, and
//! a JetStream consumer reads every event of the log once, in sequence order, on
//! `<prefix>.reservation.<type>` with `Nats-Msg-Id` = its `event_id`. A coordinator that stops
//! between JetStream's acknowledgements and its cursor write (failpoint `sinks.nats.acked`)
//! re-publishes after its restart and the stream still holds each event once. A private
//! nats-server stopped while reservations go on: the sink's lag grows (Admin `ListSinks`), and
//! once the server is back on the same port and store the backlog drains, nothing lost.
//!
//! The sink's tests run with the coordinator's log on PostgreSQL and on SQLite.
//!
//! Each test has a stream and a subject prefix of its own on the shared server
//! (127.0.0.1:4222, `.ci/run` starts it), deleted when the test ends.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures_util::StreamExt;
use holdfast::app::{Beside, serve_coordinator_beside};
use holdfast::domain::EventType;
use holdfast::participants::Kind;
use holdfast::proto;
use holdfast::proto::admin_client::AdminClient;
use holdfast::proto::coordinator_client::CoordinatorClient;
use holdfast::sinks::nats::{EventFormat, NATS_SINK_NAME, NatsError, NatsSettings, NatsSink};
use holdfast::sinks::{Sink, SinkError};
use holdfast::store::events::{EventLog, EventPage};
use holdfast::store::{AnyStore, PgStore, SqliteStore, Store};
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::transport::Channel;

use crate::common::{Decide, hold, put_resources, reserve_request, settings, spawn_participant};

/// The shared server.
const NATS_URL: &str = "nats://127.0.0.1:4222";

/// Upper bound of every wait here (a delivery retried after NATS returns waits out the loop's
/// backoff, up to seconds).
const PATIENCE: Duration = Duration::from_secs(120);

/// The coordinators' work lease, also their sink's: short, so a restart takes over soon.
const LEASE: Duration = Duration::from_secs(6);

/// The coordinator's database in a test: the test's PostgreSQL database, or a SQLite file
/// (removed on drop). The stock participant stays on PostgreSQL either way.
enum Db {
    Postgres(PgPool),
    Sqlite(std::path::PathBuf),
}

impl Db {
    fn sqlite() -> Db {
        Db::Sqlite(std::env::temp_dir().join(format!("holdfast-nats-{}.db", uuid::Uuid::new_v4())))
    }

    /// A store on it (each call a pool of its own, as each replica has).
    async fn store(&self) -> AnyStore {
        match self {
            Db::Postgres(pool) => PgStore::from_pool(pool.clone()).into(),
            Db::Sqlite(path) => SqliteStore::connect(&format!("sqlite://{}", path.display()), 8)
                .await
                .unwrap()
                .into(),
        }
    }

    /// Its log, read as the coordinator reads it.
    async fn log(&self) -> Box<dyn EventLog> {
        match self.store().await {
            AnyStore::Postgres(s) => Box::new(s),
            AnyStore::Sqlite(s) => Box::new(s),
        }
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        if let Db::Sqlite(path) = self {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
            }
        }
    }
}

/// A stream and subject prefix of this test's own; the stream is deleted on drop.
struct TestStream {
    url: String,
    prefix: String,
    name: String,
    jetstream: jetstream::Context,
}

impl TestStream {
    async fn on(url: &str) -> TestStream {
        let unique = uuid::Uuid::new_v4().simple().to_string();
        let client = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connect(url)
            .await
            .unwrap();
        TestStream {
            url: url.to_owned(),
            prefix: format!("test_{unique}"),
            name: format!("TEST_{unique}"),
            jetstream: jetstream::new(client),
        }
    }

    /// The sink's settings: this stream, created on first use.
    fn settings(&self) -> NatsSettings {
        let mut settings = NatsSettings::new(self.url.clone());
        settings.subject_prefix = self.prefix.clone();
        settings.stream = self.name.clone();
        settings.create_stream = true;
        settings.timeout = Duration::from_secs(2);
        settings
    }

    async fn sink(&self) -> Arc<dyn Sink> {
        Arc::new(NatsSink::connect(self.settings()).await.unwrap())
    }

    /// How many messages the stream holds.
    async fn count(&self) -> u64 {
        let mut stream = self.jetstream.get_stream(&self.name).await.unwrap();
        stream.info().await.unwrap().state.messages
    }

    /// Waits until the stream holds `n` messages.
    async fn wait_count(&self, n: u64) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let held = match self.jetstream.get_stream(&self.name).await {
                Ok(mut stream) => stream.info().await.map(|i| i.state.messages).unwrap_or(0),
                Err(_) => 0,
            };
            if held >= n {
                return;
            }
            assert!(Instant::now() < deadline, "the stream holds {held} of {n}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The first `n` messages of the stream, as a JetStream consumer reads them.
    async fn read(&self, n: usize) -> Vec<jetstream::Message> {
        let stream = self.jetstream.get_stream(&self.name).await.unwrap();
        let consumer: jetstream::consumer::PullConsumer = stream
            .create_consumer(jetstream::consumer::pull::Config {
                deliver_policy: jetstream::consumer::DeliverPolicy::All,
                ack_policy: jetstream::consumer::AckPolicy::None,
                ..Default::default()
            })
            .await
            .unwrap();
        let mut messages = consumer.messages().await.unwrap().take(n);
        let mut read = Vec::with_capacity(n);
        while read.len() < n {
            let next = tokio::time::timeout(PATIENCE, messages.next()).await;
            let message = next.expect("the consumer waited too long").unwrap();
            read.push(message.unwrap());
        }
        read
    }
}

impl Drop for TestStream {
    fn drop(&mut self) {
        let (url, name) = (self.url.clone(), self.name.clone());
        // Drop cannot await, and the test's runtime (which drives this client) is blocked
        // here: the deletion runs on a runtime and a connection of its own.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let delete = async {
                    let client = async_nats::connect(url).await.ok()?;
                    jetstream::new(client).delete_stream(name).await.ok()
                };
                let _ = tokio::time::timeout(Duration::from_secs(5), delete).await;
            });
        })
        .join();
    }
}

/// A coordinator delivering to `sinks`, with `stock` registered; stopped when `stop` is sent
/// or dropped, its task's handle in `served`.
struct Replica {
    client: CoordinatorClient<Channel>,
    admin: AdminClient<Channel>,
    stop: Option<oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<()>,
}

impl Replica {
    async fn start(pool: &PgPool, stock: &str, sinks: Vec<Arc<dyn Sink>>) -> Replica {
        Replica::start_on(PgStore::from_pool(pool.clone()).into(), stock, sinks).await
    }

    /// A coordinator on `store` (either database).
    async fn start_on(store: AnyStore, stock: &str, sinks: Vec<Arc<dyn Sink>>) -> Replica {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        store.migrate().await.unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let beside = Beside { http: None, sinks };
        let mut settings = settings(&[("stock", stock)]);
        // The sink's lease is the work lease: a restarted coordinator takes the sink over
        // once the stopped one's ran out.
        settings.policy.lease = LEASE;
        let served = tokio::spawn(async move {
            serve_coordinator_beside(settings, store, listener, beside, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        Replica {
            client: CoordinatorClient::connect(url.clone()).await.unwrap(),
            admin: AdminClient::connect(url).await.unwrap(),
            stop: Some(stop),
            served,
        }
    }

    /// Shuts the coordinator down and waits until it stopped (its delivery loops too).
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(PATIENCE, &mut self.served)
            .await
            .expect("the coordinator did not stop")
            .unwrap();
    }

    /// The NATS sink as Admin `ListSinks` shows it (`None` before its first lease).
    async fn nats_sink(&mut self) -> Option<proto::Sink> {
        let sinks = self
            .admin
            .list_sinks(proto::ListSinksRequest::default())
            .await
            .unwrap()
            .into_inner()
            .sinks;
        sinks.into_iter().find(|s| s.name == NATS_SINK_NAME)
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
    let reserve =
        |suffix: &str| reserve_request(&format!("{run}-{suffix}"), vec![hold("stock", "sku-1")]);
    let a = client.reserve(reserve("a")).await.unwrap().into_inner();
    client.confirm(Decide::on(&a).confirm()).await.unwrap();
    let b = client.reserve(reserve("b")).await.unwrap().into_inner();
    client.cancel(Decide::on(&b).cancel()).await.unwrap();
    b.id
}

/// Every readable event of `pool`'s log, once one of `id` has type `last`.
async fn log_through(pool: &PgPool, id: &str, last: proto::event::Type) -> Vec<proto::Event> {
    log_of_through(PgStore::from_pool(pool.clone()).event_log(), id, last).await
}

/// Every readable event of `log`, once one of `id` has type `last`.
async fn log_of_through(
    log: &dyn EventLog,
    id: &str,
    last: proto::event::Type,
) -> Vec<proto::Event> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let page = EventPage {
            after: 0,
            owner: None,
            limit: 1000,
        };
        let events: Vec<proto::Event> = log
            .events_after(&page)
            .await
            .unwrap()
            .into_iter()
            .map(holdfast::api::convert::event)
            .collect();
        let reached = events
            .iter()
            .any(|e| e.r#type() == last && e.reservation.as_ref().is_some_and(|r| r.id == id));
        if reached {
            return events;
        }
        assert!(Instant::now() < deadline, "no {last:?} of {id} in the log");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `ListSinks` shows the NATS sink as `shows` says (`what`, for the failure).
async fn wait_sink(
    replica: &mut Replica,
    what: &str,
    shows: impl Fn(&proto::Sink) -> bool,
) -> proto::Sink {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let sink = replica.nats_sink().await;
        if let Some(s) = sink.as_ref().filter(|s| shows(s)) {
            return s.clone();
        }
        assert!(Instant::now() < deadline, "not {what}: {sink:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the sink's cursor is at `sequence`.
async fn wait_delivered_through(replica: &mut Replica, sequence: i64) {
    let what = format!("delivered through {sequence}");
    wait_sink(replica, &what, |s| s.delivered_through >= sequence).await;
}

/// Each message is the log's event at its position: its subject, `Nats-Msg-Id`, and the
/// event in the JSON API's shape.
fn assert_messages_are(prefix: &str, messages: &[jetstream::Message], events: &[proto::Event]) {
    assert_eq!(messages.len(), events.len());
    for (message, event) in messages.iter().zip(events) {
        let name = event.r#type().as_str_name();
        let suffix = EventType::parse(name)
            .expect("a SPEC 10 type")
            .subject_suffix();
        assert_eq!(
            message.subject.as_str(),
            format!("{prefix}.reservation.{suffix}")
        );
        let headers = message.headers.as_ref().expect("headers");
        let id = headers.get("Nats-Msg-Id").map(|v| v.as_str());
        assert_eq!(id, Some(event.event_id.as_str()), "{event:?}");
        let json: serde_json::Value = serde_json::from_slice(&message.payload).unwrap();
        let want = holdfast::json::event(event);
        // The snapshot's branches are read with the event, so they may have moved on between
        // the publication and this read of the log: the event's own fields must match.
        for field in [
            "sequence",
            "event_id",
            "type",
            "occurred_at",
            "owner",
            "from_queue",
        ] {
            assert_eq!(json[field], want[field], "{field} of {event:?}");
        }
        for field in ["id", "state", "request_id", "holder"] {
            let (got, want) = (&json["reservation"][field], &want["reservation"][field]);
            assert_eq!(got, want, "reservation.{field} of {event:?}");
        }
    }
}

/// Every event of a scripted run (Reserve, Confirm, Reserve, Cancel, a hold left to expire)
/// arrives once, in sequence order, on its subject, with `Nats-Msg-Id` = its `event_id`; the
/// stream is created by the sink.
#[sqlx::test(migrations = false)]
async fn every_event_of_a_run_arrives_once_in_sequence_order(pool: PgPool) {
    let store = PgStore::from_pool(pool.clone());
    every_event_arrives_once(&pool, store.clone().into(), store.event_log()).await;
}

/// The same with the coordinator's log on SQLite (the stock participant stays on PostgreSQL).
#[sqlx::test(migrations = false)]
async fn every_event_of_a_run_on_sqlite_arrives_once_in_sequence_order(pool: PgPool) {
    let db = Db::sqlite();
    every_event_arrives_once(&pool, db.store().await, &*db.log().await).await;
}

/// A scripted run on `store` (Reserve, Confirm, Reserve, Cancel, a hold left to expire): every
/// event arrives once, in sequence order, on its subject, with `Nats-Msg-Id` = its
/// `event_id`; the stream is created by the sink.
async fn every_event_arrives_once(pool: &PgPool, store: AnyStore, log: &dyn EventLog) {
    let nats = TestStream::on(NATS_URL).await;
    let stock = stock(pool).await;
    let mut replica = Replica::start_on(store, &stock, vec![nats.sink().await]).await;
    script(&mut replica.client, "run").await;
    let mut lapsing = reserve_request("run-c", vec![hold("stock", "sku-1")]);
    lapsing.ttl = Some(crate::common::proto_duration(Duration::from_secs(1)));
    let c = replica.client.reserve(lapsing).await.unwrap().into_inner();
    let events = log_of_through(log, &c.id, proto::event::Type::ReservationExpired).await;
    let latest = events.last().unwrap().sequence;
    wait_delivered_through(&mut replica, latest).await;
    let types: Vec<_> = events.iter().map(|e| e.r#type()).collect();
    assert!(
        types.contains(&proto::event::Type::ReservationConfirmed),
        "{types:?}"
    );
    assert!(
        types.contains(&proto::event::Type::ReservationCancelled),
        "{types:?}"
    );
    let messages = nats.read(events.len()).await;
    assert_messages_are(&nats.prefix, &messages, &events);
    assert_eq!(
        nats.count().await,
        events.len() as u64,
        "a duplicate in the stream"
    );
    replica.stop().await;
}

/// The sink on its own, in the protobuf format: a batch read from a coordinator's log is
/// published and acknowledged whole, each message decodes to its event; the same batch again
/// is taken (acknowledged as duplicates) and the stream still holds each event once.
#[sqlx::test(migrations = false)]
async fn a_batch_published_twice_is_held_once(pool: PgPool) {
    let nats = TestStream::on(NATS_URL).await;
    let stock = stock(&pool).await;
    let mut replica = Replica::start(&pool, &stock, Vec::new()).await;
    let cancelled = script(&mut replica.client, "batch").await;
    let events = log_through(&pool, &cancelled, proto::event::Type::ReservationCancelled).await;
    let mut settings = nats.settings();
    settings.format = EventFormat::Protobuf;
    let sink = NatsSink::connect(settings).await.unwrap();
    for round in 0..2 {
        let delivered = deliver_when_connected(&sink, &events).await;
        assert_eq!(
            delivered.delivered,
            events.len(),
            "round {round}: {delivered:?}"
        );
        assert!(delivered.error.is_none(), "round {round}: {delivered:?}");
    }
    assert_eq!(nats.count().await, events.len() as u64);
    for (message, event) in nats.read(events.len()).await.iter().zip(&events) {
        let decoded: proto::Event = prost::Message::decode(message.payload.as_ref()).unwrap();
        assert_eq!(&decoded, event);
    }
    replica.stop().await;
}

/// `sink.deliver(events)`, retried while the sink is still connecting in the background.
async fn deliver_when_connected(
    sink: &NatsSink,
    events: &[proto::Event],
) -> holdfast::sinks::Delivered {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let delivered = sink.deliver(events).await;
        let connecting = delivered
            .error
            .as_ref()
            .is_some_and(|e| e.0.starts_with("not connected"));
        if !connecting || Instant::now() >= deadline {
            return delivered;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The failpoint `sinks.nats.acked` for one sink (by its subject prefix), removed on drop.
struct AckedButLost;

impl AckedButLost {
    fn arm(prefix: &str) -> AckedButLost {
        fail::cfg("sinks.nats.acked", &format!("return({prefix})")).unwrap();
        AckedButLost
    }
}

impl Drop for AckedButLost {
    fn drop(&mut self) {
        fail::remove("sinks.nats.acked");
    }
}

/// A coordinator that stops after JetStream acknowledged its events and before it wrote its
/// cursor re-publishes them after its restart; a consumer sees each once, none missing. Its
/// lease given up at the stop, the restarted one takes the sink at once.
#[sqlx::test(migrations = false)]
async fn events_acknowledged_before_a_stop_are_not_duplicated_after_the_restart(pool: PgPool) {
    acknowledged_then_stopped(&pool, Db::Postgres(pool.clone())).await;
}

/// The same with the coordinator's log on SQLite.
#[sqlx::test(migrations = false)]
async fn on_sqlite_events_acknowledged_before_a_stop_are_not_duplicated_after_the_restart(
    pool: PgPool,
) {
    acknowledged_then_stopped(&pool, Db::sqlite()).await;
}

/// The failpoint is the process's: one test arms it at a time.
static ACKED_FAILPOINT: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn acknowledged_then_stopped(pool: &PgPool, db: Db) {
    let _alone = ACKED_FAILPOINT.lock().await;
    let nats = TestStream::on(NATS_URL).await;
    let stock = stock(pool).await;
    let lost = AckedButLost::arm(&nats.prefix);
    let mut first = Replica::start_on(db.store().await, &stock, vec![nats.sink().await]).await;
    let cancelled = script(&mut first.client, "crash").await;
    let log = db.log().await;
    let events = log_of_through(&*log, &cancelled, proto::event::Type::ReservationCancelled).await;
    nats.wait_count(events.len() as u64).await;
    // The failure is recorded after JetStream acknowledged the last message: awaited, not
    // read once as NATS's count is reached.
    let sink = wait_sink(&mut first, "the failpoint recorded", |s| {
        s.last_error.contains("failpoint")
    })
    .await;
    assert_eq!(sink.delivered_through, 0, "{sink:?}");
    first.stop().await;
    drop(lost);
    // The stopped coordinator gave its lease up: anyone may take the sink at once (this
    // lease runs out as it is taken, so the restarted coordinator takes it next).
    let now = holdfast::store::WorkLease {
        owner: uuid::Uuid::new_v4(),
        duration: Duration::ZERO,
    };
    let taken = log.lease_sink(NATS_SINK_NAME, now).await.unwrap();
    assert!(
        taken.is_some(),
        "a stopped coordinator still holds the sink"
    );
    let mut second = Replica::start_on(db.store().await, &stock, vec![nats.sink().await]).await;
    let latest = events.last().unwrap().sequence;
    wait_delivered_through(&mut second, latest).await;
    assert_eq!(
        nats.count().await,
        events.len() as u64,
        "a duplicate in the stream"
    );
    assert_messages_are(&nats.prefix, &nats.read(events.len()).await, &events);
    second.stop().await;
}

/// A private server's store folder, removed on drop.
struct StoreDir(std::path::PathBuf);

impl StoreDir {
    fn new() -> StoreDir {
        StoreDir(std::env::temp_dir().join(format!("holdfast-nats-{}", uuid::Uuid::new_v4())))
    }
}

impl Drop for StoreDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A nats-server of the test's own, with JetStream, on `port`, storing under `dir`.
struct PrivateNats {
    child: tokio::process::Child,
}

impl PrivateNats {
    async fn start(port: u16, dir: &std::path::Path) -> PrivateNats {
        PrivateNats::start_with(port, dir, &[]).await
    }

    /// [`PrivateNats::start`] with more command-line arguments (TLS).
    async fn start_with(
        port: u16,
        dir: &std::path::Path,
        more: &[&std::ffi::OsStr],
    ) -> PrivateNats {
        let child = tokio::process::Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(dir)
            .args(more)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("nats-server on PATH");
        let deadline = Instant::now() + PATIENCE;
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                Instant::now() < deadline,
                "nats-server did not listen on {port}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        PrivateNats { child }
    }

    async fn stop(mut self) {
        self.child.kill().await.unwrap();
    }
}

/// NATS down for a while: the sink's lag grows and its failure shows in `ListSinks`; NATS back
/// on the same port and store, the backlog drains, every event once and in order.
#[sqlx::test(migrations = false)]
async fn a_backlog_built_while_nats_is_down_drains_when_it_returns(pool: PgPool) {
    backlog_drains(&pool, Db::Postgres(pool.clone())).await;
}

/// The same with the coordinator's log on SQLite.
#[sqlx::test(migrations = false)]
async fn on_sqlite_a_backlog_built_while_nats_is_down_drains_when_it_returns(pool: PgPool) {
    backlog_drains(&pool, Db::sqlite()).await;
}

async fn backlog_drains(pool: &PgPool, db: Db) {
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let dir = StoreDir::new();
    let server = PrivateNats::start(port, &dir.0).await;
    let nats = TestStream::on(&format!("nats://127.0.0.1:{port}")).await;
    let stock = stock(pool).await;
    let mut replica = Replica::start_on(db.store().await, &stock, vec![nats.sink().await]).await;
    let log = db.log().await;
    let before = script(&mut replica.client, "before").await;
    let events = log_of_through(&*log, &before, proto::event::Type::ReservationCancelled).await;
    wait_delivered_through(&mut replica, events.last().unwrap().sequence).await;
    server.stop().await;
    let during = script(&mut replica.client, "during").await;
    let events = log_of_through(&*log, &during, proto::event::Type::ReservationCancelled).await;
    let latest = events.last().unwrap().sequence;
    let behind = wait_lagging(&mut replica, Duration::from_secs(1)).await;
    assert!(behind.delivered_through < latest, "{behind:?}");
    assert!(!behind.last_error.is_empty(), "{behind:?}");
    let server = PrivateNats::start(port, &dir.0).await;
    wait_delivered_through(&mut replica, latest).await;
    assert_eq!(
        nats.count().await,
        events.len() as u64,
        "a duplicate in the stream"
    );
    assert_messages_are(&nats.prefix, &nats.read(events.len()).await, &events);
    replica.stop().await;
    drop(nats);
    server.stop().await;
}

/// `tls://` (SPEC 10): a private nats-server with a certificate of the test's CA. The sink
/// given that CA (`--events-nats-ca`) delivers a scripted run, every event once; a sink
/// trusting only the system roots delivers nothing and says why.
#[sqlx::test(migrations = false)]
async fn a_tls_server_is_trusted_through_the_given_ca_only(pool: PgPool) {
    use crate::tls::pki::{Ca, Files};
    let ca = Ca::new("nats-test-ca");
    let files = Files::new();
    let (cert, key) = files.leaf("nats", &ca.issue("nats"));
    let ca_file = files.ca("ca", &ca);
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let dir = StoreDir::new();
    let tls_args = [
        "--tls".as_ref(),
        "--tlscert".as_ref(),
        cert.as_os_str(),
        "--tlskey".as_ref(),
        key.as_os_str(),
    ];
    let server = PrivateNats::start_with(port, &dir.0, &tls_args).await;
    let url = format!("tls://127.0.0.1:{port}");

    let mut untrusting = NatsSettings::new(url.clone());
    untrusting.timeout = Duration::from_secs(2);
    untrusting.create_stream = true;
    let sink = NatsSink::connect(untrusting).await.unwrap();
    let event = proto::Event {
        sequence: 1,
        event_id: uuid::Uuid::new_v4().to_string(),
        ..Default::default()
    };
    let refused = sink.deliver(std::slice::from_ref(&event)).await;
    assert_eq!(refused.delivered, 0, "delivered to an untrusted server");
    assert!(refused.error.is_some());

    let client = async_nats::ConnectOptions::new()
        .add_root_certificates(ca_file.clone())
        .require_tls(true)
        .connect(url.as_str())
        .await
        .unwrap();
    let unique = uuid::Uuid::new_v4().simple().to_string();
    let nats = TestStream {
        url: url.clone(),
        prefix: format!("test_{unique}"),
        name: format!("TEST_{unique}"),
        jetstream: jetstream::new(client),
    };
    let mut settings = nats.settings();
    settings.ca = Some(ca_file);
    let sink: Arc<dyn Sink> = Arc::new(NatsSink::connect(settings).await.unwrap());
    let stock = stock(&pool).await;
    let mut replica = Replica::start(&pool, &stock, vec![sink]).await;
    let cancelled = script(&mut replica.client, "tls").await;
    let events = log_through(&pool, &cancelled, proto::event::Type::ReservationCancelled).await;
    wait_delivered_through(&mut replica, events.last().unwrap().sequence).await;
    assert_messages_are(&nats.prefix, &nats.read(events.len()).await, &events);
    assert_eq!(nats.count().await, events.len() as u64);
    replica.stop().await;
    drop(nats);
    server.stop().await;
}

/// Waits until `ListSinks` shows the NATS sink failing with a lag of at least `lag`.
async fn wait_lagging(replica: &mut Replica, lag: Duration) -> proto::Sink {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let sink = replica.nats_sink().await;
        if let Some(s) = &sink {
            let shown = s.lag.map_or(0, |d| d.seconds);
            if s.failing_since.is_some() && shown >= lag.as_secs() as i64 {
                return s.clone();
            }
        }
        assert!(Instant::now() < deadline, "no lag shown: {sink:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Settings that cannot work stop the start, naming the flag: a CA file that is not there, a
/// URL that is not NATS's. NATS being down does not (the sink connects in the background).
#[tokio::test]
async fn the_sink_refuses_settings_that_cannot_work_but_not_a_server_that_is_down() {
    let mut missing_ca = NatsSettings::new("tls://127.0.0.1:4222");
    missing_ca.ca = Some("/nonexistent/holdfast-nats-ca.pem".into());
    let refused = NatsSink::connect(missing_ca).await.unwrap_err();
    assert!(matches!(refused, NatsError::Ca { .. }), "{refused}");
    assert!(
        refused.to_string().contains("--events-nats-ca"),
        "{refused}"
    );
    let http = NatsSink::connect(NatsSettings::new("http://127.0.0.1:4222")).await;
    let refused = http.unwrap_err();
    assert!(matches!(refused, NatsError::Config(_)), "{refused}");
    assert!(
        refused.to_string().contains("--events-nats-url"),
        "{refused}"
    );
    let nobody = crate::common::closed_url()
        .await
        .replace("http://", "nats://");
    let sink = NatsSink::connect(NatsSettings::new(nobody)).await.unwrap();
    let event = proto::Event {
        sequence: 1,
        event_id: uuid::Uuid::new_v4().to_string(),
        ..Default::default()
    };
    let delivered = sink.deliver(std::slice::from_ref(&event)).await;
    assert_eq!(delivered.delivered, 0);
    let error: SinkError = delivered.error.expect("why nothing was delivered");
    assert!(error.0.contains("not connected"), "{error}");
}
