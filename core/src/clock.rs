//! Time, injectable: the retention window (docs/CONTRACT.md §5) is measured on a [`Clock`]
//! so that tests and replays decide the same way on any day.

use crate::sync::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time (UTC).
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> SystemTime;
}

/// The operating system's clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that only moves when told to; for tests, replays and simulations.
#[derive(Debug)]
pub struct ManualClock {
    /// Nanoseconds since the Unix epoch; an atomic so that a shared clock can be
    /// moved while actors read it (u64 nanoseconds reach the year 2554).
    nanos: AtomicU64,
}

impl ManualClock {
    /// A clock standing at `at`. Times before 1970 are clamped to the epoch.
    pub fn new(at: SystemTime) -> Self {
        Self {
            nanos: AtomicU64::new(to_nanos(at)),
        }
    }

    /// Moves the clock to `at` (backwards too: it is the caller's clock).
    pub fn set(&self, at: SystemTime) {
        self.nanos.store(to_nanos(at), Ordering::SeqCst);
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(by, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_nanos(self.nanos.load(Ordering::SeqCst))
    }
}

fn to_nanos(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Parses an RFC 3339 timestamp (for example `2024-01-01T08:00:00Z`).
/// Returns `None` for anything else, or a time before 1970.
pub fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    let t =
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()?;
    let nanos = u64::try_from(t.unix_timestamp_nanos()).ok()?;
    Some(UNIX_EPOCH + Duration::from_nanos(nanos))
}

/// Formats a time as RFC 3339 UTC (`2024-01-01T08:00:20Z`).
pub fn format_rfc3339(at: SystemTime) -> String {
    time::OffsetDateTime::from(at)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| "invalid-time".to_owned())
}

#[cfg(all(test, not(snapshot_receiver_loom)))]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trip() {
        let t = parse_rfc3339("2024-01-01T08:00:20Z").unwrap();
        assert_eq!(
            t.duration_since(UNIX_EPOCH).unwrap().as_secs(),
            1_704_096_020
        );
        assert_eq!(format_rfc3339(t), "2024-01-01T08:00:20Z");
        assert_eq!(parse_rfc3339("2024-01-01 08:00"), None);
        assert_eq!(
            parse_rfc3339("2024-01-01T09:00:00+01:00"),
            parse_rfc3339("2024-01-01T08:00:00Z")
        );
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let start = parse_rfc3339("2024-01-01T08:00:00Z").unwrap();
        let clock = ManualClock::new(start);
        assert_eq!(clock.now(), start);
        clock.advance(Duration::from_secs(5));
        assert_eq!(clock.now(), start + Duration::from_secs(5));
        clock.set(start);
        assert_eq!(clock.now(), start);
    }
}
