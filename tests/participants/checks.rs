//! The participants' schema on PostgreSQL (the barrier's and the reference participants' tables)
//! names each CHECK constraint's allowed values as one array constant, never as
//! `col IN ('a', 'b')`: PostgreSQL plans a table's CHECK expressions again in every statement
//! that writes it, and folds an `ARRAY[...]` of literals through the executor each time (barrier
//! migration `0091`, participants' `0068`). The rewritten constraints refuse what the old ones
//! refused.

use sqlx::PgPool;

#[sqlx::test(migrations = false)]
async fn no_check_is_folded_in_every_statement(pool: PgPool) {
    holdfast::participants::MIGRATOR.run(&pool).await.unwrap();
    crate::folded_checks::assert_none_folded(&pool).await;
}

#[sqlx::test(migrations = false)]
async fn the_rewritten_checks_refuse_what_they_refused(pool: PgPool) {
    holdfast::participants::MIGRATOR.run(&pool).await.unwrap();
    sqlx::query(
        "INSERT INTO tcc_barrier (participant, reservation_id, branch_id, state, try_answer) \
         SELECT 'noop', s, 'b', s, 'held' \
         FROM unnest('{trying,held,rejected,confirmed,cancelled,hold_lost}'::text[]) s",
    )
    .execute(&pool)
    .await
    .unwrap();
    for (sql, constraint) in [
        (
            "UPDATE tcc_barrier SET state = 'sold' WHERE reservation_id = 'held'",
            "tcc_barrier_state_check",
        ),
        (
            "UPDATE tcc_barrier SET try_answer = 'maybe' WHERE reservation_id = 'held'",
            "tcc_barrier_try_answer_check",
        ),
        (
            "INSERT INTO seat (resource, state, branch_id) VALUES ('A1', 'sold', 'b')",
            "seat_state_check",
        ),
    ] {
        assert_eq!(
            crate::folded_checks::refusal(&pool, sql).await,
            ("23514".to_owned(), constraint.to_owned()),
            "{sql}"
        );
    }
    sqlx::query("UPDATE tcc_barrier SET try_answer = 'rejected' WHERE reservation_id = 'held'")
        .execute(&pool)
        .await
        .unwrap();
}
