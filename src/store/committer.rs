//! Group commit: one thread owns the store; shards hand it their steps'
//! writes and wait; it commits the writes of every shard that is waiting in
//! one transaction, then answers each of them with the same result.
//!
//! A shard hands over one group at a time and keeps deciding what arrives
//! while its group commits (pipelining, see the receiver's `shard_task`), so
//! its next group is ready the moment the previous commit answers it. By
//! default a group is whatever waits when the previous commit ends: the
//! store is never idle while callers are on their way. A group can be made
//! to wait, for a bounded time, until it holds as many deliveries as the
//! previous commit answered (fewer, fuller commits; see
//! [`CommitterConfig::max_refill_wait`]).

use super::stats::{thread_cpu_time, CommitStats};
use super::{
    AuditRow, AuthorityStore, Loaded, OutboxStore, Records, Reloaded, Store, StoreError, Write,
};
pub use crate::core::engine::Resumed;
use crate::log_gate::LogGate;
use std::borrow::Cow;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::oneshot;

/// Group-commit bounds.
#[derive(Clone, Copy, Debug)]
pub struct CommitterConfig {
    /// Most writes in one transaction (a batch is cut after the shard step
    /// that passes it). Default 8192.
    pub max_batch_writes: usize,
    /// How long a flush always waits for more shards to join after the
    /// first one arrives. Default 0: a batch is whatever is waiting when the
    /// previous commit ends, plus the refill below.
    pub flush_wait: Duration,
    /// Most a group waits, after its first shard arrives, until it holds as
    /// many deliveries as the previous commit answered (their callers send
    /// the next ones as soon as they are acknowledged). The wait is also
    /// never longer than the previous commit took, so a fast disk is not
    /// kept waiting for long; a group that is full enough, or at
    /// `max_batch_writes`, commits at once. Default zero: no refill. The
    /// store idles while a group waits; measured with 64 callers of one
    /// delivery each, a 5 ms refill more than doubled the deliveries per
    /// commit and wrote 19 % fewer bytes per delivery on SQLite, but cost
    /// 19 to 23 % of the rate on SQLite, the LSM store and PostgreSQL
    /// (docs/BENCHMARKS.md, the durable path).
    pub max_refill_wait: Duration,
}

impl CommitterConfig {
    /// How long after its first shard arrived a group may still wait for
    /// more, holding `gathered` deliveries, when the previous commit answered
    /// `answered` deliveries and took `took`.
    fn gather_time(&self, answered: u64, took: Duration, gathered: u64) -> Duration {
        if gathered < answered {
            self.flush_wait.max(took.min(self.max_refill_wait))
        } else {
            self.flush_wait
        }
    }
}

impl Default for CommitterConfig {
    fn default() -> Self {
        Self {
            max_batch_writes: 8192,
            flush_wait: Duration::ZERO,
            max_refill_wait: Duration::ZERO,
        }
    }
}

/// Where an answer goes: an async caller (a shard task) or a blocking one
/// (the builder, which may run on a runtime thread where a tokio blocking
/// receive would panic).
enum Reply<T> {
    Async(oneshot::Sender<Result<T, StoreError>>),
    Blocking(mpsc::Sender<Result<T, StoreError>>),
}

impl<T> Reply<T> {
    fn send(self, result: Result<T, StoreError>) {
        // A caller that stopped waiting has nothing left to tell.
        let _ = match self {
            Reply::Async(tx) => tx.send(result).map_err(|_| ()),
            Reply::Blocking(tx) => tx.send(result).map_err(|_| ()),
        };
    }
}

enum Request {
    Commit(Vec<Write>, Reply<()>),
    Refresh(Vec<Arc<str>>, Vec<Arc<str>>, Reply<Reloaded>),
    Load(SystemTime, Reply<Loaded>),
    Resume(SystemTime, usize, Reply<Resumed>),
    Objects(Reply<Vec<super::ObjectRow>>),
    Purge(SystemTime, Reply<u64>),
    PurgeRecords(Records, SystemTime, usize, Reply<u64>),
    Audit(Reply<Vec<AuditRow>>),
    Replacements(u64, Reply<Vec<super::EffectRow>>),
    OutboxStore(Reply<Option<Box<dyn OutboxStore>>>),
    AuthorityStore(Reply<Option<Box<dyn AuthorityStore>>>),
}

/// A handle to the committer thread. The thread ends when the last handle
/// is dropped.
pub struct Committer {
    /// Requests to the committer thread (unbounded: every sender waits for
    /// its answer, so at most one request per shard is outstanding).
    requests: mpsc::Sender<Request>,
    /// What the committer thread has done, updated once per request it
    /// handles. A std mutex: held only to copy numbers in or out, never
    /// across an await.
    stats: Arc<Mutex<CommitStats>>,
}

/// The error of a request the committer thread can no longer answer; the
/// warning goes through a log gate like the failed commits' (every shard's
/// next group meets it).
fn stopped() -> StoreError {
    static GATE: LogGate = LogGate::new();
    if let Some(suppressed) = GATE.admit(Instant::now()) {
        tracing::warn!(
            suppressed,
            "the store's committer thread stopped: callers get retry"
        );
    }
    StoreError::Failed("the store's committer thread stopped".to_owned())
}

impl Committer {
    /// Starts the committer thread; `open` runs on it (so a blocking client
    /// never runs inside the tokio runtime). Blocks until the store is open.
    ///
    /// # Errors
    /// The error `open` returned.
    pub fn start(
        open: impl FnOnce() -> Result<Box<dyn Store>, StoreError> + Send + 'static,
        config: CommitterConfig,
    ) -> Result<Self, StoreError> {
        let (requests, rx) = mpsc::channel();
        let (opened_tx, opened_rx) = mpsc::channel();
        let stats = Arc::new(Mutex::new(CommitStats::new()));
        let shared = stats.clone();
        std::thread::Builder::new()
            .name("snapshot-receiver-committer".to_owned())
            .spawn(move || match open() {
                Ok(store) => {
                    let _ = opened_tx.send(Ok(()));
                    run(store, rx, config, &shared);
                }
                Err(e) => {
                    let _ = opened_tx.send(Err(e));
                }
            })
            .map_err(|e| StoreError::Failed(format!("cannot start the committer thread: {e}")))?;
        opened_rx.recv().map_err(|_| stopped())??;
        Ok(Self { requests, stats })
    }

    /// What the committer has done since it started: group commits, their
    /// sizes and times, and the committer thread's CPU time by phase. Take
    /// one snapshot before and one after a run, and
    /// [`CommitStats::since`] gives the run's own figures.
    pub fn stats(&self) -> CommitStats {
        crate::locks::lock(&self.stats).clone()
    }

    /// Sends a request now (before the returned future is first polled)
    /// and gives the future of its answer.
    fn ask<T>(
        &self,
        make: impl FnOnce(Reply<T>) -> Request,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static
    where
        T: Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let sent = self
            .requests
            .send(make(Reply::Async(tx)))
            .map_err(|_| stopped());
        async move {
            sent?;
            rx.await.map_err(|_| stopped())?
        }
    }

    fn ask_blocking<T>(&self, make: impl FnOnce(Reply<T>) -> Request) -> Result<T, StoreError> {
        let (tx, rx) = mpsc::channel();
        self.requests
            .send(make(Reply::Blocking(tx)))
            .map_err(|_| stopped())?;
        rx.recv().map_err(|_| stopped())?
    }

    /// Commits `writes` (with whatever other shards are committing); the
    /// future answers once the transaction committed or failed. The request
    /// is sent when this is called, not when the future is first polled, so
    /// the transaction runs while the caller awaits something else (a shard
    /// task reading the store for its next batch).
    ///
    /// # Errors
    /// The store's [`StoreError`]; nothing was committed.
    pub fn commit(
        &self,
        writes: Vec<Write>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        self.ask(|r| Request::Commit(writes, r))
    }

    /// [`Committer::commit`] for code outside an async context.
    ///
    /// # Errors
    /// The store's [`StoreError`].
    pub fn commit_blocking(&self, writes: Vec<Write>) -> Result<(), StoreError> {
        self.ask_blocking(|r| Request::Commit(writes, r))
    }

    /// Loads what a receiver resumes from (blocking; used while building).
    ///
    /// # Errors
    /// The store's [`StoreError`].
    pub fn load_blocking(&self, receipts_since: SystemTime) -> Result<Loaded, StoreError> {
        self.ask_blocking(|r| Request::Load(receipts_since, r))
    }

    /// What a receiver resumes from, read on the committer's thread by the
    /// core's start-up ([`crate::core::engine::resume_from`]): `sources`
    /// object sources (one per shard, then one per start-up scan) when the
    /// store can give them, with what [`Store::load_resident`] loads, else
    /// no sources and what [`Store::load`] loads. Blocks the calling
    /// thread.
    ///
    /// # Errors
    /// The store's [`StoreError`].
    pub fn resume_blocking(
        &self,
        receipts_since: SystemTime,
        sources: usize,
    ) -> Result<Resumed, StoreError> {
        self.ask_blocking(|r| Request::Resume(receipts_since, sources, r))
    }

    /// Every stored object, in object order ([`Store::objects`]).
    ///
    /// # Errors
    /// The store's [`StoreError`].
    pub async fn objects(&self) -> Result<Vec<super::ObjectRow>, StoreError> {
        self.ask(Request::Objects).await
    }

    /// Reloads rows after a conflict: the objects, and the receipts and
    /// variants of the event identities.
    ///
    /// # Errors
    /// The store's [`StoreError`].
    pub async fn refresh(
        &self,
        objects: Vec<Arc<str>>,
        receipts: Vec<Arc<str>>,
    ) -> Result<Reloaded, StoreError> {
        self.ask(|r| Request::Refresh(objects, receipts, r)).await
    }

    /// Deletes receipts first seen before `before`.
    ///
    /// # Errors
    /// The store's [`StoreError`].
    pub async fn purge(&self, before: SystemTime) -> Result<u64, StoreError> {
        self.ask(|r| Request::Purge(before, r)).await
    }

    /// Deletes one batch of at most `limit` rows of `records` recorded
    /// before `before` ([`Store::purge_records`]): its own transaction, so
    /// commits waiting meanwhile go first before the next batch.
    ///
    /// # Errors
    /// The store's [`StoreError`].
    pub async fn purge_records(
        &self,
        records: Records,
        before: SystemTime,
        limit: usize,
    ) -> Result<u64, StoreError> {
        self.ask(|r| Request::PurgeRecords(records, before, limit, r))
            .await
    }

    /// The stored state replacements (history and outbox) after `after`.
    ///
    /// # Errors
    /// The store's [`StoreError`].
    pub async fn replacements_since(
        &self,
        after: u64,
    ) -> Result<Vec<super::EffectRow>, StoreError> {
        self.ask(|r| Request::Replacements(after, r)).await
    }

    /// A new connection to the store's outbox and relays
    /// ([`Store::outbox_store`]), opened on the committer thread; `None`
    /// when the store cannot give one.
    ///
    /// # Errors
    /// The store's [`StoreError`].
    pub async fn outbox_store(&self) -> Result<Option<Box<dyn OutboxStore>>, StoreError> {
        self.ask(Request::OutboxStore).await
    }

    /// A new connection for a reconciler ([`Store::authority_store`]),
    /// opened on the committer thread; `None` when the store cannot give
    /// one.
    ///
    /// # Errors
    /// The store's [`StoreError`].
    pub async fn authority_store(&self) -> Result<Option<Box<dyn AuthorityStore>>, StoreError> {
        self.ask(Request::AuthorityStore).await
    }

    /// The stored audit trail.
    ///
    /// # Errors
    /// The store's [`StoreError`].
    pub async fn audit(&self) -> Result<Vec<AuditRow>, StoreError> {
        self.ask(Request::Audit).await
    }
}

/// Deliveries a group's writes record: one audit row of kind `delivery` or
/// `malformed` each (redeliveries included; a delivery answered `retry` or
/// `reject` writes nothing).
fn deliveries(writes: &[Write]) -> u64 {
    writes
        .iter()
        .filter(|w| matches!(w, Write::Audit(a) if a.kind == "delivery" || a.kind == "malformed"))
        .count() as u64
}

fn run(
    mut store: Box<dyn Store>,
    rx: mpsc::Receiver<Request>,
    config: CommitterConfig,
    stats: &Mutex<CommitStats>,
) {
    let mut deferred: VecDeque<Request> = VecDeque::new();
    // The previous group: deliveries it answered and how long it took.
    let mut answered = 0u64;
    let mut took = Duration::ZERO;
    loop {
        let request = match deferred.pop_front() {
            Some(r) => r,
            None => match rx.recv() {
                Ok(r) => r,
                Err(_) => return,
            },
        };
        match request {
            Request::Commit(writes, reply) => {
                // Where each shard's writes lie in `all`.
                let mut parts = Vec::with_capacity(1);
                parts.push(0..writes.len());
                let mut all = writes;
                let mut replies = vec![reply];
                let mut gathered = deliveries(&all);
                let first = Instant::now();
                while all.len() < config.max_batch_writes {
                    let deadline = first + config.gather_time(answered, took, gathered);
                    let now = Instant::now();
                    let next = if deadline <= now {
                        rx.try_recv().ok()
                    } else {
                        rx.recv_timeout(deadline - now).ok()
                    };
                    match next {
                        Some(Request::Commit(more, reply)) => {
                            gathered += deliveries(&more);
                            parts.push(all.len()..all.len() + more.len());
                            all.extend(more);
                            replies.push(reply);
                        }
                        Some(other) => {
                            deferred.push_back(other);
                            break;
                        }
                        None => break,
                    }
                }
                let started = Instant::now();
                let (result, refused, committed) = commit_isolating(&mut *store, &all, &parts);
                took = started.elapsed();
                answered = gathered;
                {
                    let mut stats = crate::locks::lock(stats);
                    match &result {
                        Ok(()) => {
                            stats.committed(deliveries(&committed), committed.len() as u64, took)
                        }
                        Err(StoreError::Conflict(_)) => stats.conflicts += 1,
                        Err(_) => stats.failures += 1,
                    }
                    stats.refusals += refused.iter().flatten().count() as u64;
                    stats.phases = store.phases();
                }
                match &result {
                    Err(e @ StoreError::Conflict(_)) => {
                        tracing::debug!(error = %e, shards = replies.len(), "group commit conflicted: deciding again");
                    }
                    Err(e) => {
                        static GATE: LogGate = LogGate::new();
                        if let Some(suppressed) = GATE.admit(Instant::now()) {
                            tracing::warn!(error = %e, shards = replies.len(), writes = all.len(), suppressed, "group commit failed (suppressed: failed commits not logged in the 10 s before this one)");
                        }
                    }
                    Ok(()) => {}
                }
                for (reply, refused) in replies.into_iter().zip(refused) {
                    reply.send(refused.map_or_else(|| result.clone(), Err));
                }
            }
            Request::Refresh(objects, receipts, reply) => {
                reply.send(reload(&mut *store, &objects, &receipts));
            }
            Request::Load(since, reply) => {
                reply.send(store.load(since));
            }
            Request::Resume(since, shards, reply) => {
                reply.send(crate::core::engine::resume_from(&mut *store, since, shards));
            }
            Request::Objects(reply) => {
                reply.send(store.objects());
            }
            Request::Purge(before, reply) => {
                reply.send(store.purge_receipts(before));
            }
            Request::PurgeRecords(records, before, limit, reply) => {
                reply.send(store.purge_records(records, before, limit));
            }
            Request::Audit(reply) => {
                reply.send(store.audit());
            }
            Request::OutboxStore(reply) => {
                reply.send(store.outbox_store());
            }
            Request::AuthorityStore(reply) => {
                reply.send(store.authority_store());
            }
            Request::Replacements(after, reply) => {
                reply.send(store.replacements_since(after));
            }
        }
        crate::locks::lock(stats).thread_cpu = thread_cpu_time();
    }
}

/// What [`commit_isolating`] did: the result of the commit of every part
/// not refused, each part's own refusal (`Some` for a part answered
/// [`StoreError::Refused`], whose writes were left out), and the writes
/// committed (all of them, or the parts not refused).
type Isolated<'a> = (
    Result<(), StoreError>,
    Vec<Option<StoreError>>,
    Cow<'a, [Write]>,
);

/// Commits `all`, the writes of several shards (`parts`: where each
/// shard's lie). When the store refuses a row ([`StoreError::Refused`]),
/// finds the delivery it belongs to ([`find_refused`]), leaves that shard's
/// writes out and commits the others again, until a commit is not refused
/// or nothing is left: one bad delivery fails only its own shard's group,
/// which decides its other deliveries again without it.
fn commit_isolating<'a>(
    store: &mut dyn Store,
    all: &'a [Write],
    parts: &[std::ops::Range<usize>],
) -> Isolated<'a> {
    let mut refused: Vec<Option<StoreError>> = vec![None; parts.len()];
    let mut kept: Cow<'a, [Write]> = Cow::Borrowed(all);
    loop {
        let result = store.commit(&kept);
        let Err(StoreError::Refused { cause, .. }) = &result else {
            return (result, refused, kept);
        };
        let Some((index, cause)) = find_refused(store, &kept) else {
            tracing::warn!(%cause, "the store refused a row of the group and no delivery could be named: the group gets retry");
            return (result, refused, kept);
        };
        // `index` is a position in `kept`: map it back to its part.
        let mut at = 0;
        let mut part = None;
        for (p, range) in parts.iter().enumerate() {
            if refused[p].is_some() {
                continue;
            }
            if index < at + range.len() {
                part = Some(p);
                break;
            }
            at += range.len();
        }
        let Some(part) = part else {
            return (result, refused, kept);
        };
        let body = delivery_body(&kept[index..at + parts[part].len()]);
        tracing::warn!(%cause, delivery = body.is_some(), "the store refused a delivery's row: committing the rest of the group without it");
        refused[part] = Some(StoreError::Refused { cause, body });
        let rest: Vec<Write> = parts
            .iter()
            .zip(&refused)
            .filter(|(_, r)| r.is_none())
            .flat_map(|(range, _)| all[range.clone()].iter().cloned())
            .collect();
        if rest.is_empty() {
            return (Ok(()), refused, Cow::Owned(rest));
        }
        kept = Cow::Owned(rest);
    }
}

/// The first write of `writes` the store refuses, and the store's cause:
/// the shortest prefix whose [`Store::probe`] is refused ends with it (a
/// prefix of a group is a group: each write's condition names only the
/// stored rows and the writes before it). `None` when the store cannot
/// probe or no prefix is refused (the refusal did not repeat). At most
/// about log2(writes) probes, each rolled back.
fn find_refused(store: &mut dyn Store, writes: &[Write]) -> Option<(usize, String)> {
    let refusal = |store: &mut dyn Store, len: usize| match store.probe(&writes[..len]) {
        Err(StoreError::Refused { cause, .. }) => Some(cause),
        _ => None,
    };
    let mut cause = refusal(store, writes.len())?;
    // The prefix of length `lo` is not refused, that of length `hi` is.
    let (mut lo, mut hi) = (0, writes.len());
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        match refusal(store, mid) {
            Some(c) => {
                cause = c;
                hi = mid;
            }
            None => lo = mid,
        }
    }
    Some((hi - 1, cause))
}

/// The exact body of the delivery whose step holds the first of `writes`
/// (which run to the end of that shard's writes): every step's writes end
/// with its audit row, so the first audit row from there on is that
/// step's; a delivery's (kind `delivery` or `malformed`) carries its body.
/// `None` when the step is not a delivery (a pause, an authoritative
/// snapshot).
fn delivery_body(writes: &[Write]) -> Option<Arc<[u8]>> {
    writes
        .iter()
        .find_map(|w| match w {
            Write::Audit(a) => Some(a),
            _ => None,
        })
        .filter(|a| a.kind == "delivery" || a.kind == "malformed")
        .and_then(|a| a.body.clone())
}

/// The rows of a refresh: the variants first, then objects and receipts. A
/// variant is committed with its pause, so reading the objects after it
/// never pairs a variant with its object as it was before the pause.
fn reload(
    store: &mut dyn Store,
    objects: &[Arc<str>],
    receipts: &[Arc<str>],
) -> Result<Reloaded, StoreError> {
    let variants = store.refresh_variants(receipts)?;
    let (objects, found) = store.refresh(objects, receipts)?;
    Ok(Reloaded {
        objects,
        receipts: found,
        variants,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{AuditRow, HeldKey, ObjectRow, ReceiptRow, Write};
    use std::sync::Mutex;

    /// A store that records the size of each transaction and holds the first
    /// one until the test opens the gate.
    /// It also refuses, as a store refuses a value it cannot hold, every
    /// transaction holding the held-status write of sequence number 99,
    /// and counts its probes; a transaction holding sequence number 97
    /// conflicts with another writer, one holding 98 fails.
    struct Gated {
        gate: Option<mpsc::Receiver<()>>,
        entered: mpsc::Sender<()>,
        sizes: Arc<Mutex<Vec<usize>>>,
        probes: usize,
    }

    impl Gated {
        /// A store with an open gate.
        fn open() -> Self {
            Gated {
                gate: None,
                entered: mpsc::channel().0,
                sizes: Arc::new(Mutex::new(Vec::new())),
                probes: 0,
            }
        }

        /// Whether `writes` hold the held-status write of sequence `seq`.
        fn holds(writes: &[Write], seq: u64) -> bool {
            writes
                .iter()
                .any(|w| matches!(w, Write::HeldStatus { key, .. } if key.seq == seq))
        }

        fn refused(writes: &[Write]) -> Result<(), StoreError> {
            if Self::holds(writes, 99) {
                return Err(StoreError::Refused {
                    cause: "cannot hold row 99".to_owned(),
                    body: None,
                });
            }
            Ok(())
        }
    }

    impl Store for Gated {
        fn commit(&mut self, writes: &[Write]) -> Result<(), StoreError> {
            if let Some(gate) = self.gate.take() {
                self.entered.send(()).unwrap();
                gate.recv().unwrap();
            }
            Self::refused(writes)?;
            if Self::holds(writes, 97) {
                return Err(StoreError::Conflict("row 97 changed".to_owned()));
            }
            if Self::holds(writes, 98) {
                return Err(StoreError::Failed("row 98 lost".to_owned()));
            }
            self.sizes.lock().unwrap().push(writes.len());
            Ok(())
        }
        fn probe(&mut self, writes: &[Write]) -> Result<(), StoreError> {
            self.probes += 1;
            Self::refused(writes)
        }
        fn load(&mut self, _: SystemTime) -> Result<Loaded, StoreError> {
            Ok(Loaded::default())
        }
        fn refresh(
            &mut self,
            _: &[Arc<str>],
            _: &[Arc<str>],
        ) -> Result<(Vec<ObjectRow>, Vec<ReceiptRow>), StoreError> {
            Ok((Vec::new(), Vec::new()))
        }
        fn refresh_variants(
            &mut self,
            _: &[Arc<str>],
        ) -> Result<Vec<crate::store::VariantRow>, StoreError> {
            Ok(Vec::new())
        }
        fn purge_receipts(&mut self, _: SystemTime) -> Result<u64, StoreError> {
            Ok(0)
        }
        fn audit(&mut self) -> Result<Vec<AuditRow>, StoreError> {
            Ok(Vec::new())
        }
        fn replacements_since(
            &mut self,
            _: u64,
        ) -> Result<Vec<crate::store::EffectRow>, StoreError> {
            Ok(Vec::new())
        }
    }

    fn write(seq: u64) -> Vec<Write> {
        vec![Write::HeldStatus {
            key: HeldKey { origin: 1, seq },
            status: crate::store::HeldStatus::Resolved,
            superseded_by: None,
        }]
    }

    #[test]
    fn shards_waiting_during_a_commit_share_the_next_transaction() {
        let config = CommitterConfig::default();
        assert_eq!(transaction_sizes(config), [1, 3]);
    }

    #[test]
    fn a_transaction_is_cut_once_it_reaches_max_batch_writes() {
        let config = CommitterConfig {
            max_batch_writes: 2,
            ..CommitterConfig::default()
        };
        assert_eq!(transaction_sizes(config), [1, 2, 1]);
    }

    /// The sizes of the transactions that commit one write, held in the
    /// store, then three writes handed over meanwhile, one write each.
    fn transaction_sizes(config: CommitterConfig) -> Vec<usize> {
        let (open_gate, gate) = mpsc::channel();
        let (entered_tx, entered) = mpsc::channel();
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let store = Gated {
            gate: Some(gate),
            entered: entered_tx,
            sizes: sizes.clone(),
            probes: 0,
        };
        let committer = Arc::new(
            Committer::start(move || Ok(Box::new(store) as Box<dyn Store>), config).unwrap(),
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let first = tokio::spawn({
                let c = committer.clone();
                async move { c.commit(write(1)).await }
            });
            tokio::task::yield_now().await;
            // The first transaction is now held inside the store.
            entered.recv().unwrap();
            let waiting: Vec<_> = (2..=4)
                .map(|seq| {
                    let c = committer.clone();
                    tokio::spawn(async move { c.commit(write(seq)).await })
                })
                .collect();
            // Let each waiting shard hand over its writes, then release the store.
            tokio::task::yield_now().await;
            open_gate.send(()).unwrap();
            assert_eq!(first.await.unwrap(), Ok(()));
            for w in waiting {
                assert_eq!(w.await.unwrap(), Ok(()));
            }
        });
        let sizes = sizes.lock().unwrap().clone();
        sizes
    }

    #[test]
    fn a_commit_reaches_the_store_before_its_answer_is_awaited() {
        // A shard task sends its group, then reads the store for the next
        // batch, and only then awaits the commit: the transaction must be
        // running meanwhile.
        let (open_gate, gate) = mpsc::channel();
        let (entered_tx, entered) = mpsc::channel();
        let store = Gated {
            gate: Some(gate),
            entered: entered_tx,
            sizes: Arc::default(),
            probes: 0,
        };
        let committer = Committer::start(
            move || Ok(Box::new(store) as Box<dyn Store>),
            CommitterConfig::default(),
        )
        .unwrap();
        let answer = committer.commit(write(1));
        entered
            .recv_timeout(Duration::from_secs(30))
            .expect("the transaction is in the store though its answer was never polled");
        open_gate.send(()).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert_eq!(rt.block_on(answer), Ok(()));
    }

    #[test]
    fn a_group_waits_for_the_deliveries_just_answered_but_never_longer_than_a_commit() {
        let ms = Duration::from_millis;
        // By default a group waits for no one.
        let default = CommitterConfig::default();
        assert_eq!(default.gather_time(40, ms(2), 12), Duration::ZERO);
        let config = CommitterConfig {
            max_refill_wait: ms(5),
            ..default
        };
        // The previous commit answered 40 deliveries in 2 ms: a group holding
        // fewer waits up to 2 ms for the rest, one holding 40 does not wait.
        assert_eq!(config.gather_time(40, ms(2), 12), ms(2));
        assert_eq!(config.gather_time(40, ms(2), 40), Duration::ZERO);
        // A slow commit does not make the next group wait more than 5 ms.
        assert_eq!(config.gather_time(40, ms(30), 12), ms(5));
        // Nothing answered (the first group, or an idle receiver): no wait.
        assert_eq!(config.gather_time(0, ms(2), 1), Duration::ZERO);
        let off = CommitterConfig {
            max_refill_wait: Duration::ZERO,
            flush_wait: ms(1),
            ..config
        };
        assert_eq!(off.gather_time(40, ms(2), 12), ms(1));
        assert_eq!(off.gather_time(40, ms(2), 40), ms(1));
    }

    #[test]
    fn stats_count_committed_groups_and_their_deliveries() {
        let (open_gate, gate) = mpsc::channel();
        let (entered_tx, _entered) = mpsc::channel();
        let store = Gated {
            gate: Some(gate),
            entered: entered_tx,
            sizes: Arc::new(Mutex::new(Vec::new())),
            probes: 0,
        };
        open_gate.send(()).unwrap();
        let committer = Committer::start(
            move || Ok(Box::new(store) as Box<dyn Store>),
            CommitterConfig::default(),
        )
        .unwrap();
        let before = committer.stats();
        let audit = |seq, kind| {
            Write::Audit(AuditRow {
                key: HeldKey { origin: 1, seq },
                at: SystemTime::UNIX_EPOCH,
                event_id: None,
                object_id: None,
                kind,
                decision: None,
                version: None,
                replacement: false,
                detail: None,
                body: None,
            })
        };
        // Two deliveries (one malformed) and a pause's audit row, which is
        // not a delivery.
        let group = vec![
            audit(1, "delivery"),
            audit(2, "malformed"),
            audit(3, "paused"),
            write(4)[0].clone(),
        ];
        committer.commit_blocking(group).unwrap();
        committer.commit_blocking(write(5)).unwrap();
        // A conflict and two failures count as such, not as commits.
        assert!(matches!(
            committer.commit_blocking(write(97)),
            Err(StoreError::Conflict(_))
        ));
        for _ in 0..2 {
            assert!(matches!(
                committer.commit_blocking(write(98)),
                Err(StoreError::Failed(_))
            ));
        }
        let run = committer.stats().since(&before);
        assert_eq!((run.commits, run.deliveries, run.writes), (2, 2, 5));
        assert_eq!((run.conflicts, run.failures), (1, 2));
        // The group without a delivery is not a size: mean and median of
        // the one group of two.
        let sizes = run.deliveries_per_commit();
        assert_eq!((sizes.mean, sizes.p50, sizes.max), (2.0, 2, 2));
    }

    /// How [`Gated`] refuses the row 99 of the delivery with `body`.
    fn refused_99(body: &[u8]) -> StoreError {
        StoreError::Refused {
            cause: "cannot hold row 99".to_owned(),
            body: Some(Arc::from(body)),
        }
    }

    /// A delivery's audit row, with `body`.
    fn delivery(seq: u64, body: &[u8]) -> Write {
        audit_row(seq, "delivery", body)
    }

    /// The audit row of kind `kind` with `body`.
    fn audit_row(seq: u64, kind: &'static str, body: &[u8]) -> Write {
        Write::Audit(AuditRow {
            key: HeldKey { origin: 1, seq },
            at: SystemTime::UNIX_EPOCH,
            event_id: None,
            object_id: None,
            kind,
            decision: Some("applied".to_owned()),
            version: None,
            replacement: false,
            detail: None,
            body: Some(Arc::from(body)),
        })
    }

    #[test]
    fn a_refused_row_leaves_out_only_its_shards_writes_and_names_its_delivery() {
        // Three shards' writes in one group; the second shard's second step
        // (the row 99, then its audit row with body "b") is refused.
        let parts = [
            vec![write(1)[0].clone(), delivery(2, b"a")],
            vec![
                write(3)[0].clone(),
                delivery(4, b"ok"),
                write(99)[0].clone(),
                delivery(5, b"b"),
            ],
            vec![write(6)[0].clone(), delivery(7, b"c")],
        ];
        let mut all = Vec::new();
        let mut ranges = Vec::new();
        for p in &parts {
            ranges.push(all.len()..all.len() + p.len());
            all.extend(p.iter().cloned());
        }
        let mut store = Gated::open();
        let (result, refused, committed) = commit_isolating(&mut store, &all, &ranges);
        assert_eq!(result, Ok(()));
        assert_eq!(refused, [None, Some(refused_99(b"b")), None]);
        // The first and third shards' four writes, in one commit.
        assert_eq!(*store.sizes.lock().unwrap(), [4]);
        assert_eq!(committed.len(), 4);
        // One probe of the whole group, then a bisection of its 8 writes.
        assert_eq!(store.probes, 4);

        // Every shard refused: nothing is committed, each is told.
        let poisoned = [write(99)[0].clone(), delivery(1, b"x")];
        let whole = std::iter::once(0..2).collect::<Vec<_>>();
        let (result, refused, _) = commit_isolating(&mut store, &poisoned, &whole);
        assert_eq!(result, Ok(()));
        assert!(
            matches!(&refused[0], Some(StoreError::Refused { body: Some(b), .. }) if &**b == b"x")
        );
        assert_eq!(*store.sizes.lock().unwrap(), [4]);

        // A refused write that is no delivery's: named by no body.
        let pause_only = [write(99)[0].clone()];
        let whole = std::iter::once(0..1).collect::<Vec<_>>();
        let (_, refused, _) = commit_isolating(&mut store, &pause_only, &whole);
        assert!(matches!(
            &refused[0],
            Some(StoreError::Refused { body: None, .. })
        ));
    }

    #[test]
    fn a_group_waits_flush_wait_for_another_shard_to_join() {
        // A long flush wait, cut short once the group holds two writes.
        let config = CommitterConfig {
            max_batch_writes: 2,
            flush_wait: Duration::from_secs(60),
            ..CommitterConfig::default()
        };
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let store = Gated {
            sizes: sizes.clone(),
            ..Gated::open()
        };
        let committer = Arc::new(
            Committer::start(move || Ok(Box::new(store) as Box<dyn Store>), config).unwrap(),
        );
        let first = std::thread::spawn({
            let c = committer.clone();
            move || c.commit_blocking(write(1))
        });
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(committer.commit_blocking(write(2)), Ok(()));
        assert_eq!(first.join().unwrap(), Ok(()));
        assert_eq!(*sizes.lock().unwrap(), [2]);
    }

    #[test]
    fn a_refused_first_write_of_a_shards_part_names_that_shards_malformed_body() {
        // The refused row opens the second shard's writes, and its step is
        // a malformed body's (audit kind `malformed`).
        let parts = [
            vec![write(1)[0].clone(), delivery(2, b"a")],
            vec![write(99)[0].clone(), audit_row(3, "malformed", b"[1")],
        ];
        let all: Vec<Write> = parts.iter().flatten().cloned().collect();
        let ranges = [0..2, 2..4];
        let mut store = Gated::open();
        let (result, refused, committed) = commit_isolating(&mut store, &all, &ranges);
        assert_eq!(result, Ok(()));
        assert_eq!(refused, [None, Some(refused_99(b"[1"))]);
        assert_eq!(committed.len(), 2);
    }

    #[test]
    fn a_failed_open_is_reported() {
        let err = Committer::start(
            || Err(StoreError::Failed("no such database".to_owned())),
            CommitterConfig::default(),
        )
        .err()
        .unwrap();
        assert_eq!(err, StoreError::Failed("no such database".to_owned()));
    }
}
