//! The coordinator's store on PostgreSQL.
//!
//! Decisions read `clock_timestamp()`, so every replica agrees on what "expired" means. Rows
//! are locked with `FOR UPDATE` (sweeps skip locked ones), Reserves serialise per holder on an
//! advisory lock. Hot paths: concurrent `create`/`record_held`/`record_rejected`/`record_phase`
//! calls are group-committed (`group_commit.rs`), a Confirm or Cancel is first judged on a row
//! read without a lock and written by the one version-guarded UPDATE of `executor.rs`
//! (concurrent ones share it), and writes answer with their after-image in the same statement.
//!
//! - `rows.rs`: the column lists, the row type, `load`.
//! - `list.rs`: a statement per List shape (index-backed, keyset) and the stamps a watch polls.
//! - `create.rs`: Reserves (advisory locks, the batched insert, admission's counts).
//! - `executor.rs`: the one statement of a decided Confirm/Cancel (`store/decide.rs`'s
//!   description), alone or many at once; `store/without_lock.rs` decides without a lock.
//! - `decide.rs`: the statements of the shared locked decision, retake and outcome flows.
//! - `payments.rs`: the statements of payment bindings and further payments.
//! - `answers.rs` / `group_commit.rs`: recording fan-out answers, many per statement.
//! - `recovery.rs`: claims, leases, backlog.
//! - `retention.rs`: purging finished reservations in short batches.

// First, so its column-list macros are in scope for every module below.
#[macro_use]
mod rows;

mod admin;
mod answers;
pub mod counts;
mod create;
mod decide;
mod events;
mod executor;
pub mod find;
mod group_commit;
mod list;
mod payments;
mod recovery;
mod retention;
mod waiting;
mod waitlist;

use std::sync::Arc;

use async_trait::async_trait;

use super::sql::PaymentSql;
use crate::domain::PresentedToken;
use crate::domain::RequestId;
use crate::domain::admin::{
    AuditEntry, AuditNote, AuditQuery, RetryTarget, StateCounts, StuckQuery, WorkState,
};
use crate::store::admin::{AdminDecided, Woken};
use sqlx::Postgres;
use sqlx::postgres::PgPool;
use uuid::Uuid;

pub use self::events::EVENTS_AFTER;
pub use self::list::statement as list_statement;

use self::group_commit::GroupCommit;
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

/// The coordinator's schema, embedded in the binary.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/coordinator");

/// Reservations on PostgreSQL.
#[derive(Clone)]
pub struct PgStore {
    pool: PgPool,
    /// `create`, `record_held`, `record_rejected`, `record_phase` and decided writes,
    /// group-committed.
    group_commit: Arc<GroupCommit>,
    /// What this process last recorded `HELD`, for its Confirm/Cancel to skip a read.
    recently_held: Arc<RecentlyHeld>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore").field("pool", &self.pool).finish()
    }
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
        PgStore {
            group_commit: Arc::new(GroupCommit::spawn(&pool)),
            pool,
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

#[async_trait]
impl WithoutLock for PgStore {
    async fn read_unlocked(&self, id: Uuid) -> Result<Option<Reservation>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        rows::load(&mut conn, id, false).await
    }

    /// Through the group commit: concurrent decided writes share a statement.
    async fn leave_held_guarded(
        &self,
        write: LeaveHeld,
    ) -> Result<Option<Reservation>, StoreError> {
        self.group_commit.leave_held(write).await
    }

    fn recently_held(&self) -> &RecentlyHeld {
        &self.recently_held
    }
}

#[async_trait]
impl Store for PgStore {
    fn event_log(&self) -> &dyn super::events::EventLog {
        self
    }

    async fn create(
        &self,
        new: &NewReservation,
        lease: WorkLease,
        limits: HoldLimits,
    ) -> Result<Created, StoreError> {
        self.group_commit.create(new, lease, limits).await
    }

    async fn get(&self, id: Uuid) -> Result<Option<Reservation>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        rows::load(&mut conn, id, false).await
    }

    async fn list(&self, query: &ListQuery) -> Result<Vec<Reservation>, StoreError> {
        match &query.find {
            Some(find) => find::find(&self.pool, query, find).await,
            None => list::list(&self.pool, query).await,
        }
    }

    async fn request_recorded(
        &self,
        owner: &str,
        holder: &str,
        request_id: &RequestId,
    ) -> Result<bool, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM reservations \
               WHERE owner = $1 AND holder = $2 AND request_id = $3)",
        )
        .bind(owner)
        .bind(holder)
        .bind(request_id.as_str())
        .fetch_one(&self.pool)
        .await?)
    }

    async fn versions(&self, ids: &[Uuid]) -> Result<Vec<Stamp>, StoreError> {
        list::versions(&self.pool, ids).await
    }

    async fn decide(
        &self,
        id: Uuid,
        scope: Option<&str>,
        presented_token: &PresentedToken,
        decision: &Decision,
        lease: WorkLease,
    ) -> Result<Decided, StoreError> {
        without_lock::decide::<Postgres>(
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
        let recorded = self.group_commit.record_held(id, reports).await;
        self.recently_held.recorded(&recorded);
        recorded
    }

    async fn record_rejected(
        &self,
        id: Uuid,
        rejection: Option<&Rejection>,
        reports: &[BranchReport],
    ) -> Result<Reservation, StoreError> {
        self.group_commit
            .record_rejected(id, rejection, reports)
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
        self.group_commit
            .record_phase(id, from, reports, finish, backoff)
            .await
    }

    async fn claim_due(&self, lease: WorkLease, limit: u32) -> Result<Vec<Claimed>, StoreError> {
        recovery::claim_due(&self.pool, lease, limit).await
    }

    async fn expire_lapsed_hold(&self, id: Uuid) -> Result<bool, StoreError> {
        super::decide::expire_lapsed_hold::<Postgres>(&self.pool, id).await
    }

    async fn begin_retake(&self, id: Uuid) -> Result<Reservation, StoreError> {
        retake::begin_retake::<Postgres>(&self.pool, id).await
    }

    async fn finish_retake(
        &self,
        id: Uuid,
        reports: &[BranchReport],
    ) -> Result<Reservation, StoreError> {
        retake::finish_retake::<Postgres>(&self.pool, id, reports).await
    }

    async fn fail_retake(
        &self,
        id: Uuid,
        reports: &[BranchReport],
        reason: &str,
    ) -> Result<Reservation, StoreError> {
        retake::fail_retake::<Postgres>(&self.pool, id, reports, reason).await
    }

    async fn record_refund_attempt(
        &self,
        id: Uuid,
        answer: &RefundAnswer,
        backoff: Backoff,
    ) -> Result<Reservation, StoreError> {
        outcome::record_refund_attempt::<Postgres>(&self.pool, id, answer, backoff).await
    }

    async fn pending_extra_payments(&self, id: Uuid) -> Result<Vec<ExtraPayment>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        <Postgres as PaymentSql>::pending_extra_payments(&mut conn, id).await
    }

    async fn further_payments_of(
        &self,
        ids: &[Uuid],
    ) -> Result<Vec<(Uuid, ExtraPayment)>, StoreError> {
        payments::further_payments_of(&self.pool, ids).await
    }

    async fn record_extra_refund_attempt(
        &self,
        id: Uuid,
        extra: &ExtraPayment,
        answer: &RefundAnswer,
        backoff: Backoff,
    ) -> Result<ExtraPayment, StoreError> {
        extra::record_extra_refund_attempt::<Postgres>(&self.pool, id, extra, answer, backoff).await
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
        crate::store::admin::force_cancel::<Postgres>(&self.pool, id, note, lease).await
    }

    async fn resolve(
        &self,
        id: Uuid,
        to: State,
        note: &AuditNote,
        lease: WorkLease,
    ) -> Result<AdminDecided, StoreError> {
        crate::store::admin::resolve::<Postgres>(&self.pool, id, to, note, lease).await
    }

    async fn retry(
        &self,
        target: &RetryTarget,
        note: &AuditNote,
        lease: WorkLease,
    ) -> Result<Option<Vec<Woken>>, StoreError> {
        crate::store::admin::retry::<Postgres>(&self.pool, target, note, lease).await
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
