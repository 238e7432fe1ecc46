//! SQLite's statements for the shared decision, retake and outcome flows
//! ([`ReservationSql`]). Every write runs inside `BEGIN IMMEDIATE`: the database write lock
//! stands in for PostgreSQL's row locks, so "locking" a row is reading it, and a decision's
//! lease is taken by its own statement after the write (`take_lease`).

use std::time::Duration;

use async_trait::async_trait;
use rusqlite::params;
use uuid::Uuid;

use super::rows::{self, micros};
use super::writer::{Conn, OnWriter, all, exec, one, optional};
use crate::domain::policy::Backoff;
use crate::domain::{Payment, Reservation, State};
use crate::store::sql::{Applied, ReservationSql};
use crate::store::{BranchReport, RefundAnswer, StoreError, WorkLease};

/// A conditional write's row count as a yes/no.
fn one_row(changed: usize) -> bool {
    changed == 1
}

#[async_trait]
impl ReservationSql for OnWriter {
    type Pool = Conn;
    type Connection = Conn;
    type Write = crate::db::SyncWrite;

    async fn begin_write(conn: &Conn) -> Result<Self::Write, sqlx::Error> {
        crate::db::SyncWrite::begin(conn)
    }

    async fn load(conn: &mut Conn, id: Uuid) -> Result<Option<Reservation>, StoreError> {
        rows::load_on_writer(conn, id)
    }

    async fn load_locked(conn: &mut Conn, id: Uuid) -> Result<Option<Reservation>, StoreError> {
        // The write lock stands in for PostgreSQL's row lock: nothing changes the row between
        // this read and the conditional UPDATE that follows.
        rows::load_on_writer(conn, id)
    }

    async fn repeats_last_extend(
        conn: &mut Conn,
        id: Uuid,
        request_id: &str,
    ) -> Result<bool, StoreError> {
        one(
            conn,
            "SELECT coalesce(last_extend_request_id = ?2, 0) FROM reservations WHERE id = ?1",
            params![id, request_id],
            |r| r.get(0),
        )
    }

    async fn confirm_held(
        conn: &mut Conn,
        id: Uuid,
        _lease: WorkLease,
    ) -> Result<Applied, StoreError> {
        let confirmed = one_row(exec(
            conn,
            concat!(
                "UPDATE reservations SET state = 'CONFIRMING', version = version + 1, \
                 updated_at = ",
                sqlite_now_us!(),
                " WHERE id = ?1 AND state = 'HELD' AND ",
                sqlite_now_us!(),
                " < expires_at"
            ),
            params![id],
        )?);
        Ok(unleased_if(confirmed))
    }

    async fn release_held(
        conn: &mut Conn,
        id: Uuid,
        to: State,
        release_outcome: Option<State>,
        reason: Option<&str>,
        _lease: WorkLease,
    ) -> Result<Applied, StoreError> {
        let released = one_row(exec(
            conn,
            concat!(
                "UPDATE reservations SET state = ?2, release_outcome = ?3, cancel_reason = ?4, \
                 version = version + 1, updated_at = ",
                sqlite_now_us!(),
                " WHERE id = ?1 AND state = 'HELD'"
            ),
            params![id, to.as_str(), release_outcome.map(State::as_str), reason],
        )?);
        Ok(unleased_if(released))
    }

    async fn honor_late(conn: &mut Conn, id: Uuid) -> Result<bool, StoreError> {
        Ok(one_row(exec(
            conn,
            concat!(
                "UPDATE reservations SET state = 'CONFIRMING', late_payment_honored = 1, \
                 version = version + 1, updated_at = ",
                sqlite_now_us!(),
                " WHERE id = ?1 AND state = 'HELD'"
            ),
            params![id],
        )?))
    }

    async fn expire_hold(conn: &mut Conn, id: Uuid) -> Result<bool, StoreError> {
        Ok(one_row(exec(
            conn,
            concat!(
                "UPDATE reservations SET state = 'CANCELLING', release_outcome = 'EXPIRED', \
                 version = version + 1, updated_at = ",
                sqlite_now_us!(),
                " WHERE id = ?1 AND state = 'HELD' AND expires_at <= ",
                sqlite_now_us!()
            ),
            params![id],
        )?))
    }

    async fn record_payment(conn: &mut Conn, id: Uuid, p: &Payment) -> Result<(), StoreError> {
        exec(
            conn,
            "UPDATE reservations SET payment_participant = ?2, payment_ref = ?3, \
             payment_amount_minor = ?4, payment_currency = ?5 \
             WHERE id = ?1 AND payment_ref IS NULL",
            params![
                id,
                &p.participant,
                &p.payment_ref,
                p.amount_minor,
                &p.currency
            ],
        )?;
        Ok(())
    }

    async fn record_refund(conn: &mut Conn, id: Uuid, reason: &str) -> Result<bool, StoreError> {
        Ok(one_row(exec(
            conn,
            concat!(
                "UPDATE reservations SET refund_id = ?2, refund_state = 'PENDING', refund_reason = ?3, \
                 next_attempt_at = ",
                sqlite_now_us!(),
                ", version = version + 1, updated_at = ",
                sqlite_now_us!(),
                " WHERE id = ?1 AND refund_id IS NULL AND payment_ref IS NOT NULL"
            ),
            params![id, Uuid::new_v4(), reason],
        )?))
    }

    async fn mark_retake(conn: &mut Conn, id: Uuid) -> Result<bool, StoreError> {
        Ok(one_row(exec(
            conn,
            concat!(
                "UPDATE reservations SET version = version + 1, updated_at = ",
                sqlite_now_us!(),
                " WHERE id = ?1 AND state = 'EXPIRED' AND payment_ref IS NULL"
            ),
            params![id],
        )?))
    }

    async fn extend_held(
        conn: &mut Conn,
        id: Uuid,
        by: Duration,
        request_id: Option<&str>,
    ) -> Result<bool, StoreError> {
        Ok(one_row(exec(
            conn,
            concat!(
                "UPDATE reservations SET expires_at = expires_at + ?2, \
                 extensions_used = extensions_used + 1, version = version + 1, \
                 last_extend_request_id = ?3, updated_at = ",
                sqlite_now_us!(),
                " WHERE id = ?1 AND state = 'HELD' AND ",
                sqlite_now_us!(),
                " < expires_at"
            ),
            params![id, micros(by), request_id],
        )?))
    }

    async fn take_lease(conn: &mut Conn, id: Uuid, lease: WorkLease) -> Result<bool, StoreError> {
        Ok(one_row(exec(
            conn,
            concat!(
                "UPDATE reservations SET lease_owner = ?2, lease_until = ",
                sqlite_now_us!(),
                " + ?3 WHERE id = ?1 AND (lease_owner IS NULL OR lease_owner = ?2 \
                                           OR lease_until IS NULL OR lease_until < ",
                sqlite_now_us!(),
                ")"
            ),
            params![id, lease.owner, micros(lease.duration)],
        )?))
    }

    async fn apply_reports(
        conn: &mut Conn,
        id: Uuid,
        reports: &[BranchReport],
    ) -> Result<(), StoreError> {
        // Matches branch rows of every generation, as PostgreSQL does: branch ids are unique
        // per generation.
        for r in reports {
            exec(
                conn,
                "UPDATE branches SET state = ?3, attempts = attempts + 1, last_error = ?4 \
                 WHERE reservation_id = ?1 AND branch_id = ?2",
                params![id, r.branch_id, r.state.as_str(), r.error.as_deref()],
            )?;
        }
        Ok(())
    }

    async fn renew_generation(conn: &mut Conn, id: Uuid) -> Result<Option<i32>, StoreError> {
        optional(
            conn,
            concat!(
                "UPDATE reservations SET generation = generation + 1, \
             expires_at = ",
                sqlite_now_us!(),
                " + ttl_ms * 1000, version = version + 1, updated_at = ",
                sqlite_now_us!(),
                " WHERE id = ?1 AND state = 'EXPIRED' RETURNING generation"
            ),
            params![id],
            |r| r.get(0),
        )
    }

    async fn insert_retake_branches(
        conn: &mut Conn,
        id: Uuid,
        generation: i32,
    ) -> Result<(), StoreError> {
        let participants: Vec<String> = all(
            conn,
            "SELECT DISTINCT participant FROM branches WHERE reservation_id = ?1 AND generation = ?2",
            params![id, generation - 1],
            |r| r.get(0),
        )?;
        for participant in participants {
            exec(
                conn,
                "INSERT INTO branches (reservation_id, generation, position, branch_id, participant, \
                                       resource, quantity, during_start, during_end, state) \
                 SELECT reservation_id, ?2, position, ?3, participant, resource, quantity, \
                        during_start, during_end, 'PENDING' \
                 FROM branches WHERE reservation_id = ?1 AND generation = ?2 - 1 AND participant = ?4",
                params![id, generation, Uuid::new_v4(), &participant],
            )?;
        }
        Ok(())
    }

    async fn honor_retake(conn: &mut Conn, id: Uuid) -> Result<bool, StoreError> {
        Ok(one_row(exec(
            conn,
            concat!(
                "UPDATE reservations SET state = 'CONFIRMING', late_payment_honored = 1, \
                 version = version + 1, updated_at = ",
                sqlite_now_us!(),
                " WHERE id = ?1 AND state = 'EXPIRED' AND refund_id IS NULL"
            ),
            params![id],
        )?))
    }

    async fn release_retake(conn: &mut Conn, id: Uuid) -> Result<bool, StoreError> {
        Ok(one_row(exec(
            conn,
            concat!(
                "UPDATE reservations SET state = 'CANCELLING', release_outcome = 'EXPIRED', \
                 version = version + 1, updated_at = ",
                sqlite_now_us!(),
                " WHERE id = ?1 AND state = 'EXPIRED' AND refund_id IS NULL"
            ),
            params![id],
        )?))
    }

    async fn record_refund_attempt(
        conn: &mut Conn,
        id: Uuid,
        answer: &RefundAnswer,
        backoff: Backoff,
    ) -> Result<(), StoreError> {
        // ?2: the state the refund settles on (NULL: still pending, retried by the backoff).
        exec(
            conn,
            concat!(
                "UPDATE reservations SET \
               refund_state = coalesce(?2, refund_state), \
               refund_failure = coalesce(?5, refund_failure), \
               version = version + CASE WHEN ?2 IS NOT NULL THEN 1 ELSE 0 END, \
               lease_owner = NULL, lease_until = NULL, ",
                backoff_next_attempt!("?2 IS NOT NULL", "?3", "?4"),
                " WHERE id = ?1 AND refund_state = 'PENDING'"
            ),
            params![
                id,
                answer.settles_on(),
                micros(backoff.base) as f64,
                micros(backoff.cap) as f64,
                answer.failure()
            ],
        )?;
        Ok(())
    }
}

/// A decision's UPDATE on SQLite, which leaves the lease to the flow's `take_lease`.
fn unleased_if(written: bool) -> Applied {
    if written {
        Applied::Written { leased: false }
    } else {
        Applied::Missed
    }
}
