//! The gRPC services, called in-process: tonic clients over [`crate::server::InProcess`], each
//! request carrying the HTTP caller's credentials (its `authorization` header as metadata, its
//! verified client certificate as an extension), so the auth layer admits (or refuses) the
//! HTTP caller exactly as it would over gRPC.

use super::credentials::Credentials;

use crate::proto::admin_client::AdminClient;
use crate::proto::coordinator_client::CoordinatorClient;
use crate::server::InProcess;

/// `tcc.v1.Coordinator` in-process.
pub fn coordinator(grpc: &InProcess) -> CoordinatorClient<InProcess> {
    CoordinatorClient::new(grpc.clone())
}

/// `tcc.v1.Admin` in-process.
pub fn admin(grpc: &InProcess) -> AdminClient<InProcess> {
    AdminClient::new(grpc.clone())
}

/// `message` as a gRPC request with the caller's credentials. A header that cannot be metadata
/// (not visible ASCII) is refused here as the auth layer would refuse a bad credential.
pub fn request<T>(
    credentials: &Credentials,
    message: T,
) -> Result<tonic::Request<T>, tonic::Status> {
    let mut request = tonic::Request::new(message);
    if let Some(certificates) = credentials.certificates() {
        request.extensions_mut().insert(certificates.clone());
    }
    if let Some(value) = credentials.authorization() {
        let value =
            tonic::metadata::AsciiMetadataValue::try_from(value.as_bytes()).map_err(|_| {
                crate::auth::refusal(
                    crate::auth::Refused::Unauthenticated,
                    "the authorization header is not `Bearer <key>`",
                )
            })?;
        request.metadata_mut().insert("authorization", value);
    }
    Ok(request)
}
