//! Consuming the partitioned stream into a [`Receiver`].

use super::lease::{key_token, Leases};
use super::{JetStreamError, StreamLayout};
use crate::partition;
use crate::Receiver;
use crate::{Ack, Decision};
use crate::{Outcome, RetryReason};
use async_nats::jetstream::{self, consumer::pull, message::AckKind};
use futures_util::{FutureExt, StreamExt};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio_util::sync::CancellationToken;

/// Default [`ConsumeOptions::max_in_flight`]: messages of one partition
/// in flight at most. With 48 partitions that is up to 12,288 deliveries
/// being decided or committed at once, far more than one group commit holds.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 256;

/// Default [`ConsumeOptions::batch`]: most messages of one partition in one
/// [`Receiver::deliver_batch`] call.
pub const DEFAULT_BATCH: usize = 256;

/// How a process consumes the stream.
#[derive(Clone, Debug)]
pub struct ConsumeOptions {
    /// The stream (made by [`super::Publisher`] or `snapshot-receiver publish`).
    pub stream: String,
    /// The partition count this process expects; `None` takes the stream's.
    pub partitions: Option<u32>,
    /// This process's member name for the leases; unique among the live
    /// processes of one stream. Default: `<host>-<pid>`.
    pub member: Option<String>,
    /// How long a lease or heartbeat lives without renewal (renewed every
    /// quarter of it). A killed process's partitions move after about this
    /// long. Only the process that creates the lease bucket sets it.
    pub lease_ttl: Duration,
    /// The consumers' ack wait: how long JetStream waits for the
    /// acknowledgement of a message before redelivering it. Work in progress
    /// is signalled every third of it, so this bounds how long a partition
    /// stalls after its consumer was killed mid-message.
    pub ack_wait: Duration,
    /// The delay asked for in the negative acknowledgement of a `retry`.
    pub retry_delay: Duration,
    /// Messages of one partition in flight at most: the `max_ack_pending` of
    /// its durable consumer (JetStream hands out no more until some are
    /// acknowledged) and what one pull request asks for. Default
    /// [`DEFAULT_MAX_IN_FLIGHT`]; at least 1. Set when the consumer is
    /// created or updated, so the last process to start decides.
    pub max_in_flight: usize,
    /// Most messages handed to the receiver in one
    /// [`Receiver::deliver_batch`] call: whatever of the partition's pull has
    /// arrived, up to this many. Default [`DEFAULT_BATCH`]; at least 1.
    pub batch: usize,
    /// How long one pull request waits on the server (at least the retry
    /// delay plus half a second). A released partition changes hands once
    /// its last pull request has ended.
    pub pull_expires: Duration,
    /// Stop when no message arrived for this long (`None`: run until cancelled).
    pub idle_exit: Option<Duration>,
}

impl Default for ConsumeOptions {
    fn default() -> Self {
        Self {
            stream: String::new(),
            partitions: None,
            member: None,
            lease_ttl: Duration::from_secs(5),
            ack_wait: Duration::from_secs(10),
            retry_delay: Duration::from_secs(1),
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            batch: DEFAULT_BATCH,
            pull_expires: Duration::from_secs(1),
            idle_exit: None,
        }
    }
}

/// Something a consuming process did, reported as it happens.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum ConsumeEvent {
    /// The process joined the stream's members.
    Joined {
        /// This process's member name.
        member: String,
        /// The stream's partition count.
        partitions: u32,
    },
    /// It took the lease of a partition and consumes it.
    Took {
        /// The partition.
        partition: u32,
    },
    /// It stopped consuming a partition and gave the lease back.
    Released {
        /// The partition.
        partition: u32,
    },
    /// Its lease on a partition could not be renewed; it stopped pulling.
    Lost {
        /// The partition.
        partition: u32,
    },
    /// A message was acknowledged (after its decision was committed) and
    /// the server confirmed the acknowledgement.
    Acknowledged {
        /// The partition.
        partition: u32,
        /// The message's stream sequence.
        stream_sequence: u64,
        /// How many times JetStream has delivered it (1: first delivery).
        delivered: i64,
        /// The body's event identity, when it had one.
        event_id: Option<Arc<str>>,
        /// The recorded decision.
        decision: Decision,
    },
    /// A message was negatively acknowledged: nothing was recorded.
    Retry {
        /// The partition.
        partition: u32,
        /// The message's stream sequence.
        stream_sequence: u64,
        /// Why.
        reason: String,
    },
    /// A message was terminated: over a limit, never recorded.
    Terminated {
        /// The partition.
        partition: u32,
        /// The message's stream sequence.
        stream_sequence: u64,
        /// Why.
        reason: String,
    },
}

/// Counts of one [`consume`] run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConsumeReport {
    /// This process's member name.
    pub member: String,
    /// Messages acknowledged, each after its decision was committed.
    pub acknowledged: u64,
    /// Messages negatively acknowledged (`retry`).
    pub retried: u64,
    /// Messages terminated (`reject`).
    pub terminated: u64,
    /// Messages that arrived while an older message of their partition was
    /// still owed, and waited for it before being decided (see the module
    /// documentation).
    pub waited: u64,
    /// Acknowledgements the server did not confirm (the message will come
    /// again and be a duplicate).
    pub ack_failures: u64,
    /// Partition leases taken over the run (a partition taken, released and
    /// taken again counts twice).
    pub partitions_taken: u64,
    /// When the first message arrived.
    pub first_message: Option<SystemTime>,
    /// When the last acknowledgement was confirmed.
    pub last_ack: Option<SystemTime>,
}

impl ConsumeReport {
    /// Acknowledged messages per second between the first message and the
    /// last acknowledgement.
    pub fn rate(&self) -> Option<f64> {
        let span = self.last_ack?.duration_since(self.first_message?).ok()?;
        (span.as_secs_f64() > 0.0).then(|| self.acknowledged as f64 / span.as_secs_f64())
    }
}

/// Reports events as they happen (printing, counting in tests).
pub type EventSink = Arc<dyn Fn(&ConsumeEvent) + Send + Sync>;

/// State shared by the lease loop and the partition workers.
struct Shared {
    /// Where events go.
    sink: EventSink,
    /// Messages acknowledged after their commit (atomics: every worker
    /// task counts, no lock needed).
    acknowledged: AtomicU64,
    /// Messages negatively acknowledged (`retry`).
    retried: AtomicU64,
    /// Messages terminated (`reject`).
    terminated: AtomicU64,
    /// Messages that waited for an older one of their partition.
    waited: AtomicU64,
    /// Acknowledgements the server did not confirm.
    ack_failures: AtomicU64,
    /// Times for the report and the idle check. A std mutex: held briefly.
    times: Mutex<Times>,
}

/// When things happened, for the report and the idle check.
#[derive(Default)]
struct Times {
    /// Wall-clock time of the first message (rates compare across processes).
    first_message: Option<SystemTime>,
    /// Wall-clock time of the last confirmed acknowledgement.
    last_ack: Option<SystemTime>,
    /// Monotonic time of the last message or acknowledgement (idle exit).
    last_activity: Option<Instant>,
}

impl Shared {
    fn times(&self) -> std::sync::MutexGuard<'_, Times> {
        crate::locks::lock(&self.times)
    }
}

/// One partition being consumed.
struct Worker {
    /// Asks the worker to stop after its pull in flight.
    stop: CancellationToken,
    /// Until when its lease surely holds.
    fence: Arc<Fence>,
    /// The task; finished once its last pull request ended.
    task: tokio::task::JoinHandle<()>,
    /// The lease was lost: do not release it (it may be someone else's).
    lost: bool,
}

/// Consumes `options.stream` into `receiver` until `shutdown` is cancelled
/// (or the idle time passes), taking and releasing partitions through the
/// leases described in [`super`]. On the way out every worker finishes its
/// pull in flight, the leases are released and the member leaves, so the
/// other processes take over at once. The receiver is not shut down.
///
/// A stream that does not exist yet is waited for.
///
/// # Errors
/// [`JetStreamError`] when the stream has another layout, or its consumers
/// or the lease bucket cannot be set up. Failures while running are logged
/// and retried.
pub async fn consume(
    receiver: &Receiver,
    client: async_nats::Client,
    options: ConsumeOptions,
    shutdown: CancellationToken,
    sink: EventSink,
) -> Result<ConsumeReport, JetStreamError> {
    let js = jetstream::new(client);
    // A consumer may start before the first publisher: wait for the stream.
    let mut waited = false;
    let layout = loop {
        match StreamLayout::open(&js, &options.stream, options.partitions, None, false).await {
            Err(JetStreamError::NoStream(name)) => {
                if !waited {
                    tracing::warn!(stream = %name, "waiting for the stream to be created");
                    waited = true;
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                    _ = shutdown.cancelled() => return Ok(ConsumeReport::default()),
                }
            }
            other => break other?,
        }
    };
    let stream = js
        .get_stream(&layout.stream)
        .await
        .map_err(|e| JetStreamError::request(format!("stream {}", layout.stream), e))?;
    let mut consumers = Vec::with_capacity(layout.partitions as usize);
    for p in 0..layout.partitions {
        consumers.push(ensure_consumer(&stream, &layout, p, &options).await?);
    }
    let member = options.member.clone().unwrap_or_else(default_member);
    let mut leases = Leases::join(&js, &layout.stream, &member, options.lease_ttl).await?;
    let shared = Arc::new(Shared {
        sink,
        acknowledged: AtomicU64::new(0),
        retried: AtomicU64::new(0),
        terminated: AtomicU64::new(0),
        waited: AtomicU64::new(0),
        ack_failures: AtomicU64::new(0),
        times: Mutex::new(Times {
            last_activity: Some(Instant::now()),
            ..Times::default()
        }),
    });
    (shared.sink)(&ConsumeEvent::Joined {
        member: key_token(&member),
        partitions: layout.partitions,
    });
    let mut workers: HashMap<u32, Worker> = HashMap::new();
    let mut taken = 0;
    let mut tick = tokio::time::interval((leases.ttl() / 4).max(Duration::from_millis(50)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stopping = false;
    let mut first_tick_done = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled(), if !stopping => {}
        }
        if shutdown.is_cancelled() && !stopping {
            tracing::info!("stopping: finishing the pulls in flight");
            stopping = true;
        }
        if let (Some(idle), false) = (options.idle_exit, stopping) {
            let last = shared.times().last_activity;
            if last.is_some_and(|at| at.elapsed() >= idle) {
                tracing::info!(?idle, "no message for the idle time: stopping");
                stopping = true;
            }
        }
        if !stopping {
            if let Err(e) = leases.heartbeat().await {
                tracing::warn!(error = %e, "heartbeat failed");
            }
        }
        let members = leases.members();
        // Finished workers: give their partitions back.
        let finished: Vec<u32> = workers
            .iter()
            .filter(|(_, w)| w.task.is_finished())
            .map(|(p, _)| *p)
            .collect();
        for p in finished {
            let w = workers.remove(&p).expect("present");
            let _ = w.task.await;
            if !w.lost {
                leases.release(p).await;
                (shared.sink)(&ConsumeEvent::Released { partition: p });
            }
        }
        // Running workers: renew, and stop those no longer meant for us.
        let running: Vec<u32> = workers
            .iter()
            .filter(|(_, w)| !w.lost)
            .map(|(p, _)| *p)
            .collect();
        let sent = Instant::now();
        let lost = leases.renew(&running).await;
        for p in &running {
            if !lost.contains(p) {
                workers[p].fence.extend(sent, leases.ttl());
            }
        }
        for p in lost {
            let w = workers.get_mut(&p).expect("present");
            w.lost = true;
            w.stop.cancel();
            (shared.sink)(&ConsumeEvent::Lost { partition: p });
        }
        for (p, w) in &workers {
            if stopping || !leases.meant_for_me(*p, &members) {
                w.stop.cancel();
            }
        }
        // Free partitions meant for us: take them (not on the first tick, so
        // that processes starting together hear of each other first rather
        // than each taking partitions it must hand over a moment later).
        let wanted: Vec<u32> = (0..layout.partitions)
            .filter(|p| {
                first_tick_done
                    && !stopping
                    && !workers.contains_key(p)
                    && leases.meant_for_me(*p, &members)
            })
            .collect();
        first_tick_done = true;
        let sent = Instant::now();
        for p in leases.acquire(&wanted).await {
            taken += 1;
            (shared.sink)(&ConsumeEvent::Took { partition: p });
            let stop = CancellationToken::new();
            let fence = Arc::new(Fence::new(sent));
            fence.extend(sent, leases.ttl());
            let task = tokio::spawn(run_partition(
                p,
                consumers[p as usize].clone(),
                receiver.clone(),
                options.clone(),
                Ownership {
                    stop: stop.clone(),
                    fence: fence.clone(),
                },
                shared.clone(),
            ));
            workers.insert(
                p,
                Worker {
                    stop,
                    fence,
                    task,
                    lost: false,
                },
            );
        }
        if stopping && workers.is_empty() {
            break;
        }
    }
    leases.leave().await;
    let times = shared.times();
    Ok(ConsumeReport {
        member: key_token(&member),
        acknowledged: shared.acknowledged.load(Ordering::Relaxed),
        retried: shared.retried.load(Ordering::Relaxed),
        terminated: shared.terminated.load(Ordering::Relaxed),
        waited: shared.waited.load(Ordering::Relaxed),
        ack_failures: shared.ack_failures.load(Ordering::Relaxed),
        partitions_taken: taken,
        first_message: times.first_message,
        last_ack: times.last_ack,
    })
}

fn default_member() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "host".to_owned());
    format!("{host}-{}", std::process::id())
}

/// Creates the durable pull consumer of partition `p`, or brings an
/// existing one to the requested ack wait.
async fn ensure_consumer(
    stream: &jetstream::stream::Stream,
    layout: &StreamLayout,
    p: u32,
    options: &ConsumeOptions,
) -> Result<jetstream::consumer::PullConsumer, JetStreamError> {
    let name = layout.consumer(p);
    let config = pull::Config {
        durable_name: Some(name.clone()),
        description: Some(format!(
            "snapshot-receiver partition {p}: up to {} messages in flight, explicit acks",
            options.max_in_flight.max(1)
        )),
        filter_subject: layout.subject(p),
        deliver_policy: jetstream::consumer::DeliverPolicy::All,
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        ack_wait: options.ack_wait,
        max_deliver: -1,
        max_ack_pending: options.max_in_flight.max(1) as i64,
        ..Default::default()
    };
    let what = || format!("consumer {name} of {}", layout.stream);
    // Create, or update the ack wait of an existing one (the other fields
    // cannot change, and the server says so).
    stream
        .create_consumer(config)
        .await
        .map_err(|e| JetStreamError::request(what(), e))
}

/// Until when a partition's lease surely holds, on this process's monotonic
/// clock ([`partition::Fence`]).
type Fence = partition::Fence<Instant>;

/// A worker's hold on its partition.
struct Ownership {
    /// Asks it to stop after its pull in flight.
    stop: CancellationToken,
    /// Until when its lease surely holds.
    fence: Arc<Fence>,
}

/// Pulls partition `p` until asked to stop, then lets the last pull request
/// end (messages the server sent to it are still decided and acknowledged)
/// and waits for the acknowledgements still unconfirmed.
async fn run_partition(
    p: u32,
    mut consumer: jetstream::consumer::PullConsumer,
    receiver: Receiver,
    options: ConsumeOptions,
    own: Ownership,
    shared: Arc<Shared>,
) {
    let Ownership { stop, fence } = own;
    // A pull outlives the delay of a negative acknowledgement, so that the
    // redelivery comes to a pull that is still read.
    let expires = options
        .pull_expires
        .max(options.retry_delay + Duration::from_millis(500));
    let mut order = InOrder::taking_over(p, &mut consumer, expires).await;
    let mut confirmations = tokio::task::JoinSet::new();
    let step = Step {
        p,
        receiver: &receiver,
        options: &options,
        shared: &shared,
    };
    while !stop.is_cancelled() {
        if !fence.holds(Instant::now()) {
            tracing::warn!(
                partition = p,
                "lease not renewed in time: no more pulls or decisions"
            );
            break;
        }
        if order.0.waiting() > 0 || order.0.owed() > 0 {
            // Waiting for an older message is not being idle.
            shared.times().last_activity = Some(Instant::now());
        }
        // Messages waiting or handed back count against max_ack_pending.
        let room = order.0.room(options.max_in_flight);
        if order.0.decide_first(room) {
            // Nothing more can come (all in flight is here): decide first.
            let ready = order.ready(p, &mut consumer, &options, &shared).await;
            step.run(ready, &mut order, &mut confirmations).await;
            continue;
        }
        // A redelivery (what is owed, or what a previous holder left) comes
        // even when the partition has no room: pull for one then.
        let want = room.max(1);
        let batch = consumer
            .batch()
            .max_messages(want)
            .expires(expires)
            .messages()
            .await;
        let mut batch = match batch {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(partition = p, error = %e, "pull failed");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                    _ = stop.cancelled() => {}
                }
                continue;
            }
        };
        // Read the pull to its end (its messages, or the server's word that
        // it expired): a pull given up early may still receive messages,
        // which would then wait out the ack wait. What has arrived is
        // decided together, up to `batch` at a time, while the rest arrives.
        let mut ended = false;
        while !ended {
            let Some(first) = batch.next().await else {
                break;
            };
            let mut arrived = vec![first];
            while arrived.len() < options.batch.max(1) {
                match batch.next().now_or_never() {
                    Some(Some(m)) => arrived.push(m),
                    Some(None) => {
                        ended = true;
                        break;
                    }
                    None => break,
                }
            }
            let arrived = arrivals(p, arrived);
            if arrived.is_empty() {
                continue;
            }
            {
                let mut times = shared.times();
                times.last_activity = Some(Instant::now());
                times.first_message.get_or_insert_with(SystemTime::now);
            }
            order.arrive(arrived);
            if fence.holds(Instant::now()) {
                let ready = order.ready(p, &mut consumer, &options, &shared).await;
                step.run(ready, &mut order, &mut confirmations).await;
            }
        }
        while confirmations.try_join_next().is_some() {}
        order.forget_overdue(p, &mut consumer, &options).await;
        if fence.holds(Instant::now()) {
            let ready = order.ready(p, &mut consumer, &options, &shared).await;
            step.run(ready, &mut order, &mut confirmations).await;
        }
    }
    // Messages still waiting go back at once, for the next holder.
    for a in order.0.take_waiting() {
        let _ = a.message.ack_with(AckKind::Nak(None)).await;
    }
    while confirmations.join_next().await.is_some() {}
}

/// The messages of one pull that arrived, with their stream sequence and
/// delivery count, in stream order.
fn arrivals(p: u32, arrived: Vec<Result<jetstream::Message, async_nats::Error>>) -> Vec<Arrived> {
    let mut arrived: Vec<Arrived> = arrived
        .into_iter()
        .filter_map(|m| {
            m.map_err(|e| tracing::warn!(partition = p, error = %e, "pull interrupted"))
                .ok()
        })
        .map(|message| {
            let (stream_sequence, delivered) = message
                .info()
                .map_or((0, 0), |i| (i.stream_sequence, i.delivered));
            Arrived {
                message,
                stream_sequence,
                delivered,
            }
        })
        .collect();
    arrived.sort_by_key(|a| a.stream_sequence);
    arrived
}

/// What keeps a partition's messages decided in stream order although many
/// are in flight: [`partition::InOrder`] (the owed messages and the
/// take-over gate), with the server's answers it asks for.
struct InOrder(partition::InOrder<Arrived, Instant>);

impl InOrder {
    /// The ordering state of a worker that just took its partition and
    /// pulls with `expires`. The gate is open at once only when the server
    /// says the partition has nothing unacknowledged and no pull request
    /// waiting (so no previous holder is still at work).
    async fn taking_over(
        p: u32,
        consumer: &mut jetstream::consumer::PullConsumer,
        expires: Duration,
    ) -> Self {
        let busy = match consumer.info().await {
            Ok(info) => partition::busy(info.num_ack_pending, info.num_waiting),
            Err(e) => {
                tracing::warn!(partition = p, error = %e, "consumer info failed: gating");
                true
            }
        };
        Self(partition::InOrder::taking_over(
            busy,
            Instant::now(),
            expires,
        ))
    }

    /// Adds one pull's arrivals (a redelivery replaces the earlier copy).
    fn arrive(&mut self, arrived: Vec<Arrived>) {
        for a in arrived {
            self.0.arrive(a.stream_sequence, a);
        }
    }

    /// Takes out the messages that may be decided now, in stream order:
    /// nothing while gated, otherwise those older than every owed message.
    /// Keeps the others in progress, so they are not redelivered meanwhile.
    async fn ready(
        &mut self,
        p: u32,
        consumer: &mut jetstream::consumer::PullConsumer,
        options: &ConsumeOptions,
        shared: &Shared,
    ) -> Vec<Arrived> {
        if self.0.gate_due(Instant::now()) {
            if let Some(pending) = unacknowledged(p, consumer).await {
                if self.0.gate_answer(pending) {
                    tracing::debug!(
                        partition = p,
                        waiting = self.0.waiting(),
                        "every unacknowledged message is here: deciding in stream order"
                    );
                }
            }
        }
        let (ready, newly_waited) = self.0.take_ready();
        shared.waited.fetch_add(newly_waited, Ordering::Relaxed);
        if self.0.progress_due(Instant::now(), options.ack_wait) {
            for a in self.0.waiting_messages() {
                let _ = a.message.ack_with(AckKind::Progress).await;
            }
        }
        ready
    }

    /// Forgets the owed messages once they are overdue and the server says
    /// none of them is still unacknowledged (see
    /// [`partition::InOrder::forget_due`]).
    async fn forget_overdue(
        &mut self,
        p: u32,
        consumer: &mut jetstream::consumer::PullConsumer,
        options: &ConsumeOptions,
    ) {
        if !self
            .0
            .forget_due(Instant::now(), options.retry_delay, options.ack_wait)
        {
            return;
        }
        // What is waiting here is unacknowledged; anything the server counts
        // beyond it may be an owed message still to come back (or an
        // acknowledgement not yet read): keep waiting then.
        if let Some(pending) = unacknowledged(p, consumer).await {
            let forgotten = self.0.forget_answer(pending);
            if forgotten > 0 {
                tracing::warn!(
                    partition = p,
                    forgotten,
                    "messages handed back were acknowledged elsewhere: no longer waited for"
                );
            }
        }
    }
}

/// The server's count of `consumer`'s unacknowledged messages (the callers
/// ask at most every [`partition::INFO_INTERVAL`]); `None` when the request
/// failed (logged).
async fn unacknowledged(p: u32, consumer: &mut jetstream::consumer::PullConsumer) -> Option<usize> {
    match consumer.info().await {
        Ok(info) => Some(info.num_ack_pending),
        Err(e) => {
            tracing::warn!(partition = p, error = %e, "consumer info failed");
            None
        }
    }
}

/// One partition's worker deciding what its pulls bring.
struct Step<'a> {
    p: u32,
    receiver: &'a Receiver,
    options: &'a ConsumeOptions,
    shared: &'a Arc<Shared>,
}

/// A message with what JetStream said about it.
struct Arrived {
    message: jetstream::Message,
    stream_sequence: u64,
    delivered: i64,
}

impl Step<'_> {
    /// Decides `ready` (in stream order) in one [`Receiver::deliver_batch`]
    /// call and answers JetStream for each message according to its receipt:
    /// the acknowledgements only after the receipts, i.e. after the group
    /// commit that recorded them; their confirmation is awaited in
    /// `confirmations`. A `retry` is handed back and owed.
    async fn run(
        &self,
        now: Vec<Arrived>,
        order: &mut InOrder,
        confirmations: &mut tokio::task::JoinSet<()>,
    ) {
        let p = self.p;
        if now.is_empty() {
            return;
        }
        let receipts = {
            let bodies: Vec<&[u8]> = now.iter().map(|a| a.message.payload.as_ref()).collect();
            let deliver = self.receiver.deliver_batch(&bodies);
            tokio::pin!(deliver);
            let every = (self.options.ack_wait / 3).max(Duration::from_millis(100));
            let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            loop {
                tokio::select! {
                    receipts = &mut deliver => break receipts,
                    _ = progress.tick() => {
                        // Still deciding (a slow commit): keep the messages ours.
                        for a in &now {
                            let _ = a.message.ack_with(AckKind::Progress).await;
                        }
                    }
                }
            }
        };
        let mut acknowledged = Vec::with_capacity(now.len());
        for (a, receipt) in now.into_iter().zip(receipts) {
            match receipt.ack() {
                Ack::Acknowledge => {
                    order.0.settled(a.stream_sequence);
                    acknowledged.push((a, receipt));
                }
                Ack::Retry => {
                    let (reason, delay) = match &receipt.outcome {
                        // Another process (or the restart) takes it at once.
                        Outcome::Retry(RetryReason::ShuttingDown) => {
                            ("the receiver is shutting down".to_owned(), Duration::ZERO)
                        }
                        Outcome::Retry(why) => (why.to_string(), self.options.retry_delay),
                        _ => ("retry".to_owned(), self.options.retry_delay),
                    };
                    tracing::info!(partition = p, stream_sequence = a.stream_sequence, %reason, "not recorded: redelivery asked for");
                    self.shared.retried.fetch_add(1, Ordering::Relaxed);
                    order.0.handed_back(a.stream_sequence, Instant::now());
                    if let Err(e) = a.message.ack_with(AckKind::Nak(Some(delay))).await {
                        tracing::warn!(partition = p, error = %e, "negative acknowledgement failed: redelivered after the ack wait");
                    }
                    (self.shared.sink)(&ConsumeEvent::Retry {
                        partition: p,
                        stream_sequence: a.stream_sequence,
                        reason,
                    });
                }
                Ack::Reject => {
                    let reason = match &receipt.outcome {
                        Outcome::Rejected(why) => why.to_string(),
                        _ => "rejected".to_owned(),
                    };
                    // An answer, printed as a `terminated` event: not a warning.
                    tracing::info!(partition = p, stream_sequence = a.stream_sequence, %reason, "rejected: terminating the message");
                    order.0.settled(a.stream_sequence);
                    self.shared.terminated.fetch_add(1, Ordering::Relaxed);
                    if let Err(e) = a.message.ack_with(AckKind::Term).await {
                        tracing::warn!(partition = p, error = %e, "terminate failed");
                    }
                    (self.shared.sink)(&ConsumeEvent::Terminated {
                        partition: p,
                        stream_sequence: a.stream_sequence,
                        reason,
                    });
                }
            }
        }
        if acknowledged.is_empty() {
            return;
        }
        // Every decision here is committed: acknowledge them all, and wait
        // for the server's confirmation of the last one only (the server
        // handles one connection's acknowledgements of a consumer in order,
        // so it confirms the earlier ones with it) beside the next pull.
        let shared = self.shared.clone();
        confirmations.spawn(async move {
            let last = acknowledged.len() - 1;
            let mut sent = Ok(());
            for (a, _) in &acknowledged[..last] {
                if let Err(e) = a.message.ack().await {
                    sent = Err(e);
                    break;
                }
            }
            let confirmed = match sent {
                Ok(()) => confirmed_ack(&acknowledged[last].0.message).await,
                Err(e) => Err(e),
            };
            if let Err(e) = confirmed {
                shared
                    .ack_failures
                    .fetch_add(acknowledged.len() as u64, Ordering::Relaxed);
                tracing::warn!(partition = p, messages = acknowledged.len(), error = %e,
                    "acknowledgements not confirmed: the messages will come again as duplicates");
                return;
            }
            shared
                .acknowledged
                .fetch_add(acknowledged.len() as u64, Ordering::Relaxed);
            {
                let mut times = shared.times();
                times.last_ack = Some(SystemTime::now());
                times.last_activity = Some(Instant::now());
            }
            for (a, receipt) in acknowledged {
                if let Some(decision) = receipt.decision() {
                    (shared.sink)(&ConsumeEvent::Acknowledged {
                        partition: p,
                        stream_sequence: a.stream_sequence,
                        delivered: a.delivered,
                        event_id: receipt.event_id.clone(),
                        decision,
                    });
                }
            }
        });
    }
}

/// Acknowledges `message` and waits for the server's confirmation: a request
/// on the connection's shared reply subscription (the client's `double_ack`
/// subscribes anew for every message, which costs as much as the rest of
/// the round trip).
async fn confirmed_ack(message: &jetstream::Message) -> Result<(), async_nats::Error> {
    let reply = message
        .reply
        .clone()
        .ok_or("not a JetStream message: no reply subject")?;
    message
        .context
        .client()
        .request(reply, async_nats::jetstream::message::AckKind::Ack.into())
        .await?;
    Ok(())
}
