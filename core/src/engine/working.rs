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
//! Recency is a stamp per object plus a queue of `(object, stamp)` in the
//! order they were used; an entry whose stamp is no longer the object's
//! is stale and skipped. The queue is rebuilt when stale entries make up
//! most of it, so it stays within a small multiple of the objects held.

use super::{Context, ObjectActor, Shard};
use crate::envelope::StateJson;
use crate::store::{ObjectSource, StoreError};
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

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
    /// Test-only (loom): evicts objects whose writes are not committed yet,
    /// the must-fail control of the eviction model.
    #[cfg(snapshot_receiver_loom)]
    evict_uncommitted: bool,
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
            #[cfg(snapshot_receiver_loom)]
            evict_uncommitted: false,
        });
    }

    /// Test-only (loom models, `--cfg snapshot_receiver_loom`): from now on
    /// [`Shard::evict`] also lets go of objects with writes not committed
    /// yet (a must-fail control). Never compiled into a shipped build.
    #[cfg(snapshot_receiver_loom)]
    pub fn evict_before_commit(&mut self) {
        if let Some(w) = self.working.as_mut() {
            w.evict_uncommitted = true;
        }
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
                    held: Vec::new(),
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
        }
    }

    /// Marks `id` as just used (most recently), if it is in memory.
    pub(crate) fn touch(&mut self, id: &Arc<str>) {
        let Some(working) = self.working.as_mut() else {
            return;
        };
        let Some(object) = self.objects.get_mut(id) else {
            return;
        };
        working.clock += 1;
        object.used = working.clock;
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
    /// (a write not committed yet, paused, holding events). Returns how many
    /// were evicted.
    pub fn evict(&mut self) -> usize {
        let Some(working) = self.working.as_mut() else {
            return 0;
        };
        if self.objects.len() <= working.capacity {
            return 0;
        }
        #[allow(unused_mut)]
        let mut uncommitted: HashSet<&Arc<str>, ahash::RandomState> = self
            .journal
            .as_ref()
            .map(|j| j.objects.iter().collect())
            .unwrap_or_default();
        #[cfg(snapshot_receiver_loom)]
        if working.evict_uncommitted {
            uncommitted.clear();
        }
        let mut evicted = 0;
        // Each entry is looked at once at most: a pinned object goes back to
        // the end of the queue.
        for _ in 0..working.order.len() {
            if self.objects.len() <= working.capacity {
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
