//! The load test's authority: the generator knows the truth of every object
//! (its highest version and that version's state), so it can answer as an
//! upstream service would. [`StreamAuthority`] serves it through the
//! library's [`AuthoritySource`] trait, with a latency and an optional
//! outage; the receiver runs [`Receiver::reconciler`](snapshot_receiver::Receiver::reconciler)
//! against it, and the baselines reconcile from it in line (see
//! [`AuthorityOptions`]).

use crate::generate::Stream;
use snapshot_receiver::authority::{AuthorityError, AuthorityErrorKind, AuthoritySource};
use snapshot_receiver::reconciler::ReconcilerOptions;
use snapshot_receiver::AuthoritativeSnapshot;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// How a run reconciles: the authority's behaviour and the reconciler's
/// options.
#[derive(Clone, Debug)]
pub struct AuthorityOptions {
    /// How long the authority takes to answer each fetch (default 5 ms);
    /// zero answers at once.
    pub latency: Duration,
    /// An outage: the authority answers `unavailable` (after its latency)
    /// for a while (default none).
    pub outage: Option<Outage>,
    /// The receiver's reconciler ([`AuthorityOptions::default`] says what
    /// differs from the library's defaults, and why).
    pub reconciler: ReconcilerOptions,
    /// The longest the run waits, after its last delivery was answered, for
    /// every known object to be un-paused with nothing held (default
    /// 120 s, plus the outage's end when there is one); the check then
    /// reports what did not converge.
    pub drain: Duration,
}

/// A window in which the authority is down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outage {
    /// When it starts, after the delivery phase started.
    pub after: Duration,
    /// How long it lasts.
    pub length: Duration,
}

impl Default for AuthorityOptions {
    /// A 5 ms authority, no outage; the reconciler with the library's
    /// defaults except: no rate limit and 32 fetches in flight (the
    /// authority is in this process: nothing to be polite to, and at a
    /// million deliveries per second a variant pauses an object about every
    /// millisecond), backoff from 1 s up to 10 s and the breaker open for
    /// 5 s (an outage of a few seconds is over in seconds, not minutes).
    fn default() -> Self {
        Self {
            latency: Duration::from_millis(5),
            outage: None,
            reconciler: ReconcilerOptions {
                concurrency: 32,
                rate: None,
                backoff_base: Duration::from_secs(1),
                backoff_max: Duration::from_secs(10),
                breaker_open: Duration::from_secs(5),
                ..ReconcilerOptions::default()
            },
            drain: Duration::from_secs(120),
        }
    }
}

impl AuthorityOptions {
    /// How long the run waits for convergence after its last delivery: the
    /// drain, counted from the outage's end when that is later.
    pub(crate) fn drain_deadline(&self, started: Instant, ingested: Instant) -> Instant {
        let outage_end = self.outage.map(|o| started + o.after + o.length);
        outage_end.map_or(ingested, |end| end.max(ingested)) + self.drain
    }
}

/// What the authority answered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct AuthorityCounts {
    /// Fetches answered with a snapshot.
    pub snapshots: u64,
    /// Fetches answered "no such object" (the unknown objects).
    pub absent: u64,
    /// Fetches answered `unavailable` during the outage.
    pub down: u64,
}

/// The generator's truth as an [`AuthoritySource`]: a known object's
/// highest version in the stream with that version's own state (the
/// original content, not a variant or an equal-version twin); "no such
/// object" for the unknown objects. Answers after
/// [`AuthorityOptions::latency`]; `unavailable` during the outage, counted
/// from when it was made (just before the delivery phase).
pub struct StreamAuthority {
    /// The stream whose truth it serves.
    stream: Arc<Stream>,
    /// Each answer's delay.
    latency: Duration,
    /// When it is down, from `started`.
    outage: Option<Outage>,
    /// When it was made: what the outage counts from.
    started: Instant,
    /// The snapshots' `as_of`: the load test's clock.
    as_of: SystemTime,
    /// Fetches answered with a snapshot; atomics, as fetches run at once.
    snapshots: AtomicU64,
    /// Fetches answered "no such object".
    absent: AtomicU64,
    /// Fetches answered `unavailable`.
    down: AtomicU64,
}

impl StreamAuthority {
    /// The authority of `stream`, its outage counted from now.
    pub fn new(stream: Arc<Stream>, options: &AuthorityOptions) -> Self {
        Self {
            stream,
            latency: options.latency,
            outage: options.outage,
            started: Instant::now(),
            as_of: Stream::clock().now(),
            snapshots: AtomicU64::new(0),
            absent: AtomicU64::new(0),
            down: AtomicU64::new(0),
        }
    }

    /// The stream whose truth it serves.
    pub(crate) fn stream(&self) -> &Stream {
        &self.stream
    }

    /// When it was made (the outage counts from it).
    pub fn started(&self) -> Instant {
        self.started
    }

    /// What it answered so far.
    pub fn counts(&self) -> AuthorityCounts {
        AuthorityCounts {
            snapshots: self.snapshots.load(Ordering::Relaxed),
            absent: self.absent.load(Ordering::Relaxed),
            down: self.down.load(Ordering::Relaxed),
        }
    }

    /// The truth about `object_id` now, without latency or outage (what
    /// the baselines reconcile from in line): `None` for an object the
    /// stream does not know.
    pub fn truth(&self, object_id: &str) -> Option<AuthoritativeSnapshot> {
        truth(&self.stream, object_id, self.as_of)
    }

    /// Whether the outage is on at `now`.
    fn is_down(&self, now: Instant) -> bool {
        self.outage.is_some_and(|o| {
            let since = now.saturating_duration_since(self.started);
            since >= o.after && since < o.after + o.length
        })
    }
}

/// The truth about `object_id` in `stream`, as of `as_of`: its highest
/// version with that version's own state; `None` for an object the stream
/// does not know.
pub(crate) fn truth(
    stream: &Stream,
    object_id: &str,
    as_of: SystemTime,
) -> Option<AuthoritativeSnapshot> {
    let i = known_index(stream, object_id)?;
    let version = stream.expectation().objects[i].version;
    let state = stream.expected_state(i, version);
    // The generator's states are valid JSON: a failure here is a bug in the
    // generator, reported as a bad answer by `fetch`.
    AuthoritativeSnapshot::new(object_id, version, &state, as_of).ok()
}

/// The index of known object `object_id` of `stream` (`card-N`, `N` below
/// the number of objects).
pub(crate) fn known_index(stream: &Stream, object_id: &str) -> Option<usize> {
    object_id
        .strip_prefix("card-")
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|&i| i < stream.spec.objects && Stream::object_id(i) == object_id)
}

impl AuthoritySource for StreamAuthority {
    async fn fetch(
        &self,
        object_id: &str,
    ) -> Result<Option<AuthoritativeSnapshot>, AuthorityError> {
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
        if self.is_down(Instant::now()) {
            self.down.fetch_add(1, Ordering::Relaxed);
            return Err(AuthorityError::unavailable(
                "the load test's authority is in its outage",
            ));
        }
        if known_index(&self.stream, object_id).is_none() {
            self.absent.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        }
        match self.truth(object_id) {
            Some(snapshot) => {
                self.snapshots.fetch_add(1, Ordering::Relaxed);
                Ok(Some(snapshot))
            }
            None => Err(AuthorityError::new(
                AuthorityErrorKind::BadAnswer,
                format!("the generator's state of {object_id} is not valid JSON"),
            )),
        }
    }
}
