//! `holdfast bench --events-nats-url URL`: the in-process deployment of a `*-nats` row, and of
//! every `latency`, `flash` and `waitlist` row (the conditions of the hot path's targets: events
//! and one NATS sink on), runs with a NATS JetStream sink (a stream and subject prefix of the
//! run's own, deleted afterwards), and the row reports the event lag: for every event the sink
//! delivered, the time from its write (database clock) to JetStream's acknowledgement,
//! p50/p99/max, after the sink has drained. A `*-without-events` row runs with the log's
//! triggers disabled: SPEC 10's bound is `throughput-*-nats` (log and sink) against it, same
//! run (at least 90 % of the rate); [`ratios`] also prints the log alone and the sink alone.
//! A `*-nats-backlog` row holds its sink back during the load and then times it delivering
//! the log alone: the CPU per delivered event of each process ([`EventsRun::report`]), which the
//! rate ratios, moved as much by the machine as by the sink, cannot show.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use sqlx::PgPool;
use tokio::sync::watch;

mod backlog;

use super::report::cpu_per_op;
use super::rounds::split_round;
use super::scenarios::Measured;
use super::stats;
use super::{BenchArgs, Row};
use crate::proto;
use crate::sinks::nats::{NATS_SINK_NAME, NatsSettings, NatsSink};
use crate::sinks::{Delivered, Sink};
use crate::store::{PgStore, Store};

/// How long the sink may take to catch up once the load stopped.
const DRAIN: Duration = Duration::from_secs(60);

/// The suffix of a row that runs with the NATS sink.
pub(super) const SUFFIX: &str = "-nats";

/// The suffix of a row whose sink waits until the load ended, then delivers the backlog.
pub(super) const BACKLOG_SUFFIX: &str = "-nats-backlog";

/// The suffix of a row whose deployment runs without the event log.
pub(super) const WITHOUT_SUFFIX: &str = "-without-events";

/// The triggers that append events (migrations `0012_events.sql`,
/// `0015_events_per_statement.sql`) switched off: a `-without-events` row disables them on its
/// fresh database (the next row starts on another).
const LOG_OFF: &str = "ALTER TABLE reservations DISABLE TRIGGER reservations_recorded_events; \
    ALTER TABLE reservations DISABLE TRIGGER reservations_changed_events; \
    ALTER TABLE extra_payments DISABLE TRIGGER extra_payments_recorded_event; \
    ALTER TABLE extra_payments DISABLE TRIGGER extra_payments_changed_event; \
    ALTER TABLE admin_audit DISABLE TRIGGER admin_audit_event";

/// The events of one `throughput` row of a run with `--events-nats-url`: how many it appended,
/// and a NATS sink (a `-nats` row) or no log at all (a `-without-events` row). The row runs on
/// a fresh database ([`super::RowSetup::fresh`]): its log starts empty, its triggers on, no
/// sink's cursor in it.
pub(super) struct EventsRun {
    /// The bench database's address (for a backlog's [`CpuMeter`]).
    database_url: String,
    /// A connection to the bench database, to count events and read the sink's progress with.
    pool: PgPool,
    /// A `-nats` row's sink and its settings.
    nats: Option<(NatsSettings, Arc<LagRecorder>)>,
    /// A `-nats-backlog` row's hold on its sink: `true` lets it deliver.
    backlog: Option<watch::Sender<bool>>,
}

impl EventsRun {
    /// For a `throughput` row of an in-process run with `--events-nats-url`, on the row's
    /// `fresh_database` (a row on a seeded one is refused): for a `-nats` row the NATS sink its
    /// deployment delivers to (a stream and prefix named after the run and row); for a
    /// `-without-events` row the log switched off.
    pub(super) async fn for_row(
        args: &BenchArgs,
        run_id: &str,
        row: &str,
        fresh_database: bool,
    ) -> Result<Option<EventsRun>, String> {
        let Some(url) = args.events_nats_url.as_deref() else {
            return Ok(None);
        };
        let Some(RowEvents {
            log_off,
            sink,
            backlog,
        }) = row_events(row)
        else {
            return Ok(None);
        };
        if !fresh_database {
            return Err(format!(
                "row {row}: the events' rows start on a fresh database (their counts and the \
                 sink's cursor start from an empty log)"
            ));
        }
        let pool = crate::db::connect_postgres(&args.database_url, 1)
            .await
            .map_err(|e| format!("connecting to the bench database: {e}"))?;
        if log_off {
            switch_log_off(&pool).await?;
        }
        let database_url = args.database_url.clone();
        if !sink {
            return Ok(Some(EventsRun {
                database_url,
                pool,
                nats: None,
                backlog: None,
            }));
        }
        let token: String = format!("{run_id}_{row}")
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let mut settings = NatsSettings::new(url);
        settings.subject_prefix = format!("holdfast_bench.{token}");
        settings.stream = format!("HOLDFAST_BENCH_{}", token.to_ascii_uppercase());
        settings.create_stream = true;
        let nats = NatsSink::connect(settings.clone())
            .await
            .map_err(|e| e.to_string())?;
        let (hold, open) = watch::channel(!backlog);
        let sink = Arc::new(LagRecorder {
            nats,
            lags: Mutex::new(Vec::new()),
            open,
        });
        Ok(Some(EventsRun {
            database_url,
            pool,
            nats: Some((settings, sink)),
            backlog: backlog.then_some(hold),
        }))
    }

    /// The sink, for the deployment's delivery loop (a `-nats` row's).
    pub(super) fn sink(&self) -> Option<Arc<dyn Sink>> {
        self.nats
            .as_ref()
            .map(|(_, sink)| sink.clone() as Arc<dyn Sink>)
    }

    /// Adds the events the row appended to `m`; with a sink, waits (at most [`DRAIN`]) until
    /// it delivered the whole log, then adds the lag percentiles.
    pub(super) async fn report(&self, m: &mut Measured) {
        // The count is a transaction of the database's count.
        m.setup_xacts += 1;
        match appended(&self.pool).await {
            Ok(n) => {
                let ops = (m.recorder.ok() + m.recorder.rejected()).max(1);
                m.notes.push(format!(
                    "events: {n} appended to the log ({:.2} per operation)",
                    n as f64 / ops as f64
                ));
                if let Some(extra) = m.extra.as_object_mut() {
                    extra.insert("events_appended".into(), n.into());
                }
            }
            Err(e) => m.notes.push(e),
        }
        let Some((settings, sink)) = &self.nats else {
            return;
        };
        if let Some(hold) = &self.backlog {
            return self.deliver_backlog(hold, m).await;
        }
        let started = Instant::now();
        let (drained, polls) = drain(&self.pool).await;
        // Two reads per poll, not the deployment's work.
        m.setup_xacts += 2 * polls;
        let lags: Vec<u64> = sink.lags.lock().map(|l| l.clone()).unwrap_or_default();
        let p = stats::percentiles(&lags);
        m.notes.push(format!(
            "events: {} delivered to NATS, lag (write to JetStream ack) p50 {:.1} ms p99 {:.1} ms max {:.1} ms; {}",
            lags.len(),
            p.p50,
            p.p99,
            p.max,
            match drained {
                Ok(()) => format!("caught up {:.1}s after the load", started.elapsed().as_secs_f64()),
                Err(e) => e,
            }
        ));
        if let Some(extra) = m.extra.as_object_mut() {
            extra.insert(
                "events_nats".into(),
                serde_json::json!({
                    "delivered": lags.len(),
                    "lag_ms": { "p50": p.p50, "p90": p.p90, "p99": p.p99, "max": p.max },
                    "stream": settings.stream,
                }),
            );
        }
    }

    /// Lets a held sink deliver: before the row's deployment stops (a row that failed was not
    /// measured, and its held delivery would keep the deployment from stopping).
    pub(super) fn release(&self) {
        if let Some(hold) = &self.backlog {
            hold.send_replace(true);
        }
    }

    /// Deletes the run's stream (once its deployment stopped publishing).
    pub(super) async fn finish(self) {
        self.pool.close().await;
        let Some((settings, _)) = self.nats else {
            return;
        };
        let deleted = async {
            let client = async_nats::connect(settings.url.as_str()).await.ok()?;
            async_nats::jetstream::new(client)
                .delete_stream(&settings.stream)
                .await
                .ok()
        };
        if tokio::time::timeout(Duration::from_secs(10), deleted)
            .await
            .ok()
            .flatten()
            .is_none()
        {
            eprintln!("bench: could not delete NATS stream {}", settings.stream);
        }
    }
}

/// How many events the log holds.
async fn appended(pool: &PgPool) -> Result<i64, String> {
    sqlx::query_scalar("SELECT count(*) FROM events")
        .fetch_one(pool)
        .await
        .map_err(|e| format!("counting the log's events: {e}"))
}

/// Disables the triggers that append events.
async fn switch_log_off(pool: &PgPool) -> Result<(), String> {
    sqlx::raw_sql(LOG_OFF)
        .execute(pool)
        .await
        .map(|_| ())
        .map_err(|e| format!("switching the event log's triggers off: {e}"))
}

/// What a row of a run with `--events-nats-url` does with events.
#[derive(Debug, PartialEq)]
struct RowEvents {
    /// A `-without-events` row: the log's triggers off.
    log_off: bool,
    /// A `-nats` or `-nats-backlog` row: a NATS sink.
    sink: bool,
    /// A `-nats-backlog` row: the sink held until the load ended.
    backlog: bool,
}

/// What row `row` (of any round) does with events: a `throughput` row as its name says; a
/// `latency`, `flash` or `waitlist` row delivers to the sink; `None` for the rest (`holds`
/// talks to a participant alone, `retention` runs on a seeded database).
fn row_events(row: &str) -> Option<RowEvents> {
    let (kind, _round) = split_round(row);
    if kind.starts_with("throughput-") {
        let backlog = kind.ends_with(BACKLOG_SUFFIX);
        return Some(RowEvents {
            log_off: kind.ends_with(WITHOUT_SUFFIX),
            sink: kind.ends_with(SUFFIX) || backlog,
            backlog,
        });
    }
    let with_sink = kind.starts_with("latency-") || kind.starts_with("flash") || kind == "waitlist";
    with_sink.then_some(RowEvents {
        log_off: false,
        sink: true,
        backlog: false,
    })
}

/// What `-nats` rows keep of their workload's rate without events (SPEC 10's bound), and what
/// the log alone and the sink alone keep, each with the CPU per operation; with several
/// rounds, per round and then the median round per workload.
pub(super) fn ratios(rows: &[Row]) -> Vec<String> {
    let ok = |name: &str| rows.iter().find(|r| r.name == name && r.failure.is_none());
    let mut lines = Vec::new();
    // Per workload, the rounds' "log and sink keep" and "log alone keeps".
    let mut kept: Vec<(&str, Vec<f64>, Vec<f64>)> = Vec::new();
    for with in rows.iter().filter(|r| r.failure.is_none()) {
        let (kind, round) = split_round(&with.name);
        let Some(workload) = kind.strip_suffix(SUFFIX) else {
            continue;
        };
        let at = match kept.iter().position(|(w, _, _)| *w == workload) {
            Some(at) => at,
            None => {
                kept.push((workload, Vec::new(), Vec::new()));
                kept.len() - 1
            }
        };
        let without = ok(&format!("{workload}{WITHOUT_SUFFIX}{round}"));
        let log = ok(&format!("{workload}{round}"));
        if let Some((ratio, said)) = without.and_then(|base| compare(with, base)) {
            kept[at].1.push(ratio);
            lines.push(format!(
                "events: {} (log and NATS sink) keeps {said}; bound: 0.9",
                with.name
            ));
        }
        if let (Some(log), Some(base)) = (log, without)
            && let Some((ratio, said)) = compare(log, base)
        {
            kept[at].2.push(ratio);
            lines.push(format!("events: {} (log alone) keeps {said}", log.name));
        }
        if let Some((_, said)) = log.and_then(|log| compare(with, log)) {
            lines.push(format!(
                "events: {} (the sink alone) keeps {said}",
                with.name
            ));
        }
    }
    for (workload, both, log) in kept {
        if both.len() > 1 {
            lines.push(format!(
                "events: {workload} over {} rounds: log and NATS sink keep {} of the rate without events, the log alone {}; bound: 0.9 (median)",
                both.len(),
                median_of(both),
                median_of(log),
            ));
        }
    }
    lines
}

/// What `with` keeps of `base`'s rate, and said with both rates and CPU per operation.
fn compare(with: &Row, base: &Row) -> Option<(f64, String)> {
    let (rate, base_rate) = (with.rate(), base.rate());
    let cpu = match (cpu_per_op(with), cpu_per_op(base)) {
        (Some(w), Some(b)) if b > 0.0 => {
            format!(", CPU per operation {b:.2} -> {w:.2} ms (x{:.3})", w / b)
        }
        _ => String::new(),
    };
    (base_rate > 0.0).then(|| {
        let ratio = rate / base_rate;
        let said = format!(
            "{ratio:.3} of {}'s rate ({rate:.0} vs {base_rate:.0} ops/s{cpu})",
            base.name
        );
        (ratio, said)
    })
}

/// `0.931 (rounds 0.850-0.970)`: the median of `ratios` and their range.
fn median_of(mut ratios: Vec<f64>) -> String {
    if ratios.is_empty() {
        return "(no round)".into();
    }
    ratios.sort_by(f64::total_cmp);
    let n = ratios.len();
    let median = if n % 2 == 1 {
        ratios[n / 2]
    } else {
        (ratios[n / 2 - 1] + ratios[n / 2]) / 2.0
    };
    format!("{median:.3} (rounds {:.3}-{:.3})", ratios[0], ratios[n - 1])
}

/// Until the sink's cursor reaches the latest sequence of the log; how many times it looked.
async fn drain(pool: &PgPool) -> (Result<(), String>, i64) {
    let mut polls = 0;
    let drained = drain_polling(pool, &mut polls).await;
    (drained, polls)
}

async fn drain_polling(pool: &PgPool, polls: &mut i64) -> Result<(), String> {
    let store = PgStore::from_pool(pool.clone());
    let log = store.event_log();
    let deadline = Instant::now() + DRAIN;
    loop {
        *polls += 1;
        let latest = log.latest_sequence().await.map_err(|e| e.to_string())?;
        let sinks = log.sinks().await.map_err(|e| e.to_string())?;
        let through = sinks
            .iter()
            .find(|s| s.name == NATS_SINK_NAME)
            .map_or(0, |s| s.delivered_through);
        if through >= latest {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "NOT caught up {}s after the load (delivered through {through} of {latest})",
                DRAIN.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The NATS sink, recording for each event it delivered how long after its write JetStream
/// acknowledged it; it delivers nothing until `open` (a backlog row's hold).
struct LagRecorder {
    nats: NatsSink,
    /// Microseconds.
    lags: Mutex<Vec<u64>>,
    open: watch::Receiver<bool>,
}

impl Sink for LagRecorder {
    fn name(&self) -> &str {
        self.nats.name()
    }

    fn deliver<'a>(
        &'a self,
        events: &'a [proto::Event],
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Delivered> + Send + 'a>> {
        Box::pin(async move {
            // Held, the delivery loop waits here with its first page (a few events: the load
            // had just begun), until the backlog is measured or the deployment stops
            // ([`EventsRun::release`]).
            let _ = self.open.clone().wait_for(|open| *open).await;
            let delivered = self.nats.deliver(events).await;
            let now = SystemTime::now();
            let lags = events[..delivered.delivered.min(events.len())]
                .iter()
                .filter_map(|e| e.occurred_at.as_ref())
                .filter_map(|t| {
                    let written = SystemTime::UNIX_EPOCH
                        + Duration::new(u64::try_from(t.seconds).ok()?, t.nanos.try_into().ok()?);
                    Some(stats::micros(
                        now.duration_since(written).unwrap_or_default(),
                    ))
                });
            if let Ok(mut recorded) = self.lags.lock() {
                recorded.extend(lags);
            }
            delivered
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rows_events_follow_its_name_in_every_round() {
        for round in ["", "#1", "#12"] {
            let of = |name: &str| row_events(&format!("{name}{round}"));
            let is = |log_off, sink, backlog| {
                Some(RowEvents {
                    log_off,
                    sink,
                    backlog,
                })
            };
            assert_eq!(of("throughput-noop-without-events"), is(true, false, false));
            assert_eq!(of("throughput-real"), is(false, false, false));
            assert_eq!(of("throughput-real-nats"), is(false, true, false));
            assert_eq!(of("throughput-noop-nats-backlog"), is(false, true, true));
            assert_eq!(of("latency-noop"), is(false, true, false));
        }
        for name in ["flash", "flash-stock-redis", "flash-churn", "waitlist"] {
            assert_eq!(
                row_events(name),
                Some(RowEvents {
                    log_off: false,
                    sink: true,
                    backlog: false,
                })
            );
        }
        for name in [
            "holds-stock",
            "holds-stock-redis",
            "retention-off",
            "ceiling-32",
        ] {
            assert_eq!(row_events(name), None, "{name}");
        }
    }

    /// A row of `ops` operations in one second.
    fn row(name: &str, ops: usize) -> Row {
        let measured = Measured {
            recorder: stats::Recorder {
                ok_micros: vec![1_000; ops],
                ..Default::default()
            },
            elapsed: Duration::from_secs(1),
            notes: Vec::new(),
            extra: serde_json::json!({}),
            setup_xacts: 0,
        };
        Row {
            name: name.into(),
            clients: 1,
            measured: Some(measured),
            baseline: None,
            xacts: None,
            failure: None,
        }
    }

    #[test]
    fn rounds_are_compared_within_themselves_and_summed_up_by_the_median() {
        let w = "throughput-noop";
        let rows = [
            row(&format!("{w}-without-events#1"), 100),
            row(&format!("{w}#1"), 95),
            row(&format!("{w}-nats#1"), 80),
            row(&format!("{w}-nats#2"), 180),
            row(&format!("{w}#2"), 190),
            row(&format!("{w}-without-events#2"), 200),
            row(&format!("{w}-without-events#3"), 100),
            row(&format!("{w}#3"), 100),
            row(&format!("{w}-nats#3"), 95),
        ];
        let lines = ratios(&rows);
        let has = |s: &str| lines.iter().any(|l| l.contains(s));
        assert!(
            has(&format!(
                "{w}-nats#2 (log and NATS sink) keeps 0.900 of {w}-without-events#2's"
            )),
            "{lines:#?}"
        );
        assert!(
            has(&format!(
                "{w}#1 (log alone) keeps 0.950 of {w}-without-events#1's"
            )),
            "{lines:#?}"
        );
        assert!(
            has(&format!(
                "{w} over 3 rounds: log and NATS sink keep 0.900 (rounds 0.800-0.950) of the rate without events, the log alone 0.950 (rounds 0.950-1.000)"
            )),
            "{lines:#?}"
        );
    }

    #[test]
    fn the_median_round_and_the_range() {
        assert_eq!(
            median_of(vec![0.95, 0.8, 0.9]),
            "0.900 (rounds 0.800-0.950)"
        );
        assert_eq!(median_of(vec![1.0, 0.8]), "0.900 (rounds 0.800-1.000)");
        assert_eq!(median_of(Vec::new()), "(no round)");
    }
}
