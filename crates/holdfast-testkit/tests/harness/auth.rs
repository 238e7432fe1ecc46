//! Principals named on the builder turn authentication on: a client per principal, each
//! seeing only the reservations it made; calls without a key, with a wrong one or outside the
//! caller's roles refused; the harness's own calls (the clock, `client()`) still work.

use std::time::Duration;

use holdfast_proto as proto;
use holdfast_serve::auth::Bearer;
use holdfast_testkit::client::{Client, Reason, State};
use holdfast_testkit::{Harness, Kind, Role, TestkitError};
use tonic::Code;

use crate::order;

#[tokio::test]
async fn each_principal_calls_with_its_own_key_and_sees_only_its_own_reservations() {
    let harness = Harness::builder()
        .participants([Kind::Seats])
        .resources("seats", [("A1", 1), ("A2", 1)])
        .principal("shop-east", [Role::Client])
        .principal("shop-west", [Role::Client])
        .start()
        .await
        .unwrap();
    let east = harness.client_as("shop-east").await.unwrap();
    let west = harness.client_as("shop-west").await.unwrap();

    let held = east.reserve(order("o-1", "seats", "A1")).await.unwrap();
    assert_eq!(held.reservation.state, State::Held);
    let id = held.reservation.id;
    assert_eq!(east.get(id).await.unwrap().state, State::Held);
    let not_yours = west.get(id).await.unwrap_err();
    assert_eq!(not_yours.reason(), &Reason::ReservationNotFound);
    // The same request_id is another principal's own key space: its Reserve is new.
    let west_held = west.reserve(order("o-1", "seats", "A2")).await.unwrap();
    assert_ne!(west_held.reservation.id, id);

    // No key, and a key nobody was given.
    let anonymous = Client::connect(harness.coordinator_url()).await.unwrap();
    let refused = anonymous.get(id).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
    let forged = Client::builder(harness.coordinator_url())
        .api_key("0".repeat(64))
        .connect()
        .await
        .unwrap();
    assert_eq!(
        forged.get(id).await.unwrap_err().code(),
        Code::Unauthenticated
    );

    // A client may not move the test clock: that is for admins (the harness's own principal).
    let mut testing = proto::testing_client::TestingClient::with_interceptor(
        harness.channel().await.unwrap(),
        Bearer::new(harness.api_key("shop-east").unwrap()).unwrap(),
    );
    let by = Some(prost_types::Duration {
        seconds: 601,
        nanos: 0,
    });
    let denied = testing
        .advance_clock(proto::AdvanceClockRequest { by })
        .await
        .unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied);

    let advanced = harness.advance(Duration::from_secs(601)).await.unwrap();
    assert_eq!(advanced.expired, 2, "both principals' holds expired");
    assert_eq!(
        harness.client().get(id).await.unwrap().state,
        State::Expired
    );
    assert!(matches!(
        harness.api_key("nobody"),
        Err(TestkitError::UnknownPrincipal(_))
    ));
}

#[tokio::test]
async fn keys_survive_a_restart_and_the_harness_principal_is_reserved() {
    let mut harness = Harness::builder()
        .participants([Kind::Seats])
        .resources("seats", [("A1", 1)])
        .principal("shop", [Role::Client])
        .start()
        .await
        .unwrap();
    let shop = harness.client_as("shop").await.unwrap();
    let held = shop.reserve(order("o-1", "seats", "A1")).await.unwrap();
    harness.restart().await.unwrap();
    let after = shop.get(held.reservation.id).await.unwrap();
    assert_eq!(after.state, State::Held);
    let anonymous = Client::connect(harness.coordinator_url()).await.unwrap();
    assert_eq!(
        anonymous.get(held.reservation.id).await.unwrap_err().code(),
        Code::Unauthenticated,
        "still on after the restart"
    );

    let taken = Harness::builder()
        .principal("holdfast-testkit", [Role::Client])
        .start()
        .await;
    assert!(
        matches!(taken, Err(TestkitError::DuplicatePrincipal(name)) if name == "holdfast-testkit")
    );
}
