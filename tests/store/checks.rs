//! The coordinator's CHECK constraints and trigger conditions on PostgreSQL name their allowed
//! values as one array constant (`col = ANY ('{A,B}'::text[])`), never as `col IN ('A', 'B')`:
//! PostgreSQL plans a table's CHECK expressions (and a row trigger's WHEN) again in every
//! statement that writes the table, and folds an `ARRAY[...]` of literals by running it through
//! the executor each time (migration `0017`). The rewritten constraints refuse what the old ones
//! refused.

use holdfast::store::PgStore;
use sqlx::PgPool;

#[sqlx::test(migrations = false)]
async fn no_check_or_trigger_condition_is_folded_in_every_statement(pool: PgPool) {
    PgStore::from_pool(pool.clone()).migrate().await.unwrap();
    crate::folded_checks::assert_none_folded(&pool).await;
}

#[sqlx::test(migrations = false)]
async fn the_rewritten_checks_refuse_what_they_refused(pool: PgPool) {
    PgStore::from_pool(pool.clone()).migrate().await.unwrap();
    // Accepted: every state a reservation may be in, no release outcome, no refund.
    sqlx::query(
        "INSERT INTO reservations (id, request_id, holder, owner, state, token_digest, ttl_ms, \
           expires_at) \
         SELECT gen_random_uuid(), s, 'h', 'shop', s, sha256(s::bytea), 60000, now() \
         FROM unnest('{TRYING,HELD,CONFIRMING,CONFIRMED,CANCELLING,CANCELLED,EXPIRED,REJECTED,\
                      FAILED,QUEUED}'::text[]) s",
    )
    .execute(&pool)
    .await
    .unwrap();
    let check = |name: &str| ("23514".to_owned(), name.to_owned());
    let cases: [(&'static str, &str); 5] = [
        (
            "UPDATE reservations SET state = 'SOLD' WHERE request_id = 'HELD'",
            "reservations_state_check",
        ),
        (
            "UPDATE reservations SET release_outcome = 'LOST' WHERE request_id = 'CANCELLED'",
            "reservations_release_outcome_check",
        ),
        (
            "UPDATE reservations SET refund_state = 'MAYBE' WHERE request_id = 'EXPIRED'",
            "reservations_refund_state_check",
        ),
        (
            "INSERT INTO branches (reservation_id, generation, position, branch_id, participant, \
               resource, quantity, state) \
             SELECT id, 0, 0, gen_random_uuid(), 'seats', 'A1', 1, 'LOST' FROM reservations \
             WHERE request_id = 'HELD'",
            "branches_state_check",
        ),
        (
            "INSERT INTO admin_audit (principal, action) VALUES ('ops', 'undo')",
            "admin_audit_action_check",
        ),
    ];
    for (sql, constraint) in cases {
        assert_eq!(
            crate::folded_checks::refusal(&pool, sql).await,
            check(constraint),
            "{sql}"
        );
    }
    // And a value each allows is still allowed.
    sqlx::query(
        "UPDATE reservations SET release_outcome = 'QUEUED', refund_state = 'FAILED' \
         WHERE request_id = 'CANCELLED'",
    )
    .execute(&pool)
    .await
    .unwrap();
}
