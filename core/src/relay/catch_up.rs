//! When a relay far behind logs its progress ([`CatchUp`]).

use std::time::{Duration, SystemTime};

/// A relay this many effects behind is catching up: it logs its progress.
pub const CATCH_UP_EFFECTS: u64 = 1000;
/// How often a catching-up relay logs its progress.
pub const CATCH_UP_EVERY: Duration = Duration::from_secs(10);

/// A line a catching-up relay logs ([`CatchUp::observe`]).
#[derive(Clone, Debug, PartialEq)]
pub enum CatchUpLine {
    /// It fell [`CATCH_UP_EFFECTS`] or more behind.
    Started {
        /// Its cursor.
        position: u64,
        /// The outbox's last position.
        last: u64,
    },
    /// Still behind, [`CATCH_UP_EVERY`] after the previous line.
    Progress {
        /// Its cursor.
        position: u64,
        /// The outbox's last position.
        last: u64,
        /// Effects passed per second since the previous line.
        rate: f64,
    },
    /// Back within one round's batch ([`super::RelaySettings::batch`]) of the
    /// last position.
    Done {
        /// Effects passed since it started catching up.
        passed: u64,
        /// How long it took.
        took: Duration,
    },
}

/// When a relay logs its progress on a long catch-up: once it is
/// [`CATCH_UP_EFFECTS`] behind, at most every [`CATCH_UP_EVERY`] while it
/// stays behind, and once when it is back within a batch of the last
/// position. Plain synchronous code, given the times (the relay's wall
/// clock; one set back counts as no time passed), so that it is tested
/// without a clock.
#[derive(Debug)]
pub struct CatchUp {
    /// It is back when this close to the last position.
    within: u64,
    /// Since when, from which position, it is catching up; and the last
    /// line's instant and position.
    behind: Option<(SystemTime, u64, SystemTime, u64)>,
}

impl CatchUp {
    /// A relay not catching up, back once within `batch` effects of the
    /// last position.
    pub fn new(batch: usize) -> Self {
        Self {
            within: u64::try_from(batch).unwrap_or(u64::MAX),
            behind: None,
        }
    }

    /// The line to log (if any) when the relay's cursor is `position` and
    /// the outbox's last position is `last` at `now`.
    pub fn observe(&mut self, now: SystemTime, position: u64, last: u64) -> Option<CatchUpLine> {
        let lag = last.saturating_sub(position);
        match self.behind {
            None if lag >= CATCH_UP_EFFECTS => {
                self.behind = Some((now, position, now, position));
                Some(CatchUpLine::Started { position, last })
            }
            None => None,
            Some((since, from, _, _)) if lag <= self.within => {
                self.behind = None;
                Some(CatchUpLine::Done {
                    passed: position.saturating_sub(from),
                    took: now.duration_since(since).unwrap_or_default(),
                })
            }
            Some((since, from, said, at)) => {
                let gap = now.duration_since(said).unwrap_or_default();
                if gap < CATCH_UP_EVERY {
                    return None;
                }
                self.behind = Some((since, from, now, position));
                Some(CatchUpLine::Progress {
                    position,
                    last,
                    rate: position.saturating_sub(at) as f64 / gap.as_secs_f64(),
                })
            }
        }
    }
}
