//! W3C trace context in gRPC metadata: read from incoming calls, written into outgoing ones.
//! Only the OpenTelemetry API is used here; a process that exports traces installs the SDK's
//! propagator and tracer provider itself and then calls [`enable`]. Until then nothing is done
//! per call.

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::{Extractor, Injector};
use tracing_opentelemetry::OpenTelemetrySpanExt;

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Trace context is worth reading and writing from now on (a tracer provider and a text-map
/// propagator are installed globally).
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// Whether [`enable`] was called: traces are exported.
pub(crate) fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

struct Metadata<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for Metadata<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
            tonic::metadata::MetadataValue::try_from(value.as_str()),
        ) {
            self.0.insert(k, v);
        }
    }
}

/// The span of one served RPC, a child of the caller's trace when it sent one. Its
/// `trace_id` field puts the trace id on every log line inside it.
pub(crate) fn server_span(request: &http::Request<()>) -> tracing::Span {
    let path = request.uri().path();
    let span = tracing::info_span!(
        "rpc",
        otel.name = %path.trim_start_matches('/'),
        otel.kind = "server",
        rpc.method = %path,
        trace_id = tracing::field::Empty,
    );
    if enabled() {
        let parent = opentelemetry::global::get_text_map_propagator(|p| {
            p.extract(&Headers(request.headers()))
        });
        let _ = span.set_parent(parent);
        record_trace_id(&span);
    }
    span
}

/// Records the span's trace id in its `trace_id` field.
fn record_trace_id(span: &tracing::Span) {
    use opentelemetry::trace::TraceContextExt;
    let cx = span.context();
    let id = cx.span().span_context().trace_id();
    if id != opentelemetry::trace::TraceId::INVALID {
        span.record("trace_id", tracing::field::display(id));
    }
}

/// Writes the current span's trace context into an outgoing call's metadata.
pub fn inject(metadata: &mut tonic::metadata::MetadataMap) {
    if !enabled() {
        return;
    }
    let cx = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut Metadata(metadata))
    });
}
