//! Every List shape has an index-backed plan (#15 item 13): the exact statements the stores
//! run, on a table of 120k reservations, never scan `reservations` whole. PostgreSQL under a
//! forced generic plan (what a cached prepared statement runs), SQLite by `EXPLAIN QUERY PLAN`.

use holdfast::store::PgStore;
use holdfast::store::list::{ListShape, StateFilter};
use holdfast::store::postgres::list_statement as postgres_list_statement;
use holdfast::store::sqlite::list_statement as sqlite_list_statement;
use sqlx::{AssertSqlSafe, Connection, PgPool};

const ROWS: i64 = 120_000;

/// Values for the shape's parameters: an owner with few reservations, a holder, a state.
fn args(shape: ListShape) -> String {
    let state = match shape.state {
        StateFilter::Any => "NULL",
        StateFilter::Stored => "'FAILED'",
        StateFilter::Live => "'HELD'",
        StateFilter::Lapsed => "'EXPIRED'",
    };
    format!(
        "('9999-12-31', 'ffffffff-ffff-ffff-ffff-ffffffffffff', 51, 'tiny', 'h7', {state}, \
         'seats', '{{\"order\": \"o-1\"}}')"
    )
}

/// Skewed like a real table: most rows terminal and of one principal.
pub(crate) const FILL_PG: &str = "
INSERT INTO reservations (id, request_id, holder, owner, state, release_outcome, token_digest,
                          ttl_ms, created_at, expires_at)
SELECT gen_random_uuid(), 'r' || g, 'h' || (g % 3000),
       CASE WHEN g % 100 = 0 THEN 'tiny' WHEN g % 10 = 0 THEN 'partner' ELSE 'shop' END,
       s.state, NULL, sha256(int8send(g)), 600000,
       now() - (g || ' ms')::interval,
       now() - (g || ' ms')::interval + interval '10 minutes'
FROM generate_series(1, 120000) g
CROSS JOIN LATERAL (SELECT CASE
    WHEN g % 1000 = 0 THEN 'FAILED' WHEN g % 50 = 0 THEN 'HELD' WHEN g % 7 = 0 THEN 'EXPIRED'
    WHEN g % 5 = 0 THEN 'CANCELLED' ELSE 'CONFIRMED' END AS state) s;
INSERT INTO branches (reservation_id, generation, position, branch_id, participant, resource,
                      quantity, state)
SELECT id, 0, 0, gen_random_uuid(), 'seats', 'A1', 1, 'CONFIRMED' FROM reservations;
ANALYZE reservations;
ANALYZE branches;
";

#[sqlx::test(migrations = false)]
async fn every_list_shape_walks_an_index_on_postgres_under_a_generic_plan(pool: PgPool) {
    PgStore::from_pool(pool.clone()).migrate().await.unwrap();
    let mut conn = pool.acquire().await.unwrap();
    sqlx::raw_sql(FILL_PG).execute(&mut *conn).await.unwrap();
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM reservations")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(n, ROWS);
    sqlx::raw_sql("SET plan_cache_mode = force_generic_plan")
        .execute(&mut *conn)
        .await
        .unwrap();
    let mut wrong = Vec::new();
    for (i, shape) in ListShape::all().into_iter().enumerate() {
        let sql = postgres_list_statement(shape);
        // The store's own statement text and fixed literals: nothing from outside.
        sqlx::raw_sql(AssertSqlSafe(format!(
            "PREPARE shape{i} (timestamptz, uuid, bigint, text, text, text, text, jsonb) AS {sql}"
        )))
        .execute(&mut *conn)
        .await
        .unwrap_or_else(|e| panic!("{shape:?}: {e}"));
        let plan: Vec<(String,)> = sqlx::query_as(AssertSqlSafe(format!(
            "EXPLAIN EXECUTE shape{i} {}",
            args(shape)
        )))
        .fetch_all(&mut *conn)
        .await
        .unwrap();
        let plan: String = plan.into_iter().map(|(l,)| l + "\n").collect();
        if plan.contains("Seq Scan") {
            wrong.push(format!("{shape:?} scans:\n{plan}"));
        }
        if !plan
            .lines()
            .any(|l| l.contains("Index") && l.contains(" on reservations"))
        {
            wrong.push(format!("{shape:?} uses no index on reservations:\n{plan}"));
        }
        // Every walk of reservations is bounded by the shape's filters: they are its Index Cond
        // (owner, holder, state), not a Filter over some other order.
        let mut wanted = vec!["ROW(created_at, id) < ROW($1, $2)"];
        if shape.owner {
            wanted.push("owner = $4");
        }
        if shape.holder {
            wanted.push("holder = $5");
        }
        if shape.state != StateFilter::Any {
            wanted.push("state = ");
        }
        for walk in index_walks(&plan) {
            for w in &wanted {
                // The HELD walks of live and lapsed holds may use the small partial indexes of
                // live reservations (bounded by the hold limits), then sort what they found.
                let live = walk.contains("reservations_open")
                    || walk.contains("reservations_live_by_holder");
                let bounded = walk.contains(w) || (live && w.starts_with("ROW"));
                if !bounded {
                    wrong.push(format!(
                        "{shape:?}: a walk of reservations not bounded by {w}:\n{plan}"
                    ));
                }
            }
        }
        // A label filter is checked on each row of the shape's walk; the planner, taking
        // `labels @> $8` for very selective, may collect one holder's rows (bounded by its
        // index, checked above) and sort them rather than walk them in order.
        if plan.contains(" Sort ")
            && matches!(shape.state, StateFilter::Any | StateFilter::Stored)
            && !shape.labels
        {
            wrong.push(format!("{shape:?} sorts:\n{plan}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Each index scan of `reservations` in `plan`, with its condition lines: the node's own line up
/// to the next node.
fn index_walks(plan: &str) -> Vec<String> {
    let mut walks = Vec::new();
    let mut current: Option<String> = None;
    for line in plan.lines() {
        let node = line.trim_start().starts_with("->") || !line.starts_with(' ');
        if node {
            walks.extend(current.take());
            if line.contains("Index") && line.contains(" on reservations") {
                current = Some(line.to_owned());
            }
        } else if let Some(c) = current.as_mut()
            && line.contains("Index Cond")
        {
            c.push('\n');
            c.push_str(line);
        }
    }
    walks.extend(current);
    walks
}

/// The same table on SQLite (times as microseconds, ids as 16-byte blobs).
pub(crate) const FILL_SQLITE: &str = "
WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 120000)
INSERT INTO reservations (id, request_id, holder, owner, state, token_digest, ttl_ms,
                          created_at, expires_at)
SELECT randomblob(16), 'r' || n, 'h' || (n % 3000),
       CASE WHEN n % 100 = 0 THEN 'tiny' WHEN n % 10 = 0 THEN 'partner' ELSE 'shop' END,
       CASE WHEN n % 1000 = 0 THEN 'FAILED' WHEN n % 50 = 0 THEN 'HELD' WHEN n % 7 = 0 THEN 'EXPIRED'
            WHEN n % 5 = 0 THEN 'CANCELLED' ELSE 'CONFIRMED' END,
       randomblob(32), 600000, 1700000000000000 - n * 1000, 1700000600000000 - n * 1000
FROM g;
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_list_shape_searches_an_index_on_sqlite() {
    let db = crate::TempDb::fresh();
    drop(db.store().await);
    let mut conn = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
    sqlx::raw_sql(FILL_SQLITE).execute(&mut conn).await.unwrap();
    // With statistics too: what `ANALYZE` (or `PRAGMA optimize`) would leave behind.
    for analyzed in [false, true] {
        if analyzed {
            sqlx::raw_sql("ANALYZE").execute(&mut conn).await.unwrap();
        }
        let mut wrong = Vec::new();
        for shape in ListShape::all() {
            let sql = sqlite_list_statement(shape);
            // The store's own statement text: nothing from outside.
            let plan: Vec<(i64, i64, i64, String)> =
                sqlx::query_as(AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")))
                    .bind(1_800_000_000_000_000_i64)
                    .bind(vec![0xff_u8; 16])
                    .bind(51_i64)
                    .bind("tiny")
                    .bind("h7")
                    .bind("FAILED")
                    .bind("seats")
                    .bind(r#"{"order": "o-1"}"#)
                    .fetch_all(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("{shape:?}: {e}"));
            let plan: String = plan.into_iter().map(|(.., d)| d + "\n").collect();
            // A full scan reads `SCAN reservations` (with or without an index: a covering walk
            // of a whole index is still the whole table); a search names the index it uses.
            if plan.lines().any(|l| l.starts_with("SCAN reservations")) {
                wrong.push(format!("{shape:?} (analyzed: {analyzed}) scans:\n{plan}"));
            }
            if !plan
                .lines()
                .any(|l| l.starts_with("SEARCH reservations USING"))
            {
                wrong.push(format!(
                    "{shape:?} (analyzed: {analyzed}) searches no index:\n{plan}"
                ));
            }
            if plan.contains("TEMP B-TREE FOR ORDER BY") && shape.state != StateFilter::Lapsed {
                wrong.push(format!("{shape:?} (analyzed: {analyzed}) sorts:\n{plan}"));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }
}

/// The sweep's pick and the work gauges on SQLite search an index per kind of work, never
/// scan `reservations` whole (the pick runs on the writer's thread four times a second, so a
/// scan there held every write back). Walking `reservations_payment_work` whole is allowed: it
/// holds only payment work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_and_the_work_gauges_search_indexes_on_sqlite() {
    use holdfast::store::sqlite::{BACKLOG_COUNT, CLAIM_DUE_PICK, OLDEST_WORK_AGE};

    let db = crate::TempDb::fresh();
    drop(db.store().await);
    let mut conn = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
    sqlx::raw_sql(FILL_SQLITE).execute(&mut conn).await.unwrap();
    for analyzed in [false, true] {
        if analyzed {
            sqlx::raw_sql("ANALYZE").execute(&mut conn).await.unwrap();
        }
        let mut wrong = Vec::new();
        for (name, sql) in [
            ("claim", CLAIM_DUE_PICK),
            ("backlog", BACKLOG_COUNT),
            ("oldest", OLDEST_WORK_AGE),
        ] {
            // The store's own statement text: nothing from outside.
            let mut query = sqlx::query_as(AssertSqlSafe(format!("EXPLAIN QUERY PLAN {sql}")));
            if name == "claim" {
                query = query.bind(64_i64);
            }
            let plan: Vec<(i64, i64, i64, String)> = query.fetch_all(&mut conn).await.unwrap();
            let plan: String = plan.into_iter().map(|(.., d)| d + "\n").collect();
            let scans = plan.lines().any(|l| {
                l.starts_with("SCAN reservations")
                    && !l.starts_with("SCAN reservations USING INDEX reservations_payment_work")
            });
            if scans {
                wrong.push(format!("{name} (analyzed: {analyzed}) scans:\n{plan}"));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }
}

/// The hot path's Confirm decision (a HELD reservation, no payment; the one statement of every
/// decided move out of `HELD`, `store/postgres/executor.rs`) settles on a generic plan,
/// as a cached prepared statement should: planned afresh on every call it cost PostgreSQL
/// ~0.1 ms of CPU per Reserve+Confirm (BENCHMARKS.md, "Where the CPU goes"). One pooled
/// connection, so the store's statements and this check share one session's
/// `pg_prepared_statements`.
#[sqlx::test(migrations = false)]
async fn a_confirm_without_payment_is_not_planned_on_every_call(
    options: sqlx::postgres::PgPoolOptions,
    connect: sqlx::postgres::PgConnectOptions,
) {
    let pool = one_connection(options, connect).await;
    let store = crate::postgres(pool.clone()).await;
    const CONFIRMS: i64 = 10;
    for i in 0..CONFIRMS {
        let (r, token) =
            crate::cases::held(&store, &format!("h{i}"), "req", crate::cases::LONG).await;
        let (verdict, after, _) =
            crate::cases::decide(&store, r.id, &token, &crate::cases::confirm()).await;
        assert!(
            matches!(verdict, holdfast::domain::Verdict::Transition { .. }),
            "{verdict:?}"
        );
        assert_eq!(after.state, holdfast::domain::State::Confirming);
    }
    let plans: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements \
         WHERE statement LIKE 'UPDATE reservations SET state = judged.to_state%'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let calls: i64 = plans.iter().map(|(_, g, c)| g + c).sum();
    assert_eq!(
        calls, CONFIRMS,
        "every Confirm ran the statement: {plans:?}"
    );
    let custom: i64 = plans.iter().map(|(_, _, c)| c).sum();
    // PostgreSQL plans a prepared statement's first five runs for their values, then keeps
    // the generic plan unless custom plans look cheaper.
    assert!(
        custom <= 5,
        "{custom} of {CONFIRMS} Confirms were planned afresh: {plans:?}"
    );
    pool.close().await;
}

/// The writes out of `TRYING` (`record_held`, `record_rejected`: the group-committed batch
/// statements, which a call alone runs too) find their rows by primary key under a generic
/// plan, never through an index on `state`. Every reservation passes through `TRYING`, so such
/// an index holds a dead `TRYING` entry for each one until VACUUM, and a bitmap scan of it
/// visits them all on every call (BENCHMARKS.md, "Writes out of TRYING"). Checked on the
/// skewed 120k-row table, where the statistics show no `TRYING` row at all.
#[sqlx::test(migrations = false)]
async fn writes_out_of_trying_find_their_rows_by_id_under_a_generic_plan(
    options: sqlx::postgres::PgPoolOptions,
    connect: sqlx::postgres::PgConnectOptions,
) {
    use holdfast::domain::{BranchState, Rejection};

    let (pool, store) = skewed_store(options, connect).await;
    let (held, _) = crate::cases::create(&store, "alice", "req-held", crate::cases::LONG).await;
    let reports = crate::cases::reports(&held, BranchState::Held, None);
    store.record_held(held.id, &reports).await.unwrap();
    let (refused, _) =
        crate::cases::create(&store, "alice", "req-refused", crate::cases::LONG).await;
    let rejection = Rejection {
        participant: "seats".into(),
        resource: "A1".into(),
        reason: "sold out".into(),
    };
    let reports = crate::cases::reports(&refused, BranchState::Rejected, None);
    store
        .record_rejected(refused.id, Some(&rejection), &reports)
        .await
        .unwrap();

    let mut conn = pool.acquire().await.unwrap();
    // Each write out of TRYING this session prepared.
    let statements = crate::generic_plans::prepared(
        &mut conn,
        &[
            "WITH w AS ( UPDATE reservations SET state = %",
            "%'TRYING'%",
        ],
    )
    .await;
    assert_eq!(
        statements.len(),
        2,
        "record_held's and record_rejected's statements"
    );
    for prepared in &statements {
        let indexes = prepared.indexes("reservations_");
        assert!(
            !indexes.is_empty() && indexes.iter().all(|i| *i == "reservations_pkey"),
            "{}\nfinds its rows through {indexes:?}, not by id alone:\n{}",
            prepared.statement,
            prepared.plan
        );
    }
    drop(conn);
    pool.close().await;
}

/// A Reserve's record (`create`: alone, or a batch) reaches `reservations` only through its
/// holder's live holds (the hold cap's count) under a generic plan on a young table: some
/// rows and no statistics yet, as in a new deployment's first minute (autovacuum's ANALYZE
/// comes later) and in every bench row. A taken request id is the unique key's conflict
/// alone. A `NOT EXISTS` that also looked the request id up was planned there as a walk of
/// other indexes: of every row of the owner in the bench (`reservations_by_owner_state`, a
/// batch of 8 reading ~4,500 buffers; BENCHMARKS.md, "Cold plans"), of the holder's rows here.
#[sqlx::test(migrations = false)]
async fn a_reserves_record_walks_no_owner_index_on_a_young_table(
    options: sqlx::postgres::PgPoolOptions,
    connect: sqlx::postgres::PgConnectOptions,
) {
    let pool = one_connection(options, connect).await;
    let store = crate::postgres(pool.clone()).await;
    // Young: a few seconds of Reserves, and no ANALYZE yet (autovacuum's comes a minute later).
    sqlx::raw_sql(
        "INSERT INTO reservations (id, request_id, holder, state, token_digest, ttl_ms, expires_at) \
         SELECT gen_random_uuid(), 'r', 'old-' || g, 'CONFIRMED', sha256(int8send(g)), 60000, \
                now() + interval '1 minute' \
         FROM generate_series(1, 2000) g",
    )
    .execute(&pool)
    .await
    .unwrap();
    for i in 0..3 {
        crate::cases::create(&store, &format!("h{i}"), "req", crate::cases::LONG).await;
    }
    // A repeat is still answered as the reservation it repeats.
    let new = crate::cases::new_res("h0", "req", crate::cases::LONG);
    let again = store
        .create(&new, crate::cases::lease(), crate::cases::NO_LIMITS)
        .await
        .unwrap();
    assert!(
        matches!(again, holdfast::store::Created::Existing(_)),
        "{again:?}"
    );

    let mut conn = pool.acquire().await.unwrap();
    let statements =
        crate::generic_plans::prepared(&mut conn, &["WITH i AS ( SELECT * FROM UNNEST(%"]).await;
    assert_eq!(statements.len(), 1, "the create statement was prepared");
    let indexes = statements[0].indexes("reservations_");
    assert!(
        !statements[0].plan.contains("Seq Scan on reservations")
            && indexes.iter().all(|i| *i == "reservations_live_by_holder"),
        "walks {indexes:?}, not only the holder's live holds:\n{}",
        statements[0].plan
    );
    drop(conn);
    pool.close().await;
}

/// The sweep's claim (`claim_due`, four times a second by default) and the work gauges
/// (`backlog`, `oldest_work_age`) search the indexes of work that is due, never scan
/// `reservations` whole, under a generic plan on the skewed 120k-row table. Before, an
/// `id IN (subquery)` arm (further payments' refunds) and holds' expiry by a volatile clock
/// left PostgreSQL only a scan of every row: 63 ms a claim at 120k rows, against 0.5 ms by
/// the indexes (BENCHMARKS.md, "Cold plans").
#[sqlx::test(migrations = false)]
async fn the_sweep_and_the_work_gauges_search_the_work_indexes(
    options: sqlx::postgres::PgPoolOptions,
    connect: sqlx::postgres::PgConnectOptions,
) {
    let (pool, store) = skewed_store(options, connect).await;
    // A hold past its expiry is claimed (leased as a lapsed hold) by the sweep.
    let (held, _) = crate::cases::held(&store, "alice", "req", crate::cases::LONG).await;
    sqlx::query("UPDATE reservations SET expires_at = now() - interval '1 s' WHERE id = $1")
        .bind(held.id)
        .execute(&pool)
        .await
        .unwrap();
    assert!(store.backlog().await.unwrap() >= 1);
    let claimed = store.claim_due(crate::cases::lease(), 64).await.unwrap();
    assert!(
        claimed.iter().any(|c| c.id == held.id && c.lapsed_hold),
        "{claimed:?}"
    );
    store.oldest_work_age().await.unwrap();

    let mut conn = pool.acquire().await.unwrap();
    let mut statements = Vec::new();
    for pattern in [
        "WITH due AS (%",
        "SELECT count(*) FROM reservations%",
        "%least(%",
    ] {
        let found = crate::generic_plans::prepared(&mut conn, &[pattern]).await;
        assert_eq!(found.len(), 1, "{pattern}: one statement prepared");
        statements.extend(found);
    }
    let scans: Vec<String> = statements
        .iter()
        .filter(|p| p.plan.contains("Seq Scan on reservations"))
        .map(|p| format!("{}\n{}", p.statement, p.plan))
        .collect();
    assert!(
        scans.is_empty(),
        "{} statements scan every reservation:\n\n{}",
        scans.len(),
        scans.join("\n\n")
    );
    drop(conn);
    pool.close().await;
}

/// A migrated store on one connection (as [`one_connection`]) over the skewed 120k-row table.
pub(crate) async fn skewed_store(
    options: sqlx::postgres::PgPoolOptions,
    connect: sqlx::postgres::PgConnectOptions,
) -> (PgPool, std::sync::Arc<dyn holdfast::store::Store>) {
    let pool = one_connection(options, connect).await;
    let store = crate::postgres(pool.clone()).await;
    sqlx::raw_sql(FILL_PG).execute(&pool).await.unwrap();
    (pool, store)
}

/// A pool of one connection, planning as holdfast's own sessions do
/// (`db::with_planner_costs`): the store's statements and the test's checks share one
/// session (its `pg_prepared_statements`).
async fn one_connection(
    options: sqlx::postgres::PgPoolOptions,
    connect: sqlx::postgres::PgConnectOptions,
) -> PgPool {
    options
        .max_connections(1)
        .connect_with(holdfast::db::with_planner_costs(connect))
        .await
        .unwrap()
}
