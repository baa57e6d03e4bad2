//! The loom models, one `loom::model` per scenario (one test binary with
//! topic modules). Each model function is shared by two runs:
//! - the normal suite (`--cfg snapshot_receiver_loom`): every interleaving
//!   must keep every invariant;
//! - the broken-registry suite (`--cfg snapshot_receiver_loom_broken` as
//!   well, `broken.rs`): the registry's insert becomes check-then-insert, and
//!   loom must find an interleaving that breaks the models that depend on it.
//!
//! Run both with `loom-tests/run.sh`.
#![cfg(snapshot_receiver_loom)]

mod broken;
// Model 10 and its control run only in the first suite (no identity is
// claimed by two shards).
#[cfg(not(snapshot_receiver_loom_broken))]
mod cross_pause;
mod duplicate;
// Model 8 (one shard, no identity claimed by two) and its control run only
// in the first suite: compiled out of the racy one, where nothing calls them.
#[cfg(not(snapshot_receiver_loom_broken))]
mod eviction;
mod identities;
// Model 11 and its control run only in the first suite (no identity is
// claimed twice).
#[cfg(not(snapshot_receiver_loom_broken))]
mod outbox;
mod pause_race;
mod pipeline;
mod purge;
mod reconcile;
// Model 12 and its control run only in the first suite (no identity is
// claimed by two shards).
#[cfg(not(snapshot_receiver_loom_broken))]
mod shutdown;
mod variant;
mod versions;

/// Card states used across the models (JSON text).
mod states {
    /// card-7's initial state in the fixture.
    pub const QUEUED_MAP: &str = r#"{"stage":"queued","label":"Map"}"#;
    /// e-201's state in the fixture.
    pub const READY_MAP: &str = r#"{"stage":"ready","label":"Map"}"#;
    /// The state of e-202's variant in the fixture.
    pub const QUEUED_MAP_DRAFT: &str = r#"{"stage":"queued","label":"Map draft"}"#;
    /// card-8's initial state in the fixture.
    pub const READY_CHART: &str = r#"{"stage":"ready","label":"Chart"}"#;
    /// e-206's state in the fixture.
    pub const REVIEW_CHART: &str = r#"{"stage":"review","label":"Chart"}"#;
    /// e-203's state in the fixture (and card-7's authority).
    pub const ARCHIVED_MAP_V2: &str = r#"{"stage":"archived","label":"Map v2"}"#;
}
