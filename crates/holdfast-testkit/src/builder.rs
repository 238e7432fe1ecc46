//! [`HarnessBuilder`]: what a [`Harness`] starts, and starting it: the participants (reference
//! and scripted), a relay in front of each, then the coordinator, on loopback ports the OS picks.

use std::net::SocketAddr;
use std::time::Duration;

use holdfast_coordinator::coordinator::Policy;
use holdfast_coordinator::domain::validate::Limits;
use holdfast_coordinator::registry::ParticipantEndpoint;
use holdfast_coordinator::serving::{CoordinatorAccess, CoordinatorSettings};
#[cfg(feature = "reference-participants")]
use holdfast_participants::Kind;
use holdfast_serve::auth::Role;
use tokio::task::JoinSet;

use crate::access::{self, Access, HARNESS_PRINCIPAL};
use crate::coordinator::CoordinatorProcess;
use crate::data::Data;
use crate::fake::{CallLog, Script, spawn_fake};
use crate::harness::{Harness, Participant, client_with_key};
use crate::tls::Certificates;
use crate::{Relay, TestkitError};

/// What the harness starts; see [`Harness::builder`].
pub struct HarnessBuilder {
    #[cfg(feature = "reference-participants")]
    participants: Vec<Kind>,
    fakes: Vec<(String, Script)>,
    resources: Vec<(String, Vec<(String, i64)>)>,
    postgres: Option<String>,
    participant_timeout: Duration,
    #[cfg(feature = "reference-participants")]
    orphan_grace: Duration,
    policy: Policy,
    limits: Limits,
    principals: Vec<(String, Vec<Role>)>,
    tls: CoordinatorTls,
}

/// How the harness's coordinator serves.
#[derive(Clone, Copy, PartialEq, Eq)]
enum CoordinatorTls {
    Off,
    /// TLS only, under the harness's CA.
    Server,
    /// And a client certificate from that CA required.
    Mutual,
}

impl Harness {
    /// What to start: no participants, a temporary SQLite folder, a participant timeout of 1 s,
    /// the coordinator's default policy and limits, authentication off.
    pub fn builder() -> HarnessBuilder {
        HarnessBuilder {
            #[cfg(feature = "reference-participants")]
            participants: Vec::new(),
            fakes: Vec::new(),
            resources: Vec::new(),
            postgres: None,
            participant_timeout: Duration::from_secs(1),
            #[cfg(feature = "reference-participants")]
            orphan_grace: holdfast_coordinator::participant::DEFAULT_ORPHAN_GRACE,
            policy: Policy::default(),
            limits: Limits::default(),
            principals: Vec::new(),
            tls: CoordinatorTls::Off,
        }
    }
}

impl HarnessBuilder {
    /// Reference participants to run, each registered under its kind's name (`seats`,
    /// `stock`, `rooms`, `payments`, `noop`). Feature `reference-participants`.
    #[cfg(feature = "reference-participants")]
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
    /// (default one hour; see [`Harness::advance`]). Feature `reference-participants`.
    #[cfg(feature = "reference-participants")]
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

    /// Turns authentication on (SPEC 7.2) with principal `name` in `roles`: the harness makes
    /// it an API key ([`Harness::client_as`], [`Harness::api_key`]). Once any principal is
    /// named, the coordinator refuses calls without a key (`UNAUTHENTICATED`) and calls
    /// outside the caller's roles (`PERMISSION_DENIED`), and a `client` sees only the
    /// reservations it made (their owner is its name). [`Harness::client`] and the harness's own
    /// calls then present a principal of the harness's, `holdfast-testkit`, an admin. The
    /// participants stay open: the harness and the coordinator call them without keys.
    pub fn principal(
        mut self,
        name: impl Into<String>,
        roles: impl IntoIterator<Item = Role>,
    ) -> Self {
        self.principals
            .push((name.into(), roles.into_iter().collect()));
        self
    }

    /// Serves the coordinator over TLS only (`https://`), with a certificate for `localhost`
    /// and `127.0.0.1` signed by a CA the harness makes for itself ([`Harness::tls_ca_pem`],
    /// [`Harness::tls_ca_file`]): what a client configured with that CA must accept, and one
    /// trusting only the system's roots must refuse. [`Harness::client`],
    /// [`Harness::client_as`] and the harness's own calls trust it. The participants stay on
    /// plaintext loopback.
    pub fn tls(mut self) -> Self {
        self.tls = CoordinatorTls::Server;
        self
    }

    /// [`HarnessBuilder::tls`], and the coordinator requires a client certificate from the
    /// harness's CA: the CA issues one for each principal (its name the certificate's common
    /// name, admitted as `tls_identity` as well as by its key: [`Harness::client_certificate`])
    /// and one the harness's own calls present. A client without one is refused.
    pub fn mutual_tls(mut self) -> Self {
        self.tls = CoordinatorTls::Mutual;
        self
    }

    /// Starts the participants, the relays in front of them and the coordinator; returns once
    /// every one accepts calls.
    pub async fn start(self) -> Result<Harness, TestkitError> {
        self.unique_names()?;
        let mutual = self.tls == CoordinatorTls::Mutual;
        let access = Access::new(&self.principals, mutual)?;
        let clients: Vec<&str> = access::everyone(&self.principals)?
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        let certificates = match self.tls {
            CoordinatorTls::Off => None,
            CoordinatorTls::Server => Some(Certificates::new(None)?),
            CoordinatorTls::Mutual => Some(Certificates::new(Some(&clients))?),
        };
        let data = Data::open(self.postgres.as_deref())?;
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let mut tasks = JoinSet::new();
        let mut participants = self.start_reference(&data, &stop_rx, &mut tasks).await?;
        let log = CallLog::default();
        self.start_fakes(&log, &mut participants).await;
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
            server: holdfast_serve::server::ServerLimits::default(),
            // The participants are this process's, on loopback behind the relays.
            participant_transport: holdfast_serve::tls::ParticipantTransport {
                allow_plaintext: true,
                ..holdfast_serve::tls::ParticipantTransport::default()
            },
            access: CoordinatorAccess {
                auth: access
                    .as_ref()
                    .map_or_else(Default::default, |a| a.authenticator.clone()),
                ..CoordinatorAccess::default()
            },
        };
        let any_port = SocketAddr::from(([127, 0, 0, 1], 0));
        let tls = certificates.as_ref().map(|c| c.server.clone());
        let (process, addr) =
            CoordinatorProcess::start(&data.coordinator_url, any_port, settings.clone(), tls)
                .await?;
        let scheme = if certificates.is_some() {
            "https"
        } else {
            "http"
        };
        let url = format!("{scheme}://{addr}");
        let key = access.as_ref().map(Access::harness_key);
        let client = client_with_key(&url, key, certificates.as_ref(), HARNESS_PRINCIPAL).await?;
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
            access,
            certificates,
        };
        harness.serving().await?;
        for (participant, resources) in &self.resources {
            let resources: Vec<(&str, i64)> =
                resources.iter().map(|(r, n)| (r.as_str(), *n)).collect();
            harness.put_resources(participant, &resources).await?;
        }
        Ok(harness)
    }

    /// Every participant's name is its own.
    fn unique_names(&self) -> Result<(), TestkitError> {
        #[cfg(feature = "reference-participants")]
        let reference = self.participants.iter().map(|k| k.name().to_owned());
        #[cfg(not(feature = "reference-participants"))]
        let reference = std::iter::empty::<String>();
        let names = reference.chain(self.fakes.iter().map(|(n, _)| n.clone()));
        let mut seen = std::collections::HashSet::new();
        for name in names {
            if !seen.insert(name.clone()) {
                return Err(TestkitError::DuplicateParticipant(name));
            }
        }
        Ok(())
    }

    /// Serves the reference participants (feature `reference-participants`), each behind a
    /// relay, until `stop_rx` says stop.
    #[cfg(feature = "reference-participants")]
    async fn start_reference(
        &self,
        data: &Data,
        stop_rx: &tokio::sync::watch::Receiver<bool>,
        tasks: &mut JoinSet<()>,
    ) -> Result<Vec<Participant>, TestkitError> {
        crate::reference::start(&self.participants, self.orphan_grace, data, stop_rx, tasks).await
    }

    /// Without the feature there are none.
    #[cfg(not(feature = "reference-participants"))]
    async fn start_reference(
        &self,
        _: &Data,
        _: &tokio::sync::watch::Receiver<bool>,
        _: &mut JoinSet<()>,
    ) -> Result<Vec<Participant>, TestkitError> {
        Ok(Vec::new())
    }

    /// Serves each scripted fake, behind a relay, its calls in `log`.
    async fn start_fakes(&self, log: &CallLog, participants: &mut Vec<Participant>) {
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
    }
}
