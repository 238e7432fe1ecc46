//! Try: the SDK's ways of holding a branch - in a batch with concurrent first Tries, in the
//! resource's one statement, or in a transaction (the barrier row then the business change,
//! or barrier first for a repeat or after disorder) - and the one way a refusal is recorded.

use holdfast_serve::db::WriteTransaction;

use super::{LAZY_RECLAIM_BATCH, ParticipantService};
use crate::barrier::{Backend, BarrierPhase, BarrierRow, HeldBarrierRow};
use crate::faults;
use crate::telemetry::barrier_outcome;
use crate::try_batch::Batched;
use crate::{BranchCtx, Resource, ResourceError, TryAnswer, TryBranch};

/// How a Try is tried this time round ([`ParticipantService::try_branch`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    /// Queued behind the first Tries in flight, into a batch ([`Resource::tries_in_batches`]).
    Batch,
    /// The resource's one statement ([`Resource::tries_in_one_statement`]).
    InOne,
    /// A transaction: the barrier row then the business change, or (`barrier_first`) the
    /// branch's row locked first and answered from when decided.
    Transaction { barrier_first: bool },
}

/// What a Try in one transaction came to ([`ParticipantService::try_in_transaction`]).
enum TryInTransaction {
    /// The answer, committed (or found).
    Answered(TryAnswer),
    /// The business refused; nothing is written.
    Refused(String),
    /// Undone: run again with the branch's row locked first.
    BarrierFirst,
}

impl<DB: Backend, R: Resource<DB>> ParticipantService<R, DB> {
    /// Try: holds the branch's items unless the branch was already decided.
    ///
    /// Returns the first answer for a repeat, `Rejected` for a Try arriving after the branch
    /// was cancelled. A business rejection (or SQLSTATE 23P01) rolls the business change back
    /// and records the rejection. When a rejected Try finds orphaned holds, they are reclaimed
    /// and the Try is run once more. Invalid input is `ResourceError::InvalidArgument`.
    pub async fn try_branch(&self, request: TryBranch) -> Result<TryAnswer, ResourceError> {
        let branch = self.branch_ctx(request)?;
        let branch = &branch;
        // A first Try (the common case) is two statements in one transaction: the barrier row,
        // answered `Held`, then the business change, last before the commit. The business
        // change may take a contended lock (a sale's one stock row), which is then held over
        // its own statement and the commit only. A business refusal undoes both and is
        // recorded on its own. When the branch already has a row (a repeat, or a Cancel that
        // came first) or the business change fails, that is undone and the call runs barrier
        // first: lock the row, answer from it if decided, else hold under the lock. A resource
        // that can writes a first Try as one autocommit statement instead, and falls back to
        // the two when it cannot; one that takes Tries in batches queues a first Try behind
        // others in flight, and runs it its own way otherwise.
        let own_way = if self.resource.tries_in_one_statement() {
            Way::InOne
        } else {
            Way::Transaction {
                barrier_first: false,
            }
        };
        let mut way = if self.resource.barrier_only() {
            // No business change: the barrier row alone, one statement, no transaction.
            if self.barrier_only_writes().insert_held(branch).await? {
                return Ok(TryAnswer::Held);
            }
            Way::Transaction {
                barrier_first: true,
            }
        } else if DB::BATCHES_BARRIER_ONLY && self.resource.tries_in_batches() {
            Way::Batch
        } else {
            own_way
        };
        let mut reclaimed = false;
        // Counts this Try in flight (while it is, others queue for a batch).
        let mut _in_flight = None;
        loop {
            let reason = match way {
                Way::Batch => {
                    // As for a Try alone: the failpoints stand before the writes and after
                    // the commit.
                    faults::check("participant.try.between")?;
                    let (in_flight, answer) = self.try_batches().try_in_batch(branch).await;
                    _in_flight = Some(in_flight);
                    // Only the first time round: a rerun (not answered, or after a reclaim)
                    // goes its own way.
                    way = own_way;
                    match answer {
                        None => continue,
                        Some(Batched::Held) => {
                            faults::check("participant.try.committed")?;
                            return Ok(TryAnswer::Held);
                        }
                        Some(Batched::Rejected(reason)) => return Ok(TryAnswer::Rejected(reason)),
                        Some(Batched::Refused(reason)) => reason,
                    }
                }
                Way::InOne => match self.try_in_one(branch).await? {
                    Some(TryAnswer::Held) => return Ok(TryAnswer::Held),
                    Some(TryAnswer::Rejected(reason)) => reason,
                    None => {
                        way = Way::Transaction {
                            barrier_first: false,
                        };
                        continue;
                    }
                },
                Way::Transaction { barrier_first } => {
                    match self.try_in_transaction(branch, barrier_first).await? {
                        TryInTransaction::Answered(answer) => return Ok(answer),
                        TryInTransaction::Refused(reason) => reason,
                        TryInTransaction::BarrierFirst => {
                            way = Way::Transaction {
                                barrier_first: true,
                            };
                            continue;
                        }
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
            let barrier_first = way
                == Way::Transaction {
                    barrier_first: true,
                };
            if !barrier_first {
                // A first Try (the common case, e.g. a sale's losers): the refusal is the
                // branch's new row, one statement (`acquire_write`). A row already there (a
                // call for the branch came first) is answered from below.
                let mut conn = DB::acquire_write(&self.pool).await?;
                let phase = BarrierPhase::Rejected;
                let inserted =
                    DB::insert_try(&mut *conn, &self.name, branch, phase, &rejected).await?;
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
}
