//! The shipped implementation: std atomics and mutex, dashmap.

use std::borrow::Borrow;
use std::hash::Hash;
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{PoisonError, TryLockError};

/// The guard of a locked [`Mutex`].
pub(crate) type MutexGuard<'a, T> = std::sync::MutexGuard<'a, T>;

/// A std mutex whose `lock` returns the guard: a panic while it was held (in
/// a caller's code, after the shard's step left it whole) does not poison it
/// for the next holder.
pub(crate) struct Mutex<T>(std::sync::Mutex<T>);

impl<T> Mutex<T> {
    /// A mutex holding `value`.
    pub(crate) fn new(value: T) -> Self {
        Self(std::sync::Mutex::new(value))
    }

    /// Waits for the lock.
    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lock if nobody holds it, `None` otherwise.
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        match self.0.try_lock() {
            Ok(guard) => Some(guard),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// The value, the mutex consumed.
    pub(crate) fn into_inner(self) -> T {
        self.0.into_inner().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A Bloom filter of strings that threads insert into and ask at once
/// without a lock (`fastbloom`'s atomic filter), for the registry's filter
/// of stored identities.
pub(crate) struct Bloom(fastbloom::AtomicBloomFilter);

impl Bloom {
    /// A filter sized for `items` strings at a `false_positives` rate,
    /// hashing with `seed`.
    pub(crate) fn new(items: usize, false_positives: f64, seed: u128) -> Self {
        Self(
            fastbloom::AtomicBloomFilter::with_false_pos(false_positives)
                .seed(&seed)
                .expected_items(items),
        )
    }

    /// Puts in `item`.
    pub(crate) fn insert(&self, item: &str) {
        self.0.insert(item);
    }

    /// Empties the filter.
    pub(crate) fn clear(&self) {
        self.0.clear();
    }

    /// `item`'s hash, the same in every filter of the same seed.
    pub(crate) fn hash(&self, item: &str) -> u64 {
        self.0.source_hash(item)
    }

    /// Whether an item of this `hash` may be in (never a false no).
    pub(crate) fn contains_hash(&self, hash: u64) -> bool {
        self.0.contains_hash(hash)
    }

    /// Its size in bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.0.num_bits() / 8
    }
}

/// A concurrent map whose [`ConcurrentMap::upsert_with`] runs a closure while
/// it holds exclusive access to one key, so that two racing first inserts
/// cannot both win, and whose [`ConcurrentMap::view`] reads under a shared
/// lock.
///
/// Keys may carry data of their own (the registry's keys hold the whole first
/// record): `upsert_with` takes an owned candidate key and, when it stores,
/// replaces a present entry's key as well as its value.
pub(crate) struct ConcurrentMap<K, V> {
    /// Sharded reader-writer locks: writers of different keys rarely contend,
    /// readers never block each other.
    inner: dashmap::DashMap<K, V, ahash::RandomState>,
}

impl<K: Eq + Hash, V> ConcurrentMap<K, V> {
    /// An empty map with room for `capacity` entries before it grows.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self {
            inner: dashmap::DashMap::with_capacity_and_hasher(capacity, ahash::RandomState::new()),
        }
    }

    /// Runs `f` on the entry for `key`, if there is one, under a shared lock
    /// (dashmap: the shard's read lock); `None` if there is no entry.
    ///
    /// `f` must be short and must not touch this map.
    pub(crate) fn view<Q, R>(&self, key: &Q, f: impl FnOnce(&K, &V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.inner.view(key, f)
    }

    /// Runs `f` with exclusive access to the slot of `key` (a candidate
    /// entry key). `f` gets the current entry, if any, and returns
    /// `(new value, result)`: `Some` stores `(key, value)`, inserting or
    /// replacing both the key and the value of the present entry; `None`
    /// leaves the slot as it was and drops `key`.
    ///
    /// `f` must be short and must not touch this map (it runs under its lock).
    pub(crate) fn upsert_with<R>(
        &self,
        key: K,
        f: impl FnOnce(Option<(&K, &V)>) -> (Option<V>, R),
    ) -> R {
        match self.inner.entry(key) {
            dashmap::Entry::Occupied(o) => {
                let (new, r) = f(Some((o.key(), o.get())));
                if let Some(v) = new {
                    // Puts the candidate key in the bucket; the old entry
                    // is dropped after the shard lock is released.
                    drop(o.replace_entry(v));
                }
                r
            }
            dashmap::Entry::Vacant(slot) => {
                let (new, r) = f(None);
                if let Some(v) = new {
                    slot.insert(v);
                }
                r
            }
        }
    }

    /// Keeps only the entries for which `keep` is true (it may change the
    /// value it keeps); returns how many were removed.
    pub(crate) fn retain(&self, mut keep: impl FnMut(&K, &mut V) -> bool) -> usize {
        let mut removed = 0;
        self.inner.retain(|k, v| {
            let kept = keep(k, v);
            removed += usize::from(!kept);
            kept
        });
        removed
    }

    /// Removes the entry for `key` if `pred` holds for it; returns whether
    /// an entry was removed.
    pub(crate) fn remove_if<Q>(&self, key: &Q, pred: impl FnOnce(&K, &V) -> bool) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.inner.remove_if(key, pred).is_some()
    }

    /// The number of entries.
    pub(crate) fn len(&self) -> usize {
        self.inner.len()
    }

    /// How many entries fit before the table grows (tests only).
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.inner.capacity()
    }
}
