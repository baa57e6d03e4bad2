//! The working set's and the identity cache's rules (module docs of
//! `working.rs`), each on a bounded shard driven as the core's `Pipeline`
//! drives one (the batch's objects and receipts read first, each delivery
//! decided, the batch ended, its writes committed, then eviction), over a
//! store of rows kept here that counts what is read from it.

use crate::engine::budget::{IDENTITY_OVERHEAD, OBJECT_OVERHEAD};
use crate::engine::{AuthoritativeSnapshot, Config, Context, Fetch, MemoryBudget, Outcome, Shard};
use crate::envelope::Delivery;
use crate::store::{ObjectSource, StoreError};
use crate::write::{HeldBody, HeldKey, ObjectRow, ReceiptRow, Reloaded, Write};
use crate::{Decision, HoldReason, IdentityFilter, ManualClock, Verdict};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The clock of these tests: 100 days after the Unix epoch (the events
/// occurred in 2099, never before the retention window).
fn t() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(100 * 24 * 3600)
}

/// A `card.snapshot` body whose state is `{"v":version}`.
fn body(event_id: &str, object_id: &str, version: u64) -> String {
    format!(
        concat!(
            r#"{{"event_id":"{}","object_id":"{}","object_version":{},"#,
            r#""occurred_at":"2099-01-01T00:00:00Z","type":"card.snapshot","state":{{"v":{}}}}}"#
        ),
        event_id, object_id, version, version
    )
}

/// What the store holds and what was asked of it.
#[derive(Default)]
struct Rows {
    objects: BTreeMap<Arc<str>, ObjectRow>,
    /// The first receipt committed for each identity (a second one is
    /// refused by a real store; here it is left out).
    receipts: BTreeMap<Arc<str>, ReceiptRow>,
    /// The ids of each object read, in the order asked.
    object_reads: Vec<Vec<String>>,
    /// The identities of each receipt read, failed ones included.
    receipt_reads: Vec<Vec<String>>,
    /// How many receipt reads fail from now on.
    failing_receipt_reads: usize,
    /// How many object reads fail from now on.
    failing_object_reads: usize,
    /// The bodies of the held rows committed, by key.
    held: BTreeMap<(u64, u64), Arc<[u8]>>,
    /// The keys of each read of held bodies.
    held_reads: Vec<Vec<HeldKey>>,
}

/// The store of a test: every connection to it (each shard's source) is a
/// clone.
#[derive(Clone, Default)]
struct Db(Arc<Mutex<Rows>>);

impl Db {
    fn rows(&self) -> MutexGuard<'_, Rows> {
        self.0.lock().unwrap()
    }

    /// Objects `(id, version)` at state `{"v":version}`, not paused.
    fn with_objects(objects: &[(&str, u64)]) -> Db {
        let db = Db::default();
        for &(id, version) in objects {
            db.rows().objects.insert(
                Arc::from(id),
                ObjectRow {
                    object_id: Arc::from(id),
                    version,
                    state: format!(r#"{{"v":{version}}}"#),
                    paused: false,
                },
            );
        }
        db
    }

    /// Applies a committed group's object rows, pauses and receipts.
    fn apply(&self, writes: Vec<Write>) {
        let mut rows = self.rows();
        for write in writes {
            match write {
                Write::Object { row, .. } => {
                    rows.objects.insert(row.object_id.clone(), row);
                }
                Write::Seed(row) => {
                    rows.objects.entry(row.object_id.clone()).or_insert(row);
                }
                Write::Pause { object_id } => {
                    if let Some(row) = rows.objects.get_mut(&object_id) {
                        row.paused = true;
                    }
                }
                Write::Receipt(row) => {
                    rows.receipts.entry(row.event_id.clone()).or_insert(row);
                }
                Write::Held(row) => {
                    rows.held.insert((row.key.origin, row.key.seq), row.body);
                }
                _ => {}
            }
        }
    }

    /// The objects named by each read so far.
    fn object_reads(&self) -> Vec<Vec<String>> {
        self.rows().object_reads.clone()
    }

    /// The identities named by each receipt read so far.
    fn receipt_reads(&self) -> Vec<Vec<String>> {
        self.rows().receipt_reads.clone()
    }
}

fn names(ids: &[Arc<str>]) -> Vec<String> {
    ids.iter().map(|id| id.to_string()).collect()
}

impl ObjectSource for Db {
    fn held_bodies(&mut self, keys: &[HeldKey]) -> Result<Vec<HeldBody>, StoreError> {
        let mut rows = self.rows();
        rows.held_reads.push(keys.to_vec());
        Ok(keys
            .iter()
            .filter_map(|k| rows.held.get(&(k.origin, k.seq)).map(|b| (*k, b.clone())))
            .collect())
    }

    fn objects(&mut self, ids: &[Arc<str>]) -> Result<Vec<ObjectRow>, StoreError> {
        let mut rows = self.rows();
        rows.object_reads.push(names(ids));
        if rows.failing_object_reads > 0 {
            rows.failing_object_reads -= 1;
            return Err(StoreError::Failed("connection lost".to_owned()));
        }
        Ok(ids
            .iter()
            .filter_map(|id| rows.objects.get(id).cloned())
            .collect())
    }

    fn receipts(
        &mut self,
        event_ids: &[Arc<str>],
        since: SystemTime,
    ) -> Result<Vec<ReceiptRow>, StoreError> {
        let mut rows = self.rows();
        rows.receipt_reads.push(names(event_ids));
        if rows.failing_receipt_reads > 0 {
            rows.failing_receipt_reads -= 1;
            return Err(StoreError::Failed("connection lost".to_owned()));
        }
        Ok(event_ids
            .iter()
            .filter_map(|id| rows.receipts.get(id))
            .filter(|r| r.first_seen >= since)
            .cloned()
            .collect())
    }

    fn receipt_ids(
        &mut self,
        after: &str,
        since: SystemTime,
        limit: usize,
    ) -> Result<Vec<(Arc<str>, SystemTime)>, StoreError> {
        Ok(self
            .rows()
            .receipts
            .values()
            .filter(|r| &*r.event_id > after && r.first_seen >= since)
            .take(limit)
            .map(|r| (r.event_id.clone(), r.first_seen))
            .collect())
    }
}

/// Most reads one step of these tests may ask for.
const MAX_READS_PER_STEP: usize = 20;

/// One process's bounded shard over a [`Db`].
struct Bounded {
    ctx: Context,
    shard: Shard,
    db: Db,
}

impl Bounded {
    /// A shard keeping `objects` objects and, with `Some`, `identities`
    /// committed first records, reading the rest from `db`.
    fn new(db: &Db, objects: usize, identities: Option<usize>) -> Bounded {
        Bounded::within(db, objects, identities, MemoryBudget::default())
    }

    /// As [`Bounded::new`], under `memory` (bytes).
    fn within(db: &Db, objects: usize, identities: Option<usize>, memory: MemoryBudget) -> Bounded {
        let config = Config {
            shards: 1,
            memory,
            ..Config::default()
        };
        let ctx = Context::new(config, Arc::new(ManualClock::new(t())));
        let mut shard = Shard::new();
        shard.bound_objects(objects);
        if let Some(n) = identities {
            shard.bound_identities(n);
        }
        shard.enable_journal();
        Bounded {
            ctx,
            shard,
            db: db.clone(),
        }
    }

    /// Decides `bodies` as one batch, as the pipeline does: what the
    /// whole batch misses read first (a failed read is only logged: each
    /// step asks again), then each delivery, then the batch ends. Nothing
    /// is committed yet.
    fn decide(&mut self, bodies: &[String]) -> Vec<Outcome> {
        let parser = self.ctx.parser();
        let deliveries: Vec<_> = bodies
            .iter()
            .map(|b| parser.parse(b.as_bytes()).unwrap())
            .collect();
        let objects: Vec<&str> = deliveries.iter().filter_map(|d| d.object_id()).collect();
        let events: Vec<Arc<str>> = deliveries
            .iter()
            .filter_map(|d| d.event_id().map(Arc::from))
            .collect();
        self.plan(&objects, &events);
        let outcomes = deliveries.into_iter().map(|d| self.step(d)).collect();
        self.shard.forget_absent();
        outcomes
    }

    /// Reads what a batch naming `objects` and `events` misses, as the
    /// pipeline plans it ([`Shard::plan_fetch`]).
    fn plan(&mut self, objects: &[&str], events: &[Arc<str>]) {
        let fetch = self
            .shard
            .plan_fetch(&self.ctx, objects.iter().copied(), events);
        if let Some(fetch) = fetch {
            self.read(&fetch);
        }
    }

    /// Reads `fetch` from the store and hands the rows to the shard, as
    /// the pipeline's driver does.
    fn read(&mut self, fetch: &Fetch) {
        let rows = fetch.read(&mut self.db);
        self.shard.fetched(&self.ctx, fetch, rows);
    }

    /// Decides one delivery, reading what its step asks for first each
    /// time it stops (at most [`MAX_READS_PER_STEP`] times: a step that
    /// asks for ever is a failure, not a hang).
    fn step(&mut self, mut delivery: Delivery) -> Outcome {
        for _ in 0..MAX_READS_PER_STEP {
            match self.shard.step(&self.ctx, delivery) {
                Ok(step) => return step.receipt.outcome,
                Err(stopped) => {
                    let (back, fetch) = *stopped;
                    self.read(&fetch);
                    delivery = back;
                }
            }
        }
        panic!("a step asked for {MAX_READS_PER_STEP} reads and was still not decided");
    }

    /// Commits what was decided to the store, then evicts, as the driver
    /// does once the store answered.
    fn commit(&mut self) {
        let mut group = self.shard.take_writes();
        self.db.apply(group.hand_over());
        self.shard.committed(group);
        self.shard.evict(&self.ctx);
    }

    /// One batch, decided and committed.
    fn batch(&mut self, bodies: &[String]) -> Vec<Outcome> {
        let outcomes = self.decide(bodies);
        self.commit();
        outcomes
    }

    /// One delivery in a batch of its own.
    fn deliver(&mut self, event_id: &str, object_id: &str, version: u64) -> Outcome {
        self.batch(&[body(event_id, object_id, version)]).remove(0)
    }

    /// The objects in memory, sorted.
    fn resident(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .shard
            .objects()
            .into_iter()
            .map(|o| o.object_id.to_string())
            .collect();
        ids.sort();
        ids
    }
}

const APPLIED: Outcome = Outcome::Decided(Decision::Applied);

fn duplicate_of_applied() -> Outcome {
    Outcome::Decided(Decision::Duplicate {
        original: Verdict::Applied,
    })
}

/// 1,100 deliveries to card-1 and card-2 in turn (`e-1` to `e-1100`,
/// versions 1 to 1,100), every one applied: enough uses for `shard`'s
/// queue of uses to be rebuilt.
fn use_card_1_and_2_in_turn(shard: &mut Bounded) {
    let bodies: Vec<String> = (1..=1_100)
        .map(|n| {
            let object = if n % 2 == 0 { "card-2" } else { "card-1" };
            body(&format!("e-{n}"), object, n)
        })
        .collect();
    let outcomes = shard.batch(&bodies);
    assert!(outcomes.iter().all(|o| *o == APPLIED), "{outcomes:?}");
}

#[test]
fn the_working_set_evicts_by_bytes_before_its_count_is_reached() {
    let db = Db::with_objects(&[("card-1", 0), ("card-2", 0), ("card-3", 0)]);
    // An applied object keeps its id and the whole body its state came in.
    let cost = "card-1".len() + body("e-1", "card-1", 1).len() + OBJECT_OVERHEAD;
    let memory = MemoryBudget {
        objects: 2 * cost,
        ..MemoryBudget::default()
    };
    let mut shard = Bounded::within(&db, 100, None, memory);
    assert_eq!(shard.deliver("e-1", "card-1", 1), APPLIED);
    assert_eq!(shard.deliver("e-2", "card-2", 1), APPLIED);
    assert_eq!(shard.shard.memory_use().objects, 2 * cost);
    assert_eq!(shard.resident(), ["card-1", "card-2"]);
    assert_eq!(shard.deliver("e-3", "card-3", 1), APPLIED);
    assert_eq!(shard.resident(), ["card-2", "card-3"]);
    assert_eq!(shard.shard.memory_use().objects, 2 * cost);
    assert_eq!(shard.shard.working_set().unwrap().evicted, 1);
}

#[test]
fn the_identity_cache_evicts_by_bytes_before_its_count_is_reached() {
    let db = Db::with_objects(&[("card-1", 0)]);
    let cost = "e-1".len() + IDENTITY_OVERHEAD;
    let memory = MemoryBudget {
        identities: 2 * cost,
        ..MemoryBudget::default()
    };
    let mut shard = Bounded::within(&db, 100, Some(100), memory);
    for n in 1..=3 {
        assert_eq!(shard.deliver(&format!("e-{n}"), "card-1", n), APPLIED);
    }
    assert_eq!(shard.shard.identity_cache().unwrap().evicted, 1);
    assert_eq!(shard.shard.memory_use().identities, 2 * cost);
    assert!(shard.ctx.registry().get("e-1").is_none(), "the oldest left");
    // Its duplicate reads the receipt back and still gets its decision.
    assert_eq!(shard.deliver("e-1", "card-1", 1), duplicate_of_applied());
}

#[test]
fn eviction_is_least_recently_used_not_first_in() {
    let db = Db::with_objects(&[("card-1", 0), ("card-2", 0), ("card-3", 0)]);
    let mut shard = Bounded::new(&db, 2, None);
    assert_eq!(shard.deliver("e-1", "card-1", 1), APPLIED);
    assert_eq!(shard.deliver("e-2", "card-2", 1), APPLIED);
    // card-1 is used again: card-2 is now the least recently used.
    assert_eq!(shard.deliver("e-3", "card-1", 2), APPLIED);
    assert_eq!(shard.deliver("e-4", "card-3", 1), APPLIED);
    assert_eq!(shard.resident(), ["card-1", "card-3"]);
    // card-1 is decided from memory; card-2 is read again.
    assert_eq!(shard.deliver("e-5", "card-1", 3), APPLIED);
    assert_eq!(shard.deliver("e-6", "card-2", 2), APPLIED);
    assert_eq!(
        db.object_reads(),
        [["card-1"], ["card-2"], ["card-3"], ["card-2"]]
    );
    let stats = shard.shard.working_set().unwrap();
    assert_eq!(
        (stats.capacity, stats.resident, stats.loaded, stats.evicted),
        (2, 2, 4, 2)
    );
}

#[test]
fn recency_survives_the_queue_of_uses_being_compacted() {
    // 1,100 uses of card-1 and card-2 in one batch: the queue of uses
    // passes 2 x 2 objects + 1,024 entries and is rebuilt, oldest use
    // first. card-2 was used last, then card-1 once more.
    let db = Db::with_objects(&[("card-1", 0), ("card-2", 0), ("card-3", 0)]);
    let mut shard = Bounded::new(&db, 2, None);
    use_card_1_and_2_in_turn(&mut shard);
    assert_eq!(shard.deliver("e-1101", "card-1", 1_101), APPLIED);
    assert_eq!(shard.deliver("e-1102", "card-3", 1), APPLIED);
    assert_eq!(shard.resident(), ["card-1", "card-3"]);
    assert_eq!(shard.shard.working_set().unwrap().evicted, 1);
}

#[test]
fn paused_objects_and_objects_holding_events_are_never_evicted() {
    let db = Db::with_objects(&[("card-1", 0), ("card-2", 0), ("card-3", 0), ("card-4", 0)]);
    let mut shard = Bounded::new(&db, 1, None);
    // card-1 holds an event (no version), card-2 is paused (a conflict on
    // an equal version): both stay although the bound is one object.
    let missing = r#"{"event_id":"e-1","object_id":"card-1","occurred_at":"2099-01-01T00:00:00Z","type":"card.snapshot","state":{}}"#;
    assert_eq!(
        shard.batch(&[missing.to_owned()]),
        [Outcome::Decided(Decision::Held(HoldReason::MissingVersion))]
    );
    assert_eq!(shard.deliver("e-2", "card-2", 1), APPLIED);
    let conflicting = body("e-3", "card-2", 1).replace(r#"{"v":1}"#, r#"{"v":9}"#);
    assert!(matches!(
        shard.batch(&[conflicting])[0],
        Outcome::Decided(Decision::Conflict(_))
    ));
    assert_eq!(shard.deliver("e-4", "card-3", 1), APPLIED);
    assert_eq!(shard.deliver("e-5", "card-4", 1), APPLIED);
    // card-2 left before its conflict, card-3 and card-4 after their
    // deliveries; the two that must stay pass the bound.
    assert_eq!(shard.resident(), ["card-1", "card-2"]);
    let stats = shard.shard.working_set().unwrap();
    assert_eq!((stats.loaded, stats.evicted), (5, 3));
}

#[test]
fn an_object_found_absent_is_read_again_in_a_later_batch() {
    // card-9 is not in the store when an authority's batch looks it up;
    // the authority creates it, it leaves memory, and a later batch must
    // read it again instead of taking it for unknown.
    let db = Db::with_objects(&[("card-1", 0)]);
    let mut shard = Bounded::new(&db, 1, None);
    shard.plan(&["card-9"], &[]);
    let authority = AuthoritativeSnapshot::new("card-9", 1, r#"{"v":1}"#, t()).unwrap();
    let report = shard.shard.reconcile(&shard.ctx, &authority).unwrap();
    assert_eq!(report.previous_version, None, "introduced by the authority");
    shard.shard.forget_absent();
    shard.commit();
    assert_eq!(db.rows().objects["card-9"].version, 1);
    // card-1's delivery pushes card-9 out of memory.
    assert_eq!(shard.deliver("e-1", "card-1", 1), APPLIED);
    assert_eq!(shard.resident(), ["card-1"]);
    assert_eq!(shard.deliver("e-2", "card-9", 2), APPLIED);
    assert_eq!(
        db.object_reads(),
        [["card-9"], ["card-1"], ["card-9"]],
        "card-9 read again after the batch that found it absent"
    );
}

#[test]
fn an_object_found_absent_is_not_read_again_within_its_batch() {
    let db = Db::with_objects(&[("card-1", 0)]);
    let mut shard = Bounded::new(&db, 4, None);
    let outcomes = shard.batch(&[body("e-1", "card-9", 1), body("e-2", "card-9", 2)]);
    let unknown = Outcome::Decided(Decision::Held(HoldReason::UnknownObject));
    assert_eq!(outcomes, [unknown.clone(), unknown]);
    assert_eq!(db.object_reads(), [["card-9"]]);
}

#[test]
fn a_failed_receipt_read_marks_nothing_read_and_the_delivery_reads_again() {
    let db = Db::with_objects(&[("card-7", 10)]);
    let mut shard = Bounded::new(&db, 1, Some(1));
    assert_eq!(shard.deliver("e-1", "card-7", 11), APPLIED);
    assert_eq!(shard.deliver("e-2", "card-7", 12), APPLIED);
    // e-1's first record left memory (a cache of one): only the store has it.
    assert!(shard.ctx.registry().get("e-1").is_none());
    // Its redelivery: the batch's read of its receipt fails, the
    // delivery's own read finds it.
    db.rows().failing_receipt_reads = 1;
    assert_eq!(
        shard.batch(&[body("e-1", "card-7", 11)]),
        [duplicate_of_applied()]
    );
    // Without a filter, e-1 and e-2 were read when new too.
    assert_eq!(db.receipt_reads(), [["e-1"], ["e-2"], ["e-1"], ["e-1"]]);
    let cache = shard.shard.identity_cache().unwrap();
    assert_eq!(
        (cache.capacity, cache.reads, cache.loaded, cache.spared),
        (1, 3, 1, 0),
        "the failed read is not counted: it read nothing"
    );
}

#[test]
fn a_failed_receipt_read_holds_back_the_later_deliveries_of_its_object_in_the_batch() {
    // e-1's redelivery cannot read its receipt: it is answered `retry`, and
    // so is e-3 (card-7 v13, after it in the batch), which must not be
    // decided ahead of it; e-4 (card-8) is decided.
    let db = Db::with_objects(&[("card-7", 10), ("card-8", 0)]);
    let mut shard = Bounded::new(&db, 4, Some(1));
    assert_eq!(shard.deliver("e-1", "card-7", 11), APPLIED);
    assert_eq!(shard.deliver("e-2", "card-7", 12), APPLIED);
    db.rows().failing_receipt_reads = 2;
    let outcomes = shard.batch(&[
        body("e-1", "card-7", 11),
        body("e-3", "card-7", 13),
        body("e-4", "card-8", 1),
    ]);
    let lost = StoreError::Failed("connection lost".to_owned());
    let retry = Outcome::Retry(crate::engine::RetryReason::StoreFailed(lost));
    assert_eq!(outcomes, [retry.clone(), retry, APPLIED]);
    assert_eq!(db.rows().objects["card-7"].version, 12);
}

#[test]
fn a_stored_state_that_is_not_json_answers_retry_naming_the_object_and_is_read_again_later() {
    let db = Db::with_objects(&[("card-7", 10), ("card-8", 0)]);
    db.rows().objects.get_mut("card-7").unwrap().state = "{\"v\":".to_owned();
    let mut shard = Bounded::new(&db, 4, None);
    let outcomes = shard.batch(&[
        body("e-1", "card-7", 11),
        body("e-2", "card-7", 12),
        body("e-3", "card-8", 1),
    ]);
    let Outcome::Retry(crate::engine::RetryReason::StoreFailed(StoreError::Failed(why))) =
        &outcomes[0]
    else {
        panic!("{outcomes:?}");
    };
    assert!(why.starts_with("stored state of card-7: "), "{why}");
    assert_eq!(
        outcomes[1], outcomes[0],
        "card-7's later delivery waits too"
    );
    assert_eq!(outcomes[2], APPLIED);
    assert_eq!(
        db.object_reads(),
        [["card-7", "card-8"]],
        "read once in the batch"
    );
    // Mended in the store: the next batch reads it again.
    db.rows().objects.get_mut("card-7").unwrap().state = r#"{"v":10}"#.to_owned();
    assert_eq!(shard.batch(&[body("e-1", "card-7", 11)]), [APPLIED]);
}

#[test]
fn a_receipt_read_that_keeps_failing_answers_retry_and_records_nothing() {
    let db = Db::with_objects(&[("card-7", 10)]);
    let mut shard = Bounded::new(&db, 1, Some(1));
    assert_eq!(shard.deliver("e-1", "card-7", 11), APPLIED);
    assert_eq!(shard.deliver("e-2", "card-7", 12), APPLIED);
    db.rows().failing_receipt_reads = 2;
    let reads = shard.shard.identity_cache().unwrap().reads;
    let outcome = shard.batch(&[body("e-1", "card-7", 11)]).remove(0);
    assert!(
        matches!(outcome, Outcome::Retry(crate::engine::RetryReason::StoreFailed(StoreError::Failed(ref e))) if e == "connection lost"),
        "{outcome:?}"
    );
    assert_eq!(shard.shard.identity_cache().unwrap().reads, reads);
    assert!(shard.ctx.registry().get("e-1").is_none());
    // The next batch reads it and answers the original decision.
    assert_eq!(
        shard.batch(&[body("e-1", "card-7", 11)]),
        [duplicate_of_applied()]
    );
    assert_eq!(
        db.receipt_reads().len(),
        5,
        "e-1, e-2, twice failed, once read"
    );
    assert_eq!(db.rows().receipts["e-1"].decision, Verdict::Applied);
}

#[test]
fn without_a_filter_every_identity_not_in_memory_is_read() {
    // No filter of stored identities: a new identity and an evicted one
    // are both read from the store (a "maybe" for all).
    let db = Db::with_objects(&[("card-7", 10)]);
    let mut shard = Bounded::new(&db, 1, Some(1));
    assert!(shard.ctx.registry().filter().is_none());
    assert_eq!(shard.deliver("e-1", "card-7", 11), APPLIED);
    assert_eq!(shard.deliver("e-2", "card-7", 12), APPLIED);
    assert_eq!(shard.deliver("e-1", "card-7", 11), duplicate_of_applied());
    assert_eq!(db.receipt_reads(), [["e-1"], ["e-2"], ["e-1"]]);
    let cache = shard.shard.identity_cache().unwrap();
    assert_eq!(
        (cache.reads, cache.loaded, cache.spared, cache.evicted),
        (3, 1, 0, 2)
    );
}

#[test]
fn with_a_ready_filter_only_identities_it_may_hold_are_read() {
    let db = Db::with_objects(&[("card-7", 10)]);
    let mut shard = Bounded::new(&db, 1, Some(1));
    let filter = Arc::new(IdentityFilter::new(
        1_000,
        Duration::from_secs(24 * 3600),
        7,
    ));
    filter.mark_ready();
    assert!(shard.ctx.registry().track_stored(filter.clone()));
    // New identities are spared their read; e-1, evicted into the filter,
    // is read.
    assert_eq!(shard.deliver("e-1", "card-7", 11), APPLIED);
    assert_eq!(shard.deliver("e-2", "card-7", 12), APPLIED);
    assert_eq!(shard.deliver("e-1", "card-7", 11), duplicate_of_applied());
    assert_eq!(db.receipt_reads(), [["e-1"]]);
    let cache = shard.shard.identity_cache().unwrap();
    assert_eq!((cache.reads, cache.loaded, cache.spared), (1, 1, 2));
    assert_eq!(filter.stats().inserted, 2, "e-1, then e-2 evicted");
}

#[test]
fn the_oldest_committed_first_records_leave_beyond_the_bound() {
    let db = Db::with_objects(&[("card-7", 10)]);
    let mut shard = Bounded::new(&db, 1, Some(2));
    let outcomes = shard.batch(&[
        body("e-1", "card-7", 11),
        body("e-2", "card-7", 12),
        body("e-3", "card-7", 13),
        body("e-4", "card-7", 14),
    ]);
    assert_eq!(outcomes, [APPLIED; 4]);
    let registry = shard.ctx.registry();
    let kept: Vec<bool> = ["e-1", "e-2", "e-3", "e-4"]
        .iter()
        .map(|id| registry.get(id).is_some())
        .collect();
    assert_eq!(kept, [false, false, true, true]);
    assert_eq!(registry.len(), 2);
    assert_eq!(shard.shard.identity_cache().unwrap().evicted, 2);
}

#[test]
fn first_records_decided_but_not_committed_stay() {
    let db = Db::with_objects(&[("card-7", 10)]);
    let mut shard = Bounded::new(&db, 1, Some(1));
    assert_eq!(shard.deliver("e-1", "card-7", 11), APPLIED);
    // e-2 and e-3 decided, not committed: an eviction now (another
    // group's settle) lets go of committed records only.
    let outcomes = shard.decide(&[body("e-2", "card-7", 12), body("e-3", "card-7", 13)]);
    assert_eq!(outcomes, [APPLIED; 2]);
    shard.shard.evict(&shard.ctx);
    let registry = shard.ctx.registry();
    assert!(registry.get("e-2").is_some() && registry.get("e-3").is_some());
    assert_eq!(
        registry.len(),
        3,
        "e-1 is the only committed one: within the bound"
    );
    shard.commit();
    assert_eq!(shard.ctx.registry().len(), 1);
}

#[test]
fn receipts_read_back_after_a_conflict_leave_the_identity_cache_like_any_other() {
    // Another process records e-1..e-3 on card-7 while this one decides
    // the same identities as new: its commit conflicts, it reloads what
    // the store holds and decides again. The three receipts it read back
    // are as stored: with a cache of one, two of them leave memory.
    let db = Db::with_objects(&[("card-7", 10)]);
    let mut this = Bounded::new(&db, 4, Some(1));
    let mut other = Bounded::new(&db, 4, Some(1));
    let bodies = [
        body("e-1", "card-7", 11),
        body("e-2", "card-7", 12),
        body("e-3", "card-7", 13),
    ];
    assert_eq!(this.decide(&bodies), [APPLIED; 3]);
    assert_eq!(other.batch(&bodies), [APPLIED; 3]);
    // This process's commit is refused (the receipts exist): roll back,
    // reload the rows the steps touched, decide again.
    let group = this.shard.take_writes();
    let touched = this.shard.rolled_back(&this.ctx, group);
    let reloaded = {
        let rows = db.rows();
        Reloaded {
            objects: touched
                .objects
                .iter()
                .filter_map(|id| rows.objects.get(id).cloned())
                .collect(),
            receipts: touched
                .receipts
                .iter()
                .filter_map(|id| rows.receipts.get(id).cloned())
                .collect(),
            variants: Vec::new(),
        }
    };
    assert_eq!(reloaded.receipts.len(), 3);
    this.shard.refresh(&this.ctx, reloaded);
    assert_eq!(this.decide(&bodies), vec![duplicate_of_applied(); 3]);
    this.commit();
    assert_eq!(this.ctx.registry().len(), 1, "the cache holds one identity");
    let cache = this.shard.identity_cache().unwrap();
    assert_eq!(cache.evicted, 2);
}

#[test]
fn an_identity_evicted_between_its_look_up_and_its_claim_is_read_again() {
    // e-1's first record is in memory when the next batch looks it up (no
    // read), then another shard lets it go before the claim: the claim sees
    // the stripe's stamp moved, the look-up is forgotten, and the store is
    // read for the receipt, so the redelivery is the duplicate it is.
    let db = Db::with_objects(&[("card-7", 10)]);
    let mut shard = Bounded::new(&db, 4, Some(4));
    assert_eq!(shard.deliver("e-1", "card-7", 11), APPLIED);
    let reads_before = db.receipt_reads().len();
    shard.plan(&[], &[Arc::from("e-1")]);
    assert_eq!(
        db.receipt_reads().len(),
        reads_before,
        "in memory: not read"
    );
    let first = shard.ctx.registry().get("e-1").unwrap();
    assert!(shard
        .ctx
        .registry()
        .evict("e-1", first.fingerprint, first.first_seen, t()));
    let parsed = shard
        .ctx
        .parser()
        .parse(body("e-1", "card-7", 11).as_bytes())
        .unwrap();
    assert_eq!(shard.step(parsed), duplicate_of_applied());
    assert_eq!(
        db.receipt_reads()[reads_before..],
        [["e-1"]],
        "read once, after the claim found the stripe's stamp moved"
    );
}

#[test]
fn a_batchs_objects_not_in_memory_are_read_in_one_read() {
    // One read names each object of the batch that is neither in memory
    // (card-1), nor found absent in this batch (card-8), nor holding parked
    // events (card-9), once however often it is named (card-2).
    let db = Db::with_objects(&[("card-1", 0), ("card-2", 0), ("card-3", 0)]);
    let mut shard = Bounded::new(&db, 8, None);
    let unknown = Outcome::Decided(Decision::Held(HoldReason::UnknownObject));
    assert_eq!(
        shard.batch(&[body("e-1", "card-1", 1), body("e-2", "card-9", 1)]),
        [APPLIED, unknown.clone()]
    );
    shard.plan(&["card-8"], &[]);
    let outcomes = shard.decide(&[
        body("e-3", "card-1", 2),
        body("e-4", "card-2", 1),
        body("e-5", "card-3", 1),
        body("e-6", "card-2", 2),
        body("e-7", "card-8", 1),
        body("e-8", "card-9", 2),
        body("e-9", "card-4", 1),
    ]);
    assert_eq!(
        outcomes,
        [
            APPLIED,
            APPLIED,
            APPLIED,
            APPLIED,
            unknown.clone(),
            unknown.clone(),
            unknown
        ]
    );
    assert_eq!(
        db.object_reads(),
        [
            vec!["card-1", "card-9"],
            vec!["card-8"],
            vec!["card-2", "card-3", "card-4"]
        ],
    );
}

#[test]
fn a_failed_batch_read_of_objects_is_tried_again_by_each_step() {
    // The batch's read of card-2 and card-3 fails: each delivery reads its
    // own object, and finds it.
    let db = Db::with_objects(&[("card-1", 0), ("card-2", 5), ("card-3", 0)]);
    let mut shard = Bounded::new(&db, 8, None);
    assert_eq!(shard.deliver("e-1", "card-1", 1), APPLIED);
    db.rows().failing_object_reads = 1;
    let stale = Outcome::Decided(Decision::Stale);
    assert_eq!(
        shard.batch(&[
            body("e-2", "card-1", 2),
            body("e-3", "card-2", 4),
            body("e-4", "card-3", 1),
        ]),
        [APPLIED, stale, APPLIED]
    );
    assert_eq!(
        db.object_reads(),
        [
            vec!["card-1"],
            vec!["card-2", "card-3"],
            vec!["card-2"],
            vec!["card-3"]
        ],
    );
    assert_eq!(shard.shard.working_set().unwrap().loaded, 3);
}

#[test]
fn an_object_used_only_before_the_queue_was_compacted_is_still_evicted_first() {
    // card-3 is used once, then 1,100 uses of card-1 and card-2 pass
    // 2 x 3 objects + 1,024 entries and the queue is rebuilt: card-3's
    // only use must survive the rebuild, so card-4's arrival evicts it,
    // the least recently used, and neither of the others.
    let db = Db::with_objects(&[("card-1", 0), ("card-2", 0), ("card-3", 0), ("card-4", 0)]);
    let mut shard = Bounded::new(&db, 3, None);
    assert_eq!(shard.deliver("e-0", "card-3", 1), APPLIED);
    use_card_1_and_2_in_turn(&mut shard);
    assert_eq!(shard.deliver("e-1101", "card-4", 1), APPLIED);
    assert_eq!(shard.resident(), ["card-1", "card-2", "card-4"]);
    assert_eq!(shard.shard.working_set().unwrap().evicted, 1);
}

#[test]
fn receipts_read_for_a_batch_count_as_loaded_and_by_their_bytes() {
    let db = Db::with_objects(&[("card-1", 0)]);
    let mut first = Bounded::new(&db, 10, Some(10));
    assert_eq!(first.deliver("e-1", "card-1", 1), APPLIED);
    assert_eq!(first.deliver("e-2", "card-1", 2), APPLIED);
    // Another process's shard, its cache empty: one read for both receipts.
    let mut second = Bounded::new(&db, 10, Some(10));
    let outcomes = second.batch(&[body("e-1", "card-1", 1), body("e-2", "card-1", 2)]);
    assert_eq!(outcomes, [duplicate_of_applied(), duplicate_of_applied()]);
    let stats = second.shard.identity_cache().unwrap();
    assert_eq!((stats.loaded, stats.reads, stats.evicted), (2, 1, 0));
    // And they weigh what any other identity in the cache weighs.
    let cost = "e-1".len() + IDENTITY_OVERHEAD;
    assert_eq!(second.shard.memory_use().identities, 2 * cost);
}

#[test]
fn an_identity_larger_than_its_byte_budget_still_stays_alone() {
    let db = Db::with_objects(&[("card-1", 0)]);
    let cost = "e-1".len() + IDENTITY_OVERHEAD;
    let memory = MemoryBudget {
        identities: cost - 1,
        ..MemoryBudget::default()
    };
    let mut shard = Bounded::within(&db, 100, Some(100), memory);
    assert_eq!(shard.deliver("e-1", "card-1", 1), APPLIED);
    // The last one is kept whatever it weighs: a cache that empties itself
    // would read every redelivery back from the store.
    assert_eq!(shard.shard.identity_cache().unwrap().evicted, 0);
    assert_eq!(shard.shard.memory_use().identities, cost);
    assert!(shard.ctx.registry().get("e-1").is_some());
    assert_eq!(shard.deliver("e-2", "card-1", 2), APPLIED);
    assert_eq!(shard.shard.identity_cache().unwrap().evicted, 1);
    assert!(shard.ctx.registry().get("e-1").is_none());
    assert!(shard.ctx.registry().get("e-2").is_some());
}

#[test]
fn the_trail_counts_the_audit_records_and_the_replacement_history() {
    let db = Db::with_objects(&[("card-1", 0)]);
    let mut shard = Bounded::new(&db, 10, None);
    assert_eq!(shard.deliver("e-1", "card-1", 1), APPLIED);
    assert_eq!(shard.deliver("e-2", "card-1", 2), APPLIED);
    let audit = shard.shard.audit.bytes();
    let history = shard.shard.replacements.bytes();
    // Both are kept: two delivery records, two replacements.
    assert!(audit > 0 && history > 0, "{audit} {history}");
    assert_eq!(shard.shard.memory_use().trail, audit + history);
}

#[test]
fn the_queue_of_uses_is_rebuilt_exactly_past_twice_the_objects_plus_1024() {
    let db = Db::with_objects(&[("card-1", 0), ("card-2", 0), ("card-3", 0)]);
    let mut shard = Bounded::new(&db, 10, None);
    for (n, card) in ["card-1", "card-2", "card-3"].into_iter().enumerate() {
        assert_eq!(shard.deliver(&format!("e-{n}"), card, 1), APPLIED);
    }
    let order_len = |s: &Bounded| s.shard.working.as_ref().unwrap().order.len();
    let card: Arc<str> = Arc::from("card-1");
    // 3 objects: the queue may hold 2 x 3 + 1,024 = 1,030 uses.
    let mut len = order_len(&shard);
    assert!(len < 1_030, "{len}");
    while len < 1_030 {
        shard.shard.touch(&card);
        assert_eq!(order_len(&shard), len + 1, "no rebuild below the limit");
        len += 1;
    }
    // One more: rebuilt to one use per object.
    shard.shard.touch(&card);
    assert_eq!(order_len(&shard), 3);
}

/// A `card.snapshot` body of `object_id` at `version` with state `{"v":state}`.
fn body_with(event_id: &str, object_id: &str, version: u64, state: u64) -> String {
    body(event_id, object_id, version).replace(
        &format!(r#""state":{{"v":{version}}}"#),
        &format!(r#""state":{{"v":{state}}}"#),
    )
}

/// Waiting bodies stay in the store (docs/CONTRACT.md §9): a bounded,
/// journaled shard keeps a held or parked body only until its group
/// commits, takes any hold past its waiting share, and a reconciliation
/// stops first for the bodies of the events it decides again (one read by
/// their keys, through the driver), then decides them with the normal
/// rules; a driver that does not read gets the reconciliation refused.
#[test]
fn held_bodies_leave_memory_at_commit_and_a_reconciliation_reads_them_first() {
    use crate::engine::budget::{STORED_WAITING_OVERHEAD, WAITING_OVERHEAD};
    use crate::engine::{ReconcileError, ReevaluationOutcome};
    let db = Db::with_objects(&[("card-1", 1)]);
    let memory = MemoryBudget {
        waiting: 1,
        ..MemoryBudget::default()
    };
    let mut shard = Bounded::within(&db, 100, None, memory);
    let bodies = [
        body_with("e-2", "card-1", 1, 7), // version_state conflict: paused
        body("e-3", "card-1", 3),         // held: paused
        body("e-4", "ghost", 1),          // parked: unknown object
    ];
    let held = |r| Outcome::Decided(Decision::Held(r));
    assert_eq!(
        shard.decide(&bodies),
        [
            Outcome::Decided(Decision::Conflict(crate::ConflictKind::VersionState)),
            held(HoldReason::Paused),
            held(HoldReason::UnknownObject),
        ],
        "past a waiting share of one byte: a shard that reads from the store refuses no hold"
    );
    let in_memory: usize = bodies.iter().map(|b| b.len() + WAITING_OVERHEAD).sum();
    assert_eq!(
        shard.shard.memory_use().waiting,
        in_memory,
        "until the commit"
    );
    shard.commit();
    let stored = |id: &str| id.len() + STORED_WAITING_OVERHEAD;
    assert_eq!(
        shard.shard.memory_use().waiting,
        stored("e-2") + stored("e-3") + stored("e-4")
    );
    let keys: Vec<HeldKey> = db
        .rows()
        .held
        .keys()
        .map(|&(origin, seq)| HeldKey { origin, seq })
        .collect();
    assert_eq!(keys.len(), 3);

    let authority = AuthoritativeSnapshot::new("card-1", 3, r#"{"v":3}"#, t()).unwrap();
    // A driver that does not read: refused, nothing changed.
    let refused = shard.shard.reconcile(&shard.ctx, &authority).unwrap_err();
    assert_eq!(
        refused.to_string(),
        "the durable store could not record the reconciliation"
    );
    let ReconcileError::StoreFailed(cause) = refused else {
        panic!("{refused:?}")
    };
    assert_eq!(
        cause.to_string(),
        "store failure: the bodies of 2 held events of card-1 only in the store, and this \
         shard's driver does not read it (a bounded shard is driven by a Pipeline)"
    );
    // Its driver reads the two bodies (the parked event waits for its own
    // object), then decides them again.
    let fetch = match shard.shard.reconcile_step(&shard.ctx, &authority) {
        Err(fetch) => fetch,
        Ok(done) => panic!("decided without the bodies: {done:?}"),
    };
    assert_eq!(fetch.held, keys[..2]);
    assert!(fetch.objects.is_empty() && fetch.receipts.is_empty());
    shard.read(&fetch);
    let report = shard
        .shard
        .reconcile_step(&shard.ctx, &authority)
        .expect("the bodies are in memory")
        .unwrap();
    let lines: Vec<(String, ReevaluationOutcome)> = report
        .reevaluated
        .iter()
        .map(|r| (r.event_id.to_string(), r.outcome))
        .collect();
    assert_eq!(
        lines,
        [
            (
                "e-2".to_owned(),
                ReevaluationOutcome::Decided(Verdict::Stale, false)
            ),
            (
                "e-3".to_owned(),
                ReevaluationOutcome::Decided(Verdict::Equal, false)
            ),
        ]
    );
    assert_eq!(db.rows().held_reads, [keys[..2].to_vec()]);
    shard.commit();
    assert_eq!(shard.shard.memory_use().waiting, stored("e-4"));
}
