//! The bounded in-memory lists of a shard: its part of the audit trail and
//! its replacements (history and outbox). Each keeps the most recent records
//! up to its share of [`crate::Config::trail_capacity`] and evicts the
//! oldest first; the durable store keeps everything. A reader asking for
//! records that were evicted gets a [`TrailGap`], never a silent hole.

use super::budget::TRAIL_OVERHEAD;
use crate::audit::{AuditEntry, AuditRecord};
use crate::engine::EffectRecord;

/// Records asked for were evicted from memory: the in-memory trail keeps
/// only the most recent [`crate::Config::trail_capacity`] records (the
/// durable store keeps all of them; read them there, for example with the
/// receiver's `stored_effects_since`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "records after sequence number {after} were asked for, but those up to {evicted_through} \
     were evicted from memory (trail_capacity); the durable store keeps them"
)]
pub struct TrailGap {
    /// The sequence number the reader asked to read after.
    pub after: u64,
    /// Every record with a sequence number up to this one may have been
    /// evicted; records above it are all still in memory. Asking again
    /// with `after` at or above it succeeds.
    pub evicted_through: u64,
}

/// A record with a receiver-wide sequence number and the bytes it keeps
/// in memory ([`crate::MemoryBudget::trail`]).
pub(crate) trait Sequenced {
    fn seq(&self) -> u64;
    fn bytes(&self) -> usize;
}

impl Sequenced for AuditRecord {
    fn seq(&self) -> u64 {
        self.seq
    }
    fn bytes(&self) -> usize {
        let text = match &self.entry {
            AuditEntry::Delivery { body, .. } => body.len(),
            AuditEntry::Malformed { bytes, error } => bytes.len() + error.len(),
            _ => 0,
        };
        TRAIL_OVERHEAD + text
    }
}

impl Sequenced for EffectRecord {
    fn seq(&self) -> u64 {
        self.seq
    }
    fn bytes(&self) -> usize {
        TRAIL_OVERHEAD + self.state.text_len() + self.trace.as_ref().map_or(0, |t| t.bytes())
    }
}

/// An append-only list that keeps its most recent `capacity` records.
///
/// Eviction is amortised: the list may hold up to a quarter more than its
/// capacity before the oldest are dropped in one move, but readers only
/// ever see the most recent `capacity` ([`Trail::kept`]).
#[derive(Debug)]
pub(crate) struct Trail<T> {
    /// The records, oldest first (the visible ones are the last `capacity`).
    items: Vec<T>,
    /// How many records were dropped from the front so far; with
    /// `items.len()` it numbers every record ever appended, which is what a
    /// rollback truncates to.
    dropped: u64,
    /// The highest sequence number dropped so far (0: none).
    dropped_through: u64,
    /// The visible bound, given by the caller on every append (a shard
    /// learns its share of the configuration only when it steps).
    capacity: usize,
    /// What `items` keep in memory, in bytes ([`Sequenced::bytes`]).
    bytes: usize,
}

impl<T> Default for Trail<T> {
    fn default() -> Self {
        Self {
            items: Vec::new(),
            dropped: 0,
            dropped_through: 0,
            capacity: usize::MAX,
            bytes: 0,
        }
    }
}

impl<T: Sequenced> Trail<T> {
    /// Appends `item`, keeping at most `capacity` visible and at most
    /// `max_bytes` in memory (the newest record always stays).
    pub(crate) fn push(&mut self, item: T, capacity: usize, max_bytes: usize) {
        self.capacity = capacity;
        if capacity == 0 {
            self.dropped += 1;
            self.dropped_through = self.dropped_through.max(item.seq());
            return;
        }
        self.bytes += item.bytes();
        self.items.push(item);
        let slack = capacity / 4 + 1;
        let mut n = 0;
        if self.items.len() >= capacity.saturating_add(slack) {
            n = self.items.len() - capacity;
        }
        if self.bytes > max_bytes {
            // Oldest first, until the rest fits.
            let mut left = self.bytes;
            let mut over = 0;
            for item in &self.items[..self.items.len() - 1] {
                if left <= max_bytes {
                    break;
                }
                left -= item.bytes();
                over += 1;
            }
            n = n.max(over);
        }
        if n > 0 {
            self.drop_front(n);
        }
    }

    /// Drops the `n` oldest records.
    fn drop_front(&mut self, n: usize) {
        let through = self.items[..n].iter().map(Sequenced::seq).max();
        self.dropped_through = self.dropped_through.max(through.unwrap_or(0));
        for item in self.items.drain(..n) {
            self.bytes -= item.bytes();
        }
        self.dropped += n as u64;
    }

    /// What the records in memory keep, in bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The records a reader sees: the most recent `capacity`, oldest first.
    pub(crate) fn kept(&self) -> &[T] {
        &self.items[self.items.len().saturating_sub(self.capacity)..]
    }

    /// The highest sequence number no longer visible (0: none evicted).
    pub(crate) fn evicted_through(&self) -> u64 {
        let hidden = self.items.len().saturating_sub(self.capacity);
        self.items[..hidden]
            .iter()
            .map(Sequenced::seq)
            .fold(self.dropped_through, u64::max)
    }

    /// Every record appended so far, evicted ones included: the mark a
    /// rollback returns to with [`Trail::truncate_total`].
    pub(crate) fn total(&self) -> u64 {
        self.dropped + self.items.len() as u64
    }

    /// Forgets the records appended after `total()` was `total` (a rolled
    /// back step). Records the step's appends evicted stay evicted.
    pub(crate) fn truncate_total(&mut self, total: u64) {
        if total <= self.dropped {
            self.items.clear();
            self.bytes = 0;
            self.dropped = total;
        } else {
            for item in self.items.drain((total - self.dropped) as usize..) {
                self.bytes -= item.bytes();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct R(u64);
    impl Sequenced for R {
        fn seq(&self) -> u64 {
            self.0
        }
        fn bytes(&self) -> usize {
            self.0 as usize
        }
    }

    fn seqs(t: &Trail<R>) -> Vec<u64> {
        t.kept().iter().map(|r| r.0).collect()
    }

    #[test]
    fn keeps_the_most_recent_capacity_and_evicts_oldest_first() {
        let mut t = Trail::default();
        for s in 1..=100 {
            t.push(R(s), 8, usize::MAX);
            assert!(t.kept().len() <= 8);
            assert!(t.items.len() < 8 + 8 / 4 + 1, "memory stays bounded");
        }
        assert_eq!(seqs(&t), (93..=100).collect::<Vec<_>>());
        assert_eq!(t.evicted_through(), 92);
        assert_eq!(t.total(), 100);
    }

    #[test]
    fn nothing_evicted_below_capacity() {
        let mut t = Trail::default();
        for s in 1..=5 {
            t.push(R(s), 8, usize::MAX);
        }
        assert_eq!(seqs(&t), vec![1, 2, 3, 4, 5]);
        assert_eq!(t.evicted_through(), 0);
    }

    #[test]
    fn a_rollback_removes_the_steps_records_even_across_an_eviction() {
        let mut t = Trail::default();
        for s in 1..=9 {
            t.push(R(s), 8, usize::MAX);
        }
        let mark = t.total();
        for s in 10..=12 {
            t.push(R(s), 8, usize::MAX);
        }
        t.truncate_total(mark);
        assert_eq!(t.total(), 9);
        assert!(seqs(&t).iter().all(|&s| s <= 9), "{:?}", seqs(&t));
        assert_eq!(*seqs(&t).last().unwrap(), 9);
    }

    #[test]
    fn bytes_evict_the_oldest_until_the_rest_fits_and_a_rollback_gives_them_back() {
        let mut t = Trail::default();
        // Record `s` keeps `s` bytes: 1..=5 keep 15 bytes, within 20.
        for s in 1..=5 {
            t.push(R(s), 100, 20);
        }
        assert_eq!(seqs(&t), vec![1, 2, 3, 4, 5]);
        assert_eq!(t.bytes(), 15);
        // 6 makes 21: 1 goes (20 left).
        t.push(R(6), 100, 20);
        assert_eq!(seqs(&t), vec![2, 3, 4, 5, 6]);
        assert_eq!(t.bytes(), 20);
        assert_eq!(t.evicted_through(), 1);
        // 7 makes 27: 2, 3 go (22 left, still over), then 4 (18 left).
        t.push(R(7), 100, 20);
        assert_eq!(seqs(&t), vec![5, 6, 7]);
        assert_eq!(t.bytes(), 18);
        let mark = t.total();
        t.push(R(8), 100, 100);
        assert_eq!(t.bytes(), 26);
        t.truncate_total(mark);
        assert_eq!(t.bytes(), 18);
        // A record larger than the bound alone stays (the newest always does).
        t.push(R(50), 100, 20);
        assert_eq!(seqs(&t), vec![50]);
        assert_eq!(t.bytes(), 50);
    }

    #[test]
    fn capacity_zero_keeps_nothing_but_knows_what_it_dropped() {
        let mut t = Trail::default();
        t.push(R(4), 0, usize::MAX);
        assert!(t.kept().is_empty());
        assert_eq!(t.evicted_through(), 4);
        assert_eq!(t.total(), 1);
    }
}
