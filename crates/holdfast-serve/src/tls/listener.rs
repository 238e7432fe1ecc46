//! [`Listener`]: where a server listens and how it speaks there. Every server (gRPC in
//! `server.rs`, `/metrics` in `telemetry.rs`) takes one, so each gets TLS the same way.

use tokio::net::TcpListener;

use super::ServerTls;

/// Where a server listens and how it speaks there: a bound TCP socket, plaintext or TLS.
/// A plain `TcpListener` converts into a plaintext one.
#[derive(Debug)]
pub struct Listener {
    tcp: TcpListener,
    tls: Option<ServerTls>,
}

impl Listener {
    /// `tcp`, serving TLS with `tls` when given (then TLS only).
    pub fn new(tcp: TcpListener, tls: Option<ServerTls>) -> Listener {
        Listener { tcp, tls }
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.tcp.local_addr()
    }

    /// Its TLS, if it serves TLS.
    pub fn tls(&self) -> Option<&ServerTls> {
        self.tls.as_ref()
    }

    /// The socket and its TLS.
    pub fn into_parts(self) -> (TcpListener, Option<ServerTls>) {
        (self.tcp, self.tls)
    }
}

impl From<TcpListener> for Listener {
    fn from(tcp: TcpListener) -> Listener {
        Listener::new(tcp, None)
    }
}
