//! Model 11: two shards publish effects while a relay reads the outbox
//! (docs/CONTRACT.md §10, the cursor contract).
//!
//! card-7 and a card on the other shard each get one event at once, from
//! two producer threads; the model's own thread is the relay: it reads the
//! outbox twice while they run, keeping the last position it got as its
//! cursor and asking for what follows, then once more after both
//! finished. Every effect must reach it exactly once, whatever the order
//! in which the two steps were decided (their sequence numbers) and
//! published (their positions). The control (11c,
//! `Outbox::number_at_decision`) numbers effects by the step number taken
//! at decision time, as before positions: loom finds the later-decided
//! step published and read first, the relay's cursor passing the earlier
//! one before it is visible, and that effect never read.

use loom::thread;
use loom_tests::{at, card_on_the_other_shard, event, explore, owner, Exploration, World};
use std::collections::BTreeMap;

const V6: &str = r#"{"stage":"draft","label":"v6"}"#;
const V7: &str = r#"{"stage":"ready","label":"v7"}"#;
const V1: &str = r#"{"stage":"draft","label":"other v1"}"#;
const V2: &str = r#"{"stage":"ready","label":"other v2"}"#;

/// The model; `control` numbers effects at decision time.
pub fn model(control: bool) {
    explore(
        if control {
            "11c outbox numbered at decision time (must fail)"
        } else {
            "11 outbox read while two shards publish"
        },
        Exploration::Bounded,
        &[
            "decided and published in one order",
            "published out of decision order",
            "relay read between the two publications",
        ],
        move |seen| {
            let other = card_on_the_other_shard("card-7");
            assert_ne!(owner("card-7"), owner(&other));
            let world = World::new(at(20), &[("card-7", 6, V6), (other.as_str(), 1, V1)]);
            if control {
                world.outbox().number_at_decision();
            }
            let w = world.clone();
            let a = thread::spawn(move || {
                w.deliver(&event("e-1", "card-7", 7, V7));
            });
            let (w, o) = (world.clone(), other.clone());
            let b = thread::spawn(move || {
                w.deliver(&event("e-2", &o, 2, V2));
            });
            // The relay, while they run.
            let mut cursor = 0;
            let mut read = Vec::new();
            for _ in 0..2 {
                let got = world.outbox().after(cursor, 10).unwrap();
                if got.len() == 1 && world.outbox().last_position() < 2 {
                    seen.saw("relay read between the two publications");
                }
                if let Some(last) = got.last() {
                    cursor = last.position;
                }
                read.extend(got);
            }
            a.join().unwrap();
            b.join().unwrap();
            read.extend(world.outbox().after(cursor, 10).unwrap());

            // Both effects were made, one per object.
            let all = world.outbox().after(0, 10).unwrap();
            assert_eq!(all.len(), 2, "{all:?}");
            let versions: BTreeMap<String, u64> = all
                .iter()
                .map(|e| (e.object_id.to_string(), e.version))
                .collect();
            assert_eq!(
                versions,
                BTreeMap::from([("card-7".to_owned(), 7), (other.clone(), 2)])
            );
            // Every effect read exactly once.
            let mut ids: Vec<_> = read.iter().map(|e| e.id).collect();
            ids.sort_unstable();
            let mut expected: Vec<_> = all.iter().map(|e| e.id).collect();
            expected.sort_unstable();
            assert_eq!(
                ids, expected,
                "the relay read {read:?}; the outbox holds {all:?}"
            );
            // Positions 1 and 2, in the order of publication.
            assert_eq!(all.iter().map(|e| e.position).collect::<Vec<_>>(), [1, 2]);
            seen.saw(if all[0].id.seq < all[1].id.seq {
                "decided and published in one order"
            } else {
                "published out of decision order"
            });
        },
    );
}

#[cfg(not(snapshot_receiver_loom_broken))]
#[test]
fn two_shards_publish_while_a_relay_reads() {
    model(false);
}

#[cfg(not(snapshot_receiver_loom_broken))]
#[test]
#[should_panic(expected = "the relay read")]
fn control_numbered_at_decision_time_is_caught() {
    model(true);
}
