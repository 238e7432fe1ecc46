//! Group commit for the PostgreSQL store: concurrent calls of one kind of write queue up and
//! reach the database as one statement (one round trip, one commit) for the whole batch.
//!
//! One task per kind drains its queue: it takes every job waiting (up to a cap), runs them as
//! one batch, answers each, and takes the next. While a batch is in the database, newcomers
//! queue, so batches grow with load. A call made while no other of its kind is in flight runs
//! alone in the caller's task ([`Batcher::enter`]): an idle coordinator pays no hop.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::mpsc;

/// Queues jobs of one kind for a task that runs them in batches.
#[derive(Debug)]
pub(crate) struct Batcher<J> {
    queue: Option<mpsc::UnboundedSender<J>>,
    /// Calls of this kind in flight (queued, or running alone).
    in_flight: Arc<AtomicUsize>,
}

/// A call in flight; counted until dropped (also when the caller's future is dropped).
pub(crate) struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl<J: Send + 'static> Batcher<J> {
    /// Starts the task on the current runtime; `run` answers every job of the batch it is
    /// given. Outside a runtime no task is started and every job is handed back by
    /// [`Batcher::submit`].
    pub(crate) fn spawn<F, Fut>(max: usize, run: F) -> Self
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
    pub(crate) fn enter(&self) -> (InFlight, bool) {
        let before = self.in_flight.fetch_add(1, Ordering::AcqRel);
        (InFlight(self.in_flight.clone()), before == 0)
    }

    /// Queues `job`; hands it back when no task runs (none started, or its runtime is gone):
    /// the caller then runs it alone.
    pub(crate) fn submit(&self, job: J) -> Result<(), J> {
        match &self.queue {
            Some(queue) => queue.send(job).map_err(|e| e.0),
            None => Err(job),
        }
    }
}

/// The reservations this process last recorded as `HELD`, as recorded, so their Confirm or
/// Cancel can skip reading the row: the decision is applied by an UPDATE guarded by the cached
/// `version`, so a stale entry only makes it miss (then the row is read and locked). Bounded:
/// the oldest entries go first.
#[derive(Debug, Default)]
pub(crate) struct RecentlyHeld {
    inner: std::sync::Mutex<Recent>,
}

#[derive(Debug, Default)]
struct Recent {
    by_id: std::collections::HashMap<uuid::Uuid, crate::domain::Reservation>,
    order: std::collections::VecDeque<uuid::Uuid>,
}

/// Most reservations remembered.
const RECENTLY_HELD: usize = 4096;

impl RecentlyHeld {
    /// Remembers `r` (a reservation just recorded `HELD`).
    pub(crate) fn put(&self, r: &crate::domain::Reservation) {
        let Ok(mut recent) = self.inner.lock() else {
            return;
        };
        while recent.order.len() >= RECENTLY_HELD {
            if let Some(old) = recent.order.pop_front() {
                recent.by_id.remove(&old);
            }
        }
        recent.order.push_back(r.id);
        recent.by_id.insert(r.id, r.clone());
    }

    /// Takes the entry for `id`, if any (a decision uses it once).
    pub(crate) fn take(&self, id: uuid::Uuid) -> Option<crate::domain::Reservation> {
        self.inner.lock().ok()?.by_id.remove(&id)
    }
}
