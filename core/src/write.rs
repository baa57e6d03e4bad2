//! The rows and writes a shard step hands to storage. A row never names an
//! engine type: storage sees only this module and [`crate::store`]. How a
//! row is encoded in a store's columns is the store's business.

use crate::decision::Verdict;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Where a held event's row lives: the receiver run that recorded it
/// (`origin`, random per start) and its sequence number in that run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HeldKey {
    /// Random per receiver start, so that processes sharing a database never collide.
    pub origin: u64,
    /// The audit sequence number of the step that held it.
    pub seq: u64,
}

/// What became of a held row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeldStatus {
    /// Held for a known object.
    Held,
    /// Parked for an unknown object.
    Parked,
    /// A body that could not name its event.
    Malformed,
    /// Decided by reconciliation.
    Resolved,
    /// Named unresolved input, superseded by an authority.
    Superseded,
}

impl HeldStatus {
    /// The stored text.
    pub fn as_str(self) -> &'static str {
        match self {
            HeldStatus::Held => "held",
            HeldStatus::Parked => "parked",
            HeldStatus::Malformed => "malformed",
            HeldStatus::Resolved => "resolved",
            HeldStatus::Superseded => "superseded",
        }
    }

    /// Reads the stored text back.
    pub fn parse(text: &str) -> Option<Self> {
        [
            HeldStatus::Held,
            HeldStatus::Parked,
            HeldStatus::Malformed,
            HeldStatus::Resolved,
            HeldStatus::Superseded,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }
}

/// The receipt of one event identity: the first record (docs/CONTRACT.md §3.1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceiptRow {
    /// Event identity (the unique key).
    pub event_id: Arc<str>,
    /// Semantic fingerprint of the first delivery.
    pub fingerprint: u128,
    /// The object the first delivery named.
    pub object_id: Arc<str>,
    /// The first delivery's decision.
    pub decision: Verdict,
    /// When it was recorded.
    pub first_seen: SystemTime,
    /// The retention cut-off of the step that recorded it (its clock minus
    /// the retention window, see [`retention_cutoff`]): a stored receipt of
    /// the same event identity first seen at or before this instant has
    /// expired (docs/CONTRACT.md §5), so inserting this row replaces it and
    /// deletes the variants recorded before this row's `first_seen`, even if
    /// the periodic purge has not removed them yet. `None`: nothing stored
    /// can have expired (the clock is less than one window past the Unix
    /// epoch), and on rows read back from a store.
    pub retention_cutoff: Option<SystemTime>,
}

/// The retention cut-off at `now`: a record first seen at or before it is at
/// least `retention` old, the registry's own test for an expired record
/// (docs/CONTRACT.md §5). `None` when that instant would fall before the
/// Unix epoch: stored times start there, so no stored record has expired.
pub fn retention_cutoff(now: SystemTime, retention: Duration) -> Option<SystemTime> {
    now.checked_sub(retention).filter(|c| *c >= UNIX_EPOCH)
}

/// A variant of an event identity: a content other than the first record's
/// that was decided as a `conflict` / `event_variant` (docs/CONTRACT.md
/// §3.1). Unique on (`event_id`, `fingerprint`): the store keeps every
/// distinct pair, so it arbitrates which delivery of a variant came first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VariantRow {
    /// Event identity (its first record is a [`ReceiptRow`]).
    pub event_id: Arc<str>,
    /// Semantic fingerprint of the variant.
    pub fingerprint: u128,
    /// The object the variant named.
    pub object_id: Arc<str>,
    /// When the variant was recorded.
    pub first_seen: SystemTime,
}

/// One object's row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectRow {
    /// Resource identity (the unique key).
    pub object_id: Arc<str>,
    /// Version (u64).
    pub version: u64,
    /// State as JSON text.
    pub state: String,
    /// Paused until reconciliation.
    pub paused: bool,
}

/// One held input's row: the exact body is kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldRow {
    /// Unique key.
    pub key: HeldKey,
    /// When it was held.
    pub at: SystemTime,
    /// Its event identity, if it had one.
    pub event_id: Option<Arc<str>>,
    /// The object it named, if any.
    pub object_id: Option<Arc<str>>,
    /// How it was held.
    pub held_as: Verdict,
    /// The exact body.
    pub body: Arc<[u8]>,
    /// What became of it.
    pub status: HeldStatus,
    /// The authority version that superseded it.
    pub superseded_by: Option<u64>,
    /// For malformed bodies: what is wrong.
    pub detail: Option<String>,
}

/// A held row's key and its exact body, read back for a shard that decides
/// the event again ([`crate::store::ObjectSource::held_bodies`]).
pub type HeldBody = (HeldKey, Arc<[u8]>);

/// One audit row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditRow {
    /// Unique key (origin, sequence number).
    pub key: HeldKey,
    /// When.
    pub at: SystemTime,
    /// Event identity, if any.
    pub event_id: Option<Arc<str>>,
    /// Object, if any.
    pub object_id: Option<Arc<str>>,
    /// `delivery`, `malformed`, `paused`, `authority`, `authority_refused`,
    /// `reevaluated` or `unresolved`.
    pub kind: &'static str,
    /// The decision (for example `applied`, `held:paused`,
    /// `duplicate:applied`); `forced` for an authority forced past a newer
    /// object.
    pub decision: Option<String>,
    /// The object's version after the step, or the authority's version.
    pub version: Option<u64>,
    /// Whether the step replaced the object's state (`false` for an
    /// authority equal to the object).
    pub replacement: bool,
    /// Extra facts in words (an error, a previous version).
    pub detail: Option<String>,
    /// The body as received, for deliveries; for a forced authority, the
    /// state it replaced (compact JSON text).
    pub body: Option<Arc<[u8]>>,
}

/// An effect as a store keeps it: one state replacement, a row of the
/// object's history and of the outbox (the `replacements` table). The
/// engine's [`crate::EffectRecord`] as a row; a relay reads it back as an
/// [`crate::Effect`] ([`crate::Effect::from_row`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EffectRow {
    /// Unique key (origin, sequence number).
    pub key: HeldKey,
    /// When.
    pub at: SystemTime,
    /// The object.
    pub object_id: Arc<str>,
    /// Its new version.
    pub version: u64,
    /// Its new state as JSON text (`null`: deleted).
    pub state: String,
    /// The event applied, or `None` for an authoritative snapshot.
    pub cause_event: Option<Arc<str>>,
    /// The W3C trace context the applied delivery came with, if any
    /// (stored in the history row's `trace_context` column,
    /// [`crate::TraceContext::to_stored`]).
    pub trace: Option<Arc<crate::TraceContext>>,
}

/// The condition a step's object write assumed; if it no longer holds at
/// commit time the commit fails with [`crate::store::StoreError::Conflict`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// The row had exactly this version and pause flag (the decision read them).
    Version {
        /// The version the decision compared against.
        version: u64,
        /// The pause flag the decision saw.
        paused: bool,
    },
    /// An event created the object (its profile lets a first versioned
    /// snapshot do so), or an authority introduced an unknown one: the row
    /// must not exist yet; if another writer created it meanwhile, the step
    /// is decided again on that row.
    Absent,
}

/// One change of a step, in the order the step made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Insert the receipt of a first delivery (unique on `event_id`). A
    /// stored receipt that expired by the row's
    /// [`ReceiptRow::retention_cutoff`] is replaced, and the variants
    /// recorded for it are deleted; a live one is a conflict (another
    /// receiver recorded the identity first).
    Receipt(ReceiptRow),
    /// Insert a variant of an event identity (unique on `event_id` and
    /// `fingerprint`); an existing row means another process recorded it
    /// first.
    Variant(VariantRow),
    /// Write an object row under a condition.
    Object {
        /// The row after the step.
        row: ObjectRow,
        /// What the decision assumed.
        expect: Expect,
    },
    /// Insert an initial object if the store does not have it.
    Seed(ObjectRow),
    /// Pause an object (unconditional: a pause is always safe).
    Pause {
        /// The object.
        object_id: Arc<str>,
    },
    /// Pause an object another shard owns, if the store holds it, and then
    /// record `audit` (its `paused` row) with it; nothing at all if the
    /// store has no such object. A variant naming another object than its
    /// first record writes this in its own transaction, so that the pause of
    /// the first record's object is durable before the variant is
    /// acknowledged (docs/CONTRACT.md §3.6). Unconditional like
    /// [`Write::Pause`]: every decision on that object checks the flag it
    /// read, so another writer's decision made before this commit conflicts
    /// and is decided again on the paused row.
    ///
    /// The commit also requires the receipt of `event_id` with
    /// `fingerprint` (the very first record the variant contradicts) to be
    /// stored, and fails with [`crate::store::StoreError::Conflict`]
    /// otherwise: a first record another shard has decided but not
    /// committed yet commits before its variant and before the pause, never
    /// after them; and one that will never commit, because the store holds
    /// another first record of the identity (one this process did not see,
    /// perhaps this very delivery's), never makes a variant of a delivery.
    /// The variant's group is then decided again on what the store holds,
    /// or answered `retry`.
    PauseIfStored {
        /// The event identity whose first record the variant contradicts.
        event_id: Arc<str>,
        /// That first record's semantic fingerprint.
        fingerprint: u128,
        /// The object.
        object_id: Arc<str>,
        /// Its `paused` audit row, naming the variant's event.
        audit: AuditRow,
    },
    /// The decision read this row and changed nothing (stale, equal, held):
    /// the row must still be as read.
    Check {
        /// The object.
        object_id: Arc<str>,
        /// The version read.
        version: u64,
        /// The pause flag read.
        paused: bool,
    },
    /// Insert a held input.
    Held(HeldRow),
    /// Change what became of a held input.
    HeldStatus {
        /// The held row.
        key: HeldKey,
        /// Its new status.
        status: HeldStatus,
        /// The superseding authority version.
        superseded_by: Option<u64>,
    },
    /// Append an audit row.
    Audit(AuditRow),
    /// Append an effect: a state replacement (history and outbox).
    Effect(EffectRow),
}

/// Everything a receiver needs to resume from a store.
#[derive(Clone, Debug, Default)]
pub struct Loaded {
    /// Every object.
    pub objects: Vec<ObjectRow>,
    /// Held, parked, malformed and superseded inputs, in arrival order.
    pub held: Vec<HeldRow>,
    /// Receipts recorded at or after the retention cut-off.
    pub receipts: Vec<ReceiptRow>,
    /// Variants recorded at or after the retention cut-off.
    pub variants: Vec<VariantRow>,
    /// The highest step sequence number stored: a resumed receiver numbers
    /// its steps after it, so an outbox cursor keeps working across restarts.
    pub max_seq: u64,
}

/// The rows a shard reloads after a conflict with another writer (the
/// [`crate::engine::Touched`] rows, read again), for
/// [`crate::engine::Shard::refresh`].
#[derive(Clone, Debug, Default)]
pub struct Reloaded {
    /// The objects, as stored.
    pub objects: Vec<ObjectRow>,
    /// The receipts (first records) of the event identities.
    pub receipts: Vec<ReceiptRow>,
    /// Every variant recorded for those event identities.
    pub variants: Vec<VariantRow>,
}
