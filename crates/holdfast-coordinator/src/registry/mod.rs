//! The participant registry: name -> endpoint, one long-lived HTTP/2 channel per participant,
//! and the three TCC calls translated to domain outcomes (plus Extend, `extend.rs`, a
//! payment service's GetPayment and Refund, `payments.rs`, and a resource's stock levels,
//! `inventory.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tonic::transport::{Channel, Endpoint};
use uuid::Uuid;

use tracing::Instrument;

use crate::domain::{BranchOutcome, BranchState, Hold, TryOutcome};
use crate::proto;
use crate::proto::participant_client::ParticipantClient;

mod extend;
mod health;
mod inventory;
mod payments;

pub use extend::ExtendOutcome;
pub use health::ParticipantHealth;
pub use payments::{PaymentLookup, RefundFailure, refund_refusal_is_permanent};

/// How to reach one participant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParticipantEndpoint {
    pub name: String,
    pub url: String,
    /// Deadline of each call to it.
    pub timeout: Duration,
}

/// A participant's configuration was unusable.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("participant {name:?}: invalid endpoint {url:?}: {source}")]
    InvalidEndpoint {
        name: String,
        url: String,
        source: tonic::transport::Error,
    },
    #[error("participant {0:?} is registered twice")]
    Duplicate(String),
    /// An `https://` participant without TLS settings to reach it: refused, never plaintext.
    #[error("participant {name:?}: {url} needs TLS, and none is configured (--participant-ca)")]
    NoTls { name: String, url: String },
    #[error("participant {name:?}: {source}")]
    Tls {
        name: String,
        source: crate::tls::TlsError,
    },
    #[error("the participant API key cannot be sent as a header (printable ASCII only)")]
    Credential,
}

/// A participant call that did not produce an answer.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{message}")]
pub struct CallError {
    /// The participant refused the request itself (e.g. INVALID_ARGUMENT): it did not apply it.
    /// Otherwise (unreachable, timed out, failed) the outcome is unknown.
    pub refused: bool,
    pub message: String,
}

impl CallError {
    fn from_status(status: &tonic::Status) -> CallError {
        use tonic::Code;
        let refused = matches!(
            status.code(),
            Code::InvalidArgument
                | Code::FailedPrecondition
                | Code::NotFound
                | Code::OutOfRange
                | Code::AlreadyExists
                | Code::PermissionDenied
        );
        CallError {
            refused,
            message: format!("{:?}: {}", status.code(), status.message()),
        }
    }

    fn protocol(message: String) -> CallError {
        CallError {
            refused: false,
            message,
        }
    }
}

/// A Try the participant refused as malformed: it applied nothing (the SDK checks before
/// any write).
fn invalid_try(status: &tonic::Status) -> TryOutcome {
    let (field, problem) = invalid_parts(status);
    TryOutcome::Invalid { field, problem }
}

/// An `INVALID_ARGUMENT` answer's field, from its `ErrorInfo` (`metadata.field`), and the
/// problem: the message without that field's name.
fn invalid_parts(status: &tonic::Status) -> (Option<String>, String) {
    use tonic_types::StatusExt;
    let field = status
        .get_details_error_info()
        .and_then(|info| info.metadata.get("field").cloned())
        .filter(|f| !f.is_empty());
    let message = status.message();
    let problem = field
        .as_deref()
        .and_then(|f| message.strip_prefix(f))
        .map_or(message, str::trim_start);
    (field, problem.to_owned())
}

/// The two calls that finish a branch.
#[derive(Clone, Copy, Debug)]
enum SecondPhase {
    Confirm,
    Cancel,
}

/// One registered participant and its channel.
#[derive(Clone, Debug)]
pub struct ParticipantHandle {
    name: String,
    /// Where it is reached (`--participant NAME=URL`), for the console.
    url: String,
    timeout: Duration,
    client: ParticipantClient<Channel>,
    /// The same channel, for participants that also take payments (refunds).
    payments: crate::proto::payments_client::PaymentsClient<Channel>,
    /// The same channel, for its stock levels (`tcc.v1.ResourceAdmin/GetResource`).
    resources: crate::proto::resource_admin_client::ResourceAdminClient<Channel>,
    health: tonic_health::pb::health_client::HealthClient<Channel>,
    /// `Bearer <key>`: the coordinator's own credential (`--participant-api-key-file`).
    credential: Option<tonic::metadata::AsciiMetadataValue>,
    /// The last call could not reach it (or failed); cleared by the next success.
    failing: Arc<AtomicBool>,
    /// The last failed call's error and when, kept after it answers again (for the console).
    last_error: Arc<health::LastError>,
    /// A health probe announced it back and no real call has succeeded since.
    woken_by_probe: Arc<AtomicBool>,
    events: Arc<Events>,
}

/// Participants that answered again after failing, for recovery to retry their backlog.
#[derive(Debug, Default)]
struct Events {
    came_back: Mutex<Vec<String>>,
    notify: tokio::sync::Notify,
}

/// Every participant the coordinator knows, by name.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    participants: Arc<HashMap<String, ParticipantHandle>>,
    events: Arc<Events>,
}

impl Registry {
    /// Builds the registry. Channels connect lazily and reconnect by themselves; `https://`
    /// participants only over TLS with `tls`.
    /// Every call presents `api_key` (as `authorization: Bearer`) when one is given.
    pub fn new(
        endpoints: &[ParticipantEndpoint],
        tls: Option<&crate::tls::ClientTls>,
        api_key: Option<&str>,
    ) -> Result<Registry, RegistryError> {
        let credential = api_key
            .map(|k| {
                let mut v = tonic::metadata::AsciiMetadataValue::try_from(format!("Bearer {k}"))
                    .map_err(|_| RegistryError::Credential)?;
                v.set_sensitive(true);
                Ok(v)
            })
            .transpose()?;
        let events = Arc::new(Events::default());
        let mut participants = HashMap::new();
        for ep in endpoints {
            let endpoint = Endpoint::from_shared(crate::tls::endpoint_url(&ep.url))
                .map_err(|source| RegistryError::InvalidEndpoint {
                    name: ep.name.clone(),
                    url: ep.url.clone(),
                    source,
                })?
                .connect_timeout(ep.timeout.min(Duration::from_secs(5)))
                .timeout(ep.timeout)
                .tcp_nodelay(true)
                .http2_keep_alive_interval(Duration::from_secs(30))
                .keep_alive_while_idle(true);
            let channel = match (crate::tls::is_https(&ep.url), tls) {
                (false, _) => endpoint.connect_lazy(),
                (true, Some(tls)) => {
                    tls.connect_lazy(endpoint, &ep.url)
                        .map_err(|source| RegistryError::Tls {
                            name: ep.name.clone(),
                            source,
                        })?
                }
                (true, None) => {
                    return Err(RegistryError::NoTls {
                        name: ep.name.clone(),
                        url: ep.url.clone(),
                    });
                }
            };
            let handle = ParticipantHandle {
                name: ep.name.clone(),
                url: ep.url.clone(),
                last_error: Arc::default(),
                timeout: ep.timeout,
                client: ParticipantClient::new(channel.clone()),
                payments: crate::proto::payments_client::PaymentsClient::new(channel.clone()),
                resources: crate::proto::resource_admin_client::ResourceAdminClient::new(
                    channel.clone(),
                ),
                health: tonic_health::pb::health_client::HealthClient::new(channel),
                credential: credential.clone(),
                failing: Arc::new(AtomicBool::new(false)),
                woken_by_probe: Arc::new(AtomicBool::new(false)),
                events: events.clone(),
            };
            if participants.insert(ep.name.clone(), handle).is_some() {
                return Err(RegistryError::Duplicate(ep.name.clone()));
            }
        }
        Ok(Registry {
            participants: Arc::new(participants),
            events,
        })
    }

    /// Participants whose last call failed.
    pub fn failing(&self) -> Vec<&ParticipantHandle> {
        self.participants
            .values()
            .filter(|p| p.failing.load(Ordering::Relaxed))
            .collect()
    }

    /// Names of participants that answered again since the last call, oldest first.
    pub fn take_came_back(&self) -> Vec<String> {
        match self.events.came_back.lock() {
            Ok(mut v) => std::mem::take(&mut *v),
            Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
        }
    }

    /// Resolves when some participant answers again after failing.
    pub async fn came_back(&self) {
        self.events.notify.notified().await;
    }

    /// The participant registered under `name`.
    pub fn get(&self, name: &str) -> Option<&ParticipantHandle> {
        self.participants.get(name)
    }

    /// The participant a call must go to. Not registered (removed from the configuration
    /// since the reservation was placed) is a refusal: no call was made, so nothing changed
    /// there.
    pub fn require(&self, name: &str) -> Result<&ParticipantHandle, CallError> {
        self.get(name).ok_or_else(|| CallError {
            refused: true,
            message: format!("participant {name:?} is not registered"),
        })
    }
}

fn to_timestamp(t: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.timestamp(),
        nanos: i32::try_from(t.timestamp_subsec_nanos()).unwrap_or(0),
    }
}

fn to_proto_hold(h: &Hold) -> proto::Hold {
    proto::Hold {
        participant: h.participant.clone(),
        resource: h.resource.clone(),
        quantity: h.quantity,
        during: h.during.map(|d| proto::Interval {
            start: Some(to_timestamp(d.start)),
            end: Some(to_timestamp(d.end)),
        }),
    }
}

impl SecondPhase {
    /// The method name, as in spans and metrics.
    fn method(self) -> &'static str {
        match self {
            SecondPhase::Confirm => "confirm",
            SecondPhase::Cancel => "cancel",
        }
    }

    /// The method name, as in the `tcc.v1.Participant` service.
    fn rpc(self) -> &'static str {
        match self {
            SecondPhase::Confirm => "Confirm",
            SecondPhase::Cancel => "Cancel",
        }
    }

    /// The participant's answer in domain terms. A state that is no answer to Confirm or
    /// Cancel (SPEC 3.3) is a failed call: the branch stays as it was and the call is retried.
    fn outcome(self, state: i32) -> Result<BranchOutcome, CallError> {
        use proto::branch::State as P;
        match P::try_from(state) {
            Ok(P::Confirmed) => Ok(BranchOutcome::Confirmed),
            Ok(P::Cancelled) => Ok(BranchOutcome::Cancelled),
            Ok(P::HoldLost) => Ok(BranchOutcome::HoldLost),
            Ok(P::Held) => Err(self.unexpected(BranchState::Held)),
            Ok(P::Rejected) => Err(self.unexpected(BranchState::Rejected)),
            Ok(P::Pending | P::Unspecified) | Err(_) => Err(CallError::protocol(format!(
                "participant answered {} with state {state}",
                self.method()
            ))),
        }
    }

    fn unexpected(self, state: BranchState) -> CallError {
        CallError::protocol(format!(
            "unexpected answer {} to {}",
            state.as_str(),
            self.rpc()
        ))
    }
}

/// What a participant's answer (or failure) was to: a real call, or a health probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AnsweredTo {
    Call,
    HealthProbe,
}

impl ParticipantHandle {
    /// Remembers whether the participant answered; a first answer after failures is announced.
    fn observe<T>(&self, result: &Result<T, CallError>) {
        self.note(result, AnsweredTo::Call);
    }

    /// [`Self::observe`] for a real call or a health probe. A probe that answers while the
    /// calls keep failing (health served, calls refused by a sick participant) announces it
    /// back only once until a real call succeeds: announcing it at every probe would retry its
    /// backlog every probe interval, defeating the backoff.
    fn note<T>(&self, result: &Result<T, CallError>, to: AnsweredTo) {
        let by_probe = to == AnsweredTo::HealthProbe;
        tracing::Span::current().record(
            "outcome",
            match result {
                Ok(_) => "ok",
                Err(e) if e.refused => "refused",
                Err(_) => "failed",
            },
        );
        match result {
            Err(e) if !e.refused => {
                self.failing.store(true, Ordering::Relaxed);
                self.last_error.record(&e.message);
            }
            _ => {
                if !by_probe {
                    self.woken_by_probe.store(false, Ordering::Relaxed);
                }
                if self.failing.swap(false, Ordering::Relaxed) {
                    if by_probe && self.woken_by_probe.swap(true, Ordering::Relaxed) {
                        return;
                    }
                    tracing::info!(participant = %self.name, "participant answers again");
                    match self.events.came_back.lock() {
                        Ok(mut v) => v.push(self.name.clone()),
                        Err(poisoned) => poisoned.into_inner().push(self.name.clone()),
                    }
                    self.events.notify.notify_waiters();
                }
            }
        }
    }

    /// Asks the participant's health service whether it serves; records the answer like a call.
    pub async fn probe(&self) -> bool {
        let mut req = tonic::Request::new(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        });
        req.set_timeout(self.timeout.min(Duration::from_secs(1)));
        let result = match self.health.clone().check(req).await {
            Ok(resp)
                if resp.get_ref().status
                    == i32::from(
                        tonic_health::pb::health_check_response::ServingStatus::Serving,
                    ) =>
            {
                Ok(())
            }
            Ok(_) => Err(CallError::protocol("not serving".into())),
            Err(s) => Err(CallError::from_status(&s)),
        };
        self.note(&result, AnsweredTo::HealthProbe);
        result.is_ok()
    }

    /// An outgoing call: the per-call deadline, and the current trace context.
    fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut req = tonic::Request::new(msg);
        req.set_timeout(self.timeout);
        if let Some(credential) = &self.credential {
            req.metadata_mut()
                .insert("authorization", credential.clone());
        }
        crate::telemetry::propagation::inject(req.metadata_mut());
        req
    }

    /// The client span of one participant call.
    fn span(
        &self,
        phase: &'static str,
        reservation_id: Uuid,
        branch_id: Option<Uuid>,
    ) -> tracing::Span {
        tracing::info_span!(
            "participant_call",
            otel.name = %format!("{}/{phase}", self.name),
            otel.kind = "client",
            participant = %self.name,
            phase,
            reservation_id = %reservation_id,
            branch_id = branch_id.map(tracing::field::display),
            outcome = tracing::field::Empty,
        )
    }

    /// Asks the participant to hold `items`.
    pub async fn try_hold(
        &self,
        reservation_id: Uuid,
        branch_id: Uuid,
        holder: &str,
        items: &[Hold],
        expires_at: DateTime<Utc>,
    ) -> Result<TryOutcome, CallError> {
        let span = self.span("try", reservation_id, Some(branch_id));
        async move {
            let req = self.request(proto::TryRequest {
                reservation_id: reservation_id.to_string(),
                branch_id: branch_id.to_string(),
                holder: holder.to_owned(),
                items: items.iter().map(to_proto_hold).collect(),
                expires_at: Some(to_timestamp(expires_at)),
            });
            let started = std::time::Instant::now();
            let answer = self.client.clone().r#try(req).await;
            crate::telemetry::branch_call(&self.name, "try", started.elapsed());
            let result = answer.map_err(|s| (CallError::from_status(&s), s));
            self.observe(&result.as_ref().map_err(|(e, _)| e.clone()));
            let resp = match result {
                Ok(resp) => resp.into_inner(),
                Err((_, status)) if status.code() == tonic::Code::InvalidArgument => {
                    return Ok(invalid_try(&status));
                }
                Err((e, _)) => return Err(e),
            };
            use proto::try_response::Outcome;
            match Outcome::try_from(resp.outcome) {
                Ok(Outcome::Held) => Ok(TryOutcome::Held),
                Ok(Outcome::Rejected) => Ok(TryOutcome::Rejected {
                    reason: if resp.reason.is_empty() {
                        "rejected".to_owned()
                    } else {
                        resp.reason
                    },
                }),
                _ => Err(CallError::protocol(format!(
                    "participant answered an unknown Try outcome {}",
                    resp.outcome
                ))),
            }
        }
        .instrument(span)
        .await
    }

    /// Asks the participant to finalise the branch.
    pub async fn confirm(
        &self,
        reservation_id: Uuid,
        branch_id: Uuid,
    ) -> Result<BranchOutcome, CallError> {
        self.second_phase(SecondPhase::Confirm, reservation_id, branch_id)
            .await
    }

    /// Asks the participant to release the branch.
    pub async fn cancel(
        &self,
        reservation_id: Uuid,
        branch_id: Uuid,
    ) -> Result<BranchOutcome, CallError> {
        self.second_phase(SecondPhase::Cancel, reservation_id, branch_id)
            .await
    }

    async fn second_phase(
        &self,
        phase: SecondPhase,
        reservation_id: Uuid,
        branch_id: Uuid,
    ) -> Result<BranchOutcome, CallError> {
        let name = phase.method();
        let span = self.span(name, reservation_id, Some(branch_id));
        async move {
            let req = self.request(proto::BranchRequest {
                reservation_id: reservation_id.to_string(),
                branch_id: branch_id.to_string(),
            });
            let started = std::time::Instant::now();
            let mut client = self.client.clone();
            let result = match phase {
                SecondPhase::Confirm => client.confirm(req).await,
                SecondPhase::Cancel => client.cancel(req).await,
            }
            .map_err(|s| CallError::from_status(&s));
            crate::telemetry::branch_call(&self.name, name, started.elapsed());
            self.observe(&result);
            phase.outcome(result?.get_ref().state)
        }
        .instrument(span)
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_final_states_answer_confirm_and_cancel() {
        use proto::branch::State as P;
        let confirm = SecondPhase::Confirm;
        assert_eq!(
            confirm.outcome(P::HoldLost.into()).ok(),
            Some(BranchOutcome::HoldLost)
        );
        assert_eq!(
            SecondPhase::Cancel.outcome(P::Confirmed.into()).ok(),
            Some(BranchOutcome::Confirmed)
        );
        let held = confirm.outcome(P::Held.into()).unwrap_err();
        assert_eq!(held.message, "unexpected answer HELD to Confirm");
        assert!(!held.refused);
        let rejected = SecondPhase::Cancel.outcome(P::Rejected.into()).unwrap_err();
        assert_eq!(rejected.message, "unexpected answer REJECTED to Cancel");
        let pending = confirm.outcome(P::Pending.into()).unwrap_err();
        assert_eq!(pending.message, "participant answered confirm with state 1");
        let unknown = SecondPhase::Cancel.outcome(99).unwrap_err();
        assert_eq!(unknown.message, "participant answered cancel with state 99");
    }
}
