//! [`Harness`]: a coordinator, reference participants and fakes in-process on loopback ports
//! the OS picks, every participant behind a [`Relay`] the test can cut, on a temporary SQLite
//! folder (or a given PostgreSQL database); the clock every expiry decision reads moved by
//! [`Harness::advance`]; the coordinator killed and restarted on the same database and port.

use std::net::SocketAddr;
use std::time::Duration;

use holdfast::app::{CoordinatorAccess, CoordinatorSettings};
use holdfast::coordinator::Policy;
use holdfast::domain::validate::Limits;
use holdfast::participants::{Kind, ParticipantDb, ParticipantSettings};
use holdfast::proto;
use holdfast::registry::ParticipantEndpoint;
use holdfast::testing::{TestClock, open_participant_db};
use holdfast_client::{Client, Payment};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tonic::transport::Channel;

use crate::coordinator::CoordinatorProcess;
use crate::fake::{CallLog, FakeParticipant, Script, spawn_fake};
use crate::{Relay, TestkitError};

/// Connections each participant pool may open.
const PARTICIPANT_POOL_SIZE: u32 = 8;

/// What the harness starts; see [`Harness::builder`].
pub struct HarnessBuilder {
    participants: Vec<Kind>,
    fakes: Vec<(String, Script)>,
    resources: Vec<(String, Vec<(String, i64)>)>,
    postgres: Option<String>,
    participant_timeout: Duration,
    orphan_grace: Duration,
    policy: Policy,
    limits: Limits,
}

impl HarnessBuilder {
    /// Reference participants to run, each registered under its kind's name (`seats`,
    /// `stock`, `rooms`, `payments`, `noop`).
    pub fn participants(mut self, kinds: impl IntoIterator<Item = Kind>) -> Self {
        self.participants.extend(kinds);
        self
    }

    /// A scripted participant registered as `name`.
    pub fn fake(mut self, name: impl Into<String>, script: Script) -> Self {
        self.fakes.push((name.into(), script));
        self
    }

    /// Resources to create at reference participant `participant` once it runs:
    /// `(resource, capacity)` (for `payments`, an account and its balance in minor units).
    pub fn resources<R: Into<String>>(
        mut self,
        participant: impl Into<String>,
        resources: impl IntoIterator<Item = (R, i64)>,
    ) -> Self {
        let resources = resources.into_iter().map(|(r, n)| (r.into(), n)).collect();
        self.resources.push((participant.into(), resources));
        self
    }

    /// Runs everything on the PostgreSQL database at `url` (created if missing) instead of a
    /// temporary SQLite folder. The coordinator's and the participants' schemas share it.
    pub fn postgres(mut self, url: impl Into<String>) -> Self {
        self.postgres = Some(url.into());
        self
    }

    /// How long the coordinator waits for one participant call (default 1 s): what a stalled
    /// fake costs a test.
    pub fn participant_timeout(mut self, timeout: Duration) -> Self {
        self.participant_timeout = timeout;
        self
    }

    /// How long after `expires_at` a reference participant reclaims a hold nobody released
    /// (default one hour; see [`Harness::advance`]).
    pub fn orphan_grace(mut self, grace: Duration) -> Self {
        self.orphan_grace = grace;
        self
    }

    /// Changes the coordinator's lifecycle and recovery policy (extensions, lease, backoff,
    /// late payments, hold limits, ...).
    pub fn policy(mut self, change: impl FnOnce(&mut Policy)) -> Self {
        change(&mut self.policy);
        self
    }

    /// Changes the coordinator's input limits (ttl bounds and default, holds per request, ...).
    pub fn limits(mut self, change: impl FnOnce(&mut Limits)) -> Self {
        change(&mut self.limits);
        self
    }

    /// Starts the participants, the relays in front of them and the coordinator; returns once
    /// every one accepts calls.
    pub async fn start(self) -> Result<Harness, TestkitError> {
        let names = self
            .participants
            .iter()
            .map(|k| k.name().to_owned())
            .chain(self.fakes.iter().map(|(n, _)| n.clone()));
        let mut seen = std::collections::HashSet::new();
        for name in names {
            if !seen.insert(name.clone()) {
                return Err(TestkitError::DuplicateParticipant(name));
            }
        }
        let data = Data::open(self.postgres.as_deref(), &self.participants).await?;
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let mut tasks = JoinSet::new();
        let mut participants = Vec::new();
        for (kind, db) in &data.participants {
            let listener = bind_loopback().await?;
            let url = local_url(&listener)?;
            let settings = ParticipantSettings {
                orphan_grace: self.orphan_grace,
                ..ParticipantSettings::new(*kind)
            };
            let (db, mut stopped) = (db.clone(), stop_rx.clone());
            let (name, clock) = (kind.name(), data.clock.clone());
            tasks.spawn(async move {
                let until = async move {
                    let _ = stopped.wait_for(|s| *s).await;
                };
                let served =
                    holdfast::app::serve_test_participant(settings, db, listener, &clock, until);
                if let Err(e) = served.await {
                    eprintln!("holdfast-testkit: participant {name} stopped: {e}");
                }
            });
            let relay = Relay::start(&url).await;
            participants.push(Participant {
                name: name.to_owned(),
                direct_url: url,
                relay,
                fake: None,
            });
        }
        let log = CallLog::default();
        for (name, script) in &self.fakes {
            let fake = spawn_fake(name, log.clone()).await;
            fake.script(script);
            let relay = Relay::start(&fake.url).await;
            participants.push(Participant {
                name: name.clone(),
                direct_url: fake.url.clone(),
                relay,
                fake: Some(fake),
            });
        }
        let settings = CoordinatorSettings {
            participants: participants
                .iter()
                .map(|p| ParticipantEndpoint {
                    name: p.name.clone(),
                    url: p.relay.url.clone(),
                    timeout: self.participant_timeout,
                })
                .collect(),
            limits: self.limits,
            policy: self.policy,
            server: holdfast::server::ServerLimits::default(),
            participant_transport: holdfast::tls::ParticipantTransport::default(),
            access: CoordinatorAccess::default(),
        };
        let any_port = SocketAddr::from(([127, 0, 0, 1], 0));
        let (process, addr) =
            CoordinatorProcess::start(&data.coordinator_url, any_port, settings.clone()).await?;
        let url = format!("http://{addr}");
        let client = Client::connect(url.clone()).await?;
        let harness = Harness {
            participants,
            log,
            coordinator: Some(process),
            addr,
            url,
            settings,
            client,
            _stop_participants: stop,
            _tasks: tasks,
            data,
        };
        for (participant, resources) in &self.resources {
            let resources: Vec<(&str, i64)> =
                resources.iter().map(|(r, n)| (r.as_str(), *n)).collect();
            harness.put_resources(participant, &resources).await?;
        }
        Ok(harness)
    }
}

/// Where the harness keeps its data: a temporary SQLite folder (removed on drop) or a
/// PostgreSQL database; and the participants' side of the movable clock (the coordinator has
/// its own, see `coordinator.rs`; both are moved by the same amounts).
struct Data {
    coordinator_url: String,
    /// Each reference participant's database: one pool for all on PostgreSQL; on SQLite a file
    /// each, as in the all-in-one, so one participant's writes never queue behind another's
    /// on a shared file's one writer.
    participants: Vec<(Kind, ParticipantDb)>,
    clock: TestClock,
    folder: Option<tempfile::TempDir>,
}

impl Data {
    async fn open(postgres: Option<&str>, kinds: &[Kind]) -> Result<Data, TestkitError> {
        let clock = TestClock::new();
        if let Some(url) = postgres {
            let shared = open_participant_db(url, PARTICIPANT_POOL_SIZE, &clock).await?;
            return Ok(Data {
                coordinator_url: url.to_owned(),
                participants: kinds.iter().map(|&k| (k, shared.clone())).collect(),
                clock,
                folder: None,
            });
        }
        let folder = tempfile::Builder::new()
            .prefix("holdfast-testkit-")
            .tempdir()
            .map_err(TestkitError::TempDir)?;
        let coordinator_url = format!("sqlite://{}", folder.path().join("holdfast.db").display());
        let mut participants = Vec::with_capacity(kinds.len());
        for &kind in kinds {
            // The all-in-one's layout: `participants/<name>.db` beside `holdfast.db`.
            let file = holdfast::app::data_dir::participant_url(&coordinator_url, kind)?;
            let db = open_participant_db(&file, PARTICIPANT_POOL_SIZE, &clock).await?;
            participants.push((kind, db));
        }
        Ok(Data {
            coordinator_url,
            participants,
            clock,
            folder: Some(folder),
        })
    }
}

async fn bind_loopback() -> Result<TcpListener, TestkitError> {
    let addr = SocketAddr::from(([127, 0, 0, 1], 0));
    TcpListener::bind(addr)
        .await
        .map_err(|source| TestkitError::Listen { addr, source })
}

fn local_url(listener: &TcpListener) -> Result<String, TestkitError> {
    let addr = listener
        .local_addr()
        .map_err(|source| TestkitError::Listen {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            source,
        })?;
    Ok(format!("http://{addr}"))
}

/// One participant of the harness, behind its relay.
struct Participant {
    name: String,
    /// Where it listens itself (the relay forwards here).
    direct_url: String,
    relay: Relay,
    fake: Option<FakeParticipant>,
}

/// A coordinator with its participants, in-process. Dropping it stops everything and removes
/// the temporary folder.
pub struct Harness {
    participants: Vec<Participant>,
    log: CallLog,
    coordinator: Option<CoordinatorProcess>,
    addr: SocketAddr,
    url: String,
    settings: CoordinatorSettings,
    client: Client,
    _stop_participants: tokio::sync::watch::Sender<bool>,
    _tasks: JoinSet<()>,
    data: Data,
}

impl Harness {
    /// What to start: no participants, a temporary SQLite folder, a participant timeout of 1 s,
    /// the coordinator's default policy and limits.
    pub fn builder() -> HarnessBuilder {
        HarnessBuilder {
            participants: Vec::new(),
            fakes: Vec::new(),
            resources: Vec::new(),
            postgres: None,
            participant_timeout: Duration::from_secs(1),
            orphan_grace: holdfast::participant::DEFAULT_ORPHAN_GRACE,
            policy: Policy::default(),
            limits: Limits::default(),
        }
    }

    /// A client of the coordinator (clones share one connection; it reconnects after a
    /// restart).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The coordinator's URL (`http://127.0.0.1:<port>`), the same across restarts: for raw
    /// `tcc.v1` clients (Admin, Testing).
    pub fn coordinator_url(&self) -> &str {
        &self.url
    }

    /// The temporary folder of the harness's SQLite files (`holdfast.db`, and
    /// `participants/<name>.db` for each reference participant), to look into from a test;
    /// `None` on PostgreSQL. Removed when the harness is dropped.
    pub fn data_folder(&self) -> Option<&std::path::Path> {
        self.data.folder.as_ref().map(tempfile::TempDir::path)
    }

    /// A channel to the coordinator for the generated `tcc.v1` clients.
    pub async fn channel(&self) -> Result<Channel, TestkitError> {
        connect(&self.url).await
    }

    /// Every call every fake of this harness received, in arrival order.
    pub fn calls(&self) -> &CallLog {
        &self.log
    }

    fn participant(&self, name: &str) -> Result<&Participant, TestkitError> {
        self.participants
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| TestkitError::UnknownParticipant(name.to_owned()))
    }

    /// The fake registered as `name`: its calls, state and script.
    pub fn fake(&self, name: &str) -> Result<&FakeParticipant, TestkitError> {
        self.participant(name)?
            .fake
            .as_ref()
            .ok_or_else(|| TestkitError::NotAFake(name.to_owned()))
    }

    /// Where participant `name` listens itself, not through its relay (a cut does not touch
    /// it): for `tcc.v1.ResourceAdmin` or `tcc.v1.Payments` clients.
    pub fn participant_url(&self, name: &str) -> Result<&str, TestkitError> {
        Ok(&self.participant(name)?.direct_url)
    }

    /// The network between the coordinator and participant `name`.
    pub fn relay(&self, name: &str) -> Result<&Relay, TestkitError> {
        Ok(&self.participant(name)?.relay)
    }

    /// Cuts the network to participant `name`: open connections drop, new ones are refused.
    pub async fn cut(&self, name: &str) -> Result<(), TestkitError> {
        self.relay(name)?.cut().await;
        Ok(())
    }

    /// Restores the network to participant `name`.
    pub async fn heal(&self, name: &str) -> Result<(), TestkitError> {
        self.relay(name)?.restore().await;
        Ok(())
    }

    /// Creates or resizes resources at reference participant `name`: `(resource, capacity)`.
    pub async fn put_resources(
        &self,
        name: &str,
        resources: &[(&str, i64)],
    ) -> Result<(), TestkitError> {
        let request = proto::PutResourcesRequest {
            resources: resources
                .iter()
                .map(|(resource, capacity)| proto::ResourceSpec {
                    resource: (*resource).to_owned(),
                    capacity: *capacity,
                })
                .collect(),
        };
        self.resource_admin(name)
            .await?
            .put_resources(request)
            .await
            .map_err(TestkitError::rpc("ResourceAdmin/PutResources"))?;
        Ok(())
    }

    /// A resource's counts (capacity, held, confirmed, available) at reference participant
    /// `name`.
    pub async fn resource(
        &self,
        name: &str,
        resource: &str,
    ) -> Result<proto::ResourceStatus, TestkitError> {
        let request = proto::GetResourceRequest {
            resource: resource.to_owned(),
        };
        Ok(self
            .resource_admin(name)
            .await?
            .get_resource(request)
            .await
            .map_err(TestkitError::rpc("ResourceAdmin/GetResource"))?
            .into_inner())
    }

    async fn resource_admin(
        &self,
        name: &str,
    ) -> Result<proto::resource_admin_client::ResourceAdminClient<Channel>, TestkitError> {
        let url = self.participant_url(name)?;
        Ok(proto::resource_admin_client::ResourceAdminClient::new(
            connect(url).await?,
        ))
    }

    async fn payments(
        &self,
    ) -> Result<proto::payments_client::PaymentsClient<Channel>, TestkitError> {
        let url = self.participant_url(Kind::Payments.name())?;
        Ok(proto::payments_client::PaymentsClient::new(
            connect(url).await?,
        ))
    }

    /// Charges `amount_minor` of `currency` to `account` at the `payments` participant for
    /// reservation `reservation_id` (a card capture made outside the coordinator); the payment
    /// to cite in a Confirm.
    pub async fn charge(
        &self,
        account: &str,
        reservation_id: uuid::Uuid,
        amount_minor: i64,
        currency: &str,
    ) -> Result<Payment, TestkitError> {
        let request = proto::ChargeRequest {
            account: account.to_owned(),
            amount_minor,
            currency: currency.to_owned(),
            reservation_id: reservation_id.to_string(),
        };
        let charged = self
            .payments()
            .await?
            .charge(request)
            .await
            .map_err(TestkitError::rpc("Payments/Charge"))?
            .into_inner();
        Ok(Payment {
            participant: Kind::Payments.name().to_owned(),
            payment_ref: charged.payment_ref,
            amount_minor,
            currency: currency.to_owned(),
        })
    }

    /// A payment as the `payments` participant records it, with its refunds.
    pub async fn payment(&self, payment_ref: &str) -> Result<proto::PaymentRecord, TestkitError> {
        let request = proto::GetPaymentRequest {
            payment_ref: payment_ref.to_owned(),
        };
        Ok(self
            .payments()
            .await?
            .get_payment(request)
            .await
            .map_err(TestkitError::rpc("Payments/GetPayment"))?
            .into_inner())
    }

    /// Kills the coordinator as a crash would: calls in flight and recovery stop mid-step.
    pub fn kill_coordinator(&mut self) {
        if let Some(mut process) = self.coordinator.take() {
            process.kill();
        }
    }

    /// Starts a coordinator again on the same database and port (killing the running one
    /// first, if any); work the old one left unfinished is recovered once its lease ends.
    pub async fn restart(&mut self) -> Result<(), TestkitError> {
        self.kill_coordinator();
        let (process, _) =
            CoordinatorProcess::start(&self.data.coordinator_url, self.addr, self.settings.clone())
                .await?;
        self.coordinator = Some(process);
        Ok(())
    }

    fn running(&self) -> Result<(), TestkitError> {
        match self.coordinator {
            Some(_) => Ok(()),
            None => Err(TestkitError::NotRunning),
        }
    }

    async fn testing(&self) -> Result<proto::testing_client::TestingClient<Channel>, TestkitError> {
        self.running()?;
        Ok(proto::testing_client::TestingClient::new(
            connect(&self.url).await?,
        ))
    }

    /// Moves the clock every expiry decision reads (the coordinator's, its reaper's and the
    /// participants' orphan reclaim) forward by `by`, then runs the reaper, recovery and orphan
    /// reclaim once: when it returns, holds whose deadline the move passed are released (or
    /// their release is pending because a participant cannot be reached). The clock never
    /// moves back; a restart keeps it.
    pub async fn advance(&self, by: Duration) -> Result<Advanced, TestkitError> {
        let request = proto::AdvanceClockRequest {
            by: Some(proto_duration(by)),
        };
        let answer = self
            .testing()
            .await?
            .advance_clock(request)
            .await
            .map_err(TestkitError::rpc("Testing/AdvanceClock"))?
            .into_inner();
        // Then the participants' side by the same amount, and their orphan reclaim.
        self.data.clock.advance(by).await?;
        let reclaimed = self.data.clock.reclaim_orphans().await;
        Ok(Advanced {
            offset: answer.offset.map_or(Duration::ZERO, std_duration),
            expired: answer.expired.try_into().unwrap_or(0),
            reclaimed,
        })
    }

    /// Expires one `TRYING` or `HELD` reservation now and releases it within the call, as the
    /// reaper would; the reservation as it stands afterwards.
    pub async fn expire_now(
        &self,
        reservation_id: uuid::Uuid,
    ) -> Result<holdfast_client::Reservation, TestkitError> {
        let request = proto::ExpireNowRequest {
            reservation_id: reservation_id.to_string(),
        };
        self.testing()
            .await?
            .expire_now(request)
            .await
            .map_err(TestkitError::rpc("Testing/ExpireNow"))?;
        Ok(self.client.get(reservation_id).await?)
    }
}

/// What [`Harness::advance`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Advanced {
    /// How far the clock is now ahead of the database's real clock, in total.
    pub offset: Duration,
    /// Reservations the reaper released in the pass it ran.
    pub expired: u32,
    /// Holds the participants' orphan reclaim released.
    pub reclaimed: usize,
}

fn proto_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: d.as_secs().try_into().unwrap_or(i64::MAX),
        nanos: d.subsec_nanos().try_into().unwrap_or(0),
    }
}

fn std_duration(d: prost_types::Duration) -> Duration {
    let seconds = u64::try_from(d.seconds).unwrap_or(0);
    let nanos = u32::try_from(d.nanos).unwrap_or(0);
    Duration::new(seconds, nanos)
}

async fn connect(url: &str) -> Result<Channel, TestkitError> {
    let endpoint = tonic::transport::Endpoint::new(url.to_owned()).map_err(|source| {
        TestkitError::Connect {
            url: url.to_owned(),
            source,
        }
    })?;
    endpoint
        .connect()
        .await
        .map_err(|source| TestkitError::Connect {
            url: url.to_owned(),
            source,
        })
}
