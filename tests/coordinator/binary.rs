//! The real `holdfast` binary, all-in-one (no subcommand), against a fresh database: it
//! serves, reserves across two participants, confirms, and after a SIGKILL and a restart the
//! reservation and the participants' counts are as they were.

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use holdfast::proto;
use holdfast::proto::coordinator_client::CoordinatorClient;
use holdfast::proto::reservation::State;
use holdfast::proto::resource_admin_client::ResourceAdminClient;
use sqlx::migrate::MigrateDatabase;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::common::state_of;

/// How long the binary may take to start serving.
const STARTUP: Duration = Duration::from_secs(60);

fn server_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// `url` with its database name replaced by `name` (query parameters kept).
fn with_database(url: &str, name: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((head, query)) => (head, format!("?{query}")),
        None => (url, String::new()),
    };
    let authority_start = head.find("://").map_or(0, |i| i + 3);
    let base = match head[authority_start..].find('/') {
        Some(i) => &head[..authority_start + i],
        None => head,
    };
    format!("{base}/{name}{query}")
}

/// A database created for one test and dropped (best effort) when the guard goes, even if the
/// test panicked.
pub(crate) struct TempDatabase {
    pub(crate) url: String,
}

impl TempDatabase {
    pub(crate) async fn create() -> TempDatabase {
        let name = format!("holdfast_e2e_bin_{}", uuid::Uuid::new_v4().simple());
        let url = with_database(&server_url(), &name);
        sqlx::Postgres::create_database(&url)
            .await
            .unwrap_or_else(|e| panic!("create database {name}: {e}"));
        TempDatabase { url }
    }
}

impl Drop for TempDatabase {
    fn drop(&mut self) {
        // Drop runs inside the test's runtime: drop the database from a thread of its own.
        let url = self.url.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(rt) = rt {
                let _ = rt.block_on(sqlx::Postgres::force_drop_database(&url));
            }
        })
        .join();
    }
}

/// A running `holdfast` process; killed (SIGKILL) and reaped when dropped.
pub(crate) struct Holdfast {
    child: Option<Child>,
    log: PathBuf,
}

impl Holdfast {
    pub(crate) fn start(database_url: &str, listen: SocketAddr, log: PathBuf) -> Holdfast {
        Holdfast::start_with(database_url, listen, log, &[])
    }

    /// Starts it with extra environment variables.
    pub(crate) fn start_with(
        database_url: &str,
        listen: SocketAddr,
        log: PathBuf,
        env: &[(&str, &str)],
    ) -> Holdfast {
        let out = File::options()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap_or_else(|e| panic!("open {}: {e}", log.display()));
        let err = out.try_clone().expect("clone the log file handle");
        let child = Command::new(env!("CARGO_BIN_EXE_holdfast"))
            .arg("--listen")
            .arg(listen.to_string())
            .arg("--metrics-listen")
            .arg(format!("{}:9464", listen.ip()))
            .env("DATABASE_URL", database_url)
            // Nothing from the caller's environment may reconfigure the all-in-one.
            .env_remove("HOLDFAST_LISTEN")
            .env_remove("HOLDFAST_PARTICIPANTS")
            .env_remove("HOLDFAST_CONFIG")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("spawn the holdfast binary");
        Holdfast {
            child: Some(child),
            log,
        }
    }

    /// Starts it with no arguments but the addresses and no `DATABASE_URL`, in `dir` as its
    /// working directory: the embedded default, SQLite files under `dir/data`.
    pub(crate) fn start_embedded(
        dir: &std::path::Path,
        listen: SocketAddr,
        log: PathBuf,
    ) -> Holdfast {
        let out = File::options()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap_or_else(|e| panic!("open {}: {e}", log.display()));
        let err = out.try_clone().expect("clone the log file handle");
        let child = embedded_command(dir, listen)
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("spawn the holdfast binary");
        Holdfast {
            child: Some(child),
            log,
        }
    }

    /// SIGKILL: no graceful shutdown, nothing flushed.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Panics with the process's output if it has exited.
    fn assert_alive(&mut self) {
        if let Some(child) = self.child.as_mut()
            && let Ok(Some(status)) = child.try_wait()
        {
            panic!(
                "holdfast exited early ({status}); its output:\n{}",
                self.log_text()
            );
        }
    }

    /// Waits until `service` at `addr` reports SERVING through `grpc.health.v1`.
    async fn wait_serving(&mut self, addr: SocketAddr, service: &str) {
        let deadline = Instant::now() + STARTUP;
        loop {
            self.assert_alive();
            let last = match health(addr, service).await {
                Ok(ServingStatus::Serving) => return,
                Ok(other) => format!("{other:?}"),
                Err(e) => e,
            };
            assert!(
                Instant::now() < deadline,
                "{service} at {addr} not SERVING after {STARTUP:?} (last: {last}); output:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// `holdfast --listen L --metrics-listen IP:9464` in `dir`, with nothing from the caller's
/// environment that could configure it.
fn embedded_command(dir: &std::path::Path, listen: SocketAddr) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_holdfast"));
    for (k, _) in std::env::vars() {
        if k.starts_with("HOLDFAST_") || k == "DATABASE_URL" || k == "OTEL_EXPORTER_OTLP_ENDPOINT" {
            cmd.env_remove(k);
        }
    }
    cmd.current_dir(dir)
        .arg("--listen")
        .arg(listen.to_string())
        .arg("--metrics-listen")
        .arg(format!("{}:9464", listen.ip()))
        .env("RUST_LOG", "info")
        .stdin(Stdio::null());
    cmd
}

impl Drop for Holdfast {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn health(addr: SocketAddr, service: &str) -> Result<ServingStatus, String> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let status = HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .map_err(|e| e.to_string())?
        .into_inner()
        .status;
    ServingStatus::try_from(status).map_err(|e| e.to_string())
}

/// A loopback address of this test process's own (the all-in-one puts its participants on
/// fixed ports 50061-50065 of the listen IP, so 127.0.0.1 could collide with a developer's
/// running all-in-one), and a port free on it.
/// A loopback address of this test process's own (`slot` tells tests apart), so the
/// all-in-one's fixed participant ports never clash with anything else.
pub(crate) fn listen_addr(slot: u8) -> SocketAddr {
    let pid = std::process::id();
    let ip = IpAddr::V4(Ipv4Addr::new(
        127,
        77 + slot,
        (pid / 250 % 250) as u8 + 1,
        (pid % 250) as u8 + 1,
    ));
    for port in 50061..=50065 {
        if let Err(e) = std::net::TcpListener::bind((ip, port)) {
            panic!("participant port {ip}:{port} is taken ({e}); cannot run the all-in-one");
        }
    }
    let probe = std::net::TcpListener::bind((ip, 0)).expect("bind a loopback port");
    probe.local_addr().expect("local addr")
}

pub(crate) fn participant_addr(listen: SocketAddr, port: u16) -> SocketAddr {
    SocketAddr::new(listen.ip(), port)
}

pub(crate) async fn admin(addr: SocketAddr) -> ResourceAdminClient<Channel> {
    ResourceAdminClient::connect(format!("http://{addr}"))
        .await
        .unwrap_or_else(|e| panic!("connect to ResourceAdmin at {addr}: {e}"))
}

pub(crate) async fn counts(
    admin: &mut ResourceAdminClient<Channel>,
    resource: &str,
) -> (i64, i64, i64) {
    let s = admin
        .get_resource(proto::GetResourceRequest {
            resource: resource.to_owned(),
        })
        .await
        .unwrap_or_else(|e| panic!("GetResource {resource}: {e:?}"))
        .into_inner();
    assert_eq!(s.capacity, s.available + s.held + s.confirmed, "{s:?}");
    (s.available, s.held, s.confirmed)
}

pub(crate) async fn serving(process: &mut Holdfast, listen: SocketAddr) {
    process.wait_serving(listen, "tcc.v1.Coordinator").await;
    for port in [50061, 50062] {
        process
            .wait_serving(participant_addr(listen, port), "tcc.v1.Participant")
            .await;
    }
}

#[tokio::test]
async fn all_in_one_binary_confirms_and_keeps_it_across_a_sigkill() {
    let db = TempDatabase::create().await;
    let listen = listen_addr(0);
    let log = std::env::temp_dir().join(format!(
        "holdfast-e2e-binary-{}.log",
        uuid::Uuid::new_v4().simple()
    ));
    let seats_addr = participant_addr(listen, 50061);
    let stock_addr = participant_addr(listen, 50062);

    let mut process = Holdfast::start(&db.url, listen, log.clone());
    serving(&mut process, listen).await;

    let (mut client, mut seats, mut stock, r) =
        provision_and_reserve(listen, seats_addr, stock_addr, "bin-1").await;
    assert_eq!(state_of(&r), State::Held, "{r:?}");
    assert_eq!(counts(&mut seats, "C7").await, (0, 1, 0));
    assert_eq!(counts(&mut stock, "mug").await, (3, 2, 0));

    client
        .confirm(proto::ConfirmRequest {
            reservation_id: r.id.clone(),
            hold_token: r.hold_token.clone(),
            payment: None,
        })
        .await
        .expect("confirm through the binary");
    let get = proto::GetReservationRequest {
        reservation_id: r.id.clone(),
    };
    let deadline = Instant::now() + STARTUP;
    loop {
        let now = client
            .get_reservation(get.clone())
            .await
            .expect("get")
            .into_inner();
        if state_of(&now) == State::Confirmed {
            break;
        }
        assert!(Instant::now() < deadline, "never CONFIRMED: {now:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(counts(&mut seats, "C7").await, (0, 0, 1));
    assert_eq!(counts(&mut stock, "mug").await, (3, 0, 2));

    // The operator's view: /metrics counted the reservation and its participant calls.
    let metrics = scrape(SocketAddr::new(listen.ip(), 9464)).await;
    for line in [
        "holdfast_reservations_total{state=\"HELD\"} 1",
        "holdfast_reservations_total{state=\"CONFIRMED\"} 1",
        "holdfast_rpc_requests_total{method=\"Reserve\",code=\"Ok\"} 1",
        "holdfast_hold_to_confirm_ratio 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} missing in:\n{metrics}"
        );
    }
    assert!(
        metrics
            .contains("holdfast_branch_call_seconds_count{participant=\"seats\",phase=\"try\"} 1"),
        "{metrics}"
    );

    // SIGKILL, then the same binary on the same database and addresses.
    process.kill();
    drop((client, seats, stock));
    let mut process = Holdfast::start(&db.url, listen, log.clone());
    serving(&mut process, listen).await;

    let mut client = CoordinatorClient::connect(format!("http://{listen}"))
        .await
        .expect("reconnect to the coordinator");
    let after = client
        .get_reservation(get)
        .await
        .expect("the reservation survived the restart")
        .into_inner();
    assert_eq!(state_of(&after), State::Confirmed, "{after:?}");
    assert_eq!(after.id, r.id);
    let mut seats = admin(seats_addr).await;
    let mut stock = admin(stock_addr).await;
    assert_eq!(counts(&mut seats, "C7").await, (0, 0, 1));
    assert_eq!(counts(&mut stock, "mug").await, (3, 0, 2));

    // And it still works: the rest of the stock can be had.
    let more = client
        .reserve(proto::ReserveRequest {
            request_id: "bin-2".into(),
            holder: "bob".into(),
            ttl: None,
            holds: vec![proto::Hold {
                participant: "stock".into(),
                resource: "mug".into(),
                quantity: 3,
                during: None,
            }],
            labels: Default::default(),
        })
        .await
        .expect("reserve after the restart")
        .into_inner();
    assert_eq!(state_of(&more), State::Held, "{more:?}");
    assert_eq!(counts(&mut stock, "mug").await, (0, 3, 2));

    // An expiry and a refunded late payment show on /metrics too.
    seats
        .put_resources(proto::PutResourcesRequest {
            resources: vec![proto::ResourceSpec {
                resource: "C8".into(),
                capacity: 1,
            }],
        })
        .await
        .expect("add seat C8");
    let seat = |holder: &str, ttl: Option<prost_types::Duration>| proto::ReserveRequest {
        request_id: format!("{holder}-c8"),
        holder: holder.into(),
        ttl,
        holds: vec![proto::Hold {
            participant: "seats".into(),
            resource: "C8".into(),
            quantity: 1,
            during: None,
        }],
        labels: Default::default(),
    };
    let lapsing = client
        .reserve(seat(
            "carol",
            Some(prost_types::Duration {
                seconds: 1,
                nanos: 0,
            }),
        ))
        .await
        .expect("carol reserves C8")
        .into_inner();
    let deadline = Instant::now() + STARTUP;
    while counts(&mut seats, "C8").await != (1, 0, 0) {
        assert!(Instant::now() < deadline, "C8 was never released");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    client
        .reserve(seat("dave", None))
        .await
        .expect("dave takes C8");
    let payments_addr = participant_addr(listen, 50064);
    admin(payments_addr)
        .await
        .put_resources(proto::PutResourcesRequest {
            resources: vec![proto::ResourceSpec {
                resource: "card".into(),
                capacity: 10_000,
            }],
        })
        .await
        .expect("fund the card");
    let payment_ref =
        proto::payments_client::PaymentsClient::connect(format!("http://{payments_addr}"))
            .await
            .expect("connect to payments")
            .charge(proto::ChargeRequest {
                account: "card".into(),
                amount_minor: 500,
                currency: "EUR".into(),
            })
            .await
            .expect("charge")
            .into_inner()
            .payment_ref;
    let late = client
        .confirm(proto::ConfirmRequest {
            reservation_id: lapsing.id.clone(),
            hold_token: lapsing.hold_token.clone(),
            payment: Some(proto::Payment {
                participant: "payments".into(),
                payment_ref,
                amount_minor: 500,
                currency: "EUR".into(),
            }),
        })
        .await
        .expect_err("the seat is taken: refunded");
    assert_eq!(crate::common::reason(&late), "HOLD_EXPIRED");
    let metrics = scrape(SocketAddr::new(listen.ip(), 9464)).await;
    for line in [
        "holdfast_expired_holds_total 1",
        "holdfast_refunds_total{state=\"PENDING\"} 1",
        "holdfast_refunds_total{state=\"REFUNDED\"} 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} missing in:\n{metrics}"
        );
    }

    process.kill();
    drop(db);
    let _ = std::fs::remove_file(&log);
}

/// GET /metrics over plain HTTP/1.1.
pub(crate) async fn scrape(addr: SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to /metrics");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: holdfast\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response
}

/// Runs `holdfast <args>` to completion with only `env` from the HOLDFAST_* family set.
fn run_holdfast(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_holdfast"));
    for (k, _) in std::env::vars() {
        if k.starts_with("HOLDFAST_") || k == "DATABASE_URL" {
            cmd.env_remove(k);
        }
    }
    cmd.args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run holdfast")
}

#[test]
fn settings_come_from_flags_then_env_then_file_then_defaults() {
    let file = std::env::temp_dir().join(format!("holdfast-cfg-{}.toml", std::process::id()));
    std::fs::write(
        &file,
        r#"
max_ttl = "30m"
default_ttl = "5m"
participant_timeout = "3s"
max_extensions = 4
redis_url = "redis://:hunter2@cache:6379/0"
redis_retention = "48h"
[participants]
seats = "http://127.0.0.1:50061"
stock = { url = "http://127.0.0.1:50062", timeout = "1s" }
"#,
    )
    .unwrap();
    let out = run_holdfast(
        &["coordinator", "--print-config", "--default-ttl", "7m"],
        &[
            ("HOLDFAST_CONFIG", file.to_str().unwrap()),
            ("HOLDFAST_MAX_TTL", "2h"),
            ("DATABASE_URL", "postgres://app:s3cret@db:5432/holdfast"),
        ],
    );
    let _ = std::fs::remove_file(&file);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    for line in [
        "default_ttl = \"420000ms\"",       // flag beats everything
        "max_ttl = \"7200000ms\"",          // env beats the file
        "max_extensions = 4",               // file beats the default
        "participant_timeout = \"3000ms\"", // file
        "max_active_holds_per_holder = 5",  // default
        "seats = { url = \"http://127.0.0.1:50061\", timeout = \"3000ms\" }",
        "stock = { url = \"http://127.0.0.1:50062\", timeout = \"1000ms\" }",
        "database_url = \"postgres://app:***@db:5432/holdfast\"", // never print a password
        "redis_url = \"redis://:***@cache:6379/0\"",              // file, masked too
        "redis_retention = \"172800000ms\"",                      // file
    ] {
        assert!(
            printed.lines().any(|l| l == line),
            "{line:?} not in:\n{printed}"
        );
    }
    assert!(!printed.contains("hunter2"), "{printed}");
    // From its env var; the all-in-one (no subcommand) prints it as well.
    let out = run_holdfast(
        &["--print-config"],
        &[("HOLDFAST_REDIS_URL", "redis://127.0.0.1:6380")],
    );
    assert!(out.status.success());
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed
            .lines()
            .any(|l| l == "redis_url = \"redis://127.0.0.1:6380\""),
        "{printed}"
    );
    assert!(
        printed
            .lines()
            .any(|l| l == "redis_retention = \"604800000ms\""),
        "default 7 days: {printed}"
    );
    // Unset, it is named as such (a comment: the printed settings stay valid TOML).
    let out = run_holdfast(&["coordinator", "--print-config"], &[]);
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed
            .lines()
            .any(|l| l.starts_with("# redis_url: not set")),
        "{printed}"
    );
    assert!(printed.parse::<toml::Table>().is_ok(), "{printed}");
}

/// Runs `holdfast bench <args>` on a fresh database of its own (a name with "bench" in it;
/// the bench drops and recreates it) with small pools, asserts it exited 0, and answers its
/// JSON result rows and its output (for failure messages).
fn run_bench(args: &[&str]) -> (Vec<serde_json::Value>, String) {
    let id = uuid::Uuid::new_v4().simple();
    let db = TempDatabase {
        url: with_database(&server_url(), &format!("holdfast_bench_smoke_{id}")),
    };
    let json = std::env::temp_dir().join(format!("holdfast-bench-smoke-{id}.json"));
    let mut argv = vec!["bench"];
    argv.extend_from_slice(args);
    argv.extend_from_slice(&[
        // Few connections: other tests share the server's max_connections.
        "--coordinator-pool",
        "8",
        "--participant-pool",
        "8",
        "--database-url",
        &db.url,
        "--json",
        json.to_str().expect("temp path"),
    ]);
    let out = run_holdfast(&argv, &[("RUST_LOG", "error")]);
    let text = std::fs::read_to_string(&json);
    let _ = std::fs::remove_file(&json);
    let output = format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "bench failed ({}); {output}",
        out.status
    );
    let doc: serde_json::Value =
        serde_json::from_str(&text.unwrap_or_else(|e| panic!("no JSON ({e}); {output}")))
            .expect("the JSON parses");
    let rows = doc["results"].as_array().expect("results").clone();
    (rows, output)
}

/// `holdfast bench ceiling latency throughput`, short: every row is there and clean, and each
/// row's ratio is its rate over its ceiling's, both readings of the ceiling (a row per
/// connection, one row for all) for the rows run at `--clients`.
#[test]
fn bench_reports_rates_against_both_ceilings() {
    let (rows, output) = run_bench(&[
        "ceiling",
        "latency",
        "throughput",
        "--duration",
        "1s",
        "--clients",
        "4",
    ]);
    let row = |name: &str| {
        rows.iter()
            .find(|r| r["scenario"] == name)
            .unwrap_or_else(|| panic!("no {name} row; {output}"))
    };
    let rate = |name: &str| row(name)["rate_per_s"].as_f64().expect("rate");
    for name in [
        "ceiling-1",
        "ceiling-4",
        "ceiling-4-one-row",
        "latency-noop",
        "latency-real",
        "throughput-noop",
        "throughput-real",
    ] {
        let r = row(name);
        assert!(r["failure"].is_null(), "{r}");
        assert_eq!(r["error_count"], 0, "{r}");
        assert!(r["ok"].as_u64().is_some_and(|ok| ok > 0), "{r}");
        assert!(rate(name) > 0.0, "{r}");
    }
    for name in ["latency-noop", "latency-real"] {
        let x = row(name)["ratio_to_ceiling"].as_f64().expect("ratio");
        assert!((x - rate(name) / rate("ceiling-1")).abs() < 1e-9, "{name}");
        assert!(row(name)["ratio_to_one_row_ceiling"].is_null());
    }
    for name in ["throughput-noop", "throughput-real"] {
        let x = row(name)["ratio_to_ceiling"].as_f64().expect("ratio");
        assert!((x - rate(name) / rate("ceiling-4")).abs() < 1e-9, "{name}");
        let y = row(name)["ratio_to_one_row_ceiling"]
            .as_f64()
            .expect("one-row ratio");
        assert!(
            (y - rate(name) / rate("ceiling-4-one-row")).abs() < 1e-9,
            "{name}"
        );
        assert!(row(name)["commits_per_op"].as_f64().is_some(), "{name}");
    }
}

/// `holdfast bench flash`, small, end to end: the real binary drops and recreates its own
/// database (a name with "bench" in it, unique to this test), runs the flash sale through its
/// in-process coordinator on `stock` and on `stock-redis`, exits 0, and its JSON shows both
/// rows sold exactly the units (the participants' own counts) with no error and no oversell;
/// the run's Redis keys are deleted afterwards.
#[test]
fn bench_flash_sells_exactly_the_units_on_stock_and_stock_redis() {
    const UNITS: i64 = 20;
    const CLIENTS: i64 = 300;
    let redis_url =
        std::env::var("HOLDFAST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let (rows, output) = run_bench(&[
        "flash",
        "--flash-clients",
        &CLIENTS.to_string(),
        "--flash-concurrency",
        "32",
        "--flash-units",
        &UNITS.to_string(),
        "--redis-url",
        &redis_url,
    ]);
    for name in ["flash", "flash-stock-redis"] {
        let row = rows
            .iter()
            .find(|r| r["scenario"] == name)
            .unwrap_or_else(|| panic!("no {name} row; {output}"));
        assert!(row["failure"].is_null(), "{row}");
        assert_eq!(row["error_count"], 0, "{row}");
        assert_eq!(row["ok"], UNITS, "{row}");
        assert_eq!(row["rejected"], CLIENTS - UNITS, "{row}");
        let details = &row["details"];
        assert_eq!(details["winners"], UNITS, "{row}");
        assert_eq!(details["oversell"], 0, "{row}");
        let counts = &details["participant_counts"];
        assert_eq!(
            (&counts["capacity"], &counts["confirmed"], &counts["held"]),
            (&UNITS.into(), &UNITS.into(), &0.into()),
            "{row}"
        );
    }
    let redis_row = rows
        .iter()
        .find(|r| r["scenario"] == "flash-stock-redis")
        .expect("row");
    assert_eq!(redis_row["details"]["participant"], "stock-redis");
    let prefix = redis_row["details"]["redis_key_prefix"]
        .as_str()
        .expect("redis_key_prefix");
    let mut redis = redis::Client::open(redis_url.as_str())
        .expect("redis url")
        .get_connection()
        .expect("redis");
    let left: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query(&mut redis)
        .expect("KEYS");
    assert!(left.is_empty(), "{} keys left under {prefix}", left.len());
}

#[test]
fn a_bad_config_fails_at_start_naming_the_setting() {
    let file = std::env::temp_dir().join(format!("holdfast-bad-{}.toml", std::process::id()));
    for (content, expected) in [
        ("max_tll = \"5m\"", "unknown setting `max_tll`"),
        ("max_ttl = \"5 parsecs\"", "--max-ttl"),
        ("[participants]\nseats = 42", "participants.seats"),
        ("max_ttl = ", "not valid TOML"),
    ] {
        std::fs::write(&file, content).unwrap();
        let out = run_holdfast(
            &[
                "coordinator",
                "--config",
                file.to_str().unwrap(),
                "--print-config",
            ],
            &[],
        );
        assert!(!out.status.success(), "{content:?} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expected), "{content:?}: {err}");
    }
    let _ = std::fs::remove_file(&file);
    // A bad flag or env value names its setting too.
    let out = run_holdfast(
        &["coordinator", "--print-config"],
        &[("HOLDFAST_LEASE", "soon")],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--lease"));
}

/// The embedded default: `holdfast` with no database argument in an empty folder runs on
/// SQLite files under `./data`; a reservation across two participants confirmed before a
/// SIGKILL is CONFIRMED after the restart with the counts intact; a second holdfast on the
/// same folder refuses to start, naming the lock.
#[tokio::test]
async fn embedded_binary_on_sqlite_keeps_a_confirmation_across_a_sigkill_and_has_one_writer() {
    let dir = std::env::temp_dir().join(format!(
        "holdfast-embedded-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).expect("temp folder");
    let listen = listen_addr(2);
    let log = dir.join("holdfast.log");
    let (seats_addr, stock_addr) = (
        participant_addr(listen, 50061),
        participant_addr(listen, 50062),
    );

    let mut process = Holdfast::start_embedded(&dir, listen, log.clone());
    serving(&mut process, listen).await;
    for file in ["holdfast.db", "participants.db", "holdfast.lock"] {
        assert!(
            dir.join("data").join(file).exists(),
            "./data/{file} missing"
        );
    }

    // One writer: a second holdfast on the same folder fails fast, saying why.
    let second = embedded_command(&dir, listen_addr_other(listen))
        .output()
        .expect("run a second holdfast");
    assert!(!second.status.success(), "the second holdfast started");
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(
        err.contains("another holdfast is already using ./data") && err.contains("holdfast.lock"),
        "{err}"
    );

    let (mut client, mut seats, mut stock, r) =
        provision_and_reserve(listen, seats_addr, stock_addr, "emb-1").await;
    assert_eq!(state_of(&r), State::Held, "{r:?}");
    assert_eq!(counts(&mut seats, "C7").await, (0, 1, 0));
    assert_eq!(counts(&mut stock, "mug").await, (3, 2, 0));
    client
        .confirm(proto::ConfirmRequest {
            reservation_id: r.id.clone(),
            hold_token: r.hold_token.clone(),
            payment: None,
        })
        .await
        .expect("confirm");
    let get = proto::GetReservationRequest {
        reservation_id: r.id.clone(),
    };
    let deadline = Instant::now() + STARTUP;
    loop {
        let now = client
            .get_reservation(get.clone())
            .await
            .expect("get")
            .into_inner();
        if state_of(&now) == State::Confirmed {
            break;
        }
        assert!(Instant::now() < deadline, "never CONFIRMED: {now:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(counts(&mut seats, "C7").await, (0, 0, 1));
    assert_eq!(counts(&mut stock, "mug").await, (3, 0, 2));

    // SIGKILL (the lock dies with the process), then the same binary in the same folder.
    process.kill();
    drop((client, seats, stock));
    let mut process = Holdfast::start_embedded(&dir, listen, log.clone());
    serving(&mut process, listen).await;
    let mut client = CoordinatorClient::connect(format!("http://{listen}"))
        .await
        .expect("reconnect");
    let after = client
        .get_reservation(get)
        .await
        .expect("survived")
        .into_inner();
    assert_eq!(state_of(&after), State::Confirmed, "{after:?}");
    let mut seats = admin(seats_addr).await;
    let mut stock = admin(stock_addr).await;
    assert_eq!(counts(&mut seats, "C7").await, (0, 0, 1));
    assert_eq!(counts(&mut stock, "mug").await, (3, 0, 2));
    process.kill();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Another loopback address than `listen`'s, so the second holdfast could bind everything:
/// only the lock can stop it.
fn listen_addr_other(listen: SocketAddr) -> SocketAddr {
    let IpAddr::V4(ip) = listen.ip() else {
        return listen;
    };
    let [a, b, c, d] = ip.octets();
    SocketAddr::new(
        IpAddr::V4(Ipv4Addr::new(a, b, c, d.wrapping_add(1).max(1))),
        listen.port(),
    )
}

/// Puts seat C7 (capacity 1) and 5 mugs at the binary's participants, then reserves the seat
/// and 2 mugs through its coordinator.
async fn provision_and_reserve(
    listen: SocketAddr,
    seats_addr: SocketAddr,
    stock_addr: SocketAddr,
    request_id: &str,
) -> (
    CoordinatorClient<Channel>,
    ResourceAdminClient<Channel>,
    ResourceAdminClient<Channel>,
    proto::Reservation,
) {
    let mut seats = admin(seats_addr).await;
    let mut stock = admin(stock_addr).await;
    for (admin, resource, capacity) in [(&mut seats, "C7", 1), (&mut stock, "mug", 5)] {
        admin
            .put_resources(proto::PutResourcesRequest {
                resources: vec![proto::ResourceSpec {
                    resource: resource.into(),
                    capacity,
                }],
            })
            .await
            .unwrap_or_else(|e| panic!("put {resource}: {e}"));
    }
    let mut client = CoordinatorClient::connect(format!("http://{listen}"))
        .await
        .expect("connect to the coordinator");
    let hold = |participant: &str, resource: &str, quantity| proto::Hold {
        participant: participant.into(),
        resource: resource.into(),
        quantity,
        during: None,
    };
    let r = client
        .reserve(proto::ReserveRequest {
            request_id: request_id.into(),
            holder: "alice".into(),
            ttl: None,
            holds: vec![hold("stock", "mug", 2), hold("seats", "C7", 1)],
            labels: Default::default(),
        })
        .await
        .expect("reserve through the binary")
        .into_inner();
    (client, seats, stock, r)
}
