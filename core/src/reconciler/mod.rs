//! The reconciler's policy, sans IO (docs/CONTRACT.md §4, *The service
//! fetches authorities itself*): which object to ask an authority about
//! next, and when. The library's reconciler task, the unit tests and the
//! simulation drive the same [`WorkQueue`]: it is fed with needs (what the
//! receiver holds), answers and the time, and [`WorkQueue::next`] answers
//! what to do (fetch object X, scan the receiver, wait, stop).
//!
//! The rules are those of client-go's rate-limited work queue
//! (`k8s.io/client-go/util/workqueue`), with a circuit breaker in front:
//! - one entry per object: a need noted twice is one entry, and one fetch
//!   at most is in flight per object (a need noted meanwhile joins it and
//!   the object is fetched once more after its answer);
//! - at most [`ReconcilerSettings::concurrency`] fetches in flight;
//! - a token bucket over all fetches ([`ReconcilerSettings::rate`],
//!   [`ReconcilerSettings::burst`]);
//! - per object, exponential backoff after a failed or refused answer
//!   (base times 2^(failures − 1), at most the maximum, each wait times a
//!   factor from 0.8 to 1.2, seeded: [`crate::relay::Jitter`]), never
//!   shorter than the authority's `Retry-After`; forgotten on success;
//! - a breaker: after [`ReconcilerSettings::breaker_failures`] consecutive
//!   failures to reach the authority (unavailable, timed out) it opens and
//!   nothing is fetched for [`ReconcilerSettings::breaker_open`]; then one
//!   fetch goes as a probe (half-open): an answer closes it, a failure
//!   opens it again;
//! - fairness: objects due are served round-robin over tenants (the first
//!   part of an object id when the profile scopes object ids by tenant,
//!   [`crate::Profile::tenant_scoped`]), so that no tenant's backlog
//!   starves another's;
//! - memory: the entries count against the budget's authority part
//!   ([`ReconcilerSettings::memory`], in bytes: each object id, its
//!   schedule, its last error); past it a need is not queued. Nothing is
//!   lost: what needs an authority is derived from what the store holds (a
//!   pause, a held or parked row), and the next scan (asked for as soon as
//!   entries leave) finds it again;
//! - a resync pages through the object ids in id order
//!   ([`Next::List`], at most [`ReconcilerSettings::resync_page`] a page),
//!   reading the next page only once the last one's objects were sent and
//!   the part has room, so that no list of every object is ever held;
//! - what the store keeps for the operator: each answer that leaves an
//!   object waiting is a [`WaitRecord::Failed`] with its last error, each
//!   object that stops waiting a [`WaitRecord::Settled`]
//!   ([`WorkQueue::records`]); the caller writes them to the store, where
//!   `inspect` reads them without the process.
//!
//! Layout: this file has the needs, the answers and the settings;
//! `bucket` the token bucket, `breaker` the breaker, `queue` the
//! [`WorkQueue`] itself.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

mod breaker;
mod bucket;
mod queue;
#[cfg(all(test, not(snapshot_receiver_loom)))]
mod tests;

pub use breaker::BreakerState;
pub use queue::{Next, Notice, WorkQueue, CONFIRMED_OVERHEAD, ENTRY_OVERHEAD, RESCAN_GAP};

/// Why an object needs an authority.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum NeedReason {
    /// The object is paused by a conflict (a variant, or an equal version
    /// with another state).
    Paused,
    /// Events are parked for it: the receiver does not know the object (does
    /// it exist? the authority's snapshot creates it).
    UnknownObject,
    /// It holds an event without a version.
    MissingVersion,
    /// It holds an event whose version is not a u64.
    InvalidVersion,
    /// It holds an event of a type the receiver does not support.
    UnsupportedType,
    /// It holds a malformed body that names it.
    Malformed,
    /// It was not confirmed by an authority for the resync period
    /// ([`ReconcilerSettings::resync`]).
    Resync,
    /// Someone asked for it ([`WorkQueue::request`]).
    Requested,
}

impl NeedReason {
    /// Every reason, in the order they are listed.
    pub const ALL: [NeedReason; 8] = [
        NeedReason::Paused,
        NeedReason::UnknownObject,
        NeedReason::MissingVersion,
        NeedReason::InvalidVersion,
        NeedReason::UnsupportedType,
        NeedReason::Malformed,
        NeedReason::Resync,
        NeedReason::Requested,
    ];

    /// The snake-case name (logs, reports): `paused`, `unknown_object`,
    /// `missing_version`, `invalid_version`, `unsupported_type`,
    /// `malformed`, `resync`, `requested`.
    pub fn as_str(self) -> &'static str {
        match self {
            NeedReason::Paused => "paused",
            NeedReason::UnknownObject => "unknown_object",
            NeedReason::MissingVersion => "missing_version",
            NeedReason::InvalidVersion => "invalid_version",
            NeedReason::UnsupportedType => "unsupported_type",
            NeedReason::Malformed => "malformed",
            NeedReason::Resync => "resync",
            NeedReason::Requested => "requested",
        }
    }

    /// The reason a held event's verdict gives its object, when an
    /// authority can settle it: `None` for verdicts it cannot (an expired
    /// identity) and for decisions that hold nothing. A conflict pauses its
    /// object ([`NeedReason::Paused`]).
    pub fn of_verdict(verdict: crate::Verdict) -> Option<NeedReason> {
        use crate::{HoldReason as H, Verdict as V};
        match verdict {
            V::Conflict(_) | V::Held(H::Paused) => Some(NeedReason::Paused),
            V::Held(H::UnknownObject) => Some(NeedReason::UnknownObject),
            V::Held(H::MissingVersion) => Some(NeedReason::MissingVersion),
            V::Held(H::InvalidVersion) => Some(NeedReason::InvalidVersion),
            V::Held(H::UnsupportedType) => Some(NeedReason::UnsupportedType),
            V::Held(H::Malformed) => Some(NeedReason::Malformed),
            V::Held(H::ExpiredIdentity) | V::Applied | V::Stale | V::Equal => None,
        }
    }

    /// Its bit in a set of reasons.
    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

impl fmt::Display for NeedReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of [`NeedReason`]s, as a bit set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NeedReasons(u8);

impl NeedReasons {
    /// The set with `reason` added.
    pub fn with(self, reason: NeedReason) -> Self {
        Self(self.0 | reason.bit())
    }

    /// Whether `reason` is in the set.
    pub fn contains(self, reason: NeedReason) -> bool {
        self.0 & reason.bit() != 0
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The reasons, in [`NeedReason::ALL`]'s order.
    pub fn iter(self) -> impl Iterator<Item = NeedReason> {
        NeedReason::ALL
            .into_iter()
            .filter(move |r| self.contains(*r))
    }

    /// The reasons a scan finds (all but resync and request).
    fn derived(self) -> Self {
        Self(self.0 & !(NeedReason::Resync.bit() | NeedReason::Requested.bit()))
    }
}

impl FromIterator<NeedReason> for NeedReasons {
    fn from_iter<I: IntoIterator<Item = NeedReason>>(iter: I) -> Self {
        iter.into_iter().fold(Self::default(), Self::with)
    }
}

impl fmt::Display for NeedReasons {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.iter().map(NeedReason::as_str).collect();
        f.write_str(&names.join(","))
    }
}

/// One object that needs an authority, and why (what a shard holds:
/// [`crate::Shard::authority_needs`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthorityNeed {
    /// The object.
    pub object_id: Arc<str>,
    /// Why (never empty).
    pub reasons: NeedReasons,
}

/// What kind of failure an authority fetch had.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AuthorityErrorKind {
    /// The authority could not be reached or answered with a server error
    /// (counts towards the breaker).
    Unavailable,
    /// The attempt passed its deadline (counts towards the breaker).
    Timeout,
    /// The authority answered, but not with a snapshot the receiver can use
    /// (malformed, over a limit, another profile's shape, a redirect).
    BadAnswer,
}

impl AuthorityErrorKind {
    /// The snake-case name: `unavailable`, `timeout`, `bad_answer`.
    pub fn as_str(self) -> &'static str {
        match self {
            AuthorityErrorKind::Unavailable => "unavailable",
            AuthorityErrorKind::Timeout => "timeout",
            AuthorityErrorKind::BadAnswer => "bad_answer",
        }
    }
}

/// A fetch that failed; it is tried again later (per object backoff).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", kind.as_str())]
pub struct AuthorityError {
    /// What kind of failure.
    pub kind: AuthorityErrorKind,
    /// What happened, in words (no credentials).
    pub message: String,
    /// The authority asked to wait at least this long (an HTTP
    /// `Retry-After`, RFC 9110 §10.2.3); the next try waits the longer of
    /// it and the backoff.
    pub retry_after: Option<Duration>,
}

impl AuthorityError {
    /// A failure of `kind`.
    pub fn new(kind: AuthorityErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            retry_after: None,
        }
    }

    /// The authority could not be reached or failed.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(AuthorityErrorKind::Unavailable, message)
    }

    /// The attempt passed its deadline.
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(AuthorityErrorKind::Timeout, message)
    }

    /// The answer is not a usable snapshot.
    pub fn bad_answer(message: impl Into<String>) -> Self {
        Self::new(AuthorityErrorKind::BadAnswer, message)
    }

    /// The same error, asking to wait at least `wait` before the next try.
    pub fn with_retry_after(mut self, wait: Duration) -> Self {
        self.retry_after = Some(wait);
        self
    }
}

/// What one fetch of an object came to, once its answer was applied (or
/// not): what [`WorkQueue::answered`] is told.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FetchOutcome {
    /// The snapshot was applied and replaced the object's state (or
    /// created it).
    Applied,
    /// The snapshot was applied and equal to the object: nothing replaced,
    /// the pause cleared and held events re-decided all the same.
    Unchanged,
    /// The authority has no such object (HTTP 404/410): a parked unknown
    /// object stays parked, a paused one stays paused; tried again on the
    /// slow schedule ([`ReconcilerSettings::backoff_max`]).
    Absent,
    /// The snapshot is older than the object: refused, nothing changed;
    /// tried again later.
    Older {
        /// The authority's version.
        offered: u64,
        /// The object's version, which stays.
        current: u64,
    },
    /// The answer is a snapshot of another object: nothing recorded.
    WrongObject {
        /// The object id the answer named.
        answered: Arc<str>,
    },
    /// The fetch failed.
    Failed(AuthorityError),
    /// The snapshot could not be applied here (the store failed, the
    /// receiver is stopping): nothing changed; tried again later.
    NotApplied(String),
}

impl FetchOutcome {
    /// The label of its count and metric: `applied`, `unchanged`, `absent`,
    /// `older`, `wrong_object`, `unavailable`, `timeout`, `bad_answer`,
    /// `not_applied`.
    pub fn as_str(&self) -> &'static str {
        match self {
            FetchOutcome::Applied => "applied",
            FetchOutcome::Unchanged => "unchanged",
            FetchOutcome::Absent => "absent",
            FetchOutcome::Older { .. } => "older",
            FetchOutcome::WrongObject { .. } => "wrong_object",
            FetchOutcome::Failed(e) => e.kind.as_str(),
            FetchOutcome::NotApplied(_) => "not_applied",
        }
    }

    /// Whether the authority's snapshot was applied.
    pub fn settled(&self) -> bool {
        matches!(self, FetchOutcome::Applied | FetchOutcome::Unchanged)
    }

    /// Whether the authority could not be reached (what the breaker counts).
    fn unreachable(&self) -> bool {
        matches!(
            self,
            FetchOutcome::Failed(AuthorityError {
                kind: AuthorityErrorKind::Unavailable | AuthorityErrorKind::Timeout,
                ..
            })
        )
    }
}

impl fmt::Display for FetchOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FetchOutcome::Applied => f.write_str("applied"),
            FetchOutcome::Unchanged => f.write_str("applied, equal to the object"),
            FetchOutcome::Absent => f.write_str("the authority has no such object"),
            FetchOutcome::Older { offered, current } => write!(
                f,
                "the authority's version {offered} is older than the object's {current}: refused"
            ),
            FetchOutcome::WrongObject { answered } => {
                write!(
                    f,
                    "the answer is about another object, `{answered}`: ignored"
                )
            }
            FetchOutcome::Failed(e) => write!(f, "{e}"),
            FetchOutcome::NotApplied(why) => write!(f, "not applied: {why}"),
        }
    }
}

/// Fetches by outcome, since the queue started (each label of
/// [`FetchOutcome::as_str`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FetchCounts {
    /// Applied, replacing the object's state.
    pub applied: u64,
    /// Applied, equal to the object.
    pub unchanged: u64,
    /// The authority has no such object.
    pub absent: u64,
    /// Older than the object: refused.
    pub older: u64,
    /// About another object.
    pub wrong_object: u64,
    /// The authority could not be reached.
    pub unavailable: u64,
    /// Past the attempt's deadline.
    pub timeout: u64,
    /// Not a usable snapshot.
    pub bad_answer: u64,
    /// Not applied on this side.
    pub not_applied: u64,
}

impl FetchCounts {
    /// Counts one outcome.
    fn count(&mut self, outcome: &FetchOutcome) {
        let slot = match outcome {
            FetchOutcome::Applied => &mut self.applied,
            FetchOutcome::Unchanged => &mut self.unchanged,
            FetchOutcome::Absent => &mut self.absent,
            FetchOutcome::Older { .. } => &mut self.older,
            FetchOutcome::WrongObject { .. } => &mut self.wrong_object,
            FetchOutcome::Failed(e) => match e.kind {
                AuthorityErrorKind::Unavailable => &mut self.unavailable,
                AuthorityErrorKind::Timeout => &mut self.timeout,
                AuthorityErrorKind::BadAnswer => &mut self.bad_answer,
            },
            FetchOutcome::NotApplied(_) => &mut self.not_applied,
        };
        *slot += 1;
    }

    /// Every fetch answered.
    pub fn total(&self) -> u64 {
        self.applied
            + self.unchanged
            + self.absent
            + self.older
            + self.wrong_object
            + self.unavailable
            + self.timeout
            + self.bad_answer
            + self.not_applied
    }
}

/// How the queue schedules (the library's `ReconcilerOptions` without the
/// attempt timeout, which only the fetching side needs).
#[derive(Clone, Debug)]
pub struct ReconcilerSettings {
    /// Most fetches in flight at once (at least 1).
    pub concurrency: usize,
    /// Fetches per second over all objects (the token bucket's refill);
    /// `None`: unlimited.
    pub rate: Option<f64>,
    /// Fetches the bucket lets through at once after a quiet spell (at
    /// least 1).
    pub burst: u32,
    /// The wait after an object's first failed or refused fetch; doubled for
    /// each further one.
    pub backoff_base: Duration,
    /// The longest backoff; also the wait after an answer that the
    /// authority has no such object (the slow schedule).
    pub backoff_max: Duration,
    /// Consecutive failures to reach the authority that open the breaker
    /// (at least 1).
    pub breaker_failures: u32,
    /// How long the breaker stays open before its probe.
    pub breaker_open: Duration,
    /// Fetch every object not confirmed by an authority for this long
    /// (Kubernetes informers' resync); `None`: no resync.
    pub resync: Option<Duration>,
    /// How often the receiver is scanned for what needs an authority.
    pub rescan: Duration,
    /// Whether object ids start with a tenant (`tenant/...`) to serve
    /// round-robin.
    pub tenants: bool,
    /// The seed of the backoff's jitter.
    pub seed: u64,
    /// The bytes the queue may hold (the budget's authority part,
    /// [`crate::engine::MemoryBudget::authority`]): past them a need is
    /// not queued and a resync reads no further page until entries leave.
    /// An object someone asked for ([`WorkQueue::request`]) is queued
    /// whatever its bytes: its asker waits for the answer.
    pub memory: usize,
    /// The most object ids a resync reads in one page (at least 1).
    pub resync_page: usize,
}

impl Default for ReconcilerSettings {
    fn default() -> Self {
        Self {
            concurrency: 8,
            rate: Some(50.0),
            burst: 10,
            backoff_base: Duration::from_secs(1),
            backoff_max: Duration::from_secs(300),
            breaker_failures: 5,
            breaker_open: Duration::from_secs(30),
            resync: None,
            rescan: Duration::from_secs(30),
            tenants: false,
            seed: 0,
            memory: crate::engine::MemoryBudget::default().authority,
            resync_page: 1000,
        }
    }
}

impl ReconcilerSettings {
    /// What is wrong with the settings, if anything: which one and why.
    pub fn problem(&self) -> Option<String> {
        if self.concurrency == 0 {
            return Some("concurrency: must be at least 1".to_owned());
        }
        if let Some(rate) = self.rate {
            if !(rate.is_finite() && rate > 0.0) {
                return Some(format!("rate: {rate} fetches/s must be above 0"));
            }
        }
        if self.burst == 0 {
            return Some("burst: must be at least 1".to_owned());
        }
        if self.backoff_base.is_zero() || self.backoff_base > self.backoff_max {
            return Some(format!(
                "backoff: the base ({:?}) must be above 0 and at most the maximum ({:?})",
                self.backoff_base, self.backoff_max
            ));
        }
        if self.backoff_max > crate::relay::MAX_WAIT {
            return Some(format!(
                "backoff: the maximum ({:?}) is above 24 h",
                self.backoff_max
            ));
        }
        if self.breaker_failures == 0 {
            return Some("breaker failures: must be at least 1".to_owned());
        }
        if self.rescan.is_zero() {
            return Some("rescan: must be above 0".to_owned());
        }
        if self.resync.is_some_and(|r| r.is_zero()) {
            return Some("resync: must be above 0 when set".to_owned());
        }
        if self.resync_page == 0 {
            return Some("resync page: must be at least 1".to_owned());
        }
        None
    }
}

/// The queue's state for an operator ([`WorkQueue::status`]).
#[derive(Clone, Debug, PartialEq)]
pub struct QueueStatus {
    /// Fetches by outcome so far.
    pub counts: FetchCounts,
    /// Fetches in flight now.
    pub in_flight: usize,
    /// Objects waiting for an authority (in flight included).
    pub waiting: usize,
    /// Since when the longest-waiting object waits (`None`: none waits).
    pub oldest: Option<SystemTime>,
    /// The breaker.
    pub breaker: BreakerState,
    /// The bytes the queue holds now (its entries and the objects a resync
    /// found confirmed), against [`ReconcilerSettings::memory`].
    pub memory: usize,
    /// The most bytes it held so far.
    pub memory_peak: usize,
    /// Needs not queued for want of room so far (each found again by a
    /// later scan).
    pub deferred: u64,
}

/// One object waiting for an authority ([`WorkQueue::waiting`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitingObject {
    /// The object.
    pub object_id: Arc<str>,
    /// Why it needs an authority.
    pub reasons: NeedReasons,
    /// Since when it waits (first noted in this run).
    pub since: SystemTime,
    /// Fetches made for it so far.
    pub attempts: u32,
    /// The last fetch's outcome when it was not applied, in words.
    pub last_error: Option<String>,
    /// When it is fetched next (not before the rate limit, the concurrency
    /// bound and the breaker allow); `None`: a fetch is in flight.
    pub next_try: Option<SystemTime>,
}

/// What the store keeps of one object waiting for an authority after a
/// fetch that did not settle it: what `inspect` and the status page show
/// without the process that fetched ([`WaitRecord::Failed`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredWait {
    /// The object.
    pub object_id: Arc<str>,
    /// Why it needs an authority.
    pub reasons: NeedReasons,
    /// The last fetch's outcome label ([`FetchOutcome::as_str`]).
    pub outcome: &'static str,
    /// The last fetch's outcome, in words (no credentials).
    pub error: String,
    /// Fetches made for it by the process that wrote the row.
    pub attempts: u32,
    /// Since when it waits (first noted by that process).
    pub since: SystemTime,
    /// When that process fetches it next (`None`: it does not: only asked
    /// for, or stopping).
    pub next_try: Option<SystemTime>,
    /// When the outcome came.
    pub at: SystemTime,
}

/// A change of what the store keeps of the objects waiting for an
/// authority ([`WorkQueue::records`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WaitRecord {
    /// The object still waits after this fetch: its row, written over any
    /// earlier one.
    Failed(StoredWait),
    /// The object no longer waits (its snapshot settled it, or a scan
    /// found it settled by someone else): its row, if any, goes.
    Settled(Arc<str>),
}

impl WaitRecord {
    /// The object it is about.
    pub fn object_id(&self) -> &Arc<str> {
        match self {
            WaitRecord::Failed(w) => &w.object_id,
            WaitRecord::Settled(id) => id,
        }
    }
}

/// The tenant of `object_id` for fairness: the part before the first `/`
/// when `tenants` (a profile that scopes object ids by tenant joins the
/// parts with `/`, escaping `/` within each), else the empty tenant.
pub fn tenant_of(object_id: &str, tenants: bool) -> &str {
    if tenants {
        object_id.split_once('/').map_or("", |(t, _)| t)
    } else {
        ""
    }
}
