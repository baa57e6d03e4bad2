//! What [`crate::store::StoreReader`] reads of the log-structured store:
//! the decoded rows its views are made of, each call at one instant of the
//! keyspace. The views themselves (counts, wire names, pause causes) are
//! the reader's, the same for every backend.

use super::codec::{self, decode, read_be, utf8};
use super::outbox::Wait;
use super::read::Reads;
use super::{failed, Db, Part};
use crate::store::load::LoadReads as _;
use crate::store::rows::ns_time;
use crate::store::{AuditRow, AuthorityWaitLine, HeldRow, ObjectRow, StoreError};
use snapshot_receiver_core::relay::{ParkedEffect, RelayRow};
use std::sync::Arc;
use std::time::SystemTime;

/// A read-only handle on an lsm store: the keyspace this process has open
/// (a receiver's), or one opened for reading.
pub(in crate::store) struct LsmRows(Arc<Db>);

/// A snapshot of one partition at the handle's instant.
type Snap = fjall::Snapshot;

/// The outbox's last position, every relay by name, and every parked
/// effect with its relay's name, by relay and position.
pub(in crate::store) struct RelayRows {
    pub(in crate::store) last: u64,
    pub(in crate::store) relays: Vec<RelayRow>,
    pub(in crate::store) parked: Vec<(String, ParkedEffect)>,
}

impl LsmRows {
    /// Opens the store in `path` for reading; creates nothing.
    ///
    /// # Errors
    /// [`StoreError::Missing`] for a directory without a store;
    /// [`StoreError::NotAStore`] for one of another format; the opening's
    /// errors otherwise (another process holds it).
    pub(in crate::store) fn open(path: &str) -> Result<Self, StoreError> {
        super::shared(path, None).map(Self)
    }

    fn snapshot(&self, part: Part) -> Snap {
        self.0.part(part).snapshot_at(self.0.keyspace.instant())
    }

    /// Every stored object in object order; only the paused ones with
    /// `paused_only`.
    pub(in crate::store) fn objects(
        &self,
        paused_only: bool,
    ) -> Result<Vec<ObjectRow>, StoreError> {
        let reads = Reads::new(&self.0);
        if !paused_only {
            return reads.all_objects();
        }
        let mut paused = Vec::new();
        for kv in self.snapshot(Part::Paused).keys() {
            paused.push(Arc::<str>::from(utf8("paused", &kv.map_err(failed)?)?));
        }
        reads.objects(&paused)
    }

    /// One stored object.
    pub(in crate::store) fn object(
        &self,
        object_id: &str,
    ) -> Result<Option<ObjectRow>, StoreError> {
        Ok(Reads::new(&self.0).objects(&[object_id.into()])?.pop())
    }

    /// The audit rows `keep` selects, in the order recorded.
    pub(in crate::store) fn audit(
        &self,
        keep: impl Fn(&AuditRow) -> bool,
    ) -> Result<Vec<AuditRow>, StoreError> {
        let mut rows = Vec::new();
        for kv in self.snapshot(Part::Audit).iter() {
            let (_, v) = kv.map_err(failed)?;
            let row = decode::<codec::Audit<'_>>("audit", &v)?.row()?;
            if keep(&row) {
                rows.push(row);
            }
        }
        Ok(rows)
    }

    /// The last `limit` audit rows, newest first.
    pub(in crate::store) fn recent_audit(&self, limit: usize) -> Result<Vec<AuditRow>, StoreError> {
        let mut rows = Vec::new();
        for kv in self.snapshot(Part::Audit).iter().rev().take(limit) {
            let (_, v) = kv.map_err(failed)?;
            rows.push(decode::<codec::Audit<'_>>("audit", &v)?.row()?);
        }
        Ok(rows)
    }

    /// Every held row not resolved (superseded ones included), in arrival
    /// order, each with the object of its event's first record.
    pub(in crate::store) fn held(&self) -> Result<Vec<(HeldRow, Option<String>)>, StoreError> {
        let receipts = self.snapshot(Part::Receipts);
        let first_object = |event_id: Option<&str>| match event_id
            .filter(|id| id.len() <= codec::MAX_KEY)
        {
            Some(id) => receipts
                .get(id.as_bytes())
                .map_err(failed)?
                .map(|r| {
                    decode::<codec::Receipt<'_>>("receipt", &r).map(|r| r.object_id.into_owned())
                })
                .transpose(),
            None => Ok(None),
        };
        Reads::new(&self.0)
            .unresolved(true)?
            .into_iter()
            .map(|row| {
                let first = first_object(row.event_id.as_deref())?;
                Ok((row, first))
            })
            .collect()
    }

    /// How many identities are stored and when the oldest was first seen;
    /// how many variants.
    pub(in crate::store) fn identities(
        &self,
    ) -> Result<(u64, Option<SystemTime>, u64), StoreError> {
        let mut receipts = 0;
        for kv in self.snapshot(Part::Receipts).keys() {
            kv.map_err(failed)?;
            receipts += 1;
        }
        let oldest = match self
            .snapshot(Part::ReceiptsByTime)
            .first_key_value()
            .map_err(failed)?
        {
            Some((k, _)) => Some(ns_time(read_be(&k, 0)? as i64)),
            None => None,
        };
        let mut variants = 0;
        for kv in self.snapshot(Part::Variants).keys() {
            kv.map_err(failed)?;
            variants += 1;
        }
        Ok((receipts, oldest, variants))
    }

    /// The waits of objects waiting for an authority, by object id.
    pub(in crate::store) fn waits(&self) -> Result<Vec<AuthorityWaitLine>, StoreError> {
        let at = |ns: u64| crate::format_rfc3339(ns_time(ns as i64));
        let mut rows = Vec::new();
        for kv in self.snapshot(Part::AuthorityWaits).iter() {
            let (k, v) = kv.map_err(failed)?;
            let w: Wait<'_> = decode("authority wait", &v)?;
            rows.push(AuthorityWaitLine {
                object_id: utf8("authority wait", &k)?.to_owned(),
                reasons: w.reasons.into_owned(),
                outcome: w.outcome.into_owned(),
                error: w.error.into_owned(),
                attempts: u64::from(w.attempts),
                since: at(w.since),
                next_try: w.next_try.map(at),
                at: at(w.at),
            });
        }
        Ok(rows)
    }

    /// The outbox's last position, the relays and their parked effects.
    pub(in crate::store) fn relays(&self) -> Result<RelayRows, StoreError> {
        let mut outbox = super::outbox::LsmOutbox(self.0.clone());
        let last = crate::store::OutboxStore::last_position(&mut outbox)?;
        let relays = crate::store::OutboxStore::relays(&mut outbox)?;
        let mut parked = Vec::new();
        for relay in &relays {
            for p in crate::store::OutboxStore::parked(&mut outbox, &relay.name)? {
                parked.push((relay.name.clone(), p));
            }
        }
        Ok(RelayRows {
            last,
            relays,
            parked,
        })
    }

    /// The first effect above `position`: its position and when it was
    /// recorded.
    pub(in crate::store) fn next_effect(
        &self,
        position: u64,
    ) -> Result<Option<(u64, SystemTime)>, StoreError> {
        let Some(from) = position.checked_add(1) else {
            return Ok(None);
        };
        match self
            .snapshot(Part::History)
            .range(codec::be(from).to_vec()..)
            .next()
            .transpose()
            .map_err(failed)?
        {
            Some((k, v)) => {
                let e: codec::Effect<'_> = decode("history", &v)?;
                Ok(Some((read_be(&k, 0)?, ns_time(e.at as i64))))
            }
            None => Ok(None),
        }
    }
}
