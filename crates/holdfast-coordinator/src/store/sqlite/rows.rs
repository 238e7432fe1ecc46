//! Reading reservations on SQLite: the column lists, the row types (times as INTEGER
//! microseconds, UUIDs as 16-byte BLOBs, labels as JSON text) and their conversion into the
//! shared stored shape ([`crate::store::record`]), and the reads `load`, `get` and `list`. Every
//! read of a reservation (here, `find.rs`, `admin.rs`, an event in `events.rs`, the `RETURNING`
//! of `answers.rs`'s moves) is one statement that carries the branches as a JSON column
//! (`branches_json!`): one snapshot, and one hand-off to the connection's thread (inside a
//! write, made while the writer is held).

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::sqlite::{SqliteConnection, SqlitePool};
use sqlx::types::Json;
use uuid::Uuid;

use crate::domain::{Branch, ListQuery, Reservation, State};
use crate::store::list::{ListShape, cursor};
use crate::store::record::{StoredBranch, StoredReservation};
use crate::store::{Stamp, StoreError};

/// The branches of generation `$generation` of reservation `$id` (SQL expressions of the
/// statement's row) as one JSON array in position order, a `JsonBranch` each (the id as hex,
/// times as microseconds), as column `branches`.
macro_rules! branches_json {
    ($id:literal, $generation:literal) => {
        concat!(
            "(SELECT json_group_array(json_array(hex(branch_id), participant, resource, \
                 quantity, during_start, during_end, state, attempts, last_error) \
                 ORDER BY position) \
              FROM branches WHERE branches.reservation_id = ",
            $id,
            " AND branches.generation = ",
            $generation,
            ") AS branches"
        )
    };
}

/// Columns of `reservations` every read needs, plus whether a HELD one lapsed (lazy expiry)
/// and its current generation's branches.
macro_rules! reservation_columns {
    () => {
        concat!(
            "id, request_id, holder, state, release_outcome, owner, token_digest, token_key_id, ttl_ms, \
             created_at, expires_at, extensions_used, labels, rejection_participant, \
             rejection_resource, rejection_reason, late_payment_honored, version, \
             payment_participant, payment_ref, payment_amount_minor, payment_currency, \
             refund_id, refund_state, refund_reason, refund_failure, generation, \
             (state = 'HELD' AND expires_at <= ",
            sqlite_now_us!(),
            ") AS lapsed, ",
            branches_json!("reservations.id", "reservations.generation")
        )
    };
}

#[derive(sqlx::FromRow)]
pub(super) struct ReservationRow {
    id: Uuid,
    request_id: String,
    holder: String,
    state: String,
    release_outcome: Option<String>,
    owner: String,
    token_digest: Option<Vec<u8>>,
    token_key_id: Option<String>,
    ttl_ms: i64,
    created_at: i64,
    expires_at: i64,
    extensions_used: i32,
    labels: Json<BTreeMap<String, String>>,
    rejection_participant: Option<String>,
    rejection_resource: Option<String>,
    rejection_reason: Option<String>,
    late_payment_honored: bool,
    version: i64,
    payment_participant: Option<String>,
    payment_ref: Option<String>,
    payment_amount_minor: Option<i64>,
    payment_currency: Option<String>,
    refund_id: Option<Uuid>,
    refund_state: Option<String>,
    refund_reason: Option<String>,
    refund_failure: Option<String>,
    generation: i32,
    lapsed: bool,
    branches: Json<Vec<JsonBranch>>,
}

/// One branch as `branches_json!` writes it.
type JsonBranch = (
    String,
    String,
    String,
    i64,
    Option<i64>,
    Option<i64>,
    String,
    i32,
    Option<String>,
);

/// Stored microseconds since the epoch -> a time.
pub(super) fn time_of(us: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_micros(us)
        .ok_or_else(|| StoreError::Corrupt(format!("timestamp {us} out of range")))
}

/// A time -> stored microseconds since the epoch (PostgreSQL's precision too).
pub(super) fn micros_of(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

/// A duration in microseconds, saturating.
pub(super) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

impl ReservationRow {
    pub(super) fn into_domain(self) -> Result<Reservation, StoreError> {
        let branches = self
            .branches
            .0
            .into_iter()
            .map(json_branch)
            .collect::<Result<Vec<_>, _>>()?;
        StoredReservation {
            id: self.id,
            request_id: self.request_id,
            holder: self.holder,
            state: self.state,
            release_outcome: self.release_outcome,
            owner: self.owner,
            token_digest: self.token_digest,
            token_key_id: self.token_key_id,
            ttl_ms: self.ttl_ms,
            created_at: time_of(self.created_at)?,
            expires_at: time_of(self.expires_at)?,
            extensions_used: self.extensions_used,
            labels: self.labels.0,
            rejection_participant: self.rejection_participant,
            rejection_resource: self.rejection_resource,
            rejection_reason: self.rejection_reason,
            late_payment_honored: self.late_payment_honored,
            version: self.version,
            payment_participant: self.payment_participant,
            payment_ref: self.payment_ref,
            payment_amount_minor: self.payment_amount_minor,
            payment_currency: self.payment_currency,
            refund_id: self.refund_id,
            refund_state: self.refund_state,
            refund_reason: self.refund_reason,
            refund_failure: self.refund_failure,
            generation: self.generation,
            lapsed: self.lapsed,
        }
        .into_domain(branches)
    }
}

/// One branch of `branches_json!` as the domain's.
fn json_branch(branch: JsonBranch) -> Result<Branch, StoreError> {
    let (branch_id, participant, resource, quantity, start, end, state, attempts, last_error) =
        branch;
    StoredBranch {
        branch_id: Uuid::parse_str(&branch_id)
            .map_err(|e| StoreError::Corrupt(format!("branch id {branch_id:?}: {e}")))?,
        participant,
        resource,
        quantity,
        during_start: start.map(time_of).transpose()?,
        during_end: end.map(time_of).transpose()?,
        state,
        attempts,
        last_error,
    }
    .into_domain()
}

/// Reads one reservation with its current generation of branches.
pub(super) async fn load(
    conn: &mut SqliteConnection,
    id: Uuid,
) -> Result<Option<Reservation>, StoreError> {
    sqlx::query_as::<_, ReservationRow>(concat!(
        "SELECT ",
        reservation_columns!(),
        " FROM reservations WHERE id = ?1"
    ))
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?
    .map(ReservationRow::into_domain)
    .transpose()
}

/// [`crate::store::Store::get`]: one statement, so the row and its branches come from one
/// snapshot (WAL readers neither wait for nor block the writer).
pub(super) async fn get(pool: &SqlitePool, id: Uuid) -> Result<Option<Reservation>, StoreError> {
    let mut conn = pool.acquire().await?;
    load(&mut conn, id).await
}

/// The keyset condition and order every List statement ends with (`?1`, `?2` the cursor,
/// `?3` the limit; `?4` owner, `?5` holder, `?6` stored state, `?7` participant, `?8` labels,
/// used or not).
macro_rules! page_end {
    () => {
        "(created_at, id) < (?1, ?2) ORDER BY created_at DESC, id DESC LIMIT ?3"
    };
}

/// One page of the rows `$filter` (ending in `AND `) selects.
macro_rules! page {
    ($filter:expr) => {
        concat!(
            "SELECT ",
            reservation_columns!(),
            " FROM reservations WHERE ",
            $filter,
            page_end!()
        )
    };
}

/// The four state filters over `$rows`, in [`ListShape::index`] order (see
/// `store/list.rs`); `EXPIRED` as read merges two index walks.
macro_rules! by_state {
    ($rows:expr) => {
        [
            page!($rows),
            page!(concat!($rows, "state = ?6 AND ")),
            page!(concat!(
                $rows,
                "state = ?6 AND expires_at > ",
                sqlite_now_us!(),
                " AND "
            )),
            concat!(
                "SELECT * FROM (",
                page!(concat!($rows, "state = ?6 AND ")),
                ") UNION ALL SELECT * FROM (",
                page!(concat!(
                    $rows,
                    "state = 'HELD' AND expires_at <= ",
                    sqlite_now_us!(),
                    " AND "
                )),
                ") ORDER BY created_at DESC, id DESC LIMIT ?3"
            ),
        ]
    };
}

/// The owner/holder shapes of one set of further filters (`$more`, ending in `AND `).
macro_rules! by_owner_holder {
    ($more:expr) => {
        [
            by_state!($more),
            by_state!(concat!("holder = ?5 AND ", $more)),
            by_state!(concat!("owner = ?4 AND ", $more)),
            by_state!(concat!("owner = ?4 AND holder = ?5 AND ", $more)),
        ]
    };
}

/// A branch at participant `?7`: one probe of `branches_by_participant` per row walked.
macro_rules! at_participant {
    () => {
        "EXISTS (SELECT 1 FROM branches pb WHERE pb.participant = ?7 \
                 AND pb.reservation_id = reservations.id) AND "
    };
}

/// Every label of `?8` (a JSON object) with its value.
macro_rules! with_labels {
    () => {
        "(SELECT count(*) FROM json_each(?8) f JOIN json_each(reservations.labels) l \
           ON l.key = f.key AND l.value = f.value) = (SELECT count(*) FROM json_each(?8)) AND "
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
pub fn list_statement(shape: ListShape) -> &'static str {
    let i = shape.index();
    STATEMENTS[i / 16][(i / 4) % 4][i % 4]
}

/// [`crate::store::Store::list`]: a page of reservations, newest first (one statement: one
/// snapshot).
pub(super) async fn list(
    pool: &SqlitePool,
    query: &ListQuery,
) -> Result<Vec<Reservation>, StoreError> {
    let (after_ts, after_id) = cursor(query);
    let page = sqlx::query_as::<_, ReservationRow>(list_statement(ListShape::of(query)))
        .bind(micros_of(after_ts))
        .bind(after_id)
        .bind(i64::from(query.limit))
        .bind(query.owner.as_deref())
        .bind(query.holder.as_deref())
        .bind(query.state.map(State::as_str))
        .bind(query.participant.as_deref())
        .bind(Json(&query.labels))
        .fetch_all(pool)
        .await?
        .into_iter()
        .map(ReservationRow::into_domain)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(crate::store::list::created_after(query, page))
}

/// [`crate::store::Store::versions`]: the ids travel as a JSON array of hex strings.
pub(super) async fn versions(pool: &SqlitePool, ids: &[Uuid]) -> Result<Vec<Stamp>, StoreError> {
    let ids: Vec<String> = ids.iter().map(|id| id.simple().to_string()).collect();
    let rows: Vec<(Uuid, i64, bool)> = sqlx::query_as(concat!(
        "SELECT id, version, (state = 'HELD' AND expires_at <= ",
        sqlite_now_us!(),
        ") FROM reservations WHERE id IN (SELECT unhex(value) FROM json_each(?1))"
    ))
    .bind(Json(&ids))
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
