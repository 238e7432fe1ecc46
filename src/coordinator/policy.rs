//! The coordinator's lifecycle and recovery policy: how long leases last, how unfinished work
//! is retried, how often the reaper sweeps, what a late payment gets, how many live holds a
//! holder may have. Configured in `config`; the input limits are `domain::validate::Limits`.

use std::time::Duration;

use crate::domain::LatePaymentPolicy;
use crate::domain::policy::{Backoff, HoldLimits};

/// Lifecycle and recovery policy beyond the input limits.
#[derive(Clone, Debug)]
pub struct Policy {
    /// How many times Extend may succeed per reservation.
    pub max_extensions: i32,
    /// How long an instance owns a reservation it drives before another may take it over.
    /// Must exceed the longest fan-out (participant timeout x participants).
    pub lease: Duration,
    /// Retry schedule of confirm/release fan-outs that did not finish.
    pub backoff: Backoff,
    /// How often the reaper and recovery look for due work when idle.
    pub sweep_interval: Duration,
    /// Reservations claimed per sweep.
    pub sweep_batch: u32,
    /// What to do with a payment that arrives after expiry.
    pub late_payment: LatePaymentPolicy,
    /// Caps on live reservations, per holder and overall.
    pub hold_limits: HoldLimits,
    /// Caps on open WatchReservation streams, and the shared poller's interval.
    pub watch: super::WatchLimits,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            max_extensions: 1,
            lease: Duration::from_secs(30),
            backoff: Backoff {
                base: Duration::from_millis(200),
                cap: Duration::from_secs(30),
            },
            sweep_interval: Duration::from_millis(250),
            sweep_batch: 64,
            late_payment: LatePaymentPolicy::HonorIfAvailable,
            hold_limits: HoldLimits {
                per_holder: 5,
                total: 0,
            },
            watch: super::WatchLimits::default(),
        }
    }
}
