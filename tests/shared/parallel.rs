//! Real parallelism for PostgreSQL tests. `#[sqlx::test]` runs its body on a current-thread
//! runtime, where "concurrent" clients, servers and the coordinator take turns on one thread.
//! `parallel_test!(name => body)` declares the test `name` with `#[sqlx::test]`'s fresh
//! database but runs `body(pool)` on a multi-threaded runtime of its own (its pool connected
//! there), so contenders really run at once. Included by each test binary with `#[path]`.

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
