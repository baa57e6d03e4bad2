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
//! # Memory
//! With [`Config::default`] memory stays bounded however long the receiver
//! runs: event identities are purged after the retention window (every
//! hour by default), held and parked events are bounded by [`Limits`], and
//! the in-memory audit trail and replacements keep the most recent
//! [`Config::trail_capacity`] records ([`DEFAULT_TRAIL_CAPACITY`], oldest
//! evicted first). A durable store keeps the whole trail;
//! [`Receiver::effects_since`] answers a [`TrailGap`] rather than skip
//! evicted effects. `docs/BENCHMARKS.md` (*Soak*) shows a run of millions of
//! deliveries with a flat resident set size.
//!
//! # Subscribing
//! [`Receiver::subscribe`] hands out a `tokio::sync::broadcast::Receiver`
//! of [`Notification`]s: every recorded decision and every effect, each
//! sent after its step is committed.
//!
//! # Serde
//! [`Receipt`], [`Decision`], [`Verdict`], [`ObjectState`], [`AuditRecord`],
//! [`ReconcileReport`] and [`Replacement`] serialize with the field names of
//! the replay report (docs/CONTRACT.md §7; the replay prints through the
//! same forms, [`LineFields`] and [`DecisionFields`]);
//! [`AuthoritativeSnapshot`] deserializes from `{"object_id", "version",
//! "state"}` with optional `"as_of"` (RFC 3339) and `"force"`.
//!
//! # Metrics
//! Every outcome is counted twice: in [`Receiver::metrics`] (keys such as
//! `decision.applied`, zeros included) and through the
//! [`metrics`](https://docs.rs/metrics) facade, for whatever recorder the
//! embedding service installs (none: nothing is exported). The facade
//! counters, each with one label:
//!
//! | counter | label | label values |
//! |---|---|---|
//! | `snapshot_receiver_decisions_total` | `decision` | `applied`, `duplicate`, `stale`, `equal`, `conflict`, `held` |
//! | `snapshot_receiver_held_total` | `reason` | `paused`, `unknown_object`, `missing_version`, `invalid_version`, `unsupported_type`, `malformed`, `expired_identity` |
//! | `snapshot_receiver_conflicts_total` | `kind` | `event_variant`, `version_state` |
//! | `snapshot_receiver_retries_total` | `reason` | `held_queue_full`, `parking_full`, `shutting_down`, `store_failed` |
//! | `snapshot_receiver_rejects_total` | `reason` | `body_too_large`, `too_deep`, `id_too_long`, `nul_in_id`, `store_refused` |
//! | `snapshot_receiver_authority_total` | `outcome` | `applied`, `unchanged`, `refused`, `store_failed` |
//! | `snapshot_receiver_reevaluated_total` | `decision` | `applied`, `stale`, `equal`, `held`, `conflict`, `unresolved` |
//!
//! The readable key of each is `<group>.<label value>` with the group
//! `decision`, `held`, `conflict`, `retry`, `reject`, `authority` or
//! `reevaluated`. `decision.held` is the sum of the `held.*` counters and
//! `decision.conflict` the sum of the `conflict.*` counters; a duplicate
//! counts only as `decision.duplicate`. A `held` or `conflict` found on
//! re-evaluation counts in `reevaluated.*` only.
//!
//! # Example
//! See [`Receiver`] for an embedding example that runs as a doctest, and
//! `examples/embedding.rs` for a small service (builder setters, serde
//! receipts, a subscription).

#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

mod authority;
#[cfg(feature = "jetstream")]
#[cfg_attr(docsrs, doc(cfg(feature = "jetstream")))]
pub mod jetstream;
mod log_gate;
mod receiver;
mod replay;
pub mod store;

/// The synchronous engine this receiver drives (re-exported whole for
/// embedders that drive shards themselves).
pub use snapshot_receiver_core as core;

pub use authority::{AuthorityError, AuthoritySource, FetchOptions, FetchReport, FixtureAuthority};
pub use receiver::{
    BuildError, Notification, Receiver, ReceiverBuilder, DEFAULT_SUBSCRIBER_CAPACITY,
};
pub use replay::{
    parse_authority, reconcile_lines, replay, replay_with, ClockSource, FinalObject, Fixture,
    FixtureDelivery, FixtureError, HistoryLine, OverriddenLine, Phase, ReplacementsLine,
    ReplayClock, ReplayEnd, ReplayLine, ReplayOptions, ReplayReport, UnresolvedLine,
};
pub use snapshot_receiver_core::{
    format_rfc3339, parse_rfc3339, shard_of, Ack, AuditEntry, AuditRecord, AuthoritativeSnapshot,
    BodyParser, CanonError, Cause, Clock, Config, ConflictKind, Decision, Delivery,
    EqualVersionPolicy, HoldReason, Limits, ManualClock, MetricsSnapshot, ObjectState, Outcome,
    Overridden, Pointer, Profile, ProfileError, Receipt, ReconcileError, ReconcileReport,
    Reevaluation, ReevaluationOutcome, RejectReason, Replacement, ReplacementCounts, RetryReason,
    StateJson, SystemClock, TrailGap, UnresolvedInput, Verdict, DEFAULT_RETENTION,
    DEFAULT_TRAIL_CAPACITY,
};
pub use snapshot_receiver_core::{DecisionFields, LineFields};

/// The README's Rust examples, compiled and run as doctests (`cargo test
/// --doc`), so the front page cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
