//! `stock-redis`'s resources (items): created and resized durably in Postgres and in Redis
//! together, counted from Redis. What `tcc.v1.ResourceAdmin` serves ([`super::grpc`]).

use super::durable;
use super::scripts::PUT;
use super::{StockRedis, StockRedisError};
use crate::admin::{ResourceCounts, checked_specs, non_negative};

/// The ready marker and an item's capacity, available, held and confirmed counters.
type CountsReply = (
    Option<String>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
);

impl StockRedis {
    /// Counts of one resource, read atomically from Redis.
    pub async fn counts(&self, resource: &str) -> Result<ResourceCounts, StockRedisError> {
        let (ready, cap, a, h, c): CountsReply = redis::cmd("MGET")
            .arg(self.key("ready"))
            .arg(self.key(&format!("cap:{resource}")))
            .arg(self.key(&format!("a:{resource}")))
            .arg(self.key(&format!("h:{resource}")))
            .arg(self.key(&format!("c:{resource}")))
            .query_async(&mut self.conn())
            .await?;
        if ready.is_none() {
            self.inner.wake.notify_one();
            return Err(StockRedisError::Rebuilding);
        }
        match (cap, a, h, c) {
            (Some(capacity), Some(available), Some(held), Some(confirmed)) => Ok(ResourceCounts {
                resource: resource.to_owned(),
                capacity,
                available,
                held,
                confirmed,
            }),
            _ => Err(StockRedisError::NotFound(format!(
                "resource {resource:?} does not exist"
            ))),
        }
    }

    /// Creates or resizes resources: durably in Postgres (row locks held) and in Redis (one
    /// all-or-nothing script), then commits.
    pub async fn put_resources(
        &self,
        specs: Vec<(String, i64)>,
    ) -> Result<Vec<ResourceCounts>, StockRedisError> {
        let sorted = checked_specs(specs, non_negative)?;
        let mut tx = self.inner.pool.begin().await?;
        durable::put_items(&mut tx, &sorted).await?;
        let mut inv = PUT.prepare_invoke();
        inv.key(self.key("ready"))
            .key(self.key("seq"))
            .arg(&self.inner.prefix)
            .arg(sorted.len());
        for (resource, capacity) in &sorted {
            inv.arg(resource).arg(*capacity);
        }
        inv.arg(self.floor());
        let out: Vec<String> = inv.invoke_async(&mut self.conn()).await?;
        let seq = match out.as_slice() {
            [ok, seq] if ok == "ok" => seq
                .parse::<i64>()
                .map_err(|_| StockRedisError::Internal(format!("put answered seq {seq:?}")))?,
            [r] if r == "rebuilding" => {
                self.inner.wake.notify_one();
                return Err(StockRedisError::Rebuilding);
            }
            [refused, res, held, confirmed] if refused == "refused" => {
                let capacity = sorted.iter().find(|s| &s.0 == res).map_or(0, |s| s.1);
                return Err(StockRedisError::FailedPrecondition(format!(
                    "cannot resize {res} to {capacity}: {held} held and {confirmed} confirmed"
                )));
            }
            other => {
                return Err(StockRedisError::Internal(format!("put answered {other:?}")));
            }
        };
        durable::number_items(&mut tx, &sorted, seq).await?;
        // If this commit fails Redis is ahead; the reconciler reports the capacity drift.
        tx.commit().await?;
        self.saw_durable(seq);
        let mut out = Vec::with_capacity(sorted.len());
        for (resource, _) in &sorted {
            out.push(self.counts(resource).await?);
        }
        Ok(out)
    }
}
