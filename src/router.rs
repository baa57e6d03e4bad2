//! The tokio shell: a cloneable [`Receiver`] handle that routes each delivery
//! by `object_id` to the shard task owning that object, and gets the
//! receipt back on a oneshot once the step is recorded.
//!
//! Parsing and fingerprinting run in the caller's task (they need no shared
//! state), so many producers parse in parallel and the shard tasks only
//! decide.

use crate::actor::{
    Config, Context, Counters, ObjectState, PauseRequest, Receipt, RetryReason, Shard,
    UnresolvedInput,
};
use crate::audit::AuditRecord;
use crate::clock::{Clock, SystemClock};
use crate::envelope::Delivery;
use crate::metrics::{DecisionCounters, MetricsSnapshot};
use crate::reconcile::{AuthoritativeSnapshot, ReconcileError, ReconcileReport};
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
}

/// Configures and starts a [`Receiver`].
pub struct ReceiverBuilder {
    /// The configuration being built.
    config: Config,
    /// The clock retention is measured on.
    clock: Arc<dyn Clock>,
    /// Initial objects: id, version, state JSON text.
    objects: Vec<(String, u64, String)>,
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

    /// Starts the shard tasks on the current tokio runtime.
    ///
    /// # Errors
    /// [`BuildError::NoRuntime`] outside a runtime, [`BuildError::InvalidState`]
    /// for an initial state that is not valid JSON, [`BuildError::InvalidConfig`]
    /// for zero shards or a zero mailbox.
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
            };
            tasks.push(runtime.spawn(task.run()));
        }
        Ok(Receiver {
            inner: Arc::new(Inner {
                ctx,
                mailboxes,
                tasks: Mutex::new(tasks),
                metrics: DecisionCounters::new(),
            }),
        })
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
    /// Every receipt and reconciliation counted (issue 7); atomics, so the
    /// callers' tasks count without a lock.
    metrics: DecisionCounters,
}

enum Command {
    Deliver(Delivery, oneshot::Sender<Receipt>),
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
        let span = tracing::debug_span!(
            "delivery",
            event_id = delivery.event_id(),
            object_id = delivery.object_id()
        );
        self.deliver_parsed(delivery).instrument(span).await
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

    /// Every decision, hold reason, conflict kind, retry and reject reason
    /// and reconciliation outcome counted so far (see [`DecisionCounters`]).
    pub fn metrics(&self) -> MetricsSnapshot {
        self.inner.metrics.snapshot()
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

    /// Replacement counts over all objects.
    pub async fn counters(&self) -> Counters {
        let mut total = Counters::default();
        for c in self.ask_all(Shard::counters).await {
            total += c;
        }
        total
    }

    /// Removes event identities older than the retention window (on the
    /// receiver's clock); returns how many were removed. See SPEC §5 for
    /// what a redelivery of a purged identity gets.
    pub fn purge_expired_identities(&self) -> usize {
        let now = self.inner.ctx.clock().now();
        self.inner.ctx.registry().purge_expired(now)
    }

    /// Stops accepting deliveries, lets every shard finish what is already in
    /// its mailbox, and waits for the shard tasks. Deliveries after this get
    /// [`crate::Ack::Retry`].
    pub async fn shutdown(&self) {
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
}

impl ShardTask {
    async fn run(mut self) {
        loop {
            tokio::select! {
                // Pauses first: once a variant's receipt is out, no later
                // delivery to the paused object may run before the pause.
                biased;
                Some(pause) = self.control.recv() => {
                    self.shard.pause(&self.ctx, &pause);
                }
                command = self.mailbox.recv() => match command {
                    Some(Command::Shutdown) | None => break,
                    Some(command) => self.handle(command),
                },
            }
        }
        // Drain: what was accepted before the shutdown is still decided.
        self.mailbox.close();
        while let Some(command) = self.mailbox.recv().await {
            if !matches!(command, Command::Shutdown) {
                self.handle(command);
            }
        }
        while let Ok(pause) = self.control.try_recv() {
            self.shard.pause(&self.ctx, &pause);
        }
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Deliver(delivery, reply) => {
                let step = self.shard.deliver(&self.ctx, delivery);
                if let Some(pause) = step.pause {
                    let owner = Context::shard_of(&pause.object_id, self.peers.len());
                    if owner == self.index {
                        self.shard.pause(&self.ctx, &pause);
                    } else if self.peers[owner].send(pause).is_err() {
                        tracing::error!("pause request lost: shard {owner} stopped");
                    }
                }
                // The caller may have given up waiting; the step is recorded anyway.
                let _ = reply.send(step.receipt);
            }
            Command::Reconcile(snapshot, reply) => {
                let _ = reply.send(self.shard.reconcile(&self.ctx, &snapshot));
            }
            Command::Read(read) => read(&self.shard),
            Command::Shutdown => {}
        }
    }
}
