//! The event log (SPEC 10) as the store keeps it: an outbox table both databases append to
//! from triggers, in the transaction of every change (migrations `0012_events.sql`), so no
//! write path can forget one; readers page through it by `sequence`; each sink keeps its
//! durable cursor and lease here.
//!
//! Sequence numbers. SQLite has one writer, so a number taken at insert (`AUTOINCREMENT`)
//! is already commit order. PostgreSQL commits concurrent transactions in any order, so a
//! number taken at insert could become visible after a larger one a reader has passed. There
//! an event is inserted unnumbered, and the **sequencer** ([`EventLog::sequence_events`])
//! numbers committed events in transactions of its own, one at a time (the row lock on
//! `event_sequencer`): every number it hands out is larger than any committed before, and a
//! reader's snapshot holds a prefix of the numbers. A transaction held open while others
//! commit only gets its number when it commits; nobody reads past it in the meantime.

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

/// The head of the log ([`EventLog::head`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogHead {
    /// The largest sequence handed out.
    pub latest: i64,
    /// Events wait to be numbered (PostgreSQL) or counted (SQLite).
    pub waiting: bool,
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
    /// Numbered events after `page.after`, in sequence order, at most `page.limit`.
    async fn events_after(&self, page: &EventPage<'_>) -> Result<Vec<Event>, StoreError>;

    /// The largest sequence handed out (0 when the log is empty and always was).
    async fn latest_sequence(&self) -> Result<i64, StoreError>;

    /// The latest sequence, and whether events wait for [`EventLog::sequence_events`]: one
    /// cheap read, what the sequencer loop asks when nothing told it of a change.
    async fn head(&self) -> Result<LogHead, StoreError>;

    /// PostgreSQL: numbers up to `limit` committed, unnumbered events in one transaction and
    /// answers their numbers and types (none also when another replica's sequencer is at
    /// work). SQLite, whose events are numbered at insert: those of up to `limit` events
    /// numbered since this store's previous call (none at the first).
    async fn sequence_events(&self, limit: u32) -> Result<Vec<(i64, EventType)>, StoreError>;

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

    /// Every sink's state, by name.
    async fn sinks(&self) -> Result<Vec<SinkState>, StoreError>;

    /// How long the oldest event `name` has not delivered has been waiting (database clock);
    /// zero when it is caught up. Unnumbered events count from when they were written.
    async fn sink_lag(&self, name: &str) -> Result<Duration, StoreError>;

    /// Retention: of the `limit` oldest numbered events, deletes those older than `keep`, never
    /// one a sink that is not paused and whose lease ran within `keep` has yet to deliver
    /// (times follow numbers, so no index on time is needed). Answers how many.
    async fn purge_events(&self, keep: Duration, limit: u32) -> Result<u64, StoreError>;
}
