//! The all-in-one: the coordinator and every reference participant in one process, on the
//! embedded SQLite default (the data folder: [`super::data_dir`]) or on PostgreSQL,
//! registered with each other over real gRPC on loopback.

use std::future::Future;

use tokio::net::TcpListener;

use super::data_dir::{self, lock_data_dir};
use super::{
    AppError, CoordinatorSettings, bind_http, connection_limits, coordinator_access, listen_addrs,
    serve_coordinator_on, server_tls, sidecar, start_metrics,
};
use crate::config::CoordinatorArgs;
use crate::db::{self, DatabaseKind};
use crate::participants::{Kind, ParticipantDb};
use crate::registry::ParticipantEndpoint;
use crate::store::{AnyStore, PgStore, SqliteStore, StoreError};
use crate::testing::TestClock;
use crate::tls::{ClientTls, Listener, ParticipantTransport, ServerTls};

/// Runs the all-in-one as configured by `args` until `shutdown`, holding the data folder's
/// one-writer lock (SQLite) for as long as it runs.
pub async fn run_all_in_one(
    args: CoordinatorArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), AppError> {
    let url = args.database_url.clone();
    // Before the data folder is touched (checked again where serving starts).
    args.test_mode
        .check(args.listen, args.http.http_listen)
        .map_err(AppError::Config)?;
    check_given(&args)?;
    // A start that fails before writing anything takes back the folder it made.
    let made = data_dir::missing_folder(&url)?;
    // One writer per data folder, taken before anything binds a port.
    let lock = lock_data_dir(&url)?;
    let served = serve_all_in_one(&url, args, shutdown).await;
    if served.is_err()
        && let Some(dir) = made
    {
        drop(lock);
        data_dir::remove_if_unwritten(&dir);
    }
    served
}

/// Every reference participant kind, in port order.
pub(crate) const ALL_IN_ONE_KINDS: [Kind; 5] = [
    Kind::Seats,
    Kind::Stock,
    Kind::Rooms,
    Kind::Payments,
    Kind::Noop,
];

/// Binds `kind`'s all-in-one port on the coordinator's IP, serving TLS with `tls`, and
/// registers its endpoint (`https://` with TLS).
async fn bind_participant(
    kind: Kind,
    coordinator: &crate::config::CoordinatorArgs,
    tls: Option<&ServerTls>,
    registry: &mut Vec<ParticipantEndpoint>,
) -> Result<Listener, AppError> {
    let addr = std::net::SocketAddr::from((
        coordinator.listen.ip(),
        crate::config::default_participant_port(kind),
    ));
    let listener = TcpListener::bind(addr).await.map_err(|e| {
        AppError::Config(format!(
            "participant {} cannot listen on {addr}: {e}",
            kind.name()
        ))
    })?;
    registry.push(ParticipantEndpoint {
        name: kind.name().to_owned(),
        url: format!("{}://{addr}", if tls.is_some() { "https" } else { "http" }),
        timeout: coordinator.participant_timeout,
    });
    let limits = connection_limits(&coordinator.connections)?;
    Ok(Listener::new(listener, tls.cloned()).with_limits(limits))
}

/// Checks the participants the operator gave (`--participant NAME=URL`,
/// `HOLDFAST_PARTICIPANTS`, the TOML file): a name of a built-in one is refused, whether or
/// not it runs here, and so is a name given twice.
fn check_given(coordinator: &CoordinatorArgs) -> Result<(), AppError> {
    use clap::ValueEnum;
    let given = coordinator.endpoints();
    for (i, p) in given.iter().enumerate() {
        let built_in = Kind::value_variants()
            .iter()
            .any(|kind| kind.name() == p.name);
        if built_in {
            return Err(AppError::Config(format!(
                "--participant {}={}: the all-in-one runs a participant named {:?} itself; give yours another name",
                p.name, p.url, p.name
            )));
        }
        if given[..i].iter().any(|earlier| earlier.name == p.name) {
            return Err(AppError::Config(format!(
                "--participant {}: given twice",
                p.name
            )));
        }
    }
    Ok(())
}

/// Registers the participants the operator gave beside the built-in ones (SPEC 13), in
/// `registry`, once [`check_given`] passed them.
fn register_given(
    coordinator: &CoordinatorArgs,
    registry: &mut Vec<ParticipantEndpoint>,
) -> Result<(), AppError> {
    check_given(coordinator)?;
    registry.extend(coordinator.endpoints());
    Ok(())
}

/// Who may call the all-in-one (every port listens on the coordinator's IP); with
/// authentication on, its participants need the key of a principal with the coordinator role.
fn all_in_one_access(
    coordinator: &crate::config::CoordinatorArgs,
) -> Result<super::CoordinatorAccess, AppError> {
    let access = coordinator_access(coordinator, &listen_addrs(coordinator))?;
    if access.auth.is_on() && access.participant_key.is_none() {
        return Err(AppError::Config(
            "with --auth-keys the all-in-one's participants require the coordinator role: give --participant-api-key-file with the key of a principal that has it".into(),
        ));
    }
    Ok(access)
}

/// Runs the coordinator and every reference participant in one process, all registered with
/// the coordinator over real gRPC on loopback, and the metrics listener, until `shutdown`.
/// With `--tls-cert`, every port serves TLS.
///
/// On a `sqlite:` URL (the default, [`crate::config::DEFAULT_DATABASE_URL`]) the coordinator uses that file
/// and each participant a file of its own under `participants/` beside it (a shared
/// `participants.db` from an earlier holdfast is split first:
/// [`data_dir::split_shared_participants_file`]); the caller should hold [`lock_data_dir`]
/// for the process's lifetime. On a `postgres://` URL everything shares that
/// database (each schema in its own migrations table); `stock-redis` runs only there, and only
/// with a Redis URL.
pub(crate) async fn serve_all_in_one(
    database_url: &str,
    coordinator: crate::config::CoordinatorArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), AppError> {
    // Test mode on loopback only: refused before anything is opened or bound.
    coordinator
        .test_mode
        .check(coordinator.listen, coordinator.http.http_listen)
        .map_err(AppError::Config)?;
    let test_clock = coordinator.test_mode.test_mode.then(TestClock::new);
    let tls = server_tls(&coordinator.tls)?;
    let participant_transport = all_in_one_transport(&coordinator, tls.as_ref())?;
    let access = all_in_one_access(&coordinator)?;
    let connections = connection_limits(&coordinator.connections)?;
    let auth = &access.auth;
    start_metrics(coordinator.metrics_listen, tls.as_ref(), auth, connections).await?;
    // The coordinator's ports before any database is opened: a port taken fails the start
    // before anything is written.
    let listener = TcpListener::bind(coordinator.listen).await.map_err(|e| {
        AppError::Config(format!(
            "coordinator cannot listen on {}: {e} (--listen)",
            coordinator.listen
        ))
    })?;
    let http = bind_http(&coordinator, tls.as_ref()).await?;
    let (store, pdbs, described) =
        open_databases(database_url, &coordinator, test_clock.as_ref()).await?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);

    let mut participants = Vec::new();
    let mut tasks = tokio::task::JoinSet::new();
    let started = StartParticipants {
        coordinator: &coordinator,
        tls: tls.as_ref(),
        auth: &access.auth,
        test_clock: test_clock.as_ref(),
        stop_rx: stop_rx.clone(),
    };
    started
        .reference(pdbs, &mut participants, &mut tasks)
        .await?;
    let coordinator_stop = started.stopped();
    register_given(&coordinator, &mut participants)?;
    let settings = CoordinatorSettings {
        participants,
        limits: coordinator.limits().map_err(AppError::Config)?,
        policy: coordinator.policy().map_err(AppError::Config)?,
        server: coordinator.server_limits(),
        participant_transport,
        access,
    };
    let sinks = super::sinks::configured_sinks(&coordinator).await?;
    print_banner(
        &settings,
        coordinator.listen,
        [coordinator.metrics_listen, coordinator.http.http_listen],
        (tls.is_some(), test_clock.is_some()),
        &described,
        &token_secret_where(&coordinator, database_url),
    );
    let listener = Listener::new(listener, tls).with_limits(connections);
    let coordinator_task = serve_coordinator_on(
        settings,
        store,
        listener,
        sidecar(super::Beside { http, sinks }),
        test_clock,
        coordinator_stop,
    );
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let result = coordinator_task.await;
    join_participants(tasks).await;
    Ok(result?)
}

/// Waits for the participants to stop, each one's failure logged.
async fn join_participants(mut tasks: ParticipantTasks) {
    while let Some(joined) = tasks.join_next().await {
        if let Ok(Err(e)) = joined {
            tracing::error!("{e}");
        }
    }
}

/// The coordinator's store, each participant's database, and how the banner names them.
async fn open_databases(
    database_url: &str,
    coordinator: &CoordinatorArgs,
    test_clock: Option<&TestClock>,
) -> Result<(AnyStore, ParticipantDbs, String), AppError> {
    let backend = DatabaseKind::of_url(database_url)?;
    Ok(match (backend, test_clock) {
        (_, Some(clock)) => open_on_test_clock(database_url, coordinator, clock).await?,
        (DatabaseKind::Postgres, None) => {
            let pool = db::connect_postgres(database_url, coordinator.db_pool_size)
                .await
                .map_err(StoreError::from)?;
            let db = database_url.split('@').next_back().unwrap_or(database_url);
            (
                PgStore::from_pool(pool.clone()).into(),
                shared(pool.into()),
                db.to_owned(),
            )
        }
        (DatabaseKind::Sqlite, None) => {
            let store = SqliteStore::connect(database_url, coordinator.db_pool_size).await?;
            // Each migrated by its participant as it starts: the only one on its file.
            let files = participant_files(database_url, async |url| {
                let pool = db::open_sqlite(&url, coordinator.db_pool_size).await;
                Ok(pool.map_err(StoreError::from)?.into())
            })
            .await?;
            (store.into(), files, described_sqlite(database_url, ""))
        }
    })
}

/// What every all-in-one participant is started with.
struct StartParticipants<'a> {
    coordinator: &'a CoordinatorArgs,
    tls: Option<&'a ServerTls>,
    auth: &'a crate::auth::Authenticator,
    test_clock: Option<&'a TestClock>,
    stop_rx: tokio::sync::watch::Receiver<bool>,
}

/// A participant's task: its error names its kind.
type ParticipantTasks = tokio::task::JoinSet<Result<(), AppError>>;

impl StartParticipants<'_> {
    fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    }

    /// Binds and serves each reference participant on its database, then `stock-redis` where
    /// it can run, each registered in `registry`.
    async fn reference(
        &self,
        pdbs: ParticipantDbs,
        registry: &mut Vec<ParticipantEndpoint>,
        tasks: &mut ParticipantTasks,
    ) -> Result<(), AppError> {
        use crate::participants::{self, ParticipantSettings};
        let retention = self
            .coordinator
            .retention
            .participant_keep()
            .map_err(AppError::Config)?;
        // stock-redis keeps its durable record in PostgreSQL: only there.
        let postgres = pdbs.iter().find_map(|(_, db)| match db {
            ParticipantDb::Postgres(pool) => Some(pool.clone()),
            ParticipantDb::Sqlite(_) => None,
        });
        for (kind, pool) in pdbs {
            let listener = bind_participant(kind, self.coordinator, self.tls, registry).await?;
            let stop = self.stopped();
            let settings = ParticipantSettings {
                auth: self.auth.clone(),
                retention,
                clock: self
                    .test_clock
                    .map(|c| c.participants().clone())
                    .unwrap_or_default(),
                ..ParticipantSettings::new(kind)
            };
            tasks.spawn(async move {
                participants::serve(settings, pool, listener, stop)
                    .await
                    .map_err(|source| AppError::Participant {
                        kind: kind.name(),
                        source,
                    })
            });
        }
        match (postgres, self.coordinator.redis_url.clone()) {
            (Some(pool), Some(url)) => self.stock_redis(pool, url, registry, tasks).await,
            (None, Some(_)) => {
                tracing::warn!("stock-redis is not started: it needs a postgres:// database");
                Ok(())
            }
            _ => Ok(()),
        }
    }

    async fn stock_redis(
        &self,
        pool: sqlx::PgPool,
        redis_url: String,
        registry: &mut Vec<ParticipantEndpoint>,
        tasks: &mut ParticipantTasks,
    ) -> Result<(), AppError> {
        use crate::participants::stock_redis;
        let kind = Kind::StockRedis;
        let listener = bind_participant(kind, self.coordinator, self.tls, registry).await?;
        let stop = self.stopped();
        let mut redis_settings = stock_redis::StockRedisSettings::new(redis_url);
        redis_settings.retention = self.coordinator.redis_retention;
        redis_settings.key_prefix = self.coordinator.redis_prefix.clone();
        redis_settings.redis_ca = self.coordinator.redis_ca.clone();
        redis_settings.auth = self.auth.clone();
        if let Some(clock) = self.test_clock {
            redis_settings.clock = clock.participants().clone();
        }
        tasks.spawn(async move {
            stock_redis::serve(redis_settings, pool, listener, stop)
                .await
                .map_err(|source| AppError::Participant {
                    kind: kind.name(),
                    source,
                })
        });
        Ok(())
    }
}

/// Each all-in-one participant with its database.
type ParticipantDbs = Vec<(Kind, ParticipantDb)>;

/// Every participant on the one database (PostgreSQL).
fn shared(db: ParticipantDb) -> ParticipantDbs {
    ALL_IN_ONE_KINDS.map(|kind| (kind, db.clone())).to_vec()
}

/// A SQLite file per participant in `database_url`'s folder, each opened by `open` (given its
/// URL), after an earlier folder's shared file is split.
async fn participant_files(
    database_url: &str,
    open: impl AsyncFn(String) -> Result<ParticipantDb, AppError>,
) -> Result<ParticipantDbs, AppError> {
    split_before_serving(database_url).await?;
    let mut files = Vec::new();
    for kind in ALL_IN_ONE_KINDS {
        files.push((
            kind,
            open(data_dir::participant_url(database_url, kind)?).await?,
        ));
    }
    Ok(files)
}

/// Splits an earlier holdfast's shared `participants.db`, saying so.
async fn split_before_serving(database_url: &str) -> Result<(), AppError> {
    if data_dir::split_shared_participants_file(database_url, &ALL_IN_ONE_KINDS).await? {
        tracing::info!(
            "carried {} over to a file per participant under {}/ (the shared file is kept as {})",
            data_dir::SHARED_PARTICIPANTS_FILE,
            data_dir::PARTICIPANTS_DIR,
            data_dir::SPLIT_FROM
        );
    }
    Ok(())
}

/// How the banner names a SQLite layout.
fn described_sqlite(database_url: &str, suffix: &str) -> String {
    let coordinator = database_url.trim_start_matches("sqlite://");
    let dir = db::sqlite_dir(database_url)
        .unwrap_or_default()
        .join(data_dir::PARTICIPANTS_DIR);
    format!(
        "SQLite: coordinator {coordinator}, participants {}/<name>.db{suffix}",
        dir.display()
    )
}

/// Test mode: the coordinator's store and the participants' database (laid out as without
/// it) opened on `clock`'s movable clock and registered with it.
async fn open_on_test_clock(
    database_url: &str,
    coordinator: &CoordinatorArgs,
    clock: &TestClock,
) -> Result<(AnyStore, ParticipantDbs, String), AppError> {
    let test = |e: crate::testing::TestingError| AppError::Config(format!("test mode: {e}"));
    let pool_size = coordinator.db_pool_size;
    let store = crate::testing::open_store(database_url, pool_size, clock)
        .await
        .map_err(test)?;
    Ok(match DatabaseKind::of_url(database_url)? {
        DatabaseKind::Postgres => {
            let pdb = crate::testing::open_participant_db(database_url, pool_size, clock)
                .await
                .map_err(test)?;
            let db = database_url.split('@').next_back().unwrap_or(database_url);
            (store, shared(pdb), format!("{db}, test clock"))
        }
        DatabaseKind::Sqlite => {
            let files = participant_files(database_url, async |url| {
                let db = crate::testing::open_participant_db(&url, pool_size, clock).await;
                db.map_err(test)
            })
            .await?;
            (store, files, described_sqlite(database_url, ", test clock"))
        }
    })
}

/// The all-in-one's calls to its own participants: with TLS, they present this process's
/// certificate, which is what the coordinator trusts on those hops (no CA needed); with
/// `--tls-client-ca` it presents `--participant-client-cert`.
fn all_in_one_transport(
    args: &CoordinatorArgs,
    tls: Option<&ServerTls>,
) -> Result<ParticipantTransport, AppError> {
    let Some(tls) = tls else {
        return Ok(ParticipantTransport::default());
    };
    let files = args.participant_tls.files().map_err(AppError::Config)?;
    if tls.requires_client_certificate() && files.cert.is_none() {
        return Err(AppError::Config(
            "--tls-client-ca makes the all-in-one's participants require a client certificate: give --participant-client-cert and --participant-client-key for the coordinator's calls to them".into(),
        ));
    }
    Ok(ParticipantTransport {
        tls: Some(ClientTls::pinned_to(tls, &files)?),
        allow_plaintext: false,
    })
}

/// Where the key hold tokens are derived with is kept, for the banner: on SQLite without
/// `--token-secret-file` it is in the data folder, so a copy of that folder holds it.
fn token_secret_where(args: &CoordinatorArgs, database_url: &str) -> String {
    if let Some(path) = &args.secrets.token_secret_file {
        return format!("hold tokens: derived with the key in {}", path.display());
    }
    let sqlite_dir = match DatabaseKind::of_url(database_url) {
        Ok(DatabaseKind::Sqlite) => db::sqlite_dir(database_url).ok(),
        _ => None,
    };
    match sqlite_dir {
        Some(dir) => format!(
            "hold tokens: derived with the key in {}: a copy of that folder can make every token; keep the key elsewhere with --token-secret-file",
            dir.join(crate::config::auth::TOKEN_SECRET_FILE).display()
        ),
        None => "hold tokens: derived with a key of this process only (--ephemeral-token-secret)"
            .to_owned(),
    }
}

fn print_banner(
    settings: &CoordinatorSettings,
    listen: std::net::SocketAddr,
    [metrics, http]: [Option<std::net::SocketAddr>; 2],
    (tls, test_mode): (bool, bool),
    db: &str,
    token_secret: &str,
) {
    println!("holdfast all-in-one (database: {db})");
    println!("  {token_secret}");
    if test_mode {
        println!(
            "  TEST MODE: tcc.v1.Testing on {listen} moves the clock (AdvanceClock) and expires holds (ExpireNow); never for real data"
        );
    }
    if settings.access.auth.is_on() {
        println!("  authentication on (--auth-keys): send -H 'authorization: Bearer <key>'");
    } else if listen.ip().is_loopback() {
        println!("  authentication off (loopback only)");
    } else {
        println!(
            "  authentication off (--insecure-no-auth): anyone who reaches these ports can do anything"
        );
    }
    println!("  coordinator  tcc.v1.Coordinator  {listen}");
    for p in &settings.participants {
        println!(
            "  participant  {:<9}           {}",
            p.name,
            p.url.split_once("://").map_or(p.url.as_str(), |(_, a)| a)
        );
    }
    let scheme = if tls { "https" } else { "http" };
    if let Some(h) = http {
        println!("  console      web console         {scheme}://{h}/");
        println!("  JSON API     curl                {scheme}://{h}/v1/reservations");
    }
    if let Some(m) = metrics {
        println!("  metrics      Prometheus          {scheme}://{m}/metrics");
    }
    println!();
    println!("Try it (grpcurl, no proto files needed: the servers offer reflection):");
    // With TLS, grpcurl verifies the served certificate against the CA given with -cacert.
    let transport = if tls { "-cacert ca.pem" } else { "-plaintext" };
    println!(
        "  grpcurl {transport} -d '{{\"request_id\":\"demo-1\",\"holder\":\"alice\",\"holds\":[{{\"participant\":\"noop\",\"resource\":\"seat-A1\",\"quantity\":1}}]}}' {listen} tcc.v1.Coordinator/Reserve"
    );
    println!(
        "  grpcurl {transport} -d '{{\"reservation_id\":\"<id>\",\"hold_token\":\"<hold_token>\"}}' {listen} tcc.v1.Coordinator/Confirm"
    );
}
