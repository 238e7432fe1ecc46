//! `flash`: a flash sale, many clients racing through the coordinator for few units of one
//! stock item, checked for oversell against the participant's own counts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use super::{Ctx, Measured, Progress, describe, hold, is_capacity_refusal, put};
use crate::bench::stats::{Outcome, Recorder};
use crate::proto::coordinator_client::CoordinatorClient;
use crate::proto::{ConfirmRequest, GetResourceRequest, ReserveRequest, ResourceSpec};

/// `clients` clients, at most `concurrency` at once, each a distinct holder doing Reserve of
/// 1 unit of one item with `units` units at the stock participant `kind` (`stock` or
/// `stock-redis`), then Confirm if it won. Records Reserve latency (winners `Ok`, losers
/// `Rejected`); oversell comes from the participant's own counts.
pub async fn flash(
    ctx: Arc<Ctx>,
    kind: crate::participants::Kind,
    clients: usize,
    concurrency: usize,
    units: i64,
    progress: Arc<Progress>,
) -> Result<Measured, String> {
    use crate::participants::Kind;
    let item = format!("{}-flash", ctx.run_id);
    let (stock_name, stock_admin) = match kind {
        Kind::Stock => ctx.endpoints.stock.clone(),
        Kind::StockRedis => ctx
            .endpoints
            .stock_redis
            .clone()
            .ok_or("no stock-redis participant in this deployment")?,
        other => return Err(format!("flash runs on stock or stock-redis, not {other:?}")),
    };
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
    let confirmed = crate::proto::reservation::State::Confirmed as i32;
    let start = Instant::now();
    let results: Vec<(Outcome, Duration)> = futures_util::stream::iter(0..clients)
        .map(|i| {
            let mut client = CoordinatorClient::new(channels[i % channels.len()].clone());
            let holder = format!("{}-flash-{i}", ctx.run_id);
            let holds = vec![hold(&stock_name, &item)];
            let progress = progress.clone();
            async move {
                let t = Instant::now();
                let reserved = client
                    .reserve(ReserveRequest {
                        request_id: "bench".into(),
                        holder,
                        ttl: None,
                        holds,
                        labels: Default::default(),
                    })
                    .await;
                let took = t.elapsed();
                let outcome = match reserved {
                    Err(s) if is_capacity_refusal(&s) => Outcome::Rejected,
                    Err(s) => Outcome::Error(describe("Reserve", &s)),
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
                progress.count(&outcome);
                (outcome, took)
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    let elapsed = start.elapsed();
    let mut recorder = Recorder::default();
    for (outcome, took) in results {
        recorder.record(outcome, took);
    }
    // A Confirm left CONFIRMING (a participant call timed out) is finished by recovery: give
    // it up to 15 s, so the counts below are final rather than in flight.
    let settle_until = Instant::now() + Duration::from_secs(15);
    let mut reads = 0;
    let counts = loop {
        reads += 1;
        let counts = stock
            .get_resource(GetResourceRequest {
                resource: item.clone(),
            })
            .await
            .map_err(|s| describe("GetResource", &s))?
            .into_inner();
        if counts.held == 0 || Instant::now() > settle_until {
            break counts;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let sold = counts.confirmed + counts.held;
    let oversell = (sold - units).max(0);
    let mut notes = vec![];
    if counts.confirmed != recorder.ok() as i64 {
        notes.push(format!(
            "participant counts {} confirmed but {} clients won",
            counts.confirmed,
            recorder.ok()
        ));
    }
    if counts.available < 0 || counts.capacity != units {
        notes.push(format!(
            "participant counts are off: capacity {} available {}",
            counts.capacity, counts.available
        ));
    }
    Ok(Measured {
        extra: serde_json::json!({
            "participant": stock_name,
            "item": item,
            "units": units,
            "clients": clients,
            "concurrency": concurrency,
            "winners": recorder.ok(),
            "losers": recorder.rejected(),
            "participant_counts": {
                "capacity": counts.capacity,
                "available": counts.available,
                "held": counts.held,
                "confirmed": counts.confirmed,
            },
            "oversell": oversell,
        }),
        recorder,
        elapsed,
        notes,
        // The PutResources of the item and, on `stock`, each GetResource (an autocommit
        // read; stock-redis reads its counts from Redis).
        setup_xacts: if kind == Kind::Stock { 1 + reads } else { 1 },
    })
}
