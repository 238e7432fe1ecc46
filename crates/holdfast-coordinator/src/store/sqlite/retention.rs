//! Retention on SQLite (SPEC 8.3): one `BEGIN IMMEDIATE` transaction per batch (the single
//! writer: batches stay small so a Reserve waits for the write lock only briefly) picks the
//! oldest finished reservations with nothing left to do and deletes them with their rows.

use std::time::Duration;

use sqlx::Sqlite;
use sqlx::sqlite::SqlitePool;
use uuid::Uuid;

use super::rows::micros;
use crate::store::sql::ReservationSql;
use crate::store::{Purged, StoreError};

/// [`crate::store::Store::purge_finished`].
pub(super) async fn purge_finished(
    pool: &SqlitePool,
    keep: Duration,
    limit: u32,
) -> Result<Purged, StoreError> {
    let mut tx = Sqlite::begin_write(pool).await?;
    let victims: Vec<Uuid> = sqlx::query_scalar(concat!(
        "SELECT r.id FROM reservations r \
         WHERE r.state IN ('CONFIRMED', 'CANCELLED', 'EXPIRED', 'REJECTED', 'FAILED') \
           AND r.updated_at < ",
        sqlite_now_us!(),
        " - ?1 \
           AND (r.lease_until IS NULL OR r.lease_until < ",
        sqlite_now_us!(),
        ") AND (r.refund_state IS NULL OR r.refund_state = 'REFUNDED') \
           AND NOT (r.state = 'EXPIRED' AND r.payment_ref IS NOT NULL AND r.refund_id IS NULL) \
           AND NOT EXISTS (SELECT 1 FROM extra_payments e WHERE e.reservation_id = r.id \
                 AND (e.refund_state <> 'REFUNDED' OR e.created_at >= ",
        sqlite_now_us!(),
        " - ?1)) \
         ORDER BY r.updated_at \
         LIMIT ?2"
    ))
    .bind(micros(keep))
    .bind(i64::from(limit))
    .fetch_all(&mut *tx)
    .await?;
    let mut purged = Purged::default();
    // Children first and counted; anything else referencing a reservation goes by its
    // ON DELETE CASCADE (foreign keys are on in every connection, `db::open_sqlite`).
    for id in victims {
        purged.branches += sqlx::query("DELETE FROM branches WHERE reservation_id = ?1")
            .bind(id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        purged.extra_payments +=
            sqlx::query("DELETE FROM extra_payments WHERE reservation_id = ?1")
                .bind(id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        purged.reservations += sqlx::query("DELETE FROM reservations WHERE id = ?1")
            .bind(id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
    }
    tx.commit().await?;
    Ok(purged)
}
