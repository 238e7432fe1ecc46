//! Retention on SQLite (SPEC 8.3): one write per batch on the writer thread (the single
//! writer: batches stay small so a Reserve waits for the write lock only briefly) picks the
//! oldest finished reservations with nothing left to do and deletes them with their rows.

use std::time::Duration;

use rusqlite::params;
use uuid::Uuid;

use super::rows::micros;
use super::writer::{all, exec};
use crate::db::SyncConnection;
use crate::store::{Purged, StoreError};

/// [`crate::store::Store::purge_finished`].
pub(super) fn purge_finished(
    conn: &SyncConnection,
    keep: Duration,
    limit: u32,
) -> Result<Purged, StoreError> {
    let victims: Vec<Uuid> = all(
        conn,
        concat!(
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
        ),
        params![micros(keep), i64::from(limit)],
        |r| r.get(0),
    )?;
    let mut purged = Purged::default();
    // Children first and counted; anything else referencing a reservation goes by its
    // ON DELETE CASCADE (foreign keys are on in every connection, `db::open_sqlite`).
    for id in victims {
        purged.branches += exec(
            conn,
            "DELETE FROM branches WHERE reservation_id = ?1",
            params![id],
        )? as u64;
        purged.extra_payments += exec(
            conn,
            "DELETE FROM extra_payments WHERE reservation_id = ?1",
            params![id],
        )? as u64;
        purged.reservations +=
            exec(conn, "DELETE FROM reservations WHERE id = ?1", params![id])? as u64;
    }
    Ok(purged)
}
