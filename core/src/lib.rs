//! The decision engine of snapshot-receiver: everything that decides, and
//! nothing that waits. No async runtime, no threads, no IO: the tokio
//! receiver (`snapshot-receiver`), the loom models and the fuzz targets all
//! drive this crate.
//!
//! ```
//! use snapshot_receiver_core::{Config, Context, Decision, Shard, SystemClock};
//! use std::sync::Arc;
//!
//! let ctx = Context::new(Config::default(), Arc::new(SystemClock));
//! let mut shard = Shard::new();
//! shard.insert_object(&ctx, "card-7", 10, r#"{"stage":"queued"}"#).unwrap();
//! let body = br#"{"event_id":"e-1","object_id":"card-7","object_version":11,
//!     "type":"card.snapshot","state":{"stage":"ready"}}"#;
//! // Parsing needs no shared state; deciding happens in the object's shard.
//! let delivery = ctx.parser().parse(body).expect("within the limits");
//! let step = shard.deliver(&ctx, delivery.clone());
//! assert_eq!(step.receipt.decision(), Some(Decision::Applied));
//! // The same event again: a duplicate, nothing changes.
//! let again = shard.deliver(&ctx, delivery);
//! assert!(matches!(again.receipt.decision(), Some(Decision::Duplicate { .. })));
//! ```
//!
//! # Layout
//! A delivery flows through the modules in this order:
//! - `canon`: strict single-pass JSON parser and semantic digest (exact
//!   decimals, decoded strings, duplicate keys refused; see
//!   `docs/CONTRACT.md` §2);
//! - `profile`: envelope [`Profile`]s (card, shipment, generic, JSON files);
//! - `envelope`: bytes → [`Delivery`] (validated envelope + fingerprint), or
//!   a [`RejectReason`] over a [`Limits`] bound; [`BodyParser`] is its
//!   public face, and [`shard_of`] the routing rule;
//! - `decision`: the pure decision rules ([`decide_new`]);
//! - `registry`: the shared event-identity [`Registry`] (first record wins);
//! - [`engine`]: per-object actors grouped in a [`Shard`]; one synchronous
//!   step per delivery, reconciliation, and the journal a durable store
//!   commits;
//! - `audit`: the append-only [`AuditRecord`] trail;
//! - [`relay`]: effects ([`Effect`]) and the relays that hand them out:
//!   their stored rows and the sans-IO loop ([`relay::RelayDriver`]);
//! - [`reconciler`]: the policy of fetching authoritative snapshots
//!   without being asked (the sans-IO [`reconciler::WorkQueue`]: what to
//!   fetch next, backoff, rate limit, breaker, fairness over tenants);
//! - [`write`](mod@write): the rows and writes handed to storage;
//! - [`store`]: the synchronous [`store::Store`] trait storage backends
//!   implement;
//! - `metrics`: [`DecisionCounters`], every outcome counted;
//! - [`reducer`]: [`apply_events`], a pure last-writer-wins batch reducer;
//! - `clock`: the injectable [`Clock`] retention is measured on;
//! - `trace`: the W3C [`TraceContext`] a delivery may carry to its effect;
//! - `wire`: the serde forms of receipts, decisions, object reads, audit
//!   records and reconciliation reports ([`LineFields`], [`DecisionFields`]:
//!   the replay report's field names), and the `Deserialize` of
//!   [`AuthoritativeSnapshot`];
//! - `sync`: the std/dashmap ↔ loom facade.

#![warn(missing_docs)]

mod audit;
mod canon;
mod clock;
mod decision;
pub mod engine;
mod envelope;
mod metrics;
mod parser;
mod profile;
pub mod reconciler;
pub mod reducer;
mod registry;
pub mod relay;
pub mod store;
mod sync;
// unsafe: a counting `GlobalAlloc` (an unsafe trait) for the unit tests
// that check an owner of raw memory frees what it allocated.
#[cfg(all(test, not(snapshot_receiver_loom)))]
#[allow(unsafe_code)]
mod test_alloc;
mod trace;
mod wire;
pub mod write;

pub use audit::{AuditEntry, AuditRecord};
pub use canon::CanonError;
pub use clock::{format_rfc3339, parse_rfc3339, Clock, ManualClock, SystemClock};
pub use decision::{
    compare_versions, decide_new, reevaluable, Ack, ConflictKind, Decision, EqualVersionPolicy,
    EventFacts, HoldReason, ObjectView, UnknownObjectPolicy, Verdict, VersionField,
};
pub use engine::{
    error_chain, AuthoritativeSnapshot, BudgetError, Cause, Config, Context, Effect, EffectId,
    EffectRecord, EffectRef, MemoryBudget, MemoryUse, ObjectState, Outbox, OutboxGap, Outcome,
    Overridden, PauseRequest, Receipt, ReconcileError, ReconcileReport, Reevaluation,
    ReevaluationOutcome, ReplacementCounts, RetryReason, Shard, Step, TrailGap, UnresolvedInput,
    DEFAULT_MEMORY_BUDGET, DEFAULT_TRAIL_CAPACITY, MIN_MEMORY_BUDGET,
};
pub use envelope::{Delivery, Limits, RejectReason, StateJson};
pub use metrics::{describe as describe_metrics, DecisionCounters, MetricsSnapshot};
pub use parser::{route, shard_of, BodyParser};
pub use profile::{Pointer, Profile, ProfileError};
pub use reducer::apply_events;
pub use registry::{
    Claim, FilterStats, IdentityFilter, IdentityRecord, Registry, DEFAULT_RETENTION,
};
pub use trace::{TraceContext, TraceContextError, MAX_TRACESTATE};
pub use wire::{DecisionFields, LineFields};
