//! Crashes while a Reserve places its holds: after `create` before the first Try, with every
//! Try held before `record_held`, and after a rejection before and between the release
//! Cancels. The recovering coordinator releases everything: the reservation ends `REJECTED`,
//! nothing stays held, no branch is confirmed, and a never-tried branch gets at most the
//! Cancel that leaves its tombstone.

use crate::{Armed, arm, id_of, reserve, serial, shop};
use sqlx::PgPool;

fn held_pair() -> holdfast::proto::ReserveRequest {
    reserve("alice", None, &[("seats", "A1", 1), ("stock", "sku", 2)])
}

/// Sends `req` to a coordinator armed to panic at `step`; it fails, and the coordinator is
/// then killed. Returns the reservation's id.
async fn crash_reserve(
    shop: &crate::Shop,
    step: &'static str,
    action: &str,
    req: holdfast::proto::ReserveRequest,
) -> String {
    let mut first = shop.first().await;
    let armed: Armed = arm(step, action);
    let answer = first.client().await.reserve(req).await;
    assert!(
        answer.is_err(),
        "{step}: the Reserve did not stop: {answer:?}"
    );
    first.kill();
    drop(armed);
    id_of(&shop.pool, "alice").await
}

#[sqlx::test(migrations = false)]
async fn a_crash_after_create_before_any_try_releases_with_tombstones_only(pool: PgPool) {
    let _serial = serial().await;
    let shop = shop(&pool, false, None).await;
    let id = crash_reserve(&shop, "coord.create.after", "panic", held_pair()).await;
    assert_eq!(shop.stored(&id).await.0, "TRYING");
    assert!(shop.log.calls().is_empty(), "{:?}", shop.log.summary());

    let _second = shop.second().await;
    shop.wait_stored(&id, ("REJECTED", None)).await;
    // Nothing was tried, so nothing held: only Cancels (tombstones: a late Try is refused).
    assert_eq!(shop.sent("seats", "Try"), Vec::<usize>::new());
    assert_eq!(shop.sent("stock", "Try"), Vec::<usize>::new());
    assert_eq!(shop.sent("seats", "Cancel"), vec![1]);
    assert_eq!(shop.sent("stock", "Cancel"), vec![1]);
    assert_eq!(shop.sent("seats", "Confirm"), Vec::<usize>::new());
    assert_eq!(shop.counts("seats", "A1").await, (1, 0, 0));
    assert_eq!(shop.counts("stock", "sku").await, (3, 0, 0));
    assert_eq!(
        shop.barrier(&id).await,
        [
            ("seats".into(), "cancelled".into()),
            ("stock".into(), "cancelled".into())
        ]
    );
}

#[sqlx::test(migrations = false)]
async fn a_crash_with_every_try_held_before_record_held_releases_both(pool: PgPool) {
    let _serial = serial().await;
    let shop = shop(&pool, false, None).await;
    let id = crash_reserve(&shop, "coord.record_held.before", "panic", held_pair()).await;
    assert_eq!(shop.stored(&id).await.0, "TRYING");
    assert_eq!(
        shop.counts("seats", "A1").await,
        (0, 1, 0),
        "held at the crash"
    );
    assert_eq!(
        shop.counts("stock", "sku").await,
        (1, 2, 0),
        "held at the crash"
    );

    let _second = shop.second().await;
    shop.wait_stored(&id, ("REJECTED", None)).await;
    for name in ["seats", "stock"] {
        assert_eq!(shop.sent(name, "Try"), vec![1], "{name}");
        assert_eq!(shop.sent(name, "Cancel"), vec![1], "{name}");
        assert_eq!(shop.sent(name, "Confirm"), Vec::<usize>::new(), "{name}");
    }
    assert_eq!(shop.counts("seats", "A1").await, (1, 0, 0));
    assert_eq!(shop.counts("stock", "sku").await, (3, 0, 0));
    assert_eq!(
        shop.barrier(&id).await,
        [
            ("seats".into(), "cancelled".into()),
            ("stock".into(), "cancelled".into())
        ]
    );
}

#[sqlx::test(migrations = false)]
async fn a_crash_after_a_rejection_before_the_release_frees_the_held_seat(pool: PgPool) {
    let _serial = serial().await;
    let shop = shop(&pool, false, None).await;
    // seats holds, stock (3 in stock) refuses 5: the rejection is recorded, then the crash.
    let req = reserve("alice", None, &[("seats", "A1", 1), ("stock", "sku", 5)]);
    let id = crash_reserve(&shop, "coord.record_rejected.after", "panic", req).await;
    assert_eq!(shop.stored(&id).await.0, "CANCELLING");
    assert_eq!(shop.counts("seats", "A1").await, (0, 1, 0));

    let _second = shop.second().await;
    shop.wait_stored(&id, ("REJECTED", None)).await;
    assert_eq!(shop.sent("seats", "Try"), vec![1]);
    assert_eq!(shop.sent("seats", "Cancel"), vec![1]);
    assert_eq!(shop.sent("stock", "Try"), vec![1]);
    // A branch that answered REJECTED holds nothing: it is never called again.
    assert_eq!(shop.sent("stock", "Cancel"), Vec::<usize>::new());
    assert_eq!(shop.counts("seats", "A1").await, (1, 0, 0));
    assert_eq!(shop.counts("stock", "sku").await, (3, 0, 0));
    assert_eq!(
        shop.barrier(&id).await,
        [
            ("seats".into(), "cancelled".into()),
            ("stock".into(), "rejected".into())
        ]
    );
}

#[sqlx::test(migrations = false)]
async fn a_crash_between_release_cancels_frees_the_other_seat_too(pool: PgPool) {
    let _serial = serial().await;
    let shop = shop(&pool, true, None).await;
    // hall and seats hold, stock refuses; of the two release Cancels (in parallel) the first
    // to arrive fails at its participant (rolled back), the other is applied; the coordinator
    // dies before recording either answer.
    let req = reserve(
        "alice",
        None,
        &[("hall", "B1", 1), ("seats", "A1", 1), ("stock", "sku", 5)],
    );
    let one_cancel_fails = arm("participant.cancel.between", "1*return");
    let id = crash_reserve(&shop, "coord.record_phase.before", "panic", req).await;
    drop(one_cancel_fails);
    assert_eq!(shop.stored(&id).await.0, "CANCELLING");
    let mut at_crash = [
        shop.counts("hall", "B1").await,
        shop.counts("seats", "A1").await,
    ];
    at_crash.sort_unstable();
    assert_eq!(
        at_crash,
        [(0, 1, 0), (1, 0, 0)],
        "one released, one still held"
    );

    let _second = shop.second().await;
    shop.wait_stored(&id, ("REJECTED", None)).await;
    for name in ["hall", "seats"] {
        assert_eq!(shop.sent(name, "Try"), vec![1], "{name}");
        // The first coordinator's Cancel (failed or applied), then recovery's: a repeat of an
        // applied Cancel changes nothing.
        assert_eq!(shop.sent(name, "Cancel"), vec![2], "{name}");
        assert_eq!(shop.sent(name, "Confirm"), Vec::<usize>::new(), "{name}");
    }
    assert_eq!(shop.sent("stock", "Cancel"), Vec::<usize>::new());
    assert_eq!(shop.counts("hall", "B1").await, (1, 0, 0));
    assert_eq!(shop.counts("seats", "A1").await, (1, 0, 0));
    assert_eq!(shop.counts("stock", "sku").await, (3, 0, 0));
    assert_eq!(
        shop.barrier(&id).await,
        [
            ("seats".into(), "cancelled".into()),
            ("seats".into(), "cancelled".into()),
            ("stock".into(), "rejected".into())
        ]
    );
}
