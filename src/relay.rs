//! Durable named relays (docs/CONTRACT.md §10): a task that reads the
//! outbox by position and hands every effect to an async [`Handler`],
//! keeping its cursor in the receiver's store.
//!
//! - **At least once.** A relay's cursor (and what it parked) is saved in
//!   one store transaction after the handlers of a round returned, so an
//!   effect whose handler succeeded may be handed out again after a crash
//!   (never one that was not handed out). Rounds that only move the
//!   cursor are saved together, at most every
//!   [`RelayOptions::save_every`]. The effect's id
//!   ([`crate::EffectId`], `ef_<origin>_<seq>`) is the same every time, for
//!   the destination to drop a re-send.
//! - **Per object in version order, objects in parallel.** An object's next
//!   effect is not handed out before its previous one succeeded; effects of
//!   different objects go at once, at most [`RelayOptions::concurrency`]
//!   objects at a time.
//! - **Retries without blocking the others.** A refused effect is *parked*
//!   (with its object's later effects behind it) and tried again on the
//!   [`RelayOptions::schedule`]; the cursor passes it, so other objects go
//!   on. One that exhausts its schedule is parked `failed`, visible
//!   ([`crate::store::OutboxStore::parked`]) until an operator retries or
//!   skips it; the store's purge keeps its history row meanwhile.
//! - **Coalescing, when asked.** With [`RelayOptions::coalesce`], an
//!   object with several effects waiting (parked behind a refusal, or read
//!   in one round) gets one handler call: its newest effect, whose
//!   [`Effect::replaces`] names the others. Accepted, it passes them all;
//!   refused, they stay parked together and the next attempt coalesces
//!   again (with whatever came meanwhile).
//! - **Inside the memory budget.** A parked effect is kept in memory as
//!   its head only (id, object, version, position, attempts, next try);
//!   its state is read back from the store when it is due. A round reads
//!   states within a quarter of the relay's part of the budget
//!   ([`RelayOptions::memory`], default [`crate::MemoryBudget::relay`]),
//!   at least one effect however large. When the parked heads fill the
//!   other half, the relay is *backlogged*: its cursor stops and it reads
//!   no new effect (they wait in the store) until parked ones are
//!   delivered, skipped or retried; [`RelayProgress::backlogged`] says so.
//! - **Named and leased.** Relays of different names progress
//!   independently. One run at a time holds a relay (a lease in the store,
//!   renewed as it saves and during long rounds); a restarted relay
//!   resumes at its cursor, and an operator's retry, skip or rewind makes
//!   the running relay read its state again.
//!
//! The loop (what to read, hand out, park, save, renew, when to wait) is
//! the core's sans-IO [`RelayDriver`]; the task here does what it says:
//! store calls on the store's own connection on a blocking thread,
//! handler calls, sleeps, logs and metrics.

pub use crate::core::relay::{
    CatchUp, CatchUpLine, HandlerError, RelayProgress, CATCH_UP_EFFECTS, CATCH_UP_EVERY,
    DEFAULT_SCHEDULE, MAX_WAIT, STORE_RETRY,
};
use crate::core::relay::{
    Effect, Next, Notice, ParkedStatus, RelayDriver, RelaySettings, RoundRead,
};
use crate::log_gate::LogGate;
use crate::store::{OutboxStore, StoreError};
use crate::Receiver;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Where a relay the store does not know yet starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RelayStart {
    /// With the first effect the outbox holds.
    Beginning,
    /// After the last effect given a position when it is first opened:
    /// only what comes next.
    End,
}

/// How a relay runs. [`RelayOptions::new`] gives the defaults.
#[derive(Clone, Debug)]
pub struct RelayOptions {
    /// The relay's name: its key in the store. Relays of different names
    /// keep separate cursors.
    pub name: String,
    /// Where a relay the store does not know yet starts (default
    /// [`RelayStart::Beginning`]); a known relay resumes at its cursor.
    pub start: RelayStart,
    /// Most effects read from the outbox per round (default 256).
    pub batch: usize,
    /// Most objects whose effects are with the handler at once (default
    /// 16). One object has at most one effect with the handler.
    pub concurrency: usize,
    /// How long the relay waits before reading again when the outbox had
    /// nothing new (default 50 ms).
    pub poll_interval: Duration,
    /// The waits between a refused attempt and the next one (default
    /// [`DEFAULT_SCHEDULE`]); an effect refused once more than this has
    /// entries is parked `failed`. Each wait is its entry times a factor
    /// drawn uniformly from 0.8 to 1.2 (as Svix does, so that relays
    /// refused together do not retry in step; seeded per run), never below
    /// a handler's [`HandlerError::retry_after`] (a destination's
    /// `Retry-After`, RFC 9110 §10.2.3), never above [`MAX_WAIT`].
    pub schedule: Vec<Duration>,
    /// How long the relay's hold on its name lasts without being renewed
    /// (default 30 s). Another run takes the relay over only once it
    /// lapsed; the relay renews it at every save, at least every third of
    /// it.
    pub lease: Duration,
    /// Whether an object's waiting effects are sent as one (default off):
    /// only the newest, its [`Effect::replaces`] naming the earlier ones
    /// it stands for. For destinations that keep state (each effect
    /// carries the object's whole state); a destination that needs every
    /// transition keeps it off.
    pub coalesce: bool,
    /// How long the relay's cursor may stay unsaved (default 200 ms; zero:
    /// every round is saved). Under load, a round whose effects were all
    /// accepted moves the cursor in memory only until this passed since
    /// the last save; the first round after it saves the cursor, and so
    /// does a relay that finds nothing new, or stops. A crash hands out
    /// again what passed since the last save: with the default, about
    /// 200 ms of effects more than if every round were saved (at least
    /// once, the ids unchanged). A round that parks or unparks an effect
    /// is saved at once.
    pub save_every: Duration,
    /// The relay's part of the memory budget, in bytes (default `None`:
    /// the receiver's [`crate::MemoryBudget::relay`], each relay the whole
    /// part; give each of several relays its share). Half holds its
    /// parked effects' heads (past it the relay is backlogged: its cursor
    /// stops), half a round: its states (a quarter) and their copies with
    /// the handler (at least one effect goes, however large).
    pub memory: Option<usize>,
}

impl RelayOptions {
    /// The defaults for the relay `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            start: RelayStart::Beginning,
            batch: 256,
            concurrency: 16,
            poll_interval: Duration::from_millis(50),
            schedule: DEFAULT_SCHEDULE.to_vec(),
            lease: Duration::from_secs(30),
            coalesce: false,
            save_every: Duration::from_millis(200),
            memory: None,
        }
    }

    /// What is wrong with `name` as a relay's name, if anything: it must
    /// have 1 to 200 characters, none a control character (they would
    /// garble the reports that show it).
    pub fn name_problem(name: &str) -> Option<&'static str> {
        if name.is_empty() || name.chars().count() > 200 {
            Some("must be 1 to 200 characters")
        } else if name.chars().any(char::is_control) {
            Some("control characters would garble the reports that show it")
        } else {
            None
        }
    }

    /// Checks the options: a name [`RelayOptions::name_problem`] accepts,
    /// a batch and a concurrency of at least 1, a lease of at least 1 s,
    /// no schedule entry above [`MAX_WAIT`].
    fn check(&self) -> Result<(), RelayError> {
        let bad = |why: String| Err(RelayError::Options(why));
        if let Some(why) = Self::name_problem(&self.name) {
            return bad(format!("name {:?}: {why}", self.name));
        }
        if self.batch == 0 {
            return bad("batch: must be at least 1".to_owned());
        }
        if self.concurrency == 0 {
            return bad("concurrency: must be at least 1".to_owned());
        }
        if self.lease < Duration::from_secs(1) {
            return bad(format!("lease: {:?} is below 1 s", self.lease));
        }
        if let Some((i, w)) = self
            .schedule
            .iter()
            .enumerate()
            .find(|(_, w)| **w > MAX_WAIT)
        {
            return bad(format!(
                "schedule entry {} ({} s): above the longest wait, {} s (24 h)",
                i + 1,
                w.as_secs(),
                MAX_WAIT.as_secs()
            ));
        }
        Ok(())
    }
}

/// What a handler's future is.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send>>;

/// Where a relay hands its effects: the application's side. `Ok` means the
/// destination accepted the effect; the relay's cursor passes it only
/// then. Any `Fn(Effect) -> impl Future<Output = Result<(), HandlerError>>`
/// is one.
pub trait Handler: Send + Sync + 'static {
    /// Hands `effect` over; called at most once at a time per object.
    fn handle(&self, effect: Effect) -> HandlerFuture;
}

impl<F, Fut> Handler for F
where
    F: Fn(Effect) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
{
    fn handle(&self, effect: Effect) -> HandlerFuture {
        Box::pin(self(effect))
    }
}

/// Why a relay could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// An option is out of range: which one and why.
    #[error("relay options: {0}")]
    Options(String),
    /// The store could not be opened or read.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The relay's task ended abnormally (a panic in it).
    #[error("the relay's task stopped: {0}")]
    Task(String),
}

/// A running relay ([`Receiver::relay`]). Dropping it stops nothing: call
/// [`Relay::stop`].
pub struct Relay {
    /// Raised to ask the task to stop after its round.
    stop: watch::Sender<bool>,
    /// The task; its result is the stop's.
    task: tokio::task::JoinHandle<Result<(), RelayError>>,
    /// The counts the task publishes after every round.
    progress: watch::Receiver<RelayProgress>,
}

/// A handle on a running relay's counts ([`Relay::watch`]), for whoever
/// reports on it (a status page) while the [`Relay`] is owned elsewhere.
#[derive(Clone, Debug)]
pub struct RelayWatch(watch::Receiver<RelayProgress>);

impl RelayWatch {
    /// The counts as the relay last published them.
    pub fn progress(&self) -> RelayProgress {
        self.0.borrow().clone()
    }
}

impl Relay {
    /// The counts as the last round left them.
    pub fn progress(&self) -> RelayProgress {
        self.progress.borrow().clone()
    }

    /// A handle on the counts that outlives no one: it reads what the
    /// relay publishes until it stops.
    pub fn watch(&self) -> RelayWatch {
        RelayWatch(self.progress.clone())
    }

    /// Waits until the relay's saved cursor is at least `position` with
    /// nothing parked, or `timeout` passed; returns the progress then.
    pub async fn wait_for(&self, position: u64, timeout: Duration) -> RelayProgress {
        let mut progress = self.progress.clone();
        let reached = progress.wait_for(|p| p.position >= position && p.parked == 0);
        let _ = tokio::time::timeout(timeout, reached).await;
        self.progress()
    }

    /// Stops the relay at once, without saving or letting its lease go, as
    /// a crash would: what it handed out since its last save is handed out
    /// again by the next run, which takes the relay over once the lease
    /// lapsed.
    pub fn abort(self) {
        self.task.abort();
    }

    /// Stops the relay after its current round (its handlers' calls
    /// finish, its progress is saved) and lets its lease go, so that the
    /// next run takes it over at once. Returns the counts as it stopped.
    ///
    /// # Errors
    /// [`RelayError::Task`] when the task panicked.
    pub async fn stop(self) -> Result<RelayProgress, RelayError> {
        let _ = self.stop.send(true);
        self.task
            .await
            .map_err(|e| RelayError::Task(e.to_string()))??;
        Ok(self.progress.borrow().clone())
    }
}

impl Receiver {
    /// Starts the relay named in `options`, handing every effect of the
    /// outbox to `handler` (docs/CONTRACT.md §10): at least once, per
    /// object in version order, objects in parallel up to
    /// [`RelayOptions::concurrency`], its cursor kept in the receiver's
    /// store (in memory, in this process). A relay the store knows
    /// resumes at its cursor. While another run holds the relay's lease,
    /// this one waits for it to lapse.
    ///
    /// # Errors
    /// [`RelayError::Options`] for options out of range;
    /// [`RelayError::Store`] when the store gives no outbox connection.
    pub async fn relay(
        &self,
        options: RelayOptions,
        handler: impl Handler,
    ) -> Result<Relay, RelayError> {
        options.check()?;
        let store = self.outbox_store().await?;
        let (stop, stopped) = watch::channel(false);
        let (publish, progress) = watch::channel(RelayProgress::default());
        let memory = options
            .memory
            .unwrap_or(self.context().config().memory.relay);
        let runner = Runner {
            memory,
            counted: RelayBytes {
                total: self.relay_bytes(),
                mine: 0,
            },
            store: Arc::new(Mutex::new(store)),
            owner: run_id(&options.name),
            options,
            handler: Arc::new(handler),
            progress: publish,
            stopped,
            refusals: LogGate::new(),
        };
        let task = tokio::spawn(runner.run());
        Ok(Relay {
            stop,
            task,
            progress,
        })
    }
}

/// A relay's share of its receiver's figure of what relays hold
/// ([`crate::MemoryUse::relay`]): the task sets its own figure, the total
/// moves by the change; dropped with the task, its figure goes.
struct RelayBytes {
    /// The receiver's total over its relays.
    total: Arc<std::sync::atomic::AtomicUsize>,
    /// This relay's figure, as last added.
    mine: usize,
}

impl RelayBytes {
    /// Sets this relay's figure to `bytes`.
    fn set(&mut self, bytes: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        if bytes > self.mine {
            self.total.fetch_add(bytes - self.mine, Relaxed);
        } else {
            self.total.fetch_sub(self.mine - bytes, Relaxed);
        }
        self.mine = bytes;
    }
}

impl Drop for RelayBytes {
    fn drop(&mut self) {
        self.set(0);
    }
}

/// The relay's task.
struct Runner {
    /// Its part of the memory budget, in bytes
    /// ([`RelaySettings::memory`]).
    memory: usize,
    /// Its figure in the receiver's [`crate::MemoryUse::relay`].
    counted: RelayBytes,
    /// The store's outbox connection; a std mutex, taken only on a
    /// blocking thread.
    store: Arc<Mutex<Box<dyn OutboxStore>>>,
    /// This run's name for the lease.
    owner: String,
    /// How it runs.
    options: RelayOptions,
    /// Where effects go.
    handler: Arc<dyn Handler>,
    /// Where the counts are published.
    progress: watch::Sender<RelayProgress>,
    /// Raised when the relay is asked to stop.
    stopped: watch::Receiver<bool>,
    /// The gate of its "tried again later" warnings: the first written,
    /// then one per [`crate::log_gate::INTERVAL`] carrying the count of
    /// those not written (a destination refusing thousands of effects
    /// gives a few lines, not thousands).
    refusals: LogGate,
}

/// A name for this run of relay `name`, unlike any other run's: the name,
/// the process and a random number.
fn run_id(name: &str) -> String {
    use std::hash::BuildHasher;
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let random = std::collections::hash_map::RandomState::new().hash_one((now, name));
    format!("{name}@{}-{random:016x}", std::process::id())
}

/// Handler calls, by relay (counter).
const ATTEMPTS: &str = "snapshot_receiver_relay_attempts_total";
/// Effects the handler accepted, by relay (counter; a re-send counts again).
const DELIVERIES: &str = "snapshot_receiver_relay_deliveries_total";
/// Handler refusals, by relay (counter).
const REFUSALS: &str = "snapshot_receiver_relay_refusals_total";
/// Effects with the handler now, by relay (gauge).
const IN_FLIGHT: &str = "snapshot_receiver_relay_in_flight";
/// The relay's saved cursor (gauge).
const POSITION: &str = "snapshot_receiver_relay_position";
/// Effects after the relay's cursor (gauge).
const LAG_EFFECTS: &str = "snapshot_receiver_relay_lag_effects";
/// Age in seconds of the oldest effect the relay has not delivered (gauge).
const LAG_SECONDS: &str = "snapshot_receiver_relay_lag_seconds";
/// Effects passed because a newer one of their object was sent in their
/// place, by relay (counter).
const COALESCED: &str = "snapshot_receiver_relay_coalesced_total";
/// Effects parked, by relay (gauge).
const PARKED: &str = "snapshot_receiver_relay_parked";
/// Of those, failed (gauge).
const FAILED: &str = "snapshot_receiver_relay_failed";
/// Effects after the relay's cursor it resumed past because the outbox no
/// longer held them (counter).
const MISSED: &str = "snapshot_receiver_relay_missed_total";
/// 1 while the relay is backlogged (its parked heads at their ceiling, its
/// cursor stopped), else 0 (gauge).
const BACKLOGGED: &str = "snapshot_receiver_relay_backlogged";
/// What the relay holds in memory, in bytes (gauge).
const MEMORY: &str = "snapshot_receiver_relay_memory_bytes";

/// Describes every metric a relay sets through the [`metrics`]
/// facade (`describe_counter!` / `describe_gauge!`: the `# HELP` text in
/// Prometheus) to the recorder installed now; once, after installing it.
pub fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge};
    describe_counter!(ATTEMPTS, "Handler calls (forward attempts), by relay.");
    describe_counter!(
        DELIVERIES,
        "Effects the handler accepted, by relay; a re-send counts again."
    );
    describe_counter!(REFUSALS, "Handler refusals, by relay.");
    describe_gauge!(IN_FLIGHT, "Effects with the handler now, by relay.");
    describe_gauge!(POSITION, "The relay's saved cursor (outbox position).");
    describe_gauge!(LAG_EFFECTS, "Effects after the relay's cursor.");
    describe_gauge!(
        LAG_SECONDS,
        "Age of the oldest effect the relay has not delivered, parked or not."
    );
    describe_gauge!(
        PARKED,
        "Effects the relay parked (retrying, failed or waiting)."
    );
    describe_gauge!(FAILED, "Effects the relay parked failed.");
    describe_counter!(
        MISSED,
        "Effects after the relay's cursor it resumed past because the outbox no longer held them."
    );
    describe_gauge!(
        BACKLOGGED,
        "1 while the relay is backlogged: its parked effects fill their part of the memory budget, its cursor stops until parked ones go."
    );
    describe_gauge!(
        MEMORY,
        "What the relay holds in memory, in bytes: its parked effects' heads and the round in hand."
    );
    describe_counter!(
        COALESCED,
        "Effects passed because a newer one of their object was sent in their place, by relay."
    );
}

impl Runner {
    /// Runs `f` on the store's connection, on a blocking thread.
    async fn store<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut dyn OutboxStore) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || {
            let mut guard = crate::locks::lock(&store);
            f(guard.as_mut())
        })
        .await
        .map_err(|e| StoreError::Failed(format!("a relay's store call stopped: {e}")))?
    }

    /// The driver's settings from the options: the jitter seeded from
    /// this run's name.
    fn settings(&self) -> RelaySettings {
        use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
        let o = &self.options;
        RelaySettings {
            batch: o.batch,
            concurrency: o.concurrency,
            poll_interval: o.poll_interval,
            schedule: o.schedule.clone(),
            lease: o.lease,
            coalesce: o.coalesce,
            seed: BuildHasherDefault::<DefaultHasher>::default().hash_one(&self.owner),
            save_every: o.save_every,
            memory: self.memory,
        }
    }

    /// Opens the relay's row as this run and, when it holds the lease, reads
    /// its parked effects.
    async fn open(
        &self,
        lease: Duration,
    ) -> Result<
        (
            crate::core::relay::RelayRow,
            Vec<crate::core::relay::ParkedEffect>,
        ),
        StoreError,
    > {
        let (name, owner, start) = (
            self.options.name.clone(),
            self.owner.clone(),
            self.options.start,
        );
        self.store(move |s| {
            let start = match start {
                RelayStart::Beginning => 0,
                RelayStart::End => s.last_position()?,
            };
            let row = s.open_relay(&name, start, Some(&owner), SystemTime::now(), lease)?;
            let parked = if row.owner.as_deref() == Some(owner.as_str()) {
                s.parked(&name)?
            } else {
                Vec::new()
            };
            Ok((row, parked))
        })
        .await
    }

    /// Logs and counts what the driver noticed.
    fn notices(&self, driver: &mut RelayDriver) {
        let relay = &self.options.name;
        for notice in driver.notices() {
            match notice {
                Notice::Held { owner } => {
                    tracing::debug!(relay = %relay, owner = ?owner, "another run holds the relay's lease; waiting for it to lapse")
                }
                Notice::OpenFailed(e) => {
                    tracing::warn!(relay = %relay, error = %e, "relay cannot open its state; trying again")
                }
                Notice::ReadFailed(e) => {
                    tracing::warn!(relay = %relay, error = %e, "relay cannot read the outbox; trying again")
                }
                Notice::Missed { after, missed } => {
                    tracing::warn!(relay = %relay, missed, after, "relay resumes past effects the outbox no longer keeps");
                    metrics::counter!(MISSED, "relay" => relay.clone()).increment(missed);
                }
                Notice::Coalesced(n) => {
                    metrics::counter!(COALESCED, "relay" => relay.clone()).increment(n);
                }
                Notice::Refused(p) => {
                    let (id, error) = (&p.effect.id, p.error.as_deref().unwrap_or(""));
                    match (p.status, p.due) {
                        (ParkedStatus::Failed, _) => tracing::warn!(
                            relay = %relay,
                            effect_id = %id,
                            object_id = %p.effect.object_id,
                            attempt = p.attempts,
                            error,
                            "effect refused and its schedule exhausted: parked failed until an operator retries or skips it"
                        ),
                        (_, Some(due)) => {
                            if let Some(suppressed) = self.refusals.admit(std::time::Instant::now())
                            {
                                tracing::warn!(
                                    relay = %relay,
                                    effect_id = %id,
                                    object_id = %p.effect.object_id,
                                    attempt = p.attempts,
                                    error,
                                    next = %crate::format_rfc3339(due),
                                    suppressed,
                                    "effect refused; tried again later (suppressed: refusals of this relay not logged in the 10 s before this one)"
                                )
                            }
                        }
                        _ => {}
                    }
                }
                Notice::Overtaken => {
                    tracing::info!(relay = %relay, "relay changed by an operator or another run; reading its state again")
                }
                Notice::SaveFailed(e) => {
                    tracing::warn!(relay = %relay, error = %e, "relay cannot save its progress; reading its state again, the round is handed out again")
                }
                Notice::RenewalOvertaken => {
                    tracing::info!(relay = %relay, "relay changed by an operator or another run during a round; the round's save will read its state again")
                }
                Notice::RenewalFailed(e) => {
                    tracing::warn!(relay = %relay, error = %e, "relay cannot renew its lease during a round")
                }
                Notice::ReleaseFailed(e) => {
                    tracing::warn!(relay = %relay, error = %e, "relay could not let its lease go; it lapses")
                }
                Notice::Backlogged { parked, bytes } => tracing::warn!(
                    relay = %relay, parked, bytes, ceiling = self.memory / 2,
                    "relay backlogged: its {parked} parked effects fill their part of the memory budget; \
                     its cursor stops until parked effects are delivered, skipped or retried"
                ),
                Notice::BacklogCleared { parked } => tracing::info!(
                    relay = %relay, parked,
                    "relay no longer backlogged: it reads new effects again"
                ),
                Notice::CatchUp(CatchUpLine::Started { position, last }) => tracing::info!(
                    relay = %relay, position, last,
                    "relay catching up: {} effects behind", last - position
                ),
                Notice::CatchUp(CatchUpLine::Progress {
                    position,
                    last,
                    rate,
                }) => tracing::info!(
                    relay = %relay, position, last,
                    "relay catching up: position {position} of {last}, {} behind, {rate:.0} effects/s",
                    last.saturating_sub(position)
                ),
                Notice::CatchUp(CatchUpLine::Done { passed, took }) => tracing::info!(
                    relay = %relay, passed,
                    "relay caught up: passed {passed} effects in {:.1} s", took.as_secs_f64()
                ),
            }
        }
    }

    /// Sets the relay's gauges from the driver's counts: its cursor, what
    /// it parked, and its lag (effects after its cursor, and the age of the
    /// oldest effect not delivered yet).
    fn gauges(&self, driver: &RelayDriver) {
        let p = driver.progress();
        let label = [("relay", self.options.name.clone())];
        metrics::gauge!(POSITION, &label).set(p.position as f64);
        metrics::gauge!(PARKED, &label).set(p.parked as f64);
        metrics::gauge!(FAILED, &label).set(p.failed as f64);
        metrics::gauge!(BACKLOGGED, &label).set(f64::from(u8::from(p.backlogged)));
        metrics::gauge!(MEMORY, &label).set(p.memory as f64);
        let age = driver
            .oldest()
            .and_then(|at| SystemTime::now().duration_since(at).ok())
            .unwrap_or_default();
        metrics::gauge!(LAG_EFFECTS, &label).set(p.last.saturating_sub(p.position) as f64);
        metrics::gauge!(LAG_SECONDS, &label).set(age.as_secs_f64());
    }

    /// Does what the driver says until it stops: store calls on a blocking
    /// thread, handler calls as tasks (at most one per object), waits that
    /// end early when an answer comes or the relay is asked to stop.
    async fn run(mut self) -> Result<(), RelayError> {
        let mut driver = RelayDriver::new(self.owner.clone(), self.settings(), SystemTime::now());
        let label = [("relay", self.options.name.clone())];
        let in_flight = metrics::gauge!(IN_FLIGHT, &label);
        let (attempts, deliveries, refusals) = (
            metrics::counter!(ATTEMPTS, &label),
            metrics::counter!(DELIVERIES, &label),
            metrics::counter!(REFUSALS, &label),
        );
        let count = |answer: &Result<(), HandlerError>| {
            if answer.is_ok() {
                deliveries.increment(1);
            } else {
                refusals.increment(1);
            }
        };
        let mut tasks: JoinSet<Result<(), HandlerError>> = JoinSet::new();
        let mut chain_of = HashMap::new();
        // Whether a stop can still be asked (the `Relay` handle is alive).
        let mut stoppable = true;
        loop {
            if stoppable && *self.stopped.borrow() {
                driver.stop();
            }
            match driver.next(SystemTime::now()) {
                Next::Open { lease } => {
                    let opened = self.open(lease).await;
                    driver.opened(opened, SystemTime::now());
                }
                Next::Measure { after } => {
                    let measured = self
                        .store(move |s| {
                            let next = s.effects_after(after, 1)?;
                            Ok((s.last_position()?, next.first().map(|e| e.at)))
                        })
                        .await;
                    driver.measured(measured, SystemTime::now());
                    self.gauges(&driver);
                }
                Next::Read {
                    parked,
                    after,
                    limit,
                    max_bytes,
                } => {
                    let read = self
                        .store(move |s| {
                            let parked = if parked.is_empty() {
                                Vec::new()
                            } else {
                                s.effects_at(&parked)?
                            };
                            let new = if limit == 0 {
                                Vec::new()
                            } else {
                                s.effects_within(after, limit, max_bytes)?
                            };
                            Ok(RoundRead { parked, new })
                        })
                        .await;
                    driver.read(read, SystemTime::now());
                }
                Next::Send { chain, effect } => {
                    attempts.increment(1);
                    // A handler whose answer is ready at once (an
                    // in-process one) answers here, without a task.
                    match call(self.handler.as_ref(), effect) {
                        Err(answer) => {
                            count(&answer);
                            driver.answered(chain, answer);
                        }
                        Ok(call) => {
                            in_flight.increment(1.0);
                            let task = tasks.spawn(call);
                            chain_of.insert(task.id(), chain);
                        }
                    }
                }
                Next::Save {
                    generation,
                    save,
                    lease,
                    ..
                } => {
                    let (name, owner) = (self.options.name.clone(), self.owner.clone());
                    let saved = self
                        .store(move |s| {
                            s.save_relay(&name, generation, &owner, &save, SystemTime::now(), lease)
                        })
                        .await;
                    driver.saved(saved, SystemTime::now());
                    self.gauges(&driver);
                }
                Next::Wait { wait, answers } => {
                    let sleep = tokio::time::sleep(wait.unwrap_or(STORE_RETRY));
                    tokio::select! {
                        Some(joined) = tasks.join_next_with_id(), if answers && !tasks.is_empty() => {
                            in_flight.decrement(1.0);
                            let (id, answer) = match joined {
                                Ok((id, answer)) => (id, answer),
                                // A handler that panicked delivered
                                // nothing we can trust: a refusal.
                                Err(e) => (e.id(), Err(HandlerError::new(format!("the handler panicked: {e}")))),
                            };
                            count(&answer);
                            if let Some(chain) = chain_of.remove(&id) {
                                driver.answered(chain, answer);
                            }
                        }
                        () = sleep => {}
                        changed = self.stopped.changed(), if stoppable => {
                            if changed.is_err() {
                                stoppable = false;
                            } else if *self.stopped.borrow() {
                                driver.stop();
                            }
                        }
                    }
                }
                Next::Stop => break,
            }
            self.notices(&mut driver);
            self.counted.set(driver.progress().memory);
            self.progress.send_if_modified(|p| {
                let changed = p != driver.progress();
                if changed {
                    p.clone_from(driver.progress());
                }
                changed
            });
        }
        Ok(())
    }
}

/// Hands `effect` to `handler` and polls the call once: `Err` with its
/// answer when that gives it, else `Ok` with the call, to spawn (it is
/// polled again with the task's own waker). A panic in the handler is a
/// refusal, as in a spawned call.
fn call(handler: &dyn Handler, effect: Effect) -> Result<HandlerFuture, Result<(), HandlerError>> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let first = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut call = handler.handle(effect);
        match call.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(answer) => Err(answer),
            std::task::Poll::Pending => Ok(call),
        }
    }));
    first.unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_owned());
        Err(Err(HandlerError::new(format!(
            "the handler panicked: {what}"
        ))))
    })
}

#[cfg(test)]
mod tests {
    use super::{RelayBytes, RelayOptions, MAX_WAIT};
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    use std::sync::Arc;
    use std::time::Duration;

    /// A name has 1 to 200 characters, counted as characters (not bytes):
    /// 200 pass, 201 do not.
    #[test]
    fn a_relay_name_has_1_to_200_characters() {
        let long = "must be 1 to 200 characters";
        for (name, problem) in [
            (String::new(), Some(long)),
            ("a".to_owned(), None),
            ("a".repeat(199), None),
            ("a".repeat(200), None),
            ("é".repeat(200), None),
            ("a".repeat(201), Some(long)),
            ("a".repeat(1000), Some(long)),
        ] {
            assert_eq!(
                RelayOptions::name_problem(&name),
                problem,
                "{} characters",
                name.chars().count()
            );
        }
    }

    /// The options' limits are inclusive: a lease of exactly 1 s and a
    /// schedule entry of exactly the longest wait are accepted, a
    /// nanosecond past either is not.
    #[test]
    fn the_lease_and_schedule_limits_accept_their_bounds() {
        let with = |lease: Duration, wait: Duration| RelayOptions {
            lease,
            schedule: vec![Duration::from_secs(1), wait],
            ..RelayOptions::new("app")
        };
        let one = Duration::from_secs(1);
        let nano = Duration::from_nanos(1);
        assert!(with(one, MAX_WAIT).check().is_ok());
        assert_eq!(
            with(one - nano, MAX_WAIT).check().unwrap_err().to_string(),
            "relay options: lease: 999.999999ms is below 1 s"
        );
        assert_eq!(
            with(one, MAX_WAIT + nano).check().unwrap_err().to_string(),
            "relay options: schedule entry 2 (86400 s): above the longest wait, 86400 s (24 h)"
        );
    }

    /// Each relay moves the receiver's total by the change of its own
    /// figure, up and down, and takes its figure away when dropped.
    #[test]
    fn a_relays_figure_moves_the_total_by_its_change_and_goes_with_it() {
        let total = Arc::new(AtomicUsize::new(0));
        let counted = || RelayBytes {
            total: total.clone(),
            mine: 0,
        };
        let (mut a, mut b) = (counted(), counted());
        a.set(1000);
        b.set(300);
        assert_eq!(total.load(Relaxed), 1300);
        a.set(400);
        assert_eq!(total.load(Relaxed), 700);
        a.set(400);
        assert_eq!(total.load(Relaxed), 700);
        b.set(900);
        assert_eq!(total.load(Relaxed), 1300);
        drop(a);
        assert_eq!(total.load(Relaxed), 900);
        b.set(0);
        assert_eq!(total.load(Relaxed), 0);
        drop(b);
        assert_eq!(total.load(Relaxed), 0);
    }
}
