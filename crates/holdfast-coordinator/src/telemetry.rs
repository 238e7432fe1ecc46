//! Telemetry: logging (`tracing` to stderr, filtered by `RUST_LOG`, default `info`, coloured
//! only when stderr is a terminal), traces
//! (OTLP over gRPC when `OTEL_EXPORTER_OTLP_ENDPOINT` is set, W3C trace context carried in gRPC
//! metadata), and Prometheus metrics (the SPEC names, recorded through the `metrics` facade,
//! served as text on `/metrics`, over TLS when the process has a certificate).

use std::future::Future;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

static TRACER_PROVIDER: OnceLock<opentelemetry_sdk::trace::SdkTracerProvider> = OnceLock::new();

/// Installs the global subscriber: logs to stderr, plus OTLP trace export when
/// `OTEL_EXPORTER_OTLP_ENDPOINT` is set (nothing is exported, and nothing extra done per call,
/// when it is not). Call inside the Tokio runtime. A second call is a no-op.
pub fn init() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx::postgres::notice=warn"));
    // Colours only on a terminal: a log file or a collector's pipe gets plain text.
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otlp_layer())
        .try_init();
}

fn otlp_layer<S>()
-> Option<tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::SdkTracer>>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    use opentelemetry::trace::TracerProvider;
    let endpoint = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT")
        .ok()
        .filter(|e| !e.is_empty())?;
    let exporter = match opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()
    {
        Ok(e) => e,
        Err(e) => {
            eprintln!("holdfast: OTLP export to {endpoint} disabled: {e}");
            return None;
        }
    };
    let mut resource = opentelemetry_sdk::Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("holdfast");
    }
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    let tracer = provider.tracer("holdfast");
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    opentelemetry::global::set_tracer_provider(provider.clone());
    let _ = TRACER_PROVIDER.set(provider);
    propagation::enable();
    Some(tracing_opentelemetry::layer().with_tracer(tracer))
}

/// Flushes spans not yet exported (on shutdown).
pub fn shutdown() {
    if let Some(provider) = TRACER_PROVIDER.get() {
        let _ = provider.shutdown();
    }
}

/// W3C trace context in gRPC metadata (the serving crate's: participants propagate it too).
pub use holdfast_serve::propagation;

/// Metric names (SPEC section 5), in one place.
/// Operator metrics: retention, participants (`telemetry/ops.rs`).
pub mod ops;

/// Every family's `# HELP`, the build's version, the process-wide counters at 0.
mod help;

pub mod names {
    pub(crate) const RESERVATIONS: &str = "holdfast_reservations_total";
    pub(crate) const HOLD_TO_CONFIRM: &str = "holdfast_hold_to_confirm_ratio";
    pub(crate) const EXPIRED_HOLDS: &str = "holdfast_expired_holds_total";
    pub(crate) const REFUNDS: &str = "holdfast_refunds_total";
    pub(crate) const BRANCH_CALL_SECONDS: &str = "holdfast_branch_call_seconds";
    pub(crate) const RECOVERY_BACKLOG: &str = "holdfast_recovery_backlog";
    pub(crate) const UNREGISTERED_BACKLOG: &str = "holdfast_unregistered_participant_backlog";
    pub(crate) const RPC_REQUESTS: &str = "holdfast_rpc_requests_total";
    pub(crate) const RPC_SECONDS: &str = "holdfast_rpc_seconds";
    pub(crate) const FAILED: &str = "holdfast_failed_reservations_total";
    pub const AUTH_FAILURES: &str = holdfast_serve::auth::AUTH_FAILURES;
    pub const TLS_RELOAD_FAILURES: &str = holdfast_serve::tls::TLS_RELOAD_FAILURES;
    pub(crate) const WATCH_POLLS: &str = "holdfast_watch_polls_total";
    pub(crate) const WATCHED: &str = "holdfast_watched_reservations";
    pub(crate) const ADMIN_ACTIONS: &str = "holdfast_admin_actions_total";
    pub(crate) const SOLD_OUT_REFUSALS: &str = "holdfast_sold_out_refusals_total";
}

/// The process's metrics recorder, installed on first use.
pub fn metrics_handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let buckets = [
            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
        ];
        // A waitlist's wait lasts seconds to an hour (--max-queue-wait).
        let waits = [
            1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
        ];
        let recorder = PrometheusBuilder::new()
            .set_buckets(&buckets)
            .and_then(|b| {
                b.set_buckets_for_metric(
                    metrics_exporter_prometheus::Matcher::Full(ops::ops_names::QUEUE_WAIT.into()),
                    &waits,
                )
            })
            .map(PrometheusBuilder::build_recorder)
            .unwrap_or_else(|_| PrometheusBuilder::new().build_recorder());
        let handle = recorder.handle();
        // Another recorder may already be installed (a host application's): then ours only
        // renders what it records itself, which is nothing; say so once.
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!("a metrics recorder was already installed; /metrics stays empty");
        } else {
            help::describe_all();
        }
        handle
    })
}

static HELD: AtomicU64 = AtomicU64::new(0);
static CONFIRMED: AtomicU64 = AtomicU64::new(0);

/// A Reserve refused by the sold-out fast path, recording nothing.
pub(crate) fn sold_out_refused(participant: &str) {
    metrics::counter!(names::SOLD_OUT_REFUSALS, "participant" => participant.to_owned())
        .increment(1);
}

/// A reservation entered `state` (counted once per transition, by the instance that made it).
pub(crate) fn reservation_entered(state: crate::domain::State) {
    use crate::domain::State;
    metrics::counter!(names::RESERVATIONS, "state" => state.as_str()).increment(1);
    match state {
        State::Held => {
            HELD.fetch_add(1, Ordering::Relaxed);
        }
        State::Confirmed => {
            CONFIRMED.fetch_add(1, Ordering::Relaxed);
        }
        State::Failed => metrics::counter!(names::FAILED).increment(1),
        _ => {}
    }
    let held = HELD.load(Ordering::Relaxed);
    if held > 0 {
        let ratio = CONFIRMED.load(Ordering::Relaxed) as f64 / held as f64;
        metrics::gauge!(names::HOLD_TO_CONFIRM).set(ratio);
    }
}

/// A hold lapsed and its release was decided (once per reservation).
pub(crate) fn hold_expired() {
    metrics::counter!(names::EXPIRED_HOLDS).increment(1);
}

/// An operator's action (`tcc.v1.Admin`) was taken and audited.
pub(crate) fn admin_action(action: &'static str) {
    metrics::counter!(names::ADMIN_ACTIONS, "action" => action).increment(1);
}

/// A refund was recorded (`PENDING`) or acknowledged (`REFUNDED`).
pub fn refund(state: crate::domain::RefundState) {
    metrics::counter!(names::REFUNDS, "state" => state.as_str()).increment(1);
}

/// One participant call took `elapsed`.
pub(crate) fn branch_call(participant: &str, phase: &'static str, elapsed: Duration) {
    metrics::histogram!(names::BRANCH_CALL_SECONDS, "participant" => participant.to_owned(), "phase" => phase)
        .record(elapsed.as_secs_f64());
}

/// One RPC served.
pub fn rpc(method: &'static str, code: tonic::Code, elapsed: Duration) {
    metrics::counter!(names::RPC_REQUESTS, "method" => method, "code" => format!("{code:?}"))
        .increment(1);
    metrics::histogram!(names::RPC_SECONDS, "method" => method).record(elapsed.as_secs_f64());
}

/// The shared poller of WatchReservation read the versions of `watched` reservations (one
/// statement for all of them).
pub(crate) fn watch_poll(watched: usize) {
    metrics::counter!(names::WATCH_POLLS).increment(1);
    metrics::gauge!(names::WATCHED).set(watched as f64);
}

/// Reservations waiting to be driven to their outcome.
pub(crate) fn recovery_backlog(n: i64) {
    metrics::gauge!(names::RECOVERY_BACKLOG).set(n as f64);
}

/// How many unfinished reservations wait on `participant`, which is not registered (counted
/// at start).
pub(crate) fn unregistered_backlog(participant: &str, n: i64) {
    metrics::gauge!(names::UNREGISTERED_BACKLOG, "participant" => participant.to_owned())
        .set(n as f64);
}

/// Serves the Prometheus text format on `GET /metrics` until `shutdown`, over TLS when
/// `listener` has it (the same certificate as the gRPC ports), to callers `auth` admits to
/// [`crate::auth::rules::METRICS_PATH`] (a key with the `metrics` or `admin` role when auth is
/// on), its connections bounded by the listener's limits (`crate::conn`). Deliberately tiny:
/// one request per connection, nothing else routed.
pub async fn serve_metrics(
    listener: impl Into<crate::tls::Listener>,
    auth: crate::auth::Authenticator,
    shutdown: impl Future<Output = ()> + Send,
) {
    let listener = listener.into();
    let limits = listener.limits();
    match listener.into_parts() {
        (tcp, None) => {
            let incoming = crate::conn::accept_plain(tcp, limits);
            answer_each(incoming, |_| None, auth, shutdown).await
        }
        (tcp, Some(tls)) => {
            let incoming =
                crate::conn::accept_tls(tcp, limits, tls, crate::tls::ServerTls::http1_config);
            answer_each(incoming, verified_certificates, auth, shutdown).await
        }
    }
}

/// The client certificate chain a TLS connection's handshake verified, if it asked for one.
fn verified_certificates(
    stream: &tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
) -> Option<crate::auth::VerifiedClientCertificates> {
    crate::auth::VerifiedClientCertificates::verified_by(stream.get_ref().1)
}

/// Answers each connection of `incoming` (`certificates`: what its handshake verified).
async fn answer_each<IO>(
    mut incoming: crate::conn::Accepted<IO>,
    certificates: fn(&IO) -> Option<crate::auth::VerifiedClientCertificates>,
    auth: crate::auth::Authenticator,
    shutdown: impl Future<Output = ()> + Send,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let handle = metrics_handle();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            _ = &mut shutdown => return,
            accepted = incoming.next() => match accepted {
                Some(stream) => stream,
                // The accepting task ended (its listener failed for good).
                None => return,
            },
        };
        let certificates = certificates(stream.get_ref());
        let auth = auth.clone();
        tokio::spawn(async move {
            answer_metrics(stream, handle, &auth, certificates).await;
        });
    }
}

/// Whether `auth` admits the caller of the request `head` (its `authorization` header, or the
/// client certificate its TLS handshake verified) to read the metrics.
fn admit_scraper(
    auth: &crate::auth::Authenticator,
    head: &str,
    certificates: Option<crate::auth::VerifiedClientCertificates>,
) -> Result<(), tonic::Status> {
    let mut probe = http::Request::builder().uri(crate::auth::rules::METRICS_PATH);
    let authorization = head.split("\r\n").skip(1).find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("authorization")
            .then(|| value.trim())
    });
    if let Some(value) = authorization {
        probe = probe.header(http::header::AUTHORIZATION, value);
    }
    if let Some(certificates) = certificates {
        probe = probe.extension(certificates);
    }
    // A header that cannot be one proves nobody.
    let probe = probe
        .body(())
        .or_else(|_| {
            http::Request::builder()
                .uri(crate::auth::rules::METRICS_PATH)
                .body(())
        })
        .map_err(|e| tonic::Status::internal(format!("the auth check: {e}")))?;
    auth.admit(&probe).map(|_| ())
}

/// Reads one request head (bounded, with a deadline), answers it and closes.
async fn answer_metrics<S>(
    mut stream: S,
    handle: &PrometheusHandle,
    auth: &crate::auth::Authenticator,
    certificates: Option<crate::auth::VerifiedClientCertificates>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 8192];
    let mut read = 0;
    let head = tokio::time::timeout(Duration::from_secs(5), async {
        while read < buf.len() {
            match stream.read(&mut buf[read..]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => read += n,
            }
            if buf[..read].windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
    })
    .await;
    if head.is_err() {
        return;
    }
    let request = String::from_utf8_lossy(&buf[..read]);
    let (status, body) = if !request.starts_with("GET /metrics ") {
        (
            "404 Not Found",
            "only GET /metrics is served here\n".to_owned(),
        )
    } else {
        match admit_scraper(auth, &request, certificates) {
            Ok(()) => ("200 OK", handle.render()),
            Err(refused) if refused.code() == tonic::Code::Unauthenticated => (
                "401 Unauthorized",
                "a key with the metrics role is required: authorization: Bearer <key>\n".to_owned(),
            ),
            Err(_) => (
                "403 Forbidden",
                "this principal lacks the metrics role\n".to_owned(),
            ),
        }
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}
