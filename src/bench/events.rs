//! `holdfast bench --events-nats-url URL`: the in-process deployment of a `*-nats` row runs with
//! a NATS JetStream sink (a stream and subject prefix of the run's own, deleted afterwards), and
//! the row reports the event lag: for every event the sink delivered, the time from its write
//! (database clock) to JetStream's acknowledgement, p50/p99/max, after the sink has drained.
//! `throughput-*-nats` next to `throughput-*` (same run) is the cost of the sink (SPEC 10: at
//! least 90 % of the rate).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use sqlx::PgPool;

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

/// The NATS sink of one deployment, and the lags of what it delivered.
pub(super) struct EventsRun {
    settings: NatsSettings,
    sink: Arc<LagRecorder>,
    /// A connection to the bench database, to read the sink's progress with.
    pool: PgPool,
}

impl EventsRun {
    /// For a `-nats` row of an in-process run with `--events-nats-url`: the NATS sink its
    /// deployment delivers to (a stream and prefix named after the run and row), its cursor
    /// placed at the end of the log.
    pub(super) async fn for_row(
        args: &BenchArgs,
        run_id: &str,
        row: &str,
    ) -> Result<Option<EventsRun>, String> {
        let Some(url) = args.events_nats_url.as_deref() else {
            return Ok(None);
        };
        if !row.ends_with(SUFFIX) {
            return Ok(None);
        }
        let pool = crate::db::connect_postgres(&args.database_url, 1)
            .await
            .map_err(|e| format!("connecting to the bench database: {e}"))?;
        start_at_log_end(&pool).await?;
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
        let sink = Arc::new(LagRecorder {
            nats,
            lags: Mutex::new(Vec::new()),
        });
        Ok(Some(EventsRun {
            settings,
            sink,
            pool,
        }))
    }

    /// The sink, for the deployment's delivery loop.
    pub(super) fn sink(&self) -> Arc<dyn Sink> {
        self.sink.clone()
    }

    /// Waits (at most [`DRAIN`]) until the sink delivered the whole log, then adds the lag
    /// percentiles to `m`.
    pub(super) async fn report(&self, m: &mut Measured) {
        let started = Instant::now();
        let (drained, polls) = drain(&self.pool).await;
        // Two reads per poll, not the deployment's work.
        m.setup_xacts += 2 * polls;
        let lags: Vec<u64> = self.sink.lags.lock().map(|l| l.clone()).unwrap_or_default();
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
                    "stream": self.settings.stream,
                }),
            );
        }
    }

    /// Deletes the run's stream (once its deployment stopped publishing).
    pub(super) async fn finish(self) {
        self.pool.close().await;
        let deleted = async {
            let client = async_nats::connect(self.settings.url.as_str()).await.ok()?;
            async_nats::jetstream::new(client)
                .delete_stream(&self.settings.stream)
                .await
                .ok()
        };
        if tokio::time::timeout(Duration::from_secs(10), deleted)
            .await
            .ok()
            .flatten()
            .is_none()
        {
            eprintln!(
                "bench: could not delete NATS stream {}",
                self.settings.stream
            );
        }
    }
}

/// "events: throughput-real-nats keeps x of throughput-real's rate" for each pair that ran.
pub(super) fn ratios(rows: &[Row]) -> Vec<String> {
    let ok = |name: &str| rows.iter().find(|r| r.name == name && r.failure.is_none());
    rows.iter()
        .filter_map(|with| {
            let without = ok(with.name.strip_suffix(SUFFIX)?)?;
            let (rate, base) = (with.rate(), without.rate());
            (with.failure.is_none() && base > 0.0).then(|| {
                format!(
                    "events: {} keeps {:.3} of {}'s rate with the NATS sink ({rate:.0} vs {base:.0} ops/s; bound: 0.9)",
                    with.name,
                    rate / base,
                    without.name
                )
            })
        })
        .collect()
}

/// Places the NATS sink's cursor at the end of `pool`'s log, its lease free: the rows before
/// this one wrote events no sink delivered, and an earlier `-nats` row's stopped deployment
/// still holds the lease. The bench owns this database (it reset it).
async fn start_at_log_end(pool: &PgPool) -> Result<(), String> {
    sqlx::query(
        "INSERT INTO event_sinks (name, delivered_through) \
         VALUES ($1, (SELECT coalesce(max(sequence), 0) FROM events)) \
         ON CONFLICT (name) DO UPDATE SET delivered_through = EXCLUDED.delivered_through, \
             lease_owner = NULL, lease_until = NULL, failing_since = NULL, last_error = NULL",
    )
    .bind(NATS_SINK_NAME)
    .execute(pool)
    .await
    .map(|_| ())
    .map_err(|e| format!("placing the NATS sink's cursor: {e}"))
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
/// acknowledged it.
struct LagRecorder {
    nats: NatsSink,
    /// Microseconds.
    lags: Mutex<Vec<u64>>,
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
