//! What `/metrics` says about itself: a `# HELP` line for every metric family this process can
//! export (the coordinator's, the operator metrics, the participant SDK's and the serving
//! layer's), `holdfast_build_info{version}` = 1, and the process-wide counters an alert reads
//! (authentication failures, dropped connections) at 0 from the start, so a rate over them has
//! a series before the first refusal. Run once, when the recorder is installed
//! ([`super::metrics_handle`]); `process/metrics.rs` checks it against a started binary.

use super::names;
use super::ops::ops_names;

/// `holdfast_build_info`: 1, labelled with the running build's version.
pub(crate) const BUILD_INFO: &str = "holdfast_build_info";

/// Every counter family with its description.
const COUNTERS: &[(&str, &str)] = &[
    (
        names::RESERVATIONS,
        "Reservations that entered each state, by state (counted once per transition, by the replica that made it).",
    ),
    (
        names::EXPIRED_HOLDS,
        "Holds that lapsed and whose release was decided (once per reservation).",
    ),
    (
        names::REFUNDS,
        "Refunds by state: PENDING when recorded, REFUNDED when the payment participant acknowledged it, FAILED when it refused for good.",
    ),
    (
        names::RPC_REQUESTS,
        "gRPC requests served, by method and status code.",
    ),
    (
        names::FAILED,
        "Reservations that became FAILED (a participant lost a confirmed hold); each needs an operator.",
    ),
    (
        names::AUTH_FAILURES,
        "Requests refused by authentication (UNAUTHENTICATED) or authorisation (PERMISSION_DENIED), by reason.",
    ),
    (
        names::TLS_RELOAD_FAILURES,
        "Changed TLS certificate or key files that were refused; the previous ones stay in use.",
    ),
    (
        names::WATCH_POLLS,
        "Polls of the shared WatchReservation poller (one statement for every watched reservation).",
    ),
    (
        names::ADMIN_ACTIONS,
        "Operator actions taken through tcc.v1.Admin and audited, by action.",
    ),
    (
        names::SOLD_OUT_REFUSALS,
        "Reserves refused by the sold-out fast path without a write, by participant.",
    ),
    (
        ops_names::REDIS_REBUILDS,
        "Times stock-redis rebuilt its Redis data set from the durable record.",
    ),
    (
        ops_names::REDIS_DRIFT,
        "Differences stock-redis's reconciler found between Redis and the durable record, by kind.",
    ),
    (
        ops_names::EVENTS_APPENDED,
        "Events of the log seen becoming readable by this process, by type: every replica counts every event (across replicas take max, not sum).",
    ),
    (
        ops_names::EVENTS_DELIVERED,
        "Events an event sink delivered for good, by sink.",
    ),
    (
        ops_names::QUEUE_OFFERS,
        "Waitlist offers by outcome: placed (the reservation became HELD), refused (back in its queue), wait_ended.",
    ),
    (
        holdfast_serve::background::BACKGROUND_RESTARTS,
        "Background loops (the coordinator's recovery, retention, event follower and event sinks; a participant's reclaimer, retention and stock-redis reconciler) that panicked and were started again, by task.",
    ),
    (
        ops_names::WEBHOOK_FAILURES,
        "Webhook POSTs that failed (not 2xx, timed out, no connection), by endpoint.",
    ),
    (
        ops_names::RETENTION_DELETED,
        "Rows deleted by retention, by table.",
    ),
    (
        ops_names::PARTICIPANT_CALLS,
        "tcc.v1.Participant calls a participant answered, by participant, method and outcome.",
    ),
    (
        ops_names::BARRIER_OUTCOMES,
        "Participant calls the barrier answered from its row instead of running them (repeat, tombstone, refused), by participant.",
    ),
    (
        ops_names::ORPHAN_RECLAIMS,
        "Orphaned holds a participant reclaimed past expires_at + orphan_grace, by participant.",
    ),
    (
        holdfast_serve::conn::CONNECTIONS_DROPPED,
        "Connections closed by the connection rules (max_connections, header_timeout, idle_timeout), by reason.",
    ),
];

/// Every gauge family with its description.
const GAUGES: &[(&str, &str)] = &[
    (
        names::HOLD_TO_CONFIRM,
        "Reservations confirmed per reservation held, counted by this process since it started.",
    ),
    (
        names::RECOVERY_BACKLOG,
        "Reservations waiting to be driven to their outcome (fan-outs, lapsed holds, refunds).",
    ),
    (
        names::UNREGISTERED_BACKLOG,
        "Unfinished reservations waiting on a participant that is not registered, by participant.",
    ),
    (
        names::WATCHED,
        "Reservations watched by open WatchReservation streams of this process.",
    ),
    (
        ops_names::OLDEST_WORK_AGE,
        "Seconds the oldest unfinished work (a fan-out, a lapsed hold, a refund) has waited.",
    ),
    (
        ops_names::EVENTS_LAG,
        "Seconds the oldest event a sink has not delivered has waited, by sink.",
    ),
    (
        ops_names::SINK_PAUSED,
        "1 while an event sink is paused (a webhook that failed past its give-up period), else 0; by sink.",
    ),
    (
        ops_names::QUEUE_LENGTH,
        "Reservations waiting in waitlists, by participant, as the last queue sweep found them.",
    ),
    (
        BUILD_INFO,
        "Always 1; the version label names the running holdfast build.",
    ),
];

/// Every histogram family with its description.
const HISTOGRAMS: &[(&str, &str)] = &[
    (
        names::BRANCH_CALL_SECONDS,
        "Seconds the coordinator's calls to participants took, by participant and phase.",
    ),
    (
        names::RPC_SECONDS,
        "Seconds gRPC requests took to answer, by method.",
    ),
    (
        ops_names::QUEUE_WAIT,
        "Seconds a queued reservation waited in its queue before an offer placed it.",
    ),
    (
        ops_names::PARTICIPANT_CALL_SECONDS,
        "Seconds a participant took to answer tcc.v1.Participant calls, by participant and method.",
    ),
];

/// Describes every family, sets `holdfast_build_info` and creates the process-wide counters
/// at 0. Call once, after the recorder is installed.
pub(super) fn describe_all() {
    for &(name, help) in COUNTERS {
        metrics::describe_counter!(name, help);
    }
    for &(name, help) in GAUGES {
        metrics::describe_gauge!(name, help);
    }
    for &(name, help) in HISTOGRAMS {
        metrics::describe_histogram!(name, help);
    }
    metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    for reason in ["UNAUTHENTICATED", "PERMISSION_DENIED"] {
        metrics::counter!(names::AUTH_FAILURES, "reason" => reason).increment(0);
    }
    for reason in ["max_connections", "header_timeout", "idle_timeout"] {
        metrics::counter!(holdfast_serve::conn::CONNECTIONS_DROPPED, "reason" => reason)
            .increment(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_described_once() {
        let mut seen = std::collections::HashSet::new();
        for (name, help) in COUNTERS.iter().chain(GAUGES).chain(HISTOGRAMS) {
            assert!(seen.insert(*name), "{name} described twice");
            assert!(name.starts_with("holdfast_"), "{name}");
            assert!(help.len() > 20, "{name}: {help:?} says too little");
        }
    }
}
