//! The system under test: the real seats and stock participants (in this process, on the
//! test database), a TCP relay in front of each (the network the plan cuts), and a coordinator
//! in a runtime of its own (killed by dropping that runtime, as a crash would).

use std::net::SocketAddr;
use std::time::Duration;

use holdfast::app::{self, CoordinatorSettings};
use holdfast::coordinator::Policy;
use holdfast::domain::policy::Backoff;
use holdfast::domain::validate::Limits;
use holdfast::participants::{self, Kind, ParticipantSettings};
use holdfast::proto;
use holdfast::proto::coordinator_client::CoordinatorClient;
use holdfast::proto::resource_admin_client::ResourceAdminClient;
use holdfast::registry::ParticipantEndpoint;
use holdfast::store::PgStore;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tonic::transport::Channel;

use crate::relay::Relay;

pub struct Participant {
    pub name: &'static str,
    /// Direct, for the checks (never cut).
    pub admin: ResourceAdminClient<Channel>,
    /// What the coordinator dials.
    pub relay: Relay,
}

pub struct Stack {
    pub pool: PgPool,
    pub participants: Vec<Participant>,
    participants_pool: PgPool,
}

impl Stack {
    pub async fn start(pool: PgPool) -> Stack {
        let participants_pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(6)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with((*pool.connect_options()).clone())
            .await
            .expect("participants' pool");
        participants::MIGRATOR
            .run(&participants_pool)
            .await
            .expect("participants' migrations");
        let mut list = Vec::new();
        for (name, kind) in [("seats", Kind::Seats), ("stock", Kind::Stock)] {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let url = format!("http://{}", listener.local_addr().expect("addr"));
            tokio::spawn(participants::serve(
                ParticipantSettings::new(kind),
                participants_pool.clone(),
                listener,
                std::future::pending(),
            ));
            let admin = ResourceAdminClient::connect(url.clone())
                .await
                .expect("participant admin");
            let relay = Relay::start(&url).await;
            list.push(Participant { name, admin, relay });
        }
        Stack {
            pool,
            participants: list,
            participants_pool,
        }
    }

    /// Closes the participants' connections, so the test database can be dropped.
    pub async fn stop(self) {
        self.participants_pool.close().await;
    }

    pub fn participant(&self, name: &str) -> &Participant {
        self.participants
            .iter()
            .find(|p| p.name == name)
            .expect("a participant of the stack")
    }

    pub fn settings(&self) -> CoordinatorSettings {
        let policy = Policy {
            lease: Duration::from_secs(3),
            sweep_interval: Duration::from_millis(100),
            backoff: Backoff {
                base: Duration::from_millis(50),
                cap: Duration::from_millis(500),
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
            access: holdfast::app::CoordinatorAccess::default(),
        }
    }

    pub async fn resource(&self, participant: &str, resource: &str) -> proto::ResourceStatus {
        let mut admin = self.participant(participant).admin.clone();
        admin
            .get_resource(proto::GetResourceRequest {
                resource: resource.to_owned(),
            })
            .await
            .unwrap_or_else(|e| panic!("GetResource {participant}/{resource}: {e}"))
            .into_inner()
    }

    pub async fn put(&self, participant: &str, resources: &[(String, i64)]) {
        let mut admin = self.participant(participant).admin.clone();
        admin
            .put_resources(proto::PutResourcesRequest {
                resources: resources
                    .iter()
                    .map(|(r, c)| proto::ResourceSpec {
                        resource: r.clone(),
                        capacity: *c,
                    })
                    .collect(),
            })
            .await
            .unwrap_or_else(|e| panic!("PutResources at {participant}: {e}"));
    }
}

/// A coordinator in its own runtime and pool (4 connections).
pub struct Coordinator {
    pub addr: SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Coordinator {
    pub async fn start(pool: &PgPool, settings: CoordinatorSettings) -> Coordinator {
        let options = (*pool.connect_options()).clone();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a coordinator runtime");
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        std_listener.set_nonblocking(true).expect("nonblocking");
        let addr = std_listener.local_addr().expect("addr");
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        runtime.spawn(async move {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(4)
                .acquire_timeout(Duration::from_secs(5))
                .connect_with(options)
                .await
                .expect("coordinator pool");
            let store = PgStore::from_pool(pool);
            store.migrate().await.expect("coordinator migrations");
            let listener = TcpListener::from_std(std_listener).expect("listener");
            let _ = ready_tx.send(());
            let _ = app::serve_coordinator(settings, store, listener, std::future::pending()).await;
        });
        ready_rx.await.expect("coordinator started");
        Coordinator {
            addr,
            runtime: Some(runtime),
        }
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
