//! The task that drives one shard: takes what its mailbox holds, decides it,
//! commits it when there is a durable store, and only then answers.

use super::batch::{lost_receipt, BatchPart};
use super::{Command, Notification};
use crate::core::{Context, PauseRequest, Shard};
use crate::store::{Committer, StoreError};
use crate::{
    AuthoritativeSnapshot, Delivery, Receipt, ReconcileError, ReconcileReport, RetryReason,
};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// The task that drives one shard.
pub(super) struct ShardTask {
    /// Which shard this is, to tell local pauses from remote ones.
    pub(super) index: usize,
    /// The actors this task owns.
    pub(super) shard: Shard,
    /// Registry, clock, configuration.
    pub(super) ctx: Arc<Context>,
    /// Deliveries, reconciliations and reads; bounded (backpressure).
    pub(super) mailbox: mpsc::Receiver<Command>,
    /// Pause requests from other shards. Unbounded so that two shards pausing
    /// each other can never wait on each other's full queue (no cycle of
    /// bounded channels); each request comes from one recorded variant, so
    /// the queue is bounded by the deliveries already accepted.
    pub(super) control: mpsc::UnboundedReceiver<PauseRequest>,
    /// Every shard's control sender, indexed by shard.
    pub(super) peers: Arc<[mpsc::UnboundedSender<PauseRequest>]>,
    /// The durable store's committer; `None` for the in-memory store.
    pub(super) store: Option<Arc<Committer>>,
    /// Pauses of this shard's own objects, or pauses whose commit failed,
    /// to run first in the next batch.
    pub(super) pending_pauses: Vec<PauseRequest>,
    /// Where committed decisions and effects are published.
    pub(super) notices: tokio::sync::broadcast::Sender<Notification>,
}

/// Most messages one shard step batch takes from its mailbox.
const MAX_BATCH: usize = 256;
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
/// Each carries the effects its steps made (tapped only while someone
/// subscribes), published with it after the commit.
enum Done {
    Paused,
    Delivered(Receipt, Option<PauseRequest>, Effects),
    DeliveredMany(Vec<(Receipt, Option<PauseRequest>, Effects)>),
    Reconciled(Result<ReconcileReport, ReconcileError>, Effects),
    Read,
}

/// The effects of one step.
type Effects = Vec<crate::Replacement>;

impl ShardTask {
    pub(super) async fn run(mut self) {
        let mut stopping = false;
        while !stopping {
            let mut works = Vec::new();
            tokio::select! {
                biased;
                Some(pause) = self.control.recv() => works.push(Work::Pause(pause)),
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
            if !works.is_empty() {
                self.run_batch(works).await;
            }
        }
        // Drain: what was accepted before the shutdown is still decided.
        self.mailbox.close();
        let mut idle_rounds = 0;
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
            if works.is_empty() && self.control.is_empty() && self.pending_pauses.is_empty() {
                break;
            }
            if works.is_empty() {
                // Only pauses are left; if the store keeps refusing them, stop
                // after a few tries rather than spin (they are logged).
                idle_rounds += 1;
                if idle_rounds > 3 {
                    tracing::error!(
                        pauses = self.pending_pauses.len(),
                        "shutting down with pauses the store did not record"
                    );
                    break;
                }
            }
            self.run_batch(works).await;
        }
    }

    /// Decides a batch, commits it when there is a durable store, then
    /// answers every caller. Pauses that arrived meanwhile go first: a pause
    /// enqueued before a delivery's sender got its receipt is always seen
    /// before any later delivery of the paused object.
    async fn run_batch(&mut self, works: Vec<Work>) {
        let mut all: Vec<Work> = std::mem::take(&mut self.pending_pauses)
            .into_iter()
            .map(Work::Pause)
            .collect();
        while let Ok(pause) = self.control.try_recv() {
            all.push(Work::Pause(pause));
        }
        all.extend(works);
        self.shard.tap_effects(self.notices.receiver_count() > 0);
        let Some(store) = self.store.clone() else {
            let done: Vec<Done> = all.iter_mut().map(|w| self.process(w, true)).collect();
            self.finish(all, done);
            return;
        };
        // The first decision, then up to MAX_REDO more after conflicts.
        for attempt in 0..=MAX_REDO {
            let done: Vec<Done> = all.iter_mut().map(|w| self.process(w, false)).collect();
            let writes = self.shard.take_writes();
            let result = if writes.is_empty() {
                Ok(())
            } else {
                store.commit(writes).await
            };
            match result {
                Ok(()) => {
                    self.shard.committed();
                    self.finish(all, done);
                    return;
                }
                Err(StoreError::Conflict(why)) if attempt < MAX_REDO => {
                    let touched = self.shard.rolled_back(&self.ctx);
                    tracing::debug!(%why, attempt, "concurrent change: reloading and deciding again");
                    match store.refresh(touched.objects, touched.receipts).await {
                        Ok(reloaded) => self.shard.refresh(&self.ctx, reloaded),
                        Err(e) => return self.fail(all, e),
                    }
                }
                Err(e) => {
                    self.shard.rolled_back(&self.ctx);
                    return self.fail(all, e);
                }
            }
        }
    }

    /// Runs one work item on the shard. `consume` moves the delivery out
    /// (in-memory store: no redo is possible, so no copy is needed).
    fn process(&mut self, work: &mut Work, consume: bool) -> Done {
        match work {
            Work::Pause(pause) => {
                self.shard.pause(&self.ctx, pause);
                Done::Paused
            }
            Work::Deliver(delivery, _) => match self.deliver(delivery, consume) {
                Some((receipt, pause, effects)) => Done::Delivered(receipt, pause, effects),
                None => Done::Read,
            },
            Work::DeliverMany(deliveries, _) => Done::DeliveredMany(
                deliveries
                    .iter_mut()
                    .filter_map(|d| self.deliver(d, consume))
                    .collect(),
            ),
            Work::Reconcile(snapshot, _) => {
                let result = self.shard.reconcile(&self.ctx, snapshot);
                Done::Reconciled(result, self.shard.take_effects())
            }
            Work::Read(_) => Done::Read,
        }
    }

    /// Decides one delivery of a work item; `None` if it was already taken.
    fn deliver(
        &mut self,
        delivery: &mut Option<Delivery>,
        consume: bool,
    ) -> Option<(Receipt, Option<PauseRequest>, Effects)> {
        let delivery = if consume {
            delivery.take()
        } else {
            delivery.clone()
        };
        let step = self.shard.deliver(&self.ctx, delivery?);
        Some((step.receipt, step.pause, self.shard.take_effects()))
    }

    /// Publishes a committed step: its decision (if one was recorded), then
    /// its effects. Nobody listening is not an error.
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

    /// Hands a pause raised by a delivery to the shard owning its object.
    fn forward(&mut self, pause: PauseRequest) {
        let owner = pause.owner(self.peers.len());
        if owner == self.index {
            self.pending_pauses.push(pause);
        } else if self.peers[owner].send(pause).is_err() {
            tracing::error!("pause request lost: shard {owner} stopped");
        }
    }

    /// The batch is recorded: forward pauses first, then answer.
    fn finish(&mut self, works: Vec<Work>, done: Vec<Done>) {
        for (work, done) in works.into_iter().zip(done) {
            match (work, done) {
                (Work::Deliver(_, reply), Done::Delivered(receipt, pause, effects)) => {
                    if let Some(pause) = pause {
                        self.forward(pause);
                    }
                    self.publish(Some(&receipt), effects);
                    // The caller may have given up waiting; the step is recorded anyway.
                    let _ = reply.send(receipt);
                }
                (Work::DeliverMany(_, mut part), Done::DeliveredMany(steps)) => {
                    let mut receipts = Vec::with_capacity(steps.len());
                    for (receipt, pause, effects) in steps {
                        if let Some(pause) = pause {
                            self.forward(pause);
                        }
                        self.publish(Some(&receipt), effects);
                        receipts.push(receipt);
                    }
                    part.answer(receipts);
                }
                (Work::Reconcile(_, reply), Done::Reconciled(result, effects)) => {
                    self.publish(None, effects);
                    let _ = reply.send(result);
                }
                (Work::Read(read), _) => read(&self.shard),
                _ => {}
            }
        }
    }

    /// The store could not commit: nothing of the batch happened. Deliveries
    /// get `retry`, reconciliations an error, pauses are tried again.
    fn fail(&mut self, works: Vec<Work>, error: StoreError) {
        tracing::warn!(%error, "batch not recorded: callers get retry");
        for work in works {
            match work {
                Work::Pause(pause) => self.pending_pauses.push(pause),
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
                Work::Read(read) => read(&self.shard),
            }
        }
    }
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
