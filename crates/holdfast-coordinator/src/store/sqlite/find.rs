//! List's lookups on SQLite ([`Find`]): an id prefix walks the primary key over its range (16
//! byte BLOBs compare as the ids order), a request id the index `reservations_by_request_id`
//! (migration `0014`); both bounded by the page's limit, the owner (NULL: everyone's) checked
//! on each row walked; branches read in the same transaction.

use sqlx::sqlite::SqlitePool;
use uuid::Uuid;

use super::rows::{ReservationRow, micros_of};
use crate::domain::{Find, ListQuery, Reservation};
use crate::store::StoreError;
use crate::store::list::{cursor, id_range};

/// Ids from `?1` to `?2`, in id order; `?3` the limit, `?4` the owner or NULL.
pub const BY_ID_PREFIX: &str = concat!(
    "SELECT ",
    reservation_columns!(),
    " FROM reservations WHERE id BETWEEN ?1 AND ?2 AND (?4 IS NULL OR owner = ?4) \
     ORDER BY id LIMIT ?3"
);

/// Request id `?5`, newest first before the cursor (`?1`, `?2`); `?3` the limit, `?4` the
/// owner or NULL.
pub const BY_REQUEST_ID: &str = concat!(
    "SELECT ",
    reservation_columns!(),
    " FROM reservations INDEXED BY reservations_by_request_id \
     WHERE request_id = ?5 AND (?4 IS NULL OR owner = ?4) AND (created_at, id) < (?1, ?2) \
     ORDER BY created_at DESC, id DESC LIMIT ?3"
);

/// A page of what `find` looks up.
pub(super) async fn find(
    pool: &SqlitePool,
    query: &ListQuery,
    find: &Find,
) -> Result<Vec<Reservation>, StoreError> {
    let limit = i64::from(query.limit);
    let owner = query.owner.as_deref();
    let rows: Vec<ReservationRow> = match find {
        Find::Ids { low, high } => {
            let Some((from, to)) = id_range(query, *low, *high) else {
                return Ok(Vec::new());
            };
            sqlx::query_as(BY_ID_PREFIX)
                .bind(from)
                .bind(to)
                .bind(limit)
                .bind(owner)
                .fetch_all(pool)
                .await?
        }
        Find::RequestId(request_id) => {
            let (after_ts, after_id): (_, Uuid) = cursor(query);
            sqlx::query_as(BY_REQUEST_ID)
                .bind(micros_of(after_ts))
                .bind(after_id)
                .bind(limit)
                .bind(owner)
                .bind(request_id)
                .fetch_all(pool)
                .await?
        }
    };
    rows.into_iter().map(ReservationRow::into_domain).collect()
}
