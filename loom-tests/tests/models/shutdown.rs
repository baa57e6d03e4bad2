//! Model 12: shutdown. A variant decided on shard a pauses card B, which
//! shard b owns, while shard b's driver has nothing left to take and waits
//! to stop (docs/CONTRACT.md §3.6: a variant's pause reaches the owner of
//! every object it names).
//!
//! Two durable shards on one model store, each driven by a thread running
//! the shipped loop policy, `engine::Pipeline::next`, with the means of a
//! driver that commits to the store itself and blocks on a condition
//! variable for its wake-ups (the receiver's shard task waits on tokio's
//! `Notify` in the same places):
//! - shard a's intake holds e-1's variant naming card A, then closes;
//! - shard b's intake is closed and empty from the start.
//!
//! e-1's first record (card B v4) is committed before the threads start.
//! In every interleaving both drivers stop, and when they have: no pause
//! waits in any inbox, card B is paused in shard b's memory and in the
//! store, card A too. loom must reach both ends of b's wait: a ran to its
//! end first (b finds the pause and everyone quiet, and never waits), and b
//! waited for a wake-up (the pause, or a's going quiet).
//!
//! The must-fail control (12c, `Pipeline::stop_unquiet`) is the shutdown
//! rule as it was before the drivers counted who may still raise a pause:
//! b stops as soon as it has nothing decided and nothing queued; loom finds
//! it stopped before a's variant queued card B's pause.

use super::states::{QUEUED_MAP, READY_CHART, READY_MAP, REVIEW_CHART};
use loom::sync::{Condvar, Mutex};
use loom::thread;
use loom_tests::{
    at, card_on_the_other_shard, event, explore, owner, Exploration, Tables, World, SHARDS,
};
use snapshot_receiver_core::engine::{Answer, Handover, Next, Outlet, Pipeline, Reply, Work};
use snapshot_receiver_core::{ConflictKind, Decision, EffectRecord, Receipt};

/// Card A: the variant names it.
const A: &str = "card-7";

/// The drivers' wake-ups: one flag per shard behind a loom mutex, and a
/// condition variable a waiting driver blocks on.
struct Wakes {
    flags: Mutex<[bool; SHARDS]>,
    woken: Condvar,
}

impl Wakes {
    fn new() -> Self {
        Wakes {
            flags: Mutex::new([false; SHARDS]),
            woken: Condvar::new(),
        }
    }

    /// Blocks until shard `shard` was woken, and takes the wake-up.
    fn wait(&self, shard: usize) {
        let mut flags = self.flags.lock().unwrap();
        while !flags[shard] {
            flags = self.woken.wait(flags).unwrap();
        }
        flags[shard] = false;
    }
}

impl Outlet for Wakes {
    fn listening(&self) -> bool {
        false
    }
    fn decision(&self, _: &Receipt) {}
    fn effect(&self, _: EffectRecord) {}
    fn wake(&self, shard: usize) {
        self.flags.lock().unwrap()[shard] = true;
        self.woken.notify_all();
    }
}

/// The reply token: the answer, kept.
struct Caller<'a>(&'a std::cell::RefCell<Vec<Receipt>>);

impl Reply for Caller<'_> {
    fn answer(self, answer: Answer<'_>) {
        let Answer::Delivered(receipt) = answer else {
            panic!("only deliveries in this model");
        };
        self.0.borrow_mut().push(receipt);
    }
}

/// How one driver's run went.
struct Run {
    answers: Vec<Receipt>,
    /// Times it blocked waiting for a wake-up.
    waits: usize,
}

/// Shard `shard`'s driver: takes `bodies`, is told its intake drained,
/// then does what `Pipeline::next` says until it says stop. `unquiet`: the
/// control's pipeline.
fn drive(
    world: &World<Wakes>,
    store: &Mutex<Tables>,
    shard: usize,
    bodies: &[String],
    unquiet: bool,
) -> Run {
    let answers = std::cell::RefCell::new(Vec::new());
    let mut pipeline = Pipeline::new(shard);
    if unquiet {
        pipeline = pipeline.stop_unquiet();
    }
    let works = bodies
        .iter()
        .map(|body| Work::Deliver(world.delivery(body), Caller(&answers)));
    pipeline.decide(&world.set, works);
    pipeline.drained();
    let mut waits = 0;
    loop {
        match pipeline.next(&world.set) {
            Next::Commit(writes) => {
                let result = store.lock().unwrap().apply_checked(writes);
                if let Some(touched) = pipeline.settle(&world.set, result) {
                    let reloaded = store.lock().unwrap().reload(&touched);
                    pipeline.reloaded(&world.set, Ok(reloaded));
                }
            }
            Next::Rejoin => pipeline.decide(&world.set, []),
            Next::Fetch(_) => panic!("the shards keep every object in memory: nothing to read"),
            Next::Wait {
                commit: false,
                wake: true,
                receive: 0,
            } => {
                waits += 1;
                world.set.outlet().wait(shard);
                pipeline.woken(&world.set);
            }
            Next::Wait { .. } => {
                panic!("a drained driver that commits itself waits only for wake-ups")
            }
            Next::Stop => break,
        }
    }
    Run {
        answers: answers.into_inner(),
        waits,
    }
}

/// e-1's first record, on card B, committed before the model's threads:
/// a plain decide, hand over and settle (no loop policy, which would count
/// this pipeline among the drivers).
fn first_record(world: &World<Wakes>, store: &Mutex<Tables>, b: &str) {
    let answers = std::cell::RefCell::new(Vec::new());
    let mut pipeline = Pipeline::new(owner(b));
    let body = event("e-1", b, 4, REVIEW_CHART);
    pipeline.decide(
        &world.set,
        [Work::Deliver(world.delivery(&body), Caller(&answers))],
    );
    let Handover::Commit(writes) = pipeline.hand_over(&world.set) else {
        panic!("e-1 writes");
    };
    store.lock().unwrap().apply(writes);
    assert!(pipeline.settle(&world.set, Ok(())).is_none());
    assert_eq!(answers.borrow()[0].decision(), Some(Decision::Applied));
}

/// Runs the model; `control` gives shard b the control's pipeline (12c).
pub fn model(control: bool) {
    let name = if control {
        "12c control: a driver stops before the others went quiet"
    } else {
        "12 shutdown: a variant pauses another shard's object while that shard waits to stop"
    };
    explore(
        name,
        Exploration::Exhaustive,
        &["b never waited", "b waited for a wake-up"],
        move |seen| {
            let b = card_on_the_other_shard(A);
            let objects = [(A, 10, QUEUED_MAP), (b.as_str(), 3, READY_CHART)];
            let world = World::durable_with(at(20), &objects, Wakes::new());
            let store = Mutex::new(Tables::new(&objects, Vec::new()));
            first_record(&world, &store, &b);
            let store = loom::sync::Arc::new(store);
            let (sa, sb) = (owner(A), owner(&b));

            let (w, s, body) = (world.clone(), store.clone(), event("e-1", A, 11, READY_MAP));
            let variant = thread::spawn(move || drive(&w, &s, sa, &[body], false));
            let (w, s) = (world.clone(), store.clone());
            let waiting = thread::spawn(move || drive(&w, &s, sb, &[], control));
            let variant = variant.join().unwrap();
            let waiting = waiting.join().unwrap();

            assert_eq!(
                variant.answers[0].decision(),
                Some(Decision::Conflict(ConflictKind::EventVariant))
            );
            assert!(waiting.answers.is_empty());
            for shard in 0..SHARDS {
                assert_eq!(
                    world.set.queued_pauses(shard),
                    0,
                    "a pause left in shard {shard}'s inbox when its driver stopped"
                );
            }
            let store = store.lock().unwrap();
            assert!(store.objects[&b].paused, "{b} ends paused in the store");
            assert!(store.objects[A].paused, "{A} ends paused in the store");
            let in_memory = world.set.read(sb, |s| s.object(&b)).unwrap();
            assert!(in_memory.paused, "{b} ends paused in shard b's memory");
            seen.saw(if waiting.waits == 0 {
                "b never waited"
            } else {
                "b waited for a wake-up"
            });
        },
    );
}

#[cfg(not(snapshot_receiver_loom_broken))]
#[test]
fn a_variant_pauses_an_object_of_a_shard_waiting_to_stop() {
    model(false);
}

#[cfg(not(snapshot_receiver_loom_broken))]
#[test]
#[should_panic(expected = "left in shard")]
fn control_a_driver_stopping_before_the_others_went_quiet_is_caught() {
    model(true);
}
