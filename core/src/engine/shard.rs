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
//! shard tasks are faster than thousands of tasks (measured: docs/BENCHMARKS.md, *Memory*); the
//! ownership rule is the same — only the owning shard touches an object.

use super::budget::{STORED_WAITING_OVERHEAD, WAITING_OVERHEAD};
use super::fetch::{Fetch, Missing, WorkingSet};
use super::journal::{audit_row, effect_row, Journal};
use super::objects::{held_bytes, HeldEvent, HeldQueue, ObjectActor, Objects, WaitingMalformed};
use super::trail::{Trail, TrailGap};
use super::{
    Cause, Context, EffectRecord, ObjectState, Outcome, PauseRequest, Receipt, Reevaluation,
    ReevaluationOutcome, ReplacementCounts, RetryReason, Step, UnresolvedInput,
};
use crate::audit::{AuditEntry, AuditRecord};
use crate::decision::{
    decide_new, decide_new_aged, reevaluable, ConflictKind, Decision, HoldReason, Verdict,
    VersionField,
};
use crate::envelope::{Delivery, Envelope, MalformedBody, Parsed, StateJson};
use crate::registry::Claim;
use crate::write::{
    retention_cutoff, Expect, HeldKey, HeldRow, HeldStatus, ObjectRow, ReceiptRow, VariantRow,
    Write,
};
use std::collections::HashMap;
use std::sync::Arc;

/// A group of per-object actors owned by one task (or one loom thread).
#[derive(Default)]
pub struct Shard {
    /// Known objects. Only this shard reads or writes them.
    pub(crate) objects: Objects,
    /// Events for objects not known yet, per object, in arrival order.
    pub(crate) parked: HashMap<Arc<str>, HeldQueue, ahash::RandomState>,
    /// Total parked events, for [`Limits::max_parked_per_shard`].
    pub(crate) parked_total: usize,
    /// Bytes the parked events keep ([`crate::MemoryBudget::waiting`]).
    pub(crate) parked_bytes: usize,
    /// Bytes the malformed bodies keep ([`crate::MemoryBudget::waiting`]).
    pub(crate) malformed_bytes: usize,
    /// Bodies that could not name their event (their bytes only without a
    /// store to read them from).
    pub(crate) malformed: Vec<WaitingMalformed>,
    /// How many of `malformed` have no digest yet (resumed without their
    /// bodies): a malformed delivery reads them first.
    pub(crate) undigested: usize,
    /// The digests of the exact bytes of `malformed` (XXH3-128), each with
    /// how many entries have it: a malformed body is recognised by them, so
    /// its redelivery is a duplicate instead of a new held row.
    pub(crate) malformed_digests: HashMap<u128, usize, ahash::RandomState>,
    /// Held inputs that an authority superseded without deciding them.
    pub(crate) superseded: Vec<UnresolvedInput>,
    /// This shard's part of the audit trail, in sequence order: the most
    /// recent records, up to its share of [`crate::Config::trail_capacity`].
    pub(crate) audit: Trail<AuditRecord>,
    /// Replacement counts for this shard's objects, this run (not resumed
    /// from a store).
    pub(crate) counters: ReplacementCounts,
    /// Uncommitted steps for a durable store; `None` with the in-memory store.
    pub(crate) journal: Option<Journal>,
    /// State replacements of this shard's objects, in order: the history and
    /// the outbox (kept in memory when [`crate::Config::audit`] is on; the
    /// most recent, up to its share of [`crate::Config::trail_capacity`]).
    pub(crate) replacements: Trail<EffectRecord>,
    /// The bounded working set of a shard that reads objects on demand
    /// ([`Shard::bound_objects`]); `None`: every object stays in memory.
    pub(crate) working: Option<WorkingSet>,
    /// Replacements made since the driver last took them
    /// ([`Shard::take_effects`]); `None` while nobody listens
    /// ([`Shard::tap_effects`]), so nothing is copied.
    pub(crate) tapped: Option<Vec<EffectRecord>>,
    /// The loom models' must-fail controls of a shard (`controls.rs`).
    pub(crate) controls: crate::engine::controls::ShardControls,
}

/// Why [`Shard::deliver_event`] gave its event back undecided.
enum Interrupted {
    /// The identity's stripe was evicted since its look-up: look again.
    Evicted(Box<Envelope>),
    /// A variant's first record names an object of this shard that must be
    /// read from the store first.
    Fetch(Box<Envelope>, Fetch),
}

impl Shard {
    /// An empty shard.
    pub fn new() -> Self {
        Self::default()
    }

    /// The store row of an initial object, checked as
    /// [`Shard::insert_object`] checks it, for a durable receiver that seeds
    /// its store instead of holding the object (the state compacted, not
    /// paused).
    ///
    /// # Errors
    /// The state is not valid JSON under `ctx`'s depth limit.
    pub fn seed_row(
        ctx: &Context,
        object_id: &str,
        version: u64,
        state_json: &str,
    ) -> Result<ObjectRow, crate::canon::CanonError> {
        let (state, _) = StateJson::parse(state_json, ctx.config.limits.max_depth)?;
        Ok(ObjectRow {
            object_id: Arc::from(object_id),
            version,
            state: state.compact(),
            paused: false,
        })
    }

    /// Adds a known object with its initial version and state (JSON text).
    ///
    /// # Errors
    /// The state is not valid JSON under docs/CONTRACT.md §2 (for example a duplicate key).
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
                held: HeldQueue::default(),
                used: 0,
            },
        );
        Ok(())
    }

    /// Decides one delivery (docs/CONTRACT.md §3): identity check, validity, pause,
    /// version comparison; records the decision in the registry and the audit
    /// trail and changes the object's state, as one step. The caller must
    /// route the delivery to the shard that owns its object.
    ///
    /// A bounded shard ([`Shard::bound_objects`]) does no IO: a delivery
    /// whose object or event identity is only in the store is answered
    /// `retry` here, nothing changed. Its driver reads them first
    /// ([`Shard::plan_fetch`]), as [`crate::engine::Pipeline`] does.
    pub fn deliver(&mut self, ctx: &Context, delivery: Delivery) -> Step {
        match self.step(ctx, delivery) {
            Ok(step) => step,
            Err(stopped) => {
                let (delivery, fetch) = *stopped;
                Step {
                    receipt: Receipt::retry(&delivery, RetryReason::StoreFailed(fetch.not_read())),
                    pause: None,
                }
            }
        }
    }

    /// [`Shard::deliver`] for a driver that reads: `Err` hands the delivery
    /// back, nothing changed, with what must be read from the store before
    /// it is decided again ([`Shard::fetched`]).
    pub(crate) fn step(
        &mut self,
        ctx: &Context,
        delivery: Delivery,
    ) -> Result<Step, Box<(Delivery, Fetch)>> {
        match delivery.0 {
            Parsed::Event(mut event) => {
                let id = event.object_id_shared();
                // A bounded registry: each claim that found the identity's
                // stripe evicted meanwhile reads the store again.
                loop {
                    let looked_up = self
                        .fault_in(ctx, &id)
                        .and_then(|()| self.identity_stamp(ctx, &event.event_id));
                    let stamp = match looked_up {
                        Ok(stamp) => stamp,
                        Err(Missing::Fetch(fetch)) => {
                            return Err(Box::new((Delivery(Parsed::Event(event)), fetch)))
                        }
                        Err(Missing::Failed(e)) => {
                            self.mark_unread(&id, &e);
                            let delivery = Delivery(Parsed::Event(event));
                            return Ok(Step {
                                receipt: Receipt::retry(&delivery, RetryReason::StoreFailed(e)),
                                pause: None,
                            });
                        }
                    };
                    match self.deliver_event(ctx, event, stamp) {
                        Ok(step) => {
                            self.touch(&id);
                            return Ok(step);
                        }
                        Err(Interrupted::Evicted(evicted)) => {
                            self.forget_identity(&evicted.event_id);
                            event = *evicted;
                        }
                        Err(Interrupted::Fetch(event, fetch)) => {
                            return Err(Box::new((Delivery(Parsed::Event(*event)), fetch)))
                        }
                    }
                }
            }
            Parsed::Malformed(body) => match self.digests_in(ctx) {
                Ok(()) => Ok(self.deliver_malformed(ctx, body)),
                Err(Missing::Fetch(fetch)) => {
                    Err(Box::new((Delivery(Parsed::Malformed(body)), fetch)))
                }
                Err(Missing::Failed(e)) => {
                    let delivery = Delivery(Parsed::Malformed(body));
                    Ok(Step {
                        receipt: Receipt::retry(&delivery, RetryReason::StoreFailed(e)),
                        pause: None,
                    })
                }
            },
        }
    }

    /// A body that is not an event: held as malformed (a redelivery of
    /// the same bytes is its duplicate), or `retry` when the parking is
    /// full.
    fn deliver_malformed(&mut self, ctx: &Context, body: MalformedBody) -> Step {
        if self.malformed_digests.contains_key(&body.digest()) {
            return self.deliver_malformed_again(ctx, body);
        }
        // Malformed bodies share the shard's parking limit: a flood of
        // them gets backpressure instead of growing memory.
        let limit = ctx.config.limits.max_parked_per_shard;
        let room = if self.parked_total + self.malformed.len() >= limit {
            Err(RetryReason::ParkingFull { limit })
        } else {
            self.room_to_wait(ctx, body.bytes.len() + body.error.len())
        };
        if let Err(why) = room {
            let delivery = Delivery(Parsed::Malformed(body));
            return Step {
                receipt: Receipt::retry(&delivery, why),
                pause: None,
            };
        }
        self.begin_step(&[], None);
        let seq = ctx.next_seq();
        let receipt = Receipt {
            event_id: body.event_id.clone(),
            object_id: body.object_id.clone(),
            outcome: Outcome::Decided(Decision::Held(HoldReason::Malformed)),
            object: None,
            replacement: false,
            created: false,
        };
        let key = ctx.key(seq);
        self.write(|| {
            Write::Held(HeldRow {
                key,
                at: ctx.clock.now(),
                event_id: body.event_id.clone(),
                object_id: body.object_id.clone(),
                held_as: Verdict::Held(HoldReason::Malformed),
                body: body.bytes.clone(),
                status: HeldStatus::Malformed,
                superseded_by: None,
                detail: Some(body.error.clone()),
            })
        });
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
        self.hold_malformed(seq, key, body);
        Step {
            receipt,
            pause: None,
        }
    }

    /// Keeps a malformed body among the shard's unresolved inputs, known by
    /// the digest of its bytes; the bytes themselves only without a store
    /// to read them from ([`Shard::bodies_in_store`]).
    pub(crate) fn hold_malformed(&mut self, seq: u64, key: HeldKey, body: MalformedBody) {
        let digest = body.digest();
        *self.malformed_digests.entry(digest).or_default() += 1;
        let waiting = WaitingMalformed {
            seq,
            key,
            digest: Some(digest),
            event_id: body.event_id.clone(),
            object_id: body.object_id.clone(),
            body: (!self.bodies_in_store()).then_some(body),
        };
        self.malformed_bytes += malformed_bytes(&waiting);
        self.malformed.push(waiting);
    }

    /// Keeps a stored malformed row resumed without its body: its digest
    /// is read when a malformed delivery needs it.
    pub(crate) fn resume_malformed(
        &mut self,
        seq: u64,
        key: HeldKey,
        event_id: Option<Arc<str>>,
        object_id: Option<Arc<str>>,
    ) {
        let waiting = WaitingMalformed {
            seq,
            key,
            digest: None,
            event_id,
            object_id,
            body: None,
        };
        self.undigested += 1;
        self.malformed_bytes += malformed_bytes(&waiting);
        self.malformed.push(waiting);
    }

    /// Forgets the malformed bodies from index `len` on (a rolled-back step
    /// held them).
    pub(crate) fn truncate_malformed(&mut self, len: usize) {
        for waiting in self.malformed.drain(len.min(self.malformed.len())..) {
            self.malformed_bytes -= malformed_bytes(&waiting);
            let Some(digest) = waiting.digest else {
                self.undigested -= 1;
                continue;
            };
            if let Some(n) = self.malformed_digests.get_mut(&digest) {
                *n -= 1;
                if *n == 0 {
                    self.malformed_digests.remove(&digest);
                }
            }
        }
    }

    /// A malformed body whose exact bytes are already held: a redelivery,
    /// `duplicate` of `held (malformed)`, recorded in the audit trail with
    /// no new held row and no room taken in the parking.
    fn deliver_malformed_again(&mut self, ctx: &Context, body: MalformedBody) -> Step {
        self.begin_step(&[], None);
        let seq = ctx.next_seq();
        let decision = Decision::Duplicate {
            original: Verdict::Held(HoldReason::Malformed),
        };
        self.append(
            ctx,
            seq,
            body.event_id.clone(),
            body.object_id.clone(),
            || AuditEntry::Delivery {
                decision,
                version: None,
                replacement: false,
                created: false,
                body: Arc::from(String::from_utf8_lossy(&body.bytes)),
            },
        );
        tracing::debug!(error = %body.error, "malformed body delivered again");
        Step {
            receipt: Receipt {
                event_id: body.event_id,
                object_id: body.object_id,
                outcome: Outcome::Decided(decision),
                object: None,
                replacement: false,
                created: false,
            },
            pause: None,
        }
    }

    /// Decides `event`, its identity claimed against `stamp` (see
    /// [`crate::Registry::claim_checked`]); `Err` gives the event back,
    /// nothing decided, when its identity's stripe was evicted since the
    /// look-up, or when a variant's first record names an object of this
    /// shard that must be read from the store first.
    fn deliver_event(
        &mut self,
        ctx: &Context,
        mut event: Envelope,
        stamp: Option<u64>,
    ) -> Result<Step, Interrupted> {
        let now = ctx.clock.now();
        let retention = ctx.config.retention;
        // `occurred_at` is parsed only if the verdict depends on its age.
        let facts = event.facts(false);
        // One lookup of the object. From here on the delivery names it by
        // the object's own id when it is known: no copy of the id per
        // delivery.
        let known = self.objects.get_key_value(event.object_id());
        let view = known.map(|(_, o)| o.view());
        let room = self.room_to_hold(ctx, &event, known.map(|(_, o)| o));
        let grow = self.room_to_grow(ctx, &event, known.map(|(_, o)| o));
        let object_id = known.map_or_else(|| event.object_id_shared(), |(id, _)| id.clone());
        event.share_object_id(object_id.clone());
        let policy = ctx.config.equal_versions;
        let unknown_objects = ctx.config.profile.unknown_objects();

        // A first record draws its audit sequence number under the identity's
        // lock, so a variant (which can only see the record afterwards) always
        // follows it in the audit trail, whichever shard records it.
        let first_seq = std::cell::Cell::new(None);
        // Why a first record was not recorded (a full queue or budget).
        let refused = std::cell::Cell::new(None);
        // The registry copies the object id's bytes into its own record, so
        // this delivery's `Arc` is not kept alive by a remembered identity.
        let claim = ctx.registry.claim_checked(
            &event.event_id,
            event.fingerprint,
            &object_id,
            now,
            stamp,
            || {
                let older = || event.older_than(now, retention);
                let verdict =
                    decide_new_aged(&facts, older, view.as_ref(), policy, unknown_objects);
                let room = match verdict {
                    v if v.is_hold() => room.clone(),
                    Verdict::Applied => grow.clone(),
                    _ => Ok(()),
                };
                match room {
                    Ok(()) => {
                        first_seq.set(Some(ctx.next_seq()));
                        Some(verdict)
                    }
                    Err(why) => {
                        refused.set(Some(why));
                        None
                    }
                }
            },
        );
        if matches!(claim, Claim::Evicted) {
            return Err(Interrupted::Evicted(Box::new(event)));
        }
        if matches!(claim, Claim::NotRecorded) {
            let why = refused.take().unwrap_or(RetryReason::ShuttingDown);
            return Ok(Step {
                receipt: Receipt::retry(&Delivery(Parsed::Event(event)), why),
                pause: None,
            });
        }
        if let (Claim::Variant { .. }, Err(why)) = (&claim, &room) {
            return Ok(Step {
                receipt: Receipt::retry(&Delivery(Parsed::Event(event.clone())), why.clone()),
                pause: None,
            });
        }
        // A variant naming another object than its first record pauses that
        // object as part of this step (docs/CONTRACT.md §3.6): directly when
        // this shard owns it (read from the store first when it is not in
        // memory: a failed read records nothing and answers `retry`).
        let pause_here = match &claim {
            Claim::Variant { first_object, .. }
                if *first_object != object_id && ctx.same_shard(first_object, &object_id) =>
            {
                match self.fault_in(ctx, first_object) {
                    Ok(()) => {}
                    Err(Missing::Fetch(fetch)) => {
                        return Err(Interrupted::Fetch(Box::new(event), fetch))
                    }
                    Err(Missing::Failed(e)) => {
                        self.mark_unread(&object_id, &e);
                        let delivery = Delivery(Parsed::Event(event));
                        return Ok(Step {
                            receipt: Receipt::retry(&delivery, RetryReason::StoreFailed(e)),
                            pause: None,
                        });
                    }
                }
                Some(first_object.clone())
            }
            _ => None,
        };
        match &pause_here {
            Some(other) => self.begin_step(&[&object_id, other], Some(&event.event_id)),
            None => self.begin_step(&[&object_id], Some(&event.event_id)),
        }
        let seq = first_seq.get().unwrap_or_else(|| ctx.next_seq());
        let mut pause = None;
        // An event applied to an object this shard did not know created it
        // (`UnknownObjectPolicy::CreateOnFirstSnapshot`).
        let mut created = false;
        let (decision, replacement) = match claim {
            Claim::First(verdict) => {
                self.note_receipt(ReceiptRow {
                    event_id: event.event_id.clone(),
                    fingerprint: event.fingerprint,
                    object_id: object_id.clone(),
                    decision: verdict,
                    first_seen: now,
                    retention_cutoff: retention_cutoff(now, retention),
                });
                let replacement = self.settle(ctx, seq, verdict, event.clone(), None);
                created = replacement && view.is_none();
                (Decision::from(verdict), replacement)
            }
            Claim::Same(original) => {
                self.check_read(&object_id);
                (Decision::Duplicate { original }, false)
            }
            // Another delivery of this very variant recorded it since the
            // claim: this one is its duplicate (docs/CONTRACT.md §3.1).
            Claim::Variant { .. }
                if !ctx
                    .registry
                    .record_variant(&event.event_id, event.fingerprint, now) =>
            {
                self.check_read(&object_id);
                let original = Verdict::Conflict(ConflictKind::EventVariant);
                (Decision::Duplicate { original }, false)
            }
            Claim::Variant {
                first_object,
                first_fingerprint,
            } => {
                self.note_variant(VariantRow {
                    event_id: event.event_id.clone(),
                    fingerprint: event.fingerprint,
                    object_id: object_id.clone(),
                    first_seen: now,
                });
                let verdict = Verdict::Conflict(ConflictKind::EventVariant);
                if first_object != object_id && pause_here.is_none() {
                    let first = (&event.event_id, first_fingerprint);
                    pause = Some(self.pause_elsewhere(ctx, first_object, first));
                }
                self.settle(ctx, seq, verdict, event.clone(), None);
                (Decision::from(verdict), false)
            }
            Claim::NotRecorded | Claim::Evicted => unreachable!("answered above"),
        };
        let object = self.objects.get(&object_id).map(|o| o.read(&object_id));
        self.append(
            ctx,
            seq,
            Some(event.event_id.clone()),
            Some(object_id.clone()),
            || AuditEntry::Delivery {
                decision,
                version: object.as_ref().map(|o| o.version),
                replacement,
                created,
                body: event.body.clone(),
            },
        );
        if let (Some(other), Decision::Conflict(ConflictKind::EventVariant)) =
            (&pause_here, decision)
        {
            self.pause_known(ctx, other, &event.event_id, ctx.next_seq());
        }
        tracing::debug!(
            event_id = %event.event_id,
            object_id = %object_id,
            %decision,
            "delivery decided"
        );
        Ok(Step {
            receipt: Receipt {
                event_id: Some(event.event_id),
                object_id: Some(object_id),
                outcome: Outcome::Decided(decision),
                object,
                replacement,
                created,
            },
            pause,
        })
    }

    /// With a durable store, writes that the object row this step read (if
    /// this shard holds it) must still be as read when the step commits: a
    /// duplicate changes no row, but its receipt shows the object, so with
    /// several processes on one store a row another process changed since
    /// makes the group be decided again on the committed row.
    fn check_read(&mut self, object_id: &Arc<str>) {
        if !self.journaled() {
            return;
        }
        if let Some(object) = self.objects.get(object_id) {
            let (version, paused) = (object.version, object.paused);
            self.write(|| Write::Check {
                object_id: object_id.clone(),
                version,
                paused,
            });
        }
    }

    /// Bytes of the bodies waiting in this shard: held, parked, malformed
    /// ([`crate::MemoryBudget::waiting`]).
    pub(crate) fn waiting_bytes(&self) -> usize {
        self.objects.held_bytes() + self.parked_bytes + self.malformed_bytes
    }

    /// Whether a body of `bytes` more may wait in this shard within its
    /// share of [`crate::MemoryBudget::waiting`]. One always may when
    /// nothing waits, so that any accepted body can be held: a shard's
    /// waiting bytes stay under its share plus one body. A shard whose
    /// waiting bodies stay in the store ([`Shard::bodies_in_store`])
    /// always may: memory keeps a body only until its hold commits.
    fn room_to_wait(&self, ctx: &Context, bytes: usize) -> Result<(), RetryReason> {
        if self.bodies_in_store() {
            return Ok(());
        }
        let now = self.waiting_bytes();
        let limit = ctx.waiting_share();
        if now == 0 || now + bytes + WAITING_OVERHEAD <= limit {
            Ok(())
        } else {
            Err(RetryReason::MemoryFull {
                part: "waiting",
                limit,
            })
        }
    }

    /// Whether an in-memory shard (one that cannot evict objects) may
    /// replace `known`'s state, or create the object, with `event`'s state
    /// within its share of [`crate::MemoryBudget::objects`]. A bounded
    /// shard always may: its working set evicts instead.
    fn room_to_grow(
        &self,
        ctx: &Context,
        event: &Envelope,
        known: Option<&ObjectActor>,
    ) -> Result<(), RetryReason> {
        if self.bounded() {
            return Ok(());
        }
        let Some((state, _)) = event.state.as_ref() else {
            return Ok(());
        };
        let freed = known.map_or(0, |o| o.state.text_len());
        let after = (self.objects.state_bytes() + state.text_len()).saturating_sub(freed);
        let limit = ctx.objects_share();
        if after <= limit || after <= self.objects.state_bytes() {
            Ok(())
        } else {
            Err(RetryReason::MemoryFull {
                part: "objects",
                limit,
            })
        }
    }

    /// Whether one more event may be held for `object_id` without passing a
    /// queue limit or the waiting bytes; `known` is the object when this
    /// shard knows it.
    fn room_to_hold(
        &self,
        ctx: &Context,
        event: &Envelope,
        known: Option<&ObjectActor>,
    ) -> Result<(), RetryReason> {
        let limits = &ctx.config.limits;
        let object_id = event.object_id();
        self.room_to_wait(ctx, event.body.len())?;
        if let Some(o) = known {
            return if o.held.len() < limits.max_held_per_object {
                Ok(())
            } else {
                Err(RetryReason::HeldQueueFull {
                    limit: limits.max_held_per_object,
                })
            };
        }
        let here = self.parked.get(object_id).map_or(0, |q| q.len());
        if here >= limits.max_parked_per_object {
            Err(RetryReason::ParkingFull {
                limit: limits.max_parked_per_object,
            })
        } else if self.parked_total + self.malformed.len() >= limits.max_parked_per_shard {
            Err(RetryReason::ParkingFull {
                limit: limits.max_parked_per_shard,
            })
        } else {
            Ok(())
        }
    }

    /// Carries out a verdict on the event's object: replace, pause, hold or
    /// park, with the writes a durable store needs. `existing` is the held
    /// row when the event was already held (reconciliation); `None` inserts a
    /// new one. Returns whether the state was replaced.
    pub(crate) fn settle(
        &mut self,
        ctx: &Context,
        seq: u64,
        verdict: Verdict,
        mut event: Envelope,
        existing: Option<HeldKey>,
    ) -> bool {
        if verdict != Verdict::Applied {
            // Only an applied event makes an effect to carry its trace to;
            // a held one is stored without it, so it keeps none in memory
            // either (applied later, its effect has no trace).
            event.trace = None;
        }
        let id = event.object_id_shared();
        let journaled = self.journaled();
        let Some(mut object) = self.objects.get_mut(&id) else {
            if verdict == Verdict::Applied {
                return self.create(ctx, seq, id, event);
            }
            if verdict.is_hold() {
                let key = existing.unwrap_or_else(|| ctx.key(seq));
                if journaled && existing.is_none() {
                    let row = held_row(ctx, key, verdict, &event, HeldStatus::Parked);
                    self.write(|| Write::Held(row));
                }
                let held = HeldEvent::new(seq, key, verdict, event);
                self.parked_total += 1;
                self.parked_bytes += held_bytes(&held);
                self.note_body(&id, key);
                self.parked.entry(id).or_default().push(held);
            }
            return false;
        };
        let before = Expect::Version {
            version: object.version,
            paused: object.paused,
        };
        let mut write = None;
        let replaced = match verdict {
            Verdict::Applied => {
                let (VersionField::Valid(version), Some((state, digest))) =
                    (event.version, event.state.as_ref())
                else {
                    // decide_new applies only events with a valid version and a state.
                    return false;
                };
                object.version = version;
                object.state = state.clone();
                object.state_digest = *digest;
                self.counters.event_replacements += 1;
                if journaled {
                    write = Some(Write::Object {
                        row: object.row(&id),
                        expect: before,
                    });
                }
                let replacement = EffectRecord {
                    seq,
                    at: ctx.clock.now(),
                    object_id: id.clone(),
                    version,
                    state: state.clone(),
                    cause: Cause::Event(event.event_id.clone()),
                    forced: None,
                    trace: event.trace.clone(),
                };
                drop(object);
                if let Some(w) = write.take() {
                    self.write(|| w);
                }
                self.record_replacement(ctx, replacement);
                return true;
            }
            // A decision that changes nothing on the object still checks
            // the row it read, so that with several processes on one store
            // it is decided again on (and its receipt shows) the committed
            // row, not a view another process has since changed.
            Verdict::Stale | Verdict::Equal | Verdict::Held(_) => {
                if journaled {
                    write = Some(Write::Check {
                        object_id: id.clone(),
                        version: object.version,
                        paused: object.paused,
                    });
                }
                false
            }
            Verdict::Conflict(kind) => {
                object.paused = true;
                if journaled {
                    write = Some(match kind {
                        ConflictKind::VersionState => Write::Object {
                            row: object.row(&id),
                            expect: before,
                        },
                        // The pause, under the condition the decision read
                        // (as above: the receipt shows the committed row).
                        ConflictKind::EventVariant => Write::Object {
                            row: object.row(&id),
                            expect: before,
                        },
                    });
                }
                false
            }
        };
        if verdict.is_hold() {
            let key = existing.unwrap_or_else(|| ctx.key(seq));
            let row = journaled && existing.is_none();
            let row = row.then(|| held_row(ctx, key, verdict, &event, HeldStatus::Held));
            object.held.push(HeldEvent::new(seq, key, verdict, event));
            drop(object);
            self.note_body(&id, key);
            if let Some(w) = write.take() {
                self.write(|| w);
            }
            match (row, existing) {
                (Some(row), _) => self.write(|| Write::Held(row)),
                (None, Some(key)) if journaled => self.write(|| Write::HeldStatus {
                    key,
                    status: HeldStatus::Held,
                    superseded_by: None,
                }),
                _ => {}
            }
            return false;
        }
        drop(object);
        if let Some(w) = write {
            self.write(|| w);
        }
        replaced
    }

    /// Creates the unknown object `id` from `event`, its first versioned
    /// snapshot (`applied` under `UnknownObjectPolicy::CreateOnFirstSnapshot`,
    /// docs/CONTRACT.md §3.2): a state replacement with its effect, like any
    /// other `applied`, and a store row that must not exist yet. The events
    /// parked for the object join its held queue, where a restarted
    /// receiver would put them too; they wait for an authority as held
    /// events of a known object do. Returns whether it was created.
    fn create(&mut self, ctx: &Context, seq: u64, id: Arc<str>, event: Envelope) -> bool {
        let (VersionField::Valid(version), Some((state, digest))) =
            (event.version, event.state.as_ref())
        else {
            // decide_new creates only from a valid version and a state.
            return false;
        };
        let held = self.parked.remove(&id).unwrap_or_default();
        self.parked_total -= held.len();
        self.parked_bytes -= held.bytes();
        for h in held.iter() {
            self.write(|| Write::HeldStatus {
                key: h.key,
                status: HeldStatus::Held,
                superseded_by: None,
            });
        }
        let actor = ObjectActor {
            version,
            state: state.clone(),
            state_digest: *digest,
            paused: false,
            held,
            used: 0,
        };
        self.write(|| Write::Object {
            row: actor.row(&id),
            expect: Expect::Absent,
        });
        self.objects.insert(id.clone(), actor);
        self.counters.event_replacements += 1;
        let replacement = EffectRecord {
            seq,
            at: ctx.clock.now(),
            object_id: id,
            version,
            state: state.clone(),
            cause: Cause::Event(event.event_id.clone()),
            forced: None,
            trace: event.trace.clone(),
        };
        self.record_replacement(ctx, replacement);
        tracing::debug!(object_id = %event.object_id(), version, "object created by its first versioned snapshot");
        true
    }

    /// Appends a replacement to the history / outbox, in memory and in the journal.
    pub(crate) fn record_replacement(&mut self, ctx: &Context, replacement: EffectRecord) {
        self.write(|| Write::Effect(effect_row(ctx.origin, &replacement)));
        if let Some(tapped) = self.tapped.as_mut() {
            tapped.push(replacement.clone());
        }
        if ctx.config.audit {
            self.replacements
                .push(replacement, ctx.trail_share(), ctx.trail_bytes_share());
        }
    }

    /// The history of one object this run: the snapshots this shard
    /// accepted for it, oldest first, among the replacements it still keeps
    /// in memory (the most recent, up to its share of
    /// [`crate::Config::trail_capacity`]; none when [`crate::Config::audit`]
    /// is off). Earlier runs' snapshots, and evicted ones, are in a durable
    /// store's history.
    pub fn history(&self, object_id: &str) -> Vec<EffectRecord> {
        self.replacements
            .kept()
            .iter()
            .filter(|r| &*r.object_id == object_id)
            .cloned()
            .collect()
    }

    /// The effect records (outbox) of this run after sequence number `after`,
    /// in order.
    ///
    /// # Errors
    /// [`TrailGap`] when some of them may have been evicted from memory
    /// ([`crate::Config::trail_capacity`]): nothing is returned rather than a
    /// list with a hole.
    pub fn effects_since(&self, after: u64) -> Result<Vec<EffectRecord>, TrailGap> {
        let evicted_through = self.replacements.evicted_through();
        if after < evicted_through {
            return Err(TrailGap {
                after,
                evicted_through,
            });
        }
        Ok(self
            .replacements
            .kept()
            .iter()
            .filter(|r| r.seq > after)
            .cloned()
            .collect())
    }

    /// The highest sequence number of this shard's audit records and
    /// replacements that are no longer in memory (0: none evicted):
    /// `(audit, replacements)`.
    pub fn evicted_through(&self) -> (u64, u64) {
        (
            self.audit.evicted_through(),
            self.replacements.evicted_through(),
        )
    }

    /// Turns the effect tap on or off: while it is on, every replacement
    /// (effect) a step makes is also kept for [`Shard::take_effects`], so a
    /// driver can publish the effects of what it committed, whether or not
    /// [`crate::Config::audit`] keeps them. Turning it off drops what was
    /// not taken.
    pub fn tap_effects(&mut self, on: bool) {
        match (on, self.tapped.is_some()) {
            (true, false) => self.tapped = Some(Vec::new()),
            (false, true) => self.tapped = None,
            _ => {}
        }
    }

    /// The replacements made since the last call, in order (empty while the
    /// tap is off). With a journal, take them with the writes and publish
    /// them only after [`Shard::committed`]: a rollback
    /// ([`Shard::rolled_back`]) also removes the tapped effects of the steps
    /// it undoes, but not those already taken.
    pub fn take_effects(&mut self) -> Vec<EffectRecord> {
        self.tapped.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// At most `limit` ids of the objects in this shard's memory after
    /// `after`, in id order: a resync's page when no store gives one
    /// (docs/CONTRACT.md §4).
    pub fn object_ids_after(&self, after: &str, limit: usize) -> Vec<Arc<str>> {
        // At most twice the page is held: past it, the smallest `limit`
        // are kept.
        let mut ids: Vec<Arc<str>> = Vec::new();
        let keep = |ids: &mut Vec<Arc<str>>| {
            if ids.len() > limit {
                ids.select_nth_unstable(limit);
                ids.truncate(limit);
            }
        };
        for (id, _) in self.objects.iter() {
            if &**id > after {
                ids.push(id.clone());
                if ids.len() >= limit.saturating_mul(2).max(2) {
                    keep(&mut ids);
                }
            }
        }
        keep(&mut ids);
        ids.sort();
        ids
    }

    /// Objects an authority should be asked about, sorted: see
    /// [`Shard::authority_needs`].
    pub fn needing_authority(&self) -> Vec<Arc<str>> {
        self.authority_needs()
            .into_iter()
            .map(|n| n.object_id)
            .collect()
    }

    /// What an authority can settle here, per object, sorted by object id
    /// (docs/CONTRACT.md §4): paused objects ([`NeedReason::Paused`]);
    /// known objects holding events without a version, with an invalid
    /// version, of an unsupported type, or malformed (each its reason);
    /// objects this shard does not know with parked events
    /// ([`NeedReason::UnknownObject`]). Events held because their identity
    /// expired are not an authority's to settle.
    ///
    /// [`NeedReason::Paused`]: crate::reconciler::NeedReason::Paused
    /// [`NeedReason::UnknownObject`]: crate::reconciler::NeedReason::UnknownObject
    pub fn authority_needs(&self) -> Vec<crate::reconciler::AuthorityNeed> {
        use crate::reconciler::AuthorityNeed;
        let mut needs: Vec<AuthorityNeed> = self
            .objects
            .iter()
            .map(|(id, o)| (id, object_needs(o)))
            .chain(
                self.parked
                    .iter()
                    .map(|(id, list)| (id, parked_needs(list))),
            )
            .filter(|(_, reasons)| !reasons.is_empty())
            .map(|(id, reasons)| AuthorityNeed {
                object_id: id.clone(),
                reasons,
            })
            .collect();
        needs.sort_by(|a, b| a.object_id.cmp(&b.object_id));
        needs
    }

    /// What an authority can settle for `object_id` here (empty: nothing),
    /// as [`Shard::authority_needs`] lists it. An object outside a bounded
    /// working set is neither paused nor holding events (those stay in
    /// memory): nothing.
    pub fn authority_need(&self, object_id: &str) -> crate::reconciler::NeedReasons {
        if let Some(o) = self.objects.get(object_id) {
            return object_needs(o);
        }
        self.parked
            .get(object_id)
            .map(parked_needs)
            .unwrap_or_default()
    }

    /// Pauses a known object because of a variant seen by another shard.
    /// Returns whether the object is known here (unknown objects are not
    /// paused). A request the variant's step did not record (no store) is
    /// recorded here, the object read from the store first if it is only
    /// there. A recorded one ([`PauseRequest::recorded`]) is already in the
    /// store with its audit row: an object in memory is paused there (and
    /// the flag written again, which also covers an object whose creation
    /// was not committed when the variant's store write ran), one only in
    /// the store is read paused when it is needed.
    ///
    /// # Errors
    /// The object must be read from the store first, or its read failed
    /// ([`Missing`]): nothing changed, and the pause must be tried again.
    pub(crate) fn pause(&mut self, ctx: &Context, request: &PauseRequest) -> Result<bool, Missing> {
        let id = &request.object_id;
        if request.recorded.is_none() {
            self.fault_in(ctx, id)?;
        }
        if !self.objects.contains_key(id) {
            return Ok(false);
        }
        self.begin_step(&[id], None);
        match request.recorded {
            None => self.pause_known(ctx, id, &request.cause_event, ctx.next_seq()),
            Some(seq) => {
                self.touch(id);
                self.objects.with(id, |o| o.paused = true);
                self.write(|| Write::Pause {
                    object_id: id.clone(),
                });
                if ctx.config.audit {
                    let record = pause_record(ctx, seq, id, &request.cause_event);
                    self.audit
                        .push(record, ctx.trail_share(), ctx.trail_bytes_share());
                }
            }
        }
        Ok(true)
    }

    /// Pauses `object_id`, which this shard owns, because of a variant of
    /// `cause_event`, and records it as step `seq` (the flag, and a
    /// `paused` audit record). The caller began the step with the object;
    /// an object not in memory is unknown here (the caller read it first).
    fn pause_known(
        &mut self,
        ctx: &Context,
        object_id: &Arc<str>,
        cause_event: &Arc<str>,
        seq: u64,
    ) {
        self.touch(object_id);
        if self.objects.with(object_id, |o| o.paused = true).is_none() {
            return;
        }
        self.write(|| Write::Pause {
            object_id: object_id.clone(),
        });
        self.append(
            ctx,
            seq,
            Some(cause_event.clone()),
            Some(object_id.clone()),
            || AuditEntry::Paused {
                cause_event: cause_event.clone(),
            },
        );
        tracing::info!(object_id = %object_id, cause_event = %cause_event, "object paused by a variant");
    }

    /// The pause of `object_id`, which another shard owns, raised by a
    /// variant of `first.0` whose first record has fingerprint `first.1`.
    /// With a durable store this step writes it ([`Write::PauseIfStored`],
    /// with its `paused` audit row, on condition that the store holds that
    /// first record), so it commits with the variant and no later answer or
    /// other writer can get ahead of it; the request returned then only
    /// tells the owner's memory. Without one, the owner records it from the
    /// request.
    fn pause_elsewhere(
        &mut self,
        ctx: &Context,
        object_id: Arc<str>,
        first: (&Arc<str>, u128),
    ) -> PauseRequest {
        let (cause_event, fingerprint) = first;
        let journaled = self.journaled() && !self.controls.pause_after_answer.is_on();
        let recorded = journaled.then(|| {
            let seq = ctx.next_seq();
            let record = pause_record(ctx, seq, &object_id, cause_event);
            self.write(|| Write::PauseIfStored {
                event_id: cause_event.clone(),
                fingerprint,
                object_id: object_id.clone(),
                audit: audit_row(ctx.origin, &record),
            });
            seq
        });
        PauseRequest {
            object_id,
            cause_event: cause_event.clone(),
            recorded,
        }
    }

    /// Appends to the audit trail: in memory when it is kept, and to the
    /// durable store's journal when there is one.
    pub(crate) fn append(
        &mut self,
        ctx: &Context,
        seq: u64,
        event_id: Option<Arc<str>>,
        object_id: Option<Arc<str>>,
        entry: impl FnOnce() -> AuditEntry,
    ) {
        if !ctx.config.audit && !self.journaled() {
            return;
        }
        let record = AuditRecord {
            seq,
            at: ctx.clock.now(),
            event_id,
            object_id,
            entry: entry(),
        };
        self.write(|| Write::Audit(audit_row(ctx.origin, &record)));
        if ctx.config.audit {
            self.audit
                .push(record, ctx.trail_share(), ctx.trail_bytes_share());
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

    /// This shard's audit records still in memory, in sequence order: the
    /// most recent, up to its share of [`crate::Config::trail_capacity`]
    /// (see [`Shard::evicted_through`]).
    pub fn audit(&self) -> &[AuditRecord] {
        self.audit.kept()
    }

    /// Replacement counts of this shard: the replacements it made since it
    /// was created (this run; a store's earlier runs are not included).
    pub fn counters(&self) -> ReplacementCounts {
        self.counters
    }

    /// Every input this shard holds or that an authority superseded, in
    /// arrival order.
    pub fn unresolved(&self) -> Vec<UnresolvedInput> {
        let held = |object_id: &Arc<str>, h: &HeldEvent| UnresolvedInput {
            seq: h.seq,
            event_id: Some(h.event_id.clone()),
            object_id: Some(object_id.clone()),
            held_as: h.held_as,
            superseded_by: None,
        };
        let mut all: Vec<UnresolvedInput> = self.superseded.clone();
        for (id, o) in self.objects.iter() {
            all.extend(o.held.iter().map(|h| held(id, h)));
        }
        for (id, list) in &self.parked {
            all.extend(list.iter().map(|h| held(id, h)));
        }
        all.extend(self.malformed.iter().map(|m| UnresolvedInput {
            seq: m.seq,
            event_id: m.event_id.clone(),
            object_id: m.object_id.clone(),
            held_as: Verdict::Held(HoldReason::Malformed),
            superseded_by: None,
        }));
        all.sort_by_key(|u| u.seq);
        all
    }

    /// Re-decides the held events of one object after its authority, in
    /// arrival order (docs/CONTRACT.md §4). Returns one line per event.
    pub(crate) fn reevaluate(
        &mut self,
        ctx: &Context,
        object_id: &Arc<str>,
        authority_version: u64,
        mut held: Vec<HeldEvent>,
    ) -> Vec<Reevaluation> {
        held.sort_by_key(|h| h.seq);
        let mut lines = Vec::with_capacity(held.len());
        for mut h in held {
            if h.event.is_none() && reevaluable(h.held_as) && self.settled_elsewhere(&h.key) {
                // Another process sharing the store decided it again (and
                // maybe purged it since): nothing to decide here, nothing
                // to write; it leaves memory.
                continue;
            }
            let Some(object) = self.objects.get(object_id) else {
                break;
            };
            let held_as = h.held_as;
            let event_id = h.event_id.clone();
            let view = object.view();
            let seq = ctx.next_seq();
            let (verdict, event) = match (reevaluable(held_as), h.event.take()) {
                (true, Some(event)) => {
                    let verdict = decide_new(
                        &event.facts(false),
                        Some(&view),
                        ctx.config.equal_versions,
                        ctx.config.profile.unknown_objects(),
                    );
                    (Some(verdict), Some(event))
                }
                (true, None) => {
                    // Its body was not read back (its driver reads it
                    // first, `Shard::bodies_to_read`): it stays held as it
                    // was, undecided, rather than be decided without it.
                    tracing::error!(event_id = %event_id, object_id = %object_id, "held event re-decided without its body: kept held");
                    self.objects.with(object_id, |o| o.held.push(h.clone()));
                    (Some(held_as), None)
                }
                (false, _) => (None, None),
            };
            let outcome = match (verdict, event) {
                (Some(v), None) => ReevaluationOutcome::Decided(v, false),
                // Another state at the very version the authority has just
                // settled contradicts the authority, not the object: a new
                // pause would ask the same authority the same question for
                // ever (a background reconciler would fetch it in a loop).
                // It is superseded by the authority instead.
                (Some(v @ Verdict::Conflict(ConflictKind::VersionState)), Some(e))
                    if e.version == VersionField::Valid(authority_version) =>
                {
                    self.supersede(&h, object_id, v, authority_version)
                }
                // Still (or again) paused: the event stays held under its
                // arrival position, never lost.
                (Some(v @ (Verdict::Held(HoldReason::Paused) | Verdict::Conflict(_))), Some(e)) => {
                    self.settle(ctx, h.seq, v, *e, Some(h.key));
                    ReevaluationOutcome::Decided(v, false)
                }
                (Some(v @ (Verdict::Applied | Verdict::Stale | Verdict::Equal)), Some(e)) => {
                    self.write(|| Write::HeldStatus {
                        key: h.key,
                        status: HeldStatus::Resolved,
                        superseded_by: None,
                    });
                    ReevaluationOutcome::Decided(v, self.settle(ctx, seq, v, *e, None))
                }
                // Evidence that cannot be decided (the original hold, or one the
                // object's arrival revealed): superseded by the authority.
                (Some(revealed), Some(_)) => {
                    self.supersede(&h, object_id, revealed, authority_version)
                }
                (None, _) => self.supersede(&h, object_id, held_as, authority_version),
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

    fn supersede(
        &mut self,
        held: &HeldEvent,
        object_id: &Arc<str>,
        held_as: Verdict,
        authority_version: u64,
    ) -> ReevaluationOutcome {
        self.write(|| Write::HeldStatus {
            key: held.key,
            status: HeldStatus::Superseded,
            superseded_by: Some(authority_version),
        });
        self.superseded.push(UnresolvedInput {
            seq: held.seq,
            event_id: Some(held.event_id.clone()),
            object_id: Some(object_id.clone()),
            held_as,
            superseded_by: Some(authority_version),
        });
        ReevaluationOutcome::Unresolved(held_as)
    }
}

/// What an authority can settle for a known object: its pause, and the
/// reasons of its held events ([`crate::reconciler::NeedReason::of_verdict`];
/// an event held because the object is paused adds nothing to the pause).
fn object_needs(o: &ObjectActor) -> crate::reconciler::NeedReasons {
    use crate::reconciler::{NeedReason, NeedReasons};
    let mut reasons = NeedReasons::default();
    if o.paused {
        reasons = reasons.with(NeedReason::Paused);
    }
    for h in o.held.iter() {
        match NeedReason::of_verdict(h.held_as) {
            Some(NeedReason::Paused) | None => {}
            Some(reason) => reasons = reasons.with(reason),
        }
    }
    reasons
}

/// What an authority can settle for an object this shard does not know:
/// whether it exists ([`crate::reconciler::NeedReason::UnknownObject`]),
/// when events are parked for it.
fn parked_needs(list: &HeldQueue) -> crate::reconciler::NeedReasons {
    use crate::reconciler::{NeedReason, NeedReasons};
    if list.is_empty() {
        NeedReasons::default()
    } else {
        NeedReasons::default().with(NeedReason::UnknownObject)
    }
}

/// What a malformed input keeps in memory: its bytes, its error and
/// entry; without its body, its ids and entry.
fn malformed_bytes(waiting: &WaitingMalformed) -> usize {
    match &waiting.body {
        Some(body) => body.bytes.len() + body.error.len() + WAITING_OVERHEAD,
        None => {
            let id_len = |id: &Option<Arc<str>>| id.as_deref().map_or(0, str::len);
            id_len(&waiting.event_id) + id_len(&waiting.object_id) + STORED_WAITING_OVERHEAD
        }
    }
}

/// The store row for an event being held.
fn held_row(
    ctx: &Context,
    key: HeldKey,
    held_as: Verdict,
    event: &Envelope,
    status: HeldStatus,
) -> HeldRow {
    HeldRow {
        key,
        at: ctx.clock.now(),
        event_id: Some(event.event_id.clone()),
        object_id: Some(event.object_id_shared()),
        held_as,
        body: Arc::from(event.body.as_bytes()),
        status,
        superseded_by: None,
        detail: None,
    }
}

/// The audit record of `object_id`'s pause by a variant of `cause_event`,
/// as step `seq`.
fn pause_record(
    ctx: &Context,
    seq: u64,
    object_id: &Arc<str>,
    cause_event: &Arc<str>,
) -> AuditRecord {
    AuditRecord {
        seq,
        at: ctx.clock.now(),
        event_id: Some(cause_event.clone()),
        object_id: Some(object_id.clone()),
        entry: AuditEntry::Paused {
            cause_event: cause_event.clone(),
        },
    }
}
