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
//! - **Writes run whole on one thread.** Each write is one closure sent to the database's
//!   writer thread (`writer.rs`, `holdfast-serve`'s `db/sqlite_sync.rs`): its statements run
//!   there on a synchronous connection, with no hand-off between them, and concurrent writes
//!   share a COMMIT (each under a savepoint of one group transaction). The shared flows
//!   (`decide.rs`, `retake.rs`, ...) run there too, over [`writer::OnWriter`]. Reads stay on
//!   the sqlx pool.
//! - No fast path and no batch statements: every decision takes the shared locked flow.
//!
//! - `writer.rs`: how a write reaches the writer thread; the statement helpers.
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
mod create;
mod decide;
mod payments;
mod recovery;
mod retention;
mod waiting;
mod writer;

pub use recovery::{BACKLOG_COUNT, CLAIM_DUE_PICK, OLDEST_WORK_AGE};
pub use rows::list_statement;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::db::{SqliteSyncWriter, SyncConnection};
use crate::domain::admin::{AuditEntry, AuditNote, AuditQuery, RetryTarget, StuckQuery};
use crate::store::admin::{AdminDecided, Woken};
use sqlx::sqlite::SqlitePool;
use uuid::Uuid;

use super::sql::PaymentSql;
use super::{
    BranchReport, Claimed, Created, Decided, PhaseRecorded, RefundAnswer, Stamp, Store, StoreError,
    Waiting, WorkLease, extra, outcome, retake,
};
use crate::domain::policy::{Backoff, HoldLimits};
use crate::domain::{
    Decision, ExtraPayment, ListQuery, NewReservation, Rejection, Reservation, State,
};
use writer::{OnWriter, ready};

/// The coordinator's SQLite schema, embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/coordinator-sqlite");

/// How long a write waits for the writer thread to run it (as long as a pooled connection is
/// waited for).
const WRITE_WAIT: Duration = Duration::from_secs(5);

/// Reservations on SQLite.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    /// Reads (and migrations).
    pool: SqlitePool,
    /// Every write after the migrations.
    writer: SqliteSyncWriter,
}

impl SqliteStore {
    /// Opens the database file named by `url` with holdfast's SQLite conventions
    /// ([`crate::db::open_sqlite`]), with a pool of `max_connections` for reads and a writer
    /// thread for writes.
    pub async fn connect(url: &str, max_connections: u32) -> Result<SqliteStore, StoreError> {
        SqliteStore::from_pool(crate::db::open_sqlite(url, max_connections).await?)
    }

    /// Wraps an existing pool of a database file (its connections must have foreign keys on),
    /// starting the file's writer thread.
    pub fn from_pool(pool: SqlitePool) -> Result<SqliteStore, StoreError> {
        let writer = SqliteSyncWriter::open(pool.connect_options().get_filename())?;
        Ok(SqliteStore { pool, writer })
    }

    /// Runs `write` on the writer thread ([`writer`]).
    async fn write<T: Send + 'static>(
        &self,
        write: impl FnOnce(&Arc<SyncConnection>) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.writer.write(WRITE_WAIT, write).await
    }

    /// Applies pending migrations.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.pool).await?;
        self.digest_legacy_tokens().await
    }

    /// Replaces hold tokens an earlier version stored in plaintext by their digests
    /// (migration 0003 moved them to `legacy_hold_token`; SQLite has no SHA-256 to do it in
    /// SQL). Idempotent. A write like any other, on the writer thread.
    async fn digest_legacy_tokens(&self) -> Result<(), StoreError> {
        let digested = self
            .write(|conn| {
                let legacy: Vec<(Uuid, String)> = writer::all(
                    conn,
                    "SELECT id, legacy_hold_token FROM reservations \
                     WHERE legacy_hold_token IS NOT NULL",
                    (),
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )?;
                for (id, token) in &legacy {
                    let digest = crate::domain::token::sha256(token.as_bytes());
                    writer::exec(
                        conn,
                        "UPDATE reservations SET token_digest = ?2, legacy_hold_token = NULL \
                         WHERE id = ?1",
                        rusqlite::params![id, digest.as_slice()],
                    )?;
                }
                Ok(legacy.len())
            })
            .await?;
        if digested > 0 {
            // The tokens' old bytes stay in free pages and the WAL until rewritten: once,
            // rewrite the file and empty the WAL.
            sqlx::query("VACUUM").execute(&self.pool).await?;
            sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                .execute(&self.pool)
                .await?;
            tracing::info!(
                count = digested,
                "replaced plaintext hold tokens by their digests"
            );
        }
        Ok(())
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn create(
        &self,
        new: &NewReservation,
        lease: WorkLease,
        limits: HoldLimits,
    ) -> Result<Created, StoreError> {
        let new = new.clone();
        self.write(move |conn| ready(create::create(&mut conn.clone(), &new, lease, limits)))
            .await
    }

    async fn get(&self, id: Uuid) -> Result<Option<Reservation>, StoreError> {
        rows::get(&self.pool, id).await
    }

    async fn list(&self, query: &ListQuery) -> Result<Vec<Reservation>, StoreError> {
        rows::list(&self.pool, query).await
    }

    async fn request_recorded(
        &self,
        owner: &str,
        holder: &str,
        request_id: &str,
    ) -> Result<bool, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM reservations \
               WHERE owner = ?1 AND holder = ?2 AND request_id = ?3)",
        )
        .bind(owner)
        .bind(holder)
        .bind(request_id)
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
        presented_token: &str,
        decision: &Decision,
        lease: WorkLease,
    ) -> Result<Decided, StoreError> {
        let (scope, token) = (scope.map(str::to_owned), presented_token.to_owned());
        let decision = decision.clone();
        self.write(move |conn| {
            ready(super::decide::decide_locked::<OnWriter>(
                conn,
                id,
                scope.as_deref(),
                &token,
                &decision,
                lease,
            ))
        })
        .await
    }

    async fn record_held(
        &self,
        id: Uuid,
        reports: &[BranchReport],
    ) -> Result<Reservation, StoreError> {
        let reports = reports.to_vec();
        self.write(move |conn| ready(answers::record_held(&mut conn.clone(), id, &reports)))
            .await
    }

    async fn record_rejected(
        &self,
        id: Uuid,
        rejection: Option<&Rejection>,
        reports: &[BranchReport],
    ) -> Result<Reservation, StoreError> {
        let (rejection, reports) = (rejection.cloned(), reports.to_vec());
        self.write(move |conn| {
            ready(answers::record_rejected(
                &mut conn.clone(),
                id,
                rejection.as_ref(),
                &reports,
            ))
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
        let reports = reports.to_vec();
        self.write(move |conn| {
            ready(answers::record_phase(
                &mut conn.clone(),
                id,
                from,
                &reports,
                finish,
                backoff,
            ))
        })
        .await
    }

    async fn claim_due(&self, lease: WorkLease, limit: u32) -> Result<Vec<Claimed>, StoreError> {
        self.write(move |conn| recovery::claim_due(conn, lease, limit))
            .await
    }

    async fn begin_retake(&self, id: Uuid) -> Result<Reservation, StoreError> {
        self.write(move |conn| ready(retake::begin_retake::<OnWriter>(conn, id)))
            .await
    }

    async fn finish_retake(
        &self,
        id: Uuid,
        reports: &[BranchReport],
    ) -> Result<Reservation, StoreError> {
        let reports = reports.to_vec();
        self.write(move |conn| ready(retake::finish_retake::<OnWriter>(conn, id, &reports)))
            .await
    }

    async fn fail_retake(
        &self,
        id: Uuid,
        reports: &[BranchReport],
        reason: &str,
    ) -> Result<Reservation, StoreError> {
        let (reports, reason) = (reports.to_vec(), reason.to_owned());
        self.write(move |conn| ready(retake::fail_retake::<OnWriter>(conn, id, &reports, &reason)))
            .await
    }

    async fn record_refund_attempt(
        &self,
        id: Uuid,
        answer: &RefundAnswer,
        backoff: Backoff,
    ) -> Result<Reservation, StoreError> {
        let answer = answer.clone();
        self.write(move |conn| {
            ready(outcome::record_refund_attempt::<OnWriter>(
                conn, id, &answer, backoff,
            ))
        })
        .await
    }

    async fn further_payments_of(
        &self,
        ids: &[Uuid],
    ) -> Result<Vec<(Uuid, ExtraPayment)>, StoreError> {
        payments::further_payments_of(&self.pool, ids).await
    }

    async fn pending_extra_payments(&self, id: Uuid) -> Result<Vec<ExtraPayment>, StoreError> {
        // A read, but its statement is the writer's (`PaymentSql`); refunds are rare.
        self.write(move |conn| {
            ready(<OnWriter as PaymentSql>::pending_extra_payments(
                &mut conn.clone(),
                id,
            ))
        })
        .await
    }

    async fn record_extra_refund_attempt(
        &self,
        id: Uuid,
        extra: &ExtraPayment,
        answer: &RefundAnswer,
        backoff: Backoff,
    ) -> Result<ExtraPayment, StoreError> {
        let (extra, answer) = (extra.clone(), answer.clone());
        self.write(move |conn| {
            ready(extra::record_extra_refund_attempt::<OnWriter>(
                conn, id, &extra, &answer, backoff,
            ))
        })
        .await
    }

    async fn renew_lease(&self, id: Uuid, lease: WorkLease) -> Result<bool, StoreError> {
        self.write(move |conn| recovery::renew_lease(conn, id, lease))
            .await
    }

    async fn make_due(&self, id: Uuid) -> Result<bool, StoreError> {
        self.write(move |conn| recovery::make_due(conn, id)).await
    }

    async fn probe_write(&self) -> Result<(), StoreError> {
        self.write(|conn| recovery::probe_write(conn)).await
    }

    async fn wake_backlog(&self, participant: &str) -> Result<u64, StoreError> {
        let participant = participant.to_owned();
        self.write(move |conn| recovery::wake_backlog(conn, &participant))
            .await
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
        self.write(move |conn| recovery::discard(conn, id, lease_owner))
            .await
    }

    async fn force_cancel(
        &self,
        id: Uuid,
        note: &AuditNote,
        lease: WorkLease,
    ) -> Result<AdminDecided, StoreError> {
        let note = note.clone();
        self.write(move |conn| {
            ready(crate::store::admin::force_cancel::<OnWriter>(
                conn, id, &note, lease,
            ))
        })
        .await
    }

    async fn resolve(
        &self,
        id: Uuid,
        to: State,
        note: &AuditNote,
        lease: WorkLease,
    ) -> Result<AdminDecided, StoreError> {
        let note = note.clone();
        self.write(move |conn| {
            ready(crate::store::admin::resolve::<OnWriter>(
                conn, id, to, &note, lease,
            ))
        })
        .await
    }

    async fn retry(
        &self,
        target: &RetryTarget,
        note: &AuditNote,
        lease: WorkLease,
    ) -> Result<Option<Vec<Woken>>, StoreError> {
        let (target, note) = (target.clone(), note.clone());
        self.write(move |conn| {
            ready(crate::store::admin::retry::<OnWriter>(
                conn, &target, &note, lease,
            ))
        })
        .await
    }

    async fn list_stuck(&self, query: &StuckQuery) -> Result<Vec<Reservation>, StoreError> {
        admin::list_stuck(&self.pool, query).await
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
        self.write(move |conn| retention::purge_finished(conn, keep, limit))
            .await
    }
}
