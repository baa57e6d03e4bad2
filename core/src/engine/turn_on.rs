//! What turns the loom models' must-fail controls on (`controls.rs`):
//! compiled only with `--cfg snapshot_receiver_loom`. It names the objects
//! whose controls it switches, so it sits above all of them and nothing in
//! the engine names it.

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
