//! Counters (issue 7): every decision, reason and refusal is counted, readable
//! through `Receiver::metrics`, and exported through the `metrics` facade.

use crate::common::{body, receiver, T};
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use snapshot_receiver::{
    fixture::Fixture, replay::replay, Limits, ManualClock, MetricsSnapshot, Receiver,
};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const READY: &str = r#"{"stage":"ready","label":"Map"}"#;

fn fixture() -> Fixture {
    Fixture::load(&crate::common::repo("fixtures/B62-15-events.json")).unwrap()
}

/// The non-zero counters.
fn non_zero(m: &MetricsSnapshot) -> BTreeMap<&str, u64> {
    m.iter()
        .filter(|(_, &v)| v > 0)
        .map(|(k, &v)| (k.as_str(), v))
        .collect()
}

/// The non-zero counters after the reference fixture (docs/CONTRACT.md §6): ten
/// deliveries, two authorities.
const FIXTURE_COUNTS: &[(&str, u64)] = &[
    ("authority.applied", 2),
    ("conflict.event_variant", 1),
    ("conflict.version_state", 1),
    ("decision.applied", 2),
    ("decision.conflict", 2),
    ("decision.duplicate", 1),
    ("decision.held", 4),
    ("decision.stale", 1),
    ("held.missing_version", 1),
    ("held.paused", 1),
    ("held.unknown_object", 1),
    ("held.unsupported_type", 1),
    // e-203 on card-7 after its authority; e-205 on card-8.
    ("reevaluated.equal", 1),
    ("reevaluated.stale", 1),
    // e-202's variant, e-204 (no version), e-208 (unsupported type).
    ("reevaluated.unresolved", 3),
];

#[tokio::test]
async fn reference_fixture_counts_exactly() {
    let report = replay(&fixture(), None).await.unwrap();
    let expected: BTreeMap<&str, u64> = FIXTURE_COUNTS.iter().copied().collect();
    assert_eq!(non_zero(&report.counters), expected);
    // Every counter is present, zeros included: 35 keys.
    assert_eq!(report.counters.len(), 35);
    assert_eq!(report.counters["decision.equal"], 0);
    assert_eq!(report.counters["reject.body_too_large"], 0);
}

#[tokio::test]
async fn rejects_and_retries_are_counted_by_reason() {
    let rx = Receiver::builder()
        .clock(Arc::new(ManualClock::new(crate::common::t())))
        .limits(Limits {
            max_body_bytes: 400,
            max_id_bytes: 8,
            max_depth: 4,
            max_held_per_object: 1,
            max_parked_per_object: 1,
            ..Limits::default()
        })
        .object("card-7", 10, "{}")
        .build()
        .unwrap();
    let pad = format!("{{\"pad\":\"{}\"}}", "x".repeat(400));
    let bodies = [
        body("e-1", "card-7", Some("12"), T, &pad), // body_too_large
        body("e-123456789", "card-7", Some("12"), T, READY), // id_too_long
        body("e-2", "card-7", Some("12"), T, "[[[[1]]]]"), // too_deep
        body("e-3", "card-7", None, T, READY),      // held missing_version
        body("e-4", "card-7", None, T, READY),      // retry held_queue_full
        body("e-5", "card-9", Some("1"), T, READY), // held unknown_object
        body("e-6", "card-9", Some("1"), T, READY), // retry parking_full
        "not json".to_owned(),                      // held malformed
        body("e-7", "card-7", Some("11"), T, READY), // applied
        body(r"e-\u0000", "card-7", Some("13"), T, READY), // nul_in_id
    ];
    for b in &bodies {
        rx.deliver(b.as_bytes()).await;
    }
    rx.shutdown().await;
    rx.deliver(bodies[8].as_bytes()).await; // retry shutting_down
    let expected = BTreeMap::from([
        ("decision.applied", 1),
        ("decision.held", 3),
        ("held.malformed", 1),
        ("held.missing_version", 1),
        ("held.unknown_object", 1),
        ("reject.body_too_large", 1),
        ("reject.id_too_long", 1),
        ("reject.nul_in_id", 1),
        ("reject.too_deep", 1),
        ("retry.held_queue_full", 1),
        ("retry.parking_full", 1),
        ("retry.shutting_down", 1),
    ]);
    assert_eq!(non_zero(&rx.metrics()), expected);
}

/// The guide's metrics table (docs/OPERATIONS.md, Metrics) has every
/// readable key of `Receiver::metrics()` and no other.
#[tokio::test]
async fn the_guide_lists_every_readable_key() {
    let rx = receiver();
    let keys: std::collections::BTreeSet<String> = rx.metrics().into_keys().collect();
    let table = crate::doc_commands::metrics_table();
    assert_eq!(crate::doc_commands::documented_keys(&table), keys);
    rx.shutdown().await;
}

#[tokio::test]
async fn a_duplicate_counts_once_as_duplicate() {
    let rx = receiver();
    let b = body("e-1", "card-8", None, T, READY);
    rx.deliver(b.as_bytes()).await;
    rx.deliver(b.as_bytes()).await;
    let expected = BTreeMap::from([
        ("decision.duplicate", 1),
        ("decision.held", 1),
        ("held.missing_version", 1),
    ]);
    assert_eq!(non_zero(&rx.metrics()), expected);
}

/// A recorder that keeps every facade counter as `name{label=value}`.
#[derive(Default)]
pub(crate) struct Capture(pub(crate) Mutex<BTreeMap<String, Arc<AtomicU64>>>);

impl Recorder for Capture {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        let counter = self.0.lock().unwrap().entry(name).or_default().clone();
        Counter::from_arc(counter)
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

#[test]
fn the_metrics_facade_sees_the_same_counts() {
    let capture = Capture::default();
    // A local recorder is per thread: a current-thread runtime keeps the
    // receiver's callers (which count) on this thread.
    let report = metrics::with_local_recorder(&capture, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(replay(&fixture(), None))
            .unwrap()
    });
    let seen: BTreeMap<String, u64> = capture
        .0
        .lock()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.load(Ordering::Relaxed)))
        .collect();
    let expected: BTreeMap<String, u64> = [
        ("snapshot_receiver_authority_total{outcome=applied}", 2),
        ("snapshot_receiver_conflicts_total{kind=event_variant}", 1),
        ("snapshot_receiver_conflicts_total{kind=version_state}", 1),
        ("snapshot_receiver_decisions_total{decision=applied}", 2),
        ("snapshot_receiver_decisions_total{decision=conflict}", 2),
        ("snapshot_receiver_decisions_total{decision=duplicate}", 1),
        ("snapshot_receiver_decisions_total{decision=held}", 4),
        ("snapshot_receiver_decisions_total{decision=stale}", 1),
        ("snapshot_receiver_held_total{reason=missing_version}", 1),
        ("snapshot_receiver_held_total{reason=paused}", 1),
        ("snapshot_receiver_held_total{reason=unknown_object}", 1),
        ("snapshot_receiver_held_total{reason=unsupported_type}", 1),
        ("snapshot_receiver_reevaluated_total{decision=equal}", 1),
        ("snapshot_receiver_reevaluated_total{decision=stale}", 1),
        (
            "snapshot_receiver_reevaluated_total{decision=unresolved}",
            3,
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(seen, expected);
    // Each is in the guide's table (docs/OPERATIONS.md, Metrics), with its
    // label and value.
    let table = crate::doc_commands::metrics_table();
    for series in seen.keys() {
        assert_eq!(crate::doc_commands::undocumented(&table, series), None);
    }
    let total: u64 = report.counters.values().sum();
    assert_eq!(seen.values().sum::<u64>(), total);
}

#[test]
fn replay_text_ends_with_every_counter() {
    let o = crate::common::cli()
        .args(["replay", "fixtures/B62-15-events.json"])
        .output()
        .unwrap();
    assert!(o.status.success());
    let out = String::from_utf8(o.stdout).unwrap();
    let counters: BTreeMap<String, u64> = out
        .split("\n== counters (this run) ==\n")
        .nth(1)
        .unwrap()
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap();
            (k.to_owned(), v.trim().parse().unwrap())
        })
        .collect();
    assert_eq!(counters.len(), 35);
    let shown: BTreeMap<&str, u64> = counters
        .iter()
        .filter(|(_, &v)| v > 0)
        .map(|(k, &v)| (k.as_str(), v))
        .collect();
    assert_eq!(shown, FIXTURE_COUNTS.iter().copied().collect());
}
