//! The process harness: the real `holdfast` binary run as a child process, as an operator runs
//! it - a database of its own per test, loopback addresses of the test's own, health and
//! `/metrics` probes, `ResourceAdmin` clients for the all-in-one's participants, and one-shot
//! runs of a subcommand. The tests are by topic: `banner` (what the all-in-one says at start,
//! checked against what answers), `crash` (SIGKILL and restart), `config` (settings
//! precedence, bad configuration), `failed_start` (a start refused before writing leaves no
//! data folder), `bench` (`holdfast bench` end to end), `shutdown` (SIGTERM with a Watch
//! open), `dashboards` (deploy/'s PromQL against live /metrics), `help` (every `--help` page
//! in plain text), `metrics` (what /metrics and the log say before anything happened), `split`
//! (the coordinator and participant roles as processes of their own: SIGKILLs and terminated
//! database connections mid-flight), `stock_redis` (the all-in-one's stock-redis under its own
//! key prefix, on the test clock), `upgrade` (a data folder an earlier holdfast made),
//! `other_languages` (the Python and TypeScript order services' saga tests against
//! `--test-mode`; ignored, run by `.ci/run`).

mod banner;
pub(crate) mod bench;
mod config;
mod crash;
mod dashboards;
mod deploy;
mod deploy_ha;
mod docker_context;
mod failed_start;
mod given_participants;
mod help;
mod metrics;
mod other_languages;
mod shutdown;
mod split;
mod stock_redis;
mod upgrade;

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use holdfast::proto;
use holdfast::proto::resource_admin_client::ResourceAdminClient;
use sqlx::migrate::MigrateDatabase;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

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
        let mut cmd = all_in_one_command(listen);
        // One process, never a second replica; a restart's repeated Reserve is not checked.
        cmd.env("DATABASE_URL", database_url)
            .env("HOLDFAST_EPHEMERAL_TOKEN_SECRET", "true")
            .envs(env.iter().copied());
        Holdfast::spawn(cmd, log)
    }

    /// Starts it with no arguments but the addresses and no `DATABASE_URL`, in `dir` as its
    /// working directory: the embedded default, SQLite files under `dir/data`.
    pub(crate) fn start_embedded(
        dir: &std::path::Path,
        listen: SocketAddr,
        log: PathBuf,
    ) -> Holdfast {
        Holdfast::spawn(embedded_command(dir, listen), log)
    }

    /// Spawns `cmd` with its output appended to `log`.
    fn spawn(mut cmd: Command, log: PathBuf) -> Holdfast {
        let out = File::options()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap_or_else(|e| panic!("open {}: {e}", log.display()));
        let err = out.try_clone().expect("clone the log file handle");
        let child = cmd
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

    /// SIGTERM (as an orchestrator stops it), then waits up to `limit` for it to exit; how
    /// long it took, or `None` if it still runs.
    pub(crate) async fn terminate(&mut self, limit: Duration) -> Option<Duration> {
        let child = self.child.as_mut()?;
        let sent = Instant::now();
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM failed");
        while sent.elapsed() < limit {
            if let Ok(Some(_)) = child.try_wait() {
                return Some(sent.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
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

/// The binary with nothing from the caller's environment that could configure it (every
/// `HOLDFAST_*` variable, `DATABASE_URL`, the OTLP endpoint) and no stdin.
fn holdfast_command() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_holdfast"));
    for (k, _) in std::env::vars() {
        if k.starts_with("HOLDFAST_") || k == "DATABASE_URL" || k == "OTEL_EXPORTER_OTLP_ENDPOINT" {
            cmd.env_remove(k);
        }
    }
    cmd.stdin(Stdio::null());
    cmd
}

/// `holdfast --listen L --metrics-listen IP:9464 --http-listen IP:8080`, logging at info: the
/// all-in-one.
fn all_in_one_command(listen: SocketAddr) -> Command {
    let mut cmd = holdfast_command();
    cmd.arg("--listen")
        .arg(listen.to_string())
        .arg("--metrics-listen")
        .arg(format!("{}:9464", listen.ip()))
        .arg("--http-listen")
        .arg(format!("{}:8080", listen.ip()))
        .env("RUST_LOG", "info");
    cmd
}

/// The all-in-one in `dir`, with no database named: the embedded default.
fn embedded_command(dir: &std::path::Path, listen: SocketAddr) -> Command {
    let mut cmd = all_in_one_command(listen);
    cmd.current_dir(dir);
    cmd
}

impl Drop for Holdfast {
    fn drop(&mut self) {
        self.kill();
    }
}

pub(crate) async fn health(addr: SocketAddr, service: &str) -> Result<ServingStatus, String> {
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

/// A loopback address of this test process's own (`slot` tells tests apart), and a port free
/// on it: the all-in-one puts its participants on fixed ports 50061-50065 of the listen IP, so
/// 127.0.0.1 could clash with anything else, such as a developer's running all-in-one.
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

/// GET `path` of the HTTP listener at `addr` (the JSON API, plain HTTP/1.1, no key): the body
/// of a 200 answer, as JSON.
pub(crate) async fn get_json(addr: SocketAddr, path: &str) -> serde_json::Value {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the HTTP listener");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    assert!(
        response.starts_with("HTTP/1.1 200"),
        "GET {path}: {response}"
    );
    let (_, body) = response.split_once("\r\n\r\n").expect("a head and a body");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
}

/// Runs `holdfast <args>` to completion with only `env` from the HOLDFAST_* family set.
pub(crate) fn run_holdfast(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    holdfast_command()
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run holdfast")
}
