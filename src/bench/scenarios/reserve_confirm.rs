//! `latency` and `throughput`: clients doing Reserve+Confirm of 2 holds in a loop, and the
//! per-client provisioning of the seats and stock those holds take (`Holds`). With seats and
//! stock (`-real`), each client's stock item is counted afterwards against the Confirms it was
//! answered (`conservation`): batching and group commit under concurrency must not lose or
//! duplicate a unit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::bench::credentials::BenchChannel;

use super::{Ctx, Measured, Progress, Workload, describe, hold, is_capacity_refusal, put};
use crate::bench::stats::{Outcome, Recorder};
use crate::proto::coordinator_client::CoordinatorClient;
use crate::proto::resource_admin_client::ResourceAdminClient;
use crate::proto::{ConfirmRequest, GetResourceRequest, Hold, ReserveRequest, ResourceSpec};

/// Units of each client's stock item: more than any run can take.
const SKU_UNITS: i64 = 1_000_000_000;

/// Reserve then Confirm; a refusal for capacity is `Rejected`, anything else not OK an error.
async fn reserve_confirm(
    client: &mut CoordinatorClient<BenchChannel>,
    holder: String,
    holds: Vec<Hold>,
) -> Outcome {
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
    let r = match reserved {
        Ok(r) => r.into_inner(),
        Err(s) if is_capacity_refusal(&s) => return Outcome::Rejected,
        Err(s) => return Outcome::Error(describe("Reserve", &s)),
    };
    let confirmed = client
        .confirm(ConfirmRequest {
            reservation_id: r.id,
            hold_token: r.hold_token,
            payment: None,
        })
        .await;
    match confirmed {
        Ok(c) if c.get_ref().state == crate::proto::reservation::State::Confirmed as i32 => {
            Outcome::Ok
        }
        Ok(c) => Outcome::Error(format!("Confirm: answered state {}", c.get_ref().state)),
        Err(s) => Outcome::Error(describe("Confirm", &s)),
    }
}

/// What one client holds each time, and the resources it provisioned for that.
struct Holds {
    workload: Workload,
    ctx: Arc<Ctx>,
    client: usize,
    seats_admin: Option<ResourceAdminClient<BenchChannel>>,
    seats_provisioned: usize,
    next_seat: usize,
    sku: String,
    top_ups: u64,
}

impl Holds {
    async fn prepare(ctx: Arc<Ctx>, workload: Workload, client: usize) -> Result<Holds, String> {
        let sku = format!("{}-sku-{client}", ctx.run_id);
        let mut holds = Holds {
            workload,
            ctx: ctx.clone(),
            client,
            seats_admin: None,
            seats_provisioned: 0,
            next_seat: 0,
            sku: sku.clone(),
            top_ups: 0,
        };
        if workload == Workload::Real {
            let mut stock = ctx.transport.admin_client(&ctx.endpoints.stock.1)?;
            put(
                &mut stock,
                vec![ResourceSpec {
                    resource: sku,
                    capacity: SKU_UNITS,
                }],
            )
            .await?;
            holds.seats_admin = Some(ctx.transport.admin_client(&ctx.endpoints.seats.1)?);
            holds.provision_seats().await?;
        }
        Ok(holds)
    }

    fn seat(&self, i: usize) -> String {
        format!("{}-seat-{}-{i}", self.ctx.run_id, self.client)
    }

    async fn provision_seats(&mut self) -> Result<(), String> {
        let from = self.seats_provisioned;
        let to = from + self.ctx.seat_block;
        let specs = (from..to)
            .map(|i| ResourceSpec {
                resource: self.seat(i),
                capacity: 1,
            })
            .collect();
        let admin = self
            .seats_admin
            .as_mut()
            .ok_or_else(|| "no seats admin client".to_owned())?;
        put(admin, specs).await?;
        self.seats_provisioned = to;
        Ok(())
    }

    async fn next(&mut self) -> Result<Vec<Hold>, String> {
        let ctx = self.ctx.clone();
        let e = &ctx.endpoints;
        match self.workload {
            Workload::Noop => Ok(match e.noop.as_slice() {
                [one] => vec![hold(one, "r-a"), hold(one, "r-b")],
                [a, b, ..] => vec![hold(a, "r"), hold(b, "r")],
                [] => return Err("no noop participant named".into()),
            }),
            Workload::Real => {
                if self.next_seat == self.seats_provisioned {
                    self.provision_seats().await?;
                    self.top_ups += 1;
                }
                let seat = self.seat(self.next_seat);
                self.next_seat += 1;
                Ok(vec![hold(&e.seats.0, &seat), hold(&e.stock.0, &self.sku)])
            }
        }
    }
}

/// `clients` clients, each doing Reserve+Confirm of 2 holds one after the other (a distinct
/// holder per reservation, so the per-holder hold limit never applies) for `duration`.
pub(crate) async fn reserve_confirm_loop(
    ctx: Arc<Ctx>,
    workload: Workload,
    clients: usize,
    duration: Duration,
    progress: Arc<Progress>,
) -> Result<Measured, String> {
    let channels = ctx
        .transport
        .channels(&ctx.endpoints.coordinator, clients.min(32))?;
    let prepared = futures_util::future::join_all(
        (0..clients).map(|c| Holds::prepare(ctx.clone(), workload, c)),
    )
    .await;
    let mut all_holds = Vec::with_capacity(clients);
    for p in prepared {
        all_holds.push(p.map_err(|e| format!("provisioning resources: {e}"))?);
    }
    let start = Instant::now();
    let deadline = start + duration;
    let workers = all_holds.into_iter().enumerate().map(|(c, holds)| {
        let client = CoordinatorClient::new(channels[c % channels.len()].clone());
        let name = format!("{}-{}-{c}", ctx.run_id, workload.name());
        tokio::spawn(client_loop(client, holds, name, deadline, progress.clone()))
    });
    let handles: Vec<_> = workers.collect();
    let mut recorder = Recorder::default();
    let mut top_ups = 0;
    let mut answered = Vec::with_capacity(clients);
    for h in handles {
        match h.await {
            Ok((rec, t, a)) => {
                recorder.merge(rec);
                top_ups += t;
                answered.push(a);
            }
            Err(e) => recorder.record(
                Outcome::Error(format!("worker task failed: {e}")),
                Duration::ZERO,
            ),
        }
    }
    let elapsed = start.elapsed();
    let mut notes = vec![];
    if top_ups > 0 {
        notes.push(format!(
            "{top_ups} seat top-ups of {} seats (PutResources) ran inside the timed window",
            ctx.seat_block
        ));
    }
    let mut extra = serde_json::json!({ "seat_top_ups": top_ups });
    if workload == Workload::Real {
        let violations = conservation(&ctx, &answered).await?;
        let confirmed: u64 = answered.iter().map(|a| a.ok).sum();
        notes.push(format!(
            "conservation: {} stock items counted after the run, {confirmed} units confirmed = \
             the Confirms answered OK, {} violations",
            answered.len(),
            violations.len()
        ));
        notes.extend(violations.iter().cloned());
        extra["conservation_violations"] = violations.len().into();
    }
    Ok(Measured {
        recorder,
        elapsed,
        notes,
        extra,
        // One PutResources transaction for the item and one per seat block, and (after the
        // run) one GetResource read per item.
        setup_xacts: match workload {
            Workload::Noop => 0,
            Workload::Real => (3 * clients as u64 + top_ups) as i64,
        },
    })
}

/// One client: Reserve+Confirm of its next holds until `deadline`, each reservation a
/// distinct holder `{name}-{i}`; what it recorded, its seat top-ups and what it was answered.
async fn client_loop(
    mut client: CoordinatorClient<BenchChannel>,
    mut holds: Holds,
    name: String,
    deadline: Instant,
    progress: Arc<Progress>,
) -> (Recorder, u64, Answered) {
    let mut rec = Recorder::default();
    let mut i = 0u64;
    while Instant::now() < deadline {
        let outcome = match holds.next().await {
            Ok(h) => {
                let holder = format!("{name}-{i}");
                let t = Instant::now();
                let outcome = match reserve_confirm(&mut client, holder, h).await {
                    Outcome::Rejected => {
                        Outcome::Error("Reserve: INSUFFICIENT_CAPACITY (unexpected)".into())
                    }
                    other => other,
                };
                progress.count(&outcome);
                rec.record(outcome.clone(), t.elapsed());
                outcome
            }
            Err(e) => {
                let outcome = Outcome::Error(format!("provisioning: {e}"));
                progress.count(&outcome);
                rec.record(outcome.clone(), Duration::ZERO);
                outcome
            }
        };
        if matches!(outcome, Outcome::Error(_)) {
            // Keep reporting, but do not spin on a broken deployment.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        i += 1;
    }
    let answered = Answered {
        sku: holds.sku.clone(),
        ok: rec.ok(),
        errors: rec.error_count(),
    };
    (rec, holds.top_ups, answered)
}

/// What one client was answered, and the stock item its holds took.
struct Answered {
    sku: String,
    ok: u64,
    errors: u64,
}

/// Each client's stock item against what the client was answered: every unit is available,
/// held or confirmed (together the item's capacity), at least the Confirms answered OK are
/// confirmed, and at most those plus the calls that failed (an error's outcome is unknown);
/// with no error, exactly the Confirms answered OK and nothing left held. One line per item
/// that breaks a rule.
async fn conservation(ctx: &Ctx, answered: &[Answered]) -> Result<Vec<String>, String> {
    let mut stock = ctx.transport.admin_client(&ctx.endpoints.stock.1)?;
    let mut violations = Vec::new();
    for a in answered {
        let counts = stock
            .get_resource(GetResourceRequest {
                resource: a.sku.clone(),
            })
            .await
            .map_err(|s| describe("GetResource", &s))?
            .into_inner();
        let (ok, errors) = (a.ok as i64, a.errors as i64);
        if !conserved(&counts, ok, errors) {
            violations.push(format!(
                "conservation broken on {}: capacity {} = available {} + held {} + confirmed {}? \
                 ({ok} Confirms answered OK, {errors} calls failed)",
                a.sku, counts.capacity, counts.available, counts.held, counts.confirmed
            ));
        }
    }
    Ok(violations)
}

/// The rules of [`conservation`] for one item: `ok` Confirms answered OK, `errors` calls that
/// failed (their outcome unknown).
fn conserved(counts: &crate::proto::ResourceStatus, ok: i64, errors: i64) -> bool {
    let total = counts.available + counts.held + counts.confirmed;
    let exact = errors > 0 || (counts.confirmed == ok && counts.held == 0);
    total == SKU_UNITS
        && counts.capacity == SKU_UNITS
        && counts.confirmed >= ok
        && counts.confirmed <= ok + errors
        && exact
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(available: i64, held: i64, confirmed: i64) -> crate::proto::ResourceStatus {
        crate::proto::ResourceStatus {
            capacity: SKU_UNITS,
            available,
            held,
            confirmed,
            ..Default::default()
        }
    }

    #[test]
    fn conservation_holds_only_when_the_counts_match_the_answers() {
        let n = SKU_UNITS;
        assert!(conserved(&counts(n - 7, 0, 7), 7, 0));
        // A unit lost (confirmed but not counted anywhere), one sold twice, one left held.
        assert!(!conserved(&counts(n - 8, 0, 7), 7, 0));
        assert!(!conserved(&counts(n - 8, 0, 8), 7, 0));
        assert!(!conserved(&counts(n - 8, 1, 7), 7, 0));
        // An answered Confirm whose unit is not confirmed.
        assert!(!conserved(&counts(n - 6, 0, 6), 7, 0));
        // With failed calls, up to one more unit each may be confirmed or held.
        assert!(conserved(&counts(n - 9, 1, 8), 7, 2));
        assert!(!conserved(&counts(n - 10, 0, 10), 7, 2));
    }
}
