//! Recording Reserves on SQLite: under the write lock the shared [`admission`] check and the
//! insert of the reservation and its branches are one atomic step (PostgreSQL needs advisory
//! locks for that). Also admission's counting statements ([`AdmissionSql`]).

use std::collections::HashMap;

use async_trait::async_trait;
use sqlx::Sqlite;
use sqlx::sqlite::{SqliteConnection, SqlitePool};
use sqlx::types::Json;
use uuid::Uuid;

use super::rows::{ReservationRow, micros, micros_of};
use crate::domain::policy::HoldLimits;
use crate::domain::{NewReservation, RequestId};
use crate::store::admission::{AdmissionSql, admission};
use crate::store::sql::ReservationSql;
use crate::store::{Created, StoreError, WorkLease};

#[async_trait]
impl AdmissionSql for Sqlite {
    async fn find_request(
        conn: &mut SqliteConnection,
        owner: &str,
        holder: &str,
        request_id: &RequestId,
    ) -> Result<(Option<Uuid>, i64), StoreError> {
        Ok(sqlx::query_as(concat!(
            "SELECT (SELECT id FROM reservations WHERE owner = ?3 AND holder = ?1 AND request_id = ?2), \
                    (SELECT count(*) FROM reservations WHERE owner = ?3 AND holder = ?1 \
                       AND state IN ('TRYING', 'HELD', 'QUEUED') \
                       AND (state <> 'HELD' OR expires_at > ",
            sqlite_now_us!(),
            "))"
        ))
        .bind(holder)
        .bind(request_id.as_str())
        .bind(owner)
        .fetch_one(&mut *conn)
        .await?)
    }

    async fn count_live(conn: &mut SqliteConnection) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(concat!(
            "SELECT count(*) FROM reservations WHERE state IN ('TRYING', 'HELD', 'QUEUED') \
               AND (state <> 'HELD' OR expires_at > ",
            sqlite_now_us!(),
            ")"
        ))
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

/// [`crate::store::Store::create`].
pub(super) async fn create(
    pool: &SqlitePool,
    new: &NewReservation,
    lease: WorkLease,
    limits: HoldLimits,
) -> Result<Created, StoreError> {
    let id = new.id;
    let ttl_ms = i64::try_from(new.ttl.as_millis()).unwrap_or(i64::MAX);
    // The write lock makes the lookup, the limit counts and the insert one atomic step.
    let mut tx = Sqlite::begin_write(pool).await?;
    if let Some(refused) = admission::<Sqlite>(&mut tx, new, limits).await? {
        tx.rollback().await?;
        return Ok(refused);
    }
    let branches = new_branches(new);
    // The reservation, its branches (all in one statement, a JSON array: [id as hex,
    // participant, resource, quantity, slot start, slot end]) and the read of what was
    // created: one query, one hand-off to the writer's thread (statements on the writer are serial, each made with the write
    // lock held).
    let created = sqlx::query_as::<_, ReservationRow>(concat!(
        "INSERT INTO reservations (id, request_id, holder, state, token_digest, ttl_ms, \
                                   created_at, updated_at, expires_at, labels, \
                                   lease_owner, lease_until, owner, token_key_id) \
         VALUES (?1, ?2, ?3, 'TRYING', ?4, ?5, ",
        sqlite_now_us!(),
        ", ",
        sqlite_now_us!(),
        ", ",
        sqlite_now_us!(),
        " + ?5 * 1000, ?6, ?7, ",
        sqlite_now_us!(),
        " + ?8, ?9, ?10) \
         ON CONFLICT (owner, holder, request_id) DO NOTHING; \
         INSERT INTO branches (reservation_id, position, branch_id, participant, resource, \
                               quantity, during_start, during_end, state) \
         SELECT ?1, b.key, unhex(b.value ->> 0), b.value ->> 1, b.value ->> 2, b.value ->> 3, \
                b.value ->> 4, b.value ->> 5, 'PENDING' \
         FROM json_each(?11) AS b WHERE EXISTS (SELECT 1 FROM reservations WHERE id = ?1) \
         ORDER BY b.key; \
         SELECT ",
        reservation_columns!(),
        " FROM reservations WHERE id = ?1"
    ))
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
    .fetch_optional(&mut *tx)
    .await?
    // Unreachable under the write lock (admission looked the request up); the unique index
    // stays the last word, and a conflict inserts nothing (this write is dropped: undone).
    .ok_or_else(|| StoreError::Corrupt("request_id conflicted under the write lock".into()))?
    .into_domain()?;
    tx.commit().await?;
    Ok(Created::New(created))
}
