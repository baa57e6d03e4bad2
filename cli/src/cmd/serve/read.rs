//! Read endpoints (JSON) over the durable store, through the library's
//! read-only [`StoreReader`] (its own connection; a read never blocks a
//! commit):
//!
//! | route | answer |
//! |---|---|
//! | `GET /objects/{id}` | the object (`StoredObject`), 404 when the store does not know it |
//! | `GET /objects` / `?paused=true` | every object / the paused ones, with what paused them |
//! | `GET /held` / `?reason=R` | the events still held, parked or malformed / those held for `R` |
//! | `GET /audit?event_id=E` / `?object_id=O` | the audit trail of one event / one object, in order |
//!
//! They read the store, so they need one: with `--store memory` they answer
//! 404. A parameter holding U+0000 (`%00`) is answered 400: no id holds it. With an operator token configured they need it too (they show the
//! bodies senders sent); without one they are open to whoever reaches the
//! address.

use super::{json_response, App};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde::Deserialize;
use snapshot_receiver::store::{StoreError, StoreReader};
use std::sync::Arc;

/// Runs `read` on a blocking thread with the store's reader; `Err` is the
/// answer when reads are not allowed, there is no store, or it fails.
pub(crate) async fn with_reader<T: Send + 'static>(
    app: &App,
    headers: &HeaderMap,
    read: impl FnOnce(&StoreReader) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, Box<Response>> {
    super::operator::authorize_read(app, headers)?;
    let Some(reader) = app.reader.clone() else {
        return Err(Box::new(json_response(
            StatusCode::NOT_FOUND,
            &serde_json::json!({
                "error": "the read endpoints read the durable store; this server runs with --store memory",
            }),
        )));
    };
    match tokio::task::spawn_blocking(move || read(&reader)).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => {
            if app.warnings.admit(super::warn::WarnKind::StoreRead) {
                tracing::warn!(cause = %snapshot_receiver::core::error_chain(&e), "store read failed");
            }
            Err(Box::new(json_response(
                StatusCode::SERVICE_UNAVAILABLE,
                &serde_json::json!({"error": "the store could not be read"}),
            )))
        }
        Err(e) => Err(Box::new(json_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            &serde_json::json!({"error": format!("store read ended abnormally: {e}")}),
        ))),
    }
}

/// The query, once the request is authorized: without the operator's
/// token a request is answered 401 before its query is judged, so that a
/// caller without it learns nothing from a 400.
fn authorized_query<T>(
    app: &App,
    headers: &HeaderMap,
    query: Result<Query<T>, QueryRejection>,
) -> Result<T, Box<Response>> {
    super::operator::authorize_read(app, headers)?;
    query.map(|Query(q)| q).map_err(|e| {
        Box::new(json_response(
            e.status(),
            &serde_json::json!({"error": "bad query", "reason": e.body_text()}),
        ))
    })
}

/// 400 when a parameter holds U+0000 (`%00`): no stored id can hold it
/// (every backend refuses such ids), so it is the client's mistake, not a
/// store failure. Called after the read authorization, so an unauthorized
/// client learns nothing more. `params` are (parameter name, value).
fn refuse_nul(params: &[(&str, Option<&str>)]) -> Result<(), Box<Response>> {
    match params
        .iter()
        .find(|(_, value)| value.is_some_and(|v| v.contains('\0')))
    {
        Some((name, _)) => Err(Box::new(json_response(
            StatusCode::BAD_REQUEST,
            &serde_json::json!({
                "error": format!("`{name}` contains U+0000 (%00), which no id may hold"),
            }),
        ))),
        None => Ok(()),
    }
}

/// 200 with `value` as JSON, or the error answer.
fn answer<T: serde::Serialize>(result: Result<T, Box<Response>>) -> Response {
    match result {
        Ok(value) => json_response(StatusCode::OK, &value),
        Err(response) => *response,
    }
}

/// `GET /objects/{id}`.
pub(crate) async fn object(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Err(response) = super::operator::authorize_read(&app, &headers)
        .and_then(|()| refuse_nul(&[("object_id", Some(&id))]))
    {
        return *response;
    }
    let wanted = id.clone();
    match with_reader(&app, &headers, move |r| r.object(&wanted)).await {
        Ok(Some(object)) => json_response(StatusCode::OK, &object),
        Ok(None) => json_response(
            StatusCode::NOT_FOUND,
            &serde_json::json!({"error": "unknown object", "object_id": id}),
        ),
        Err(response) => *response,
    }
}

/// The query of `GET /objects`.
#[derive(Deserialize)]
pub(crate) struct ObjectsQuery {
    /// Only the paused objects.
    #[serde(default)]
    paused: bool,
}

/// `GET /objects?paused=true`.
pub(crate) async fn objects(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    query: Result<Query<ObjectsQuery>, QueryRejection>,
) -> Response {
    let query = match authorized_query(&app, &headers, query) {
        Ok(query) => query,
        Err(refused) => return *refused,
    };
    answer(with_reader(&app, &headers, move |r| r.objects(query.paused)).await)
}

/// The query of `GET /held`.
#[derive(Deserialize)]
pub(crate) struct HeldQuery {
    /// A hold reason (`paused`, `unknown_object`, ...) or a conflict kind.
    reason: Option<String>,
}

/// `GET /held?reason=...`.
pub(crate) async fn held(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    query: Result<Query<HeldQuery>, QueryRejection>,
) -> Response {
    let query = match authorized_query(&app, &headers, query) {
        Ok(query) => query,
        Err(refused) => return *refused,
    };
    if let Err(response) = refuse_nul(&[("reason", query.reason.as_deref())]) {
        return *response;
    }
    answer(with_reader(&app, &headers, move |r| r.held(query.reason.as_deref())).await)
}

/// The query of `GET /audit`: exactly one of the two.
#[derive(Deserialize)]
pub(crate) struct AuditQuery {
    /// The trail of this event identity.
    event_id: Option<String>,
    /// The trail of this object.
    object_id: Option<String>,
}

/// `GET /audit?event_id=...` or `?object_id=...`.
pub(crate) async fn audit(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    query: Result<Query<AuditQuery>, QueryRejection>,
) -> Response {
    let query = match authorized_query(&app, &headers, query) {
        Ok(query) => query,
        Err(refused) => return *refused,
    };
    let params = [
        ("event_id", query.event_id.as_deref()),
        ("object_id", query.object_id.as_deref()),
    ];
    if let Err(response) = refuse_nul(&params) {
        return *response;
    }
    match (query.event_id, query.object_id) {
        (Some(event), None) => {
            answer(with_reader(&app, &headers, move |r| r.audit_for_event(&event)).await)
        }
        (None, Some(object)) => {
            answer(with_reader(&app, &headers, move |r| r.audit_for_object(&object)).await)
        }
        _ => json_response(
            StatusCode::BAD_REQUEST,
            &serde_json::json!({"error": "give exactly one of event_id or object_id"}),
        ),
    }
}
