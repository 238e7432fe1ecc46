//! The pools holdfast opens (`db::pool_options`): a connection idle for the check's window is
//! checked before it is handed out (and replaced if its server process is gone); one used
//! more recently is handed out without the round trip, so a break since its last use fails one
//! statement and then the pool replaces it. Replicas starting together on a database that does
//! not exist yet all open it (`db::connect_postgres` creates it once, whoever wins).

use std::time::Duration;

use holdfast::db::{connect_postgres, pool_options, postgres_pool_options};
use holdfast::store::Store;
use sqlx::Connection;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::parallel::parallel_test;

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

/// Makes the test database read-only for sessions opened from now on (as every session on a
/// standby is), or writable again.
async fn read_only_from_now(connect: &PgConnectOptions, on: bool) {
    let database = connect
        .get_database()
        .expect("the test database")
        .to_owned();
    let mut other = sqlx::PgConnection::connect_with(connect).await.unwrap();
    // This session writes whatever the database's default says.
    sqlx::query("SET default_transaction_read_only = off")
        .execute(&mut other)
        .await
        .unwrap();
    let change = if on {
        "SET default_transaction_read_only = on"
    } else {
        "RESET default_transaction_read_only"
    };
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER DATABASE \"{database}\" {change}"
    )))
    .execute(&mut other)
    .await
    .unwrap();
    other.close().await.unwrap();
}

/// At a failover the address the pool dials (a proxy, a Service) may still lead to the node
/// just demoted, or to a standby: a connection opened there refuses every write (`25006`).
/// Such a connection is not kept (the write fails as transient meanwhile); once the address
/// leads to a primary again, the next write commits. Before, the pool kept the read-only
/// connection and every write failed until the pool retired it.
#[sqlx::test(migrations = false)]
async fn a_connection_to_a_server_refusing_writes_is_not_kept(
    _: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let migrating = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(connect.clone())
        .await
        .unwrap();
    holdfast::store::PgStore::from_pool(migrating.clone())
        .migrate()
        .await
        .unwrap();
    migrating.close().await;
    read_only_from_now(&connect, true).await;
    // A window no test outlasts: nothing but the connect check looks at the connection.
    let pool =
        postgres_pool_options(1, Duration::from_secs(3600)).connect_lazy_with(connect.clone());
    let store = holdfast::store::PgStore::from_pool(pool);
    let refused = store
        .probe_write()
        .await
        .expect_err("no primary behind the address");
    assert_eq!(
        refused.fault(),
        holdfast::store::fault::Fault::Transient,
        "{refused:?}"
    );
    read_only_from_now(&connect, false).await;
    store
        .probe_write()
        .await
        .expect("a primary behind the address again: the write commits");
}

/// Replicas starting at once on a new database.
const REPLICAS: usize = 24;

parallel_test!(replicas_starting_together_on_a_new_database_all_open_it => replicas_start_together);

async fn replicas_start_together(pool: PgPool) {
    // A name of its own (the test database's is as long as PostgreSQL allows).
    let fresh = format!("holdfast_new_{}", uuid::Uuid::new_v4().simple());
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL names the test server");
    let url = with_database(&base, &fresh);
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(REPLICAS));
    let replicas: Vec<_> = (0..REPLICAS)
        .map(|_| {
            let (url, start) = (url.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                connect_postgres(&url, 1).await
            })
        })
        .collect();
    let mut failures = Vec::new();
    for replica in replicas {
        match replica.await.expect("a replica's task") {
            Ok(opened) => opened.close().await,
            Err(error) => failures.push(error.to_string()),
        }
    }
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS \"{fresh}\" WITH (FORCE)"
    )))
    .execute(&pool)
    .await
    .unwrap();
    assert!(
        failures.is_empty(),
        "every replica opens the new database; failed: {failures:?}"
    );
}

/// `url` naming the database `name` instead of its own (query kept).
fn with_database(url: &str, name: &str) -> String {
    let (address, query) = url
        .split_once('?')
        .map_or((url, None), |(a, q)| (a, Some(q)));
    let scheme_end = address.find("://").map_or(0, |i| i + 3);
    let server = match address[scheme_end..].find('/') {
        Some(slash) => &address[..scheme_end + slash],
        None => address,
    };
    match query {
        Some(query) => format!("{server}/{name}?{query}"),
        None => format!("{server}/{name}"),
    }
}
