//! Reference participant `rooms`: time-slot holds over half-open intervals `[start, end)`.
//! Each room row is the lock target; the partial exclusion constraint `slot_hold_no_overlap`
//! (btree_gist over room and tstzrange) rejects overlapping active holds even if the lock
//! protocol were bypassed. Adjacent slots coexist; a cancelled hold frees its slot.
//!
//! Admin counts: a room has capacity 1 and is counted *at the current instant*: `held` is 1
//! when a held slot covers now, `confirmed` is 1 when a confirmed slot covers now, and
//! `available = 1 - held - confirmed`. Future slots do not show in these counts.

mod sqlite;

use async_trait::async_trait;
use sqlx::{PgConnection, Row};

use super::admin::{Inventory, ResourceCounts};
use crate::participant::{BranchCtx, ConfirmOutcome, Item, Resource, ResourceError, TryAnswer};

/// The rooms participant's business logic and inventory.
#[derive(Clone, Copy, Debug, Default)]
pub struct Rooms;

pub(crate) fn room_ids(branch: &BranchCtx) -> Vec<String> {
    let mut rooms: Vec<String> = branch.items.iter().map(|i| i.resource.clone()).collect();
    rooms.dedup();
    rooms
}

/// Locks the rooms in resource order, the order every writer uses.
async fn lock_rooms(conn: &mut PgConnection, rooms: &[String]) -> Result<(), ResourceError> {
    sqlx::query("SELECT 1 FROM room WHERE resource = ANY($1) ORDER BY resource FOR UPDATE")
        .bind(rooms)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Checks items beyond what the SDK checks (both backends).
pub(crate) fn validate_items(items: &[Item]) -> Result<(), ResourceError> {
    for (i, item) in items.iter().enumerate() {
        if item.quantity != 1 {
            return Err(ResourceError::invalid(
                format!("items[{i}].quantity"),
                "must be 1 for a room",
            ));
        }
        if item.during.is_none() {
            return Err(ResourceError::invalid(
                format!("items[{i}].during"),
                "is required for a room",
            ));
        }
    }
    Ok(())
}

#[async_trait]
impl Resource for Rooms {
    fn validate(&self, items: &[Item]) -> Result<(), ResourceError> {
        validate_items(items)
    }

    async fn try_hold(
        &self,
        conn: &mut PgConnection,
        branch: &BranchCtx,
    ) -> Result<TryAnswer, ResourceError> {
        let rooms = room_ids(branch);
        let found =
            sqlx::query("SELECT 1 FROM room WHERE resource = ANY($1) ORDER BY resource FOR UPDATE")
                .bind(&rooms)
                .fetch_all(&mut *conn)
                .await?;
        if found.len() != rooms.len() {
            return Ok(TryAnswer::Rejected("unknown room".to_owned()));
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
                // The SDK rolls back to its savepoint, which also clears the aborted state.
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
