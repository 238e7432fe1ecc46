//! Test mode (SPEC 9, `holdfast --test-mode`, the testkit): the one movable clock of a test
//! deployment. A [`TestClock`] knows the databases opened through it (the coordinator's store,
//! the participants' pools) and the participants' reclaims; [`TestClock::advance`] moves every
//! one of their clocks forward by the same amount, so "one clock, in the database" still holds:
//! it just runs ahead. [`advance`] also runs the passes a moved clock calls for: the reaper and
//! recovery once, then every participant's orphan reclaim.
//!
//! Nothing here runs outside test mode: a pool not opened through this module never reads the
//! shadow clock (PostgreSQL), and the SQLite offset row stays zero (`database.rs`).
//!
//! Usage (what the testkit does):
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use holdfast_coordinator::testing::{TestClock, open_store};
//! use holdfast_participants::testing::open_participant_db;
//! let clock = TestClock::new();
//! let store = open_store("sqlite:///tmp/t/holdfast.db", 4, &clock).await?;
//! let participants = open_participant_db("sqlite:///tmp/t/participants.db", 4, &clock).await?;
//! // serve them: holdfast_coordinator::serving::serve_test_coordinator and
//! // holdfast_participants::testing::serve_test_participant
//! let offset = clock.advance(std::time::Duration::from_secs(11 * 60)).await?;
//! # Ok(()) }
//! ```

mod database;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::migrate::Migrator;
use tokio::sync::Mutex;

use database::ClockDatabase;
pub use database::{SCHEMA, SEARCH_PATH};

use crate::coordinator::Coordinator;
use crate::participant::ParticipantClock;
use crate::store::{AnyStore, PgStore, SqliteStore, StoreError};

/// The most one move may advance the clock (`AdvanceClock.by`).
pub const MAX_ADVANCE: Duration = Duration::from_secs(366 * 24 * 3600);

/// The most the clock may be ahead in total: far from any timestamp limit (year 9999).
pub const MAX_OFFSET: Duration = Duration::from_secs(100 * 366 * 24 * 3600);

/// Why the test clock could not be moved or a database opened with it.
#[derive(Debug, thiserror::Error)]
pub enum TestingError {
    /// `by` is not a move the clock makes (zero, or beyond [`MAX_ADVANCE`] / [`MAX_OFFSET`]).
    #[error("{0}")]
    InvalidAdvance(String),
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("test clock: {0}")]
    Clock(String),
}

/// The one movable clock of a test deployment. Cheap to clone (shared); keep one for the
/// whole test, across coordinator restarts.
#[derive(Clone, Default)]
pub struct TestClock {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Moves are serialised: each database sees the same sequence of offsets.
    state: Mutex<State>,
    participants: ParticipantClock,
}

#[derive(Default)]
struct State {
    offset_us: i64,
    databases: Vec<(String, ClockDatabase)>,
}

impl std::fmt::Debug for TestClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestClock").finish_non_exhaustive()
    }
}

/// What one [`advance`] did.
#[derive(Clone, Copy, Debug)]
pub struct Advanced {
    /// The clock's total offset from the databases' real clock.
    pub offset: Duration,
    /// The clock's reading after the move.
    pub now: DateTime<Utc>,
    /// How many reservations the reaper released in the pass.
    pub expired: usize,
    /// How many holds the participants' orphan reclaim released.
    pub reclaimed: usize,
}

impl TestClock {
    /// A clock at offset zero with nothing registered.
    pub fn new() -> TestClock {
        TestClock::default()
    }

    /// The participants' side of the clock: put it in
    /// `holdfast_participants::ParticipantSettings::clock` (as
    /// `holdfast_participants::testing::serve_test_participant` does) so `--max-hold` follows the clock and the
    /// participant's orphan reclaim runs after each move.
    pub fn participants(&self) -> &ParticipantClock {
        &self.inner.participants
    }

    /// The total offset so far.
    pub async fn offset(&self) -> Duration {
        let state = self.inner.state.lock().await;
        Duration::from_micros(state.offset_us.unsigned_abs())
    }

    /// Moves every registered database's clock (and the participants' host-clock reads)
    /// forward by `by`; answers the total offset. `by` must be > 0 and at most
    /// [`MAX_ADVANCE`], the total at most [`MAX_OFFSET`]; else nothing moves. Runs no pass:
    /// see [`advance`] for the move with the reaper and the reclaims.
    pub async fn advance(&self, by: Duration) -> Result<Duration, TestingError> {
        let by_us = check_advance(by)?;
        let mut state = self.inner.state.lock().await;
        let total = state
            .offset_us
            .checked_add(by_us)
            .filter(|t| *t as u128 <= MAX_OFFSET.as_micros())
            .ok_or_else(|| {
                TestingError::InvalidAdvance(format!(
                    "would move the clock beyond {} days ahead in total",
                    MAX_OFFSET.as_secs() / 86_400
                ))
            })?;
        state.offset_us = total;
        self.apply(&state).await?;
        Ok(Duration::from_micros(total.unsigned_abs()))
    }

    /// The clock's reading: the first registered database's clock (the coordinator's, when
    /// opened first), or the host's plus the offset when none is registered.
    pub async fn now(&self) -> Result<DateTime<Utc>, TestingError> {
        let state = self.inner.state.lock().await;
        match state.databases.first() {
            Some((_, database)) => database.now().await,
            None => Ok(self.inner.participants.now()),
        }
    }

    /// Runs every participant's orphan reclaim once; how many holds they released.
    pub async fn reclaim_orphans(&self) -> usize {
        self.inner.participants.reclaim_orphans().await
    }

    /// Registers `database` (once per database) and brings every clock to the furthest
    /// offset any of them has (a database reopened after a restart keeps its own).
    async fn register(&self, database: ClockDatabase) -> Result<(), TestingError> {
        let mut state = self.inner.state.lock().await;
        let key = database.key();
        let found = database.offset_us().await?;
        state.offset_us = state.offset_us.max(found);
        if !state.databases.iter().any(|(k, _)| *k == key) {
            state.databases.push((key, database));
        }
        self.apply(&state).await
    }

    async fn apply(&self, state: &State) -> Result<(), TestingError> {
        for (_, database) in &state.databases {
            database.move_to(state.offset_us).await?;
        }
        self.inner.participants.move_to(state.offset_us);
        Ok(())
    }
}

/// `by` in microseconds, if it is a move the clock makes (named by the caller's field `by`).
fn check_advance(by: Duration) -> Result<i64, TestingError> {
    if by.is_zero() {
        return Err(TestingError::InvalidAdvance("must be > 0".into()));
    }
    if by > MAX_ADVANCE {
        return Err(TestingError::InvalidAdvance(
            "must be at most 366 days".into(),
        ));
    }
    i64::try_from(by.as_micros()).map_err(|_| TestingError::InvalidAdvance("is too long".into()))
}

/// Moves `clock` forward by `by` and, before answering, runs the passes a moved clock calls
/// for: one reaper + recovery pass of `coordinator` (its background sweeps held off from
/// before the move until the pass has claimed what was due, so the pass releases it), then
/// every participant's orphan reclaim. `AdvanceClock` of `tcc.v1.Testing`.
pub async fn advance(
    clock: &TestClock,
    coordinator: &Coordinator,
    by: Duration,
) -> Result<Advanced, AdvanceError> {
    // A refused move runs no pass either: nothing changes.
    check_advance(by)?;
    let (offset, pass) = coordinator.sweep_now(clock.advance(by)).await?;
    let offset = offset?;
    let reclaimed = clock.reclaim_orphans().await;
    Ok(Advanced {
        offset,
        now: clock.now().await?,
        expired: pass.expired,
        reclaimed,
    })
}

/// Why [`advance`] failed: the move, or the pass after it.
#[derive(Debug, thiserror::Error)]
pub enum AdvanceError {
    #[error(transparent)]
    Clock(#[from] TestingError),
    #[error(transparent)]
    Coordinator(#[from] crate::coordinator::Error),
}

/// Opens the coordinator's store on `url` (`sqlite://...` in a temporary folder, or
/// `postgres://...`, created if missing) with `clock`'s movable clock, migrated, and
/// registered with `clock`. Serve it with [`crate::serving::serve_test_coordinator`]; reopen it
/// the same way after a restart (the clock keeps its offset).
pub async fn open_store(
    url: &str,
    max_connections: u32,
    clock: &TestClock,
) -> Result<AnyStore, TestingError> {
    let store: AnyStore = match crate::db::DatabaseKind::of_url(url)? {
        crate::db::DatabaseKind::Postgres => {
            let (pool, database) = database::open_postgres(url, max_connections).await?;
            let store = PgStore::from_pool(pool);
            store.migrate().await?;
            clock.register(database).await?;
            store.into()
        }
        crate::db::DatabaseKind::Sqlite => {
            let (pool, database) = database::open_sqlite(url, max_connections).await?;
            let store = SqliteStore::from_pool(pool);
            store.migrate().await?;
            clock.register(database).await?;
            store.into()
        }
    };
    Ok(store)
}

/// A database opened by [`open_migrated`]: a pool of either kind.
#[derive(Clone, Debug)]
pub enum ClockPool {
    Postgres(sqlx::PgPool),
    Sqlite(sqlx::SqlitePool),
}

/// Opens a database on `url` (SQLite or PostgreSQL, created if missing) with `clock`'s movable
/// clock, `postgres` or `sqlite` applied as its kind asks, and registered with `clock`: the
/// reference participants' databases (`holdfast_participants::testing::open_participant_db`).
pub async fn open_migrated(
    url: &str,
    max_connections: u32,
    clock: &TestClock,
    postgres: &Migrator,
    sqlite: &Migrator,
) -> Result<ClockPool, TestingError> {
    Ok(match crate::db::DatabaseKind::of_url(url)? {
        crate::db::DatabaseKind::Postgres => {
            let (pool, database) = database::open_postgres(url, max_connections).await?;
            postgres.run(&pool).await?;
            clock.register(database).await?;
            ClockPool::Postgres(pool)
        }
        crate::db::DatabaseKind::Sqlite => {
            let (pool, database) = database::open_sqlite(url, max_connections).await?;
            sqlite.run(&pool).await?;
            clock.register(database).await?;
            ClockPool::Sqlite(pool)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_advance_is_positive_and_bounded() {
        assert!(check_advance(Duration::ZERO).is_err());
        assert!(check_advance(MAX_ADVANCE + Duration::from_nanos(1)).is_err());
        assert_eq!(check_advance(Duration::from_secs(1)).unwrap(), 1_000_000);
        assert!(check_advance(MAX_ADVANCE).is_ok());
    }
}
