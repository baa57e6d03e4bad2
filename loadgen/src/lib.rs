//! Load generation, load driving and the correctness check behind
//! `snapshot-receiver loadtest` and the criterion benches.
//!
//! The flow is: [`generate`] builds a whole [`Stream`] of raw JSON bodies from a
//! [`LoadSpec`] and a seed (not timed), together with an [`Expectation`]
//! computed from the generator's own knowledge of what it emitted; one of the
//! drivers ([`run_receiver`], [`run_global_mutex`], [`run_engine`]) sends the
//! bytes and records one decision per delivery; [`check`] compares what the
//! receiver did with the expectation.
//!
//! # What the check can assert under concurrency
//! Producers race, so the order in which one object's events are decided is
//! not fixed: whether version 7 is `applied` or `stale` depends on whether
//! version 9 was decided first. The generator is built so that everything it
//! asserts is independent of that order:
//! - every version of an object is a distinct event with its own state, so
//!   the highest version wins whatever the order: a non-paused object ends at
//!   its highest delivered version and that event's state, and that event is
//!   always `applied`;
//! - an event that gets a conflicting *variant* (same `event_id`, different
//!   state) is delivered exactly twice (original and variant, never
//!   redelivered): whichever is decided first becomes the first record, the
//!   other is exactly one `conflict (event_variant)`, and the object ends
//!   paused;
//! - an equal-version conflict is a second event at the object's *highest*
//!   version with a different state: the first of the pair to be decided is
//!   `applied` (nothing higher exists), the second exactly one
//!   `conflict (version_state)`, and the object ends paused; such objects get
//!   no variants, so nothing else can pause them first;
//! - redeliveries repeat an event's exact content (byte for byte or
//!   re-encoded): exactly `copies - 1` of them are `duplicate`, each reporting
//!   the verdict the event's first record got;
//! - events for unknown objects are always `held (unknown_object)`.
//!
//! What stays order-dependent (and is therefore only checked for being one of
//! the allowed verdicts) is `applied` vs `stale` vs `held (paused)` for the
//! other events, and the final version of paused objects.
//!
//! # Layout
//! - `spec`: [`LoadSpec`], what stream to generate;
//! - `generate`: [`generate`] builds the [`Stream`] and its [`Expectation`];
//! - `code`: one compact [`Code`] per delivery outcome, [`DecisionCounts`];
//! - `drive`: the drivers ([`run_receiver`], [`run_global_mutex`],
//!   [`run_engine`]) and what a run measured ([`RunOutcome`]);
//! - `check`: [`check`], the order-independent correctness check;
//! - `durable`: with a durable store, the fsync probe before a run
//!   ([`probe_fsync`]) and the store's figures in the report ([`StoreReport`]);
//! - `probe`: `/proc` probes ([`process_cpu_time`], [`peak_rss_bytes`]);
//! - `report`: [`Report`], [`LatencySummary`] and [`Comparison`], what
//!   `loadtest` prints;
//! - `soak`: [`run_soak`], a long run over a bounded set of objects that
//!   samples the resident set size (`loadtest --soak`).

mod check;
mod code;
mod drive;
mod durable;
mod generate;
mod probe;
mod report;
mod soak;
mod spec;

pub use check::{check, CheckReport};
pub use code::{decision_code, describe_code, Code, DecisionCounts};
pub use drive::{
    run_engine, run_engine_on, run_global_mutex, run_receiver, LoadMode, RunOptions, RunOutcome,
};
pub use durable::{
    probe_dir, probe_fsync, CommitMs, CpuSplit, StoreReport, StoreRun, WaitShare, FSYNC_PROBE_TIME,
};
pub use generate::{generate, Expectation, ExpectedCounts, ExpectedObject, Stream};
pub use probe::{current_rss_bytes, peak_rss_bytes, process_cpu_time};
pub use report::{Comparison, ComparisonMedian, ComparisonRound, LatencySummary, Report};
pub use soak::{run_soak, RssSample, SoakReport, SoakSpec};
pub use spec::{LoadSpec, SpecError};
