//! `payments`: authorise / capture / void, and Charge / Refund / GetPayment, on PostgreSQL and
//! on SQLite (the embedded default's backend).

use holdfast::participants::Kind;
use holdfast::proto::branch::State;
use holdfast::proto::try_response::Outcome;
use holdfast::proto::{ChargeRequest, GetPaymentRequest, RefundRequest, refund};
use sqlx::PgPool;

use crate::common::*;

crate::parallel::parallel_test!(storm_authorises_no_more_than_the_balance => storm_authorises_no_more_than_the_balance_on);
async fn storm_authorises_no_more_than_the_balance_on(pool: PgPool) {
    for db in Db::both(&pool).await {
        let mut p = spawn_on(Kind::Payments, &db).await;
        p.put("acct-1", 1000).await;
        let requests: Vec<_> = (0..100)
            .map(|_| try_request(vec![hold("acct-1", 100, None)]))
            .collect();
        let (answers, checks) = storm(&p, requests, admin_checker(&p, "acct-1", 1000)).await;
        assert!(checks >= 1);
        assert_eq!(count(&answers, Outcome::Held), 10);
        assert_eq!(counts(&mut p, "acct-1").await, (0, 1000, 0));
        p.stop().await;
    }
}

#[sqlx::test(migrations = false)]
async fn authorise_capture_and_void_move_the_balance(pool: PgPool) {
    for db in Db::both(&pool).await {
        let mut p = spawn_on(Kind::Payments, &db).await;
        p.put("acct-1", 1000).await;
        let first = try_request(vec![hold("acct-1", 300, None)]);
        assert_eq!(outcome(&p.try_(first.clone()).await), Outcome::Held);
        assert_eq!(counts(&mut p, "acct-1").await, (700, 300, 0));
        assert_eq!(p.confirm(&first).await, State::Confirmed);
        assert_eq!(counts(&mut p, "acct-1").await, (700, 0, 300));

        let second = try_request(vec![hold("acct-1", 200, None)]);
        assert_eq!(outcome(&p.try_(second.clone()).await), Outcome::Held);
        assert_eq!(counts(&mut p, "acct-1").await, (500, 200, 300));
        assert_eq!(p.cancel(&second).await, State::Cancelled);
        assert_eq!(counts(&mut p, "acct-1").await, (700, 0, 300));

        let too_much = try_request(vec![hold("acct-1", 701, None)]);
        let answer = p.try_(too_much).await;
        assert_eq!(outcome(&answer), Outcome::Rejected);
        assert!(
            answer.reason.contains("insufficient funds"),
            "{}",
            answer.reason
        );
        assert_eq!(counts(&mut p, "acct-1").await, (700, 0, 300));
        p.stop().await;
    }
}

fn refund_request(
    refund_id: &str,
    payment_ref: &str,
    amount_minor: i64,
    currency: &str,
) -> RefundRequest {
    RefundRequest {
        refund_id: refund_id.to_owned(),
        reservation_id: "r-1".to_owned(),
        payment_ref: payment_ref.to_owned(),
        amount_minor,
        currency: currency.to_owned(),
        reason: "late payment".to_owned(),
    }
}

#[sqlx::test(migrations = false)]
async fn refunds_move_money_once_and_never_above_the_capture(pool: PgPool) {
    for db in Db::both(&pool).await {
        let mut p = spawn_on(Kind::Payments, &db).await;
        p.put("acct-1", 1000).await;
        let payment_ref = p
            .payments
            .charge(ChargeRequest {
                account: "acct-1".into(),
                amount_minor: 400,
                currency: "EUR".into(),
                reservation_id: "r-1".into(),
            })
            .await
            .expect("charge")
            .into_inner()
            .payment_ref;
        assert_eq!(counts(&mut p, "acct-1").await, (600, 0, 400));

        // The same refund_id, concurrently and repeatedly: money moves once.
        let mut calls = Vec::new();
        for _ in 0..5 {
            let mut client = p.payments.clone();
            let req = refund_request("rf-1", &payment_ref, 150, "EUR");
            calls.push(tokio::spawn(async move { client.refund(req).await }));
        }
        for call in calls {
            let state = call
                .await
                .expect("join")
                .expect("refund")
                .into_inner()
                .state;
            assert_eq!(state, refund::State::Refunded as i32);
        }
        assert_eq!(counts(&mut p, "acct-1").await, (750, 0, 250));

        // 150 + 300 > 400 captured: refused, nothing moves.
        let err = p
            .payments
            .refund(refund_request("rf-2", &payment_ref, 300, "EUR"))
            .await
            .expect_err("over-refund");
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        let err = p
            .payments
            .refund(refund_request("rf-3", &payment_ref, 10, "USD"))
            .await
            .expect_err("currency mismatch");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().starts_with("currency"), "{}", err.message());
        assert_eq!(counts(&mut p, "acct-1").await, (750, 0, 250));

        // The rest of the capture can be refunded.
        p.payments
            .refund(refund_request("rf-4", &payment_ref, 250, "EUR"))
            .await
            .expect("refund rest");
        let record = p
            .payments
            .get_payment(GetPaymentRequest {
                payment_ref: payment_ref.clone(),
            })
            .await
            .expect("get payment")
            .into_inner();
        assert_eq!(record.amount_minor, 400);
        assert_eq!(record.refunded_minor, 400);
        assert_eq!(record.currency, "EUR");
        assert_eq!(
            record.reservation_id, "r-1",
            "the payment keeps its reservation"
        );
        let ids: Vec<_> = record
            .refunds
            .iter()
            .map(|r| r.refund_id.as_str())
            .collect();
        assert_eq!(ids, vec!["rf-1", "rf-4"]);
        assert_eq!(counts(&mut p, "acct-1").await, (1000, 0, 0));

        let err = p
            .payments
            .refund(refund_request("rf-5", "pay_unknown", 1, "EUR"))
            .await
            .expect_err("unknown payment");
        assert_eq!(err.code(), tonic::Code::NotFound);
        p.stop().await;
    }
}

#[sqlx::test(migrations = false)]
async fn a_charge_is_bound_to_the_reservation_it_names(pool: PgPool) {
    for db in Db::both(&pool).await {
        let mut p = spawn_on(Kind::Payments, &db).await;
        p.put("acct-1", 1000).await;
        let err = p
            .payments
            .charge(ChargeRequest {
                account: "acct-1".into(),
                amount_minor: 400,
                currency: "EUR".into(),
                reservation_id: String::new(),
            })
            .await
            .expect_err("a charge names its reservation");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(
            err.message().starts_with("reservation_id"),
            "{}",
            err.message()
        );
        assert_eq!(
            counts(&mut p, "acct-1").await,
            (1000, 0, 0),
            "nothing debited"
        );
        let payment_ref = p
            .payments
            .charge(ChargeRequest {
                account: "acct-1".into(),
                amount_minor: 400,
                currency: "EUR".into(),
                reservation_id: "0190a0b0-0000-7000-8000-000000000001".into(),
            })
            .await
            .expect("charge")
            .into_inner()
            .payment_ref;
        let record = p
            .payments
            .get_payment(GetPaymentRequest { payment_ref })
            .await
            .expect("get payment")
            .into_inner();
        assert_eq!(
            record.reservation_id,
            "0190a0b0-0000-7000-8000-000000000001"
        );
        assert_eq!(
            (record.amount_minor, record.currency.as_str()),
            (400, "EUR")
        );
        p.stop().await;
    }
}
