//! The pools holdfast opens (`db::pool_options`): a connection idle for the check's window is
//! checked before it is handed out (and replaced if its server process is gone); one used
//! more recently is handed out without the round trip, so a break since its last use fails one
//! statement and then the pool replaces it.

use std::time::Duration;

use holdfast::db::pool_options;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// One-connection pool on the test's database, checking connections idle for `window`.
async fn one_connection(connect: PgConnectOptions, window: Duration) -> PgPool {
    pool_options(1, window).connect_with(connect).await.unwrap()
}

async fn backend_pid(pool: &PgPool) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(pool)
        .await
}

/// Ends the server process `pid` from another connection and waits until it is gone.
async fn terminate(connect: &PgConnectOptions, pid: i32) {
    let other = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(connect.clone())
        .await
        .unwrap();
    let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 10000)")
        .bind(pid)
        .fetch_one(&other)
        .await
        .unwrap();
    assert!(ended, "backend {pid} did not end");
    other.close().await;
}

#[sqlx::test(migrations = false)]
async fn a_connection_idle_for_the_window_is_checked_and_replaced_when_its_server_is_gone(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // A zero window: every handed-out connection is checked, as one idle that long would be.
    let pool = one_connection(connect.clone(), Duration::ZERO).await;
    let first = backend_pid(&pool).await.unwrap();
    terminate(&connect, first).await;
    let second = backend_pid(&pool)
        .await
        .expect("the check found the dead connection and the pool opened another");
    assert_ne!(first, second);
}

#[sqlx::test(migrations = false)]
async fn a_connection_used_within_the_window_is_handed_out_unchecked_and_fails_once(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    // A window no test outlasts: the connection is handed out as it is. Before, every
    // acquire checked it (a round trip) and this statement succeeded on a new connection.
    let pool = one_connection(connect.clone(), Duration::from_secs(3600)).await;
    let first = backend_pid(&pool).await.unwrap();
    terminate(&connect, first).await;
    assert!(
        backend_pid(&pool).await.is_err(),
        "handed out unchecked, the broken connection fails its statement"
    );
    // Its release check closes it rather than putting it back, so the next statement waits
    // for that and runs on a new connection.
    let second = backend_pid(&pool)
        .await
        .expect("the pool replaced the broken connection");
    assert_ne!(first, second);
}
