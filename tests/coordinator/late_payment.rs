//! Payments that land after the hold expired, against the real seats and payments
//! participants: honoured when the seat can still be had, otherwise refunded exactly once,
//! whatever is repeated and whoever crashes.

use std::time::Duration;

use holdfast::api::error::refund_detail;
use holdfast::app::CoordinatorSettings;
use holdfast::domain::LatePaymentPolicy;
use holdfast::participants::Kind;
use holdfast::proto;
use holdfast::proto::payments_client::PaymentsClient;
use holdfast::proto::reservation::State;
use sqlx::PgPool;
use tonic::Code;

use crate::common::*;

async fn shop(pool: &PgPool) -> Shop {
    Shop::open(pool, 100_000).await
}

fn settings_for(shop: &Shop, payments_url: &str) -> CoordinatorSettings {
    let mut s = settings(&[("seats", &shop.seats), ("payments", payments_url)]);
    s.policy.sweep_interval = Duration::from_millis(100);
    s
}

/// A payment of 4 200 for reservation `r` (bound to it, SPEC 7.3).
async fn charge(shop: &Shop, r: &proto::Reservation) -> proto::Payment {
    charge_for(&shop.payments, "card-1", &r.id, 4_200).await
}

async fn refunded(shop: &Shop, payment_ref: &str) -> (i64, usize) {
    let p = PaymentsClient::connect(shop.payments.clone())
        .await
        .unwrap()
        .get_payment(proto::GetPaymentRequest {
            payment_ref: payment_ref.into(),
        })
        .await
        .unwrap()
        .into_inner();
    (p.refunded_minor, p.refunds.len())
}

/// Reserves seat A1 for one second and waits until the reaper released it.
async fn reserve_and_let_lapse(
    client: &mut proto::coordinator_client::CoordinatorClient<tonic::transport::Channel>,
    shop: &Shop,
    holder: &str,
) -> proto::Reservation {
    let mut req = reserve_request(&format!("{holder}-order"), vec![hold("seats", "A1")]);
    req.holder = holder.into();
    req.ttl = Some(prost_types::Duration {
        seconds: 1,
        nanos: 0,
    });
    let r = client.reserve(req).await.unwrap().into_inner();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while resource(&shop.seats, "A1").await.available != 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "hold never released"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    r
}

/// Reserves seat A1 for one second and waits until it reads EXPIRED (lazily: the callers run
/// no reaper, so the coordinator has released nothing yet).
async fn reserve_until_expired(
    client: &mut proto::coordinator_client::CoordinatorClient<tonic::transport::Channel>,
) -> proto::Reservation {
    let mut req = reserve_request("r1", vec![hold("seats", "A1")]);
    req.ttl = Some(prost_types::Duration {
        seconds: 1,
        nanos: 0,
    });
    let r = client.reserve(req).await.unwrap().into_inner();
    let get = proto::GetReservationRequest {
        reservation_id: r.id.clone(),
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let now = client
            .get_reservation(get.clone())
            .await
            .unwrap()
            .into_inner();
        if state_of(&now) == State::Expired {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never EXPIRED: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    r
}

#[sqlx::test(migrations = false)]
async fn a_late_payment_is_honoured_when_the_seat_is_still_free(pool: PgPool) {
    let shop = shop(&pool).await;
    let mut app = spawn_app(pool, settings_for(&shop, &shop.payments)).await;
    let r = reserve_and_let_lapse(&mut app.client, &shop, "alice").await;
    let payment = charge(&shop, &r).await;

    let c = app
        .client
        .confirm(Decide::on(&r).confirm_with(&payment))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&c), State::Confirmed);
    assert!(c.late_payment_honored);
    assert!(c.refund.is_none());
    let seat = resource(&shop.seats, "A1").await;
    assert_eq!((seat.confirmed, seat.held, seat.available), (1, 0, 0));
    assert_eq!(refunded(&shop, &payment.payment_ref).await, (0, 0));
    // A repeat changes nothing.
    let again = app
        .client
        .confirm(Decide::on(&r).confirm_with(&payment))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&again), State::Confirmed);
}

#[sqlx::test(migrations = false)]
async fn a_payment_just_after_expiry_confirms_the_holds_as_they_are(pool: PgPool) {
    let shop = shop(&pool).await;
    let mut s = settings_for(&shop, &shop.payments);
    // No reaper in this test: the holds are still in place when the payment lands.
    s.policy.sweep_interval = Duration::from_secs(3600);
    let mut app = spawn_app(pool, s).await;
    let r = reserve_until_expired(&mut app.client).await;
    assert_eq!(resource(&shop.seats, "A1").await.held, 1, "still held");
    let payment = charge(&shop, &r).await;
    let c = app
        .client
        .confirm(Decide::on(&r).confirm_with(&payment))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&c), State::Confirmed);
    assert!(c.late_payment_honored);
    let seat = resource(&shop.seats, "A1").await;
    assert_eq!((seat.confirmed, seat.held), (1, 0));
}

#[sqlx::test(migrations = false)]
async fn a_late_payment_for_a_taken_seat_is_refunded_exactly_once(pool: PgPool) {
    let shop = shop(&pool).await;
    let mut app = spawn_app(pool, settings_for(&shop, &shop.payments)).await;
    let r = reserve_and_let_lapse(&mut app.client, &shop, "alice").await;
    // Bob takes the seat meanwhile.
    let mut bob = reserve_request("bob-order", vec![hold("seats", "A1")]);
    bob.holder = "bob".into();
    app.client.reserve(bob).await.unwrap();
    let payment = charge(&shop, &r).await;

    let err = app
        .client
        .confirm(Decide::on(&r).confirm_with(&payment))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert_eq!(reason(&err), "HOLD_EXPIRED");
    let refund = refund_detail(&err).expect("the refund is in the details");
    assert_eq!(refund.state, i32::from(proto::refund::State::Refunded));
    assert_eq!(
        (refund.amount_minor, refund.currency.as_str()),
        (4_200, "EUR")
    );
    assert_eq!(error_metadata(&err)["refund_id"], refund.refund_id);

    // Repeats answer the same refund and move no more money.
    for _ in 0..3 {
        let again = app
            .client
            .confirm(Decide::on(&r).confirm_with(&payment))
            .await
            .unwrap_err();
        assert_eq!(reason(&again), "HOLD_EXPIRED");
        assert_eq!(refund_detail(&again).unwrap().refund_id, refund.refund_id);
    }
    assert_eq!(refunded(&shop, &payment.payment_ref).await, (4_200, 1));
    let seat = resource(&shop.seats, "A1").await;
    assert_eq!(
        (seat.held, seat.confirmed),
        (1, 0),
        "bob's hold is untouched"
    );
    let got = app
        .client
        .get_reservation(proto::GetReservationRequest {
            reservation_id: r.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&got), State::Expired);
    assert_eq!(got.refund.unwrap().refund_id, refund.refund_id);
}

#[sqlx::test(migrations = false)]
async fn a_refund_survives_a_coordinator_crash_before_the_payment_service_heard(pool: PgPool) {
    let shop = shop(&pool).await;
    // The payment is checked through the gate (SPEC 7.3); only its refund is held back.
    let gate = spawn_payments_gate(&shop.payments).await;
    let s = settings_for(&shop, &gate.url);
    let mut first = spawn_killable(&pool, s.clone()).await;
    let mut client = first.client().await;
    let r = reserve_and_let_lapse(&mut client, &shop, "alice").await;
    let mut bob = reserve_request("bob-order", vec![hold("seats", "A1")]);
    bob.holder = "bob".into();
    client.reserve(bob).await.unwrap();
    let payment = charge(&shop, &r).await;

    // The payment service does not take the refund: it is recorded, not yet acknowledged.
    gate.refunds_fail
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let err = client
        .confirm(Decide::on(&r).confirm_with(&payment))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "HOLD_EXPIRED");
    let refund = refund_detail(&err).unwrap();
    assert_eq!(refund.state, i32::from(proto::refund::State::Pending));
    first.kill();
    assert_eq!(refunded(&shop, &payment.payment_ref).await, (0, 0));

    gate.refunds_fail
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let second = spawn_killable(&pool, s).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while refunded(&shop, &payment.payment_ref).await != (4_200, 1) {
        assert!(tokio::time::Instant::now() < deadline, "refund never sent");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut client = second.client().await;
    // The payment service answered; the coordinator records that answer just after it, so
    // wait for the record before asking again (a repeat in between rightly reads PENDING).
    let refunded_state = i32::from(proto::refund::State::Refunded);
    loop {
        let got = client
            .get_reservation(proto::GetReservationRequest {
                reservation_id: r.id.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        if got.refund.as_ref().map(|f| f.state) == Some(refunded_state) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "refund acknowledgement never recorded"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let again = client
        .confirm(Decide::on(&r).confirm_with(&payment))
        .await
        .unwrap_err();
    let same = refund_detail(&again).unwrap();
    assert_eq!(same.refund_id, refund.refund_id, "never a second refund");
    assert_eq!(same.state, i32::from(proto::refund::State::Refunded));
    assert_eq!(refunded(&shop, &payment.payment_ref).await, (4_200, 1));
}

#[sqlx::test(migrations = false)]
async fn the_refund_policy_always_refunds_and_closed_reservations_refund_too(pool: PgPool) {
    let shop = shop(&pool).await;
    let mut s = settings_for(&shop, &shop.payments);
    s.policy.late_payment = LatePaymentPolicy::Refund;
    let mut app = spawn_app(pool, s).await;
    let r = reserve_and_let_lapse(&mut app.client, &shop, "alice").await;
    let payment = charge(&shop, &r).await;
    let err = app
        .client
        .confirm(Decide::on(&r).confirm_with(&payment))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "HOLD_EXPIRED");
    assert!(refund_detail(&err).is_some());
    assert_eq!(
        resource(&shop.seats, "A1").await.available,
        1,
        "seat free, still refunded"
    );
    assert_eq!(refunded(&shop, &payment.payment_ref).await, (4_200, 1));

    // A payment for a reservation the holder cancelled is refunded too.
    let mut req = reserve_request("second", vec![hold("seats", "A1")]);
    req.holder = "carol".into();
    let r2 = app.client.reserve(req).await.unwrap().into_inner();
    app.client.cancel(Decide::on(&r2).cancel()).await.unwrap();
    let payment2 = charge(&shop, &r2).await;
    let err = app
        .client
        .confirm(Decide::on(&r2).confirm_with(&payment2))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "RESERVATION_CLOSED");
    assert!(refund_detail(&err).is_some());
    assert_eq!(refunded(&shop, &payment2.payment_ref).await, (4_200, 1));
}

#[sqlx::test(migrations = false)]
async fn a_hold_lost_at_confirm_fails_the_reservation_and_refunds_the_payment(pool: PgPool) {
    // A seats participant that reclaims lapsed holds at once (orphan grace 0).
    let seats = spawn_participant_with(
        holdfast::participants::ParticipantSettings {
            orphan_grace: Duration::ZERO,
            ..holdfast::participants::ParticipantSettings::new(Kind::Seats)
        },
        &pool,
    )
    .await;
    let shop = Shop {
        seats,
        payments: spawn_participant(Kind::Payments, &pool).await,
    };
    put_resources(&shop.seats, &[("A1", 1)]).await;
    put_resources(&shop.payments, &[("card-1", 100_000)]).await;
    let mut s = settings_for(&shop, &shop.payments);
    s.policy.sweep_interval = Duration::from_secs(3600); // the coordinator never reaps here
    let mut app = spawn_app(pool, s).await;

    let r = reserve_until_expired(&mut app.client).await;
    // Bob's Try makes the participant reclaim alice's orphaned hold.
    let mut bob = reserve_request("bob-order", vec![hold("seats", "A1")]);
    bob.holder = "bob".into();
    app.client.reserve(bob).await.unwrap();

    let payment = charge(&shop, &r).await;
    let c = app
        .client
        .confirm(Decide::on(&r).confirm_with(&payment))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&c), State::Failed);
    assert_eq!(
        c.branches[0].state,
        i32::from(proto::branch::State::HoldLost)
    );
    let refund = c.refund.expect("the payment is refunded");
    assert_eq!(refund.state, i32::from(proto::refund::State::Refunded));
    assert_eq!(refunded(&shop, &payment.payment_ref).await, (4_200, 1));
    let seat = resource(&shop.seats, "A1").await;
    assert_eq!((seat.held, seat.confirmed), (1, 0), "never sold twice");

    // Another, different payment cited on the FAILED reservation: closed, refunded in full.
    let second = charge(&shop, &r).await;
    let err = app
        .client
        .confirm(Decide::on(&r).confirm_with(&second))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "RESERVATION_CLOSED");
    assert!(refund_detail(&err).is_some(), "{err:?}");
    assert_eq!(refunded(&shop, &second.payment_ref).await, (4_200, 1));
    assert_eq!(
        refunded(&shop, &payment.payment_ref).await,
        (4_200, 1),
        "the first one once"
    );
}

/// A payment for a reservation that was REJECTED (its seat taken): the holder learns the
/// reservation (and its token) by repeating its Reserve, confirms with the payment, and gets
/// `RESERVATION_CLOSED` with the payment refunded in full; nothing is sold.
#[sqlx::test(migrations = false)]
async fn a_paid_confirm_on_a_rejected_reservation_is_refunded(pool: PgPool) {
    let shop = shop(&pool).await;
    let mut app = spawn_app(pool, settings_for(&shop, &shop.payments)).await;
    let mut alice = reserve_request("alice-order", vec![hold("seats", "A1")]);
    alice.holder = "alice".into();
    app.client.reserve(alice).await.unwrap();
    let mut bob = reserve_request("bob-order", vec![hold("seats", "A1")]);
    bob.holder = "bob".into();
    let refused = app.client.reserve(bob.clone()).await.unwrap_err();
    assert_eq!(reason(&refused), "INSUFFICIENT_CAPACITY");
    let r = app.client.reserve(bob).await.unwrap().into_inner();
    assert_eq!(state_of(&r), State::Rejected);
    assert!(!r.hold_token.is_empty(), "a repeat answers the token");
    let payment = charge(&shop, &r).await;
    let err = app
        .client
        .confirm(Decide::on(&r).confirm_with(&payment))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "RESERVATION_CLOSED");
    let refund = refund_detail(&err).expect("the refund in the details");
    assert_eq!(refund.amount_minor, 4_200);
    assert_eq!(refunded(&shop, &payment.payment_ref).await, (4_200, 1));
    let seat = resource(&shop.seats, "A1").await;
    assert_eq!(
        (seat.held, seat.confirmed),
        (1, 0),
        "alice's hold only, nothing sold"
    );
}

#[sqlx::test(migrations = false)]
async fn a_coordinator_dying_while_honouring_a_late_payment_leaves_it_refunded(pool: PgPool) {
    // Seats is a fake here (so its Try can hang); payments is the real participant.
    let log = CallLog::default();
    let seats = spawn_fake("seats", log.clone()).await;
    let payments = spawn_participant(Kind::Payments, &pool).await;
    put_resources(&payments, &[("card-1", 100_000)]).await;
    let mut s = settings(&[("seats", &seats.url), ("payments", &payments)]);
    s.policy.sweep_interval = Duration::from_millis(100);
    s.policy.lease = Duration::from_secs(2);
    let mut first = spawn_killable(&pool, s.clone()).await;
    let mut client = first.client().await;

    let mut req = reserve_request("r1", vec![hold("seats", "A1")]);
    req.ttl = Some(prost_types::Duration {
        seconds: 1,
        nanos: 0,
    });
    let r = client.reserve(req).await.unwrap().into_inner();
    let state = |pool: PgPool, id: String| async move {
        sqlx::query_as::<_, (String, Option<String>)>(
            "SELECT state, refund_state FROM reservations WHERE id = $1::uuid",
        )
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while state(pool.clone(), r.id.clone()).await.0 != "EXPIRED" {
        assert!(tokio::time::Instant::now() < deadline, "never released");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(seats.effects(), (0, 1));

    // The payment lands; placing the seat again hangs; the coordinator dies right there.
    seats
        .behaviour
        .stall_tries
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let payment = charge_for(&payments, "card-1", &r.id, 900).await;
    let payment_ref = payment.payment_ref.clone();
    let pending = tokio::spawn({
        let req = Decide::on(&r).confirm_with(&payment);
        async move { client.confirm(req).await }
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while log.count("seats", "Try") < 2 {
        assert!(tokio::time::Instant::now() < deadline, "retake never tried");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.kill();
    let _ = pending.await;
    seats
        .behaviour
        .stall_tries
        .store(false, std::sync::atomic::Ordering::SeqCst);

    // Another instance releases whatever the retake may have placed and refunds the payment.
    let _second = spawn_killable(&pool, s).await;
    let shop = Shop {
        seats: seats.url.clone(),
        payments: payments.clone(),
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let (st, refund) = state(pool.clone(), r.id.clone()).await;
        if st == "EXPIRED" && refund.as_deref() == Some("REFUNDED") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "left {st} / {refund:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        refunded(&shop, &payment_ref).await,
        (900, 1),
        "refunded exactly once"
    );
    assert!(seats.held().is_empty(), "the re-placed seat is released");
    assert_eq!(
        log.count("seats", "Cancel"),
        2,
        "the first release, then the retake's"
    );
}

/// A retake slower than its lease races recovery: recovery takes the reservation over,
/// refunds the payment and releases the re-placed seat while the retake's Try is still in
/// flight. Whoever's conditional write lands first decides; the other must act on it - never
/// are the same branches both confirmed and cancelled (#15 item 6). Before, the retake
/// confirmed the branches recovery was releasing.
#[sqlx::test(migrations = false)]
async fn a_slow_retake_racing_recovery_never_confirms_what_is_released(pool: PgPool) {
    use std::sync::atomic::Ordering::SeqCst;
    let log = CallLog::default();
    let seats = spawn_fake("seats", log.clone()).await;
    let payments = spawn_participant(Kind::Payments, &pool).await;
    put_resources(&payments, &[("card-1", 100_000)]).await;
    let mut s = settings(&[("seats", &seats.url), ("payments", &payments)]);
    for p in &mut s.participants {
        p.timeout = Duration::from_secs(6);
    }
    s.policy.sweep_interval = Duration::from_millis(100);
    // Shorter than the retake's Try: a lease that does not cover the call chain (what the
    // start-up check refuses) stands for a driver paused past its lease.
    s.policy.lease = Duration::from_secs(1);
    let mut app = spawn_app(pool.clone(), s).await;

    let mut req = reserve_request("r1", vec![hold("seats", "A1")]);
    req.ttl = Some(prost_types::Duration {
        seconds: 1,
        nanos: 0,
    });
    let r = app.client.reserve(req).await.unwrap().into_inner();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while seats.effects() != (0, 1) {
        assert!(tokio::time::Instant::now() < deadline, "never released");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The retake's Try takes 4 s; recovery's release of it hangs at the participant.
    seats.behaviour.try_delay_ms.store(4_000, SeqCst);
    seats.behaviour.stall_cancels.store(true, SeqCst);
    let payment = charge_for(&payments, "card-1", &r.id, 900).await;
    let answer = app
        .client
        .confirm(Decide::on(&r).confirm_with(&payment))
        .await;
    seats.behaviour.stall_cancels.store(false, SeqCst);
    seats.behaviour.try_delay_ms.store(0, SeqCst);
    assert!(
        log.count("seats", "Cancel") >= 2,
        "recovery took the retake over: {:?}",
        log.summary()
    );
    let calls = log.calls();
    for c in calls.iter().filter(|c| c.method == "Confirm") {
        assert!(
            !calls
                .iter()
                .any(|o| o.method == "Cancel" && o.branch_id == c.branch_id),
            "branch {} was both confirmed and cancelled: {:?}",
            c.branch_id,
            log.summary()
        );
    }
    let status = answer.expect_err("the payment is refunded, not honoured");
    assert_eq!(reason(&status), "HOLD_EXPIRED", "{status:?}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (st, refund): (String, Option<String>) =
            sqlx::query_as("SELECT state, refund_state FROM reservations WHERE id = $1::uuid")
                .bind(&r.id)
                .fetch_one(&pool)
                .await
                .unwrap();
        if st == "EXPIRED" && refund.as_deref() == Some("REFUNDED") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "left {st} / {refund:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(seats.effects().0, 0, "nothing confirmed");
}
