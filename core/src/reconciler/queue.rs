//! The [`WorkQueue`]: one entry per object that needs an authority, and
//! [`WorkQueue::next`], which answers what to do now.

use super::breaker::{Breaker, Change};
use super::bucket::Bucket;
use super::{
    tenant_of, AuthorityNeed, BreakerState, FetchCounts, FetchOutcome, NeedReason, NeedReasons,
    QueueStatus, ReconcilerSettings, StoredWait, WaitRecord, WaitingObject,
};
use crate::relay::Jitter;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The shortest time between two scans asked for by
/// [`WorkQueue::rescan`].
pub const RESCAN_GAP: Duration = Duration::from_secs(1);

/// Bytes one entry of the queue costs besides its object id's text and its
/// last error's: the entry in the map (key and value, about 120 bytes with
/// the map's slack), its place in a ready queue or the timer (an id
/// pointer and a key, 16 to 40 bytes), its tenant's share of the ready
/// queues, and the id's allocation header.
pub const ENTRY_OVERHEAD: usize = 256;

/// Bytes one object a resync found confirmed costs besides its id's text
/// (its entry in the map of confirmed objects and the id's header).
pub const CONFIRMED_OVERHEAD: usize = 64;

/// What to do next ([`WorkQueue::next`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Fetch this object's authoritative snapshot, apply it, and report the
    /// outcome ([`WorkQueue::answered`]).
    Fetch {
        /// The object.
        object_id: Arc<str>,
        /// Which fetch of it this is (1: the first).
        attempt: u32,
    },
    /// Scan the receiver for what needs an authority and report it
    /// ([`WorkQueue::scanned`]).
    Scan,
    /// Read the next page of a resync: at most `limit` object ids the
    /// store holds after `after` (from the first when `""`), in id order
    /// (the store's text order), and report them ([`WorkQueue::listed`]).
    List {
        /// The last object id of the page before.
        after: Arc<str>,
        /// The most ids to read.
        limit: usize,
    },
    /// Nothing to do before this long has passed, an answer or a scan
    /// came back, or a need was noted (`None`: not before one of those).
    Wait(Option<Duration>),
    /// Stopped ([`WorkQueue::stop`]) with nothing in flight.
    Stop,
}

/// What the caller logs: changes of the breaker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// The breaker opened after `failures` consecutive failures to reach
    /// the authority (or a failed probe): nothing is fetched until `until`.
    BreakerOpened {
        /// When the probe may go.
        until: SystemTime,
        /// The failure that opened it, in words.
        cause: String,
    },
    /// The breaker closed: the authority answered.
    BreakerClosed,
}

/// Where an entry is in the schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// In the timer until then (the key's second part tells timers apart).
    Timer(SystemTime, u64),
    /// Due: in its tenant's ready queue.
    Ready,
    /// Its fetch is out.
    InFlight,
}

/// One object that needs an authority.
#[derive(Clone, Debug)]
struct Entry {
    /// Why.
    reasons: NeedReasons,
    /// When it was first noted.
    since: SystemTime,
    /// When a need was last noted for it (a scan that started before this
    /// and does not list it does not drop it).
    noted: SystemTime,
    /// Fetches made.
    attempts: u32,
    /// Failed or refused fetches since the last applied one (the backoff's
    /// exponent).
    failures: u32,
    /// The last outcome that was not applied, in words.
    last_error: Option<String>,
    /// Where it is.
    place: Place,
    /// The note count ([`WorkQueue::seen`]) when a need was last noted
    /// for it: one noted after its fetch's answer was checked is not
    /// settled by that answer.
    noted_seq: u64,
}

/// The reconciler's work queue (see the module doc of
/// [`crate::reconciler`]).
#[derive(Debug)]
pub struct WorkQueue {
    /// How it schedules.
    settings: ReconcilerSettings,
    /// The objects waiting for an authority.
    entries: HashMap<Arc<str>, Entry>,
    /// Entries waiting for a time, by due time.
    timer: BTreeMap<(SystemTime, u64), Arc<str>>,
    /// Tells timer keys of one time apart.
    timer_seq: u64,
    /// Due objects per tenant, in the order they became due.
    ready: HashMap<Arc<str>, VecDeque<Arc<str>>>,
    /// Tenants with due objects, in serving order (round-robin).
    turns: VecDeque<Arc<str>>,
    /// Objects someone asked for ([`WorkQueue::request`]): served first.
    requested: VecDeque<Arc<str>>,
    /// Fetches out.
    in_flight: usize,
    /// The token bucket.
    bucket: Bucket,
    /// The breaker.
    breaker: Breaker,
    /// The backoff's jitter.
    jitter: Jitter,
    /// When the next scan is due.
    scan_due: SystemTime,
    /// When the next resync is due (`None`: no resync).
    resync_due: Option<SystemTime>,
    /// While a resync runs: the last object id it listed (`""` before its
    /// first page).
    resync_cursor: Option<Arc<str>>,
    /// A resync's page is out.
    listing: bool,
    /// A scan is out.
    scanning: bool,
    /// When the last scan's result came in.
    scanned_at: Option<SystemTime>,
    /// Objects an authority's snapshot was applied to, and when, since the
    /// last resync (those confirmed within the period are not fetched by
    /// the next).
    confirmed: HashMap<Arc<str>, SystemTime>,
    /// Needs noted so far (notes and scans): [`WorkQueue::seen`].
    notes: u64,
    /// Fetches by outcome.
    counts: FetchCounts,
    /// What the caller logs.
    notices: Vec<Notice>,
    /// What the store is to keep for the operator, oldest first.
    records: Vec<WaitRecord>,
    /// The bytes the entries and the confirmed objects hold.
    bytes: usize,
    /// The bytes the confirmed objects hold (at most half the part).
    confirmed_bytes: usize,
    /// The most bytes held so far.
    peak: usize,
    /// Needs not queued for want of room so far.
    deferred: u64,
    /// A need was not queued for want of room since the last scan: the
    /// next scan is asked for as soon as an entry leaves.
    overflowed: bool,
    /// Asked to stop.
    stopping: bool,
}

/// What an entry of `object_id` with `last_error` holds, in bytes.
fn entry_bytes(object_id: &str, last_error: Option<&String>) -> usize {
    object_id.len() + last_error.map_or(0, String::len) + ENTRY_OVERHEAD
}

impl WorkQueue {
    /// An empty queue at `now`, its first scan due at once (its settings
    /// checked by the caller: [`ReconcilerSettings::problem`]).
    pub fn new(settings: ReconcilerSettings, now: SystemTime) -> Self {
        Self {
            bucket: Bucket::new(settings.rate, settings.burst),
            breaker: Breaker::new(settings.breaker_failures, settings.breaker_open),
            jitter: Jitter::new(settings.seed),
            resync_due: settings.resync.map(|_| now),
            resync_cursor: None,
            listing: false,
            settings,
            entries: HashMap::new(),
            timer: BTreeMap::new(),
            timer_seq: 0,
            ready: HashMap::new(),
            turns: VecDeque::new(),
            requested: VecDeque::new(),
            in_flight: 0,
            scan_due: now,
            scanning: false,
            scanned_at: None,
            confirmed: HashMap::new(),
            notes: 0,
            counts: FetchCounts::default(),
            notices: Vec::new(),
            records: Vec::new(),
            bytes: 0,
            confirmed_bytes: 0,
            peak: 0,
            deferred: 0,
            overflowed: false,
            stopping: false,
        }
    }

    /// Notes that `object_id` needs an authority for `reason` at `now`
    /// (after a decision that held or paused): a new entry is due at once;
    /// a known one keeps its schedule; one in flight joins the fetch out
    /// (see [`WorkQueue::answered`] for what its answer settles).
    pub fn note(&mut self, object_id: &Arc<str>, reason: NeedReason, now: SystemTime) {
        self.add(object_id, NeedReasons::default().with(reason), now, false);
    }

    /// Asks for `object_id` now (an operator, `reconcile --fetch`): it goes
    /// before every other object, its backoff and an open breaker
    /// notwithstanding (within the concurrency bound and the rate limit).
    /// One in flight is not fetched again: its answer is the answer.
    pub fn request(&mut self, object_id: &Arc<str>, now: SystemTime) {
        let reasons = NeedReasons::default().with(NeedReason::Requested);
        self.add(object_id, reasons, now, true);
        let Some(entry) = self.entries.get_mut(object_id) else {
            return;
        };
        match entry.place {
            Place::InFlight => {}
            Place::Timer(at, seq) => {
                self.timer.remove(&(at, seq));
                entry.place = Place::Ready;
                self.requested.push_back(object_id.clone());
            }
            Place::Ready => self.requested.push_back(object_id.clone()),
        }
    }

    /// Adds `reasons` to `object_id`'s entry, or a new entry due now when
    /// the memory part has room for it (or `always`): whether the object
    /// waits now.
    fn add(
        &mut self,
        object_id: &Arc<str>,
        reasons: NeedReasons,
        now: SystemTime,
        always: bool,
    ) -> bool {
        self.notes += 1;
        let noted_seq = self.notes;
        if let Some(entry) = self.entries.get_mut(object_id) {
            entry.reasons = NeedReasons(entry.reasons.0 | reasons.0);
            entry.noted = now;
            entry.noted_seq = noted_seq;
            return true;
        }
        let cost = entry_bytes(object_id, None);
        if !always && self.bytes.saturating_add(cost) > self.settings.memory {
            // It stays in the store (a pause, a held or parked row): a later
            // scan finds it again.
            self.deferred += 1;
            self.overflowed = true;
            return false;
        }
        self.grow(cost);
        self.entries.insert(
            object_id.clone(),
            Entry {
                reasons,
                since: now,
                noted: now,
                attempts: 0,
                failures: 0,
                last_error: None,
                place: Place::Ready,
                noted_seq,
            },
        );
        self.make_ready(object_id);
        true
    }

    /// Counts `bytes` more held.
    fn grow(&mut self, bytes: usize) {
        self.bytes = self.bytes.saturating_add(bytes);
        self.peak = self.peak.max(self.bytes);
    }

    /// Counts `bytes` fewer held.
    fn shrink(&mut self, bytes: usize) {
        self.bytes = self.bytes.saturating_sub(bytes);
    }

    /// Sets `object_id`'s last error (present), counting its bytes.
    fn set_last_error(&mut self, object_id: &Arc<str>, error: String) {
        let Some(entry) = self.entries.get_mut(object_id) else {
            return;
        };
        let before = entry.last_error.as_ref().map_or(0, String::len);
        let after = error.len();
        entry.last_error = Some(error);
        self.shrink(before);
        self.grow(after);
    }

    /// Puts `object_id` at the end of its tenant's ready queue.
    fn make_ready(&mut self, object_id: &Arc<str>) {
        let tenant: Arc<str> = Arc::from(tenant_of(object_id, self.settings.tenants));
        let queue = self.ready.entry(tenant.clone()).or_default();
        if queue.is_empty() {
            self.turns.push_back(tenant);
        }
        queue.push_back(object_id.clone());
    }

    /// Schedules `object_id` (present) for `at`.
    fn schedule(&mut self, object_id: &Arc<str>, at: SystemTime) {
        self.timer_seq += 1;
        let key = (at, self.timer_seq);
        self.timer.insert(key, object_id.clone());
        if let Some(e) = self.entries.get_mut(object_id) {
            e.place = Place::Timer(key.0, key.1);
        }
    }

    /// A scan's result ([`Next::Scan`]): `needs`, what the receiver holds
    /// (complete), read from `started`. An object listed gets the reasons
    /// listed (a new one is due at once, when the memory part has room);
    /// one not listed loses the reasons a scan finds and, with none left
    /// and nothing in flight, leaves the queue (settled by someone else:
    /// [`WaitRecord::Settled`]) — unless a need was noted for it after
    /// `started`.
    pub fn scanned(&mut self, needs: Vec<AuthorityNeed>, started: SystemTime, now: SystemTime) {
        self.scanning = false;
        self.overflowed = false;
        let listed: HashSet<Arc<str>> = needs.iter().map(|n| n.object_id.clone()).collect();
        let mut gone = Vec::new();
        for (id, entry) in &mut self.entries {
            if listed.contains(id) || entry.noted >= started {
                continue;
            }
            entry.reasons = NeedReasons(entry.reasons.0 & !entry.reasons.derived().0);
            if entry.reasons.is_empty() && entry.place != Place::InFlight {
                gone.push(id.clone());
            }
        }
        for id in gone {
            self.forget(&id);
            self.records.push(WaitRecord::Settled(id));
        }
        for need in needs {
            match self.entries.get_mut(&need.object_id) {
                Some(entry) => {
                    let kept = entry.reasons.0 & !entry.reasons.derived().0;
                    entry.reasons = NeedReasons(kept | need.reasons.derived().0);
                    self.notes += 1;
                    entry.noted_seq = self.notes;
                }
                None => {
                    self.add(&need.object_id, need.reasons.derived(), now, false);
                }
            }
        }
        self.scan_due = now + self.settings.rescan;
        self.scanned_at = Some(now);
    }

    /// A resync's page ([`Next::List`]): `ids`, at most the limit asked
    /// for, after the cursor in id order. Each object not confirmed by an
    /// authority within the resync period waits for one (reason
    /// [`NeedReason::Resync`]) while the memory part has room; the page is
    /// taken up to the first that finds none, and the next page starts
    /// after it. A page shorter than the limit ends the resync; the next
    /// is due one period later.
    pub fn listed(&mut self, ids: Vec<Arc<str>>, now: SystemTime) {
        self.listing = false;
        let Some(period) = self.settings.resync else {
            return;
        };
        if self.resync_cursor.is_none() {
            return;
        }
        let whole = ids.len() < self.settings.resync_page;
        for id in ids {
            let confirmed = self.confirmed.contains_key(&id);
            if !confirmed {
                let reasons = NeedReasons::default().with(NeedReason::Resync);
                if !self.add(&id, reasons, now, false) {
                    // No room: the next page starts at this one.
                    return;
                }
            }
            self.resync_cursor = Some(id);
        }
        if whole {
            self.resync_cursor = None;
            self.resync_due = Some(now + period);
        }
    }

    /// Removes `object_id`'s entry (its timer too; a ready queue skips it),
    /// and asks for a scan when a need was left out for want of room.
    fn forget(&mut self, object_id: &Arc<str>) {
        if let Some(entry) = self.entries.remove(object_id) {
            if let Place::Timer(at, seq) = entry.place {
                self.timer.remove(&(at, seq));
            }
            self.shrink(entry_bytes(object_id, entry.last_error.as_ref()));
            if self.overflowed {
                let now = self.scanned_at.unwrap_or(SystemTime::UNIX_EPOCH);
                self.rescan(now);
            }
        }
    }

    /// Makes the next scan due at once (the caller missed decisions), but
    /// not sooner than [`RESCAN_GAP`] after the last one ended: a caller
    /// that keeps falling behind a busy receiver scans it once a second,
    /// not at every step.
    pub fn rescan(&mut self, now: SystemTime) {
        let earliest = self.scanned_at.map_or(now, |at| (at + RESCAN_GAP).max(now));
        self.scan_due = self.scan_due.min(earliest);
    }

    /// Why `object_id` waits (`None`: it does not).
    pub fn reasons(&self, object_id: &str) -> Option<NeedReasons> {
        self.entries.get(object_id).map(|e| e.reasons)
    }

    /// Asks the queue to stop: nothing more goes out, and [`Next::Stop`]
    /// once every fetch out answered.
    pub fn stop(&mut self) {
        self.stopping = true;
    }

    /// What to do next at `now`.
    pub fn next(&mut self, now: SystemTime) -> Next {
        if self.stopping {
            return if self.in_flight == 0 && !self.scanning && !self.listing {
                Next::Stop
            } else {
                Next::Wait(None)
            };
        }
        if !self.scanning && now >= self.scan_due {
            self.scanning = true;
            return Next::Scan;
        }
        if let Some(period) = self.settings.resync {
            if self.resync_cursor.is_none() && self.resync_due.is_some_and(|at| now >= at) {
                // A new resync: objects confirmed within the period are
                // left out of it.
                let since = now.checked_sub(period).unwrap_or(SystemTime::UNIX_EPOCH);
                let mut freed = 0;
                self.confirmed.retain(|id, at| {
                    let keep = *at > since;
                    if !keep {
                        freed += id.len() + CONFIRMED_OVERHEAD;
                    }
                    keep
                });
                self.shrink(freed);
                self.confirmed_bytes = self.confirmed_bytes.saturating_sub(freed);
                self.resync_cursor = Some(Arc::from(""));
                self.resync_due = None;
            }
        }
        self.release_due(now);
        if let Some(after) = self.resync_cursor.clone() {
            // The next page once the last one's objects were all sent (none
            // ready) and the part has room for one more entry.
            let room = self.bytes + ENTRY_OVERHEAD <= self.settings.memory;
            if !self.listing && room && self.peek_ready().is_none() {
                self.listing = true;
                return Next::List {
                    after,
                    limit: self.settings.resync_page,
                };
            }
        }
        let mut wake = Vec::new();
        if !self.scanning {
            wake.extend([Some(self.scan_due), self.resync_due]);
        }
        if self.in_flight < self.settings.concurrency {
            let token = self.bucket.wait(now);
            let admitted = self.breaker.admits(now);
            let candidate = self.peek_requested().map(|id| (id, true)).or_else(|| {
                match admitted {
                    Ok(()) => self.peek_ready(),
                    Err(until) => {
                        wake.push(until);
                        None
                    }
                }
                .map(|id| (id, false))
            });
            match (candidate, token) {
                (Some(_), Some(wait)) => wake.push(Some(now + wait)),
                (Some((id, requested)), None) => return self.send(id, requested, now),
                (None, _) => {}
            }
            wake.push(self.timer.keys().next().map(|k| k.0));
        }
        let wake = wake.into_iter().flatten().min();
        Next::Wait(wake.map(|at| at.duration_since(now).unwrap_or_default()))
    }

    /// Moves the entries due at `now` from the timer to their tenants'
    /// ready queues.
    fn release_due(&mut self, now: SystemTime) {
        while let Some(entry) = self.timer.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let id = entry.remove();
            if let Some(e) = self.entries.get_mut(&id) {
                e.place = Place::Ready;
                self.make_ready(&id);
            }
        }
    }

    /// The first requested object still ready (dropping those that are
    /// not).
    fn peek_requested(&mut self) -> Option<Arc<str>> {
        while let Some(id) = self.requested.front() {
            if self
                .entries
                .get(id)
                .is_some_and(|e| e.place == Place::Ready)
            {
                return Some(id.clone());
            }
            self.requested.pop_front();
        }
        None
    }

    /// The next ready object, round-robin over tenants (dropping entries
    /// that left or were requested meanwhile).
    fn peek_ready(&mut self) -> Option<Arc<str>> {
        while let Some(tenant) = self.turns.front().cloned() {
            let queue = self.ready.get_mut(&tenant)?;
            while let Some(id) = queue.front() {
                if self
                    .entries
                    .get(id)
                    .is_some_and(|e| e.place == Place::Ready)
                {
                    return Some(id.clone());
                }
                queue.pop_front();
            }
            self.ready.remove(&tenant);
            self.turns.pop_front();
        }
        None
    }

    /// Sends the fetch of `object_id` (just peeked): takes it off its
    /// queue, a token, and the probe of a half-open breaker.
    fn send(&mut self, object_id: Arc<str>, requested: bool, now: SystemTime) -> Next {
        if requested {
            self.requested.pop_front();
        } else if let Some(tenant) = self.turns.pop_front() {
            // Its turn is used: the tenant goes to the back of the line.
            if let Some(queue) = self.ready.get_mut(&tenant) {
                queue.pop_front();
                if queue.is_empty() {
                    self.ready.remove(&tenant);
                } else {
                    self.turns.push_back(tenant);
                }
            }
            self.breaker.sent();
        }
        self.bucket.take(now);
        self.in_flight += 1;
        let Some(entry) = self.entries.get_mut(&object_id) else {
            return Next::Wait(None);
        };
        entry.place = Place::InFlight;
        entry.attempts += 1;
        Next::Fetch {
            attempt: entry.attempts,
            object_id,
        }
    }

    /// How many needs were noted so far: read it before checking what an
    /// object still needs after its snapshot was applied, and hand both to
    /// [`WorkQueue::answered`].
    pub fn seen(&self) -> u64 {
        self.notes
    }

    /// The outcome of [`Next::Fetch`] for `object_id` at `now`.
    ///
    /// Applied (or unchanged): the authority settled what the object
    /// needed, save what it still needs after it (`remaining`, read from
    /// the receiver after the apply, with `seen` read before that) and the
    /// needs noted after `seen`; with nothing left, the object leaves the
    /// queue, else it is fetched again after its backoff (a snapshot that
    /// leaves needs behind counts as a failure, so that nothing is fetched
    /// in a loop). Absent: tried again after the longest backoff. Anything
    /// else: tried again after its backoff, never before the authority's
    /// `Retry-After`. Returns when it is fetched next (`None`: it left the
    /// queue).
    pub fn answered(
        &mut self,
        object_id: &Arc<str>,
        outcome: &FetchOutcome,
        remaining: NeedReasons,
        seen: u64,
        now: SystemTime,
    ) -> Option<SystemTime> {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.counts.count(outcome);
        match self.breaker.answered(!outcome.unreachable(), now) {
            Change::None => {}
            Change::Opened(until) => self.notices.push(Notice::BreakerOpened {
                until,
                cause: outcome.to_string(),
            }),
            Change::Closed => self.notices.push(Notice::BreakerClosed),
        }
        if outcome.settled() && self.settings.resync.is_some() {
            // Left out of the next resync, while the confirmed objects take
            // at most half the part (so that entries always have the other
            // half); one not kept is fetched again by it.
            let cost = object_id.len() + CONFIRMED_OVERHEAD;
            let known = self.confirmed.contains_key(object_id);
            let room = self.confirmed_bytes.saturating_add(cost) <= self.settings.memory / 2
                && self.bytes.saturating_add(cost) <= self.settings.memory;
            if (known || room) && self.confirmed.insert(object_id.clone(), now).is_none() {
                self.confirmed_bytes += cost;
                self.grow(cost);
            }
        }
        let entry = self.entries.get_mut(object_id)?;
        entry.reasons = NeedReasons(entry.reasons.0 & !NeedReason::Requested.bit());
        if outcome.settled() {
            let later = if entry.noted_seq > seen {
                entry.reasons.derived()
            } else {
                NeedReasons::default()
            };
            entry.reasons = NeedReasons(remaining.derived().0 | later.0);
            if entry.reasons.is_empty() {
                self.forget(object_id);
                self.records.push(WaitRecord::Settled(object_id.clone()));
                return None;
            }
            let error = format!(
                "applied, but the object still needs an authority ({})",
                entry.reasons
            );
            self.set_last_error(object_id, error);
        } else {
            let only_asked = entry.reasons.is_empty();
            self.set_last_error(object_id, outcome.to_string());
            if only_asked {
                // Only asked for: the asker has its answer. The store keeps
                // it all the same (whoever asked may have found the need
                // where this queue does not look: a store other processes
                // write), with no next try.
                self.record_failed(object_id, outcome, None, now);
                self.forget(object_id);
                return None;
            }
        }
        let entry = self.entries.get_mut(object_id)?;
        let wait = match outcome {
            FetchOutcome::Absent => self.jitter.wait(self.settings.backoff_max, None),
            _ => {
                entry.failures += 1;
                let step = self
                    .settings
                    .backoff_base
                    .saturating_mul(1 << entry.failures.saturating_sub(1).min(30))
                    .min(self.settings.backoff_max);
                let retry_after = match outcome {
                    FetchOutcome::Failed(e) => e.retry_after,
                    _ => None,
                };
                self.jitter.wait(step, retry_after)
            }
        };
        let at = now + wait;
        self.schedule(object_id, at);
        self.record_failed(object_id, outcome, Some(at), now);
        Some(at)
    }

    /// Records `object_id`'s (present) wait after `outcome` for the store.
    fn record_failed(
        &mut self,
        object_id: &Arc<str>,
        outcome: &FetchOutcome,
        next_try: Option<SystemTime>,
        now: SystemTime,
    ) {
        if let Some(e) = self.entries.get(object_id) {
            self.records.push(WaitRecord::Failed(StoredWait {
                object_id: object_id.clone(),
                reasons: e.reasons,
                outcome: outcome.as_str(),
                error: e.last_error.clone().unwrap_or_default(),
                attempts: e.attempts,
                since: e.since,
                next_try,
                at: now,
            }));
        }
    }

    /// Takes what the store is to keep for the operator, oldest first
    /// (the caller writes them; a later record of one object replaces an
    /// earlier one).
    pub fn records(&mut self) -> std::vec::Drain<'_, WaitRecord> {
        self.records.drain(..)
    }

    /// Takes what the caller logs, oldest first.
    pub fn notices(&mut self) -> std::vec::Drain<'_, Notice> {
        self.notices.drain(..)
    }

    /// The state for an operator.
    pub fn status(&self) -> QueueStatus {
        QueueStatus {
            counts: self.counts,
            in_flight: self.in_flight,
            waiting: self.entries.len(),
            oldest: self.entries.values().map(|e| e.since).min(),
            breaker: self.breaker.state,
            memory: self.bytes,
            memory_peak: self.peak,
            deferred: self.deferred,
        }
    }

    /// The breaker's state.
    pub fn breaker(&self) -> BreakerState {
        self.breaker.state
    }

    /// Every object waiting for an authority, the longest-waiting first
    /// (then by object id).
    pub fn waiting(&self, now: SystemTime) -> Vec<WaitingObject> {
        let mut all: Vec<WaitingObject> = self
            .entries
            .iter()
            .map(|(id, e)| WaitingObject {
                object_id: id.clone(),
                reasons: e.reasons,
                since: e.since,
                attempts: e.attempts,
                last_error: e.last_error.clone(),
                next_try: match e.place {
                    Place::Timer(at, _) => Some(at),
                    Place::Ready => Some(now),
                    Place::InFlight => None,
                },
            })
            .collect();
        all.sort_by(|a, b| (a.since, &a.object_id).cmp(&(b.since, &b.object_id)));
        all
    }

    /// Whether `object_id` waits for an authority.
    pub fn contains(&self, object_id: &str) -> bool {
        self.entries.contains_key(object_id)
    }

    /// Fetches in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }
}
