//! The gRPC services, called in-process: tonic clients over [`crate::server::InProcess`], each
//! request carrying the HTTP caller's credentials ([`super::credentials::Credentials::request`]),
//! so the auth layer admits (or refuses) the HTTP caller exactly as it would over gRPC.

use crate::proto::admin_client::AdminClient;
use crate::proto::coordinator_client::CoordinatorClient;
use crate::proto::events_client::EventsClient;
use crate::server::InProcess;

/// `tcc.v1.Coordinator` in-process.
pub fn coordinator(grpc: &InProcess) -> CoordinatorClient<InProcess> {
    CoordinatorClient::new(grpc.clone())
}

/// `tcc.v1.Admin` in-process.
pub fn admin(grpc: &InProcess) -> AdminClient<InProcess> {
    AdminClient::new(grpc.clone())
}

/// `tcc.v1.Events` in-process.
pub fn events(grpc: &InProcess) -> EventsClient<InProcess> {
    EventsClient::new(grpc.clone())
}
