//! The soak (`cargo test --test faults -- --ignored soak`): `HOLDFAST_SOAK_MINUTES` (30) of
//! seeded schedules back to back on one stack (mixed load with a fault every few seconds,
//! every invariant checked after each schedule as in the seed runs), plus a sampler that
//! every second reads conservation over the resources of the schedules still settling and
//! samples this process's memory (RSS), open file descriptors and the Postgres connections
//! of the test database. The samples are summarised every minute and at the end; a
//! conservation violation (printed as read) or a failing seed (its report printed) does
//! not stop the soak; it fails at the end.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::PgPool;

use crate::plan::Plan;
use crate::runner::{Totals, run_seed_or_record};
use crate::stack::Stack;

#[derive(Clone, Copy, Debug, Default)]
struct Sample {
    rss_kib: u64,
    fds: u64,
    pg_connections: i64,
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|n| n.parse().ok()))
        })
        .unwrap_or(0)
}

fn fds() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64)
}

fn summary(samples: &[(Duration, Sample)]) -> String {
    let Some((_, first)) = samples.first() else {
        return "no samples".to_owned();
    };
    let last = samples.last().map_or(*first, |(_, s)| *s);
    let max = |f: fn(&Sample) -> i64| samples.iter().map(|(_, s)| f(s)).max().unwrap_or(0);
    format!(
        "{} samples; RSS {} -> {} KiB (max {}); fds {} -> {} (max {}); Postgres connections of the test database {} -> {} (max {})",
        samples.len(),
        first.rss_kib,
        last.rss_kib,
        max(|s| s.rss_kib as i64),
        first.fds,
        last.fds,
        max(|s| s.fds as i64),
        first.pg_connections,
        last.pg_connections,
        max(|s| s.pg_connections),
    )
}

pub async fn soak(pool: PgPool, minutes: u64, base: u64) {
    let length = Duration::from_secs(minutes * 60);
    let stack = Arc::new(Stack::start(pool).await);
    // The plans whose resources the sampler reads (the current and the previous schedule).
    let recent: Arc<Mutex<Vec<Plan>>> = Arc::new(Mutex::new(Vec::new()));
    let samples: Arc<Mutex<Vec<(Duration, Sample)>>> = Arc::new(Mutex::new(Vec::new()));
    let violations: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let sampler = {
        let (stack, recent, samples, violations) = (
            stack.clone(),
            recent.clone(),
            samples.clone(),
            violations.clone(),
        );
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            let mut reads = 0u64;
            loop {
                tick.tick().await;
                let plans = recent.lock().unwrap_or_else(|e| e.into_inner()).clone();
                for plan in &plans {
                    let (found, _) = crate::check::conservation(&stack, plan).await;
                    reads += 1;
                    for v in found {
                        let v = format!("seed {}: {v}", plan.seed);
                        eprintln!("soak: CONSERVATION VIOLATION {v}");
                        violations.lock().unwrap_or_else(|e| e.into_inner()).push(v);
                    }
                }
                let pg_connections: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()",
                )
                .fetch_one(&stack.pool)
                .await
                .unwrap_or(-1);
                let sample = Sample {
                    rss_kib: rss_kib(),
                    fds: fds(),
                    pg_connections,
                };
                let mut all = samples.lock().unwrap_or_else(|e| e.into_inner());
                all.push((started.elapsed(), sample));
                if all.len() % 60 == 0 {
                    eprintln!(
                        "soak: {:.0?}: {} ({reads} conservation reads)",
                        started.elapsed(),
                        summary(&all)
                    );
                }
            }
        })
    };
    let mut totals = Totals::default();
    let mut seed = base;
    while started.elapsed() < length {
        {
            let mut r = recent.lock().unwrap_or_else(|e| e.into_inner());
            r.push(Plan::from_seed(seed));
            if r.len() > 2 {
                r.remove(0);
            }
        }
        run_seed_or_record(&stack, seed, &mut totals, true).await;
        seed += 1;
        if totals.seeds % 50 == 0 {
            eprintln!("soak: {}", totals.report(started));
        }
    }
    sampler.abort();
    let _ = sampler.await;
    let all = samples.lock().unwrap_or_else(|e| e.into_inner()).clone();
    eprintln!(
        "soak: done after {:.0?}: {}",
        started.elapsed(),
        totals.report(started)
    );
    eprintln!("soak: samples: {}", summary(&all));
    if let Ok(stack) = Arc::try_unwrap(stack) {
        stack.stop().await;
    }
    let found = violations.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert!(
        found.is_empty(),
        "SOAK VIOLATION (conservation, read every second): {found:#?}"
    );
    assert!(
        totals.failed.is_empty(),
        "seeds with a violation: {:?}",
        totals.failed
    );
}
