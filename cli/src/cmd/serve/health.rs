//! `GET /metrics` (the Prometheus text format), `GET /healthz` (the process
//! answers) and `GET /readyz` (it accepts deliveries and its store answers),
//! and the middleware that counts every response by route and status.

use super::{json_response, App};
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// `GET /metrics`: every counter the library keeps through the `metrics`
/// facade (`snapshot_receiver_decisions_total{decision=...}`, ...) and the
/// HTTP layer's own (`snapshot_receiver_http_responses_total{route,status}`,
/// `snapshot_receiver_http_unauthorized_total{reason}`), as Prometheus text.
pub(crate) async fn metrics(State(app): State<Arc<App>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        app.prometheus.render(),
    )
        .into_response()
}

/// `GET /healthz`: 200 while the process runs.
pub(crate) async fn healthz() -> Response {
    json_response(StatusCode::OK, &serde_json::json!({"status": "ok"}))
}

/// `GET /readyz`: 200 `ready` when deliveries are accepted and the durable
/// store takes them; else 503 with why not: `stopping` (a shutdown signal
/// arrived), `store full` (the last commit failed for want of space, until a
/// decision is recorded again), `store unreachable` (a read through the
/// committer failed). It never names the store: whoever reaches the address
/// may ask.
pub(crate) async fn readyz(State(app): State<Arc<App>>) -> Response {
    let not_ready = |why: &str| {
        json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &serde_json::json!({"status": why}),
        )
    };
    if app.stopping.load(Ordering::Relaxed) {
        return not_ready("stopping");
    }
    if !app.durable {
        return json_response(StatusCode::OK, &serde_json::json!({"status": "ready"}));
    }
    if app.store_full.load(Ordering::Relaxed) {
        return not_ready("store full");
    }
    // A read through the committer: the store's connection answers, and the
    // committer thread is alive.
    match app.receiver.stored_effects_since(u64::MAX).await {
        Ok(_) => json_response(StatusCode::OK, &serde_json::json!({"status": "ready"})),
        Err(e) => {
            tracing::warn!(cause = %snapshot_receiver::core::error_chain(&e), "readiness: store does not answer");
            not_ready("store unreachable")
        }
    }
}

/// Whether a store failure says the store is out of space: SQLite's
/// `SQLITE_FULL` ("database or disk is full", also a `max_page_count`
/// reached), PostgreSQL's `disk_full` (SQLSTATE 53100, "could not extend
/// file"), or the OS's `ENOSPC` ("No space left on device") in a cause.
pub(crate) fn store_is_full(cause: &snapshot_receiver::store::StoreError) -> bool {
    let text = snapshot_receiver::core::error_chain(cause);
    [
        "database or disk is full",
        "No space left on device",
        "could not extend file",
    ]
    .iter()
    .any(|sign| text.contains(sign))
}

/// Counts each response as
/// `snapshot_receiver_http_responses_total{route, status}` (the route as
/// declared, so ids in paths do not make new series).
pub(crate) async fn count_responses(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let response = next.run(request).await;
    metrics::counter!(
        "snapshot_receiver_http_responses_total",
        "route" => route,
        "status" => response.status().as_str().to_owned(),
    )
    .increment(1);
    response
}
