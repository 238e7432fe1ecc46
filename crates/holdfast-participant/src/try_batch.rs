//! First Tries group-committed for a resource that takes them in batches
//! ([`crate::Shortcuts::tries_in_batches`], on a database that batches:
//! [`Backend::BATCHES_BARRIER_ONLY`]). Concurrent first Tries queue in a [`Batcher`] and reach
//! the database as one transaction: the batch's barrier rows in one statement (answered
//! `Held`; a branch that has a row already is left out), the resource's business change for
//! all of them ([`crate::Shortcuts::try_hold_batch`]), the refused ones' rows made `Rejected`
//! (or deleted while orphaned holds exist), one COMMIT. Lock order is the general way's: barrier rows (in key order), then business
//! rows. A contended business row (a sale's one stock item) is then locked once per batch
//! instead of once per Try, each in turn.
//!
//! A call made while no other first Try is in flight is not queued: the caller runs it its
//! own way. A batch answers each call `Held`, `Rejected` (recorded), `Refused` (nothing of it
//! is written; the caller reclaims the orphans and tries again, as after any refused first
//! Try) or nothing: the caller then runs it its
//! own way - a branch with a row already (answered from it there), a branch twice in one
//! batch, and every call of a batch that failed (rolled back as a whole; each caller runs
//! alone in its own task). A batch of one is a batch too: while it is in the database, the
//! Tries arriving meanwhile queue for the next.

use std::sync::Arc;

use holdfast_serve::db::WriteTransaction;
use holdfast_serve::db::batch::{Batcher, InFlight, distinct_by};
use sqlx::Pool;
use tokio::sync::oneshot;

use crate::barrier::Backend;
use crate::{BranchCtx, BranchKey, Resource, ResourceError, TryAnswer};

/// Most first Tries in one batch.
const MAX_BATCH: usize = 256;

/// What a batch made of a first Try.
#[derive(Debug)]
pub(crate) enum Batched {
    /// Held and recorded.
    Held,
    /// Refused and recorded: the answer.
    Rejected(String),
    /// Refused with nothing written (orphaned holds exist: the caller reclaims them and
    /// tries again, or records the refusal).
    Refused(String),
}

/// A queued first Try and where its answer goes (`None`: run it your own way).
struct Job {
    branch: BranchCtx,
    reply: oneshot::Sender<Option<Batched>>,
}

/// One participant's queue of first Tries.
pub(crate) struct TryBatches {
    batcher: Batcher<Job>,
}

impl TryBatches {
    /// Starts the batch task on the current runtime (it ends with the runtime).
    pub(crate) fn spawn<R: Resource<DB>, DB: Backend>(
        pool: Pool<DB>,
        participant: Arc<str>,
        resource: Arc<R>,
    ) -> Self {
        let batcher = Batcher::spawn(MAX_BATCH, move |jobs| {
            run(pool.clone(), participant.clone(), resource.clone(), jobs)
        });
        TryBatches { batcher }
    }

    /// A first Try: its answer from a batch, or `None` when the caller should run it its own
    /// way (no other first Try in flight, or the batch could not answer it). Keep the guard
    /// until the Try is answered, whichever way: it counts the Try in flight, so that Tries
    /// arriving meanwhile queue.
    pub(crate) async fn try_in_batch(&self, branch: &BranchCtx) -> (InFlight, Option<Batched>) {
        let (in_flight, idle) = self.batcher.enter();
        if idle {
            return (in_flight, None);
        }
        let (reply, answer) = oneshot::channel();
        let job = Job {
            branch: branch.clone(),
            reply,
        };
        if self.batcher.submit(job).is_err() {
            return (in_flight, None);
        }
        (in_flight, answer.await.ok().flatten())
    }
}

/// Runs one batch and answers each job.
async fn run<R: Resource<DB>, DB: Backend>(
    pool: Pool<DB>,
    participant: Arc<str>,
    resource: Arc<R>,
    jobs: Vec<Job>,
) {
    let (batch, repeats) = distinct_by(jobs, |j| j.branch.key.clone());
    for job in repeats {
        let _ = job.reply.send(None);
    }
    let branches: Vec<&BranchCtx> = batch.iter().map(|j| &j.branch).collect();
    let answers = match hold_batch(&pool, &participant, resource.as_ref(), &branches).await {
        Ok(answers) => answers,
        Err(e) => {
            tracing::warn!(error = %e, "a batch of first Tries failed; running each alone");
            batch.iter().map(|_| None).collect()
        }
    };
    for (job, answer) in batch.into_iter().zip(answers) {
        let _ = job.reply.send(answer);
    }
}

/// The batch's transaction: an answer per branch (`None`: the branch has a row already).
/// Refusals are recorded in it, unless orphaned holds exist: then their rows are deleted and
/// each caller reclaims and tries again, as after any refused first Try.
async fn hold_batch<R: Resource<DB>, DB: Backend>(
    pool: &Pool<DB>,
    participant: &str,
    resource: &R,
    branches: &[&BranchCtx],
) -> Result<Vec<Option<Batched>>, ResourceError> {
    let mut tx = DB::begin_write(pool).await?;
    let inserted = DB::insert_held_batch(&mut *tx, participant, branches).await?;
    let fresh: Vec<&BranchCtx> = branches
        .iter()
        .zip(&inserted)
        .filter_map(|(b, inserted)| inserted.then_some(*b))
        .collect();
    let answers = if fresh.is_empty() {
        Vec::new()
    } else {
        let shortcuts = resource.shortcuts().ok_or_else(|| {
            ResourceError::Internal("a batch of Tries for a resource without shortcuts".into())
        })?;
        shortcuts.try_hold_batch(&mut *tx, &fresh).await?
    };
    if answers.len() != fresh.len() {
        return Err(ResourceError::Internal(format!(
            "try_hold_batch answered {} of {} Tries",
            answers.len(),
            fresh.len()
        )));
    }
    let refused: Vec<(&BranchKey, &str)> = fresh
        .iter()
        .zip(&answers)
        .filter_map(|(b, answer)| match answer {
            TryAnswer::Rejected(reason) => Some((&b.key, reason.as_str())),
            TryAnswer::Held => None,
        })
        .collect();
    let record = refused.is_empty() || DB::settle_refused(&mut *tx, participant, &refused).await?;
    tx.commit().await?;
    let mut answers = answers.into_iter().map(|answer| match answer {
        TryAnswer::Held => Batched::Held,
        TryAnswer::Rejected(reason) if record => Batched::Rejected(reason),
        TryAnswer::Rejected(reason) => Batched::Refused(reason),
    });
    Ok(inserted
        .iter()
        .map(|inserted| if *inserted { answers.next() } else { None })
        .collect())
}
