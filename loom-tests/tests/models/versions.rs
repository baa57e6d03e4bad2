//! Model 4: two different events with versions 7 and 8 for one object at once.

use loom::thread;
use loom_tests::{at, event, explore, Exploration, World};
use snapshot_receiver_core::{AuditEntry, Decision, ReplacementCounts};

const V6: &str = r#"{"stage":"draft","label":"v6"}"#;
const V7: &str = r#"{"stage":"draft","label":"v7"}"#;
const V8: &str = r#"{"stage":"ready","label":"v8"}"#;

/// card-7 at v6; e-407 (v7) and e-408 (v8) race to its shard.
pub fn model() {
    explore(
        "4 versions 7 and 8",
        Exploration::Exhaustive,
        &["7 then 8", "8 then 7"],
        |seen| {
            let world = World::new(at(20), &[("card-7", 6, V6)]);
            let w = world.clone();
            let a = thread::spawn(move || w.deliver(&event("e-407", "card-7", 7, V7)).receipt);
            let w = world.clone();
            let b = thread::spawn(move || w.deliver(&event("e-408", "card-7", 8, V8)).receipt);
            let (v7, v8) = (a.join().unwrap(), b.join().unwrap());

            // The object ends at 8 whatever the order; 7 is never the final state.
            let card = world.object("card-7").unwrap();
            assert_eq!(
                (card.version, card.state.compact().as_str(), card.paused),
                (8, V8, false)
            );
            assert_eq!(v8.decision(), Some(Decision::Applied));

            // 7 was either applied first and then replaced by 8, or came second
            // and is stale; which one is fixed by the order the shard took them.
            let order: Vec<(String, Decision, Option<u64>)> = world
                .audit()
                .into_iter()
                .filter_map(|r| match r.entry {
                    AuditEntry::Delivery {
                        decision, version, ..
                    } => Some((r.event_id.unwrap().to_string(), decision, version)),
                    _ => None,
                })
                .collect();
            let seven_first = order[0].0 == "e-407";
            seen.saw(if seven_first { "7 then 8" } else { "8 then 7" });
            let (expected, replacements) = if seven_first {
                (
                    vec![
                        ("e-407".to_owned(), Decision::Applied, Some(7)),
                        ("e-408".to_owned(), Decision::Applied, Some(8)),
                    ],
                    2,
                )
            } else {
                (
                    vec![
                        ("e-408".to_owned(), Decision::Applied, Some(8)),
                        ("e-407".to_owned(), Decision::Stale, Some(8)),
                    ],
                    1,
                )
            };
            assert_eq!(order, expected);
            assert_eq!(
                v7.decision(),
                Some(if seven_first {
                    Decision::Applied
                } else {
                    Decision::Stale
                })
            );
            assert_eq!(
                world.counters(),
                ReplacementCounts {
                    event_replacements: replacements,
                    authority_replacements: 0
                }
            );
        },
    );
}

#[cfg(not(snapshot_receiver_loom_broken))]
#[test]
fn versions_7_and_8() {
    model();
}
