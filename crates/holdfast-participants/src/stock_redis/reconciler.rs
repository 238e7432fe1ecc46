//! The `stock-redis` reconciler: returns the units of holds past `expires_at + orphan_grace`,
//! reports drift of the Redis counters from the durable record, and rebuilds the Redis data
//! set from that record after Redis lost it.
//!
//! # Reconciler
//! [`StockRedis::reconcile`] (also run by a background task, and woken at once when a request
//! meets a missing data set) reclaims holds whose `expires_at + orphan_grace` passed by the
//! Redis clock (one script per batch: units back, state `hold_lost`, so each hold is returned
//! exactly once however many reconcilers run), and reports drift of Redis counters against
//! Postgres (capacity, confirmed units).
//!
//! # After Redis loses its data (a restart without persistence, a flush) or comes back behind
//! `P ready` (see the keys in [`super`]) is gone, so every script refuses: Try, Confirm and Cancel
//! answer `UNAVAILABLE` (the coordinator retries; a Try refused so recorded nothing). Redis
//! that came back with *older* data (a restart from a snapshot, a lost AOF tail, a failover to a
//! lagging replica) still has its marker, but its `P seq` is below the durable record's highest
//! sequence number (see `durable.rs`): each pass compares the two and takes the marker away
//! from a data set behind, and every script compares `P seq` with the highest number this
//! process has seen (made durable itself, or read by a pass) and does the same at once. So a
//! process never serves from a data set behind what it has seen; another replica's confirms
//! are caught by the next pass of any reconciler (at most `reconcile_every` later).
//!
//! The reconciler then rebuilds, serialised by a Postgres advisory lock: it bumps the epoch
//! (waiting for Confirms still writing their durable row; later ones of the old epoch answer
//! `HOLD_LOST`), restores a `confirmed` record for each durable branch (so repeats and a Cancel
//! after Confirm still answer `CONFIRMED`), sets per item `available = capacity - confirmed -
//! (holds it can still see)` and `P seq` to at least the durable one. Holds granted but not
//! confirmed before the loss are gone: their Confirm answers `HOLD_LOST` (the coordinator fails
//! the reservation and refunds). Confirmed units are never resold. Tombstones are lost too: a Try
//! arriving after its Cancel and after the loss may hold; it is reclaimed after `expires_at +
//! orphan_grace`. Holds an older data set still shows as held but that were released since stay
//! counted as held until the reconciler reclaims them after their `expires_at + orphan_grace`
//! (units are withheld for a while, never sold twice). Only one stock-redis participant per
//! database.

use std::time::Duration;

use super::durable::{self, DurableItem};
use super::scripts::{BEHIND, FINISH, RECLAIM};
use super::{NAME, StockRedis, StockRedisError};
use crate::participant::BranchKey;

/// Most holds one reclaim script returns; a pass runs scripts until one returns fewer.
const RECLAIM_BATCH: usize = 1000;
/// Branch records a rebuild restores at once.
const RESTORE_CONCURRENCY: usize = 256;

/// What one [`StockRedis::reconcile`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Whether the Redis data set was missing and was rebuilt from the durable record.
    pub rebuilt: bool,
    /// Holds past `expires_at + orphan_grace` whose units were returned.
    pub reclaimed: usize,
    /// Differences between Redis and the durable record, for people (also logged).
    pub drift: Vec<String>,
}

impl StockRedis {
    /// One reconciler pass: rebuilds the Redis data set if it is missing, returns the units
    /// of holds past `expires_at + orphan_grace` (each exactly once, however many passes run
    /// concurrently), and reports drift between Redis and the durable record.
    pub async fn reconcile(&self) -> Result<ReconcileReport, StockRedisError> {
        let mut report = ReconcileReport::default();
        // A data set behind the durable record (older data came back) loses its marker here,
        // so it is rebuilt below like a lost one.
        let durable_seq = durable::durable_seq(&self.inner.pool).await?;
        self.saw_durable(durable_seq);
        let behind: i64 = BEHIND
            .key(self.key("ready"))
            .key(self.key("seq"))
            .arg(durable_seq)
            .invoke_async(&mut self.conn())
            .await?;
        if behind == 1 {
            tracing::warn!(
                participant = NAME,
                durable_seq,
                "Redis data set is behind the durable record (older data came back)"
            );
        }
        let ready: Option<String> = redis::cmd("GET")
            .arg(self.key("ready"))
            .query_async(&mut self.conn())
            .await?;
        if ready.is_none() {
            report.rebuilt = self.rebuild().await?;
        }
        report.reclaimed = self.reclaim_due().await?;
        if !report.rebuilt {
            report.drift = self.drift().await?;
            for d in &report.drift {
                crate::telemetry::ops::redis_drift("counter");
                tracing::warn!(participant = NAME, "drift: {d}");
            }
        }
        Ok(report)
    }

    /// Returns the units of held records past `expires_at + orphan_grace` on this
    /// participant's clock (Redis's `TIME`, moved by the test clock's offset), in batches;
    /// how many, each counted and logged.
    async fn reclaim_due(&self) -> Result<usize, StockRedisError> {
        let mut reclaimed = 0;
        loop {
            let n: usize = RECLAIM
                .key(self.key("expiry"))
                .arg(&self.inner.prefix)
                .arg(RECLAIM_BATCH)
                .arg(self.inner.retention_ms)
                .arg(self.inner.clock.offset_us() / 1000)
                .invoke_async(&mut self.conn())
                .await?;
            reclaimed += n;
            if n < RECLAIM_BATCH {
                break;
            }
        }
        if reclaimed > 0 {
            for _ in 0..reclaimed {
                crate::telemetry::ops::orphan_reclaimed(NAME);
            }
            tracing::warn!(
                participant = NAME,
                reclaimed,
                "reclaimed orphaned holds past expires_at + orphan_grace"
            );
        }
        Ok(reclaimed)
    }

    /// Compares Redis capacity and confirmed counters with the durable record. A Confirm in
    /// flight (script done, row not yet written) shows briefly as confirmed drift.
    async fn drift(&self) -> Result<Vec<String>, StockRedisError> {
        let mut drift = Vec::new();
        for item in durable::items(&self.inner.pool).await? {
            let DurableItem {
                resource,
                capacity,
                confirmed,
            } = item;
            let (cap, conf): (Option<i64>, Option<i64>) = redis::cmd("MGET")
                .arg(self.key(&format!("cap:{resource}")))
                .arg(self.key(&format!("c:{resource}")))
                .query_async(&mut self.conn())
                .await?;
            if cap != Some(capacity) {
                drift.push(format!(
                    "{resource}: capacity {capacity} durable, {cap:?} in Redis"
                ));
            }
            if conf != Some(confirmed) {
                drift.push(format!(
                    "{resource}: confirmed {confirmed} durable, {conf:?} in Redis"
                ));
            }
        }
        Ok(drift)
    }

    /// Rebuilds the Redis data set from the durable record (see the module doc), serialised
    /// by the rebuild lock. Returns
    /// false when another rebuild finished first.
    async fn rebuild(&self) -> Result<bool, StockRedisError> {
        let lock = durable::lock_rebuilds(&self.inner.pool).await?;
        let ready: Option<String> = redis::cmd("GET")
            .arg(self.key("ready"))
            .query_async(&mut self.conn())
            .await?;
        if ready.is_some() {
            lock.commit().await?;
            return Ok(false);
        }
        tracing::warn!(
            participant = NAME,
            "Redis data set missing; rebuilding from the durable record"
        );
        let epoch = durable::next_epoch(&self.inner.pool).await?;
        // Read after the epoch changed: no Confirm of the old epoch is made durable later.
        let seq = durable::durable_seq(&self.inner.pool).await?;
        let items = durable::items(&self.inner.pool).await?;
        let branches = durable::confirmed_branches(&self.inner.pool).await?;
        let epoch_s = epoch.to_string();
        let branches: Vec<_> = branches.into_iter().collect();
        for chunk in branches.chunks(RESTORE_CONCURRENCY) {
            let restores = chunk.iter().map(|((reservation_id, branch_id), items)| {
                let rec = self.record_key(&BranchKey {
                    reservation_id: reservation_id.clone(),
                    branch_id: branch_id.clone(),
                });
                let epoch_s = &epoch_s;
                async move { self.restore(&rec, epoch_s, items).await }
            });
            futures_util::future::try_join_all(restores).await?;
        }
        let mut inv = FINISH.prepare_invoke();
        inv.key(self.key("ready"))
            .key(self.key("expiry"))
            .key(self.key("seq"))
            .arg(epoch)
            .arg(&self.inner.prefix)
            .arg(items.len());
        for item in &items {
            inv.arg(&item.resource)
                .arg(item.capacity)
                .arg(item.confirmed);
        }
        inv.arg(seq);
        let finished: i64 = inv.invoke_async(&mut self.conn()).await?;
        lock.commit().await?;
        self.saw_durable(seq);
        tracing::warn!(
            participant = NAME,
            epoch,
            items = finished,
            confirmed_branches = branches.len(),
            "Redis data set rebuilt"
        );
        crate::telemetry::ops::redis_rebuilt();
        Ok(finished >= 0)
    }

    /// Spawns the background reconciler: a pass every `every`, and at once when a request
    /// met a missing data set. Failures are logged and retried; a panic is logged and the
    /// loop started again (`holdfast_serve::background`).
    pub(crate) fn spawn_reconciler(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        holdfast_serve::background::spawn_until_aborted(
            crate::telemetry::ops::tasks::RECONCILER,
            move || {
                let this = this.clone();
                async move {
                    loop {
                        tokio::select! {
                            _ = tokio::time::sleep(every) => {}
                            _ = this.inner.wake.notified() => {}
                        }
                        holdfast_serve::background::pass_failpoint("stock_redis.reconcile.pass");
                        if let Err(err) = this.reconcile().await {
                            tracing::warn!(participant = NAME, error = %err, "reconcile failed");
                        }
                    }
                }
            },
        )
    }
}

/// In test mode a move of the deployment's clock runs the reclaim at once (not the whole
/// pass: no rebuild check, no drift report): holds past `expires_at + orphan_grace` on the
/// moved clock come back without waiting for the next scheduled pass, as the SDK's
/// participants do.
impl crate::participant::OrphanReclaim for StockRedis {
    fn reclaim_now(
        &self,
    ) -> futures_util::future::BoxFuture<'_, Result<usize, crate::participant::ResourceError>> {
        Box::pin(async move {
            self.reclaim_due()
                .await
                .map_err(|e| crate::participant::ResourceError::Internal(e.to_string()))
        })
    }
}
