//! A shard's bounded working set (docs/CONTRACT.md §9): with a durable
//! store the store is the truth for objects, and memory holds at most a
//! configured number of them. The shard does no IO: before a batch, the
//! driver asks it what the batch needs from the store ([`Shard::plan_fetch`]),
//! reads that off the step (one [`Fetch`], run by the caller on its own
//! connection, [`Fetch::read`]) and hands the rows back ([`Shard::fetched`]).
//! A step that still misses something (an identity evicted between its
//! look-up and its claim, the first record's object of a variant) stops
//! before it changes anything and names the read it needs, which the driver
//! runs the same way before it decides that step again (raft-rs's
//! `LogTemporarilyUnavailable` and `on_entries_fetched` are the model).
//! Once a group's writes are committed, the least recently used objects
//! beyond the bound are evicted ([`Shard::evict`]).
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
use super::fetch::{
    Fetch, Fetched, IdentityBound, IdentityCacheStats, Missing, WorkingSet, WorkingSetStats,
    MAX_IDENTITY_REREADS,
};
use super::objects::HeldQueue;
use super::{Context, ObjectActor, Shard};
use crate::decision::reevaluable;
use crate::envelope::Parsed;
use crate::envelope::StateJson;
use crate::store::StoreError;
use crate::write::{HeldBody, HeldKey};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::SystemTime;

impl Shard {
    /// Bounds this shard's objects to `capacity` (at least 1) once its
    /// groups are committed; the others stay in the store, which the
    /// shard's driver reads when the shard asks ([`Shard::plan_fetch`],
    /// [`Shard::fetched`]). Call once, before the first step, with a store
    /// that holds every object this shard owns (its rows, not only those
    /// in memory).
    pub fn bound_objects(&mut self, capacity: usize) {
        self.working = Some(WorkingSet {
            capacity: capacity.max(1),
            clock: 0,
            order: VecDeque::new(),
            absent: HashSet::default(),
            unread: HashMap::default(),
            malformed_unread: None,
            gone: HashSet::default(),
            loaded: 0,
            evicted: 0,
            identities: None,
        });
    }

    /// Bounds this shard's share of the registry to `capacity` committed
    /// first records (at least 1); the others are read back from the store
    /// (through the driver, as objects are: [`Shard::bound_objects`] must
    /// be called first) when a delivery names them. Call once, before the first step, with
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
            unread: HashMap::default(),
            rereads: HashMap::default(),
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

    /// What the steps of a batch naming `object_ids` and `event_ids` need
    /// from the store before they are decided: the objects neither in
    /// memory nor known to be absent, and the receipts of the identities
    /// this batch did not look up yet, the registry holds no live record of
    /// and the filter of stored identities does not rule out
    /// ([`crate::Registry::may_be_stored`]). Every identity looked up gets
    /// its eviction stamp now, before the read (an eviction after it moves
    /// it, [`crate::Registry::claim_checked`]). `None` when nothing is
    /// missing, and always for a shard that keeps everything in memory.
    ///
    /// The caller reads the [`Fetch`] (off its async worker, on the
    /// shard's own connection: [`Fetch::read`]) and hands the result to
    /// [`Shard::fetched`] before it runs the steps. A batch read that
    /// fails marks nothing: each step that needs it asks again.
    pub fn plan_fetch<'a>(
        &mut self,
        ctx: &Context,
        object_ids: impl IntoIterator<Item = &'a str>,
        event_ids: impl IntoIterator<Item = &'a Arc<str>>,
    ) -> Option<Fetch> {
        let working = self.working.as_ref()?;
        let mut objects: Vec<Arc<str>> = Vec::new();
        let mut seen: HashSet<&str, ahash::RandomState> = HashSet::default();
        for id in object_ids {
            if !self.resident(working, id) && !working.unread.contains_key(id) && seen.insert(id) {
                objects.push(Arc::from(id));
            }
        }
        let mut receipts = Vec::new();
        for id in event_ids {
            if let Some(Looked::Read) = self.look_up_identity(ctx, id) {
                receipts.push(id.clone());
            }
        }
        Fetch::new(ctx, objects, receipts, false)
    }

    /// Whether `id` needs no read: in memory, parked (unknown to the
    /// store's objects) or found absent in this batch.
    fn resident(&self, working: &WorkingSet, id: &str) -> bool {
        self.objects.contains_key(id) || self.parked.contains_key(id) || working.absent.contains(id)
    }

    /// Takes the stamp of `event_id` if this batch has none yet, and says
    /// whether its receipt must be read; `None` when identities stay in
    /// memory, or it was looked up already.
    fn look_up_identity(&mut self, ctx: &Context, event_id: &Arc<str>) -> Option<Looked> {
        let bound = self.working.as_mut()?.identities.as_mut()?;
        if bound.stamps.contains_key(event_id) || bound.unread.contains_key(event_id) {
            return None;
        }
        let registry = ctx.registry();
        let now = ctx.clock().now();
        // The stamp first: an eviction after it and before the claim moves
        // it, whether it came before or after this look.
        bound
            .stamps
            .insert(event_id.clone(), registry.stamp(event_id));
        if registry.is_live(event_id, now) {
            return Some(Looked::InMemory);
        }
        if registry.may_be_stored(event_id, now) {
            return Some(Looked::Read);
        }
        bound.spared += 1;
        Some(Looked::InMemory)
    }

    /// Takes what the store answered to `fetch` (made by this shard): the
    /// objects read are kept, those it does not hold are known absent until
    /// the batch ends ([`Shard::forget_absent`]), the receipts are put back
    /// in the registry and this shard's identity cache. A failed read of a
    /// step's own fetch is kept for that step, which answers `retry` with
    /// it (docs/CONTRACT.md §3: the decision could not be recorded); a
    /// failed batch read is only forgotten (each step asks again). A stored
    /// state that is not valid JSON counts as a failed read of its object.
    pub fn fetched(&mut self, ctx: &Context, fetch: &Fetch, result: Result<Fetched, StoreError>) {
        if self.working.is_none() {
            return;
        }
        if !fetch.held.is_empty() {
            let bodies = match &result {
                Ok(rows) => Ok(&rows.held[..]),
                Err(e) => Err(e.clone()),
            };
            self.take_bodies(ctx, fetch, bodies);
        }
        let Some(working) = self.working.as_mut() else {
            return;
        };
        let rows = match result {
            Ok(rows) => rows,
            Err(e) => {
                // Nothing was read: the identities are looked up again, and
                // a step's own read is that step's answer.
                if let Some(bound) = working.identities.as_mut() {
                    for id in &fetch.receipts {
                        bound.stamps.remove(id);
                        if fetch.step {
                            bound.unread.insert(id.clone(), e.clone());
                        }
                    }
                }
                if fetch.step {
                    for id in &fetch.objects {
                        working.unread.insert(id.clone(), e.clone());
                    }
                }
                return;
            }
        };
        let max_depth = ctx.config().limits.max_depth;
        let mut found: HashSet<Arc<str>, ahash::RandomState> = HashSet::default();
        for row in rows.objects {
            found.insert(row.object_id.clone());
            let (state, state_digest) = match StateJson::parse(&row.state, max_depth) {
                Ok(parsed) => parsed,
                Err(e) => {
                    let why = format!("stored state of {}: {e}", row.object_id);
                    working
                        .unread
                        .insert(row.object_id, StoreError::Failed(why));
                    continue;
                }
            };
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
        for id in &fetch.objects {
            if !found.contains(id) {
                working.absent.insert(id.clone());
            }
        }
        let Some(bound) = working.identities.as_mut() else {
            return;
        };
        if fetch.receipts.is_empty() {
            return;
        }
        bound.reads += 1;
        let registry = ctx.registry();
        let now = ctx.clock().now();
        for row in rows.receipts {
            if registry.admit(&row, now) {
                bound.loaded += 1;
                bound.bytes += identity_bytes(&row.event_id);
                bound
                    .queue
                    .push_back((row.event_id, row.fingerprint, row.first_seen));
            }
        }
    }

    /// The eviction stamp to claim `event_id` with
    /// ([`crate::Registry::claim_checked`]), looking it up in memory first
    /// if this batch did not yet; `Ok(None)` when identities stay in
    /// memory.
    ///
    /// # Errors
    /// [`Missing::Fetch`] when its receipt must be read from the store
    /// first; [`Missing::Failed`] when that read failed, or the claim was
    /// told its stripe was evicted more than `MAX_IDENTITY_REREADS` times:
    /// the delivery cannot be decided now.
    pub(crate) fn identity_stamp(
        &mut self,
        ctx: &Context,
        event_id: &Arc<str>,
    ) -> Result<Option<u64>, Missing> {
        if let Some(Looked::Read) = self.look_up_identity(ctx, event_id) {
            let fetch = Fetch::new(ctx, Vec::new(), vec![event_id.clone()], true);
            return Err(Missing::Fetch(fetch.expect("one receipt to read")));
        }
        let Some(bound) = self.working.as_ref().and_then(|w| w.identities.as_ref()) else {
            return Ok(None);
        };
        if let Some(e) = bound.unread.get(event_id) {
            return Err(Missing::Failed(e.clone()));
        }
        let rereads = bound.rereads.get(event_id).copied().unwrap_or(0);
        if rereads > MAX_IDENTITY_REREADS {
            return Err(Missing::Failed(StoreError::Failed(format!(
                "event identity {event_id} left memory {rereads} times while it was read back"
            ))));
        }
        Ok(bound.stamps.get(event_id).copied())
    }

    /// Forgets the look-up of `event_id` (its claim answered
    /// [`crate::Claim::Evicted`]): the next one reads the store again.
    pub(crate) fn forget_identity(&mut self, event_id: &Arc<str>) {
        if let Some(b) = self.working.as_mut().and_then(|w| w.identities.as_mut()) {
            b.stamps.remove(event_id);
            *b.rereads.entry(event_id.clone()).or_default() += 1;
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

    /// What this shard keeps in memory now, in bytes. `budget`, `queued`,
    /// `relay`, `authority` and `store` belong to the receiver and are left
    /// at their defaults here; `identities` is the identity cache's when identities are
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
            relay: 0,
            authority: 0,
            store: 0,
        }
    }

    /// Whether some objects of this shard may be only in the store.
    pub fn bounded(&self) -> bool {
        self.working.is_some()
    }

    /// Makes sure `id` needs no read before a step names it: in memory,
    /// parked, or known absent. What every step naming an object calls
    /// first; the common case is four lookups, nothing allocated.
    ///
    /// # Errors
    /// [`Missing::Fetch`] when the object must be read from the store
    /// first; [`Missing::Failed`] when a read for a step naming it failed
    /// in this batch ([`Shard::mark_unread`]): the step answers with it.
    pub(crate) fn fault_in(&mut self, ctx: &Context, id: &Arc<str>) -> Result<(), Missing> {
        let Some(working) = self.working.as_ref() else {
            return Ok(());
        };
        if let Some(e) = working.unread.get(id) {
            return Err(Missing::Failed(e.clone()));
        }
        if self.resident(working, id) {
            return Ok(());
        }
        let fetch = Fetch::new(ctx, vec![id.clone()], Vec::new(), true);
        Err(Missing::Fetch(fetch.expect("one object to read")))
    }

    /// A step naming `id` was answered `error` because a read it needed
    /// failed: until the batch ends every later step naming `id` answers
    /// the same (per object, nothing is decided ahead of a delivery that
    /// must be sent again). A no-op for a shard that keeps every object.
    pub(crate) fn mark_unread(&mut self, id: &Arc<str>, error: &StoreError) {
        if let Some(w) = self.working.as_mut() {
            w.unread.insert(id.clone(), error.clone());
        }
    }

    /// Ends a batch of steps: objects found absent are read again next time
    /// (another writer may create them), and identities looked up again.
    pub fn forget_absent(&mut self) {
        if let Some(w) = self.working.as_mut() {
            w.absent.clear();
            w.unread.clear();
            w.malformed_unread = None;
            if let Some(b) = w.identities.as_mut() {
                b.stamps.clear();
                b.unread.clear();
                b.rereads.clear();
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

impl Shard {
    /// Whether this shard's waiting bodies stay in the store
    /// (docs/CONTRACT.md §9): it reads from a store ([`Shard::bound_objects`])
    /// and journals its steps for it. Memory then keeps a held, parked or
    /// malformed body only until its hold commits, and reads it back when
    /// the event is decided again; the waiting part of the budget refuses
    /// nothing.
    pub fn bodies_in_store(&self) -> bool {
        self.working.is_some() && self.journaled()
    }

    /// Notes that the hold in row `key`, waiting under `object_id`, keeps
    /// its body until the group holding this step commits
    /// ([`Shard::committed`]); a no-op unless bodies stay in the store.
    pub(crate) fn note_body(&mut self, object_id: &Arc<str>, key: HeldKey) {
        if self.bodies_in_store() {
            if let Some(journal) = self.journal.as_mut() {
                journal.bodies.push((object_id.clone(), key));
            }
        }
    }

    /// Lets the body of the committed hold in row `key`, waiting under
    /// `object_id` (held or parked), leave memory.
    pub(crate) fn drop_body(&mut self, object_id: &Arc<str>, key: HeldKey) {
        let strip = |queue: &mut HeldQueue| {
            queue.update(|events| {
                if let Some(h) = events.iter_mut().rev().find(|h| h.key == key) {
                    h.event = None;
                }
            })
        };
        if self
            .objects
            .with(object_id, |o| strip(&mut o.held))
            .is_some()
        {
            return;
        }
        if let Some(queue) = self.parked.get_mut(object_id) {
            self.parked_bytes -= queue.bytes();
            strip(queue);
            self.parked_bytes += queue.bytes();
        }
    }

    /// Lets every body waiting under `object_id` leave memory: after a
    /// rollback, when everything left in memory is committed.
    pub(crate) fn drop_bodies(&mut self, object_id: &Arc<str>) {
        let strip = |queue: &mut HeldQueue| {
            queue.update(|events| events.iter_mut().for_each(|h| h.event = None))
        };
        self.objects.with(object_id, |o| strip(&mut o.held));
        if let Some(queue) = self.parked.get_mut(object_id) {
            self.parked_bytes -= queue.bytes();
            strip(queue);
            self.parked_bytes += queue.bytes();
        }
    }

    /// Makes sure the events waiting under `id` that a reconciliation
    /// decides again have their bodies in memory (docs/CONTRACT.md §9): the
    /// held events of a known object, or the parked events of an unknown
    /// one, whose hold can be decided again ([`reevaluable`]); the others
    /// are superseded by the authority without their bodies. A no-op when
    /// bodies stay in memory.
    ///
    /// # Errors
    /// [`Missing::Fetch`] with the rows whose bodies the driver reads
    /// first; nothing changed.
    pub(crate) fn bodies_to_read(&self, ctx: &Context, id: &Arc<str>) -> Result<(), Missing> {
        if self.working.is_none() {
            return Ok(());
        }
        let queue = match self.objects.get(id) {
            Some(o) => &o.held,
            None => match self.parked.get(id) {
                Some(q) => q,
                None => return Ok(()),
            },
        };
        let gone = self.working.as_ref().map(|w| &w.gone);
        let keys: Vec<HeldKey> = queue
            .iter()
            .filter(|h| h.event.is_none() && reevaluable(h.held_as))
            .filter(|h| !gone.is_some_and(|g| g.contains(&h.key)))
            .map(|h| h.key)
            .collect();
        if keys.is_empty() {
            return Ok(());
        }
        Err(Missing::Fetch(Fetch::bodies(ctx, Some(id.clone()), keys)))
    }

    /// Whether the held row `key` was found no longer waiting in the store
    /// ([`Shard::bodies_to_read`]'s read): forgets it; the caller drops the
    /// event from memory without deciding it again.
    pub(crate) fn settled_elsewhere(&mut self, key: &HeldKey) -> bool {
        self.working.as_mut().is_some_and(|w| w.gone.remove(key))
    }

    /// Makes sure every malformed input has its digest, so that a
    /// malformed delivery is compared with all of them: those resumed
    /// without their bodies are read first.
    ///
    /// # Errors
    /// [`Missing::Fetch`] with the malformed rows to read;
    /// [`Missing::Failed`] when that read failed in this batch.
    pub(crate) fn digests_in(&self, ctx: &Context) -> Result<(), Missing> {
        if self.undigested == 0 {
            return Ok(());
        }
        if let Some(e) = self
            .working
            .as_ref()
            .and_then(|w| w.malformed_unread.as_ref())
        {
            return Err(Missing::Failed(e.clone()));
        }
        let keys = self
            .malformed
            .iter()
            .filter(|m| m.digest.is_none())
            .map(|m| m.key)
            .collect();
        Err(Missing::Fetch(Fetch::bodies(ctx, None, keys)))
    }

    /// Takes the bodies read for `fetch` (made by [`Shard::bodies_to_read`]
    /// or [`Shard::digests_in`]). An object's events get their envelopes
    /// back until the group that decides them again commits; a malformed
    /// row gets its digest, and its body leaves memory at once. A failed
    /// read, a row the store no longer holds, or a body that no longer
    /// parses as an event fails the step that asked: it answers with the
    /// error, nothing decided.
    fn take_bodies(
        &mut self,
        ctx: &Context,
        fetch: &Fetch,
        result: Result<&[HeldBody], StoreError>,
    ) {
        let error = match result {
            Err(e) => Some(e),
            Ok(rows) => {
                let bodies: HashMap<HeldKey, &Arc<[u8]>, ahash::RandomState> =
                    rows.iter().map(|(k, b)| (*k, b)).collect();
                match &fetch.held_of {
                    Some(id) => self.fill_bodies(ctx, id, &fetch.held, &bodies),
                    None => self.fill_digests(&fetch.held, &bodies),
                }
            }
        };
        let Some(e) = error else {
            return;
        };
        if !fetch.step {
            return;
        }
        if let Some(w) = self.working.as_mut() {
            match &fetch.held_of {
                Some(id) => {
                    w.unread.insert(id.clone(), e);
                }
                None => w.malformed_unread = Some(e),
            }
        }
    }

    /// Puts the envelopes of `keys`, read as `bodies`, back into the events
    /// waiting under `id`; the error of the first that cannot be. A key the
    /// store does not give back no longer waits there (another process
    /// decided it again, and maybe purged it since): it is marked gone, not
    /// an error, so that this shard's reconciliation of the object goes on
    /// without it (it used to fail until the process restarted).
    fn fill_bodies(
        &mut self,
        ctx: &Context,
        id: &Arc<str>,
        keys: &[HeldKey],
        bodies: &HashMap<HeldKey, &Arc<[u8]>, ahash::RandomState>,
    ) -> Option<StoreError> {
        let mut error = None;
        let mut filled = Vec::new();
        let mut gone = Vec::new();
        let wanted: HashSet<HeldKey, ahash::RandomState> = keys.iter().copied().collect();
        let mut fill = |queue: &mut HeldQueue| {
            queue.update(|events| {
                for h in events.iter_mut().filter(|h| h.event.is_none()) {
                    if !wanted.contains(&h.key) {
                        continue;
                    }
                    let Some(body) = bodies.get(&h.key) else {
                        tracing::info!(
                            event_id = %h.event_id,
                            object_id = %id,
                            "held event no longer waiting in the store (decided by another process sharing it): dropped from memory"
                        );
                        gone.push(h.key);
                        continue;
                    };
                    match ctx.parser().parse(body).map(|d| d.0) {
                        Ok(Parsed::Event(event)) => {
                            h.event = Some(Box::new(event));
                            filled.push(h.key);
                        }
                        Ok(Parsed::Malformed(m)) => {
                            error.get_or_insert_with(|| {
                                StoreError::Failed(format!(
                                    "stored body of held event {} of {id}: {}",
                                    h.event_id, m.error
                                ))
                            });
                        }
                        Err(reject) => {
                            error.get_or_insert_with(|| {
                                StoreError::Failed(format!(
                                    "stored body of held event {} of {id} now refused: {reject}",
                                    h.event_id
                                ))
                            });
                        }
                    }
                }
            })
        };
        if self.objects.with(id, |o| fill(&mut o.held)).is_none() {
            if let Some(queue) = self.parked.get_mut(id) {
                self.parked_bytes -= queue.bytes();
                fill(queue);
                self.parked_bytes += queue.bytes();
            }
        }
        if let Some(w) = self.working.as_mut() {
            w.gone.extend(gone);
        }
        // The bodies leave memory again with the next group's commit,
        // whether the reconciliation decides them or not.
        if let Some(journal) = self.journal.as_mut() {
            journal
                .bodies
                .extend(filled.into_iter().map(|k| (id.clone(), k)));
        }
        error
    }

    /// Gives the malformed rows of `keys` the digests of their `bodies`;
    /// the error of the first the store no longer holds.
    fn fill_digests(
        &mut self,
        keys: &[HeldKey],
        bodies: &HashMap<HeldKey, &Arc<[u8]>, ahash::RandomState>,
    ) -> Option<StoreError> {
        let mut error = None;
        let wanted: HashSet<HeldKey, ahash::RandomState> = keys.iter().copied().collect();
        for m in self.malformed.iter_mut().filter(|m| m.digest.is_none()) {
            if !wanted.contains(&m.key) {
                continue;
            }
            match bodies.get(&m.key) {
                Some(body) => {
                    let digest = xxhash_rust::xxh3::xxh3_128(body);
                    m.digest = Some(digest);
                    *self.malformed_digests.entry(digest).or_default() += 1;
                    self.undigested -= 1;
                }
                None => {
                    error.get_or_insert_with(|| {
                        StoreError::Failed(format!(
                            "malformed row {}/{} is not in the store",
                            m.key.origin, m.key.seq
                        ))
                    });
                }
            }
        }
        error
    }
}

/// How an identity was looked up ([`Shard::plan_fetch`]).
enum Looked {
    /// In memory, or certainly never stored: no read.
    InMemory,
    /// Its receipt may be in the store: read it.
    Read,
}

/// What a first record of the identity cache keeps in memory: its id,
/// its record in the registry and its place in the queue.
fn identity_bytes(event_id: &str) -> usize {
    event_id.len() + IDENTITY_OVERHEAD
}

#[cfg(test)]
mod tests;
