//! Many real concurrent clients against one reservation: exactly one decision wins.

use holdfast::proto;
use holdfast::proto::reservation::State;
use sqlx::PgPool;
use tonic::Code;

use crate::common::*;

crate::parallel::parallel_test!(fifty_confirm_and_cancel_races_end_in_exactly_one_outcome => fifty_confirm_and_cancel_races_end_in_exactly_one_outcome_on);
async fn fifty_confirm_and_cancel_races_end_in_exactly_one_outcome_on(pool: PgPool) {
    let (app, fakes) = spawn_with_fakes(pool, &["seats", "stock"]).await;
    for round in 0..3 {
        let r = app
            .client
            .clone()
            .reserve(reserve_request(
                &format!("race-{round}"),
                vec![hold("seats", &format!("A{round}")), hold("stock", "sku-1")],
            ))
            .await
            .unwrap()
            .into_inner();
        let mut tasks = Vec::new();
        // Every client connected before any decides: they start together.
        let start = std::sync::Arc::new(tokio::sync::Barrier::new(50));
        for i in 0..50 {
            // Each task its own connection: real concurrent clients.
            let addr = app.addr;
            let decide = Decide::on(&r);
            let start = start.clone();
            tasks.push(tokio::spawn(async move {
                let mut client =
                    proto::coordinator_client::CoordinatorClient::connect(format!("http://{addr}"))
                        .await
                        .unwrap();
                start.wait().await;
                if i % 2 == 0 {
                    ("confirm", client.confirm(decide.confirm()).await)
                } else {
                    ("cancel", client.cancel(decide.cancel()).await)
                }
            }));
        }
        let mut ok = (0, 0);
        for t in tasks {
            let (kind, result) = t.await.unwrap();
            match result {
                Ok(resp) => {
                    let st = state_of(resp.get_ref());
                    if kind == "confirm" {
                        assert!(matches!(st, State::Confirmed | State::Confirming));
                        ok.0 += 1;
                    } else {
                        assert!(matches!(st, State::Cancelled | State::Cancelling));
                        ok.1 += 1;
                    }
                }
                Err(e) => {
                    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
                    assert_eq!(reason(&e), "RESERVATION_CLOSED");
                }
            }
        }
        assert!(
            (ok.0 == 25 && ok.1 == 0) || (ok.0 == 0 && ok.1 == 25),
            "one side wins entirely, the other is refused: {ok:?}"
        );
        let fin = app
            .client
            .clone()
            .get_reservation(proto::GetReservationRequest {
                reservation_id: r.id.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        let won_confirm = ok.0 == 25;
        assert_eq!(
            state_of(&fin),
            if won_confirm {
                State::Confirmed
            } else {
                State::Cancelled
            }
        );
    }
    // Three rounds: every branch got exactly one second-phase effect overall.
    for name in ["seats", "stock"] {
        let (c, x) = fakes.get(name).effects();
        assert_eq!(c + x, 3, "{name}: confirms {c} + cancels {x}");
        assert_eq!(
            fakes.log.count(name, "Confirm") + fakes.log.count(name, "Cancel"),
            3,
            "{name}: exactly one second-phase call per reservation"
        );
    }
}

crate::parallel::parallel_test!(twenty_concurrent_reserves_by_one_holder_with_limit_five => twenty_concurrent_reserves_by_one_holder_with_limit_five_on);
async fn twenty_concurrent_reserves_by_one_holder_with_limit_five_on(pool: PgPool) {
    let (app, fakes) = spawn_with_fakes(pool, &["seats"]).await;
    let mut tasks = Vec::new();
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(20));
    for i in 0..20 {
        let addr = app.addr;
        let start = start.clone();
        tasks.push(tokio::spawn(async move {
            let mut client =
                proto::coordinator_client::CoordinatorClient::connect(format!("http://{addr}"))
                    .await
                    .unwrap();
            start.wait().await;
            client
                .reserve(reserve_request(
                    &format!("r{i}"),
                    vec![hold("seats", &format!("A{i}"))],
                ))
                .await
        }));
    }
    let mut won = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok(r) => won.push(r.into_inner()),
            Err(e) => {
                assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
                assert_eq!(reason(&e), "HOLD_LIMIT_EXCEEDED");
                assert_eq!(error_metadata(&e)["limit"], "5");
            }
        }
    }
    assert_eq!(won.len(), 5, "exactly the limit succeeds");
    assert_eq!(
        fakes.get("seats").held().len(),
        5,
        "refused ones placed nothing"
    );

    // Releasing one frees a slot; an idempotent repeat of a live one is never refused.
    let mut client = app.client.clone();
    client.cancel(Decide::on(&won[0]).cancel()).await.unwrap();
    let repeat = client
        .reserve(reserve_request(
            &won[1].request_id,
            vec![hold("seats", &won[1].branches[0].resource)],
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(repeat.id, won[1].id);
    client
        .reserve(reserve_request("fresh", vec![hold("seats", "B1")]))
        .await
        .unwrap();
    let err = client
        .reserve(reserve_request("one-too-many", vec![hold("seats", "B2")]))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), "HOLD_LIMIT_EXCEEDED");
}
