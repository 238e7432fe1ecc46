//! `cut` and `heal`: the network between the coordinator and one participant.

use holdfast_testkit::client::{Reason, State};
use holdfast_testkit::{Harness, Kind, Script};

use crate::{order, reserve};

#[tokio::test]
async fn a_cut_participant_is_unreachable_until_healed() {
    let harness = Harness::builder()
        .participants([Kind::Seats])
        .resources("seats", [("A1", 1)])
        .fake("stock", Script::new())
        .start()
        .await
        .unwrap();
    harness.cut("stock").await.unwrap();
    let request = order("o-1", "stock", "sku-1");
    let failed = harness.client().reserve(request).await.unwrap_err();
    assert_eq!(*failed.reason(), Reason::ParticipantUnavailable);
    assert!(harness.fake("stock").unwrap().calls().is_empty());
    // The other participant is still reachable.
    let seat = reserve(&harness, order("o-2", "seats", "A1")).await;
    assert_eq!(seat.reservation.state, State::Held);

    harness.heal("stock").await.unwrap();
    let held = reserve(&harness, order("o-3", "stock", "sku-1")).await;
    assert_eq!(held.reservation.state, State::Held);
    assert_eq!(harness.fake("stock").unwrap().held(), ["sku-1"]);
}

#[tokio::test]
async fn unknown_names_are_errors_naming_them() {
    let harness = Harness::builder()
        .participants([Kind::Noop])
        .start()
        .await
        .unwrap();
    let unknown = harness.cut("nope").await.unwrap_err();
    assert!(unknown.to_string().contains("\"nope\""), "{unknown}");
    let not_fake = harness.fake("noop").err().unwrap();
    assert!(not_fake.to_string().contains("not a fake"), "{not_fake}");
    let twice = Harness::builder()
        .participants([Kind::Noop])
        .fake("noop", Script::new())
        .start()
        .await
        .err()
        .unwrap();
    assert!(twice.to_string().contains("twice"), "{twice}");
}
