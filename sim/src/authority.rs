//! The reconciler against a faulty authority, simulated: the core's shipped
//! [`WorkQueue`] driven on a virtual clock, one seed deciding everything.
//! Objects come to need an authority (paused, or parked unknown) at random
//! times; the authority is slow, down for a spell (with or without
//! `Retry-After`), answers stale snapshots, snapshots of another object, or
//! "no such object" until the object exists upstream; after
//! [`AuthorityRun::healthy_at`] it answers well.
//!
//! Invariants, checked at every step:
//! - at most the concurrency bound in flight, and one fetch per object;
//! - no more fetches in any second than the token bucket allows (its burst
//!   plus its rate);
//! - while the breaker is open, nothing goes out;
//! - a bad answer changes nothing (the object's version only moves to the
//!   authority's, and only forward);
//! - **convergence**: every object needing an authority converges within
//!   [`AuthorityRun::bound`] of the later of its need and the authority's
//!   recovery.
//!
//! [`AuthorityControl`] selects a deliberately broken driver the checks
//! must catch.

use rand::{Rng, SeedableRng};
use snapshot_receiver_core::reconciler::{
    AuthorityError, AuthorityNeed, BreakerState, FetchOutcome, NeedReason, NeedReasons, Next,
    ReconcilerSettings, WorkQueue,
};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

/// A deliberately broken driver, for the must-fail controls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthorityControl {
    /// The shipped driver.
    None,
    /// The driver derives no needs: decisions are not noted and scans
    /// find nothing (convergence must catch it).
    NeedsDropped,
    /// A snapshot of another object is applied to the object asked
    /// (the "changes nothing" check must catch it).
    WrongObjectApplied,
}

/// What one seed's run came to.
#[derive(Debug)]
pub struct AuthorityRun {
    /// Objects that needed an authority.
    pub objects: usize,
    /// Fetches made.
    pub fetches: u64,
    /// When the authority answers well from (simulated time since start).
    pub healthy_at: Duration,
    /// How long after the later of its need and `healthy_at` every object
    /// must have converged.
    pub bound: Duration,
    /// The longest such time seen.
    pub slowest: Duration,
    /// Whether the breaker opened at least once.
    pub breaker_opened: bool,
    /// Each violated invariant, in words.
    pub failures: Vec<String>,
}

/// One object of the model.
#[derive(Clone, Debug)]
struct Object {
    /// The authority's version.
    truth: u64,
    /// The receiver's version (0: unknown object, parked).
    local: u64,
    /// Why it needs an authority, and since when (`None`: it does not).
    need: Option<(NeedReason, Duration)>,
    /// When it exists upstream (an unknown object is absent before).
    exists_from: Duration,
}

/// The events of the run.
#[derive(Clone, Debug)]
enum Event {
    /// The object comes to need an authority.
    Need(usize),
    /// A fetch of the object comes back with this answer.
    Answer(usize, Answer),
}

/// What the simulated authority answered.
#[derive(Clone, Debug)]
enum Answer {
    Snapshot(u64),
    Other,
    Absent,
    Failed(AuthorityError),
}

/// The policy's settings drawn from `rng` (its bounds: concurrency, rate,
/// burst, backoff and breaker, in that order), with no resync, a rescan
/// every 30 s, no memory bound, tenants served in turn when `tenants`.
pub(crate) fn drawn_settings(rng: &mut impl Rng, seed: u64, tenants: bool) -> ReconcilerSettings {
    ReconcilerSettings {
        concurrency: rng.random_range(1..=8),
        rate: Some(rng.random_range(2.0..50.0)),
        burst: rng.random_range(1..=10),
        backoff_base: Duration::from_millis(rng.random_range(100..=2000)),
        backoff_max: Duration::from_secs(rng.random_range(10..=120)),
        breaker_failures: rng.random_range(1..=6),
        breaker_open: Duration::from_secs(rng.random_range(1..=30)),
        resync: None,
        resync_page: 1000,
        rescan: Duration::from_secs(30),
        tenants,
        memory: usize::MAX,
        seed,
    }
}

/// Runs seed `seed` of the authority simulation.
pub fn run_authority(seed: u64, control: AuthorityControl) -> AuthorityRun {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0xa07_4021);
    let start = UNIX_EPOCH + Duration::from_secs(1_000_000);
    let tenants = rng.random_range(1..=3usize);
    let n = rng.random_range(5..=40usize);
    let settings = drawn_settings(&mut rng, seed, tenants > 1);
    let timeout = Duration::from_secs(10);
    // The faults, each drawn on or off.
    let slow = rng.random_bool(0.3);
    let down = rng
        .random_bool(0.5)
        .then(|| {
            let from = rng.random_range(0..120_000u64);
            (from, from + rng.random_range(1_000..600_000u64))
        })
        .map(|(a, b)| (Duration::from_millis(a), Duration::from_millis(b)));
    let retry_after = rng
        .random_bool(0.5)
        .then(|| Duration::from_secs(rng.random_range(1..=60)));
    let stale_rate = if rng.random_bool(0.4) { 0.5 } else { 0.0 };
    let wrong_rate = if rng.random_bool(0.4) { 0.3 } else { 0.0 };
    let faults_until = Duration::from_secs(rng.random_range(0..=300));
    let mut objects: Vec<Object> = (0..n)
        .map(|_| {
            let local = if rng.random_bool(0.3) {
                0
            } else {
                rng.random_range(1..=20)
            };
            Object {
                truth: local + rng.random_range(0..=5),
                local,
                need: None,
                exists_from: Duration::from_secs(rng.random_range(0..=200)),
            }
        })
        .collect();
    let ids: Vec<Arc<str>> = (0..n)
        .map(|i| Arc::from(format!("t{}/o{i}", i % tenants)))
        .collect();
    let index: HashMap<Arc<str>, usize> = ids.iter().cloned().zip(0..).collect();
    // The authority is healthy once every fault is over and every object
    // exists upstream.
    let healthy_at = [
        faults_until,
        down.map_or(Duration::ZERO, |(_, to)| to),
        objects
            .iter()
            .map(|o| o.exists_from)
            .max()
            .unwrap_or_default(),
    ]
    .into_iter()
    .max()
    .unwrap_or_default();
    let latency = |rng: &mut rand_chacha::ChaCha8Rng, t: Duration| {
        if slow && t < healthy_at {
            Duration::from_millis(rng.random_range(1_000..=20_000))
        } else {
            Duration::from_millis(rng.random_range(1..=50))
        }
    };
    let mut events: BTreeMap<(Duration, u64), Event> = BTreeMap::new();
    let mut seq = 0u64;
    for i in 0..n {
        seq += 1;
        let at = Duration::from_millis(rng.random_range(0..60_000));
        events.insert((at, seq), Event::Need(i));
    }
    // The bound: a backoff at its longest (with jitter), the breaker's open
    // spell and a Retry-After, an attempt's deadline, and every object once
    // through the bucket and the concurrency bound, plus the rescan.
    let per_fetch = Duration::from_millis(50);
    let drain = Duration::from_secs_f64(n as f64 / settings.rate.unwrap_or(1e9))
        + per_fetch * (n as u32).div_ceil(settings.concurrency as u32);
    let bound = settings.backoff_max * 6 / 5
        + settings.breaker_open
        + retry_after.unwrap_or_default()
        + timeout
        + drain
        + settings.rescan
        + Duration::from_secs(1);

    let mut queue = WorkQueue::new(settings.clone(), start);
    let mut now = Duration::ZERO;
    let mut in_flight: HashMap<usize, ()> = HashMap::new();
    let mut sent: Vec<Duration> = Vec::new();
    let mut run = AuthorityRun {
        objects: n,
        fetches: 0,
        healthy_at,
        bound,
        slowest: Duration::ZERO,
        breaker_opened: false,
        failures: Vec::new(),
    };
    let limit = healthy_at + bound * 2 + Duration::from_secs(3600);
    while now <= limit {
        // Events due now.
        while let Some(entry) = events.first_entry() {
            if entry.key().0 > now {
                break;
            }
            match entry.remove() {
                Event::Need(i) => {
                    let o = &mut objects[i];
                    let reason = if o.local == 0 {
                        NeedReason::UnknownObject
                    } else {
                        NeedReason::Paused
                    };
                    o.need = Some((reason, now));
                    if control != AuthorityControl::NeedsDropped {
                        queue.note(&ids[i], reason, start + now);
                    }
                }
                Event::Answer(i, answer) => {
                    in_flight.remove(&i);
                    let outcome = apply(&mut objects[i], answer, control, now, &mut run);
                    let remaining = objects[i]
                        .need
                        .map(|(r, _)| NeedReasons::default().with(r))
                        .unwrap_or_default();
                    let seen = queue.seen();
                    queue.answered(&ids[i], &outcome, remaining, seen, start + now);
                    if matches!(queue.breaker(), BreakerState::Open { .. }) {
                        run.breaker_opened = true;
                    }
                }
            }
        }
        // Whatever the queue says, until it waits.
        let wait = loop {
            match queue.next(start + now) {
                Next::Fetch { object_id, .. } => {
                    let i = index[&object_id];
                    if matches!(queue.breaker(), BreakerState::Open { .. }) {
                        run.failures.push(format!(
                            "{now:?}: {object_id} fetched while the breaker is open"
                        ));
                    }
                    if in_flight.insert(i, ()).is_some() {
                        run.failures
                            .push(format!("{now:?}: a second fetch of {object_id} in flight"));
                    }
                    if in_flight.len() > settings.concurrency {
                        run.failures.push(format!(
                            "{now:?}: {} fetches in flight, above {}",
                            in_flight.len(),
                            settings.concurrency
                        ));
                    }
                    sent.push(now);
                    run.fetches += 1;
                    let took = latency(&mut rng, now);
                    let (after, answer) = authority(
                        &mut rng,
                        &objects[i],
                        now,
                        (down, retry_after, stale_rate, wrong_rate, faults_until),
                        timeout,
                        took,
                    );
                    seq += 1;
                    events.insert((now + after, seq), Event::Answer(i, answer));
                }
                Next::Scan => {
                    let needs = objects
                        .iter()
                        .enumerate()
                        .filter(|_| control != AuthorityControl::NeedsDropped)
                        .filter_map(|(i, o)| {
                            o.need.map(|(r, _)| AuthorityNeed {
                                object_id: ids[i].clone(),
                                reasons: NeedReasons::default().with(r),
                            })
                        })
                        .collect();
                    queue.scanned(needs, start + now, start + now);
                }
                // No resync in these runs: no page is asked for.
                Next::List { .. } => queue.listed(Vec::new(), start + now),
                Next::Wait(wait) => break wait,
                Next::Stop => break None,
            }
        };
        let next_event = events.first_key_value().map(|(k, _)| k.0);
        let next = [
            wait.map(|w| now + w.max(Duration::from_micros(1))),
            next_event,
        ]
        .into_iter()
        .flatten()
        .min();
        match next {
            Some(t) => now = t.max(now),
            None => break,
        }
        if events.is_empty() && objects.iter().all(|o| o.need.is_none()) {
            break;
        }
    }
    // The token bucket: no window of one second holds more than the burst
    // plus the rate.
    if let Some(rate) = settings.rate {
        let most = f64::from(settings.burst) + rate;
        let mut from = 0;
        for to in 0..sent.len() {
            while sent[to] - sent[from] >= Duration::from_secs(1) {
                from += 1;
            }
            if (to - from + 1) as f64 > most + 1e-9 {
                run.failures.push(format!(
                    "{:?}: {} fetches within one second, above {most:.1}",
                    sent[to],
                    to - from + 1
                ));
                break;
            }
        }
    }
    for (i, o) in objects.iter().enumerate() {
        if let Some((_, since)) = o.need {
            run.failures.push(format!(
                "{} (needed since {since:?}) did not converge by {now:?} (healthy at {healthy_at:?}, bound {bound:?})",
                ids[i]
            ));
        }
    }
    run
}

/// What the authority answers for `o` at `now`, and after how long (an
/// attempt past `timeout` is a timeout at `timeout`).
fn authority(
    rng: &mut rand_chacha::ChaCha8Rng,
    o: &Object,
    now: Duration,
    faults: (
        Option<(Duration, Duration)>,
        Option<Duration>,
        f64,
        f64,
        Duration,
    ),
    timeout: Duration,
    latency: Duration,
) -> (Duration, Answer) {
    let (down, retry_after, stale_rate, wrong_rate, faults_until) = faults;
    if latency > timeout {
        return (
            timeout,
            Answer::Failed(AuthorityError::timeout("no answer within 10 s")),
        );
    }
    if down.is_some_and(|(from, to)| now >= from && now < to) {
        let mut e = AuthorityError::unavailable("503 Service Unavailable");
        if let Some(wait) = retry_after {
            e = e.with_retry_after(wait);
        }
        return (latency, Answer::Failed(e));
    }
    if now < o.exists_from {
        return (latency, Answer::Absent);
    }
    if now < faults_until {
        if rng.random_bool(wrong_rate) {
            return (latency, Answer::Other);
        }
        if rng.random_bool(stale_rate) && o.local > 0 {
            return (latency, Answer::Snapshot(o.local - 1));
        }
    }
    (latency, Answer::Snapshot(o.truth))
}

/// Applies `answer` to `o` as the receiver would (or as `control` breaks
/// it); the outcome, and a failure when a bad answer changed something.
fn apply(
    o: &mut Object,
    answer: Answer,
    control: AuthorityControl,
    now: Duration,
    run: &mut AuthorityRun,
) -> FetchOutcome {
    let before = o.local;
    let outcome = match answer {
        Answer::Snapshot(v) if v < o.local => FetchOutcome::Older {
            offered: v,
            current: o.local,
        },
        Answer::Snapshot(v) => {
            o.local = v;
            if let Some((_, since)) = o.need.take() {
                run.slowest = run
                    .slowest
                    .max(now.saturating_sub(since.max(run.healthy_at)));
                if now > since.max(run.healthy_at) + run.bound {
                    run.failures.push(format!(
                        "converged at {now:?}, later than {:?} after {:?}",
                        run.bound,
                        since.max(run.healthy_at)
                    ));
                }
            }
            FetchOutcome::Applied
        }
        Answer::Other if control == AuthorityControl::WrongObjectApplied => {
            o.local = 999;
            FetchOutcome::Applied
        }
        Answer::Other => FetchOutcome::WrongObject {
            answered: Arc::from("elsewhere"),
        },
        Answer::Absent => FetchOutcome::Absent,
        Answer::Failed(e) => FetchOutcome::Failed(e),
    };
    if o.local != before && o.local != o.truth {
        run.failures.push(format!(
            "{now:?}: a bad answer changed an object from v{before} to v{}",
            o.local
        ));
    }
    outcome
}
