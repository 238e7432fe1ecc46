//! PostgreSQL fails over under load and nothing decided is lost (SPEC 12; RELIABILITY.md,
//! "High availability"). The test starts an HA stack on this machine (`cluster.rs`: etcd, three
//! PostgreSQL 15 nodes under Patroni with synchronous replication, HAProxy routing a read-write
//! port to the primary), three coordinator replicas and the reference participants in this
//! process (the fault suite's `stack.rs`), all on one database behind HAProxy; then rounds
//! (`round.rs`) of load with a fault of the primary each: SIGKILL of its postmaster, a Patroni
//! switchover, its network cut. After each, the fault suite's checkers, and the refused window
//! measured (`probe.rs`).
//!
//! `cargo test --test ha` runs one kill and one switchover (CI); the series:
//! `HOLDFAST_HA_FAILOVERS=21 cargo test --test ha -- --ignored series` (kill, switchover and cut
//! in turn); a minute without the database: `cargo test --test ha -- --ignored minute`. Without etcd, Patroni, HAProxy or PostgreSQL 15 installed the tests say so and
//! pass, unless `HOLDFAST_HA_REQUIRED=1` (CI sets it: `.ci/run` installs them).

mod cluster;
mod patroni;
mod probe;
mod round;

// The fault suite's harness and checkers, shared file for file (not every item is used here).
#[allow(dead_code)]
#[path = "../faults/check.rs"]
mod check;
#[allow(dead_code)]
#[path = "../faults/money.rs"]
mod money;
#[allow(dead_code)]
#[path = "../faults/plan.rs"]
mod plan;
#[allow(dead_code)]
#[path = "../faults/relay.rs"]
mod relay;
#[allow(dead_code)]
#[path = "../faults/replay.rs"]
mod replay;
#[allow(dead_code)]
#[path = "../faults/runner.rs"]
mod runner;
#[allow(dead_code)]
#[path = "../faults/sink.rs"]
mod sink;
#[allow(dead_code)]
#[path = "../faults/stack.rs"]
mod stack;
#[allow(dead_code)]
#[path = "../faults/workload.rs"]
mod workload;

use std::collections::BTreeMap;
use std::time::Duration;

use cluster::Cluster;
use round::{FaultKind, Report};
use stack::{Coordinator, Stack};

/// One stack at a time on this machine (each is three PostgreSQL servers).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The database holdfast and the participants share on the cluster.
const DATABASE: &str = "holdfast";

/// The HA stack and what runs on it.
struct Ha {
    coordinators: Vec<Coordinator>,
    stack: Stack,
    cluster: Cluster,
}

impl Ha {
    /// `None` (saying why) when the programs are not installed and not required.
    async fn start() -> Option<Ha> {
        // The coordinators' and participants' errors on stderr (`RUST_LOG` to see more).
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
            )
            .with_test_writer()
            .try_init();
        if let Some(why) = cluster::missing() {
            let required = std::env::var("HOLDFAST_HA_REQUIRED").is_ok_and(|v| v == "1");
            assert!(!required, "HOLDFAST_HA_REQUIRED=1 but {why}");
            eprintln!("ha: SKIPPED: {why}");
            return None;
        }
        let cluster = Cluster::start().await;
        create_database(&cluster).await;
        // Connection options as holdfast reads them from a URL (what the participants and
        // coordinators of the stack take from this pool).
        let options = holdfast::db::postgres_options(&cluster.url(DATABASE)).expect("a URL");
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await
            .expect("the checks' pool through HAProxy");
        let stack = Stack::start(pool).await;
        stack
            .put(
                "stock",
                &[(probe::PROBE_ITEM.to_owned(), probe::PROBE_CAPACITY)],
            )
            .await;
        let mut coordinators = Vec::new();
        for _ in 0..3 {
            coordinators.push(
                Coordinator::start(&stack.pool, stack.settings(false), &stack.events.url).await,
            );
        }
        Some(Ha {
            coordinators,
            stack,
            cluster,
        })
    }

    async fn rounds(&self, kinds: &[FaultKind]) -> Vec<Report> {
        let mut reports = Vec::new();
        for (i, kind) in kinds.iter().enumerate() {
            let report = round::round(
                &self.cluster,
                &self.stack,
                &self.coordinators,
                *kind,
                i as u64 + 1,
            )
            .await;
            eprintln!("ha: round {}: {}", i + 1, report.line());
            reports.push(report);
        }
        for (i, c) in self.coordinators.iter().enumerate() {
            assert_eq!(c.restarts(), 0, "coordinator {i} had to be started again");
        }
        reports
    }

    async fn stop(self) {
        drop(self.coordinators);
        self.stack.stop().await;
        let cluster = self.cluster;
        tokio::task::spawn_blocking(move || drop(cluster))
            .await
            .expect("stopping the cluster");
    }
}

async fn create_database(cluster: &Cluster) {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(&cluster.url("postgres"))
        .await
        .expect("the primary through HAProxy");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {DATABASE}")))
        .execute(&mut conn)
        .await
        .expect("CREATE DATABASE");
    let _ = conn.close().await;
}

/// p50 and max of the refused windows per fault kind.
fn summary(reports: &[Report]) -> String {
    let mut by: BTreeMap<FaultKind, Vec<Duration>> = BTreeMap::new();
    for r in reports {
        by.entry(r.kind).or_default().push(r.window);
    }
    by.into_iter()
        .map(|(kind, mut w)| {
            w.sort();
            let p50 = w[(w.len() - 1) / 2];
            let max = w[w.len() - 1];
            format!(
                "{kind:?} x{}: refused window p50 {p50:.2?}, max {max:.2?}",
                w.len()
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// CI: one SIGKILL of the primary, one switchover.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failover_under_load_loses_nothing_decided() {
    let _serial = SERIAL.lock().await;
    let Some(ha) = Ha::start().await else { return };
    let reports = ha.rounds(&[FaultKind::Kill, FaultKind::Switchover]).await;
    eprintln!("ha: {}", summary(&reports));
    ha.stop().await;
}

/// The series: `HOLDFAST_HA_FAILOVERS` (21) failovers, kill, switchover and network cut in
/// turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "series: HOLDFAST_HA_FAILOVERS=21 cargo test --test ha -- --ignored series"]
async fn series_of_failovers_loses_nothing_decided() {
    let _serial = SERIAL.lock().await;
    let n: usize = std::env::var("HOLDFAST_HA_FAILOVERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(21);
    let Some(ha) = Ha::start().await else { return };
    let kinds = [FaultKind::Kill, FaultKind::Switchover, FaultKind::Cut];
    let plan: Vec<FaultKind> = (0..n).map(|i| kinds[i % kinds.len()]).collect();
    let reports = ha.rounds(&plan).await;
    eprintln!("ha: {}", summary(&reports));
    ha.stop().await;
}

/// A minute without the database (HAProxy stopped, the cluster untouched): the coordinators'
/// leases and sweeps and every pool outlast it, nothing is restarted, the load goes on after.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a minute long: cargo test --test ha -- --ignored minute"]
async fn a_minute_without_the_database_loses_nothing_decided() {
    let _serial = SERIAL.lock().await;
    let Some(ha) = Ha::start().await else { return };
    let reports = ha.rounds(&[FaultKind::Outage]).await;
    eprintln!("ha: {}", summary(&reports));
    ha.stop().await;
}
