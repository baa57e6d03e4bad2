//! A shard's objects with the bytes they keep in memory (docs/CONTRACT.md
//! §9): every change goes through [`Objects::insert`], [`Objects::remove`]
//! or the guard of [`Objects::get_mut`], which count each object's state
//! and held events again when it lets go, so the totals are exact after
//! any step, rollback or reload without a walk over the map. The
//! per-object actor ([`ObjectActor`]) and a held event ([`HeldEvent`]) live
//! here too, below the shard that owns them.

use super::budget::{OBJECT_OVERHEAD, STORED_WAITING_OVERHEAD, WAITING_OVERHEAD};
use super::ObjectState;
use crate::decision::{ObjectView, Verdict};
use crate::envelope::{Envelope, MalformedBody, StateJson};
use crate::write::{HeldKey, ObjectRow};
use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

/// An event retained as held evidence.
#[derive(Clone, Debug)]
pub(crate) struct HeldEvent {
    /// Audit sequence number of its arrival in this run: re-evaluation follows it.
    pub(crate) seq: u64,
    /// Its row in a durable store (stable across restarts).
    pub(crate) key: HeldKey,
    /// How it was held.
    pub(crate) held_as: Verdict,
    /// Its event identity, kept apart from `event` so that an event whose
    /// body left memory still names itself (listing, superseding).
    pub(crate) event_id: Arc<str>,
    /// The envelope, body included; `None` once the body is only in the
    /// store (a shard that reads from the store, after the hold's commit,
    /// docs/CONTRACT.md §9): it is read back before the event is decided
    /// again ([`Shard::bodies_to_read`](super::Shard::bodies_to_read)). Boxed, so that an event without
    /// its body costs a pointer here.
    pub(crate) event: Option<Box<Envelope>>,
}

impl HeldEvent {
    /// `event`, held as `held_as` at step `seq` in row `key`, its body in
    /// memory.
    pub(crate) fn new(seq: u64, key: HeldKey, held_as: Verdict, event: Envelope) -> Self {
        Self {
            seq,
            key,
            held_as,
            event_id: event.event_id.clone(),
            event: Some(Box::new(event)),
        }
    }
}

/// A malformed body the shard holds as unresolved input.
#[derive(Clone, Debug)]
pub(crate) struct WaitingMalformed {
    /// Audit sequence number of its arrival in this run.
    pub(crate) seq: u64,
    /// Its row in a durable store.
    pub(crate) key: HeldKey,
    /// The XXH3-128 digest of its exact bytes ([`MalformedBody::digest`]),
    /// by which a redelivery is recognised; `None` for a row a shard that
    /// reads from the store resumed without its body, until a malformed
    /// delivery makes the shard read it ([`Shard::bodies_to_read`](super::Shard::bodies_to_read)).
    pub(crate) digest: Option<u128>,
    /// The `event_id`, when one could be read.
    pub(crate) event_id: Option<Arc<str>>,
    /// The `object_id`, when one could be read.
    pub(crate) object_id: Option<Arc<str>>,
    /// The body and its error, kept in memory only by a shard without a
    /// store to read it from.
    pub(crate) body: Option<MalformedBody>,
}

/// One per-object actor's state: owned by exactly one shard.
#[derive(Clone, Debug)]
pub(crate) struct ObjectActor {
    /// Current version (u64, docs/CONTRACT.md §2).
    pub(crate) version: u64,
    /// Current state text.
    pub(crate) state: StateJson,
    /// Semantic digest of `state`, for the equal-version comparison.
    pub(crate) state_digest: u128,
    /// Paused until reconciliation.
    pub(crate) paused: bool,
    /// Held events in arrival order.
    pub(crate) held: HeldQueue,
    /// The stamp of its last use in a bounded working set (0: never used
    /// there, so never evicted; see `working.rs`).
    pub(crate) used: u64,
}

impl ObjectActor {
    pub(crate) fn view(&self) -> ObjectView {
        ObjectView {
            version: self.version,
            state: self.state_digest,
            paused: self.paused,
        }
    }

    pub(crate) fn read(&self, object_id: &Arc<str>) -> ObjectState {
        ObjectState {
            object_id: object_id.clone(),
            version: self.version,
            state: self.state.clone(),
            paused: self.paused,
            held: self.held.len(),
        }
    }

    pub(crate) fn row(&self, object_id: &Arc<str>) -> ObjectRow {
        ObjectRow {
            object_id: object_id.clone(),
            version: self.version,
            state: self.state.compact(),
            paused: self.paused,
        }
    }
}

/// The map of a shard's objects, by object id.
type Map = HashMap<Arc<str>, ObjectActor, ahash::RandomState>;

/// Events waiting on one object (held, or parked while it is unknown), in
/// arrival order, with the bytes they keep.
#[derive(Clone, Debug, Default)]
pub(crate) struct HeldQueue {
    events: Vec<HeldEvent>,
    bytes: usize,
}

impl HeldQueue {
    /// Appends `event`. A queue's first event takes room for itself only:
    /// most queues (an unknown object's parked events) hold one, and a
    /// vector's first growth would take room for four.
    pub(crate) fn push(&mut self, event: HeldEvent) {
        self.bytes += held_bytes(&event);
        if self.events.capacity() == 0 {
            self.events.reserve_exact(1);
        }
        self.events.push(event);
    }

    /// The bytes the queue's events keep (bodies and per-event cost).
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Changes the events in place (their order and number stay), and
    /// counts their bytes again.
    pub(crate) fn update(&mut self, change: impl FnOnce(&mut [HeldEvent])) {
        change(&mut self.events);
        self.bytes = self.events.iter().map(held_bytes).sum();
    }

    /// The events, leaving the queue empty.
    pub(crate) fn take(&mut self) -> Vec<HeldEvent> {
        self.bytes = 0;
        std::mem::take(&mut self.events)
    }
}

impl Deref for HeldQueue {
    type Target = [HeldEvent];
    fn deref(&self) -> &[HeldEvent] {
        &self.events
    }
}

impl From<Vec<HeldEvent>> for HeldQueue {
    fn from(events: Vec<HeldEvent>) -> Self {
        let bytes = events.iter().map(held_bytes).sum();
        Self { events, bytes }
    }
}

/// What one waiting event keeps in memory: its body and its entry, or,
/// once its body is only in the store, its event identity and its entry.
pub(crate) fn held_bytes(held: &HeldEvent) -> usize {
    match &held.event {
        Some(event) => event.body.len() + WAITING_OVERHEAD,
        None => held.event_id.len() + STORED_WAITING_OVERHEAD,
    }
}

/// What an object's id and state keep in memory (its held events aside).
fn state_bytes(id: &str, object: &ObjectActor) -> usize {
    id.len() + object.state.text_len() + OBJECT_OVERHEAD
}

/// A shard's objects and the bytes they keep: states (the working set's
/// part of the budget) and held events (the waiting part).
#[derive(Default)]
pub(crate) struct Objects {
    map: Map,
    state_bytes: usize,
    held_bytes: usize,
}

impl Objects {
    /// Bytes of the objects' ids and states.
    pub(crate) fn state_bytes(&self) -> usize {
        self.state_bytes
    }

    /// Bytes of the objects' held events.
    pub(crate) fn held_bytes(&self) -> usize {
        self.held_bytes
    }

    /// Puts `object` under `id`, replacing (and returning) what was there.
    pub(crate) fn insert(&mut self, id: Arc<str>, object: ObjectActor) -> Option<ObjectActor> {
        self.state_bytes += state_bytes(&id, &object);
        self.held_bytes += object.held.bytes();
        let old = self.map.insert(id.clone(), object);
        if let Some(o) = &old {
            self.forget(&id, o);
        }
        old
    }

    /// Takes `id` out.
    pub(crate) fn remove(&mut self, id: &str) -> Option<ObjectActor> {
        let old = self.map.remove(id);
        if let Some(o) = &old {
            self.forget(id, o);
        }
        old
    }

    /// The object under `id`, to change: its bytes are counted again when
    /// the guard is dropped.
    pub(crate) fn get_mut(&mut self, id: &str) -> Option<ObjectMut<'_>> {
        let Self {
            map,
            state_bytes: states,
            held_bytes: held,
        } = self;
        let object = map.get_mut(id)?;
        *states -= state_bytes(id, object);
        *held -= object.held.bytes();
        Some(ObjectMut {
            id_len: id.len(),
            object,
            states,
            held,
        })
    }

    /// Runs `change` on the object under `id`, if there is one, and counts
    /// its bytes again.
    pub(crate) fn with<R>(
        &mut self,
        id: &str,
        change: impl FnOnce(&mut ObjectActor) -> R,
    ) -> Option<R> {
        self.get_mut(id).map(|mut o| change(&mut o))
    }

    fn forget(&mut self, id: &str, object: &ObjectActor) {
        self.state_bytes -= state_bytes(id, object);
        self.held_bytes -= object.held.bytes();
    }
}

impl Deref for Objects {
    type Target = Map;
    fn deref(&self) -> &Map {
        &self.map
    }
}

/// An object being changed ([`Objects::get_mut`]).
pub(crate) struct ObjectMut<'a> {
    id_len: usize,
    object: &'a mut ObjectActor,
    states: &'a mut usize,
    held: &'a mut usize,
}

impl Deref for ObjectMut<'_> {
    type Target = ObjectActor;
    fn deref(&self) -> &ObjectActor {
        self.object
    }
}

impl DerefMut for ObjectMut<'_> {
    fn deref_mut(&mut self) -> &mut ObjectActor {
        self.object
    }
}

impl Drop for ObjectMut<'_> {
    fn drop(&mut self) {
        *self.states += self.id_len + self.object.state.text_len() + OBJECT_OVERHEAD;
        *self.held += self.object.held.bytes();
    }
}

#[cfg(test)]
mod tests {
    //! The budget's ceilings on an in-memory shard, and the byte counts
    //! after every kind of change (docs/CONTRACT.md §9).
    use crate::engine::budget::{OBJECT_OVERHEAD, WAITING_OVERHEAD};
    use crate::engine::{AuthoritativeSnapshot, Config, Context, MemoryBudget, Outcome, Shard};
    use crate::{Decision, HoldReason, ManualClock, RetryReason};
    use std::sync::Arc;
    use std::time::{Duration, UNIX_EPOCH};

    /// A `card.snapshot` body whose state is `{"v":version,"pad":"x…"}`
    /// with `pad` bytes of padding.
    fn body(event_id: &str, object_id: &str, version: u64, pad: usize) -> String {
        format!(
            concat!(
                r#"{{"event_id":"{}","object_id":"{}","object_version":{},"#,
                r#""occurred_at":"2099-01-01T00:00:00Z","type":"card.snapshot","#,
                r#""state":{{"v":{},"pad":"{}"}}}}"#
            ),
            event_id,
            object_id,
            version,
            version,
            "x".repeat(pad)
        )
    }

    /// One in-memory shard under `memory`.
    fn shard(memory: MemoryBudget) -> (Context, Shard) {
        let config = Config {
            shards: 1,
            memory,
            ..Config::default()
        };
        let clock = ManualClock::new(UNIX_EPOCH + Duration::from_secs(100 * 86_400));
        (Context::new(config, Arc::new(clock)), Shard::new())
    }

    fn deliver(ctx: &Context, shard: &mut Shard, body: &str) -> Outcome {
        let delivery = ctx.parser().parse(body.as_bytes()).unwrap();
        shard.deliver(ctx, delivery).receipt.outcome
    }

    const PARKED: Outcome = Outcome::Decided(Decision::Held(HoldReason::UnknownObject));

    #[test]
    fn waiting_bodies_stop_at_their_share_and_make_room_when_resolved() {
        let b = |n: u64| body(&format!("e-{n}"), "ghost", n, 1000);
        let each = b(1).len() + WAITING_OVERHEAD;
        let limit = 2 * each;
        let (ctx, mut shard) = shard(MemoryBudget {
            waiting: limit,
            ..MemoryBudget::default()
        });
        assert_eq!(deliver(&ctx, &mut shard, &b(1)), PARKED);
        assert_eq!(deliver(&ctx, &mut shard, &b(2)), PARKED);
        assert_eq!(shard.memory_use().waiting, limit);
        let full = Outcome::Retry(RetryReason::MemoryFull {
            part: "waiting",
            limit,
        });
        assert_eq!(deliver(&ctx, &mut shard, &b(3)), full);
        // Nothing of the refused one was recorded: its redelivery is new.
        assert!(ctx.registry().get("e-3").is_none());
        assert_eq!(shard.memory_use().waiting, limit);
        // The authority creates the object: the parked events become held,
        // are re-decided (both applied), and leave memory.
        let authority = AuthoritativeSnapshot::new("ghost", 0, r#"{"v":0}"#, UNIX_EPOCH).unwrap();
        shard.reconcile(&ctx, &authority).unwrap();
        assert_eq!(shard.memory_use().waiting, 0);
        assert_eq!(
            deliver(&ctx, &mut shard, &b(3)),
            Outcome::Decided(Decision::Applied)
        );
    }

    #[test]
    fn one_body_always_waits_even_past_the_share() {
        let big = body("e-1", "ghost", 1, 10_000);
        let (ctx, mut shard) = shard(MemoryBudget {
            waiting: 100,
            ..MemoryBudget::default()
        });
        assert_eq!(deliver(&ctx, &mut shard, &big), PARKED);
        assert_eq!(shard.memory_use().waiting, big.len() + WAITING_OVERHEAD);
        assert_eq!(
            deliver(&ctx, &mut shard, &body("e-2", "ghost", 2, 0)),
            Outcome::Retry(RetryReason::MemoryFull {
                part: "waiting",
                limit: 100
            })
        );
    }

    #[test]
    fn an_in_memory_shard_refuses_to_grow_its_objects_past_their_share() {
        let first = body("e-1", "card-1", 1, 100);
        let start = "card-1".len() + r#"{"v":0}"#.len() + OBJECT_OVERHEAD;
        // Exactly room for card-1 at e-1's state.
        let limit = start - r#"{"v":0}"#.len() + first.len();
        let (ctx, mut shard) = shard(MemoryBudget {
            objects: limit,
            ..MemoryBudget::default()
        });
        shard
            .insert_object(&ctx, "card-1", 0, r#"{"v":0}"#)
            .unwrap();
        assert_eq!(shard.memory_use().objects, start);
        assert_eq!(
            deliver(&ctx, &mut shard, &first),
            Outcome::Decided(Decision::Applied)
        );
        assert_eq!(shard.memory_use().objects, limit);
        let bigger = body("e-2", "card-1", 2, 101);
        assert_eq!(
            deliver(&ctx, &mut shard, &bigger),
            Outcome::Retry(RetryReason::MemoryFull {
                part: "objects",
                limit
            })
        );
        assert!(ctx.registry().get("e-2").is_none(), "nothing recorded");
        assert_eq!(shard.object("card-1").unwrap().version, 1);
        // A state no larger fits; a decision that changes nothing is taken.
        assert_eq!(
            deliver(&ctx, &mut shard, &body("e-3", "card-1", 3, 100)),
            Outcome::Decided(Decision::Applied)
        );
        assert_eq!(
            deliver(&ctx, &mut shard, &body("e-4", "card-1", 2, 500)),
            Outcome::Decided(Decision::Stale)
        );
        assert_eq!(shard.memory_use().objects, limit);
    }

    #[test]
    fn a_rolled_back_group_gives_its_bytes_back() {
        let (ctx, mut shard) = shard(MemoryBudget::default());
        shard
            .insert_object(&ctx, "card-1", 0, r#"{"v":0}"#)
            .unwrap();
        shard.enable_journal();
        let before = shard.memory_use();
        // A state replacement, a parked event and a malformed body.
        deliver(&ctx, &mut shard, &body("e-1", "card-1", 1, 50));
        deliver(&ctx, &mut shard, &body("e-2", "ghost", 1, 50));
        deliver(&ctx, &mut shard, "{not json");
        let during = shard.memory_use();
        assert!(
            during.objects > before.objects && during.waiting > 0,
            "{during:?}"
        );
        let group = shard.take_writes();
        shard.rolled_back(&ctx, group);
        assert_eq!(shard.memory_use(), before);
    }
}

#[cfg(test)]
mod sizes {
    /// The estimates of [`crate::engine::budget::WAITING_OVERHEAD`] and
    /// [`crate::engine::budget::STORED_WAITING_OVERHEAD`] count a held
    /// event's inline size (and, with its body, its boxed envelope): they
    /// must stay within what the estimates leave beside the allocations.
    #[test]
    fn a_held_event_fits_the_waiting_estimates() {
        use crate::engine::budget::{STORED_WAITING_OVERHEAD, WAITING_OVERHEAD};
        let inline = std::mem::size_of::<super::HeldEvent>();
        let envelope = std::mem::size_of::<crate::envelope::Envelope>();
        assert_eq!(
            (inline, envelope),
            (56, 176),
            "a held event inline, and its envelope; the estimates count them"
        );
        assert!(2 * inline <= STORED_WAITING_OVERHEAD);
        assert!(inline + envelope <= WAITING_OVERHEAD / 2);
    }
}
