//! The reconciler in the simulated cluster (docs/CONTRACT.md §4, *The
//! service fetches authorities itself*): once the cluster settled, one
//! receiver process is started again on the store, as the `reconciler`
//! command starts, and runs the core's shipped reconciler policy, the
//! [`WorkQueue`], against a simulated authority. It does what
//! [`WorkQueue::next`] says, as events on the simulation's clock: a scan
//! is a [`Work::Read`] of every shard of the process ([`Shard::authority_needs`]);
//! a fetch asks the authority; an answer about the object asked goes to its
//! shard as a [`Work::Reconcile`] through the process's [`Pipeline`] and
//! the store's commits (with their faults), followed by a read of what the
//! object still needs ([`Shard::authority_need`]); the outcome goes back to
//! the queue ([`WorkQueue::answered`]), as the library's reconciler task
//! hands it.
//!
//! The authority knows every object at a version above any the stream
//! carries (the upstream moved on). Its faults, each on or off per seed and
//! only during the authority's fault window: it is slow (answers after 1 to
//! 20 s, past the 10 s deadline at times: a timeout), down for a spell (503,
//! with or without `Retry-After`), answers a version older than the object
//! (stale), a snapshot of another object, or "no such object" for an
//! object the receiver does not know yet; the process running the
//! reconciler crashes and starts again (its queue lost: what needs an
//! authority is read from the store again); the store's commits fail,
//! stall, conflict or lose their answer as during the cluster's fault
//! phase.
//!
//! Checked (reported with the run's other checks):
//! - **convergence**: every object that needed an authority when the phase
//!   started (read from the store through the core's `resume`, as a
//!   restarted receiver reads it) holds the authority's version and state,
//!   unpaused, with nothing held or parked for it, no later than
//!   [`Recon::bound`] after the authority answers well
//!   ([`Recon::healthy_at`]); and at the end nothing in the store needs an
//!   authority;
//! - **a bad answer changes nothing**: every authoritative replacement of
//!   the phase is the authority's own snapshot of that object, and there is
//!   at most one per object (a second apply of one authority is decided
//!   again on the stored row: equal).
//!
//! [`Pipeline`]: snapshot_receiver_core::engine::Pipeline
//! [`Shard::authority_needs`]: snapshot_receiver_core::engine::Shard::authority_needs
//! [`Shard::authority_need`]: snapshot_receiver_core::engine::Shard::authority_need

use super::{Ev, Token, World};
use crate::{Control, Fault};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use snapshot_receiver_core::engine::{
    resume, Answer, AuthoritativeSnapshot, Context, ReconcileError, Reply, Shard, Work,
};
use snapshot_receiver_core::reconciler::{
    AuthorityError, AuthorityNeed, FetchOutcome, NeedReasons, Next, ReconcilerSettings, WorkQueue,
};
use snapshot_receiver_core::store::Store;
use snapshot_receiver_core::write::HeldStatus;
use snapshot_receiver_core::ManualClock;
use snapshot_receiver_loadgen::Stream;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The reconciler's deadline for one fetch.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Events handled in the phase at most: a phase that has not ended by then
/// failed (it never loops at one instant for ever: every wait is at least
/// a millisecond, and the phase has a deadline in simulated time).
const MOST_STEPS: u64 = 400_000;

/// The versions the authority knows objects at start here: 2^56, above any
/// the generated stream carries (its versions run from 2^32 up).
const TRUTH_FROM: u64 = 1 << 56;

/// An event of the reconciler's process (its incarnation in `Ev::Recon`).
#[derive(Debug)]
pub enum ReconEv {
    /// The queue's wait is over: ask it what to do.
    Wake,
    /// A fetch of the object comes back with this answer.
    Answer(Arc<str>, Authority),
    /// The reconciler's process crashes (and starts again).
    Crash,
}

/// What the simulated authority answered.
#[derive(Clone, Debug)]
pub enum Authority {
    /// A snapshot: the object it names, its version and state.
    Snapshot(Arc<str>, u64, String),
    /// No such object.
    Absent,
    /// A failure (unavailable, timed out).
    Failed(AuthorityError),
}

/// What a shard answered the reconciler's work.
#[derive(Debug)]
pub enum Reconciled {
    /// The reconcile of the object: replaced or not, or refused as older,
    /// or not applied (why).
    Applied(Arc<str>, Result<bool, ReconcileError>),
    /// What the object still needs after it.
    Need(Arc<str>, NeedReasons),
    /// A shard's part of a scan.
    Scan(Vec<AuthorityNeed>),
}

/// The reply token of the reconciler's work: where a shard's answer goes
/// (the process's incarnation with it).
pub struct ReconToken {
    /// The answers, in order.
    out: Rc<RefCell<Vec<(u32, Reconciled)>>>,
    /// The incarnation that sent the work.
    inc: u32,
    /// Which work.
    kind: Kind,
}

/// Which of the reconciler's works a [`ReconToken`] answers.
enum Kind {
    Reconcile(Arc<str>),
    Need(Arc<str>),
    Scan,
}

impl Reply for ReconToken {
    fn answer(self, answer: Answer<'_>) {
        let got = match (self.kind, answer) {
            (Kind::Reconcile(id), Answer::Reconciled(r)) => {
                Reconciled::Applied(id, r.map(|report| report.replacement))
            }
            (Kind::Need(id), Answer::Read(shard)) => {
                let need = shard.authority_need(&id);
                Reconciled::Need(id, need)
            }
            (Kind::Scan, Answer::Read(shard)) => Reconciled::Scan(shard.authority_needs()),
            _ => return,
        };
        self.out.borrow_mut().push((self.inc, got));
    }
}

/// The authority's faults of one seed.
#[derive(Clone, Debug)]
struct Faults {
    /// Slow (1 to 20 s an answer) before this.
    slow_until: Duration,
    /// Down (503) in this spell.
    down: Option<(Duration, Duration)>,
    /// The `Retry-After` of a 503.
    retry_after: Option<Duration>,
    /// Share of answers that are older than the object.
    stale_rate: f64,
    /// Share of answers that are about another object.
    wrong_rate: f64,
    /// "No such object" for an object the receiver does not know, before
    /// this.
    absent_until: Duration,
    /// Stale and wrong answers, commit faults and crashes happen before
    /// this.
    until: Duration,
}

/// The reconciler's phase of one run.
pub struct Recon {
    /// The process that runs the reconciler.
    slot: usize,
    /// The incarnation the queue belongs to (a crash loses the queue).
    inc: u32,
    /// The policy (`None`: its process is down).
    queue: Option<WorkQueue>,
    /// How the queue schedules.
    settings: ReconcilerSettings,
    /// The shards' answers to the reconciler's work.
    out: Rc<RefCell<Vec<(u32, Reconciled)>>>,
    /// The outcome of a reconcile, waiting for the read of what its object
    /// still needs.
    pending: BTreeMap<Arc<str>, FetchOutcome>,
    /// A scan out: the shards yet to answer, what they answered, when it
    /// started.
    scan: Option<(usize, Vec<AuthorityNeed>, SystemTime)>,
    /// When the queue's next wake-up is due.
    wake_at: Option<Duration>,
    /// Fetches out (object → when sent).
    in_flight: BTreeMap<Arc<str>, Duration>,
    /// The authority's version and state of every object.
    truth: BTreeMap<Arc<str>, (u64, String)>,
    /// The authority's faults.
    faults: Faults,
    /// The objects that needed an authority when the phase started, and
    /// when each converged.
    needed: BTreeMap<Arc<str>, Option<Duration>>,
    /// When the phase started.
    start: Duration,
    /// When the authority answers well from (every fault over).
    pub healthy_at: Duration,
    /// How long after `healthy_at` every object must have converged.
    pub bound: Duration,
    /// The store's replacement rows before the phase.
    replacements_from: usize,
    /// The phase's own randomness.
    rng: ChaCha8Rng,
    /// The queue's clock: the process's wall clock when it started, and
    /// the simulated time then. The queue runs on a monotonic clock (that
    /// wall time plus the time since), as the library's reconciler does:
    /// a wall clock stepped back would hold every timer back as much.
    anchor: (SystemTime, Duration),
    /// Fetches made.
    pub fetches: u64,
}

impl Recon {
    /// Whether the reconciler's process may have commit faults at `now`.
    pub(super) fn faulting(&self, now: Duration) -> bool {
        now < self.faults.until
    }
}

impl World<'_> {
    /// The time the reconciler's queue is given now: its monotonic clock,
    /// or, under the `reconciler-on-wall-clock` control, process `s`'s wall
    /// clock (skewed by a fault at times).
    fn queue_now(&self, s: usize) -> SystemTime {
        match (&self.recon, self.control) {
            (Some(r), c) if c != Control::ReconcilerOnWallClock => {
                r.anchor.0 + self.now.saturating_sub(r.anchor.1)
            }
            _ => self.wall(s),
        }
    }
}

/// What needs an authority in `world`'s store, read through the core's
/// `resume` as a restarted receiver reads it.
fn store_needs(world: &World<'_>) -> Result<Vec<AuthorityNeed>, String> {
    let stream = world.stream;
    let ctx = Context::new(
        stream.config(world.cfg.shards),
        Arc::new(ManualClock::new(Stream::clock().now())),
    );
    let mut shards: Vec<Shard> = (0..world.cfg.shards).map(|_| Shard::new()).collect();
    let loaded = world.store.get().load(UNIX_EPOCH);
    loaded
        .and_then(|l| resume(&ctx, &mut shards, l))
        .map_err(|e| format!("the store does not load: {e}"))?;
    Ok(shards.iter().flat_map(Shard::authority_needs).collect())
}

impl World<'_> {
    /// The reconciler's phase, after the cluster settled (see the module
    /// doc): its failures.
    pub fn reconcile_phase(&mut self, seed: u64) -> Vec<String> {
        let needs = match store_needs(self) {
            Ok(n) => n,
            Err(e) => return vec![e],
        };
        if needs.is_empty() {
            return Vec::new();
        }
        // Nothing reconciled before now; from now on the authority un-pauses.
        self.record.paused_by.clear();
        let problems_from = self.record.problems.len();
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x2ec0_5c11);
        let start = self.now;
        let settings = crate::authority::drawn_settings(&mut rng, seed, false);
        let window = Duration::from_millis(rng.random_range(0..=120_000));
        let at = |rng: &mut ChaCha8Rng| {
            start + Duration::from_millis(rng.random_range(0..=window.as_millis() as u64))
        };
        let slow_until = if rng.random_bool(0.3) && self.on(Fault::AuthoritySlow) {
            at(&mut rng)
        } else {
            start
        };
        let down = (rng.random_bool(0.5) && self.on(Fault::AuthorityDown)).then(|| {
            let from = at(&mut rng);
            (
                from,
                from + Duration::from_millis(rng.random_range(1_000..=120_000)),
            )
        });
        let retry_after = rng
            .random_bool(0.5)
            .then(|| Duration::from_secs(rng.random_range(1..=60)));
        let stale_rate = if rng.random_bool(0.5) && self.on(Fault::AuthorityStale) {
            0.5
        } else {
            0.0
        };
        let wrong_rate = if rng.random_bool(0.4) && self.on(Fault::AuthorityWrongObject) {
            0.3
        } else {
            0.0
        };
        let absent_until = if rng.random_bool(0.4) && self.on(Fault::AuthorityAbsent) {
            at(&mut rng)
        } else {
            start
        };
        let until = start + window;
        let faults = Faults {
            slow_until,
            down,
            retry_after,
            stale_rate,
            wrong_rate,
            absent_until,
            until,
        };
        let healthy_at = [until, slow_until, absent_until, down.map_or(start, |d| d.1)]
            .into_iter()
            .max()
            .unwrap_or(start);
        // The truth: every object the store or a need names.
        let mut ids: Vec<Arc<str>> = self
            .store
            .get()
            .object_rows()
            .map(|o| o.object_id.clone())
            .collect();
        ids.extend(needs.iter().map(|n| n.object_id.clone()));
        ids.sort();
        ids.dedup();
        let truth = ids
            .into_iter()
            .map(|id| {
                let v = TRUTH_FROM + rng.random_range(0..=3);
                let state = format!(r#"{{"authority":"{id}","v":{v}}}"#);
                (id, (v, state))
            })
            .collect();
        // The bound: a backoff at its longest (with jitter) after an
        // attempt's deadline, the breaker's open spell and a Retry-After, a
        // commit stalled and a restart, and every object once through the
        // bucket and the concurrency bound, plus a rescan.
        let n = needs.len() as u32;
        let drain = Duration::from_secs_f64(f64::from(n) / settings.rate.unwrap_or(1e9))
            + Duration::from_millis(100) * n.div_ceil(settings.concurrency as u32);
        let bound = settings.backoff_max * 6 / 5
            + settings.breaker_open
            + retry_after.unwrap_or_default()
            + TIMEOUT
            + Duration::from_secs(15 + 4)
            + drain
            + settings.rescan
            + Duration::from_secs(2);
        let slot = rng.random_range(0..self.cfg.processes);
        let crashes: Vec<Duration> = if self.on(Fault::ReconcilerCrash) {
            (0..rng.random_range(0..=2)).map(|_| at(&mut rng)).collect()
        } else {
            Vec::new()
        };
        self.log(|| {
            format!(
                "reconciler on m{slot}: {} objects need an authority; {settings:?}; {faults:?}; healthy at {healthy_at:?}, bound {bound:?}",
                needs.len()
            )
        });
        self.recon = Some(Recon {
            slot,
            inc: 0,
            queue: None,
            settings,
            out: Rc::default(),
            pending: BTreeMap::new(),
            scan: None,
            wake_at: None,
            in_flight: BTreeMap::new(),
            truth,
            faults,
            needed: needs.iter().map(|n| (n.object_id.clone(), None)).collect(),
            start,
            healthy_at,
            bound,
            replacements_from: self.store.get().replacements().len(),
            rng,
            fetches: 0,
            anchor: (self.wall(slot), start),
        });
        // The reconciler starts on the store, as the `reconciler` command
        // does: its process started again (nothing of it is in flight: the
        // cluster settled).
        if self.slots[slot].proc.take().is_some() {
            self.log(|| format!("m{slot}: stopped to start the reconciler"));
        }
        self.start(slot);
        for t in crashes {
            let inc = 0;
            self.at(t, Ev::Recon(slot, inc, ReconEv::Crash));
        }
        let limit = healthy_at + bound * 2 + Duration::from_secs(600);
        let mut steps = 0u64;
        let mut failures = Vec::new();
        let mut commits = u64::MAX;
        loop {
            let converged = {
                let store_commits = self.store.get().commits;
                if store_commits != commits {
                    commits = store_commits;
                    self.note_converged();
                }
                self.recon.as_ref().is_some_and(|r| {
                    r.needed.values().all(Option::is_some) && r.in_flight.is_empty()
                })
            };
            if converged {
                break;
            }
            let Some(((t, _), ev)) = self.queue.pop_first() else {
                break;
            };
            if t > limit {
                break;
            }
            steps += 1;
            if steps > MOST_STEPS {
                failures.push(format!(
                    "the reconciler's phase did not end within {MOST_STEPS} events (at {:?})",
                    self.now
                ));
                break;
            }
            self.dispatch(t, ev);
        }
        failures.extend(self.record.problems[problems_from..].iter().cloned());
        failures.extend(self.recon_check());
        failures
    }

    /// Notes the objects the store now shows converged.
    fn note_converged(&mut self) {
        let now = self.now;
        let Some(r) = self.recon.as_mut() else { return };
        let store = self.store.get();
        for (id, done) in r.needed.iter_mut() {
            let converged = r.truth.get(id).is_some_and(|(v, state)| {
                store
                    .object(id)
                    .is_some_and(|o| !o.paused && o.version == *v && o.state == *state)
                    && store.waiting_for(id) == 0
            });
            match (converged, *done) {
                (true, None) => *done = Some(now),
                (false, Some(_)) => *done = None,
                _ => {}
            }
        }
    }

    /// The phase's checks (see the module doc).
    fn recon_check(&mut self) -> Vec<String> {
        let mut failures = Vec::new();
        let Some(r) = self.recon.as_ref() else {
            return failures;
        };
        let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
        let store = self.store.get();
        for row in &store.replacements()[r.replacements_from..] {
            if row.cause_event.is_some() {
                continue;
            }
            let truth = r.truth.get(&row.object_id);
            if truth.is_none_or(|(v, state)| row.version != *v || row.state != *state) {
                failures.push(format!(
                    "a bad answer changed {}: an authoritative replacement to v{} {} (the authority has {:?})",
                    row.object_id, row.version, row.state, truth
                ));
            }
            let n = seen.entry(&row.object_id).or_default();
            *n += 1;
            if *n == 2 {
                failures.push(format!(
                    "{}: two authoritative replacements of one authority",
                    row.object_id
                ));
            }
        }
        drop(store);
        let due = r.start.max(r.healthy_at) + r.bound;
        for (id, done) in &r.needed {
            match done {
                Some(at) if *at > due => failures.push(format!(
                    "{id} converged at {at:?}, later than {:?} after the authority answered well at {:?}",
                    r.bound,
                    r.start.max(r.healthy_at)
                )),
                Some(_) => {}
                None => {
                    let store = self.store.get();
                    let shown = store
                        .object(id)
                        .map(|o| format!("v{} paused {} state {}", o.version, o.paused, o.state));
                    failures.push(format!(
                        "{id} needed an authority and did not converge by {:?} (authority healthy at {:?}, bound {:?}; truth v{}; the store has {shown:?}, {} waiting)",
                        self.now,
                        r.healthy_at,
                        r.bound,
                        r.truth.get(id).map_or(0, |t| t.0),
                        store.waiting_for(id)
                    ));
                }
            }
        }
        if failures.is_empty() {
            match store_needs(self) {
                Ok(left) if left.is_empty() => {}
                Ok(left) => failures.push(format!(
                    "still needing an authority at the end: {:?}",
                    left.iter()
                        .map(|n| format!("{} ({})", n.object_id, n.reasons))
                        .collect::<Vec<_>>()
                )),
                Err(e) => failures.push(e),
            }
        }
        failures
    }

    /// The reconciler's process `s` started (incarnation `inc`): a new
    /// queue, its first scan due at once.
    pub(super) fn recon_attach(&mut self, s: usize, inc: u32) {
        let (wall, now) = (self.wall(s), self.now);
        let Some(r) = self.recon.as_mut() else { return };
        if r.slot != s {
            return;
        }
        r.anchor = (wall, now);
        r.inc = inc;
        r.queue = Some(WorkQueue::new(r.settings.clone(), wall));
        r.pending.clear();
        r.scan = None;
        r.wake_at = None;
        r.in_flight.clear();
        r.out.borrow_mut().clear();
        self.log(|| format!("m{s}#{inc}: reconciler started"));
        self.recon_pump(s);
    }

    /// An event of the reconciler's process.
    pub(super) fn recon_event(&mut self, s: usize, inc: u32, ev: ReconEv) {
        let Some(r) = self.recon.as_mut() else { return };
        if r.slot != s || r.inc != inc && !matches!(ev, ReconEv::Crash) {
            return;
        }
        match ev {
            ReconEv::Wake => {
                if r.wake_at.is_some_and(|at| at <= self.now) {
                    r.wake_at = None;
                }
                self.recon_pump(s);
            }
            ReconEv::Answer(id, answer) => self.recon_answer(s, id, answer),
            ReconEv::Crash => {
                if self.slots[s].proc.is_some() {
                    self.count(Fault::ReconcilerCrash);
                    if let Some(r) = self.recon.as_mut() {
                        r.queue = None;
                    }
                    self.crash(s);
                }
            }
        }
    }

    /// Does what the queue says until it waits.
    fn recon_pump(&mut self, s: usize) {
        loop {
            let wall = self.queue_now(s);
            let now = self.now;
            let Some(r) = self.recon.as_mut() else { return };
            let inc = r.inc;
            let Some(queue) = r.queue.as_mut() else {
                return;
            };
            match queue.next(wall) {
                Next::Fetch { object_id, attempt } => {
                    r.fetches += 1;
                    if r.in_flight.insert(object_id.clone(), now).is_some() {
                        self.record
                            .problems
                            .push(format!("{now:?}: a second fetch of {object_id} in flight"));
                    }
                    let (after, answer) = self.ask_authority(&object_id);
                    self.log(|| format!("reconciler: fetch {object_id} (attempt {attempt}): {answer:?} after {after:?}"));
                    self.after(after, Ev::Recon(s, inc, ReconEv::Answer(object_id, answer)));
                }
                Next::Scan => {
                    let control = self.control;
                    let Some(proc) = self.slots[s].proc.as_mut() else {
                        return;
                    };
                    let r = self.recon.as_mut().expect("reconciling");
                    if control == Control::ReconcilerSkipsStore {
                        // The control: the store is never read; the queue
                        // hears of nothing.
                        if let Some(q) = r.queue.as_mut() {
                            q.scanned(Vec::new(), wall, wall);
                        }
                        continue;
                    }
                    let shards = proc.drives.len();
                    r.scan = Some((shards, Vec::new(), wall));
                    for shard in 0..shards {
                        let token = Token::Recon(ReconToken {
                            out: r.out.clone(),
                            inc,
                            kind: Kind::Scan,
                        });
                        proc.drives[shard]
                            .pipeline
                            .decide(&proc.set, [Work::Read(token)]);
                    }
                    self.pump_all(s);
                    self.drain(s);
                    return;
                }
                Next::Wait(wait) => {
                    if let Some(w) = wait {
                        let at = now + w.max(Duration::from_millis(1));
                        if r.wake_at.is_none_or(|due| due > at || due < now) {
                            r.wake_at = Some(at);
                            self.at(at, Ev::Recon(s, inc, ReconEv::Wake));
                        }
                    }
                    return;
                }
                Next::List { .. } => {
                    // The simulation runs no resync (`resync: None`): a page
                    // asked for anyway is answered empty, which ends it.
                    if let Some(q) = r.queue.as_mut() {
                        q.listed(Vec::new(), wall);
                    }
                }
                Next::Stop => return,
            }
        }
    }

    /// What the authority answers now for `object_id`, and after how long
    /// (an answer past the deadline is a timeout at the deadline).
    fn ask_authority(&mut self, object_id: &Arc<str>) -> (Duration, Authority) {
        let now = self.now;
        let current = self.store.get().object(object_id).map(|o| o.version);
        let r = self.recon.as_mut().expect("reconciling");
        let f = r.faults.clone();
        let mut counted = Vec::new();
        let latency = if now < f.slow_until {
            counted.push(Fault::AuthoritySlow);
            Duration::from_millis(r.rng.random_range(1_000..=20_000))
        } else {
            Duration::from_millis(r.rng.random_range(1..=50))
        };
        let answer = if latency > TIMEOUT {
            (
                TIMEOUT,
                Authority::Failed(AuthorityError::timeout("no answer within 10.000 s")),
            )
        } else if f.down.is_some_and(|(from, to)| now >= from && now < to) {
            counted.push(Fault::AuthorityDown);
            let mut e = AuthorityError::unavailable("503 Service Unavailable");
            if let Some(wait) = f.retry_after {
                e = e.with_retry_after(wait);
            }
            (latency, Authority::Failed(e))
        } else if current.is_none() && now < f.absent_until {
            counted.push(Fault::AuthorityAbsent);
            (latency, Authority::Absent)
        } else if now < f.until && r.rng.random_bool(f.wrong_rate) {
            counted.push(Fault::AuthorityWrongObject);
            let others: Vec<&Arc<str>> = r.truth.keys().filter(|k| *k != object_id).collect();
            let (other, (v, state)) = match others.is_empty() {
                true => (
                    Arc::from("elsewhere"),
                    (TRUTH_FROM, r#"{"elsewhere":true}"#.to_owned()),
                ),
                false => {
                    let o = others[r.rng.random_range(0..others.len())].clone();
                    let t = r.truth[&o].clone();
                    (o, t)
                }
            };
            (latency, Authority::Snapshot(other, v, state))
        } else if let (true, Some(cur @ 1..)) =
            (now < f.until && r.rng.random_bool(f.stale_rate), current)
        {
            counted.push(Fault::AuthorityStale);
            let v = cur - 1;
            (
                latency,
                Authority::Snapshot(object_id.clone(), v, format!(r#"{{"stale":{v}}}"#)),
            )
        } else {
            match r.truth.get(object_id) {
                Some((v, state)) => (
                    latency,
                    Authority::Snapshot(object_id.clone(), *v, state.clone()),
                ),
                None => (latency, Authority::Absent),
            }
        };
        for f in counted {
            self.count(f);
        }
        answer
    }

    /// A fetch's answer is back at the reconciler's process.
    fn recon_answer(&mut self, s: usize, id: Arc<str>, answer: Authority) {
        let Some(r) = self.recon.as_mut() else { return };
        r.in_flight.remove(&id);
        let outcome = match answer {
            Authority::Failed(e) => FetchOutcome::Failed(e),
            Authority::Absent => FetchOutcome::Absent,
            Authority::Snapshot(named, v, state)
                if named == id || self.control == Control::WrongObjectApplied =>
            {
                let as_of = self.wall(s);
                let Some(proc) = self.slots[s].proc.as_mut() else {
                    return;
                };
                let r = self.recon.as_mut().expect("reconciling");
                let snapshot = match AuthoritativeSnapshot::new(&id, v, &state, as_of) {
                    Ok(snap) => snap.forced(self.control == Control::StaleAuthorityApplied),
                    Err(e) => {
                        self.record
                            .problems
                            .push(format!("the authority's state of {id}: {e}"));
                        return;
                    }
                };
                let shard = proc.set.route(Some(&id));
                let token = |kind| {
                    Token::Recon(ReconToken {
                        out: r.out.clone(),
                        inc: r.inc,
                        kind,
                    })
                };
                proc.drives[shard].pipeline.decide(
                    &proc.set,
                    [
                        Work::Reconcile(snapshot, token(Kind::Reconcile(id.clone()))),
                        Work::Read(token(Kind::Need(id))),
                    ],
                );
                self.pump_all(s);
                self.drain(s);
                return;
            }
            Authority::Snapshot(named, ..) => FetchOutcome::WrongObject { answered: named },
        };
        self.recon_answered(s, &id, outcome, NeedReasons::default());
    }

    /// Tells the queue the outcome of a fetch of `id`, then does what it
    /// says.
    fn recon_answered(
        &mut self,
        s: usize,
        id: &Arc<str>,
        outcome: FetchOutcome,
        remaining: NeedReasons,
    ) {
        let wall = self.queue_now(s);
        let Some(r) = self.recon.as_mut() else { return };
        let Some(queue) = r.queue.as_mut() else {
            return;
        };
        let seen = queue.seen();
        let next = queue.answered(id, &outcome, remaining, seen, wall);
        let _ = queue.notices().count();
        self.log(|| {
            format!("reconciler: {id}: {outcome} (still needs: {remaining}); next {next:?}")
        });
        self.recon_pump(s);
    }

    /// Hands the shards' answers to the reconciler's work to the queue
    /// (called with every drain of the process's answers).
    pub(super) fn recon_drain(&mut self, s: usize) {
        loop {
            let Some(r) = self.recon.as_mut() else { return };
            if r.slot != s {
                return;
            }
            let answers: Vec<(u32, Reconciled)> = r.out.borrow_mut().drain(..).collect();
            if answers.is_empty() {
                return;
            }
            for (inc, answer) in answers {
                let wall = self.queue_now(s);
                let r = self.recon.as_mut().expect("reconciling");
                if inc != r.inc {
                    continue;
                }
                match answer {
                    Reconciled::Applied(id, result) => {
                        let outcome = match result {
                            Ok(true) => FetchOutcome::Applied,
                            Ok(false) => FetchOutcome::Unchanged,
                            Err(ReconcileError::AuthorityOlder {
                                offered, current, ..
                            }) => FetchOutcome::Older { offered, current },
                            Err(e) => FetchOutcome::NotApplied(e.to_string()),
                        };
                        r.pending.insert(id, outcome);
                    }
                    Reconciled::Need(id, remaining) => {
                        let outcome = r
                            .pending
                            .remove(&id)
                            .unwrap_or_else(|| FetchOutcome::NotApplied("no answer".to_owned()));
                        self.recon_answered(s, &id, outcome, remaining);
                    }
                    Reconciled::Scan(needs) => {
                        let Some((left, all, started)) = r.scan.as_mut() else {
                            continue;
                        };
                        all.extend(needs);
                        *left -= 1;
                        if *left == 0 {
                            let (all, started) = (std::mem::take(all), *started);
                            r.scan = None;
                            if let Some(q) = r.queue.as_mut() {
                                q.scanned(all, started, wall);
                            }
                            self.recon_pump(s);
                        }
                    }
                }
            }
        }
    }
}

/// The store's rows a converged object must no longer have: held, parked
/// or malformed events for it.
pub(crate) fn waiting(status: HeldStatus) -> bool {
    matches!(
        status,
        HeldStatus::Held | HeldStatus::Parked | HeldStatus::Malformed
    )
}
