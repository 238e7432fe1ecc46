//! The rows of the `retention` scenario: Reserve latency with the coordinator's retention off,
//! then while it purges a million finished reservations seeded 40 days old, each on a
//! deployment of its own, and the ratio of their p99s.

use std::sync::Arc;
use std::time::Duration;

use super::report::{Row, row};
use super::{BenchArgs, RowSetup, Transport, scenarios, with_deployment};
use crate::coordinator::Retention;

/// `retention`: seeds the finished rows, then measures Reserves with retention off and while
/// the coordinator's own retention loop (every second, its usual batches and pauses) purges
/// them, each on a fresh deployment of its own.
pub(super) async fn run(
    args: &BenchArgs,
    transport: &Transport,
    run_id: &str,
    rows: &mut Vec<Row>,
) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let total = args.retention_rows;
    if let Err(e) = super::deploy::fresh_database(&args.database_url).await {
        rows.push(row("retention-seed".into(), 0, Err(e), None, None));
        return;
    }
    match scenarios::retention::seed_finished(&args.database_url, total, 40).await {
        Ok(took) => eprintln!(
            "bench: seeded {total} finished reservations in {:.1}s",
            took.as_secs_f64()
        ),
        Err(e) => {
            rows.push(row("retention-seed".into(), 0, Err(e), None, None));
            return;
        }
    }
    let clients = args.retention_clients.max(1);
    let purging = Retention {
        keep: Some(Duration::from_secs(30 * 24 * 3600)),
        every: Duration::from_secs(1),
        ..Retention::default()
    };
    for (name, retention) in [
        ("retention-off", Retention::off()),
        ("retention-purging", purging),
    ] {
        let stop = Arc::new(AtomicBool::new(false));
        let watching = retention.keep.is_some();
        // Both rows run on the finished reservations seeded above.
        let setup = RowSetup {
            retention,
            fresh_database: false,
            ..RowSetup::fresh()
        };
        let r = with_deployment(args, transport, run_id, name, setup, |ctx, progress| {
            let stop = stop.clone();
            async move {
                let watch = watching.then(|| {
                    scenarios::retention::purge_watch(total, std::time::Instant::now(), stop.clone())
                });
                let mut m =
                    scenarios::retention::reserve_loop(ctx, clients, args.duration, progress).await?;
                stop.store(true, Ordering::Relaxed);
                if let Some(watch) = watch {
                    let (purged, done_at) = watch.await.unwrap_or((0, None));
                    m.notes.push(match done_at {
                        Some(at) => format!(
                            "purge of {total} finished reservations done {at:.1}s into the window ({purged} deleted in it)"
                        ),
                        None => format!(
                            "{purged} of {total} finished reservations purged during the {:.0}s window (purge still running: the whole window saw it)",
                            args.duration.as_secs_f64()
                        ),
                    });
                    m.extra = serde_json::json!({ "purged_in_window": purged, "purge_done_at_s": done_at });
                }
                Ok(m)
            }
        })
        .await;
        rows.push(row(name.into(), clients, r.0, None, r.1));
    }
}

/// "retention p99: purging / off = x" when both rows ran.
pub(super) fn ratio(rows: &[Row]) -> Option<String> {
    let p99 = |name: &str| {
        rows.iter()
            .find(|r| r.name == name && r.failure.is_none())
            .map(|r| r.latency().p99)
    };
    let (off, purging) = (p99("retention-off")?, p99("retention-purging")?);
    (off > 0.0).then(|| format!("retention: Reserve p99 {purging:.2} ms while purging vs {off:.2} ms off = {:.2}x (bound: 2x)", purging / off))
}
