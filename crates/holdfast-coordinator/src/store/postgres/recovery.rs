//! Recovery work on PostgreSQL: sweeps claim due reservations (further payments' refunds
//! included) with leases (`FOR UPDATE SKIP LOCKED`; the claim changes no state, a lapsed
//! hold's driver expires it), drivers renew their leases, a participant that answers again has
//! its backlog woken, and the backlog is counted.

use sqlx::postgres::PgPool;
use uuid::Uuid;

use super::rows::millis;
use crate::store::{Claimed, StoreError, WorkLease};

/// [`crate::store::Store::claim_due`].
pub(super) async fn claim_due(
    pool: &PgPool,
    lease: WorkLease,
    limit: u32,
) -> Result<Vec<Claimed>, StoreError> {
    // The claim only leases: it changes no state. A lapsed hold is claimed as it is, `HELD`,
    // and expired by its driver (`Store::expire_lapsed_hold`, the one write of an expiry); a
    // Confirm racing the sweep meanwhile is judged on the lapsed hold as any late one is. The
    // row locks of `FOR UPDATE SKIP LOCKED` last this one autocommit statement.
    // Each arm of the OR can be searched in an index of its own (`reservations_open` by state
    // and, for holds, expiry; `reservations_payment_work`; the primary key for the further
    // payments' ids), so the sweep's cost follows the work due, not the table: an
    // `id IN (subquery)` arm, or a volatile clock on the holds' expiry, left PostgreSQL only
    // a scan of every row, four times a second (`tests/store`
    // `plans::the_sweep_and_the_work_gauges_search_the_work_indexes`). Holds are due by the
    // statement's start time, a moment before its clock: never early.
    let rows: Vec<(Uuid, bool)> = sqlx::query_as(
        "WITH due AS ( \
            SELECT id, state = 'HELD' AND expires_at <= statement_timestamp() AS lapsed_hold \
            FROM reservations \
            WHERE (lease_until IS NULL OR lease_until < clock_timestamp()) \
              AND ((state = 'HELD' AND expires_at <= statement_timestamp()) \
                OR (state IN ('TRYING', 'CONFIRMING', 'CANCELLING') \
                    AND coalesce(next_attempt_at, '-infinity') <= clock_timestamp()) \
                OR ((refund_state = 'PENDING' \
                     OR (state = 'EXPIRED' AND payment_ref IS NOT NULL AND refund_id IS NULL)) \
                    AND coalesce(next_attempt_at, '-infinity') <= clock_timestamp()) \
                OR id = ANY (ARRAY(SELECT reservation_id FROM extra_payments \
                                   WHERE refund_state = 'PENDING' \
                                     AND next_attempt_at <= clock_timestamp()))) \
            ORDER BY coalesce(next_attempt_at, expires_at) \
            LIMIT $3 \
            FOR UPDATE SKIP LOCKED) \
         UPDATE reservations r SET \
            lease_owner = $1, \
            lease_until = clock_timestamp() + $2 * interval '1 millisecond' \
         FROM due WHERE r.id = due.id \
         RETURNING r.id, due.lapsed_hold",
    )
    .bind(lease.owner)
    .bind(millis(lease.duration))
    .bind(i64::from(limit))
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, lapsed_hold)| Claimed { id, lapsed_hold })
        .collect())
}

/// [`crate::store::Store::renew_lease`].
pub(super) async fn renew_lease(
    pool: &PgPool,
    id: Uuid,
    lease: WorkLease,
) -> Result<bool, StoreError> {
    let renewed = sqlx::query(
        "UPDATE reservations SET lease_until = clock_timestamp() + $3 * interval '1 millisecond' \
         WHERE id = $1 AND lease_owner = $2",
    )
    .bind(id)
    .bind(lease.owner)
    .bind(millis(lease.duration))
    .execute(pool)
    .await?
    .rows_affected();
    Ok(renewed == 1)
}

/// [`crate::store::Store::probe_write`].
pub(super) async fn probe_write(pool: &PgPool) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO write_probe (id, probed_at) VALUES (1, clock_timestamp()) \
         ON CONFLICT (id) DO UPDATE SET probed_at = EXCLUDED.probed_at",
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// [`crate::store::Store::make_due`]: one conditional UPDATE (a new `version`, so watchers
/// notice).
pub(super) async fn make_due(pool: &PgPool, id: Uuid) -> Result<bool, StoreError> {
    let made = sqlx::query(
        "UPDATE reservations SET expires_at = least(expires_at, clock_timestamp()), \
                version = version + 1 \
         WHERE id = $1 AND state IN ('TRYING', 'HELD')",
    )
    .bind(id)
    .execute(pool)
    .await?
    .rows_affected();
    Ok(made == 1)
}

/// [`crate::store::Store::wake_backlog`].
pub(super) async fn wake_backlog(pool: &PgPool, participant: &str) -> Result<u64, StoreError> {
    let woken = sqlx::query(
        "UPDATE reservations r SET next_attempt_at = clock_timestamp() \
         WHERE r.state IN ('CONFIRMING', 'CANCELLING') \
           AND r.next_attempt_at > clock_timestamp() \
           AND EXISTS (SELECT 1 FROM branches b WHERE b.reservation_id = r.id \
                       AND b.participant = $1 AND b.last_error IS NOT NULL)",
    )
    .bind(participant)
    .execute(pool)
    .await?
    .rows_affected();
    Ok(woken)
}

/// [`crate::store::Store::backlog`]: searched by the work indexes, as [`claim_due`] is.
pub(super) async fn backlog(pool: &PgPool) -> Result<i64, StoreError> {
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM reservations \
         WHERE state IN ('TRYING', 'CONFIRMING', 'CANCELLING') \
            OR (state = 'HELD' AND expires_at <= statement_timestamp()) \
            OR refund_state = 'PENDING' \
            OR id = ANY (ARRAY(SELECT reservation_id FROM extra_payments \
                               WHERE refund_state = 'PENDING'))",
    )
    .fetch_one(pool)
    .await?;
    Ok(n)
}

/// [`crate::store::Store::discard`] (its branches go with it: `ON DELETE CASCADE`).
pub(super) async fn discard(
    pool: &PgPool,
    id: Uuid,
    lease_owner: Uuid,
) -> Result<bool, StoreError> {
    let deleted = sqlx::query(
        "DELETE FROM reservations WHERE id = $1 \
         AND ((state = 'TRYING' AND lease_owner = $2) OR state = 'REJECTED')",
    )
    .bind(id)
    .bind(lease_owner)
    .execute(pool)
    .await?
    .rows_affected();
    Ok(deleted == 1)
}

/// [`crate::store::Store::oldest_work_age`]: searched by the work indexes, as [`claim_due`] is.
pub(super) async fn oldest_work_age(pool: &PgPool) -> Result<std::time::Duration, StoreError> {
    let seconds: Option<f64> = sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM clock_timestamp() - least( \
             (SELECT min(CASE WHEN state = 'HELD' THEN expires_at ELSE updated_at END) \
              FROM reservations \
              WHERE state IN ('TRYING', 'CONFIRMING', 'CANCELLING') \
                 OR (state = 'HELD' AND expires_at <= statement_timestamp()) \
                 OR refund_state = 'PENDING'), \
             (SELECT min(created_at) FROM extra_payments WHERE refund_state = 'PENDING')))::float8",
    )
    .fetch_one(pool)
    .await?;
    Ok(std::time::Duration::from_secs_f64(
        seconds.unwrap_or(0.0).max(0.0),
    ))
}
