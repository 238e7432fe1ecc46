//! A checkout saga tested against scripted participants: a real coordinator in-process, two
//! fakes (`seats`, `loyalty`) that play what a test tells them, the clock moved instead of
//! slept through. No reference participant is needed (no feature). Run:
//! `cargo test -p holdfast-testkit --example scripted_fakes`.

use std::time::Duration;

use holdfast_testkit::client::{Client, Error, Hold, Reason, Reserve, Reserved, State};
use holdfast_testkit::{Answer, Harness, Script};

/// The code under test: hold a seat and the customer's loyalty points, all or nothing.
async fn hold_checkout(holdfast: &Client, order: &str) -> Result<Reserved, Error> {
    let request = Reserve::new(order, "alice")
        .hold(Hold::new("seats", "A1"))
        .hold(Hold::new("loyalty", "alice-points").quantity(500))
        .ttl(Duration::from_secs(600));
    holdfast.reserve(request).await
}

async fn shop(seats: Script, loyalty: Script) -> Harness {
    Harness::builder()
        .fake("seats", seats)
        .fake("loyalty", loyalty)
        .start()
        .await
        .expect("the harness starts")
}

async fn a_participant_down_during_try_leaves_nothing_held() {
    // Participants are tried in name order: loyalty holds, then seats fails.
    let harness = shop(Script::new().fail_next(1), Script::new()).await;
    let failed = hold_checkout(&harness.client(), "order-1")
        .await
        .unwrap_err();
    // A Try is never retried: the Reserve fails and the points already held are released.
    assert_eq!(*failed.reason(), Reason::ParticipantUnavailable);
    let loyalty = harness.fake("loyalty").unwrap();
    assert_eq!(loyalty.count("Cancel"), 1);
    assert!(loyalty.held().is_empty());
    assert!(harness.fake("seats").unwrap().held().is_empty());
}

async fn a_confirm_that_fails_is_retried_until_it_lands() {
    let harness = shop(Script::new(), Script::new()).await;
    let client = harness.client();
    let held = hold_checkout(&client, "order-2").await.unwrap();
    let loyalty = harness.fake("loyalty").unwrap();
    loyalty.script(&Script::new().fail_next(2));

    let answer = client
        .confirm(held.reservation.id, &held.hold_token, None)
        .await
        .unwrap();
    // Decided, not yet told to everyone: the coordinator retries on its own, with backoff.
    assert_eq!(answer.state, State::Confirming);
    let mut watch = client.watch(held.reservation.id).await.unwrap();
    let settled = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(reservation) = watch.next().await {
            if reservation.unwrap().state == State::Confirmed {
                return true;
            }
        }
        false
    });
    assert!(
        settled.await.unwrap(),
        "the reservation never became CONFIRMED"
    );
    let answers: Vec<_> = loyalty
        .calls()
        .iter()
        .filter(|c| c.method == "Confirm")
        .map(|c| c.answer)
        .collect();
    let failed = Some(Answer::Unavailable);
    assert_eq!(answers, [failed, failed, Some(Answer::Confirmed)]);
}

async fn an_abandoned_checkout_is_released_when_the_clock_passes_its_ttl() {
    let harness = shop(Script::new(), Script::new()).await;
    let held = hold_checkout(&harness.client(), "order-3").await.unwrap();

    let advanced = harness.advance(Duration::from_secs(601)).await.unwrap();

    assert_eq!(advanced.expired, 1);
    let expired = harness.client().get(held.reservation.id).await.unwrap();
    assert_eq!(expired.state, State::Expired);
    assert!(harness.fake("seats").unwrap().held().is_empty());
    assert!(harness.fake("loyalty").unwrap().held().is_empty());
}

/// `cargo run --example` runs the scenarios one after another; `cargo test` runs each as a test.
#[allow(dead_code)] // `cargo test` builds this file as a test harness, without `main`.
#[tokio::main]
async fn main() {
    a_participant_down_during_try_leaves_nothing_held().await;
    a_confirm_that_fails_is_retried_until_it_lands().await;
    an_abandoned_checkout_is_released_when_the_clock_passes_its_ttl().await;
    println!("all 3 scenarios passed");
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn a_participant_down_during_try_leaves_nothing_held() {
        super::a_participant_down_during_try_leaves_nothing_held().await;
    }

    #[tokio::test]
    async fn a_confirm_that_fails_is_retried_until_it_lands() {
        super::a_confirm_that_fails_is_retried_until_it_lands().await;
    }

    #[tokio::test]
    async fn an_abandoned_checkout_is_released_when_the_clock_passes_its_ttl() {
        super::an_abandoned_checkout_is_released_when_the_clock_passes_its_ttl().await;
    }
}
