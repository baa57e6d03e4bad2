//! snapshot-receiver: applies incoming events to local object state without
//! treating arrival order as truth.
//!
//! Events arrive twice, late, out of order, changed under the same ID or
//! incomplete. The receiver gives every delivery exactly one recorded
//! [`Decision`] (applied, duplicate, stale, equal, conflict, held), says what
//! an acknowledgement means ([`Ack`]), pauses objects whose evidence
//! contradicts itself, and converges through reconciliation from
//! [`AuthoritativeSnapshot`]s. The contract is `docs/CONTRACT.md` (§ numbers below
//! refer to it).
//!
//! # Layout
//! A delivery flows through the modules in this order:
//! - `canon`: strict single-pass JSON parser and semantic digest (docs/CONTRACT.md §2
//!   equality: exact decimals, decoded strings, duplicate keys refused);
//! - `envelope`: bytes → [`Delivery`] (validated envelope + fingerprint), or
//!   a [`RejectReason`] over a [`Limits`] bound;
//! - `decision`: the pure decision rules of docs/CONTRACT.md §3 ([`decide_new`]);
//! - `registry`: the shared event-identity [`Registry`] (first record wins);
//! - `actor`: per-object actors grouped in a [`Shard`]; one synchronous step
//!   per delivery (identity check, decision, state change, audit);
//! - `reconcile`: authoritative snapshots and re-evaluation of held events;
//! - `authority`: the [`AuthoritySource`] trait reconciliation fetches from;
//! - `router`: the tokio shell, a cloneable [`Receiver`] handle routing by
//!   `object_id` to shard tasks;
//! - `audit`: the append-only [`AuditRecord`] trail;
//! - `reducer`: [`apply_events`], a pure last-writer-wins batch reducer;
//! - `profile`: envelope [`Profile`]s (card, shipment, generic, JSON files);
//! - `store`: durable stores (SQLite, PostgreSQL) and group commit;
//! - `replay`: fixtures (docs/CONTRACT.md §6) and the replay report (docs/CONTRACT.md §7);
//! - `metrics`: [`DecisionCounters`], every decision, reason and refusal
//!   counted, readable through [`Receiver::metrics`] and exported through the
//!   `metrics` facade crate;
//! - `clock`: the injectable [`Clock`] retention is measured on;
//! - `sync`: the std/dashmap ↔ loom facade;
//! - [`loadgen`] (feature `loadtest`, on by default): seeded delivery streams,
//!   the load drivers (receiver, global-mutex baseline, single-thread engine)
//!   and the order-independent correctness check behind `loadtest` and the
//!   benches.
//! - [`jetstream`]: a NATS JetStream source for several receiver processes
//!   sharing one PostgreSQL database (partitioned stream, leases, acks after
//!   commit).
//!
//! # Example
//! See [`Receiver`] for an embedding example that runs as a doctest.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

mod authority;
#[cfg(feature = "jetstream")]
#[cfg_attr(docsrs, doc(cfg(feature = "jetstream")))]
pub mod jetstream;
mod replay;
mod router;
pub mod store;

/// The synchronous engine this receiver drives (re-exported whole for
/// embedders that drive shards themselves).
pub use snapshot_receiver_core as core;

pub use authority::{
    AuthorityError, AuthoritySource, FetchOptions, FixtureAuthority, ReconcileSummary,
};
pub use replay::{
    replay, replay_with, CardState, Fixture, FixtureDelivery, FixtureError, HistoryLine, Phase,
    Replacements, ReplayLine, ReplayOptions, ReplayReport, UnresolvedLine,
};
pub use router::{BuildError, Receiver, ReceiverBuilder};
pub use snapshot_receiver_core::{
    apply_events, compare_versions, decide_new, format_rfc3339, parse_rfc3339, reducer,
    reevaluable, Ack, AuditEntry, AuditRecord, AuthoritativeSnapshot, CanonError, Cause, Claim,
    Clock, Config, ConflictKind, Context, Counters, Decision, DecisionCounters, Delivery,
    EqualVersionPolicy, EventFacts, HoldReason, IdentityRecord, Limits, ManualClock,
    MetricsSnapshot, ObjectState, ObjectView, Outcome, PauseRequest, Pointer, Profile,
    ProfileError, Receipt, ReconcileError, ReconcileReport, Reevaluation, ReevaluationOutcome,
    Registry, RejectReason, Replacement, RetryReason, Shard, StateJson, Step, SystemClock,
    UnresolvedInput, Verdict, VersionField, DEFAULT_RETENTION,
};
