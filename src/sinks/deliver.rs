//! The delivery loop (SPEC 10): one per sink in each coordinator process. Replicas take turns
//! by the sink's lease in the database; the holder reads the log after the sink's durable
//! cursor, hands the events the sink wants to it in sequence order, and moves the cursor past
//! what was delivered and what the sink passes over. A failure is recorded (a sink failing for
//! its give-up period is paused until an operator resumes it) and retried from the cursor with
//! backoff; a caught-up sink waits for the feed to move instead of polling the database.
//!
//! Exactly once as far as the lease reaches: the lease is the coordinator's work lease
//! (`--lease`, which must outlast a delivery call), and the holder renews it before every
//! delivery and at least six times per lease, so a second replica only delivers after the
//! first stopped renewing. A process that dies between a delivery and its record hands the
//! same events over again once its lease ran out (at least once; events carry their
//! `event_id` for that).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;
use uuid::Uuid;

use super::{Sink, SinkError};
use crate::background::keep_running;
use crate::coordinator::Coordinator;
use crate::proto;
use crate::store::{StoreError, WorkLease};
use crate::telemetry::ops;
use crate::telemetry::ops::tasks;

/// The longest wait between renewals, lag refreshes, and looks at a lease another replica
/// holds or a paused sink.
const RENEW_AT_MOST_EVERY: Duration = Duration::from_secs(5);

/// Events read per page.
const PAGE: u32 = 500;

/// The shortest time between two reads of the log while events keep coming: under load a sink
/// takes what this long brought in one page (one read, one cursor write), not a page per
/// write. A page's read has a fixed part (the horizon, the statement: about 1.5 ms on the
/// bench machine) and a part per event (about 16 us), so fewer, fuller pages cost the
/// database less; the event lag stays far under SPEC 10's 1 s (BENCHMARKS.md "Events").
const BATCH_INTERVAL: Duration = Duration::from_millis(200);

/// How often, at most, the lag gauge is read from the database while delivering.
const LAG_REFRESH: Duration = Duration::from_secs(1);

/// The first retry delay after a failed delivery (doubling per failure, with jitter).
const BACKOFF_BASE: Duration = Duration::from_millis(500);

/// The longest retry delay (SPEC 10).
const BACKOFF_CAP: Duration = Duration::from_secs(300);

/// The give-up period recorded for a sink that is never paused (a century: no interval
/// arithmetic in the database overflows on it).
const NEVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Starts one delivery loop per sink over `coordinator`'s event log, each until `stopping`
/// turns true (a delivery in flight finishes and is recorded first). The handle ends when
/// every loop has; aborting it stops them all.
pub fn start(
    coordinator: Coordinator,
    sinks: Vec<Arc<dyn Sink>>,
    stopping: watch::Receiver<bool>,
) -> JoinHandle<()> {
    // This process, as the owner of the sinks' leases.
    let owner = Uuid::new_v4();
    let mut loops = tokio::task::JoinSet::new();
    for sink in sinks {
        let task = tasks::sink(sink.name());
        let lease = coordinator.lease_duration();
        let (coordinator, stop) = (coordinator.clone(), stopping.clone());
        // A loop that panics is started again (its lease is this process's still, its cursor
        // durable): it delivers from the cursor on.
        let delivery = move || {
            Delivery {
                lease,
                renew_every: (lease / 6).clamp(Duration::from_millis(50), RENEW_AT_MOST_EVERY),
                follow: coordinator.events().follow(),
                coordinator: coordinator.clone(),
                sink: sink.clone(),
                owner,
                stopping: stop.clone(),
                lag_read: None,
            }
            .run()
        };
        loops.spawn(keep_running(task, stopping.clone(), delivery));
    }
    tokio::spawn(async move { while loops.join_next().await.is_some() {} })
}

/// One sink's delivery loop.
struct Delivery {
    coordinator: Coordinator,
    sink: Arc<dyn Sink>,
    owner: Uuid,
    /// The feed's latest sequence: changes when there is more to read.
    follow: watch::Receiver<i64>,
    stopping: watch::Receiver<bool>,
    /// How long the holder owns the sink's delivery after a renewal: the work lease.
    lease: Duration,
    /// How often the holder renews (six times a lease, at most [`RENEW_AT_MOST_EVERY`]).
    renew_every: Duration,
    /// When the lag gauge was last read ([`LAG_REFRESH`]).
    lag_read: Option<Instant>,
}

/// Why the lease holder stopped delivering.
#[derive(Debug)]
enum Leave {
    Stopping,
    /// Another replica holds the lease now.
    LostLease,
    /// Failed past the sink's give-up period.
    Paused,
    Store(StoreError),
}

/// What one hand-over of a page achieved.
struct Handed {
    /// Every event of the page up to this sequence was delivered or passed over.
    through: Option<i64>,
    /// How many the sink took.
    delivered: usize,
    error: Option<SinkError>,
}

impl Delivery {
    fn name(&self) -> &str {
        self.sink.name()
    }

    fn log(&self) -> &dyn crate::store::events::EventLog {
        self.coordinator.events().log()
    }

    fn stopping(&self) -> bool {
        *self.stopping.borrow()
    }

    /// Until stopping: takes the lease when it is free and delivers while it holds it; waits
    /// while another replica holds it or the sink is paused.
    async fn run(mut self) {
        ops::sink_started(self.name());
        tracing::info!(sink = self.name(), "event sink started");
        while !self.stopping() {
            let lease = WorkLease {
                owner: self.owner,
                duration: self.lease,
            };
            match self.log().lease_sink(self.name(), lease).await {
                Ok(Some(state)) if !state.paused => {
                    ops::sink_paused(self.name(), false);
                    let left = self.deliver_while_leased(state.delivered_through).await;
                    match left {
                        Leave::Stopping | Leave::Paused => continue,
                        Leave::LostLease => {
                            tracing::info!(sink = self.name(), "another replica delivers now");
                        }
                        Leave::Store(e) => {
                            tracing::warn!(sink = self.name(), error = %e, "event delivery: the database failed; retrying");
                        }
                    }
                }
                Ok(Some(_paused)) => ops::sink_paused(self.name(), true),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(sink = self.name(), error = %e, "event sink lease failed; retrying");
                }
            }
            self.refresh_lag(true).await;
            self.wait(self.renew_every).await;
        }
        // Another replica may deliver at once (what this one delivered is recorded).
        if let Err(e) = self.log().release_sink(self.name(), self.owner).await {
            tracing::warn!(sink = self.name(), error = %e, "giving the event sink's lease up failed; it runs out by itself");
        }
        tracing::info!(sink = self.name(), "event sink stopped");
    }

    /// Delivers from `cursor` on for as long as this process holds the lease.
    async fn deliver_while_leased(&mut self, mut cursor: i64) -> Leave {
        let mut renewed = Instant::now();
        let mut failures = 0u32;
        loop {
            if self.stopping() {
                return Leave::Stopping;
            }
            crate::background::pass_failpoint("sinks.deliver.pass");
            if renewed.elapsed() >= self.renew_every {
                match self.renew().await {
                    Ok(through) => cursor = cursor.max(through),
                    Err(leave) => return leave,
                }
                renewed = Instant::now();
            }
            // Seen before reading: a sequence that moves after the read wakes the wait below.
            self.follow.borrow_and_update();
            let read_at = Instant::now();
            let page = match self.coordinator.events().page(cursor, None, PAGE).await {
                Ok(page) => page,
                Err(e) => return Leave::Store(e),
            };
            let Some(last) = page.last().map(|e| e.sequence) else {
                self.refresh_lag(true).await;
                self.await_more().await;
                continue;
            };
            let caught_up = page.len() < PAGE as usize;
            let page: Vec<proto::Event> =
                page.into_iter().map(crate::api::convert::event).collect();
            let handed = self.hand_over(&page).await;
            ops::events_delivered(self.name(), handed.delivered);
            if let Some(through) = handed.through {
                match self
                    .log()
                    .record_delivered(self.name(), self.owner, through)
                    .await
                {
                    Ok(true) => {}
                    Ok(false) => return Leave::LostLease,
                    Err(e) => return Leave::Store(e),
                }
                cursor = through;
                failures = 0;
                self.refresh_lag(false).await;
            }
            if let Some(error) = handed.error {
                failures = failures.saturating_add(1);
                if let Err(leave) = self.failed(&error).await {
                    return leave;
                }
                if let Err(leave) = self.back_off(backoff(failures), &mut renewed).await {
                    return leave;
                }
            } else if caught_up && handed.through == Some(last) {
                // All that was readable is delivered: wait for more, then let a batch gather.
                self.await_more().await;
                let gathered = read_at + BATCH_INTERVAL;
                if let Some(left) = gathered.checked_duration_since(Instant::now()) {
                    self.wait(left).await;
                }
            }
        }
    }

    /// Hands the events of `page` the sink wants to it, in order.
    async fn hand_over(&self, page: &[proto::Event]) -> Handed {
        // A sink that wants every event (NATS) is handed the page itself, not a copy of it.
        let picked: Vec<proto::Event>;
        let wanted: &[proto::Event] = if page.iter().all(|e| self.sink.wants(e)) {
            page
        } else {
            picked = page
                .iter()
                .filter(|e| self.sink.wants(e))
                .cloned()
                .collect();
            &picked
        };
        let (delivered, mut error) = if wanted.is_empty() {
            (0, None)
        } else {
            let result = self.sink.deliver(wanted).await;
            (result.delivered.min(wanted.len()), result.error)
        };
        let through = match wanted.get(delivered) {
            // All taken: the whole page is behind.
            None => page.last().map(|e| e.sequence),
            // Up to the first wanted event not taken.
            Some(next) => page
                .iter()
                .take_while(|e| e.sequence < next.sequence)
                .last()
                .map(|e| e.sequence),
        };
        if delivered == 0 && error.is_none() && !wanted.is_empty() {
            error = Some(SinkError("the sink took none of the events".into()));
        }
        Handed {
            through,
            delivered,
            error,
        }
    }

    /// Records a failed delivery: `Err` when the holder must stop (paused, lease lost).
    async fn failed(&self, error: &SinkError) -> Result<(), Leave> {
        let give_up = self.sink.give_up().unwrap_or(NEVER);
        let recorded = self
            .log()
            .record_sink_failure(self.name(), self.owner, &error.0, give_up)
            .await;
        match recorded {
            Ok(Some(state)) if state.paused => {
                ops::sink_paused(self.name(), true);
                tracing::error!(sink = self.name(), error = %error, give_up = ?give_up, "event sink paused: delivery failed for its whole give-up period; resume it with `holdfast admin resume-webhook`");
                Err(Leave::Paused)
            }
            Ok(Some(_)) => {
                tracing::warn!(sink = self.name(), error = %error, "event delivery failed; retrying");
                Ok(())
            }
            Ok(None) => Err(Leave::LostLease),
            Err(e) => Err(Leave::Store(e)),
        }
    }

    /// Waits `delay` before the retry, renewing the lease meanwhile.
    async fn back_off(&mut self, delay: Duration, renewed: &mut Instant) -> Result<(), Leave> {
        let until = Instant::now() + delay;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(());
            }
            if !self.wait(left.min(self.renew_every)).await {
                return Err(Leave::Stopping);
            }
            if renewed.elapsed() >= self.renew_every {
                self.renew().await?;
                *renewed = Instant::now();
            }
        }
    }

    /// Renews the lease; the sink's cursor as stored.
    async fn renew(&self) -> Result<i64, Leave> {
        let lease = WorkLease {
            owner: self.owner,
            duration: self.lease,
        };
        match self.log().lease_sink(self.name(), lease).await {
            Ok(Some(state)) if state.paused => Err(Leave::Paused),
            Ok(Some(state)) => Ok(state.delivered_through),
            Ok(None) => Err(Leave::LostLease),
            Err(e) => Err(Leave::Store(e)),
        }
    }

    /// Until the feed moves, `renew_every` passes, or stopping.
    async fn await_more(&mut self) {
        let mut stop = self.stopping.clone();
        let feed_gone = tokio::select! {
            changed = self.follow.changed() => changed.is_err(),
            _ = tokio::time::sleep(self.renew_every) => false,
            _ = async { let _ = stop.wait_for(|stopping| *stopping).await; } => false,
        };
        if feed_gone {
            // Shutting down: look again later.
            self.wait(self.renew_every).await;
        }
    }

    /// Sleeps `d` unless stopping first; `false` when stopping.
    async fn wait(&self, d: Duration) -> bool {
        let mut stop = self.stopping.clone();
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = async { let _ = stop.wait_for(|stopping| *stopping).await; } => {}
        }
        !self.stopping()
    }

    /// Sets the lag gauge from the database: always when `now`, else at most every
    /// [`LAG_REFRESH`].
    async fn refresh_lag(&mut self, now: bool) {
        if !now && self.lag_read.is_some_and(|at| at.elapsed() < LAG_REFRESH) {
            return;
        }
        self.lag_read = Some(Instant::now());
        match self.log().sink_lag(self.name()).await {
            Ok(lag) => ops::sink_lag(self.name(), lag),
            Err(e) => {
                tracing::debug!(sink = self.name(), error = %e, "reading the sink's lag failed")
            }
        }
    }
}

/// The delay before retry number `failures` (1 = the first): `min(cap, base * 2^(n-1))`, of
/// which a random part of up to half is taken off, so replicas and sinks do not retry in step.
fn backoff(failures: u32) -> Duration {
    let doubled = BACKOFF_BASE.saturating_mul(1u32 << failures.saturating_sub(1).min(20));
    let delay = doubled.min(BACKOFF_CAP);
    let random = (Uuid::new_v4().as_u128() % 1024) as u32;
    delay - (delay / 2) * random / 1024
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_with_jitter() {
        for failures in 1..40 {
            let full = BACKOFF_BASE
                .saturating_mul(1u32 << (failures - 1).min(20))
                .min(BACKOFF_CAP);
            let delay = backoff(failures);
            assert!(delay <= full && delay >= full / 2, "{failures}: {delay:?}");
        }
        assert!(backoff(30) >= BACKOFF_CAP / 2);
    }
}
