//! The one error of the testkit: what could not be started or asked.

/// Why the harness could not start, or a call it made for the test failed.
#[derive(Debug, thiserror::Error)]
pub enum TestkitError {
    #[error("creating the temporary data folder: {0}")]
    TempDir(std::io::Error),
    #[error("listening on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("database: {0}")]
    Database(#[from] holdfast_coordinator::testing::TestingError),
    #[error("the coordinator: {0}")]
    Coordinator(#[from] holdfast_coordinator::serving::ServingError),
    #[error("no participant named {0:?} in this harness")]
    UnknownParticipant(String),
    #[error("participant {0:?} is a reference participant, not a fake")]
    NotAFake(String),
    #[error("a participant named {0:?} is configured twice")]
    DuplicateParticipant(String),
    #[error("no principal named {0:?} in this harness (HarnessBuilder::principal)")]
    UnknownPrincipal(String),
    #[error("a principal named {0:?} is configured twice (holdfast-testkit is the harness's own)")]
    DuplicatePrincipal(String),
    #[error("authentication: {0}")]
    Auth(String),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("the coordinator stopped: {0}")]
    CoordinatorStopped(String),
    #[error("the coordinator is not running: restart() it first")]
    NotRunning,
    #[error(transparent)]
    Client(#[from] holdfast_client::Error),
    #[error("{call}: {status}")]
    Rpc {
        call: &'static str,
        status: tonic::Status,
    },
    #[error("connecting to {url}: {source}")]
    Connect {
        url: String,
        source: tonic::transport::Error,
    },
}

impl TestkitError {
    pub(crate) fn rpc(call: &'static str) -> impl FnOnce(tonic::Status) -> TestkitError {
        move |status| TestkitError::Rpc { call, status }
    }
}
