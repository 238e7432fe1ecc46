//! `rooms`: slot holds, no overlap of active holds (exclusion constraint), adjacency allowed.

use holdfast::participants::Kind;
use holdfast::proto::branch::State;
use holdfast::proto::try_response::Outcome;
use sqlx::PgPool;

use crate::common::*;

crate::parallel::parallel_test!(storm_has_one_winner_per_overlapping_group => storm_has_one_winner_per_overlapping_group_on);
async fn storm_has_one_winner_per_overlapping_group_on(pool: PgPool) {
    for db in Db::both(&pool).await {
        let mut p = spawn_on(Kind::Rooms, &db).await;
        p.put("blue", 1).await;
        // Five hours; within an hour, four 40-minute slots starting 0/5/10/15 minutes in, which
        // all overlap one another and none the next hour's.
        let requests: Vec<_> = (0..100i64)
            .map(|i| {
                let start = (i % 5) * 60 + ((i / 5) % 4) * 5;
                try_request(vec![hold(
                    "blue",
                    1,
                    slot(future_at(start), future_at(start + 40)),
                )])
            })
            .collect();
        let admin = admin_checker(&p, "blue", 1);
        let checked = db.clone();
        let check = move || {
            let (admin, db) = (admin(), checked.clone());
            async move {
                admin.await?;
                let overlapping = db
                    .scalar(match db {
                        Db::Postgres(_) => {
                            "SELECT count(*) FROM slot_hold a JOIN slot_hold b \
                               ON a.resource = b.resource AND a.id < b.id AND a.during && b.during \
                             WHERE a.state IN ('held', 'confirmed') AND b.state IN ('held', 'confirmed')"
                        }
                        Db::Sqlite(_) => {
                            "SELECT count(*) FROM slot_hold a JOIN slot_hold b \
                               ON a.resource = b.resource AND a.id < b.id \
                              AND a.start_us < b.end_us AND b.start_us < a.end_us \
                             WHERE a.state IN ('held', 'confirmed') AND b.state IN ('held', 'confirmed')"
                        }
                    })
                    .await;
                if overlapping != 0 {
                    return Err(format!("{overlapping} overlapping active holds"));
                }
                Ok(())
            }
        };
        let (answers, checks) = storm(&p, requests, check).await;
        assert!(checks >= 1);
        assert_eq!(count(&answers, Outcome::Held), 5);
        assert_eq!(count(&answers, Outcome::Rejected), 95);
        let (held, hours) = match &db {
            Db::Postgres(_) => (
                db.scalar("SELECT count(*) FROM slot_hold WHERE state = 'held'").await,
                db.scalar(
                    "SELECT count(DISTINCT date_trunc('hour', lower(during))) FROM slot_hold \
                     WHERE state = 'held'",
                )
                .await,
            ),
            Db::Sqlite(_) => (
                db.scalar("SELECT count(*) FROM slot_hold WHERE state = 'held'").await,
                db.scalar(
                    "SELECT count(DISTINCT start_us / 3600000000) FROM slot_hold WHERE state = 'held'",
                )
                .await,
            ),
        };
        assert_eq!((held, hours), (5, 5), "one hold per hour on {}", db.name());
        p.stop().await;
    }
}

#[sqlx::test(migrations = false)]
async fn overlap_is_rejected_adjacent_allowed_and_cancel_frees_the_slot(pool: PgPool) {
    let mut p = spawn_participant(Kind::Rooms, pool.clone()).await;
    p.put("blue", 1).await;
    let ten_to_eleven = try_request(vec![hold("blue", 1, slot(future_at(600), future_at(660)))]);
    assert_eq!(outcome(&p.try_(ten_to_eleven.clone()).await), Outcome::Held);

    // 10:30-11:30 overlaps: SQLSTATE 23P01 surfaces as REJECTED, not as an error.
    let overlap = try_request(vec![hold("blue", 1, slot(future_at(630), future_at(690)))]);
    let answer = p.try_(overlap.clone()).await;
    assert_eq!(outcome(&answer), Outcome::Rejected);
    assert!(answer.reason.contains("blue"), "{}", answer.reason);

    // 11:00-12:00 touches the end of the half-open 10:00-11:00: allowed.
    let adjacent = try_request(vec![hold("blue", 1, slot(future_at(660), future_at(720)))]);
    assert_eq!(outcome(&p.try_(adjacent).await), Outcome::Held);

    // Cancelling 10:00-11:00 frees it for a new overlapping hold.
    assert_eq!(p.cancel(&ten_to_eleven).await, State::Cancelled);
    let again = try_request(vec![hold("blue", 1, slot(future_at(630), future_at(660)))]);
    assert_eq!(outcome(&p.try_(again.clone()).await), Outcome::Held);
    assert_eq!(p.confirm(&again).await, State::Confirmed);

    let active: i64 =
        sqlx::query_scalar("SELECT count(*) FROM slot_hold WHERE state IN ('held', 'confirmed')")
            .fetch_one(&pool)
            .await
            .expect("active");
    assert_eq!(active, 2);
    p.stop().await;
}

#[sqlx::test(migrations = false)]
async fn a_room_hold_needs_a_slot(pool: PgPool) {
    let mut p = spawn_participant(Kind::Rooms, pool.clone()).await;
    p.put("blue", 1).await;
    let err = p
        .participant
        .r#try(try_request(vec![hold("blue", 1, None)]))
        .await
        .expect_err("no slot");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().starts_with("items[0].during"),
        "{}",
        err.message()
    );
    let backwards = try_request(vec![hold("blue", 1, slot(future_at(60), future_at(0)))]);
    let err = p
        .participant
        .r#try(backwards)
        .await
        .expect_err("end before start");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().starts_with("items[0].during.end"),
        "{}",
        err.message()
    );
    p.stop().await;
}

#[sqlx::test(migrations = false)]
async fn a_room_that_does_not_exist_is_named_in_the_rejection(pool: PgPool) {
    // A typo must not read as a taken slot: the reason names the room that does not exist.
    let mut p = spawn_participant(Kind::Rooms, pool.clone()).await;
    p.put("blue", 1).await;
    let typo = try_request(vec![
        hold("bleu", 1, slot(future_at(600), future_at(660))),
        hold("blue", 1, slot(future_at(600), future_at(660))),
    ]);
    let answer = p.try_(typo).await;
    assert_eq!(outcome(&answer), Outcome::Rejected);
    assert_eq!(answer.reason, "room bleu does not exist");
    p.stop().await;
}
