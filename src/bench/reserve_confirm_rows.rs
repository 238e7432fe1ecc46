//! The rows of `latency` (one client) and `throughput` (`--clients`): Reserve+Confirm of two
//! holds per workload (noop; seats + stock). With `--events-nats-url` each `throughput`
//! workload runs three times on deployments of their own: without the event log
//! (`-without-events`: the log's triggers disabled on the bench database), with it (as
//! deployed), and with it and a NATS sink (`-nats`), so SPEC 10's bound ("keeps >= 90 % of its
//! rate without them, same run") is read off one run.

use super::report::{Row, row};
use super::scenarios::Workload;
use super::{BenchArgs, Scenario, Transport, events, scenarios, with_deployment};
use crate::coordinator::Retention;

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
    let names = [Workload::Noop, Workload::Real]
        .into_iter()
        .flat_map(|workload| {
            let name = format!("{prefix}-{}", workload.name());
            let around = |suffix: &str| with_nats.then(|| (workload, format!("{name}{suffix}")));
            around(events::WITHOUT_SUFFIX)
                .into_iter()
                .chain([(workload, name.clone())])
                .chain(around(events::SUFFIX))
        });
    for (workload, name) in names {
        let r = with_deployment(
            args,
            transport,
            run_id,
            &name,
            false,
            Retention::off(),
            |ctx, progress| async move {
                scenarios::reserve_confirm_loop(ctx, workload, clients, args.duration, progress)
                    .await
            },
        )
        .await;
        rows.push(row(name, clients, r.0, Some(baseline.clone()), r.1));
    }
}
