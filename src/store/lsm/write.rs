//! The commit path of the log-structured store: a group's writes checked
//! against the stored rows and the group's own earlier writes, then one
//! atomic batch; and the purges.

use super::codec::{self, be, by_time, held_key, id_prefix, variant_key, MAX_KEY};
use super::{failed, Counters, Db, Part};
use crate::store::rows::{
    changed, cutoff_ns, exists, first_record_not_stored, not_stored, receipt_recorded, time_ns,
    variant_recorded,
};
use crate::store::{
    AuditRow, EffectRow, Expect, HeldKey, HeldRow, HeldStatus, ObjectRow, ReceiptRow, Records,
    StoreError, VariantRow, Write,
};
use fjall::PersistMode;
use std::collections::BTreeMap;
use std::time::SystemTime;

/// Keys a purge removes per batch (each batch is atomic and durable).
const PURGE_BATCH_KEYS: usize = 10_000;

/// A key and its value.
type KeyValue = (Vec<u8>, Vec<u8>);

/// One group's writes, not yet committed: what they put (`Some`) and
/// removed (`None`), read back by the group's later writes before the
/// stored rows.
pub(super) struct Tx<'d> {
    db: &'d Db,
    pending: BTreeMap<(Part, Vec<u8>), Option<Vec<u8>>>,
    counters: Counters,
}

impl<'d> Tx<'d> {
    pub(super) fn new(db: &'d Db, counters: Counters) -> Self {
        Self {
            db,
            pending: BTreeMap::new(),
            counters,
        }
    }

    /// The value of `key` as the group left it.
    fn get(&self, part: Part, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        if let Some(v) = self.pending.get(&(part, key.to_vec())) {
            return Ok(v.clone());
        }
        if key.len() > MAX_KEY {
            // No such key can be stored (and fjall would not look it up).
            return Ok(None);
        }
        Ok(self
            .db
            .part(part)
            .get(key)
            .map_err(failed)?
            .map(|v| v.to_vec()))
    }

    /// Puts `value` at `key`; a key over the store's limit refuses the
    /// group's row ([`StoreError::Refused`]: committing it again fails
    /// again), naming what it was.
    fn put(&mut self, part: Part, key: Vec<u8>, value: Vec<u8>) -> Result<(), StoreError> {
        if key.len() > MAX_KEY {
            return Err(StoreError::Refused {
                cause: format!(
                    "lsm: a key of table {} is {} bytes, over the store's limit of {MAX_KEY}",
                    part.name(),
                    key.len()
                ),
                body: None,
            });
        }
        if u32::try_from(value.len()).is_err() {
            return Err(StoreError::Refused {
                cause: format!(
                    "lsm: a value of table {} is {} bytes, over the store's limit of 4 GiB",
                    part.name(),
                    value.len()
                ),
                body: None,
            });
        }
        self.pending.insert((part, key), Some(value));
        Ok(())
    }

    fn remove(&mut self, part: Part, key: Vec<u8>) {
        self.pending.insert((part, key), None);
    }

    /// The keys and values under `prefix` as the group left them.
    fn prefix(&self, part: Part, prefix: &[u8]) -> Result<Vec<KeyValue>, StoreError> {
        let mut found: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let stored = match prefix.len() > MAX_KEY {
            true => None,
            false => Some(self.db.part(part).prefix(prefix)),
        };
        for kv in stored.into_iter().flatten() {
            let (k, v) = kv.map_err(failed)?;
            found.insert(k.to_vec(), v.to_vec());
        }
        for ((p, k), v) in self.pending.range((part, prefix.to_vec())..) {
            if *p != part || !k.starts_with(prefix) {
                break;
            }
            match v {
                Some(v) => found.insert(k.clone(), v.clone()),
                None => found.remove(k),
            };
        }
        Ok(found.into_iter().collect())
    }

    /// Applies one write, in the group's order.
    pub(super) fn apply(&mut self, write: &Write) -> Result<(), StoreError> {
        match write {
            Write::Receipt(r) => self.receipt(r),
            Write::Variant(v) => self.variant(v),
            Write::Object { row, expect } => match *expect {
                Expect::Version { version, paused } => {
                    // The conditional update of a transactional inbox:
                    // the row as the decision read it, or nothing.
                    if self.object(&row.object_id)? != Some((version, paused)) {
                        return Err(changed(&row.object_id));
                    }
                    self.put_object(row, Some(paused))
                }
                Expect::Absent => {
                    if self.object(&row.object_id)?.is_some() {
                        return Err(exists(&row.object_id));
                    }
                    self.put_object(row, None)
                }
            },
            Write::Seed(row) => {
                if self.object(&row.object_id)?.is_none() {
                    self.put_object(row, None)?;
                }
                Ok(())
            }
            Write::Pause { object_id } => {
                if !self.pause(object_id)? {
                    return Err(not_stored(object_id));
                }
                Ok(())
            }
            Write::PauseIfStored {
                event_id,
                fingerprint,
                object_id,
                audit,
            } => {
                let first = self.get(Part::Receipts, event_id.as_bytes())?;
                let stored = match first {
                    Some(v) => {
                        codec::decode::<codec::Receipt<'_>>("receipt", &v)?.fingerprint
                            == *fingerprint
                    }
                    None => false,
                };
                if !stored {
                    return Err(first_record_not_stored(event_id));
                }
                if self.pause(object_id)? {
                    self.audit(audit)?;
                }
                Ok(())
            }
            Write::Check {
                object_id,
                version,
                paused,
            } => match self.object(object_id)? {
                Some((v, p)) if v == *version && p == *paused => Ok(()),
                _ => Err(changed(object_id)),
            },
            Write::Held(h) => self.held(h),
            Write::HeldStatus {
                key,
                status,
                superseded_by,
            } => self.held_status(*key, *status, *superseded_by),
            Write::Audit(a) => self.audit(a),
            Write::Effect(e) => self.effect(e),
        }
    }

    /// An object's stored version and pause flag, as the group left it.
    fn object(&self, object_id: &str) -> Result<Option<(u64, bool)>, StoreError> {
        self.get(Part::Objects, object_id.as_bytes())?
            .map(|v| {
                codec::decode::<codec::Object<'_>>("object", &v).map(|o| (o.version, o.paused))
            })
            .transpose()
    }

    /// Writes an object's row and keeps the index of paused objects with
    /// it (`was_paused`: the stored flag, `None` for a new row).
    fn put_object(&mut self, row: &ObjectRow, was_paused: Option<bool>) -> Result<(), StoreError> {
        let key = row.object_id.as_bytes().to_vec();
        self.put(
            Part::Objects,
            key.clone(),
            codec::encode(&codec::Object::of(row))?,
        )?;
        match (was_paused.unwrap_or(false), row.paused) {
            (false, true) => self.put(Part::Paused, key, Vec::new())?,
            (true, false) => self.remove(Part::Paused, key),
            _ => {}
        }
        Ok(())
    }

    /// Pauses a stored object; whether the store holds it.
    fn pause(&mut self, object_id: &str) -> Result<bool, StoreError> {
        let Some(v) = self.get(Part::Objects, object_id.as_bytes())? else {
            return Ok(false);
        };
        let object: codec::Object<'_> = codec::decode("object", &v)?;
        let row = ObjectRow {
            object_id: object_id.into(),
            version: object.version,
            state: object.state.into_owned(),
            paused: true,
        };
        self.put_object(&row, Some(object.paused))?;
        Ok(true)
    }

    /// [`Write::Receipt`]: a live receipt of the identity is a conflict;
    /// one that expired by the row's cut-off is replaced, and the variants
    /// recorded before the new row go with it.
    fn receipt(&mut self, r: &ReceiptRow) -> Result<(), StoreError> {
        let key = r.event_id.as_bytes().to_vec();
        if let Some(v) = self.get(Part::Receipts, &key)? {
            let old: codec::Receipt<'_> = codec::decode("receipt", &v)?;
            if old.first_seen as i64 > cutoff_ns(r.retention_cutoff) {
                return Err(receipt_recorded(&r.event_id));
            }
            let mut old_time = codec::be(old.first_seen).to_vec();
            old_time.extend_from_slice(&key);
            self.remove(Part::ReceiptsByTime, old_time);
        }
        self.put(
            Part::Receipts,
            key.clone(),
            codec::encode(&codec::Receipt::of(r))?,
        )?;
        self.put(
            Part::ReceiptsByTime,
            by_time(r.first_seen, &key),
            Vec::new(),
        )?;
        let first_seen = time_ns(r.first_seen).max(0) as u64;
        for (k, v) in self.prefix(Part::Variants, &id_prefix(&r.event_id))? {
            if codec::decode::<codec::Variant<'_>>("variant", &v)?.first_seen < first_seen {
                self.remove(Part::Variants, k);
            }
        }
        Ok(())
    }

    /// [`Write::Variant`]: a stored one is a conflict (recorded first
    /// elsewhere).
    fn variant(&mut self, v: &VariantRow) -> Result<(), StoreError> {
        let key = variant_key(&v.event_id, v.fingerprint);
        if self.get(Part::Variants, &key)?.is_some() {
            return Err(variant_recorded(v));
        }
        let value = codec::Variant {
            object_id: (&*v.object_id).into(),
            first_seen: time_ns(v.first_seen).max(0) as u64,
        };
        self.put(Part::Variants, key, codec::encode(&value)?)
    }

    fn held(&mut self, h: &HeldRow) -> Result<(), StoreError> {
        self.counters.held += 1;
        let key = held_key(h.key);
        self.put(
            Part::Held,
            key.clone(),
            codec::encode(&codec::Held::of(h, self.counters.held))?,
        )?;
        self.put(Part::HeldBodies, key.clone(), h.body.to_vec())?;
        self.index_held(h.key, h.event_id.as_deref(), h.at, h.status, None)
    }

    /// Keeps the held rows' indexes with a row's status: its event's entry
    /// while it is not resolved, its time entry once it is.
    fn index_held(
        &mut self,
        key: HeldKey,
        event_id: Option<&str>,
        at: SystemTime,
        status: HeldStatus,
        was: Option<HeldStatus>,
    ) -> Result<(), StoreError> {
        let resolved = |s: HeldStatus| s == HeldStatus::Resolved;
        if was.map(resolved) == Some(resolved(status)) {
            return Ok(());
        }
        let event = event_id.map(|id| {
            let mut k = id_prefix(id);
            k.extend_from_slice(&held_key(key));
            k
        });
        let time = by_time(at, &held_key(key));
        if resolved(status) {
            if let Some(k) = event {
                self.remove(Part::HeldEvents, k);
            }
            self.put(Part::ResolvedByTime, time, Vec::new())
        } else {
            if let Some(k) = event {
                self.put(Part::HeldEvents, k, Vec::new())?;
            }
            if was.is_some() {
                self.remove(Part::ResolvedByTime, time);
            }
            Ok(())
        }
    }

    /// [`Write::HeldStatus`]: nothing when the row is gone.
    fn held_status(
        &mut self,
        key: HeldKey,
        status: HeldStatus,
        superseded_by: Option<u64>,
    ) -> Result<(), StoreError> {
        let k = held_key(key);
        let Some(v) = self.get(Part::Held, &k)? else {
            return Ok(());
        };
        let mut held: codec::Held<'_> = codec::decode("held", &v)?;
        let was = HeldStatus::parse(&held.status)
            .ok_or_else(|| codec::corrupt("held", format!("status {:?}", held.status)))?;
        held.status = status.as_str().into();
        held.superseded_by = superseded_by;
        let event_id = held.event_id.as_deref().map(str::to_owned);
        let at = crate::store::rows::ns_time(held.at as i64);
        let value = codec::encode(&held)?;
        self.put(Part::Held, k, value)?;
        self.index_held(key, event_id.as_deref(), at, status, Some(was))
    }

    fn audit(&mut self, a: &AuditRow) -> Result<(), StoreError> {
        self.counters.audit += 1;
        self.counters.max_seq = self.counters.max_seq.max(a.key.seq);
        let counter = be(self.counters.audit);
        self.put(
            Part::Audit,
            counter.to_vec(),
            codec::encode(&codec::Audit::of(a))?,
        )?;
        self.put(Part::AuditByTime, by_time(a.at, &counter), Vec::new())
    }

    /// A history row at the next outbox position: positions follow the
    /// commit order, since one writer commits.
    fn effect(&mut self, e: &EffectRow) -> Result<(), StoreError> {
        self.counters.position += 1;
        let position = be(self.counters.position);
        self.put(
            Part::History,
            position.to_vec(),
            codec::encode(&codec::Effect::of(e))?,
        )?;
        self.put(Part::HistoryByTime, by_time(e.at, &position), Vec::new())
    }

    /// Commits the group in one atomic batch, durable when this returns;
    /// the counters after it.
    pub(super) fn commit(mut self) -> Result<Counters, StoreError> {
        for (key, n) in Counters::KEYS.iter().zip(self.counters.values()) {
            self.pending
                .insert((Part::Meta, key.to_vec()), Some(be(n).to_vec()));
        }
        let mut batch = self
            .db
            .keyspace
            .batch()
            .durability(Some(PersistMode::SyncAll));
        for ((part, key), value) in self.pending {
            match value {
                Some(v) => batch.insert(self.db.part(part), key, v),
                None => batch.remove(self.db.part(part), key),
            }
        }
        batch.commit().map_err(failed)?;
        Ok(self.counters)
    }
}

/// Removes keys in durable batches of [`PURGE_BATCH_KEYS`].
struct Remover<'d> {
    db: &'d Db,
    batch: Vec<(Part, Vec<u8>)>,
}

impl<'d> Remover<'d> {
    fn new(db: &'d Db) -> Self {
        Self {
            db,
            batch: Vec::new(),
        }
    }

    fn remove(&mut self, part: Part, key: Vec<u8>) -> Result<(), StoreError> {
        self.batch.push((part, key));
        if self.batch.len() >= PURGE_BATCH_KEYS {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StoreError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let mut batch = self
            .db
            .keyspace
            .batch()
            .durability(Some(PersistMode::SyncAll));
        for (part, key) in self.batch.drain(..) {
            batch.remove(self.db.part(part), key);
        }
        batch.commit().map_err(failed)
    }
}

/// [`crate::store::Store::purge_receipts`]: the receipts and variants
/// first seen before `before`.
pub(super) fn purge_identities(db: &Db, before: SystemTime) -> Result<u64, StoreError> {
    let mut removed = 0;
    let mut remover = Remover::new(db);
    let end = codec::time_key(before);
    for kv in db.part(Part::ReceiptsByTime).range(..end) {
        let (k, _) = kv.map_err(failed)?;
        let event_id = &k[8..];
        // The receipt's own time decides: the index entry of a receipt
        // replaced after it expired went with it.
        if let Some(v) = db.part(Part::Receipts).get(event_id).map_err(failed)? {
            let r: codec::Receipt<'_> = codec::decode("receipt", &v)?;
            if codec::be(r.first_seen) == k[..8] {
                remover.remove(Part::Receipts, event_id.to_vec())?;
                removed += 1;
            }
        }
        remover.remove(Part::ReceiptsByTime, k.to_vec())?;
    }
    let before = time_ns(before).max(0) as u64;
    for kv in db.part(Part::Variants).iter() {
        let (k, v) = kv.map_err(failed)?;
        if codec::decode::<codec::Variant<'_>>("variant", &v)?.first_seen < before {
            remover.remove(Part::Variants, k.to_vec())?;
            removed += 1;
        }
    }
    remover.flush()?;
    Ok(removed)
}

/// [`crate::store::Store::purge_records`]: at most `limit` rows of
/// `records` recorded before `before`, in one batch.
pub(super) fn purge_records(
    db: &Db,
    max_seq: u64,
    records: Records,
    before: SystemTime,
    limit: usize,
) -> Result<u64, StoreError> {
    let end = codec::time_key(before);
    let mut batch = db.keyspace.batch().durability(Some(PersistMode::SyncAll));
    let mut removed = 0u64;
    let index = match records {
        Records::Audit => Part::AuditByTime,
        Records::History => Part::HistoryByTime,
        Records::Resolved => Part::ResolvedByTime,
    };
    for kv in db.part(index).range(..end) {
        if removed as usize >= limit {
            break;
        }
        let (k, _) = kv.map_err(failed)?;
        let row = k[8..].to_vec();
        match records {
            Records::Audit => {
                let Some(v) = db.part(Part::Audit).get(&row).map_err(failed)? else {
                    batch.remove(db.part(index), k);
                    continue;
                };
                let a: codec::Audit<'_> = codec::decode("audit", &v)?;
                if justifies(db, &a, max_seq)? {
                    continue;
                }
                batch.remove(db.part(Part::Audit), row);
            }
            Records::History => {
                // Never an effect a relay has not passed (docs/CONTRACT.md §10).
                if !super::outbox::relays_passed(db, codec::read_be(&row, 0)?)? {
                    continue;
                }
                batch.remove(db.part(Part::History), row)
            }
            Records::Resolved => {
                batch.remove(db.part(Part::Held), row.clone());
                batch.remove(db.part(Part::HeldBodies), row);
            }
        }
        batch.remove(db.part(index), k);
        removed += 1;
    }
    batch.commit().map_err(failed)?;
    Ok(removed)
}

/// Whether an audit row must stay (docs/CONTRACT.md §9): it is of the
/// highest sequence number stored, of a step or event identity whose held
/// row is not resolved, or of a paused object.
fn justifies(db: &Db, a: &codec::Audit<'_>, max_seq: u64) -> Result<bool, StoreError> {
    if a.seq >= max_seq {
        return Ok(true);
    }
    let step = held_key(HeldKey {
        origin: a.origin,
        seq: a.seq,
    });
    if let Some(v) = db.part(Part::Held).get(&step).map_err(failed)? {
        if !codec::decode::<codec::Held<'_>>("held", &v)?.resolved() {
            return Ok(true);
        }
    }
    if let Some(event_id) = a
        .event_id
        .as_ref()
        .filter(|id| id_prefix(id).len() <= MAX_KEY)
    {
        if db
            .part(Part::HeldEvents)
            .prefix(id_prefix(event_id))
            .next()
            .transpose()
            .map_err(failed)?
            .is_some()
        {
            return Ok(true);
        }
    }
    if let Some(object_id) = &a.object_id {
        if db
            .part(Part::Paused)
            .contains_key(object_id.as_bytes())
            .map_err(failed)?
        {
            return Ok(true);
        }
    }
    Ok(false)
}
