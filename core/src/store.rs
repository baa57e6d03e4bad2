//! The storage boundary: the synchronous [`Store`] trait a durable backend
//! implements, its error type, and [`FaultyStore`] for fault injection.
//!
//! A store commits the [`Write`]s of one or more shard steps in one
//! transaction (see [`crate::engine`] for the handshake that produces them).

use crate::reconciler::WaitRecord;
use crate::relay::{Effect, ParkedEffect, RelayRow, RelaySave};
use crate::write::{
    AuditRow, EffectRow, HeldBody, HeldKey, Loaded, ObjectRow, ReceiptRow, VariantRow, Write,
};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Why a store operation failed. `Clone`, because one failed group commit
/// answers every shard that was waiting for it; the backend's own error is
/// kept (shared) as the [`std::error::Error::source`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A condition of the batch no longer holds (another process changed a
    /// row, or a receipt already exists): nothing was committed; reload and
    /// decide again.
    #[error("concurrent change: {0}")]
    Conflict(String),
    /// The store could not commit or read, for a reason this crate states
    /// itself (corrupt row, unknown location): nothing was committed.
    #[error("store failure: {0}")]
    Failed(String),
    /// The store named by a location does not exist (a SQLite file that is
    /// not there). Nothing was created. The message names the location.
    #[error("no such store: {0}")]
    Missing(String),
    /// The location exists but holds no receiver store: a database or
    /// schema without the receiver's tables, or a file that is not a SQLite
    /// database. Nothing was created. The message names the location and
    /// what is missing.
    #[error("not a snapshot-receiver store: {0}")]
    NotAStore(String),
    /// The store cannot hold what the writes contain (a value its column
    /// type refuses, such as U+0000 in PostgreSQL text; a row over its size
    /// limit): nothing was committed, and committing the same rows again
    /// fails the same way. The committer finds the delivery whose writes
    /// are refused, commits the rest of the group without it, and answers
    /// that delivery's shard with this error, `body` naming the delivery
    /// (its exact bytes) so that the shard answers it `reject`
    /// ([`crate::RejectReason::StoreRefused`]). A store reports `None`.
    #[error("the store refused a row: {cause}")]
    Refused {
        /// What the store refused, in its words.
        cause: String,
        /// The exact body of the refused delivery, once the committer found
        /// it; `None` from a store, or when the refused writes were not a
        /// delivery's (a pause, an authoritative snapshot).
        body: Option<Arc<[u8]>>,
    },
    /// A store location that does not read as one (`sqlite:` with no path,
    /// an unsupported scheme such as `mysql://`), or one this use cannot
    /// take (`memory` where a store is read from outside the process that
    /// holds it). Nothing was opened or created. The message names the
    /// location and what is wrong.
    #[error("bad store location: {0}")]
    InvalidLocation(String),
    /// The backend failed (I/O, full disk, lost connection, locked database):
    /// nothing was committed. `context` says what was being done; the
    /// backend's error is the source.
    #[error("store failure: {context}")]
    Backend {
        /// What the store was doing, for example `sqlite` or `postgres: commit`.
        context: String,
        /// The backend's error.
        #[source]
        source: BackendError,
    },
}

impl StoreError {
    /// A [`StoreError::Backend`] for `source`, met while doing `context`.
    pub fn backend(
        context: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        StoreError::Backend {
            context: context.into(),
            source: BackendError(Arc::new(source)),
        }
    }
}

/// A backend's error, shared so that [`StoreError`] stays `Clone`. Two are
/// equal when they say the same thing (`Display`), which is what tests and
/// callers compare.
#[derive(Clone, Debug)]
pub struct BackendError(Arc<dyn std::error::Error + Send + Sync>);

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl PartialEq for BackendError {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

impl Eq for BackendError {}

/// Wall-clock and CPU time spent in one phase of committing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhaseTime {
    /// Elapsed time, waiting included (for the disk, the server, a CPU).
    pub wall: Duration,
    /// CPU time (user + system) of the thread that committed; zero where
    /// the store does not measure it.
    pub cpu: Duration,
}

impl PhaseTime {
    /// Elapsed time not spent on the committing thread's CPU: for the commit
    /// phase, mostly waiting for the fsync (SQLite) or the server
    /// (PostgreSQL).
    pub fn waiting(&self) -> Duration {
        self.wall.saturating_sub(self.cpu)
    }

    /// The time spent since `earlier`, a reading of the same running total.
    pub fn since(&self, earlier: &PhaseTime) -> PhaseTime {
        PhaseTime {
            wall: self.wall.saturating_sub(earlier.wall),
            cpu: self.cpu.saturating_sub(earlier.cpu),
        }
    }
}

/// Cumulative time a [`Store`] spent in the phases of its commits (every
/// attempt, committed or not), as returned by [`Store::phases`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitPhases {
    /// Turning the writes into rows and statement parameters (folding one
    /// object's writes into one row, building the parameter arrays).
    pub encode: PhaseTime,
    /// Executing the transaction's statements, the commit excluded (where a
    /// group is one statement that commits on its own, the commit too).
    pub execute: PhaseTime,
    /// The commit: for SQLite the WAL write and, with `synchronous=FULL`,
    /// its fsync; for PostgreSQL the round trip in which the server flushes
    /// its WAL.
    pub commit: PhaseTime,
    /// Writes applied one statement each instead of in a folded group's
    /// statements: writes a fold does not cover (seeds, authoritative
    /// snapshots, held-status changes, a variant's pause of another shard's
    /// object) and the runs whose steps on an object do not chain. A count
    /// of writes, not a time.
    pub unfolded: u64,
}

impl CommitPhases {
    /// The time spent since `earlier`, a reading of the same running totals.
    pub fn since(&self, earlier: &CommitPhases) -> CommitPhases {
        CommitPhases {
            encode: self.encode.since(&earlier.encode),
            execute: self.execute.since(&earlier.execute),
            commit: self.commit.since(&earlier.commit),
            unfolded: self.unfolded.saturating_sub(earlier.unfolded),
        }
    }
}

/// Where a shard with a bounded working set reads the objects and event
/// identities it does not hold in memory (docs/CONTRACT.md §9): a
/// connection of its own to the store, used only by that shard's driver,
/// between the shard's steps and never inside one ([`crate::engine::Fetch::read`];
/// a call may block for one short read, so an async driver makes it on a
/// blocking thread).
///
/// It must see every commit the store reported before the read started
/// (read committed), so that an object or receipt evicted after its writes
/// committed is read back as it left memory.
pub trait ObjectSource: Send + 'static {
    /// The stored rows of those of `ids` the store holds, in any order; an
    /// id the store does not hold is left out.
    ///
    /// # Errors
    /// [`StoreError::Failed`] or [`StoreError::Backend`] when the store
    /// cannot be read; nothing is returned then.
    fn objects(&mut self, ids: &[Arc<str>]) -> Result<Vec<ObjectRow>, StoreError>;

    /// The stored receipts of those of `event_ids` the store holds that
    /// were first seen at or after `since` (older ones have expired, docs/CONTRACT.md
    /// §5), in any order; an identity without one is left out.
    ///
    /// # Errors
    /// [`StoreError::Failed`] or [`StoreError::Backend`] when the store
    /// cannot be read; nothing is returned then.
    fn receipts(
        &mut self,
        event_ids: &[Arc<str>],
        since: SystemTime,
    ) -> Result<Vec<ReceiptRow>, StoreError>;

    /// The exact bodies of the held rows `keys` (held, parked or malformed
    /// inputs), each with its key, in any order; a key the store does not
    /// hold is left out. A shard whose waiting bodies stay in the store
    /// (docs/CONTRACT.md §9) reads them when it decides the events again
    /// ([`crate::engine::Fetch::held`]). The default reads none and fails:
    /// a source that cannot read them can serve no such shard.
    ///
    /// # Errors
    /// [`StoreError::Failed`] or [`StoreError::Backend`] when the store
    /// cannot be read; nothing is returned then.
    fn held_bodies(&mut self, keys: &[HeldKey]) -> Result<Vec<HeldBody>, StoreError> {
        Err(StoreError::Failed(format!(
            "this object source cannot read held bodies ({} asked for)",
            keys.len()
        )))
    }

    /// One page of the stored receipts first seen at or after `since`: the
    /// event identities after `after` (from the first when `""`; the
    /// store's own text order, the order of its receipts' key), at most
    /// `limit` of them, each with when it was first seen. The start-up scan
    /// of the filter of stored identities ([`crate::IdentityFilter`]) pages
    /// through them, asking for the page after the last identity it got
    /// until a page is shorter than `limit`.
    ///
    /// # Errors
    /// [`StoreError::Failed`] or [`StoreError::Backend`] when the store
    /// cannot be read; nothing is returned then.
    fn receipt_ids(
        &mut self,
        after: &str,
        since: SystemTime,
        limit: usize,
    ) -> Result<Vec<(Arc<str>, SystemTime)>, StoreError>;
}

/// The outbox and the relays of one store, on a connection of its own
/// (docs/CONTRACT.md §10), for a relay running beside the receiver (or in
/// another process): reading effects never waits for the committer, and a
/// relay's saves are short transactions of their own. Every method may
/// block; call it from a blocking thread.
///
/// Positions are given by the store as it commits: 1, 2, 3, ... without
/// gaps, in commit order (one order over every process sharing the store),
/// so what a reader has not seen is always above the positions it saw.
pub trait OutboxStore: Send + 'static {
    /// At most `limit` effects with a position above `after`, in position
    /// order (a reader that asks again after the last one it got misses
    /// none).
    ///
    /// # Errors
    /// The store cannot be read; nothing is returned then.
    fn effects_after(&mut self, after: u64, limit: usize) -> Result<Vec<Effect>, StoreError>;

    /// At most `limit` effects with a position above `after`, in position
    /// order, whose states add up to at most `max_bytes` bytes, but always
    /// the first one when there is one (however large its state): a
    /// relay's read, which keeps a round within its part of the memory
    /// budget (docs/CONTRACT.md §9). A durable store reads no state past
    /// the cut; the default, for stores that keep their states in memory
    /// anyway, cuts what [`OutboxStore::effects_after`] gives.
    ///
    /// # Errors
    /// The store cannot be read; nothing is returned then.
    fn effects_within(
        &mut self,
        after: u64,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<Effect>, StoreError> {
        let mut effects = self.effects_after(after, limit)?;
        let mut bytes = 0usize;
        let cut = effects
            .iter()
            .position(|e| {
                bytes = bytes.saturating_add(e.bytes());
                bytes > max_bytes
            })
            .map_or(effects.len(), |i| i.max(1));
        effects.truncate(cut);
        Ok(effects)
    }

    /// The effects at `positions`, in position order: a relay reads a
    /// parked effect's state back when it is due (it keeps only its head,
    /// [`crate::relay::EffectHead`]). A position the outbox does not hold
    /// is left out.
    ///
    /// # Errors
    /// The store cannot be read; nothing is returned then.
    fn effects_at(&mut self, positions: &[u64]) -> Result<Vec<Effect>, StoreError>;

    /// The last position given so far (0: no effect yet).
    ///
    /// # Errors
    /// The store cannot be read.
    fn last_position(&mut self) -> Result<u64, StoreError>;

    /// The relay `name`, created at position `start` when the store has no
    /// such relay yet; with `owner`, its lease is taken for that run for
    /// `lease` when nobody holds it, it has ended, or `owner` holds it
    /// already (a new owner raises the generation). A durable store times
    /// the lease on its own clock (docs/CONTRACT.md §10: leases compare
    /// times on one clock); `now`, the caller's time, dates the change (in
    /// memory, one process, it is the clock). A relay whose lease
    /// another run holds is returned as it is: check
    /// [`RelayRow::owner`].
    ///
    /// # Errors
    /// The store cannot be written.
    fn open_relay(
        &mut self,
        name: &str,
        start: u64,
        owner: Option<&str>,
        now: SystemTime,
        lease: Duration,
    ) -> Result<RelayRow, StoreError>;

    /// Every relay of the store, by name.
    ///
    /// # Errors
    /// The store cannot be read.
    fn relays(&mut self) -> Result<Vec<RelayRow>, StoreError>;

    /// Saves relay `name`'s progress ([`RelaySave`]) in one transaction,
    /// renewing `owner`'s lease for `lease` (on the store's clock, as in
    /// [`OutboxStore::open_relay`]), if the relay is still
    /// at `generation` and held by `owner`; `false` (nothing written) when
    /// it is not: an operator changed it, or another run took it over.
    ///
    /// # Errors
    /// The store cannot be written; nothing was.
    fn save_relay(
        &mut self,
        name: &str,
        generation: u64,
        owner: &str,
        save: &RelaySave,
        now: SystemTime,
        lease: Duration,
    ) -> Result<bool, StoreError>;

    /// The effects relay `name` parked, in position order, each with its
    /// effect's head, not its state ([`OutboxStore::effects_at`] reads
    /// that; a parked effect is never purged before it is done).
    ///
    /// # Errors
    /// The store cannot be read.
    fn parked(&mut self, name: &str) -> Result<Vec<ParkedEffect>, StoreError>;

    /// An operator's retry: relay `name`'s failed effects (only the one at
    /// `position`, when given) are tried again now from the first attempt
    /// of their schedule. Raises the relay's generation. Returns how many.
    ///
    /// # Errors
    /// The store cannot be written.
    fn retry_failed(
        &mut self,
        name: &str,
        position: Option<u64>,
        now: SystemTime,
    ) -> Result<u64, StoreError>;

    /// An operator's skip: relay `name`'s parked effect at `position` is
    /// dropped without being delivered (the next parked effect of its
    /// object goes then). Raises the relay's generation. Returns whether
    /// there was one.
    ///
    /// # Errors
    /// The store cannot be written.
    fn skip(&mut self, name: &str, position: u64, now: SystemTime) -> Result<bool, StoreError>;

    /// An operator's rewind: relay `name` reads again from after
    /// `position` (every effect above it is delivered again, with its same
    /// id); its parked effects above `position` are dropped (they come
    /// again with the rest). Raises the relay's generation. Returns the
    /// relay as it is now, `None` when there is no such relay.
    ///
    /// # Errors
    /// The store cannot be written.
    fn rewind(
        &mut self,
        name: &str,
        position: u64,
        now: SystemTime,
    ) -> Result<Option<RelayRow>, StoreError>;
}

/// What a reconciler reads and writes in a durable store besides what the
/// committer commits, on a connection of its own (docs/CONTRACT.md §4):
/// pages of object ids for a resync, and the last error of each object
/// waiting for an authority, which operators read without the process
/// (`inspect`, the status page). Every method may block; call it from a
/// blocking thread.
pub trait AuthorityStore: Send + 'static {
    /// At most `limit` object ids the store holds after `after` (from the
    /// first when `""`), in the store's text order of object ids: a
    /// resync pages through them, asking for the page after the last id it
    /// got until a page is shorter than `limit`.
    ///
    /// # Errors
    /// The store cannot be read; nothing is returned then.
    fn object_ids(&mut self, after: &str, limit: usize) -> Result<Vec<Arc<str>>, StoreError>;

    /// Writes `records` in one transaction, in order: a
    /// [`WaitRecord::Failed`] replaces the object's row, a
    /// [`WaitRecord::Settled`] deletes it.
    ///
    /// # Errors
    /// The store cannot be written; nothing was.
    fn save_waits(&mut self, records: &[WaitRecord]) -> Result<(), StoreError>;
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

    /// Like [`Store::load`], for a receiver whose shards read objects and
    /// receipts on demand ([`Store::object_source`]): the objects left out
    /// may be those that are neither paused nor hold an unresolved input,
    /// and the receipts may all be left out (variants not), which the
    /// shards then read when a step needs them. The default loads
    /// everything, as [`Store::load`] does.
    ///
    /// # Errors
    /// [`StoreError::Failed`] when the store cannot be read.
    fn load_resident(&mut self, receipts_since: SystemTime) -> Result<Loaded, StoreError> {
        self.load(receipts_since)
    }

    /// A new connection for one shard to read objects on demand, or `None`
    /// when this store cannot give one (then every object stays in memory
    /// and [`Store::load`] is used, as before docs/CONTRACT.md §9).
    ///
    /// # Errors
    /// [`StoreError::Failed`] when the store can give one and opening it
    /// failed.
    fn object_source(&mut self) -> Result<Option<Box<dyn ObjectSource>>, StoreError> {
        Ok(None)
    }

    /// A new connection for relays ([`OutboxStore`]), or `None` when this
    /// store cannot give one (the default).
    ///
    /// # Errors
    /// The store can give one and opening it failed.
    fn outbox_store(&mut self) -> Result<Option<Box<dyn OutboxStore>>, StoreError> {
        Ok(None)
    }

    /// A new connection for a reconciler ([`AuthorityStore`]), or `None`
    /// when this store cannot give one (the default): its resync then
    /// pages through the objects in memory, and the last errors stay in
    /// the process.
    ///
    /// # Errors
    /// The store can give one and opening it failed.
    fn authority_store(&mut self) -> Result<Option<Box<dyn AuthorityStore>>, StoreError> {
        Ok(None)
    }

    /// Every stored object, in object order (the read behind a receiver's
    /// list of objects when some are not in memory). The default takes them
    /// from [`Store::load`].
    ///
    /// # Errors
    /// [`StoreError::Failed`] when the store cannot be read.
    fn objects(&mut self) -> Result<Vec<ObjectRow>, StoreError> {
        self.load(SystemTime::UNIX_EPOCH).map(|l| l.objects)
    }

    /// Reloads some objects and receipts after a conflict. The receipts are
    /// read before the objects (or both in one snapshot): a receipt commits
    /// with its object change, so a receipt returned must never come with
    /// its object as it was before that change.
    ///
    /// # Errors
    /// [`StoreError::Failed`] when the store cannot be read.
    fn refresh(
        &mut self,
        objects: &[Arc<str>],
        receipts: &[Arc<str>],
    ) -> Result<(Vec<ObjectRow>, Vec<ReceiptRow>), StoreError>;

    /// Every variant recorded for these event identities (reloaded after a
    /// conflict, beside [`Store::refresh`]).
    ///
    /// # Errors
    /// [`StoreError::Failed`] when the store cannot be read.
    fn refresh_variants(&mut self, event_ids: &[Arc<str>]) -> Result<Vec<VariantRow>, StoreError>;

    /// Deletes receipts and variants first seen before `before`; returns how
    /// many rows.
    ///
    /// # Errors
    /// [`StoreError::Failed`] when the store cannot be written.
    fn purge_receipts(&mut self, before: SystemTime) -> Result<u64, StoreError>;

    /// Deletes at most `limit` rows of `records` recorded before `before`,
    /// in one short transaction of its own, and returns how many rows it
    /// deleted (fewer than `limit`: nothing older is left to delete). Rows
    /// of events still held, parked or unresolved, and the audit rows that
    /// justify them (the rows of their event identity, of their step, and
    /// of an object still paused), are never deleted (docs/CONTRACT.md §9),
    /// nor the audit rows of the highest sequence number stored, from which
    /// [`Store::load`] tells a restarted receiver where to number its steps.
    /// A SQLite store then returns freed pages to the file system
    /// (`PRAGMA incremental_vacuum`). The default keeps everything and
    /// answers 0, for a store that keeps no such rows.
    ///
    /// # Errors
    /// [`StoreError::Failed`] when the store cannot be written; the batch
    /// deleted nothing.
    fn purge_records(
        &mut self,
        records: Records,
        before: SystemTime,
        limit: usize,
    ) -> Result<u64, StoreError> {
        let _ = (records, before, limit);
        Ok(0)
    }

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
    fn replacements_since(&mut self, after: u64) -> Result<Vec<EffectRow>, StoreError>;

    /// Runs `writes` as [`Store::commit`] would, in one transaction, and
    /// rolls it back: nothing is kept either way. The committer uses it to
    /// find which delivery of a group the store refuses
    /// ([`StoreError::Refused`]). A store that cannot try writes without
    /// keeping them answers [`StoreError::Failed`] (the default), and a
    /// refused group is then answered `retry` as a whole.
    ///
    /// # Errors
    /// What [`Store::commit`] would have answered.
    fn probe(&mut self, writes: &[Write]) -> Result<(), StoreError> {
        let _ = writes;
        Err(StoreError::Failed(
            "this store cannot try writes without committing them".to_owned(),
        ))
    }

    /// The time this store has spent in each phase of its commits so far
    /// (every attempt, cumulative), for the committer's statistics; a store
    /// that does not measure itself returns zeros.
    fn phases(&self) -> CommitPhases {
        CommitPhases::default()
    }
}

/// The stored records with a retention window of their own besides the
/// event identities (docs/CONTRACT.md §9), for [`Store::purge_records`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Records {
    /// The audit trail (table `audit`).
    Audit,
    /// The replacement history and outbox (table `replacements`).
    History,
    /// Held rows already decided by reconciliation (table `held`, status
    /// `resolved`): the audit trail records their outcome, so they follow
    /// the audit window. Held, parked, malformed and superseded rows stay.
    Resolved,
}

impl Records {
    /// Every kind, in the order a purge takes them.
    pub const ALL: [Records; 3] = [Records::Audit, Records::History, Records::Resolved];

    /// The table the rows are in: `audit`, `replacements` or `held`.
    pub fn table(self) -> &'static str {
        match self {
            Records::Audit => "audit",
            Records::History => "replacements",
            Records::Resolved => "held",
        }
    }
}

/// What a [`FaultyStore`] makes of one commit instead of committing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// [`StoreError::Failed`]: the shards roll back and answer `retry`.
    Failed,
    /// [`StoreError::Conflict`], as when another process changed a row the
    /// batch read: the shards roll back, reload and decide again.
    Conflict,
}

/// The rows a [`FaultyStore`] refuses: `Some(cause)` for a write it cannot hold.
type Refuse = dyn FnMut(&Write) -> Option<String> + Send;

/// A [`Store`] wrapper that fails chosen commits, for fault-injection tests:
/// commit number `n` (1-based, counting every commit attempted, the
/// receiver's seeding of its initial objects included) gets the [`Fault`]
/// the chooser returns for `n`, before anything reaches the inner store.
/// With [`FaultyStore::refusing`] it also refuses single rows, as a real
/// store refuses a value it cannot hold: every commit (and probe) holding a
/// refused write fails with [`StoreError::Refused`], whatever else it holds.
pub struct FaultyStore<S> {
    /// The real store.
    inner: S,
    /// The fault of each commit number, `None` to commit.
    fault: Box<dyn FnMut(u64) -> Option<Fault> + Send>,
    /// The writes refused: `Some(cause)` for a write the store cannot hold.
    refuse: Box<Refuse>,
    /// Commits attempted so far.
    attempts: u64,
}

impl<S: Store> FaultyStore<S> {
    /// Wraps `inner`; commit `n` fails ([`Fault::Failed`]) when `fail(n)`.
    pub fn new(inner: S, mut fail: impl FnMut(u64) -> bool + Send + 'static) -> Self {
        Self::with_faults(inner, move |n| fail(n).then_some(Fault::Failed))
    }

    /// Wraps `inner`; commit `n` gets `fault(n)` (`None`: it is committed).
    pub fn with_faults(inner: S, fault: impl FnMut(u64) -> Option<Fault> + Send + 'static) -> Self {
        Self {
            inner,
            fault: Box::new(fault),
            refuse: Box::new(|_| None),
            attempts: 0,
        }
    }

    /// Wraps `inner`; a commit or probe holding a write for which
    /// `refuse` returns `Some(cause)` fails with [`StoreError::Refused`]
    /// naming that cause (the first such write's), and nothing of it
    /// reaches `inner`. Every other commit is committed.
    pub fn refusing(
        inner: S,
        refuse: impl FnMut(&Write) -> Option<String> + Send + 'static,
    ) -> Self {
        Self {
            refuse: Box::new(refuse),
            ..Self::with_faults(inner, |_| None)
        }
    }

    /// The cause of the first refused write of `writes`, if any.
    fn refused(&mut self, writes: &[Write]) -> Result<(), StoreError> {
        match writes.iter().find_map(|w| (self.refuse)(w)) {
            Some(cause) => Err(StoreError::Refused { cause, body: None }),
            None => Ok(()),
        }
    }
}

impl<S: Store> Store for FaultyStore<S> {
    fn commit(&mut self, writes: &[Write]) -> Result<(), StoreError> {
        self.attempts += 1;
        let n = self.attempts;
        match (self.fault)(n) {
            None => {
                self.refused(writes)?;
                self.inner.commit(writes)
            }
            Some(Fault::Failed) => Err(StoreError::Failed(format!(
                "injected failure of commit {n}"
            ))),
            Some(Fault::Conflict) => Err(StoreError::Conflict(format!(
                "injected conflict at commit {n}"
            ))),
        }
    }

    fn probe(&mut self, writes: &[Write]) -> Result<(), StoreError> {
        self.refused(writes)?;
        self.inner.probe(writes)
    }

    fn load(&mut self, receipts_since: SystemTime) -> Result<Loaded, StoreError> {
        self.inner.load(receipts_since)
    }

    fn load_resident(&mut self, receipts_since: SystemTime) -> Result<Loaded, StoreError> {
        self.inner.load_resident(receipts_since)
    }

    fn object_source(&mut self) -> Result<Option<Box<dyn ObjectSource>>, StoreError> {
        self.inner.object_source()
    }

    fn outbox_store(&mut self) -> Result<Option<Box<dyn OutboxStore>>, StoreError> {
        self.inner.outbox_store()
    }

    fn authority_store(&mut self) -> Result<Option<Box<dyn AuthorityStore>>, StoreError> {
        self.inner.authority_store()
    }

    fn objects(&mut self) -> Result<Vec<ObjectRow>, StoreError> {
        self.inner.objects()
    }

    fn refresh(
        &mut self,
        objects: &[Arc<str>],
        receipts: &[Arc<str>],
    ) -> Result<(Vec<ObjectRow>, Vec<ReceiptRow>), StoreError> {
        self.inner.refresh(objects, receipts)
    }

    fn refresh_variants(&mut self, event_ids: &[Arc<str>]) -> Result<Vec<VariantRow>, StoreError> {
        self.inner.refresh_variants(event_ids)
    }

    fn purge_receipts(&mut self, before: SystemTime) -> Result<u64, StoreError> {
        self.inner.purge_receipts(before)
    }

    fn purge_records(
        &mut self,
        records: Records,
        before: SystemTime,
        limit: usize,
    ) -> Result<u64, StoreError> {
        self.inner.purge_records(records, before, limit)
    }

    fn audit(&mut self) -> Result<Vec<AuditRow>, StoreError> {
        self.inner.audit()
    }

    fn replacements_since(&mut self, after: u64) -> Result<Vec<EffectRow>, StoreError> {
        self.inner.replacements_since(after)
    }

    fn phases(&self) -> CommitPhases {
        self.inner.phases()
    }
}
