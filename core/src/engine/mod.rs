//! The synchronous engine: per-object actors grouped in a [`Shard`], the step
//! that decides one delivery, reconciliation, and the journal that hands a
//! step's writes to whoever persists them.
//!
//! # Layout
//! - `context`: [`Config`] and the [`Context`] every shard shares (registry,
//!   clock, step numbering);
//! - `shard`: the [`Shard`] and its step ([`Shard::deliver`], [`Shard::pause`]);
//! - `reconcile`: authoritative snapshots ([`Shard::reconcile`]);
//! - `receipt`: what a step answers ([`Receipt`], [`ObjectState`], ...);
//! - `journal`: the persist handshake ([`Shard::take_writes`],
//!   [`Shard::committed`], [`Shard::rolled_back`], [`Shard::refresh`],
//!   [`resume`]).

mod context;
mod journal;
mod receipt;
mod reconcile;
mod shard;

pub use context::{Config, Context};
pub use journal::{resume, Touched};
pub use receipt::{
    Cause, Counters, ObjectState, Outcome, Overridden, PauseRequest, Receipt, Reevaluation,
    ReevaluationOutcome, Replacement, RetryReason, Step, UnresolvedInput,
};
pub use reconcile::{AuthoritativeSnapshot, ReconcileError, ReconcileReport};
pub use shard::Shard;
pub(crate) use shard::{HeldEvent, ObjectActor};
