//! snapshot-receiver: applies incoming events to local object state without
//! treating arrival order as truth.
//!
//! Events arrive twice, late, out of order, changed under the same ID or
//! incomplete. The receiver gives every delivery exactly one recorded
//! [`Decision`] (applied, duplicate, stale, equal, conflict, held), says what
//! an acknowledgement means ([`Ack`]), pauses objects whose evidence
//! contradicts itself, and converges through reconciliation from
//! [`AuthoritativeSnapshot`]s. The contract is `SPEC.md` (§ numbers below
//! refer to it).
//!
//! # Layout
//! A delivery flows through the modules in this order:
//! - `canon`: strict single-pass JSON parser and semantic digest (SPEC §2
//!   equality: exact decimals, decoded strings, duplicate keys refused);
//! - `envelope`: bytes → [`Delivery`] (validated envelope + fingerprint), or
//!   a [`RejectReason`] over a [`Limits`] bound;
//! - `decision`: the pure decision rules of SPEC §3 ([`decide_new`]);
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
//! - `replay`: fixtures (SPEC §6) and the replay report (SPEC §7);
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

mod actor;
mod audit;
mod authority;
mod canon;
mod clock;
mod decision;
mod envelope;
pub mod jetstream;
mod journal;
#[cfg(feature = "loadtest")]
pub mod loadgen;
mod metrics;
mod profile;
mod reconcile;
pub mod reducer;
mod registry;
mod replay;
mod router;
pub mod store;
mod sync;

pub use actor::{
    Cause, Config, Context, Counters, ObjectState, Outcome, PauseRequest, Receipt, Reevaluation,
    ReevaluationOutcome, Replacement, RetryReason, Shard, Step, UnresolvedInput,
};
pub use audit::{AuditEntry, AuditRecord};
pub use authority::{
    AuthorityError, AuthoritySource, FetchOptions, FixtureAuthority, ReconcileSummary,
};
pub use canon::CanonError;
pub use clock::{format_rfc3339, parse_rfc3339, Clock, ManualClock, SystemClock};
pub use decision::{
    compare_versions, decide_new, reevaluable, Ack, ConflictKind, Decision, EqualVersionPolicy,
    EventFacts, HoldReason, ObjectView, Verdict, VersionField,
};
pub use envelope::{Delivery, Limits, RejectReason, StateJson};
pub use metrics::{DecisionCounters, MetricsSnapshot};
pub use profile::{Pointer, Profile, ProfileError};
pub use reconcile::{AuthoritativeSnapshot, ReconcileError, ReconcileReport};
pub use reducer::apply_events;
pub use registry::{Claim, IdentityRecord, Registry, DEFAULT_RETENTION};
pub use replay::{
    replay, replay_with, CardState, Fixture, FixtureDelivery, FixtureError, HistoryLine, Phase,
    Replacements, ReplayLine, ReplayOptions, ReplayReport, UnresolvedLine,
};
pub use router::{BuildError, Receiver, ReceiverBuilder};
