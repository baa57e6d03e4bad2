//! The simulated store: the PostgreSQL semantics the receiver relies on
//! (src/store/postgres/write.rs, the row-by-row path of one transaction),
//! behind the core's [`Store`] trait, in memory.
//!
//! - receipts are unique on `event_id` (a stored receipt that expired by the
//!   new row's retention cut-off is replaced, and the variants recorded
//!   before the new receipt are deleted), variants on (`event_id`,
//!   fingerprint): a row that exists is a [`StoreError::Conflict`];
//! - an object write is conditional on the version and pause flag its
//!   decision read ([`Expect`]); a condition that no longer holds is a
//!   conflict, as `UPDATE ... WHERE version = $5 AND paused = $6` touching
//!   no row is;
//! - a commit is all or nothing: on any error every write of the group is
//!   undone (an undo log, as a transaction's rollback);
//! - the outbox (docs/CONTRACT.md §10) as `src/store/outbox.rs` keeps it:
//!   a committed transaction's history rows take their positions from one
//!   counter as its last statement (PostgreSQL's `outbox.last`), so
//!   positions are 1, 2, 3, ... without gaps in commit order; a relay's row
//!   (cursor, generation, lease) and its parked effects are written in one
//!   transaction, conditioned on the generation and owner the relay read
//!   ([`OutboxStore`]).
//!
//! What the server adds around a commit (a serialization failure, a lost
//! connection after the commit, a full disk, a stall) is injected by the
//! world (`world.rs`), not here.

use snapshot_receiver_core::engine::Effect;
use snapshot_receiver_core::relay::{ParkedEffect, ParkedStatus, RelayRow, RelaySave};
use snapshot_receiver_core::store::{ObjectSource, OutboxStore, Store, StoreError};
use snapshot_receiver_core::write::{
    AuditRow, EffectRow, Expect, HeldBody, HeldKey, HeldRow, HeldStatus, Loaded, ObjectRow,
    ReceiptRow, VariantRow, Write,
};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, SystemTime};

/// One row's before-image, to undo a failed transaction.
enum Undo {
    Receipt(Arc<str>, Option<ReceiptRow>),
    Variant((Arc<str>, u128), Option<VariantRow>),
    Object(Arc<str>, Option<ObjectRow>),
    Held((u64, u64), Option<HeldRow>),
}

/// The tables, in memory, ordered (no hash iteration: a run must replay bit
/// for bit).
#[derive(Default)]
pub struct SimStore {
    receipts: BTreeMap<Arc<str>, ReceiptRow>,
    variants: BTreeMap<(Arc<str>, u128), VariantRow>,
    objects: BTreeMap<Arc<str>, ObjectRow>,
    /// Held rows by (origin, seq).
    held: BTreeMap<(u64, u64), HeldRow>,
    /// Held keys in arrival (insert) order.
    held_order: Vec<HeldKey>,
    audit: Vec<AuditRow>,
    /// Every state replacement, in commit order.
    replacements: Vec<EffectRow>,
    /// The outbox position of each of `replacements` (the same index),
    /// given as its transaction commits.
    positions: Vec<u64>,
    /// The last outbox position given (the `outbox` row's `last`).
    last: u64,
    /// The relays' rows, by name.
    relays: BTreeMap<String, RelayRow>,
    /// The relays' parked effects, by (relay, position): the row without
    /// its effect, which is read from the history row at that position.
    parked: BTreeMap<(String, u64), Parked>,
    /// Transactions committed.
    pub commits: u64,
    /// When each first record (a receipt, or a variant: event id and
    /// fingerprint) was committed: the commit's number and the write's
    /// place in it.
    recorded_at: BTreeMap<(Arc<str>, u128), (u64, usize)>,
    /// The `pause-after-answer` control: [`Write::PauseIfStored`] is
    /// dropped from every commit, so a variant's pause of an object another
    /// shard owns waits for that shard's own group.
    pub drop_pause_if_stored: bool,
    /// The `takeover-keeps-generation` control: a relay's lease taken over
    /// by another run keeps the relay's generation.
    pub takeover_keeps_generation: bool,
    /// The `retry-keeps-attempts` control: an operator's retry of a
    /// `failed` effect keeps its attempts.
    pub retry_keeps_attempts: bool,
    /// Whether the store gives object sources (connections of their own,
    /// [`Store::object_source`]): the processes' shards are then bounded.
    /// Without, every row is loaded at start, as from a store that cannot
    /// open a second connection.
    pub sources: bool,
    /// The store's own handle, for the sources it gives.
    handle: Weak<Mutex<SimStore>>,
}

/// The store as the processes reach it: one set of tables behind a lock,
/// so that the object sources the shards read through (connections of
/// their own in the receiver) see what the commits wrote. The world runs
/// in one thread: the lock is never contended; take it for one call at a
/// time (a shard's read locks it too).
#[derive(Clone)]
pub struct Shared(Arc<Mutex<SimStore>>);

impl Shared {
    /// An empty store (the schema created).
    pub fn new() -> Self {
        Shared(Arc::new_cyclic(|handle| {
            Mutex::new(SimStore {
                handle: handle.clone(),
                ..SimStore::default()
            })
        }))
    }

    /// The tables.
    pub fn get(&self) -> MutexGuard<'_, SimStore> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Default for Shared {
    fn default() -> Self {
        Self::new()
    }
}

/// A shard's (or the identity filter's scan's) connection: what
/// `src/store/reader.rs` reads for the receiver, on the same tables.
impl ObjectSource for Shared {
    fn held_bodies(&mut self, keys: &[HeldKey]) -> Result<Vec<HeldBody>, StoreError> {
        let store = self.get();
        Ok(keys
            .iter()
            .filter_map(|k| store.held.get(&(k.origin, k.seq)))
            .map(|h| (h.key, h.body.clone()))
            .collect())
    }

    fn objects(&mut self, ids: &[Arc<str>]) -> Result<Vec<ObjectRow>, StoreError> {
        let store = self.get();
        Ok(ids
            .iter()
            .filter_map(|id| store.objects.get(id).cloned())
            .collect())
    }

    fn receipts(
        &mut self,
        event_ids: &[Arc<str>],
        since: SystemTime,
    ) -> Result<Vec<ReceiptRow>, StoreError> {
        let store = self.get();
        Ok(event_ids
            .iter()
            .filter_map(|id| store.receipts.get(id))
            .filter(|r| r.first_seen >= since)
            .cloned()
            .collect())
    }

    fn receipt_ids(
        &mut self,
        after: &str,
        since: SystemTime,
        limit: usize,
    ) -> Result<Vec<(Arc<str>, SystemTime)>, StoreError> {
        use std::ops::Bound;
        let store = self.get();
        Ok(store
            .receipts
            .range::<str, _>((Bound::Excluded(after), Bound::Unbounded))
            .map(|(_, r)| r)
            .filter(|r| r.first_seen >= since)
            .take(limit)
            .map(|r| (r.event_id.clone(), r.first_seen))
            .collect())
    }
}

/// A `relay_parked` row: what a relay parked at one position.
#[derive(Clone, Debug)]
struct Parked {
    status: ParkedStatus,
    attempts: u32,
    due: Option<SystemTime>,
    error: Option<String>,
    updated: SystemTime,
}

fn conflict(what: String) -> StoreError {
    StoreError::Conflict(what)
}

impl SimStore {
    /// What a process resumes from, in the shipped load's order
    /// (src/store/load.rs): identities, then objects, held rows and the
    /// highest sequence number. `resident`: as `load_resident`, only the
    /// objects that must stay in memory (paused, or with an event held,
    /// parked, malformed or superseded) and no receipts (the shards read
    /// them when a delivery names their identity).
    fn loaded(&self, receipts_since: SystemTime, resident: bool) -> Loaded {
        let receipts = if resident {
            Vec::new()
        } else {
            self.receipts
                .values()
                .filter(|r| r.first_seen >= receipts_since)
                .cloned()
                .collect()
        };
        let variants = self
            .variants
            .values()
            .filter(|v| v.first_seen >= receipts_since)
            .cloned()
            .collect();
        let pinned: std::collections::BTreeSet<&Arc<str>> = self
            .held
            .values()
            .filter(|h| h.status != HeldStatus::Resolved)
            .filter_map(|h| h.object_id.as_ref())
            .collect();
        let objects = self
            .objects
            .values()
            .filter(|o| !resident || o.paused || pinned.contains(&o.object_id))
            .cloned()
            .collect();
        let held = self
            .held_order
            .iter()
            .filter_map(|k| self.held.get(&(k.origin, k.seq)))
            .filter(|h| h.status != HeldStatus::Resolved)
            .map(|h| HeldRow {
                // As the shipped `load_resident`: no body, read when decided again.
                body: if resident {
                    Arc::from(&[][..])
                } else {
                    h.body.clone()
                },
                ..h.clone()
            })
            .collect();
        let max_seq = self
            .audit
            .iter()
            .map(|a| a.key.seq)
            .chain(self.held.keys().map(|k| k.1))
            .chain(self.replacements.iter().map(|r| r.key.seq))
            .max()
            .unwrap_or(0);
        Loaded {
            objects,
            held,
            receipts,
            variants,
            max_seq,
        }
    }

    /// Every state replacement, in commit order.
    pub fn replacements(&self) -> &[EffectRow] {
        &self.replacements
    }

    /// The outbox position of each of [`SimStore::replacements`] (the same
    /// index).
    pub fn positions(&self) -> &[u64] {
        &self.positions
    }

    /// The effect at outbox `position`, as a relay reads it.
    pub fn effect_at(&self, position: u64) -> Option<Effect> {
        let i = self.positions.binary_search(&position).ok()?;
        Some(Effect::from_row(position, self.replacements[i].clone()))
    }

    /// The row of relay `name`.
    pub fn relay(&self, name: &str) -> Option<&RelayRow> {
        self.relays.get(name)
    }

    /// How many effects relay `name` holds parked.
    pub fn parked_count(&self, name: &str) -> usize {
        self.parked
            .range((name.to_owned(), 0)..=(name.to_owned(), u64::MAX))
            .count()
    }

    /// The effects by decision-time numbering, as a reader by step number
    /// (`Store::replacements_since`) gets them:
    /// the history rows whose step sequence number is above `after`, in
    /// that order, each given its sequence number as its position (the
    /// `relay-reads-by-step-number` control's reading; a cursor on it
    /// passes an effect whose lower number committed after a higher one).
    pub fn effects_after_step(&self, after: u64, limit: usize) -> Vec<Effect> {
        let mut rows: Vec<&EffectRow> = self
            .replacements
            .iter()
            .filter(|r| r.key.seq > after)
            .collect();
        rows.sort_by_key(|r| r.key.seq);
        rows.into_iter()
            .take(limit)
            .map(|r| Effect::from_row(r.key.seq, r.clone()))
            .collect()
    }

    /// Raises relay `name`'s generation (an operator changed it).
    fn bump(&mut self, name: &str, now: SystemTime) {
        if let Some(r) = self.relays.get_mut(name) {
            r.generation += 1;
            r.updated = now;
        }
    }

    /// The stored receipt of `event_id`.
    pub fn receipt(&self, event_id: &str) -> Option<&ReceiptRow> {
        self.receipts.get(event_id)
    }

    /// When the first record of (`event_id`, `fingerprint`) was committed:
    /// the commit's number (1: the first) and the write's place in it.
    pub fn recorded_at(&self, event_id: &str, fingerprint: u128) -> Option<(u64, usize)> {
        self.recorded_at
            .get(&(Arc::from(event_id), fingerprint))
            .copied()
    }

    /// Every object row, by object id.
    pub fn object_rows(&self) -> impl Iterator<Item = &ObjectRow> {
        self.objects.values()
    }

    /// The rows held, parked or malformed for `object_id` that wait for
    /// reconciliation.
    pub fn waiting_for(&self, object_id: &str) -> usize {
        self.held
            .values()
            .filter(|h| h.object_id.as_deref() == Some(object_id))
            .filter(|h| crate::world::reconcile::waiting(h.status))
            .count()
    }

    /// The stored row of `object_id`.
    pub fn object(&self, object_id: &str) -> Option<&ObjectRow> {
        self.objects.get(object_id)
    }

    /// Whether a variant (`event_id`, `fingerprint`) is stored.
    pub fn has_variant(&self, event_id: &str, fingerprint: u128) -> bool {
        self.variants
            .contains_key(&(Arc::from(event_id), fingerprint))
    }

    /// One write, recording what undoes it.
    fn apply(&mut self, w: &Write, undo: &mut Vec<Undo>) -> Result<(), StoreError> {
        match w {
            Write::Receipt(r) => {
                let old = self.receipts.get(&r.event_id).cloned();
                if let Some(o) = &old {
                    let expired = r.retention_cutoff.is_some_and(|c| o.first_seen <= c);
                    if !expired {
                        return Err(conflict(format!(
                            "receipt for {} already exists",
                            r.event_id
                        )));
                    }
                }
                undo.push(Undo::Receipt(r.event_id.clone(), old));
                self.receipts.insert(r.event_id.clone(), r.clone());
                // The variants recorded before it were an expired receipt's.
                let stale: Vec<_> = self
                    .variants
                    .range((r.event_id.clone(), 0)..=(r.event_id.clone(), u128::MAX))
                    .filter(|(_, v)| v.first_seen < r.first_seen)
                    .map(|(k, _)| k.clone())
                    .collect();
                for k in stale {
                    let old = self.variants.remove(&k);
                    undo.push(Undo::Variant(k, old));
                }
            }
            Write::Variant(v) => {
                let key = (v.event_id.clone(), v.fingerprint);
                if self.variants.contains_key(&key) {
                    return Err(conflict(format!(
                        "variant {:032x} of {} already exists",
                        v.fingerprint, v.event_id
                    )));
                }
                undo.push(Undo::Variant(key.clone(), None));
                self.variants.insert(key, v.clone());
            }
            Write::Object { row, expect } => {
                let old = self.objects.get(&row.object_id).cloned();
                let ok = match (*expect, &old) {
                    (Expect::Version { version, paused }, Some(o)) if row.version > version => {
                        o.version < row.version && o.version == version && o.paused == paused
                    }
                    (Expect::Version { version, paused }, Some(o)) => {
                        o.version == version && o.paused == paused
                    }
                    (Expect::Version { .. }, None) => false,
                    (Expect::Absent, o) => o.is_none(),
                };
                if !ok {
                    return Err(conflict(format!(
                        "object {} changed since it was read",
                        row.object_id
                    )));
                }
                undo.push(Undo::Object(row.object_id.clone(), old));
                self.objects.insert(row.object_id.clone(), row.clone());
            }
            Write::Seed(row) => {
                if !self.objects.contains_key(&row.object_id) {
                    undo.push(Undo::Object(row.object_id.clone(), None));
                    self.objects.insert(row.object_id.clone(), row.clone());
                }
            }
            Write::Pause { object_id } => {
                let Some(o) = self.objects.get_mut(object_id) else {
                    return Err(conflict(format!(
                        "object {object_id} to pause is not stored"
                    )));
                };
                undo.push(Undo::Object(object_id.clone(), Some(o.clone())));
                o.paused = true;
            }
            Write::PauseIfStored { .. } if self.drop_pause_if_stored => {}
            Write::PauseIfStored {
                event_id,
                fingerprint,
                object_id,
                audit,
            } => {
                // The variant's first record must be stored before it, and
                // be the one the variant contradicts.
                let first = self.receipts.get(event_id);
                if first.is_none_or(|r| r.fingerprint != *fingerprint) {
                    return Err(conflict(format!(
                        "the first record of {event_id} is not stored yet: its variant waits for it"
                    )));
                }
                if let Some(o) = self.objects.get_mut(object_id) {
                    undo.push(Undo::Object(object_id.clone(), Some(o.clone())));
                    o.paused = true;
                    self.audit.push(audit.clone());
                }
            }
            Write::Check {
                object_id,
                version,
                paused,
            } => {
                let same = self
                    .objects
                    .get(object_id)
                    .is_some_and(|o| o.version == *version && o.paused == *paused);
                if !same {
                    return Err(conflict(format!(
                        "object {object_id} changed since it was read"
                    )));
                }
            }
            Write::Held(h) => {
                let key = (h.key.origin, h.key.seq);
                if self.held.contains_key(&key) {
                    // The primary key (origin, seq): a unique_violation.
                    return Err(conflict(format!(
                        "held row ({}, {}) exists",
                        h.key.origin, h.key.seq
                    )));
                }
                undo.push(Undo::Held(key, None));
                self.held.insert(key, h.clone());
            }
            Write::HeldStatus {
                key,
                status,
                superseded_by,
            } => {
                let key = (key.origin, key.seq);
                if let Some(h) = self.held.get_mut(&key) {
                    undo.push(Undo::Held(key, Some(h.clone())));
                    h.status = *status;
                    h.superseded_by = *superseded_by;
                }
            }
            Write::Audit(a) => self.audit.push(a.clone()),
            Write::Effect(r) => self.replacements.push(r.clone()),
        }
        Ok(())
    }

    fn undo(&mut self, undo: Vec<Undo>) {
        for u in undo.into_iter().rev() {
            match u {
                Undo::Receipt(k, old) => restore(&mut self.receipts, k, old),
                Undo::Variant(k, old) => restore(&mut self.variants, k, old),
                Undo::Object(k, old) => restore(&mut self.objects, k, old),
                Undo::Held(k, old) => restore(&mut self.held, k, old),
            }
        }
    }
}

fn restore<K: Ord, V>(map: &mut BTreeMap<K, V>, k: K, old: Option<V>) {
    match old {
        Some(v) => {
            map.insert(k, v);
        }
        None => {
            map.remove(&k);
        }
    }
}

impl Store for SimStore {
    fn commit(&mut self, writes: &[Write]) -> Result<(), StoreError> {
        let (audit, replacements, held) = (
            self.audit.len(),
            self.replacements.len(),
            self.held_order.len(),
        );
        let mut undo = Vec::new();
        for w in writes {
            if let Err(e) = self.apply(w, &mut undo) {
                self.undo(undo);
                self.audit.truncate(audit);
                self.replacements.truncate(replacements);
                self.held_order.truncate(held);
                return Err(e);
            }
            if let Write::Held(h) = w {
                self.held_order.push(h.key);
            }
        }
        self.commits += 1;
        // The transaction's last statement: its history rows take their
        // positions from the counter, in the order they were written.
        while self.positions.len() < self.replacements.len() {
            self.last += 1;
            self.positions.push(self.last);
        }
        for (k, w) in writes.iter().enumerate() {
            let key = match w {
                Write::Receipt(r) => (r.event_id.clone(), r.fingerprint),
                Write::Variant(v) => (v.event_id.clone(), v.fingerprint),
                _ => continue,
            };
            self.recorded_at.insert(key, (self.commits, k));
        }
        Ok(())
    }

    fn load(&mut self, receipts_since: SystemTime) -> Result<Loaded, StoreError> {
        Ok(self.loaded(receipts_since, false))
    }

    fn load_resident(&mut self, receipts_since: SystemTime) -> Result<Loaded, StoreError> {
        Ok(self.loaded(receipts_since, true))
    }

    fn object_source(&mut self) -> Result<Option<Box<dyn ObjectSource>>, StoreError> {
        Ok(self
            .sources
            .then(|| self.handle.upgrade())
            .flatten()
            .map(|store| Box::new(Shared(store)) as Box<dyn ObjectSource>))
    }

    fn refresh(
        &mut self,
        objects: &[Arc<str>],
        receipts: &[Arc<str>],
    ) -> Result<(Vec<ObjectRow>, Vec<ReceiptRow>), StoreError> {
        Ok((
            objects
                .iter()
                .filter_map(|o| self.objects.get(o).cloned())
                .collect(),
            receipts
                .iter()
                .filter_map(|r| self.receipts.get(r).cloned())
                .collect(),
        ))
    }

    fn refresh_variants(&mut self, event_ids: &[Arc<str>]) -> Result<Vec<VariantRow>, StoreError> {
        Ok(event_ids
            .iter()
            .flat_map(|e| {
                self.variants
                    .range((e.clone(), 0)..=(e.clone(), u128::MAX))
                    .map(|(_, v)| v.clone())
            })
            .collect())
    }

    fn purge_receipts(&mut self, before: SystemTime) -> Result<u64, StoreError> {
        let n = self.receipts.len() + self.variants.len();
        self.receipts.retain(|_, r| r.first_seen >= before);
        self.variants.retain(|_, v| v.first_seen >= before);
        Ok((n - self.receipts.len() - self.variants.len()) as u64)
    }

    fn audit(&mut self) -> Result<Vec<AuditRow>, StoreError> {
        Ok(self.audit.clone())
    }

    fn replacements_since(&mut self, after: u64) -> Result<Vec<EffectRow>, StoreError> {
        let mut rows: Vec<_> = self
            .replacements
            .iter()
            .filter(|r| r.key.seq > after)
            .cloned()
            .collect();
        rows.sort_by_key(|r| r.key.seq);
        Ok(rows)
    }
}

impl OutboxStore for SimStore {
    fn effects_after(&mut self, after: u64, limit: usize) -> Result<Vec<Effect>, StoreError> {
        let from = self.positions.partition_point(|p| *p <= after);
        Ok(self.positions[from..]
            .iter()
            .zip(&self.replacements[from..])
            .take(limit)
            .map(|(p, r)| Effect::from_row(*p, r.clone()))
            .collect())
    }

    fn effects_at(&mut self, positions: &[u64]) -> Result<Vec<Effect>, StoreError> {
        let mut sorted = positions.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        Ok(sorted
            .into_iter()
            .filter_map(|p| self.effect_at(p))
            .collect())
    }

    fn last_position(&mut self) -> Result<u64, StoreError> {
        Ok(self.last)
    }

    fn open_relay(
        &mut self,
        name: &str,
        start: u64,
        owner: Option<&str>,
        now: SystemTime,
        lease: Duration,
    ) -> Result<RelayRow, StoreError> {
        let row = self
            .relays
            .entry(name.to_owned())
            .or_insert_with(|| RelayRow::new(name, start, now));
        if let Some(owner) = owner {
            let generation = row.generation;
            let before = row.owner.clone();
            row.take_lease(owner, now, lease);
            if self.takeover_keeps_generation && before.is_some() && row.owner != before {
                row.generation = generation;
            }
        }
        Ok(row.clone())
    }

    fn relays(&mut self) -> Result<Vec<RelayRow>, StoreError> {
        Ok(self.relays.values().cloned().collect())
    }

    fn save_relay(
        &mut self,
        name: &str,
        generation: u64,
        owner: &str,
        save: &RelaySave,
        now: SystemTime,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let Some(row) = self.relays.get_mut(name) else {
            return Ok(false);
        };
        if !row.save(generation, owner, save, now, lease) {
            return Ok(false);
        }
        for p in &save.park {
            self.parked.insert(
                (name.to_owned(), p.effect.position),
                Parked {
                    status: p.status,
                    attempts: p.attempts,
                    due: p.due,
                    error: p.error.clone(),
                    updated: p.updated,
                },
            );
        }
        for position in &save.unpark {
            self.parked.remove(&(name.to_owned(), *position));
        }
        Ok(true)
    }

    fn parked(&mut self, name: &str) -> Result<Vec<ParkedEffect>, StoreError> {
        // Joined to the history row at its position (never purged here).
        Ok(self
            .parked
            .range((name.to_owned(), 0)..=(name.to_owned(), u64::MAX))
            .filter_map(|((_, position), p)| {
                Some(ParkedEffect {
                    effect: self.effect_at(*position)?.head(),
                    status: p.status,
                    attempts: p.attempts,
                    due: p.due,
                    error: p.error.clone(),
                    updated: p.updated,
                })
            })
            .collect())
    }

    fn retry_failed(
        &mut self,
        name: &str,
        position: Option<u64>,
        now: SystemTime,
    ) -> Result<u64, StoreError> {
        let mut retried = 0;
        for ((_, at), p) in self
            .parked
            .range_mut((name.to_owned(), 0)..=(name.to_owned(), u64::MAX))
        {
            if p.status == ParkedStatus::Failed && position.is_none_or(|q| q == *at) {
                p.status = ParkedStatus::Retrying;
                if !self.retry_keeps_attempts {
                    p.attempts = 0;
                }
                p.due = Some(now);
                p.updated = now;
                retried += 1;
            }
        }
        if retried > 0 {
            self.bump(name, now);
        }
        Ok(retried)
    }

    fn skip(&mut self, name: &str, position: u64, now: SystemTime) -> Result<bool, StoreError> {
        let skipped = self.parked.remove(&(name.to_owned(), position)).is_some();
        if skipped {
            self.bump(name, now);
        }
        Ok(skipped)
    }

    fn rewind(
        &mut self,
        name: &str,
        position: u64,
        now: SystemTime,
    ) -> Result<Option<RelayRow>, StoreError> {
        let Some(row) = self.relays.get_mut(name) else {
            return Ok(None);
        };
        row.position = position;
        row.generation += 1;
        row.updated = now;
        let row = row.clone();
        self.parked
            .retain(|(relay, at), _| relay != name || *at <= position);
        Ok(Some(row))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use snapshot_receiver_core::Verdict;
    use std::time::{Duration, UNIX_EPOCH};

    fn object(version: u64, paused: bool) -> ObjectRow {
        ObjectRow {
            object_id: "card-1".into(),
            version,
            state: format!("{{\"v\":{version}}}"),
            paused,
        }
    }

    fn receipt(event_id: &str, at: u64) -> ReceiptRow {
        ReceiptRow {
            event_id: event_id.into(),
            fingerprint: 7,
            object_id: "card-1".into(),
            decision: Verdict::Applied,
            first_seen: UNIX_EPOCH + Duration::from_secs(at),
            retention_cutoff: None,
        }
    }

    #[test]
    fn a_group_with_a_stale_condition_commits_nothing_of_itself() {
        let mut store = SimStore::default();
        store.commit(&[Write::Seed(object(0, false))]).unwrap();
        store
            .commit(&[
                Write::Receipt(receipt("e-1", 10)),
                Write::Object {
                    row: object(1, false),
                    expect: Expect::Version {
                        version: 0,
                        paused: false,
                    },
                },
            ])
            .unwrap();
        // Decided on version 0 by another process: refused whole.
        let refused = store.commit(&[
            Write::Receipt(receipt("e-2", 11)),
            Write::Object {
                row: object(2, false),
                expect: Expect::Version {
                    version: 0,
                    paused: false,
                },
            },
        ]);
        assert_eq!(
            refused,
            Err(StoreError::Conflict(
                "object card-1 changed since it was read".to_owned()
            ))
        );
        assert!(store.receipt("e-2").is_none(), "the receipt was undone");
        let loaded = store.load(UNIX_EPOCH).unwrap();
        assert_eq!(loaded.objects, [object(1, false)]);
        assert_eq!(loaded.receipts, [receipt("e-1", 10)]);
    }

    #[test]
    fn a_live_receipt_is_a_conflict_and_an_expired_one_is_replaced() {
        let mut store = SimStore::default();
        store.commit(&[Write::Receipt(receipt("e-1", 10))]).unwrap();
        let again = store.commit(&[Write::Receipt(receipt("e-1", 20))]);
        assert_eq!(
            again,
            Err(StoreError::Conflict(
                "receipt for e-1 already exists".to_owned()
            ))
        );
        let mut late = receipt("e-1", 100);
        late.retention_cutoff = Some(UNIX_EPOCH + Duration::from_secs(10));
        store.commit(&[Write::Receipt(late.clone())]).unwrap();
        assert_eq!(store.receipt("e-1"), Some(&late));
    }
    fn replacement(seq: u64, version: u64) -> Write {
        Write::Effect(EffectRow {
            key: HeldKey { origin: 9, seq },
            at: UNIX_EPOCH,
            object_id: "card-1".into(),
            version,
            state: format!("{{\"v\":{version}}}"),
            cause_event: None,
            trace: None,
        })
    }

    #[test]
    fn positions_follow_commits_and_a_refused_commit_takes_none() {
        let mut store = SimStore::default();
        store.commit(&[Write::Seed(object(0, false))]).unwrap();
        // Decided as step 7 but committed first: position 1.
        store
            .commit(&[replacement(7, 1), replacement(8, 2)])
            .unwrap();
        let refused = store.commit(&[
            replacement(9, 3),
            Write::Object {
                row: object(3, false),
                expect: Expect::Absent,
            },
        ]);
        assert!(refused.is_err());
        store.commit(&[replacement(5, 3)]).unwrap();
        let read: Vec<(u64, u64)> = store
            .effects_after(1, 10)
            .unwrap()
            .iter()
            .map(|e| (e.position, e.id.seq))
            .collect();
        assert_eq!(read, [(2, 8), (3, 5)]);
        assert_eq!(store.last_position(), Ok(3));
    }

    #[test]
    fn a_relay_save_holds_only_for_its_generation_and_owner() {
        let mut store = SimStore::default();
        store.commit(&[replacement(1, 1)]).unwrap();
        let t = UNIX_EPOCH + Duration::from_secs(100);
        let lease = Duration::from_secs(2);
        let row = store.open_relay("app", 0, Some("app#1"), t, lease).unwrap();
        assert_eq!((row.generation, row.owner.as_deref()), (1, Some("app#1")));
        // Another run waits while the lease holds, takes it once it lapsed.
        let held = store.open_relay("app", 0, Some("app#2"), t, lease).unwrap();
        assert_eq!(held.owner.as_deref(), Some("app#1"));
        let later = t + Duration::from_secs(3);
        let taken = store
            .open_relay("app", 0, Some("app#2"), later, lease)
            .unwrap();
        assert_eq!(
            (taken.generation, taken.owner.as_deref()),
            (2, Some("app#2"))
        );
        let save = RelaySave {
            position: 1,
            ..RelaySave::default()
        };
        assert_eq!(
            store.save_relay("app", 1, "app#1", &save, later, lease),
            Ok(false)
        );
        assert_eq!(store.relay("app").map(|r| r.position), Some(0));
        assert_eq!(
            store.save_relay("app", 2, "app#2", &save, later, lease),
            Ok(true)
        );
        assert_eq!(store.relay("app").map(|r| r.position), Some(1));
    }
}
