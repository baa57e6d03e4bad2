//! The outbox, the relays and a reconciler's rows in the log-structured
//! store (docs/CONTRACT.md §4, §10): effects are read by position from the
//! history the committer writes; a relay's row and its parked effects are
//! written by the relay's own handle, one change at a time (a lock of the
//! store's), each change one atomic, durable batch. Leases are timed on
//! this process's clock, the only one an lsm store has (one process at a
//! time).

use super::codec::{self, be, decode, encode, id_prefix, read_be, split_id_prefix, utf8};
use super::{failed, Db, Part};
use crate::store::rows::{ns_time, time_ns};
use crate::store::{AuthorityStore, OutboxStore, StoreError};
use fjall::PersistMode;
use serde::{Deserialize, Serialize};
use snapshot_receiver_core::engine::Effect;
use snapshot_receiver_core::reconciler::WaitRecord;
use snapshot_receiver_core::relay::{EffectHead, ParkedEffect, ParkedStatus, RelayRow, RelaySave};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// A relay's value (its key is its name).
#[derive(Serialize, Deserialize)]
struct Relay<'a> {
    position: u64,
    generation: u64,
    #[serde(borrow)]
    owner: Option<Cow<'a, str>>,
    lease_until: Option<u64>,
    updated: u64,
    backlogged_since: Option<u64>,
    parked_bytes: Option<u64>,
}

impl Relay<'_> {
    fn row(&self, name: &str) -> RelayRow {
        RelayRow {
            name: name.to_owned(),
            position: self.position,
            generation: self.generation,
            owner: self.owner.as_deref().map(str::to_owned),
            lease_until: self.lease_until.map(|t| ns_time(t as i64)),
            updated: ns_time(self.updated as i64),
            backlogged_since: self.backlogged_since.map(|t| ns_time(t as i64)),
            parked_bytes: self.parked_bytes,
        }
    }
}

/// A parked effect's value (its key: [`id_prefix`] of the relay's name,
/// then the position).
#[derive(Serialize, Deserialize)]
struct Parked<'a> {
    #[serde(borrow)]
    status: Cow<'a, str>,
    attempts: u32,
    due: Option<u64>,
    #[serde(borrow)]
    error: Option<Cow<'a, str>>,
    updated: u64,
}

/// An authority wait's value (its key is the object id).
#[derive(Serialize, Deserialize)]
pub(super) struct Wait<'a> {
    #[serde(borrow)]
    pub(super) reasons: Cow<'a, str>,
    #[serde(borrow)]
    pub(super) outcome: Cow<'a, str>,
    #[serde(borrow)]
    pub(super) error: Cow<'a, str>,
    pub(super) attempts: u32,
    pub(super) since: u64,
    pub(super) next_try: Option<u64>,
    pub(super) at: u64,
}

fn ns(t: SystemTime) -> u64 {
    time_ns(t).max(0) as u64
}

/// The longest lease written (about 31 years), as the SQL stores do.
const MAX_LEASE: Duration = Duration::from_secs(1_000_000_000);

fn parked_key(relay: &str, position: u64) -> Vec<u8> {
    let mut k = id_prefix(relay);
    k.extend_from_slice(&be(position));
    k
}

/// Relay `name` as stored.
fn relay_of(db: &Db, name: &str) -> Result<Option<RelayRow>, StoreError> {
    let Some(v) = db.part(Part::Relays).get(name).map_err(failed)? else {
        return Ok(None);
    };
    Ok(Some(decode::<Relay<'_>>("relay", &v)?.row(name)))
}

fn put_relay(db: &Db, batch: &mut fjall::Batch, row: &RelayRow) -> Result<(), StoreError> {
    let value = Relay {
        position: row.position,
        generation: row.generation,
        owner: row.owner.as_deref().map(Cow::Borrowed),
        lease_until: row.lease_until.map(ns),
        updated: ns(row.updated),
        backlogged_since: row.backlogged_since.map(ns),
        parked_bytes: row.parked_bytes,
    };
    batch.insert(db.part(Part::Relays), row.name.as_bytes(), encode(&value)?);
    Ok(())
}

/// The parked rows of relay `name` (position, value), in position order.
fn parked_rows(db: &Db, name: &str) -> Result<Vec<(u64, fjall::Slice)>, StoreError> {
    db.part(Part::RelayParked)
        .prefix(id_prefix(name))
        .map(|kv| {
            let (k, v) = kv.map_err(failed)?;
            let (_, position) = split_id_prefix(&k)?;
            Ok((read_be(position, 0)?, v))
        })
        .collect()
}

/// Raises relay `name`'s generation (an operator changed it).
fn bump(db: &Db, batch: &mut fjall::Batch, name: &str, now: SystemTime) -> Result<(), StoreError> {
    if let Some(mut row) = relay_of(db, name)? {
        row.generation += 1;
        row.updated = now;
        put_relay(db, batch, &row)?;
    }
    Ok(())
}

/// Whether every relay has passed the effect at `position` and none holds
/// it parked: the history purge may delete it (docs/CONTRACT.md §10).
pub(super) fn relays_passed(db: &Db, position: u64) -> Result<bool, StoreError> {
    for kv in db.part(Part::Relays).iter() {
        let (_, v) = kv.map_err(failed)?;
        if decode::<Relay<'_>>("relay", &v)?.position < position {
            return Ok(false);
        }
    }
    for kv in db.part(Part::RelayParked).iter() {
        let (k, _) = kv.map_err(failed)?;
        if read_be(split_id_prefix(&k)?.1, 0)? == position {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The relays' and a reconciler's handle on the store.
pub(super) struct LsmOutbox(pub(super) Arc<Db>);

impl LsmOutbox {
    fn effect(key: &[u8], value: &[u8]) -> Result<Effect, StoreError> {
        let row = decode::<codec::Effect<'_>>("history", value)?.row()?;
        Ok(Effect::from_row(read_be(key, 0)?, row))
    }

    /// Runs one change of the relays under the store's relay lock, as one
    /// durable batch: `f` reads the rows and adds its writes to the batch.
    fn change<T>(
        &self,
        f: impl FnOnce(&Db, &mut fjall::Batch) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let _one = crate::locks::lock(&self.0.relay_lock);
        let mut batch = self
            .0
            .keyspace
            .batch()
            .durability(Some(PersistMode::SyncAll));
        let out = f(&self.0, &mut batch)?;
        batch.commit().map_err(failed)?;
        Ok(out)
    }

    /// The effects above `after`, in position order, while `more` says so
    /// (given each effect's state length and how many came before).
    fn effects_while(
        &self,
        after: u64,
        mut more: impl FnMut(usize, usize) -> bool,
    ) -> Result<Vec<Effect>, StoreError> {
        let history = self
            .0
            .part(Part::History)
            .snapshot_at(self.0.keyspace.instant());
        let mut effects = Vec::new();
        let Some(from) = after.checked_add(1) else {
            return Ok(effects);
        };
        for kv in history.range(be(from).to_vec()..) {
            let (k, v) = kv.map_err(failed)?;
            let effect = Self::effect(&k, &v)?;
            if !more(effect.bytes(), effects.len()) {
                break;
            }
            effects.push(effect);
        }
        Ok(effects)
    }
}

impl OutboxStore for LsmOutbox {
    fn effects_after(&mut self, after: u64, limit: usize) -> Result<Vec<Effect>, StoreError> {
        super::guarded("effects_after", || {
            self.effects_while(after, |_, n| n < limit)
        })
    }

    fn effects_within(
        &mut self,
        after: u64,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<Effect>, StoreError> {
        super::guarded("effects_within", || {
            let mut bytes = 0usize;
            self.effects_while(after, |len, n| {
                bytes = bytes.saturating_add(len);
                n < limit && (n == 0 || bytes <= max_bytes)
            })
        })
    }

    fn effects_at(&mut self, positions: &[u64]) -> Result<Vec<Effect>, StoreError> {
        super::guarded("effects_at", || {
            let history = self
                .0
                .part(Part::History)
                .snapshot_at(self.0.keyspace.instant());
            let mut sorted = positions.to_vec();
            sorted.sort_unstable();
            sorted.dedup();
            let mut effects = Vec::with_capacity(sorted.len());
            for position in sorted {
                if let Some(v) = history.get(be(position)).map_err(failed)? {
                    effects.push(Self::effect(&be(position), &v)?);
                }
            }
            Ok(effects)
        })
    }

    fn last_position(&mut self) -> Result<u64, StoreError> {
        super::guarded("last_position", || {
            match self.0.part(Part::Meta).get(b"position").map_err(failed)? {
                Some(v) => read_be(&v, 0),
                None => Ok(0),
            }
        })
    }

    fn open_relay(
        &mut self,
        name: &str,
        start: u64,
        owner: Option<&str>,
        now: SystemTime,
        lease: Duration,
    ) -> Result<RelayRow, StoreError> {
        super::guarded("open_relay", || {
            self.change(|db, batch| {
                let mut row =
                    relay_of(db, name)?.unwrap_or_else(|| RelayRow::new(name, start, now));
                if let Some(owner) = owner {
                    let clock = SystemTime::now();
                    let free = match (&row.owner, row.lease_until) {
                        (None, _) => true,
                        (Some(o), _) if o == owner => true,
                        (Some(_), until) => until.is_none_or(|u| u <= clock),
                    };
                    if free {
                        if row.owner.as_deref() != Some(owner) {
                            row.generation += 1;
                        }
                        row.owner = Some(owner.to_owned());
                        row.lease_until = Some(clock + lease.min(MAX_LEASE));
                        row.updated = now;
                    }
                }
                put_relay(db, batch, &row)?;
                Ok(row)
            })
        })
    }

    fn relays(&mut self) -> Result<Vec<RelayRow>, StoreError> {
        super::guarded("relays", || {
            let mut rows = Vec::new();
            for kv in self.0.part(Part::Relays).iter() {
                let (k, v) = kv.map_err(failed)?;
                rows.push(decode::<Relay<'_>>("relay", &v)?.row(utf8("relay", &k)?));
            }
            Ok(rows)
        })
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
        super::guarded("save_relay", || {
            self.change(|db, batch| {
                let Some(mut row) = relay_of(db, name)? else {
                    return Ok(false);
                };
                if row.generation != generation || row.owner.as_deref() != Some(owner) {
                    return Ok(false);
                }
                row.position = row.position.max(save.position);
                row.lease_until = Some(SystemTime::now() + lease.min(MAX_LEASE));
                row.updated = now;
                row.backlogged_since = save.backlogged_since;
                row.parked_bytes = Some(save.parked_bytes);
                put_relay(db, batch, &row)?;
                for p in &save.park {
                    let value = Parked {
                        status: Cow::Borrowed(p.status.as_str()),
                        attempts: p.attempts,
                        due: p.due.map(ns),
                        error: p.error.as_deref().map(Cow::Borrowed),
                        updated: ns(p.updated),
                    };
                    batch.insert(
                        db.part(Part::RelayParked),
                        parked_key(name, p.effect.position),
                        encode(&value)?,
                    );
                }
                for position in &save.unpark {
                    batch.remove(db.part(Part::RelayParked), parked_key(name, *position));
                }
                Ok(true)
            })
        })
    }

    fn parked(&mut self, name: &str) -> Result<Vec<ParkedEffect>, StoreError> {
        super::guarded("parked", || {
            let history = self.0.part(Part::History);
            let mut parked = Vec::new();
            for (position, v) in parked_rows(&self.0, name)? {
                // A parked effect's history row is kept until the relay is
                // done with it (the purge checks).
                let Some(h) = history.get(be(position)).map_err(failed)? else {
                    continue;
                };
                let effect = Self::effect(&be(position), &h)?;
                let p: Parked<'_> = decode("parked effect", &v)?;
                parked.push(ParkedEffect {
                    effect: EffectHead {
                        position,
                        id: effect.id,
                        at: effect.at,
                        object_id: effect.object_id.clone(),
                        version: effect.version,
                        bytes: effect.bytes(),
                    },
                    status: ParkedStatus::parse(&p.status).ok_or_else(|| {
                        codec::corrupt("parked effect", format!("status {:?}", p.status))
                    })?,
                    attempts: p.attempts,
                    due: p.due.map(|t| ns_time(t as i64)),
                    error: p.error.map(Cow::into_owned),
                    updated: ns_time(p.updated as i64),
                });
            }
            Ok(parked)
        })
    }

    fn retry_failed(
        &mut self,
        name: &str,
        position: Option<u64>,
        now: SystemTime,
    ) -> Result<u64, StoreError> {
        super::guarded("retry_failed", || {
            self.change(|db, batch| {
                let mut retried = 0;
                for (at, v) in parked_rows(db, name)? {
                    let mut p: Parked<'_> = decode("parked effect", &v)?;
                    if position.is_some_and(|want| want != at) || p.status != "failed" {
                        continue;
                    }
                    p.status = Cow::Borrowed(ParkedStatus::Retrying.as_str());
                    p.attempts = 0;
                    p.due = Some(ns(now));
                    p.updated = ns(now);
                    batch.insert(
                        db.part(Part::RelayParked),
                        parked_key(name, at),
                        encode(&p)?,
                    );
                    retried += 1;
                }
                if retried > 0 {
                    bump(db, batch, name, now)?;
                }
                Ok(retried)
            })
        })
    }

    fn skip(&mut self, name: &str, position: u64, now: SystemTime) -> Result<bool, StoreError> {
        super::guarded("skip", || {
            self.change(|db, batch| {
                let key = parked_key(name, position);
                if !db
                    .part(Part::RelayParked)
                    .contains_key(&key)
                    .map_err(failed)?
                {
                    return Ok(false);
                }
                batch.remove(db.part(Part::RelayParked), key);
                bump(db, batch, name, now)?;
                Ok(true)
            })
        })
    }

    fn rewind(
        &mut self,
        name: &str,
        position: u64,
        now: SystemTime,
    ) -> Result<Option<RelayRow>, StoreError> {
        super::guarded("rewind", || {
            self.change(|db, batch| {
                let Some(mut row) = relay_of(db, name)? else {
                    return Ok(None);
                };
                row.position = position;
                row.generation += 1;
                row.updated = now;
                put_relay(db, batch, &row)?;
                for (at, _) in parked_rows(db, name)? {
                    if at > position {
                        batch.remove(db.part(Part::RelayParked), parked_key(name, at));
                    }
                }
                Ok(Some(row))
            })
        })
    }
}

impl AuthorityStore for LsmOutbox {
    fn object_ids(&mut self, after: &str, limit: usize) -> Result<Vec<Arc<str>>, StoreError> {
        super::guarded("object_ids", || {
            use std::ops::Bound;
            let objects = self
                .0
                .part(Part::Objects)
                .snapshot_at(self.0.keyspace.instant());
            let start = match after {
                "" => Bound::Unbounded,
                after => Bound::Excluded(after.as_bytes().to_vec()),
            };
            objects
                .range::<Vec<u8>, _>((start, Bound::Unbounded))
                .take(limit)
                .map(|kv| {
                    let (k, _) = kv.map_err(failed)?;
                    Ok(Arc::from(utf8("object", &k)?))
                })
                .collect()
        })
    }

    fn save_waits(&mut self, records: &[WaitRecord]) -> Result<(), StoreError> {
        super::guarded("save_waits", || {
            if records.is_empty() {
                return Ok(());
            }
            let mut batch = self
                .0
                .keyspace
                .batch()
                .durability(Some(PersistMode::SyncAll));
            let waits = self.0.part(Part::AuthorityWaits);
            for record in records {
                match record {
                    WaitRecord::Failed(w) => {
                        let value = Wait {
                            reasons: Cow::Owned(w.reasons.to_string()),
                            outcome: Cow::Borrowed(w.outcome),
                            error: Cow::Borrowed(&w.error),
                            attempts: w.attempts,
                            since: ns(w.since),
                            next_try: w.next_try.map(ns),
                            at: ns(w.at),
                        };
                        batch.insert(waits, w.object_id.as_bytes(), encode(&value)?);
                    }
                    WaitRecord::Settled(id) => batch.remove(waits, id.as_bytes()),
                }
            }
            batch.commit().map_err(failed)
        })
    }
}
