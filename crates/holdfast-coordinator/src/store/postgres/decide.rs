//! PostgreSQL's statements for the shared decision, retake and outcome flows
//! ([`ReservationSql`]): row locks with `FOR UPDATE`, every "now" `clock_timestamp()`.
//! A Confirm or Cancel is `executor.rs`'s statement, which takes the decider's lease as it
//! writes (one statement fewer).

use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::PgConnection;
use sqlx::{Pool, Postgres, Transaction};
use uuid::Uuid;

use super::executor;
use super::rows::{self, millis};
use crate::domain::policy::Backoff;
use crate::domain::validate::RequestId;
use crate::domain::{Payment, Reservation};
use crate::store::sql::LeaveHeld;
use crate::store::sql::{Applied, ReservationSql};
use crate::store::{BranchReport, RefundAnswer, StoreError, WorkLease};

/// The reports as parallel arrays, for `UNNEST`.
fn report_columns(reports: &[BranchReport]) -> (Vec<Uuid>, Vec<&str>, Vec<Option<&str>>) {
    (
        reports.iter().map(|r| r.branch_id).collect(),
        reports.iter().map(|r| r.state.as_str()).collect(),
        reports.iter().map(|r| r.error.as_deref()).collect(),
    )
}

/// A conditional write's row count as a yes/no.
fn one_row(result: sqlx::postgres::PgQueryResult) -> bool {
    result.rows_affected() == 1
}

#[async_trait]
impl ReservationSql for Postgres {
    type Pool = Pool<Postgres>;
    type Connection = PgConnection;
    type Write = Transaction<'static, Postgres>;

    async fn begin_write(pool: &Pool<Postgres>) -> Result<Self::Write, sqlx::Error> {
        pool.begin().await
    }

    async fn load(conn: &mut PgConnection, id: Uuid) -> Result<Option<Reservation>, StoreError> {
        rows::load(conn, id, false).await
    }

    async fn load_locked(
        conn: &mut PgConnection,
        id: Uuid,
    ) -> Result<Option<Reservation>, StoreError> {
        rows::load(conn, id, true).await
    }

    async fn repeats_last_extend(
        conn: &mut PgConnection,
        id: Uuid,
        request_id: &RequestId,
    ) -> Result<bool, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT coalesce(last_extend_request_id = $2, false) FROM reservations WHERE id = $1",
        )
        .bind(id)
        .bind(request_id.as_str())
        .fetch_one(&mut *conn)
        .await?)
    }

    async fn leave_held(conn: &mut PgConnection, write: &LeaveHeld) -> Result<Applied, StoreError> {
        // The same statement the unlocked path runs; it takes the lease as it writes.
        let moved = executor::leave_held(conn, &[write]).await?;
        Ok(if moved.contains_key(&write.id) {
            Applied::Written {
                leased: true,
                read_back: None,
            }
        } else {
            Applied::Missed
        })
    }

    async fn honor_late(conn: &mut PgConnection, id: Uuid) -> Result<bool, StoreError> {
        Ok(one_row(
            sqlx::query(
                "UPDATE reservations SET state = 'CONFIRMING', late_payment_honored = true, \
                 version = version + 1, updated_at = clock_timestamp() \
                 WHERE id = $1 AND state = 'HELD'",
            )
            .bind(id)
            .execute(&mut *conn)
            .await?,
        ))
    }

    async fn expire_hold(conn: &mut PgConnection, id: Uuid) -> Result<bool, StoreError> {
        Ok(one_row(
            sqlx::query(
                "UPDATE reservations SET state = 'CANCELLING', release_outcome = 'EXPIRED', \
                 version = version + 1, updated_at = clock_timestamp() \
                 WHERE id = $1 AND state = 'HELD' AND expires_at <= clock_timestamp()",
            )
            .bind(id)
            .execute(&mut *conn)
            .await?,
        ))
    }

    async fn record_payment(
        conn: &mut PgConnection,
        id: Uuid,
        p: &Payment,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE reservations SET payment_participant = $2, payment_ref = $3, \
             payment_amount_minor = $4, payment_currency = $5 \
             WHERE id = $1 AND payment_ref IS NULL",
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
        conn: &mut PgConnection,
        id: Uuid,
        reason: &str,
    ) -> Result<bool, StoreError> {
        Ok(one_row(
            sqlx::query(
                "UPDATE reservations SET refund_id = $2, refund_state = 'PENDING', refund_reason = $3, \
                 next_attempt_at = clock_timestamp(), version = version + 1, updated_at = clock_timestamp() \
                 WHERE id = $1 AND refund_id IS NULL AND payment_ref IS NOT NULL",
            )
            .bind(id)
            .bind(Uuid::new_v4())
            .bind(reason)
            .execute(&mut *conn)
            .await?,
        ))
    }

    async fn mark_retake(conn: &mut PgConnection, id: Uuid) -> Result<bool, StoreError> {
        Ok(one_row(
            sqlx::query(
                "UPDATE reservations SET version = version + 1, updated_at = clock_timestamp() \
                 WHERE id = $1 AND state = 'EXPIRED' AND payment_ref IS NULL",
            )
            .bind(id)
            .execute(&mut *conn)
            .await?,
        ))
    }

    async fn extend_held(
        conn: &mut PgConnection,
        id: Uuid,
        by: Duration,
        request_id: Option<&RequestId>,
    ) -> Result<bool, StoreError> {
        Ok(one_row(
            sqlx::query(
                "UPDATE reservations SET expires_at = expires_at + $2 * interval '1 millisecond', \
                 extensions_used = extensions_used + 1, version = version + 1, \
                 updated_at = clock_timestamp(), last_extend_request_id = $3 \
                 WHERE id = $1 AND state = 'HELD' AND clock_timestamp() < expires_at",
            )
            .bind(id)
            .bind(millis(by))
            .bind(request_id.map(RequestId::as_str))
            .execute(&mut *conn)
            .await?,
        ))
    }

    async fn take_lease(
        conn: &mut PgConnection,
        id: Uuid,
        lease: WorkLease,
    ) -> Result<bool, StoreError> {
        Ok(one_row(
            sqlx::query(
                "UPDATE reservations SET lease_owner = $2, \
                 lease_until = clock_timestamp() + $3 * interval '1 millisecond' \
                 WHERE id = $1 AND (lease_owner IS NULL OR lease_owner = $2 \
                                    OR lease_until IS NULL OR lease_until < clock_timestamp())",
            )
            .bind(id)
            .bind(lease.owner)
            .bind(millis(lease.duration))
            .execute(&mut *conn)
            .await?,
        ))
    }

    async fn apply_reports(
        conn: &mut PgConnection,
        id: Uuid,
        reports: &[BranchReport],
    ) -> Result<(), StoreError> {
        if reports.is_empty() {
            return Ok(());
        }
        let (ids, states, errors) = report_columns(reports);
        sqlx::query(
            "UPDATE branches b \
             SET state = u.state, attempts = b.attempts + 1, last_error = u.error \
             FROM UNNEST($2::uuid[], $3::text[], $4::text[]) AS u(branch_id, state, error) \
             WHERE b.reservation_id = $1 AND b.branch_id = u.branch_id",
        )
        .bind(id)
        .bind(&ids)
        .bind(&states)
        .bind(&errors)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    async fn renew_generation(
        conn: &mut PgConnection,
        id: Uuid,
    ) -> Result<Option<i32>, StoreError> {
        Ok(sqlx::query_scalar(
            "UPDATE reservations SET generation = generation + 1, \
             expires_at = clock_timestamp() + ttl_ms * interval '1 millisecond', \
             version = version + 1, updated_at = clock_timestamp() \
             WHERE id = $1 AND state = 'EXPIRED' RETURNING generation",
        )
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?)
    }

    async fn insert_retake_branches(
        conn: &mut PgConnection,
        id: Uuid,
        generation: i32,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "WITH fresh AS ( \
                SELECT participant, gen_random_uuid() AS branch_id FROM branches \
                WHERE reservation_id = $1 AND generation = $2 - 1 GROUP BY participant) \
             INSERT INTO branches (reservation_id, generation, position, branch_id, participant, \
                                   resource, quantity, during_start, during_end, state) \
             SELECT b.reservation_id, $2, b.position, f.branch_id, b.participant, b.resource, \
                    b.quantity, b.during_start, b.during_end, 'PENDING' \
             FROM branches b JOIN fresh f USING (participant) \
             WHERE b.reservation_id = $1 AND b.generation = $2 - 1",
        )
        .bind(id)
        .bind(generation)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    async fn leave_queue(
        conn: &mut PgConnection,
        id: Uuid,
        reason: Option<&str>,
    ) -> Result<bool, StoreError> {
        Ok(one_row(
            sqlx::query(
                "UPDATE reservations SET state = 'CANCELLED', cancel_reason = $2, \
                 version = version + 1, updated_at = clock_timestamp() \
                 WHERE id = $1 AND state = 'QUEUED'",
            )
            .bind(id)
            .bind(reason)
            .execute(&mut *conn)
            .await?,
        ))
    }

    async fn honor_retake(conn: &mut PgConnection, id: Uuid) -> Result<bool, StoreError> {
        Ok(one_row(
            sqlx::query(
                "UPDATE reservations SET state = 'CONFIRMING', late_payment_honored = true, \
                 version = version + 1, updated_at = clock_timestamp() \
                 WHERE id = $1 AND state = 'EXPIRED' AND refund_id IS NULL",
            )
            .bind(id)
            .execute(&mut *conn)
            .await?,
        ))
    }

    async fn release_retake(conn: &mut PgConnection, id: Uuid) -> Result<bool, StoreError> {
        Ok(one_row(
            sqlx::query(
                "UPDATE reservations SET state = 'CANCELLING', release_outcome = 'EXPIRED', \
                 version = version + 1, updated_at = clock_timestamp() \
                 WHERE id = $1 AND state = 'EXPIRED' AND refund_id IS NULL",
            )
            .bind(id)
            .execute(&mut *conn)
            .await?,
        ))
    }

    async fn record_refund_attempt(
        conn: &mut PgConnection,
        id: Uuid,
        answer: &RefundAnswer,
        backoff: Backoff,
    ) -> Result<(), StoreError> {
        // $2: the state the refund settles on (NULL: still pending, retried by the backoff).
        sqlx::query(
            "UPDATE reservations SET \
               refund_state = coalesce($2::text, refund_state), \
               refund_failure = coalesce($5::text, refund_failure), \
               version = version + CASE WHEN $2::text IS NOT NULL THEN 1 ELSE 0 END, \
               lease_owner = NULL, lease_until = NULL, \
               next_attempt_at = CASE WHEN $2::text IS NOT NULL THEN NULL ELSE clock_timestamp() + \
                   least($4::float8, $3::float8 * power(2, least(recovery_attempts, 30))) \
                   * (0.5 + random() / 2) * interval '1 millisecond' END, \
               recovery_attempts = CASE WHEN $2::text IS NOT NULL THEN recovery_attempts \
                   ELSE recovery_attempts + 1 END \
             WHERE id = $1 AND refund_state = 'PENDING'",
        )
        .bind(id)
        .bind(answer.settles_on())
        .bind(millis(backoff.base) as f64)
        .bind(millis(backoff.cap) as f64)
        .bind(answer.failure())
        .execute(&mut *conn)
        .await?;
        Ok(())
    }
}
