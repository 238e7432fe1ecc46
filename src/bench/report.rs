//! The summary of a bench run: one `Row` per scenario run, its rate and latency, the ratio to
//! the matching `ceiling` row and the commits per operation, printed as the table on stdout
//! and written as the `--json` document.

use super::scenarios::Measured;
use super::stats::{self, Percentiles};
use super::{BenchArgs, Transport, is_flash};

/// One row of the summary.
#[derive(Debug)]
pub struct Row {
    pub name: String,
    pub clients: usize,
    pub measured: Option<Measured>,
    /// Which ceiling row this one is compared with.
    pub baseline: Option<String>,
    /// Database transactions (commits, rollbacks) during the scenario, in-process only.
    pub xacts: Option<(i64, i64)>,
    pub failure: Option<String>,
}

impl Row {
    pub(super) fn rate(&self) -> f64 {
        self.measured.as_ref().map_or(0.0, |m| {
            let done = if is_flash(&self.name) {
                m.recorder.ok() + m.recorder.rejected()
            } else {
                m.recorder.ok()
            };
            done as f64 / m.elapsed.as_secs_f64().max(1e-9)
        })
    }

    pub(super) fn latency(&self) -> Percentiles {
        self.measured
            .as_ref()
            .map_or_else(Percentiles::default, |m| {
                let mut all = m.recorder.ok_micros.clone();
                all.extend(&m.recorder.rejected_micros);
                stats::percentiles(&all)
            })
    }

    pub(super) fn errors(&self) -> u64 {
        self.measured
            .as_ref()
            .map_or(0, |m| m.recorder.error_count())
    }

    pub(super) fn oversell(&self) -> i64 {
        self.measured
            .as_ref()
            .and_then(|m| m.extra.get("oversell"))
            .and_then(|v| v.as_i64())
            .unwrap_or(0)
    }

    /// Oversold, (a flash sale) units left held after it, (seats + stock) an item whose
    /// counts disagree with what its client was answered, or (waitlist) offers out of order.
    pub(super) fn broke_conservation(&self) -> bool {
        let count = |key: &str| {
            self.measured
                .as_ref()
                .and_then(|m| m.extra.get(key))
                .and_then(|v| v.as_i64())
                .unwrap_or(0)
        };
        self.oversell() > 0
            || count("left_held") > 0
            || count("conservation_violations") > 0
            || count("queue_order_violations") > 0
    }

    fn ops(&self) -> u64 {
        self.measured
            .as_ref()
            .map_or(0, |m| m.recorder.ok() + m.recorder.rejected())
    }
}

pub(super) fn row(
    name: String,
    clients: usize,
    result: Result<Measured, String>,
    baseline: Option<String>,
    xacts: Option<(i64, i64)>,
) -> Row {
    let (measured, failure) = match result {
        Ok(m) => (Some(m), None),
        Err(e) => {
            eprintln!("bench: {name} FAILED: {e}");
            (None, Some(e))
        }
    };
    Row {
        name,
        clients,
        measured,
        baseline,
        xacts,
        failure,
    }
}

fn ratio(rows: &[Row], r: &Row) -> Option<f64> {
    ratio_to(rows, r, r.baseline.as_ref()?)
}

fn ratio_to(rows: &[Row], r: &Row, base: &str) -> Option<f64> {
    let b = rows.iter().find(|x| x.name == base)?;
    let b_rate = b.rate();
    (b.failure.is_none() && b_rate > 0.0 && r.failure.is_none()).then(|| r.rate() / b_rate)
}

/// The ratio of a row compared with `ceiling-C` to `ceiling-C-one-row` instead.
fn ratio_one_row(rows: &[Row], r: &Row) -> Option<f64> {
    let base = r.baseline.as_ref()?;
    if base == "ceiling-1" {
        return None;
    }
    ratio_to(rows, r, &format!("{base}-one-row"))
}

/// The row's CPU time per operation in ms, all processes measured (`bench/cpu.rs`).
pub(super) fn cpu_per_op(r: &Row) -> Option<f64> {
    r.measured
        .as_ref()?
        .extra
        .get("cpu_ms_per_op")?
        .get("total")?
        .as_f64()
}

fn commits_per_op(r: &Row) -> Option<f64> {
    let (commits, _) = r.xacts?;
    let setup = r.measured.as_ref().map_or(0, |m| m.setup_xacts);
    let ops = r.ops();
    (ops > 0).then(|| (commits - setup) as f64 / ops as f64)
}

pub(super) fn print_table(rows: &[Row], transport: &Transport) {
    println!();
    // Only TLS runs say so: a plaintext run's table is as it always was.
    if let Some(line) = transport.describe() {
        println!("{line}");
    }
    println!(
        "{:<18} {:>7} {:>8} {:>6} {:>6} {:>10} {:>8} {:>8} {:>8} {:>8} {:>10} {:>10} {:>10}",
        "scenario",
        "clients",
        "ok",
        "rej",
        "err",
        "rate/s",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms",
        "x ceiling",
        "commits/op",
        "cpu ms/op"
    );
    print_rows(rows);
    print_notes(rows);
    println!(
        "  rate/s: completed Reserve+Confirm per second (flash: Reserve answers per second); \
         x ceiling: rate / commit rate of the ceiling row at the same concurrency, one row per \
         connection (latency: ceiling-1); commits/op: pg_stat_database.xact_commit delta, less the bench's own \
         provisioning transactions, / operations (includes the coordinator's background sweeps \
         and stock-redis's reconciler reads); cpu ms/op: CPU time (user + system) of the \
         bench process, the bench database's PostgreSQL processes with the server's background \
         ones, and a local nats-server, over the whole row (its provisioning included), / \
         operations (in-process, database on this machine)"
    );
}

/// One line per scenario of [`print_table`]: its counts, rate, latency and ratios.
fn print_rows(rows: &[Row]) {
    for r in rows {
        if let Some(f) = &r.failure {
            println!("{:<18} FAILED: {f}", r.name);
            continue;
        }
        let Some(m) = &r.measured else { continue };
        let l = r.latency();
        let x = ratio(rows, r).map_or("-".into(), |x| format!("{x:.3}"));
        let c = commits_per_op(r).map_or("-".into(), |c| format!("{c:.2}"));
        let cpu = cpu_per_op(r).map_or("-".into(), |c| format!("{c:.2}"));
        println!(
            "{:<18} {:>7} {:>8} {:>6} {:>6} {:>10.1} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>10} {:>10} {:>10}",
            r.name,
            r.clients,
            m.recorder.ok(),
            m.recorder.rejected(),
            m.recorder.error_count(),
            r.rate(),
            l.p50,
            l.p90,
            l.p99,
            l.max,
            x,
            c,
            cpu
        );
    }
}

/// The lines below [`print_table`]'s rows: each scenario's errors, notes, flash outcome and
/// one-row baseline ratio.
fn print_notes(rows: &[Row]) {
    for r in rows {
        let Some(m) = &r.measured else { continue };
        for (kind, n) in &m.recorder.errors {
            println!("  {}: {n} x {kind}", r.name);
        }
        for note in &m.notes {
            println!("  {}: {note}", r.name);
        }
        if is_flash(&r.name) {
            println!(
                "  {}: winners {} losers {} oversell {} participant counts {}",
                r.name,
                m.recorder.ok(),
                m.recorder.rejected(),
                r.oversell(),
                m.extra
                    .get("participant_counts")
                    .map(|v| v.to_string())
                    .unwrap_or_default()
            );
        }
        if let Some(x) = ratio_one_row(rows, r) {
            println!(
                "  {}: {x:.3} x {}-one-row (every connection updating one shared row)",
                r.name,
                r.baseline.as_deref().unwrap_or_default()
            );
        }
    }
}

pub(super) fn to_json(args: &BenchArgs, transport: &Transport, rows: &[Row]) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            let l = r.latency();
            let m = r.measured.as_ref();
            serde_json::json!({
                "scenario": r.name,
                "clients": r.clients,
                "failure": r.failure,
                "ok": m.map(|m| m.recorder.ok()),
                "rejected": m.map(|m| m.recorder.rejected()),
                "errors": m.map(|m| &m.recorder.errors),
                "error_count": m.map(|m| m.recorder.error_count()),
                "elapsed_s": m.map(|m| m.elapsed.as_secs_f64()),
                "rate_per_s": r.rate(),
                "latency_ms": { "p50": l.p50, "p90": l.p90, "p99": l.p99, "max": l.max },
                "baseline": r.baseline,
                "ratio_to_ceiling": ratio(rows, r),
                "ratio_to_one_row_ceiling": ratio_one_row(rows, r),
                "xact_commit": r.xacts.map(|x| x.0),
                "xact_rollback": r.xacts.map(|x| x.1),
                "commits_per_op": commits_per_op(r),
                "notes": m.map(|m| &m.notes),
                "details": m.map(|m| &m.extra),
            })
        })
        .collect();
    serde_json::json!({
        "target": args.target.as_deref().unwrap_or("in-process"),
        "duration_s": args.duration.as_secs_f64(),
        "clients": args.clients,
        "tls": transport.is_tls(),
        "auth": transport.auth(),
        "tls_client_auth": transport.client_auth(),
        "results": rows,
    })
}
