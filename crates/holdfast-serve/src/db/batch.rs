//! Group commit's queue: concurrent calls of one kind of write wait in a [`Batcher`] for a
//! task that runs them as one batch (one statement, one round trip, one commit) and answers
//! each. Used by the coordinator's PostgreSQL store and by the participant SDK's barrier-only
//! writes.
//!
//! One task per batcher drains its queue: it takes every job waiting (up to a cap), lets the
//! tasks that are ready run for a few scheduler passes and takes what they queued too
//! (`GATHER_PASSES`), runs them as one batch, answers each, and takes the next. While a
//! batch is in the database, newcomers queue, so batches grow with load. A call made while no
//! other of its kind is in flight should run alone in the caller's task ([`Batcher::enter`]):
//! an idle service pays no hop.
//!
//! A batch whose run panics (a bug hit by one batch) fails its own jobs - their answers are
//! dropped with it, so each caller sees an error - and the task takes the next batch: the
//! queue outlives the panic, logged and counted as a background restart (`task="batch"`).

use std::collections::HashSet;
use std::future::Future;
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures_util::FutureExt;
use tokio::sync::mpsc;

use crate::background::BACKGROUND_RESTARTS;

/// How many times a batch's task yields to the scheduler before the batch leaves (fewer when
/// it is full), taking the jobs queued meanwhile. The first job wakes the task as soon as it
/// is sent, usually before the calls whose database answers or RPC responses came in the same
/// moment have run to their own submit; each yield lets every ready task run and the runtime
/// poll its sockets once (no timer: microseconds when nothing is ready). Under load those
/// calls then share the statement and the commit instead of each waiting for the next batch:
/// BENCHMARKS.md "Group commit gathers before it leaves" (commits per Reserve+Confirm 3.9 ->
/// 2.6, `throughput-noop` 1.2x).
pub(crate) const GATHER_PASSES: usize = 8;

/// Queues jobs of one kind for a task that runs them in batches.
#[derive(Debug)]
pub struct Batcher<J> {
    queue: Option<mpsc::UnboundedSender<J>>,
    /// Calls of this kind in flight (queued, or running alone).
    in_flight: Arc<AtomicUsize>,
}

/// A call in flight; counted until dropped (also when the caller's future is dropped).
#[derive(Debug)]
pub struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl<J: Send + 'static> Batcher<J> {
    /// Starts the task on the current runtime; `run` answers every job of the batch it is
    /// given (at most `max`). Outside a runtime no task is started and every job is handed
    /// back by [`Batcher::submit`].
    pub fn spawn<F, Fut>(max: usize, run: F) -> Self
    where
        F: Fn(Vec<J>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send,
    {
        let in_flight = Arc::new(AtomicUsize::new(0));
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Batcher {
                queue: None,
                in_flight,
            };
        };
        let (queue, mut jobs) = mpsc::unbounded_channel();
        runtime.spawn(async move {
            let mut batch = Vec::with_capacity(max);
            while jobs.recv_many(&mut batch, max).await > 0 {
                gather(&mut jobs, &mut batch, max).await;
                let batch = std::mem::replace(&mut batch, Vec::with_capacity(max));
                if let Err(panic) = AssertUnwindSafe(run(batch)).catch_unwind().await {
                    metrics::counter!(BACKGROUND_RESTARTS, "task" => "batch").increment(1);
                    let error = panic_message(panic.as_ref());
                    tracing::error!(
                        error,
                        "a group-commit batch panicked; its calls failed, the next batch runs"
                    );
                }
            }
        });
        Batcher {
            queue: Some(queue),
            in_flight,
        }
    }

    /// Counts a call in; true when no other call of this kind is in flight: then the caller
    /// should run it alone rather than queue it. Keep the guard until the call is answered.
    pub fn enter(&self) -> (InFlight, bool) {
        let before = self.in_flight.fetch_add(1, Ordering::AcqRel);
        (InFlight(self.in_flight.clone()), before == 0)
    }

    /// Queues `job`; hands it back when no task runs (none started, or its runtime is gone):
    /// the caller then runs it alone.
    pub fn submit(&self, job: J) -> Result<(), J> {
        match &self.queue {
            Some(queue) => queue.send(job).map_err(|e| e.0),
            None => Err(job),
        }
    }
}

/// Adds to `batch` (up to `max`) what is queued over `GATHER_PASSES` yields to the
/// scheduler.
async fn gather<J>(jobs: &mut mpsc::UnboundedReceiver<J>, batch: &mut Vec<J>, max: usize) {
    for _ in 0..GATHER_PASSES {
        if batch.len() >= max {
            return;
        }
        tokio::task::yield_now().await;
        while batch.len() < max {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
    }
}

/// What a panic said, when it said it with a string.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

/// Splits jobs into ones with distinct keys (they may share a statement) and repeats, each
/// part in arrival order.
pub fn distinct_by<J, K: Eq + Hash>(jobs: Vec<J>, key: impl Fn(&J) -> K) -> (Vec<J>, Vec<J>) {
    let mut seen = HashSet::with_capacity(jobs.len());
    jobs.into_iter().partition(|j| seen.insert(key(j)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_are_split_off_in_order() {
        let (distinct, repeats) = distinct_by(vec![1, 2, 1, 3, 2, 1], |j| *j);
        assert_eq!(distinct, vec![1, 2, 3]);
        assert_eq!(repeats, vec![1, 2, 1]);
    }

    #[test]
    fn outside_a_runtime_jobs_come_back() {
        let batcher: Batcher<u8> = Batcher::spawn(4, |_jobs| async {});
        assert_eq!(batcher.submit(7), Err(7));
    }

    /// Calls that become ready while the first job's task is being woken (here: one yield
    /// later) share its batch; without the gathering the first job left alone.
    #[tokio::test]
    async fn a_batch_takes_the_jobs_of_tasks_ready_meanwhile() {
        let (sizes_sent, mut sizes) = mpsc::unbounded_channel();
        let batcher = Arc::new(Batcher::spawn(16, move |jobs: Vec<u8>| {
            let sizes_sent = sizes_sent.clone();
            async move {
                let _ = sizes_sent.send(jobs.len());
            }
        }));
        assert_eq!(batcher.submit(0), Ok(()));
        for job in 1..4 {
            let batcher = batcher.clone();
            tokio::spawn(async move {
                tokio::task::yield_now().await;
                assert_eq!(batcher.submit(job), Ok(()));
            });
        }
        assert_eq!(sizes.recv().await, Some(4));
    }

    #[tokio::test]
    async fn a_full_batch_leaves_without_waiting() {
        let (sizes_sent, mut sizes) = mpsc::unbounded_channel();
        let batcher = Batcher::spawn(2, move |jobs: Vec<u8>| {
            let sizes_sent = sizes_sent.clone();
            async move {
                let _ = sizes_sent.send(jobs.len());
            }
        });
        for job in 0..5 {
            assert_eq!(batcher.submit(job), Ok(()));
        }
        let mut seen = Vec::new();
        while seen.iter().sum::<usize>() < 5 {
            seen.extend(sizes.recv().await);
        }
        assert_eq!(seen, vec![2, 2, 1]);
    }

    /// A batch that panics fails its own jobs only: the task goes on taking and running later
    /// ones (before, the panic ended the task and every later job was handed back).
    #[tokio::test]
    async fn a_batch_that_panics_leaves_the_queue_running() {
        let (ran_sent, mut ran) = mpsc::unbounded_channel();
        let batcher = Batcher::spawn(4, move |jobs: Vec<u8>| {
            let ran_sent = ran_sent.clone();
            async move {
                let _ = ran_sent.send(jobs.clone());
                assert!(!jobs.contains(&0), "job 0 panics");
            }
        });
        assert_eq!(batcher.submit(0), Ok(()));
        assert_eq!(ran.recv().await, Some(vec![0]));
        // The panic happened in the same poll as that send, before this task ran again.
        assert_eq!(batcher.submit(1), Ok(()));
        assert_eq!(ran.recv().await, Some(vec![1]));
    }

    #[tokio::test]
    async fn only_the_first_of_concurrent_calls_is_idle() {
        let batcher: Batcher<u8> = Batcher::spawn(4, |_jobs| async {});
        let (first, idle) = batcher.enter();
        assert!(idle);
        let (_second, idle) = batcher.enter();
        assert!(!idle);
        drop(first);
        let (_third, idle) = batcher.enter();
        assert!(!idle, "the second call is still in flight");
    }
}
