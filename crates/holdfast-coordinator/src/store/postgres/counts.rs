//! Reservations by state on PostgreSQL ([`StateCounts`]), in one transaction (one snapshot):
//! the live ones walk `reservations_open` (partial: non-terminal rows only), the last hour's a
//! range of `reservations_by_created`. Neither reads the whole table.

use chrono::{DateTime, Utc};
use sqlx::postgres::PgPool;

use crate::domain::admin::StateCounts;
use crate::store::StoreError;
use crate::store::record::parse_state;

/// Live reservations by state as read (a lapsed `HELD` one reads `EXPIRED`); the waiting
/// ones (`QUEUED`) through their own partial index, `reservations_queue_wait`.
pub const LIVE: &str = "SELECT CASE WHEN state = 'HELD' AND expires_at <= statement_timestamp() \
         THEN 'EXPIRED' ELSE state END AS read_state, count(*) \
     FROM reservations WHERE state IN ('TRYING', 'HELD', 'CONFIRMING', 'CANCELLING') \
     GROUP BY 1 \
     UNION ALL SELECT 'QUEUED', count(*) FROM reservations WHERE state = 'QUEUED' \
     HAVING count(*) > 0";

/// The last hour's reservations by the minute they were created in and their state as read.
pub const LAST_HOUR: &str = "SELECT date_trunc('minute', created_at) AS minute, \
         CASE WHEN state = 'HELD' AND expires_at <= statement_timestamp() \
         THEN 'EXPIRED' ELSE state END AS read_state, count(*) \
     FROM reservations WHERE created_at >= statement_timestamp() - interval '1 hour' \
     GROUP BY 1, 2 ORDER BY 1, 2";

/// [`crate::store::Store::count_by_state`].
pub(super) async fn count_by_state(pool: &PgPool) -> Result<StateCounts, StoreError> {
    let mut tx = pool.begin().await?;
    let at: DateTime<Utc> = sqlx::query_scalar("SELECT statement_timestamp()")
        .fetch_one(&mut *tx)
        .await?;
    let live: Vec<(String, i64)> = sqlx::query_as(LIVE).fetch_all(&mut *tx).await?;
    let minutes: Vec<(DateTime<Utc>, String, i64)> =
        sqlx::query_as(LAST_HOUR).fetch_all(&mut *tx).await?;
    tx.rollback().await?;
    Ok(StateCounts {
        live: live
            .into_iter()
            .map(|(s, n)| Ok((parse_state(&s)?, n)))
            .collect::<Result<_, StoreError>>()?,
        minutes: minutes
            .into_iter()
            .map(|(m, s, n)| Ok((m, parse_state(&s)?, n)))
            .collect::<Result<_, StoreError>>()?,
        at,
    })
}
