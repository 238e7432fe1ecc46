//! `flash`: a flash sale, many clients racing through the coordinator for few units of one
//! stock item, checked for oversell against the participant's own counts. `flash-churn`: the
//! same sale where every other winner cancels, so units keep coming back while losers are
//! refused (the coordinator's sold-out hints set and dropped under concurrency), checked for
//! conservation: nothing oversold, nothing left held, every unit confirmed or available.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use super::{Ctx, Measured, Progress, describe, hold, is_capacity_refusal, put};
use crate::bench::credentials::BenchChannel;
use crate::bench::stats::{Outcome, Percentiles, Recorder, micros, percentiles};
use crate::participants::Kind;
use crate::proto::coordinator_client::CoordinatorClient;
use crate::proto::resource_admin_client::ResourceAdminClient;
use crate::proto::{
    CancelRequest, ConfirmRequest, GetResourceRequest, ReserveRequest, ResourceSpec, ResourceStatus,
};

/// `clients` clients, at most `concurrency` at once, each a distinct holder doing Reserve of
/// 1 unit of one item with `units` units at the stock participant `kind` (`stock` or
/// `stock-redis`), then Confirm if it won. Records Reserve latency (winners `Ok`, losers
/// `Rejected`); oversell comes from the participant's own counts. With `churn`, winners of
/// even index Cancel instead (counted `Ok` too) and the counts must show no unit held.
#[allow(clippy::too_many_arguments)]
pub async fn flash(
    ctx: Arc<Ctx>,
    kind: Kind,
    clients: usize,
    concurrency: usize,
    units: i64,
    churn: bool,
    progress: Arc<Progress>,
) -> Result<Measured, String> {
    let item = format!("{}-flash", ctx.run_id);
    let (stock_name, stock_admin) = sale_participant(&ctx, kind)?;
    let mut stock = ctx.transport.admin_client(&stock_admin)?;
    put(
        &mut stock,
        vec![ResourceSpec {
            resource: item.clone(),
            capacity: units,
        }],
    )
    .await
    .map_err(|e| format!("provisioning the flash item: {e}"))?;
    let channels = ctx
        .transport
        .channels(&ctx.endpoints.coordinator, concurrency.min(32))?;
    let start = Instant::now();
    let results: Vec<(usize, Outcome, Duration, bool)> = futures_util::stream::iter(0..clients)
        .map(|i| {
            let client = CoordinatorClient::new(channels[i % channels.len()].clone());
            let holder = format!("{}-flash-{i}", ctx.run_id);
            let holds = vec![hold(&stock_name, &item)];
            let progress = progress.clone();
            async move {
                let gives_back = churn && i % 2 == 0;
                let (outcome, took) = buy(client, holder, holds, gives_back).await;
                progress.count(&outcome);
                let bought = outcome == Outcome::Ok && !gives_back;
                (i, outcome, took, bought)
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    let elapsed = start.elapsed();
    let (recorder, bought, wave) = tally(results, concurrency, clients);
    let (counts, reads) = settled_counts(&mut stock, &item).await?;
    let mut notes = vec![wave.describe()];
    notes.extend(sale_notes(&counts, units, bought));
    Ok(Measured {
        extra: serde_json::json!({
            "participant": stock_name,
            "item": item,
            "units": units,
            "clients": clients,
            "concurrency": concurrency,
            "winners": recorder.ok(),
            "bought": bought,
            "left_held": counts.held,
            "losers": recorder.rejected(),
            "participant_counts": {
                "capacity": counts.capacity,
                "available": counts.available,
                "held": counts.held,
                "confirmed": counts.confirmed,
            },
            "oversell": (counts.confirmed + counts.held - units).max(0),
            "opening_wave": wave.json(),
        }),
        recorder,
        elapsed,
        notes,
        // The PutResources of the item and, on `stock`, each GetResource (an autocommit
        // read; stock-redis reads its counts from Redis).
        setup_xacts: if kind == Kind::Stock { 1 + reads } else { 1 },
    })
}

/// The stock participant `kind` of the deployment: its registered name and ResourceAdmin URL.
fn sale_participant(ctx: &Ctx, kind: Kind) -> Result<(String, String), String> {
    Ok(match kind {
        Kind::Stock => ctx.endpoints.stock.clone(),
        Kind::StockRedis => ctx
            .endpoints
            .stock_redis
            .clone()
            .ok_or("no stock-redis participant in this deployment")?,
        other => return Err(format!("flash runs on stock or stock-redis, not {other:?}")),
    })
}

/// The sale's clients' answers as recorded (Reserve latency, an error's aside), how many
/// bought a unit, and the opening wave.
fn tally(
    results: Vec<(usize, Outcome, Duration, bool)>,
    concurrency: usize,
    clients: usize,
) -> (Recorder, i64, OpeningWave) {
    let mut recorder = Recorder::default();
    let mut bought = 0i64;
    let mut by_start = Vec::with_capacity(results.len());
    for (i, outcome, took, b) in results {
        bought += i64::from(b);
        // An error has no latency in the summary either.
        if matches!(outcome, Outcome::Ok | Outcome::Rejected) {
            by_start.push((i, micros(took)));
        }
        recorder.record(outcome, took);
    }
    let wave = OpeningWave::of(&by_start, concurrency, clients);
    (recorder, bought, wave)
}

/// One client's turn at the sale: Reserve, then Confirm if it won (or Cancel, when it
/// `gives_back`); the outcome and the Reserve's latency.
async fn buy(
    mut client: CoordinatorClient<BenchChannel>,
    holder: String,
    holds: Vec<crate::proto::Hold>,
    gives_back: bool,
) -> (Outcome, Duration) {
    let confirmed = crate::proto::reservation::State::Confirmed as i32;
    let cancelled = crate::proto::reservation::State::Cancelled as i32;
    let t = Instant::now();
    let reserved = client
        .reserve(ReserveRequest {
            request_id: "bench".into(),
            holder,
            ttl: None,
            holds,
            labels: Default::default(),
            queue: None,
        })
        .await;
    let took = t.elapsed();
    let outcome = match reserved {
        Err(s) if is_capacity_refusal(&s) => Outcome::Rejected,
        Err(s) => Outcome::Error(describe("Reserve", &s)),
        Ok(r) if gives_back => {
            let r = r.into_inner();
            match client
                .cancel(CancelRequest {
                    reservation_id: r.id,
                    hold_token: r.hold_token,
                    reason: "bench: flash-churn gives the unit back".into(),
                })
                .await
            {
                Ok(c) if c.get_ref().state == cancelled => Outcome::Ok,
                Ok(c) => Outcome::Error(format!(
                    "Cancel: answered state {} (not CANCELLED)",
                    c.get_ref().state
                )),
                Err(s) => Outcome::Error(describe("Cancel", &s)),
            }
        }
        Ok(r) => {
            let r = r.into_inner();
            match client
                .confirm(ConfirmRequest {
                    reservation_id: r.id,
                    hold_token: r.hold_token,
                    payment: None,
                })
                .await
            {
                Ok(c) if c.get_ref().state == confirmed => Outcome::Ok,
                Ok(c) => Outcome::Error(format!(
                    "Confirm: answered state {} (not CONFIRMED)",
                    c.get_ref().state
                )),
                Err(s) => Outcome::Error(describe("Confirm", &s)),
            }
        }
    };
    (outcome, took)
}

/// The item's counts once nothing is held (or 15 s on), and how many reads that took.
async fn settled_counts(
    stock: &mut ResourceAdminClient<BenchChannel>,
    item: &str,
) -> Result<(ResourceStatus, i64), String> {
    // A Confirm left CONFIRMING (a participant call timed out) is finished by recovery: give
    // it up to 15 s, so the counts below are final rather than in flight.
    let settle_until = Instant::now() + Duration::from_secs(15);
    let mut reads = 0;
    loop {
        reads += 1;
        let counts = stock
            .get_resource(GetResourceRequest {
                resource: item.to_owned(),
            })
            .await
            .map_err(|s| describe("GetResource", &s))?
            .into_inner();
        if counts.held == 0 || Instant::now() > settle_until {
            return Ok((counts, reads));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// What the participant's settled counts say is wrong with a sale of `units` units in which
/// `bought` clients bought one.
fn sale_notes(counts: &ResourceStatus, units: i64, bought: i64) -> Vec<String> {
    let mut notes = Vec::new();
    if counts.confirmed != bought {
        notes.push(format!(
            "participant counts {} confirmed but {bought} clients bought",
            counts.confirmed,
        ));
    }
    // Conservation: a unit is confirmed, held or available, and after the sale none is held
    // (every loser's Try released, every canceller's unit back).
    if counts.held != 0 || counts.confirmed + counts.available != units {
        notes.push(format!(
            "conservation broken: {} held, {} confirmed + {} available != {units} units",
            counts.held, counts.confirmed, counts.available
        ));
    }
    if counts.available < 0 || counts.capacity != units {
        notes.push(format!(
            "participant counts are off: capacity {} available {}",
            counts.capacity, counts.available
        ));
    }
    notes
}

/// Where the sale's latency comes from: the Reserves started in its opening wave (the first
/// `concurrency`, all in flight at once before any answer, so before a refusal could set the
/// coordinator's sold-out hint) against the rest, and how many of the slowest 1% of answers
/// started in that wave.
#[derive(Debug, PartialEq)]
struct OpeningWave {
    /// Reserves started in the opening wave.
    wave: usize,
    /// Of those, the ones answered (an error has no latency).
    answered: usize,
    opening: Percentiles,
    rest: Percentiles,
    rest_count: usize,
    slowest: usize,
    slowest_in_wave: usize,
}

impl OpeningWave {
    /// `by_start`: (start index, latency in microseconds) of every answered Reserve, of
    /// `started` in all.
    fn of(by_start: &[(usize, u64)], wave: usize, started: usize) -> OpeningWave {
        let (opening, rest): (Vec<_>, Vec<_>) = by_start.iter().partition(|(i, _)| *i < wave);
        let micros = |v: &[&(usize, u64)]| v.iter().map(|(_, us)| *us).collect::<Vec<_>>();
        let mut slowest: Vec<(usize, u64)> = by_start.to_vec();
        slowest.sort_unstable_by_key(|s| std::cmp::Reverse(s.1));
        slowest.truncate(by_start.len().div_ceil(100));
        OpeningWave {
            wave: wave.min(started),
            answered: opening.len(),
            opening: percentiles(&micros(&opening)),
            rest: percentiles(&micros(&rest)),
            rest_count: rest.len(),
            slowest: slowest.len(),
            slowest_in_wave: slowest.iter().filter(|(i, _)| *i < wave).count(),
        }
    }

    fn describe(&self) -> String {
        let errors = if self.answered < self.wave {
            format!(", {} answered without an error", self.answered)
        } else {
            String::new()
        };
        format!(
            "opening wave (the first {} Reserves, in flight together{errors}): p50 {:.2} ms \
             p99 {:.2} ms; the other {}: p50 {:.2} ms p99 {:.2} ms; {} of the slowest {} \
             answers started in the opening wave",
            self.wave,
            self.opening.p50,
            self.opening.p99,
            self.rest_count,
            self.rest.p50,
            self.rest.p99,
            self.slowest_in_wave,
            self.slowest,
        )
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "requests": self.wave,
            "answered": self.answered,
            "p50_ms": self.opening.p50,
            "p99_ms": self.opening.p99,
            "rest_requests": self.rest_count,
            "rest_p50_ms": self.rest.p50,
            "rest_p99_ms": self.rest.p99,
            "slowest_1pct": self.slowest,
            "slowest_1pct_in_opening_wave": self.slowest_in_wave,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_opening_wave_is_split_from_the_rest_by_start_order() {
        // 200 answers; the first 10 started are slow (100..109 ms), the rest 1 ms, except
        // start 150 at 500 ms.
        let mut by_start: Vec<(usize, u64)> = (0..200)
            .map(|i| {
                (
                    i,
                    if i < 10 {
                        100_000 + i as u64 * 1000
                    } else {
                        1000
                    },
                )
            })
            .collect();
        by_start[150].1 = 500_000;
        by_start.reverse(); // answered in any order
        let w = OpeningWave::of(&by_start, 10, 202);
        assert_eq!((w.wave, w.answered, w.rest_count), (10, 10, 190));
        assert_eq!((w.opening.p50, w.opening.p99), (104.0, 109.0));
        assert_eq!((w.rest.p50, w.rest.p99), (1.0, 1.0));
        // The slowest 1% of 200 is 2 answers: start 150 (500 ms) and start 9 (109 ms).
        assert_eq!((w.slowest, w.slowest_in_wave), (2, 1));
        assert!(w.describe().contains("1 of the slowest 2 answers"));
        assert!(!w.describe().contains("answered without an error"));
        assert_eq!(w.json()["slowest_1pct_in_opening_wave"], 1);
        // Two of the wave's Reserves failed (no latency): the wave is still the first 10.
        let answered: Vec<(usize, u64)> = by_start.into_iter().filter(|(i, _)| *i > 1).collect();
        let w = OpeningWave::of(&answered, 10, 202);
        assert_eq!((w.wave, w.answered), (10, 8));
        assert!(
            w.describe()
                .contains("the first 10 Reserves, in flight together, 8 answered")
        );
    }
}
