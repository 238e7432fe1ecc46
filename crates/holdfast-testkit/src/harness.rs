//! [`Harness`]: a coordinator, reference participants and fakes in-process on loopback ports
//! the OS picks, every participant behind a [`Relay`] the test can cut, on a temporary SQLite
//! folder (or a given PostgreSQL database); the clock every expiry decision reads moved by
//! [`Harness::advance`]; the coordinator killed and restarted on the same database and port;
//! with authentication on, a client per principal; with TLS, clients that trust the harness's
//! CA (and present a principal's certificate under mutual TLS). Built by
//! [`HarnessBuilder`](crate::HarnessBuilder) (`builder.rs`).

use std::net::SocketAddr;
use std::time::Duration;

use holdfast_client::{Client, Payment};
use holdfast_coordinator::serving::CoordinatorSettings;
use holdfast_proto as proto;
use holdfast_serve::auth::Bearer;
use tokio::task::JoinSet;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::access::Access;
use crate::coordinator::CoordinatorProcess;
use crate::data::Data;
use crate::fake::{CallLog, FakeParticipant};
use crate::tls::Certificates;
use crate::{Relay, TestkitError};

/// The name [`Harness::charge`] and [`Harness::payment`] call: the reference `payments`
/// participant's.
const PAYMENTS: &str = "payments";

/// How long [`Harness::events`] waits for the events it knows of.
const EVENTS_WAIT: Duration = Duration::from_secs(30);

/// One participant of the harness, behind its relay.
pub(crate) struct Participant {
    pub(crate) name: String,
    /// Where it listens itself (the relay forwards here).
    pub(crate) direct_url: String,
    pub(crate) relay: Relay,
    pub(crate) fake: Option<FakeParticipant>,
}

/// A coordinator with its participants, in-process. Dropping it stops everything and removes
/// the temporary folder.
pub struct Harness {
    pub(crate) participants: Vec<Participant>,
    pub(crate) log: CallLog,
    pub(crate) coordinator: Option<CoordinatorProcess>,
    pub(crate) addr: SocketAddr,
    pub(crate) url: String,
    pub(crate) settings: CoordinatorSettings,
    /// Presents the harness's own key when authentication is on.
    pub(crate) client: Client,
    pub(crate) _stop_participants: tokio::sync::watch::Sender<bool>,
    pub(crate) _tasks: JoinSet<()>,
    pub(crate) data: Data,
    /// The principals and their keys, when authentication is on.
    pub(crate) access: Option<Access>,
    /// The CA and the coordinator's certificate, when it serves TLS.
    pub(crate) certificates: Option<Certificates>,
}

impl Harness {
    /// A client of the coordinator (clones share one connection; it reconnects after a
    /// restart).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The coordinator's URL (`http://127.0.0.1:<port>`, `https://` with TLS), the same across
    /// restarts: for raw `tcc.v1` clients (Admin, Testing).
    pub fn coordinator_url(&self) -> &str {
        &self.url
    }

    /// The temporary folder of the harness's SQLite files (`holdfast.db`, and
    /// `participants/<name>.db` for each reference participant), to look into from a test;
    /// `None` on PostgreSQL. Removed when the harness is dropped.
    pub fn data_folder(&self) -> Option<&std::path::Path> {
        self.data.folder.as_ref().map(tempfile::TempDir::path)
    }

    /// A client of the coordinator presenting principal `name`'s API key (see
    /// [`HarnessBuilder::principal`](crate::HarnessBuilder::principal)).
    pub async fn client_as(&self, name: &str) -> Result<Client, TestkitError> {
        let key = self.api_key(name)?;
        client_with_key(&self.url, Some(key), self.certificates.as_ref(), name).await
    }

    /// Principal `name`'s API key, for callers other than [`Harness::client_as`] (a raw
    /// `tcc.v1` client sends it as `authorization: Bearer <key>`; so does another language's).
    pub fn api_key(&self, name: &str) -> Result<&str, TestkitError> {
        self.access
            .as_ref()
            .and_then(|access| access.key(name))
            .ok_or_else(|| TestkitError::UnknownPrincipal(name.to_owned()))
    }

    /// The PEM of the CA that signed the coordinator's certificate, with
    /// [`HarnessBuilder::tls`](crate::HarnessBuilder::tls); `None` on plaintext.
    pub fn tls_ca_pem(&self) -> Option<&str> {
        self.certificates.as_ref().map(|c| c.ca_pem.as_str())
    }

    /// That CA as a file (for a client configured with a path); removed with the harness.
    pub fn tls_ca_file(&self) -> Option<&std::path::Path> {
        self.certificates.as_ref().map(|c| c.ca_file.as_path())
    }

    /// Principal `name`'s client certificate and key (PEM files), with
    /// [`HarnessBuilder::mutual_tls`](crate::HarnessBuilder::mutual_tls): it proves the
    /// principal without an API key.
    pub fn client_certificate(
        &self,
        name: &str,
    ) -> Result<(&std::path::Path, &std::path::Path), TestkitError> {
        let identity = self
            .certificates
            .as_ref()
            .and_then(|c| c.identity(name))
            .filter(|_| name != crate::access::HARNESS_PRINCIPAL)
            .ok_or_else(|| TestkitError::UnknownPrincipal(name.to_owned()))?;
        Ok((identity.cert.as_path(), identity.key.as_path()))
    }

    /// A channel to the coordinator for the generated `tcc.v1` clients (with authentication on,
    /// add a key: [`Harness::api_key`]).
    pub async fn channel(&self) -> Result<Channel, TestkitError> {
        connect(&self.url, self.certificates.as_ref()).await
    }

    /// Every event readable so far after sequence `after` (0: from the oldest kept), oldest
    /// first, up to the log's latest sequence when called; as the harness's own principal, so
    /// everyone's reservations (SPEC 10). To follow events still to come, use
    /// [`Client::events`] on [`Harness::client`]: it resumes by itself across a
    /// [`Harness::restart`].
    pub async fn events(&self, after: i64) -> Result<Vec<holdfast_client::Event>, TestkitError> {
        self.running()?;
        let latest = self.client.latest_sequence().await?;
        if latest <= after {
            return Ok(Vec::new());
        }
        let mut events = self
            .client
            .events(after, holdfast_client::EventFilter::default());
        let read = async move {
            let mut out: Vec<holdfast_client::Event> = Vec::new();
            while out.last().is_none_or(|e| e.sequence < latest) {
                match events.next().await {
                    Some(event) => out.push(event?),
                    None => break,
                }
            }
            Ok::<_, TestkitError>(out)
        };
        tokio::time::timeout(EVENTS_WAIT, read)
            .await
            .map_err(|_| TestkitError::Rpc {
                call: "Events/Subscribe",
                status: tonic::Status::deadline_exceeded(format!(
                    "the events up to sequence {latest} did not arrive within {EVENTS_WAIT:?}"
                )),
            })?
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
            connect(url, None).await?,
        ))
    }

    async fn payments(
        &self,
    ) -> Result<proto::payments_client::PaymentsClient<Channel>, TestkitError> {
        let url = self.participant_url(PAYMENTS)?;
        Ok(proto::payments_client::PaymentsClient::new(
            connect(url, None).await?,
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
            participant: PAYMENTS.to_owned(),
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
        let tls = self.certificates.as_ref().map(|c| c.server.clone());
        let (process, _) = CoordinatorProcess::start(
            &self.data.coordinator_url,
            self.addr,
            self.settings.clone(),
            tls,
        )
        .await?;
        self.coordinator = Some(process);
        self.serving().await
    }

    /// Waits until the coordinator serves (or says why it stopped).
    pub(crate) async fn serving(&self) -> Result<(), TestkitError> {
        let process = self.coordinator.as_ref().ok_or(TestkitError::NotRunning)?;
        process.serving(self.channel().await?).await
    }

    fn running(&self) -> Result<(), TestkitError> {
        match self.coordinator {
            Some(_) => Ok(()),
            None => Err(TestkitError::NotRunning),
        }
    }

    /// `tcc.v1.Testing`, as the harness's own principal when authentication is on.
    async fn testing(
        &self,
    ) -> Result<
        proto::testing_client::TestingClient<InterceptedService<Channel, Bearer>>,
        TestkitError,
    > {
        self.running()?;
        let key = self.access.as_ref().map(Access::harness_key);
        let bearer = Bearer::optional(key).map_err(|e| TestkitError::Auth(e.to_string()))?;
        Ok(proto::testing_client::TestingClient::with_interceptor(
            self.channel().await?,
            bearer,
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

/// A client of the coordinator at `url` as principal `name`: presenting `key` when there is
/// one; with `tls`, trusting the harness's CA and, with mutual TLS, presenting `name`'s
/// certificate.
pub(crate) async fn client_with_key(
    url: &str,
    key: Option<&str>,
    tls: Option<&Certificates>,
    name: &str,
) -> Result<Client, TestkitError> {
    let mut builder = Client::builder(url);
    if let Some(key) = key {
        builder = builder.api_key(key);
    }
    if let Some(tls) = tls {
        builder = builder.tls_ca_pem(tls.ca_pem.as_str());
        if let Some(identity) = tls.identity(name) {
            builder = builder.tls_client_identity_files(&identity.cert, &identity.key);
        }
    }
    Ok(builder.connect().await?)
}

/// A channel to `url`: over TLS trusting `tls`'s CA when given (the coordinator's), else
/// plaintext (the participants').
async fn connect(url: &str, tls: Option<&Certificates>) -> Result<Channel, TestkitError> {
    if let Some(certificates) = tls {
        let endpoint = tonic::transport::Endpoint::new(holdfast_serve::tls::endpoint_url(url))
            .map_err(|source| TestkitError::Connect {
                url: url.to_owned(),
                source,
            })?;
        return certificates
            .client
            .connect_lazy(endpoint, url)
            .map_err(|e| TestkitError::Tls(e.to_string()));
    }
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
