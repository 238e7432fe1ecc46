//! The harness on PostgreSQL (when `DATABASE_URL` is set): a database of the test's own.

use std::time::Duration;

use holdfast_testkit::client::State;
use holdfast_testkit::{Harness, Kind};

use crate::{order, reserve};

#[tokio::test]
async fn the_harness_runs_on_postgres() {
    let Ok(server) = std::env::var("DATABASE_URL") else {
        eprintln!("DATABASE_URL not set: the PostgreSQL variant is skipped");
        return;
    };
    // A database of this test's own, beside the one DATABASE_URL names (created on start).
    let base = server.rsplit_once('/').map_or(server.as_str(), |(b, _)| b);
    let name = format!("testkit_{}", uuid::Uuid::new_v4().simple());
    let url = format!("{base}/{name}");
    let mut harness = Harness::builder()
        .participants([Kind::Seats])
        .resources("seats", [("A1", 1)])
        .postgres(&url)
        .start()
        .await
        .unwrap();
    let held = reserve(&harness, order("o-1", "seats", "A1")).await;
    harness.kill_coordinator();
    harness.restart().await.unwrap();
    harness.advance(Duration::from_secs(601)).await.unwrap();
    let read = harness.client().get(held.reservation.id).await.unwrap();
    assert_eq!(read.state, State::Expired);
    assert_eq!(harness.resource("seats", "A1").await.unwrap().available, 1);

    drop(harness);
    let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(&server)
        .await
        .unwrap();
    // The name is this test's own (a UUID), not input.
    let drop_it = sqlx::AssertSqlSafe(format!("DROP DATABASE {name} WITH (FORCE)"));
    sqlx::query(drop_it).execute(&mut admin).await.unwrap();
}
