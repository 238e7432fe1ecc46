//! Try: the SDK chooses a way to hold a branch - the barrier row alone (a barrier-only
//! resource), a batch with concurrent first Tries, or the start of the fallback list - then
//! walks the fixed fallback list (the resource's one statement, a transaction with the
//! barrier row first written, a transaction with it first locked) until a way answers. A
//! refusal is recorded one way, after a reclaim of orphaned holds and one more walk.

use holdfast_serve::db::WriteTransaction;
use holdfast_serve::db::batch::InFlight;

use super::{LAZY_RECLAIM_BATCH, ParticipantService};
use crate::barrier::{Backend, BarrierPhase, BarrierRow, HeldBarrierRow};
use crate::faults;
use crate::telemetry::barrier_outcome;
use crate::try_batch::Batched;
use crate::{BranchCtx, Resource, ResourceError, TryAnswer, TryBranch};

/// A way on the fallback list, in its order: each that cannot answer a Try hands it to the
/// next ([`ParticipantService::hold_from`]).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Way {
    /// The resource's one statement ([`crate::Shortcuts::try_hold_in_one`]).
    InOne,
    /// A transaction: the barrier row (`Held`) then the business change.
    Transaction,
    /// A transaction with the branch's row locked first, answered from when decided: the
    /// last way, which answers every Try.
    BarrierFirst,
}

/// What a Try came to on a way.
enum Held {
    /// The answer, committed (or found).
    Answered(TryAnswer),
    /// The business refused on way `on`; nothing is written.
    Refused { reason: String, on: Way },
}

/// The way chosen for a Try ([`ParticipantService::choose_way`]).
enum Chosen {
    /// Done already (the barrier row alone, or a batch).
    Done(Held),
    /// Walk the fallback list from this way.
    From(Way),
}

impl<DB: Backend, R: Resource<DB>> ParticipantService<R, DB> {
    /// Try: holds the branch's items unless the branch was already decided.
    ///
    /// Returns the first answer for a repeat, `Rejected` for a Try arriving after the branch
    /// was cancelled. A business rejection (or SQLSTATE 23P01) rolls the business change back
    /// and records the rejection. When a rejected Try finds orphaned holds, they are reclaimed
    /// and the Try is run once more. Invalid input is `ResourceError::InvalidArgument`.
    pub async fn try_branch(&self, request: TryBranch) -> Result<TryAnswer, ResourceError> {
        let branch = &self.branch_ctx(request)?;
        // Counts this Try in flight while it is (others queue for a batch meanwhile).
        let (_in_flight, chosen) = self.choose_way(branch).await?;
        let held = match chosen {
            Chosen::Done(held) => held,
            Chosen::From(way) => self.hold_from(branch, way).await?,
        };
        let (reason, on) = match held {
            Held::Answered(answer) => return Ok(answer),
            Held::Refused { reason, on } => (reason, on),
        };
        // Refused, and nothing of it is written: orphaned holds may be what refused it.
        if !self.orphans_exist().await? {
            return self.record_refusal(branch, reason, on).await;
        }
        // Reclaim outside any transaction of ours: it locks other branches and their
        // resources, which must not nest inside our resource locks. Then once more from the
        // way that refused.
        self.reclaim(LAZY_RECLAIM_BATCH, false).await?;
        match self.hold_from(branch, on).await? {
            Held::Answered(answer) => Ok(answer),
            Held::Refused { reason, on } => self.record_refusal(branch, reason, on).await,
        }
    }

    /// The way a Try takes first. A barrier-only resource writes the barrier row alone (one
    /// statement, no transaction), or, when the branch has a row already, locks it first. A
    /// resource whose shortcuts hold Tries in batches queues a first Try behind others in
    /// flight, and runs it its own way when there are none or the batch could not answer it.
    /// Any other starts the fallback list: the resource's one statement, if it has one, else
    /// a transaction with the barrier row (answered `Held`) first and the business change last
    /// before the commit, so a contended business lock is held over that statement and the
    /// commit only.
    async fn choose_way(
        &self,
        branch: &BranchCtx,
    ) -> Result<(Option<InFlight>, Chosen), ResourceError> {
        if self.barrier_only() {
            let chosen = if self.barrier_only_writes().insert_held(branch).await? {
                Chosen::Done(Held::Answered(TryAnswer::Held))
            } else {
                Chosen::From(Way::BarrierFirst)
            };
            return Ok((None, chosen));
        }
        let own_way = match self.statement_shortcuts() {
            Some(_) => Way::InOne,
            None => Way::Transaction,
        };
        let batches = self
            .statement_shortcuts()
            .is_some_and(|s| s.tries_in_batches());
        if !(DB::BATCHES_BARRIER_ONLY && batches) {
            return Ok((None, Chosen::From(own_way)));
        }
        // As for a Try alone: the failpoints stand before the writes and after the commit.
        faults::check("participant.try.between")?;
        let (in_flight, batched) = self.try_batches().try_in_batch(branch).await;
        let chosen = match batched {
            None => Chosen::From(own_way),
            Some(Batched::Held) => {
                faults::check("participant.try.committed")?;
                Chosen::Done(Held::Answered(TryAnswer::Held))
            }
            Some(Batched::Rejected(reason)) => {
                Chosen::Done(Held::Answered(TryAnswer::Rejected(reason)))
            }
            // A rerun after the reclaim goes its own way.
            Some(Batched::Refused(reason)) => Chosen::Done(Held::Refused {
                reason,
                on: own_way,
            }),
        };
        Ok((Some(in_flight), chosen))
    }

    /// Walks the fallback list from `from` until a way answers or refuses: the resource's one
    /// statement answers `None` for a branch it cannot do (on to a transaction), a transaction
    /// that finds the branch's row already there (a repeat, a Cancel that came first) or whose
    /// business change fails is undone (on to barrier first), and barrier first, the last,
    /// answers every Try.
    async fn hold_from(&self, branch: &BranchCtx, from: Way) -> Result<Held, ResourceError> {
        if from <= Way::InOne {
            match self.try_in_one(branch).await? {
                Some(TryAnswer::Rejected(reason)) => {
                    return Ok(Held::Refused {
                        reason,
                        on: Way::InOne,
                    });
                }
                Some(held) => return Ok(Held::Answered(held)),
                None => {}
            }
        }
        if from <= Way::Transaction
            && let Some(held) = self.try_in_transaction(branch).await?
        {
            return Ok(held);
        }
        self.try_barrier_first(branch).await
    }

    /// Records a refused Try (`reason`, refused on way `on`). A first Try (the common case,
    /// e.g. a sale's losers): the refusal is the branch's new row, one statement
    /// (`acquire_write`). A row already there (a call for the branch came first), or a Try
    /// refused with its row locked first: the row locked, and the refusal recorded unless a
    /// concurrent duplicate decided the branch meanwhile (its answer is the first one).
    async fn record_refusal(
        &self,
        branch: &BranchCtx,
        reason: String,
        on: Way,
    ) -> Result<TryAnswer, ResourceError> {
        let rejected = TryAnswer::Rejected(reason);
        if on != Way::BarrierFirst {
            let mut conn = DB::acquire_write(&self.pool).await?;
            let phase = BarrierPhase::Rejected;
            let inserted = DB::insert_try(&mut *conn, &self.name, branch, phase, &rejected).await?;
            DB::finish_write(conn).await?;
            if inserted {
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
            self.answer_decided_try(&mut *tx, branch, &found).await?
        };
        tx.commit().await?;
        Ok(answer)
    }

    /// A first Try as the resource's one statement ([`Resource::try_hold_in_one`]): its
    /// answer, or `None` to go the general way (the branch is not one it can do, or the
    /// statement failed and wrote nothing, e.g. because the branch has a row already).
    async fn try_in_one(&self, branch: &BranchCtx) -> Result<Option<TryAnswer>, ResourceError> {
        let Some(shortcuts) = self.statement_shortcuts() else {
            return Ok(None);
        };
        // As in a transaction's Try, the failpoints stand before and after the commit (here
        // the statement's own).
        faults::check("participant.try.between")?;
        let mut conn = DB::acquire_write(&self.pool).await?;
        let row = HeldBarrierRow::new(&self.name, branch);
        match shortcuts.try_hold_in_one(&mut *conn, branch, &row).await {
            Ok(answer) => {
                DB::finish_write(conn).await?;
                if answer == Some(TryAnswer::Held) {
                    faults::check("participant.try.committed")?;
                }
                Ok(answer)
            }
            Err(err) if err.is_exclusion_violation() => Ok(Some(TryAnswer::Rejected(
                "overlaps an existing hold".to_owned(),
            ))),
            Err(_) => Ok(None),
        }
    }

    /// A first Try in one transaction: the barrier row (`Held`), then the business change,
    /// last before the commit. `None` (undone, nothing written) when the branch has a row
    /// already or the business change failed: the caller goes barrier first.
    async fn try_in_transaction(&self, branch: &BranchCtx) -> Result<Option<Held>, ResourceError> {
        let mut tx = DB::begin_write(&self.pool).await?;
        let (phase, held) = (BarrierPhase::Held, TryAnswer::Held);
        if !DB::insert_try(&mut *tx, &self.name, branch, phase, &held).await? {
            tx.rollback().await?;
            return Ok(None);
        }
        let Ok(answer) = self.business_try(&mut tx, branch).await else {
            tx.rollback().await?;
            return Ok(None);
        };
        self.finish_try(tx, branch, answer, Way::Transaction)
            .await
            .map(Some)
    }

    /// A Try in one transaction with the branch's row locked first: answered from the row
    /// when the branch is decided, else held under the lock. A failing business change is the
    /// call's error (dropping `tx` rolls everything back).
    async fn try_barrier_first(&self, branch: &BranchCtx) -> Result<Held, ResourceError> {
        let mut tx = DB::begin_write(&self.pool).await?;
        let found = DB::lock(&mut *tx, &self.name, &branch.key).await?;
        if found.phase != BarrierPhase::Trying {
            let answer = self.answer_decided_try(&mut *tx, branch, &found).await?;
            tx.commit().await?;
            return Ok(Held::Answered(answer));
        }
        let answer = self.business_try(&mut tx, branch).await?;
        self.finish_try(tx, branch, answer, Way::BarrierFirst).await
    }

    /// The resource's business change for a Try in `tx`; an exclusion-constraint violation
    /// (SQLSTATE 23P01) is a refusal.
    async fn business_try(
        &self,
        tx: &mut DB::Write,
        branch: &BranchCtx,
    ) -> Result<TryAnswer, ResourceError> {
        match self.resource.try_hold(&mut **tx, branch).await {
            Err(err) if err.is_exclusion_violation() => {
                Ok(TryAnswer::Rejected("overlaps an existing hold".to_owned()))
            }
            answer => answer,
        }
    }

    /// Ends a Try's transaction on way `on` with the business `answer`: a hold committed
    /// (barrier first, its locked row recorded `Held` first), a refusal rolled back (the
    /// business change, and a first Try's row; the caller records it).
    async fn finish_try(
        &self,
        mut tx: DB::Write,
        branch: &BranchCtx,
        answer: TryAnswer,
        on: Way,
    ) -> Result<Held, ResourceError> {
        let TryAnswer::Rejected(reason) = answer else {
            faults::check("participant.try.between")?;
            if on == Way::BarrierFirst {
                DB::record_try(&mut *tx, &self.name, branch, BarrierPhase::Held, &answer).await?;
            }
            tx.commit().await?;
            faults::check("participant.try.committed")?;
            return Ok(Held::Answered(answer));
        };
        tx.rollback().await?;
        Ok(Held::Refused { reason, on })
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
}
