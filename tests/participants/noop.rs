//! `noop`: holds anything, writes only its barrier.

use holdfast::participants::Kind;
use holdfast::proto::try_response::Outcome;
use sqlx::PgPool;

use crate::common::*;

crate::parallel::parallel_test!(storm_holds_every_branch_once => storm_holds_every_branch_once_on);
async fn storm_holds_every_branch_once_on(pool: PgPool) {
    for db in Db::both(&pool).await {
        let mut p = spawn_on(Kind::Noop, &db).await;
        let requests: Vec<_> = (0..100)
            .map(|_| try_request(vec![hold("x", 1, None)]))
            .collect();
        let admin = p.admin.clone();
        let check = move || {
            let mut admin = admin.clone();
            async move {
                let s = admin
                    .get_resource(holdfast::proto::GetResourceRequest {
                        resource: "x".into(),
                    })
                    .await
                    .map_err(|e| e.to_string())?
                    .into_inner();
                if s.capacity != s.available + s.held + s.confirmed || s.held > 100 {
                    return Err(format!("bad counts {s:?}"));
                }
                Ok(())
            }
        };
        let (answers, checks) = storm(&p, requests.clone(), check).await;
        assert!(checks >= 1);
        assert_eq!(count(&answers, Outcome::Held), 100);
        assert_eq!(counts(&mut p, "x").await, (0, 100, 0));
        // Repeats change nothing.
        assert_eq!(outcome(&p.try_(requests[0].clone()).await), Outcome::Held);
        assert_eq!(counts(&mut p, "x").await, (0, 100, 0));
        p.stop().await;
    }
}

#[sqlx::test(migrations = false)]
async fn health_reports_the_participant_services(pool: PgPool) {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;

    let p = spawn_participant(Kind::Payments, pool.clone()).await;
    let channel = tonic::transport::Channel::from_shared(p.url.clone())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let mut health = HealthClient::new(channel);
    for service in [
        "tcc.v1.Participant",
        "tcc.v1.ResourceAdmin",
        "tcc.v1.Payments",
    ] {
        let status = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect(service)
            .into_inner()
            .status;
        assert_eq!(status, 1, "{service} SERVING");
    }
    p.stop().await;
}
