//! SQLite's statements for payment bindings and further payments ([`PaymentSql`]).

use async_trait::async_trait;
use sqlx::Sqlite;
use sqlx::sqlite::{SqliteConnection, SqlitePool};
use uuid::Uuid;

use super::rows::micros;
use crate::domain::policy::Backoff;
use crate::domain::{ExtraPayment, Payment};
use crate::store::extra::{ExtraRow, extra_payment};
use crate::store::sql::PaymentSql;
use crate::store::{RefundAnswer, StoreError};

#[async_trait]
impl PaymentSql for Sqlite {
    async fn payment_owner(
        conn: &mut SqliteConnection,
        p: &Payment,
    ) -> Result<Option<Uuid>, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT id FROM reservations WHERE payment_participant = ?1 AND payment_ref = ?2 \
             UNION ALL \
             SELECT reservation_id FROM extra_payments \
             WHERE payment_participant = ?1 AND payment_ref = ?2 \
             LIMIT 1",
        )
        .bind(&p.participant)
        .bind(&p.payment_ref)
        .fetch_optional(&mut *conn)
        .await?)
    }

    async fn insert_extra_payment(
        conn: &mut SqliteConnection,
        id: Uuid,
        p: &Payment,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let inserted = sqlx::query(concat!(
            "INSERT INTO extra_payments (payment_participant, payment_ref, reservation_id, \
               amount_minor, currency, refund_id, refund_state, refund_reason, next_attempt_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'PENDING', ?7, ",
            sqlite_now_us!(),
            ") ON CONFLICT (payment_participant, payment_ref) DO NOTHING"
        ))
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
        conn: &mut SqliteConnection,
        p: &Payment,
    ) -> Result<Option<(Uuid, ExtraPayment)>, StoreError> {
        let row: Option<ExtraRow> = sqlx::query_as(
            "SELECT reservation_id, payment_participant, payment_ref, amount_minor, currency, \
               refund_id, refund_state, refund_reason, refund_failure \
             FROM extra_payments WHERE payment_participant = ?1 AND payment_ref = ?2",
        )
        .bind(&p.participant)
        .bind(&p.payment_ref)
        .fetch_optional(&mut *conn)
        .await?;
        row.map(extra_payment).transpose()
    }

    async fn pending_extra_payments(
        conn: &mut SqliteConnection,
        id: Uuid,
    ) -> Result<Vec<ExtraPayment>, StoreError> {
        let rows: Vec<ExtraRow> = sqlx::query_as(
            "SELECT reservation_id, payment_participant, payment_ref, amount_minor, currency, \
               refund_id, refund_state, refund_reason, refund_failure \
             FROM extra_payments WHERE reservation_id = ?1 AND refund_state = 'PENDING' \
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
        conn: &mut SqliteConnection,
        extra: &ExtraPayment,
        answer: &RefundAnswer,
        backoff: Backoff,
    ) -> Result<(), StoreError> {
        // The backoff of `backoff_next_attempt!`, over this row's own attempts. ?3: the state
        // the refund settles on (NULL: still pending).
        sqlx::query(concat!(
            "UPDATE extra_payments SET \
               refund_state = coalesce(?3, refund_state), \
               refund_failure = coalesce(?6, refund_failure), \
               next_attempt_at = CASE WHEN ?3 IS NOT NULL THEN NULL ELSE ",
            sqlite_now_us!(),
            " + CAST(min(?5, ?4 * (1 << min(attempts, 30))) \
                   * (0.5 + (random() & 1048575) / 2097152.0) AS INTEGER) END, \
               attempts = CASE WHEN ?3 IS NOT NULL THEN attempts ELSE attempts + 1 END \
             WHERE payment_participant = ?1 AND payment_ref = ?2 AND refund_state = 'PENDING'"
        ))
        .bind(&extra.payment.participant)
        .bind(&extra.payment.payment_ref)
        .bind(answer.settles_on())
        .bind(micros(backoff.base) as f64)
        .bind(micros(backoff.cap) as f64)
        .bind(answer.failure())
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    async fn release_terminal_lease(
        conn: &mut SqliteConnection,
        id: Uuid,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE reservations SET lease_owner = NULL, lease_until = NULL \
             WHERE id = ?1 AND lease_owner IS NOT NULL \
               AND state IN ('CONFIRMED', 'CANCELLED', 'EXPIRED', 'REJECTED', 'FAILED') \
               AND NOT (state = 'EXPIRED' AND payment_ref IS NOT NULL AND refund_id IS NULL)",
        )
        .bind(id)
        .execute(&mut *conn)
        .await?;
        Ok(())
    }
}

/// [`crate::store::Store::further_payments_of`]: oldest first, on the pool (a read); the ids
/// travel as a JSON array of hex strings.
pub(super) async fn further_payments_of(
    pool: &SqlitePool,
    ids: &[Uuid],
) -> Result<Vec<(Uuid, ExtraPayment)>, StoreError> {
    let ids: Vec<String> = ids.iter().map(|id| id.simple().to_string()).collect();
    let rows: Vec<ExtraRow> = sqlx::query_as(
        "SELECT reservation_id, payment_participant, payment_ref, amount_minor, currency, \
           refund_id, refund_state, refund_reason, refund_failure \
         FROM extra_payments \
         WHERE reservation_id IN (SELECT unhex(value) FROM json_each(?1)) \
         ORDER BY reservation_id, created_at, refund_id",
    )
    .bind(sqlx::types::Json(&ids))
    .fetch_all(pool)
    .await?;
    rows.into_iter().map(extra_payment).collect()
}
