//! Assembling and running each role: the wiring between config, store, registry, coordinator
//! and server. `main.rs` and the tests both start servers through here.

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::config::{CoordinatorArgs, ParticipantArgs, default_participant_port};
use crate::db::{self, DatabaseKind};
use crate::http::HttpListener;
use crate::registry::RegistryError;
use crate::server::ServeError;
use crate::sinks::Sink;
use crate::store::{AnyStore, StoreError};
use crate::tls::Listener;
use crate::tls::{ClientTls, ParticipantTransport, ServerTls, TlsError};
use holdfast_coordinator::serving::{
    ServingError, Sidecar, Wired, check_participant_transport, serve_coordinator_on,
};

mod all_in_one;
pub mod data_dir;
mod sinks;

pub use all_in_one::run_all_in_one;
// The coordinator's wiring is the coordinator crate's; the test participants' the
// participants crate's. Here under the paths the roles and the tests use.
pub use holdfast_coordinator::serving::{
    CoordinatorAccess, CoordinatorSettings, serve_coordinator, serve_test_coordinator,
};
pub use holdfast_participants::testing::serve_test_participant;

/// Why a role could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("participant {kind}: {source}")]
    Participant {
        kind: &'static str,
        source: crate::participants::ParticipantError,
    },
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error("listening: {0}")]
    Listen(#[from] std::io::Error),
    #[error("TLS: {0}")]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Serving(#[from] ServingError),
}

/// Runs the coordinator role as configured by `args` until `shutdown`: creates its database
/// if needed, starts the metrics listener, migrates and serves. A start that fails before
/// writing anything takes back the SQLite data folder it made.
pub async fn run_coordinator(
    args: CoordinatorArgs,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), AppError> {
    let made = data_dir::missing_folder(&args.database_url)?;
    let served = start_coordinator(args, shutdown).await;
    if served.is_err()
        && let Some(dir) = made
    {
        data_dir::remove_if_unwritten(&dir);
    }
    served
}

/// [`run_coordinator`] but for the folder.
async fn start_coordinator(
    args: CoordinatorArgs,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), AppError> {
    if args.test_mode.test_mode {
        return Err(AppError::Config(
            "--test-mode is for the all-in-one (`holdfast --test-mode`, no subcommand), not `holdfast coordinator`".into(),
        ));
    }
    let tls = server_tls(&args.tls)?;
    let settings = CoordinatorSettings {
        participants: args.endpoints(),
        limits: args.limits().map_err(AppError::Config)?,
        policy: args.policy().map_err(AppError::Config)?,
        server: args.server_limits(),
        participant_transport: participant_transport(&args)?,
        access: coordinator_access(&args, &listen_addrs(&args))?,
    };
    let connections = connection_limits(&args.connections)?;
    check_participant_transport(&settings, tls.is_some())?;
    db::ensure_database(&args.database_url).await?;
    start_metrics(
        args.metrics_listen,
        tls.as_ref(),
        &settings.access.auth,
        connections,
    )
    .await?;
    // Every port before the store is opened (a SQLite file and its folder made): a port taken
    // fails the start before anything is written.
    let http = bind_http(&args, tls.as_ref()).await?;
    let tcp = TcpListener::bind(args.listen).await.map_err(|e| {
        AppError::Config(format!(
            "coordinator cannot listen on {}: {e} (--listen)",
            args.listen
        ))
    })?;
    let listener = Listener::new(tcp, tls).with_limits(connections);
    let sinks = sinks::configured_sinks(&args).await?;
    let store = AnyStore::connect(&args.database_url, args.db_pool_size).await?;
    serve_coordinator_beside(settings, store, listener, Beside { http, sinks }, shutdown).await
}

/// The addresses the coordinator's servers listen on (gRPC, and HTTP and metrics unless
/// `off`): the loopback rule of `--insecure-no-auth` applies to each.
pub(super) fn listen_addrs(args: &CoordinatorArgs) -> Vec<std::net::SocketAddr> {
    std::iter::once(args.listen)
        .chain(args.http.http_listen)
        .chain(args.metrics_listen)
        .collect()
}

/// Binds `--http-listen` (serving TLS with the gRPC port's certificate), unless `off`.
pub(super) async fn bind_http(
    args: &CoordinatorArgs,
    tls: Option<&ServerTls>,
) -> Result<Option<HttpListener>, AppError> {
    let Some(addr) = args.http.http_listen else {
        return Ok(None);
    };
    let allowed = args.http.allowed_callers().map_err(AppError::Config)?;
    let limits = connection_limits(&args.connections)?;
    let tcp = TcpListener::bind(addr).await.map_err(|e| {
        AppError::Config(format!(
            "HTTP cannot listen on {addr}: {e}; give --http-listen another address (or off)"
        ))
    })?;
    Ok(Some(HttpListener {
        listener: Listener::new(tcp, tls.cloned()).with_limits(limits),
        allowed,
    }))
}

/// What every listener of a role allows its connections (`--header-timeout`,
/// `--idle-timeout`, `--max-connections`), checked.
pub(super) fn connection_limits(
    args: &crate::config::connections::ConnectionArgs,
) -> Result<crate::conn::ConnectionLimits, AppError> {
    args.limits().map_err(AppError::Config)
}

/// The coordinator's authentication, participant credential and token keys, as `args` give
/// them, for servers on `listen`.
fn coordinator_access(
    args: &CoordinatorArgs,
    listen: &[std::net::SocketAddr],
) -> Result<CoordinatorAccess, AppError> {
    let sqlite_dir = match DatabaseKind::of_url(&args.database_url)? {
        DatabaseKind::Sqlite => Some(db::sqlite_dir(&args.database_url).map_err(StoreError::from)?),
        DatabaseKind::Postgres => None,
    };
    if let Some(dir) = &sqlite_dir {
        std::fs::create_dir_all(dir).map_err(|e| {
            AppError::Config(format!(
                "cannot create the data folder {}: {e}",
                dir.display()
            ))
        })?;
    }
    Ok(CoordinatorAccess {
        auth: args.auth.authenticator(listen).map_err(AppError::Config)?,
        participant_key: args.secrets.participant_key().map_err(AppError::Config)?,
        tokens: Some(
            args.secrets
                .token_keys(sqlite_dir.as_deref())
                .map_err(AppError::Config)?,
        ),
    })
}

/// The server TLS `args` configure, loaded (its files re-read when they change); `None`
/// serves plaintext.
fn server_tls(args: &crate::config::tls::ServerTlsArgs) -> Result<Option<ServerTls>, AppError> {
    match args.files().map_err(AppError::Config)? {
        Some(files) => {
            // The recorder first, so holdfast_tls_reload_failures_total is scraped from 0.
            crate::telemetry::metrics_handle();
            Ok(Some(ServerTls::load(&files)?))
        }
        None => Ok(None),
    }
}

/// How the coordinator of `args` reaches its participants: TLS is loaded when a participant is
/// `https://` or a TLS client setting is given (so a bad file fails the start either way).
fn participant_transport(args: &CoordinatorArgs) -> Result<ParticipantTransport, AppError> {
    let files = args.participant_tls.files().map_err(AppError::Config)?;
    let needed = args.participant_tls.any_given()
        || args
            .participants
            .iter()
            .any(|(_, url)| crate::tls::is_https(url));
    Ok(ParticipantTransport {
        tls: if needed {
            crate::telemetry::metrics_handle();
            Some(ClientTls::load(&files)?)
        } else {
            None
        },
        allow_plaintext: args.participant_tls.allow_plaintext_participants,
    })
}

/// Creates the coordinator's database if needed and applies its migrations (`holdfast migrate`).
pub async fn migrate(database_url: &str) -> Result<(), AppError> {
    db::ensure_database(database_url).await?;
    AnyStore::connect(database_url, 1).await?.migrate().await?;
    tracing::info!("migrations applied");
    Ok(())
}

/// Runs one reference participant as configured by `args` until `shutdown`.
pub async fn serve_participant(
    args: ParticipantArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), AppError> {
    use crate::participants::{self, Kind, ParticipantDb, ParticipantError, stock_redis};
    let listen = args.listen.unwrap_or_else(|| {
        std::net::SocketAddr::from(([127, 0, 0, 1], default_participant_port(args.kind)))
    });
    let tls = server_tls(&args.tls)?;
    // The loopback rule holds for the metrics listener too.
    let listens: Vec<_> = std::iter::once(listen)
        .chain(args.metrics.metrics_listen)
        .collect();
    let auth = args
        .auth
        .authenticator(&listens)
        .map_err(AppError::Config)?;
    let retention = args
        .retention
        .participant_keep()
        .map_err(AppError::Config)?;
    let connections = connection_limits(&args.connections)?;
    start_metrics(
        args.metrics.metrics_listen,
        tls.as_ref(),
        &auth,
        connections,
    )
    .await?;
    let pool: ParticipantDb = match DatabaseKind::of_url(&args.database_url)? {
        DatabaseKind::Postgres => db::connect_postgres(&args.database_url, args.db_pool_size)
            .await?
            .into(),
        DatabaseKind::Sqlite => db::open_sqlite(&args.database_url, args.db_pool_size)
            .await?
            .into(),
    };
    let listener = Listener::new(TcpListener::bind(listen).await?, tls).with_limits(connections);
    tracing::info!(kind = args.kind.name(), %listen, tls = listener.tls().is_some(), auth = auth.is_on(), "participant serving");
    let kind = args.kind;
    let served = if kind == Kind::StockRedis {
        match (args.redis_url.clone(), pool) {
            (None, _) => Err(ParticipantError::NeedsRedis),
            (Some(_), ParticipantDb::Sqlite(_)) => Err(ParticipantError::NeedsPostgres),
            (Some(url), ParticipantDb::Postgres(pool)) => {
                let mut settings = stock_redis::StockRedisSettings::new(url);
                settings.key_prefix = args.redis_prefix.clone();
                settings.redis_ca = args.redis_ca.clone();
                settings.orphan_grace = args.orphan_grace;
                settings.max_hold = args.max_hold;
                settings.retention = args.redis_retention;
                settings.auth = auth;
                stock_redis::serve(settings, pool, listener, shutdown).await
            }
        }
    } else {
        let settings = participants::ParticipantSettings {
            kind,
            orphan_grace: args.orphan_grace,
            auth,
            max_hold: args.max_hold,
            retention,
            clock: Default::default(),
        };
        participants::serve(settings, pool, listener, shutdown).await
    };
    served.map_err(|source| AppError::Participant {
        kind: kind.name(),
        source,
    })
}

/// Serves /metrics in the background when an address is configured, over TLS with `tls`,
/// its connections under `limits`.
pub(crate) async fn start_metrics(
    addr: Option<std::net::SocketAddr>,
    tls: Option<&ServerTls>,
    auth: &crate::auth::Authenticator,
    limits: crate::conn::ConnectionLimits,
) -> Result<(), AppError> {
    if let Some(addr) = addr {
        // Install the recorder before anything is counted.
        crate::telemetry::metrics_handle();
        let listener = TcpListener::bind(addr).await.map_err(|e| {
            AppError::Config(format!(
                "metrics cannot listen on {addr}: {e} (--metrics-listen)"
            ))
        })?;
        tracing::info!(%addr, tls = tls.is_some(), "metrics on /metrics");
        tokio::spawn(crate::telemetry::serve_metrics(
            Listener::new(listener, tls.cloned()).with_limits(limits),
            auth.clone(),
            std::future::pending(),
        ));
    }
    Ok(())
}

/// [`serve_coordinator`], plus the HTTP listener (console, JSON API, `/metrics`, probes) on
/// `http` when given: its JSON API calls these same gRPC services in-process, behind the same
/// auth layer.
pub async fn serve_coordinator_with_http(
    settings: CoordinatorSettings,
    store: impl Into<AnyStore>,
    listener: impl Into<Listener>,
    http: Option<HttpListener>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), AppError> {
    let beside = Beside {
        http,
        sinks: Vec::new(),
    };
    serve_coordinator_beside(settings, store, listener, beside, shutdown).await
}

/// What the binary runs beside the coordinator's gRPC port: the HTTP listener and the event
/// sinks' delivery loops (SPEC 10).
#[derive(Default)]
pub struct Beside {
    pub http: Option<HttpListener>,
    pub sinks: Vec<Arc<dyn Sink>>,
}

/// [`serve_coordinator`], plus what `beside` gives: the HTTP listener and one delivery loop
/// per event sink, stopped at shutdown.
pub async fn serve_coordinator_beside(
    settings: CoordinatorSettings,
    store: impl Into<AnyStore>,
    listener: impl Into<Listener>,
    beside: Beside,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), AppError> {
    serve_coordinator_on(
        settings,
        store.into(),
        listener.into(),
        sidecar(beside),
        None,
        shutdown,
    )
    .await?;
    Ok(())
}

/// What runs beside the coordinator as its [`Sidecar`], when there is anything.
pub(super) fn sidecar(beside: Beside) -> Option<Sidecar> {
    let Beside { http, sinks } = beside;
    if http.is_none() && sinks.is_empty() {
        return None;
    }
    Some(Box::new(move |wired| {
        let delivering =
            crate::sinks::start(wired.coordinator.clone(), sinks, wired.stopping.clone());
        let delivering = AbortOnDrop(delivering);
        let http = match http {
            Some(http) => Some(AbortOnDrop(start_http(http, wired)?)),
            None => None,
        };
        Ok(tokio::spawn(async move {
            if let Some(mut http) = http {
                let _ = (&mut http.0).await;
            }
            let mut delivering = delivering;
            let _ = (&mut delivering.0).await;
        }))
    }))
}

/// A task aborted when its handle is dropped (the sidecar's parts, when it is cut at
/// shutdown).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts the HTTP listener in the background, its JSON API over `routes` in-process (the
/// same auth layer and limits as the gRPC port), until `stopping` turns true.
fn start_http(
    listener: HttpListener,
    wired: Wired,
) -> Result<tokio::task::JoinHandle<()>, ServingError> {
    let Wired {
        routes,
        coordinator,
        registry,
        limits,
        auth,
        stopping,
    } = wired;
    let addr = listener.listener.local_addr()?;
    tracing::info!(%addr, tls = listener.listener.tls().is_some(), "console and JSON API on HTTP");
    // Install the metrics recorder: /metrics is served here too.
    crate::telemetry::metrics_handle();
    let ready_stopping = stopping.clone();
    let service = crate::http::HttpService {
        grpc: crate::server::in_process(limits, &auth, routes),
        auth,
        ready: std::sync::Arc::new(move || {
            let coordinator = coordinator.clone();
            let stopping = *ready_stopping.borrow();
            Box::pin(async move {
                if stopping {
                    return Err("shutting down".to_owned());
                }
                // One indexed read and one small write: the database answers, and takes
                // writes (a full disk or a read-only database makes the replica unready).
                let everyone = crate::domain::Actor {
                    principal: String::new(),
                    sees_all: true,
                };
                let query = crate::domain::ListQuery {
                    limit: 1,
                    ..Default::default()
                };
                coordinator
                    .list(&everyone, query)
                    .await
                    .map_err(|e| format!("database: {e}"))?;
                coordinator
                    .probe_write()
                    .await
                    .map_err(|e| format!("database refuses writes: {e}"))
            })
        }),
        participants: std::sync::Arc::new(move || {
            let registry = registry.clone();
            Box::pin(async move {
                let health = registry.health().await.into_iter();
                health
                    .map(|p| crate::http::ParticipantStatus {
                        name: p.name,
                        url: p.url,
                        serving: p.serving,
                        latency: p.latency,
                        last_error: p.last_error,
                    })
                    .collect()
            })
        }),
    };
    let mut stop = stopping;
    Ok(tokio::spawn(async move {
        let stopped = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        if let Err(e) = crate::http::serve(listener, service, stopped).await {
            tracing::error!(error = %e, "the HTTP listener stopped");
        }
    }))
}
