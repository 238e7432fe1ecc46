//! Assembling and running each role: the wiring between config, store, registry, coordinator
//! and server. `main.rs` and the tests both start servers through here.

use std::future::Future;
use std::sync::Arc;

use sqlx::migrate::MigrateDatabase;
use tokio::net::TcpListener;

use crate::api::CoordinatorApi;
use crate::coordinator::{Coordinator, Policy};
use crate::domain::validate::Limits;
use crate::registry::{ParticipantEndpoint, Registry, RegistryError};
use crate::server::ServeError;
use crate::store::{PgStore, StoreError};

/// Why a role could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error("listening: {0}")]
    Listen(#[from] std::io::Error),
}

/// Everything the coordinator role needs, already parsed.
#[derive(Clone, Debug)]
pub struct CoordinatorSettings {
    pub participants: Vec<ParticipantEndpoint>,
    pub limits: Limits,
    pub policy: Policy,
}

/// Creates the database named by `url` if it does not exist yet.
pub async fn ensure_database(url: &str) -> Result<(), StoreError> {
    if !sqlx::Postgres::database_exists(url).await? {
        sqlx::Postgres::create_database(url).await?;
    }
    Ok(())
}

/// Migrates the store, then serves the coordinator on `listener` until `shutdown`.
pub async fn serve_coordinator(
    settings: CoordinatorSettings,
    store: PgStore,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), AppError> {
    store.migrate().await?;
    let registry = Registry::new(&settings.participants)?;
    let coordinator = Coordinator::new(
        Arc::new(store),
        registry.clone(),
        settings.limits,
        settings.policy,
    );
    let (stop_recovery, stop) = tokio::sync::watch::channel(false);
    let recovery = tokio::spawn(coordinator.clone().run_recovery(stop));
    let api = CoordinatorApi::new(coordinator, registry);
    let routes = tonic::service::Routes::new(api.into_server());
    tracing::info!(addr = %listener.local_addr()?, "coordinator serving");
    let served = crate::server::serve(listener, routes, &["tcc.v1.Coordinator"], shutdown).await;
    // In-flight calls are done; work left unfinished stays leased until its lease ends, then
    // any instance recovers it.
    let _ = stop_recovery.send(true);
    let _ = recovery.await;
    served?;
    Ok(())
}
