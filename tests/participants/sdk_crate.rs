//! The SDK as its own crate (issue #22): a participant team depends on `holdfast-participant`
//! (and through it `holdfast-serve`) without pulling the coordinator, Redis, the OpenTelemetry
//! SDK or the Prometheus exporter, nor the driver of a database it does not use; and its
//! barrier migrations apply on their own, beside an author's migrations, on either database.

use sqlx::PgPool;

/// The crates `package`'s normal dependency tree names (one per line, no prefix).
fn tree_of(package: &str) -> Vec<String> {
    tree_with(package, &[])
}

/// [`tree_of`] with `features` (e.g. `--no-default-features --features postgres`).
fn tree_with(package: &str, features: &[&str]) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args([
            "tree",
            "--offline",
            "-p",
            package,
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .args(features)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

#[test]
fn the_participant_crate_pulls_no_coordinator_redis_or_telemetry_sdk() {
    for package in ["holdfast-participant", "holdfast-serve"] {
        let crates = tree_of(package);
        for needed in ["tonic", "sqlx", "holdfast-proto", "opentelemetry"] {
            assert!(
                crates.iter().any(|c| c == needed),
                "{package} lacks {needed}: {crates:?}"
            );
        }
        for banned in [
            "holdfast",
            "holdfast-client",
            "holdfast-testkit",
            "redis",
            "opentelemetry_sdk",
            "opentelemetry-otlp",
            "metrics-exporter-prometheus",
            "clap",
        ] {
            assert!(
                !crates.iter().any(|c| c == banned),
                "{package} depends on {banned}"
            );
        }
    }
    // One SQLite binding (sqlx's) in the SDK's tree.
    let sdk = tree_of("holdfast-participant");
    assert!(
        !sdk.iter().any(|c| c == "rusqlite"),
        "holdfast-participant depends on rusqlite"
    );
}

/// A team on one database builds without the other's driver (SQLite's is C, compiled from
/// source): `default-features = false` and the feature of its database. (`.ci/run` compiles
/// both such builds.)
#[test]
fn a_participant_on_one_database_pulls_only_that_driver() {
    for (feature, kept, left_out) in [
        (
            "postgres",
            "sqlx-postgres",
            &["sqlx-sqlite", "libsqlite3-sys"][..],
        ),
        ("sqlite", "sqlx-sqlite", &["sqlx-postgres"][..]),
    ] {
        let crates = tree_with(
            "holdfast-participant",
            &["--no-default-features", "--features", feature],
        );
        assert!(crates.iter().any(|c| c == kept), "{feature}: no {kept}");
        for other in left_out {
            assert!(
                !crates.iter().any(|c| c == other),
                "{feature} only, yet {other} is in the tree"
            );
        }
    }
}

#[sqlx::test(migrations = false)]
async fn the_barrier_schema_applies_beside_the_authors_own_migrations_on_postgres(pool: PgPool) {
    // The author's own history first, in sqlx's default table.
    sqlx::raw_sql(
        "CREATE TABLE _sqlx_migrations (version BIGINT PRIMARY KEY, description TEXT NOT NULL, \
         installed_on TIMESTAMPTZ NOT NULL DEFAULT now(), success BOOLEAN NOT NULL, \
         checksum BYTEA NOT NULL, execution_time BIGINT NOT NULL); \
         INSERT INTO _sqlx_migrations VALUES (1, 'bays', now(), true, '\\x00', 1);",
    )
    .execute(&pool)
    .await
    .unwrap();
    holdfast::participant::migrate(&pool).await.unwrap();
    holdfast::participant::migrate(&pool).await.unwrap(); // a restart: nothing again
    let barrier: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _holdfast_barrier_migrations ORDER BY version")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(barrier, [1, 8, 91]);
    let own: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(own, 1, "the author's history is untouched");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM tcc_barrier")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 0);
}

#[tokio::test]
async fn the_barrier_schema_applies_on_sqlite_with_its_clock() {
    let dir = std::env::temp_dir().join(format!("holdfast-barrier-{}", uuid::Uuid::new_v4()));
    let url = format!("sqlite://{}", dir.join("p.db").display());
    let pool = holdfast::db::open_sqlite(&url, 1).await.unwrap();
    holdfast::participant::migrate(&pool).await.unwrap();
    let barrier: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _holdfast_barrier_migrations ORDER BY version")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(barrier, [1, 8, 90]);
    // The clock every barrier statement reads is there (and at zero offset).
    let offset: i64 = sqlx::query_scalar("SELECT offset_us FROM holdfast_clock_offset")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(offset, 0);
    pool.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A database the reference participants migrated before the SDK was a crate keeps working:
/// the same barrier files, in the same history table, so nothing is applied twice and no
/// checksum differs.
#[sqlx::test(migrations = false)]
async fn the_reference_participants_history_still_holds_the_barrier(pool: PgPool) {
    holdfast::participants::MIGRATOR.run(&pool).await.unwrap();
    holdfast::participants::MIGRATOR.run(&pool).await.unwrap();
    let versions: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM _holdfast_participant_migrations ORDER BY version")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(versions, [1, 2, 3, 4, 5, 6, 7, 8, 9, 66, 67, 68, 91]);
}
