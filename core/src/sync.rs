//! Synchronisation facade: the only place that names `std::sync`, `dashmap` or
//! `loom`.
//!
//! Normally it re-exports std atomics and wraps a [`dashmap::DashMap`]. Built
//! with `RUSTFLAGS="--cfg snapshot_receiver_loom"` (a project-specific flag, so
//! tokio and other crates compile as usual), the same names come from `loom`,
//! and the identity map becomes a loom `Mutex<HashMap>` with the same
//! first-insert-wins contract, because dashmap's internal locks are invisible
//! to loom and would hide the interleavings the models must explore.
//!
//! Test-only: adding `--cfg snapshot_receiver_loom_broken` (with the loom flag)
//! replaces [`ConcurrentMap::upsert_with`] by a deliberately racy
//! check-then-insert, so that `loom-tests` can show its models catch a registry
//! that lets two first deliveries both win. Never build a shipped binary with it.

#[cfg(not(snapshot_receiver_loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};

#[cfg(snapshot_receiver_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};

use std::borrow::Borrow;
use std::hash::Hash;

#[cfg(all(snapshot_receiver_loom_broken, not(snapshot_receiver_loom)))]
compile_error!("`snapshot_receiver_loom_broken` (loom-tests only) needs `snapshot_receiver_loom`");

/// A concurrent map whose [`ConcurrentMap::upsert_with`] runs a closure while
/// it holds exclusive access to one key, so that two racing first inserts
/// cannot both win, and whose [`ConcurrentMap::view`] reads under a shared
/// lock.
///
/// Keys may carry data of their own (the registry's keys hold the whole first
/// record): `upsert_with` takes an owned candidate key and, when it stores,
/// replaces a present entry's key as well as its value.
pub(crate) struct ConcurrentMap<K, V> {
    #[cfg(not(snapshot_receiver_loom))]
    /// Sharded reader-writer locks: writers of different keys rarely contend,
    /// readers never block each other.
    inner: dashmap::DashMap<K, V, ahash::RandomState>,
    #[cfg(snapshot_receiver_loom)]
    /// One loom mutex: every access is a point where loom can switch threads.
    inner: loom::sync::Mutex<std::collections::HashMap<K, V>>,
}

impl<K: Eq + Hash, V> ConcurrentMap<K, V> {
    /// An empty map with room for `capacity` entries before it grows.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self {
            #[cfg(not(snapshot_receiver_loom))]
            inner: dashmap::DashMap::with_capacity_and_hasher(capacity, ahash::RandomState::new()),
            #[cfg(snapshot_receiver_loom)]
            inner: loom::sync::Mutex::new(std::collections::HashMap::with_capacity(capacity)),
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
        #[cfg(not(snapshot_receiver_loom))]
        {
            self.inner.view(key, f)
        }
        #[cfg(snapshot_receiver_loom)]
        {
            let map = self.inner.lock().unwrap();
            map.get_key_value(key).map(|(k, v)| f(k, v))
        }
    }

    /// Runs `f` with exclusive access to the slot of `key` (a candidate
    /// entry key). `f` gets the current entry, if any, and returns
    /// `(new value, result)`: `Some` stores `(key, value)`, inserting or
    /// replacing both the key and the value of the present entry; `None`
    /// leaves the slot as it was and drops `key`.
    ///
    /// `f` must be short and must not touch this map (it runs under its lock).
    #[cfg(not(snapshot_receiver_loom_broken))]
    pub(crate) fn upsert_with<R>(
        &self,
        key: K,
        f: impl FnOnce(Option<(&K, &V)>) -> (Option<V>, R),
    ) -> R {
        #[cfg(not(snapshot_receiver_loom))]
        {
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
        #[cfg(snapshot_receiver_loom)]
        {
            let mut map = self.inner.lock().unwrap();
            let (new, r) = f(map.get_key_value(&key));
            if let Some(v) = new {
                // `HashMap::insert` keeps a present key: remove it first.
                map.remove(&key);
                map.insert(key, v);
            }
            r
        }
    }

    /// TEST-ONLY BROKEN VARIANT (`--cfg snapshot_receiver_loom_broken`): a
    /// check-then-insert. It reads the slot under the lock, releases it, runs
    /// `f` on that copy, then locks again and inserts, overwriting whatever
    /// another thread stored in between. Two racing first inserts can both win;
    /// the loom models must catch that.
    #[cfg(snapshot_receiver_loom_broken)]
    pub(crate) fn upsert_with<R>(
        &self,
        key: K,
        f: impl FnOnce(Option<(&K, &V)>) -> (Option<V>, R),
    ) -> R
    where
        K: Clone,
        V: Clone,
    {
        let seen = self
            .inner
            .lock()
            .unwrap()
            .get_key_value(&key)
            .map(|(k, v)| (k.clone(), v.clone()));
        let (new, r) = f(seen.as_ref().map(|(k, v)| (k, v)));
        if let Some(v) = new {
            let mut map = self.inner.lock().unwrap();
            map.remove(&key);
            map.insert(key, v);
        }
        r
    }

    /// Keeps only the entries for which `keep` is true (it may change the
    /// value it keeps); returns how many were removed.
    pub(crate) fn retain(&self, mut keep: impl FnMut(&K, &mut V) -> bool) -> usize {
        #[cfg(not(snapshot_receiver_loom))]
        {
            let mut removed = 0;
            self.inner.retain(|k, v| {
                let kept = keep(k, v);
                removed += usize::from(!kept);
                kept
            });
            removed
        }
        #[cfg(snapshot_receiver_loom)]
        {
            let mut map = self.inner.lock().unwrap();
            let before = map.len();
            map.retain(|k, v| keep(k, v));
            before - map.len()
        }
    }

    /// Removes the entry for `key` if `pred` holds for it; returns whether
    /// an entry was removed.
    pub(crate) fn remove_if<Q>(&self, key: &Q, pred: impl FnOnce(&K, &V) -> bool) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        #[cfg(not(snapshot_receiver_loom))]
        {
            self.inner.remove_if(key, pred).is_some()
        }
        #[cfg(snapshot_receiver_loom)]
        {
            let mut map = self.inner.lock().unwrap();
            if map.get_key_value(key).is_some_and(|(k, v)| pred(k, v)) {
                map.remove(key);
                true
            } else {
                false
            }
        }
    }

    /// The number of entries.
    pub(crate) fn len(&self) -> usize {
        #[cfg(not(snapshot_receiver_loom))]
        {
            self.inner.len()
        }
        #[cfg(snapshot_receiver_loom)]
        {
            self.inner.lock().unwrap().len()
        }
    }

    /// How many entries fit before the table grows (tests only).
    #[cfg(all(test, not(snapshot_receiver_loom)))]
    pub(crate) fn capacity(&self) -> usize {
        self.inner.capacity()
    }
}
