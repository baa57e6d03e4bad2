//! Retention of the audit trail and the replacement history
//! (docs/CONTRACT.md §9): their windows, the purge batch, and the purge of
//! a store used by one caller.

use super::{Records, Store, StoreError};
use std::time::{Duration, SystemTime};

/// How long audit rows are kept by default: 7 days.
pub const DEFAULT_AUDIT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// How long replacement-history (outbox) rows are kept by default: 7 days.
pub const DEFAULT_HISTORY_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// Most rows one purge transaction deletes: each batch is its own short
/// transaction, so deliveries wait at most one batch for the store.
pub const PURGE_BATCH_ROWS: usize = 1000;

/// The windows of the stored records besides the event identities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// Audit rows older than this are purged (default
    /// [`DEFAULT_AUDIT_RETENTION`]).
    pub audit: Duration,
    /// Replacement-history rows older than this are purged (default
    /// [`DEFAULT_HISTORY_RETENTION`]).
    pub history: Duration,
    /// Most rows deleted per purge transaction (default
    /// [`PURGE_BATCH_ROWS`], at least 1).
    pub batch: usize,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            audit: DEFAULT_AUDIT_RETENTION,
            history: DEFAULT_HISTORY_RETENTION,
            batch: PURGE_BATCH_ROWS,
        }
    }
}

impl Retention {
    /// The window of `records` (resolved held rows follow the audit's).
    pub fn window(&self, records: Records) -> Duration {
        match records {
            Records::Audit | Records::Resolved => self.audit,
            Records::History => self.history,
        }
    }

    /// Rows per purge transaction (at least 1).
    pub fn batch(&self) -> usize {
        self.batch.max(1)
    }

    /// What a purge at `now` removes: each kind of record ([`Records::ALL`]
    /// order) with the instant its rows must be older than; a window
    /// longer than the clock's past leaves its kind out.
    pub fn cutoffs(&self, now: SystemTime) -> impl Iterator<Item = (Records, SystemTime)> + '_ {
        Records::ALL
            .into_iter()
            .filter_map(move |records| Some((records, now.checked_sub(self.window(records))?)))
    }
}

/// Rows removed from a store by one purge, per kind of record.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Purged {
    /// Audit rows.
    pub audit: u64,
    /// Replacement-history rows.
    pub history: u64,
    /// Held rows already resolved by reconciliation.
    pub resolved: u64,
}

impl Purged {
    /// The count of `records`.
    pub fn get(&self, records: Records) -> u64 {
        match records {
            Records::Audit => self.audit,
            Records::History => self.history,
            Records::Resolved => self.resolved,
        }
    }

    /// Counts one batch of `records` that deleted `n` rows of at most
    /// `batch`; whether another batch of that kind may find more (this one
    /// was full).
    pub fn batch_done(&mut self, records: Records, n: u64, batch: usize) -> bool {
        self.add(records, n);
        n >= batch as u64
    }

    /// Adds `n` rows of `records`.
    pub fn add(&mut self, records: Records, n: u64) {
        match records {
            Records::Audit => self.audit += n,
            Records::History => self.history += n,
            Records::Resolved => self.resolved += n,
        }
    }
}

/// Deletes every row older than its window at `now` ([`Records::ALL`]),
/// `retention.batch` rows per transaction, until a batch of each kind
/// deletes fewer; returns how many rows of each kind were deleted. For a store used by one caller (the `purge`
/// command): a receiver sends each batch to its committer instead, so
/// that deliveries commit between batches.
///
/// # Errors
/// The store's error; the batches before it stay deleted.
pub fn purge_all(
    store: &mut dyn Store,
    now: SystemTime,
    retention: &Retention,
) -> Result<Purged, StoreError> {
    let batch = retention.batch();
    let mut purged = Purged::default();
    for (records, before) in retention.cutoffs(now) {
        while purged.batch_done(records, store.purge_records(records, before, batch)?, batch) {}
    }
    Ok(purged)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{AuditRow, EffectRow, Loaded, ObjectRow, ReceiptRow, VariantRow, Write};
    use std::sync::Arc;
    use std::time::UNIX_EPOCH;

    const DAY: Duration = Duration::from_secs(24 * 3600);

    /// A store holding `old` rows of each kind ([`Records::ALL`] order)
    /// older than any cutoff; it records each purge batch asked for.
    struct Old {
        old: [u64; 3],
        batches: Vec<(Records, SystemTime, usize)>,
    }

    impl Store for Old {
        fn commit(&mut self, _: &[Write]) -> Result<(), StoreError> {
            Ok(())
        }
        fn load(&mut self, _: SystemTime) -> Result<Loaded, StoreError> {
            Ok(Loaded::default())
        }
        fn refresh(
            &mut self,
            _: &[Arc<str>],
            _: &[Arc<str>],
        ) -> Result<(Vec<ObjectRow>, Vec<ReceiptRow>), StoreError> {
            Ok((Vec::new(), Vec::new()))
        }
        fn refresh_variants(&mut self, _: &[Arc<str>]) -> Result<Vec<VariantRow>, StoreError> {
            Ok(Vec::new())
        }
        fn purge_receipts(&mut self, _: SystemTime) -> Result<u64, StoreError> {
            Ok(0)
        }
        fn purge_records(
            &mut self,
            records: Records,
            before: SystemTime,
            limit: usize,
        ) -> Result<u64, StoreError> {
            self.batches.push((records, before, limit));
            let left = &mut self.old[Records::ALL.iter().position(|r| *r == records).unwrap()];
            let n = (*left).min(limit as u64);
            *left -= n;
            Ok(n)
        }
        fn audit(&mut self) -> Result<Vec<AuditRow>, StoreError> {
            Ok(Vec::new())
        }
        fn replacements_since(&mut self, _: u64) -> Result<Vec<EffectRow>, StoreError> {
            Ok(Vec::new())
        }
    }

    /// By default each kind is purged 7 days back, 1,000 rows a batch,
    /// until a batch deletes fewer; the counts come back per kind.
    #[test]
    fn a_purge_deletes_each_kind_past_its_window_in_batches_until_one_is_short() {
        let now = UNIX_EPOCH + 30 * DAY;
        let mut store = Old {
            old: [2_500, 0, 3],
            batches: Vec::new(),
        };
        let purged = purge_all(&mut store, now, &Retention::default()).unwrap();
        let week_ago = UNIX_EPOCH + 23 * DAY;
        assert_eq!(
            store.batches,
            [
                (Records::Audit, week_ago, 1_000),
                (Records::Audit, week_ago, 1_000),
                (Records::Audit, week_ago, 1_000),
                (Records::History, week_ago, 1_000),
                (Records::Resolved, week_ago, 1_000),
            ]
        );
        assert_eq!(
            purged,
            Purged {
                audit: 2_500,
                history: 0,
                resolved: 3
            }
        );
        let counts: Vec<u64> = Records::ALL.iter().map(|r| purged.get(*r)).collect();
        assert_eq!(counts, [2_500, 0, 3]);
    }

    /// Resolved held rows follow the audit window, a batch of 0 rows
    /// counts as 1, and a window the clock cannot reach back (beyond what
    /// `SystemTime` holds) leaves its kind out.
    #[test]
    fn resolved_rows_follow_the_audit_window_and_a_batch_is_at_least_one_row() {
        let now = UNIX_EPOCH + 10 * DAY;
        let retention = Retention {
            audit: DAY,
            history: Duration::MAX,
            batch: 0,
        };
        let mut store = Old {
            old: [1, 5, 2],
            batches: Vec::new(),
        };
        let purged = purge_all(&mut store, now, &retention).unwrap();
        let day_ago = UNIX_EPOCH + 9 * DAY;
        assert_eq!(
            store.batches,
            [
                (Records::Audit, day_ago, 1),
                (Records::Audit, day_ago, 1),
                (Records::Resolved, day_ago, 1),
                (Records::Resolved, day_ago, 1),
                (Records::Resolved, day_ago, 1),
            ]
        );
        assert_eq!(
            purged,
            Purged {
                audit: 1,
                history: 0,
                resolved: 2
            }
        );
    }
}
