//! Which participants unfinished work waits on ([`crate::store::Store::waiting_on`]), on
//! SQLite: reservations with a branch a participant must still be told about
//! (held, or tried without a definite answer) and refunds still owed by a payment participant.

use uuid::Uuid;

use crate::store::{StoreError, Waiting, waiting_by_participant};

/// [`crate::store::Store::waiting_on`].
pub(super) async fn waiting_on(
    pool: &sqlx::sqlite::SqlitePool,
    examples: u32,
) -> Result<Vec<Waiting>, StoreError> {
    let rows: Vec<(String, i64, Uuid)> = sqlx::query_as(
        "WITH w AS ( \
            SELECT b.participant, r.id, r.created_at \
            FROM reservations r JOIN branches b \
              ON b.reservation_id = r.id AND b.generation = r.generation \
            WHERE r.state IN ('TRYING', 'HELD', 'CONFIRMING', 'CANCELLING') \
              AND (b.state = 'HELD' OR (b.state = 'PENDING' AND b.attempts > 0)) \
            UNION \
            SELECT payment_participant, id, created_at FROM reservations \
            WHERE refund_state = 'PENDING' \
            UNION \
            SELECT e.payment_participant, r.id, r.created_at \
            FROM extra_payments e JOIN reservations r ON r.id = e.reservation_id \
            WHERE e.refund_state = 'PENDING') \
         SELECT participant, total, id FROM ( \
            SELECT participant, id, count(*) OVER (PARTITION BY participant) AS total, \
                   row_number() OVER (PARTITION BY participant ORDER BY created_at, id) AS k \
            FROM w) n \
         WHERE k <= max(?1, 1) ORDER BY participant, k",
    )
    .bind(i64::from(examples))
    .fetch_all(pool)
    .await?;
    Ok(waiting_by_participant(rows))
}
