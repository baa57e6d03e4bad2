//! The simulated cluster: receiver processes, the broker, the store and the
//! event queue that orders everything by (time, sequence number). One
//! seeded PRNG decides every delay, choice and fault.
//!
//! A process is the core's shipped driver and engine: started as the
//! receiver's builder starts one ([`seed_rows`], [`resume_from`],
//! [`start_shards`]), a durable [`ShardSet`] with one [`Pipeline`] per
//! shard, each shard doing what [`Pipeline::next`] says, each partition's worker driven
//! by the library's [`partition`] rules exactly as the JetStream consumer's
//! `run_partition` is (fence checked before each pull and decision, the
//! in-order gate, owed messages, acknowledgements after the commit).

pub mod reconcile;
pub mod relay;

use crate::broker::{AckKind, Kv, Partition, Pull};
use crate::store::{Shared, SimStore};
use crate::{Control, Fault, SimConfig};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use snapshot_receiver::partition::{self, Fence, InOrder, LeaseBook};
use snapshot_receiver_core::engine::{
    resume_from, seed_rows, start_shards, Answer, Bounds, Context, Fetch, Next, Outlet, Pipeline,
    Reply, Shard, ShardSet, Touched, Work,
};
use snapshot_receiver_core::store::{ObjectSource, Store, StoreError};
use snapshot_receiver_core::write::{HeldBody, HeldKey, ObjectRow, ReceiptRow, Reloaded, Write};
use snapshot_receiver_core::{
    Ack, Clock, IdentityFilter, ManualClock, Outcome, Receipt, RetryReason,
};
use snapshot_receiver_loadgen::Stream;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Where a message for a worker goes: process slot, incarnation, partition.
type Addr = (usize, u32, u32);

/// Something that happens at a point of simulated time.
#[derive(Debug)]
enum Ev {
    /// Delivery `index` of the stream is published.
    Publish(usize),
    /// A process's start-up scan reads the page of stored receipts after
    /// this event id into its filter of stored identities.
    Scan(usize, u32, Arc<str>),
    /// A process's lease loop runs (every quarter of the lease TTL).
    Tick(usize, u32),
    /// A round's heartbeat, releases and renewals reach the lease bucket.
    LeaseAt(usize, u32, Box<Round>),
    /// Their answers reach the process.
    LeaseAnswer(usize, u32, Box<Round>),
    /// A round's lease requests reach the bucket.
    AcquireAt(usize, u32, Box<Acquire>),
    /// Their answers reach the process.
    AcquireAnswer(usize, u32, Box<Acquire>),
    /// A new worker's request for the consumer's info reaches the broker.
    InfoAt(usize, u32, u32),
    /// The answer (whether the partition is busy) reaches the worker.
    InfoAnswer(usize, u32, u32, bool),
    /// A pull request reaches the broker.
    PullAt(u32, Pull),
    /// The broker looks at partition `p`'s expired pulls and due messages.
    Broker(u32),
    /// A message reaches a worker.
    Msg(Addr, u64, Arrived),
    /// The end of a pull reaches its worker.
    PullEnd(Addr, u64),
    /// An acknowledgement reaches the broker.
    Ack(u32, u64, AckKind),
    /// A process's commit of one shard's group ends.
    CommitDone(usize, u32, usize, u64),
    /// A process's reload after a conflict ends.
    ReloadDone(usize, u32, usize),
    /// A bounded shard's read of what it misses ends.
    FetchDone(usize, u32, usize),
    /// A worker's batch is still being decided: report it in progress.
    Progress(Addr, u64),
    /// A member's heartbeat reaches a process's membership watch.
    Heard(usize, u32, String),
    /// A process comes back after a crash.
    Restart(usize),
    /// A process-level fault.
    Inject(Fault),
    /// An event of relay process `r`'s incarnation.
    Relay(usize, u32, relay::RelayEv),
    /// Relay process `r` starts (again).
    RelayRestart(usize),
    /// A relay fault (a crash of relay process `r`, its destination down).
    RelayFault(usize, Fault),
    /// An event of the reconciler running in process `s`'s incarnation.
    Recon(usize, u32, reconcile::ReconEv),
}

impl Ev {
    /// The process an event belongs to, if any: a paused process handles
    /// nothing until its pause ends.
    fn process(&self) -> Option<(usize, u32)> {
        match self {
            Ev::Tick(s, i)
            | Ev::LeaseAnswer(s, i, _)
            | Ev::AcquireAnswer(s, i, _)
            | Ev::InfoAnswer(s, i, ..)
            | Ev::CommitDone(s, i, ..)
            | Ev::ReloadDone(s, i, _)
            | Ev::FetchDone(s, i, _)
            | Ev::Heard(s, i, _)
            | Ev::Scan(s, i, _) => Some((*s, *i)),
            Ev::Msg((s, i, _), ..) | Ev::PullEnd((s, i, _), _) | Ev::Progress((s, i, _), _) => {
                Some((*s, *i))
            }
            // A crash is of whatever runs then.
            Ev::Recon(s, i, ev) if !matches!(ev, reconcile::ReconEv::Crash) => Some((*s, *i)),
            _ => None,
        }
    }
}

/// One round of a process's lease loop, on its way to the bucket and back.
#[derive(Debug)]
struct Round {
    /// When the process sent it (what a renewed fence counts from).
    sent: Duration,
    member: String,
    /// Leases given back: partition, revision.
    releases: Vec<(u32, u64)>,
    /// Leases renewed: partition, revision.
    renewals: Vec<(u32, u64)>,
    /// The renewals' answers: the new revision, or `None` (lost).
    renewed: Vec<(u32, Option<u64>)>,
}

/// A round's requests for free partitions.
#[derive(Debug)]
struct Acquire {
    /// When the process sent them (what a new worker's fence counts from).
    sent: Duration,
    /// When the round started.
    round: Duration,
    member: String,
    wanted: Vec<u32>,
    /// Those taken, with the revision of their lease key.
    taken: Vec<(u32, u64)>,
}

/// One message as a worker holds it.
#[derive(Clone, Copy, Debug)]
struct Arrived {
    /// Its stream sequence in its partition.
    seq: u64,
    /// Times JetStream handed it out (1: the first delivery).
    delivered: u32,
    /// The delivery of the generated stream it carries.
    index: usize,
}

/// The caller's reply token: where a shard's answers go.
enum Token {
    /// A worker's batch.
    Batch {
        answers: Rc<RefCell<Vec<(u64, usize, Receipt)>>>,
        /// The batch (one per worker decision).
        batch: u64,
        /// Positions of the deliveries in the batch.
        positions: Vec<usize>,
    },
    /// The reconciler's work (`reconcile`).
    Recon(reconcile::ReconToken),
}

impl Reply for Token {
    fn answer(self, answer: Answer<'_>) {
        match self {
            Token::Batch {
                answers,
                batch,
                positions,
            } => {
                if let Answer::DeliveredMany(receipts) = answer {
                    let mut answers = answers.borrow_mut();
                    for (pos, r) in positions.into_iter().zip(receipts) {
                        answers.push((batch, pos, r));
                    }
                }
            }
            Token::Recon(token) => token.answer(answer),
        }
    }
}

/// One shard's group commit.
struct Drive {
    pipeline: Pipeline<Token>,
    /// The commit in the store's hands.
    commit: Option<u64>,
    /// Waiting for reloaded rows after a conflict: the rows to read.
    reloading: Option<Touched>,
    /// The read the shard asked for, on its way to the store.
    fetching: Option<Fetch>,
}

/// A batch being decided.
struct Deciding {
    batch: u64,
    messages: Vec<Arrived>,
    receipts: Vec<Option<Receipt>>,
    left: usize,
}

/// One partition's worker (the consumer's `run_partition`).
struct Worker {
    fence: Fence<Duration>,
    stop: bool,
    lost: bool,
    finished: bool,
    /// Waiting for the consumer's info before its first pull.
    starting: bool,
    order: InOrder<Arrived, Duration>,
    /// The pull being read: its id and whether its end arrived.
    pull: Option<(u64, bool)>,
    /// Messages of that pull arrived and not read yet.
    inbox: Vec<Arrived>,
    deciding: Option<Deciding>,
}

/// A running receiver process.
struct Proc {
    inc: u32,
    member: String,
    clock: Arc<ManualClock>,
    set: ShardSet<Wakes, Context>,
    drives: Vec<Drive>,
    /// Each shard's own connection to the store, for what it misses
    /// (empty when every object was loaded).
    sources: Vec<Box<dyn ObjectSource>>,
    answers: Rc<RefCell<Vec<(u64, usize, Receipt)>>>,
    book: LeaseBook,
    heard: BTreeMap<String, Duration>,
    workers: BTreeMap<u32, Worker>,
    first_tick_done: bool,
    /// Commits in flight: id → (shard).
    commits: BTreeMap<u64, usize>,
    /// The filter of stored identities' start-up scan, while it runs.
    scan: Option<Scan>,
}

/// Identities each process's filter of stored identities is sized for.
const SCAN_FILTER_CAPACITY: usize = 1_000;

/// Identities the start-up scan reads per page: a few, so that a run's
/// tens of receipts take several pages, each a step of its own.
const SCAN_PAGE: usize = 4;

/// A process's start-up scan of the stored receipts into its filter
/// (`src/receiver/identity_scan.rs` runs the same pages on a thread).
struct Scan {
    source: Box<dyn ObjectSource>,
    filter: Arc<IdentityFilter>,
    /// Receipts first seen before this are past retention: not scanned.
    since: SystemTime,
}

/// The `redelivery-without-receipt` control's connection for a restarted
/// process: it reads objects, and never a receipt.
struct Forgetful(Box<dyn ObjectSource>);

impl ObjectSource for Forgetful {
    fn objects(&mut self, ids: &[Arc<str>]) -> Result<Vec<ObjectRow>, StoreError> {
        self.0.objects(ids)
    }
    fn held_bodies(&mut self, keys: &[HeldKey]) -> Result<Vec<HeldBody>, StoreError> {
        self.0.held_bodies(keys)
    }
    fn receipts(&mut self, _: &[Arc<str>], _: SystemTime) -> Result<Vec<ReceiptRow>, StoreError> {
        Ok(Vec::new())
    }
    fn receipt_ids(
        &mut self,
        _: &str,
        _: SystemTime,
        _: usize,
    ) -> Result<Vec<(Arc<str>, SystemTime)>, StoreError> {
        Ok(Vec::new())
    }
}

/// A process's wake-ups: which shards the driver asked to wake (a pause
/// queued for one, or the last raising driver gone quiet), as the
/// receiver's shard tasks get them from tokio's `Notify`. Nobody listens to
/// notifications.
struct Wakes(Vec<Cell<bool>>);

impl Wakes {
    fn new(shards: usize) -> Self {
        Self((0..shards).map(|_| Cell::new(false)).collect())
    }

    /// Whether shard `shard` was woken since the last call.
    fn take(&self, shard: usize) -> bool {
        self.0[shard].replace(false)
    }
}

impl Outlet for Wakes {
    fn listening(&self) -> bool {
        false
    }
    fn decision(&self, _: &Receipt) {}
    fn effect(&self, _: snapshot_receiver_core::EffectRecord) {}
    fn wake(&self, shard: usize) {
        self.0[shard].set(true);
    }
}

/// A process slot: running or down, and what survives a crash.
struct Slot {
    proc: Option<Proc>,
    /// Incarnations so far (a restart is a new one).
    inc: u32,
    /// Restarts under a new member name.
    renamed: u32,
    /// Until when the process is paused.
    paused_until: Duration,
    /// The process's wall clock minus the world's, in milliseconds.
    skew_ms: i64,
    /// Armed by a `crash-after-answer` fault: the process crashes right
    /// after its next answered batch.
    crash_after_answer: bool,
}

/// A commit on its way to the store.
struct InFlight {
    writes: Vec<Write>,
    /// The fault this commit meets, if any.
    fault: Option<Fault>,
}

/// What the run recorded for the check.
#[derive(Default)]
pub struct Record {
    /// Per delivery of the stream: the code of its first answer after a
    /// commit (see `answered`).
    pub codes: Vec<Option<u8>>,
    /// Per answered delivery: where its first decision falls in the run
    /// (commit number, write in it, answer number) and the delivery.
    pub order: Vec<((u64, usize, u64), usize)>,
    /// Contents ((event id, fingerprint)) whose first record was answered.
    pub first_answered: BTreeSet<(Arc<str>, u128)>,
    /// Problems the run met itself (a body that did not parse), and the
    /// invariants it checks as it goes (a fence, a committed pause).
    pub problems: Vec<String>,
    /// Every object a committed variant paused (each known object its
    /// event's records name): the variant's event and the commit (its
    /// number) that recorded it. Nothing reconciles in a run, so each must
    /// stay paused in the store from that commit on.
    pub paused_by: BTreeMap<Arc<str>, (Arc<str>, u64)>,
    /// Objects found running after a committed variant paused them
    /// (reported once each).
    unpaused: BTreeSet<Arc<str>>,
}

impl Record {
    /// The objects a committed variant paused that `paused` (an object's
    /// flag as read; `None`: not stored, an unknown object no variant
    /// pauses) shows running, leaving out those already reported.
    pub fn running(&self, paused: impl Fn(&str) -> Option<bool>) -> Vec<Arc<str>> {
        self.paused_by
            .keys()
            .filter(|o| paused(o) == Some(false) && !self.unpaused.contains(*o))
            .cloned()
            .collect()
    }
}

/// The world: the cluster, the broker, the store and the event queue of
/// one seed's run.
pub struct World<'a> {
    /// The cluster and its timings.
    pub cfg: SimConfig,
    /// The broken variant run, if any.
    pub control: Control,
    /// The generated deliveries, published in order.
    pub stream: &'a Stream,
    /// The run's only source of randomness.
    rng: ChaCha8Rng,
    /// Simulated time since the start of the run.
    pub now: Duration,
    /// Events queued so far: the tie-break of events at one instant.
    seq: u64,
    /// What happens next, by (time, sequence).
    queue: BTreeMap<(Duration, u64), Ev>,
    /// The stream's partitions and their durable consumers.
    pub partitions: Vec<Partition>,
    /// The lease bucket.
    pub kv: Kv,
    /// The shared store.
    pub store: Shared,
    /// The receiver processes.
    slots: Vec<Slot>,
    /// Pull id → where its messages go.
    pulls: BTreeMap<u64, Addr>,
    /// The last id given to a pull, a batch or a commit.
    next_id: u64,
    /// Commits on their way to the store, by id.
    inflight: BTreeMap<u64, InFlight>,
    /// Per connection ((0: to a worker, 1: from it), slot, partition): when
    /// its last in-order hop arrives.
    channels: BTreeMap<(u8, usize, u32), Duration>,
    /// When each partition's lease was last expired early by the server.
    expired_early: BTreeMap<u32, Duration>,
    /// Until when the store's disk is full.
    full_until: Duration,
    /// The partition and stream sequence of each delivery.
    pub placed: Vec<(u32, u64)>,
    /// Deliveries published so far.
    pub published: usize,
    /// Faults injected, by kind.
    pub faults: BTreeMap<Fault, u64>,
    /// What the check needs of the run.
    pub record: Record,
    /// One line per step, when traced.
    pub trace: Option<Vec<String>>,
    /// The wall-clock instant simulated time 0 stands for.
    epoch: SystemTime,
    /// Events handled.
    pub steps: u64,
    /// Fault kinds left out of this run (a shrunk replay).
    pub without: std::collections::BTreeSet<Fault>,
    /// First answers recorded.
    answers: u64,
    /// Whether every delivery was first decided in publish order (set by
    /// the check).
    pub publish_order: Vec<String>,
    /// Per event identity of the stream: every object its deliveries name
    /// (two for a variant that names another object than its original).
    named: BTreeMap<Arc<str>, BTreeSet<Arc<str>>>,
    /// The relays and their destinations.
    pub relays: relay::Relays,
    /// The reconciler's phase, once it started.
    pub recon: Option<reconcile::Recon>,
}

impl<'a> World<'a> {
    /// A world for `stream`, seeded.
    pub fn new(
        cfg: SimConfig,
        control: Control,
        stream: &'a Stream,
        seed: u64,
        trace: bool,
    ) -> Self {
        let (relays, relay_events) = relay::Relays::new(seed, cfg.fault_phase);
        let mut w = World {
            relays,
            kv: Kv::new(cfg.lease_ttl),
            partitions: (0..cfg.partitions).map(|_| Partition::default()).collect(),
            slots: (0..cfg.processes)
                .map(|_| Slot {
                    proc: None,
                    inc: 0,
                    renamed: 0,
                    paused_until: Duration::ZERO,
                    skew_ms: 0,
                    crash_after_answer: false,
                })
                .collect(),
            cfg,
            control,
            stream,
            rng: ChaCha8Rng::seed_from_u64(seed),
            now: Duration::ZERO,
            seq: 0,
            queue: BTreeMap::new(),
            store: Shared::new(),
            pulls: BTreeMap::new(),
            next_id: 0,
            inflight: BTreeMap::new(),
            channels: BTreeMap::new(),
            expired_early: BTreeMap::new(),
            full_until: Duration::ZERO,
            placed: vec![(0, 0); stream.len()],
            published: 0,
            faults: BTreeMap::new(),
            record: Record {
                codes: vec![None; stream.len()],
                ..Record::default()
            },
            trace: trace.then(Vec::new),
            epoch: Stream::clock().now(),
            steps: 0,
            without: std::collections::BTreeSet::new(),
            answers: 0,
            publish_order: Vec::new(),
            named: BTreeMap::new(),
            recon: None,
        };
        {
            let mut store = w.store.get();
            store.drop_pause_if_stored = control == Control::PauseAfterAnswer;
            store.takeover_keeps_generation = control == Control::TakeoverKeepsGeneration;
            store.retry_keeps_attempts = control == Control::RetryKeepsAttempts;
            store.sources = w.cfg.bounds.is_some();
        }
        let parser = snapshot_receiver_core::BodyParser::default();
        for i in 0..stream.len() {
            if let Ok(d) = parser.parse(stream.body(i)) {
                if let (Some(e), Some(o)) = (d.event_id(), d.object_id()) {
                    w.named
                        .entry(Arc::from(e))
                        .or_default()
                        .insert(Arc::from(o));
                }
            }
        }
        // Publishing spreads over the first part of the fault phase.
        let mut at = Duration::ZERO;
        for i in 0..stream.len() {
            at += w.ms(0, 2 * cfg.publish_gap_ms);
            w.at(at, Ev::Publish(i));
        }
        for s in 0..cfg.processes {
            let start = w.ms(0, 300);
            w.at(start, Ev::Restart(s));
        }
        // The process-level faults of this seed, at random times.
        let n = w.rng.random_range(cfg.faults.0..=cfg.faults.1);
        for _ in 0..n {
            let at = w.ms(200, cfg.fault_phase.as_millis() as u64);
            let f = w.pick_fault();
            w.at(at, Ev::Inject(f));
        }
        for (at, ev) in relay_events {
            w.at(at, ev);
        }
        w
    }

    fn log(&mut self, what: impl FnOnce() -> String) {
        if let Some(t) = &mut self.trace {
            t.push(format!("{:>10.3}s {}", self.now.as_secs_f64(), what()));
        }
    }

    fn count(&mut self, f: Fault) {
        *self.faults.entry(f).or_default() += 1;
    }

    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.rng.random_range(lo..=hi.max(lo)))
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn at(&mut self, t: Duration, ev: Ev) {
        self.seq += 1;
        self.queue.insert((t.max(self.now), self.seq), ev);
    }

    fn after(&mut self, d: Duration, ev: Ev) {
        self.at(self.now + d, ev);
    }

    fn faulting(&self) -> bool {
        self.now < self.cfg.fault_phase
    }

    /// Whether the store's commits and reads fail now: during the fault
    /// phase, and during the reconciler's fault window.
    fn store_faulting(&self) -> bool {
        self.faulting() || self.recon.as_ref().is_some_and(|r| r.faulting(self.now))
    }

    fn pick_fault(&mut self) -> Fault {
        const WEIGHTS: [(Fault, u32); 6] = [
            (Fault::Crash, 4),
            (Fault::CrashAfterAnswer, 3),
            (Fault::Pause, 3),
            (Fault::LeaseExpiry, 3),
            (Fault::ClockSkew, 2),
            (Fault::StoreFull, 2),
        ];
        let total: u32 = WEIGHTS.iter().map(|(_, w)| w).sum();
        let mut r = self.rng.random_range(0..total);
        for (f, w) in WEIGHTS {
            if r < w {
                return f;
            }
            r -= w;
        }
        Fault::Crash
    }

    /// A network hop between a process and the broker on connection
    /// `chan`: when it arrives (`None`: lost) and when a second copy does.
    /// A connection delivers in order (NATS over TCP) unless a fault delays
    /// one hop past later ones. The fault kinds are counted under `kinds`
    /// (drop, delay, duplicate, reorder).
    fn hop(
        &mut self,
        chan: (u8, usize, u32),
        kinds: [Fault; 4],
    ) -> (Option<Duration>, Option<Duration>) {
        let base = self.now + Duration::from_micros(self.rng.random_range(200..3_000));
        let fifo = |w: &mut Self| {
            let at = base.max(w.channels.get(&chan).copied().unwrap_or_default());
            w.channels.insert(chan, at);
            at
        };
        if !self.faulting() {
            return (Some(fifo(self)), None);
        }
        let r: f64 = self.rng.random();
        let n = self.cfg.net;
        let bounds = [
            n.drop,
            n.drop + n.delay,
            n.drop + n.delay + n.duplicate,
            n.drop + n.delay + n.duplicate + n.reorder,
        ];
        let kind = bounds
            .iter()
            .position(|b| r < *b)
            .filter(|k| self.on(kinds[*k]));
        if let Some(k) = kind {
            self.count(kinds[k]);
        }
        match kind {
            Some(0) => (None, None),
            Some(1) => (Some(base + self.ms(200, 4_000)), None),
            Some(2) => {
                let first = fifo(self);
                let again = first + self.ms(0, 50);
                (Some(first), Some(again))
            }
            Some(3) => (Some(base + self.ms(5, 60)), None),
            _ => (Some(fifo(self)), None),
        }
    }

    /// Whether faults of kind `f` are injected in this run.
    fn on(&self, f: Fault) -> bool {
        !self.without.contains(&f)
    }

    /// Runs until every published message is acknowledged (or terminated),
    /// no commit is in flight and every relay passed the outbox's last
    /// effect with nothing parked, or until the deadline. Returns whether it
    /// finished.
    pub fn run(&mut self) -> bool {
        while let Some(((t, _), ev)) = self.queue.pop_first() {
            if t > self.cfg.deadline {
                return false;
            }
            self.dispatch(t, ev);
            if self.done() {
                return true;
            }
        }
        false
    }

    /// Handles `ev`, due at `t`: dropped when it belongs to an incarnation
    /// that crashed (a commit it sent still reaches the server), put off
    /// while its process is paused.
    fn dispatch(&mut self, t: Duration, ev: Ev) {
        self.now = t;
        self.steps += 1;
        if let Some((s, inc)) = ev.process() {
            let slot = &self.slots[s];
            if slot.inc != inc || slot.proc.is_none() {
                // For an incarnation that crashed: a commit it sent still
                // reaches the server (unless the crash aborted it).
                if let Ev::CommitDone(_, _, _, id) = ev {
                    if let Some(c) = self.inflight.remove(&id) {
                        let r = self.commit(&c.writes);
                        self.log(|| format!("commit {id} of a crashed process: {r:?}"));
                    }
                }
                return;
            }
            if slot.paused_until > t {
                let until = slot.paused_until;
                self.at(until, ev);
                return;
            }
        }
        self.handle(ev);
    }

    fn done(&self) -> bool {
        self.published == self.stream.len()
            && self.inflight.is_empty()
            && self
                .partitions
                .iter()
                .all(|p| p.acked.len() + p.terminated.len() == p.log.len())
            && self.relays_drained()
    }

    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Publish(i) => {
                let p = partition::partition_of(self.stream.body(i), self.cfg.partitions);
                let seq = self.partitions[p as usize].publish(i);
                self.placed[i] = (p, seq);
                self.published += 1;
                self.serve(p);
            }
            Ev::Restart(s) => self.start(s),
            Ev::Scan(s, _, after) => self.scan(s, &after),
            Ev::Tick(s, _) => self.tick(s),
            Ev::LeaseAt(s, inc, round) => self.lease_at(s, inc, round),
            Ev::LeaseAnswer(s, _, round) => self.lease_answer(s, *round),
            Ev::AcquireAt(s, inc, a) => self.acquire_at(s, inc, a),
            Ev::AcquireAnswer(s, _, a) => self.acquire_answer(s, *a),
            Ev::InfoAt(s, inc, p) => self.info_at(s, inc, p),
            Ev::InfoAnswer(s, _, p, busy) => self.info_answer(s, p, busy),
            Ev::PullAt(p, pull) => {
                self.partitions[p as usize].pulls.push_back(pull);
                self.at(pull.expires, Ev::Broker(p));
                self.serve(p);
            }
            Ev::Broker(p) => {
                for id in self.partitions[p as usize].expire_pulls(self.now) {
                    self.end_pull(id);
                }
                self.serve(p);
            }
            Ev::Msg(addr, pull, a) => self.arrive(addr, pull, a),
            Ev::PullEnd(addr, pull) => {
                let (s, _, p) = addr;
                if let Some(w) = self.worker(s, p) {
                    if let Some((id, ended)) = &mut w.pull {
                        if *id == pull {
                            *ended = true;
                        }
                    }
                }
                self.advance(s, p);
                self.drain(s);
            }
            Ev::Ack(p, seq, kind) => {
                let ack_wait = self.cfg.ack_wait;
                if self.partitions[p as usize].ack(seq, kind, self.now, ack_wait) {
                    self.log(|| format!("broker p{p} seq {seq}: {kind:?}"));
                }
                if let AckKind::Nak(d) = kind {
                    self.after(d, Ev::Broker(p));
                }
                self.serve(p);
            }
            Ev::CommitDone(s, _, shard, id) => self.commit_done(s, shard, id),
            Ev::ReloadDone(s, _, shard) => self.reload_done(s, shard),
            Ev::FetchDone(s, _, shard) => self.fetch_done(s, shard),
            Ev::Progress(addr, batch) => {
                let (s, _, p) = addr;
                let Some(w) = self.worker(s, p) else { return };
                let Some(d) = &w.deciding else { return };
                if d.batch != batch {
                    return;
                }
                let seqs: Vec<u64> = d.messages.iter().map(|a| a.seq).collect();
                for seq in seqs {
                    self.send_ack(s, p, seq, AckKind::Progress);
                }
                let every = (self.cfg.ack_wait / 3).max(Duration::from_millis(100));
                self.after(every, Ev::Progress(addr, batch));
            }
            Ev::Heard(s, _, member) => {
                let now = self.now;
                if let Some(proc) = &mut self.slots[s].proc {
                    proc.heard.insert(member, now);
                }
            }
            Ev::Inject(f) => self.inject(f),
            Ev::Relay(r, inc, ev) => self.relay_event(r, inc, ev),
            Ev::RelayRestart(r) => self.relay_restart(r),
            Ev::RelayFault(r, f) => self.relay_fault(r, f),
            Ev::Recon(s, inc, ev) => self.recon_event(s, inc, ev),
        }
    }

    fn inject(&mut self, f: Fault) {
        let s = self.rng.random_range(0..self.cfg.processes);
        if !self.on(f) {
            return;
        }
        match f {
            Fault::Crash if self.slots[s].proc.is_some() => {
                self.count(f);
                self.crash(s);
            }
            Fault::CrashAfterAnswer if self.slots[s].proc.is_some() => {
                // Counted when it fires.
                self.log(|| format!("m{s}: crashes right after its next answer"));
                self.slots[s].crash_after_answer = true;
            }
            Fault::Pause if self.slots[s].proc.is_some() => {
                self.count(f);
                let ttl = self.cfg.lease_ttl.as_millis() as u64;
                let d = self.ms(ttl + 500, 3 * ttl);
                self.log(|| format!("m{s}: paused for {d:?} (past its lease)"));
                self.slots[s].paused_until = self.now + d;
            }
            Fault::LeaseExpiry => {
                let p = self.rng.random_range(0..self.cfg.partitions);
                if self.kv.drop_key(&format!("p.{p}")) {
                    self.count(f);
                    self.expired_early.insert(p, self.now);
                    self.log(|| format!("lease p.{p} expired early"));
                }
            }
            Fault::ClockSkew => {
                self.count(f);
                let skew = self.rng.random_range(-1_800_000..=1_800_000);
                self.log(|| format!("m{s}: wall clock skewed by {skew} ms"));
                self.slots[s].skew_ms = skew;
            }
            Fault::StoreFull => {
                self.count(f);
                let d = self.ms(500, 6_000);
                self.log(|| format!("store: disk full for {d:?}"));
                self.full_until = self.now + d;
            }
            _ => {}
        }
    }

    fn crash(&mut self, s: usize) {
        let Some(proc) = self.slots[s].proc.take() else {
            return;
        };
        self.log(|| format!("m{s}#{}: crashed", proc.inc));
        // A commit in flight reached the server or not.
        for id in proc.commits.keys() {
            if self.rng.random_bool(0.5) {
                self.inflight.remove(id);
            }
        }
        let d = self.ms(200, 4_000);
        self.after(d, Ev::Restart(s));
    }

    /// Process `s` dies right after it answered a batch (its
    /// acknowledgements are on their way): nothing else it sent commits
    /// (its commits in flight are aborted with the connection), and it
    /// restarts.
    fn crash_after_answer(&mut self, s: usize, seqs: &[u64]) {
        let Some(proc) = self.slots[s].proc.take() else {
            return;
        };
        self.count(Fault::CrashAfterAnswer);
        self.slots[s].crash_after_answer = false;
        self.log(|| {
            format!(
                "m{s}#{}: crashed right after answering seq {seqs:?}",
                proc.inc
            )
        });
        for id in proc.commits.keys() {
            self.inflight.remove(id);
        }
        let d = self.ms(200, 4_000);
        self.after(d, Ev::Restart(s));
    }

    /// Commits `writes` to the store, and checks that every object a
    /// committed variant paused is still paused in it (nothing reconciles in
    /// a run): a variant's pause is part of its commit, so no commit,
    /// crash or restart may leave such an object running.
    fn commit(&mut self, writes: &[Write]) -> Result<(), StoreError> {
        let at = {
            let mut store = self.store.get();
            store.commit(writes)?;
            store.commits
        };
        for w in writes {
            if let Write::Variant(v) = w {
                // A variant is of a recorded first record: the receipt of its
                // event is stored by the time (or in the commit) it is.
                if self.store.get().receipt(&v.event_id).is_none() {
                    let problem = format!(
                        "the variant {:032x} of {} (naming {}) was committed in the store's transaction {at} before \
                         any first record of its event",
                        v.fingerprint, v.event_id, v.object_id
                    );
                    self.log(|| problem.clone());
                    self.record.problems.push(problem);
                }
                for o in self.named.get(&v.event_id).into_iter().flatten() {
                    self.record
                        .paused_by
                        .entry(o.clone())
                        .or_insert_with(|| (v.event_id.clone(), at));
                }
            }
        }
        let running = {
            let store = self.store.get();
            self.record.running(|o| store.object(o).map(|r| r.paused))
        };
        self.report_running(|| format!("after the store's transaction {at}"), running);
        Ok(())
    }

    /// Records a problem for each object of `running` (see
    /// [`Record::running`]), once per object.
    fn report_running(&mut self, when: impl Fn() -> String, running: Vec<Arc<str>>) {
        for o in running {
            let Some((event, at)) = self.record.paused_by.get(&o) else {
                continue;
            };
            let problem = format!(
                "{o} is running {}, but the variant of {event} committed in the store's transaction {at} paused it",
                when()
            );
            if let Some(t) = &mut self.trace {
                t.push(format!("{:>10.3}s {problem}", self.now.as_secs_f64()));
            }
            self.record.problems.push(problem);
            self.record.unpaused.insert(o);
        }
    }

    fn wall(&self, s: usize) -> SystemTime {
        let skew = self.slots[s].skew_ms;
        let at = self.epoch + self.now;
        if skew >= 0 {
            at + Duration::from_millis(skew as u64)
        } else {
            at - Duration::from_millis(skew.unsigned_abs())
        }
    }

    /// Starts (or restarts) process `s` as the receiver's builder does:
    /// its objects seeded in the store, everything loaded, resumed.
    fn start(&mut self, s: usize) {
        if self.slots[s].proc.is_some() {
            return;
        }
        let clock = Arc::new(ManualClock::new(self.wall(s)));
        let ctx = Context::new(self.stream.config(self.cfg.shards), clock.clone());
        let mut shards: Vec<Shard> = (0..self.cfg.shards).map(|_| Shard::new()).collect();
        // The builder's start-up, through the core's: the seed rows, the
        // store's resume (one object source per shard and one for the
        // filter's scan when it gives sources), bounds before the resume.
        let mut rows = Vec::new();
        for i in 0..self.stream.spec().objects {
            let id = Stream::object_id(i);
            match Shard::seed_row(&ctx, &id, 0, &Stream::initial_state(i)) {
                Ok(row) => rows.push(row),
                Err(e) => {
                    self.record
                        .problems
                        .push(format!("initial state of {id}: {e}"));
                    return;
                }
            }
        }
        let seeds: Vec<Write> = seed_rows(rows).into_iter().map(Write::Seed).collect();
        if self.now < self.full_until {
            self.log(|| format!("m{s}: start failed (store full): again in 1 s"));
            self.after(Duration::from_secs(1), Ev::Restart(s));
            return;
        }
        let since = clock
            .now()
            .checked_sub(ctx.config().retention)
            .unwrap_or(std::time::UNIX_EPOCH);
        let scans = usize::from(self.cfg.identity_filter);
        let resumed = self
            .commit(&seeds)
            .and_then(|()| resume_from(&mut *self.store.get(), since, self.cfg.shards + scans));
        let mut resumed = match resumed {
            Ok(r) => r,
            Err(e) => {
                self.record.problems.push(format!("m{s}: start: {e}"));
                return;
            }
        };
        // The control: a restarted process knows no receipt.
        if self.control == Control::RedeliveryWithoutReceipt && self.slots[s].inc > 0 {
            resumed.loaded.receipts.clear();
            resumed.loaded.variants.clear();
            resumed.sources = resumed.sources.map(|sources| {
                sources
                    .into_iter()
                    .map(|source| Box::new(Forgetful(source)) as Box<dyn ObjectSource>)
                    .collect()
            });
        }
        let read: BTreeMap<Arc<str>, bool> = resumed
            .loaded
            .objects
            .iter()
            .map(|o| (o.object_id.clone(), o.paused))
            .collect();
        let inc = self.slots[s].inc;
        let running = self.record.running(|o| read.get(o).copied());
        self.report_running(
            || format!("as m{s} loads it to start (incarnation {})", inc + 1),
            running,
        );
        let bounds = self.cfg.bounds.unwrap_or(Bounds {
            objects: usize::MAX,
            identities: usize::MAX,
        });
        let (sources, scan) = match start_shards(&ctx, &mut shards, resumed, bounds) {
            Ok(sources) => (sources.shards, sources.scans.into_iter().next()),
            Err(e) => {
                self.record.problems.push(format!("m{s}: resume: {e}"));
                return;
            }
        };
        // The filter of stored identities: tracked before any eviction,
        // ready once its scan read every page.
        let scan = scan.map(|source| {
            let filter = Arc::new(IdentityFilter::new(
                SCAN_FILTER_CAPACITY,
                ctx.config().retention,
                self.rng.random(),
            ));
            ctx.registry().track_stored(filter.clone());
            Scan {
                source,
                filter,
                since,
            }
        });
        let slot = &mut self.slots[s];
        slot.inc += 1;
        // Half the restarts keep the member name (a restart adopts its own
        // live lease), half take a new one.
        if slot.inc > 1 && self.rng.random_bool(0.5) {
            slot.renamed += 1;
        }
        let slot = &self.slots[s];
        let member = if slot.renamed == 0 {
            format!("m{s}")
        } else {
            format!("m{s}r{}", slot.renamed)
        };
        let inc = slot.inc;
        self.log(|| format!("{member}#{inc}: started"));
        let proc = Proc {
            inc,
            member,
            clock,
            set: ShardSet::durable(ctx, shards, Wakes::new(self.cfg.shards)),
            drives: (0..self.cfg.shards)
                .map(|i| Drive {
                    pipeline: Pipeline::new(i),
                    commit: None,
                    reloading: None,
                    fetching: None,
                })
                .collect(),
            sources,
            answers: Rc::new(RefCell::new(Vec::new())),
            book: LeaseBook::default(),
            heard: BTreeMap::new(),
            workers: BTreeMap::new(),
            first_tick_done: false,
            commits: BTreeMap::new(),
            scan,
        };
        let scanning = proc.scan.is_some();
        self.slots[s].proc = Some(proc);
        self.after(Duration::ZERO, Ev::Tick(s, inc));
        if scanning {
            let d = self.ms(1, 5);
            self.after(d, Ev::Scan(s, inc, Arc::from("")));
        }
        self.recon_attach(s, inc);
    }

    /// One page of process `s`'s start-up scan ([`IdentityFilter::scan_page`]);
    /// the next one a few milliseconds later, until the filter is ready.
    fn scan(&mut self, s: usize, after: &str) {
        let Some(proc) = self.slots[s].proc.as_mut() else {
            return;
        };
        let (inc, now) = (proc.inc, proc.clock.now());
        let Some(scan) = proc.scan.as_mut() else {
            return;
        };
        match scan
            .filter
            .scan_page(&mut *scan.source, after, scan.since, SCAN_PAGE, now)
        {
            Ok((_, Some(next))) => {
                let d = self.ms(1, 5);
                self.after(d, Ev::Scan(s, inc, next));
            }
            Ok((read, None)) => {
                proc.scan = None;
                self.log(|| format!("m{s}: identity filter ready (last page: {read})"));
            }
            Err(e) => {
                self.record.problems.push(format!("m{s}: scan: {e}"));
                proc.scan = None;
            }
        }
    }

    fn proc(&mut self, s: usize) -> Option<&mut Proc> {
        self.slots[s].proc.as_mut()
    }

    fn worker(&mut self, s: usize, p: u32) -> Option<&mut Worker> {
        self.slots[s].proc.as_mut()?.workers.get_mut(&p)
    }

    /// A request's trip to the lease bucket (or the consumer's info) or its
    /// answer's trip back: 0.2 to 3 ms; during the fault phase, now and then
    /// 0.2 to 2 s more (a renewal written long after it was sent).
    fn kv_hop(&mut self) -> Duration {
        let base = Duration::from_micros(self.rng.random_range(200..3_000));
        if self.faulting()
            && self.rng.random_bool(self.cfg.net.lease_delay)
            && self.on(Fault::LeaseRequestDelay)
        {
            self.count(Fault::LeaseRequestDelay);
            return base + self.ms(200, 2_000);
        }
        base
    }

    /// The consumer's lease loop (src/jetstream/consume.rs), one round:
    /// finished workers give their partitions back (not a lost one's: it
    /// may be someone else's), the heartbeat and the renewals of the running
    /// workers' leases are sent.
    fn tick(&mut self, s: usize) {
        let now = self.now;
        let wall = self.wall(s);
        let Some(proc) = self.slots[s].proc.as_mut() else {
            return;
        };
        proc.clock.set(wall);
        let inc = proc.inc;
        let finished: Vec<u32> = proc
            .workers
            .iter()
            .filter(|(_, w)| w.finished)
            .map(|(p, _)| *p)
            .collect();
        let mut releases = Vec::new();
        for p in finished {
            let w = proc.workers.remove(&p).expect("present");
            if !w.lost {
                if let Some(revision) = proc.book.release(p) {
                    releases.push((p, revision));
                }
            }
        }
        let renewals: Vec<(u32, u64)> = proc
            .workers
            .iter()
            .filter(|(_, w)| !w.lost)
            .filter_map(|(p, _)| Some((*p, proc.book.revision(*p)?)))
            .collect();
        let round = Round {
            sent: now,
            member: proc.member.clone(),
            releases,
            renewals,
            renewed: Vec::new(),
        };
        let d = self.kv_hop();
        self.after(d, Ev::LeaseAt(s, inc, Box::new(round)));
    }

    /// At the bucket: a round's heartbeat (the other members' watches hear
    /// of it), releases and renewals (a compare-and-set on the revision; an
    /// unconditional put under the fence control).
    fn lease_at(&mut self, s: usize, inc: u32, mut round: Box<Round>) {
        let now = self.now;
        let member = round.member.clone();
        self.kv.put(&format!("m.{member}"), &member, now);
        for q in 0..self.cfg.processes {
            if q != s {
                if let Some(other) = &self.slots[q].proc {
                    let to = other.inc;
                    let d = Duration::from_micros(self.rng.random_range(200..3_000));
                    self.after(d, Ev::Heard(q, to, member.clone()));
                }
            }
        }
        for (p, revision) in std::mem::take(&mut round.releases) {
            self.kv
                .delete_expect_revision(&format!("p.{p}"), revision, now);
            self.log(|| format!("{member}: released p{p}"));
        }
        for &(p, revision) in &round.renewals {
            let key = format!("p.{p}");
            let renewed = if self.control == Control::FenceIgnoresRevision {
                Some(self.kv.put(&key, &member, now))
            } else {
                self.kv.update(&key, &member, revision, now)
            };
            round.renewed.push((p, renewed));
        }
        let d = self.kv_hop();
        self.after(d, Ev::LeaseAnswer(s, inc, round));
    }

    /// Back at the process: the renewed fences are extended from when the
    /// renewal was sent, the lost workers stopped, and so are those no
    /// longer meant for this member; the free partitions meant for it are
    /// asked for (not on the first round, so that processes starting
    /// together hear of each other first).
    fn lease_answer(&mut self, s: usize, round: Round) {
        let now = self.now;
        let ttl = self.kv.ttl;
        let Some(proc) = self.slots[s].proc.as_mut() else {
            return;
        };
        let mut lost = Vec::new();
        for (p, renewed) in round.renewed {
            if proc.book.renewed(p, renewed) {
                if let Some(w) = proc.workers.get_mut(&p) {
                    w.lost = true;
                    w.stop = true;
                }
                lost.push(p);
            } else if let Some(w) = proc.workers.get(&p) {
                w.fence.extend(round.sent, ttl);
            }
        }
        let members = partition::live_members(proc.heard.iter(), &proc.member, now, ttl);
        for (p, w) in proc.workers.iter_mut() {
            if !partition::meant_for(&proc.member, *p, &members) {
                w.stop = true;
            }
        }
        let wanted: Vec<u32> = (0..self.cfg.partitions)
            .filter(|p| {
                proc.first_tick_done
                    && !proc.workers.contains_key(p)
                    && partition::meant_for(&proc.member, *p, &members)
            })
            .collect();
        proc.first_tick_done = true;
        let (inc, member) = (proc.inc, proc.member.clone());
        for p in lost {
            self.log(|| format!("{member}: lost p{p}"));
        }
        if wanted.is_empty() {
            self.end_round(s, inc, round.sent);
            return;
        }
        let acquire = Acquire {
            sent: now,
            round: round.sent,
            member,
            wanted,
            taken: Vec::new(),
        };
        let d = self.kv_hop();
        self.after(d, Ev::AcquireAt(s, inc, Box::new(acquire)));
    }

    /// At the bucket: each wanted lease created, or adopted when it still
    /// names this member (a restart under the same name).
    fn acquire_at(&mut self, s: usize, inc: u32, mut a: Box<Acquire>) {
        let now = self.now;
        for &p in &a.wanted {
            let key = format!("p.{p}");
            let revision = match self.kv.create(&key, &a.member, now) {
                Some(r) => Some(r),
                None => match self.kv.entry(&key, now) {
                    Some(e) if partition::adoptable(e.value.as_bytes(), &a.member) => {
                        self.kv.update(&key, &a.member, e.revision, now)
                    }
                    _ => None,
                },
            };
            if let Some(r) = revision {
                a.taken.push((p, r));
            }
        }
        let d = self.kv_hop();
        self.after(d, Ev::AcquireAnswer(s, inc, a));
    }

    /// Back at the process: a worker for each partition taken, fenced from
    /// when the request was sent; it asks the consumer's info before it
    /// pulls (`InOrder::taking_over`).
    fn acquire_answer(&mut self, s: usize, a: Acquire) {
        let ttl = self.kv.ttl;
        let expires = self.expires();
        let Some(proc) = self.slots[s].proc.as_mut() else {
            return;
        };
        let inc = proc.inc;
        for &(p, revision) in &a.taken {
            proc.book.took(p, revision);
            let fence = Fence::new(a.sent);
            fence.extend(a.sent, ttl);
            proc.workers.insert(
                p,
                Worker {
                    fence,
                    stop: false,
                    lost: false,
                    finished: false,
                    starting: true,
                    order: InOrder::taking_over(true, a.sent, expires),
                    pull: None,
                    inbox: Vec::new(),
                    deciding: None,
                },
            );
        }
        for &(p, revision) in &a.taken {
            self.log(|| format!("{}: took p{p} (revision {revision})", a.member));
            let d = self.kv_hop();
            self.after(d, Ev::InfoAt(s, inc, p));
        }
        self.end_round(s, inc, a.round);
    }

    /// At the broker: the consumer's info, for a worker taking over.
    fn info_at(&mut self, s: usize, inc: u32, p: u32) {
        let part = &self.partitions[p as usize];
        let busy = partition::busy(part.num_ack_pending(), part.num_waiting());
        let d = self.kv_hop();
        self.after(d, Ev::InfoAnswer(s, inc, p, busy));
    }

    /// Back at the worker: it starts, gated when the partition was busy.
    fn info_answer(&mut self, s: usize, p: u32, busy: bool) {
        let now = self.now;
        let expires = self.expires();
        // The control: the gate always open.
        let busy = busy && self.control != Control::NoTakeoverGate;
        let Some(w) = self.worker(s, p) else { return };
        if !w.starting {
            return;
        }
        w.starting = false;
        w.order = InOrder::taking_over(busy, now, expires);
        self.log(|| format!("m{s} p{p}: worker starts (gated {busy})"));
        self.advance(s, p);
        self.drain(s);
    }

    /// The next round starts a quarter TTL after this one did, or at once
    /// when this one took longer (tokio's `MissedTickBehavior::Delay`).
    fn end_round(&mut self, s: usize, inc: u32, started: Duration) {
        let every = (self.kv.ttl / 4).max(Duration::from_millis(50));
        let at = (started + every).max(self.now);
        self.at(at, Ev::Tick(s, inc));
    }

    /// How long a pull waits at the broker: it outlives a negative
    /// acknowledgement's delay.
    fn expires(&self) -> Duration {
        self.cfg
            .pull_expires
            .max(self.cfg.retry_delay + Duration::from_millis(500))
    }

    /// Sends an acknowledgement of `seq` to the broker over the network.
    fn send_ack(&mut self, s: usize, p: u32, seq: u64, kind: AckKind) {
        let (first, again) = self.hop(
            (1, s, p),
            [
                Fault::AckDrop,
                Fault::AckDelay,
                Fault::AckDuplicate,
                Fault::AckReorder,
            ],
        );
        for at in [first, again].into_iter().flatten() {
            self.at(at, Ev::Ack(p, seq, kind));
        }
    }

    /// The broker serves partition `p`'s waiting pulls.
    fn serve(&mut self, p: u32) {
        let (ack_wait, max) = (self.cfg.ack_wait, self.cfg.max_in_flight);
        let now = self.now;
        let rng = &mut self.rng;
        let (handed, served) =
            self.partitions[p as usize].serve(now, ack_wait, max, |n| rng.random_range(0..n));
        for h in handed {
            let Some(&addr) = self.pulls.get(&h.pull) else {
                continue;
            };
            let index = self.partitions[p as usize].log[h.seq as usize - 1];
            let a = Arrived {
                seq: h.seq,
                delivered: h.delivered,
                index,
            };
            let (first, again) = self.hop(
                (0, addr.0, addr.2),
                [
                    Fault::DeliveryDrop,
                    Fault::DeliveryDelay,
                    Fault::DeliveryDuplicate,
                    Fault::DeliveryReorder,
                ],
            );
            for at in [first, again].into_iter().flatten() {
                self.at(at, Ev::Msg(addr, h.pull, a));
            }
        }
        for id in served {
            self.end_pull(id);
        }
        if let Some(due) = self.partitions[p as usize].next_due() {
            if due > self.now {
                self.at(due, Ev::Broker(p));
            }
        }
    }

    fn end_pull(&mut self, id: u64) {
        if let Some(addr) = self.pulls.remove(&id) {
            // After the pull's messages on the same connection.
            let base = self.now + Duration::from_micros(self.rng.random_range(200..3_000));
            let chan = (0, addr.0, addr.2);
            let at = base.max(self.channels.get(&chan).copied().unwrap_or_default());
            self.channels.insert(chan, at);
            self.at(at, Ev::PullEnd(addr, id));
        }
    }

    fn arrive(&mut self, addr: Addr, pull: u64, a: Arrived) {
        let (s, _, p) = addr;
        let Some(w) = self.worker(s, p) else { return };
        // A message for a pull this worker no longer reads is lost to it:
        // it waits out the ack wait at the broker.
        let current = w.pull.is_some_and(|(id, _)| id == pull);
        self.log(|| {
            format!(
                "m{s} p{p}: seq {} arrives (pull {pull}{})",
                a.seq,
                if current { "" } else { ", no longer read" }
            )
        });
        let Some(w) = self.worker(s, p) else { return };
        if current {
            w.inbox.push(a);
            self.advance(s, p);
            self.drain(s);
        }
    }

    /// Runs worker `p` of process `s` until it waits (for a pull's
    /// messages, or for its batch's commit): `run_partition`'s loop.
    fn advance(&mut self, s: usize, p: u32) {
        let now = self.now;
        let cfg = self.cfg;
        loop {
            let Some(w) = self.worker(s, p) else { return };
            if w.finished || w.starting || w.deciding.is_some() {
                return;
            }
            if let Some((id, ended)) = w.pull {
                if !w.inbox.is_empty() {
                    let n = w.inbox.len().min(cfg.batch.max(1));
                    let chunk: Vec<Arrived> = w.inbox.drain(..n).collect();
                    for a in chunk {
                        w.order.arrive(a.seq, a);
                    }
                    if w.fence.holds(now) {
                        let ready = self.ready(s, p);
                        if !ready.is_empty() {
                            self.decide(s, p, ready);
                            return;
                        }
                    }
                    continue;
                }
                if !ended {
                    return;
                }
                let _ = id;
                w.pull = None;
                // The pull ended: forget overdue owed messages the server no
                // longer counts, then decide what may be.
                if w.order.forget_due(now, cfg.retry_delay, cfg.ack_wait) {
                    let pending = self.partitions[p as usize].num_ack_pending();
                    let w = self.worker(s, p).expect("present");
                    w.order.forget_answer(pending);
                }
                let w = self.worker(s, p).expect("present");
                if w.fence.holds(now) {
                    let ready = self.ready(s, p);
                    if !ready.is_empty() {
                        self.decide(s, p, ready);
                        return;
                    }
                }
                continue;
            }
            if w.stop || !w.fence.holds(now) {
                // Messages still waiting go back at once.
                w.finished = true;
                let waiting = w.order.take_waiting();
                self.log(|| format!("m{s} p{p}: worker stops"));
                for a in waiting {
                    self.send_ack(s, p, a.seq, AckKind::Nak(Duration::ZERO));
                }
                return;
            }
            let room = w.order.room(cfg.max_in_flight);
            if w.order.decide_first(room) {
                let ready = self.ready(s, p);
                if !ready.is_empty() {
                    self.decide(s, p, ready);
                    return;
                }
            }
            let expires = self.expires();
            let id = self.id();
            let inc = self.slots[s].inc;
            let w = self.worker(s, p).expect("present");
            w.pull = Some((id, false));
            self.pulls.insert(id, (s, inc, p));
            let d = Duration::from_micros(self.rng.random_range(200..3_000));
            let pull = Pull {
                id,
                want: room.max(1),
                expires: self.now + d + expires,
            };
            self.after(d, Ev::PullAt(p, pull));
            return;
        }
    }

    /// `InOrder::ready` of the consumer: the gate asked, progress reported.
    fn ready(&mut self, s: usize, p: u32) -> Vec<Arrived> {
        let now = self.now;
        let ack_wait = self.cfg.ack_wait;
        let pending = self.partitions[p as usize].num_ack_pending();
        let w = self.worker(s, p).expect("present");
        if w.order.gate_due(now) {
            w.order.gate_answer(pending);
        }
        let (ready, _) = w.order.take_ready();
        if w.order.progress_due(now, ack_wait) {
            let seqs: Vec<u64> = w.order.waiting_messages().map(|a| a.seq).collect();
            for seq in seqs {
                self.send_ack(s, p, seq, AckKind::Progress);
            }
        }
        ready
    }

    /// The fence's promise (src/jetstream/consume.rs, `Fence`): two members
    /// never decide messages of one partition at the same time. Checked at
    /// each decision of partition `p` by process `s`: no other process's
    /// worker of `p` may hold its fence then, unless the server expired the
    /// lease early within the last TTL (which no fence can see).
    fn check_fence(&mut self, s: usize, p: u32) {
        let now = self.now;
        let excused = self
            .expired_early
            .get(&p)
            .is_some_and(|at| now.saturating_sub(*at) <= self.kv.ttl + Duration::from_secs(1));
        if excused {
            return;
        }
        for q in (0..self.slots.len()).filter(|q| *q != s) {
            let Some(other) = &self.slots[q].proc else {
                continue;
            };
            if other
                .workers
                .get(&p)
                .is_some_and(|w| !w.finished && w.fence.holds(now))
            {
                let problem = format!(
                    "at {:.3}s m{s} decides partition {p} while m{q}'s fence on it holds",
                    now.as_secs_f64()
                );
                self.log(|| problem.clone());
                self.record.problems.push(problem);
            }
        }
    }

    /// Hands a batch to the shards (the receiver's `deliver_batch`: one
    /// `DeliverMany` per shard, in the batch's order).
    fn decide(&mut self, s: usize, p: u32, ready: Vec<Arrived>) {
        self.check_fence(s, p);
        let batch = self.id();
        let inc = self.slots[s].inc;
        let wall = self.wall(s);
        let stream = self.stream;
        if self.trace.is_some() {
            // Each message's seq (and delivery count), delivery, event and
            // object.
            let parser = snapshot_receiver_core::BodyParser::default();
            let seqs: Vec<String> = ready
                .iter()
                .map(|a| {
                    let named = parser.parse(stream.body(a.index)).ok().map(|d| {
                        format!(
                            " d{} {}@{}",
                            a.index,
                            d.event_id().unwrap_or("?"),
                            d.object_id().unwrap_or("?")
                        )
                    });
                    let named = named.unwrap_or_default();
                    match a.delivered {
                        1 => format!("{}{named}", a.seq),
                        n => format!("{}(x{n}){named}", a.seq),
                    }
                })
                .collect();
            self.log(|| format!("m{s} p{p}: decide [{}]", seqs.join(", ")));
        }
        let proc = self.slots[s].proc.as_mut().expect("running");
        proc.clock.set(wall);
        let mut by_shard: BTreeMap<usize, (Vec<_>, Vec<usize>)> = BTreeMap::new();
        let mut problems = Vec::new();
        for (pos, a) in ready.iter().enumerate() {
            match proc.set.ctx().parser().parse(stream.body(a.index)) {
                Ok(d) => {
                    let shard = proc.set.route(d.object_id());
                    let e = by_shard.entry(shard).or_default();
                    e.0.push(d);
                    e.1.push(pos);
                }
                Err(e) => problems.push(format!("delivery {}: {e}", a.index)),
            }
        }
        let w = proc.workers.get_mut(&p).expect("present");
        w.deciding = Some(Deciding {
            batch,
            messages: ready.clone(),
            receipts: vec![None; ready.len()],
            left: by_shard.values().map(|(d, _)| d.len()).sum(),
        });
        for (shard, (deliveries, positions)) in by_shard {
            let token = Token::Batch {
                answers: proc.answers.clone(),
                batch,
                positions,
            };
            proc.drives[shard]
                .pipeline
                .decide(&proc.set, [Work::DeliverMany(deliveries, token)]);
        }
        self.record.problems.extend(problems);
        if self.control == Control::AckBeforeCommit {
            for a in &ready {
                self.send_ack(s, p, a.seq, AckKind::Ack);
            }
        }
        let every = (self.cfg.ack_wait / 3).max(Duration::from_millis(100));
        self.after(every, Ev::Progress((s, inc, p), batch));
        self.pump_all(s);
    }

    /// Does what shard `shard`'s pipeline says next ([`Pipeline::next`]),
    /// as the receiver's shard task does: hands a group to the store, or,
    /// woken while the pipeline takes work, decides the queued pauses.
    /// The workers bring their deliveries themselves, so a rejoin brings
    /// nothing, and the intake never drains (a process only crashes).
    fn pump(&mut self, s: usize, shard: usize) {
        loop {
            let id = self.id();
            let Some(proc) = self.proc(s) else { return };
            let d = &mut proc.drives[shard];
            if d.reloading.is_some() {
                return;
            }
            match d.pipeline.next(&proc.set) {
                Next::Commit(writes) => {
                    let inc = proc.inc;
                    let proc = self.proc(s).expect("running");
                    proc.drives[shard].commit = Some(id);
                    proc.commits.insert(id, shard);
                    self.send_commit(s, inc, shard, id, writes);
                    return;
                }
                Next::Fetch(fetch) => {
                    d.fetching = Some(fetch);
                    let inc = proc.inc;
                    let latency = Duration::from_micros(self.rng.random_range(200..3_000));
                    self.after(latency, Ev::FetchDone(s, inc, shard));
                    return;
                }
                Next::Rejoin => d.pipeline.decide(&proc.set, []),
                Next::Wait { wake: true, .. } if proc.set.outlet().take(shard) => {
                    d.pipeline.woken(&proc.set);
                }
                Next::Wait { .. } | Next::Stop => return,
            }
        }
    }

    /// Pumps every shard of process `s` (a commit may have queued a pause
    /// for any of them).
    fn pump_all(&mut self, s: usize) {
        for shard in 0..self.cfg.shards {
            self.pump(s, shard);
        }
    }

    fn send_commit(&mut self, s: usize, inc: u32, shard: usize, id: u64, writes: Vec<Write>) {
        let mut latency = Duration::from_micros(self.rng.random_range(500..5_000));
        let mut fault = None;
        if self.store_faulting() {
            let c = self.cfg.commit;
            let r: f64 = self.rng.random();
            if r < c.fail {
                fault = Some(Fault::CommitFail);
            } else if r < c.fail + c.stall {
                if self.on(Fault::CommitStall) {
                    latency += self.ms(1_000, 15_000);
                    self.count(Fault::CommitStall);
                }
            } else if r < c.fail + c.stall + c.serialization {
                fault = Some(Fault::SerializationFailure);
            } else if r < c.fail + c.stall + c.serialization + c.lost {
                fault = Some(Fault::LostConnection);
            }
            fault = fault.filter(|f| self.on(*f));
        }
        self.inflight.insert(id, InFlight { writes, fault });
        self.after(latency, Ev::CommitDone(s, inc, shard, id));
    }

    fn commit_done(&mut self, s: usize, shard: usize, id: u64) {
        // Gone if its process crashed before the transaction reached the
        // server; otherwise it commits (or not) whether anyone waits.
        let Some(c) = self.inflight.remove(&id) else {
            return;
        };
        let result = if self.now < self.full_until {
            self.count(Fault::StoreFullRefusal);
            Err(StoreError::Failed(
                "postgres: could not extend file: No space left on device".to_owned(),
            ))
        } else {
            match c.fault {
                Some(Fault::CommitFail) => {
                    self.count(Fault::CommitFail);
                    Err(StoreError::Failed(
                        "postgres: server closed the connection".to_owned(),
                    ))
                }
                Some(Fault::SerializationFailure) => {
                    self.count(Fault::SerializationFailure);
                    Err(StoreError::Conflict(
                        "postgres: could not serialize access due to concurrent update".to_owned(),
                    ))
                }
                _ => {
                    let r = self.commit(&c.writes);
                    if r.is_ok() && c.fault == Some(Fault::LostConnection) {
                        // Committed, but the answer was lost with the connection.
                        self.count(Fault::LostConnection);
                        Err(StoreError::Failed(
                            "postgres: connection lost after COMMIT was sent".to_owned(),
                        ))
                    } else {
                        r
                    }
                }
            }
        };
        self.log(|| format!("m{s} shard {shard}: commit {id}: {result:?}"));
        let Some(proc) = self.slots[s].proc.as_mut() else {
            return;
        };
        if proc.commits.remove(&id).is_none() {
            return;
        }
        let d = &mut proc.drives[shard];
        d.commit = None;
        if let Some(touched) = d.pipeline.settle(&proc.set, result) {
            d.reloading = Some(touched);
            let inc = proc.inc;
            let lat = Duration::from_micros(self.rng.random_range(500..3_000));
            // The touched rows are read when the reload ends.
            self.after(lat, Ev::ReloadDone(s, inc, shard));
        }
        self.pump_all(s);
        self.drain(s);
    }

    fn reload_done(&mut self, s: usize, shard: usize) {
        let Some(proc) = self.slots[s].proc.as_mut() else {
            return;
        };
        let Some(touched) = proc.drives[shard].reloading.take() else {
            return;
        };
        let proc_inc = proc.inc;
        // The reload may lose its connection too: the refused group is then
        // answered `retry` and what came after it decided again.
        let lost = self.store_faulting()
            && self.rng.random_bool(self.cfg.commit.lost)
            && self.on(Fault::ReloadLost);
        let mut rows = if lost {
            self.count(Fault::ReloadLost);
            Err(StoreError::Failed(
                "postgres: connection lost while reloading".to_owned(),
            ))
        } else {
            reload(&mut self.store.get(), &touched.objects, &touched.receipts)
        };
        self.log(|| {
            format!(
                "m{s} shard {shard}: reloaded: {}",
                if rows.is_ok() {
                    "ok"
                } else {
                    "connection lost"
                }
            )
        });
        if self.control == Control::RedeliveryWithoutReceipt && proc_inc > 1 {
            if let Ok(r) = &mut rows {
                r.receipts.clear();
                r.variants.clear();
            }
        }
        let proc = self.slots[s].proc.as_mut().expect("running");
        proc.drives[shard].pipeline.reloaded(&proc.set, rows);
        self.pump_all(s);
        self.drain(s);
    }

    /// A bounded shard's read ends: the rows as the store holds them now,
    /// or a lost connection, handed to its pipeline as the receiver's
    /// shard task hands them.
    fn fetch_done(&mut self, s: usize, shard: usize) {
        let Some(proc) = self.slots[s].proc.as_mut() else {
            return;
        };
        let Some(fetch) = proc.drives[shard].fetching.take() else {
            return;
        };
        let lost = self.store_faulting()
            && self.rng.random_bool(self.cfg.commit.lost)
            && self.on(Fault::ReadLost);
        let proc = self.slots[s].proc.as_mut().expect("running");
        let rows = if lost {
            Err(StoreError::Failed(
                "postgres: connection lost while reading".to_owned(),
            ))
        } else {
            fetch.read(&mut *proc.sources[shard])
        };
        let ok = rows.is_ok();
        proc.drives[shard].pipeline.fetched(&proc.set, &fetch, rows);
        if lost {
            self.count(Fault::ReadLost);
        }
        self.log(|| {
            format!(
                "m{s} shard {shard}: read {} objects, {} receipts: {}",
                fetch.objects.len(),
                fetch.receipts.len(),
                if ok { "ok" } else { "connection lost" }
            )
        });
        self.pump_all(s);
        self.drain(s);
    }

    /// Hands the answers of the shards to their workers; a worker whose
    /// batch is answered whole acknowledges it and goes on.
    fn drain(&mut self, s: usize) {
        self.recon_drain(s);
        loop {
            let Some(proc) = self.proc(s) else { return };
            let answers: Vec<_> = proc.answers.borrow_mut().drain(..).collect();
            if answers.is_empty() {
                return;
            }
            for (batch, pos, receipt) in answers {
                let Some(proc) = self.proc(s) else { return };
                let Some((&p, w)) = proc
                    .workers
                    .iter_mut()
                    .find(|(_, w)| w.deciding.as_ref().is_some_and(|d| d.batch == batch))
                else {
                    continue;
                };
                let d = w.deciding.as_mut().expect("deciding");
                if d.receipts[pos].replace(receipt).is_none() {
                    d.left -= 1;
                }
                if d.left == 0 {
                    let d = w.deciding.take().expect("deciding");
                    self.answered(s, p, d);
                    self.advance(s, p);
                }
            }
        }
    }

    /// `Step::run` after `deliver_batch` returned: acknowledge, hand back
    /// or terminate each message by its receipt.
    fn answered(&mut self, s: usize, p: u32, d: Deciding) {
        use snapshot_receiver_core::{ConflictKind, Decision};
        let now = self.now;
        let retry_delay = self.cfg.retry_delay;
        let mut variant_answered = false;
        let seqs: Vec<u64> = d.messages.iter().map(|a| a.seq).collect();
        for (a, receipt) in d.messages.into_iter().zip(d.receipts) {
            let Some(receipt) = receipt else { continue };
            variant_answered |=
                receipt.decision() == Some(Decision::Conflict(ConflictKind::EventVariant));
            let w = self.worker(s, p).expect("present");
            match receipt.ack() {
                Ack::Acknowledge => {
                    w.order.settled(a.seq);
                    self.note(a.index, &receipt);
                    self.send_ack(s, p, a.seq, AckKind::Ack);
                }
                Ack::Retry => {
                    let delay = match &receipt.outcome {
                        Outcome::Retry(RetryReason::ShuttingDown) => Duration::ZERO,
                        _ => retry_delay,
                    };
                    w.order.handed_back(a.seq, now);
                    self.log(|| format!("m{s} p{p}: seq {} retry: {:?}", a.seq, receipt.outcome));
                    self.send_ack(s, p, a.seq, AckKind::Nak(delay));
                }
                Ack::Reject => {
                    w.order.settled(a.seq);
                    self.record.problems.push(format!(
                        "delivery {} rejected: {:?}",
                        a.index, receipt.outcome
                    ));
                    self.send_ack(s, p, a.seq, AckKind::Term);
                }
            }
        }
        // A crash right after the answer: armed by a fault, or after half
        // the answers of a variant's conflict during the fault phase (the
        // moment its pause of another object must already be committed).
        let crash = self.slots[s].crash_after_answer
            || (variant_answered
                && self.faulting()
                && self.on(Fault::CrashAfterAnswer)
                && self.rng.random_bool(0.5));
        if crash {
            self.crash_after_answer(s, &seqs);
        }
    }

    /// Records the first committed answer of delivery `index`. A first
    /// record whose commit reached the store while its process was told it
    /// failed (a lost connection, a crash) is answered later as a
    /// `duplicate` of itself: the first answer of a content that is a
    /// duplicate stands for that first record.
    fn note(&mut self, index: usize, receipt: &Receipt) {
        use snapshot_receiver_core::Decision;
        let key = receipt.event_id.clone().zip(self.stream_fingerprint(index));
        let Some(decision) = receipt.decision() else {
            return;
        };
        if self.record.codes[index].is_some() {
            return;
        }
        let first = match (decision, &key) {
            (Decision::Duplicate { .. }, Some(k)) => !self.record.first_answered.contains(k),
            _ => true,
        };
        let code = match decision {
            Decision::Duplicate { original } if first => {
                snapshot_receiver_loadgen::verdict_code(original)
            }
            _ => snapshot_receiver_loadgen::decision_code(receipt),
        };
        // Where the decision falls among the others: a first record when it
        // was committed, any other answer when it was given (after the
        // commits so far).
        self.answers += 1;
        let at = key
            .as_ref()
            .filter(|_| first)
            .and_then(|(e, fp)| self.store.get().recorded_at(e, *fp))
            .map_or(
                (self.store.get().commits, usize::MAX, self.answers),
                |(c, w)| (c, w, 0),
            );
        if let Some(k) = key {
            self.record.first_answered.insert(k);
        }
        self.record.codes[index] = Some(code);
        self.record.order.push((at, index));
    }

    /// The semantic fingerprint of delivery `index`.
    pub fn stream_fingerprint(&self, index: usize) -> Option<u128> {
        crate::fingerprint(self.stream.body(index))
    }
}

/// The rows a shard reloads after a conflict, read as the library's
/// committer reads them (variants first, then objects and receipts).
pub fn reload(
    store: &mut SimStore,
    objects: &[Arc<str>],
    receipts: &[Arc<str>],
) -> Result<Reloaded, StoreError> {
    let variants = store.refresh_variants(receipts)?;
    let (objects, found) = store.refresh(objects, receipts)?;
    Ok(Reloaded {
        objects,
        receipts: found,
        variants,
    })
}
