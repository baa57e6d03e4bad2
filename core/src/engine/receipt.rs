//! What a step answers: receipts, object reads, replacements (history and
//! outbox) and reconciliation lines.

use crate::decision::{Ack, Decision, Verdict};
use crate::envelope::{Delivery, RejectReason, StateJson};
use crate::store::StoreError;
use std::sync::Arc;
use std::time::SystemTime;

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

impl ObjectState {
    /// The object as a store row holds it, holding no events (an object
    /// holding events is always in memory, docs/CONTRACT.md §9); its state
    /// is read under `max_depth` ([`crate::Limits::max_depth`]).
    ///
    /// # Errors
    /// The stored state is not valid JSON under docs/CONTRACT.md §2.
    pub fn from_row(
        row: crate::write::ObjectRow,
        max_depth: usize,
    ) -> Result<Self, crate::canon::CanonError> {
        let (state, _) = StateJson::parse(&row.state, max_depth)?;
        Ok(Self {
            object_id: row.object_id,
            version: row.version,
            state,
            paused: row.paused,
            held: 0,
        })
    }

    /// Whether the object is a tombstone: deleted at `version` (state `null`),
    /// kept so that an older update cannot bring it back.
    pub fn deleted(&self) -> bool {
        self.state.is_null()
    }
}

/// Why a delivery must be redelivered: nothing was recorded or changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RetryReason {
    /// The object's held queue is at [`crate::Limits::max_held_per_object`].
    #[error("held queue of the object is full ({limit} events)")]
    HeldQueueFull {
        /// The configured limit.
        limit: usize,
    },
    /// Parking for unknown objects and malformed bodies is full (per object
    /// or per shard).
    #[error("parking for unknown objects and malformed bodies is full ({limit} events)")]
    ParkingFull {
        /// The limit that was reached.
        limit: usize,
    },
    /// A part of the memory budget that cannot let go of what it holds is
    /// full ([`crate::MemoryBudget`]): the bodies of waiting events, or the
    /// deliveries accepted and not yet answered. Try again later (`serve`
    /// answers 503 with `Retry-After`).
    #[error("the memory budget for {part} is full ({limit} bytes)")]
    MemoryFull {
        /// `waiting` (held, parked and malformed bodies), `queued`
        /// (deliveries not yet answered) or `objects` (the in-memory
        /// receiver's objects, which it cannot evict).
        part: &'static str,
        /// The part's bound in bytes (a shard's share for `waiting` and
        /// `objects`; the receiver's for `queued`).
        limit: usize,
    },
    /// The receiver is shutting down or its actor stopped.
    #[error("the receiver is shutting down")]
    ShuttingDown,
    /// The durable store could not commit the step; nothing was recorded.
    #[error("the durable store could not record the step")]
    StoreFailed(#[source] StoreError),
}

impl RetryReason {
    /// A stable snake_case name: `held_queue_full`, `parking_full`,
    /// `memory_full`, `shutting_down` or `store_failed` (the
    /// `retry.<name>` counter, and
    /// the `reason` of `serve`'s answer).
    pub fn as_str(&self) -> &'static str {
        match self {
            RetryReason::HeldQueueFull { .. } => "held_queue_full",
            RetryReason::ParkingFull { .. } => "parking_full",
            RetryReason::MemoryFull { .. } => "memory_full",
            RetryReason::ShuttingDown => "shutting_down",
            RetryReason::StoreFailed(_) => "store_failed",
        }
    }
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
    /// Whether that replacement created the object: it was unknown and its
    /// profile lets a first versioned snapshot create it
    /// ([`crate::Profile::create_on_first_snapshot`], docs/CONTRACT.md §3.2).
    pub created: bool,
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
    pub fn ack(&self) -> Ack {
        match &self.outcome {
            Outcome::Decided(d) => d.ack(),
            Outcome::Retry(_) => Ack::Retry,
            Outcome::Rejected(_) => Ack::Reject,
        }
    }

    /// The acknowledgement's meaning in words, for the sender: for a
    /// `retry` or `reject` also why, with the limit and the size (a store's
    /// own error is left out: it is [`Outcome::Retry`]'s source).
    pub fn ack_meaning(&self) -> String {
        match &self.outcome {
            Outcome::Decided(d) => d.ack_meaning().to_owned(),
            // Not the store's own error: a sender has no business knowing
            // the store's files or hosts (it is the outcome's source).
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
            created: false,
        }
    }

    /// The receipt for a body refused over a limit: not recorded, not
    /// acknowledged ([`Ack::Reject`]).
    pub fn rejected(why: RejectReason) -> Self {
        Self {
            event_id: None,
            object_id: None,
            outcome: Outcome::Rejected(why),
            object: None,
            replacement: false,
            created: false,
        }
    }

    /// The receipt for a delivery refused after it was parsed (the store
    /// could not hold what it would write, [`RejectReason::StoreRefused`]):
    /// not recorded, not acknowledged ([`Ack::Reject`]), naming the
    /// delivery's event and object.
    pub fn refused(delivery: &Delivery, why: RejectReason) -> Self {
        Self::without_decision(delivery, Outcome::Rejected(why))
    }

    /// The receipt for a delivery that was not recorded (shutting down, a
    /// failed commit): the sender must redeliver ([`Ack::Retry`]).
    pub fn retry(delivery: &Delivery, why: RetryReason) -> Self {
        Self::without_decision(delivery, Outcome::Retry(why))
    }
}

/// A request to pause an object another shard owns, produced when a variant
/// names a different object than the first record (docs/CONTRACT.md §3.1).
/// The driver hands it to the shard owning `object_id` once the variant's
/// step is recorded, before the variant is answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PauseRequest {
    /// The object to pause.
    pub object_id: Arc<str>,
    /// The event whose variant is the reason.
    pub cause_event: Arc<str>,
    /// `Some(seq)` when the variant's own step already wrote the pause for
    /// the durable store ([`crate::write::Write::PauseIfStored`], with its
    /// audit row numbered `seq`), so it committed with the variant: the
    /// owner only brings its memory in line. `None` (no store): the owner's
    /// step records it.
    pub recorded: Option<u64>,
}

impl PauseRequest {
    /// The shard among `shards` that must apply this pause: the owner of
    /// its object ([`crate::shard_of`]). A driver forwards the pause there
    /// (to itself, when it owns the object) before it answers the delivery.
    pub fn owner(&self, shards: usize) -> usize {
        crate::shard_of(&self.object_id, shards)
    }
}

/// The result of [`crate::engine::Shard::deliver`]: the receipt, and possibly a pause for an
/// object another shard owns.
#[derive(Clone, Debug)]
pub struct Step {
    /// The answer for the caller.
    pub receipt: Receipt,
    /// A pause to deliver to the shard owning that object.
    pub pause: Option<PauseRequest>,
}

/// An input that was held and has not been decided: either still held, or
/// superseded by an authoritative snapshot (docs/CONTRACT.md §4: named unresolved input).
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

/// Why a state was replaced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cause {
    /// An event was applied.
    Event(Arc<str>),
    /// An authoritative snapshot (taken at this time) replaced or introduced it.
    Authority(SystemTime),
}

/// An effect as the step that made it records it: one accepted snapshot of
/// an object, an entry of its append-only history and the outbox entry of
/// that state replacement, with why it happened ([`Cause`], [`Overridden`]).
/// Made in the same step as the replacement, so it exists exactly once per
/// replacement: duplicates, stale, equal and held decisions make none.
///
/// One effect, three forms: this record (in memory, numbered by its step,
/// no outbox position yet), its stored row ([`crate::write::EffectRow`])
/// and the [`crate::Effect`] a relay reads and hands on (with its outbox
/// position and stable id).
#[derive(Clone, Debug)]
pub struct EffectRecord {
    /// Receiver-wide sequence number of the step that made this effect:
    /// the audit trail's `seq` of that step ([`crate::AuditRecord::seq`]),
    /// one sequence for every recorded step, taken when the step is
    /// decided. Effects' numbers rise in step order but are not consecutive
    /// (the steps between replaced nothing), and effects become visible in
    /// another order than their numbers (shards publish, groups commit,
    /// when they are done): a relay's cursor is the outbox position
    /// ([`crate::Effect::position`]), never this number.
    pub seq: u64,
    /// When, on the receiver's clock.
    pub at: SystemTime,
    /// The object.
    pub object_id: Arc<str>,
    /// Its new version.
    pub version: u64,
    /// Its new state (`null`: deleted).
    pub state: StateJson,
    /// What replaced it.
    pub cause: Cause,
    /// For an authority forced past a newer object (docs/CONTRACT.md §4,
    /// *Force*): the version and state it replaced; `None` otherwise.
    pub forced: Option<Overridden>,
    /// The W3C trace context of the delivery that made it
    /// ([`crate::Delivery::with_trace`]); `None` for a delivery that came
    /// without one, a held event applied later and an authoritative
    /// snapshot.
    pub trace: Option<Arc<crate::TraceContext>>,
}

/// What a forced authoritative snapshot replaced: the object's version,
/// newer than the authority's, and its state then (`null` for a tombstone).
/// Kept in the audit trail and the history so that an operator's override
/// never hides what it overrode.
#[derive(Clone, Debug)]
pub struct Overridden {
    /// The object's version before the forced authority (u64), higher than
    /// the authority's.
    pub version: u64,
    /// The object's state before it.
    pub state: StateJson,
}

/// How many times states were replaced, by events and by authorities. It
/// serializes as the replay's final line has it: `{"event": n,
/// "authority": n}`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReplacementCounts {
    /// State replacements by events (`applied`, including re-evaluations).
    #[serde(rename = "event")]
    pub event_replacements: u64,
    /// State replacements (and introductions) by authoritative snapshots.
    #[serde(rename = "authority")]
    pub authority_replacements: u64,
}

impl std::ops::AddAssign for ReplacementCounts {
    fn add_assign(&mut self, o: Self) {
        self.event_replacements += o.event_replacements;
        self.authority_replacements += o.authority_replacements;
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

/// An error and its sources in one line, outermost first, joined by `": "`.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
