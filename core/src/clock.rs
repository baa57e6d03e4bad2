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

/// Parses an RFC 3339 timestamp (for example `2024-01-01T08:00:00Z`): `T`,
/// `t` or a space between date and time, `Z`, `z` or `+hh:mm` / `-hh:mm`, a
/// fraction of any length (kept to the nanosecond), a leap second only as a
/// month's last second in UTC (read as the second before it). Returns `None`
/// for anything else, or a time before 1970 (a [`ManualClock`] cannot stand
/// there).
pub fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    let t = Timestamp::parse(text)?;
    let secs = u64::try_from(t.secs).ok()?;
    Some(UNIX_EPOCH + Duration::new(secs, t.nanos))
}

/// An RFC 3339 timestamp read as the instant it names, in UTC: seconds and
/// nanoseconds since the Unix epoch (negative before 1970), whatever offset
/// and fraction spelled it. `occurred_at` is read this way, for the
/// retention rule and for the fingerprint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Timestamp {
    /// Whole seconds since 1970-01-01T00:00:00Z; an i64 holds every year
    /// RFC 3339 can write (0000-9999) in any offset.
    pub(crate) secs: i64,
    /// Nanoseconds within that second (0..1e9); digits past the ninth are
    /// dropped.
    pub(crate) nanos: u32,
    /// The text named a leap second (`:60`). Unix time has none, so `secs`
    /// is the second before it (`23:59:59`, the fraction kept) and this flag
    /// keeps the leap second apart from that second in the fingerprint.
    pub(crate) leap_second: bool,
}

impl Timestamp {
    /// Reads an RFC 3339 `date-time` (§5.6): `YYYY-MM-DD`, then `T`, `t` or
    /// a space (the RFC's note allows a space), `hh:mm:ss`, an optional
    /// fraction of any length, and `Z`, `z` or `+hh:mm` / `-hh:mm`. A leap
    /// second (`:60`) is accepted only where one can fall: the last second
    /// of a month in UTC. `None` for anything else, such as a missing
    /// offset, another separator, `24:00:00` or `2023-02-29`.
    ///
    /// The `time` crate does the reading; two things it allows are refused
    /// here first: any byte as the separator, and it keeps a leap second's
    /// fraction out (it reads `23:59:60.5` as `23:59:59.999999999`).
    pub(crate) fn parse(text: &str) -> Option<Self> {
        use time::format_description::well_known::Rfc3339;
        let bytes = text.as_bytes();
        if !matches!(bytes.get(10), Some(b'T' | b't' | b' ')) {
            return None;
        }
        let t = time::OffsetDateTime::parse(text, &Rfc3339).ok()?;
        // Parsed, so the seconds are bytes 17 and 18.
        if bytes.get(17..19) != Some(b"60") {
            return Some(Self {
                secs: t.unix_timestamp(),
                nanos: t.nanosecond(),
                leap_second: false,
            });
        }
        // `time` checked where the leap second falls; read its fraction from
        // the same text as second 59 (rare: one allocation is fine).
        let mut second_59 = text.to_owned();
        second_59.replace_range(17..19, "59");
        let t = time::OffsetDateTime::parse(&second_59, &Rfc3339).ok()?;
        Some(Self {
            secs: t.unix_timestamp(),
            nanos: t.nanosecond(),
            leap_second: true,
        })
    }

    /// Whether this instant lies more than `window` before `now`: never for
    /// a time after `now`, always for one before 1970 when `now` is later
    /// by more than `window`.
    pub(crate) fn older_than(&self, now: SystemTime, window: Duration) -> bool {
        let now = match now.duration_since(UNIX_EPOCH) {
            Ok(after) => after.as_nanos() as i128,
            Err(before) => -(before.duration().as_nanos() as i128),
        };
        let at = i128::from(self.secs) * 1_000_000_000 + i128::from(self.nanos);
        // Within i128: both sides are below 2^64 seconds in nanoseconds.
        now - at > window.as_nanos() as i128
    }
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

    /// Every RFC 3339 shape `occurred_at` may take, read to its exact instant
    /// (seconds since 1970, nanoseconds, leap second), or refused.
    #[test]
    fn timestamps_read_to_their_instant() {
        let at = |secs, nanos, leap_second| {
            Some(Timestamp {
                secs,
                nanos,
                leap_second,
            })
        };
        let t = 1_704_096_000; // 2024-01-01T08:00:00Z
        let leap = 1_483_228_799; // 2016-12-31T23:59:59Z, before the leap second
        let cases: &[(&str, Option<Timestamp>)] = &[
            ("2024-01-01T08:00:00Z", at(t, 0, false)),
            ("1970-01-01T00:00:00Z", at(0, 0, false)),
            ("1969-12-31T23:59:59Z", at(-1, 0, false)),
            ("1969-12-31T23:59:59.5Z", at(-1, 500_000_000, false)),
            ("0001-01-01T00:00:00Z", at(-62_135_596_800, 0, false)),
            ("0000-01-01T00:00:00Z", at(-62_167_219_200, 0, false)),
            // Year 0000 an hour east of UTC is year -1 in UTC: still an instant.
            ("0000-01-01T00:00:00+01:00", at(-62_167_222_800, 0, false)),
            (
                "9999-12-31T23:59:59.999999999Z",
                at(253_402_300_799, 999_999_999, false),
            ),
            ("9999-12-31T23:59:59-01:00", at(253_402_304_399, 0, false)),
            // Fractions: trailing zeros change nothing, nine digits are exact,
            // digits past the ninth are dropped.
            ("2024-01-01T08:00:00.000Z", at(t, 0, false)),
            ("2024-01-01T08:00:00.1Z", at(t, 100_000_000, false)),
            ("2024-01-01T08:00:00.123456789Z", at(t, 123_456_789, false)),
            ("2024-01-01T08:00:00.1234567891Z", at(t, 123_456_789, false)),
            // Lower case `t` and `z`; a space (RFC 3339's note); offsets.
            ("2024-01-01t08:00:00z", at(t, 0, false)),
            ("2024-01-01 08:00:00Z", at(t, 0, false)),
            ("2024-01-01T03:00:00-05:00", at(t, 0, false)),
            ("2024-01-01T13:30:00+05:30", at(t, 0, false)),
            ("2024-01-01T08:00:00-00:00", at(t, 0, false)),
            ("2024-01-01T08:00:00+00:00", at(t, 0, false)),
            // A leap second, in any offset, keeps its fraction and its flag.
            ("2016-12-31T23:59:60Z", at(leap, 0, true)),
            ("2016-12-31T23:59:60.5Z", at(leap, 500_000_000, true)),
            ("2016-12-31T18:59:60.5-05:00", at(leap, 500_000_000, true)),
            ("2016-12-31T23:59:59.5Z", at(leap, 500_000_000, false)),
            // ... and exists only as a month's last UTC second.
            ("2024-01-01T23:59:60Z", None),
            ("2016-12-31T23:59:60+01:00", None),
            // Not RFC 3339.
            ("2024-01-01T08:00:00", None),
            ("2024-01-01T08:00Z", None),
            ("2024-01-01T08:00:00+0500", None),
            ("2024-01-01T08:00:00+24:00", None),
            ("2024-01-01T08:00:00.Z", None),
            ("2024-01-01_08:00:00Z", None),
            ("2024-01-01T24:00:00Z", None),
            ("2023-02-29T00:00:00Z", None),
            (" 2024-01-01T08:00:00Z", None),
            ("2024-01-01T08:00:00Z ", None),
            ("+2024-01-01T08:00:00Z", None),
            ("10000-01-01T00:00:00Z", None),
            ("yesterday", None),
            ("", None),
        ];
        for (text, expected) in cases {
            assert_eq!(Timestamp::parse(text), *expected, "{text}");
        }
        // parse_rfc3339 reads the same way, from 1970 on.
        assert_eq!(parse_rfc3339("1969-12-31T23:59:59Z"), None);
        assert_eq!(parse_rfc3339("2024-01-01_08:00:00Z"), None);
        assert_eq!(
            parse_rfc3339("2024-01-01t03:00:00.5-05:00"),
            Some(UNIX_EPOCH + Duration::new(1_704_096_000, 500_000_000))
        );
    }

    #[test]
    fn older_than_counts_every_instant_before_the_window() {
        let now = parse_rfc3339("2024-01-01T09:00:00Z").unwrap();
        let day = Duration::from_secs(24 * 3600);
        let old = |text: &str| Timestamp::parse(text).unwrap().older_than(now, day);
        assert!(old("0000-01-01T00:00:00+01:00"));
        assert!(old("0001-01-01T00:00:00Z"));
        assert!(old("1969-12-31T23:59:59Z"));
        assert!(old("1970-01-01T00:00:00Z"));
        // Exactly the window is not older; a nanosecond more is.
        assert!(!old("2023-12-31T09:00:00Z"));
        assert!(old("2023-12-31T08:59:59.999999999Z"));
        assert!(!old("2024-01-01T08:00:00Z"));
        assert!(!old("9999-12-31T23:59:59Z"));
        // A clock before 1970 (only a caller's SystemTime can be there).
        let before = UNIX_EPOCH - Duration::from_secs(10);
        let at = |text: &str| Timestamp::parse(text).unwrap();
        assert!(at("1969-12-30T23:59:49Z").older_than(before, day));
        assert!(!at("1969-12-31T23:59:49Z").older_than(before, day));
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
