//! [`ParticipantService`]: the generic `tcc.v1.Participant` around a [`Resource`], which runs
//! every phase as barrier + business change in one local transaction.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{Pool, Postgres};
use tonic::{Request, Response, Status};

use super::barrier::{Backend, BarrierPhase, BarrierRow};
use super::{
    BranchAnswer, BranchCtx, BranchKey, ConfirmOutcome, Item, Resource, ResourceError, Slot,
    TryAnswer, TryBranch,
};
use crate::proto::participant_server::{Participant, ParticipantServer};
use crate::proto::{BranchRequest, BranchResponse, TryRequest, TryResponse, branch, try_response};

/// How long after `expires_at` a participant keeps an unreleased hold before reclaiming it.
pub const DEFAULT_ORPHAN_GRACE: Duration = Duration::from_secs(3600);

/// Most orphans reclaimed by one lazy reclaim inside a rejected Try.
const LAZY_RECLAIM_BATCH: usize = 100;
/// Longest identifier accepted (reservation, branch, holder, resource), in bytes.
const MAX_ID_BYTES: usize = 128;
/// Most items in one Try (the coordinator allows 64 holds per reservation).
const MAX_ITEMS: usize = 64;

/// A `tcc.v1.Participant` backed by a [`Resource`] and the barrier table.
///
/// Cheap to clone. Serve it with [`ParticipantService::into_server`]; the domain-level
/// methods ([`try_branch`](Self::try_branch), [`confirm_branch`](Self::confirm_branch),
/// [`cancel_branch`](Self::cancel_branch)) are public for in-process use and tests.
///
/// `DB` is the database ([`sqlx::Postgres`] by default, or [`sqlx::Sqlite`]).
pub struct ParticipantService<R, DB: Backend = Postgres> {
    name: Arc<str>,
    resource: Arc<R>,
    pool: Pool<DB>,
    orphan_grace: Duration,
}

impl<R, DB: Backend> Clone for ParticipantService<R, DB> {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            resource: self.resource.clone(),
            pool: self.pool.clone(),
            orphan_grace: self.orphan_grace,
        }
    }
}

impl<DB: Backend, R: Resource<DB>> ParticipantService<R, DB> {
    /// A participant called `name` (scopes its barrier rows, so several participants may
    /// share one database) with the default orphan grace of one hour.
    ///
    /// The database must carry the participants' schema (`crate::participants::MIGRATOR`).
    pub fn new(name: impl Into<String>, resource: R, pool: Pool<DB>) -> Self {
        Self {
            name: Arc::from(name.into()),
            resource: Arc::new(resource),
            pool,
            orphan_grace: DEFAULT_ORPHAN_GRACE,
        }
    }

    /// Sets how long after `expires_at` an unreleased hold is kept before it may be reclaimed.
    pub fn with_orphan_grace(mut self, orphan_grace: Duration) -> Self {
        self.orphan_grace = orphan_grace;
        self
    }

    /// The participant's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The business logic, shared (e.g. with an admin service).
    pub fn resource_arc(&self) -> Arc<R> {
        self.resource.clone()
    }

    /// The tonic server for this service.
    pub fn into_server(self) -> ParticipantServer<Self> {
        ParticipantServer::new(self)
    }

    /// Try: holds the branch's items unless the branch was already decided.
    ///
    /// Returns the first answer for a repeat, `Rejected` for a Try arriving after the branch
    /// was cancelled. A business rejection (or SQLSTATE 23P01) rolls the business change back
    /// and records the rejection. When a rejected Try finds orphaned holds, they are reclaimed
    /// and the Try is run once more. Invalid input is `ResourceError::InvalidArgument`.
    pub async fn try_branch(&self, request: TryBranch) -> Result<TryAnswer, ResourceError> {
        let branch = self.branch_ctx(request)?;
        let branch = &branch;
        let mut reclaimed = false;
        // First the business change, then the barrier row with its answer, in one transaction:
        // a first Try (the common case) costs no extra statement. When the branch already has
        // a row (a repeat, or a Cancel that came first) or the business change fails (it may
        // collide with the first call's own rows), that is undone and the call runs barrier
        // first: lock the row, answer from it if decided, else hold under the lock.
        let mut barrier_first = false;
        if self.resource.barrier_only() {
            // No business change: the barrier row alone, one statement, no transaction.
            let mut conn = self.pool.acquire().await?;
            let held = TryAnswer::Held;
            if DB::insert_try(&mut *conn, &self.name, branch, BarrierPhase::Held, &held).await? {
                return Ok(held);
            }
            barrier_first = true;
        }
        loop {
            let mut tx = DB::begin_write(&self.pool).await?;
            if barrier_first {
                let found = DB::lock(&mut *tx, &self.name, &branch.key).await?;
                if found.phase != BarrierPhase::Trying {
                    let answer = self.answer_decided_try(&mut *tx, branch, &found).await?;
                    tx.commit().await?;
                    return Ok(answer);
                }
            }
            let outcome = match self.resource.try_hold(&mut *tx, branch).await {
                Ok(outcome) => outcome,
                Err(err) if err.is_exclusion_violation() => {
                    TryAnswer::Rejected("overlaps an existing hold".to_owned())
                }
                // Dropping `tx` rolls everything back: no barrier row survives.
                Err(err) if barrier_first => return Err(err),
                Err(_) => {
                    tx.rollback().await?;
                    barrier_first = true;
                    continue;
                }
            };
            let TryAnswer::Rejected(reason) = outcome else {
                let recorded = if barrier_first {
                    DB::record_try(&mut *tx, &self.name, branch, BarrierPhase::Held, &outcome)
                        .await?;
                    true
                } else {
                    DB::insert_try(&mut *tx, &self.name, branch, BarrierPhase::Held, &outcome)
                        .await?
                };
                if recorded {
                    tx.commit().await?;
                    return Ok(outcome);
                }
                tx.rollback().await?;
                barrier_first = true;
                continue;
            };
            // Rejected: undo the business change, then record the rejection (or find the
            // answer recorded first) in a transaction of its own.
            tx.rollback().await?;
            if !reclaimed && self.orphans_exist().await? {
                // Reclaim outside any transaction of ours: it locks other branches and their
                // resources, which must not nest inside our resource locks.
                reclaimed = true;
                self.reclaim(LAZY_RECLAIM_BATCH, false).await?;
                continue;
            }
            let mut tx = DB::begin_write(&self.pool).await?;
            let found = DB::lock(&mut *tx, &self.name, &branch.key).await?;
            let answer = if found.phase == BarrierPhase::Trying {
                let rejected = TryAnswer::Rejected(reason);
                DB::record_try(
                    &mut *tx,
                    &self.name,
                    branch,
                    BarrierPhase::Rejected,
                    &rejected,
                )
                .await?;
                rejected
            } else {
                // A concurrent duplicate decided it meanwhile: its answer is the first one.
                self.answer_decided_try(&mut *tx, branch, &found).await?
            };
            tx.commit().await?;
            return Ok(answer);
        }
    }

    /// The answer to a Try whose branch is already past `Trying`: the first answer, or a
    /// rejection (recorded) when the branch was released before any Try.
    async fn answer_decided_try(
        &self,
        tx: &mut DB::Connection,
        branch: &BranchCtx,
        found: &BarrierRow,
    ) -> Result<TryAnswer, ResourceError> {
        Ok(match &found.try_answer {
            Some(answer) => answer.clone(),
            None => {
                // Decided before any Try (Cancel or Confirm came first): refuse for good.
                let reason = "branch was already released before its Try arrived";
                DB::record_late_try(tx, &self.name, &branch.key, reason).await?;
                TryAnswer::Rejected(reason.to_owned())
            }
        })
    }

    async fn orphans_exist(&self) -> Result<bool, ResourceError> {
        let mut conn = self.pool.acquire().await?;
        DB::orphans_exist(&mut *conn, &self.name).await
    }

    /// Confirm: finalises a held branch. A repeat answers the same; after Cancel it answers
    /// `Cancelled` and changes nothing; a branch whose hold is gone (reclaimed, rejected, or
    /// never tried) answers `HoldLost`.
    pub async fn confirm_branch(&self, key: &BranchKey) -> Result<BranchAnswer, ResourceError> {
        if self.resource.barrier_only() && self.advance_alone(key, BarrierPhase::Confirmed).await? {
            return Ok(BranchAnswer::Confirmed);
        }
        let mut tx = DB::begin_write(&self.pool).await?;
        // The common case, a held branch, in one barrier statement (a barrier-only resource's
        // was tried above).
        let held = if self.resource.barrier_only() {
            None
        } else {
            DB::advance_held(&mut *tx, &self.name, key, BarrierPhase::Confirmed).await?
        };
        if let Some(found) = held {
            return match self.resource.confirm(&mut *tx, &found.ctx(key)?).await? {
                ConfirmOutcome::Confirmed => {
                    tx.commit().await?;
                    Ok(BranchAnswer::Confirmed)
                }
                ConfirmOutcome::HoldLost => {
                    tx.rollback().await?;
                    self.settle_lost_hold(key).await
                }
            };
        }
        let found = DB::lock_existing(&mut *tx, &self.name, key).await?;
        let answer = match found.phase {
            BarrierPhase::Trying => {
                // Nothing was ever held; recording it also refuses a late Try.
                DB::set_phase(&mut *tx, &self.name, key, BarrierPhase::HoldLost).await?;
                BranchAnswer::HoldLost
            }
            BarrierPhase::Held => {
                let ctx = found.ctx(key)?;
                match self.resource.confirm(&mut *tx, &ctx).await? {
                    ConfirmOutcome::Confirmed => {
                        DB::set_phase(&mut *tx, &self.name, key, BarrierPhase::Confirmed).await?;
                        BranchAnswer::Confirmed
                    }
                    ConfirmOutcome::HoldLost => {
                        // Undo a partial confirm, then release what is left in a transaction
                        // of its own, so nothing hangs. Rare: the common path needs no savepoint.
                        tx.rollback().await?;
                        return self.settle_lost_hold(key).await;
                    }
                }
            }
            BarrierPhase::Confirmed => BranchAnswer::Confirmed,
            BarrierPhase::Cancelled => BranchAnswer::Cancelled,
            BarrierPhase::Rejected | BarrierPhase::HoldLost => BranchAnswer::HoldLost,
        };
        tx.commit().await?;
        Ok(answer)
    }

    /// A barrier-only resource has no business change to keep with the barrier's: a held
    /// branch moves to `to` in one statement of its own, no transaction. False: not held.
    async fn advance_alone(
        &self,
        key: &BranchKey,
        to: BarrierPhase,
    ) -> Result<bool, ResourceError> {
        let mut conn = self.pool.acquire().await?;
        Ok(DB::advance_held(&mut *conn, &self.name, key, to)
            .await?
            .is_some())
    }

    /// A Confirm found part of a held branch gone: release the rest and record `HoldLost`
    /// (unless a concurrent call settled the branch meanwhile; then its answer stands).
    async fn settle_lost_hold(&self, key: &BranchKey) -> Result<BranchAnswer, ResourceError> {
        let mut tx = DB::begin_write(&self.pool).await?;
        let found = DB::lock_existing(&mut *tx, &self.name, key).await?;
        let answer = match found.phase {
            BarrierPhase::Held => {
                self.resource.cancel(&mut *tx, &found.ctx(key)?).await?;
                DB::set_phase(&mut *tx, &self.name, key, BarrierPhase::HoldLost).await?;
                tracing::warn!(
                    participant = %self.name,
                    reservation_id = %key.reservation_id,
                    branch_id = %key.branch_id,
                    "confirm found the hold gone"
                );
                BranchAnswer::HoldLost
            }
            BarrierPhase::Confirmed => BranchAnswer::Confirmed,
            BarrierPhase::Cancelled => BranchAnswer::Cancelled,
            BarrierPhase::Trying | BarrierPhase::Rejected | BarrierPhase::HoldLost => {
                BranchAnswer::HoldLost
            }
        };
        tx.commit().await?;
        Ok(answer)
    }

    /// Cancel: releases the branch. Before its Try it records the branch as cancelled (the
    /// late Try is rejected); after Confirm it answers `Confirmed` and changes nothing.
    pub async fn cancel_branch(&self, key: &BranchKey) -> Result<BranchAnswer, ResourceError> {
        if self.resource.barrier_only() && self.advance_alone(key, BarrierPhase::Cancelled).await? {
            return Ok(BranchAnswer::Cancelled);
        }
        let mut tx = DB::begin_write(&self.pool).await?;
        // The common case, a held branch, in one barrier statement (a barrier-only resource's
        // was tried above).
        let held = if self.resource.barrier_only() {
            None
        } else {
            DB::advance_held(&mut *tx, &self.name, key, BarrierPhase::Cancelled).await?
        };
        if let Some(found) = held {
            self.resource.cancel(&mut *tx, &found.ctx(key)?).await?;
            tx.commit().await?;
            return Ok(BranchAnswer::Cancelled);
        }
        let found = DB::lock_existing(&mut *tx, &self.name, key).await?;
        let answer = match found.phase {
            BarrierPhase::Trying | BarrierPhase::Rejected => {
                DB::set_phase(&mut *tx, &self.name, key, BarrierPhase::Cancelled).await?;
                BranchAnswer::Cancelled
            }
            BarrierPhase::Held => {
                self.resource.cancel(&mut *tx, &found.ctx(key)?).await?;
                DB::set_phase(&mut *tx, &self.name, key, BarrierPhase::Cancelled).await?;
                BranchAnswer::Cancelled
            }
            BarrierPhase::Cancelled => BranchAnswer::Cancelled,
            BarrierPhase::Confirmed => BranchAnswer::Confirmed,
            // Already released by the reclaim; nothing is held, nothing to change.
            BarrierPhase::HoldLost => BranchAnswer::Cancelled,
        };
        tx.commit().await?;
        Ok(answer)
    }

    /// Releases up to `limit` holds past `expires_at + orphan_grace` that the coordinator never
    /// released, each in its own transaction; their later Confirm answers `HOLD_LOST`.
    /// Returns how many were reclaimed. Safe to run concurrently with anything: branches
    /// another call is deciding are skipped.
    pub async fn reclaim_orphans(&self, limit: usize) -> Result<usize, ResourceError> {
        self.reclaim(limit, true).await
    }

    async fn reclaim(&self, limit: usize, skip_locked: bool) -> Result<usize, ResourceError> {
        let mut reclaimed = 0;
        while reclaimed < limit {
            let mut tx = DB::begin_write(&self.pool).await?;
            let Some((key, found)) =
                DB::lock_next_orphan(&mut *tx, &self.name, skip_locked).await?
            else {
                break;
            };
            self.resource.cancel(&mut *tx, &found.ctx(&key)?).await?;
            DB::set_phase(&mut *tx, &self.name, &key, BarrierPhase::HoldLost).await?;
            tx.commit().await?;
            tracing::warn!(
                participant = %self.name,
                reservation_id = %key.reservation_id,
                branch_id = %key.branch_id,
                "reclaimed an orphaned hold past expires_at + orphan_grace"
            );
            reclaimed += 1;
        }
        Ok(reclaimed)
    }

    /// Spawns a task reclaiming orphans every `every` until the returned handle is aborted.
    /// Failures are logged and retried on the next tick.
    pub fn spawn_reclaimer(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            // The first sweep waits a period: startup is busy enough.
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if let Err(err) = this.reclaim_orphans(LAZY_RECLAIM_BATCH).await {
                    tracing::warn!(participant = %this.name, error = %err, "orphan reclaim failed");
                }
            }
        })
    }

    /// Validates a Try (naming the offending field), sorts its items into lock order and
    /// computes how long the hold is kept (`expires_at + orphan_grace`).
    fn branch_ctx(&self, request: TryBranch) -> Result<BranchCtx, ResourceError> {
        check_id("reservation_id", &request.key.reservation_id)?;
        check_id("branch_id", &request.key.branch_id)?;
        check_id("holder", &request.holder)?;
        let mut items = request.items;
        check_items(&items)?;
        // Before sorting, so field names index the caller's list.
        self.resource.validate(&items)?;
        // Items arrive sorted; sort again so a careless caller cannot break the lock order.
        items.sort_by(|a, b| (&a.resource, a.during).cmp(&(&b.resource, b.during)));
        let grace = chrono::Duration::from_std(self.orphan_grace)
            .map_err(|_| ResourceError::Internal("orphan grace out of range".to_owned()))?;
        let hold_until = request
            .expires_at
            .checked_add_signed(grace)
            .ok_or_else(|| ResourceError::invalid("expires_at", "is out of range"))?;
        Ok(BranchCtx {
            key: request.key,
            holder: request.holder,
            items,
            expires_at: request.expires_at,
            hold_until,
        })
    }
}

/// Converts a wire Try to domain terms; only wire-level checks (timestamps) happen here.
fn try_branch_from_wire(req: TryRequest) -> Result<TryBranch, ResourceError> {
    let expires_at = req
        .expires_at
        .ok_or_else(|| ResourceError::invalid("expires_at", "is required"))
        .and_then(|ts| timestamp("expires_at", ts))?;
    let items = req
        .items
        .into_iter()
        .enumerate()
        .map(|(i, hold)| {
            let during = match hold.during {
                None => None,
                Some(interval) => {
                    let at = |field: &str, ts: Option<prost_types::Timestamp>| {
                        let field = format!("items[{i}].during.{field}");
                        ts.ok_or_else(|| ResourceError::invalid(&field, "is required"))
                            .and_then(|ts| timestamp(&field, ts))
                    };
                    Some(Slot {
                        start: at("start", interval.start)?,
                        end: at("end", interval.end)?,
                    })
                }
            };
            Ok(Item {
                resource: hold.resource,
                quantity: hold.quantity,
                during,
            })
        })
        .collect::<Result<Vec<_>, ResourceError>>()?;
    Ok(TryBranch {
        key: BranchKey {
            reservation_id: req.reservation_id,
            branch_id: req.branch_id,
        },
        holder: req.holder,
        items,
        expires_at,
    })
}

fn check_id(field: &str, value: &str) -> Result<(), ResourceError> {
    if value.is_empty() {
        return Err(ResourceError::invalid(field, "is required"));
    }
    if value.len() > MAX_ID_BYTES {
        return Err(ResourceError::invalid(
            field,
            format!("must be at most {MAX_ID_BYTES} bytes"),
        ));
    }
    Ok(())
}

fn key_from_parts(reservation_id: String, branch_id: String) -> Result<BranchKey, ResourceError> {
    check_id("reservation_id", &reservation_id)?;
    check_id("branch_id", &branch_id)?;
    Ok(BranchKey {
        reservation_id,
        branch_id,
    })
}

/// Converts a wire timestamp, truncated to microseconds (Postgres precision) so stored and
/// compared values agree.
fn timestamp(field: &str, ts: prost_types::Timestamp) -> Result<DateTime<Utc>, ResourceError> {
    let invalid = || ResourceError::invalid(field, "is not a valid timestamp");
    let nanos = u32::try_from(ts.nanos).map_err(|_| invalid())?;
    let at = DateTime::<Utc>::from_timestamp(ts.seconds, nanos).ok_or_else(invalid)?;
    DateTime::<Utc>::from_timestamp_micros(at.timestamp_micros()).ok_or_else(invalid)
}

/// Checks what every participant needs of items: some, not too many, named, positive,
/// proper slots, no duplicates.
fn check_items(items: &[Item]) -> Result<(), ResourceError> {
    if items.is_empty() {
        return Err(ResourceError::invalid("items", "must not be empty"));
    }
    if items.len() > MAX_ITEMS {
        return Err(ResourceError::invalid(
            "items",
            format!("must hold at most {MAX_ITEMS} items"),
        ));
    }
    let mut seen: HashMap<(&str, Option<Slot>), usize> = HashMap::new();
    for (i, item) in items.iter().enumerate() {
        check_id(&format!("items[{i}].resource"), &item.resource)?;
        if item.quantity < 1 {
            return Err(ResourceError::invalid(
                format!("items[{i}].quantity"),
                "must be >= 1",
            ));
        }
        if let Some(slot) = item.during
            && slot.end <= slot.start
        {
            return Err(ResourceError::invalid(
                format!("items[{i}].during.end"),
                "must be after during.start",
            ));
        }
        if let Some(first) = seen.insert((item.resource.as_str(), item.during), i) {
            return Err(ResourceError::invalid(
                format!("items[{i}]"),
                format!("duplicates items[{first}]"),
            ));
        }
    }
    Ok(())
}

fn branch_response(answer: BranchAnswer) -> Response<BranchResponse> {
    let state = match answer {
        BranchAnswer::Confirmed => branch::State::Confirmed,
        BranchAnswer::Cancelled => branch::State::Cancelled,
        BranchAnswer::HoldLost => branch::State::HoldLost,
    };
    Response::new(BranchResponse {
        state: state as i32,
    })
}

#[tonic::async_trait]
impl<DB: Backend, R: Resource<DB>> Participant for ParticipantService<R, DB> {
    async fn r#try(&self, request: Request<TryRequest>) -> Result<Response<TryResponse>, Status> {
        let branch = try_branch_from_wire(request.into_inner())?;
        let outcome = self.try_branch(branch).await?;
        let (outcome, reason) = match outcome {
            TryAnswer::Held => (try_response::Outcome::Held, String::new()),
            TryAnswer::Rejected(reason) => (try_response::Outcome::Rejected, reason),
        };
        Ok(Response::new(TryResponse {
            outcome: outcome as i32,
            reason,
        }))
    }

    async fn confirm(
        &self,
        request: Request<BranchRequest>,
    ) -> Result<Response<BranchResponse>, Status> {
        let req = request.into_inner();
        let key = key_from_parts(req.reservation_id, req.branch_id)?;
        Ok(branch_response(self.confirm_branch(&key).await?))
    }

    async fn cancel(
        &self,
        request: Request<BranchRequest>,
    ) -> Result<Response<BranchResponse>, Status> {
        let req = request.into_inner();
        let key = key_from_parts(req.reservation_id, req.branch_id)?;
        Ok(branch_response(self.cancel_branch(&key).await?))
    }
}
