//! Crashes of a waitlist's offer (SPEC 11): between a release and its offer, and half way
//! through an offer (every hold placed, not yet recorded). The fresh coordinator loses no
//! offer: its sweep offers the queue, its recovery releases the half-made offer and queues the
//! reservation again, and the waiting reservation ends `HELD` with the seat held once.

use std::time::Duration;

use holdfast::proto;

use crate::common::KillableApp;
use crate::{arm, reserve, serial, shop};
use sqlx::PgPool;

/// Bob waits for seat A1 (alice holds it) on `first`; answers (alice's, bob's) reservations.
async fn alice_holds_bob_waits(
    first: &mut KillableApp,
) -> (proto::Reservation, proto::Reservation) {
    let mut client = first.client().await;
    let alice = client
        .reserve(reserve("alice", None, &[("seats", "A1", 1)]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(alice.state(), proto::reservation::State::Held);
    let mut wait = reserve("bob", None, &[("seats", "A1", 1)]);
    wait.queue = Some(proto::QueueOptions {
        wait_up_to: Some(crate::common::proto_duration(Duration::from_secs(3600))),
    });
    let bob = client.reserve(wait).await.unwrap().into_inner();
    assert_eq!(bob.state(), proto::reservation::State::Queued, "{bob:?}");
    (alice, bob)
}

async fn cancel(first: &mut KillableApp, r: &proto::Reservation) {
    first
        .client()
        .await
        .cancel(crate::common::Decide::on(r).cancel())
        .await
        .unwrap();
}

#[sqlx::test(migrations = false)]
async fn a_crash_between_the_release_and_its_offer_loses_no_offer(pool: PgPool) {
    let _serial = serial().await;
    let shop = shop(&pool, false, None).await;
    let mut first = shop.first().await;
    let (alice, bob) = alice_holds_bob_waits(&mut first).await;
    let armed = arm("coord.offer.before", "panic");
    cancel(&mut first, &alice).await;
    first.kill();
    drop(armed);
    assert_eq!(shop.stored(&bob.id).await.0, "QUEUED", "no offer was made");
    assert_eq!(shop.counts("seats", "A1").await, (1, 0, 0), "released");

    let _second = shop.second().await;
    shop.wait_stored(&bob.id, ("HELD", None)).await;
    assert_eq!(shop.counts("seats", "A1").await, (0, 1, 0));
    // Alice's branch was tried and cancelled; bob's first Try was refused, his offer held.
    assert_eq!(shop.sent("seats", "Try"), vec![1, 1, 1]);
    assert_eq!(shop.sent("seats", "Cancel"), vec![1]);
}

#[sqlx::test(migrations = false)]
async fn a_crash_half_way_through_an_offer_is_released_and_offered_again(pool: PgPool) {
    let _serial = serial().await;
    let shop = shop(&pool, false, None).await;
    let mut first = shop.first().await;
    let (alice, bob) = alice_holds_bob_waits(&mut first).await;
    let armed = arm("coord.offer.placed", "panic");
    cancel(&mut first, &alice).await;
    // The offer's Try holds the seat, then the offerer dies before recording it.
    let deadline = tokio::time::Instant::now() + crate::PATIENCE;
    while shop.counts("seats", "A1").await != (0, 1, 0) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the offer never placed the seat"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.kill();
    drop(armed);
    assert_eq!(
        shop.stored(&bob.id).await.0,
        "TRYING",
        "placed, not recorded"
    );

    let _second = shop.second().await;
    shop.wait_stored(&bob.id, ("HELD", None)).await;
    assert_eq!(shop.counts("seats", "A1").await, (0, 1, 0), "held once");
    // Alice's Try; bob's refused Try, his half-made offer (released), his second offer.
    assert_eq!(shop.sent("seats", "Try"), vec![1, 1, 1, 1]);
    assert_eq!(shop.sent("seats", "Cancel"), vec![1, 1]);
}
