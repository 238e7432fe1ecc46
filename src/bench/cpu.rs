//! CPU time per operation of an in-process row: the bench's own process (the deployment and its
//! clients), the PostgreSQL processes serving the bench database plus the server's background
//! processes (WAL writer, checkpointer, ...), and a local `nats-server`, read from `/proc`
//! before and after the row (from the deployment answering to after the row's report: its
//! provisioning and a sink's drain are in it). It says which process pays for what a row adds;
//! it does not see time operations spend waiting (a rate can fall at the same CPU per
//! operation). Linux with the database on this machine only; elsewhere a row has none.

use std::collections::HashMap;

use sqlx::PgPool;

use super::scenarios::Measured;

/// Clock ticks per second of `/proc/<pid>/stat` (`USER_HZ`, 100 on every Linux ABI).
const TICKS_PER_SECOND: f64 = 100.0;

/// Which part of the deployment a process is.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Part {
    Holdfast,
    Postgres,
    Nats,
}

/// The CPU ticks (user + system) of the row's processes when it started.
pub(super) struct CpuMeter {
    pool: PgPool,
    start: HashMap<u32, (Part, u64)>,
}

/// A row's CPU time per operation, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct CpuPerOp {
    pub holdfast: f64,
    pub postgres: f64,
    pub nats: f64,
}

impl CpuPerOp {
    pub(super) fn total(&self) -> f64 {
        self.holdfast + self.postgres + self.nats
    }
}

impl CpuMeter {
    /// Starts measuring, or `None` when the database's processes are not on this machine.
    pub(super) async fn start(database_url: &str) -> Option<CpuMeter> {
        let pool = crate::db::connect_postgres(database_url, 1).await.ok()?;
        let start = processes(&pool).await?;
        start
            .values()
            .any(|(part, _)| *part == Part::Postgres)
            .then_some(CpuMeter { pool, start })
    }

    /// The CPU time per operation since [`CpuMeter::start`]; a process that started since
    /// counts whole, one that ended since is missing (a deployment's pools stay open until it
    /// stops).
    pub(super) async fn finish(self, operations: u64) -> Option<CpuPerOp> {
        let end = processes(&self.pool).await;
        self.pool.close().await;
        let end = end?;
        let mut ticks: HashMap<Part, u64> = HashMap::new();
        for (pid, (part, now)) in end {
            let before = self.start.get(&pid).map_or(0, |(_, t)| *t);
            *ticks.entry(part).or_default() += now.saturating_sub(before);
        }
        let per_op = |part| {
            ticks.get(&part).copied().unwrap_or(0) as f64 * 1000.0
                / TICKS_PER_SECOND
                / operations.max(1) as f64
        };
        (operations > 0).then(|| CpuPerOp {
            holdfast: per_op(Part::Holdfast),
            postgres: per_op(Part::Postgres),
            nats: per_op(Part::Nats),
        })
    }

    /// Finishes the measurement of the row that measured `m` and records it in its JSON
    /// (`cpu_ms_per_op`: `total`, `holdfast`, `postgres`, `nats`).
    pub(super) async fn record(self, m: &mut Measured) {
        let operations = m.recorder.ok() + m.recorder.rejected();
        // Its one read of pg_stat_activity is a transaction of the database's count.
        m.setup_xacts += 1;
        let Some(cpu) = self.finish(operations).await else {
            return;
        };
        if let Some(extra) = m.extra.as_object_mut() {
            extra.insert(
                "cpu_ms_per_op".into(),
                serde_json::json!({
                    "total": cpu.total(),
                    "holdfast": cpu.holdfast,
                    "postgres": cpu.postgres,
                    "nats": cpu.nats,
                }),
            );
        }
    }
}

/// The processes measured and their ticks so far: this one, the backends of the bench
/// database and the server's background processes (`pg_stat_activity`, found in `/proc` as
/// `postgres`), every local `nats-server`.
async fn processes(pool: &PgPool) -> Option<HashMap<u32, (Part, u64)>> {
    let pids: Vec<i32> = sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity \
         WHERE datname = current_database() OR datid IS NULL",
    )
    .fetch_all(pool)
    .await
    .ok()?;
    let mut found = HashMap::new();
    found.insert(std::process::id(), (Part::Holdfast, ticks("self")?.1));
    for pid in pids.into_iter().filter_map(|p| u32::try_from(p).ok()) {
        if let Some((name, t)) = ticks(&pid.to_string())
            && name.starts_with("postgres")
        {
            found.insert(pid, (Part::Postgres, t));
        }
    }
    let entries = std::fs::read_dir("/proc").ok()?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if let Some((comm, t)) = ticks(&pid.to_string())
            && comm == "nats-server"
        {
            found.insert(pid, (Part::Nats, t));
        }
    }
    Some(found)
}

/// A process's command name and user + system CPU ticks (`/proc/<pid>/stat`).
fn ticks(pid: &str) -> Option<(String, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat)
}

/// The name (between the parentheses, which may itself hold spaces and parentheses) and
/// fields 14 and 15 (`utime`, `stime`) of a `/proc/<pid>/stat` line.
fn parse_stat(stat: &str) -> Option<(String, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?.to_owned();
    let mut rest = stat.get(close + 1..)?.split_whitespace();
    // After the name: state is field 3, so utime (14) is the 12th from here.
    let utime: u64 = rest.nth(11)?.parse().ok()?;
    let stime: u64 = rest.next()?.parse().ok()?;
    Some((name, utime + stime))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_name_and_user_plus_system_ticks() {
        let line = "4242 (nats-server) S 1 4242 4242 0 -1 4194560 1180 0 0 0 \
                    731 204 0 0 20 0 12 0 1777 1278263296 4120 18446744073709551615";
        assert_eq!(parse_stat(line), Some(("nats-server".into(), 935)));
        let odd = "7 (a (b) c) R 1 7 7 0 -1 0 0 0 0 0 5 6 0 0 20 0 1 0 9 0 0 0";
        assert_eq!(parse_stat(odd), Some(("a (b) c".into(), 11)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn this_process_is_found() {
        assert!(ticks("self").is_some_and(|(name, _)| !name.is_empty()));
    }
}
