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

/// `GET /readyz`: 200 when deliveries are accepted and the durable store
/// answers a read; 503 while shutting down or when the store does not answer.
pub(crate) async fn readyz(State(app): State<Arc<App>>) -> Response {
    if app.stopping.load(Ordering::Relaxed) {
        return json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &serde_json::json!({"status": "stopping"}),
        );
    }
    if !app.durable {
        return json_response(
            StatusCode::OK,
            &serde_json::json!({"status": "ready", "store": "memory"}),
        );
    }
    // A read through the committer: the store's connection answers, and the
    // committer thread is alive.
    match app.receiver.stored_effects_since(u64::MAX).await {
        Ok(_) => json_response(
            StatusCode::OK,
            &serde_json::json!({"status": "ready", "store": app.store_label}),
        ),
        Err(e) => {
            if app.warnings.admit(super::warn::WarnKind::StoreRead) {
                tracing::warn!(cause = %snapshot_receiver::core::error_chain(&e), "readiness: store does not answer");
            }
            json_response(
                StatusCode::SERVICE_UNAVAILABLE,
                &serde_json::json!({"status": "store unreachable", "store": app.store_label}),
            )
        }
    }
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
