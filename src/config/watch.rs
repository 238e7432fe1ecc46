//! The coordinator's bounds on `WatchReservation` and `Events/Subscribe` streams (SPEC 7.4, 10): how many may
//! be open per process, per client connection and per principal, over gRPC and SSE alike
//! (beyond, `RESOURCE_EXHAUSTED` reason `WATCH_LIMIT_EXCEEDED`), and how often one shared read
//! looks for changes made elsewhere.

use std::time::Duration;

use super::parse_duration;
use crate::coordinator::WatchLimits;

/// Bounds on WatchReservation streams.
#[derive(clap::Args, Clone, Debug)]
pub struct WatchArgs {
    /// Streams (WatchReservation and Events Subscribe) open at once in this process; beyond,
    /// RESOURCE_EXHAUSTED.
    #[arg(long, env = "HOLDFAST_MAX_WATCHES", default_value_t = 1024)]
    pub max_watches: usize,

    /// Streams (WatchReservation and Events Subscribe) open at once on one client connection.
    #[arg(
        long,
        env = "HOLDFAST_MAX_WATCHES_PER_CONNECTION",
        default_value_t = 32
    )]
    pub max_watches_per_connection: usize,

    /// Streams (WatchReservation and Events Subscribe; gRPC and SSE) open at once by one principal (with
    /// authentication off, every caller is the one anonymous principal).
    #[arg(
        long,
        env = "HOLDFAST_MAX_WATCHES_PER_PRINCIPAL",
        default_value_t = 256
    )]
    pub max_watches_per_principal: usize,

    /// How often one shared read checks every watched reservation for changes made by other
    /// replicas and for lapsed holds (changes made here reach watchers at once).
    #[arg(long, env = "HOLDFAST_WATCH_POLL_INTERVAL", default_value = "250ms", value_parser = parse_duration)]
    pub watch_poll_interval: Duration,
}

impl WatchArgs {
    /// The limits, checked.
    pub fn limits(&self) -> Result<WatchLimits, String> {
        if self.watch_poll_interval.is_zero() {
            return Err("--watch-poll-interval must be > 0".into());
        }
        Ok(WatchLimits {
            per_process: self.max_watches,
            per_connection: self.max_watches_per_connection,
            per_principal: self.max_watches_per_principal,
            poll: self.watch_poll_interval,
        })
    }

    /// The settings as TOML lines for `--print-config`.
    pub fn describe(&self, out: &mut String) {
        out.push_str(&format!("max_watches = {}\n", self.max_watches));
        out.push_str(&format!(
            "max_watches_per_connection = {}\n",
            self.max_watches_per_connection
        ));
        out.push_str(&format!(
            "max_watches_per_principal = {}\n",
            self.max_watches_per_principal
        ));
        out.push_str(&format!(
            "watch_poll_interval = \"{}\"\n",
            super::format_duration(self.watch_poll_interval)
        ));
    }
}
