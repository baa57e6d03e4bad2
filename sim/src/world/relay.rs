//! The relays of the simulated cluster (docs/CONTRACT.md §10): named relay
//! processes that read the store's outbox by position and hand every effect
//! to a destination of their own, keeping their cursor in the store.
//!
//! A relay process drives the core's relay loop, [`RelayDriver`], the one
//! the library's relay task drives: it does what [`RelayDriver::next`]
//! says, as events on the simulation's clock. It opens its row (taking the
//! lease, waiting while another run holds it), reads the effects after its
//! cursor, hands each object's effects to its destination one after the
//! other (at most `concurrency` objects at once, coalesced when the relay
//! coalesces), renews its lease every third of it during a long round, and
//! saves each round in one store transaction conditioned on the generation
//! it read. Only the store calls, the destination and the timers are the
//! simulation's.
//!
//! Its randomness is a stream of its own, seeded from the run's seed, so
//! that the receivers' part of a seed runs as it did before relays joined
//! (the same deliveries, faults and decisions).
//!
//! Faults (during the fault phase): a relay process crashes (what it had
//! handed out since its last save, and the cursor it had not saved, are
//! lost) and restarts under a new run name, waiting for its lease to lapse;
//! the destination refuses an attempt, or takes it without answering in
//! time (the relay's attempt times out: refused, though the destination may
//! have accepted it), or is down for a while (every attempt refused); a
//! relay's save meets the full disk, or commits and loses its answer. An
//! operator rewinds a relay, skips its first refused effect and, in a
//! third of the seeds (the first relay's schedule short), retries the
//! effects parked `failed`.
//!
//! Checked as the writes reach the store (reported with the end's checks):
//! a run sure of its lease (its last write taken) saves before the lease
//! lapsed, since it renews it every third of it; a run that takes the
//! lease over from another raises the generation; an effect parked after
//! a refusal has one attempt more than the refusals saved for it since its
//! schedule (re)started.

use super::{Ev, World};
use crate::{Control, Fault};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use snapshot_receiver_core::relay::{
    Effect, EffectId, HandlerError, Next, Notice, ParkedStatus, RelayDriver, RelaySave,
    RelaySettings, RoundRead,
};
use snapshot_receiver_core::store::{OutboxStore, StoreError};
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

/// A simulated relay's part of the memory budget, in bytes: 1 MiB, room
/// for some 1,800 parked heads and rounds of the simulation's small states
/// (so the seeds' runs, pinned in `tests/sim.rs`, never backlog; the
/// backlog is tested in the core's driver tests and on the stores).
const RELAY_MEMORY: usize = 1 << 20;

/// The relays' settings (the same for every seed).
#[derive(Clone, Debug)]
pub struct RelayTimings {
    /// The waits between a refused attempt and the next one: short, so
    /// that retries happen within a run, and 63.75 s in all, past the fault
    /// phase, so that no effect exhausts its schedule (none is parked
    /// `failed`: every effect must reach its destination by the end).
    pub schedule: Vec<Duration>,
    /// The schedule of a relay whose effects an operator retries (the
    /// first relay, in a third of the seeds): 0.25, 0.5 and 1 s, so that
    /// effects refused while their destination is down exhaust it and are
    /// parked `failed`, and the operator's retries restart it.
    pub short_schedule: Vec<Duration>,
    /// How long a relay with nothing new waits before it reads again.
    pub poll: Duration,
    /// How long a relay's cursor may stay unsaved after rounds that only
    /// moved it (zero: every round saved); crashes then hand out again
    /// what passed since the last save.
    pub save_every: Duration,
    /// A relay run's lease on its name.
    pub lease: Duration,
    /// How long the relay waits for the destination's answer to one
    /// attempt before it counts it refused.
    pub attempt_timeout: Duration,
    /// Attempts the destination refuses (during the fault phase).
    pub refuse_rate: f64,
    /// Attempts whose answer does not come in time (during the fault
    /// phase); the destination accepted half of them.
    pub timeout_rate: f64,
    /// Relay saves that commit but lose their answer (during the fault
    /// phase).
    pub save_lost_rate: f64,
    /// Relay crashes and destination outages per seed (at least, at most).
    pub faults: (u32, u32),
}

impl Default for RelayTimings {
    fn default() -> Self {
        Self {
            schedule: [250, 500, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000]
                .into_iter()
                .map(Duration::from_millis)
                .collect(),
            short_schedule: [250, 500, 1_000]
                .into_iter()
                .map(Duration::from_millis)
                .collect(),
            poll: Duration::from_millis(250),
            save_every: Duration::from_millis(500),
            lease: Duration::from_secs(2),
            attempt_timeout: Duration::from_secs(1),
            refuse_rate: 0.06,
            timeout_rate: 0.03,
            save_lost_rate: 0.03,
            faults: (1, 4),
        }
    }
}

/// One request that reached a destination.
#[derive(Clone, Debug)]
pub struct Received {
    /// The effect as sent.
    pub effect: Effect,
    /// Whether the destination accepted it.
    pub accepted: bool,
    /// Whether this was the first acceptance of its effect id.
    pub first: bool,
}

/// A relay's destination: what reached it, in arrival order.
#[derive(Debug, Default)]
pub struct Destination {
    /// Down (refusing every attempt) until then.
    down_until: Duration,
    /// Every request that reached it, in order.
    pub received: Vec<Received>,
    /// The effect ids it accepted.
    pub accepted: BTreeMap<EffectId, usize>,
    /// The effects an operator skipped (never to be delivered), by id.
    pub skipped: BTreeMap<EffectId, u64>,
}

/// A running relay process: the core's relay driver, and the timer it
/// waits on.
struct Running {
    /// Its loop ([`RelayDriver`]), named `<relay>#<incarnation>` for the
    /// lease.
    driver: RelayDriver,
    /// The token of the one timer that counts: a `Step` event with another
    /// token was superseded by a later wait and does nothing.
    timer: u64,
    /// Whether its hold on the lease is in doubt: its last write (the
    /// open, a save) failed or was refused, or another run held the lease.
    /// Only a run sure of its lease must renew it before it lapses.
    unsure: bool,
}

/// A named relay's process slot.
pub struct RelaySlot {
    /// The relay's name (its row in the store).
    pub name: String,
    /// Incarnations so far.
    inc: u32,
    /// The process, when up.
    run: Option<Running>,
    /// Most effects read per round.
    batch: usize,
    /// Most chains with the destination at once.
    concurrency: usize,
    /// Whether an object's waiting effects go as one (its newest).
    coalesce: bool,
    /// The waits between a refused attempt and the next one.
    schedule: Vec<Duration>,
}

/// The relays of one seed's run.
pub struct Relays {
    /// Their own randomness, seeded from the run's seed.
    rng: ChaCha8Rng,
    /// The operator's, apart (seeded from the run's seed too), so that a
    /// seed's relays draw as they did before the operator joined.
    operator: ChaCha8Rng,
    /// The settings.
    pub timings: RelayTimings,
    /// The relay processes, one per name.
    pub slots: Vec<RelaySlot>,
    /// Each relay's destination (the same index).
    pub destinations: Vec<Destination>,
    /// Per (relay, position): the refusals of a parked effect saved since
    /// its schedule (re)started (an operator's retry restarts it).
    refusals: BTreeMap<(usize, u64), u32>,
    /// The relay rules found broken while the run went (checked as the
    /// writes reach the store; reported with the end's checks).
    pub violations: Vec<String>,
}

impl Relays {
    /// One or two named relays, each reading 1 to 6 effects per round with
    /// 1 to 4 objects at the destination at once, coalescing or not,
    /// started in the first
    /// 0.5 s; the relay faults of the seed at random times of the fault
    /// phase.
    pub(super) fn new(seed: u64, fault_phase: Duration) -> (Self, Vec<(Duration, Ev)>) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7e1a_7e1a);
        let timings = RelayTimings::default();
        let n = rng.random_range(1..=2);
        let mut slots: Vec<RelaySlot> = (0..n)
            .map(|i| RelaySlot {
                name: ["app", "audit"][i].to_owned(),
                inc: 0,
                run: None,
                batch: rng.random_range(1..=6),
                concurrency: rng.random_range(1..=4),
                coalesce: rng.random_bool(0.5),
                schedule: timings.schedule.clone(),
            })
            .collect();
        let mut events = Vec::new();
        for r in 0..n {
            let at = Duration::from_millis(rng.random_range(0..=500));
            events.push((at, Ev::RelayRestart(r)));
        }
        let faults = rng.random_range(timings.faults.0..=timings.faults.1);
        for _ in 0..faults {
            let at = Duration::from_millis(rng.random_range(200..=fault_phase.as_millis() as u64));
            let r = rng.random_range(0..n);
            let kind = if rng.random_bool(0.6) {
                Fault::RelayCrash
            } else {
                Fault::DestinationDown
            };
            events.push((at, Ev::RelayFault(r, kind)));
        }
        // The operator: a rewind or two, and a skip now and then (done only
        // when something is parked then), during the fault phase.
        let mut operator = ChaCha8Rng::seed_from_u64(seed ^ 0x09e2_a709);
        for _ in 0..operator.random_range(0..=2) {
            let at =
                Duration::from_millis(operator.random_range(200..=fault_phase.as_millis() as u64));
            let r = operator.random_range(0..n);
            events.push((at, Ev::RelayFault(r, Fault::OperatorRewind)));
        }
        for _ in 0..operator.random_range(0..=3) {
            let at =
                Duration::from_millis(operator.random_range(200..=fault_phase.as_millis() as u64));
            let r = operator.random_range(0..n);
            events.push((at, Ev::RelayFault(r, Fault::OperatorSkip)));
        }
        // In a third of the seeds the first relay has a short schedule:
        // effects refused while its destination is down exhaust it and are
        // parked `failed`, and an operator retries them, once to three
        // times during the fault phase and then every 2 s until the run is
        // done (every relay drained, nothing parked). A stream of its own,
        // so that the other seeds run as before.
        let mut incident = ChaCha8Rng::seed_from_u64(seed ^ 0x5e7e_a11d);
        if incident.random_bool(1.0 / 3.0) {
            slots[0].schedule = timings.short_schedule.clone();
            for _ in 0..incident.random_range(1..=3) {
                let at = Duration::from_millis(
                    incident.random_range(200..=fault_phase.as_millis() as u64),
                );
                events.push((at, Ev::RelayFault(0, Fault::OperatorRetry)));
            }
            let after = fault_phase + Duration::from_secs(1);
            events.push((after, Ev::RelayFault(0, Fault::OperatorRetry)));
        }
        let relays = Relays {
            rng,
            operator,
            timings,
            slots,
            destinations: (0..n).map(|_| Destination::default()).collect(),
            refusals: BTreeMap::new(),
            violations: Vec::new(),
        };
        (relays, events)
    }
}

/// A relay's event.
#[derive(Debug)]
pub enum RelayEv {
    /// The process asks its driver what to do next (a timer: `token` is
    /// the one that counts, see `Running::timer`).
    Step {
        /// The timer's token.
        token: u64,
    },
    /// An attempt of chain `chain` reaches the destination: `answer`
    /// whether its answer goes back (not: the attempt times out).
    Attempt {
        /// The chain.
        chain: usize,
        /// The effect.
        effect: Box<Effect>,
        /// Whether the answer goes back in time.
        answer: bool,
    },
    /// The answer of chain `chain`'s attempt reaches the relay (`Err`: a
    /// refusal, in words, or the attempt's timeout).
    Answer {
        /// The chain.
        chain: usize,
        /// The answer.
        answer: Result<(), String>,
    },
    /// A save reaches the store.
    Save {
        /// The relay's generation as read.
        generation: u64,
        /// What to save.
        save: Box<RelaySave>,
        /// The lease to renew (zero: let it go).
        lease: Duration,
    },
}

impl World<'_> {
    /// The relay's wall clock (the world's: no skew).
    fn relay_wall(&self) -> SystemTime {
        self.epoch + self.now
    }

    fn relay_log(&mut self, r: usize, what: impl FnOnce() -> String) {
        if self.trace.is_some() {
            let name = self.relays.slots[r].name.clone();
            let inc = self.relays.slots[r].inc;
            self.log(|| format!("relay {name}#{inc}: {}", what()));
        }
    }

    fn relay_fault_on(&self, f: Fault) -> bool {
        self.faulting() && self.on(f)
    }

    fn relay_ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.relays.rng.random_range(lo..=hi.max(lo)))
    }

    /// A hop between a relay and the store or its destination: 0.2 to 3 ms.
    fn relay_hop(&mut self) -> Duration {
        Duration::from_micros(self.relays.rng.random_range(200..3_000))
    }

    /// Whether every relay passed the outbox's last effect with nothing
    /// parked (as the store holds them), and is up between rounds: the
    /// relays drained.
    pub(super) fn relays_drained(&self) -> bool {
        let store = self.store.get();
        let last = store.positions().last().copied().unwrap_or(0);
        self.relays.slots.iter().all(|s| {
            s.run
                .as_ref()
                .is_some_and(|run| run.driver.between_rounds())
                && store.relay(&s.name).is_some_and(|row| row.position >= last)
                && store.parked_count(&s.name) == 0
        })
    }

    /// A relay fault of the seed's schedule.
    pub(super) fn relay_fault(&mut self, r: usize, f: Fault) {
        if !self.on(f) {
            return;
        }
        match f {
            Fault::RelayCrash if self.relays.slots[r].run.is_some() => {
                self.relays.slots[r].run = None;
                self.count(f);
                self.relay_log(r, || "crashed".to_owned());
                let d = self.relay_ms(200, 3_000);
                self.after(d, Ev::RelayRestart(r));
            }
            Fault::DestinationDown => {
                self.count(f);
                let d = self.relay_ms(1_000, 8_000);
                self.relay_log(r, || format!("its destination is down for {d:?}"));
                self.relays.destinations[r].down_until = self.now + d;
            }
            Fault::OperatorRewind => self.operator_rewind(r),
            Fault::OperatorSkip => self.operator_skip(r),
            Fault::OperatorRetry => self.operator_retry(r),
            _ => {}
        }
    }

    /// An operator rewinds relay `r` by 0 to 5 positions (`OutboxStore::rewind`,
    /// which keeps what is parked at or below the position). Under the
    /// control, every parked effect is dropped with it.
    fn operator_rewind(&mut self, r: usize) {
        let (name, wall) = (self.relays.slots[r].name.clone(), self.relay_wall());
        let Some(position) = self.store.get().relay(&name).map(|row| row.position) else {
            return;
        };
        let back = self.relays.operator.random_range(0..=5);
        let to = position.saturating_sub(back);
        let dropped = {
            let mut store = self.store.get();
            if store.rewind(&name, to, wall).ok().flatten().is_none() {
                return;
            }
            let mut dropped = Vec::new();
            if self.control == Control::RewindDropsParked {
                for p in store.parked(&name).unwrap_or_default() {
                    if store.skip(&name, p.effect.position, wall).unwrap_or(false) {
                        dropped.push(p.effect.position);
                    }
                }
            }
            dropped
        };
        // The parked rows above the position are gone (and under the
        // control those below it): read again, such an effect starts anew.
        self.relays
            .refusals
            .retain(|(relay, at), _| *relay != r || (*at <= to && !dropped.contains(at)));
        self.count(Fault::OperatorRewind);
        self.relay_log(r, || {
            format!("operator: rewound from {position} to {to}, dropped {dropped:?}")
        });
    }

    /// An operator skips the first effect relay `r` holds parked
    /// `retrying` or `failed` (`OutboxStore::skip`): it is never delivered,
    /// and its object's effects waiting behind it go then.
    fn operator_skip(&mut self, r: usize) {
        let (name, wall) = (self.relays.slots[r].name.clone(), self.relay_wall());
        let head = {
            let mut store = self.store.get();
            let head = store
                .parked(&name)
                .unwrap_or_default()
                .into_iter()
                .find(|p| matches!(p.status, ParkedStatus::Retrying | ParkedStatus::Failed));
            match head {
                Some(p) if store.skip(&name, p.effect.position, wall).unwrap_or(false) => Some(p),
                _ => None,
            }
        };
        let Some(p) = head else {
            return;
        };
        self.relays.refusals.remove(&(r, p.effect.position));
        self.count(Fault::OperatorSkip);
        let dest = &mut self.relays.destinations[r];
        dest.skipped.insert(p.effect.id, p.effect.position);
        self.relay_log(r, || {
            format!(
                "operator: skipped {}:{}@{}",
                p.effect.position, p.effect.object_id, p.effect.version
            )
        });
    }

    /// An operator retries every effect relay `r` holds parked `failed`
    /// (`OutboxStore::retry_failed`): each goes again at once, its
    /// schedule restarted (attempts back to zero; under the control, kept).
    /// After the fault phase, the operator looks again every 2 s until the
    /// run is done.
    fn operator_retry(&mut self, r: usize) {
        let (name, wall) = (self.relays.slots[r].name.clone(), self.relay_wall());
        let (failed, retried) = {
            let mut store = self.store.get();
            let failed: Vec<u64> = store
                .parked(&name)
                .unwrap_or_default()
                .into_iter()
                .filter(|p| p.status == ParkedStatus::Failed)
                .map(|p| p.effect.position)
                .collect();
            let retried = store.retry_failed(&name, None, wall).unwrap_or(0);
            (failed, retried)
        };
        if retried > 0 {
            for &position in &failed {
                self.relays.refusals.insert((r, position), 0);
            }
            self.count(Fault::OperatorRetry);
            self.relay_log(r, || format!("operator: retried {failed:?}"));
        }
        // Effects not passed yet may still be refused until their schedule
        // ends (late deliveries, an outage past the fault phase): the
        // operator stays until the run is done.
        if !self.faulting() && !self.done() {
            self.after(
                Duration::from_secs(2),
                Ev::RelayFault(r, Fault::OperatorRetry),
            );
        }
    }

    /// Starts relay process `r` (again): a new run name, a driver that
    /// opens its row first.
    pub(super) fn relay_restart(&mut self, r: usize) {
        let wall = self.relay_wall();
        let seed = self.relays.rng.random();
        let timings = &self.relays.timings;
        // The control: the driver renews every third of a lease three
        // times the one the store grants (`store_lease`).
        let lease = if self.control == Control::RenewalOncePerLease {
            timings.lease * 3
        } else {
            timings.lease
        };
        let slot = &mut self.relays.slots[r];
        if slot.run.is_some() {
            return;
        }
        slot.inc += 1;
        let settings = RelaySettings {
            batch: slot.batch,
            concurrency: slot.concurrency,
            poll_interval: timings.poll,
            schedule: slot.schedule.clone(),
            lease,
            coalesce: slot.coalesce,
            seed,
            save_every: timings.save_every,
            memory: RELAY_MEMORY,
        };
        slot.run = Some(Running {
            driver: RelayDriver::new(format!("{}#{}", slot.name, slot.inc), settings, wall),
            timer: 0,
            unsure: true,
        });
        let inc = slot.inc;
        self.relay_log(r, || "started".to_owned());
        self.relay_step(r, inc);
    }

    /// An event of relay `r`'s incarnation `inc` (dropped when that
    /// incarnation crashed, except an attempt on its way to the
    /// destination, which still arrives).
    pub(super) fn relay_event(&mut self, r: usize, inc: u32, ev: RelayEv) {
        let live = self.relays.slots[r].inc == inc && self.relays.slots[r].run.is_some();
        match ev {
            RelayEv::Attempt {
                chain,
                effect,
                answer,
            } => self.attempt_at(r, inc, live, chain, *effect, answer),
            _ if !live => {}
            RelayEv::Step { token } => {
                if self.running(r).timer == token {
                    self.relay_step(r, inc);
                }
            }
            RelayEv::Answer { chain, answer } => {
                let answer = answer.map_err(HandlerError::new);
                self.running(r).driver.answered(chain, answer);
                self.relay_step(r, inc);
            }
            RelayEv::Save {
                generation,
                save,
                lease,
            } => self.relay_save(r, inc, generation, *save, lease),
        }
    }

    fn running(&mut self, r: usize) -> &mut Running {
        self.relays.slots[r].run.as_mut().expect("running")
    }

    /// The lease the store grants a run that asks for `lease`: the relays'
    /// own (under the `renewal-once-per-lease` control the driver asks for
    /// three times it; a release stays zero).
    fn store_lease(&self, lease: Duration) -> Duration {
        if self.control == Control::RenewalOncePerLease && !lease.is_zero() {
            self.relays.timings.lease
        } else {
            lease
        }
    }

    /// A relay rule found broken, reported with the end's checks (the
    /// first 20).
    fn relay_violation(&mut self, what: String) {
        if self.relays.violations.len() < 20 {
            self.relays.violations.push(what);
        }
    }

    /// Does what relay `r`'s driver says until it waits: store reads at
    /// once (the open, the outbox, the lag), a save after a hop to the
    /// store, each send after a hop to the destination, a wait as a timer.
    fn relay_step(&mut self, r: usize, inc: u32) {
        loop {
            let wall = self.relay_wall();
            let next = self.running(r).driver.next(wall);
            match next {
                Next::Open { lease } => self.relay_open(r, lease),
                Next::Measure { after } => {
                    let measured = {
                        let mut store = self.store.get();
                        store.last_position().and_then(|last| {
                            Ok((last, store.effects_after(after, 1)?.first().map(|e| e.at)))
                        })
                    };
                    self.running(r).driver.measured(measured, wall);
                }
                Next::Read {
                    parked,
                    after,
                    limit,
                    max_bytes,
                } => self.relay_read(r, &parked, after, limit, max_bytes),
                Next::Send { chain, effect } => self.send_attempt(r, inc, chain, effect),
                Next::Save {
                    kind,
                    generation,
                    save,
                    lease,
                } => {
                    let position = save.position;
                    self.relay_log(r, || format!("{kind:?} save, cursor {position}"));
                    let lease = self.store_lease(lease);
                    let d = self.relay_hop();
                    let save = Box::new(save);
                    self.after(
                        d,
                        Ev::Relay(
                            r,
                            inc,
                            RelayEv::Save {
                                generation,
                                save,
                                lease,
                            },
                        ),
                    );
                }
                Next::Wait { wait, .. } => {
                    if let Some(wait) = wait {
                        let run = self.running(r);
                        run.timer += 1;
                        let token = run.timer;
                        self.after(wait, Ev::Relay(r, inc, RelayEv::Step { token }));
                    }
                    break;
                }
                Next::Stop => break,
            }
            let notices: Vec<Notice> = self.running(r).driver.notices().collect();
            for n in notices {
                self.relay_log(r, || match n {
                    Notice::Refused(p) => format!(
                        "parked {}:{}@{} {:?} after {} attempts",
                        p.effect.position,
                        p.effect.object_id,
                        p.effect.version,
                        p.status,
                        p.attempts
                    ),
                    n => format!("{n:?}"),
                });
            }
        }
    }

    /// `Next::Open`: the row opened with this run as owner (and its parked
    /// effects when it holds the lease); the full disk refuses the write.
    fn relay_open(&mut self, r: usize, lease: Duration) {
        let (name, wall) = (self.relays.slots[r].name.clone(), self.relay_wall());
        let owner = self.running(r).driver.owner().to_owned();
        let lease = self.store_lease(lease);
        let mut before = None;
        let opened = if self.now < self.full_until {
            self.count(Fault::RelayWriteRefused);
            Err(StoreError::Failed(
                "postgres: could not extend file: No space left on device".to_owned(),
            ))
        } else {
            let mut store = self.store.get();
            before = store
                .relay(&name)
                .map(|row| (row.owner.clone(), row.generation));
            store
                .open_relay(&name, 0, Some(&owner), wall, lease)
                .and_then(|row| {
                    let parked = if row.owner.as_deref() == Some(owner.as_str()) {
                        store.parked(&name)?
                    } else {
                        Vec::new()
                    };
                    Ok((row, parked))
                })
        };
        let holds = matches!(&opened, Ok((row, _)) if row.owner.as_deref() == Some(owner.as_str()));
        self.running(r).unsure = !holds;
        // A take-over raises the generation, so that a save of the run it
        // overtook (also one from before A → B → A) is refused.
        if let (Some((Some(was), generation)), Ok((row, _))) = (&before, &opened) {
            if holds && *was != owner && row.generation <= *generation {
                let at = self.now.as_secs_f64();
                self.relay_violation(format!(
                    "relay {name}: {owner} took the lease over from {was} at {at:.3}s and the \
                     generation stayed {} (a take-over must raise it)",
                    row.generation
                ));
            }
        }
        // The control: a `waiting` effect at the head of its object's
        // queue handed over as `failed`, so that it blocks its object.
        let opened = opened.map(|(row, mut parked)| {
            if self.control == Control::WaitingHeadBlocks {
                let mut seen = std::collections::BTreeSet::new();
                for p in &mut parked {
                    if seen.insert(p.effect.object_id.clone()) && p.status == ParkedStatus::Waiting
                    {
                        p.status = ParkedStatus::Failed;
                    }
                }
            }
            (row, parked)
        });
        match &opened {
            Ok((row, parked)) => self.relay_log(r, || {
                format!(
                    "opened: owner {:?}, cursor {}, generation {}, {} parked",
                    row.owner,
                    row.position,
                    row.generation,
                    parked.len()
                )
            }),
            Err(e) => self.relay_log(r, || format!("cannot open its row: {e}")),
        }
        self.running(r).driver.opened(opened, wall);
    }

    /// `Next::Read`: the effects after the cursor (by step number under
    /// the control that reads so); under the control that saves the
    /// cursor before the destination answered, that save at once.
    fn relay_read(&mut self, r: usize, parked: &[u64], after: u64, limit: usize, max_bytes: usize) {
        let wall = self.relay_wall();
        let read = if limit == 0 {
            Ok(Vec::new())
        } else if self.control == Control::RelayReadsByStepNumber {
            Ok(self.store.get().effects_after_step(after, limit))
        } else {
            self.store.get().effects_within(after, limit, max_bytes)
        };
        let loaded = self.store.get().effects_at(parked);
        if let Ok(new) = &read {
            if !new.is_empty() {
                self.relay_log(r, || {
                    let e: Vec<String> = new
                        .iter()
                        .map(|e| format!("{}:{}@{}", e.position, e.object_id, e.version))
                        .collect();
                    format!("read after {after}: [{}]", e.join(" "))
                });
            }
        }
        let read_to = read
            .as_ref()
            .ok()
            .and_then(|n| n.last())
            .map(|e| e.position);
        let read = read.and_then(|new| {
            Ok(RoundRead {
                parked: loaded?,
                new,
            })
        });
        self.running(r).driver.read(read, wall);
        if let Some(read_to) =
            read_to.filter(|p| self.control == Control::RelayCursorBeforeHandler && *p > after)
        {
            // The control: the cursor saved before the destination answered.
            let early = RelaySave {
                position: read_to,
                ..RelaySave::default()
            };
            let name = self.relays.slots[r].name.clone();
            let lease = self.relays.timings.lease;
            let driver = &self.running(r).driver;
            let (generation, owner) = (driver.generation().unwrap_or(0), driver.owner().to_owned());
            let _ = self
                .store
                .get()
                .save_relay(&name, generation, &owner, &early, wall, lease);
        }
    }

    /// Sends `effect`, chain `chain`'s next, to the destination.
    fn send_attempt(&mut self, r: usize, inc: u32, chain: usize, effect: Effect) {
        let timeout = self.relay_fault_on(Fault::DestinationTimeout)
            && self
                .relays
                .rng
                .random_bool(self.relays.timings.timeout_rate);
        let d = self.relay_hop();
        self.after(
            d,
            Ev::Relay(
                r,
                inc,
                RelayEv::Attempt {
                    chain,
                    effect: Box::new(effect),
                    answer: !timeout,
                },
            ),
        );
        if timeout {
            self.count(Fault::DestinationTimeout);
            let t = self.relays.timings.attempt_timeout;
            self.after(
                t,
                Ev::Relay(
                    r,
                    inc,
                    RelayEv::Answer {
                        chain,
                        answer: Err(format!("no answer within {t:?}")),
                    },
                ),
            );
        }
    }

    /// At the destination: an attempt accepted, or refused (down, or a
    /// refusal of the fault phase); a timed-out attempt is accepted or not
    /// (its answer does not go back). An accepted coalesced send counts
    /// for the effects it names in `replaces` too. An attempt of a crashed
    /// relay process still arrives (it was on the wire); nothing answers
    /// it.
    fn attempt_at(
        &mut self,
        r: usize,
        inc: u32,
        live: bool,
        chain: usize,
        effect: Effect,
        answer: bool,
    ) {
        let down = self.now < self.relays.destinations[r].down_until;
        let refused = if down {
            Some("connection refused (destination down)".to_owned())
        } else if !answer {
            self.relays
                .rng
                .random_bool(0.5)
                .then(|| "too slow".to_owned())
        } else if self.relay_fault_on(Fault::DestinationRefusal)
            && self.relays.rng.random_bool(self.relays.timings.refuse_rate)
        {
            self.count(Fault::DestinationRefusal);
            Some("503 Service Unavailable".to_owned())
        } else {
            None
        };
        let dest = &mut self.relays.destinations[r];
        let first = refused.is_none() && !dest.accepted.contains_key(&effect.id);
        if refused.is_none() {
            *dest.accepted.entry(effect.id).or_default() += 1;
            for replaced in &effect.replaces {
                *dest.accepted.entry(replaced.id).or_default() += 1;
            }
        }
        // The effect's step number, not its id: the id's origin is random
        // per receiver start, and a trace depends on nothing but its seed.
        let line = format!(
            "destination: step {} {}:{}@{}{} ({}){}",
            effect.id.seq,
            effect.position,
            effect.object_id,
            effect.version,
            if effect.replaces.is_empty() {
                String::new()
            } else {
                format!(" for {} earlier", effect.replaces.len())
            },
            refused.as_deref().unwrap_or("accepted"),
            if answer { "" } else { ", no answer" }
        );
        dest.received.push(Received {
            effect,
            accepted: refused.is_none(),
            first,
        });
        self.relay_log(r, || line);
        if answer && live {
            let d = self.relay_hop();
            let answer = refused.map_or(Ok(()), Err);
            self.after(d, Ev::Relay(r, inc, RelayEv::Answer { chain, answer }));
        }
    }

    /// A save reaches the store: refused by the full disk, or committed
    /// (its answer lost at times); the driver takes the result (a refused
    /// or failed round's save reads the row and parked effects again).
    fn relay_save(
        &mut self,
        r: usize,
        inc: u32,
        generation: u64,
        save: RelaySave,
        lease: Duration,
    ) {
        let (relay, name) = (r, self.relays.slots[r].name.clone());
        let wall = self.relay_wall();
        let owner = self.running(r).driver.owner().to_owned();
        // A run sure of its lease renews it every third of it: its save
        // reaches the store before the lease lapsed.
        let lapsed = self
            .store
            .get()
            .relay(&name)
            .filter(|row| row.owner.as_deref() == Some(owner.as_str()))
            .and_then(|row| row.lease_until)
            .filter(|until| *until <= wall);
        if let Some(until) = lapsed.filter(|_| !self.running(r).unsure) {
            let ended = until
                .duration_since(self.epoch)
                .unwrap_or_default()
                .as_secs_f64();
            let at = self.now.as_secs_f64();
            self.relay_violation(format!(
                "relay {name}: {owner}'s lease lapsed at {ended:.3}s while it ran, no write of \
                 its refused; its save reached the store only at {at:.3}s (a lease is renewed \
                 every third of it)"
            ));
        }
        let result = if self.now < self.full_until {
            self.count(Fault::RelayWriteRefused);
            Err(StoreError::Failed(
                "postgres: could not extend file: No space left on device".to_owned(),
            ))
        } else {
            let r = self
                .store
                .get()
                .save_relay(&name, generation, &owner, &save, wall, lease);
            if matches!(r, Ok(true)) {
                self.count_refusals(relay, &name, &save);
            }
            if r.is_ok()
                && self.relay_fault_on(Fault::RelaySaveLost)
                && self
                    .relays
                    .rng
                    .random_bool(self.relays.timings.save_lost_rate)
            {
                self.count(Fault::RelaySaveLost);
                Err(StoreError::Failed(
                    "postgres: connection lost after COMMIT was sent".to_owned(),
                ))
            } else {
                r
            }
        };
        let position = save.position;
        self.relay_log(r, || format!("save cursor {position}: {result:?}"));
        self.running(r).unsure = !matches!(result, Ok(true));
        self.running(r).driver.saved(result, wall);
        self.relay_step(r, inc);
    }

    /// A save of relay `r` committed: each effect it parked after a
    /// refusal has one attempt more than the refusals saved since its
    /// schedule (re)started (an operator's retry restarts it).
    fn count_refusals(&mut self, r: usize, name: &str, save: &RelaySave) {
        for p in &save.park {
            let key = (r, p.effect.position);
            if p.attempts == 0 {
                self.relays.refusals.remove(&key);
                continue;
            }
            let since = self.relays.refusals.get(&key).copied().unwrap_or(0) + 1;
            self.relays.refusals.insert(key, since);
            if p.attempts != since {
                let e = &p.effect;
                self.relay_violation(format!(
                    "relay {name}: {}:{}@{} parked {:?} as attempt {}, but {since} refusal(s) \
                     were saved since its schedule (re)started (an operator's retry restarts it)",
                    e.position, e.object_id, e.version, p.status, p.attempts
                ));
            }
        }
        for position in &save.unpark {
            self.relays.refusals.remove(&(r, *position));
        }
    }
}
