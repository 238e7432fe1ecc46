//! End to end: the coordinator and the real seats, stock, rooms and payments participants as
//! gRPC servers on loopback, one Postgres database. Every test checks the business effect
//! (the participants' own counts through `tcc.v1.ResourceAdmin/GetResource`), not only the
//! coordinator's answers.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use holdfast::participants::Kind::{Payments, Rooms, Seats, Stock};
use holdfast::proto;
use holdfast::proto::branch::State as BranchState;
use holdfast::proto::reservation::State;
use sqlx::PgPool;
use tonic::{Code, Status};

use crate::common::{Decide, error_metadata, reason, state_of};
use crate::real::*;

/// Checks that a Reserve failed as a capacity rejection and that the rejected reservation is
/// readable, `REJECTED`, names the rejecting participant and holds nothing; returns it. A
/// refusal by the sold-out fast path (a hold the participant just refused, SPEC 3.2) records
/// nothing: it names the participant, carries `recorded` = `false` and no reservation id, and
/// `None` is returned.
async fn assert_rejected(
    stack: &Stack,
    err: &Status,
    participant: &str,
) -> Option<proto::Reservation> {
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert_eq!(reason(err), "INSUFFICIENT_CAPACITY", "{err:?}");
    let meta = error_metadata(err);
    if meta.get("recorded").map(String::as_str) == Some("false") {
        assert_eq!(
            meta.get("participant").map(String::as_str),
            Some(participant)
        );
        assert!(!meta.contains_key("reservation_id"), "{meta:?}");
        return None;
    }
    let id = error_metadata(err)
        .get("reservation_id")
        .cloned()
        .unwrap_or_else(|| panic!("no reservation_id in the error metadata: {err:?}"));
    let r = stack.get(&id).await;
    assert_eq!(state_of(&r), State::Rejected, "{r:?}");
    let rejection = r
        .rejection
        .as_ref()
        .expect("a REJECTED reservation says why");
    assert_eq!(rejection.participant, participant, "{r:?}");
    let held: Vec<_> = branch_states(&r)
        .into_iter()
        .filter(|(_, _, s)| *s == BranchState::Held)
        .collect();
    assert!(held.is_empty(), "rejected {id} still holds {held:?}");
    Some(r)
}

fn assert_branches(r: &proto::Reservation, want: BranchState) {
    assert!(!r.branches.is_empty(), "{r:?}");
    for (participant, resource, state) in branch_states(r) {
        assert_eq!(state, want, "branch {participant}/{resource} of {}", r.id);
    }
}

/// 2 seats + 3 units of stock + a payment authorisation, reserved in one call.
fn basket(request_id: &str, holder: &str) -> proto::ReserveRequest {
    // Listed out of canonical order on purpose: the coordinator sorts them.
    reserve(
        request_id,
        holder,
        None,
        vec![
            hold(Seats, "A2", 1),
            hold(Payments, "acct-1", 4_500),
            hold(Stock, "sku-1", 3),
            hold(Seats, "A1", 1),
        ],
    )
}

async fn provision_basket(stack: &Stack) {
    stack.put(Seats, &[("A1", 1), ("A2", 1)]).await;
    stack.put(Stock, &[("sku-1", 10)]).await;
    stack.put(Payments, &[("acct-1", 10_000)]).await;
    for seat in ["A1", "A2"] {
        assert_eq!(stack.counts(Seats, seat).await, (1, 0, 0));
    }
    assert_eq!(stack.counts(Stock, "sku-1").await, (10, 0, 0));
    assert_eq!(stack.counts(Payments, "acct-1").await, (10_000, 0, 0));
}

/// Reserves the basket and checks every participant shows it held.
async fn reserve_basket(stack: &Stack, request_id: &str) -> proto::Reservation {
    let r = stack
        .client()
        .reserve(basket(request_id, "alice"))
        .await
        .expect("reserve the basket")
        .into_inner();
    assert_eq!(state_of(&r), State::Held, "{r:?}");
    assert!(!r.hold_token.is_empty());
    assert_eq!(r.branches.len(), 4, "{r:?}");
    assert_branches(&r, BranchState::Held);
    for seat in ["A1", "A2"] {
        assert_eq!(stack.counts(Seats, seat).await, (0, 1, 0), "seat {seat}");
    }
    assert_eq!(stack.counts(Stock, "sku-1").await, (7, 3, 0));
    assert_eq!(stack.counts(Payments, "acct-1").await, (5_500, 4_500, 0));
    r
}

#[sqlx::test(migrations = false)]
async fn seats_stock_and_payment_confirm_across_real_participants(pool: PgPool) {
    let stack = spawn_stack(pool).await;
    provision_basket(&stack).await;
    let r = reserve_basket(&stack, "order-confirm").await;

    let confirmed = stack
        .client()
        .confirm(Decide::on(&r).confirm())
        .await
        .expect("confirm")
        .into_inner();
    assert!(
        matches!(state_of(&confirmed), State::Confirming | State::Confirmed),
        "{confirmed:?}"
    );
    let done = stack.wait_state(&r.id, State::Confirmed).await;
    assert_branches(&done, BranchState::Confirmed);
    for seat in ["A1", "A2"] {
        stack.wait_counts(Seats, seat, (0, 0, 1)).await;
    }
    stack.wait_counts(Stock, "sku-1", (7, 0, 3)).await;
    stack
        .wait_counts(Payments, "acct-1", (5_500, 0, 4_500))
        .await;

    // A repeated Confirm answers the same and moves nothing twice.
    let again = stack
        .client()
        .confirm(Decide::on(&r).confirm())
        .await
        .expect("repeat confirm")
        .into_inner();
    assert_eq!(state_of(&again), State::Confirmed);
    // Cancel after Confirm is refused and releases nothing.
    let err = stack
        .client()
        .cancel(Decide::on(&r).cancel_because("end-to-end test"))
        .await
        .expect_err("cancel after confirm");
    assert_eq!(reason(&err), "RESERVATION_CLOSED", "{err:?}");
    assert_eq!(stack.counts(Stock, "sku-1").await, (7, 0, 3));
    assert_eq!(stack.counts(Payments, "acct-1").await, (5_500, 0, 4_500));
    for seat in ["A1", "A2"] {
        assert_eq!(stack.counts(Seats, seat).await, (0, 0, 1), "seat {seat}");
    }
    stack.stop().await;
}

#[sqlx::test(migrations = false)]
async fn seats_stock_and_payment_cancel_across_real_participants(pool: PgPool) {
    let stack = spawn_stack(pool).await;
    provision_basket(&stack).await;
    let r = reserve_basket(&stack, "order-cancel").await;

    let cancelled = stack
        .client()
        .cancel(Decide::on(&r).cancel_because("end-to-end test"))
        .await
        .expect("cancel")
        .into_inner();
    assert!(
        matches!(state_of(&cancelled), State::Cancelling | State::Cancelled),
        "{cancelled:?}"
    );
    let done = stack.wait_state(&r.id, State::Cancelled).await;
    assert_branches(&done, BranchState::Cancelled);
    for seat in ["A1", "A2"] {
        stack.wait_counts(Seats, seat, (1, 0, 0)).await;
    }
    stack.wait_counts(Stock, "sku-1", (10, 0, 0)).await;
    stack.wait_counts(Payments, "acct-1", (10_000, 0, 0)).await;

    // Confirm after Cancel is refused and takes nothing.
    let err = stack
        .client()
        .confirm(Decide::on(&r).confirm())
        .await
        .expect_err("confirm after cancel");
    assert_eq!(reason(&err), "RESERVATION_CLOSED", "{err:?}");
    // The same basket can be had again by someone else: everything really was released.
    let again = stack
        .client()
        .reserve(basket("order-after-cancel", "bob"))
        .await
        .expect("reserve the released basket")
        .into_inner();
    assert_eq!(state_of(&again), State::Held, "{again:?}");
    assert_eq!(stack.counts(Stock, "sku-1").await, (7, 3, 0));
    assert_eq!(stack.counts(Payments, "acct-1").await, (5_500, 4_500, 0));
    stack.stop().await;
}

/// Fires `requests` at once, each from its own client connection, released together by a
/// barrier once every connection is up; returns the answers in request order.
async fn storm(
    stack: &Stack,
    requests: Vec<proto::ReserveRequest>,
) -> Vec<Result<proto::Reservation, Status>> {
    let mut clients = Vec::with_capacity(requests.len());
    for _ in 0..requests.len() {
        clients.push(stack.new_client().await);
    }
    let start = Arc::new(tokio::sync::Barrier::new(requests.len()));
    let tasks: Vec<_> = requests
        .into_iter()
        .zip(clients)
        .map(|(req, mut client)| {
            let start = start.clone();
            tokio::spawn(async move {
                start.wait().await;
                client.reserve(req).await.map(|r| r.into_inner())
            })
        })
        .collect();
    let mut answers = Vec::with_capacity(tasks.len());
    for task in tasks {
        answers.push(task.await.expect("join a client"));
    }
    answers
}

crate::parallel::parallel_test!(concurrent_reserves_of_the_same_seats_in_any_order_have_one_winner => concurrent_reserves_of_the_same_seats_in_any_order_have_one_winner_on);
async fn concurrent_reserves_of_the_same_seats_in_any_order_have_one_winner_on(pool: PgPool) {
    const K: usize = 24;
    const SEATS: [&str; 3] = ["B1", "B2", "B3"];
    const ORDERS: [[usize; 3]; 6] = [
        [0, 1, 2],
        [0, 2, 1],
        [1, 0, 2],
        [1, 2, 0],
        [2, 0, 1],
        [2, 1, 0],
    ];
    let stack = spawn_stack(pool).await;
    stack.put(Seats, &SEATS.map(|s| (s, 1))).await;

    let requests = (0..K)
        .map(|i| {
            let holds = ORDERS[i % ORDERS.len()]
                .iter()
                .map(|&s| hold(Seats, SEATS[s], 1))
                .collect();
            reserve(&format!("seats-{i}"), &format!("holder-{i}"), None, holds)
        })
        .collect();
    let answers = storm(&stack, requests).await;

    let mut winners = Vec::new();
    let mut losers = Vec::new();
    for answer in answers {
        match answer {
            Ok(r) => winners.push(r),
            Err(e) => losers.push(e),
        }
    }
    assert_eq!(
        winners.len(),
        1,
        "exactly one Reserve must win: {:?}",
        winners
            .iter()
            .map(|r| (&r.holder, r.state))
            .collect::<Vec<_>>()
    );
    let winner = &winners[0];
    assert_eq!(state_of(winner), State::Held, "{winner:?}");
    assert_branches(winner, BranchState::Held);
    assert_eq!(losers.len(), K - 1);
    for err in &losers {
        assert_rejected(&stack, err, "seats").await;
    }
    for seat in SEATS {
        assert_eq!(stack.counts(Seats, seat).await, (0, 1, 0), "seat {seat}");
    }

    // Every seat was the winner's: cancelling it frees all three.
    stack
        .client()
        .cancel(Decide::on(winner).cancel_because("end-to-end test"))
        .await
        .expect("cancel the winner");
    stack.wait_state(&winner.id, State::Cancelled).await;
    for seat in SEATS {
        stack.wait_counts(Seats, seat, (1, 0, 0)).await;
    }
    stack.stop().await;
}

crate::parallel::parallel_test!(stock_flash_race_sells_exactly_the_capacity => stock_flash_race_sells_exactly_the_capacity_on);
async fn stock_flash_race_sells_exactly_the_capacity_on(pool: PgPool) {
    const CLIENTS: usize = 50;
    const CAPACITY: i64 = 10;
    let stack = spawn_stack(pool).await;
    stack.put(Stock, &[("flash", CAPACITY)]).await;

    let requests = (0..CLIENTS)
        .map(|i| {
            reserve(
                &format!("flash-{i}"),
                &format!("buyer-{i}"),
                None,
                vec![hold(Stock, "flash", 1)],
            )
        })
        .collect();
    let answers = storm(&stack, requests).await;

    let mut winners = Vec::new();
    let mut losers = Vec::new();
    for answer in answers {
        match answer {
            Ok(r) => winners.push(r),
            Err(e) => losers.push(e),
        }
    }
    assert_eq!(winners.len(), CAPACITY as usize, "winners: {winners:?}");
    for r in &winners {
        assert_eq!(state_of(r), State::Held, "{r:?}");
    }
    for err in &losers {
        assert_rejected(&stack, err, "stock").await;
    }
    assert_eq!(stack.counts(Stock, "flash").await, (0, CAPACITY, 0));

    // Confirming every winner sells exactly the capacity.
    for r in &winners {
        stack
            .client()
            .confirm(Decide::on(r).confirm())
            .await
            .expect("confirm a winner");
    }
    for r in &winners {
        stack.wait_state(&r.id, State::Confirmed).await;
    }
    stack.wait_counts(Stock, "flash", (0, 0, CAPACITY)).await;
    stack.stop().await;
}

/// A timestamp `minutes` from `base` (seconds since the epoch).
fn at(base: i64, minutes: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: base + minutes * 60,
        nanos: 0,
    }
}

fn room(base: i64, from_min: i64, to_min: i64) -> proto::Hold {
    proto::Hold {
        during: Some(proto::Interval {
            start: Some(at(base, from_min)),
            end: Some(at(base, to_min)),
        }),
        ..hold(Rooms, "blue", 1)
    }
}

#[sqlx::test(migrations = false)]
async fn rooms_overlapping_slots_are_rejected_adjacent_ones_held(pool: PgPool) {
    let stack = spawn_stack(pool).await;
    stack.put(Rooms, &[("blue", 1)]).await;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs() as i64;
    let mut client = stack.client();

    // [now-60m, now+60m) covers now, so the room's counts show it.
    let first = client
        .reserve(reserve("room-1", "alice", None, vec![room(now, -60, 60)]))
        .await
        .expect("first slot")
        .into_inner();
    assert_eq!(state_of(&first), State::Held, "{first:?}");
    assert_eq!(stack.counts(Rooms, "blue").await, (0, 1, 0));

    // [now+30m, now+90m) overlaps it.
    let err = client
        .reserve(reserve("room-2", "bob", None, vec![room(now, 30, 90)]))
        .await
        .expect_err("an overlapping slot must be rejected");
    assert_rejected(&stack, &err, "rooms").await;
    assert_eq!(stack.counts(Rooms, "blue").await, (0, 1, 0));

    // [now+60m, now+120m) starts where the first ends: half-open, so no overlap.
    let adjacent = client
        .reserve(reserve("room-3", "carol", None, vec![room(now, 60, 120)]))
        .await
        .expect("an adjacent slot is free")
        .into_inner();
    assert_eq!(state_of(&adjacent), State::Held, "{adjacent:?}");

    // Confirm the first; cancel the adjacent one, whose slot is then free again.
    client
        .confirm(Decide::on(&first).confirm())
        .await
        .expect("confirm");
    stack.wait_state(&first.id, State::Confirmed).await;
    stack.wait_counts(Rooms, "blue", (0, 0, 1)).await;
    client
        .cancel(Decide::on(&adjacent).cancel_because("end-to-end test"))
        .await
        .expect("cancel");
    stack.wait_state(&adjacent.id, State::Cancelled).await;

    let err = client
        .reserve(reserve("room-4", "dave", None, vec![room(now, 30, 90)]))
        .await
        .expect_err("still overlaps the confirmed slot");
    assert_rejected(&stack, &err, "rooms").await;
    let retaken = client
        .reserve(reserve("room-5", "erin", None, vec![room(now, 60, 120)]))
        .await
        .expect("the cancelled slot is free again")
        .into_inner();
    assert_eq!(state_of(&retaken), State::Held, "{retaken:?}");
    assert_eq!(stack.counts(Rooms, "blue").await, (0, 0, 1));
    stack.stop().await;
}

#[sqlx::test(migrations = false)]
async fn expired_hold_is_released_by_the_reaper_through_the_real_stack(pool: PgPool) {
    let stack = spawn_stack(pool).await;
    stack.put(Seats, &[("E1", 1)]).await;

    let r = stack
        .client()
        .reserve(reserve(
            "short",
            "alice",
            Some(Duration::from_secs(1)),
            vec![hold(Seats, "E1", 1)],
        ))
        .await
        .expect("reserve with a 1 s ttl")
        .into_inner();
    assert_eq!(state_of(&r), State::Held, "{r:?}");
    assert_eq!(stack.counts(Seats, "E1").await, (0, 1, 0));

    // Nothing but polling the participant: the coordinator's reaper must release the seat.
    // (The participant itself keeps the hold for an hour past expiry.)
    stack.wait_counts(Seats, "E1", (1, 0, 0)).await;

    // The participant commits its release before the coordinator records it: wait for that.
    let expired = stack.wait_state(&r.id, State::Expired).await;
    assert_branches(&expired, BranchState::Cancelled);
    let err = stack
        .client()
        .confirm(Decide::on(&r).confirm())
        .await
        .expect_err("confirm after expiry");
    assert_eq!(reason(&err), "HOLD_EXPIRED", "{err:?}");
    let next = stack
        .client()
        .reserve(reserve("next", "bob", None, vec![hold(Seats, "E1", 1)]))
        .await
        .expect("the released seat can be had again")
        .into_inner();
    assert_eq!(state_of(&next), State::Held, "{next:?}");
    assert_eq!(stack.counts(Seats, "E1").await, (0, 1, 0));
    stack.stop().await;
}

crate::parallel::parallel_test!(concurrent_losers_release_what_they_held_before_the_seats_refused => concurrent_losers_release_what_they_held_before_the_seats_refused_on);
async fn concurrent_losers_release_what_they_held_before_the_seats_refused_on(pool: PgPool) {
    // "payments" sorts before "seats": every loser's payment is authorised first, then the
    // seats refuse, and the coordinator must void that authorisation.
    const K: usize = 16;
    const SEATS: [&str; 3] = ["D1", "D2", "D3"];
    const AMOUNT: i64 = 100;
    let stack = spawn_stack(pool).await;
    stack.put(Seats, &SEATS.map(|s| (s, 1))).await;
    stack.put(Payments, &[("wallet", 10_000)]).await;

    let requests = (0..K)
        .map(|i| {
            let mut holds: Vec<_> = SEATS.iter().map(|s| hold(Seats, s, 1)).collect();
            holds.rotate_left(i % SEATS.len());
            if i % 2 == 0 {
                holds.reverse();
            }
            holds.insert(i % 4, hold(Payments, "wallet", AMOUNT));
            reserve(
                &format!("pay-seats-{i}"),
                &format!("holder-{i}"),
                None,
                holds,
            )
        })
        .collect();
    let answers = storm(&stack, requests).await;

    let (winners, losers): (Vec<_>, Vec<_>) = answers.into_iter().partition(|a| a.is_ok());
    assert_eq!(
        winners.len(),
        1,
        "exactly one Reserve must win: {winners:?}"
    );
    let winner = winners
        .into_iter()
        .next()
        .and_then(Result::ok)
        .expect("the winner");
    assert_eq!(state_of(&winner), State::Held, "{winner:?}");
    for err in losers.into_iter().filter_map(Result::err) {
        let r = assert_rejected(&stack, &err, "seats")
            .await
            .expect("three seats at one participant: the fast path never refuses a group");
        let payment = branch_states(&r)
            .into_iter()
            .find(|(p, _, _)| p == "payments")
            .expect("a payment branch");
        assert_eq!(payment.2, BranchState::Cancelled, "{r:?}");
    }
    // Only the winner's authorisation remains; every loser's was voided.
    stack
        .wait_counts(Payments, "wallet", (10_000 - AMOUNT, AMOUNT, 0))
        .await;
    for seat in SEATS {
        assert_eq!(stack.counts(Seats, seat).await, (0, 1, 0), "seat {seat}");
    }

    stack
        .client()
        .cancel(Decide::on(&winner).cancel_because("end-to-end test"))
        .await
        .expect("cancel the winner");
    stack.wait_state(&winner.id, State::Cancelled).await;
    stack.wait_counts(Payments, "wallet", (10_000, 0, 0)).await;
    for seat in SEATS {
        stack.wait_counts(Seats, seat, (1, 0, 0)).await;
    }
    stack.stop().await;
}
