//! `POST /events`: one delivery per request, its signature checked first,
//! answered with the receipt once the decision is recorded (committed, with
//! a durable store).
//!
//! | receipt | HTTP |
//! |---|---|
//! | `acknowledge` (every recorded decision) | 200 |
//! | `retry` | 503 + `Retry-After` |
//! | `reject`, body too large | 413 |
//! | `reject`, too deep / id too long / U+0000 in an id | 400 |
//! | `reject`, the store refused what the delivery would write | 422 |
//! | signature missing or wrong | 401, nothing recorded |
//!
//! A request's W3C `traceparent` (and `tracestate`) goes with the delivery
//! ([`super::trace::read`]): the delivery's span carries it, and the effect
//! of an applied delivery keeps it for the relays (docs/OPERATIONS.md,
//! *Traces*).

use super::warn::WarnKind;
use super::{json_response, App};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use snapshot_receiver::{Ack, DeliveryMeta, Outcome, Receipt, RejectReason, RetryReason};
use std::sync::Arc;
use tracing::Instrument as _;

/// `POST /events`.
pub(crate) async fn deliver(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(body) => body,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            // Refused while reading (a chunked body has no declared length
            // for `net::guard` to refuse before), before the receiver saw it.
            let size = headers
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(
                    u64::try_from(app.max_body_bytes)
                        .unwrap_or(u64::MAX)
                        .saturating_add(1),
                );
            return body_too_large(&app, size);
        }
        Err(rejection) => {
            return json_response(
                rejection.status(),
                &serde_json::json!({"error": "unreadable body", "reason": rejection.body_text()}),
            )
        }
    };
    if let Some(verifier) = &app.verifier {
        if let Err(refusal) = verifier.verify(&headers, &body, std::time::SystemTime::now()) {
            metrics::counter!("snapshot_receiver_http_unauthorized_total", "reason" => refusal.code())
                .increment(1);
            if app.warnings.admit(WarnKind::SignatureRefused) {
                tracing::warn!(reason = refusal.code(), detail = %refusal, "signature refused ({}): answered 401, nothing recorded", refusal.code());
            }
            return json_response(
                StatusCode::UNAUTHORIZED,
                &serde_json::json!({
                    "error": "unauthorized",
                    "reason": refusal.code(),
                    "detail": refusal.to_string(),
                    "ack": Ack::Reject,
                    "ack_meaning": "not recorded: the signature was not accepted",
                }),
            );
        }
    }
    let trace = super::trace::read(&headers);
    let span = super::trace::delivery_span(trace.as_ref());
    let mut meta = DeliveryMeta::new();
    if let Some(trace) = trace {
        meta = meta.trace(trace);
    }
    let receipt = app
        .receiver
        .deliver_with(&body, meta)
        .instrument(span)
        .await;
    respond(&app, &receipt)
}

/// The answer to a body of `size` bytes over the limit, refused before the
/// receiver saw it (declared in its head, or found while reading): the
/// same 413 and `reject` receipt the receiver gives a body over its limit;
/// counted in `snapshot_receiver_http_rejects_total{reason="body_too_large"}`.
pub(crate) fn body_too_large(app: &App, size: u64) -> Response {
    metrics::counter!("snapshot_receiver_http_rejects_total", "reason" => "body_too_large")
        .increment(1);
    if app.warnings.admit(WarnKind::BodyTooLarge) {
        tracing::warn!(
            size,
            limit = app.max_body_bytes,
            "body over the limit refused before it was read whole; nothing recorded"
        );
    }
    let receipt = Receipt::rejected(RejectReason::BodyTooLarge {
        size: usize::try_from(size).unwrap_or(usize::MAX),
        limit: app.max_body_bytes,
    });
    respond(app, &receipt)
}

/// The HTTP answer for a receipt (see the module's table). Also what
/// `/readyz` knows of a full store: a commit refused for want of space sets
/// it, the next recorded decision clears it.
pub(crate) fn respond(app: &App, receipt: &Receipt) -> Response {
    match &receipt.outcome {
        Outcome::Retry(RetryReason::StoreFailed(cause)) => {
            if super::health::store_is_full(cause) {
                app.store_full
                    .store(true, std::sync::atomic::Ordering::Relaxed);
            }
            if app.warnings.admit(WarnKind::StoreFailed) {
                tracing::warn!(cause = %snapshot_receiver::core::error_chain(cause), "store failed; answered retry");
            }
        }
        Outcome::Decided(_) => app
            .store_full
            .store(false, std::sync::atomic::Ordering::Relaxed),
        _ => {}
    }
    let status = match &receipt.outcome {
        Outcome::Decided(_) => StatusCode::OK,
        Outcome::Retry(_) => StatusCode::SERVICE_UNAVAILABLE,
        Outcome::Rejected(RejectReason::BodyTooLarge { .. }) => StatusCode::PAYLOAD_TOO_LARGE,
        Outcome::Rejected(RejectReason::StoreRefused { .. }) => StatusCode::UNPROCESSABLE_ENTITY,
        Outcome::Rejected(_) => StatusCode::BAD_REQUEST,
    };
    // The library's receipt as it serializes it (docs/CONTRACT.md §7): one
    // shape for `replay --format json`, an embedding service and this answer.
    let mut response = json_response(status, receipt);
    if status == StatusCode::SERVICE_UNAVAILABLE {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, app.retry_after.clone());
    }
    response
}
