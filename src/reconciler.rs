//! The background reconciler (docs/CONTRACT.md §4, *The service fetches
//! authorities itself*): a task that asks an [`AuthoritySource`] for the
//! authoritative snapshot of every object that needs one, without a person,
//! and applies each answer with [`Receiver::reconcile`].
//!
//! - **What it fetches.** Paused objects, objects holding events an
//!   authority can settle (no version, an invalid version, an unsupported
//!   type, a malformed body naming a known object), objects the receiver
//!   does not know with parked events, and, with
//!   [`ReconcilerOptions::resync`], every object not confirmed by an
//!   authority for that long. The needs are read from what the receiver
//!   holds ([`Receiver::authority_needs`]; a durable receiver resumes its
//!   pauses and held rows from its store, so a restart fetches again), at
//!   start, every [`ReconcilerOptions::rescan`], and after every decision
//!   that holds or pauses.
//! - **Bounded and polite.** One fetch in flight per object, at most
//!   [`ReconcilerOptions::concurrency`], a token-bucket rate limit, a
//!   deadline per attempt, per-object exponential backoff with jitter
//!   that honours `Retry-After`, a circuit breaker with a probe, and
//!   tenants served round-robin: the core's sans-IO
//!   [`crate::core::reconciler::WorkQueue`] decides, this task does what
//!   it says.
//! - **Bad answers change nothing.** A snapshot of another object is
//!   ignored; one older than the object is refused (as
//!   [`Receiver::reconcile`] refuses it); "no such object" leaves a parked
//!   object parked and a paused one paused; each is logged, counted
//!   ([`ReconcilerStatus::fetches`], the metric
//!   `snapshot_receiver_authority_fetches_total`) and tried again later.
//! - **The operator sees it without the process.** With a durable store,
//!   each object still waiting after a fetch has its last error written to
//!   the store (table `authority_waits`, on a connection of the
//!   reconciler's own, batched off the fetch path), and the row goes when
//!   the object converges: `inspect` shows it beside what the store says
//!   needs an authority.
//! - **Bounded memory.** The queue counts its bytes against the memory
//!   budget's authority part ([`ReconcilerOptions::memory`]); past it a
//!   need stays in the store and the next scan finds it again. A resync
//!   reads the object ids a page at a time, from the store's own
//!   connection (in memory, from the shards).

use crate::authority::{AuthorityError, AuthoritySource};
pub use crate::core::reconciler::{
    AuthorityNeed, BreakerState, FetchCounts, FetchOutcome, NeedReason, NeedReasons, WaitingObject,
};
use crate::core::reconciler::{Next, Notice, ReconcilerSettings, WaitRecord, WorkQueue};
use crate::log_gate::LogGate;
use crate::receiver::NeedTapReceiver;
use crate::store::AuthorityStore;
use crate::{Receiver, ReconcileError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::{oneshot, Notify};
use tokio::task::JoinSet;

/// How a reconciler runs. `ReconcilerOptions::default()` gives the
/// defaults.
#[derive(Clone, Debug)]
pub struct ReconcilerOptions {
    /// Most fetches in flight at once (default 8).
    pub concurrency: usize,
    /// Fetches per second over all objects, a token bucket's refill
    /// (default 50); `None`: unlimited.
    pub rate: Option<f64>,
    /// Fetches let through at once after a quiet spell: the bucket's size
    /// (default 10).
    pub burst: u32,
    /// How long one fetch may take before it counts as timed out (default
    /// 10 s).
    pub attempt_timeout: Duration,
    /// The wait after an object's first failed or refused fetch (default
    /// 1 s); doubled for each further one, each wait times a factor from
    /// 0.8 to 1.2, never shorter than the authority's `Retry-After`.
    pub backoff_base: Duration,
    /// The longest of those waits (default 5 min, at most 24 h); also the
    /// wait after an authority said it has no such object.
    pub backoff_max: Duration,
    /// Consecutive failures to reach the authority (unavailable, timed out)
    /// that open the circuit breaker (default 5).
    pub breaker_failures: u32,
    /// How long the breaker stays open before one probe goes (default
    /// 30 s).
    pub breaker_open: Duration,
    /// Fetch every object not confirmed by an authority for this long
    /// (default `None`: no resync). Each resync lists every object the
    /// receiver holds (a durable store's too).
    pub resync: Option<Duration>,
    /// How often the receiver is scanned for what needs an authority
    /// (default 30 s); decisions that hold or pause are noted at once.
    pub rescan: Duration,
    /// The seed of the backoff's jitter (default `None`: one per run).
    pub seed: Option<u64>,
    /// The bytes its work queue may hold (default `None`: the receiver's
    /// memory budget's authority part, [`crate::MemoryBudget::authority`]).
    /// Past them a need is not queued: it stays in the store and a later
    /// scan finds it again; a resync reads its next page once there is
    /// room.
    pub memory: Option<usize>,
}

impl Default for ReconcilerOptions {
    fn default() -> Self {
        let core = ReconcilerSettings::default();
        Self {
            concurrency: core.concurrency,
            rate: core.rate,
            burst: core.burst,
            attempt_timeout: Duration::from_secs(10),
            backoff_base: core.backoff_base,
            backoff_max: core.backoff_max,
            breaker_failures: core.breaker_failures,
            breaker_open: core.breaker_open,
            resync: core.resync,
            rescan: core.rescan,
            seed: None,
            memory: None,
        }
    }
}

impl ReconcilerOptions {
    /// The core's settings: `tenants` when the profile scopes object ids by
    /// tenant; `memory` the budget's authority part (unless set here).
    fn settings(&self, tenants: bool, memory: usize) -> ReconcilerSettings {
        use std::hash::{BuildHasher, RandomState};
        ReconcilerSettings {
            concurrency: self.concurrency,
            rate: self.rate,
            burst: self.burst,
            backoff_base: self.backoff_base,
            backoff_max: self.backoff_max,
            breaker_failures: self.breaker_failures,
            breaker_open: self.breaker_open,
            resync: self.resync,
            rescan: self.rescan,
            tenants,
            seed: self
                .seed
                .unwrap_or_else(|| RandomState::new().hash_one(std::process::id())),
            memory: self.memory.unwrap_or(memory),
            ..ReconcilerSettings::default()
        }
    }
}

/// Why a reconciler could not start, or could not answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReconcilerError {
    /// An option is out of range: which one and why.
    #[error("reconciler options: {0}")]
    Options(String),
    /// The reconciler stopped before it answered.
    #[error("the reconciler has stopped")]
    Stopped,
    /// The reconciler's task ended abnormally (a panic in it).
    #[error("the reconciler's task stopped: {0}")]
    Task(String),
}

/// A reconciler's state for an operator ([`Reconciler::status`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ReconcilerStatus {
    /// Fetches by outcome since it started.
    pub fetches: FetchCounts,
    /// Fetches in flight now.
    pub in_flight: usize,
    /// Objects waiting for an authority (in flight included).
    pub waiting: usize,
    /// How long the longest-waiting object has waited (`None`: none waits).
    pub oldest_wait: Option<Duration>,
    /// The circuit breaker.
    pub breaker: BreakerState,
    /// The bytes its work queue holds now, against
    /// [`ReconcilerOptions::memory`].
    pub memory: usize,
    /// The most bytes its work queue held so far.
    pub memory_peak: usize,
    /// Needs not queued for want of room so far (each found again by a
    /// later scan).
    pub deferred: u64,
}

/// What the handle and the task share.
struct Shared {
    /// The queue and the askers waiting for answers. A std mutex: held for
    /// one queue call, never across an await.
    state: Mutex<State>,
    /// Wakes the task (a request, a stop).
    wake: Notify,
    /// The queue's clock.
    clock: QueueClock,
}

/// The time the queue is given: the wall time when the reconciler started
/// plus the monotonic time since. A wall clock stepped back (NTP, an
/// operator) would otherwise hold every backoff, breaker spell and scan
/// back by the step (the simulation's `reconciler-on-wall-clock` control
/// shows it); the times an operator reads stay within the steps since the
/// start.
#[derive(Clone, Copy, Debug)]
struct QueueClock {
    /// The wall time at the start.
    wall: SystemTime,
    /// The monotonic instant at the start.
    at: std::time::Instant,
}

impl QueueClock {
    fn start() -> Self {
        Self {
            wall: SystemTime::now(),
            at: std::time::Instant::now(),
        }
    }

    fn now(&self) -> SystemTime {
        self.wall + self.at.elapsed()
    }
}

struct State {
    /// The policy.
    queue: WorkQueue,
    /// Who waits for an object's next answer ([`Reconciler::fetch_now`]).
    askers: HashMap<Arc<str>, Vec<oneshot::Sender<FetchOutcome>>>,
}

/// A running reconciler ([`Receiver::reconciler`]). Dropping it stops
/// nothing: call [`Reconciler::stop`], before [`Receiver::shutdown`] (a
/// reconciler of a receiver shut down gets `not_applied` for every
/// snapshot it fetches).
pub struct Reconciler {
    /// Shared with the task.
    shared: Arc<Shared>,
    /// The task.
    task: tokio::task::JoinHandle<()>,
}

impl Reconciler {
    /// Counts by outcome, fetches in flight, objects waiting and the oldest
    /// wait, the breaker.
    pub fn status(&self) -> ReconcilerStatus {
        let status = crate::locks::lock(&self.shared.state).queue.status();
        ReconcilerStatus {
            fetches: status.counts,
            in_flight: status.in_flight,
            waiting: status.waiting,
            oldest_wait: status.oldest.map(|since| {
                self.shared
                    .clock
                    .now()
                    .duration_since(since)
                    .unwrap_or_default()
            }),
            breaker: status.breaker,
            memory: status.memory,
            memory_peak: status.memory_peak,
            deferred: status.deferred,
        }
    }

    /// Every object waiting for an authority, the longest-waiting first:
    /// why, since when, attempts, the last error, the next try.
    pub fn waiting(&self) -> Vec<WaitingObject> {
        crate::locks::lock(&self.shared.state)
            .queue
            .waiting(self.shared.clock.now())
    }

    /// Fetches `object_id` now (before anything else, its backoff and an
    /// open breaker notwithstanding) and returns the outcome once it is
    /// applied; a fetch of it in flight is joined, not repeated.
    ///
    /// # Errors
    /// [`ReconcilerError::Stopped`] when the reconciler stopped first.
    pub async fn fetch_now(&self, object_id: &str) -> Result<FetchOutcome, ReconcilerError> {
        let id: Arc<str> = Arc::from(object_id);
        let (tx, rx) = oneshot::channel();
        {
            let mut state = crate::locks::lock(&self.shared.state);
            state.queue.request(&id, self.shared.clock.now());
            state.askers.entry(id).or_default().push(tx);
        }
        self.shared.wake.notify_one();
        rx.await.map_err(|_| ReconcilerError::Stopped)
    }

    /// Stops the reconciler: nothing more is fetched, the fetches in flight
    /// finish (each within its deadline) and their answers are applied.
    ///
    /// # Errors
    /// [`ReconcilerError::Task`] when the task panicked.
    pub async fn stop(self) -> Result<(), ReconcilerError> {
        crate::locks::lock(&self.shared.state).queue.stop();
        self.shared.wake.notify_one();
        self.task
            .await
            .map_err(|e| ReconcilerError::Task(e.to_string()))
    }
}

impl Receiver {
    /// Starts a reconciler that fetches authoritative snapshots from
    /// `source` for every object that needs one, in the background (see
    /// [`crate::reconciler`]), and applies them.
    ///
    /// # Errors
    /// [`ReconcilerError::Options`] for options out of range.
    pub fn reconciler<A: AuthoritySource>(
        &self,
        source: Arc<A>,
        options: ReconcilerOptions,
    ) -> Result<Reconciler, ReconcilerError> {
        if options.attempt_timeout.is_zero() {
            return Err(ReconcilerError::Options(
                "attempt timeout: must be above 0".to_owned(),
            ));
        }
        let tenants = self.context().config().profile.tenant_scoped();
        let settings = options.settings(tenants, self.context().config().memory.authority);
        if let Some(why) = settings.problem() {
            return Err(ReconcilerError::Options(why));
        }
        let clock = QueueClock::start();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: WorkQueue::new(settings, clock.now()),
                askers: HashMap::new(),
            }),
            wake: Notify::new(),
            clock,
        });
        let runner = Runner {
            receiver: self.clone(),
            source,
            timeout: options.attempt_timeout,
            shared: shared.clone(),
            failures: LogGate::new(),
            store: None,
            pending: HashMap::new(),
            store_failures: LogGate::new(),
            counted: 0,
            bytes: self.authority_bytes(),
        };
        // Tapped here, so that no decision after this call is missed.
        let notes = self.tap_needs();
        let task = tokio::spawn(runner.run(notes));
        Ok(Reconciler { shared, task })
    }

    /// What an authority can settle for `object_id` now (empty: nothing;
    /// see [`crate::core::Shard::authority_need`]).
    pub async fn authority_need(&self, object_id: &str) -> NeedReasons {
        let id = object_id.to_owned();
        self.ask(self.shard_for(Some(object_id)), move |s| {
            s.authority_need(&id)
        })
        .await
        .unwrap_or_default()
    }

    /// What needs an authority, per object with its reasons, sorted by
    /// object id (see [`crate::core::Shard::authority_needs`]): what a
    /// reconciler fetches without being asked.
    pub async fn authority_needs(&self) -> Vec<AuthorityNeed> {
        let mut all = self
            .ask_all(crate::core::Shard::authority_needs)
            .await
            .concat();
        all.sort_by(|a, b| a.object_id.cmp(&b.object_id));
        all
    }
}

/// The longest the task sleeps between two settings of its gauges.
const GAUGE_EVERY: Duration = Duration::from_secs(5);

/// Fetches by outcome (counter, label `outcome`).
const FETCHES: &str = "snapshot_receiver_authority_fetches_total";
/// Fetches in flight (gauge).
const IN_FLIGHT: &str = "snapshot_receiver_authority_in_flight";
/// Objects waiting for an authority (gauge).
const WAITING: &str = "snapshot_receiver_authority_waiting";
/// Seconds the longest-waiting object has waited (gauge).
const OLDEST: &str = "snapshot_receiver_authority_oldest_wait_seconds";
/// The breaker: 0 closed, 1 half-open, 2 open (gauge).
const BREAKER: &str = "snapshot_receiver_authority_breaker";

/// Describes every metric a reconciler sets through the [`metrics`]
/// facade to the recorder installed now; once, after installing it.
pub fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge};
    describe_counter!(
        FETCHES,
        "Authority fetches by outcome (applied, unchanged, absent, older, wrong_object, unavailable, timeout, bad_answer, not_applied)."
    );
    describe_gauge!(IN_FLIGHT, "Authority fetches in flight.");
    describe_gauge!(WAITING, "Objects waiting for an authority.");
    describe_gauge!(
        OLDEST,
        "Seconds the longest-waiting object has waited for an authority."
    );
    describe_gauge!(
        BREAKER,
        "The authority's circuit breaker: 0 closed, 1 half-open, 2 open."
    );
}

/// A fetch's result as its task hands it back.
struct Answered {
    /// The object fetched.
    object_id: Arc<str>,
    /// What came of it.
    outcome: FetchOutcome,
    /// After an applied snapshot: what the object still needs.
    remaining: NeedReasons,
    /// The queue's note count read before `remaining`.
    seen: u64,
}

/// The reconciler's task.
struct Runner<A> {
    /// The receiver it reads and reconciles.
    receiver: Receiver,
    /// Where snapshots come from.
    source: Arc<A>,
    /// One fetch's deadline.
    timeout: Duration,
    /// Shared with the handle.
    shared: Arc<Shared>,
    /// The gate of its failure warnings: an authority down under load gives
    /// a line per [`crate::log_gate::INTERVAL`], not one per fetch.
    failures: LogGate,
    /// Its own connection to the durable store (`None` in memory): resync
    /// pages and last errors. A std mutex: held by one blocking call at a
    /// time, never across an await.
    store: Option<Arc<Mutex<Box<dyn AuthorityStore>>>>,
    /// Last errors and convergences not yet written, the latest per object.
    pending: HashMap<Arc<str>, WaitRecord>,
    /// The gate of its warnings that the store could not be written.
    store_failures: LogGate,
    /// The queue's bytes it last added to the receiver's count.
    counted: usize,
    /// The receiver's count of what its reconcilers' queues hold.
    bytes: Arc<std::sync::atomic::AtomicUsize>,
}

/// The most records one write to the store takes.
const SAVE_BATCH: usize = 500;

impl<A: AuthoritySource> Runner<A> {
    /// Does what the queue says until it stops.
    async fn run(mut self, mut notes: NeedTapReceiver) {
        match self.receiver.authority_store().await {
            Ok(store) => self.store = store.map(|s| Arc::new(Mutex::new(s))),
            Err(e) => tracing::warn!(
                error = %crate::core::error_chain(&e),
                "the reconciler has no connection of its own to the store: last errors stay in this process, resyncs read the objects in memory"
            ),
        }
        let mut fetches: JoinSet<Answered> = JoinSet::new();
        // The write of last errors out, if any (one at a time).
        let mut saving: JoinSet<(Vec<WaitRecord>, Result<(), crate::store::StoreError>)> =
            JoinSet::new();
        // Whether decisions can still be noted (the receiver lives).
        let mut listening = true;
        loop {
            let next = crate::locks::lock(&self.shared.state)
                .queue
                .next(self.shared.clock.now());
            match next {
                Next::Fetch { object_id, attempt } => {
                    tracing::debug!(object_id = %object_id, attempt, "fetching the authority's snapshot");
                    let (receiver, source, timeout, shared) = (
                        self.receiver.clone(),
                        self.source.clone(),
                        self.timeout,
                        self.shared.clone(),
                    );
                    fetches.spawn(async move {
                        let outcome = fetch(&receiver, &*source, &object_id, timeout).await;
                        // What the object still needs after an applied
                        // snapshot, the notes counted first (see
                        // `WorkQueue::answered`).
                        let (remaining, seen) = if outcome.settled() {
                            let seen = crate::locks::lock(&shared.state).queue.seen();
                            (receiver.authority_need(&object_id).await, seen)
                        } else {
                            (NeedReasons::default(), 0)
                        };
                        Answered {
                            object_id,
                            outcome,
                            remaining,
                            seen,
                        }
                    });
                }
                Next::Scan => {
                    let started = self.shared.clock.now();
                    let needs = self.receiver.authority_needs().await;
                    let mut state = crate::locks::lock(&self.shared.state);
                    state.queue.scanned(needs, started, self.shared.clock.now());
                    let records: Vec<WaitRecord> = state.queue.records().collect();
                    drop(state);
                    self.keep(records);
                }
                Next::List { after, limit } => {
                    let page = self.page(&after, limit).await;
                    crate::locks::lock(&self.shared.state)
                        .queue
                        .listed(page, self.shared.clock.now());
                }
                Next::Wait(wait) => {
                    // At most a few seconds, so that the gauges (the oldest
                    // wait) stay current while nothing happens.
                    let sleep = tokio::time::sleep(wait.unwrap_or(GAUGE_EVERY).min(GAUGE_EVERY));
                    tokio::select! {
                        Some(joined) = fetches.join_next(), if !fetches.is_empty() => {
                            match joined {
                                Ok(answer) => self.answered(answer),
                                Err(e) => {
                                    tracing::error!(error = %e, "an authority fetch ended abnormally");
                                }
                            }
                        }
                        Some(saved) = saving.join_next(), if !saving.is_empty() => {
                            if let Ok((records, Err(e))) = saved {
                                self.not_saved(records, &e);
                            }
                        }
                        note = notes.rx.recv(), if listening => self.noted(note, &notes.lagged, &mut listening),
                        () = self.shared.wake.notified() => {}
                        () = sleep => {}
                    }
                }
                Next::Stop => break,
            }
            if saving.is_empty() {
                if let Some(save) = self.save() {
                    saving.spawn(save);
                }
            }
            self.gauges();
        }
        // What is left is written before the task ends.
        while let Some(saved) = saving.join_next().await {
            if let Ok((records, Err(e))) = saved {
                self.not_saved(records, &e);
            }
        }
        while let Some(save) = self.save() {
            if let (records, Err(e)) = save.await {
                self.not_saved(records, &e);
                break;
            }
        }
        self.gauges();
        self.bytes
            .fetch_sub(self.counted, std::sync::atomic::Ordering::Relaxed);
        // Whoever still waits for an answer gets `ReconcilerError::Stopped`.
        crate::locks::lock(&self.shared.state).askers.clear();
    }

    /// A resync's page: at most `limit` object ids after `after`, from the
    /// store's own connection, or from memory without one. A page the
    /// store could not give is empty (logged): that resync ends, the next
    /// comes a period later.
    async fn page(&self, after: &str, limit: usize) -> Vec<Arc<str>> {
        let Some(store) = self.store.clone() else {
            return self.receiver.object_ids_in_memory(after, limit).await;
        };
        let after_owned = after.to_owned();
        let read = tokio::task::spawn_blocking(move || {
            crate::locks::lock(&store).object_ids(&after_owned, limit)
        })
        .await
        .map_err(|e| crate::store::StoreError::Failed(format!("the page read stopped: {e}")))
        .and_then(|read| read);
        match read {
            Ok(page) => page,
            Err(e) => {
                tracing::warn!(
                    after,
                    error = %crate::core::error_chain(&e),
                    "a resync page could not be read from the store: this resync ends; the next comes one period later"
                );
                Vec::new()
            }
        }
    }

    /// Keeps `records` for the next write to the store (the latest per
    /// object); none without a store.
    fn keep(&mut self, records: Vec<WaitRecord>) {
        if self.store.is_none() {
            return;
        }
        for record in records {
            self.pending.insert(record.object_id().clone(), record);
        }
    }

    /// The next write of kept records, at most [`SAVE_BATCH`], if any.
    fn save(
        &mut self,
    ) -> Option<
        impl std::future::Future<Output = (Vec<WaitRecord>, Result<(), crate::store::StoreError>)>,
    > {
        let store = self.store.clone()?;
        if self.pending.is_empty() {
            return None;
        }
        let ids: Vec<Arc<str>> = self.pending.keys().take(SAVE_BATCH).cloned().collect();
        let records: Vec<WaitRecord> = ids
            .iter()
            .filter_map(|id| self.pending.remove(id))
            .collect();
        Some(async move {
            let joined = tokio::task::spawn_blocking(move || {
                let saved = crate::locks::lock(&store).save_waits(&records);
                (records, saved)
            })
            .await;
            match joined {
                Ok(done) => done,
                Err(e) => (
                    Vec::new(),
                    Err(crate::store::StoreError::Failed(format!(
                        "the write of last errors stopped: {e}"
                    ))),
                ),
            }
        })
    }

    /// A write of `records` failed: its last errors are kept for the next
    /// (unless newer ones came meanwhile); its convergences are dropped (a
    /// row left behind names an object `inspect` no longer lists as
    /// waiting, so nothing shows it).
    fn not_saved(&mut self, records: Vec<WaitRecord>, e: &crate::store::StoreError) {
        if let Some(suppressed) = self.store_failures.admit(std::time::Instant::now()) {
            tracing::warn!(
                error = %crate::core::error_chain(e),
                suppressed,
                "the last errors of objects waiting for an authority could not be written to the store; written again with the next"
            );
        }
        for record in records {
            if let WaitRecord::Failed(_) = &record {
                self.pending
                    .entry(record.object_id().clone())
                    .or_insert(record);
            }
        }
    }

    /// A decision that needs an authority (the receiver's need tap), or
    /// `None` once the receiver is gone. Needs dropped for a full tap
    /// (`lagged`) make the queue scan the shards again.
    fn noted(
        &self,
        note: Option<(Arc<str>, NeedReason)>,
        lagged: &AtomicBool,
        listening: &mut bool,
    ) {
        let now = self.shared.clock.now();
        let mut state = crate::locks::lock(&self.shared.state);
        match note {
            Some((object_id, reason)) => state.queue.note(&object_id, reason, now),
            None => *listening = false,
        }
        if lagged.swap(false, Ordering::AcqRel) {
            tracing::debug!("reconciler fell behind the receiver's decisions; scanning it again");
            state.queue.rescan(now);
        }
    }

    /// A fetch's outcome: the queue told, the askers answered, a line
    /// logged, the outcome counted and what the store keeps noted.
    fn answered(&mut self, answer: Answered) {
        let Answered {
            object_id,
            outcome,
            remaining,
            seen,
        } = answer;
        let now = self.shared.clock.now();
        let (reasons, next, askers, notices) = {
            let mut state = crate::locks::lock(&self.shared.state);
            let reasons = state.queue.reasons(&object_id);
            let next = state
                .queue
                .answered(&object_id, &outcome, remaining, seen, now);
            let askers = state.askers.remove(&object_id).unwrap_or_default();
            let notices: Vec<Notice> = state.queue.notices().collect();
            let records: Vec<WaitRecord> = state.queue.records().collect();
            (reasons, next, askers, (notices, records))
        };
        let (notices, records) = notices;
        self.keep(records);
        metrics::counter!(FETCHES, "outcome" => outcome.as_str()).increment(1);
        for asker in askers {
            let _ = asker.send(outcome.clone());
        }
        self.log(&object_id, reasons.unwrap_or_default(), &outcome, next);
        for notice in notices {
            match notice {
                Notice::BreakerOpened { until, cause } => tracing::warn!(
                    until = %crate::format_rfc3339(until),
                    cause = %cause,
                    "authority circuit breaker open: nothing is fetched until one probe at the time given"
                ),
                Notice::BreakerClosed => {
                    tracing::info!("authority circuit breaker closed: the authority answered")
                }
            }
        }
    }

    /// One line per outcome: INFO when applied, WARN (gated) otherwise.
    fn log(
        &self,
        object_id: &str,
        reasons: NeedReasons,
        outcome: &FetchOutcome,
        next: Option<SystemTime>,
    ) {
        let next = next.map(crate::format_rfc3339).unwrap_or_default();
        match outcome {
            FetchOutcome::Applied | FetchOutcome::Unchanged => tracing::info!(
                object_id,
                reasons = %reasons,
                outcome = outcome.as_str(),
                "authority snapshot applied"
            ),
            FetchOutcome::Absent => {
                let meaning = if reasons.contains(NeedReason::Paused) {
                    "the object stays paused"
                } else if reasons.contains(NeedReason::UnknownObject) {
                    "its events stay parked"
                } else {
                    "the object stays as it is"
                };
                tracing::info!(
                    object_id,
                    reasons = %reasons,
                    next,
                    "the authority has no such object: {meaning}; asked again at the time given"
                );
            }
            _ => {
                if let Some(suppressed) = self.failures.admit(std::time::Instant::now()) {
                    tracing::warn!(
                        object_id,
                        reasons = %reasons,
                        outcome = outcome.as_str(),
                        error = %outcome,
                        next,
                        suppressed,
                        "authority fetch changed nothing; tried again later (suppressed: such lines not written in the 10 s before this one)"
                    );
                }
            }
        }
    }

    /// The gauges from the queue, and its bytes in the receiver's count.
    fn gauges(&mut self) {
        let status = crate::locks::lock(&self.shared.state).queue.status();
        use std::sync::atomic::Ordering::Relaxed;
        if status.memory >= self.counted {
            self.bytes.fetch_add(status.memory - self.counted, Relaxed);
        } else {
            self.bytes.fetch_sub(self.counted - status.memory, Relaxed);
        }
        self.counted = status.memory;
        metrics::gauge!(IN_FLIGHT).set(status.in_flight as f64);
        metrics::gauge!(WAITING).set(status.waiting as f64);
        let oldest = status
            .oldest
            .and_then(|since| self.shared.clock.now().duration_since(since).ok())
            .unwrap_or_default();
        metrics::gauge!(OLDEST).set(oldest.as_secs_f64());
        metrics::gauge!(BREAKER).set(status.breaker.gauge());
    }
}

/// Fetches `object_id` from `source` within `timeout` and applies what it
/// answers: the outcome.
async fn fetch<A: AuthoritySource>(
    receiver: &Receiver,
    source: &A,
    object_id: &Arc<str>,
    timeout: Duration,
) -> FetchOutcome {
    let fetched = match tokio::time::timeout(timeout, source.fetch(object_id)).await {
        Ok(answer) => answer,
        Err(_) => Err(AuthorityError::timeout(format!(
            "no answer within {:.3} s",
            timeout.as_secs_f64()
        ))),
    };
    match fetched {
        Err(e) => FetchOutcome::Failed(e),
        Ok(None) => FetchOutcome::Absent,
        Ok(Some(snapshot)) if snapshot.object_id != *object_id => FetchOutcome::WrongObject {
            answered: snapshot.object_id,
        },
        Ok(Some(snapshot)) => match receiver.reconcile(snapshot).await {
            Ok(report) if report.replacement => FetchOutcome::Applied,
            Ok(_) => FetchOutcome::Unchanged,
            Err(ReconcileError::AuthorityOlder {
                offered, current, ..
            }) => FetchOutcome::Older { offered, current },
            Err(e) => FetchOutcome::NotApplied(crate::core::error_chain(&e)),
        },
    }
}
