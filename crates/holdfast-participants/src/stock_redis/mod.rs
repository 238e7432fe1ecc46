//! Reference participant `stock-redis`: a flash-sale fast gate for interchangeable units
//! (seed 000). Redis decides Try/Confirm/Cancel/Extend with one Lua script each; Postgres
//! keeps the durable record of truth (capacity and every confirmed hold).
//!
//! # Keys (all under a configurable prefix `P`, e.g. `hf:stock-redis:`)
//! - `P a:<res>`, `P h:<res>`, `P c:<res>`, `P cap:<res>`: available, held, confirmed and
//!   capacity of an item (`capacity = available + held + confirmed`);
//! - `P b:<len(reservation_id)>:<reservation_id>:<branch_id>`: the branch record, a hash that
//!   is this participant's barrier: `s` state (`held`, `rejected`, `confirmed`, `cancelled`,
//!   `hold_lost`), `a`/`r` the first Try answer and reason, `u` hold_until (ms), `e` epoch of
//!   the confirm, `n` and `i1..`/`q1..` the items; a finished record expires (see
//!   "Retention of finished records" in `scripts.rs`);
//! - `P expiry`: sorted set of held branch records by `expires_at + orphan_grace` (ms);
//! - `P ready`: present once the data set is built; holds its epoch;
//! - `P seq`: the number of the last change handed over to the durable record (see
//!   "Sequence of durable changes" in `durable.rs`): a data set whose `seq` is below the
//!   durable record's came back with older data and is rebuilt before it serves.
//!
//! # Files
//! - `scripts.rs` and `lua/*.lua`: the Lua scripts that decide in Redis, and how finished
//!   branch records expire;
//! - `branch.rs`: Try, Confirm, Cancel and Extend of one branch;
//! - `durable.rs`: the Postgres record of truth (every SQL statement);
//! - `reconciler.rs`: reclaim of expired holds, drift reports, rebuild after Redis data loss;
//! - `inventory.rs`: creating, resizing and counting items;
//! - `grpc.rs`: the `tcc.v1.Participant` and `tcc.v1.ResourceAdmin` services;
//! - `error.rs`: [`StockRedisError`] and its mapping to gRPC statuses;
//! - `faults.rs`: failpoints between the Redis decision and the durable record (tests only);
//! - here: settings, connecting, serving.

mod branch;
mod durable;
mod error;
mod faults;
mod grpc;
mod inventory;
mod reconciler;
mod scripts;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use redis::aio::ConnectionManager;
use sqlx::PgPool;
use tonic::service::Routes;

use super::ParticipantError;
use crate::participant::BranchKey;
use crate::proto::participant_server::ParticipantServer;
use crate::proto::resource_admin_server::ResourceAdminServer;

pub use error::StockRedisError;
pub use reconciler::ReconcileReport;

/// The participant's name (it is also the CLI kind).
pub const NAME: &str = "stock-redis";
/// Default key prefix in Redis.
pub const DEFAULT_PREFIX: &str = "hf:stock-redis:";
/// Default retention of a finished branch record past its deadline (see `scripts.rs`).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// How to run the stock-redis participant.
#[derive(Clone, Debug)]
pub struct StockRedisSettings {
    /// Redis URL, e.g. `redis://127.0.0.1:6379`.
    pub redis_url: String,
    /// For `rediss://`: the PEM CA file the Redis server's certificate must chain to, trusted
    /// alone (`--redis-ca`); without it, the system roots.
    pub redis_ca: Option<std::path::PathBuf>,
    /// Prefix of every key this participant owns.
    pub key_prefix: String,
    /// How long after `expires_at` an unreleased hold is kept before the reconciler may
    /// reclaim it (default one hour).
    pub orphan_grace: Duration,
    /// How long a finished branch record stays in Redis past its deadline (see
    /// `scripts.rs`; default 7 days).
    pub retention: Duration,
    /// How far ahead a Try's `expires_at` may lie (default 24 hours; `--max-hold`).
    pub max_hold: Duration,
    /// How often the background reconciler runs.
    pub reconcile_every: Duration,
    /// Who may call (`--auth-keys`; default: authentication off).
    pub auth: crate::auth::Authenticator,
    /// The clock `--max-hold` and the orphan reclaim are judged by: the host's (and Redis's)
    /// by default; in test mode the deployment's, whose moves run the reclaim at once.
    pub clock: crate::participant::ParticipantClock,
}

impl StockRedisSettings {
    /// Settings with the default prefix, grace, retention, max hold and a one-second
    /// reconciler period.
    pub fn new(redis_url: impl Into<String>) -> Self {
        Self {
            redis_url: redis_url.into(),
            redis_ca: None,
            key_prefix: DEFAULT_PREFIX.to_owned(),
            orphan_grace: crate::participant::DEFAULT_ORPHAN_GRACE,
            retention: DEFAULT_RETENTION,
            max_hold: crate::participant::DEFAULT_MAX_HOLD,
            reconcile_every: Duration::from_secs(1),
            auth: crate::auth::Authenticator::Off,
            clock: Default::default(),
        }
    }
}

/// The Redis client `settings` name: with `--redis-ca`, a `rediss://` URL whose server is
/// verified against that file alone (never the system roots, as for every CA flag).
fn redis_client(settings: &StockRedisSettings) -> Result<redis::Client, StockRedisError> {
    let url = settings.redis_url.as_str();
    let Some(ca) = &settings.redis_ca else {
        return Ok(redis::Client::open(url)?);
    };
    let refuse = |problem: String| {
        StockRedisError::Settings(format!("--redis-ca {}: {problem}", ca.display()))
    };
    if !url
        .get(..9)
        .is_some_and(|s| s.eq_ignore_ascii_case("rediss://"))
    {
        return Err(refuse(
            "a CA is for rediss:// URLs (TLS), not this one".to_owned(),
        ));
    }
    let root = std::fs::read(ca).map_err(|e| refuse(format!("cannot read it: {e}")))?;
    let tls = redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(root),
    };
    redis::Client::build_with_tls(url, tls).map_err(|e| refuse(e.to_string()))
}

/// The stock-redis participant: `tcc.v1.Participant` + `tcc.v1.ResourceAdmin` over Redis
/// with a durable Postgres record. Cheap to clone.
#[derive(Clone)]
pub struct StockRedis {
    inner: Arc<Inner>,
}

struct Inner {
    redis: ConnectionManager,
    pool: PgPool,
    prefix: String,
    grace_ms: i64,
    /// Retention of a finished record past its deadline (ms).
    retention_ms: i64,
    /// Time to live of a tombstone: `orphan_grace + retention` (ms).
    tombstone_ms: i64,
    /// How far ahead a Try's `expires_at` may lie.
    max_hold: Duration,
    /// The highest sequence number of the durable record this process has seen (written or
    /// read): every script refuses a data set whose `P seq` is below it.
    floor: AtomicI64,
    wake: tokio::sync::Notify,
    auth: crate::auth::Authenticator,
    clock: crate::participant::ParticipantClock,
}

impl StockRedis {
    /// Applies the participants' schema and connects to Redis. The data set is built by the
    /// first [`reconcile`](Self::reconcile) (done by [`run`](Self::run)).
    pub async fn connect(
        settings: &StockRedisSettings,
        pool: PgPool,
    ) -> Result<Self, StockRedisError> {
        super::MIGRATOR.run(&pool).await?;
        let client = redis_client(settings)?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(5)))
            .set_number_of_retries(2);
        let redis = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| match &settings.redis_ca {
                Some(ca) if e.is_io_error() || e.to_string().contains("certificate") => {
                    StockRedisError::Settings(format!(
                        "--redis-ca {}: cannot connect to Redis with it: {e}",
                        ca.display()
                    ))
                }
                _ => e.into(),
            })?;
        let grace_ms = i64::try_from(settings.orphan_grace.as_millis())
            .map_err(|_| StockRedisError::Internal("orphan grace out of range".to_owned()))?;
        let retention_ms = i64::try_from(settings.retention.as_millis())
            .ok()
            .filter(|ms| *ms > 0)
            .ok_or_else(|| StockRedisError::Internal("retention out of range".to_owned()))?;
        let tombstone_ms = grace_ms
            .checked_add(retention_ms)
            .ok_or_else(|| StockRedisError::Internal("retention out of range".to_owned()))?;
        Ok(Self {
            inner: Arc::new(Inner {
                redis,
                pool,
                prefix: settings.key_prefix.clone(),
                grace_ms,
                retention_ms,
                tombstone_ms,
                max_hold: settings.max_hold,
                clock: settings.clock.clone(),
                floor: AtomicI64::new(0),
                wake: tokio::sync::Notify::new(),
                auth: settings.auth.clone(),
            }),
        })
    }

    /// A handle on the shared, reconnecting Redis connection.
    fn conn(&self) -> ConnectionManager {
        self.inner.redis.clone()
    }

    /// The lowest sequence number the Redis data set may have (see `durable.rs`).
    fn floor(&self) -> i64 {
        self.inner.floor.load(Ordering::Acquire)
    }

    /// Raises [`Self::floor`] to a durable change's number.
    fn saw_durable(&self, seq: i64) {
        self.inner.floor.fetch_max(seq, Ordering::AcqRel);
    }

    /// The Redis key `suffix` under this participant's prefix.
    fn key(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.inner.prefix)
    }

    /// The Redis key of a branch's record (its barrier); the id's length keeps
    /// `("a:b", "c")` and `("a", "b:c")` apart.
    fn record_key(&self, key: &BranchKey) -> String {
        format!(
            "{}b:{}:{}:{}",
            self.inner.prefix,
            key.reservation_id.len(),
            key.reservation_id,
            key.branch_id
        )
    }

    /// Applies the schema, builds the data set if needed, runs the reconciler, and serves
    /// `tcc.v1.Participant` + `tcc.v1.ResourceAdmin` on `listener` until `shutdown`.
    pub async fn run(
        self,
        reconcile_every: Duration,
        listener: impl Into<crate::tls::Listener>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ParticipantError> {
        self.reconcile().await?;
        let reconciler = self.spawn_reconciler(reconcile_every);
        // Kept alive while serving: a move of the clock (test mode) runs the reclaim.
        let on_clock_move: Arc<dyn crate::participant::OrphanReclaim> = Arc::new(self.clone());
        self.inner.clock.register_reclaim(&on_clock_move);
        let auth = self.inner.auth.clone();
        let routes = Routes::new(ParticipantServer::new(self.clone()))
            .add_service(ResourceAdminServer::new(self));
        tracing::info!(participant = NAME, "participant serving");
        let result = crate::server::serve(
            listener,
            &auth,
            routes,
            &["tcc.v1.Participant", "tcc.v1.ResourceAdmin"],
            shutdown,
        )
        .await;
        reconciler.abort();
        drop(on_clock_move);
        Ok(result?)
    }
}

/// Connects with `settings` and serves until `shutdown` (what `holdfast participant
/// stock-redis` runs).
pub async fn serve(
    settings: StockRedisSettings,
    pool: PgPool,
    listener: impl Into<crate::tls::Listener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ParticipantError> {
    let participant = StockRedis::connect(&settings, pool).await?;
    crate::telemetry::ops::stock_redis_started();
    participant
        .run(settings.reconcile_every, listener, shutdown)
        .await
}
