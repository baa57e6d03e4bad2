//! The synchronous engine: per-object actors grouped in a [`Shard`], the step
//! that decides one delivery, reconciliation, and the journal that hands a
//! step's writes to whoever persists them.
//!
//! # Layout
//! Bottom up: a module names only modules above it in this list (the
//! core's `engine_layers` test checks it), so the engine has no import
//! circle. The shard's field types sit below the shard; the modules that
//! add methods to it, and its drivers, above it.
//! - `receipt`: what a step answers ([`Receipt`], [`ObjectState`], ...);
//! - `budget`: the [`MemoryBudget`] and what each kind of entry costs;
//! - `context`: [`Config`] and the [`Context`] every shard shares (registry,
//!   clock, step numbering);
//! - `controls`: the loom models' must-fail switches, off outside loom;
//! - `outbox`: the in-memory [`Outbox`] that gives every [`Effect`] its
//!   gap-free position as effects are published (docs/CONTRACT.md §10; the
//!   effect types themselves are [`crate::relay`]'s, below the engine);
//! - `trail`: the bounded in-memory audit trail and effect records
//!   ([`crate::Config::trail_capacity`], [`TrailGap`]);
//! - `objects`: the per-object actors and the maps that keep them with
//!   their bytes;
//! - `journal`: the writes of the uncommitted steps and how to undo them
//!   ([`PendingGroup`], [`Touched`]);
//! - `fetch`: a bounded shard's working-set bookkeeping and what it asks
//!   its driver to read ([`Fetch`], [`Fetched`]);
//! - `shard`: the [`Shard`] and its step ([`Shard::deliver`], a pause);
//! - `handshake`: the persist handshake ([`Shard::take_writes`],
//!   [`Shard::committed`], [`Shard::rolled_back`], [`Shard::refresh`],
//!   [`resume`]);
//! - `working`: a bounded shard's working set and identity cache
//!   ([`Shard::plan_fetch`], [`Shard::fetched`], [`Shard::evict`]);
//! - `reconcile`: authoritative snapshots ([`Shard::reconcile`]);
//! - `startup`: building and resuming a receiver's shards;
//! - `driver`: what decides who answers when: the [`ShardSet`] (routing,
//!   pause inboxes, a caller running the step of an idle shard) and a
//!   durable shard's [`Pipeline`] (decide, hand over, settle, reload);
//! - `turn_on` (loom builds only): what turns the controls on.
//!
//! # Driving a shard with a durable store
//! The engine never does IO. Whoever persists its steps runs this loop (the
//! core's [`Pipeline`] does, pipelined, for the tokio receiver's shard
//! tasks and the loom models; so can another runtime or a program with its
//! own transactions). A step's answer must not leave before its writes are
//! durable, and a failed commit must leave no trace:
//!
//! ```
//! use snapshot_receiver_core::engine::{Config, Context, Outcome, Shard};
//! use snapshot_receiver_core::write::Write;
//! use snapshot_receiver_core::{Decision, ManualClock, Verdict};
//! use std::sync::Arc;
//! use std::time::UNIX_EPOCH;
//!
//! // Stands for a database: commits all of a transaction's writes or none.
//! struct Db { rows: Vec<Write>, fail_next: bool }
//! impl Db {
//!     fn commit(&mut self, writes: Vec<Write>) -> Result<(), &'static str> {
//!         if std::mem::take(&mut self.fail_next) { return Err("disk full"); }
//!         self.rows.extend(writes);
//!         Ok(())
//!     }
//! }
//!
//! let clock = Arc::new(ManualClock::new(UNIX_EPOCH));
//! let ctx = Context::new(Config::default(), clock);
//! let mut shard = Shard::new();
//! shard.insert_object(&ctx, "card-7", 10, r#"{"stage":"queued"}"#)?;
//! shard.enable_journal(); // after resume(): from here on steps are journaled
//! let mut db = Db { rows: Vec::new(), fail_next: true };
//!
//! let body = br#"{"event_id":"e-1","object_id":"card-7","object_version":11,
//!     "occurred_at":"2099-01-01T00:00:00Z","type":"card.snapshot","state":{"stage":"ready"}}"#;
//! for attempt in 1..=2 {
//!     // 1. Decide (here one delivery; a driver decides whatever is waiting).
//!     let step = shard.deliver(&ctx, ctx.parser().parse(body)?);
//!     assert_eq!(step.receipt.outcome, Outcome::Decided(Decision::Applied));
//!     // 2. Close the group and commit its writes in one transaction.
//!     let mut group = shard.take_writes();
//!     match db.commit(group.hand_over()) {
//!         // 3a. Durable: forget the undo images, then answer the sender.
//!         Ok(()) => {
//!             shard.committed(group);
//!             assert_eq!(attempt, 2);
//!         }
//!         // 3b. Not durable: undo memory and registry, answer `retry`.
//!         Err(_) => {
//!             let touched = shard.rolled_back(&ctx, group);
//!             assert_eq!(touched.receipts.len(), 1, "e-1's first record was undone");
//!             assert_eq!(shard.object("card-7").unwrap().version, 10);
//!             assert!(ctx.registry().get("e-1").is_none());
//!         }
//!     }
//! }
//! assert_eq!(shard.object("card-7").unwrap().version, 11);
//! assert_eq!(ctx.registry().get("e-1").unwrap().decision, Verdict::Applied);
//! assert!(db.rows.iter().any(|w| matches!(w, Write::Receipt(r) if &*r.event_id == "e-1")));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! On a conflict with another writer (a condition in the writes no longer
//! holds), the driver rolls back, reloads the [`Touched`] rows from the
//! store, hands them to [`Shard::refresh`] and decides the same deliveries
//! again.

mod budget;
mod context;
mod controls;
mod driver;
mod fetch;
mod handshake;
mod journal;
mod objects;
mod outbox;
mod receipt;
mod reconcile;
mod shard;
mod startup;
mod trail;
#[cfg(snapshot_receiver_loom)]
mod turn_on;
mod working;

pub use crate::relay::{Effect, EffectId, EffectRef};
pub use budget::{
    BudgetError, MemoryBudget, MemoryUse, QueuedBytes, Reservation, DEFAULT_MEMORY_BUDGET,
    IDENTITY_COST, MIN_MEMORY_BUDGET, QUEUED_OVERHEAD, STORED_WAITING_OVERHEAD, WAITING_OVERHEAD,
};
pub use context::{Config, Context, DEFAULT_TRAIL_CAPACITY};
pub use driver::{
    Answer, Handover, Next, Outlet, Pipeline, Reply, ShardSet, Stepper, Work, MAX_BATCH, MAX_REDO,
    MAX_SHUTDOWN_ROUNDS,
};
pub use fetch::{Fetch, Fetched, IdentityCacheStats, WorkingSetStats};
pub use handshake::resume;
pub use journal::{PendingGroup, Touched};
pub(crate) use objects::{HeldEvent, ObjectActor};
pub use outbox::{Outbox, OutboxGap};
pub use receipt::{
    error_chain, Cause, EffectRecord, ObjectState, Outcome, Overridden, PauseRequest, Receipt,
    Reevaluation, ReevaluationOutcome, ReplacementCounts, RetryReason, Step, UnresolvedInput,
};
pub use reconcile::{AuthoritativeSnapshot, ReconcileError, ReconcileReport};
pub use shard::Shard;
pub use startup::{resume_from, seed_rows, start_shards, Bounds, Resumed, Sources};
pub use trail::TrailGap;
#[cfg(snapshot_receiver_loom)]
pub use turn_on::EarlyAnswer;
