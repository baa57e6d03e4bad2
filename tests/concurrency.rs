//! Several producers at once on a multi-threaded runtime.

use crate::common::{shuffle, t, versioned};
use snapshot_receiver::{Clock, Decision, ManualClock, Receiver};
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
    // No delivery lost: one decision each.
    assert_eq!(decisions.len() as u64, PRODUCERS * OBJECTS * VERSIONS);
    let mut firsts: HashMap<&str, u32> = HashMap::new();
    let mut applied: HashMap<&str, u32> = HashMap::new();
    for (id, d) in &decisions {
        if !matches!(d, Decision::Duplicate { .. }) {
            *firsts.entry(id).or_default() += 1;
        }
        if *d == Decision::Applied {
            *applied.entry(id).or_default() += 1;
        }
        assert!(
            matches!(
                d,
                Decision::Applied | Decision::Stale | Decision::Duplicate { .. }
            ),
            "{d:?}"
        );
    }
    // Exactly one first decision per event identity, and at most one application.
    assert_eq!(firsts.len() as u64, OBJECTS * VERSIONS);
    assert!(firsts.values().all(|&n| n == 1));
    assert!(applied.values().all(|&n| n == 1));
    let total_applied: u64 = applied.values().map(|&n| u64::from(n)).sum();
    assert_eq!(rx.counters().await.event_replacements, total_applied);
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
