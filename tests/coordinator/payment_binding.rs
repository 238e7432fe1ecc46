//! Payments are bound to reservations (SPEC 7.3), against the real seats and payments
//! participants: a Confirm's payment is checked with `Payments/GetPayment` before it is
//! recorded - made for this reservation, in this currency and amount, at a payments service -
//! one payment_ref belongs to at most one reservation, and a second, different payment for a
//! confirmed reservation is refunded, never dropped. Every refusal leaves everything as it was.

use std::sync::atomic::Ordering;
use std::time::Duration;

use holdfast::api::error::refund_detail;
use holdfast::participants::Kind;
use holdfast::proto;
use holdfast::proto::coordinator_client::CoordinatorClient;
use holdfast::proto::reservation::State;
use sqlx::PgPool;
use tonic::Code;
use tonic::transport::Channel;

use crate::common::*;

struct Shop {
    seats: String,
    payments: String,
}

async fn shop(pool: &PgPool) -> Shop {
    let shop = Shop {
        seats: spawn_participant(Kind::Seats, pool).await,
        payments: spawn_participant(Kind::Payments, pool).await,
    };
    put_resources(&shop.seats, &[("A1", 1), ("B1", 1)]).await;
    put_resources(&shop.payments, &[("card-1", 100_000)]).await;
    shop
}

/// A coordinator knowing seats and payments (reached at `payments_url`).
async fn coordinator(pool: PgPool, shop: &Shop, payments_url: &str) -> TestApp {
    spawn_app(
        pool,
        settings(&[("seats", &shop.seats), ("payments", payments_url)]),
    )
    .await
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

async fn read(
    client: &mut CoordinatorClient<Channel>,
    r: &proto::Reservation,
) -> proto::Reservation {
    client
        .get_reservation(proto::GetReservationRequest {
            reservation_id: r.id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
}

/// The Confirm is refused with PAYMENT_MISMATCH naming the failed `check` and the reservation.
fn assert_mismatch(err: &tonic::Status, r: &proto::Reservation, check: &str) {
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert_eq!(reason(err), "PAYMENT_MISMATCH", "{err:?}");
    let meta = error_metadata(err);
    assert_eq!(meta["reservation_id"], r.id);
    assert_eq!(meta["check"], check, "{}", err.message());
    assert!(
        err.message().contains("nothing was changed"),
        "{}",
        err.message()
    );
}

/// Nothing changed: `r` is still HELD (its seat held, not sold), no payment refunded.
async fn assert_unchanged(
    client: &mut CoordinatorClient<Channel>,
    shop: &Shop,
    r: &proto::Reservation,
    seat: &str,
    payment_ref: &str,
) {
    let now = read(client, r).await;
    assert_eq!(state_of(&now), State::Held);
    assert!(now.refund.is_none(), "no refund recorded: {now:?}");
    let s = resource(&shop.seats, seat).await;
    assert_eq!((s.held, s.confirmed), (1, 0));
    if payment_ref.starts_with("pay_") {
        let p = payment_record(&shop.payments, payment_ref).await;
        assert_eq!((p.refunded_minor, p.refunds.len()), (0, 0));
    }
}

#[sqlx::test(migrations = false)]
async fn a_payment_made_for_another_reservation_is_refused(pool: PgPool) {
    let shop = shop(&pool).await;
    let mut app = coordinator(pool, &shop, &shop.payments).await;
    let a = reserve(&mut app.client, "A1").await;
    let b = reserve(&mut app.client, "B1").await;
    let for_a = charge_for(&shop.payments, "card-1", &a.id, 4_200).await;

    let err = app
        .client
        .confirm(Decide::on(&b).confirm_with(&for_a))
        .await
        .expect_err("A's payment cannot confirm B");
    assert_mismatch(&err, &b, "reservation");
    assert_unchanged(&mut app.client, &shop, &b, "B1", &for_a.payment_ref).await;

    // It confirms the reservation it was made for.
    let c = app
        .client
        .confirm(Decide::on(&a).confirm_with(&for_a))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&c), State::Confirmed);
    assert_eq!(read(&mut app.client, &b).await.refund, None);
}

#[sqlx::test(migrations = false)]
async fn a_payment_of_another_amount_is_refused(pool: PgPool) {
    let shop = shop(&pool).await;
    let mut app = coordinator(pool, &shop, &shop.payments).await;
    let r = reserve(&mut app.client, "A1").await;
    let paid = charge_for(&shop.payments, "card-1", &r.id, 4_200).await;
    let claimed = proto::Payment {
        amount_minor: 42_000,
        ..paid.clone()
    };
    let err = app
        .client
        .confirm(Decide::on(&r).confirm_with(&claimed))
        .await
        .expect_err("the amount is not what was paid");
    assert_mismatch(&err, &r, "amount");
    assert!(
        err.message().contains("payment.amount_minor"),
        "{}",
        err.message()
    );
    assert_unchanged(&mut app.client, &shop, &r, "A1", &paid.payment_ref).await;
}

#[sqlx::test(migrations = false)]
async fn a_payment_in_another_currency_is_refused(pool: PgPool) {
    let shop = shop(&pool).await;
    let mut app = coordinator(pool, &shop, &shop.payments).await;
    let r = reserve(&mut app.client, "A1").await;
    let paid = charge_for(&shop.payments, "card-1", &r.id, 4_200).await;
    let claimed = proto::Payment {
        currency: "USD".into(),
        ..paid.clone()
    };
    let err = app
        .client
        .confirm(Decide::on(&r).confirm_with(&claimed))
        .await
        .expect_err("the currency is not what was paid in");
    assert_mismatch(&err, &r, "currency");
    assert_unchanged(&mut app.client, &shop, &r, "A1", &paid.payment_ref).await;
}

#[sqlx::test(migrations = false)]
async fn an_unknown_payment_ref_is_refused(pool: PgPool) {
    let shop = shop(&pool).await;
    let mut app = coordinator(pool, &shop, &shop.payments).await;
    let r = reserve(&mut app.client, "A1").await;
    let invented = proto::Payment {
        participant: "payments".into(),
        payment_ref: "pay_never_charged".into(),
        amount_minor: 4_200,
        currency: "EUR".into(),
    };
    let err = app
        .client
        .confirm(Decide::on(&r).confirm_with(&invented))
        .await
        .expect_err("no such payment");
    assert_mismatch(&err, &r, "exists");
    assert_unchanged(&mut app.client, &shop, &r, "A1", "").await;
}

#[sqlx::test(migrations = false)]
async fn a_seats_participant_is_not_a_payments_service(pool: PgPool) {
    let shop = shop(&pool).await;
    let mut app = coordinator(pool, &shop, &shop.payments).await;
    let r = reserve(&mut app.client, "A1").await;
    let paid = charge_for(&shop.payments, "card-1", &r.id, 4_200).await;
    let at_seats = proto::Payment {
        participant: "seats".into(),
        ..paid.clone()
    };
    let err = app
        .client
        .confirm(Decide::on(&r).confirm_with(&at_seats))
        .await
        .expect_err("seats takes no payments");
    assert_mismatch(&err, &r, "payments_service");
    assert!(
        err.message().contains("not a payments service"),
        "{}",
        err.message()
    );
    assert_unchanged(&mut app.client, &shop, &r, "A1", &paid.payment_ref).await;
}

#[sqlx::test(migrations = false)]
async fn the_same_payment_ref_on_two_reservations_is_refused(pool: PgPool) {
    let shop = shop(&pool).await;
    let mut app = coordinator(pool.clone(), &shop, &shop.payments).await;
    let a = reserve(&mut app.client, "A1").await;
    let b = reserve(&mut app.client, "B1").await;
    let paid = charge_for(&shop.payments, "card-1", &a.id, 4_200).await;
    let c = app
        .client
        .confirm(Decide::on(&a).confirm_with(&paid))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&c), State::Confirmed);

    // The payment service now vouches for the payment as B's (a payment service that got it
    // wrong, say): the coordinator still binds one payment_ref to one reservation.
    sqlx::query("UPDATE payment SET reservation_id = $1 WHERE payment_ref = $2")
        .bind(&b.id)
        .bind(&paid.payment_ref)
        .execute(&pool)
        .await
        .unwrap();
    let err = app
        .client
        .confirm(Decide::on(&b).confirm_with(&paid))
        .await
        .expect_err("the payment is A's");
    assert_mismatch(&err, &b, "payment_ref");
    assert!(
        err.message().contains("another reservation"),
        "{}",
        err.message()
    );
    assert_unchanged(&mut app.client, &shop, &b, "B1", &paid.payment_ref).await;
    assert_eq!(state_of(&read(&mut app.client, &a).await), State::Confirmed);
}

#[sqlx::test(migrations = false)]
async fn a_second_different_payment_on_a_confirmed_reservation_is_refunded(pool: PgPool) {
    let shop = shop(&pool).await;
    let gate = spawn_payments_gate(&shop.payments).await;
    let mut s = settings(&[("seats", &shop.seats), ("payments", &gate.url)]);
    s.policy.sweep_interval = Duration::from_millis(100);
    let mut app = spawn_app(pool, s).await;
    let r = reserve(&mut app.client, "A1").await;
    let first = charge_for(&shop.payments, "card-1", &r.id, 4_200).await;
    let c = app
        .client
        .confirm(Decide::on(&r).confirm_with(&first))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&c), State::Confirmed);

    // A second payment for the same reservation: refunded, in full, never dropped.
    let second = charge_for(&shop.payments, "card-1", &r.id, 1_500).await;
    let err = app
        .client
        .confirm(Decide::on(&r).confirm_with(&second))
        .await
        .expect_err("already confirmed with another payment");
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert_eq!(reason(&err), "RESERVATION_CLOSED");
    let refund = refund_detail(&err).expect("the refund in the details");
    assert_eq!(refund.state, i32::from(proto::refund::State::Refunded));
    assert_eq!(
        (refund.amount_minor, refund.currency.as_str()),
        (1_500, "EUR")
    );
    let record = payment_record(&shop.payments, &second.payment_ref).await;
    assert_eq!(record.refunded_minor, 1_500);
    let ids: Vec<&str> = record
        .refunds
        .iter()
        .map(|f| f.refund_id.as_str())
        .collect();
    assert_eq!(ids, [refund.refund_id.as_str()]);
    // The reservation keeps its payment, which is not refunded.
    let now = read(&mut app.client, &r).await;
    assert_eq!((state_of(&now), now.refund), (State::Confirmed, None));
    assert_eq!(
        payment_record(&shop.payments, &first.payment_ref)
            .await
            .refunded_minor,
        0
    );
    assert_eq!(resource(&shop.seats, "A1").await.confirmed, 1);

    // Repeats: the same refund, no second one; the first payment still answers the reservation.
    let again = app
        .client
        .confirm(Decide::on(&r).confirm_with(&second))
        .await
        .expect_err("a repeat");
    assert_eq!(refund_detail(&again).unwrap().refund_id, refund.refund_id);
    assert_eq!(
        payment_record(&shop.payments, &second.payment_ref)
            .await
            .refunds
            .len(),
        1
    );
    let same = app
        .client
        .confirm(Decide::on(&r).confirm_with(&first))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&same), State::Confirmed);

    // A third payment while the payment service does not take refunds: recorded, answered
    // PENDING, and sent by recovery once it does.
    let third = charge_for(&shop.payments, "card-1", &r.id, 700).await;
    gate.refunds_fail.store(true, Ordering::SeqCst);
    let err = app
        .client
        .confirm(Decide::on(&r).confirm_with(&third))
        .await
        .expect_err("already confirmed with another payment");
    assert_eq!(reason(&err), "RESERVATION_CLOSED");
    let pending = refund_detail(&err).unwrap();
    assert_eq!(pending.state, i32::from(proto::refund::State::Pending));
    assert_eq!(
        payment_record(&shop.payments, &third.payment_ref)
            .await
            .refunded_minor,
        0
    );
    gate.refunds_fail.store(false, Ordering::SeqCst);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let record = payment_record(&shop.payments, &third.payment_ref).await;
        if record.refunded_minor == 700 {
            assert_eq!(record.refunds.len(), 1);
            assert_eq!(record.refunds[0].refund_id, pending.refund_id);
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "refund never sent");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[sqlx::test(migrations = false)]
async fn an_unreachable_payments_service_changes_nothing(pool: PgPool) {
    let shop = shop(&pool).await;
    let network = Relay::start(&shop.payments).await;
    let mut app = coordinator(pool, &shop, &network.url).await;
    let a = reserve(&mut app.client, "A1").await;
    let b = reserve(&mut app.client, "B1").await;
    let for_a = charge_for(&shop.payments, "card-1", &a.id, 4_200).await;
    let for_b = charge_for(&shop.payments, "card-1", &b.id, 4_200).await;
    let c = app
        .client
        .confirm(Decide::on(&a).confirm_with(&for_a))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&c), State::Confirmed);

    network.cut().await;
    // The payment cannot be checked: nothing is decided.
    let err = app
        .client
        .confirm(Decide::on(&b).confirm_with(&for_b))
        .await
        .expect_err("the payment cannot be checked");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert_eq!(error_metadata(&err)["reservation_id"], b.id);
    assert_unchanged(&mut app.client, &shop, &b, "B1", &for_b.payment_ref).await;
    // A repeat of an applied Confirm needs no check: it answers the reservation.
    let same = app
        .client
        .confirm(Decide::on(&a).confirm_with(&for_a))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&same), State::Confirmed);

    network.restore().await;
    let c = app
        .client
        .confirm(Decide::on(&b).confirm_with(&for_b))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&c), State::Confirmed);
}
