//! The circuit breaker in front of the authority: closed (fetches go),
//! open (nothing goes until a time), half-open (one probe goes; its answer
//! decides). Only failures to reach the authority count
//! ([`super::FetchOutcome`]: unavailable, timed out); any answer, even a
//! bad one, shows the authority is there.

use std::time::{Duration, SystemTime};

/// The breaker's state, as an operator sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerState {
    /// Fetches go; `failures` consecutive failures to reach the authority so
    /// far.
    Closed {
        /// Consecutive failures to reach the authority.
        failures: u32,
    },
    /// Nothing is fetched until `until` (an operator's request excepted).
    Open {
        /// When the probe may go.
        until: SystemTime,
    },
    /// One fetch goes as a probe; its answer closes the breaker, its failure
    /// opens it again.
    HalfOpen {
        /// Whether the probe is in flight.
        probing: bool,
    },
}

impl BreakerState {
    /// `closed`, `open` or `half_open`.
    pub fn as_str(&self) -> &'static str {
        match self {
            BreakerState::Closed { .. } => "closed",
            BreakerState::Open { .. } => "open",
            BreakerState::HalfOpen { .. } => "half_open",
        }
    }

    /// Its gauge value: 0 closed, 1 half-open, 2 open.
    pub fn gauge(&self) -> f64 {
        match self {
            BreakerState::Closed { .. } => 0.0,
            BreakerState::HalfOpen { .. } => 1.0,
            BreakerState::Open { .. } => 2.0,
        }
    }
}

/// The breaker (see the module doc).
#[derive(Clone, Debug)]
pub(super) struct Breaker {
    /// Where it is.
    pub(super) state: BreakerState,
    /// Consecutive failures that open it.
    threshold: u32,
    /// How long it stays open.
    open_for: Duration,
}

/// What an answer did to the breaker, for the caller's log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Change {
    /// Nothing worth a line.
    None,
    /// It opened (or opened again after a failed probe) until then.
    Opened(SystemTime),
    /// It closed after a probe's answer.
    Closed,
}

impl Breaker {
    pub(super) fn new(threshold: u32, open_for: Duration) -> Self {
        Self {
            state: BreakerState::Closed { failures: 0 },
            threshold,
            open_for,
        }
    }

    /// At `now`: whether an ordinary fetch may go, and, when it is open,
    /// until when it stays so. An open breaker whose time is up becomes
    /// half-open.
    pub(super) fn admits(&mut self, now: SystemTime) -> Result<(), Option<SystemTime>> {
        if let BreakerState::Open { until } = self.state {
            if now < until {
                return Err(Some(until));
            }
            self.state = BreakerState::HalfOpen { probing: false };
        }
        match self.state {
            BreakerState::HalfOpen { probing: true } => Err(None),
            _ => Ok(()),
        }
    }

    /// A fetch goes (after [`Breaker::admits`]): in half-open, it is the
    /// probe.
    pub(super) fn sent(&mut self) {
        if let BreakerState::HalfOpen { probing } = &mut self.state {
            *probing = true;
        }
    }

    /// A fetch answered at `now`: `reached` whether the authority answered.
    pub(super) fn answered(&mut self, reached: bool, now: SystemTime) -> Change {
        match (&mut self.state, reached) {
            (BreakerState::Closed { failures }, true) => {
                *failures = 0;
                Change::None
            }
            (BreakerState::Closed { failures }, false) => {
                *failures += 1;
                if *failures >= self.threshold {
                    self.open(now)
                } else {
                    Change::None
                }
            }
            (BreakerState::HalfOpen { .. }, true) => {
                self.state = BreakerState::Closed { failures: 0 };
                Change::Closed
            }
            (BreakerState::HalfOpen { .. }, false) => self.open(now),
            // Answers of fetches sent before it opened (or an operator's
            // request): an answer closes it as a probe's would; a failure
            // keeps it open as it is.
            (BreakerState::Open { .. }, true) => {
                self.state = BreakerState::Closed { failures: 0 };
                Change::Closed
            }
            (BreakerState::Open { .. }, false) => Change::None,
        }
    }

    fn open(&mut self, now: SystemTime) -> Change {
        let until = now + self.open_for;
        self.state = BreakerState::Open { until };
        Change::Opened(until)
    }
}
