//! Model 2: an event and its changed variant (same `event_id`, different
//! content) at once, and two copies of one variant at once.

use crate::states::{QUEUED_MAP, QUEUED_MAP_DRAFT, READY_CHART, REVIEW_CHART};
use loom::thread;
use loom_tests::{at, event, explore, owner, Exploration, World};
use snapshot_receiver_core::{
    AuditEntry, ConflictKind, Decision, PauseRequest, ReplacementCounts, Step, Verdict,
};

const VARIANT: Decision = Decision::Conflict(ConflictKind::EventVariant);
const DUPLICATE_OF_VARIANT: Decision = Decision::Duplicate {
    original: Verdict::Conflict(ConflictKind::EventVariant),
};

/// Of two steps for one event identity, returns `(first record, variant)`
/// indexes. Panics (a loom violation) unless exactly one is the first record,
/// with `first`, and the other a conflict of kind `event_variant`.
fn first_and_variant(event_id: &str, steps: [&Step; 2], first: Decision) -> (usize, usize) {
    let decisions = [steps[0].receipt.decision(), steps[1].receipt.decision()];
    if decisions == [Some(first), Some(VARIANT)] {
        (0, 1)
    } else if decisions == [Some(VARIANT), Some(first)] {
        (1, 0)
    } else {
        panic!(
            "exactly one delivery of {event_id} is the first record ({first:?}), \
             the other a conflict/event_variant; got {decisions:?}"
        );
    }
}

/// Both deliveries name card-7 (the fixture's e-202 and its variant), so the
/// router sends both to card-7's shard.
pub fn same_object() {
    explore(
        "2a variant, same object",
        Exploration::Exhaustive,
        &["Map first", "Map draft first"],
        |seen| {
            let bodies = [
                event("e-202", "card-7", 11, QUEUED_MAP),
                event("e-202", "card-7", 11, QUEUED_MAP_DRAFT),
            ];
            let states = [QUEUED_MAP, QUEUED_MAP_DRAFT];
            let world = World::new(at(20), &[("card-7", 10, QUEUED_MAP)]);
            let steps = world.deliver_racing([&bodies[0], &bodies[1]]);

            let (first, variant) =
                first_and_variant("e-202", [&steps[0], &steps[1]], Decision::Applied);
            seen.saw(["Map first", "Map draft first"][first]);
            // Same object: paused here, nothing to forward.
            assert_eq!((&steps[0].pause, &steps[1].pause), (&None, &None));
            // The first record's state stands; the object is paused with the
            // variant held.
            let card = world.object("card-7").unwrap();
            assert_eq!(
                (
                    card.version,
                    card.state.compact().as_str(),
                    card.paused,
                    card.held
                ),
                (11, states[first], true, 1)
            );
            assert_eq!(
                world.counters(),
                ReplacementCounts {
                    event_replacements: 1,
                    authority_replacements: 0
                }
            );
            // Both bodies retained, in the order the shard took them.
            assert_eq!(
                world.deliveries_of("e-202"),
                vec![
                    (Decision::Applied, true, bodies[first].clone()),
                    (VARIANT, false, bodies[variant].clone()),
                ]
            );
            // The first record was never overwritten: redelivering the first body
            // is a duplicate of `applied`; the variant's body, recorded as a
            // variant, is a duplicate of that conflict and is not held again.
            assert_eq!(
                world.deliver(&bodies[first]).receipt.decision(),
                Some(Decision::Duplicate {
                    original: Verdict::Applied
                })
            );
            assert_eq!(
                world.deliver(&bodies[variant]).receipt.decision(),
                Some(DUPLICATE_OF_VARIANT)
            );
            assert_eq!(world.object("card-7").unwrap().held, 1);
        },
    );
}

/// The variant names another known object (card-8), owned by the other shard:
/// the two deliveries run on two shard tasks and race in the registry. The
/// loser pauses its own object and asks the winner's shard to pause the
/// winner's object.
pub fn other_object() {
    explore(
        "2b variant, other object",
        Exploration::Exhaustive,
        &["card-7 first", "card-8 first"],
        |seen| {
            assert_ne!(owner("card-7"), owner("card-8"), "precondition: two shards");
            let ids = ["card-7", "card-8"];
            let bodies = [
                event("e-300", "card-7", 11, QUEUED_MAP),
                event("e-300", "card-8", 4, REVIEW_CHART),
            ];
            let world = World::new(
                at(20),
                &[("card-7", 10, QUEUED_MAP), ("card-8", 3, READY_CHART)],
            );
            let steps = world.deliver_racing([&bodies[0], &bodies[1]]);

            let (first, variant) =
                first_and_variant("e-300", [&steps[0], &steps[1]], Decision::Applied);
            seen.saw(["card-7 first", "card-8 first"][first]);
            // Only the variant's step asks for a pause, of the first record's object.
            assert_eq!(steps[first].pause, None);
            assert_eq!(
                steps[variant].pause,
                Some(PauseRequest {
                    object_id: ids[first].into(),
                    cause_event: "e-300".into(),
                    recorded: None,
                })
            );
            // Both objects end paused; only the first record's object changed.
            let applied = [(11, QUEUED_MAP), (4, REVIEW_CHART)];
            let initial = [(10, QUEUED_MAP), (3, READY_CHART)];
            let winner = world.object(ids[first]).unwrap();
            let loser = world.object(ids[variant]).unwrap();
            assert_eq!(
                (
                    winner.version,
                    winner.state.compact().as_str(),
                    winner.paused,
                    winner.held
                ),
                (applied[first].0, applied[first].1, true, 0)
            );
            assert_eq!(
                (
                    loser.version,
                    loser.state.compact().as_str(),
                    loser.paused,
                    loser.held
                ),
                (initial[variant].0, initial[variant].1, true, 1)
            );
            assert_eq!(
                world.counters(),
                ReplacementCounts {
                    event_replacements: 1,
                    authority_replacements: 0
                }
            );
            // The first record names the winner's object and was never overwritten.
            let record = world.ctx().registry().get("e-300").unwrap();
            assert_eq!(
                (&*record.object_id, record.decision, record.first_seen),
                (ids[first], Verdict::Applied, at(20))
            );
            // Both bodies retained, in the merged audit trail's sequence
            // order: the first record draws its number under the identity's
            // lock, and the variant can only see that record afterwards, so
            // the variant follows it even though two shards recorded them.
            assert_eq!(
                world.deliveries_of("e-300"),
                vec![
                    (Decision::Applied, true, bodies[first].clone()),
                    (VARIANT, false, bodies[variant].clone()),
                ],
                "e-300's first record precedes its variant in the audit trail"
            );
            // The winner's shard recorded the forwarded pause exactly once.
            let pauses: Vec<_> = world
                .audit_of(owner(ids[first]))
                .into_iter()
                .filter_map(|r| match r.entry {
                    AuditEntry::Paused { cause_event } => Some((r.object_id, cause_event)),
                    _ => None,
                })
                .collect();
            assert_eq!(pauses, vec![(Some(ids[first].into()), "e-300".into())]);
            // Redelivering the first body is a duplicate of `applied`.
            assert_eq!(
                world.deliver(&bodies[first]).receipt.decision(),
                Some(Decision::Duplicate {
                    original: Verdict::Applied
                })
            );
        },
    );
}

/// Of two steps for two copies of one variant, returns `(conflict,
/// duplicate)` indexes. Panics (a loom violation) unless exactly one copy is
/// the `conflict` / `event_variant` and the other its duplicate.
fn conflict_and_duplicate(steps: [&Step; 2]) -> (usize, usize) {
    let decisions = [steps[0].receipt.decision(), steps[1].receipt.decision()];
    if decisions == [Some(VARIANT), Some(DUPLICATE_OF_VARIANT)] {
        (0, 1)
    } else if decisions == [Some(DUPLICATE_OF_VARIANT), Some(VARIANT)] {
        (1, 0)
    } else {
        panic!(
            "exactly one copy of the e-202 variant is the conflict, the other its \
             duplicate; got {decisions:?}"
        );
    }
}

/// A sender re-sends the variant of e-202 (its first record already made)
/// and both copies are decided at once, each by its own shard that knows
/// card-7. Routing never does this (one object, one shard); the model takes
/// routing's serialisation away so that the registry's atomic variant
/// insert is the only guard, as it is between receiver processes (where the
/// database's unique key plays its part). Exactly one copy is the conflict.
pub fn resent_two_actors() {
    explore(
        "2c re-sent variant, two actors",
        Exploration::Exhaustive,
        &[
            "shard 0 conflict",
            "shard 1 conflict",
            "conflict audited before its duplicate",
            "duplicate audited before its conflict",
        ],
        |seen| {
            let first = event("e-202", "card-7", 11, QUEUED_MAP);
            let copy = event("e-202", "card-7", 11, QUEUED_MAP_DRAFT);
            let world = World::replicated(at(20), &[("card-7", 10, QUEUED_MAP)]);
            let fingerprint = world
                .ctx()
                .parser()
                .parse(copy.as_bytes())
                .unwrap()
                .fingerprint()
                .unwrap();
            // e-202's first record, before the race, on shard 0.
            assert_eq!(
                world.deliver_on(0, &first).receipt.decision(),
                Some(Decision::Applied)
            );
            let spawn = |shard: usize| {
                let (w, body) = (world.clone(), copy.clone());
                thread::spawn(move || w.deliver_on(shard, &body))
            };
            let (a, b) = (spawn(0), spawn(1));
            let steps = [a.join().unwrap(), b.join().unwrap()];

            let (conflict, duplicate) = conflict_and_duplicate([&steps[0], &steps[1]]);
            seen.saw(["shard 0 conflict", "shard 1 conflict"][conflict]);
            // Same object as the first record: nothing to forward.
            assert_eq!((&steps[0].pause, &steps[1].pause), (&None, &None));
            // The conflict's shard paused card-7 and holds the variant once;
            // the duplicate changed nothing on its shard.
            let held = world.object_on(conflict, "card-7").unwrap();
            let untouched = world.object_on(duplicate, "card-7").unwrap();
            assert_eq!((held.paused, held.held), (true, 1));
            assert_eq!((untouched.paused, untouched.held), (false, 0));
            assert_eq!(
                untouched.version,
                [11, 10][duplicate],
                "shard 0 applied e-202, shard 1 never saw it"
            );
            // One variant recorded; the first record untouched.
            assert_eq!(world.ctx().registry().variants("e-202"), [fingerprint]);
            let record = world.ctx().registry().get("e-202").unwrap();
            assert_eq!(record.decision, Verdict::Applied);
            // Both copies audited, each with its decision, after the first
            // record. Between the two copies the trail's order is not the
            // decision order: each copy draws its sequence number after its
            // registry claim and before the variant insert that tells the
            // conflict from the duplicate, so the duplicate may come first.
            let kept: Vec<Decision> = world
                .deliveries_of("e-202")
                .into_iter()
                .map(|(d, _, _)| d)
                .collect();
            assert_eq!(kept.first(), Some(&Decision::Applied), "{kept:?}");
            if kept[1..] == [VARIANT, DUPLICATE_OF_VARIANT] {
                seen.saw("conflict audited before its duplicate");
            } else {
                assert_eq!(kept[1..], [DUPLICATE_OF_VARIANT, VARIANT], "{kept:?}");
                seen.saw("duplicate audited before its conflict");
            }
            // A third copy, on either shard, is a duplicate too.
            assert_eq!(
                world.deliver_on(duplicate, &copy).receipt.decision(),
                Some(DUPLICATE_OF_VARIANT)
            );
        },
    );
}

/// The same two copies through the router: both go to card-7's shard, which
/// takes them one at a time; the registry answers the second.
pub fn resent_routed() {
    explore(
        "2d re-sent variant, routed",
        Exploration::Exhaustive,
        &["copy 1 conflict", "copy 2 conflict"],
        |seen| {
            let world = World::new(at(20), &[("card-7", 10, QUEUED_MAP)]);
            let first = event("e-202", "card-7", 11, QUEUED_MAP);
            // The same variant content, encoded twice (key order, spacing).
            let copies = [
                event("e-202", "card-7", 11, QUEUED_MAP_DRAFT),
                event(
                    "e-202",
                    "card-7",
                    11,
                    r#"{ "label": "Map draft", "stage": "queued" }"#,
                ),
            ];
            assert_eq!(
                world.deliver(&first).receipt.decision(),
                Some(Decision::Applied)
            );
            let steps = world.deliver_racing([&copies[0], &copies[1]]);
            let (conflict, _) = conflict_and_duplicate([&steps[0], &steps[1]]);
            seen.saw(["copy 1 conflict", "copy 2 conflict"][conflict]);
            let card = world.object("card-7").unwrap();
            assert_eq!((card.version, card.paused, card.held), (11, true, 1));
            assert_eq!(world.ctx().registry().variants("e-202").len(), 1);
        },
    );
}

#[cfg(not(snapshot_receiver_loom_broken))]
#[test]
fn variant_resent_two_actors() {
    resent_two_actors();
}

#[cfg(not(snapshot_receiver_loom_broken))]
#[test]
fn variant_resent_routed() {
    resent_routed();
}

#[cfg(not(snapshot_receiver_loom_broken))]
#[test]
fn variant_same_object() {
    same_object();
}

#[cfg(not(snapshot_receiver_loom_broken))]
#[test]
fn variant_other_object() {
    other_object();
}
