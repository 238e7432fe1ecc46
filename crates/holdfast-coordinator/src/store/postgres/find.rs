//! List's lookups on PostgreSQL ([`Find`]): an id prefix walks the primary key over its range,
//! a request id the request key's index `reservations_request_key` (migration `0018`, led by
//! the request id); both bounded by the page's limit, the owner (NULL: everyone's) checked on
//! each row walked, a request id's rows sorted newest first.

use sqlx::postgres::PgPool;
use uuid::Uuid;

use super::rows::ReservationRow;
use crate::domain::{Find, ListQuery, Reservation};
use crate::store::StoreError;
use crate::store::list::{cursor, id_range};

/// Ids from `$1` to `$2`, in id order; `$3` the limit, `$4` the owner or NULL.
pub const BY_ID_PREFIX: &str = concat!(
    select_reservations!(),
    "WHERE id BETWEEN $1 AND $2 AND ($4::text IS NULL OR owner = $4) ORDER BY id LIMIT $3"
);

/// Request id `$5`, newest first before the cursor (`$1`, `$2`); `$3` the limit, `$4` the
/// owner or NULL.
pub const BY_REQUEST_ID: &str = concat!(
    select_reservations!(),
    "WHERE request_id = $5 AND ($4::text IS NULL OR owner = $4) AND (created_at, id) < ($1, $2) \
     ORDER BY created_at DESC, id DESC LIMIT $3"
);

/// A page of what `find` looks up.
pub(super) async fn find(
    pool: &PgPool,
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
                .bind(after_ts)
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
