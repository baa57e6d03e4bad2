//! OpenTelemetry export of serve's spans over OTLP/HTTP with protobuf
//! bodies (feature `otlp`, `serve --otlp-endpoint URL`): the `tracing`
//! spans at info level and above (a delivery request's `webhook`, the
//! library's `delivery`, a forward attempt's `forward`, ...) become
//! OpenTelemetry spans, batched and POSTed to `URL/v1/traces`.
//!
//! A delivery whose request carried a W3C `traceparent` is exported in
//! that trace, its `webhook` span a child of the sender's span; the
//! forward attempt of its effect is a span of the same trace, and the
//! `traceparent` it sends names that span, so the application's span
//! hangs under it.

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId};
use opentelemetry::trace::{TraceState, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig as _;
use snapshot_receiver::TraceContext;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The path OTLP/HTTP takes traces on, after the collector's base URL.
const TRACES_PATH: &str = "/v1/traces";

/// The exporter's provider while the process runs: dropped at exit, it
/// exports what is still batched and stops (its `Drop`).
pub(crate) struct Export {
    /// Owns the batch processor and its thread.
    provider: opentelemetry_sdk::trace::SdkTracerProvider,
}

impl Drop for Export {
    fn drop(&mut self) {
        if let Err(e) = self.provider.shutdown() {
            eprintln!("warning: OTLP export did not finish: {e}");
        }
    }
}

/// The URL spans are POSTed to: `endpoint` (the collector's base URL, as
/// `OTEL_EXPORTER_OTLP_ENDPOINT` names it) with `/v1/traces` after it,
/// unless it ends so already.
///
/// # Errors
/// A message naming the flag when `endpoint` is not an `http://` or
/// `https://` URL.
pub(crate) fn traces_url(endpoint: &str) -> Result<String, String> {
    let base = endpoint.trim();
    let rest = base
        .strip_prefix("http://")
        .or_else(|| base.strip_prefix("https://"));
    if rest.is_none_or(|r| r.is_empty() || r.starts_with('/')) {
        return Err(format!(
            "--otlp-endpoint {endpoint:?}: not an http:// or https:// URL of an OTLP/HTTP collector"
        ));
    }
    let base = base.trim_end_matches('/');
    Ok(if base.ends_with(TRACES_PATH) {
        base.to_owned()
    } else {
        format!("{base}{TRACES_PATH}")
    })
}

/// The layer that exports spans to `endpoint`, and the provider to keep
/// until exit.
///
/// # Errors
/// The endpoint is not a URL ([`traces_url`]), or the exporter could not
/// be built.
pub(crate) fn layer<S>(
    endpoint: &str,
) -> Result<(impl tracing_subscriber::Layer<S>, Export), String>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let url = traces_url(endpoint)?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(url.clone())
        .build()
        .map_err(|e| format!("--otlp-endpoint {endpoint}: {e}"))?;
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name("snapshot-receiver")
                .build(),
        )
        .build();
    let tracer = provider.tracer("snapshot-receiver");
    Ok((
        tracing_opentelemetry::layer().with_tracer(tracer),
        Export { provider },
    ))
}

/// Makes the remote span of `trace` (the sender's) the parent of `span`,
/// when spans are exported; nothing otherwise.
pub(crate) fn set_parent(span: &tracing::Span, trace: &TraceContext) {
    let state = trace
        .tracestate()
        .and_then(|s| s.parse::<TraceState>().ok())
        .unwrap_or_default();
    let remote = SpanContext::new(
        TraceId::from_bytes(trace.trace_id()),
        SpanId::from_bytes(trace.parent_id()),
        TraceFlags::new(trace.flags()),
        true,
        state,
    );
    let parent = opentelemetry::Context::new().with_remote_span_context(remote);
    // Without the export layer (no --otlp-endpoint) there is no parent to
    // set: the trace still goes on in the headers.
    let _ = span.set_parent(parent);
}

/// The id of `span` as exported, when spans are exported; `None`
/// otherwise.
pub(crate) fn span_id(span: &tracing::Span) -> Option<[u8; 8]> {
    let context = span.context();
    let span_context = context.span().span_context().clone();
    span_context
        .is_valid()
        .then(|| span_context.span_id().to_bytes())
}

#[cfg(test)]
mod tests {
    use super::traces_url;

    #[test]
    fn the_traces_path_follows_the_collector_url_once() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("https://collector/otlp/").unwrap(),
            "https://collector/otlp/v1/traces"
        );
        assert_eq!(
            traces_url("http://c:4318/v1/traces").unwrap(),
            "http://c:4318/v1/traces"
        );
        assert_eq!(
            traces_url("collector:4318").unwrap_err(),
            "--otlp-endpoint \"collector:4318\": not an http:// or https:// URL of an OTLP/HTTP collector"
        );
        assert!(traces_url("http://").is_err());
    }
}
