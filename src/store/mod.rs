//! The durable transactional inbox (the storage boundary of SPEC §3).
//!
//! A shard turns each step into a list of [`Write`]s — the event receipt, the
//! object row with the condition its decision assumed, held-event rows and
//! audit rows. The [`Committer`] commits the writes of many shards in one
//! transaction (group commit) and only then are the callers acknowledged. A
//! failed commit changes nothing: the shards roll their in-memory steps back
//! and answer `retry`. A commit whose conditions no longer hold (another
//! receiver process changed the row) is a [`StoreError::Conflict`]: the shards
//! reload the rows and decide again.
//!
//! Versions are stored as 20-digit zero-padded decimal text, so that every u64
//! fits and text order is numeric order in both SQLite and PostgreSQL.

mod committer;
mod group;
mod postgres;
mod sqlite;
mod stats;

pub use committer::{Committer, CommitterConfig};
pub use postgres::PostgresStore;
pub use sqlite::{SqliteOptions, SqliteStore};
pub use stats::{CommitPhases, CommitStats, GroupSizes, PhaseTime};

use crate::actor::Counters;
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

/// The receipt of one event identity: the first record (SPEC §3.1).
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
    /// The decision (for example `applied`, `held:paused`, `duplicate:applied`).
    pub decision: Option<String>,
    /// The object's version after the step, or the authority's version.
    pub version: Option<u64>,
    /// Whether the step replaced the object's state.
    pub replacement: bool,
    /// Extra facts in words (an error, a previous version).
    pub detail: Option<String>,
    /// The body as received, for deliveries.
    pub body: Option<Arc<[u8]>>,
}

/// One state replacement: the object's history and the effect (outbox) record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplacementRow {
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
}

/// The condition a step's object write assumed; if it no longer holds at
/// commit time the commit fails with [`StoreError::Conflict`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// The row had exactly this version and pause flag (the decision read them).
    Version {
        /// The version the decision compared against.
        version: u64,
        /// The pause flag the decision saw.
        paused: bool,
    },
    /// An authority: the row is absent or its version is at most this.
    AtMost(u64),
}

/// One change of a step, in the order the step made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Insert the receipt of a first delivery (unique on `event_id`).
    Receipt(ReceiptRow),
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
    /// Append a state replacement (history and outbox).
    Replacement(ReplacementRow),
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
    /// Replacement counts from the audit trail.
    pub counters: Counters,
    /// The highest step sequence number stored: a resumed receiver numbers
    /// its steps after it, so an outbox cursor keeps working across restarts.
    pub max_seq: u64,
}

/// Why a store operation failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A condition of the batch no longer holds (another process changed a
    /// row, or a receipt already exists): nothing was committed; reload and
    /// decide again.
    #[error("concurrent change: {0}")]
    Conflict(String),
    /// The store could not commit (I/O, full disk, lost connection, locked
    /// database): nothing was committed.
    #[error("store failure: {0}")]
    Failed(String),
}

/// A durable store. Every method runs on the committer's own thread, so
/// implementations may block.
pub trait Store: Send + 'static {
    /// Commits `writes` in one transaction: all or nothing.
    ///
    /// # Errors
    /// [`StoreError::Conflict`] when a condition fails, [`StoreError::Failed`]
    /// otherwise; in both cases nothing was committed.
    fn commit(&mut self, writes: &[Write]) -> Result<(), StoreError>;

    /// Loads everything a receiver resumes from; receipts first seen before
    /// `receipts_since` are left out (expired).
    ///
    /// # Errors
    /// [`StoreError::Failed`] when the store cannot be read.
    fn load(&mut self, receipts_since: SystemTime) -> Result<Loaded, StoreError>;

    /// Reloads some objects and receipts after a conflict.
    ///
    /// # Errors
    /// [`StoreError::Failed`] when the store cannot be read.
    fn refresh(
        &mut self,
        objects: &[Arc<str>],
        receipts: &[Arc<str>],
    ) -> Result<(Vec<ObjectRow>, Vec<ReceiptRow>), StoreError>;

    /// Deletes receipts first seen before `before`; returns how many.
    ///
    /// # Errors
    /// [`StoreError::Failed`] when the store cannot be written.
    fn purge_receipts(&mut self, before: SystemTime) -> Result<u64, StoreError>;

    /// Every audit row, in the order recorded.
    ///
    /// # Errors
    /// [`StoreError::Failed`] when the store cannot be read.
    fn audit(&mut self) -> Result<Vec<AuditRow>, StoreError>;

    /// The state replacements (history and outbox) with a sequence number
    /// above `after`, in sequence order.
    ///
    /// # Errors
    /// [`StoreError::Failed`] when the store cannot be read.
    fn replacements_since(&mut self, after: u64) -> Result<Vec<ReplacementRow>, StoreError>;

    /// The time this store has spent in each phase of its commits so far
    /// (every attempt, cumulative), for [`CommitStats`]; a store that does
    /// not measure itself returns zeros.
    fn phases(&self) -> CommitPhases {
        CommitPhases::default()
    }
}

/// Opens a store from a location: `sqlite:PATH` or `postgres://...` /
/// `postgresql://...` (a libpq-style URL).
///
/// # Errors
/// [`StoreError::Failed`] for an unknown scheme or a store that cannot be opened.
pub fn open(location: &str) -> Result<Box<dyn Store>, StoreError> {
    if let Some(path) = location.strip_prefix("sqlite:") {
        return Ok(Box::new(SqliteStore::open(path, SqliteOptions::default())?));
    }
    if location.starts_with("postgres://") || location.starts_with("postgresql://") {
        return Ok(Box::new(PostgresStore::connect(location)?));
    }
    Err(StoreError::Failed(format!(
        "unknown store {location:?}: expected sqlite:PATH or postgres://..."
    )))
}

/// A version as stored: 20-digit zero-padded decimal text.
pub(crate) fn version_text(v: u64) -> String {
    format!("{v:020}")
}

/// Reads a stored version.
pub(crate) fn parse_version(text: &str) -> Result<u64, StoreError> {
    text.parse()
        .map_err(|_| StoreError::Failed(format!("corrupt version {text:?} in the store")))
}

/// Nanoseconds since the Unix epoch, as stored (i64 reaches the year 2262).
pub(crate) fn time_ns(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// Reads a stored time.
pub(crate) fn ns_time(ns: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(u64::try_from(ns).unwrap_or(0))
}

/// Reads a stored verdict code.
pub(crate) fn verdict(code: &str) -> Result<Verdict, StoreError> {
    Verdict::from_code(code)
        .ok_or_else(|| StoreError::Failed(format!("corrupt decision {code:?} in the store")))
}

/// A [`Store`] wrapper that fails chosen commits, for fault-injection tests:
/// commit number `n` (1-based) fails when `fail(n)` is true, before anything
/// reaches the inner store.
pub struct FaultyStore<S> {
    /// The real store.
    inner: S,
    /// Which commit numbers fail.
    fail: Box<dyn FnMut(u64) -> bool + Send>,
    /// Commits attempted so far.
    attempts: u64,
}

impl<S: Store> FaultyStore<S> {
    /// Wraps `inner`; commit `n` fails when `fail(n)`.
    pub fn new(inner: S, fail: impl FnMut(u64) -> bool + Send + 'static) -> Self {
        Self {
            inner,
            fail: Box::new(fail),
            attempts: 0,
        }
    }
}

impl<S: Store> Store for FaultyStore<S> {
    fn commit(&mut self, writes: &[Write]) -> Result<(), StoreError> {
        self.attempts += 1;
        if (self.fail)(self.attempts) {
            return Err(StoreError::Failed(format!(
                "injected failure of commit {}",
                self.attempts
            )));
        }
        self.inner.commit(writes)
    }

    fn load(&mut self, receipts_since: SystemTime) -> Result<Loaded, StoreError> {
        self.inner.load(receipts_since)
    }

    fn refresh(
        &mut self,
        objects: &[Arc<str>],
        receipts: &[Arc<str>],
    ) -> Result<(Vec<ObjectRow>, Vec<ReceiptRow>), StoreError> {
        self.inner.refresh(objects, receipts)
    }

    fn purge_receipts(&mut self, before: SystemTime) -> Result<u64, StoreError> {
        self.inner.purge_receipts(before)
    }

    fn audit(&mut self) -> Result<Vec<AuditRow>, StoreError> {
        self.inner.audit()
    }

    fn replacements_since(&mut self, after: u64) -> Result<Vec<ReplacementRow>, StoreError> {
        self.inner.replacements_since(after)
    }

    fn phases(&self) -> CommitPhases {
        self.inner.phases()
    }
}
