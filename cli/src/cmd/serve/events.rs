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

use super::warn::WarnKind;
use super::{json_response, App};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use serde::Serialize;
use snapshot_receiver::{Ack, ConflictKind, Decision, Outcome, Receipt, RejectReason, RetryReason};
use std::sync::Arc;

/// The JSON body of every `POST /events` answer: the fields, in order, of
/// the library's serialized `Receipt` (the names of `replay --format json`,
/// docs/CONTRACT.md §7); a field that does not apply is `null`. Only the
/// values of `reason` for `retry` / `reject` differ: codes here, words there.
#[derive(Serialize)]
pub(crate) struct ReceiptBody<'a> {
    /// Event identity, when the body had one.
    event_id: Option<&'a str>,
    /// Resource identity, when the body had one.
    object_id: Option<&'a str>,
    /// `applied`, `duplicate`, `stale`, `equal`, `conflict`, `held`, or
    /// `retry` / `reject` when nothing was recorded.
    decision: &'static str,
    /// The hold reason, or the retry / reject reason (snake_case codes, as
    /// the `retry.*` / `reject.*` counters name them).
    reason: Option<&'static str>,
    /// The conflict kind.
    conflict: Option<ConflictKind>,
    /// For a duplicate: the decision the first delivery got, worded as the
    /// replay words it (`applied`, `held (paused)`, `conflict (event_variant)`).
    original_decision: Option<String>,
    /// The object's version after the step (`null`: unknown object or no decision).
    version: Option<u64>,
    /// The object's state after the step, as the library's receipt has it.
    state: Option<&'a snapshot_receiver::core::StateJson>,
    /// The object's paused flag after the step.
    paused: Option<bool>,
    /// Whether this step replaced the object's state.
    replacement: bool,
    /// `acknowledge`, `retry` or `reject`.
    ack: Ack,
    /// What the acknowledgement means to the sender, in words.
    ack_meaning: String,
}

impl<'a> ReceiptBody<'a> {
    /// The answer for `receipt`.
    pub(crate) fn of(receipt: &'a Receipt) -> Self {
        let mut body = Self {
            event_id: receipt.event_id.as_deref(),
            object_id: receipt.object_id.as_deref(),
            decision: "",
            reason: None,
            conflict: None,
            original_decision: None,
            version: receipt.object.as_ref().map(|o| o.version),
            state: receipt.object.as_ref().map(|o| &o.state),
            paused: receipt.object.as_ref().map(|o| o.paused),
            replacement: receipt.replacement,
            ack: receipt.ack(),
            ack_meaning: receipt.ack_meaning(),
        };
        match &receipt.outcome {
            Outcome::Decided(Decision::Duplicate { original }) => {
                body.decision = "duplicate";
                body.original_decision = Some(original.to_string());
            }
            Outcome::Decided(d) => {
                body.decision = d.as_str();
                body.reason = d.reason().map(|r| r.as_str());
                body.conflict = d.conflict();
            }
            Outcome::Retry(why) => {
                body.decision = "retry";
                body.reason = Some(why.as_str());
                // The store's own error stays in the log (see `respond`): it
                // may name files or hosts the sender has no business knowing.
                if let RetryReason::StoreFailed(_) = why {
                    body.ack_meaning = format!("not recorded, redeliver: {why}");
                }
            }
            Outcome::Rejected(why) => {
                body.decision = "reject";
                body.reason = Some(why.as_str());
            }
        }
        body
    }
}

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
                tracing::info!(reason = refusal.code(), detail = %refusal, "signature refused; nothing recorded");
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
    let receipt = app.receiver.deliver(&body).await;
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
        tracing::info!(
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
    let mut response = json_response(status, &ReceiptBody::of(receipt));
    if status == StatusCode::SERVICE_UNAVAILABLE {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, app.retry_after.clone());
    }
    response
}
