//! A reservation's branches come back in canonical order (position), however their rows lie in
//! the table, and a reservation whose stored positions contradict canonical order is refused as
//! corrupt rather than handed out to be placed or released in the wrong order. PostgreSQL: the
//! statements aggregate the branch columns from one subquery ordered by position
//! (`branch_arrays!`), and the store checks what it reads.

use holdfast::store::{PgStore, Store, StoreError};
use sqlx::PgPool;
use uuid::Uuid;

/// A HELD reservation `$1` with branches on participants `$2` at positions 0, 1, 2, inserted
/// last position first (the heap's order is the reverse of canonical order).
const SEED: &str = "
WITH r AS (
    INSERT INTO reservations (id, request_id, holder, owner, state, token_digest, ttl_ms,
                              expires_at)
    VALUES ($1, 'order-1', 'h', 'shop', 'HELD', sha256('t'::bytea), 600000,
            now() + interval '10 minutes')
    RETURNING id)
INSERT INTO branches (reservation_id, generation, position, branch_id, participant, resource,
                      quantity, state)
SELECT r.id, 0, (p.ordinal - 1)::int, gen_random_uuid(), p.participant, 'A', 1, 'HELD'
FROM r, unnest($2::text[]) WITH ORDINALITY AS p(participant, ordinal)
ORDER BY p.ordinal DESC";

async fn seeded(pool: &PgPool, participants: &[&str]) -> (PgStore, Uuid) {
    let store = PgStore::from_pool(pool.clone());
    store.migrate().await.unwrap();
    let id = Uuid::new_v4();
    sqlx::query(SEED)
        .bind(id)
        .bind(participants)
        .execute(pool)
        .await
        .unwrap();
    (store, id)
}

#[sqlx::test(migrations = false)]
async fn branches_come_back_in_position_order_whatever_the_heap_order(pool: PgPool) {
    let (store, id) = seeded(&pool, &["a", "b", "c"]).await;
    let r = store.get(id).await.unwrap().expect("the reservation");
    let order: Vec<&str> = r
        .branches
        .iter()
        .map(|b| b.hold.participant.as_str())
        .collect();
    assert_eq!(order, ["a", "b", "c"]);
}

#[sqlx::test(migrations = false)]
async fn positions_against_canonical_order_are_refused_as_corrupt(pool: PgPool) {
    let (store, id) = seeded(&pool, &["b", "a", "c"]).await;
    match store.get(id).await {
        Err(StoreError::Corrupt(why)) => assert!(why.contains("canonical order"), "{why}"),
        other => panic!("a reservation read out of canonical order: {other:?}"),
    }
}
