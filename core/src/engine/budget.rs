//! The memory budget (docs/CONTRACT.md §9): what a receiver may keep in
//! memory, in bytes, part by part.
//!
//! Two kinds of parts:
//! - **caches** that can let go of what they hold because the durable store
//!   keeps it: the working set of objects, the identity cache, the
//!   in-memory trail. Past their bytes they evict, least recently used or
//!   oldest first;
//! - **ceilings** on what cannot leave memory: the bodies of events that
//!   wait (held, parked, malformed) when there is no store to read them
//!   back from, and the deliveries accepted but not yet answered (queued
//!   in a mailbox, decided but not committed). Past its ceiling a new one
//!   is answered `retry` ([`crate::RetryReason::MemoryFull`]), never an
//!   out-of-memory end; nothing is recorded for it. With a durable store
//!   whose shards read from it, waiting bodies stay in the store and are
//!   read back when they are decided again: the waiting part then only
//!   counts what memory keeps of each waiting event, and refuses nothing.
//! - the **relays'** part: what a relay holds of the outbox (the heads of
//!   its parked effects, the states of the round in hand). Past it a relay
//!   reads no new effect ([`crate::relay::RelaySettings::memory`]): its
//!   cursor stops, and deliveries go on.
//! - the **authority** part: the reconciler's work queue (its entries'
//!   object ids, tenants, waits and last errors). Past it a need is not
//!   queued: it stays in the store (a pause, a held or parked row) and the
//!   next scan finds it again once entries have left
//!   ([`crate::reconciler::ReconcilerSettings::memory`]).
//! - the **store** part: what the durable store's own engine keeps in the
//!   process (its caches and write buffers). The store is sized from it
//!   when the receiver opens it, and what it does not take goes to the
//!   working set ([`MemoryBudget::store`]).
//!
//! Sizes are estimates of what memory holds: the text kept (a state keeps
//! the body it came in, shared with the trail) plus a fixed cost per entry
//! measured on the project's machines (docs/BENCHMARKS.md, *Memory*). A text
//! shared by two parts counts in each, so the estimate errs on the safe side.

use crate::engine::RetryReason;
use crate::sync::{AtomicU64, Ordering};
use std::fmt;

/// One mebibyte (2^20 bytes).
const MIB: usize = 1 << 20;

/// The default total of [`MemoryBudget`]: 512 MiB, which fits a small
/// container (the process itself, its connections and the allocator's own
/// slack come on top: about 50 MiB measured for `serve`).
pub const DEFAULT_MEMORY_BUDGET: usize = 512 * MIB;

/// The smallest total [`MemoryBudget::split`] accepts: 16 MiB. Below it a
/// single body of the default size limit (1 MiB) could not wait in some
/// shards, and the budget would refuse more than it protects.
pub const MIN_MEMORY_BUDGET: usize = 16 * MIB;

/// Bytes an object costs besides its id and its state's text (its entry in
/// the map, its place in the recency queue, version, digest, flags).
pub(crate) const OBJECT_OVERHEAD: usize = 320;

/// Bytes an event identity of the cache costs besides its id (its record in
/// the registry and its place in the eviction queue).
pub(crate) const IDENTITY_OVERHEAD: usize = 160;

/// Bytes an event identity costs besides its id, for the estimate of a
/// registry that keeps every identity (no identity cache).
pub const IDENTITY_COST: usize = IDENTITY_OVERHEAD;

/// Bytes a waiting event (held, parked or malformed) costs besides its body:
/// its parsed envelope and queue slot (208 bytes), the allocations of
/// its ids and body, and for an unknown object the parking's map entry and
/// queue (docs/BENCHMARKS.md, *Memory in bytes*, compares the estimate with
/// the resident size).
pub const WAITING_OVERHEAD: usize = 512;

/// Bytes a waiting event whose body is only in the store costs besides its
/// ids (docs/CONTRACT.md §9): its entry in its queue (56 bytes inline, room
/// for twice that as the queue grows), its event identity's allocation
/// header, and for an unknown object its share of the parking's map entry.
pub const STORED_WAITING_OVERHEAD: usize = 128;

/// Bytes an audit record or a replacement of the in-memory trail costs
/// besides the text it keeps.
pub(crate) const TRAIL_OVERHEAD: usize = 160;

/// Bytes a delivery accepted but not answered costs besides its body (its
/// message, its answer channel, its place in a mailbox).
pub const QUEUED_OVERHEAD: usize = 512;

/// What a receiver may keep in memory, in bytes, part by part, over all
/// shards (each shard keeps its share, rounded up).
///
/// [`MemoryBudget::split`] divides one total the default way; the parts can
/// also be set one by one. [`MemoryBudget::default`] is
/// `split(DEFAULT_MEMORY_BUDGET)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryBudget {
    /// The working set of a durable receiver: objects' ids and states, in
    /// bytes. Past it the least recently used objects leave memory
    /// (objects that must stay, such as paused ones, stay). The in-memory
    /// receiver cannot let go of objects: for it this is a ceiling, and a
    /// step that would grow its objects past it is answered `retry`.
    pub objects: usize,
    /// The identity cache of a durable receiver, in bytes (ids and
    /// records); past it the oldest committed identities leave memory.
    pub identities: usize,
    /// Events that wait: held, parked for unknown objects, and malformed.
    /// Without a store (or one the shards cannot read from), their bodies
    /// stay in memory and this is a ceiling: an event that would pass it
    /// is answered `retry`. A durable receiver whose shards read from the
    /// store keeps a body only until its hold commits (and while it is
    /// decided again), and what it keeps of each waiting event besides
    /// (its ids, reason, place) counts here without a ceiling: it never
    /// refuses a hold for memory (docs/CONTRACT.md §9).
    pub waiting: usize,
    /// The in-memory audit trail, history and outbox (when
    /// [`crate::Config::audit`] is on); past it the oldest records leave
    /// memory, as past [`crate::Config::trail_capacity`].
    pub trail: usize,
    /// Deliveries accepted and not yet answered (in a mailbox, or decided
    /// and waiting for their commit). A ceiling: a delivery that would pass
    /// it is answered `retry` at once. The CLI's `serve` also counts each
    /// request body against it from its head to its answer, in a
    /// [`QueuedBytes`] of its own, and answers a body past it at its head.
    pub queued: usize,
    /// What a relay running in the receiver holds of the outbox: the
    /// heads of its parked effects (their states stay in the store) and
    /// the states of the round in hand. A ceiling of its own: a relay
    /// whose parked heads fill half of it stops its cursor (backlogged)
    /// instead of parking more, and a round holds its states (and their
    /// copies with the destination) within the other half
    /// ([`crate::relay::RelaySettings::memory`]). Each relay of the
    /// receiver has the whole part unless given its own share.
    pub relay: usize,
    /// The reconciler's work queue: one entry per object waiting for an
    /// authority (its id, tenant, schedule and last error), and the
    /// objects a resync found confirmed. A ceiling of its own: past it a
    /// need is not queued (it is derived from what the store holds and
    /// found again by the next scan), so the queue never passes it
    /// ([`crate::reconciler::ReconcilerSettings::memory`]). Deliveries go
    /// on.
    pub authority: usize,
    /// The durable store's own engine in this process: the caches and
    /// write buffers it keeps besides the receiver's parts. The receiver
    /// sizes its store from this part when it opens it (the `lsm:` store's
    /// block cache and memtables; SQLite's page cache of each connection
    /// the receiver opens: the committer's, its checkpoint's and one per
    /// shard), and gives what the store does not take to
    /// [`MemoryBudget::objects`]: PostgreSQL keeps its caches in its server
    /// and the in-memory receiver has no store, so for them this part is 0
    /// once built. A store's engine fills its caches up to what it was
    /// given, so it counts as used at that size.
    pub store: usize,
}

impl MemoryBudget {
    /// Divides `total` bytes the default way: five sixteenths for objects,
    /// three sixteenths for the store's engine, an eighth each for
    /// identities, waiting bodies and queued deliveries, a sixteenth for
    /// the relays, a thirty-second for the reconciler's queue, and the rest
    /// (a thirty-second) for the trail. A receiver gives what its store does not take of its part to
    /// the objects ([`MemoryBudget::store`]): half of `total` without a
    /// store.
    ///
    /// # Errors
    /// `total` is below [`MIN_MEMORY_BUDGET`].
    pub fn split(total: usize) -> Result<Self, BudgetError> {
        if total < MIN_MEMORY_BUDGET {
            return Err(BudgetError { total });
        }
        Ok(Self::parts(total))
    }

    /// `total` cut into the eight parts: objects 5/16, store 3/16,
    /// identities, waiting and queued ⅛ each, relay 1/16, authority 1/32
    /// (the trail takes what rounding left, 1/32).
    const fn parts(total: usize) -> Self {
        let eighth = total / 8;
        let sixteenth = total / 16;
        let objects = 5 * sixteenth;
        let store = 3 * sixteenth;
        let authority = total / 32;
        Self {
            objects,
            identities: eighth,
            waiting: eighth,
            queued: eighth,
            relay: sixteenth,
            authority,
            store,
            trail: total - objects - store - 3 * eighth - sixteenth - authority,
        }
    }

    /// This budget once its store's engine takes `engine` bytes: the store
    /// part becomes `engine` and what it had beyond that goes to the
    /// objects (an engine that needs more than its part takes it from the
    /// objects, never below nothing).
    pub fn with_store_engine(self, engine: usize) -> Self {
        Self {
            objects: (self.objects + self.store).saturating_sub(engine),
            store: engine,
            ..self
        }
    }

    /// The sum of the parts, in bytes.
    pub fn total(&self) -> usize {
        sum([
            self.objects,
            self.identities,
            self.waiting,
            self.trail,
            self.queued,
            self.relay,
            self.authority,
            self.store,
        ])
    }

    /// One shard's share of `part` over `shards` shards, rounded up.
    pub(crate) fn share(part: usize, shards: usize) -> usize {
        part.div_ceil(shards.max(1))
    }
}

impl Default for MemoryBudget {
    fn default() -> Self {
        Self::parts(DEFAULT_MEMORY_BUDGET)
    }
}

/// What a receiver (or one shard) keeps in memory now, in bytes, part by
/// part, beside its budget ([`crate::Shard::memory_use`]; the receiver's
/// `memory_bytes` sums its shards and adds the queued deliveries).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryUse {
    /// The budget these bytes are measured against.
    pub budget: MemoryBudget,
    /// Objects' ids and states (the working set).
    pub objects: usize,
    /// Event identities: the identity cache's committed first records when
    /// identities are bounded; otherwise an upper bound for every identity
    /// in the registry (its count times the cost of a longest id).
    pub identities: usize,
    /// Bodies of held, parked and malformed events.
    pub waiting: usize,
    /// The in-memory audit trail, history and outbox.
    pub trail: usize,
    /// Deliveries accepted and not yet answered (0 for one shard).
    pub queued: usize,
    /// What the receiver's running relays hold (0 for one shard):
    /// [`crate::relay::RelayProgress::memory`] summed.
    pub relay: usize,
    /// What the receiver's running reconcilers' work queues hold (0 for one
    /// shard): [`crate::reconciler::QueueStatus::memory`] summed.
    pub authority: usize,
    /// The durable store's engine (0 for one shard): its caches and write
    /// buffers, counted at the size the receiver gave them
    /// ([`MemoryBudget::store`]).
    pub store: usize,
}

impl MemoryUse {
    /// The sum of the parts, in bytes.
    pub fn total(&self) -> usize {
        sum([
            self.objects,
            self.identities,
            self.waiting,
            self.trail,
            self.queued,
            self.relay,
            self.authority,
            self.store,
        ])
    }
}

impl std::ops::AddAssign for MemoryUse {
    /// Adds `other`'s bytes; the budget stays this one's.
    fn add_assign(&mut self, other: Self) {
        self.objects += other.objects;
        self.identities += other.identities;
        self.waiting += other.waiting;
        self.trail += other.trail;
        self.queued += other.queued;
        self.relay += other.relay;
        self.authority += other.authority;
        self.store += other.store;
    }
}

/// A memory budget too small to be useful ([`MemoryBudget::split`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub struct BudgetError {
    /// The total asked for, in bytes.
    pub total: usize,
}

impl fmt::Display for BudgetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a memory budget of {} bytes is below the smallest accepted, {} bytes (16 MiB)",
            self.total, MIN_MEMORY_BUDGET
        )
    }
}

/// The deliveries a receiver accepted and has not answered yet, in bytes,
/// under the ceiling [`MemoryBudget::queued`]. Whoever hands deliveries to
/// the shards reserves their bytes first ([`QueuedBytes::reserve`]) and
/// keeps the reservation until the answer leaves.
#[derive(Debug)]
pub struct QueuedBytes {
    now: AtomicU64,
    limit: u64,
}

/// Bytes reserved by [`QueuedBytes::reserve`], given back when dropped.
#[derive(Debug)]
#[must_use = "the bytes are given back as soon as the reservation is dropped"]
pub struct Reservation<'a> {
    queued: &'a QueuedBytes,
    bytes: u64,
}

impl QueuedBytes {
    /// Nothing queued, under a ceiling of `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            now: AtomicU64::new(0),
            limit: limit as u64,
        }
    }

    /// Reserves `bytes` (the bodies' lengths plus [`QUEUED_OVERHEAD`] each)
    /// for deliveries about to be queued. When nothing is queued any
    /// reservation succeeds, so that every accepted body can get in.
    ///
    /// # Errors
    /// [`RetryReason::MemoryFull`] with part `queued` when the reservation
    /// would pass the ceiling; nothing is reserved then.
    pub fn reserve(&self, bytes: usize) -> Result<Reservation<'_>, RetryReason> {
        let bytes = bytes as u64;
        let before = self.now.fetch_add(bytes, Ordering::AcqRel);
        if before != 0 && before.saturating_add(bytes) > self.limit {
            self.now.fetch_sub(bytes, Ordering::AcqRel);
            return Err(RetryReason::MemoryFull {
                part: "queued",
                limit: usize::try_from(self.limit).unwrap_or(usize::MAX),
            });
        }
        Ok(Reservation {
            queued: self,
            bytes,
        })
    }

    /// The bytes reserved now.
    pub fn bytes(&self) -> usize {
        usize::try_from(self.now.load(Ordering::Acquire)).unwrap_or(usize::MAX)
    }

    /// The ceiling in bytes.
    pub fn limit(&self) -> usize {
        usize::try_from(self.limit).unwrap_or(usize::MAX)
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.queued.now.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// The eight parts added up (saturating).
fn sum(parts: [usize; 8]) -> usize {
    parts.iter().fold(0, |all, part| all.saturating_add(*part))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_split_adds_up_to_its_total() {
        let b = MemoryBudget::default();
        assert_eq!(b.total(), DEFAULT_MEMORY_BUDGET);
        assert_eq!(b.objects, 160 * MIB);
        assert_eq!(b.store, 96 * MIB);
        assert_eq!(b.identities, 64 * MIB);
        assert_eq!(b.waiting, 64 * MIB);
        assert_eq!(b.queued, 64 * MIB);
        assert_eq!(b.relay, 32 * MIB);
        assert_eq!(b.authority, 16 * MIB);
        assert_eq!(b.trail, 16 * MIB);
        let odd = MemoryBudget::split(MIN_MEMORY_BUDGET + 7).unwrap();
        assert_eq!(odd.total(), MIN_MEMORY_BUDGET + 7);
    }

    #[test]
    fn the_smallest_budget_is_accepted_and_split() {
        let b = MemoryBudget::split(MIN_MEMORY_BUDGET).unwrap();
        assert_eq!(b.total(), MIN_MEMORY_BUDGET);
        assert_eq!(
            (b.objects, b.store, b.waiting, b.relay, b.authority, b.trail),
            (5 * MIB, 3 * MIB, 2 * MIB, MIB, MIB / 2, MIB / 2)
        );
    }

    #[test]
    fn what_the_store_engine_does_not_take_goes_to_the_objects() {
        let b = MemoryBudget::default();
        // No store, or PostgreSQL: the objects get half the total.
        let none = b.with_store_engine(0);
        assert_eq!((none.objects, none.store), (256 * MIB, 0));
        assert_eq!(none.total(), DEFAULT_MEMORY_BUDGET);
        let sqlite = b.with_store_engine(20 * MIB);
        assert_eq!((sqlite.objects, sqlite.store), (236 * MIB, 20 * MIB));
        assert_eq!(sqlite.total(), DEFAULT_MEMORY_BUDGET);
        // An engine past its part takes it from the objects, not past them.
        let big = b.with_store_engine(100 * MIB);
        assert_eq!((big.objects, big.store), (156 * MIB, 100 * MIB));
        assert_eq!(big.total(), DEFAULT_MEMORY_BUDGET);
        let all = b.with_store_engine(usize::MAX);
        assert_eq!((all.objects, all.store), (0, usize::MAX));
    }

    #[test]
    fn memory_use_adds_part_by_part_and_totals_its_parts() {
        let budget = MemoryBudget::default();
        let mut a = MemoryUse {
            budget,
            objects: 1000,
            identities: 200,
            waiting: 30,
            trail: 4,
            queued: 5,
            relay: 6,
            authority: 0,
            store: 1,
        };
        assert_eq!(a.total(), 1246);
        a += MemoryUse {
            budget: MemoryBudget::split(MIN_MEMORY_BUDGET).unwrap(),
            objects: 3,
            identities: 5,
            waiting: 7,
            trail: 11,
            queued: 13,
            relay: 17,
            authority: 19,
            store: 23,
        };
        assert_eq!(
            a,
            MemoryUse {
                budget,
                objects: 1003,
                identities: 205,
                waiting: 37,
                trail: 15,
                queued: 18,
                relay: 23,
                authority: 19,
                store: 24,
            },
            "each part adds its own, the budget stays this one's"
        );
        assert_eq!(a.total(), 1344);
        let full = MemoryUse {
            objects: usize::MAX,
            queued: 1,
            ..MemoryUse::default()
        };
        assert_eq!(full.total(), usize::MAX, "the total saturates");
    }

    #[test]
    fn a_budget_below_the_smallest_is_refused_with_both_figures() {
        let e = MemoryBudget::split(MIN_MEMORY_BUDGET - 1).unwrap_err();
        assert_eq!(
            e.to_string(),
            "a memory budget of 16777215 bytes is below the smallest accepted, 16777216 bytes (16 MiB)"
        );
    }

    #[test]
    fn queued_bytes_refuse_past_the_ceiling_but_always_let_one_in() {
        let q = QueuedBytes::new(100);
        assert_eq!(q.limit(), 100);
        let big = q.reserve(150).expect("nothing queued: one always gets in");
        assert_eq!(q.bytes(), 150);
        assert_eq!(
            q.reserve(1).unwrap_err(),
            RetryReason::MemoryFull {
                part: "queued",
                limit: 100
            }
        );
        assert_eq!(q.bytes(), 150, "a refused reservation keeps nothing");
        drop(big);
        assert_eq!(q.bytes(), 0);
        let a = q.reserve(60).unwrap();
        let b = q.reserve(40).unwrap();
        assert_eq!(q.bytes(), 100);
        assert!(q.reserve(1).is_err());
        drop(a);
        let c = q.reserve(60).unwrap();
        assert_eq!(q.bytes(), 100);
        drop((b, c));
        assert_eq!(q.bytes(), 0);
    }

    /// A `card.snapshot` body for the unknown object `ghost` (so it is
    /// parked: it waits), `len` bytes long.
    fn parked_body(event_id: &str, len: usize) -> String {
        let head = format!(
            concat!(
                r#"{{"event_id":"{}","object_id":"ghost","object_version":1,"#,
                r#""occurred_at":"2099-01-01T00:00:00Z","type":"card.snapshot","#,
                r#""state":{{"pad":""#
            ),
            event_id
        );
        let pad = len - head.len() - r#""}}"#.len();
        format!("{head}{}\"}}}}", "x".repeat(pad))
    }

    /// Delivers `bodies` in turn to one in-memory shard whose waiting
    /// share is `waiting` bytes: their outcomes.
    fn park_all(waiting: usize, bodies: &[&str]) -> Vec<crate::Outcome> {
        use crate::engine::{Config, Context, Shard};
        let config = crate::engine::Config {
            shards: 1,
            memory: MemoryBudget {
                waiting,
                ..MemoryBudget::default()
            },
            ..Config::default()
        };
        let clock = crate::ManualClock::new(std::time::UNIX_EPOCH);
        let ctx = Context::new(config, std::sync::Arc::new(clock));
        let mut shard = Shard::new();
        bodies
            .iter()
            .map(|body| {
                let delivery = ctx.parser().parse(body.as_bytes()).unwrap();
                shard.deliver(&ctx, delivery).receipt.outcome
            })
            .collect()
    }

    /// The waiting share counts a body with its fixed cost
    /// ([`WAITING_OVERHEAD`]): after a first body, a second whose length
    /// alone fits what is left but whose length plus the cost does not is
    /// refused; one whose length plus the cost fills the share exactly
    /// waits.
    #[test]
    fn the_waiting_share_counts_each_body_with_its_fixed_cost() {
        use crate::{Decision, HoldReason, Outcome};
        let parked = Outcome::Decided(Decision::Held(HoldReason::UnknownObject));
        let first = parked_body("e-1", 600);
        let second = parked_body("e-2", 400);
        assert_eq!((first.len(), second.len()), (600, 400));
        let exact = 600 + WAITING_OVERHEAD + 400 + WAITING_OVERHEAD;
        assert_eq!(
            park_all(exact, &[&first, &second]),
            vec![parked.clone(), parked.clone()],
            "the second fills the share exactly: it waits"
        );
        // One byte short: the second's 400 bytes still fit (911 left),
        // with its cost they do not.
        assert_eq!(
            park_all(exact - 1, &[&first, &second]),
            vec![
                parked,
                Outcome::Retry(RetryReason::MemoryFull {
                    part: "waiting",
                    limit: exact - 1,
                })
            ],
            "the second passes the share by one byte with its cost"
        );
    }

    #[test]
    fn shares_round_up() {
        assert_eq!(MemoryBudget::share(10, 4), 3);
        assert_eq!(MemoryBudget::share(8, 4), 2);
        assert_eq!(MemoryBudget::share(8, 0), 8);
    }
}
