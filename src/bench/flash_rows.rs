//! The rows of the flash sales: `flash` (on `stock`, and `flash-stock-redis` with
//! `--redis-url`), `flash-churn` (on `stock`, every other winner cancelling) and `waitlist`
//! (every client queues), each on a deployment of its own.

use super::report::{Row, row};
use super::{BenchArgs, RowSetup, Transport, scenarios, with_deployment};
use crate::participants::Kind;

/// Runs the flash-sale rows (`churn`: the `flash-churn` row) and appends them to `rows`.
pub(super) async fn run(
    args: &BenchArgs,
    transport: &Transport,
    run_id: &str,
    ceiling_many: &str,
    churn: bool,
    rows: &mut Vec<Row>,
) {
    let mut kinds = vec![Kind::Stock];
    if !churn {
        match (&args.redis_url, &args.target) {
            (Some(_), None) => kinds.push(Kind::StockRedis),
            (None, _) => eprintln!("bench: flash-stock-redis skipped (no --redis-url)"),
            (Some(_), Some(_)) => {
                eprintln!("bench: flash-stock-redis skipped (in-process deployment only)")
            }
        }
    }
    for kind in kinds {
        let name = match (kind, churn) {
            (_, true) => "flash-churn".to_owned(),
            (Kind::Stock, false) => "flash".to_owned(),
            (other, false) => format!("flash-{}", other.name()),
        };
        let redis = kind == Kind::StockRedis;
        let r = with_deployment(
            args,
            transport,
            run_id,
            &name,
            RowSetup {
                stock_redis: redis,
                ..RowSetup::fresh()
            },
            |ctx, progress| async move {
                scenarios::flash(
                    ctx,
                    kind,
                    args.flash_clients,
                    args.flash_concurrency,
                    args.flash_units,
                    churn,
                    progress,
                )
                .await
            },
        )
        .await;
        rows.push(row(
            name,
            args.flash_concurrency,
            r.0,
            Some(ceiling_many.to_owned()),
            r.1,
        ));
    }
}

/// The `waitlist` row: the flash sale's clients all queue (SPEC 11), on a deployment of its
/// own (in-process on `stock`, or the target's `stock`).
pub(super) async fn run_waitlist(
    args: &BenchArgs,
    transport: &Transport,
    run_id: &str,
    ceiling_many: &str,
    rows: &mut Vec<Row>,
) {
    let r = with_deployment(
        args,
        transport,
        run_id,
        "waitlist",
        RowSetup::fresh(),
        |ctx, progress| async move {
            scenarios::waitlist(
                ctx,
                args.flash_clients,
                args.flash_concurrency,
                args.flash_units,
                progress,
            )
            .await
        },
    )
    .await;
    rows.push(row(
        "waitlist".to_owned(),
        args.flash_concurrency,
        r.0,
        Some(ceiling_many.to_owned()),
        r.1,
    ));
}
