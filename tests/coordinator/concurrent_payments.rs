//! Different payments for one reservation at once, against the real seats and payments
//! participants and many real concurrent clients (issue 40, items 7 and 8): one payment is
//! applied, every other one is recorded before its Confirm is answered and refunded exactly
//! once, with no storage error and without any client repeating.

use std::sync::Arc;
use std::time::Duration;

use holdfast::api::error::refund_detail;
use holdfast::participants::Kind;
use holdfast::proto;
use holdfast::proto::reservation::State;
use sqlx::PgPool;
use tonic::Code;

use crate::common::*;

/// Payments for one held reservation, each cited at once ...
const PAYMENTS: usize = 24;
/// ... by this many concurrent Confirms (a client repeating a call it thinks was lost).
const REPEATS: usize = 3;

/// PostgreSQL's answers reach the coordinator this late (a database in another zone), so the
/// transactions of concurrent decisions and refunds overlap as they do under load.
const DATABASE_LATENCY: Duration = Duration::from_millis(2);

struct Shop {
    seats: String,
    payments: String,
}

async fn shop(pool: &PgPool) -> Shop {
    let shop = Shop {
        seats: spawn_participant(Kind::Seats, pool).await,
        payments: spawn_participant(Kind::Payments, pool).await,
    };
    put_resources(&shop.seats, &[("A1", 1)]).await;
    put_resources(&shop.payments, &[("card-1", 10_000_000)]).await;
    shop
}

/// A Confirm of `r` citing each of `payments`, from a client of its own, all at once; the
/// answers in the same order.
async fn confirm_all_at_once(
    app: &TestApp,
    r: &proto::Reservation,
    payments: &[proto::Payment],
) -> Vec<Result<proto::Reservation, tonic::Status>> {
    let start = Arc::new(tokio::sync::Barrier::new(payments.len()));
    let calls: Vec<_> = payments
        .iter()
        .map(|payment| {
            let (addr, decide, payment) = (app.addr, Decide::on(r), payment.clone());
            let start = start.clone();
            tokio::spawn(async move {
                let mut client =
                    proto::coordinator_client::CoordinatorClient::connect(format!("http://{addr}"))
                        .await
                        .unwrap();
                start.wait().await;
                client
                    .confirm(decide.confirm_with(&payment))
                    .await
                    .map(tonic::Response::into_inner)
            })
        })
        .collect();
    let mut answers = Vec::with_capacity(calls.len());
    for call in calls {
        answers.push(call.await.expect("a client's task"));
    }
    answers
}

/// Waits (at most 20 s) until every payment but `applied` is refunded in full exactly once at
/// the payments participant and `applied` is not refunded at all.
async fn refunded_once_but(shop: &Shop, payments: &[proto::Payment], applied: Option<usize>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let mut wrong = Vec::new();
        for (i, p) in payments.iter().enumerate() {
            let record = payment_record(&shop.payments, &p.payment_ref).await;
            let want = if Some(i) == applied {
                (0, 0)
            } else {
                (p.amount_minor, 1)
            };
            if (record.refunded_minor, record.refunds.len()) != want {
                wrong.push((i, record.refunded_minor, record.refunds.len(), want));
            }
        }
        if wrong.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "payments not refunded exactly once (index, refunded, refunds, wanted): {wrong:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

crate::parallel::parallel_test!(concurrent_confirms_with_different_payments_apply_one_and_refund_the_rest => concurrent_confirms_with_different_payments);

async fn concurrent_confirms_with_different_payments(pool: PgPool) {
    let shop = shop(&pool).await;
    let distant = pool_at_distance(&pool.connect_options(), 32, DATABASE_LATENCY).await;
    let app = spawn_app(
        distant,
        settings(&[("seats", &shop.seats), ("payments", &shop.payments)]),
    )
    .await;
    let r = app
        .client
        .clone()
        .reserve(reserve_request("order-1", vec![hold("seats", "A1")]))
        .await
        .unwrap()
        .into_inner();
    let mut payments = Vec::with_capacity(PAYMENTS);
    for i in 0..PAYMENTS {
        payments.push(charge_for(&shop.payments, "card-1", &r.id, 1_000 + i as i64).await);
    }
    let cited: Vec<_> = (0..PAYMENTS * REPEATS)
        .map(|call| payments[call % PAYMENTS].clone())
        .collect();

    let answers = confirm_all_at_once(&app, &r, &cited).await;
    let mut applied = Vec::new();
    let mut wrong = Vec::new();
    for (call, answer) in answers.iter().enumerate() {
        let i = call % PAYMENTS;
        match answer {
            Ok(c) if matches!(state_of(c), State::Confirmed | State::Confirming) => {
                if !applied.contains(&i) {
                    applied.push(i);
                }
            }
            Err(e) if e.code() == Code::FailedPrecondition && reason(e) == "RESERVATION_CLOSED" => {
                let refund = refund_detail(e).expect("the refund in the details");
                assert_eq!(refund.amount_minor, payments[i].amount_minor, "{e:?}");
            }
            Ok(c) => wrong.push(format!("call {call}: {:?}", state_of(c))),
            Err(e) => wrong.push(format!(
                "call {call}: {:?} {} {}",
                e.code(),
                reason(e),
                e.message()
            )),
        }
    }
    assert!(
        wrong.is_empty(),
        "every Confirm is applied or refused with its refund: {wrong:#?}"
    );
    assert_eq!(applied.len(), 1, "exactly one payment applied: {applied:?}");
    refunded_once_but(&shop, &payments, applied.first().copied()).await;
    assert_eq!(resource(&shop.seats, "A1").await.confirmed, 1);
}
