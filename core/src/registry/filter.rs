//! A compact filter of the event identities a durable store may hold that
//! are not in memory (docs/CONTRACT.md §9): a shard asks it before it reads
//! a receipt back, so that a new event identity (the common case) costs no
//! read. A Bloom filter answers "maybe" or "certainly not"; only "certainly
//! not" spares the read, so a false positive costs a read and nothing else.
//!
//! What it holds: every identity this receiver evicted from memory (put in
//! before the eviction can be seen, [`super::Registry::evict`]) and every
//! receipt the store held when the receiver started, scanned in the
//! background ([`IdentityFilter::insert_stored`], then
//! [`IdentityFilter::mark_ready`]). Until that scan is done it answers
//! "maybe" for every identity. A receipt another process commits later is
//! in neither; the store's unique receipts catch it at commit, as they catch
//! any race between processes.
//!
//! Retention: identities expire after the registry's window `W`, and a Bloom
//! filter cannot forget one key. So the filter is two generations, each
//! holding the identities first seen in one slice of time `W` long (even
//! slices in one, odd in the other), each sized for the whole capacity. The
//! window `[now - W, now]` overlaps at most two slices, the current one and
//! the one before; a generation is cleared and reused for slice `n` when the
//! first identity of `n` arrives, and what it held (slice `n - 2`) ended
//! before `now - W`.

use super::to_nanos;
use crate::store::{ObjectSource, StoreError};
use crate::sync::{AtomicBool, AtomicU64, Bloom, Mutex, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// How many generations (time slices of one window each) the filter keeps.
const GENERATIONS: u64 = 2;

/// A generation's tag while it is being cleared for a new slice.
const CLEARING: u64 = u64::MAX;

/// The false-positive rate each generation is sized for at the capacity.
const FALSE_POSITIVES: f64 = 0.01;

/// One time slice's identities.
struct Generation {
    /// The slice number plus one; 0 while empty, [`CLEARING`] while cleared.
    tag: AtomicU64,
    bits: Bloom,
    /// Taken to move the generation to a new slice.
    turn: Mutex<()>,
}

/// What an [`IdentityFilter`] holds and did ([`super::Registry::filter`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FilterStats {
    /// Identities per retention window it is sized for at a 1 % false
    /// positive rate; beyond that it answers "maybe" more often.
    pub capacity: usize,
    /// Its memory, in bytes (all generations).
    pub bytes: usize,
    /// Whether the start-up scan of the store's receipts is done: before
    /// it, every identity counts as maybe stored.
    pub ready: bool,
    /// Identities put in (evicted ones and scanned receipts, repeats
    /// included).
    pub inserted: u64,
}

/// A filter of event identities the store may hold (module docs): shared by
/// every shard through the registry; `Send + Sync`, lock-free except when a
/// generation moves to a new slice.
pub struct IdentityFilter {
    /// The retention window, in nanoseconds (at least 1): also the length
    /// of one slice.
    window_ns: u64,
    generations: Vec<Generation>,
    capacity: usize,
    /// Set once the start-up scan is done.
    ready: AtomicBool,
    /// Set when an identity was first seen in a slice after the clock's (a
    /// clock moved back): its generation is the one of the slice before the
    /// clock's, still in the window, so from then on the filter answers
    /// "maybe" for all.
    untrusted: AtomicBool,
    inserted: AtomicU64,
}

impl IdentityFilter {
    /// A filter for `capacity` identities per retention `window` (the
    /// registry's), hashing with `seed` (the same seed gives the same
    /// answers: tests pin them; a receiver takes a random one).
    pub fn new(capacity: usize, window: Duration, seed: u128) -> Self {
        let window_ns = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX).max(1);
        let per_slice = capacity.max(1);
        let generations = (0..GENERATIONS)
            .map(|_| Generation {
                tag: AtomicU64::new(0),
                bits: Bloom::new(per_slice, FALSE_POSITIVES, seed),
                turn: Mutex::new(()),
            })
            .collect();
        Self {
            window_ns,
            generations,
            capacity,
            ready: AtomicBool::new(false),
            untrusted: AtomicBool::new(false),
            inserted: AtomicU64::new(0),
        }
    }

    /// Puts in `event_id`, first seen at `first_seen`, on a clock that
    /// reads `now`. An identity already past the window is left out.
    pub fn insert(&self, event_id: &str, first_seen: SystemTime, now: SystemTime) {
        let slice = to_nanos(first_seen) / self.window_ns;
        let current = to_nanos(now) / self.window_ns;
        if slice.saturating_add(1) < current {
            return;
        }
        if slice > current {
            self.untrusted.store(true, Ordering::SeqCst);
            return;
        }
        let tag = slice + 1;
        let generation = &self.generations[(slice % GENERATIONS) as usize];
        if generation.tag.load(Ordering::Acquire) != tag {
            let _turn = generation.turn.lock();
            let held = generation.tag.load(Ordering::Acquire);
            if held != tag {
                if held > tag {
                    // It holds a later slice: this one is long past.
                    return;
                }
                generation.tag.store(CLEARING, Ordering::Release);
                generation.bits.clear();
                generation.tag.store(tag, Ordering::Release);
            }
        }
        generation.bits.insert(event_id);
        self.inserted.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the store may hold a receipt of `event_id` first seen within
    /// the window at `now`: `false` only when it certainly holds none this
    /// filter was told of.
    pub fn may_contain(&self, event_id: &str, now: SystemTime) -> bool {
        if !self.ready.load(Ordering::Acquire) || self.untrusted.load(Ordering::Acquire) {
            return true;
        }
        let oldest = to_nanos(now).saturating_sub(self.window_ns) / self.window_ns + 1;
        let hash = self.generations[0].bits.hash(event_id);
        self.generations.iter().any(|g| {
            let tag = g.tag.load(Ordering::Acquire);
            tag != 0 && tag != CLEARING && tag >= oldest && g.bits.contains_hash(hash)
        })
    }

    /// One page of the start-up scan: reads from `source` at most `limit`
    /// stored identities after `after` (in event-id order) first seen at or
    /// after `since`, and puts each in, on a clock that reads `now`. Returns
    /// how many it read and where the next page starts; `None` once a page
    /// shorter than `limit` was read, the filter then marked ready. A
    /// caller pages from `""` until `None` (the receiver's scan thread and
    /// the cluster simulation both do).
    ///
    /// # Errors
    /// The store's [`StoreError`]: nothing was put in, and the same page
    /// is to be read again.
    pub fn scan_page(
        &self,
        source: &mut dyn ObjectSource,
        after: &str,
        since: SystemTime,
        limit: usize,
        now: SystemTime,
    ) -> Result<(usize, Option<Arc<str>>), StoreError> {
        let page = source.receipt_ids(after, since, limit)?;
        for (event_id, first_seen) in &page {
            self.insert(event_id, *first_seen, now);
        }
        match page.last() {
            Some((last, _)) if page.len() == limit => Ok((page.len(), Some(last.clone()))),
            _ => {
                self.mark_ready();
                Ok((page.len(), None))
            }
        }
    }

    /// Marks the start-up scan done: from now on "certainly not" answers
    /// are trusted.
    pub fn mark_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    /// What it holds and did.
    pub fn stats(&self) -> FilterStats {
        FilterStats {
            capacity: self.capacity,
            bytes: self.generations.iter().map(|g| g.bits.bytes()).sum(),
            ready: self.ready.load(Ordering::Acquire) && !self.untrusted.load(Ordering::Acquire),
            inserted: self.inserted.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A day, the window of these tests.
    const DAY: Duration = Duration::from_secs(24 * 3600);

    /// `hours` after the Unix epoch.
    fn at(hours: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(hours * 3600)
    }

    /// Stored identities `e-1` to `e-<stored>`, all first seen at 9 h, in
    /// event-id order as a store pages them; each read's `after`, `since`
    /// and `limit` kept; the first `failures` reads fail.
    struct Stored {
        ids: Vec<Arc<str>>,
        reads: Vec<(String, SystemTime, usize)>,
        failures: usize,
    }

    impl Stored {
        fn new(stored: usize, failures: usize) -> Self {
            let mut ids: Vec<Arc<str>> =
                (1..=stored).map(|n| Arc::from(format!("e-{n}"))).collect();
            ids.sort();
            Stored {
                ids,
                reads: Vec::new(),
                failures,
            }
        }
    }

    impl ObjectSource for Stored {
        fn objects(&mut self, _: &[Arc<str>]) -> Result<Vec<crate::write::ObjectRow>, StoreError> {
            Ok(Vec::new())
        }
        fn receipts(
            &mut self,
            _: &[Arc<str>],
            _: SystemTime,
        ) -> Result<Vec<crate::write::ReceiptRow>, StoreError> {
            Ok(Vec::new())
        }
        fn receipt_ids(
            &mut self,
            after: &str,
            since: SystemTime,
            limit: usize,
        ) -> Result<Vec<(Arc<str>, SystemTime)>, StoreError> {
            self.reads.push((after.to_owned(), since, limit));
            if self.failures > 0 {
                self.failures -= 1;
                return Err(StoreError::Failed("connection lost".to_owned()));
            }
            Ok(self
                .ids
                .iter()
                .filter(|id| ***id > *after)
                .take(limit)
                .map(|id| (id.clone(), at(9)))
                .collect())
        }
    }

    /// Pages the whole scan as the scan thread does; returns each page's
    /// count.
    fn scan(filter: &IdentityFilter, source: &mut Stored, limit: usize) -> Vec<usize> {
        let mut after: Arc<str> = Arc::from("");
        let mut pages = Vec::new();
        loop {
            match filter.scan_page(source, &after, at(1), limit, at(10)) {
                Ok((read, Some(next))) => {
                    assert!(!filter.stats().ready, "ready after a full page");
                    pages.push(read);
                    after = next;
                }
                Ok((read, None)) => {
                    pages.push(read);
                    return pages;
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    #[test]
    fn the_scan_reads_every_page_after_the_last_id_and_is_ready_after_a_short_one() {
        let filter = IdentityFilter::new(1_000, DAY, 7);
        let mut source = Stored::new(5, 0);
        assert_eq!(scan(&filter, &mut source, 2), [2, 2, 1]);
        let afters: Vec<&str> = source.reads.iter().map(|(a, ..)| a.as_str()).collect();
        assert_eq!(afters, ["", "e-2", "e-4"]);
        assert!(source
            .reads
            .iter()
            .all(|&(_, since, limit)| since == at(1) && limit == 2));
        assert!(filter.stats().ready);
        assert_eq!(filter.stats().inserted, 5);
        assert!((1..=5).all(|n| filter.may_contain(&format!("e-{n}"), at(10))));
        assert!(!filter.may_contain("e-6", at(10)));
        // A store holding an exact number of pages: an empty one ends it.
        let filter = IdentityFilter::new(1_000, DAY, 7);
        assert_eq!(scan(&filter, &mut Stored::new(4, 0), 2), [2, 2, 0]);
        assert!(filter.stats().ready);
    }

    #[test]
    fn a_failed_page_puts_nothing_in_and_leaves_the_filter_not_ready() {
        let filter = IdentityFilter::new(1_000, DAY, 7);
        let mut source = Stored::new(3, 1);
        assert_eq!(
            filter.scan_page(&mut source, "", at(1), 2, at(10)),
            Err(StoreError::Failed("connection lost".to_owned()))
        );
        assert_eq!((filter.stats().ready, filter.stats().inserted), (false, 0));
        // The same page is read again.
        assert_eq!(
            filter.scan_page(&mut source, "", at(1), 2, at(10)),
            Ok((2, Some(Arc::from("e-2"))))
        );
    }

    #[test]
    fn it_answers_maybe_for_everything_until_its_scan_is_done() {
        let filter = IdentityFilter::new(1_000, DAY, 7);
        assert!(filter.may_contain("e-1", at(10)));
        filter.mark_ready();
        assert!(!filter.may_contain("e-1", at(10)));
        filter.insert("e-1", at(9), at(10));
        assert!(filter.may_contain("e-1", at(10)));
        assert_eq!(
            filter.stats(),
            FilterStats {
                capacity: 1_000,
                // Two generations of 1,000 identities at 1 %: 2.4 bytes an
                // identity, as the builder's documentation says.
                bytes: 2_400,
                ready: true,
                inserted: 1
            }
        );
    }

    #[test]
    fn an_identity_leaves_once_its_slice_is_past_the_window_and_the_generation_is_reused() {
        // Window 24 h: slices of 24 h. e-1 first seen at 1 h (slice 0).
        let filter = IdentityFilter::new(1_000, DAY, 7);
        filter.mark_ready();
        filter.insert("e-1", at(1), at(1));
        // At 47 h the window begins at 23 h, inside slice 0.
        assert!(filter.may_contain("e-1", at(47)));
        // At 48 h it begins at 24 h: slice 0 is out.
        assert!(!filter.may_contain("e-1", at(48)));
        // Slice 1 (24 h) has the other generation; slice 2 (48 h) reuses
        // slice 0's, cleared first.
        filter.insert("e-2", at(30), at(30));
        filter.insert("e-3", at(48), at(48));
        assert!(filter.may_contain("e-2", at(48)));
        assert!(filter.may_contain("e-3", at(48)));
        assert!(!filter.may_contain("e-1", at(48)));
    }

    #[test]
    fn an_identity_of_the_slice_before_is_still_found_once_the_next_slice_began() {
        // e-1 first seen at 23 h (slice 0), e-2 at 25 h (slice 1): taking
        // slice 1 must not clear slice 0, which is still in the window (a
        // duplicate of e-1 across midnight is then no new identity).
        let filter = IdentityFilter::new(1_000, DAY, 7);
        filter.mark_ready();
        filter.insert("e-1", at(23), at(23));
        filter.insert("e-2", at(25), at(25));
        assert!(filter.may_contain("e-1", at(25)));
        assert!(filter.may_contain("e-2", at(25)));
        // An identity of slice 0 put in after slice 1 began (an eviction
        // at 26 h of a record first seen at 22 h) goes to slice 0's
        // generation, which keeps e-1.
        filter.insert("e-0", at(22), at(26));
        assert!(filter.may_contain("e-0", at(26)));
        assert!(filter.may_contain("e-1", at(26)));
        assert!(!filter.may_contain("e-3", at(26)));
        assert_eq!(filter.stats().inserted, 3);
    }

    #[test]
    fn a_late_insert_of_an_older_slice_never_clears_a_newer_one() {
        // Slice 2 (48 h) took generation 0; a clock that moved back puts
        // in an identity of slice 0 (the same generation): it is left out,
        // and slice 2's identities stay.
        let filter = IdentityFilter::new(1_000, DAY, 7);
        filter.mark_ready();
        filter.insert("new", at(48), at(48));
        filter.insert("old", at(1), at(24));
        assert!(filter.may_contain("new", at(48)));
        assert!(!filter.may_contain("old", at(48)));
        assert_eq!(filter.stats().inserted, 1);
    }

    #[test]
    fn an_identity_already_past_the_window_is_not_put_in() {
        let filter = IdentityFilter::new(1_000, DAY, 7);
        filter.mark_ready();
        filter.insert("old", at(1), at(48));
        assert_eq!(filter.stats().inserted, 0);
        assert!(!filter.may_contain("old", at(48)));
    }

    #[test]
    fn an_identity_ahead_of_the_clock_makes_every_answer_maybe() {
        let filter = IdentityFilter::new(1_000, DAY, 7);
        filter.mark_ready();
        filter.insert("ahead", at(25), at(1));
        assert!(filter.may_contain("never-seen", at(1)));
        assert!(!filter.stats().ready);
    }

    #[test]
    fn new_identities_are_mostly_spared_at_capacity() {
        // Capacity 1,000 per window: 1,000 first seen between 1 h and 11 h,
        // then 10,000 never put in, asked at 20 h. The generation is sized
        // for 1 % false positives, so about 1 % of the new ones read the
        // store; the seed fixes the count.
        let filter = IdentityFilter::new(1_000, DAY, 7);
        filter.mark_ready();
        for i in 0..1_000 {
            filter.insert(
                &format!("in-{i}"),
                at(1) + Duration::from_secs(i * 36),
                at(20),
            );
        }
        assert!((0..1_000).all(|i| filter.may_contain(&format!("in-{i}"), at(20))));
        let maybe = (0..10_000)
            .filter(|i| filter.may_contain(&format!("out-{i}"), at(20)))
            .count();
        assert_eq!(maybe, 81, "false positives of 10,000");
    }
}
