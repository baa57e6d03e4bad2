//! Model 6: reconciliation concurrently with a delivery that gets held.

use crate::states::{ARCHIVED_MAP_V2, QUEUED_MAP};
use loom::thread;
use loom_tests::{at, event, explore, owner, Exploration, World};
use snapshot_receiver_core::{
    AuditEntry, AuthoritativeSnapshot, Decision, HoldReason, PauseRequest, ReevaluationOutcome,
    ReplacementCounts, Verdict,
};

const AUTHORITY_STATE: &str = r#"{"stage":"review","label":"Map"}"#;

fn is_duplicate(decision: &Decision) -> bool {
    matches!(decision, Decision::Duplicate { .. })
}

/// card-7 (v10) is paused by a variant seen elsewhere. At once: e-203 (v14)
/// is delivered, delivered again, and an authority (v13) reconciles card-7.
/// e-203 is held if it arrives before the authority and re-evaluated by it;
/// otherwise it applies directly. Either way exactly once.
pub fn model() {
    explore(
        "6 reconcile vs held delivery",
        Exploration::Exhaustive,
        &[
            "held; duplicate before the authority",
            "held; duplicate after the authority",
            "authority first; applied directly",
        ],
        |seen| {
            let world = World::new(at(20), &[("card-7", 10, QUEUED_MAP)]);
            assert!(world.forward(&PauseRequest {
                object_id: "card-7".into(),
                cause_event: "e-202".into(),
                recorded: None,
            }));
            let body = event("e-203", "card-7", 14, ARCHIVED_MAP_V2);
            let authority =
                AuthoritativeSnapshot::new("card-7", 13, AUTHORITY_STATE, at(20)).unwrap();

            let w = world.clone();
            let b = body.clone();
            let first = thread::spawn(move || w.deliver(&b).receipt);
            let w = world.clone();
            let reconcile = thread::spawn(move || w.reconcile(&authority).unwrap());
            let w = world.clone();
            let second = thread::spawn(move || w.deliver(&body).receipt);
            let receipts = [first.join().unwrap(), second.join().unwrap()];
            let report = reconcile.join().unwrap();

            // One of the two deliveries is e-203's first record; the other a
            // duplicate reporting that record's decision.
            let trail = world.audit_of(owner("card-7"));
            let position =
                |want: fn(&AuditEntry) -> bool| trail.iter().position(|r| want(&r.entry)).unwrap();
            let authority_at = position(|e| matches!(e, AuditEntry::Authority { .. }));
            let first_at = position(
                |e| matches!(e, AuditEntry::Delivery { decision, .. } if !is_duplicate(decision)),
            );
            let duplicate_at = position(
                |e| matches!(e, AuditEntry::Delivery { decision, .. } if is_duplicate(decision)),
            );
            let held_first = first_at < authority_at;
            seen.saw(match (held_first, duplicate_at < authority_at) {
                (true, true) => "held; duplicate before the authority",
                (true, false) => "held; duplicate after the authority",
                (false, _) => "authority first; applied directly",
            });
            let original = if held_first {
                Verdict::Held(HoldReason::Paused)
            } else {
                Verdict::Applied
            };
            let mut decisions = [receipts[0].decision(), receipts[1].decision()];
            decisions.sort_by_key(|d| matches!(d, Some(Decision::Duplicate { .. })));
            assert_eq!(
                decisions,
                [
                    Some(Decision::from(original)),
                    Some(Decision::Duplicate { original })
                ]
            );
            assert_eq!(
                world.ctx().registry().get("e-203").unwrap().decision,
                original
            );

            // Held before the authority: re-evaluated exactly once, by it, and
            // applied. Otherwise nothing was held and nothing re-evaluated.
            let reevaluated: Vec<_> = report
                .reevaluated
                .iter()
                .map(|r| (r.event_id.to_string(), r.outcome))
                .collect();
            let reevaluations: Vec<_> = trail
                .iter()
                .filter_map(|r| match r.entry {
                    AuditEntry::Reevaluated {
                        held_as,
                        decision,
                        replacement,
                    } => Some((held_as, decision, replacement)),
                    _ => None,
                })
                .collect();
            if held_first {
                assert_eq!(
                    reevaluated,
                    vec![(
                        "e-203".to_owned(),
                        ReevaluationOutcome::Decided(Verdict::Applied, true)
                    )]
                );
                assert_eq!(
                    reevaluations,
                    vec![(Verdict::Held(HoldReason::Paused), Verdict::Applied, true)]
                );
            } else {
                assert_eq!((reevaluated, reevaluations), (vec![], vec![]));
            }

            // Applied exactly once, never lost: card-7 ends at e-203's v14,
            // unpaused, with nothing held or unresolved.
            let applied = world
                .deliveries_of("e-203")
                .iter()
                .filter(|(d, _, _)| *d == Decision::Applied)
                .count()
                + usize::from(held_first);
            assert_eq!(applied, 1, "e-203 applied exactly once");
            let card = world.object("card-7").unwrap();
            assert_eq!(
                (
                    card.version,
                    card.state.compact().as_str(),
                    card.paused,
                    card.held
                ),
                (14, ARCHIVED_MAP_V2, false, 0)
            );
            assert_eq!(world.read(owner("card-7"), |s| s.unresolved()), vec![]);
            assert_eq!(
                world.counters(),
                ReplacementCounts {
                    event_replacements: 1,
                    authority_replacements: 1
                }
            );
            assert_eq!(
                (report.previous_version, report.after_authority.version),
                (Some(10), 13)
            );
        },
    );
}

#[cfg(not(snapshot_receiver_loom_broken))]
#[test]
fn reconcile_vs_held_delivery() {
    model();
}
