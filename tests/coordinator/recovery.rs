//! Every reservation reaches a terminal state: the reaper releases lapsed holds, recovery
//! finishes decided fan-outs after participant outages and coordinator crashes, and replicas
//! sharing one database split the work without doing any of it twice.

use std::sync::atomic::Ordering;
use std::time::Duration;

use holdfast::app::CoordinatorSettings;
use holdfast::domain::policy::Backoff;
use holdfast::proto;
use holdfast::proto::reservation::State;
use sqlx::PgPool;

use crate::common::*;

async fn stored_state(pool: &PgPool, id: &str) -> String {
    sqlx::query_scalar("SELECT state FROM reservations WHERE id = $1::uuid")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Polls the database until `cond` holds; panics after `limit`.
async fn eventually<F, Fut>(limit: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    while !cond().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn quick(mut s: CoordinatorSettings, lease: Duration) -> CoordinatorSettings {
    s.policy.lease = lease;
    s.policy.sweep_interval = Duration::from_millis(100);
    s
}

#[sqlx::test(migrations = false)]
async fn the_reaper_releases_a_lapsed_hold_within_about_a_second(pool: PgPool) {
    let (mut app, fakes) = spawn_with_fakes(pool.clone(), &["seats"]).await;
    let mut req = reserve_request("r1", vec![hold("seats", "A1")]);
    req.ttl = Some(prost_types::Duration {
        seconds: 1,
        nanos: 0,
    });
    let r = app.client.reserve(req).await.unwrap().into_inner();
    // Nobody calls the coordinator again: only the reaper can release it.
    eventually(Duration::from_secs(5), "EXPIRED", || async {
        stored_state(&pool, &r.id).await == "EXPIRED"
    })
    .await;
    assert_eq!(fakes.get("seats").effects(), (0, 1));
    assert!(fakes.get("seats").held().is_empty());
}

#[sqlx::test(migrations = false)]
async fn a_participant_back_from_an_outage_gets_its_backlog_at_once(pool: PgPool) {
    let log = CallLog::default();
    let seats = spawn_fake("seats", log.clone()).await;
    let stock = spawn_fake("stock", log.clone()).await;
    let network = Relay::start(&stock.url).await;
    let mut s = settings(&[("seats", &seats.url), ("stock", &network.url)]);
    for p in &mut s.participants {
        p.timeout = Duration::from_millis(500);
    }
    // A minute of backoff: only the come-back signal can explain a prompt finish.
    s.policy.backoff = Backoff {
        base: Duration::from_secs(60),
        cap: Duration::from_secs(60),
    };
    let mut app = spawn_app(pool.clone(), s).await;
    let r = app
        .client
        .reserve(reserve_request(
            "r1",
            vec![hold("seats", "A1"), hold("stock", "sku-1")],
        ))
        .await
        .unwrap()
        .into_inner();
    network.cut().await;
    let c = app
        .client
        .confirm(Decide::on(&r).confirm())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&c), State::Confirming);
    let mut watch = app
        .client
        .watch_reservation(proto::WatchReservationRequest {
            reservation_id: r.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    network.restore().await;
    let mut last = State::Confirming;
    let finished = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(m) = watch.message().await.unwrap() {
            last = state_of(&m);
        }
    })
    .await;
    assert!(
        finished.is_ok(),
        "not finished promptly; last state {last:?}"
    );
    assert_eq!(last, State::Confirmed);
    assert_eq!(stock.effects(), (1, 0));
    assert_eq!(seats.effects(), (1, 0));
}

#[sqlx::test(migrations = false)]
async fn a_dead_coordinators_half_placed_reservation_is_released_by_another(pool: PgPool) {
    let log = CallLog::default();
    let a = spawn_fake("a", log.clone()).await;
    let b = spawn_fake("b", log.clone()).await;
    b.behaviour.stall_tries.store(true, Ordering::SeqCst);
    let s = quick(
        settings(&[("a", &a.url), ("b", &b.url)]),
        Duration::from_secs(2),
    );
    let mut first = spawn_killable(&pool, s.clone()).await;
    let mut client = first.client().await;
    let pending = tokio::spawn(async move {
        client
            .reserve(reserve_request("r1", vec![hold("a", "1"), hold("b", "2")]))
            .await
    });
    eventually(Duration::from_secs(5), "b.Try", || async {
        log.count("b", "Try") == 1
    })
    .await;
    assert_eq!(a.held(), ["1"]);
    first.kill();
    assert!(pending.await.unwrap().is_err(), "the caller saw the crash");
    b.behaviour.stall_tries.store(false, Ordering::SeqCst);

    let _second = spawn_killable(&pool, s).await;
    let id: String = sqlx::query_scalar("SELECT id::text FROM reservations")
        .fetch_one(&pool)
        .await
        .unwrap();
    eventually(Duration::from_secs(10), "REJECTED", || async {
        stored_state(&pool, &id).await == "REJECTED"
    })
    .await;
    assert!(a.held().is_empty(), "a's hold released");
    assert!(b.held().is_empty());
    assert_eq!(log.count("a", "Cancel"), 1);
    assert_eq!(
        log.count("b", "Cancel"),
        1,
        "b's unknown Try is cancelled too"
    );
}

/// Where the first coordinator dies, relative to each participant's Confirm.
#[derive(Clone, Copy, Debug)]
enum CrashPoint {
    /// After CONFIRMING was recorded, before either participant applied its Confirm.
    BeforeAnyConfirm,
    /// After seats applied its Confirm, before stock did.
    BetweenConfirms,
    /// After both applied their Confirms, before the coordinator recorded their answers.
    AfterBothConfirms,
}

async fn crash_mid_confirm_then_recover(pool: PgPool, crash: CrashPoint) {
    let log = CallLog::default();
    let seats = spawn_fake("seats", log.clone()).await;
    let stock = spawn_fake("stock", log.clone()).await;
    let s = quick(
        settings(&[("seats", &seats.url), ("stock", &stock.url)]),
        Duration::from_secs(2),
    );
    let mut first = spawn_killable(&pool, s.clone()).await;
    let mut client = first.client().await;
    let r = client
        .reserve(reserve_request(
            "r1",
            vec![hold("seats", "A1"), hold("stock", "sku-1")],
        ))
        .await
        .unwrap()
        .into_inner();
    let (seats_stall, stock_stall) = match crash {
        CrashPoint::BeforeAnyConfirm => (
            &seats.behaviour.stall_confirms,
            &stock.behaviour.stall_confirms,
        ),
        CrashPoint::BetweenConfirms => (
            &seats.behaviour.stall_after_confirm,
            &stock.behaviour.stall_confirms,
        ),
        CrashPoint::AfterBothConfirms => (
            &seats.behaviour.stall_after_confirm,
            &stock.behaviour.stall_after_confirm,
        ),
    };
    seats_stall.store(true, Ordering::SeqCst);
    stock_stall.store(true, Ordering::SeqCst);
    let confirm = Decide::on(&r).confirm();
    let pending = tokio::spawn(async move { client.confirm(confirm).await });
    eventually(Duration::from_secs(5), "both Confirms sent", || async {
        log.count("seats", "Confirm") == 1 && log.count("stock", "Confirm") == 1
    })
    .await;
    let applied = match crash {
        CrashPoint::BeforeAnyConfirm => (0, 0),
        CrashPoint::BetweenConfirms => (1, 0),
        CrashPoint::AfterBothConfirms => (1, 1),
    };
    assert_eq!((seats.effects().0, stock.effects().0), applied, "{crash:?}");
    assert_eq!(stored_state(&pool, &r.id).await, "CONFIRMING");
    first.kill();
    let _ = pending.await;
    seats_stall.store(false, Ordering::SeqCst);
    stock_stall.store(false, Ordering::SeqCst);

    let _second = spawn_killable(&pool, s).await;
    eventually(Duration::from_secs(10), "CONFIRMED", || async {
        stored_state(&pool, &r.id).await == "CONFIRMED"
    })
    .await;
    assert_eq!(
        seats.effects(),
        (1, 0),
        "{crash:?}: seats confirmed exactly once"
    );
    assert_eq!(
        stock.effects(),
        (1, 0),
        "{crash:?}: stock confirmed exactly once"
    );
    // Every send counted: the first coordinator's Confirm (its outcome unknown to anyone once
    // it died) and exactly one retry by the second - the only repeat the SPEC allows - answered
    // CONFIRMED whether it applied or found the branch already confirmed.
    for fake in [&seats, &stock] {
        let sends = log.per_branch(&fake.name, "Confirm");
        assert_eq!(sends.len(), 1, "{crash:?}: {}", fake.name);
        for (branch, n) in sends {
            assert_eq!(n, 2, "{crash:?}: {} Confirm sends to {branch}", fake.name);
            let answers = fake.answers(&branch, "Confirm");
            assert!(
                !answers.is_empty() && answers.iter().all(|a| *a == FakeBranch::Confirmed),
                "{crash:?}: {} answered {answers:?}",
                fake.name
            );
        }
    }
}

#[sqlx::test(migrations = false)]
async fn a_coordinator_dying_before_any_confirm_is_finished_by_another(pool: PgPool) {
    crash_mid_confirm_then_recover(pool, CrashPoint::BeforeAnyConfirm).await;
}

#[sqlx::test(migrations = false)]
async fn a_coordinator_dying_between_confirms_is_finished_by_another(pool: PgPool) {
    crash_mid_confirm_then_recover(pool, CrashPoint::BetweenConfirms).await;
}

#[sqlx::test(migrations = false)]
async fn a_coordinator_dying_before_recording_confirms_is_finished_by_another(pool: PgPool) {
    crash_mid_confirm_then_recover(pool, CrashPoint::AfterBothConfirms).await;
}

#[sqlx::test(migrations = false)]
async fn two_replicas_release_200_lapsed_reservations_once_each_even_if_one_dies(pool: PgPool) {
    let log = CallLog::default();
    let seats = spawn_fake("seats", log.clone()).await;
    let s = quick(settings(&[("seats", &seats.url)]), Duration::from_secs(2));
    let in_flight = s.policy.max_recovery_drives_per_participant;
    let mut one = spawn_killable(&pool, s.clone()).await;
    let two = spawn_killable(&pool, s).await;

    // 200 reservations, made concurrently through both replicas, all lapsing within moments.
    let mut tasks = Vec::new();
    for worker in 0..20 {
        let mut client = if worker % 2 == 0 {
            one.client().await
        } else {
            two.client().await
        };
        tasks.push(tokio::spawn(async move {
            for i in 0..10 {
                let n = worker * 10 + i;
                let mut req =
                    reserve_request(&format!("r{n}"), vec![hold("seats", &format!("S{n}"))]);
                req.holder = format!("user-{n}");
                req.ttl = Some(prost_types::Duration {
                    seconds: 4,
                    nanos: 0,
                });
                client.reserve(req).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // (The reaper may have begun on the first ones already.)
    assert_eq!(seats.held().len() + seats.effects().1, 200);

    // Kill one replica once releasing has begun; the other must finish alone.
    eventually(Duration::from_secs(10), "first releases", || async {
        seats.effects().1 >= 10
    })
    .await;
    one.kill();
    eventually(Duration::from_secs(30), "all EXPIRED", || async {
        let n: i64 =
            sqlx::query_scalar("SELECT count(*) FROM reservations WHERE state = 'EXPIRED'")
                .fetch_one(&pool)
                .await
                .unwrap();
        n == 200
    })
    .await;
    assert_eq!(seats.effects(), (0, 200), "each released exactly once");
    assert!(seats.held().is_empty());
    // Every Cancel sent, counted per branch. A repeat is allowed only after an unknown outcome:
    // a Cancel the killed replica sent but did not record, re-sent once by the survivor - at
    // most as many as the killed replica had in flight (its per-participant recovery cap), each
    // answered CANCELLED again. A duplicate from a live driver would show on every branch.
    let sends = log.per_branch("seats", "Cancel");
    assert_eq!(sends.len(), 200, "every branch released");
    let repeated: Vec<_> = sends.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        sends.values().all(|n| *n <= 2),
        "no branch sent Cancel more than twice: {repeated:?}"
    );
    assert!(
        repeated.len() <= in_flight,
        "{} branches got a repeated Cancel; the killed replica had at most {in_flight} in flight",
        repeated.len()
    );
    for (branch, _) in &repeated {
        let answers = seats.answers(branch, "Cancel");
        assert!(
            answers.iter().all(|a| *a == FakeBranch::Cancelled),
            "{branch}: a repeat answered idempotently, got {answers:?}"
        );
    }
    drop(two);
}

/// A participant that stalls every Cancel (its calls time out after 5 s) must not hold back
/// the expiry of reservations that do not involve it: recovery drives each claimed
/// reservation on its own (#15 item 5). Before, a sweep waited for all it had claimed, so the
/// next sweep - and every expiry due meanwhile - waited out the stalled call.
#[sqlx::test(migrations = false)]
async fn a_stalled_participant_does_not_delay_the_expiry_of_others(pool: PgPool) {
    let log = CallLog::default();
    let slow = spawn_fake("slow", log.clone()).await;
    let fast = spawn_fake("fast", log.clone()).await;
    let mut s = settings(&[("slow", &slow.url), ("fast", &fast.url)]);
    for p in &mut s.participants {
        if p.name == "slow" {
            p.timeout = Duration::from_secs(5);
        }
    }
    s.policy.sweep_interval = Duration::from_millis(100);
    let mut app = spawn_app(pool.clone(), s).await;
    slow.behaviour.stall_cancels.store(true, Ordering::SeqCst);
    let one_second = Some(prost_types::Duration {
        seconds: 1,
        nanos: 0,
    });
    let mut req = reserve_request("slow-1", vec![hold("slow", "S1")]);
    req.ttl = one_second;
    let stuck = app.client.reserve(req).await.unwrap().into_inner();
    // The reaper is now in slow's Cancel, which hangs until its 5 s timeout.
    eventually(Duration::from_secs(5), "slow.Cancel", || async {
        log.count("slow", "Cancel") == 1
    })
    .await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let mut req = reserve_request(&format!("fast-{i}"), vec![hold("fast", &format!("F{i}"))]);
        req.holder = format!("user-{i}");
        req.ttl = one_second;
        ids.push(app.client.reserve(req).await.unwrap().into_inner().id);
    }
    eventually(Duration::from_secs(15), "fast ones EXPIRED", || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM reservations WHERE id::text = ANY($1) AND state = 'EXPIRED'",
        )
        .bind(&ids)
        .fetch_one(&pool)
        .await
        .unwrap();
        n == 3
    })
    .await;
    // How long after its deadline each was released, by the database clock.
    let lag: f64 = sqlx::query_scalar(
        "SELECT max(extract(epoch FROM updated_at - expires_at))::float8 FROM reservations \
         WHERE id::text = ANY($1)",
    )
    .bind(&ids)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        lag < 2.0,
        "released {lag:.2} s after the deadline while another participant stalled"
    );
    assert_eq!(fast.effects(), (0, 3));
    assert_eq!(stored_state(&pool, &stuck.id).await, "CANCELLING");
}

/// A placer whose lease ran out (a pause past it) and was taken over by another instance,
/// which is releasing the reservation, stops placing: it acts on `renew_lease`'s answer
/// (#15 item 6). Before, it went on to Try the next participant.
#[sqlx::test(migrations = false)]
async fn a_placer_that_lost_its_lease_stops_placing(pool: PgPool) {
    let log = CallLog::default();
    let a = spawn_fake("a", log.clone()).await;
    let b = spawn_fake("b", log.clone()).await;
    let mut s = settings(&[("a", &a.url), ("b", &b.url)]);
    for p in &mut s.participants {
        p.timeout = Duration::from_secs(5);
    }
    // The placer: a lease shorter than a's Try (what the start-up check refuses), and no
    // sweeps of its own, so the other instance is the one that takes over.
    let mut placer = s.clone();
    placer.policy.lease = Duration::from_secs(1);
    placer.policy.sweep_interval = Duration::from_secs(3600);
    let mut app = spawn_app(pool.clone(), placer).await;
    let _other = spawn_app(pool.clone(), quick(s, Duration::from_secs(30))).await;

    a.behaviour.try_delay_ms.store(2_000, Ordering::SeqCst);
    a.behaviour.stall_cancels.store(true, Ordering::SeqCst);
    let answer = app
        .client
        .reserve(reserve_request("r1", vec![hold("a", "1"), hold("b", "2")]))
        .await;
    a.behaviour.stall_cancels.store(false, Ordering::SeqCst);
    assert!(
        log.count("a", "Cancel") >= 1,
        "the other instance took over: {:?}",
        log.summary()
    );
    assert_eq!(
        log.count("b", "Try"),
        0,
        "a placer without its lease went on: {:?}",
        log.summary()
    );
    let status = answer.expect_err("the reservation is being released");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let id: String = sqlx::query_scalar("SELECT id::text FROM reservations")
        .fetch_one(&pool)
        .await
        .unwrap();
    eventually(Duration::from_secs(15), "REJECTED", || async {
        stored_state(&pool, &id).await == "REJECTED"
    })
    .await;
    assert!(a.held().is_empty(), "a's hold released");
}
