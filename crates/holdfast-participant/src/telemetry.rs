//! What a participant counts, through the `metrics` facade: calls, barrier outcomes, orphan
//! reclaims, retention's deletions. The process installs the recorder (the server crate's
//! Prometheus exporter, or the author's own); without one these cost nothing.

use std::time::Duration;

/// Names of the metrics of this crate (SPEC 5).
pub mod names {
    pub const RETENTION_DELETED: &str = "holdfast_retention_deleted_total";
    pub const PARTICIPANT_CALLS: &str = "holdfast_participant_calls_total";
    pub const PARTICIPANT_CALL_SECONDS: &str = "holdfast_participant_call_seconds";
    pub const BARRIER_OUTCOMES: &str = "holdfast_participant_barrier_total";
    pub const ORPHAN_RECLAIMS: &str = "holdfast_participant_orphan_reclaims_total";
}

use names::*;

/// The `task` label of this crate's background loops (`holdfast_background_restarts_total`):
/// named once for where each loop is spawned and where its series starts at zero.
pub(crate) mod tasks {
    pub(crate) const RECLAIMER: &str = "reclaimer";
    pub(crate) const RETENTION: &str = "participant_retention";
}

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

/// A participant's series an alert reads, at zero (so a rule over a rare event has a series
/// before the first one happens). Call after the recorder is installed.
pub fn participant_started(participant: &str, tables: &[&'static str]) {
    let p = || participant.to_owned();
    for outcome in ["repeat", "tombstone", "refused"] {
        metrics::counter!(BARRIER_OUTCOMES, "participant" => p(), "outcome" => outcome)
            .increment(0);
    }
    metrics::counter!(ORPHAN_RECLAIMS, "participant" => p()).increment(0);
    for table in tables {
        metrics::counter!(RETENTION_DELETED, "table" => *table).increment(0);
    }
    for task in [tasks::RECLAIMER, tasks::RETENTION] {
        holdfast_serve::background::restarts_at_zero(task);
    }
}
