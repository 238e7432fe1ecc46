//! Reference participant `seats`: one row per seat (capacity 1). A hold writes the holding
//! branch (the hold token) and its deadline on the seat row with an atomic conditional claim;
//! Confirm and Cancel only move seats the branch still holds.

mod sqlite;

use async_trait::async_trait;
use sqlx::{PgConnection, Row};

use super::admin::{Inventory, ResourceCounts};
use crate::participant::{BranchCtx, ConfirmOutcome, Item, Resource, ResourceError, TryAnswer};

/// The seats participant's business logic and inventory.
#[derive(Clone, Copy, Debug, Default)]
pub struct Seats;

fn seat_ids(branch: &BranchCtx) -> Vec<String> {
    branch.items.iter().map(|i| i.resource.clone()).collect()
}

/// Locks the branch's seats in resource order, the order every writer uses.
async fn lock_seats(conn: &mut PgConnection, seats: &[String]) -> Result<(), ResourceError> {
    sqlx::query("SELECT 1 FROM seat WHERE resource = ANY($1) ORDER BY resource FOR UPDATE")
        .bind(seats)
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
                "must be 1 for a seat",
            ));
        }
        if item.during.is_some() {
            return Err(ResourceError::invalid(
                format!("items[{i}].during"),
                "must be empty for a seat",
            ));
        }
    }
    Ok(())
}

#[async_trait]
impl Resource for Seats {
    fn validate(&self, items: &[Item]) -> Result<(), ResourceError> {
        validate_items(items)
    }

    async fn try_hold(
        &self,
        conn: &mut PgConnection,
        branch: &BranchCtx,
    ) -> Result<TryAnswer, ResourceError> {
        // One statement per seat, in item order: each claim locks its row, so concurrent
        // multi-seat Tries lock in the same order.
        for item in &branch.items {
            let claimed = sqlx::query(
                "UPDATE seat SET state = 'held', reservation_id = $2, branch_id = $3, held_until = $4 \
                 WHERE resource = $1 AND state = 'available' RETURNING 1",
            )
            .bind(&item.resource)
            .bind(&branch.key.reservation_id)
            .bind(&branch.key.branch_id)
            .bind(branch.hold_until)
            .fetch_optional(&mut *conn)
            .await?;
            if claimed.is_none() {
                let exists: Option<i32> =
                    sqlx::query_scalar("SELECT 1 FROM seat WHERE resource = $1")
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
        conn: &mut PgConnection,
        branch: &BranchCtx,
    ) -> Result<ConfirmOutcome, ResourceError> {
        let seats = seat_ids(branch);
        lock_seats(conn, &seats).await?;
        let done = sqlx::query(
            "UPDATE seat SET state = 'confirmed', held_until = NULL \
             WHERE resource = ANY($1) AND state = 'held' AND reservation_id = $2 AND branch_id = $3",
        )
        .bind(&seats)
        .bind(&branch.key.reservation_id)
        .bind(&branch.key.branch_id)
        .execute(&mut *conn)
        .await?;
        // Every seat must still be ours; the SDK rolls back a partial confirm.
        if done.rows_affected() == seats.len() as u64 {
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
        let seats = seat_ids(branch);
        lock_seats(conn, &seats).await?;
        sqlx::query(
            "UPDATE seat SET state = 'available', reservation_id = NULL, branch_id = NULL, held_until = NULL \
             WHERE resource = ANY($1) AND state = 'held' AND reservation_id = $2 AND branch_id = $3",
        )
        .bind(&seats)
        .bind(&branch.key.reservation_id)
        .bind(&branch.key.branch_id)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }
}

#[async_trait]
impl Inventory for Seats {
    fn check_capacity(&self, capacity: i64) -> Result<(), String> {
        if capacity != 1 {
            return Err("must be 1 for a seat".to_owned());
        }
        Ok(())
    }

    async fn put(
        &self,
        conn: &mut PgConnection,
        resource: &str,
        _capacity: i64,
    ) -> Result<ResourceCounts, ResourceError> {
        sqlx::query("INSERT INTO seat (resource) VALUES ($1) ON CONFLICT DO NOTHING")
            .bind(resource)
            .execute(&mut *conn)
            .await?;
        Inventory::<sqlx::Postgres>::get(self, conn, resource)
            .await?
            .ok_or_else(|| ResourceError::Internal(format!("seat {resource} vanished")))
    }

    async fn get(
        &self,
        conn: &mut PgConnection,
        resource: &str,
    ) -> Result<Option<ResourceCounts>, ResourceError> {
        let row = sqlx::query("SELECT state FROM seat WHERE resource = $1")
            .bind(resource)
            .fetch_optional(&mut *conn)
            .await?;
        let Some(row) = row else { return Ok(None) };
        let state: String = row.try_get("state")?;
        Ok(Some(seat_counts(resource, &state)))
    }
}

/// A seat's counts from its state (both backends).
pub(crate) fn seat_counts(resource: &str, state: &str) -> ResourceCounts {
    let (available, held, confirmed) = match state {
        "available" => (1, 0, 0),
        "held" => (0, 1, 0),
        _ => (0, 0, 1),
    };
    ResourceCounts {
        resource: resource.to_owned(),
        capacity: 1,
        available,
        held,
        confirmed,
    }
}
