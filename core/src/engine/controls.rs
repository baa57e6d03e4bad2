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
//! `--cfg snapshot_receiver_loom`. The code only a control runs lives here
//! too ([`answer_early`]); the objects' own code reads a switch and calls
//! it, with no `cfg` of its own.

use super::driver::{Answer, Done, Item, Reply};
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

/// What a control does in place of the shipped rule when its switch is
/// on: a duplicate's answer leaves when it is decided, before its group
/// committed (the pipeline model's must-fail control). Returns `done` as
/// it is to be kept.
pub(crate) fn answer_early<R: Reply>(item: &mut Item<R>, done: Done) -> Done {
    if let (Item::Deliver(_, reply), Done::Delivered(receipt, ..)) = (item, &done) {
        if matches!(receipt.decision(), Some(crate::Decision::Duplicate { .. })) {
            if let Some(reply) = reply.take() {
                reply.answer(Answer::Delivered(receipt.clone()));
            }
        }
    }
    done
}

#[cfg(snapshot_receiver_loom)]
pub use on::EarlyAnswer;

/// What turns the controls on: loom builds only.
#[cfg(snapshot_receiver_loom)]
mod on {
    use crate::engine::{Outbox, Pipeline, Shard};
    use crate::Registry;

    /// A pipeline that answers some deliveries before their group
    /// committed ([`Pipeline::answer_early`]).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum EarlyAnswer {
        /// The shipped rule: every answer after its group committed.
        Never,
        /// A duplicate is answered as soon as it is decided ("it changes
        /// nothing").
        Duplicates,
        /// When a commit fails, the steps decided on top of the failed
        /// group are answered as decided instead of being decided again.
        OnTopOfFailedGroup,
    }

    impl<R> Pipeline<R> {
        /// Answers as `early` says (the pipeline model's controls).
        pub fn answer_early(self, early: EarlyAnswer) -> Self {
            match early {
                EarlyAnswer::Never => {}
                EarlyAnswer::Duplicates => self.controls.duplicates_early.on(),
                EarlyAnswer::OnTopOfFailedGroup => self.controls.failed_group_answered.on(),
            }
            self
        }

        /// Stops once the intake drained with no pause queued, without
        /// waiting for the other drivers to go quiet (the shutdown model's
        /// control: a pause queued later is never run).
        pub fn stop_unquiet(self) -> Self {
            self.controls.stop_unquiet.on();
            self
        }
    }

    impl Shard {
        /// A variant's pause of an object another shard owns is not
        /// written with the variant but left to that shard's next group,
        /// after the variant was answered (the cross-shard pause model's
        /// control).
        pub fn pause_after_answer(&mut self) {
            self.controls.pause_after_answer.on();
        }

        /// [`Shard::evict`] also lets go of objects with writes not
        /// committed yet, and of first records not committed yet (queued
        /// for eviction when decided instead of when committed): the
        /// eviction and identity models' control.
        pub fn evict_before_commit(&mut self) {
            self.controls.evict_uncommitted.on();
        }
    }

    impl Registry {
        /// [`Registry::evict`] puts an identity in the filter of stored
        /// identities only after it left memory, outside its lock (the
        /// identity model's filter control).
        pub fn filter_after_evicting(&self) {
            self.filter_late.on();
        }
    }

    impl Outbox {
        /// An effect's position is its step's sequence number, taken when
        /// the step was decided, and a read returns the effects visible
        /// above a position in that order (what a reader by step number got
        /// before positions): the outbox model's control.
        pub fn number_at_decision(&self) {
            self.by_decision.on();
        }
    }
}
