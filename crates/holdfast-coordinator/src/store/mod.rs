//! Durable storage of reservations: one trait, [`Store`], implemented for PostgreSQL
//! ([`PgStore`]) and SQLite ([`SqliteStore`]); [`connect_store`] picks one by URL scheme.
//!
//! The only module of this crate that issues SQL (`testing/database.rs`, the test clock's own
//! row, aside). Every state change is a conditional
//! UPDATE whose row count decides the outcome: inside a transaction holding the row lock
//! (PostgreSQL: `FOR UPDATE`; SQLite: the database write lock taken by `BEGIN IMMEDIATE`), or,
//! for PostgreSQL's common Confirm/Cancel, guarded by the row's `version` as it was read.
//!
//! The logic is written once; only the SQL is per database:
//! - `sql.rs`: `ReservationSql`, the primitive statements the shared logic runs (one
//!   impl per database, in `postgres/decide.rs` and `sqlite/decide.rs`).
//! - `decide.rs`: the decision flow (token, verdict, the lease), the one description of a
//!   write out of `HELD` (`sql::LeaveHeld`, guarded by the row lock or the version read), and
//!   a swept lapsed hold's expiry by the decision's own statement (`expire_lapsed_hold`).
//! - `retake.rs`: a late payment re-placing released holds (begin, finish, fail).
//! - `outcome.rs`: a refund attempt of the reservation's payment, and when a stopped
//!   placement is final at once (`placed_nothing`; `record_rejected` itself
//!   is each backend's `answers.rs`).
//! - `admission.rs`: whether a Reserve may be recorded (its counts are each backend's
//!   `create.rs`).
//! - `record.rs`: a stored row, either backend's, into a [`Reservation`].
//! - `postgres/`, `sqlite/`: each backend's store, its row reads (`rows.rs`), Reserves
//!   (`create.rs`), recording fan-out answers (`answers.rs`; PostgreSQL group-commits them,
//!   `group_commit.rs`), recovery claims and leases (`recovery.rs`), retention's purge of
//!   finished reservations (`retention.rs`); PostgreSQL's executor of write descriptions, the
//!   unlocked Confirm/Cancel included (`postgres/executor.rs`).

/// Why a `FAILED` reservation's payment is refunded: a lost hold voids the sale. A macro so
/// PostgreSQL's group-committed statement carries it as a literal, as SQLite's code does.
macro_rules! lost_hold_refund_reason {
    () => {
        "a participant lost a hold it had granted"
    };
}

pub mod admin;
mod admission;
pub(crate) mod decide;
pub mod events;
mod extra;
pub mod fault;
pub mod list;
mod outcome;
pub mod postgres;
mod record;
mod retake;
mod sql;
pub mod sqlite;
pub mod waitlist;
mod without_lock;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use uuid::Uuid;

use crate::db::DatabaseKind;
use crate::domain::PresentedToken;
use crate::domain::RequestId;
use crate::domain::admin::{
    AuditEntry, AuditNote, AuditQuery, RetryTarget, StateCounts, StuckQuery, WorkState,
};
use crate::domain::lifecycle::Refusal;
use crate::domain::policy::{Backoff, HoldLimits, LimitScope};
use crate::domain::{
    BranchState, Decision, ExtraPayment, ListQuery, NewReservation, RefundState, Rejection,
    Reservation, State, Verdict,
};

pub use admin::{AdminDecided, Woken};
pub use postgres::PgStore;
pub use sqlite::SqliteStore;
pub use waitlist::{JoinQueue, Joined, QueueHead, QueueStore};

/// A storage failure; [`StoreError::fault`] says what it means for the caller (retry, a value
/// out of range, or internal).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migrating the schema: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A row the schema promises is missing or unreadable.
    #[error("corrupt record: {0}")]
    Corrupt(String),
    /// Concurrent writers kept changing what a write depends on; retrying will do.
    #[error("contended: {0}")]
    Contended(String),
}

impl StoreError {
    /// What the failure means for the caller ([`fault`], the one classification).
    pub fn fault(&self) -> fault::Fault {
        match self {
            StoreError::Database(e) => fault::of_sqlx(e),
            StoreError::Contended(_) => fault::Fault::Transient,
            StoreError::Migrate(_) | StoreError::Corrupt(_) => fault::Fault::Internal,
        }
    }
}

/// What `create` found.
#[derive(Debug)]
pub enum Created {
    /// Recorded now, in `TRYING`.
    New(Reservation),
    /// A reservation with this (owner, holder, request_id) already existed.
    Existing(Reservation),
    /// Nothing recorded: the holder (or everyone) has as many live reservations as allowed.
    LimitReached(LimitScope),
}

/// What `decide` found and did.
#[derive(Debug)]
pub enum Decided {
    NotFound,
    /// The token did not match; nothing changed.
    TokenMismatch,
    /// The verdict of the lifecycle rules; when it is a change, it has been committed and
    /// `reservation` shows the state after it.
    Judged {
        verdict: Verdict,
        reservation: Box<Reservation>,
        /// This instance holds the lease now and should drive the change; false when another
        /// instance is driving the reservation already.
        leased: bool,
    },
    /// The Confirm's payment is recorded on another reservation already (one payment_ref per
    /// reservation); nothing changed.
    PaymentTaken,
    /// [`Verdict::RefundExtra`] applied: the further payment is recorded with its refund (or
    /// was by an earlier repeat of this Confirm, then `leased` is false).
    ExtraRefund {
        answer: Refusal,
        reservation: Box<Reservation>,
        extra: ExtraPayment,
        /// This instance should send the refund now (otherwise recovery will).
        leased: bool,
    },
}

/// A reservation claimed by a sweep: leased to the sweeping instance, its state as it was.
#[derive(Clone, Copy, Debug)]
pub struct Claimed {
    pub id: Uuid,
    /// It was claimed as a lapsed hold (`HELD` past `expires_at` by the database clock): its
    /// driver expires it ([`Store::expire_lapsed_hold`]) before driving the release.
    pub lapsed_hold: bool,
}

/// What `record_phase` did: the coordinator's record of a Confirm or Cancel fan-out (not to be
/// confused with a participant barrier's `Phase`).
#[derive(Debug)]
pub struct PhaseRecorded {
    pub reservation: Reservation,
    /// This call moved the reservation to the terminal state asked for.
    pub finished: bool,
}

/// What a watch needs to notice that a reservation changed without reading all of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub id: Uuid,
    pub version: i64,
    /// `HELD` past `expires_at` (database clock): it reads as `EXPIRED`.
    pub lapsed: bool,
}

/// How one coordinator instance claims work: it owns what it drives until `duration` passes,
/// after which another instance may take it over.
#[derive(Clone, Copy, Debug)]
pub struct WorkLease {
    pub owner: Uuid,
    pub duration: std::time::Duration,
}

/// A participant's answer for one participant-level branch, to record.
#[derive(Clone, Debug)]
pub struct BranchReport {
    pub branch_id: Uuid,
    /// The branch's state now (unchanged when the call failed).
    pub state: BranchState,
    /// Why the call failed, when it did.
    pub error: Option<String>,
}

/// What a payment participant answered to a refund, to record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RefundAnswer {
    /// Acknowledged: the refund becomes `REFUNDED`.
    Refunded,
    /// Not this time (unreachable, timed out, failed, overloaded): retried by the backoff.
    Retry,
    /// Refused for good, with why: the refund becomes `FAILED` and is never sent again.
    Refused(String),
}

impl RefundAnswer {
    /// The refund state this answer settles on; `None`: still `PENDING`.
    fn settles_on(&self) -> Option<&'static str> {
        match self {
            RefundAnswer::Refunded => Some(RefundState::Refunded.as_str()),
            RefundAnswer::Refused(_) => Some(RefundState::Failed.as_str()),
            RefundAnswer::Retry => None,
        }
    }

    /// Why the refund failed, for `FAILED`.
    fn failure(&self) -> Option<&str> {
        match self {
            RefundAnswer::Refused(why) => Some(why),
            _ => None,
        }
    }
}

/// The coordinator's storage.
#[async_trait]
pub trait Store: QueueStore + Send + Sync + 'static {
    /// The event log this store appends to (SPEC 10): the same database.
    fn event_log(&self) -> &dyn events::EventLog;

    /// Records a new reservation in `TRYING` with `expires_at = now + ttl` (database clock),
    /// or finds the existing one with the same (owner, holder, request_id).
    /// The new reservation is leased to `lease.owner` while its holds are placed. The hold
    /// limits are checked and the row inserted atomically.
    async fn create(
        &self,
        new: &NewReservation,
        lease: WorkLease,
        limits: HoldLimits,
    ) -> Result<Created, StoreError>;

    /// Reads one reservation.
    async fn get(&self, id: Uuid) -> Result<Option<Reservation>, StoreError>;

    /// Whether a reservation of (owner, holder, request_id) is recorded: one read of the
    /// idempotency key's unique index, no write (the sold-out fast path asks it, so a repeat of
    /// a recorded request still answers its reservation).
    async fn request_recorded(
        &self,
        owner: &str,
        holder: &str,
        request_id: &RequestId,
    ) -> Result<bool, StoreError>;

    /// Lists reservations newest first.
    async fn list(&self, query: &ListQuery) -> Result<Vec<Reservation>, StoreError>;

    /// The [`Stamp`] of each of `ids` that exists (any order), in one statement: the shared
    /// poller of `WatchReservation` asks for every watched reservation at once.
    async fn versions(&self, ids: &[Uuid]) -> Result<Vec<Stamp>, StoreError>;

    /// Under the row lock: a reservation of another owner than `scope` (when given) is
    /// [`Decided::NotFound`]; then checks the token, judges the decision with
    /// [`crate::domain::lifecycle::decide`], and applies the verdict. A decision that starts a
    /// fan-out leases the reservation to `lease.owner`.
    async fn decide(
        &self,
        id: Uuid,
        scope: Option<&str>,
        presented_token: &PresentedToken,
        decision: &Decision,
        lease: WorkLease,
    ) -> Result<Decided, StoreError>;

    /// `TRYING -> HELD`: every branch holds. Returns the reservation as it is afterwards
    /// (unchanged if it had left `TRYING` meanwhile).
    async fn record_held(
        &self,
        id: Uuid,
        reports: &[BranchReport],
    ) -> Result<Reservation, StoreError>;

    /// `TRYING -> CANCELLING` ending `REJECTED`: a Try was refused or its outcome is unknown
    /// (no `rejection` when the placer itself stopped). When the reports say nothing was
    /// placed (at least one, every one a refusal: a branch without a report was never tried),
    /// there is nothing to release: `TRYING -> REJECTED` at once, its lease freed, in the same
    /// one write.
    async fn record_rejected(
        &self,
        id: Uuid,
        rejection: Option<&Rejection>,
        reports: &[BranchReport],
    ) -> Result<Reservation, StoreError>;

    /// Records the answers of a Confirm or Cancel fan-out; when `finish` is set and the
    /// reservation is still in `from`, moves it to that terminal state in the same transaction.
    /// Otherwise gives up the lease and schedules the next attempt by `backoff`.
    async fn record_phase(
        &self,
        id: Uuid,
        from: State,
        reports: &[BranchReport],
        finish: Option<State>,
        backoff: Backoff,
    ) -> Result<PhaseRecorded, StoreError>;

    /// Claims up to `limit` reservations that need driving and whose lease is free: lapsed
    /// `HELD` ones ([`Claimed::lapsed_hold`]), `TRYING` ones abandoned by their placer,
    /// `CONFIRMING`/`CANCELLING` ones whose retry is due, and those owing a refund. The claim
    /// only leases them to `lease.owner`; it changes no state (a lapsed hold is expired by
    /// [`Store::expire_lapsed_hold`]), and holds no row lock beyond its statement.
    async fn claim_due(&self, lease: WorkLease, limit: u32) -> Result<Vec<Claimed>, StoreError>;

    /// `HELD -> CANCELLING` ending `EXPIRED`, in a write transaction of its own, if the
    /// reservation is `HELD` and lapsed by the database clock: the statement a decision that
    /// finds a lapsed hold runs (`expire_hold`), the one write of a hold's expiry. The lease is
    /// left as it is (a sweep's driver keeps the one its claim took). True if this call expired
    /// it; false if it was not a lapsed `HELD` reservation (a decision got there first).
    async fn expire_lapsed_hold(&self, id: Uuid) -> Result<bool, StoreError>;

    /// Starts honouring a late payment on an `EXPIRED` reservation whose holds were all
    /// released: a new generation of branches (fresh branch ids, `PENDING`) and a new
    /// `expires_at = now + ttl`. The state stays `EXPIRED` until [`Store::finish_retake`].
    async fn begin_retake(&self, id: Uuid) -> Result<Reservation, StoreError>;

    /// Every hold was placed again: `EXPIRED -> CONFIRMING` with `late_payment_honored`.
    async fn finish_retake(
        &self,
        id: Uuid,
        reports: &[BranchReport],
    ) -> Result<Reservation, StoreError>;

    /// Some hold could not be placed again: `EXPIRED -> CANCELLING` (ending `EXPIRED`) to
    /// release what was re-taken, and the payment's refund recorded.
    async fn fail_retake(
        &self,
        id: Uuid,
        reports: &[BranchReport],
        reason: &str,
    ) -> Result<Reservation, StoreError>;

    /// Records the payment participant's answer to the refund: acknowledged (`REFUNDED`),
    /// refused for good (`FAILED` with the reason, never sent again), or retry later by
    /// `backoff`.
    async fn record_refund_attempt(
        &self,
        id: Uuid,
        answer: &RefundAnswer,
        backoff: Backoff,
    ) -> Result<Reservation, StoreError>;

    /// Deletes a reservation a participant found malformed, so nothing of its request stays
    /// recorded (its (owner, holder, request_id) is free again): one still `TRYING` under
    /// `lease_owner`'s lease (no participant holds anything of it), or one `REJECTED` (every
    /// branch released). Anything else is left alone; false then.
    async fn discard(&self, id: Uuid, lease_owner: Uuid) -> Result<bool, StoreError>;

    /// The reservation's further payments whose refund is not acknowledged yet, oldest first.
    async fn pending_extra_payments(&self, id: Uuid) -> Result<Vec<ExtraPayment>, StoreError>;

    /// Every further payment of these reservations with the reservation it is on, oldest
    /// first (one read for a page of reservations).
    async fn further_payments_of(
        &self,
        ids: &[Uuid],
    ) -> Result<Vec<(Uuid, ExtraPayment)>, StoreError>;

    /// Records the payment participant's answer to a further payment's refund, as
    /// [`Store::record_refund_attempt`] does. A terminal reservation's lease is given up.
    /// Answers the further payment as it is afterwards.
    async fn record_extra_refund_attempt(
        &self,
        id: Uuid,
        extra: &ExtraPayment,
        answer: &RefundAnswer,
        backoff: Backoff,
    ) -> Result<ExtraPayment, StoreError>;

    /// Commits one small write that nothing reads (the one row of `write_probe`): `Ok` shows
    /// the database accepts writes now (readiness, SPEC 7.4).
    async fn probe_write(&self) -> Result<(), StoreError>;

    /// Extends `lease.owner`'s lease on a reservation it is still driving; false if it lost it.
    async fn renew_lease(&self, id: Uuid, lease: WorkLease) -> Result<bool, StoreError>;

    /// Test mode (`tcc.v1.Testing/ExpireNow`): makes a reservation stored `TRYING` or `HELD`
    /// due now - its `expires_at` becomes the database's now, unless already earlier - so the
    /// next sweep (`claim_due`, then its driver) releases it as an expired hold. True if it did; false if there
    /// is no such reservation or it is in another state (nothing changed).
    async fn make_due(&self, id: Uuid) -> Result<bool, StoreError>;

    /// Makes every unfinished reservation waiting on `participant` due now (it came back).
    async fn wake_backlog(&self, participant: &str) -> Result<u64, StoreError>;

    /// How many reservations are waiting to be driven to their outcome.
    async fn backlog(&self) -> Result<i64, StoreError>;

    /// ForceCancel (`tcc.v1.Admin`): under the row lock, a `HELD` reservation is released as a
    /// Cancel would release it (or expired, if it lapsed); a `TRYING` one moves to
    /// `CANCELLING` ending `CANCELLED` with every unanswered branch counted as tried. Anything
    /// else is [`AdminDecided::Refused`]. The audit entry is written in the same transaction.
    async fn force_cancel(
        &self,
        id: Uuid,
        note: &AuditNote,
        lease: WorkLease,
    ) -> Result<AdminDecided, StoreError>;

    /// Resolve: `FAILED -> to` (`CONFIRMED`/`CANCELLED`) under the row lock, with the refund
    /// `CANCELLED` owes (a payment without a refund), audited in the same transaction.
    async fn resolve(
        &self,
        id: Uuid,
        to: State,
        note: &AuditNote,
        lease: WorkLease,
    ) -> Result<AdminDecided, StoreError>;

    /// Retry: clears the backoff of the target's reservations with unfinished work and leases
    /// those whose lease is free to `lease.owner`; audited in the same transaction. `None`: the
    /// reservation asked for does not exist.
    async fn retry(
        &self,
        target: &RetryTarget,
        note: &AuditNote,
        lease: WorkLease,
    ) -> Result<Option<Vec<Woken>>, StoreError>;

    /// Stuck work (`ListStuck`), newest first.
    async fn list_stuck(&self, query: &StuckQuery) -> Result<Vec<Reservation>, StoreError>;

    /// Where the work of each of `ids` stands (any order), in one statement by primary key.
    async fn work_of(&self, ids: &[Uuid]) -> Result<Vec<WorkState>, StoreError>;

    /// Reservations by state: the live ones, the last hour's per minute ([`StateCounts`]).
    async fn count_by_state(&self) -> Result<StateCounts, StoreError>;

    /// The audit log, newest first.
    async fn audit(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>, StoreError>;

    /// The audit entries of these reservations, oldest first.
    async fn audit_of(&self, ids: &[Uuid]) -> Result<Vec<AuditEntry>, StoreError>;
    /// How long the oldest of that work has waited (zero when there is none): since the last
    /// change of a `TRYING`/`CONFIRMING`/`CANCELLING` reservation or one owing a refund, since
    /// `expires_at` of a lapsed `HELD` one, since a further payment owing its refund arrived.
    async fn oldest_work_age(&self) -> Result<Duration, StoreError>;

    /// For each participant that unfinished work waits on (a branch it must still be told
    /// about, or a refund it still owes), how many reservations, with up to `examples` (at
    /// least one) of their ids, oldest first; by participant name.
    async fn waiting_on(&self, examples: u32) -> Result<Vec<Waiting>, StoreError>;

    /// Retention (SPEC 8.3): deletes, in one short transaction, up to `limit` reservations
    /// whose last change (`updated_at`, when they became terminal) is more than `keep` ago by
    /// the database clock, oldest first, with their branches and every other row referencing
    /// them. Only terminal ones with nothing left to do: no lease held, no refund `PENDING` (or
    /// `FAILED`: a person settles it and needs the record), no late payment waiting for its
    /// refund, no further payment unsettled or newer than `keep`. Rows another transaction
    /// holds are skipped. Answers what went.
    async fn purge_finished(&self, keep: Duration, limit: u32) -> Result<Purged, StoreError>;
}

/// What one [`Store::purge_finished`] batch deleted, by table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Purged {
    pub reservations: u64,
    pub branches: u64,
    pub extra_payments: u64,
}

/// Unfinished work waiting on one participant ([`Store::waiting_on`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    pub participant: String,
    /// How many reservations wait on it.
    pub reservations: i64,
    /// Some of them, oldest first.
    pub examples: Vec<Uuid>,
}

/// Rows of (participant, its total, one example id), ordered by participant, grouped.
fn waiting_by_participant(rows: Vec<(String, i64, Uuid)>) -> Vec<Waiting> {
    let mut out: Vec<Waiting> = Vec::new();
    for (participant, total, id) in rows {
        match out.last_mut() {
            Some(w) if w.participant == participant => w.examples.push(id),
            _ => out.push(Waiting {
                participant,
                reservations: total,
                examples: vec![id],
            }),
        }
    }
    out
}

/// A connected store of either backend, before it is shared as `Arc<dyn Store>`: what the
/// coordinator's wiring needs besides the trait (migrations, which backend).
#[derive(Clone, Debug)]
pub enum AnyStore {
    Postgres(PgStore),
    Sqlite(SqliteStore),
}

impl AnyStore {
    /// Connects to `url` (the backend chosen by its scheme) with a pool of `max_connections`.
    /// A SQLite file (and its directory) is created if missing; a PostgreSQL database must exist
    /// (see [`crate::db::ensure_database`]).
    pub async fn connect(url: &str, max_connections: u32) -> Result<AnyStore, StoreError> {
        Ok(match DatabaseKind::of_url(url)? {
            DatabaseKind::Postgres => {
                AnyStore::Postgres(PgStore::connect(url, max_connections).await?)
            }
            DatabaseKind::Sqlite => {
                AnyStore::Sqlite(SqliteStore::connect(url, max_connections).await?)
            }
        })
    }

    /// Applies the backend's pending migrations.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        match self {
            AnyStore::Postgres(s) => s.migrate().await,
            AnyStore::Sqlite(s) => s.migrate().await,
        }
    }

    /// The store behind the one interface the coordinator uses.
    pub(crate) fn into_dyn(self) -> Arc<dyn Store> {
        match self {
            AnyStore::Postgres(s) => Arc::new(s),
            AnyStore::Sqlite(s) => Arc::new(s),
        }
    }
}

impl From<PgStore> for AnyStore {
    fn from(s: PgStore) -> AnyStore {
        AnyStore::Postgres(s)
    }
}

impl From<SqliteStore> for AnyStore {
    fn from(s: SqliteStore) -> AnyStore {
        AnyStore::Sqlite(s)
    }
}

/// Connects to `url` (PostgreSQL or SQLite, by scheme), applies the migrations, and returns
/// the store behind the `Store` interface.
pub async fn connect_store(url: &str, max_connections: u32) -> Result<Arc<dyn Store>, StoreError> {
    let store = AnyStore::connect(url, max_connections).await?;
    store.migrate().await?;
    Ok(store.into_dyn())
}
