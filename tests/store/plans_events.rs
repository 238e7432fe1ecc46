//! A sink's page of events reads the branches of the page's events only, once per reservation
//! generation, and puts them beside their events without comparing every event with every
//! reservation of the page, however long the log after its cursor and whatever the table's
//! statistics: the exact statement the PostgreSQL store runs, on a log never analyzed
//! (autovacuum off or not yet run), by `EXPLAIN ANALYZE`.

use holdfast::store::PgStore;
use holdfast::store::postgres::EVENTS_AFTER;
use sqlx::{AssertSqlSafe, PgPool};

/// Reservations with two branches each, moved TRYING -> HELD -> CONFIRMING -> CONFIRMED, one
/// statement per step, one reservation after the other: four adjacent events each (16,000 in
/// all), as a workload's Reserve and Confirm leave them.
const FILL: &str = "
DO $$
DECLARE r uuid;
BEGIN
  FOR g IN 1..4000 LOOP
    r := gen_random_uuid();
    INSERT INTO reservations (id, request_id, holder, owner, state, token_digest, ttl_ms,
                              expires_at)
    VALUES (r, 'r' || g, 'h', 'shop', 'TRYING', sha256(int8send(g)), 600000,
            now() + interval '10 minutes');
    INSERT INTO branches (reservation_id, generation, position, branch_id, participant,
                          resource, quantity, state)
    SELECT r, 0, p, gen_random_uuid(), 'seats', 'A' || p, 1, 'HELD' FROM generate_series(0, 1) p;
    UPDATE reservations SET state = 'HELD' WHERE id = r;
    UPDATE reservations SET state = 'CONFIRMING' WHERE id = r;
    UPDATE reservations SET state = 'CONFIRMED' WHERE id = r;
  END LOOP;
END $$;
";

#[sqlx::test(migrations = false)]
async fn a_page_of_events_reads_only_its_own_events_branches(pool: PgPool) {
    PgStore::from_pool(pool.clone()).migrate().await.unwrap();
    let mut conn = pool.acquire().await.unwrap();
    // A sink's pooled connection: the statement prepared and planned generically while the log
    // was empty, the plan kept as the log grows (nothing analyzes it). The store's own
    // statement text: nothing from outside.
    sqlx::raw_sql(AssertSqlSafe(format!(
        "SET plan_cache_mode = force_generic_plan; \
         PREPARE page (bigint, text, bigint) AS {EVENTS_AFTER}; \
         EXECUTE page (0, NULL, 500);"
    )))
    .execute(&mut *conn)
    .await
    .unwrap();
    sqlx::raw_sql(FILL).execute(&mut *conn).await.unwrap();
    let (events,): (i64,) = sqlx::query_as("SELECT count(*) FROM events")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(events, 16_000);
    let plan: Vec<(String,)> = sqlx::query_as("EXPLAIN ANALYZE EXECUTE page (0, NULL, 500)")
        .fetch_all(&mut *conn)
        .await
        .unwrap();
    let plan: String = plan.into_iter().map(|(l,)| l + "\n").collect();
    let branch_reads: Vec<u64> = plan
        .lines()
        .filter(|l| l.contains(" on branches"))
        .filter_map(|l| l.split("loops=").nth(1))
        .filter_map(|n| n.trim_end_matches(')').parse().ok())
        .collect();
    assert!(!branch_reads.is_empty(), "no read of branches in:\n{plan}");
    // 500 events of 125 reservation generations: each generation's branches are read once,
    // by its first event, and shared by the other three.
    assert!(
        branch_reads.iter().all(|&loops| loops <= 125),
        "a 500-event page (a sink's) of 125 generations read branches {branch_reads:?} times:\n{plan}"
    );
    // A join that compares each event with each reservation of the page (a nested loop over
    // two materialized sets the planner expects one row of) removes about 500 x 500 rows.
    let compared: u64 = plan
        .lines()
        .filter_map(|l| l.split("Rows Removed by Join Filter:").nth(1))
        .filter_map(|n| n.trim().parse::<u64>().ok())
        .sum();
    assert!(
        compared <= 500,
        "a 500-event page compared {compared} pairs to join its branches:\n{plan}"
    );
}
