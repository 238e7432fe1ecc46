//! Retention (SPEC 8.3): finished reservations older than `--retention` are deleted in short
//! batches, checked every [`Retention::every`] (under a minute). What may go is the store's
//! rule ([`crate::store::Store::purge_finished`]: terminal, nothing pending); this loop only
//! paces it so a purge of a large backlog never holds locks long nor starves Reserves: one
//! batch per transaction, then a pause at least as long as the batch took.

use std::time::Duration;

use tokio::sync::watch;

use super::{Coordinator, Error};
use crate::store::Purged;

/// How retention runs.
#[derive(Clone, Copy, Debug)]
pub struct Retention {
    /// How long a finished reservation is kept; `None` keeps everything (`--retention off`).
    pub keep: Option<Duration>,
    /// How long events are kept (`--events-retention`; never before every active sink has
    /// delivered them).
    pub events_keep: Duration,
    /// Reservations per transaction (at most 1,000; SQLite's single writer takes fewer).
    pub batch: u32,
    /// How often the purge looks for work when the last pass found less than a batch.
    pub every: Duration,
    /// Shortest pause between full batches (at least as long as the batch took), so the
    /// purge leaves room for the hot path.
    pub pause: Duration,
}

/// The longest batch retention ever deletes in one transaction (SPEC 8.3).
pub const MAX_BATCH: u32 = 1000;

impl Retention {
    /// Retention off: everything is kept.
    pub fn off() -> Retention {
        Retention {
            keep: None,
            ..Retention::default()
        }
    }
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            keep: Some(Duration::from_secs(30 * 24 * 3600)),
            events_keep: Duration::from_secs(7 * 24 * 3600),
            batch: MAX_BATCH,
            every: Duration::from_secs(30),
            pause: Duration::from_millis(10),
        }
    }
}

impl Coordinator {
    /// One retention batch of at most `batch` reservations finished more than `keep` ago,
    /// counted in `holdfast_retention_deleted_total{table}`.
    pub async fn purge_finished(&self, keep: Duration, batch: u32) -> Result<Purged, Error> {
        let purged = self
            .store
            .purge_finished(keep, batch.clamp(1, MAX_BATCH))
            .await?;
        use crate::telemetry::ops::retention_deleted;
        retention_deleted("reservations", purged.reservations);
        retention_deleted("branches", purged.branches);
        retention_deleted("extra_payments", purged.extra_payments);
        Ok(purged)
    }

    /// One retention batch of events older than `keep` that every active sink has delivered
    /// (SPEC 10), counted in `holdfast_retention_deleted_total{table="events"}`.
    pub async fn purge_events(&self, keep: Duration, batch: u32) -> Result<u64, Error> {
        let purged = self
            .store
            .event_log()
            .purge_events(keep, batch.clamp(1, MAX_BATCH))
            .await?;
        crate::telemetry::ops::retention_deleted("events", purged);
        Ok(purged)
    }

    /// One pass over both logs; `true` when either deleted a full batch (a backlog).
    async fn purge_pass(&self, retention: &Retention) -> bool {
        let full = u64::from(retention.batch.clamp(1, MAX_BATCH));
        let mut backlog = false;
        if let Some(keep) = retention.keep {
            match self.purge_finished(keep, retention.batch).await {
                Ok(p) => {
                    backlog |= p.reservations >= full;
                    if p.reservations > 0 {
                        tracing::info!(
                            reservations = p.reservations,
                            "retention deleted finished reservations"
                        );
                    }
                }
                Err(e) => tracing::warn!(error = %e, "retention purge failed; retrying later"),
            }
        }
        match self
            .purge_events(retention.events_keep, retention.batch)
            .await
        {
            Ok(n) => backlog |= n >= full,
            Err(e) => tracing::warn!(error = %e, "event retention failed; retrying later"),
        }
        backlog
    }

    /// Runs retention (finished reservations, when kept for a limited time, and events) until
    /// `stop` turns true.
    pub async fn run_retention(self, mut stop: watch::Receiver<bool>) {
        let retention = self.policy.retention;
        loop {
            if *stop.borrow() {
                return;
            }
            crate::background::pass_failpoint("coord.retention.pass");
            let started = std::time::Instant::now();
            // A backlog: rest at least as long as the batch took, so the purge keeps at most
            // half of one connection (and of the WAL) busy while Reserves run.
            let wait = if self.purge_pass(&retention).await {
                retention.pause.max(started.elapsed())
            } else {
                retention.every
            };
            tokio::select! {
                changed = stop.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}
