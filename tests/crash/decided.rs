//! Crashes after a decision was committed: a Confirm decided before any Confirm is sent, a
//! refund recorded before `Payments/Refund` and acknowledged before it is recorded, and a lost
//! hold (HOLD_LOST -> FAILED) before its refund. The recovering coordinator finishes each:
//! confirmed once per branch, refunded exactly once at the payment service.

use std::time::Duration;

use holdfast::proto;
use sqlx::PgPool;

use crate::common::{Decide, charge_for};
use crate::{Shop, arm, reserve, serial, shop};

#[sqlx::test(migrations = false)]
async fn a_crash_after_the_confirm_decision_before_any_confirm_is_confirmed_by_recovery(
    pool: PgPool,
) {
    let _serial = serial().await;
    let shop = shop(&pool, false, None).await;
    let mut first = shop.first().await;
    let mut client = first.client().await;
    let req = reserve("alice", None, &[("seats", "A1", 1), ("stock", "sku", 2)]);
    let r = client.reserve(req).await.unwrap().into_inner();
    let armed = arm("coord.decide.after", "panic");
    let answer = client.confirm(Decide::on(&r).confirm()).await;
    assert!(answer.is_err(), "the Confirm did not stop: {answer:?}");
    first.kill();
    drop(armed);
    assert_eq!(shop.stored(&r.id).await.0, "CONFIRMING");
    assert_eq!(shop.sent("seats", "Confirm"), Vec::<usize>::new());
    assert_eq!(shop.counts("seats", "A1").await, (0, 1, 0));

    let _second = shop.second().await;
    shop.wait_stored(&r.id, ("CONFIRMED", None)).await;
    for name in ["seats", "stock"] {
        assert_eq!(shop.sent(name, "Try"), vec![1], "{name}");
        assert_eq!(shop.sent(name, "Confirm"), vec![1], "{name}");
        assert_eq!(shop.sent(name, "Cancel"), Vec::<usize>::new(), "{name}");
    }
    assert_eq!(shop.counts("seats", "A1").await, (0, 0, 1));
    assert_eq!(shop.counts("stock", "sku").await, (1, 0, 2));
    assert_eq!(
        shop.barrier(&r.id).await,
        [
            ("seats".into(), "confirmed".into()),
            ("stock".into(), "confirmed".into())
        ]
    );
}

/// A paid Confirm of a cancelled reservation records its refund; the coordinator stops at
/// `step`. Returns the reservation and the payment_ref.
async fn crash_refunding(shop: &Shop, step: &'static str) -> (proto::Reservation, String) {
    let mut first = shop.first().await;
    let mut client = first.client().await;
    let r = client
        .reserve(reserve("alice", None, &[("seats", "A1", 1)]))
        .await
        .unwrap()
        .into_inner();
    client.cancel(Decide::on(&r).cancel()).await.unwrap();
    let payment = charge_for(&shop.payments, "card-1", &r.id, 4_200).await;
    let armed = arm(step, "panic");
    let answer = client.confirm(Decide::on(&r).confirm_with(&payment)).await;
    assert!(
        answer.is_err(),
        "{step}: the Confirm did not stop: {answer:?}"
    );
    first.kill();
    drop(armed);
    let stored = shop.stored(&r.id).await;
    assert_eq!(
        (stored.0.as_str(), stored.1.as_deref()),
        ("CANCELLED", Some("PENDING"))
    );
    (r, payment.payment_ref)
}

#[sqlx::test(migrations = false)]
async fn a_crash_between_the_refund_record_and_the_refund_call_refunds_once(pool: PgPool) {
    let _serial = serial().await;
    let shop = shop(&pool, false, None).await;
    let (r, payment_ref) = crash_refunding(&shop, "coord.refund.before").await;
    assert_eq!(shop.gate.refund_calls(&payment_ref), 0, "nothing sent yet");

    let _second = shop.second().await;
    shop.wait_stored(&r.id, ("CANCELLED", Some("REFUNDED")))
        .await;
    assert_eq!(shop.gate.refund_calls(&payment_ref), 1);
    assert_eq!(shop.refunded(&payment_ref).await, (4_200, 1));
    assert_eq!(shop.sent("seats", "Confirm"), Vec::<usize>::new());
    assert_eq!(shop.counts("seats", "A1").await, (1, 0, 0));
}

#[sqlx::test(migrations = false)]
async fn a_crash_after_the_refund_was_acknowledged_before_it_was_recorded_refunds_once(
    pool: PgPool,
) {
    let _serial = serial().await;
    let shop = shop(&pool, false, None).await;
    let (r, payment_ref) = crash_refunding(&shop, "coord.refund_attempt.before").await;
    assert_eq!(shop.gate.refund_calls(&payment_ref), 1);
    assert_eq!(
        shop.refunded(&payment_ref).await,
        (4_200, 1),
        "already refunded"
    );

    let _second = shop.second().await;
    shop.wait_stored(&r.id, ("CANCELLED", Some("REFUNDED")))
        .await;
    // Sent again with the same refund_id (the idempotency key): no second refund.
    assert_eq!(shop.gate.refund_calls(&payment_ref), 2);
    assert_eq!(shop.refunded(&payment_ref).await, (4_200, 1));
}

#[sqlx::test(migrations = false)]
async fn a_crash_after_a_lost_hold_failed_the_reservation_still_refunds_it(pool: PgPool) {
    let _serial = serial().await;
    // Seats reclaims a lapsed hold at once (orphan grace 0).
    let shop = shop(&pool, false, Some(Duration::ZERO)).await;
    let mut first = shop.first().await;
    let mut client = first.client().await;
    let r = client
        .reserve(reserve(
            "alice",
            Some(Duration::from_secs(1)),
            &[("seats", "A1", 1)],
        ))
        .await
        .unwrap()
        .into_inner();
    // Past its expiry (read lazily: this coordinator never sweeps), nothing released yet...
    crate::wait_expired(&mut client, &r.id).await;
    // ... bob's Try makes seats reclaim alice's orphaned hold.
    client
        .reserve(reserve("bob", None, &[("seats", "A1", 1)]))
        .await
        .unwrap();
    let payment = charge_for(&shop.payments, "card-1", &r.id, 4_200).await;
    let armed = arm("coord.record_phase.after", "panic");
    let answer = client.confirm(Decide::on(&r).confirm_with(&payment)).await;
    assert!(answer.is_err(), "the Confirm did not stop: {answer:?}");
    first.kill();
    drop(armed);
    let stored = shop.stored(&r.id).await;
    assert_eq!(
        (stored.0.as_str(), stored.1.as_deref()),
        ("FAILED", Some("PENDING"))
    );
    assert_eq!(shop.gate.refund_calls(&payment.payment_ref), 0);

    let _second = shop.second().await;
    shop.wait_stored(&r.id, ("FAILED", Some("REFUNDED"))).await;
    assert_eq!(shop.gate.refund_calls(&payment.payment_ref), 1);
    assert_eq!(shop.refunded(&payment.payment_ref).await, (4_200, 1));
    // alice's branch: one Try, one Confirm (answered HOLD_LOST), never again; bob holds.
    assert_eq!(shop.sent("seats", "Try"), vec![1, 1]);
    assert_eq!(shop.sent("seats", "Confirm"), vec![1]);
    assert_eq!(shop.sent("seats", "Cancel"), Vec::<usize>::new());
    assert_eq!(
        shop.counts("seats", "A1").await,
        (0, 1, 0),
        "bob's, sold never"
    );
    assert_eq!(
        shop.barrier(&r.id).await,
        [("seats".into(), "hold_lost".into())]
    );
}
