//! The outbox as readers and relays see it (docs/CONTRACT.md §10): one
//! API over the in-memory outbox and a durable store's.
//!
//! In memory, effects get their positions as their shards publish them
//! (the core's `Outbox`), and the relays' cursors and parked effects live in
//! this process ([`MemoryOutbox`]); with a store, both are the store's, read
//! and written on a connection of their own (never the committer's).

use super::Receiver;
use crate::core::engine::{Effect, OutboxGap};
use crate::core::relay::{ParkedEffect, ParkedStatus, RelayRow, RelaySave};
use crate::locks::lock;
use crate::store::{OutboxStore, StoreError};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// Why [`Receiver::outbox`] returned nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// In memory: effects after the position asked for were evicted (the
    /// outbox keeps [`crate::Config::trail_capacity`] effects); asking
    /// again after [`OutboxGap::evicted_through`] succeeds.
    #[error(transparent)]
    Gap(#[from] OutboxGap),
    /// The store could not be read, or there is no outbox to read (an
    /// in-memory receiver with [`crate::Config::audit`] off keeps none).
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The relays of an in-memory receiver, by name: each one's row and its
/// parked effects by position. Shared by every relay and operator call of
/// the process; gone with it.
#[derive(Default)]
pub(super) struct MemoryRelays {
    relays: BTreeMap<String, (RelayRow, BTreeMap<u64, ParkedEffect>)>,
    /// The effects some relay holds parked, by position, as the outbox
    /// had them when they were parked: the in-memory outbox lets its oldest
    /// effects go ([`crate::Config::trail_capacity`]), a parked effect
    /// stays until every relay is done with it (as a store's purge keeps
    /// its row). Their states are shared with the trail while it keeps
    /// them.
    kept: BTreeMap<u64, Effect>,
}

impl MemoryRelays {
    /// Lets go of the kept effects no relay holds parked any more.
    fn forget_done(&mut self) {
        let relays = &self.relays;
        self.kept
            .retain(|at, _| relays.values().any(|(_, parked)| parked.contains_key(at)));
    }
}

/// The in-memory receiver's [`OutboxStore`]: its outbox (positions given
/// as shards publish) and its relays. Cheap to clone a handle of; every
/// method takes a short std lock and never blocks on IO.
pub(super) struct MemoryOutbox {
    /// The receiver's shards, whose set owns the outbox.
    shards: Arc<super::Shards>,
    /// The process's relays.
    relays: Arc<Mutex<MemoryRelays>>,
}

fn no_outbox() -> StoreError {
    StoreError::Failed("this in-memory receiver keeps no outbox (Config::audit is off)".to_owned())
}

impl MemoryOutbox {
    pub(super) fn new(shards: Arc<super::Shards>, relays: Arc<Mutex<MemoryRelays>>) -> Self {
        Self { shards, relays }
    }

    fn relay_mut<'a>(
        relays: &'a mut MemoryRelays,
        name: &str,
    ) -> Option<&'a mut (RelayRow, BTreeMap<u64, ParkedEffect>)> {
        relays.relays.get_mut(name)
    }
}

impl OutboxStore for MemoryOutbox {
    /// On a gap (effects evicted before they were read), the effects kept
    /// are returned: their first position then jumps past the reader's, and
    /// a relay reports what it lost.
    fn effects_after(&mut self, after: u64, limit: usize) -> Result<Vec<Effect>, StoreError> {
        let outbox = self.shards.outbox().ok_or_else(no_outbox)?;
        match outbox.after(after, limit) {
            Ok(effects) => Ok(effects),
            Err(gap) => outbox
                .after(gap.evicted_through, limit)
                .map_err(|gap| StoreError::Failed(format!("in-memory outbox: {gap}"))),
        }
    }

    /// From the outbox, or the effects kept for the relays that parked
    /// them.
    fn effects_at(&mut self, positions: &[u64]) -> Result<Vec<Effect>, StoreError> {
        let outbox = self.shards.outbox().ok_or_else(no_outbox)?;
        let relays = lock(&self.relays);
        let mut sorted = positions.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        Ok(sorted
            .into_iter()
            .filter_map(|at| {
                relays.kept.get(&at).cloned().or_else(|| {
                    let read = outbox.after(at.checked_sub(1)?, 1).ok()?;
                    read.into_iter().next().filter(|e| e.position == at)
                })
            })
            .collect())
    }

    fn last_position(&mut self) -> Result<u64, StoreError> {
        Ok(self.shards.outbox().ok_or_else(no_outbox)?.last_position())
    }

    fn open_relay(
        &mut self,
        name: &str,
        start: u64,
        owner: Option<&str>,
        now: SystemTime,
        lease: Duration,
    ) -> Result<RelayRow, StoreError> {
        let mut relays = lock(&self.relays);
        let (row, _) = relays
            .relays
            .entry(name.to_owned())
            .or_insert_with(|| (RelayRow::new(name, start, now), BTreeMap::new()));
        if let Some(owner) = owner {
            row.take_lease(owner, now, lease);
        }
        Ok(row.clone())
    }

    fn relays(&mut self) -> Result<Vec<RelayRow>, StoreError> {
        Ok(lock(&self.relays)
            .relays
            .values()
            .map(|(row, _)| row.clone())
            .collect())
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
        let mut relays = lock(&self.relays);
        let Some((row, parked)) = Self::relay_mut(&mut relays, name) else {
            return Ok(false);
        };
        if !row.save(generation, owner, save, now, lease) {
            return Ok(false);
        }
        for p in &save.park {
            parked.insert(p.effect.position, p.clone());
        }
        for position in &save.unpark {
            parked.remove(position);
        }
        if let Some(outbox) = self.shards.outbox() {
            for p in &save.park {
                let at = p.effect.position;
                if relays.kept.contains_key(&at) {
                    continue;
                }
                let effect = outbox
                    .after(at - 1, 1)
                    .ok()
                    .and_then(|e| e.into_iter().next());
                if let Some(effect) = effect.filter(|e| e.position == at) {
                    relays.kept.insert(at, effect);
                }
            }
        }
        if !save.unpark.is_empty() {
            relays.forget_done();
        }
        Ok(true)
    }

    fn parked(&mut self, name: &str) -> Result<Vec<ParkedEffect>, StoreError> {
        Ok(lock(&self.relays)
            .relays
            .get(name)
            .map(|(_, parked)| parked.values().cloned().collect())
            .unwrap_or_default())
    }

    fn retry_failed(
        &mut self,
        name: &str,
        position: Option<u64>,
        now: SystemTime,
    ) -> Result<u64, StoreError> {
        let mut relays = lock(&self.relays);
        let Some((row, parked)) = Self::relay_mut(&mut relays, name) else {
            return Ok(0);
        };
        let mut retried = 0;
        for p in parked.values_mut() {
            if p.status == ParkedStatus::Failed && position.is_none_or(|at| at == p.effect.position)
            {
                p.status = ParkedStatus::Retrying;
                p.attempts = 0;
                p.due = Some(now);
                p.updated = now;
                retried += 1;
            }
        }
        if retried > 0 {
            row.generation += 1;
            row.updated = now;
        }
        Ok(retried)
    }

    fn skip(&mut self, name: &str, position: u64, now: SystemTime) -> Result<bool, StoreError> {
        let mut relays = lock(&self.relays);
        let Some((row, parked)) = Self::relay_mut(&mut relays, name) else {
            return Ok(false);
        };
        let skipped = parked.remove(&position).is_some();
        if skipped {
            row.generation += 1;
            row.updated = now;
            relays.forget_done();
        }
        Ok(skipped)
    }

    fn rewind(
        &mut self,
        name: &str,
        position: u64,
        now: SystemTime,
    ) -> Result<Option<RelayRow>, StoreError> {
        let mut relays = lock(&self.relays);
        let Some((row, parked)) = Self::relay_mut(&mut relays, name) else {
            return Ok(None);
        };
        row.position = position;
        row.generation += 1;
        row.updated = now;
        parked.retain(|at, _| *at <= position);
        let row = row.clone();
        relays.forget_done();
        Ok(Some(row))
    }
}

impl Receiver {
    /// At most `limit` effects (state replacements) with an outbox position
    /// above `after`, in position order: the read a relay makes
    /// (docs/CONTRACT.md §10). Positions are given as effects become
    /// visible (in memory as their shard publishes them, with a store as
    /// their group commits, in one order over every process sharing it),
    /// 1, 2, 3, ... without gaps, so a reader that asks again after the
    /// last position it got never misses an effect. A relay that keeps
    /// its cursor in the store and retries its destination is
    /// [`Receiver::relay`].
    ///
    /// With a durable store this reads the store on a connection of its
    /// own, opened at the first call (never the committer's, so it does not
    /// hold deliveries up).
    ///
    /// # Errors
    /// [`OutboxError::Gap`] in memory when an effect above `after` was
    /// evicted ([`crate::Config::trail_capacity`]); [`OutboxError::Store`]
    /// when the store cannot be read, or an in-memory receiver keeps no
    /// outbox ([`crate::Config::audit`] off).
    pub async fn outbox(&self, after: u64, limit: usize) -> Result<Vec<Effect>, OutboxError> {
        if self.inner.store.is_none() {
            let outbox = self.inner.shards.outbox().ok_or_else(no_outbox)?;
            return Ok(outbox.after(after, limit)?);
        }
        let cached = self.inner.outbox.clone();
        let mut connection = cached.lock().await;
        if connection.is_none() {
            *connection = Some(self.outbox_store().await?);
        }
        let mut store = connection.take().ok_or_else(no_outbox)?;
        let (store, read) = tokio::task::spawn_blocking(move || {
            let read = store.effects_after(after, limit);
            (store, read)
        })
        .await
        .map_err(|e| StoreError::Failed(format!("the outbox read stopped: {e}")))?;
        *connection = Some(store);
        Ok(read?)
    }

    /// A new handle on the outbox and relays (docs/CONTRACT.md §10): with a
    /// durable store, a connection of its own (every method blocks: call
    /// it from a blocking thread); in memory, this process's outbox and
    /// relays. What a relay and the operator commands
    /// read and write through.
    ///
    /// # Errors
    /// [`StoreError`] when the store cannot give a connection.
    pub async fn outbox_store(&self) -> Result<Box<dyn OutboxStore>, StoreError> {
        match &self.inner.store {
            None => Ok(Box::new(MemoryOutbox::new(
                self.inner.shards.clone(),
                self.inner.relays.clone(),
            ))),
            Some(committer) => committer.outbox_store().await?.ok_or_else(|| {
                StoreError::Failed(
                    "this store gives no second connection for its outbox (an in-memory \
                     SQLite database): give it a file"
                        .to_owned(),
                )
            }),
        }
    }
}
