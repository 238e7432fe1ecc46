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
//! - No batch statements: every write is a transaction of its own to the store. Concurrent
//!   ones still share a COMMIT (and its fsync): the pool's writer runs each as a savepoint of
//!   one group transaction (`holdfast-serve`'s `db/sqlite_write.rs`). A Confirm/Cancel is
//!   decided as on PostgreSQL (`store/without_lock.rs`): judged on the image recorded with its
//!   holds or a read outside the writer, written by one version-guarded statement.
//!
//! - `rows.rs`: the column lists, the row types, `load`, `get` and `list`.
//! - `create.rs`: Reserves (admission's counts, the insert).
//! - `decide.rs`: the statements of the shared locked decision, retake and outcome flows.
//! - `payments.rs`: the statements of payment bindings and further payments.
//! - `answers.rs`: recording answers (`record_held`, `record_rejected`, `record_phase`).
//! - `recovery.rs`: claims, leases, backlog.
//! - `retention.rs`: purging finished reservations in small batches.

/// Gives up the lease and, unless `finished`, schedules the next attempt:
/// `now + min(cap, base * 2^attempts) * (0.5 + jitter/2)`, jitter uniform in [0, 1).
/// (SQLite has no `power()` without its math extension: the doubling is a shift.)
/// Defined before the modules below, which splice it into their statements.
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

#[macro_use]
mod rows;

mod admin;
mod answers;
pub mod counts;
mod create;
mod decide;
mod events;
pub mod find;
mod payments;
mod recovery;
mod retention;
mod waiting;
mod waitlist;

pub use create::{FIND_REQUEST, REQUEST_RECORDED};
pub use recovery::{BACKLOG_COUNT, CLAIM_DUE_PICK, OLDEST_WORK_AGE};
pub use rows::list_statement;

use async_trait::async_trait;

use crate::domain::PresentedToken;
use crate::domain::RequestId;
use crate::domain::admin::{
    AuditEntry, AuditNote, AuditQuery, RetryTarget, StateCounts, StuckQuery, WorkState,
};
use crate::store::admin::{AdminDecided, Woken};
use sqlx::Sqlite;
use sqlx::sqlite::SqlitePool;
use uuid::Uuid;

use super::sql::{PaymentSql, ReservationSql};
use super::{
    BranchReport, Claimed, Created, Decided, PhaseRecorded, RefundAnswer, Stamp, Store, StoreError,
    Waiting, WorkLease, extra, outcome, retake,
};
use crate::domain::policy::{Backoff, HoldLimits};
use crate::domain::{
    Decision, ExtraPayment, ListQuery, NewReservation, Rejection, Reservation, State,
};
use crate::store::sql::LeaveHeld;
use crate::store::without_lock::{self, RecentlyHeld, WithoutLock};
use std::sync::Arc;

/// The coordinator's SQLite schema, embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/coordinator-sqlite");

/// Reservations on SQLite.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
    /// What this process last recorded `HELD`, for its Confirm/Cancel to skip a read.
    recently_held: Arc<RecentlyHeld>,
}

impl SqliteStore {
    /// Opens the database file named by `url` with holdfast's SQLite conventions
    /// ([`crate::db::open_sqlite`]), with a pool of `max_connections`.
    pub async fn connect(url: &str, max_connections: u32) -> Result<SqliteStore, StoreError> {
        Ok(SqliteStore::from_pool(
            crate::db::open_sqlite(url, max_connections).await?,
        ))
    }

    /// Wraps an existing pool (its connections must have foreign keys on).
    pub fn from_pool(pool: SqlitePool) -> SqliteStore {
        SqliteStore {
            pool,
            recently_held: Arc::new(RecentlyHeld::default()),
        }
    }

    /// Applies pending migrations.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.pool).await?;
        digest_legacy_tokens(&self.pool).await
    }
}

/// Runs a deferred write (`db::begin_sqlite_write_deferred`: its opening goes with its first
/// query) to its end in a task of its own, so its caller leaving (a Confirm's client gone)
/// cannot cut it off inside that query - which would fail every other member of its group
/// commit. A panic in it is its caller's again.
async fn to_the_end<T: Send + 'static>(
    write: impl std::future::Future<Output = Result<T, StoreError>> + Send + 'static,
) -> Result<T, StoreError> {
    match tokio::spawn(write).await {
        Ok(done) => done,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // The runtime is shutting down.
        Err(_) => Err(StoreError::Database(sqlx::Error::WorkerCrashed)),
    }
}

/// Replaces hold tokens an earlier version stored in plaintext by their digests (migration 0003
/// moved them to `legacy_hold_token`; SQLite has no SHA-256 to do it in SQL). Idempotent.
async fn digest_legacy_tokens(pool: &SqlitePool) -> Result<(), StoreError> {
    let mut tx = Sqlite::begin_write(pool).await?;
    let legacy: Vec<(Uuid, String)> = sqlx::query_as(
        "SELECT id, legacy_hold_token FROM reservations WHERE legacy_hold_token IS NOT NULL",
    )
    .fetch_all(&mut *tx)
    .await?;
    for (id, token) in &legacy {
        sqlx::query(
            "UPDATE reservations SET token_digest = ?2, legacy_hold_token = NULL WHERE id = ?1",
        )
        .bind(id)
        .bind(crate::domain::token::sha256(token.as_bytes()).as_slice())
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    if !legacy.is_empty() {
        // The tokens' old bytes stay in free pages and the WAL until rewritten: once, rewrite
        // the file and empty the WAL.
        sqlx::query("VACUUM").execute(pool).await?;
        sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(pool)
            .await?;
        tracing::info!(
            count = legacy.len(),
            "replaced plaintext hold tokens by their digests"
        );
    }
    Ok(())
}

#[async_trait]
impl WithoutLock for SqliteStore {
    /// On a reader: it never waits for the writer.
    async fn read_unlocked(&self, id: Uuid) -> Result<Option<Reservation>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        rows::load(&mut conn, id).await
    }

    /// One query on the writer (its opening sent ahead of it), its after-image answered by
    /// `RETURNING`.
    async fn leave_held_guarded(
        &self,
        write: LeaveHeld,
    ) -> Result<Option<Reservation>, StoreError> {
        let pool = self.pool.clone();
        to_the_end(async move {
            let mut ahead = crate::db::begin_sqlite_write_deferred(&pool).await?;
            let (sql, conn) = ahead.first(decide::LEAVE_HELD_FIRST);
            let ran = decide::run_leave_held(conn, sql, &write).await;
            let (left, tx) = ahead.opened(ran)?;
            let Some(row) = left else {
                tx.rollback().await?;
                return Ok(None);
            };
            let after = row.into_domain()?;
            tx.commit().await?;
            Ok(Some(after))
        })
        .await
    }

    fn recently_held(&self) -> &RecentlyHeld {
        &self.recently_held
    }
}

#[async_trait]
impl Store for SqliteStore {
    fn event_log(&self) -> &dyn super::events::EventLog {
        self
    }

    async fn create(
        &self,
        new: &NewReservation,
        lease: WorkLease,
        limits: HoldLimits,
    ) -> Result<Created, StoreError> {
        let (pool, new) = (self.pool.clone(), new.clone());
        to_the_end(async move { create::create(&pool, &new, lease, limits).await }).await
    }

    async fn get(&self, id: Uuid) -> Result<Option<Reservation>, StoreError> {
        rows::get(&self.pool, id).await
    }

    async fn list(&self, query: &ListQuery) -> Result<Vec<Reservation>, StoreError> {
        match &query.find {
            Some(find) => find::find(&self.pool, query, find).await,
            None => rows::list(&self.pool, query).await,
        }
    }

    async fn request_recorded(
        &self,
        owner: &str,
        holder: &str,
        request_id: &RequestId,
    ) -> Result<bool, StoreError> {
        Ok(sqlx::query_scalar(create::REQUEST_RECORDED)
            .bind(owner)
            .bind(holder)
            .bind(request_id.as_str())
            .fetch_one(&self.pool)
            .await?)
    }

    async fn versions(&self, ids: &[Uuid]) -> Result<Vec<Stamp>, StoreError> {
        rows::versions(&self.pool, ids).await
    }

    async fn decide(
        &self,
        id: Uuid,
        scope: Option<&str>,
        presented_token: &PresentedToken,
        decision: &Decision,
        lease: WorkLease,
    ) -> Result<Decided, StoreError> {
        without_lock::decide::<Sqlite>(
            self,
            &self.pool,
            id,
            scope,
            presented_token,
            decision,
            lease,
        )
        .await
    }

    async fn record_held(
        &self,
        id: Uuid,
        reports: &[BranchReport],
    ) -> Result<Reservation, StoreError> {
        let (pool, reports) = (self.pool.clone(), reports.to_vec());
        let recorded =
            to_the_end(async move { answers::record_held(&pool, id, &reports).await }).await;
        self.recently_held.recorded(&recorded);
        recorded
    }

    async fn record_rejected(
        &self,
        id: Uuid,
        rejection: Option<&Rejection>,
        reports: &[BranchReport],
    ) -> Result<Reservation, StoreError> {
        let (pool, rejection, reports) = (self.pool.clone(), rejection.cloned(), reports.to_vec());
        to_the_end(async move {
            answers::record_rejected(&pool, id, rejection.as_ref(), &reports).await
        })
        .await
    }

    async fn record_phase(
        &self,
        id: Uuid,
        from: State,
        reports: &[BranchReport],
        finish: Option<State>,
        backoff: Backoff,
    ) -> Result<PhaseRecorded, StoreError> {
        let (pool, reports) = (self.pool.clone(), reports.to_vec());
        to_the_end(async move {
            answers::record_phase(&pool, id, from, &reports, finish, backoff).await
        })
        .await
    }

    async fn claim_due(&self, lease: WorkLease, limit: u32) -> Result<Vec<Claimed>, StoreError> {
        recovery::claim_due(&self.pool, lease, limit).await
    }

    async fn expire_lapsed_hold(&self, id: Uuid) -> Result<bool, StoreError> {
        super::decide::expire_lapsed_hold::<Sqlite>(&self.pool, id).await
    }

    async fn begin_retake(&self, id: Uuid) -> Result<Reservation, StoreError> {
        retake::begin_retake::<Sqlite>(&self.pool, id).await
    }

    async fn finish_retake(
        &self,
        id: Uuid,
        reports: &[BranchReport],
    ) -> Result<Reservation, StoreError> {
        retake::finish_retake::<Sqlite>(&self.pool, id, reports).await
    }

    async fn fail_retake(
        &self,
        id: Uuid,
        reports: &[BranchReport],
        reason: &str,
    ) -> Result<Reservation, StoreError> {
        retake::fail_retake::<Sqlite>(&self.pool, id, reports, reason).await
    }

    async fn record_refund_attempt(
        &self,
        id: Uuid,
        answer: &RefundAnswer,
        backoff: Backoff,
    ) -> Result<Reservation, StoreError> {
        outcome::record_refund_attempt::<Sqlite>(&self.pool, id, answer, backoff).await
    }

    async fn further_payments_of(
        &self,
        ids: &[Uuid],
    ) -> Result<Vec<(Uuid, ExtraPayment)>, StoreError> {
        payments::further_payments_of(&self.pool, ids).await
    }

    async fn pending_extra_payments(&self, id: Uuid) -> Result<Vec<ExtraPayment>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        <Sqlite as PaymentSql>::pending_extra_payments(&mut conn, id).await
    }

    async fn record_extra_refund_attempt(
        &self,
        id: Uuid,
        extra: &ExtraPayment,
        answer: &RefundAnswer,
        backoff: Backoff,
    ) -> Result<ExtraPayment, StoreError> {
        extra::record_extra_refund_attempt::<Sqlite>(&self.pool, id, extra, answer, backoff).await
    }

    async fn renew_lease(&self, id: Uuid, lease: WorkLease) -> Result<bool, StoreError> {
        recovery::renew_lease(&self.pool, id, lease).await
    }

    async fn make_due(&self, id: Uuid) -> Result<bool, StoreError> {
        recovery::make_due(&self.pool, id).await
    }

    async fn probe_write(&self) -> Result<(), StoreError> {
        recovery::probe_write(&self.pool).await
    }

    async fn wake_backlog(&self, participant: &str) -> Result<u64, StoreError> {
        recovery::wake_backlog(&self.pool, participant).await
    }

    async fn backlog(&self) -> Result<i64, StoreError> {
        recovery::backlog(&self.pool).await
    }

    async fn oldest_work_age(&self) -> Result<std::time::Duration, StoreError> {
        recovery::oldest_work_age(&self.pool).await
    }

    async fn waiting_on(&self, examples: u32) -> Result<Vec<Waiting>, StoreError> {
        waiting::waiting_on(&self.pool, examples).await
    }

    async fn discard(&self, id: Uuid, lease_owner: Uuid) -> Result<bool, StoreError> {
        recovery::discard(&self.pool, id, lease_owner).await
    }

    async fn force_cancel(
        &self,
        id: Uuid,
        note: &AuditNote,
        lease: WorkLease,
    ) -> Result<AdminDecided, StoreError> {
        crate::store::admin::force_cancel::<Sqlite>(&self.pool, id, note, lease).await
    }

    async fn resolve(
        &self,
        id: Uuid,
        to: State,
        note: &AuditNote,
        lease: WorkLease,
    ) -> Result<AdminDecided, StoreError> {
        crate::store::admin::resolve::<Sqlite>(&self.pool, id, to, note, lease).await
    }

    async fn retry(
        &self,
        target: &RetryTarget,
        note: &AuditNote,
        lease: WorkLease,
    ) -> Result<Option<Vec<Woken>>, StoreError> {
        crate::store::admin::retry::<Sqlite>(&self.pool, target, note, lease).await
    }

    async fn list_stuck(&self, query: &StuckQuery) -> Result<Vec<Reservation>, StoreError> {
        admin::list_stuck(&self.pool, query).await
    }

    async fn work_of(&self, ids: &[Uuid]) -> Result<Vec<WorkState>, StoreError> {
        admin::work_of(&self.pool, ids).await
    }

    async fn count_by_state(&self) -> Result<StateCounts, StoreError> {
        counts::count_by_state(&self.pool).await
    }

    async fn audit(&self, query: &AuditQuery) -> Result<Vec<AuditEntry>, StoreError> {
        admin::audit(&self.pool, query).await
    }

    async fn audit_of(&self, ids: &[Uuid]) -> Result<Vec<AuditEntry>, StoreError> {
        admin::audit_of(&self.pool, ids).await
    }

    async fn purge_finished(
        &self,
        keep: std::time::Duration,
        limit: u32,
    ) -> Result<super::Purged, StoreError> {
        retention::purge_finished(&self.pool, keep, limit).await
    }
}
