//! W3C Trace Context at serve's edges (docs/OPERATIONS.md, *Traces*): the
//! `traceparent` and `tracestate` of a delivery request read and checked,
//! the span a delivery runs in, and the `traceparent` a forward attempt
//! sends, continuing the trace the effect kept.
//!
//! A `traceparent` that is not one is ignored (the delivery is decided as
//! if it had none), counted in
//! `snapshot_receiver_http_trace_context_invalid_total{reason}` and logged
//! at debug level; never a reason to refuse the delivery.

use axum::http::HeaderMap;
use snapshot_receiver::TraceContext;

/// The header of the trace's parent (W3C Trace Context §3.2).
pub(crate) const TRACEPARENT: &str = "traceparent";

/// The header of the vendors' trace state (W3C Trace Context §3.3).
pub(crate) const TRACESTATE: &str = "tracestate";

/// The trace context a delivery request came with, when it has one valid
/// `traceparent`. Several `tracestate` headers are one list, joined with
/// `,`; a `tracestate` that is not a valid list is dropped and the
/// `traceparent` kept. Two `traceparent` headers are not one trace: both
/// are ignored.
pub(crate) fn read(headers: &HeaderMap) -> Option<TraceContext> {
    let mut parents = headers.get_all(TRACEPARENT).iter();
    let parent = parents.next()?;
    if parents.next().is_some() {
        return invalid("repeated_header", "two traceparent headers");
    }
    let Ok(parent) = parent.to_str() else {
        return invalid("format", "a traceparent that is not text");
    };
    let states: Vec<&str> = headers
        .get_all(TRACESTATE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    let state = (!states.is_empty()).then(|| states.join(","));
    match TraceContext::parse(parent, state.as_deref()) {
        Ok(trace) => Some(trace),
        Err(why) => invalid(why.code(), &why.to_string()),
    }
}

/// Counts an ignored `traceparent` under `reason`; `None`.
fn invalid(reason: &'static str, detail: &str) -> Option<TraceContext> {
    metrics::counter!("snapshot_receiver_http_trace_context_invalid_total", "reason" => reason)
        .increment(1);
    tracing::debug!(
        reason,
        detail,
        "traceparent ignored: the delivery is decided without it"
    );
    None
}

/// The span one delivery request runs in: `trace_id` and `parent_id` of
/// its trace context, when it has one (the library's `delivery` span,
/// inside it, records them too). With OTLP export on (feature `otlp`),
/// the span's parent is the sender's span, so what it exports belongs to
/// the sender's trace.
pub(crate) fn delivery_span(trace: Option<&TraceContext>) -> tracing::Span {
    let span = tracing::info_span!(
        "webhook",
        trace_id = tracing::field::Empty,
        parent_id = tracing::field::Empty,
    );
    if let Some(trace) = trace {
        span.record("trace_id", trace.trace_id_hex());
        span.record("parent_id", trace.parent_id_hex());
        #[cfg(feature = "otlp")]
        crate::otlp::set_parent(&span, trace);
    }
    span
}

/// The span of one forward attempt of an effect (`effect` its id,
/// `trace_id` its trace's), a child of the effect's trace when OTLP
/// export is on.
pub(crate) fn forward_span(effect: &snapshot_receiver::Effect) -> tracing::Span {
    let span = tracing::info_span!(
        "forward",
        effect = %effect.id,
        object_id = %effect.object_id,
        trace_id = tracing::field::Empty,
    );
    if let Some(trace) = &effect.trace {
        span.record("trace_id", trace.trace_id_hex());
        #[cfg(feature = "otlp")]
        crate::otlp::set_parent(&span, trace);
    }
    span
}

/// The trace context a forward attempt sends (`traceparent`,
/// `tracestate`): the effect's trace continued by the attempt's own span,
/// same trace id and flags, a new parent id. With OTLP export on, that id
/// is the exported `forward` span's (`span`), so the application's span
/// hangs under it in the trace; otherwise a new random one.
pub(crate) fn attempt(trace: &TraceContext, span: &tracing::Span) -> TraceContext {
    #[cfg(feature = "otlp")]
    if let Some(next) = crate::otlp::span_id(span).and_then(|id| trace.child(id)) {
        if next.parent_id() != trace.parent_id() {
            return next;
        }
    }
    let _ = span;
    snapshot_receiver::trace::continue_trace(trace)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn one_traceparent_with_its_tracestates_is_read() {
        let mut headers = HeaderMap::new();
        headers.insert(TRACEPARENT, HeaderValue::from_static(PARENT));
        headers.append(TRACESTATE, HeaderValue::from_static("a=1"));
        headers.append(TRACESTATE, HeaderValue::from_static("b=2"));
        let trace = read(&headers).unwrap();
        assert_eq!(trace.traceparent(), PARENT);
        assert_eq!(trace.tracestate(), Some("a=1,b=2"));
    }

    #[test]
    fn two_traceparents_or_an_invalid_one_are_ignored() {
        let mut headers = HeaderMap::new();
        headers.insert(TRACEPARENT, HeaderValue::from_static(PARENT));
        headers.append(TRACEPARENT, HeaderValue::from_static(PARENT));
        assert_eq!(read(&headers), None);
        let mut headers = HeaderMap::new();
        headers.insert(
            TRACEPARENT,
            HeaderValue::from_static("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
        );
        assert_eq!(read(&headers), None);
        assert_eq!(read(&HeaderMap::new()), None);
    }

    #[test]
    fn an_attempt_continues_the_trace_with_a_new_parent() {
        let trace = TraceContext::parse(PARENT, Some("a=1")).unwrap();
        let next = attempt(&trace, &tracing::Span::none());
        assert_eq!(next.trace_id(), trace.trace_id());
        assert_eq!(next.flags(), 1);
        assert_eq!(next.tracestate(), Some("a=1"));
        assert_ne!(next.parent_id(), trace.parent_id());
    }
}
