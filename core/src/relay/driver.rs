//! The loop of a relay, sans IO: [`RelayDriver::next`] answers what to do
//! next, the caller does it and reports the result. The library's relay
//! task does what it says with a store connection on a blocking thread, a
//! handler and sleeps; the cluster simulation does it with events on its
//! virtual clock; the unit tests with plain calls.

use super::catch_up::CatchUp;
use super::plan::{Chain, Outcome, Plan};
use super::{
    CatchUpLine, Effect, HandlerError, ParkedEffect, ParkedStatus, RelayRow, RelaySave, MAX_WAIT,
    PARKED_OVERHEAD, STORE_RETRY,
};
use std::collections::VecDeque;
use std::fmt::Display;
use std::time::{Duration, SystemTime};

/// How a relay runs (the library's `RelayOptions` without the name and
/// the start, which only opening the row needs).
#[derive(Clone, Debug)]
pub struct RelaySettings {
    /// Most effects read from the outbox per round (at least 1).
    pub batch: usize,
    /// Most objects whose effects are with the destination at once (at
    /// least 1).
    pub concurrency: usize,
    /// How long the relay waits before reading again when the outbox had
    /// nothing new.
    pub poll_interval: Duration,
    /// The waits between a refused attempt and the next one, each
    /// jittered ([`Jitter`]); an effect refused once more than this has
    /// entries is parked `failed`.
    pub schedule: Vec<Duration>,
    /// How long the relay's hold on its name lasts without being renewed;
    /// it is renewed every third of it.
    pub lease: Duration,
    /// Whether an object's waiting effects are sent as one: the newest,
    /// naming the others in [`Effect::replaces`].
    pub coalesce: bool,
    /// The seed of the retry waits' jitter ([`Jitter::new`]).
    pub seed: u64,
    /// How long a cursor may stay unsaved (zero: every round is saved).
    /// A round whose effects were all delivered, parking and unparking
    /// nothing, moves the cursor in memory only while the last save is
    /// younger than this (and than a third of the lease); the next round
    /// that parks or unparks, or ends later, saves the cursor with it,
    /// and so does a relay that finds nothing new, or stops. A crash hands
    /// out again what passed since the last save (at least once): at most
    /// about this much more than with every round saved.
    pub save_every: Duration,
    /// The relay's part of the memory budget, in bytes
    /// (docs/CONTRACT.md §9): half for the heads of its parked effects,
    /// half for the round in hand (its states, and again those with the
    /// destination). Parked heads at or past their half,
    /// the relay is backlogged ([`RelayProgress::backlogged`]): its cursor
    /// stops, and it reads no new effect until parked ones are delivered,
    /// skipped or retried below it. A round reads states within a quarter
    /// (always at least one effect, however large): with their copies at
    /// the destination, the other half.
    pub memory: usize,
}

impl RelaySettings {
    /// The bytes the parked effects' heads may take: half of
    /// [`RelaySettings::memory`].
    pub fn parked_ceiling(&self) -> usize {
        self.memory / 2
    }

    /// The bytes of states one round reads: half of the other half of
    /// [`RelaySettings::memory`], since a state with the destination
    /// counts twice (its request is a copy). At least one effect goes
    /// whatever its size.
    pub fn round_bytes(&self) -> usize {
        (self.memory - self.parked_ceiling()) / 2
    }
}

/// The jitter of the retry waits: each schedule step times a factor drawn
/// uniformly from 0.800 to 1.200 (in thousandths), as Svix does, so that
/// a fleet of relays refused at once does not retry in step. Seeded
/// (splitmix64), so a run is reproducible from its seed.
#[derive(Clone, Debug)]
pub struct Jitter {
    /// The splitmix64 state.
    state: u64,
}

impl Jitter {
    /// A jitter drawing from `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next factor, in thousandths: 800 to 1200.
    fn factor(&mut self) -> u64 {
        // splitmix64 (Steele, Lea, Flood 2014), the seeding generator of
        // xoshiro.
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        800 + z % 401
    }

    /// The wait after a refusal whose schedule step is `step`: the step
    /// jittered, never below the destination's `retry_after` (an HTTP
    /// `Retry-After`, RFC 9110 §10.2.3), never above [`MAX_WAIT`].
    pub fn wait(&mut self, step: Duration, retry_after: Option<Duration>) -> Duration {
        let nanos = step.as_nanos() * u128::from(self.factor()) / 1000;
        let jittered = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        retry_after
            .map_or(jittered, |r| r.max(jittered))
            .min(MAX_WAIT)
    }
}

/// A running relay's counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RelayProgress {
    /// Its cursor as last saved: every effect at or below it was delivered
    /// or parked.
    pub position: u64,
    /// Effects the destination accepted in this run (a re-send counts
    /// again; a coalesced send counts every effect it stands for).
    pub delivered: u64,
    /// Of those, effects passed without a send of their own: a newer
    /// effect of their object was sent in their place (coalescing).
    pub coalesced: u64,
    /// Sends (handler calls) in this run.
    pub attempts: u64,
    /// Refusals in this run.
    pub refusals: u64,
    /// Effects parked now (retrying, failed or waiting behind one).
    pub parked: usize,
    /// Of those, parked `failed` (their schedule exhausted).
    pub failed: usize,
    /// The outbox's last position when last measured: `last - position`
    /// effects are still to be handed out.
    pub last: u64,
    /// Effects the relay resumed past because the outbox no longer held
    /// them (in memory, evicted; with a store, purged before the relay
    /// existed), in this run.
    pub missed: u64,
    /// Whether the relay is backlogged: its parked effects' heads reached
    /// their ceiling ([`RelaySettings::parked_ceiling`]), so its cursor
    /// stops and it reads no new effect until parked ones go.
    pub backlogged: bool,
    /// What the relay keeps in memory now, in bytes: its parked effects'
    /// heads ([`ParkedEffect::memory_bytes`]), the states of the round in
    /// hand, and again the states with the destination (its request is a
    /// copy).
    pub memory: usize,
}

/// Which save [`Next::Save`] asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaveKind {
    /// A round's: its parked effects and its cursor.
    Round,
    /// A renewal of the lease during a long round (the cursor as saved).
    Renewal,
    /// Letting the lease go as the relay stops (a lease of zero).
    Release,
}

/// What the caller does next ([`RelayDriver::next`]).
#[derive(Debug)]
pub enum Next {
    /// Open the relay's row as the driver's owner (`OutboxStore::open_relay`
    /// with this `lease`; a new relay starting where the caller's options
    /// say) and, when the row's owner is this run, read its parked
    /// effects; report with [`RelayDriver::opened`].
    Open {
        /// The lease to take.
        lease: Duration,
    },
    /// Read a round: the states of the parked effects at `parked`
    /// (`OutboxStore::effects_at`; none when empty), and at most `limit`
    /// new effects after position `after` whose states add up to at most
    /// `max_bytes`, but at least one (`OutboxStore::effects_within`; none
    /// when `limit` is 0: the relay is backlogged, or the parked effects
    /// took the round's bytes); report with [`RelayDriver::read`].
    Read {
        /// Positions of parked effects to read back, in position order.
        parked: Vec<u64>,
        /// The cursor.
        after: u64,
        /// Most new effects (0: none).
        limit: usize,
        /// Most bytes of new effects' states (the first one goes whatever
        /// its size).
        max_bytes: usize,
    },
    /// Read the outbox's last position and the time of the first effect
    /// after `after` (the relay's lag); report with
    /// [`RelayDriver::measured`].
    Measure {
        /// The cursor.
        after: u64,
    },
    /// Hand `effect` to the destination, as chain `chain`'s next send;
    /// report its answer with [`RelayDriver::answered`]. Sends of other
    /// chains go meanwhile (ask again at once).
    Send {
        /// The chain (an index within the round).
        chain: usize,
        /// The effect.
        effect: Effect,
    },
    /// Save `save` as the driver's owner at `generation`, renewing the
    /// lease until `now + lease` (`OutboxStore::save_relay`); report with
    /// [`RelayDriver::saved`].
    Save {
        /// Why.
        kind: SaveKind,
        /// The generation the relay was read at.
        generation: u64,
        /// What to save.
        save: RelaySave,
        /// The lease to renew (zero: let it go).
        lease: Duration,
    },
    /// Wait, then ask again: for `wait` (`None`: until a report is due),
    /// or until a send's answer comes when `answers`, or until
    /// [`RelayDriver::stop`] is called, whichever is first.
    Wait {
        /// How long at most.
        wait: Option<Duration>,
        /// Whether sends are out.
        answers: bool,
    },
    /// The relay stopped (after releasing its lease, when it held it).
    Stop,
}

/// Something the caller logs or counts ([`RelayDriver::notices`]).
#[derive(Clone, Debug)]
pub enum Notice {
    /// Another run holds the lease: waiting for it to lapse.
    Held {
        /// The run that holds it.
        owner: Option<String>,
    },
    /// The row could not be opened (the store's error, in words); tried
    /// again after [`STORE_RETRY`].
    OpenFailed(String),
    /// The outbox could not be read; tried again after [`STORE_RETRY`].
    ReadFailed(String),
    /// The relay resumed past `missed` effects after position `after`
    /// the outbox no longer keeps.
    Missed {
        /// The cursor.
        after: u64,
        /// Effects passed.
        missed: u64,
    },
    /// `count` effects passed without a send of their own (coalesced).
    Coalesced(u64),
    /// A refused effect parked by a saved round: `retrying` (with its
    /// due time) or `failed` (its schedule exhausted).
    Refused(Box<ParkedEffect>),
    /// A round's save was refused: an operator or another run changed the
    /// relay; it reads its state again.
    Overtaken,
    /// A round's save failed (the store's error): the relay reads its
    /// state again after [`STORE_RETRY`], the round is handed out again.
    SaveFailed(String),
    /// A renewal during a round was refused (the round's save finds out).
    RenewalOvertaken,
    /// A renewal during a round failed.
    RenewalFailed(String),
    /// The lease could not be let go on stopping: it lapses.
    ReleaseFailed(String),
    /// A catching-up relay's progress line.
    CatchUp(CatchUpLine),
    /// The parked effects' heads reached their ceiling
    /// ([`RelaySettings::parked_ceiling`]): the cursor stops until parked
    /// effects go.
    Backlogged {
        /// Effects parked.
        parked: usize,
        /// What their heads cost, in bytes.
        bytes: usize,
    },
    /// Parked effects went below their ceiling: the relay reads new
    /// effects again.
    BacklogCleared {
        /// Effects parked.
        parked: usize,
    },
}

/// What [`Next::Read`] read: the parked effects' states read back and the
/// new effects after the cursor, each in position order.
#[derive(Clone, Debug, Default)]
pub struct RoundRead {
    /// The parked effects asked for, as the store had them (one it no
    /// longer holds is left out).
    pub parked: Vec<Effect>,
    /// The new effects.
    pub new: Vec<Effect>,
}

/// A round being handed out.
#[derive(Debug)]
struct Handing {
    /// The cursor the round moves to.
    read_to: u64,
    /// The new effects parked `waiting` by the round.
    waiting: Vec<ParkedEffect>,
    /// Each chain, its sends and how many were accepted; `None` once done.
    chains: Vec<Option<(Chain, Vec<Effect>, usize)>>,
    /// The next chain not handed out yet.
    next: usize,
    /// Chains whose next send goes now (their previous one accepted).
    ready: VecDeque<usize>,
    /// Chains with the destination (a send out, or ready).
    active: usize,
    /// The chains done.
    outcomes: Vec<Outcome>,
}

/// Where the relay's loop is.
#[derive(Debug)]
enum Phase {
    /// Opening its row at `due` (the lease held by another run, or the
    /// store failed).
    Opening(SystemTime),
    /// Measuring its lag, then reading.
    Measuring,
    /// Reading after its cursor at `due`.
    Reading(SystemTime),
    /// The cursor moved in memory only, and the outbox had nothing new:
    /// its save goes out.
    Flushing,
    /// Handing a round out.
    Handing(Handing),
    /// A round's save is out: the save and the round's end.
    Saving(RelaySave, SystemTime),
    /// Letting the lease go.
    Releasing,
    /// Stopped.
    Stopped,
}

/// A store call out, whose report the driver waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Out {
    /// [`Next::Open`].
    Open,
    /// [`Next::Read`].
    Read,
    /// [`Next::Measure`].
    Measure,
    /// [`Next::Save`].
    Save(SaveKind),
}

/// A relay's loop (docs/CONTRACT.md §10), without IO: open the row and
/// take the lease (waiting while another run holds it), read after the
/// cursor, plan the round (per object in position order; parked effects
/// first when due), hand each object's effects out one at a time (at most
/// [`RelaySettings::concurrency`] objects at once), renew the lease every
/// third of it during a long round, settle the answers (refused effects
/// parked on the jittered schedule) and save them in one store call
/// conditioned on the generation read, read the row again after a
/// refused or failed save, wait for the poll interval or the next due
/// effect when idle, count effects missed when positions jump, and let
/// the lease go on stopping.
#[derive(Debug)]
pub struct RelayDriver {
    /// This run's name for the lease.
    owner: String,
    /// How it runs.
    settings: RelaySettings,
    /// The retry waits' jitter.
    jitter: Jitter,
    /// The relay's state, once this run holds the lease.
    plan: Option<Plan>,
    /// Where the loop is.
    phase: Phase,
    /// The store call out, if any: one at a time.
    out: Option<Out>,
    /// When the lease was last taken or renewed (every save renews it).
    renewed: SystemTime,
    /// The cursor as last read or saved in the store; the plan's is ahead
    /// of it while rounds are unsaved ([`RelaySettings::save_every`]).
    stored: u64,
    /// The cursor the save out carries.
    saving: u64,
    /// Asked to stop: the round in hand finishes and is saved, then the
    /// lease goes.
    stopping: bool,
    /// The counts.
    progress: RelayProgress,
    /// The time of the oldest effect not delivered (parked, or the first
    /// after the cursor), when last measured.
    oldest: Option<SystemTime>,
    /// The catch-up logging policy.
    catch_up: CatchUp,
    /// What the caller has not taken yet.
    notices: Vec<Notice>,
    /// The bytes of the states of the round in hand (read, not yet saved).
    round_bytes: usize,
    /// The bytes of the states with the destination now.
    sending_bytes: usize,
    /// Whether the next round reads new effects first: the parked
    /// effects' states took the whole of the last round's bytes, and new
    /// effects are not to wait behind retries for ever.
    new_first: bool,
    /// Since when the relay is backlogged as its saves record it
    /// ([`RelaySave::backlogged_since`]): read from its row when opened
    /// (a backlog that outlived a restart keeps its start), set by each
    /// save from the parked heads it leaves.
    backlogged_since: Option<SystemTime>,
}

impl RelayDriver {
    /// A relay run named `owner` (unlike any other run's), with
    /// `settings`, starting at `now` by opening its row.
    pub fn new(owner: impl Into<String>, settings: RelaySettings, now: SystemTime) -> Self {
        Self {
            owner: owner.into(),
            jitter: Jitter::new(settings.seed),
            catch_up: CatchUp::new(settings.batch),
            settings,
            plan: None,
            phase: Phase::Opening(now),
            out: None,
            renewed: now,
            stored: 0,
            saving: 0,
            stopping: false,
            progress: RelayProgress::default(),
            oldest: None,
            notices: Vec::new(),
            round_bytes: 0,
            sending_bytes: 0,
            new_first: false,
            backlogged_since: None,
        }
    }

    /// What the relay keeps in memory now, in bytes (see
    /// [`RelayProgress::memory`]).
    pub fn memory_bytes(&self) -> usize {
        self.plan
            .as_ref()
            .map_or(0, |p| p.parked_bytes)
            .saturating_add(self.round_bytes)
            .saturating_add(self.sending_bytes)
    }

    /// Sets [`RelayProgress::memory`] from the state.
    fn count_memory(&mut self) {
        self.progress.memory = self.memory_bytes();
    }

    /// This run's name for the lease.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The counts now: the cursor, parked and last position as of the
    /// last measure (after the open and after each saved round), the
    /// others as they happen.
    pub fn progress(&self) -> &RelayProgress {
        &self.progress
    }

    /// The time of the oldest effect not delivered yet (parked, or the
    /// first after the cursor) when last measured; `None`: none.
    pub fn oldest(&self) -> Option<SystemTime> {
        self.oldest
    }

    /// The relay's generation as this run read it (`None`: not open).
    pub fn generation(&self) -> Option<u64> {
        self.plan.as_ref().map(|p| p.row.generation)
    }

    /// Whether the relay holds its state (opened, no save refused since)
    /// with no round under way and no store call out: between rounds.
    pub fn between_rounds(&self) -> bool {
        self.plan.is_some()
            && self.out.is_none()
            && matches!(self.phase, Phase::Measuring | Phase::Reading(_))
    }

    /// Takes what the caller logs or counts, oldest first.
    pub fn notices(&mut self) -> std::vec::Drain<'_, Notice> {
        self.notices.drain(..)
    }

    /// Asks the relay to stop: the round in hand finishes and is saved,
    /// then the lease goes ([`SaveKind::Release`]) and [`Next::Stop`].
    pub fn stop(&mut self) {
        self.stopping = true;
    }

    /// What to do next at `now`.
    pub fn next(&mut self, now: SystemTime) -> Next {
        self.count_memory();
        if self.out.is_some() {
            return Next::Wait {
                wait: None,
                answers: matches!(self.phase, Phase::Handing(_)),
            };
        }
        let lease = self.settings.lease;
        match &mut self.phase {
            Phase::Stopped => Next::Stop,
            Phase::Opening(_) | Phase::Reading(_) | Phase::Flushing if self.stopping => {
                if self.plan.is_some() {
                    self.phase = Phase::Releasing;
                    self.next(now)
                } else {
                    self.phase = Phase::Stopped;
                    Next::Stop
                }
            }
            Phase::Opening(due) | Phase::Reading(due) if now < *due => Next::Wait {
                wait: Some(due.duration_since(now).unwrap_or_default()),
                answers: false,
            },
            Phase::Opening(_) => {
                self.out = Some(Out::Open);
                Next::Open { lease }
            }
            Phase::Measuring => {
                self.out = Some(Out::Measure);
                Next::Measure {
                    after: self.position(),
                }
            }
            Phase::Reading(_) => self.next_read(now),
            Phase::Flushing => {
                let flush = RelaySave {
                    position: self.position(),
                    ..RelaySave::default()
                };
                let flush = self.with_backlog(flush, now);
                self.phase = Phase::Saving(flush.clone(), now);
                self.save(SaveKind::Round, flush, lease)
            }
            Phase::Handing(_) => self.next_handing(now),
            Phase::Saving(..) => Next::Wait {
                wait: None,
                answers: false,
            },
            Phase::Releasing => {
                let release = RelaySave {
                    position: self.position(),
                    ..RelaySave::default()
                };
                let release = self.with_backlog(release, now);
                self.save(SaveKind::Release, release, Duration::ZERO)
            }
        }
    }

    /// [`RelayDriver::next`] when a round is to be read at `now`: the
    /// parked effects due, within the round's bytes; then new effects in
    /// what bytes remain, unless the parked effects' heads are at their
    /// ceiling (backlogged: the cursor stops) or the round is full. New
    /// effects are also limited so that the heads of those parked
    /// `waiting` by this round stay within the ceiling. After a round
    /// whose parked states took all its bytes, the next one reads new
    /// effects only, so that retries of large states do not hold new
    /// effects back for ever.
    fn next_read(&mut self, now: SystemTime) -> Next {
        let settings = &self.settings;
        let Some(plan) = self.plan.as_ref() else {
            return Next::Stop;
        };
        let round = settings.round_bytes();
        let ceiling = settings.parked_ceiling();
        let backlogged = plan.parked_bytes >= ceiling;
        let parked = if self.new_first && !backlogged {
            Vec::new()
        } else {
            plan.due(now, settings.batch, round)
        };
        let loaded: usize = parked
            .iter()
            .filter_map(|at| plan.parked.get(at))
            .map(|p| p.effect.bytes)
            .sum();
        let room = (ceiling.saturating_sub(plan.parked_bytes) / PARKED_OVERHEAD).max(1);
        let full = !parked.is_empty() && loaded >= round;
        let limit = if backlogged || full {
            0
        } else {
            settings.batch.min(room)
        };
        self.new_first = full;
        if backlogged != self.progress.backlogged {
            self.progress.backlogged = backlogged;
            self.notices.push(if backlogged {
                Notice::Backlogged {
                    parked: plan.parked.len(),
                    bytes: plan.parked_bytes,
                }
            } else {
                Notice::BacklogCleared {
                    parked: plan.parked.len(),
                }
            });
        }
        let after = plan.row.position;
        self.out = Some(Out::Read);
        Next::Read {
            parked,
            after,
            limit,
            max_bytes: round.saturating_sub(loaded),
        }
    }

    /// [`RelayDriver::next`] while a round is handed out: the next send,
    /// the round's save once every chain answered, a renewal of the lease
    /// every third of it, or a wait for answers.
    fn next_handing(&mut self, now: SystemTime) -> Next {
        let lease = self.settings.lease;
        let concurrency = self.settings.concurrency;
        let renew_at = self.renewed + lease / 3;
        let Phase::Handing(h) = &mut self.phase else {
            return Next::Stop;
        };
        let chain = h.ready.pop_front().or_else(|| {
            (h.next < h.chains.len() && h.active < concurrency).then(|| {
                h.next += 1;
                h.active += 1;
                h.next - 1
            })
        });
        if let Some((_, sends, accepted)) = chain.and_then(|c| h.chains[c].as_ref()) {
            let effect = sends[*accepted].clone();
            self.sending_bytes += effect.bytes();
            return Next::Send {
                chain: chain.unwrap_or_default(),
                effect,
            };
        }
        if h.active == 0 {
            // Every chain answered: settle and save the round.
            let Phase::Handing(h) = std::mem::replace(&mut self.phase, Phase::Stopped) else {
                return Next::Stop;
            };
            let Some(plan) = self.plan.as_ref() else {
                return Next::Stop;
            };
            let save = plan.settle(
                now,
                h.outcomes,
                h.waiting,
                h.read_to,
                &self.settings.schedule,
                &mut self.jitter,
            );
            let save = self.with_backlog(save, now);
            if self.defers(&save, now) {
                // Only the cursor moved: it moves in memory, and the next
                // round is read at once (the lag is measured at the next
                // save).
                self.round_bytes = 0;
                if let Some(plan) = self.plan.as_mut() {
                    plan.saved(save, now);
                }
                self.phase = Phase::Reading(now);
                return self.next(now);
            }
            self.phase = Phase::Saving(save.clone(), now);
            return self.save(SaveKind::Round, save, lease);
        }
        if now >= renew_at {
            let renewal = RelaySave {
                position: self.position(),
                ..RelaySave::default()
            };
            let renewal = self.with_backlog(renewal, now);
            return self.save(SaveKind::Renewal, renewal, lease);
        }
        Next::Wait {
            wait: Some(renew_at.duration_since(now).unwrap_or_default()),
            answers: true,
        }
    }

    /// Whether a round's `save` at `now` waits for a later one
    /// ([`RelaySettings::save_every`]): it only moves the cursor, the
    /// relay is not stopping, and the last save is younger than
    /// `save_every` and than a third of the lease.
    fn defers(&self, save: &RelaySave, now: SystemTime) -> bool {
        let since = now.duration_since(self.renewed).unwrap_or_default();
        save.park.is_empty()
            && save.unpark.is_empty()
            && !self.stopping
            && since < self.settings.save_every
            && since < self.settings.lease / 3
    }

    /// The cursor as last read or saved, or moved in memory by rounds not
    /// saved yet (0: not open).
    fn position(&self) -> u64 {
        self.plan.as_ref().map_or(0, |p| p.row.position)
    }

    /// `save` with the backlog it leaves at `now` (see
    /// [`RelaySave::backlogged_since`]): the parked heads' bytes once it is
    /// taken in, and backlogged since the backlog began (kept) or `now`
    /// (it begins) when those bytes are at their ceiling, as the next
    /// round's read judges them.
    fn with_backlog(&mut self, mut save: RelaySave, now: SystemTime) -> RelaySave {
        let Some(plan) = self.plan.as_ref() else {
            return save;
        };
        let bytes = plan.bytes_after(&save);
        self.backlogged_since = if bytes >= self.settings.parked_ceiling() {
            self.backlogged_since.or(Some(now))
        } else {
            None
        };
        save.parked_bytes = bytes as u64;
        save.backlogged_since = self.backlogged_since;
        save
    }

    /// A save of `kind` out (`save` with its backlog: `with_backlog`).
    fn save(&mut self, kind: SaveKind, save: RelaySave, lease: Duration) -> Next {
        self.out = Some(Out::Save(kind));
        self.saving = save.position;
        Next::Save {
            kind,
            generation: self.generation().unwrap_or(0),
            save,
            lease,
        }
    }

    /// Takes an out call's report: whether it was the one out.
    fn report(&mut self, what: Out) -> bool {
        if self.out == Some(what) {
            self.out = None;
            true
        } else {
            false
        }
    }

    /// The parked and failed counts and the cursor, from the state.
    fn count_parked(&mut self) {
        if let Some(plan) = &self.plan {
            self.progress.position = self.stored;
            self.progress.parked = plan.parked.len();
            self.progress.failed = plan
                .parked
                .values()
                .filter(|p| p.status == ParkedStatus::Failed)
                .count();
        }
    }

    /// [`Next::Open`]'s result at `now`: the row as the store returned it
    /// and, when this run holds its lease, its parked effects.
    pub fn opened<E: Display>(
        &mut self,
        result: Result<(RelayRow, Vec<ParkedEffect>), E>,
        now: SystemTime,
    ) {
        if !self.report(Out::Open) {
            return;
        }
        match result {
            Err(e) => {
                self.notices.push(Notice::OpenFailed(e.to_string()));
                self.phase = Phase::Opening(now + STORE_RETRY);
            }
            Ok((row, _)) if row.owner.as_deref() != Some(self.owner.as_str()) => {
                self.notices.push(Notice::Held { owner: row.owner });
                let wait = (self.settings.lease / 4).min(Duration::from_secs(1));
                self.phase = Phase::Opening(now + wait);
            }
            Ok((row, parked)) => {
                self.stored = row.position;
                self.backlogged_since = row.backlogged_since;
                self.plan = Some(Plan::new(row, parked));
                self.renewed = now;
                self.phase = Phase::Measuring;
            }
        }
    }

    /// [`Next::Measure`]'s result at `now`: the outbox's last position and
    /// the time of the first effect after the cursor (a failed read is
    /// skipped: the relay reads on).
    pub fn measured<E: Display>(
        &mut self,
        result: Result<(u64, Option<SystemTime>), E>,
        now: SystemTime,
    ) {
        if !self.report(Out::Measure) {
            return;
        }
        // The counts move together: the cursor and what is parked as
        // saved, with the outbox's last position read after the save.
        self.count_parked();
        self.phase = Phase::Reading(now);
        let (Ok((last, next)), Some(plan)) = (result, self.plan.as_ref()) else {
            return;
        };
        let position = plan.row.position;
        self.oldest = plan.parked.values().map(|p| p.effect.at).chain(next).min();
        self.progress.last = last;
        if let Some(line) = self.catch_up.observe(now, position, last) {
            self.notices.push(Notice::CatchUp(line));
        }
    }

    /// [`Next::Read`]'s result at `now`: the parked effects read back and
    /// the effects after the cursor.
    pub fn read<E: Display>(&mut self, result: Result<RoundRead, E>, now: SystemTime) {
        if !self.report(Out::Read) {
            return;
        }
        let RoundRead {
            parked: loaded,
            new,
        } = match result {
            Ok(read) => read,
            Err(e) => {
                self.notices.push(Notice::ReadFailed(e.to_string()));
                self.phase = Phase::Reading(now + STORE_RETRY);
                return;
            }
        };
        let Some(plan) = self.plan.as_ref() else {
            return;
        };
        let after = plan.row.position;
        if let Some(first) = new.first().filter(|e| e.position > after + 1) {
            // Positions have no gaps: these were no longer kept (the
            // in-memory outbox's capacity, or the store's history window
            // for a relay started after a purge).
            let missed = first.position - after - 1;
            self.progress.missed += missed;
            self.notices.push(Notice::Missed { after, missed });
        }
        let read_to = new.last().map_or(after, |e| e.position);
        self.round_bytes = loaded.iter().chain(&new).map(Effect::bytes).sum();
        let (chains, waiting) = plan.round(now, loaded, new);
        let renew_at = self.renewed + self.settings.lease / 3;
        if chains.is_empty() && waiting.is_empty() && now < renew_at {
            self.round_bytes = 0;
            if self.stored < after {
                // Nothing new: the cursor rounds moved in memory is saved
                // before the relay waits.
                self.phase = Phase::Flushing;
                return;
            }
            // A parked effect due now that this round did not hand out (the
            // store no longer gave it back) waits a poll like the rest: a
            // zero wait would read again at the same instant, for ever.
            let wait = plan
                .next_due()
                .and_then(|due| due.duration_since(now).ok())
                .filter(|d| !d.is_zero())
                .map_or(self.settings.poll_interval, |d| {
                    d.min(self.settings.poll_interval)
                });
            self.phase = Phase::Reading(now + wait);
            return;
        }
        let coalesce = self.settings.coalesce;
        self.phase = Phase::Handing(Handing {
            read_to,
            waiting,
            chains: chains
                .into_iter()
                .map(|c| {
                    let sends = c.sends(coalesce);
                    Some((c, sends, 0))
                })
                .collect(),
            next: 0,
            ready: VecDeque::new(),
            active: 0,
            outcomes: Vec::new(),
        });
    }

    /// [`Next::Send`]'s answer for chain `chain`: accepted, or refused.
    pub fn answered(&mut self, chain: usize, answer: Result<(), HandlerError>) {
        let coalesce = self.settings.coalesce;
        let Phase::Handing(h) = &mut self.phase else {
            return;
        };
        let Some(Some((_, sends, accepted))) = h.chains.get_mut(chain) else {
            return;
        };
        self.sending_bytes = self
            .sending_bytes
            .saturating_sub(sends.get(*accepted).map_or(0, Effect::bytes));
        self.progress.attempts += 1;
        let refused = match answer {
            Ok(()) => {
                *accepted += 1;
                if *accepted < sends.len() {
                    h.ready.push_back(chain);
                    return;
                }
                None
            }
            Err(refusal) => Some(refusal),
        };
        let Some((c, _, accepted)) = h.chains[chain].take() else {
            return;
        };
        h.active -= 1;
        let items = c.items.len();
        let outcome = c.outcome(accepted, refused, coalesce);
        if coalesce && items > 1 && outcome.delivered == items {
            // A coalesced send stood for the whole chain.
            let folded = (items - 1) as u64;
            self.progress.coalesced += folded;
            self.notices.push(Notice::Coalesced(folded));
        }
        self.progress.delivered += outcome.delivered as u64;
        self.progress.refusals += u64::from(outcome.refused.is_some());
        h.outcomes.push(outcome);
    }

    /// [`Next::Save`]'s result at `now`: `Ok(true)` saved, `Ok(false)`
    /// refused (another generation or owner), `Err` failed (nothing, or
    /// everything, was saved: its answer may have been lost).
    pub fn saved<E: Display>(&mut self, result: Result<bool, E>, now: SystemTime) {
        let Some(Out::Save(kind)) = self.out else {
            return;
        };
        self.out = None;
        match kind {
            SaveKind::Renewal => match result {
                Ok(true) => {
                    self.renewed = now;
                    self.stored = self.saving;
                }
                Ok(false) => self.notices.push(Notice::RenewalOvertaken),
                Err(e) => self.notices.push(Notice::RenewalFailed(e.to_string())),
            },
            SaveKind::Release => {
                match result {
                    Ok(true) => {
                        self.stored = self.saving;
                        self.count_parked();
                    }
                    Ok(false) => {}
                    Err(e) => self.notices.push(Notice::ReleaseFailed(e.to_string())),
                }
                self.phase = Phase::Stopped;
            }
            SaveKind::Round => {
                let Phase::Saving(save, ended) = std::mem::replace(&mut self.phase, Phase::Stopped)
                else {
                    return;
                };
                // The round's states go with it, saved or not.
                self.round_bytes = 0;
                match result {
                    Ok(true) => {
                        for p in &save.park {
                            if p.status == ParkedStatus::Failed
                                || (p.status == ParkedStatus::Retrying && p.due.is_some())
                            {
                                self.notices.push(Notice::Refused(Box::new(p.clone())));
                            }
                        }
                        self.stored = save.position;
                        if let Some(plan) = self.plan.as_mut() {
                            plan.saved(save, ended);
                        }
                        self.renewed = now;
                        self.phase = if self.stopping {
                            self.count_parked();
                            Phase::Releasing
                        } else {
                            Phase::Measuring
                        };
                    }
                    // Refused as stale, or failed: the state is kept out
                    // and the row and parked effects read again. A save
                    // that failed may have committed all the same (its
                    // answer lost with the connection), and a plan that
                    // did not take it would hand its parked effects out
                    // as new ones and leave them parked in the store.
                    Ok(false) => {
                        self.notices.push(Notice::Overtaken);
                        self.plan = None;
                        self.phase = Phase::Opening(now);
                    }
                    Err(e) => {
                        self.notices.push(Notice::SaveFailed(e.to_string()));
                        if self.stopping {
                            self.phase = Phase::Releasing;
                        } else {
                            self.plan = None;
                            self.phase = Phase::Opening(now + STORE_RETRY);
                        }
                    }
                }
            }
        }
    }
}
