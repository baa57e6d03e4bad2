//! The shards of a receiver and their pause inboxes ([`ShardSet`]), and a
//! shard held for a run of steps ([`Stepper`]).

use super::{process, Answer, Done, Effects, Item, Outlet, Ran, Reply, Work};
use crate::engine::{
    AuthoritativeSnapshot, Context, PauseRequest, Receipt, ReconcileError, ReconcileReport,
    RetryReason, Shard, Step,
};
use crate::envelope::Delivery;
use crate::store::StoreError;
use crate::sync::{AtomicUsize, Mutex, MutexGuard, Ordering};
use std::borrow::Borrow;

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
    outbox: Option<crate::engine::Outbox>,
    /// How many of the shards' drivers may still raise a pause for another
    /// shard: a durable driver whose intake is drained and whose last group
    /// is answered stops only once this is zero ([`ShardSet::quiet`]).
    raising: AtomicUsize,
}

impl<O: Outlet, C: Borrow<Context>> ShardSet<O, C> {
    /// The set of `shards` (indexed as [`crate::shard_of`] routes among
    /// `shards.len()`), without a journal: for an in-memory receiver.
    pub fn new(ctx: C, shards: Vec<Shard>, outlet: O) -> Self {
        let config = ctx.borrow().config();
        let shards_len = shards.len();
        let outbox = config
            .audit
            .then(|| crate::engine::Outbox::new(config.trail_capacity));
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
            raising: AtomicUsize::new(shards_len),
            outlet,
        }
    }

    /// The set of `shards`, each journaling its steps for a durable store
    /// (see [`Shard::enable_journal`]; call it after [`crate::engine::resume`]).
    /// Each shard is then driven by one [`Pipeline`](super::Pipeline).
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
    pub fn outbox(&self) -> Option<&crate::engine::Outbox> {
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
        self.outlet.wake(owner);
    }

    /// One shard's driver will decide no more deliveries, so it raises no
    /// more pauses for other shards; the last driver to say so wakes every
    /// shard ([`Outlet::wake`]), so that those waiting for it can stop.
    /// Each driver calls it once ([`Pipeline::next`] does).
    ///
    /// [`Pipeline::next`]: super::Pipeline::next
    pub(super) fn quiet(&self) {
        // AcqRel: a driver that reads zero also sees every pause queued
        // before the others went quiet (`queue_pause` pushes to the inbox
        // before the raising driver can get here).
        if self.raising.fetch_sub(1, Ordering::AcqRel) == 1 {
            for shard in 0..self.cells.len() {
                self.outlet.wake(shard);
            }
        }
    }

    /// Whether no shard's driver can raise a pause any more.
    pub(super) fn all_quiet(&self) -> bool {
        self.raising.load(Ordering::Acquire) == 0
    }

    /// How many pauses wait in shard `shard`'s inbox.
    pub fn queued_pauses(&self, shard: usize) -> usize {
        self.cells[shard].inbox.lock().len()
    }

    /// The pauses queued for shard `shard`, taken out.
    pub(super) fn take_pauses(&self, shard: usize) -> Vec<PauseRequest> {
        std::mem::take(&mut *self.cells[shard].inbox.lock())
    }

    /// Shard `shard`, locked as it is (its effect tap untouched).
    pub(super) fn shard(&self, shard: usize) -> MutexGuard<'_, Shard> {
        self.cells[shard].shard.lock()
    }

    /// Shard `shard`, locked, its effect tap set by the [`Outlet`].
    pub(super) fn lock(&self, shard: usize) -> MutexGuard<'_, Shard> {
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
    /// commit, which the shard's [`Pipeline`](super::Pipeline) drives.
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
    pub(super) fn put_back(&self, shard: usize, pause: PauseRequest) {
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
            match process(&mut guard, self.ctx(), &mut item, true, &[], None) {
                Ran::Done(Done::Unread(pause)) => self.put_back(shard, pause),
                Ran::Done(d) => {
                    done.push(d);
                    kept.push(item);
                }
                // In memory (`consume`) a miss is answered, never asked for.
                Ran::Fetch(..) => unreachable!("an in-memory batch stopped for a read"),
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
    pub(super) fn finish<R: Reply>(&self, shard: &Shard, items: Vec<Item<R>>, done: Vec<Done>) {
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
    pub(super) fn fail<R: Reply>(&self, shard: usize, items: Vec<Item<R>>, error: &StoreError) {
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
