//! Reading reservations on PostgreSQL: the column lists every statement that answers a
//! reservation ends with, the row type (a reservation with its branches as parallel arrays,
//! one round trip) and its conversion into the shared stored shape ([`crate::store::record`]),
//! and `load`. (List, and the stamps a watch polls, are `list.rs`.)

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgConnection;
use sqlx::types::Json;
use uuid::Uuid;

use crate::domain::{Branch, Reservation};
use crate::store::StoreError;
use crate::store::record::{StoredBranch, StoredReservation};

/// Columns of `reservations` every read needs, plus whether a HELD one lapsed (lazy expiry).
/// Macros rather than consts so queries stay `&'static str` (sqlx refuses built strings).
macro_rules! reservation_columns {
    () => {
        "id, request_id, holder, state, release_outcome, owner, token_digest, token_key_id, ttl_ms, \
         created_at, expires_at, extensions_used, labels, rejection_participant, \
         rejection_resource, rejection_reason, late_payment_honored, version, \
         payment_participant, payment_ref, payment_amount_minor, payment_currency, \
         refund_id, refund_state, refund_reason, refund_failure, generation, \
         (reservations.state = 'HELD' AND expires_at <= clock_timestamp()) AS lapsed"
    };
}

/// A reservation's branches as parallel arrays, aggregated in the order of their input: a
/// subquery `br` ordered by `position` (canonical order) with nothing between it and the
/// aggregate, which PostgreSQL then keeps (its documented way to order an aggregate's input).
/// One sort, or an index scan on `branches_pkey` and none, where an `ORDER BY` in each of the
/// nine aggregates sorted nine times per reservation (PostgreSQL 15 does not share them).
/// `ReservationRow::take_branches` checks the order it gets.
macro_rules! branch_arrays {
    () => {
        "array_agg(br.branch_id) AS b_branch_ids, array_agg(br.participant) AS b_participants, \
         array_agg(br.resource) AS b_resources, array_agg(br.quantity) AS b_quantities, \
         array_agg(br.during_start) AS b_starts, array_agg(br.during_end) AS b_ends, \
         array_agg(br.state) AS b_states, array_agg(br.attempts) AS b_attempts, \
         array_agg(br.last_error) AS b_errors"
    };
}

/// `b`: the stored branches of one reservation generation as [`branch_arrays!`], read
/// through the branches' primary key beside the row that names them (`$id`, `$generation`:
/// that row's columns), for a `FROM` clause.
/// With `$only_if` (a boolean column of that row), the branches are read only where it is true
/// (a one-time filter: no index scan at all where it is false) and the arrays are NULL elsewhere.
macro_rules! branches_of {
    ($id:literal, $generation:literal) => {
        branches_of!($id, $generation, "true")
    };
    ($id:literal, $generation:literal, $only_if:literal) => {
        concat!(
            " CROSS JOIN LATERAL (SELECT ",
            branch_arrays!(),
            " FROM (SELECT * FROM branches \
                    WHERE branches.reservation_id = ",
            $id,
            " AND branches.generation = ",
            $generation,
            " AND ",
            $only_if,
            " ORDER BY position) br) b "
        )
    };
}

/// A reservation row with its current generation's branches as parallel arrays, in canonical
/// order: one round trip reads it all. Append the WHERE clause.
macro_rules! select_reservations {
    () => {
        concat!(
            "SELECT ",
            reservation_columns!(),
            ", b.* FROM reservations",
            branches_of!("reservations.id", "reservations.generation")
        )
    };
}

/// The end of a statement that wrote a reservation: the row as written (CTE `w`, `RETURNING
/// reservation_columns!()`) with its current generation's branches, where branch rows the same
/// statement updated (CTE `upd`, `RETURNING reservation_id, generation, position, state,
/// attempts, last_error`) replace the statement's snapshot of them. The after-image in the
/// write's own round trip: no re-read.
macro_rules! select_written {
    () => {
        concat!(
            "SELECT w.*, b.* FROM w CROSS JOIN LATERAL (SELECT ",
            branch_arrays!(),
            " FROM (SELECT br.branch_id, br.participant, br.resource, br.quantity, \
                       br.during_start, br.during_end, coalesce(u.state, br.state) AS state, \
                       coalesce(u.attempts, br.attempts) AS attempts, \
                       CASE WHEN u.position IS NULL THEN br.last_error ELSE u.last_error END \
                           AS last_error \
                    FROM branches br LEFT JOIN upd u ON u.reservation_id = br.reservation_id \
                         AND u.generation = br.generation AND u.position = br.position \
                    WHERE br.reservation_id = w.id AND br.generation = w.generation \
                    ORDER BY br.position) br) b"
        )
    };
}

/// A duration in whole milliseconds (saturating), as PostgreSQL statements take it.
pub(super) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A reservation row; the `b_*` arrays are its branches, absent when a statement answers the
/// row alone.
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
    created_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
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
    #[sqlx(default)]
    b_branch_ids: Option<Vec<Uuid>>,
    #[sqlx(default)]
    b_participants: Option<Vec<String>>,
    #[sqlx(default)]
    b_resources: Option<Vec<String>>,
    #[sqlx(default)]
    b_quantities: Option<Vec<i64>>,
    #[sqlx(default)]
    b_starts: Option<Vec<Option<DateTime<Utc>>>>,
    #[sqlx(default)]
    b_ends: Option<Vec<Option<DateTime<Utc>>>>,
    #[sqlx(default)]
    b_states: Option<Vec<String>>,
    #[sqlx(default)]
    b_attempts: Option<Vec<i32>>,
    #[sqlx(default)]
    b_errors: Option<Vec<Option<String>>>,
}

impl ReservationRow {
    /// The reservation's id and generation: whose branches the arrays are.
    pub(super) fn generation_key(&self) -> (Uuid, i32) {
        (self.id, self.generation)
    }

    /// The branches from the parallel arrays (none when the statement read none).
    pub(super) fn take_branches(&mut self) -> Result<Vec<Branch>, StoreError> {
        let ids = self.b_branch_ids.take().unwrap_or_default();
        let n = ids.len();
        let participants = self.b_participants.take().unwrap_or_default();
        let resources = self.b_resources.take().unwrap_or_default();
        let quantities = self.b_quantities.take().unwrap_or_default();
        let starts = self.b_starts.take().unwrap_or_default();
        let ends = self.b_ends.take().unwrap_or_default();
        let states = self.b_states.take().unwrap_or_default();
        let attempts = self.b_attempts.take().unwrap_or_default();
        let errors = self.b_errors.take().unwrap_or_default();
        if [
            participants.len(),
            resources.len(),
            quantities.len(),
            starts.len(),
            ends.len(),
            states.len(),
            attempts.len(),
            errors.len(),
        ]
        .iter()
        .any(|len| *len != n)
        {
            return Err(StoreError::Corrupt(format!(
                "reservation {}: branch columns of unequal length",
                self.id
            )));
        }
        // The statements aggregate in canonical order (`branch_arrays!`); a reservation read
        // in another order would be placed and released out of it.
        let in_order = participants
            .iter()
            .zip(&resources)
            .zip(participants.iter().zip(&resources).skip(1))
            .all(|(before, after)| before <= after);
        if !in_order {
            return Err(StoreError::Corrupt(format!(
                "reservation {}: branches read out of canonical order",
                self.id
            )));
        }
        let mut branches = Vec::with_capacity(n);
        for (i, branch_id) in ids.into_iter().enumerate() {
            branches.push(
                StoredBranch {
                    branch_id,
                    participant: participants[i].clone(),
                    resource: resources[i].clone(),
                    quantity: quantities[i],
                    during_start: starts[i],
                    during_end: ends[i],
                    state: states[i].clone(),
                    attempts: attempts[i],
                    last_error: errors[i].clone(),
                }
                .into_domain()?,
            );
        }
        Ok(branches)
    }

    pub(super) fn into_domain(mut self) -> Result<Reservation, StoreError> {
        let branches = self.take_branches()?;
        self.into_domain_with(branches)
    }

    /// The reservation with `branches` (read by another row of the same statement), the
    /// row's own arrays ignored.
    pub(super) fn into_domain_with(self, branches: Vec<Branch>) -> Result<Reservation, StoreError> {
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
            created_at: self.created_at,
            expires_at: self.expires_at,
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

/// Reads one reservation with its branches, optionally locking its row.
pub(super) async fn load(
    conn: &mut PgConnection,
    id: Uuid,
    lock: bool,
) -> Result<Option<Reservation>, StoreError> {
    let sql = if lock {
        concat!(
            select_reservations!(),
            "WHERE id = $1 FOR UPDATE OF reservations"
        )
    } else {
        concat!(select_reservations!(), "WHERE id = $1")
    };
    sqlx::query_as::<_, ReservationRow>(sql)
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?
        .map(ReservationRow::into_domain)
        .transpose()
}
