//! Shared helpers: a real coordinator on a loopback port against a fresh Postgres database,
//! and small in-test participants (real tonic servers) that record every call and can be
//! told to reject, fail, stall or be down.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
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
use tonic::{Request, Response, Status};

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

/// Starts fakes named `names`, sharing one call log.
pub async fn spawn_fakes(names: &[&str]) -> Fakes {
    let log = CallLog::default();
    let mut by_name = HashMap::new();
    for name in names {
        by_name.insert((*name).to_owned(), spawn_fake(name, log.clone()).await);
    }
    Fakes { log, by_name }
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

/// One recorded participant call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub participant: String,
    pub method: &'static str,
    pub branch_id: String,
    pub resources: Vec<String>,
}

/// Every call to every fake of one test, in arrival order.
#[derive(Clone, Default)]
pub struct CallLog(Arc<Mutex<Vec<Call>>>);

impl CallLog {
    fn push(&self, call: Call) {
        self.0.lock().unwrap().push(call);
    }

    pub fn calls(&self) -> Vec<Call> {
        self.0.lock().unwrap().clone()
    }

    /// `participant.Method` strings, in order.
    pub fn summary(&self) -> Vec<String> {
        self.calls()
            .iter()
            .map(|c| format!("{}.{}", c.participant, c.method))
            .collect()
    }

    pub fn count(&self, participant: &str, method: &str) -> usize {
        self.calls()
            .iter()
            .filter(|c| c.participant == participant && c.method == method)
            .count()
    }
}

/// How a fake behaves; flip at any time.
#[derive(Default)]
pub struct Behaviour {
    /// Answer Try with REJECTED.
    pub reject: AtomicBool,
    /// Fail the next N Try calls with UNAVAILABLE (after recording them).
    pub fail_tries: AtomicUsize,
    /// Fail the next N Confirm calls with UNAVAILABLE.
    pub fail_confirms: AtomicUsize,
    /// Hold Try calls for 30 s (longer than any test's participant timeout).
    pub stall_tries: AtomicBool,
    /// Delay each Try by this many milliseconds.
    pub try_delay_ms: std::sync::atomic::AtomicU64,
    /// Hold Confirm calls for 30 s before applying them.
    pub stall_confirms: AtomicBool,
    /// Apply Confirm calls, then hold the answer for 30 s (the caller never hears it).
    pub stall_after_confirm: AtomicBool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FakeBranch {
    Held,
    Confirmed,
    Cancelled,
}

/// The business effects a fake applied, per branch id.
#[derive(Default)]
pub struct FakeState {
    pub branches: HashMap<String, (FakeBranch, Vec<String>)>,
    pub confirm_effects: usize,
    pub cancel_effects: usize,
}

struct Fake {
    name: String,
    log: CallLog,
    behaviour: Arc<Behaviour>,
    state: Arc<Mutex<FakeState>>,
}

pub struct FakeHandle {
    pub name: String,
    pub url: String,
    pub log: CallLog,
    pub behaviour: Arc<Behaviour>,
    pub state: Arc<Mutex<FakeState>>,
}

impl FakeHandle {
    /// Resources currently held (tried, neither confirmed nor cancelled).
    pub fn held(&self) -> Vec<String> {
        let st = self.state.lock().unwrap();
        let mut v: Vec<String> = st
            .branches
            .values()
            .filter(|(s, _)| *s == FakeBranch::Held)
            .flat_map(|(_, r)| r.clone())
            .collect();
        v.sort();
        v
    }

    pub fn effects(&self) -> (usize, usize) {
        let st = self.state.lock().unwrap();
        (st.confirm_effects, st.cancel_effects)
    }
}

pub struct Fakes {
    pub log: CallLog,
    pub by_name: HashMap<String, FakeHandle>,
}

impl Fakes {
    pub fn get(&self, name: &str) -> &FakeHandle {
        &self.by_name[name]
    }
}

#[tonic::async_trait]
impl proto::participant_server::Participant for Fake {
    async fn r#try(
        &self,
        request: Request<proto::TryRequest>,
    ) -> Result<Response<proto::TryResponse>, Status> {
        let req = request.into_inner();
        let resources: Vec<String> = req.items.iter().map(|h| h.resource.clone()).collect();
        self.log.push(Call {
            participant: self.name.clone(),
            method: "Try",
            branch_id: req.branch_id.clone(),
            resources: resources.clone(),
        });
        if self.behaviour.stall_tries.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        let delay = self.behaviour.try_delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if self
            .behaviour
            .fail_tries
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(Status::unavailable("fake participant failing on purpose"));
        }
        if self.behaviour.reject.load(Ordering::SeqCst) {
            return Ok(Response::new(proto::TryResponse {
                outcome: proto::try_response::Outcome::Rejected.into(),
                reason: "sold out".into(),
            }));
        }
        let mut st = self.state.lock().unwrap();
        // Cancel-before-Try leaves a tombstone: the late Try is a no-op rejection.
        if let Some((FakeBranch::Cancelled, _)) = st.branches.get(&req.branch_id) {
            return Ok(Response::new(proto::TryResponse {
                outcome: proto::try_response::Outcome::Rejected.into(),
                reason: "branch already cancelled".into(),
            }));
        }
        st.branches
            .entry(req.branch_id)
            .or_insert((FakeBranch::Held, resources));
        Ok(Response::new(proto::TryResponse {
            outcome: proto::try_response::Outcome::Held.into(),
            reason: String::new(),
        }))
    }

    async fn confirm(
        &self,
        request: Request<proto::BranchRequest>,
    ) -> Result<Response<proto::BranchResponse>, Status> {
        let req = request.into_inner();
        self.log.push(Call {
            participant: self.name.clone(),
            method: "Confirm",
            branch_id: req.branch_id.clone(),
            resources: vec![],
        });
        if self.behaviour.stall_confirms.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        if self
            .behaviour
            .fail_confirms
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(Status::unavailable("fake participant failing on purpose"));
        }
        let state = {
            let mut st = self.state.lock().unwrap();
            match st.branches.get(&req.branch_id).map(|(s, _)| *s) {
                Some(FakeBranch::Held) => {
                    st.confirm_effects += 1;
                    if let Some(b) = st.branches.get_mut(&req.branch_id) {
                        b.0 = FakeBranch::Confirmed;
                    }
                    proto::branch::State::Confirmed
                }
                Some(FakeBranch::Confirmed) => proto::branch::State::Confirmed,
                Some(FakeBranch::Cancelled) => proto::branch::State::Cancelled,
                None => proto::branch::State::HoldLost,
            }
        };
        if self.behaviour.stall_after_confirm.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        Ok(Response::new(proto::BranchResponse {
            state: state.into(),
        }))
    }

    async fn cancel(
        &self,
        request: Request<proto::BranchRequest>,
    ) -> Result<Response<proto::BranchResponse>, Status> {
        let req = request.into_inner();
        self.log.push(Call {
            participant: self.name.clone(),
            method: "Cancel",
            branch_id: req.branch_id.clone(),
            resources: vec![],
        });
        let mut st = self.state.lock().unwrap();
        let state = match st.branches.get(&req.branch_id).map(|(s, _)| *s) {
            Some(FakeBranch::Held) => {
                st.cancel_effects += 1;
                if let Some(b) = st.branches.get_mut(&req.branch_id) {
                    b.0 = FakeBranch::Cancelled;
                }
                proto::branch::State::Cancelled
            }
            Some(FakeBranch::Confirmed) => proto::branch::State::Confirmed,
            Some(FakeBranch::Cancelled) => proto::branch::State::Cancelled,
            None => {
                st.branches
                    .insert(req.branch_id, (FakeBranch::Cancelled, vec![]));
                proto::branch::State::Cancelled
            }
        };
        Ok(Response::new(proto::BranchResponse {
            state: state.into(),
        }))
    }
}

/// Starts a fake participant on 127.0.0.1:0.
pub async fn spawn_fake(name: &str, log: CallLog) -> FakeHandle {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = FakeHandle {
        name: name.to_owned(),
        url: format!("http://{addr}"),
        log,
        behaviour: Arc::new(Behaviour::default()),
        state: Arc::new(Mutex::new(FakeState::default())),
    };
    handle.serve(listener);
    handle
}

impl FakeHandle {
    fn serve(&self, listener: TcpListener) {
        let fake = Fake {
            name: self.name.clone(),
            log: self.log.clone(),
            behaviour: self.behaviour.clone(),
            state: self.state.clone(),
        };
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(proto::participant_server::ParticipantServer::new(fake))
                .add_service(tonic_health::server::health_reporter().1)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
    }
}

/// A TCP relay in front of a server, standing for the network: `cut` drops every connection
/// and refuses new ones (an outage, as the client sees it); `restore` accepts again.
pub struct Relay {
    pub url: String,
    addr: SocketAddr,
    target: SocketAddr,
    tasks: Mutex<Option<tokio::task::JoinSet<()>>>,
}

impl Relay {
    pub async fn start(target_url: &str) -> Relay {
        let target: SocketAddr = target_url.trim_start_matches("http://").parse().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let relay = Relay {
            url: format!("http://{addr}"),
            addr,
            target,
            tasks: Mutex::new(None),
        };
        relay.accept(listener);
        relay
    }

    fn accept(&self, listener: TcpListener) {
        let target = self.target;
        let mut set = tokio::task::JoinSet::new();
        set.spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((mut inbound, _)) = listener.accept().await {
                conns.spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        *self.tasks.lock().unwrap() = Some(set);
    }

    /// Drops every connection and stops listening.
    pub async fn cut(&self) {
        let tasks = self.tasks.lock().unwrap().take();
        if let Some(mut set) = tasks {
            set.shutdown().await;
        }
    }

    /// Listens again on the same address.
    pub async fn restore(&self) {
        let listener = TcpListener::bind(self.addr).await.unwrap();
        self.accept(listener);
    }
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

pub fn hold(participant: &str, resource: &str) -> proto::Hold {
    proto::Hold {
        participant: participant.into(),
        resource: resource.into(),
        quantity: 1,
        during: None,
    }
}

pub fn reserve_request(request_id: &str, holds: Vec<proto::Hold>) -> proto::ReserveRequest {
    proto::ReserveRequest {
        request_id: request_id.into(),
        holder: "user-1".into(),
        ttl: None,
        holds,
        labels: Default::default(),
    }
}

pub fn state_of(r: &proto::Reservation) -> proto::reservation::State {
    proto::reservation::State::try_from(r.state).unwrap()
}

/// The ErrorInfo reason of an error status (and checks its domain).
pub fn reason(status: &Status) -> String {
    use tonic_types::StatusExt;
    let info = status
        .get_details_error_info()
        .unwrap_or_else(|| panic!("no ErrorInfo in {status:?}"));
    assert_eq!(info.domain, "tcc.v1");
    info.reason
}

pub fn error_metadata(status: &Status) -> HashMap<String, String> {
    use tonic_types::StatusExt;
    status.get_details_error_info().unwrap().metadata
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
        .put_resources(proto::PutResourcesRequest {
            resources: resources
                .iter()
                .map(|(r, c)| proto::ResourceSpec {
                    resource: (*r).to_owned(),
                    capacity: *c,
                })
                .collect(),
        })
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
