//! The stored encodings both backends share: how a row's versions, times,
//! verdicts and audit kinds are written into a store's columns and read
//! back. Versions are 20-digit zero-padded decimal text, so that every u64
//! fits and text order is numeric order in both SQLite and PostgreSQL;
//! times are nanoseconds since the Unix epoch.

use super::StoreError;
use snapshot_receiver_core::Verdict;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A [`super::ReceiptRow::retention_cutoff`] as stored times are compared with it:
/// nanoseconds since the Unix epoch, `-1` (below every stored time) for `None`.
pub(super) fn cutoff_ns(cutoff: Option<SystemTime>) -> i64 {
    cutoff.map_or(-1, time_ns)
}

/// A version as stored: 20-digit zero-padded decimal text.
pub(super) fn version_text(v: u64) -> String {
    format!("{v:020}")
}

/// Reads a stored version.
pub(super) fn parse_version(text: &str) -> Result<u64, StoreError> {
    text.parse()
        .map_err(|_| StoreError::Failed(format!("corrupt version {text:?} in the store")))
}

/// Nanoseconds since the Unix epoch, as stored (i64 reaches the year 2262).
pub(super) fn time_ns(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// Reads a stored time.
pub(super) fn ns_time(ns: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(u64::try_from(ns).unwrap_or(0))
}

/// Reads a stored verdict code.
pub(super) fn verdict(code: &str) -> Result<Verdict, StoreError> {
    Verdict::from_code(code)
        .ok_or_else(|| StoreError::Failed(format!("corrupt decision {code:?} in the store")))
}

/// Maps a stored audit kind back to its static name.
pub(super) fn audit_kind(kind: &str) -> Result<&'static str, StoreError> {
    [
        "delivery",
        "malformed",
        "paused",
        "authority",
        "authority_refused",
        "reevaluated",
        "unresolved",
    ]
    .into_iter()
    .find(|k| *k == kind)
    .ok_or_else(|| StoreError::Failed(format!("corrupt audit kind {kind:?}")))
}
