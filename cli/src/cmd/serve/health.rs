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
/// facade (`snapshot_receiver_decisions_total{decision=...}`, ...), the
/// HTTP layer's own (`snapshot_receiver_http_responses_total{route,status}`,
/// `snapshot_receiver_http_unauthorized_total{reason}`) and, with a durable
/// store, the memory gauges of the working set and identity cache, as
/// Prometheus text.
pub(crate) async fn metrics(State(app): State<Arc<App>>) -> Response {
    if let Some(m) = app.receiver.memory().await {
        memory_gauges(&m);
    }
    budget_gauges(&app.receiver.memory_bytes().await);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        app.prometheus.render(),
    )
        .into_response()
}

/// Sets the bounded durable receiver's memory figures
/// ([`snapshot_receiver::Receiver::memory`]) as gauges and counters, read
/// when `/metrics` is scraped: the working set and the identity cache
/// (bound and resident), what was read back from the store and evicted, the
/// reads of receipts, the reads the identity filter spared, and whether the
/// filter's start-up scan is done.
fn memory_gauges(m: &snapshot_receiver::MemoryStats) {
    let size = |n: usize| n as f64;
    metrics::gauge!("snapshot_receiver_working_set", "kind" => "capacity")
        .set(size(m.objects_capacity));
    metrics::gauge!("snapshot_receiver_working_set", "kind" => "resident")
        .set(size(m.objects_resident));
    metrics::gauge!("snapshot_receiver_identity_cache", "kind" => "capacity")
        .set(size(m.identities_capacity));
    metrics::gauge!("snapshot_receiver_identity_cache", "kind" => "resident")
        .set(size(m.identities_resident));
    metrics::counter!("snapshot_receiver_read_back_total", "what" => "objects")
        .absolute(m.objects_loaded);
    metrics::counter!("snapshot_receiver_read_back_total", "what" => "receipts")
        .absolute(m.identities_loaded);
    metrics::counter!("snapshot_receiver_evicted_total", "what" => "objects")
        .absolute(m.objects_evicted);
    metrics::counter!("snapshot_receiver_evicted_total", "what" => "identities")
        .absolute(m.identities_evicted);
    metrics::counter!("snapshot_receiver_identity_reads_total").absolute(m.identity_reads);
    metrics::counter!("snapshot_receiver_identities_spared_total").absolute(m.identities_spared);
    let ready = m.identity_filter.is_some_and(|f| f.ready);
    metrics::gauge!("snapshot_receiver_identity_filter_ready").set(f64::from(u8::from(ready)));
}

/// Sets what the receiver keeps in memory, in bytes, part by part, and
/// each part's budget ([`snapshot_receiver::Receiver::memory_bytes`]):
/// `snapshot_receiver_memory_bytes{part, kind="used"|"budget"}`.
fn budget_gauges(m: &snapshot_receiver::MemoryUse) {
    let b = m.budget;
    for (part, used, budget) in [
        ("objects", m.objects, b.objects),
        ("identities", m.identities, b.identities),
        ("waiting", m.waiting, b.waiting),
        ("trail", m.trail, b.trail),
        ("queued", m.queued, b.queued),
        ("total", m.total(), b.total()),
    ] {
        metrics::gauge!("snapshot_receiver_memory_bytes", "part" => part, "kind" => "used")
            .set(used as f64);
        metrics::gauge!("snapshot_receiver_memory_bytes", "part" => part, "kind" => "budget")
            .set(budget as f64);
    }
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
    // committer thread is alive (an empty read; no cursor).
    #[allow(deprecated)]
    let probe = app.receiver.stored_effects_since(u64::MAX).await;
    match probe {
        Ok(_) => json_response(StatusCode::OK, &serde_json::json!({"status": "ready"})),
        Err(e) => {
            if app.warnings.admit(super::warn::WarnKind::StoreRead) {
                tracing::warn!(cause = %snapshot_receiver::core::error_chain(&e), "readiness: store does not answer");
            }
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

#[cfg(test)]
mod tests {
    use super::super::{events, App};
    use axum::extract::State;
    use axum::http::StatusCode;
    use snapshot_receiver::store::{SqliteOptions, SqliteStore};
    use snapshot_receiver::Receiver;
    use std::sync::Arc;

    async fn text(response: axum::response::Response) -> (StatusCode, String) {
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    /// Issue 20 item 6: `/readyz` said `ready` while the disk was full.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn readyz_says_store_full_while_commits_fail_for_space() {
        let path = std::env::temp_dir().join(format!(
            "serve-readyz-full-{}-{:?}.db",
            std::process::id(),
            std::time::SystemTime::now()
        ));
        let file = path.to_str().unwrap().to_owned();
        // 40 pages of 4 KiB: full after a few dozen padded deliveries.
        let receiver = Receiver::builder()
            .object("card-7", 10, "{}")
            .store_with(move || {
                SqliteStore::open(
                    &file,
                    SqliteOptions {
                        max_page_count: Some(40),
                        ..SqliteOptions::default()
                    },
                )
            })
            .build()
            .unwrap();
        let app = Arc::new(App::for_tests(receiver, true));
        assert_eq!(
            text(super::readyz(State(app.clone())).await).await,
            (StatusCode::OK, r#"{"status":"ready"}"#.to_owned())
        );
        let pad = "x".repeat(3000);
        let mut full = false;
        for v in 11..200u64 {
            let body = format!(
                r#"{{"event_id":"e-{v}","object_id":"card-7","object_version":{v},"type":"card.snapshot","state":{{"pad":"{pad}"}}}}"#
            );
            let receipt = app.receiver.deliver(body.as_bytes()).await;
            let (status, answer) = text(events::respond(&app, &receipt)).await;
            if status == StatusCode::SERVICE_UNAVAILABLE {
                assert!(answer.contains(r#""reason":"store_failed""#), "{answer}");
                full = true;
                break;
            }
            assert_eq!(status, StatusCode::OK, "{answer}");
        }
        assert!(full, "the 40-page store fills up");
        assert_eq!(
            text(super::readyz(State(app.clone())).await).await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                r#"{"status":"store full"}"#.to_owned()
            )
        );
        app.receiver.shutdown().await;
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn full_is_told_apart_from_other_store_failures() {
        use snapshot_receiver::store::StoreError;
        let io = |text: &str| {
            StoreError::backend("sqlite: commit", std::io::Error::other(text.to_owned()))
        };
        assert!(super::store_is_full(&io("database or disk is full")));
        assert!(super::store_is_full(&io(
            "could not write: No space left on device"
        )));
        assert!(!super::store_is_full(&io("database is locked")));
        assert!(!super::store_is_full(&StoreError::Failed(
            "injected fault".to_owned()
        )));
    }
}
