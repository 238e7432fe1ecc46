//! The recovery loop retries by the configured backoff (SPEC 2): a Confirm a participant keeps
//! failing is retried by recovery, each attempt due `min(cap, base * 2^n) * U[0.5, 1)` after
//! the previous one (the pure growth, jitter and cap are checked per database in
//! `tests/store/cases/backoff.rs`).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use holdfast::domain::policy::Backoff;
use sqlx::PgPool;

use crate::common::*;

#[sqlx::test(migrations = false)]
async fn recovery_retries_a_failing_confirm_by_the_configured_backoff(pool: PgPool) {
    let log = CallLog::default();
    let seats = spawn_fake("seats", log.clone()).await;
    let mut s = settings(&[("seats", &seats.url)]);
    s.policy.sweep_interval = Duration::from_millis(50);
    // Delays of 1-3 s: longer than the 1 s health probe, so a probe waking the backlog at
    // every tick shows as more than one early attempt.
    s.policy.backoff = Backoff {
        base: Duration::from_millis(2000),
        cap: Duration::from_millis(3000),
    };
    let backoff = s.policy.backoff;
    let mut app = spawn_app(pool.clone(), s).await;
    let r = app
        .client
        .reserve(reserve_request("r1", vec![hold("seats", "A1")]))
        .await
        .unwrap()
        .into_inner();
    seats.behaviour.fail_confirms.store(1000, Ordering::SeqCst);
    app.client.confirm(Decide::on(&r).confirm()).await.unwrap();

    // Each recorded attempt n (the RPC's is 1, then recovery's) set the next one's due time
    // in the same statement: next_attempt_at - updated_at is the delay it drew.
    let read = async || -> (i32, f64, f64, f64) {
        sqlx::query_as(
            "SELECT recovery_attempts, \
                    EXTRACT(EPOCH FROM next_attempt_at - updated_at)::float8, \
                    EXTRACT(EPOCH FROM updated_at)::float8, \
                    EXTRACT(EPOCH FROM next_attempt_at)::float8 \
             FROM reservations WHERE id = $1::uuid",
        )
        .bind(&r.id)
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen: Vec<(i32, f64, f64, f64)> = Vec::new();
    while seen.len() < 5 {
        let (attempts, delay, recorded_at, due_at) = read().await;
        if seen.last().is_none_or(|(a, ..)| *a != attempts) {
            seen.push((attempts, delay, recorded_at, due_at));
        }
        assert!(Instant::now() < deadline, "retries stalled at {seen:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (attempts, delay, ..) in &seen {
        let n = u32::try_from(*attempts - 1).unwrap();
        let full = backoff
            .cap
            .min(backoff.base * 2u32.pow(n.min(10)))
            .as_secs_f64();
        assert!(
            *delay >= full / 2.0 && *delay <= full,
            "attempt {attempts} drew {delay:.3} s, outside [{}, {full}] s: {seen:?}",
            full / 2.0
        );
    }
    // Recovery waited each delay out: an attempt is recorded no sooner than the one before
    // it made it due (both by the database clock, which also decided the claim) - except at
    // most once, when the participant's health probe answers and it is announced back (once
    // per outage: its backlog is retried at once). A probe announcing it at every tick
    // would wake the backlog every second, defeating the backoff.
    let early: Vec<_> = seen
        .windows(2)
        .filter(|pair| pair[1].0 == pair[0].0 + 1 && pair[1].2 < pair[0].3)
        .map(|pair| pair[1].0)
        .collect();
    assert!(
        early.len() <= 1,
        "attempts {early:?} ran before the previous one made them due: {seen:?}"
    );
    let last = seen.last().map(|(a, ..)| *a).unwrap_or_default();
    assert_eq!(
        log.count("seats", "Confirm"),
        usize::try_from(last).unwrap(),
        "one Confirm per recorded attempt"
    );
}
