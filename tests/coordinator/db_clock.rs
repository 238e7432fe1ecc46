//! Expiry reads the database clock, never the host's (ARCHITECTURE "One clock"): the test
//! database's clock is set an hour off this host's by shadowing `clock_timestamp()`,
//! `statement_timestamp()` and `now()` (a schema ahead of `pg_catalog` in the coordinator's `search_path`, reading an offset
//! the test changes). A coordinator that judged expiry, set `expires_at` or reaped by host time
//! would disagree with the database here by an hour.

use std::time::Duration;

use chrono::Utc;
use holdfast::proto;
use holdfast::proto::reservation::State;
use sqlx::PgPool;

use crate::common::*;

/// Shadows the database clock with one `offset` away from the real one (changeable with
/// [`set_offset`]); returns a pool whose connections read it.
async fn skewed(pool: &PgPool, offset: &str) -> PgPool {
    for statement in [
        "CREATE SCHEMA skew",
        "CREATE TABLE skew.clock_offset (v interval NOT NULL)",
        "CREATE FUNCTION skew.clock_timestamp() RETURNS timestamptz LANGUAGE sql VOLATILE \
         AS $$ SELECT pg_catalog.clock_timestamp() + (SELECT v FROM skew.clock_offset) $$",
        "CREATE FUNCTION skew.now() RETURNS timestamptz LANGUAGE sql STABLE \
         AS $$ SELECT pg_catalog.now() + (SELECT v FROM skew.clock_offset) $$",
        "CREATE FUNCTION skew.statement_timestamp() RETURNS timestamptz LANGUAGE sql STABLE \
         AS $$ SELECT pg_catalog.statement_timestamp() + (SELECT v FROM skew.clock_offset) $$",
    ] {
        sqlx::query(statement).execute(pool).await.unwrap();
    }
    sqlx::query("INSERT INTO skew.clock_offset VALUES ($1::interval)")
        .bind(offset)
        .execute(pool)
        .await
        .unwrap();
    // Named after `public` and before `pg_catalog`: unqualified clock calls find `skew`'s.
    let options = (*pool.connect_options())
        .clone()
        .options([("search_path", "public, skew, pg_catalog")]);
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .connect_with(options)
        .await
        .unwrap()
}

async fn set_offset(pool: &PgPool, offset: &str) {
    sqlx::query("UPDATE skew.clock_offset SET v = $1::interval")
        .bind(offset)
        .execute(pool)
        .await
        .unwrap();
}

fn seconds_from_now(t: &Option<prost_types::Timestamp>) -> i64 {
    t.as_ref().expect("a timestamp").seconds - Utc::now().timestamp()
}

async fn get(app: &mut TestApp, id: &str) -> proto::Reservation {
    app.client
        .get_reservation(proto::GetReservationRequest {
            reservation_id: id.to_owned(),
        })
        .await
        .unwrap()
        .into_inner()
}

#[sqlx::test(migrations = false)]
async fn expiry_follows_the_database_clock_not_the_hosts(pool: PgPool) {
    let skewed = skewed(&pool, "-1 hour").await;
    let fakes = spawn_fakes(&["seats"]).await;
    let mut s = settings(&[("seats", &fakes.get("seats").url)]);
    s.policy.sweep_interval = Duration::from_millis(100);
    let mut app = spawn_app(skewed.clone(), s).await;
    let ttl = Duration::from_secs(30 * 60);

    // The database is an hour behind: a 30-minute hold ends, by this host's clock, half an
    // hour ago - and is still held, reaped by no sweep, confirmable.
    let mut req = reserve_request("behind", vec![hold("seats", "A1")]);
    req.ttl = Some(proto_duration(ttl));
    let behind = app.client.reserve(req).await.unwrap().into_inner();
    let ends_in = seconds_from_now(&behind.expires_at);
    assert!(
        (-35 * 60..-25 * 60).contains(&ends_in),
        "expires_at is not the database's now + ttl: {ends_in} s from the host's now"
    );
    // A canary of one second, by the database's clock: once the reaper released it, a sweep
    // ran after its end, and a reaper by host time would have released `behind` in it too.
    let mut req = reserve_request("canary", vec![hold("seats", "A3")]);
    req.ttl = Some(proto_duration(Duration::from_secs(1)));
    let canary = app.client.reserve(req).await.unwrap().into_inner();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let stored: String =
            sqlx::query_scalar("SELECT state FROM reservations WHERE id = $1::uuid")
                .bind(&canary.id)
                .fetch_one(&pool)
                .await
                .unwrap();
        if stored == "EXPIRED" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the reaper never released the canary: {stored}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(state_of(&get(&mut app, &behind.id).await), State::Held);
    let confirmed = app
        .client
        .confirm(Decide::on(&behind).confirm())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state_of(&confirmed), State::Confirmed);

    // The database an hour ahead: a 30-minute hold ends an hour and a half from the host's
    // now; when the database's clock passes it (two hours ahead), it is expired, though the
    // host's clock says an hour and a half are left.
    set_offset(&pool, "1 hour").await;
    let mut req = reserve_request("ahead", vec![hold("seats", "A2")]);
    req.ttl = Some(proto_duration(ttl));
    let ahead = app.client.reserve(req).await.unwrap().into_inner();
    let ends_in = seconds_from_now(&ahead.expires_at);
    assert!(
        (85 * 60..95 * 60).contains(&ends_in),
        "expires_at is not the database's now + ttl: {ends_in} s from the host's now"
    );
    assert_eq!(state_of(&get(&mut app, &ahead.id).await), State::Held);
    set_offset(&pool, "2 hours").await;
    // Expired by the database's clock: a read shows it EXPIRED at once (lazy expiry), or, if
    // a sweep (every 100 ms) is already releasing it, CANCELLING on its way to EXPIRED.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match state_of(&get(&mut app, &ahead.id).await) {
            State::Expired => break,
            State::Cancelling => {}
            other => panic!("a hold past its end by the database's clock reads {other:?}"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the release never finished"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let refused = app
        .client
        .confirm(Decide::on(&ahead).confirm())
        .await
        .unwrap_err();
    assert_eq!(reason(&refused), "HOLD_EXPIRED");
    app.shut_down();
}
