//! Every script does what it says, and every call is recorded with its answer.

use std::time::{Duration, Instant};

use holdfast_testkit::client::{Reason, State};
use holdfast_testkit::{Answer, Harness, Script};

use crate::{order, reserve, until_calls};

#[tokio::test]
async fn every_call_is_recorded_with_its_branch_and_answer() {
    let harness = Harness::builder()
        .fake("seats", Script::new())
        .start()
        .await
        .unwrap();
    let held = reserve(&harness, order("o-1", "seats", "A1")).await;
    harness
        .client()
        .confirm(held.reservation.id, &held.hold_token, None)
        .await
        .unwrap();
    let calls = harness.fake("seats").unwrap().calls();
    let seen: Vec<_> = calls.iter().map(|c| (c.method, c.answer)).collect();
    assert_eq!(
        seen,
        [
            ("Try", Some(Answer::Held)),
            ("Confirm", Some(Answer::Confirmed))
        ]
    );
    assert_eq!(calls[0].branch_id, calls[1].branch_id);
    assert_eq!(calls[0].resources, ["A1"]);
}

#[tokio::test]
async fn reject_refuses_every_try() {
    let harness = Harness::builder()
        .fake("stock", Script::new().reject())
        .start()
        .await
        .unwrap();
    let refused = harness
        .client()
        .reserve(order("o-1", "stock", "sku-1"))
        .await
        .unwrap_err();
    assert_eq!(*refused.reason(), Reason::InsufficientCapacity);
    let calls = harness.fake("stock").unwrap().calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].answer, Some(Answer::Rejected));
}

#[tokio::test]
async fn reject_resource_refuses_only_that_resource() {
    let harness = Harness::builder()
        .fake("seats", Script::new().reject_resource("B2"))
        .start()
        .await
        .unwrap();
    let held = reserve(&harness, order("o-1", "seats", "A1")).await;
    assert_eq!(held.reservation.state, State::Held);
    let refused = harness
        .client()
        .reserve(order("o-2", "seats", "B2"))
        .await
        .unwrap_err();
    assert_eq!(*refused.reason(), Reason::InsufficientCapacity);
    assert_eq!(harness.fake("seats").unwrap().held(), ["A1"]);
}

#[tokio::test]
async fn fail_next_answers_unavailable_that_many_times_then_holds() {
    let harness = Harness::builder()
        .fake("seats", Script::new().fail_next(1))
        .start()
        .await
        .unwrap();
    let failed = harness
        .client()
        .reserve(order("o-1", "seats", "A1"))
        .await
        .unwrap_err();
    assert_eq!(*failed.reason(), Reason::ParticipantUnavailable);
    let fake = harness.fake("seats").unwrap();
    assert_eq!(fake.calls()[0].answer, Some(Answer::Unavailable));
    let held = reserve(&harness, order("o-2", "seats", "A1")).await;
    assert_eq!(held.reservation.state, State::Held);
    let unavailable = fake
        .calls()
        .iter()
        .filter(|c| c.answer == Some(Answer::Unavailable))
        .count();
    assert_eq!(unavailable, 1, "{:?}", fake.calls());
}

#[tokio::test]
async fn stall_answers_each_try_after_the_delay() {
    let delay = Duration::from_millis(150);
    let harness = Harness::builder()
        .fake("seats", Script::new().stall(delay))
        .start()
        .await
        .unwrap();
    let started = Instant::now();
    let held = reserve(&harness, order("o-1", "seats", "A1")).await;
    assert!(started.elapsed() >= delay, "{:?}", started.elapsed());
    assert_eq!(held.reservation.state, State::Held);
}

#[tokio::test]
async fn stall_tries_lets_the_coordinator_time_out_holding_nothing() {
    let harness = Harness::builder()
        .participant_timeout(Duration::from_millis(200))
        .fake("seats", Script::new().stall_tries())
        .start()
        .await
        .unwrap();
    let failed = harness
        .client()
        .reserve(order("o-1", "seats", "A1"))
        .await
        .unwrap_err();
    assert_eq!(*failed.reason(), Reason::ParticipantUnavailable);
    let fake = harness.fake("seats").unwrap();
    assert_eq!(fake.calls()[0].answer, None, "the Try never answered");
    assert!(fake.held().is_empty());
}

#[tokio::test]
async fn answer_late_places_the_hold_the_coordinator_never_hears_of() {
    let harness = Harness::builder()
        .participant_timeout(Duration::from_millis(200))
        .fake("seats", Script::new().answer_late())
        .start()
        .await
        .unwrap();
    let failed = harness
        .client()
        .reserve(order("o-1", "seats", "A1"))
        .await
        .unwrap_err();
    assert_eq!(*failed.reason(), Reason::ParticipantUnavailable);
    // The hold landed; the coordinator, not knowing, releases it with a Cancel.
    assert_eq!(
        harness.fake("seats").unwrap().calls()[0].answer,
        Some(Answer::Held)
    );
    until_calls(&harness, "seats", |calls| {
        calls
            .iter()
            .any(|c| c.method == "Cancel" && c.answer == Some(Answer::Cancelled))
    })
    .await;
    assert!(harness.fake("seats").unwrap().held().is_empty());
}

#[tokio::test]
async fn a_script_changes_a_running_fake() {
    let harness = Harness::builder()
        .fake("seats", Script::new())
        .start()
        .await
        .unwrap();
    reserve(&harness, order("o-1", "seats", "A1")).await;
    harness
        .fake("seats")
        .unwrap()
        .script(&Script::new().reject());
    let refused = harness
        .client()
        .reserve(order("o-2", "seats", "A2"))
        .await
        .unwrap_err();
    assert_eq!(*refused.reason(), Reason::InsufficientCapacity);
}
