//! Model 9: a bounded registry (docs/CONTRACT.md §9) lets an event
//! identity go, and its duplicate races a new delivery of the same id on
//! another shard.
//!
//! Two shards, each keeping at most one object and one committed first
//! record in memory (`Shard::bound_identities(1)`); what a shard misses,
//! its driver reads from the model's store outside the shard's lock when
//! the shard asks (`Pipeline::take_fetch`), on a connection of its own. The
//! store holds
//! card A v11 (owned by shard a), card B v4 (owned by shard b) and the
//! receipt of e-1 (card A, `applied`, first seen at T+10), which left the
//! registry earlier: nothing is in memory at the start. Two threads, each a
//! shard's driver around the shipped `engine::Pipeline` (it commits a group
//! to the model's store itself and then settles it, so a group's first
//! records are in the store before `Shard::evict` may let them go):
//! - shard a: the duplicate of e-1 (body X, card A) in one group; while
//!   that group is in the store's hands, e-2 (A v12) and e-5 (A v13) in the
//!   next. After that group's commit, a's share of the registry holds e-1
//!   (if a read it back), e-2 (if a was first) and e-5, and the settle
//!   lets all but the newest go: that eviction races b's look-ups and
//!   claims;
//! - shard b: e-3 (B v5), a delivery of e-2 naming B, and a variant of e-1
//!   naming B, in one group. e-3 is b's alone, so b's batch read of
//!   receipts always names it, and a read of one identity alone is the
//!   re-read of a claim told `Evicted`: that is how the model tells b's
//!   paths apart. b's settle lets its oldest records go too (e-1, if b read
//!   it back), which races a's claim of the duplicate.
//!
//! In every interleaving: the duplicate is `duplicate` of `applied`; b's
//! variant of e-1 is `conflict`/`event_variant` (and card A ends paused);
//! exactly one of the two deliveries of e-2 is its first record (`applied`,
//! and on card A then e-5 is `applied`; on card B card A is paused by its
//! `conflict` and e-5 is `held`); and the store ends with exactly one
//! receipt per event identity, e-1's the original. The model's store keeps
//! every receipt it is given, without checking that its event identity is
//! new, so a second first record would be seen: what is checked is the
//! shards' own rule (stamp, look in memory and in the store, checked
//! claim), not a store's guard behind it. loom must reach b finding e-1 in
//! memory, reading it from the store, and being told `Evicted` and reading
//! it again; a finding e-1 in memory (read back by b), reading it, and
//! being told `Evicted` after its read; b's claims of e-2 and of e-3 told
//! `Evicted` (e-3 is new: another identity of its stripe left, and the
//! registry of a loom build has 4 stripes); and e-2 first on either shard.
//! Bound 4 is the shallowest at which it reaches them all.
//!
//! The must-fail control (9c) is the same scenario with
//! `Shard::evict_before_commit`: a first record is queued for eviction when
//! it is decided. At the settle of the duplicate's group, a's queue then
//! holds e-1, e-2 and e-5, and e-2 leaves memory while its group is still
//! uncommitted: a delivery of e-2 on b in that window finds it neither in
//! memory nor in the store, and records a second first record. One
//! scenario for both because the control's window (a first record decided
//! on top of a group in the store's hands) is one the shipped model must
//! cover as well: e-2 and e-5 are what make it.
//!
//! 9f is the same scenario with a ready filter of stored identities
//! (`IdentityFilter` in the registry, holding e-1 as the start-up scan of
//! the store would): a shard reads only the receipts of identities the
//! filter may hold, so the new ones (e-3, e-5, and e-2 until a's settle
//! evicts it) are decided without a read, and no read ever names e-3 or
//! e-5. The same assertions hold; loom must reach b reading e-2 back after
//! a evicted it. Its control 9g (`Registry::filter_after_evicting`) tells
//! the filter of an evicted identity only after it left memory, outside its
//! lock: b's look in that window finds e-2 neither in memory nor in the
//! filter, claims it against a stamp taken after the eviction's bump, and
//! commits a second receipt.

use super::states::{QUEUED_MAP, READY_CHART, READY_MAP, REVIEW_CHART};
use loom::sync::{Arc, Mutex};
use loom::thread;
use loom_tests::{
    at, event, explore, owner, Caller, Exploration, Outcomes, Tables, World, RETENTION,
};
use snapshot_receiver_core::engine::{Handover, Pipeline, Reply, Work};
use snapshot_receiver_core::store::{ObjectSource, StoreError};
use snapshot_receiver_core::write::{ObjectRow, ReceiptRow, Write};
use snapshot_receiver_core::{
    ConflictKind, Decision, HoldReason, IdentityFilter, Receipt, Verdict,
};
use std::cell::RefCell;
use std::time::SystemTime;

/// Card A: e-1, e-2 and e-5 name it.
const A: &str = "card-7";

/// Card B: the first `card-N` on the other shard.
fn card_b() -> String {
    loom_tests::card_on_the_other_shard(A)
}

/// The model's store, and which receipts each shard read from it.
struct Store {
    /// The tables, one loom lock for every commit and every read.
    tables: Mutex<Tables>,
    /// Each `ObjectSource::receipts` call: the shard and the identities it
    /// asked for. A std mutex outside loom's view, held for a push only.
    reads: std::sync::Mutex<Vec<(usize, Vec<String>)>>,
}

/// Shard `.0`'s connection to the model's store.
struct Source(usize, Arc<Store>);

impl ObjectSource for Source {
    fn objects(&mut self, ids: &[std::sync::Arc<str>]) -> Result<Vec<ObjectRow>, StoreError> {
        Ok(self.1.tables.lock().unwrap().objects_of(ids))
    }

    fn receipts(
        &mut self,
        event_ids: &[std::sync::Arc<str>],
        since: SystemTime,
    ) -> Result<Vec<ReceiptRow>, StoreError> {
        let ids = event_ids.iter().map(|id| id.to_string()).collect();
        self.1.reads.lock().unwrap().push((self.0, ids));
        Ok(self.1.tables.lock().unwrap().receipts_of(event_ids, since))
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
            .1
            .tables
            .lock()
            .unwrap()
            .receipt_ids(after, since, limit))
    }
}

/// Commits `writes` (the group in `pipeline`'s store's hands) to the store
/// and settles the group: the shipped `Shard::evict` runs there.
fn commit<R: Reply>(world: &World, store: &Store, pipeline: &mut Pipeline<R>, writes: Vec<Write>) {
    store.tables.lock().unwrap().apply(writes);
    assert!(
        pipeline.settle(&world.set, Ok(())).is_none(),
        "a commit reloads nothing"
    );
}

/// Shard `shard`'s driver: decides each of `groups`, each one while the
/// one before it is in the store's hands, and commits that one right after
/// (its commit is then reported before anything else is decided). Returns
/// the answers, in order.
fn drive(world: &World, store: &Arc<Store>, shard: usize, groups: &[Vec<String>]) -> Vec<Receipt> {
    let answered = RefCell::new(Vec::new());
    let mut source = Source(shard, store.clone());
    let mut pipeline = Pipeline::new(shard);
    let mut in_hand = None;
    for group in groups {
        let works = group
            .iter()
            .map(|body| Work::Deliver(world.delivery(body), Caller(&answered)));
        pipeline.decide(&world.set, works);
        world.serve_fetches(&mut pipeline, &mut source);
        if let Some(writes) = in_hand.take() {
            commit(world, store, &mut pipeline, writes);
        }
        if let Handover::Commit(writes) = pipeline.hand_over(&world.set) {
            in_hand = Some(writes);
        }
    }
    if let Some(writes) = in_hand {
        commit(world, store, &mut pipeline, writes);
    }
    answered.into_inner()
}

/// After both drivers: shard `shard` runs and commits the pauses queued
/// for it meanwhile (its driver's next round).
fn run_pauses(world: &World, store: &Arc<Store>, shard: usize) {
    let mut pipeline: Pipeline<Caller<'_>> = Pipeline::new(shard);
    pipeline.decide(&world.set, std::iter::empty());
    world.serve_fetches(&mut pipeline, &mut Source(shard, store.clone()));
    if let Handover::Commit(writes) = pipeline.hand_over(&world.set) {
        commit(world, store, &mut pipeline, writes);
    }
}

/// The message of the model's first assertion, which the control must
/// break.
const ONE_FIRST_RECORD: &str = "one first record per event identity";

/// Which rules model 9 runs with.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Rules {
    /// The shipped rules, no filter of stored identities: every identity
    /// not in memory is read.
    Shipped,
    /// 9c: first records queued for eviction when decided.
    EvictBeforeCommit,
    /// 9f: the shipped rules with a ready filter of stored identities
    /// (`IdentityFilter`, holding e-1 as the start-up scan would): new
    /// identities are not read.
    Filter,
    /// 9g: the filter, told of an evicted identity only after it left
    /// memory (`Registry::filter_after_evicting`).
    FilterAfterEvicting,
}

/// The paths loom must reach without a filter (see [`paths`]).
const READ_PATHS: [&str; 10] = [
    "a found e-1 in memory, put back by b",
    "a read e-1 from the store once",
    "a's claim of e-1 told Evicted after its read, e-1 read again",
    "b found e-1 in memory",
    "b read e-1 from the store",
    "b's claim of e-1 told Evicted, e-1 read again",
    "b's claim of e-2 told Evicted, e-2 read again",
    "b's claim of e-3 told Evicted, e-3 read again",
    "e-2 first on card A",
    "e-2 first on card B",
];

/// The paths loom must reach with a filter (see [`filtered_paths`]).
const FILTER_PATHS: [&str; 5] = [
    "b found e-1 in memory",
    "b read e-1 from the store",
    "b read e-2 from the store, evicted by a",
    "e-2 first on card A",
    "e-2 first on card B",
];

/// The model, with the shipped eviction rule or the control's.
pub fn model(rules: Rules) {
    let name = match rules {
        Rules::Shipped => {
            "9 an evicted identity's duplicate races a delivery of it on another shard"
        }
        Rules::EvictBeforeCommit => "9c control: a first record evicted before its commit",
        Rules::Filter => "9f model 9 with a filter of stored identities",
        Rules::FilterAfterEvicting => {
            "9g control: the filter told of an eviction after the record left memory"
        }
    };
    let filtered = matches!(rules, Rules::Filter | Rules::FilterAfterEvicting);
    let expected: &[&str] = if filtered { &FILTER_PATHS } else { &READ_PATHS };
    explore(
        name,
        Exploration::Preemptions(PREEMPTIONS),
        expected,
        move |seen| {
            let b = card_b();
            let (sa, sb) = (owner(A), owner(&b));
            let dup = event("e-1", A, 11, READY_MAP);
            let original = ReceiptRow {
                event_id: "e-1".into(),
                fingerprint: 0,
                object_id: A.into(),
                decision: Verdict::Applied,
                first_seen: at(10),
                retention_cutoff: None,
            };
            let store = Arc::new(Store {
                tables: Mutex::new(Tables::new(
                    &[(A, 11, READY_MAP), (b.as_str(), 4, READY_CHART)],
                    Vec::new(),
                )),
                reads: std::sync::Mutex::new(Vec::new()),
            });
            let world = World::bounded(at(20), 1, |shard| {
                shard.bound_identities(1);
                if rules == Rules::EvictBeforeCommit {
                    shard.evict_before_commit();
                }
            });
            let original = ReceiptRow {
                fingerprint: world.delivery(&dup).fingerprint().expect("an event"),
                ..original
            };
            store.tables.lock().unwrap().receipts.push(original.clone());
            if filtered {
                let registry = world.set.ctx().registry();
                let filter = std::sync::Arc::new(IdentityFilter::new(100, RETENTION, 7));
                // What the start-up scan puts in: the stored receipt.
                filter.insert("e-1", original.first_seen, at(20));
                filter.mark_ready();
                registry.track_stored(filter);
                if rules == Rules::FilterAfterEvicting {
                    registry.filter_after_evicting();
                }
            }

            let a_groups = vec![
                vec![dup],
                vec![
                    event("e-2", A, 12, QUEUED_MAP),
                    event("e-5", A, 13, READY_MAP),
                ],
            ];
            let b_groups = vec![vec![
                event("e-3", &b, 5, REVIEW_CHART),
                event("e-2", &b, 6, READY_CHART),
                event("e-1", &b, 7, READY_CHART),
            ]];
            let (w, s) = (world.clone(), store.clone());
            let on_a = thread::spawn(move || drive(&w, &s, sa, &a_groups));
            let answers_b = drive(&world, &store, sb, &b_groups);
            let answers_a = on_a.join().unwrap();
            run_pauses(&world, &store, sa);
            run_pauses(&world, &store, sb);

            let tables = store.tables.lock().unwrap();
            for id in ["e-1", "e-2", "e-3", "e-5"] {
                let rows = tables.receipts_for(id);
                assert_eq!(
                    rows.len(),
                    1,
                    "{ONE_FIRST_RECORD}: {id} has {} receipts committed: {rows:?}",
                    rows.len()
                );
            }
            assert_eq!(
                tables.receipts_for("e-1"),
                [&original],
                "e-1's first record is the original"
            );
            for id in ["e-1", "e-2"] {
                let variants = tables.variants.iter().filter(|v| &*v.event_id == id);
                assert_eq!(variants.count(), 1, "one variant of {id} committed");
            }
            let decided = |answers: &[Receipt], id: &str| {
                let found: Vec<Option<Decision>> = answers
                    .iter()
                    .filter(|r| r.event_id.as_deref() == Some(id))
                    .map(Receipt::decision)
                    .collect();
                assert_eq!(found.len(), 1, "{id} answered once: {found:?}");
                found[0]
            };
            let variant = Some(Decision::Conflict(ConflictKind::EventVariant));
            assert_eq!(
                decided(&answers_a, "e-1"),
                Some(Decision::Duplicate {
                    original: Verdict::Applied
                }),
                "the duplicate of e-1 on card A"
            );
            assert_eq!(decided(&answers_b, "e-1"), variant, "e-1 naming card B");
            assert_eq!(decided(&answers_b, "e-3"), Some(Decision::Applied));
            let e2 = tables.receipts_for("e-2")[0];
            let (e2_on_a, e2_on_b) = (decided(&answers_a, "e-2"), decided(&answers_b, "e-2"));
            let stored = |id: &str| tables.objects.get(id).map(|r| (r.version, r.paused));
            if *e2.object_id == *A {
                seen.saw("e-2 first on card A");
                assert_eq!((e2_on_a, e2_on_b), (Some(Decision::Applied), variant));
                assert_eq!(decided(&answers_a, "e-5"), Some(Decision::Applied));
                // Both paused by b's variants: B as their object, A as
                // the first records'.
                assert_eq!((stored(A), stored(&b)), (Some((13, true)), Some((5, true))));
            } else {
                seen.saw("e-2 first on card B");
                assert_eq!((e2_on_a, e2_on_b), (variant, Some(Decision::Applied)));
                assert_eq!(
                    decided(&answers_a, "e-5"),
                    Some(Decision::Held(HoldReason::Paused))
                );
                // A paused by its variant of e-2 (and by e-1's on B), B by
                // its variant of e-1.
                assert_eq!((stored(A), stored(&b)), (Some((11, true)), Some((6, true))));
            }

            drop(tables);
            if filtered {
                filtered_paths(seen, &store, sb);
            } else {
                paths(seen, &store, sa, sb);
            }
        },
    );
}

/// Records which paths the interleaving took, from the receipts each shard
/// read. A shard's batch reads the receipts of its deliveries' identities
/// that are not in memory, once each; any other read is the re-read of one
/// identity whose claim was told `Evicted`. b's batch read always names
/// e-3, which nobody else delivers, so it is b's first; a reads e-1 in its
/// first batch or not at all, so a second read of e-1 is a re-read.
fn paths(seen: &Outcomes, store: &Store, sa: usize, sb: usize) {
    let reads = store.reads.lock().unwrap();
    let of = |shard: usize| -> Vec<&Vec<String>> {
        reads
            .iter()
            .filter(|(s, _)| *s == shard)
            .map(|(_, ids)| ids)
            .collect()
    };
    let names = |ids: &Vec<String>, id: &str| ids.iter().any(|i| i == id);
    let (of_a, of_b) = (of(sa), of(sb));
    assert!(
        names(of_b[0], "e-3"),
        "b's batch read comes first: {of_b:?}"
    );
    let reread = |id: &str| of_b[1..].iter().any(|ids| **ids == [id.to_owned()]);
    seen.saw(if reread("e-1") {
        "b's claim of e-1 told Evicted, e-1 read again"
    } else if names(of_b[0], "e-1") {
        "b read e-1 from the store"
    } else {
        "b found e-1 in memory"
    });
    if reread("e-2") {
        seen.saw("b's claim of e-2 told Evicted, e-2 read again");
    }
    if reread("e-3") {
        // e-3 is new: another identity of its stripe left meanwhile.
        seen.saw("b's claim of e-3 told Evicted, e-3 read again");
    }
    seen.saw(match of_a.iter().filter(|ids| names(ids, "e-1")).count() {
        0 => "a found e-1 in memory, put back by b",
        1 => "a read e-1 from the store once",
        _ => "a's claim of e-1 told Evicted after its read, e-1 read again",
    });
}

/// Records which paths the interleaving took with a filter of stored
/// identities, and checks that it spared every read of a new identity: e-3
/// and e-5 are new (no shard evicts them before their only delivery), so
/// no read ever names them, even after a claim told `Evicted`.
fn filtered_paths(seen: &Outcomes, store: &Store, sb: usize) {
    let reads = store.reads.lock().unwrap();
    for id in ["e-3", "e-5"] {
        assert!(
            !reads.iter().any(|(_, ids)| ids.iter().any(|i| i == id)),
            "the filter spares the read of the new identity {id}: {reads:?}"
        );
    }
    let read_by_b = |id: &str| {
        reads
            .iter()
            .any(|(s, ids)| *s == sb && ids.iter().any(|i| i == id))
    };
    seen.saw(if read_by_b("e-1") {
        "b read e-1 from the store"
    } else {
        "b found e-1 in memory"
    });
    if read_by_b("e-2") {
        seen.saw("b read e-2 from the store, evicted by a");
    }
}

/// The preemption bound: the shallowest at which loom reaches every path
/// above (at 3 it never has a's claim of e-1 told `Evicted` after a's own
/// read: b must read it, a read it, b evict it and a claim, in that order).
/// 35,537 interleavings, seconds; 191,440 at 5.
const PREEMPTIONS: usize = 4;

#[cfg(not(snapshot_receiver_loom_broken))]
#[test]
fn evicted_duplicate_races_a_delivery_on_another_shard() {
    model(Rules::Shipped);
}

#[cfg(not(snapshot_receiver_loom_broken))]
#[test]
#[should_panic(expected = "one first record per event identity")]
fn control_identity_evicted_before_its_commit_is_caught() {
    model(Rules::EvictBeforeCommit);
}

#[cfg(not(snapshot_receiver_loom_broken))]
#[test]
fn evicted_duplicate_races_a_delivery_on_another_shard_with_a_filter() {
    model(Rules::Filter);
}

#[cfg(not(snapshot_receiver_loom_broken))]
#[test]
#[should_panic(expected = "one first record per event identity")]
fn control_filter_told_after_the_eviction_is_caught() {
    model(Rules::FilterAfterEvicting);
}
