//! Durable named relays (docs/CONTRACT.md §10): a task that reads the
//! outbox by position and hands every effect to an async [`Handler`],
//! keeping its cursor in the receiver's store.
//!
//! - **At least once.** A relay's cursor (and what it parked) is saved in
//!   one store transaction after the handlers of a round returned, so an
//!   effect whose handler succeeded may be handed out again after a crash
//!   (never one that was not handed out). The effect's id
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
//! - **Named and leased.** Relays of different names progress
//!   independently. One run at a time holds a relay (a lease in the store,
//!   renewed as it saves and during long rounds); a restarted relay
//!   resumes at its cursor, and an operator's retry, skip or rewind makes
//!   the running relay read its state again.
//!
//! The planning of a round (what each object hands out next, what is
//! parked) is plain synchronous code (`Plan`); the task around it reads
//! and saves through the store's own connection on a blocking thread.

use crate::core::engine::Effect;
use crate::core::write::{ParkedEffect, ParkedStatus, RelayRow, RelaySave};
use crate::store::{OutboxStore, StoreError};
use crate::Receiver;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// The retry schedule of the senders the relay's destinations know (Svix's):
/// after a refused first attempt, tries again after 5 s, 5 min, 30 min,
/// 2 h, 5 h, 10 h and 10 h, eight attempts in all.
pub const DEFAULT_SCHEDULE: [Duration; 7] = [
    Duration::from_secs(5),
    Duration::from_secs(5 * 60),
    Duration::from_secs(30 * 60),
    Duration::from_secs(2 * 3600),
    Duration::from_secs(5 * 3600),
    Duration::from_secs(10 * 3600),
    Duration::from_secs(10 * 3600),
];

/// The longest a relay waits between two attempts at an effect (24 h): a
/// longer [`HandlerError::retry_after`] (a destination's `Retry-After`)
/// counts as this, and [`RelayOptions::schedule`] entries above it are
/// refused.
pub const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

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
    /// entries is parked `failed`. A handler's
    /// [`HandlerError::retry_after`] lengthens a wait, never shortens it.
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

/// A handler's refusal of an effect: it is tried again on the relay's
/// schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandlerError {
    /// Why, in words (kept with the parked effect).
    pub message: String,
    /// The destination asked to wait at least this long (an HTTP
    /// `Retry-After`, for example).
    pub retry_after: Option<Duration>,
}

impl HandlerError {
    /// A refusal for `message`.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retry_after: None,
        }
    }

    /// The same refusal, asking to wait at least `wait`.
    pub fn retry_after(mut self, wait: Duration) -> Self {
        self.retry_after = Some(wait);
        self
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for HandlerError {}

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

/// A running relay's counts, as its last round left them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RelayProgress {
    /// Its cursor as last saved: every effect at or below it was delivered
    /// or parked.
    pub position: u64,
    /// Effects the handler accepted in this run (a re-send counts again;
    /// a coalesced send counts every effect it stands for).
    pub delivered: u64,
    /// Of those, effects passed without a handler call of their own: a
    /// newer effect of their object was sent in their place
    /// ([`RelayOptions::coalesce`]).
    pub coalesced: u64,
    /// Handler calls in this run.
    pub attempts: u64,
    /// Handler refusals in this run.
    pub refusals: u64,
    /// Effects parked now (retrying, failed or waiting behind one).
    pub parked: usize,
    /// Of those, parked `failed` (their schedule exhausted).
    pub failed: usize,
    /// The outbox's last position when the round ended: `last - position`
    /// effects are still to be handed out.
    pub last: u64,
    /// Effects the relay resumed past because the outbox no longer held
    /// them (in memory, evicted; with a store, purged before the relay
    /// existed), in this run.
    pub missed: u64,
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

impl Relay {
    /// The counts as the last round left them.
    pub fn progress(&self) -> RelayProgress {
        self.progress.borrow().clone()
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
        let runner = Runner {
            store: Arc::new(Mutex::new(store)),
            owner: run_id(&options.name),
            options,
            handler: Arc::new(handler),
            progress: publish,
            stopped,
        };
        let task = tokio::spawn(runner.run());
        Ok(Relay {
            stop,
            task,
            progress,
        })
    }
}

/// One object's effects handed out in one round, in position order: its
/// first parked effect being retried (and those waiting behind it), then
/// its new ones. Made by [`Plan::round`].
///
/// Public (and hidden from the documentation) for the cluster simulation,
/// which drives a relay by these same rules; not a stable API.
#[doc(hidden)]
#[derive(Debug)]
pub struct Chain {
    /// The effects, with what each was parked as (`None`: new).
    items: Vec<(Effect, Option<ParkedEffect>)>,
}

impl Chain {
    /// What the handler is given for this chain, in order: every effect;
    /// or, coalescing several, only the newest, naming the others in its
    /// [`Effect::replaces`]. The handler is given them one at a time,
    /// the next only once the previous one was accepted.
    pub fn sends(&self, coalesce: bool) -> Vec<Effect> {
        match self.items.split_last() {
            Some(((newest, _), earlier)) if coalesce && !earlier.is_empty() => {
                let mut newest = newest.clone();
                newest.replaces = earlier
                    .iter()
                    .map(|(e, _)| crate::Replaced::from(e))
                    .collect();
                vec![newest]
            }
            _ => self.items.iter().map(|(e, _)| e.clone()).collect(),
        }
    }

    /// The chain's effects, in position order.
    pub fn effects(&self) -> impl Iterator<Item = &Effect> {
        self.items.iter().map(|(e, _)| e)
    }

    /// What became of the chain when the handler accepted the first
    /// `accepted` of its [`Chain::sends`] (same `coalesce`) and then
    /// refused the next with `refused` (`None`: it accepted them all). A
    /// coalesced send stands for the whole chain: accepted, every effect
    /// is delivered; refused, none is.
    pub fn outcome(
        self,
        accepted: usize,
        refused: Option<HandlerError>,
        coalesce: bool,
    ) -> Outcome {
        let items = self.items.len();
        let delivered = if coalesce && items > 1 {
            if accepted >= 1 {
                items
            } else {
                0
            }
        } else {
            accepted.min(items)
        };
        Outcome {
            chain: self,
            delivered,
            refused,
        }
    }
}

/// What became of a chain: how many of its items were delivered, and the
/// refusal of the next one, if any (the rest were not handed out). Made
/// by [`Chain::outcome`], given to [`Plan::settle`].
#[doc(hidden)]
#[derive(Debug)]
pub struct Outcome {
    /// The chain as it was handed out.
    chain: Chain,
    /// Items delivered, from the first.
    delivered: usize,
    /// The refusal that stopped it (of item `delivered`).
    refused: Option<HandlerError>,
}

impl Outcome {
    /// Effects of the chain delivered, from its first.
    pub fn delivered(&self) -> usize {
        self.delivered
    }
}

/// A relay's state between rounds, and the planning of a round: plain
/// synchronous code, so that the rules can be tested without a store or
/// a runtime. The relay's task ([`Receiver::relay`]) runs a round as:
/// read the effects after [`Plan::position`], [`Plan::round`], hand each
/// chain's [`Chain::sends`] to the handler one after the other (stopping
/// at a refusal), [`Plan::settle`] the [`Chain::outcome`]s, save the
/// [`RelaySave`] in one store transaction ([`OutboxStore::save_relay`],
/// conditioned on [`Plan::generation`]) and, once saved, [`Plan::saved`].
///
/// Public (and hidden from the documentation) for the cluster simulation,
/// which runs relays on these same rules; not a stable API.
#[doc(hidden)]
#[derive(Debug)]
pub struct Plan {
    /// The relay's row as last read or saved.
    row: RelayRow,
    /// Its parked effects, by position.
    parked: BTreeMap<u64, ParkedEffect>,
    /// The waits between attempts ([`RelayOptions::schedule`]).
    schedule: Vec<Duration>,
}

impl Plan {
    /// The state of a relay whose row was read as `row` (its lease held by
    /// this run) with its `parked` effects, retrying refused effects after
    /// the waits of `schedule` ([`RelayOptions::schedule`]).
    pub fn new(row: RelayRow, parked: Vec<ParkedEffect>, schedule: Vec<Duration>) -> Self {
        Self {
            row,
            parked: parked.into_iter().map(|p| (p.effect.position, p)).collect(),
            schedule,
        }
    }

    /// The cursor as last read or saved: the next round reads the effects
    /// after it.
    pub fn position(&self) -> u64 {
        self.row.position
    }

    /// The relay's generation as read: a save names it.
    pub fn generation(&self) -> u64 {
        self.row.generation
    }

    /// The effects parked now, by position.
    pub fn parked(&self) -> impl Iterator<Item = &ParkedEffect> {
        self.parked.values()
    }

    /// The chains of a round at `now`: every object whose first parked
    /// effect is due (or waiting: the one before it is gone) starts with
    /// it and those parked behind it; objects with nothing parked go with
    /// their new effects. New effects of an object whose first parked
    /// effect is not due are parked `waiting` (returned apart).
    pub fn round(&self, now: SystemTime, new: Vec<Effect>) -> (Vec<Chain>, Vec<ParkedEffect>) {
        let mut chains: Vec<Chain> = Vec::new();
        let mut chain_of: HashMap<Arc<str>, usize> = HashMap::new();
        let mut blocked: HashSet<Arc<str>> = HashSet::new();
        // In position order: an object's first parked effect is its head.
        for p in self.parked.values() {
            let object = &p.effect.object_id;
            if blocked.contains(object) {
                continue;
            }
            if let Some(&i) = chain_of.get(object) {
                chains[i].items.push((p.effect.clone(), Some(p.clone())));
                continue;
            }
            let due = match p.status {
                ParkedStatus::Waiting => true,
                ParkedStatus::Retrying => p.due.is_none_or(|d| d <= now),
                ParkedStatus::Failed => false,
            };
            if due {
                chain_of.insert(object.clone(), chains.len());
                chains.push(Chain {
                    items: vec![(p.effect.clone(), Some(p.clone()))],
                });
            } else {
                blocked.insert(object.clone());
            }
        }
        let mut waiting = Vec::new();
        for effect in new {
            if self.parked.contains_key(&effect.position) {
                // Read again after a rewind that kept it parked.
                continue;
            }
            if blocked.contains(&effect.object_id) {
                waiting.push(ParkedEffect {
                    effect,
                    status: ParkedStatus::Waiting,
                    attempts: 0,
                    due: None,
                    error: None,
                    updated: now,
                });
            } else if let Some(&i) = chain_of.get(&effect.object_id) {
                chains[i].items.push((effect, None));
            } else {
                chain_of.insert(effect.object_id.clone(), chains.len());
                chains.push(Chain {
                    items: vec![(effect, None)],
                });
            }
        }
        (chains, waiting)
    }

    /// What a round's `outcomes` change, at `now`, with the `waiting`
    /// effects [`Plan::round`] parked and the cursor moved to `position`:
    /// the save to make. Delivered parked effects are unparked; a refused
    /// effect is parked `retrying` (due after the schedule's next wait,
    /// or the destination's longer one) or `failed` when its schedule is
    /// exhausted; the effects behind it are parked `waiting`.
    pub fn settle(
        &self,
        now: SystemTime,
        outcomes: Vec<Outcome>,
        waiting: Vec<ParkedEffect>,
        position: u64,
    ) -> RelaySave {
        let mut save = RelaySave {
            park: waiting,
            unpark: Vec::new(),
            position: position.max(self.row.position),
        };
        for outcome in outcomes {
            let mut items = outcome.chain.items.into_iter();
            for (_, parked) in items.by_ref().take(outcome.delivered) {
                if let Some(p) = parked {
                    save.unpark.push(p.effect.position);
                }
            }
            let Some(refusal) = outcome.refused else {
                continue;
            };
            if let Some((effect, parked)) = items.next() {
                let attempts = parked.map_or(0, |p| p.attempts).saturating_add(1);
                let wait = self
                    .schedule
                    .get(usize::try_from(attempts - 1).unwrap_or(usize::MAX))
                    .map(|w| refusal.retry_after.map_or(*w, |r| r.max(*w)).min(MAX_WAIT));
                save.park.push(ParkedEffect {
                    effect,
                    status: if wait.is_some() {
                        ParkedStatus::Retrying
                    } else {
                        ParkedStatus::Failed
                    },
                    attempts,
                    due: wait.map(|w| now.checked_add(w).unwrap_or(now)),
                    error: Some(refusal.message),
                    updated: now,
                });
            }
            for (effect, parked) in items {
                if parked.is_none() {
                    save.park.push(ParkedEffect {
                        effect,
                        status: ParkedStatus::Waiting,
                        attempts: 0,
                        due: None,
                        error: None,
                        updated: now,
                    });
                }
            }
        }
        save
    }

    /// Takes a save the store accepted into the state.
    pub fn saved(&mut self, save: RelaySave, now: SystemTime) {
        for position in &save.unpark {
            self.parked.remove(position);
        }
        for p in save.park {
            self.parked.insert(p.effect.position, p);
        }
        self.row.position = save.position;
        self.row.updated = now;
    }

    /// Takes the result of a round's save (`Ok((save, held))` as
    /// [`OutboxStore::save_relay`] answered for `save`, the round ended at
    /// `now`) into the state: saved, the save is [`Plan::saved`]; refused
    /// as stale, or failed, the state is kept and the relay must read its
    /// row and parked effects again ([`AfterSave::reopen_after`]) before
    /// its next round: a save that failed may have committed all the same
    /// (its answer lost with the connection), and a plan that did not take
    /// it would hand its parked effects out as new ones and leave them
    /// parked in the store.
    pub fn after_save(
        &mut self,
        result: Result<(RelaySave, bool), StoreError>,
        now: SystemTime,
    ) -> AfterSave {
        match result {
            Ok((save, true)) => {
                self.saved(save, now);
                AfterSave::Saved
            }
            Ok((_, false)) => AfterSave::Overtaken,
            Err(e) => AfterSave::Failed(e),
        }
    }

    /// When the first parked effect that is not due becomes due.
    pub fn next_due(&self) -> Option<SystemTime> {
        self.parked
            .values()
            .filter(|p| p.status == ParkedStatus::Retrying)
            .filter_map(|p| p.due)
            .min()
    }
}

/// What became of a round's save ([`Plan::after_save`]).
///
/// Public (and hidden from the documentation) for the cluster simulation;
/// not a stable API.
#[doc(hidden)]
#[derive(Debug)]
pub enum AfterSave {
    /// Saved: the next round goes on from the new cursor.
    Saved,
    /// Refused: an operator or another run changed the relay meanwhile
    /// (what this round delivered may be handed out again).
    Overtaken,
    /// The store failed: nothing, or everything, was saved.
    Failed(StoreError),
}

impl AfterSave {
    /// How long the relay waits before it reads its row and parked effects
    /// again (`None`: it does not, it was saved): at once when overtaken,
    /// after [`STORE_RETRY`] when the store failed.
    pub fn reopen_after(&self) -> Option<Duration> {
        match self {
            AfterSave::Saved => None,
            AfterSave::Overtaken => Some(Duration::ZERO),
            AfterSave::Failed(_) => Some(STORE_RETRY),
        }
    }
}

/// The relay's task.
struct Runner {
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

/// A relay this many effects behind is catching up: it logs its progress.
pub const CATCH_UP_EFFECTS: u64 = 1000;
/// How often a catching-up relay logs its progress.
pub const CATCH_UP_EVERY: Duration = Duration::from_secs(10);

/// A line a catching-up relay logs ([`CatchUp::observe`]).
#[derive(Clone, Debug, PartialEq)]
pub enum CatchUpLine {
    /// It fell [`CATCH_UP_EFFECTS`] or more behind.
    Started {
        /// Its cursor.
        position: u64,
        /// The outbox's last position.
        last: u64,
    },
    /// Still behind, [`CATCH_UP_EVERY`] after the previous line.
    Progress {
        /// Its cursor.
        position: u64,
        /// The outbox's last position.
        last: u64,
        /// Effects passed per second since the previous line.
        rate: f64,
    },
    /// Back within one round's batch ([`RelayOptions::batch`]) of the
    /// last position.
    Done {
        /// Effects passed since it started catching up.
        passed: u64,
        /// How long it took.
        took: Duration,
    },
}

/// When a relay logs its progress on a long catch-up: once it is
/// [`CATCH_UP_EFFECTS`] behind, at most every [`CATCH_UP_EVERY`] while it
/// stays behind, and once when it is back within a batch of the last
/// position. Plain synchronous code, given the instants, so that it is
/// tested without a clock.
#[derive(Debug)]
pub struct CatchUp {
    /// It is back when this close to the last position.
    within: u64,
    /// Since when, from which position, it is catching up; and the last
    /// line's instant and position.
    behind: Option<(std::time::Instant, u64, std::time::Instant, u64)>,
}

impl CatchUp {
    /// A relay not catching up, back once within `batch` effects of the
    /// last position.
    pub fn new(batch: usize) -> Self {
        Self {
            within: u64::try_from(batch).unwrap_or(u64::MAX),
            behind: None,
        }
    }

    /// The line to log (if any) when the relay's cursor is `position` and
    /// the outbox's last position is `last` at `now`.
    pub fn observe(
        &mut self,
        now: std::time::Instant,
        position: u64,
        last: u64,
    ) -> Option<CatchUpLine> {
        let lag = last.saturating_sub(position);
        match self.behind {
            None if lag >= CATCH_UP_EFFECTS => {
                self.behind = Some((now, position, now, position));
                Some(CatchUpLine::Started { position, last })
            }
            None => None,
            Some((since, from, _, _)) if lag <= self.within => {
                self.behind = None;
                Some(CatchUpLine::Done {
                    passed: position.saturating_sub(from),
                    took: now.saturating_duration_since(since),
                })
            }
            Some((since, from, said, at)) => {
                let gap = now.saturating_duration_since(said);
                if gap < CATCH_UP_EVERY {
                    return None;
                }
                self.behind = Some((since, from, now, position));
                Some(CatchUpLine::Progress {
                    position,
                    last,
                    rate: position.saturating_sub(at) as f64 / gap.as_secs_f64(),
                })
            }
        }
    }
}

/// How long a relay waits after a store error before it tries again.
pub const STORE_RETRY: Duration = Duration::from_millis(500);

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

    /// Waits `wait`, or less when the relay is asked to stop; whether it
    /// was.
    async fn pause(&mut self, wait: Duration) -> bool {
        if *self.stopped.borrow() {
            return true;
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = self.stopped.changed() => {}
        }
        *self.stopped.borrow()
    }

    /// The relay's state, once this run holds its lease; `None` when asked
    /// to stop first. Store errors are logged and tried again.
    async fn open(&mut self) -> Option<Plan> {
        loop {
            match self.try_open().await {
                Ok(Some(plan)) => return Some(plan),
                Ok(None) => {
                    // Another run holds it: wait for its lease to lapse.
                    let wait = (self.options.lease / 4).min(Duration::from_secs(1));
                    if self.pause(wait).await {
                        return None;
                    }
                }
                Err(e) => {
                    tracing::warn!(relay = %self.options.name, error = %e, "relay cannot open its state; trying again");
                    if self.pause(STORE_RETRY).await {
                        return None;
                    }
                }
            }
        }
    }

    async fn try_open(&self) -> Result<Option<Plan>, StoreError> {
        let (name, owner, lease) = (
            self.options.name.clone(),
            self.owner.clone(),
            self.options.lease,
        );
        let start = self.options.start;
        let row = self
            .store(move |s| {
                let start = match start {
                    RelayStart::Beginning => 0,
                    RelayStart::End => s.last_position()?,
                };
                s.open_relay(&name, start, Some(&owner), SystemTime::now(), lease)
            })
            .await?;
        if row.owner.as_deref() != Some(self.owner.as_str()) {
            return Ok(None);
        }
        let name = self.options.name.clone();
        let parked = self.store(move |s| s.parked(&name)).await?;
        Ok(Some(Plan::new(row, parked, self.options.schedule.clone())))
    }

    /// Saves `save` as this run; `Ok(false)` when the relay was changed
    /// meanwhile (an operator, or another run that took it over).
    async fn save(
        &self,
        plan: &Plan,
        save: RelaySave,
        lease: Duration,
    ) -> Result<(RelaySave, bool), StoreError> {
        let (name, owner, generation) = (
            self.options.name.clone(),
            self.owner.clone(),
            plan.row.generation,
        );
        self.store(move |s| {
            let held = s.save_relay(&name, generation, &owner, &save, SystemTime::now(), lease)?;
            Ok((save, held))
        })
        .await
    }

    /// Hands the chains out, at most [`RelayOptions::concurrency`] at once,
    /// each object's effects one after the other; counts into `counts`.
    /// Logs what a round parked after a refusal: at info each effect to
    /// be tried again (when, and why), at warn each whose schedule is
    /// exhausted (parked `failed` until an operator acts).
    fn log_refusals(&self, save: &RelaySave) {
        for p in &save.park {
            let (id, error) = (&p.effect.id, p.error.as_deref().unwrap_or(""));
            match (p.status, p.due) {
                (ParkedStatus::Failed, _) => tracing::warn!(
                    relay = %self.options.name,
                    effect = %id,
                    object = %p.effect.object_id,
                    attempts = p.attempts,
                    error,
                    "effect refused and its schedule exhausted: parked failed until an operator retries or skips it"
                ),
                (ParkedStatus::Retrying, Some(due)) => tracing::info!(
                    relay = %self.options.name,
                    effect = %id,
                    object = %p.effect.object_id,
                    attempts = p.attempts,
                    error,
                    next = %crate::format_rfc3339(due),
                    "effect refused; tried again later"
                ),
                _ => {}
            }
        }
    }

    /// Hands `chains` out as [`Runner::hand_out`] does, renewing the lease
    /// every third of it meanwhile: a round longer than the lease (slow
    /// answers, long chains) keeps the relay, instead of letting another
    /// run take it over and hand the same effects out again. A renewal
    /// writes the lease only (the cursor as `plan` has it).
    async fn hand_out_renewing(
        &self,
        plan: &Plan,
        chains: Vec<Chain>,
        counts: &mut RelayProgress,
    ) -> Vec<Outcome> {
        let handing = self.hand_out(chains, counts);
        tokio::pin!(handing);
        loop {
            tokio::select! {
                outcomes = &mut handing => return outcomes,
                () = tokio::time::sleep(self.options.lease / 3) => {
                    let renewal = RelaySave {
                        position: plan.position(),
                        ..RelaySave::default()
                    };
                    match self.save(plan, renewal, self.options.lease).await {
                        Ok((_, true)) => {}
                        Ok((_, false)) => tracing::info!(relay = %self.options.name, "relay changed by an operator or another run during a round; the round's save will read its state again"),
                        Err(e) => tracing::warn!(relay = %self.options.name, error = %e, "relay cannot renew its lease during a round"),
                    }
                }
            }
        }
    }

    async fn hand_out(&self, chains: Vec<Chain>, counts: &mut RelayProgress) -> Vec<Outcome> {
        let mut slots: Vec<Option<Chain>> = chains.into_iter().map(Some).collect();
        let mut outcomes = Vec::with_capacity(slots.len());
        let mut tasks = JoinSet::new();
        let mut index_of = HashMap::new();
        let mut next = 0;
        loop {
            while next < slots.len() && tasks.len() < self.options.concurrency {
                let effects: Vec<Effect> = slots[next]
                    .as_ref()
                    .map(|c| c.sends(self.options.coalesce))
                    .unwrap_or_default();
                let handler = self.handler.clone();
                let name = self.options.name.clone();
                let task = tasks.spawn(async move {
                    let label = [("relay", name)];
                    let in_flight = metrics::gauge!(IN_FLIGHT, &label);
                    let mut delivered = 0;
                    for effect in effects {
                        metrics::counter!(ATTEMPTS, &label).increment(1);
                        in_flight.increment(1.0);
                        let answer = handler.handle(effect).await;
                        in_flight.decrement(1.0);
                        if let Err(refusal) = answer {
                            metrics::counter!(REFUSALS, &label).increment(1);
                            return (delivered, Some(refusal));
                        }
                        metrics::counter!(DELIVERIES, &label).increment(1);
                        delivered += 1;
                    }
                    (delivered, None)
                });
                index_of.insert(task.id(), next);
                next += 1;
            }
            let Some(joined) = tasks.join_next_with_id().await else {
                break;
            };
            let (id, delivered, refused) = match joined {
                Ok((id, (delivered, refused))) => (id, delivered, refused),
                // A handler that panicked delivered nothing we can trust:
                // its chain is tried again from its first effect.
                Err(e) => (
                    e.id(),
                    0,
                    Some(HandlerError::new(format!("the handler panicked: {e}"))),
                ),
            };
            let Some(chain) = index_of.get(&id).and_then(|&i| slots[i].take()) else {
                continue;
            };
            counts.attempts += (delivered + usize::from(refused.is_some())) as u64;
            let items = chain.items.len();
            let outcome = chain.outcome(delivered, refused, self.options.coalesce);
            if self.options.coalesce && items > 1 && outcome.delivered == items {
                // A coalesced send stood for the whole chain.
                let folded = (items - 1) as u64;
                counts.coalesced += folded;
                metrics::counter!(COALESCED, "relay" => self.options.name.clone())
                    .increment(folded);
            }
            let delivered = outcome.delivered;
            counts.delivered += delivered as u64;
            counts.refusals += u64::from(outcome.refused.is_some());
            outcomes.push(outcome);
        }
        outcomes
    }

    /// Publishes the counts and the state's, and the gauges of the
    /// relay's lag: effects after its cursor, and the age of the oldest
    /// effect not delivered yet (parked, or the first after the cursor).
    async fn publish(&self, plan: &Plan, counts: &mut RelayProgress, catch_up: &mut CatchUp) {
        counts.position = plan.row.position;
        counts.parked = plan.parked.len();
        counts.failed = plan
            .parked
            .values()
            .filter(|p| p.status == ParkedStatus::Failed)
            .count();
        let label = [("relay", self.options.name.clone())];
        metrics::gauge!(POSITION, &label).set(plan.row.position as f64);
        metrics::gauge!(PARKED, &label).set(counts.parked as f64);
        metrics::gauge!(FAILED, &label).set(counts.failed as f64);
        let after = plan.row.position;
        let read = self
            .store(move |s| {
                let next = s.effects_after(after, 1)?;
                Ok((s.last_position()?, next.first().map(|e| e.at)))
            })
            .await;
        if let Ok((last, next)) = read {
            let oldest = plan.parked.values().map(|p| p.effect.at).chain(next).min();
            let age = oldest
                .and_then(|at| SystemTime::now().duration_since(at).ok())
                .unwrap_or_default();
            metrics::gauge!(LAG_EFFECTS, &label).set(last.saturating_sub(after) as f64);
            metrics::gauge!(LAG_SECONDS, &label).set(age.as_secs_f64());
            counts.last = last;
            let relay = &self.options.name;
            match catch_up.observe(std::time::Instant::now(), after, last) {
                Some(CatchUpLine::Started { position, last }) => tracing::info!(
                    relay = %relay, position, last,
                    "relay catching up: {} effects behind", last - position
                ),
                Some(CatchUpLine::Progress {
                    position,
                    last,
                    rate,
                }) => tracing::info!(
                    relay = %relay, position, last,
                    "relay catching up: position {position} of {last}, {} behind, {rate:.0} effects/s",
                    last.saturating_sub(position)
                ),
                Some(CatchUpLine::Done { passed, took }) => tracing::info!(
                    relay = %relay, position = after, last,
                    "relay caught up: passed {passed} effects in {:.1} s", took.as_secs_f64()
                ),
                None => {}
            }
        }
        self.progress.send_replace(counts.clone());
    }

    async fn run(mut self) -> Result<(), RelayError> {
        let Some(mut plan) = self.open().await else {
            return Ok(());
        };
        let mut counts = RelayProgress::default();
        let mut catch_up = CatchUp::new(self.options.batch);
        self.publish(&plan, &mut counts, &mut catch_up).await;
        let mut renewed = std::time::Instant::now();
        loop {
            if *self.stopped.borrow() {
                break;
            }
            let (after, batch) = (plan.row.position, self.options.batch);
            let new = match self.store(move |s| s.effects_after(after, batch)).await {
                Ok(new) => new,
                Err(e) => {
                    tracing::warn!(relay = %self.options.name, error = %e, "relay cannot read the outbox; trying again");
                    self.pause(STORE_RETRY).await;
                    continue;
                }
            };
            if let Some(first) = new.first().filter(|e| e.position > after + 1) {
                // Positions have no gaps: these were no longer kept (the
                // in-memory outbox's capacity, or the store's history
                // window for a relay started after a purge).
                let missed = first.position - after - 1;
                tracing::warn!(
                    relay = %self.options.name,
                    missed,
                    after,
                    "relay resumes past effects the outbox no longer keeps"
                );
                metrics::counter!(MISSED, "relay" => self.options.name.clone()).increment(missed);
                counts.missed += missed;
            }
            let read_to = new.last().map_or(after, |e| e.position);
            let (chains, waiting) = plan.round(SystemTime::now(), new);
            let idle = chains.is_empty() && waiting.is_empty();
            if idle && renewed.elapsed() < self.options.lease / 3 {
                let wait = plan
                    .next_due()
                    .and_then(|due| due.duration_since(SystemTime::now()).ok())
                    .map_or(self.options.poll_interval, |d| {
                        d.min(self.options.poll_interval)
                    });
                self.pause(wait).await;
                continue;
            }
            let outcomes = self.hand_out_renewing(&plan, chains, &mut counts).await;
            let now = SystemTime::now();
            let save = plan.settle(now, outcomes, waiting, read_to);
            self.log_refusals(&save);
            let saved = self.save(&plan, save, self.options.lease).await;
            match plan.after_save(saved, now) {
                AfterSave::Saved => renewed = std::time::Instant::now(),
                after => {
                    match &after {
                        AfterSave::Failed(e) => {
                            tracing::warn!(relay = %self.options.name, error = %e, "relay cannot save its progress; reading its state again, the round is handed out again")
                        }
                        _ => {
                            tracing::info!(relay = %self.options.name, "relay changed by an operator or another run; reading its state again")
                        }
                    }
                    let wait = after.reopen_after().unwrap_or_default();
                    if !wait.is_zero() && self.pause(wait).await {
                        break;
                    }
                    match self.open().await {
                        Some(again) => plan = again,
                        None => return Ok(()),
                    }
                }
            }
            self.publish(&plan, &mut counts, &mut catch_up).await;
        }
        // Let the lease go: the next run takes the relay over at once.
        let release = RelaySave {
            position: plan.row.position,
            ..RelaySave::default()
        };
        if let Err(e) = self.save(&plan, release, Duration::ZERO).await {
            tracing::warn!(relay = %self.options.name, error = %e, "relay could not let its lease go; it lapses");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{CatchUp, CatchUpLine, CATCH_UP_EFFECTS, CATCH_UP_EVERY};
    use std::time::{Duration, Instant};

    #[test]
    fn a_long_catch_up_logs_when_it_starts_every_interval_and_when_it_is_done() {
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        let mut c = CatchUp::new(256);
        // Less than CATCH_UP_EFFECTS behind: nothing.
        assert_eq!(c.observe(at(0), 0, CATCH_UP_EFFECTS - 1), None);
        assert_eq!(
            c.observe(at(1), 0, 5000),
            Some(CatchUpLine::Started {
                position: 0,
                last: 5000
            })
        );
        // Within the interval: nothing.
        assert_eq!(c.observe(at(5), 1000, 5000), None);
        // An interval after the first line: the rate since it.
        assert_eq!(
            c.observe(at(1) + CATCH_UP_EVERY, 2000, 5000),
            Some(CatchUpLine::Progress {
                position: 2000,
                last: 5000,
                rate: 200.0
            })
        );
        assert_eq!(c.observe(at(12), 2500, 5000), None);
        // Under CATCH_UP_EFFECTS behind, but not within a batch: not yet.
        assert_eq!(c.observe(at(13), 4500, 5200), None);
        assert_eq!(
            c.observe(at(31), 5000, 5200),
            Some(CatchUpLine::Done {
                passed: 5000,
                took: Duration::from_secs(30)
            })
        );
        // Caught up, it stays quiet.
        assert_eq!(c.observe(at(45), 5200, 5200), None);
    }
}
