//! A participant's calls on SQLite are members of the one writer's group commit. A caller
//! that leaves while its write is in flight (a client gone, a deadline) must fail no other
//! caller's write: every caller that stays is answered, and every branch whose caller left is
//! untouched or written whole. The noop participant: each first Try and each Confirm of a held
//! branch is one barrier statement, many of them in one group.

use std::fmt::Debug;

use holdfast::participant::{
    BranchAnswer, BranchKey, Item, ParticipantService, ResourceError, TryAnswer, TryBranch,
};
use holdfast::participants::noop::Noop;
use sqlx::{Sqlite, SqlitePool};

use crate::common::fresh_sqlite;
use crate::parallel::{leave_after_first_poll, together};

/// Calls per burst; every other caller leaves once its call has started.
const CALLS: usize = 40;
const BURSTS: usize = 5;

fn branch(burst: usize, call: usize) -> TryBranch {
    TryBranch {
        key: BranchKey {
            reservation_id: format!("r-{burst}-{call}"),
            branch_id: format!("b-{burst}-{call}"),
        },
        holder: "alice".into(),
        items: vec![Item {
            resource: "slot".into(),
            quantity: 1,
            during: None,
        }],
        expires_at: chrono::Utc::now() + chrono::Duration::minutes(10),
    }
}

/// The branch's barrier phase (`None`: no row).
async fn phase(pool: &SqlitePool, key: &BranchKey) -> Option<String> {
    sqlx::query_scalar(
        "SELECT state FROM tcc_barrier \
         WHERE participant = 'noop' AND reservation_id = ?1 AND branch_id = ?2",
    )
    .bind(&key.reservation_id)
    .bind(&key.branch_id)
    .fetch_optional(pool)
    .await
    .expect("read the barrier")
}

/// Runs `call(i)` for every call of a burst at once; an odd `i` leaves once its call has
/// started (`None`), an even one is awaited to its answer.
async fn burst<T, Fut>(call: impl Fn(usize) -> Fut) -> Vec<Option<T>>
where
    T: Send + 'static,
    Fut: std::future::Future<Output = T> + Send + 'static,
{
    together((0..CALLS).map(|i| {
        let call = call(i);
        async move {
            if i % 2 == 1 {
                leave_after_first_poll(call).await;
                None
            } else {
                Some(call.await)
            }
        }
    }))
    .await
}

/// Checks burst `b` of `what` against the rows it left: a caller that stayed was answered
/// `answered` and its branch is in phase `stayed`; a left caller's branch is in one of `left`.
async fn check<A: PartialEq + Debug>(
    pool: &SqlitePool,
    (b, what): (usize, &str),
    answers: Vec<Option<Result<A, ResourceError>>>,
    (answered, stayed): (A, &str),
    left: &[Option<&str>],
) {
    for (i, answer) in answers.into_iter().enumerate() {
        let row = phase(pool, &branch(b, i).key).await;
        match answer {
            Some(answer) => {
                let answer = answer.expect("a caller that stayed is answered");
                assert_eq!(answer, answered, "burst {b}, {what} {i}");
                assert_eq!(row.as_deref(), Some(stayed), "burst {b}, {what} {i}");
            }
            None => assert!(
                left.contains(&row.as_deref()),
                "burst {b}, left {what} {i}: {row:?}"
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_leave_fail_no_other_barrier_write() {
    let pool = fresh_sqlite().await;
    let service: ParticipantService<Noop, Sqlite> =
        ParticipantService::new("noop", Noop::new("noop"), pool.clone());
    for b in 0..BURSTS {
        let tries = burst(|i| {
            let service = service.clone();
            async move { service.try_branch(branch(b, i)).await }
        })
        .await;
        let held = (TryAnswer::Held, "held");
        check(&pool, (b, "Try"), tries, held, &[None, Some("held")]).await;
        let confirms = burst(|i| {
            let service = service.clone();
            async move { service.confirm_branch(&branch(b, i).key).await }
        })
        .await;
        let confirmed = (BranchAnswer::Confirmed, "confirmed");
        let left = [None, Some("held"), Some("confirmed")];
        check(&pool, (b, "Confirm"), confirms, confirmed, &left).await;
    }
    pool.close().await;
}
