//! `seats` on SQLite: the same transitions as the PostgreSQL SQL beside it (`postgres.rs`), with
//! no row locks: the SDK's `BEGIN IMMEDIATE` holds the database write lock for the whole call.

use async_trait::async_trait;
use sqlx::{Row, Sqlite, SqliteConnection};

use super::{Seats, validate_items};
use crate::admin::{Inventory, ResourceCounts};
use crate::participant::{BranchCtx, ConfirmOutcome, Item, Resource, ResourceError, TryAnswer};

#[async_trait]
impl Resource<Sqlite> for Seats {
    fn validate(&self, items: &[Item]) -> Result<(), ResourceError> {
        validate_items(items)
    }

    async fn try_hold(
        &self,
        conn: &mut SqliteConnection,
        branch: &BranchCtx,
    ) -> Result<TryAnswer, ResourceError> {
        for item in &branch.items {
            let claimed = sqlx::query(
                "UPDATE seat SET state = 'held', reservation_id = ?2, branch_id = ?3, held_until = ?4 \
                 WHERE resource = ?1 AND state = 'available'",
            )
            .bind(&item.resource)
            .bind(&branch.key.reservation_id)
            .bind(&branch.key.branch_id)
            .bind(branch.hold_until.timestamp_micros())
            .execute(&mut *conn)
            .await?;
            if claimed.rows_affected() == 0 {
                let exists: Option<i64> =
                    sqlx::query_scalar("SELECT 1 FROM seat WHERE resource = ?1")
                        .bind(&item.resource)
                        .fetch_optional(&mut *conn)
                        .await?;
                let reason = match exists {
                    Some(_) => format!("seat {} is taken", item.resource),
                    None => format!("seat {} does not exist", item.resource),
                };
                return Ok(TryAnswer::Rejected(reason));
            }
        }
        Ok(TryAnswer::Held)
    }

    async fn confirm(
        &self,
        conn: &mut SqliteConnection,
        branch: &BranchCtx,
    ) -> Result<ConfirmOutcome, ResourceError> {
        let mut done = 0;
        for item in &branch.items {
            done += sqlx::query(
                "UPDATE seat SET state = 'confirmed', held_until = NULL \
                 WHERE resource = ?1 AND state = 'held' AND reservation_id = ?2 AND branch_id = ?3",
            )
            .bind(&item.resource)
            .bind(&branch.key.reservation_id)
            .bind(&branch.key.branch_id)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        }
        // Every seat must still be ours; the SDK rolls back a partial confirm.
        if done == branch.items.len() as u64 {
            Ok(ConfirmOutcome::Confirmed)
        } else {
            Ok(ConfirmOutcome::HoldLost)
        }
    }

    async fn cancel(
        &self,
        conn: &mut SqliteConnection,
        branch: &BranchCtx,
    ) -> Result<(), ResourceError> {
        for item in &branch.items {
            sqlx::query(
                "UPDATE seat SET state = 'available', reservation_id = NULL, branch_id = NULL, held_until = NULL \
                 WHERE resource = ?1 AND state = 'held' AND reservation_id = ?2 AND branch_id = ?3",
            )
            .bind(&item.resource)
            .bind(&branch.key.reservation_id)
            .bind(&branch.key.branch_id)
            .execute(&mut *conn)
            .await?;
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
            "UPDATE seat SET held_until = ?3 \
             WHERE reservation_id = ?1 AND branch_id = ?2 AND state = 'held'",
        )
        .bind(&branch.key.reservation_id)
        .bind(&branch.key.branch_id)
        .bind(branch.hold_until.timestamp_micros())
        .execute(&mut *conn)
        .await?;
        Ok(())
    }
}

#[async_trait]
impl Inventory<Sqlite> for Seats {
    fn check_capacity(&self, capacity: i64) -> Result<(), String> {
        <Self as Inventory>::check_capacity(self, capacity)
    }

    async fn put(
        &self,
        conn: &mut SqliteConnection,
        resource: &str,
        _capacity: i64,
    ) -> Result<ResourceCounts, ResourceError> {
        sqlx::query("INSERT INTO seat (resource) VALUES (?1) ON CONFLICT DO NOTHING")
            .bind(resource)
            .execute(&mut *conn)
            .await?;
        Inventory::<Sqlite>::get(self, conn, resource)
            .await?
            .ok_or_else(|| ResourceError::Internal(format!("seat {resource} vanished")))
    }

    async fn get(
        &self,
        conn: &mut SqliteConnection,
        resource: &str,
    ) -> Result<Option<ResourceCounts>, ResourceError> {
        let row = sqlx::query("SELECT state FROM seat WHERE resource = ?1")
            .bind(resource)
            .fetch_optional(&mut *conn)
            .await?;
        let Some(row) = row else { return Ok(None) };
        let state: String = row.try_get("state")?;
        Ok(Some(super::seat_counts(resource, &state)))
    }
}
