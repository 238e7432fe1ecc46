//! A held branch's Confirm or Cancel on PostgreSQL `seats` and `stock`: one autocommit
//! statement that moves the barrier row and the business rows together, and the general way
//! (a transaction) only when that statement cannot make the change whole.

use holdfast::participants::Kind;
use holdfast::proto::branch::State;
use holdfast::proto::try_response::Outcome;
use sqlx::PgPool;

use crate::common::*;

/// The one statement, as `pg_stat_activity` shows it.
const ONE_STATEMENT: &str = "WITH moved AS (UPDATE tcc_barrier b %";

/// The business row a branch holds, for a lock the test takes.
fn business_row(kind: Kind) -> &'static str {
    match kind {
        Kind::Seats => "SELECT 1 FROM seat WHERE resource = $1 FOR UPDATE",
        _ => "SELECT 1 FROM stock_hold WHERE resource = $1 FOR UPDATE",
    }
}

/// The call waits for the business row the test holds inside the one statement that also
/// moves the barrier row (the general way waits in a business UPDATE of its own, sent after
/// the barrier's), and ends as it would have on the general way: answered, the counts moved,
/// a repeat answered the same.
#[sqlx::test(migrations = false)]
async fn a_held_branch_is_confirmed_or_cancelled_in_one_statement(pool: PgPool) {
    let mut watcher = pool.acquire().await.unwrap();
    for (kind, units) in [(Kind::Seats, 1), (Kind::Stock, 5)] {
        let mut p = spawn_participant(kind, pool.clone()).await;
        for (resource, confirm) in [("A1", true), ("A2", false)] {
            p.put(resource, units).await;
            let req = try_request(vec![hold(resource, 1, None)]);
            assert_eq!(outcome(&p.try_(req.clone()).await), Outcome::Held);
            let mut busy = pool.begin().await.unwrap();
            sqlx::query(business_row(kind))
                .bind(resource)
                .execute(&mut *busy)
                .await
                .unwrap();
            let sent = req.clone();
            let call = tokio::spawn(async move {
                let state = if confirm {
                    p.confirm(&sent).await
                } else {
                    p.cancel(&sent).await
                };
                (p, state)
            });
            until_waiting(
                &mut watcher,
                ONE_STATEMENT,
                &format!("{kind:?}: the call did not wait in the one statement"),
            )
            .await;
            busy.commit().await.unwrap();
            let (back, state) = call.await.unwrap();
            p = back;
            let (wanted, counts_after) = if confirm {
                (State::Confirmed, (units - 1, 0, 1))
            } else {
                (State::Cancelled, (units, 0, 0))
            };
            assert_eq!(state, wanted, "{kind:?}");
            assert_eq!(counts(&mut p, resource).await, counts_after, "{kind:?}");
            assert_eq!(p.confirm(&req).await, wanted, "{kind:?}: a repeat");
        }
        p.stop().await;
    }
}

/// A stock Confirm whose hold row is gone (an operator, a bug) cannot be made whole: the one
/// statement writes nothing and the general way answers HOLD_LOST, releasing what is left.
#[sqlx::test(migrations = false)]
async fn a_stock_confirm_finding_its_hold_row_gone_answers_hold_lost(pool: PgPool) {
    let mut p = spawn_participant(Kind::Stock, pool.clone()).await;
    p.put("sku-1", 5).await;
    p.put("sku-2", 5).await;
    let req = try_request(vec![hold("sku-1", 1, None), hold("sku-2", 2, None)]);
    assert_eq!(outcome(&p.try_(req.clone()).await), Outcome::Held);
    sqlx::query("DELETE FROM stock_hold WHERE resource = 'sku-2'")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(p.confirm(&req).await, State::HoldLost);
    assert_eq!(counts(&mut p, "sku-1").await, (5, 0, 0), "sku-1 released");
    let barrier: String = sqlx::query_scalar("SELECT state FROM tcc_barrier")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(barrier, "hold_lost");
    assert_eq!(p.confirm(&req).await, State::HoldLost, "a repeat");
    p.stop().await;
}
