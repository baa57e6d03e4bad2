//! Model 1: the same event delivered twice at once.

use crate::states::{QUEUED_MAP, READY_MAP};
use loom::thread;
use loom_tests::{at, event, explore, Exploration, World};
use snapshot_receiver_core::{Decision, Receipt, ReplacementCounts, Verdict};

/// Row 1 of the fixture: e-201, card-7 v12 ready / Map.
fn first_copy() -> String {
    event("e-201", "card-7", 12, READY_MAP)
}

/// Row 2 of the fixture: the same semantic content in another key order, other
/// whitespace and an escaped `a`, as a sender's retry would encode it.
const SECOND_COPY: &str = r#"{
  "state":{ "label":"M\u0061p","stage" : "ready" },
  "type":"card.snapshot","occurred_at":"2024-01-01T08:00:00Z",
  "object_version":12, "object_id":"card-7",  "event_id":"e-201"
}"#;

/// The state of [`SECOND_COPY`] as the object keeps it when that copy is the
/// one applied: its own text, compacted (same content as [`READY_MAP`]).
const SECOND_COPY_STATE: &str = r#"{"label":"M\u0061p","stage":"ready"}"#;

/// The state text card-7 keeps after `body` (one of the two copies) applied.
fn state_of(body: &str) -> &'static str {
    if body == SECOND_COPY {
        SECOND_COPY_STATE
    } else {
        READY_MAP
    }
}

/// Checks the two receipts of one event delivered twice and returns the body
/// that was applied. Panics (a loom violation) unless exactly one applied and
/// the other is a duplicate carrying `applied`.
fn one_applied_one_duplicate(a: &Receipt, b: &Receipt, bodies: [String; 2]) -> String {
    let decisions = [a.decision(), b.decision()];
    let applied = Some(Decision::Applied);
    let duplicate = Some(Decision::Duplicate {
        original: Verdict::Applied,
    });
    assert!(
        decisions == [applied, duplicate] || decisions == [duplicate, applied],
        "exactly one delivery of e-201 applied, the other a duplicate of applied; got {decisions:?}"
    );
    let [first, second] = bodies;
    if a.decision() == applied {
        assert_eq!((a.replacement, b.replacement), (true, false));
        first
    } else {
        assert_eq!((a.replacement, b.replacement), (false, true));
        second
    }
}

/// Both copies go through the router to card-7's shard: two producers race to
/// its mailbox. Routing already serialises them; the registry answers the
/// second one.
pub fn routed() {
    explore(
        "1a duplicate, routed",
        Exploration::Exhaustive,
        &["row 1 copy applied", "row 2 copy applied"],
        |seen| {
            let world = World::new(at(20), &[("card-7", 10, QUEUED_MAP)]);
            let w = world.clone();
            let a = thread::spawn(move || w.deliver(&first_copy()).receipt);
            let w = world.clone();
            let b = thread::spawn(move || w.deliver(SECOND_COPY).receipt);
            let (a, b) = (a.join().unwrap(), b.join().unwrap());

            let applied_body =
                one_applied_one_duplicate(&a, &b, [first_copy(), SECOND_COPY.to_owned()]);
            let duplicate_body = if applied_body == SECOND_COPY {
                first_copy()
            } else {
                SECOND_COPY.to_owned()
            };
            seen.saw(if applied_body == SECOND_COPY {
                "row 2 copy applied"
            } else {
                "row 1 copy applied"
            });

            // The state was replaced once, by the copy that applied.
            let card = world.object("card-7").unwrap();
            assert_eq!(
                (card.version, card.state.compact().as_str(), card.paused),
                (12, state_of(&applied_body), false)
            );
            assert_eq!(
                world.counters(),
                ReplacementCounts {
                    event_replacements: 1,
                    authority_replacements: 0
                }
            );
            // The first record holds `applied`, recorded at the model's time.
            let record = world.ctx().registry().get("e-201").unwrap();
            assert_eq!(
                (record.decision, &*record.object_id, record.first_seen),
                (Verdict::Applied, "card-7", at(20))
            );
            // The audit trail: the applied delivery, then the duplicate, each
            // with its own bytes.
            assert_eq!(
                world.deliveries_of("e-201"),
                vec![
                    (Decision::Applied, true, applied_body),
                    (
                        Decision::Duplicate {
                            original: Verdict::Applied
                        },
                        false,
                        duplicate_body
                    ),
                ]
            );
        },
    );
}

/// The same two copies decided by two actors at once, each on its own shard
/// that knows card-7. Routing never does this (one object, one shard); the
/// model takes routing's serialisation away so that the registry's atomic
/// first insert is the only guard, as it is for every cross-shard race (see
/// the variant models). Exactly one shard may apply.
pub fn two_actors() {
    explore(
        "1b duplicate, two actors",
        Exploration::Exhaustive,
        &["shard 0 applied", "shard 1 applied"],
        |seen| {
            let world = World::replicated(at(20), &[("card-7", 10, QUEUED_MAP)]);
            let w = world.clone();
            let a = thread::spawn(move || w.deliver_on(0, &first_copy()).receipt);
            let w = world.clone();
            let b = thread::spawn(move || w.deliver_on(1, SECOND_COPY).receipt);
            let (a, b) = (a.join().unwrap(), b.join().unwrap());

            let applied_body =
                one_applied_one_duplicate(&a, &b, [first_copy(), SECOND_COPY.to_owned()]);
            let (applier, other) = if a.decision() == Some(Decision::Applied) {
                (0, 1)
            } else {
                (1, 0)
            };
            seen.saw(["shard 0 applied", "shard 1 applied"][applier]);
            // One replacement in total: the duplicate changed nothing on its shard.
            assert_eq!(
                world.counters(),
                ReplacementCounts {
                    event_replacements: 1,
                    authority_replacements: 0
                }
            );
            let applied = world.object_on(applier, "card-7").unwrap();
            let untouched = world.object_on(other, "card-7").unwrap();
            assert_eq!(
                (applied.version, applied.state.compact().as_str()),
                (12, state_of(&applied_body))
            );
            assert_eq!(
                (untouched.version, untouched.state.compact().as_str()),
                (10, QUEUED_MAP)
            );
            let record = world.ctx().registry().get("e-201").unwrap();
            assert_eq!(
                (record.decision, record.first_seen),
                (Verdict::Applied, at(20))
            );
        },
    );
}

#[cfg(not(snapshot_receiver_loom_broken))]
#[test]
fn duplicate_routed() {
    routed();
}

#[cfg(not(snapshot_receiver_loom_broken))]
#[test]
fn duplicate_two_actors() {
    two_actors();
}
