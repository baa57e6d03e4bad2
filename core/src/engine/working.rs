//! A shard's bounded working set (docs/CONTRACT.md §9): with a durable
//! store the store is the truth for objects, and memory holds at most a
//! configured number of them. A step that names an object the shard does
//! not hold reads it first, through the shard's own [`ObjectSource`]; the
//! driver reads the objects of a whole batch in one read beforehand
//! ([`Shard::prefetch`]). Once a group's writes are committed, the least
//! recently used objects beyond the bound are evicted ([`Shard::evict`]).
//!
//! What is never evicted, so that no decision and no count depends on the
//! cache: an object with a write not yet committed (its stored row would be
//! older than memory), a paused object, and an object holding events (its
//! held queue lives only in memory and at start-up is rebuilt from the
//! store's held rows). Events parked for unknown objects are not objects:
//! they stay as they are, bounded by the parking limits.
//!
//! Event identities may be bounded the same way
//! ([`Shard::bound_identities`]): the registry keeps the first records
//! each shard committed or read back, up to its share, and a delivery whose
//! identity is not in memory reads its receipt from the store before its
//! claim. An eviction bumps a stamp of the identity's stripe
//! ([`crate::Registry::stamp`]); a claim that finds no record checks it
//! ([`crate::Registry::claim_checked`]) and reads the store again when it
//! moved, so a record evicted between the look and the claim is never
//! mistaken for a new identity. Variants stay in memory (they are rare).
//! A compact filter of the identities the store may hold
//! ([`crate::IdentityFilter`]) spares the read for an identity it has
//! certainly never seen: the common case of a new event.
//!
//! Recency is a stamp per object plus a queue of `(object, stamp)` in the
//! order they were used; an entry whose stamp is no longer the object's
//! is stale and skipped. The queue is rebuilt when stale entries make up
//! most of it, so it stays within a small multiple of the objects held.

use super::budget::{MemoryBudget, MemoryUse, IDENTITY_OVERHEAD};
use super::{Context, ObjectActor, Shard};
use crate::envelope::StateJson;
use crate::store::{ObjectSource, StoreError};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::SystemTime;

/// The bound and the bookkeeping of a shard that reads objects on demand.
pub(crate) struct WorkingSet {
    /// Where objects not in memory are read.
    source: Box<dyn ObjectSource>,
    /// Most objects kept once a group is committed (at least 1).
    capacity: usize,
    /// The stamp of the last use.
    clock: u64,
    /// Objects in the order of their use, each with the stamp of that use.
    order: VecDeque<(Arc<str>, u64)>,
    /// Objects the last reads found absent from the store, until the driver
    /// ends its batch ([`Shard::forget_absent`]): not read again meanwhile.
    absent: HashSet<Arc<str>, ahash::RandomState>,
    /// Objects read from the store, in total.
    loaded: u64,
    /// Objects evicted, in total.
    evicted: u64,
    /// The bound on event identities, when they are read on demand too.
    identities: Option<IdentityBound>,
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
    capacity: usize,
    /// Committed first records: event identity, fingerprint, first seen.
    queue: VecDeque<(Arc<str>, u128, SystemTime)>,
    /// What the records of `queue` keep in memory, in bytes.
    bytes: usize,
    /// Event identities looked up in memory and in the store since the
    /// batch began, with the eviction stamp taken before the look
    /// ([`crate::Registry::stamp`]); cleared when the batch ends.
    stamps: HashMap<Arc<str>, u64, ahash::RandomState>,
    /// Receipts read back from the store, in total.
    loaded: u64,
    /// Reads of receipts from the store, in total (one per batch at most).
    reads: u64,
    /// Identities the filter of stored identities spared a read, in total
    /// ([`crate::Registry::may_be_stored`]).
    spared: u64,
    /// First records evicted by this shard, in total.
    evicted: u64,
}

/// What a shard's share of the bounded registry did so far
/// ([`Shard::identity_cache`]).
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

/// What a shard's working set did so far ([`Shard::working_set`]).
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

impl Shard {
    /// Bounds this shard's objects to `capacity` (at least 1) once its
    /// groups are committed, reading the others through `source` when a
    /// step needs them. Call once, before the first step, with a store that
    /// holds every object this shard owns (its rows, not only those in
    /// memory).
    pub fn bound_objects(&mut self, source: Box<dyn ObjectSource>, capacity: usize) {
        self.working = Some(WorkingSet {
            source,
            capacity: capacity.max(1),
            clock: 0,
            order: VecDeque::new(),
            absent: HashSet::default(),
            loaded: 0,
            evicted: 0,
            identities: None,
        });
    }

    /// Bounds this shard's share of the registry to `capacity` committed
    /// first records (at least 1), reading the others back from the store
    /// (the source of [`Shard::bound_objects`], which must be called first)
    /// when a delivery names them. Call once, before the first step, with
    /// a store that holds every receipt within retention: start-up then
    /// needs to load none (variants stay in memory).
    ///
    /// # Panics
    /// Without [`Shard::bound_objects`] before.
    pub fn bound_identities(&mut self, capacity: usize) {
        let working = self
            .working
            .as_mut()
            .expect("Shard::bound_identities needs Shard::bound_objects first");
        working.identities = Some(IdentityBound {
            capacity: capacity.max(1),
            queue: VecDeque::new(),
            bytes: 0,
            stamps: HashMap::default(),
            loaded: 0,
            reads: 0,
            spared: 0,
            evicted: 0,
        });
    }

    /// The bound on this shard's share of the registry and its counts;
    /// `None` when identities stay in memory (no [`Shard::bound_identities`]).
    pub fn identity_cache(&self) -> Option<IdentityCacheStats> {
        let b = self.working.as_ref()?.identities.as_ref()?;
        Some(IdentityCacheStats {
            capacity: b.capacity,
            loaded: b.loaded,
            reads: b.reads,
            spared: b.spared,
            evicted: b.evicted,
        })
    }

    /// Reads from the store, in one read, the receipts of those of
    /// `event_ids` this batch did not look up yet, the registry holds no
    /// live record of and the filter of stored identities does not rule
    /// out ([`crate::Registry::may_be_stored`]), and puts them back in the
    /// registry; every one of them gets its eviction stamp, taken before
    /// the look. A no-op unless identities are bounded
    /// ([`Shard::bound_identities`]).
    ///
    /// # Errors
    /// The source's error; nothing was read then, and no stamp kept (each
    /// delivery that needs one tries again, and answers `retry` if it fails).
    pub fn prefetch_identities<'a>(
        &mut self,
        ctx: &Context,
        event_ids: impl IntoIterator<Item = &'a Arc<str>>,
    ) -> Result<(), StoreError> {
        let Some(working) = self.working.as_mut() else {
            return Ok(());
        };
        let Some(bound) = working.identities.as_mut() else {
            return Ok(());
        };
        let registry = ctx.registry();
        let now = ctx.clock().now();
        let mut wanted: Vec<Arc<str>> = Vec::new();
        for id in event_ids {
            if bound.stamps.contains_key(id) {
                continue;
            }
            // The stamp first: an eviction after it and before the claim
            // moves it, whether it came before or after this look.
            bound.stamps.insert(id.clone(), registry.stamp(id));
            if registry.is_live(id, now) {
                continue;
            }
            if registry.may_be_stored(id, now) {
                wanted.push(id.clone());
            } else {
                bound.spared += 1;
            }
        }
        if wanted.is_empty() {
            return Ok(());
        }
        let since = now
            .checked_sub(registry.retention())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let rows = match working.source.receipts(&wanted, since) {
            Ok(rows) => {
                bound.reads += 1;
                rows
            }
            Err(e) => {
                for id in &wanted {
                    bound.stamps.remove(id);
                }
                return Err(e);
            }
        };
        for row in rows {
            if registry.admit(&row, now) {
                bound.loaded += 1;
                bound.bytes += identity_bytes(&row.event_id);
                bound
                    .queue
                    .push_back((row.event_id, row.fingerprint, row.first_seen));
            }
        }
        Ok(())
    }

    /// The eviction stamp to claim `event_id` with
    /// ([`crate::Registry::claim_checked`]), looking it up in memory and in
    /// the store first if this batch did not yet; `None` when identities
    /// stay in memory.
    ///
    /// # Errors
    /// The source's error: the delivery cannot be decided now.
    pub(crate) fn identity_stamp(
        &mut self,
        ctx: &Context,
        event_id: &Arc<str>,
    ) -> Result<Option<u64>, StoreError> {
        let Some(bound) = self.working.as_ref().and_then(|w| w.identities.as_ref()) else {
            return Ok(None);
        };
        if let Some(&stamp) = bound.stamps.get(event_id) {
            return Ok(Some(stamp));
        }
        self.prefetch_identities(ctx, [event_id])?;
        Ok(self
            .working
            .as_ref()
            .and_then(|w| w.identities.as_ref())
            .and_then(|b| b.stamps.get(event_id).copied()))
    }

    /// Forgets the look-up of `event_id` (its claim answered
    /// [`crate::Claim::Evicted`]): the next one reads the store again.
    pub(crate) fn forget_identity(&mut self, event_id: &str) {
        if let Some(b) = self.working.as_mut().and_then(|w| w.identities.as_mut()) {
            b.stamps.remove(event_id);
        }
    }

    /// Queues first records that are as the store holds them (committed,
    /// or read back after a conflict) for eviction, oldest first. A no-op
    /// unless identities are bounded.
    pub(crate) fn queue_identities(
        &mut self,
        records: impl IntoIterator<Item = (Arc<str>, u128, SystemTime)>,
    ) {
        if let Some(b) = self.working.as_mut().and_then(|w| w.identities.as_mut()) {
            for record in records {
                b.bytes += identity_bytes(&record.0);
                b.queue.push_back(record);
            }
        }
    }

    /// Evicts the oldest committed first records of this shard's queue
    /// beyond its bound; returns how many left the registry.
    fn evict_identities(&mut self, ctx: &Context) -> usize {
        let Some(b) = self.working.as_mut().and_then(|w| w.identities.as_mut()) else {
            return 0;
        };
        let mut evicted = 0;
        let now = ctx.clock().now();
        let max_bytes = MemoryBudget::share(ctx.config().memory.identities, ctx.config().shards);
        while b.queue.len() > b.capacity || (b.bytes > max_bytes && b.queue.len() > 1) {
            let Some((id, fingerprint, first_seen)) = b.queue.pop_front() else {
                break;
            };
            b.bytes -= identity_bytes(&id);
            if ctx.registry().evict(&id, fingerprint, first_seen, now) {
                evicted += 1;
            }
        }
        b.evicted += evicted as u64;
        evicted
    }

    /// The working set's bound and counts; `None` when every object stays
    /// in memory (no [`Shard::bound_objects`]).
    pub fn working_set(&self) -> Option<WorkingSetStats> {
        self.working.as_ref().map(|w| WorkingSetStats {
            capacity: w.capacity,
            resident: self.objects.len(),
            loaded: w.loaded,
            evicted: w.evicted,
        })
    }

    /// What this shard keeps in memory now, in bytes. `budget` and
    /// `queued` belong to the receiver and are left at their defaults
    /// here; `identities` is the identity cache's when identities are
    /// bounded ([`Shard::bound_identities`]) and 0 otherwise (the registry
    /// is shared: [`crate::Registry::len`] counts it).
    pub fn memory_use(&self) -> MemoryUse {
        MemoryUse {
            budget: crate::MemoryBudget::default(),
            objects: self.objects.state_bytes(),
            identities: self
                .working
                .as_ref()
                .and_then(|w| w.identities.as_ref())
                .map_or(0, |b| b.bytes),
            waiting: self.waiting_bytes(),
            trail: self.audit.bytes() + self.replacements.bytes(),
            queued: 0,
        }
    }

    /// Whether some objects of this shard may be only in the store.
    pub fn bounded(&self) -> bool {
        self.working.is_some()
    }

    /// Reads from the store, in one read, those of `ids` that are neither
    /// in memory nor known to be absent. A no-op for a shard that keeps
    /// every object.
    ///
    /// # Errors
    /// The source's error; nothing was read then (each step that needs one
    /// of these objects tries again, and answers `retry` if it fails).
    pub fn prefetch<'a>(
        &mut self,
        ctx: &Context,
        ids: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), StoreError> {
        let Some(working) = self.working.as_ref() else {
            return Ok(());
        };
        let mut wanted: Vec<Arc<str>> = Vec::new();
        let mut seen: HashSet<&str, ahash::RandomState> = HashSet::default();
        for id in ids {
            if !self.objects.contains_key(id)
                && !self.parked.contains_key(id)
                && !working.absent.contains(id)
                && seen.insert(id)
            {
                wanted.push(Arc::from(id));
            }
        }
        if wanted.is_empty() {
            return Ok(());
        }
        self.read_objects(ctx, wanted)
    }

    /// Makes sure `id` is in memory if the store holds it: what every step
    /// naming an object calls first.
    ///
    /// # Errors
    /// The source's error: the step cannot be decided now.
    pub(crate) fn fault_in(&mut self, ctx: &Context, id: &Arc<str>) -> Result<(), StoreError> {
        // Every step of a bounded shard comes here: the common case (in
        // memory, or known absent) is three lookups, nothing allocated.
        match self.working.as_ref() {
            Some(w)
                if !self.objects.contains_key(id)
                    && !self.parked.contains_key(id)
                    && !w.absent.contains(id) =>
            {
                self.read_objects(ctx, vec![id.clone()])
            }
            _ => Ok(()),
        }
    }

    /// Reads `wanted` (none of them in memory) and keeps what the store has.
    fn read_objects(&mut self, ctx: &Context, wanted: Vec<Arc<str>>) -> Result<(), StoreError> {
        let Some(working) = self.working.as_mut() else {
            return Ok(());
        };
        let rows = working.source.objects(&wanted)?;
        let max_depth = ctx.config().limits.max_depth;
        let mut found: HashSet<Arc<str>, ahash::RandomState> = HashSet::default();
        for row in rows {
            let (state, state_digest) = StateJson::parse(&row.state, max_depth).map_err(|e| {
                StoreError::Failed(format!("stored state of {}: {e}", row.object_id))
            })?;
            found.insert(row.object_id.clone());
            working.loaded += 1;
            self.objects.insert(
                row.object_id,
                ObjectActor {
                    version: row.version,
                    state,
                    state_digest,
                    paused: row.paused,
                    held: super::objects::HeldQueue::default(),
                    used: 0,
                },
            );
        }
        for id in wanted {
            if !found.contains(&id) {
                working.absent.insert(id);
            }
        }
        Ok(())
    }

    /// Ends a batch of steps: objects found absent are read again next time
    /// (another writer may create them).
    pub fn forget_absent(&mut self) {
        if let Some(w) = self.working.as_mut() {
            w.absent.clear();
            if let Some(b) = w.identities.as_mut() {
                b.stamps.clear();
            }
        }
    }

    /// Marks `id` as just used (most recently), if it is in memory.
    pub(crate) fn touch(&mut self, id: &Arc<str>) {
        let Some(working) = self.working.as_mut() else {
            return;
        };
        let stamp = working.clock + 1;
        if self.objects.with(id, |o| o.used = stamp).is_none() {
            return;
        }
        working.clock = stamp;
        working.order.push_back((id.clone(), working.clock));
        if working.order.len() > 2 * self.objects.len() + 1024 {
            // Mostly stale entries: keep one per object, oldest use first.
            let mut live: Vec<(Arc<str>, u64)> = self
                .objects
                .iter()
                .filter(|(_, o)| o.used != 0)
                .map(|(id, o)| (id.clone(), o.used))
                .collect();
            live.sort_unstable_by_key(|(_, used)| *used);
            working.order = live.into();
        }
    }

    /// After a group's commit: evicts the least recently used objects until
    /// at most the bound are left, skipping every object that must stay
    /// (a write not committed yet, paused, holding events), and the oldest
    /// committed first records beyond the identity bound. Returns how many
    /// objects were evicted.
    pub fn evict(&mut self, ctx: &Context) -> usize {
        self.evict_identities(ctx);
        let Some(working) = self.working.as_mut() else {
            return 0;
        };
        let max_bytes = ctx.objects_share();
        let within = |objects: &super::objects::Objects| {
            objects.len() <= working.capacity && objects.state_bytes() <= max_bytes
        };
        if within(&self.objects) {
            return 0;
        }
        let mut uncommitted: HashSet<&Arc<str>, ahash::RandomState> = self
            .journal
            .as_ref()
            .map(|j| j.objects.iter().collect())
            .unwrap_or_default();
        if self.controls.evict_uncommitted.is_on() {
            uncommitted.clear();
        }
        let mut evicted = 0;
        // Each entry is looked at once at most: a pinned object goes back to
        // the end of the queue.
        for _ in 0..working.order.len() {
            if within(&self.objects) {
                break;
            }
            let Some((id, stamp)) = working.order.pop_front() else {
                break;
            };
            let Some(object) = self.objects.get(&id) else {
                continue;
            };
            if object.used != stamp {
                continue;
            }
            if object.paused || !object.held.is_empty() || uncommitted.contains(&id) {
                working.order.push_back((id, stamp));
                continue;
            }
            self.objects.remove(&id);
            evicted += 1;
        }
        working.evicted += evicted as u64;
        evicted
    }
}

/// What a first record of the identity cache keeps in memory: its id,
/// its record in the registry and its place in the queue.
fn identity_bytes(event_id: &str) -> usize {
    event_id.len() + IDENTITY_OVERHEAD
}

#[cfg(test)]
mod tests;
