//! Target (b): the decision engine fed an arbitrary sequence of deliveries
//! and authority snapshots, then the same deliveries a second time.
//!
//! The engine is driven by the receiver's own driver, minus tokio: a
//! [`ShardSet`] of two shards routes each delivery and runs its step, and a
//! pause request it queues for the shard owning its object runs before the
//! next delivery (as that shard's woken task would).
//!
//! Checked after every step:
//! - one decision per delivery: a decided delivery adds exactly one audit
//!   record (plus one per pause of a known object); a `retry` or `reject`
//!   changes nothing at all (registry, audit, objects, held inputs);
//! - only `applied` replaces state, and only upwards;
//! - the registry keeps the first record of every identity: a duplicate
//!   reports it, a variant leaves it alone, nothing else overwrites it;
//! - a malformed body is `held` / `malformed`, or `retry` / `parking_full`
//!   exactly when its shard's parking (shared by parked events and
//!   malformed bodies) is full; the same bytes again, once held, are a
//!   `duplicate` of `held` / `malformed`;
//! - queues stay bounded by the configured limits.
//!
//! Second round, the rule for every delivery replayed:
//! - a body over a limit is rejected again, for the same reason;
//! - a malformed body (no trustworthy identity, never registered) is a
//!   `duplicate` of `held` / `malformed` when round one held it, and
//!   otherwise `held` / `malformed`, or `retry` with its shard's parking full;
//! - an envelope whose identity has a record with the same fingerprint is a
//!   `duplicate` reporting the first record's decision, and changes nothing;
//! - an envelope whose identity has a record with another fingerprint (the
//!   variants of round one) is a `conflict` / `event_variant` again, or
//!   `retry` when there is no room to hold it;
//! - an envelope whose identity has no record (every round-one delivery of it
//!   got `retry`) is decided afresh: never a `duplicate`.

use super::json::{self, Rng, Value};
use arbitrary::{Arbitrary, Unstructured};
use snapshot_receiver_core::engine::ShardSet;
use snapshot_receiver_core::{
    AuthoritativeSnapshot, Config, ConflictKind, Context, Decision, DecisionCounters, Delivery,
    Limits, ManualClock, Outcome, Receipt, ReconcileError, RetryReason, Shard, Verdict,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// One fuzz input: initial objects, queue limits, and the operations.
#[derive(Arbitrary, Debug)]
pub struct Scenario {
    /// Initial versions of `obj-0` .. `obj-2` (`None`: unknown). `obj-3` is
    /// always unknown at the start.
    pub initial: [Option<u8>; 3],
    /// `max_held_per_object`, taken modulo 4.
    pub held_limit: u8,
    /// `max_parked_per_object`, taken modulo 4.
    pub parked_object_limit: u8,
    /// `max_parked_per_shard`, taken modulo 6.
    pub parked_shard_limit: u8,
    /// The operations of round one (at most 64 are used).
    pub ops: Vec<Op>,
}

/// One operation.
#[derive(Arbitrary, Debug)]
pub enum Op {
    /// A delivery of a generated envelope.
    Deliver(Event),
    /// A delivery of arbitrary bytes (at most 512 used).
    Raw(Vec<u8>),
    /// An authoritative snapshot for `obj-(object % 4)`.
    Authority { object: u8, version: u8, state: u8 },
}

/// An envelope, described field by field, encoded with a random style.
#[derive(Arbitrary, Debug)]
pub struct Event {
    /// `e-(event % 6)`.
    pub event: u8,
    /// `obj-(object % 4)`.
    pub object: u8,
    pub version: Version,
    pub kind: Kind,
    /// Index into [`STATES`]; `None` leaves `state` out.
    pub state: Option<u8>,
    pub occurred: Occurred,
    /// Seeds member order, whitespace, escapes and number spellings.
    pub style: u64,
    /// A transport member (`attempt`), which is not semantic content.
    pub attempt: Option<u8>,
    /// Repeats the `type` member: malformed.
    pub duplicate_key: bool,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Version {
    Missing,
    Null,
    Valid(u8),
    BeyondU64,
    Text,
    Fraction,
    Negative,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Kind {
    Supported,
    Unsupported,
    Missing,
    NotAString,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Occurred {
    Recent,
    /// Older than the 24 h retention window.
    Old,
    Missing,
    Invalid,
}

/// States, some of them equal under docs/CONTRACT.md §2 (`1` and `1.0`).
pub const STATES: [&str; 8] = [
    "{}",
    r#"{"a":1}"#,
    r#"{"a":1.0}"#,
    r#"{"a":2}"#,
    "[1,2]",
    "null",
    r#"{"a":{"b":[true,false,null]}}"#,
    r#""x""#,
];

const SHARDS: usize = 2;

fn now() -> SystemTime {
    // 2024-01-02T00:00:00Z
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_153_600)
}

fn value(text: &str) -> Value {
    json::parse(text, 64).expect("a valid literal")
}

impl Event {
    /// The body's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut members = vec![
            ("event_id", value(&format!("\"e-{}\"", self.event % 6))),
            ("object_id", value(&format!("\"obj-{}\"", self.object % 4))),
        ];
        let version = match self.version {
            Version::Missing => None,
            Version::Null => Some("null".to_owned()),
            Version::Valid(v) => Some((v % 8).to_string()),
            Version::BeyondU64 => Some("18446744073709551616".to_owned()),
            Version::Text => Some("\"3\"".to_owned()),
            Version::Fraction => Some("3.0".to_owned()),
            Version::Negative => Some("-3".to_owned()),
        };
        if let Some(v) = version {
            members.push(("object_version", value(&v)));
        }
        let kind = match self.kind {
            Kind::Supported => Some("\"card.snapshot\""),
            Kind::Unsupported => Some("\"card.comment\""),
            Kind::Missing => None,
            Kind::NotAString => Some("7"),
        };
        if let Some(k) = kind {
            members.push(("type", value(k)));
        }
        if let Some(s) = self.state {
            members.push(("state", value(STATES[usize::from(s) % STATES.len()])));
        }
        let occurred = match self.occurred {
            Occurred::Recent => Some("\"2024-01-01T23:59:00Z\""),
            Occurred::Old => Some("\"2023-12-30T00:00:00Z\""),
            Occurred::Missing => None,
            Occurred::Invalid => Some("\"yesterday\""),
        };
        if let Some(o) = occurred {
            members.push(("occurred_at", value(o)));
        }
        if let Some(a) = self.attempt {
            members.push(("attempt", value(&a.to_string())));
        }
        let members: Vec<(String, Value)> = members
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
        let mut rng = Rng::new(self.style);
        let mut text = String::new();
        json::encode_members(members.iter().collect(), &mut rng, &mut text);
        if self.duplicate_key {
            text.insert_str(1, "\"type\":\"card.snapshot\",");
        }
        text.into_bytes()
    }
}

/// Everything the engine has recorded, as far as the public API shows.
#[derive(Debug, PartialEq, Eq)]
struct World {
    identities: usize,
    audit: usize,
    /// object id -> (version, compact state, paused, held)
    objects: BTreeMap<String, (u64, String, bool, usize)>,
    unresolved: usize,
}

impl World {
    fn of(set: &ShardSet<()>) -> Self {
        let mut objects = BTreeMap::new();
        let (mut audit, mut unresolved) = (0, 0);
        for shard in 0..set.len() {
            set.read(shard, |s| {
                for o in s.objects() {
                    let entry = (o.version, o.state.compact(), o.paused, o.held);
                    objects.insert(o.object_id.to_string(), entry);
                }
                audit += s.audit().len();
                unresolved += s.unresolved().len();
            });
        }
        Self {
            identities: set.ctx().registry().len(),
            audit,
            objects,
            unresolved,
        }
    }

    fn versions_and_states(&self) -> BTreeMap<&str, (u64, &str)> {
        self.objects
            .iter()
            .map(|(id, o)| (id.as_str(), (o.0, o.1.as_str())))
            .collect()
    }
}

/// The engine and the bookkeeping the checks need.
struct Run {
    /// The receiver's driver over the shards (nobody listens to
    /// notifications; this harness runs queued pauses itself).
    set: ShardSet<()>,
    limits: Limits,
    counters: DecisionCounters,
    /// The first record of every identity, as this harness saw it decided:
    /// event id -> (fingerprint, verdict).
    first: HashMap<String, (u128, Verdict)>,
    /// Every variant recorded (a `conflict` / `event_variant`): (event id,
    /// fingerprint). A copy of one is a duplicate of that conflict.
    variants: HashSet<(String, u128)>,
    /// The exact bytes of every body held as malformed: a redelivery of one
    /// is its duplicate.
    malformed: HashSet<Vec<u8>>,
    /// Receipts handed out, by kind, to check the counters against.
    decided: u64,
    retried: u64,
    rejected: u64,
}

/// What one delivery got.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Got {
    Rejected(&'static str),
    Decided(Decision),
    Retry(RetryReason),
}

impl Run {
    fn new(s: &Scenario) -> Self {
        let limits = Limits {
            max_held_per_object: usize::from(s.held_limit % 4),
            max_parked_per_object: usize::from(s.parked_object_limit % 4),
            max_parked_per_shard: usize::from(s.parked_shard_limit % 6),
            ..Limits::default()
        };
        let config = Config {
            shards: SHARDS,
            limits: limits.clone(),
            // The checks count audit records: keep every one.
            trail_capacity: usize::MAX,
            ..Config::default()
        };
        let ctx = Context::new(config, Arc::new(ManualClock::new(now())));
        let mut shards: Vec<Shard> = (0..SHARDS).map(|_| Shard::new()).collect();
        for (i, v) in s.initial.iter().enumerate() {
            if let Some(v) = v {
                let id = format!("obj-{i}");
                shards[snapshot_receiver_core::shard_of(&id, SHARDS)]
                    .insert_object(&ctx, &id, u64::from(v % 8), "{}")
                    .unwrap();
            }
        }
        Self {
            set: ShardSet::new(ctx, shards, ()),
            limits,
            counters: DecisionCounters::new(),
            first: HashMap::new(),
            variants: HashSet::new(),
            malformed: HashSet::new(),
            decided: 0,
            retried: 0,
            rejected: 0,
        }
    }

    /// Delivers one body like the router does and checks the step.
    fn deliver(&mut self, bytes: &[u8]) -> (Got, Option<(String, u128)>) {
        let before = World::of(&self.set);
        let delivery: Delivery = match self.set.ctx().parser().parse(bytes) {
            Ok(d) => d,
            Err(why) => {
                let receipt = Receipt {
                    event_id: None,
                    object_id: None,
                    outcome: Outcome::Rejected(why.clone()),
                    object: None,
                    replacement: false,
                    created: false,
                };
                self.counters.record(&receipt);
                self.rejected += 1;
                assert_eq!(World::of(&self.set), before);
                return (Got::Rejected(why.as_str()), None);
            }
        };
        let identity = delivery
            .fingerprint()
            .map(|fp| (delivery.event_id().unwrap().to_owned(), fp));
        let record_before = identity
            .as_ref()
            .and_then(|(id, _)| self.set.ctx().registry().get(id));
        let owner = self.set.route(delivery.object_id());
        let parking_before = self.set.read(owner, parking_used);
        let step = self.set.deliver(owner, delivery);
        // The pause queued by the step runs before the next delivery; a
        // variant whose first record's object is on its own shard (and
        // known there) paused it in the step itself.
        let pauses = match &step.pause {
            Some(p) => self.set.run_pauses(p.owner(SHARDS)),
            None => {
                let variant = Some(Decision::Conflict(ConflictKind::EventVariant));
                let first = record_before.as_ref().map(|r| r.object_id.clone());
                let inline = step.receipt.decision() == variant
                    && first.as_ref().is_some_and(|first| {
                        step.receipt.object_id.as_ref() != Some(first)
                            && self.set.route(Some(first)) == owner
                            && before.objects.contains_key(&**first)
                    });
                usize::from(inline)
            }
        };
        self.counters.record(&step.receipt);
        let after = World::of(&self.set);
        let receipt = step.receipt;
        let record_after = identity
            .as_ref()
            .and_then(|(id, _)| self.set.ctx().registry().get(id));

        let got = match receipt.outcome {
            Outcome::Decided(d) => Got::Decided(d),
            Outcome::Retry(why) => Got::Retry(why),
            Outcome::Rejected(_) => panic!("a shard never rejects"),
        };
        match &got {
            Got::Retry(why) => {
                assert!(
                    matches!(
                        why,
                        RetryReason::HeldQueueFull { .. } | RetryReason::ParkingFull { .. }
                    ),
                    "{why:?}"
                );
                self.retried += 1;
                assert_eq!(after, before, "a retry changes nothing");
            }
            Got::Decided(d) => {
                self.decided += 1;
                assert_eq!(after.audit, before.audit + 1 + pauses, "one audit record");
                assert_eq!(receipt.replacement, *d == Decision::Applied);
                let mut changed: Vec<&str> = Vec::new();
                let (b, a) = (before.versions_and_states(), after.versions_and_states());
                for (id, now) in &a {
                    if b.get(id) != Some(now) {
                        changed.push(id);
                    }
                }
                if *d == Decision::Applied {
                    let id = receipt.object_id.as_deref().unwrap();
                    assert_eq!(changed, [id], "applied replaces its object only");
                    assert!(a[id].0 > b[id].0, "applied raises the version");
                } else {
                    assert!(changed.is_empty(), "{d:?} changed {changed:?}");
                }
                if let Decision::Duplicate { .. } = d {
                    assert_eq!(after.objects, before.objects, "a duplicate changes nothing");
                }
            }
            Got::Rejected(_) => unreachable!(),
        }
        // The registry and this harness's bookkeeping agree.
        if let Some((id, fp)) = &identity {
            let known = self.first.get(id).copied();
            assert_eq!(
                record_before.as_ref().map(|r| (r.fingerprint, r.decision)),
                known
            );
            let variant = (id.clone(), *fp);
            let event_variant = Verdict::Conflict(ConflictKind::EventVariant);
            match (&got, known) {
                (Got::Decided(Decision::Duplicate { original }), Some((first_fp, verdict)))
                    if *fp == first_fp =>
                {
                    assert_eq!(*original, verdict);
                }
                (Got::Decided(Decision::Duplicate { original }), Some(_)) => {
                    assert_eq!(*original, event_variant, "a copy of a variant");
                    assert!(self.variants.contains(&variant), "a recorded variant");
                }
                (Got::Decided(Decision::Conflict(ConflictKind::EventVariant)), Some(first)) => {
                    assert_ne!(*fp, first.0);
                    assert!(
                        self.variants.insert(variant),
                        "each variant is a conflict once"
                    );
                }
                (Got::Decided(d), None) => {
                    let verdict = match *d {
                        Decision::Applied => Verdict::Applied,
                        Decision::Stale => Verdict::Stale,
                        Decision::Equal => Verdict::Equal,
                        Decision::Held(r) => Verdict::Held(r),
                        Decision::Conflict(ConflictKind::VersionState) => {
                            Verdict::Conflict(ConflictKind::VersionState)
                        }
                        other => panic!("{other:?} for an identity without a record"),
                    };
                    self.first.insert(id.clone(), (*fp, verdict));
                }
                (Got::Retry(_), Some((first_fp, _))) => {
                    assert_ne!(*fp, first_fp);
                    assert!(
                        !self.variants.contains(&variant),
                        "a known variant is decided"
                    );
                }
                (Got::Retry(_), None) => {}
                (got, known) => panic!("{got:?} for an identity whose record is {known:?}"),
            }
            assert_eq!(
                record_after.map(|r| (r.fingerprint, r.decision)),
                self.first.get(id).copied(),
                "the first record is never overwritten"
            );
        } else {
            // A malformed body: held as malformed, or `retry` when the
            // shard's parking, which malformed bodies share with parked
            // events, is full.
            // The same bytes again are a duplicate of that hold.
            let limit = self.limits.max_parked_per_shard;
            let held = Verdict::Held(snapshot_receiver_core::HoldReason::Malformed);
            let expect = if self.malformed.contains(bytes) {
                Got::Decided(Decision::Duplicate { original: held })
            } else if parking_before >= limit {
                Got::Retry(RetryReason::ParkingFull { limit })
            } else {
                self.malformed.insert(bytes.to_vec());
                Got::Decided(Decision::from(held))
            };
            assert_eq!(
                got, expect,
                "a malformed body, {parking_before} parked of {limit}"
            );
        }
        self.check_bounds();
        (got, identity)
    }

    /// Queues never pass their limits. An object introduced by an authority
    /// inherits its parked events as held ones, so held queues are bounded by
    /// the larger of the two per-object limits.
    fn check_bounds(&self) {
        let held_bound = self
            .limits
            .max_held_per_object
            .max(self.limits.max_parked_per_object);
        for shard in 0..self.set.len() {
            let (objects, unresolved) = self.set.read(shard, |s| (s.objects(), s.unresolved()));
            let known: HashMap<String, usize> = objects
                .into_iter()
                .map(|o| (o.object_id.to_string(), o.held))
                .collect();
            for (id, held) in &known {
                assert!(*held <= held_bound, "{id} holds {held}");
            }
            let mut parked: HashMap<String, usize> = HashMap::new();
            for u in unresolved {
                // Parked: an event (both ids) for an unknown object, not superseded.
                if let (Some(_), Some(o)) = (&u.event_id, &u.object_id) {
                    if u.superseded_by.is_none() && !known.contains_key(&**o) {
                        *parked.entry(o.to_string()).or_default() += 1;
                    }
                }
            }
            for (id, n) in &parked {
                assert!(*n <= self.limits.max_parked_per_object, "{id} parks {n}");
            }
            let total: usize = parked.values().sum();
            assert!(
                total <= self.limits.max_parked_per_shard,
                "shard parks {total}"
            );
        }
    }

    fn authority(&mut self, object: u8, version: u8, state: u8) {
        let id = format!("obj-{}", object % 4);
        let state = STATES[usize::from(state) % STATES.len()];
        let snapshot =
            AuthoritativeSnapshot::new(&id, u64::from(version % 8), state, now()).unwrap();
        let before = World::of(&self.set);
        let owner = snapshot_receiver_core::shard_of(&id, SHARDS);
        let result = self.set.reconcile(owner, &snapshot);
        self.counters.record_reconcile(&result);
        let after = World::of(&self.set);
        assert_eq!(
            after.identities, before.identities,
            "reconciliation registers nothing"
        );
        match result {
            Ok(report) => {
                let o = &after.objects[&id];
                assert!(o.0 >= snapshot.version);
                assert_eq!(report.after_authority.version, snapshot.version);
                assert!(!report.after_authority.paused);
            }
            Err(ReconcileError::AuthorityOlder { current, .. }) => {
                assert!(current > snapshot.version);
                assert_eq!(
                    after.objects, before.objects,
                    "a refused authority changes nothing"
                );
                assert_eq!(after.audit, before.audit + 1, "the refusal is audited");
            }
            Err(other) => panic!("{other}"),
        }
        self.check_bounds();
    }
}

/// The scenario the `engine` target makes of `data`, decoded as libfuzzer-sys
/// 0.4's `fuzz_target!(|scenario: Scenario| ...)` does: inputs shorter than
/// the type's minimum size, or that do not decode, are skipped (`None`).
pub fn decode(data: &[u8]) -> Option<Scenario> {
    if data.len() < Scenario::size_hint(0).0 {
        return None;
    }
    Scenario::arbitrary_take_rest(Unstructured::new(data)).ok()
}

/// What `shard`'s `max_parked_per_shard` bounds: its parked events and
/// malformed bodies, i.e. its unresolved inputs that are neither superseded
/// nor held by a known object.
fn parking_used(shard: &Shard) -> usize {
    let open = shard
        .unresolved()
        .iter()
        .filter(|u| u.superseded_by.is_none())
        .count();
    let held: usize = shard.objects().iter().map(|o| o.held).sum();
    open - held
}

/// The whole check for one scenario; returns the counters of both rounds.
pub fn run(s: &Scenario) -> snapshot_receiver_core::MetricsSnapshot {
    let mut run = Run::new(s);
    let mut bodies: Vec<(Vec<u8>, Got)> = Vec::new();
    for op in s.ops.iter().take(64) {
        match op {
            Op::Deliver(e) => {
                let bytes = e.encode();
                let (got, _) = run.deliver(&bytes);
                bodies.push((bytes, got));
            }
            Op::Raw(bytes) => {
                let bytes = bytes[..bytes.len().min(512)].to_vec();
                let (got, _) = run.deliver(&bytes);
                bodies.push((bytes, got));
            }
            Op::Authority {
                object,
                version,
                state,
            } => run.authority(*object, *version, *state),
        }
    }

    // Round two: the same deliveries again, in the same order.
    for (bytes, first_got) in &bodies {
        let known = run.set.ctx().parser().parse(bytes).ok().and_then(|d| {
            let fp = d.fingerprint()?;
            let id = d.event_id()?.to_owned();
            let recorded_variant = run.variants.contains(&(id.clone(), fp));
            Some((fp, run.first.get(&id).copied(), recorded_variant))
        });
        let before = World::of(&run.set);
        let (got, _) = run.deliver(bytes);
        match (&got, known) {
            (Got::Rejected(why), _) => assert_eq!(&got, first_got, "rejected again: {why}"),
            // A malformed body (never registered): `deliver` checked it is a
            // duplicate of its hold, held, or `retry` with the parking full.
            (_, None) => {}
            (_, Some((fp, Some((first_fp, verdict)), _))) if fp == first_fp => {
                assert_eq!(got, Got::Decided(Decision::Duplicate { original: verdict }));
                assert_eq!(World::of(&run.set).objects, before.objects);
            }
            (_, Some((_, Some(_), true))) => {
                let original = Verdict::Conflict(ConflictKind::EventVariant);
                assert_eq!(got, Got::Decided(Decision::Duplicate { original }));
                assert_eq!(World::of(&run.set).objects, before.objects);
            }
            (_, Some((_, Some(_), false))) => assert!(
                matches!(
                    got,
                    Got::Decided(Decision::Conflict(ConflictKind::EventVariant)) | Got::Retry(_)
                ),
                "a variant again: {got:?}"
            ),
            (_, Some((_, None, _))) => assert!(
                !matches!(got, Got::Decided(Decision::Duplicate { .. })),
                "no record, no duplicate: {got:?}"
            ),
        }
    }

    // The counters saw every receipt.
    let c = run.counters.snapshot();
    let sum = |prefix: &str| -> u64 {
        c.iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| v)
            .sum()
    };
    assert_eq!(sum("decision."), run.decided);
    assert_eq!(sum("retry."), run.retried);
    assert_eq!(sum("reject."), run.rejected);
    assert_eq!(sum("held."), c["decision.held"]);
    assert_eq!(sum("conflict."), c["decision.conflict"]);
    c
}
