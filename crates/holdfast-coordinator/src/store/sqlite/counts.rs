//! Reservations by state on SQLite ([`StateCounts`]), in one read transaction: the live ones
//! walk `reservations_open` (partial: non-terminal rows only), the last hour's a range of
//! `reservations_by_created`. Neither reads the whole table.

use sqlx::sqlite::SqlitePool;

use super::rows::time_of;
use crate::domain::admin::StateCounts;
use crate::store::StoreError;
use crate::store::record::parse_state;

/// Live reservations by state as read (a lapsed `HELD` one reads `EXPIRED`); the waiting
/// ones (`QUEUED`) through their own partial index, `reservations_queue_wait` (searched from
/// the lowest `queue_until`: every waiting row has one).
pub const LIVE: &str = concat!(
    "SELECT CASE WHEN state = 'HELD' AND expires_at <= ",
    sqlite_now_us!(),
    " THEN 'EXPIRED' ELSE state END AS read_state, count(*) \
     FROM reservations INDEXED BY reservations_open \
     WHERE state IN ('TRYING', 'HELD', 'CONFIRMING', 'CANCELLING') GROUP BY 1 \
     UNION ALL SELECT 'QUEUED', count(*) FROM reservations INDEXED BY reservations_queue_wait \
     WHERE state = 'QUEUED' AND queue_until >= 0 HAVING count(*) > 0"
);

/// The last hour's reservations by the minute they were created in (microseconds) and their
/// state as read.
pub const LAST_HOUR: &str = concat!(
    "SELECT (created_at / 60000000) * 60000000 AS minute, \
         CASE WHEN state = 'HELD' AND expires_at <= ",
    sqlite_now_us!(),
    " THEN 'EXPIRED' ELSE state END AS read_state, count(*) \
     FROM reservations INDEXED BY reservations_by_created \
     WHERE created_at >= ",
    sqlite_now_us!(),
    " - 3600000000 GROUP BY 1, 2 ORDER BY 1, 2"
);

/// [`crate::store::Store::count_by_state`].
pub(super) async fn count_by_state(pool: &SqlitePool) -> Result<StateCounts, StoreError> {
    let mut tx = pool.begin().await?;
    let at: i64 = sqlx::query_scalar(concat!("SELECT ", sqlite_now_us!()))
        .fetch_one(&mut *tx)
        .await?;
    let live: Vec<(String, i64)> = sqlx::query_as(LIVE).fetch_all(&mut *tx).await?;
    let minutes: Vec<(i64, String, i64)> = sqlx::query_as(LAST_HOUR).fetch_all(&mut *tx).await?;
    tx.rollback().await?;
    Ok(StateCounts {
        live: live
            .into_iter()
            .map(|(s, n)| Ok((parse_state(&s)?, n)))
            .collect::<Result<_, StoreError>>()?,
        minutes: minutes
            .into_iter()
            .map(|(m, s, n)| Ok((time_of(m)?, parse_state(&s)?, n)))
            .collect::<Result<_, StoreError>>()?,
        at: time_of(at)?,
    })
}
