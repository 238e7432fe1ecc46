//! Permanent refund refusals are parked, not retried (#15 item 3, SPEC 8.1): a refund the
//! payments service refuses for good (no such payment, more than is left to refund) becomes
//! `Refund.State` `FAILED` with the reason after one attempt, and recovery never sends it
//! again; a transient failure keeps being retried with backoff and then succeeds. For the
//! reservation's own refund and for a further payment's. And a participant that is not a
//! payments service is refused at the door on every path that would record a refund to it.

use std::time::Duration;

use holdfast::api::error::refund_detail;
use holdfast::participants::Kind;
use holdfast::proto;
use holdfast::proto::coordinator_client::CoordinatorClient;
use holdfast::proto::payments_client::PaymentsClient;
use holdfast::proto::reservation::State;
use sqlx::PgPool;
use tonic::Code;
use tonic::transport::Channel;

use crate::common::*;

struct Shop {
    seats: String,
    payments: String,
    gate: PaymentsGate,
}

async fn shop(pool: &PgPool) -> Shop {
    let seats = spawn_participant(Kind::Seats, pool).await;
    let payments = spawn_participant(Kind::Payments, pool).await;
    put_resources(&seats, &[("A1", 1), ("B1", 1)]).await;
    put_resources(&payments, &[("card-1", 100_000)]).await;
    let gate = spawn_payments_gate(&payments).await;
    Shop {
        seats,
        payments,
        gate,
    }
}

/// A coordinator knowing seats and payments (through the gate), sweeping often.
async fn coordinator(pool: PgPool, shop: &Shop) -> TestApp {
    let mut s = settings(&[("seats", &shop.seats), ("payments", &shop.gate.url)]);
    s.policy.sweep_interval = Duration::from_millis(50);
    s.policy.backoff.base = Duration::from_millis(50);
    s.policy.backoff.cap = Duration::from_millis(200);
    spawn_app(pool, s).await
}

async fn reserve(client: &mut CoordinatorClient<Channel>, seat: &str) -> proto::Reservation {
    client
        .reserve(reserve_request(
            &format!("order-{seat}"),
            vec![hold("seats", seat)],
        ))
        .await
        .unwrap()
        .into_inner()
}

/// A reservation of `seat`, cancelled.
async fn cancelled(client: &mut CoordinatorClient<Channel>, seat: &str) -> proto::Reservation {
    let r = reserve(client, seat).await;
    let c = client
        .cancel(Decide::on(&r).cancel())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&c), State::Cancelled);
    r
}

async fn read(client: &mut CoordinatorClient<Channel>, r: &proto::Reservation) -> proto::Refund {
    client
        .get_reservation(proto::GetReservationRequest {
            reservation_id: r.id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .refund
        .expect("a refund")
}

/// Waits until `done` holds, polling every 20 ms for up to 15 s.
async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !done().await {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn failed() -> i32 {
    i32::from(proto::refund::State::Failed)
}

/// The metric line of FAILED refunds, if any was counted in this process.
fn failed_refunds_metric() -> Option<String> {
    holdfast::telemetry::metrics_handle()
        .render()
        .lines()
        .find(|l| l.starts_with("holdfast_refunds_total{state=\"FAILED\"}"))
        .map(str::to_owned)
}

#[sqlx::test(migrations = false)]
async fn a_refund_of_a_payment_the_service_does_not_know_fails_after_one_attempt(pool: PgPool) {
    holdfast::telemetry::metrics_handle();
    let shop = shop(&pool).await;
    let mut app = coordinator(pool, &shop).await;
    let gate = &shop.gate;

    // Two closed reservations, each then confirmed with a payment: refunded (SPEC 3.1). The
    // payments service does not know the first payment (NOT_FOUND: for good), and is out of
    // reach for the second (UNAVAILABLE: for now).
    let lost = cancelled(&mut app.client, "A1").await;
    let lost_pay = charge_for(&shop.payments, "card-1", &lost.id, 4_200).await;
    gate.answer_refunds(&lost_pay.payment_ref, Some(Code::NotFound));
    let later = cancelled(&mut app.client, "B1").await;
    let later_pay = charge_for(&shop.payments, "card-1", &later.id, 1_300).await;
    gate.answer_refunds(&later_pay.payment_ref, Some(Code::Unavailable));

    let err = app
        .client
        .confirm(Decide::on(&lost).confirm_with(&lost_pay))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "RESERVATION_CLOSED");
    let refund = refund_detail(&err).expect("the refund in the details");
    assert_eq!(refund.state, failed(), "{refund:?}");
    assert!(
        refund.failure_reason.contains("NotFound"),
        "{}",
        refund.failure_reason
    );
    assert!(err.message().contains("refused"), "{}", err.message());
    let err = app
        .client
        .confirm(Decide::on(&later).confirm_with(&later_pay))
        .await
        .unwrap_err();
    let pending = refund_detail(&err).unwrap();
    assert_eq!(pending.state, i32::from(proto::refund::State::Pending));

    // Recovery retries the transient one again and again meanwhile; never the failed one.
    until("the unreachable refund retried", async || {
        gate.refund_calls(&later_pay.payment_ref) >= 4
    })
    .await;
    assert_eq!(gate.refund_calls(&lost_pay.payment_ref), 1, "sent once");
    // Then the service answers again: the transient one is refunded.
    gate.answer_refunds(&later_pay.payment_ref, None);
    until("the transient refund acknowledged", async || {
        read(&mut app.client, &later).await.state == i32::from(proto::refund::State::Refunded)
    })
    .await;
    let record = payment_record(&shop.payments, &later_pay.payment_ref).await;
    assert_eq!(record.refunded_minor, 1_300);
    assert_eq!(record.refunds[0].refund_id, pending.refund_id);

    // The failed refund: recorded with its reason, readable, never sent again.
    let now = read(&mut app.client, &lost).await;
    assert_eq!((now.state, now.refund_id), (failed(), refund.refund_id));
    assert_eq!(now.failure_reason, refund.failure_reason);
    let (state, why): (String, String) =
        sqlx::query_as("SELECT refund_state, refund_failure FROM reservations WHERE id = $1::uuid")
            .bind(&lost.id)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(state, "FAILED");
    assert!(why.contains("payments refused the refund"), "{why}");
    assert_eq!(gate.refund_calls(&lost_pay.payment_ref), 1, "sent once");
    assert!(failed_refunds_metric().is_some(), "counted");
}

#[sqlx::test(migrations = false)]
async fn a_further_payment_refund_beyond_what_is_left_fails_and_is_not_retried(pool: PgPool) {
    let shop = shop(&pool).await;
    let mut app = coordinator(pool, &shop).await;
    let gate = &shop.gate;
    let r = reserve(&mut app.client, "A1").await;
    let first = charge_for(&shop.payments, "card-1", &r.id, 4_200).await;
    app.client
        .confirm(Decide::on(&r).confirm_with(&first))
        .await
        .unwrap();

    // A second payment for the confirmed reservation, already refunded in full at the
    // payments service by someone else: the coordinator's refund of it would exceed what is
    // left, which the real service refuses (FAILED_PRECONDITION), for good.
    let second = charge_for(&shop.payments, "card-1", &r.id, 1_500).await;
    PaymentsClient::connect(shop.payments.clone())
        .await
        .unwrap()
        .refund(proto::RefundRequest {
            refund_id: uuid::Uuid::new_v4().to_string(),
            reservation_id: r.id.clone(),
            payment_ref: second.payment_ref.clone(),
            amount_minor: 1_500,
            currency: "EUR".into(),
            reason: "refunded by hand".into(),
        })
        .await
        .unwrap();
    // A third while the service is out of reach: retried until it answers.
    let third = charge_for(&shop.payments, "card-1", &r.id, 700).await;
    gate.answer_refunds(&third.payment_ref, Some(Code::DeadlineExceeded));

    let err = app
        .client
        .confirm(Decide::on(&r).confirm_with(&second))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "RESERVATION_CLOSED");
    let refund = refund_detail(&err).unwrap();
    assert_eq!(refund.state, failed(), "{refund:?}");
    assert!(
        refund.failure_reason.contains("exceed"),
        "{}",
        refund.failure_reason
    );
    let err = app
        .client
        .confirm(Decide::on(&r).confirm_with(&third))
        .await
        .unwrap_err();
    let pending = refund_detail(&err).unwrap();
    assert_eq!(pending.state, i32::from(proto::refund::State::Pending));

    until("the unreachable refund retried", async || {
        gate.refund_calls(&third.payment_ref) >= 4
    })
    .await;
    gate.answer_refunds(&third.payment_ref, None);
    until("the transient refund acknowledged", async || {
        payment_record(&shop.payments, &third.payment_ref)
            .await
            .refunded_minor
            == 700
    })
    .await;
    // A repeat of the Confirm answers the failed refund as it is, and sends nothing.
    let again = app
        .client
        .confirm(Decide::on(&r).confirm_with(&second))
        .await
        .unwrap_err();
    let shown = refund_detail(&again).unwrap();
    assert_eq!((shown.state, shown.refund_id), (failed(), refund.refund_id));
    let rows: Vec<(String, String, Option<String>)> = sqlx::query_as(
        "SELECT payment_ref, refund_state, refund_failure FROM extra_payments ORDER BY created_at",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(
        (rows[0].0.as_str(), rows[0].1.as_str()),
        (second.payment_ref.as_str(), "FAILED")
    );
    assert!(
        rows[0].2.as_deref().unwrap_or("").contains("exceed"),
        "{rows:?}"
    );
    assert_eq!(
        (rows[1].1.as_str(), rows[1].2.as_deref()),
        ("REFUNDED", None)
    );
    assert_eq!(gate.refund_calls(&second.payment_ref), 1, "sent once");
    let record = payment_record(&shop.payments, &second.payment_ref).await;
    assert_eq!((record.refunded_minor, record.refunds.len()), (1_500, 1));
}

#[sqlx::test(migrations = false)]
async fn a_participant_that_is_not_a_payments_service_gets_no_refund_recorded(pool: PgPool) {
    let shop = shop(&pool).await;
    let mut app = coordinator(pool, &shop).await;
    let as_payment = |r: &proto::Reservation| proto::Payment {
        participant: "seats".into(),
        payment_ref: format!("pay-{}", r.id),
        amount_minor: 100,
        currency: "EUR".into(),
    };
    // A closed reservation (a refund would be recorded) and a confirmed one (a further
    // payment would be): both refused at the door, nothing recorded.
    let closed = cancelled(&mut app.client, "A1").await;
    let confirmed = reserve(&mut app.client, "B1").await;
    app.client
        .confirm(Decide::on(&confirmed).confirm())
        .await
        .unwrap();
    for r in [&closed, &confirmed] {
        let err = app
            .client
            .confirm(Decide::on(r).confirm_with(&as_payment(r)))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert_eq!(reason(&err), "PAYMENT_MISMATCH");
        assert_eq!(error_metadata(&err)["check"], "payments_service");
        assert!(refund_detail(&err).is_none());
    }
    let refunds: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM reservations WHERE refund_id IS NOT NULL \
                    OR payment_ref IS NOT NULL) \
              + (SELECT count(*) FROM extra_payments)",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(refunds, 0, "no payment, no refund recorded");
}
