//! Metrics of the operator control plane (#17): retention's deletions (coordinator and
//! participants) and what participants built on the SDK do (calls, barrier outcomes, orphan
//! reclaims, stock-redis rebuilds and drift). Series an alert or dashboard reads are created
//! at zero when a role starts ([`coordinator_started`], [`participant_started`]), so a rule
//! over a rare event (a FAILED reservation, a reclaim) has a series to read before the first
//! one happens.

use std::time::Duration;

use super::names;

/// Names of the metrics of this module (the coordinator's are in [`super::names`]).
pub mod ops_names {
    // The participants' own are the SDK's (`holdfast-participant`), named there once.
    pub use holdfast_participant::telemetry::names::*;
    pub(crate) const REDIS_REBUILDS: &str = "holdfast_stock_redis_rebuilds_total";
    pub(crate) const REDIS_DRIFT: &str = "holdfast_stock_redis_drift_total";
    pub const OLDEST_WORK_AGE: &str = "holdfast_oldest_work_age_seconds";
    pub const EVENTS_APPENDED: &str = "holdfast_events_appended_total";
}

use ops_names::*;

// What every participant counts is the SDK's; retention's deletions count the coordinator's too.
pub use holdfast_participant::telemetry::{
    barrier_outcome, orphan_reclaimed, participant_call, participant_started, retention_deleted,
};

/// An event became readable (numbered by this process's sequencer), by type (SPEC 10).
pub(crate) fn event_appended(event_type: &'static str) {
    metrics::counter!(EVENTS_APPENDED, "type" => event_type).increment(1);
}

/// stock-redis rebuilt its Redis data set from the durable record.
pub fn redis_rebuilt() {
    metrics::counter!(REDIS_REBUILDS).increment(1);
}

/// stock-redis's reconciler found Redis and the durable record apart (`kind`: what it found).
pub fn redis_drift(kind: &'static str) {
    metrics::counter!(REDIS_DRIFT, "kind" => kind).increment(1);
}

/// How long the oldest unfinished work (a fan-out, a lapsed hold, a refund) has waited.
pub fn oldest_work_age(age: Duration) {
    metrics::gauge!(OLDEST_WORK_AGE).set(age.as_secs_f64());
}

/// stock-redis's series, at zero.
pub fn stock_redis_started() {
    super::metrics_handle();
    metrics::counter!(REDIS_REBUILDS).increment(0);
    metrics::counter!(REDIS_DRIFT, "kind" => "counter").increment(0);
    metrics::counter!(ORPHAN_RECLAIMS, "participant" => "stock-redis").increment(0);
}

/// The coordinator's series that alerts read, at zero.
pub(crate) fn coordinator_started() {
    use crate::domain::State;
    super::metrics_handle();
    for state in [
        State::Held,
        State::Confirmed,
        State::Cancelled,
        State::Expired,
        State::Rejected,
        State::Failed,
    ] {
        metrics::counter!(names::RESERVATIONS, "state" => state.as_str()).increment(0);
    }
    metrics::counter!(names::FAILED).increment(0);
    metrics::counter!(names::EXPIRED_HOLDS).increment(0);
    for state in ["PENDING", "REFUNDED", "FAILED"] {
        metrics::counter!(names::REFUNDS, "state" => state).increment(0);
    }
    metrics::gauge!(names::RECOVERY_BACKLOG).increment(0.0);
    metrics::gauge!(names::HOLD_TO_CONFIRM).increment(0.0);
    metrics::gauge!(OLDEST_WORK_AGE).increment(0.0);
    for table in ["reservations", "branches", "extra_payments"] {
        metrics::counter!(RETENTION_DELETED, "table" => table).increment(0);
    }
}
