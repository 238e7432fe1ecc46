//! The requests the tests send the coordinator, built in one place, and readers of its answers
//! (states, error reasons and metadata).

use std::collections::HashMap;
use std::time::Duration;

use holdfast::proto;
use tonic::Status;

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
        queue: None,
    }
}

/// The reservation a Confirm, Cancel or Extend names and the hold token it presents. It builds
/// each of those requests, so a field added to one of them later is one edit here.
#[derive(Clone, Debug)]
pub struct Decide {
    reservation_id: String,
    hold_token: String,
}

impl Decide {
    /// A decision on `r`, presenting the token its Reserve answered with.
    pub fn on(r: &proto::Reservation) -> Decide {
        Decide::with_token(&r.id, &r.hold_token)
    }

    /// A decision on `reservation_id` presenting `hold_token` (a wrong or empty one, say).
    pub fn with_token(reservation_id: &str, hold_token: &str) -> Decide {
        Decide {
            reservation_id: reservation_id.to_owned(),
            hold_token: hold_token.to_owned(),
        }
    }

    /// Confirm, with no payment.
    pub fn confirm(&self) -> proto::ConfirmRequest {
        self.confirm_request(None)
    }

    /// Confirm, recording `payment` with the decision.
    pub fn confirm_with(&self, payment: &proto::Payment) -> proto::ConfirmRequest {
        self.confirm_request(Some(payment.clone()))
    }

    fn confirm_request(&self, payment: Option<proto::Payment>) -> proto::ConfirmRequest {
        proto::ConfirmRequest {
            reservation_id: self.reservation_id.clone(),
            hold_token: self.hold_token.clone(),
            payment,
        }
    }

    /// Cancel, giving no reason.
    pub fn cancel(&self) -> proto::CancelRequest {
        self.cancel_because("")
    }

    /// Cancel, giving `reason`.
    pub fn cancel_because(&self, reason: &str) -> proto::CancelRequest {
        proto::CancelRequest {
            reservation_id: self.reservation_id.clone(),
            hold_token: self.hold_token.clone(),
            reason: reason.to_owned(),
        }
    }

    /// Extend by `ttl` (`None`: the coordinator's default), applied once per non-empty
    /// `request_id`.
    pub fn extend(&self, ttl: Option<Duration>, request_id: &str) -> proto::ExtendRequest {
        proto::ExtendRequest {
            reservation_id: self.reservation_id.clone(),
            hold_token: self.hold_token.clone(),
            ttl: ttl.map(proto_duration),
            request_id: request_id.to_owned(),
        }
    }
}

/// `d` as a protobuf `Duration`.
pub fn proto_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

/// `PutResources` of `(resource, capacity)` pairs: creates or resizes them at a participant.
pub fn put_resources_request(resources: &[(&str, i64)]) -> proto::PutResourcesRequest {
    proto::PutResourcesRequest {
        resources: resources
            .iter()
            .map(|(resource, capacity)| proto::ResourceSpec {
                resource: (*resource).to_owned(),
                capacity: *capacity,
            })
            .collect(),
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
