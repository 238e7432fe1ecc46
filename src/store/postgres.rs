//! The coordinator's store on PostgreSQL.
//!
//! Decisions read `clock_timestamp()`, so every replica agrees on what "expired" means.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnection, PgPool};
use sqlx::types::Json;
use tokio::sync::oneshot;
use uuid::Uuid;

use super::batch::{Batcher, RecentlyHeld};
use super::record::{StoredBranch, StoredReservation};
use super::{BranchReport, Claimed, Created, Decided, PhaseRecorded, Store, StoreError, WorkLease};
use crate::domain::lifecycle::{self, Snapshot};
use crate::domain::policy::{Backoff, HoldLimits, LimitScope};
use crate::domain::{
    Branch, Decision, HoldToken, ListQuery, NewReservation, Payment, Rejection, Reservation, State,
    Verdict,
};

/// The coordinator's schema, embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/coordinator");

/// Columns of `reservations` every read needs, plus whether a HELD one lapsed (lazy expiry).
/// Macros rather than consts so queries stay `&'static str` (sqlx refuses built strings).
macro_rules! reservation_columns {
    () => {
        "id, request_id, holder, state, release_outcome, hold_token, ttl_ms, \
         created_at, expires_at, extensions_used, labels, rejection_participant, \
         rejection_resource, rejection_reason, late_payment_honored, version, \
         payment_participant, payment_ref, payment_amount_minor, payment_currency, \
         refund_id, refund_state, refund_reason, generation, \
         (reservations.state = 'HELD' AND expires_at <= clock_timestamp()) AS lapsed"
    };
}

/// A reservation row with its current generation's branches as parallel arrays, in canonical
/// order: one round trip reads it all. Append the WHERE clause.
macro_rules! select_reservations {
    () => {
        concat!(
            "SELECT ",
            reservation_columns!(),
            ", b.* FROM reservations CROSS JOIN LATERAL ( \
                SELECT array_agg(branch_id ORDER BY position) AS b_branch_ids, \
                       array_agg(participant ORDER BY position) AS b_participants, \
                       array_agg(resource ORDER BY position) AS b_resources, \
                       array_agg(quantity ORDER BY position) AS b_quantities, \
                       array_agg(during_start ORDER BY position) AS b_starts, \
                       array_agg(during_end ORDER BY position) AS b_ends, \
                       array_agg(state ORDER BY position) AS b_states, \
                       array_agg(attempts ORDER BY position) AS b_attempts, \
                       array_agg(last_error ORDER BY position) AS b_errors \
                FROM branches \
                WHERE branches.reservation_id = reservations.id \
                  AND branches.generation = reservations.generation) b "
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
        "SELECT w.*, b.* FROM w CROSS JOIN LATERAL ( \
            SELECT array_agg(br.branch_id ORDER BY br.position) AS b_branch_ids, \
                   array_agg(br.participant ORDER BY br.position) AS b_participants, \
                   array_agg(br.resource ORDER BY br.position) AS b_resources, \
                   array_agg(br.quantity ORDER BY br.position) AS b_quantities, \
                   array_agg(br.during_start ORDER BY br.position) AS b_starts, \
                   array_agg(br.during_end ORDER BY br.position) AS b_ends, \
                   array_agg(coalesce(u.state, br.state) ORDER BY br.position) AS b_states, \
                   array_agg(coalesce(u.attempts, br.attempts) ORDER BY br.position) AS b_attempts, \
                   array_agg(CASE WHEN u.position IS NULL THEN br.last_error ELSE u.last_error END \
                             ORDER BY br.position) AS b_errors \
            FROM branches br LEFT JOIN upd u ON u.reservation_id = br.reservation_id \
                 AND u.generation = br.generation AND u.position = br.position \
            WHERE br.reservation_id = w.id AND br.generation = w.generation) b"
    };
}

/// Advisory lock key serialising Reserves while a global hold cap is configured.
const GLOBAL_LIMIT_LOCK: i64 = 0x686f_6c64_6661_7374; // "holdfast"

/// Reservations on PostgreSQL.
#[derive(Clone)]
pub struct PgStore {
    pool: PgPool,
    /// Reserves (`create`), group-committed.
    creates: Arc<Batcher<CreateJob>>,
    /// `record_held` calls, group-committed.
    held: Arc<Batcher<HeldJob>>,
    /// `record_phase` calls, group-committed.
    phases: Arc<Batcher<PhaseJob>>,
    /// What this process last recorded `HELD`, for its Confirm/Cancel to skip a read.
    recently_held: Arc<RecentlyHeld>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore").field("pool", &self.pool).finish()
    }
}

/// Most writes of one kind in one statement.
const MAX_BATCH: usize = 64;

/// A queued `create`.
struct CreateJob {
    new: NewReservation,
    token: HoldToken,
    lease: WorkLease,
    limits: HoldLimits,
    reply: oneshot::Sender<Result<Created, StoreError>>,
}

/// A queued `record_held`.
struct HeldJob {
    id: Uuid,
    reports: Vec<BranchReport>,
    reply: oneshot::Sender<Result<Reservation, StoreError>>,
}

/// A queued `record_phase`.
struct PhaseJob {
    id: Uuid,
    from: State,
    reports: Vec<BranchReport>,
    finish: Option<State>,
    backoff: Backoff,
    reply: oneshot::Sender<Result<PhaseRecorded, StoreError>>,
}

/// Splits jobs into ones for distinct reservations (they may share a statement) and repeats.
fn distinct_by_id<J>(jobs: Vec<J>, id: impl Fn(&J) -> Uuid) -> (Vec<J>, Vec<J>) {
    let mut seen = HashSet::with_capacity(jobs.len());
    jobs.into_iter().partition(|j| seen.insert(id(j)))
}

/// Logs a batch that failed as a whole (its calls are then run one by one).
fn batch_failed(e: StoreError) {
    tracing::warn!(error = %e, "a group-committed batch failed; running its calls one by one");
}

/// The answer of a batcher whose task went away with its runtime.
fn batch_task_gone<T>(_: oneshot::error::RecvError) -> Result<T, StoreError> {
    Err(StoreError::Database(sqlx::Error::WorkerCrashed))
}

impl PgStore {
    /// Connects a pool of `max_connections` to `url`.
    pub async fn connect(url: &str, max_connections: u32) -> Result<PgStore, StoreError> {
        let pool = crate::db::open_postgres(url, max_connections).await?;
        Ok(PgStore::from_pool(pool))
    }

    /// Wraps an existing pool. Inside a tokio runtime this starts the tasks that group-commit
    /// concurrent writes (they end with the runtime); outside one, every write runs alone.
    pub fn from_pool(pool: PgPool) -> PgStore {
        let creates = {
            let pool = pool.clone();
            Batcher::spawn(MAX_BATCH, move |jobs| run_creates(pool.clone(), jobs))
        };
        let held = {
            let pool = pool.clone();
            Batcher::spawn(MAX_BATCH, move |jobs| run_held(pool.clone(), jobs))
        };
        let phases = {
            let pool = pool.clone();
            Batcher::spawn(MAX_BATCH, move |jobs| run_phases(pool.clone(), jobs))
        };
        PgStore {
            pool,
            creates: Arc::new(creates),
            held: Arc::new(held),
            phases: Arc::new(phases),
            recently_held: Arc::new(RecentlyHeld::default()),
        }
    }

    /// Applies pending migrations. Safe to run concurrently from several replicas (sqlx takes
    /// an advisory lock).
    pub async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }
}

#[derive(sqlx::FromRow)]
struct ReservationRow {
    id: Uuid,
    request_id: String,
    holder: String,
    state: String,
    release_outcome: Option<String>,
    hold_token: String,
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

impl PgStore {
    /// Applies a verdict on a lapsed HELD reservation: release it, or honour a late payment
    /// by confirming the holds as they are.
    async fn apply_lapsed(
        &self,
        conn: &mut PgConnection,
        id: Uuid,
        verdict: &Verdict,
        payment: Option<&Payment>,
    ) -> Result<bool, StoreError> {
        match verdict {
            Verdict::HonorLate => {
                let done = sqlx::query(
                    "UPDATE reservations SET state = 'CONFIRMING', late_payment_honored = true, \
                     version = version + 1, updated_at = clock_timestamp() \
                     WHERE id = $1 AND state = 'HELD'",
                )
                .bind(id)
                .execute(&mut *conn)
                .await?
                .rows_affected()
                    == 1;
                Ok(done && record_payment(conn, id, payment).await?)
            }
            Verdict::Refund { .. } => {
                expire_hold(conn, id).await?;
                record_payment(conn, id, payment).await?;
                record_refund(conn, id, "the payment arrived after the hold expired").await
            }
            _ => expire_hold(conn, id).await,
        }
    }
}

impl ReservationRow {
    /// The branches from the parallel arrays.
    fn take_branches(&mut self) -> Result<Vec<Branch>, StoreError> {
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

    fn into_domain(mut self) -> Result<Reservation, StoreError> {
        let branches = self.take_branches()?;
        StoredReservation {
            id: self.id,
            request_id: self.request_id,
            holder: self.holder,
            state: self.state,
            release_outcome: self.release_outcome,
            hold_token: self.hold_token,
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
            generation: self.generation,
            lapsed: self.lapsed,
        }
        .into_domain(branches)
    }
}

/// Reads one reservation with its branches, optionally locking its row.
async fn load(
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

/// Loads a reservation that must exist (we hold its id from a row we just wrote).
async fn load_existing(conn: &mut PgConnection, id: Uuid) -> Result<Reservation, StoreError> {
    load(conn, id, false)
        .await?
        .ok_or_else(|| StoreError::Corrupt(format!("reservation {id} vanished")))
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

/// The reports as parallel arrays, for `UNNEST`.
fn report_columns(reports: &[BranchReport]) -> (Vec<Uuid>, Vec<&str>, Vec<Option<&str>>) {
    (
        reports.iter().map(|r| r.branch_id).collect(),
        reports.iter().map(|r| r.state.as_str()).collect(),
        reports.iter().map(|r| r.error.as_deref()).collect(),
    )
}

/// Records each participant's answer on its branch rows.
async fn apply_reports(
    conn: &mut PgConnection,
    id: Uuid,
    reports: &[BranchReport],
) -> Result<(), StoreError> {
    if reports.is_empty() {
        return Ok(());
    }
    let (ids, states, errors) = report_columns(reports);
    sqlx::query(
        "UPDATE branches b \
         SET state = u.state, attempts = b.attempts + 1, last_error = u.error \
         FROM UNNEST($2::uuid[], $3::text[], $4::text[]) AS u(branch_id, state, error) \
         WHERE b.reservation_id = $1 AND b.branch_id = u.branch_id",
    )
    .bind(id)
    .bind(&ids)
    .bind(&states)
    .bind(&errors)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Leases a reservation to `lease.owner` (it is about to drive it), unless another instance
/// holds an unexpired lease on it (it is driving it already). True if the lease is ours.
async fn take_lease(
    conn: &mut PgConnection,
    id: Uuid,
    lease: WorkLease,
) -> Result<bool, StoreError> {
    let taken = sqlx::query(
        "UPDATE reservations SET lease_owner = $2, \
         lease_until = clock_timestamp() + $3 * interval '1 millisecond' \
         WHERE id = $1 AND (lease_owner IS NULL OR lease_owner = $2 \
                            OR lease_until IS NULL OR lease_until < clock_timestamp())",
    )
    .bind(id)
    .bind(lease.owner)
    .bind(millis(lease.duration))
    .execute(&mut *conn)
    .await?
    .rows_affected();
    Ok(taken == 1)
}

/// Records the payment given to Confirm (the first one only).
async fn record_payment(
    conn: &mut PgConnection,
    id: Uuid,
    payment: Option<&Payment>,
) -> Result<bool, StoreError> {
    let Some(p) = payment else {
        return Ok(true);
    };
    sqlx::query(
        "UPDATE reservations SET payment_participant = $2, payment_ref = $3, \
         payment_amount_minor = $4, payment_currency = $5 \
         WHERE id = $1 AND payment_ref IS NULL",
    )
    .bind(id)
    .bind(&p.participant)
    .bind(&p.payment_ref)
    .bind(p.amount_minor)
    .bind(&p.currency)
    .execute(&mut *conn)
    .await?;
    Ok(true)
}

/// Records the reservation's one refund of its payment, due at once. False if it has one.
async fn record_refund(
    conn: &mut PgConnection,
    id: Uuid,
    reason: &str,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE reservations SET refund_id = $2, refund_state = 'PENDING', refund_reason = $3, \
         next_attempt_at = clock_timestamp(), version = version + 1, updated_at = clock_timestamp() \
         WHERE id = $1 AND refund_id IS NULL AND payment_ref IS NOT NULL",
    )
    .bind(id)
    .bind(Uuid::new_v4())
    .bind(reason)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    Ok(done == 1)
}

/// `HELD -> CANCELLING` ending `EXPIRED`, only if the database clock says the hold lapsed.
async fn expire_hold(conn: &mut PgConnection, id: Uuid) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE reservations SET state = 'CANCELLING', release_outcome = 'EXPIRED', \
         version = version + 1, updated_at = clock_timestamp() \
         WHERE id = $1 AND state = 'HELD' AND expires_at <= clock_timestamp()",
    )
    .bind(id)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    Ok(done == 1)
}

/// Why a Reserve may not be recorded (under the holder lock): its (holder, request_id) is
/// recorded already, or a hold limit is reached. `None`: it may.
async fn admission(
    conn: &mut PgConnection,
    new: &NewReservation,
    limits: HoldLimits,
) -> Result<Option<Created>, StoreError> {
    let (existing, live_for_holder): (Option<Uuid>, i64) = sqlx::query_as(
        "SELECT (SELECT id FROM reservations WHERE holder = $1 AND request_id = $2), \
                (SELECT count(*) FROM reservations WHERE holder = $1 AND state IN ('TRYING', 'HELD') \
                   AND (state = 'TRYING' OR expires_at > clock_timestamp()))",
    )
    .bind(&new.holder)
    .bind(&new.request_id)
    .fetch_one(&mut *conn)
    .await?;
    if let Some(existing) = existing {
        return Ok(Some(Created::Existing(
            load_existing(conn, existing).await?,
        )));
    }
    if live_for_holder >= i64::from(limits.per_holder) {
        return Ok(Some(Created::LimitReached(LimitScope::Holder)));
    }
    if limits.total > 0 {
        let live: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM reservations WHERE state IN ('TRYING', 'HELD') \
               AND (state = 'TRYING' OR expires_at > clock_timestamp())",
        )
        .fetch_one(&mut *conn)
        .await?;
        if live >= i64::from(limits.total) {
            return Ok(Some(Created::LimitReached(LimitScope::Total)));
        }
    }
    Ok(None)
}

/// What the lifecycle rules need to know of a reservation.
fn snapshot_of(current: &Reservation) -> Snapshot {
    Snapshot {
        state: current.stored_state,
        release_outcome: current.release_outcome,
        expired: current.state == State::Expired && current.stored_state == State::Held,
        created_at: current.created_at,
        expires_at: current.expires_at,
        extensions_used: current.extensions_used,
        ttl: current.ttl,
        has_payment: current.payment.is_some(),
        has_refund: current.refund.is_some(),
        repeats_last_extend: false,
    }
}

impl PgStore {
    /// The common decisions without a transaction: read the row (or take the image this
    /// process recorded when it placed the holds), judge it, and apply a Confirm or Cancel of
    /// a HELD reservation with one conditional UPDATE guarded by that image's version, so any
    /// change since makes it miss (then the locked path judges again). A refusal or a repeat changes nothing, so the read answers it. `None`:
    /// the locked path decides (lapsed holds, late payments, refunds, Extend, a missed UPDATE).
    async fn decide_unlocked(
        &self,
        id: Uuid,
        presented_token: &str,
        decision: &Decision,
        lease: WorkLease,
    ) -> Result<Option<Decided>, StoreError> {
        if matches!(decision, Decision::Extend { .. }) {
            return Ok(None);
        }
        let mut conn = self.pool.acquire().await?;
        // This process recorded it HELD: decide on that image (a stale one makes the guarded
        // UPDATE below miss), else read the row.
        let cached = self.recently_held.take(id);
        let from_cache = cached.is_some();
        let current = match cached {
            Some(r) => r,
            None => match load(&mut conn, id, false).await? {
                Some(r) => r,
                None => return Ok(Some(Decided::NotFound)),
            },
        };
        if !current.hold_token.matches(presented_token) {
            return Ok(Some(Decided::TokenMismatch));
        }
        let verdict = lifecycle::decide(&snapshot_of(&current), decision);
        if from_cache && !matches!(verdict, Verdict::Transition { .. }) {
            return Ok(None);
        }
        let row =
            match (&verdict, decision) {
                (Verdict::AlreadyDone | Verdict::Refuse(_), _) => {
                    return Ok(Some(Decided::Judged {
                        verdict,
                        reservation: Box::new(current),
                        leased: false,
                    }));
                }
                // The database clock at the UPDATE is the arbiter of "before expires_at". HELD rows
                // carry no lease: the deciding instance takes it in the same UPDATE.
                (
                    Verdict::Transition {
                        to: State::Confirming,
                        ..
                    },
                    Decision::Confirm { payment, .. },
                ) => {
                    let payment = payment.as_ref();
                    sqlx::query_as::<_, ReservationRow>(concat!(
                        "UPDATE reservations SET state = 'CONFIRMING', version = version + 1, \
                     updated_at = clock_timestamp(), lease_owner = $3, \
                     lease_until = clock_timestamp() + $4 * interval '1 millisecond', \
                     payment_participant = coalesce(payment_participant, $5), \
                     payment_ref = coalesce(payment_ref, $6), \
                     payment_amount_minor = coalesce(payment_amount_minor, $7), \
                     payment_currency = coalesce(payment_currency, $8) \
                     WHERE id = $1 AND version = $2 AND state = 'HELD' \
                       AND clock_timestamp() < expires_at \
                     RETURNING ",
                        reservation_columns!()
                    ))
                    .bind(id)
                    .bind(current.version)
                    .bind(lease.owner)
                    .bind(millis(lease.duration))
                    .bind(payment.map(|p| p.participant.as_str()))
                    .bind(payment.map(|p| p.payment_ref.as_str()))
                    .bind(payment.map(|p| p.amount_minor))
                    .bind(payment.map(|p| p.currency.as_str()))
                    .fetch_optional(&mut *conn)
                    .await?
                }
                (
                    Verdict::Transition {
                        to,
                        release_outcome,
                    },
                    Decision::Cancel { reason },
                ) => sqlx::query_as::<_, ReservationRow>(concat!(
                    "UPDATE reservations SET state = $3, release_outcome = $4, cancel_reason = $5, \
                     version = version + 1, updated_at = clock_timestamp(), lease_owner = $6, \
                     lease_until = clock_timestamp() + $7 * interval '1 millisecond' \
                     WHERE id = $1 AND version = $2 AND state = 'HELD' \
                       AND clock_timestamp() < expires_at \
                     RETURNING ",
                    reservation_columns!()
                ))
                .bind(id)
                .bind(current.version)
                .bind(to.as_str())
                .bind(release_outcome.map(State::as_str))
                .bind(reason.as_deref())
                .bind(lease.owner)
                .bind(millis(lease.duration))
                .fetch_optional(&mut *conn)
                .await?,
                _ => return Ok(None),
            };
        let Some(row) = row else {
            return Ok(None);
        };
        // A decision changes the reservation row only; its branches are as read.
        let mut after = row.into_domain()?;
        after.branches = current.branches;
        Ok(Some(Decided::Judged {
            verdict,
            reservation: Box::new(after),
            leased: true,
        }))
    }
}

/// `TRYING -> HELD` for each reservation of `jobs` (distinct ids) in one statement: the
/// transition gates each one's branch updates, so they happen together or not at all. Returns
/// the reservations that moved, as written.
async fn record_held_batch(
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
            WHERE id = ANY($1::uuid[]) AND state = 'TRYING' RETURNING ",
        reservation_columns!(),
        "), upd AS ( \
            UPDATE branches b SET state = u.state, attempts = b.attempts + 1, last_error = u.error \
            FROM UNNEST($2::uuid[], $3::uuid[], $4::text[], $5::text[]) \
                 AS u(reservation_id, branch_id, state, error), w \
            WHERE w.id = u.reservation_id AND b.reservation_id = w.id AND b.branch_id = u.branch_id \
            RETURNING b.reservation_id, b.generation, b.position, b.state, b.attempts, b.last_error) ",
        select_written!()
    ))
    .bind(&ids)
    .bind(&owners)
    .bind(&branch_ids)
    .bind(&states)
    .bind(&errors)
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|row| row.into_domain().map(|r| (r.id, r)))
        .collect()
}

/// A `record_held` answer: the reservation as recorded, or (it had left TRYING meanwhile) as
/// it is now.
async fn held_answer(
    pool: &PgPool,
    id: Uuid,
    recorded: Option<Reservation>,
) -> Result<Reservation, StoreError> {
    match recorded {
        Some(r) => Ok(r),
        None => load_existing(&mut *pool.acquire().await?, id).await,
    }
}

/// One `record_held` on its own.
async fn record_held_alone(
    pool: &PgPool,
    id: Uuid,
    reports: &[BranchReport],
) -> Result<Reservation, StoreError> {
    let mut done = record_held_batch(pool, &[(id, reports)]).await?;
    held_answer(pool, id, done.remove(&id)).await
}

/// Runs queued `record_held` calls: distinct reservations in one statement; should that fail,
/// each alone, so one call's error is its own. A second call for a reservation of the batch
/// runs after it, alone.
async fn run_held(pool: PgPool, jobs: Vec<HeldJob>) {
    let (batch, repeats) = distinct_by_id(jobs, |j| j.id);
    let mut shared = if batch.len() > 1 {
        let args: Vec<(Uuid, &[BranchReport])> =
            batch.iter().map(|j| (j.id, j.reports.as_slice())).collect();
        record_held_batch(&pool, &args)
            .await
            .map_err(batch_failed)
            .ok()
    } else {
        None
    };
    for job in batch {
        let answer = match shared.as_mut() {
            Some(done) => held_answer(&pool, job.id, done.remove(&job.id)).await,
            None => record_held_alone(&pool, job.id, &job.reports).await,
        };
        let _ = job.reply.send(answer);
    }
    for job in repeats {
        let answer = record_held_alone(&pool, job.id, &job.reports).await;
        let _ = job.reply.send(answer);
    }
}

/// Records the answers of a confirm/release fan-out for each reservation of `jobs` (distinct
/// ids) in one statement. Each row is locked only if still in its `from` state (a second
/// driver waits, then finds it moved on and records nothing); then the answers are recorded,
/// and it finishes or gets its next attempt (backoff with jitter), its lease freed; a lost hold
/// voids the sale, so a FAILED reservation's payment gets its refund, due at once. Rows are
/// locked in id order. Returns the reservations recorded, as written.
async fn record_phases(
    pool: &PgPool,
    jobs: &[PhaseJob],
) -> Result<HashMap<Uuid, Reservation>, StoreError> {
    let n = jobs.len();
    let (mut ids, mut froms, mut finishes, mut refund_ids, mut bases, mut caps) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for job in jobs {
        ids.push(job.id);
        froms.push(job.from.as_str());
        finishes.push(job.finish.map(State::as_str));
        refund_ids.push(Uuid::new_v4());
        bases.push(millis(job.backoff.base) as f64);
        caps.push(millis(job.backoff.cap) as f64);
    }
    let (owners, branch_ids, states, errors) =
        reports_of(jobs.iter().map(|j| (j.id, j.reports.as_slice())));
    let rows = sqlx::query_as::<_, ReservationRow>(concat!(
        "WITH cur AS ( \
            SELECT r.id AS cur_id, (r.payment_ref IS NOT NULL AND r.refund_id IS NULL) AS owes, \
                   i.finish, i.new_refund_id, i.base_ms, i.cap_ms \
            FROM reservations r \
            JOIN UNNEST($1::uuid[], $2::text[], $3::text[], $4::uuid[], $5::float8[], $6::float8[]) \
                 AS i(id, from_state, finish, new_refund_id, base_ms, cap_ms) ON r.id = i.id \
            WHERE r.state = i.from_state ORDER BY r.id FOR UPDATE OF r), \
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
            updated_at = clock_timestamp(), \
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
                                 THEN 'a participant lost a hold it had granted' \
                                 ELSE reservations.refund_reason END \
         FROM cur WHERE reservations.id = cur.cur_id \
         RETURNING ",
        reservation_columns!(),
        ") ",
        select_written!()
    ))
    .bind(&ids)
    .bind(&froms)
    .bind(&finishes)
    .bind(&refund_ids)
    .bind(&bases)
    .bind(&caps)
    .bind(&owners)
    .bind(&branch_ids)
    .bind(&states)
    .bind(&errors)
    .fetch_all(pool)
    .await?;
    rows.into_iter()
        .map(|row| row.into_domain().map(|r| (r.id, r)))
        .collect()
}

/// A `record_phase` answer: the reservation as recorded, or (it had left `from` meanwhile:
/// another driver finished it) as it is now.
async fn phase_answer(
    pool: &PgPool,
    job: &PhaseJob,
    recorded: Option<Reservation>,
) -> Result<PhaseRecorded, StoreError> {
    match recorded {
        Some(reservation) => Ok(PhaseRecorded {
            finished: job.finish.is_some_and(|f| reservation.stored_state == f),
            reservation,
        }),
        None => Ok(PhaseRecorded {
            reservation: load_existing(&mut *pool.acquire().await?, job.id).await?,
            finished: false,
        }),
    }
}

/// One `record_phase` on its own.
async fn record_phase_alone(pool: &PgPool, job: &PhaseJob) -> Result<PhaseRecorded, StoreError> {
    let mut done = record_phases(pool, std::slice::from_ref(job)).await?;
    phase_answer(pool, job, done.remove(&job.id)).await
}

/// Runs queued `record_phase` calls: distinct reservations in one statement; should that fail,
/// each alone, so one call's error is its own. A second call for a reservation of the batch
/// runs after it, alone, as it would have waited for the row lock.
async fn run_phases(pool: PgPool, jobs: Vec<PhaseJob>) {
    let (batch, repeats) = distinct_by_id(jobs, |j| j.id);
    let mut shared = if batch.len() > 1 {
        record_phases(&pool, &batch)
            .await
            .map_err(batch_failed)
            .ok()
    } else {
        None
    };
    for job in batch {
        let answer = match shared.as_mut() {
            Some(done) => {
                let recorded = done.remove(&job.id);
                phase_answer(&pool, &job, recorded).await
            }
            None => record_phase_alone(&pool, &job).await,
        };
        let _ = job.reply.send(answer);
    }
    for job in repeats {
        let answer = record_phase_alone(&pool, &job).await;
        let _ = job.reply.send(answer);
    }
}

/// A Reserve to record.
#[derive(Clone, Copy)]
struct NewRow<'a> {
    new: &'a NewReservation,
    token: &'a HoldToken,
    lease: WorkLease,
    limits: HoldLimits,
}

/// One Reserve on its own (with a global hold cap, every Reserve goes this way).
async fn create_alone(
    pool: &PgPool,
    new: &NewReservation,
    token: &HoldToken,
    lease: WorkLease,
    limits: HoldLimits,
) -> Result<Created, StoreError> {
    let mut tx = pool.begin().await?;
    // One holder's Reserves run this transaction one at a time, so counting its live holds
    // and inserting are one atomic step. (A separate statement: the count must see what
    // committed while we waited for the lock.)
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(&new.holder)
        .execute(&mut *tx)
        .await?;
    if limits.total > 0 {
        // Rare configuration: every Reserve queues on one lock, and admission is checked
        // statement by statement.
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(GLOBAL_LIMIT_LOCK)
            .execute(&mut *tx)
            .await?;
        if let Some(refused) = admission(&mut tx, new, limits).await? {
            tx.rollback().await?;
            return Ok(refused);
        }
    }
    let row = NewRow {
        new,
        token,
        lease,
        limits,
    };
    let mut answers = insert_new(&mut tx, &[row]).await?;
    tx.commit().await?;
    answers
        .pop()
        .ok_or_else(|| StoreError::Corrupt("no answer for a Reserve".into()))
}

/// Records a batch of Reserves (distinct holders, no global cap) in one transaction: every
/// holder's lock, in key order so concurrent batches cannot deadlock, then [`insert_new`].
/// Answers in job order.
async fn create_batch(pool: &PgPool, jobs: &[CreateJob]) -> Result<Vec<Created>, StoreError> {
    let mut tx = pool.begin().await?;
    let holders: Vec<&str> = jobs.iter().map(|j| j.new.holder.as_str()).collect();
    sqlx::query(
        "SELECT pg_advisory_xact_lock(k) FROM ( \
            SELECT DISTINCT hashtextextended(h, 0) AS k FROM UNNEST($1::text[]) AS h ORDER BY k) s",
    )
    .bind(&holders)
    .execute(&mut *tx)
    .await?;
    let rows: Vec<NewRow<'_>> = jobs
        .iter()
        .map(|j| NewRow {
            new: &j.new,
            token: &j.token,
            lease: j.lease,
            limits: j.limits,
        })
        .collect();
    let answers = insert_new(&mut tx, &rows).await?;
    tx.commit().await?;
    Ok(answers)
}

/// Under the holders' locks: one statement inserting each reservation with its branches
/// unless its request id is taken or its holder is at the cap (checked by the statement's
/// snapshot, taken after the locks were granted), answering with the rows as inserted; the
/// others are judged one by one ([`admission`]). Answers in `rows` order.
async fn insert_new(
    tx: &mut PgConnection,
    rows: &[NewRow<'_>],
) -> Result<Vec<Created>, StoreError> {
    let n = rows.len();
    let holders: Vec<&str> = rows.iter().map(|r| r.new.holder.as_str()).collect();
    let mut ids = Vec::with_capacity(n);
    let (mut request_ids, mut tokens, mut ttls, mut labels, mut owners, mut leases, mut caps) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    let (mut b_res, mut b_pos, mut b_ids, mut b_parts, mut b_resources, mut b_qtys) = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    let (mut b_starts, mut b_ends) = (Vec::new(), Vec::new());
    for job in rows {
        let id = Uuid::now_v7();
        ids.push(id);
        request_ids.push(job.new.request_id.as_str());
        tokens.push(job.token.expose());
        ttls.push(i64::try_from(job.new.ttl.as_millis()).unwrap_or(i64::MAX));
        labels.push(
            serde_json::to_string(&job.new.labels)
                .map_err(|e| StoreError::Corrupt(format!("labels: {e}")))?,
        );
        owners.push(job.lease.owner);
        leases.push(millis(job.lease.duration));
        caps.push(i64::from(job.limits.per_holder));
        // One participant-level branch id per participant, shared by its holds.
        let mut branch_ids: HashMap<&str, Uuid> = HashMap::new();
        for (i, h) in job.new.holds.iter().enumerate() {
            b_res.push(id);
            b_pos.push(i32::try_from(i).unwrap_or(i32::MAX));
            b_ids.push(
                *branch_ids
                    .entry(&h.participant)
                    .or_insert_with(Uuid::new_v4),
            );
            b_parts.push(h.participant.as_str());
            b_resources.push(h.resource.as_str());
            b_qtys.push(h.quantity);
            b_starts.push(h.during.map(|d| d.start));
            b_ends.push(h.during.map(|d| d.end));
        }
    }
    // Each row's admission is checked by this statement's snapshot, taken after every holder
    // lock was granted.
    let written = sqlx::query_as::<_, ReservationRow>(concat!(
        "WITH i AS ( \
            SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::bigint[], \
                                 $6::text[], $7::uuid[], $8::bigint[], $9::bigint[]) \
                AS i(id, request_id, holder, token, ttl_ms, labels, lease_owner, lease_ms, cap)), \
         w AS ( \
            INSERT INTO reservations (id, request_id, holder, state, hold_token, ttl_ms, \
                                      expires_at, labels, lease_owner, lease_until) \
            SELECT i.id, i.request_id, i.holder, 'TRYING', i.token, i.ttl_ms, \
                   clock_timestamp() + i.ttl_ms * interval '1 millisecond', i.labels::jsonb, \
                   i.lease_owner, clock_timestamp() + i.lease_ms * interval '1 millisecond' \
            FROM i \
            WHERE NOT EXISTS (SELECT 1 FROM reservations r \
                              WHERE r.holder = i.holder AND r.request_id = i.request_id) \
              AND (SELECT count(*) FROM reservations r WHERE r.holder = i.holder \
                     AND r.state IN ('TRYING', 'HELD') \
                     AND (r.state = 'TRYING' OR r.expires_at > clock_timestamp())) < i.cap \
            ON CONFLICT (holder, request_id) DO NOTHING \
            RETURNING ",
        reservation_columns!(),
        "), ins AS ( \
            INSERT INTO branches (reservation_id, position, branch_id, participant, resource, \
                                  quantity, during_start, during_end, state) \
            SELECT u.reservation_id, u.position, u.branch_id, u.participant, u.resource, \
                   u.quantity, u.during_start, u.during_end, 'PENDING' \
            FROM UNNEST($10::uuid[], $11::int[], $12::uuid[], $13::text[], $14::text[], \
                        $15::bigint[], $16::timestamptz[], $17::timestamptz[]) \
                AS u(reservation_id, position, branch_id, participant, resource, quantity, \
                     during_start, during_end) \
            JOIN w ON w.id = u.reservation_id \
            RETURNING *) \
         SELECT w.*, b.* FROM w CROSS JOIN LATERAL ( \
            SELECT array_agg(branch_id ORDER BY position) AS b_branch_ids, \
                   array_agg(participant ORDER BY position) AS b_participants, \
                   array_agg(resource ORDER BY position) AS b_resources, \
                   array_agg(quantity ORDER BY position) AS b_quantities, \
                   array_agg(during_start ORDER BY position) AS b_starts, \
                   array_agg(during_end ORDER BY position) AS b_ends, \
                   array_agg(state ORDER BY position) AS b_states, \
                   array_agg(attempts ORDER BY position) AS b_attempts, \
                   array_agg(last_error ORDER BY position) AS b_errors \
            FROM ins WHERE ins.reservation_id = w.id) b"
    ))
    .bind(&ids)
    .bind(&request_ids)
    .bind(&holders)
    .bind(&tokens)
    .bind(&ttls)
    .bind(&labels)
    .bind(&owners)
    .bind(&leases)
    .bind(&caps)
    .bind(&b_res)
    .bind(&b_pos)
    .bind(&b_ids)
    .bind(&b_parts)
    .bind(&b_resources)
    .bind(&b_qtys)
    .bind(&b_starts)
    .bind(&b_ends)
    .fetch_all(&mut *tx)
    .await?;
    let mut inserted: HashMap<Uuid, Reservation> = HashMap::with_capacity(written.len());
    for row in written {
        let r = row.into_domain()?;
        inserted.insert(r.id, r);
    }
    let mut answers = Vec::with_capacity(n);
    for (job, id) in rows.iter().zip(&ids) {
        answers.push(match inserted.remove(id) {
            Some(r) => Created::New(r),
            // A repeat of a recorded request, or the holder is at its cap.
            None => admission(&mut *tx, job.new, job.limits)
                .await?
                .ok_or_else(|| {
                    StoreError::Corrupt("request_id conflicted under the holder lock".into())
                })?,
        });
    }
    Ok(answers)
}

/// Runs queued Reserves: distinct holders in one transaction; should that fail, each alone,
/// so one call's error is its own.
async fn run_creates(pool: PgPool, jobs: Vec<CreateJob>) {
    let mut seen = HashSet::with_capacity(jobs.len());
    let (batch, repeats): (Vec<CreateJob>, Vec<CreateJob>) = jobs
        .into_iter()
        .partition(|j| seen.insert(j.new.holder.clone()));
    let shared = if batch.len() > 1 {
        create_batch(&pool, &batch).await.map_err(batch_failed).ok()
    } else {
        None
    };
    let mut shared = shared.map(Vec::into_iter);
    for job in batch.into_iter().chain(repeats) {
        let answer = match shared.as_mut().and_then(Iterator::next) {
            Some(created) => Ok(created),
            None => create_alone(&pool, &job.new, &job.token, job.lease, job.limits).await,
        };
        let _ = job.reply.send(answer);
    }
}

#[async_trait]
impl Store for PgStore {
    async fn create(
        &self,
        new: &NewReservation,
        token: &HoldToken,
        lease: WorkLease,
        limits: HoldLimits,
    ) -> Result<Created, StoreError> {
        let (_in_flight, idle) = self.creates.enter();
        if idle || limits.total > 0 {
            return create_alone(&self.pool, new, token, lease, limits).await;
        }
        let (reply, answer) = oneshot::channel();
        let job = CreateJob {
            new: new.clone(),
            token: token.clone(),
            lease,
            limits,
            reply,
        };
        match self.creates.submit(job) {
            Ok(()) => answer.await.unwrap_or_else(batch_task_gone),
            Err(job) => create_alone(&self.pool, &job.new, &job.token, job.lease, job.limits).await,
        }
    }

    async fn get(&self, id: Uuid) -> Result<Option<Reservation>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        load(&mut conn, id, false).await
    }

    async fn list(&self, query: &ListQuery) -> Result<Vec<Reservation>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        let (after_ts, after_id) = match query.after {
            Some((ts, id)) => (Some(ts), Some(id)),
            None => (None, None),
        };
        sqlx::query_as::<_, ReservationRow>(concat!(
            select_reservations!(),
            "WHERE ($1::text IS NULL OR holder = $1) \
               AND ($2::text IS NULL OR \
                    (CASE WHEN reservations.state = 'HELD' AND expires_at <= clock_timestamp() \
                          THEN 'EXPIRED' ELSE reservations.state END) = $2) \
               AND ($3::timestamptz IS NULL OR (created_at, id) < ($3, $4)) \
             ORDER BY created_at DESC, id DESC LIMIT $5"
        ))
        .bind(query.holder.as_deref())
        .bind(query.state.map(State::as_str))
        .bind(after_ts)
        .bind(after_id)
        .bind(i64::from(query.limit))
        .fetch_all(&mut *conn)
        .await?
        .into_iter()
        .map(ReservationRow::into_domain)
        .collect()
    }

    async fn decide(
        &self,
        id: Uuid,
        presented_token: &str,
        decision: &Decision,
        lease: WorkLease,
    ) -> Result<Decided, StoreError> {
        if let Some(decided) = self
            .decide_unlocked(id, presented_token, decision, lease)
            .await?
        {
            return Ok(decided);
        }
        let mut tx = self.pool.begin().await?;
        let Some(current) = load(&mut tx, id, true).await? else {
            return Ok(Decided::NotFound);
        };
        if !current.hold_token.matches(presented_token) {
            return Ok(Decided::TokenMismatch);
        }
        let mut snapshot = snapshot_of(&current);
        if let Some(key) = decision.extend_request_id() {
            snapshot.repeats_last_extend = sqlx::query_scalar(
                "SELECT coalesce(last_extend_request_id = $2, false) FROM reservations WHERE id = $1",
            )
            .bind(id)
            .bind(key)
            .fetch_one(&mut *tx)
            .await?;
        }
        let payment = match decision {
            Decision::Confirm { payment, .. } => payment.as_ref(),
            _ => None,
        };
        let mut verdict = lifecycle::decide(&snapshot, decision);
        let mut leased_inline = false;
        let changed = match &verdict {
            Verdict::Transition {
                to: State::Confirming,
                ..
            } => {
                // The database clock at the UPDATE is the arbiter of "before expires_at".
                // HELD rows carry no lease: the deciding instance takes it in the same UPDATE.
                let confirmed = sqlx::query(
                    "UPDATE reservations SET state = 'CONFIRMING', version = version + 1, \
                     updated_at = clock_timestamp(), lease_owner = $2, \
                     lease_until = clock_timestamp() + $3 * interval '1 millisecond' \
                     WHERE id = $1 AND state = 'HELD' AND clock_timestamp() < expires_at",
                )
                .bind(id)
                .bind(lease.owner)
                .bind(millis(lease.duration))
                .execute(&mut *tx)
                .await?
                .rows_affected()
                    == 1;
                if confirmed {
                    record_payment(&mut tx, id, payment).await?;
                    leased_inline = true;
                    true
                } else {
                    // Lapsed between the read and the update: judge again as expired.
                    let lapsed = Snapshot {
                        expired: true,
                        ..snapshot
                    };
                    verdict = lifecycle::decide(&lapsed, decision);
                    self.apply_lapsed(&mut tx, id, &verdict, payment).await?
                }
            }
            Verdict::Transition {
                to,
                release_outcome,
            } => {
                let reason = match decision {
                    Decision::Cancel { reason } => reason.as_deref(),
                    _ => None,
                };
                leased_inline = sqlx::query(
                    "UPDATE reservations SET state = $2, release_outcome = $3, cancel_reason = $4, \
                     version = version + 1, updated_at = clock_timestamp(), lease_owner = $5, \
                     lease_until = clock_timestamp() + $6 * interval '1 millisecond' \
                     WHERE id = $1 AND state = 'HELD'",
                )
                .bind(id)
                .bind(to.as_str())
                .bind(release_outcome.map(State::as_str))
                .bind(reason)
                .bind(lease.owner)
                .bind(millis(lease.duration))
                .execute(&mut *tx)
                .await?
                .rows_affected()
                    == 1;
                leased_inline
            }
            Verdict::Expire | Verdict::HonorLate => {
                self.apply_lapsed(&mut tx, id, &verdict, payment).await?
            }
            Verdict::Refund { expire, .. } => {
                if *expire {
                    expire_hold(&mut tx, id).await?;
                }
                record_payment(&mut tx, id, payment).await?;
                let reason = if *expire || snapshot.state == State::Expired {
                    "the payment arrived after the hold expired".to_owned()
                } else {
                    format!("the reservation is {}", current.state)
                };
                record_refund(&mut tx, id, &reason).await?
            }
            Verdict::Retake => {
                sqlx::query(
                    "UPDATE reservations SET version = version + 1, updated_at = clock_timestamp() \
                     WHERE id = $1 AND state = 'EXPIRED' AND payment_ref IS NULL",
                )
                .bind(id)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                    == 1
                    && record_payment(&mut tx, id, payment).await?
            }
            Verdict::Extend { by } => sqlx::query(
                "UPDATE reservations SET expires_at = expires_at + $2 * interval '1 millisecond', \
                     extensions_used = extensions_used + 1, version = version + 1, \
                     updated_at = clock_timestamp(), last_extend_request_id = $3 \
                     WHERE id = $1 AND state = 'HELD' AND clock_timestamp() < expires_at",
            )
            .bind(id)
            .bind(millis(*by))
            .bind(decision.extend_request_id())
            .execute(&mut *tx)
            .await?
            .rows_affected()
                == 1,
            Verdict::AlreadyDone | Verdict::Refuse(_) => false,
        };
        let mut leased = leased_inline;
        let reservation = if changed {
            if !leased_inline && !matches!(verdict, Verdict::Extend { .. }) {
                leased = take_lease(&mut tx, id, lease).await?;
            }
            let after = load_existing(&mut tx, id).await?;
            tx.commit().await?;
            after
        } else {
            tx.rollback().await?;
            current
        };
        Ok(Decided::Judged {
            verdict,
            reservation: Box::new(reservation),
            leased,
        })
    }

    async fn record_held(
        &self,
        id: Uuid,
        reports: &[BranchReport],
    ) -> Result<Reservation, StoreError> {
        let (_in_flight, idle) = self.held.enter();
        let recorded = if idle {
            record_held_alone(&self.pool, id, reports).await
        } else {
            let (reply, answer) = oneshot::channel();
            let job = HeldJob {
                id,
                reports: reports.to_vec(),
                reply,
            };
            match self.held.submit(job) {
                Ok(()) => answer.await.unwrap_or_else(batch_task_gone),
                Err(job) => record_held_alone(&self.pool, job.id, &job.reports).await,
            }
        };
        if let Ok(r) = &recorded
            && r.stored_state == State::Held
        {
            self.recently_held.put(r);
        }
        recorded
    }

    async fn record_rejected(
        &self,
        id: Uuid,
        rejection: Option<&Rejection>,
        reports: &[BranchReport],
    ) -> Result<Reservation, StoreError> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query(
            "UPDATE reservations SET state = 'CANCELLING', release_outcome = 'REJECTED', \
             rejection_participant = $2, rejection_resource = $3, rejection_reason = $4, \
             version = version + 1, updated_at = clock_timestamp() \
             WHERE id = $1 AND state = 'TRYING'",
        )
        .bind(id)
        .bind(rejection.map(|r| r.participant.as_str()))
        .bind(rejection.map(|r| r.resource.as_str()))
        .bind(rejection.map(|r| r.reason.as_str()))
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if done == 1 {
            apply_reports(&mut tx, id, reports).await?;
        }
        let after = load_existing(&mut tx, id).await?;
        tx.commit().await?;
        Ok(after)
    }

    async fn record_phase(
        &self,
        id: Uuid,
        from: State,
        reports: &[BranchReport],
        finish: Option<State>,
        backoff: Backoff,
    ) -> Result<PhaseRecorded, StoreError> {
        let (_in_flight, idle) = self.phases.enter();
        let (reply, answer) = oneshot::channel();
        let job = PhaseJob {
            id,
            from,
            reports: reports.to_vec(),
            finish,
            backoff,
            reply,
        };
        let queued = if idle {
            Err(job)
        } else {
            self.phases.submit(job)
        };
        match queued {
            Ok(()) => answer.await.unwrap_or_else(batch_task_gone),
            Err(job) => record_phase_alone(&self.pool, &job).await,
        }
    }

    async fn claim_due(&self, lease: WorkLease, limit: u32) -> Result<Vec<Claimed>, StoreError> {
        // Expiry is decided here, by the database clock, in the same statement that claims the
        // row: a Confirm racing it waits on the row lock and then sees CANCELLING.
        let rows: Vec<(Uuid, bool)> = sqlx::query_as(
            "WITH due AS ( \
                SELECT id, state FROM reservations \
                WHERE (lease_until IS NULL OR lease_until < clock_timestamp()) \
                  AND ((state IN ('TRYING', 'HELD', 'CONFIRMING', 'CANCELLING') \
                        AND CASE state \
                              WHEN 'HELD' THEN expires_at <= clock_timestamp() \
                              ELSE coalesce(next_attempt_at, '-infinity') <= clock_timestamp() \
                            END) \
                    OR ((refund_state = 'PENDING' \
                         OR (state = 'EXPIRED' AND payment_ref IS NOT NULL AND refund_id IS NULL)) \
                        AND coalesce(next_attempt_at, '-infinity') <= clock_timestamp())) \
                ORDER BY coalesce(next_attempt_at, expires_at) \
                LIMIT $3 \
                FOR UPDATE SKIP LOCKED) \
             UPDATE reservations r SET \
                lease_owner = $1, \
                lease_until = clock_timestamp() + $2 * interval '1 millisecond', \
                state = CASE WHEN r.state = 'HELD' THEN 'CANCELLING' ELSE r.state END, \
                release_outcome = CASE WHEN r.state = 'HELD' THEN 'EXPIRED' ELSE r.release_outcome END, \
                version = CASE WHEN r.state = 'HELD' THEN r.version + 1 ELSE r.version END, \
                updated_at = CASE WHEN r.state = 'HELD' THEN clock_timestamp() ELSE r.updated_at END \
             FROM due WHERE r.id = due.id \
             RETURNING r.id, due.state = 'HELD'",
        )
        .bind(lease.owner)
        .bind(millis(lease.duration))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(id, expired)| Claimed { id, expired })
            .collect())
    }

    async fn begin_retake(&self, id: Uuid) -> Result<Reservation, StoreError> {
        let mut tx = self.pool.begin().await?;
        let generation: Option<i32> = sqlx::query_scalar(
            "UPDATE reservations SET generation = generation + 1, \
             expires_at = clock_timestamp() + ttl_ms * interval '1 millisecond', \
             version = version + 1, updated_at = clock_timestamp() \
             WHERE id = $1 AND state = 'EXPIRED' RETURNING generation",
        )
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(generation) = generation else {
            tx.rollback().await?;
            return load_existing(&mut *self.pool.acquire().await?, id).await;
        };
        // Same holds, same order; a fresh branch id per participant (new TCC branches).
        sqlx::query(
            "WITH fresh AS ( \
                SELECT participant, gen_random_uuid() AS branch_id FROM branches \
                WHERE reservation_id = $1 AND generation = $2 - 1 GROUP BY participant) \
             INSERT INTO branches (reservation_id, generation, position, branch_id, participant, \
                                   resource, quantity, during_start, during_end, state) \
             SELECT b.reservation_id, $2, b.position, f.branch_id, b.participant, b.resource, \
                    b.quantity, b.during_start, b.during_end, 'PENDING' \
             FROM branches b JOIN fresh f USING (participant) \
             WHERE b.reservation_id = $1 AND b.generation = $2 - 1",
        )
        .bind(id)
        .bind(generation)
        .execute(&mut *tx)
        .await?;
        let r = load_existing(&mut tx, id).await?;
        tx.commit().await?;
        Ok(r)
    }

    async fn finish_retake(
        &self,
        id: Uuid,
        reports: &[BranchReport],
    ) -> Result<Reservation, StoreError> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query(
            "UPDATE reservations SET state = 'CONFIRMING', late_payment_honored = true, \
             version = version + 1, updated_at = clock_timestamp() \
             WHERE id = $1 AND state = 'EXPIRED' AND refund_id IS NULL",
        )
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if done == 1 {
            apply_reports(&mut tx, id, reports).await?;
        }
        let r = load_existing(&mut tx, id).await?;
        tx.commit().await?;
        Ok(r)
    }

    async fn fail_retake(
        &self,
        id: Uuid,
        reports: &[BranchReport],
        reason: &str,
    ) -> Result<Reservation, StoreError> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query(
            "UPDATE reservations SET state = 'CANCELLING', release_outcome = 'EXPIRED', \
             version = version + 1, updated_at = clock_timestamp() \
             WHERE id = $1 AND state = 'EXPIRED' AND refund_id IS NULL",
        )
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if done == 1 {
            apply_reports(&mut tx, id, reports).await?;
            record_refund(&mut tx, id, reason).await?;
        }
        let r = load_existing(&mut tx, id).await?;
        tx.commit().await?;
        Ok(r)
    }

    async fn record_refund_attempt(
        &self,
        id: Uuid,
        acknowledged: bool,
        backoff: Backoff,
    ) -> Result<Reservation, StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "UPDATE reservations SET \
               refund_state = CASE WHEN $2 THEN 'REFUNDED' ELSE refund_state END, \
               version = version + CASE WHEN $2 THEN 1 ELSE 0 END, \
               lease_owner = NULL, lease_until = NULL, \
               next_attempt_at = CASE WHEN $2 THEN NULL ELSE clock_timestamp() + \
                   least($4::float8, $3::float8 * power(2, least(recovery_attempts, 30))) \
                   * (0.5 + random() / 2) * interval '1 millisecond' END, \
               recovery_attempts = CASE WHEN $2 THEN recovery_attempts ELSE recovery_attempts + 1 END \
             WHERE id = $1 AND refund_state = 'PENDING'",
        )
        .bind(id)
        .bind(acknowledged)
        .bind(millis(backoff.base) as f64)
        .bind(millis(backoff.cap) as f64)
        .execute(&mut *tx)
        .await?;
        let r = load_existing(&mut tx, id).await?;
        tx.commit().await?;
        Ok(r)
    }

    async fn renew_lease(&self, id: Uuid, lease: WorkLease) -> Result<bool, StoreError> {
        let renewed = sqlx::query(
            "UPDATE reservations SET lease_until = clock_timestamp() + $3 * interval '1 millisecond' \
             WHERE id = $1 AND lease_owner = $2",
        )
        .bind(id)
        .bind(lease.owner)
        .bind(millis(lease.duration))
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(renewed == 1)
    }

    async fn wake_backlog(&self, participant: &str) -> Result<u64, StoreError> {
        let woken = sqlx::query(
            "UPDATE reservations r SET next_attempt_at = clock_timestamp() \
             WHERE r.state IN ('CONFIRMING', 'CANCELLING') \
               AND r.next_attempt_at > clock_timestamp() \
               AND EXISTS (SELECT 1 FROM branches b WHERE b.reservation_id = r.id \
                           AND b.participant = $1 AND b.last_error IS NOT NULL)",
        )
        .bind(participant)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(woken)
    }

    async fn backlog(&self) -> Result<i64, StoreError> {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM reservations \
             WHERE state IN ('TRYING', 'CONFIRMING', 'CANCELLING') \
                OR (state = 'HELD' AND expires_at <= clock_timestamp()) \
                OR refund_state = 'PENDING'",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(n)
    }
}
