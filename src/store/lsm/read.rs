//! Reading the log-structured store: what a receiver loads and reloads,
//! and the shards' object sources. Every read of one [`Reads`] sees the
//! same committed batches (a snapshot at the keyspace's visible instant),
//! never half of one.

use super::codec::{self, held_key, held_key_at_end, id_prefix, MAX_KEY};
use super::{failed, Db, Part};
use crate::store::load::LoadReads;
use crate::store::rows::time_ns;
use crate::store::{
    AuditRow, EffectRow, HeldBody, HeldKey, HeldRow, ObjectRow, ObjectSource, ReceiptRow,
    StoreError, VariantRow,
};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::SystemTime;

/// Reads at one instant of the store.
pub(super) struct Reads<'d> {
    db: &'d Db,
    at: fjall::Instant,
}

impl<'d> Reads<'d> {
    pub(super) fn new(db: &'d Db) -> Self {
        Self {
            db,
            at: db.keyspace.instant(),
        }
    }

    fn snapshot(&self, part: Part) -> fjall::Snapshot {
        self.db.part(part).snapshot_at(self.at)
    }

    /// Every key and value of `part` under `prefix`, in key order.
    fn scan(
        &self,
        part: Part,
        prefix: &[u8],
    ) -> impl Iterator<Item = Result<(fjall::Slice, fjall::Slice), StoreError>> {
        // A prefix longer than any key finds nothing (and fjall would not
        // look it up).
        (prefix.len() <= MAX_KEY)
            .then(|| self.snapshot(part).prefix(prefix.to_vec()))
            .into_iter()
            .flatten()
            .map(|kv| kv.map_err(failed))
    }

    /// The stored rows of those of `ids` the store holds, in `ids`' order.
    pub(super) fn objects(&self, ids: &[Arc<str>]) -> Result<Vec<ObjectRow>, StoreError> {
        let objects = self.snapshot(Part::Objects);
        let mut rows = Vec::with_capacity(ids.len());
        for id in ids.iter().filter(|id| id.len() <= MAX_KEY) {
            if let Some(v) = objects.get(id.as_bytes()).map_err(failed)? {
                let o: codec::Object<'_> = codec::decode("object", &v)?;
                rows.push(o.row(id.as_bytes())?);
            }
        }
        Ok(rows)
    }

    /// Every stored object, in object order.
    pub(super) fn all_objects(&self) -> Result<Vec<ObjectRow>, StoreError> {
        self.scan(Part::Objects, b"")
            .map(|kv| {
                let (k, v) = kv?;
                codec::decode::<codec::Object<'_>>("object", &v)?.row(&k)
            })
            .collect()
    }

    /// The receipts of those of `event_ids` the store holds, first seen at
    /// or after `since` when given.
    pub(super) fn receipts(
        &self,
        event_ids: &[Arc<str>],
        since: Option<SystemTime>,
    ) -> Result<Vec<ReceiptRow>, StoreError> {
        let receipts = self.snapshot(Part::Receipts);
        let mut rows = Vec::new();
        for id in event_ids.iter().filter(|id| id.len() <= MAX_KEY) {
            if let Some(v) = receipts.get(id.as_bytes()).map_err(failed)? {
                let r = codec::decode::<codec::Receipt<'_>>("receipt", &v)?.row(id.as_bytes())?;
                if since.is_none_or(|s| r.first_seen >= s) {
                    rows.push(r);
                }
            }
        }
        Ok(rows)
    }

    /// Every variant of these event identities.
    pub(super) fn variants_of(
        &self,
        event_ids: &[Arc<str>],
    ) -> Result<Vec<VariantRow>, StoreError> {
        let mut rows = Vec::new();
        for id in event_ids {
            for kv in self.scan(Part::Variants, &id_prefix(id)) {
                let (k, v) = kv?;
                rows.push(codec::variant_row(&k, &v)?);
            }
        }
        Ok(rows)
    }

    /// Every audit row, in the order recorded.
    pub(super) fn audit(&self) -> Result<Vec<AuditRow>, StoreError> {
        self.scan(Part::Audit, b"")
            .map(|kv| codec::decode::<codec::Audit<'_>>("audit", &kv?.1)?.row())
            .collect()
    }

    /// The history rows of a step numbered above `after`, in step order
    /// (commit order among a step's rows).
    pub(super) fn replacements_since(&self, after: u64) -> Result<Vec<EffectRow>, StoreError> {
        let mut rows = Vec::new();
        for kv in self.scan(Part::History, b"") {
            let (_, v) = kv?;
            let e: codec::Effect<'_> = codec::decode("history", &v)?;
            if e.seq > after {
                rows.push(e.row()?);
            }
        }
        // Stable: rows of one step stay in position order.
        rows.sort_by_key(|r| r.key.seq);
        Ok(rows)
    }
}

impl LoadReads for Reads<'_> {
    fn receipts_since(&mut self, since_ns: i64) -> Result<Vec<ReceiptRow>, StoreError> {
        let mut rows = Vec::new();
        for kv in self.scan(Part::Receipts, b"") {
            let (k, v) = kv?;
            let r: codec::Receipt<'_> = codec::decode("receipt", &v)?;
            if r.first_seen as i64 >= since_ns {
                rows.push(r.row(&k)?);
            }
        }
        Ok(rows)
    }

    fn variants_since(&mut self, since_ns: i64) -> Result<Vec<VariantRow>, StoreError> {
        let mut rows = Vec::new();
        for kv in self.scan(Part::Variants, b"") {
            let (k, v) = kv?;
            let row = codec::variant_row(&k, &v)?;
            if time_ns(row.first_seen) >= since_ns {
                rows.push(row);
            }
        }
        Ok(rows)
    }

    fn objects(&mut self) -> Result<Vec<ObjectRow>, StoreError> {
        self.all_objects()
    }

    fn pinned_objects(&mut self) -> Result<Vec<ObjectRow>, StoreError> {
        let mut ids = BTreeSet::new();
        for kv in self.scan(Part::Paused, b"") {
            ids.insert(Arc::<str>::from(codec::utf8("paused", &kv?.0)?));
        }
        for kv in self.scan(Part::Held, b"") {
            let (_, v) = kv?;
            let h: codec::Held<'_> = codec::decode("held", &v)?;
            if let (false, Some(id)) = (h.resolved(), &h.object_id) {
                ids.insert(Arc::from(&**id));
            }
        }
        Reads::objects(self, &ids.into_iter().collect::<Vec<_>>())
    }

    fn unresolved(&mut self, bodies: bool) -> Result<Vec<HeldRow>, StoreError> {
        let held_bodies = self.snapshot(Part::HeldBodies);
        let mut rows = Vec::new();
        for kv in self.scan(Part::Held, b"") {
            let (k, v) = kv?;
            let h: codec::Held<'_> = codec::decode("held", &v)?;
            if h.resolved() {
                continue;
            }
            let body: Arc<[u8]> = match bodies {
                true => held_bodies
                    .get(&k)
                    .map_err(failed)?
                    .map_or_else(|| Arc::from(&[][..]), |b| Arc::from(&*b)),
                false => Arc::from(&[][..]),
            };
            rows.push((h.at, h.arrival, h.row(held_key_at_end(&k)?, body)?));
        }
        rows.sort_by_key(|(at, arrival, _)| (*at, *arrival));
        Ok(rows.into_iter().map(|(_, _, row)| row).collect())
    }

    fn max_seq(&mut self) -> Result<u64, StoreError> {
        match self.snapshot(Part::Meta).get(b"max_seq").map_err(failed)? {
            Some(v) => codec::read_be(&v, 0),
            None => Ok(0),
        }
    }
}

/// A shard's object source: reads at the instant of each call.
pub(super) struct Source(pub(super) Arc<Db>);

impl ObjectSource for Source {
    fn objects(&mut self, ids: &[Arc<str>]) -> Result<Vec<ObjectRow>, StoreError> {
        super::guarded("objects", || Reads::new(&self.0).objects(ids))
    }

    fn receipts(
        &mut self,
        event_ids: &[Arc<str>],
        since: SystemTime,
    ) -> Result<Vec<ReceiptRow>, StoreError> {
        super::guarded("receipts", || {
            Reads::new(&self.0).receipts(event_ids, Some(since))
        })
    }

    fn held_bodies(&mut self, keys: &[HeldKey]) -> Result<Vec<HeldBody>, StoreError> {
        super::guarded("held_bodies", || {
            let reads = Reads::new(&self.0);
            let bodies = reads.snapshot(Part::HeldBodies);
            let mut found = Vec::with_capacity(keys.len());
            for key in keys {
                if let Some(b) = bodies.get(held_key(*key)).map_err(failed)? {
                    found.push((*key, Arc::from(&*b)));
                }
            }
            Ok(found)
        })
    }

    fn receipt_ids(
        &mut self,
        after: &str,
        since: SystemTime,
        limit: usize,
    ) -> Result<Vec<(Arc<str>, SystemTime)>, StoreError> {
        super::guarded("receipt_ids", || {
            use std::ops::Bound;
            let reads = Reads::new(&self.0);
            let since = time_ns(since);
            let start = match after {
                "" => Bound::Unbounded,
                after => Bound::Excluded(after.as_bytes().to_vec()),
            };
            let mut page = Vec::new();
            for kv in reads
                .snapshot(Part::Receipts)
                .range::<Vec<u8>, _>((start, Bound::Unbounded))
            {
                if page.len() >= limit {
                    break;
                }
                let (k, v) = kv.map_err(failed)?;
                let r = codec::decode::<codec::Receipt<'_>>("receipt", &v)?.row(&k)?;
                if time_ns(r.first_seen) >= since {
                    page.push((r.event_id, r.first_seen));
                }
            }
            Ok(page)
        })
    }
}
