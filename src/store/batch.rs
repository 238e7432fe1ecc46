//! Group commit for the PostgreSQL store: concurrent calls of one kind of write queue up and
//! reach the database as one statement (one round trip, one commit) for the whole batch.
//!
//! One task per kind drains its queue: it takes every job waiting (up to a cap), runs them as
//! one batch, answers each, and takes the next. While a batch is in the database, newcomers
//! queue, so batches grow with load and a lone caller waits for nobody.

use std::future::Future;

use tokio::sync::mpsc;

/// Queues jobs of one kind for a task that runs them in batches.
#[derive(Debug)]
pub(crate) struct Batcher<J> {
    queue: Option<mpsc::UnboundedSender<J>>,
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
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Batcher { queue: None };
        };
        let (queue, mut jobs) = mpsc::unbounded_channel();
        runtime.spawn(async move {
            let mut batch = Vec::with_capacity(max);
            while jobs.recv_many(&mut batch, max).await > 0 {
                run(std::mem::replace(&mut batch, Vec::with_capacity(max))).await;
            }
        });
        Batcher { queue: Some(queue) }
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
