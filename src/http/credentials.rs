//! Who an HTTP caller says it is, as the gRPC auth layer reads it: its `authorization` header
//! and, on a listener that verified one (`--tls-client-ca`), its client certificate chain. The
//! JSON API hands both to the in-process gRPC routes, so a caller identified by its
//! certificate alone is admitted here as it is over gRPC (SPEC 7.2). The HTTP connection's
//! addresses go along too, so what the gRPC side counts per connection (open Watch streams)
//! counts this connection.

use std::convert::Infallible;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderValue, header};
use tonic::transport::server::TcpConnectInfo;

use crate::auth::VerifiedClientCertificates;

/// One HTTP connection: its addresses, and what its far end proved (on an mTLS listener, the
/// client certificate chain its handshake verified), and its handle for counting its open
/// requests (`crate::conn`).
#[derive(Clone, Debug, Default)]
pub(crate) struct HttpPeer {
    pub certificates: Option<VerifiedClientCertificates>,
    pub connection: Option<TcpConnectInfo>,
    pub active: Option<crate::conn::Active>,
}

/// A caller's credentials, taken from each JSON API request, and the connection it came on.
#[derive(Clone, Debug)]
pub(crate) struct Credentials {
    authorization: Option<HeaderValue>,
    certificates: Option<VerifiedClientCertificates>,
    connection: Option<TcpConnectInfo>,
}

impl<S: Send + Sync> FromRequestParts<S> for Credentials {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Credentials, Infallible> {
        let peer = parts.extensions.get::<ConnectInfo<HttpPeer>>();
        Ok(Credentials {
            authorization: parts.headers.get(header::AUTHORIZATION).cloned(),
            certificates: peer.and_then(|peer| peer.0.certificates.clone()),
            connection: peer.and_then(|peer| peer.0.connection.clone()),
        })
    }
}

impl Credentials {
    /// `message` as a gRPC request carrying these credentials: the header as its metadata, the
    /// certificate chain and the connection's addresses as extensions (read by the gRPC side
    /// as a network request's own). A header that cannot be metadata (not visible ASCII) is
    /// refused here as the auth layer would refuse a bad credential.
    pub fn request<T>(&self, message: T) -> Result<tonic::Request<T>, tonic::Status> {
        let mut request = tonic::Request::new(message);
        if let Some(certificates) = &self.certificates {
            request.extensions_mut().insert(certificates.clone());
        }
        if let Some(connection) = &self.connection {
            request.extensions_mut().insert(connection.clone());
        }
        if let Some(value) = &self.authorization {
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

    /// An empty request for gRPC `method` carrying these credentials, to ask the auth layer's
    /// [`crate::auth::Authenticator`] whether it would admit them.
    pub fn probe(&self, method: &str) -> Result<axum::http::Request<()>, tonic::Status> {
        let mut probe = axum::http::Request::builder()
            .uri(method)
            .body(())
            .map_err(|e| tonic::Status::internal(format!("building the auth check: {e}")))?;
        if let Some(value) = &self.authorization {
            probe
                .headers_mut()
                .insert(header::AUTHORIZATION, value.clone());
        }
        if let Some(certificates) = &self.certificates {
            probe.extensions_mut().insert(certificates.clone());
        }
        Ok(probe)
    }
}
