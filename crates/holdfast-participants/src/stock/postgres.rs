//! `stock` on PostgreSQL: the guarded UPDATE takes the item's row lock. A first Try of one
//! item is one autocommit statement with its barrier row ([`TRY_IN_ONE`]), so the lock is
//! held only inside PostgreSQL, up to that statement's commit; Cancel locks each item
//! before its winning hold transition returns the units. Confirm moves only its hold row: the
//! units stay out, so it never queues for the item's lock behind the item's Tries (a flash
//! sale's winners do not take turns with its losers for it). The item row keeps `available`
//! and `capacity`; held and confirmed units are the hold rows' sums. A held branch's Confirm
//! (and a one-item branch's Cancel) is one statement with its barrier move ([`CONFIRM_IN_ONE`],
//! [`CANCEL_IN_ONE`]).

use std::collections::HashMap;
use std::sync::LazyLock;

use async_trait::async_trait;
use sqlx::{PgConnection, Row};

use super::{Stock, allocate, refusal, validate_items};
use crate::admin::{Inventory, ResourceCounts};
use crate::participant::{
    BarrierPhase, BranchCtx, ConfirmOutcome, HeldBarrierMove, HeldBarrierRow, Item, Resource,
    ResourceError, Shortcuts, TryAnswer,
};

async fn lock_item(conn: &mut PgConnection, resource: &str) -> Result<(), ResourceError> {
    sqlx::query("SELECT 1 FROM stock_item WHERE resource = $1 FOR UPDATE")
        .bind(resource)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// A first Try of one item in one statement: the guarded UPDATE takes the units (and the
/// item's row lock), the hold row and the barrier row follow from its one row, and the
/// statement's commit releases the lock. A branch with a committed barrier row (a repeat)
/// takes nothing and says so (`found`). `available` is read from the statement's snapshot,
/// for the refusal's reason.
static TRY_IN_ONE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH taken AS ( \
             UPDATE stock_item SET available = available - $2 \
             WHERE resource = $1 AND available >= $2 AND {absent} RETURNING resource), \
         hold AS ( \
             INSERT INTO stock_hold (reservation_id, branch_id, resource, quantity, state, held_until) \
             SELECT $3, $4, resource, $2, 'held', $5 FROM taken RETURNING 1), \
         barrier AS ({insert}) \
         SELECT (SELECT count(*) FROM barrier) AS held, NOT {absent} AS found, \
                (SELECT available FROM stock_item WHERE resource = $1) AS available",
        absent = HeldBarrierRow::absent(6),
        insert = HeldBarrierRow::insert_from("hold", 6)
    )
});

/// A held branch's hold rows, all of them `held` and one per item: the guard of a Confirm or
/// Cancel in one statement (`b` the branch's barrier row, `$2`/`$3` its key).
const ALL_HELD: &str = "(SELECT count(*) FROM stock_hold h \
     WHERE h.reservation_id = $2 AND h.branch_id = $3 AND h.state = 'held') \
     = jsonb_array_length(b.items)";

/// A held branch's Confirm in one statement: the barrier row moves when every hold row is
/// still held, and then they are confirmed (the item row is not touched, so not locked).
static CONFIRM_IN_ONE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH moved AS ({}), \
         done AS ( \
             UPDATE stock_hold SET state = 'confirmed' \
             WHERE reservation_id = $2 AND branch_id = $3 AND state = 'held' \
               AND EXISTS (SELECT 1 FROM moved)) \
         SELECT count(*) AS moved FROM moved",
        HeldBarrierMove::update_if(1, ALL_HELD)
    )
});

/// A held one-item branch's Cancel in one statement: the barrier row, the hold row, then the
/// item's units back (its row lock last, held to the statement's commit only). A branch of
/// several items goes the general way, which locks its items in order.
static CANCEL_IN_ONE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH moved AS ({}), \
         released AS ( \
             UPDATE stock_hold SET state = 'cancelled' \
             WHERE reservation_id = $2 AND branch_id = $3 AND state = 'held' \
               AND EXISTS (SELECT 1 FROM moved) RETURNING resource, quantity), \
         done AS ( \
             UPDATE stock_item i SET available = i.available + r.quantity \
             FROM released r WHERE i.resource = r.resource) \
         SELECT count(*) AS moved FROM moved",
        HeldBarrierMove::update_if(
            1,
            &format!("jsonb_array_length(b.items) = 1 AND {ALL_HELD}")
        )
    )
});

/// A batch's hold rows, a column each (for `UNNEST`).
#[derive(Default)]
struct HoldColumns<'a> {
    reservation_id: Vec<&'a str>,
    branch_id: Vec<&'a str>,
    resource: Vec<&'a str>,
    quantity: Vec<i64>,
    held_until: Vec<chrono::DateTime<chrono::Utc>>,
}

impl<'a> HoldColumns<'a> {
    fn push(&mut self, branch: &'a BranchCtx, item: &'a Item) {
        self.reservation_id.push(&branch.key.reservation_id);
        self.branch_id.push(&branch.key.branch_id);
        self.resource.push(&item.resource);
        self.quantity.push(item.quantity);
        self.held_until.push(branch.hold_until);
    }
}

#[async_trait]
impl Resource for Stock {
    const RELEASED_TABLE: Option<&'static str> = Some("stock_hold");

    fn validate(&self, items: &[Item]) -> Result<(), ResourceError> {
        validate_items(items)
    }

    async fn try_hold(
        &self,
        conn: &mut PgConnection,
        branch: &BranchCtx,
    ) -> Result<TryAnswer, ResourceError> {
        for item in &branch.items {
            let held = sqlx::query(
                "WITH taken AS ( \
                     UPDATE stock_item SET available = available - $2 \
                     WHERE resource = $1 AND available >= $2 RETURNING resource) \
                 INSERT INTO stock_hold (reservation_id, branch_id, resource, quantity, state, held_until) \
                 SELECT $3, $4, resource, $2, 'held', $5 FROM taken RETURNING 1",
            )
            .bind(&item.resource)
            .bind(item.quantity)
            .bind(&branch.key.reservation_id)
            .bind(&branch.key.branch_id)
            .bind(branch.hold_until)
            .fetch_optional(&mut *conn)
            .await?;
            if held.is_none() {
                let available: Option<i64> =
                    sqlx::query_scalar("SELECT available FROM stock_item WHERE resource = $1")
                        .bind(&item.resource)
                        .fetch_optional(&mut *conn)
                        .await?;
                return Ok(refusal(item, available));
            }
        }
        Ok(TryAnswer::Held)
    }

    async fn confirm(
        &self,
        conn: &mut PgConnection,
        branch: &BranchCtx,
    ) -> Result<ConfirmOutcome, ResourceError> {
        for item in &branch.items {
            let won = sqlx::query(
                "UPDATE stock_hold SET state = 'confirmed' \
                 WHERE reservation_id = $2 AND branch_id = $3 AND resource = $1 AND state = 'held' \
                 RETURNING 1",
            )
            .bind(&item.resource)
            .bind(&branch.key.reservation_id)
            .bind(&branch.key.branch_id)
            .fetch_optional(&mut *conn)
            .await?;
            if won.is_none() {
                return Ok(ConfirmOutcome::HoldLost);
            }
        }
        Ok(ConfirmOutcome::Confirmed)
    }

    async fn cancel(
        &self,
        conn: &mut PgConnection,
        branch: &BranchCtx,
    ) -> Result<(), ResourceError> {
        for item in &branch.items {
            lock_item(conn, &item.resource).await?;
            // Units return only if this transition wins (state was still 'held').
            sqlx::query(
                "WITH released AS ( \
                     UPDATE stock_hold SET state = 'cancelled' \
                     WHERE reservation_id = $2 AND branch_id = $3 AND resource = $1 AND state = 'held' \
                     RETURNING resource, quantity) \
                 UPDATE stock_item i SET available = i.available + r.quantity \
                 FROM released r WHERE i.resource = r.resource",
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
        conn: &mut PgConnection,
        branch: &BranchCtx,
    ) -> Result<(), ResourceError> {
        sqlx::query(
            "UPDATE stock_hold SET held_until = $3 \
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
                "DELETE FROM stock_hold WHERE reservation_id = $1 AND branch_id = $2 AND state = 'cancelled'",
            )
            .bind(&key.reservation_id)
            .bind(&key.branch_id)
            .execute(&mut *conn)
            .await?
            .rows_affected();
        }
        Ok(gone)
    }

    fn shortcuts(&self) -> Option<&dyn Shortcuts> {
        Some(self)
    }
}

/// A one-item first Try, and a held branch's Confirm (a one-item branch's Cancel), each one
/// statement with its barrier row; concurrent first Tries in one transaction, the sale's
/// item locked once per batch.
#[async_trait]
impl Shortcuts for Stock {
    async fn settle_in_one(
        &self,
        conn: &mut PgConnection,
        moved: &HeldBarrierMove<'_>,
    ) -> Result<bool, ResourceError> {
        let statement = match moved.to() {
            BarrierPhase::Confirmed => CONFIRM_IN_ONE.as_str(),
            BarrierPhase::Cancelled => CANCEL_IN_ONE.as_str(),
            _ => return Ok(false),
        };
        let row = moved
            .bind(sqlx::query(statement))
            .fetch_one(&mut *conn)
            .await?;
        Ok(row.try_get::<i64, _>("moved")? == 1)
    }

    fn tries_in_batches(&self) -> bool {
        true
    }

    /// The batch's items locked in one statement (sorted, as a Try of several locks them),
    /// the units allocated here in arrival order ([`allocate`]), then every hold taken in one
    /// statement: a sale's item is locked once per batch, not once per Try.
    async fn try_hold_batch(
        &self,
        conn: &mut PgConnection,
        branches: &[&BranchCtx],
    ) -> Result<Vec<TryAnswer>, ResourceError> {
        let mut resources: Vec<&str> = branches
            .iter()
            .flat_map(|b| b.items.iter().map(|i| i.resource.as_str()))
            .collect();
        resources.sort_unstable();
        resources.dedup();
        let available: HashMap<String, i64> = sqlx::query_as(
            "SELECT resource, available FROM stock_item WHERE resource = ANY($1) \
             ORDER BY resource FOR UPDATE",
        )
        .bind(&resources)
        .fetch_all(&mut *conn)
        .await?
        .into_iter()
        .collect();
        let answers = allocate(available, branches);
        let mut holds = HoldColumns::default();
        for (branch, answer) in branches.iter().zip(&answers) {
            if *answer == TryAnswer::Held {
                for item in &branch.items {
                    holds.push(branch, item);
                }
            }
        }
        if !holds.resource.is_empty() {
            sqlx::query(
                "WITH h AS ( \
                     SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::bigint[], \
                                          $5::timestamptz[]) \
                     AS h(reservation_id, branch_id, resource, quantity, held_until)), \
                 taken AS ( \
                     UPDATE stock_item i SET available = i.available - t.quantity \
                     FROM (SELECT resource, sum(quantity) AS quantity FROM h GROUP BY resource) t \
                     WHERE i.resource = t.resource) \
                 INSERT INTO stock_hold (reservation_id, branch_id, resource, quantity, state, held_until) \
                 SELECT reservation_id, branch_id, resource, quantity, 'held', held_until FROM h",
            )
            .bind(holds.reservation_id)
            .bind(holds.branch_id)
            .bind(holds.resource)
            .bind(holds.quantity)
            .bind(holds.held_until)
            .execute(&mut *conn)
            .await?;
        }
        Ok(answers)
    }

    /// One item (a sale's usual Try): one statement. Several: the general way, since a
    /// statement taking the first item and not the second would have to fail as a whole.
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
            .bind(item.quantity)
            .bind(&branch.key.reservation_id)
            .bind(&branch.key.branch_id)
            .bind(branch.hold_until);
        let answer = row.bind(query).fetch_one(&mut *conn).await?;
        HeldBarrierRow::answer(&answer, |answer| {
            Ok(refusal(item, answer.try_get("available")?))
        })
    }
}

#[async_trait]
impl Inventory for Stock {
    async fn put(
        &self,
        conn: &mut PgConnection,
        resource: &str,
        capacity: i64,
    ) -> Result<ResourceCounts, ResourceError> {
        let created = sqlx::query(
            "INSERT INTO stock_item (resource, available, capacity) VALUES ($1, $2, $2) \
             ON CONFLICT DO NOTHING RETURNING 1",
        )
        .bind(resource)
        .bind(capacity)
        .fetch_optional(&mut *conn)
        .await?;
        if created.is_none() {
            // Under the item's lock no Try takes and no Cancel returns units; a Confirm may
            // run, but it moves units between held and confirmed, not out or back.
            lock_item(conn, resource).await?;
            let counts = Inventory::<sqlx::Postgres>::get(self, conn, resource)
                .await?
                .ok_or_else(|| ResourceError::Internal(format!("item {resource} vanished")))?;
            let (held, confirmed) = (counts.held, counts.confirmed);
            if held + confirmed > capacity {
                return Err(ResourceError::FailedPrecondition(format!(
                    "cannot resize {resource} to {capacity}: {held} held and {confirmed} confirmed"
                )));
            }
            sqlx::query(
                "UPDATE stock_item SET capacity = $2, available = $2 - $3 WHERE resource = $1",
            )
            .bind(resource)
            .bind(capacity)
            .bind(held + confirmed)
            .execute(&mut *conn)
            .await?;
        }
        Inventory::<sqlx::Postgres>::get(self, conn, resource)
            .await?
            .ok_or_else(|| ResourceError::Internal(format!("item {resource} vanished")))
    }

    async fn get(
        &self,
        conn: &mut PgConnection,
        resource: &str,
    ) -> Result<Option<ResourceCounts>, ResourceError> {
        // Capacity as set, the counter Try takes from, the units the hold rows say are out:
        // one statement, one snapshot.
        let row = sqlx::query(
            "SELECT i.capacity, i.available, \
                 CAST(coalesce(sum(h.quantity) FILTER (WHERE h.state = 'held'), 0) AS BIGINT) AS held, \
                 CAST(coalesce(sum(h.quantity) FILTER (WHERE h.state = 'confirmed'), 0) AS BIGINT) AS confirmed \
             FROM stock_item i \
             LEFT JOIN stock_hold h ON h.resource = i.resource AND h.state IN ('held', 'confirmed') \
             WHERE i.resource = $1 GROUP BY i.resource",
        )
        .bind(resource)
        .fetch_optional(&mut *conn)
        .await?;
        row.map(|row| ResourceCounts::from_row(resource, &row))
            .transpose()
    }
}
