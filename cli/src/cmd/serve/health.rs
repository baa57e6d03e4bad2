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
        sorted_families(&app.prometheus.render()),
    )
        .into_response()
}

/// The `# HELP` text of each metric `serve` sets itself (the HTTP layer's
/// counters and the memory figures of [`memory_gauges`] and
/// [`budget_gauges`]); the library describes its own
/// ([`snapshot_receiver::describe_metrics`]). What each counts is the table
/// in docs/OPERATIONS.md (*Metrics*).
const HELP: [(&str, Kind, &str); 17] = [
    (
        "snapshot_receiver_http_responses_total",
        Kind::Counter,
        "HTTP responses, by route as declared and status code.",
    ),
    (
        "snapshot_receiver_http_unauthorized_total",
        Kind::Counter,
        "Requests refused 401, by reason (signature, timestamp, operator token).",
    ),
    (
        "snapshot_receiver_http_trace_context_invalid_total",
        Kind::Counter,
        "Delivery requests whose traceparent was ignored (not a W3C trace context), by reason.",
    ),
    (
        "snapshot_receiver_http_rejects_total",
        Kind::Counter,
        "Requests refused before their body was read, by reason.",
    ),
    (
        "snapshot_receiver_http_connections_closed_total",
        Kind::Counter,
        "Connections closed by serve, by reason.",
    ),
    (
        "snapshot_receiver_http_connections_spare_total",
        Kind::Counter,
        "Connections accepted on the spare slots past the ceiling, to be answered 503.",
    ),
    (
        "snapshot_receiver_http_connections_over_ceiling_total",
        Kind::Counter,
        "Connections closed at once because the ceiling and its spare slots were taken.",
    ),
    (
        "snapshot_receiver_http_accept_errors_total",
        Kind::Counter,
        "Errors accepting a connection.",
    ),
    (
        "snapshot_receiver_http_panics_total",
        Kind::Counter,
        "Request handlers that panicked (answered 500).",
    ),
    (
        "snapshot_receiver_memory_bytes",
        Kind::Gauge,
        "Bytes the receiver keeps, by part of the memory budget; kind used or budget.",
    ),
    (
        "snapshot_receiver_working_set",
        Kind::Gauge,
        "Objects in the working set: its capacity and those resident.",
    ),
    (
        "snapshot_receiver_identity_cache",
        Kind::Gauge,
        "Event identities in the cache: its capacity and those resident.",
    ),
    (
        "snapshot_receiver_read_back_total",
        Kind::Counter,
        "Objects and receipts read back from the store after eviction.",
    ),
    (
        "snapshot_receiver_evicted_total",
        Kind::Counter,
        "Objects and identities evicted from memory.",
    ),
    (
        "snapshot_receiver_identity_reads_total",
        Kind::Counter,
        "Receipts read from the store to judge a delivery's identity.",
    ),
    (
        "snapshot_receiver_identities_spared_total",
        Kind::Counter,
        "Store reads of receipts the identity filter spared.",
    ),
    (
        "snapshot_receiver_identity_filter_ready",
        Kind::Gauge,
        "Whether the identity filter's start-up scan is done (1) or not (0).",
    ),
];

/// A metric's kind, for [`HELP`].
#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
}

/// Describes every metric `/metrics` shows (the library's and `serve`'s
/// own, [`HELP`]) to the installed recorder: each family gets its
/// `# HELP` line. Once, at start-up, after the recorder is installed.
pub(crate) fn describe_metrics() {
    snapshot_receiver::describe_metrics();
    for (name, kind, help) in HELP {
        match kind {
            Kind::Counter => metrics::describe_counter!(name, help),
            Kind::Gauge => metrics::describe_gauge!(name, help),
        }
    }
}

/// The exporter's Prometheus text with its families sorted by name, and
/// the series of each counter and gauge sorted (the exporter writes both
/// in hash order, different at every scrape). A family is a block of
/// lines ended by an empty line, led by its `# HELP` and `# TYPE` lines; a
/// histogram's or summary's series keep their order (buckets ascending).
pub(crate) fn sorted_families(text: &str) -> String {
    let mut families: Vec<(&str, Vec<&str>)> = text
        .split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let lines: Vec<&str> = block.lines().filter(|l| !l.is_empty()).collect();
            let name = lines
                .iter()
                .find_map(|l| l.strip_prefix("# TYPE "))
                .and_then(|rest| rest.split(' ').next())
                .unwrap_or("");
            (name, lines)
        })
        .collect();
    families.sort_by(|a, b| a.0.cmp(b.0));
    let mut out = String::with_capacity(text.len());
    for (_, mut lines) in families {
        let head = lines.iter().take_while(|l| l.starts_with('#')).count();
        let (heading, series) = lines.split_at_mut(head);
        let plain = heading
            .iter()
            .any(|l| l.ends_with(" counter") || l.ends_with(" gauge"));
        if plain {
            series.sort_unstable();
        }
        for line in lines {
            out.push_str(line);
            out.push('\n');
        }
        out.push('\n');
    }
    out
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
        ("relay", m.relay, b.relay),
        ("authority", m.authority, b.authority),
        ("store", m.store, b.store),
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
    #[test]
    fn families_are_sorted_by_name_and_counter_series_by_line() {
        let text = "# HELP b_total B.\n# TYPE b_total counter\nb_total{x=\"2\"} 1\nb_total{x=\"1\"} 4\n\n\
                    # TYPE a gauge\na 1\n\n\
                    # TYPE h histogram\nh_bucket{le=\"1\"} 0\nh_bucket{le=\"+Inf\"} 2\nh_sum 3\nh_count 2\n\n";
        assert_eq!(
            super::sorted_families(text),
            "# TYPE a gauge\na 1\n\n\
             # HELP b_total B.\n# TYPE b_total counter\nb_total{x=\"1\"} 4\nb_total{x=\"2\"} 1\n\n\
             # TYPE h histogram\nh_bucket{le=\"1\"} 0\nh_bucket{le=\"+Inf\"} 2\nh_sum 3\nh_count 2\n\n"
        );
    }

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
