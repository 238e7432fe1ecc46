//! Shared helpers: a real coordinator on a loopback port against a fresh Postgres database
//! (also one in a runtime of its own that a test can kill like a crash), the real reference
//! participants by URL, and - in the files below - small in-test participants that record every
//! call and can be told to reject, fail, stall or be down (`fakes`), a TCP relay that cuts the
//! network (`relay`), a pass-through that logs what a real participant is sent (`tap`), and
//! the requests the tests send and how they read the answers (`requests`).
//!
//! `tests/store` includes this folder too, for its coordinator-on-SQLite smoke test.

mod fakes;
mod latency;
mod payments;
mod relay;
mod requests;
mod tap;

pub use fakes::*;
pub use latency::pool_at_distance;
pub use payments::*;
pub use relay::Relay;
pub use requests::*;
pub use tap::spawn_tap;

use std::net::SocketAddr;
use std::time::Duration;

use holdfast::app::{self, CoordinatorSettings};
use holdfast::coordinator::Policy;
use holdfast::domain::validate::Limits;
use holdfast::proto;
use holdfast::proto::coordinator_client::CoordinatorClient;
use holdfast::registry::ParticipantEndpoint;
use holdfast::store::PgStore;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::transport::Channel;

/// A running coordinator.
pub struct TestApp {
    pub client: CoordinatorClient<Channel>,
    pub addr: SocketAddr,
    pub pool: PgPool,
    shutdown: Option<oneshot::Sender<()>>,
}

impl TestApp {
    /// Asks the server to shut down gracefully (as SIGTERM does).
    pub fn shut_down(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

pub fn settings(participants: &[(&str, &str)]) -> CoordinatorSettings {
    CoordinatorSettings {
        participants: participants
            .iter()
            .map(|(name, url)| ParticipantEndpoint {
                name: (*name).to_owned(),
                url: (*url).to_owned(),
                timeout: Duration::from_secs(2),
            })
            .collect(),
        limits: Limits::default(),
        policy: Policy::default(),
        server: holdfast::server::ServerLimits::default(),
        participant_transport: holdfast::tls::ParticipantTransport::default(),
        access: holdfast::app::CoordinatorAccess::default(),
    }
}

/// Starts the coordinator on 127.0.0.1:0 against `pool` (a fresh database per test).
pub async fn spawn_app(pool: PgPool, settings: CoordinatorSettings) -> TestApp {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = oneshot::channel::<()>();
    let store = PgStore::from_pool(pool.clone());
    // Migrate before serving so the first request never races the schema.
    store.migrate().await.unwrap();
    tokio::spawn(async move {
        app::serve_coordinator(settings, store, listener, async {
            let _ = rx.await;
        })
        .await
        .unwrap();
    });
    let client = CoordinatorClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    TestApp {
        client,
        addr,
        pool,
        shutdown: Some(tx),
    }
}

/// Starts a coordinator whose participants are `names` as fakes sharing one call log.
pub async fn spawn_with_fakes(pool: PgPool, names: &[&str]) -> (TestApp, Fakes) {
    let fakes = spawn_fakes(names).await;
    let urls: Vec<(String, String)> = fakes
        .by_name
        .iter()
        .map(|(n, f)| (n.clone(), f.url.clone()))
        .collect();
    let pairs: Vec<(&str, &str)> = urls.iter().map(|(n, u)| (n.as_str(), u.as_str())).collect();
    let app = spawn_app(pool, settings(&pairs)).await;
    (app, fakes)
}

/// A coordinator in its own runtime, so a test can kill it the way a crash would: every task
/// (RPCs in flight, recovery) stops at once, mid-step, with nothing cleaned up.
pub struct KillableApp {
    pub addr: SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
}

impl KillableApp {
    pub async fn client(&self) -> CoordinatorClient<Channel> {
        CoordinatorClient::connect(format!("http://{}", self.addr))
            .await
            .unwrap()
    }

    pub fn kill(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for KillableApp {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts a coordinator on its own runtime and connection pool against `pool`'s database.
pub async fn spawn_killable(pool: &PgPool, settings: CoordinatorSettings) -> KillableApp {
    let options = (*pool.connect_options()).clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    std_listener.set_nonblocking(true).unwrap();
    let addr = std_listener.local_addr().unwrap();
    let (ready_tx, ready_rx) = oneshot::channel();
    runtime.spawn(async move {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(8)
            .connect_with(options)
            .await
            .unwrap();
        let store = PgStore::from_pool(pool);
        store.migrate().await.unwrap();
        let listener = TcpListener::from_std(std_listener).unwrap();
        let _ = ready_tx.send(());
        app::serve_coordinator(settings, store, listener, std::future::pending())
            .await
            .unwrap();
    });
    ready_rx.await.unwrap();
    KillableApp {
        addr,
        runtime: Some(runtime),
    }
}

/// A URL where nothing listens.
pub async fn closed_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    url
}

/// Starts a real reference participant on 127.0.0.1:0 against the test database; its URL.
pub async fn spawn_participant(kind: holdfast::participants::Kind, pool: &PgPool) -> String {
    spawn_participant_with(holdfast::participants::ParticipantSettings::new(kind), pool).await
}

/// Like [`spawn_participant`], with explicit settings.
pub async fn spawn_participant_with(
    settings: holdfast::participants::ParticipantSettings,
    pool: &PgPool,
) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let pool = pool.clone();
    tokio::spawn(async move {
        holdfast::participants::serve(settings, pool, listener, std::future::pending())
            .await
            .unwrap();
    });
    url
}

/// A ResourceAdmin client.
pub async fn admin(url: &str) -> proto::resource_admin_client::ResourceAdminClient<Channel> {
    proto::resource_admin_client::ResourceAdminClient::connect(url.to_owned())
        .await
        .unwrap()
}

/// Creates or resizes resources at a participant.
pub async fn put_resources(url: &str, resources: &[(&str, i64)]) {
    admin(url)
        .await
        .put_resources(put_resources_request(resources))
        .await
        .unwrap();
}

/// A resource's counts at a participant.
pub async fn resource(url: &str, name: &str) -> proto::ResourceStatus {
    admin(url)
        .await
        .get_resource(proto::GetResourceRequest {
            resource: name.to_owned(),
        })
        .await
        .unwrap()
        .into_inner()
}
