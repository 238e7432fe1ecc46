//! One TLS handshake of an accepted connection. Connections are accepted, handshaken
//! concurrently and bounded by `crate::conn` (the handshake counts against the listener's
//! header timeout), so one slow or silent client cannot hold up the others; tonic's
//! `Connected` impl for the resulting streams puts the verified client certificate into each
//! request (`Request::peer_certs`).

use std::net::SocketAddr;

use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

/// The handshake, or `None` (logged) when it failed: a plaintext client, an untrusted or
/// missing client certificate. The caller bounds its time.
pub(crate) async fn handshake(
    acceptor: tokio_rustls::TlsAcceptor,
    tcp: TcpStream,
    peer: SocketAddr,
) -> Option<TlsStream<TcpStream>> {
    match acceptor.accept(tcp).await {
        Ok(stream) => Some(stream),
        Err(e) => {
            tracing::info!(%peer, error = %e, "TLS handshake refused");
            None
        }
    }
}
