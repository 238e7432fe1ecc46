//! `stock` on SQLite: the same transitions as the PostgreSQL SQL beside it (`postgres.rs`). The
//! SDK's `BEGIN IMMEDIATE` holds the write lock for the whole call, so a guarded UPDATE and the
//! hold row it pays for, or a winning Cancel and the units it returns, are atomic. Held and
//! confirmed units are the hold rows' sums (a Confirm moves only its hold row).

use async_trait::async_trait;
use sqlx::{Sqlite, SqliteConnection};

use super::{Stock, validate_items};
use crate::admin::{Inventory, ResourceCounts};
use crate::participant::{BranchCtx, ConfirmOutcome, Item, Resource, ResourceError, TryAnswer};

#[async_trait]
impl Resource<Sqlite> for Stock {
    const RELEASED_TABLE: Option<&'static str> = Some("stock_hold");

    fn validate(&self, items: &[Item]) -> Result<(), ResourceError> {
        validate_items(items)
    }

    async fn try_hold(
        &self,
        conn: &mut SqliteConnection,
        branch: &BranchCtx,
    ) -> Result<TryAnswer, ResourceError> {
        for item in &branch.items {
            let taken = sqlx::query(
                "UPDATE stock_item SET available = available - ?2 \
                 WHERE resource = ?1 AND available >= ?2",
            )
            .bind(&item.resource)
            .bind(item.quantity)
            .execute(&mut *conn)
            .await?;
            if taken.rows_affected() == 0 {
                let available: Option<i64> =
                    sqlx::query_scalar("SELECT available FROM stock_item WHERE resource = ?1")
                        .bind(&item.resource)
                        .fetch_optional(&mut *conn)
                        .await?;
                let reason = match available {
                    Some(n) => format!(
                        "insufficient stock of {}: {} requested, {n} available",
                        item.resource, item.quantity
                    ),
                    None => format!("item {} does not exist", item.resource),
                };
                return Ok(TryAnswer::Rejected(reason));
            }
            sqlx::query(
                "INSERT INTO stock_hold (reservation_id, branch_id, resource, quantity, state, held_until) \
                 VALUES (?1, ?2, ?3, ?4, 'held', ?5)",
            )
            .bind(&branch.key.reservation_id)
            .bind(&branch.key.branch_id)
            .bind(&item.resource)
            .bind(item.quantity)
            .bind(branch.hold_until.timestamp_micros())
            .execute(&mut *conn)
            .await?;
        }
        Ok(TryAnswer::Held)
    }

    async fn confirm(
        &self,
        conn: &mut SqliteConnection,
        branch: &BranchCtx,
    ) -> Result<ConfirmOutcome, ResourceError> {
        for item in &branch.items {
            // The units stay out: only the hold row moves (held and confirmed are its sums).
            if move_hold(conn, branch, &item.resource, "confirmed")
                .await?
                .is_none()
            {
                return Ok(ConfirmOutcome::HoldLost);
            }
        }
        Ok(ConfirmOutcome::Confirmed)
    }

    async fn cancel(
        &self,
        conn: &mut SqliteConnection,
        branch: &BranchCtx,
    ) -> Result<(), ResourceError> {
        for item in &branch.items {
            // Units return only if this transition wins (state was still 'held').
            if let Some(quantity) = move_hold(conn, branch, &item.resource, "cancelled").await? {
                sqlx::query("UPDATE stock_item SET available = available + ?2 WHERE resource = ?1")
                    .bind(&item.resource)
                    .bind(quantity)
                    .execute(&mut *conn)
                    .await?;
            }
        }
        Ok(())
    }

    /// Extend: the deadline on the branch's hold rows follows the barrier's (for people
    /// reading them; reclaim reads the barrier).
    async fn extend(
        &self,
        conn: &mut SqliteConnection,
        branch: &BranchCtx,
    ) -> Result<(), ResourceError> {
        sqlx::query(
            "UPDATE stock_hold SET held_until = ?3 \
             WHERE reservation_id = ?1 AND branch_id = ?2 AND state = 'held'",
        )
        .bind(&branch.key.reservation_id)
        .bind(&branch.key.branch_id)
        .bind(branch.hold_until.timestamp_micros())
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    async fn forget_released(
        &self,
        conn: &mut SqliteConnection,
        branches: &[crate::participant::BranchKey],
    ) -> Result<u64, ResourceError> {
        let mut gone = 0;
        for key in branches {
            gone += sqlx::query(
                "DELETE FROM stock_hold WHERE reservation_id = ?1 AND branch_id = ?2 AND state = 'cancelled'",
            )
            .bind(&key.reservation_id)
            .bind(&key.branch_id)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        }
        Ok(gone)
    }
}

/// Moves the branch's hold on `resource` from 'held' to `to`; the quantity when it won.
async fn move_hold(
    conn: &mut SqliteConnection,
    branch: &BranchCtx,
    resource: &str,
    to: &str,
) -> Result<Option<i64>, ResourceError> {
    Ok(sqlx::query_scalar(
        "UPDATE stock_hold SET state = ?4 \
         WHERE reservation_id = ?1 AND branch_id = ?2 AND resource = ?3 AND state = 'held' \
         RETURNING quantity",
    )
    .bind(&branch.key.reservation_id)
    .bind(&branch.key.branch_id)
    .bind(resource)
    .bind(to)
    .fetch_optional(&mut *conn)
    .await?)
}

#[async_trait]
impl Inventory<Sqlite> for Stock {
    async fn put(
        &self,
        conn: &mut SqliteConnection,
        resource: &str,
        capacity: i64,
    ) -> Result<ResourceCounts, ResourceError> {
        let created = sqlx::query(
            "INSERT INTO stock_item (resource, available, capacity) VALUES (?1, ?2, ?2) \
             ON CONFLICT DO NOTHING",
        )
        .bind(resource)
        .bind(capacity)
        .execute(&mut *conn)
        .await?;
        if created.rows_affected() == 0 {
            let counts = Inventory::<Sqlite>::get(self, conn, resource)
                .await?
                .ok_or_else(|| ResourceError::Internal(format!("item {resource} vanished")))?;
            let (held, confirmed) = (counts.held, counts.confirmed);
            if held + confirmed > capacity {
                return Err(ResourceError::FailedPrecondition(format!(
                    "cannot resize {resource} to {capacity}: {held} held and {confirmed} confirmed"
                )));
            }
            sqlx::query(
                "UPDATE stock_item SET capacity = ?2, available = ?2 - ?3 WHERE resource = ?1",
            )
            .bind(resource)
            .bind(capacity)
            .bind(held + confirmed)
            .execute(&mut *conn)
            .await?;
        }
        Inventory::<Sqlite>::get(self, conn, resource)
            .await?
            .ok_or_else(|| ResourceError::Internal(format!("item {resource} vanished")))
    }

    async fn get(
        &self,
        conn: &mut SqliteConnection,
        resource: &str,
    ) -> Result<Option<ResourceCounts>, ResourceError> {
        // Capacity as set, the counter Try takes from, the units the hold rows say are out:
        // one statement, one snapshot.
        let row = sqlx::query(
            "SELECT i.capacity AS capacity, i.available AS available, \
                 coalesce(sum(CASE WHEN h.state = 'held' THEN h.quantity END), 0) AS held, \
                 coalesce(sum(CASE WHEN h.state = 'confirmed' THEN h.quantity END), 0) AS confirmed \
             FROM stock_item i \
             LEFT JOIN stock_hold h ON h.resource = i.resource AND h.state IN ('held', 'confirmed') \
             WHERE i.resource = ?1 GROUP BY i.resource",
        )
        .bind(resource)
        .fetch_optional(&mut *conn)
        .await?;
        row.map(|row| ResourceCounts::from_row(resource, &row))
            .transpose()
    }
}
