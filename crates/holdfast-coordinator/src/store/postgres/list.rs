//! List on PostgreSQL: one statement per [`ListShape`] (see `store/list.rs`), each walking the
//! index whose order is the listing's, and the stamps `WatchReservation`'s shared poller reads.
//!
//! Every statement takes the same parameters, used or not: `$1`, `$2` the keyset cursor
//! (`created_at`, `id`), `$3` the limit, `$4` owner, `$5` holder, `$6` stored state, `$7`
//! participant, `$8` labels (a JSON object the row's labels must contain).

use sqlx::postgres::PgPool;
use uuid::Uuid;

use super::rows::ReservationRow;
use crate::domain::{ListQuery, Reservation, State};
use crate::store::list::{ListShape, cursor};
use crate::store::{Stamp, StoreError};

/// The keyset condition and order every List statement ends with.
macro_rules! page_end {
    () => {
        "(created_at, id) < ($1, $2) ORDER BY created_at DESC, id DESC LIMIT $3"
    };
}

/// One page of the rows `$filter` (ending in `AND `) selects.
macro_rules! page {
    ($filter:expr) => {
        concat!(select_reservations!(), "WHERE ", $filter, page_end!())
    };
}

/// The four state filters over `$rows` (owner and holder conditions, each ending in `AND `),
/// in [`ListShape::index`] order: any, stored, live `HELD`, `EXPIRED` as read (`$6` is the
/// state asked for: `HELD`, `EXPIRED`). The last merges two index walks: stored `EXPIRED`, and
/// `HELD` past its time (partitioned from live `HELD` at the statement's start; a literal, so
/// the small partial indexes of live reservations can serve it). The stored state is a
/// parameter, not a literal, even where it is fixed: a generic plan then judges it by the
/// column's declared selectivity (migration `0006`) rather than by how common `EXPIRED` is.
macro_rules! by_state {
    ($rows:expr) => {
        [
            page!($rows),
            page!(concat!($rows, "reservations.state = $6 AND ")),
            page!(concat!(
                $rows,
                "reservations.state = $6 AND expires_at > statement_timestamp() AND "
            )),
            concat!(
                "SELECT * FROM ((",
                page!(concat!($rows, "reservations.state = $6 AND ")),
                ") UNION ALL (",
                page!(concat!(
                    $rows,
                    "reservations.state = 'HELD' AND expires_at <= statement_timestamp() AND "
                )),
                ")) page ORDER BY created_at DESC, id DESC LIMIT $3"
            ),
        ]
    };
}

/// The owner/holder shapes of one set of further filters (`$more`, ending in `AND `).
macro_rules! by_owner_holder {
    ($more:expr) => {
        [
            by_state!($more),
            by_state!(concat!("holder = $5 AND ", $more)),
            by_state!(concat!("owner = $4 AND ", $more)),
            by_state!(concat!("owner = $4 AND holder = $5 AND ", $more)),
        ]
    };
}

/// A branch at participant `$7`: one probe of `branches_by_participant` per row walked.
macro_rules! at_participant {
    () => {
        "EXISTS (SELECT 1 FROM branches pb WHERE pb.participant = $7 \
                 AND pb.reservation_id = reservations.id) AND "
    };
}

/// Every label of `$8` with its value.
macro_rules! with_labels {
    () => {
        "reservations.labels @> $8 AND "
    };
}

/// Every List statement, in [`ListShape::index`] order.
const STATEMENTS: [[[&str; 4]; 4]; 4] = [
    by_owner_holder!(""),
    by_owner_holder!(at_participant!()),
    by_owner_holder!(with_labels!()),
    by_owner_holder!(concat!(at_participant!(), with_labels!())),
];

/// The statement that answers lists of `shape` (for tests that EXPLAIN it).
pub fn statement(shape: ListShape) -> &'static str {
    let i = shape.index();
    STATEMENTS[i / 16][(i / 4) % 4][i % 4]
}

/// A page of reservations, newest first ([`crate::store::Store::list`]).
pub(super) async fn list(pool: &PgPool, query: &ListQuery) -> Result<Vec<Reservation>, StoreError> {
    let (after_ts, after_id) = cursor(query);
    sqlx::query_as::<_, ReservationRow>(statement(ListShape::of(query)))
        .bind(after_ts)
        .bind(after_id)
        .bind(i64::from(query.limit))
        .bind(query.owner.as_deref())
        .bind(query.holder.as_deref())
        .bind(query.state.map(State::as_str))
        .bind(query.participant.as_deref())
        .bind(sqlx::types::Json(&query.labels))
        .fetch_all(pool)
        .await?
        .into_iter()
        .map(ReservationRow::into_domain)
        .collect::<Result<Vec<_>, _>>()
        .map(|page| crate::store::list::created_after(query, page))
}

/// [`crate::store::Store::versions`].
pub(super) async fn versions(pool: &PgPool, ids: &[Uuid]) -> Result<Vec<Stamp>, StoreError> {
    let rows: Vec<(Uuid, i64, bool)> = sqlx::query_as(
        "SELECT id, version, (state = 'HELD' AND expires_at <= clock_timestamp()) \
         FROM reservations WHERE id = ANY($1)",
    )
    .bind(ids)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, version, lapsed)| Stamp {
            id,
            version,
            lapsed,
        })
        .collect())
}
