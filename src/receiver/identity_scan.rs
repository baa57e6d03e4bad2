//! The start-up scan of the filter of stored identities
//! ([`crate::core::IdentityFilter`]): a thread of its own pages through the
//! receipts the store holds within retention, on a connection of its own,
//! and puts each in the filter; then marks it ready. Until then the filter
//! answers "maybe" for every identity, so deliveries never wait for the
//! scan: they read their receipts, as without a filter. A read that fails
//! is tried again after a pause that doubles up to 30 s; the scan ends
//! early once the receiver is gone.

use crate::core::{Clock, IdentityFilter};
use crate::store::ObjectSource;
use std::sync::{Arc, Weak};
use std::time::{Duration, UNIX_EPOCH};

/// Identities read per page.
const PAGE: usize = 10_000;

/// The first pause after a failed read; it doubles up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(100);

/// The longest pause between tries.
const MAX_PAUSE: Duration = Duration::from_secs(30);

/// Starts the scan of `source` into `filter` on a thread of its own: the
/// receipts first seen within `retention` of the clock's time now.
///
/// # Errors
/// The operating system's error when the thread cannot be started.
pub(super) fn start(
    mut source: Box<dyn ObjectSource>,
    filter: &Arc<IdentityFilter>,
    clock: Arc<dyn Clock>,
    retention: Duration,
) -> std::io::Result<()> {
    let filter = Arc::downgrade(filter);
    std::thread::Builder::new()
        .name("identity-scan".to_owned())
        .spawn(move || scan(&mut *source, &filter, &*clock, retention))
        .map(drop)
}

/// The scan itself (module docs).
fn scan(
    source: &mut dyn ObjectSource,
    filter: &Weak<IdentityFilter>,
    clock: &dyn Clock,
    retention: Duration,
) {
    let started = std::time::Instant::now();
    let since = clock.now().checked_sub(retention).unwrap_or(UNIX_EPOCH);
    let mut after: Arc<str> = Arc::from("");
    let mut pause = FIRST_PAUSE;
    let mut scanned: u64 = 0;
    loop {
        let Some(filter) = filter.upgrade() else {
            return;
        };
        match filter.scan_page(source, &after, since, PAGE, clock.now()) {
            Ok((read, next)) => {
                pause = FIRST_PAUSE;
                scanned += read as u64;
                match next {
                    Some(next) => after = next,
                    None => {
                        tracing::info!(
                            receipts = scanned,
                            elapsed = ?started.elapsed(),
                            "identity filter built from the store"
                        );
                        return;
                    }
                }
            }
            Err(e) => {
                drop(filter);
                tracing::warn!(
                    error = %e,
                    retry_in = ?pause,
                    "cannot read the stored receipts for the identity filter; \
                     new identities read their receipts until it is built"
                );
                std::thread::sleep(pause);
                pause = (pause * 2).min(MAX_PAUSE);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::ManualClock;
    use crate::store::{ObjectRow, ReceiptRow, StoreError};
    use std::time::{Instant, SystemTime};

    /// A store whose first `failures` reads of receipt identities fail,
    /// and which then holds `PAGE + 1` receipts, `e-00000` to `e-10000`;
    /// it records each read's `after`, `since` and `limit`, and when.
    struct Receipts {
        failures: usize,
        first_seen: SystemTime,
        reads: Vec<(String, SystemTime, usize, Instant)>,
    }

    impl ObjectSource for Receipts {
        fn objects(&mut self, _: &[Arc<str>]) -> Result<Vec<ObjectRow>, StoreError> {
            Ok(Vec::new())
        }
        fn receipts(
            &mut self,
            _: &[Arc<str>],
            _: SystemTime,
        ) -> Result<Vec<ReceiptRow>, StoreError> {
            Ok(Vec::new())
        }
        fn receipt_ids(
            &mut self,
            after: &str,
            since: SystemTime,
            limit: usize,
        ) -> Result<Vec<(Arc<str>, SystemTime)>, StoreError> {
            self.reads
                .push((after.to_owned(), since, limit, Instant::now()));
            if self.failures > 0 {
                self.failures -= 1;
                return Err(StoreError::Failed("the store is away".to_owned()));
            }
            Ok((0..=PAGE)
                .map(|n| format!("e-{n:05}"))
                .filter(|id| id.as_str() > after)
                .take(limit)
                .map(|id| (Arc::from(id), self.first_seen))
                .collect())
        }
    }

    /// A failed read is tried again, after pauses of 100, 200 and 400 ms
    /// (the pause doubles), and the scan then pages on: a full page of
    /// 10,000 identities asks for the page after its last one, a shorter
    /// page ends the scan with the filter ready. A receiver whose first
    /// reads fail still gets a filter that can answer "certainly not".
    #[test]
    fn a_failed_read_is_tried_again_after_a_doubling_pause_and_every_page_is_read() {
        const DAY: Duration = Duration::from_secs(24 * 3600);
        let now = UNIX_EPOCH + 10 * DAY;
        let filter = Arc::new(IdentityFilter::new(20_000, DAY, 7));
        let mut source = Receipts {
            failures: 3,
            first_seen: now - Duration::from_secs(60),
            reads: Vec::new(),
        };
        scan(
            &mut source,
            &Arc::downgrade(&filter),
            &ManualClock::new(now),
            DAY,
        );
        let stats = filter.stats();
        assert_eq!((stats.ready, stats.inserted), (true, PAGE as u64 + 1));
        assert!(filter.may_contain("e-10000", now), "on the second page");
        assert!(!filter.may_contain("e-10001", now));
        let since = now - DAY;
        let reads: Vec<(&str, SystemTime, usize)> = source
            .reads
            .iter()
            .map(|(after, since, limit, _)| (after.as_str(), *since, *limit))
            .collect();
        assert_eq!(
            reads,
            [
                ("", since, PAGE),
                ("", since, PAGE),
                ("", since, PAGE),
                ("", since, PAGE),
                ("e-09999", since, PAGE),
            ]
        );
        // Lower bounds only: a sleep is never shorter than asked.
        let pauses: Vec<Duration> = source
            .reads
            .windows(2)
            .take(3)
            .map(|w| w[1].3 - w[0].3)
            .collect();
        for (pause, least) in pauses.iter().zip([100, 200, 400]) {
            assert!(
                *pause >= Duration::from_millis(least),
                "pauses {pauses:?}: one under {least} ms"
            );
        }
    }
}
