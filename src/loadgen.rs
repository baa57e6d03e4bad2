//! Load generation, load driving and the correctness check behind
//! `snapshot-receiver loadtest` and the criterion benches.
//!
//! The flow is: [`generate`] builds a whole [`Stream`] of raw JSON bodies from a
//! [`LoadSpec`] and a seed (not timed), together with an [`Expectation`]
//! computed from the generator's own knowledge of what it emitted; one of the
//! drivers ([`run_receiver`], [`run_global_mutex`], [`run_engine`]) sends the
//! bytes and records one decision per delivery; [`check`] compares what the
//! receiver did with the expectation.
//!
//! # What the check can assert under concurrency
//! Producers race, so the order in which one object's events are decided is
//! not fixed: whether version 7 is `applied` or `stale` depends on whether
//! version 9 was decided first. The generator is built so that everything it
//! asserts is independent of that order:
//! - every version of an object is a distinct event with its own state, so
//!   the highest version wins whatever the order: a non-paused object ends at
//!   its highest delivered version and that event's state, and that event is
//!   always `applied`;
//! - an event that gets a conflicting *variant* (same `event_id`, different
//!   state) is delivered exactly twice (original and variant, never
//!   redelivered): whichever is decided first becomes the first record, the
//!   other is exactly one `conflict (event_variant)`, and the object ends
//!   paused;
//! - an equal-version conflict is a second event at the object's *highest*
//!   version with a different state: the first of the pair to be decided is
//!   `applied` (nothing higher exists), the second exactly one
//!   `conflict (version_state)`, and the object ends paused; such objects get
//!   no variants, so nothing else can pause them first;
//! - redeliveries repeat an event's exact content (byte for byte or
//!   re-encoded): exactly `copies - 1` of them are `duplicate`, each reporting
//!   the verdict the event's first record got;
//! - events for unknown objects are always `held (unknown_object)`.
//!
//! What stays order-dependent (and is therefore only checked for being one of
//! the allowed verdicts) is `applied` vs `stale` vs `held (paused)` for the
//! other events, and the final version of paused objects.

mod durable;

pub use durable::{
    probe_dir, probe_fsync, CommitMs, CpuSplit, StoreReport, StoreRun, WaitShare, FSYNC_PROBE_TIME,
};

use crate::actor::{Config, Context, Counters, ObjectState, Outcome, Receipt, Shard};
use crate::clock::{Clock, ManualClock};
use crate::decision::{ConflictKind, Decision, HoldReason, Verdict};
use crate::envelope::{Delivery, Limits, RejectReason};
use crate::router::{BuildError, Receiver};
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::fmt::Write as _;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// The `occurred_at` every generated event carries (informational only).
const OCCURRED_AT: &str = "2024-01-01T08:00:00Z";

/// What stream to generate. Rates are fractions in `[0, 1)`.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadSpec {
    /// Known objects, created before the run at version 0.
    pub objects: usize,
    /// Events per known object when `deliveries` is `None` (versions 1..=n).
    pub versions: u64,
    /// Exact number of deliveries; when set, events pick a uniformly random
    /// object each, so objects get about `deliveries / objects` versions.
    pub deliveries: Option<usize>,
    /// Fraction of deliveries that are redeliveries of an earlier event.
    pub duplicate_rate: f64,
    /// How far (in positions) a delivery may move from its natural place; a
    /// redelivery or variant lands up to `reorder_window + 64` positions after
    /// its original before that.
    pub reorder_window: usize,
    /// Fraction of events on known objects that also get a conflicting variant
    /// (same `event_id`, different state).
    pub variant_rate: f64,
    /// Fraction of known objects that get an equal-version conflict: a second
    /// event at their highest version with a different state.
    pub conflict_rate: f64,
    /// Fraction of events that name an object the receiver does not know.
    pub unknown_rate: f64,
    /// Target body size in bytes (the state is padded to reach it).
    pub payload_bytes: usize,
    /// Seed of the generator: the same spec and seed give the same bytes.
    pub seed: u64,
}

impl Default for LoadSpec {
    fn default() -> Self {
        Self {
            objects: 10_000,
            versions: 20,
            deliveries: None,
            duplicate_rate: 0.3,
            reorder_window: 64,
            variant_rate: 0.001,
            conflict_rate: 0.001,
            unknown_rate: 0.001,
            payload_bytes: 250,
            seed: 1,
        }
    }
}

/// A [`LoadSpec`] value out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid load spec: {0}")]
pub struct SpecError(pub String);

impl LoadSpec {
    /// Checks the ranges: at least one object, rates in `[0, 1)`, at least one
    /// version or delivery.
    ///
    /// # Errors
    /// A [`SpecError`] naming the first value out of range.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.objects == 0 {
            return Err(SpecError("objects must be at least 1".into()));
        }
        if self.objects > u32::MAX as usize / 2 {
            return Err(SpecError("too many objects".into()));
        }
        if self.payload_bytes > Limits::default().max_body_bytes {
            return Err(SpecError(format!(
                "payload must be at most {} bytes (the receiver's default body limit), got {}",
                Limits::default().max_body_bytes,
                self.payload_bytes
            )));
        }
        for (name, rate) in [
            ("duplicate rate", self.duplicate_rate),
            ("variant rate", self.variant_rate),
            ("conflict rate", self.conflict_rate),
            ("unknown rate", self.unknown_rate),
        ] {
            if !(0.0..1.0).contains(&rate) {
                return Err(SpecError(format!("{name} must be in [0, 1), got {rate}")));
            }
        }
        match self.deliveries {
            Some(0) => Err(SpecError("deliveries must be at least 1".into())),
            Some(d) if d > u32::MAX as usize => Err(SpecError("too many deliveries".into())),
            None if self.versions == 0 => Err(SpecError("versions must be at least 1".into())),
            None if (self.objects as u128) * (self.versions as u128) > u32::MAX as u128 / 2 => {
                Err(SpecError("objects x versions is too large".into()))
            }
            _ => Ok(()),
        }
    }
}

/// The role of one distinct event in the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// Version `n` of a known object.
    Base,
    /// The second event at a known object's highest version (equal-version conflict).
    Twin,
    /// An event naming an unknown object.
    Ghost,
}

/// One distinct event identity the generator emitted.
#[derive(Clone, Copy, Debug)]
struct EventInfo {
    /// Known object index, or ghost index for [`Role::Ghost`].
    object: u32,
    /// Its `object_version`.
    version: u64,
    /// What it is for.
    role: Role,
    /// Whether a conflicting variant of it is delivered too.
    has_variant: bool,
}

/// How one delivery relates to its event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CopyKind {
    /// The event's own content (its first copy in generation order).
    Original,
    /// A conflicting variant: same `event_id`, different state.
    Variant,
    /// A redelivery of the original content, byte for byte.
    Again,
    /// A redelivery of the original content, re-encoded (key order,
    /// whitespace, a transport `attempt` field).
    Reencoded,
}

/// One delivery of the stream.
#[derive(Clone, Copy, Debug)]
struct Sent {
    /// Index into [`Stream::events`].
    event: u32,
    /// Which copy.
    copy: CopyKind,
}

/// What the receiver must end with, computed by the generator from what it
/// emitted. Public fields so that a test can corrupt it and see [`check`] fail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expectation {
    /// Per known object (index = object number): final version (checked when
    /// not paused) and whether it ends paused.
    pub objects: Vec<ExpectedObject>,
    /// Exact decision counts that do not depend on arrival order.
    pub counts: ExpectedCounts,
}

/// The expected end of one known object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpectedObject {
    /// Its highest delivered version (0: no event named it).
    pub version: u64,
    /// Whether it ends paused (a variant or an equal-version conflict).
    pub paused: bool,
}

/// Decision counts that are the same in every interleaving.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpectedCounts {
    /// Deliveries in the stream; each must be decided (no retry, no reject).
    pub deliveries: u64,
    /// `duplicate` decisions: every redelivery.
    pub duplicates: u64,
    /// `conflict (event_variant)`: one per variant.
    pub event_variants: u64,
    /// `conflict (version_state)`: one per equal-version pair.
    pub version_states: u64,
    /// `held (unknown_object)`: every event naming an unknown object.
    pub unknown_objects: u64,
    /// `applied` + `stale` + `held (paused)`: the first decision of every other
    /// event on a known object (the split between them depends on order).
    pub applied_stale_or_paused: u64,
}

/// A generated delivery stream: the raw bodies, in sending order, plus what
/// the generator knows about each of them.
pub struct Stream {
    /// The spec it was generated from.
    spec: LoadSpec,
    /// Every body, back to back.
    bytes: Vec<u8>,
    /// `ends[i]` is the end of body `i` in `bytes` (its start is `ends[i - 1]`).
    ends: Vec<usize>,
    /// Per delivery: which event and which copy.
    sent: Vec<Sent>,
    /// Every distinct event identity.
    events: Vec<EventInfo>,
    /// The expectation computed while generating.
    expectation: Expectation,
}

/// Builds the stream for `spec`. Deterministic: the same spec (seed included)
/// gives the same bytes.
///
/// # Errors
/// [`SpecError`] when the spec is out of range.
pub fn generate(spec: &LoadSpec) -> Result<Stream, SpecError> {
    spec.validate()?;
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);
    let n = spec.objects;
    // Equal-version pairs go to a fixed random subset of objects.
    let pairs = ((n as f64) * spec.conflict_rate).round() as usize;
    let mut is_pair = vec![false; n];
    for i in rand::seq::index::sample(&mut rng, n, pairs.min(n)) {
        is_pair[i] = true;
    }
    let ghosts = if spec.unknown_rate > 0.0 {
        (((n as f64) * spec.unknown_rate).ceil() as usize).max(1)
    } else {
        0
    };
    let target_distinct = spec.deliveries.map(|d| {
        let dups = ((d as f64) * spec.duplicate_rate).round() as usize;
        d - dups.min(d.saturating_sub(1))
    });

    let mut events: Vec<EventInfo> = Vec::new();
    // (position key, event, copy) for every delivery; sorted at the end.
    let mut items: Vec<(f64, u32, CopyKind)> = Vec::new();
    let mut version = vec![0u64; n];
    let mut last_pos = vec![0f64; n];
    let mut ghost_version = vec![0u64; ghosts];
    let mut active: Vec<u32> = (0..n as u32).collect();
    let mut pending_twins = 0usize;
    let mut natural = 0f64;
    let w = spec.reorder_window as f64;
    let spread = w + 64.0;
    // A delivery's position key: its natural place plus a random delay below
    // `jitter`; sorting by key gives the sending order.
    let place = |rng: &mut ChaCha8Rng, pos: f64, jitter: f64| pos + rng.random::<f64>() * jitter;

    loop {
        let used = items.len() + pending_twins;
        if let Some(t) = target_distinct {
            if used >= t {
                break;
            }
        } else if active.is_empty() {
            break;
        }
        let ghost = ghosts > 0 && rng.random::<f64>() < spec.unknown_rate;
        if ghost {
            let g = rng.random_range(0..ghosts);
            ghost_version[g] += 1;
            events.push(EventInfo {
                object: g as u32,
                version: ghost_version[g],
                role: Role::Ghost,
                has_variant: false,
            });
            items.push((
                place(&mut rng, natural, w),
                (events.len() - 1) as u32,
                CopyKind::Original,
            ));
            natural += 1.0;
            continue;
        }
        // With a delivery count, any object; otherwise one that still has
        // versions to go (`slot` is its place in `active`).
        let (o, slot) = if spec.deliveries.is_some() {
            (rng.random_range(0..n), None)
        } else {
            let k = rng.random_range(0..active.len());
            (active[k] as usize, Some(k))
        };
        let first_of_pair = is_pair[o] && version[o] == 0;
        let need = 1 + usize::from(first_of_pair);
        if matches!(target_distinct, Some(t) if used + need > t) {
            break;
        }
        version[o] += 1;
        if let Some(k) = slot.filter(|_| version[o] == spec.versions) {
            active.swap_remove(k);
        }
        if first_of_pair {
            pending_twins += 1;
        }
        let with_variant = !is_pair[o]
            && rng.random::<f64>() < spec.variant_rate
            && !matches!(target_distinct, Some(t) if used + need >= t);
        events.push(EventInfo {
            object: o as u32,
            version: version[o],
            role: Role::Base,
            has_variant: with_variant,
        });
        let e = (events.len() - 1) as u32;
        last_pos[o] = natural;
        items.push((place(&mut rng, natural, w), e, CopyKind::Original));
        if with_variant {
            items.push((place(&mut rng, natural, spread), e, CopyKind::Variant));
        }
        natural += 1.0;
    }
    // The equal-version twin of each pair object, at its highest version,
    // shortly after that version's original.
    for o in (0..n).filter(|&o| is_pair[o] && version[o] > 0) {
        events.push(EventInfo {
            object: o as u32,
            version: version[o],
            role: Role::Twin,
            has_variant: false,
        });
        let key = place(&mut rng, last_pos[o], spread);
        items.push((key, (events.len() - 1) as u32, CopyKind::Original));
    }
    // Redeliveries of events without a variant.
    let distinct = items.len();
    let dups = match spec.deliveries {
        Some(d) => d.saturating_sub(distinct),
        None => {
            let r = spec.duplicate_rate;
            ((distinct as f64) * r / (1.0 - r)).round() as usize
        }
    };
    let eligible: Vec<usize> = (0..distinct)
        .filter(|&i| !events[items[i].1 as usize].has_variant)
        .collect();
    if !eligible.is_empty() {
        for _ in 0..dups {
            let (key, event, _) = items[eligible[rng.random_range(0..eligible.len())]];
            let copy = if rng.random::<bool>() {
                CopyKind::Again
            } else {
                CopyKind::Reencoded
            };
            items.push((place(&mut rng, key, spread), event, copy));
        }
    }
    items.sort_by(|a, b| a.0.total_cmp(&b.0));

    let mut stream = Stream {
        spec: spec.clone(),
        bytes: Vec::with_capacity(items.len() * (spec.payload_bytes + 8)),
        ends: Vec::with_capacity(items.len()),
        sent: Vec::with_capacity(items.len()),
        events,
        expectation: Expectation {
            objects: Vec::new(),
            counts: ExpectedCounts::default(),
        },
    };
    let mut scratch = Vec::new();
    for &(_, event, copy) in &items {
        stream.write_body(&mut scratch, event, copy);
        stream.bytes.extend_from_slice(&scratch);
        stream.ends.push(stream.bytes.len());
        stream.sent.push(Sent { event, copy });
    }
    stream.expectation = stream.compute_expectation();
    Ok(stream)
}

impl Stream {
    /// The spec the stream was generated from.
    pub fn spec(&self) -> &LoadSpec {
        &self.spec
    }

    /// Number of deliveries.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether the stream has no delivery.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Total bytes of all bodies.
    pub fn total_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// The body of delivery `i` (raw JSON bytes).
    pub fn body(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.bytes[start..self.ends[i]]
    }

    /// The number of distinct event identities.
    pub fn distinct_events(&self) -> usize {
        self.events.len()
    }

    /// What the receiver must end with.
    pub fn expectation(&self) -> &Expectation {
        &self.expectation
    }

    /// The id of known object `i`.
    pub fn object_id(i: usize) -> String {
        format!("card-{i}")
    }

    /// The initial state (JSON text) of every known object, at version 0.
    pub fn initial_state(i: usize) -> String {
        format!(r#"{{"stage":"initial","label":"card-{i}"}}"#)
    }

    /// The configuration every driver uses: audit trail off (a load test
    /// would otherwise keep every body), queue limits raised above what this
    /// stream can hold so that no delivery gets `retry`, `shards` shard tasks.
    pub fn config(&self, shards: usize) -> Config {
        let big = self.len().max(1) + 1;
        Config {
            shards,
            audit: false,
            // The registry never grows mid-run (see Config::identity_capacity).
            identity_capacity: self.distinct_events(),
            limits: Limits {
                max_held_per_object: big.max(Limits::default().max_held_per_object),
                max_parked_per_object: big.max(Limits::default().max_parked_per_object),
                max_parked_per_shard: big.max(Limits::default().max_parked_per_shard),
                ..Limits::default()
            },
            ..Config::default()
        }
    }

    /// The clock every driver uses: one minute after the events' `occurred_at`,
    /// so no identity is near the retention window.
    pub fn clock() -> Arc<dyn Clock> {
        let at = crate::clock::parse_rfc3339(OCCURRED_AT).unwrap_or(SystemTime::UNIX_EPOCH)
            + Duration::from_secs(60);
        Arc::new(ManualClock::new(at))
    }

    /// A started [`Receiver`] holding the stream's known objects at version 0,
    /// on a durable `store` when one is given (it should be empty: the check
    /// expects a first run). Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// [`BuildError`] from the builder (no runtime, zero shards).
    pub fn receiver(&self, shards: usize, store: Option<&str>) -> Result<Receiver, BuildError> {
        let mut builder = Receiver::builder()
            .config(self.config(shards))
            .clock(Self::clock());
        if let Some(location) = store {
            builder = builder.store(location);
        }
        for i in 0..self.spec.objects {
            builder = builder.object(&Self::object_id(i), 0, &Self::initial_state(i));
        }
        builder.build()
    }

    /// A [`Context`] and one [`Shard`] holding every known object: the
    /// single-thread engine.
    pub fn engine(&self) -> (Context, Shard) {
        let ctx = Context::new(self.config(1), Self::clock());
        let shard = self.shard(&ctx);
        (ctx, shard)
    }

    /// A fresh [`Shard`] holding every known object at version 0, for `ctx`
    /// (which may already remember identities).
    ///
    /// # Panics
    /// Never for a generated stream (the initial states are valid JSON).
    pub fn shard(&self, ctx: &Context) -> Shard {
        let mut shard = Shard::new();
        for i in 0..self.spec.objects {
            shard
                .insert_object(ctx, &Self::object_id(i), 0, &Self::initial_state(i))
                .expect("generated initial state is valid JSON");
        }
        shard
    }

    fn names(&self, e: &EventInfo) -> (String, String) {
        match e.role {
            Role::Base => (
                format!("e-{}-{}", e.object, e.version),
                Self::object_id(e.object as usize),
            ),
            Role::Twin => (
                format!("e-{}-{}t", e.object, e.version),
                Self::object_id(e.object as usize),
            ),
            Role::Ghost => (
                format!("g-{}-{}", e.object, e.version),
                format!("ghost-{}", e.object),
            ),
        }
    }

    fn stage(e: &EventInfo, copy: CopyKind) -> String {
        match (e.role, copy) {
            (Role::Twin, _) => format!("v{} twin", e.version),
            (_, CopyKind::Variant) => format!("v{} variant", e.version),
            _ => format!("v{}", e.version),
        }
    }

    /// Writes one body into `out` (cleared first), padded to the payload size.
    fn write_body(&self, out: &mut Vec<u8>, event: u32, copy: CopyKind) {
        let e = self.events[event as usize];
        let (event_id, object_id) = self.names(&e);
        let stage = Self::stage(&e, copy);
        let pad = self.pad_len(&event_id, &object_id, e.version, &stage);
        let pad = "x".repeat(pad);
        let mut s = String::with_capacity(self.spec.payload_bytes + 64);
        let v = e.version;
        if copy == CopyKind::Reencoded {
            let _ = write!(
                s,
                "{{ \"attempt\": 2, \"state\": {{\"pad\": \"{pad}\", \"label\": \"{object_id}\", \"stage\": \"{stage}\"}}, \
                 \"type\": \"card.snapshot\", \"occurred_at\": \"{OCCURRED_AT}\", \"object_version\": {v}, \
                 \"object_id\": \"{object_id}\", \"event_id\": \"{event_id}\" }}"
            );
        } else {
            let _ = write!(
                s,
                "{{\"event_id\":\"{event_id}\",\"object_id\":\"{object_id}\",\"object_version\":{v},\
                 \"occurred_at\":\"{OCCURRED_AT}\",\"type\":\"card.snapshot\",\"state\":{}}}",
                Self::state_json(&object_id, &stage, &pad)
            );
        }
        out.clear();
        out.extend_from_slice(s.as_bytes());
    }

    fn state_json(object_id: &str, stage: &str, pad: &str) -> String {
        format!(r#"{{"stage":"{stage}","label":"{object_id}","pad":"{pad}"}}"#)
    }

    /// Pad length that brings the compact body to the payload size.
    fn pad_len(&self, event_id: &str, object_id: &str, version: u64, stage: &str) -> usize {
        let skeleton = format!(
            "{{\"event_id\":\"{event_id}\",\"object_id\":\"{object_id}\",\"object_version\":{version},\
             \"occurred_at\":\"{OCCURRED_AT}\",\"type\":\"card.snapshot\",\"state\":{}}}",
            Self::state_json(object_id, stage, "")
        );
        self.spec.payload_bytes.saturating_sub(skeleton.len())
    }

    /// The state JSON text known object `i` must hold at `version` when it is
    /// not paused (the original content of that version's base event).
    pub fn expected_state(&self, i: usize, version: u64) -> String {
        if version == 0 {
            return Self::initial_state(i);
        }
        let e = EventInfo {
            object: i as u32,
            version,
            role: Role::Base,
            has_variant: false,
        };
        let (event_id, object_id) = self.names(&e);
        let stage = Self::stage(&e, CopyKind::Original);
        let pad = "x".repeat(self.pad_len(&event_id, &object_id, version, &stage));
        Self::state_json(&object_id, &stage, &pad)
    }

    fn compute_expectation(&self) -> Expectation {
        let mut objects = vec![
            ExpectedObject {
                version: 0,
                paused: false
            };
            self.spec.objects
        ];
        let mut counts = ExpectedCounts {
            deliveries: self.len() as u64,
            ..ExpectedCounts::default()
        };
        for e in &self.events {
            match e.role {
                Role::Ghost => counts.unknown_objects += 1,
                Role::Twin => {
                    counts.version_states += 1;
                    objects[e.object as usize].paused = true;
                }
                Role::Base => {
                    let o = &mut objects[e.object as usize];
                    o.version = o.version.max(e.version);
                    counts.applied_stale_or_paused += 1;
                    if e.has_variant {
                        o.paused = true;
                    }
                }
            }
        }
        for s in &self.sent {
            match s.copy {
                CopyKind::Variant => counts.event_variants += 1,
                CopyKind::Again | CopyKind::Reencoded => counts.duplicates += 1,
                CopyKind::Original => {}
            }
        }
        Expectation { objects, counts }
    }
}

/// A compact code for one delivery's outcome, so a run can record millions of
/// them cheaply. See [`decision_code`] and [`describe_code`].
pub type Code = u8;

const NOT_SENT: Code = 0;
const APPLIED: Code = 1;
const STALE: Code = 2;
const EQUAL: Code = 3;
const EVENT_VARIANT: Code = 4;
const VERSION_STATE: Code = 5;
const HELD: Code = 8;
const DUPLICATE: Code = 32;
const RETRY: Code = 250;
const REJECT: Code = 251;

const HOLD_REASONS: [HoldReason; 7] = HoldReason::ALL;

fn verdict_code(v: Verdict) -> Code {
    match v {
        Verdict::Applied => APPLIED,
        Verdict::Stale => STALE,
        Verdict::Equal => EQUAL,
        Verdict::Conflict(ConflictKind::EventVariant) => EVENT_VARIANT,
        Verdict::Conflict(ConflictKind::VersionState) => VERSION_STATE,
        Verdict::Held(r) => HELD + HOLD_REASONS.iter().position(|h| *h == r).unwrap_or(0) as Code,
    }
}

/// The code of a receipt: its decision, or retry / reject.
pub fn decision_code(receipt: &Receipt) -> Code {
    match receipt.outcome {
        Outcome::Decided(Decision::Duplicate { original }) => DUPLICATE + verdict_code(original),
        Outcome::Decided(Decision::Applied) => APPLIED,
        Outcome::Decided(Decision::Stale) => STALE,
        Outcome::Decided(Decision::Equal) => EQUAL,
        Outcome::Decided(Decision::Conflict(k)) => verdict_code(Verdict::Conflict(k)),
        Outcome::Decided(Decision::Held(r)) => verdict_code(Verdict::Held(r)),
        Outcome::Retry(_) => RETRY,
        Outcome::Rejected(_) => REJECT,
    }
}

/// A readable name for a [`Code`], for example `duplicate of applied`.
pub fn describe_code(code: Code) -> String {
    match code {
        NOT_SENT => "not sent".into(),
        APPLIED => "applied".into(),
        STALE => "stale".into(),
        EQUAL => "equal".into(),
        EVENT_VARIANT => "conflict (event_variant)".into(),
        VERSION_STATE => "conflict (version_state)".into(),
        c if (HELD..HELD + 7).contains(&c) => {
            format!("held ({})", HOLD_REASONS[(c - HELD) as usize].as_str())
        }
        c if (DUPLICATE..DUPLICATE + HELD + 7).contains(&c) => {
            format!("duplicate of {}", describe_code(c - DUPLICATE))
        }
        RETRY => "retry".into(),
        REJECT => "reject".into(),
        c => format!("unknown code {c}"),
    }
}

/// Decision counts of a run, by wire name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DecisionCounts {
    /// `applied`.
    pub applied: u64,
    /// `stale`.
    pub stale: u64,
    /// `equal`.
    pub equal: u64,
    /// `duplicate` (any original).
    pub duplicate: u64,
    /// `conflict (event_variant)`.
    pub conflict_event_variant: u64,
    /// `conflict (version_state)`.
    pub conflict_version_state: u64,
    /// `held (paused)`.
    pub held_paused: u64,
    /// `held (unknown_object)`.
    pub held_unknown_object: u64,
    /// Any other hold.
    pub held_other: u64,
    /// Not recorded: `retry`.
    pub retry: u64,
    /// Not recorded: `reject`.
    pub reject: u64,
    /// No receipt at all (a driver bug).
    pub missing: u64,
}

impl DecisionCounts {
    /// Counts the codes of a run.
    pub fn of(codes: &[Code]) -> Self {
        let mut c = Self::default();
        for &code in codes {
            match code {
                APPLIED => c.applied += 1,
                STALE => c.stale += 1,
                EQUAL => c.equal += 1,
                EVENT_VARIANT => c.conflict_event_variant += 1,
                VERSION_STATE => c.conflict_version_state += 1,
                HELD => c.held_paused += 1,
                x if x == HELD + 1 => c.held_unknown_object += 1,
                x if (HELD + 2..HELD + 7).contains(&x) => c.held_other += 1,
                x if (DUPLICATE..DUPLICATE + HELD + 7).contains(&x) => c.duplicate += 1,
                RETRY => c.retry += 1,
                REJECT => c.reject += 1,
                _ => c.missing += 1,
            }
        }
        c
    }
}

/// How deliveries are paced.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LoadMode {
    /// Closed loop: each producer sends its next delivery as soon as the
    /// previous one is acknowledged (as fast as it goes); latency is measured
    /// from the send.
    Closed,
    /// Open loop: delivery `i` is due at `start + i / rate` (deliveries per
    /// second over all producers), whatever happened to earlier ones; its
    /// producer sends it at that time or as soon as it is free, and latency
    /// is measured from the intended send time, so time spent waiting behind
    /// a slow delivery counts (no coordinated omission).
    Open {
        /// Deliveries per second, over all producers.
        rate: f64,
    },
}

/// How to drive a stream.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Concurrent producer tasks; delivery `i` goes to producer `i % producers`.
    pub producers: usize,
    /// Closed or open loop.
    pub mode: LoadMode,
    /// Shard tasks of the receiver (ignored by the baselines).
    pub shards: usize,
    /// Record acknowledgement latency in a histogram (two clock reads per
    /// delivery; benches turn it off). Always on in open loop.
    pub record_latency: bool,
    /// Incremented as deliveries are acknowledged (in batches), for a
    /// progress bar.
    pub progress: Option<Arc<AtomicU64>>,
    /// A durable store for the receiver (`sqlite:PATH`, `postgres://...`);
    /// `None`: in memory. Ignored by the baselines.
    pub store: Option<String>,
    /// Most deliveries a producer hands over per call (at least 1). With 1,
    /// each delivery is one [`Receiver::deliver`] call (the mutex baseline
    /// locks once per delivery); above 1, [`Receiver::deliver_batch`] (the
    /// baseline parses the batch, then locks once for it). Closed loop: a
    /// producer always sends this many (its last call may have fewer); open
    /// loop: as many as have been released and not yet sent, up to this.
    pub batch: usize,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            producers: 4,
            mode: LoadMode::Closed,
            shards: 16,
            record_latency: true,
            progress: None,
            store: None,
            batch: 1,
        }
    }
}

/// What a run produced: timing, latency, one code per delivery and the final
/// state to check.
pub struct RunOutcome {
    /// Wall time of the delivery phase (generation and setup excluded).
    pub elapsed: Duration,
    /// CPU time the whole process used during the delivery phase (user +
    /// system, all threads; 10 ms resolution), `None` without `/proc`. On a
    /// shared machine it moves less than wall time.
    pub cpu: Option<Duration>,
    /// Acknowledgement latency in nanoseconds (empty when not recorded); in
    /// open loop measured from the intended send time.
    pub latency: Histogram<u64>,
    /// Acknowledgement latency from the actual send, in nanoseconds: the same
    /// as `latency` in closed loop; in open loop the difference is
    /// `send_lateness`.
    pub service_latency: Histogram<u64>,
    /// Open loop: how long after its intended send time each delivery was
    /// sent, in nanoseconds (empty in closed loop): its producer was busy
    /// with an earlier call, or woke late. Values far above the service
    /// latency mean the load generator itself was descheduled.
    pub send_lateness: Histogram<u64>,
    /// One code per delivery, in stream order.
    pub codes: Vec<Code>,
    /// Every known object at the end, in any order.
    pub objects: Vec<ObjectState>,
    /// Replacement counters at the end.
    pub counters: Counters,
    /// With a durable store: its group-commit figures and the fsync probe.
    pub store: Option<StoreRun>,
}

impl RunOutcome {
    /// Deliveries per second over the delivery phase.
    pub fn throughput(&self) -> f64 {
        self.codes.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Decision counts.
    pub fn counts(&self) -> DecisionCounts {
        DecisionCounts::of(&self.codes)
    }
}

fn new_histogram() -> Histogram<u64> {
    // 1 ns .. 1 h, 3 significant figures.
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid histogram bounds")
}

/// Something producers can deliver bodies to.
trait Sink: Send + Sync + 'static {
    fn deliver(&self, body: &[u8]) -> impl Future<Output = Code> + Send;
    fn deliver_batch(&self, bodies: &[&[u8]]) -> impl Future<Output = Vec<Code>> + Send;
}

impl Sink for Receiver {
    async fn deliver(&self, body: &[u8]) -> Code {
        decision_code(&Receiver::deliver(self, body).await)
    }

    async fn deliver_batch(&self, bodies: &[&[u8]]) -> Vec<Code> {
        Receiver::deliver_batch(self, bodies)
            .await
            .iter()
            .map(decision_code)
            .collect()
    }
}

/// The naive baseline: one global `std::sync::Mutex` around a single
/// [`Shard`] (so one `HashMap` of objects), the same engine and registry.
/// Producers parse and fingerprint outside the lock, then decide under it:
/// one lock per delivery, or one per batch when producers send batches.
struct GlobalMutex {
    /// Registry, clock, configuration, shared by every producer.
    ctx: Context,
    /// Every object. A std mutex: the critical section is short and has no
    /// `.await` in it.
    shard: Mutex<Shard>,
}

/// Decides one parsed body on a bare shard, forwarding a pause to the same
/// shard (it holds every object): the engine step of both baselines.
fn decide_on(ctx: &Context, shard: &mut Shard, parsed: Result<Delivery, RejectReason>) -> Code {
    let receipt = match parsed {
        Ok(delivery) => {
            let step = shard.deliver(ctx, delivery);
            if let Some(pause) = step.pause {
                shard.pause(ctx, &pause);
            }
            step.receipt
        }
        Err(why) => Receipt::rejected(why),
    };
    decision_code(&receipt)
}

impl GlobalMutex {
    fn lock(&self) -> std::sync::MutexGuard<'_, Shard> {
        self.shard.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Sink for GlobalMutex {
    async fn deliver(&self, body: &[u8]) -> Code {
        let parsed = self.ctx.parse(body);
        decide_on(&self.ctx, &mut self.lock(), parsed)
    }

    async fn deliver_batch(&self, bodies: &[&[u8]]) -> Vec<Code> {
        let parsed: Vec<_> = bodies.iter().map(|b| self.ctx.parse(b)).collect();
        let mut shard = self.lock();
        parsed
            .into_iter()
            .map(|p| decide_on(&self.ctx, &mut shard, p))
            .collect()
    }
}

/// What [`drive`] measured.
struct Driven {
    /// Wall time of the delivery phase.
    elapsed: Duration,
    /// Process CPU time during it.
    cpu: Option<Duration>,
    /// Latency from the intended send time (closed loop: from the send).
    latency: Histogram<u64>,
    /// Latency from the actual send.
    service: Histogram<u64>,
    /// Open loop: how long after its intended send time each delivery was
    /// handed to the receiver.
    send_lateness: Histogram<u64>,
    /// One code per delivery, in stream order.
    codes: Vec<Code>,
}

/// One producer's measurements.
struct Produced {
    latency: Histogram<u64>,
    service: Histogram<u64>,
    send_lateness: Histogram<u64>,
    /// Its deliveries' codes, in its own (stream) order.
    codes: Vec<Code>,
}

impl Produced {
    fn new(capacity: usize) -> Self {
        Self {
            latency: new_histogram(),
            service: new_histogram(),
            send_lateness: new_histogram(),
            codes: Vec::with_capacity(capacity),
        }
    }

    /// Records one call: its deliveries (stream index, intended send time in
    /// open loop), when it was sent and when its receipts came back.
    fn record(
        &mut self,
        call: &[(usize, Option<Instant>)],
        sent: Option<Instant>,
        done: Instant,
        progress: &Option<Arc<AtomicU64>>,
        unreported: &mut u64,
    ) {
        if let Some(sent) = sent {
            let ns = |from: Instant, to: Instant| {
                to.saturating_duration_since(from)
                    .as_nanos()
                    .clamp(1, u64::MAX as u128) as u64
            };
            for &(_, due) in call {
                self.service.saturating_record(ns(sent, done));
                self.latency
                    .saturating_record(ns(due.unwrap_or(sent), done));
                if let Some(due) = due {
                    self.send_lateness.saturating_record(ns(due, sent));
                }
            }
        }
        *unreported += call.len() as u64;
        if *unreported >= 1024 {
            if let Some(p) = progress {
                p.fetch_add(*unreported, Ordering::Relaxed);
            }
            *unreported = 0;
        }
    }
}

/// Delivers one call's bodies: one `deliver` for a single delivery, one
/// `deliver_batch` otherwise.
async fn send<S: Sink>(sink: &S, stream: &Stream, call: &[(usize, Option<Instant>)]) -> Vec<Code> {
    if let [(i, _)] = call[..] {
        vec![sink.deliver(stream.body(i)).await]
    } else {
        let bodies: Vec<&[u8]> = call.iter().map(|&(i, _)| stream.body(i)).collect();
        sink.deliver_batch(&bodies).await
    }
}

/// Drives `stream` through `sink` with `opts.producers` producer tasks on
/// the current runtime. Delivery `i` belongs to producer `i % producers`,
/// which sends its deliveries in stream order, `opts.batch` at most per call.
///
/// Closed loop: each producer sends its next call when the previous one is
/// acknowledged. Open loop: delivery `i` is due at `start + i / rate`; a
/// producer sends every delivery of its own that is due (up to the batch
/// size), waits for the receipts, and when nothing of its own is due yields
/// to the runtime and looks again. It does not sleep: a timer-based wait
/// (tokio's timer has millisecond granularity, a thread's sleep costs a
/// wake-up that this VM makes expensive) would add its own lateness, while
/// yielding lets the shard tasks run whenever they have work and keeps the
/// workers from parking. The price is that the workers stay busy for the
/// whole run, so the CPU time per delivery of an open-loop run counts the
/// idle polling too. Latency counts from the intended send time, so time a
/// delivery spent due but not yet sent (its producer busy with an earlier
/// call, or not scheduled) counts as well: no coordinated omission.
async fn drive<S: Sink>(sink: Arc<S>, stream: Arc<Stream>, opts: &RunOptions) -> Driven {
    let producers = opts.producers.max(1);
    let total = stream.len();
    let batch = opts.batch.max(1);
    let per_producer = total / producers + 1;
    let mode = opts.mode;
    let record = opts.record_latency || matches!(mode, LoadMode::Open { .. });
    let cpu0 = process_cpu_time();
    let start = Instant::now();
    let mut handles = Vec::with_capacity(producers);
    for p in 0..producers {
        let (sink, stream, progress) = (sink.clone(), stream.clone(), opts.progress.clone());
        handles.push(tokio::spawn(async move {
            let mut out = Produced::new(per_producer);
            let mut unreported = 0u64;
            let mut mine = (p..total).step_by(producers).peekable();
            let mut call: Vec<(usize, Option<Instant>)> = Vec::with_capacity(batch);
            while mine.peek().is_some() {
                call.clear();
                let sent = match mode {
                    LoadMode::Closed => {
                        call.extend(mine.by_ref().take(batch).map(|i| (i, None)));
                        record.then(Instant::now)
                    }
                    LoadMode::Open { rate } => {
                        let due = |i: usize| start + Duration::from_secs_f64(i as f64 / rate);
                        let now = Instant::now();
                        while call.len() < batch {
                            match mine.peek() {
                                Some(&i) if due(i) <= now => {
                                    call.push((i, Some(due(i))));
                                    mine.next();
                                }
                                _ => break,
                            }
                        }
                        if call.is_empty() {
                            tokio::task::yield_now().await;
                            continue;
                        }
                        Some(now)
                    }
                };
                out.codes.extend(send(&*sink, &stream, &call).await);
                out.record(&call, sent, Instant::now(), &progress, &mut unreported);
            }
            if let Some(p) = &progress {
                p.fetch_add(unreported, Ordering::Relaxed);
            }
            out
        }));
    }
    let mut results: Vec<Produced> = Vec::with_capacity(producers);
    for h in handles {
        results.push(h.await.expect("producer task panicked"));
    }
    let elapsed = start.elapsed();
    let cpu = cpu_since(cpu0);
    let mut latency = new_histogram();
    let mut service = new_histogram();
    let mut send_lateness = new_histogram();
    let mut codes = vec![NOT_SENT; total];
    for (p, produced) in results.into_iter().enumerate() {
        let _ = latency.add(&produced.latency);
        let _ = service.add(&produced.service);
        let _ = send_lateness.add(&produced.send_lateness);
        for (k, code) in produced.codes.into_iter().enumerate() {
            codes[p + k * producers] = code;
        }
    }
    Driven {
        elapsed,
        cpu,
        latency,
        service,
        send_lateness,
        codes,
    }
}

/// Runs `stream` through a fresh [`Receiver`] (router, shard tasks, shared
/// registry) on the current tokio runtime, then reads the final state and
/// shuts it down. Setup and shutdown are not part of `elapsed`.
///
/// # Errors
/// [`BuildError`] when the receiver cannot start (for example outside a
/// runtime), and [`BuildError::InvalidConfig`] when `opts.store` already
/// holds receipts (the check expects a first run).
pub async fn run_receiver(
    stream: &Arc<Stream>,
    opts: &RunOptions,
) -> Result<RunOutcome, BuildError> {
    // The disk's fsync rate moves from hour to hour: measure it now, on the
    // store's filesystem, before the store is opened.
    let fsync_probe = opts
        .store
        .as_deref()
        .map(|location| probe_fsync(&probe_dir(location), FSYNC_PROBE_TIME));
    let receiver = Arc::new(stream.receiver(opts.shards, opts.store.as_deref())?);
    if !receiver.context().registry().is_empty() {
        // The check expects a first run: a store holding another run's
        // receipts would turn its first decisions into duplicates.
        receiver.shutdown().await;
        return Err(BuildError::InvalidConfig(
            "the store already holds receipts: loadtest needs an empty store (a new file or schema)",
        ));
    }
    let before = receiver.store_stats();
    let d = drive(receiver.clone(), stream.clone(), opts).await;
    let store = match (receiver.store_stats(), before, fsync_probe) {
        (Some(after), Some(before), Some(fsync_probe)) => Some(StoreRun {
            stats: after.since(&before),
            fsync_probe,
        }),
        _ => None,
    };
    let objects = receiver.objects().await;
    let counters = receiver.counters().await;
    receiver.shutdown().await;
    Ok(RunOutcome {
        elapsed: d.elapsed,
        cpu: d.cpu,
        latency: d.latency,
        service_latency: d.service,
        send_lateness: d.send_lateness,
        codes: d.codes,
        objects,
        counters,
        store,
    })
}

/// Runs `stream` through the naive baseline: one global mutex around one
/// [`Shard`], the same engine, producers parsing outside the lock.
pub async fn run_global_mutex(stream: &Arc<Stream>, opts: &RunOptions) -> RunOutcome {
    let (ctx, shard) = stream.engine();
    let sink = Arc::new(GlobalMutex {
        ctx,
        shard: Mutex::new(shard),
    });
    let d = drive(sink.clone(), stream.clone(), opts).await;
    let shard = sink.shard.lock().unwrap_or_else(|e| e.into_inner());
    RunOutcome {
        elapsed: d.elapsed,
        cpu: d.cpu,
        latency: d.latency,
        service_latency: d.service,
        send_lateness: d.send_lateness,
        codes: d.codes,
        objects: shard.objects(),
        counters: shard.counters(),
        store: None,
    }
}

/// Runs `stream` on the calling thread through the bare engine (parse,
/// fingerprint, [`Shard::deliver`]): the per-core limit. No latency is recorded.
pub fn run_engine(stream: &Stream) -> RunOutcome {
    let (ctx, shard) = stream.engine();
    run_engine_on(stream, &ctx, shard)
}

/// [`run_engine`] with a given context (for example one whose registry
/// already remembers many identities) and shard (see [`Stream::shard`]).
pub fn run_engine_on(stream: &Stream, ctx: &Context, mut shard: Shard) -> RunOutcome {
    let mut codes = Vec::with_capacity(stream.len());
    let cpu0 = process_cpu_time();
    let start = Instant::now();
    for i in 0..stream.len() {
        codes.push(decide_on(ctx, &mut shard, ctx.parse(stream.body(i))));
    }
    let elapsed = start.elapsed();
    RunOutcome {
        elapsed,
        cpu: cpu_since(cpu0),
        latency: new_histogram(),
        service_latency: new_histogram(),
        send_lateness: new_histogram(),
        codes,
        objects: shard.objects(),
        counters: shard.counters(),
        store: None,
    }
}

/// The result of [`check`].
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CheckReport {
    /// How many individual assertions were made.
    pub assertions: u64,
    /// How many failed.
    pub failed: u64,
    /// The first few failures, in words.
    pub failures: Vec<String>,
}

impl CheckReport {
    /// Whether every assertion held.
    pub fn ok(&self) -> bool {
        self.failed == 0
    }

    fn assert(&mut self, holds: bool, message: impl FnOnce() -> String) {
        self.assertions += 1;
        if !holds {
            self.failed += 1;
            if self.failures.len() < 20 {
                self.failures.push(message());
            }
        }
    }
}

/// Compares a run with the expectation. Asserts only what is the same in
/// every interleaving (see the module docs), and asserts it exactly:
/// - every delivery was decided (no retry, reject or missing receipt);
/// - each event identity got exactly one first decision, of an allowed kind
///   for its role; every redelivery is `duplicate` of exactly that decision;
///   every variant is one `conflict (event_variant)`; each equal-version pair
///   is one `applied` and one `conflict (version_state)`;
/// - the decision counts in [`ExpectedCounts`];
/// - every known object exists, unknown objects were not created; paused
///   exactly as expected; a non-paused object is at its expected version with
///   that version's state;
/// - the receiver's counters and held queues agree with the receipts.
pub fn check(stream: &Stream, expected: &Expectation, run: &RunOutcome) -> CheckReport {
    let mut r = CheckReport::default();
    r.assert(run.codes.len() == stream.len(), || {
        format!(
            "{} receipts for {} deliveries",
            run.codes.len(),
            stream.len()
        )
    });
    if run.codes.len() != stream.len() {
        return r;
    }
    // Per event: its first decision, and what its other copies got.
    let mut first: Vec<Code> = vec![NOT_SENT; stream.events.len()];
    for (i, (s, &code)) in stream.sent.iter().zip(&run.codes).enumerate() {
        let is_first = code < DUPLICATE && code != EVENT_VARIANT;
        if matches!(code, RETRY | REJECT | NOT_SENT) {
            r.assert(false, || {
                format!("delivery {i} was not decided: {}", describe_code(code))
            });
            continue;
        }
        if is_first {
            let slot = &mut first[s.event as usize];
            r.assert(*slot == NOT_SENT, || {
                format!(
                    "event {} got a second first decision at delivery {i}: {} after {}",
                    stream.event_name(s.event),
                    describe_code(code),
                    describe_code(*slot)
                )
            });
            *slot = code;
        }
    }
    for (i, (s, &code)) in stream.sent.iter().zip(&run.codes).enumerate() {
        let e = stream.events[s.event as usize];
        let f = first[s.event as usize];
        if e.has_variant {
            // Original and variant, once each: one first decision, one conflict.
            r.assert(code < DUPLICATE, || {
                format!(
                    "delivery {i} of {}: {} in a variant pair",
                    stream.event_name(s.event),
                    describe_code(code)
                )
            });
        } else {
            // One copy is the first record (whichever was decided first);
            // every other copy is a duplicate of its decision.
            r.assert(code == f || code == DUPLICATE + f, || {
                format!(
                    "delivery {i} of {}: expected duplicate of {}, got {}",
                    stream.event_name(s.event),
                    describe_code(f),
                    describe_code(code)
                )
            });
        }
    }
    let mut variant_conflicts = vec![0u8; stream.events.len()];
    for (s, &code) in stream.sent.iter().zip(&run.codes) {
        if code == EVENT_VARIANT {
            variant_conflicts[s.event as usize] += 1;
        }
    }
    let mut has_twin = vec![false; expected.objects.len()];
    for e in stream.events.iter().filter(|e| e.role == Role::Twin) {
        has_twin[e.object as usize] = true;
    }
    for (k, e) in stream.events.iter().enumerate() {
        let got = first[k];
        let name = || stream.event_name(k as u32);
        let o = (e.role != Role::Ghost).then(|| expected.objects[e.object as usize]);
        let allowed: &[Code] = match e.role {
            Role::Ghost => &[HELD + 1],
            Role::Twin => &[APPLIED, VERSION_STATE],
            Role::Base if o.is_some_and(|o| !o.paused && o.version == e.version) => &[APPLIED],
            Role::Base if o.is_some_and(|o| !o.paused) => &[APPLIED, STALE],
            Role::Base
                if o.is_some_and(|o| o.version == e.version) && has_twin[e.object as usize] =>
            {
                &[APPLIED, VERSION_STATE]
            }
            Role::Base => &[APPLIED, STALE, HELD],
        };
        r.assert(allowed.contains(&got), || {
            format!(
                "event {}: first decision {}, expected one of [{}]",
                name(),
                describe_code(got),
                allowed
                    .iter()
                    .map(|&c| describe_code(c))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        });
        r.assert(variant_conflicts[k] == u8::from(e.has_variant), || {
            format!(
                "event {}: {} event_variant conflicts, expected {}",
                name(),
                variant_conflicts[k],
                u8::from(e.has_variant)
            )
        });
    }
    // Equal-version pairs: exactly one applied, one version_state.
    let mut pair_conflicts = vec![0u32; expected.objects.len()];
    for (k, e) in stream.events.iter().enumerate() {
        if e.role != Role::Ghost && first[k] == VERSION_STATE {
            pair_conflicts[e.object as usize] += 1;
        }
    }
    for e in &stream.events {
        if e.role == Role::Twin {
            let o = e.object as usize;
            r.assert(pair_conflicts[o] == 1, || {
                format!(
                    "{}: {} version_state conflicts in its equal-version pair, expected 1",
                    Stream::object_id(o),
                    pair_conflicts[o]
                )
            });
        }
    }

    let counts = run.counts();
    let c = expected.counts;
    let pairs = [
        ("deliveries", stream.len() as u64, c.deliveries),
        ("duplicate", counts.duplicate, c.duplicates),
        (
            "conflict (event_variant)",
            counts.conflict_event_variant,
            c.event_variants,
        ),
        (
            "conflict (version_state)",
            counts.conflict_version_state,
            c.version_states,
        ),
        (
            "held (unknown_object)",
            counts.held_unknown_object,
            c.unknown_objects,
        ),
        (
            "applied + stale + held (paused)",
            counts.applied + counts.stale + counts.held_paused,
            c.applied_stale_or_paused,
        ),
        ("equal", counts.equal, 0),
        ("other holds", counts.held_other, 0),
        ("retry", counts.retry, 0),
        ("reject", counts.reject, 0),
        ("missing", counts.missing, 0),
    ];
    for (what, got, want) in pairs {
        r.assert(got == want, || {
            format!("{what}: {got} decisions, expected {want}")
        });
    }

    // Final state.
    r.assert(run.objects.len() == expected.objects.len(), || {
        format!(
            "{} objects at the end, expected {} (unknown objects must not be created)",
            run.objects.len(),
            expected.objects.len()
        )
    });
    let mut seen = vec![false; expected.objects.len()];
    let mut held_total = 0u64;
    for obj in &run.objects {
        held_total += obj.held as u64;
        let Some(i) = obj
            .object_id
            .strip_prefix("card-")
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|&i| i < expected.objects.len())
        else {
            r.assert(false, || format!("unexpected object {}", obj.object_id));
            continue;
        };
        seen[i] = true;
        let want = expected.objects[i];
        r.assert(obj.paused == want.paused, || {
            format!(
                "{}: paused = {}, expected {}",
                obj.object_id, obj.paused, want.paused
            )
        });
        if !want.paused {
            r.assert(obj.version == want.version, || {
                format!(
                    "{}: version {}, expected {}",
                    obj.object_id, obj.version, want.version
                )
            });
            let state_ok = obj.version == want.version && {
                let want_state: serde_json::Value =
                    serde_json::from_str(&stream.expected_state(i, want.version))
                        .unwrap_or(serde_json::Value::Null);
                obj.state.to_value() == want_state
            };
            r.assert(state_ok, || {
                format!(
                    "{}: state {} is not the state of version {}",
                    obj.object_id, obj.state, want.version
                )
            });
            r.assert(obj.held == 0, || {
                format!(
                    "{}: {} held events on a running object",
                    obj.object_id, obj.held
                )
            });
        }
    }
    r.assert(seen.iter().all(|&s| s), || {
        "some known objects are missing".into()
    });
    r.assert(run.counters.event_replacements == counts.applied, || {
        format!(
            "receiver counted {} event replacements, receipts say {} applied",
            run.counters.event_replacements, counts.applied
        )
    });
    let held_receipts =
        counts.held_paused + counts.conflict_event_variant + counts.conflict_version_state;
    r.assert(held_total == held_receipts, || {
        format!(
            "objects hold {held_total} events, receipts say {held_receipts} were held on known objects"
        )
    });
    r
}

impl Stream {
    fn event_name(&self, event: u32) -> String {
        self.names(&self.events[event as usize]).0
    }
}

/// CPU time (user + system, every thread) this process has used so far, from
/// `/proc/self/stat` (clock ticks of 10 ms); `None` where it is not available.
pub fn process_cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name, which may contain spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split_ascii_whitespace();
    // utime and stime are fields 14 and 15 of the line, 12th and 13th here.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // USER_HZ is 100 on every mainstream Linux architecture.
    Some(Duration::from_millis((utime + stime) * 10))
}

fn cpu_since(start: Option<Duration>) -> Option<Duration> {
    Some(process_cpu_time()?.saturating_sub(start?))
}

/// Peak resident set size of this process (`VmHWM`), in bytes; `None` where
/// `/proc/self/status` is not available.
pub fn peak_rss_bytes() -> Option<u64> {
    proc_status_kib("VmHWM:").map(|k| k * 1024)
}

/// Current resident set size of this process (`VmRSS`), in bytes.
pub fn current_rss_bytes() -> Option<u64> {
    proc_status_kib("VmRSS:").map(|k| k * 1024)
}

fn proc_status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Latency percentiles of a run, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct LatencySummary {
    /// Samples recorded.
    pub count: u64,
    /// Median.
    pub p50: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest.
    pub max: u64,
    /// Mean.
    pub mean: f64,
}

impl LatencySummary {
    /// Summarises a histogram of nanoseconds (all zero when it is empty).
    pub fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        Self {
            count: h.len(),
            p50: h.value_at_quantile(0.50),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
            mean: h.mean(),
        }
    }
}

/// Everything `loadtest` reports about one run; serialised as-is by
/// `--format json`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Report {
    /// What was driven: `receiver`, `mutex` or `engine`.
    pub target: &'static str,
    /// `closed` or `open`.
    pub mode: &'static str,
    /// Open-loop arrival rate (deliveries per second), `None` in closed loop.
    pub rate: Option<f64>,
    /// The generator's seed.
    pub seed: u64,
    /// Known objects.
    pub objects: usize,
    /// Deliveries sent.
    pub deliveries: usize,
    /// Distinct event identities among them.
    pub distinct_events: usize,
    /// Average body size in bytes.
    pub avg_body_bytes: f64,
    /// Producer tasks (1 for the engine).
    pub producers: usize,
    /// Shard tasks (receiver only).
    pub shards: usize,
    /// Most deliveries per producer call (1 for the engine; see
    /// [`RunOptions::batch`]).
    pub batch: usize,
    /// Wall time of the delivery phase, seconds.
    pub elapsed_s: f64,
    /// Deliveries per second.
    pub deliveries_per_s: f64,
    /// Process CPU time per delivery during the run, microseconds (all
    /// threads; steadier than wall time on a shared machine). `None`
    /// without `/proc`, or when the run used under 0.2 s of CPU (the clock
    /// ticks in 10 ms).
    pub cpu_us_per_delivery: Option<f64>,
    /// Acknowledgement latency in nanoseconds (open loop: from the intended send time).
    pub latency_ns: LatencySummary,
    /// Acknowledgement latency from the actual send, in nanoseconds (equal to
    /// `latency_ns` in closed loop).
    pub service_latency_ns: LatencySummary,
    /// Open loop: how long after its intended send time each delivery was
    /// handed to the receiver, in nanoseconds.
    pub send_lateness_ns: LatencySummary,
    /// Peak resident set size of the process (stream included), bytes.
    pub peak_rss_bytes: Option<u64>,
    /// Decision counts.
    pub decisions: DecisionCounts,
    /// The correctness check.
    pub check: CheckReport,
    /// Whether the check passed.
    pub ok: bool,
    /// With a durable store (`--store`): commits, deliveries per commit,
    /// commit times, the fsync probe and where the CPU went.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<StoreReport>,
}

impl Report {
    /// Assembles the report of one run (reads the peak RSS now).
    pub fn new(
        target: &'static str,
        stream: &Stream,
        opts: &RunOptions,
        run: &RunOutcome,
        check: CheckReport,
    ) -> Self {
        let engine = target == "engine";
        // The engine runs on the calling thread as fast as it goes.
        let mode = if engine { LoadMode::Closed } else { opts.mode };
        Self {
            target,
            mode: match mode {
                LoadMode::Closed => "closed",
                LoadMode::Open { .. } => "open",
            },
            rate: match mode {
                LoadMode::Closed => None,
                LoadMode::Open { rate } => Some(rate),
            },
            seed: stream.spec.seed,
            objects: stream.spec.objects,
            deliveries: stream.len(),
            distinct_events: stream.distinct_events(),
            avg_body_bytes: stream.total_bytes() as f64 / stream.len().max(1) as f64,
            producers: if engine { 1 } else { opts.producers },
            shards: if target == "receiver" { opts.shards } else { 1 },
            batch: if engine { 1 } else { opts.batch.max(1) },
            elapsed_s: run.elapsed.as_secs_f64(),
            deliveries_per_s: run.throughput(),
            // The process CPU clock ticks in 10 ms: below 0.2 s the figure
            // would be off by more than 5 %, so it is left out.
            cpu_us_per_delivery: run
                .cpu
                .filter(|c| *c >= Duration::from_millis(200))
                .map(|c| c.as_secs_f64() * 1e6 / stream.len().max(1) as f64),
            latency_ns: LatencySummary::of(&run.latency),
            service_latency_ns: LatencySummary::of(&run.service_latency),
            send_lateness_ns: LatencySummary::of(&run.send_lateness),
            peak_rss_bytes: peak_rss_bytes(),
            decisions: run.counts(),
            ok: check.ok(),
            check,
            store: run.store.as_ref().map(|s| {
                let in_flight = (opts.producers.max(1) * opts.batch.max(1)).min(stream.len());
                StoreReport::new(s, stream.len(), run.elapsed, run.cpu, in_flight)
            }),
        }
    }
}

/// One round of `loadtest --target compare`: the targets over the same
/// stream, one after the other, and the receiver's ratios to the baselines
/// measured in that round.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ComparisonRound {
    /// The single-thread engine's run.
    pub engine: Report,
    /// The global-mutex baseline's run, at the comparison's batch size.
    pub mutex: Report,
    /// The receiver's run, at the comparison's batch size.
    pub receiver: Report,
    /// Batch above 1 only: the naive baseline, one lock per delivery.
    pub mutex_unbatched: Option<Report>,
    /// Batch above 1 only: the receiver, one `deliver` call per delivery.
    pub receiver_unbatched: Option<Report>,
    /// Receiver deliveries/s ÷ engine deliveries/s in this round.
    pub receiver_over_engine: f64,
    /// Receiver deliveries/s ÷ mutex deliveries/s (same batch size).
    pub receiver_over_mutex: f64,
    /// Batch above 1 only: receiver deliveries/s ÷ the naive baseline's
    /// (one lock per delivery).
    pub receiver_over_unbatched_mutex: Option<f64>,
}

/// Medians over the rounds of a comparison: deliveries/s of each target and
/// the median of the per-round ratios (not the ratio of the medians, so each
/// ratio compares runs taken minutes apart, never across the whole session).
#[derive(Clone, Debug, serde::Serialize)]
pub struct ComparisonMedian {
    /// Engine deliveries per second.
    pub engine: f64,
    /// Mutex baseline deliveries per second.
    pub mutex: f64,
    /// Receiver deliveries per second.
    pub receiver: f64,
    /// Batch above 1 only: the naive baseline's deliveries per second.
    pub mutex_unbatched: Option<f64>,
    /// Batch above 1 only: the unbatched receiver's deliveries per second.
    pub receiver_unbatched: Option<f64>,
    /// Median of the per-round receiver ÷ engine ratios.
    pub receiver_over_engine: f64,
    /// Median of the per-round receiver ÷ mutex ratios.
    pub receiver_over_mutex: f64,
    /// Batch above 1 only: median of the per-round receiver ÷ naive
    /// baseline ratios.
    pub receiver_over_unbatched_mutex: Option<f64>,
}

/// The result of `loadtest --target compare`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Comparison {
    /// Always `compare`.
    pub target: &'static str,
    /// Producer tasks of the mutex and receiver runs.
    pub producers: usize,
    /// Deliveries per producer call of the mutex and receiver runs.
    pub batch: usize,
    /// Receiver shard tasks.
    pub shards: usize,
    /// Every round, in order.
    pub rounds: Vec<ComparisonRound>,
    /// Medians over the rounds.
    pub median: ComparisonMedian,
    /// Whether every run passed its correctness check.
    pub ok: bool,
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

impl Comparison {
    /// Groups reports into rounds of `per_round` consecutive runs (3, or 5
    /// with the unbatched pair; in any order of targets) and computes the
    /// ratios; a round missing a target is dropped.
    pub fn of(reports: Vec<Report>, per_round: usize) -> Self {
        let mut rounds = Vec::new();
        let mut reports = reports.into_iter();
        loop {
            let runs: Vec<Report> = reports.by_ref().take(per_round.max(1)).collect();
            if runs.len() < per_round.max(1) {
                break;
            }
            let batched = runs.iter().map(|r| r.batch).max().unwrap_or(1);
            let pick = |name: &str, batch: usize| {
                runs.iter()
                    .find(|r| r.target == name && r.batch == batch)
                    .cloned()
            };
            let (Some(engine), Some(mutex), Some(receiver)) = (
                pick("engine", 1),
                pick("mutex", batched),
                pick("receiver", batched),
            ) else {
                continue;
            };
            let (mutex_unbatched, receiver_unbatched) = if batched > 1 {
                (pick("mutex", 1), pick("receiver", 1))
            } else {
                (None, None)
            };
            let rate = |r: &Report| r.deliveries_per_s.max(1e-9);
            rounds.push(ComparisonRound {
                receiver_over_engine: receiver.deliveries_per_s / rate(&engine),
                receiver_over_mutex: receiver.deliveries_per_s / rate(&mutex),
                receiver_over_unbatched_mutex: mutex_unbatched
                    .as_ref()
                    .map(|m| receiver.deliveries_per_s / rate(m)),
                engine,
                mutex,
                receiver,
                mutex_unbatched,
                receiver_unbatched,
            });
        }
        let of = |f: &dyn Fn(&ComparisonRound) -> f64| median(rounds.iter().map(f).collect());
        let of_some = |f: &dyn Fn(&ComparisonRound) -> Option<f64>| {
            let values: Option<Vec<f64>> = rounds.iter().map(f).collect();
            values.filter(|v| !v.is_empty()).map(median)
        };
        let median = ComparisonMedian {
            engine: of(&|r| r.engine.deliveries_per_s),
            mutex: of(&|r| r.mutex.deliveries_per_s),
            receiver: of(&|r| r.receiver.deliveries_per_s),
            mutex_unbatched: of_some(&|r| r.mutex_unbatched.as_ref().map(|m| m.deliveries_per_s)),
            receiver_unbatched: of_some(&|r| {
                r.receiver_unbatched.as_ref().map(|m| m.deliveries_per_s)
            }),
            receiver_over_engine: of(&|r| r.receiver_over_engine),
            receiver_over_mutex: of(&|r| r.receiver_over_mutex),
            receiver_over_unbatched_mutex: of_some(&|r| r.receiver_over_unbatched_mutex),
        };
        let first = rounds.first().map(|r| &r.receiver);
        let ok = rounds.iter().all(|r| {
            [&r.engine, &r.mutex, &r.receiver]
                .into_iter()
                .chain(&r.mutex_unbatched)
                .chain(&r.receiver_unbatched)
                .all(|x| x.ok)
        });
        Self {
            target: "compare",
            producers: first.map_or(0, |r| r.producers),
            batch: first.map_or(0, |r| r.batch),
            shards: first.map_or(0, |r| r.shards),
            ok,
            median,
            rounds,
        }
    }

    /// Every run of every round.
    pub fn runs(&self) -> impl Iterator<Item = &Report> {
        self.rounds.iter().flat_map(|r| {
            [&r.engine, &r.mutex, &r.receiver]
                .into_iter()
                .chain(&r.mutex_unbatched)
                .chain(&r.receiver_unbatched)
        })
    }
}
