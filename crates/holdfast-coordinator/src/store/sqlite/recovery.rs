//! Recovery work on SQLite: sweeps claim due reservations (further payments' refunds included)
//! with leases (under the write lock the pick and the claim are one atomic step; the claim
//! changes no state, a lapsed hold's driver expires it), drivers renew their leases, a
//! participant that answers again has its backlog woken, and the backlog is counted.

use sqlx::Sqlite;
use sqlx::sqlite::SqlitePool;
use uuid::Uuid;

use super::rows::micros;
use crate::store::sql::ReservationSql;
use crate::store::{Claimed, StoreError, WorkLease};

/// Rows whose state keeps them in `reservations_open`. SQLite uses a partial index only when
/// the query repeats its `WHERE` term, so each arm below that searches it names it whole.
macro_rules! open_states {
    () => {
        "state IN ('TRYING', 'HELD', 'CONFIRMING', 'CANCELLING')"
    };
}

/// The sweep's pick: reservations due for work, soonest first, at most `?1`. One arm per
/// kind of work, each searching an index of its own (`reservations_open` by state and, for
/// holds, expiry; `reservations_payment_work`; the primary key for the further payments'
/// ids), so a pick costs what is due, not the table; as one OR of them, SQLite scanned every
/// row, four times a second, on the writer's thread (`tests/store`
/// `plans::the_sweep_and_the_work_gauges_search_indexes_on_sqlite`).
pub const CLAIM_DUE_PICK: &str = concat!(
    "SELECT id, state FROM ( \
        SELECT id, state, next_attempt_at, expires_at, lease_until FROM reservations \
        WHERE ",
    open_states!(),
    " AND state = 'HELD' AND expires_at <= ",
    sqlite_now_us!(),
    " UNION \
        SELECT id, state, next_attempt_at, expires_at, lease_until FROM reservations \
        WHERE ",
    open_states!(),
    " AND state <> 'HELD' AND coalesce(next_attempt_at, -9223372036854775807) <= ",
    sqlite_now_us!(),
    " UNION \
        SELECT id, state, next_attempt_at, expires_at, lease_until FROM reservations \
        WHERE (refund_state = 'PENDING' \
               OR (state = 'EXPIRED' AND payment_ref IS NOT NULL AND refund_id IS NULL)) \
          AND coalesce(next_attempt_at, -9223372036854775807) <= ",
    sqlite_now_us!(),
    " UNION \
        SELECT id, state, next_attempt_at, expires_at, lease_until FROM reservations \
        WHERE id IN (SELECT reservation_id FROM extra_payments \
                     WHERE refund_state = 'PENDING' AND next_attempt_at <= ",
    sqlite_now_us!(),
    ")) WHERE lease_until IS NULL OR lease_until < ",
    sqlite_now_us!(),
    " ORDER BY coalesce(next_attempt_at, expires_at) LIMIT ?1"
);

/// [`crate::store::Store::claim_due`].
pub(super) async fn claim_due(
    pool: &SqlitePool,
    lease: WorkLease,
    limit: u32,
) -> Result<Vec<Claimed>, StoreError> {
    // Under the write lock the pick and the claim are one atomic step: no other instance
    // can claim (or decide on) a row in between, which is what FOR UPDATE SKIP LOCKED gives
    // PostgreSQL. The claim only leases: a lapsed hold is claimed as it is, `HELD`, and
    // expired by its driver (`Store::expire_lapsed_hold`, the one write of an expiry).
    let mut tx = Sqlite::begin_write(pool).await?;
    let due: Vec<(Uuid, String)> = sqlx::query_as(CLAIM_DUE_PICK)
        .bind(i64::from(limit))
        .fetch_all(&mut *tx)
        .await?;
    let mut claimed = Vec::with_capacity(due.len());
    for (id, state) in due {
        let lapsed_hold = sqlx::query_scalar::<_, bool>(concat!(
            "UPDATE reservations SET lease_owner = ?2, lease_until = ",
            sqlite_now_us!(),
            " + ?3 WHERE id = ?1 AND state = ?4 \
             RETURNING state = 'HELD' AND expires_at <= ",
            sqlite_now_us!()
        ))
        .bind(id)
        .bind(lease.owner)
        .bind(micros(lease.duration))
        .bind(&state)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(lapsed_hold) = lapsed_hold {
            claimed.push(Claimed { id, lapsed_hold });
        }
    }
    tx.commit().await?;
    Ok(claimed)
}

/// Runs `statement` (its binds added) as a write transaction of its own, which shares its
/// group's COMMIT; answers how many rows it changed.
pub(super) async fn write_one<'q>(
    pool: &SqlitePool,
    statement: sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments>,
) -> Result<u64, StoreError> {
    let mut tx = Sqlite::begin_write(pool).await?;
    let changed = statement.execute(&mut *tx).await?.rows_affected();
    tx.commit().await?;
    Ok(changed)
}

/// [`crate::store::Store::make_due`]: one conditional UPDATE (a new `version`, so watchers
/// notice).
pub(super) async fn make_due(pool: &SqlitePool, id: Uuid) -> Result<bool, StoreError> {
    let statement = sqlx::query(concat!(
        "UPDATE reservations SET expires_at = min(expires_at, ",
        sqlite_now_us!(),
        "), version = version + 1 WHERE id = ?1 AND state IN ('TRYING', 'HELD')"
    ));
    Ok(write_one(pool, statement.bind(id)).await? == 1)
}

/// [`crate::store::Store::probe_write`].
pub(super) async fn probe_write(pool: &SqlitePool) -> Result<(), StoreError> {
    let statement = sqlx::query(concat!(
        "INSERT INTO write_probe (id, probed_at) VALUES (1, ",
        sqlite_now_us!(),
        ") ON CONFLICT (id) DO UPDATE SET probed_at = excluded.probed_at"
    ));
    write_one(pool, statement).await?;
    Ok(())
}

/// [`crate::store::Store::renew_lease`].
pub(super) async fn renew_lease(
    pool: &SqlitePool,
    id: Uuid,
    lease: WorkLease,
) -> Result<bool, StoreError> {
    let statement = sqlx::query(concat!(
        "UPDATE reservations SET lease_until = ",
        sqlite_now_us!(),
        " + ?3 WHERE id = ?1 AND lease_owner = ?2"
    ));
    let statement = statement
        .bind(id)
        .bind(lease.owner)
        .bind(micros(lease.duration));
    Ok(write_one(pool, statement).await? == 1)
}

/// [`crate::store::Store::wake_backlog`].
pub(super) async fn wake_backlog(pool: &SqlitePool, participant: &str) -> Result<u64, StoreError> {
    let statement = sqlx::query(concat!(
        "UPDATE reservations SET next_attempt_at = ",
        sqlite_now_us!(),
        " WHERE state IN ('CONFIRMING', 'CANCELLING') \
           AND next_attempt_at > ",
        sqlite_now_us!(),
        " AND EXISTS (SELECT 1 FROM branches b WHERE b.reservation_id = reservations.id \
                       AND b.participant = ?1 AND b.last_error IS NOT NULL)"
    ));
    write_one(pool, statement.bind(participant)).await
}

/// The backlog: reservations with work outstanding, one arm per kind of work, each searching
/// an index of its own (as [`CLAIM_DUE_PICK`]).
pub const BACKLOG_COUNT: &str = concat!(
    "SELECT count(*) FROM ( \
        SELECT id FROM reservations WHERE ",
    open_states!(),
    " AND state <> 'HELD' \
        UNION SELECT id FROM reservations WHERE ",
    open_states!(),
    " AND state = 'HELD' AND expires_at <= ",
    sqlite_now_us!(),
    " UNION SELECT id FROM reservations WHERE refund_state = 'PENDING' \
        UNION SELECT id FROM reservations \
        WHERE id IN (SELECT reservation_id FROM extra_payments WHERE refund_state = 'PENDING'))"
);

/// [`crate::store::Store::backlog`].
pub(super) async fn backlog(pool: &SqlitePool) -> Result<i64, StoreError> {
    let n: i64 = sqlx::query_scalar(BACKLOG_COUNT).fetch_one(pool).await?;
    Ok(n)
}

/// [`crate::store::Store::discard`] (its branches go with it: `ON DELETE CASCADE`).
pub(super) async fn discard(
    pool: &SqlitePool,
    id: Uuid,
    lease_owner: Uuid,
) -> Result<bool, StoreError> {
    let statement = sqlx::query(
        "DELETE FROM reservations WHERE id = ?1 \
         AND ((state = 'TRYING' AND lease_owner = ?2) OR state = 'REJECTED')",
    );
    Ok(write_one(pool, statement.bind(id).bind(lease_owner)).await? == 1)
}

/// How long ago the oldest outstanding work came due, in microseconds: per arm as in
/// [`BACKLOG_COUNT`], then the further payments' refunds. min() of two values ignoring NULLs:
/// coalesce each with the other.
pub const OLDEST_WORK_AGE: &str = concat!(
    "WITH r AS (SELECT min(t) AS t FROM ( \
                SELECT updated_at AS t FROM reservations WHERE ",
    open_states!(),
    " AND state <> 'HELD' \
                UNION ALL SELECT expires_at FROM reservations WHERE ",
    open_states!(),
    " AND state = 'HELD' AND expires_at <= ",
    sqlite_now_us!(),
    " UNION ALL SELECT CASE WHEN state = 'HELD' THEN expires_at ELSE updated_at END \
                FROM reservations WHERE refund_state = 'PENDING')), \
          e AS (SELECT min(created_at) AS t FROM extra_payments WHERE refund_state = 'PENDING') \
     SELECT ",
    sqlite_now_us!(),
    " - min(coalesce(r.t, e.t), coalesce(e.t, r.t)) FROM r, e"
);

/// [`crate::store::Store::oldest_work_age`].
pub(super) async fn oldest_work_age(pool: &SqlitePool) -> Result<std::time::Duration, StoreError> {
    let micros: Option<i64> = sqlx::query_scalar(OLDEST_WORK_AGE).fetch_one(pool).await?;
    Ok(std::time::Duration::from_micros(
        u64::try_from(micros.unwrap_or(0)).unwrap_or(0),
    ))
}
