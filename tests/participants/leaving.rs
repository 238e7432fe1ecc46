//! A participant's calls on SQLite are members of the one writer's group commit. A caller
//! that leaves while its write is in flight (a client gone, a deadline) must fail no other
//! caller's write: every caller that stays is answered, and every branch whose caller left is
//! untouched or written whole. The noop participant: each first Try and each Confirm of a held
//! branch is one barrier statement, many of them in one group.

use std::sync::Arc;
use std::time::Duration;

use holdfast::participant::{
    BranchAnswer, BranchKey, Item, ParticipantService, TryAnswer, TryBranch,
};
use holdfast::participants::noop::Noop;
use sqlx::{Sqlite, SqlitePool};

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

/// Runs `call(i)` for every `i` at once, each in a task of its own; an odd `i` leaves after
/// the call's first poll (`None`), an even one is awaited to its answer.
async fn burst<T, F, Fut>(call: F) -> Vec<Option<T>>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
{
    let start = Arc::new(tokio::sync::Barrier::new(CALLS));
    let tasks: Vec<_> = (0..CALLS)
        .map(|i| {
            let (start, call) = (start.clone(), call(i));
            tokio::spawn(async move {
                start.wait().await;
                if i % 2 == 1 {
                    tokio::time::timeout(Duration::ZERO, call).await.ok()
                } else {
                    Some(call.await)
                }
            })
        })
        .collect();
    let mut answers = Vec::with_capacity(CALLS);
    for task in tasks {
        answers.push(task.await.expect("join"));
    }
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_leave_fail_no_other_barrier_write() {
    let path = std::env::temp_dir().join(format!(
        "holdfast-participants-leaving-{}.db",
        uuid::Uuid::new_v4().simple()
    ));
    let pool = holdfast::db::open_sqlite(&format!("sqlite://{}", path.display()), 8)
        .await
        .expect("sqlite");
    holdfast::participants::SQLITE_MIGRATOR
        .run(&pool)
        .await
        .expect("sqlite migrations");
    let service: ParticipantService<Noop, Sqlite> =
        ParticipantService::new("noop", Noop::new("noop"), pool.clone());
    for b in 0..BURSTS {
        let tries = burst(|i| {
            let service = service.clone();
            async move { service.try_branch(branch(b, i)).await }
        })
        .await;
        for (i, answer) in tries.into_iter().enumerate() {
            let key = branch(b, i).key;
            let row = phase(&pool, &key).await;
            match answer {
                Some(answer) => {
                    assert_eq!(
                        answer.expect("a caller that stayed is answered"),
                        TryAnswer::Held
                    );
                    assert_eq!(row.as_deref(), Some("held"), "burst {b}, Try {i}");
                }
                None => assert!(
                    matches!(row.as_deref(), None | Some("held")),
                    "burst {b}, left Try {i}: {row:?}"
                ),
            }
        }
        let confirms = burst(|i| {
            let service = service.clone();
            async move { service.confirm_branch(&branch(b, i).key).await }
        })
        .await;
        for (i, answer) in confirms.into_iter().enumerate() {
            let key = branch(b, i).key;
            let row = phase(&pool, &key).await;
            match answer {
                Some(answer) => {
                    let answer = answer.expect("a caller that stayed is answered");
                    assert_eq!(answer, BranchAnswer::Confirmed, "burst {b}, Confirm {i}");
                    assert_eq!(row.as_deref(), Some("confirmed"), "burst {b}, Confirm {i}");
                }
                None => assert!(
                    matches!(row.as_deref(), None | Some("held") | Some("confirmed")),
                    "burst {b}, left Confirm {i}: {row:?}"
                ),
            }
        }
    }
    pool.close().await;
    let _ = std::fs::remove_file(&path);
}
