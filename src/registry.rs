//! The participant registry: name -> endpoint, one long-lived HTTP/2 channel per participant,
//! and the three TCC calls translated to domain outcomes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tonic::transport::{Channel, Endpoint};
use uuid::Uuid;

use crate::domain::{BranchOutcome, BranchState, Hold, TryOutcome};
use crate::proto;
use crate::proto::participant_client::ParticipantClient;

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

/// One registered participant and its channel.
#[derive(Clone, Debug)]
pub struct ParticipantHandle {
    name: String,
    timeout: Duration,
    client: ParticipantClient<Channel>,
}

/// Every participant the coordinator knows, by name.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    participants: Arc<HashMap<String, ParticipantHandle>>,
}

impl Registry {
    /// Builds the registry. Channels connect lazily and reconnect by themselves.
    pub fn new(endpoints: &[ParticipantEndpoint]) -> Result<Registry, RegistryError> {
        let mut participants = HashMap::new();
        for ep in endpoints {
            let endpoint = Endpoint::from_shared(ep.url.clone())
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
            let handle = ParticipantHandle {
                name: ep.name.clone(),
                timeout: ep.timeout,
                client: ParticipantClient::new(endpoint.connect_lazy()),
            };
            if participants.insert(ep.name.clone(), handle).is_some() {
                return Err(RegistryError::Duplicate(ep.name.clone()));
            }
        }
        Ok(Registry {
            participants: Arc::new(participants),
        })
    }

    /// The participant registered under `name`.
    pub fn get(&self, name: &str) -> Option<&ParticipantHandle> {
        self.participants.get(name)
    }

    /// Registered names, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.participants.keys().cloned().collect();
        v.sort();
        v
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

fn branch_state_from_proto(s: i32) -> Option<BranchState> {
    use proto::branch::State as P;
    match P::try_from(s).ok()? {
        P::Held => Some(BranchState::Held),
        P::Rejected => Some(BranchState::Rejected),
        P::Confirmed => Some(BranchState::Confirmed),
        P::Cancelled => Some(BranchState::Cancelled),
        P::HoldLost => Some(BranchState::HoldLost),
        P::Pending | P::Unspecified => None,
    }
}

impl ParticipantHandle {
    /// The registered name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut req = tonic::Request::new(msg);
        req.set_timeout(self.timeout);
        req
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
        let req = self.request(proto::TryRequest {
            reservation_id: reservation_id.to_string(),
            branch_id: branch_id.to_string(),
            holder: holder.to_owned(),
            items: items.iter().map(to_proto_hold).collect(),
            expires_at: Some(to_timestamp(expires_at)),
        });
        let resp = self
            .client
            .clone()
            .r#try(req)
            .await
            .map_err(|s| CallError::from_status(&s))?
            .into_inner();
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

    /// Asks the participant to finalise the branch.
    pub async fn confirm(
        &self,
        reservation_id: Uuid,
        branch_id: Uuid,
    ) -> Result<BranchOutcome, CallError> {
        let req = self.request(proto::BranchRequest {
            reservation_id: reservation_id.to_string(),
            branch_id: branch_id.to_string(),
        });
        let resp = self
            .client
            .clone()
            .confirm(req)
            .await
            .map_err(|s| CallError::from_status(&s))?;
        branch_state_from_proto(resp.get_ref().state).ok_or_else(|| {
            CallError::protocol(format!(
                "participant answered Confirm with state {}",
                resp.get_ref().state
            ))
        })
    }

    /// Asks the participant to release the branch.
    pub async fn cancel(
        &self,
        reservation_id: Uuid,
        branch_id: Uuid,
    ) -> Result<BranchOutcome, CallError> {
        let req = self.request(proto::BranchRequest {
            reservation_id: reservation_id.to_string(),
            branch_id: branch_id.to_string(),
        });
        let resp = self
            .client
            .clone()
            .cancel(req)
            .await
            .map_err(|s| CallError::from_status(&s))?;
        branch_state_from_proto(resp.get_ref().state).ok_or_else(|| {
            CallError::protocol(format!(
                "participant answered Cancel with state {}",
                resp.get_ref().state
            ))
        })
    }
}
