//! The loom implementation (`--cfg snapshot_receiver_loom`): every lock and
//! atomic is a point where loom can switch threads.

pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{PoisonError, TryLockError};

/// The guard of a locked [`Mutex`].
pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

/// A loom mutex whose `lock` returns the guard, as the std one does.
pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

impl<T> Mutex<T> {
    /// A mutex holding `value`.
    pub(crate) fn new(value: T) -> Self {
        Self(loom::sync::Mutex::new(value))
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

/// The std implementation's Bloom filter, as one loom mutex around the set
/// of the items' hashes: exact (no false positives), and every insert,
/// clear and question a point where loom can switch threads, which the
/// lock-free filter's atomics are not to loom.
pub(crate) struct Bloom {
    /// The hashes of the items in.
    hashes: Mutex<std::collections::HashSet<u64>>,
    /// What the hashes are keyed with.
    seed: u128,
}

impl Bloom {
    /// An empty filter hashing with `seed` (the size arguments are the
    /// std filter's; this one holds whatever it is given).
    pub(crate) fn new(_items: usize, _false_positives: f64, seed: u128) -> Self {
        Self {
            hashes: Mutex::new(std::collections::HashSet::new()),
            seed,
        }
    }

    /// Puts in `item`.
    pub(crate) fn insert(&self, item: &str) {
        let hash = self.hash(item);
        self.hashes.lock().insert(hash);
    }

    /// Empties the filter.
    pub(crate) fn clear(&self) {
        self.hashes.lock().clear();
    }

    /// `item`'s hash, the same in every filter of the same seed.
    pub(crate) fn hash(&self, item: &str) -> u64 {
        use std::hash::Hasher as _;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        h.write_u128(self.seed);
        h.write(item.as_bytes());
        h.finish()
    }

    /// Whether an item of this `hash` is in.
    pub(crate) fn contains_hash(&self, hash: u64) -> bool {
        self.hashes.lock().contains(&hash)
    }

    /// Its size in bytes (8 per hash held).
    pub(crate) fn bytes(&self) -> usize {
        self.hashes.lock().len() * 8
    }
}

/// The std implementation's map, as one loom mutex around a `HashMap`,
/// with the same contract (see `std.rs`).
pub(crate) struct ConcurrentMap<K, V> {
    /// One loom mutex: every access is a point where loom can switch threads.
    pub(super) inner: Mutex<HashMap<K, V>>,
}

impl<K: Eq + Hash, V> ConcurrentMap<K, V> {
    /// An empty map with room for `capacity` entries before it grows.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self {
            inner: Mutex::new(HashMap::with_capacity(capacity)),
        }
    }

    /// Runs `f` on the entry for `key`, if there is one; `None` if there is
    /// no entry.
    pub(crate) fn view<Q, R>(&self, key: &Q, f: impl FnOnce(&K, &V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let map = self.inner.lock();
        map.get_key_value(key).map(|(k, v)| f(k, v))
    }

    /// Runs `f` with exclusive access to the slot of `key`, as the std
    /// implementation does (under the lock, so two first inserts cannot
    /// both win).
    #[cfg(not(snapshot_receiver_loom_broken))]
    pub(crate) fn upsert_with<R>(
        &self,
        key: K,
        f: impl FnOnce(Option<(&K, &V)>) -> (Option<V>, R),
    ) -> R {
        let mut map = self.inner.lock();
        let (new, r) = f(map.get_key_value(&key));
        if let Some(v) = new {
            // `HashMap::insert` keeps a present key: remove it first.
            map.remove(&key);
            map.insert(key, v);
        }
        r
    }

    /// Keeps only the entries for which `keep` is true; returns how many
    /// were removed.
    pub(crate) fn retain(&self, mut keep: impl FnMut(&K, &mut V) -> bool) -> usize {
        let mut map = self.inner.lock();
        let before = map.len();
        map.retain(|k, v| keep(k, v));
        before - map.len()
    }

    /// Removes the entry for `key` if `pred` holds for it; returns whether
    /// an entry was removed.
    pub(crate) fn remove_if<Q>(&self, key: &Q, pred: impl FnOnce(&K, &V) -> bool) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let mut map = self.inner.lock();
        if map.get_key_value(key).is_some_and(|(k, v)| pred(k, v)) {
            map.remove(key);
            true
        } else {
            false
        }
    }

    /// The number of entries.
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().len()
    }
}
