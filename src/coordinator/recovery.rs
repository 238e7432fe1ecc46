//! Recovery and the reaper: every non-terminal reservation is driven to its outcome, by
//! whichever coordinator instance claims it, through the same confirm/release paths as the
//! RPCs.
//!
//! Work is claimed from the store with leases (`FOR UPDATE SKIP LOCKED` + a lease deadline),
//! so instances sharing one database never drive the same reservation at once, and a dead
//! instance's work is taken over when its lease ends.

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use tokio::sync::watch;
use uuid::Uuid;

use super::{Coordinator, Error};
use crate::domain::{BranchState, Reservation, State};
use crate::store::BranchReport;

/// How often participants that failed are probed for health.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// How often the recovery backlog gauge is refreshed.
const BACKLOG_GAUGE_INTERVAL: Duration = Duration::from_secs(5);

impl Coordinator {
    /// Drives one claimed reservation as far as its participants allow now, and sends the
    /// refunds still owed for its further payments.
    pub async fn recover(&self, id: Uuid) -> Result<Reservation, Error> {
        let r = self.recover_reservation(id).await?;
        self.drive_extra_refunds(id).await?;
        Ok(r)
    }

    async fn recover_reservation(&self, id: Uuid) -> Result<Reservation, Error> {
        let r = self.read(id).await?;
        match r.stored_state {
            State::Trying => {
                // Its placer stopped mid-way: any branch may hold something, so release all.
                tracing::warn!(reservation_id = %id, "releasing a reservation abandoned while placing holds");
                let reports: Vec<BranchReport> = r
                    .participant_branches()
                    .into_iter()
                    .filter(|b| b.state != BranchState::Rejected)
                    .map(|b| BranchReport {
                        branch_id: b.branch_id,
                        state: b.state,
                        error: Some("the coordinator stopped while placing holds".into()),
                    })
                    .collect();
                let recorded = self.store.record_rejected(id, None, &reports).await?;
                self.drive_release(recorded).await
            }
            State::Confirming => self.drive_confirm(r).await,
            State::Cancelling => {
                let r = self.drive_release(r).await?;
                self.drive_refund(r).await
            }
            State::Expired if r.payment.is_some() && r.refund.is_none() => {
                // A late payment was being honoured when its coordinator stopped: release
                // whatever it may have re-taken and refund the payment.
                tracing::warn!(reservation_id = %id, "refunding a late payment abandoned mid-way");
                let reports: Vec<BranchReport> = r
                    .participant_branches()
                    .into_iter()
                    .filter(|b| b.state != BranchState::Rejected)
                    .map(|b| BranchReport {
                        branch_id: b.branch_id,
                        state: b.state,
                        error: Some("the coordinator stopped while placing holds again".into()),
                    })
                    .collect();
                let r = self
                    .store
                    .fail_retake(
                        id,
                        &reports,
                        "the coordinator stopped while honouring the late payment",
                    )
                    .await?;
                let r = self.drive_release(r).await?;
                self.drive_refund(r).await
            }
            _ => self.drive_refund(r).await,
        }
    }

    /// Claims due work (expired holds, abandoned placements, retries) and drives it
    /// concurrently. Returns how many reservations it claimed.
    pub async fn sweep(&self) -> Result<usize, Error> {
        let claimed = self
            .store
            .claim_due(self.lease(), self.policy.sweep_batch)
            .await?;
        let n = claimed.len();
        join_all(claimed.into_iter().map(|c| async move {
            let id = c.id;
            if c.expired {
                crate::telemetry::reservation_entered(State::Cancelling);
                crate::telemetry::hold_expired();
            }
            if let Err(e) = self.recover(id).await {
                tracing::warn!(reservation_id = %id, error = %e, "recovery attempt failed; will retry");
            }
        }))
        .await;
        Ok(n)
    }

    /// Runs the reaper and recovery until `stop` turns true: sweeps every `sweep_interval`
    /// (at once again while a sweep was full), probes failing participants, and retries a
    /// participant's backlog as soon as it answers again.
    pub async fn run_recovery(self, mut stop: watch::Receiver<bool>) {
        let mut last_probe = Instant::now();
        let mut last_gauge: Option<Instant> = None;
        loop {
            if *stop.borrow() {
                return;
            }
            for name in self.registry.take_came_back() {
                match self.store.wake_backlog(&name).await {
                    Ok(n) if n > 0 => {
                        tracing::info!(participant = %name, reservations = n, "retrying backlog now")
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "waking backlog failed"),
                }
            }
            if last_gauge.is_none_or(|t| t.elapsed() >= BACKLOG_GAUGE_INTERVAL) {
                last_gauge = Some(Instant::now());
                match self.store.backlog().await {
                    Ok(n) => crate::telemetry::recovery_backlog(n),
                    Err(e) => tracing::warn!(error = %e, "reading the recovery backlog failed"),
                }
            }
            if last_probe.elapsed() >= PROBE_INTERVAL {
                last_probe = Instant::now();
                let failing = self.registry.failing();
                join_all(failing.into_iter().map(|p| p.probe())).await;
            }
            let full = match self.sweep().await {
                Ok(n) => n >= self.policy.sweep_batch as usize,
                Err(e) => {
                    tracing::warn!(error = %e, "sweep failed");
                    false
                }
            };
            if full {
                continue;
            }
            tokio::select! {
                changed = stop.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                _ = tokio::time::sleep(self.policy.sweep_interval) => {}
                _ = self.registry.came_back() => {}
            }
        }
    }
}
