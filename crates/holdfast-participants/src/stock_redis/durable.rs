//! `stock-redis`'s durable record of truth in PostgreSQL: each item's capacity
//! (`stock_redis_item`), every confirmed branch's units (`stock_redis_confirmed`) and the epoch
//! of the Redis data set (`stock_redis_epoch`). Redis may lose its data; these rows survive and
//! the reconciler rebuilds Redis from them. Every SQL statement of this participant is here.
//!
//! # Durable record
//! Confirm = script (held -> confirmed, returns the items and the epoch it ran under), then
//! `INSERT .. ON CONFLICT DO NOTHING` into `stock_redis_confirmed` under a shared lock of the
//! epoch row and only if the epoch is still current, then the answer. A repeated Confirm
//! re-inserts (a no-op), so an answer CONFIRMED always means a durable row.
//!
//! # Sequence of durable changes
//! Redis numbers every change it hands over to be made durable (`P seq`, INCR by the Confirm
//! and PutResources scripts); the row written keeps that number (`seq` of
//! `stock_redis_confirmed` and `stock_redis_item`). Redis only ever hands out numbers above
//! every durable one, so a Redis whose `P seq` is below [`durable_seq`] came back with older
//! data (a restart from a snapshot, a lost AOF tail, a failover to a lagging replica): its
//! counters may offer units confirmed since. It is rebuilt before it serves (see
//! `reconciler.rs`).

use std::collections::BTreeMap;

use sqlx::{PgConnection, PgPool, Postgres, Row, Transaction};

use super::StockRedisError;
use crate::participant::BranchKey;

/// Advisory lock key serialising rebuilds ("hfsr").
const REBUILD_LOCK: i64 = 0x6866_7372;

/// An item as the durable record has it.
pub(super) struct DurableItem {
    pub(super) resource: String,
    pub(super) capacity: i64,
    /// Units of confirmed branches.
    pub(super) confirmed: i64,
}

/// Units per resource of each durably confirmed branch, by (reservation_id, branch_id).
pub(super) type ConfirmedBranches = BTreeMap<(String, String), Vec<(String, i64)>>;

/// Writes the durable rows of a confirmed branch (numbered `seq`, see the module doc) if
/// `epoch` is still current; answers whether the branch is durably confirmed.
pub(super) async fn make_durable(
    pool: &PgPool,
    key: &BranchKey,
    epoch: i64,
    seq: i64,
    items: &[(String, i64)],
) -> Result<bool, StockRedisError> {
    let mut tx = pool.begin().await?;
    let current: i64 = sqlx::query_scalar("SELECT epoch FROM stock_redis_epoch WHERE id FOR SHARE")
        .fetch_one(&mut *tx)
        .await?;
    if current != epoch {
        let durable = is_durable(&mut tx, key).await?;
        tx.commit().await?;
        return Ok(durable);
    }
    let (resources, quantities): (Vec<&str>, Vec<i64>) =
        items.iter().map(|(r, q)| (r.as_str(), *q)).unzip();
    sqlx::query(
        "INSERT INTO stock_redis_confirmed (reservation_id, branch_id, resource, quantity, seq) \
         SELECT $1, $2, r, q, $5 FROM unnest($3::text[], $4::bigint[]) AS t(r, q) \
         ON CONFLICT DO NOTHING",
    )
    .bind(&key.reservation_id)
    .bind(&key.branch_id)
    .bind(&resources)
    .bind(&quantities)
    .bind(seq)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(true)
}

async fn is_durable(conn: &mut PgConnection, key: &BranchKey) -> Result<bool, StockRedisError> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM stock_redis_confirmed \
         WHERE reservation_id = $1 AND branch_id = $2)",
    )
    .bind(&key.reservation_id)
    .bind(&key.branch_id)
    .fetch_one(conn)
    .await?)
}

/// The units a durably confirmed branch holds, by resource; empty when it is not confirmed.
pub(super) async fn confirmed_items(
    pool: &PgPool,
    key: &BranchKey,
) -> Result<Vec<(String, i64)>, StockRedisError> {
    let rows = sqlx::query(
        "SELECT resource, quantity FROM stock_redis_confirmed \
         WHERE reservation_id = $1 AND branch_id = $2 ORDER BY resource",
    )
    .bind(&key.reservation_id)
    .bind(&key.branch_id)
    .fetch_all(pool)
    .await?;
    let mut items = Vec::with_capacity(rows.len());
    for row in rows {
        items.push((row.try_get::<String, _>(0)?, row.try_get::<i64, _>(1)?));
    }
    Ok(items)
}

/// Every item with its capacity and confirmed units, by resource.
pub(super) async fn items(pool: &PgPool) -> Result<Vec<DurableItem>, StockRedisError> {
    let rows = sqlx::query(
        "SELECT i.resource, i.capacity, \
                COALESCE((SELECT sum(quantity) FROM stock_redis_confirmed c \
                          WHERE c.resource = i.resource), 0)::bigint AS confirmed \
         FROM stock_redis_item i ORDER BY i.resource",
    )
    .fetch_all(pool)
    .await?;
    let mut items = Vec::with_capacity(rows.len());
    for row in rows {
        items.push(DurableItem {
            resource: row.try_get(0)?,
            capacity: row.try_get(1)?,
            confirmed: row.try_get(2)?,
        });
    }
    Ok(items)
}

/// Every durably confirmed branch with its units.
pub(super) async fn confirmed_branches(
    pool: &PgPool,
) -> Result<ConfirmedBranches, StockRedisError> {
    let rows = sqlx::query(
        "SELECT reservation_id, branch_id, resource, quantity FROM stock_redis_confirmed \
         ORDER BY reservation_id, branch_id, resource",
    )
    .fetch_all(pool)
    .await?;
    let mut branches = ConfirmedBranches::new();
    for row in rows {
        branches
            .entry((row.try_get(0)?, row.try_get(1)?))
            .or_default()
            .push((row.try_get(2)?, row.try_get(3)?));
    }
    Ok(branches)
}

/// Takes the rebuild lock: one rebuild at a time per database. Transaction-scoped, so a
/// cancelled or failed rebuild releases it; commit the returned transaction when done.
pub(super) async fn lock_rebuilds(
    pool: &PgPool,
) -> Result<Transaction<'static, Postgres>, StockRedisError> {
    let mut lock = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(REBUILD_LOCK)
        .execute(&mut *lock)
        .await?;
    Ok(lock)
}

/// Starts a new epoch and returns it. Waits for Confirms still writing under the old one
/// (they hold the epoch row shared); later ones of the old epoch find it changed.
pub(super) async fn next_epoch(pool: &PgPool) -> Result<i64, StockRedisError> {
    let mut tx = pool.begin().await?;
    let epoch: i64 = sqlx::query_scalar(
        "UPDATE stock_redis_epoch SET epoch = epoch + 1 WHERE id RETURNING epoch",
    )
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(epoch)
}

/// Creates items or sets their capacity, in the caller's transaction (which keeps the rows
/// locked until Redis has them too).
pub(super) async fn put_items(
    conn: &mut PgConnection,
    items: &[(String, i64)],
) -> Result<(), StockRedisError> {
    for (resource, capacity) in items {
        sqlx::query(
            "INSERT INTO stock_redis_item (resource, capacity) VALUES ($1, $2) \
             ON CONFLICT (resource) DO UPDATE SET capacity = EXCLUDED.capacity",
        )
        .bind(resource)
        .bind(capacity)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Numbers the change `put_items` made (`seq` from Redis), in the same transaction.
pub(super) async fn number_items(
    conn: &mut PgConnection,
    items: &[(String, i64)],
    seq: i64,
) -> Result<(), StockRedisError> {
    let resources: Vec<&str> = items.iter().map(|(r, _)| r.as_str()).collect();
    sqlx::query("UPDATE stock_redis_item SET seq = $2 WHERE resource = ANY($1) AND seq < $2")
        .bind(&resources)
        .bind(seq)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// The highest sequence number of the durable record (0 when nothing was numbered yet): a
/// Redis whose `P seq` is lower is behind it (see the module doc).
pub(super) async fn durable_seq(pool: &PgPool) -> Result<i64, StockRedisError> {
    Ok(sqlx::query_scalar(
        "SELECT GREATEST((SELECT COALESCE(max(seq), 0) FROM stock_redis_confirmed), \
                         (SELECT COALESCE(max(seq), 0) FROM stock_redis_item))::bigint",
    )
    .fetch_one(pool)
    .await?)
}
