//! The global hold cap end to end (SPEC 3.2, `--max-active-holds-total`): many holders racing
//! get exactly the cap, the rest `HOLD_LIMIT_EXCEEDED` with `scope` = `total` and nothing
//! placed; a release frees a slot.

use holdfast::proto;
use sqlx::PgPool;
use tonic::Code;

use crate::common::*;

#[sqlx::test(migrations = false)]
async fn the_global_cap_admits_exactly_its_number_across_holders(pool: PgPool) {
    let fakes = spawn_fakes(&["seats"]).await;
    let mut s = settings(&[("seats", &fakes.get("seats").url)]);
    s.policy.hold_limits.total = 3;
    let app = spawn_app(pool, s).await;
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(12));
    let tasks: Vec<_> = (0..12)
        .map(|i| {
            let (addr, barrier) = (app.addr, barrier.clone());
            tokio::spawn(async move {
                let mut client =
                    proto::coordinator_client::CoordinatorClient::connect(format!("http://{addr}"))
                        .await
                        .unwrap();
                let req = proto::ReserveRequest {
                    holder: format!("holder-{i}"),
                    ..reserve_request("r", vec![hold("seats", &format!("A{i}"))])
                };
                barrier.wait().await;
                client.reserve(req).await
            })
        })
        .collect();
    let mut won = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok(r) => won.push(r.into_inner()),
            Err(e) => {
                assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
                assert_eq!(reason(&e), "HOLD_LIMIT_EXCEEDED");
                let meta = error_metadata(&e);
                assert_eq!(
                    (meta["scope"].as_str(), meta["limit"].as_str()),
                    ("total", "3")
                );
            }
        }
    }
    assert_eq!(won.len(), 3, "exactly the global cap");
    assert_eq!(
        fakes.get("seats").held().len(),
        3,
        "refused Reserves placed nothing"
    );
    // A release frees a slot for anyone.
    let mut client = app.client.clone();
    client.cancel(Decide::on(&won[0]).cancel()).await.unwrap();
    let next = client
        .reserve(proto::ReserveRequest {
            holder: "latecomer".into(),
            ..reserve_request("r", vec![hold("seats", "B1")])
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&next), proto::reservation::State::Held);
}
