//! `loadtest --relay KIND`: a relay running on the receiver the producers
//! load (or, with `--relay-catch-up`, started once they are done), what
//! reached its destination compared with the outbox, and how fast and how
//! late it got there.
//!
//! The kinds: `handler` (the library's relay handing every effect to an
//! in-process handler that only records it: the relay's own cost),
//! `http` (the relay with `serve --forward`'s handler, POSTing to a sink on
//! loopback that answers 204), `jetstream` (the relay publishing to a
//! JetStream stream made for the run and deleted after it), and `poll`
//! (the relay people write by hand: a cursor of step numbers over the
//! deprecated `stored_effects_since`, polled every millisecond; it is there
//! to count what such a cursor misses).

use crate::error::InputError;
use clap::ValueEnum;
use serde::Serialize;
use snapshot_receiver::relay::{HandlerError, RelayOptions};
use snapshot_receiver::{Effect, Receiver};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// What `--relay` runs. (No doc comments on the values: they would add a
/// list to --help that repeats the `--relay` text.)
#[derive(Clone, Copy, Debug, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum RelayKind {
    Handler,
    Http,
    Jetstream,
    Poll,
}

impl RelayKind {
    /// The name on the command line.
    fn name(self) -> &'static str {
        match self {
            RelayKind::Handler => "handler",
            RelayKind::Http => "http",
            RelayKind::Jetstream => "jetstream",
            RelayKind::Poll => "poll",
        }
    }
}

/// How the relay of a run is set up.
#[derive(Clone, Debug)]
pub(super) struct RelaySetup {
    /// What runs.
    pub(super) kind: RelayKind,
    /// Started only after the last delivery was answered.
    pub(super) catch_up: bool,
    /// Most objects in flight at once ([`RelayOptions::concurrency`]).
    pub(super) concurrency: usize,
    /// The NATS server for `jetstream` (read only by builds that have it).
    #[cfg_attr(not(feature = "jetstream"), allow(dead_code))]
    pub(super) nats: String,
}

/// How long a relay may take to hand out the outbox once the producers
/// are done before the run reports what it missed.
const DRAIN_LIMIT: Duration = Duration::from_secs(300);

/// What reached the destination, against the outbox.
#[derive(Debug, Serialize)]
pub(super) struct RelayRun {
    /// What ran.
    pub(super) kind: RelayKind,
    /// Whether it started after the producers were done.
    pub(super) catch_up: bool,
    /// Effects in the outbox at the end (its last position).
    pub(super) effects: u64,
    /// Of those, how many reached the destination at least once.
    pub(super) reached: u64,
    /// Of those, how many never did (within [`DRAIN_LIMIT`]).
    pub(super) missed: u64,
    /// Arrivals beyond the first of an effect (re-sends).
    pub(super) resent: u64,
    /// Re-sends whose effect id differed from the first arrival's.
    pub(super) resent_with_another_id: u64,
    /// Objects whose effects first arrived out of version order.
    pub(super) out_of_order_objects: u64,
    /// Arrivals naming no effect of the outbox.
    pub(super) unknown: u64,
    /// Seconds from the relay's start to the last first arrival.
    pub(super) seconds: f64,
    /// `effects / seconds`.
    pub(super) effects_per_s: f64,
    /// Seconds from the last answer to the last first arrival (0 when
    /// everything had arrived by then).
    pub(super) drain_seconds: f64,
    /// From a delivery's answer to its effect's first arrival,
    /// milliseconds: median, 99th percentile, largest. Empty with
    /// `--relay-catch-up` (the relay started after every answer).
    pub(super) answer_to_arrival_ms: Option<[f64; 3]>,
}

/// One effect as it reached the destination.
#[derive(Debug)]
struct Arrival {
    /// Its effect id (`ef_...`); the step's key for `poll`.
    id: String,
    /// Its object.
    object: String,
    /// Its version.
    version: u64,
    /// The event that caused it.
    cause: Option<String>,
    /// When it arrived.
    at: Instant,
}

/// What arrived, in arrival order. A std mutex: held to push one.
#[derive(Default)]
struct Arrivals(Mutex<Vec<Arrival>>);

impl Arrivals {
    fn push(&self, arrival: Arrival) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(arrival);
    }

    fn record(&self, effect: &Effect) {
        self.push(Arrival {
            id: effect.id.to_string(),
            object: effect.object_id.to_string(),
            version: effect.version,
            cause: effect.cause_event.as_deref().map(str::to_owned),
            at: Instant::now(),
        });
    }

    fn take(&self) -> Vec<Arrival> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// Checks what a build and the other options allow, before the stream is
/// generated.
///
/// # Errors
/// An [`InputError`] for a relay without a durable store, a kind this
/// build does not have, a concurrency out of range.
pub(super) fn check(setup: &RelaySetup, store: Option<&str>) -> Result<(), InputError> {
    if store.is_none_or(|s| s == "memory") {
        return Err(InputError::new(
            "--relay needs --store sqlite:PATH or postgres://...: the relays read the durable \
             outbox (the load test's in-memory receiver keeps no audit trail)",
        ));
    }
    if !(1..=4096).contains(&setup.concurrency) {
        return Err(InputError::new(format!(
            "--relay-concurrency must be from 1 to 4096, got {}",
            setup.concurrency
        )));
    }
    let missing = match setup.kind {
        RelayKind::Http if !cfg!(feature = "serve") => Some("serve"),
        RelayKind::Jetstream if !cfg!(feature = "jetstream") => Some("jetstream"),
        _ => None,
    };
    if let Some(feature) = missing {
        return Err(InputError::new(format!(
            "--relay {}: not in this build; it needs the `{feature}` feature (cargo build \
             --release --features full)",
            setup.kind.name()
        )));
    }
    if setup.catch_up && matches!(setup.kind, RelayKind::Poll) {
        return Err(InputError::new(
            "--relay-catch-up with --relay poll: a hand-written relay that starts after the \
             load misses nothing (the numbering only misses effects still committing)",
        ));
    }
    Ok(())
}

/// Runs the relay of `setup` on `receiver` beside the producers, until
/// the outbox is handed out; `answered` gets the delivery phase's wall
/// time when the last delivery was answered. `answer_of` gives the
/// earliest answer of an event, for the latency.
pub(super) async fn run(
    setup: RelaySetup,
    receiver: Arc<Receiver>,
    answered: tokio::sync::oneshot::Receiver<Duration>,
    answer_of: impl Fn(&str) -> Option<Instant> + Send + 'static,
) -> Result<RelayRun, String> {
    let arrivals = Arc::new(Arrivals::default());
    let options = RelayOptions {
        concurrency: setup.concurrency,
        batch: 1024,
        poll_interval: Duration::from_millis(5),
        ..RelayOptions::new("loadtest")
    };
    let mut answered = Some(answered);
    let mut last_answer = None;
    if setup.catch_up {
        if let Some(rx) = answered.take() {
            let _ = rx.await;
        }
        last_answer = Some(Instant::now());
    }
    let started = Instant::now();
    let relay = match setup.kind {
        RelayKind::Poll => {
            let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let poller = tokio::spawn(poll(receiver.clone(), arrivals.clone(), done.clone()));
            if let Some(rx) = answered.take() {
                last_answer = rx.await.ok().map(|elapsed| started + elapsed);
            }
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            poller
                .await
                .map_err(|e| format!("the polling relay stopped: {e}"))??;
            None
        }
        RelayKind::Handler => {
            let record = arrivals.clone();
            Some(
                receiver
                    .relay(options, move |effect: Effect| {
                        record.record(&effect);
                        async { Ok::<(), HandlerError>(()) }
                    })
                    .await
                    .map_err(|e| e.to_string())?,
            )
        }
        #[cfg(feature = "serve")]
        RelayKind::Http => Some(http::start(&receiver, options, arrivals.clone()).await?),
        #[cfg(feature = "jetstream")]
        RelayKind::Jetstream => {
            Some(nats::start(&receiver, options, arrivals.clone(), &setup.nats).await?)
        }
        // Refused by `check` before the run; said again here.
        #[allow(unreachable_patterns)]
        kind => return Err(format!("--relay {}: not in this build", kind.name())),
    };
    if let Some(rx) = answered.take() {
        // The delivery phase started with this task (give or take its
        // first poll).
        last_answer = rx.await.ok().map(|elapsed| started + elapsed);
    }
    let outbox = read_outbox(&receiver).await?;
    let last = outbox.len() as u64;
    let mut stopped = Ok(());
    if let Some(relay) = relay {
        let progress = relay.wait_for(last, DRAIN_LIMIT).await;
        if progress.position < last {
            tracing::warn!(
                position = progress.position,
                last,
                "the relay did not hand out the outbox in time"
            );
        }
        stopped = relay.stop().await.map(|_| ()).map_err(|e| e.to_string());
    }
    #[cfg(feature = "jetstream")]
    if matches!(setup.kind, RelayKind::Jetstream) {
        nats::finish(&setup.nats).await?;
    }
    stopped?;
    let last_answer = last_answer.unwrap_or(started);
    Ok(compare(
        &setup,
        &outbox,
        arrivals.take(),
        started,
        last_answer,
        &answer_of,
    ))
}

/// Every effect of the outbox, in position order.
async fn read_outbox(receiver: &Receiver) -> Result<Vec<Effect>, String> {
    let mut all: Vec<Effect> = Vec::new();
    loop {
        let after = all.last().map_or(0, |e| e.position);
        let page = receiver
            .outbox(after, 10_000)
            .await
            .map_err(|e| format!("reading the outbox: {e}"))?;
        if page.is_empty() {
            return Ok(all);
        }
        all.extend(page);
    }
}

/// The hand-written relay: remembers the highest step number it saw and
/// asks for the effects after it, every millisecond until `done`, then
/// once more.
async fn poll(
    receiver: Arc<Receiver>,
    arrivals: Arc<Arrivals>,
    done: Arc<std::sync::atomic::AtomicBool>,
) -> Result<(), String> {
    let mut cursor = 0;
    loop {
        let last_round = done.load(std::sync::atomic::Ordering::Relaxed);
        #[allow(deprecated)]
        let rows = receiver
            .stored_effects_since(cursor)
            .await
            .map_err(|e| format!("polling the effects: {e}"))?;
        let at = Instant::now();
        for row in rows {
            cursor = cursor.max(row.key.seq);
            arrivals.push(Arrival {
                id: format!("{}_{}", row.key.origin, row.key.seq),
                object: row.object_id.to_string(),
                version: row.version,
                cause: row.cause_event.as_deref().map(str::to_owned),
                at,
            });
        }
        if last_round {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Compares what arrived with the outbox. Effects are matched by object
/// and version (unique in a load test: no authority replaces a version).
fn compare(
    setup: &RelaySetup,
    outbox: &[Effect],
    arrivals: Vec<Arrival>,
    started: Instant,
    last_answer: Instant,
    answer_of: &dyn Fn(&str) -> Option<Instant>,
) -> RelayRun {
    let known: HashSet<(&str, u64)> = outbox.iter().map(|e| (&*e.object_id, e.version)).collect();
    let mut first: HashMap<(&str, u64), &Arrival> = HashMap::new();
    let mut resent = 0;
    let mut resent_with_another_id = 0;
    let mut unknown = 0;
    let mut order: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for a in &arrivals {
        let key = (a.object.as_str(), a.version);
        if !known.contains(&key) {
            unknown += 1;
            continue;
        }
        match first.get(&key) {
            Some(earlier) => {
                resent += 1;
                if earlier.id != a.id {
                    resent_with_another_id += 1;
                }
            }
            None => {
                first.insert(key, a);
                order.entry(&a.object).or_default().push(a.version);
            }
        }
    }
    let out_of_order_objects = order
        .values()
        .filter(|versions| versions.windows(2).any(|w| w[0] >= w[1]))
        .count() as u64;
    let reached = first.len() as u64;
    let last_arrival = first.values().map(|a| a.at).max().unwrap_or(started);
    let seconds = last_arrival
        .saturating_duration_since(started)
        .as_secs_f64();
    let mut latencies: Vec<u64> = if setup.catch_up {
        Vec::new()
    } else {
        first
            .values()
            .filter_map(|a| {
                let answer = answer_of(a.cause.as_deref()?)?;
                Some(a.at.saturating_duration_since(answer).as_micros() as u64)
            })
            .collect()
    };
    latencies.sort_unstable();
    let pick = |q: f64| {
        let i = ((latencies.len() as f64 * q).ceil() as usize).clamp(1, latencies.len()) - 1;
        latencies[i] as f64 / 1000.0
    };
    RelayRun {
        kind: setup.kind,
        catch_up: setup.catch_up,
        effects: outbox.len() as u64,
        reached,
        missed: outbox.len() as u64 - reached,
        resent,
        resent_with_another_id,
        out_of_order_objects,
        unknown,
        seconds,
        effects_per_s: outbox.len() as f64 / seconds.max(1e-9),
        drain_seconds: last_arrival
            .saturating_duration_since(last_answer)
            .as_secs_f64(),
        answer_to_arrival_ms: (!latencies.is_empty()).then(|| [pick(0.5), pick(0.99), pick(1.0)]),
    }
}

impl RelayRun {
    /// Whether every effect reached the destination, re-sends only under
    /// their own id, per object in version order. (`poll` is the peer whose
    /// misses are reported, not checked.)
    pub(super) fn ok(&self) -> bool {
        matches!(self.kind, RelayKind::Poll)
            || (self.missed == 0
                && self.resent_with_another_id == 0
                && self.out_of_order_objects == 0
                && self.unknown == 0)
    }

    /// The report's lines.
    pub(super) fn write(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        let name = self.kind.name();
        writeln!(
            out,
            "relay {name}{}: {} effects, {} reached, {} missed, {} re-sent ({} under another id), \
             {} objects out of order, {} unknown",
            if self.catch_up { " (catch-up)" } else { "" },
            self.effects,
            self.reached,
            self.missed,
            self.resent,
            self.resent_with_another_id,
            self.out_of_order_objects,
            self.unknown
        )?;
        write!(
            out,
            "relay {name}: {:.0} effects/s over {:.2} s, drained {:.3} s after the last answer",
            self.effects_per_s, self.seconds, self.drain_seconds
        )?;
        match self.answer_to_arrival_ms {
            Some([p50, p99, max]) => writeln!(
                out,
                "; answer to arrival p50 {p50:.1} ms, p99 {p99:.1} ms, max {max:.1} ms"
            ),
            None => writeln!(out),
        }
    }
}

/// The `http` kind: a sink on loopback and `serve --forward`'s handler.
#[cfg(feature = "serve")]
mod http {
    use super::{Arrival, Arrivals};
    use snapshot_receiver::relay::{Relay, RelayOptions};
    use snapshot_receiver::Receiver;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    /// The secret effects are signed with (the sink does not check it: it
    /// stands for an application, whose cost is not the relay's).
    const SECRET: &str = "whsec_bG9hZHRlc3QtcmVsYXktc2VjcmV0";

    /// Starts the sink and the relay POSTing to it.
    pub(super) async fn start(
        receiver: &Receiver,
        options: RelayOptions,
        arrivals: Arc<Arrivals>,
    ) -> Result<Relay, String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("the sink cannot listen: {e}"))?;
        let address = listener
            .local_addr()
            .map_err(|e| format!("the sink's address: {e}"))?;
        let app = axum::Router::new().route(
            "/effects",
            axum::routing::post(move |body: axum::body::Bytes| {
                let arrivals = arrivals.clone();
                async move { accept(&arrivals, &body) }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        let destination = crate::cmd::forward::HttpDestination::new(
            &format!("http://{address}/effects"),
            SECRET.to_owned(),
            Duration::from_secs(10),
            u64::MAX / 2,
        )
        .map_err(|e| e.to_string())?;
        receiver
            .relay(options, destination)
            .await
            .map_err(|e| e.to_string())
    }

    /// Records a POSTed effect: 204, or 400 for a body that is not one.
    fn accept(arrivals: &Arrivals, body: &[u8]) -> axum::http::StatusCode {
        #[derive(serde::Deserialize)]
        struct Posted {
            effect_id: String,
            object_id: String,
            version: u64,
            cause: Option<String>,
        }
        match serde_json::from_slice::<Posted>(body) {
            Ok(p) => {
                arrivals.push(Arrival {
                    id: p.effect_id,
                    object: p.object_id,
                    version: p.version,
                    cause: p.cause,
                    at: Instant::now(),
                });
                axum::http::StatusCode::NO_CONTENT
            }
            Err(_) => axum::http::StatusCode::BAD_REQUEST,
        }
    }
}

/// The `jetstream` kind: a stream made for the run, the library's
/// JetStream destination, the stream deleted after the run.
#[cfg(feature = "jetstream")]
mod nats {
    use super::Arrivals;
    use snapshot_receiver::jetstream::JetStreamDestination;
    use snapshot_receiver::relay::{Handler, HandlerFuture, Relay, RelayOptions};
    use snapshot_receiver::{Effect, Receiver};
    use std::sync::Arc;

    /// The run's stream and its subjects' prefix.
    fn stream_name() -> String {
        format!("LOADTEST_EFFECTS_{}", std::process::id())
    }

    /// Makes the stream and starts the relay publishing to it; an effect
    /// arrives when the server acknowledged it.
    pub(super) async fn start(
        receiver: &Receiver,
        options: RelayOptions,
        arrivals: Arc<Arrivals>,
        url: &str,
    ) -> Result<Relay, String> {
        let client = snapshot_receiver::jetstream::connect(url)
            .await
            .map_err(|e| format!("--relay-nats: {e}"))?;
        let name = stream_name();
        let js = async_nats::jetstream::new(client.clone());
        js.create_stream(async_nats::jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![format!("{name}.>")],
            storage: async_nats::jetstream::stream::StorageType::File,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("--relay-nats: creating stream {name}: {e}"))?;
        let destination = Recorded {
            inner: JetStreamDestination::new(client, name),
            arrivals,
        };
        receiver
            .relay(options, destination)
            .await
            .map_err(|e| e.to_string())
    }

    /// Deletes the run's stream.
    pub(super) async fn finish(url: &str) -> Result<(), String> {
        let client = snapshot_receiver::jetstream::connect(url)
            .await
            .map_err(|e| format!("--relay-nats: {e}"))?;
        async_nats::jetstream::new(client)
            .delete_stream(stream_name())
            .await
            .map(|_| ())
            .map_err(|e| format!("--relay-nats: deleting stream {}: {e}", stream_name()))
    }

    /// The destination, recording what the server acknowledged.
    struct Recorded {
        inner: JetStreamDestination,
        arrivals: Arc<Arrivals>,
    }

    impl Handler for Recorded {
        fn handle(&self, effect: Effect) -> HandlerFuture {
            let (sent, arrivals) = (self.inner.handle(effect.clone()), self.arrivals.clone());
            Box::pin(async move {
                sent.await?;
                arrivals.record(&effect);
                Ok(())
            })
        }
    }
}
