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
    pub const EVENTS_DELIVERED: &str = "holdfast_events_delivered_total";
    pub const EVENTS_LAG: &str = "holdfast_events_lag_seconds";
    pub const SINK_PAUSED: &str = "holdfast_events_sink_paused";
    pub const WEBHOOK_FAILURES: &str = "holdfast_webhook_failures_total";
    pub const QUEUE_LENGTH: &str = "holdfast_queue_length";
    pub const QUEUE_WAIT: &str = "holdfast_queue_wait_seconds";
    pub const QUEUE_OFFERS: &str = "holdfast_queue_offers_total";
}

use ops_names::*;

/// The `task` label of the coordinator's and stock-redis's background loops
/// (`holdfast_background_restarts_total`): named once for where each loop is spawned and where
/// its series starts at zero.
pub mod tasks {
    pub(crate) const RECOVERY: &str = "recovery";
    pub(crate) const RETENTION: &str = "retention";
    pub(crate) const EVENTS: &str = "events";
    /// A sink's delivery loop: `sink:` and the sink's name (`sink:nats`, `sink:webhook:orders`).
    pub fn sink(name: &str) -> String {
        format!("sink:{name}")
    }
    pub const RECONCILER: &str = "reconciler";
}

// What every participant counts is the SDK's; retention's deletions count the coordinator's too.
pub use holdfast_participant::telemetry::{
    barrier_outcome, orphan_reclaimed, participant_call, participant_started, retention_deleted,
};

/// An event became readable, by type (SPEC 10); each process following the log counts every
/// event, so replicas' series are not to be summed.
pub(crate) fn event_appended(event_type: &'static str) {
    metrics::counter!(EVENTS_APPENDED, "type" => event_type).increment(1);
}

/// A sink's series, at zero (its delivery loop started).
pub fn sink_started(sink: &str) {
    super::metrics_handle();
    metrics::counter!(EVENTS_DELIVERED, "sink" => sink.to_owned()).increment(0);
    metrics::gauge!(EVENTS_LAG, "sink" => sink.to_owned()).set(0.0);
    metrics::gauge!(SINK_PAUSED, "sink" => sink.to_owned()).set(0.0);
    holdfast_serve::background::restarts_at_zero(tasks::sink(sink));
}

/// `n` events were taken for good by `sink`.
pub fn events_delivered(sink: &str, n: usize) {
    metrics::counter!(EVENTS_DELIVERED, "sink" => sink.to_owned()).increment(n as u64);
}

/// How long the oldest event `sink` has not delivered has waited.
pub fn sink_lag(sink: &str, lag: Duration) {
    metrics::gauge!(EVENTS_LAG, "sink" => sink.to_owned()).set(lag.as_secs_f64());
}

/// Whether `sink` is paused (a webhook that failed past its give-up period), as 1 or 0.
pub fn sink_paused(sink: &str, paused: bool) {
    metrics::gauge!(SINK_PAUSED, "sink" => sink.to_owned()).set(if paused { 1.0 } else { 0.0 });
}

/// A webhook's series, at zero.
pub fn webhook_started(endpoint: &str) {
    super::metrics_handle();
    metrics::counter!(WEBHOOK_FAILURES, "endpoint" => endpoint.to_owned()).increment(0);
}

/// A POST to the webhook `endpoint` (its name) failed: not 2xx, a timeout, no connection.
pub fn webhook_failed(endpoint: &str) {
    metrics::counter!(WEBHOOK_FAILURES, "endpoint" => endpoint.to_owned()).increment(1);
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
    holdfast_serve::background::restarts_at_zero(tasks::RECONCILER);
}

/// The coordinator's series that alerts read, at zero.
pub(crate) fn coordinator_started() {
    use crate::domain::State;
    use crate::domain::admin::AdminAction;
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
    metrics::counter!(names::WATCH_POLLS).increment(0);
    for task in [tasks::RECOVERY, tasks::RETENTION, tasks::EVENTS] {
        holdfast_serve::background::restarts_at_zero(task);
    }
    for action in [
        AdminAction::ForceCancel,
        AdminAction::ResolveConfirmed,
        AdminAction::ResolveCancelled,
        AdminAction::Retry,
    ] {
        metrics::counter!(names::ADMIN_ACTIONS, "action" => action.as_str()).increment(0);
    }
    for table in ["reservations", "branches", "extra_payments"] {
        metrics::counter!(RETENTION_DELETED, "table" => table).increment(0);
    }
}

/// A waitlist offer's outcome (SPEC 11): `placed`, `refused`, or `wait_ended` (a wait over
/// before any offer placed it).
pub(crate) fn queue_offer(outcome: &'static str) {
    metrics::counter!(QUEUE_OFFERS, "outcome" => outcome).increment(1);
}

/// Reservations waiting in queues, per participant, as the last sweep found them; a
/// participant whose queues emptied reads 0.
pub(crate) fn queue_lengths(queues: &[(crate::domain::waitlist::QueueKey, i64)]) {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    static SEEN: Mutex<BTreeMap<String, f64>> = Mutex::new(BTreeMap::new());
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    for n in seen.values_mut() {
        *n = 0.0;
    }
    for (key, n) in queues {
        *seen.entry(key.participant.clone()).or_default() += *n as f64;
    }
    for (participant, n) in seen.iter() {
        metrics::gauge!(QUEUE_LENGTH, "participant" => participant.clone()).set(*n);
    }
}

/// A queued reservation was placed by an offer, having joined its queue at `since`.
pub(crate) fn queue_waited(since: chrono::DateTime<chrono::Utc>) {
    let waited = (chrono::Utc::now() - since).to_std().unwrap_or_default();
    metrics::histogram!(QUEUE_WAIT).record(waited.as_secs_f64());
}
