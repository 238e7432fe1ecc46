//! The split roles as an operator deploys them: `holdfast coordinator` and one
//! `holdfast participant <kind>` process each for seats and stock, every one on a PostgreSQL
//! database of its own, configured by flags and `HOLDFAST_PARTICIPANTS`. Clients keep
//! reserving, confirming and cancelling while a participant is SIGKILLed and restarted, while
//! the coordinator is SIGKILLed and restarted, and while the coordinator's database
//! connections are terminated (`pg_terminate_backend`). Afterwards every reservation reaches a
//! terminal state, nothing stays held at the participants, what each participant confirmed is
//! exactly what the coordinator says was confirmed, and no answered decision was lost.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use holdfast::proto;
use holdfast::proto::coordinator_client::CoordinatorClient;
use holdfast::proto::reservation::State;
use tonic::Code;
use tonic::transport::Channel;

use super::{Holdfast, TempDatabase, admin, holdfast_command, listen_addr, server_url};
use crate::common::{Decide, proto_duration, put_resources_request, state_of};

/// Concurrent clients.
const WORKERS: usize = 4;
/// Seats provisioned (one unit each); reservations take them in turn, wrapping around.
const SEATS: usize = 200;
/// Mugs provisioned at the stock participant; each reservation takes one.
const MUGS: i64 = 10_000;
/// How long one client operation may keep being repeated before the test gives up.
const OP_DEADLINE: Duration = Duration::from_secs(90);
/// How long everything may take to settle after the flow stops.
const SETTLE: Duration = Duration::from_secs(120);

/// The deployment: three databases, three processes, their addresses.
struct Split {
    coordinator_db: TempDatabase,
    /// Kept so the database lives as long as the deployment.
    _seats_db: TempDatabase,
    stock_db: TempDatabase,
    coordinator_addr: SocketAddr,
    seats_addr: SocketAddr,
    stock_addr: SocketAddr,
    secret: PathBuf,
    log_dir: PathBuf,
    coordinator: Holdfast,
    seats: Holdfast,
    stock: Holdfast,
}

impl Split {
    async fn start(slot: u8) -> Split {
        let coordinator_addr = listen_addr(slot);
        // listen_addr checked 50061..=50065 are free on this test's own loopback IP.
        let seats_addr = SocketAddr::new(coordinator_addr.ip(), 50061);
        let stock_addr = SocketAddr::new(coordinator_addr.ip(), 50062);
        let log_dir =
            std::env::temp_dir().join(format!("holdfast-split-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&log_dir).expect("log folder");
        // The same token key across coordinator restarts, so hold tokens stay valid.
        let secret = log_dir.join("token-secret.toml");
        let key: String = (0..32).map(|_| format!("{:02x}", rand_byte())).collect();
        std::fs::write(
            &secret,
            format!("current = \"k1\"\n\n[[key]]\nid = \"k1\"\nsecret = \"{key}\"\n"),
        )
        .expect("write the token secret");
        let (coordinator_db, seats_db, stock_db) = (
            TempDatabase::create().await,
            TempDatabase::create().await,
            TempDatabase::create().await,
        );
        let seats = start_participant("seats", &seats_db.url, seats_addr, &log_dir);
        let stock = start_participant("stock", &stock_db.url, stock_addr, &log_dir);
        let coordinator = start_coordinator(
            &coordinator_db.url,
            coordinator_addr,
            &[("seats", seats_addr), ("stock", stock_addr)],
            &secret,
            &log_dir,
        );
        let mut split = Split {
            coordinator_db,
            _seats_db: seats_db,
            stock_db,
            coordinator_addr,
            seats_addr,
            stock_addr,
            secret,
            log_dir,
            coordinator,
            seats,
            stock,
        };
        split
            .seats
            .wait_serving(seats_addr, "tcc.v1.Participant")
            .await;
        split
            .stock
            .wait_serving(stock_addr, "tcc.v1.Participant")
            .await;
        split
            .coordinator
            .wait_serving(coordinator_addr, "tcc.v1.Coordinator")
            .await;
        let seats: Vec<(String, i64)> = (0..SEATS).map(|i| (seat(i), 1)).collect();
        let seats: Vec<(&str, i64)> = seats.iter().map(|(s, n)| (s.as_str(), *n)).collect();
        admin(seats_addr)
            .await
            .put_resources(put_resources_request(&seats))
            .await
            .expect("provision seats");
        admin(stock_addr)
            .await
            .put_resources(put_resources_request(&[("mug", MUGS)]))
            .await
            .expect("provision mugs");
        split
    }

    async fn restart_coordinator(&mut self) {
        self.coordinator = start_coordinator(
            &self.coordinator_db.url,
            self.coordinator_addr,
            &[("seats", self.seats_addr), ("stock", self.stock_addr)],
            &self.secret,
            &self.log_dir,
        );
        self.coordinator
            .wait_serving(self.coordinator_addr, "tcc.v1.Coordinator")
            .await;
    }

    async fn restart_stock(&mut self) {
        self.stock = start_participant("stock", &self.stock_db.url, self.stock_addr, &self.log_dir);
        self.stock
            .wait_serving(self.stock_addr, "tcc.v1.Participant")
            .await;
    }

    fn client(&self) -> CoordinatorClient<Channel> {
        CoordinatorClient::new(
            Channel::from_shared(format!("http://{}", self.coordinator_addr))
                .expect("coordinator url")
                .connect_timeout(Duration::from_secs(2))
                .timeout(Duration::from_secs(10))
                .connect_lazy(),
        )
    }
}

impl Drop for Split {
    fn drop(&mut self) {
        self.coordinator.kill();
        self.seats.kill();
        self.stock.kill();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.log_dir);
        }
    }
}

fn rand_byte() -> u8 {
    uuid::Uuid::new_v4().as_bytes()[0]
}

fn seat(i: usize) -> String {
    format!("S{}", i % SEATS)
}

fn start_participant(kind: &str, url: &str, addr: SocketAddr, logs: &std::path::Path) -> Holdfast {
    let mut cmd = holdfast_command();
    cmd.args(["participant", kind, "--listen", &addr.to_string()])
        .args(["--database-url", url])
        .env("RUST_LOG", "info");
    Holdfast::spawn(cmd, logs.join(format!("{kind}.log")))
}

/// The coordinator with a lease short enough for recovery to take over within the test:
/// participant calls 1 s, requests 3 s, so the lease must be at least 5 s.
fn start_coordinator(
    url: &str,
    addr: SocketAddr,
    participants: &[(&str, SocketAddr)],
    secret: &std::path::Path,
    logs: &std::path::Path,
) -> Holdfast {
    let registry = participants
        .iter()
        .map(|(name, addr)| format!("{name}=http://{addr}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut cmd = holdfast_command();
    cmd.args(["coordinator", "--listen", &addr.to_string()])
        .args(["--database-url", url, "--metrics-listen", "off"])
        .args(["--http-listen", "off"])
        .args(["--participant-timeout", "1s", "--request-timeout", "3s"])
        .args(["--lease", "6s", "--retry-cap", "1s"])
        .arg("--token-secret-file")
        .arg(secret)
        .env("HOLDFAST_PARTICIPANTS", registry)
        .env("RUST_LOG", "info");
    Holdfast::spawn(cmd, logs.join("coordinator.log"))
}

/// What the clients were told.
#[derive(Default)]
struct Answers {
    /// Every reservation id a Reserve answered with.
    reserved: BTreeSet<String>,
    /// Reservations whose Confirm was answered OK (so they must end CONFIRMED).
    confirmed: BTreeSet<String>,
    /// Reservations whose Cancel was answered OK (so they must not end CONFIRMED).
    cancelled: BTreeSet<String>,
    /// Reservation id -> the seat it asked for.
    seat_of: BTreeMap<String, String>,
    /// Codes that were repeated, for the report.
    repeated: BTreeMap<String, usize>,
}

/// A failure the client may repeat the same request after: the server was down, restarting,
/// or its database connection went.
fn repeatable(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::DeadlineExceeded | Code::Unknown | Code::Cancelled
    )
}

/// Runs `call` until it answers something other than a repeatable failure, or panics after
/// [`OP_DEADLINE`] with the last failure.
async fn repeat<T, F, Fut>(
    answers: &Mutex<Answers>,
    what: &str,
    mut call: F,
) -> Result<T, tonic::Status>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let deadline = Instant::now() + OP_DEADLINE;
    loop {
        match call().await {
            Err(status) if repeatable(&status) => {
                *answers
                    .lock()
                    .unwrap()
                    .repeated
                    .entry(format!("{what} {:?}", status.code()))
                    .or_default() += 1;
                assert!(
                    Instant::now() < deadline,
                    "{what} still failing after {OP_DEADLINE:?}: {status:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => return other,
        }
    }
}

/// One client: reserve a seat and a mug, then confirm (even) or cancel (odd), until `stop`.
async fn worker(
    id: usize,
    client: CoordinatorClient<Channel>,
    next: Arc<AtomicUsize>,
    done: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    answers: Arc<Mutex<Answers>>,
) {
    while !stop.load(Ordering::SeqCst) {
        let n = next.fetch_add(1, Ordering::SeqCst);
        let seat = seat(n);
        let request = proto::ReserveRequest {
            request_id: format!("r-{n}"),
            holder: format!("h-{id}-{n}"),
            ttl: Some(proto_duration(Duration::from_secs(4))),
            holds: vec![
                crate::common::hold("seats", &seat),
                crate::common::hold("stock", "mug"),
            ],
            labels: Default::default(),
            queue: None,
        };
        let reserved = repeat(&answers, "Reserve", || {
            let mut client = client.clone();
            let request = request.clone();
            async move { client.reserve(request).await.map(|r| r.into_inner()) }
        })
        .await;
        let r = match reserved {
            Ok(r) => r,
            // A refusal (a seat taken, a limit) is an answer too.
            Err(_) => {
                done.fetch_add(1, Ordering::SeqCst);
                continue;
            }
        };
        {
            let mut a = answers.lock().unwrap();
            a.reserved.insert(r.id.clone());
            a.seat_of.insert(r.id.clone(), seat.clone());
        }
        if state_of(&r) == State::Held {
            let decide = Decide::on(&r);
            if n.is_multiple_of(2) {
                let answer = repeat(&answers, "Confirm", || {
                    let mut client = client.clone();
                    let request = decide.confirm();
                    async move { client.confirm(request).await.map(|r| r.into_inner()) }
                })
                .await;
                if let Ok(c) = answer
                    && matches!(state_of(&c), State::Confirming | State::Confirmed)
                {
                    answers.lock().unwrap().confirmed.insert(r.id.clone());
                }
            } else {
                let answer = repeat(&answers, "Cancel", || {
                    let mut client = client.clone();
                    let request = decide.cancel();
                    async move { client.cancel(request).await.map(|r| r.into_inner()) }
                })
                .await;
                if let Ok(c) = answer
                    && matches!(state_of(&c), State::Cancelling | State::Cancelled)
                {
                    answers.lock().unwrap().cancelled.insert(r.id.clone());
                }
            }
        }
        done.fetch_add(1, Ordering::SeqCst);
    }
}

/// The client flow, running until [`Flow::finish`].
struct Flow {
    done: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    answers: Arc<Mutex<Answers>>,
    workers: Vec<tokio::task::JoinHandle<()>>,
}

impl Flow {
    fn start(split: &Split) -> Flow {
        let next = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let answers = Arc::new(Mutex::new(Answers::default()));
        let workers = (0..WORKERS)
            .map(|id| {
                tokio::spawn(worker(
                    id,
                    split.client(),
                    next.clone(),
                    done.clone(),
                    stop.clone(),
                    answers.clone(),
                ))
            })
            .collect();
        Flow {
            done,
            stop,
            answers,
            workers,
        }
    }

    /// Waits until `more` further client operations were answered (fails after a deadline).
    async fn answered(&self, more: usize) {
        let target = self.done.load(Ordering::SeqCst) + more;
        let deadline = Instant::now() + OP_DEADLINE;
        loop {
            let now = self.done.load(Ordering::SeqCst);
            if now >= target {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "only {now} of {target} client operations answered after {OP_DEADLINE:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn finish(self) -> Answers {
        self.stop.store(true, Ordering::SeqCst);
        for w in self.workers {
            w.await.expect("a client task panicked");
        }
        Arc::try_unwrap(self.answers)
            .ok()
            .expect("answers still shared")
            .into_inner()
            .unwrap()
    }
}

/// Every reservation the coordinator has.
async fn all_reservations(client: &mut CoordinatorClient<Channel>) -> Vec<proto::Reservation> {
    let mut out = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_reservations(proto::ListReservationsRequest {
                holder: String::new(),
                state: 0,
                page_size: 500,
                page_token: page_token.clone(),
                ..Default::default()
            })
            .await
            .expect("ListReservations")
            .into_inner();
        out.extend(page.reservations);
        if page.next_page_token.is_empty() {
            return out;
        }
        page_token = page.next_page_token;
    }
}

fn terminal(s: State) -> bool {
    matches!(
        s,
        State::Confirmed | State::Cancelled | State::Expired | State::Rejected | State::Failed
    )
}

/// (available, held, confirmed) of `resource`, with capacity checked to be what was provisioned.
async fn resource(
    admin: &mut proto::resource_admin_client::ResourceAdminClient<Channel>,
    resource: &str,
    capacity: i64,
) -> Result<(i64, i64, i64), String> {
    let s = admin
        .get_resource(proto::GetResourceRequest {
            resource: resource.to_owned(),
        })
        .await
        .map_err(|e| format!("GetResource {resource}: {e:?}"))?
        .into_inner();
    if s.capacity != capacity || s.available + s.held + s.confirmed != capacity {
        return Err(format!("{resource} does not add up to {capacity}: {s:?}"));
    }
    Ok((s.available, s.held, s.confirmed))
}

/// What the coordinator and the participants say once everything settled, checked against
/// each other and against what the clients were told.
async fn check_settled(split: &Split, answers: &Answers) {
    let mut client = split.client();
    let mut seats = admin(split.seats_addr).await;
    let mut stock = admin(split.stock_addr).await;
    let deadline = Instant::now() + SETTLE;
    let last = loop {
        let all = all_reservations(&mut client).await;
        let unsettled: Vec<String> = all
            .iter()
            .filter(|r| !terminal(state_of(r)))
            .map(|r| format!("{} {:?}", r.id, state_of(r)))
            .collect();
        let mugs = resource(&mut stock, "mug", MUGS).await;
        let held_mugs = mugs.as_ref().map(|m| m.1).unwrap_or(-1);
        let mut held_seats = 0;
        for i in 0..SEATS {
            held_seats += resource(&mut seats, &seat(i), 1)
                .await
                .map(|s| s.1)
                .unwrap_or(1);
        }
        if unsettled.is_empty() && held_mugs == 0 && held_seats == 0 {
            break all;
        }
        assert!(
            Instant::now() < deadline,
            "not settled after {SETTLE:?}: unsettled reservations {unsettled:?}, mugs {mugs:?}, \
             seats held {held_seats}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };

    eprintln!(
        "{} reservations, {} answered, {} confirmed, {} cancelled; repeated: {:?}",
        last.len(),
        answers.reserved.len(),
        answers.confirmed.len(),
        answers.cancelled.len(),
        answers.repeated
    );
    let by_id: BTreeMap<&str, &proto::Reservation> =
        last.iter().map(|r| (r.id.as_str(), r)).collect();
    // Nothing a client was answered is lost.
    for id in &answers.reserved {
        assert!(
            by_id.contains_key(id.as_str()),
            "reservation {id} was answered, then lost"
        );
    }
    for id in &answers.confirmed {
        let r = by_id[id.as_str()];
        assert_eq!(
            state_of(r),
            State::Confirmed,
            "Confirm answered OK, then: {r:?}"
        );
    }
    for id in &answers.cancelled {
        let r = by_id[id.as_str()];
        assert_eq!(
            state_of(r),
            State::Cancelled,
            "Cancel answered OK, then: {r:?}"
        );
    }
    assert!(
        last.iter().all(|r| state_of(r) != State::Failed),
        "a hold was lost: {last:?}"
    );

    // What the coordinator says was confirmed is exactly what the participants confirmed.
    let confirmed: Vec<&proto::Reservation> = last
        .iter()
        .filter(|r| state_of(r) == State::Confirmed)
        .collect();
    let (available, held, sold) = resource(&mut stock, "mug", MUGS).await.unwrap();
    assert_eq!(
        (available, held, sold),
        (MUGS - confirmed.len() as i64, 0, confirmed.len() as i64),
        "mugs vs {} CONFIRMED reservations",
        confirmed.len()
    );
    let mut sold_seats = BTreeSet::new();
    for i in 0..SEATS {
        let (_, held, sold) = resource(&mut seats, &seat(i), 1).await.unwrap();
        assert_eq!(held, 0, "{} still held", seat(i));
        if sold == 1 {
            sold_seats.insert(seat(i));
        }
    }
    let mut confirmed_seats = BTreeSet::new();
    for r in &confirmed {
        let seat = r
            .branches
            .iter()
            .find(|b| b.participant == "seats")
            .map(|b| b.resource.clone())
            .expect("a seats branch");
        assert!(
            confirmed_seats.insert(seat.clone()),
            "{seat} confirmed twice"
        );
    }
    assert_eq!(
        sold_seats, confirmed_seats,
        "seats sold vs CONFIRMED reservations"
    );
    assert!(
        !answers.confirmed.is_empty() && !answers.cancelled.is_empty(),
        "the flow confirmed and cancelled nothing: {} reserved",
        answers.reserved.len()
    );
}

/// Reserves `n` reservations (a seat beyond the flow's and a mug each) held for a minute.
async fn park(split: &Split, n: usize) -> Vec<proto::Reservation> {
    let mut client = split.client();
    let mut held = Vec::new();
    for i in 0..n {
        let r = client
            .reserve(proto::ReserveRequest {
                request_id: format!("parked-{i}"),
                holder: format!("parked-{i}"),
                ttl: Some(proto_duration(Duration::from_secs(60))),
                holds: vec![
                    crate::common::hold("seats", &seat(SEATS - 1 - i)),
                    crate::common::hold("stock", "mug"),
                ],
                labels: Default::default(),
                queue: None,
            })
            .await
            .expect("reserve a parked reservation")
            .into_inner();
        assert_eq!(state_of(&r), State::Held, "{r:?}");
        held.push(r);
    }
    held
}

/// A participant SIGKILLed while Reserves, Confirms and Cancels flow through it, then restarted.
/// Reservations decided while it is down (half confirmed, half cancelled) cannot finish until
/// it is back: recovery must drive them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_processes_stay_consistent_across_a_participant_sigkill() {
    let mut split = Split::start(13).await;
    let parked = park(&split, 4).await;
    let flow = Flow::start(&split);
    flow.answered(12).await;
    split.stock.kill();
    // Down while the flow runs: the clients' next operations meet it gone.
    let mut client = split.client();
    let mut decided = Vec::new();
    for (i, r) in parked.iter().enumerate() {
        let confirm = i % 2 == 0;
        let answer = if confirm {
            client.confirm(Decide::on(r).confirm()).await
        } else {
            client.cancel(Decide::on(r).cancel()).await
        };
        decided.push((r.id.clone(), confirm, answer.map(|a| a.into_inner())));
    }
    let mut unfinished = 0;
    for (id, _, _) in &decided {
        let now = client
            .get_reservation(proto::GetReservationRequest {
                reservation_id: id.clone(),
            })
            .await
            .expect("get a parked reservation")
            .into_inner();
        unfinished += usize::from(!terminal(state_of(&now)));
    }
    assert!(
        unfinished > 0,
        "every decision finished with its participant down: {decided:?}"
    );
    flow.answered(4).await;
    split.restart_stock().await;
    flow.answered(12).await;
    let mut answers = flow.finish().await;
    for (id, confirm, answer) in decided {
        answers.reserved.insert(id.clone());
        if let Ok(r) = answer {
            let state = state_of(&r);
            if confirm && matches!(state, State::Confirming | State::Confirmed) {
                answers.confirmed.insert(id);
            } else if !confirm && matches!(state, State::Cancelling | State::Cancelled) {
                answers.cancelled.insert(id);
            }
        }
    }
    check_settled(&split, &answers).await;
}

/// The coordinator SIGKILLed mid-flight and restarted on the same database and address: the
/// clients repeat what failed, recovery takes over what it left after the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_processes_stay_consistent_across_a_coordinator_sigkill() {
    let mut split = Split::start(14).await;
    let flow = Flow::start(&split);
    flow.answered(12).await;
    split.coordinator.kill();
    split.restart_coordinator().await;
    flow.answered(12).await;
    let answers = flow.finish().await;
    assert!(
        answers
            .repeated
            .keys()
            .any(|k| k.contains("Unavailable") || k.contains("Unknown") || k.contains("Cancelled")),
        "no client saw the coordinator go: {:?}",
        answers.repeated
    );
    check_settled(&split, &answers).await;
}

/// The coordinator's database connections terminated under it, three times mid-flight: it
/// keeps serving (clients get an answer or repeat), and no answered decision is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_coordinator_recovers_when_its_database_connections_are_terminated() {
    let mut split = Split::start(15).await;
    let name = split
        .coordinator_db
        .url
        .rsplit('/')
        .next()
        .unwrap()
        .split('?')
        .next()
        .unwrap()
        .to_owned();
    let admin_pool = sqlx::PgPool::connect(&server_url())
        .await
        .expect("connect as admin");
    let flow = Flow::start(&split);
    let mut terminated = 0;
    for _ in 0..3 {
        flow.answered(8).await;
        let (n,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = $1 AND pid <> pg_backend_pid()) t",
        )
        .bind(&name)
        .fetch_one(&admin_pool)
        .await
        .expect("pg_terminate_backend");
        terminated += n;
    }
    flow.answered(12).await;
    let answers = flow.finish().await;
    split.coordinator.assert_alive();
    assert!(terminated > 0, "no coordinator connection was terminated");
    check_settled(&split, &answers).await;
    split.coordinator.assert_alive();
    admin_pool.close().await;
}
