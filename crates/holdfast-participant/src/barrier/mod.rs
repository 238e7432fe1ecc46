//! The barrier: one row per (participant, reservation, branch) recording the branch's phase and
//! the first Try answer, written on the caller's transaction so the barrier changes commit or
//! roll back together with the business change.
//!
//! [`Backend`] is the one storage interface of the SDK: everything the SDK asks of a database
//! (how a write transaction begins, every barrier statement). Each backend's SQL lives in its
//! own file: `postgres.rs` (row locks, `clock_timestamp()`) and `sqlite.rs` (`BEGIN IMMEDIATE`
//! write lock, `unixepoch('now','subsec')` in integer microseconds). The logic above it
//! ([`super::ParticipantService`]) is written once.

mod in_one;
#[cfg(feature = "postgres")]
mod postgres;
pub use in_one::{HeldBarrierMove, HeldBarrierRow};
#[cfg(feature = "sqlite")]
mod sqlite;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sqlx::Pool;

use super::{BranchCtx, BranchKey, Item, ResourceError, Slot, TryAnswer};

/// A branch's phase at this participant, as its barrier row records it (the `state`
/// column). Not the coordinator store's record of a branch's phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarrierPhase {
    /// Row inserted by the current transaction: no call for this branch was recorded before.
    Trying,
    /// Try held the items.
    Held,
    /// Try was refused.
    Rejected,
    /// Confirmed.
    Confirmed,
    /// Cancelled (including Cancel before Try).
    Cancelled,
    /// Confirm found the hold gone, or it was reclaimed.
    HoldLost,
}

impl BarrierPhase {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            BarrierPhase::Trying => "trying",
            BarrierPhase::Held => "held",
            BarrierPhase::Rejected => "rejected",
            BarrierPhase::Confirmed => "confirmed",
            BarrierPhase::Cancelled => "cancelled",
            BarrierPhase::HoldLost => "hold_lost",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(s: &str) -> Result<Self, ResourceError> {
        Ok(match s {
            "trying" => BarrierPhase::Trying,
            "held" => BarrierPhase::Held,
            "rejected" => BarrierPhase::Rejected,
            "confirmed" => BarrierPhase::Confirmed,
            "cancelled" => BarrierPhase::Cancelled,
            "hold_lost" => BarrierPhase::HoldLost,
            other => {
                return Err(ResourceError::Internal(format!(
                    "unknown barrier state {other:?}"
                )));
            }
        })
    }
}

/// A locked barrier row, as a backend read it.
#[derive(Debug)]
pub struct BarrierRow {
    /// The branch's phase.
    pub phase: BarrierPhase,
    /// The first answer given to Try, if any.
    pub try_answer: Option<TryAnswer>,
    /// Who holds the reservation (empty before Try).
    pub holder: String,
    /// The Try's items, as stored (see [`BarrierRow::ctx`]).
    pub items: Value,
    /// The reservation's `expires_at`, once a Try recorded it.
    pub expires_at: Option<DateTime<Utc>>,
    /// `expires_at + orphan_grace`, once a Try recorded it.
    pub hold_until: Option<DateTime<Utc>>,
}

impl BarrierRow {
    /// A row just inserted by the current transaction: nothing recorded yet.
    pub fn trying() -> Self {
        BarrierRow {
            phase: BarrierPhase::Trying,
            try_answer: None,
            holder: String::new(),
            items: Value::Array(Vec::new()),
            expires_at: None,
            hold_until: None,
        }
    }

    /// The branch as its Try recorded it, for Confirm/Cancel/reclaim business calls.
    pub fn ctx(&self, key: &BranchKey) -> Result<BranchCtx, ResourceError> {
        let epoch = DateTime::<Utc>::UNIX_EPOCH;
        Ok(BranchCtx {
            key: key.clone(),
            holder: self.holder.clone(),
            items: decode_items(&self.items)?,
            expires_at: self.expires_at.unwrap_or(epoch),
            hold_until: self.hold_until.unwrap_or(epoch),
        })
    }
}

/// Parses the stored Try answer (`try_answer`, `try_reason` columns).
pub(crate) fn parse_try_answer(
    answer: Option<&str>,
    reason: String,
) -> Result<Option<TryAnswer>, ResourceError> {
    match answer {
        None => Ok(None),
        Some("held") => Ok(Some(TryAnswer::Held)),
        Some("rejected") => Ok(Some(TryAnswer::Rejected(reason))),
        Some(other) => Err(ResourceError::Internal(format!(
            "unknown barrier try_answer {other:?}"
        ))),
    }
}

/// The stored spelling of a Try answer and its reason.
pub(crate) fn answer_parts(answer: &TryAnswer) -> (&'static str, &str) {
    match answer {
        TryAnswer::Held => ("held", ""),
        TryAnswer::Rejected(reason) => ("rejected", reason.as_str()),
    }
}

/// The database a participant keeps its barrier (and business data) in: PostgreSQL
/// ([`sqlx::Postgres`]) or SQLite ([`sqlx::Sqlite`]). Every barrier function runs on the
/// caller's transaction; [`Backend::begin_write`] opens the transactions the SDK runs phases in.
#[async_trait]
pub trait Backend: sqlx::Database {
    /// Opens a write transaction. PostgreSQL: a plain `BEGIN` (rows are locked as they are
    /// touched); SQLite: `BEGIN IMMEDIATE`, the database write lock for the whole transaction
    /// (waited for up to the busy timeout), which stands in for every row lock.
    async fn begin_write(pool: &Pool<Self>) -> Result<Self::Write, sqlx::Error>;

    /// A write transaction of this database (statements on `&mut *tx`): sqlx's on PostgreSQL,
    /// a [`holdfast_serve::db::SqliteWrite`] (queued, group-committed) on SQLite.
    type Write: holdfast_serve::db::WriteTransaction + std::ops::DerefMut<Target = Self::Connection>;

    /// A connection for one write statement ([`Backend::acquire_write`]).
    type WriteConnection: std::ops::DerefMut<Target = Self::Connection> + Send;

    /// A connection for a write statement outside a transaction (a barrier-only participant's
    /// one statement), ended by [`Backend::finish_write`]. PostgreSQL: any of the pool's, the
    /// statement in autocommit; SQLite: a member of the writer's group commit, so concurrent
    /// ones share a COMMIT (and its fsync) with each other and with the transactions.
    async fn acquire_write(pool: &Pool<Self>) -> Result<Self::WriteConnection, sqlx::Error>;

    /// Ends a write [`Backend::acquire_write`] began, once its statement succeeded: durable
    /// when it returns `Ok`. PostgreSQL: nothing left to do; SQLite: its group's COMMIT. A
    /// connection dropped without it writes nothing on SQLite.
    async fn finish_write(conn: Self::WriteConnection) -> Result<(), sqlx::Error> {
        drop(conn);
        Ok(())
    }

    /// Applies the barrier's schema ([`crate::migrations`]), tracked apart from the author's
    /// own migrations.
    async fn migrate(pool: &Pool<Self>) -> Result<(), sqlx::migrate::MigrateError>;

    /// Locks the branch's barrier row, creating it in phase `Trying` when absent. Concurrent
    /// calls for one branch serialise here.
    async fn lock(
        conn: &mut Self::Connection,
        participant: &str,
        key: &BranchKey,
    ) -> Result<BarrierRow, ResourceError>;

    /// Like [`Backend::lock`], for calls that usually find the row (Confirm, Cancel).
    async fn lock_existing(
        conn: &mut Self::Connection,
        participant: &str,
        key: &BranchKey,
    ) -> Result<BarrierRow, ResourceError>;

    /// Records the Try's answer and the branch's new phase, with what Confirm/Cancel need later.
    async fn record_try(
        conn: &mut Self::Connection,
        participant: &str,
        branch: &BranchCtx,
        phase: BarrierPhase,
        answer: &TryAnswer,
    ) -> Result<(), ResourceError>;

    /// Records a first Try's answer by inserting the branch's row in `phase` (`Held` before
    /// the business change, on its transaction; `Rejected` in autocommit after a refusal).
    /// False (nothing written) if the branch has a row already: a call for it came first, and
    /// the caller must undo and answer from it. A concurrent first call for the branch is
    /// waited for.
    async fn insert_try(
        conn: &mut Self::Connection,
        participant: &str,
        branch: &BranchCtx,
        phase: BarrierPhase,
        answer: &TryAnswer,
    ) -> Result<bool, ResourceError> {
        let found = Self::lock(conn, participant, &branch.key).await?;
        if found.phase != BarrierPhase::Trying {
            return Ok(false);
        }
        Self::record_try(conn, participant, branch, phase, answer).await?;
        Ok(true)
    }

    /// Whether concurrent barrier-only writes ([`Backend::insert_held_batch`],
    /// [`Backend::advance_held_batch`]) share one statement, and concurrent first Tries of a
    /// resource whose shortcuts hold them in batches ([`crate::Shortcuts::tries_in_batches`])
    /// one transaction. PostgreSQL: yes, one round trip and one commit for the batch. SQLite:
    /// no; each call's statement is a member of its one writer's group commit, which shares the
    /// fsync.
    const BATCHES_BARRIER_ONLY: bool = false;

    /// Many first Tries of a barrier-only resource (phase and answer `Held`) in one
    /// autocommit statement; for each branch, whether its row was inserted (false: the branch
    /// has a row already, and the caller answers from it). The keys are distinct. Only called
    /// when [`Backend::BATCHES_BARRIER_ONLY`].
    async fn insert_held_batch(
        conn: &mut Self::Connection,
        participant: &str,
        branches: &[&BranchCtx],
    ) -> Result<Vec<bool>, ResourceError> {
        let _ = (conn, participant, branches);
        Err(ResourceError::Internal(
            "this database does not batch barrier writes".into(),
        ))
    }

    /// Many `Held` branches of a barrier-only resource moved to `to` in one autocommit
    /// statement; for each key, whether it moved (false: not `Held`, nothing changed). The
    /// keys are distinct. Only called when [`Backend::BATCHES_BARRIER_ONLY`].
    async fn advance_held_batch(
        conn: &mut Self::Connection,
        participant: &str,
        keys: &[&BranchKey],
        to: BarrierPhase,
    ) -> Result<Vec<bool>, ResourceError> {
        let _ = (conn, participant, keys, to);
        Err(ResourceError::Internal(
            "this database does not batch barrier writes".into(),
        ))
    }

    /// Settles a batch's refused first Tries, whose rows the caller's transaction inserted
    /// `Held` (nothing held): in one statement, recorded `Rejected` with their reasons and
    /// `true`; or, when another branch's hold is orphaned ([`Backend::orphans_exist`]), their
    /// rows deleted and `false` (each Try then reclaims and tries again). Only called when
    /// [`Backend::BATCHES_BARRIER_ONLY`].
    async fn settle_refused(
        conn: &mut Self::Connection,
        participant: &str,
        refused: &[(&BranchKey, &str)],
    ) -> Result<bool, ResourceError> {
        let _ = (conn, participant, refused);
        Err(ResourceError::Internal(
            "this database does not batch barrier writes".into(),
        ))
    }

    /// Moves a `Held` branch to `to`, locking its row, and returns it as its Try recorded it
    /// (with phase `to`). `None`: the branch is not `Held` (or has no row); nothing changed
    /// that the caller's general path would not see.
    async fn advance_held(
        conn: &mut Self::Connection,
        participant: &str,
        key: &BranchKey,
        to: BarrierPhase,
    ) -> Result<Option<BarrierRow>, ResourceError> {
        let mut found = Self::lock_existing(conn, participant, key).await?;
        if found.phase != BarrierPhase::Held {
            return Ok(None);
        }
        Self::set_phase(conn, participant, key, to).await?;
        found.phase = to;
        Ok(Some(found))
    }

    /// Moves a `Held` branch's deadline to `expires_at` and its reclaim time to `hold_until`,
    /// each only if later than recorded (never earlier), locking its row; returns the branch
    /// as recorded afterwards. `None`: the branch is not `Held` (or has no row); nothing
    /// changed.
    async fn extend_held(
        conn: &mut Self::Connection,
        participant: &str,
        key: &BranchKey,
        expires_at: DateTime<Utc>,
        hold_until: DateTime<Utc>,
    ) -> Result<Option<BarrierRow>, ResourceError>;

    /// The branch's phase, without creating its row; `None` when it has none.
    async fn phase(
        conn: &mut Self::Connection,
        participant: &str,
        key: &BranchKey,
    ) -> Result<Option<BarrierPhase>, ResourceError>;

    /// Records a rejection for a Try that arrived after the branch was already decided without
    /// one, so repeats of the late Try answer the same.
    async fn record_late_try(
        conn: &mut Self::Connection,
        participant: &str,
        key: &BranchKey,
        reason: &str,
    ) -> Result<(), ResourceError>;

    /// Moves the branch to `phase`.
    async fn set_phase(
        conn: &mut Self::Connection,
        participant: &str,
        key: &BranchKey,
        phase: BarrierPhase,
    ) -> Result<(), ResourceError>;

    /// Whether any hold of this participant is past `expires_at + orphan_grace` (database clock).
    async fn orphans_exist(
        conn: &mut Self::Connection,
        participant: &str,
    ) -> Result<bool, ResourceError>;

    /// Locks one orphaned held branch. With `skip_locked`, rows another transaction holds are
    /// skipped (PostgreSQL; on SQLite the write lock already excludes every other writer).
    async fn lock_next_orphan(
        conn: &mut Self::Connection,
        participant: &str,
        skip_locked: bool,
    ) -> Result<Option<(BranchKey, BarrierRow)>, ResourceError>;

    /// Retention: deletes up to `limit` of `participant`'s barrier rows of finished branches
    /// (confirmed, cancelled, rejected) whose last change is more than `keep` ago and whose
    /// hold, if a Try recorded one, is past `expires_at + orphan_grace` (database clock),
    /// oldest first, skipping rows another transaction holds; answers their branches.
    async fn purge_finished(
        conn: &mut Self::Connection,
        participant: &str,
        keep: std::time::Duration,
        limit: u32,
    ) -> Result<Vec<BranchKey>, ResourceError>;

    /// Counts `participant`'s branches by phase.
    async fn branch_counts(
        conn: &mut Self::Connection,
        participant: &str,
    ) -> Result<BranchCounts, ResourceError>;
}

pub(crate) fn encode_items(items: &[Item]) -> Value {
    Value::Array(
        items
            .iter()
            .map(|item| {
                let during = item.during.map(|slot| {
                    json!({
                        "start_micros": slot.start.timestamp_micros(),
                        "end_micros": slot.end.timestamp_micros(),
                    })
                });
                json!({ "resource": item.resource, "quantity": item.quantity, "during": during })
            })
            .collect(),
    )
}

fn decode_items(value: &Value) -> Result<Vec<Item>, ResourceError> {
    let bad = || ResourceError::Internal("malformed items in barrier row".to_owned());
    let micros = |v: &Value, k: &str| {
        v.get(k)
            .and_then(Value::as_i64)
            .and_then(DateTime::<Utc>::from_timestamp_micros)
            .ok_or_else(bad)
    };
    value
        .as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|v| {
            let during = match v.get("during") {
                None | Some(Value::Null) => None,
                Some(d) => Some(Slot {
                    start: micros(d, "start_micros")?,
                    end: micros(d, "end_micros")?,
                }),
            };
            Ok(Item {
                resource: v
                    .get("resource")
                    .and_then(Value::as_str)
                    .ok_or_else(bad)?
                    .to_owned(),
                quantity: v.get("quantity").and_then(Value::as_i64).ok_or_else(bad)?,
                during,
            })
        })
        .collect()
}

/// How many branches of one participant are in each live phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BranchCounts {
    /// Branches holding.
    pub held: i64,
    /// Branches confirmed.
    pub confirmed: i64,
    /// Branches cancelled (including Cancel before Try).
    pub cancelled: i64,
    /// Branches whose hold was lost or reclaimed.
    pub hold_lost: i64,
}

/// Counts `participant`'s branches by phase, from the barrier table (PostgreSQL; generic code
/// calls [`Backend::branch_counts`]).
#[cfg(feature = "postgres")]
pub async fn branch_counts(
    conn: &mut sqlx::PgConnection,
    participant: &str,
) -> Result<BranchCounts, ResourceError> {
    <sqlx::Postgres as Backend>::branch_counts(conn, participant).await
}
