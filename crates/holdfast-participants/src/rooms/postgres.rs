//! `rooms` on PostgreSQL: the room rows are locked in resource order, and the exclusion
//! constraint `slot_hold_no_overlap` refuses an overlapping active hold (SQLSTATE 23P01),
//! answered as a rejection naming the slot.

use async_trait::async_trait;
use sqlx::{PgConnection, Row};

use super::{Rooms, room_ids, validate_items};
use crate::admin::{Inventory, ResourceCounts};
use crate::participant::{BranchCtx, ConfirmOutcome, Item, Resource, ResourceError, TryAnswer};

/// Locks the rooms in resource order, the order every writer uses.
async fn lock_rooms(conn: &mut PgConnection, rooms: &[String]) -> Result<(), ResourceError> {
    sqlx::query("SELECT 1 FROM room WHERE resource = ANY($1) ORDER BY resource FOR UPDATE")
        .bind(rooms)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

#[async_trait]
impl Resource for Rooms {
    const RELEASED_TABLE: Option<&'static str> = Some("slot_hold");

    fn validate(&self, items: &[Item]) -> Result<(), ResourceError> {
        validate_items(items)
    }

    async fn try_hold(
        &self,
        conn: &mut PgConnection,
        branch: &BranchCtx,
    ) -> Result<TryAnswer, ResourceError> {
        let rooms = room_ids(branch);
        let found: Vec<String> = sqlx::query_scalar(
            "SELECT resource FROM room WHERE resource = ANY($1) ORDER BY resource FOR UPDATE",
        )
        .bind(&rooms)
        .fetch_all(&mut *conn)
        .await?;
        if let Some(missing) = rooms.iter().find(|r| !found.contains(r)) {
            return Ok(TryAnswer::Rejected(format!(
                "room {missing} does not exist"
            )));
        }
        for item in &branch.items {
            let Some(slot) = item.during else {
                return Err(ResourceError::invalid(
                    "items.during",
                    "is required for a room",
                ));
            };
            let inserted = sqlx::query(
                "INSERT INTO slot_hold (reservation_id, branch_id, resource, during, state, held_until) \
                 VALUES ($1, $2, $3, tstzrange($4, $5, '[)'), 'held', $6)",
            )
            .bind(&branch.key.reservation_id)
            .bind(&branch.key.branch_id)
            .bind(&item.resource)
            .bind(slot.start)
            .bind(slot.end)
            .bind(branch.hold_until)
            .execute(&mut *conn)
            .await
            .map_err(ResourceError::from);
            match inserted {
                Ok(_) => {}
                // The SDK rolls the transaction back on a rejection, which also clears the
                // aborted state.
                Err(err) if err.is_exclusion_violation() => {
                    return Ok(TryAnswer::Rejected(format!(
                        "room {} is taken during [{}, {})",
                        item.resource,
                        slot.start.to_rfc3339(),
                        slot.end.to_rfc3339()
                    )));
                }
                Err(err) => return Err(err),
            }
        }
        Ok(TryAnswer::Held)
    }

    async fn confirm(
        &self,
        conn: &mut PgConnection,
        branch: &BranchCtx,
    ) -> Result<ConfirmOutcome, ResourceError> {
        lock_rooms(conn, &room_ids(branch)).await?;
        let done = sqlx::query(
            "UPDATE slot_hold SET state = 'confirmed' \
             WHERE reservation_id = $1 AND branch_id = $2 AND state = 'held'",
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
        conn: &mut PgConnection,
        branch: &BranchCtx,
    ) -> Result<(), ResourceError> {
        lock_rooms(conn, &room_ids(branch)).await?;
        sqlx::query(
            "UPDATE slot_hold SET state = 'cancelled' \
             WHERE reservation_id = $1 AND branch_id = $2 AND state = 'held'",
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
        conn: &mut PgConnection,
        branch: &BranchCtx,
    ) -> Result<(), ResourceError> {
        sqlx::query(
            "UPDATE slot_hold SET held_until = $3 \
             WHERE reservation_id = $1 AND branch_id = $2 AND state = 'held'",
        )
        .bind(&branch.key.reservation_id)
        .bind(&branch.key.branch_id)
        .bind(branch.hold_until)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    async fn forget_released(
        &self,
        conn: &mut PgConnection,
        branches: &[crate::participant::BranchKey],
    ) -> Result<u64, ResourceError> {
        let mut gone = 0;
        for key in branches {
            gone += sqlx::query(
                "DELETE FROM slot_hold WHERE reservation_id = $1 AND branch_id = $2 AND state = 'cancelled'",
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
impl Inventory for Rooms {
    fn check_capacity(&self, capacity: i64) -> Result<(), String> {
        if capacity != 1 {
            return Err("must be 1 for a room".to_owned());
        }
        Ok(())
    }

    async fn put(
        &self,
        conn: &mut PgConnection,
        resource: &str,
        _capacity: i64,
    ) -> Result<ResourceCounts, ResourceError> {
        sqlx::query("INSERT INTO room (resource) VALUES ($1) ON CONFLICT DO NOTHING")
            .bind(resource)
            .execute(&mut *conn)
            .await?;
        Inventory::<sqlx::Postgres>::get(self, conn, resource)
            .await?
            .ok_or_else(|| ResourceError::Internal(format!("room {resource} vanished")))
    }

    async fn get(
        &self,
        conn: &mut PgConnection,
        resource: &str,
    ) -> Result<Option<ResourceCounts>, ResourceError> {
        let row = sqlx::query(
            "SELECT \
               (SELECT count(*) FROM slot_hold h WHERE h.resource = r.resource AND h.state = 'held' \
                  AND h.during @> clock_timestamp()) AS held, \
               (SELECT count(*) FROM slot_hold h WHERE h.resource = r.resource AND h.state = 'confirmed' \
                  AND h.during @> clock_timestamp()) AS confirmed \
             FROM room r WHERE r.resource = $1",
        )
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
