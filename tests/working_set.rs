//! Decisions never depend on the working set (docs/CONTRACT.md §9): the same
//! stream gives the same receipts, the same stored audit trail and the same
//! objects with a working set of one object and an identity cache of one
//! identity as with every object and identity in memory, on SQLite and on
//! PostgreSQL, with small batches (so objects and receipts leave memory and
//! are read back between almost every pair of deliveries), and after a
//! restart at a seeded point (which loads no receipt at all).
//!
//! Streams: the fixture bank, both fuzz corpora and a seeded generated
//! stream with duplicates, variants that pause objects, holds and unknown
//! objects. The in-memory receiver has no working set (every object stays,
//! as before); `backends_agree` compares it with both stores.

use crate::backends_agree::{
    corpus_objects, corpus_setups, fixture_setups, run_with, Backend, Run, RunOptions, Setup,
};
use crate::durability::pg_url;
use crate::serve::envelope;
use snapshot_receiver::Limits;

/// Waits until the filter of stored identities of `rx` has finished its
/// start-up scan (at most 20 s), so that a run's reads do not depend on
/// when the scan's thread got its turn; a receiver without a filter
/// returns at once.
pub(crate) async fn filter_ready(rx: &snapshot_receiver::Receiver) {
    for _ in 0..400 {
        match rx.memory().await.and_then(|m| m.identity_filter) {
            Some(f) if !f.ready => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            _ => return,
        }
    }
    panic!("the identity filter's scan did not finish within 20 s");
}

/// A restart point for `setup`: seeded by its name, inside its stream.
fn restart_point(setup: &Setup) -> usize {
    let seed = setup.name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    1 + (seed % setup.bodies.len().max(2) as u64) as usize
}

/// Compares `other` with `reference` line by line, naming the first line
/// that differs with its body.
fn same(setup: &Setup, what: &str, reference: &Run, other: &Run, audit: bool) {
    assert_eq!(other.receipts.len(), setup.bodies.len(), "{}", setup.name);
    for (i, (r, o)) in reference.receipts.iter().zip(&other.receipts).enumerate() {
        assert_eq!(
            r,
            o,
            "{}: body {i} ({:?}), {what}",
            setup.name,
            String::from_utf8_lossy(&setup.bodies[i].0)
        );
    }
    assert_eq!(
        reference.objects, other.objects,
        "{}: objects, {what}",
        setup.name
    );
    // The shard's own rule found every evicted receipt: the store's guard
    // against a second first record (a conflict) was never needed.
    assert_eq!(other.conflicts, 0, "{}: conflicts, {what}", setup.name);
    if audit {
        for (i, (r, o)) in reference.audit.iter().zip(&other.audit).enumerate() {
            assert_eq!(r, o, "{}: audit row {i}, {what}", setup.name);
        }
        assert_eq!(
            reference.audit[other.audit.len().min(reference.audit.len())..],
            other.audit[other.audit.len().min(reference.audit.len())..],
            "{}: audit rows after the common ones, {what}",
            setup.name
        );
    }
}

/// Runs `setup` on each store with every object in memory, then with a
/// working set of one, then with a working set of one and a
/// restart; each must match the first run on the same store. Returns the
/// bodies decided and how many reads of new identities the filter of
/// stored identities spared in the bounded runs without a restart.
async fn independent_of_the_working_set(setup: &Setup) -> (usize, u64) {
    let mut spared = 0;
    let url = pg_url();
    let mut backends = crate::backends_agree::embedded_backends();
    if url.is_some() {
        backends.push(Backend::Postgres);
    }
    for backend in backends {
        let pg = url.as_deref();
        // The same batches in every run: when a variant pauses another
        // object, the deliveries decided with it in one group still see
        // the object unpaused, so batching is part of the stream.
        let all = RunOptions {
            batch: 3,
            ..RunOptions::default()
        };
        let reference = run_with(setup, backend, pg, "ws_all", all).await;
        let one = RunOptions {
            working_set: 1,
            identity_cache: 1,
            ..all
        };
        let bounded = run_with(setup, backend, pg, "ws_one", one).await;
        // One shard, one identity: after the last commit at most the one
        // record its queue keeps is in memory.
        assert!(
            bounded.identities <= 1,
            "{}: {} identities in memory with a cache of one",
            setup.name,
            bounded.identities
        );
        spared += bounded.spared;
        same(
            setup,
            &format!("working set 1 on {backend:?}"),
            &reference,
            &bounded,
            true,
        );
        // Restarted at a point of its own, and once after the first event
        // held on an object that is not paused.
        let restart = RunOptions {
            restart_after: Some(restart_point(setup)),
            restart_on_hold: true,
            ..one
        };
        let restarted = run_with(setup, backend, pg, "ws_restart", restart).await;
        // A restart numbers the held events it resumes anew; every other
        // field of every audit row is the same.
        same(
            setup,
            &format!("working set 1 and a restart on {backend:?}"),
            &reference,
            &restarted,
            true,
        );
    }
    (setup.bodies.len(), spared)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fixture_is_decided_the_same_with_a_working_set_of_one_object() {
    let (mut decided, mut spared) = (0, 0);
    let setups = fixture_setups();
    for setup in &setups {
        let (bodies, filtered) = independent_of_the_working_set(setup).await;
        decided += bodies;
        spared += filtered;
    }
    assert_eq!((setups.len(), decided), (14, 79));
    // The filter of stored identities was ready and spared the reads of
    // new identities (random hash keys: how many varies a little).
    assert!(spared > 0, "no read spared by the identity filter");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_fuzz_corpora_are_decided_the_same_with_a_working_set_of_one_object() {
    for setup in corpus_setups() {
        let (decided, spared) = independent_of_the_working_set(&setup).await;
        assert_eq!(decided, setup.bodies.len());
        assert!(spared > 0, "{}: no read spared", setup.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_load_stream_is_decided_the_same_with_a_working_set_of_one_object() {
    let generated = crate::common::stream_gen::generate(1_500, 22, "2099-01-01T00:00:00Z");
    let mut objects = corpus_objects();
    objects.extend((0..generated.objects).map(|o| (format!("obj-{o}"), 0, "{}".to_owned())));
    objects.sort();
    objects.dedup_by(|a, b| a.0 == b.0);
    let setup = Setup {
        name: "seeded stream".to_owned(),
        objects,
        limits: Limits::default(),
        profile: None,
        bodies: generated
            .bodies
            .iter()
            .map(|b| (b.as_bytes().to_vec(), None))
            .collect(),
    };
    let (decided, spared) = independent_of_the_working_set(&setup).await;
    assert_eq!(decided, setup.bodies.len());
    assert!(spared > 0, "no read spared by the identity filter");
}

/// The bounds as `Receiver::memory` reports them, step by step: one shard,
/// two objects and two identities kept, four cards seeded in the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_reports_the_bounds_and_what_was_read_back_and_evicted() {
    use snapshot_receiver::core::FilterStats;
    use snapshot_receiver::{
        Decision, MemoryStats, Outcome, Receiver, Verdict, DEFAULT_IDENTITY_FILTER,
    };
    // Two Bloom filters, each for 10,000,000 identities at 1 % false
    // positives: 24 MB.
    const FILTER_BYTES: usize = 23_962_656;
    let path = crate::store::temp_db("memory-stats");
    let build = || {
        let mut b = Receiver::builder()
            .shards(1)
            .working_set(2)
            .identity_cache(2)
            .store(&format!("sqlite:{}", path.display()));
        for n in 1..=4 {
            b = b.object(&format!("card-{n}"), 0, "{}");
        }
        b.build().unwrap()
    };
    let filter = |ready, inserted| FilterStats {
        capacity: DEFAULT_IDENTITY_FILTER,
        bytes: FILTER_BYTES,
        ready,
        inserted,
    };
    let body = |n: u32| envelope(&format!("e-{n}"), &format!("card-{n}"), 1, &format!("{n}"));
    let duplicate = Outcome::Decided(Decision::Duplicate {
        original: Verdict::Applied,
    });
    let rx = build();
    filter_ready(&rx).await;
    for n in 1..=4 {
        let r = rx.deliver(body(n).as_bytes()).await;
        assert_eq!(r.outcome, Outcome::Decided(Decision::Applied), "e-{n}");
    }
    // Each card was read from the store; card-1, card-2 and e-1, e-2 left.
    let after_four = MemoryStats {
        objects_capacity: 2,
        objects_resident: 2,
        objects_loaded: 4,
        objects_evicted: 2,
        identities_capacity: 2,
        identities_resident: 2,
        identities_loaded: 0,
        // The store was empty at start: the filter rules every new one out.
        identity_reads: 0,
        identities_spared: 4,
        identities_evicted: 2,
        identity_filter: Some(filter(true, 2)),
    };
    assert_eq!(rx.memory().await, Some(after_four));
    // e-1 again: its receipt and card-1 are read back; e-3 and card-3 leave.
    let r = rx.deliver(body(1).as_bytes()).await;
    assert_eq!(r.outcome, duplicate);
    let after_duplicate = MemoryStats {
        objects_loaded: 5,
        objects_evicted: 3,
        identities_loaded: 1,
        // e-1 is in the filter since it was evicted: its receipt is read.
        identity_reads: 1,
        identities_evicted: 3,
        identity_filter: Some(filter(true, 3)),
        ..after_four
    };
    assert_eq!(rx.memory().await, Some(after_duplicate));
    rx.shutdown().await;
    // Restarted: nothing resident, nothing loaded at start-up; the filter's
    // scan put the four stored receipts in.
    let rx = build();
    filter_ready(&rx).await;
    let restarted = MemoryStats {
        objects_resident: 0,
        objects_loaded: 0,
        objects_evicted: 0,
        identities_resident: 0,
        identities_loaded: 0,
        identity_reads: 0,
        identities_spared: 0,
        identities_evicted: 0,
        identity_filter: Some(filter(true, 4)),
        ..after_four
    };
    assert_eq!(rx.memory().await, Some(restarted));
    // e-2 was never evicted by this process: only the scan knows it, and
    // its duplicate reads the receipt. e-5 (card-1 at version 2) is new.
    let r = rx.deliver(body(2).as_bytes()).await;
    assert_eq!(r.outcome, duplicate);
    let r = rx
        .deliver(envelope("e-5", "card-1", 2, "5").as_bytes())
        .await;
    assert_eq!(r.outcome, Outcome::Decided(Decision::Applied));
    let memory = rx.memory().await.unwrap();
    assert_eq!(
        (
            memory.identity_reads,
            memory.identities_loaded,
            memory.identities_spared
        ),
        (1, 1, 1)
    );
    assert_eq!(rx.store_stats().map(|s| s.conflicts), Some(0));
    rx.shutdown().await;
    // The in-memory receiver has no bound to report.
    let memory = Receiver::builder().build().unwrap();
    assert_eq!(memory.memory().await, None);
    memory.shutdown().await;
}

/// Without an identity filter every shard still gets its store reader and
/// its bounds (a build once gave the filter's reader to nobody and took
/// the last shard's instead, which then took its seeded objects for
/// unknown ones); a filter over the maximum is refused at build, the
/// maximum itself is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_identity_filter_every_shard_reads_the_store() {
    use snapshot_receiver::{BuildError, Decision, Outcome, Receiver, MAX_IDENTITY_FILTER};
    let path = crate::store::temp_db("no-filter");
    let mut builder = Receiver::builder()
        .shards(4)
        .working_set(8)
        .identity_cache(8)
        .identity_filter(0)
        .store(&format!("sqlite:{}", path.display()));
    for n in 0..40 {
        builder = builder.object(&format!("card-{n}"), 1, "{}");
    }
    let rx = builder.build().unwrap();
    for n in 0..40 {
        let body = envelope(&format!("e-{n}"), &format!("card-{n}"), 2, "{}");
        let r = rx.deliver(body.as_bytes()).await;
        assert_eq!(r.outcome, Outcome::Decided(Decision::Applied), "card-{n}");
    }
    let memory = rx.memory().await.unwrap();
    assert_eq!(
        (
            memory.objects_capacity,
            memory.identities_capacity,
            memory.objects_loaded,
            memory.identity_filter
        ),
        (8, 8, 40, None)
    );
    rx.shutdown().await;
    let refused = Receiver::builder()
        .identity_filter(MAX_IDENTITY_FILTER + 1)
        .build()
        .map(|_| ())
        .unwrap_err();
    assert_eq!(
        refused.to_string(),
        "invalid configuration: identity_filter must be at most 1,000,000,000 identities (about 2.4 GB)"
    );
    assert!(matches!(refused, BuildError::InvalidConfig(_)));
    // The maximum itself is taken (in memory a receiver keeps no filter,
    // so none of that size is allocated here).
    Receiver::builder()
        .identity_filter(MAX_IDENTITY_FILTER)
        .build()
        .unwrap()
        .shutdown()
        .await;
}

/// The start-up scan of the filter of stored identities reads every page of
/// the store's receipts (10,000 identities a page), not only the first:
/// 10,050 receipts, a restart, and the duplicate of the last identity in
/// text order (on the second page) reads its receipt instead of being
/// taken for a new identity that only the store's unique receipts refuse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_identity_filters_scan_reads_every_page_of_stored_receipts() {
    use snapshot_receiver::{Decision, Outcome, Receiver, Verdict};
    const RECEIPTS: u64 = 10_050;
    let path = crate::store::temp_db("scan-pages");
    let build = || {
        Receiver::builder()
            .shards(1)
            .working_set(4)
            .identity_cache(4)
            .store(&format!("sqlite:{}", path.display()))
            .object("card-1", 0, "{}")
            .build()
            .unwrap()
    };
    let rx = build();
    let bodies: Vec<String> = (0..RECEIPTS)
        .map(|n| envelope(&format!("e-{n:05}"), "card-1", n + 1, &format!("{n}")))
        .collect();
    for chunk in bodies.chunks(256) {
        let batch: Vec<&[u8]> = chunk.iter().map(|b| b.as_bytes()).collect();
        for r in rx.deliver_batch(&batch).await {
            assert_eq!(r.outcome, Outcome::Decided(Decision::Applied));
        }
    }
    rx.shutdown().await;
    let rx = build();
    filter_ready(&rx).await;
    let filter = rx.memory().await.unwrap().identity_filter.unwrap();
    assert_eq!((filter.ready, filter.inserted), (true, RECEIPTS));
    let last = bodies.last().unwrap();
    assert_eq!(
        rx.deliver(last.as_bytes()).await.outcome,
        Outcome::Decided(Decision::Duplicate {
            original: Verdict::Applied
        })
    );
    let memory = rx.memory().await.unwrap();
    assert_eq!(
        (
            memory.identity_reads,
            memory.identities_loaded,
            memory.identities_spared
        ),
        (1, 1, 0)
    );
    assert_eq!(rx.store_stats().map(|s| s.conflicts), Some(0));
    rx.shutdown().await;
}

/// Each shard's share of the bounds is rounded up (3 shards: 4 objects
/// and 5 identities give 2 each), and a bound of 0 counts as 1 a shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_shards_share_of_the_bounds_is_rounded_up() {
    use snapshot_receiver::Receiver;
    for (objects, identities, expected) in [(4, 5, (6, 6)), (0, 0, (3, 3)), (6, 3, (6, 3))] {
        let path = crate::store::temp_db(&format!("bounds-{objects}-{identities}"));
        let rx = Receiver::builder()
            .shards(3)
            .working_set(objects)
            .identity_cache(identities)
            .store(&format!("sqlite:{}", path.display()))
            .build()
            .unwrap();
        let memory = rx.memory().await.unwrap();
        assert_eq!(
            (memory.objects_capacity, memory.identities_capacity),
            expected,
            "working set {objects}, identity cache {identities} over 3 shards"
        );
        rx.shutdown().await;
    }
}

/// An object given twice to the builder keeps its last value, in memory
/// and on a durable store alike (the store is seeded with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_given_twice_keeps_its_last_value_in_memory_and_on_a_store() {
    use snapshot_receiver::Receiver;
    let path = crate::store::temp_db("object-twice");
    let sqlite = format!("sqlite:{}", path.display());
    for location in ["memory", sqlite.as_str()] {
        let rx = Receiver::builder()
            .object("card-2", 1, r#"{"n":0}"#)
            .object("card-1", 1, r#"{"n":1}"#)
            .object("card-1", 2, r#"{"n":2}"#)
            .store(location)
            .build()
            .unwrap();
        let card = rx.object("card-1").await.unwrap();
        assert_eq!(
            (card.version, card.state.compact()),
            (2, r#"{"n":2}"#.to_owned()),
            "{location}"
        );
        assert_eq!(rx.object("card-2").await.unwrap().version, 1, "{location}");
        rx.shutdown().await;
    }
}
