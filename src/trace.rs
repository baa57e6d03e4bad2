//! W3C Trace Context on the receiver's edges (docs/CONTRACT.md §10): a
//! delivery's trace context in ([`crate::DeliveryMeta`],
//! [`crate::core::Delivery::with_trace`]), an effect's out
//! ([`crate::Effect::trace`], continued by [`continue_trace`] on the
//! request or message that hands it on).
//!
//! The engine only checks and carries the context
//! ([`crate::TraceContext`]); the random span ids of the hops are drawn
//! here.

use crate::TraceContext;
use std::hash::BuildHasher as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// Numbers the span ids this process draws, so that two drawn in the same
/// nanosecond still differ.
static DRAWN: AtomicU64 = AtomicU64::new(0);

/// A new random span id (8 bytes, never all zero), as the W3C
/// specification asks a hop to make for its own span. Drawn from std's
/// randomly keyed hasher over the time and a per-process count: unique
/// and unpredictable enough for tracing, not for secrets.
pub fn new_span_id() -> [u8; 8] {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let n = DRAWN.fetch_add(1, Ordering::Relaxed);
    let id = std::collections::hash_map::RandomState::new().hash_one((now, n));
    // All zeros is not a span id; 1 stands for it.
    id.max(1).to_be_bytes()
}

/// `trace` continued by a new span of this hop ([`new_span_id`]): the
/// `traceparent` a relay sends with an effect, the same trace id, flags
/// and `tracestate`, its own parent id.
pub fn continue_trace(trace: &TraceContext) -> TraceContext {
    loop {
        if let Some(next) = trace.child(new_span_id()) {
            if next.parent_id() != trace.parent_id() {
                return next;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_continued_trace_keeps_the_trace_and_takes_a_new_span() {
        let t = TraceContext::parse(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
            Some("a=1"),
        )
        .unwrap();
        let a = continue_trace(&t);
        let b = continue_trace(&t);
        assert_eq!(a.trace_id(), t.trace_id());
        assert_eq!(a.flags(), 0);
        assert_eq!(a.tracestate(), Some("a=1"));
        assert_ne!(a.parent_id(), t.parent_id());
        assert_ne!(a.parent_id(), b.parent_id());
        assert_ne!(a.parent_id(), [0; 8]);
    }
}
