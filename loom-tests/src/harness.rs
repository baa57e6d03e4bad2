//! The models' harness: a receiver made of the shipped pieces, and the loom
//! runner that counts interleavings.

use loom::sync::Arc;
use snapshot_receiver_core::engine::Touched;
use snapshot_receiver_core::engine::{Outlet, Pipeline, Reply, ShardSet};
use snapshot_receiver_core::store::ObjectSource;
use snapshot_receiver_core::store::StoreError;
use snapshot_receiver_core::write::{Expect, ObjectRow, ReceiptRow, Reloaded, VariantRow, Write};
use snapshot_receiver_core::{
    parse_rfc3339, AuditEntry, AuditRecord, AuthoritativeSnapshot, Config, Context, Decision,
    Delivery, ManualClock, ObjectState, Outbox, PauseRequest, ReconcileError, ReconcileReport,
    ReplacementCounts, Shard, Step,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// Shard count of every [`World`]: two shard tasks are enough for a variant
/// naming an object owned by another shard.
pub const SHARDS: usize = 2;

/// Retention window of every [`World`]. Short so that the purge model can put
/// the clock exactly on the window's end; the length itself does not matter.
pub const RETENTION: Duration = Duration::from_secs(60);

/// Preemption bound of the [`Exploration::Bounded`] models when
/// `LOOM_MAX_PREEMPTIONS` is not set.
pub const DEFAULT_PREEMPTIONS: usize = 5;

/// Waits until `slot` holds a value and takes it: a model thread's side of
/// a one-place channel (`ready` is notified after each put).
pub fn take_when_put<T>(slot: &loom::sync::Mutex<Option<T>>, ready: &loom::sync::Condvar) -> T {
    let mut guard = slot.lock().unwrap();
    loop {
        if let Some(value) = guard.take() {
            return value;
        }
        guard = ready.wait(guard).unwrap();
    }
}

/// The tables of a model's store: what its committer applied. Plain data,
/// kept by a model behind one loom mutex (its committer's writes and the
/// shards' reads then meet there, one lock each).
///
/// Rows are applied as they come, without checking their conditions or
/// uniqueness (a second receipt of one event identity is kept beside the
/// first), so what a model checks is the shards' own rule, not a store's
/// guard behind it.
#[derive(Clone, Debug, Default)]
pub struct Tables {
    /// The object rows, by id.
    pub objects: BTreeMap<String, ObjectRow>,
    /// Every receipt committed, in commit order.
    pub receipts: Vec<ReceiptRow>,
    /// Every variant committed, in commit order.
    pub variants: Vec<VariantRow>,
}

impl Tables {
    /// Tables holding `objects` (`(object_id, version, state JSON)`), none
    /// of them paused, and `receipts`.
    pub fn new(objects: &[(&str, u64, &str)], receipts: Vec<ReceiptRow>) -> Tables {
        let objects = objects
            .iter()
            .map(|&(id, version, state)| {
                let row = ObjectRow {
                    object_id: id.into(),
                    version,
                    state: state.to_owned(),
                    paused: false,
                };
                (id.to_owned(), row)
            })
            .collect();
        Tables {
            objects,
            receipts,
            variants: Vec::new(),
        }
    }

    /// Applies a committed group's writes: object rows, seeds, pauses,
    /// receipts and variants (audit, history and held rows are not kept).
    pub fn apply(&mut self, writes: Vec<Write>) {
        for write in writes {
            match write {
                Write::Object { row, .. } => {
                    self.objects.insert(row.object_id.to_string(), row);
                }
                Write::Seed(row) => {
                    self.objects.entry(row.object_id.to_string()).or_insert(row);
                }
                Write::Pause { object_id } | Write::PauseIfStored { object_id, .. } => {
                    if let Some(row) = self.objects.get_mut(&*object_id) {
                        row.paused = true;
                    }
                }
                Write::Receipt(row) => self.receipts.push(row),
                Write::Variant(row) => self.variants.push(row),
                _ => {}
            }
        }
    }

    /// Applies a group's writes as a store that checks their conditions
    /// does: each object write, check and creation must find the row as
    /// its decision read it (after the group's earlier writes), or nothing
    /// of the group is applied and the answer is
    /// [`StoreError::Conflict`], as another writer's change makes it.
    ///
    /// # Errors
    /// The first condition that does not hold, as a conflict.
    pub fn apply_checked(&mut self, writes: Vec<Write>) -> Result<(), StoreError> {
        let mut objects = self.objects.clone();
        for write in &writes {
            let (id, holds) = match write {
                Write::Object { row, expect } => {
                    let now = objects.get(&*row.object_id);
                    let holds = match *expect {
                        Expect::Version { version, paused } => {
                            now.is_some_and(|o| o.version == version && o.paused == paused)
                        }
                        Expect::Absent => now.is_none(),
                    };
                    objects.insert(row.object_id.to_string(), row.clone());
                    (&row.object_id, holds)
                }
                Write::Check {
                    object_id,
                    version,
                    paused,
                } => {
                    let now = objects.get(&**object_id);
                    let holds = now.is_some_and(|o| o.version == *version && o.paused == *paused);
                    (object_id, holds)
                }
                Write::PauseIfStored {
                    event_id,
                    fingerprint,
                    object_id,
                    ..
                } => {
                    // The variant's first record must be stored before it,
                    // and be the one the variant contradicts.
                    let stored = |r: &&ReceiptRow| r.event_id == *event_id;
                    if !self
                        .receipts
                        .iter()
                        .filter(stored)
                        .any(|r| r.fingerprint == *fingerprint)
                    {
                        return Err(StoreError::Conflict(format!(
                            "the first record of {event_id} is not stored yet"
                        )));
                    }
                    if let Some(row) = objects.get_mut(&**object_id) {
                        row.paused = true;
                    }
                    continue;
                }
                Write::Pause { object_id } => {
                    if let Some(row) = objects.get_mut(&**object_id) {
                        row.paused = true;
                    }
                    continue;
                }
                _ => continue,
            };
            if !holds {
                return Err(StoreError::Conflict(format!(
                    "{id} changed since it was read"
                )));
            }
        }
        self.apply(writes);
        Ok(())
    }

    /// The rows a shard reloads after a conflict: the objects and receipts
    /// it touched (each event identity's first committed receipt) and every
    /// variant of those identities.
    pub fn reload(&self, touched: &Touched) -> Reloaded {
        let first = |id: &std::sync::Arc<str>| self.receipts.iter().find(|r| r.event_id == *id);
        Reloaded {
            objects: self.objects_of(&touched.objects),
            receipts: touched.receipts.iter().filter_map(first).cloned().collect(),
            variants: self
                .variants
                .iter()
                .filter(|v| touched.receipts.contains(&v.event_id))
                .cloned()
                .collect(),
        }
    }

    /// What `ObjectSource::objects` answers: the rows of those of `ids`
    /// the tables hold.
    pub fn objects_of(&self, ids: &[std::sync::Arc<str>]) -> Vec<ObjectRow> {
        ids.iter()
            .filter_map(|id| self.objects.get(&**id).cloned())
            .collect()
    }

    /// What `ObjectSource::receipts` answers: the receipts of those of
    /// `event_ids` first seen at or after `since` (every one kept, in
    /// commit order).
    pub fn receipts_of(
        &self,
        event_ids: &[std::sync::Arc<str>],
        since: SystemTime,
    ) -> Vec<ReceiptRow> {
        self.receipts
            .iter()
            .filter(|r| r.first_seen >= since && event_ids.contains(&r.event_id))
            .cloned()
            .collect()
    }

    /// What `ObjectSource::receipt_ids` answers: a page of the event
    /// identities after `after` with a receipt first seen at or after
    /// `since`, in text order, at most `limit`.
    pub fn receipt_ids(
        &self,
        after: &str,
        since: SystemTime,
        limit: usize,
    ) -> Vec<(std::sync::Arc<str>, SystemTime)> {
        let mut ids: Vec<(std::sync::Arc<str>, SystemTime)> = self
            .receipts
            .iter()
            .filter(|r| r.first_seen >= since && &*r.event_id > after)
            .map(|r| (r.event_id.clone(), r.first_seen))
            .collect();
        ids.sort();
        ids.truncate(limit);
        ids
    }

    /// The receipts committed for `event_id`.
    pub fn receipts_for(&self, event_id: &str) -> Vec<&ReceiptRow> {
        self.receipts
            .iter()
            .filter(|r| &*r.event_id == event_id)
            .collect()
    }
}

/// The fixture's `T`, 2024-01-01T08:00:00Z: every event below occurred then.
pub fn t0() -> SystemTime {
    parse_rfc3339("2024-01-01T08:00:00Z").expect("valid RFC 3339")
}

/// `T + secs`.
pub fn at(secs: u64) -> SystemTime {
    t0() + Duration::from_secs(secs)
}

/// The body of a `card.snapshot` event that occurred at `T`, compact, keys in
/// envelope order. `state` is JSON text.
pub fn event(event_id: &str, object_id: &str, version: u64, state: &str) -> String {
    format!(
        concat!(
            r#"{{"event_id":"{}","object_id":"{}","object_version":{},"#,
            r#""occurred_at":"2024-01-01T08:00:00Z","type":"card.snapshot","state":{}}}"#
        ),
        event_id, object_id, version, state
    )
}

/// The shard that owns `object_id` among [`SHARDS`], by the receiver's own rule.
pub fn owner(object_id: &str) -> usize {
    snapshot_receiver_core::shard_of(object_id, SHARDS)
}

/// The first `card-N` from `card-8` on whose owner is not `object_id`'s.
pub fn card_on_the_other_shard(object_id: &str) -> String {
    (8..)
        .map(|n| format!("card-{n}"))
        .find(|id| owner(id) != owner(object_id))
        .expect("some card is on the other shard")
}

/// One receiver built from the shipped parts, to be created inside a loom
/// model (its atomics and mutexes are loom's). Cloning shares it. `O` is
/// its shards' outlet (`()` unless a model waits for wake-ups).
pub struct World<O = ()> {
    /// The shipped shard driver: the shards, each behind a loom mutex (one
    /// step at a time, every lock a point where loom may switch threads),
    /// their pause inboxes, and the registry, clock, configuration and
    /// audit sequence they share. A loom `Arc`: model threads share it and
    /// it holds loom primitives. Its outlet is `()`: nobody listens to
    /// notifications, and a queued pause needs no wake-up, because a
    /// model's shard runs its queued pauses before its next step or read,
    /// as a woken shard task would.
    pub set: Arc<ShardSet<O>>,
    /// The clock inside the context, kept to move it. A std `Arc` because
    /// [`Context::new`] takes one; it is created inside the model, so the loom
    /// atomic it holds belongs to the current execution.
    pub clock: std::sync::Arc<ManualClock>,
}

impl<O> Clone for World<O> {
    fn clone(&self) -> Self {
        World {
            set: self.set.clone(),
            clock: self.clock.clone(),
        }
    }
}

impl World {
    /// A receiver with [`SHARDS`] shards, [`RETENTION`], the clock at `now`
    /// and `objects` (`(object_id, version, state JSON)`) placed on the shard
    /// that owns each.
    pub fn new(now: SystemTime, objects: &[(&str, u64, &str)]) -> World {
        World::build(now, objects, false, false, |_| {}, ())
    }

    /// Like [`World::new`], every shard journaling its steps for a durable
    /// store (driven by a [`snapshot_receiver_core::engine::Pipeline`]).
    pub fn durable(now: SystemTime, objects: &[(&str, u64, &str)]) -> World {
        World::build(now, objects, false, true, |_| {}, ())
    }

    /// Like [`World::durable`], `tune` run on each shard before the set is
    /// made (a control's knob).
    pub fn durable_tuned(
        now: SystemTime,
        objects: &[(&str, u64, &str)],
        tune: impl Fn(&mut Shard),
    ) -> World {
        World::build(now, objects, false, true, tune, ())
    }

    /// Like [`World::durable`] with no object in memory: every shard keeps
    /// at most `capacity` objects, and its driver reads the others when the
    /// shard asks ([`serve_fetches`], as the receiver's shard tasks do with
    /// a store that gives each a connection, docs/CONTRACT.md §9). `tune`
    /// runs on each shard before the set is made (a bound on event
    /// identities, a control's knob).
    pub fn bounded(now: SystemTime, capacity: usize, tune: impl Fn(&mut Shard)) -> World {
        let clock = std::sync::Arc::new(ManualClock::new(now));
        let ctx = Context::new(World::config(), clock.clone());
        let shards: Vec<Shard> = (0..SHARDS)
            .map(|_| {
                let mut shard = Shard::new();
                shard.bound_objects(capacity);
                tune(&mut shard);
                shard
            })
            .collect();
        World {
            set: Arc::new(ShardSet::durable(ctx, shards, ())),
            clock,
        }
    }

    /// Reads what `pipeline`'s bounded shard asks for through `source`,
    /// outside the shard's lock, as the receiver's shard task does on a
    /// blocking thread between two of its steps, until it asks for nothing
    /// more: each read is an interleaving point of its own.
    pub fn serve_fetches<R: Reply>(
        &self,
        pipeline: &mut Pipeline<R>,
        source: &mut dyn ObjectSource,
    ) {
        while let Some(fetch) = pipeline.take_fetch() {
            let rows = fetch.read(source);
            pipeline.fetched(&self.set, &fetch, rows);
        }
    }

    /// The configuration of every world.
    fn config() -> Config {
        Config {
            shards: SHARDS,
            retention: RETENTION,
            ..Config::default()
        }
    }

    /// A receiver whose every shard knows `objects`. Routing never sends one
    /// object to two shards; this exists only for the models that take the
    /// routing's serialisation away so that the registry is the sole guard.
    pub fn replicated(now: SystemTime, objects: &[(&str, u64, &str)]) -> World {
        World::build(now, objects, true, false, |_| {}, ())
    }

    /// Like [`World::durable`], with `outlet` told of every wake-up (a
    /// model whose drivers wait for them).
    pub fn durable_with<O: Outlet>(
        now: SystemTime,
        objects: &[(&str, u64, &str)],
        outlet: O,
    ) -> World<O> {
        World::build(now, objects, false, true, |_| {}, outlet)
    }

    fn build<O: Outlet>(
        now: SystemTime,
        objects: &[(&str, u64, &str)],
        everywhere: bool,
        durable: bool,
        tune: impl Fn(&mut Shard),
        outlet: O,
    ) -> World<O> {
        let clock = std::sync::Arc::new(ManualClock::new(now));
        let ctx = Context::new(World::config(), clock.clone());
        let mut shards: Vec<Shard> = (0..SHARDS).map(|_| Shard::new()).collect();
        for (index, shard) in shards.iter_mut().enumerate() {
            for &(id, version, state) in objects {
                if everywhere || owner(id) == index {
                    shard
                        .insert_object(&ctx, id, version, state)
                        .expect("valid initial state");
                }
            }
            tune(shard);
        }
        let set = if durable {
            ShardSet::durable(ctx, shards, outlet)
        } else {
            ShardSet::new(ctx, shards, outlet)
        };
        World {
            set: Arc::new(set),
            clock,
        }
    }
}

impl<O: Outlet + Send + Sync + 'static> World<O> {
    /// The in-memory outbox the shards publish their effects to (the
    /// shipped `Outbox`: every effect given its position when published).
    pub fn outbox(&self) -> &Outbox {
        self.set
            .outbox()
            .expect("an in-memory World keeps an outbox (Config::audit is on)")
    }

    /// Registry, clock, configuration and audit sequence, as the shards
    /// share them.
    pub fn ctx(&self) -> &Context {
        self.set.ctx()
    }

    /// `body` parsed as a producer's thread parses it (within the limits).
    pub fn delivery(&self, body: &str) -> Delivery {
        self.ctx()
            .parser()
            .parse(body.as_bytes())
            .expect("within limits")
    }

    /// What a producer and the receiver do with one body: parse it in the
    /// producer's thread, then run the step on the shard that owns its
    /// object ([`ShardSet::deliver`]: its queued pauses first, its own pause
    /// request queued in the inbox of the shard owning that object).
    pub fn deliver(&self, body: &str) -> Step {
        let delivery = self.delivery(body);
        let shard = self.set.route(delivery.object_id());
        self.set.deliver(shard, delivery)
    }

    /// Delivers two bodies from two loom threads at once and returns their
    /// steps in the order of `bodies`.
    pub fn deliver_racing(&self, bodies: [&str; 2]) -> [Step; 2] {
        let spawn = |body: &str| {
            let (world, body) = (self.clone(), body.to_owned());
            loom::thread::spawn(move || world.deliver(&body))
        };
        let (a, b) = (spawn(bodies[0]), spawn(bodies[1]));
        [a.join().unwrap(), b.join().unwrap()]
    }

    /// Like [`World::deliver`] but on shard `shard`, whatever the routing says.
    pub fn deliver_on(&self, shard: usize, body: &str) -> Step {
        let delivery = self.delivery(body);
        self.set.deliver(shard, delivery)
    }

    /// A pause request raised elsewhere: queued for the shard owning its
    /// object, which runs it at once (as its task does when woken). Returns
    /// whether that shard knows the object.
    pub fn forward(&self, pause: &PauseRequest) -> bool {
        self.set.queue_pause(pause.clone());
        self.set.run_pauses(pause.owner(SHARDS)) > 0
    }

    /// Applies an authoritative snapshot on the shard owning its object, as
    /// a reconciliation alone in its batch ([`ShardSet::reconcile`]).
    ///
    /// # Errors
    /// As [`snapshot_receiver_core::Shard::reconcile`].
    pub fn reconcile(
        &self,
        snapshot: &AuthoritativeSnapshot,
    ) -> Result<ReconcileReport, ReconcileError> {
        self.set.reconcile(owner(&snapshot.object_id), snapshot)
    }

    /// Receiver-wide retention purge, as `Receiver::purge_expired_identities`
    /// does it: read the clock, then purge the registry.
    pub fn purge(&self) -> usize {
        let now = self.ctx().clock().now();
        self.ctx().registry().purge_expired(now)
    }

    /// A read of shard `shard`, after its queued pauses ([`ShardSet::read`]).
    pub fn read<T>(&self, shard: usize, read: impl FnOnce(&Shard) -> T) -> T {
        self.set.read(shard, read)
    }

    /// A read of `object_id` on shard `shard`.
    pub fn object_on(&self, shard: usize, object_id: &str) -> Option<ObjectState> {
        self.read(shard, |s| s.object(object_id))
    }

    /// A read of `object_id` on the shard that owns it.
    pub fn object(&self, object_id: &str) -> Option<ObjectState> {
        self.object_on(owner(object_id), object_id)
    }

    /// Shard `shard`'s audit trail, in the order its steps ran.
    pub fn audit_of(&self, shard: usize) -> Vec<AuditRecord> {
        self.read(shard, |s| s.audit().to_vec())
    }

    /// The whole audit trail, in sequence order.
    pub fn audit(&self) -> Vec<AuditRecord> {
        let mut all: Vec<AuditRecord> = (0..SHARDS).flat_map(|s| self.audit_of(s)).collect();
        all.sort_by_key(|r| r.seq);
        all
    }

    /// Every recorded delivery of `event_id`, in sequence order: its
    /// decision, whether it replaced state, and the body as received.
    pub fn deliveries_of(&self, event_id: &str) -> Vec<(Decision, bool, String)> {
        self.audit()
            .into_iter()
            .filter(|r| r.event_id.as_deref() == Some(event_id))
            .filter_map(|r| match r.entry {
                AuditEntry::Delivery {
                    decision,
                    replacement,
                    body,
                    ..
                } => Some((decision, replacement, body.to_string())),
                _ => None,
            })
            .collect()
    }

    /// Replacement counts summed over the shards.
    pub fn counters(&self) -> ReplacementCounts {
        let mut total = ReplacementCounts::default();
        for shard in 0..SHARDS {
            total += self.read(shard, Shard::counters);
        }
        total
    }
}

/// Which outcomes of a model's invariant branches the explored interleavings
/// reached. A model labels each branch it takes; [`explore`] then requires
/// that every expected branch was reached, so a model cannot pass because
/// loom never produced the order it is about.
#[derive(Clone, Default)]
pub struct Outcomes {
    /// Labels seen so far. A std mutex outside loom's view: it is only held
    /// for an insert, never across a loom operation.
    seen: std::sync::Arc<std::sync::Mutex<BTreeSet<&'static str>>>,
}

impl Outcomes {
    /// Records that the current interleaving took the branch `label`.
    pub fn saw(&self, label: &'static str) {
        self.seen.lock().unwrap().insert(label);
    }

    fn all(&self) -> Vec<&'static str> {
        self.seen.lock().unwrap().iter().copied().collect()
    }
}

/// How far loom explores one model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exploration {
    /// Every interleaving: no preemption bound, loom's own reduction only.
    /// Used by every model whose full space takes seconds, not minutes.
    Exhaustive,
    /// Interleavings with at most `LOOM_MAX_PREEMPTIONS` preemptions
    /// ([`DEFAULT_PREEMPTIONS`] when unset), or every interleaving when
    /// `LOOM_EXHAUSTIVE` is set (a deep run: minutes, not seconds).
    Bounded,
    /// Interleavings with at most this many preemptions, whatever
    /// `LOOM_MAX_PREEMPTIONS` says (every interleaving with
    /// `LOOM_EXHAUSTIVE`): for a model whose space at the suite's bound
    /// would take minutes.
    Preemptions(usize),
}

/// Runs `model` in the interleavings loom explores (a
/// `loom::model::Builder` configured by `exploration`), then checks that they
/// reached exactly the outcome labels `expected` (see [`Outcomes`]).
///
/// Prints, on one line starting with `loom model`, how many interleavings it
/// ran, with which bound and how long it took. If an interleaving breaks an
/// invariant, the panic propagates and the line says in which interleaving.
///
/// # Panics
/// When an interleaving breaks an invariant, or when the outcomes reached
/// differ from `expected`.
pub fn explore<F>(name: &'static str, exploration: Exploration, expected: &[&'static str], model: F)
where
    F: Fn(&Outcomes) + Sync + Send + 'static,
{
    let mut builder = loom::model::Builder::new();
    let deep = std::env::var_os("LOOM_EXHAUSTIVE").is_some();
    builder.preemption_bound = match exploration {
        Exploration::Exhaustive => None,
        Exploration::Bounded if deep => None,
        Exploration::Bounded => Some(builder.preemption_bound.unwrap_or(DEFAULT_PREEMPTIONS)),
        Exploration::Preemptions(_) if deep => None,
        Exploration::Preemptions(bound) => Some(bound),
    };
    // A std atomic outside loom's view: loom runs the closure once per
    // interleaving, one after another, so this counts them.
    let iterations = std::sync::Arc::new(AtomicUsize::new(0));
    let outcomes = Outcomes::default();
    let report = Report {
        name,
        bound: builder.preemption_bound,
        iterations: iterations.clone(),
        start: Instant::now(),
    };
    let seen = outcomes.clone();
    builder.check(move || {
        iterations.fetch_add(1, Ordering::Relaxed);
        model(&seen);
    });
    drop(report);
    let mut expected = expected.to_vec();
    expected.sort_unstable();
    assert_eq!(
        outcomes.all(),
        expected,
        "model {name}: the outcomes loom reached differ from those expected"
    );
}

/// Prints one model's summary when it ends, normally or by a panic.
struct Report {
    /// The model's name.
    name: &'static str,
    /// The preemption bound it ran with (`None`: exhaustive).
    bound: Option<usize>,
    /// Interleavings started so far.
    iterations: std::sync::Arc<AtomicUsize>,
    /// When it started (for the report only; nothing is asserted on time).
    start: Instant,
}

impl Drop for Report {
    fn drop(&mut self) {
        let n = self.iterations.load(Ordering::Relaxed);
        let elapsed = self.start.elapsed().as_secs_f64();
        let bound = match self.bound {
            Some(b) => format!("preemption bound {b}"),
            None => "exhaustive".to_owned(),
        };
        if std::thread::panicking() {
            println!(
                "loom model {}: PANIC in interleaving {n} ({bound}, {elapsed:.3} s)",
                self.name
            );
        } else {
            println!(
                "loom model {}: {n} interleavings explored ({bound}, {elapsed:.3} s)",
                self.name
            );
        }
    }
}

/// The reply token of the driver models (8 and 9): records each answer in
/// its list; a model answers only deliveries.
pub struct Caller<'a>(pub &'a std::cell::RefCell<Vec<snapshot_receiver_core::Receipt>>);

impl snapshot_receiver_core::engine::Reply for Caller<'_> {
    fn answer(self, answer: snapshot_receiver_core::engine::Answer<'_>) {
        let snapshot_receiver_core::engine::Answer::Delivered(receipt) = answer else {
            panic!("only deliveries in this model");
        };
        self.0.borrow_mut().push(receipt);
    }
}
