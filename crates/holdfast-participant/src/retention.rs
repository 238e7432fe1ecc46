//! Retention at a participant (SPEC 8.3): finished branches' barrier rows, and the business
//! rows of released holds ([`Resource::forget_released`]), deleted together in short batches,
//! one transaction each. Which barrier rows may go is the backend's statement
//! ([`Backend::purge_finished`]); why that is safe against late calls is argued in
//! ARCHITECTURE.md (invariants: barrier-row retention).

use std::time::Duration;

use holdfast_serve::background::{pass_failpoint, spawn_until_aborted};
use holdfast_serve::db::WriteTransaction;

use super::barrier::Backend;
use super::service::ParticipantService;
use super::{Resource, ResourceError};
use crate::telemetry::retention_deleted;

/// Barrier rows per retention transaction.
pub const RETENTION_BATCH: u32 = 500;

/// What one retention batch deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Purged {
    /// Barrier rows (`tcc_barrier`).
    pub barrier: u64,
    /// Business rows of released holds ([`Resource::RELEASED_TABLE`]).
    pub business: u64,
}

impl<DB: Backend, R: Resource<DB>> ParticipantService<R, DB> {
    /// One retention batch: up to `limit` finished branches last changed more than `keep` ago
    /// (and past `expires_at + orphan_grace`), their barrier rows and released business rows,
    /// in one transaction; counted in `holdfast_retention_deleted_total{table}`.
    pub async fn purge_finished(
        &self,
        keep: Duration,
        limit: u32,
    ) -> Result<Purged, ResourceError> {
        let mut tx = DB::begin_write(&self.pool).await?;
        let branches = DB::purge_finished(&mut *tx, &self.name, keep, limit.max(1)).await?;
        let business = if branches.is_empty() {
            0
        } else {
            self.resource.forget_released(&mut *tx, &branches).await?
        };
        tx.commit().await?;
        let purged = Purged {
            barrier: branches.len() as u64,
            business,
        };
        retention_deleted("tcc_barrier", purged.barrier);
        if let Some(table) = R::RELEASED_TABLE {
            retention_deleted(table, purged.business);
        }
        Ok(purged)
    }

    /// Spawns retention: a pass (batches until one comes back short) every `every` until the
    /// returned handle is aborted. Failures are logged and retried on the next pass; a panic
    /// is logged and the loop started again (`holdfast_serve::background`).
    pub fn spawn_retention(&self, keep: Duration, every: Duration) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        spawn_until_aborted(crate::telemetry::tasks::RETENTION, move || {
            this.clone().retention_loop(keep, every)
        })
    }

    /// Retention's loop ([`Self::spawn_retention`]).
    async fn retention_loop(self, keep: Duration, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            pass_failpoint("participant.retention.pass");
            loop {
                match self.purge_finished(keep, RETENTION_BATCH).await {
                    Ok(p) if p.barrier >= u64::from(RETENTION_BATCH) => {
                        // A backlog: the next batch after a breath, so calls get the lock.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Ok(_) => break,
                    Err(err) => {
                        tracing::warn!(participant = %self.name, error = %err, "retention failed");
                        break;
                    }
                }
            }
        }
    }

    /// The series this participant's dashboards read, created at zero.
    pub fn register_metrics(&self) {
        let mut tables = vec!["tcc_barrier"];
        tables.extend(R::RELEASED_TABLE);
        crate::telemetry::participant_started(&self.name, &tables);
    }
}
