//! How Reserve, Confirm and Cancel fan out to participants: canonical order, one participant
//! at a time, all-or-nothing, and what an unreachable or slow participant does.

use std::sync::atomic::Ordering;
use std::time::Duration;

use holdfast::proto;
use holdfast::proto::reservation::State;
use sqlx::PgPool;
use tonic::Code;

use crate::common::*;

#[sqlx::test(migrations = false)]
async fn holds_are_placed_in_canonical_order_whatever_the_request_order(pool: PgPool) {
    let (mut app, fakes) = spawn_with_fakes(pool, &["payments", "seats", "stock"]).await;
    let r = app
        .client
        .reserve(reserve_request(
            "r1",
            vec![
                hold("stock", "sku-2"),
                hold("seats", "Z9"),
                hold("payments", "acct-1"),
                hold("seats", "A1"),
                hold("stock", "sku-1"),
            ],
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&r), State::Held);
    let calls = fakes.log.calls();
    let tries: Vec<(String, Vec<String>)> = calls
        .iter()
        .map(|c| (c.participant.clone(), c.resources.clone()))
        .collect();
    assert_eq!(
        tries,
        [
            ("payments".to_owned(), vec!["acct-1".to_owned()]),
            ("seats".to_owned(), vec!["A1".to_owned(), "Z9".to_owned()]),
            (
                "stock".to_owned(),
                vec!["sku-1".to_owned(), "sku-2".to_owned()]
            ),
        ]
    );
    let listed: Vec<(String, String)> = r
        .branches
        .iter()
        .map(|b| (b.participant.clone(), b.resource.clone()))
        .collect();
    assert_eq!(
        listed,
        [
            ("payments".to_owned(), "acct-1".to_owned()),
            ("seats".to_owned(), "A1".to_owned()),
            ("seats".to_owned(), "Z9".to_owned()),
            ("stock".to_owned(), "sku-1".to_owned()),
            ("stock".to_owned(), "sku-2".to_owned()),
        ]
    );
}

#[sqlx::test(migrations = false)]
async fn rejection_by_the_second_releases_the_first_and_never_calls_the_third(pool: PgPool) {
    let (mut app, fakes) = spawn_with_fakes(pool, &["a", "b", "c"]).await;
    fakes
        .get("b")
        .behaviour
        .reject
        .store(true, Ordering::SeqCst);
    let err = app
        .client
        .reserve(reserve_request(
            "r1",
            vec![hold("c", "3"), hold("b", "2"), hold("a", "1")],
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert_eq!(reason(&err), "INSUFFICIENT_CAPACITY");
    let meta = error_metadata(&err);
    assert_eq!(meta["participant"], "b");
    assert_eq!(meta["resource"], "2");
    assert_eq!(fakes.log.summary(), ["a.Try", "b.Try", "a.Cancel"]);
    assert!(fakes.get("a").held().is_empty());

    // The reservation is REJECTED and readable, with the reason.
    let id = meta["reservation_id"].clone();
    let r = app
        .client
        .get_reservation(proto::GetReservationRequest { reservation_id: id })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&r), State::Rejected);
    let rejection = r.rejection.unwrap();
    assert_eq!(
        (rejection.participant.as_str(), rejection.reason.as_str()),
        ("b", "sold out")
    );
    let states: Vec<_> = r
        .branches
        .iter()
        .map(|b| proto::branch::State::try_from(b.state).unwrap())
        .collect();
    use proto::branch::State as B;
    assert_eq!(states, [B::Cancelled, B::Rejected, B::Pending]);
}

/// Refused by the first participant, nothing was placed: no Cancel is sent, the later
/// participants are never called, and the refusal is recorded `REJECTED` in one write after
/// the create (no `CANCELLING` step), its lease freed.
#[sqlx::test(migrations = false)]
async fn rejection_by_the_first_is_recorded_in_one_write_and_releases_nothing(pool: PgPool) {
    let (mut app, fakes) = spawn_with_fakes(pool.clone(), &["a", "b"]).await;
    fakes
        .get("a")
        .behaviour
        .reject
        .store(true, Ordering::SeqCst);
    let err = app
        .client
        .reserve(reserve_request("r1", vec![hold("a", "1"), hold("b", "2")]))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "INSUFFICIENT_CAPACITY");
    assert_eq!(fakes.log.summary(), ["a.Try"]);
    let id: uuid::Uuid = error_metadata(&err)["reservation_id"].parse().unwrap();
    let (state, version, leased): (String, i64, bool) = sqlx::query_as(
        "SELECT state, version, lease_owner IS NOT NULL FROM reservations WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        (state.as_str(), version, leased),
        ("REJECTED", 2, false),
        "created at version 1, rejected by the one write after it"
    );
}

#[sqlx::test(migrations = false)]
async fn unreachable_participant_leaves_nothing_held(pool: PgPool) {
    let log = CallLog::default();
    let seats = spawn_fake("seats", log.clone()).await;
    let down = closed_url().await;
    let mut app = spawn_app(
        pool,
        settings(&[("seats", seats.url.as_str()), ("stock", down.as_str())]),
    )
    .await;
    let err = app
        .client
        .reserve(reserve_request(
            "r1",
            vec![hold("stock", "sku-1"), hold("seats", "A1")],
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert_eq!(reason(&err), "PARTICIPANT_UNAVAILABLE");
    assert_eq!(error_metadata(&err)["participant"], "stock");
    assert!(
        seats.held().is_empty(),
        "the seat placed before is released"
    );
    assert_eq!(log.summary(), ["seats.Try", "seats.Cancel"]);
    let r = app
        .client
        .get_reservation(proto::GetReservationRequest {
            reservation_id: error_metadata(&err)["reservation_id"].clone(),
        })
        .await
        .unwrap()
        .into_inner();
    // The unreachable branch's outcome was unknown: cancelling it was attempted and failed,
    // so the release is still owed (recovery completes it), and the error is on the branch.
    assert_eq!(state_of(&r), State::Cancelling);
    let stock = r
        .branches
        .iter()
        .find(|b| b.participant == "stock")
        .unwrap();
    assert!(!stock.last_error.is_empty());
    assert!(stock.attempts >= 2, "tried, then cancel attempted");
}

#[sqlx::test(migrations = false)]
async fn a_participant_that_times_out_is_cancelled_too(pool: PgPool) {
    let log = CallLog::default();
    let a = spawn_fake("a", log.clone()).await;
    let b = spawn_fake("b", log.clone()).await;
    b.behaviour.stall_tries.store(true, Ordering::SeqCst);
    let mut s = settings(&[("a", a.url.as_str()), ("b", b.url.as_str())]);
    for p in &mut s.participants {
        p.timeout = Duration::from_millis(300);
    }
    let mut app = spawn_app(pool, s).await;
    let err = app
        .client
        .reserve(reserve_request("r1", vec![hold("a", "1"), hold("b", "2")]))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "PARTICIPANT_UNAVAILABLE");
    // Its Try may still land: the Cancel sent to it makes that late Try a no-op.
    let calls = log.summary();
    assert_eq!(calls[..2], ["a.Try", "b.Try"]);
    let mut releases = calls[2..].to_vec();
    releases.sort();
    assert_eq!(releases, ["a.Cancel", "b.Cancel"]);
    assert!(a.held().is_empty());
    let r = app
        .client
        .get_reservation(proto::GetReservationRequest {
            reservation_id: error_metadata(&err)["reservation_id"].clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&r), State::Rejected);
}

/// The unknown outcome that did land: b records the hold, then its answer never arrives in
/// time. The Cancel the coordinator sends must reach b and release that hold (with the
/// stall before the hold, "nothing stays held" could not fail).
#[sqlx::test(migrations = false)]
async fn a_try_that_lands_but_times_out_is_released(pool: PgPool) {
    let log = CallLog::default();
    let a = spawn_fake("a", log.clone()).await;
    let b = spawn_fake("b", log.clone()).await;
    b.behaviour.stall_after_try.store(true, Ordering::SeqCst);
    let mut s = settings(&[("a", a.url.as_str()), ("b", b.url.as_str())]);
    for p in &mut s.participants {
        p.timeout = Duration::from_millis(300);
    }
    let mut app = spawn_app(pool, s).await;
    let err = app
        .client
        .reserve(reserve_request("r1", vec![hold("a", "1"), hold("b", "2")]))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "PARTICIPANT_UNAVAILABLE");
    // b's Try landed: it was holding when the coordinator gave up on the answer.
    assert_eq!(
        b.state.lock().unwrap().branches.len(),
        1,
        "b recorded the hold"
    );
    assert!(b.held().is_empty(), "b's landed hold released");
    assert!(a.held().is_empty());
    assert_eq!(
        b.effects(),
        (0, 1),
        "the Cancel found b's hold and released it"
    );
    assert_eq!(a.effects(), (0, 1));
    log.assert_once_per_branch("a", "Cancel", 1);
    log.assert_once_per_branch("b", "Cancel", 1);
    let branch = log.per_branch("b", "Cancel").into_keys().next().unwrap();
    assert_eq!(b.answers(&branch, "Cancel"), [FakeBranch::Cancelled]);
    let r = app
        .client
        .get_reservation(proto::GetReservationRequest {
            reservation_id: error_metadata(&err)["reservation_id"].clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&r), State::Rejected);
}

#[sqlx::test(migrations = false)]
async fn participant_down_during_confirm_answers_confirming(pool: PgPool) {
    let (mut app, fakes) = spawn_with_fakes(pool, &["seats", "stock"]).await;
    let r = app
        .client
        .reserve(reserve_request(
            "r1",
            vec![hold("seats", "A1"), hold("stock", "sku-1")],
        ))
        .await
        .unwrap()
        .into_inner();
    fakes
        .get("stock")
        .behaviour
        .fail_confirms
        .store(1, Ordering::SeqCst);
    let c = app
        .client
        .confirm(Decide::on(&r).confirm())
        .await
        .expect("the outcome is fixed: not an error for the caller")
        .into_inner();
    assert_eq!(state_of(&c), State::Confirming);
    let seats = c
        .branches
        .iter()
        .find(|b| b.participant == "seats")
        .unwrap();
    let stock = c
        .branches
        .iter()
        .find(|b| b.participant == "stock")
        .unwrap();
    assert_eq!(seats.state, i32::from(proto::branch::State::Confirmed));
    assert_eq!(stock.state, i32::from(proto::branch::State::Held));
    assert!(stock.last_error.contains("failing on purpose"));
    assert_eq!(stock.attempts, 2, "Try, then the failed Confirm");

    // Cancel cannot undo a decided confirm.
    let err = app
        .client
        .cancel(Decide::on(&r).cancel())
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "RESERVATION_CLOSED");
    assert_eq!(fakes.get("stock").effects(), (0, 0));
}
