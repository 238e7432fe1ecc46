//! The event log (SPEC 10) as the store keeps it: an outbox table both databases append to
//! from triggers, in the transaction of every change (migrations `0012_events.sql`), so no
//! write path can forget one; readers page through it by `sequence`; each sink keeps its
//! durable cursor and lease here.
//!
//! Sequence numbers. SQLite has one writer, so a number taken at insert (`AUTOINCREMENT`)
//! is already commit order. PostgreSQL commits concurrent transactions in any order, so a
//! number from a counter taken at insert could become visible after a larger one a reader has
//! passed. There an event's number is its transaction's id (high bits) and its ordinal in that
//! transaction (low 20 bits), taken at insert, and readers read only below the **horizon**,
//! the oldest transaction of this database still running (shifted alike; ids are the
//! server's, and another database's transactions never append here): every transaction below it has
//! ended, and every event of one still running lies above it. A transaction held open while
//! others commit holds the horizon (and so every reader) back until it ends; nobody reads past
//! it in the meantime. Numbers are sparse: no reader may count on `n + 1`
//! (`0013_event_sequence_by_transaction.sql`).

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{StoreError, WorkLease};
use crate::domain::{Event, EventType};

/// The type of stored event `sequence`, named `name` in the database.
pub(crate) fn stored_type(sequence: i64, name: &str) -> Result<EventType, StoreError> {
    EventType::parse(name)
        .ok_or_else(|| StoreError::Corrupt(format!("event {sequence}: unknown type {name:?}")))
}

/// A sink's durable state ([`EventLog::lease_sink`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SinkState {
    pub name: String,
    /// Every event up to this sequence is delivered (0: none yet).
    pub delivered_through: i64,
    /// Since when deliveries have failed without a success between (`None`: not failing).
    pub failing_since: Option<DateTime<Utc>>,
    /// Paused after failing for the give-up period; delivers nothing until resumed.
    pub paused: bool,
    /// The last delivery failure, for operators.
    pub last_error: Option<String>,
}

/// Where a reader starts and what it may see.
#[derive(Clone, Debug)]
pub struct EventPage<'a> {
    /// Events with a larger sequence.
    pub after: i64,
    /// Only this owner's reservations (`None`: everyone's, for an admin or a sink).
    pub owner: Option<&'a str>,
    pub limit: u32,
}

/// The store's part of the event log.
#[async_trait]
pub trait EventLog: Send + Sync + 'static {
    /// Readable events after `page.after`, in sequence order, at most `page.limit`.
    async fn events_after(&self, page: &EventPage<'_>) -> Result<Vec<Event>, StoreError>;

    /// The largest readable sequence: 0 while the log is empty (PostgreSQL) or always was
    /// (SQLite, whose numbers never go back even when retention empties the log).
    async fn latest_sequence(&self) -> Result<i64, StoreError>;

    /// The sequence just before the last `n` readable events (of `owner`'s reservations when
    /// given): a reader starting after it receives those `n`. 0 when there are fewer.
    async fn before_last(&self, owner: Option<&str>, n: u32) -> Result<i64, StoreError>;

    /// The sequence and type of up to `limit` readable events after `after`, in order: what
    /// the feed's follower counts and announces, without reading whole events.
    async fn appended_after(
        &self,
        after: i64,
        limit: u32,
    ) -> Result<Vec<(i64, EventType)>, StoreError>;

    /// Takes or renews `name`'s delivery lease for `lease.owner` (creating the sink's row on
    /// first use) and answers its state; `None` while another owner's lease runs.
    async fn lease_sink(
        &self,
        name: &str,
        lease: WorkLease,
    ) -> Result<Option<SinkState>, StoreError>;

    /// Records delivery through `through` by the lease holder (the cursor only moves forward)
    /// and clears the failure. `false`: the lease is no longer `lease_owner`'s.
    async fn record_delivered(
        &self,
        name: &str,
        lease_owner: Uuid,
        through: i64,
    ) -> Result<bool, StoreError>;

    /// Records a failed delivery by the lease holder; the sink is paused when it has been
    /// failing for `give_up` (database clock). Answers the state after.
    async fn record_sink_failure(
        &self,
        name: &str,
        lease_owner: Uuid,
        error: &str,
        give_up: Duration,
    ) -> Result<Option<SinkState>, StoreError>;

    /// Resumes a paused sink (its failure cleared). `false`: no such sink.
    async fn resume_sink(&self, name: &str) -> Result<bool, StoreError>;

    /// Gives `name`'s lease up if `lease_owner` holds it (a replica stopping), so another
    /// replica takes the sink over at once instead of when the lease runs out. `false`: it
    /// did not hold it.
    async fn release_sink(&self, name: &str, lease_owner: Uuid) -> Result<bool, StoreError>;

    /// Every sink's state, by name.
    async fn sinks(&self) -> Result<Vec<SinkState>, StoreError>;

    /// How long the oldest event `name` has not delivered has been waiting (database clock);
    /// zero when it is caught up. Events committed above the horizon count from when they were
    /// written.
    async fn sink_lag(&self, name: &str) -> Result<Duration, StoreError>;

    /// Retention: of the `limit` oldest events, deletes those older than `keep`, never
    /// one a sink that is not paused and whose lease ran within `keep` has yet to deliver
    /// (times follow numbers, so no index on time is needed). Answers how many.
    async fn purge_events(&self, keep: Duration, limit: u32) -> Result<u64, StoreError>;
}
