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
//!   paused; with [`LoadSpec::cross_variant_rate`] (0 unless set) a variant
//!   may name another known object than the original, at a version no other
//!   event carries, and both objects end paused (the second record, either
//!   one, pauses the object the first named too);
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
//! What stays order-dependent across producers is `applied` vs `stale` vs
//! `held (paused)` for the other events, and the final version of paused
//! objects. The check still judges them against what *is* ordered:
//! - the receipts and the objects must agree: every object, paused or not,
//!   is at the highest version a receipt applied, with the state of that
//!   delivery, and holds exactly the events its receipts held, so a receiver
//!   cannot apply an event to a paused object without a receipt saying so,
//!   nor say `applied` without writing the state;
//! - one producer's deliveries for one object are decided in stream order
//!   (its next call waits for the previous receipts; a batch keeps one
//!   object's order), so once a producer got the conflict receipt that
//!   paused an object, every later new event it sends for that object must
//!   be `held (paused)`, and its `applied` receipts for one object must come
//!   in rising versions. What another producer sent meanwhile is not ordered
//!   against it, so an event sent around the pause by another producer may
//!   still be `applied`, `stale` or `held (paused)`;
//! - with one producer (the single-thread engine, or `--producers 1`) the
//!   whole order is known, and every receipt is compared with an exact
//!   sequential model of the rules (`sequential.rs`), which works from the
//!   generator's knowledge of each copy and shares no code with the engine.
//!
//! # Layout
//! - `spec`: [`LoadSpec`], what stream to generate;
//! - `generate`: [`generate`] builds the [`Stream`] and its [`Expectation`];
//! - `code`: one compact [`Code`] per delivery outcome, [`DecisionCounts`];
//! - `drive`: the drivers ([`run_receiver`], [`run_global_mutex`],
//!   [`run_engine`]) and what a run measured ([`RunOutcome`]);
//! - `check`: [`check`], the correctness check (order-independent, plus
//!   each producer's own order, plus the sequential model with one producer);
//! - `sequential`: the exact sequential model of the rules for one producer;
//! - `authority`: [`StreamAuthority`], the generator's truth served as an
//!   authority (latency, outage), and [`AuthorityOptions`];
//! - `converge`: the receiver's reconciler beside a run, the wait for
//!   convergence and the un-pause latency ([`AuthorityRun`]);
//! - `durable`: with a durable store, the fsync probe before a run
//!   ([`probe_fsync`]) and the store's figures in the report ([`StoreReport`]);
//! - `probe`: `/proc` probes ([`process_cpu_time`], [`peak_rss_bytes`],
//!   [`written_bytes`]);
//! - `report`: [`Report`], [`LatencySummary`] and [`Comparison`], what
//!   `loadtest` prints;
//! - `soak`: [`run_soak`], a long run over a bounded set of objects that
//!   samples the resident set size (`loadtest --soak`).

mod authority;
mod check;
mod code;
mod converge;
mod drive;
mod durable;
mod generate;
mod probe;
mod report;
mod sequential;
mod soak;
mod spec;

pub use authority::{AuthorityCounts, AuthorityOptions, Outage, StreamAuthority};
pub use check::{check, CheckReport};
pub use code::{decision_code, describe_code, verdict_code, Code, DecisionCounts};
pub use converge::AuthorityRun;
pub use drive::{
    run_engine, run_engine_on, run_engine_reconciling, run_global_mutex, run_receiver,
    run_receiver_beside, AnswerTimes, LoadMode, RunOptions, RunOutcome,
};
pub use durable::{
    probe_dir, probe_fsync, CommitMs, CpuSplit, StoreReport, StoreRun, WaitShare, FSYNC_PROBE_TIME,
};
pub use generate::{generate, Expectation, ExpectedCounts, ExpectedObject, Stream};
pub use probe::{current_rss_bytes, peak_rss_bytes, process_cpu_time, written_bytes};
pub use report::{
    AuthorityReport, Comparison, ComparisonMedian, ComparisonRound, LatencySummary, Report,
};
pub use soak::{run_soak, RssSample, SoakReport, SoakSpec};
pub use spec::{LoadSpec, SpecError};
