//! Serving the coordinator: its store migrated, the registry, the [`Coordinator`] with its
//! recovery and retention loops, and the gRPC services (`tcc.v1.Coordinator`, `tcc.v1.Admin`,
//! `tcc.v1.Events`, and `tcc.v1.Testing` in test mode) on one port until shutdown. The binary's roles
//! (`holdfast coordinator`, the all-in-one) and the testkit start a coordinator through here;
//! what a layer above serves beside it (the binary's HTTP listener) comes in as a [`Sidecar`].

use std::future::Future;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::CoordinatorApi;
use crate::auth::Authenticator;
use crate::background;
use crate::coordinator::{Coordinator, Policy};
use crate::domain::validate::Limits;
use crate::registry::{ParticipantEndpoint, Registry, RegistryError};
use crate::server::{ServeError, ServerLimits};
use crate::store::{AnyStore, StoreError};
use crate::telemetry::ops::tasks;
use crate::testing::TestClock;
use crate::tls::{Listener, ParticipantTransport};

/// Why the coordinator could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServingError {
    #[error("configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error("listening: {0}")]
    Listen(#[from] std::io::Error),
}

/// Who may call the coordinator, what it presents to participants, and how it derives hold
/// tokens.
#[derive(Clone, Debug, Default)]
pub struct CoordinatorAccess {
    pub auth: Authenticator,
    /// The API key presented to participants (`--participant-api-key-file`).
    pub participant_key: Option<String>,
    /// `None`: a key of this process only.
    pub tokens: Option<crate::domain::TokenKeys>,
}

/// Everything the coordinator role needs, already parsed.
#[derive(Clone, Debug)]
pub struct CoordinatorSettings {
    pub participants: Vec<ParticipantEndpoint>,
    pub limits: Limits,
    pub policy: Policy,
    pub server: ServerLimits,
    /// TLS towards `https://` participants, and whether a TLS coordinator may call `http://`.
    pub participant_transport: ParticipantTransport,
    pub access: CoordinatorAccess,
}

/// The wired coordinator, handed to a [`Sidecar`]: the gRPC routes (to call in-process, behind
/// `limits` and `auth` as the port does), the coordinator, its registry, and `stopping`, which
/// turns true when shutdown begins.
pub struct Wired {
    pub routes: tonic::service::Routes,
    pub coordinator: Coordinator,
    pub registry: Registry,
    pub limits: ServerLimits,
    pub auth: Authenticator,
    pub stopping: watch::Receiver<bool>,
}

/// What a layer above serves beside the gRPC port (the binary's HTTP listener): started once
/// the coordinator is wired, awaited (at most 10 s) after the port has stopped.
pub type Sidecar = Box<dyn FnOnce(Wired) -> Result<JoinHandle<()>, ServingError> + Send>;

/// Reservations per retention batch on SQLite (PostgreSQL takes `retention::MAX_BATCH`).
const SQLITE_RETENTION_BATCH: u32 = 200;

/// A coordinator serving TLS refuses `http://` participants unless allowed.
pub fn check_participant_transport(
    settings: &CoordinatorSettings,
    serving_tls: bool,
) -> Result<(), ServingError> {
    settings
        .participant_transport
        .check(
            serving_tls,
            settings
                .participants
                .iter()
                .map(|p| (p.name.as_str(), p.url.as_str())),
        )
        .map_err(ServingError::Config)
}

/// Migrates the store (either backend: a `PgStore`, a `SqliteStore` or an [`AnyStore`]), then
/// serves the coordinator on `listener` (a `TcpListener`, or a [`Listener`] with TLS) until
/// `shutdown`; no HTTP listener (what tests that start many coordinators want).
pub async fn serve_coordinator(
    settings: CoordinatorSettings,
    store: impl Into<AnyStore>,
    listener: impl Into<Listener>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServingError> {
    serve_coordinator_on(
        settings,
        store.into(),
        listener.into(),
        None,
        None,
        shutdown,
    )
    .await
}

/// Serves the coordinator on `listener` (a `TcpListener` bound to port 0, or a TLS
/// [`Listener`]) with `settings` (its participant endpoints, limits, policy, auth) until
/// `shutdown`, plus `tcc.v1.Testing` moving `clock`. `store` comes from
/// [`crate::testing::open_store`] with the same `clock`. Restartable: after `shutdown` (or a
/// killed runtime), reopen the store on the same database with the same `clock` and call this
/// again; recovery takes over the unfinished work once its leases end.
///
/// ```no_run
/// # async fn demo(settings: holdfast_coordinator::serving::CoordinatorSettings) -> Result<(), Box<dyn std::error::Error>> {
/// let clock = holdfast_coordinator::testing::TestClock::new();
/// let store = holdfast_coordinator::testing::open_store("sqlite:///tmp/t/holdfast.db", 4, &clock).await?;
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// holdfast_coordinator::serving::serve_test_coordinator(settings, store, listener, clock, std::future::pending()).await?;
/// # Ok(()) }
/// ```
pub async fn serve_test_coordinator(
    settings: CoordinatorSettings,
    store: AnyStore,
    listener: impl Into<Listener>,
    clock: TestClock,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServingError> {
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

/// [`serve_coordinator`], plus `sidecar` beside the port when given, and `tcc.v1.Testing`
/// over `test_clock` when given (test mode: served and listed by reflection only then).
pub async fn serve_coordinator_on(
    settings: CoordinatorSettings,
    store: AnyStore,
    listener: Listener,
    sidecar: Option<Sidecar>,
    test_clock: Option<TestClock>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServingError> {
    check_participant_transport(&settings, listener.tls().is_some())?;
    let (coordinator, registry) = start_coordinator(&settings, store).await?;
    let (stop_recovery, stop) = watch::channel(false);
    // Each loop started again should it panic (`background.rs`); the offers' loop runs each
    // pass in a task of its own instead (`coordinator/waitlist.rs`).
    let retention = spawn_kept(
        tasks::RETENTION,
        &coordinator,
        &stop,
        Coordinator::run_retention,
    );
    let events = spawn_kept(tasks::EVENTS, &coordinator, &stop, Coordinator::run_events);
    let recovery = spawn_kept(
        tasks::RECOVERY,
        &coordinator,
        &stop,
        Coordinator::run_recovery,
    );
    let offers = tokio::spawn(coordinator.clone().run_offers(stop));
    // At shutdown, open Watch streams end at once (UNAVAILABLE): the graceful shutdown waits
    // for calls in flight, and a stream could otherwise run until its hold's max_ttl.
    let watches = coordinator.clone();
    let (stopping, stopping_rx) = watch::channel(false);
    let shutdown = async move {
        shutdown.await;
        watches.close_watches();
        let _ = stopping.send(true);
    };
    let (routes, services) = routes(&coordinator, test_clock);
    let sidecar = match sidecar {
        Some(start) => Some(start(Wired {
            routes: routes.clone(),
            coordinator,
            registry,
            limits: settings.server,
            auth: settings.access.auth.clone(),
            stopping: stopping_rx,
        })?),
        None => None,
    };
    tracing::info!(addr = %listener.local_addr()?, tls = listener.tls().is_some(), auth = settings.access.auth.is_on(), "coordinator serving");
    let served = crate::server::serve_with(
        settings.server,
        &settings.access.auth,
        listener,
        routes,
        &services,
        shutdown,
    )
    .await;
    // In-flight calls are done; work left unfinished stays leased until its lease ends, then
    // any instance recovers it.
    let _ = stop_recovery.send(true);
    let _ = recovery.await;
    let _ = retention.await;
    let _ = events.await;
    let _ = offers.await;
    if let Some(mut sidecar) = sidecar {
        // Its streams ended with the coordinator's; a client that keeps a request open longer
        // is cut.
        if tokio::time::timeout(std::time::Duration::from_secs(10), &mut sidecar)
            .await
            .is_err()
        {
            sidecar.abort();
        }
    }
    served?;
    Ok(())
}

/// Spawns `coordinator`'s loop `run` until `stop`, started again should it panic.
fn spawn_kept<L>(
    task: &'static str,
    coordinator: &Coordinator,
    stop: &watch::Receiver<bool>,
    run: fn(Coordinator, watch::Receiver<bool>) -> L,
) -> JoinHandle<()>
where
    L: Future<Output = ()> + Send + 'static,
{
    let (coordinator, stop) = (coordinator.clone(), stop.clone());
    tokio::spawn(background::keep_running(task, stop.clone(), move || {
        run(coordinator.clone(), stop.clone())
    }))
}

/// The coordinator's gRPC services and their names (for reflection): `tcc.v1.Coordinator`,
/// `tcc.v1.Admin`, `tcc.v1.Events`, and `tcc.v1.Testing` over `test_clock` when given.
fn routes(
    coordinator: &Coordinator,
    test_clock: Option<TestClock>,
) -> (tonic::service::Routes, Vec<&'static str>) {
    let admin = crate::api::admin::AdminApi::new(coordinator.clone());
    let api = CoordinatorApi::new(coordinator.clone());
    let events = crate::api::events::EventsApi::new(coordinator.clone());
    let mut routes = tonic::service::Routes::new(api.into_server())
        .add_service(admin.into_server())
        .add_service(events.into_server());
    let mut services = vec!["tcc.v1.Coordinator", "tcc.v1.Admin", "tcc.v1.Events"];
    if let Some(clock) = test_clock {
        let testing = crate::api::testing::TestingApi::new(coordinator.clone(), clock);
        routes = routes.add_service(testing.into_server());
        services.push("tcc.v1.Testing");
    }
    (routes, services)
}

/// The coordinator `settings` describe, on `store` (migrated first), and its registry.
async fn start_coordinator(
    settings: &CoordinatorSettings,
    store: AnyStore,
) -> Result<(Coordinator, Registry), ServingError> {
    store.migrate().await?;
    let mut policy = settings.policy.clone();
    if let AnyStore::Sqlite(_) = store {
        // One writer: a purge batch holds the write lock Reserves wait for, so it stays small.
        policy.retention.batch = policy.retention.batch.min(SQLITE_RETENTION_BATCH);
    }
    crate::telemetry::ops::coordinator_started();
    let registry = Registry::new(
        &settings.participants,
        settings.participant_transport.tls.as_ref(),
        settings.access.participant_key.as_deref(),
    )?;
    let tokens = match settings.access.tokens.clone() {
        Some(tokens) => tokens,
        None => crate::domain::TokenKeys::ephemeral()
            .map_err(|e| ServingError::Config(format!("hold token keys: {e}")))?,
    };
    let coordinator = Coordinator::new(
        store.into_dyn(),
        registry.clone(),
        settings.limits.clone(),
        policy,
        tokens,
    );
    coordinator.start_events().await?;
    // Work waiting on a participant removed from the configuration: said at start.
    if let Err(e) = coordinator.report_unregistered_backlog().await {
        tracing::warn!(error = %e, "counting work waiting on unregistered participants failed");
    }
    Ok((coordinator, registry))
}
