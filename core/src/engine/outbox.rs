//! The outbox as a relay reads it: every effect (state replacement) with
//! its **position**, the order in which it became visible, and the
//! in-memory [`Outbox`] of a receiver without a durable store.
//!
//! A step's sequence number is taken when the step is decided, but its
//! effect becomes visible later: when its shard publishes it (in memory) or
//! when its group commits (with a store). Two shards, or two processes,
//! decide and publish in different orders, so a relay that remembers the
//! highest sequence number it saw and asks for what follows skips an effect
//! whose lower number became visible after a higher one. A position is
//! given when the effect becomes visible instead, under one lock for the
//! whole outbox (here, the [`Outbox`]'s own; with a store, the commit's),
//! so positions are 1, 2, 3, ... without gaps in the order readers can see
//! them, and "everything after my position" never skips one.
//!
//! One object's effects are made by the one shard that owns it, in step
//! order, and published in that order, so per object positions follow
//! versions.

use super::{Cause, EffectRecord};
use crate::relay::{Effect, EffectId};
use crate::sync::Mutex;
use std::collections::VecDeque;
use std::fmt;

impl Effect {
    /// The effect of a replacement made in run `origin`, published at
    /// `position`.
    pub(crate) fn published(position: u64, origin: u64, r: EffectRecord) -> Self {
        Self {
            position,
            id: EffectId { origin, seq: r.seq },
            at: r.at,
            object_id: r.object_id,
            version: r.version,
            state: r.state,
            cause_event: match r.cause {
                Cause::Event(id) => Some(id),
                Cause::Authority(_) => None,
            },
            replaces: Vec::new(),
            trace: r.trace,
        }
    }
}

/// Effects after a position were asked for, but some of them were evicted
/// from the bounded in-memory outbox ([`crate::Config::trail_capacity`]).
/// Nothing is returned rather than a list with a hole; a durable store
/// keeps every effect until its history window passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "effects after position {after} were asked for, but those up to position \
     {evicted_through} were evicted from the in-memory outbox (trail_capacity)"
)]
pub struct OutboxGap {
    /// The position the reader asked to read after.
    pub after: u64,
    /// Every effect up to this position was evicted; asking again with
    /// `after` at or above it succeeds.
    pub evicted_through: u64,
}

/// The in-memory outbox of a receiver without a durable store: the most
/// recent effects, up to a capacity, each given its position when it is
/// published, under this outbox's own lock (one order over all shards).
/// `Send + Sync`: shards publish to it and relays read it concurrently.
pub struct Outbox {
    /// The effects kept and the last position given. A std mutex through
    /// the sync facade (loom's in the models): held only to append or copy
    /// out, never across an await.
    inner: Mutex<Ring>,
    /// The outbox model's must-fail control (`controls.rs`): effects are
    /// numbered by their step's sequence number, taken when the step was
    /// decided, instead of when they are published (the numbering of
    /// before positions).
    pub(crate) by_decision: crate::sync::Switch,
}

/// What the [`Outbox`]'s lock guards.
struct Ring {
    /// The effects kept, oldest first; their positions are consecutive and
    /// the last one is `last`.
    items: VecDeque<Effect>,
    /// The last position given (0: none yet).
    last: u64,
    /// Most effects kept; the oldest are evicted first.
    capacity: usize,
}

impl Outbox {
    /// An empty outbox keeping the most recent `capacity` effects.
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: Mutex::new(Ring {
                items: VecDeque::new(),
                last: 0,
                capacity,
            }),
            by_decision: crate::sync::Switch::default(),
        }
    }

    /// Whether the outbox model's control numbers effects at decision time.
    fn numbered_at_decision(&self) -> bool {
        self.by_decision.is_on()
    }

    /// Publishes `effects` of run `origin`, in order: each gets the next
    /// position. Called while their shard is locked, so one shard's effects
    /// are published in step order.
    pub(crate) fn publish(&self, origin: u64, effects: impl IntoIterator<Item = EffectRecord>) {
        let by_decision = self.numbered_at_decision();
        let mut ring = self.inner.lock();
        for r in effects {
            ring.last += 1;
            let position = if by_decision { r.seq } else { ring.last };
            let effect = Effect::published(position, origin, r);
            if ring.capacity == 0 {
                continue;
            }
            if ring.items.len() == ring.capacity {
                ring.items.pop_front();
            }
            ring.items.push_back(effect);
        }
    }

    /// At most `limit` effects with a position above `after`, in position
    /// order (none when `after` is at or past the last position).
    ///
    /// # Errors
    /// [`OutboxGap`] when an effect above `after` was evicted.
    pub fn after(&self, after: u64, limit: usize) -> Result<Vec<Effect>, OutboxGap> {
        let by_decision = self.numbered_at_decision();
        let ring = self.inner.lock();
        if by_decision {
            // The control: what is visible above `after` by step number.
            let mut visible: Vec<Effect> = ring
                .items
                .iter()
                .filter(|e| e.position > after)
                .cloned()
                .collect();
            visible.sort_by_key(|e| e.position);
            visible.truncate(limit);
            return Ok(visible);
        }
        let evicted_through = ring.last - ring.items.len() as u64;
        if after < evicted_through {
            return Err(OutboxGap {
                after,
                evicted_through,
            });
        }
        let skip = usize::try_from(after - evicted_through).unwrap_or(usize::MAX);
        Ok(ring.items.iter().skip(skip).take(limit).cloned().collect())
    }

    /// The last position given so far (0: none).
    pub fn last_position(&self) -> u64 {
        self.inner.lock().last
    }
}

impl fmt::Debug for Outbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ring = self.inner.lock();
        f.debug_struct("Outbox")
            .field("last", &ring.last)
            .field("kept", &ring.items.len())
            .field("capacity", &ring.capacity)
            .finish()
    }
}

#[cfg(all(test, not(snapshot_receiver_loom)))]
mod tests {
    use super::*;
    use crate::envelope::StateJson;
    use std::sync::Arc;
    use std::time::UNIX_EPOCH;

    fn replacement(seq: u64, object: &str, version: u64) -> EffectRecord {
        let (state, _) = StateJson::parse(&format!(r#"{{"v":{version}}}"#), 8).unwrap();
        EffectRecord {
            seq,
            at: UNIX_EPOCH,
            object_id: Arc::from(object),
            version,
            state,
            cause: Cause::Event(Arc::from(format!("e-{seq}"))),
            forced: None,
            trace: None,
        }
    }

    fn positions(effects: &[Effect]) -> Vec<(u64, u64)> {
        effects.iter().map(|e| (e.position, e.id.seq)).collect()
    }

    #[test]
    fn positions_follow_publication_not_sequence_numbers() {
        let outbox = Outbox::new(10);
        // Step 5 published before step 3: 5 is position 1.
        outbox.publish(7, [replacement(5, "a", 2)]);
        outbox.publish(7, [replacement(3, "b", 1), replacement(4, "b", 2)]);
        assert_eq!(
            positions(&outbox.after(0, 10).unwrap()),
            [(1, 5), (2, 3), (3, 4)]
        );
        assert_eq!(positions(&outbox.after(1, 1).unwrap()), [(2, 3)]);
        assert!(outbox.after(3, 10).unwrap().is_empty());
        assert!(outbox.after(9, 10).unwrap().is_empty());
        assert_eq!(outbox.last_position(), 3);
        assert_eq!(
            outbox.after(0, 1).unwrap()[0].id.to_string(),
            "ef_0000000000000007_5"
        );
    }

    #[test]
    fn an_evicted_effect_is_a_gap_never_a_hole() {
        let outbox = Outbox::new(2);
        for seq in 1..=5 {
            outbox.publish(1, [replacement(seq, "a", seq)]);
        }
        assert_eq!(
            outbox.after(2, 10).unwrap_err(),
            OutboxGap {
                after: 2,
                evicted_through: 3
            }
        );
        assert_eq!(positions(&outbox.after(3, 10).unwrap()), [(4, 4), (5, 5)]);
    }

    #[test]
    fn capacity_zero_numbers_every_effect_and_keeps_none() {
        let outbox = Outbox::new(0);
        outbox.publish(1, [replacement(1, "a", 1), replacement(2, "a", 2)]);
        assert_eq!(outbox.last_position(), 2);
        assert_eq!(outbox.after(0, 5).unwrap_err().evicted_through, 2);
        assert!(outbox.after(2, 5).unwrap().is_empty());
    }
}
