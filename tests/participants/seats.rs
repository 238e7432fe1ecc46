//! `seats`: concurrent all-or-nothing claims of seat pairs, and request validation.

use holdfast::participants::Kind;
use holdfast::proto::try_response::Outcome;
use holdfast::proto::{PutResourcesRequest, ResourceSpec};
use sqlx::PgPool;

use crate::common::*;

crate::parallel::parallel_test!(storm_on_a_seat_pair_has_exactly_one_winner => storm_on_a_seat_pair_has_exactly_one_winner_on);
async fn storm_on_a_seat_pair_has_exactly_one_winner_on(pool: PgPool) {
    for db in Db::both(&pool).await {
        let mut p = spawn_on(Kind::Seats, &db).await;
        p.put("A1", 1).await;
        p.put("A2", 1).await;
        // Both seats in every Try, listed in either order: the SDK's sort keeps lock order.
        let requests: Vec<_> = (0..100)
            .map(|i| {
                let mut items = vec![hold("A1", 1, None), hold("A2", 1, None)];
                if i % 2 == 1 {
                    items.reverse();
                }
                try_request(items)
            })
            .collect();
        let (a1, a2) = (admin_checker(&p, "A1", 1), admin_checker(&p, "A2", 1));
        let check = move || {
            let (x, y) = (a1(), a2());
            async move {
                x.await?;
                y.await
            }
        };
        let (answers, checks) = storm(&p, requests, check).await;
        assert!(checks >= 1);
        assert_eq!(count(&answers, Outcome::Held), 1);
        assert_eq!(count(&answers, Outcome::Rejected), 99);
        assert_eq!(counts(&mut p, "A1").await, (0, 1, 0));
        assert_eq!(counts(&mut p, "A2").await, (0, 1, 0));
        let holders = db
            .scalar("SELECT count(DISTINCT branch_id) FROM seat WHERE state = 'held'")
            .await;
        assert_eq!(holders, 1, "both seats belong to the one winner");
        p.stop().await;
    }
}

#[sqlx::test(migrations = false)]
async fn bad_requests_are_invalid_argument_naming_the_field(pool: PgPool) {
    for db in Db::both(&pool).await {
        let mut p = spawn_on(Kind::Seats, &db).await;
        p.put("A1", 1).await;
        let cases = [
            (
                {
                    let mut r = try_request(vec![hold("A1", 1, None)]);
                    r.expires_at = None;
                    r
                },
                "expires_at",
            ),
            (try_request(vec![hold("A1", 0, None)]), "items[0].quantity"),
            (try_request(vec![hold("A1", 2, None)]), "items[0].quantity"),
            (try_request(vec![hold("", 1, None)]), "items[0].resource"),
            (try_request(vec![]), "items"),
            (
                try_request(vec![hold("A1", 1, None), hold("A1", 1, None)]),
                "items[1]",
            ),
            (
                {
                    let mut r = try_request(vec![hold("A1", 1, None)]);
                    r.branch_id = String::new();
                    r
                },
                "branch_id",
            ),
        ];
        for (req, field) in cases {
            let err = p.participant.r#try(req).await.expect_err(field);
            assert_eq!(
                err.code(),
                tonic::Code::InvalidArgument,
                "{field} on {}",
                db.name()
            );
            assert!(
                err.message().starts_with(field),
                "{field}: {}",
                err.message()
            );
        }
        let err = p
            .admin
            .put_resources(PutResourcesRequest {
                resources: vec![ResourceSpec {
                    resource: "B1".into(),
                    capacity: 2,
                }],
            })
            .await
            .expect_err("seat capacity");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("resources[0].capacity"));
        // Nothing changed: the seat is still free.
        assert_eq!(counts(&mut p, "A1").await, (1, 0, 0));
        p.stop().await;
    }
}

#[sqlx::test(migrations = false)]
async fn database_gone_is_unavailable_without_details(pool: PgPool) {
    let mut p = spawn_participant(Kind::Seats, pool.clone()).await;
    p.put("A1", 1).await;
    pool.close().await;
    let req = try_request(vec![hold("A1", 1, None)]);
    let err = p
        .participant
        .r#try(req.clone())
        .await
        .expect_err("no database");
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert!(
        !err.message().to_lowercase().contains("pool"),
        "{}",
        err.message()
    );
    let err = p
        .participant
        .cancel(branch_request(&req))
        .await
        .expect_err("no database");
    assert_eq!(err.code(), tonic::Code::Unavailable);
    p.stop().await;
}

/// A one-seat Try is one statement with its barrier row: it waits for the seat's lock (held
/// here by the test) in the statement that also inserts the row, and both commit together. A
/// refusal names the seat and why; a repeat answers the first answer.
#[sqlx::test(migrations = false)]
async fn a_one_seat_try_is_one_statement_with_its_barrier_row(pool: PgPool) {
    let mut p = spawn_participant(Kind::Seats, pool.clone()).await;
    let mut watcher = pool.acquire().await.unwrap();
    p.put("A1", 1).await;
    let mut busy = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM seat WHERE resource = 'A1' FOR UPDATE")
        .execute(&mut *busy)
        .await
        .unwrap();
    let req = try_request(vec![hold("A1", 1, None)]);
    let mut client = p.new_client().await;
    let waiting_try = tokio::spawn({
        let req = req.clone();
        async move { client.r#try(req).await }
    });
    until_waiting(
        &mut watcher,
        "%UPDATE seat SET state = 'held'%INSERT INTO tcc_barrier%",
        "no Try waited for the seat's lock in one statement with its barrier row",
    )
    .await;
    busy.commit().await.unwrap();
    let answer = waiting_try.await.unwrap().expect("the Try").into_inner();
    assert_eq!(outcome(&answer), Outcome::Held);
    let same_transaction: bool = sqlx::query_scalar(
        "SELECT (SELECT xmin::text FROM tcc_barrier WHERE branch_id = $1) \
              = (SELECT xmin::text FROM seat WHERE branch_id = $1)",
    )
    .bind(&req.branch_id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        same_transaction,
        "the barrier row and the seat commit together"
    );
    assert_eq!(outcome(&p.try_(req).await), Outcome::Held, "a repeat");
    for (seat, why) in [("A1", "seat A1 is taken"), ("Z9", "seat Z9 does not exist")] {
        let refused = p.try_(try_request(vec![hold(seat, 1, None)])).await;
        assert_eq!(outcome(&refused), Outcome::Rejected, "{seat}");
        assert_eq!(refused.reason, why);
    }
    assert_eq!(counts(&mut p, "A1").await, (0, 1, 0));
    p.stop().await;
}
