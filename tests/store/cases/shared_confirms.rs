//! PostgreSQL's unlocked Confirms without a payment, group-committed (#20): concurrent Confirms
//! of distinct `HELD` reservations share one UPDATE, each row guarded by the version its own
//! call judged, so a Confirm judged on a stale image misses alone and the locked path decides
//! it from the row.
//!
//! A statement-level trigger logs how many rows each UPDATE moved into `CONFIRMING`. A batch
//! forms only while another Confirm is in flight: the first runs alone and waits for a row
//! lock taken here, the second queues, runs as a batch of one and waits for another; the rest
//! queue behind it. The test's runtime has one thread, so a spawned Confirm has queued by the
//! time it reports that it started (nothing in the call awaits before it queues).

use holdfast::domain::{State, Verdict};
use holdfast::store::Decided;
use sqlx::PgPool;
use tokio::sync::mpsc;

use super::lost_ack::waiting_for_locks;
use super::{LONG, confirm, get, held, lease};

/// Reservations confirmed at once.
const N: usize = 10;

pub async fn concurrent_confirms_share_one_statement(pool: PgPool) {
    let store = crate::postgres(pool.clone()).await;
    let mut reservations = Vec::new();
    for i in 0..N {
        reservations.push(held(&store, &format!("h{i}"), "r1", LONG).await);
    }
    // The last one changes behind the store's image of it: its Confirm is judged on a stale
    // version.
    let stale = reservations[N - 1].0.id;
    sqlx::query("UPDATE reservations SET version = version + 1 WHERE id = $1")
        .bind(stale)
        .execute(&pool)
        .await
        .unwrap();
    sqlx::raw_sql(
        "CREATE TABLE confirm_statements (moved bigint NOT NULL); \
         CREATE FUNCTION log_confirms() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN \
           INSERT INTO confirm_statements \
             SELECT count(*) FROM moved WHERE state = 'CONFIRMING' HAVING count(*) > 0; \
           RETURN NULL; \
         END $$; \
         CREATE TRIGGER log_confirms AFTER UPDATE ON reservations \
           REFERENCING NEW TABLE AS moved FOR EACH STATEMENT \
           EXECUTE FUNCTION log_confirms();",
    )
    .execute(&pool)
    .await
    .unwrap();

    let mut lock = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM reservations WHERE id = ANY($1) FOR UPDATE")
        .bind([reservations[0].0.id, reservations[1].0.id])
        .execute(&mut *lock)
        .await
        .unwrap();
    let (started, mut starts) = mpsc::unbounded_channel();
    let confirm_in_task = |i: usize| {
        let (store, started) = (store.clone(), started.clone());
        let (id, token) = (reservations[i].0.id, reservations[i].1.clone());
        tokio::spawn(async move {
            let _ = started.send(i);
            store.decide(id, None, &token, &confirm(), lease()).await
        })
    };
    let first = confirm_in_task(0);
    waiting_for_locks(&pool, 1).await;
    let second = confirm_in_task(1);
    waiting_for_locks(&pool, 2).await;
    let rest: Vec<_> = (2..N).map(confirm_in_task).collect();
    for _ in 2..N {
        starts.recv().await.unwrap();
    }
    lock.commit().await.unwrap();

    let mut calls = vec![first, second];
    calls.extend(rest);
    for (i, call) in calls.into_iter().enumerate() {
        let decided = call.await.unwrap().unwrap();
        let Decided::Judged {
            verdict,
            reservation,
            leased,
        } = decided
        else {
            panic!("Confirm {i}: {decided:?}");
        };
        assert!(
            matches!(
                verdict,
                Verdict::Transition {
                    to: State::Confirming,
                    ..
                }
            ),
            "Confirm {i}: {verdict:?}"
        );
        assert!(leased, "Confirm {i} took the lease");
        let stored = get(&store, reservations[i].0.id).await;
        assert_eq!(stored.state, State::Confirming);
        assert_eq!(
            *reservation, stored,
            "Confirm {i} answers the row as stored"
        );
    }
    // The first two alone; the seven queued behind them in one statement, the stale one
    // missing it; then the stale one alone, by the locked path.
    let moved: Vec<i64> = sqlx::query_scalar("SELECT moved FROM confirm_statements")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(moved.iter().sum::<i64>(), N as i64, "{moved:?}");
    assert_eq!(moved.iter().max(), Some(&(N as i64 - 3)), "{moved:?}");
}

/// The shared UPDATE committed but its acknowledgement was lost: each of its Confirms runs
/// again alone, misses (the batch moved the version it judged) and is answered from the row
/// by the locked path - the decision applied once, every caller told `CONFIRMING`.
pub async fn confirms_after_a_lost_ack_are_applied_once(pool: PgPool) {
    let (store, relay) = super::lost_ack::relayed(&pool).await;
    let mut reservations = Vec::new();
    for holder in ["first", "second", "third"] {
        reservations.push(held(&store, holder, "r1", LONG).await);
    }
    let mut lock = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM reservations WHERE id = $1 FOR UPDATE")
        .bind(reservations[0].0.id)
        .execute(&mut *lock)
        .await
        .unwrap();
    let first = {
        let (store, (r, token)) = (store.clone(), reservations[0].clone());
        tokio::spawn(async move { store.decide(r.id, None, &token, &confirm(), lease()).await })
    };
    waiting_for_locks(&pool, 1).await;

    // Two more queue and share a statement (its text names the judged versions), whose commit
    // acknowledgement is lost.
    relay.arm("judged_version");
    let [_, (second, second_token), (third, third_token)] = &reservations[..] else {
        unreachable!()
    };
    let decision = confirm();
    let (a, b) = tokio::join!(
        store.decide(second.id, None, second_token, &decision, lease()),
        store.decide(third.id, None, third_token, &decision, lease()),
    );
    lock.commit().await.unwrap();
    first.await.unwrap().unwrap();
    assert_eq!(
        relay.cuts(),
        1,
        "the shared statement's acknowledgement was dropped"
    );
    for (decided, before) in [(a, second), (b, third)] {
        let Decided::Judged {
            verdict,
            reservation,
            ..
        } = decided.unwrap()
        else {
            panic!("not judged");
        };
        assert_eq!(verdict, Verdict::AlreadyDone, "answered from the row");
        assert_eq!(reservation.state, State::Confirming);
        let stored = get(&store, before.id).await;
        assert_eq!(stored.state, State::Confirming);
        assert_eq!(stored.version, before.version + 1, "applied once");
    }
}
