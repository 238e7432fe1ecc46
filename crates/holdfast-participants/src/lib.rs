//! The reference participants (seats, stock, rooms, payments, noop), each built on the
//! participant SDK ([`holdfast_participant`]) and each also serving `tcc.v1.ResourceAdmin`;
//! plus [`serve`], the runner the CLI uses for `holdfast participant <kind>`.
//!
//! All of them share one schema per backend (PostgreSQL: `migrations/participants/`,
//! [`MIGRATOR`]; SQLite: `migrations/participants-sqlite/`, [`SQLITE_MIGRATOR`]), tracked in
//! its own migrations table so it can live in the same database as the coordinator's schema.
//! Each participant is a folder of the same shape: `<kind>/mod.rs` (the type and the rules
//! both backends share), `<kind>/postgres.rs` and `<kind>/sqlite.rs` (each backend's SQL);
//! `payments/service.rs` adds `tcc.v1.Payments`. `stock-redis` (Redis + PostgreSQL only) is a
//! folder of its own shape, see [`stock_redis`].

// The serving layer's `sqlite_now_us!` macro, in scope for every module below.
#[macro_use]
extern crate holdfast_serve;

pub mod admin;
pub mod data_dir;
pub mod noop;
pub mod payments;
pub mod rooms;
pub mod seats;
pub mod stock;
pub mod stock_redis;
pub mod testing;

// The layers below under the paths the code has always used (the coordinator crate's metrics
// and test clock; the serving layer; the SDK; the generated tcc.v1 code).
use holdfast_coordinator::{proto, telemetry};
use holdfast_participant as participant;
use holdfast_serve::{auth, db, server, tls};

use std::future::Future;
use std::sync::LazyLock;
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::sqlite::SqlitePool;
use sqlx::{PgPool, Pool};
use tonic::service::Routes;

use crate::participant::{Backend, ParticipantService, Resource};
use crate::proto::payments_server::PaymentsServer;
use crate::proto::resource_admin_server::ResourceAdminServer;
use admin::{AdminService, Inventory};

/// Which reference participant to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// One row per seat, capacity 1.
    Seats,
    /// Interchangeable units behind a guarded counter.
    Stock,
    /// Time slots of rooms, no overlap of active holds.
    Rooms,
    /// Account balances: authorise, capture, void; plus tcc.v1.Payments.
    Payments,
    /// Holds anything; writes only its barrier.
    Noop,
    /// A Redis fast gate for interchangeable units with a durable Postgres record; needs a
    /// Redis URL.
    StockRedis,
}

impl Kind {
    /// The participant's name, which also scopes its barrier rows.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Seats => "seats",
            Kind::Stock => "stock",
            Kind::Rooms => "rooms",
            Kind::Payments => "payments",
            Kind::Noop => "noop",
            Kind::StockRedis => stock_redis::NAME,
        }
    }
}

/// How to run a reference participant.
#[derive(Clone, Debug)]
pub struct ParticipantSettings {
    /// Which participant.
    pub kind: Kind,
    /// How long after `expires_at` an unreleased hold is kept before the participant reclaims
    /// it itself (default [`crate::participant::DEFAULT_ORPHAN_GRACE`], one hour).
    pub orphan_grace: Duration,
    /// Who may call (`--auth-keys`; default: authentication off).
    pub auth: crate::auth::Authenticator,
    /// How far ahead a Try's `expires_at` may lie (default
    /// [`crate::participant::DEFAULT_MAX_HOLD`], 24 hours; `--max-hold`).
    pub max_hold: Duration,
    /// How long finished branches' barrier rows and released hold rows are kept
    /// (`--retention`); `None` keeps them.
    pub retention: Option<Duration>,
    /// The clock `--max-hold` is judged by, and the orphan reclaims run when it moves: the
    /// host's by default; a test deployment's (`crate::testing::TestClock::participants`)
    /// in test mode.
    pub clock: crate::participant::ParticipantClock,
}

impl ParticipantSettings {
    /// Settings for `kind` with the default orphan grace and max hold.
    pub fn new(kind: Kind) -> Self {
        Self {
            kind,
            orphan_grace: crate::participant::DEFAULT_ORPHAN_GRACE,
            auth: crate::auth::Authenticator::Off,
            max_hold: crate::participant::DEFAULT_MAX_HOLD,
            retention: None,
            clock: Default::default(),
        }
    }
}

/// Failure to start or run a reference participant.
#[derive(Debug, thiserror::Error)]
pub enum ParticipantError {
    /// Applying the participants' schema failed.
    #[error("applying participant migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The gRPC server failed.
    #[error(transparent)]
    Serve(#[from] crate::server::ServeError),
    /// The stock-redis participant failed to start.
    #[error("stock-redis: {0}")]
    StockRedis(#[from] stock_redis::StockRedisError),
    /// `stock-redis` was asked for without a Redis URL (use [`stock_redis::serve`]).
    #[error("the stock-redis participant needs a Redis URL (--redis-url / HOLDFAST_REDIS_URL)")]
    NeedsRedis,
    /// `stock-redis` was asked for on SQLite (its durable record is PostgreSQL-only).
    #[error("the stock-redis participant needs a postgres:// database")]
    NeedsPostgres,
    /// Opening the SQLite database failed.
    #[error("opening the participants' database: {0}")]
    Database(#[from] sqlx::Error),
}

/// Name of the table tracking the participants' applied migrations (apart from the
/// coordinator's, whose versions would otherwise collide).
pub const MIGRATIONS_TABLE: &str = "_holdfast_participant_migrations";

static EMBEDDED: Migrator = sqlx::migrate!("./migrations/participants");

/// The SDK's barrier migrations (`holdfast-participant`) and the reference participants' own,
/// in one history by version, tracked in `table`. One history because databases migrated
/// before the SDK became a crate hold both in [`MIGRATIONS_TABLE`], the same files.
fn merged(barrier: &Migrator, business: &Migrator) -> Migrator {
    let mut all: Vec<_> = barrier.iter().chain(business.iter()).cloned().collect();
    all.sort_by_key(|m| m.version);
    let mut migrator = Migrator::with_migrations(all);
    migrator.dangerous_set_table_name(MIGRATIONS_TABLE);
    migrator
}

/// The participants' schema: the barrier's and `migrations/participants/*.sql`, tracked in
/// [`MIGRATIONS_TABLE`]. Run with `MIGRATOR.run(&pool).await`.
pub static MIGRATOR: LazyLock<Migrator> =
    LazyLock::new(|| merged(&crate::participant::migrations::POSTGRES, &EMBEDDED));

static EMBEDDED_SQLITE: Migrator = sqlx::migrate!("./migrations/participants-sqlite");

/// The participants' SQLite schema: the barrier's and `migrations/participants-sqlite/*.sql`,
/// tracked in [`MIGRATIONS_TABLE`]. Run with `SQLITE_MIGRATOR.run(&pool).await`.
pub static SQLITE_MIGRATOR: LazyLock<Migrator> =
    LazyLock::new(|| merged(&crate::participant::migrations::SQLITE, &EMBEDDED_SQLITE));

/// The database the reference participants run on.
#[derive(Clone, Debug)]
pub enum ParticipantDb {
    /// PostgreSQL (schema [`MIGRATOR`]).
    Postgres(PgPool),
    /// SQLite (schema [`SQLITE_MIGRATOR`]); see [`crate::db::open_sqlite`].
    Sqlite(SqlitePool),
}

impl From<PgPool> for ParticipantDb {
    fn from(pool: PgPool) -> Self {
        ParticipantDb::Postgres(pool)
    }
}

impl From<SqlitePool> for ParticipantDb {
    fn from(pool: SqlitePool) -> Self {
        ParticipantDb::Sqlite(pool)
    }
}

/// How often a running participant looks for orphaned holds (past `expires_at + grace`).
/// Rejected Tries also reclaim lazily, so this only keeps counts tidy.
const RECLAIM_EVERY: Duration = Duration::from_secs(30);

/// How often retention looks for finished branches to delete (SPEC 8.3: at least once a
/// minute).
const RETENTION_EVERY: Duration = Duration::from_secs(30);

/// Applies the participants' migrations, then serves `tcc.v1.Participant` +
/// `tcc.v1.ResourceAdmin` (+ `tcc.v1.Payments` for [`Kind::Payments`]), with health and
/// reflection, on `listener` until `shutdown` resolves; in-flight calls then finish.
/// A background task reclaims orphaned holds while it runs. `db` is a `PgPool`, a
/// `SqlitePool` or a [`ParticipantDb`].
pub async fn serve(
    settings: ParticipantSettings,
    db: impl Into<ParticipantDb>,
    listener: impl Into<crate::tls::Listener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ParticipantError> {
    match db.into() {
        ParticipantDb::Postgres(pool) => {
            MIGRATOR.run(&pool).await?;
            serve_on(settings, pool, listener, shutdown).await
        }
        ParticipantDb::Sqlite(pool) => {
            SQLITE_MIGRATOR.run(&pool).await?;
            serve_on(settings, pool, listener, shutdown).await
        }
    }
}

async fn serve_on<DB>(
    settings: ParticipantSettings,
    pool: Pool<DB>,
    listener: impl Into<crate::tls::Listener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ParticipantError>
where
    DB: payments::PaymentsSql,
    seats::Seats: Resource<DB> + Inventory<DB>,
    stock::Stock: Resource<DB> + Inventory<DB>,
    rooms::Rooms: Resource<DB> + Inventory<DB>,
    payments::Payments: Resource<DB> + Inventory<DB>,
    noop::Noop: Resource<DB> + Inventory<DB>,
{
    // The recorder first: the SDK creates its alert series at zero when the participant starts.
    crate::telemetry::metrics_handle();
    let server = Server {
        settings: &settings,
        pool: pool.clone(),
        listener: listener.into(),
    };
    match settings.kind {
        Kind::Seats => server.run(seats::Seats, None, shutdown).await,
        Kind::Stock => server.run(stock::Stock, None, shutdown).await,
        Kind::Rooms => server.run(rooms::Rooms, None, shutdown).await,
        Kind::Noop => {
            server
                .run(noop::Noop::new(Kind::Noop.name()), None, shutdown)
                .await
        }
        Kind::StockRedis => Err(ParticipantError::NeedsRedis),
        Kind::Payments => {
            let payments = PaymentsServer::new(payments::PaymentsService::new(pool));
            server
                .run(payments::Payments, Some(payments), shutdown)
                .await
        }
    }
}

struct Server<'a, DB: Backend> {
    settings: &'a ParticipantSettings,
    pool: Pool<DB>,
    listener: crate::tls::Listener,
}

impl<DB: payments::PaymentsSql> Server<'_, DB> {
    async fn run<R: Resource<DB> + Inventory<DB>>(
        self,
        resource: R,
        payments: Option<PaymentsServer<payments::PaymentsService<DB>>>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ParticipantError> {
        let name = self.settings.kind.name();
        let service = ParticipantService::new(name, resource, self.pool.clone())
            .with_orphan_grace(self.settings.orphan_grace)
            .with_max_hold(self.settings.max_hold)
            .with_clock(self.settings.clock.clone());
        // Kept alive while serving: the clock runs it after each move (test mode).
        let on_clock_move: std::sync::Arc<dyn crate::participant::OrphanReclaim> =
            std::sync::Arc::new(service.clone());
        self.settings.clock.register_reclaim(&on_clock_move);
        let reclaimer = service.spawn_reclaimer(RECLAIM_EVERY);
        service.register_metrics();
        let retention = self
            .settings
            .retention
            .map(|keep| service.spawn_retention(keep, RETENTION_EVERY));
        let admin = AdminService::new(service.resource_arc(), self.pool);
        let mut routes =
            Routes::new(service.into_server()).add_service(ResourceAdminServer::new(admin));
        let mut names = vec!["tcc.v1.Participant", "tcc.v1.ResourceAdmin"];
        if let Some(payments) = payments {
            routes = routes.add_service(payments);
            names.push("tcc.v1.Payments");
        }
        tracing::info!(participant = name, "participant serving");
        let result =
            crate::server::serve(self.listener, &self.settings.auth, routes, &names, shutdown)
                .await;
        reclaimer.abort();
        drop(on_clock_move);
        if let Some(retention) = retention {
            retention.abort();
        }
        Ok(result?)
    }
}
