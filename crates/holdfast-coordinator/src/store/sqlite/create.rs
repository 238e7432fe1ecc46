//! Recording Reserves on SQLite: under the write lock the shared [`admission`] check and the
//! insert of the reservation and its branches are one atomic step (PostgreSQL needs advisory
//! locks for that). Also admission's counting statements ([`AdmissionSql`]).

use std::collections::HashMap;

use async_trait::async_trait;
use rusqlite::params;
use uuid::Uuid;

use super::rows::{micros, micros_of};
use super::writer::{Conn, OnWriter, exec, one};
use crate::db::WriteTransaction;
use crate::domain::NewReservation;
use crate::domain::policy::HoldLimits;
use crate::store::admission::{AdmissionSql, admission};
use crate::store::sql::ReservationSql;
use crate::store::{Created, StoreError, WorkLease};

#[async_trait]
impl AdmissionSql for OnWriter {
    async fn find_request(
        conn: &mut Conn,
        owner: &str,
        holder: &str,
        request_id: &str,
    ) -> Result<(Option<Uuid>, i64), StoreError> {
        one(
            conn,
            concat!(
                "SELECT (SELECT id FROM reservations WHERE owner = ?3 AND holder = ?1 AND request_id = ?2), \
                        (SELECT count(*) FROM reservations WHERE owner = ?3 AND holder = ?1 \
                           AND state IN ('TRYING', 'HELD') \
                           AND (state = 'TRYING' OR expires_at > ",
                sqlite_now_us!(),
                "))"
            ),
            params![holder, request_id, owner],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
    }

    async fn count_live(conn: &mut Conn) -> Result<i64, StoreError> {
        one(
            conn,
            concat!(
                "SELECT count(*) FROM reservations WHERE state IN ('TRYING', 'HELD') \
               AND (state = 'TRYING' OR expires_at > ",
                sqlite_now_us!(),
                ")"
            ),
            (),
            |r| r.get(0),
        )
    }
}

/// [`crate::store::Store::create`].
pub(super) async fn create(
    conn: &mut Conn,
    new: &NewReservation,
    lease: WorkLease,
    limits: HoldLimits,
) -> Result<Created, StoreError> {
    let id = new.id;
    let ttl_ms = i64::try_from(new.ttl.as_millis()).unwrap_or(i64::MAX);
    let labels = serde_json::to_string(&new.labels)
        .map_err(|e| StoreError::Corrupt(format!("labels as JSON: {e}")))?;
    // The write lock makes the lookup, the limit counts and the insert one atomic step.
    let mut tx = OnWriter::begin_write(conn).await?;
    if let Some(refused) = admission::<OnWriter>(&mut tx, new, limits).await? {
        tx.rollback().await?;
        return Ok(refused);
    }
    let inserted = exec(
        &tx,
        concat!(
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
         ON CONFLICT (owner, holder, request_id) DO NOTHING"
        ),
        params![
            id,
            &new.request_id,
            &new.holder,
            new.token.digest.as_slice(),
            ttl_ms,
            labels,
            lease.owner,
            micros(lease.duration),
            &new.owner,
            new.token.key_id.as_deref()
        ],
    )?;
    if inserted == 0 {
        // Unreachable under the write lock; the unique index stays the last word.
        return Err(StoreError::Corrupt(
            "request_id conflicted under the write lock".into(),
        ));
    }
    // One participant-level branch id per participant, shared by its holds.
    let mut branch_ids: HashMap<&str, Uuid> = HashMap::new();
    for (i, h) in new.holds.iter().enumerate() {
        let branch_id = *branch_ids
            .entry(&h.participant)
            .or_insert_with(Uuid::new_v4);
        exec(
            &tx,
            "INSERT INTO branches (reservation_id, position, branch_id, participant, resource, \
                                   quantity, during_start, during_end, state) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'PENDING')",
            params![
                id,
                i64::try_from(i).unwrap_or(i64::MAX),
                branch_id,
                &h.participant,
                &h.resource,
                h.quantity,
                h.during.map(|d| micros_of(d.start)),
                h.during.map(|d| micros_of(d.end))
            ],
        )?;
    }
    let created = OnWriter::load_existing(&mut tx, id).await?;
    tx.commit().await?;
    Ok(Created::New(created))
}
