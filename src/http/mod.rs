//! The HTTP listener of the coordinator and the all-in-one (SPEC 8.4, `--http-listen`): the
//! web console at `/` ([`console`]), the JSON API under `/v1/` ([`reservations`], [`admin`],
//! [`watch`], [`events`]), `/metrics`, `/healthz` and `/readyz`; TLS with the gRPC port's certificate when
//! one is configured.
//!
//! The JSON API has no rules of its own. Each endpoint calls the gRPC service in-process
//! ([`crate::server::InProcess`]: the same tonic routes behind the same auth layer and
//! overload layers, no network hop), forwarding the caller's credentials ([`credentials`]:
//! its `authorization` header, and the client certificate an mTLS listener verified); every
//! refusal, the gRPC service's or this module's own (bad JSON, an unknown field, an oversize
//! body), is a `tonic::Status` made JSON by one function ([`error::respond`]). So a rule
//! changed in `domain`, `auth` or `api` changes both APIs at once.

mod admin;
mod body;
mod console;
mod credentials;
mod error;
mod events;
mod grpc;
mod guard;
mod reservations;
mod watch;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::Router;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tonic::transport::server::TcpConnectInfo;

use crate::auth::{Authenticator, VerifiedClientCertificates};
use crate::server::InProcess;
use crate::tls::{Listener, ServerTls};

use credentials::{Credentials, HttpPeer};
pub(crate) use error::ApiError;
pub use guard::AllowedCallers;

/// The HTTP listener's socket (plaintext or TLS) and the callers it allows beyond its own
/// origin (SPEC 7.4).
pub struct HttpListener {
    pub listener: Listener,
    pub allowed: AllowedCallers,
}

impl From<Listener> for HttpListener {
    /// Its own origin, its addresses and `localhost` only.
    fn from(listener: Listener) -> HttpListener {
        HttpListener {
            listener,
            allowed: AllowedCallers::default(),
        }
    }
}

impl From<tokio::net::TcpListener> for HttpListener {
    fn from(tcp: tokio::net::TcpListener) -> HttpListener {
        Listener::from(tcp).into()
    }
}

/// A check run on request (readiness, participants' health), supplied by the wiring.
pub(crate) type Probe<T> = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = T> + Send>> + Send + Sync>;

/// What the HTTP side serves from: the in-process gRPC path and the checks only the wiring
/// can make.
#[derive(Clone)]
pub struct HttpService {
    /// The coordinator's gRPC services (`tcc.v1.Coordinator`, `tcc.v1.Admin`) behind its auth
    /// layer.
    pub grpc: InProcess,
    /// The same authenticator, for the one endpoint that is no gRPC call (participants'
    /// health): it is admitted as an Admin method, so by the same rules.
    pub auth: Authenticator,
    /// Whether the coordinator can serve: `Err` says why not (`/readyz` answers 503).
    pub ready: Probe<Result<(), String>>,
    /// Each registered participant: where, whether its health service answers SERVING, how
    /// fast, and the last error a call to it met.
    pub participants: Probe<Vec<ParticipantStatus>>,
}

/// A participant as the console's Participants view shows it (filled by the wiring from the
/// coordinator's registry).
#[derive(Clone, Debug)]
pub struct ParticipantStatus {
    pub name: String,
    pub url: String,
    pub serving: bool,
    pub latency: std::time::Duration,
    /// The last failed call's error and when it failed.
    pub last_error: Option<(String, std::time::SystemTime)>,
}

type Shared = Arc<HttpService>;

impl HttpService {
    /// Whether the auth layer would admit this caller to the gRPC `method`
    /// (`/tcc.v1.Service/Method`): the same [`Authenticator`], asked with the caller's
    /// credentials.
    fn admit(&self, credentials: &Credentials, method: &str) -> Result<(), tonic::Status> {
        self.auth.admit(&credentials.probe(method)?).map(|_| ())
    }

    /// Bad input found here, before any gRPC call, is answered only to a caller admitted to
    /// `method`; others get the auth layer's 401/403 whatever they sent, as over gRPC, where
    /// admission comes before the message is read.
    fn refuse(&self, credentials: &Credentials, method: &str, bad: tonic::Status) -> ApiError {
        ApiError(self.admit(credentials, method).err().unwrap_or(bad))
    }
}

/// The routes: console, JSON API, probes, metrics; every request first past the origin rules
/// of `guard` (for the listener `rules` describe), every answer with the security headers.
fn router(service: HttpService, rules: guard::CallerRules) -> Router {
    Router::new()
        .merge(console::routes())
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .merge(reservations::routes())
        .merge(admin::routes())
        .merge(events::routes())
        .fallback(not_found)
        .with_state(Arc::new(service))
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(rules),
            guard::check,
        ))
        .layer(axum::middleware::map_response(security_headers))
}

/// Serves [`router`] on `listener` (TLS when it has a certificate) until `shutdown`, then
/// lets open requests finish (Watch streams end when the coordinator closes them). Its
/// connections are bounded by the listener's limits (`crate::conn`): a request open (an SSE
/// stream included) keeps its connection from counting as idle.
pub async fn serve(
    listener: HttpListener,
    service: HttpService,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let HttpListener { listener, allowed } = listener;
    let rules = guard::CallerRules::new(listener.local_addr()?, listener.tls().is_some(), allowed);
    let app = router(service, rules).layer(crate::conn::TrackLayer::new(open_on));
    let limits = listener.limits();
    match listener.into_parts() {
        (tcp, None) => {
            let incoming = HttpIncoming(crate::conn::accept_plain(tcp, limits));
            serve_on(incoming, app, shutdown).await
        }
        (tcp, Some(tls)) => {
            let incoming = crate::conn::accept_tls(tcp, limits, tls, ServerTls::http1_config);
            serve_on(HttpIncoming(incoming), app, shutdown).await
        }
    }
}

async fn serve_on<IO: HttpIo>(
    incoming: HttpIncoming<IO>,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Each request knows its connection's peer: its addresses, the client certificate it
    // proved, if any.
    let app = app.into_make_service_with_connect_info::<HttpPeer>();
    axum::serve(incoming, app)
        .with_graceful_shutdown(shutdown)
        .await
}

/// The connection a request came on, for [`crate::conn::TrackLayer`].
fn open_on(extensions: &mut axum::http::Extensions) -> Option<crate::conn::Active> {
    extensions
        .get::<ConnectInfo<HttpPeer>>()
        .and_then(|peer| peer.0.active.clone())
}

/// A connection the HTTP listener serves: plaintext TCP or TLS over it.
trait HttpIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static {
    fn tcp(&self) -> &TcpStream;

    /// The client certificate chain its handshake verified: present only when the listener
    /// requires client certificates, and then verified against `--tls-client-ca`.
    fn certificates(&self) -> Option<VerifiedClientCertificates> {
        None
    }
}

impl HttpIo for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

impl HttpIo for TlsStream<TcpStream> {
    fn tcp(&self) -> &TcpStream {
        self.get_ref().0
    }

    fn certificates(&self) -> Option<VerifiedClientCertificates> {
        VerifiedClientCertificates::verified_by(self.get_ref().1)
    }
}

/// Accepted connections (handshakes run concurrently, each within the header timeout: a
/// silent client cannot hold up the others) as an axum listener.
struct HttpIncoming<IO>(crate::conn::Accepted<IO>);

impl<IO: HttpIo> axum::serve::Listener for HttpIncoming<IO> {
    type Io = crate::conn::Guarded<IO>;
    type Addr = HttpPeer;

    async fn accept(&mut self) -> (Self::Io, HttpPeer) {
        let Some(connection) = self.0.next().await else {
            // The accepting task ended (its listener failed for good): nothing will come.
            return std::future::pending().await;
        };
        let io = connection.get_ref();
        let tcp = io.tcp();
        let peer = HttpPeer {
            certificates: io.certificates(),
            connection: Some(TcpConnectInfo {
                local_addr: tcp.local_addr().ok(),
                remote_addr: tcp.peer_addr().ok(),
            }),
            active: Some(connection.active()),
        };
        (connection, peer)
    }

    /// The listener's own end proves nothing.
    fn local_addr(&self) -> std::io::Result<HttpPeer> {
        Ok(HttpPeer::default())
    }
}

impl<IO: HttpIo>
    axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, HttpIncoming<IO>>>
    for HttpPeer
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, HttpIncoming<IO>>) -> HttpPeer {
        stream.remote_addr().clone()
    }
}

async fn readyz(State(service): State<Shared>) -> Response {
    match (service.ready)().await {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
            .into_response(),
    }
}

/// The Prometheus text, to a caller with the `metrics` or `admin` role when auth is on.
async fn metrics(State(service): State<Shared>, credentials: Credentials) -> Response {
    if let Err(refused) = service.admit(&credentials, crate::auth::rules::METRICS_PATH) {
        return ApiError(refused).into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        crate::telemetry::metrics_handle().render(),
    )
        .into_response()
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::from(tonic::Status::not_found(format!(
        "no such endpoint: {} (see the README's JSON API)",
        uri.path()
    )))
}

/// Every answer: no sniffing, no framing, scripts and styles only from this origin, no
/// caching of API answers.
async fn security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
        ),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}
