//! A barrier-only resource's writes ([`crate::Resource::barrier_only`]): a first Try, and a
//! Confirm or Cancel of a held branch, are each one autocommit statement on the barrier
//! table. Concurrent ones are group-committed where the database gains by it
//! ([`Backend::BATCHES_BARRIER_ONLY`], PostgreSQL): they queue in a [`Batcher`] and reach the
//! database as one statement (one round trip, one commit) for the batch.
//!
//! A call made while no other of its kind is in flight runs alone in the caller's task, as
//! before batching: an idle participant pays no hop. A batch that fails as a whole runs each
//! of its calls alone, each in a task of its own (a database that is down fails them all at
//! once, not one timeout after another), so one call's error is its own; a branch twice in
//! one batch runs its second call alone after the batch's statement. Those reruns are safe:
//! a first Try whose row the failed batch did write finds it and answers from it, and a held
//! branch the batch did move is no longer `Held` (the caller then answers from its row).

use holdfast_serve::db::batch::{Batcher, InFlight, distinct_by};
use sqlx::Pool;
use tokio::sync::oneshot;

use crate::barrier::{Backend, BarrierPhase};
use crate::{BranchCtx, BranchKey, ResourceError, TryAnswer};

/// Most calls of one kind in one statement.
const MAX_BATCH: usize = 256;

/// What a queued call is answered: whether its row was written (inserted, or moved).
type Reply = oneshot::Sender<Result<bool, ResourceError>>;

/// A queued first Try.
struct TryJob {
    branch: BranchCtx,
    reply: Reply,
}

/// A queued Confirm or Cancel of a held branch.
struct AdvanceJob {
    key: BranchKey,
    reply: Reply,
}

/// The queues of one participant's barrier-only writes: first Tries, and held branches moved
/// to `Confirmed` or to `Cancelled` (a queue each, so a batch has one target phase).
pub(crate) struct BarrierOnlyWrites<DB: Backend> {
    pool: Pool<DB>,
    participant: std::sync::Arc<str>,
    tries: Option<Batcher<TryJob>>,
    confirms: Option<Batcher<AdvanceJob>>,
    cancels: Option<Batcher<AdvanceJob>>,
}

impl<DB: Backend> BarrierOnlyWrites<DB> {
    /// Starts the batch tasks on the current runtime when `DB` batches these writes (they end
    /// with the runtime); otherwise every call runs alone.
    pub(crate) fn spawn(pool: Pool<DB>, participant: std::sync::Arc<str>) -> Self {
        let batches = DB::BATCHES_BARRIER_ONLY;
        let tries = batches.then(|| {
            let (pool, name) = (pool.clone(), participant.clone());
            Batcher::spawn(MAX_BATCH, move |jobs| {
                run_tries(pool.clone(), name.clone(), jobs)
            })
        });
        let advances = |to: BarrierPhase| {
            batches.then(|| {
                let (pool, name) = (pool.clone(), participant.clone());
                Batcher::spawn(MAX_BATCH, move |jobs| {
                    run_advances(pool.clone(), name.clone(), to, jobs)
                })
            })
        };
        BarrierOnlyWrites {
            confirms: advances(BarrierPhase::Confirmed),
            cancels: advances(BarrierPhase::Cancelled),
            pool,
            participant,
            tries,
        }
    }

    /// A first Try: true if the branch's row was inserted, `Held`; false if the branch has a
    /// row already (nothing written; answer from it).
    pub(crate) async fn insert_held(&self, branch: &BranchCtx) -> Result<bool, ResourceError> {
        let (_in_flight, queue) = busy(&self.tries);
        let Some(batcher) = queue else {
            return try_alone(&self.pool, &self.participant, branch).await;
        };
        let (reply, answer) = oneshot::channel();
        let job = TryJob {
            branch: branch.clone(),
            reply,
        };
        match batcher.submit(job) {
            Ok(()) => answer.await.unwrap_or_else(batch_task_gone),
            Err(job) => try_alone(&self.pool, &self.participant, &job.branch).await,
        }
    }

    /// A held branch moved to `to` (`Confirmed` or `Cancelled`): true if it moved; false if
    /// it was not `Held` (nothing written).
    pub(crate) async fn advance_held(
        &self,
        key: &BranchKey,
        to: BarrierPhase,
    ) -> Result<bool, ResourceError> {
        let none = None;
        let queue = match to {
            BarrierPhase::Confirmed => &self.confirms,
            BarrierPhase::Cancelled => &self.cancels,
            // No queue moves a branch anywhere else: alone.
            _ => &none,
        };
        let (_in_flight, queue) = busy(queue);
        let Some(batcher) = queue else {
            return advance_alone(&self.pool, &self.participant, key, to).await;
        };
        let (reply, answer) = oneshot::channel();
        let job = AdvanceJob {
            key: key.clone(),
            reply,
        };
        match batcher.submit(job) {
            Ok(()) => answer.await.unwrap_or_else(batch_task_gone),
            Err(job) => advance_alone(&self.pool, &self.participant, &job.key, to).await,
        }
    }
}

/// Counts a call in (keep the guard until it is answered, alone or not) and gives the
/// batcher to queue on when one runs and another call of its kind is in flight; `None`: run
/// alone.
fn busy<J: Send + 'static>(
    batcher: &Option<Batcher<J>>,
) -> (Option<InFlight>, Option<&Batcher<J>>) {
    let Some(batcher) = batcher else {
        return (None, None);
    };
    let (in_flight, idle) = batcher.enter();
    (Some(in_flight), (!idle).then_some(batcher))
}

async fn try_alone<DB: Backend>(
    pool: &Pool<DB>,
    participant: &str,
    branch: &BranchCtx,
) -> Result<bool, ResourceError> {
    let mut conn = DB::acquire_write(pool).await?;
    let held = TryAnswer::Held;
    DB::insert_try(&mut *conn, participant, branch, BarrierPhase::Held, &held).await
}

async fn advance_alone<DB: Backend>(
    pool: &Pool<DB>,
    participant: &str,
    key: &BranchKey,
    to: BarrierPhase,
) -> Result<bool, ResourceError> {
    let mut conn = DB::acquire_write(pool).await?;
    Ok(DB::advance_held(&mut *conn, participant, key, to)
        .await?
        .is_some())
}

/// Runs queued first Tries: distinct branches in one statement; should that fail, each alone.
async fn run_tries<DB: Backend>(
    pool: Pool<DB>,
    participant: std::sync::Arc<str>,
    jobs: Vec<TryJob>,
) {
    let (batch, repeats) = distinct_by(jobs, |j| j.branch.key.clone());
    let shared = if batch.len() > 1 {
        let branches: Vec<&BranchCtx> = batch.iter().map(|j| &j.branch).collect();
        let written = async {
            let mut conn = DB::acquire_write(&pool).await?;
            DB::insert_held_batch(&mut *conn, &participant, &branches).await
        };
        written.await.map_err(batch_failed).ok()
    } else {
        None
    };
    let failed = shared.is_none() && batch.len() > 1;
    let mut shared = shared.map(Vec::into_iter);
    for job in batch.into_iter().chain(repeats) {
        match shared.as_mut().and_then(Iterator::next) {
            Some(inserted) => {
                let _ = job.reply.send(Ok(inserted));
            }
            // The calls of a failed batch, each in a task of its own.
            None if failed => {
                let (pool, participant) = (pool.clone(), participant.clone());
                tokio::spawn(async move {
                    let answer = try_alone(&pool, &participant, &job.branch).await;
                    let _ = job.reply.send(answer);
                });
            }
            // A call alone (or a repeat) runs here: calls arriving meanwhile queue for the
            // next batch.
            None => {
                let answer = try_alone(&pool, &participant, &job.branch).await;
                let _ = job.reply.send(answer);
            }
        }
    }
}

/// Runs queued moves of held branches to `to`: distinct branches in one statement; should
/// that fail, each alone.
async fn run_advances<DB: Backend>(
    pool: Pool<DB>,
    participant: std::sync::Arc<str>,
    to: BarrierPhase,
    jobs: Vec<AdvanceJob>,
) {
    let (batch, repeats) = distinct_by(jobs, |j| j.key.clone());
    let shared = if batch.len() > 1 {
        let keys: Vec<&BranchKey> = batch.iter().map(|j| &j.key).collect();
        let moved = async {
            let mut conn = DB::acquire_write(&pool).await?;
            DB::advance_held_batch(&mut *conn, &participant, &keys, to).await
        };
        moved.await.map_err(batch_failed).ok()
    } else {
        None
    };
    let failed = shared.is_none() && batch.len() > 1;
    let mut shared = shared.map(Vec::into_iter);
    for job in batch.into_iter().chain(repeats) {
        match shared.as_mut().and_then(Iterator::next) {
            Some(moved) => {
                let _ = job.reply.send(Ok(moved));
            }
            // The calls of a failed batch, each in a task of its own.
            None if failed => {
                let (pool, participant) = (pool.clone(), participant.clone());
                tokio::spawn(async move {
                    let answer = advance_alone(&pool, &participant, &job.key, to).await;
                    let _ = job.reply.send(answer);
                });
            }
            // A call alone (or a repeat) runs here: calls arriving meanwhile queue for the
            // next batch.
            None => {
                let answer = advance_alone(&pool, &participant, &job.key, to).await;
                let _ = job.reply.send(answer);
            }
        }
    }
}

/// Logs a batch that failed as a whole (its calls are then run alone).
fn batch_failed(e: ResourceError) {
    tracing::warn!(error = %e, "a batch of barrier writes failed; running each of its calls alone");
}

/// The answer of a batcher whose task went away with its runtime.
fn batch_task_gone<T>(_: oneshot::error::RecvError) -> Result<T, ResourceError> {
    Err(ResourceError::Database(sqlx::Error::WorkerCrashed))
}
