//! Error classes (#15 item 10): a value no database can hold is INVALID_ARGUMENT naming its
//! field, refused before anything is written or any participant called - not UNAVAILABLE
//! "retry", which a client would retry forever.

use holdfast::proto;
use sqlx::PgPool;
use tonic::Code;

use crate::common::*;

/// Seconds since the epoch of 1 January of `year` (proleptic Gregorian, near enough).
fn year(year: i64) -> i64 {
    (year - 1970) * 31_556_952
}

/// A room hold of one hour from `start`.
fn room_from(request_id: &str, start: i64) -> proto::ReserveRequest {
    let mut req = reserve_request(request_id, vec![hold("rooms", "R1")]);
    req.holds[0].during = Some(proto::Interval {
        start: Some(prost_types::Timestamp {
            seconds: start,
            nanos: 0,
        }),
        end: Some(prost_types::Timestamp {
            seconds: start + 3600,
            nanos: 0,
        }),
    });
    req
}

#[sqlx::test(migrations = false)]
async fn a_during_no_database_can_hold_is_invalid_argument_and_nothing_is_written(pool: PgPool) {
    let (mut app, fakes) = spawn_with_fakes(pool, &["rooms"]).await;
    // Year 300000 is beyond PostgreSQL's timestamptz (294276 AD); 5000 BC before it (4713 BC)
    // - that one reached the database and came back UNAVAILABLE; year 200000 lies outside a
    // google.protobuf.Timestamp's range (0001..9999), which is what every store holds.
    for (i, start) in [year(300_000), year(-5000), year(200_000)]
        .into_iter()
        .enumerate()
    {
        let err = app
            .client
            .reserve(room_from(&format!("far-{i}"), start))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{start}: {err:?}");
        assert_eq!(reason(&err), "INVALID_ARGUMENT");
        let field = &error_metadata(&err)["field"];
        assert!(field.starts_with("holds[0].during"), "{field}");
        assert!(
            err.message().starts_with(field.as_str()) && err.message().contains("out of range"),
            "{}",
            err.message()
        );
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM reservations")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(rows, 0, "nothing written");
    assert!(fakes.log.calls().is_empty(), "no participant called");

    // The edge of the range is fine.
    let r = app
        .client
        .reserve(room_from("edge", year(9999)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&r), proto::reservation::State::Held);
}

#[sqlx::test(migrations = false)]
async fn text_a_database_cannot_store_is_invalid_argument(pool: PgPool) {
    let (mut app, fakes) = spawn_with_fakes(pool, &["seats"]).await;
    let mut req = reserve_request("nul", vec![hold("seats", "A1")]);
    req.labels.insert("note".into(), "a\0b".into());
    let err = app.client.reserve(req).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert_eq!(error_metadata(&err)["field"], "labels[\"note\"]");
    assert!(fakes.log.calls().is_empty(), "no participant called");

    let r = app
        .client
        .reserve(reserve_request("ok", vec![hold("seats", "A1")]))
        .await
        .unwrap()
        .into_inner();
    let err = app
        .client
        .cancel(Decide::on(&r).cancel_because("oops\0"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert_eq!(error_metadata(&err)["field"], "reason");
    let rows: Vec<String> = sqlx::query_scalar("SELECT state FROM reservations")
        .fetch_all(&app.pool)
        .await
        .unwrap();
    assert_eq!(rows, ["HELD"], "only the valid Reserve was recorded");
}
