//! Group commit's queue: concurrent calls of one kind of write wait in a [`Batcher`] for a
//! task that runs them as one batch (one statement, one round trip, one commit) and answers
//! each. Used by the coordinator's PostgreSQL store and by the participant SDK's barrier-only
//! writes.
//!
//! One task per batcher drains its queue: it takes every job waiting (up to a cap), runs them
//! as one batch, answers each, and takes the next. While a batch is in the database,
//! newcomers queue, so batches grow with load. A call made while no other of its kind is in
//! flight should run alone in the caller's task ([`Batcher::enter`]): an idle service pays no
//! hop.

use std::collections::HashSet;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::mpsc;

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
                run(std::mem::replace(&mut batch, Vec::with_capacity(max))).await;
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
