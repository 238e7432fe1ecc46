//! The requests the tests send the coordinator, built in one place, and readers of its answers
//! (states, error reasons and metadata).

use std::collections::HashMap;

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
