//! The real stack for end-to-end tests: the reference participants (seats, stock, rooms,
//! payments) started with the production `holdfast::participants::serve` on loopback ports,
//! against the test's own database, and a coordinator registered with them over gRPC.

use std::time::{Duration, Instant};

use holdfast::app::CoordinatorSettings;
use holdfast::participants::{self, Kind, ParticipantError, ParticipantSettings};
use holdfast::proto;
use holdfast::proto::coordinator_client::CoordinatorClient;
use holdfast::proto::resource_admin_client::ResourceAdminClient;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use crate::common::{TestApp, proto_duration, put_resources_request, settings, spawn_app};

/// The participants of the end-to-end stack, each registered under its kind's name.
pub const KINDS: [Kind; 4] = [Kind::Seats, Kind::Stock, Kind::Rooms, Kind::Payments];

/// Upper bound of every polling loop in these tests.
pub const PATIENCE: Duration = Duration::from_secs(20);

struct RealParticipant {
    kind: Kind,
    admin: ResourceAdminClient<Channel>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), ParticipantError>>>,
}

/// A coordinator and the real participants, all on loopback, all on one test database.
pub struct Stack {
    pub app: TestApp,
    participants: Vec<RealParticipant>,
    participants_pool: PgPool,
    /// The capacity each resource was given by [`Stack::put`], by (kind, resource): what
    /// [`Stack::counts`] checks the participants' reports against.
    provisioned: std::sync::Mutex<std::collections::HashMap<(&'static str, String), i64>>,
}

/// Starts the stack with the suite's default coordinator settings, except a participant
/// deadline (10 s) long enough for storms of concurrent Tries on two shared cores.
pub async fn spawn_stack(pool: PgPool) -> Stack {
    spawn_stack_with(pool, |_| {}).await
}

/// Starts the stack (see [`spawn_stack`]); `tweak` may adjust the coordinator's settings.
pub async fn spawn_stack_with(pool: PgPool, tweak: impl FnOnce(&mut CoordinatorSettings)) -> Stack {
    // The participants get their own pool on the same database: the test pool is small
    // (5 connections) and the coordinator must not starve them, or they it.
    let participants_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(12)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with((*pool.connect_options()).clone())
        .await
        .expect("participants' pool on the test database");
    // Apply the participants' schema once, before four servers would each try to.
    participants::MIGRATOR
        .run(&participants_pool)
        .await
        .expect("participants' migrations");

    let mut running = Vec::new();
    let mut endpoints = Vec::new();
    for kind in KINDS {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a participant");
        let url = format!("http://{}", listener.local_addr().expect("local addr"));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(participants::serve(
            ParticipantSettings::new(kind),
            participants_pool.clone(),
            listener,
            async {
                let _ = stopped.await;
            },
        ));
        let admin = ResourceAdminClient::connect(url.clone())
            .await
            .expect("connect to a participant's ResourceAdmin");
        running.push(RealParticipant {
            kind,
            admin,
            stop: Some(stop),
            task: Some(task),
        });
        endpoints.push((kind.name(), url));
    }

    let pairs: Vec<(&str, &str)> = endpoints.iter().map(|(n, u)| (*n, u.as_str())).collect();
    let mut settings = settings(&pairs);
    for p in &mut settings.participants {
        p.timeout = Duration::from_secs(10);
    }
    tweak(&mut settings);
    let app = spawn_app(pool, settings).await;
    Stack {
        app,
        participants: running,
        participants_pool,
        provisioned: Default::default(),
    }
}

impl Stack {
    fn participant(&self, kind: Kind) -> &RealParticipant {
        self.participants
            .iter()
            .find(|p| p.kind == kind)
            .unwrap_or_else(|| panic!("{} is not part of the stack", kind.name()))
    }

    /// The coordinator client of the stack (one shared connection).
    pub fn client(&self) -> CoordinatorClient<Channel> {
        self.app.client.clone()
    }

    /// A coordinator client on its own connection, for storms of independent clients.
    pub async fn new_client(&self) -> CoordinatorClient<Channel> {
        CoordinatorClient::connect(format!("http://{}", self.app.addr))
            .await
            .expect("connect to the coordinator")
    }

    /// Creates or resizes resources of `kind` through `tcc.v1.ResourceAdmin/PutResources`.
    pub async fn put(&self, kind: Kind, resources: &[(&str, i64)]) {
        let answer = self
            .participant(kind)
            .admin
            .clone()
            .put_resources(put_resources_request(resources))
            .await
            .unwrap_or_else(|e| panic!("PutResources on {}: {e:?}", kind.name()))
            .into_inner();
        assert_eq!(answer.resources.len(), resources.len(), "{answer:?}");
        let mut provisioned = self.provisioned.lock().expect("provisioned");
        for (resource, capacity) in resources {
            provisioned.insert((kind.name(), (*resource).to_owned()), *capacity);
        }
    }

    /// `GetResource` of `resource` on `kind`.
    pub async fn status(&self, kind: Kind, resource: &str) -> proto::ResourceStatus {
        self.participant(kind)
            .admin
            .clone()
            .get_resource(proto::GetResourceRequest {
                resource: resource.to_owned(),
            })
            .await
            .unwrap_or_else(|e| panic!("GetResource {}/{resource}: {e:?}", kind.name()))
            .into_inner()
    }

    /// (available, held, confirmed) of `resource` on `kind`; checks
    /// `capacity = available + held + confirmed` against the capacity [`Stack::put`] gave it
    /// (stock and payments store it and sum held/confirmed from their rows, so this can fail)
    /// and that nothing is negative.
    pub async fn counts(&self, kind: Kind, resource: &str) -> (i64, i64, i64) {
        let s = self.status(kind, resource).await;
        let provisioned = self
            .provisioned
            .lock()
            .expect("provisioned")
            .get(&(kind.name(), resource.to_owned()))
            .copied();
        if let Some(capacity) = provisioned {
            assert_eq!(
                s.capacity,
                capacity,
                "{}/{resource}: capacity reported is not the capacity provisioned: {s:?}",
                kind.name()
            );
        }
        assert_eq!(
            s.capacity,
            s.available + s.held + s.confirmed,
            "invariant broken on {}/{resource}: {s:?}",
            kind.name()
        );
        assert!(
            s.available >= 0 && s.held >= 0 && s.confirmed >= 0,
            "negative count on {}/{resource}: {s:?}",
            kind.name()
        );
        (s.available, s.held, s.confirmed)
    }

    /// Polls the counts of `resource` until they equal `want`, at most [`PATIENCE`].
    pub async fn wait_counts(&self, kind: Kind, resource: &str, want: (i64, i64, i64)) {
        let mut last = (0, 0, 0);
        let reached = poll_until(async || {
            last = self.counts(kind, resource).await;
            last == want
        })
        .await;
        assert!(
            reached,
            "{}/{resource}: counts (available, held, confirmed) stayed {last:?}, expected {want:?}",
            kind.name()
        );
    }

    /// `GetReservation`.
    pub async fn get(&self, id: &str) -> proto::Reservation {
        self.client()
            .get_reservation(proto::GetReservationRequest {
                reservation_id: id.to_owned(),
            })
            .await
            .unwrap_or_else(|e| panic!("GetReservation {id}: {e:?}"))
            .into_inner()
    }

    /// Polls `GetReservation` until the reservation is in `want`, at most [`PATIENCE`];
    /// returns it.
    pub async fn wait_state(
        &self,
        id: &str,
        want: proto::reservation::State,
    ) -> proto::Reservation {
        let mut last = None;
        let reached = poll_until(async || {
            let r = self.get(id).await;
            let done = r.state == want as i32;
            last = Some(r);
            done
        })
        .await;
        let last = last.expect("polled at least once");
        assert!(reached, "reservation {id} never reached {want:?}: {last:?}");
        last
    }

    /// Stops the participants gracefully and closes their pool, so the test database can be
    /// dropped.
    pub async fn stop(mut self) {
        for p in &mut self.participants {
            if let Some(stop) = p.stop.take() {
                let _ = stop.send(());
            }
        }
        for p in &mut self.participants {
            if let Some(task) = p.task.take() {
                task.await
                    .expect("join a participant")
                    .unwrap_or_else(|e| panic!("participant {} failed: {e}", p.kind.name()));
            }
        }
        self.participants_pool.close().await;
    }
}

/// Calls `check` every 50 ms until it answers true, at most [`PATIENCE`]; whether it did.
pub async fn poll_until(mut check: impl AsyncFnMut() -> bool) -> bool {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn hold(participant: Kind, resource: &str, quantity: i64) -> proto::Hold {
    proto::Hold {
        participant: participant.name().to_owned(),
        resource: resource.to_owned(),
        quantity,
        during: None,
    }
}

pub fn reserve(
    request_id: &str,
    holder: &str,
    ttl: Option<Duration>,
    holds: Vec<proto::Hold>,
) -> proto::ReserveRequest {
    proto::ReserveRequest {
        request_id: request_id.to_owned(),
        holder: holder.to_owned(),
        ttl: ttl.map(proto_duration),
        holds,
        labels: Default::default(),
        queue: None,
    }
}

/// The branches of `r` as (participant, resource, state), for messages and checks.
pub fn branch_states(r: &proto::Reservation) -> Vec<(String, String, proto::branch::State)> {
    r.branches
        .iter()
        .map(|b| {
            (
                b.participant.clone(),
                b.resource.clone(),
                proto::branch::State::try_from(b.state)
                    .unwrap_or(proto::branch::State::Unspecified),
            )
        })
        .collect()
}
