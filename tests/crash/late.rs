//! Crashes while a late payment is honoured by placing released holds again (the retake):
//! after `begin_retake` before any Try, between the Trys, with every Try held before
//! `finish_retake`, after `finish_retake` before the Confirms, and after a failed retake was
//! recorded, before its release and refund. Recovery either finishes the confirmation (once
//! `finish_retake` committed) or releases the new generation of branches and refunds the
//! payment exactly once; never both, never a branch confirmed and cancelled.

use std::time::Duration;

use sqlx::PgPool;

use crate::common::{Decide, charge_for};
use crate::{Shop, arm, reserve, serial, shop};

/// Reserves seats A1 + 2 of stock for a second, lets a sweeping coordinator release them
/// (EXPIRED), then pays late to a coordinator armed at `step` (`action`); it stops there and
/// is killed. Returns the reservation id and the payment_ref.
async fn crash_retake(shop: &Shop, step: &'static str, action: &str) -> (String, String) {
    crash_retake_after(shop, step, action, false).await
}

/// [`crash_retake`]; with `seat_taken`, bob holds seat A1 before the late payment lands.
async fn crash_retake_after(
    shop: &Shop,
    step: &'static str,
    action: &str,
    seat_taken: bool,
) -> (String, String) {
    let reaper = shop.second().await;
    let mut client = reaper.client().await;
    let req = reserve(
        "alice",
        Some(Duration::from_secs(1)),
        &[("seats", "A1", 1), ("stock", "sku", 2)],
    );
    let r = client.reserve(req).await.unwrap().into_inner();
    shop.wait_stored(&r.id, ("EXPIRED", None)).await;
    assert_eq!(shop.counts("seats", "A1").await, (1, 0, 0), "released");
    assert_eq!(shop.counts("stock", "sku").await, (3, 0, 0), "released");
    if seat_taken {
        client
            .reserve(reserve("bob", None, &[("seats", "A1", 1)]))
            .await
            .unwrap();
    }
    drop(reaper);

    let mut first = shop.first().await;
    let payment = charge_for(&shop.payments, "card-1", &r.id, 4_200).await;
    let armed = arm(step, action);
    let answer = first
        .client()
        .await
        .confirm(Decide::on(&r).confirm_with(&payment))
        .await;
    assert!(
        answer.is_err(),
        "{step}: the Confirm did not stop: {answer:?}"
    );
    first.kill();
    drop(armed);
    (r.id, payment.payment_ref)
}

/// Recovery released the retake and refunded: nothing held, one refund, no Confirm anywhere.
async fn refunded_once(shop: &Shop, id: &str, payment_ref: &str) {
    let _second = shop.second().await;
    let stored = shop.wait_stored(id, ("EXPIRED", Some("REFUNDED"))).await;
    assert!(!stored.2, "not honoured");
    assert_eq!(shop.gate.refund_calls(payment_ref), 1);
    assert_eq!(shop.refunded(payment_ref).await, (4_200, 1));
    assert_eq!(shop.counts("seats", "A1").await, (1, 0, 0));
    assert_eq!(shop.counts("stock", "sku").await, (3, 0, 0));
    for name in ["seats", "stock"] {
        assert_eq!(shop.sent(name, "Confirm"), Vec::<usize>::new(), "{name}");
        // Each generation's branch released once: the reaper's, then recovery's.
        assert_eq!(shop.sent(name, "Cancel"), vec![1, 1], "{name}");
    }
}

#[sqlx::test(migrations = false)]
async fn a_crash_after_the_retake_began_before_any_try_refunds(pool: PgPool) {
    let _serial = serial().await;
    let shop = shop(&pool, false, None).await;
    let (id, payment_ref) = crash_retake(&shop, "coord.begin_retake.after", "panic").await;
    assert_eq!(shop.stored(&id).await.1, None, "no refund recorded yet");
    refunded_once(&shop, &id, &payment_ref).await;
    // Never tried again: only the first generation's Trys.
    assert_eq!(shop.sent("seats", "Try"), vec![1]);
    assert_eq!(shop.sent("stock", "Try"), vec![1]);
}

#[sqlx::test(migrations = false)]
async fn a_crash_between_the_retakes_trys_releases_the_retaken_seat_and_refunds(pool: PgPool) {
    let _serial = serial().await;
    let shop = shop(&pool, false, None).await;
    // The first Try of the retake (seats) goes; the coordinator stops before stock's.
    let (id, payment_ref) = crash_retake(&shop, "coord.try.before", "1*off->panic").await;
    assert_eq!(shop.counts("seats", "A1").await, (0, 1, 0), "re-taken");
    assert_eq!(shop.counts("stock", "sku").await, (3, 0, 0), "not tried");
    refunded_once(&shop, &id, &payment_ref).await;
    assert_eq!(shop.sent("seats", "Try"), vec![1, 1]);
    assert_eq!(shop.sent("stock", "Try"), vec![1]);
}

#[sqlx::test(migrations = false)]
async fn a_crash_with_the_retake_held_before_it_was_recorded_releases_and_refunds(pool: PgPool) {
    let _serial = serial().await;
    let shop = shop(&pool, false, None).await;
    let (id, payment_ref) = crash_retake(&shop, "coord.finish_retake.before", "panic").await;
    assert_eq!(shop.counts("seats", "A1").await, (0, 1, 0), "re-taken");
    assert_eq!(shop.counts("stock", "sku").await, (1, 2, 0), "re-taken");
    refunded_once(&shop, &id, &payment_ref).await;
    assert_eq!(shop.sent("seats", "Try"), vec![1, 1]);
    assert_eq!(shop.sent("stock", "Try"), vec![1, 1]);
}

#[sqlx::test(migrations = false)]
async fn a_crash_after_the_retake_was_recorded_confirms_it_without_a_refund(pool: PgPool) {
    let _serial = serial().await;
    let shop = shop(&pool, false, None).await;
    let (id, payment_ref) = crash_retake(&shop, "coord.finish_retake.after", "panic").await;
    assert_eq!(shop.stored(&id).await.0, "CONFIRMING");

    let _second = shop.second().await;
    let stored = shop.wait_stored(&id, ("CONFIRMED", None)).await;
    assert!(stored.2, "late_payment_honored");
    assert_eq!(shop.gate.refund_calls(&payment_ref), 0);
    assert_eq!(shop.refunded(&payment_ref).await, (0, 0));
    assert_eq!(shop.counts("seats", "A1").await, (0, 0, 1));
    assert_eq!(shop.counts("stock", "sku").await, (1, 0, 2));
    for name in ["seats", "stock"] {
        assert_eq!(shop.sent(name, "Try"), vec![1, 1], "{name}");
        assert_eq!(
            shop.sent(name, "Cancel"),
            vec![1],
            "{name}: the first generation's"
        );
        assert_eq!(
            shop.sent(name, "Confirm"),
            vec![1],
            "{name}: the retaken branch's"
        );
    }
}

#[sqlx::test(migrations = false)]
async fn a_crash_after_a_failed_retake_was_recorded_releases_and_refunds(pool: PgPool) {
    let _serial = serial().await;
    let shop = shop(&pool, false, None).await;
    // Bob holds the seat: the retake's first Try (seats) is refused, stock is never tried,
    // the failure and the refund are recorded, and the coordinator stops there.
    let (id, payment_ref) =
        crash_retake_after(&shop, "coord.fail_retake.after", "panic", true).await;
    let stored = shop.stored(&id).await;
    assert_eq!(
        (stored.0.as_str(), stored.1.as_deref()),
        ("CANCELLING", Some("PENDING"))
    );
    assert_eq!(shop.gate.refund_calls(&payment_ref), 0);

    let _second = shop.second().await;
    let stored = shop.wait_stored(&id, ("EXPIRED", Some("REFUNDED"))).await;
    assert!(!stored.2, "not honoured");
    assert_eq!(shop.gate.refund_calls(&payment_ref), 1);
    assert_eq!(shop.refunded(&payment_ref).await, (4_200, 1));
    assert_eq!(shop.counts("seats", "A1").await, (0, 1, 0), "bob's");
    assert_eq!(shop.counts("stock", "sku").await, (3, 0, 0));
    // seats: alice's first hold, bob's, alice's refused retake; only the first released.
    assert_eq!(shop.sent("seats", "Try"), vec![1, 1, 1]);
    assert_eq!(shop.sent("seats", "Cancel"), vec![1]);
    // stock: the retake stopped before it; the first generation's hold released once.
    assert_eq!(shop.sent("stock", "Try"), vec![1]);
    assert_eq!(shop.sent("stock", "Cancel"), vec![1]);
    for name in ["seats", "stock"] {
        assert_eq!(shop.sent(name, "Confirm"), Vec::<usize>::new(), "{name}");
    }
}
