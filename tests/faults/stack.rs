//! The system under test: the real seats, stock, rooms, payments and stock-redis participants
//! (in this process, on the test database and the local Redis), each in a runtime of its own
//! on a fixed port (killed by dropping that runtime, restarted on the same port and database),
//! a TCP relay in front of each (the network the plan cuts), and a coordinator in a runtime of
//! its own (killed the same way, as a crash would) whose Postgres backends carry an
//! application name, so the plan can terminate exactly those.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use holdfast::app::{self, CoordinatorSettings};
use holdfast::coordinator::Policy;
use holdfast::domain::policy::Backoff;
use holdfast::domain::validate::Limits;
use holdfast::participants::stock_redis::{self, StockRedisSettings};
use holdfast::participants::{self, Kind, ParticipantSettings};
use holdfast::proto;
use holdfast::proto::coordinator_client::CoordinatorClient;
use holdfast::proto::payments_client::PaymentsClient;
use holdfast::proto::resource_admin_client::ResourceAdminClient;
use holdfast::registry::ParticipantEndpoint;
use holdfast::store::PgStore;
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;
use tokio::net::TcpListener;
use tonic::transport::Channel;

use crate::relay::Relay;

/// The application name of the coordinators' Postgres connections (what
/// [`Stack::terminate_coordinator_backends`] terminates, in this test's database only).
pub const COORDINATOR_APP: &str = "holdfast-faults-coordinator";

/// Every participant of the stack, in the order the plan indexes them.
pub const KINDS: [Kind; 5] = [
    Kind::Seats,
    Kind::Stock,
    Kind::Rooms,
    Kind::Payments,
    Kind::StockRedis,
];

pub fn redis_url() -> String {
    std::env::var("HOLDFAST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

pub struct Participant {
    pub name: &'static str,
    pub kind: Kind,
    /// Where it listens, the same across restarts.
    pub addr: SocketAddr,
    /// Direct, for the checks (never cut).
    pub admin: ResourceAdminClient<Channel>,
    /// What the coordinator dials.
    pub relay: Relay,
    options: PgConnectOptions,
    redis_prefix: String,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
}

impl Participant {
    async fn start(kind: Kind, options: PgConnectOptions, redis_prefix: String) -> Participant {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let url = format!("http://{addr}");
        let participant = Participant {
            name: kind.name(),
            kind,
            addr,
            admin: ResourceAdminClient::new(lazy(&url)),
            relay: Relay::start(&url).await,
            options,
            redis_prefix,
            runtime: Mutex::new(None),
        };
        participant.run(listener).await;
        participant
    }

    /// Serves on `listener` in a fresh runtime with a fresh pool; returns once it serves.
    async fn run(&self, listener: std::net::TcpListener) {
        listener.set_nonblocking(true).expect("nonblocking");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a participant runtime");
        let (kind, options, prefix) = (self.kind, self.options.clone(), self.redis_prefix.clone());
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        runtime.spawn(async move {
            // As the binary opens it (`db::open_postgres`), a connection never dialled yet.
            let pool = holdfast::db::postgres_pool_options(3, holdfast::db::CHECK_IDLE_AFTER)
                .connect_lazy_with(options);
            let listener = TcpListener::from_std(listener).expect("listener");
            let _ = ready_tx.send(());
            let served = if kind == Kind::StockRedis {
                let mut s = StockRedisSettings::new(redis_url());
                s.key_prefix = prefix;
                s.reconcile_every = Duration::from_millis(500);
                stock_redis::serve(s, pool, listener, std::future::pending()).await
            } else {
                participants::serve(
                    ParticipantSettings::new(kind),
                    pool,
                    listener,
                    std::future::pending(),
                )
                .await
            };
            if let Err(e) = served {
                eprintln!("faults: participant {kind:?} stopped: {e}");
            }
        });
        ready_rx.await.expect("participant started");
        *self.runtime.lock().unwrap_or_else(|e| e.into_inner()) = Some(runtime);
    }

    /// Kills it: every task stops mid-step, its connections drop (Postgres rolls back).
    pub fn kill(&self) {
        if let Some(rt) = self
            .runtime
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            rt.shutdown_background();
        }
    }

    /// Starts it again on the same port and database (the port may take a moment to free).
    pub async fn restart(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let listener = loop {
            match std::net::TcpListener::bind(self.addr) {
                Ok(l) => break l,
                Err(e) if Instant::now() > deadline => {
                    panic!("rebinding {} for {}: {e}", self.addr, self.name)
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        self.run(listener).await;
    }
}

impl Drop for Participant {
    fn drop(&mut self) {
        self.kill();
    }
}

fn lazy(url: &str) -> Channel {
    tonic::transport::Endpoint::from_shared(url.to_owned())
        .expect("url")
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(5))
        .connect_lazy()
}

pub struct Stack {
    pub pool: PgPool,
    pub participants: Vec<Participant>,
    /// Direct to the payments participant: Charge and GetPayment.
    pub payments: PaymentsClient<Channel>,
    pub redis_prefix: String,
    /// One token key for every coordinator of the stack, as replicas deployed with one
    /// `--token-secret-file` share it (an ephemeral key per process would answer a repeated
    /// Reserve after a kill without its token, by design).
    tokens: holdfast::domain::TokenKeys,
    /// The webhook every coordinator of the stack delivers the event log to.
    pub events: crate::sink::EventReceiver,
}

impl Stack {
    pub async fn start(pool: PgPool) -> Stack {
        participants::MIGRATOR
            .run(&pool)
            .await
            .expect("participants' migrations");
        let redis_prefix = format!("hf:faults:{}:", uuid::Uuid::new_v4().simple());
        let options = (*pool.connect_options()).clone();
        let mut list = Vec::new();
        for kind in KINDS {
            list.push(Participant::start(kind, options.clone(), redis_prefix.clone()).await);
        }
        let payments_url = format!(
            "http://{}",
            list.iter()
                .find(|p| p.kind == Kind::Payments)
                .expect("payments")
                .addr
        );
        Stack {
            pool,
            participants: list,
            payments: PaymentsClient::new(lazy(&payments_url)),
            redis_prefix,
            tokens: holdfast::domain::TokenKeys::ephemeral().expect("a token key"),
            events: crate::sink::EventReceiver::start().await,
        }
    }

    /// Stops the participants (their connections close, so the test database can be
    /// dropped) and deletes this stack's Redis keys.
    pub async fn stop(self) {
        for p in &self.participants {
            p.kill();
        }
        if let Ok(client) = redis::Client::open(redis_url())
            && let Ok(mut conn) = client.get_multiplexed_async_connection().await
        {
            let _: Result<i64, _> = redis::Script::new(
                "local ks = redis.call('KEYS', ARGV[1]) \
                 for _, k in ipairs(ks) do redis.call('DEL', k) end return #ks",
            )
            .arg(format!("{}*", self.redis_prefix))
            .invoke_async(&mut conn)
            .await;
        }
        // The killed runtimes' connections close as their tasks are dropped.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    pub fn participant(&self, name: &str) -> &Participant {
        self.participants
            .iter()
            .find(|p| p.name == name)
            .expect("a participant of the stack")
    }

    pub fn settings(&self, late_refund: bool) -> CoordinatorSettings {
        let policy = Policy {
            lease: Duration::from_secs(3),
            sweep_interval: Duration::from_millis(100),
            backoff: Backoff {
                base: Duration::from_millis(50),
                cap: Duration::from_millis(500),
            },
            late_payment: if late_refund {
                holdfast::domain::LatePaymentPolicy::Refund
            } else {
                holdfast::domain::LatePaymentPolicy::HonorIfAvailable
            },
            ..Policy::default()
        };
        CoordinatorSettings {
            participants: self
                .participants
                .iter()
                .map(|p| ParticipantEndpoint {
                    name: p.name.to_owned(),
                    url: p.relay.url.clone(),
                    timeout: Duration::from_secs(1),
                })
                .collect(),
            limits: Limits::default(),
            policy,
            server: holdfast::server::ServerLimits::default(),
            participant_transport: holdfast::tls::ParticipantTransport::default(),
            access: holdfast::app::CoordinatorAccess {
                tokens: Some(self.tokens.clone()),
                ..holdfast::app::CoordinatorAccess::default()
            },
        }
    }

    /// The resource's counts, or `None` while its participant is down (killed, restarting).
    pub async fn try_resource(
        &self,
        participant: &str,
        resource: &str,
    ) -> Result<proto::ResourceStatus, tonic::Status> {
        let mut admin = self.participant(participant).admin.clone();
        admin
            .get_resource(proto::GetResourceRequest {
                resource: resource.to_owned(),
            })
            .await
            .map(|r| r.into_inner())
    }

    pub async fn resource(&self, participant: &str, resource: &str) -> proto::ResourceStatus {
        self.try_resource(participant, resource)
            .await
            .unwrap_or_else(|e| panic!("GetResource {participant}/{resource}: {e}"))
    }

    pub async fn put(&self, participant: &str, resources: &[(String, i64)]) {
        let mut admin = self.participant(participant).admin.clone();
        let request = proto::PutResourcesRequest {
            resources: resources
                .iter()
                .map(|(r, c)| proto::ResourceSpec {
                    resource: r.clone(),
                    capacity: *c,
                })
                .collect(),
        };
        // stock-redis answers UNAVAILABLE while it (re)builds its data set after a start.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match admin.put_resources(request.clone()).await {
                Ok(_) => return,
                Err(e) if Instant::now() > deadline => {
                    panic!("PutResources at {participant}: {e}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// Terminates the coordinators' Postgres backends, and only theirs: of this test's
    /// database (the server is shared with parallel tests) and with [`COORDINATOR_APP`].
    pub async fn terminate_coordinator_backends(&self) -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND application_name = $1) t",
        )
        .bind(COORDINATOR_APP)
        .fetch_one(&self.pool)
        .await
        .unwrap_or_else(|e| panic!("pg_terminate_backend: {e}"))
    }
}

/// A coordinator in its own runtime and pool (4 connections).
pub struct Coordinator {
    pub addr: SocketAddr,
    restarts: Arc<AtomicU32>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Coordinator {
    /// Starts one on `pool`'s database, delivering its events to the webhook at `events_url`.
    pub async fn start(
        pool: &PgPool,
        settings: CoordinatorSettings,
        events_url: &str,
    ) -> Coordinator {
        let events_url = events_url.to_owned();
        let options = (*pool.connect_options())
            .clone()
            .application_name(COORDINATOR_APP);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a coordinator runtime");
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        std_listener.set_nonblocking(true).expect("nonblocking");
        let addr = std_listener.local_addr().expect("addr");
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let restarts = Arc::new(AtomicU32::new(0));
        let restarted = restarts.clone();
        runtime.spawn(async move {
            let mut ready_tx = Some(ready_tx);
            // A supervisor: a coordinator that exits (its start-up migration check failed
            // because the plan terminated its backend, say) is started again, as a process
            // manager would, on the same listening socket.
            loop {
                let pool = holdfast::db::postgres_pool_options(4, holdfast::db::CHECK_IDLE_AFTER)
                    .connect_with(options.clone())
                    .await;
                let exited = match pool {
                    Ok(pool) => {
                        let store = PgStore::from_pool(pool);
                        let listener = std_listener
                            .try_clone()
                            .and_then(TcpListener::from_std)
                            .expect("listener");
                        if let Some(tx) = ready_tx.take() {
                            let _ = tx.send(());
                        }
                        let beside = app::Beside {
                            http: None,
                            sinks: vec![crate::sink::EventReceiver::sink(&events_url)],
                        };
                        app::serve_coordinator_beside(
                            settings.clone(),
                            store,
                            listener,
                            beside,
                            std::future::pending(),
                        )
                        .await
                        .map_err(|e| e.to_string())
                    }
                    Err(e) => Err(e.to_string()),
                };
                eprintln!("faults: the coordinator exited ({exited:?}); starting it again");
                restarted.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        ready_rx.await.expect("coordinator started");
        Coordinator {
            addr,
            restarts,
            runtime: Some(runtime),
        }
    }

    /// How many times it exited and was started again (a store error it did not survive).
    #[allow(dead_code)] // read by tests/ha, which shares this file
    pub fn restarts(&self) -> u32 {
        self.restarts.load(Ordering::SeqCst)
    }

    pub fn kill(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        self.kill();
    }
}

pub async fn client(addr: SocketAddr) -> Option<CoordinatorClient<Channel>> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .ok()?
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(5));
    Some(CoordinatorClient::new(endpoint.connect_lazy()))
}
