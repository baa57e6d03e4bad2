//! Model 8: a bounded working set (docs/CONTRACT.md §9) lets an object go
//! while a later delivery for it waits, and that delivery reads it back
//! from the store.
//!
//! One shard keeps at most one object in memory; the store holds card A at
//! version 10 and card B at version 4, neither in memory at the start.
//! Three threads: the shard's driver (the durable shard task's loop around
//! the shipped `engine::Pipeline`, as in model 7), the committer (commits
//! every group it is handed) and a producer that sends, in order, e-3
//! (A v12), e-2 (B v5) and e-4 (A v12 again under another event id, the
//! same state) while e-1 (A v11) is in the committer's hands. What the
//! shard misses, it asks for (`Pipeline::take_fetch`); the driver reads it
//! from the model's store outside the shard's lock (an interleaving point:
//! a commit may land between the ask and the read) and hands the rows
//! back. Objects are evicted by the shipped `Shard::evict` after each
//! commit.
//!
//! Every interleaving must decide e-4 `equal`: whether card A stayed in
//! memory (it had writes not committed yet, or was used more recently than
//! B) or was read back from the store after its last write committed. The
//! model's store applies rows without checking their conditions, so what is
//! checked is the shard's own rule, not the store's guard behind it.
//!
//! The must-fail control (8c) lets `Shard::evict` drop objects with writes
//! not yet committed: loom finds the interleaving in which card A leaves
//! memory while e-3's v12 is still in the committer's hands, e-4 reads the
//! stored v11 back and is decided `applied` instead of `equal`.

use super::states::{QUEUED_MAP, READY_CHART, READY_MAP, REVIEW_CHART};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;
use loom_tests::{
    at, event, explore, owner, take_when_put, Caller, Exploration, Outcomes, Tables, World,
};
use snapshot_receiver_core::engine::{Handover, Pipeline, Work};
use snapshot_receiver_core::store::{ObjectSource, StoreError};
use snapshot_receiver_core::write::{ObjectRow, ReceiptRow, Write};
use snapshot_receiver_core::{Decision, Receipt, Shard};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::time::SystemTime;

/// Card A: e-1, e-3 and e-4 name it.
const A: &str = "card-7";

/// Card B: another card on card A's shard (the first such `card-N`).
fn card_b() -> String {
    (8..)
        .map(|n| format!("card-{n}"))
        .find(|id| owner(id) == owner(A))
        .expect("some card shares card-7's shard")
}

/// What reaches the driver: deliveries and the committer's answers.
#[derive(Default)]
struct Inbox {
    /// Bodies sent by the producer, in order.
    deliveries: VecDeque<String>,
    /// The group in flight is committed.
    committed: bool,
}

/// The channels between the three threads, and the store's tables.
struct Pipes {
    inbox: Mutex<Inbox>,
    inbox_ready: Condvar,
    /// The group handed to the committer; `Some(None)` stops it.
    group: Mutex<Option<Option<Vec<Write>>>>,
    group_ready: Condvar,
    /// The store: what the committer committed.
    store: Mutex<Tables>,
}

impl Pipes {
    fn new(b: &str) -> Self {
        let objects = [(A, 10, QUEUED_MAP), (b, 4, READY_CHART)];
        Self {
            inbox: Mutex::new(Inbox::default()),
            inbox_ready: Condvar::new(),
            group: Mutex::new(None),
            group_ready: Condvar::new(),
            store: Mutex::new(Tables::new(&objects, Vec::new())),
        }
    }

    /// The committer: commits every group until told to stop.
    fn committer(&self) {
        loop {
            let Some(writes) = take_when_put(&self.group, &self.group_ready) else {
                return;
            };
            self.store.lock().unwrap().apply(writes);
            self.inbox.lock().unwrap().committed = true;
            self.inbox_ready.notify_one();
        }
    }

    fn send(&self, group: Option<Vec<Write>>) {
        *self.group.lock().unwrap() = Some(group);
        self.group_ready.notify_one();
    }
}

/// The shard's connection to the model's store.
struct Source(Arc<Pipes>);

impl ObjectSource for Source {
    fn objects(&mut self, ids: &[std::sync::Arc<str>]) -> Result<Vec<ObjectRow>, StoreError> {
        Ok(self.0.store.lock().unwrap().objects_of(ids))
    }

    /// Not called (this model does not bound event identities); answers
    /// from the receipts the committer committed all the same.
    fn receipts(
        &mut self,
        event_ids: &[std::sync::Arc<str>],
        since: SystemTime,
    ) -> Result<Vec<ReceiptRow>, StoreError> {
        Ok(self.0.store.lock().unwrap().receipts_of(event_ids, since))
    }

    /// Not called (the model builds its filter itself, as the start-up
    /// scan would); answers from the committed receipts all the same.
    fn receipt_ids(
        &mut self,
        after: &str,
        since: SystemTime,
        limit: usize,
    ) -> Result<Vec<(std::sync::Arc<str>, SystemTime)>, StoreError> {
        Ok(self
            .0
            .store
            .lock()
            .unwrap()
            .receipt_ids(after, since, limit))
    }
}

/// The driver: the durable shard task's loop around the shipped
/// [`Pipeline`], until the four deliveries are answered.
fn drive(world: &World, pipes: &Arc<Pipes>, seen: &Outcomes, first: &str) -> Vec<Receipt> {
    let set = &*world.set;
    let shard = owner(A);
    let answered = RefCell::new(Vec::new());
    let work = |body: &str| {
        let delivery = world.delivery(body);
        Work::Deliver(delivery, Caller(&answered))
    };
    let loaded = || world.read(shard, |s: &Shard| s.working_set().expect("bounded").loaded);
    let mut source = Source(pipes.clone());
    let mut pipeline = Pipeline::new(shard);
    pipeline.decide(set, [work(first)]);
    world.serve_fetches(&mut pipeline, &mut source);
    while answered.borrow().len() < 4 {
        if let Handover::Commit(writes) = pipeline.hand_over(set) {
            pipes.send(Some(writes));
        }
        let mut inbox = pipes.inbox.lock().unwrap();
        while !inbox.committed && inbox.deliveries.is_empty() {
            inbox = pipes.inbox_ready.wait(inbox).unwrap();
        }
        // The commit first, as the task's biased select takes it.
        if std::mem::take(&mut inbox.committed) {
            drop(inbox);
            assert!(
                pipeline.settle(set, Ok(())).is_none(),
                "a commit reloads nothing"
            );
            continue;
        }
        let body = inbox.deliveries.pop_front().expect("a delivery");
        drop(inbox);
        let before = loaded();
        pipeline.decide(set, [work(&body)]);
        world.serve_fetches(&mut pipeline, &mut source);
        if body.contains("\"e-4\"") {
            seen.saw(if loaded() > before {
                "e-4 decided with card A read back from the store"
            } else {
                "e-4 decided with card A still in memory"
            });
        }
    }
    pipes.send(None);
    answered.into_inner()
}

/// The model, with the shipped eviction rule or the control's.
pub fn model(evict_before_commit: bool) {
    let name = if evict_before_commit {
        "8c control: an object evicted before its writes are committed"
    } else {
        "8 an object evicted while a later delivery for it waits"
    };
    explore(
        name,
        // Three threads with condvars and four deliveries: bound 3 keeps the
        // run to seconds; the control is caught at it.
        Exploration::Preemptions(3),
        &[
            "e-4 decided with card A read back from the store",
            "e-4 decided with card A still in memory",
        ],
        move |seen| {
            let b = card_b();
            let pipes = Arc::new(Pipes::new(&b));
            let world = World::bounded(at(20), 1, |shard| {
                if evict_before_commit {
                    shard.evict_before_commit();
                }
            });
            let p = pipes.clone();
            let committer = thread::spawn(move || p.committer());
            let later = [
                event("e-3", A, 12, READY_MAP),
                event("e-2", &b, 5, REVIEW_CHART),
                event("e-4", A, 12, READY_MAP),
            ];
            let p = pipes.clone();
            let producer = thread::spawn(move || {
                for body in later {
                    p.inbox.lock().unwrap().deliveries.push_back(body);
                    p.inbox_ready.notify_one();
                }
            });
            let answers = drive(&world, &pipes, seen, &event("e-1", A, 11, READY_MAP));
            producer.join().unwrap();
            committer.join().unwrap();

            let decisions: Vec<(String, Option<Decision>)> = answers
                .iter()
                .map(|r| (r.event_id.as_deref().unwrap_or("").to_owned(), r.decision()))
                .collect();
            let of = |id: &str| decisions.iter().find(|(e, _)| e == id).map(|(_, d)| *d);
            assert_eq!(
                of("e-4"),
                Some(Some(Decision::Equal)),
                "e-4 decided on a stale copy of card A: {decisions:?}"
            );
            for id in ["e-1", "e-3", "e-2"] {
                assert_eq!(of(id), Some(Some(Decision::Applied)), "{id}: {decisions:?}");
            }
            let store = pipes.store.lock().unwrap();
            let stored = |id: &str| store.objects.get(id).map(|r| (r.version, r.state.clone()));
            assert_eq!(stored(A), Some((12, READY_MAP.to_owned())));
            assert_eq!(stored(&b), Some((5, REVIEW_CHART.to_owned())));
        },
    );
}

#[cfg(not(snapshot_receiver_loom_broken))]
#[test]
fn object_evicted_while_a_later_delivery_waits() {
    model(false);
}

#[cfg(not(snapshot_receiver_loom_broken))]
#[test]
#[should_panic(expected = "e-4 decided on a stale copy of card A")]
fn control_eviction_before_the_commit_is_caught() {
    model(true);
}
