//! PostgreSQL restarted under load (issue #16): a private cluster (initdb and pg_ctl from
//! `/usr/lib/postgresql/*/bin`, on a free port, in a temporary folder; as the `postgres`
//! user when the test runs as root, since initdb refuses root) carries the coordinator and
//! the participants while clients Reserve and Confirm; the cluster is restarted
//! (`pg_ctl restart -m immediate`: a crash and WAL recovery, no checkpoint) in the middle.
//! The shared server on 5432, which parallel tests use, is never touched.
//!
//! Then every client learns its outcome by repeating its calls (same request_id, same
//! token) until they are answered, and the checks: every reservation whose Reserve was
//! answered exists with the same id; every Confirm answered with success ended `CONFIRMED`;
//! the stock's confirmed units are exactly those of the `CONFIRMED` reservations and nothing
//! is left held.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use holdfast::proto;
use holdfast::proto::reservation::State;
use sqlx::PgPool;
use tonic::Status;

use crate::stack::{Coordinator, Stack, client};
use crate::workload::retryable;

/// A private PostgreSQL cluster, stopped and deleted on drop.
pub struct Cluster {
    bin: PathBuf,
    dir: PathBuf,
    pub port: u16,
}

fn root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// `program args` as the `postgres` user when running as root (initdb refuses root).
fn as_postgres(program: &Path, args: &[&str]) -> Result<(), String> {
    let mut cmd = if root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    };
    // Output to a file, not a pipe: the server pg_ctl starts inherits its stdout and stderr,
    // and a pipe would stay open (and the read of it wait) as long as the server runs.
    let log = std::env::temp_dir().join(format!(
        "holdfast-pg-cmd-{}.log",
        uuid::Uuid::new_v4().simple()
    ));
    let file = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = file
        .try_clone()
        .map_err(|e| format!("{}: {e}", log.display()))?;
    let status = cmd
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(file)
        .stderr(err)
        .status()
        .map_err(|e| format!("{}: {e}", program.display()));
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    match status? {
        s if s.success() => Ok(()),
        s => Err(format!("{} {args:?}: {s}\n{said}", program.display())),
    }
}

impl Cluster {
    /// The newest installed PostgreSQL's bin folder.
    fn bin() -> Option<PathBuf> {
        let mut bins: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|b| b.join("initdb").exists() && b.join("pg_ctl").exists())
            .collect();
        bins.sort_by_key(|b| {
            b.parent()
                .and_then(|v| v.file_name())
                .and_then(|v| v.to_str())
                .and_then(|v| v.parse::<u32>().ok())
                .unwrap_or(0)
        });
        bins.pop()
    }

    /// initdb and start; `Err` says why it cannot (no PostgreSQL binaries, no `postgres`
    /// user to run them as root).
    pub fn start() -> Result<Cluster, String> {
        let bin = Cluster::bin().ok_or("no /usr/lib/postgresql/*/bin/initdb")?;
        let dir =
            std::env::temp_dir().join(format!("holdfast-pg-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        if root() {
            let out = Command::new("chown")
                .args(["postgres:postgres"])
                .arg(&dir)
                .output()
                .map_err(|e| format!("chown: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "chown postgres {}: {}",
                    dir.display(),
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("a free port: {e}"))?
            .port();
        let cluster = Cluster { bin, dir, port };
        let data = cluster.data();
        // -N: no fsync while creating the cluster (its contents are disposable); the
        // server itself runs with fsync on, which the restart relies on.
        as_postgres(
            &cluster.bin.join("initdb"),
            &["-D", &data, "-A", "trust", "-U", "postgres", "-N"],
        )?;
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=60",
            cluster.port,
            cluster.dir.display()
        );
        let log = cluster.dir.join("server.log");
        as_postgres(
            &cluster.bin.join("pg_ctl"),
            &[
                "-D",
                &data,
                "-l",
                &log.display().to_string(),
                "-o",
                &options,
                "-w",
                "start",
            ],
        )?;
        Ok(cluster)
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// A crash and restart: immediate shutdown (no checkpoint), then start (WAL recovery).
    pub fn restart(&self) -> Result<(), String> {
        as_postgres(
            &self.bin.join("pg_ctl"),
            &["-D", &self.data(), "-m", "immediate", "-w", "restart"],
        )
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = as_postgres(
            &self.bin.join("pg_ctl"),
            &["-D", &self.data(), "-m", "immediate", "-w", "stop"],
        );
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One client's Reserve and Confirm, with the answers it got under load.
struct Attempt {
    request: proto::ReserveRequest,
    reserved: Option<Result<proto::Reservation, Status>>,
    confirmed: Option<Result<proto::Reservation, Status>>,
}

const ITEM: &str = "pg-item";
const CAPACITY: i64 = 100_000;

async fn client_loop(
    addr: std::net::SocketAddr,
    who: usize,
    stop: Arc<AtomicBool>,
    out: Arc<Mutex<Vec<Attempt>>>,
) {
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        let request = proto::ReserveRequest {
            request_id: format!("pg-{who}-{n}"),
            holder: format!("pg-holder-{who}"),
            ttl: Some(prost_types::Duration {
                seconds: 60,
                nanos: 0,
            }),
            holds: vec![proto::Hold {
                participant: "stock".into(),
                resource: ITEM.into(),
                quantity: 1,
                during: None,
            }],
            labels: Default::default(),
            queue: None,
        };
        let Some(mut c) = client(addr).await else {
            break;
        };
        let reserved = c.reserve(request.clone()).await.map(|r| r.into_inner());
        let confirmed = match &reserved {
            Ok(r) if !r.hold_token.is_empty() => Some(
                c.confirm(proto::ConfirmRequest {
                    reservation_id: r.id.clone(),
                    hold_token: r.hold_token.clone(),
                    payment: None,
                })
                .await
                .map(|r| r.into_inner()),
            ),
            _ => None,
        };
        let failed = reserved.is_err() || matches!(confirmed, Some(Err(_)));
        out.lock().unwrap_or_else(|e| e.into_inner()).push(Attempt {
            request,
            reserved: Some(reserved),
            confirmed,
        });
        // While the database is down, a calmer pace (a client backing off).
        tokio::time::sleep(Duration::from_millis(if failed { 200 } else { 10 })).await;
    }
}

/// Repeats `call` until its answer is not retryable, within `deadline`.
async fn learn<F, Fut>(deadline: Instant, what: &str, call: F) -> Result<proto::Reservation, Status>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<proto::Reservation, Status>>,
{
    loop {
        let answer = call().await;
        match answer {
            Err(s) if retryable(&s) && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(s) if retryable(&s) => {
                panic!("{what}: still no answer at the deadline, last {s:?}")
            }
            done => return done,
        }
    }
}

pub async fn restart_under_load() {
    let cluster = match Cluster::start() {
        Ok(c) => c,
        Err(why) => {
            eprintln!("faults: SKIPPED postgres restart under load: {why}");
            return;
        }
    };
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&cluster.url())
        .await
        .expect("the private cluster");
    run(Arc::new(cluster), pool).await;
}

async fn run(cluster: Arc<Cluster>, pool: PgPool) {
    let stack = Stack::start(pool).await;
    stack.put("stock", &[(ITEM.to_owned(), CAPACITY)]).await;
    let coordinator =
        Coordinator::start(&stack.pool, stack.settings(false), &stack.events.url).await;
    let stop = Arc::new(AtomicBool::new(false));
    let attempts: Arc<Mutex<Vec<Attempt>>> = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..6)
        .map(|who| {
            tokio::spawn(client_loop(
                coordinator.addr,
                who,
                stop.clone(),
                attempts.clone(),
            ))
        })
        .collect();
    // Load flowing first (answers before the restart), then the restart mid-flow.
    let deadline = Instant::now() + Duration::from_secs(30);
    while attempts.lock().unwrap_or_else(|e| e.into_inner()).len() < 30 {
        assert!(Instant::now() < deadline, "no load before the restart");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = attempts.lock().unwrap_or_else(|e| e.into_inner()).len();
    let restarting = Instant::now();
    let restarted = cluster.clone();
    tokio::task::spawn_blocking(move || restarted.restart())
        .await
        .expect("the restart task")
        .unwrap_or_else(|e| panic!("restarting the cluster: {e}"));
    let down_for = restarting.elapsed();
    // Load after the restart: until 30 more attempts went through.
    let after_restart = attempts.lock().unwrap_or_else(|e| e.into_inner()).len();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ok = attempts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .skip(after_restart)
            .filter(|a| matches!(a.confirmed, Some(Ok(_))))
            .count();
        if ok >= 30 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the load did not recover after the restart ({ok} confirmed since)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        let _ = c.await;
    }
    let attempts = std::mem::take(&mut *attempts.lock().unwrap_or_else(|e| e.into_inner()));

    // Every client learns its outcome by repeating its calls.
    let addr = coordinator.addr;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut confirmed_ids = Vec::new();
    let (mut unanswered, mut learned) = (0, 0);
    for a in &attempts {
        let reserved = learn(deadline, "Reserve", || {
            let request = a.request.clone();
            async move {
                let mut c = client(addr)
                    .await
                    .ok_or_else(|| Status::unavailable("no client"))?;
                c.reserve(request).await.map(|r| r.into_inner())
            }
        })
        .await;
        if let Some(Ok(first)) = &a.reserved {
            let again = reserved.as_ref().unwrap_or_else(|e| {
                panic!(
                    "{}: answered {first:?}, repeated {e:?}",
                    a.request.request_id
                )
            });
            assert_eq!(
                (&again.id, &again.hold_token),
                (&first.id, &first.hold_token),
                "a decided Reserve did not survive"
            );
        }
        let Ok(r) = reserved else { continue };
        let needs_answer = !matches!(&a.confirmed, Some(Ok(_)));
        if needs_answer {
            unanswered += 1;
        }
        if r.hold_token.is_empty() {
            continue;
        }
        let confirmed = learn(deadline, "Confirm", || {
            let (id, token) = (r.id.clone(), r.hold_token.clone());
            async move {
                let mut c = client(addr)
                    .await
                    .ok_or_else(|| Status::unavailable("no client"))?;
                c.confirm(proto::ConfirmRequest {
                    reservation_id: id,
                    hold_token: token,
                    payment: None,
                })
                .await
                .map(|r| r.into_inner())
            }
        })
        .await;
        if needs_answer {
            learned += 1;
        }
        if let Some(Ok(_)) = &a.confirmed {
            assert!(
                confirmed.is_ok(),
                "{}: a Confirm answered success, repeated {confirmed:?}",
                r.id
            );
        }
        if confirmed.is_ok() {
            confirmed_ids.push(r.id.clone());
        }
    }

    // Quiescence, then: every confirmed reservation CONFIRMED, the units agree.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let open: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM reservations WHERE state IN ('TRYING', 'HELD', 'CONFIRMING', 'CANCELLING')",
        )
        .fetch_one(&stack.pool)
        .await
        .unwrap_or(-1);
        if open == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{open} reservations still open 60 s after the load"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut c = client(addr).await.expect("client");
    for id in &confirmed_ids {
        let r = c
            .get_reservation(proto::GetReservationRequest {
                reservation_id: id.clone(),
            })
            .await
            .unwrap_or_else(|e| panic!("GetReservation {id}: {e}"))
            .into_inner();
        assert_eq!(State::try_from(r.state), Ok(State::Confirmed), "{r:?}");
    }
    let confirmed_in_db: i64 =
        sqlx::query_scalar("SELECT count(*) FROM reservations WHERE state = 'CONFIRMED'")
            .fetch_one(&stack.pool)
            .await
            .expect("count");
    let s = stack.resource("stock", ITEM).await;
    assert_eq!(s.held, 0, "{s:?}");
    assert_eq!(s.available + s.held + s.confirmed, CAPACITY, "{s:?}");
    assert_eq!(
        s.confirmed, confirmed_in_db,
        "units confirmed at the participant vs CONFIRMED reservations: {s:?}"
    );
    assert_eq!(
        confirmed_in_db as usize,
        confirmed_ids.len(),
        "CONFIRMED reservations vs Confirms the clients saw succeed (first or repeated)"
    );
    eprintln!(
        "faults: postgres restart under load: {} attempts ({before} before the restart), restart took {down_for:.1?}, \
         {unanswered} without a success answer under load, {learned} of them confirmed by repeating, {} CONFIRMED, all surviving",
        attempts.len(),
        confirmed_ids.len()
    );
    drop(coordinator);
    stack.stop().await;
}
