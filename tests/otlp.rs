//! `serve --otlp-endpoint URL` (feature `otlp`, docs/OPERATIONS.md
//! *Traces*): serve's spans exported over OTLP/HTTP with protobuf bodies
//! to a collector this test runs on loopback, which decodes each
//! `ExportTraceServiceRequest`. A delivery with a `traceparent` is
//! exported in the sender's trace, its `webhook` span a child of the
//! sender's span; the forward attempt of its effect is a `forward` span of
//! the same trace, and the `traceparent` the application receives names
//! that span.

use crate::forward::Sink;
use crate::serve::{envelope, Server, NEW_SECRET};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One exported span, as the collector decoded it.
#[derive(Clone, Debug)]
struct Exported {
    name: String,
    /// 32 lowercase hex digits.
    trace_id: String,
    /// 16 lowercase hex digits.
    span_id: String,
    /// 16 lowercase hex digits, empty for a root span.
    parent_span_id: String,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An OTLP/HTTP collector on loopback: `POST /v1/traces` with a protobuf
/// body, every span kept; its base URL, what it received, and the sender
/// whose drop stops it.
fn collector() -> (
    String,
    Arc<Mutex<Vec<Exported>>>,
    tokio::sync::oneshot::Sender<()>,
) {
    let spans: Arc<Mutex<Vec<Exported>>> = Arc::default();
    let kept = spans.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let kept = kept.clone();
            async move {
                let request = ExportTraceServiceRequest::decode(body.as_ref())
                    .expect("an ExportTraceServiceRequest in protobuf");
                let mut kept = kept.lock().unwrap();
                for resource in request.resource_spans {
                    for scope in resource.scope_spans {
                        for span in scope.spans {
                            kept.push(Exported {
                                name: span.name,
                                trace_id: hex(&span.trace_id),
                                span_id: hex(&span.span_id),
                                parent_span_id: hex(&span.parent_span_id),
                            });
                        }
                    }
                }
                axum::http::StatusCode::OK
            }
        }),
    );
    let (addr, stop) = crate::common::loopback::serve(app);
    (format!("http://{addr}"), spans, stop)
}

#[test]
fn a_delivery_with_a_traceparent_is_exported_in_its_trace_and_so_is_its_forward() {
    const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const SENDER_SPAN: &str = "00f067aa0ba902b7";
    let (url, spans, _collector) = collector();
    let sink = Sink::start(Box::new(|_, _, _| (204, None)));
    let fixture = crate::common::repo("fixtures/B62-15-events.json")
        .display()
        .to_string();
    // Batches leave every 100 ms instead of every 5 s.
    let server = Server::start_env(
        &[
            "--store",
            "memory",
            "--initial",
            &fixture,
            "--otlp-endpoint",
            &url,
            "--forward",
            &sink.url,
            "--forward-secret",
            NEW_SECRET,
        ],
        &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
    );
    let body = envelope("e-11", "card-7", 11, r#"{"stage":"a"}"#);
    let reply = server.post(
        &[("traceparent", format!("00-{TRACE_ID}-{SENDER_SPAN}-01"))],
        &body,
    );
    assert_eq!(reply.status, 200, "{}", reply.body);
    let got = sink.wait_accepted(1);
    let sent = got[0]
        .traceparent
        .clone()
        .expect("a traceparent on the forward");
    let forward_span = sent.split('-').nth(2).unwrap().to_owned();

    let deadline = Instant::now() + Duration::from_secs(60);
    let in_trace = loop {
        let in_trace: Vec<Exported> = spans
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.trace_id == TRACE_ID)
            .cloned()
            .collect();
        let names: Vec<&str> = in_trace.iter().map(|s| s.name.as_str()).collect();
        if names.contains(&"webhook") && names.contains(&"forward") {
            break in_trace;
        }
        assert!(
            Instant::now() < deadline,
            "spans of the trace so far: {in_trace:?}; all: {:?}",
            spans.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let webhook = in_trace.iter().find(|s| s.name == "webhook").unwrap();
    assert_eq!(webhook.parent_span_id, SENDER_SPAN, "{in_trace:?}");
    // The library's delivery span, inside the request's.
    let delivery = in_trace
        .iter()
        .find(|s| s.name == "delivery")
        .unwrap_or_else(|| panic!("no delivery span: {in_trace:?}"));
    assert_eq!(delivery.parent_span_id, webhook.span_id);
    // The forward attempt is the span the application's traceparent names.
    let forward = in_trace.iter().find(|s| s.name == "forward").unwrap();
    assert_eq!(forward.span_id, forward_span, "{in_trace:?}; sent {sent}");
    assert_eq!(sent, format!("00-{TRACE_ID}-{forward_span}-01"));
    assert!(server.stop().0.success());
}
