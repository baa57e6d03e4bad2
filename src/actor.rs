//! Per-object actors and the synchronous step that decides one delivery.
//!
//! A [`Shard`] owns a group of per-object actors (each object's version,
//! state, pause flag and held queue) plus the events parked for objects it does
//! not know yet. One shard is driven by one tokio task (`router.rs`), or by a
//! loom thread in the models: [`Shard::deliver`], [`Shard::pause`] and
//! [`Shard::reconcile`] are plain synchronous methods, so the code that ships
//! is the code that is model-checked.
//!
//! Why per-object actors are logical (structs hosted by a few tasks) rather
//! than one task each: an idle task with its mailbox costs kilobytes, and a few
//! shard tasks are faster than thousands of tasks (see `PERF-NOTES`); the
//! ownership rule is the same — only the owning shard touches an object.

use crate::audit::{AuditEntry, AuditRecord};
use crate::clock::Clock;
use crate::decision::{
    decide_new, reevaluable, ConflictKind, Decision, HoldReason, ObjectView, Verdict, VersionField,
};
use crate::envelope::{
    self, Delivery, Envelope, Limits, MalformedBody, Parsed, RejectReason, StateJson,
};
use crate::registry::{Claim, Registry, DEFAULT_RETENTION};
use crate::sync::{AtomicU64, Ordering};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Receiver configuration. `Config::default()` is the SPEC's defaults.
#[derive(Clone, Debug)]
pub struct Config {
    /// Number of shard tasks the router spreads objects over. Default 16.
    pub shards: usize,
    /// Capacity of each shard's mailbox, in messages; a full mailbox makes
    /// `deliver` wait (backpressure). Default 1024.
    pub mailbox_capacity: usize,
    /// How long event identities are trusted (SPEC §5). Default 24 h.
    pub retention: Duration,
    /// Size and queue limits.
    pub limits: Limits,
    /// The event `type`s this receiver applies. Default `["card.snapshot"]`.
    pub supported_types: Vec<String>,
    /// Keep the audit trail in memory (every decision with its body). Default
    /// true; a load test may turn it off.
    pub audit: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            shards: 16,
            mailbox_capacity: 1024,
            retention: DEFAULT_RETENTION,
            limits: Limits::default(),
            supported_types: vec!["card.snapshot".to_owned()],
            audit: true,
        }
    }
}

/// What every shard shares: the event-identity registry, the clock, the
/// configuration and the receiver-wide audit sequence.
pub struct Context {
    /// The shared event-identity registry.
    registry: Registry,
    /// The clock retention is measured on.
    clock: Arc<dyn Clock>,
    /// The configuration.
    config: Config,
    /// Next audit sequence number; an atomic because every shard draws from it.
    seq: AtomicU64,
}

impl Context {
    /// A context with an empty registry whose retention is `config.retention`.
    pub fn new(config: Config, clock: Arc<dyn Clock>) -> Self {
        Self {
            registry: Registry::new(config.retention),
            clock,
            config,
            seq: AtomicU64::new(1),
        }
    }

    /// The shared event-identity registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Parses one body (SPEC §2). `Err` is a refusal over a configured limit
    /// (not recorded, [`crate::Ack::Reject`]); malformed bodies are `Ok` and
    /// will be held by the actor.
    pub fn parse(&self, body: &[u8]) -> Result<Delivery, RejectReason> {
        envelope::parse(body, &self.config.limits, &self.config.supported_types)
    }

    /// The shard (0-based, below `shards`) that owns `object_id`: a stable hash,
    /// the same in every process and on every run.
    pub fn shard_of(object_id: &str, shards: usize) -> usize {
        (xxhash_rust::xxh3::xxh3_64(object_id.as_bytes()) % shards.max(1) as u64) as usize
    }

    pub(crate) fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }
}

/// A read of one object.
#[derive(Clone, Debug)]
pub struct ObjectState {
    /// Resource identity.
    pub object_id: Arc<str>,
    /// Current version.
    pub version: u64,
    /// Current state snapshot.
    pub state: StateJson,
    /// Whether the object is paused until reconciliation.
    pub paused: bool,
    /// How many events are held for it.
    pub held: usize,
}

/// Why a delivery must be redelivered: nothing was recorded or changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RetryReason {
    /// The object's held queue is at [`Limits::max_held_per_object`].
    #[error("held queue of the object is full ({limit} events)")]
    HeldQueueFull {
        /// The configured limit.
        limit: usize,
    },
    /// Parking for unknown objects is full (per object or per shard).
    #[error("parking for unknown objects is full ({limit} events)")]
    ParkingFull {
        /// The limit that was reached.
        limit: usize,
    },
    /// The receiver is shutting down or its actor stopped.
    #[error("the receiver is shutting down")]
    ShuttingDown,
}

/// What happened to one delivery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Recorded with this decision: acknowledge.
    Decided(Decision),
    /// Not recorded, nothing changed: the sender must redeliver.
    Retry(RetryReason),
    /// Over a configured limit: not recorded, not acknowledged.
    Rejected(RejectReason),
}

/// The answer to one delivery: its decision (or why there is none), what the
/// acknowledgement means, and the object after the step.
#[derive(Clone, Debug)]
pub struct Receipt {
    /// Event identity, when the body had one.
    pub event_id: Option<Arc<str>>,
    /// Resource identity, when the body had one.
    pub object_id: Option<Arc<str>>,
    /// The decision, or why there is none.
    pub outcome: Outcome,
    /// The named object after this step (`None`: unknown object or no decision).
    pub object: Option<ObjectState>,
    /// Whether this step replaced the object's state.
    pub replacement: bool,
}

impl Receipt {
    /// The decision, if one was recorded.
    pub fn decision(&self) -> Option<Decision> {
        match self.outcome {
            Outcome::Decided(d) => Some(d),
            _ => None,
        }
    }

    /// What to tell the sender.
    pub fn ack(&self) -> crate::Ack {
        match &self.outcome {
            Outcome::Decided(d) => d.ack(),
            Outcome::Retry(_) => crate::Ack::Retry,
            Outcome::Rejected(_) => crate::Ack::Reject,
        }
    }

    /// The acknowledgement's meaning in words.
    pub fn ack_meaning(&self) -> String {
        match &self.outcome {
            Outcome::Decided(d) => d.ack_meaning().to_owned(),
            Outcome::Retry(why) => format!("not recorded, redeliver: {why}"),
            Outcome::Rejected(why) => format!("not recorded, not acknowledged: {why}"),
        }
    }

    fn without_decision(delivery: &Delivery, outcome: Outcome) -> Self {
        Self {
            event_id: delivery.event_id().map(Arc::from),
            object_id: delivery.object_id().map(Arc::from),
            outcome,
            object: None,
            replacement: false,
        }
    }

    /// The receipt for a body refused over a limit.
    pub(crate) fn rejected(why: RejectReason) -> Self {
        Self {
            event_id: None,
            object_id: None,
            outcome: Outcome::Rejected(why),
            object: None,
            replacement: false,
        }
    }

    /// The receipt for a delivery the receiver could not take (shutting down).
    pub(crate) fn retry(delivery: &Delivery, why: RetryReason) -> Self {
        Self::without_decision(delivery, Outcome::Retry(why))
    }
}

/// A request to pause another object, produced when a variant names a
/// different object than the first record (SPEC §3.1). The router hands it to
/// the shard owning `object_id`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PauseRequest {
    /// The object to pause.
    pub object_id: Arc<str>,
    /// The event whose variant is the reason.
    pub cause_event: Arc<str>,
}

/// The result of [`Shard::deliver`]: the receipt, and possibly a pause for an
/// object another shard owns.
#[derive(Clone, Debug)]
pub struct Step {
    /// The answer for the caller.
    pub receipt: Receipt,
    /// A pause to deliver to the shard owning that object.
    pub pause: Option<PauseRequest>,
}

/// An input that was held and has not been decided: either still held, or
/// superseded by an authoritative snapshot (SPEC §4: named unresolved input).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnresolvedInput {
    /// Audit sequence number of its arrival.
    pub seq: u64,
    /// Its event identity, if it had one.
    pub event_id: Option<Arc<str>>,
    /// The object it named, if any.
    pub object_id: Option<Arc<str>>,
    /// How it was held: `held` with a reason, or `conflict` with a kind.
    pub held_as: Verdict,
    /// The authority version that superseded it; `None` while it is still held.
    pub superseded_by: Option<u64>,
}

impl UnresolvedInput {
    /// The reason as a wire name: the hold reason or the conflict kind.
    pub fn reason(&self) -> &'static str {
        self.held_as.detail().unwrap_or(self.held_as.as_str())
    }
}

/// Replacement counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// State replacements by events (`applied`, including re-evaluations).
    pub event_replacements: u64,
    /// State replacements (and introductions) by authoritative snapshots.
    pub authority_replacements: u64,
}

impl std::ops::AddAssign for Counters {
    fn add_assign(&mut self, o: Self) {
        self.event_replacements += o.event_replacements;
        self.authority_replacements += o.authority_replacements;
    }
}

/// An event retained as held evidence.
#[derive(Clone, Debug)]
pub(crate) struct HeldEvent {
    /// Audit sequence number of its arrival: re-evaluation follows it.
    pub(crate) seq: u64,
    /// How it was held.
    pub(crate) held_as: Verdict,
    /// The envelope, body included.
    pub(crate) event: Envelope,
}

/// One per-object actor's state: owned by exactly one shard.
#[derive(Clone, Debug)]
pub(crate) struct ObjectActor {
    /// Current version (u64, SPEC §2).
    pub(crate) version: u64,
    /// Current state text.
    pub(crate) state: StateJson,
    /// Semantic digest of `state`, for the equal-version comparison.
    pub(crate) state_digest: u128,
    /// Paused until reconciliation.
    pub(crate) paused: bool,
    /// Held events in arrival order.
    pub(crate) held: Vec<HeldEvent>,
}

impl ObjectActor {
    fn view(&self) -> ObjectView {
        ObjectView {
            version: self.version,
            state: self.state_digest,
            paused: self.paused,
        }
    }

    fn read(&self, object_id: &Arc<str>) -> ObjectState {
        ObjectState {
            object_id: object_id.clone(),
            version: self.version,
            state: self.state.clone(),
            paused: self.paused,
            held: self.held.len(),
        }
    }
}

/// A group of per-object actors owned by one task (or one loom thread).
#[derive(Default)]
pub struct Shard {
    /// Known objects. Only this shard reads or writes them.
    pub(crate) objects: HashMap<Arc<str>, ObjectActor, ahash::RandomState>,
    /// Events for objects not known yet, per object, in arrival order.
    pub(crate) parked: HashMap<Arc<str>, Vec<HeldEvent>, ahash::RandomState>,
    /// Total parked events, for [`Limits::max_parked_per_shard`].
    pub(crate) parked_total: usize,
    /// Bodies that could not name their event, with their bytes.
    pub(crate) malformed: Vec<(u64, MalformedBody)>,
    /// Held inputs that an authority superseded without deciding them.
    pub(crate) superseded: Vec<UnresolvedInput>,
    /// This shard's part of the audit trail, in sequence order.
    pub(crate) audit: Vec<AuditRecord>,
    /// Replacement counts for this shard's objects.
    pub(crate) counters: Counters,
}

impl Shard {
    /// An empty shard.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a known object with its initial version and state (JSON text).
    ///
    /// # Errors
    /// The state is not valid JSON under SPEC §2 (for example a duplicate key).
    pub fn insert_object(
        &mut self,
        ctx: &Context,
        object_id: &str,
        version: u64,
        state_json: &str,
    ) -> Result<(), crate::canon::CanonError> {
        let (state, state_digest) = StateJson::parse(state_json, ctx.config.limits.max_depth)?;
        self.objects.insert(
            Arc::from(object_id),
            ObjectActor {
                version,
                state,
                state_digest,
                paused: false,
                held: Vec::new(),
            },
        );
        Ok(())
    }

    /// Decides one delivery (SPEC §3): identity check, validity, pause,
    /// version comparison; records the decision in the registry and the audit
    /// trail and changes the object's state, as one step. The caller must
    /// route the delivery to the shard that owns its object.
    pub fn deliver(&mut self, ctx: &Context, delivery: Delivery) -> Step {
        match delivery.0 {
            Parsed::Event(event) => self.deliver_event(ctx, event),
            Parsed::Malformed(body) => {
                let seq = ctx.next_seq();
                let receipt = Receipt {
                    event_id: body.event_id.clone(),
                    object_id: body.object_id.clone(),
                    outcome: Outcome::Decided(Decision::Held(HoldReason::Malformed)),
                    object: None,
                    replacement: false,
                };
                self.append(
                    ctx,
                    seq,
                    body.event_id.clone(),
                    body.object_id.clone(),
                    || AuditEntry::Malformed {
                        bytes: body.bytes.clone(),
                        error: body.error.clone(),
                    },
                );
                tracing::debug!(error = %body.error, "malformed body held");
                self.malformed.push((seq, body));
                Step {
                    receipt,
                    pause: None,
                }
            }
        }
    }

    fn deliver_event(&mut self, ctx: &Context, event: Envelope) -> Step {
        let now = ctx.clock.now();
        let retention = ctx.config.retention;
        let older = event
            .occurred_at
            .is_some_and(|t| now.duration_since(t).is_ok_and(|age| age > retention));
        let facts = event.facts(older);
        let object = self.objects.get(&event.object_id);
        let view = object.map(ObjectActor::view);
        let room = self.room_to_hold(&ctx.config.limits, &event.object_id);
        // The first record names the object by the object's own id when it is
        // known, so a remembered identity does not keep this delivery's copy
        // of the id alive (about 32 bytes per identity).
        let object_id = self
            .objects
            .get_key_value(&event.object_id)
            .map_or_else(|| event.object_id.clone(), |(id, _)| id.clone());

        let claim = ctx
            .registry
            .claim(&event.event_id, event.fingerprint, &object_id, now, || {
                let verdict = decide_new(&facts, view.as_ref());
                (!verdict.is_hold() || room.is_ok()).then_some(verdict)
            });
        let seq = ctx.next_seq();
        let mut pause = None;
        let (decision, replacement) = match claim {
            Claim::First(verdict) => {
                let replacement = self.settle(seq, verdict, event.clone());
                (Decision::from(verdict), replacement)
            }
            Claim::Same(original) => (Decision::Duplicate { original }, false),
            Claim::Variant { first_object } => {
                if let Err(why) = room {
                    return Step {
                        receipt: Receipt::retry(&Delivery(Parsed::Event(event)), why),
                        pause: None,
                    };
                }
                let verdict = Verdict::Conflict(ConflictKind::EventVariant);
                if first_object != event.object_id {
                    pause = Some(PauseRequest {
                        object_id: first_object,
                        cause_event: event.event_id.clone(),
                    });
                }
                self.settle(seq, verdict, event.clone());
                (Decision::from(verdict), false)
            }
            Claim::NotRecorded => {
                let why = room.err().unwrap_or(RetryReason::ShuttingDown);
                return Step {
                    receipt: Receipt::retry(&Delivery(Parsed::Event(event)), why),
                    pause: None,
                };
            }
        };
        let object = self
            .objects
            .get(&event.object_id)
            .map(|o| o.read(&event.object_id));
        self.append(
            ctx,
            seq,
            Some(event.event_id.clone()),
            Some(event.object_id.clone()),
            || AuditEntry::Delivery {
                decision,
                version: object.as_ref().map(|o| o.version),
                replacement,
                body: event.body.clone(),
            },
        );
        tracing::debug!(
            event_id = %event.event_id,
            object_id = %event.object_id,
            %decision,
            "delivery decided"
        );
        Step {
            receipt: Receipt {
                event_id: Some(event.event_id),
                object_id: Some(event.object_id),
                outcome: Outcome::Decided(decision),
                object,
                replacement,
            },
            pause,
        }
    }

    /// Whether one more event may be held for `object_id` without passing a
    /// queue limit.
    fn room_to_hold(&self, limits: &Limits, object_id: &Arc<str>) -> Result<(), RetryReason> {
        if let Some(o) = self.objects.get(object_id) {
            return if o.held.len() < limits.max_held_per_object {
                Ok(())
            } else {
                Err(RetryReason::HeldQueueFull {
                    limit: limits.max_held_per_object,
                })
            };
        }
        let here = self.parked.get(object_id).map_or(0, Vec::len);
        if here >= limits.max_parked_per_object {
            Err(RetryReason::ParkingFull {
                limit: limits.max_parked_per_object,
            })
        } else if self.parked_total >= limits.max_parked_per_shard {
            Err(RetryReason::ParkingFull {
                limit: limits.max_parked_per_shard,
            })
        } else {
            Ok(())
        }
    }

    /// Carries out a verdict on the event's object: replace, pause, hold or
    /// park. Returns whether the state was replaced.
    fn settle(&mut self, seq: u64, verdict: Verdict, event: Envelope) -> bool {
        let Some(object) = self.objects.get_mut(&event.object_id) else {
            if verdict.is_hold() {
                self.parked_total += 1;
                self.parked
                    .entry(event.object_id.clone())
                    .or_default()
                    .push(HeldEvent {
                        seq,
                        held_as: verdict,
                        event,
                    });
            }
            return false;
        };
        match verdict {
            Verdict::Applied => {
                let (VersionField::Valid(version), Some((state, digest))) =
                    (event.version, event.state)
                else {
                    // decide_new applies only events with a valid version and a state.
                    return false;
                };
                object.version = version;
                object.state = state;
                object.state_digest = digest;
                self.counters.event_replacements += 1;
                true
            }
            Verdict::Stale | Verdict::Equal => false,
            Verdict::Conflict(_) => {
                object.paused = true;
                object.held.push(HeldEvent {
                    seq,
                    held_as: verdict,
                    event,
                });
                false
            }
            Verdict::Held(_) => {
                object.held.push(HeldEvent {
                    seq,
                    held_as: verdict,
                    event,
                });
                false
            }
        }
    }

    /// Pauses a known object because of a variant seen by another shard.
    /// Returns whether the object is known here (unknown objects are not paused).
    pub fn pause(&mut self, ctx: &Context, request: &PauseRequest) -> bool {
        let Some(object) = self.objects.get_mut(&request.object_id) else {
            return false;
        };
        object.paused = true;
        let seq = ctx.next_seq();
        self.append(
            ctx,
            seq,
            Some(request.cause_event.clone()),
            Some(request.object_id.clone()),
            || AuditEntry::Paused {
                cause_event: request.cause_event.clone(),
            },
        );
        tracing::info!(object_id = %request.object_id, cause_event = %request.cause_event, "object paused by a variant");
        true
    }

    /// Appends to the audit trail when it is kept.
    pub(crate) fn append(
        &mut self,
        ctx: &Context,
        seq: u64,
        event_id: Option<Arc<str>>,
        object_id: Option<Arc<str>>,
        entry: impl FnOnce() -> AuditEntry,
    ) {
        if ctx.config.audit {
            self.audit.push(AuditRecord {
                seq,
                at: ctx.clock.now(),
                event_id,
                object_id,
                entry: entry(),
            });
        }
    }

    /// A read of one object.
    pub fn object(&self, object_id: &str) -> Option<ObjectState> {
        self.objects
            .get_key_value(object_id)
            .map(|(id, o)| o.read(id))
    }

    /// Reads of every known object, in no particular order.
    pub fn objects(&self) -> Vec<ObjectState> {
        self.objects.iter().map(|(id, o)| o.read(id)).collect()
    }

    /// This shard's audit records, in sequence order.
    pub fn audit(&self) -> &[AuditRecord] {
        &self.audit
    }

    /// Replacement counts of this shard.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Every input this shard holds or that an authority superseded, in
    /// arrival order.
    pub fn unresolved(&self) -> Vec<UnresolvedInput> {
        let held = |object_id: &Arc<str>, h: &HeldEvent| UnresolvedInput {
            seq: h.seq,
            event_id: Some(h.event.event_id.clone()),
            object_id: Some(object_id.clone()),
            held_as: h.held_as,
            superseded_by: None,
        };
        let mut all: Vec<UnresolvedInput> = self.superseded.clone();
        for (id, o) in &self.objects {
            all.extend(o.held.iter().map(|h| held(id, h)));
        }
        for (id, list) in &self.parked {
            all.extend(list.iter().map(|h| held(id, h)));
        }
        all.extend(self.malformed.iter().map(|(seq, m)| UnresolvedInput {
            seq: *seq,
            event_id: m.event_id.clone(),
            object_id: m.object_id.clone(),
            held_as: Verdict::Held(HoldReason::Malformed),
            superseded_by: None,
        }));
        all.sort_by_key(|u| u.seq);
        all
    }

    /// Re-decides the held events of one object after its authority, in
    /// arrival order (SPEC §4). Returns one line per event.
    pub(crate) fn reevaluate(
        &mut self,
        ctx: &Context,
        object_id: &Arc<str>,
        authority_version: u64,
        mut held: Vec<HeldEvent>,
    ) -> Vec<Reevaluation> {
        held.sort_by_key(|h| h.seq);
        let mut lines = Vec::with_capacity(held.len());
        for h in held {
            let Some(object) = self.objects.get(object_id) else {
                break;
            };
            let held_as = h.held_as;
            let event_id = h.event.event_id.clone();
            let verdict = reevaluable(held_as)
                .then(|| decide_new(&h.event.facts(false), Some(&object.view())));
            let seq = ctx.next_seq();
            let outcome = match verdict {
                // Still (or again) paused: the event stays held under its
                // arrival position, never lost.
                Some(v @ (Verdict::Held(HoldReason::Paused) | Verdict::Conflict(_))) => {
                    self.settle(h.seq, v, h.event);
                    ReevaluationOutcome::Decided(v, false)
                }
                Some(v @ (Verdict::Applied | Verdict::Stale | Verdict::Equal)) => {
                    ReevaluationOutcome::Decided(v, self.settle(seq, v, h.event))
                }
                // Evidence that cannot be decided (the original hold, or one the
                // object's arrival revealed): superseded by the authority.
                Some(revealed) => {
                    self.supersede(h.seq, &event_id, object_id, revealed, authority_version)
                }
                None => self.supersede(h.seq, &event_id, object_id, held_as, authority_version),
            };
            let entry = match outcome {
                ReevaluationOutcome::Decided(decision, replacement) => AuditEntry::Reevaluated {
                    held_as,
                    decision,
                    replacement,
                },
                ReevaluationOutcome::Unresolved(held_as) => AuditEntry::Unresolved {
                    held_as,
                    superseded_by: authority_version,
                },
            };
            self.append(
                ctx,
                seq,
                Some(event_id.clone()),
                Some(object_id.clone()),
                || entry,
            );
            lines.push(Reevaluation {
                event_id,
                outcome,
                object: self.object(object_id),
            });
        }
        lines
    }
}

impl Shard {
    fn supersede(
        &mut self,
        seq: u64,
        event_id: &Arc<str>,
        object_id: &Arc<str>,
        held_as: Verdict,
        authority_version: u64,
    ) -> ReevaluationOutcome {
        self.superseded.push(UnresolvedInput {
            seq,
            event_id: Some(event_id.clone()),
            object_id: Some(object_id.clone()),
            held_as,
            superseded_by: Some(authority_version),
        });
        ReevaluationOutcome::Unresolved(held_as)
    }
}

/// What reconciliation did with one held event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReevaluationOutcome {
    /// Decided by the normal rules; `true` when that replaced the state.
    /// A `held (paused)` or `conflict` verdict means it is held again.
    Decided(Verdict, bool),
    /// Not decidable: named unresolved input, superseded by the authority;
    /// carries how it was held.
    Unresolved(Verdict),
}

/// One line of reconciliation: a held event and what became of it.
#[derive(Clone, Debug)]
pub struct Reevaluation {
    /// The held event's identity.
    pub event_id: Arc<str>,
    /// What became of it.
    pub outcome: ReevaluationOutcome,
    /// The object after this line.
    pub object: Option<ObjectState>,
}
