//! The tokio shell: a cloneable [`Receiver`] handle that routes each delivery
//! by `object_id` to the shard task owning that object, and gets the
//! receipt back on a oneshot once the step is recorded.
//!
//! Parsing and fingerprinting run in the caller's task (they need no shared
//! state), so many producers parse in parallel and the shard tasks only
//! decide. In memory, a caller whose shard is idle also decides its
//! delivery itself, without the round trip to the task (one step at a time
//! per shard either way: see `shard_task`).

use crate::core::DecisionCounters;
use crate::core::Delivery;
use crate::core::{Context, Shard};
use crate::store::{Committer, StoreError};
use crate::MetricsSnapshot;
use crate::TraceContext;
use crate::{
    core::{ReplacementCounts, UnresolvedInput},
    ObjectState, Receipt, RetryReason,
};
use crate::{AuditRecord, TrailGap};
use crate::{AuthoritativeSnapshot, ReconcileError, ReconcileReport};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::Instrument;

mod batch;
mod builder;
mod identity_scan;
mod outbox;
mod retention;
mod shard_task;

pub(crate) use shard_task::NeedTapReceiver;

use batch::BatchPart;
pub use builder::{
    BuildError, ReceiverBuilder, DEFAULT_IDENTITY_CACHE, DEFAULT_IDENTITY_FILTER,
    DEFAULT_WORKING_SET, MAX_IDENTITY_FILTER,
};
pub use outbox::OutboxError;
use shard_task::Shards;

/// What a subscriber ([`Receiver::subscribe`]) receives: every recorded
/// decision and every effect, each sent once the step that made it is
/// committed (with a durable store: durable), so a subscriber never sees a
/// decision or an effect that a failed commit undid.
///
/// Within one shard they come in step order, a delivery's decision before
/// the effect it made; across shards, in the order the shards committed.
/// Deliveries that got no decision (`retry`, `reject`) are not sent.
///
/// Serialized (serde), a notification is its record's JSON with a `kind`
/// first: `{"kind":"decision", ...the receipt}` or `{"kind":"effect",
/// ...the replacement}`.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Notification {
    /// A delivery's recorded decision: its receipt, as the sender got it.
    Decision(Receipt),
    /// A state replacement (an effect: by an event, a re-evaluated held
    /// event or an authority), the same record as
    /// [`Receiver::effects_since`] returns.
    Effect(crate::EffectRecord),
}

/// Notifications a subscriber may fall behind by before it loses the oldest
/// ([`ReceiverBuilder::subscriber_capacity`]).
pub const DEFAULT_SUBSCRIBER_CAPACITY: usize = 1024;

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
    /// One bounded mailbox per shard task.
    mailboxes: Vec<mpsc::Sender<Command>>,
    /// Every shard's state (and the registry, clock, configuration they
    /// share), indexed like `mailboxes`: a caller that finds its shard idle
    /// decides its delivery there itself (in memory only).
    shards: Arc<Shards>,
    /// Set when [`Receiver::shutdown`] starts: from then on every delivery
    /// goes through the mailbox, which refuses it once closed.
    stopping: AtomicBool,
    /// The shard tasks, joined by `shutdown`. A std mutex: it is only touched
    /// briefly and never held across an await.
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// The durable store's committer, if any.
    store: Option<Arc<Committer>>,
    /// The durable store's audit and history windows.
    records: crate::store::Retention,
    /// The periodic purge task, aborted by `shutdown` (it never ends on its own
    /// while the receiver lives).
    purge: Mutex<Option<JoinHandle<()>>>,
    /// Every receipt and reconciliation counted (issue 7); atomics, so the
    /// callers' tasks count without a lock.
    metrics: DecisionCounters,
    /// Where the shard tasks publish committed decisions and effects; a
    /// broadcast channel, so that a slow subscriber loses the oldest
    /// notifications (and is told so) instead of holding the shards back.
    notices: tokio::sync::broadcast::Sender<Notification>,
    /// The relays of an in-memory receiver (a durable one keeps them in
    /// its store). A std mutex: held for one short change, never across
    /// an await.
    relays: Arc<Mutex<outbox::MemoryRelays>>,
    /// With a durable store, the connection [`Receiver::outbox`] reads on,
    /// opened at its first call. tokio's mutex: a read holds it across the
    /// blocking thread that reads.
    outbox: Arc<tokio::sync::Mutex<Option<Box<dyn crate::store::OutboxStore>>>>,
    /// Deliveries accepted and not yet answered, in bytes, under
    /// [`crate::MemoryBudget::queued`].
    queued: crate::core::engine::QueuedBytes,
    /// What the receiver's running relays hold, in bytes
    /// ([`crate::MemoryBudget::relay`]): each relay's task adds the change
    /// of its own figure as it goes, and takes it back as it ends. An
    /// atomic, so that relays count without a lock.
    relay_bytes: Arc<std::sync::atomic::AtomicUsize>,
    /// What the running reconcilers' work queues hold, in bytes (the
    /// budget's authority part), summed.
    authority_bytes: Arc<std::sync::atomic::AtomicUsize>,
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
        ReceiverBuilder::new()
    }

    /// The receiver's figure of what its running relays hold, in bytes
    /// ([`crate::MemoryUse::relay`]), for a relay's task to count itself
    /// in.
    pub(crate) fn relay_bytes(&self) -> Arc<std::sync::atomic::AtomicUsize> {
        self.inner.relay_bytes.clone()
    }

    /// The bytes the running reconcilers' queues hold, shared with them.
    pub(crate) fn authority_bytes(&self) -> Arc<std::sync::atomic::AtomicUsize> {
        self.inner.authority_bytes.clone()
    }

    /// A reconciler's own connection to the durable store
    /// ([`crate::store::AuthorityStore`]); `None` in memory, or for a store
    /// that gives none.
    ///
    /// # Errors
    /// The store's, when it can give one and opening it failed.
    pub(crate) async fn authority_store(
        &self,
    ) -> Result<Option<Box<dyn crate::store::AuthorityStore>>, StoreError> {
        match &self.inner.store {
            Some(committer) => committer.authority_store().await,
            None => Ok(None),
        }
    }

    /// At most `limit` ids of the objects in memory after `after`, in id
    /// order: a resync's page where no store gives one.
    pub(crate) async fn object_ids_in_memory(&self, after: &str, limit: usize) -> Vec<Arc<str>> {
        let after: Arc<str> = Arc::from(after);
        let mut all: Vec<Arc<str>> = Vec::new();
        for shard in 0..self.inner.mailboxes.len() {
            let after = after.clone();
            if let Some(ids) = self
                .ask(shard, move |s: &Shard| s.object_ids_after(&after, limit))
                .await
            {
                all.extend(ids);
            }
        }
        all.sort();
        all.truncate(limit);
        all
    }

    /// The shared context: registry, clock and configuration.
    pub fn context(&self) -> &Context {
        self.inner.shards.ctx()
    }

    /// Decides one delivery (raw bytes of the body, transport metadata
    /// excluded) and returns its receipt once the decision is recorded.
    ///
    /// Never fails: a body over a limit gets [`crate::Ack::Reject`], a full held
    /// queue or a stopped receiver [`crate::Ack::Retry`], everything else a
    /// recorded decision.
    pub async fn deliver(&self, body: &[u8]) -> Receipt {
        self.deliver_traced(body, None).await
    }

    /// [`Receiver::deliver`], the delivery carrying `trace`.
    async fn deliver_traced(&self, body: &[u8], trace: Option<TraceContext>) -> Receipt {
        let delivery = match self.context().parser().parse(body) {
            Ok(d) => match trace {
                Some(trace) => d.with_trace(trace),
                None => d,
            },
            Err(why) => {
                // A reject is an answer to the sender, not a problem of ours.
                tracing::info!(reason = %why, "delivery rejected");
                let receipt = Receipt::rejected(why);
                self.inner.metrics.record(&receipt);
                return receipt;
            }
        };
        let span = tracing::info_span!(
            "delivery",
            event_id = delivery.event_id(),
            object_id = delivery.object_id(),
            trace_id = tracing::field::Empty,
            parent_id = tracing::field::Empty,
            decision = tracing::field::Empty,
            ack = tracing::field::Empty,
        );
        if let Some(trace) = delivery.trace() {
            span.record("trace_id", trace.trace_id_hex());
            span.record("parent_id", trace.parent_id_hex());
        }
        let receipt = self.deliver_parsed(delivery).instrument(span.clone()).await;
        match receipt.decision() {
            Some(d) => span.record("decision", tracing::field::display(d)),
            None => span.record("decision", tracing::field::display(receipt.ack_meaning())),
        };
        span.record("ack", receipt.ack().as_str());
        span.in_scope(|| tracing::info!("delivery recorded"));
        receipt
    }

    /// [`Receiver::deliver`] with what came with the body
    /// ([`DeliveryMeta`]): its W3C trace context is recorded on the
    /// delivery's span (`trace_id`, `parent_id`) and, when the delivery is
    /// applied, kept with its effect ([`crate::Effect::trace`]) in the
    /// outbox, in memory and in a durable store, for the relays to
    /// continue. A delivery not applied (duplicate, stale, equal, held,
    /// conflict) makes no effect and keeps no trace.
    pub async fn deliver_with(&self, body: &[u8], meta: DeliveryMeta) -> Receipt {
        self.deliver_traced(body, meta.trace).await
    }

    /// Decides one delivery given as a JSON value. Prefer [`Receiver::deliver`]
    /// with the exact bytes: a `serde_json::Value` has already lost duplicate
    /// keys and rounded long numbers.
    pub async fn deliver_json(&self, body: &serde_json::Value) -> Receipt {
        self.deliver(body.to_string().as_bytes()).await
    }

    /// Decides an already parsed delivery (see [`crate::core::BodyParser::parse`], reached as `receiver.context().parser()`).
    ///
    /// In memory, when no step is running on the delivery's shard, the step
    /// runs right here in the caller's task (no message, no wake-up of the
    /// shard task); otherwise the delivery waits in the shard's mailbox.
    /// Either way one step runs at a time per shard, and a pause a variant
    /// raised before this call is seen first.
    pub async fn deliver_parsed(&self, delivery: Delivery) -> Receipt {
        // Held until the answer leaves: a full queue answers `retry` at once.
        let _queued = match self.inner.queued.reserve(queued_bytes(&delivery)) {
            Ok(reservation) => reservation,
            Err(why) => {
                let receipt = Receipt::retry(&delivery, why);
                self.inner.metrics.record(&receipt);
                return receipt;
            }
        };
        let shard = self.shard_for(delivery.object_id());
        let mut slot = Some(delivery);
        if self.inner.store.is_none() && !self.inner.stopping.load(Ordering::Acquire) {
            if let Some(receipt) = self.inner.shards.try_deliver(shard, &mut slot) {
                self.inner.metrics.record(&receipt);
                return receipt;
            }
        }
        // Busy: the delivery is still in the slot.
        let Some(delivery) = slot else {
            return batch::lost_receipt();
        };
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

    /// Subscribes to decisions and effects ([`Notification`]) from now on,
    /// each sent after its step is committed.
    ///
    /// The channel holds [`ReceiverBuilder::subscriber_capacity`]
    /// notifications (default [`DEFAULT_SUBSCRIBER_CAPACITY`]) per
    /// subscriber; one that falls further behind gets
    /// [`tokio::sync::broadcast::error::RecvError::Lagged`] with the number
    /// it missed and continues from the oldest still held (the shards never
    /// wait for subscribers). A subscriber that must see every effect reads
    /// the outbox instead ([`Receiver::outbox`], or a durable
    /// [`Receiver::relay`]). Without subscribers, nothing is copied.
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Notification> {
        self.inner.notices.subscribe()
    }

    /// The reconciler's intake: from now on each recorded decision that
    /// needs an authority (object and reason, about 24 bytes), at most
    /// [`ReceiverBuilder::subscriber_capacity`] waiting; past that they are
    /// dropped and the receiver's `lagged` flag set (the reconciler then
    /// scans the shards). Replaces an earlier tap.
    pub(crate) fn tap_needs(&self) -> NeedTapReceiver {
        self.inner.shards.outlet().tap_needs()
    }

    /// Every decision, hold reason, conflict kind, retry and reject reason
    /// and reconciliation outcome counted so far in this run (see
    /// [`DecisionCounters`]).
    pub fn metrics(&self) -> MetricsSnapshot {
        self.inner.metrics.snapshot()
    }

    /// The durable store's group-commit figures so far (commits, deliveries
    /// per commit, commit times, the committer thread's CPU by phase; see
    /// [`crate::store::CommitStats`]); `None` without a durable store.
    pub fn store_stats(&self) -> Option<crate::store::CommitStats> {
        self.inner.store.as_ref().map(|c| c.stats())
    }

    /// Applies an authoritative snapshot (docs/CONTRACT.md §4) on the object's actor.
    ///
    /// # Errors
    /// [`ReconcileError::AuthorityOlder`] when the authority is older than the
    /// object and not forced (nothing changes); [`ReconcileError::ShuttingDown`].
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

    /// A read of one object, `None` when it is unknown (or the receiver
    /// stopped). With a durable store an object outside the working set
    /// ([`ReceiverBuilder::working_set`]) is read from the store, where all
    /// of its writes are; `None` also when that read fails (logged at
    /// `warn`).
    pub async fn object(&self, object_id: &str) -> Option<ObjectState> {
        let id = object_id.to_owned();
        let (found, bounded) = self
            .ask(self.shard_for(Some(object_id)), move |s| {
                (s.object(&id), s.bounded())
            })
            .await?;
        if found.is_some() || !bounded {
            return found;
        }
        let store = self.inner.store.as_ref()?;
        match store.refresh(vec![Arc::from(object_id)], Vec::new()).await {
            Ok(reloaded) => reloaded
                .objects
                .into_iter()
                .find_map(|row| self.stored_object(row)),
            Err(e) => {
                tracing::warn!(object_id, error = %e, "object not in memory and the store could not be read");
                None
            }
        }
    }

    /// Reads of every known object, sorted by object id. With a durable
    /// store the objects outside the working set are read from the store
    /// (all of them: this is a full scan); when that read fails, only the
    /// objects in memory are returned (logged at `warn`).
    pub async fn objects(&self) -> Vec<ObjectState> {
        let parts = self.ask_all(|s| (s.objects(), s.bounded())).await;
        let bounded = parts.iter().any(|(_, b)| *b);
        let mut all: Vec<ObjectState> = parts.into_iter().flat_map(|(o, _)| o).collect();
        if let (true, Some(store)) = (bounded, self.inner.store.as_ref()) {
            match store.objects().await {
                Ok(rows) => {
                    let resident: std::collections::HashSet<Arc<str>> =
                        all.iter().map(|o| o.object_id.clone()).collect();
                    let stored = rows
                        .into_iter()
                        .filter(|row| !resident.contains(&row.object_id))
                        .filter_map(|row| self.stored_object(row));
                    all.extend(stored.collect::<Vec<_>>());
                }
                Err(e) => {
                    tracing::warn!(error = %e, "objects outside the working set not read: the store could not be read");
                }
            }
        }
        all.sort_by(|a, b| a.object_id.cmp(&b.object_id));
        all
    }

    /// An object as the store holds it (outside the working set, so it
    /// holds no events); `None` for a stored state that no longer parses
    /// (logged).
    fn stored_object(&self, row: crate::store::ObjectRow) -> Option<ObjectState> {
        let max_depth = self.inner.shards.ctx().config().limits.max_depth;
        let object_id = row.object_id.clone();
        ObjectState::from_row(row, max_depth)
            .map_err(|e| tracing::error!(%object_id, error = %e, "stored state is not valid JSON"))
            .ok()
    }

    /// The audit trail in memory, in sequence order (empty when the audit
    /// is turned off): the most recent records, up to
    /// [`Config::trail_capacity`](crate::Config::trail_capacity), without
    /// holes: when a shard has evicted records, every record up to the
    /// highest evicted sequence number is left out, so what is returned is
    /// the whole trail after some point. The durable store keeps all of it
    /// ([`Receiver::stored_audit`]).
    pub async fn audit(&self) -> Vec<AuditRecord> {
        let parts = self
            .ask_all(|s| (s.evicted_through().0, s.audit().to_vec()))
            .await;
        let evicted = parts.iter().map(|(e, _)| *e).max().unwrap_or(0);
        let mut all: Vec<AuditRecord> = parts
            .into_iter()
            .flat_map(|(_, records)| records)
            .filter(|r| r.seq > evicted)
            .collect();
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

    /// Every held or superseded input, in arrival order (docs/CONTRACT.md §4).
    pub async fn unresolved(&self) -> Vec<UnresolvedInput> {
        let mut all: Vec<UnresolvedInput> = self.ask_all(Shard::unresolved).await.concat();
        all.sort_by_key(|u| u.seq);
        all
    }

    /// The history of one object in this run: every snapshot (event or
    /// authority) this receiver accepted for it since it was built, oldest
    /// first. Kept in memory when [`crate::Config::audit`] is on (empty otherwise).
    /// A receiver resumed from a durable store does not load earlier runs'
    /// history: [`Receiver::stored_effects_since`] reads every run's.
    pub async fn history(&self, object_id: &str) -> Vec<crate::EffectRecord> {
        let id = object_id.to_owned();
        self.ask(self.shard_for(Some(object_id)), move |s| s.history(&id))
            .await
            .unwrap_or_default()
    }

    /// The effect records of this run with a step sequence number above
    /// `after`, in sequence order: one per state replacement, made in the
    /// same step (and, with a durable store, the same transaction).
    ///
    /// **Not a relay's cursor.** A step takes its number when it is
    /// decided, and its effect becomes visible when its shard publishes it,
    /// so an effect with a lower number can appear after a reader passed a
    /// higher one and is then never returned to it. A relay reads
    /// [`Receiver::outbox`] (by outbox position, without gaps).
    ///
    /// # Errors
    /// [`TrailGap`] when effects above `after` may have been evicted from
    /// memory ([`Config::trail_capacity`](crate::Config::trail_capacity));
    /// the durable store keeps them ([`Receiver::stored_effects_since`]).
    #[deprecated(
        since = "0.1.0",
        note = "a cursor of step numbers misses effects that become visible out of order; \
                read `Receiver::outbox` (by outbox position)"
    )]
    pub async fn effects_since(&self, after: u64) -> Result<Vec<crate::EffectRecord>, TrailGap> {
        let mut all = Vec::new();
        for shard in 0..self.inner.mailboxes.len() {
            if let Some(part) = self.ask(shard, move |s| s.effects_since(after)).await {
                all.extend(part?);
            }
        }
        all.sort_by_key(|r| r.seq);
        Ok(all)
    }

    /// Objects an authority should be asked about (see
    /// [`Shard::needing_authority`]), sorted.
    pub async fn needing_authority(&self) -> Vec<Arc<str>> {
        let mut all = self.ask_all(Shard::needing_authority).await.concat();
        all.sort();
        all
    }

    /// What this receiver keeps in memory now, in bytes, part by part,
    /// beside its budget ([`crate::MemoryBudget`], set with
    /// [`ReceiverBuilder::memory_budget`]): summed over the shards, plus the
    /// deliveries accepted and not yet answered. For every receiver, in
    /// memory or durable, with what its running relays hold. The figures are estimates of what the parts keep
    /// (texts plus a measured cost per entry), not the process's resident
    /// size.
    pub async fn memory_bytes(&self) -> crate::MemoryUse {
        let ctx = self.context();
        let mut total = crate::MemoryUse {
            budget: ctx.config().memory,
            queued: self.inner.queued.bytes(),
            relay: self
                .inner
                .relay_bytes
                .load(std::sync::atomic::Ordering::Relaxed),
            authority: self
                .inner
                .authority_bytes
                .load(std::sync::atomic::Ordering::Relaxed),
            store: ctx.config().memory.store,
            ..crate::MemoryUse::default()
        };
        let mut bounded_identities = false;
        for (part, bounded) in self
            .ask_all(|s: &Shard| (s.memory_use(), s.identity_cache().is_some()))
            .await
        {
            total += part;
            bounded_identities |= bounded;
        }
        if !bounded_identities {
            // Every identity stays in the shared registry: an upper bound.
            let each = ctx.config().limits.max_id_bytes + crate::core::engine::IDENTITY_COST;
            total.identities = ctx.registry().len().saturating_mul(each);
        }
        total
    }

    /// What memory holds against the count bounds of a durable receiver
    /// that reads objects and identities on demand (docs/CONTRACT.md §9),
    /// summed over the shards; `None` when everything stays in memory (no
    /// store, or a store that gives no second connection). The same parts
    /// in bytes, for every receiver: [`Receiver::memory_bytes`].
    pub async fn memory(&self) -> Option<MemoryStats> {
        let shards = self
            .ask_all(|s: &Shard| (s.working_set(), s.identity_cache()))
            .await;
        let registry = self.context().registry();
        let mut total = MemoryStats {
            identities_resident: registry.len(),
            identity_filter: registry.filter().map(|f| f.stats()),
            ..MemoryStats::default()
        };
        let mut bounded = false;
        for (objects, identities) in shards {
            if let Some(o) = objects {
                bounded = true;
                total.objects_capacity = total.objects_capacity.saturating_add(o.capacity);
                total.objects_resident += o.resident;
                total.objects_loaded += o.loaded;
                total.objects_evicted += o.evicted;
            }
            if let Some(i) = identities {
                total.identities_capacity = total.identities_capacity.saturating_add(i.capacity);
                total.identities_loaded += i.loaded;
                total.identity_reads += i.reads;
                total.identities_spared += i.spared;
                total.identities_evicted += i.evicted;
            }
        }
        bounded.then_some(total)
    }

    /// Replacement counts over all objects in this run: the replacements
    /// this receiver made since it was built (a durable store's earlier runs
    /// are not included; their replacements are in the stored audit trail
    /// and history), like [`Receiver::metrics`] and [`Receiver::history`].
    pub async fn counters(&self) -> ReplacementCounts {
        let mut total = ReplacementCounts::default();
        for c in self.ask_all(Shard::counters).await {
            total += c;
        }
        total
    }

    /// Removes event identities older than the retention window (on the
    /// receiver's clock) from memory and from the durable store; returns how
    /// many were removed from memory. docs/CONTRACT.md §5 says what a redelivery of a
    /// purged identity gets.
    ///
    /// # Errors
    /// The store's [`StoreError`] when it could not delete the receipts.
    pub async fn purge_expired_identities(&self) -> Result<usize, StoreError> {
        let now = self.context().clock().now();
        let removed = self.context().registry().purge_expired(now);
        if let (Some(store), Some(before)) = (
            &self.inner.store,
            now.checked_sub(self.context().config().retention),
        ) {
            store.purge(before).await?;
        }
        Ok(removed)
    }

    /// The effect records as the durable store holds them, with a step
    /// sequence number above `after`: every run's, in sequence order (the
    /// history by step number).
    ///
    /// **Not a relay's cursor.** A step takes its number when it is
    /// decided and its row becomes visible when its group commits, and
    /// several processes on one database number their steps apart, so a
    /// reader that passed a higher number never sees a lower one committed
    /// later. A relay reads [`Receiver::outbox`] (by outbox position, in
    /// commit order over every process).
    ///
    /// # Errors
    /// [`StoreError::Failed`] without a durable store, or when it cannot be read.
    #[deprecated(
        since = "0.1.0",
        note = "a cursor of step numbers misses effects committed out of order; \
                read `Receiver::outbox` (by outbox position)"
    )]
    pub async fn stored_effects_since(
        &self,
        after: u64,
    ) -> Result<Vec<crate::store::EffectRow>, StoreError> {
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
        self.inner.stopping.store(true, Ordering::Release);
        if let Some(purge) = crate::locks::lock(&self.inner.purge).take() {
            purge.abort();
        }
        for mailbox in &self.inner.mailboxes {
            // A closed mailbox means the task already stopped.
            let _ = mailbox.send(Command::Shutdown).await;
        }
        let tasks = std::mem::take(&mut *crate::locks::lock(&self.inner.tasks));
        for task in tasks {
            if let Err(e) = task.await {
                tracing::error!(error = %e, "shard task ended abnormally");
            }
        }
    }

    pub(crate) fn shard_for(&self, object_id: Option<&str>) -> usize {
        crate::core::route(object_id, self.inner.mailboxes.len())
    }

    pub(crate) async fn ask<R: Send + 'static>(
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

    pub(crate) async fn ask_all<R: Send + 'static>(&self, read: fn(&Shard) -> R) -> Vec<R> {
        let mut out = Vec::with_capacity(self.inner.mailboxes.len());
        for shard in 0..self.inner.mailboxes.len() {
            if let Some(r) = self.ask(shard, read).await {
                out.push(r);
            }
        }
        out
    }
}

/// The bytes a delivery reserves while it waits for its answer: its body
/// and the cost of its message ([`crate::core::engine::QUEUED_OVERHEAD`]).
pub(crate) fn queued_bytes(delivery: &Delivery) -> usize {
    delivery.body().len()
        + crate::core::engine::QUEUED_OVERHEAD
        + delivery.trace().map_or(0, TraceContext::bytes)
}

/// What came with a delivery's body, outside it
/// ([`Receiver::deliver_with`]): transport metadata the decision does not
/// read. Build it with [`DeliveryMeta::new`] and its setters; more fields
/// may come, so it cannot be built field by field.
///
/// ```
/// use snapshot_receiver::{DeliveryMeta, TraceContext};
///
/// let trace = TraceContext::parse(
///     "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
///     None,
/// )?;
/// let meta = DeliveryMeta::new().trace(trace);
/// assert_eq!(
///     meta.trace.as_ref().map(|t| t.trace_id_hex()).as_deref(),
///     Some("4bf92f3577b34da6a3ce929d0e0e4736")
/// );
/// # Ok::<(), snapshot_receiver::TraceContextError>(())
/// ```
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct DeliveryMeta {
    /// The W3C trace context the delivery came with (an HTTP request's
    /// `traceparent` and `tracestate`, read with
    /// [`TraceContext::parse`]); `None`: none, or one that did not parse
    /// (which is never a reason to refuse the delivery).
    pub trace: Option<TraceContext>,
}

impl DeliveryMeta {
    /// No metadata.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same, with the delivery's trace context.
    pub fn trace(mut self, trace: TraceContext) -> Self {
        self.trace = Some(trace);
        self
    }
}

/// What a bounded durable receiver holds in memory ([`Receiver::memory`]):
/// counts since it was built, summed over the shards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// The working set's bound: each shard's share, summed (at least one
    /// object a shard).
    pub objects_capacity: usize,
    /// Objects in memory now, the pinned ones (paused, holding events, a
    /// write not yet committed) included.
    pub objects_resident: usize,
    /// Objects read from the store.
    pub objects_loaded: u64,
    /// Objects evicted.
    pub objects_evicted: u64,
    /// The identity cache's bound: each shard's share of committed first
    /// records, summed.
    pub identities_capacity: usize,
    /// First records in the registry now (uncommitted ones included).
    pub identities_resident: usize,
    /// Receipts read from the store.
    pub identities_loaded: u64,
    /// Reads of receipts from the store (each for those of a batch's
    /// identities not in memory at once).
    pub identity_reads: u64,
    /// Identities not in memory that the filter of stored identities showed
    /// to be new, so that no read was made for them.
    pub identities_spared: u64,
    /// First records evicted.
    pub identities_evicted: u64,
    /// The filter of stored identities ([`ReceiverBuilder::identity_filter`]):
    /// its size, memory and whether its start-up scan is done; `None`
    /// without one.
    pub identity_filter: Option<crate::core::FilterStats>,
}
