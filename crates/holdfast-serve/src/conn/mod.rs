//! What an idle or slow peer can hold, the same on every listener (gRPC, HTTP, metrics;
//! plaintext and TLS; SPEC 7.4), in one place:
//!
//! - **A cap per listener.** At most [`ConnectionLimits::max_connections`] connections at once
//!   (TLS handshakes included); one more is accepted and closed at once, never queued, so the
//!   process keeps file descriptors and a flood cannot take the others' place in the backlog.
//! - **A complete request head within [`ConnectionLimits::header_timeout`]** of the accept (the
//!   TLS handshake included): HTTP/1.1 headers, or the HTTP/2 preface and the client's first
//!   SETTINGS frame. A peer that sends nothing, or half a head, is closed then ([`Guarded`]).
//! - **Idle connections closed after [`ConnectionLimits::idle_timeout`]**: idle is "no request
//!   open", told by [`TrackLayer`] in front of the routes, so a long Watch stream is not cut
//!   (HTTP/2 keepalive pings find its dead peers).
//!
//! Each connection dropped by one of these rules is counted in [`CONNECTIONS_DROPPED`] with its
//! `reason`: `max_connections`, `header_timeout` or `idle_timeout`.

mod accept;
mod guarded;
mod track;

use std::time::Duration;

pub use accept::{Accepted, accept_plain, accept_tls};
pub use guarded::Guarded;
pub use track::{Active, ConnInfo, TrackLayer, Tracked};

/// The counter of connections the rules closed, labelled `reason`.
pub const CONNECTIONS_DROPPED: &str = "holdfast_connections_dropped_total";

/// What one listener allows its connections (SPEC 7.4; the flags `--header-timeout`,
/// `--idle-timeout`, `--max-connections`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Longest time from accept to a complete request head (TLS handshake included).
    pub header_timeout: Duration,
    /// Longest time a connection may stay open with no request open.
    pub idle_timeout: Duration,
    /// Connections open at once on this listener; beyond, a new one is closed at once.
    pub max_connections: usize,
}

/// `--header-timeout`'s default.
pub(crate) const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// `--idle-timeout`'s default.
pub(crate) const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// `--max-connections`' default.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// Why a connection was dropped, as [`CONNECTIONS_DROPPED`]'s `reason` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dropped {
    MaxConnections,
    HeaderTimeout,
    IdleTimeout,
}

impl Dropped {
    fn count(self) {
        let reason = match self {
            Dropped::MaxConnections => "max_connections",
            Dropped::HeaderTimeout => "header_timeout",
            Dropped::IdleTimeout => "idle_timeout",
        };
        metrics::counter!(CONNECTIONS_DROPPED, "reason" => reason).increment(1);
    }
}
