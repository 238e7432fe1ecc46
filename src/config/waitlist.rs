//! The coordinator's waitlist settings (SPEC 11): the longest wait a Reserve may ask, the
//! longest queue per resource, and how often capacity that came back another way is looked
//! for.

use std::time::Duration;

use super::parse_duration;
use crate::domain::waitlist::QueuePolicy;

/// Waitlist bounds.
#[derive(clap::Args, Clone, Debug)]
pub struct WaitlistArgs {
    /// The longest `queue.wait_up_to` a Reserve may ask; longer is refused (INVALID_ARGUMENT).
    #[arg(long, env = "HOLDFAST_MAX_QUEUE_WAIT", default_value = "1h", value_parser = parse_duration)]
    pub max_queue_wait: Duration,

    /// Reservations one resource's waitlist takes; beyond, RESOURCE_EXHAUSTED QUEUE_FULL.
    #[arg(long, env = "HOLDFAST_MAX_QUEUE_LENGTH", default_value_t = 10_000)]
    pub max_queue_length: u32,

    /// How often every waitlist is offered what is free (units that came back through
    /// ResourceAdmin or another replica, an offer a crash lost) and ended waits are rejected.
    /// Releases made here are offered at once.
    #[arg(long, env = "HOLDFAST_QUEUE_SWEEP", default_value = "2s", value_parser = parse_duration)]
    pub queue_sweep: Duration,
}

impl WaitlistArgs {
    /// The waitlist policy, checked (each error names its flag).
    pub fn policy(&self) -> Result<QueuePolicy, String> {
        if self.max_queue_wait.is_zero() {
            return Err("--max-queue-wait must be > 0".into());
        }
        if self.max_queue_length == 0 {
            return Err("--max-queue-length must be >= 1".into());
        }
        if self.queue_sweep.is_zero() {
            return Err("--queue-sweep must be > 0".into());
        }
        Ok(QueuePolicy {
            max_length: self.max_queue_length,
            sweep: self.queue_sweep,
        })
    }

    /// The settings as TOML lines for `--print-config`.
    pub fn describe(&self, out: &mut String) {
        out.push_str(&format!(
            "max_queue_wait = \"{}\"\n",
            super::format_duration(self.max_queue_wait)
        ));
        out.push_str(&format!("max_queue_length = {}\n", self.max_queue_length));
        out.push_str(&format!(
            "queue_sweep = \"{}\"\n",
            super::format_duration(self.queue_sweep)
        ));
    }
}
