//! Real parallelism for PostgreSQL tests. `#[sqlx::test]` runs its body on a current-thread
//! runtime, where "concurrent" clients, servers and the coordinator take turns on one thread.
//! `parallel_test!(name => body)` declares the test `name` with `#[sqlx::test]`'s fresh
//! database but runs `body(pool)` on a multi-threaded runtime of its own (its pool connected
//! there), so contenders really run at once. [`together`] releases many contenders at once;
//! [`leave_after_first_poll`] is a caller that goes away once its call has started. Included by
//! each test binary with `#[path]`.

use std::future::Future;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// Worker threads of the runtime: more than the cores of a small CI machine, so contenders are
/// preempted mid-flight too.
const WORKERS: usize = 4;

/// Runs `body` with a pool on the test's database on a multi-threaded runtime in a thread of
/// its own; a panic in it is the test's panic.
pub async fn on_multi_thread<F, Fut>(pool: PgPoolOptions, connect: PgConnectOptions, body: F)
where
    F: FnOnce(PgPool) -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(WORKERS)
            .enable_all()
            .build()
            .expect("a multi-threaded runtime");
        runtime.block_on(async move {
            let pool = pool
                .connect_with(connect)
                .await
                .expect("connect the test pool");
            body(pool.clone()).await;
            pool.close().await;
        });
    });
    // Waited for off the test's runtime thread, which keeps serving sqlx's clean-up.
    let joined = tokio::task::spawn_blocking(move || thread.join())
        .await
        .expect("join the waiting task");
    if let Err(panic) = joined {
        std::panic::resume_unwind(panic);
    }
}

/// `parallel_test!(name => body);` with `async fn body(pool: PgPool)`: the test `name` on a
/// fresh database (`#[sqlx::test(migrations = false)]`), run by [`on_multi_thread`].
macro_rules! parallel_test {
    ($name:ident => $body:path) => {
        #[sqlx::test(migrations = false)]
        async fn $name(
            pool: sqlx::postgres::PgPoolOptions,
            connect: sqlx::postgres::PgConnectOptions,
        ) {
            crate::parallel::on_multi_thread(pool, connect, $body).await;
        }
    };
}
pub(crate) use parallel_test;

/// Runs each future in a task of its own, all released together by a barrier (real contenders
/// on the multi-threaded runtime); the answers in the futures' order.
#[allow(dead_code)] // not every binary that includes this file uses it
pub async fn together<T, F>(futures: impl IntoIterator<Item = F>) -> Vec<T>
where
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let futures: Vec<F> = futures.into_iter().collect();
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(futures.len()));
    let tasks: Vec<_> = futures
        .into_iter()
        .map(|f| {
            let start = start.clone();
            tokio::spawn(async move {
                start.wait().await;
                f.await
            })
        })
        .collect();
    let mut answers = Vec::with_capacity(tasks.len());
    for task in tasks {
        answers.push(task.await.expect("a contender panicked"));
    }
    answers
}

/// A caller that leaves once its call has started (a client gone, a deadline passed): `call`
/// is polled once, then dropped, whether its work had begun or not.
#[allow(dead_code)] // not every binary that includes this file uses it
pub async fn leave_after_first_poll<F: Future>(call: F) {
    let _ = tokio::time::timeout(std::time::Duration::ZERO, call).await;
}
