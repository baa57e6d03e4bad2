//! Model 10: a variant decided on one shard pauses an object another shard
//! owns, while that shard decides a delivery for it (docs/CONTRACT.md §3.6:
//! the pause is part of the variant's decision, durable before its answer,
//! and nothing decides past it).
//!
//! Two durable shards on one model store that checks every condition a
//! decision wrote (`Tables::apply_checked`, as SQLite and PostgreSQL check
//! them). Card A v11 holds e-1's first record; card B is on the other
//! shard. Two threads, each a shard's driver around the shipped
//! `engine::Pipeline`, committing its groups to the store itself and
//! reloading and deciding again after a conflict:
//! - shard b: e-1's variant naming card B;
//! - shard a: e-2, card A v12.
//!
//! In every interleaving: when the variant is answered, the store already
//! holds card A paused; e-2 is `applied` only if its group committed before
//! the variant's, and `held` (paused) otherwise; card A ends paused in the
//! store and in shard a's memory. loom must reach e-2 committed first, e-2
//! decided after the pause reached shard a's inbox, and e-2 decided on the
//! unpaused card A, refused by the store and decided again as `held`.
//!
//! The must-fail control (10c, `Shard::pause_after_answer`) writes the pause
//! the way it was written before: not with the variant but in shard a's
//! next group, after the variant was answered; loom finds the variant
//! answered while the store holds card A unpaused.

use super::states::{QUEUED_MAP, READY_CHART, READY_MAP, REVIEW_CHART};
use loom::sync::Mutex;
use loom::thread;
use loom_tests::{at, card_on_the_other_shard, event, explore, owner, Exploration, Tables, World};
use snapshot_receiver_core::engine::{Answer, Handover, Pipeline, Reply, Work};
use snapshot_receiver_core::write::Write;
use snapshot_receiver_core::{ConflictKind, Decision, HoldReason, Receipt};
use std::cell::RefCell;

/// Card A: e-1 and e-2 name it.
const A: &str = "card-7";

/// The model's store: its tables, and each committed group's delivery
/// audit rows (event, decision) in commit order.
#[derive(Default)]
struct Db {
    tables: Tables,
    commits: Vec<Vec<(String, String)>>,
    /// Groups the store refused because a condition no longer held.
    conflicts: usize,
}

impl Db {
    fn commit(
        &mut self,
        writes: Vec<Write>,
    ) -> Result<(), snapshot_receiver_core::store::StoreError> {
        let delivered = writes
            .iter()
            .filter_map(|w| match w {
                Write::Audit(a) if a.kind == "delivery" => Some((
                    a.event_id.as_deref().unwrap_or_default().to_owned(),
                    a.decision.clone().unwrap_or_default(),
                )),
                _ => None,
            })
            .collect();
        let result = self.tables.apply_checked(writes);
        match &result {
            Ok(()) => self.commits.push(delivered),
            Err(_) => self.conflicts += 1,
        }
        result
    }

    /// The index of the commit that recorded `event_id` with `decision`.
    fn committed(&self, event_id: &str, decision: &str) -> Option<usize> {
        self.commits
            .iter()
            .position(|c| c.iter().any(|(e, d)| e == event_id && d == decision))
    }

    fn a_paused(&self) -> bool {
        self.tables.objects[A].paused
    }
}

/// The reply token: a variant's answer checks that the store already holds
/// its pause of card A, then every answer is recorded.
struct Caller<'a> {
    db: &'a Mutex<Db>,
    answered: &'a RefCell<Vec<Receipt>>,
}

impl Reply for Caller<'_> {
    fn answer(self, answer: Answer<'_>) {
        let Answer::Delivered(receipt) = answer else {
            panic!("only deliveries in this model");
        };
        if receipt.decision() == Some(Decision::Conflict(ConflictKind::EventVariant)) {
            assert!(
                self.db.lock().unwrap().a_paused(),
                "e-1's variant answered while the store holds {A} unpaused: its pause is not durable"
            );
        }
        self.answered.borrow_mut().push(receipt);
    }
}

/// Shard `shard`'s driver: decides `bodies` (nothing but its queued pauses
/// when empty), then commits group after group, reloading and deciding
/// again after a conflict, until nothing is left. Returns the answers.
fn drive(world: &World, db: &Mutex<Db>, shard: usize, bodies: &[String]) -> Vec<Receipt> {
    let answered = RefCell::new(Vec::new());
    let mut pipeline = Pipeline::new(shard);
    let works = bodies.iter().map(|body| {
        let caller = Caller {
            db,
            answered: &answered,
        };
        Work::Deliver(world.delivery(body), caller)
    });
    pipeline.decide(&world.set, works);
    loop {
        match pipeline.hand_over(&world.set) {
            Handover::Commit(writes) => {
                let result = db.lock().unwrap().commit(writes);
                if let Some(touched) = pipeline.settle(&world.set, result) {
                    let reloaded = db.lock().unwrap().tables.reload(&touched);
                    pipeline.reloaded(&world.set, Ok(reloaded));
                }
            }
            Handover::Answered => {}
            Handover::Idle => break,
        }
    }
    answered.into_inner()
}

/// Runs the model; `control` leaves the pause to card A's shard's next
/// group (10c).
pub fn model(control: bool) {
    let name = if control {
        "10c control: a variant's pause of another shard's object committed after its answer"
    } else {
        "10 a variant pauses another shard's object while that shard decides it"
    };
    explore(
        name,
        Exploration::Exhaustive,
        &[
            "e-2 applied, committed before the variant",
            "e-2 held, decided after the pause",
            "e-2 decided unpaused, refused, decided again as held",
        ],
        move |seen| {
            let b = card_on_the_other_shard(A);
            let objects = [(A, 10, QUEUED_MAP), (b.as_str(), 3, READY_CHART)];
            let world = World::durable_tuned(at(20), &objects, |shard| {
                if control {
                    shard.pause_after_answer();
                }
            });
            let db = Mutex::new(Db::default());
            db.lock().unwrap().tables = Tables::new(&objects, Vec::new());
            let (sa, sb) = (owner(A), owner(&b));
            // e-1's first record on card A, committed before the threads start.
            let first = drive(&world, &db, sa, &[event("e-1", A, 11, READY_MAP)]);
            assert_eq!(first[0].decision(), Some(Decision::Applied));
            let db = loom::sync::Arc::new(db);

            let (w, d, body) = (world.clone(), db.clone(), event("e-1", &b, 4, REVIEW_CHART));
            let variant = thread::spawn(move || drive(&w, &d, sb, &[body]));
            let (w, d, body) = (world.clone(), db.clone(), event("e-2", A, 12, READY_CHART));
            let e2 = thread::spawn(move || drive(&w, &d, sa, &[body]));
            let variant = variant.join().unwrap();
            let e2 = e2.join().unwrap();
            // Shard a's next round: what reached its inbox meanwhile.
            drive(&world, &db, sa, &[]);

            assert_eq!(
                variant[0].decision(),
                Some(Decision::Conflict(ConflictKind::EventVariant))
            );
            let db = db.lock().unwrap();
            assert!(db.a_paused(), "{A} ends paused in the store");
            assert!(world.object(A).unwrap().paused, "{A} ends paused in memory");
            let paused_at = db
                .committed("e-1", "conflict:event_variant")
                .expect("the variant is committed");
            match e2[0].decision() {
                Some(Decision::Applied) => {
                    let at = db.committed("e-2", "applied").expect("e-2 committed");
                    assert!(
                        at < paused_at,
                        "e-2 applied to {A} in a group committed after the variant paused it"
                    );
                    assert_eq!(world.object(A).unwrap().version, 12);
                    seen.saw("e-2 applied, committed before the variant");
                }
                Some(Decision::Held(HoldReason::Paused)) => {
                    let at = db.committed("e-2", "held:paused").expect("e-2 committed");
                    assert!(at > paused_at, "e-2 held as paused before the pause");
                    assert_eq!(world.object(A).unwrap().version, 11);
                    seen.saw(if db.conflicts > 0 {
                        "e-2 decided unpaused, refused, decided again as held"
                    } else {
                        "e-2 held, decided after the pause"
                    });
                }
                other => panic!("e-2 decided {other:?}"),
            }
        },
    );
}

#[cfg(not(snapshot_receiver_loom_broken))]
#[test]
fn variant_pauses_another_shards_object_while_it_decides() {
    model(false);
}

#[cfg(not(snapshot_receiver_loom_broken))]
#[test]
#[should_panic(expected = "answered while the store holds")]
fn control_pause_committed_after_the_variants_answer_is_caught() {
    model(true);
}
