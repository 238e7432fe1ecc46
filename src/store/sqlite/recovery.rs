//! Recovery work on SQLite: sweeps claim due reservations (further payments' refunds included)
//! with leases (under the write lock the pick and the claim are one atomic step; expiry is
//! decided in the claiming UPDATE), drivers renew their leases, a participant that answers
//! again has its backlog woken, and the backlog is counted.

use sqlx::Sqlite;
use sqlx::sqlite::SqlitePool;
use uuid::Uuid;

use super::rows::micros;
use crate::store::sql::ReservationSql;
use crate::store::{Claimed, StoreError, WorkLease};

/// [`crate::store::Store::claim_due`].
pub(super) async fn claim_due(
    pool: &SqlitePool,
    lease: WorkLease,
    limit: u32,
) -> Result<Vec<Claimed>, StoreError> {
    // Under the write lock the pick and the claim are one atomic step: no other instance
    // can claim (or decide on) a row in between, which is what FOR UPDATE SKIP LOCKED gives
    // PostgreSQL. Expiry is decided here, by the database clock, in the claiming UPDATE.
    let mut tx = Sqlite::begin_write(pool).await?;
    let due: Vec<(Uuid, String)> = sqlx::query_as(concat!(
        "SELECT id, state FROM reservations \
         WHERE (lease_until IS NULL OR lease_until < ",
        sqlite_now_us!(),
        ") AND ((state IN ('TRYING', 'HELD', 'CONFIRMING', 'CANCELLING') \
                AND CASE state \
                      WHEN 'HELD' THEN expires_at <= ",
        sqlite_now_us!(),
        "         ELSE coalesce(next_attempt_at, -9223372036854775807) <= ",
        sqlite_now_us!(),
        "       END) \
            OR ((refund_state = 'PENDING' \
                 OR (state = 'EXPIRED' AND payment_ref IS NOT NULL AND refund_id IS NULL)) \
                AND coalesce(next_attempt_at, -9223372036854775807) <= ",
        sqlite_now_us!(),
        ") OR id IN (SELECT reservation_id FROM extra_payments \
                      WHERE refund_state = 'PENDING' AND next_attempt_at <= ",
        sqlite_now_us!(),
        ")) ORDER BY coalesce(next_attempt_at, expires_at) LIMIT ?1"
    ))
    .bind(i64::from(limit))
    .fetch_all(&mut *tx)
    .await?;
    let mut claimed = Vec::with_capacity(due.len());
    for (id, state) in due {
        let expired = sqlx::query_scalar::<_, bool>(concat!(
            "UPDATE reservations SET \
                lease_owner = ?2, \
                lease_until = ",
            sqlite_now_us!(),
            " + ?3, \
                release_outcome = CASE WHEN state = 'HELD' THEN 'EXPIRED' ELSE release_outcome END, \
                version = CASE WHEN state = 'HELD' THEN version + 1 ELSE version END, \
                updated_at = CASE WHEN state = 'HELD' THEN ",
            sqlite_now_us!(),
            " ELSE updated_at END, \
                state = CASE WHEN state = 'HELD' THEN 'CANCELLING' ELSE state END \
             WHERE id = ?1 AND state = ?4 \
               AND (state <> 'HELD' OR expires_at <= ",
            sqlite_now_us!(),
            ") RETURNING ?4 = 'HELD'"
        ))
        .bind(id)
        .bind(lease.owner)
        .bind(micros(lease.duration))
        .bind(&state)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(expired) = expired {
            claimed.push(Claimed { id, expired });
        }
    }
    tx.commit().await?;
    Ok(claimed)
}

/// [`crate::store::Store::renew_lease`].
/// [`crate::store::Store::make_due`]: one conditional UPDATE (a new `version`, so watchers
/// notice).
pub(super) async fn make_due(pool: &SqlitePool, id: Uuid) -> Result<bool, StoreError> {
    let mut tx = Sqlite::begin_write(pool).await?;
    let made = sqlx::query(concat!(
        "UPDATE reservations SET expires_at = min(expires_at, ",
        sqlite_now_us!(),
        "), version = version + 1 WHERE id = ?1 AND state IN ('TRYING', 'HELD')"
    ))
    .bind(id)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    tx.commit().await?;
    Ok(made == 1)
}

pub(super) async fn renew_lease(
    pool: &SqlitePool,
    id: Uuid,
    lease: WorkLease,
) -> Result<bool, StoreError> {
    let mut tx = Sqlite::begin_write(pool).await?;
    let renewed = sqlx::query(concat!(
        "UPDATE reservations SET lease_until = ",
        sqlite_now_us!(),
        " + ?3 WHERE id = ?1 AND lease_owner = ?2"
    ))
    .bind(id)
    .bind(lease.owner)
    .bind(micros(lease.duration))
    .execute(&mut *tx)
    .await?
    .rows_affected();
    tx.commit().await?;
    Ok(renewed == 1)
}

/// [`crate::store::Store::wake_backlog`].
pub(super) async fn wake_backlog(pool: &SqlitePool, participant: &str) -> Result<u64, StoreError> {
    let mut tx = Sqlite::begin_write(pool).await?;
    let woken = sqlx::query(concat!(
        "UPDATE reservations SET next_attempt_at = ",
        sqlite_now_us!(),
        " WHERE state IN ('CONFIRMING', 'CANCELLING') \
           AND next_attempt_at > ",
        sqlite_now_us!(),
        " AND EXISTS (SELECT 1 FROM branches b WHERE b.reservation_id = reservations.id \
                       AND b.participant = ?1 AND b.last_error IS NOT NULL)"
    ))
    .bind(participant)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    tx.commit().await?;
    Ok(woken)
}

/// [`crate::store::Store::backlog`].
pub(super) async fn backlog(pool: &SqlitePool) -> Result<i64, StoreError> {
    let n: i64 = sqlx::query_scalar(concat!(
        "SELECT count(*) FROM reservations \
         WHERE state IN ('TRYING', 'CONFIRMING', 'CANCELLING') \
            OR (state = 'HELD' AND expires_at <= ",
        sqlite_now_us!(),
        ") OR refund_state = 'PENDING' \
         OR id IN (SELECT reservation_id FROM extra_payments WHERE refund_state = 'PENDING')"
    ))
    .fetch_one(pool)
    .await?;
    Ok(n)
}

/// [`crate::store::Store::discard`] (its branches go with it: `ON DELETE CASCADE`).
pub(super) async fn discard(
    pool: &SqlitePool,
    id: Uuid,
    lease_owner: Uuid,
) -> Result<bool, StoreError> {
    let mut tx = Sqlite::begin_write(pool).await?;
    let deleted = sqlx::query(
        "DELETE FROM reservations WHERE id = ?1 \
         AND ((state = 'TRYING' AND lease_owner = ?2) OR state = 'REJECTED')",
    )
    .bind(id)
    .bind(lease_owner)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    tx.commit().await?;
    Ok(deleted == 1)
}

/// [`crate::store::Store::oldest_work_age`].
pub(super) async fn oldest_work_age(pool: &SqlitePool) -> Result<std::time::Duration, StoreError> {
    // min() of two values ignoring NULLs: coalesce each with the other.
    let micros: Option<i64> = sqlx::query_scalar(concat!(
        "WITH r AS (SELECT min(CASE WHEN state = 'HELD' THEN expires_at ELSE updated_at END) AS t \
                    FROM reservations \
                    WHERE state IN ('TRYING', 'CONFIRMING', 'CANCELLING') \
                       OR (state = 'HELD' AND expires_at <= ",
        sqlite_now_us!(),
        ") OR refund_state = 'PENDING'), \
              e AS (SELECT min(created_at) AS t FROM extra_payments WHERE refund_state = 'PENDING') \
         SELECT ",
        sqlite_now_us!(),
        " - min(coalesce(r.t, e.t), coalesce(e.t, r.t)) FROM r, e"
    ))
    .fetch_one(pool)
    .await?;
    Ok(std::time::Duration::from_micros(
        u64::try_from(micros.unwrap_or(0)).unwrap_or(0),
    ))
}
