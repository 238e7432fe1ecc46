//! Retention on PostgreSQL (SPEC 8.3): one statement per batch picks the oldest finished
//! reservations with nothing left to do (`FOR UPDATE SKIP LOCKED`: a row a decision or a sweep
//! holds is left for the next batch, nobody waits on the purge) and deletes them; their
//! branches, further payments and any other referencing rows go by `ON DELETE CASCADE`.

use std::time::Duration;

use sqlx::postgres::PgPool;

use super::rows::millis;
use crate::store::{Purged, StoreError};

/// [`crate::store::Store::purge_finished`].
pub(super) async fn purge_finished(
    pool: &PgPool,
    keep: Duration,
    limit: u32,
) -> Result<Purged, StoreError> {
    // The counts of cascaded rows are read in the statement's snapshot, before the delete:
    // exactly the rows that go with the victims.
    let (reservations, branches, extra_payments): (i64, i64, i64) = sqlx::query_as(
        "WITH victims AS ( \
            SELECT r.id FROM reservations r \
            WHERE r.state IN ('CONFIRMED', 'CANCELLED', 'EXPIRED', 'REJECTED', 'FAILED') \
              AND r.updated_at < clock_timestamp() - $1 * interval '1 millisecond' \
              AND (r.lease_until IS NULL OR r.lease_until < clock_timestamp()) \
              AND (r.refund_state IS NULL OR r.refund_state = 'REFUNDED') \
              AND NOT (r.state = 'EXPIRED' AND r.payment_ref IS NOT NULL AND r.refund_id IS NULL) \
              AND NOT EXISTS (SELECT 1 FROM extra_payments e WHERE e.reservation_id = r.id \
                    AND (e.refund_state <> 'REFUNDED' \
                         OR e.created_at >= clock_timestamp() - $1 * interval '1 millisecond')) \
            ORDER BY r.updated_at \
            LIMIT $2 \
            FOR UPDATE SKIP LOCKED), \
         counted AS ( \
            SELECT (SELECT count(*) FROM branches b \
                    WHERE b.reservation_id IN (SELECT id FROM victims)) AS branches, \
                   (SELECT count(*) FROM extra_payments e \
                    WHERE e.reservation_id IN (SELECT id FROM victims)) AS extras), \
         gone AS (DELETE FROM reservations r USING victims v WHERE r.id = v.id RETURNING 1) \
         SELECT (SELECT count(*) FROM gone), counted.branches, counted.extras FROM counted",
    )
    .bind(millis(keep))
    .bind(i64::from(limit))
    .fetch_one(pool)
    .await?;
    let n = |v: i64| u64::try_from(v).unwrap_or(0);
    Ok(Purged {
        reservations: n(reservations),
        branches: n(branches),
        extra_payments: n(extra_payments),
    })
}
