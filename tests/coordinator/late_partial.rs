//! A late payment while the release by expiry is half done, across two real participants:
//! seats already released its hold, stock (cut off) still holds its own. The payment is
//! refunded exactly once (`HOLD_EXPIRED` with the refund) rather than racing the release;
//! nothing is confirmed or re-taken, and once stock is back the release finishes (`EXPIRED`).

use std::time::Duration;

use holdfast::api::error::refund_detail;
use holdfast::participants::{self, Kind};
use holdfast::proto;
use sqlx::PgPool;

use crate::common::*;

/// (state, refund_state) of reservation `id`, and its branches' (participant, state).
async fn stored(pool: &PgPool, id: &str) -> (String, Option<String>, Vec<(String, String)>) {
    let (state, refund): (String, Option<String>) =
        sqlx::query_as("SELECT state, refund_state FROM reservations WHERE id = $1::uuid")
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap();
    let branches = sqlx::query_as(
        "SELECT participant, state FROM branches WHERE reservation_id = $1::uuid \
         ORDER BY generation, position",
    )
    .bind(id)
    .fetch_all(pool)
    .await
    .unwrap();
    (state, refund, branches)
}

async fn until_stored(
    pool: &PgPool,
    id: &str,
    what: &str,
    done: impl Fn(&(String, Option<String>, Vec<(String, String)>)) -> bool,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let now = stored(pool, id).await;
        if done(&now) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never {what}; last {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[sqlx::test(migrations = false)]
async fn a_late_payment_during_a_half_done_release_is_refunded_once(pool: PgPool) {
    participants::MIGRATOR.run(&pool).await.unwrap();
    let log = CallLog::default();
    let seats = spawn_participant(Kind::Seats, &pool).await;
    let stock = spawn_participant(Kind::Stock, &pool).await;
    let payments = spawn_participant(Kind::Payments, &pool).await;
    put_resources(&seats, &[("A1", 1)]).await;
    put_resources(&stock, &[("sku", 3)]).await;
    put_resources(&payments, &[("card-1", 100_000)]).await;
    // coordinator -> relay (the network) -> tap (counts what arrived) -> stock.
    let stock_tap = spawn_tap("stock", &stock, log.clone()).await;
    let network = Relay::start(&stock_tap).await;
    let mut s = settings(&[
        ("seats", &spawn_tap("seats", &seats, log.clone()).await),
        ("stock", &network.url),
        ("payments", &payments),
    ]);
    for p in &mut s.participants {
        p.timeout = Duration::from_millis(800);
    }
    s.policy.sweep_interval = Duration::from_millis(100);
    let mut app = spawn_app(pool.clone(), s).await;

    let mut req = reserve_request("r1", vec![hold("seats", "A1"), hold("stock", "sku")]);
    req.holds[1].quantity = 2;
    req.ttl = Some(proto_duration(Duration::from_secs(1)));
    let r = app.client.reserve(req).await.unwrap().into_inner();
    network.cut().await;
    // The reaper releases: seats' Cancel lands, stock's cannot.
    until_stored(&pool, &r.id, "half released", |(state, _, branches)| {
        state == "CANCELLING"
            && branches
                == &[
                    ("seats".to_owned(), "CANCELLED".to_owned()),
                    ("stock".to_owned(), "HELD".to_owned()),
                ]
    })
    .await;
    assert_eq!(resource(&seats, "A1").await.available, 1, "seats released");
    assert_eq!(resource(&stock, "sku").await.held, 2, "stock still holds");

    let payment = charge_for(&payments, "card-1", &r.id, 4_200).await;
    let err = app
        .client
        .confirm(Decide::on(&r).confirm_with(&payment))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "HOLD_EXPIRED", "{err:?}");
    let refund = refund_detail(&err).expect("the refund in the details");
    // The refund does not wait for stock: the payments service is reachable.
    until_stored(&pool, &r.id, "refunded", |(_, refund, _)| {
        refund.as_deref() == Some("REFUNDED")
    })
    .await;

    network.restore().await;
    until_stored(&pool, &r.id, "EXPIRED", |(state, _, _)| state == "EXPIRED").await;
    let record = payment_record(&payments, &payment.payment_ref).await;
    assert_eq!((record.refunded_minor, record.refunds.len()), (4_200, 1));
    assert_eq!(record.refunds[0].refund_id, refund.refund_id);
    let sku = resource(&stock, "sku").await;
    assert_eq!((sku.available, sku.held, sku.confirmed), (3, 0, 0));
    let seat = resource(&seats, "A1").await;
    assert_eq!((seat.available, seat.held, seat.confirmed), (1, 0, 0));
    // Nothing re-taken, nothing confirmed; seats released once. Stock's Cancel arrived (the
    // ones sent while cut never did).
    assert_eq!(log.per_branch("seats", "Try").len(), 1);
    log.assert_once_per_branch("seats", "Cancel", 1);
    assert_eq!(
        log.count("seats", "Confirm") + log.count("stock", "Confirm"),
        0
    );
    assert_eq!(log.per_branch("stock", "Try").len(), 1);
    assert_eq!(log.per_branch("stock", "Cancel").len(), 1);
    let shown = app
        .client
        .get_reservation(proto::GetReservationRequest {
            reservation_id: r.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!shown.late_payment_honored);
}
