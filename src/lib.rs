//! snapshot-receiver: applies incoming events to local object state without
//! treating arrival order as truth.
//!
//! Events arrive twice, late, out of order, changed under the same ID or
//! incomplete. The receiver gives every delivery exactly one recorded
//! [`Decision`] (applied, duplicate, stale, equal, conflict, held), says what
//! an acknowledgement means ([`Ack`]), pauses objects whose evidence
//! contradicts itself, and converges through reconciliation from
//! [`AuthoritativeSnapshot`]s. The contract is `docs/CONTRACT.md` (§ numbers
//! below refer to it).
//!
//! # Layout
//! This crate is the tokio receiver; the decisions themselves are made by the
//! synchronous engine in [`snapshot_receiver_core`] (re-exported as
//! [`core`]), which has no runtime, threads or IO.
//! - `receiver`: the cloneable [`Receiver`] handle and its
//!   [`ReceiverBuilder`]; deliveries are routed by `object_id` to shard
//!   tasks, each owning its objects (state, pause flag, held queue);
//!   [`Receiver::deliver_batch`] fans a batch out with one message per shard;
//! - [`store`]: durable stores (SQLite with feature `sqlite`, on by default;
//!   PostgreSQL with feature `postgres`) and the group-commit [`store::Committer`];
//! - `authority`: the [`AuthoritySource`] trait reconciliation fetches
//!   authoritative snapshots from;
//! - `replay`: fixtures (§6) and the replay report (§7);
//! - [`jetstream`] (feature `jetstream`): a NATS JetStream source for several
//!   receiver processes sharing one PostgreSQL database.
//!
//! Engine internals (the [`core::Shard`] step, the [`core::Registry`], the
//! decision functions, the persist handshake) are the core crate's own API.
//!
//! # Features
//! - `sqlite` (default): the SQLite store, bundled (no system library);
//! - `postgres`: the PostgreSQL store;
//! - `jetstream`: the NATS JetStream source.
//!
//! # Example
//! See [`Receiver`] for an embedding example that runs as a doctest.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

mod authority;
#[cfg(feature = "jetstream")]
#[cfg_attr(docsrs, doc(cfg(feature = "jetstream")))]
pub mod jetstream;
mod receiver;
mod replay;
pub mod store;

/// The synchronous engine this receiver drives (re-exported whole for
/// embedders that drive shards themselves).
pub use snapshot_receiver_core as core;

pub use authority::{
    AuthorityError, AuthoritySource, FetchOptions, FixtureAuthority, ReconcileSummary,
};
pub use receiver::{BuildError, Receiver, ReceiverBuilder};
pub use replay::{
    parse_authority, reconcile_lines, replay, replay_with, CardState, ClockSource, Fixture,
    FixtureDelivery, FixtureError, HistoryLine, OverriddenLine, Phase, Replacements, ReplayClock,
    ReplayEnd, ReplayLine, ReplayOptions, ReplayReport, UnresolvedLine,
};
pub use snapshot_receiver_core::{
    format_rfc3339, parse_rfc3339, shard_of, Ack, AuditEntry, AuditRecord, AuthoritativeSnapshot,
    BodyParser, CanonError, Cause, Clock, Config, ConflictKind, Counters, Decision, Delivery,
    EqualVersionPolicy, HoldReason, Limits, ManualClock, MetricsSnapshot, ObjectState, Outcome,
    Overridden, Pointer, Profile, ProfileError, Receipt, ReconcileError, ReconcileReport,
    Reevaluation, ReevaluationOutcome, RejectReason, Replacement, RetryReason, StateJson,
    SystemClock, UnresolvedInput, Verdict, DEFAULT_RETENTION,
};
