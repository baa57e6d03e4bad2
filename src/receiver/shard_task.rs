//! The task that drives one shard on tokio: takes what its mailbox holds and
//! hands it to the core's driver (`engine::ShardSet` in memory,
//! `engine::Pipeline` with a durable store), which decides, commits through
//! this task and only then answers.
//!
//! What decides who answers when lives in the core, where the loom models
//! check it as it ships; this file keeps what is tokio's: the mailboxes,
//! the oneshot replies, the broadcast of notifications, the commit future,
//! the blocking thread a bounded shard's reads run on, and the `select!`
//! that waits on them.

use super::batch::BatchPart;
use super::{Command, Notification};
use crate::core::engine::{self, Answer, Fetch, Fetched, Next, Pipeline, Work, MAX_BATCH};
use crate::core::reconciler::NeedReason;
use crate::core::Shard;
use crate::store::{Committer, ObjectSource, StoreError};
use crate::{Receipt, ReconcileError, ReconcileReport};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{broadcast, mpsc, oneshot, Notify};

/// The receiver's shards, driven by the core.
pub(super) type Shards = engine::ShardSet<Outlet>;

/// Where the core's driver sends notifications and wake-ups.
pub(super) struct Outlet {
    /// Where decisions and effects are published once their step is
    /// recorded (in memory: right after it; durable: after its commit).
    notices: broadcast::Sender<Notification>,
    /// One per shard: wakes its task when a pause arrives for it, or when
    /// the last task that could raise one went quiet. tokio's, so the task
    /// can wait on it in its `select!`.
    wakes: Box<[Notify]>,
    /// The reconciler's intake ([`Outlet::tap_needs`]): only the decisions
    /// that need an authority, so that a running reconciler costs every
    /// other decision one check instead of a receipt copied to a broadcast.
    /// A std mutex: taken only for those few decisions, never across an
    /// await.
    needs: Mutex<Option<NeedTap>>,
    /// Whether `needs` holds a tap, read on every decision without its lock.
    tapped: AtomicBool,
    /// Most needs a tap holds ([`crate::ReceiverBuilder::subscriber_capacity`]).
    need_capacity: usize,
}

/// Where the decisions that need an authority go ([`Outlet::tap_needs`]).
struct NeedTap {
    /// Bounded: a full channel drops the need and sets `lagged`.
    tx: mpsc::Sender<(Arc<str>, NeedReason)>,
    /// Set when a need was dropped: the reconciler scans the shards again.
    lagged: Arc<AtomicBool>,
}

/// The reconciler's end of [`Outlet::tap_needs`].
pub(crate) struct NeedTapReceiver {
    /// Each decision that needs an authority: the object and why.
    pub(crate) rx: mpsc::Receiver<(Arc<str>, NeedReason)>,
    /// Set (to be swapped back) when needs were dropped for a full channel.
    pub(crate) lagged: Arc<AtomicBool>,
}

impl Outlet {
    /// An outlet publishing to `notices`, for `shards` shard tasks, whose
    /// need tap holds at most `need_capacity` needs.
    pub(super) fn new(
        notices: broadcast::Sender<Notification>,
        shards: usize,
        need_capacity: usize,
    ) -> Self {
        Self {
            notices,
            wakes: (0..shards).map(|_| Notify::new()).collect(),
            needs: Mutex::new(None),
            tapped: AtomicBool::new(false),
            need_capacity,
        }
    }

    /// From now on, the object and the reason of each recorded decision
    /// that needs an authority ([`NeedReason::of_verdict`]; a hold for an
    /// object the receiver does not know is `unknown_object`) are sent to
    /// the returned receiver, at most the outlet's need capacity waiting
    /// (past that they are dropped and `lagged` is set). Replaces an
    /// earlier tap.
    pub(crate) fn tap_needs(&self) -> NeedTapReceiver {
        let (tx, rx) = mpsc::channel(self.need_capacity.max(1));
        let lagged = Arc::new(AtomicBool::new(false));
        *crate::locks::lock(&self.needs) = Some(NeedTap {
            tx,
            lagged: lagged.clone(),
        });
        self.tapped.store(true, Ordering::Release);
        NeedTapReceiver { rx, lagged }
    }

    /// Sends `receipt`'s need, if it has one, to the tap.
    fn note_need(&self, receipt: &Receipt) {
        let (Some(object_id), Some(verdict)) = (
            receipt.object_id.as_ref(),
            receipt.decision().and_then(|d| d.as_verdict()),
        ) else {
            return;
        };
        let Some(mut reason) = NeedReason::of_verdict(verdict) else {
            return;
        };
        if receipt.object.is_none() {
            // Held for an object the receiver does not know: parked.
            reason = NeedReason::UnknownObject;
        }
        let mut needs = crate::locks::lock(&self.needs);
        let Some(tap) = needs.as_ref() else {
            return;
        };
        match tap.tx.try_send((object_id.clone(), reason)) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => tap.lagged.store(true, Ordering::Release),
            Err(mpsc::error::TrySendError::Closed(_)) => {
                // The reconciler stopped.
                *needs = None;
                self.tapped.store(false, Ordering::Release);
            }
        }
    }
}

impl engine::Outlet for Outlet {
    fn listening(&self) -> bool {
        self.notices.receiver_count() > 0 || self.tapped.load(Ordering::Acquire)
    }

    fn decision(&self, receipt: &Receipt) {
        // Nobody listening is not an error.
        if self.notices.receiver_count() > 0 {
            let _ = self.notices.send(Notification::Decision(receipt.clone()));
        }
        if self.tapped.load(Ordering::Acquire) {
            self.note_need(receipt);
        }
    }

    fn effect(&self, effect: crate::EffectRecord) {
        if self.notices.receiver_count() > 0 {
            let _ = self.notices.send(Notification::Effect(effect));
        }
    }

    fn wake(&self, shard: usize) {
        self.wakes[shard].notify_one();
    }
}

/// How a mailbox command's caller gets its answer.
pub(super) enum Reply {
    One(oneshot::Sender<Receipt>),
    /// This shard's part of a `Receiver::deliver_batch` call.
    Many(BatchPart),
    Reconcile(oneshot::Sender<Result<ReconcileReport, ReconcileError>>),
    Read(Box<dyn FnOnce(&Shard) + Send>),
}

impl engine::Reply for Reply {
    fn answer(self, answer: Answer<'_>) {
        // The caller may have given up waiting; the step is recorded anyway.
        match (self, answer) {
            (Reply::One(tx), Answer::Delivered(receipt)) => {
                let _ = tx.send(receipt);
            }
            (Reply::Many(mut part), Answer::DeliveredMany(receipts)) => part.answer(receipts),
            (Reply::Reconcile(tx), Answer::Reconciled(result)) => {
                let _ = tx.send(result);
            }
            (Reply::Read(read), Answer::Read(shard)) => read(shard),
            // The driver answers each work with an answer of its own kind.
            _ => {}
        }
    }
}

/// The task that drives one shard.
pub(super) struct ShardTask {
    /// Every shard, shared with the callers (and the other tasks, which
    /// queue pauses for this one).
    pub(super) shards: Arc<Shards>,
    /// Which of them this task drives.
    pub(super) index: usize,
    /// Deliveries, reconciliations and reads; bounded (backpressure).
    pub(super) mailbox: mpsc::Receiver<Command>,
    /// The durable store's committer; `None` for the in-memory store.
    pub(super) store: Option<Arc<Committer>>,
    /// The shard's own connection to the store, for what a bounded shard
    /// asks to read ([`Next::Fetch`]); `None` when every object stays in
    /// memory.
    pub(super) source: Option<Box<dyn ObjectSource>>,
}

/// Most times a durable shard task yields, after a group was answered, for
/// the callers it answered to send their next deliveries (it stops at the
/// first yield after which nothing new arrived).
const REJOIN_YIELDS: usize = 4;

/// A group's commit, running in the committer.
type Commit = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send>>;

/// Appends the work of a mailbox command to `works`; `false` for `Shutdown`
/// (nothing appended).
fn collect(command: Command, works: &mut Vec<Work<Reply>>) -> bool {
    works.push(match command {
        Command::Deliver(d, reply) => Work::Deliver(d, Reply::One(reply)),
        Command::DeliverMany(ds, part) => Work::DeliverMany(ds, Reply::Many(part)),
        Command::Reconcile(s, reply) => Work::Reconcile(s, Reply::Reconcile(reply)),
        Command::Read(read) => Work::Read(Reply::Read(read)),
        Command::Shutdown => return false,
    });
    true
}

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
        let shards = self.shards.clone();
        while !stopping {
            let mut works = Vec::new();
            tokio::select! {
                biased;
                () = shards.outlet().wakes[self.index].notified() => {}
                command = self.mailbox.recv() => match command {
                    Some(command) => stopping = !collect(command, &mut works),
                    None => stopping = true,
                },
            }
            stopping |= self.receive_ready(&mut works, MAX_BATCH);
            self.shards.run_batch(self.index, works);
        }
        // Drain: what was accepted before the shutdown is still decided.
        self.mailbox.close();
        loop {
            let mut works = Vec::new();
            while works.len() < MAX_BATCH {
                match self.mailbox.recv().await {
                    Some(command) => {
                        collect(command, &mut works);
                    }
                    None => break,
                }
            }
            let last = works.is_empty();
            // The last round runs the pauses still queued, then stops.
            self.shards.run_batch(self.index, works);
            if last {
                break;
            }
        }
    }

    /// The durable loop: the core's [`Pipeline`] says what to do next
    /// ([`Pipeline::next`]: commit, let the callers just answered send
    /// again, wait, stop); this task does it with tokio's means (the
    /// committer's future, the mailbox, the shard's wake-up, yields).
    async fn run_durable(mut self, store: Arc<Committer>) {
        let shards = self.shards.clone();
        let mut pipeline = Pipeline::new(self.index);
        // The commit of the group in the committer's hands.
        let mut commit: Option<Commit> = None;
        loop {
            let (committing, wake, receive) = match pipeline.next(&shards) {
                Next::Commit(writes) => {
                    // Sent now: it commits while this task reads the store.
                    commit = Some(Box::pin(store.commit(writes)));
                    continue;
                }
                Next::Fetch(fetch) => {
                    // The shard decides nothing until the rows are back; a
                    // commit in flight goes on meanwhile.
                    let result = self.fetch(&fetch).await;
                    pipeline.fetched(&shards, &fetch, result);
                    continue;
                }
                Next::Rejoin => {
                    // Let the callers just answered run first (they were
                    // woken on this worker), again while they keep sending,
                    // a few times at most.
                    let mut works = Vec::new();
                    for _ in 0..REJOIN_YIELDS {
                        tokio::task::yield_now().await;
                        let before = works.len();
                        if self.receive_ready(&mut works, pipeline.room()) {
                            pipeline.closing();
                        }
                        if works.len() == before {
                            break;
                        }
                    }
                    pipeline.decide(&shards, works);
                    continue;
                }
                Next::Wait {
                    commit,
                    wake,
                    receive,
                } => (commit, wake, receive),
                Next::Stop => break,
            };
            let mut works = Vec::new();
            let mut woken = false;
            tokio::select! {
                biased;
                result = async { commit.as_mut().expect("guarded").as_mut().await }, if committing => {
                    commit = None;
                    if let Some(touched) = pipeline.settle(&shards, result) {
                        let reloaded = store.refresh(touched.objects, touched.receipts).await;
                        pipeline.reloaded(&shards, reloaded);
                    }
                    continue;
                }
                () = shards.outlet().wakes[self.index].notified(), if wake => woken = true,
                command = self.mailbox.recv(), if receive > 0 => match command {
                    Some(command) => {
                        if !collect(command, &mut works) {
                            pipeline.closing();
                            self.mailbox.close();
                        }
                    }
                    None => pipeline.drained(),
                },
            }
            if self.receive_ready(&mut works, receive) {
                pipeline.closing();
            }
            if woken && works.is_empty() {
                pipeline.woken(&shards);
            } else {
                pipeline.decide(&shards, works);
            }
        }
    }

    /// Reads what the shard asked for on its own connection, on a blocking
    /// thread: the read may wait on the database, and a tokio worker must
    /// not.
    async fn fetch(&mut self, fetch: &Fetch) -> Result<Fetched, StoreError> {
        let Some(mut source) = self.source.take() else {
            return Err(StoreError::Failed(
                "this shard has no connection to the store to read from".to_owned(),
            ));
        };
        let wanted = fetch.clone();
        let read = tokio::task::spawn_blocking(move || {
            let result = wanted.read(&mut *source);
            (source, result)
        });
        match read.await {
            Ok((source, result)) => {
                self.source = Some(source);
                result
            }
            // The connection went with the thread: every later read of
            // this shard fails (its deliveries are answered `retry`) until
            // the receiver is built again.
            Err(e) => {
                tracing::error!(shard = self.index, error = %e, "a read of the store stopped: this shard has lost its connection to the store");
                Err(StoreError::Failed(format!(
                    "a read of the store stopped: {e}"
                )))
            }
        }
    }

    /// Adds to `works` what the mailbox already holds, up to `room` items
    /// in all, without waiting. A shutdown closes the mailbox (what it holds
    /// is still taken); returns whether one was taken.
    fn receive_ready(&mut self, works: &mut Vec<Work<Reply>>, room: usize) -> bool {
        let mut shutdown = false;
        while works.len() < room {
            match self.mailbox.try_recv() {
                Ok(command) => {
                    if !collect(command, works) {
                        shutdown = true;
                        self.mailbox.close();
                    }
                }
                Err(_) => break,
            }
        }
        shutdown
    }
}
