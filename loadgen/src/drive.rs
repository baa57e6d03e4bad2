//! The drivers: producers sending a [`Stream`] to the receiver, to the
//! global-mutex baseline or to the bare engine, and what a run measured
//! ([`RunOutcome`]).

use crate::authority::{truth, AuthorityOptions};
use crate::code::{decision_code, Code, DecisionCounts, EVENT_VARIANT, NOT_SENT, VERSION_STATE};
use crate::converge::{AuthorityRun, Beside};
use crate::durable::{probe_dir, probe_fsync, StoreRun, FSYNC_PROBE_TIME};
use crate::generate::Stream;
use crate::probe::{cpu_since, process_cpu_time};
use hdrhistogram::Histogram;
use snapshot_receiver::core::engine::{ShardSet, Stepper};
use snapshot_receiver::core::{Context, Shard};
use snapshot_receiver::{core::Delivery, RejectReason};
use snapshot_receiver::{core::ReplacementCounts, ObjectState, Receipt};
use snapshot_receiver::{BuildError, Receiver};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How deliveries are paced.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LoadMode {
    /// Closed loop: each producer sends its next delivery as soon as the
    /// previous one is acknowledged (as fast as it goes); latency is measured
    /// from the send.
    Closed,
    /// Open loop: delivery `i` is due at `start + i / rate` (deliveries per
    /// second over all producers), whatever happened to earlier ones; its
    /// producer sends it at that time or as soon as it is free, and latency
    /// is measured from the intended send time, so time spent waiting behind
    /// a slow delivery counts (no coordinated omission).
    Open {
        /// Deliveries per second, over all producers.
        rate: f64,
    },
}

/// How to drive a stream.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Concurrent producer tasks; delivery `i` goes to producer `i % producers`.
    pub producers: usize,
    /// Closed or open loop.
    pub mode: LoadMode,
    /// Shard tasks of the receiver (ignored by the baselines).
    pub shards: usize,
    /// Record acknowledgement latency in a histogram (two clock reads per
    /// delivery; benches turn it off). Always on in open loop.
    pub record_latency: bool,
    /// Incremented as deliveries are acknowledged (in batches), for a
    /// progress bar.
    pub progress: Option<Arc<AtomicU64>>,
    /// A durable store for the receiver (`sqlite:PATH`, `postgres://...`);
    /// `None`: in memory. Ignored by the baselines.
    pub store: Option<String>,
    /// The receiver's memory budget, bytes
    /// ([`snapshot_receiver::ReceiverBuilder::memory_budget`]); `None`:
    /// the default, 512 MiB. Ignored by the baselines.
    pub memory_budget: Option<usize>,
    /// Most deliveries a producer hands over per call (at least 1). With 1,
    /// each delivery is one [`Receiver::deliver`] call (the mutex baseline
    /// locks once per delivery); above 1, [`Receiver::deliver_batch`] (the
    /// baseline parses the batch, then locks once for it). Closed loop: a
    /// producer always sends this many (its last call may have fewer); open
    /// loop: as many as have been released and not yet sent, up to this.
    pub batch: usize,
    /// When given, each delivery's answer time is written here (see
    /// [`AnswerTimes`]), for timing what follows an answer (a relay's
    /// effect reaching its destination). Off in the benches.
    pub answers: Option<Arc<AnswerTimes>>,
    /// Reconcile as a service would, from the generator's truth (see
    /// [`crate::StreamAuthority`]): the receiver runs its reconciler
    /// beside the producers and the run waits for every known object to
    /// converge after the last delivery; the baselines reconcile each
    /// conflict's object right after its step, with no latency. `None`:
    /// nothing reconciles, and paused objects stay paused.
    pub authority: Option<AuthorityOptions>,
}

/// When each delivery of a run was answered: one slot per delivery,
/// written by its producer as its call's receipts come back.
#[derive(Debug)]
pub struct AnswerTimes {
    /// What the slots count from.
    base: Instant,
    /// Nanoseconds after `base`, plus 1 (0: not answered).
    at: Vec<AtomicU64>,
}

impl AnswerTimes {
    /// Empty slots for `deliveries` deliveries.
    pub fn new(deliveries: usize) -> Self {
        Self {
            base: Instant::now(),
            at: (0..deliveries).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Delivery `i` was answered at `at`.
    fn set(&self, i: usize, at: Instant) {
        if let Some(slot) = self.at.get(i) {
            let ns = at.saturating_duration_since(self.base).as_nanos();
            slot.store(
                u64::try_from(ns).unwrap_or(u64::MAX - 1) + 1,
                Ordering::Relaxed,
            );
        }
    }

    /// When delivery `i` was answered; `None` before its answer (or for an
    /// index past the run's deliveries).
    pub fn get(&self, i: usize) -> Option<Instant> {
        match self.at.get(i)?.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(self.base + Duration::from_nanos(ns - 1)),
        }
    }
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            producers: 4,
            mode: LoadMode::Closed,
            shards: 16,
            record_latency: true,
            progress: None,
            store: None,
            memory_budget: None,
            batch: 1,
            answers: None,
            authority: None,
        }
    }
}

/// What a run produced: timing, latency, one code per delivery and the final
/// state to check.
pub struct RunOutcome {
    /// Wall time of the delivery phase (generation and setup excluded).
    pub elapsed: Duration,
    /// CPU time the whole process used during the delivery phase (user +
    /// system, all threads; 10 ms resolution), `None` without `/proc`. On a
    /// shared machine it moves less than wall time.
    pub cpu: Option<Duration>,
    /// Acknowledgement latency in nanoseconds (empty when not recorded); in
    /// open loop measured from the intended send time.
    pub latency: Histogram<u64>,
    /// Acknowledgement latency from the actual send, in nanoseconds: the same
    /// as `latency` in closed loop; in open loop the difference is
    /// `send_lateness`.
    pub service_latency: Histogram<u64>,
    /// Open loop: how long after its intended send time each delivery was
    /// sent, in nanoseconds (empty in closed loop): its producer was busy
    /// with an earlier call, or woke late. Values far above the service
    /// latency mean the load generator itself was descheduled.
    pub send_lateness: Histogram<u64>,
    /// One code per delivery, in stream order.
    pub codes: Vec<Code>,
    /// How many producers sent the stream (at least 1): delivery `i` was
    /// sent by producer `i % producers`, and each producer sends its own
    /// deliveries in stream order, the next call only after the previous
    /// call's receipts came back (within one call, deliveries naming one
    /// object are decided in the order given). So for one producer and one
    /// object, the decisions happened in stream order; this is what the
    /// check's pause and version checks rely on. 1 for the engine, which
    /// decides the whole stream in order (the check then compares every
    /// receipt with its exact sequential model).
    pub producers: usize,
    /// Every known object at the end, in any order.
    pub objects: Vec<ObjectState>,
    /// Replacement counters at the end.
    pub counters: ReplacementCounts,
    /// With a durable store: its group-commit figures and the fsync probe.
    pub store: Option<StoreRun>,
    /// When the run reconciled ([`RunOptions::authority`]): what that did.
    /// The check then expects every known object to end at the generator's
    /// truth, un-paused, holding nothing.
    pub authority: Option<AuthorityRun>,
}

impl RunOutcome {
    /// Deliveries per second over the delivery phase.
    pub fn throughput(&self) -> f64 {
        self.codes.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Decision counts.
    pub fn counts(&self) -> DecisionCounts {
        DecisionCounts::of(&self.codes)
    }

    /// The outcome of a run driven elsewhere, for [`crate::check`]: one code
    /// per delivery in stream order, how many producers (1: every object's
    /// deliveries were decided in stream order, so the check compares with
    /// its sequential model), the objects and counters at the end. No
    /// timings (zero, empty histograms) and no store figures. The cluster
    /// simulation (`sim/`) reports its runs so.
    pub fn decided(
        codes: Vec<Code>,
        producers: usize,
        objects: Vec<ObjectState>,
        counters: ReplacementCounts,
    ) -> Self {
        // Nothing is recorded in them: the smallest histograms will do.
        let empty = || Histogram::new(1).expect("valid histogram precision");
        RunOutcome {
            elapsed: Duration::ZERO,
            cpu: None,
            latency: empty(),
            service_latency: empty(),
            send_lateness: empty(),
            codes,
            producers: producers.max(1),
            objects,
            counters,
            store: None,
            authority: None,
        }
    }
}

fn new_histogram() -> Histogram<u64> {
    // 1 ns .. 1 h, 3 significant figures.
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid histogram bounds")
}

/// Something producers can deliver bodies to.
trait Sink: Send + Sync + 'static {
    fn deliver(&self, body: &[u8]) -> impl Future<Output = Code> + Send;
    fn deliver_batch(&self, bodies: &[&[u8]]) -> impl Future<Output = Vec<Code>> + Send;
}

impl Sink for Receiver {
    async fn deliver(&self, body: &[u8]) -> Code {
        decision_code(&Receiver::deliver(self, body).await)
    }

    async fn deliver_batch(&self, bodies: &[&[u8]]) -> Vec<Code> {
        Receiver::deliver_batch(self, bodies)
            .await
            .iter()
            .map(decision_code)
            .collect()
    }
}

/// The naive baseline: one global mutex around a single [`Shard`] (so one
/// `HashMap` of objects), the same engine, registry and driver (a
/// one-shard [`ShardSet`]). Producers parse and fingerprint outside the
/// lock, then decide under it: one lock per delivery, or one per batch when
/// producers send batches.
struct GlobalMutex {
    /// Every object, behind the driver's one lock (the critical section is
    /// short and has no `.await` in it), and the registry, clock and
    /// configuration every producer shares.
    set: ShardSet<()>,
    /// With [`RunOptions::authority`]: the stream whose truth each
    /// conflict's object is reconciled from, right after its call.
    authority: Option<Arc<Stream>>,
    /// Reconciliations made (an atomic: producers reconcile at once).
    reconciled: AtomicU64,
}

/// Decides one parsed body on the only shard of a baseline: the driver's
/// step, whose pause (for the same shard: it holds every object) runs
/// before the next step. Returns its code and, for a conflict (which
/// paused its object), the object.
fn decide_on<C: std::borrow::Borrow<Context>>(
    shard: &mut Stepper<'_, (), C>,
    parsed: Result<Delivery, RejectReason>,
) -> (Code, Option<Arc<str>>) {
    let receipt = match parsed {
        Ok(delivery) => shard.deliver(delivery).receipt,
        Err(why) => Receipt::rejected(why),
    };
    let code = decision_code(&receipt);
    let paused = if code == EVENT_VARIANT || code == VERSION_STATE {
        receipt.object_id
    } else {
        None
    };
    (code, paused)
}

/// Reconciles `object_id` on the only shard of a baseline from the truth
/// of `stream`, as an authority answering at once would: whether it was
/// applied (an authority older than the object is refused, and the check
/// then finds the object still paused).
fn reconcile_inline<O: snapshot_receiver::core::engine::Outlet, C: std::borrow::Borrow<Context>>(
    set: &ShardSet<O, C>,
    stream: &Stream,
    object_id: &str,
) -> bool {
    let as_of = set.ctx().clock().now();
    truth(stream, object_id, as_of).is_some_and(|snapshot| set.reconcile(0, &snapshot).is_ok())
}

impl GlobalMutex {
    /// Reconciles the objects that `decided` paused, after their call.
    fn reconcile(&self, paused: impl IntoIterator<Item = Arc<str>>) {
        let Some(stream) = &self.authority else {
            return;
        };
        for id in paused {
            if reconcile_inline(&self.set, stream, &id) {
                self.reconciled.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl Sink for GlobalMutex {
    async fn deliver(&self, body: &[u8]) -> Code {
        let parsed = self.set.ctx().parser().parse(body);
        let (code, paused) = decide_on(&mut self.set.stepper(0), parsed);
        self.reconcile(paused);
        code
    }

    async fn deliver_batch(&self, bodies: &[&[u8]]) -> Vec<Code> {
        let parsed: Vec<_> = bodies
            .iter()
            .map(|b| self.set.ctx().parser().parse(b))
            .collect();
        let mut shard = self.set.stepper(0);
        let mut paused = Vec::new();
        let codes = parsed
            .into_iter()
            .map(|p| {
                let (code, object) = decide_on(&mut shard, p);
                paused.extend(object);
                code
            })
            .collect();
        drop(shard);
        self.reconcile(paused);
        codes
    }
}

/// What [`drive`] measured.
struct Driven {
    /// Wall time of the delivery phase.
    elapsed: Duration,
    /// Process CPU time during it.
    cpu: Option<Duration>,
    /// Latency from the intended send time (closed loop: from the send).
    latency: Histogram<u64>,
    /// Latency from the actual send.
    service: Histogram<u64>,
    /// Open loop: how long after its intended send time each delivery was
    /// handed to the receiver.
    send_lateness: Histogram<u64>,
    /// One code per delivery, in stream order.
    codes: Vec<Code>,
    /// How many producers sent it.
    producers: usize,
}

impl Driven {
    /// The run's outcome: these measurements and the end state.
    fn outcome(
        self,
        objects: Vec<ObjectState>,
        counters: ReplacementCounts,
        store: Option<StoreRun>,
        authority: Option<AuthorityRun>,
    ) -> RunOutcome {
        RunOutcome {
            elapsed: self.elapsed,
            cpu: self.cpu,
            latency: self.latency,
            service_latency: self.service,
            send_lateness: self.send_lateness,
            codes: self.codes,
            producers: self.producers,
            objects,
            counters,
            store,
            authority,
        }
    }
}

/// One producer's measurements.
struct Produced {
    latency: Histogram<u64>,
    service: Histogram<u64>,
    send_lateness: Histogram<u64>,
    /// Its deliveries' codes, in its own (stream) order.
    codes: Vec<Code>,
}

impl Produced {
    fn new(capacity: usize) -> Self {
        Self {
            latency: new_histogram(),
            service: new_histogram(),
            send_lateness: new_histogram(),
            codes: Vec::with_capacity(capacity),
        }
    }

    /// Records one call: its deliveries (stream index, intended send time in
    /// open loop), when it was sent and when its receipts came back.
    fn record(
        &mut self,
        call: &[(usize, Option<Instant>)],
        sent: Option<Instant>,
        done: Instant,
        progress: &Option<Arc<AtomicU64>>,
        unreported: &mut u64,
    ) {
        if let Some(sent) = sent {
            let ns = |from: Instant, to: Instant| {
                to.saturating_duration_since(from)
                    .as_nanos()
                    .clamp(1, u64::MAX as u128) as u64
            };
            for &(_, due) in call {
                self.service.saturating_record(ns(sent, done));
                self.latency
                    .saturating_record(ns(due.unwrap_or(sent), done));
                if let Some(due) = due {
                    self.send_lateness.saturating_record(ns(due, sent));
                }
            }
        }
        *unreported += call.len() as u64;
        if *unreported >= 1024 {
            if let Some(p) = progress {
                p.fetch_add(*unreported, Ordering::Relaxed);
            }
            *unreported = 0;
        }
    }
}

/// Delivers one call's bodies: one `deliver` for a single delivery, one
/// `deliver_batch` otherwise.
async fn send<S: Sink>(sink: &S, stream: &Stream, call: &[(usize, Option<Instant>)]) -> Vec<Code> {
    if let [(i, _)] = call[..] {
        vec![sink.deliver(stream.body(i)).await]
    } else {
        let bodies: Vec<&[u8]> = call.iter().map(|&(i, _)| stream.body(i)).collect();
        sink.deliver_batch(&bodies).await
    }
}

/// Drives `stream` through `sink` with `opts.producers` producer tasks on
/// the current runtime. Delivery `i` belongs to producer `i % producers`,
/// which sends its deliveries in stream order, `opts.batch` at most per call.
///
/// Closed loop: each producer sends its next call when the previous one is
/// acknowledged. Open loop: delivery `i` is due at `start + i / rate`; a
/// producer sends every delivery of its own that is due (up to the batch
/// size), waits for the receipts, and when nothing of its own is due yields
/// to the runtime and looks again. It does not sleep: a timer-based wait
/// (tokio's timer has millisecond granularity, a thread's sleep costs a
/// wake-up that this VM makes expensive) would add its own lateness, while
/// yielding lets the shard tasks run whenever they have work and keeps the
/// workers from parking. The price is that the workers stay busy for the
/// whole run, so the CPU time per delivery of an open-loop run counts the
/// idle polling too. Latency counts from the intended send time, so time a
/// delivery spent due but not yet sent (its producer busy with an earlier
/// call, or not scheduled) counts as well: no coordinated omission.
async fn drive<S: Sink>(sink: Arc<S>, stream: Arc<Stream>, opts: &RunOptions) -> Driven {
    let producers = opts.producers.max(1);
    let total = stream.len();
    let batch = opts.batch.max(1);
    let per_producer = total / producers + 1;
    let mode = opts.mode;
    let record = opts.record_latency || matches!(mode, LoadMode::Open { .. });
    let cpu0 = process_cpu_time();
    let start = Instant::now();
    let mut handles = Vec::with_capacity(producers);
    for p in 0..producers {
        let (sink, stream, progress) = (sink.clone(), stream.clone(), opts.progress.clone());
        let answers = opts.answers.clone();
        handles.push(tokio::spawn(async move {
            let mut out = Produced::new(per_producer);
            let mut unreported = 0u64;
            let mut mine = (p..total).step_by(producers).peekable();
            let mut call: Vec<(usize, Option<Instant>)> = Vec::with_capacity(batch);
            while mine.peek().is_some() {
                call.clear();
                let sent = match mode {
                    LoadMode::Closed => {
                        call.extend(mine.by_ref().take(batch).map(|i| (i, None)));
                        record.then(Instant::now)
                    }
                    LoadMode::Open { rate } => {
                        let due = |i: usize| start + Duration::from_secs_f64(i as f64 / rate);
                        let now = Instant::now();
                        while call.len() < batch {
                            match mine.peek() {
                                Some(&i) if due(i) <= now => {
                                    call.push((i, Some(due(i))));
                                    mine.next();
                                }
                                _ => break,
                            }
                        }
                        if call.is_empty() {
                            tokio::task::yield_now().await;
                            continue;
                        }
                        Some(now)
                    }
                };
                out.codes.extend(send(&*sink, &stream, &call).await);
                let done = Instant::now();
                if let Some(answers) = &answers {
                    for &(i, _) in &call {
                        answers.set(i, done);
                    }
                }
                out.record(&call, sent, done, &progress, &mut unreported);
            }
            if let Some(p) = &progress {
                p.fetch_add(unreported, Ordering::Relaxed);
            }
            out
        }));
    }
    let mut results: Vec<Produced> = Vec::with_capacity(producers);
    for h in handles {
        results.push(h.await.expect("producer task panicked"));
    }
    let elapsed = start.elapsed();
    let cpu = cpu_since(cpu0);
    let mut latency = new_histogram();
    let mut service = new_histogram();
    let mut send_lateness = new_histogram();
    let mut codes = vec![NOT_SENT; total];
    for (p, produced) in results.into_iter().enumerate() {
        let _ = latency.add(&produced.latency);
        let _ = service.add(&produced.service);
        let _ = send_lateness.add(&produced.send_lateness);
        for (k, code) in produced.codes.into_iter().enumerate() {
            codes[p + k * producers] = code;
        }
    }
    Driven {
        elapsed,
        cpu,
        latency,
        service,
        send_lateness,
        codes,
        producers,
    }
}

/// Whether the durable store at `location` holds receipts (read from
/// outside the receiver: a durable receiver reads receipts on demand and
/// holds none in memory after start-up).
///
/// # Errors
/// [`BuildError::Store`] when the store cannot be read.
async fn holds_receipts(location: Option<&str>) -> Result<bool, BuildError> {
    let Some(location) = location.filter(|l| *l != "memory").map(str::to_owned) else {
        return Ok(false);
    };
    let summary = tokio::task::spawn_blocking(move || {
        snapshot_receiver::store::StoreReader::open(&location, None)?.summary()
    })
    .await
    .map_err(|e| {
        BuildError::Store(snapshot_receiver::store::StoreError::Failed(format!(
            "reading the store's receipts: {e}"
        )))
    })?
    .map_err(BuildError::Store)?;
    Ok(summary.identities > 0)
}

/// Runs `stream` through a fresh [`Receiver`] (router, shard tasks, shared
/// registry) on the current tokio runtime, then reads the final state and
/// shuts it down. Setup and shutdown are not part of `elapsed`.
///
/// # Errors
/// [`BuildError`] when the receiver cannot start (for example outside a
/// runtime), and [`BuildError::InvalidConfig`] when `opts.store` already
/// holds receipts (the check expects a first run).
pub async fn run_receiver(
    stream: &Arc<Stream>,
    opts: &RunOptions,
) -> Result<RunOutcome, BuildError> {
    let (outcome, ()) = run_receiver_beside(stream, opts, |_, _| async {}).await?;
    Ok(outcome)
}

/// Runs `stream` as [`run_receiver`] does, with `beside` running on the
/// same receiver next to the producers (a relay reading its outbox, for
/// example): `beside` is called before the first delivery is sent, its
/// future runs as its own task, and the `oneshot` it was given receives the
/// delivery phase's wall time once the last delivery was answered. Its
/// result is awaited before the final state is read, so the receiver stays
/// up while it finishes; `elapsed` covers the delivery phase only.
///
/// # Errors
/// As [`run_receiver`]; and [`BuildError::InvalidConfig`] when `beside`'s
/// task panicked.
pub async fn run_receiver_beside<T, F, Fut>(
    stream: &Arc<Stream>,
    opts: &RunOptions,
    beside: F,
) -> Result<(RunOutcome, T), BuildError>
where
    F: FnOnce(Arc<Receiver>, tokio::sync::oneshot::Receiver<Duration>) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    // The disk's fsync rate moves from hour to hour: measure it now, on the
    // store's filesystem, before the store is opened.
    let fsync_probe = opts
        .store
        .as_deref()
        .map(|location| probe_fsync(&probe_dir(location), FSYNC_PROBE_TIME));
    let receiver =
        Arc::new(stream.receiver(opts.shards, opts.store.as_deref(), opts.memory_budget)?);
    if holds_receipts(opts.store.as_deref()).await? {
        // The check expects a first run: a store holding another run's
        // receipts would turn its first decisions into duplicates.
        receiver.shutdown().await;
        return Err(BuildError::InvalidConfig(
            "the store already holds receipts: loadtest needs an empty store (a new file or schema)",
        ));
    }
    let reconciling = match &opts.authority {
        None => None,
        Some(authority) => {
            let track = matches!(opts.mode, LoadMode::Open { .. });
            match Beside::start(&receiver, stream, authority, track) {
                Ok(beside) => Some(beside),
                Err(why) => {
                    tracing::error!(%why, "the load test's reconciler did not start");
                    receiver.shutdown().await;
                    return Err(BuildError::InvalidConfig(
                        "the load test's reconciler options are out of range",
                    ));
                }
            }
        }
    };
    let before = receiver.store_stats();
    let written_before = crate::probe::written_bytes();
    let (ingested, ingest_done) = tokio::sync::oneshot::channel();
    let beside = tokio::spawn(beside(receiver.clone(), ingest_done));
    let d = drive(receiver.clone(), stream.clone(), opts).await;
    let answered = Instant::now();
    // Every known object converged (or the drain's deadline passed) before
    // the task beside hears that the load is over: the effects of the
    // authorities are in the outbox by then.
    let authority = match reconciling {
        Some(reconciling) => Some(reconciling.finish(&receiver, answered).await),
        None => None,
    };
    let _ = ingested.send(d.elapsed);
    let beside = beside
        .await
        .map_err(|_| BuildError::InvalidConfig("the task running beside the producers panicked"))?;
    let peak_rss_before_check = crate::probe::peak_rss_bytes();
    let memory = receiver.memory().await;
    let budget = receiver.memory_bytes().await.budget;
    let stats = receiver.store_stats();
    let objects = receiver.objects().await;
    let counters = receiver.counters().await;
    receiver.shutdown().await;
    // After the shards stopped: every commit of the run is written.
    let written = crate::probe::written_bytes()
        .zip(written_before)
        .map(|(after, before)| after.saturating_sub(before));
    let store = match (stats, before, fsync_probe) {
        (Some(after), Some(before), Some(fsync_probe)) => Some(StoreRun {
            stats: after.since(&before),
            fsync_probe,
            peak_rss_before_check,
            memory,
            budget,
            written,
            kept: opts.store.as_deref().and_then(crate::durable::kept_bytes),
        }),
        _ => None,
    };
    Ok((d.outcome(objects, counters, store, authority), beside))
}

/// Runs `stream` through the naive baseline: one global mutex around one
/// [`Shard`], the same engine, producers parsing outside the lock.
/// With [`RunOptions::authority`], each conflict's object is reconciled
/// from the generator's truth right after its call (no latency, no
/// reconciler task).
pub async fn run_global_mutex(stream: &Arc<Stream>, opts: &RunOptions) -> RunOutcome {
    let (ctx, shard) = stream.engine();
    let sink = Arc::new(GlobalMutex {
        set: ShardSet::new(ctx, vec![shard], ()),
        authority: opts.authority.as_ref().map(|_| stream.clone()),
        reconciled: AtomicU64::new(0),
    });
    let d = drive(sink.clone(), stream.clone(), opts).await;
    let (objects, counters) = sink.set.read(0, |s| (s.objects(), s.counters()));
    let authority = sink
        .authority
        .as_ref()
        .map(|_| AuthorityRun::inline(sink.reconciled.load(Ordering::Relaxed)));
    d.outcome(objects, counters, None, authority)
}

/// Runs `stream` on the calling thread through the bare engine (parse,
/// fingerprint, [`Shard::deliver`]): the per-core limit. No latency is
/// recorded, and nothing reconciles (see [`run_engine_reconciling`]).
pub fn run_engine(stream: &Stream) -> RunOutcome {
    let (ctx, shard) = stream.engine();
    run_engine_on(stream, &ctx, shard)
}

/// [`run_engine`], each conflict's object reconciled from the generator's
/// truth right after its step (an authority answering at once): the
/// engine's side of a run with [`RunOptions::authority`]. The order of
/// every step is known, so the check compares every receipt with its
/// sequential model, which reconciles at the same points.
pub fn run_engine_reconciling(stream: &Stream) -> RunOutcome {
    let (ctx, shard) = stream.engine();
    engine_run(stream, &ctx, shard, true)
}

/// [`run_engine`] with a given context (for example one whose registry
/// already remembers many identities) and shard (see [`Stream::shard`]).
pub fn run_engine_on(stream: &Stream, ctx: &Context, shard: Shard) -> RunOutcome {
    engine_run(stream, ctx, shard, false)
}

/// The engine's run, reconciling in line or not.
fn engine_run(stream: &Stream, ctx: &Context, shard: Shard, reconcile: bool) -> RunOutcome {
    let set = ShardSet::new(ctx, vec![shard], ());
    let mut codes = Vec::with_capacity(stream.len());
    let mut reconciled = 0u64;
    let cpu0 = process_cpu_time();
    let start = Instant::now();
    let mut stepper = set.stepper(0);
    for i in 0..stream.len() {
        let (code, paused) = decide_on(&mut stepper, ctx.parser().parse(stream.body(i)));
        codes.push(code);
        if let Some(id) = paused.filter(|_| reconcile) {
            drop(stepper);
            reconciled += u64::from(reconcile_inline(&set, stream, &id));
            stepper = set.stepper(0);
        }
    }
    drop(stepper);
    let elapsed = start.elapsed();
    let (objects, counters) = set.read(0, |s| (s.objects(), s.counters()));
    RunOutcome {
        elapsed,
        cpu: cpu_since(cpu0),
        latency: new_histogram(),
        service_latency: new_histogram(),
        send_lateness: new_histogram(),
        codes,
        producers: 1,
        objects,
        counters,
        store: None,
        authority: reconcile.then(|| AuthorityRun::inline(reconciled)),
    }
}
