//! The `stock-redis` participant against real Redis (its own key prefix per test) and real
//! Postgres (a fresh database per test), over gRPC on loopback. The SDK barrier suite in
//! `barrier.rs` runs against it as well (it is in `ALL`); these cover what is specific to
//! Redis: the storm, the reconciler, losing the Redis data, and the rate.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use holdfast::participants::stock_redis::{StockRedis, StockRedisSettings};
use holdfast::proto::branch::State;
use holdfast::proto::participant_client::ParticipantClient;
use holdfast::proto::participant_server::Participant;
use holdfast::proto::resource_admin_client::ResourceAdminClient;
use holdfast::proto::try_response::Outcome;
use holdfast::proto::{
    GetResourceRequest, PutResourcesRequest, ResourceSpec, ResourceStatus, TryRequest,
};
use sqlx::PgPool;
use tokio::sync::{Semaphore, oneshot};
use tonic::transport::Channel;

use crate::common::{branch_request, from_now, hold, outcome, try_request};

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

#[sqlx::test(migrations = false)]
async fn storm_of_1000_tries_on_100_units_holds_exactly_100(pool: PgPool) {
    let mut p = start(&pool, HOUR).await;
    p.put("sku-flash", 100).await;
    // Concurrent checker: capacity constant, available >= 0, the sum holds, during the storm.
    let stop = Arc::new(AtomicBool::new(false));
    let checker = {
        let (stop, mut admin) = (stop.clone(), p.admin.clone());
        tokio::spawn(async move {
            let mut runs = 0usize;
            while !stop.load(Ordering::SeqCst) {
                let s = admin
                    .get_resource(GetResourceRequest {
                        resource: "sku-flash".to_owned(),
                    })
                    .await
                    .map_err(|e| e.to_string())?
                    .into_inner();
                if s.capacity != 100
                    || s.available < 0
                    || s.capacity != s.available + s.held + s.confirmed
                {
                    return Err(format!("invariant broken: {s:?}"));
                }
                runs += 1;
            }
            Ok::<usize, String>(runs)
        })
    };
    let mut clients = Vec::new();
    for _ in 0..64 {
        clients.push(p.client().await);
    }
    let limit = Arc::new(Semaphore::new(128));
    let mut calls = Vec::new();
    for i in 0..1000 {
        let req = try_request(vec![hold("sku-flash", 1, None)]);
        let mut client = clients[i % clients.len()].clone();
        let limit = limit.clone();
        calls.push(tokio::spawn(async move {
            let _permit = limit.acquire_owned().await.expect("permit");
            let answer = client.r#try(req.clone()).await.expect("try").into_inner();
            (req, outcome(&answer))
        }));
    }
    let mut held = Vec::new();
    for call in calls {
        let (req, o) = call.await.expect("join");
        if o == Outcome::Held {
            held.push(req);
        }
    }
    stop.store(true, Ordering::SeqCst);
    let runs = checker.await.expect("join").expect("invariant held");
    assert!(runs > 0, "the checker ran during the storm");
    assert_eq!(held.len(), 100, "exactly the capacity is held");
    assert_eq!(p.counts("sku-flash").await, (0, 100, 0));
    // Confirm 40, cancel 60, concurrently.
    let mut calls = Vec::new();
    for (i, req) in held.into_iter().enumerate() {
        let mut client = clients[i % clients.len()].clone();
        calls.push(tokio::spawn(async move {
            if i < 40 {
                client.confirm(branch_request(&req)).await
            } else {
                client.cancel(branch_request(&req)).await
            }
        }));
    }
    for call in calls {
        call.await.expect("join").expect("decide");
    }
    assert_eq!(p.counts("sku-flash").await, (60, 0, 40));
    assert_eq!(durable_units(&pool, "sku-flash").await, 40);
    assert!(
        p.handle
            .reconcile()
            .await
            .expect("reconcile")
            .drift
            .is_empty()
    );
    p.stop().await;
}

#[sqlx::test(migrations = false)]
async fn barrier_disorder_holds_in_redis(pool: PgPool) {
    let mut p = start(&pool, HOUR).await;
    p.put("sku-1", 5).await;
    // Cancel before Try: tombstone, late Try is a REJECTED no-op, repeats answer the same.
    let req = try_request(vec![hold("sku-1", 2, None)]);
    assert_eq!(p.cancel(&req).await, State::Cancelled);
    let late = p.try_(&req).await;
    assert_eq!(late.0, Outcome::Rejected);
    assert!(!late.1.is_empty());
    assert_eq!(p.try_(&req).await, late);
    assert_eq!(p.confirm(&req).await, State::Cancelled);
    assert_eq!(p.counts("sku-1").await, (5, 0, 0));
    // Confirm after Cancel refused; Cancel after Confirm refused.
    let a = try_request(vec![hold("sku-1", 2, None)]);
    assert_eq!(p.try_(&a).await.0, Outcome::Held);
    assert_eq!(p.cancel(&a).await, State::Cancelled);
    assert_eq!(p.confirm(&a).await, State::Cancelled);
    let b = try_request(vec![hold("sku-1", 2, None)]);
    assert_eq!(p.try_(&b).await.0, Outcome::Held);
    assert_eq!(p.confirm(&b).await, State::Confirmed);
    assert_eq!(p.cancel(&b).await, State::Confirmed);
    assert_eq!(p.confirm(&b).await, State::Confirmed);
    assert_eq!(p.try_(&b).await.0, Outcome::Held, "first answer");
    assert_eq!(p.counts("sku-1").await, (3, 0, 2));
    // Confirm before Try: HOLD_LOST, the late Try is refused.
    let c = try_request(vec![hold("sku-1", 1, None)]);
    assert_eq!(p.confirm(&c).await, State::HoldLost);
    assert_eq!(p.try_(&c).await.0, Outcome::Rejected);
    // All-or-nothing: a missing second item leaves the first untouched.
    let d = try_request(vec![hold("sku-1", 1, None), hold("sku-zz", 1, None)]);
    let (o, reason) = p.try_(&d).await;
    assert_eq!(o, Outcome::Rejected);
    assert!(reason.contains("sku-zz"), "{reason}");
    assert_eq!(p.counts("sku-1").await, (3, 0, 2));
    // Concurrent duplicate Confirms and Cancels apply once.
    let e = try_request(vec![hold("sku-1", 3, None)]);
    assert_eq!(p.try_(&e).await.0, Outcome::Held);
    let mut calls = Vec::new();
    for i in 0..8 {
        let mut client = p.client().await;
        let br = branch_request(&e);
        calls.push(tokio::spawn(async move {
            if i % 2 == 0 {
                client.cancel(br).await
            } else {
                client.confirm(br).await
            }
        }));
    }
    let mut states = HashSet::new();
    for call in calls {
        states.insert(call.await.expect("join").expect("call").into_inner().state);
    }
    assert_eq!(states.len(), 1, "one decision wins, every call reports it");
    let (a, h, c) = p.counts("sku-1").await;
    assert_eq!(h, 0);
    assert!((a, c) == (3, 2) || (a, c) == (0, 5), "{a} {c}");
    assert_eq!(durable_units(&pool, "sku-1").await, c);
    // Racing Try and Cancel never leave a hold.
    p.put("sku-race", 100).await;
    let mut calls = Vec::new();
    for _ in 0..30 {
        let req = try_request(vec![hold("sku-race", 1, None)]);
        let (mut x, mut y) = (p.client().await, p.client().await);
        let br = branch_request(&req);
        calls.push(tokio::spawn(async move {
            let (t, c) = tokio::join!(x.r#try(req), y.cancel(br));
            t.expect("try");
            c.expect("cancel").into_inner().state
        }));
    }
    for call in calls {
        assert_eq!(call.await.expect("join"), State::Cancelled as i32);
    }
    assert_eq!(p.counts("sku-race").await, (100, 0, 0));
    p.stop().await;
}

#[sqlx::test(migrations = false)]
async fn abandoned_hold_is_reclaimed_exactly_once_after_grace(pool: PgPool) {
    let grace = Duration::from_millis(800);
    let mut p = start(&pool, grace).await;
    p.put("sku-1", 10).await;
    let mut abandoned = try_request(vec![hold("sku-1", 3, None)]);
    abandoned.expires_at = Some(from_now(1));
    assert_eq!(p.try_(&abandoned).await.0, Outcome::Held);
    let kept = try_request(vec![hold("sku-1", 2, None)]);
    assert_eq!(p.try_(&kept).await.0, Outcome::Held);
    // Before expires_at + grace nothing is released.
    assert_eq!(p.handle.reconcile().await.expect("reconcile").reclaimed, 0);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(
        p.handle.reconcile().await.expect("reconcile").reclaimed,
        0,
        "past expires_at but within the grace"
    );
    assert_eq!(p.counts("sku-1").await, (5, 5, 0));
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let (a, b) = tokio::join!(p.handle.reconcile(), p.handle.reconcile());
    let total = a.expect("reconcile a").reclaimed + b.expect("reconcile b").reclaimed;
    assert_eq!(total, 1, "returned exactly once");
    assert_eq!(p.handle.reconcile().await.expect("again").reclaimed, 0);
    assert_eq!(p.counts("sku-1").await, (8, 2, 0));
    assert_eq!(p.confirm(&abandoned).await, State::HoldLost);
    assert_eq!(p.confirm(&abandoned).await, State::HoldLost);
    assert_eq!(p.cancel(&abandoned).await, State::Cancelled);
    assert_eq!(
        p.try_(&abandoned).await.0,
        Outcome::Held,
        "first answer, no effect"
    );
    assert_eq!(p.counts("sku-1").await, (8, 2, 0));
    assert_eq!(p.confirm(&kept).await, State::Confirmed);
    assert_eq!(p.counts("sku-1").await, (8, 0, 2));
    p.stop().await;
}

#[sqlx::test(migrations = false)]
async fn redis_data_lost_mid_sale_is_rebuilt_without_oversell(pool: PgPool) {
    const CAP: i64 = 60;
    let mut p = start(&pool, HOUR).await;
    p.put("sku-1", CAP).await;
    // A sale in flight: buyers Try then Confirm, while the data set is deleted under them.
    let confirmed = Arc::new(std::sync::Mutex::new(Vec::<TryRequest>::new()));
    let limit = Arc::new(Semaphore::new(16));
    let mut buyers = Vec::new();
    for i in 0..150 {
        let mut client = p.client().await;
        let (limit, confirmed) = (limit.clone(), confirmed.clone());
        buyers.push(tokio::spawn(async move {
            let _permit = limit.acquire_owned().await.expect("permit");
            tokio::time::sleep(Duration::from_millis(2 * i)).await;
            let req = try_request(vec![hold("sku-1", 1, None)]);
            let answer = client.r#try(req.clone()).await.expect("try").into_inner();
            if outcome(&answer) != Outcome::Held {
                return;
            }
            // The coordinator retries Confirm until it gets an answer.
            loop {
                match client.confirm(branch_request(&req)).await {
                    Ok(r) => {
                        if r.into_inner().state == State::Confirmed as i32 {
                            confirmed.lock().expect("lock").push(req);
                        }
                        return;
                    }
                    Err(s) if s.code() == tonic::Code::Unavailable => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    Err(s) => panic!("confirm: {s}"),
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert!(p.delete_redis_data().await > 0);
    // Until rebuilt, a Try is refused with "rebuilding"; the woken reconciler may already
    // have rebuilt (then it holds or finds the stock sold out).
    let probe = try_request(vec![hold("sku-1", 1, None)]);
    let (o, reason) = p.try_(&probe).await;
    assert!(
        o == Outcome::Held || reason == "rebuilding" || reason.starts_with("insufficient"),
        "{o:?} {reason}"
    );
    let _ = p.handle.reconcile().await.expect("reconcile");
    for b in buyers {
        b.await.expect("buyer");
    }
    if o == Outcome::Held {
        assert_eq!(p.cancel(&probe).await, State::Cancelled);
    }
    let report = p.handle.reconcile().await.expect("reconcile");
    assert!(report.drift.is_empty(), "{:?}", report.drift);
    let confirmed = confirmed.lock().expect("lock").clone();
    let durable = durable_units(&pool, "sku-1").await;
    // Every CONFIRMED answer is durable, and Redis agrees with the durable record.
    assert_eq!(durable, confirmed.len() as i64);
    let (a, h, c) = p.counts("sku-1").await;
    assert_eq!(c, durable);
    assert!(a >= 0 && a + h + c == CAP);
    for req in &confirmed {
        assert_eq!(
            p.confirm(req).await,
            State::Confirmed,
            "repeat after rebuild"
        );
        assert_eq!(
            p.cancel(req).await,
            State::Confirmed,
            "cancel after confirm"
        );
        assert_eq!(p.try_(req).await.0, Outcome::Held, "first answer");
    }
    assert_eq!(p.counts("sku-1").await, (a, h, c));
    // Sell out what is left: never more than the capacity in total.
    let mut sold = 0;
    for _ in 0..(CAP + 20) {
        let req = try_request(vec![hold("sku-1", 1, None)]);
        if p.try_(&req).await.0 == Outcome::Held {
            assert_eq!(p.confirm(&req).await, State::Confirmed);
            sold += 1;
        }
    }
    assert_eq!(sold, a);
    assert_eq!(durable_units(&pool, "sku-1").await + h, CAP);
    assert_eq!(p.counts("sku-1").await, (0, h, CAP - h));
    p.stop().await;
}

fn unix_ms(ts: &prost_types::Timestamp) -> i64 {
    ts.seconds * 1000 + i64::from(ts.nanos / 1_000_000)
}

fn now_ms() -> i64 {
    unix_ms(&from_now(0))
}

/// Asserts that a record's PTTL says it expires at `at` (Unix ms), give or take 2 s.
#[track_caller]
fn assert_expires_at(pttl: i64, at: i64, what: &str) {
    assert!(pttl > 0, "{what}: no expiry (PTTL {pttl})");
    let off = pttl + now_ms() - at;
    assert!(
        off.abs() < 2000,
        "{what}: expires {off} ms off (PTTL {pttl})"
    );
}

/// Every script that finishes a branch record gives it a Redis expiry: a confirmed,
/// cancelled or reclaimed hold and a refused Try at the hold's deadline (`expires_at +
/// orphan_grace`) + retention, a tombstone at orphan_grace + retention from now; a held record
/// has none. Within the retention every late call answers as before. Once a record is gone
/// (deleted here, as its expiry does), a confirmed branch is answered CONFIRMED from the
/// durable record, to Confirm and to Cancel, with no unit moved.
#[sqlx::test(migrations = false)]
async fn finished_records_expire_after_their_retention(pool: PgPool) {
    let grace = Duration::from_secs(5);
    let retention = Duration::from_secs(30);
    let (grace_ms, keep_ms) = (grace.as_millis() as i64, retention.as_millis() as i64);
    let mut p = start_with(&pool, grace, retention).await;
    p.put("sku-1", 6).await;
    let deadline = |req: &TryRequest| unix_ms(req.expires_at.as_ref().expect("expires_at"));
    let request = |quantity, secs| {
        let mut req = try_request(vec![hold("sku-1", quantity, None)]);
        req.expires_at = Some(from_now(secs));
        req
    };

    // Held: no expiry. Confirmed: the hold's deadline + grace + retention.
    let a = request(2, 10);
    assert_eq!(p.try_(&a).await.0, Outcome::Held);
    assert_eq!(p.pttl(&a).await, -1, "a held record never expires");
    assert_eq!(p.confirm(&a).await, State::Confirmed);
    let a_at = deadline(&a) + grace_ms + keep_ms;
    assert_expires_at(p.pttl(&a).await, a_at, "confirmed");
    // Within the retention: repeats and late calls answer as before, nothing moves.
    assert_eq!(p.confirm(&a).await, State::Confirmed);
    assert_eq!(p.cancel(&a).await, State::Confirmed);
    assert_eq!(p.try_(&a).await.0, Outcome::Held, "first answer");
    assert_expires_at(p.pttl(&a).await, a_at, "confirmed, after repeats");

    // Cancelled hold.
    let b = request(1, 20);
    assert_eq!(p.try_(&b).await.0, Outcome::Held);
    assert_eq!(p.cancel(&b).await, State::Cancelled);
    let b_at = deadline(&b) + grace_ms + keep_ms;
    assert_expires_at(p.pttl(&b).await, b_at, "cancelled");
    assert_eq!(p.confirm(&b).await, State::Cancelled);

    // Refused Try (5 wanted, 4 available): the Try's deadline + grace + retention.
    let c = request(5, 10);
    assert_eq!(p.try_(&c).await.0, Outcome::Rejected);
    assert_expires_at(
        p.pttl(&c).await,
        deadline(&c) + grace_ms + keep_ms,
        "rejected",
    );
    assert_eq!(p.cancel(&c).await, State::Cancelled);
    assert_eq!(p.try_(&c).await.0, Outcome::Rejected, "first answer");

    // Tombstones: Cancel or Confirm before any Try.
    let d = request(1, 10);
    assert_eq!(p.cancel(&d).await, State::Cancelled);
    assert_expires_at(
        p.pttl(&d).await,
        now_ms() + grace_ms + keep_ms,
        "cancel tombstone",
    );
    assert_eq!(
        p.try_(&d).await.0,
        Outcome::Rejected,
        "late Try after Cancel"
    );
    let e = request(1, 10);
    assert_eq!(p.confirm(&e).await, State::HoldLost);
    assert_expires_at(
        p.pttl(&e).await,
        now_ms() + grace_ms + keep_ms,
        "confirm tombstone",
    );
    assert_eq!(
        p.try_(&e).await.0,
        Outcome::Rejected,
        "late Try after Confirm"
    );

    // Reclaimed orphan (its expires_at + grace already passed).
    let f = request(1, -10);
    assert_eq!(p.try_(&f).await.0, Outcome::Held);
    assert_eq!(p.pttl(&f).await, -1);
    assert_eq!(p.handle.reconcile().await.expect("reconcile").reclaimed, 1);
    assert_expires_at(
        p.pttl(&f).await,
        deadline(&f) + grace_ms + keep_ms,
        "reclaimed",
    );
    assert_eq!(p.confirm(&f).await, State::HoldLost);
    assert_eq!(p.counts("sku-1").await, (4, 0, 2));

    // After the retention: a confirmed branch answers from the durable record (and its record
    // is back, for another retention); others answer as tombstones do. No unit moves.
    p.expire_now(&a).await;
    assert_eq!(p.confirm(&a).await, State::Confirmed);
    assert_expires_at(p.pttl(&a).await, now_ms() + keep_ms, "restored");
    p.expire_now(&a).await;
    assert_eq!(p.cancel(&a).await, State::Confirmed, "Cancel after Confirm");
    assert_eq!(p.confirm(&a).await, State::Confirmed);
    p.expire_now(&b).await;
    assert_eq!(p.confirm(&b).await, State::HoldLost);
    assert_eq!(p.cancel(&b).await, State::Cancelled);
    assert_eq!(p.counts("sku-1").await, (4, 0, 2));
    assert_eq!(durable_units(&pool, "sku-1").await, 2);
    p.stop().await;
}

#[sqlx::test(migrations = false)]
async fn resize_is_durable_and_refused_below_what_is_taken(pool: PgPool) {
    let mut p = start(&pool, HOUR).await;
    p.put("sku-1", 5).await;
    let req = try_request(vec![hold("sku-1", 3, None)]);
    assert_eq!(p.try_(&req).await.0, Outcome::Held);
    let err = p
        .admin
        .put_resources(PutResourcesRequest {
            resources: vec![ResourceSpec {
                resource: "sku-1".to_owned(),
                capacity: 2,
            }],
        })
        .await
        .expect_err("below held");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    let cap: i64 =
        sqlx::query_scalar("SELECT capacity FROM stock_redis_item WHERE resource = 'sku-1'")
            .fetch_one(&pool)
            .await
            .expect("capacity");
    assert_eq!(cap, 5, "refusal changed nothing durably");
    p.put("sku-1", 8).await;
    assert_eq!(p.counts("sku-1").await, (5, 3, 0));
    p.stop().await;
}

/// Holds/s of the participant alone: `cargo test --test participants stock_redis_rate -- --ignored --nocapture`.
/// On a multi-threaded runtime (`#[sqlx::test]` runs on one thread), with its own database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; prints the rate"]
async fn stock_redis_rate() {
    const N: usize = 40_000;
    let base = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let url = format!(
        "{}/hf_bench_{}",
        base.rsplit_once('/').expect("database url").0,
        uuid::Uuid::new_v4().simple()
    );
    let pool = holdfast::db::connect_postgres(&url, 8)
        .await
        .expect("bench database");
    let mut p = start(&pool, HOUR).await;
    p.put("sku-bench", N as i64 * 2).await;
    // In process, no gRPC: the Participant trait called directly.
    let limit = Arc::new(Semaphore::new(256));
    let t = Instant::now();
    let mut calls = Vec::with_capacity(N);
    for _ in 0..N {
        let (h, limit) = (p.handle.clone(), limit.clone());
        calls.push(tokio::spawn(async move {
            let _permit = limit.acquire_owned().await.expect("permit");
            let req = try_request(vec![hold("sku-bench", 1, None)]);
            h.r#try(tonic::Request::new(req)).await.expect("try");
        }));
    }
    for c in calls {
        c.await.expect("join");
    }
    let direct = N as f64 / t.elapsed().as_secs_f64();
    // Over gRPC on loopback, 32 connections, 256 in flight.
    let mut clients = Vec::new();
    for _ in 0..32 {
        clients.push(p.client().await);
    }
    let t = Instant::now();
    let mut calls = Vec::with_capacity(N);
    for i in 0..N {
        let (mut client, limit) = (clients[i % 32].clone(), limit.clone());
        calls.push(tokio::spawn(async move {
            let _permit = limit.acquire_owned().await.expect("permit");
            let req = try_request(vec![hold("sku-bench", 1, None)]);
            client.r#try(req).await.expect("try");
        }));
    }
    for c in calls {
        c.await.expect("join");
    }
    let grpc = N as f64 / t.elapsed().as_secs_f64();
    assert_eq!(p.counts("sku-bench").await, (0, 2 * N as i64, 0));
    println!("stock-redis holds/s: in-process {direct:.0}, over gRPC {grpc:.0}");
    p.stop().await;
    pool.close().await;
    use sqlx::migrate::MigrateDatabase;
    let _ = sqlx::Postgres::drop_database(&url).await;
}
