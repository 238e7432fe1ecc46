//! A Reserve whose caller gives up mid-placement (its deadline passes while a Try is in
//! flight) still runs to its outcome, and the caller's retry is answered with it (#15 item 7).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use holdfast::proto;
use holdfast::proto::reservation::State;
use sqlx::PgPool;
use tonic::Code;

use crate::common::*;
use crate::extend::wait_until;

/// Item 7: the caller's deadline passes while its Try is in flight; the placement still runs
/// to its outcome, and the caller's retry is answered with it (and the token).
#[sqlx::test(migrations = false)]
async fn reserve_runs_to_its_outcome_after_the_caller_gives_up(pool: PgPool) {
    let (app, fakes) = spawn_with_fakes(pool, &["slow"]).await;
    let slow = fakes.get("slow");
    let mut client = app.client.clone();
    // Warm up (connections to the database and the participant), so the caller's deadline
    // below passes while its Try is in flight, after the reservation was recorded.
    let mut warm = reserve_request("warm-up", vec![hold("slow", "W")]);
    warm.holder = "someone-else".into();
    client.reserve(warm).await.expect("warm-up");
    slow.behaviour.try_delay_ms.store(1500, Ordering::SeqCst);

    let mut req = tonic::Request::new(reserve_request("r-1", vec![hold("slow", "A1")]));
    req.set_timeout(Duration::from_millis(400));
    let err = client.reserve(req).await.expect_err("the caller gives up");
    assert!(
        matches!(err.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{err:?}"
    );

    // The reservation exists (TRYING while the Try is in flight) and ends HELD.
    let deadline = Instant::now() + Duration::from_secs(20);
    let r = loop {
        let listed = client
            .list_reservations(proto::ListReservationsRequest {
                holder: "user-1".into(),
                ..Default::default()
            })
            .await
            .expect("list")
            .into_inner();
        if let [r] = listed.reservations.as_slice() {
            break r.clone();
        }
        assert!(Instant::now() < deadline, "never recorded: {listed:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let r = wait_until(&mut client, &r.id, |r| state_of(r) != State::Trying).await;
    assert_eq!(state_of(&r), State::Held, "{r:?}");

    let repeat = client
        .reserve(reserve_request("r-1", vec![hold("slow", "A1")]))
        .await
        .expect("repeat")
        .into_inner();
    assert_eq!(repeat.id, r.id);
    assert_eq!(state_of(&repeat), State::Held);
    assert!(!repeat.hold_token.is_empty(), "{repeat:?}");
    let confirmed = client
        .confirm(Decide::on(&repeat).confirm())
        .await
        .expect("the token of the repeat confirms")
        .into_inner();
    assert_eq!(state_of(&confirmed), State::Confirmed);
    // One Try for each reservation, and nothing cancelled.
    assert_eq!(
        fakes.log.count("slow", "Try"),
        2,
        "{:?}",
        fakes.log.summary()
    );
    assert_eq!(
        fakes.log.count("slow", "Cancel"),
        0,
        "{:?}",
        fakes.log.summary()
    );
}
