//! The money trail over JSON (SPEC 3.1 `Reservation.payments`): a late payment refunded, and a
//! second payment on a confirmed reservation refunded, each appear on the reservation as
//! `GET /v1/reservations/{id}`, the list and `?id_prefix=` answer it, with its state and
//! refund id.

use std::time::Duration;

use holdfast::domain::LatePaymentPolicy;
use serde_json::{Value, json};
use sqlx::PgPool;

use super::{get, post, reserve_body, spawn_http};
use crate::common::{Shop, charge_for, settings};

/// The payments of the reservation as JSON answers it: (payment_ref, state, refund_id set).
fn trail(r: &Value) -> Vec<(String, String, bool)> {
    r["payments"]
        .as_array()
        .unwrap_or_else(|| panic!("no payments: {r}"))
        .iter()
        .map(|p| {
            let field = |k: &str| p[k].as_str().unwrap_or_default().to_owned();
            (
                field("payment_ref"),
                field("state"),
                !field("refund_id").is_empty(),
            )
        })
        .collect()
}

#[sqlx::test(migrations = false)]
async fn refunded_payments_appear_on_the_reservation(pool: PgPool) {
    let shop = Shop::open(&pool, 100_000).await;
    crate::common::put_resources(&shop.seats, &[("A2", 1)]).await;
    let mut s = settings(&[("seats", &shop.seats), ("payments", &shop.payments)]);
    s.policy.sweep_interval = Duration::from_millis(100);
    s.policy.late_payment = LatePaymentPolicy::Refund;
    let app = spawn_http(pool, s).await;

    // A hold that lapses, then its payment arrives: refunded (policy `refund`).
    let mut body = reserve_body("late-1", "alice", "A1");
    body["ttl"] = json!("1s");
    let late = post(&app, "/v1/reservations", None, &body).await.ok();
    let id = late["id"].as_str().unwrap().to_owned();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while get(&app, &format!("/v1/reservations/{id}"), None)
        .await
        .ok()["state"]
        != "EXPIRED"
    {
        assert!(tokio::time::Instant::now() < deadline, "never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let paid = charge_for(&shop.payments, "card-1", &id, 4_200).await;
    let refused = post(
        &app,
        &format!("/v1/reservations/{id}:confirm"),
        None,
        &json!({"hold_token": late["hold_token"], "payment": {
            "participant": "payments", "payment_ref": paid.payment_ref,
            "amount_minor": 4_200, "currency": "EUR"}}),
    )
    .await;
    refused.assert_error(400, "FAILED_PRECONDITION", "HOLD_EXPIRED");
    let read = get(&app, &format!("/v1/reservations/{id}"), None)
        .await
        .ok();
    let [(payment_ref, state, refund_id)] = &trail(&read)[..] else {
        panic!("one payment: {read}");
    };
    assert_eq!(payment_ref, &paid.payment_ref);
    assert!(
        ["REFUND_PENDING", "REFUNDED"].contains(&state.as_str()),
        "{read}"
    );
    assert!(refund_id, "its refund id: {read}");
    assert_eq!(
        read["refund"]["refund_id"], read["payments"][0]["refund_id"],
        "{read}"
    );

    // A second payment on a confirmed reservation: applied, then refunded, both listed.
    let held = post(
        &app,
        "/v1/reservations",
        None,
        &reserve_body("two-1", "bob", "A2"),
    )
    .await
    .ok();
    let id = held["id"].as_str().unwrap().to_owned();
    let confirm = |p: &holdfast::proto::Payment| {
        json!({"hold_token": held["hold_token"], "payment": {
            "participant": "payments", "payment_ref": p.payment_ref,
            "amount_minor": p.amount_minor, "currency": "EUR"}})
    };
    let first = charge_for(&shop.payments, "card-1", &id, 3_000).await;
    post(
        &app,
        &format!("/v1/reservations/{id}:confirm"),
        None,
        &confirm(&first),
    )
    .await
    .ok();
    let second = charge_for(&shop.payments, "card-1", &id, 1_500).await;
    post(
        &app,
        &format!("/v1/reservations/{id}:confirm"),
        None,
        &confirm(&second),
    )
    .await
    .assert_error(400, "FAILED_PRECONDITION", "RESERVATION_CLOSED");
    let expected = vec![
        (first.payment_ref.clone(), "APPLIED".to_owned(), false),
        (second.payment_ref.clone(), "REFUNDED".to_owned(), true),
    ];
    let read = get(&app, &format!("/v1/reservations/{id}"), None)
        .await
        .ok();
    assert_eq!(trail(&read), expected, "{read}");
    assert_eq!(
        read["refund"],
        Value::Null,
        "the reservation's own payment stands"
    );
    let listed = get(&app, "/v1/reservations?holder=bob", None).await.ok();
    assert_eq!(trail(&listed["reservations"][0]), expected, "{listed}");
    let found = get(
        &app,
        &format!("/v1/reservations?id_prefix={}", &id[..20]),
        None,
    )
    .await
    .ok();
    assert_eq!(trail(&found["reservations"][0]), expected, "{found}");
}
