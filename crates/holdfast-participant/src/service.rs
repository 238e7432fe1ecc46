//! [`ParticipantService`]: the generic `tcc.v1.Participant` around a [`Resource`], which runs
//! every phase as barrier + business change in one local transaction.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use holdfast_serve::db::WriteTransaction;
use sqlx::{Pool, Postgres};

use super::barrier::{Backend, BarrierPhase, BarrierRow, HeldBarrierRow};
use super::barrier_only::BarrierOnlyWrites;
use super::try_batch::{Batched, TryBatches};
use chrono::{DateTime, Utc};

use super::clock::{OrphanReclaim, ParticipantClock};
use super::faults;
use super::validate::{check_max_hold, check_try_at};
use super::{
    BranchAnswer, BranchCtx, BranchKey, ConfirmOutcome, ExtendAnswer, Resource, ResourceError,
    TryAnswer, TryBranch,
};
use crate::telemetry::barrier_outcome;
use holdfast_proto::participant_server::ParticipantServer;

/// How long after `expires_at` a participant keeps an unreleased hold before reclaiming it.
pub const DEFAULT_ORPHAN_GRACE: Duration = Duration::from_secs(3600);

/// How far ahead a Try's `expires_at` may lie by default (`--max-hold`, SPEC 7.3).
pub const DEFAULT_MAX_HOLD: Duration = Duration::from_secs(24 * 3600);

/// Most orphans reclaimed by one lazy reclaim inside a rejected Try.
const LAZY_RECLAIM_BATCH: usize = 100;

/// Most orphans reclaimed by the reclaim a test deployment runs after moving its clock.
const AFTER_MOVE_RECLAIM_BATCH: usize = 10_000;

/// What a Try in one transaction came to ([`ParticipantService::try_in_transaction`]).
enum TryInTransaction {
    /// The answer, committed (or found).
    Answered(TryAnswer),
    /// The business refused; nothing is written.
    Refused(String),
    /// Undone: run again with the branch's row locked first.
    BarrierFirst,
}

/// A `tcc.v1.Participant` backed by a [`Resource`] and the barrier table.
///
/// Cheap to clone. Serve it with [`ParticipantService::into_server`]; the domain-level
/// methods ([`try_branch`](Self::try_branch), [`confirm_branch`](Self::confirm_branch),
/// [`cancel_branch`](Self::cancel_branch)) are public for in-process use and tests.
///
/// `DB` is the database ([`sqlx::Postgres`] by default, or [`sqlx::Sqlite`]).
pub struct ParticipantService<R, DB: Backend = Postgres> {
    pub(super) name: Arc<str>,
    pub(super) resource: Arc<R>,
    pub(super) pool: Pool<DB>,
    orphan_grace: Duration,
    max_hold: Duration,
    clock: ParticipantClock,
    /// A barrier-only resource's writes, batched when concurrent; started by the first call
    /// (inside the runtime that serves it).
    barrier_only_writes: Arc<OnceLock<BarrierOnlyWrites<DB>>>,
    /// First Tries held in batches when concurrent (a resource that `tries_in_batches`, on a
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
        // A first Try (the common case) is two statements in one transaction: the barrier row,
        // answered `Held`, then the business change, last before the commit. The business
        // change may take a contended lock (a sale's one stock row), which is then held over
        // its own statement and the commit only. A business refusal undoes both and is
        // recorded on its own. When the branch already has a row (a repeat, or a Cancel that
        // came first) or the business change fails, that is undone and the call runs barrier
        // first: lock the row, answer from it if decided, else hold under the lock. A resource
        // that can writes a first Try as one autocommit statement instead (`in_one`), and
        // falls back to the two when it cannot.
        let mut barrier_first = false;
        let mut in_one = self.resource.tries_in_one_statement() && !self.resource.barrier_only();
        if self.resource.barrier_only() {
            // No business change: the barrier row alone, one statement, no transaction.
            if self.barrier_only_writes().insert_held(branch).await? {
                return Ok(TryAnswer::Held);
            }
            barrier_first = true;
        }
        let mut batched = DB::BATCHES_BARRIER_ONLY
            && self.resource.tries_in_batches()
            && !self.resource.barrier_only();
        // Counts this Try in flight (while it is, others queue for a batch).
        let mut _in_flight = None;
        loop {
            let in_batch = if batched {
                // Only the first time round: a refusal's rerun (after a reclaim) goes alone.
                batched = false;
                // As for a Try alone: the failpoints stand before the writes and after the
                // commit.
                faults::check("participant.try.between")?;
                let (in_flight, answer) = self.try_batches().try_in_batch(branch).await;
                _in_flight = Some(in_flight);
                answer
            } else {
                None
            };
            let reason = if let Some(answer) = in_batch {
                match answer {
                    Batched::Held => {
                        faults::check("participant.try.committed")?;
                        return Ok(TryAnswer::Held);
                    }
                    Batched::Rejected(reason) => return Ok(TryAnswer::Rejected(reason)),
                    Batched::Refused(reason) => reason,
                }
            } else if in_one {
                match self.try_in_one(branch).await? {
                    Some(TryAnswer::Held) => return Ok(TryAnswer::Held),
                    Some(TryAnswer::Rejected(reason)) => reason,
                    None => {
                        in_one = false;
                        continue;
                    }
                }
            } else {
                match self.try_in_transaction(branch, barrier_first).await? {
                    TryInTransaction::Answered(answer) => return Ok(answer),
                    TryInTransaction::Refused(reason) => reason,
                    TryInTransaction::BarrierFirst => {
                        barrier_first = true;
                        continue;
                    }
                }
            };
            // Refused, and nothing of it is written.
            if !reclaimed && self.orphans_exist().await? {
                // Reclaim outside any transaction of ours: it locks other branches and their
                // resources, which must not nest inside our resource locks.
                reclaimed = true;
                self.reclaim(LAZY_RECLAIM_BATCH, false).await?;
                continue;
            }
            let rejected = TryAnswer::Rejected(reason);
            if !barrier_first {
                // A first Try (the common case, e.g. a sale's losers): the refusal is the
                // branch's new row, one autocommit statement. A row already there (a call
                // for the branch came first) is answered from below.
                let mut conn = DB::acquire_write(&self.pool).await?;
                let phase = BarrierPhase::Rejected;
                if DB::insert_try(&mut *conn, &self.name, branch, phase, &rejected).await? {
                    return Ok(rejected);
                }
            }
            let mut tx = DB::begin_write(&self.pool).await?;
            let found = DB::lock(&mut *tx, &self.name, &branch.key).await?;
            let answer = if found.phase == BarrierPhase::Trying {
                let phase = BarrierPhase::Rejected;
                DB::record_try(&mut *tx, &self.name, branch, phase, &rejected).await?;
                rejected
            } else {
                // A concurrent duplicate decided it meanwhile: its answer is the first one.
                self.answer_decided_try(&mut *tx, branch, &found).await?
            };
            tx.commit().await?;
            return Ok(answer);
        }
    }

    /// A first Try as the resource's one statement ([`Resource::try_hold_in_one`]): its
    /// answer, or `None` to go the general way (the branch is not one it can do, or the
    /// statement failed and wrote nothing, e.g. because the branch has a row already).
    async fn try_in_one(&self, branch: &BranchCtx) -> Result<Option<TryAnswer>, ResourceError> {
        // As in a transaction's Try, the failpoints stand before and after the commit (here
        // the statement's own).
        faults::check("participant.try.between")?;
        let mut conn = DB::acquire_write(&self.pool).await?;
        let row = HeldBarrierRow::new(&self.name, branch);
        match self
            .resource
            .try_hold_in_one(&mut *conn, branch, &row)
            .await
        {
            Ok(Some(TryAnswer::Held)) => {
                faults::check("participant.try.committed")?;
                Ok(Some(TryAnswer::Held))
            }
            Ok(answer) => Ok(answer),
            Err(err) if err.is_exclusion_violation() => Ok(Some(TryAnswer::Rejected(
                "overlaps an existing hold".to_owned(),
            ))),
            Err(_) => Ok(None),
        }
    }

    /// A Try in one transaction: the barrier row then the business change for a first Try
    /// (`barrier_first` false), or the row locked first and answered from when decided.
    async fn try_in_transaction(
        &self,
        branch: &BranchCtx,
        barrier_first: bool,
    ) -> Result<TryInTransaction, ResourceError> {
        let mut tx = DB::begin_write(&self.pool).await?;
        if barrier_first {
            let found = DB::lock(&mut *tx, &self.name, &branch.key).await?;
            if found.phase != BarrierPhase::Trying {
                let answer = self.answer_decided_try(&mut *tx, branch, &found).await?;
                tx.commit().await?;
                return Ok(TryInTransaction::Answered(answer));
            }
        } else {
            let held = TryAnswer::Held;
            let phase = BarrierPhase::Held;
            if !DB::insert_try(&mut *tx, &self.name, branch, phase, &held).await? {
                tx.rollback().await?;
                return Ok(TryInTransaction::BarrierFirst);
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
                return Ok(TryInTransaction::BarrierFirst);
            }
        };
        let TryAnswer::Rejected(reason) = outcome else {
            faults::check("participant.try.between")?;
            if barrier_first {
                DB::record_try(&mut *tx, &self.name, branch, BarrierPhase::Held, &outcome).await?;
            }
            tx.commit().await?;
            faults::check("participant.try.committed")?;
            return Ok(TryInTransaction::Answered(outcome));
        };
        // Undo the business change (and a first Try's row); the caller records the refusal.
        tx.rollback().await?;
        Ok(TryInTransaction::Refused(reason))
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
            Some(answer) => {
                barrier_outcome(&self.name, "repeat");
                answer.clone()
            }
            None => {
                barrier_outcome(&self.name, "tombstone");
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
            if !self.resource.barrier_only() {
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
