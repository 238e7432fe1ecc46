//! Overload protection: requests beyond the in-flight cap are shed at once, deadlines are
//! honoured, and a graceful shutdown finishes what is in flight.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use holdfast::proto;
use holdfast::proto::coordinator_client::CoordinatorClient;
use holdfast::proto::reservation::State;
use sqlx::PgPool;
use tonic::Code;

use crate::common::*;

fn request(n: usize) -> proto::ReserveRequest {
    let mut r = reserve_request(&format!("r{n}"), vec![hold("slow", &format!("x{n}"))]);
    r.holder = format!("user-{n}");
    r
}

#[sqlx::test(migrations = false)]
async fn a_flood_beyond_the_cap_is_shed_at_once_and_service_resumes(pool: PgPool) {
    let fakes = spawn_fakes(&["slow"]).await;
    let slow = fakes.get("slow");
    slow.behaviour.stall_tries.store(true, Ordering::SeqCst);
    let mut s = settings(&[("slow", &slow.url)]);
    // The four slow requests stay in flight for the participant timeout: long enough that
    // anything queued behind them would visibly wait for one to end.
    s.participants[0].timeout = Duration::from_secs(10);
    s.server.max_concurrent_requests = 4;
    let app = spawn_app(pool, s).await;

    // Four slow requests fill the server.
    let mut stuck = Vec::new();
    for n in 0..4 {
        let mut client = app.client.clone();
        stuck.push(tokio::spawn(
            async move { client.reserve(request(n)).await },
        ));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while fakes.log.count("slow", "Try") < 4 {
        assert!(Instant::now() < deadline, "the slow requests never arrived");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Sixteen more, each on its own connection: refused at once, not queued behind them.
    let mut flood = Vec::new();
    for n in 4..20 {
        let addr = app.addr;
        flood.push(tokio::spawn(async move {
            let mut client = CoordinatorClient::connect(format!("http://{addr}"))
                .await
                .unwrap();
            let started = Instant::now();
            let result = client.reserve(request(n)).await;
            (result, started.elapsed())
        }));
    }
    for f in flood {
        let (result, took) = f.await.unwrap();
        let err = result.expect_err("beyond the cap");
        assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
        assert_eq!(reason(&err), "OVERLOADED");
        let retry = tonic_types::StatusExt::get_details_retry_info(&err).expect("RetryInfo");
        assert!(retry.retry_delay.is_some_and(|d| !d.is_zero()), "{retry:?}");
        assert!(
            took < Duration::from_secs(5),
            "shed after {took:?}: it queued"
        );
    }
    // Every refusal came while the four still held their slots: none waited for one to free.
    assert!(
        stuck.iter().all(|t| !t.is_finished()),
        "a slow request ended before the flood was answered: the flood may have queued"
    );
    assert_eq!(
        fakes.log.count("slow", "Try"),
        4,
        "shed requests reached no participant"
    );

    // The slow ones end (their participant timed out); then service resumes.
    for t in stuck {
        let err = t.await.unwrap().expect_err("participant timed out");
        assert_eq!(reason(&err), "PARTICIPANT_UNAVAILABLE");
    }
    slow.behaviour.stall_tries.store(false, Ordering::SeqCst);
    let ok = app
        .client
        .clone()
        .reserve(request(99))
        .await
        .expect("normal requests succeed again")
        .into_inner();
    assert_eq!(state_of(&ok), State::Held);
}

#[sqlx::test(migrations = false)]
async fn deadlines_end_slow_requests(pool: PgPool) {
    let fakes = spawn_fakes(&["slow"]).await;
    let slow = fakes.get("slow");
    slow.behaviour.stall_tries.store(true, Ordering::SeqCst);
    let mut s = settings(&[("slow", &slow.url)]);
    // Far apart, so which deadline ended a call is plain on a loaded machine too.
    s.participants[0].timeout = Duration::from_secs(20);
    s.server.request_timeout = Duration::from_secs(4);
    let app = spawn_app(pool, s).await;

    // The server's own cap.
    let started = Instant::now();
    let err = app.client.clone().reserve(request(1)).await.unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "not ended by the 4 s request timeout: {:?}",
        started.elapsed()
    );

    // A caller's shorter deadline (grpc-timeout) is honoured too.
    let mut req = tonic::Request::new(request(2));
    req.set_timeout(Duration::from_millis(150));
    let started = Instant::now();
    let err = app.client.clone().reserve(req).await.unwrap_err();
    assert!(
        matches!(err.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "not ended by the caller's 150 ms deadline (the server's is 4 s): {:?}",
        started.elapsed()
    );
}

#[sqlx::test(migrations = false)]
async fn graceful_shutdown_finishes_calls_in_flight(pool: PgPool) {
    let fakes = spawn_fakes(&["slow"]).await;
    let slow = fakes.get("slow");
    slow.behaviour.try_delay_ms.store(800, Ordering::SeqCst);
    let mut app = spawn_app(pool, settings(&[("slow", &slow.url)])).await;
    let mut client = app.client.clone();
    let in_flight = tokio::spawn(async move { client.reserve(request(1)).await });
    let deadline = Instant::now() + Duration::from_secs(10);
    while fakes.log.count("slow", "Try") < 1 {
        assert!(Instant::now() < deadline, "the request never arrived");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    app.shut_down();
    let done = in_flight
        .await
        .unwrap()
        .expect("the call in flight completes");
    assert_eq!(state_of(done.get_ref()), State::Held);
    // And the server no longer takes new calls.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let refused = match CoordinatorClient::connect(format!("http://{}", app.addr)).await {
            Err(_) => true,
            Ok(mut c) => c.reserve(request(2)).await.is_err(),
        };
        if refused {
            break;
        }
        assert!(Instant::now() < deadline, "still serving after shutdown");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
