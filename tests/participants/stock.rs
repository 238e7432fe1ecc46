//! `stock`: a flash sale on few units, and resizing.

use std::time::Duration;

use holdfast::participants::{Kind, ParticipantSettings};
use holdfast::proto::branch;
use holdfast::proto::try_response::Outcome;
use holdfast::proto::{PutResourcesRequest, ResourceSpec, TryResponse};
use sqlx::PgPool;

use crate::common::*;

crate::parallel::parallel_test!(storm_holds_exactly_the_capacity => storm_holds_exactly_the_capacity_on);
async fn storm_holds_exactly_the_capacity_on(pool: PgPool) {
    for db in Db::both(&pool).await {
        let mut p = spawn_on(Kind::Stock, &db).await;
        p.put("sku-1", 10).await;
        let requests: Vec<_> = (0..100)
            .map(|_| try_request(vec![hold("sku-1", 1, None)]))
            .collect();
        let (answers, checks) = storm(&p, requests, admin_checker(&p, "sku-1", 10)).await;
        assert!(checks >= 1);
        assert_eq!(count(&answers, Outcome::Held), 10);
        assert_eq!(count(&answers, Outcome::Rejected), 90);
        assert_eq!(counts(&mut p, "sku-1").await, (0, 10, 0));
        let rows = db
            .scalar("SELECT CAST(coalesce(sum(quantity), 0) AS BIGINT) FROM stock_hold WHERE state = 'held'")
            .await;
        assert_eq!(rows, 10, "hold rows agree with the counter");
        p.stop().await;
    }
}

/// A Confirm moves its hold row only: it does not queue for the item's row lock, which every
/// Try of the item takes (in a flash sale the winners' Confirms took turns with the Tries).
#[sqlx::test(migrations = false)]
async fn a_confirm_does_not_wait_for_the_items_row_lock(pool: PgPool) {
    let mut p = spawn_participant(Kind::Stock, pool.clone()).await;
    p.put("sku-1", 5).await;
    let req = try_request(vec![hold("sku-1", 2, None)]);
    assert_eq!(outcome(&p.try_(req.clone()).await), Outcome::Held);
    // Another Try of the item is under way: its row lock, held here.
    let busy = lock_items(&pool, &["sku-1"]).await;
    let confirmed = tokio::time::timeout(Duration::from_secs(10), p.confirm(&req))
        .await
        .expect("the Confirm waited for the item's row lock");
    assert_eq!(confirmed, branch::State::Confirmed);
    busy.commit().await.unwrap();
    assert_eq!(counts(&mut p, "sku-1").await, (3, 0, 2));
    // Resizing counts the confirmed units as out.
    p.put("sku-1", 4).await;
    assert_eq!(counts(&mut p, "sku-1").await, (2, 0, 2));
    p.stop().await;
}

/// Locks the items' rows in a transaction of the test's own, as a Try under way would.
async fn lock_items(pool: &PgPool, items: &[&str]) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut busy = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM stock_item WHERE resource = ANY($1) ORDER BY resource FOR UPDATE")
        .bind(items)
        .execute(&mut *busy)
        .await
        .unwrap();
    busy
}

/// A Try in flight, in a task of its own.
type TryCall = tokio::task::JoinHandle<Result<tonic::Response<TryResponse>, tonic::Status>>;

/// `n` Tries of one unit of `resource`, each from a client of its own, all in flight.
async fn spawn_tries(p: &Running, n: usize, resource: &str) -> Vec<TryCall> {
    let mut tries = Vec::new();
    for _ in 0..n {
        let mut client = p.new_client().await;
        let req = try_request(vec![hold(resource, 1, None)]);
        tries.push(tokio::spawn(async move { client.r#try(req).await }));
    }
    tries
}

/// How many of the Tries were answered `Held` (each must be answered).
async fn held_of(tries: Vec<TryCall>) -> usize {
    let mut held = 0;
    for answer in tries {
        let answer = answer.await.unwrap().expect("a Try").into_inner();
        if outcome(&answer) == Outcome::Held {
            held += 1;
        }
    }
    held
}

/// A batch of Tries waiting for its items' locks (`stock`'s `try_hold_batch`).
const BATCH_WAITS_FOR_ITEMS: &str = "SELECT resource, available FROM stock_item%";

/// A first Try of several items (the general way: a transaction) writes its barrier row
/// before its business change, so the items' row locks are held over the stock statements and
/// the commit only, not over the barrier write. Here one Try's barrier write is made to wait
/// (an uncommitted row for its branch); another Try of the same item must not wait behind it.
#[sqlx::test(migrations = false)]
async fn a_try_does_not_hold_the_items_row_lock_over_its_barrier_write(pool: PgPool) {
    let mut p = spawn_participant(Kind::Stock, pool.clone()).await;
    let mut watcher = pool.acquire().await.unwrap();
    p.put("sku-1", 5).await;
    p.put("sku-2", 5).await;
    let slow = try_request(vec![hold("sku-1", 1, None), hold("sku-2", 1, None)]);
    let mut blocker = pool.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO tcc_barrier (participant, reservation_id, branch_id, state) \
         VALUES ('stock', $1, $2, 'trying')",
    )
    .bind(&slow.reservation_id)
    .bind(&slow.branch_id)
    .execute(&mut *blocker)
    .await
    .unwrap();
    let mut client = p.new_client().await;
    let slow_try = tokio::spawn({
        let slow = slow.clone();
        async move { client.r#try(slow).await }
    });
    until_waiting(
        &mut watcher,
        "INSERT INTO tcc_barrier%",
        "the slow Try never waited for its barrier row",
    )
    .await;
    let other = try_request(vec![hold("sku-1", 2, None)]);
    let held = tokio::time::timeout(Duration::from_secs(10), p.try_(other))
        .await
        .expect("the Try waited for the item's row lock, held over another Try's barrier write");
    assert_eq!(outcome(&held), Outcome::Held);
    blocker.rollback().await.unwrap();
    let slow_answer = slow_try.await.unwrap().expect("the slow Try").into_inner();
    assert_eq!(outcome(&slow_answer), Outcome::Held);
    assert_eq!(counts(&mut p, "sku-1").await, (2, 3, 0));
    assert_eq!(counts(&mut p, "sku-2").await, (4, 1, 0));
    p.stop().await;
}

/// A first Try of one item is one autocommit statement: the stock change, its hold row and
/// the barrier row. The item's row lock is then held inside PostgreSQL only, never while the
/// participant gets round to sending a COMMIT (a flash sale queued on exactly that). Seen
/// from `pg_stat_activity`: the Try waiting for the item's lock is running the statement that
/// also inserts the barrier row. Before, it was the stock statement alone, in a transaction
/// begun earlier (BEGIN, the barrier row, then this, then COMMIT).
#[sqlx::test(migrations = false)]
async fn a_one_item_try_is_one_statement_with_its_barrier_row(pool: PgPool) {
    let mut p = spawn_participant(Kind::Stock, pool.clone()).await;
    let mut watcher = pool.acquire().await.unwrap();
    p.put("sku-1", 5).await;
    let busy = lock_items(&pool, &["sku-1"]).await;
    let req = try_request(vec![hold("sku-1", 2, None)]);
    let mut client = p.new_client().await;
    let waiting_try = tokio::spawn({
        let req = req.clone();
        async move { client.r#try(req).await }
    });
    until_waiting(
        &mut watcher,
        "%UPDATE stock_item%INSERT INTO tcc_barrier%",
        "no Try waited for the item's lock in one statement with its barrier row",
    )
    .await;
    busy.commit().await.unwrap();
    let answer = waiting_try.await.unwrap().expect("the Try").into_inner();
    assert_eq!(outcome(&answer), Outcome::Held);
    let same_transaction: bool = sqlx::query_scalar(
        "SELECT (SELECT xmin::text FROM tcc_barrier WHERE branch_id = $1) \
              = (SELECT xmin::text FROM stock_hold WHERE branch_id = $1)",
    )
    .bind(&req.branch_id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        same_transaction,
        "the barrier row and the hold row commit together"
    );
    assert_eq!(counts(&mut p, "sku-1").await, (3, 2, 0));
    // A repeat finds the row and takes no lock of the item (held here again).
    let busy = lock_items(&pool, &["sku-1"]).await;
    let repeat = tokio::time::timeout(Duration::from_secs(10), p.try_(req))
        .await
        .expect("the repeat waited for the item's row lock");
    assert_eq!(outcome(&repeat), Outcome::Held);
    busy.commit().await.unwrap();
    assert_eq!(counts(&mut p, "sku-1").await, (3, 2, 0));
    p.stop().await;
}

/// Concurrent first Tries of an item are held in batches: one transaction locks the item
/// once for the whole batch, instead of each Try queuing for the lock in turn. Here the
/// item's lock is held by the test while 12 Tries arrive: the first runs alone, the second is
/// a batch of one, and the rest queue behind that batch while it waits for the lock. After
/// the lock is released, exactly the 10 units are held, and several held branches share one
/// transaction (their barrier rows' `xmin`). Before, every Try was a transaction of its own.
#[sqlx::test(migrations = false)]
async fn concurrent_first_tries_of_an_item_are_held_in_one_transaction(pool: PgPool) {
    let mut p = spawn_participant(Kind::Stock, pool.clone()).await;
    let mut watcher = pool.acquire().await.unwrap();
    p.put("sku-1", 10).await;
    let busy = lock_items(&pool, &["sku-1"]).await;
    let tries = spawn_tries(&p, 12, "sku-1").await;
    until_waiting(
        &mut watcher,
        BATCH_WAITS_FOR_ITEMS,
        "no batch of Tries waited for the item's lock",
    )
    .await;
    busy.commit().await.unwrap();
    let held = held_of(tries).await;
    assert_eq!(held, 10);
    assert_eq!(counts(&mut p, "sku-1").await, (0, 10, 0));
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT state, count(*) FROM tcc_barrier GROUP BY state ORDER BY state")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(rows, [("held".to_owned(), 10), ("rejected".to_owned(), 2)]);
    let shared: i64 = sqlx::query_scalar(
        "SELECT max(n) FROM (SELECT count(*) AS n FROM tcc_barrier WHERE state = 'held' \
         GROUP BY xmin::text) t",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(shared >= 2, "no two held Tries shared a transaction");
    // A batch records its refusals in its own transaction, with its holds.
    let refused_with_holds: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM tcc_barrier r WHERE r.state = 'rejected' AND EXISTS ( \
             SELECT 1 FROM tcc_barrier h WHERE h.state = 'held' AND h.xmin::text = r.xmin::text)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(
        refused_with_holds >= 1,
        "no refusal was recorded with its batch"
    );
    p.stop().await;
}

/// A batch that refuses Tries while an orphaned hold exists records nothing for them: each
/// Try reclaims the orphan and tries again, as a refused Try alone does. Here the item's one
/// unit is held by an orphan (past its deadline, no grace); three Tries arrive while the item
/// is locked by the test, behind a fourth Try of another item (also locked) that keeps them
/// from running alone: they are refused in batches, the orphan is reclaimed, and one of them
/// holds the unit. Recording the batch's refusals regardless would have refused all three.
#[sqlx::test(migrations = false)]
async fn a_batch_refused_while_an_orphan_exists_reclaims_it_and_tries_again(pool: PgPool) {
    let settings = ParticipantSettings {
        orphan_grace: Duration::ZERO,
        ..ParticipantSettings::new(Kind::Stock)
    };
    let mut p = spawn_with(settings, pool.clone()).await;
    let mut watcher = pool.acquire().await.unwrap();
    p.put("sku-1", 1).await;
    p.put("sku-2", 5).await;
    let mut orphan = try_request(vec![hold("sku-1", 1, None)]);
    orphan.expires_at = Some(from_now(-60));
    assert_eq!(outcome(&p.try_(orphan.clone()).await), Outcome::Held);
    let busy = lock_items(&pool, &["sku-1", "sku-2"]).await;
    let mut client = p.new_client().await;
    let first = tokio::spawn(async move {
        client
            .r#try(try_request(vec![hold("sku-2", 1, None)]))
            .await
    });
    until_waiting(
        &mut watcher,
        "%UPDATE stock_item%",
        "the Try of sku-2 never waited for its item",
    )
    .await;
    let tries = spawn_tries(&p, 3, "sku-1").await;
    until_waiting(
        &mut watcher,
        BATCH_WAITS_FOR_ITEMS,
        "no batch of Tries waited for sku-1",
    )
    .await;
    busy.commit().await.unwrap();
    let held = held_of(tries).await;
    assert_eq!(held, 1, "the orphan's unit went to one of the Tries");
    let first = first.await.unwrap().expect("the Try of sku-2").into_inner();
    assert_eq!(outcome(&first), Outcome::Held);
    assert_eq!(p.confirm(&orphan).await, branch::State::HoldLost);
    assert_eq!(counts(&mut p, "sku-1").await, (0, 1, 0));
    p.stop().await;
}

#[sqlx::test(migrations = false)]
async fn resize_below_what_is_held_is_refused(pool: PgPool) {
    let mut p = spawn_participant(Kind::Stock, pool.clone()).await;
    p.put("sku-1", 5).await;
    let req = try_request(vec![hold("sku-1", 3, None)]);
    assert_eq!(outcome(&p.try_(req).await), Outcome::Held);
    let err = p
        .admin
        .put_resources(PutResourcesRequest {
            resources: vec![ResourceSpec {
                resource: "sku-1".into(),
                capacity: 2,
            }],
        })
        .await
        .expect_err("resize below held");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert_eq!(counts(&mut p, "sku-1").await, (2, 3, 0));
    p.put("sku-1", 8).await;
    assert_eq!(counts(&mut p, "sku-1").await, (5, 3, 0));
    p.stop().await;
}
