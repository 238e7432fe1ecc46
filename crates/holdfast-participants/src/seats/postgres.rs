//! `seats` on PostgreSQL: each seat claimed with an atomic conditional UPDATE of its row. A
//! first Try of one seat is one statement with its barrier row ([`TRY_IN_ONE`]); a held
//! branch's Confirm or Cancel is one statement with its barrier move ([`SETTLE_IN_ONE`]), its
//! seats locked after the barrier row, which no other writer of them gets past. The general
//! way (a Try of several seats, a Confirm finding its hold gone) claims several seats in item
//! order and locks them in resource order first.

use std::sync::LazyLock;

use async_trait::async_trait;
use sqlx::{PgConnection, Row};

use super::{Seats, seat_counts, validate_items};
use crate::admin::{Inventory, ResourceCounts};
use crate::participant::{
    BarrierPhase, BranchCtx, ConfirmOutcome, HeldBarrierMove, HeldBarrierRow, Item, Resource,
    ResourceError, Shortcuts, TryAnswer,
};

/// A first Try of one seat in one statement: the guarded UPDATE claims the seat (and its row
/// lock), the barrier row follows from its one row, and the statement's commit releases the
/// lock. A branch with a committed barrier row (a repeat) claims nothing and says so (`found`);
/// `seat_exists` names a refusal's reason.
static TRY_IN_ONE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH taken AS ( \
             UPDATE seat SET state = 'held', reservation_id = $2, branch_id = $3, held_until = $4 \
             WHERE resource = $1 AND state = 'available' AND {absent} RETURNING resource), \
         barrier AS ({insert}) \
         SELECT (SELECT count(*) FROM barrier) AS held, NOT {absent} AS found, \
                EXISTS (SELECT 1 FROM seat WHERE resource = $1) AS seat_exists",
        absent = HeldBarrierRow::absent(5),
        insert = HeldBarrierRow::insert_from("taken", 5)
    )
});

/// A refused claim's reason.
fn refusal(seat: &str, exists: bool) -> TryAnswer {
    TryAnswer::Rejected(if exists {
        format!("seat {seat} is taken")
    } else {
        format!("seat {seat} does not exist")
    })
}

/// A held branch's Confirm (`$5` = `'confirmed'`) or Cancel (`$5` = `'available'`) in one
/// statement: the barrier row moves when every seat of the branch is still held by it, and
/// then they change.
static SETTLE_IN_ONE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH moved AS ({}), \
         done AS ( \
             UPDATE seat SET state = $5, held_until = NULL, \
                 reservation_id = CASE WHEN $5 = 'available' THEN NULL ELSE reservation_id END, \
                 branch_id = CASE WHEN $5 = 'available' THEN NULL ELSE branch_id END \
             WHERE reservation_id = $2 AND branch_id = $3 AND state = 'held' \
               AND EXISTS (SELECT 1 FROM moved)) \
         SELECT count(*) AS moved FROM moved",
        HeldBarrierMove::update_if(
            1,
            "(SELECT count(*) FROM seat s \
              WHERE s.reservation_id = $2 AND s.branch_id = $3 AND s.state = 'held') \
             = jsonb_array_length(b.items)"
        )
    )
});

/// The branch's seats, in lock order (items are sorted by resource).
fn seat_ids(branch: &BranchCtx) -> Vec<String> {
    branch.items.iter().map(|i| i.resource.clone()).collect()
}

/// Locks the branch's seats in resource order, the order every writer uses. One seat needs no
/// order: the UPDATE that follows takes its lock, so the common one-seat branch skips this
/// statement (a round trip, and a plan made afresh on every call).
async fn lock_seats(conn: &mut PgConnection, seats: &[String]) -> Result<(), ResourceError> {
    if seats.len() < 2 {
        return Ok(());
    }
    sqlx::query("SELECT 1 FROM seat WHERE resource = ANY($1) ORDER BY resource FOR UPDATE")
        .bind(seats)
        .execute(&mut *conn)
        .await?;
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
                return Ok(refusal(&item.resource, exists.is_some()));
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

    /// Extend: the deadline on the branch's hold rows follows the barrier's (for people
    /// reading them; reclaim reads the barrier).
    async fn extend(
        &self,
        conn: &mut PgConnection,
        branch: &BranchCtx,
    ) -> Result<(), ResourceError> {
        sqlx::query(
            "UPDATE seat SET held_until = $3 \
             WHERE reservation_id = $1 AND branch_id = $2 AND state = 'held'",
        )
        .bind(&branch.key.reservation_id)
        .bind(&branch.key.branch_id)
        .bind(branch.hold_until)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    fn shortcuts(&self) -> Option<&dyn Shortcuts> {
        Some(self)
    }
}

/// A one-seat first Try, and a held branch's Confirm or Cancel, each one statement with its
/// barrier row.
#[async_trait]
impl Shortcuts for Seats {
    /// One seat (the usual Try): one statement. Several: the general way, which claims them
    /// in order and undoes all when one is taken.
    async fn try_hold_in_one(
        &self,
        conn: &mut PgConnection,
        branch: &BranchCtx,
        row: &HeldBarrierRow<'_>,
    ) -> Result<Option<TryAnswer>, ResourceError> {
        let [item] = branch.items.as_slice() else {
            return Ok(None);
        };
        let query = sqlx::query(TRY_IN_ONE.as_str())
            .bind(&item.resource)
            .bind(&branch.key.reservation_id)
            .bind(&branch.key.branch_id)
            .bind(branch.hold_until);
        let answer = row.bind(query).fetch_one(&mut *conn).await?;
        HeldBarrierRow::answer(&answer, |answer| {
            Ok(refusal(&item.resource, answer.try_get("seat_exists")?))
        })
    }

    async fn settle_in_one(
        &self,
        conn: &mut PgConnection,
        moved: &HeldBarrierMove<'_>,
    ) -> Result<bool, ResourceError> {
        let seat_state = match moved.to() {
            BarrierPhase::Confirmed => "confirmed",
            BarrierPhase::Cancelled => "available",
            _ => return Ok(false),
        };
        let row = moved
            .bind(sqlx::query(SETTLE_IN_ONE.as_str()))
            .bind(seat_state)
            .fetch_one(&mut *conn)
            .await?;
        Ok(row.try_get::<i64, _>("moved")? == 1)
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
