//! The barrier's statements that move or read one branch's row (Try, Confirm, Cancel, Extend:
//! alone, batched, or in a resource's one statement) find it by primary key under a generic
//! plan. `tcc_barrier_orphans` indexes a participant's held rows (for the reclaim sweep); a
//! statement that reached the branch's row through it would visit every held row of the
//! participant, and their dead entries, on every call: a Confirm's cost growing with the holds
//! outstanding (2.7 ms against 0.07 ms at 20,000, BENCHMARKS.md). Checked on a table whose
//! statistics show no held row, as after a quiet hour.

use holdfast::participants::Kind;
use holdfast::proto::branch::State;
use holdfast::proto::try_response::Outcome;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::common::*;

#[sqlx::test(migrations = false)]
async fn a_branchs_barrier_row_is_found_by_key_under_a_generic_plan(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = one_connection(options, connect).await;
    sqlx::raw_sql(
        "INSERT INTO tcc_barrier (participant, reservation_id, branch_id, state, try_answer, items) \
         SELECT p, 'old-' || g, 'b', 'confirmed', 'held', '[]' \
         FROM generate_series(1, 20000) g, unnest(ARRAY['stock', 'seats', 'payments', 'noop']) p; \
         ANALYZE tcc_barrier",
    )
    .execute(&pool)
    .await
    .unwrap();
    // Each kind settles its held branches its own way: `stock` and `seats` in one statement,
    // `payments` in a transaction, `noop` in the barrier-only statements; each is also
    // extended, and one branch of each kind cancelled.
    for kind in [Kind::Stock, Kind::Seats, Kind::Payments, Kind::Noop] {
        let mut p = spawn_participant(kind, pool.clone()).await;
        let f = fixture(kind);
        for (i, confirm) in [(1, true), (2, false)] {
            let resource = format!("{}-{i}", f.resource);
            p.put(&resource, f.capacity).await;
            let mut hold = f.hold();
            hold.resource = resource;
            let req = try_request(vec![hold]);
            assert_eq!(
                outcome(&p.try_(req.clone()).await),
                Outcome::Held,
                "{kind:?}"
            );
            assert_eq!(p.extend(&req, from_now(600)).await.unwrap(), State::Held);
            let state = if confirm {
                p.confirm(&req).await
            } else {
                p.cancel(&req).await
            };
            assert!(
                matches!(state, State::Confirmed | State::Cancelled),
                "{kind:?}"
            );
        }
        p.stop().await;
    }

    let mut conn = pool.acquire().await.unwrap();
    // Each barrier statement naming one branch that this session prepared.
    let statements =
        crate::generic_plans::prepared(&mut conn, &["%tcc_barrier%", "%branch_id = %"]).await;
    let moves = statements
        .iter()
        .filter(|p| p.statement.contains("'held'"))
        .count();
    assert!(
        moves >= 4,
        "the held branches' moves (one statement, general way, barrier only, Extend): {:#?}",
        statements.iter().map(|p| &p.statement).collect::<Vec<_>>()
    );
    let off_key: Vec<String> = statements
        .iter()
        .filter(|p| {
            p.indexes("tcc_barrier_")
                .iter()
                .any(|i| *i != "tcc_barrier_pkey")
        })
        .map(|p| format!("{}\nwalks:\n{}", p.statement, p.plan))
        .collect();
    assert!(
        off_key.is_empty(),
        "{} statements find their branch's row not by key alone:\n\n{}",
        off_key.len(),
        off_key.join("\n\n")
    );
    drop(conn);
    pool.close().await;
}

/// A batch of barrier-only moves (concurrent Confirms on one participant, `advance_held_batch`)
/// finds each branch's row by its whole key under a generic plan on a young table: rows, and
/// no statistics yet, as in a participant's first minute (autovacuum's ANALYZE comes later) and
/// in every bench row. With `participant = $1` a restriction of its own, PostgreSQL estimated
/// it at one row there, so it read every row of the participant and hash-joined the batch to
/// them: ~400 buffers a batch at 7,000 rows, growing with the table (BENCHMARKS.md, "Cold
/// plans"). The participant now comes with each key.
#[sqlx::test(migrations = false)]
async fn a_batch_of_barrier_moves_finds_each_row_by_key_on_a_young_table(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let pool = one_connection(options, connect).await;
    sqlx::raw_sql(
        "INSERT INTO tcc_barrier (participant, reservation_id, branch_id, state, try_answer, items) \
         SELECT 'noop', 'old-' || g, 'b', 'confirmed', 'held', '[]' \
         FROM generate_series(1, 2000) g",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut p = spawn_participant(Kind::Noop, pool.clone()).await;
    let f = fixture(Kind::Noop);
    let mut held = Vec::new();
    for _ in 0..24 {
        let req = try_request(vec![f.hold()]);
        assert_eq!(outcome(&p.try_(req.clone()).await), Outcome::Held);
        held.push(req);
    }
    // All at once: on the one connection they queue behind the first and go as batches.
    let confirms = held.iter().map(|req| {
        let mut client = p.participant.clone();
        async move {
            let answer = client.confirm(branch_request(req)).await.expect("confirm");
            State::try_from(answer.into_inner().state).expect("state")
        }
    });
    let states = futures_util::future::join_all(confirms).await;
    assert!(states.iter().all(|s| *s == State::Confirmed), "{states:?}");
    p.stop().await;

    let mut conn = pool.acquire().await.unwrap();
    let batches =
        crate::generic_plans::prepared(&mut conn, &["UPDATE tcc_barrier b SET state = $4%"]).await;
    assert_eq!(batches.len(), 1, "the Confirms went as batches");
    let plan = &batches[0].plan;
    let by_key = plan
        .lines()
        .filter(|l| l.contains("Index Cond") && l.contains("participant"))
        .all(|l| l.contains("branch_id"));
    assert!(
        by_key && !plan.contains("Seq Scan on tcc_barrier") && !plan.contains("Hash Join"),
        "the batch reaches its rows not by their whole key:\n{plan}"
    );
    drop(conn);
    pool.close().await;
}

/// One connection, migrated: the participants' statements and the checks share its session
/// (its `pg_prepared_statements`), planning as holdfast's own sessions do.
async fn one_connection(options: PgPoolOptions, connect: PgConnectOptions) -> sqlx::PgPool {
    let pool = options
        .max_connections(1)
        .connect_with(holdfast::db::with_planner_costs(connect))
        .await
        .unwrap();
    holdfast::participants::MIGRATOR.run(&pool).await.unwrap();
    pool
}
