//! One round of a relay, planned: which effects each object hands out
//! next ([`Plan::round`]), and what the destination's answers change
//! ([`Plan::settle`]). Plain synchronous code over the relay's state as
//! last read or saved; [`super::RelayDriver`] runs it.

use super::driver::Jitter;
use super::{Effect, EffectRef, HandlerError, ParkedEffect, ParkedStatus, RelayRow, RelaySave};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// One object's effects handed out in one round, in position order: its
/// first parked effect being retried (and those waiting behind it), then
/// its new ones. Made by [`Plan::round`].
#[derive(Debug)]
pub(crate) struct Chain {
    /// The effects, with what each was parked as (`None`: new).
    pub(crate) items: Vec<(Effect, Option<ParkedEffect>)>,
}

impl Chain {
    /// What the destination is given for this chain, in order: every
    /// effect; or, coalescing several, only the newest, naming the others
    /// in its [`Effect::replaces`]. The destination is given them one at a
    /// time, the next only once the previous one was accepted.
    pub(crate) fn sends(&self, coalesce: bool) -> Vec<Effect> {
        match self.items.split_last() {
            Some(((newest, _), earlier)) if coalesce && !earlier.is_empty() => {
                let mut newest = newest.clone();
                newest.replaces = earlier.iter().map(|(e, _)| EffectRef::from(e)).collect();
                vec![newest]
            }
            _ => self.items.iter().map(|(e, _)| e.clone()).collect(),
        }
    }

    /// What became of the chain when the destination accepted the first
    /// `accepted` of its [`Chain::sends`] (same `coalesce`) and then
    /// refused the next with `refused` (`None`: it accepted them all). A
    /// coalesced send stands for the whole chain: accepted, every effect
    /// is delivered; refused, none is.
    pub(crate) fn outcome(
        self,
        accepted: usize,
        refused: Option<HandlerError>,
        coalesce: bool,
    ) -> Outcome {
        let items = self.items.len();
        let delivered = if coalesce && items > 1 {
            if accepted >= 1 {
                items
            } else {
                0
            }
        } else {
            accepted.min(items)
        };
        Outcome {
            chain: self,
            delivered,
            refused,
        }
    }
}

/// What became of a chain: how many of its items were delivered, and the
/// refusal of the next one, if any (the rest were not handed out). Made
/// by [`Chain::outcome`], given to [`Plan::settle`].
#[derive(Debug)]
pub(crate) struct Outcome {
    /// The chain as it was handed out.
    pub(crate) chain: Chain,
    /// Items delivered, from the first.
    pub(crate) delivered: usize,
    /// The refusal that stopped it (of item `delivered`).
    pub(crate) refused: Option<HandlerError>,
}

/// A relay's state between rounds, and the planning of a round.
#[derive(Debug)]
pub(crate) struct Plan {
    /// The relay's row as last read or saved.
    pub(crate) row: RelayRow,
    /// Its parked effects (their heads: the states stay in the store), by
    /// position.
    pub(crate) parked: BTreeMap<u64, ParkedEffect>,
    /// What the parked effects cost in memory
    /// ([`ParkedEffect::memory_bytes`] summed), in bytes.
    pub(crate) parked_bytes: usize,
}

impl Plan {
    /// The state of a relay whose row was read as `row` (its lease held by
    /// this run) with its `parked` effects.
    pub(crate) fn new(row: RelayRow, parked: Vec<ParkedEffect>) -> Self {
        let parked_bytes = parked.iter().map(ParkedEffect::memory_bytes).sum();
        Self {
            row,
            parked: parked.into_iter().map(|p| (p.effect.position, p)).collect(),
            parked_bytes,
        }
    }

    /// The positions of the parked effects a round at `now` hands out, in
    /// position order, whose states are read back: every object whose
    /// first parked effect is due (or `waiting`: the one before it is
    /// gone, delivered or skipped by an operator) with those parked behind
    /// it; at most `limit` effects whose states add up to at most
    /// `max_bytes` (always the first, however large, so that it moves).
    /// Past the first that does not fit, none is taken: what a round
    /// leaves waits for the next one, in order.
    pub(crate) fn due(&self, now: SystemTime, limit: usize, max_bytes: usize) -> Vec<u64> {
        let mut taken = Vec::new();
        let mut bytes = 0usize;
        let mut going: HashSet<&Arc<str>> = HashSet::new();
        let mut blocked: HashSet<&Arc<str>> = HashSet::new();
        for p in self.parked.values() {
            let object = &p.effect.object_id;
            if blocked.contains(object) {
                continue;
            }
            let goes = going.contains(object)
                || match p.status {
                    ParkedStatus::Waiting => true,
                    ParkedStatus::Retrying => p.due.is_none_or(|d| d <= now),
                    ParkedStatus::Failed => false,
                };
            if !goes {
                blocked.insert(object);
                continue;
            }
            let fits = bytes.saturating_add(p.effect.bytes) <= max_bytes;
            if taken.len() >= limit || (!taken.is_empty() && !fits) {
                break;
            }
            bytes = bytes.saturating_add(p.effect.bytes);
            going.insert(object);
            taken.push(p.effect.position);
        }
        taken
    }

    /// The chains of a round at `now`, given the parked effects read back
    /// (`loaded`: those [`Plan::due`] named, as the store had them) and
    /// the `new` effects read after the cursor: an object whose parked
    /// effects were read back starts with them; objects with nothing
    /// parked go with their new effects. New effects of an object with a
    /// parked effect not read back (not due, failed, or past the round's
    /// bytes) are parked `waiting` (returned apart).
    pub(crate) fn round(
        &self,
        now: SystemTime,
        loaded: Vec<Effect>,
        new: Vec<Effect>,
    ) -> (Vec<Chain>, Vec<ParkedEffect>) {
        let mut loaded: HashMap<u64, Effect> =
            loaded.into_iter().map(|e| (e.position, e)).collect();
        let mut chains: Vec<Chain> = Vec::new();
        let mut chain_of: HashMap<Arc<str>, usize> = HashMap::new();
        let mut blocked: HashSet<Arc<str>> = HashSet::new();
        // In position order: an object's first parked effect is its head.
        for p in self.parked.values() {
            let object = &p.effect.object_id;
            if blocked.contains(object) {
                continue;
            }
            let Some(effect) = loaded.remove(&p.effect.position) else {
                // Not due, or not read back (past the round's bytes; or
                // skipped by an operator since, whose change the save
                // finds): the object waits.
                blocked.insert(object.clone());
                continue;
            };
            if let Some(&i) = chain_of.get(object) {
                chains[i].items.push((effect, Some(p.clone())));
            } else {
                chain_of.insert(object.clone(), chains.len());
                chains.push(Chain {
                    items: vec![(effect, Some(p.clone()))],
                });
            }
        }
        let mut waiting = Vec::new();
        for effect in new {
            if self.parked.contains_key(&effect.position) {
                // Read again after a rewind that kept it parked.
                continue;
            }
            if blocked.contains(&effect.object_id) {
                waiting.push(ParkedEffect::waiting(&effect, now));
            } else if let Some(&i) = chain_of.get(&effect.object_id) {
                chains[i].items.push((effect, None));
            } else {
                chain_of.insert(effect.object_id.clone(), chains.len());
                chains.push(Chain {
                    items: vec![(effect, None)],
                });
            }
        }
        (chains, waiting)
    }

    /// What a round's `outcomes` change, at `now`, with the `waiting`
    /// effects [`Plan::round`] parked and the cursor moved to `position`:
    /// the save to make. Delivered parked effects are unparked; a refused
    /// effect is parked `retrying`, due after the `schedule`'s next wait
    /// jittered by `jitter` (or the destination's longer `Retry-After`, at
    /// most [`super::MAX_WAIT`]), or `failed` when its schedule is
    /// exhausted; the effects behind it are parked `waiting`.
    pub(crate) fn settle(
        &self,
        now: SystemTime,
        outcomes: Vec<Outcome>,
        waiting: Vec<ParkedEffect>,
        position: u64,
        schedule: &[Duration],
        jitter: &mut Jitter,
    ) -> RelaySave {
        let mut save = RelaySave {
            park: waiting,
            unpark: Vec::new(),
            position: position.max(self.row.position),
            ..RelaySave::default()
        };
        for outcome in outcomes {
            let mut items = outcome.chain.items.into_iter();
            for (_, parked) in items.by_ref().take(outcome.delivered) {
                if let Some(p) = parked {
                    save.unpark.push(p.effect.position);
                }
            }
            let Some(refusal) = outcome.refused else {
                continue;
            };
            if let Some((effect, parked)) = items.next() {
                let attempts = parked.map_or(0, |p| p.attempts).saturating_add(1);
                let wait = schedule
                    .get(usize::try_from(attempts - 1).unwrap_or(usize::MAX))
                    .map(|step| jitter.wait(*step, refusal.retry_after));
                save.park.push(ParkedEffect {
                    effect: effect.head(),
                    status: if wait.is_some() {
                        ParkedStatus::Retrying
                    } else {
                        ParkedStatus::Failed
                    },
                    attempts,
                    due: wait.map(|w| now.checked_add(w).unwrap_or(now)),
                    error: Some(refusal.message),
                    updated: now,
                });
            }
            for (effect, parked) in items {
                if parked.is_none() {
                    save.park.push(ParkedEffect::waiting(&effect, now));
                }
            }
        }
        save
    }

    /// The bytes the parked effects' heads would take once `save` is taken
    /// in ([`Plan::saved`]): those it unparks gone, those it parks added
    /// (replacing any parked at the same position).
    pub(crate) fn bytes_after(&self, save: &RelaySave) -> usize {
        let mut bytes = self.parked_bytes;
        let mut gone = HashSet::new();
        for position in &save.unpark {
            if let Some(p) = self.parked.get(position).filter(|_| gone.insert(*position)) {
                bytes -= p.memory_bytes();
            }
        }
        for p in &save.park {
            bytes += p.memory_bytes();
            let position = p.effect.position;
            if let Some(replaced) = self.parked.get(&position).filter(|_| gone.insert(position)) {
                bytes -= replaced.memory_bytes();
            }
        }
        bytes
    }

    /// Takes a save the store accepted into the state.
    pub(crate) fn saved(&mut self, save: RelaySave, now: SystemTime) {
        for position in &save.unpark {
            if let Some(gone) = self.parked.remove(position) {
                self.parked_bytes -= gone.memory_bytes();
            }
        }
        for p in save.park {
            self.parked_bytes += p.memory_bytes();
            if let Some(replaced) = self.parked.insert(p.effect.position, p) {
                self.parked_bytes -= replaced.memory_bytes();
            }
        }
        self.row.position = save.position;
        self.row.updated = now;
    }

    /// When the first parked effect that is not due becomes due.
    pub(crate) fn next_due(&self) -> Option<SystemTime> {
        self.parked
            .values()
            .filter(|p| p.status == ParkedStatus::Retrying)
            .filter_map(|p| p.due)
            .min()
    }
}
