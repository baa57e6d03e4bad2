//! Operator endpoints, behind a bearer token of their own
//! (`Authorization: Bearer TOKEN`, `--operator-token` or
//! `SNAPSHOT_RECEIVER_OPERATOR_TOKEN`): `POST /reconcile` applies one
//! authoritative snapshot (docs/CONTRACT.md §4), `POST /purge` removes
//! event identities older than the retention window (§5). Without a
//! configured token they answer 403.

use super::{json_response, App};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use sha2::{Digest, Sha256};
use snapshot_receiver::{AuthoritativeSnapshot, ReconcileError};
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The operator's bearer token, kept as its SHA-256 digest so that the
/// comparison is constant-time and does not depend on the token's length.
pub(crate) struct OperatorToken([u8; 32]);

impl OperatorToken {
    /// The token `text` (not empty).
    pub(crate) fn new(text: &str) -> Self {
        Self(Sha256::digest(text.as_bytes()).into())
    }

    /// Whether `headers` carry this token as `Authorization: Bearer ...`.
    fn admits(&self, headers: &HeaderMap) -> bool {
        let Some(given) = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
        else {
            return false;
        };
        let digest: [u8; 32] = Sha256::digest(given.trim().as_bytes()).into();
        digest.ct_eq(&self.0).into()
    }
}

/// `Err(response)` unless the request carries the operator's token.
fn authorize(app: &App, headers: &HeaderMap) -> Result<(), Box<Response>> {
    let Some(token) = &app.operator else {
        return Err(Box::new(json_response(
            StatusCode::FORBIDDEN,
            &serde_json::json!({
                "error": "operator endpoints are off: start serve with --operator-token \
                          or SNAPSHOT_RECEIVER_OPERATOR_TOKEN",
            }),
        )));
    };
    if token.admits(headers) {
        return Ok(());
    }
    metrics::counter!("snapshot_receiver_http_unauthorized_total", "reason" => "operator_token")
        .increment(1);
    let mut response = json_response(
        StatusCode::UNAUTHORIZED,
        &serde_json::json!({"error": "unauthorized", "reason": "operator_token",
                            "detail": "missing or wrong `Authorization: Bearer` operator token"}),
    );
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    Err(Box::new(response))
}

/// `Err(response)` when an operator token is configured and the request
/// does not carry it: the read endpoints and the page show what senders
/// sent, so a token guards them too; without a token they are open.
pub(crate) fn authorize_read(app: &App, headers: &HeaderMap) -> Result<(), Box<Response>> {
    match app.operator {
        None => Ok(()),
        Some(_) => authorize(app, headers),
    }
}

/// A 400 answer naming what is wrong with the request body.
fn bad_request(what: String) -> Response {
    json_response(
        StatusCode::BAD_REQUEST,
        &serde_json::json!({"error": "bad snapshot", "reason": what}),
    )
}

/// A 503 answer with `Retry-After`: nothing changed, try again.
fn unavailable(app: &App, reason: &str) -> Response {
    let mut response = json_response(
        StatusCode::SERVICE_UNAVAILABLE,
        &serde_json::json!({"decision": "retry", "reason": reason,
                            "ack_meaning": "nothing changed: send it again later"}),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, app.retry_after.clone());
    response
}

/// `POST /reconcile`: 200 with what the authority did and what became of
/// each held event; 409 when an older authority is refused (nothing
/// changed); 400 for a body that is not one snapshot; 503 when it could not
/// be recorded.
pub(crate) async fn reconcile(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(refused) = authorize(&app, &headers) {
        return *refused;
    }
    // The shape of a fixture's `authority` entry (docs/CONTRACT.md §6), read
    // by the library's own deserializer: `as_of` defaults to now.
    let snapshot: AuthoritativeSnapshot = match serde_json::from_slice(&body) {
        Ok(snapshot) => snapshot,
        Err(e) => return bad_request(format!("not an authoritative snapshot: {e}")),
    };
    match app.receiver.reconcile(snapshot).await {
        // The library's form of the report: the receipt's fields in the
        // receipt's order, then previous_version, forced_over, reevaluated.
        Ok(report) => json_response(StatusCode::OK, &report),
        Err(ref e @ ReconcileError::AuthorityOlder { ref object_id, .. }) => json_response(
            StatusCode::CONFLICT,
            &serde_json::json!({
                "decision": "authority_refused",
                "object_id": &**object_id,
                "reason": e.to_string(),
                "replacement": false,
            }),
        ),
        Err(ReconcileError::StoreFailed(cause)) => {
            tracing::warn!(cause = %snapshot_receiver::core::error_chain(&cause), "store failed; reconcile answered retry");
            unavailable(&app, "store_failed")
        }
        Err(_) => unavailable(&app, "shutting_down"),
    }
}

/// `POST /purge`: removes event identities older than the retention window,
/// in memory and in the store; 200 with how many were removed from memory.
pub(crate) async fn purge(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Err(refused) = authorize(&app, &headers) {
        return *refused;
    }
    match app.receiver.purge_expired_identities().await {
        Ok(removed) => json_response(
            StatusCode::OK,
            &serde_json::json!({
                "removed": removed,
                "retention_seconds": app.receiver.context().config().retention.as_secs(),
            }),
        ),
        Err(e) => {
            tracing::warn!(cause = %snapshot_receiver::core::error_chain(&e), "store failed; purge answered retry");
            unavailable(&app, "store_failed")
        }
    }
}
