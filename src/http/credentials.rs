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
#[derive(Clone, Debug, Default)]
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
    /// The `authorization` header as the caller sent it.
    pub fn authorization(&self) -> Option<&HeaderValue> {
        self.authorization.as_ref()
    }

    /// The verified client certificate chain, for the request's extensions.
    pub fn certificates(&self) -> Option<&VerifiedClientCertificates> {
        self.certificates.as_ref()
    }
}
