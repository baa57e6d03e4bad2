//! Model 5: retention purge of an identity concurrently with a redelivery of
//! it, while the clock reaches the end of the retention window.

use crate::states::{QUEUED_MAP, READY_MAP};
use loom::thread;
use loom_tests::{at, event, explore, t0, Exploration, World, RETENTION};
use snapshot_receiver_core::{Decision, IdentityRecord, ReplacementCounts, Verdict};

/// e-201 was applied at T+20 s. Then, at once: a purge (reads the clock,
/// purges), a redelivery of e-201, and the clock moving to T+20 s +
/// retention, the first instant the record is no longer trusted.
pub fn model() {
    explore(
        "5 purge vs redelivery",
        Exploration::Exhaustive,
        &[
            "duplicate, record kept",
            "duplicate, then purged",
            "equal, expired record replaced",
            "equal, old record purged first",
            "equal, purged under an earlier clock reading",
        ],
        |seen| {
            let world = World::new(at(20), &[("card-7", 10, QUEUED_MAP)]);
            let body = event("e-201", "card-7", 12, READY_MAP);
            assert_eq!(
                world.deliver(&body).receipt.decision(),
                Some(Decision::Applied)
            );
            let original = world.ctx().registry().get("e-201").unwrap();
            let window_end = at(20) + RETENTION;

            let w = world.clone();
            let purge = thread::spawn(move || w.purge());
            let w = world.clone();
            let again = thread::spawn(move || w.deliver(&body).receipt);
            let w = world.clone();
            let tick = thread::spawn(move || w.clock.set(window_end));
            let (removed, again) = (purge.join().unwrap(), again.join().unwrap());
            tick.join().unwrap();

            // Never a second `applied`: inside the window the redelivery is a
            // duplicate of `applied`; once the record expired (purged or not) the
            // version check finds the same version and state: `equal`.
            let record = world.ctx().registry().get("e-201");
            match again.decision() {
                Some(Decision::Duplicate {
                    original: Verdict::Applied,
                }) => {
                    // The original record stays until a purge at the window's end
                    // removes it.
                    assert!(
                        (removed, &record) == (0, &Some(original.clone()))
                            || (removed, &record) == (1, &None),
                        "duplicate: removed {removed}, record {record:?}"
                    );
                    seen.saw(if removed == 0 {
                        "duplicate, record kept"
                    } else {
                        "duplicate, then purged"
                    });
                }
                Some(Decision::Equal) => {
                    // A fresh first record, stamped with the time the
                    // redelivery read before its claim.
                    let stamped = record.as_ref().map(|r| r.first_seen).unwrap_or(t0());
                    assert_eq!(
                        record,
                        Some(IdentityRecord {
                            decision: Verdict::Equal,
                            first_seen: stamped,
                            ..original.clone()
                        })
                    );
                    seen.saw(match (removed, stamped == window_end) {
                        (0, true) => "equal, expired record replaced",
                        (1, true) => "equal, old record purged first",
                        // The redelivery read the clock before the window
                        // ended, the purge after; the purge removed the
                        // record before the redelivery's claim. The version
                        // check decides (`equal`), and the new record carries
                        // the earlier reading, so it is already expired.
                        (1, false) => "equal, purged under an earlier clock reading",
                        other => panic!("equal with (removed, stamped at window end) = {other:?}"),
                    });
                }
                other => panic!("e-201 redelivered got {other:?}: never a second applied"),
            }
            let applied = world
                .deliveries_of("e-201")
                .iter()
                .filter(|(d, _, _)| *d == Decision::Applied)
                .count();
            assert_eq!(applied, 1);
            assert_eq!(
                world.counters(),
                ReplacementCounts {
                    event_replacements: 1,
                    authority_replacements: 0
                }
            );
            let card = world.object("card-7").unwrap();
            assert_eq!(
                (card.version, card.state.compact().as_str(), card.paused),
                (12, READY_MAP, false)
            );
        },
    );
}

#[cfg(not(snapshot_receiver_loom_broken))]
#[test]
fn purge_vs_redelivery() {
    model();
}
