//! Recording Reserves on SQLite: under the write lock, one conditional insert of the
//! reservation and its branches whose guard is admission's rule (PostgreSQL needs advisory
//! locks for that); one it refuses is explained by the shared [`admission`] check. Also
//! admission's counting statements ([`AdmissionSql`]), which count as the guard does.

use std::collections::HashMap;

use async_trait::async_trait;
use sqlx::Sqlite;
use sqlx::sqlite::{SqliteConnection, SqlitePool};
use sqlx::types::Json;
use uuid::Uuid;

use super::rows::{ReservationRow, micros, micros_of};
use crate::db::{FirstQuery, begin_sqlite_write_deferred};
use crate::domain::policy::HoldLimits;
use crate::domain::{NewReservation, RequestId};
use crate::store::admission::{AdmissionSql, admission};
use crate::store::{Created, StoreError, WorkLease};

/// How many live reservations `owner` (`?own`) `holder` (`?hold`) has: `TRYING`, `QUEUED`, or
/// `HELD` and unexpired by the database clock. (Macros: queries are `&'static str`, and the
/// admission read and the insert's guard count alike.)
macro_rules! live_of_holder {
    ($own:literal, $hold:literal) => {
        concat!(
            "(SELECT count(*) FROM reservations WHERE owner = ",
            $own,
            " AND holder = ",
            $hold,
            " AND state IN ('TRYING', 'HELD', 'QUEUED') AND (state <> 'HELD' OR expires_at > ",
            sqlite_now_us!(),
            "))"
        )
    };
}

/// How many live reservations there are in all.
macro_rules! live_in_all {
    () => {
        concat!(
            "(SELECT count(*) FROM reservations WHERE state IN ('TRYING', 'HELD', 'QUEUED') \
               AND (state <> 'HELD' OR expires_at > ",
            sqlite_now_us!(),
            "))"
        )
    };
}

/// Whether the request key `(?1, ?2, ?3)` = (owner, holder, request id) is recorded: a Reserve
/// the sold-out fast path would refuse answers its recorded reservation instead. One row of the
/// key's index (`tests/store` `plans_find`).
pub const REQUEST_RECORDED: &str = "SELECT EXISTS (SELECT 1 FROM reservations \
       WHERE owner = ?1 AND holder = ?2 AND request_id = ?3)";

/// The reservation recorded under the request key (owner `?3`, holder `?1`, request id `?2`), if
/// any, and the holder's live holds: what [`admission`] judges a Reserve by.
pub const FIND_REQUEST: &str = concat!(
    "SELECT (SELECT id FROM reservations WHERE owner = ?3 AND holder = ?1 AND request_id = ?2), ",
    live_of_holder!("?3", "?1")
);

#[async_trait]
impl AdmissionSql for Sqlite {
    async fn find_request(
        conn: &mut SqliteConnection,
        owner: &str,
        holder: &str,
        request_id: &RequestId,
    ) -> Result<(Option<Uuid>, i64), StoreError> {
        Ok(sqlx::query_as(FIND_REQUEST)
            .bind(holder)
            .bind(request_id.as_str())
            .bind(owner)
            .fetch_one(&mut *conn)
            .await?)
    }

    async fn count_live(conn: &mut SqliteConnection) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(concat!("SELECT ", live_in_all!()))
            .fetch_one(&mut *conn)
            .await?)
    }
}

/// A new branch as `create` hands it to SQLite: id (hex), participant, resource, quantity,
/// the slot's start and end (microseconds).
type JsonNewBranch<'a> = (String, &'a str, &'a str, i64, Option<i64>, Option<i64>);

/// `new`'s branches as `create` inserts them, in position order: one participant-level branch
/// id per participant, shared by its holds.
fn new_branches(new: &NewReservation) -> Vec<JsonNewBranch<'_>> {
    let mut branch_ids: HashMap<&str, Uuid> = HashMap::new();
    new.holds
        .iter()
        .map(|h| {
            let branch_id = *branch_ids
                .entry(&h.participant)
                .or_insert_with(Uuid::new_v4);
            (
                branch_id.simple().to_string(),
                h.participant.as_str(),
                h.resource.as_str(),
                h.quantity,
                h.during.map(|d| micros_of(d.start)),
                h.during.map(|d| micros_of(d.end)),
            )
        })
        .collect()
}

/// [`crate::store::Store::create`]: one conditional insert under the write lock, whose guard is
/// admission's (the request not recorded yet, both hold limits below their caps); when it
/// inserts nothing, the shared [`admission`] says why, still under the lock.
pub(super) async fn create(
    pool: &SqlitePool,
    new: &NewReservation,
    lease: WorkLease,
    limits: HoldLimits,
) -> Result<Created, StoreError> {
    let id = new.id;
    let ttl_ms = i64::try_from(new.ttl.as_millis()).unwrap_or(i64::MAX);
    let branches = new_branches(new);
    // The reservation if admitted, its branches (one statement, a JSON array: [id as hex,
    // participant, resource, quantity, slot start, slot end]) and the read of what was
    // created: one query after the write's opening, one hand-off to the writer's thread
    // (statements on the writer are serial, each made with the write lock held).
    let mut ahead = begin_sqlite_write_deferred(pool).await?;
    let (sql, conn) = ahead.first(CREATE);
    let ran = sqlx::query_as::<_, ReservationRow>(sql)
        .bind(id)
        .bind(new.request_id.as_str())
        .bind(&new.holder)
        .bind(new.token.digest.as_slice())
        .bind(ttl_ms)
        .bind(Json(&new.labels))
        .bind(lease.owner)
        .bind(micros(lease.duration))
        .bind(&new.owner)
        .bind(new.token.key_id.as_deref())
        .bind(Json(&branches))
        .bind(i64::from(limits.per_holder))
        .bind(i64::from(limits.total))
        .fetch_optional(conn)
        .await;
    let (created, mut tx) = ahead.opened(ran)?;
    let Some(created) = created else {
        let refused = admission::<Sqlite>(&mut tx, new, limits).await?;
        tx.rollback().await?;
        // The guard and admission count alike, under the same lock.
        return refused.ok_or_else(|| {
            StoreError::Corrupt("a Reserve admission allows was not inserted".into())
        });
    };
    let created = created.into_domain()?;
    tx.commit().await?;
    Ok(Created::New(created))
}

/// [`create`]'s query: `?1` id, `?2` request id, `?3` holder, `?4` token digest, `?5` ttl ms,
/// `?6` labels, `?7`/`?8` lease owner and microseconds, `?9` owner, `?10` token key id, `?11`
/// branches (JSON), `?12` the per-holder cap, `?13` the global cap (0: none). A row of `?1`
/// recorded already (an earlier attempt of this very call) is answered as it is, as admission
/// answers it, its branches not inserted again.
const CREATE: FirstQuery = sqlite_first_query!(
    "INSERT INTO reservations (id, request_id, holder, state, token_digest, ttl_ms, \
                               created_at, updated_at, expires_at, labels, \
                               lease_owner, lease_until, owner, token_key_id) \
     SELECT ?1, ?2, ?3, 'TRYING', ?4, ?5, ",
    sqlite_now_us!(),
    ", ",
    sqlite_now_us!(),
    ", ",
    sqlite_now_us!(),
    " + ?5 * 1000, ?6, ?7, ",
    sqlite_now_us!(),
    " + ?8, ?9, ?10 \
     WHERE NOT EXISTS (SELECT 1 FROM reservations \
                       WHERE owner = ?9 AND holder = ?3 AND request_id = ?2) \
       AND ",
    live_of_holder!("?9", "?3"),
    " < ?12 AND (?13 = 0 OR ",
    live_in_all!(),
    " < ?13); \
     INSERT INTO branches (reservation_id, position, branch_id, participant, resource, \
                           quantity, during_start, during_end, state) \
     SELECT ?1, b.key, unhex(b.value ->> 0), b.value ->> 1, b.value ->> 2, b.value ->> 3, \
            b.value ->> 4, b.value ->> 5, 'PENDING' \
     FROM json_each(?11) AS b WHERE EXISTS (SELECT 1 FROM reservations WHERE id = ?1) \
       AND NOT EXISTS (SELECT 1 FROM branches WHERE reservation_id = ?1) \
     ORDER BY b.key; \
     SELECT ",
    reservation_columns!(),
    " FROM reservations WHERE id = ?1"
);
