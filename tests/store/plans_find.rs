//! The lookups and counts the console reads walk an index, never the whole table: an id
//! prefix the primary key, a request id `reservations_by_request_id` (migration 0014), the live
//! counts `reservations_open`, the last hour's `reservations_by_created`. PostgreSQL under a
//! forced generic plan on 120k rows spread over 33 hours; SQLite by `EXPLAIN QUERY PLAN`.

use holdfast::store::PgStore;
use holdfast::store::{postgres, sqlite};
use sqlx::{AssertSqlSafe, Connection, PgPool};

/// The plans' statements: name, PostgreSQL text, its parameter types and values, the index it
/// must walk.
fn postgres_statements() -> [(&'static str, &'static str, &'static str, &'static str); 4] {
    [
        (
            postgres::find::BY_ID_PREFIX,
            "(uuid, uuid, bigint, text)",
            "('01a23eb5-0000-0000-0000-000000000000', '01a23eb5-ffff-ffff-ffff-ffffffffffff', 11, NULL)",
            "reservations_pkey",
        ),
        (
            postgres::find::BY_REQUEST_ID,
            "(timestamptz, uuid, bigint, text, text)",
            "('9999-12-31', 'ffffffff-ffff-ffff-ffff-ffffffffffff', 11, 'tiny', 'r77')",
            "reservations_by_request_id",
        ),
        (postgres::counts::LIVE, "", "", "reservations_open"),
        (
            postgres::counts::LAST_HOUR,
            "",
            "",
            "reservations_by_created",
        ),
    ]
}

#[sqlx::test(migrations = false)]
async fn lookups_and_counts_walk_an_index_on_postgres_under_a_generic_plan(pool: PgPool) {
    PgStore::from_pool(pool.clone()).migrate().await.unwrap();
    let mut conn = pool.acquire().await.unwrap();
    // One reservation a second over the last 33 hours: the last hour is 3% of the table.
    let fill = crate::plans::FILL_PG.replace(" ms')::interval", " s')::interval");
    assert_ne!(
        fill,
        crate::plans::FILL_PG,
        "the fill spreads rows over hours"
    );
    sqlx::raw_sql(AssertSqlSafe(fill))
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::raw_sql("SET plan_cache_mode = force_generic_plan")
        .execute(&mut *conn)
        .await
        .unwrap();
    let mut wrong = Vec::new();
    for (i, (sql, types, args, index)) in postgres_statements().into_iter().enumerate() {
        // The store's own statement text and fixed literals: nothing from outside.
        sqlx::raw_sql(AssertSqlSafe(format!("PREPARE find{i} {types} AS {sql}")))
            .execute(&mut *conn)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        let plan: Vec<(String,)> =
            sqlx::query_as(AssertSqlSafe(format!("EXPLAIN EXECUTE find{i} {args}")))
                .fetch_all(&mut *conn)
                .await
                .unwrap();
        let plan: String = plan.into_iter().map(|(l,)| l + "\n").collect();
        if plan.contains("Seq Scan") || !plan.contains(index) {
            wrong.push(format!("{sql}\nwalks no {index}:\n{plan}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_and_counts_search_an_index_on_sqlite() {
    let db = crate::TempDb::fresh();
    drop(db.store().await);
    let mut conn = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
    sqlx::raw_sql(crate::plans::FILL_SQLITE)
        .execute(&mut conn)
        .await
        .unwrap();
    for analyzed in [false, true] {
        if analyzed {
            sqlx::raw_sql("ANALYZE").execute(&mut conn).await.unwrap();
        }
        let mut wrong = Vec::new();
        for (sql, index) in [
            (
                sqlite::find::BY_ID_PREFIX,
                "INDEX sqlite_autoindex_reservations_1 (id>? AND id<?)",
            ),
            (
                sqlite::find::BY_REQUEST_ID,
                "INDEX reservations_by_request_id (request_id=?",
            ),
            (sqlite::counts::LIVE, "INDEX reservations_open (state=?)"),
            (
                sqlite::counts::LAST_HOUR,
                "INDEX reservations_by_created (created_at>?)",
            ),
        ] {
            // The store's own statement text: nothing from outside.
            let mut query = sqlx::query_as(AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")));
            if sql.contains("?4") {
                query = query
                    .bind(vec![0x01_u8; 16])
                    .bind(vec![0x02_u8; 16])
                    .bind(11_i64)
                    .bind("tiny");
            }
            if sql.contains("?5") {
                query = query.bind("r77");
            }
            let plan: Vec<(i64, i64, i64, String)> = query
                .fetch_all(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            let plan: String = plan.into_iter().map(|(.., d)| d + "\n").collect();
            let searched = plan
                .lines()
                .any(|l| l.starts_with("SEARCH reservations") && l.contains(index));
            if !searched || plan.lines().any(|l| l.starts_with("SCAN reservations")) {
                wrong.push(format!(
                    "{sql}\n(analyzed: {analyzed}) searches no {index}:\n{plan}"
                ));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }
}
