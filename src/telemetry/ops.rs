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
    pub const RETENTION_DELETED: &str = "holdfast_retention_deleted_total";
    pub const PARTICIPANT_CALLS: &str = "holdfast_participant_calls_total";
    pub const PARTICIPANT_CALL_SECONDS: &str = "holdfast_participant_call_seconds";
    pub const BARRIER_OUTCOMES: &str = "holdfast_participant_barrier_total";
    pub const ORPHAN_RECLAIMS: &str = "holdfast_participant_orphan_reclaims_total";
    pub const REDIS_REBUILDS: &str = "holdfast_stock_redis_rebuilds_total";
    pub const REDIS_DRIFT: &str = "holdfast_stock_redis_drift_total";
    pub const OLDEST_WORK_AGE: &str = "holdfast_oldest_work_age_seconds";
}

use ops_names::*;

/// Retention deleted `rows` rows of `table`.
pub fn retention_deleted(table: &'static str, rows: u64) {
    metrics::counter!(RETENTION_DELETED, "table" => table).increment(rows);
}

/// One `tcc.v1.Participant` call of `participant` answered: `method` (try, confirm, cancel,
/// extend) and `outcome` (held, rejected, confirmed, cancelled, hold_lost, extended, or the
/// error's gRPC code in snake case).
pub fn participant_call(
    participant: &str,
    method: &'static str,
    outcome: &'static str,
    elapsed: Duration,
) {
    metrics::counter!(PARTICIPANT_CALLS, "participant" => participant.to_owned(), "method" => method, "outcome" => outcome)
        .increment(1);
    metrics::histogram!(PARTICIPANT_CALL_SECONDS, "participant" => participant.to_owned(), "method" => method)
        .record(elapsed.as_secs_f64());
}

/// The barrier answered a call from its row instead of running it: `repeat` (the branch was
/// decided by an earlier call: its first answer), `tombstone` (a Try arriving after its
/// branch was cancelled or confirmed without one: refused for good), `refused` (Confirm after
/// Cancel or Cancel after Confirm: nothing changed).
pub fn barrier_outcome(participant: &str, outcome: &'static str) {
    metrics::counter!(BARRIER_OUTCOMES, "participant" => participant.to_owned(), "outcome" => outcome)
        .increment(1);
}

/// `participant` reclaimed an orphaned hold (past `expires_at + orphan_grace`).
pub fn orphan_reclaimed(participant: &str) {
    metrics::counter!(ORPHAN_RECLAIMS, "participant" => participant.to_owned()).increment(1);
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
pub fn coordinator_started() {
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

/// A participant's series, at zero.
pub fn participant_started(participant: &str, tables: &[&'static str]) {
    super::metrics_handle();
    let p = || participant.to_owned();
    for outcome in ["repeat", "tombstone", "refused"] {
        metrics::counter!(BARRIER_OUTCOMES, "participant" => p(), "outcome" => outcome)
            .increment(0);
    }
    metrics::counter!(ORPHAN_RECLAIMS, "participant" => p()).increment(0);
    for table in tables {
        metrics::counter!(RETENTION_DELETED, "table" => *table).increment(0);
    }
}
