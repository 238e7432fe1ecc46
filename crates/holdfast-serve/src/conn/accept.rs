//! Accepting a listener's connections under its [`ConnectionLimits`]: a place under the cap
//! taken at accept (or the connection closed at once), the TLS handshake (when the listener
//! serves TLS) run concurrently within the header timeout, and the connection handed on
//! [`Guarded`].

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;
use tokio_rustls::server::TlsStream;

use super::{ConnectionLimits, Dropped, Guarded};
use crate::tls::ServerTls;

/// Connections ready for the server but not yet taken by it, before a finished handshake
/// waits.
const READY_BACKLOG: usize = 128;

/// How often a refusal at the cap is logged at most (each one is counted).
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// A listener's accepted connections, in the order they became ready. The accepting task
/// ends (closing the socket) when this is dropped.
pub struct Accepted<IO> {
    ready: mpsc::Receiver<Guarded<IO>>,
}

impl<IO> Accepted<IO> {
    /// The next connection; `None` once the accepting task has ended for good.
    pub async fn next(&mut self) -> Option<Guarded<IO>> {
        self.ready.recv().await
    }
}

/// What tonic's `serve_with_incoming_shutdown` takes.
impl<IO> tokio_stream::Stream for Accepted<IO> {
    type Item = io::Result<Guarded<IO>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.ready.poll_recv(cx).map(|next| next.map(Ok))
    }
}

/// The plaintext connections accepted on `tcp` under `limits`, with TCP_NODELAY.
pub fn accept_plain(tcp: TcpListener, limits: ConnectionLimits) -> Accepted<TcpStream> {
    spawn_accepting(tcp, limits, |stream, _| std::future::ready(Some(stream)))
}

/// The TLS connections accepted on `tcp` under `limits`, each handshaken with `config(&tls)`
/// as it is at accept (so a rotated certificate serves the next connection).
pub fn accept_tls(
    tcp: TcpListener,
    limits: ConnectionLimits,
    tls: ServerTls,
    config: fn(&ServerTls) -> Arc<rustls::ServerConfig>,
) -> Accepted<TlsStream<TcpStream>> {
    spawn_accepting(tcp, limits, move |stream, peer| {
        let acceptor = tokio_rustls::TlsAcceptor::from(config(&tls));
        crate::tls::incoming::handshake(acceptor, stream, peer)
    })
}

fn spawn_accepting<IO, H, F>(
    tcp: TcpListener,
    limits: ConnectionLimits,
    handshake: H,
) -> Accepted<IO>
where
    IO: Send + 'static,
    H: Fn(TcpStream, SocketAddr) -> F + Send + 'static,
    F: Future<Output = Option<IO>> + Send + 'static,
{
    let (ready, incoming) = mpsc::channel(READY_BACKLOG);
    tokio::spawn(accept(tcp, limits, handshake, ready));
    Accepted { ready: incoming }
}

async fn accept<IO, H, F>(
    tcp: TcpListener,
    limits: ConnectionLimits,
    handshake: H,
    ready: mpsc::Sender<Guarded<IO>>,
) where
    IO: Send + 'static,
    H: Fn(TcpStream, SocketAddr) -> F,
    F: Future<Output = Option<IO>> + Send + 'static,
{
    let places = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut last_refusal_logged: Option<Instant> = None;
    loop {
        let (stream, peer) = tokio::select! {
            _ = ready.closed() => return,
            accepted = tcp.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: pause rather than spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(place) = places.clone().try_acquire_owned() else {
            // Refused at once: closed now, never queued behind the others.
            drop(stream);
            Dropped::MaxConnections.count();
            if last_refusal_logged.is_none_or(|at| at.elapsed() >= REFUSAL_LOG_EVERY) {
                last_refusal_logged = Some(Instant::now());
                tracing::warn!(%peer, max_connections = limits.max_connections, "connection refused: this listener is at --max-connections (logged at most every 10 s; counted in holdfast_connections_dropped_total)");
            }
            continue;
        };
        let accepted_at = Instant::now();
        // No Nagle delay: every TCC step is a small request waiting on a small answer.
        let _ = stream.set_nodelay(true);
        let handshake = handshake(stream, peer);
        let ready = ready.clone();
        tokio::spawn(async move {
            match tokio::time::timeout_at(accepted_at + limits.header_timeout, handshake).await {
                Ok(Some(io)) => {
                    let _ = ready
                        .send(Guarded::new(io, place, accepted_at, limits))
                        .await;
                }
                Ok(None) => {}
                Err(_) => {
                    Dropped::HeaderTimeout.count();
                    tracing::info!(%peer, timeout = ?limits.header_timeout, "TLS handshake timed out (--header-timeout)");
                }
            }
        });
    }
}
