//! `retention`: Reserve latency while the coordinator's retention purges a large backlog of
//! finished reservations. [`seed_finished`] writes `rows` CONFIRMED reservations (two branches
//! each) finished 40 days ago straight into the database with `generate_series` (minutes, not
//! hours, of Reserves); [`reserve_loop`] times Reserves alone (each then confirmed, untimed)
//! on the noop participants; [`purge_watch`] follows the coordinator's own
//! `holdfast_retention_deleted_total{table="reservations"}` to tell how much was purged during
//! the timed window and when the purge finished. `bench/mod.rs` runs the loop once with
//! retention off and once with it purging, each on a deployment of its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::{Ctx, Measured, Progress, describe, hold, join_workers};
use crate::bench::stats::{Outcome, Recorder};
use crate::proto::coordinator_client::CoordinatorClient;
use crate::proto::{ConfirmRequest, ReserveRequest};

/// Rows seeded per statement (each its own transaction, progress printed between).
const SEED_CHUNK: u64 = 100_000;

/// Writes `rows` CONFIRMED reservations finished `days` days ago (their `updated_at` spread
/// over the day after), two CONFIRMED branches each, then ANALYZE. Answers how long it took.
pub(crate) async fn seed_finished(
    database_url: &str,
    rows: u64,
    days: u32,
) -> Result<Duration, String> {
    use sqlx::{ConnectOptions, Connection};
    let started = Instant::now();
    let mut conn = crate::db::postgres_options(database_url)
        .map_err(|e| format!("connecting to seed: {e}"))?
        .connect()
        .await
        .map_err(|e| format!("connecting to seed: {e}"))?;
    let mut from = 1u64;
    while from <= rows {
        let to = (from + SEED_CHUNK - 1).min(rows);
        sqlx::query(
            "WITH r AS ( \
                INSERT INTO reservations (id, request_id, holder, owner, state, ttl_ms, \
                                          created_at, updated_at, expires_at, token_digest, version) \
                SELECT gen_random_uuid(), 'seed-' || $3 || '-' || g, 'seed-holder-' || (g % 1000), '', \
                       'CONFIRMED', 600000, \
                       now() - $3 * interval '1 day', \
                       now() - $3 * interval '1 day' + (g % 86400) * interval '1 second', \
                       now() - $3 * interval '1 day' + interval '10 minutes', \
                       sha256(int8send(g)), 3 \
                FROM generate_series($1::bigint, $2::bigint) g \
                RETURNING id) \
             INSERT INTO branches (reservation_id, generation, position, branch_id, participant, \
                                   resource, quantity, state) \
             SELECT r.id, 0, p, gen_random_uuid(), \
                    CASE p WHEN 0 THEN 'noop-a' ELSE 'noop-b' END, 'r', 1, 'CONFIRMED' \
             FROM r, generate_series(0, 1) p",
        )
        .bind(i64::try_from(from).unwrap_or(i64::MAX))
        .bind(i64::try_from(to).unwrap_or(i64::MAX))
        .bind(f64::from(days))
        .execute(&mut conn)
        .await
        .map_err(|e| format!("seeding finished reservations: {e}"))?;
        if rows > SEED_CHUNK {
            eprintln!(
                "bench: seeded {to}/{rows} finished reservations ({:.0}s)",
                started.elapsed().as_secs_f64()
            );
        }
        from = to + 1;
    }
    sqlx::query("ANALYZE reservations, branches")
        .execute(&mut conn)
        .await
        .map_err(|e| format!("ANALYZE: {e}"))?;
    let _ = conn.close().await;
    Ok(started.elapsed())
}

/// Reservations the coordinator's retention deleted so far in this process.
pub(crate) fn purged_so_far() -> u64 {
    crate::telemetry::metrics_handle()
        .render()
        .lines()
        .find_map(|l| {
            l.strip_prefix("holdfast_retention_deleted_total{table=\"reservations\"}")?
                .trim()
                .parse::<f64>()
                .ok()
        })
        .map_or(0, |v| v as u64)
}

/// Follows the purge until `stop`: answers (deleted by the end, seconds from `start` until
/// `target` were deleted, if they were).
pub(crate) fn purge_watch(
    target: u64,
    start: Instant,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(u64, Option<f64>)> {
    let base = purged_so_far();
    tokio::spawn(async move {
        let mut done_at = None;
        loop {
            let n = purged_so_far().saturating_sub(base);
            if done_at.is_none() && n >= target {
                done_at = Some(start.elapsed().as_secs_f64());
            }
            if stop.load(Ordering::Relaxed) {
                return (n, done_at);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// `clients` clients for `duration`, each timing a Reserve of 2 noop holds, then confirming
/// it (untimed), so live holds do not pile up.
pub(crate) async fn reserve_loop(
    ctx: Arc<Ctx>,
    clients: usize,
    duration: Duration,
    progress: Arc<Progress>,
) -> Result<Measured, String> {
    let channels = ctx
        .transport
        .channels(&ctx.endpoints.coordinator, clients.min(32))?;
    let holds = match ctx.endpoints.noop.as_slice() {
        [one] => vec![hold(one, "r-a"), hold(one, "r-b")],
        [a, b, ..] => vec![hold(a, "r"), hold(b, "r")],
        [] => return Err("no noop participant".into()),
    };
    let start = Instant::now();
    let deadline = start + duration;
    let workers = (0..clients).map(|c| {
        let mut client = CoordinatorClient::new(channels[c % channels.len()].clone());
        let (progress, run_id, holds) = (progress.clone(), ctx.run_id.clone(), holds.clone());
        tokio::spawn(async move {
            let mut rec = Recorder::default();
            let mut i = 0u64;
            while Instant::now() < deadline {
                let t = Instant::now();
                let reserved = client
                    .reserve(ReserveRequest {
                        request_id: "bench".into(),
                        holder: format!("{run_id}-{c}-{i}"),
                        ttl: None,
                        holds: holds.clone(),
                        labels: Default::default(),
                        queue: None,
                    })
                    .await;
                let took = t.elapsed();
                let outcome = match reserved {
                    Ok(r) => {
                        let r = r.into_inner();
                        let confirmed = client
                            .confirm(ConfirmRequest {
                                reservation_id: r.id,
                                hold_token: r.hold_token,
                                payment: None,
                            })
                            .await;
                        match confirmed {
                            Ok(_) => Outcome::Ok,
                            Err(s) => Outcome::Error(describe("Confirm", &s)),
                        }
                    }
                    Err(s) => Outcome::Error(describe("Reserve", &s)),
                };
                progress.count(&outcome);
                let failed = matches!(outcome, Outcome::Error(_));
                rec.record(outcome, took);
                if failed {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                i += 1;
            }
            rec
        })
    });
    let recorder = join_workers(workers.collect()).await;
    Ok(Measured {
        recorder,
        elapsed: start.elapsed(),
        notes: Vec::new(),
        extra: serde_json::json!({}),
        setup_xacts: 0,
    })
}
