//! Serving in test mode (`holdfast --test-mode`, the testkit): the coordinator with
//! `tcc.v1.Testing` over a [`TestClock`], and reference participants whose `--max-hold` and
//! orphan reclaim follow it. Their databases are opened with the clock by
//! [`crate::testing::open_store`] and [`crate::testing::open_participant_db`].

use std::future::Future;

use super::{AppError, CoordinatorSettings, serve_coordinator_on};
use crate::participants::{self, ParticipantDb, ParticipantSettings};
use crate::store::AnyStore;
use crate::testing::TestClock;
use crate::tls::Listener;

/// Serves the coordinator on `listener` (a `TcpListener` bound to port 0, or a TLS
/// [`Listener`]) with `settings` (its participant endpoints, limits, policy, auth) until
/// `shutdown`, plus `tcc.v1.Testing` moving `clock`. `store` comes from
/// [`crate::testing::open_store`] with the same `clock`. Restartable: after `shutdown` (or a
/// killed runtime), reopen the store on the same database with the same `clock` and call this
/// again; recovery takes over the unfinished work once its leases end.
///
/// ```no_run
/// # async fn demo(settings: holdfast::app::CoordinatorSettings) -> Result<(), Box<dyn std::error::Error>> {
/// let clock = holdfast::testing::TestClock::new();
/// let store = holdfast::testing::open_store("sqlite:///tmp/t/holdfast.db", 4, &clock).await?;
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// holdfast::app::serve_test_coordinator(settings, store, listener, clock, std::future::pending()).await?;
/// # Ok(()) }
/// ```
pub async fn serve_test_coordinator(
    settings: CoordinatorSettings,
    store: AnyStore,
    listener: impl Into<Listener>,
    clock: TestClock,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), AppError> {
    serve_coordinator_on(
        settings,
        store,
        listener.into(),
        None,
        Some(clock),
        shutdown,
    )
    .await
}

/// Serves one reference participant (`settings.kind`: seats, stock, rooms, payments, noop)
/// on `listener` until `shutdown`, on `db` from [`crate::testing::open_participant_db`] with
/// the same `clock`: its `--max-hold` reads `clock`, and its orphan reclaim runs on each
/// `clock` move (`AdvanceClock`) while it serves. `settings.clock` is replaced by `clock`'s.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use holdfast::participants::{Kind, ParticipantSettings};
/// let clock = holdfast::testing::TestClock::new();
/// let db = holdfast::testing::open_participant_db("sqlite:///tmp/t/participants.db", 4, &clock).await?;
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// let settings = ParticipantSettings::new(Kind::Seats);
/// holdfast::app::serve_test_participant(settings, db, listener, &clock, std::future::pending()).await?;
/// # Ok(()) }
/// ```
pub async fn serve_test_participant(
    settings: ParticipantSettings,
    db: ParticipantDb,
    listener: impl Into<Listener>,
    clock: &TestClock,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), AppError> {
    let kind = settings.kind;
    let settings = ParticipantSettings {
        clock: clock.participants().clone(),
        ..settings
    };
    participants::serve(settings, db, listener.into(), shutdown)
        .await
        .map_err(|source| AppError::Participant {
            kind: kind.name(),
            source,
        })
}
