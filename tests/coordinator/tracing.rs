//! One trace from the caller through the coordinator to each participant: the real binary
//! exports its spans over OTLP to a small in-test collector, and the trace id the caller sent
//! in `traceparent` is on the coordinator's span and on both participants' spans.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use holdfast::proto;
use holdfast::proto::coordinator_client::CoordinatorClient;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::Span;

use crate::common::put_resources_request;
use crate::process::{Holdfast, TempDatabase, admin, listen_addr, participant_addr, serving};

/// An OTLP trace receiver that keeps every span it is sent.
#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<Span>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for rs in request.into_inner().resource_spans {
            for ss in rs.scope_spans {
                spans.extend(ss.spans);
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

#[tokio::test]
async fn one_reserve_is_one_trace_across_coordinator_and_participants() {
    let collector = Collector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let otlp = format!("http://{}", listener.local_addr().unwrap());
    let server = collector.clone();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(server))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .unwrap();
    });

    let db = TempDatabase::create().await;
    let listen = listen_addr(1);
    let log = std::env::temp_dir().join(format!("holdfast-trace-{}.log", std::process::id()));
    let mut process = Holdfast::start_with(
        &db.url,
        listen,
        log.clone(),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    );
    serving(&mut process, listen).await;
    for (port, resource, capacity) in [(50061, "A1", 1), (50062, "sku-1", 5)] {
        admin(participant_addr(listen, port))
            .await
            .put_resources(put_resources_request(&[(resource, capacity)]))
            .await
            .unwrap();
    }

    // The caller's own trace.
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let mut request = tonic::Request::new(proto::ReserveRequest {
        request_id: "traced".into(),
        holder: "alice".into(),
        ttl: None,
        holds: vec![
            proto::Hold {
                participant: "stock".into(),
                resource: "sku-1".into(),
                quantity: 1,
                during: None,
            },
            proto::Hold {
                participant: "seats".into(),
                resource: "A1".into(),
                quantity: 1,
                during: None,
            },
        ],
        labels: Default::default(),
        queue: None,
    });
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{trace_id}-00f067aa0ba902b7-01")
            .parse()
            .unwrap(),
    );
    let reserved = CoordinatorClient::connect(format!("http://{listen}"))
        .await
        .unwrap()
        .reserve(request)
        .await
        .unwrap()
        .into_inner();

    let wanted = hex(trace_id);
    let deadline = Instant::now() + Duration::from_secs(20);
    let ours = loop {
        let spans: Vec<Span> = collector
            .spans
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.trace_id == wanted)
            .cloned()
            .collect();
        let participant_tries = spans
            .iter()
            .filter(|s| s.name == "tcc.v1.Participant/Try")
            .count();
        if participant_tries == 2 && spans.iter().any(|s| s.name == "tcc.v1.Coordinator/Reserve") {
            break spans;
        }
        assert!(
            Instant::now() < deadline,
            "spans of the trace so far: {:?}",
            spans.iter().map(|s| &s.name).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let names: Vec<&str> = ours.iter().map(|s| s.name.as_str()).collect();
    for expected in ["tcc.v1.Coordinator/Reserve", "seats/try", "stock/try"] {
        assert!(names.contains(&expected), "{expected} in {names:?}");
    }
    // Each participant's server span is the child of the coordinator's call to it: the
    // context crossed the wire.
    for client in ["seats/try", "stock/try"] {
        let call = ours.iter().find(|s| s.name == client).unwrap();
        assert!(
            ours.iter()
                .any(|s| s.name == "tcc.v1.Participant/Try" && s.parent_span_id == call.span_id),
            "no participant span under {client}"
        );
    }
    // The coordinator's server span continues the caller's span.
    let root = ours
        .iter()
        .find(|s| s.name == "tcc.v1.Coordinator/Reserve")
        .unwrap();
    assert_eq!(root.parent_span_id, hex("00f067aa0ba902b7"));
    // The secret never reaches a span.
    let dump = format!("{ours:?}");
    assert!(
        !dump.contains(&reserved.hold_token),
        "hold token leaked into spans"
    );

    process.kill();
    drop(db);
    let _ = std::fs::remove_file(&log);
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}
