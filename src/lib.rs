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
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use snapshot_receiver::{Ack, Decision, Receiver};
//!
//! // In memory unless `.store("sqlite:PATH")` or `postgres://...` is set.
//! let receiver = Receiver::builder()
//!     .object("card-7", 10, r#"{"stage":"queued"}"#)
//!     .build()?;
//! let receipt = receiver
//!     .deliver(br#"{"event_id":"e-1","object_id":"card-7","object_version":11,
//!         "type":"card.snapshot","state":{"stage":"ready"}}"#)
//!     .await;
//! assert_eq!((receipt.decision(), receipt.ack()), (Some(Decision::Applied), Ack::Acknowledge));
//! receiver.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! # Layout
//! This crate is the tokio receiver; the decisions themselves are made by the
//! synchronous engine in [`snapshot_receiver_core`] (re-exported as
//! [`core`]), which has no runtime, threads or IO. The crate root names what
//! an embedding service uses: the [`Receiver`] and its [`ReceiverBuilder`],
//! the [`Config`], the [`Receipt`] a delivery is answered with (its
//! [`Outcome`], [`Decision`] and [`Ack`]), the reads ([`ObjectState`],
//! [`AuditRecord`], [`MetricsSnapshot`]), reconciliation
//! ([`AuthoritativeSnapshot`], [`ReconcileReport`]) and the errors. The rest
//! is grouped in modules:
//! - [`store`]: durable stores (SQLite with feature `sqlite`, on by default;
//!   PostgreSQL with feature `postgres`), their locations and the
//!   group-commit [`store::Committer`];
//! - [`authority`]: the [`authority::AuthoritySource`] trait reconciliation
//!   fetches authoritative snapshots from, and the fetch options and report;
//! - [`reconciler`]: the background reconciler ([`Receiver::reconciler`]),
//!   which fetches authoritative snapshots from an authority source for
//!   every object that needs one, without being asked (§4);
//! - [`fixture`]: fixtures (§6), the recorded deliveries and snapshots a
//!   replay runs;
//! - [`replay`]: a fixture replayed through a receiver, and the replay
//!   report (§7);
//! - [`relay`]: durable named relays, which hand every effect of the
//!   outbox ([`Receiver::outbox`]) to an async handler at least once, per
//!   object in version order, their cursors kept in the store (§10);
//! - [`trace`]: W3C Trace Context: a delivery's [`TraceContext`] given
//!   with [`Receiver::deliver_with`] is kept with its effect
//!   ([`Effect::trace`]) and continued by the relays' destinations;
// A link only where the module is built: the documentation of every
// build resolves.
#![cfg_attr(
    feature = "jetstream",
    doc = "- [`jetstream`] (feature `jetstream`): a NATS JetStream source for several"
)]
#![cfg_attr(
    not(feature = "jetstream"),
    doc = "- `jetstream` (feature `jetstream`): a NATS JetStream source for several"
)]
//!   receiver processes sharing one PostgreSQL database;
//! - [`core`]: the engine itself. Its internals (the [`core::Shard`] step,
//!   the [`core::Registry`], the decision functions, the persist handshake,
//!   [`core::BodyParser`] and [`core::shard_of`]) are named there only.
//!
//! Inside the receiver, deliveries are routed by `object_id` to shard tasks,
//! each owning its objects (state, pause flag, held queue);
//! [`Receiver::deliver_batch`] fans a batch out with one message per shard.
//!
//! # Features
//! - `sqlite` (default): the SQLite store, bundled (no system library);
//! - `postgres`: the PostgreSQL store;
//! - `jetstream`: the NATS JetStream source.
//!
//! # Memory
//! With [`Config::default`] memory stays bounded however long the receiver
//! runs: event identities are purged after the retention window (every
//! hour by default), held and parked events are bounded by [`Limits`], and
//! the in-memory audit trail and replacements keep the most recent
//! [`Config::trail_capacity`] records ([`DEFAULT_TRAIL_CAPACITY`], oldest
//! evicted first); so does the in-memory outbox. A durable store keeps the
//! whole trail; [`Receiver::outbox`] answers an [`OutboxGap`] rather than
//! skip evicted effects. `docs/BENCHMARKS.md` (*Soak*) shows a run of millions of
//! deliveries with a flat resident set size.
//!
//! # Subscribing
//! [`Receiver::subscribe`] hands out a `tokio::sync::broadcast::Receiver`
//! of [`Notification`]s: every recorded decision and every effect, each
//! sent after its step is committed. A subscriber that falls behind loses
//! the oldest; what must reach a destination goes through the outbox
//! instead ([`Receiver::relay`]).
//!
//! # Serde
//! [`Receipt`], [`Decision`], [`Verdict`], [`ObjectState`], [`AuditRecord`],
//! [`ReconcileReport`] and [`EffectRecord`] serialize with the field names of
//! the replay report (docs/CONTRACT.md §7; the replay prints through the
//! same forms, [`core::LineFields`] and [`core::DecisionFields`]);
//! [`AuthoritativeSnapshot`] deserializes from `{"object_id", "version",
//! "state"}` with optional `"as_of"` (RFC 3339) and `"force"`.
//!
//! # Metrics
//! Every outcome is counted twice: in [`Receiver::metrics`] (keys such as
//! `decision.applied` or `held.missing_version`, zeros included) and through
//! the [`metrics`](https://docs.rs/metrics) facade, for whatever recorder the
//! embedding service installs (none: nothing is exported), as counters named
//! `snapshot_receiver_<group>_total` with one label (`decision`, `reason`,
//! `kind` or `outcome`). Every counter, its label values and its readable key
//! are one table in the repository's `docs/OPERATIONS.md` (*Metrics*).
//!
//! # Example
//! See [`Receiver`] for an embedding example that runs as a doctest, and
//! `examples/embedding.rs` for a small service (builder setters, serde
//! receipts, a subscription).

#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

pub mod authority;
pub mod fixture;
#[cfg(feature = "jetstream")]
#[cfg_attr(docsrs, doc(cfg(feature = "jetstream")))]
pub mod jetstream;
mod locks;
mod log_gate;
pub mod partition;
mod receiver;
pub mod reconciler;
pub mod relay;
pub mod replay;
pub mod store;
pub mod trace;

/// The synchronous engine this receiver drives, re-exported whole: the
/// engine's own API (shards, the registry, the decision functions, the
/// persist handshake, body parsing, the wire forms) for embedders that drive
/// shards themselves. What an embedding service names is re-exported at this
/// crate's root.
pub use snapshot_receiver_core as core;

// The receiver and how it is built.
pub use receiver::{
    BuildError, DeliveryMeta, MemoryStats, Notification, OutboxError, Receiver, ReceiverBuilder,
    DEFAULT_IDENTITY_CACHE, DEFAULT_IDENTITY_FILTER, DEFAULT_SUBSCRIBER_CAPACITY,
    DEFAULT_WORKING_SET, MAX_IDENTITY_FILTER,
};
// Its configuration.
pub use snapshot_receiver_core::{
    BudgetError, Config, EqualVersionPolicy, Limits, MemoryBudget, MemoryUse, Profile,
    ProfileError, DEFAULT_MEMORY_BUDGET, DEFAULT_RETENTION, DEFAULT_TRAIL_CAPACITY,
    MIN_MEMORY_BUDGET,
};
// What a delivery is answered with: the receipt, its decision, its ack.
pub use snapshot_receiver_core::{
    Ack, Cause, ConflictKind, Decision, HoldReason, Outcome, Receipt, RejectReason, RetryReason,
    Verdict,
};
// What the receiver holds and reports.
pub use snapshot_receiver_core::{
    AuditEntry, AuditRecord, EffectRecord, MetricsSnapshot, ObjectState, TrailGap,
};
// The outbox as a relay reads it (docs/CONTRACT.md §10).
pub use snapshot_receiver_core::{Effect, EffectId, EffectRef, OutboxGap};
// The W3C trace context a delivery may carry to its effect ([`trace`]).
pub use snapshot_receiver_core::{TraceContext, TraceContextError};
// Reconciliation from authoritative snapshots (sources: [`authority`]).
pub use snapshot_receiver_core::{
    AuthoritativeSnapshot, CanonError, ReconcileError, ReconcileReport,
};
// The clock retention is measured on, and the RFC 3339 (UTC) form times
// take in fixtures, reports and the store.
pub use snapshot_receiver_core::{format_rfc3339, parse_rfc3339, Clock, ManualClock, SystemClock};

/// Describes every metric the library counts through the
/// [`metrics`](https://docs.rs/metrics) facade (the engine's counters, the
/// relays' and the reconciler's counters and gauges) to the recorder installed now: the text
/// a Prometheus exporter writes as `# HELP`. Call it once, after installing
/// the recorder; the counts themselves do not depend on it.
pub fn describe_metrics() {
    snapshot_receiver_core::describe_metrics();
    relay::describe_metrics();
    reconciler::describe_metrics();
}

/// The README's Rust examples, compiled and run as doctests (`cargo test
/// --doc`), so the front page cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
