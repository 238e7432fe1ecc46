//! `kill_coordinator` and `restart`: the same database and port; work in flight recovered.

use std::time::Duration;

use holdfast_testkit::client::{Reason, State};
use holdfast_testkit::{Harness, Kind};
use tonic::Code;

use crate::{order, reserve};

#[tokio::test]
async fn a_restarted_coordinator_keeps_its_port_and_its_reservations() {
    let mut harness = Harness::builder()
        .participants([Kind::Seats])
        .resources("seats", [("A1", 1)])
        .start()
        .await
        .unwrap();
    let held = reserve(&harness, order("o-1", "seats", "A1")).await;
    let client = harness.client();
    harness.kill_coordinator();
    // Nothing answers: the connection is gone (or dropped under the call). How the client's
    // HTTP/2 stack reports it depends on where the kill caught the cached connection: refused
    // (UNAVAILABLE), reset while the request was written (an h2 CANCEL reason, CANCELLED), or
    // closed under it (UNKNOWN). Never an answer of a coordinator, which carries a reason.
    let down = client.get(held.reservation.id).await.unwrap_err();
    assert!(
        matches!(
            down.code(),
            Code::Unavailable | Code::Unknown | Code::Cancelled
        ) && *down.reason() == Reason::Unspecified,
        "{down:?}"
    );

    harness.restart().await.unwrap();
    // The same client, the same URL: it reconnects.
    let read = client.get(held.reservation.id).await.unwrap();
    assert_eq!(read.state, State::Held);
    let confirmed = client
        .confirm(held.reservation.id, &held.hold_token, None)
        .await
        .unwrap();
    assert_eq!(confirmed.state, State::Confirmed);
    assert_eq!(harness.resource("seats", "A1").await.unwrap().confirmed, 1);
}

#[tokio::test]
async fn a_confirm_cut_off_by_a_kill_is_finished_after_restart() {
    let mut harness = Harness::builder()
        .participants([Kind::Seats, Kind::Stock])
        .resources("seats", [("A1", 1)])
        .resources("stock", [("sku-1", 5)])
        .start()
        .await
        .unwrap();
    let request =
        order("o-1", "seats", "A1").hold(holdfast_testkit::client::Hold::new("stock", "sku-1"));
    let held = reserve(&harness, request).await;
    // The decision is recorded, the stock's Confirm cannot arrive: the coordinator dies with
    // the reservation CONFIRMING.
    harness.cut("stock").await.unwrap();
    let answer = harness
        .client()
        .confirm(held.reservation.id, &held.hold_token, None)
        .await;
    let state = match answer {
        Ok(r) => r.state,
        Err(_) => {
            harness
                .client()
                .get(held.reservation.id)
                .await
                .unwrap()
                .state
        }
    };
    assert_eq!(state, State::Confirming);
    harness.kill_coordinator();
    harness.heal("stock").await.unwrap();
    harness.restart().await.unwrap();
    // Past any lease and backoff the dead coordinator left: recovery runs within the call.
    harness.advance(Duration::from_secs(120)).await.unwrap();
    let done = harness.client().get(held.reservation.id).await.unwrap();
    assert_eq!(done.state, State::Confirmed);
    assert_eq!(
        harness.resource("stock", "sku-1").await.unwrap().confirmed,
        1
    );
    assert_eq!(harness.resource("seats", "A1").await.unwrap().confirmed, 1);
}
