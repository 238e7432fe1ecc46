//! Reaching an `https://` participant: a tonic channel whose every connection is TCP and then
//! a TLS handshake with the client config current at that moment (so renewed client
//! certificates and CAs are picked up by new connections), verifying the URL's host. There is
//! no plaintext path: a failed handshake is an error that says so.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::{ClientTls, TlsError, material};

/// See [`ClientTls::connect_lazy`].
pub(super) fn connect_lazy(
    tls: ClientTls,
    endpoint: tonic::transport::Endpoint,
    url: &str,
) -> Result<tonic::transport::Channel, TlsError> {
    let invalid = |problem: &str| TlsError::Config(format!("participant URL {url:?}: {problem}"));
    let uri: http::Uri = url.parse().map_err(|_| invalid("not a URL"))?;
    if uri.scheme_str() != Some("https") {
        return Err(invalid("TLS is only for https:// URLs"));
    }
    let host = uri.host().ok_or_else(|| invalid("no host"))?;
    // A bracketed IPv6 literal is an address, not a name.
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let server_name = ServerName::try_from(bare.to_owned())
        .map_err(|_| invalid("its host is not a valid DNS name or IP address"))?;
    let connector = TlsConnector {
        tls,
        host: bare.to_owned(),
        port: uri.port_u16().unwrap_or(443),
        server_name,
    };
    // Requests keep the https scheme the URL promised; the connection below is TLS.
    Ok(endpoint.origin(uri).connect_with_connector_lazy(connector))
}

/// Opens one TLS connection to a participant (tonic calls it for each new connection).
#[derive(Clone)]
struct TlsConnector {
    tls: ClientTls,
    host: String,
    port: u16,
    server_name: ServerName<'static>,
}

type Connecting = Pin<Box<dyn Future<Output = io::Result<TokioIo<TlsStream<TcpStream>>>> + Send>>;

impl tower::Service<http::Uri> for TlsConnector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = io::Error;
    type Future = Connecting;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// The URI tonic passes is the endpoint's `http://` twin; the connector dials its own
    /// target, taken from the `https://` URL. (tonic bounds the whole call by the endpoint's
    /// connect timeout.)
    fn call(&mut self, _uri: http::Uri) -> Connecting {
        let this = self.clone();
        Box::pin(async move {
            let tcp = TcpStream::connect((this.host.as_str(), this.port)).await?;
            tcp.set_nodelay(true)?;
            let target = format!("{}:{}", this.host, this.port);
            let tls = tokio_rustls::TlsConnector::from(this.tls.config())
                .connect(this.server_name.clone(), tcp)
                .await
                .map_err(|e| {
                    io::Error::new(e.kind(), format!("TLS handshake with {target} failed: {e}"))
                })?;
            match tls.get_ref().1.alpn_protocol() {
                // No ALPN at all (some proxies): HTTP/2 is spoken regardless.
                None => {}
                Some(protocol) if protocol == material::ALPN_H2 => {}
                Some(other) => {
                    return Err(io::Error::other(format!(
                        "TLS with {target} negotiated {:?} instead of HTTP/2 (h2)",
                        String::from_utf8_lossy(other)
                    )));
                }
            }
            Ok(TokioIo::new(tls))
        })
    }
}
