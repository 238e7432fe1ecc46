//! Telemetry: logging (`tracing` to stderr, filtered by `RUST_LOG`, default `info`) and
//! Prometheus metrics (the SPEC names, recorded through the `metrics` facade, served as text
//! on `/metrics`).

use std::future::Future;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Installs the global log subscriber; a second call is a no-op.
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx::postgres::notice=warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Metric names (SPEC section 5), in one place.
pub mod names {
    pub const RESERVATIONS: &str = "holdfast_reservations_total";
    pub const HOLD_TO_CONFIRM: &str = "holdfast_hold_to_confirm_ratio";
    pub const EXPIRED_HOLDS: &str = "holdfast_expired_holds_total";
    pub const REFUNDS: &str = "holdfast_refunds_total";
    pub const BRANCH_CALL_SECONDS: &str = "holdfast_branch_call_seconds";
    pub const RECOVERY_BACKLOG: &str = "holdfast_recovery_backlog";
    pub const RPC_REQUESTS: &str = "holdfast_rpc_requests_total";
    pub const RPC_SECONDS: &str = "holdfast_rpc_seconds";
    pub const FAILED: &str = "holdfast_failed_reservations_total";
}

/// The process's metrics recorder, installed on first use.
pub fn metrics_handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let buckets = [
            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
        ];
        let recorder = PrometheusBuilder::new()
            .set_buckets(&buckets)
            .map(PrometheusBuilder::build_recorder)
            .unwrap_or_else(|_| PrometheusBuilder::new().build_recorder());
        let handle = recorder.handle();
        // Another recorder may already be installed (a host application's): then ours only
        // renders what it records itself, which is nothing; say so once.
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!("a metrics recorder was already installed; /metrics stays empty");
        }
        handle
    })
}

static HELD: AtomicU64 = AtomicU64::new(0);
static CONFIRMED: AtomicU64 = AtomicU64::new(0);

/// A reservation entered `state` (counted once per transition, by the instance that made it).
pub fn reservation_entered(state: crate::domain::State) {
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
pub fn hold_expired() {
    metrics::counter!(names::EXPIRED_HOLDS).increment(1);
}

/// A refund was recorded (`PENDING`) or acknowledged (`REFUNDED`).
pub fn refund(state: crate::domain::RefundState) {
    metrics::counter!(names::REFUNDS, "state" => state.as_str()).increment(1);
}

/// One participant call took `elapsed`.
pub fn branch_call(participant: &str, phase: &'static str, elapsed: Duration) {
    metrics::histogram!(names::BRANCH_CALL_SECONDS, "participant" => participant.to_owned(), "phase" => phase)
        .record(elapsed.as_secs_f64());
}

/// One RPC served.
pub fn rpc(method: &'static str, code: tonic::Code, elapsed: Duration) {
    metrics::counter!(names::RPC_REQUESTS, "method" => method, "code" => format!("{code:?}"))
        .increment(1);
    metrics::histogram!(names::RPC_SECONDS, "method" => method).record(elapsed.as_secs_f64());
}

/// Reservations waiting to be driven to their outcome.
pub fn recovery_backlog(n: i64) {
    metrics::gauge!(names::RECOVERY_BACKLOG).set(n as f64);
}

/// Serves the Prometheus text format on `GET /metrics` until `shutdown`. Deliberately tiny:
/// one request per connection, nothing else routed.
pub async fn serve_metrics(listener: TcpListener, shutdown: impl Future<Output = ()> + Send) {
    let handle = metrics_handle();
    tokio::pin!(shutdown);
    loop {
        let (mut stream, _) = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics listener accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        tokio::spawn(async move {
            let mut buf = vec![0u8; 8192];
            let mut read = 0;
            // Read the request head (bounded), with a deadline, then answer and close.
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
            let (status, body) = if request.starts_with("GET /metrics ") {
                ("200 OK", handle.render())
            } else {
                (
                    "404 Not Found",
                    "only GET /metrics is served here\n".to_owned(),
                )
            };
            let response = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}
