//! Several producers at once on a multi-threaded runtime.

use crate::common::{shuffle, t, versioned};
use snapshot_receiver::{AuditEntry, Clock, Decision, ManualClock, Receiver, Verdict};
use std::collections::HashMap;
use std::sync::Arc;

const OBJECTS: u64 = 50;
const VERSIONS: u64 = 20;
const PRODUCERS: u64 = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overlapping_shuffled_producers_converge_and_apply_each_event_at_most_once() {
    let mut builder = Receiver::builder()
        .shards(4)
        .mailbox_capacity(8)
        .clock(Arc::new(ManualClock::new(t())) as Arc<dyn Clock>);
    for o in 0..OBJECTS {
        builder = builder.object(&format!("obj-{o}"), 0, r#"{"v":0}"#);
    }
    let rx = builder.build().unwrap();
    let events: Vec<(String, String)> = (0..OBJECTS)
        .flat_map(|o| (1..=VERSIONS).map(move |v| versioned(o, v)))
        .collect();
    let mut tasks = Vec::new();
    for p in 0..PRODUCERS {
        let rx = rx.clone();
        let mut mine = events.clone();
        shuffle(&mut mine, 0x9E37_79B9_7F4A_7C15 ^ (p + 1));
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::with_capacity(mine.len());
            for (id, b) in mine {
                out.push((id, rx.deliver(b.as_bytes()).await.decision().unwrap()));
            }
            out
        }));
    }
    let mut decisions = Vec::new();
    for t in tasks {
        decisions.extend(t.await.unwrap());
    }
    // Per identity: exactly one first decision (applied or stale), and every
    // other copy a duplicate that reports that first decision.
    let mut by_id: HashMap<&str, Vec<Decision>> = HashMap::new();
    for (id, d) in &decisions {
        by_id.entry(id).or_default().push(*d);
    }
    let mut applied = 0;
    for (id, ds) in &by_id {
        let firsts: Vec<&Decision> = ds
            .iter()
            .filter(|d| !matches!(d, Decision::Duplicate { .. }))
            .collect();
        assert_eq!(firsts.len(), 1, "{id}: {ds:?}");
        let original = match firsts[0] {
            Decision::Applied => Verdict::Applied,
            Decision::Stale => Verdict::Stale,
            other => panic!("{id}: first decision {other:?}"),
        };
        applied += u64::from(original == Verdict::Applied);
        let duplicates = ds
            .iter()
            .filter(|d| **d == Decision::Duplicate { original })
            .count() as u64;
        assert_eq!(duplicates, PRODUCERS - 1, "{id}: {ds:?}");
        assert_eq!(
            rx.context().registry().get(id).map(|r| r.decision),
            Some(original),
            "{id}"
        );
    }
    // No delivery lost: the audit trail holds each receipt's decision, one
    // record per delivery, and the counters saw them all.
    let mut audited: HashMap<String, Vec<String>> = HashMap::new();
    for r in rx.audit().await {
        match r.entry {
            AuditEntry::Delivery { decision, .. } => audited
                .entry(r.event_id.unwrap().to_string())
                .or_default()
                .push(format!("{decision:?}")),
            other => panic!("{other:?}"),
        }
    }
    let received: HashMap<String, Vec<String>> = by_id
        .iter()
        .map(|(id, ds)| {
            (
                id.to_string(),
                ds.iter().map(|d| format!("{d:?}")).collect(),
            )
        })
        .collect();
    let sorted = |mut m: HashMap<String, Vec<String>>| {
        m.values_mut().for_each(|list| list.sort());
        m
    };
    assert_eq!(sorted(audited), sorted(received));
    let metrics = rx.metrics();
    assert_eq!(
        (metrics["decision.applied"], metrics["decision.stale"]),
        (applied, OBJECTS * VERSIONS - applied)
    );
    assert_eq!(
        metrics["decision.duplicate"],
        (PRODUCERS - 1) * OBJECTS * VERSIONS
    );
    assert_eq!(rx.counters().await.event_replacements, applied);
    // Every object converges to its highest version.
    for o in rx.objects().await {
        assert_eq!(
            (o.version, o.state.compact(), o.paused),
            (VERSIONS, format!("{{\"v\":{VERSIONS}}}"), false)
        );
    }
    assert_eq!(rx.context().registry().len() as u64, OBJECTS * VERSIONS);
    rx.shutdown().await;
}
