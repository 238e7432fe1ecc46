//! `rooms` on SQLite. SQLite has no exclusion constraint: the overlap check
//! (`start < ?end AND ?start < end` among the room's active holds) runs inside the SDK's
//! `BEGIN IMMEDIATE` transaction, whose write lock makes check-then-insert atomic. Slots are
//! `[start_us, end_us)` in integer microseconds; admin counts use the database clock.

use async_trait::async_trait;
use sqlx::{Row, Sqlite, SqliteConnection};

use super::{Rooms, room_ids, validate_items};
use crate::admin::{Inventory, ResourceCounts};
use crate::participant::{BranchCtx, ConfirmOutcome, Item, Resource, ResourceError, TryAnswer};

#[async_trait]
impl Resource<Sqlite> for Rooms {
    const RELEASED_TABLE: Option<&'static str> = Some("slot_hold");

    fn validate(&self, items: &[Item]) -> Result<(), ResourceError> {
        validate_items(items)
    }

    async fn try_hold(
        &self,
        conn: &mut SqliteConnection,
        branch: &BranchCtx,
    ) -> Result<TryAnswer, ResourceError> {
        for room in room_ids(branch) {
            let found: Option<i64> = sqlx::query_scalar("SELECT 1 FROM room WHERE resource = ?1")
                .bind(&room)
                .fetch_optional(&mut *conn)
                .await?;
            if found.is_none() {
                return Ok(TryAnswer::Rejected(format!("room {room} does not exist")));
            }
        }
        for item in &branch.items {
            let Some(slot) = item.during else {
                return Err(ResourceError::invalid(
                    "items.during",
                    "is required for a room",
                ));
            };
            let (start, end) = (slot.start.timestamp_micros(), slot.end.timestamp_micros());
            let overlap: Option<i64> = sqlx::query_scalar(
                "SELECT 1 FROM slot_hold WHERE resource = ?1 AND state IN ('held', 'confirmed') \
                 AND start_us < ?3 AND ?2 < end_us LIMIT 1",
            )
            .bind(&item.resource)
            .bind(start)
            .bind(end)
            .fetch_optional(&mut *conn)
            .await?;
            if overlap.is_some() {
                return Ok(TryAnswer::Rejected(format!(
                    "room {} is taken during [{}, {})",
                    item.resource,
                    slot.start.to_rfc3339(),
                    slot.end.to_rfc3339()
                )));
            }
            sqlx::query(
                "INSERT INTO slot_hold (reservation_id, branch_id, resource, start_us, end_us, state, held_until) \
                 VALUES (?1, ?2, ?3, ?4, ?5, 'held', ?6)",
            )
            .bind(&branch.key.reservation_id)
            .bind(&branch.key.branch_id)
            .bind(&item.resource)
            .bind(start)
            .bind(end)
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
        let done = sqlx::query(
            "UPDATE slot_hold SET state = 'confirmed' \
             WHERE reservation_id = ?1 AND branch_id = ?2 AND state = 'held'",
        )
        .bind(&branch.key.reservation_id)
        .bind(&branch.key.branch_id)
        .execute(&mut *conn)
        .await?;
        if done.rows_affected() == branch.items.len() as u64 {
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
        sqlx::query(
            "UPDATE slot_hold SET state = 'cancelled' \
             WHERE reservation_id = ?1 AND branch_id = ?2 AND state = 'held'",
        )
        .bind(&branch.key.reservation_id)
        .bind(&branch.key.branch_id)
        .execute(&mut *conn)
        .await?;
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
            "UPDATE slot_hold SET held_until = ?3 \
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
                "DELETE FROM slot_hold WHERE reservation_id = ?1 AND branch_id = ?2 AND state = 'cancelled'",
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

#[async_trait]
impl Inventory<Sqlite> for Rooms {
    fn check_capacity(&self, capacity: i64) -> Result<(), String> {
        <Self as Inventory>::check_capacity(self, capacity)
    }

    async fn put(
        &self,
        conn: &mut SqliteConnection,
        resource: &str,
        _capacity: i64,
    ) -> Result<ResourceCounts, ResourceError> {
        sqlx::query("INSERT INTO room (resource) VALUES (?1) ON CONFLICT DO NOTHING")
            .bind(resource)
            .execute(&mut *conn)
            .await?;
        Inventory::<Sqlite>::get(self, conn, resource)
            .await?
            .ok_or_else(|| ResourceError::Internal(format!("room {resource} vanished")))
    }

    async fn get(
        &self,
        conn: &mut SqliteConnection,
        resource: &str,
    ) -> Result<Option<ResourceCounts>, ResourceError> {
        let row = sqlx::query(concat!(
            "SELECT \
               (SELECT count(*) FROM slot_hold h WHERE h.resource = r.resource AND h.state = 'held' \
                  AND h.start_us <= n.now AND n.now < h.end_us) AS held, \
               (SELECT count(*) FROM slot_hold h WHERE h.resource = r.resource AND h.state = 'confirmed' \
                  AND h.start_us <= n.now AND n.now < h.end_us) AS confirmed \
             FROM room r, (SELECT ",
            sqlite_now_us!(),
            " AS now) n WHERE r.resource = ?1"
        ))
        .bind(resource)
        .fetch_optional(&mut *conn)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let held: i64 = row.try_get("held")?;
        let confirmed: i64 = row.try_get("confirmed")?;
        Ok(Some(ResourceCounts {
            resource: resource.to_owned(),
            capacity: 1,
            available: 1 - held - confirmed,
            held,
            confirmed,
        }))
    }
}
