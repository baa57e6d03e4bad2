//! The relays over HTTP (docs/CONTRACT.md §10), in memory and with a
//! durable store:
//!
//! | route | answer |
//! |---|---|
//! | `GET /relays` | every relay: cursor, lag, parked and failed effects, whether it is behind (`RelaysReport`) |
//! | `POST /relays/{name}/retry` / `?position=P` | its failed effects (the one at P) tried again now, from the first attempt of their schedule |
//! | `POST /relays/{name}/skip?position=P` | its parked effect at P dropped without delivery; its object's next effect goes |
//! | `POST /relays/{name}/rewind?position=P` | its cursor moved to P (at most the last position): what follows is delivered again, with the same ids |
//!
//! The changes are operator endpoints (the operator's bearer token, 403
//! without one configured); `GET /relays` is a read endpoint (the token
//! when one is configured). A change answers 200 with what changed and the
//! relay as it is then; 404 for a relay the store does not know or a
//! position with nothing parked; 400 for a missing or bad position; 503
//! when the store cannot be read or written. A running relay notices a
//! change at its next save and reads its state again.

use super::operator::{authorize, authorize_read};
use super::{json_response, App};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use serde::Deserialize;
use snapshot_receiver::store::{
    change_relay, relays_report, OutboxStore, RelayChange, RelaysReport, StoreError,
};
use std::sync::Arc;
use std::time::SystemTime;

/// The `position` query parameter of the changes.
#[derive(Deserialize)]
pub(crate) struct PositionQuery {
    /// An outbox position.
    position: Option<u64>,
}

/// Runs `f` on the server's relay connection (opened at the first call)
/// on a blocking thread.
async fn with_outbox<T: Send + 'static>(
    app: &App,
    f: impl FnOnce(&mut dyn OutboxStore) -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    let mut cached = app.outbox.lock().await;
    let mut store = match cached.take() {
        Some(store) => store,
        None => app.receiver.outbox_store().await?,
    };
    let (store, result) = tokio::task::spawn_blocking(move || {
        let result = f(store.as_mut());
        (store, result)
    })
    .await
    .map_err(|e| StoreError::Failed(format!("a relay call stopped: {e}")))?;
    // A failed call may have lost its connection: the next one opens
    // another.
    if result.is_ok() {
        *cached = Some(store);
    }
    result
}

/// The report of every relay, judged against the server's history window.
fn report(
    store: &mut dyn OutboxStore,
    window: Option<std::time::Duration>,
) -> Result<RelaysReport, StoreError> {
    relays_report(store, SystemTime::now(), window)
}

/// A 503 naming why the store could not be used.
fn unavailable(app: &App, e: &StoreError) -> Response {
    if app.warnings.admit(super::warn::WarnKind::StoreRead) {
        tracing::warn!(cause = %snapshot_receiver::core::error_chain(e), "relay store call failed");
    }
    let mut response = json_response(
        StatusCode::SERVICE_UNAVAILABLE,
        &serde_json::json!({"error": "the relays could not be read or changed", "reason": e.to_string()}),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, app.retry_after.clone());
    response
}

/// An answer `status` with `error`.
fn refused(status: StatusCode, error: String) -> Response {
    json_response(status, &serde_json::json!({ "error": error }))
}

/// `GET /relays`.
pub(crate) async fn list(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Err(refused) = authorize_read(&app, &headers) {
        return *refused;
    }
    let window = app.history;
    match with_outbox(&app, move |s| report(s, window)).await {
        Ok(mut report) => {
            app.live(&mut report);
            json_response(StatusCode::OK, &report)
        }
        Err(e) => unavailable(&app, &e),
    }
}

/// What an operator asked of a relay, before its position is checked.
#[derive(Clone, Copy)]
enum Change {
    /// Its failed effects (or the one at a position) tried again.
    Retry,
    /// Its parked effect at a position dropped.
    Skip,
    /// Its cursor moved to a position.
    Rewind,
}

/// What a change did: `Ok(text)`, or the answer refusing it.
type Outcome = Result<String, (StatusCode, String)>;

/// Applies `change` to relay `name` on `store` by the rule the `relays`
/// command follows too ([`change_relay`]); the outcome and the report
/// after it.
fn apply(
    store: &mut dyn OutboxStore,
    change: Change,
    name: &str,
    position: Option<u64>,
    window: Option<std::time::Duration>,
) -> Result<(Outcome, RelaysReport), StoreError> {
    let change = match (change, position) {
        (Change::Retry, position) => Some(RelayChange::Retry { position }),
        (Change::Skip, Some(position)) => Some(RelayChange::Skip { position }),
        (Change::Rewind, Some(position)) => Some(RelayChange::Rewind { position }),
        (Change::Skip | Change::Rewind, None) => None,
    };
    let outcome = match change {
        None => Err((
            StatusCode::BAD_REQUEST,
            "this change needs ?position=P (an outbox position)".to_owned(),
        )),
        Some(change) => match change_relay(store, name, change, SystemTime::now())? {
            Ok(done) => Ok(format!("{name}: {done}")),
            Err(refused) if refused.is_not_found() => {
                Err((StatusCode::NOT_FOUND, refused.to_string()))
            }
            Err(refused) => Err((StatusCode::BAD_REQUEST, refused.to_string())),
        },
    };
    Ok((outcome, report(store, window)?))
}

/// The handler of one change.
async fn change(
    app: Arc<App>,
    headers: HeaderMap,
    name: String,
    query: Result<Query<PositionQuery>, QueryRejection>,
    change: Change,
) -> Response {
    if let Err(refused) = authorize(&app, &headers) {
        return *refused;
    }
    let position = match query {
        Ok(Query(q)) => q.position,
        Err(e) => {
            return refused(
                StatusCode::BAD_REQUEST,
                format!("bad query: {}", e.body_text()),
            )
        }
    };
    let window = app.history;
    let relay = name.clone();
    let applied = with_outbox(&app, move |s| apply(s, change, &relay, position, window)).await;
    match applied {
        Ok((Ok(changed), report)) => {
            tracing::info!(relay = %name, "{changed}");
            let status = report.relays.into_iter().find(|r| r.name == name);
            json_response(
                StatusCode::OK,
                &serde_json::json!({"changed": changed, "relay": status}),
            )
        }
        Ok((Err((status, error)), _)) => refused(status, error),
        Err(e) => unavailable(&app, &e),
    }
}

/// `POST /relays/{name}/retry`.
pub(crate) async fn retry(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    query: Result<Query<PositionQuery>, QueryRejection>,
) -> Response {
    change(app, headers, name, query, Change::Retry).await
}

/// `POST /relays/{name}/skip?position=P`.
pub(crate) async fn skip(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    query: Result<Query<PositionQuery>, QueryRejection>,
) -> Response {
    change(app, headers, name, query, Change::Skip).await
}

/// `POST /relays/{name}/rewind?position=P`.
pub(crate) async fn rewind(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    query: Result<Query<PositionQuery>, QueryRejection>,
) -> Response {
    change(app, headers, name, query, Change::Rewind).await
}
