//! The relays of the simulated cluster (docs/CONTRACT.md §10): named relay
//! processes that read the store's outbox by position and hand every effect
//! to a destination of their own, keeping their cursor in the store.
//!
//! A relay process runs the relay task's loop (`Runner::run` in
//! `src/relay.rs`) on the library's own planning, [`Plan`]: it opens its
//! row (taking the lease, waiting while another run holds it), reads the
//! effects after its cursor, lets [`Plan::round`] make the round's chains,
//! hands each chain's [`Chain::sends`] to its destination one after the
//! other (at most `concurrency` chains at once), turns the answers into
//! [`Chain::outcome`]s, [`Plan::settle`]s them and saves the
//! [`snapshot_receiver_core::write::RelaySave`] in one store
//! transaction, conditioned on the generation it read, before
//! [`Plan::saved`]. Only the loop around the plan is the simulation's.
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
//! relay's save meets the full disk, or commits and loses its answer.

use super::{Ev, World};
use crate::{Control, Fault};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use snapshot_receiver::relay::{Chain, HandlerError, Outcome, Plan};
use snapshot_receiver_core::engine::Effect;
use snapshot_receiver_core::store::{OutboxStore, StoreError};
use snapshot_receiver_core::write::{ParkedEffect, RelaySave};
use snapshot_receiver_core::EffectId;
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

/// The relays' settings (the same for every seed).
#[derive(Clone, Debug)]
pub struct RelayTimings {
    /// The waits between a refused attempt and the next one: short, so
    /// that retries happen within a run, and 63.75 s in all, past the fault
    /// phase, so that no effect exhausts its schedule (none is parked
    /// `failed`: every effect must reach its destination by the end).
    pub schedule: Vec<Duration>,
    /// How long a relay with nothing new waits before it reads again.
    pub poll: Duration,
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
            poll: Duration::from_millis(250),
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
}

/// A round being handed out.
struct Handing {
    /// The cursor the round moves to ([`Plan::settle`]'s `position`).
    read_to: u64,
    /// The new effects [`Plan::round`] parked `waiting`.
    waiting: Vec<ParkedEffect>,
    /// The chains not handed out yet, and those with the destination:
    /// each with its sends and how many were accepted.
    chains: Vec<Option<(Chain, Vec<Effect>, usize)>>,
    /// The next chain to hand out.
    next: usize,
    /// Chains with the destination now.
    active: usize,
    /// The chains done.
    outcomes: Vec<Outcome>,
}

/// A running relay process.
struct Running {
    /// Its run's name for the lease (`<relay>#<incarnation>`).
    owner: String,
    /// Its state, once it holds the lease.
    plan: Option<Plan>,
    /// The round being handed out.
    handing: Option<Handing>,
    /// The save in flight: the save, and the round's end instant.
    saving: Option<(RelaySave, SystemTime)>,
    /// When it last saved (renewing its lease).
    renewed: Duration,
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
}

/// The relays of one seed's run.
pub struct Relays {
    /// Their own randomness, seeded from the run's seed.
    rng: ChaCha8Rng,
    /// The settings.
    pub timings: RelayTimings,
    /// The relay processes, one per name.
    pub slots: Vec<RelaySlot>,
    /// Each relay's destination (the same index).
    pub destinations: Vec<Destination>,
}

impl Relays {
    /// One or two named relays, each reading 1 to 6 effects per round with
    /// 1 to 4 objects at the destination at once, started in the first
    /// 0.5 s; the relay faults of the seed at random times of the fault
    /// phase.
    pub(super) fn new(seed: u64, fault_phase: Duration) -> (Self, Vec<(Duration, Ev)>) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7e1a_7e1a);
        let timings = RelayTimings::default();
        let n = rng.random_range(1..=2);
        let slots: Vec<RelaySlot> = (0..n)
            .map(|i| RelaySlot {
                name: ["app", "audit"][i].to_owned(),
                inc: 0,
                run: None,
                batch: rng.random_range(1..=6),
                concurrency: rng.random_range(1..=4),
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
        let relays = Relays {
            rng,
            timings,
            slots,
            destinations: (0..n).map(|_| Destination::default()).collect(),
        };
        (relays, events)
    }
}

/// A relay's event.
#[derive(Debug)]
pub enum RelayEv {
    /// The process tries to open its row (take the lease).
    Open,
    /// The process starts a round.
    Round,
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
    /// The round's save reaches the store.
    Save,
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
    /// parked (as the store holds them), and is up with no round under
    /// way: the relays drained.
    pub(super) fn relays_drained(&self) -> bool {
        let store = self.store.get();
        let last = store.positions().last().copied().unwrap_or(0);
        self.relays.slots.iter().all(|s| {
            s.run.as_ref().is_some_and(|run| {
                run.plan.is_some() && run.handing.is_none() && run.saving.is_none()
            }) && store.relay(&s.name).is_some_and(|row| row.position >= last)
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
            _ => {}
        }
    }

    /// Starts relay process `r` (again): a new run name, its row to open.
    pub(super) fn relay_restart(&mut self, r: usize) {
        let slot = &mut self.relays.slots[r];
        if slot.run.is_some() {
            return;
        }
        slot.inc += 1;
        slot.run = Some(Running {
            owner: format!("{}#{}", slot.name, slot.inc),
            plan: None,
            handing: None,
            saving: None,
            renewed: self.now,
        });
        let inc = slot.inc;
        self.relay_log(r, || "started".to_owned());
        self.after(Duration::ZERO, Ev::Relay(r, inc, RelayEv::Open));
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
            RelayEv::Open => self.relay_open(r, inc),
            RelayEv::Round => self.relay_round(r, inc),
            RelayEv::Answer { chain, answer } => self.relay_answer(r, inc, chain, answer),
            RelayEv::Save => self.relay_save(r, inc),
        }
    }

    fn running(&mut self, r: usize) -> &mut Running {
        self.relays.slots[r].run.as_mut().expect("running")
    }

    /// `Runner::open`: the row opened with this run as owner; while
    /// another run holds the lease, tried again after a quarter of it
    /// (at most 1 s); a store error (the full disk refuses the write),
    /// after 0.5 s.
    fn relay_open(&mut self, r: usize, inc: u32) {
        let (name, lease, wall) = (
            self.relays.slots[r].name.clone(),
            self.relays.timings.lease,
            self.relay_wall(),
        );
        if self.now < self.full_until {
            self.count(Fault::RelayWriteRefused);
            self.relay_log(r, || "cannot open its row (store full)".to_owned());
            self.after(Duration::from_millis(500), Ev::Relay(r, inc, RelayEv::Open));
            return;
        }
        let owner = self.running(r).owner.clone();
        let opened = {
            let mut store = self.store.get();
            store
                .open_relay(&name, 0, Some(&owner), wall, lease)
                .and_then(|row| Ok((row, store.parked(&name)?)))
        };
        let (row, parked) = match opened {
            Ok(o) => o,
            Err(e) => {
                self.record
                    .problems
                    .push(format!("relay {name}: open: {e}"));
                return;
            }
        };
        if row.owner.as_deref() != Some(owner.as_str()) {
            let wait = (lease / 4).min(Duration::from_secs(1));
            self.relay_log(r, || format!("waits: {:?} holds the lease", row.owner));
            self.after(wait, Ev::Relay(r, inc, RelayEv::Open));
            return;
        }
        self.relay_log(r, || {
            format!(
                "holds its lease: cursor {}, generation {}, {} parked",
                row.position,
                row.generation,
                parked.len()
            )
        });
        let schedule = self.relays.timings.schedule.clone();
        let now = self.now;
        let run = self.running(r);
        run.plan = Some(Plan::new(row, parked, schedule));
        run.renewed = now;
        let d = self.relay_hop();
        self.after(d, Ev::Relay(r, inc, RelayEv::Round));
    }

    /// One round of `Runner::run`: read after the cursor, plan, and hand
    /// out, or (nothing to do, the lease renewed recently) wait for the
    /// next due effect or the poll interval.
    fn relay_round(&mut self, r: usize, inc: u32) {
        let wall = self.relay_wall();
        let (batch, poll, lease) = (
            self.relays.slots[r].batch,
            self.relays.timings.poll,
            self.relays.timings.lease,
        );
        let control = self.control;
        let now = self.now;
        let Some(plan) = self.running(r).plan.as_ref() else {
            return;
        };
        let after = plan.position();
        let new = if control == Control::RelayReadsByStepNumber {
            self.store.get().effects_after_step(after, batch)
        } else {
            let read = self.store.get().effects_after(after, batch);
            match read {
                Ok(new) => new,
                Err(e) => {
                    self.record.problems.push(format!("relay read: {e}"));
                    return;
                }
            }
        };
        let read_to = new.last().map_or(after, |e| e.position);
        let run = self.relays.slots[r].run.as_mut().expect("running");
        let plan = run.plan.as_ref().expect("open");
        let (chains, waiting) = plan.round(wall, new);
        let idle = chains.is_empty() && waiting.is_empty();
        if idle && now.saturating_sub(run.renewed) < lease / 3 {
            let wait = plan
                .next_due()
                .and_then(|due| due.duration_since(wall).ok())
                .map_or(poll, |d| d.min(poll));
            self.after(wait, Ev::Relay(r, inc, RelayEv::Round));
            return;
        }
        if !chains.is_empty() {
            self.relay_log(r, || {
                let chains: Vec<String> = chains
                    .iter()
                    .map(|c| {
                        let e: Vec<String> = c
                            .effects()
                            .map(|e| format!("{}:{}@{}", e.position, e.object_id, e.version))
                            .collect();
                        e.join(" ")
                    })
                    .collect();
                format!("round after {after}: [{}]", chains.join("] ["))
            });
        }
        if control == Control::RelayCursorBeforeHandler && read_to > after {
            // The control: the cursor saved before the handler answered.
            let early = RelaySave {
                park: waiting.clone(),
                unpark: Vec::new(),
                position: read_to,
            };
            let name = self.relays.slots[r].name.clone();
            let run = self.relays.slots[r].run.as_ref().expect("running");
            let plan = run.plan.as_ref().expect("open");
            let (generation, owner) = (plan.generation(), run.owner.clone());
            let _ = self
                .store
                .get()
                .save_relay(&name, generation, &owner, &early, wall, lease);
        }
        let handing = Handing {
            read_to,
            waiting,
            chains: chains
                .into_iter()
                .map(|c| {
                    let sends = c.sends(false);
                    Some((c, sends, 0))
                })
                .collect(),
            next: 0,
            active: 0,
            outcomes: Vec::new(),
        };
        self.running(r).handing = Some(handing);
        self.hand_out(r, inc);
    }

    /// Hands chains out until `concurrency` are with the destination; a
    /// round whose chains are all done is settled and saved.
    fn hand_out(&mut self, r: usize, inc: u32) {
        let concurrency = self.relays.slots[r].concurrency;
        loop {
            let h = self.running(r).handing.as_mut().expect("handing");
            if h.next < h.chains.len() && h.active < concurrency {
                let chain = h.next;
                h.next += 1;
                h.active += 1;
                self.send_attempt(r, inc, chain);
                continue;
            }
            if h.active == 0 {
                break;
            }
            return;
        }
        // Every chain answered: `Plan::settle`, then the save.
        let wall = self.relay_wall();
        let run = self.running(r);
        let h = run.handing.take().expect("handing");
        let plan = run.plan.as_ref().expect("open");
        let save = plan.settle(wall, h.outcomes, h.waiting, h.read_to);
        run.saving = Some((save, wall));
        let d = self.relay_hop();
        self.after(d, Ev::Relay(r, inc, RelayEv::Save));
    }

    /// Sends chain `chain`'s next effect to the destination.
    fn send_attempt(&mut self, r: usize, inc: u32, chain: usize) {
        let h = self.running(r).handing.as_ref().expect("handing");
        let (_, sends, accepted) = h.chains[chain].as_ref().expect("active");
        let effect = sends[*accepted].clone();
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
    /// (its answer does not go back). An attempt of a crashed relay
    /// process still arrives (it was on the wire); nothing answers it.
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
        }
        // The effect's step number, not its id: the id's origin is random
        // per receiver start, and a trace depends on nothing but its seed.
        let line = format!(
            "destination: step {} {}:{}@{} ({}){}",
            effect.id.seq,
            effect.position,
            effect.object_id,
            effect.version,
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

    /// At the relay: an answer of chain `chain`'s attempt. Accepted, the
    /// chain's next effect goes; refused (or done), the chain's outcome is
    /// taken and the next chain goes.
    fn relay_answer(&mut self, r: usize, inc: u32, chain: usize, answer: Result<(), String>) {
        let Some(h) = self.running(r).handing.as_mut() else {
            return;
        };
        let Some((_, sends, accepted)) = h.chains.get_mut(chain).and_then(Option::as_mut) else {
            return;
        };
        let refused = match answer {
            Ok(()) => {
                *accepted += 1;
                if *accepted < sends.len() {
                    self.send_attempt(r, inc, chain);
                    return;
                }
                None
            }
            Err(why) => Some(HandlerError::new(why)),
        };
        let (c, _, accepted) = h.chains[chain].take().expect("active");
        h.active -= 1;
        h.outcomes.push(c.outcome(accepted, refused, false));
        self.hand_out(r, inc);
    }

    /// The round's save reaches the store: refused by the full disk, or
    /// committed (its answer lost at times); refused as stale (another run
    /// or an operator changed the relay), or failed, the row and its parked
    /// effects are read again (the save may have committed), when
    /// [`Plan::after_save`] says, as `Runner::run` does.
    fn relay_save(&mut self, r: usize, inc: u32) {
        let name = self.relays.slots[r].name.clone();
        let lease = self.relays.timings.lease;
        let wall = self.relay_wall();
        let run = self.running(r);
        let Some((save, ended)) = run.saving.take() else {
            return;
        };
        let plan = run.plan.as_ref().expect("open");
        let (generation, owner) = (plan.generation(), run.owner.clone());
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
        let now = self.now;
        let run = self.running(r);
        let plan = run.plan.as_mut().expect("open");
        let after = plan.after_save(result.map(|held| (save, held)), ended);
        match after.reopen_after() {
            None => {
                run.renewed = now;
                let d = self.relay_hop();
                self.after(d, Ev::Relay(r, inc, RelayEv::Round));
            }
            Some(wait) => {
                run.plan = None;
                self.after(wait, Ev::Relay(r, inc, RelayEv::Open));
            }
        }
    }
}
