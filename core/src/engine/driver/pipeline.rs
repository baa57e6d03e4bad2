//! One durable shard's group commit, pipelined ([`Pipeline`]), and the loop
//! policy that tells its driver what to do next ([`Pipeline::next`]).

use super::ShardSet;
use super::{process, Answer, Done, Item, Outlet, Ran, Refusal, Reply, Work, MAX_REDO};
use crate::engine::controls::PipelineControls;
use crate::engine::journal::PendingGroup;
use crate::engine::{Context, Fetch, Fetched, Touched};
use crate::store::StoreError;
use crate::write::{Reloaded, Write};
use std::borrow::Borrow;
use std::collections::VecDeque;

/// Steps decided together and committed in one transaction, with what each
/// will hand out once the commit is known.
struct Group<R> {
    /// The items, in the order they were decided.
    items: Vec<Item<R>>,
    /// What each produced (same index).
    done: Vec<Done>,
    /// How many times the group was decided again after a conflict.
    redo: usize,
    /// Deliveries the store refused to record: when the group is decided
    /// again (after the refusal, or after a conflict), they are answered
    /// `reject` instead of being decided (see [`refuse`]).
    refused: Vec<Refusal>,
}

impl<R> Default for Group<R> {
    fn default() -> Self {
        Self {
            items: Vec::new(),
            done: Vec::new(),
            redo: 0,
            refused: Vec::new(),
        }
    }
}

impl<R> Group<R> {
    /// Whether a read waits in the group: it must see the shard as the
    /// group leaves it, so nothing is decided on top until it is answered.
    fn reads(&self) -> bool {
        self.items.iter().any(|w| matches!(w, Item::Read(_)))
    }
}

/// What [`Pipeline::hand_over`] did.
#[must_use = "a group's writes must be committed and the result settled"]
#[derive(Debug)]
pub enum Handover {
    /// Nothing: a group is already in the store's hands, or nothing is
    /// decided.
    Idle,
    /// The decided group changed nothing a store keeps: it counted as
    /// committed at once and was answered.
    Answered,
    /// Commit these writes in one transaction, then report the result with
    /// [`Pipeline::settle`].
    Commit(Vec<Write>),
}

/// One durable shard's group commit, pipelined: while one group of steps is
/// in the store's hands, what arrives is decided on top of the uncommitted
/// journal, so the next group is ready the moment the commit ends. Answers
/// leave only after their own group committed, in order; a failed commit
/// rolls memory and registry back to the last committed step, answers
/// `retry` to the failed group and decides the later steps again.
///
/// The caller owns the loop: it brings work ([`Pipeline::decide`]), commits
/// what [`Pipeline::hand_over`] gives it, reports the result
/// ([`Pipeline::settle`]) and, after a conflict, the reloaded rows
/// ([`Pipeline::reloaded`]). `R` is the caller's reply token.
pub struct Pipeline<R> {
    /// The shard it drives, in its [`ShardSet`].
    shard: usize,
    /// Decided, waiting for the group in flight to be answered.
    next: Group<R>,
    /// In the store's hands, with the journal's number for it.
    in_flight: Option<(Group<R>, PendingGroup)>,
    /// After a conflict: the refused group and what was decided on top of
    /// it, until the reloaded rows come back.
    reloading: Option<(Group<R>, Group<R>)>,
    /// Work taken in and not decided yet, in order: it waits for a read
    /// from the store, or behind the item that does.
    undecided: VecDeque<Item<R>>,
    /// What the first of `undecided` decided before it stopped for a read
    /// (a [`Work::DeliverMany`]'s first deliveries): no group is handed
    /// over until it is whole, so that one item's steps commit together.
    partial: Option<Done>,
    /// The read the shard asked for, not handed to the driver yet
    /// ([`Next::Fetch`]).
    fetch: Option<Fetch>,
    /// Whether what waits undecided was planned ([`crate::Shard::plan_fetch`]):
    /// new items make it `false`.
    planned: bool,
    /// A read is in the driver's hands ([`Pipeline::fetched`] ends it).
    fetching: bool,
    /// Where the driver's intake stands ([`Pipeline::next`]).
    intake: Intake,
    /// A group was just answered: its callers are about to send again.
    answered: bool,
    /// This driver told the set it raises no more pauses.
    quiet: bool,
    /// Rounds in a row, after the intake drained, in which only pauses were
    /// left and the store did not record them.
    idle_rounds: usize,
    /// The loom models' must-fail controls of a pipeline (`controls.rs`).
    pub(crate) controls: PipelineControls,
}

/// Where a driver's intake (its mailbox) stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Intake {
    /// Work may still arrive.
    Open,
    /// A shutdown arrived: nothing new is accepted, what was accepted is
    /// still taken.
    Closing,
    /// Closed and empty.
    Drained,
}

/// Most items one round takes from a driver's intake; also the most a
/// decided group holds before the driver stops taking more ([`Next::Wait`]).
pub const MAX_BATCH: usize = 256;

/// Rounds after the intake drained in which a driver tries to record the
/// pauses still queued before it gives up on a store that keeps refusing
/// them (they are logged) and stops.
pub const MAX_SHUTDOWN_ROUNDS: usize = 3;

/// What a driver's loop does next ([`Pipeline::next`]).
#[must_use = "the driver must do what the pipeline asks"]
#[derive(Debug)]
pub enum Next {
    /// Commit these writes in one transaction, then report the result with
    /// [`Pipeline::settle`] (and, after a conflict, the rows it names with
    /// [`Pipeline::reloaded`]).
    Commit(Vec<Write>),
    /// A bounded shard needs rows from the store before it decides what
    /// waits: read them on the shard's own connection, off the async
    /// worker ([`Fetch::read`] on a blocking thread), and hand the result
    /// back with [`Pipeline::fetched`]. Until then nothing more is decided
    /// and [`Next::Wait`] takes no work.
    Fetch(Fetch),
    /// A group was just answered and another is decided: let the callers
    /// just answered run first (a tokio driver yields), and decide what
    /// they sent meanwhile ([`Pipeline::decide`], up to
    /// [`Pipeline::room`] items, nothing at all is fine) so that it joins
    /// the group handed over next instead of waiting a whole commit.
    Rejoin,
    /// Wait for the first of what is enabled, then ask again:
    /// - `commit`: the result of the group in the store's hands (report it
    ///   with [`Pipeline::settle`]);
    /// - `wake`: a wake-up ([`Outlet::wake`]); then decide what the intake
    ///   holds, or, when it holds nothing, report the wake-up
    ///   ([`Pipeline::woken`]);
    /// - `receive`: work from the intake, at most this many items (0: do
    ///   not take any); decide it, or report that the intake is closed
    ///   ([`Pipeline::closing`]) or drained ([`Pipeline::drained`]).
    Wait {
        /// A group is in the store's hands.
        commit: bool,
        /// A wake-up counts.
        wake: bool,
        /// How many items the intake may give (0: none).
        receive: usize,
    },
    /// Nothing more can arrive or be raised: the intake is drained, every
    /// group is answered and no driver can queue a pause for this shard any
    /// more (or the store kept refusing the last pauses for
    /// [`MAX_SHUTDOWN_ROUNDS`] rounds: they are logged).
    Stop,
}

impl<R: Reply> Pipeline<R> {
    /// The pipeline of shard `shard` (of a set made with
    /// [`ShardSet::durable`]), with nothing decided.
    pub fn new(shard: usize) -> Self {
        Self {
            shard,
            next: Group::default(),
            in_flight: None,
            reloading: None,
            undecided: VecDeque::new(),
            partial: None,
            fetch: None,
            planned: true,
            fetching: false,
            intake: Intake::Open,
            answered: false,
            quiet: false,
            idle_rounds: 0,
            controls: PipelineControls::default(),
        }
    }

    /// The intake took a shutdown: the driver accepts nothing new (a tokio
    /// driver closes its mailbox) and keeps taking what was accepted.
    pub fn closing(&mut self) {
        if self.intake == Intake::Open {
            self.intake = Intake::Closing;
        }
    }

    /// The intake is closed and empty: nothing will arrive any more.
    pub fn drained(&mut self) {
        self.intake = Intake::Drained;
    }

    /// A wake-up came while the driver waited ([`Next::Wait`] with `wake`)
    /// and brought no work: while work may still arrive, the queued pauses
    /// are decided now; once the intake drained, [`Pipeline::next`] decides
    /// them itself, one counted round at a time ([`MAX_SHUTDOWN_ROUNDS`]).
    pub fn woken<O: Outlet, C: Borrow<Context>>(&mut self, set: &ShardSet<O, C>) {
        if self.intake != Intake::Drained {
            self.decide(set, []);
        }
    }

    /// How many more items the decided group takes this round
    /// ([`MAX_BATCH`] at most, less those waiting to be decided).
    pub fn room(&self) -> usize {
        MAX_BATCH.saturating_sub(self.next.items.len() + self.undecided.len())
    }

    /// What the driver does next: the loop policy of a durable shard, so
    /// that every driver (the receiver's tokio task, the loom models, the
    /// cluster simulation) runs the same one and keeps only its own way of
    /// waiting. In order:
    /// 1. with nothing in the store's hands and a group decided (no item
    ///    of it half decided): right after an answer, [`Next::Rejoin`]
    ///    once; then the group is handed over ([`Next::Commit`], or
    ///    answered at once when it writes nothing);
    /// 2. a read the shard asked for: [`Next::Fetch`];
    /// 3. with the intake drained and nothing decided or in flight: the
    ///    driver says once that it raises no more pauses; with no pause
    ///    queued it stops when no driver can raise one any more, or waits
    ///    for a wake-up; with pauses queued it decides them (a few rounds
    ///    at most, [`MAX_SHUTDOWN_ROUNDS`]);
    /// 4. otherwise [`Next::Wait`]: for the commit in flight, and, while
    ///    the decided group has room, no [`Work::Read`] waits in it and no
    ///    read from the store is out, for work.
    pub fn next<O: Outlet, C: Borrow<Context>>(&mut self, set: &ShardSet<O, C>) -> Next {
        loop {
            let busy = self.in_flight.is_some() || self.reloading.is_some();
            if !busy && !self.next.items.is_empty() && self.partial.is_none() {
                // What arrives while the store is read would only wait.
                let reading = self.fetch.is_some() || self.fetching;
                if std::mem::take(&mut self.answered) && self.intake != Intake::Drained && !reading
                {
                    return Next::Rejoin;
                }
                match self.hand_over(set) {
                    Handover::Commit(writes) => return Next::Commit(writes),
                    Handover::Answered => continue,
                    Handover::Idle => {}
                }
            }
            if let Some(fetch) = self.take_fetch() {
                return Next::Fetch(fetch);
            }
            let idle = self.next.items.is_empty() && self.undecided.is_empty();
            if self.intake == Intake::Drained && !busy && idle {
                if !self.quiet {
                    self.quiet = true;
                    set.quiet();
                }
                let pauses = set.queued_pauses(self.shard);
                if pauses == 0 {
                    // Another shard's last group may still pause one of
                    // this shard's objects once it is committed: stop only
                    // when no driver can raise one any more.
                    self.idle_rounds = 0;
                    if self.controls.stop_unquiet.is_on() {
                        return Next::Stop;
                    }
                    if set.all_quiet() && set.queued_pauses(self.shard) == 0 {
                        return Next::Stop;
                    }
                    return Next::Wait {
                        commit: false,
                        wake: true,
                        receive: 0,
                    };
                }
                // Only pauses are left; if the store keeps refusing them,
                // stop after a few tries rather than spin.
                self.idle_rounds += 1;
                if self.idle_rounds > MAX_SHUTDOWN_ROUNDS {
                    tracing::error!(pauses, "shutting down with pauses the store did not record");
                    return Next::Stop;
                }
                self.decide(set, []);
                continue;
            }
            // A read answers with the shard as its group leaves it: decide
            // nothing more until it is answered. What arrives while the
            // store is read would only wait behind it.
            let room = !self.reading() && !self.fetching && self.room() > 0;
            return Next::Wait {
                commit: self.in_flight.is_some(),
                wake: room && self.intake == Intake::Open,
                receive: if room && self.intake != Intake::Drained {
                    self.room()
                } else {
                    0
                },
            };
        }
    }

    /// How many items are decided and not handed over yet (the queued
    /// pauses they ran after included).
    pub fn decided(&self) -> usize {
        self.next.items.len()
    }

    /// Whether a group is in the store's hands.
    pub fn committing(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Whether a read waits, decided or in the store's hands: nothing more
    /// should be decided until it is answered (it must see the shard as its
    /// group leaves it).
    pub fn reading(&self) -> bool {
        self.next.reads() || self.in_flight.as_ref().is_some_and(|(g, _)| g.reads())
    }

    /// Decides `works` on top of whatever is uncommitted, the shard's
    /// queued pauses first; their answers wait for their group's commit.
    pub fn decide<O: Outlet, C: Borrow<Context>>(
        &mut self,
        set: &ShardSet<O, C>,
        works: impl IntoIterator<Item = Work<R>>,
    ) {
        self.decide_items(set, works.into_iter().map(Item::from));
    }

    /// Queues `items` after whatever waits undecided, the shard's queued
    /// pauses just before them (a pause queued before a delivery's sender
    /// was answered is decided before anything that sender sends next,
    /// even when the items wait for a read), and decides what it can.
    fn decide_items<O: Outlet, C: Borrow<Context>>(
        &mut self,
        set: &ShardSet<O, C>,
        items: impl IntoIterator<Item = Item<R>>,
    ) {
        let pauses = set.take_pauses(self.shard).into_iter().map(Item::Pause);
        self.undecided.extend(pauses.chain(items));
        self.planned = false;
        self.run(set);
    }

    /// After a rollback: decides `items` (steps the rollback undid) again,
    /// before whatever waits undecided, the pauses back in the inbox first.
    /// With nothing to decide, the pauses wait in the inbox for the shard's
    /// next step instead of going straight back to a store that just
    /// failed: a driver with nothing else to do would otherwise retry them
    /// in a loop for as long as the store is down.
    fn decide_again<O: Outlet, C: Borrow<Context>>(
        &mut self,
        set: &ShardSet<O, C>,
        items: Vec<Item<R>>,
    ) {
        if items.is_empty() && self.undecided.is_empty() {
            return;
        }
        let pauses = set.take_pauses(self.shard).into_iter().map(Item::Pause);
        let again: Vec<Item<R>> = pauses.chain(items).collect();
        for item in again.into_iter().rev() {
            self.undecided.push_front(item);
        }
        self.planned = false;
        self.run(set);
    }

    /// Decides what waits undecided, in order, unless a read is asked for
    /// or out, or a refused group waits for its reloaded rows (what is
    /// decided then would stand on rows about to be replaced, and be
    /// decided again on top of itself). When items came since the last
    /// plan, a bounded shard first asks in one read for everything they
    /// miss; then the items run until none is left or a step stops for a
    /// read of its own. (After a batch read that failed, the steps ask
    /// one by one: a plan is made only for new items, never twice for the
    /// same ones.)
    fn run<O: Outlet, C: Borrow<Context>>(&mut self, set: &ShardSet<O, C>) {
        if self.fetch.is_some() || self.fetching || self.reloading.is_some() {
            return;
        }
        if self.undecided.is_empty() {
            return;
        }
        let mut shard = set.lock(self.shard);
        if !std::mem::replace(&mut self.planned, true) {
            let objects = self.undecided.iter().flat_map(Item::object_ids);
            let events = self.undecided.iter().flat_map(Item::event_ids);
            if let Some(fetch) = shard.plan_fetch(set.ctx(), objects, events) {
                self.fetch = Some(fetch);
                return;
            }
        }
        while let Some(mut item) = self.undecided.pop_front() {
            let partial = self.partial.take();
            let refused = &self.next.refused;
            let done = match process(&mut shard, set.ctx(), &mut item, false, refused, partial) {
                Ran::Done(done) => done,
                Ran::Fetch(fetch, partial) => {
                    self.undecided.push_front(item);
                    self.partial = partial;
                    self.fetch = Some(fetch);
                    return;
                }
            };
            if let Done::Unread(pause) = done {
                set.put_back(self.shard, pause);
                continue;
            }
            let done = if self.controls.duplicates_early.is_on() {
                answer_early(&mut item, done)
            } else {
                done
            };
            self.next.done.push(done);
            self.next.items.push(item);
        }
        shard.forget_absent();
    }

    /// The read the shard asked for, if one waits to be handed to the
    /// driver ([`Next::Fetch`] gives it too): the driver reads it and
    /// reports with [`Pipeline::fetched`]. For a driver that calls
    /// [`Pipeline::decide`] and [`Pipeline::hand_over`] itself.
    pub fn take_fetch(&mut self) -> Option<Fetch> {
        let fetch = self.fetch.take()?;
        self.fetching = true;
        Some(fetch)
    }

    /// What the store answered to the read handed out ([`Next::Fetch`],
    /// [`Pipeline::take_fetch`]): the shard takes the rows
    /// ([`crate::Shard::fetched`]), then what waited is decided. A failed
    /// read of a whole batch is only logged (each step that needs it asks
    /// again); a failed read a step asked for is that step's answer
    /// (`retry`, or the reconciliation's error; a pause goes back to the
    /// inbox).
    pub fn fetched<O: Outlet, C: Borrow<Context>>(
        &mut self,
        set: &ShardSet<O, C>,
        fetch: &Fetch,
        result: Result<Fetched, StoreError>,
    ) {
        if let Err(e) = &result {
            tracing::debug!(error = %e, "a read of the store failed");
        }
        self.fetching = false;
        set.lock(self.shard).fetched(set.ctx(), fetch, result);
        self.run(set);
    }

    /// Closes the decided group and hands its writes over, if nothing is in
    /// the store's hands and something is decided. A group that changed
    /// nothing a store keeps is answered at once.
    pub fn hand_over<O: Outlet, C: Borrow<Context>>(&mut self, set: &ShardSet<O, C>) -> Handover {
        let busy = self.in_flight.is_some() || self.reloading.is_some();
        if busy || self.next.items.is_empty() || self.partial.is_some() {
            return Handover::Idle;
        }
        // A group decided again (after a conflict or a refusal) goes whole:
        // the rest of it, waiting for a read, keeps its refusals and its
        // count of redos.
        let redo = self.next.redo > 0 || !self.next.refused.is_empty();
        if redo && (self.fetch.is_some() || self.fetching) {
            return Handover::Idle;
        }
        let group = std::mem::take(&mut self.next);
        let mut pending = set.shard(self.shard).take_writes();
        if pending.is_empty() {
            self.in_flight = Some((group, pending));
            // Nothing to fail: committed.
            let reload = self.settled(set, Ok(()));
            debug_assert!(reload.is_none());
            return Handover::Answered;
        }
        let writes = pending.hand_over();
        self.in_flight = Some((group, pending));
        Handover::Commit(writes)
    }

    /// Acts on the commit result of the group in the store's hands.
    /// Committed: answers it. Refused because another writer changed a row
    /// ([`StoreError::Conflict`], fewer than [`MAX_REDO`] times for this
    /// group): rolls back and returns the rows to reload, which the caller
    /// reads from the store and hands to [`Pipeline::reloaded`]. One
    /// delivery's rows refused by the store ([`StoreError::Refused`] naming
    /// its body): rolls back and decides the group and everything after it
    /// again, that delivery answered `reject`
    /// ([`RejectReason::StoreRefused`](crate::envelope::RejectReason::StoreRefused) with the store's cause) and nothing
    /// of it recorded, so the rest of the group commits without it. Failed:
    /// rolls back, answers the group `retry`, and decides the later steps
    /// again on the rolled-back state. `None` when nothing was in flight.
    pub fn settle<O: Outlet, C: Borrow<Context>>(
        &mut self,
        set: &ShardSet<O, C>,
        result: Result<(), StoreError>,
    ) -> Option<Touched> {
        self.answered = true;
        self.settled(set, result)
    }

    /// [`Pipeline::settle`], without counting it as an answer for
    /// [`Next::Rejoin`] (a group that wrote nothing).
    fn settled<O: Outlet, C: Borrow<Context>>(
        &mut self,
        set: &ShardSet<O, C>,
        result: Result<(), StoreError>,
    ) -> Option<Touched> {
        let (mut group, pending) = self.in_flight.take()?;
        match result {
            Ok(()) => {
                // Recorded: only rounds the store refuses count towards
                // giving up at shutdown.
                self.idle_rounds = 0;
                let mut shard = set.shard(self.shard);
                shard.committed(pending);
                set.finish(&shard, group.items, group.done);
                // The group's objects are as stored now: a bounded shard
                // may let the idle ones go.
                shard.evict(set.ctx());
                None
            }
            Err(StoreError::Conflict(why)) if group.redo < MAX_REDO => {
                let touched = self.roll_back(set, pending);
                tracing::debug!(%why, redo = group.redo, "concurrent change: reloading and deciding again");
                let later = std::mem::take(&mut self.next);
                self.reloading = Some((group, later));
                Some(touched)
            }
            Err(StoreError::Refused {
                cause,
                body: Some(body),
            }) => {
                // One delivery's rows cannot be stored: decide the group and
                // everything after it again without that delivery, which is
                // answered `reject` (the contract's fault isolation).
                let _ = self.roll_back(set, pending);
                tracing::warn!(%cause, "the store refused a delivery: it is rejected, the rest decided again");
                let later = std::mem::take(&mut self.next);
                group.items.extend(later.items);
                self.next.redo = group.redo;
                self.next.refused = group.refused;
                self.next.refused.push((body, cause));
                self.decide_again(set, group.items);
                None
            }
            Err(e) => {
                let _ = self.roll_back(set, pending);
                set.fail(self.shard, group.items, &e);
                let later = std::mem::take(&mut self.next);
                if self.controls.failed_group_answered.is_on() {
                    let shard = set.shard(self.shard);
                    set.finish(&shard, later.items, later.done);
                    return None;
                }
                self.next.redo = later.redo;
                self.decide_again(set, later.items);
                None
            }
        }
    }

    /// Rolls the shard back to its last committed step; an item half
    /// decided (its first steps undone with the rest) starts over.
    fn roll_back<O: Outlet, C: Borrow<Context>>(
        &mut self,
        set: &ShardSet<O, C>,
        pending: PendingGroup,
    ) -> Touched {
        self.partial = None;
        set.shard(self.shard).rolled_back(set.ctx(), pending)
    }

    /// After a conflict ([`Pipeline::settle`] returned rows to reload): the
    /// rows as the store holds them now, or why they could not be read.
    /// Reloaded: the shard takes them and the refused group and everything
    /// after it are decided again. Not: the refused group gets `retry` and
    /// the later steps are decided again.
    pub fn reloaded<O: Outlet, C: Borrow<Context>>(
        &mut self,
        set: &ShardSet<O, C>,
        result: Result<Reloaded, StoreError>,
    ) {
        let Some((mut group, later)) = self.reloading.take() else {
            return;
        };
        // Nothing was decided while reloading (`run` waits for the rows):
        // what arrived meanwhile waits undecided, after these.
        debug_assert!(self.next.items.is_empty());
        match result {
            Ok(reloaded) => {
                set.shard(self.shard).refresh(set.ctx(), reloaded);
                group.items.extend(later.items);
                self.next.redo = group.redo + 1;
                self.next.refused = group.refused;
                self.decide_again(set, group.items);
            }
            Err(e) => {
                set.fail(self.shard, group.items, &e);
                self.next.redo = later.redo;
                self.decide_again(set, later.items);
            }
        }
    }
}

/// What a control does in place of the shipped rule when its switch is
/// on: a duplicate's answer leaves when it is decided, before its group
/// committed (the pipeline model's must-fail control). Returns `done` as
/// it is to be kept.
fn answer_early<R: Reply>(item: &mut Item<R>, done: Done) -> Done {
    if let (Item::Deliver(_, reply), Done::Delivered(receipt, ..)) = (item, &done) {
        if matches!(receipt.decision(), Some(crate::Decision::Duplicate { .. })) {
            if let Some(reply) = reply.take() {
                reply.answer(Answer::Delivered(receipt.clone()));
            }
        }
    }
    done
}
