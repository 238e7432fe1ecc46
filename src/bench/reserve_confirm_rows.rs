//! The rows of `latency` (one client) and `throughput` (`--clients`): Reserve+Confirm of two
//! holds per workload (noop; seats + stock). With `--events-nats-url` each `throughput`
//! workload runs three times on deployments of their own: without the event log
//! (`-without-events`: the log's triggers disabled on the bench database), with it (as
//! deployed), and with it and a NATS sink (`-nats`), so SPEC 10's bound ("keeps >= 90 % of its
//! rate without them, same run") is read off one run. Each round then runs
//! `throughput-noop-nats-backlog`: the sink held back during the load, then timed delivering
//! the backlog alone (its CPU per event, by process).

use super::report::{Row, row};
use super::rounds::in_round;
use super::scenarios::Workload;
use super::{BenchArgs, RowSetup, Scenario, Transport, events, scenarios, with_deployment};

/// What every scenario's rows are measured with.
#[derive(Clone, Copy)]
pub(super) struct RunCtx<'a> {
    pub args: &'a BenchArgs,
    pub transport: &'a Transport,
    pub run_id: &'a str,
    pub ceiling_many: &'a str,
}

/// `latency-*` (one client) or `throughput-*` (`--clients`), per workload.
pub(super) async fn run(ctx: RunCtx<'_>, scenario: Scenario, rows: &mut Vec<Row>) {
    let RunCtx {
        args,
        transport,
        run_id,
        ceiling_many,
    } = ctx;
    let (prefix, clients, baseline) = if scenario == Scenario::Latency {
        ("latency", 1, "ceiling-1".to_owned())
    } else {
        ("throughput", args.clients, ceiling_many.to_owned())
    };
    // The sink runs in the in-process coordinator only.
    let with_nats =
        scenario == Scenario::Throughput && args.events_nats_url.is_some() && args.target.is_none();
    let names = row_names(prefix, with_nats, args.rounds);
    for (workload, name) in names {
        let r = with_deployment(
            args,
            transport,
            run_id,
            &name,
            RowSetup::fresh(),
            |ctx, progress| async move {
                scenarios::reserve_confirm_loop(ctx, workload, clients, args.duration, progress)
                    .await
            },
        )
        .await;
        rows.push(row(name, clients, r.0, Some(baseline.clone()), r.1));
    }
}

/// The rows of `rounds` rounds, in the order they run: per round each workload; with the
/// events' rows (`with_nats`) a workload's three rows, in reverse order every other round, so
/// what drifts during a run (the machine, the server's caches) counts against each alike.
fn row_names(prefix: &str, with_nats: bool, rounds: u32) -> Vec<(Workload, String)> {
    let mut names = Vec::new();
    for round in 1..=rounds {
        for workload in [Workload::Noop, Workload::Real] {
            let name = format!("{prefix}-{}", workload.name());
            let mut variants = if with_nats {
                vec![
                    format!("{name}{}", events::WITHOUT_SUFFIX),
                    name.clone(),
                    format!("{name}{}", events::SUFFIX),
                ]
            } else {
                vec![name]
            };
            if round % 2 == 0 {
                variants.reverse();
            }
            names.extend(
                variants
                    .into_iter()
                    .map(|name| (workload, in_round(name, round, rounds))),
            );
        }
        if with_nats {
            // The sink's own cost, without the load beside it (`events::BACKLOG_SUFFIX`).
            let name = format!("{prefix}-noop{}", events::BACKLOG_SUFFIX);
            names.push((Workload::Noop, in_round(name, round, rounds)));
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names of [`row_names`], in order.
    fn names(prefix: &str, with_nats: bool, rounds: u32) -> Vec<String> {
        row_names(prefix, with_nats, rounds)
            .into_iter()
            .map(|(_, name)| name)
            .collect()
    }

    #[test]
    fn rows_of_one_round_keep_their_names() {
        assert_eq!(
            names("throughput", false, 1),
            ["throughput-noop", "throughput-real"]
        );
    }

    #[test]
    fn rounds_alternate_the_order_of_a_workloads_rows() {
        assert_eq!(
            names("throughput", true, 2),
            [
                "throughput-noop-without-events#1",
                "throughput-noop#1",
                "throughput-noop-nats#1",
                "throughput-real-without-events#1",
                "throughput-real#1",
                "throughput-real-nats#1",
                "throughput-noop-nats-backlog#1",
                "throughput-noop-nats#2",
                "throughput-noop#2",
                "throughput-noop-without-events#2",
                "throughput-real-nats#2",
                "throughput-real#2",
                "throughput-real-without-events#2",
                "throughput-noop-nats-backlog#2",
            ]
        );
    }
}
