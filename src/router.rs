//! The tokio shell: a cloneable [`Receiver`] handle that routes each delivery
//! by `object_id` to the shard task owning that object, and gets the
//! receipt back on a oneshot once the step is recorded.
//!
//! Parsing and fingerprinting run in the caller's task (they need no shared
//! state), so many producers parse in parallel and the shard tasks only
//! decide.

use crate::actor::{
    Config, Context, Counters, ObjectState, Outcome, PauseRequest, Receipt, RetryReason, Shard,
    UnresolvedInput,
};
use crate::audit::AuditRecord;
use crate::clock::{Clock, SystemClock};
use crate::envelope::Delivery;
use crate::metrics::{DecisionCounters, MetricsSnapshot};
use crate::reconcile::{AuthoritativeSnapshot, ReconcileError, ReconcileReport};
use crate::store::{Committer, CommitterConfig, Store, StoreError, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::Instrument;

/// Why a [`Receiver`] could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// `build` was called outside a tokio runtime.
    #[error("Receiver::build must be called inside a tokio runtime")]
    NoRuntime,
    /// An initial object's state is not valid JSON under SPEC §2.
    #[error("initial state of `{object_id}` is invalid: {error}")]
    InvalidState {
        /// The object.
        object_id: String,
        /// What is wrong.
        error: crate::canon::CanonError,
    },
    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(&'static str),
    /// The durable store could not be opened or read.
    #[error("{0}")]
    Store(StoreError),
}

/// Opens a store on the committer thread.
type StoreOpener = Box<dyn FnOnce() -> Result<Box<dyn Store>, StoreError> + Send>;

/// Configures and starts a [`Receiver`].
pub struct ReceiverBuilder {
    /// The configuration being built.
    config: Config,
    /// The clock retention is measured on.
    clock: Arc<dyn Clock>,
    /// Initial objects: id, version, state JSON text.
    objects: Vec<(String, u64, String)>,
    /// The durable store, if any (default: in memory only).
    store: Option<StoreOpener>,
    /// Group-commit bounds for the durable store.
    committer: CommitterConfig,
}

impl ReceiverBuilder {
    /// Replaces the whole configuration.
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// Number of shard tasks (default 16, at least 1).
    pub fn shards(mut self, shards: usize) -> Self {
        self.config.shards = shards;
        self
    }

    /// Mailbox capacity per shard, in messages (default 1024, at least 1).
    pub fn mailbox_capacity(mut self, capacity: usize) -> Self {
        self.config.mailbox_capacity = capacity;
        self
    }

    /// Event identities the registry makes room for up front (default 0;
    /// see [`Config::identity_capacity`]).
    pub fn identity_capacity(mut self, identities: usize) -> Self {
        self.config.identity_capacity = identities;
        self
    }

    /// Retention window for event identities (default 24 h).
    pub fn retention(mut self, retention: Duration) -> Self {
        self.config.retention = retention;
        self
    }

    /// Size and queue limits.
    pub fn limits(mut self, limits: crate::Limits) -> Self {
        self.config.limits = limits;
        self
    }

    /// The clock retention is measured on (default: the system clock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Adds a known object with its version and state (JSON text).
    pub fn object(mut self, object_id: &str, version: u64, state_json: &str) -> Self {
        self.objects
            .push((object_id.to_owned(), version, state_json.to_owned()));
        self
    }

    /// Records every step in a durable store before acknowledging it:
    /// `sqlite:PATH` or `postgres://...` (see [`crate::store::open`]). With a
    /// store, initial objects only seed objects the store does not have, and
    /// the receiver resumes states, pauses, held events and identities
    /// (within retention) from it.
    pub fn store(mut self, location: &str) -> Self {
        let location = location.to_owned();
        self.store = Some(Box::new(move || crate::store::open(&location)));
        self
    }

    /// Like [`ReceiverBuilder::store`] with a store built by `open`, which
    /// runs on the committer thread (for example a
    /// [`crate::store::PostgresStore`] in its own schema, or a
    /// [`crate::store::FaultyStore`] in tests).
    pub fn store_with<S: Store>(
        mut self,
        open: impl FnOnce() -> Result<S, StoreError> + Send + 'static,
    ) -> Self {
        self.store = Some(Box::new(move || {
            open().map(|s| Box::new(s) as Box<dyn Store>)
        }));
        self
    }

    /// Group-commit bounds (default [`CommitterConfig::default`]).
    pub fn committer(mut self, config: CommitterConfig) -> Self {
        self.committer = config;
        self
    }

    /// Starts the shard tasks on the current tokio runtime. With a durable
    /// store it first opens and loads the store, blocking the calling thread
    /// until that is done.
    ///
    /// # Errors
    /// [`BuildError::NoRuntime`] outside a runtime, [`BuildError::InvalidState`]
    /// for an initial state that is not valid JSON, [`BuildError::InvalidConfig`]
    /// for zero shards or a zero mailbox, [`BuildError::Store`] when the store
    /// cannot be opened or read.
    pub fn build(self) -> Result<Receiver, BuildError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| BuildError::NoRuntime)?;
        if self.config.shards == 0 {
            return Err(BuildError::InvalidConfig("shards must be at least 1"));
        }
        if self.config.mailbox_capacity == 0 {
            return Err(BuildError::InvalidConfig(
                "mailbox_capacity must be at least 1",
            ));
        }
        let n = self.config.shards;
        let ctx = Arc::new(Context::new(self.config, self.clock));
        let mut shards: Vec<Shard> = (0..n).map(|_| Shard::new()).collect();
        for (id, version, state) in &self.objects {
            shards[Context::shard_of(id, n)]
                .insert_object(&ctx, id, *version, state)
                .map_err(|error| BuildError::InvalidState {
                    object_id: id.clone(),
                    error,
                })?;
        }
        let store = match self.store {
            None => None,
            Some(open) => {
                let committer =
                    Committer::start(open, self.committer).map_err(BuildError::Store)?;
                // In object order: two processes seeding one database at once
                // then take the row locks in the same order and cannot deadlock.
                let mut rows: Vec<_> = shards
                    .iter()
                    .flat_map(|s| s.objects.iter().map(|(id, o)| o.row(id)))
                    .collect();
                rows.sort_by(|a, b| a.object_id.cmp(&b.object_id));
                let seeds = rows.into_iter().map(Write::Seed).collect();
                committer
                    .commit_blocking(seeds)
                    .map_err(BuildError::Store)?;
                let since = ctx.clock().now().checked_sub(ctx.config().retention);
                let loaded = committer
                    .load_blocking(since.unwrap_or(std::time::UNIX_EPOCH))
                    .map_err(BuildError::Store)?;
                crate::journal::resume(&ctx, &mut shards, loaded).map_err(BuildError::Store)?;
                for shard in &mut shards {
                    shard.enable_journal();
                }
                Some(Arc::new(committer))
            }
        };
        let (control_tx, control_rx): (Vec<_>, Vec<_>) =
            (0..n).map(|_| mpsc::unbounded_channel()).unzip();
        let peers: Arc<[mpsc::UnboundedSender<PauseRequest>]> = control_tx.into();
        let mut mailboxes = Vec::with_capacity(n);
        let mut tasks = Vec::with_capacity(n);
        for (index, (shard, control)) in shards.into_iter().zip(control_rx).enumerate() {
            let (tx, rx) = mpsc::channel(ctx.config().mailbox_capacity);
            mailboxes.push(tx);
            let task = ShardTask {
                index,
                shard,
                ctx: ctx.clone(),
                mailbox: rx,
                control,
                peers: peers.clone(),
                store: store.clone(),
                pending_pauses: Vec::new(),
            };
            tasks.push(runtime.spawn(task.run()));
        }
        let receiver = Receiver {
            inner: Arc::new(Inner {
                ctx,
                mailboxes,
                tasks: Mutex::new(tasks),
                store,
                purge: Mutex::new(None),
                metrics: DecisionCounters::new(),
            }),
        };
        if let Some(every) = receiver.inner.ctx.config().purge_interval {
            let weak = Arc::downgrade(&receiver.inner);
            let purge = runtime.spawn(async move {
                let mut ticks = tokio::time::interval(every);
                ticks.tick().await;
                loop {
                    ticks.tick().await;
                    // Holds no handle between ticks: the receiver can drop.
                    let Some(inner) = weak.upgrade() else { break };
                    let receiver = Receiver { inner };
                    if let Err(e) = receiver.purge_expired_identities().await {
                        tracing::warn!(error = %e, "periodic purge of event identities failed");
                    }
                }
            });
            *receiver
                .inner
                .purge
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(purge);
        }
        Ok(receiver)
    }
}

/// A running receiver: a cloneable, `Send + Sync` handle to the router and
/// its shard tasks. Dropping the last handle stops the tasks once their
/// mailboxes are drained; [`Receiver::shutdown`] does it and waits.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use snapshot_receiver::{Ack, Decision, Receiver, Verdict};
///
/// let receiver = Receiver::builder()
///     .object("card-7", 10, r#"{"stage":"queued","label":"Map"}"#)
///     .build()?;
/// let body = br#"{"event_id":"e-201","object_id":"card-7","object_version":12,
///     "occurred_at":"2099-01-01T08:00:00Z","type":"card.snapshot",
///     "state":{"stage":"ready","label":"Map"}}"#;
///
/// let first = receiver.deliver(body).await;
/// assert_eq!(first.decision(), Some(Decision::Applied));
/// assert_eq!(first.ack(), Ack::Acknowledge);
///
/// // The acknowledgement was lost and the sender redelivers: no new effect.
/// let again = receiver.deliver(body).await;
/// assert_eq!(again.decision(), Some(Decision::Duplicate { original: Verdict::Applied }));
///
/// let card = receiver.object("card-7").await.expect("known object");
/// assert_eq!(card.version, 12);
/// assert_eq!(card.state.compact(), r#"{"stage":"ready","label":"Map"}"#);
/// receiver.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Receiver {
    /// Shared so that clones are cheap and `Send + Sync`.
    inner: Arc<Inner>,
}

struct Inner {
    /// Registry, clock, configuration.
    ctx: Arc<Context>,
    /// One bounded mailbox per shard task.
    mailboxes: Vec<mpsc::Sender<Command>>,
    /// The shard tasks, joined by `shutdown`. A std mutex: it is only touched
    /// briefly and never held across an await.
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// The durable store's committer, if any.
    store: Option<Arc<Committer>>,
    /// The periodic purge task, aborted by `shutdown` (it never ends on its own
    /// while the receiver lives).
    purge: Mutex<Option<JoinHandle<()>>>,
    /// Every receipt and reconciliation counted (issue 7); atomics, so the
    /// callers' tasks count without a lock.
    metrics: DecisionCounters,
}

enum Command {
    Deliver(Delivery, oneshot::Sender<Receipt>),
    /// The part of a [`Receiver::deliver_batch`] call that this shard owns,
    /// in the caller's order.
    DeliverMany(Vec<Delivery>, BatchPart),
    Reconcile(
        AuthoritativeSnapshot,
        oneshot::Sender<Result<ReconcileReport, ReconcileError>>,
    ),
    Read(Box<dyn FnOnce(&Shard) + Send>),
    Shutdown,
}

impl Receiver {
    /// A builder with the default configuration and the system clock.
    pub fn builder() -> ReceiverBuilder {
        ReceiverBuilder {
            config: Config::default(),
            clock: Arc::new(SystemClock),
            objects: Vec::new(),
            store: None,
            committer: CommitterConfig::default(),
        }
    }

    /// The shared context: registry, clock and configuration.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// Decides one delivery (raw bytes of the body, transport metadata
    /// excluded) and returns its receipt once the decision is recorded.
    ///
    /// Never fails: a body over a limit gets [`crate::Ack::Reject`], a full held
    /// queue or a stopped receiver [`crate::Ack::Retry`], everything else a
    /// recorded decision.
    pub async fn deliver(&self, body: &[u8]) -> Receipt {
        let delivery = match self.inner.ctx.parse(body) {
            Ok(d) => d,
            Err(why) => {
                tracing::warn!(reason = %why, "delivery rejected");
                let receipt = Receipt::rejected(why);
                self.inner.metrics.record(&receipt);
                return receipt;
            }
        };
        let span = tracing::info_span!(
            "delivery",
            event_id = delivery.event_id(),
            object_id = delivery.object_id(),
            decision = tracing::field::Empty,
            ack = tracing::field::Empty,
        );
        let receipt = self.deliver_parsed(delivery).instrument(span.clone()).await;
        match receipt.decision() {
            Some(d) => span.record("decision", tracing::field::display(d)),
            None => span.record("decision", tracing::field::display(receipt.ack_meaning())),
        };
        span.record("ack", receipt.ack().as_str());
        span.in_scope(|| tracing::info!("delivery recorded"));
        receipt
    }

    /// Decides one delivery given as a JSON value. Prefer [`Receiver::deliver`]
    /// with the exact bytes: a `serde_json::Value` has already lost duplicate
    /// keys and rounded long numbers.
    pub async fn deliver_json(&self, body: &serde_json::Value) -> Receipt {
        self.deliver(body.to_string().as_bytes()).await
    }

    /// Decides an already parsed delivery (see [`Context::parse`]).
    pub async fn deliver_parsed(&self, delivery: Delivery) -> Receipt {
        let shard = self.shard_for(delivery.object_id());
        let (tx, rx) = oneshot::channel();
        let fallback = Receipt::retry(&delivery, RetryReason::ShuttingDown);
        let sent = self.inner.mailboxes[shard]
            .send(Command::Deliver(delivery, tx))
            .await;
        let receipt = match sent {
            Ok(()) => rx.await.unwrap_or(fallback),
            Err(_) => fallback,
        };
        self.inner.metrics.record(&receipt);
        receipt
    }

    /// Decides many deliveries in one call and returns their receipts in the
    /// order of `bodies` (raw bytes of each body, transport metadata
    /// excluded), by the same rules as [`Receiver::deliver`]. The difference
    /// is cost: the bodies are parsed in the caller's task, each shard task
    /// gets one message with its part of the batch, and the caller is woken
    /// once, when the last receipt is in. Under load this removes most of the
    /// per-delivery channel and wake-up cost (see docs/BENCHMARKS.md).
    ///
    /// Ordering: deliveries in one batch that name the same object are
    /// decided in the order given, exactly as `deliver` calls in that order
    /// would be; deliveries for different objects run concurrently, as if
    /// sent by different producers. So when two bodies of one batch share an
    /// event id but name different objects, either may become the first
    /// record (the other is the variant), and a pause raised by a variant in
    /// this batch is only guaranteed to be seen by deliveries sent after this
    /// call returns.
    ///
    /// Never fails, like [`Receiver::deliver`]: every body gets a receipt
    /// (`reject` over a limit, `retry` when the receiver is stopping or the
    /// store failed, otherwise a recorded decision). An empty slice returns
    /// an empty vector at once.
    pub async fn deliver_batch<B: AsRef<[u8]>>(&self, bodies: &[B]) -> Vec<Receipt> {
        if bodies.is_empty() {
            return Vec::new();
        }

        let (done_tx, done_rx) = oneshot::channel();
        let batch = Arc::new(BatchReply::new(bodies.len(), done_tx));
        let shards = self.inner.mailboxes.len();
        let mut parts: Vec<(Vec<Delivery>, Vec<usize>)> =
            (0..shards).map(|_| (Vec::new(), Vec::new())).collect();
        for (index, body) in bodies.iter().enumerate() {
            match self.inner.ctx.parse(body.as_ref()) {
                Ok(delivery) => {
                    let part = &mut parts[self.shard_for(delivery.object_id())];
                    part.0.push(delivery);
                    part.1.push(index);
                }
                Err(why) => {
                    tracing::warn!(index, reason = %why, "delivery rejected");
                    batch.fill(&[index], vec![Receipt::rejected(why)]);
                }
            }
        }
        let parts: Vec<(usize, Vec<Delivery>, BatchPart)> = parts
            .into_iter()
            .enumerate()
            .filter(|(_, (deliveries, _))| !deliveries.is_empty())
            .map(|(shard, (deliveries, indices))| {
                (shard, deliveries, BatchPart::new(&batch, indices))
            })
            .collect();
        // From here on only the parts hold the batch: the last one answered
        // (or dropped) sends the receipts.
        drop(batch);
        for (shard, deliveries, part) in parts {
            let sent = self.inner.mailboxes[shard]
                .send(Command::DeliverMany(deliveries, part))
                .await;
            if let Err(mpsc::error::SendError(Command::DeliverMany(deliveries, mut part))) = sent {
                let why = || RetryReason::ShuttingDown;
                part.answer(
                    deliveries
                        .iter()
                        .map(|d| Receipt::retry(d, why()))
                        .collect(),
                );
            }
        }
        // Every part answers once, also when it is dropped unanswered, so
        // the sender is only lost if the whole batch was; then retry all.
        let answered = done_rx.await.unwrap_or_default();
        let mut receipts: Vec<Receipt> = answered
            .into_iter()
            .map(|r| r.unwrap_or_else(lost_receipt))
            .collect();
        receipts.resize_with(bodies.len(), lost_receipt);
        self.inner.metrics.record_all(&receipts);
        for receipt in &receipts {
            tracing::info!(
                event_id = receipt.event_id.as_deref(),
                object_id = receipt.object_id.as_deref(),
                decision = %receipt.decision().map_or_else(|| receipt.ack_meaning(), |d| d.to_string()),
                ack = receipt.ack().as_str(),
                "delivery recorded"
            );
        }
        receipts
    }

    /// Every decision, hold reason, conflict kind, retry and reject reason
    /// and reconciliation outcome counted so far (see [`DecisionCounters`]).
    pub fn metrics(&self) -> MetricsSnapshot {
        self.inner.metrics.snapshot()
    }

    /// The durable store's group-commit figures so far (commits, deliveries
    /// per commit, commit times, the committer thread's CPU by phase; see
    /// [`crate::store::CommitStats`]); `None` without a durable store.
    pub fn store_stats(&self) -> Option<crate::store::CommitStats> {
        self.inner.store.as_ref().map(|c| c.stats())
    }

    /// Applies an authoritative snapshot (SPEC §4) on the object's actor.
    ///
    /// # Errors
    /// [`ReconcileError::AuthorityOlder`] when the authority is older than the
    /// object (nothing changes); [`ReconcileError::ShuttingDown`].
    pub async fn reconcile(
        &self,
        snapshot: AuthoritativeSnapshot,
    ) -> Result<ReconcileReport, ReconcileError> {
        let result = self.reconcile_on_shard(snapshot).await;
        self.inner.metrics.record_reconcile(&result);
        result
    }

    async fn reconcile_on_shard(
        &self,
        snapshot: AuthoritativeSnapshot,
    ) -> Result<ReconcileReport, ReconcileError> {
        let shard = self.shard_for(Some(&snapshot.object_id));
        let (tx, rx) = oneshot::channel();
        self.inner.mailboxes[shard]
            .send(Command::Reconcile(snapshot, tx))
            .await
            .map_err(|_| ReconcileError::ShuttingDown)?;
        rx.await.map_err(|_| ReconcileError::ShuttingDown)?
    }

    /// A read of one object, `None` when it is unknown (or the receiver stopped).
    pub async fn object(&self, object_id: &str) -> Option<ObjectState> {
        let id = object_id.to_owned();
        self.ask(self.shard_for(Some(object_id)), move |s| s.object(&id))
            .await
            .flatten()
    }

    /// Reads of every known object, sorted by object id.
    pub async fn objects(&self) -> Vec<ObjectState> {
        let mut all: Vec<ObjectState> = self.ask_all(Shard::objects).await.concat();
        all.sort_by(|a, b| a.object_id.cmp(&b.object_id));
        all
    }

    /// The audit trail, in sequence order (empty when the audit is turned off).
    pub async fn audit(&self) -> Vec<AuditRecord> {
        let mut all: Vec<AuditRecord> = self.ask_all(|s| s.audit().to_vec()).await.concat();
        all.sort_by_key(|r| r.seq);
        all
    }

    /// The audit records that name `event_id`, in sequence order.
    pub async fn audit_for_event(&self, event_id: &str) -> Vec<AuditRecord> {
        let mut all = self.audit().await;
        all.retain(|r| r.event_id.as_deref() == Some(event_id));
        all
    }

    /// The audit records that name `object_id`, in sequence order.
    pub async fn audit_for_object(&self, object_id: &str) -> Vec<AuditRecord> {
        let id = object_id.to_owned();
        let shard = self.shard_for(Some(object_id));
        let mut records = self
            .ask(shard, move |s| {
                s.audit()
                    .iter()
                    .filter(|r| r.object_id.as_deref() == Some(&id))
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .await
            .unwrap_or_default();
        records.sort_by_key(|r| r.seq);
        records
    }

    /// Every held or superseded input, in arrival order (SPEC §4).
    pub async fn unresolved(&self) -> Vec<UnresolvedInput> {
        let mut all: Vec<UnresolvedInput> = self.ask_all(Shard::unresolved).await.concat();
        all.sort_by_key(|u| u.seq);
        all
    }

    /// The history of one object: every accepted snapshot (event or
    /// authority), oldest first. Kept in memory when [`Config::audit`] is on.
    pub async fn history(&self, object_id: &str) -> Vec<crate::actor::Replacement> {
        let id = object_id.to_owned();
        self.ask(self.shard_for(Some(object_id)), move |s| s.history(&id))
            .await
            .unwrap_or_default()
    }

    /// The effect records (transactional outbox) with a sequence number
    /// above `after`, in order: one per state replacement, made in the same
    /// step (and, with a durable store, the same transaction). A relay that
    /// remembers the last `seq` it handled sees each effect once.
    pub async fn effects_since(&self, after: u64) -> Vec<crate::actor::Replacement> {
        let mut all: Vec<_> = self
            .ask_all(|s| s.effects_since(0))
            .await
            .concat()
            .into_iter()
            .filter(|r| r.seq > after)
            .collect();
        all.sort_by_key(|r| r.seq);
        all
    }

    /// Objects an authority should be asked about (see
    /// [`Shard::needing_authority`]), sorted.
    pub async fn needing_authority(&self) -> Vec<Arc<str>> {
        let mut all = self.ask_all(Shard::needing_authority).await.concat();
        all.sort();
        all
    }

    /// Replacement counts over all objects.
    pub async fn counters(&self) -> Counters {
        let mut total = Counters::default();
        for c in self.ask_all(Shard::counters).await {
            total += c;
        }
        total
    }

    /// Removes event identities older than the retention window (on the
    /// receiver's clock) from memory and from the durable store; returns how
    /// many were removed from memory. SPEC §5 says what a redelivery of a
    /// purged identity gets.
    ///
    /// # Errors
    /// The store's [`StoreError`] when it could not delete the receipts.
    pub async fn purge_expired_identities(&self) -> Result<usize, StoreError> {
        let now = self.inner.ctx.clock().now();
        let removed = self.inner.ctx.registry().purge_expired(now);
        if let (Some(store), Some(before)) = (
            &self.inner.store,
            now.checked_sub(self.inner.ctx.config().retention),
        ) {
            store.purge(before).await?;
        }
        Ok(removed)
    }

    /// The effect records (outbox) as the durable store holds them, with a
    /// sequence number above `after`: every run's, in order. Step numbers
    /// continue across restarts, so a relay's cursor stays valid. (With
    /// several processes on one database each numbers its own steps: give
    /// each relay its own process, or order by the rows' commit order.)
    ///
    /// # Errors
    /// [`StoreError::Failed`] without a durable store, or when it cannot be read.
    pub async fn stored_effects_since(
        &self,
        after: u64,
    ) -> Result<Vec<crate::store::ReplacementRow>, StoreError> {
        match &self.inner.store {
            Some(store) => store.replacements_since(after).await,
            None => Err(StoreError::Failed(
                "this receiver has no durable store".to_owned(),
            )),
        }
    }

    /// The audit trail as the durable store holds it (every run, in commit order).
    ///
    /// # Errors
    /// [`StoreError::Failed`] without a durable store, or when it cannot be read.
    pub async fn stored_audit(&self) -> Result<Vec<crate::store::AuditRow>, StoreError> {
        match &self.inner.store {
            Some(store) => store.audit().await,
            None => Err(StoreError::Failed(
                "this receiver has no durable store".to_owned(),
            )),
        }
    }

    /// Stops accepting deliveries, lets every shard finish what is already in
    /// its mailbox, and waits for the shard tasks. Deliveries after this get
    /// [`crate::Ack::Retry`].
    pub async fn shutdown(&self) {
        if let Some(purge) = self
            .inner
            .purge
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            purge.abort();
        }
        for mailbox in &self.inner.mailboxes {
            // A closed mailbox means the task already stopped.
            let _ = mailbox.send(Command::Shutdown).await;
        }
        let tasks =
            std::mem::take(&mut *self.inner.tasks.lock().unwrap_or_else(|e| e.into_inner()));
        for task in tasks {
            if let Err(e) = task.await {
                tracing::error!(error = %e, "shard task ended abnormally");
            }
        }
    }

    fn shard_for(&self, object_id: Option<&str>) -> usize {
        // Bodies without an object id are held by shard 0.
        object_id.map_or(0, |id| Context::shard_of(id, self.inner.mailboxes.len()))
    }

    async fn ask<R: Send + 'static>(
        &self,
        shard: usize,
        read: impl FnOnce(&Shard) -> R + Send + 'static,
    ) -> Option<R> {
        let (tx, rx) = oneshot::channel();
        let command = Command::Read(Box::new(move |s: &Shard| {
            let _ = tx.send(read(s));
        }));
        self.inner.mailboxes[shard].send(command).await.ok()?;
        rx.await.ok()
    }

    async fn ask_all<R: Send + 'static>(&self, read: fn(&Shard) -> R) -> Vec<R> {
        let mut out = Vec::with_capacity(self.inner.mailboxes.len());
        for shard in 0..self.inner.mailboxes.len() {
            if let Some(r) = self.ask(shard, read).await {
                out.push(r);
            }
        }
        out
    }
}

/// The task that drives one shard.
struct ShardTask {
    /// Which shard this is, to tell local pauses from remote ones.
    index: usize,
    /// The actors this task owns.
    shard: Shard,
    /// Registry, clock, configuration.
    ctx: Arc<Context>,
    /// Deliveries, reconciliations and reads; bounded (backpressure).
    mailbox: mpsc::Receiver<Command>,
    /// Pause requests from other shards. Unbounded so that two shards pausing
    /// each other can never wait on each other's full queue (no cycle of
    /// bounded channels); each request comes from one recorded variant, so
    /// the queue is bounded by the deliveries already accepted.
    control: mpsc::UnboundedReceiver<PauseRequest>,
    /// Every shard's control sender, indexed by shard.
    peers: Arc<[mpsc::UnboundedSender<PauseRequest>]>,
    /// The durable store's committer; `None` for the in-memory store.
    store: Option<Arc<Committer>>,
    /// Pauses of this shard's own objects, or pauses whose commit failed,
    /// to run first in the next batch.
    pending_pauses: Vec<PauseRequest>,
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
enum Done {
    Paused,
    Delivered(Receipt, Option<PauseRequest>),
    DeliveredMany(Vec<(Receipt, Option<PauseRequest>)>),
    Reconciled(Result<ReconcileReport, ReconcileError>),
    Read,
}

impl ShardTask {
    async fn run(mut self) {
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
        let Some(store) = self.store.clone() else {
            let done: Vec<Done> = all.iter_mut().map(|w| self.process(w, true)).collect();
            self.finish(all, done);
            return;
        };
        for attempt in 1..=MAX_REDO {
            let done: Vec<Done> = all.iter_mut().map(|w| self.process(w, false)).collect();
            let writes = self.shard.take_writes();
            let result = if writes.is_empty() {
                Ok(())
            } else {
                store.commit(writes).await
            };
            match result {
                Ok(()) => {
                    self.shard.commit_journal();
                    self.finish(all, done);
                    return;
                }
                Err(StoreError::Conflict(why)) if attempt < MAX_REDO => {
                    let (objects, receipts) = self.shard.rollback_journal(&self.ctx);
                    tracing::debug!(%why, attempt, "concurrent change: reloading and deciding again");
                    match store.refresh(objects, receipts).await {
                        Ok((objects, receipts)) => self.shard.refresh(&self.ctx, objects, receipts),
                        Err(e) => return self.fail(all, e),
                    }
                }
                Err(e) => {
                    self.shard.rollback_journal(&self.ctx);
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
                Some((receipt, pause)) => Done::Delivered(receipt, pause),
                None => Done::Read,
            },
            Work::DeliverMany(deliveries, _) => Done::DeliveredMany(
                deliveries
                    .iter_mut()
                    .filter_map(|d| self.deliver(d, consume))
                    .collect(),
            ),
            Work::Reconcile(snapshot, _) => {
                Done::Reconciled(self.shard.reconcile(&self.ctx, snapshot))
            }
            Work::Read(_) => Done::Read,
        }
    }

    /// Decides one delivery of a work item; `None` if it was already taken.
    fn deliver(
        &mut self,
        delivery: &mut Option<Delivery>,
        consume: bool,
    ) -> Option<(Receipt, Option<PauseRequest>)> {
        let delivery = if consume {
            delivery.take()
        } else {
            delivery.clone()
        };
        let step = self.shard.deliver(&self.ctx, delivery?);
        Some((step.receipt, step.pause))
    }

    /// Hands a pause raised by a delivery to the shard owning its object.
    fn forward(&mut self, pause: PauseRequest) {
        let owner = Context::shard_of(&pause.object_id, self.peers.len());
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
                (Work::Deliver(_, reply), Done::Delivered(receipt, pause)) => {
                    if let Some(pause) = pause {
                        self.forward(pause);
                    }
                    // The caller may have given up waiting; the step is recorded anyway.
                    let _ = reply.send(receipt);
                }
                (Work::DeliverMany(_, mut part), Done::DeliveredMany(steps)) => {
                    let mut receipts = Vec::with_capacity(steps.len());
                    for (receipt, pause) in steps {
                        if let Some(pause) = pause {
                            self.forward(pause);
                        }
                        receipts.push(receipt);
                    }
                    part.answer(receipts);
                }
                (Work::Reconcile(_, reply), Done::Reconciled(result)) => {
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
                    let why = RetryReason::StoreFailed(error.to_string());
                    if let Some(delivery) = delivery {
                        let _ = reply.send(Receipt::retry(&delivery, why));
                    }
                }
                Work::DeliverMany(deliveries, mut part) => {
                    let why = RetryReason::StoreFailed(error.to_string());
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
                    let _ = reply.send(Err(ReconcileError::StoreFailed(error.to_string())));
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

/// The receipts of one [`Receiver::deliver_batch`] call, filled in part by
/// part by the shard tasks; the fill that completes it sends them all to the
/// waiting caller.
struct BatchReply {
    /// A std mutex: held to store one part's receipts, never across an await.
    state: Mutex<BatchState>,
}

struct BatchState {
    /// One slot per body, in the caller's order.
    receipts: Vec<Option<Receipt>>,
    /// Slots not yet filled.
    missing: usize,
    /// Taken by the fill that completes the batch.
    done: Option<oneshot::Sender<Vec<Option<Receipt>>>>,
}

impl BatchReply {
    fn new(len: usize, done: oneshot::Sender<Vec<Option<Receipt>>>) -> Self {
        Self {
            state: Mutex::new(BatchState {
                receipts: (0..len).map(|_| None).collect(),
                missing: len,
                done: Some(done),
            }),
        }
    }

    /// Stores `receipts[k]` in slot `indices[k]` (slots already filled are
    /// left as they are); completing the batch sends it.
    fn fill(&self, indices: &[usize], receipts: Vec<Receipt>) {
        let finished = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            for (&index, receipt) in indices.iter().zip(receipts) {
                if state.receipts[index].is_none() {
                    state.receipts[index] = Some(receipt);
                    state.missing -= 1;
                }
            }
            if state.missing == 0 {
                state
                    .done
                    .take()
                    .map(|done| (done, std::mem::take(&mut state.receipts)))
            } else {
                None
            }
        };
        if let Some((done, receipts)) = finished {
            // The caller may have given up waiting; the steps are recorded anyway.
            let _ = done.send(receipts);
        }
    }
}

/// One shard's share of a [`BatchReply`]: the caller's positions of the
/// deliveries sent to that shard, in order. Answers exactly once: dropped
/// unanswered (a shard task that stopped abnormally), it fills its slots
/// with `retry`, so the caller is never left waiting.
struct BatchPart {
    /// The batch, shared by its parts only.
    batch: Arc<BatchReply>,
    /// Positions in the caller's slice, one per delivery of the part.
    indices: Vec<usize>,
    /// Whether the slots are filled.
    answered: bool,
}

impl BatchPart {
    fn new(batch: &Arc<BatchReply>, indices: Vec<usize>) -> Self {
        Self {
            batch: batch.clone(),
            indices,
            answered: false,
        }
    }

    /// Fills the part's slots, one receipt per delivery in order (a missing
    /// receipt answers `retry`); only the first call counts.
    fn answer(&mut self, mut receipts: Vec<Receipt>) {
        if std::mem::replace(&mut self.answered, true) {
            return;
        }
        receipts.resize_with(self.indices.len(), lost_receipt);
        self.batch.fill(&self.indices, receipts);
    }
}

impl Drop for BatchPart {
    fn drop(&mut self) {
        self.answer(Vec::new());
    }
}

/// The receipt of a delivery whose shard task stopped before answering: not
/// recorded as far as the caller can know, so redeliver.
fn lost_receipt() -> Receipt {
    Receipt {
        event_id: None,
        object_id: None,
        outcome: Outcome::Retry(RetryReason::ShuttingDown),
        object: None,
        replacement: false,
    }
}

#[cfg(all(test, not(snapshot_receiver_loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_part_dropped_unanswered_answers_retry_and_the_batch_completes() {
        let (tx, mut rx) = oneshot::channel();
        let batch = Arc::new(BatchReply::new(4, tx));
        let too_deep = |limit| Receipt::rejected(crate::RejectReason::TooDeep { limit });
        batch.fill(&[2], vec![too_deep(2)]);
        let mut first = BatchPart::new(&batch, vec![0, 3]);
        let second = BatchPart::new(&batch, vec![1]);
        drop(batch);
        first.answer(vec![too_deep(0), too_deep(3)]);
        // Answering twice changes nothing.
        first.answer(vec![lost_receipt(), lost_receipt()]);
        assert!(rx.try_recv().is_err(), "slot 1 is still open");
        drop(second);
        let receipts = rx.try_recv().expect("the last part sends the batch");
        let outcomes: Vec<Outcome> = receipts.into_iter().map(|r| r.unwrap().outcome).collect();
        let deep = |limit| Outcome::Rejected(crate::RejectReason::TooDeep { limit });
        assert_eq!(
            outcomes,
            [
                deep(0),
                Outcome::Retry(RetryReason::ShuttingDown),
                deep(2),
                deep(3)
            ]
        );
        drop(first);
    }

    #[test]
    fn a_short_answer_fills_the_rest_of_its_part_with_retry() {
        let (tx, mut rx) = oneshot::channel();
        let batch = Arc::new(BatchReply::new(2, tx));
        let mut part = BatchPart::new(&batch, vec![1, 0]);
        drop(batch);
        part.answer(vec![Receipt::rejected(crate::RejectReason::TooDeep {
            limit: 1,
        })]);
        let receipts = rx.try_recv().expect("complete");
        let outcomes: Vec<Outcome> = receipts.into_iter().map(|r| r.unwrap().outcome).collect();
        assert_eq!(
            outcomes,
            [
                Outcome::Retry(RetryReason::ShuttingDown),
                Outcome::Rejected(crate::RejectReason::TooDeep { limit: 1 })
            ]
        );
    }
}
