//! The harness's coordinator: served in a tokio runtime of its own, so a test can kill it the
//! way a crash would (every task - calls in flight, recovery - stops at once, mid-step, with
//! nothing cleaned up) and start another on the same database and the same port.

use std::net::SocketAddr;
use std::time::Duration;

use holdfast::app::CoordinatorSettings;
use tokio::sync::oneshot;

use crate::TestkitError;

/// How long a restart waits for the killed coordinator's port to be free again.
const REBIND_WITHIN: Duration = Duration::from_secs(5);

/// Connections the coordinator's pool may open (tests are small; SQLite has one writer).
const POOL_SIZE: u32 = 8;

/// A running coordinator in its own runtime.
pub(crate) struct CoordinatorProcess {
    runtime: Option<tokio::runtime::Runtime>,
}

impl CoordinatorProcess {
    /// Starts a coordinator on `database_url` listening on `addr` (port 0: one the OS picks),
    /// once its schema is migrated; the address it listens on.
    pub(crate) async fn start(
        database_url: &str,
        addr: SocketAddr,
        settings: CoordinatorSettings,
    ) -> Result<(CoordinatorProcess, SocketAddr), TestkitError> {
        let listener = bind(addr).await?;
        let addr = listener
            .local_addr()
            .map_err(|source| TestkitError::Listen { addr, source })?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("holdfast-testkit-coordinator")
            .enable_all()
            .build()
            .map_err(|source| TestkitError::Listen { addr, source })?;
        let (ready_tx, ready_rx) = oneshot::channel::<Result<(), TestkitError>>();
        let url = database_url.to_owned();
        runtime.spawn(async move {
            // A clock of this coordinator's own, registered with a pool of this runtime: a
            // clock shared across restarts would keep the killed runtime's pool. It starts at
            // the offset the database keeps, so the clock never moves back across a restart.
            let clock = holdfast::testing::TestClock::new();
            let store = match holdfast::testing::open_store(&url, POOL_SIZE, &clock).await {
                Ok(store) => store,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.into()));
                    return;
                }
            };
            let listener = match tokio::net::TcpListener::from_std(listener) {
                Ok(listener) => listener,
                Err(source) => {
                    let _ = ready_tx.send(Err(TestkitError::Listen { addr, source }));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(()));
            let served = holdfast::app::serve_test_coordinator(
                settings,
                store,
                listener,
                clock,
                std::future::pending(),
            )
            .await;
            if let Err(e) = served {
                eprintln!("holdfast-testkit: the coordinator stopped: {e}");
            }
        });
        let process = CoordinatorProcess {
            runtime: Some(runtime),
        };
        match ready_rx.await {
            Ok(Ok(())) => Ok((process, addr)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(TestkitError::NotRunning),
        }
    }

    /// Stops every task of the coordinator at once, as a crash would.
    pub(crate) fn kill(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for CoordinatorProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Binds `addr`; on a restart the killed coordinator's runtime may still be dropping its
/// listener, so a taken port is tried again for a while.
async fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, TestkitError> {
    let deadline = tokio::time::Instant::now() + REBIND_WITHIN;
    loop {
        match std::net::TcpListener::bind(addr) {
            Ok(listener) => {
                listener
                    .set_nonblocking(true)
                    .map_err(|source| TestkitError::Listen { addr, source })?;
                return Ok(listener);
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrInUse
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(source) => return Err(TestkitError::Listen { addr, source }),
        }
    }
}
