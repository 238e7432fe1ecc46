//! What every listener of a role (gRPC, HTTP, metrics) allows its connections (SPEC 7.4):
//! `--header-timeout`, `--idle-timeout`, `--max-connections` (enforced by `crate::conn`).

use std::time::Duration;

use super::parse_duration;
use crate::conn::ConnectionLimits;

/// The connection limits of every listener.
#[derive(clap::Args, Clone, Debug)]
pub struct ConnectionArgs {
    /// Longest time from accepting a connection to its complete request head (TLS handshake,
    /// HTTP/1.1 headers, or the HTTP/2 preface and SETTINGS); then it is closed.
    #[arg(long, env = "HOLDFAST_HEADER_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub header_timeout: Duration,

    /// Longest time a connection may stay open with no request open (a Watch stream is one);
    /// then it is closed.
    #[arg(long, env = "HOLDFAST_IDLE_TIMEOUT", default_value = "5m", value_parser = parse_duration)]
    pub idle_timeout: Duration,

    /// Connections open at once on each listener; beyond, a new one is closed at once.
    #[arg(long, env = "HOLDFAST_MAX_CONNECTIONS", default_value_t = crate::conn::DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
}

impl ConnectionArgs {
    /// The limits, checked (each error naming its flag).
    pub fn limits(&self) -> Result<ConnectionLimits, String> {
        if self.header_timeout.is_zero() {
            return Err("--header-timeout must be > 0".into());
        }
        if self.idle_timeout.is_zero() {
            return Err("--idle-timeout must be > 0".into());
        }
        if self.max_connections == 0 {
            return Err("--max-connections must be at least 1".into());
        }
        Ok(ConnectionLimits {
            header_timeout: self.header_timeout,
            idle_timeout: self.idle_timeout,
            max_connections: self.max_connections,
        })
    }

    /// The settings as TOML lines for `--print-config`.
    pub fn describe(&self, out: &mut String) {
        out.push_str(&format!(
            "header_timeout = \"{}\"\n",
            super::format_duration(self.header_timeout)
        ));
        out.push_str(&format!(
            "idle_timeout = \"{}\"\n",
            super::format_duration(self.idle_timeout)
        ));
        out.push_str(&format!("max_connections = {}\n", self.max_connections));
    }
}
