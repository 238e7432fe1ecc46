//! Migration 0005 on SQLite rebuilds `reservations`, `branches` and `extra_payments` (SQLite
//! cannot alter a CHECK constraint) with foreign keys on: every row survives, the references
//! still cascade, and a refund may now be FAILED.

use std::str::FromStr;

use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};

#[tokio::test]
async fn the_refund_failed_rebuild_keeps_every_row_and_reference() {
    let db = crate::TempDb::fresh();
    let options = SqliteConnectOptions::from_str(&db.url)
        .unwrap()
        .create_if_missing(true)
        .foreign_keys(true);
    let pool = SqlitePool::connect_with(options).await.unwrap();
    let migrator = sqlx::migrate!("crates/holdfast-coordinator/migrations/coordinator-sqlite");
    migrator.run_to(4, &pool).await.unwrap();
    let (a, b) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    for (id, request_id) in [(a, "r-a"), (b, "r-b")] {
        sqlx::query(
            "INSERT INTO reservations (id, request_id, holder, state, release_outcome, token_digest, \
               ttl_ms, expires_at, payment_participant, payment_ref, payment_amount_minor, \
               payment_currency, refund_id, refund_state, refund_reason) \
             VALUES (?1, ?2, 'alice', 'CANCELLED', 'CANCELLED', zeroblob(32), 60000, 0, \
               'payments', ?2, 100, 'EUR', ?3, 'PENDING', 'closed')",
        )
        .bind(id)
        .bind(request_id)
        .bind(uuid::Uuid::new_v4())
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO branches (reservation_id, position, branch_id, participant, resource, \
               quantity, state) VALUES (?1, 0, ?2, 'seats', 'A1', 1, 'CANCELLED')",
        )
        .bind(id)
        .bind(uuid::Uuid::new_v4())
        .execute(&pool)
        .await
        .unwrap();
    }
    sqlx::query(
        "INSERT INTO extra_payments (payment_participant, payment_ref, reservation_id, \
           amount_minor, currency, refund_id, refund_state, refund_reason) \
         VALUES ('payments', 'extra-1', ?1, 50, 'EUR', ?2, 'PENDING', 'further')",
    )
    .bind(a)
    .bind(uuid::Uuid::new_v4())
    .execute(&pool)
    .await
    .unwrap();

    // The coordinator's own migration run applies 0005 (and whatever follows).
    drop(db.store().await);

    let counts = async || -> (i64, i64, i64) {
        sqlx::query_as(
            "SELECT (SELECT count(*) FROM reservations), (SELECT count(*) FROM branches), \
                    (SELECT count(*) FROM extra_payments)",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    assert_eq!(counts().await, (2, 2, 1));
    let fk: Vec<(String,)> = sqlx::query_as("SELECT \"table\" FROM pragma_foreign_key_check")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert!(fk.is_empty(), "{fk:?}");
    // FAILED is allowed now, with its reason.
    sqlx::query(
        "UPDATE reservations SET refund_state = 'FAILED', refund_failure = 'no' WHERE id = ?1",
    )
    .bind(b)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("UPDATE extra_payments SET refund_state = 'FAILED', refund_failure = 'no'")
        .execute(&pool)
        .await
        .unwrap();
    assert!(
        sqlx::query("UPDATE reservations SET refund_state = 'LOST' WHERE id = ?1")
            .bind(b)
            .execute(&pool)
            .await
            .is_err(),
        "the CHECK still holds"
    );
    // The references still point at the rebuilt table and cascade.
    sqlx::query("DELETE FROM reservations WHERE id = ?1")
        .bind(a)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(counts().await, (1, 1, 0));
}
