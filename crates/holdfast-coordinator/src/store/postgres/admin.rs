//! PostgreSQL's statements for the operator's control plane: [`AdminSql`] (the writes of
//! `store/admin.rs`), the stuck-work listing and the audit log reads.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Postgres;
use sqlx::postgres::{PgConnection, PgPool};
use uuid::Uuid;

use super::rows::{ReservationRow, millis};
use crate::domain::admin::{
    AdminAction, AuditEntry, AuditNote, AuditQuery, RetryTarget, StuckQuery, WorkState,
};
use crate::domain::{Reservation, State};
use crate::store::admin::{AdminSql, Woken};
use crate::store::{StoreError, WorkLease};

/// Retry's statement over the reservations `$target` selects: those with unfinished work get
/// their backoff cleared, and the lease when it is free. (`$1` id, `$2` participant, `$3`
/// lease owner, `$4` lease milliseconds.)
macro_rules! wake {
    ($target:expr) => {
        concat!(
            "WITH t AS ( \
                SELECT r.id, (r.lease_until IS NULL OR r.lease_until < clock_timestamp()) AS free \
                FROM reservations r WHERE ",
            $target,
            " AND (r.state IN ('TRYING', 'CONFIRMING', 'CANCELLING') \
                   OR r.refund_state = 'PENDING' \
                   OR (r.state = 'EXPIRED' AND r.payment_ref IS NOT NULL AND r.refund_id IS NULL) \
                   OR EXISTS (SELECT 1 FROM extra_payments e WHERE e.reservation_id = r.id \
                              AND e.refund_state = 'PENDING')) \
                FOR UPDATE) \
             UPDATE reservations r SET next_attempt_at = clock_timestamp(), \
                lease_owner = CASE WHEN t.free THEN $3 ELSE r.lease_owner END, \
                lease_until = CASE WHEN t.free \
                    THEN clock_timestamp() + $4 * interval '1 millisecond' ELSE r.lease_until END \
             FROM t WHERE r.id = t.id \
             RETURNING r.id, t.free"
        )
    };
}

#[async_trait]
impl AdminSql for Postgres {
    async fn release_trying(
        conn: &mut PgConnection,
        id: Uuid,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let released = sqlx::query(
            "UPDATE reservations SET state = 'CANCELLING', release_outcome = 'CANCELLED', \
             cancel_reason = $2, version = version + 1, updated_at = clock_timestamp() \
             WHERE id = $1 AND state = 'TRYING'",
        )
        .bind(id)
        .bind(reason)
        .execute(&mut *conn)
        .await?
        .rows_affected()
            == 1;
        if released {
            sqlx::query(
                "UPDATE branches b SET attempts = greatest(b.attempts, 1) \
                 FROM reservations r WHERE r.id = $1 AND b.reservation_id = r.id \
                   AND b.generation = r.generation AND b.state = 'PENDING'",
            )
            .bind(id)
            .execute(&mut *conn)
            .await?;
        }
        Ok(released)
    }

    async fn resolve_failed(
        conn: &mut PgConnection,
        id: Uuid,
        to: State,
    ) -> Result<bool, StoreError> {
        Ok(sqlx::query(
            "UPDATE reservations SET state = $2, version = version + 1, \
             updated_at = clock_timestamp(), lease_owner = NULL, lease_until = NULL \
             WHERE id = $1 AND state = 'FAILED'",
        )
        .bind(id)
        .bind(to.as_str())
        .execute(&mut *conn)
        .await?
        .rows_affected()
            == 1)
    }

    async fn insert_audit(
        conn: &mut PgConnection,
        id: Option<Uuid>,
        note: &AuditNote,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO admin_audit (reservation_id, principal, action, reason, participant) \
             VALUES ($1, $2, $3, $4, $5)",
        )
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
        conn: &mut PgConnection,
        target: &RetryTarget,
        lease: WorkLease,
    ) -> Result<Vec<Woken>, StoreError> {
        let (id, participant) = match target {
            RetryTarget::Reservation(id) => (Some(*id), None),
            RetryTarget::Participant(p) => (None, Some(p.as_str())),
        };
        let sql = if id.is_some() {
            wake!("r.id = $1 AND $2::text IS NULL")
        } else {
            wake!(
                "$1::uuid IS NULL AND (r.id IN (SELECT b.reservation_id FROM branches b \
                           WHERE b.participant = $2 AND b.state IN ('PENDING', 'HELD')) \
                  OR (r.payment_participant = $2 AND r.refund_state = 'PENDING'))"
            )
        };
        let rows: Vec<(Uuid, bool)> = sqlx::query_as(sql)
            .bind(id)
            .bind(participant)
            .bind(lease.owner)
            .bind(millis(lease.duration))
            .fetch_all(&mut *conn)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(id, leased)| Woken { id, leased })
            .collect())
    }
}

/// Stuck work (`$3` the limit; `$1`, `$2` the cursor; `$4` the states, empty for all; `$5` a
/// participant or NULL; `$6` older_than in milliseconds).
const STUCK: &str = concat!(
    select_reservations!(),
    "WHERE (created_at, id) < ($1, $2) \
       AND (cardinality($4::text[]) = 0 OR reservations.state = ANY($4)) \
       AND ($5::text IS NULL OR reservations.id IN \
            (SELECT sb.reservation_id FROM branches sb WHERE sb.participant = $5)) \
       AND ((reservations.state IN ('TRYING', 'HELD') \
             AND expires_at <= clock_timestamp() - $6 * interval '1 millisecond') \
         OR (reservations.state IN ('CONFIRMING', 'CANCELLING') \
             AND (next_attempt_at IS NOT NULL OR lease_until IS NULL \
                  OR lease_until < clock_timestamp()) \
             AND updated_at <= clock_timestamp() - $6 * interval '1 millisecond') \
         OR (reservations.state IN ('TRYING', 'HELD', 'CONFIRMING', 'CANCELLING') \
             AND updated_at <= clock_timestamp() - $6 * interval '1 millisecond' \
             AND EXISTS (SELECT 1 FROM branches eb WHERE eb.reservation_id = reservations.id \
                         AND eb.generation = reservations.generation \
                         AND eb.last_error IS NOT NULL)) \
         OR (reservations.state = 'FAILED' \
             AND updated_at <= clock_timestamp() - $6 * interval '1 millisecond')) \
     ORDER BY created_at DESC, id DESC LIMIT $3"
);

/// [`crate::store::Store::work_of`].
pub(super) async fn work_of(pool: &PgPool, ids: &[Uuid]) -> Result<Vec<WorkState>, StoreError> {
    let rows: Vec<(Uuid, Option<DateTime<Utc>>, i32)> = sqlx::query_as(
        "SELECT id, next_attempt_at, recovery_attempts FROM reservations WHERE id = ANY($1)",
    )
    .bind(ids)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(reservation_id, next_attempt_at, attempts)| WorkState {
            reservation_id,
            next_attempt_at,
            attempts,
        })
        .collect())
}

/// [`crate::store::Store::list_stuck`].
pub(super) async fn list_stuck(
    pool: &PgPool,
    q: &StuckQuery,
) -> Result<Vec<Reservation>, StoreError> {
    let (after_ts, after_id) = q.after.unwrap_or_else(crate::store::list::first_cursor);
    let states: Vec<&str> = q.states.iter().map(|s| s.as_str()).collect();
    sqlx::query_as::<_, ReservationRow>(STUCK)
        .bind(after_ts)
        .bind(after_id)
        .bind(i64::from(q.limit))
        .bind(states)
        .bind(q.participant.as_deref())
        .bind(millis(q.older_than))
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
    DateTime<Utc>,
    String,
    String,
    Option<String>,
);

fn entry(
    (seq, reservation_id, principal, at, action, reason, participant): AuditRow,
) -> Result<AuditEntry, StoreError> {
    Ok(AuditEntry {
        seq,
        reservation_id,
        principal,
        at,
        action: AdminAction::parse(&action)
            .ok_or_else(|| StoreError::Corrupt(format!("audit entry {seq}: action {action}")))?,
        reason,
        participant,
    })
}

/// [`crate::store::Store::audit`]: newest first.
pub(super) async fn audit(pool: &PgPool, q: &AuditQuery) -> Result<Vec<AuditEntry>, StoreError> {
    let sql = if q.reservation_id.is_some() {
        "SELECT id, reservation_id, principal, at, action, reason, participant FROM admin_audit \
         WHERE reservation_id = $1 AND id < $2 ORDER BY reservation_id DESC, id DESC LIMIT $3"
    } else {
        "SELECT id, reservation_id, principal, at, action, reason, participant FROM admin_audit \
         WHERE ($1::uuid IS NULL) AND id < $2 ORDER BY id DESC LIMIT $3"
    };
    sqlx::query_as::<_, AuditRow>(sql)
        .bind(q.reservation_id)
        .bind(q.before.unwrap_or(i64::MAX))
        .bind(i64::from(q.limit))
        .fetch_all(pool)
        .await?
        .into_iter()
        .map(entry)
        .collect()
}

/// [`crate::store::Store::audit_of`]: oldest first.
pub(super) async fn audit_of(pool: &PgPool, ids: &[Uuid]) -> Result<Vec<AuditEntry>, StoreError> {
    sqlx::query_as::<_, AuditRow>(
        "SELECT id, reservation_id, principal, at, action, reason, participant FROM admin_audit \
         WHERE reservation_id = ANY($1) ORDER BY id",
    )
    .bind(ids)
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(entry)
    .collect()
}
