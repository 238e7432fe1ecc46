//! [`Listener`]: where a server listens, how it speaks there and what it allows its
//! connections. Every server (gRPC in `server.rs`, HTTP, `/metrics`) takes one, so each gets
//! TLS and the connection limits (`crate::conn`) the same way.

use tokio::net::TcpListener;

use super::ServerTls;
use crate::conn::ConnectionLimits;

/// Where a server listens and how it speaks there: a bound TCP socket, plaintext or TLS, and
/// its [`ConnectionLimits`] (the defaults unless set).
/// A plain `TcpListener` converts into a plaintext one.
#[derive(Debug)]
pub struct Listener {
    tcp: TcpListener,
    tls: Option<ServerTls>,
    limits: ConnectionLimits,
}

impl Listener {
    /// `tcp`, serving TLS with `tls` when given (then TLS only), with the default limits.
    pub fn new(tcp: TcpListener, tls: Option<ServerTls>) -> Listener {
        Listener {
            tcp,
            tls,
            limits: ConnectionLimits::default(),
        }
    }

    /// The same listener with `limits` for its connections.
    pub fn with_limits(self, limits: ConnectionLimits) -> Listener {
        Listener { limits, ..self }
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.tcp.local_addr()
    }

    /// Its TLS, if it serves TLS.
    pub fn tls(&self) -> Option<&ServerTls> {
        self.tls.as_ref()
    }

    /// What it allows its connections.
    pub fn limits(&self) -> ConnectionLimits {
        self.limits
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
