//! PostgreSQL's statements for payment bindings and further payments ([`PaymentSql`]).

use async_trait::async_trait;
use sqlx::Postgres;
use sqlx::postgres::{PgConnection, PgPool};
use uuid::Uuid;

use super::rows::millis;
use crate::domain::policy::Backoff;
use crate::domain::{ExtraPayment, Payment};
use crate::store::extra::{ExtraRow, extra_payment};
use crate::store::sql::PaymentSql;
use crate::store::{RefundAnswer, StoreError};

#[async_trait]
impl PaymentSql for Postgres {
    async fn payment_owner(
        conn: &mut PgConnection,
        p: &Payment,
    ) -> Result<Option<Uuid>, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT id FROM reservations WHERE payment_participant = $1 AND payment_ref = $2 \
             UNION ALL \
             SELECT reservation_id FROM extra_payments \
             WHERE payment_participant = $1 AND payment_ref = $2 \
             LIMIT 1",
        )
        .bind(&p.participant)
        .bind(&p.payment_ref)
        .fetch_optional(&mut *conn)
        .await?)
    }

    async fn insert_extra_payment(
        conn: &mut PgConnection,
        id: Uuid,
        p: &Payment,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let inserted = sqlx::query(
            "INSERT INTO extra_payments (payment_participant, payment_ref, reservation_id, \
               amount_minor, currency, refund_id, refund_state, refund_reason, next_attempt_at) \
             VALUES ($1, $2, $3, $4, $5, $6, 'PENDING', $7, clock_timestamp()) \
             ON CONFLICT (payment_participant, payment_ref) DO NOTHING",
        )
        .bind(&p.participant)
        .bind(&p.payment_ref)
        .bind(id)
        .bind(p.amount_minor)
        .bind(&p.currency)
        .bind(Uuid::new_v4())
        .bind(reason)
        .execute(&mut *conn)
        .await?;
        Ok(inserted.rows_affected() == 1)
    }

    async fn load_extra_payment(
        conn: &mut PgConnection,
        p: &Payment,
    ) -> Result<Option<(Uuid, ExtraPayment)>, StoreError> {
        let row: Option<ExtraRow> = sqlx::query_as(
            "SELECT reservation_id, payment_participant, payment_ref, amount_minor, currency, \
               refund_id, refund_state, refund_reason, refund_failure \
             FROM extra_payments WHERE payment_participant = $1 AND payment_ref = $2",
        )
        .bind(&p.participant)
        .bind(&p.payment_ref)
        .fetch_optional(&mut *conn)
        .await?;
        row.map(extra_payment).transpose()
    }

    async fn pending_extra_payments(
        conn: &mut PgConnection,
        id: Uuid,
    ) -> Result<Vec<ExtraPayment>, StoreError> {
        let rows: Vec<ExtraRow> = sqlx::query_as(
            "SELECT reservation_id, payment_participant, payment_ref, amount_minor, currency, \
               refund_id, refund_state, refund_reason, refund_failure \
             FROM extra_payments WHERE reservation_id = $1 AND refund_state = 'PENDING' \
             ORDER BY created_at, refund_id",
        )
        .bind(id)
        .fetch_all(&mut *conn)
        .await?;
        rows.into_iter()
            .map(|row| extra_payment(row).map(|(_, extra)| extra))
            .collect()
    }

    async fn record_extra_refund_attempt(
        conn: &mut PgConnection,
        extra: &ExtraPayment,
        answer: &RefundAnswer,
        backoff: Backoff,
    ) -> Result<(), StoreError> {
        // $3: the state the refund settles on (NULL: still pending, retried by the backoff).
        sqlx::query(
            "UPDATE extra_payments SET \
               refund_state = coalesce($3::text, refund_state), \
               refund_failure = coalesce($6::text, refund_failure), \
               next_attempt_at = CASE WHEN $3::text IS NOT NULL THEN NULL ELSE clock_timestamp() + \
                   least($5::float8, $4::float8 * power(2, least(attempts, 30))) \
                   * (0.5 + random() / 2) * interval '1 millisecond' END, \
               attempts = CASE WHEN $3::text IS NOT NULL THEN attempts ELSE attempts + 1 END \
             WHERE payment_participant = $1 AND payment_ref = $2 AND refund_state = 'PENDING'",
        )
        .bind(&extra.payment.participant)
        .bind(&extra.payment.payment_ref)
        .bind(answer.settles_on())
        .bind(millis(backoff.base) as f64)
        .bind(millis(backoff.cap) as f64)
        .bind(answer.failure())
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    async fn release_terminal_lease(conn: &mut PgConnection, id: Uuid) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE reservations SET lease_owner = NULL, lease_until = NULL \
             WHERE id = $1 AND lease_owner IS NOT NULL \
               AND state IN ('CONFIRMED', 'CANCELLED', 'EXPIRED', 'REJECTED', 'FAILED') \
               AND NOT (state = 'EXPIRED' AND payment_ref IS NOT NULL AND refund_id IS NULL)",
        )
        .bind(id)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }
}

/// [`crate::store::Store::further_payments_of`]: oldest first, through
/// `extra_payments_by_reservation`.
pub(super) async fn further_payments_of(
    pool: &PgPool,
    ids: &[Uuid],
) -> Result<Vec<(Uuid, ExtraPayment)>, StoreError> {
    let rows: Vec<ExtraRow> = sqlx::query_as(
        "SELECT reservation_id, payment_participant, payment_ref, amount_minor, currency, \
           refund_id, refund_state, refund_reason, refund_failure \
         FROM extra_payments WHERE reservation_id = ANY($1) \
         ORDER BY reservation_id, created_at, refund_id",
    )
    .bind(ids)
    .fetch_all(pool)
    .await?;
    rows.into_iter().map(extra_payment).collect()
}
