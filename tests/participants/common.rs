//! Test harness: start a reference participant with the production `serve` on a loopback
//! port, talk to it with the generated clients, and read its counts.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use holdfast::participants::{Kind, ParticipantDb, ParticipantError, ParticipantSettings, serve};
use holdfast::proto::participant_client::ParticipantClient;
use holdfast::proto::payments_client::PaymentsClient;
use holdfast::proto::resource_admin_client::ResourceAdminClient;
use holdfast::proto::{
    BranchRequest, GetResourceRequest, Hold, Interval, PutResourcesRequest, ResourceSpec,
    ResourceStatus, TryRequest, TryResponse, branch, try_response,
};
use sqlx::PgPool;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// Every reference participant.
pub const ALL: [Kind; 6] = [
    Kind::Seats,
    Kind::Stock,
    Kind::Rooms,
    Kind::Payments,
    Kind::Noop,
    Kind::StockRedis,
];

/// A fresh SQLite file in the temp folder with the reference participants' schema.
pub async fn fresh_sqlite() -> sqlx::SqlitePool {
    let path = std::env::temp_dir().join(format!(
        "holdfast-participants-{}.db",
        uuid::Uuid::new_v4().simple()
    ));
    let sqlite = holdfast::db::open_sqlite(&format!("sqlite://{}", path.display()), 16)
        .await
        .expect("sqlite");
    holdfast::participants::SQLITE_MIGRATOR
        .run(&sqlite)
        .await
        .expect("sqlite migrations");
    sqlite
}

/// The database a test's participant runs on: the same test code on both backends.
#[derive(Clone, Debug)]
pub enum Db {
    Postgres(PgPool),
    /// A fresh SQLite file in the temp folder.
    Sqlite(sqlx::SqlitePool),
}

impl Db {
    /// The test's PostgreSQL database, then a fresh SQLite file.
    pub async fn both(pool: &PgPool) -> [Db; 2] {
        [Db::Postgres(pool.clone()), Db::Sqlite(fresh_sqlite().await)]
    }

    /// The backend's name, for assertion messages.
    pub fn name(&self) -> &'static str {
        match self {
            Db::Postgres(_) => "postgres",
            Db::Sqlite(_) => "sqlite",
        }
    }

    /// The kinds that run on this backend (stock-redis is PostgreSQL-only).
    pub fn kinds(&self) -> Vec<Kind> {
        ALL.into_iter()
            .filter(|k| matches!(self, Db::Postgres(_)) || *k != Kind::StockRedis)
            .collect()
    }

    /// One integer from SQL valid on both backends.
    pub async fn scalar(&self, sql: &'static str) -> i64 {
        match self {
            Db::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
            Db::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
        }
        .expect(sql)
    }

    /// Runs `sql` with `arg` bound as `$1`, behind the participant's back (test-only faults).
    pub async fn execute(&self, sql: &'static str, arg: &str) -> u64 {
        match self {
            Db::Postgres(pool) => sqlx::query(sql)
                .bind(arg)
                .execute(pool)
                .await
                .map(|r| r.rows_affected()),
            Db::Sqlite(pool) => sqlx::query(sql)
                .bind(arg)
                .execute(pool)
                .await
                .map(|r| r.rows_affected()),
        }
        .expect(sql)
    }

    /// How many barrier rows a branch has (any participant).
    pub async fn barrier_rows(&self, branch_id: &str) -> i64 {
        const SQL: &str = "SELECT count(*) FROM tcc_barrier WHERE branch_id = $1";
        match self {
            Db::Postgres(pool) => {
                sqlx::query_scalar(SQL)
                    .bind(branch_id)
                    .fetch_one(pool)
                    .await
            }
            Db::Sqlite(pool) => {
                sqlx::query_scalar(SQL)
                    .bind(branch_id)
                    .fetch_one(pool)
                    .await
            }
        }
        .expect(SQL)
    }
}

/// Starts `kind` on `db` with the default orphan grace.
pub async fn spawn_on(kind: Kind, db: &Db) -> Running {
    match db {
        Db::Postgres(pool) => spawn_participant(kind, pool.clone()).await,
        Db::Sqlite(pool) => spawn_db(ParticipantSettings::new(kind), pool.clone().into()).await,
    }
}

/// Starts a participant with `settings` on either backend of `db`.
pub async fn spawn_settings_on(settings: ParticipantSettings, db: &Db) -> Running {
    match db {
        Db::Postgres(pool) => spawn_db(settings, pool.clone().into()).await,
        Db::Sqlite(pool) => spawn_db(settings, pool.clone().into()).await,
    }
}

/// A running participant and clients for it.
pub struct Running {
    pub url: String,
    pub participant: ParticipantClient<Channel>,
    pub admin: ResourceAdminClient<Channel>,
    pub payments: PaymentsClient<Channel>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), ParticipantError>>>,
    /// A stock-redis participant's (Redis URL, key prefix): its keys go when it stops.
    redis_keys: Option<(String, String)>,
}

/// Starts `kind` with the default orphan grace.
pub async fn spawn_participant(kind: Kind, pool: PgPool) -> Running {
    spawn_with(ParticipantSettings::new(kind), pool).await
}

/// Starts a participant with `settings` on a fresh loopback port.
pub async fn spawn_with(settings: ParticipantSettings, pool: PgPool) -> Running {
    spawn_db(settings, pool.into()).await
}

/// Starts a participant with `settings` on either backend, on a fresh loopback port.
pub async fn spawn_db(settings: ParticipantSettings, db: ParticipantDb) -> Running {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let (tx, rx) = oneshot::channel::<()>();
    let stop = async {
        let _ = rx.await;
    };
    let mut redis_keys = None;
    let task = match db {
        ParticipantDb::Postgres(pool) if settings.kind == Kind::StockRedis => {
            // Real Redis, isolated by a key prefix of its own.
            let mut redis = crate::stock_redis::settings();
            redis.orphan_grace = settings.orphan_grace;
            redis.max_hold = settings.max_hold;
            redis_keys = Some((redis.redis_url.clone(), redis.key_prefix.clone()));
            tokio::spawn(holdfast::participants::stock_redis::serve(
                redis, pool, listener, stop,
            ))
        }
        db => tokio::spawn(serve(settings, db, listener, stop)),
    };
    let channel = Channel::from_shared(url.clone())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    Running {
        url,
        participant: ParticipantClient::new(channel.clone()),
        admin: ResourceAdminClient::new(channel.clone()),
        payments: PaymentsClient::new(channel),
        shutdown: Some(tx),
        task: Some(task),
        redis_keys,
    }
}

impl Running {
    /// A new client on its own connection (for storms of independent clients).
    pub async fn new_client(&self) -> ParticipantClient<Channel> {
        ParticipantClient::connect(self.url.clone())
            .await
            .expect("connect")
    }

    /// Shuts the server down gracefully and checks it stopped without error.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("join").expect("serve");
        }
        if let Some((url, prefix)) = self.redis_keys.take() {
            holdfast::bench::deploy::delete_redis_keys(&url, &prefix)
                .await
                .expect("delete the test's Redis keys");
        }
    }

    pub async fn put(&mut self, resource: &str, capacity: i64) {
        self.admin
            .put_resources(PutResourcesRequest {
                resources: vec![ResourceSpec {
                    resource: resource.to_owned(),
                    capacity,
                }],
            })
            .await
            .expect("put resources");
    }

    pub async fn get(&mut self, resource: &str) -> ResourceStatus {
        self.admin
            .get_resource(GetResourceRequest {
                resource: resource.to_owned(),
            })
            .await
            .expect("get resource")
            .into_inner()
    }

    pub async fn try_(&mut self, req: TryRequest) -> TryResponse {
        self.participant.r#try(req).await.expect("try").into_inner()
    }

    pub async fn confirm(&mut self, branch: &TryRequest) -> branch::State {
        let state = self
            .participant
            .confirm(branch_request(branch))
            .await
            .expect("confirm")
            .into_inner()
            .state;
        branch::State::try_from(state).expect("state")
    }

    pub async fn cancel(&mut self, branch: &TryRequest) -> branch::State {
        let state = self
            .participant
            .cancel(branch_request(branch))
            .await
            .expect("cancel")
            .into_inner()
            .state;
        branch::State::try_from(state).expect("state")
    }
}

impl Running {
    /// Extend: moves `branch`'s deadline to `expires_at`; the state answered, or the error.
    pub async fn extend(
        &mut self,
        branch: &TryRequest,
        expires_at: prost_types::Timestamp,
    ) -> Result<branch::State, tonic::Status> {
        let state = self
            .participant
            .extend(extend_request(branch, expires_at))
            .await?
            .into_inner()
            .state;
        Ok(branch::State::try_from(state).expect("state"))
    }
}

/// The Extend of `req`'s branch to `expires_at`.
pub fn extend_request(
    req: &TryRequest,
    expires_at: prost_types::Timestamp,
) -> holdfast::proto::ExtendBranchRequest {
    holdfast::proto::ExtendBranchRequest {
        reservation_id: req.reservation_id.clone(),
        branch_id: req.branch_id.clone(),
        expires_at: Some(expires_at),
    }
}

pub fn branch_request(req: &TryRequest) -> BranchRequest {
    BranchRequest {
        reservation_id: req.reservation_id.clone(),
        branch_id: req.branch_id.clone(),
    }
}

pub fn outcome(resp: &TryResponse) -> try_response::Outcome {
    try_response::Outcome::try_from(resp.outcome).expect("outcome")
}

/// A timestamp `secs` from now (negative: in the past).
pub fn from_now(secs: i64) -> prost_types::Timestamp {
    let now = SystemTime::now();
    let at = if secs >= 0 {
        now + Duration::from_secs(secs as u64)
    } else {
        now - Duration::from_secs(secs.unsigned_abs())
    };
    at.into()
}

/// A fixed instant far in the future plus `minutes`, for slots.
pub fn future_at(minutes: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: 1_893_456_000 + minutes * 60,
        nanos: 0,
    }
}

pub fn slot(start: prost_types::Timestamp, end: prost_types::Timestamp) -> Option<Interval> {
    Some(Interval {
        start: Some(start),
        end: Some(end),
    })
}

pub fn hold(resource: &str, quantity: i64, during: Option<Interval>) -> Hold {
    Hold {
        participant: String::new(),
        resource: resource.to_owned(),
        quantity,
        during,
    }
}

/// A Try for a fresh branch expiring in ten minutes.
pub fn try_request(items: Vec<Hold>) -> TryRequest {
    TryRequest {
        reservation_id: uuid::Uuid::now_v7().to_string(),
        branch_id: uuid::Uuid::now_v7().to_string(),
        holder: "alice".to_owned(),
        items,
        expires_at: Some(from_now(600)),
    }
}

/// What one branch of a kind holds in the shared per-kind fixture, and on what resource.
pub struct Fixture {
    pub resource: &'static str,
    /// Capacity given to the resource (noop ignores it).
    pub capacity: i64,
    /// Units one branch holds.
    pub units: i64,
    /// Slot of the hold (rooms only); covers now, so the room's counts show it.
    pub during: Option<Interval>,
}

pub fn fixture(kind: Kind) -> Fixture {
    match kind {
        Kind::Seats => Fixture {
            resource: "A1",
            capacity: 1,
            units: 1,
            during: None,
        },
        Kind::Stock => Fixture {
            resource: "sku-1",
            capacity: 5,
            units: 2,
            during: None,
        },
        Kind::Rooms => Fixture {
            resource: "blue",
            capacity: 1,
            units: 1,
            during: slot(from_now(-3600), from_now(3600)),
        },
        Kind::Payments => Fixture {
            resource: "acct-1",
            capacity: 1000,
            units: 250,
            during: None,
        },
        Kind::StockRedis => Fixture {
            resource: "sku-1",
            capacity: 5,
            units: 2,
            during: None,
        },
        Kind::Noop => Fixture {
            resource: "anything",
            capacity: 0,
            units: 1,
            during: None,
        },
    }
}

impl Fixture {
    pub fn hold(&self) -> Hold {
        hold(self.resource, self.units, self.during)
    }

    /// (available, held, confirmed) expected of the fixture resource after `held` and
    /// `confirmed` branches. Noop counts branches and reports nothing available.
    pub fn expect(&self, kind: Kind, held: i64, confirmed: i64) -> (i64, i64, i64) {
        let (h, c) = (held * self.units, confirmed * self.units);
        match kind {
            Kind::Noop => (0, h, c),
            _ => (self.capacity - h - c, h, c),
        }
    }
}

pub async fn counts(p: &mut Running, resource: &str) -> (i64, i64, i64) {
    let s = p.get(resource).await;
    assert_eq!(
        s.capacity,
        s.available + s.held + s.confirmed,
        "invariant broken: {s:?}"
    );
    (s.available, s.held, s.confirmed)
}

/// Fires every request concurrently, each from its own client connection, while `check`
/// runs in a loop; the storm starts only after the first check passed, so checks overlap it.
/// Returns the answers (every call must succeed) and how many checks ran.
pub async fn storm<F, Fut>(
    p: &Running,
    requests: Vec<TryRequest>,
    check: F,
) -> (Vec<TryResponse>, usize)
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), String>> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let (started_tx, started_rx) = oneshot::channel::<()>();
    let checker = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut started = Some(started_tx);
            let mut runs = 0usize;
            loop {
                check().await?;
                runs += 1;
                if let Some(tx) = started.take() {
                    let _ = tx.send(());
                }
                if stop.load(Ordering::SeqCst) {
                    return Ok::<usize, String>(runs);
                }
            }
        })
    };
    started_rx.await.expect("checker started");
    let mut clients = Vec::with_capacity(requests.len());
    for _ in 0..requests.len() {
        clients.push(p.new_client().await);
    }
    // Every connection up before any call is sent: they start together.
    let start = Arc::new(tokio::sync::Barrier::new(requests.len()));
    let calls: Vec<_> = requests
        .into_iter()
        .zip(clients)
        .map(|(req, mut client)| {
            let start = start.clone();
            tokio::spawn(async move {
                start.wait().await;
                client.r#try(req).await
            })
        })
        .collect();
    let mut answers = Vec::with_capacity(calls.len());
    for call in calls {
        answers.push(
            call.await
                .expect("join")
                .expect("try must not fail")
                .into_inner(),
        );
    }
    stop.store(true, Ordering::SeqCst);
    let runs = checker
        .await
        .expect("join checker")
        .expect("invariant held during the storm");
    (answers, runs)
}

pub fn count(answers: &[TryResponse], wanted: try_response::Outcome) -> usize {
    answers.iter().filter(|a| outcome(a) == wanted).count()
}

/// Conservation against the capacity the test provisioned: the participant reports that
/// capacity, nothing is negative, and the units it can still hand out (`available`) plus the
/// units its hold rows say are out (`held`, `confirmed`) add up to it. Not a tautology for
/// counter kinds (`stock`, `payments`): capacity is stored as set, available is the counter,
/// held/confirmed are summed from the rows (`tests/participants/conservation.rs` shows a leaked
/// unit failing it).
pub fn conserved(s: &ResourceStatus, capacity: i64) -> Result<(), String> {
    if s.capacity != capacity
        || s.available < 0
        || s.held < 0
        || s.confirmed < 0
        || capacity != s.available + s.held + s.confirmed
    {
        return Err(format!(
            "conservation broken (provisioned capacity {capacity}): {s:?}"
        ));
    }
    Ok(())
}

/// A checker polling GetResource for `resource`: [`conserved`] against `capacity`.
pub fn admin_checker(
    p: &Running,
    resource: &'static str,
    capacity: i64,
) -> impl Fn() -> std::pin::Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + 'static
{
    let admin = p.admin.clone();
    move || {
        let mut admin = admin.clone();
        Box::pin(async move {
            let s = admin
                .get_resource(GetResourceRequest {
                    resource: resource.to_owned(),
                })
                .await
                .map_err(|e| e.to_string())?
                .into_inner();
            conserved(&s, capacity)?;
            Ok(())
        })
    }
}

/// Until a backend of this database waits for a lock while running a statement whose text
/// matches `pattern` (SQL `LIKE`), seen from `watcher` (a connection of the test's own: the
/// participant's may all be waiting): it has reached the wait the test set up.
pub async fn until_waiting(watcher: &mut sqlx::PgConnection, pattern: &str, what: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let found: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND wait_event_type = 'Lock' AND query LIKE $1",
        )
        .bind(pattern)
        .fetch_one(&mut *watcher)
        .await
        .unwrap();
        if found == 1 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} ({found} found)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
