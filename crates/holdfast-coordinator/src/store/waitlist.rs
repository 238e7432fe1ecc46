//! Waitlists (SPEC 11), written once for both databases over [`WaitlistSql`]: joining the
//! queues of the holds that were refused (`TRYING -> QUEUED`, or `-> CANCELLING` ending
//! `QUEUED` when something placed must be released first), and an offer's start (`QUEUED ->
//! TRYING` as a new generation of branches). Each is one write transaction whose conditional
//! UPDATE's row count decides. The queue rows leave with the reservation once it holds or
//! ends (trigger `reservations_left_queues`); offers are placed and recorded by the same
//! paths as a Reserve (`record_held`, this module again when refused).

use std::time::Duration;

use async_trait::async_trait;
use uuid::Uuid;

use super::sql::ReservationSql;
use super::{BranchReport, StoreError, WorkLease};
use crate::db::WriteTransaction;
use crate::domain::waitlist::{QueueKey, QueuePage, QueuePlace};
use crate::domain::{BranchState, Hold, Reservation};

/// A stopped placement that joins queues instead of being rejected.
#[derive(Clone, Copy, Debug)]
pub struct JoinQueue<'a> {
    pub id: Uuid,
    /// The placement's answers (empty when nothing was tried: the queue was known).
    pub reports: &'a [BranchReport],
    /// The holds whose queues it waits in (those refused); it joins the tail of each it is
    /// not in yet and keeps its place in the others.
    pub holds: &'a [Hold],
    /// How long it may wait, counted from the first time it was queued.
    pub wait: Duration,
    /// A queue this long takes nobody more (`QUEUE_FULL`).
    pub max_length: u32,
}

/// What [`crate::store::Store::join_queue`] did.
#[derive(Debug)]
pub enum Joined {
    /// Recorded `QUEUED` (or `CANCELLING` ending `QUEUED`: release what was placed).
    Queued(Reservation),
    /// This queue is full: nothing was written.
    Full(QueueKey),
    /// It was no longer `TRYING` (another instance took it over): as it is now.
    Moved(Reservation),
}

/// The oldest waiting reservation of a queue, and what it asks of that resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueHead {
    pub id: Uuid,
    pub quantity: i64,
    /// When it joined this queue.
    pub since: chrono::DateTime<chrono::Utc>,
}

/// The waitlists' storage (SPEC 11), a part of [`crate::store::Store`].
#[async_trait]
pub trait QueueStore: Send + Sync {
    /// Records a placement refused for capacity as waiting in the queues of `job.holds`
    /// instead of rejected: `TRYING -> QUEUED` when nothing may be held (every Try refused, or
    /// none sent), else `TRYING -> CANCELLING` ending `QUEUED` (release, then wait). A queue
    /// at `job.max_length` it is not in yet refuses it ([`Joined::Full`], nothing written).
    async fn join_queue(&self, job: &JoinQueue<'_>) -> Result<Joined, StoreError>;

    /// Starts an offer: `QUEUED -> TRYING` while its wait lasts, as a new generation of
    /// branches (fresh ids, `PENDING`), `expires_at = now + ttl`, leased to the offerer.
    /// `None` if it is not `QUEUED` (cancelled, offered by another instance, wait over).
    async fn begin_offer(
        &self,
        id: Uuid,
        lease: WorkLease,
    ) -> Result<Option<Reservation>, StoreError>;

    /// Takes (or renews) the right to offer `key`'s released units: one instance at a time.
    /// True if this lease's owner has it now.
    async fn lease_queue(&self, key: &QueueKey, lease: WorkLease) -> Result<bool, StoreError>;

    /// The oldest `limit` reservations waiting in `key`'s queue (`QUEUED`, wait not over),
    /// in offer order.
    async fn queue_heads(&self, key: &QueueKey, limit: u32) -> Result<Vec<QueueHead>, StoreError>;

    /// Every non-empty queue and its length.
    async fn queues(&self) -> Result<Vec<(QueueKey, i64)>, StoreError>;

    /// Ends the waits that are over: `QUEUED -> REJECTED` with reason `QUEUE_WAIT_ENDED`, at
    /// most `limit`; answers the reservations as rejected.
    async fn end_waits(&self, limit: u32) -> Result<Vec<Reservation>, StoreError>;

    /// Where a reservation waits: its first queue, its position there, since and until.
    async fn queue_place(&self, id: Uuid) -> Result<Option<QueuePlace>, StoreError>;

    /// A page of `key`'s queue in offer order after the entry `after` (0: from the head), and
    /// the queue's length.
    async fn list_queue(
        &self,
        key: &QueueKey,
        after: i64,
        limit: u32,
    ) -> Result<QueuePage, StoreError>;
}

/// The statements of the waitlist flows, one implementation per database.
#[async_trait]
pub(crate) trait WaitlistSql: ReservationSql {
    /// Serialises joins of these queues until the transaction ends (PostgreSQL: advisory
    /// locks in key order; SQLite: the write lock is held already).
    async fn lock_queues(conn: &mut Self::Connection, keys: &[QueueKey]) -> Result<(), StoreError>;

    /// How many reservations wait in `key`'s queue, and whether `id` is one of them.
    async fn queue_length(
        conn: &mut Self::Connection,
        key: &QueueKey,
        id: Uuid,
    ) -> Result<(i64, bool), StoreError>;

    /// `TRYING -> QUEUED` (or `-> CANCELLING` ending `QUEUED` when `release`), its wait set the
    /// first time (`queued_at`, `queue_until = queued_at + wait`), its lease freed unless it
    /// releases. True if it was `TRYING`.
    async fn mark_queued(
        conn: &mut Self::Connection,
        id: Uuid,
        release: bool,
        wait: Duration,
    ) -> Result<bool, StoreError>;

    /// Appends the reservation to `hold`'s queue unless it is in it already.
    async fn insert_queue_entry(
        conn: &mut Self::Connection,
        id: Uuid,
        hold: &Hold,
    ) -> Result<(), StoreError>;

    /// `QUEUED -> TRYING` while its wait lasts: the next generation, `expires_at = now + ttl`,
    /// leased to the offerer. Answers the new generation, or `None`.
    async fn mark_offered(
        conn: &mut Self::Connection,
        id: Uuid,
        lease: WorkLease,
    ) -> Result<Option<i32>, StoreError>;
}

/// Whether a stopped placement left nothing that may hold: every answered Try a refusal, and
/// no Try sent without an answer (none at all: the queue was known, nothing was tried).
fn nothing_to_release(reports: &[BranchReport]) -> bool {
    reports.iter().all(|r| r.state == BranchState::Rejected)
}

/// [`crate::store::Store::join_queue`].
pub(crate) async fn join_queue<DB: WaitlistSql>(
    pool: &DB::Pool,
    job: &JoinQueue<'_>,
) -> Result<Joined, StoreError> {
    let mut keys: Vec<QueueKey> = job.holds.iter().map(QueueKey::of).collect();
    keys.sort();
    keys.dedup();
    let mut tx = DB::begin_write(pool).await?;
    // The queues' lock first, before this transaction writes: joins of one queue then commit
    // in the order they write, so their RESERVATION_QUEUED events (numbered by transaction on
    // PostgreSQL) come in queue order too.
    DB::lock_queues(&mut tx, &keys).await?;
    for key in &keys {
        let (length, contains) = DB::queue_length(&mut tx, key, job.id).await?;
        if !contains && length >= i64::from(job.max_length) {
            tx.rollback().await?;
            return Ok(Joined::Full(key.clone()));
        }
    }
    let release = !nothing_to_release(job.reports);
    if !DB::mark_queued(&mut tx, job.id, release, job.wait).await? {
        let current = DB::load_existing(&mut tx, job.id).await;
        tx.rollback().await?;
        return current.map(Joined::Moved);
    }
    DB::apply_reports(&mut tx, job.id, job.reports).await?;
    for hold in job.holds {
        DB::insert_queue_entry(&mut tx, job.id, hold).await?;
    }
    let after = DB::load_existing(&mut tx, job.id).await?;
    tx.commit().await?;
    Ok(Joined::Queued(after))
}

/// [`crate::store::Store::begin_offer`].
pub(crate) async fn begin_offer<DB: WaitlistSql>(
    pool: &DB::Pool,
    id: Uuid,
    lease: WorkLease,
) -> Result<Option<Reservation>, StoreError> {
    let mut tx = DB::begin_write(pool).await?;
    let Some(generation) = DB::mark_offered(&mut tx, id, lease).await? else {
        tx.rollback().await?;
        return Ok(None);
    };
    DB::insert_retake_branches(&mut tx, id, generation).await?;
    let after = DB::load_existing(&mut tx, id).await?;
    tx.commit().await?;
    Ok(Some(after))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(state: BranchState) -> BranchReport {
        BranchReport {
            branch_id: Uuid::nil(),
            state,
            error: None,
        }
    }

    #[test]
    fn only_refusals_or_nothing_tried_leave_nothing_to_release() {
        assert!(nothing_to_release(&[]));
        assert!(nothing_to_release(&[report(BranchState::Rejected)]));
        assert!(!nothing_to_release(&[
            report(BranchState::Held),
            report(BranchState::Rejected)
        ]));
        assert!(!nothing_to_release(&[report(BranchState::Pending)]));
    }
}
