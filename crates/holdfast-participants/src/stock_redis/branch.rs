//! A branch's Try, Confirm and Cancel at `stock-redis`: each decided by one script on the
//! Redis gate (the branch record is the barrier, see [`super::scripts`]); a Confirm is then
//! made durable in Postgres before it is answered ([`super::durable`]), and a branch Redis no
//! longer knows is answered from the durable record.

use chrono::{DateTime, Utc};

use super::scripts::{CANCEL, CONFIRM, DEMOTE, EXTEND, RESTORE, TRY};
use super::{StockRedis, StockRedisError, durable};
use crate::participant::validate;
use crate::participant::{
    BranchAnswer, BranchKey, ExtendAnswer, ResourceError, TryAnswer, TryBranch,
};

impl StockRedis {
    /// Checks a Try as every participant does (stock: no slots; `expires_at` within
    /// `max_hold`), items in lock order.
    pub(super) fn check_try(&self, branch: TryBranch) -> Result<TryBranch, ResourceError> {
        validate::check_try_at(
            branch,
            self.inner.max_hold,
            self.inner.clock.now(),
            crate::stock::validate_items,
        )
    }

    /// Checks an Extend's deadline as every participant does (`expires_at` within `max_hold`).
    pub(super) fn check_extend(&self, expires_at: DateTime<Utc>) -> Result<(), ResourceError> {
        validate::check_max_hold(expires_at, self.inner.max_hold, self.inner.clock.now())
    }

    /// Extend: a held branch keeps its units at least until `expires_at + orphan_grace` (one
    /// script; the deadline never moves earlier). A branch no longer held answers its state
    /// and nothing changes; one Redis does not know answers from the durable record
    /// (`CONFIRMED` if it holds the branch as confirmed, else `HOLD_LOST`).
    pub(super) async fn extend_branch(
        &self,
        key: &BranchKey,
        expires_at: DateTime<Utc>,
    ) -> Result<ExtendAnswer, StockRedisError> {
        let hold_until_ms = expires_at
            .timestamp_millis()
            .checked_add(self.inner.grace_ms)
            .ok_or_else(|| StockRedisError::invalid("expires_at", "is not a valid timestamp"))?;
        let rec = self.record_key(key);
        let out: Vec<String> = EXTEND
            .key(&rec)
            .key(self.key("ready"))
            .key(self.key("expiry"))
            .key(self.key("seq"))
            .arg(hold_until_ms)
            .arg(self.floor())
            .invoke_async(&mut self.conn())
            .await?;
        let [outcome, epoch] = out.as_slice() else {
            return Err(StockRedisError::Internal(format!(
                "extend answered {out:?}"
            )));
        };
        Ok(match outcome.as_str() {
            "held" => ExtendAnswer::Held,
            "confirmed" => ExtendAnswer::Settled(BranchAnswer::Confirmed),
            "cancelled" => ExtendAnswer::Settled(BranchAnswer::Cancelled),
            "hold_lost" => ExtendAnswer::Settled(BranchAnswer::HoldLost),
            "missing" => {
                ExtendAnswer::Settled(if self.restore_if_durable(key, &rec, epoch).await? {
                    BranchAnswer::Confirmed
                } else {
                    BranchAnswer::HoldLost
                })
            }
            "rebuilding" => {
                self.inner.wake.notify_one();
                return Err(StockRedisError::Rebuilding);
            }
            other => {
                return Err(StockRedisError::Internal(format!(
                    "extend answered {other:?}"
                )));
            }
        })
    }

    /// Try: holds every item or none (one script). `branch` is checked ([`Self::check_try`]).
    pub(super) async fn try_branch(
        &self,
        branch: &TryBranch,
    ) -> Result<TryAnswer, StockRedisError> {
        let hold_until_ms = branch
            .expires_at
            .timestamp_millis()
            .checked_add(self.inner.grace_ms)
            .ok_or_else(|| StockRedisError::invalid("expires_at", "is not a valid timestamp"))?;
        let mut inv = TRY.prepare_invoke();
        inv.key(self.record_key(&branch.key))
            .key(self.key("ready"))
            .key(self.key("expiry"));
        for item in &branch.items {
            inv.key(self.key(&format!("a:{}", item.resource)));
        }
        for item in &branch.items {
            inv.key(self.key(&format!("h:{}", item.resource)));
        }
        inv.key(self.key("seq"));
        inv.arg(hold_until_ms).arg(branch.items.len());
        for item in &branch.items {
            inv.arg(&item.resource);
        }
        for item in &branch.items {
            inv.arg(item.quantity);
        }
        inv.arg(self.inner.retention_ms).arg(self.floor());
        let (answer, reason): (String, String) = inv.invoke_async(&mut self.conn()).await?;
        match answer.as_str() {
            "held" => Ok(TryAnswer::Held),
            "rejected" => Ok(TryAnswer::Rejected(reason)),
            // Nothing recorded: the Try may be sent again once the data set is rebuilt.
            "rebuilding" => {
                self.inner.wake.notify_one();
                Err(StockRedisError::Rebuilding)
            }
            other => Err(StockRedisError::Internal(format!("try answered {other:?}"))),
        }
    }

    /// Confirm: the script moves the hold to confirmed, then the durable row is written,
    /// then the answer.
    pub(super) async fn confirm_branch(
        &self,
        key: &BranchKey,
    ) -> Result<BranchAnswer, StockRedisError> {
        let rec = self.record_key(key);
        let out: Vec<String> = CONFIRM
            .key(&rec)
            .key(self.key("ready"))
            .key(self.key("expiry"))
            .key(self.key("seq"))
            .arg(&self.inner.prefix)
            .arg(self.inner.retention_ms)
            .arg(self.inner.tombstone_ms)
            .arg(self.floor())
            .invoke_async(&mut self.conn())
            .await?;
        let (outcome, epoch) = match out.as_slice() {
            [o, e, ..] => (o.as_str(), e.as_str()),
            _ => return Err(StockRedisError::Internal("short confirm answer".to_owned())),
        };
        match outcome {
            "rebuilding" => {
                self.inner.wake.notify_one();
                Err(StockRedisError::Rebuilding)
            }
            "cancelled" => Ok(BranchAnswer::Cancelled),
            "hold_lost" => Ok(BranchAnswer::HoldLost),
            "missing" => self.confirm_missing(key, &rec, epoch).await,
            "confirmed" => {
                let epoch: i64 = epoch
                    .parse()
                    .map_err(|_| StockRedisError::Internal(format!("bad epoch {epoch:?}")))?;
                let seq: i64 = out
                    .get(2)
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| StockRedisError::Internal("confirm without seq".to_owned()))?;
                let mut items = Vec::new();
                for pair in out[3..].chunks(2) {
                    let [res, q] = pair else {
                        return Err(StockRedisError::Internal("odd item list".to_owned()));
                    };
                    let q: i64 = q
                        .parse()
                        .map_err(|_| StockRedisError::Internal(format!("bad quantity {q:?}")))?;
                    items.push((res.clone(), q));
                }
                // Redis says confirmed, Postgres does not know yet: a crash here is what
                // the repeated Confirm (which re-inserts) and the rebuild must cover.
                super::faults::check("stock_redis.confirm.between")?;
                if durable::make_durable(&self.inner.pool, key, epoch, seq, &items).await? {
                    self.saw_durable(seq);
                    super::faults::check("stock_redis.confirm.committed")?;
                    Ok(BranchAnswer::Confirmed)
                } else {
                    // The epoch changed: Redis lost this confirm; the rebuild did not count it.
                    let _: i64 = DEMOTE
                        .key(&rec)
                        .arg(epoch)
                        .invoke_async(&mut self.conn())
                        .await?;
                    tracing::warn!(
                        reservation_id = %key.reservation_id,
                        branch_id = %key.branch_id,
                        "confirm lost with the Redis data set; answering HOLD_LOST"
                    );
                    Ok(BranchAnswer::HoldLost)
                }
            }
            other => Err(StockRedisError::Internal(format!(
                "confirm answered {other:?}"
            ))),
        }
    }

    /// Confirm found no record (it wrote a `hold_lost` tombstone). If the durable record says
    /// confirmed (a record past its retention, or lost without a rebuild), restore it and
    /// answer so.
    async fn confirm_missing(
        &self,
        key: &BranchKey,
        rec: &str,
        epoch: &str,
    ) -> Result<BranchAnswer, StockRedisError> {
        Ok(if self.restore_if_durable(key, rec, epoch).await? {
            BranchAnswer::Confirmed
        } else {
            BranchAnswer::HoldLost
        })
    }

    /// Restores the `confirmed` record of a branch the durable record holds; answers whether
    /// it did.
    async fn restore_if_durable(
        &self,
        key: &BranchKey,
        rec: &str,
        epoch: &str,
    ) -> Result<bool, StockRedisError> {
        let items = durable::confirmed_items(&self.inner.pool, key).await?;
        if items.is_empty() {
            return Ok(false);
        }
        self.restore(rec, epoch, &items).await?;
        Ok(true)
    }

    /// Writes a `confirmed` record for `items` under `epoch` (one script), unless one is there.
    pub(super) async fn restore(
        &self,
        rec: &str,
        epoch: &str,
        items: &[(String, i64)],
    ) -> Result<(), StockRedisError> {
        let mut inv = RESTORE.prepare_invoke();
        inv.key(rec)
            .key(self.key("expiry"))
            .arg(epoch)
            .arg(items.len());
        for (res, q) in items {
            inv.arg(res).arg(*q);
        }
        inv.arg(self.inner.retention_ms);
        let _: i64 = inv.invoke_async(&mut self.conn()).await?;
        Ok(())
    }

    /// Cancel: releases the hold through its state transition; a tombstone before its Try.
    /// A branch without a record (its record expired after the retention) that the durable
    /// record holds as confirmed answers CONFIRMED, as a Cancel after Confirm always does.
    pub(super) async fn cancel_branch(
        &self,
        key: &BranchKey,
    ) -> Result<BranchAnswer, StockRedisError> {
        let rec = self.record_key(key);
        let out: Vec<String> = CANCEL
            .key(&rec)
            .key(self.key("ready"))
            .key(self.key("expiry"))
            .key(self.key("seq"))
            .arg(&self.inner.prefix)
            .arg(self.inner.retention_ms)
            .arg(self.inner.tombstone_ms)
            .arg(self.floor())
            .invoke_async(&mut self.conn())
            .await?;
        let [outcome, epoch] = out.as_slice() else {
            return Err(StockRedisError::Internal(format!(
                "cancel answered {out:?}"
            )));
        };
        match outcome.as_str() {
            "cancelled" => Ok(BranchAnswer::Cancelled),
            "confirmed" => Ok(BranchAnswer::Confirmed),
            "tombstone" => Ok(if self.restore_if_durable(key, &rec, epoch).await? {
                BranchAnswer::Confirmed
            } else {
                BranchAnswer::Cancelled
            }),
            "rebuilding" => {
                self.inner.wake.notify_one();
                Err(StockRedisError::Rebuilding)
            }
            other => Err(StockRedisError::Internal(format!(
                "cancel answered {other:?}"
            ))),
        }
    }
}
