//! `holdfast migrate`: the real binary creates a missing database and applies the
//! coordinator's schema, PostgreSQL or SQLite; a second run changes nothing.

use sqlx::Connection;
use sqlx::migrate::MigrateDatabase;

use crate::process::{TempDatabase, run_holdfast};

/// Runs `holdfast migrate --database-url <url>` and asserts it succeeded.
fn migrate(url: &str) {
    let out = run_holdfast(&["migrate", "--database-url", url], &[]);
    assert!(
        out.status.success(),
        "holdfast migrate failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn migrate_creates_and_migrates_a_postgres_database_once() {
    let db = TempDatabase::create().await;
    sqlx::Postgres::drop_database(&db.url).await.unwrap();
    migrate(&db.url);
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let (reservations, branches): (Option<String>, Option<String>) =
        sqlx::query_as("SELECT to_regclass('reservations')::text, to_regclass('branches')::text")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    assert_eq!(reservations.as_deref(), Some("reservations"));
    assert_eq!(branches.as_deref(), Some("branches"));
    let applied = || async {
        let rows: Vec<(i64, bool)> =
            sqlx::query_as("SELECT version, success FROM _sqlx_migrations ORDER BY version")
                .fetch_all(&mut sqlx::PgConnection::connect(&db.url).await.unwrap())
                .await
                .unwrap();
        rows
    };
    let first = applied().await;
    let expected: Vec<(i64, bool)> = holdfast::store::postgres::MIGRATOR
        .iter()
        .map(|m| (m.version, true))
        .collect();
    assert_eq!(first, expected);
    // Again: nothing new, nothing fails.
    migrate(&db.url);
    assert_eq!(applied().await, first);
    conn.close().await.unwrap();
}

#[tokio::test]
async fn migrate_creates_a_sqlite_database() {
    let dir = std::env::temp_dir().join(format!("holdfast-migrate-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("coordinator.db");
    let url = format!("sqlite://{}", path.display());
    migrate(&url);
    migrate(&url);
    let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
    let tables: Vec<(String,)> = sqlx::query_as(
        "SELECT name FROM sqlite_master WHERE type = 'table' \
         AND name IN ('reservations', 'branches') ORDER BY name",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        tables,
        [("branches".to_owned(),), ("reservations".to_owned(),)]
    );
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations WHERE success")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        applied,
        holdfast::store::sqlite::MIGRATOR.iter().count() as i64
    );
    conn.close().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
