//! SQLite's statements for the shared decision, retake and outcome flows
//! ([`ReservationSql`]). Every write runs inside `BEGIN IMMEDIATE`: the database write lock
//! stands in for PostgreSQL's row locks, so "locking" a row is reading it. A decision that
//! leaves `HELD` takes its lease in the same statement (`HELD` rows carry none), as on
//! PostgreSQL; the other decisions that start a fan-out take it by its own (`take_lease`).

use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::SqliteConnection;
use sqlx::{Pool, Sqlite};
use uuid::Uuid;

use super::rows::{self, micros};
use crate::domain::policy::Backoff;
use crate::domain::validate::RequestId;
use crate::domain::{Payment, Reservation, State};
use crate::store::sql::LeaveHeld;
use crate::store::sql::{Applied, ReservationSql};
use crate::store::{BranchReport, RefundAnswer, StoreError, WorkLease};

/// A conditional write's row count as a yes/no.
fn one_row(result: sqlx::sqlite::SqliteQueryResult) -> bool {
    result.rows_affected() == 1
}

/// The one statement of a decided move out of `HELD` ([`LeaveHeld`]): `?1` id, `?2` the
/// version judged (NULL: under the write lock), `?3` the state it moves to, `?4`/`?5` a
/// Cancel's release outcome and reason, `?6`-`?9` a Confirm's payment, `?10`/`?11` the lease's
/// owner and microseconds. Refused when the payment is another reservation's further payment.
macro_rules! leave_held_sql {
    () => {
        concat!(
            "UPDATE reservations SET state = ?3, version = version + 1, \
                 release_outcome = CASE WHEN ?3 = 'CONFIRMING' THEN release_outcome ELSE ?4 END, \
                 cancel_reason = CASE WHEN ?3 = 'CONFIRMING' THEN cancel_reason ELSE ?5 END, \
                 payment_participant = coalesce(payment_participant, ?6), \
                 payment_ref = coalesce(payment_ref, ?7), \
                 payment_amount_minor = coalesce(payment_amount_minor, ?8), \
                 payment_currency = coalesce(payment_currency, ?9), \
                 lease_owner = ?10, lease_until = ",
            sqlite_now_us!(),
            " + ?11, updated_at = ",
            sqlite_now_us!(),
            " WHERE id = ?1 AND (?2 IS NULL OR version = ?2) AND state = 'HELD' AND ",
            sqlite_now_us!(),
            " < expires_at \
               AND (?7 IS NULL OR NOT EXISTS ( \
                    SELECT 1 FROM extra_payments x \
                    WHERE x.payment_participant = ?6 AND x.payment_ref = ?7)) \
             RETURNING ",
            reservation_columns!()
        )
    };
}

/// [`leave_held_sql!`] inside a write begun already (the locked flow).
const LEAVE_HELD: &str = leave_held_sql!();

/// [`leave_held_sql!`] as a write's first query (the decision without a lock).
pub(super) const LEAVE_HELD_FIRST: crate::db::FirstQuery = sqlite_first_query!(leave_held_sql!());

/// Runs `sql` (a form of [`leave_held_sql!`]) for `write`: the row moved, or `None`.
pub(super) async fn run_leave_held(
    conn: &mut SqliteConnection,
    sql: &'static str,
    write: &LeaveHeld,
) -> Result<Option<rows::ReservationRow>, sqlx::Error> {
    let payment = write.payment.as_ref();
    sqlx::query_as::<_, rows::ReservationRow>(sql)
        .bind(write.id)
        .bind(write.guard.version())
        .bind(write.to.as_str())
        .bind(write.release_outcome.map(State::as_str))
        .bind(write.cancel_reason.as_deref())
        .bind(payment.map(|p| p.participant.as_str()))
        .bind(payment.map(|p| p.payment_ref.as_str()))
        .bind(payment.map(|p| p.amount_minor))
        .bind(payment.map(|p| p.currency.as_str()))
        .bind(write.lease.owner)
        .bind(micros(write.lease.duration))
        .fetch_optional(&mut *conn)
        .await
}

#[async_trait]
impl ReservationSql for Sqlite {
    type Pool = Pool<Sqlite>;
    type Connection = SqliteConnection;
    type Write = crate::db::SqliteWrite;

    async fn begin_write(pool: &Pool<Sqlite>) -> Result<Self::Write, sqlx::Error> {
        crate::db::begin_sqlite_write(pool).await
    }

    async fn load(
        conn: &mut SqliteConnection,
        id: Uuid,
    ) -> Result<Option<Reservation>, StoreError> {
        rows::load(conn, id).await
    }

    async fn load_locked(
        conn: &mut SqliteConnection,
        id: Uuid,
    ) -> Result<Option<Reservation>, StoreError> {
        // The write lock stands in for PostgreSQL's row lock: nothing changes the row between
        // this read and the conditional UPDATE that follows.
        rows::load(conn, id).await
    }

    async fn repeats_last_extend(
        conn: &mut SqliteConnection,
        id: Uuid,
        request_id: &RequestId,
    ) -> Result<bool, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT coalesce(last_extend_request_id = ?2, 0) FROM reservations WHERE id = ?1",
        )
        .bind(id)
        .bind(request_id.as_str())
        .fetch_one(&mut *conn)
        .await?)
    }

    async fn leave_held(
        conn: &mut SqliteConnection,
        write: &LeaveHeld,
    ) -> Result<Applied, StoreError> {
        let left = run_leave_held(conn, LEAVE_HELD, write).await?;
        Ok(match left {
            Some(row) => Applied::Written {
                leased: true,
                read_back: Some(Box::new(row.into_domain()?)),
            },
            None => Applied::Missed,
        })
    }

    async fn honor_late(conn: &mut SqliteConnection, id: Uuid) -> Result<bool, StoreError> {
        Ok(one_row(
            sqlx::query(concat!(
                "UPDATE reservations SET state = 'CONFIRMING', late_payment_honored = 1, \
                 version = version + 1, updated_at = ",
                sqlite_now_us!(),
                " WHERE id = ?1 AND state = 'HELD'"
            ))
            .bind(id)
            .execute(&mut *conn)
            .await?,
        ))
    }

    async fn expire_hold(conn: &mut SqliteConnection, id: Uuid) -> Result<bool, StoreError> {
        Ok(one_row(
            sqlx::query(concat!(
                "UPDATE reservations SET state = 'CANCELLING', release_outcome = 'EXPIRED', \
                 version = version + 1, updated_at = ",
                sqlite_now_us!(),
                " WHERE id = ?1 AND state = 'HELD' AND expires_at <= ",
                sqlite_now_us!()
            ))
            .bind(id)
            .execute(&mut *conn)
            .await?,
        ))
    }

    async fn record_payment(
        conn: &mut SqliteConnection,
        id: Uuid,
        p: &Payment,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE reservations SET payment_participant = ?2, payment_ref = ?3, \
             payment_amount_minor = ?4, payment_currency = ?5 \
             WHERE id = ?1 AND payment_ref IS NULL",
        )
        .bind(id)
        .bind(&p.participant)
        .bind(&p.payment_ref)
        .bind(p.amount_minor)
        .bind(&p.currency)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    async fn record_refund(
        conn: &mut SqliteConnection,
        id: Uuid,
        reason: &str,
    ) -> Result<bool, StoreError> {
        Ok(one_row(
            sqlx::query(concat!(
                "UPDATE reservations SET refund_id = ?2, refund_state = 'PENDING', refund_reason = ?3, \
                 next_attempt_at = ",
                sqlite_now_us!(),
                ", version = version + 1, updated_at = ",
                sqlite_now_us!(),
                " WHERE id = ?1 AND refund_id IS NULL AND payment_ref IS NOT NULL"
            ))
            .bind(id)
            .bind(Uuid::new_v4())
            .bind(reason)
            .execute(&mut *conn)
            .await?,
        ))
    }

    async fn mark_retake(conn: &mut SqliteConnection, id: Uuid) -> Result<bool, StoreError> {
        Ok(one_row(
            sqlx::query(concat!(
                "UPDATE reservations SET version = version + 1, updated_at = ",
                sqlite_now_us!(),
                " WHERE id = ?1 AND state = 'EXPIRED' AND payment_ref IS NULL"
            ))
            .bind(id)
            .execute(&mut *conn)
            .await?,
        ))
    }

    async fn extend_held(
        conn: &mut SqliteConnection,
        id: Uuid,
        by: Duration,
        request_id: Option<&RequestId>,
    ) -> Result<bool, StoreError> {
        Ok(one_row(
            sqlx::query(concat!(
                "UPDATE reservations SET expires_at = expires_at + ?2, \
                 extensions_used = extensions_used + 1, version = version + 1, \
                 last_extend_request_id = ?3, updated_at = ",
                sqlite_now_us!(),
                " WHERE id = ?1 AND state = 'HELD' AND ",
                sqlite_now_us!(),
                " < expires_at"
            ))
            .bind(id)
            .bind(micros(by))
            .bind(request_id.map(RequestId::as_str))
            .execute(&mut *conn)
            .await?,
        ))
    }

    async fn take_lease(
        conn: &mut SqliteConnection,
        id: Uuid,
        lease: WorkLease,
    ) -> Result<bool, StoreError> {
        Ok(one_row(
            sqlx::query(concat!(
                "UPDATE reservations SET lease_owner = ?2, lease_until = ",
                sqlite_now_us!(),
                " + ?3 WHERE id = ?1 AND (lease_owner IS NULL OR lease_owner = ?2 \
                                           OR lease_until IS NULL OR lease_until < ",
                sqlite_now_us!(),
                ")"
            ))
            .bind(id)
            .bind(lease.owner)
            .bind(micros(lease.duration))
            .execute(&mut *conn)
            .await?,
        ))
    }

    async fn apply_reports(
        conn: &mut SqliteConnection,
        id: Uuid,
        reports: &[BranchReport],
    ) -> Result<(), StoreError> {
        super::answers::record_reports(conn, id, reports).await
    }

    async fn renew_generation(
        conn: &mut SqliteConnection,
        id: Uuid,
    ) -> Result<Option<i32>, StoreError> {
        Ok(sqlx::query_scalar(concat!(
            "UPDATE reservations SET generation = generation + 1, \
             expires_at = ",
            sqlite_now_us!(),
            " + ttl_ms * 1000, version = version + 1, updated_at = ",
            sqlite_now_us!(),
            " WHERE id = ?1 AND state = 'EXPIRED' RETURNING generation"
        ))
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?)
    }

    async fn insert_retake_branches(
        conn: &mut SqliteConnection,
        id: Uuid,
        generation: i32,
    ) -> Result<(), StoreError> {
        let participants: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT participant FROM branches WHERE reservation_id = ?1 AND generation = ?2",
        )
        .bind(id)
        .bind(generation - 1)
        .fetch_all(&mut *conn)
        .await?;
        for participant in participants {
            sqlx::query(
                "INSERT INTO branches (reservation_id, generation, position, branch_id, participant, \
                                       resource, quantity, during_start, during_end, state) \
                 SELECT reservation_id, ?2, position, ?3, participant, resource, quantity, \
                        during_start, during_end, 'PENDING' \
                 FROM branches WHERE reservation_id = ?1 AND generation = ?2 - 1 AND participant = ?4",
            )
            .bind(id)
            .bind(generation)
            .bind(Uuid::new_v4())
            .bind(&participant)
            .execute(&mut *conn)
            .await?;
        }
        Ok(())
    }

    async fn leave_queue(
        conn: &mut SqliteConnection,
        id: Uuid,
        reason: Option<&str>,
    ) -> Result<bool, StoreError> {
        Ok(one_row(
            sqlx::query(concat!(
                "UPDATE reservations SET state = 'CANCELLED', cancel_reason = ?2, \
                 version = version + 1, updated_at = ",
                sqlite_now_us!(),
                " WHERE id = ?1 AND state = 'QUEUED'"
            ))
            .bind(id)
            .bind(reason)
            .execute(&mut *conn)
            .await?,
        ))
    }

    async fn honor_retake(conn: &mut SqliteConnection, id: Uuid) -> Result<bool, StoreError> {
        Ok(one_row(
            sqlx::query(concat!(
                "UPDATE reservations SET state = 'CONFIRMING', late_payment_honored = 1, \
                 version = version + 1, updated_at = ",
                sqlite_now_us!(),
                " WHERE id = ?1 AND state = 'EXPIRED' AND refund_id IS NULL"
            ))
            .bind(id)
            .execute(&mut *conn)
            .await?,
        ))
    }

    async fn release_retake(conn: &mut SqliteConnection, id: Uuid) -> Result<bool, StoreError> {
        Ok(one_row(
            sqlx::query(concat!(
                "UPDATE reservations SET state = 'CANCELLING', release_outcome = 'EXPIRED', \
                 version = version + 1, updated_at = ",
                sqlite_now_us!(),
                " WHERE id = ?1 AND state = 'EXPIRED' AND refund_id IS NULL"
            ))
            .bind(id)
            .execute(&mut *conn)
            .await?,
        ))
    }

    async fn record_refund_attempt(
        conn: &mut SqliteConnection,
        id: Uuid,
        answer: &RefundAnswer,
        backoff: Backoff,
    ) -> Result<(), StoreError> {
        // ?2: the state the refund settles on (NULL: still pending, retried by the backoff).
        sqlx::query(concat!(
            "UPDATE reservations SET \
               refund_state = coalesce(?2, refund_state), \
               refund_failure = coalesce(?5, refund_failure), \
               version = version + CASE WHEN ?2 IS NOT NULL THEN 1 ELSE 0 END, \
               lease_owner = NULL, lease_until = NULL, ",
            backoff_next_attempt!("?2 IS NOT NULL", "?3", "?4"),
            " WHERE id = ?1 AND refund_state = 'PENDING'"
        ))
        .bind(id)
        .bind(answer.settles_on())
        .bind(micros(backoff.base) as f64)
        .bind(micros(backoff.cap) as f64)
        .bind(answer.failure())
        .execute(&mut *conn)
        .await?;
        Ok(())
    }
}
