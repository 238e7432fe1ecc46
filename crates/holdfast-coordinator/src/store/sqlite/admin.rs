//! SQLite's statements for the operator's control plane: [`AdminSql`] (the writes of
//! `store/admin.rs`, under the `BEGIN IMMEDIATE` write lock), the stuck-work listing and the
//! audit log reads.

use async_trait::async_trait;
use sqlx::Sqlite;
use sqlx::sqlite::{SqliteConnection, SqlitePool};
use uuid::Uuid;

use super::rows::{ReservationRow, micros, micros_of};
use crate::domain::admin::{
    AdminAction, AuditEntry, AuditNote, AuditQuery, RetryTarget, StuckQuery, WorkState,
};
use crate::domain::{Reservation, State};
use crate::store::admin::{AdminSql, Woken};
use crate::store::{StoreError, WorkLease};

/// Which reservations have unfinished work (Retry), over `reservations r`.
macro_rules! unfinished {
    () => {
        "(r.state IN ('TRYING', 'CONFIRMING', 'CANCELLING') \
          OR r.refund_state = 'PENDING' \
          OR (r.state = 'EXPIRED' AND r.payment_ref IS NOT NULL AND r.refund_id IS NULL) \
          OR EXISTS (SELECT 1 FROM extra_payments e WHERE e.reservation_id = r.id \
                     AND e.refund_state = 'PENDING'))"
    };
}

#[async_trait]
impl AdminSql for Sqlite {
    async fn release_trying(
        conn: &mut SqliteConnection,
        id: Uuid,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let released = sqlx::query(concat!(
            "UPDATE reservations SET state = 'CANCELLING', release_outcome = 'CANCELLED', \
             cancel_reason = ?2, version = version + 1, updated_at = ",
            sqlite_now_us!(),
            " WHERE id = ?1 AND state = 'TRYING'"
        ))
        .bind(id)
        .bind(reason)
        .execute(&mut *conn)
        .await?
        .rows_affected()
            == 1;
        if released {
            sqlx::query(
                "UPDATE branches SET attempts = max(attempts, 1) \
                 WHERE reservation_id = ?1 AND state = 'PENDING' \
                   AND generation = (SELECT generation FROM reservations WHERE id = ?1)",
            )
            .bind(id)
            .execute(&mut *conn)
            .await?;
        }
        Ok(released)
    }

    async fn resolve_failed(
        conn: &mut SqliteConnection,
        id: Uuid,
        to: State,
    ) -> Result<bool, StoreError> {
        Ok(sqlx::query(concat!(
            "UPDATE reservations SET state = ?2, version = version + 1, updated_at = ",
            sqlite_now_us!(),
            ", lease_owner = NULL, lease_until = NULL WHERE id = ?1 AND state = 'FAILED'"
        ))
        .bind(id)
        .bind(to.as_str())
        .execute(&mut *conn)
        .await?
        .rows_affected()
            == 1)
    }

    async fn insert_audit(
        conn: &mut SqliteConnection,
        id: Option<Uuid>,
        note: &AuditNote,
    ) -> Result<(), StoreError> {
        sqlx::query(concat!(
            "INSERT INTO admin_audit (reservation_id, principal, at, action, reason, participant) \
             VALUES (?1, ?2, ",
            sqlite_now_us!(),
            ", ?3, ?4, ?5)"
        ))
        .bind(id)
        .bind(&note.principal)
        .bind(note.action.as_str())
        .bind(&note.reason)
        .bind(note.participant.as_deref())
        .execute(&mut *conn)
        .await?;
        Ok(())
    }

    async fn wake_for_retry(
        conn: &mut SqliteConnection,
        target: &RetryTarget,
        lease: WorkLease,
    ) -> Result<Vec<Woken>, StoreError> {
        let found: Vec<(Uuid, bool)> = match target {
            RetryTarget::Reservation(id) => {
                sqlx::query_as(concat!(
                    "SELECT r.id, (r.lease_until IS NULL OR r.lease_until < ",
                    sqlite_now_us!(),
                    ") FROM reservations r WHERE r.id = ?1 AND ",
                    unfinished!()
                ))
                .bind(id)
                .fetch_all(&mut *conn)
                .await?
            }
            RetryTarget::Participant(p) => {
                sqlx::query_as(concat!(
                    "SELECT r.id, (r.lease_until IS NULL OR r.lease_until < ",
                    sqlite_now_us!(),
                    ") FROM reservations r \
                     WHERE (r.id IN (SELECT b.reservation_id FROM branches b \
                                     WHERE b.participant = ?1 AND b.state IN ('PENDING', 'HELD')) \
                            OR (r.payment_participant = ?1 AND r.refund_state = 'PENDING')) AND ",
                    unfinished!()
                ))
                .bind(p)
                .fetch_all(&mut *conn)
                .await?
            }
        };
        for (id, free) in &found {
            sqlx::query(concat!(
                "UPDATE reservations SET next_attempt_at = ",
                sqlite_now_us!(),
                ", lease_owner = CASE WHEN ?2 THEN ?3 ELSE lease_owner END, \
                 lease_until = CASE WHEN ?2 THEN ",
                sqlite_now_us!(),
                " + ?4 ELSE lease_until END WHERE id = ?1"
            ))
            .bind(id)
            .bind(free)
            .bind(lease.owner)
            .bind(micros(lease.duration))
            .execute(&mut *conn)
            .await?;
        }
        Ok(found
            .into_iter()
            .map(|(id, leased)| Woken { id, leased })
            .collect())
    }
}

/// Stuck work (`?1`, `?2` the cursor, `?3` the limit, `?4` the states as a JSON array (empty
/// for all), `?5` a participant or NULL, `?6` older_than in microseconds).
const STUCK: &str = concat!(
    "SELECT ",
    reservation_columns!(),
    " FROM reservations WHERE (created_at, id) < (?1, ?2) \
       AND (json_array_length(?4) = 0 OR state IN (SELECT value FROM json_each(?4))) \
       AND (?5 IS NULL OR id IN (SELECT sb.reservation_id FROM branches sb WHERE sb.participant = ?5)) \
       AND ((state IN ('TRYING', 'HELD') AND expires_at <= ",
    sqlite_now_us!(),
    " - ?6) \
         OR (state IN ('CONFIRMING', 'CANCELLING') \
             AND (next_attempt_at IS NOT NULL OR lease_until IS NULL OR lease_until < ",
    sqlite_now_us!(),
    ") AND updated_at <= ",
    sqlite_now_us!(),
    " - ?6) \
         OR (state IN ('TRYING', 'HELD', 'CONFIRMING', 'CANCELLING') AND updated_at <= ",
    sqlite_now_us!(),
    " - ?6 AND EXISTS (SELECT 1 FROM branches eb WHERE eb.reservation_id = reservations.id \
                       AND eb.generation = reservations.generation AND eb.last_error IS NOT NULL)) \
         OR (state = 'FAILED' AND updated_at <= ",
    sqlite_now_us!(),
    " - ?6)) \
     ORDER BY created_at DESC, id DESC LIMIT ?3"
);

/// [`crate::store::Store::work_of`] (the ids travel as a JSON array of hex strings).
pub(super) async fn work_of(pool: &SqlitePool, ids: &[Uuid]) -> Result<Vec<WorkState>, StoreError> {
    let hex: Vec<String> = ids.iter().map(|id| id.simple().to_string()).collect();
    let rows: Vec<(Uuid, Option<i64>, i32)> = sqlx::query_as(
        "SELECT id, next_attempt_at, recovery_attempts FROM reservations \
         WHERE id IN (SELECT unhex(value) FROM json_each(?1))",
    )
    .bind(sqlx::types::Json(&hex))
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|(reservation_id, next, attempts)| {
            Ok(WorkState {
                reservation_id,
                next_attempt_at: next.map(super::rows::time_of).transpose()?,
                attempts,
            })
        })
        .collect()
}

/// [`crate::store::Store::list_stuck`].
pub(super) async fn list_stuck(
    pool: &SqlitePool,
    q: &StuckQuery,
) -> Result<Vec<Reservation>, StoreError> {
    let (after_ts, after_id) = q.after.unwrap_or_else(crate::store::list::first_cursor);
    let states: Vec<&str> = q.states.iter().map(|s| s.as_str()).collect();
    sqlx::query_as::<_, ReservationRow>(STUCK)
        .bind(micros_of(after_ts))
        .bind(after_id)
        .bind(i64::from(q.limit))
        .bind(sqlx::types::Json(states))
        .bind(q.participant.as_deref())
        .bind(micros(q.older_than))
        .fetch_all(pool)
        .await?
        .into_iter()
        .map(ReservationRow::into_domain)
        .collect()
}

type AuditRow = (
    i64,
    Option<Uuid>,
    String,
    i64,
    String,
    String,
    Option<String>,
);

fn entry(row: AuditRow) -> Result<AuditEntry, StoreError> {
    let (seq, reservation_id, principal, at, action, reason, participant) = row;
    Ok(AuditEntry {
        seq,
        reservation_id,
        principal,
        at: chrono::DateTime::from_timestamp_micros(at)
            .ok_or_else(|| StoreError::Corrupt(format!("audit entry {seq}: time {at}")))?,
        action: AdminAction::parse(&action)
            .ok_or_else(|| StoreError::Corrupt(format!("audit entry {seq}: action {action}")))?,
        reason,
        participant,
    })
}

/// [`crate::store::Store::audit`]: newest first.
pub(super) async fn audit(
    pool: &SqlitePool,
    q: &AuditQuery,
) -> Result<Vec<AuditEntry>, StoreError> {
    let before = q.before.unwrap_or(i64::MAX);
    let rows: Vec<AuditRow> = match q.reservation_id {
        Some(id) => {
            sqlx::query_as(
                "SELECT id, reservation_id, principal, at, action, reason, participant \
                 FROM admin_audit WHERE reservation_id = ?1 AND id < ?2 ORDER BY id DESC LIMIT ?3",
            )
            .bind(id)
            .bind(before)
            .bind(i64::from(q.limit))
            .fetch_all(pool)
            .await?
        }
        None => {
            sqlx::query_as(
                "SELECT id, reservation_id, principal, at, action, reason, participant \
                 FROM admin_audit WHERE id < ?1 ORDER BY id DESC LIMIT ?2",
            )
            .bind(before)
            .bind(i64::from(q.limit))
            .fetch_all(pool)
            .await?
        }
    };
    rows.into_iter().map(entry).collect()
}

/// [`crate::store::Store::audit_of`]: oldest first; the ids travel as a JSON array of hex
/// strings.
pub(super) async fn audit_of(
    pool: &SqlitePool,
    ids: &[Uuid],
) -> Result<Vec<AuditEntry>, StoreError> {
    let ids: Vec<String> = ids.iter().map(|id| id.simple().to_string()).collect();
    let rows: Vec<AuditRow> = sqlx::query_as(
        "SELECT id, reservation_id, principal, at, action, reason, participant FROM admin_audit \
         WHERE reservation_id IN (SELECT unhex(value) FROM json_each(?1)) ORDER BY id",
    )
    .bind(sqlx::types::Json(&ids))
    .fetch_all(pool)
    .await?;
    rows.into_iter().map(entry).collect()
}
