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
    /// Must cover the longest call chain a lease covers ([`Policy::lease_needed`]; checked at
    /// start by `config`).
    pub lease: Duration,
    /// Retry schedule of confirm/release fan-outs that did not finish.
    pub backoff: Backoff,
    /// How often the reaper and recovery look for due work when idle.
    pub sweep_interval: Duration,
    /// Reservations claimed per sweep.
    pub sweep_batch: u32,
    /// Recovery drives in flight at once (each claimed reservation is driven on its own; a
    /// sweep claims no more than this leaves room for).
    pub max_recovery_drives: usize,
    /// Recovery drives in flight at once that involve one participant, so a participant that
    /// stalls ties up at most this many while the others' work goes on.
    pub max_recovery_drives_per_participant: usize,
    /// What to do with a payment that arrives after expiry.
    pub late_payment: LatePaymentPolicy,
    /// Caps on live reservations, per holder and overall.
    pub hold_limits: HoldLimits,
    /// Caps on open WatchReservation streams, and the shared poller's interval.
    pub watch: super::WatchLimits,
    /// How long finished reservations are kept, and how the purge is paced.
    pub retention: super::Retention,
    /// How long a participant's refusal of a hold refuses the same hold again without a Try
    /// or a write (`sold_out`); zero turns the fast path off.
    pub sold_out_hint: Duration,
    /// The longest time an event subscription (`tcc.v1.Events/Subscribe`) goes without a
    /// heartbeat (SPEC 10: at most 15 s).
    pub events_heartbeat: Duration,
    /// Waitlists: queue length cap and sweep period (SPEC 11).
    pub queue: crate::domain::waitlist::QueuePolicy,
}

/// Calls to one participant a leased step may make one after another before it renews its
/// lease or gives it up: a fan-out (Confirm or Cancel, in parallel), then the refund call after
/// it. A placement renews its lease before each Try and after the last, and recovery renews a
/// claim that waited for its turn at a participant.
pub const LEASED_CALL_PHASES: u32 = 2;

impl Policy {
    /// The shortest lease that covers the longest call chain it must: an RPC's whole life
    /// (`request_timeout`: the server ends the handler then) plus [`LEASED_CALL_PHASES`] calls
    /// to the slowest participant (`longest_call`, its timeout), so a driver's lease never
    /// runs out while it still acts on it - only a process paused past it (or a stalled
    /// database) can lose it, and then its conditional writes decide.
    pub fn lease_needed(longest_call: Duration, request_timeout: Duration) -> Duration {
        request_timeout.saturating_add(longest_call.saturating_mul(LEASED_CALL_PHASES))
    }
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            max_extensions: 1,
            lease: Duration::from_secs(60),
            backoff: Backoff {
                base: Duration::from_millis(200),
                cap: Duration::from_secs(30),
            },
            sweep_interval: Duration::from_millis(250),
            sweep_batch: 64,
            max_recovery_drives: 256,
            max_recovery_drives_per_participant: 32,
            late_payment: LatePaymentPolicy::HonorIfAvailable,
            hold_limits: HoldLimits {
                per_holder: 5,
                total: 0,
            },
            watch: super::WatchLimits::default(),
            retention: super::Retention::default(),
            sold_out_hint: Duration::from_secs(1),
            events_heartbeat: Duration::from_secs(15),
            queue: crate::domain::waitlist::QueuePolicy::default(),
        }
    }
}
