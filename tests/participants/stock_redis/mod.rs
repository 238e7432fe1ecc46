//! The `stock-redis` participant against real Redis (its own key prefix per test) and real
//! Postgres (a fresh database per test), over gRPC on loopback. The SDK barrier suite in
//! `barrier.rs` runs against it as well (it is in `ALL`); these cover what is specific to
//! Redis, by topic: `holds` (the storm, barrier disorder, resizing), `recovery` (the
//! reconciler's reclaim, losing the Redis data), `clock` (a moved test clock), `retention`
//! (when finished records expire) and `rate` (an ignored benchmark). This file is their
//! harness: a participant of its own per test, its clients, and views of its Redis keys and
//! durable records.

mod clock;
mod extend;
mod holds;
mod rate;
mod recovery;
mod retention;
mod rollback;

use std::time::Duration;

use holdfast::participants::stock_redis::{StockRedis, StockRedisSettings};
use holdfast::proto::branch::State;
use holdfast::proto::participant_client::ParticipantClient;
use holdfast::proto::resource_admin_client::ResourceAdminClient;
use holdfast::proto::try_response::Outcome;
use holdfast::proto::{
    GetResourceRequest, PutResourcesRequest, ResourceSpec, ResourceStatus, TryRequest,
};
use sqlx::PgPool;
use tokio::sync::oneshot;
use tonic::transport::Channel;

use crate::common::{branch_request, outcome};

fn redis_url() -> String {
    std::env::var("HOLDFAST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// Settings isolating a test in Redis under `hf:test:<uuid>:`; the background reconciler
/// only runs when woken (tests call `reconcile()` themselves).
pub fn settings() -> StockRedisSettings {
    let mut s = StockRedisSettings::new(redis_url());
    s.key_prefix = format!("hf:test:{}:", uuid::Uuid::new_v4());
    s.reconcile_every = Duration::from_secs(3600);
    s
}

struct Sr {
    handle: StockRedis,
    prefix: String,
    url: String,
    participant: ParticipantClient<Channel>,
    admin: ResourceAdminClient<Channel>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), holdfast::participants::ParticipantError>>>,
}

async fn start(pool: &PgPool, grace: Duration) -> Sr {
    start_with(
        pool,
        grace,
        holdfast::participants::stock_redis::DEFAULT_RETENTION,
    )
    .await
}

async fn start_with(pool: &PgPool, grace: Duration, retention: Duration) -> Sr {
    let mut s = settings();
    s.orphan_grace = grace;
    s.retention = retention;
    serve_with(pool, s).await
}

/// A second participant process on the same Redis keys and database as `first`: a replica.
async fn start_replica(pool: &PgPool, first: &Sr) -> Sr {
    let mut s = settings();
    s.key_prefix = first.prefix.clone();
    serve_with(pool, s).await
}

async fn serve_with(pool: &PgPool, s: StockRedisSettings) -> Sr {
    let handle = StockRedis::connect(&s, pool.clone())
        .await
        .expect("connect");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(handle.clone().run(s.reconcile_every, listener, async {
        let _ = rx.await;
    }));
    let channel = Channel::from_shared(url.clone())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    Sr {
        handle,
        prefix: s.key_prefix,
        url,
        participant: ParticipantClient::new(channel.clone()),
        admin: ResourceAdminClient::new(channel),
        stop: Some(tx),
        task: Some(task),
    }
}

impl Sr {
    async fn put(&mut self, resource: &str, capacity: i64) {
        self.admin
            .put_resources(PutResourcesRequest {
                resources: vec![ResourceSpec {
                    resource: resource.to_owned(),
                    capacity,
                }],
            })
            .await
            .expect("put");
    }

    async fn get(&mut self, resource: &str) -> ResourceStatus {
        let s = self
            .admin
            .get_resource(GetResourceRequest {
                resource: resource.to_owned(),
            })
            .await
            .expect("get")
            .into_inner();
        assert_eq!(s.capacity, s.available + s.held + s.confirmed, "{s:?}");
        s
    }

    async fn counts(&mut self, resource: &str) -> (i64, i64, i64) {
        let s = self.get(resource).await;
        (s.available, s.held, s.confirmed)
    }

    async fn try_(&mut self, req: &TryRequest) -> (Outcome, String) {
        let r = self
            .participant
            .r#try(req.clone())
            .await
            .expect("try")
            .into_inner();
        (outcome(&r), r.reason)
    }

    async fn confirm(&mut self, req: &TryRequest) -> State {
        let s = self
            .participant
            .confirm(branch_request(req))
            .await
            .expect("confirm")
            .into_inner()
            .state;
        State::try_from(s).expect("state")
    }

    async fn cancel(&mut self, req: &TryRequest) -> State {
        let s = self
            .participant
            .cancel(branch_request(req))
            .await
            .expect("cancel")
            .into_inner()
            .state;
        State::try_from(s).expect("state")
    }

    async fn client(&self) -> ParticipantClient<Channel> {
        ParticipantClient::connect(self.url.clone())
            .await
            .expect("connect")
    }

    /// Deletes every key of this participant (a Redis flush, as far as it is concerned).
    async fn delete_redis_data(&self) -> usize {
        let client = redis::Client::open(redis_url()).expect("redis url");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("redis");
        // One script, so the deletion is atomic like a flush.
        redis::Script::new(
            "local ks = redis.call('KEYS', ARGV[1]) \
             for _, k in ipairs(ks) do redis.call('DEL', k) end return #ks",
        )
        .arg(format!("{}*", self.prefix))
        .invoke_async(&mut conn)
        .await
        .unwrap_or(0)
    }

    async fn redis(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(redis_url())
            .expect("redis url")
            .get_multiplexed_async_connection()
            .await
            .expect("redis")
    }

    /// The Redis key of a branch's record.
    fn record_key(&self, req: &TryRequest) -> String {
        format!(
            "{}b:{}:{}:{}",
            self.prefix,
            req.reservation_id.len(),
            req.reservation_id,
            req.branch_id
        )
    }

    /// PTTL of a branch's record: -2 no record, -1 no expiry, else milliseconds left.
    async fn pttl(&self, req: &TryRequest) -> i64 {
        redis::cmd("PTTL")
            .arg(self.record_key(req))
            .query_async(&mut self.redis().await)
            .await
            .expect("PTTL")
    }

    /// Deletes a branch's record, as its expiry would.
    async fn expire_now(&self, req: &TryRequest) {
        let n: i64 = redis::cmd("DEL")
            .arg(self.record_key(req))
            .query_async(&mut self.redis().await)
            .await
            .expect("DEL");
        assert_eq!(n, 1, "the record was there");
    }

    async fn stop(mut self) {
        let _ = self.delete_redis_data().await;
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("join").expect("serve");
        }
    }
}

async fn durable_units(pool: &PgPool, resource: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT COALESCE(sum(quantity), 0)::bigint FROM stock_redis_confirmed WHERE resource = $1",
    )
    .bind(resource)
    .fetch_one(pool)
    .await
    .expect("durable")
}

const HOUR: Duration = Duration::from_secs(3600);
