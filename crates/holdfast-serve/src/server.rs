//! Serving gRPC: every holdfast server (coordinator or participant) goes through here, so all
//! of them offer reflection (v1 and v1alpha), `grpc.health.v1`, graceful shutdown, the same
//! authentication ([`AuthLayer`]: every request is admitted by `crate::auth` before any
//! handler runs, and carries its caller), and the same overload protection: a per-request deadline (the client's `grpc-timeout`, capped), a global
//! cap on requests in flight beyond which requests are shed at once with `RESOURCE_EXHAUSTED`
//! rather than queued, HTTP/2 keepalive, and no Nagle delay. A [`Listener`] with TLS serves
//! TLS only (`crate::tls`); either way its connections are bounded by `crate::conn` (a cap
//! per listener, a header timeout, an idle timeout).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::service::Routes;

use crate::auth::Authenticator;
use crate::tls::{Listener, ServerTls};

/// Failure to start or run a gRPC server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("building the reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// Authentication off on an address others can reach, not asked for.
    #[error("{0}")]
    OpenWithoutAuth(String),
    #[error("the listener's address: {0}")]
    Address(#[from] std::io::Error),
}

/// Limits every server applies.
#[derive(Clone, Copy, Debug)]
pub struct ServerLimits {
    /// Requests in flight at once; beyond it, requests are refused with `RESOURCE_EXHAUSTED`.
    pub max_concurrent_requests: usize,
    /// Longest time a request may take (a shorter client `grpc-timeout` wins); then the call
    /// ends with `DEADLINE_EXCEEDED`.
    pub request_timeout: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_concurrent_requests: 1024,
            request_timeout: Duration::from_secs(30),
        }
    }
}

/// Serves `routes` plus health and reflection on `listener` (a `TcpListener`, or a
/// [`Listener`] with TLS) until `shutdown` resolves, then stops accepting and lets in-flight
/// calls finish; with the default [`ServerLimits`].
///
/// `service_names` are the fully-qualified names reported SERVING by the health service
/// (e.g. `tcc.v1.Coordinator`); the empty name (whole server) is always reported.
pub async fn serve(
    listener: impl Into<Listener>,
    auth: &Authenticator,
    routes: Routes,
    service_names: &[&str],
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    serve_with(
        ServerLimits::default(),
        auth,
        listener,
        routes,
        service_names,
        shutdown,
    )
    .await
}

/// Reflection that knows every message type holdfast speaks but lists only what this port
/// serves: `service_names`, health and reflection itself (a participant's port does not offer
/// `tcc.v1.Coordinator`, nor the coordinator's `tcc.v1.Participant`).
fn reflection(service_names: &[&str]) -> tonic_reflection::server::Builder<'static> {
    let builder = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(holdfast_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET);
    service_names
        .iter()
        .copied()
        .chain([
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection",
        ])
        .fold(builder, |b, name| b.with_service_name(name))
}

/// [`serve`] with explicit limits.
pub async fn serve_with(
    limits: ServerLimits,
    auth: &Authenticator,
    listener: impl Into<Listener>,
    routes: Routes,
    service_names: &[&str],
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let listener = listener.into();
    auth.may_listen_on(listener.local_addr()?)
        .map_err(ServeError::OpenWithoutAuth)?;
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    for name in service_names {
        health_reporter
            .set_service_status(*name, tonic_health::ServingStatus::Serving)
            .await;
    }
    let reflection_v1 = reflection(service_names).build_v1()?;
    let reflection_v1alpha = reflection(service_names).build_v1alpha()?;
    let routes = routes
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha);
    let in_flight = Arc::new(tokio::sync::Semaphore::new(
        limits.max_concurrent_requests.max(1),
    ));
    let router = tonic::transport::Server::builder()
        .trace_fn(crate::propagation::server_span)
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        // Outermost first: count the request open on its connection (so it is not idle) and
        // give tonic back the connection's own connect info, admit the caller (a refusal takes no slot), refuse at once when full
        // (tonic answers RESOURCE_EXHAUSTED), count requests in flight across all
        // connections, then bound each request's time.
        .layer(
            tower::ServiceBuilder::new()
                .layer(crate::conn::TrackLayer::grpc())
                .layer(AuthLayer { auth: auth.clone() })
                .layer(ShedLayer)
                .load_shed()
                .layer(tower::limit::GlobalConcurrencyLimitLayer::with_semaphore(
                    in_flight,
                ))
                .layer(DeadlineLayer {
                    max: limits.request_timeout,
                }),
        )
        .add_routes(routes);
    // Every connection under the listener's limits (`crate::conn`): a place under the cap, a
    // complete head within the header timeout, closed when idle.
    let limits = listener.limits();
    match listener.into_parts() {
        (tcp, None) => {
            router
                .serve_with_incoming_shutdown(crate::conn::accept_plain(tcp, limits), shutdown)
                .await?
        }
        (tcp, Some(tls)) => {
            let incoming = crate::conn::accept_tls(tcp, limits, tls, ServerTls::grpc_config);
            router
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await?
        }
    }
    Ok(())
}

/// A server's request path without the network: the same auth layer, overload layers and
/// deadline as [`serve_with`] in front of `routes`, as a tower service a tonic client can
/// call in-process (the coordinator's JSON API does, so its JSON API has exactly the gRPC API's rules).
/// Overload answers `RESOURCE_EXHAUSTED` as over the network. Its error is a concrete
/// `Status` (a boxed error there trips rustc's higher-ranked `Send` checks in handlers that
/// await a tonic client).
pub type InProcess = tower::util::BoxCloneSyncService<
    http::Request<tonic::body::Body>,
    http::Response<tonic::body::Body>,
    tonic::Status,
>;

/// Builds the [`InProcess`] path to `routes`, admitted by `auth` under `limits`.
pub fn in_process(limits: ServerLimits, auth: &Authenticator, routes: Routes) -> InProcess {
    let in_flight = Arc::new(tokio::sync::Semaphore::new(
        limits.max_concurrent_requests.max(1),
    ));
    let service = tower::ServiceBuilder::new()
        // Over the network tonic turns a shed request into RESOURCE_EXHAUSTED; a client
        // in-process sees the service's error, so it is made that status here.
        .map_err(|e: BoxError| {
            if e.is::<tower::load_shed::error::Overloaded>() {
                tonic::Status::resource_exhausted("too many requests in flight; retry later")
            } else {
                tonic::Status::from_error(e)
            }
        })
        .layer(AuthLayer { auth: auth.clone() })
        .load_shed()
        .layer(tower::limit::GlobalConcurrencyLimitLayer::with_semaphore(
            in_flight,
        ))
        .layer(DeadlineLayer {
            max: limits.request_timeout,
        })
        .service(routes);
    tower::util::BoxCloneSyncService::new(service)
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

/// Admits each request by `crate::auth` before anything else runs: a refusal is answered
/// here; an admitted request carries its [`crate::auth::Caller`] in its extensions.
#[derive(Clone, Debug)]
struct AuthLayer {
    auth: Authenticator,
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = Admit<S>;

    fn layer(&self, inner: S) -> Admit<S> {
        Admit {
            inner,
            auth: self.auth.clone(),
        }
    }
}

#[derive(Clone, Debug)]
struct Admit<S> {
    inner: S,
    auth: Authenticator,
}

impl<S, B> tower::Service<http::Request<B>> for Admit<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        match self.auth.admit(&request) {
            Ok(caller) => {
                if let Some(caller) = caller {
                    request.extensions_mut().insert(caller);
                }
                let call = self.inner.call(request);
                Box::pin(async move { call.await.map_err(Into::into) })
            }
            Err(status) => Box::pin(std::future::ready(Ok(status.into_http()))),
        }
    }
}

/// How long a shed caller is told to wait before repeating (`google.rpc.RetryInfo`): long
/// enough for requests in flight to end, short enough not to idle a recovering server.
const SHED_RETRY_DELAY: Duration = Duration::from_millis(250);

/// Answers a request that `load_shed` refused as `RESOURCE_EXHAUSTED` with ErrorInfo reason
/// `OVERLOADED` and a RetryInfo, so clients back off as told (tonic's own answer has neither).
#[derive(Clone, Copy, Debug)]
struct ShedLayer;

impl<S> tower::Layer<S> for ShedLayer {
    type Service = Shed<S>;

    fn layer(&self, inner: S) -> Shed<S> {
        Shed { inner }
    }
}

#[derive(Clone, Debug)]
struct Shed<S> {
    inner: S,
}

impl<S, B> tower::Service<http::Request<B>> for Shed<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let call = self.inner.call(request);
        Box::pin(async move {
            match call.await.map_err(Into::into) {
                Err(e) if e.is::<tower::load_shed::error::Overloaded>() => {
                    Ok(overloaded().into_http())
                }
                other => other,
            }
        })
    }
}

fn overloaded() -> tonic::Status {
    use tonic_types::{ErrorDetails, StatusExt};
    let mut details = ErrorDetails::with_error_info(
        "OVERLOADED",
        "tcc.v1",
        std::collections::HashMap::<String, String>::new(),
    );
    details.set_retry_info(Some(SHED_RETRY_DELAY));
    tonic::Status::with_error_details(
        tonic::Code::ResourceExhausted,
        "too many requests in flight; retry after the delay in RetryInfo",
        details,
    )
}

/// Ends a request with `DEADLINE_EXCEEDED` when it outlives its deadline: the client's
/// `grpc-timeout` if it sent one, capped at `max`. (Streaming responses are bounded only until
/// their first message is ready.)
#[derive(Clone, Copy, Debug)]
struct DeadlineLayer {
    max: Duration,
}

impl<S> tower::Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;

    fn layer(&self, inner: S) -> Deadline<S> {
        Deadline {
            inner,
            max: self.max,
        }
    }
}

#[derive(Clone, Debug)]
struct Deadline<S> {
    inner: S,
    max: Duration,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<S, B> tower::Service<http::Request<B>> for Deadline<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let budget = request
            .headers()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_grpc_timeout)
            // tonic's own timer for the same header answers CANCELLED at the deadline itself:
            // end a hair earlier, with the code the caller expects.
            .map(|t| {
                t.saturating_sub(
                    (t / 50).clamp(Duration::from_millis(1), Duration::from_millis(20)),
                )
            })
            .map_or(self.max, |t| t.min(self.max));
        let call = self.inner.call(request);
        Box::pin(async move {
            match tokio::time::timeout(budget, call).await {
                Ok(result) => result.map_err(Into::into),
                Err(_) => Ok(tonic::Status::deadline_exceeded(format!(
                    "the request's deadline ({} ms) passed",
                    budget.as_millis()
                ))
                .into_http()),
            }
        })
    }
}

/// Parses a gRPC `grpc-timeout` header value (`TimeoutValue TimeoutUnit`, e.g. `250m`).
fn parse_grpc_timeout(v: &str) -> Option<Duration> {
    if v.len() < 2 || v.len() > 9 {
        return None;
    }
    let (digits, unit) = v.split_at(v.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse() {
        assert_eq!(parse_grpc_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse_grpc_timeout("3S"), Some(Duration::from_secs(3)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("100u"), Some(Duration::from_micros(100)));
        for bad in ["", "m", "12", "5x", "1234567890S", "-1S"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad}");
        }
    }
}
