//! The harness's coordinator: served in a tokio runtime of its own, so a test can kill it the
//! way a crash would (every task - calls in flight, recovery - stops at once, mid-step, with
//! nothing cleaned up) and start another on the same database and the same port.

use std::net::SocketAddr;
use std::time::Duration;

use holdfast_coordinator::serving::CoordinatorSettings;
use holdfast_serve::tls::{Listener, ServerTls};
use tokio::sync::{oneshot, watch};
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::TestkitError;

/// How long a restart waits for the killed coordinator's port to be free again.
const REBIND_WITHIN: Duration = Duration::from_secs(5);

/// How long a start waits for the coordinator to answer health checks.
const SERVING_WITHIN: Duration = Duration::from_secs(10);

/// Connections the coordinator's pool may open (tests are small; SQLite has one writer).
const POOL_SIZE: u32 = 8;

/// A running coordinator in its own runtime.
pub(crate) struct CoordinatorProcess {
    runtime: Option<tokio::runtime::Runtime>,
    /// Why it stopped serving on its own (a configuration it refused), once it has.
    stopped: watch::Receiver<Option<String>>,
}

impl CoordinatorProcess {
    /// Starts a coordinator on `database_url` listening on `addr` (port 0: one the OS picks),
    /// TLS only when `tls` is given, once its schema is migrated; the address it listens on.
    pub(crate) async fn start(
        database_url: &str,
        addr: SocketAddr,
        settings: CoordinatorSettings,
        tls: Option<ServerTls>,
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
        let (stopped_tx, stopped) = watch::channel(None);
        let url = database_url.to_owned();
        runtime.spawn(async move {
            // A clock of this coordinator's own, registered with a pool of this runtime: a
            // clock shared across restarts would keep the killed runtime's pool. It starts at
            // the offset the database keeps, so the clock never moves back across a restart.
            let clock = holdfast_coordinator::testing::TestClock::new();
            let store =
                match holdfast_coordinator::testing::open_store(&url, POOL_SIZE, &clock).await {
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
            let served = holdfast_coordinator::serving::serve_test_coordinator(
                settings,
                store,
                Listener::new(listener, tls),
                clock,
                std::future::pending(),
            )
            .await;
            if let Err(e) = served {
                eprintln!("holdfast-testkit: the coordinator stopped: {e}");
                let _ = stopped_tx.send(Some(e.to_string()));
            }
        });
        let process = CoordinatorProcess {
            runtime: Some(runtime),
            stopped,
        };
        match ready_rx.await {
            Ok(Ok(())) => Ok((process, addr)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(TestkitError::NotRunning),
        }
    }

    /// Waits until the coordinator answers health checks as serving on `channel` (its own
    /// address), or says why it stopped instead.
    pub(crate) async fn serving(&self, channel: Channel) -> Result<(), TestkitError> {
        let deadline = tokio::time::Instant::now() + SERVING_WITHIN;
        let mut health = HealthClient::new(channel);
        let mut stopped = self.stopped.clone();
        loop {
            let asked = health.check(HealthCheckRequest {
                service: "tcc.v1.Coordinator".to_owned(),
            });
            let last = tokio::select! {
                answer = asked => match answer {
                    Ok(a) if a.get_ref().status == ServingStatus::Serving as i32 => return Ok(()),
                    Ok(a) => format!("health status {}", a.get_ref().status),
                    Err(status) => status.to_string(),
                },
                why = stopped.wait_for(Option::is_some) => {
                    let why = match why {
                        Ok(why) => why.clone().unwrap_or_default(),
                        Err(_) => "its runtime is gone".to_owned(),
                    };
                    return Err(TestkitError::CoordinatorStopped(why));
                }
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(TestkitError::CoordinatorStopped(format!(
                    "not serving within {SERVING_WITHIN:?}: {last}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
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

#[cfg(test)]
mod tests {
    use super::*;
    use holdfast_coordinator::registry::ParticipantEndpoint;
    use holdfast_coordinator::serving::CoordinatorAccess;

    /// A coordinator that refuses its configuration at start (here: TLS served, a participant
    /// called in plaintext, not allowed) is reported with its reason, not as a coordinator that
    /// later refuses connections.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_coordinator_that_refuses_its_configuration_is_reported_with_the_reason() {
        let folder = tempfile::tempdir().unwrap();
        let database = format!("sqlite://{}", folder.path().join("holdfast.db").display());
        let certificates = crate::tls::Certificates::new(None).unwrap();
        let settings = CoordinatorSettings {
            participants: vec![ParticipantEndpoint {
                name: "seats".into(),
                url: "http://127.0.0.1:9".into(),
                timeout: Duration::from_secs(1),
            }],
            limits: Default::default(),
            policy: Default::default(),
            server: Default::default(),
            participant_transport: Default::default(),
            access: CoordinatorAccess::default(),
        };
        let any_port = SocketAddr::from(([127, 0, 0, 1], 0));
        let tls = Some(certificates.server.clone());
        let (process, addr) = CoordinatorProcess::start(&database, any_port, settings, tls)
            .await
            .unwrap();
        let url = format!("https://{addr}");
        let endpoint =
            tonic::transport::Endpoint::new(holdfast_serve::tls::endpoint_url(&url)).unwrap();
        let channel = certificates.client.connect_lazy(endpoint, &url).unwrap();
        match process.serving(channel).await {
            Err(TestkitError::CoordinatorStopped(why)) => {
                assert!(why.contains("seats=http://127.0.0.1:9"), "{why}");
            }
            other => panic!("{:?}", other.err()),
        }
    }
}
