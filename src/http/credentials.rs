//! Who an HTTP caller says it is, as the gRPC auth layer reads it: its `authorization` header
//! and, on a listener that verified one (`--tls-client-ca`), its client certificate chain. The
//! JSON API hands both to the in-process gRPC routes, so a caller identified by its
//! certificate alone is admitted here as it is over gRPC (SPEC 7.2).

use std::convert::Infallible;

use axum::extract::connect_info::Connected;
use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderValue, header};
use axum::serve::IncomingStream;
use tokio::net::TcpListener;

use crate::auth::VerifiedClientCertificates;

/// What the far end of one HTTP connection proved: on an mTLS listener, the client
/// certificate chain its handshake verified.
#[derive(Clone, Debug, Default)]
pub struct HttpPeer {
    pub certificates: Option<VerifiedClientCertificates>,
}

/// A plaintext connection proves nothing.
impl Connected<IncomingStream<'_, TcpListener>> for HttpPeer {
    fn connect_info(_: IncomingStream<'_, TcpListener>) -> HttpPeer {
        HttpPeer::default()
    }
}

/// A caller's credentials, taken from each JSON API request.
#[derive(Clone, Debug)]
pub struct Credentials {
    authorization: Option<HeaderValue>,
    certificates: Option<VerifiedClientCertificates>,
}

impl<S: Send + Sync> FromRequestParts<S> for Credentials {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Credentials, Infallible> {
        Ok(Credentials {
            authorization: parts.headers.get(header::AUTHORIZATION).cloned(),
            certificates: parts
                .extensions
                .get::<ConnectInfo<HttpPeer>>()
                .and_then(|peer| peer.0.certificates.clone()),
        })
    }
}

impl Credentials {
    /// `message` as a gRPC request carrying these credentials: the header as its metadata, the
    /// certificate chain as an extension. A header that cannot be metadata (not visible ASCII)
    /// is refused here as the auth layer would refuse a bad credential.
    pub fn request<T>(&self, message: T) -> Result<tonic::Request<T>, tonic::Status> {
        let mut request = tonic::Request::new(message);
        if let Some(certificates) = &self.certificates {
            request.extensions_mut().insert(certificates.clone());
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
