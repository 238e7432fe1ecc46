//! holdfast-participant, the participant SDK: turns a service's business logic into a
//! `tcc.v1.Participant` of a holdfast coordinator, on PostgreSQL or SQLite.
//!
//! An author implements [`Resource`] - what Try, Confirm and Cancel mean for their data, each
//! run inside a database transaction the SDK opens - and serves [`ParticipantService`]. The
//! SDK keeps a *barrier* row per branch (table `tcc_barrier`, migration
//! `migrations/{postgres,sqlite}/` of this crate) in the same local transaction as the business
//! change, which gives, with no code from the author:
//!
//! - idempotence: a repeated Try/Confirm/Cancel changes nothing and returns the first answer;
//! - disorder safety: a Cancel before its Try records the branch as cancelled and the late
//!   Try answers `REJECTED` and leaves the business data unchanged;
//! - refusal without change of Confirm after Cancel (answers `CANCELLED`) and Cancel after
//!   Confirm (answers `CONFIRMED`);
//! - atomicity: a rejected or failed Try leaves no hold; a rejection is remembered so a repeat
//!   answers the same;
//! - serialisation: concurrent calls for one branch lock its barrier row, never both apply;
//! - orphan reclaim: a hold is released by the participant itself only after
//!   `expires_at + orphan_grace` ([`ParticipantService::reclaim_orphans`], also run lazily
//!   when a Try is rejected while orphans exist); a later Confirm answers `HOLD_LOST`;
//! - extension: Extend moves a held branch's deadline later (never earlier), in the barrier
//!   row the reclaim reads ([`ParticipantService::extend_branch`]); a repeat changes nothing,
//!   a branch no longer held answers its state.
//!
//! Business code must lock the resources it touches in the order of the items it is given
//! (sorted by resource, then slot start) and use `clock_timestamp()` for time decisions.
//! A business "can't" is `TryAnswer::Rejected`; an exclusion-constraint violation (SQLSTATE
//! 23P01) raised by business SQL is turned into a rejection by the SDK as well.
//!
//! Backends: PostgreSQL (the default type parameter, `Resource` = `Resource<sqlx::Postgres>`)
//! and SQLite (`Resource<sqlx::Sqlite>`, every SDK transaction begun with `BEGIN IMMEDIATE`,
//! times in integer microseconds, the clock `unixepoch('now', 'subsec')`); [`Backend`] holds
//! each one's barrier SQL, the logic in [`ParticipantService`] is written once. Each backend is
//! a crate feature (`postgres`, `sqlite`, both by default); built with `sqlite` alone, the
//! default type parameter ([`DefaultDatabase`]) is SQLite.
//!
//! An author writes [`Resource`] only. A resource may also offer [`Shortcuts`]: fast paths
//! for its hot calls on PostgreSQL (a call as one statement with its barrier row, first Tries
//! in batches, or no business data at all), each taken only where it applies, every other
//! call going the general way.
//!
//! Inside: `service.rs` runs the phases (Try in `service/try_phase.rs`: a way chosen, then a
//! fixed fallback list walked); `shortcuts.rs` is the optional trait; `barrier_only.rs` and
//! `try_batch.rs` group-commit concurrent calls (a barrier-only resource's writes; first Tries
//! of a resource whose shortcuts take them in batches); `calls.rs` serves them over gRPC and
//! counts each call; `retention.rs` deletes finished branches' rows (`--retention`);
//! `barrier/` holds every barrier statement; `wire.rs` turns requests into SDK terms and
//! answers into responses, and `validate.rs` checks a Try, for every participant server of
//! this crate (`stock-redis` included) alike; `error.rs` maps errors to statuses once.
//!
//! Writing one (see `examples/car_park_postgres.rs` and `examples/car_park_sqlite.rs`):
//! open a pool ([`db::open_postgres`] / [`db::open_sqlite`]), apply the barrier schema
//! ([`migrate`]), implement [`Resource`] for that database, and serve
//! `ParticipantService::new(name, resource, pool).into_server()` with [`server::serve`] (TLS,
//! API keys, health and reflection come with it). This crate never depends on the
//! coordinator, Redis or the OpenTelemetry SDK (trace context is propagated through the API).
//!
//! Answers per barrier phase (Try / Confirm / Cancel):
//! - none yet: hold / `HOLD_LOST` (and the late Try is refused) / `CANCELLED` (ditto);
//! - held: first answer / confirm or `HOLD_LOST` / release, `CANCELLED`;
//! - rejected: first answer / `HOLD_LOST` / `CANCELLED` (recorded);
//! - confirmed: first answer / `CONFIRMED` / `CONFIRMED` (refused, unchanged);
//! - cancelled: first answer or `REJECTED` / `CANCELLED` (refused, unchanged) / `CANCELLED`;
//! - hold lost: first answer or `REJECTED` / `HOLD_LOST` / `CANCELLED` (nothing is held).
//!
//! Extend answers `HELD` (deadline moved forward) only for a held branch; otherwise the state
//! (`CONFIRMED`, `CANCELLED`, `HOLD_LOST` for rejected, lost or unknown branches) and writes
//! nothing.

// The serving layer's SQLite clock macro, for the barrier's SQLite statements.
#[cfg(feature = "sqlite")]
#[macro_use]
extern crate holdfast_serve;

mod barrier;
mod barrier_only;
pub mod calls;
pub mod clock;
mod error;
mod faults;
pub mod migrations;
mod retention;
mod service;
mod shortcuts;
pub mod telemetry;
mod try_batch;
pub mod validate;
pub mod wire;

// Serving a participant: its port (TLS, API keys, health, reflection) and its database pools.
pub use holdfast_serve::{auth, db, server, tls};

#[cfg(not(any(feature = "postgres", feature = "sqlite")))]
compile_error!(
    "holdfast-participant needs a database: enable the `postgres` or the `sqlite` feature"
);

/// The database a [`Resource`] and a [`ParticipantService`] are for when none is named:
/// PostgreSQL, or SQLite in a build without the `postgres` feature.
#[cfg(feature = "postgres")]
pub type DefaultDatabase = sqlx::Postgres;
/// The database a [`Resource`] and a [`ParticipantService`] are for when none is named:
/// PostgreSQL, or SQLite in a build without the `postgres` feature.
#[cfg(not(feature = "postgres"))]
pub type DefaultDatabase = sqlx::Sqlite;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

#[cfg(feature = "postgres")]
pub use barrier::branch_counts;
pub use barrier::{
    Backend, BarrierPhase, BarrierRow, BranchCounts, HeldBarrierMove, HeldBarrierRow,
};
pub use clock::{OrphanReclaim, ParticipantClock};
pub use error::ResourceError;
pub use migrations::migrate;
pub use retention::{Purged, RETENTION_BATCH};
pub use service::{DEFAULT_MAX_HOLD, DEFAULT_ORPHAN_GRACE, ParticipantService};
pub use shortcuts::Shortcuts;

/// Identifies one branch: one participant's share of one reservation.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BranchKey {
    /// The coordinator's reservation id.
    pub reservation_id: String,
    /// The branch id, unique per (reservation, participant).
    pub branch_id: String,
}

/// A half-open time slot `[start, end)`, for slot resources such as rooms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Slot {
    /// Inclusive start.
    pub start: DateTime<Utc>,
    /// Exclusive end; always after `start`.
    pub end: DateTime<Utc>,
}

/// One thing a branch holds at this participant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    /// Resource id within this participant (seat, SKU, room, account); 1..=128 bytes.
    pub resource: String,
    /// Units to hold; always >= 1 (seats and rooms: 1; payments: minor units).
    pub quantity: i64,
    /// The slot, for slot resources.
    pub during: Option<Slot>,
}

/// A Try in domain terms: what [`ParticipantService::try_branch`] takes.
#[derive(Clone, Debug)]
pub struct TryBranch {
    /// Which branch.
    pub key: BranchKey,
    /// Who holds the reservation; 1..=128 bytes.
    pub holder: String,
    /// The items, in any order (the SDK validates and sorts them).
    pub items: Vec<Item>,
    /// When the reservation lapses (the coordinator's clock).
    pub expires_at: DateTime<Utc>,
}

/// Everything the business code knows about a branch (built by the SDK).
///
/// For Confirm and Cancel, `items`, `holder`, `expires_at` and `hold_until` are those the
/// branch's Try recorded.
#[derive(Clone, Debug)]
pub struct BranchCtx {
    /// Which branch.
    pub key: BranchKey,
    /// Who holds the reservation.
    pub holder: String,
    /// The branch's items, sorted by (resource, slot start), without duplicates.
    pub items: Vec<Item>,
    /// When the reservation lapses (the coordinator's clock).
    pub expires_at: DateTime<Utc>,
    /// `expires_at + orphan_grace`: the participant keeps the hold at least until then unless
    /// the coordinator releases it. Worth storing on hold rows for people reading them.
    pub hold_until: DateTime<Utc>,
}

/// The answer the business code gives to a Try; the barrier keeps the first one (its
/// `try_answer` column) and gives it again to every repeat. Not the coordinator's
/// `domain::TryOutcome`, which is what the coordinator makes of a participant's reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TryAnswer {
    /// Every item is held.
    Held,
    /// Nothing can be held; the reason is for people (e.g. "seat A1 is taken").
    /// The SDK rolls back whatever the business code wrote.
    Rejected(String),
}

/// The business answer to a Confirm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfirmOutcome {
    /// Every item is finalised.
    Confirmed,
    /// Some hold no longer exists; the SDK rolls back the confirm, releases what is left
    /// (through [`Resource::cancel`]) and answers `HOLD_LOST`.
    HoldLost,
}

/// The answer to Confirm or Cancel: the branch's state at this participant after the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BranchAnswer {
    /// Finalised (also the answer to a refused Cancel after Confirm).
    Confirmed,
    /// Released or never held (also the answer to a refused Confirm after Cancel).
    Cancelled,
    /// Confirm found the hold gone (reclaimed after `expires_at + orphan_grace`, or never held).
    HoldLost,
}

/// The answer to Extend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtendAnswer {
    /// The branch holds at least until the new `expires_at + orphan_grace`.
    Held,
    /// The branch no longer holds (confirmed, cancelled, or its hold is gone / was never
    /// granted); nothing changed.
    Settled(BranchAnswer),
}

/// A participant's business logic: what Try, Confirm, Cancel and Extend mean for its data,
/// and which business rows retention may delete. Three methods are required (`try_hold`,
/// `confirm`, `cancel`); the rest have defaults. Each method runs inside a transaction the
/// SDK opened (and will commit or roll back); do not commit or roll back `conn` yourself.
/// Confirm and Cancel run after the branch's barrier row is locked. A first Try's transaction
/// inserts the branch's barrier row (answered `Held`) and then runs `try_hold`, the last
/// statement before the commit: if the branch turns out to have a row already (a repeat, or a
/// Cancel that came first), or `try_hold` fails, the SDK rolls the transaction back and
/// retries with the row locked first. Keep every effect of `try_hold` inside the transaction.
///
/// Each method's effect is committed at most once per phase of a branch: the SDK filters
/// repeats and disorder. Cancel may nevertheless find holds already gone and must then do
/// nothing (use conditional state transitions, never blind counter updates).
///
/// A resource may also offer [`Shortcuts`] (fewer round trips for its hot calls, on
/// PostgreSQL) from [`Resource::shortcuts`]; none is needed for correctness.
///
/// `DB` is the database: [`sqlx::Postgres`] (the default, [`DefaultDatabase`]) or
/// [`sqlx::Sqlite`]; `conn` is that database's connection (`&mut PgConnection`,
/// `&mut SqliteConnection`).
#[async_trait]
pub trait Resource<DB: Backend = DefaultDatabase>: Send + Sync + 'static {
    /// The table [`Resource::forget_released`] deletes from, for
    /// `holdfast_retention_deleted_total{table}`. Default: none.
    const RELEASED_TABLE: Option<&'static str> = None;

    /// Checks items beyond what the SDK checks (non-empty resource <= 128 bytes, quantity >= 1,
    /// valid slot, no duplicates), e.g. "a seat holds exactly 1". Runs before any write.
    fn validate(&self, items: &[Item]) -> Result<(), ResourceError> {
        let _ = items;
        Ok(())
    }

    /// Holds every item of the branch, all-or-nothing, locking resources in item order.
    async fn try_hold(
        &self,
        conn: &mut DB::Connection,
        branch: &BranchCtx,
    ) -> Result<TryAnswer, ResourceError>;

    /// Finalises the branch's holds.
    async fn confirm(
        &self,
        conn: &mut DB::Connection,
        branch: &BranchCtx,
    ) -> Result<ConfirmOutcome, ResourceError>;

    /// Releases whatever the branch still holds; doing nothing when nothing is held.
    async fn cancel(
        &self,
        conn: &mut DB::Connection,
        branch: &BranchCtx,
    ) -> Result<(), ResourceError>;

    /// A held branch's deadline moved later (Extend): `branch.expires_at`/`hold_until` are the
    /// new ones. The barrier row already records them, and it alone decides reclaim; override
    /// to keep a deadline stored on business rows up to date. Default: nothing.
    async fn extend(
        &self,
        conn: &mut DB::Connection,
        branch: &BranchCtx,
    ) -> Result<(), ResourceError> {
        let _ = (conn, branch);
        Ok(())
    }

    /// Retention: deletes the business rows of these finished branches (their barrier rows
    /// go in the same transaction) that record a released hold (cancelled, voided), and
    /// answers how many went ([`Resource::RELEASED_TABLE`] names the table). Rows of a
    /// confirmed branch stay: they are the sale itself (conservation counts them; a room's
    /// exclusion constraint needs them). Default: none.
    async fn forget_released(
        &self,
        conn: &mut DB::Connection,
        branches: &[BranchKey],
    ) -> Result<u64, ResourceError> {
        let _ = (conn, branches);
        Ok(0)
    }

    /// The resource's [`Shortcuts`], if it offers any: answer `Some(self)` from a resource
    /// that implements them. Default: none; every call goes the general way.
    fn shortcuts(&self) -> Option<&dyn Shortcuts<DB>> {
        None
    }
}
