//! A service's long-running background loops kept running. The coordinator's recovery (expiry
//! and every unfinished decision), retention, event follower and event sinks, and a
//! participant's orphan reclaimer, retention and stock-redis reconciler each run as a task
//! that [`keep_running`] starts again when it panics - a bug hit in one pass - after a pause,
//! logged and counted ([`BACKGROUND_RESTARTS`]`{task}`). Without it the loop would end with
//! the panic while the process went on serving: holds no longer expiring, Subscribe streams
//! and sinks silent, orphaned holds never given back, until someone restarted it.
//!
//! What a panicking pass was doing is left as a crash leaves it: a reservation it had
//! claimed stays leased until its lease runs out, then any instance recovers it; a sink's
//! delivery resumes from its durable cursor.

use std::future::Future;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Background loops that panicked and were started again, by `task`.
pub const BACKGROUND_RESTARTS: &str = "holdfast_background_restarts_total";

/// The pause before the first restart; it doubles up to [`MAX_PAUSE`] while the loop keeps
/// panicking, so a pass that always panics logs once a minute, not in a spin.
const FIRST_PAUSE: Duration = Duration::from_secs(1);

/// The longest pause between restarts.
const MAX_PAUSE: Duration = Duration::from_secs(60);

/// A run this long counts as healthy: the next panic restarts after [`FIRST_PAUSE`] again.
const HEALTHY_RUN: Duration = Duration::from_secs(60);

/// Runs the loop `start` makes, in a task of its own, until it returns (when `stop` turns
/// true, or for good), `stop` turns true while it is paused after a panic, or this future is
/// dropped (the loop's task is aborted with it). A loop that panics is started again after a
/// pause; `task` names it in the log and the metric. A `stop` whose sender is gone never
/// turns true: such a loop runs until its task is aborted.
pub async fn keep_running<F, L>(
    task: impl Into<String> + Send,
    mut stop: watch::Receiver<bool>,
    start: F,
) where
    F: Fn() -> L,
    L: Future<Output = ()> + Send + 'static,
{
    let task: String = task.into();
    let mut pause = FIRST_PAUSE;
    loop {
        let started = Instant::now();
        let mut run = AbortOnDrop(tokio::spawn(start()));
        let panic = match (&mut run.0).await {
            Ok(()) => return,
            Err(e) if e.is_panic() => e,
            // Cancelled: the runtime is shutting down.
            Err(_) => return,
        };
        if started.elapsed() >= HEALTHY_RUN {
            pause = FIRST_PAUSE;
        }
        metrics::counter!(BACKGROUND_RESTARTS, "task" => task.clone()).increment(1);
        tracing::error!(task = %task, error = %panic, restart_in = ?pause, "background task panicked; starting it again");
        let stopped = async {
            if stop.wait_for(|stopping| *stopping).await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            () = stopped => return,
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

/// Spawns [`keep_running`] for a loop without a stop: it runs until the returned handle is
/// aborted (which aborts the loop's task too).
pub fn spawn_until_aborted<F, L>(
    task: impl Into<String> + Send + 'static,
    start: F,
) -> JoinHandle<()>
where
    F: Fn() -> L + Send + 'static,
    L: Future<Output = ()> + Send + 'static,
{
    let (_, never) = watch::channel(false);
    tokio::spawn(keep_running(task, never, start))
}

/// `task`'s series of [`BACKGROUND_RESTARTS`] at zero (an alert has a series to read before the
/// first restart).
pub fn restarts_at_zero(task: impl Into<String>) {
    metrics::counter!(BACKGROUND_RESTARTS, "task" => task.into()).increment(0);
}

/// A loop's task, aborted when whoever waits for it goes away.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The failpoint `name` at the start of a background loop's pass (the `failpoints` feature,
/// RELIABILITY.md): `panic` panics the loop's task, the only action these take.
#[cfg(feature = "failpoints")]
pub fn pass_failpoint(name: &str) {
    fail::eval(name, |_| ());
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn pass_failpoint(_name: &str) {}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// A loop that panics on its first two runs is started again each time (after 1 s, then
    /// 2 s) and its third run is the one that returns; a stop while paused ends it without
    /// another run.
    #[tokio::test]
    async fn a_panicking_loop_is_started_again_until_it_returns() {
        let runs = Arc::new(AtomicU32::new(0));
        let (_stop, stopping) = watch::channel(false);
        let counted = runs.clone();
        keep_running("test", stopping, move || {
            let run = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                assert!(run >= 2, "planned panic of run {run}");
            }
        })
        .await;
        assert_eq!(runs.load(Ordering::SeqCst), 3);

        let runs = Arc::new(AtomicU32::new(0));
        let (stop, stopping) = watch::channel(false);
        let counted = runs.clone();
        let kept = tokio::spawn(keep_running("test", stopping, move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async { panic!("planned panic") }
        }));
        stop.send(true).expect("the loop listens");
        kept.await.expect("keep_running returns");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    /// A `stop` whose sender is gone does not end the pause: the loop is started again.
    /// Aborting [`spawn_until_aborted`]'s task aborts the loop's task too.
    #[tokio::test]
    async fn without_a_stop_a_loop_runs_until_aborted() {
        let runs = Arc::new(AtomicU32::new(0));
        let (_, never) = watch::channel(false);
        let counted = runs.clone();
        keep_running("test", never.clone(), move || {
            let run = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                assert!(run >= 1, "planned panic of run {run}");
            }
        })
        .await;
        assert_eq!(runs.load(Ordering::SeqCst), 2);

        let (started, mut running) = watch::channel(false);
        let (ended, mut gone) = watch::channel(false);
        let kept = spawn_until_aborted("test", move || {
            let (started, ended) = (started.clone(), ended.clone());
            async move {
                // Told when this task is dropped (aborted).
                struct Ended(watch::Sender<bool>);
                impl Drop for Ended {
                    fn drop(&mut self) {
                        let _ = self.0.send(true);
                    }
                }
                let _ended = Ended(ended);
                let _ = started.send(true);
                std::future::pending::<()>().await;
            }
        });
        running.wait_for(|r| *r).await.expect("the loop started");
        kept.abort();
        gone.wait_for(|g| *g).await.expect("the loop's task ended");
    }
}
