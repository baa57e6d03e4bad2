//! One compact [`Code`] per delivery outcome, so a run can record millions
//! of them, and the [`DecisionCounts`] of a run.

use snapshot_receiver::{ConflictKind, Decision, HoldReason, Verdict};
use snapshot_receiver::{Outcome, Receipt};

/// A compact code for one delivery's outcome, so a run can record millions of
/// them cheaply. See [`decision_code`] and [`describe_code`].
pub type Code = u8;

pub(crate) const NOT_SENT: Code = 0;
pub(crate) const APPLIED: Code = 1;
pub(crate) const STALE: Code = 2;
pub(crate) const EQUAL: Code = 3;
pub(crate) const EVENT_VARIANT: Code = 4;
pub(crate) const VERSION_STATE: Code = 5;
pub(crate) const HELD: Code = 8;
pub(crate) const DUPLICATE: Code = 32;
pub(crate) const RETRY: Code = 250;
pub(crate) const REJECT: Code = 251;

pub(crate) const HOLD_REASONS: [HoldReason; 7] = HoldReason::ALL;

/// The code of a first record's verdict (what a `duplicate` of it reports
/// as its original; the code of that duplicate is this plus 32).
pub fn verdict_code(v: Verdict) -> Code {
    match v {
        Verdict::Applied => APPLIED,
        Verdict::Stale => STALE,
        Verdict::Equal => EQUAL,
        Verdict::Conflict(ConflictKind::EventVariant) => EVENT_VARIANT,
        Verdict::Conflict(ConflictKind::VersionState) => VERSION_STATE,
        Verdict::Held(r) => HELD + HOLD_REASONS.iter().position(|h| *h == r).unwrap_or(0) as Code,
    }
}

/// The code of a receipt: its decision, or retry / reject.
pub fn decision_code(receipt: &Receipt) -> Code {
    match receipt.outcome {
        Outcome::Decided(Decision::Duplicate { original }) => DUPLICATE + verdict_code(original),
        Outcome::Decided(Decision::Applied) => APPLIED,
        Outcome::Decided(Decision::Stale) => STALE,
        Outcome::Decided(Decision::Equal) => EQUAL,
        Outcome::Decided(Decision::Conflict(k)) => verdict_code(Verdict::Conflict(k)),
        Outcome::Decided(Decision::Held(r)) => verdict_code(Verdict::Held(r)),
        Outcome::Retry(_) => RETRY,
        Outcome::Rejected(_) => REJECT,
    }
}

/// A readable name for a [`Code`], worded as [`Decision`]'s `Display`, for
/// example `duplicate (original: applied)`.
pub fn describe_code(code: Code) -> String {
    match code {
        NOT_SENT => "not sent".into(),
        APPLIED => "applied".into(),
        STALE => "stale".into(),
        EQUAL => "equal".into(),
        EVENT_VARIANT => "conflict (event_variant)".into(),
        VERSION_STATE => "conflict (version_state)".into(),
        c if (HELD..HELD + 7).contains(&c) => {
            format!("held ({})", HOLD_REASONS[(c - HELD) as usize].as_str())
        }
        c if (DUPLICATE..DUPLICATE + HELD + 7).contains(&c) => {
            Decision::duplicate_of(describe_code(c - DUPLICATE)).to_string()
        }
        RETRY => "retry".into(),
        REJECT => "reject".into(),
        c => format!("unknown code {c}"),
    }
}

/// Decision counts of a run, by wire name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DecisionCounts {
    /// `applied`.
    pub applied: u64,
    /// `stale`.
    pub stale: u64,
    /// `equal`.
    pub equal: u64,
    /// `duplicate` (any original).
    pub duplicate: u64,
    /// `conflict (event_variant)`.
    pub conflict_event_variant: u64,
    /// `conflict (version_state)`.
    pub conflict_version_state: u64,
    /// `held (paused)`.
    pub held_paused: u64,
    /// `held (unknown_object)`.
    pub held_unknown_object: u64,
    /// Any other hold.
    pub held_other: u64,
    /// Not recorded: `retry`.
    pub retry: u64,
    /// Not recorded: `reject`.
    pub reject: u64,
    /// No receipt at all (a driver bug).
    pub missing: u64,
}

impl DecisionCounts {
    /// Counts the codes of a run.
    pub fn of(codes: &[Code]) -> Self {
        let mut c = Self::default();
        for &code in codes {
            match code {
                APPLIED => c.applied += 1,
                STALE => c.stale += 1,
                EQUAL => c.equal += 1,
                EVENT_VARIANT => c.conflict_event_variant += 1,
                VERSION_STATE => c.conflict_version_state += 1,
                HELD => c.held_paused += 1,
                x if x == HELD + 1 => c.held_unknown_object += 1,
                x if (HELD + 2..HELD + 7).contains(&x) => c.held_other += 1,
                x if (DUPLICATE..DUPLICATE + HELD + 7).contains(&x) => c.duplicate += 1,
                RETRY => c.retry += 1,
                REJECT => c.reject += 1,
                _ => c.missing += 1,
            }
        }
        c
    }
}
