//! A `-nats-backlog` row's measurement: the sink, held back during the load, delivers the
//! log alone, timed, with the CPU each process spent per delivered event.

use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio::sync::watch;

use super::{DRAIN, EventsRun};
use crate::bench::cpu::CpuMeter;
use crate::bench::scenarios::Measured;
use crate::sinks::nats::NATS_SINK_NAME;
use crate::store::{PgStore, Store};

impl EventsRun {
    /// A `-nats-backlog` row, its load over: lets the held sink deliver the log and adds what
    /// that cost each process per event (`events_backlog` in the JSON). Autovacuum's work
    /// after the load is done first, so it does not run inside the measurement; the sink's
    /// progress is polled by its cursor alone (one primary-key read per 20 ms).
    pub(super) async fn deliver_backlog(&self, hold: &watch::Sender<bool>, m: &mut Measured) {
        let ready = async {
            let failed = |e: &dyn std::fmt::Display| e.to_string();
            sqlx::raw_sql("VACUUM")
                .execute(&self.pool)
                .await
                .map_err(|e| failed(&e))?;
            let store = PgStore::from_pool(self.pool.clone());
            let latest = store
                .event_log()
                .latest_sequence()
                .await
                .map_err(|e| failed(&e))?;
            let events: i64 = sqlx::query_scalar("SELECT count(*) FROM events")
                .fetch_one(&self.pool)
                .await
                .map_err(|e| failed(&e))?;
            Ok::<_, String>((latest, events))
        };
        let (latest, events) = match ready.await {
            Ok(ready) => ready,
            Err(e) => {
                return m
                    .notes
                    .push(format!("events: the backlog not measured: {e}"));
            }
        };
        m.setup_xacts += 3;
        let meter = CpuMeter::start(&self.database_url).await;
        let started = Instant::now();
        hold.send_replace(true);
        let (drained, polls) = delivered_through(&self.pool, latest).await;
        let seconds = started.elapsed().as_secs_f64();
        m.setup_xacts += polls + 2;
        let cpu = match meter {
            Some(meter) => meter.finish(u64::try_from(events).unwrap_or(0)).await,
            None => None,
        };
        if let Err(e) = drained {
            return m.notes.push(format!("events: the backlog {e}"));
        }
        let Some(cpu) = cpu else {
            return m
                .notes
                .push("events: no CPU reading for the backlog".into());
        };
        let us = |ms: f64| ms * 1000.0;
        m.notes.push(format!(
            "events: a backlog of {events} delivered to NATS in {seconds:.2}s ({:.0}/s); CPU per \
             event: holdfast {:.1} us, PostgreSQL {:.1} us, nats-server {:.1} us (total {:.1} us)",
            events as f64 / seconds.max(1e-9),
            us(cpu.holdfast),
            us(cpu.postgres),
            us(cpu.nats),
            us(cpu.total()),
        ));
        if let Some(extra) = m.extra.as_object_mut() {
            extra.insert(
                "events_backlog".into(),
                serde_json::json!({
                    "events": events,
                    "seconds": seconds,
                    "cpu_us_per_event": {
                        "total": us(cpu.total()),
                        "holdfast": us(cpu.holdfast),
                        "postgres": us(cpu.postgres),
                        "nats": us(cpu.nats),
                    },
                }),
            );
        }
    }
}

/// Until the NATS sink's cursor reaches `latest` (at most [`DRAIN`]); how many times it looked.
async fn delivered_through(pool: &PgPool, latest: i64) -> (Result<(), String>, i64) {
    let deadline = Instant::now() + DRAIN;
    let mut polls = 0;
    loop {
        polls += 1;
        let through: Result<Option<i64>, _> =
            sqlx::query_scalar("SELECT delivered_through FROM event_sinks WHERE name = $1")
                .bind(NATS_SINK_NAME)
                .fetch_optional(pool)
                .await;
        match through {
            Ok(Some(through)) if through >= latest => return (Ok(()), polls),
            Ok(_) if Instant::now() < deadline => {}
            Ok(through) => {
                let through = through.unwrap_or(0);
                let e = format!(
                    "was NOT delivered within {}s ({through} of {latest})",
                    DRAIN.as_secs()
                );
                return (Err(e), polls);
            }
            Err(e) => return (Err(format!("could not be followed: {e}")), polls),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
