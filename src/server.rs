//! Serving gRPC: every holdfast server (coordinator or participant) goes through here, so all
//! of them offer reflection (v1 and v1alpha), `grpc.health.v1`, and graceful shutdown alike.

use std::future::Future;

use tokio::net::TcpListener;
use tonic::service::Routes;

/// Failure to start or run a gRPC server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("building the reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Serves `routes` plus health and reflection on `listener` until `shutdown` resolves, then
/// stops accepting and lets in-flight calls finish.
///
/// `service_names` are the fully-qualified names reported SERVING by the health service
/// (e.g. `tcc.v1.Coordinator`); the empty name (whole server) is always reported.
pub async fn serve(
    listener: TcpListener,
    routes: Routes,
    service_names: &[&str],
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    for name in service_names {
        health_reporter
            .set_service_status(*name, tonic_health::ServingStatus::Serving)
            .await;
    }
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    let routes = routes
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha);
    tonic::transport::Server::builder()
        .trace_fn(crate::telemetry::propagation::server_span)
        .add_routes(routes)
        // No Nagle delay: every TCC step is a small request waiting on a small answer.
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await?;
    Ok(())
}

/// Resolves on SIGTERM or Ctrl-C: the production shutdown signal.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutdown signal received; finishing in-flight calls");
}
