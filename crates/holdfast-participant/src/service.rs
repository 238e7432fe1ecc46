//! [`ParticipantService`]: the generic `tcc.v1.Participant` around a [`Resource`], which runs
//! every phase as barrier + business change in one local transaction. Try's ways are in
//! `service/try_phase.rs`; Confirm, Cancel, Extend and orphan reclaim are here.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use holdfast_serve::background::{pass_failpoint, spawn_until_aborted};
use holdfast_serve::db::WriteTransaction;
use sqlx::Pool;

use super::barrier::{Backend, BarrierPhase, HeldBarrierMove};
use super::barrier_only::BarrierOnlyWrites;
use super::try_batch::TryBatches;
use chrono::{DateTime, Utc};

use super::clock::{OrphanReclaim, ParticipantClock};
use super::faults;
use super::validate::{check_max_hold, check_try_at};
use super::{
    BranchAnswer, BranchCtx, BranchKey, ConfirmOutcome, ExtendAnswer, Resource, ResourceError,
    Shortcuts, TryBranch,
};
use crate::telemetry::barrier_outcome;
use holdfast_proto::participant_server::ParticipantServer;

mod try_phase;

/// How long after `expires_at` a participant keeps an unreleased hold before reclaiming it.
pub const DEFAULT_ORPHAN_GRACE: Duration = Duration::from_secs(3600);

/// How far ahead a Try's `expires_at` may lie by default (`--max-hold`, SPEC 7.3).
pub const DEFAULT_MAX_HOLD: Duration = Duration::from_secs(24 * 3600);

/// Most orphans reclaimed by one lazy reclaim inside a rejected Try.
const LAZY_RECLAIM_BATCH: usize = 100;

/// Most orphans reclaimed by the reclaim a test deployment runs after moving its clock.
const AFTER_MOVE_RECLAIM_BATCH: usize = 10_000;

/// A `tcc.v1.Participant` backed by a [`Resource`] and the barrier table.
///
/// Cheap to clone. Serve it with [`ParticipantService::into_server`]; the domain-level
/// methods ([`try_branch`](Self::try_branch), [`confirm_branch`](Self::confirm_branch),
/// [`cancel_branch`](Self::cancel_branch)) are public for in-process use and tests.
///
/// `DB` is the database ([`sqlx::Postgres`] by default, or [`sqlx::Sqlite`]).
pub struct ParticipantService<R, DB: Backend = crate::DefaultDatabase> {
    pub(super) name: Arc<str>,
    pub(super) resource: Arc<R>,
    pub(super) pool: Pool<DB>,
    orphan_grace: Duration,
    max_hold: Duration,
    clock: ParticipantClock,
    /// A barrier-only resource's writes, batched when concurrent; started by the first call
    /// (inside the runtime that serves it).
    barrier_only_writes: Arc<OnceLock<BarrierOnlyWrites<DB>>>,
    /// First Tries held in batches when concurrent (a resource whose shortcuts hold
    /// `tries_in_batches`, on a
    /// database that batches); started by the first call.
    try_batches: Arc<OnceLock<TryBatches>>,
}

impl<R, DB: Backend> Clone for ParticipantService<R, DB> {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            resource: self.resource.clone(),
            pool: self.pool.clone(),
            orphan_grace: self.orphan_grace,
            max_hold: self.max_hold,
            clock: self.clock.clone(),
            barrier_only_writes: self.barrier_only_writes.clone(),
            try_batches: self.try_batches.clone(),
        }
    }
}

impl<DB: Backend, R: Resource<DB>> ParticipantService<R, DB> {
    /// A participant called `name` (scopes its barrier rows, so several participants may
    /// share one database) with the default orphan grace of one hour.
    ///
    /// The database must carry the participants' schema ([`crate::migrate`]).
    pub fn new(name: impl Into<String>, resource: R, pool: Pool<DB>) -> Self {
        Self {
            name: Arc::from(name.into()),
            resource: Arc::new(resource),
            pool,
            orphan_grace: DEFAULT_ORPHAN_GRACE,
            max_hold: DEFAULT_MAX_HOLD,
            clock: ParticipantClock::default(),
            barrier_only_writes: Arc::default(),
            try_batches: Arc::default(),
        }
    }

    /// Reads `clock` (a test deployment's movable clock) instead of the host's for input
    /// bounds (`--max-hold`). The database clock the barrier reads is moved apart.
    pub fn with_clock(mut self, clock: ParticipantClock) -> Self {
        self.clock = clock;
        self
    }

    /// Sets how far ahead a Try's `expires_at` may lie: a Try asking for more is refused with
    /// `INVALID_ARGUMENT` naming `expires_at`, and nothing is written.
    pub fn with_max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = max_hold;
        self
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

    async fn orphans_exist(&self) -> Result<bool, ResourceError> {
        let mut conn = self.pool.acquire().await?;
        DB::orphans_exist(&mut *conn, &self.name).await
    }

    /// Confirm: finalises a held branch. A repeat answers the same; after Cancel it answers
    /// `Cancelled` and changes nothing; a branch whose hold is gone (reclaimed, rejected, or
    /// never tried) answers `HoldLost`.
    pub async fn confirm_branch(&self, key: &BranchKey) -> Result<BranchAnswer, ResourceError> {
        if self.barrier_only() && self.advance_alone(key, BarrierPhase::Confirmed).await? {
            return Ok(BranchAnswer::Confirmed);
        }
        if self.settle_in_one(key, BarrierPhase::Confirmed).await? {
            return Ok(BranchAnswer::Confirmed);
        }
        let mut tx = DB::begin_write(&self.pool).await?;
        // The common case, a held branch, in one barrier statement (a barrier-only resource's
        // was tried above).
        let held = if self.barrier_only() {
            None
        } else {
            DB::advance_held(&mut *tx, &self.name, key, BarrierPhase::Confirmed).await?
        };
        if let Some(found) = held {
            return match self.resource.confirm(&mut *tx, &found.ctx(key)?).await? {
                ConfirmOutcome::Confirmed => {
                    faults::check("participant.confirm.between")?;
                    tx.commit().await?;
                    faults::check("participant.confirm.committed")?;
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
            BarrierPhase::Confirmed => {
                barrier_outcome(&self.name, "repeat");
                BranchAnswer::Confirmed
            }
            BarrierPhase::Cancelled => {
                barrier_outcome(&self.name, "refused");
                BranchAnswer::Cancelled
            }
            BarrierPhase::Rejected | BarrierPhase::HoldLost => BranchAnswer::HoldLost,
        };
        tx.commit().await?;
        Ok(answer)
    }

    /// A barrier-only resource has no business change to keep with the barrier's: a held
    /// branch moves to `to` in one statement, no transaction (shared with concurrent calls:
    /// [`BarrierOnlyWrites`]). False: not held.
    async fn advance_alone(
        &self,
        key: &BranchKey,
        to: BarrierPhase,
    ) -> Result<bool, ResourceError> {
        self.barrier_only_writes().advance_held(key, to).await
    }

    /// A held branch's Confirm or Cancel (`to`) as the resource's one statement
    /// ([`Shortcuts::settle_in_one`]): true when it was made; false to go the general way (no
    /// such shortcut, the branch is not held, not one the statement can do, or the statement
    /// failed and wrote nothing). The failpoints stand before and after the statement's own
    /// commit, as in a transaction's.
    async fn settle_in_one(
        &self,
        key: &BranchKey,
        to: BarrierPhase,
    ) -> Result<bool, ResourceError> {
        let Some(shortcuts) = self.statement_shortcuts() else {
            return Ok(false);
        };
        let (between, committed) = if to == BarrierPhase::Confirmed {
            (
                "participant.confirm.between",
                "participant.confirm.committed",
            )
        } else {
            ("participant.cancel.between", "participant.cancel.committed")
        };
        faults::check(between)?;
        let mut conn = DB::acquire_write(&self.pool).await?;
        let moved = HeldBarrierMove::new(&self.name, key, to);
        match shortcuts.settle_in_one(&mut *conn, &moved).await {
            Ok(settled) => {
                DB::finish_write(conn).await?;
                if settled {
                    faults::check(committed)?;
                }
                Ok(settled)
            }
            Err(err) => {
                tracing::debug!(participant = %self.name, error = %err, "one-statement settle failed; going the general way");
                Ok(false)
            }
        }
    }

    /// The resource's shortcuts ([`Resource::shortcuts`]).
    fn shortcuts(&self) -> Option<&dyn Shortcuts<DB>> {
        self.resource.shortcuts()
    }

    /// A resource with no business data ([`Shortcuts::barrier_only`]).
    fn barrier_only(&self) -> bool {
        self.shortcuts().is_some_and(|s| s.barrier_only())
    }

    /// The shortcuts that write a business change with its barrier row: those of a resource
    /// that offers them and has business data.
    fn statement_shortcuts(&self) -> Option<&dyn Shortcuts<DB>> {
        self.shortcuts().filter(|s| !s.barrier_only())
    }

    fn try_batches(&self) -> &TryBatches {
        self.try_batches.get_or_init(|| {
            TryBatches::spawn(self.pool.clone(), self.name.clone(), self.resource.clone())
        })
    }

    fn barrier_only_writes(&self) -> &BarrierOnlyWrites<DB> {
        self.barrier_only_writes
            .get_or_init(|| BarrierOnlyWrites::spawn(self.pool.clone(), self.name.clone()))
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
        if self.barrier_only() && self.advance_alone(key, BarrierPhase::Cancelled).await? {
            return Ok(BranchAnswer::Cancelled);
        }
        if self.settle_in_one(key, BarrierPhase::Cancelled).await? {
            return Ok(BranchAnswer::Cancelled);
        }
        let mut tx = DB::begin_write(&self.pool).await?;
        // The common case, a held branch, in one barrier statement (a barrier-only resource's
        // was tried above).
        let held = if self.barrier_only() {
            None
        } else {
            DB::advance_held(&mut *tx, &self.name, key, BarrierPhase::Cancelled).await?
        };
        if let Some(found) = held {
            self.resource.cancel(&mut *tx, &found.ctx(key)?).await?;
            faults::check("participant.cancel.between")?;
            tx.commit().await?;
            faults::check("participant.cancel.committed")?;
            return Ok(BranchAnswer::Cancelled);
        }
        let found = DB::lock_existing(&mut *tx, &self.name, key).await?;
        let answer = match found.phase {
            BarrierPhase::Trying | BarrierPhase::Rejected => {
                if found.phase == BarrierPhase::Trying {
                    // A Cancel before its Try: the row written now is the tombstone.
                    barrier_outcome(&self.name, "tombstone");
                }
                DB::set_phase(&mut *tx, &self.name, key, BarrierPhase::Cancelled).await?;
                BranchAnswer::Cancelled
            }
            BarrierPhase::Held => {
                self.resource.cancel(&mut *tx, &found.ctx(key)?).await?;
                DB::set_phase(&mut *tx, &self.name, key, BarrierPhase::Cancelled).await?;
                BranchAnswer::Cancelled
            }
            BarrierPhase::Cancelled => {
                barrier_outcome(&self.name, "repeat");
                BranchAnswer::Cancelled
            }
            BarrierPhase::Confirmed => {
                barrier_outcome(&self.name, "refused");
                BranchAnswer::Confirmed
            }
            // Already released by the reclaim; nothing is held, nothing to change.
            BarrierPhase::HoldLost => BranchAnswer::Cancelled,
        };
        tx.commit().await?;
        Ok(answer)
    }

    /// Extend: moves a held branch's deadline to `expires_at` (and its reclaim to
    /// `expires_at + orphan_grace`), never earlier than recorded, so the hold is kept at least
    /// that long. A repeat (or an earlier deadline) changes nothing and answers `Held`. A
    /// branch no longer held answers its state and nothing is written: `Confirmed`,
    /// `Cancelled`, or `HoldLost` (rejected, reclaimed, or unknown here). An `expires_at`
    /// beyond `max_hold` is `ResourceError::InvalidArgument` naming `expires_at`.
    pub async fn extend_branch(
        &self,
        key: &BranchKey,
        expires_at: DateTime<Utc>,
    ) -> Result<ExtendAnswer, ResourceError> {
        check_max_hold(expires_at, self.max_hold, self.clock.now())?;
        let hold_until = self.hold_until(expires_at)?;
        let mut tx = DB::begin_write(&self.pool).await?;
        if let Some(found) =
            DB::extend_held(&mut *tx, &self.name, key, expires_at, hold_until).await?
        {
            if !self.barrier_only() {
                self.resource.extend(&mut *tx, &found.ctx(key)?).await?;
            }
            tx.commit().await?;
            return Ok(ExtendAnswer::Held);
        }
        let phase = DB::phase(&mut *tx, &self.name, key).await?;
        tx.rollback().await?;
        Ok(ExtendAnswer::Settled(match phase {
            Some(BarrierPhase::Confirmed) => BranchAnswer::Confirmed,
            Some(BarrierPhase::Cancelled) => BranchAnswer::Cancelled,
            _ => BranchAnswer::HoldLost,
        }))
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
            crate::telemetry::orphan_reclaimed(&self.name);
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
    /// Failures are logged and retried on the next tick; a panic is logged and the loop
    /// started again (`holdfast_serve::background`).
    pub fn spawn_reclaimer(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        spawn_until_aborted(crate::telemetry::tasks::RECLAIMER, move || {
            let this = this.clone();
            async move {
                // The first sweep waits a period: startup is busy enough.
                let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    pass_failpoint("participant.reclaim.pass");
                    if let Err(err) = this.reclaim_orphans(LAZY_RECLAIM_BATCH).await {
                        tracing::warn!(participant = %this.name, error = %err, "orphan reclaim failed");
                    }
                }
            }
        })
    }

    /// Validates a Try (naming the offending field; `expires_at` at most `max_hold` ahead), sorts its items into lock order and
    /// computes how long the hold is kept (`expires_at + orphan_grace`).
    fn branch_ctx(&self, request: TryBranch) -> Result<BranchCtx, ResourceError> {
        let request = check_try_at(request, self.max_hold, self.clock.now(), |items| {
            self.resource.validate(items)
        })?;
        let hold_until = self.hold_until(request.expires_at)?;
        Ok(BranchCtx {
            key: request.key,
            holder: request.holder,
            items: request.items,
            expires_at: request.expires_at,
            hold_until,
        })
    }
}

impl<DB: Backend, R: Resource<DB>> ParticipantService<R, DB> {
    /// How long a hold with deadline `expires_at` is kept: `expires_at + orphan_grace`.
    fn hold_until(&self, expires_at: DateTime<Utc>) -> Result<DateTime<Utc>, ResourceError> {
        let grace = chrono::Duration::from_std(self.orphan_grace)
            .map_err(|_| ResourceError::Internal("orphan grace out of range".to_owned()))?;
        expires_at
            .checked_add_signed(grace)
            .ok_or_else(|| ResourceError::invalid("expires_at", "is out of range"))
    }
}

impl<DB: Backend, R: Resource<DB>> OrphanReclaim for ParticipantService<R, DB> {
    fn reclaim_now(&self) -> futures_util::future::BoxFuture<'_, Result<usize, ResourceError>> {
        // Everything due: after a clock move many holds may lapse at once.
        Box::pin(self.reclaim_orphans(AFTER_MOVE_RECLAIM_BATCH))
    }
}
