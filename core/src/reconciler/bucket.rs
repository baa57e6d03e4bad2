//! The token bucket over all fetches, as the generic cell rate algorithm
//! (GCRA, ITU-T I.371): one "theoretical arrival time" instead of a token
//! count, so that no refill has to be computed. A bucket of `burst` tokens
//! refilled at `rate` per second lets a fetch go when `now` is at most
//! `(burst − 1) / rate` before the theoretical arrival time, which each
//! fetch moves `1 / rate` later.

use std::time::{Duration, SystemTime};

/// The bucket (see the module doc).
#[derive(Clone, Debug)]
pub(super) struct Bucket {
    /// `1 / rate`: how far each fetch moves the arrival time; `None`:
    /// unlimited.
    interval: Option<Duration>,
    /// `(burst − 1) / rate`: how far ahead of the arrival time a fetch may
    /// go (the burst).
    tolerance: Duration,
    /// The theoretical arrival time of the next fetch (`None`: none yet).
    tat: Option<SystemTime>,
}

impl Bucket {
    /// A full bucket of `burst` tokens refilled at `rate` per second
    /// (`None`: unlimited).
    pub(super) fn new(rate: Option<f64>, burst: u32) -> Self {
        let interval = rate.map(|r| Duration::from_secs_f64(1.0 / r));
        Self {
            interval,
            tolerance: interval.map_or(Duration::ZERO, |i| i * burst.saturating_sub(1)),
            tat: None,
        }
    }

    /// How long until a token is there at `now`; `None`: one is there.
    pub(super) fn wait(&self, now: SystemTime) -> Option<Duration> {
        let tat = self.tat?;
        let earliest = tat.checked_sub(self.tolerance).unwrap_or(tat);
        earliest.duration_since(now).ok().filter(|d| !d.is_zero())
    }

    /// Takes a token at `now` (the caller checked [`Bucket::wait`]).
    pub(super) fn take(&mut self, now: SystemTime) {
        if let Some(interval) = self.interval {
            let from = self.tat.map_or(now, |t| t.max(now));
            self.tat = Some(from + interval);
        }
    }
}
