//! Test mode for the reference participants (`holdfast --test-mode`, the testkit): their
//! database opened with the coordinator crate's movable [`TestClock`], and a participant
//! served so that its `--max-hold` and orphan reclaim follow that clock.

use std::future::Future;

use holdfast_coordinator::testing::{self, ClockPool, TestClock, TestingError};

use crate::tls::Listener;
use crate::{MIGRATOR, ParticipantDb, ParticipantError, ParticipantSettings, SQLITE_MIGRATOR};

/// Opens a reference participants' database on `url` (SQLite or PostgreSQL, created if
/// missing) with `clock`'s movable clock, the participants' schema applied, and registered
/// with `clock`. Serve participants on it with [`serve_test_participant`]. One pool may serve
/// several kinds (each scopes its rows by name), as in the all-in-one.
pub async fn open_participant_db(
    url: &str,
    max_connections: u32,
    clock: &TestClock,
) -> Result<ParticipantDb, TestingError> {
    let pool = testing::open_migrated(url, max_connections, clock, &MIGRATOR, &SQLITE_MIGRATOR);
    Ok(match pool.await? {
        ClockPool::Postgres(pool) => pool.into(),
        ClockPool::Sqlite(pool) => pool.into(),
    })
}

/// Serves one reference participant (`settings.kind`: seats, stock, rooms, payments, noop)
/// on `listener` until `shutdown`, on `db` from [`open_participant_db`] with the same
/// `clock`: its `--max-hold` reads `clock`, and its orphan reclaim runs on each `clock` move
/// (`AdvanceClock`) while it serves. `settings.clock` is replaced by `clock`'s.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use holdfast_participants::{Kind, ParticipantSettings};
/// use holdfast_participants::testing::{open_participant_db, serve_test_participant};
/// let clock = holdfast_coordinator::testing::TestClock::new();
/// let db = open_participant_db("sqlite:///tmp/t/participants.db", 4, &clock).await?;
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// let settings = ParticipantSettings::new(Kind::Seats);
/// serve_test_participant(settings, db, listener, &clock, std::future::pending()).await?;
/// # Ok(()) }
/// ```
pub async fn serve_test_participant(
    settings: ParticipantSettings,
    db: ParticipantDb,
    listener: impl Into<Listener>,
    clock: &TestClock,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ParticipantError> {
    let settings = ParticipantSettings {
        clock: clock.participants().clone(),
        ..settings
    };
    crate::serve(settings, db, listener.into(), shutdown).await
}
