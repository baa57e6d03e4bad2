//! The driver of a receiver's shards: what decides who answers when. It
//! touches no channel, socket or clock of its own (as raft-rs's `RawNode`
//! drives `Raft`): the caller brings the work, commits the writes it is
//! handed and reports the result; the driver runs the steps and answers
//! through the caller's reply tokens.
//!
//! Two parts:
//! - [`ShardSet`]: the shards, each behind a lock, with its pause inbox.
//!   It routes ([`ShardSet::route`]), queues the pauses a step raises for
//!   the shard owning their object ([`ShardSet::queue_pause`]), runs them
//!   before that shard's next step, lets a caller run the step of an idle
//!   shard ([`ShardSet::try_deliver`]) and runs a batch of work in memory
//!   ([`ShardSet::run_batch`]).
//! - [`Pipeline`]: one durable shard's group commit, pipelined. It decides
//!   what arrives on top of the uncommitted journal ([`Pipeline::decide`]),
//!   hands one group at a time to the store ([`Pipeline::hand_over`]),
//!   answers a group only once the store reported it durable
//!   ([`Pipeline::settle`]), and after a conflict with another writer
//!   decides the group again on the rows reloaded ([`Pipeline::reloaded`]).
//!
//! Notifications (decisions, effects) and wake-ups leave through the
//! caller's [`Outlet`], called while the shard is locked, so that one
//! shard's notifications leave in step order. Every lock is the core's
//! sync facade's, so the loom models check this code as it ships.
//!
//! ```
//! use snapshot_receiver_core::engine::{
//!     Answer, Config, Context, Handover, Outlet, Pipeline, Reply, Shard, ShardSet, Work,
//! };
//! use snapshot_receiver_core::{Decision, ManualClock, Receipt, Replacement};
//! use std::sync::{mpsc, Arc};
//! use std::time::UNIX_EPOCH;
//!
//! /// Nobody listens to notifications; a pause needs no wake-up here.
//! struct Quiet;
//! impl Outlet for Quiet {
//!     fn listening(&self) -> bool { false }
//!     fn decision(&self, _: &Receipt) {}
//!     fn effect(&self, _: Replacement) {}
//!     fn paused(&self, _: usize) {}
//! }
//! /// The caller's reply token: a channel end.
//! struct Tx(mpsc::Sender<Receipt>);
//! impl Reply for Tx {
//!     fn answer(self, answer: Answer<'_>) {
//!         if let Answer::Delivered(receipt) = answer { let _ = self.0.send(receipt); }
//!     }
//! }
//!
//! let ctx = Context::new(Config::default(), Arc::new(ManualClock::new(UNIX_EPOCH)));
//! let mut shard = Shard::new();
//! shard.insert_object(&ctx, "card-7", 10, r#"{"stage":"queued"}"#)?;
//! let set = ShardSet::durable(ctx, vec![shard], Quiet);
//! let mut pipeline = Pipeline::new(0);
//! let body = br#"{"event_id":"e-1","object_id":"card-7","object_version":11,
//!     "occurred_at":"2099-01-01T00:00:00Z","type":"card.snapshot","state":{"stage":"ready"}}"#;
//! let (tx, rx) = mpsc::channel();
//! pipeline.decide(&set, [Work::Deliver(set.ctx().parser().parse(body)?, Tx(tx))]);
//! let Handover::Commit(writes) = pipeline.hand_over(&set) else { unreachable!() };
//! assert!(rx.try_recv().is_err(), "no answer before the commit");
//! // ... the store commits `writes` in one transaction, then:
//! assert!(!writes.is_empty());
//! assert!(pipeline.settle(&set, Ok(())).is_none());
//! assert_eq!(rx.try_recv()?.decision(), Some(Decision::Applied));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use super::journal::PendingGroup;
use super::{
    AuthoritativeSnapshot, Context, PauseRequest, Receipt, ReconcileError, ReconcileReport,
    Replacement, RetryReason, Shard, Step, Touched,
};
use crate::envelope::{Delivery, RejectReason};
use crate::store::StoreError;
use crate::sync::{Mutex, MutexGuard};
use crate::write::{Reloaded, Write};
use std::borrow::Borrow;
use std::sync::Arc;

/// How many times a group is decided again after write conflicts with other
/// receiver processes before its callers get `retry`.
pub const MAX_REDO: usize = 8;

/// Where what leaves a shard goes: notifications and wake-ups. Every method
/// is called while the shard that made the call is locked (so one shard's
/// notifications leave in step order), and must not block or touch the
/// [`ShardSet`].
pub trait Outlet {
    /// Whether anyone listens to notifications: the shard then records its
    /// effects for [`Outlet::effect`] (see [`Shard::tap_effects`]).
    fn listening(&self) -> bool;
    /// A recorded step's decision (in memory right after the step; durable
    /// after its group committed). Only called while [`Outlet::listening`].
    fn decision(&self, receipt: &Receipt);
    /// A state replacement the step made, after its decision. Only called
    /// while [`Outlet::listening`].
    fn effect(&self, effect: Replacement);
    /// A pause was queued for shard `shard`: whoever drives it should run
    /// its next step (or [`ShardSet::run_pauses`]) soon.
    fn paused(&self, shard: usize);
}

/// No one listens, and nothing needs waking: for a driver that steps every
/// shard itself, one call after the other (a queued pause runs before its
/// shard's next step or read).
impl Outlet for () {
    fn listening(&self) -> bool {
        false
    }
    fn decision(&self, _: &Receipt) {}
    fn effect(&self, _: Replacement) {}
    fn paused(&self, _: usize) {}
}

/// A caller's reply token: how the answer of one [`Work`] reaches its
/// caller (a oneshot sender, a part of a batch, a closure).
pub trait Reply {
    /// Hands the caller its answer; the answer to a [`Work`] is always the
    /// [`Answer`] of the same kind. Called while the shard is locked.
    fn answer(self, answer: Answer<'_>);
}

/// What one [`Work`] is answered.
pub enum Answer<'a> {
    /// The receipt of a [`Work::Deliver`].
    Delivered(Receipt),
    /// The receipts of a [`Work::DeliverMany`], in its order.
    DeliveredMany(Vec<Receipt>),
    /// The result of a [`Work::Reconcile`].
    Reconciled(Result<ReconcileReport, ReconcileError>),
    /// A [`Work::Read`]: the shard as the steps before it left it (with a
    /// durable store: committed).
    Read(&'a Shard),
}

/// One piece of work for a shard, with the caller's reply token.
#[derive(Debug)]
pub enum Work<R> {
    /// One delivery.
    Deliver(Delivery, R),
    /// Deliveries decided one after the other and answered together.
    DeliverMany(Vec<Delivery>, R),
    /// An authoritative snapshot ([`Shard::reconcile`]).
    Reconcile(AuthoritativeSnapshot, R),
    /// A read of the shard, answered after the work before it.
    Read(R),
}

/// One work item as the driver keeps it until it is answered.
enum Item<R> {
    /// A queued pause, run before the work that followed its queueing.
    Pause(PauseRequest),
    /// The delivery (taken out once decided in memory, where no redo is
    /// possible) and the reply (taken out once answered).
    Deliver(Option<Delivery>, Option<R>),
    /// The deliveries (each taken out once decided in memory).
    DeliverMany(Vec<Option<Delivery>>, R),
    Reconcile(AuthoritativeSnapshot, R),
    Read(R),
}

impl<R> From<Work<R>> for Item<R> {
    fn from(work: Work<R>) -> Self {
        match work {
            Work::Deliver(d, r) => Item::Deliver(Some(d), Some(r)),
            Work::DeliverMany(ds, r) => Item::DeliverMany(ds.into_iter().map(Some).collect(), r),
            Work::Reconcile(s, r) => Item::Reconcile(s, r),
            Work::Read(r) => Item::Read(r),
        }
    }
}

impl<R> Item<R> {
    /// The event identities this item's deliveries name (their receipts
    /// are read ahead for a bounded registry).
    fn event_ids(&self) -> Vec<&Arc<str>> {
        let deliveries: Vec<&Delivery> = match self {
            Item::Deliver(delivery, _) => delivery.iter().collect(),
            Item::DeliverMany(deliveries, _) => deliveries.iter().flatten().collect(),
            _ => Vec::new(),
        };
        deliveries
            .into_iter()
            .filter_map(|d| match &d.0 {
                crate::envelope::Parsed::Event(event) => Some(&event.event_id),
                crate::envelope::Parsed::Malformed(_) => None,
            })
            .collect()
    }

    /// The objects this item's steps name (read ahead for a bounded shard).
    fn object_ids(&self) -> Vec<&str> {
        match self {
            Item::Pause(pause) => vec![&*pause.object_id],
            Item::Deliver(delivery, _) => delivery.iter().filter_map(Delivery::object_id).collect(),
            Item::DeliverMany(deliveries, _) => deliveries
                .iter()
                .flatten()
                .filter_map(Delivery::object_id)
                .collect(),
            Item::Reconcile(snapshot, _) => vec![&*snapshot.object_id],
            Item::Read(_) => Vec::new(),
        }
    }
}

/// The effects of one step, published with it.
type Effects = Vec<Replacement>;

/// What deciding one [`Item`] produced, handed out once it may be.
enum Done {
    /// A pause, or a read: nothing to hand out but the answer itself.
    Nothing,
    /// A pause whose object could not be read from the store: nothing
    /// changed, and it goes back to the inbox.
    Unread(PauseRequest),
    Delivered(Receipt, Option<PauseRequest>, Effects),
    DeliveredMany(Vec<(Receipt, Option<PauseRequest>, Effects)>),
    Reconciled(Result<ReconcileReport, ReconcileError>, Effects),
}

/// One shard and its inbox.
struct Cell {
    /// The shard's state. Held for one step or one batch of steps; whoever
    /// holds it is the only one deciding on this shard.
    shard: Mutex<Shard>,
    /// Pause requests for this shard's objects, from any shard (its own
    /// included), and pauses whose commit failed, to run before the next
    /// step. Unbounded so that two shards pausing each other never wait on
    /// each other (each request comes from one recorded variant, so the
    /// list is bounded by the deliveries already accepted). Taken last and
    /// only to push or take the list, so holding a shard while pushing to
    /// another's inbox cannot deadlock.
    inbox: Mutex<Vec<PauseRequest>>,
}

/// A receiver's shards: routing, pause inboxes, caller-runs-step and the
/// in-memory batch. `O` is where notifications and wake-ups go; `C` holds
/// the [`Context`] (owned by default; a `&Context` or an `Arc` works too).
pub struct ShardSet<O, C = Context> {
    /// Registry, clock, configuration: shared by every shard.
    ctx: C,
    /// The shards, indexed by [`crate::shard_of`].
    cells: Box<[Cell]>,
    /// The caller's side of notifications and wake-ups.
    outlet: O,
    /// The in-memory outbox (a set without a journal, while
    /// [`crate::Config::audit`] keeps records in memory): every effect is
    /// given its position here when it is published. `None` for a durable
    /// set, whose store gives positions when it commits.
    outbox: Option<super::Outbox>,
}

impl<O: Outlet, C: Borrow<Context>> ShardSet<O, C> {
    /// The set of `shards` (indexed as [`crate::shard_of`] routes among
    /// `shards.len()`), without a journal: for an in-memory receiver.
    pub fn new(ctx: C, shards: Vec<Shard>, outlet: O) -> Self {
        let config = ctx.borrow().config();
        let outbox = config
            .audit
            .then(|| super::Outbox::new(config.trail_capacity));
        Self {
            outbox,
            ctx,
            cells: shards
                .into_iter()
                .map(|shard| Cell {
                    shard: Mutex::new(shard),
                    inbox: Mutex::new(Vec::new()),
                })
                .collect(),
            outlet,
        }
    }

    /// The set of `shards`, each journaling its steps for a durable store
    /// (see [`Shard::enable_journal`]; call it after [`super::resume`]).
    /// Each shard is then driven by one [`Pipeline`].
    pub fn durable(ctx: C, mut shards: Vec<Shard>, outlet: O) -> Self {
        for shard in &mut shards {
            shard.enable_journal();
        }
        Self {
            outbox: None,
            ..Self::new(ctx, shards, outlet)
        }
    }

    /// Registry, clock and configuration.
    pub fn ctx(&self) -> &Context {
        self.ctx.borrow()
    }

    /// Where notifications and wake-ups go.
    pub fn outlet(&self) -> &O {
        &self.outlet
    }

    /// The in-memory outbox, where every effect gets its position when it
    /// is published (docs/CONTRACT.md §10): present for a set made with
    /// [`ShardSet::new`] while [`crate::Config::audit`] keeps records in
    /// memory; `None` for a durable set (its store numbers the effects as
    /// it commits them).
    pub fn outbox(&self) -> Option<&super::Outbox> {
        self.outbox.as_ref()
    }

    /// Whether steps must keep their effects for [`ShardSet::publish`]:
    /// someone listens, or the outbox takes them.
    fn tapping(&self) -> bool {
        self.outbox.is_some() || self.outlet.listening()
    }

    /// How many shards there are (at least 1 for a usable set).
    pub fn len(&self) -> usize {
        self.cells.len()
    }

    /// Whether there is no shard at all.
    pub fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }

    /// The shard a delivery naming `object_id` goes to ([`crate::route`]).
    pub fn route(&self, object_id: Option<&str>) -> usize {
        crate::route(object_id, self.cells.len())
    }

    /// The shards, consumed (for a caller that drove them to the end).
    pub fn into_shards(self) -> Vec<Shard> {
        self.cells
            .into_vec()
            .into_iter()
            .map(|c| c.shard.into_inner())
            .collect()
    }

    /// Queues `pause` for the shard owning its object, to run before that
    /// shard's next step, and tells the [`Outlet`].
    pub fn queue_pause(&self, pause: PauseRequest) {
        let owner = pause.owner(self.cells.len());
        self.cells[owner].inbox.lock().push(pause);
        self.outlet.paused(owner);
    }

    /// How many pauses wait in shard `shard`'s inbox.
    pub fn queued_pauses(&self, shard: usize) -> usize {
        self.cells[shard].inbox.lock().len()
    }

    /// The pauses queued for shard `shard`, taken out.
    fn take_pauses(&self, shard: usize) -> Vec<PauseRequest> {
        std::mem::take(&mut *self.cells[shard].inbox.lock())
    }

    /// Shard `shard`, locked, its effect tap set by the [`Outlet`].
    fn lock(&self, shard: usize) -> MutexGuard<'_, Shard> {
        let mut guard = self.cells[shard].shard.lock();
        guard.tap_effects(self.tapping());
        guard
    }

    /// Publishes a recorded step: its effects to the outbox (each given its
    /// position now), then its decision (if one was recorded) and its
    /// effects to the [`Outlet`]. Called while the step's shard is locked.
    /// Nobody listening is not an error.
    fn publish(&self, receipt: Option<&Receipt>, effects: Effects) {
        let listening = self.outlet.listening();
        if let Some(outbox) = &self.outbox {
            if listening {
                outbox.publish(self.ctx().origin, effects.iter().cloned());
            } else {
                outbox.publish(self.ctx().origin, effects);
                return;
            }
        }
        if !listening {
            return;
        }
        if let Some(r) = receipt.filter(|r| r.decision().is_some()) {
            self.outlet.decision(r);
        }
        for effect in effects {
            self.outlet.effect(effect);
        }
    }

    /// Runs one in-memory delivery on the caller's thread if no step is
    /// running on shard `shard`: the queued pauses first, then the step,
    /// then its pause queued for its owner, exactly what a batch with the
    /// delivery alone does. Takes the delivery out of `slot` only when it
    /// runs it; `None` (the delivery left in `slot`) when the shard is busy.
    ///
    /// Only without a journal: with one, a step's answer waits for its
    /// commit, which the shard's [`Pipeline`] drives.
    pub fn try_deliver(&self, shard: usize, slot: &mut Option<Delivery>) -> Option<Receipt> {
        let mut guard = self.cells[shard].shard.try_lock()?;
        let delivery = slot.take()?;
        guard.tap_effects(self.tapping());
        Some(self.step_alone(shard, &mut guard, delivery).receipt)
    }

    /// [`ShardSet::try_deliver`], waiting for the shard if it is busy; the
    /// whole step (its pause request too, which is queued for its owner).
    /// For drivers that step in-memory shards from their own threads (the
    /// loom models, the fuzz target, the load test's baselines).
    pub fn deliver(&self, shard: usize, delivery: Delivery) -> Step {
        self.stepper(shard).deliver(delivery)
    }

    /// Shard `shard`, locked for a run of steps, each exactly as
    /// [`ShardSet::deliver`] runs it (its queued pauses first, its own pause
    /// queued after): for a caller that decides many deliveries under one
    /// lock and answers them itself (the load test's global-mutex baseline).
    pub fn stepper(&self, shard: usize) -> Stepper<'_, O, C> {
        Stepper {
            guard: self.lock(shard),
            set: self,
            shard,
        }
    }

    /// Applies `snapshot` on shard `shard`, as a reconciliation alone in its
    /// batch ([`ShardSet::run_batch`]): the queued pauses first, its effects
    /// published.
    ///
    /// # Errors
    /// As [`Shard::reconcile`].
    pub fn reconcile(
        &self,
        shard: usize,
        snapshot: &AuthoritativeSnapshot,
    ) -> Result<ReconcileReport, ReconcileError> {
        let mut guard = self.lock(shard);
        self.run_queued(shard, &mut guard);
        let result = guard.reconcile(self.ctx(), snapshot);
        let effects = guard.take_effects();
        self.publish(None, effects);
        result
    }

    fn step_alone(&self, shard: usize, guard: &mut Shard, delivery: Delivery) -> Step {
        self.run_queued(shard, guard);
        let step = guard.deliver(self.ctx(), delivery);
        let effects = guard.take_effects();
        if let Some(pause) = &step.pause {
            self.queue_pause(pause.clone());
        }
        self.publish(Some(&step.receipt), effects);
        step
    }

    /// Runs the pauses queued for shard `shard` (what its driver does when
    /// woken with nothing else to do); returns how many paused an object
    /// the shard knows.
    pub fn run_pauses(&self, shard: usize) -> usize {
        let mut guard = self.lock(shard);
        self.run_queued(shard, &mut guard)
    }

    /// Runs the pauses queued for shard `shard` on `guard`; returns how many
    /// paused an object the shard knows. One whose object could not be read
    /// from the store goes back to the inbox, to run before the next step.
    fn run_queued(&self, shard: usize, guard: &mut Shard) -> usize {
        let mut paused = 0;
        for pause in self.take_pauses(shard) {
            match guard.pause(self.ctx(), &pause) {
                Ok(known) => paused += usize::from(known),
                Err(_) => self.put_back(shard, pause),
            }
        }
        guard.forget_absent();
        paused
    }

    /// Puts `pause` back in shard `shard`'s inbox without waking its driver:
    /// its object could not be read, and it runs before the next step.
    fn put_back(&self, shard: usize, pause: PauseRequest) {
        self.cells[shard].inbox.lock().push(pause);
    }

    /// Decides and answers one in-memory batch on shard `shard`, under one
    /// hold of its lock. Pauses that arrived meanwhile go first: a pause
    /// queued before a delivery's sender got its receipt is always seen
    /// before any later delivery of the paused object.
    pub fn run_batch<R: Reply>(&self, shard: usize, works: Vec<Work<R>>) {
        let mut guard = self.lock(shard);
        let mut items: Vec<Item<R>> = self
            .take_pauses(shard)
            .into_iter()
            .map(Item::Pause)
            .collect();
        items.extend(works.into_iter().map(Item::from));
        let mut kept = Vec::with_capacity(items.len());
        let mut done = Vec::with_capacity(items.len());
        for mut item in items {
            match process(&mut guard, self.ctx(), &mut item, true, &[]) {
                Done::Unread(pause) => self.put_back(shard, pause),
                d => {
                    done.push(d);
                    kept.push(item);
                }
            }
        }
        guard.forget_absent();
        self.finish(&guard, kept, done);
    }

    /// Runs `read` on shard `shard` after its queued pauses, as a
    /// [`Work::Read`] alone in its batch would. For in-memory sets, and for
    /// a durable one whose pipeline is idle (it would see uncommitted steps).
    pub fn read<T>(&self, shard: usize, read: impl FnOnce(&Shard) -> T) -> T {
        let mut guard = self.lock(shard);
        self.run_queued(shard, &mut guard);
        read(&guard)
    }

    /// The items are recorded (in memory: decided; durable: committed):
    /// queues their pauses first, then publishes and answers, in order.
    fn finish<R: Reply>(&self, shard: &Shard, items: Vec<Item<R>>, done: Vec<Done>) {
        for (item, done) in items.into_iter().zip(done) {
            match (item, done) {
                (Item::Deliver(_, reply), Done::Delivered(receipt, pause, effects)) => {
                    if let Some(pause) = pause {
                        self.queue_pause(pause);
                    }
                    self.publish(Some(&receipt), effects);
                    if let Some(reply) = reply {
                        reply.answer(Answer::Delivered(receipt));
                    }
                }
                (Item::DeliverMany(_, reply), Done::DeliveredMany(steps)) => {
                    let mut receipts = Vec::with_capacity(steps.len());
                    for (receipt, pause, effects) in steps {
                        if let Some(pause) = pause {
                            self.queue_pause(pause);
                        }
                        self.publish(Some(&receipt), effects);
                        receipts.push(receipt);
                    }
                    reply.answer(Answer::DeliveredMany(receipts));
                }
                (Item::Reconcile(_, reply), Done::Reconciled(result, effects)) => {
                    self.publish(None, effects);
                    reply.answer(Answer::Reconciled(result));
                }
                (Item::Read(reply), _) => reply.answer(Answer::Read(shard)),
                _ => {}
            }
        }
    }

    /// The store could not commit the items: nothing of them happened.
    /// Deliveries get `retry`, reconciliations an error, pauses go back to
    /// the inbox to be tried again, reads see the rolled-back shard.
    fn fail<R: Reply>(&self, shard: usize, items: Vec<Item<R>>, error: &StoreError) {
        // A debug line, not a warning: every failed commit was already
        // warned of by whoever ran it (the library's committer, through a
        // log gate so that an outage writes one line per interval, not one
        // per shard and group).
        tracing::debug!(%error, "batch not recorded: callers get retry");
        let guard = self.cells[shard].shard.lock();
        let why = || RetryReason::StoreFailed(error.clone());
        for item in items {
            match item {
                Item::Pause(pause) => self.cells[shard].inbox.lock().push(pause),
                Item::Deliver(delivery, reply) => {
                    if let (Some(delivery), Some(reply)) = (delivery, reply) {
                        reply.answer(Answer::Delivered(Receipt::retry(&delivery, why())));
                    }
                }
                Item::DeliverMany(deliveries, reply) => reply.answer(Answer::DeliveredMany(
                    deliveries
                        .iter()
                        .flatten()
                        .map(|d| Receipt::retry(d, why()))
                        .collect(),
                )),
                Item::Reconcile(_, reply) => {
                    reply.answer(Answer::Reconciled(Err(ReconcileError::StoreFailed(
                        error.clone(),
                    ))));
                }
                Item::Read(reply) => reply.answer(Answer::Read(&guard)),
            }
        }
    }
}

/// A shard locked for a run of steps ([`ShardSet::stepper`]).
pub struct Stepper<'a, O, C = Context> {
    /// The shard, held until the stepper is dropped.
    guard: MutexGuard<'a, Shard>,
    /// Where its pauses are queued and its notifications go.
    set: &'a ShardSet<O, C>,
    /// Which shard it is.
    shard: usize,
}

impl<O: Outlet, C: Borrow<Context>> Stepper<'_, O, C> {
    /// Runs one step, as [`ShardSet::deliver`] does.
    pub fn deliver(&mut self, delivery: Delivery) -> Step {
        self.set.step_alone(self.shard, &mut self.guard, delivery)
    }
}

/// Runs one item on the shard. `consume` moves the deliveries out (in
/// memory no redo is possible, so no copy is needed); a delivery among the
/// `refused` ones is answered `reject` without being decided.
fn process<R>(
    shard: &mut Shard,
    ctx: &Context,
    item: &mut Item<R>,
    consume: bool,
    refused: &[Refusal],
) -> Done {
    match item {
        Item::Pause(pause) => match shard.pause(ctx, pause) {
            Ok(_) => Done::Nothing,
            Err(_) => Done::Unread(pause.clone()),
        },
        Item::Deliver(delivery, _) => {
            match refuse(delivery, refused).or_else(|| deliver(shard, ctx, delivery, consume)) {
                Some((receipt, pause, effects)) => Done::Delivered(receipt, pause, effects),
                None => Done::Nothing,
            }
        }
        Item::DeliverMany(deliveries, _) => Done::DeliveredMany(
            deliveries
                .iter_mut()
                .filter_map(|d| refuse(d, refused).or_else(|| deliver(shard, ctx, d, consume)))
                .collect(),
        ),
        Item::Reconcile(snapshot, _) => {
            let result = shard.reconcile(ctx, snapshot);
            Done::Reconciled(result, shard.take_effects())
        }
        Item::Read(_) => Done::Nothing,
    }
}

/// A delivery the store refused to record: its exact body, and the
/// store's cause ([`StoreError::Refused`]).
type Refusal = (Arc<[u8]>, String);

/// The `reject` answer of a delivery whose body is among the `refused`
/// ones (the store could not hold its rows): not decided, nothing of it
/// recorded. `None` for any other delivery, or one already taken.
fn refuse(
    delivery: &Option<Delivery>,
    refused: &[Refusal],
) -> Option<(Receipt, Option<PauseRequest>, Effects)> {
    let delivery = delivery.as_ref()?;
    let (_, cause) = refused
        .iter()
        .find(|(body, _)| **body == *delivery.body())?;
    let why = RejectReason::StoreRefused {
        cause: cause.clone(),
    };
    Some((Receipt::refused(delivery, why), None, Vec::new()))
}

/// Decides one delivery of an item; `None` if it was already taken.
fn deliver(
    shard: &mut Shard,
    ctx: &Context,
    delivery: &mut Option<Delivery>,
    consume: bool,
) -> Option<(Receipt, Option<PauseRequest>, Effects)> {
    let delivery = if consume {
        delivery.take()
    } else {
        delivery.clone()
    };
    let step = shard.deliver(ctx, delivery?);
    Some((step.receipt, step.pause, shard.take_effects()))
}

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

/// Test-only (loom models, `--cfg snapshot_receiver_loom`): a pipeline that
/// answers some deliveries before their group committed, for the models'
/// must-fail controls. Never compiled into a shipped build.
#[cfg(snapshot_receiver_loom)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EarlyAnswer {
    /// The shipped rule: every answer after its group committed.
    Never,
    /// A duplicate is answered as soon as it is decided ("it changes
    /// nothing").
    Duplicates,
    /// When a commit fails, the steps decided on top of the failed group
    /// are answered as decided instead of being decided again.
    OnTopOfFailedGroup,
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
    /// The models' controls only.
    #[cfg(snapshot_receiver_loom)]
    early: EarlyAnswer,
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
            #[cfg(snapshot_receiver_loom)]
            early: EarlyAnswer::Never,
        }
    }

    /// Test-only (loom): answers as `early` says (a must-fail control).
    #[cfg(snapshot_receiver_loom)]
    pub fn answer_early(mut self, early: EarlyAnswer) -> Self {
        self.early = early;
        self
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

    fn decide_items<O: Outlet, C: Borrow<Context>>(
        &mut self,
        set: &ShardSet<O, C>,
        items: impl IntoIterator<Item = Item<R>>,
    ) {
        let mut shard = set.lock(self.shard);
        let pauses = set.take_pauses(self.shard).into_iter().map(Item::Pause);
        let items: Vec<Item<R>> = pauses.chain(items).collect();
        if shard.bounded() {
            // One read for the objects of the whole batch that are only in
            // the store; a failed read is tried again by each step.
            if let Err(e) = shard.prefetch(set.ctx(), items.iter().flat_map(Item::object_ids)) {
                tracing::debug!(error = %e, "objects of a batch not read: each step tries again");
            }
            let event_ids = items.iter().flat_map(Item::event_ids);
            if let Err(e) = shard.prefetch_identities(set.ctx(), event_ids) {
                tracing::debug!(error = %e, "receipts of a batch not read: each delivery tries again");
            }
        }
        for mut item in items {
            let done = process(&mut shard, set.ctx(), &mut item, false, &self.next.refused);
            if let Done::Unread(pause) = done {
                set.put_back(self.shard, pause);
                continue;
            }
            #[cfg(snapshot_receiver_loom)]
            let done = self.answer_duplicate(item_reply(&mut item), done);
            self.next.done.push(done);
            self.next.items.push(item);
        }
        shard.forget_absent();
    }

    /// The control [`EarlyAnswer::Duplicates`]: answers a duplicate now.
    #[cfg(snapshot_receiver_loom)]
    fn answer_duplicate(&self, reply: Option<&mut Option<R>>, done: Done) -> Done {
        if let (EarlyAnswer::Duplicates, Some(reply), Done::Delivered(receipt, ..)) =
            (self.early, reply, &done)
        {
            if matches!(receipt.decision(), Some(crate::Decision::Duplicate { .. })) {
                if let Some(reply) = reply.take() {
                    reply.answer(Answer::Delivered(receipt.clone()));
                }
            }
        }
        done
    }

    /// Closes the decided group and hands its writes over, if nothing is in
    /// the store's hands and something is decided. A group that changed
    /// nothing a store keeps is answered at once.
    pub fn hand_over<O: Outlet, C: Borrow<Context>>(&mut self, set: &ShardSet<O, C>) -> Handover {
        if self.in_flight.is_some() || self.reloading.is_some() || self.next.items.is_empty() {
            return Handover::Idle;
        }
        let group = std::mem::take(&mut self.next);
        let mut pending = set.cells[self.shard].shard.lock().take_writes();
        if pending.is_empty() {
            self.in_flight = Some((group, pending));
            // Nothing to fail: committed.
            let reload = self.settle(set, Ok(()));
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
    /// ([`RejectReason::StoreRefused`] with the store's cause) and nothing
    /// of it recorded, so the rest of the group commits without it. Failed:
    /// rolls back, answers the group `retry`, and decides the later steps
    /// again on the rolled-back state. `None` when nothing was in flight.
    pub fn settle<O: Outlet, C: Borrow<Context>>(
        &mut self,
        set: &ShardSet<O, C>,
        result: Result<(), StoreError>,
    ) -> Option<Touched> {
        let (mut group, pending) = self.in_flight.take()?;
        match result {
            Ok(()) => {
                let mut shard = set.cells[self.shard].shard.lock();
                shard.committed(pending);
                set.finish(&shard, group.items, group.done);
                // The group's objects are as stored now: a bounded shard
                // may let the idle ones go.
                shard.evict(set.ctx());
                None
            }
            Err(StoreError::Conflict(why)) if group.redo < MAX_REDO => {
                let touched = set.cells[self.shard]
                    .shard
                    .lock()
                    .rolled_back(set.ctx(), pending);
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
                let _ = set.cells[self.shard]
                    .shard
                    .lock()
                    .rolled_back(set.ctx(), pending);
                tracing::warn!(%cause, "the store refused a delivery: it is rejected, the rest decided again");
                let later = std::mem::take(&mut self.next);
                group.items.extend(later.items);
                self.next.redo = group.redo;
                self.next.refused = group.refused;
                self.next.refused.push((body, cause));
                self.decide_items(set, group.items);
                None
            }
            Err(e) => {
                let _ = set.cells[self.shard]
                    .shard
                    .lock()
                    .rolled_back(set.ctx(), pending);
                set.fail(self.shard, group.items, &e);
                let later = std::mem::take(&mut self.next);
                #[cfg(snapshot_receiver_loom)]
                if self.early == EarlyAnswer::OnTopOfFailedGroup {
                    let shard = set.cells[self.shard].shard.lock();
                    set.finish(&shard, later.items, later.done);
                    return None;
                }
                self.next.redo = later.redo;
                self.decide_again(set, later.items);
                None
            }
        }
    }

    /// After a failed commit: decides the steps that were decided on top of
    /// the failed group again, the group's pauses (back in the inbox) first.
    /// With nothing on top, the pauses wait in the inbox for the shard's
    /// next step instead of going straight back to a store that just
    /// failed: a driver with nothing else to do would otherwise retry them
    /// in a loop for as long as the store is down.
    fn decide_again<O: Outlet, C: Borrow<Context>>(
        &mut self,
        set: &ShardSet<O, C>,
        later: Vec<Item<R>>,
    ) {
        if !later.is_empty() {
            self.decide_items(set, later);
        }
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
        let Some((mut group, mut later)) = self.reloading.take() else {
            return;
        };
        // Whatever was decided while reloading comes after.
        let newer = std::mem::take(&mut self.next);
        later.items.extend(newer.items);
        match result {
            Ok(reloaded) => {
                set.cells[self.shard]
                    .shard
                    .lock()
                    .refresh(set.ctx(), reloaded);
                group.items.extend(later.items);
                self.next.redo = group.redo + 1;
                self.next.refused = group.refused;
                self.decide_items(set, group.items);
            }
            Err(e) => {
                set.fail(self.shard, group.items, &e);
                self.next.redo = later.redo;
                self.decide_again(set, later.items);
            }
        }
    }
}

/// The reply slot of a single delivery (the only kind a control answers early).
#[cfg(snapshot_receiver_loom)]
fn item_reply<R>(item: &mut Item<R>) -> Option<&mut Option<R>> {
    match item {
        Item::Deliver(_, reply) => Some(reply),
        _ => None,
    }
}

#[cfg(all(test, not(snapshot_receiver_loom)))]
mod tests {
    use super::*;
    use crate::engine::{Config, Outcome};
    use crate::{Decision, ManualClock, Verdict};
    use std::cell::RefCell;
    use std::sync::Arc;
    use std::time::UNIX_EPOCH;

    fn body(event_id: &str, object_id: &str, version: u64) -> Vec<u8> {
        format!(
            concat!(
                r#"{{"event_id":"{}","object_id":"{}","object_version":{},"#,
                r#""occurred_at":"2099-01-01T00:00:00Z","type":"card.snapshot","state":{{"v":{}}}}}"#
            ),
            event_id, object_id, version, version
        )
        .into_bytes()
    }

    /// Records the shards it was asked to wake.
    #[derive(Default)]
    struct Wakes(RefCell<Vec<usize>>);

    impl Outlet for Wakes {
        fn listening(&self) -> bool {
            false
        }
        fn decision(&self, _: &Receipt) {}
        fn effect(&self, _: Replacement) {}
        fn paused(&self, shard: usize) {
            self.0.borrow_mut().push(shard);
        }
    }

    /// Answers into a shared list, in the order given.
    struct Into<'a>(&'a RefCell<Vec<Receipt>>);

    impl Reply for Into<'_> {
        fn answer(self, answer: Answer<'_>) {
            match answer {
                Answer::Delivered(r) => self.0.borrow_mut().push(r),
                _ => panic!("only deliveries here"),
            }
        }
    }

    fn set(durable: bool) -> ShardSet<Wakes> {
        let ctx = Context::new(
            Config {
                shards: 1,
                ..Config::default()
            },
            Arc::new(ManualClock::new(UNIX_EPOCH)),
        );
        let mut shard = Shard::new();
        shard
            .insert_object(&ctx, "card-7", 10, r#"{"v":10}"#)
            .unwrap();
        if durable {
            ShardSet::durable(ctx, vec![shard], Wakes::default())
        } else {
            ShardSet::new(ctx, vec![shard], Wakes::default())
        }
    }

    fn work<'a>(
        set: &ShardSet<Wakes>,
        answers: &'a RefCell<Vec<Receipt>>,
        event: &str,
        v: u64,
    ) -> Work<Into<'a>> {
        Work::Deliver(
            set.ctx().parser().parse(&body(event, "card-7", v)).unwrap(),
            Into(answers),
        )
    }

    fn decisions(answers: &RefCell<Vec<Receipt>>) -> Vec<Option<Decision>> {
        answers.borrow().iter().map(Receipt::decision).collect()
    }

    #[test]
    fn a_group_is_answered_only_once_its_commit_is_reported() {
        let set = set(true);
        let answers = RefCell::new(Vec::new());
        let mut pipeline = Pipeline::new(0);
        pipeline.decide(&set, [work(&set, &answers, "e-1", 11)]);
        let Handover::Commit(writes) = pipeline.hand_over(&set) else {
            panic!("e-1 writes");
        };
        assert!(!writes.is_empty());
        // Decided on top of the group in flight, handed over after it.
        pipeline.decide(&set, [work(&set, &answers, "e-2", 12)]);
        assert!(matches!(pipeline.hand_over(&set), Handover::Idle));
        assert!(answers.borrow().is_empty());
        assert!(pipeline.settle(&set, Ok(())).is_none());
        assert_eq!(decisions(&answers), [Some(Decision::Applied)]);
        assert!(matches!(pipeline.hand_over(&set), Handover::Commit(_)));
        assert!(pipeline.settle(&set, Ok(())).is_none());
        assert_eq!(decisions(&answers), [Some(Decision::Applied); 2]);
        assert_eq!(set.read(0, |s| s.object("card-7").unwrap().version), 12);
    }

    #[test]
    fn a_failed_group_answers_retry_and_what_was_decided_on_top_is_decided_again() {
        let set = set(true);
        let answers = RefCell::new(Vec::new());
        let mut pipeline = Pipeline::new(0);
        pipeline.decide(&set, [work(&set, &answers, "e-1", 11)]);
        assert!(matches!(pipeline.hand_over(&set), Handover::Commit(_)));
        // A redelivery, on top of the uncommitted first record: a duplicate.
        pipeline.decide(&set, [work(&set, &answers, "e-1", 11)]);
        let failed = Err(StoreError::Failed("disk full".to_owned()));
        assert!(pipeline.settle(&set, failed).is_none());
        let first = answers.borrow()[0].outcome.clone();
        assert!(
            matches!(first, Outcome::Retry(RetryReason::StoreFailed(StoreError::Failed(ref e))) if e == "disk full"),
            "{first:?}"
        );
        // Decided again on the rolled-back state: the first record now.
        assert_eq!(pipeline.decided(), 1);
        assert!(matches!(pipeline.hand_over(&set), Handover::Commit(_)));
        assert!(pipeline.settle(&set, Ok(())).is_none());
        assert_eq!(decisions(&answers), [None, Some(Decision::Applied)]);
        assert_eq!(
            set.ctx().registry().get("e-1").unwrap().decision,
            Verdict::Applied
        );
    }

    #[test]
    fn a_conflict_rolls_back_reloads_and_decides_the_group_again() {
        let set = set(true);
        let answers = RefCell::new(Vec::new());
        let mut pipeline = Pipeline::new(0);
        pipeline.decide(&set, [work(&set, &answers, "e-1", 11)]);
        assert!(matches!(pipeline.hand_over(&set), Handover::Commit(_)));
        let touched = pipeline
            .settle(&set, Err(StoreError::Conflict("card-7 changed".to_owned())))
            .expect("rows to reload");
        assert_eq!(touched.objects, [Arc::from("card-7")]);
        assert_eq!(touched.receipts, [Arc::from("e-1")]);
        assert!(
            answers.borrow().is_empty(),
            "no answer before the redo commits"
        );
        pipeline.reloaded(&set, Ok(Reloaded::default()));
        assert!(matches!(pipeline.hand_over(&set), Handover::Commit(_)));
        assert!(pipeline.settle(&set, Ok(())).is_none());
        assert_eq!(decisions(&answers), [Some(Decision::Applied)]);
    }

    #[test]
    fn a_refused_delivery_is_rejected_and_the_rest_of_its_group_commits_even_after_a_conflict() {
        let set = set(true);
        let answers = RefCell::new(Vec::new());
        let mut pipeline = Pipeline::new(0);
        let poison = body("e-1", "card-7", 11);
        pipeline.decide(
            &set,
            [
                work(&set, &answers, "e-1", 11),
                work(&set, &answers, "e-2", 12),
            ],
        );
        assert!(matches!(pipeline.hand_over(&set), Handover::Commit(_)));
        let refused = Err(StoreError::Refused {
            cause: "cannot hold U+0000".to_owned(),
            body: Some(Arc::from(poison)),
        });
        assert!(pipeline.settle(&set, refused).is_none());
        assert!(answers.borrow().is_empty(), "no answer before the commit");
        assert_eq!(pipeline.decided(), 2, "the whole group decided again");
        // The group decided again meets a conflict: the refusal still holds.
        assert!(matches!(pipeline.hand_over(&set), Handover::Commit(_)));
        let conflict = Err(StoreError::Conflict("card-7 changed".to_owned()));
        let touched = pipeline.settle(&set, conflict).expect("rows to reload");
        assert_eq!(touched.receipts, [Arc::from("e-2")]);
        pipeline.reloaded(&set, Ok(Reloaded::default()));
        assert!(matches!(pipeline.hand_over(&set), Handover::Commit(_)));
        assert!(pipeline.settle(&set, Ok(())).is_none());
        let outcomes: Vec<Outcome> = answers.borrow().iter().map(|r| r.outcome.clone()).collect();
        assert_eq!(
            outcomes,
            [
                Outcome::Rejected(crate::RejectReason::StoreRefused {
                    cause: "cannot hold U+0000".to_owned()
                }),
                Outcome::Decided(Decision::Applied),
            ]
        );
        assert!(set.ctx().registry().get("e-1").is_none(), "nothing of e-1");
        assert_eq!(set.read(0, |s| s.object("card-7").unwrap().version), 12);
    }

    #[test]
    fn a_busy_shard_leaves_the_delivery_to_its_caller() {
        let set = set(false);
        let mut slot = Some(
            set.ctx()
                .parser()
                .parse(&body("e-1", "card-7", 11))
                .unwrap(),
        );
        let stepper = set.stepper(0);
        assert!(set.try_deliver(0, &mut slot).is_none());
        assert!(slot.is_some(), "still the caller's, for the mailbox");
        drop(stepper);
        let receipt = set.try_deliver(0, &mut slot).expect("idle now");
        assert_eq!(receipt.decision(), Some(Decision::Applied));
        assert!(slot.is_none());
    }

    #[test]
    fn a_pause_waits_in_its_owners_inbox_and_runs_before_its_next_step() {
        let set = set(false);
        set.queue_pause(PauseRequest {
            object_id: "card-7".into(),
            cause_event: "e-0".into(),
            recorded: None,
        });
        assert_eq!(*set.outlet().0.borrow(), [0]);
        assert_eq!(set.queued_pauses(0), 1);
        let step = set.deliver(
            0,
            set.ctx()
                .parser()
                .parse(&body("e-1", "card-7", 11))
                .unwrap(),
        );
        assert_eq!(
            step.receipt.decision(),
            Some(Decision::Held(crate::HoldReason::Paused))
        );
        assert_eq!(set.queued_pauses(0), 0);
    }

    /// A store holding `card-1`..`card-9` at version 0 that records the
    /// ids of each object read.
    #[derive(Clone, Default)]
    struct Reads(Arc<std::sync::Mutex<Vec<Vec<String>>>>);

    impl crate::store::ObjectSource for Reads {
        fn objects(
            &mut self,
            ids: &[Arc<str>],
        ) -> Result<Vec<crate::write::ObjectRow>, StoreError> {
            self.0
                .lock()
                .unwrap()
                .push(ids.iter().map(|id| id.to_string()).collect());
            Ok(ids
                .iter()
                .map(|id| crate::write::ObjectRow {
                    object_id: id.clone(),
                    version: 0,
                    state: r#"{"v":0}"#.to_owned(),
                    paused: false,
                })
                .collect())
        }
        fn receipts(
            &mut self,
            _: &[Arc<str>],
            _: std::time::SystemTime,
        ) -> Result<Vec<crate::write::ReceiptRow>, StoreError> {
            Ok(Vec::new())
        }
        fn receipt_ids(
            &mut self,
            _: &str,
            _: std::time::SystemTime,
            _: usize,
        ) -> Result<Vec<(Arc<str>, std::time::SystemTime)>, StoreError> {
            Ok(Vec::new())
        }
    }

    #[test]
    fn a_bounded_shard_reads_the_objects_of_a_whole_batch_in_one_read() {
        let ctx = Context::new(
            Config {
                shards: 1,
                ..Config::default()
            },
            Arc::new(ManualClock::new(UNIX_EPOCH)),
        );
        let reads = Reads::default();
        let mut shard = Shard::new();
        shard.bound_objects(Box::new(reads.clone()), 8);
        let set = ShardSet::durable(ctx, vec![shard], Wakes::default());
        let answers = RefCell::new(Vec::new());
        let works: Vec<_> = [("e-1", "card-1"), ("e-2", "card-2"), ("e-3", "card-3")]
            .into_iter()
            .map(|(event, object)| {
                Work::Deliver(
                    set.ctx().parser().parse(&body(event, object, 1)).unwrap(),
                    Into(&answers),
                )
            })
            .collect();
        let mut pipeline = Pipeline::new(0);
        pipeline.decide(&set, works);
        assert_eq!(*reads.0.lock().unwrap(), [["card-1", "card-2", "card-3"]]);
        assert!(matches!(pipeline.hand_over(&set), Handover::Commit(_)));
        assert!(pipeline.settle(&set, Ok(())).is_none());
        assert_eq!(decisions(&answers), [Some(Decision::Applied); 3]);
    }
}
