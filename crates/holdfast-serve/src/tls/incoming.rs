//! Accepting TLS connections: a listener's connections, handshaken concurrently, each within
//! [`HANDSHAKE_TIMEOUT`], so one slow or silent client cannot hold up the others. The result
//! is a stream of `tokio_rustls` server streams for tonic's `serve_with_incoming_shutdown`;
//! tonic's `Connected` impl for them puts the verified client certificate into each request
//! (`Request::peer_certs`).

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

use super::ServerTls;

/// Longest time a client may take to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshaken connections not yet taken by the server, before accepting waits.
const READY_BACKLOG: usize = 128;

/// The TLS connections accepted on `listener` for gRPC (ALPN `h2`), with TCP_NODELAY. The
/// accepting task ends when the stream is dropped (the server stopped), closing the listener.
pub fn grpc(
    listener: TcpListener,
    tls: ServerTls,
) -> ReceiverStream<io::Result<TlsStream<TcpStream>>> {
    let (ready, incoming) = mpsc::channel(READY_BACKLOG);
    tokio::spawn(accept(listener, tls, ServerTls::grpc_config, ready));
    ReceiverStream::new(incoming)
}

/// The TLS connections accepted on `listener` for an HTTP/1.1 server (ALPN `http/1.1`; the
/// console and JSON API), handshaken concurrently like [`grpc`]'s.
pub fn http1_stream(
    listener: TcpListener,
    tls: ServerTls,
) -> mpsc::Receiver<io::Result<TlsStream<TcpStream>>> {
    let (ready, incoming) = mpsc::channel(READY_BACKLOG);
    tokio::spawn(accept(listener, tls, ServerTls::http1_config, ready));
    incoming
}

async fn accept(
    listener: TcpListener,
    tls: ServerTls,
    config: fn(&ServerTls) -> std::sync::Arc<rustls::ServerConfig>,
    ready: mpsc::Sender<io::Result<TlsStream<TcpStream>>>,
) {
    loop {
        let (tcp, peer) = tokio::select! {
            _ = ready.closed() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: pause rather than spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // No Nagle delay: every TCC step is a small request waiting on a small answer.
        let _ = tcp.set_nodelay(true);
        let acceptor = tokio_rustls::TlsAcceptor::from(config(&tls));
        let ready = ready.clone();
        tokio::spawn(async move {
            if let Some(stream) = handshake(acceptor, tcp, peer).await {
                let _ = ready.send(Ok(stream)).await;
            }
        });
    }
}

/// One TLS handshake for an HTTP/1.1 listener (ALPN `http/1.1`), within the timeout.
pub async fn http1(
    tls: &ServerTls,
    tcp: TcpStream,
    peer: SocketAddr,
) -> Option<TlsStream<TcpStream>> {
    handshake(
        tokio_rustls::TlsAcceptor::from(tls.http1_config()),
        tcp,
        peer,
    )
    .await
}

/// The handshake, or `None` (logged) when it failed or timed out: a plaintext client, an
/// untrusted or missing client certificate, a client that went quiet.
async fn handshake(
    acceptor: tokio_rustls::TlsAcceptor,
    tcp: TcpStream,
    peer: SocketAddr,
) -> Option<TlsStream<TcpStream>> {
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(e)) => {
            tracing::info!(%peer, error = %e, "TLS handshake refused");
            None
        }
        Err(_) => {
            tracing::info!(%peer, timeout = ?HANDSHAKE_TIMEOUT, "TLS handshake timed out");
            None
        }
    }
}
