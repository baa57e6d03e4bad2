//! Operator endpoints, behind a bearer token of their own
//! (`Authorization: Bearer TOKEN`, RFC 6750 §2.1; `--operator-token` or
//! `SNAPSHOT_RECEIVER_OPERATOR_TOKEN`): `POST /reconcile` applies one
//! authoritative snapshot (docs/CONTRACT.md §4), `POST /purge` removes
//! event identities older than the retention window (§5); the relay
//! changes (`relays`: retry, skip, rewind) take the same token. Without a
//! configured token they answer 403.

use super::warn::WarnKind;
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

/// Whether `text` is a `b64token`, the only form a bearer token takes
/// (RFC 6750 §2.1): `1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="`.
fn is_b64token(text: &str) -> bool {
    let body = text.trim_end_matches('=');
    !body.is_empty()
        && body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~+/".contains(&b))
}

/// The token of an `Authorization` field value in the `Bearer` scheme, or
/// `None` when the value is not exactly that.
///
/// The grammar is RFC 9110 §11.4 `credentials = auth-scheme [ 1*SP (
/// token68 / #auth-param ) ]` narrowed by RFC 6750 §2.1 to `"Bearer" 1*SP
/// b64token`:
/// - the scheme name is compared case-insensitively: RFC 9110 §11.1 says
///   "It uses a case-insensitive token to identify the authentication
///   scheme", so `bearer` and `BEARER` are the same scheme as `Bearer`;
/// - one or more spaces (SP, not a tab) separate it from the token, as both
///   grammars write `1*SP`;
/// - the token is one `b64token`: no space, tab, comma or anything after it;
/// - whitespace around the whole value is not part of it (RFC 9110 §5.5).
///
/// Without the scheme (a bare token), under another scheme (`Basic`), or
/// anywhere but this header (a query string, a cookie): no token.
fn bearer_token(value: &str) -> Option<&str> {
    let value = value.trim_matches([' ', '\t']);
    let (scheme, rest) = value.split_once(' ')?;
    let token = rest.trim_start_matches(' ');
    (scheme.eq_ignore_ascii_case("Bearer") && is_b64token(token)).then_some(token)
}

impl OperatorToken {
    /// The token `text`.
    ///
    /// # Errors
    /// A message when `text` is not a bearer token a client could send
    /// (empty, or a character outside RFC 6750's `b64token`).
    pub(crate) fn new(text: &str) -> Result<Self, String> {
        if !is_b64token(text) {
            return Err(
                "--operator-token: a bearer token is one or more letters, digits and \
                 `-._~+/`, then optional `=` padding (RFC 6750 §2.1 b64token)"
                    .to_owned(),
            );
        }
        Ok(Self(Sha256::digest(text.as_bytes()).into()))
    }

    /// The token's SHA-256 digest (the page cookie's MAC key).
    pub(crate) fn digest(&self) -> &[u8; 32] {
        &self.0
    }

    /// Whether `given` is this token (compared by digest, in constant time).
    pub(crate) fn matches(&self, given: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(given.as_bytes()).into();
        digest.ct_eq(&self.0).into()
    }

    /// Whether `headers` carry this token as `Authorization: Bearer TOKEN`
    /// (see [`bearer_token`] for what is read as that), in one field:
    /// `Authorization` is not a list (RFC 9110 §11.6.2 gives it one
    /// `credentials`), so two fields are refused whatever they hold.
    fn admits(&self, headers: &HeaderMap) -> bool {
        let mut fields = headers.get_all(header::AUTHORIZATION).iter();
        let (Some(field), None) = (fields.next(), fields.next()) else {
            return false;
        };
        let Some(given) = field.to_str().ok().and_then(bearer_token) else {
            return false;
        };
        self.matches(given)
    }
}

/// `Err(response)` unless the request carries the operator's token.
pub(crate) fn authorize(app: &App, headers: &HeaderMap) -> Result<(), Box<Response>> {
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
    if app.warnings.admit(WarnKind::OperatorRefused) {
        tracing::warn!("operator token missing or wrong: answered 401");
    }
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
/// carries neither it nor a page cookie of a login with it
/// ([`super::login`]): the read endpoints and the page show what senders
/// sent, so a token guards them too; without a token they are open.
pub(crate) fn authorize_read(app: &App, headers: &HeaderMap) -> Result<(), Box<Response>> {
    match &app.operator {
        None => Ok(()),
        Some(token) if token.admits_session(headers, std::time::SystemTime::now()) => Ok(()),
        Some(_) => authorize(app, headers),
    }
}

/// Whether [`authorize_read`] would admit the request, without counting
/// or logging a refusal.
pub(crate) fn may_read(app: &App, headers: &HeaderMap) -> bool {
    app.operator.as_ref().is_none_or(|token| {
        token.admits(headers) || token.admits_session(headers, std::time::SystemTime::now())
    })
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
    let text = match std::str::from_utf8(&body) {
        Ok(text) => text,
        Err(e) => return bad_request(format!("not an authoritative snapshot: not UTF-8: {e}")),
    };
    let snapshot: AuthoritativeSnapshot = match snapshot_receiver::fixture::from_json(text) {
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
            if app.warnings.admit(WarnKind::StoreFailed) {
                tracing::warn!(cause = %snapshot_receiver::core::error_chain(&cause), "store failed; reconcile answered retry");
            }
            unavailable(&app, "store_failed")
        }
        Err(_) => unavailable(&app, "shutting_down"),
    }
}

/// `POST /purge`: removes event identities older than the retention window,
/// in memory and in the store, then the audit, history and resolved held
/// rows older than their windows (docs/CONTRACT.md §9); 200 with how many
/// identities were removed from memory and how many rows of each kind from
/// the store.
pub(crate) async fn purge(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Err(refused) = authorize(&app, &headers) {
        return *refused;
    }
    let purged = match app.receiver.purge_expired_identities().await {
        Ok(removed) => app
            .receiver
            .purge_expired_records()
            .await
            .map(|records| (removed, records)),
        Err(e) => Err(e),
    };
    match purged {
        Ok((removed, records)) => json_response(
            StatusCode::OK,
            &serde_json::json!({
                "removed": removed,
                "retention_seconds": app.receiver.context().config().retention.as_secs(),
                "audit": records.audit,
                "history": records.history,
                "resolved": records.resolved,
            }),
        ),
        Err(e) => {
            if app.warnings.admit(WarnKind::StoreFailed) {
                tracing::warn!(cause = %snapshot_receiver::core::error_chain(&e), "store failed; purge answered retry");
            }
            unavailable(&app, "store_failed")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_as_rfc_9110_and_6750_write_it() {
        for (value, token) in [
            ("Bearer s3cret-token", Some("s3cret-token")),
            // RFC 9110 §11.1: the scheme name is case-insensitive.
            ("bearer s3cret-token", Some("s3cret-token")),
            ("BEARER s3cret-token", Some("s3cret-token")),
            // `1*SP` between the scheme and the token; the value's own
            // surrounding whitespace is not part of it.
            ("Bearer   s3cret-token", Some("s3cret-token")),
            (" Bearer s3cret-token\t", Some("s3cret-token")),
            ("Bearer abc+/9==", Some("abc+/9==")),
            ("s3cret-token", None),
            ("Basic s3cret-token", None),
            ("Bearer", None),
            ("Bearer ", None),
            ("Bearer\ts3cret-token", None),
            ("Bearer s3cret -token", None),
            ("Bearer s3cret-token extra", None),
            ("Bearer s3cret-token\tx", None),
            ("Bearer s3cret-token,realm=x", None),
            ("Bearer =", None),
            ("Bearers3cret-token", None),
            ("XBearer s3cret-token", None),
        ] {
            assert_eq!(bearer_token(value), token, "{value:?}");
        }
    }

    #[test]
    fn a_configured_token_must_be_a_b64token() {
        assert!(OperatorToken::new("s3cret-token").is_ok());
        assert!(OperatorToken::new("a.b_c~d+e/f==").is_ok());
        for bad in ["", "=", "two words", "semi;colon", "t\u{e9}l\u{e9}"] {
            assert_eq!(
                OperatorToken::new(bad).err().as_deref(),
                Some(
                    "--operator-token: a bearer token is one or more letters, digits and \
                     `-._~+/`, then optional `=` padding (RFC 6750 §2.1 b64token)"
                ),
                "{bad:?}"
            );
        }
    }
}
