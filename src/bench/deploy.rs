//! The deployment a benchmark runs against: started in-process (coordinator + reference
//! participants on 127.0.0.1:0, over real gRPC, against a fresh Postgres database, and the
//! `stock-redis` participant when asked for) or an existing one named by `--target`. Every
//! in-process hop speaks the run's [`Transport`]: plaintext, or TLS with the bench's flags.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tonic::service::Routes;

use super::transport::Transport;
use crate::app::{self, CoordinatorSettings};
use crate::coordinator::Policy;
use crate::domain::validate::Limits;
use crate::participant::ParticipantService;
use crate::participants::admin::AdminService;
use crate::participants::stock_redis::{self, StockRedisSettings};
use crate::participants::{self, Kind, ParticipantSettings, noop::Noop};
use crate::proto::coordinator_client::CoordinatorClient;
use crate::proto::resource_admin_client::ResourceAdminClient;
use crate::registry::ParticipantEndpoint;
use crate::sinks::Sink;
use crate::store::PgStore;
use crate::tls::Listener;

/// Where the benchmark's clients connect, and which participants they name.
#[derive(Clone, Debug)]
pub struct Endpoints {
    /// The coordinator's URL.
    pub coordinator: String,
    /// Registered names of the noop participants used for "2 holds" (two names: one hold on
    /// each; one name: two resources on it).
    pub noop: Vec<String>,
    /// Registered name and ResourceAdmin URL of the seats participant.
    pub seats: (String, String),
    /// Registered name and ResourceAdmin URL of the stock participant.
    pub stock: (String, String),
    /// Registered name and ResourceAdmin URL of the stock-redis participant, if one runs.
    pub stock_redis: Option<(String, String)>,
}

/// A running in-process deployment; [`Deployment::stop`] shuts it down and closes its pools,
/// so its backends exit and flush their statistics.
pub(crate) struct Deployment {
    pub endpoints: Endpoints,
    transport: Transport,
    stop: watch::Sender<bool>,
    tasks: JoinSet<Result<(), String>>,
    pools: Vec<PgPool>,
}

/// The names the in-process deployment registers.
pub(crate) const NOOP_NAMES: [&str; 2] = ["noop-a", "noop-b"];

/// Drops and recreates the benchmark database. Refuses names without "bench" in them: this
/// deletes everything in it.
pub(crate) async fn reset_database(url: &str) -> Result<(), String> {
    let name = url
        .rsplit('/')
        .next()
        .and_then(|s| s.split('?').next())
        .unwrap_or("");
    if !name.contains("bench") {
        return Err(format!(
            "refusing to reset database {name:?}: the bench drops and recreates its database, \
             so its name must contain \"bench\" (e.g. holdfast_bench)"
        ));
    }
    let (mut conn, database) = crate::db::connect_maintenance(url)
        .await
        .map_err(|e| format!("connecting to reset database {name}: {e}"))?;
    let quoted = crate::db::quote_identifier(&database);
    // FORCE ends the sessions still connected to it (PostgreSQL 13+).
    for statement in [
        format!("DROP DATABASE IF EXISTS {quoted} WITH (FORCE)"),
        format!("CREATE DATABASE {quoted}"),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement.clone()))
            .execute(&mut conn)
            .await
            .map_err(|e| format!("{statement}: {e}"))?;
    }
    let _ = sqlx::Connection::close(conn).await;
    Ok(())
}

/// Applies the coordinator's and the participants' schemas once, before any scenario.
pub async fn migrate(url: &str) -> Result<(), String> {
    let pool = crate::db::connect_postgres(url, 1)
        .await
        .map_err(|e| format!("connecting to {url}: {e}"))?;
    PgStore::from_pool(pool.clone())
        .migrate()
        .await
        .map_err(|e| format!("coordinator migrations: {e}"))?;
    participants::MIGRATOR
        .run(&pool)
        .await
        .map_err(|e| format!("participant migrations: {e}"))?;
    pool.close().await;
    Ok(())
}

/// Finished reservations a fresh database holds before a row ([`fresh_database`]).
const HISTORY: u64 = 50_000;

/// Drops, recreates and migrates the bench database before an in-process row: every row
/// starts from the same schema, so what earlier rows left behind (their reservations and
/// events, dead tuples on a server with autovacuum off or behind, the indexes they grew) is
/// not part of a later row's result, and a row's place in the run does not count.
///
/// The schema is not left empty: it gets a history of [`HISTORY`] reservations finished a
/// day ago (kept by any retention), as many seats sold, and an empty event log, then `ANALYZE`
/// and `CHECKPOINT`, as a deployment that has run for a while has. On never-analyzed empty
/// tables the plans a pool's prepared statements settle on in their first executions are a
/// small table's (a sequential scan of `reservations` to find the rows a group commit writes,
/// of `seat` for a branch's seats), and they stay for the whole row while the table grows, on
/// a server whose autovacuum does not analyze meanwhile (BENCHMARKS.md "Running it").
pub(crate) async fn fresh_database(url: &str) -> Result<(), String> {
    reset_database(url).await?;
    migrate(url).await?;
    super::scenarios::retention::seed_finished(url, HISTORY, 1).await?;
    let pool = crate::db::connect_postgres(url, 1)
        .await
        .map_err(|e| format!("connecting to {url}: {e}"))?;
    // The seed's events are not the row's: its log starts empty. The seats participant has
    // sold as many seats (its other tables stay small in every row).
    let sold = i64::try_from(HISTORY).unwrap_or(i64::MAX);
    let statements = [
        ("emptying the log", sqlx::query("TRUNCATE events")),
        (
            "seeding sold seats",
            sqlx::query(
                "INSERT INTO seat (resource, state, reservation_id, branch_id) \
                 SELECT 'sold-' || g, 'confirmed', gen_random_uuid()::text, \
                        gen_random_uuid()::text \
                 FROM generate_series(1, $1) g",
            )
            .bind(sold),
        ),
        // The seed analyzed `reservations` and `branches`; the other tables start empty
        // (planned on their size as they grow, as in a deployment's first minutes).
        ("ANALYZE seat", sqlx::query("ANALYZE seat")),
    ];
    for (what, statement) in statements {
        statement
            .execute(&pool)
            .await
            .map_err(|e| format!("{what}: {e}"))?;
    }
    // The seed's writes flushed now, not by a checkpoint their WAL would request during the
    // row: every row starts right after one (as after the DROP's). It needs a superuser or
    // pg_checkpoint; without, the row still runs.
    if let Err(e) = sqlx::query("CHECKPOINT").execute(&pool).await {
        eprintln!(
            "bench: CHECKPOINT after the seed refused ({e}); a checkpoint may land in the row"
        );
    }
    pool.close().await;
    Ok(())
}

impl Deployment {
    /// Starts the coordinator (pool of `coordinator_pool`) and participants `noop-a`, `noop-b`,
    /// `seats`, `stock` (sharing one pool of `participant_pool`, as the all-in-one does) on
    /// the already migrated database at `url`, plus `stock-redis` (same pool) with
    /// `stock_redis` settings if given, every hop over `transport`, the coordinator's
    /// retention as `retention` (off but for the `retention` scenario), delivering events to
    /// `sinks` (none but for `--events-nats-url`), and waits until they answer.
    pub async fn start(
        url: &str,
        coordinator_pool: u32,
        participant_pool: u32,
        stock_redis: Option<StockRedisSettings>,
        transport: &Transport,
        retention: crate::coordinator::Retention,
        sinks: Vec<Arc<dyn Sink>>,
    ) -> Result<Deployment, String> {
        let connect = |n| async move {
            crate::db::connect_postgres(url, n)
                .await
                .map_err(|e| format!("connecting to {url}: {e}"))
        };
        let cpool = connect(coordinator_pool).await?;
        let ppool = connect(participant_pool).await?;
        let (stop, stop_rx) = watch::channel(false);
        let mut starting = Starting {
            transport,
            ppool: ppool.clone(),
            stop_rx,
            tasks: JoinSet::new(),
            registered: Vec::new(),
        };
        starting.noop_participants().await?;
        let mut admin_urls = starting.reference_participants().await?;
        let stock_redis_admin = match stock_redis {
            Some(settings) => Some(starting.stock_redis(settings).await?),
            None => None,
        };
        let coordinator_url = starting
            .coordinator(cpool.clone(), retention, sinks)
            .await?;
        let mut stock = admin_urls.pop();
        let mut seats = admin_urls.pop();
        let deployment = Deployment {
            transport: transport.clone(),
            endpoints: Endpoints {
                coordinator: coordinator_url,
                noop: NOOP_NAMES.iter().map(|s| (*s).to_owned()).collect(),
                seats: seats.take().unwrap_or_default(),
                stock: stock.take().unwrap_or_default(),
                stock_redis: stock_redis_admin,
            },
            stop,
            tasks: starting.tasks,
            pools: vec![cpool, ppool],
        };
        deployment.wait_ready().await
    }

    async fn wait_ready(mut self) -> Result<Deployment, String> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(joined) = self.tasks.try_join_next() {
                let why = match joined {
                    Ok(Err(e)) => e,
                    Ok(Ok(())) => "a server stopped during start-up".to_owned(),
                    Err(e) => format!("a server task failed: {e}"),
                };
                self.stop().await;
                return Err(why);
            }
            let stock_redis_ready = match &self.endpoints.stock_redis {
                Some((_, url)) => admin_ready(&self.transport, url).await,
                None => Ok(()),
            };
            let ready = match stock_redis_ready {
                Ok(()) => coordinator_ready(&self.transport, &self.endpoints.coordinator).await,
                not_yet => not_yet,
            };
            let why = match ready {
                Ok(()) => return Ok(self),
                Err(why) => why,
            };
            if tokio::time::Instant::now() > deadline {
                self.stop().await;
                // The last probe's error: with TLS, a certificate the clients refuse shows here.
                return Err(format!(
                    "the in-process deployment did not answer within 30s (last probe: {why})"
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops every server, waits for them (at most 10 s), and closes the pools.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        let drained = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(joined) = self.tasks.join_next().await {
                match joined {
                    Ok(Err(e)) => eprintln!("bench: {e}"),
                    Err(e) => eprintln!("bench: server task failed: {e}"),
                    Ok(Ok(())) => {}
                }
            }
        })
        .await;
        if drained.is_err() {
            eprintln!("bench: servers did not stop within 10s; aborting them");
            self.tasks.abort_all();
        }
        for pool in self.pools {
            pool.close().await;
        }
    }
}

/// Whether the coordinator answers a read (NOT_FOUND for a random id counts as an answer);
/// if not, why.
async fn coordinator_ready(transport: &Transport, url: &str) -> Result<(), String> {
    within_probe_time(async {
        let mut client = CoordinatorClient::new(transport.probe_channel(url, false).await?);
        let answer = client
            .get_reservation(crate::proto::GetReservationRequest {
                reservation_id: uuid::Uuid::new_v4().to_string(),
            })
            .await;
        answered(answer)
    })
    .await
}

/// Whether a ResourceAdmin answers a read (NOT_FOUND for a random resource counts): for
/// `stock-redis`, once its data set is built and it serves. If not, why.
async fn admin_ready(transport: &Transport, url: &str) -> Result<(), String> {
    within_probe_time(async {
        let mut client = ResourceAdminClient::new(transport.probe_channel(url, true).await?);
        let answer = client
            .get_resource(crate::proto::GetResourceRequest {
                resource: format!("probe-{}", uuid::Uuid::new_v4().simple()),
            })
            .await;
        answered(answer)
    })
    .await
}

/// A probe's answer: any answer from the service itself (NOT_FOUND included) means it serves.
fn answered<T>(answer: Result<T, tonic::Status>) -> Result<(), String> {
    match answer {
        Ok(_) => Ok(()),
        Err(s) if s.code() == tonic::Code::NotFound => Ok(()),
        Err(s) => Err(format!("{:?}: {}", s.code(), s.message())),
    }
}

async fn within_probe_time(
    probe: impl std::future::Future<Output = Result<(), String>>,
) -> Result<(), String> {
    tokio::time::timeout(Duration::from_secs(2), probe)
        .await
        .unwrap_or_else(|_| Err("no answer within 2s".into()))
}

/// Settings of a bench `stock-redis` participant on `redis_url`, under a key prefix of its
/// own (`hf:bench:<uuid>:`), so runs never share keys; [`delete_redis_keys`] removes them.
pub(crate) fn stock_redis_settings(redis_url: &str) -> StockRedisSettings {
    let mut settings = StockRedisSettings::new(redis_url);
    settings.key_prefix = format!("hf:bench:{}:", uuid::Uuid::new_v4().simple());
    settings
}

/// Deletes every Redis key under `prefix` (SCAN + UNLINK); answers how many.
pub async fn delete_redis_keys(redis_url: &str, prefix: &str) -> Result<u64, String> {
    let fail = |e: redis::RedisError| format!("deleting the bench's Redis keys: {e}");
    let mut conn = redis::Client::open(redis_url)
        .map_err(fail)?
        .get_multiplexed_async_connection()
        .await
        .map_err(fail)?;
    // MATCH is a glob: escape its special characters in the prefix.
    let mut pattern = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('*');
    let (mut cursor, mut deleted) = (0u64, 0u64);
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(5000)
            .query_async(&mut conn)
            .await
            .map_err(fail)?;
        if !keys.is_empty() {
            let n: u64 = redis::cmd("UNLINK")
                .arg(&keys)
                .query_async(&mut conn)
                .await
                .map_err(fail)?;
            deleted += n;
        }
        if next == 0 {
            return Ok(deleted);
        }
        cursor = next;
    }
}

/// An in-process deployment being started: each step binds a port, registers what it serves
/// there and spawns its server, stopped by `stop_rx`.
struct Starting<'a> {
    transport: &'a Transport,
    ppool: PgPool,
    stop_rx: watch::Receiver<bool>,
    tasks: JoinSet<Result<(), String>>,
    registered: Vec<ParticipantEndpoint>,
}

/// How long the coordinator waits for an in-process participant's answer.
const PARTICIPANT_TIMEOUT: Duration = Duration::from_secs(5);

impl Starting<'_> {
    /// Resolves once the deployment is told to stop.
    fn stopped(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    }

    /// Binds a port for the participant `name` and registers it; its URL.
    async fn register(&mut self, name: &str) -> Result<(Listener, String), String> {
        let (listener, url) = self.transport.bind().await?;
        self.registered.push(ParticipantEndpoint {
            name: name.to_owned(),
            url: url.clone(),
            timeout: PARTICIPANT_TIMEOUT,
        });
        Ok((listener, url))
    }

    /// The noop participants of [`NOOP_NAMES`].
    async fn noop_participants(&mut self) -> Result<(), String> {
        for name in NOOP_NAMES {
            let (listener, _) = self.register(name).await?;
            // `participants::serve` names a noop participant "noop"; two distinct names need
            // the SDK directly (the same thing `serve` does, minus the reclaimer).
            let service = ParticipantService::new(name, Noop::new(name), self.ppool.clone());
            let admin = AdminService::new(service.resource_arc(), self.ppool.clone());
            let routes = Routes::new(service.into_server())
                .add_service(crate::proto::resource_admin_server::ResourceAdminServer::new(admin));
            let shutdown = self.stopped();
            let auth = self.transport.credentials.servers.clone();
            self.tasks.spawn(async move {
                crate::server::serve(
                    listener,
                    &auth,
                    routes,
                    &["tcc.v1.Participant", "tcc.v1.ResourceAdmin"],
                    shutdown,
                )
                .await
                .map_err(|e| format!("participant {name}: {e}"))
            });
        }
        Ok(())
    }

    /// The seats and stock participants; their names and ResourceAdmin URLs, in that order.
    async fn reference_participants(&mut self) -> Result<Vec<(String, String)>, String> {
        let mut admin_urls = Vec::new();
        for kind in [Kind::Seats, Kind::Stock] {
            let (listener, url) = self.register(kind.name()).await?;
            admin_urls.push((kind.name().to_owned(), url));
            let (pool, shutdown) = (self.ppool.clone(), self.stopped());
            let settings = ParticipantSettings {
                auth: self.transport.credentials.servers.clone(),
                ..ParticipantSettings::new(kind)
            };
            self.tasks.spawn(async move {
                participants::serve(settings, pool, listener, shutdown)
                    .await
                    .map_err(|e| format!("participant {}: {e}", kind.name()))
            });
        }
        Ok(admin_urls)
    }

    /// The stock-redis participant; its name and ResourceAdmin URL.
    async fn stock_redis(
        &mut self,
        mut settings: StockRedisSettings,
    ) -> Result<(String, String), String> {
        settings.auth = self.transport.credentials.servers.clone();
        let (listener, url) = self.register(stock_redis::NAME).await?;
        let (pool, shutdown) = (self.ppool.clone(), self.stopped());
        self.tasks.spawn(async move {
            stock_redis::serve(settings, pool, listener, shutdown)
                .await
                .map_err(|e| format!("participant {}: {e}", stock_redis::NAME))
        });
        Ok((stock_redis::NAME.to_owned(), url))
    }

    /// The coordinator, every participant registered so far known to it, delivering events to
    /// `sinks`; its URL.
    async fn coordinator(
        &mut self,
        cpool: PgPool,
        retention: crate::coordinator::Retention,
        sinks: Vec<Arc<dyn Sink>>,
    ) -> Result<String, String> {
        let (listener, coordinator_url) = self.transport.bind().await?;
        let settings = CoordinatorSettings {
            participants: std::mem::take(&mut self.registered),
            limits: Limits::default(),
            policy: Policy {
                retention,
                ..Policy::default()
            },
            server: crate::server::ServerLimits::default(),
            participant_transport: self.transport.participant_transport(),
            access: app::CoordinatorAccess {
                auth: self.transport.credentials.servers.clone(),
                participant_key: self.transport.credentials.coordinator_key.clone(),
                tokens: None,
            },
        };
        let (store, shutdown) = (PgStore::from_pool(cpool), self.stopped());
        self.tasks.spawn(async move {
            let beside = app::Beside { http: None, sinks };
            app::serve_coordinator_beside(settings, store, listener, beside, shutdown)
                .await
                .map_err(|e| format!("coordinator: {e}"))
        });
        Ok(coordinator_url)
    }
}
