//! Recording participants' answers on PostgreSQL, for many reservations in one statement:
//! `record_held` (`TRYING -> HELD`), `record_rejected` (a stopped placement: `TRYING ->
//! CANCELLING`, or `-> REJECTED` when nothing was placed) and `record_phase` (a Confirm or
//! Cancel fan-out's answers, finishing it or scheduling its retry). Each statement answers
//! with the reservations as written; `group_commit.rs` decides which calls share one.

use std::collections::HashMap;

use sqlx::Postgres;
use sqlx::postgres::PgPool;
use uuid::Uuid;

use super::rows::{ReservationRow, millis};
use crate::domain::policy::Backoff;
use crate::domain::{Rejection, Reservation, State};
use crate::store::outcome::placed_nothing;
use crate::store::sql::ReservationSql;
use crate::store::{BranchReport, PhaseRecorded, StoreError};

/// One `record_phase` call's arguments.
pub(super) struct PhaseWrite {
    /// This call's own id, recorded on the row with its write (`last_phase_write`): a rerun
    /// of a batch whose commit acknowledgement was lost finds it there and applies nothing.
    pub write_id: Uuid,
    pub id: Uuid,
    pub from: State,
    pub reports: Vec<BranchReport>,
    pub finish: Option<State>,
    pub backoff: Backoff,
}

/// Several reservations' reports as parallel arrays (reservation, branch, state, error), for
/// `UNNEST`.
#[allow(clippy::type_complexity)]
fn reports_of<'a>(
    jobs: impl Iterator<Item = (Uuid, &'a [BranchReport])>,
) -> (Vec<Uuid>, Vec<Uuid>, Vec<&'a str>, Vec<Option<&'a str>>) {
    let (mut owners, mut branch_ids, mut states, mut errors) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (id, reports) in jobs {
        for r in reports {
            owners.push(id);
            branch_ids.push(r.branch_id);
            states.push(r.state.as_str());
            errors.push(r.error.as_deref());
        }
    }
    (owners, branch_ids, states, errors)
}

/// Reads a reservation the caller just wrote or was told of, on a pooled connection.
async fn load_existing(pool: &PgPool, id: Uuid) -> Result<Reservation, StoreError> {
    Postgres::load_existing(&mut *pool.acquire().await?, id).await
}

/// The branch answers of the reservations a `w` CTE moved out of `TRYING` (`$2`-`$5`:
/// `reports_of`'s arrays), then the moved rows with their branches: the tail of each batch
/// statement out of `TRYING`.
macro_rules! moved_with_reports {
    () => {
        concat!(
            "), upd AS ( \
                UPDATE branches b SET state = u.state, attempts = b.attempts + 1, \
                       last_error = u.error \
                FROM UNNEST($2::uuid[], $3::uuid[], $4::text[], $5::text[]) \
                     AS u(reservation_id, branch_id, state, error), w \
                WHERE w.id = u.reservation_id AND b.reservation_id = w.id \
                  AND b.branch_id = u.branch_id \
                RETURNING b.reservation_id, b.generation, b.position, b.state, b.attempts, \
                          b.last_error) ",
            select_written!()
        )
    };
}

/// The rows a batch statement wrote, by reservation id.
fn by_id(rows: Vec<ReservationRow>) -> Result<HashMap<Uuid, Reservation>, StoreError> {
    rows.into_iter()
        .map(|row| row.into_domain().map(|r| (r.id, r)))
        .collect()
}

/// `TRYING -> HELD` for each reservation of `jobs` (distinct ids) in one statement: the
/// transition gates each one's branch updates, so they happen together or not at all. Returns
/// the reservations that moved, as written.
///
/// The rows are found by id, never by state: `state || ''` keeps `state = 'TRYING'` from
/// matching an index. Every reservation passes through `TRYING`, so until VACUUM the state
/// indexes hold a dead `TRYING` entry for each one, which a bitmap scan visits, every one,
/// every call. A generic plan takes that path when the statistics show almost no live
/// `TRYING` rows (`tests/store` `plans.rs` checks the statement finds its rows by id).
pub(super) async fn record_held_batch(
    pool: &PgPool,
    jobs: &[(Uuid, &[BranchReport])],
) -> Result<HashMap<Uuid, Reservation>, StoreError> {
    let ids: Vec<Uuid> = jobs.iter().map(|(id, _)| *id).collect();
    let (owners, branch_ids, states, errors) =
        reports_of(jobs.iter().map(|(id, reports)| (*id, *reports)));
    let rows = sqlx::query_as::<_, ReservationRow>(concat!(
        "WITH w AS ( \
            UPDATE reservations SET state = 'HELD', version = version + 1, \
                   updated_at = clock_timestamp(), lease_owner = NULL, lease_until = NULL \
            WHERE id = ANY($1::uuid[]) AND state || '' = 'TRYING' RETURNING ",
        reservation_columns!(),
        moved_with_reports!()
    ))
    .bind(&ids)
    .bind(&owners)
    .bind(&branch_ids)
    .bind(&states)
    .bind(&errors)
    .fetch_all(pool)
    .await?;
    by_id(rows)
}

/// A `record_held` or `record_rejected` answer: the reservation as recorded, or (it had left
/// TRYING meanwhile) as it is now.
pub(super) async fn from_trying_answer(
    pool: &PgPool,
    id: Uuid,
    recorded: Option<Reservation>,
) -> Result<Reservation, StoreError> {
    match recorded {
        Some(r) => Ok(r),
        None => load_existing(pool, id).await,
    }
}

/// One `record_held` on its own.
pub(super) async fn record_held_alone(
    pool: &PgPool,
    id: Uuid,
    reports: &[BranchReport],
) -> Result<Reservation, StoreError> {
    let mut done = record_held_batch(pool, &[(id, reports)]).await?;
    from_trying_answer(pool, id, done.remove(&id)).await
}

/// One `record_rejected` call's arguments.
pub(super) struct StoppedPlacement<'a> {
    pub id: Uuid,
    pub rejection: Option<&'a Rejection>,
    pub reports: &'a [BranchReport],
}

/// A stopped placement recorded for each of `jobs` (distinct ids) in one statement: `TRYING ->
/// CANCELLING` ending `REJECTED`, or `TRYING -> REJECTED` with its lease freed when nothing was
/// placed (`outcome::placed_nothing`), with the rejection and the answers; rows left TRYING
/// meanwhile are not written. Rows are taken in id order, found by id, never by state (see
/// [`record_held_batch`]). Returns the reservations that moved, as written.
pub(super) async fn record_rejected_batch(
    pool: &PgPool,
    jobs: &[StoppedPlacement<'_>],
) -> Result<HashMap<Uuid, Reservation>, StoreError> {
    let mut jobs: Vec<&StoppedPlacement<'_>> = jobs.iter().collect();
    jobs.sort_by_key(|j| j.id);
    let ids: Vec<Uuid> = jobs.iter().map(|j| j.id).collect();
    let (mut participants, mut resources, mut reasons) = (Vec::new(), Vec::new(), Vec::new());
    for j in &jobs {
        participants.push(j.rejection.map(|r| r.participant.as_str()));
        resources.push(j.rejection.map(|r| r.resource.as_str()));
        reasons.push(j.rejection.map(|r| r.reason.as_str()));
    }
    let finals: Vec<bool> = jobs.iter().map(|j| placed_nothing(j.reports)).collect();
    let (owners, branch_ids, states, errors) = reports_of(jobs.iter().map(|j| (j.id, j.reports)));
    let rows = sqlx::query_as::<_, ReservationRow>(concat!(
        "WITH w AS ( \
            UPDATE reservations SET \
                   state = CASE WHEN j.placed_nothing THEN 'REJECTED' ELSE 'CANCELLING' END, \
                   release_outcome = 'REJECTED', rejection_participant = j.participant, \
                   rejection_resource = j.resource, rejection_reason = j.reason, \
                   lease_owner = CASE WHEN j.placed_nothing THEN NULL ELSE lease_owner END, \
                   lease_until = CASE WHEN j.placed_nothing THEN NULL ELSE lease_until END, \
                   version = version + 1, updated_at = clock_timestamp() \
            FROM UNNEST($1::uuid[], $6::text[], $7::text[], $8::text[], $9::bool[]) \
                 AS j(reservation_id, participant, resource, reason, placed_nothing) \
            WHERE reservations.id = j.reservation_id AND reservations.state || '' = 'TRYING' \
            RETURNING ",
        reservation_columns!(),
        moved_with_reports!()
    ))
    .bind(&ids)
    .bind(&owners)
    .bind(&branch_ids)
    .bind(&states)
    .bind(&errors)
    .bind(&participants)
    .bind(&resources)
    .bind(&reasons)
    .bind(&finals)
    .fetch_all(pool)
    .await?;
    by_id(rows)
}

/// One `record_rejected` on its own: the same one statement.
pub(super) async fn record_rejected_alone(
    pool: &PgPool,
    job: &StoppedPlacement<'_>,
) -> Result<Reservation, StoreError> {
    let mut done = record_rejected_batch(pool, std::slice::from_ref(job)).await?;
    from_trying_answer(pool, job.id, done.remove(&job.id)).await
}

/// Records the answers of a confirm/release fan-out for each reservation of `writes` (distinct
/// ids) in one statement. Each row is locked only if still in its `from` state (a second
/// driver waits, then finds it moved on and records nothing); then the answers are recorded,
/// and it finishes or gets its next attempt (backoff with jitter), its lease freed; a lost hold
/// voids the sale, so a FAILED reservation's payment gets its refund, due at once. Rows are
/// locked in id order. Returns the reservations recorded, as written.
pub(super) async fn record_phases(
    pool: &PgPool,
    writes: &[&PhaseWrite],
) -> Result<HashMap<Uuid, Reservation>, StoreError> {
    let c = PhaseColumns::of(writes);
    let (owners, branch_ids, states, errors) =
        reports_of(writes.iter().map(|w| (w.id, w.reports.as_slice())));
    let rows = sqlx::query_as::<_, ReservationRow>(RECORD_PHASES)
        .bind(&c.ids)
        .bind(&c.froms)
        .bind(&c.finishes)
        .bind(&c.refund_ids)
        .bind(&c.bases)
        .bind(&c.caps)
        .bind(&owners)
        .bind(&branch_ids)
        .bind(&states)
        .bind(&errors)
        .bind(&c.write_ids)
        .fetch_all(pool)
        .await?;
    by_id(rows)
}

/// Several `record_phase` calls' own arguments as parallel arrays, for `UNNEST`.
struct PhaseColumns<'a> {
    write_ids: Vec<Uuid>,
    ids: Vec<Uuid>,
    froms: Vec<&'a str>,
    finishes: Vec<Option<&'static str>>,
    refund_ids: Vec<Uuid>,
    bases: Vec<f64>,
    caps: Vec<f64>,
}

impl<'a> PhaseColumns<'a> {
    fn of(writes: &[&'a PhaseWrite]) -> Self {
        let n = writes.len();
        let mut c = PhaseColumns {
            write_ids: Vec::with_capacity(n),
            ids: Vec::with_capacity(n),
            froms: Vec::with_capacity(n),
            finishes: Vec::with_capacity(n),
            refund_ids: Vec::with_capacity(n),
            bases: Vec::with_capacity(n),
            caps: Vec::with_capacity(n),
        };
        for write in writes {
            c.write_ids.push(write.write_id);
            c.ids.push(write.id);
            c.froms.push(write.from.as_str());
            c.finishes.push(write.finish.map(State::as_str));
            c.refund_ids.push(Uuid::new_v4());
            c.bases.push(millis(write.backoff.base) as f64);
            c.caps.push(millis(write.backoff.cap) as f64);
        }
        c
    }
}

/// `record_phases`' one statement: lock the rows still in their `from` state (and not already
/// written by this very call), record the branches' answers, then finish the reservation or
/// schedule its retry with backoff; a lost hold whose payment was taken owes a refund.
const RECORD_PHASES: &str = concat!(
    "WITH cur AS ( \
            SELECT r.id AS cur_id, (r.payment_ref IS NOT NULL AND r.refund_id IS NULL) AS owes, \
                   i.finish, i.new_refund_id, i.base_ms, i.cap_ms, i.write_id \
            FROM reservations r \
            JOIN UNNEST($1::uuid[], $2::text[], $3::text[], $4::uuid[], $5::float8[], $6::float8[], \
                        $11::uuid[]) \
                 AS i(id, from_state, finish, new_refund_id, base_ms, cap_ms, write_id) ON r.id = i.id \
            WHERE r.state = i.from_state AND r.last_phase_write IS DISTINCT FROM i.write_id \
            ORDER BY r.id FOR UPDATE OF r), \
         upd AS ( \
            UPDATE branches b SET state = u.state, attempts = b.attempts + 1, last_error = u.error \
            FROM UNNEST($7::uuid[], $8::uuid[], $9::text[], $10::text[]) \
                 AS u(reservation_id, branch_id, state, error), cur \
            WHERE cur.cur_id = u.reservation_id AND b.reservation_id = cur.cur_id \
              AND b.branch_id = u.branch_id \
            RETURNING b.reservation_id, b.generation, b.position, b.state, b.attempts, b.last_error), \
         w AS ( \
         UPDATE reservations SET \
            state = coalesce(cur.finish, reservations.state), \
            version = reservations.version + CASE WHEN cur.finish IS NULL THEN 0 ELSE 1 END, \
            updated_at = clock_timestamp(), last_phase_write = cur.write_id, \
            lease_owner = NULL, lease_until = NULL, \
            next_attempt_at = CASE \
                WHEN cur.finish = 'FAILED' AND cur.owes THEN clock_timestamp() \
                WHEN cur.finish IS NOT NULL THEN NULL \
                ELSE clock_timestamp() + \
                     least(cur.cap_ms, cur.base_ms * power(2, least(reservations.recovery_attempts, 30))) \
                     * (0.5 + random() / 2) * interval '1 millisecond' END, \
            recovery_attempts = reservations.recovery_attempts \
                                + CASE WHEN cur.finish IS NULL THEN 1 ELSE 0 END, \
            refund_id = CASE WHEN cur.finish = 'FAILED' AND cur.owes THEN cur.new_refund_id \
                             ELSE reservations.refund_id END, \
            refund_state = CASE WHEN cur.finish = 'FAILED' AND cur.owes THEN 'PENDING' \
                                ELSE reservations.refund_state END, \
            refund_reason = CASE WHEN cur.finish = 'FAILED' AND cur.owes \
                                 THEN '",
    lost_hold_refund_reason!(),
    "' ELSE reservations.refund_reason END \
         FROM cur WHERE reservations.id = cur.cur_id \
         RETURNING ",
    reservation_columns!(),
    ") ",
    select_written!()
);

/// A `record_phase` answer: the reservation as recorded, or as it is now - either another
/// driver moved it on, or this very write was applied by a batch whose commit acknowledgement
/// was lost (the row carries its write id): then it answers as the batch would have.
pub(super) async fn phase_answer(
    pool: &PgPool,
    write: &PhaseWrite,
    recorded: Option<Reservation>,
) -> Result<PhaseRecorded, StoreError> {
    let finished = |r: &Reservation| write.finish.is_some_and(|f| r.stored_state == f);
    match recorded {
        Some(reservation) => Ok(PhaseRecorded {
            finished: finished(&reservation),
            reservation,
        }),
        None => {
            let mut conn = pool.acquire().await?;
            let applied: Option<bool> = sqlx::query_scalar(
                "SELECT last_phase_write IS NOT DISTINCT FROM $2 FROM reservations WHERE id = $1",
            )
            .bind(write.id)
            .bind(write.write_id)
            .fetch_optional(&mut *conn)
            .await?;
            let reservation = Postgres::load_existing(&mut conn, write.id).await?;
            Ok(PhaseRecorded {
                finished: applied == Some(true) && finished(&reservation),
                reservation,
            })
        }
    }
}

/// One `record_phase` on its own.
pub(super) async fn record_phase_alone(
    pool: &PgPool,
    write: &PhaseWrite,
) -> Result<PhaseRecorded, StoreError> {
    let mut done = record_phases(pool, &[write]).await?;
    phase_answer(pool, write, done.remove(&write.id)).await
}
