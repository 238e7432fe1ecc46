//! The sold-out fast path against the real stack: a loser refused after a participant's
//! refusal records nothing (`recorded` = `false`, no reservation id), a release of a held unit
//! makes it reservable at once, units added through `ResourceAdmin` (which the coordinator does
//! not see) are offered again within the hint's bound, a lapsed hint is asked again by one
//! Reserve while the others wait for its answer, and many concurrent clients never oversell
//! nor leave a unit held.

use std::sync::Arc;
use std::time::{Duration, Instant};

use holdfast::participants::Kind::Stock;
use holdfast::proto;
use holdfast::proto::reservation::State;
use sqlx::PgPool;
use tonic::{Code, Status};

use crate::common::{Decide, error_metadata, reason, state_of};
use crate::real::*;

/// How a loser was refused.
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    /// The participant refused it: a `REJECTED` reservation, readable.
    Recorded,
    /// The fast path refused it: nothing recorded.
    Unrecorded,
}

/// Checks a capacity refusal of `resource` at stock and says which kind it was; a recorded
/// one must be readable and `REJECTED`, an unrecorded one must carry no reservation id.
async fn refusal(stack: &Stack, err: &Status, resource: &str) -> Refusal {
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert_eq!(reason(err), "INSUFFICIENT_CAPACITY", "{err:?}");
    let meta = error_metadata(err);
    assert_eq!(meta.get("participant").map(String::as_str), Some("stock"));
    assert_eq!(meta.get("resource").map(String::as_str), Some(resource));
    match meta.get("recorded").map(String::as_str) {
        Some("false") => {
            assert!(!meta.contains_key("reservation_id"), "{meta:?}");
            assert!(err.message().contains("nothing was recorded"), "{err:?}");
            Refusal::Unrecorded
        }
        None => {
            let id = meta
                .get("reservation_id")
                .expect("a recorded refusal names it");
            assert_eq!(state_of(&stack.get(id).await), State::Rejected);
            Refusal::Recorded
        }
        Some(other) => panic!("recorded = {other:?}: {err:?}"),
    }
}

/// Starts the stack with sold-out hints that live `hint`.
async fn stack_with_hint(pool: PgPool, hint: Duration) -> Stack {
    spawn_stack_with(pool, |s| s.policy.sold_out_hint = hint).await
}

/// `n` clients, each on its own connection and a holder of its own, reserving one unit of
/// `resource` at once; the answers in order.
async fn storm(
    stack: &Stack,
    wave: &str,
    n: usize,
    resource: &str,
) -> Vec<Result<proto::Reservation, Status>> {
    let start = Arc::new(tokio::sync::Barrier::new(n));
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let mut client = stack.new_client().await;
        let start = start.clone();
        let req = reserve(
            "buy",
            &format!("{wave}-{i}"),
            None,
            vec![hold(Stock, resource, 1)],
        );
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            client.reserve(req).await.map(|r| r.into_inner())
        }));
    }
    let mut answers = Vec::with_capacity(n);
    for t in tasks {
        answers.push(t.await.expect("join a client"));
    }
    answers
}

/// Winners of a storm, and how many losers were refused each way.
async fn tally(
    stack: &Stack,
    answers: Vec<Result<proto::Reservation, Status>>,
    resource: &str,
) -> (Vec<proto::Reservation>, usize, usize) {
    let (mut won, mut recorded, mut unrecorded) = (Vec::new(), 0, 0);
    for a in answers {
        match a {
            Ok(r) => {
                assert_eq!(state_of(&r), State::Held, "{r:?}");
                won.push(r);
            }
            Err(e) => match refusal(stack, &e, resource).await {
                Refusal::Recorded => recorded += 1,
                Refusal::Unrecorded => unrecorded += 1,
            },
        }
    }
    (won, recorded, unrecorded)
}

async fn reservations_recorded(stack: &Stack) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM reservations")
        .fetch_one(&stack.app.pool)
        .await
        .expect("count reservations")
}

/// A stack whose hints live `bound`, the one unit of `resource` held by h0 and then refused
/// to h1 (recorded: the hint is set): the stack and h0's reservation.
async fn sold_out_once(
    pool: PgPool,
    bound: Duration,
    resource: &str,
) -> (Stack, proto::Reservation) {
    let stack = stack_with_hint(pool, bound).await;
    stack.put(Stock, &[(resource, 1)]).await;
    let mut client = stack.client();
    let buy = |holder: &str| reserve("buy", holder, None, vec![hold(Stock, resource, 1)]);
    let first = client
        .reserve(buy("h0"))
        .await
        .expect("h0 wins")
        .into_inner();
    let err = client.reserve(buy("h1")).await.expect_err("sold out");
    assert_eq!(refusal(&stack, &err, resource).await, Refusal::Recorded);
    (stack, first)
}

/// Cancels `held`, waits until all `units` of `resource` are available again and stops.
async fn release_and_stop(stack: Stack, held: &[proto::Reservation], resource: &str, units: i64) {
    for r in held {
        stack
            .client()
            .cancel(Decide::on(r).cancel_because("sold-out test"))
            .await
            .expect("cancel");
    }
    stack.wait_counts(Stock, resource, (units, 0, 0)).await;
    stack.stop().await;
}

crate::parallel::parallel_test!(flash_sale_losers_record_nothing_and_releases_sell_again => flash_sale_losers_record_nothing_and_releases_sell_again_on);
async fn flash_sale_losers_record_nothing_and_releases_sell_again_on(pool: PgPool) {
    const WAVE: usize = 40;
    // A bound far beyond the test: only releases make units reservable again here.
    let stack = stack_with_hint(pool, Duration::from_secs(3600)).await;
    stack.put(Stock, &[("flash", 5)]).await;

    let (mut live, recorded, unrecorded) =
        tally(&stack, storm(&stack, "w1", WAVE, "flash").await, "flash").await;
    assert_eq!(live.len(), 5, "exactly the capacity wins");
    assert!(
        recorded >= 1,
        "the first loser is refused by the participant"
    );
    assert_eq!(recorded + unrecorded, WAVE - 5);
    assert_eq!(stack.counts(Stock, "flash").await, (0, 5, 0));

    // Sold out, nothing released since: every loser is refused without a write.
    let before = reservations_recorded(&stack).await;
    assert_eq!(
        before,
        (5 + recorded) as i64,
        "unrecorded losers left no row"
    );
    let (won, recorded, unrecorded) =
        tally(&stack, storm(&stack, "w2", WAVE, "flash").await, "flash").await;
    assert!(won.is_empty(), "{won:?}");
    assert_eq!((recorded, unrecorded), (0, WAVE));
    assert_eq!(reservations_recorded(&stack).await, before);
    assert_eq!(stack.counts(Stock, "flash").await, (0, 5, 0));

    // Two winners give their units back: the release drops the hint, and exactly two of the
    // next wave get them.
    for r in live.drain(..2) {
        stack
            .client()
            .cancel(Decide::on(&r).cancel_because("sold-out test"))
            .await
            .expect("cancel a winner");
    }
    stack.wait_counts(Stock, "flash", (2, 3, 0)).await;
    let (won, _, _) = tally(&stack, storm(&stack, "w3", WAVE, "flash").await, "flash").await;
    assert_eq!(won.len(), 2, "the released units sell again, no more");
    live.extend(won);
    assert_eq!(stack.counts(Stock, "flash").await, (0, 5, 0));

    // Conservation: confirm three, cancel the rest; nothing stays held.
    for (i, r) in live.iter().enumerate() {
        let mut client = stack.client();
        if i < 3 {
            client
                .confirm(Decide::on(r).confirm())
                .await
                .expect("confirm");
        } else {
            client
                .cancel(Decide::on(r).cancel_because("sold-out test"))
                .await
                .expect("cancel");
        }
    }
    stack.wait_counts(Stock, "flash", (2, 0, 3)).await;
    stack.stop().await;
}

crate::parallel::parallel_test!(a_recorded_request_repeats_and_an_unrecorded_one_is_evaluated_afresh => a_recorded_request_repeats_and_an_unrecorded_one_is_evaluated_afresh_on);
async fn a_recorded_request_repeats_and_an_unrecorded_one_is_evaluated_afresh_on(pool: PgPool) {
    // h0 holds the one unit; h1's refusal was recorded (it set the hint).
    let (stack, winner) = sold_out_once(pool, Duration::from_secs(3600), "one").await;
    let mut client = stack.client();
    let buy = |holder: &str| reserve("buy", holder, None, vec![hold(Stock, "one", 1)]);
    let err = client.reserve(buy("cat")).await.expect_err("sold out");
    assert_eq!(refusal(&stack, &err, "one").await, Refusal::Unrecorded);

    // h0's request repeated while the hint stands answers its reservation, token included.
    let again = client
        .reserve(buy("h0"))
        .await
        .expect("a repeat")
        .into_inner();
    assert_eq!(
        (again.id.as_str(), again.state),
        (winner.id.as_str(), winner.state)
    );
    assert_eq!(again.hold_token, winner.hold_token);

    // h0 cancels: Cat's same request, refused without a record before, now gets the unit.
    client
        .cancel(Decide::on(&winner).cancel_because("sold-out test"))
        .await
        .expect("cancel");
    let cat = client
        .reserve(buy("cat"))
        .await
        .expect("the released unit")
        .into_inner();
    assert_eq!(state_of(&cat), State::Held);
    assert_eq!(stack.counts(Stock, "one").await, (0, 1, 0));
    release_and_stop(stack, &[cat], "one", 1).await;
}

crate::parallel::parallel_test!(units_added_out_of_sight_are_offered_within_the_bound => units_added_out_of_sight_are_offered_within_the_bound_on);
async fn units_added_out_of_sight_are_offered_within_the_bound_on(pool: PgPool) {
    const BOUND: Duration = Duration::from_millis(500);
    let (stack, first) = sold_out_once(pool, BOUND, "more").await;
    let mut client = stack.client();
    let buy = |holder: &str| reserve("buy", holder, None, vec![hold(Stock, "more", 1)]);

    // A unit added at the participant, not through the coordinator: it cannot know, so the
    // hint may refuse for at most its bound, then the participant is asked again.
    stack.put(Stock, &[("more", 2)]).await;
    let added = Instant::now();
    let mut attempt = 2;
    let second = loop {
        match client.reserve(buy(&format!("h{attempt}"))).await {
            Ok(r) => break r.into_inner(),
            Err(e) => {
                refusal(&stack, &e, "more").await;
                assert!(
                    added.elapsed() < BOUND + Duration::from_secs(3),
                    "the added unit was still refused {:?} later",
                    added.elapsed()
                );
            }
        }
        attempt += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(state_of(&second), State::Held);
    assert_eq!(stack.counts(Stock, "more").await, (0, 2, 0));
    release_and_stop(stack, &[first, second], "more", 2).await;
}

crate::parallel::parallel_test!(a_lapsed_hint_is_asked_again_by_one_reserve_of_a_wave => a_lapsed_hint_is_asked_again_by_one_reserve_of_a_wave_on);
async fn a_lapsed_hint_is_asked_again_by_one_reserve_of_a_wave_on(pool: PgPool) {
    const WAVE: usize = 40;
    const BOUND: Duration = Duration::from_secs(2);
    let (stack, first) = sold_out_once(pool, BOUND, "last").await;

    // The hint's bound passes (nothing to await but time). A wave arrives: one of its
    // Reserves asks the participant again, the others wait for that answer and are refused
    // by it - one recorded refusal per lapse, not one per Reserve in flight.
    tokio::time::sleep(BOUND + Duration::from_millis(100)).await;
    let before = reservations_recorded(&stack).await;
    let (won, recorded, unrecorded) =
        tally(&stack, storm(&stack, "lapsed", WAVE, "last").await, "last").await;
    assert!(won.is_empty(), "{won:?}");
    assert_eq!(
        (recorded, unrecorded),
        (1, WAVE - 1),
        "one Reserve asked again"
    );
    assert_eq!(reservations_recorded(&stack).await, before + 1);

    // Two units added out of sight, the bound passed again: the Reserve asking again is
    // held, so the ones waiting on it go on to the participant, and exactly the two sell.
    stack.put(Stock, &[("last", 3)]).await;
    tokio::time::sleep(BOUND + Duration::from_millis(100)).await;
    let (mut won, _, _) = tally(&stack, storm(&stack, "added", WAVE, "last").await, "last").await;
    assert_eq!(won.len(), 2, "the added units sell, no more");
    assert_eq!(stack.counts(Stock, "last").await, (0, 3, 0));
    won.push(first);
    release_and_stop(stack, &won, "last", 3).await;
}

crate::parallel::parallel_test!(a_resource_that_does_not_exist_never_reads_as_sold_out => a_resource_that_does_not_exist_never_reads_as_sold_out_on);
async fn a_resource_that_does_not_exist_never_reads_as_sold_out_on(pool: PgPool) {
    // A typo in a resource name: the participant's reason reaches the caller, the first time
    // (recorded, REJECTED) and from the fast path after it (nothing recorded).
    let stack = stack_with_hint(pool, Duration::from_secs(3600)).await;
    stack.put(Stock, &[("sku-1", 3)]).await;
    let mut client = stack.client();
    let typo = |holder: &str| reserve("buy", holder, None, vec![hold(Stock, "sku-l", 1)]);
    for (holder, kind) in [("ann", Refusal::Recorded), ("bob", Refusal::Unrecorded)] {
        let err = client
            .reserve(typo(holder))
            .await
            .expect_err("no such item");
        assert_eq!(refusal(&stack, &err, "sku-l").await, kind);
        assert!(
            err.message().contains("item sku-l does not exist"),
            "{holder}: {err:?}"
        );
        assert!(!err.message().contains("sold out"), "{holder}: {err:?}");
    }
    stack.stop().await;
}
