//! Warnings a flood cannot multiply: a [`LogGate`] lets one line of its kind
//! through per interval and counts the rest, and the next line it lets
//! through carries that count (`suppressed = N`).
//!
//! The receiver's own warnings on a failing store (a group commit that
//! failed, a batch answered `retry`) come once per commit group; during an
//! outage under load that was hundreds of lines a second. The counters
//! (`CommitStats`, the `metrics` facade) still count every failure; the
//! gate limits only the log.
//!
//! Each gate is a `static` at its call site, so it is shared by every
//! receiver of the process. A std mutex: taken only on the failure path,
//! for a comparison and an addition.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a gate stays shut after it let a line through.
pub(crate) const INTERVAL: Duration = Duration::from_secs(10);

/// One kind of warning's gate (see the module doc).
pub(crate) struct LogGate {
    /// When the last line went through (`None`: never), and how many were
    /// counted instead of written since.
    state: Mutex<(Option<Instant>, u64)>,
}

impl LogGate {
    /// A gate that has let nothing through yet.
    pub(crate) const fn new() -> Self {
        Self {
            state: Mutex::new((None, 0)),
        }
    }

    /// At `now`: `Some(n)` when the caller writes its line (the first, or
    /// the first one [`INTERVAL`] after the last written), `n` being how many
    /// lines of this kind were counted instead of written since the last;
    /// `None` (counted) otherwise.
    pub(crate) fn admit(&self, now: Instant) -> Option<u64> {
        let mut state = crate::locks::lock(&self.state);
        let (last, suppressed) = &mut *state;
        match last {
            Some(at) if now.saturating_duration_since(*at) < INTERVAL => {
                *suppressed = suppressed.saturating_add(1);
                None
            }
            _ => {
                *last = Some(now);
                Some(std::mem::take(suppressed))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_carries_the_count_of_those_not_written() {
        let gate = LogGate::new();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert_eq!(gate.admit(at(0)), Some(0));
        let counted = (1..=999).filter(|i| gate.admit(at(*i)).is_none()).count();
        assert_eq!(counted, 999);
        assert_eq!(gate.admit(at(9_999)), None);
        assert_eq!(gate.admit(at(10_000)), Some(1_000));
        assert_eq!(gate.admit(at(10_001)), None);
        assert_eq!(gate.admit(at(60_000)), Some(1));
        assert_eq!(gate.admit(at(60_000 + 10_000)), Some(0));
    }
}
