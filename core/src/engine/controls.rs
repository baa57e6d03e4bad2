//! The loom models' must-fail controls, in one module. Each control breaks
//! one rule a model checks (docs/TESTING.md lists which model catches
//! which), so that a model shows it would notice the rule breaking.
//!
//! A control is a [`Switch`] kept by the object whose rule it breaks (a
//! shard, a pipeline, the registry, the outbox). Outside the loom build a
//! [`Switch`] is a zero-sized value whose [`Switch::is_on`] is the constant
//! `false`: the code it guards is unreachable and the compiler drops it,
//! and nothing can turn a control on, because what turns them on (the
//! methods below, and [`EarlyAnswer`]) exists only under
//! `--cfg snapshot_receiver_loom` (`turn_on.rs`, at the top of the engine:
//! it names the objects it switches, while this module names none of them
//! and sits below them all). The code only a control runs lives beside the
//! rule it replaces (the pipeline's `answer_early`); the objects' own code
//! reads a switch and calls it, with no `cfg` of its own.

pub(crate) use crate::sync::Switch;

/// A shard's controls.
#[derive(Default)]
pub(crate) struct ShardControls {
    /// A variant's pause of another shard's object is left to that
    /// shard's next group, after the variant was answered.
    pub(crate) pause_after_answer: Switch,
    /// Eviction lets go of objects and first records not committed yet.
    pub(crate) evict_uncommitted: Switch,
}

/// A pipeline's controls.
#[derive(Default)]
pub(crate) struct PipelineControls {
    /// A duplicate is answered when decided ([`answer_early`]).
    pub(crate) duplicates_early: Switch,
    /// After a failed commit, what was decided on top of the failed group
    /// is answered as decided.
    pub(crate) failed_group_answered: Switch,
    /// The driver stops once drained, without waiting for the others to go
    /// quiet.
    pub(crate) stop_unquiet: Switch,
}
