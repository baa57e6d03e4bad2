//! Model 2: an event and its changed variant (same `event_id`, different
//! content) at once.

use crate::states::{QUEUED_MAP, QUEUED_MAP_DRAFT, READY_CHART, REVIEW_CHART};
use loom_tests::{at, event, explore, owner, Exploration, World};
use snapshot_receiver_core::{
    AuditEntry, ConflictKind, Counters, Decision, PauseRequest, Step, Verdict,
};

const VARIANT: Decision = Decision::Conflict(ConflictKind::EventVariant);

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
                Counters {
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
            // is a duplicate of `applied`, the variant's body is still a variant.
            assert_eq!(
                world.deliver(&bodies[first]).receipt.decision(),
                Some(Decision::Duplicate {
                    original: Verdict::Applied
                })
            );
            assert_eq!(
                world.deliver(&bodies[variant]).receipt.decision(),
                Some(VARIANT)
            );
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
                Counters {
                    event_replacements: 1,
                    authority_replacements: 0
                }
            );
            // The first record names the winner's object and was never overwritten.
            let record = world.ctx.registry().get("e-300").unwrap();
            assert_eq!(
                (&*record.object_id, record.decision, record.first_seen),
                (ids[first], Verdict::Applied, at(20))
            );
            // Both bodies retained. Their sequence numbers may come in either
            // order (each shard draws one after its registry claim), so compare
            // as a set ordered by decision.
            let mut kept = world.deliveries_of("e-300");
            kept.sort_by_key(|(d, _, _)| *d != Decision::Applied);
            assert_eq!(
                kept,
                vec![
                    (Decision::Applied, true, bodies[first].clone()),
                    (VARIANT, false, bodies[variant].clone()),
                ]
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
