//! The generator: a seeded [`Stream`] of raw JSON bodies and the
//! [`Expectation`] computed from what it emitted.

use crate::sequential::Content;
use crate::spec::{LoadSpec, SpecError};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use snapshot_receiver::core::{Context, Shard};
use snapshot_receiver::Config;
use snapshot_receiver::Limits;
use snapshot_receiver::{BuildError, Receiver};
use snapshot_receiver::{Clock, ManualClock};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The `occurred_at` every generated event carries (informational only).
const OCCURRED_AT: &str = "2024-01-01T08:00:00Z";

/// The versions of variants that name another object start here, above
/// every version an object's own events carry; event `k`'s is this plus
/// `k`, so no two events of one object share a version through them.
const CROSS_VERSIONS: u64 = 1 << 32;

/// The role of one distinct event in the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Version `n` of a known object.
    Base,
    /// The second event at a known object's highest version (equal-version conflict).
    Twin,
    /// An event naming an unknown object.
    Ghost,
}

/// One distinct event identity the generator emitted.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EventInfo {
    /// Known object index, or ghost index for [`Role::Ghost`].
    pub(crate) object: u32,
    /// Its `object_version`.
    pub(crate) version: u64,
    /// What it is for.
    pub(crate) role: Role,
    /// Whether a conflicting variant of it is delivered too.
    pub(crate) has_variant: bool,
    /// The other known object its variant names, and the version the
    /// variant carries (`None`: the variant names the event's own object
    /// at its version).
    pub(crate) cross: Option<(u32, u64)>,
}

impl EventInfo {
    /// The object (known object index, or ghost index) a `copy` of this
    /// event names, and the version it carries.
    pub(crate) fn named(&self, copy: CopyKind) -> (u32, u64) {
        match (copy, self.cross) {
            (CopyKind::Variant, Some(other)) => other,
            _ => (self.object, self.version),
        }
    }
}

/// How one delivery relates to its event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CopyKind {
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
pub(crate) struct Sent {
    /// Index into [`Stream::events`].
    pub(crate) event: u32,
    /// Which copy.
    pub(crate) copy: CopyKind,
}

/// What the receiver must end with, computed by the generator from what it
/// emitted. Public fields so that a test can corrupt it and see [`check`](fn@crate::check) fail.
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
    /// Whether it ends paused (a variant of one of its events, a variant
    /// naming it, or an equal-version conflict).
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
    pub(crate) spec: LoadSpec,
    /// Every body, back to back.
    bytes: Vec<u8>,
    /// `ends[i]` is the end of body `i` in `bytes` (its start is `ends[i - 1]`).
    ends: Vec<usize>,
    /// Per delivery: which event and which copy.
    pub(crate) sent: Vec<Sent>,
    /// Every distinct event identity.
    pub(crate) events: Vec<EventInfo>,
    /// The expectation computed while generating.
    expectation: Expectation,
    /// This process's resident set size once the stream was built (before
    /// anything was driven with it), bytes; `None` without `/proc`.
    pub(crate) resident_bytes: Option<u64>,
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
    // The objects a variant may name instead of its own: those without an
    // equal-version pair (whose pair must find them running), in order.
    let cross_targets: Vec<u32> = if spec.cross_variant_rate > 0.0 {
        (0..n as u32).filter(|&q| !is_pair[q as usize]).collect()
    } else {
        Vec::new()
    };
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
                cross: None,
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
        // No draw at all with a zero rate: the other settings' streams stay
        // the same bytes.
        let cross = (with_variant
            && cross_targets.len() > 1
            && spec.cross_variant_rate > 0.0
            && rng.random::<f64>() < spec.cross_variant_rate)
            .then(|| {
                // Any target but `o` itself (which is one of them: it has no pair).
                let own = cross_targets.partition_point(|&q| q < o as u32);
                let k = rng.random_range(0..cross_targets.len() - 1);
                let q = cross_targets[if k >= own { k + 1 } else { k }];
                (q, CROSS_VERSIONS + events.len() as u64)
            });
        events.push(EventInfo {
            object: o as u32,
            version: version[o],
            role: Role::Base,
            has_variant: with_variant,
            cross,
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
            cross: None,
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
        resident_bytes: None,
    };
    let mut scratch = Vec::new();
    for &(_, event, copy) in &items {
        stream.write_body(&mut scratch, event, copy);
        stream.bytes.extend_from_slice(&scratch);
        stream.ends.push(stream.bytes.len());
        stream.sent.push(Sent { event, copy });
    }
    stream.expectation = stream.compute_expectation();
    drop(items);
    stream.resident_bytes = crate::probe::current_rss_bytes();
    Ok(stream)
}

impl Stream {
    /// The spec the stream was generated from.
    pub fn spec(&self) -> &LoadSpec {
        &self.spec
    }

    /// The same deliveries in another order: `order[k]` is the delivery of
    /// this stream that comes `k`-th. The events, and so the expectation,
    /// are the same; [`crate::check`] of the result compares a run's
    /// decisions, taken in that order, with the sequential model of that
    /// order (the cluster simulation checks the order its deliveries were
    /// first decided in). `None` when `order` is not a permutation of
    /// `0..self.len()`.
    pub fn reordered(&self, order: &[usize]) -> Option<Stream> {
        if order.len() != self.len() {
            return None;
        }
        let mut seen = vec![false; self.len()];
        let mut bytes = Vec::with_capacity(self.bytes.len());
        let mut ends = Vec::with_capacity(self.len());
        let mut sent = Vec::with_capacity(self.len());
        for &i in order {
            if *seen.get(i)? {
                return None;
            }
            seen[i] = true;
            bytes.extend_from_slice(self.body(i));
            ends.push(bytes.len());
            sent.push(self.sent[i]);
        }
        Some(Stream {
            spec: self.spec.clone(),
            bytes,
            ends,
            sent,
            events: self.events.clone(),
            expectation: self.expectation.clone(),
            resident_bytes: self.resident_bytes,
        })
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

    /// The `event_id` delivery `i` carries; `None` past the last delivery.
    pub fn event_id(&self, i: usize) -> Option<String> {
        let sent = self.sent.get(i)?;
        Some(self.names(&self.events[sent.event as usize]).0)
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
        let at = snapshot_receiver::parse_rfc3339(OCCURRED_AT).unwrap_or(SystemTime::UNIX_EPOCH)
            + Duration::from_secs(60);
        Arc::new(ManualClock::new(at))
    }

    /// A started [`Receiver`] holding the stream's known objects at version 0,
    /// on a durable `store` when one is given (it should be empty: the check
    /// expects a first run), with a memory budget of `memory_budget` bytes
    /// when given (else the default). Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// [`BuildError`] from the builder (no runtime, zero shards, a budget
    /// below 16 MiB).
    pub fn receiver(
        &self,
        shards: usize,
        store: Option<&str>,
        memory_budget: Option<usize>,
    ) -> Result<Receiver, BuildError> {
        let mut builder = Receiver::builder()
            .config(self.config(shards))
            .clock(Self::clock());
        if let Some(location) = store {
            builder = builder.store(location);
        }
        if let Some(total) = memory_budget {
            builder = builder.memory_budget(total);
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

    pub(crate) fn names(&self, e: &EventInfo) -> (String, String) {
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

    /// The event id, the object id and the version a `copy` of `e` carries.
    fn names_of(&self, e: &EventInfo, copy: CopyKind) -> (String, String, u64) {
        let (event_id, object_id) = self.names(e);
        match (copy, e.cross) {
            (CopyKind::Variant, Some((other, version))) => {
                (event_id, Self::object_id(other as usize), version)
            }
            _ => (event_id, object_id, e.version),
        }
    }

    /// The known object (or ghost) delivery `s` names and the version it
    /// carries.
    pub(crate) fn named(&self, s: Sent) -> (u32, u64) {
        self.events[s.event as usize].named(s.copy)
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
        let (event_id, object_id, v) = self.names_of(&e, copy);
        let stage = Self::stage(&e, copy);
        let pad = self.pad_len(&event_id, &object_id, v, &stage);
        let pad = "x".repeat(pad);
        let mut s = String::with_capacity(self.spec.payload_bytes + 64);
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
            cross: None,
        };
        self.state_of(&e, CopyKind::Original)
    }

    /// The state JSON text (compact, in the generator's key order) that
    /// `content` carries.
    pub(crate) fn content_state(&self, content: Content) -> String {
        let e = self.events[content.event as usize];
        let copy = if content.variant {
            CopyKind::Variant
        } else {
            CopyKind::Original
        };
        self.state_of(&e, copy)
    }

    fn state_of(&self, e: &EventInfo, copy: CopyKind) -> String {
        let (event_id, object_id, version) = self.names_of(e, copy);
        let stage = Self::stage(e, copy);
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
                    if let Some((other, _)) = e.cross {
                        objects[other as usize].paused = true;
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
