//! A barrier-only resource's writes ([`crate::Shortcuts::barrier_only`]): a first Try, and a
//! Confirm or Cancel of a held branch, are each one statement on the barrier table
//! ([`Backend::acquire_write`]: autocommit on PostgreSQL, a member of the writer's group
//! commit on SQLite, sharing its fsync). On PostgreSQL concurrent ones also share a statement
//! ([`Backend::BATCHES_BARRIER_ONLY`]): they queue in a [`Batcher`] and reach the database as
//! one statement (one round trip, one commit) for the batch.
//!
//! A call made while no other of its kind is in flight runs alone in the caller's task, as
//! before batching: an idle participant pays no hop. A batch that fails as a whole runs each
//! of its calls alone, each in a task of its own (a database that is down fails them all at
//! once, not one timeout after another), so one call's error is its own; a branch twice in
//! one batch runs its second call alone after the batch's statement. Those reruns are safe:
//! a first Try whose row the failed batch did write finds it and answers from it, and a held
//! branch the batch did move is no longer `Held` (the caller then answers from its row).

use std::future::Future;
use std::sync::Arc;

use holdfast_serve::db::batch::{Batcher, InFlight, distinct_by};
use sqlx::Pool;
use tokio::sync::oneshot;

use crate::barrier::{Backend, BarrierPhase};
use crate::{BranchCtx, BranchKey, ResourceError, TryAnswer};

/// Most calls of one kind in one statement.
const MAX_BATCH: usize = 256;

/// One kind of barrier-only write: a first Try (a [`BranchCtx`], written `Held`) or a held
/// branch moved to a phase (a [`BranchKey`]). Its answer: whether its row was written.
trait Write: Clone + Send + Sync + 'static {
    fn key(&self) -> &BranchKey;

    /// This write alone, one statement ([`Backend::acquire_write`]); `to` is the queue's
    /// target phase.
    fn alone<DB: Backend>(
        &self,
        pool: &Pool<DB>,
        participant: &str,
        to: BarrierPhase,
    ) -> impl Future<Output = Result<bool, ResourceError>> + Send;

    /// Many writes of this kind (distinct branches) in one statement, an answer each.
    fn batch<DB: Backend>(
        pool: &Pool<DB>,
        participant: &str,
        writes: &[&Self],
        to: BarrierPhase,
    ) -> impl Future<Output = Result<Vec<bool>, ResourceError>> + Send;
}

impl Write for BranchCtx {
    fn key(&self) -> &BranchKey {
        &self.key
    }

    async fn alone<DB: Backend>(
        &self,
        pool: &Pool<DB>,
        participant: &str,
        _: BarrierPhase,
    ) -> Result<bool, ResourceError> {
        let mut conn = DB::acquire_write(pool).await?;
        let held = TryAnswer::Held;
        let inserted =
            DB::insert_try(&mut *conn, participant, self, BarrierPhase::Held, &held).await?;
        DB::finish_write(conn).await?;
        Ok(inserted)
    }

    async fn batch<DB: Backend>(
        pool: &Pool<DB>,
        participant: &str,
        writes: &[&Self],
        _: BarrierPhase,
    ) -> Result<Vec<bool>, ResourceError> {
        let mut conn = DB::acquire_write(pool).await?;
        let inserted = DB::insert_held_batch(&mut *conn, participant, writes).await?;
        DB::finish_write(conn).await?;
        Ok(inserted)
    }
}

impl Write for BranchKey {
    fn key(&self) -> &BranchKey {
        self
    }

    async fn alone<DB: Backend>(
        &self,
        pool: &Pool<DB>,
        participant: &str,
        to: BarrierPhase,
    ) -> Result<bool, ResourceError> {
        let mut conn = DB::acquire_write(pool).await?;
        let moved = DB::advance_held(&mut *conn, participant, self, to).await?;
        DB::finish_write(conn).await?;
        Ok(moved.is_some())
    }

    async fn batch<DB: Backend>(
        pool: &Pool<DB>,
        participant: &str,
        writes: &[&Self],
        to: BarrierPhase,
    ) -> Result<Vec<bool>, ResourceError> {
        let mut conn = DB::acquire_write(pool).await?;
        let moved = DB::advance_held_batch(&mut *conn, participant, writes, to).await?;
        DB::finish_write(conn).await?;
        Ok(moved)
    }
}

/// A queued call.
struct Job<W> {
    write: W,
    reply: oneshot::Sender<Result<bool, ResourceError>>,
}

/// One queue: its batcher (none when the database does not batch) and its target phase.
struct Queue<W> {
    batcher: Option<Batcher<Job<W>>>,
    to: BarrierPhase,
}

/// The queues of one participant's barrier-only writes: first Tries, and held branches moved
/// to `Confirmed` or to `Cancelled` (a queue each, so a batch has one target phase).
pub(crate) struct BarrierOnlyWrites<DB: Backend> {
    pool: Pool<DB>,
    participant: Arc<str>,
    tries: Queue<BranchCtx>,
    confirms: Queue<BranchKey>,
    cancels: Queue<BranchKey>,
}

impl<DB: Backend> BarrierOnlyWrites<DB> {
    /// Starts the batch tasks on the current runtime when `DB` batches these writes (they end
    /// with the runtime); otherwise every call runs alone.
    pub(crate) fn spawn(pool: Pool<DB>, participant: Arc<str>) -> Self {
        BarrierOnlyWrites {
            tries: queue(&pool, &participant, BarrierPhase::Held),
            confirms: queue(&pool, &participant, BarrierPhase::Confirmed),
            cancels: queue(&pool, &participant, BarrierPhase::Cancelled),
            pool,
            participant,
        }
    }

    /// A first Try: true if the branch's row was inserted, `Held`; false if the branch has a
    /// row already (nothing written; answer from it).
    pub(crate) async fn insert_held(&self, branch: &BranchCtx) -> Result<bool, ResourceError> {
        self.write(&self.tries, branch).await
    }

    /// A held branch moved to `to` (`Confirmed` or `Cancelled`): true if it moved; false if
    /// it was not `Held` (nothing written).
    pub(crate) async fn advance_held(
        &self,
        key: &BranchKey,
        to: BarrierPhase,
    ) -> Result<bool, ResourceError> {
        match to {
            BarrierPhase::Confirmed => self.write(&self.confirms, key).await,
            BarrierPhase::Cancelled => self.write(&self.cancels, key).await,
            // No queue moves a branch anywhere else: alone.
            _ => key.alone(&self.pool, &self.participant, to).await,
        }
    }

    /// `write` on `queue`: alone when no other call of its kind is in flight (or nothing
    /// batches), else queued for the next batch.
    async fn write<W: Write>(&self, queue: &Queue<W>, write: &W) -> Result<bool, ResourceError> {
        let (_in_flight, batcher) = busy(&queue.batcher);
        let Some(batcher) = batcher else {
            return write.alone(&self.pool, &self.participant, queue.to).await;
        };
        let (reply, answer) = oneshot::channel();
        let job = Job {
            write: write.clone(),
            reply,
        };
        match batcher.submit(job) {
            Ok(()) => answer.await.unwrap_or_else(batch_task_gone),
            Err(job) => {
                job.write
                    .alone(&self.pool, &self.participant, queue.to)
                    .await
            }
        }
    }
}

/// A queue for `to`, with its batch task when `DB` batches barrier-only writes.
fn queue<DB: Backend, W: Write>(
    pool: &Pool<DB>,
    participant: &Arc<str>,
    to: BarrierPhase,
) -> Queue<W> {
    let batcher = DB::BATCHES_BARRIER_ONLY.then(|| {
        let (pool, participant) = (pool.clone(), participant.clone());
        Batcher::spawn(MAX_BATCH, move |jobs| {
            run(pool.clone(), participant.clone(), to, jobs)
        })
    });
    Queue { batcher, to }
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

/// Runs queued calls of one kind: distinct branches in one statement; should that fail, each
/// alone in a task of its own. A call alone, or a repeat, runs here: calls arriving meanwhile
/// queue for the next batch.
async fn run<DB: Backend, W: Write>(
    pool: Pool<DB>,
    participant: Arc<str>,
    to: BarrierPhase,
    jobs: Vec<Job<W>>,
) {
    let (batch, repeats) = distinct_by(jobs, |j| j.write.key().clone());
    let shared = if batch.len() > 1 {
        let writes: Vec<&W> = batch.iter().map(|j| &j.write).collect();
        let written = W::batch(&pool, &participant, &writes, to).await;
        written.map_err(batch_failed).ok()
    } else {
        None
    };
    let failed = shared.is_none() && batch.len() > 1;
    let mut shared = shared.map(Vec::into_iter);
    for job in batch.into_iter().chain(repeats) {
        match shared.as_mut().and_then(Iterator::next) {
            Some(written) => {
                let _ = job.reply.send(Ok(written));
            }
            None if failed => {
                let (pool, participant) = (pool.clone(), participant.clone());
                tokio::spawn(async move {
                    let answer = job.write.alone(&pool, &participant, to).await;
                    let _ = job.reply.send(answer);
                });
            }
            None => {
                let answer = job.write.alone(&pool, &participant, to).await;
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
