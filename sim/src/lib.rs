//! A deterministic, seeded, single-threaded simulation of a cluster:
//! several receiver processes, a partitioned JetStream-like broker and a
//! shared PostgreSQL-like store, with crashes, pauses, lost and delayed
//! messages, failing and stalling commits, clock skew and a full disk.
//!
//! - `world`: the processes (started by the core's start-up, as the
//!   receiver's builder starts one, most of them with bounded memory that
//!   reads objects and receipts back from the store; then the core's
//!   shipped [`ShardSet`] and [`Pipeline`], driven by `Pipeline::next`;
//!   each partition worked by the library's [`snapshot_receiver::partition`]
//!   rules as the real consumer works it) and the event queue, ordered by
//!   (time, sequence);
//! - `broker`: durable pull consumers, explicit acks, `max_ack_pending`, ack
//!   wait and redelivery, the lease bucket with revisions and TTL;
//! - `store`: unique receipts and variants, conditional version updates,
//!   transactions that commit whole or not at all;
//! - `world::reconcile`: once the cluster settled, a process started again
//!   on the store runs the reconciler's shipped work queue and applies the
//!   answers through its shards and the store's commits, against a faulty
//!   authority (slow, down, stale, another object, absent), with crashes
//!   and commit faults, and the convergence invariant;
//! - `authority`: the same work queue against the same faults on a model
//!   of the objects alone, on its own virtual clock (many more seeds per
//!   second);
//! - `check`: the invariants, against the load test's sequential model
//!   ([`snapshot_receiver_loadgen::check`]).
//!
//! One seed decides everything (the stream, every delay, every fault), so
//! the same seed replays a run exactly. [`Control`] selects a deliberately
//! broken variant that the invariants must catch.
//!
//! [`ShardSet`]: snapshot_receiver_core::engine::ShardSet
//! [`Pipeline`]: snapshot_receiver_core::engine::Pipeline

#![warn(missing_docs)]

pub mod authority;
pub mod broker;
pub mod check;
pub mod store;
pub mod world;

use rand::{Rng, SeedableRng};
pub use snapshot_receiver_core::engine::Bounds;
use snapshot_receiver_loadgen::{generate, LoadSpec};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// A deliberately broken variant, for the must-fail controls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Control {
    /// The shipped rules.
    None,
    /// Each message is acknowledged as soon as it is handed to the shards,
    /// before its group commits.
    AckBeforeCommit,
    /// A lease is renewed by an unconditional put instead of a
    /// compare-and-set on its revision, so a process paused past its lease
    /// takes it back from the member that took it over.
    FenceIgnoresRevision,
    /// A restarted process decides redeliveries without the store's
    /// receipts: none are loaded at start, none reloaded after a conflict.
    RedeliveryWithoutReceipt,
    /// A worker that takes a partition over decides at once, without
    /// waiting for what the previous holder left unacknowledged (the
    /// take-over gate always open).
    NoTakeoverGate,
    /// A variant's pause of an object another shard owns is not part of
    /// the variant's commit (the store drops `Write::PauseIfStored`): the
    /// object is paused by its owner shard's next group, after the variant
    /// was answered, as before the pause joined the variant's commit.
    PauseAfterAnswer,
    /// A relay saves its cursor (past the effects it read) before its
    /// destination answered them, so a relay that crashes, or whose
    /// attempt is refused, in between never hands them out again.
    RelayCursorBeforeHandler,
    /// A relay reads the outbox by the steps' sequence numbers (numbered
    /// when decided) instead of by position (given at commit), so an
    /// effect whose lower number commits after a higher one is passed.
    RelayReadsByStepNumber,
    /// An operator's rewind drops every effect the relay holds parked, not
    /// only those above the rewind's position: one parked at or below it
    /// is never delivered.
    RewindDropsParked,
    /// A `waiting` effect at the head of its object's queue (the one
    /// before it skipped by an operator) blocks its object as a `failed`
    /// one would, instead of starting its chain: the relay is handed it as
    /// `failed` when it reads its parked effects, and it never goes again.
    WaitingHeadBlocks,
    /// A relay renews its lease once per lease instead of every third of
    /// it: it runs as if its lease were three times as long as the one the
    /// store grants, so a long round (or an idle relay) renews only when
    /// the lease has already lapsed.
    RenewalOncePerLease,
    /// A take-over of a relay's lease keeps its generation (the store
    /// raises it only for an operator's change), so a save of the run it
    /// overtook would be taken after A → B → A.
    TakeoverKeepsGeneration,
    /// An operator's retry of a `failed` effect keeps its attempts (only
    /// its status and due time change), so its schedule does not restart:
    /// its next refusal parks it `failed` again at once.
    RetryKeepsAttempts,
    /// The reconciler applies every authoritative snapshot as forced, so an
    /// answer older than the object (a stale authority) replaces it.
    StaleAuthorityApplied,
    /// The reconciler applies a snapshot of another object to the object it
    /// asked for, instead of ignoring it.
    WrongObjectApplied,
    /// The reconciler never reads the store for what needs an authority
    /// (its scans find nothing): a reconciler started on a store learns of
    /// no need that was there before it.
    ReconcilerSkipsStore,
    /// The reconciler's queue runs on its process's wall clock instead of
    /// a monotonic one: a wall clock stepped back (a skew fault) holds
    /// every backoff, breaker spell and scan back as much.
    ReconcilerOnWallClock,
}

impl Control {
    /// Every must-fail control.
    pub const BROKEN: [Control; 16] = [
        Control::AckBeforeCommit,
        Control::FenceIgnoresRevision,
        Control::RedeliveryWithoutReceipt,
        Control::NoTakeoverGate,
        Control::PauseAfterAnswer,
        Control::RelayCursorBeforeHandler,
        Control::RelayReadsByStepNumber,
        Control::RewindDropsParked,
        Control::WaitingHeadBlocks,
        Control::RenewalOncePerLease,
        Control::TakeoverKeepsGeneration,
        Control::RetryKeepsAttempts,
        Control::StaleAuthorityApplied,
        Control::WrongObjectApplied,
        Control::ReconcilerSkipsStore,
        Control::ReconcilerOnWallClock,
    ];

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Control::None => "none",
            Control::AckBeforeCommit => "ack-before-commit",
            Control::FenceIgnoresRevision => "fence-ignores-revision",
            Control::RedeliveryWithoutReceipt => "redelivery-without-receipt",
            Control::NoTakeoverGate => "no-takeover-gate",
            Control::PauseAfterAnswer => "pause-after-answer",
            Control::RelayCursorBeforeHandler => "relay-cursor-before-handler",
            Control::RelayReadsByStepNumber => "relay-reads-by-step-number",
            Control::RewindDropsParked => "rewind-drops-parked",
            Control::WaitingHeadBlocks => "waiting-head-blocks",
            Control::RenewalOncePerLease => "renewal-once-per-lease",
            Control::TakeoverKeepsGeneration => "takeover-keeps-generation",
            Control::RetryKeepsAttempts => "retry-keeps-attempts",
            Control::StaleAuthorityApplied => "stale-authority-applied",
            Control::WrongObjectApplied => "wrong-object-applied",
            Control::ReconcilerSkipsStore => "reconciler-skips-store",
            Control::ReconcilerOnWallClock => "reconciler-on-wall-clock",
        }
    }

    /// The control named `name`.
    pub fn parse(name: &str) -> Option<Control> {
        [Control::None]
            .into_iter()
            .chain(Control::BROKEN)
            .find(|c| c.name() == name)
    }
}

/// A fault kind, as counted over a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    /// A process crashes (what it had not committed is lost) and restarts.
    Crash,
    /// A process crashes right after it answered a delivery (its
    /// acknowledgement on its way), before anything else it sent commits,
    /// and restarts: armed at a random time for the process's next answer,
    /// and, during the fault phase, after half the answers of a variant's
    /// conflict.
    CrashAfterAnswer,
    /// A process is paused past its lease (the stale-leader case).
    Pause,
    /// A lease key expires before its TTL.
    LeaseExpiry,
    /// One process's wall clock is skewed (up to 30 minutes either way).
    ClockSkew,
    /// The store's disk is full for a while.
    StoreFull,
    /// A commit refused because the disk was full.
    StoreFullRefusal,
    /// A commit fails (nothing committed).
    CommitFail,
    /// A commit stalls for seconds (past the ack wait, at times).
    CommitStall,
    /// A commit meets a serialization failure (a conflict, nothing committed).
    SerializationFailure,
    /// A commit is committed but its connection is lost before the answer.
    LostConnection,
    /// The reload after a conflict loses its connection.
    ReloadLost,
    /// A bounded shard's read of what it misses loses its connection.
    ReadLost,
    /// A message to a worker is lost.
    DeliveryDrop,
    /// A message to a worker is delayed (up to 4 s).
    DeliveryDelay,
    /// A message to a worker arrives twice.
    DeliveryDuplicate,
    /// A message to a worker overtakes or is overtaken by others.
    DeliveryReorder,
    /// An acknowledgement is lost.
    AckDrop,
    /// An acknowledgement is delayed (up to 4 s).
    AckDelay,
    /// An acknowledgement arrives twice.
    AckDuplicate,
    /// An acknowledgement overtakes or is overtaken by others.
    AckReorder,
    /// A request to the lease bucket (a renewal, a take-over) or its answer
    /// takes 0.2 to 2 s more.
    LeaseRequestDelay,
    /// A relay process crashes (what it handed out since its last save is
    /// handed out again) and restarts, waiting for its lease to lapse.
    RelayCrash,
    /// A relay's destination is down for 1 to 8 s: every attempt refused.
    DestinationDown,
    /// A relay's destination refuses an attempt.
    DestinationRefusal,
    /// A relay's attempt gets no answer in time (the destination accepted
    /// it or not): the relay counts it refused.
    DestinationTimeout,
    /// A relay's save commits and loses its answer.
    RelaySaveLost,
    /// A relay's write (its save, the opening of its row) refused because
    /// the disk was full.
    RelayWriteRefused,
    /// An operator rewinds a running relay by 0 to 5 positions (what
    /// follows is handed out again; what it holds parked at or below the
    /// position stays parked).
    OperatorRewind,
    /// An operator skips the first effect a relay holds parked `retrying`
    /// or `failed` (it is never delivered; the effects of its object
    /// waiting behind it go then).
    OperatorSkip,
    /// An operator retries the effects a relay holds parked `failed` (their
    /// schedule exhausted: a relay with a short schedule, in some seeds):
    /// their schedule restarts. After the fault phase the operator retries
    /// every 2 s while the relay holds anything parked.
    OperatorRetry,
    /// The authority answers the reconciler after 1 to 20 s (past the
    /// reconciler's 10 s deadline at times: a timeout).
    AuthoritySlow,
    /// The authority is down (503, with or without `Retry-After`).
    AuthorityDown,
    /// The authority answers a version older than the object.
    AuthorityStale,
    /// The authority answers with a snapshot of another object.
    AuthorityWrongObject,
    /// The authority has no such object (yet) for an object the receiver
    /// does not know.
    AuthorityAbsent,
    /// The process running the reconciler crashes and restarts.
    ReconcilerCrash,
}

impl Fault {
    /// Every kind, in report order.
    pub const ALL: [Fault; 37] = [
        Fault::Crash,
        Fault::CrashAfterAnswer,
        Fault::Pause,
        Fault::LeaseExpiry,
        Fault::ClockSkew,
        Fault::StoreFull,
        Fault::StoreFullRefusal,
        Fault::CommitFail,
        Fault::CommitStall,
        Fault::SerializationFailure,
        Fault::LostConnection,
        Fault::ReloadLost,
        Fault::ReadLost,
        Fault::DeliveryDrop,
        Fault::DeliveryDelay,
        Fault::DeliveryDuplicate,
        Fault::DeliveryReorder,
        Fault::AckDrop,
        Fault::AckDelay,
        Fault::AckDuplicate,
        Fault::AckReorder,
        Fault::LeaseRequestDelay,
        Fault::RelayCrash,
        Fault::DestinationDown,
        Fault::DestinationRefusal,
        Fault::DestinationTimeout,
        Fault::RelaySaveLost,
        Fault::RelayWriteRefused,
        Fault::OperatorRewind,
        Fault::OperatorSkip,
        Fault::OperatorRetry,
        Fault::AuthoritySlow,
        Fault::AuthorityDown,
        Fault::AuthorityStale,
        Fault::AuthorityWrongObject,
        Fault::AuthorityAbsent,
        Fault::ReconcilerCrash,
    ];

    /// The kind named `name` (as [`Fault::name`] spells it).
    pub fn parse(name: &str) -> Option<Fault> {
        Fault::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Crash => "crash-restart",
            Fault::CrashAfterAnswer => "crash-after-answer",
            Fault::Pause => "pause-past-lease",
            Fault::LeaseExpiry => "lease-expired-early",
            Fault::ClockSkew => "clock-skew",
            Fault::StoreFull => "store-full",
            Fault::StoreFullRefusal => "store-full-refused-commit",
            Fault::CommitFail => "commit-fail",
            Fault::CommitStall => "commit-stall",
            Fault::SerializationFailure => "serialization-failure",
            Fault::LostConnection => "lost-connection-after-commit",
            Fault::ReloadLost => "reload-lost-connection",
            Fault::ReadLost => "read-lost-connection",
            Fault::DeliveryDrop => "delivery-drop",
            Fault::DeliveryDelay => "delivery-delay",
            Fault::DeliveryDuplicate => "delivery-duplicate",
            Fault::DeliveryReorder => "delivery-reorder",
            Fault::AckDrop => "ack-drop",
            Fault::AckDelay => "ack-delay",
            Fault::AckDuplicate => "ack-duplicate",
            Fault::AckReorder => "ack-reorder",
            Fault::LeaseRequestDelay => "lease-request-delay",
            Fault::RelayCrash => "relay-crash-restart",
            Fault::DestinationDown => "destination-down",
            Fault::DestinationRefusal => "destination-refused",
            Fault::DestinationTimeout => "destination-timeout",
            Fault::RelaySaveLost => "relay-save-lost-connection",
            Fault::RelayWriteRefused => "relay-write-refused-full",
            Fault::OperatorRewind => "operator-rewind",
            Fault::OperatorSkip => "operator-skip",
            Fault::OperatorRetry => "operator-retry",
            Fault::AuthoritySlow => "authority-slow",
            Fault::AuthorityDown => "authority-down",
            Fault::AuthorityStale => "authority-stale",
            Fault::AuthorityWrongObject => "authority-wrong-object",
            Fault::AuthorityAbsent => "authority-absent",
            Fault::ReconcilerCrash => "reconciler-crash-restart",
        }
    }
}

/// Per-hop network fault rates (fractions of hops, during the fault phase).
#[derive(Clone, Copy, Debug)]
pub struct NetRates {
    /// Lost.
    pub drop: f64,
    /// Delayed by 0.2 to 4 s.
    pub delay: f64,
    /// Delivered twice.
    pub duplicate: f64,
    /// Delayed by 5 to 60 ms (overtaken by later hops).
    pub reorder: f64,
    /// A lease-bucket request or answer delayed by 0.2 to 2 s.
    pub lease_delay: f64,
}

/// Per-commit fault rates (fractions of commits, during the fault phase).
#[derive(Clone, Copy, Debug)]
pub struct CommitRates {
    /// Fails, nothing committed.
    pub fail: f64,
    /// Takes 1 to 15 s.
    pub stall: f64,
    /// A serialization failure (a conflict), nothing committed.
    pub serialization: f64,
    /// Committed, the answer lost with the connection; also the rate of
    /// reloads after a conflict, and of a bounded shard's reads of what it
    /// misses, that lose their connection.
    pub lost: f64,
}

/// The cluster and its timings.
#[derive(Clone, Copy, Debug)]
pub struct SimConfig {
    /// Receiver processes.
    pub processes: usize,
    /// Stream partitions (each one durable consumer).
    pub partitions: u32,
    /// Shards per process.
    pub shards: usize,
    /// Lease TTL (renewed every quarter of it).
    pub lease_ttl: Duration,
    /// The consumers' ack wait.
    pub ack_wait: Duration,
    /// Delay of a negative acknowledgement.
    pub retry_delay: Duration,
    /// How long a pull waits at the broker.
    pub pull_expires: Duration,
    /// `max_ack_pending` per partition.
    pub max_in_flight: usize,
    /// Most messages decided in one batch.
    pub batch: usize,
    /// Mean gap between two publishes, in milliseconds.
    pub publish_gap_ms: u64,
    /// Faults happen only before this time; then the cluster must settle.
    pub fault_phase: Duration,
    /// A run not settled by then fails.
    pub deadline: Duration,
    /// Process-level faults per seed (at least, at most).
    pub faults: (u32, u32),
    /// Network fault rates.
    pub net: NetRates,
    /// Commit fault rates.
    pub commit: CommitRates,
    /// The receiver-wide bounds of each process's memory (the builder's
    /// `working_set` and `identity_cache`): the store gives every shard an
    /// object source and the shards read what they miss on demand. `None`:
    /// every object and identity is loaded at start, as from a store that
    /// cannot open a second connection.
    pub bounds: Option<Bounds>,
    /// With `bounds`: whether each process keeps a filter of stored
    /// identities, built by a start-up scan of the store's receipts (the
    /// builder's `identity_filter`).
    pub identity_filter: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            processes: 3,
            partitions: 4,
            shards: 2,
            lease_ttl: Duration::from_secs(4),
            ack_wait: Duration::from_secs(6),
            retry_delay: Duration::from_secs(1),
            pull_expires: Duration::from_secs(1),
            max_in_flight: 6,
            batch: 4,
            publish_gap_ms: 150,
            fault_phase: Duration::from_secs(30),
            deadline: Duration::from_secs(600),
            faults: (2, 6),
            net: NetRates {
                drop: 0.02,
                delay: 0.02,
                duplicate: 0.02,
                reorder: 0.03,
                lease_delay: 0.02,
            },
            commit: CommitRates {
                fail: 0.03,
                stall: 0.02,
                serialization: 0.03,
                lost: 0.02,
            },
            bounds: None,
            identity_filter: false,
        }
    }
}

/// The semantic fingerprint of a body, as the engine computes it.
pub fn fingerprint(body: &[u8]) -> Option<u128> {
    snapshot_receiver_core::BodyParser::default()
        .parse(body)
        .ok()?
        .fingerprint()
}

/// What one seed's run did.
#[derive(Debug)]
pub struct SeedReport {
    /// The seed.
    pub seed: u64,
    /// Invariants that did not hold (empty: the run passed).
    pub failures: Vec<String>,
    /// Faults injected, by kind.
    pub faults: BTreeMap<Fault, u64>,
    /// Events handled.
    pub steps: u64,
    /// Simulated time at the end.
    pub sim_time: Duration,
    /// Deliveries in the stream.
    pub deliveries: usize,
    /// The trace, when asked for.
    pub trace: Option<Vec<String>>,
    /// Whether every delivery was also first decided in publish order (not
    /// an invariant: see `check`).
    pub publish_order: Vec<String>,
}

/// The cluster of a seed: 2 to 4 processes of 1 to 3 shards, 2 to 6
/// partitions, 1 to 8 messages in flight per partition, batches of 1 to 4;
/// in three seeds of four, bounded memory (1 to 4 objects and 1 to 8
/// first records per process, so that objects and identities leave memory
/// and are read back all the time; a filter of stored identities in half
/// of those seeds); the timings and fault rates of [`SimConfig::default`].
pub fn config_for(seed: u64) -> SimConfig {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0xc1a5_7e25);
    let mut cfg = SimConfig {
        processes: rng.random_range(2..=4),
        partitions: rng.random_range(2..=6),
        shards: rng.random_range(1..=3),
        max_in_flight: rng.random_range(1..=8),
        batch: rng.random_range(1..=4),
        ..SimConfig::default()
    };
    if rng.random_bool(0.75) {
        cfg.bounds = Some(Bounds {
            objects: rng.random_range(1..=4),
            identities: rng.random_range(1..=8),
        });
        cfg.identity_filter = rng.random_bool(0.5);
    }
    cfg
}

/// The stream of a seed: a few objects, each with a few versions, with
/// redeliveries, variants (half of them naming another object than their
/// event's original), equal-version conflicts and unknown objects.
pub fn spec_for(seed: u64) -> LoadSpec {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_5eed);
    LoadSpec {
        objects: rng.random_range(2..=5),
        versions: rng.random_range(3..=6),
        deliveries: None,
        duplicate_rate: 0.25,
        reorder_window: 3,
        variant_rate: 0.1,
        cross_variant_rate: 0.5,
        conflict_rate: 0.2,
        unknown_rate: 0.05,
        payload_bytes: 0,
        seed,
    }
}

/// Runs one seed under `control`; `trace` keeps every step's line.
pub fn run_seed(seed: u64, control: Control, trace: bool) -> SeedReport {
    run_seed_without(seed, control, trace, &BTreeSet::new())
}

/// A failing seed with as few fault kinds as still make it fail: its
/// shortest trace.
#[derive(Debug)]
pub struct Shrunk {
    /// The fault kinds left out.
    pub without: BTreeSet<Fault>,
    /// The run without them (traced); it still fails.
    pub report: SeedReport,
}

/// Shrinks a failing seed: leaves out, one kind at a time, each fault kind
/// the run injected, and keeps it out while the run still fails. `None`
/// when the seed does not fail.
pub fn shrink(seed: u64, control: Control) -> Option<Shrunk> {
    let mut report = run_seed(seed, control, true);
    if report.failures.is_empty() {
        return None;
    }
    let mut without = BTreeSet::new();
    for f in Fault::ALL {
        let derived = [Fault::StoreFullRefusal, Fault::RelayWriteRefused];
        if derived.contains(&f) || !report.faults.contains_key(&f) {
            continue;
        }
        without.insert(f);
        let r = run_seed_without(seed, control, true, &without);
        if r.failures.is_empty() {
            without.remove(&f);
        } else {
            report = r;
        }
    }
    Some(Shrunk { without, report })
}

/// [`run_seed`] with the fault kinds of `without` left out (never
/// injected).
pub fn run_seed_without(
    seed: u64,
    control: Control,
    trace: bool,
    without: &BTreeSet<Fault>,
) -> SeedReport {
    let spec = spec_for(seed);
    let stream = match generate(&spec) {
        Ok(s) => s,
        Err(e) => {
            return SeedReport {
                seed,
                failures: vec![format!("stream: {e}")],
                faults: BTreeMap::new(),
                steps: 0,
                sim_time: Duration::ZERO,
                deliveries: 0,
                trace: None,
                publish_order: Vec::new(),
            }
        }
    };
    let mut world = world::World::new(config_for(seed), control, &stream, seed, trace);
    world.without = without.clone();
    let settled = world.run();
    let mut failures = check::check(&mut world, settled);
    // Then the reconciler, on the store the cluster left (`world::reconcile`).
    if failures.is_empty() {
        failures = world.reconcile_phase(seed);
    }
    SeedReport {
        seed,
        failures,
        faults: std::mem::take(&mut world.faults),
        steps: world.steps,
        sim_time: world.now,
        deliveries: stream.len(),
        trace: world.trace.take(),
        publish_order: std::mem::take(&mut world.publish_order),
    }
}
