//! The coordinator's store on SQLite (bundled, WAL, one file).
//!
//! Same behaviour as [`super::postgres`], different mechanics:
//! - **Writers serialise.** Every write transaction begins with `BEGIN IMMEDIATE`, which takes
//!   the database's write lock up front (waiting up to the busy timeout). What PostgreSQL gets
//!   from `SELECT ... FOR UPDATE`, advisory locks and `FOR UPDATE SKIP LOCKED`, SQLite gets from
//!   that one lock: inside the transaction nobody else writes, so a read followed by a
//!   conditional UPDATE is atomic, and so are a hold-limit count and its insert. Readers (WAL)
//!   never block and never wait for writers.
//! - **The clock is the database's.** Every "now" is SQLite's (`unixepoch('now', 'subsec')`,
//!   millisecond resolution), evaluated inside the statement that decides, as PostgreSQL's
//!   `clock_timestamp()` is. Times are stored as INTEGER microseconds since the Unix epoch.
//! - UUIDs are 16-byte BLOBs, labels JSON text, booleans 0/1 (see the migration).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::sqlite::{SqliteConnection, SqlitePool};
use sqlx::types::Json;
use sqlx::{Sqlite, Transaction};
use uuid::Uuid;

use super::record::{StoredBranch, StoredReservation};
use super::{BranchReport, Claimed, Created, Decided, PhaseRecorded, Store, StoreError, WorkLease};
use crate::domain::lifecycle::{self, Snapshot};
use crate::domain::policy::{Backoff, HoldLimits, LimitScope};
use crate::domain::{
    Branch, Decision, HoldToken, ListQuery, NewReservation, Payment, Rejection, Reservation, State,
    Verdict,
};

/// The coordinator's SQLite schema, embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/coordinator-sqlite");

/// Columns of `reservations` every read needs, plus whether a HELD one lapsed (lazy expiry).
macro_rules! reservation_columns {
    () => {
        concat!(
            "id, request_id, holder, state, release_outcome, hold_token, ttl_ms, \
             created_at, expires_at, extensions_used, labels, rejection_participant, \
             rejection_resource, rejection_reason, late_payment_honored, version, \
             payment_participant, payment_ref, payment_amount_minor, payment_currency, \
             refund_id, refund_state, refund_reason, generation, \
             (state = 'HELD' AND expires_at <= ",
            sqlite_now_us!(),
            ") AS lapsed"
        )
    };
}

macro_rules! branch_columns {
    () => {
        "reservation_id, branch_id, participant, resource, quantity, \
         during_start, during_end, state, attempts, last_error"
    };
}

/// Reservations on SQLite.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
}

impl SqliteStore {
    /// Opens the database file named by `url` with holdfast's SQLite conventions
    /// ([`crate::db::open_sqlite`]), with a pool of `max_connections`.
    pub async fn connect(url: &str, max_connections: u32) -> Result<SqliteStore, StoreError> {
        Ok(SqliteStore {
            pool: crate::db::open_sqlite(url, max_connections).await?,
        })
    }

    /// Wraps an existing pool (its connections must have foreign keys on).
    pub fn from_pool(pool: SqlitePool) -> SqliteStore {
        SqliteStore { pool }
    }

    /// Applies pending migrations.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    /// A write transaction: the write lock is ours until commit or rollback.
    async fn begin_write(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        Ok(self.pool.begin_with(crate::db::SQLITE_BEGIN_WRITE).await?)
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
    generation: i32,
    lapsed: bool,
}

#[derive(sqlx::FromRow)]
struct BranchRow {
    reservation_id: Uuid,
    branch_id: Uuid,
    participant: String,
    resource: String,
    quantity: i64,
    during_start: Option<i64>,
    during_end: Option<i64>,
    state: String,
    attempts: i32,
    last_error: Option<String>,
}

/// Stored microseconds since the epoch -> a time.
fn time_of(us: i64) -> Result<DateTime<Utc>, StoreError> {
    DateTime::from_timestamp_micros(us)
        .ok_or_else(|| StoreError::Corrupt(format!("timestamp {us} out of range")))
}

/// A time -> stored microseconds since the epoch (PostgreSQL's precision too).
fn micros_of(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

/// A duration in microseconds, saturating.
fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

impl ReservationRow {
    fn into_domain(self, branches: Vec<Branch>) -> Result<Reservation, StoreError> {
        StoredReservation {
            id: self.id,
            request_id: self.request_id,
            holder: self.holder,
            state: self.state,
            release_outcome: self.release_outcome,
            hold_token: self.hold_token,
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
            generation: self.generation,
            lapsed: self.lapsed,
        }
        .into_domain(branches)
    }
}

impl BranchRow {
    fn into_domain(self) -> Result<Branch, StoreError> {
        StoredBranch {
            branch_id: self.branch_id,
            participant: self.participant,
            resource: self.resource,
            quantity: self.quantity,
            during_start: self.during_start.map(time_of).transpose()?,
            during_end: self.during_end.map(time_of).transpose()?,
            state: self.state,
            attempts: self.attempts,
            last_error: self.last_error,
        }
        .into_domain()
    }
}

/// Reads one reservation with its current generation of branches.
async fn load(conn: &mut SqliteConnection, id: Uuid) -> Result<Option<Reservation>, StoreError> {
    let Some(row) = sqlx::query_as::<_, ReservationRow>(concat!(
        "SELECT ",
        reservation_columns!(),
        " FROM reservations WHERE id = ?1"
    ))
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?
    else {
        return Ok(None);
    };
    let branches = sqlx::query_as::<_, BranchRow>(concat!(
        "SELECT ",
        branch_columns!(),
        " FROM branches WHERE reservation_id = ?1 AND generation = ?2 ORDER BY position"
    ))
    .bind(id)
    .bind(row.generation)
    .fetch_all(&mut *conn)
    .await?
    .into_iter()
    .map(BranchRow::into_domain)
    .collect::<Result<Vec<_>, _>>()?;
    row.into_domain(branches).map(Some)
}

/// Loads a reservation that must exist (we hold its id from a row we just wrote).
async fn load_existing(conn: &mut SqliteConnection, id: Uuid) -> Result<Reservation, StoreError> {
    load(conn, id)
        .await?
        .ok_or_else(|| StoreError::Corrupt(format!("reservation {id} vanished")))
}

/// Records each participant's answer on its branch rows (of every generation, as in
/// PostgreSQL: branch ids are unique per generation).
async fn apply_reports(
    conn: &mut SqliteConnection,
    id: Uuid,
    reports: &[BranchReport],
) -> Result<(), StoreError> {
    for r in reports {
        sqlx::query(
            "UPDATE branches SET state = ?3, attempts = attempts + 1, last_error = ?4 \
             WHERE reservation_id = ?1 AND branch_id = ?2",
        )
        .bind(id)
        .bind(r.branch_id)
        .bind(r.state.as_str())
        .bind(r.error.as_deref())
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Leases a reservation to `lease.owner` (it is about to drive it), unless another instance
/// holds an unexpired lease on it (it is driving it already). True if the lease is ours.
async fn take_lease(
    conn: &mut SqliteConnection,
    id: Uuid,
    lease: WorkLease,
) -> Result<bool, StoreError> {
    let taken = sqlx::query(concat!(
        "UPDATE reservations SET lease_owner = ?2, lease_until = ",
        sqlite_now_us!(),
        " + ?3 WHERE id = ?1 AND (lease_owner IS NULL OR lease_owner = ?2 \
                                   OR lease_until IS NULL OR lease_until < ",
        sqlite_now_us!(),
        ")"
    ))
    .bind(id)
    .bind(lease.owner)
    .bind(micros(lease.duration))
    .execute(&mut *conn)
    .await?
    .rows_affected();
    Ok(taken == 1)
}

/// Moves a reservation `from -> to` if it is still in `from`; the row count decides.
async fn transition(
    conn: &mut SqliteConnection,
    id: Uuid,
    from: State,
    to: State,
) -> Result<bool, StoreError> {
    let done = sqlx::query(concat!(
        "UPDATE reservations SET state = ?3, version = version + 1, updated_at = ",
        sqlite_now_us!(),
        " WHERE id = ?1 AND state = ?2"
    ))
    .bind(id)
    .bind(from.as_str())
    .bind(to.as_str())
    .execute(&mut *conn)
    .await?
    .rows_affected();
    Ok(done == 1)
}

/// Records the payment given to Confirm (the first one only).
async fn record_payment(
    conn: &mut SqliteConnection,
    id: Uuid,
    payment: Option<&Payment>,
) -> Result<bool, StoreError> {
    let Some(p) = payment else {
        return Ok(true);
    };
    sqlx::query(
        "UPDATE reservations SET payment_participant = ?2, payment_ref = ?3, \
         payment_amount_minor = ?4, payment_currency = ?5 \
         WHERE id = ?1 AND payment_ref IS NULL",
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
    conn: &mut SqliteConnection,
    id: Uuid,
    reason: &str,
) -> Result<bool, StoreError> {
    let done = sqlx::query(concat!(
        "UPDATE reservations SET refund_id = ?2, refund_state = 'PENDING', refund_reason = ?3, \
         next_attempt_at = ",
        sqlite_now_us!(),
        ", version = version + 1, updated_at = ",
        sqlite_now_us!(),
        " WHERE id = ?1 AND refund_id IS NULL AND payment_ref IS NOT NULL"
    ))
    .bind(id)
    .bind(Uuid::new_v4())
    .bind(reason)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    Ok(done == 1)
}

/// `HELD -> CANCELLING` ending `EXPIRED`, only if the database clock says the hold lapsed.
async fn expire_hold(conn: &mut SqliteConnection, id: Uuid) -> Result<bool, StoreError> {
    let done = sqlx::query(concat!(
        "UPDATE reservations SET state = 'CANCELLING', release_outcome = 'EXPIRED', \
         version = version + 1, updated_at = ",
        sqlite_now_us!(),
        " WHERE id = ?1 AND state = 'HELD' AND expires_at <= ",
        sqlite_now_us!()
    ))
    .bind(id)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    Ok(done == 1)
}

/// Applies a verdict on a lapsed HELD reservation: release it, or honour a late payment by
/// confirming the holds as they are.
async fn apply_lapsed(
    conn: &mut SqliteConnection,
    id: Uuid,
    verdict: &Verdict,
    payment: Option<&Payment>,
) -> Result<bool, StoreError> {
    match verdict {
        Verdict::HonorLate => {
            let done = sqlx::query(concat!(
                "UPDATE reservations SET state = 'CONFIRMING', late_payment_honored = 1, \
                 version = version + 1, updated_at = ",
                sqlite_now_us!(),
                " WHERE id = ?1 AND state = 'HELD'"
            ))
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

/// Gives up the lease and, unless `finished`, schedules the next attempt:
/// `now + min(cap, base * 2^attempts) * (0.5 + jitter/2)`, jitter uniform in [0, 1).
/// (SQLite has no `power()` without its math extension: the doubling is a shift.)
macro_rules! backoff_next_attempt {
    ($finished:literal, $base:literal, $cap:literal) => {
        concat!(
            "next_attempt_at = CASE WHEN ",
            $finished,
            " THEN NULL ELSE ",
            sqlite_now_us!(),
            " + CAST(min(",
            $cap,
            ", ",
            $base,
            " * (1 << min(recovery_attempts, 30))) \
               * (0.5 + (random() & 1048575) / 2097152.0) AS INTEGER) END, \
             recovery_attempts = CASE WHEN ",
            $finished,
            " THEN recovery_attempts ELSE recovery_attempts + 1 END"
        )
    };
}

#[async_trait]
impl Store for SqliteStore {
    async fn create(
        &self,
        new: &NewReservation,
        token: &HoldToken,
        lease: WorkLease,
        limits: HoldLimits,
    ) -> Result<Created, StoreError> {
        let id = Uuid::now_v7();
        let ttl_ms = i64::try_from(new.ttl.as_millis()).unwrap_or(i64::MAX);
        // The write lock makes the lookup, the limit counts and the insert one atomic step
        // (PostgreSQL needs advisory locks for that).
        let mut tx = self.begin_write().await?;
        let (existing, live_for_holder): (Option<Uuid>, i64) = sqlx::query_as(concat!(
            "SELECT (SELECT id FROM reservations WHERE holder = ?1 AND request_id = ?2), \
                    (SELECT count(*) FROM reservations WHERE holder = ?1 \
                       AND state IN ('TRYING', 'HELD') \
                       AND (state = 'TRYING' OR expires_at > ",
            sqlite_now_us!(),
            "))"
        ))
        .bind(&new.holder)
        .bind(&new.request_id)
        .fetch_one(&mut *tx)
        .await?;
        if let Some(existing) = existing {
            let found = load_existing(&mut tx, existing).await?;
            tx.rollback().await?;
            return Ok(Created::Existing(found));
        }
        if live_for_holder >= i64::from(limits.per_holder) {
            tx.rollback().await?;
            return Ok(Created::LimitReached(LimitScope::Holder));
        }
        if limits.total > 0 {
            let live: i64 = sqlx::query_scalar(concat!(
                "SELECT count(*) FROM reservations WHERE state IN ('TRYING', 'HELD') \
                   AND (state = 'TRYING' OR expires_at > ",
                sqlite_now_us!(),
                ")"
            ))
            .fetch_one(&mut *tx)
            .await?;
            if live >= i64::from(limits.total) {
                tx.rollback().await?;
                return Ok(Created::LimitReached(LimitScope::Total));
            }
        }
        let inserted = sqlx::query(concat!(
            "INSERT INTO reservations (id, request_id, holder, state, hold_token, ttl_ms, \
                                       created_at, updated_at, expires_at, labels, \
                                       lease_owner, lease_until) \
             VALUES (?1, ?2, ?3, 'TRYING', ?4, ?5, ",
            sqlite_now_us!(),
            ", ",
            sqlite_now_us!(),
            ", ",
            sqlite_now_us!(),
            " + ?5 * 1000, ?6, ?7, ",
            sqlite_now_us!(),
            " + ?8) \
             ON CONFLICT (holder, request_id) DO NOTHING"
        ))
        .bind(id)
        .bind(&new.request_id)
        .bind(&new.holder)
        .bind(token.expose())
        .bind(ttl_ms)
        .bind(Json(&new.labels))
        .bind(lease.owner)
        .bind(micros(lease.duration))
        .execute(&mut *tx)
        .await?
        .rows_affected();
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
            sqlx::query(
                "INSERT INTO branches (reservation_id, position, branch_id, participant, resource, \
                                       quantity, during_start, during_end, state) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'PENDING')",
            )
            .bind(id)
            .bind(i64::try_from(i).unwrap_or(i64::MAX))
            .bind(branch_id)
            .bind(&h.participant)
            .bind(&h.resource)
            .bind(h.quantity)
            .bind(h.during.map(|d| micros_of(d.start)))
            .bind(h.during.map(|d| micros_of(d.end)))
            .execute(&mut *tx)
            .await?;
        }
        let created = load_existing(&mut tx, id).await?;
        tx.commit().await?;
        Ok(Created::New(created))
    }

    async fn get(&self, id: Uuid) -> Result<Option<Reservation>, StoreError> {
        // A read transaction: the row and its branches come from one snapshot (WAL readers
        // neither wait for nor block the writer).
        let mut tx = self.pool.begin().await?;
        let r = load(&mut tx, id).await?;
        tx.rollback().await?;
        Ok(r)
    }

    async fn list(&self, query: &ListQuery) -> Result<Vec<Reservation>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let (after_ts, after_id) = match query.after {
            Some((ts, id)) => (Some(micros_of(ts)), Some(id)),
            None => (None, None),
        };
        let rows = sqlx::query_as::<_, ReservationRow>(concat!(
            "SELECT ",
            reservation_columns!(),
            " FROM reservations \
             WHERE (?1 IS NULL OR holder = ?1) \
               AND (?2 IS NULL OR \
                    (CASE WHEN state = 'HELD' AND expires_at <= ",
            sqlite_now_us!(),
            " THEN 'EXPIRED' ELSE state END) = ?2) \
               AND (?3 IS NULL OR (created_at, id) < (?3, ?4)) \
             ORDER BY created_at DESC, id DESC LIMIT ?5"
        ))
        .bind(query.holder.as_deref())
        .bind(query.state.map(State::as_str))
        .bind(after_ts)
        .bind(after_id)
        .bind(i64::from(query.limit))
        .fetch_all(&mut *tx)
        .await?;
        // The page's branches in one statement: the ids travel as a JSON array of hex strings.
        let ids: Vec<String> = rows.iter().map(|r| r.id.simple().to_string()).collect();
        let mut branches: HashMap<Uuid, Vec<Branch>> = HashMap::new();
        for b in sqlx::query_as::<_, BranchRow>(concat!(
            "SELECT ",
            branch_columns!(),
            " FROM branches b \
             WHERE reservation_id IN (SELECT unhex(value) FROM json_each(?1)) \
               AND generation = (SELECT generation FROM reservations r WHERE r.id = b.reservation_id) \
             ORDER BY reservation_id, position"
        ))
        .bind(Json(&ids))
        .fetch_all(&mut *tx)
        .await?
        {
            let rid = b.reservation_id;
            branches.entry(rid).or_default().push(b.into_domain()?);
        }
        tx.rollback().await?;
        rows.into_iter()
            .map(|r| {
                let bs = branches.remove(&r.id).unwrap_or_default();
                r.into_domain(bs)
            })
            .collect()
    }

    async fn decide(
        &self,
        id: Uuid,
        presented_token: &str,
        decision: &Decision,
        lease: WorkLease,
    ) -> Result<Decided, StoreError> {
        // The write lock stands in for PostgreSQL's row lock: nothing changes the row between
        // this read and the conditional UPDATE below.
        let mut tx = self.begin_write().await?;
        let Some(current) = load(&mut tx, id).await? else {
            tx.rollback().await?;
            return Ok(Decided::NotFound);
        };
        if !current.hold_token.matches(presented_token) {
            tx.rollback().await?;
            return Ok(Decided::TokenMismatch);
        }
        let repeats_last_extend = match decision.extend_request_id() {
            Some(key) => sqlx::query_scalar(
                "SELECT coalesce(last_extend_request_id = ?2, 0) FROM reservations WHERE id = ?1",
            )
            .bind(id)
            .bind(key)
            .fetch_one(&mut *tx)
            .await?,
            None => false,
        };
        let snapshot = Snapshot {
            state: current.stored_state,
            release_outcome: current.release_outcome,
            expired: current.state == State::Expired && current.stored_state == State::Held,
            created_at: current.created_at,
            expires_at: current.expires_at,
            extensions_used: current.extensions_used,
            ttl: current.ttl,
            has_payment: current.payment.is_some(),
            has_refund: current.refund.is_some(),
            repeats_last_extend,
        };
        let payment = match decision {
            Decision::Confirm { payment, .. } => payment.as_ref(),
            _ => None,
        };
        let mut verdict = lifecycle::decide(&snapshot, decision);
        let changed = match &verdict {
            Verdict::Transition {
                to: State::Confirming,
                ..
            } => {
                // The database clock at the UPDATE is the arbiter of "before expires_at".
                let confirmed = sqlx::query(concat!(
                    "UPDATE reservations SET state = 'CONFIRMING', version = version + 1, \
                     updated_at = ",
                    sqlite_now_us!(),
                    " WHERE id = ?1 AND state = 'HELD' AND ",
                    sqlite_now_us!(),
                    " < expires_at"
                ))
                .bind(id)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                    == 1;
                if confirmed {
                    record_payment(&mut tx, id, payment).await?;
                    true
                } else {
                    // Lapsed between the read and the update: judge again as expired.
                    let lapsed = Snapshot {
                        expired: true,
                        ..snapshot
                    };
                    verdict = lifecycle::decide(&lapsed, decision);
                    apply_lapsed(&mut tx, id, &verdict, payment).await?
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
                sqlx::query(concat!(
                    "UPDATE reservations SET state = ?2, release_outcome = ?3, cancel_reason = ?4, \
                     version = version + 1, updated_at = ",
                    sqlite_now_us!(),
                    " WHERE id = ?1 AND state = 'HELD'"
                ))
                .bind(id)
                .bind(to.as_str())
                .bind(release_outcome.map(State::as_str))
                .bind(reason)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                    == 1
            }
            Verdict::Expire | Verdict::HonorLate => {
                apply_lapsed(&mut tx, id, &verdict, payment).await?
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
                sqlx::query(concat!(
                    "UPDATE reservations SET version = version + 1, updated_at = ",
                    sqlite_now_us!(),
                    " WHERE id = ?1 AND state = 'EXPIRED' AND payment_ref IS NULL"
                ))
                .bind(id)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                    == 1
                    && record_payment(&mut tx, id, payment).await?
            }
            Verdict::Extend { by } => {
                sqlx::query(concat!(
                    "UPDATE reservations SET expires_at = expires_at + ?2, \
                     extensions_used = extensions_used + 1, version = version + 1, \
                     last_extend_request_id = ?3, updated_at = ",
                    sqlite_now_us!(),
                    " WHERE id = ?1 AND state = 'HELD' AND ",
                    sqlite_now_us!(),
                    " < expires_at"
                ))
                .bind(id)
                .bind(micros(*by))
                .bind(decision.extend_request_id())
                .execute(&mut *tx)
                .await?
                .rows_affected()
                    == 1
            }
            Verdict::AlreadyDone | Verdict::Refuse(_) => false,
        };
        let mut leased = false;
        let reservation = if changed {
            if !matches!(verdict, Verdict::Extend { .. }) {
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
        let mut tx = self.begin_write().await?;
        if transition(&mut tx, id, State::Trying, State::Held).await? {
            apply_reports(&mut tx, id, reports).await?;
            sqlx::query(
                "UPDATE reservations SET lease_owner = NULL, lease_until = NULL WHERE id = ?1",
            )
            .bind(id)
            .execute(&mut *tx)
            .await?;
        }
        let after = load_existing(&mut tx, id).await?;
        tx.commit().await?;
        Ok(after)
    }

    async fn record_rejected(
        &self,
        id: Uuid,
        rejection: Option<&Rejection>,
        reports: &[BranchReport],
    ) -> Result<Reservation, StoreError> {
        let mut tx = self.begin_write().await?;
        let done = sqlx::query(concat!(
            "UPDATE reservations SET state = 'CANCELLING', release_outcome = 'REJECTED', \
             rejection_participant = ?2, rejection_resource = ?3, rejection_reason = ?4, \
             version = version + 1, updated_at = ",
            sqlite_now_us!(),
            " WHERE id = ?1 AND state = 'TRYING'"
        ))
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
        // The write lock orders two drivers of one reservation: they record one after the other.
        let mut tx = self.begin_write().await?;
        let mut finished = false;
        let still_there: Option<String> =
            sqlx::query_scalar("SELECT state FROM reservations WHERE id = ?1")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
        if still_there.as_deref() == Some(from.as_str()) {
            apply_reports(&mut tx, id, reports).await?;
            finished = match finish {
                Some(to) => transition(&mut tx, id, from, to).await?,
                None => false,
            };
            if finished && finish == Some(State::Failed) {
                // A lost hold voids the sale: any payment is refunded.
                record_refund(&mut tx, id, "a participant lost a hold it had granted").await?;
            }
            // Finished or not, this driver is done with it: free the lease. Unfinished work
            // waits out its backoff (with jitter, so a herd of retries spreads out).
            sqlx::query(concat!(
                "UPDATE reservations SET lease_owner = NULL, lease_until = NULL, ",
                backoff_next_attempt!("?2", "?3", "?4"),
                " WHERE id = ?1"
            ))
            .bind(id)
            .bind(finished)
            .bind(micros(backoff.base) as f64)
            .bind(micros(backoff.cap) as f64)
            .execute(&mut *tx)
            .await?;
        }
        let reservation = load_existing(&mut tx, id).await?;
        tx.commit().await?;
        Ok(PhaseRecorded {
            reservation,
            finished,
        })
    }

    async fn claim_due(&self, lease: WorkLease, limit: u32) -> Result<Vec<Claimed>, StoreError> {
        // Under the write lock the pick and the claim are one atomic step: no other instance
        // can claim (or decide on) a row in between, which is what FOR UPDATE SKIP LOCKED gives
        // PostgreSQL. Expiry is decided here, by the database clock, in the claiming UPDATE.
        let mut tx = self.begin_write().await?;
        let due: Vec<(Uuid, String)> = sqlx::query_as(concat!(
            "SELECT id, state FROM reservations \
             WHERE (lease_until IS NULL OR lease_until < ",
            sqlite_now_us!(),
            ") AND ((state IN ('TRYING', 'HELD', 'CONFIRMING', 'CANCELLING') \
                    AND CASE state \
                          WHEN 'HELD' THEN expires_at <= ",
            sqlite_now_us!(),
            "         ELSE coalesce(next_attempt_at, -9223372036854775807) <= ",
            sqlite_now_us!(),
            "       END) \
                OR ((refund_state = 'PENDING' \
                     OR (state = 'EXPIRED' AND payment_ref IS NOT NULL AND refund_id IS NULL)) \
                    AND coalesce(next_attempt_at, -9223372036854775807) <= ",
            sqlite_now_us!(),
            ")) ORDER BY coalesce(next_attempt_at, expires_at) LIMIT ?1"
        ))
        .bind(i64::from(limit))
        .fetch_all(&mut *tx)
        .await?;
        let mut claimed = Vec::with_capacity(due.len());
        for (id, state) in due {
            let expired = sqlx::query_scalar::<_, bool>(concat!(
                "UPDATE reservations SET \
                    lease_owner = ?2, \
                    lease_until = ",
                sqlite_now_us!(),
                " + ?3, \
                    release_outcome = CASE WHEN state = 'HELD' THEN 'EXPIRED' ELSE release_outcome END, \
                    version = CASE WHEN state = 'HELD' THEN version + 1 ELSE version END, \
                    updated_at = CASE WHEN state = 'HELD' THEN ",
                sqlite_now_us!(),
                " ELSE updated_at END, \
                    state = CASE WHEN state = 'HELD' THEN 'CANCELLING' ELSE state END \
                 WHERE id = ?1 AND state = ?4 \
                   AND (state <> 'HELD' OR expires_at <= ",
                sqlite_now_us!(),
                ") RETURNING ?4 = 'HELD'"
            ))
            .bind(id)
            .bind(lease.owner)
            .bind(micros(lease.duration))
            .bind(&state)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(expired) = expired {
                claimed.push(Claimed { id, expired });
            }
        }
        tx.commit().await?;
        Ok(claimed)
    }

    async fn begin_retake(&self, id: Uuid) -> Result<Reservation, StoreError> {
        let mut tx = self.begin_write().await?;
        let generation: Option<i32> = sqlx::query_scalar(concat!(
            "UPDATE reservations SET generation = generation + 1, \
             expires_at = ",
            sqlite_now_us!(),
            " + ttl_ms * 1000, version = version + 1, updated_at = ",
            sqlite_now_us!(),
            " WHERE id = ?1 AND state = 'EXPIRED' RETURNING generation"
        ))
        .bind(id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(generation) = generation else {
            let r = load_existing(&mut tx, id).await;
            tx.rollback().await?;
            return r;
        };
        // Same holds, same order; a fresh branch id per participant (new TCC branches).
        let participants: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT participant FROM branches WHERE reservation_id = ?1 AND generation = ?2",
        )
        .bind(id)
        .bind(generation - 1)
        .fetch_all(&mut *tx)
        .await?;
        for participant in participants {
            sqlx::query(
                "INSERT INTO branches (reservation_id, generation, position, branch_id, participant, \
                                       resource, quantity, during_start, during_end, state) \
                 SELECT reservation_id, ?2, position, ?3, participant, resource, quantity, \
                        during_start, during_end, 'PENDING' \
                 FROM branches WHERE reservation_id = ?1 AND generation = ?2 - 1 AND participant = ?4",
            )
            .bind(id)
            .bind(generation)
            .bind(Uuid::new_v4())
            .bind(&participant)
            .execute(&mut *tx)
            .await?;
        }
        let r = load_existing(&mut tx, id).await?;
        tx.commit().await?;
        Ok(r)
    }

    async fn finish_retake(
        &self,
        id: Uuid,
        reports: &[BranchReport],
    ) -> Result<Reservation, StoreError> {
        let mut tx = self.begin_write().await?;
        let done = sqlx::query(concat!(
            "UPDATE reservations SET state = 'CONFIRMING', late_payment_honored = 1, \
             version = version + 1, updated_at = ",
            sqlite_now_us!(),
            " WHERE id = ?1 AND state = 'EXPIRED' AND refund_id IS NULL"
        ))
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
        let mut tx = self.begin_write().await?;
        let done = sqlx::query(concat!(
            "UPDATE reservations SET state = 'CANCELLING', release_outcome = 'EXPIRED', \
             version = version + 1, updated_at = ",
            sqlite_now_us!(),
            " WHERE id = ?1 AND state = 'EXPIRED' AND refund_id IS NULL"
        ))
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
        let mut tx = self.begin_write().await?;
        sqlx::query(concat!(
            "UPDATE reservations SET \
               refund_state = CASE WHEN ?2 THEN 'REFUNDED' ELSE refund_state END, \
               version = version + CASE WHEN ?2 THEN 1 ELSE 0 END, \
               lease_owner = NULL, lease_until = NULL, ",
            backoff_next_attempt!("?2", "?3", "?4"),
            " WHERE id = ?1 AND refund_state = 'PENDING'"
        ))
        .bind(id)
        .bind(acknowledged)
        .bind(micros(backoff.base) as f64)
        .bind(micros(backoff.cap) as f64)
        .execute(&mut *tx)
        .await?;
        let r = load_existing(&mut tx, id).await?;
        tx.commit().await?;
        Ok(r)
    }

    async fn renew_lease(&self, id: Uuid, lease: WorkLease) -> Result<bool, StoreError> {
        let mut tx = self.begin_write().await?;
        let renewed = sqlx::query(concat!(
            "UPDATE reservations SET lease_until = ",
            sqlite_now_us!(),
            " + ?3 WHERE id = ?1 AND lease_owner = ?2"
        ))
        .bind(id)
        .bind(lease.owner)
        .bind(micros(lease.duration))
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(renewed == 1)
    }

    async fn wake_backlog(&self, participant: &str) -> Result<u64, StoreError> {
        let mut tx = self.begin_write().await?;
        let woken = sqlx::query(concat!(
            "UPDATE reservations SET next_attempt_at = ",
            sqlite_now_us!(),
            " WHERE state IN ('CONFIRMING', 'CANCELLING') \
               AND next_attempt_at > ",
            sqlite_now_us!(),
            " AND EXISTS (SELECT 1 FROM branches b WHERE b.reservation_id = reservations.id \
                           AND b.participant = ?1 AND b.last_error IS NOT NULL)"
        ))
        .bind(participant)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(woken)
    }

    async fn backlog(&self) -> Result<i64, StoreError> {
        let n: i64 = sqlx::query_scalar(concat!(
            "SELECT count(*) FROM reservations \
             WHERE state IN ('TRYING', 'CONFIRMING', 'CANCELLING') \
                OR (state = 'HELD' AND expires_at <= ",
            sqlite_now_us!(),
            ") OR refund_state = 'PENDING'"
        ))
        .fetch_one(&self.pool)
        .await?;
        Ok(n)
    }
}
