//! What a bounded shard keeps about its working set (docs/CONTRACT.md §9)
//! and what it asks its driver to read from the store ([`Fetch`], handed
//! back as [`Fetched`]): plain data below the shard. What the shard does
//! with them (plan a fetch, fault objects in, evict) is `working.rs`.

use super::Context;
use crate::store::{ObjectSource, StoreError};
use crate::write::{HeldBody, HeldKey, ObjectRow, ReceiptRow};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::SystemTime;

/// How many times one delivery's event identity is read back from the
/// store in a batch because it was evicted between the look and the claim,
/// before it is answered `retry` (each re-read needs another eviction in the same
/// stripe within one step: in practice never more than one).
pub(crate) const MAX_IDENTITY_REREADS: usize = 16;

/// The bound and the bookkeeping of a shard that reads objects on demand.
pub(crate) struct WorkingSet {
    /// Most objects kept once a group is committed (at least 1).
    pub(super) capacity: usize,
    /// The stamp of the last use.
    pub(super) clock: u64,
    /// Objects in the order of their use, each with the stamp of that use.
    pub(super) order: VecDeque<(Arc<str>, u64)>,
    /// Objects the last reads found absent from the store, until the driver
    /// ends its batch ([`Shard::forget_absent`](super::Shard::forget_absent)): not read again meanwhile.
    pub(super) absent: HashSet<Arc<str>, ahash::RandomState>,
    /// Objects whose step could not be decided for a failed read (of the
    /// object, of the delivery's identity, or of a variant's first record's
    /// object), with the store's error, until the batch ends: every later
    /// step of the batch naming one answers with it too, so none of them
    /// is decided ahead of the one answered `retry`. (A delivery of the
    /// object in a later batch is decided as it comes, as after any
    /// `retry`: the sender's copy is sent again after it.)
    pub(super) unread: HashMap<Arc<str>, StoreError, ahash::RandomState>,
    /// Why the read of the malformed rows' digests failed in this batch
    /// (a step's own read), until the batch ends: every malformed delivery
    /// of the batch answers with it.
    pub(super) malformed_unread: Option<StoreError>,
    /// Held rows the store no longer holds as waiting (another process
    /// sharing it decided them again, and maybe purged them since): their
    /// bodies are not asked for again, and the reconciliation that asked
    /// drops them from memory (`Shard::settled_elsewhere`).
    pub(crate) gone: HashSet<HeldKey, ahash::RandomState>,
    /// Objects read from the store, in total.
    pub(super) loaded: u64,
    /// Objects evicted, in total.
    pub(super) evicted: u64,
    /// The bound on event identities, when they are read on demand too.
    pub(super) identities: Option<IdentityBound>,
}

/// A shard's share of the bounded registry (docs/CONTRACT.md §9): the
/// first records it committed or read back from the store, oldest first,
/// and the stamps of the event identities its current batch looked up.
///
/// The registry is shared by every shard; each shard lets go of the
/// records in its own queue, so only committed records ever leave memory.
/// A record another shard evicted, or one purged, leaves a stale entry
/// here, which evicts nothing when its turn comes.
pub(crate) struct IdentityBound {
    /// Most entries in `queue` once a group is committed (at least 1).
    pub(super) capacity: usize,
    /// Committed first records: event identity, fingerprint, first seen.
    pub(super) queue: VecDeque<(Arc<str>, u128, SystemTime)>,
    /// What the records of `queue` keep in memory, in bytes.
    pub(super) bytes: usize,
    /// Event identities looked up in memory and in the store since the
    /// batch began, with the eviction stamp taken before the look
    /// ([`crate::Registry::stamp`]); cleared when the batch ends.
    pub(super) stamps: HashMap<Arc<str>, u64, ahash::RandomState>,
    /// Identities a step's own read could not read, with the store's
    /// error, until the batch ends.
    pub(super) unread: HashMap<Arc<str>, StoreError, ahash::RandomState>,
    /// How many times each identity's claim was told
    /// [`crate::Claim::Evicted`] in this batch (read again each time, up
    /// to `MAX_IDENTITY_REREADS`); cleared when the batch ends.
    pub(super) rereads: HashMap<Arc<str>, usize, ahash::RandomState>,
    /// Receipts read back from the store, in total.
    pub(super) loaded: u64,
    /// Reads of receipts from the store, in total (one per batch at most).
    pub(super) reads: u64,
    /// Identities the filter of stored identities spared a read, in total
    /// ([`crate::Registry::may_be_stored`]).
    pub(super) spared: u64,
    /// First records evicted by this shard, in total.
    pub(super) evicted: u64,
}

/// What a shard's share of the bounded registry did so far
/// ([`Shard::identity_cache`](super::Shard::identity_cache)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IdentityCacheStats {
    /// The bound: most committed first records this shard keeps.
    pub capacity: usize,
    /// Receipts read back from the store since the shard was built.
    pub loaded: u64,
    /// Reads of receipts from the store since the shard was built (each
    /// reads those of a batch's identities not in memory at once).
    pub reads: u64,
    /// Identities not in memory that the filter of stored identities
    /// showed to be new, so that no read was made for them.
    pub spared: u64,
    /// First records this shard evicted since it was built.
    pub evicted: u64,
}

/// What a shard's working set did so far ([`Shard::working_set`](super::Shard::working_set)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkingSetStats {
    /// The bound: most objects kept once a group is committed.
    pub capacity: usize,
    /// Objects in memory now (pinned ones included).
    pub resident: usize,
    /// Objects read from the store since the shard was built.
    pub loaded: u64,
    /// Objects evicted since the shard was built.
    pub evicted: u64,
}

/// What a bounded shard needs from the store before it decides a batch,
/// or a step (docs/CONTRACT.md §9): the objects and the receipts it does
/// not hold. Made by the shard ([`Shard::plan_fetch`](super::Shard::plan_fetch), or a step that
/// stopped and handed its delivery back); read by its driver, off the step, on the
/// shard's own connection ([`Fetch::read`]); handed back with
/// [`Shard::fetched`](super::Shard::fetched).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fetch {
    /// Object identities to read, each once, none of them in memory.
    pub objects: Vec<Arc<str>>,
    /// Event identities whose receipts to read, each once.
    pub receipts: Vec<Arc<str>>,
    /// Receipts first seen before this have expired (docs/CONTRACT.md §5):
    /// the shard's clock now, less the retention.
    pub since: SystemTime,
    /// Held rows whose exact bodies to read ([`ObjectSource::held_bodies`]):
    /// one object's held or parked events that a reconciliation decides
    /// again, or the malformed rows a malformed delivery is compared with
    /// (docs/CONTRACT.md §9, waiting bodies stay in the store).
    pub held: Vec<HeldKey>,
    /// Whose rows `held` are: `Some(object)` for its held or parked
    /// events, `None` for malformed rows.
    pub(super) held_of: Option<Arc<str>>,
    /// Whether a step asked for it (a failure is then the step's answer),
    /// not the plan of a batch (a failure is then only forgotten).
    pub(super) step: bool,
}

impl Fetch {
    /// A fetch of `objects` and `receipts`; `None` when both are empty.
    pub(super) fn new(
        ctx: &Context,
        objects: Vec<Arc<str>>,
        receipts: Vec<Arc<str>>,
        step: bool,
    ) -> Option<Fetch> {
        if objects.is_empty() && receipts.is_empty() {
            return None;
        }
        let since = ctx
            .clock()
            .now()
            .checked_sub(ctx.registry().retention())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        Some(Fetch {
            objects,
            receipts,
            since,
            held: Vec::new(),
            held_of: None,
            step,
        })
    }

    /// A step's read of the bodies of held rows `keys` (of `object`'s held
    /// or parked events, or malformed rows when `None`).
    pub(super) fn bodies(ctx: &Context, object: Option<Arc<str>>, keys: Vec<HeldKey>) -> Fetch {
        let mut fetch = Fetch::new(ctx, Vec::new(), Vec::new(), true).unwrap_or(Fetch {
            objects: Vec::new(),
            receipts: Vec::new(),
            since: SystemTime::UNIX_EPOCH,
            held: Vec::new(),
            held_of: None,
            step: true,
        });
        fetch.held = keys;
        fetch.held_of = object;
        fetch
    }

    /// The error a step answers when its driver does not read (it calls
    /// [`Shard::deliver`](super::Shard::deliver) on a bounded shard): what is only in the store.
    pub(crate) fn not_read(&self) -> StoreError {
        let mut names: Vec<String> = self
            .objects
            .iter()
            .map(|id| format!("object {id}"))
            .collect();
        names.extend(
            self.receipts
                .iter()
                .map(|id| format!("event identity {id}")),
        );
        if !self.held.is_empty() {
            names.push(match &self.held_of {
                Some(id) => format!("the bodies of {} held events of {id}", self.held.len()),
                None => format!("the bodies of {} malformed inputs", self.held.len()),
            });
        }
        StoreError::Failed(format!(
            "{} only in the store, and this shard's driver does not read it (a bounded shard is driven by a Pipeline)",
            names.join(", ")
        ))
    }

    /// Reads the fetch through `source`: one read of the objects and one
    /// of the receipts, each only when some are wanted. It blocks for as
    /// long as the store takes: an async caller runs it on a blocking
    /// thread.
    ///
    /// # Errors
    /// The source's [`StoreError`]; nothing is returned then.
    pub fn read(&self, source: &mut dyn ObjectSource) -> Result<Fetched, StoreError> {
        let objects = if self.objects.is_empty() {
            Vec::new()
        } else {
            source.objects(&self.objects)?
        };
        let receipts = if self.receipts.is_empty() {
            Vec::new()
        } else {
            source.receipts(&self.receipts, self.since)?
        };
        let held = if self.held.is_empty() {
            Vec::new()
        } else {
            source.held_bodies(&self.held)?
        };
        Ok(Fetched {
            objects,
            receipts,
            held,
        })
    }
}

/// What the store holds of a [`Fetch`]: the rows it found, in any order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fetched {
    /// The stored rows of the objects asked for that the store holds.
    pub objects: Vec<ObjectRow>,
    /// The stored receipts asked for that are within retention.
    pub receipts: Vec<ReceiptRow>,
    /// The exact bodies of the held rows asked for, each with its key.
    pub held: Vec<HeldBody>,
}

/// Why a step of a bounded shard cannot be decided yet.
#[derive(Debug)]
pub(crate) enum Missing {
    /// It needs these rows from the store first: nothing was changed.
    Fetch(Fetch),
    /// Its read of them failed: the step answers with this error.
    Failed(StoreError),
}
