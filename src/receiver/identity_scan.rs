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
        let page = match source.receipt_ids(&after, since, PAGE) {
            Ok(page) => page,
            Err(e) => {
                if filter.strong_count() == 0 {
                    return;
                }
                tracing::warn!(
                    error = %e,
                    retry_in = ?pause,
                    "cannot read the stored receipts for the identity filter; \
                     new identities read their receipts until it is built"
                );
                std::thread::sleep(pause);
                pause = (pause * 2).min(MAX_PAUSE);
                continue;
            }
        };
        pause = FIRST_PAUSE;
        let Some(filter) = filter.upgrade() else {
            return;
        };
        let now = clock.now();
        for (event_id, first_seen) in &page {
            filter.insert(event_id, *first_seen, now);
        }
        scanned += page.len() as u64;
        match page.last() {
            Some((last, _)) if page.len() == PAGE => after = last.clone(),
            _ => {
                filter.mark_ready();
                tracing::info!(
                    receipts = scanned,
                    elapsed = ?started.elapsed(),
                    "identity filter built from the store"
                );
                return;
            }
        }
    }
}
