//! Property tests: convergence whatever the arrival order.

use crate::common::{body, t, T};
use proptest::prelude::*;
use snapshot_receiver::{Clock, Decision, ManualClock, Receiver, Verdict};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// A conflict-free stream: per object, each version has exactly one state.
#[derive(Clone, Debug)]
struct Stream {
    initial: Vec<u64>,
    /// (event id, object index, version), in arrival order, duplicates included.
    deliveries: Vec<(String, usize, u64)>,
}

fn stream() -> impl Strategy<Value = Stream> {
    (1usize..4)
        .prop_flat_map(|objects| {
            (
                proptest::collection::vec(0u64..6, objects),
                proptest::collection::vec((0..objects, 0u64..16), 1..30),
                proptest::collection::vec(any::<prop::sample::Index>(), 0..20),
            )
        })
        .prop_flat_map(|(initial, events, dups)| {
            let mut deliveries: Vec<(String, usize, u64)> = events
                .iter()
                .enumerate()
                .map(|(i, &(o, v))| (format!("e-{i}"), o, v))
                .collect();
            let copies: Vec<_> = dups
                .iter()
                .map(|ix| deliveries[ix.index(deliveries.len())].clone())
                .collect();
            deliveries.extend(copies);
            (Just(initial), Just(deliveries).prop_shuffle())
        })
        .prop_map(|(initial, deliveries)| Stream {
            initial,
            deliveries,
        })
}

fn state(v: u64) -> String {
    format!("{{\"v\":{v}}}")
}

async fn start(s: &Stream) -> Receiver {
    let mut b = Receiver::builder().clock(Arc::new(ManualClock::new(t())) as Arc<dyn Clock>);
    for (i, v) in s.initial.iter().enumerate() {
        b = b.object(&format!("obj-{i}"), *v, &state(*v));
    }
    b.build().unwrap()
}

fn bytes(d: &(String, usize, u64)) -> String {
    body(
        &d.0,
        &format!("obj-{}", d.1),
        Some(&d.2.to_string()),
        T,
        &state(d.2),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn converges_to_the_highest_version_whatever_the_order(s in stream()) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let rx = start(&s).await;
            // Independent expectation: a sequential model of the rules.
            let mut current = s.initial.clone();
            let mut first: HashMap<&str, Verdict> = HashMap::new();
            let mut raised = 0;
            for d in &s.deliveries {
                let got = rx.deliver(bytes(d).as_bytes()).await.decision().unwrap();
                let expected = match first.get(d.0.as_str()) {
                    Some(&original) => Decision::Duplicate { original },
                    None => {
                        let v = if d.2 > current[d.1] {
                            current[d.1] = d.2;
                            raised += 1;
                            Verdict::Applied
                        } else if d.2 == current[d.1] {
                            Verdict::Equal
                        } else {
                            Verdict::Stale
                        };
                        first.insert(&d.0, v);
                        Decision::from(v)
                    }
                };
                prop_assert_eq!(got, expected);
            }
            for (i, v) in s.initial.iter().enumerate() {
                let highest = s.deliveries.iter().filter(|d| d.1 == i).map(|d| d.2).chain([*v]).max().unwrap();
                let o = rx.object(&format!("obj-{i}")).await.unwrap();
                prop_assert_eq!(o.version, highest);
                prop_assert_eq!(o.state.compact(), state(highest));
                prop_assert!(!o.paused);
            }
            prop_assert_eq!(rx.counters().await.event_replacements, raised);

            // The whole stream again: every delivery is a duplicate, nothing changes.
            let before = rx.objects().await.iter().map(|o| o.version).collect::<Vec<_>>();
            for d in &s.deliveries {
                let got = rx.deliver(bytes(d).as_bytes()).await.decision().unwrap();
                prop_assert!(matches!(got, Decision::Duplicate { .. }), "{:?}", got);
            }
            let after = rx.objects().await.iter().map(|o| o.version).collect::<Vec<_>>();
            prop_assert_eq!(before, after);
            prop_assert_eq!(rx.counters().await.event_replacements, raised);
            let ids: HashSet<&str> = s.deliveries.iter().map(|d| d.0.as_str()).collect();
            prop_assert_eq!(rx.context().registry().len(), ids.len());
            Ok(())
        })?;
    }
}
