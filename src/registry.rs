//! The shared event-identity registry: the first record of every event
//! identity, with its semantic fingerprint and its decision (SPEC §3.1, §5).

use crate::decision::Verdict;
use crate::sync::ConcurrentMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The default retention window for event identities: 24 hours (SPEC §5).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

/// The first record of one event identity. Never overwritten while it is
/// within the retention window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentityRecord {
    /// Semantic fingerprint of the first delivery's six envelope fields.
    pub fingerprint: u128,
    /// The object the first delivery named.
    pub object_id: Arc<str>,
    /// The decision the first delivery got; duplicates report it back.
    pub decision: Verdict,
    /// When the first delivery was recorded, on the receiver's clock.
    pub first_seen: SystemTime,
}

/// What the map holds per identity: an [`IdentityRecord`] with the time as
/// nanoseconds since the Unix epoch (8 bytes instead of a 16-byte
/// `SystemTime`), so that key + record fill a 64-byte slot instead of 80
/// (at 1 M identities the table is half empty, so every slot byte counts
/// about twice; see docs/BENCHMARKS.md).
#[derive(Clone, Debug)]
struct Stored {
    /// Semantic fingerprint of the first delivery.
    fingerprint: u128,
    /// The object the first delivery named (shared with the object's own
    /// id when the object is known, see `Shard::deliver`).
    object_id: Arc<str>,
    /// `first_seen` in nanoseconds since the Unix epoch (times before 1970
    /// are clamped to it; u64 nanoseconds reach the year 2554).
    first_seen_nanos: u64,
    /// The first delivery's decision.
    decision: Verdict,
}

fn to_nanos(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl Stored {
    fn record(&self) -> IdentityRecord {
        IdentityRecord {
            fingerprint: self.fingerprint,
            object_id: self.object_id.clone(),
            decision: self.decision,
            first_seen: UNIX_EPOCH + Duration::from_nanos(self.first_seen_nanos),
        }
    }
}

/// The outcome of [`Registry::claim`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// No record existed (or it had expired): this delivery is now the first
    /// record, with the verdict `decide` returned.
    First(Verdict),
    /// A record with the same fingerprint exists: a duplicate of this verdict.
    Same(Verdict),
    /// A record with a different fingerprint exists: this delivery is a
    /// variant; the first record (untouched) names `first_object`.
    Variant {
        /// The object named by the first record.
        first_object: Arc<str>,
    },
    /// `decide` declined to record anything (for example a full held queue):
    /// the registry is unchanged.
    NotRecorded,
}

/// Shared registry of event identities; `Send + Sync`, shared by every actor.
///
/// Under the normal build it is a sharded [`dashmap`] map; under
/// `--cfg snapshot_receiver_loom` a loom mutex around a `HashMap` with the same
/// contract (see `sync.rs`).
pub struct Registry {
    /// Event identity → first record. `Box<str>` keys: 16 bytes, no spare capacity.
    records: ConcurrentMap<Box<str>, Stored>,
    /// How long a record is trusted; after that it counts as absent.
    retention: Duration,
}

impl Registry {
    /// An empty registry that trusts records for `retention`.
    pub fn new(retention: Duration) -> Self {
        Self {
            records: ConcurrentMap::new(),
            retention,
        }
    }

    /// The retention window.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    fn expired(&self, record: &Stored, now: u64) -> bool {
        now.checked_sub(record.first_seen_nanos)
            .is_some_and(|age| Duration::from_nanos(age) >= self.retention)
    }

    /// The identity check of SPEC §3.1, atomic per event identity.
    ///
    /// If no record within retention exists, `decide` runs **while this
    /// identity is locked** (so it must be short and must not touch the
    /// registry); the verdict it returns becomes the first record, or `None`
    /// leaves the registry unchanged. Two racing first deliveries therefore
    /// cannot both become the first record.
    pub fn claim(
        &self,
        event_id: &str,
        fingerprint: u128,
        object_id: &Arc<str>,
        now: SystemTime,
        decide: impl FnOnce() -> Option<Verdict>,
    ) -> Claim {
        let now = to_nanos(now);
        self.records.upsert_with(event_id, |current| match current {
            Some(first) if !self.expired(first, now) => {
                if first.fingerprint == fingerprint {
                    (None, Claim::Same(first.decision))
                } else {
                    (
                        None,
                        Claim::Variant {
                            first_object: first.object_id.clone(),
                        },
                    )
                }
            }
            _ => match decide() {
                Some(decision) => (
                    Some(Stored {
                        fingerprint,
                        object_id: object_id.clone(),
                        first_seen_nanos: now,
                        decision,
                    }),
                    Claim::First(decision),
                ),
                None => (None, Claim::NotRecorded),
            },
        })
    }

    /// Removes the first record of `event_id` if it has `fingerprint`: used
    /// only to undo a step whose durable commit failed.
    pub(crate) fn remove_first(&self, event_id: &str, fingerprint: u128) {
        self.records
            .remove_if(event_id, |r| r.fingerprint == fingerprint);
    }

    /// Puts a stored receipt back (on restart, or after a conflict showed
    /// that another process recorded it first).
    pub(crate) fn restore(&self, receipt: crate::store::ReceiptRow) {
        self.records.insert(
            Box::from(&*receipt.event_id),
            Stored {
                fingerprint: receipt.fingerprint,
                object_id: receipt.object_id,
                decision: receipt.decision,
                first_seen_nanos: to_nanos(receipt.first_seen),
            },
        );
    }

    /// Removes the records whose age on `now` is at least the retention
    /// window; returns how many were removed.
    pub fn purge_expired(&self, now: SystemTime) -> usize {
        let now = to_nanos(now);
        self.records.retain(|_, r| !self.expired(r, now))
    }

    /// The record for `event_id`, expired or not (until purged).
    pub fn get(&self, event_id: &str) -> Option<IdentityRecord> {
        self.records.get_cloned(event_id).map(|r| r.record())
    }

    /// The number of records held, expired ones included until purged.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(all(test, not(snapshot_receiver_loom)))]
mod tests {
    use super::*;
    use crate::decision::HoldReason;

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn first_record_wins_and_is_never_overwritten() {
        let reg = Registry::new(Duration::from_secs(100));
        let a: Arc<str> = "card-7".into();
        let b: Arc<str> = "card-8".into();
        assert_eq!(
            reg.claim("e-1", 1, &a, t(0), || Some(Verdict::Applied)),
            Claim::First(Verdict::Applied)
        );
        assert_eq!(
            reg.claim("e-1", 1, &a, t(1), || unreachable!()),
            Claim::Same(Verdict::Applied)
        );
        assert_eq!(
            reg.claim("e-1", 2, &b, t(2), || unreachable!()),
            Claim::Variant {
                first_object: a.clone()
            }
        );
        let rec = reg.get("e-1").unwrap();
        assert_eq!((rec.fingerprint, rec.first_seen), (1, t(0)));
        assert_eq!(rec.object_id, a);
    }

    #[test]
    fn a_stored_record_fills_a_64_byte_slot() {
        // Key and record share one hash-table slot; see `Stored`.
        assert_eq!(std::mem::size_of::<(Box<str>, Stored)>(), 64);
    }

    #[test]
    fn declined_decision_records_nothing() {
        let reg = Registry::new(Duration::from_secs(100));
        let a: Arc<str> = "card-7".into();
        assert_eq!(reg.claim("e-1", 1, &a, t(0), || None), Claim::NotRecorded);
        assert!(reg.is_empty());
    }

    #[test]
    fn retention_expires_and_purges() {
        let reg = Registry::new(Duration::from_secs(100));
        let a: Arc<str> = "card-7".into();
        reg.claim("e-1", 1, &a, t(0), || {
            Some(Verdict::Held(HoldReason::Paused))
        });
        reg.claim("e-2", 1, &a, t(50), || Some(Verdict::Stale));
        assert_eq!(reg.purge_expired(t(99)), 0);
        // At exactly the window's end the record is no longer trusted.
        assert_eq!(
            reg.claim("e-1", 9, &a, t(100), || Some(Verdict::Equal)),
            Claim::First(Verdict::Equal)
        );
        assert_eq!(reg.purge_expired(t(150)), 1);
        assert_eq!(reg.len(), 1);
        assert!(reg.get("e-2").is_none());
    }
}
