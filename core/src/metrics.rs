//! Counters for every outcome: each decision by kind, each hold reason, each
//! conflict kind, each retry and reject reason, and what reconciliation did.
//!
//! Every count is kept twice: in our own atomics, so that
//! [`crate::Receiver::metrics`] can return them without any exporter, and
//! through the [`metrics`](::metrics) facade crate (`counter!` with labels),
//! so that whatever recorder the embedding service installs (Prometheus,
//! StatsD, ...) sees the same numbers. Without an installed recorder the
//! facade calls cost a relaxed atomic load.
//!
//! The readable keys, the facade counters and their labels are `KEYS` and
//! `Group` below; the table of them for readers, with what each counter
//! sums, is `docs/OPERATIONS.md` (*Metrics*), which `tests/counters.rs`
//! checks against them.

use crate::decision::{ConflictKind, Decision, HoldReason, Verdict};
use crate::engine::{
    Outcome, Receipt, ReconcileError, ReconcileReport, ReevaluationOutcome, RetryReason,
};
use crate::envelope::RejectReason;
use crate::sync::{AtomicU64, Ordering};
use std::collections::BTreeMap;

/// A point-in-time copy of every counter, keyed like `decision.applied`,
/// `held.missing_version`, `reject.body_too_large` or `retry.held_queue_full`.
/// Every key is present, zeros included, so the set of keys is stable.
pub type MetricsSnapshot = BTreeMap<String, u64>;

/// One counter: its readable key and how it is exported through the facade.
struct CounterKey {
    /// The group: the part of the readable key before the dot.
    group: Group,
    /// The label value and the part of the readable key after the dot.
    value: &'static str,
}

/// A family of counters sharing one facade name and one label.
#[derive(Clone, Copy)]
enum Group {
    Decision,
    Held,
    Conflict,
    Retry,
    Reject,
    Authority,
    Reevaluated,
}

impl Group {
    /// The readable key's prefix.
    fn prefix(self) -> &'static str {
        match self {
            Group::Decision => "decision",
            Group::Held => "held",
            Group::Conflict => "conflict",
            Group::Retry => "retry",
            Group::Reject => "reject",
            Group::Authority => "authority",
            Group::Reevaluated => "reevaluated",
        }
    }

    /// The facade counter's name.
    fn metric(self) -> &'static str {
        match self {
            Group::Decision => "snapshot_receiver_decisions_total",
            Group::Held => "snapshot_receiver_held_total",
            Group::Conflict => "snapshot_receiver_conflicts_total",
            Group::Retry => "snapshot_receiver_retries_total",
            Group::Reject => "snapshot_receiver_rejects_total",
            Group::Authority => "snapshot_receiver_authority_total",
            Group::Reevaluated => "snapshot_receiver_reevaluated_total",
        }
    }

    /// The facade counter's label name.
    fn label(self) -> &'static str {
        match self {
            Group::Decision | Group::Reevaluated => "decision",
            Group::Held | Group::Retry | Group::Reject => "reason",
            Group::Conflict => "kind",
            Group::Authority => "outcome",
        }
    }
}

impl Group {
    /// Every group, once.
    const ALL: [Group; 7] = [
        Group::Decision,
        Group::Held,
        Group::Conflict,
        Group::Retry,
        Group::Reject,
        Group::Authority,
        Group::Reevaluated,
    ];

    /// What the facade counter counts (its Prometheus `# HELP` text).
    fn help(self) -> &'static str {
        match self {
            Group::Decision => "Deliveries decided, by decision.",
            Group::Held => "Deliveries held, by reason.",
            Group::Conflict => "Conflicting deliveries, by kind.",
            Group::Retry => "Deliveries answered retry, by reason.",
            Group::Reject => "Deliveries rejected, by reason.",
            Group::Authority => "Authoritative snapshots, by outcome.",
            Group::Reevaluated => {
                "Held deliveries decided again after a change of their object, by decision."
            }
        }
    }
}

/// Describes every counter the engine counts through the
/// [`metrics`](::metrics) facade (`describe_counter!`: the recorder's
/// `# HELP` text in Prometheus) to the recorder installed now. Called once,
/// after the recorder is installed; describing again only repeats the same
/// text.
pub fn describe() {
    for group in Group::ALL {
        ::metrics::describe_counter!(group.metric(), group.help());
    }
}

const fn key(group: Group, value: &'static str) -> CounterKey {
    CounterKey { group, value }
}

// Offsets of each group in `KEYS`; the `*_slot` functions below add to them.
const DECISION: usize = 0;
const HELD: usize = DECISION + 6;
const CONFLICT: usize = HELD + 7;
const RETRY: usize = CONFLICT + 2;
const REJECT: usize = RETRY + 5;
const AUTHORITY: usize = REJECT + 5;
const REEVALUATED: usize = AUTHORITY + 4;
const COUNT: usize = REEVALUATED + 6;

/// Every counter, in slot order (checked against the `as_str` names by a test).
const KEYS: [CounterKey; COUNT] = [
    key(Group::Decision, "applied"),
    key(Group::Decision, "duplicate"),
    key(Group::Decision, "stale"),
    key(Group::Decision, "equal"),
    key(Group::Decision, "conflict"),
    key(Group::Decision, "held"),
    key(Group::Held, "paused"),
    key(Group::Held, "unknown_object"),
    key(Group::Held, "missing_version"),
    key(Group::Held, "invalid_version"),
    key(Group::Held, "unsupported_type"),
    key(Group::Held, "malformed"),
    key(Group::Held, "expired_identity"),
    key(Group::Conflict, "event_variant"),
    key(Group::Conflict, "version_state"),
    key(Group::Retry, "held_queue_full"),
    key(Group::Retry, "parking_full"),
    key(Group::Retry, "shutting_down"),
    key(Group::Retry, "store_failed"),
    key(Group::Retry, "memory_full"),
    key(Group::Reject, "body_too_large"),
    key(Group::Reject, "too_deep"),
    key(Group::Reject, "id_too_long"),
    key(Group::Reject, "nul_in_id"),
    key(Group::Reject, "store_refused"),
    key(Group::Authority, "applied"),
    key(Group::Authority, "refused"),
    key(Group::Authority, "store_failed"),
    key(Group::Authority, "unchanged"),
    key(Group::Reevaluated, "applied"),
    key(Group::Reevaluated, "stale"),
    key(Group::Reevaluated, "equal"),
    key(Group::Reevaluated, "held"),
    key(Group::Reevaluated, "conflict"),
    key(Group::Reevaluated, "unresolved"),
];

fn decision_slot(d: Decision) -> usize {
    DECISION
        + match d {
            Decision::Applied => 0,
            Decision::Duplicate { .. } => 1,
            Decision::Stale => 2,
            Decision::Equal => 3,
            Decision::Conflict(_) => 4,
            Decision::Held(_) => 5,
        }
}

fn held_slot(r: HoldReason) -> usize {
    HELD + match r {
        HoldReason::Paused => 0,
        HoldReason::UnknownObject => 1,
        HoldReason::MissingVersion => 2,
        HoldReason::InvalidVersion => 3,
        HoldReason::UnsupportedType => 4,
        HoldReason::Malformed => 5,
        HoldReason::ExpiredIdentity => 6,
    }
}

fn conflict_slot(k: ConflictKind) -> usize {
    CONFLICT
        + match k {
            ConflictKind::EventVariant => 0,
            ConflictKind::VersionState => 1,
        }
}

fn retry_slot(r: &RetryReason) -> usize {
    RETRY
        + match r {
            RetryReason::HeldQueueFull { .. } => 0,
            RetryReason::ParkingFull { .. } => 1,
            RetryReason::ShuttingDown => 2,
            RetryReason::StoreFailed(_) => 3,
            RetryReason::MemoryFull { .. } => 4,
        }
}

fn reject_slot(r: &RejectReason) -> usize {
    REJECT
        + match r {
            RejectReason::BodyTooLarge { .. } => 0,
            RejectReason::TooDeep { .. } => 1,
            RejectReason::IdTooLong { .. } => 2,
            RejectReason::NulInId { .. } => 3,
            RejectReason::StoreRefused { .. } => 4,
        }
}

fn reevaluated_slot(o: ReevaluationOutcome) -> usize {
    REEVALUATED
        + match o {
            ReevaluationOutcome::Decided(Verdict::Applied, _) => 0,
            ReevaluationOutcome::Decided(Verdict::Stale, _) => 1,
            ReevaluationOutcome::Decided(Verdict::Equal, _) => 2,
            ReevaluationOutcome::Decided(Verdict::Held(_), _) => 3,
            ReevaluationOutcome::Decided(Verdict::Conflict(_), _) => 4,
            ReevaluationOutcome::Unresolved(_) => 5,
        }
}

/// Counters of every outcome a receiver produced, readable at any time.
///
/// The `snapshot-receiver` crate's `Receiver` counts each receipt as it hands it back to the caller
/// (so a caller that abandons `deliver` mid-way is not counted, although the
/// shard may have recorded the decision) and each reconciliation.
///
/// Each counter is its own atomic, incremented with `Relaxed` ordering: a
/// [`DecisionCounters::snapshot`] taken while deliveries run is a consistent
/// value per counter, not a cut across all of them.
pub struct DecisionCounters {
    /// One atomic per entry of `KEYS`, from the `sync` facade so the type also
    /// builds under the loom configuration.
    counts: [AtomicU64; COUNT],
}

impl Default for DecisionCounters {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for DecisionCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.snapshot()).finish()
    }
}

impl DecisionCounters {
    /// All counters at zero.
    pub fn new() -> Self {
        Self {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    fn bump(&self, slot: usize) {
        self.bump_by(slot, 1);
    }

    fn bump_by(&self, slot: usize, n: u64) {
        self.counts[slot].fetch_add(n, Ordering::Relaxed);
        let key = &KEYS[slot];
        ::metrics::counter!(key.group.metric(), key.group.label() => key.value).increment(n);
    }

    /// Counts one delivery's receipt: its decision (and hold reason or
    /// conflict kind), or why it must be retried, or why it was rejected.
    pub fn record(&self, receipt: &Receipt) {
        self.record_all(std::slice::from_ref(receipt));
    }

    /// Counts many receipts like [`DecisionCounters::record`], touching each
    /// shared counter once per call instead of once per receipt (the
    /// counters are shared by every producer, so this saves cache-line
    /// traffic between cores under load).
    pub fn record_all(&self, receipts: &[Receipt]) {
        let mut local = [0u64; COUNT];
        for receipt in receipts {
            match &receipt.outcome {
                Outcome::Decided(d) => {
                    local[decision_slot(*d)] += 1;
                    match *d {
                        Decision::Held(r) => local[held_slot(r)] += 1,
                        Decision::Conflict(k) => local[conflict_slot(k)] += 1,
                        _ => {}
                    }
                }
                Outcome::Retry(why) => local[retry_slot(why)] += 1,
                Outcome::Rejected(why) => local[reject_slot(why)] += 1,
            }
        }
        for (slot, n) in local.into_iter().enumerate() {
            if n > 0 {
                self.bump_by(slot, n);
            }
        }
    }

    /// Counts one reconciliation: the authority applied (a replacement) or
    /// found equal to the object (unchanged), with each held event it
    /// re-evaluated, or refused. A receiver that is shutting down counts
    /// nothing here.
    pub fn record_reconcile(&self, result: &Result<ReconcileReport, ReconcileError>) {
        match result {
            Ok(report) => {
                self.bump(if report.replacement {
                    AUTHORITY
                } else {
                    AUTHORITY + 3
                });
                for r in &report.reevaluated {
                    self.bump(reevaluated_slot(r.outcome));
                }
            }
            Err(ReconcileError::AuthorityOlder { .. }) => self.bump(AUTHORITY + 1),
            Err(ReconcileError::StoreFailed(_)) => self.bump(AUTHORITY + 2),
            Err(ReconcileError::ShuttingDown) => {}
        }
    }

    /// The value of every counter, keyed like `decision.applied`.
    pub fn snapshot(&self) -> MetricsSnapshot {
        KEYS.iter()
            .zip(&self.counts)
            .map(|(k, c)| {
                let name = format!("{}.{}", k.group.prefix(), k.value);
                (name, c.load(Ordering::Relaxed))
            })
            .collect()
    }
}

#[cfg(all(test, not(snapshot_receiver_loom)))]
mod tests {
    use super::*;

    #[test]
    fn every_slot_names_its_outcome() {
        for r in HoldReason::ALL {
            assert_eq!(KEYS[held_slot(r)].value, r.as_str());
            assert_eq!(KEYS[decision_slot(Decision::Held(r))].value, "held");
        }
        for k in [ConflictKind::EventVariant, ConflictKind::VersionState] {
            assert_eq!(KEYS[conflict_slot(k)].value, k.as_str());
        }
        let original = Verdict::Applied;
        for d in [
            Decision::Applied,
            Decision::Stale,
            Decision::Equal,
            Decision::Conflict(ConflictKind::EventVariant),
            Decision::Held(HoldReason::Paused),
            Decision::Duplicate { original },
        ] {
            assert_eq!(KEYS[decision_slot(d)].value, d.as_str());
        }
        for r in [
            RejectReason::BodyTooLarge { size: 2, limit: 1 },
            RejectReason::TooDeep { limit: 1 },
            RejectReason::IdTooLong {
                field: "event_id",
                len: 2,
                limit: 1,
            },
            RejectReason::NulInId { field: "object_id" },
            RejectReason::StoreRefused { cause: "x".into() },
        ] {
            assert_eq!(KEYS[reject_slot(&r)].value, r.as_str());
        }
        let retries = [
            (RetryReason::HeldQueueFull { limit: 1 }, "held_queue_full"),
            (RetryReason::ParkingFull { limit: 1 }, "parking_full"),
            (RetryReason::ShuttingDown, "shutting_down"),
            (
                RetryReason::MemoryFull {
                    part: "waiting",
                    limit: 1,
                },
                "memory_full",
            ),
            (
                RetryReason::StoreFailed(crate::store::StoreError::Failed("x".into())),
                "store_failed",
            ),
        ];
        for (r, name) in retries {
            assert_eq!((KEYS[retry_slot(&r)].value, r.as_str()), (name, name));
        }
        let snapshot = DecisionCounters::new().snapshot();
        assert_eq!(snapshot.len(), COUNT, "readable keys are unique");
        assert!(snapshot.values().all(|&v| v == 0));
    }
}
