//! The task that drives one shard: takes what its mailbox holds, decides it,
//! commits it when there is a durable store, and only then answers.
//!
//! In memory, a caller that finds the shard idle runs its own step
//! ([`ShardCell::try_deliver`]): one lock instead of a mailbox message, a
//! task wake-up and a reply. The shard's state sits behind a mutex that the
//! task and such callers share, so exactly one step runs on a shard at a
//! time, whoever runs it.
//!
//! With a durable store the task pipelines: while one group of steps is in
//! the committer, it decides what arrives on top of the uncommitted journal,
//! so the next group is ready the moment the previous commit ends. Answers
//! still leave only after their own group committed, in order; a failed
//! commit rolls memory and registry back to the last committed step,
//! answers `retry` to the failed group and decides the later steps again
//! (see the core's `engine::journal`).

use super::batch::{lost_receipt, BatchPart};
use super::{Command, Notification};
use crate::core::{Context, PauseRequest, Shard};
use crate::store::{Committer, StoreError};
use crate::{
    AuthoritativeSnapshot, Delivery, Receipt, ReconcileError, ReconcileReport, RejectReason,
    RetryReason,
};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use tokio::sync::{broadcast, mpsc, oneshot, Notify};

/// One shard's state and inbox, shared by its task, the other shards (which
/// send it pauses) and, in memory, the callers that find it idle.
pub(super) struct ShardCell {
    /// The actors of this shard. A std mutex: held for one step, or one batch
    /// of steps, and never across an await; whoever holds it is the only one
    /// deciding on this shard.
    shard: Mutex<Shard>,
    /// Pause requests for this shard's objects, from any shard (its own
    /// included), and pauses whose commit failed, to run before the next
    /// step. Unbounded so that two shards pausing each other can never wait
    /// on each other (each request comes from one recorded variant, so the
    /// list is bounded by the deliveries already accepted). A std mutex
    /// taken last and only to push or take the list, so holding a shard's
    /// lock while pushing to another's inbox cannot deadlock.
    inbox: Mutex<Vec<PauseRequest>>,
    /// Wakes the task when a pause arrives and nothing else would.
    wake: Notify,
    /// Where decisions and effects are published once their step is
    /// recorded (in memory: right after it; durable: after its commit).
    notices: broadcast::Sender<Notification>,
}

impl ShardCell {
    /// A cell holding `shard`, publishing to `notices`.
    pub(super) fn new(shard: Shard, notices: broadcast::Sender<Notification>) -> Self {
        Self {
            shard: Mutex::new(shard),
            inbox: Mutex::new(Vec::new()),
            wake: Notify::new(),
            notices,
        }
    }

    /// Turns the shard's effect tap on while someone is subscribed.
    fn tap(&self, shard: &mut Shard) {
        shard.tap_effects(self.notices.receiver_count() > 0);
    }

    /// Publishes a recorded step: its decision (if one was recorded), then
    /// its effects. Called with the shard locked, so that one shard's
    /// notifications leave in step order. Nobody listening is not an error.
    fn publish(&self, receipt: Option<&Receipt>, effects: Effects) {
        if self.notices.receiver_count() == 0 {
            return;
        }
        if let Some(r) = receipt.filter(|r| r.decision().is_some()) {
            let _ = self.notices.send(Notification::Decision(r.clone()));
        }
        for effect in effects {
            let _ = self.notices.send(Notification::Effect(effect));
        }
    }

    /// The shard, locked (a poisoned lock still holds a consistent shard:
    /// every step leaves it whole before it can panic in a caller's code).
    fn lock(&self) -> MutexGuard<'_, Shard> {
        self.shard.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a pause for this shard and wakes its task.
    fn push_pause(&self, pause: PauseRequest) {
        self.inbox
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(pause);
        self.wake.notify_one();
    }

    /// The queued pauses, taken out.
    fn take_pauses(&self) -> Vec<PauseRequest> {
        std::mem::take(&mut *self.inbox.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Runs one in-memory delivery on the caller's thread if no step is
    /// running on this shard (the task or another caller holds it): the
    /// queued pauses first, then the step, then its pause request forwarded,
    /// exactly what the task would do with the delivery alone in its batch.
    /// Takes the delivery out of `slot` only when it runs it; `None` (the
    /// delivery left in `slot`, for the mailbox) when the shard is busy.
    ///
    /// Only for the in-memory receiver: with a durable store a step's answer
    /// waits for its commit, which the task drives.
    pub(super) fn try_deliver(
        &self,
        ctx: &Context,
        peers: &[Arc<ShardCell>],
        slot: &mut Option<Delivery>,
    ) -> Option<Receipt> {
        let mut shard = match self.shard.try_lock() {
            Ok(shard) => shard,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        let delivery = slot.take()?;
        self.tap(&mut shard);
        for pause in self.take_pauses() {
            shard.pause(ctx, &pause);
        }
        let step = shard.deliver(ctx, delivery);
        let effects = shard.take_effects();
        if let Some(pause) = step.pause {
            forward(peers, pause);
        }
        self.publish(Some(&step.receipt), effects);
        drop(shard);
        Some(step.receipt)
    }
}

/// Hands a pause raised by a delivery to the shard owning its object.
fn forward(peers: &[Arc<ShardCell>], pause: PauseRequest) {
    let owner = pause.owner(peers.len());
    peers[owner].push_pause(pause);
}

/// The task that drives one shard.
pub(super) struct ShardTask {
    /// This shard's state, shared with the callers and the other shards.
    pub(super) cell: Arc<ShardCell>,
    /// Registry, clock, configuration.
    pub(super) ctx: Arc<Context>,
    /// Deliveries, reconciliations and reads; bounded (backpressure).
    pub(super) mailbox: mpsc::Receiver<Command>,
    /// Every shard's cell, indexed by shard (where pauses are sent).
    pub(super) peers: Arc<[Arc<ShardCell>]>,
    /// The durable store's committer; `None` for the in-memory store.
    pub(super) store: Option<Arc<Committer>>,
}

/// Most messages one shard step batch takes from its mailbox.
const MAX_BATCH: usize = 256;
/// Most times a durable shard task yields, after a group was answered, for
/// the callers it answered to send their next deliveries (it stops at the
/// first yield after which nothing new arrived).
const REJOIN_YIELDS: usize = 4;
/// How often a batch is decided again after write conflicts with other
/// receiver processes before its callers get `retry`.
const MAX_REDO: usize = 8;

/// One message of a batch, kept until its commit is known.
enum Work {
    Pause(PauseRequest),
    /// The delivery (taken out once processed without a durable store).
    Deliver(Option<Delivery>, oneshot::Sender<Receipt>),
    /// This shard's part of a [`Receiver::deliver_batch`] call, in order
    /// (each taken out once processed without a durable store).
    DeliverMany(Vec<Option<Delivery>>, BatchPart),
    Reconcile(
        AuthoritativeSnapshot,
        oneshot::Sender<Result<ReconcileReport, ReconcileError>>,
    ),
    Read(Box<dyn FnOnce(&Shard) + Send>),
}

/// What processing one [`Work`] produced, sent only after the commit.
enum Done {
    Paused,
    Delivered(Receipt, Option<PauseRequest>, Effects),
    DeliveredMany(Vec<(Receipt, Option<PauseRequest>, Effects)>),
    Reconciled(Result<ReconcileReport, ReconcileError>, Effects),
    Read,
}

/// The effects of one step, published with it.
type Effects = Vec<crate::Replacement>;

/// Steps decided together and committed in one transaction, with what each
/// will answer once the commit is known.
#[derive(Default)]
struct Group {
    /// The messages, in the order they were decided.
    works: Vec<Work>,
    /// What each produced (same index).
    done: Vec<Done>,
    /// How many times the group was decided again after a conflict.
    redo: usize,
    /// Deliveries the store refused to record (their bodies, and the
    /// store's cause): when the group is decided again they are answered
    /// `reject` instead of being decided (see [`refused`]).
    refused: Vec<(Arc<[u8]>, String)>,
}

impl Group {
    /// Whether a read waits in the group: it must see the shard as the
    /// group leaves it, so nothing is decided on top until it is answered.
    fn reads(&self) -> bool {
        self.works.iter().any(|w| matches!(w, Work::Read(_)))
    }
}

/// A group's commit, running in the committer.
type Commit = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send>>;

impl ShardTask {
    pub(super) async fn run(self) {
        match self.store.clone() {
            None => self.run_in_memory().await,
            Some(store) => self.run_durable(store).await,
        }
    }

    /// The in-memory loop: each batch of messages is decided and answered
    /// under one hold of the shard's lock.
    async fn run_in_memory(mut self) {
        let mut stopping = false;
        while !stopping {
            let mut works = Vec::new();
            tokio::select! {
                biased;
                () = self.cell.wake.notified() => {}
                command = self.mailbox.recv() => match command {
                    Some(command) => stopping = !Work::collect(command, &mut works),
                    None => stopping = true,
                },
            }
            while !stopping && works.len() < MAX_BATCH {
                match self.mailbox.try_recv() {
                    Ok(command) => stopping = !Work::collect(command, &mut works),
                    Err(_) => break,
                }
            }
            self.run_batch(works);
        }
        // Drain: what was accepted before the shutdown is still decided.
        self.mailbox.close();
        loop {
            let mut works = Vec::new();
            while works.len() < MAX_BATCH {
                match self.mailbox.recv().await {
                    Some(command) => {
                        Work::collect(command, &mut works);
                    }
                    None => break,
                }
            }
            if works.is_empty() {
                // The pauses still queued, then stop.
                self.run_batch(works);
                break;
            }
            self.run_batch(works);
        }
    }

    /// Decides and answers one in-memory batch. Pauses that arrived
    /// meanwhile go first: a pause enqueued before a delivery's sender got
    /// its receipt is always seen before any later delivery of the paused
    /// object.
    fn run_batch(&self, works: Vec<Work>) {
        let mut shard = self.cell.lock();
        self.cell.tap(&mut shard);
        let mut all: Vec<Work> = self
            .cell
            .take_pauses()
            .into_iter()
            .map(Work::Pause)
            .collect();
        all.extend(works);
        let done: Vec<Done> = all
            .iter_mut()
            .map(|w| process(&mut shard, &self.ctx, w, true, &[]))
            .collect();
        self.finish(&shard, all, done);
    }

    /// The durable loop, pipelined: one group in the committer at a time
    /// while the next one is decided on top of it.
    async fn run_durable(mut self, store: Arc<Committer>) {
        // Decided, waiting for the group in flight to be answered.
        let mut next = Group::default();
        // Handed to the committer, with its commit.
        let mut in_flight: Option<(Group, Commit)> = None;
        // A shutdown was received: the mailbox is closed and drained.
        let mut stopping = false;
        // The mailbox is closed and empty.
        let mut drained = false;
        // Rounds in which only pauses were left after the shutdown.
        let mut idle_rounds = 0;
        // A group was just answered: its callers are about to send again.
        let mut answered = false;
        loop {
            if in_flight.is_none() && !next.works.is_empty() {
                if std::mem::take(&mut answered) && !drained {
                    // Let the callers just answered run first (they were
                    // woken on this worker), so that what they send next
                    // joins the group handed over now rather than waiting a
                    // whole commit for the one after.
                    // Again while they keep arriving, a few times at most.
                    let mut works = Vec::new();
                    for _ in 0..REJOIN_YIELDS {
                        tokio::task::yield_now().await;
                        let before = works.len();
                        self.receive_ready(&mut works, next.works.len(), &mut stopping);
                        if works.len() == before {
                            break;
                        }
                    }
                    self.decide(&mut next, works);
                }
                let group = std::mem::take(&mut next);
                let writes = self.cell.lock().take_writes();
                if writes.is_empty() {
                    self.settle(group, Ok(()), &mut next, &store).await;
                    continue;
                }
                let committer = store.clone();
                let commit: Commit = Box::pin(async move { committer.commit(writes).await });
                in_flight = Some((group, commit));
            }
            if drained && in_flight.is_none() && next.works.is_empty() {
                let pauses = self.cell.take_pauses();
                if pauses.is_empty() {
                    break;
                }
                // Only pauses are left; if the store keeps refusing them,
                // stop after a few tries rather than spin (they are logged).
                idle_rounds += 1;
                if idle_rounds > 3 {
                    tracing::error!(
                        pauses = pauses.len(),
                        "shutting down with pauses the store did not record"
                    );
                    break;
                }
                self.decide(&mut next, pauses.into_iter().map(Work::Pause).collect());
                continue;
            }
            // A read answers with the shard as its group leaves it: decide
            // nothing more until it is answered.
            let reading = next.reads() || in_flight.as_ref().is_some_and(|(g, _)| g.reads());
            let room = !reading && next.works.len() < MAX_BATCH;
            let committing = in_flight.is_some();
            let mut works = Vec::new();
            tokio::select! {
                biased;
                result = async { in_flight.as_mut().expect("guarded").1.as_mut().await }, if committing => {
                    let (group, _) = in_flight.take().expect("guarded");
                    self.settle(group, result, &mut next, &store).await;
                    answered = true;
                    continue;
                }
                () = self.cell.wake.notified(), if room && !stopping => {}
                command = self.mailbox.recv(), if room && !drained => match command {
                    Some(command) => {
                        if !Work::collect(command, &mut works) {
                            stopping = true;
                            self.mailbox.close();
                        }
                    }
                    None => drained = true,
                },
            }
            self.receive_ready(&mut works, next.works.len(), &mut stopping);
            self.decide(&mut next, works);
        }
    }

    /// Adds to `works` what the mailbox already holds, up to `MAX_BATCH`
    /// with the `decided` ones, without waiting. A shutdown closes the
    /// mailbox (what it holds is still taken) and sets `stopping`.
    fn receive_ready(&mut self, works: &mut Vec<Work>, decided: usize, stopping: &mut bool) {
        while works.len() + decided < MAX_BATCH {
            match self.mailbox.try_recv() {
                Ok(command) => {
                    if !Work::collect(command, works) {
                        *stopping = true;
                        self.mailbox.close();
                    }
                }
                Err(_) => break,
            }
        }
    }

    /// Decides `works` into `next` on top of whatever is uncommitted, the
    /// queued pauses first (see [`ShardTask::run_batch`]).
    fn decide(&self, next: &mut Group, works: Vec<Work>) {
        let mut shard = self.cell.lock();
        self.cell.tap(&mut shard);
        let pauses = self.cell.take_pauses().into_iter().map(Work::Pause);
        for mut work in pauses.chain(works) {
            let done = process(&mut shard, &self.ctx, &mut work, false, &next.refused);
            next.done.push(done);
            next.works.push(work);
        }
    }

    /// Acts on a group's commit result. Committed: answers it. Refused
    /// because another process changed a row: rolls back, reloads, and
    /// decides the group and everything after it again (up to `MAX_REDO`
    /// times). Failed: rolls back, answers the group `retry`, and decides
    /// the later steps again on the rolled-back state.
    async fn settle(
        &self,
        mut group: Group,
        result: Result<(), StoreError>,
        next: &mut Group,
        store: &Committer,
    ) {
        match result {
            Ok(()) => {
                let mut shard = self.cell.lock();
                shard.committed();
                self.finish(&shard, group.works, group.done);
            }
            Err(StoreError::Conflict(why)) if group.redo < MAX_REDO => {
                let touched = self.cell.lock().rolled_back(&self.ctx);
                tracing::debug!(%why, redo = group.redo, "concurrent change: reloading and deciding again");
                let later = std::mem::take(next);
                match store.refresh(touched.objects, touched.receipts).await {
                    Ok(reloaded) => {
                        self.cell.lock().refresh(&self.ctx, reloaded);
                        group.works.extend(later.works);
                        next.redo = group.redo + 1;
                        next.refused = group.refused;
                        self.decide(next, group.works);
                    }
                    Err(e) => {
                        self.fail(group.works, e);
                        next.redo = later.redo;
                        self.decide(next, later.works);
                    }
                }
            }
            Err(StoreError::Refused {
                cause,
                body: Some(body),
            }) => {
                // One delivery's rows cannot be stored: decide the group and
                // everything after it again without that delivery, which is
                // answered `reject` (docs/CONTRACT.md, fault isolation).
                self.cell.lock().rolled_back(&self.ctx);
                tracing::warn!(%cause, "the store refused a delivery: it is rejected, the rest decided again");
                let later = std::mem::take(next);
                group.works.extend(later.works);
                next.redo = group.redo;
                next.refused = group.refused;
                next.refused.push((body, cause));
                self.decide(next, group.works);
            }
            Err(e) => {
                self.cell.lock().rolled_back(&self.ctx);
                self.fail(group.works, e);
                let later = std::mem::take(next);
                next.redo = later.redo;
                self.decide(next, later.works);
            }
        }
    }

    /// The batch is recorded: forward pauses first, then answer.
    fn finish(&self, shard: &Shard, works: Vec<Work>, done: Vec<Done>) {
        for (work, done) in works.into_iter().zip(done) {
            match (work, done) {
                (Work::Deliver(_, reply), Done::Delivered(receipt, pause, effects)) => {
                    if let Some(pause) = pause {
                        forward(&self.peers, pause);
                    }
                    self.cell.publish(Some(&receipt), effects);
                    // The caller may have given up waiting; the step is recorded anyway.
                    let _ = reply.send(receipt);
                }
                (Work::DeliverMany(_, mut part), Done::DeliveredMany(steps)) => {
                    let mut receipts = Vec::with_capacity(steps.len());
                    for (receipt, pause, effects) in steps {
                        if let Some(pause) = pause {
                            forward(&self.peers, pause);
                        }
                        self.cell.publish(Some(&receipt), effects);
                        receipts.push(receipt);
                    }
                    part.answer(receipts);
                }
                (Work::Reconcile(_, reply), Done::Reconciled(result, effects)) => {
                    self.cell.publish(None, effects);
                    let _ = reply.send(result);
                }
                (Work::Read(read), _) => read(shard),
                _ => {}
            }
        }
    }

    /// The store could not commit: nothing of the group happened. Deliveries
    /// get `retry`, reconciliations an error, pauses are tried again.
    fn fail(&self, works: Vec<Work>, error: StoreError) {
        // A debug line, not a warning: every failed commit was already
        // warned of by the committer, through a log gate, so that an outage
        // writes one line per interval, not one per shard and group.
        tracing::debug!(%error, "batch not recorded: callers get retry");
        for work in works {
            match work {
                Work::Pause(pause) => self
                    .cell
                    .inbox
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(pause),
                Work::Deliver(delivery, reply) => {
                    let why = RetryReason::StoreFailed(error.clone());
                    if let Some(delivery) = delivery {
                        let _ = reply.send(Receipt::retry(&delivery, why));
                    }
                }
                Work::DeliverMany(deliveries, mut part) => {
                    let why = RetryReason::StoreFailed(error.clone());
                    part.answer(
                        deliveries
                            .iter()
                            .map(|d| {
                                d.as_ref()
                                    .map_or_else(lost_receipt, |d| Receipt::retry(d, why.clone()))
                            })
                            .collect(),
                    );
                }
                Work::Reconcile(_, reply) => {
                    let _ = reply.send(Err(ReconcileError::StoreFailed(error.clone())));
                }
                Work::Read(read) => read(&self.cell.lock()),
            }
        }
    }
}

/// Runs one work item on the shard. `consume` moves the delivery out
/// (in-memory store: no redo is possible, so no copy is needed); a delivery
/// among the `refused` ones is answered `reject` without being decided.
fn process(
    shard: &mut Shard,
    ctx: &Context,
    work: &mut Work,
    consume: bool,
    refused_bodies: &[(Arc<[u8]>, String)],
) -> Done {
    match work {
        Work::Pause(pause) => {
            shard.pause(ctx, pause);
            Done::Paused
        }
        Work::Deliver(delivery, _) => {
            let done = refused(delivery, refused_bodies)
                .or_else(|| deliver(shard, ctx, delivery, consume));
            match done {
                Some((receipt, pause, effects)) => Done::Delivered(receipt, pause, effects),
                None => Done::Read,
            }
        }
        Work::DeliverMany(deliveries, _) => Done::DeliveredMany(
            deliveries
                .iter_mut()
                .filter_map(|d| {
                    refused(d, refused_bodies).or_else(|| deliver(shard, ctx, d, consume))
                })
                .collect(),
        ),
        Work::Reconcile(snapshot, _) => {
            let result = shard.reconcile(ctx, snapshot);
            Done::Reconciled(result, shard.take_effects())
        }
        Work::Read(_) => Done::Read,
    }
}

/// The `reject` answer of a delivery whose body is among the `refused`
/// ones (the store could not hold its rows); `None` for any other.
fn refused(
    delivery: &Option<Delivery>,
    refused: &[(Arc<[u8]>, String)],
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

/// Decides one delivery of a work item; `None` if it was already taken.
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

impl Work {
    /// Appends the work of a mailbox command to `works`; `false` for
    /// `Shutdown` (nothing appended).
    fn collect(command: Command, works: &mut Vec<Work>) -> bool {
        match command {
            Command::Deliver(d, reply) => works.push(Work::Deliver(Some(d), reply)),
            Command::DeliverMany(deliveries, part) => works.push(Work::DeliverMany(
                deliveries.into_iter().map(Some).collect(),
                part,
            )),
            Command::Reconcile(s, reply) => works.push(Work::Reconcile(s, reply)),
            Command::Read(read) => works.push(Work::Read(read)),
            Command::Shutdown => return false,
        }
        true
    }
}
