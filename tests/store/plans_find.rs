//! The lookups and counts the console reads walk an index, never the whole table: an id
//! prefix the primary key, a request id the request key's index (PostgreSQL
//! `reservations_request_key`, migration 0018; SQLite `reservations_by_request_id`), the live
//! counts `reservations_open`, the last hour's `reservations_by_created`. PostgreSQL under a
//! forced generic plan on 120k rows spread over 33 hours; SQLite by `EXPLAIN QUERY PLAN`. And a
//! Reserve's request key is looked up by all of its columns, however many holders share a
//! request id.

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
            "reservations_request_key",
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

/// 3,000 holders of one principal, each with a reservation under the same request id (SPEC 3.1
/// scopes a request id to its holder).
const SHARED_REQUEST_ID: &str = "
INSERT INTO reservations (id, request_id, holder, owner, state, token_digest, ttl_ms, expires_at)
SELECT gen_random_uuid(), 'checkout', 'buyer-' || g, 'shop', 'REJECTED', sha256(int8send(g)),
       600000, now()
FROM generate_series(1, 3000) g;
ANALYZE reservations;
";

/// The request key's lookups - whether a request is recorded (every Reserve the sold-out fast
/// path refuses asks) and the create's admission of a repeated request - go down the key's
/// index by all three of its columns: the store's own statements, on its own session, under a
/// generic plan. Before migration 0018 that plan took the request id's search index and walked
/// every holder's reservation under the id (0.25 ms a lookup in a flash sale).
#[sqlx::test(migrations = false)]
async fn the_request_key_is_looked_up_by_all_its_columns_on_postgres(
    options: sqlx::postgres::PgPoolOptions,
    connect: sqlx::postgres::PgConnectOptions,
) {
    let (pool, store) = crate::plans::skewed_store(options, connect).await;
    sqlx::raw_sql(SHARED_REQUEST_ID)
        .execute(&pool)
        .await
        .unwrap();
    let checkout = crate::cases::request_id_of("checkout");
    for (holder, recorded) in [("buyer-77", true), ("buyer-0", false)] {
        let found = store.request_recorded("shop", holder, &checkout).await;
        assert_eq!(found.unwrap(), recorded, "{holder}");
    }
    // A repeated Reserve is judged by the admission's read of its key.
    crate::cases::create(&store, "walk-in", "checkout", crate::cases::LONG).await;
    let again = crate::cases::new_res("walk-in", "checkout", crate::cases::LONG);
    let again = store
        .create(&again, crate::cases::lease(), crate::cases::NO_LIMITS)
        .await
        .unwrap();
    assert!(
        matches!(again, holdfast::store::Created::Existing(_)),
        "{again:?}"
    );

    let mut conn = pool.acquire().await.unwrap();
    let mut wrong = Vec::new();
    for pattern in [
        "SELECT EXISTS (SELECT 1 FROM reservations%request_id%",
        "SELECT (SELECT id FROM reservations%request_id%",
    ] {
        let found = crate::generic_plans::prepared(&mut conn, &[pattern]).await;
        assert_eq!(found.len(), 1, "{pattern}: one statement prepared");
        let by_whole_key = found[0].plan.lines().any(|l| {
            l.contains("Index Cond")
                && ["request_id = ", "owner = ", "holder = "]
                    .iter()
                    .all(|c| l.contains(c))
        });
        if !by_whole_key
            || !found[0]
                .indexes("reservations_")
                .contains(&"reservations_request_key")
        {
            wrong.push(format!(
                "{}\nlooks the key up by less than its columns:\n{}",
                found[0].statement, found[0].plan
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    drop(conn);
    pool.close().await;
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

/// SQLite's request key lookups alike: one search of the key's index by all three columns,
/// with and without statistics, 3,000 holders sharing one request id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_key_is_looked_up_by_all_its_columns_on_sqlite() {
    let db = crate::TempDb::fresh();
    drop(db.store().await);
    let mut conn = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
    let shared = "
        WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 3000)
        INSERT INTO reservations (id, request_id, holder, owner, state, token_digest, ttl_ms,
                                  created_at, expires_at)
        SELECT randomblob(16), 'checkout', 'buyer-' || n, 'shop', 'REJECTED', randomblob(32),
               600000, 1700000000000000, 1700000600000000
        FROM g;";
    sqlx::raw_sql(AssertSqlSafe(format!(
        "{}{shared}",
        crate::plans::FILL_SQLITE
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    for analyzed in [false, true] {
        if analyzed {
            sqlx::raw_sql("ANALYZE").execute(&mut conn).await.unwrap();
        }
        let mut wrong = Vec::new();
        for (sql, binds) in [
            (sqlite::REQUEST_RECORDED, ["shop", "buyer-77", "checkout"]),
            (sqlite::FIND_REQUEST, ["buyer-77", "checkout", "shop"]),
        ] {
            // The store's own statement text: nothing from outside.
            let plan: Vec<(i64, i64, i64, String)> =
                sqlx::query_as(AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")))
                    .bind(binds[0])
                    .bind(binds[1])
                    .bind(binds[2])
                    .fetch_all(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
            let plan: String = plan.into_iter().map(|(.., d)| d + "\n").collect();
            let by_whole_key = plan.lines().any(|l| {
                l.starts_with("SEARCH reservations")
                    && ["request_id=?", "owner=?", "holder=?"]
                        .iter()
                        .all(|c| l.contains(c))
            });
            if !by_whole_key {
                wrong.push(format!(
                    "{sql}\n(analyzed: {analyzed}) looks the key up by less than its columns:\n{plan}"
                ));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }
}
