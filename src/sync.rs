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
/// cannot both win.
pub(crate) struct ConcurrentMap<K, V> {
    #[cfg(not(snapshot_receiver_loom))]
    /// Sharded locks: writers of different keys rarely contend.
    inner: dashmap::DashMap<K, V, ahash::RandomState>,
    #[cfg(snapshot_receiver_loom)]
    /// One loom mutex: every access is a point where loom can switch threads.
    inner: loom::sync::Mutex<std::collections::HashMap<K, V>>,
}

impl<K: Eq + Hash, V> ConcurrentMap<K, V> {
    /// An empty map.
    pub(crate) fn new() -> Self {
        Self {
            #[cfg(not(snapshot_receiver_loom))]
            inner: dashmap::DashMap::with_hasher(ahash::RandomState::new()),
            #[cfg(snapshot_receiver_loom)]
            inner: loom::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// Runs `f` with exclusive access to the slot for `key`. `f` gets the
    /// current value, if any, and returns `(new value, result)`: `Some` stores
    /// (inserting or replacing), `None` leaves the slot as it was.
    ///
    /// `f` must be short and must not touch this map (it runs under its lock).
    #[cfg(not(snapshot_receiver_loom_broken))]
    pub(crate) fn upsert_with<Q, R>(
        &self,
        key: &Q,
        f: impl FnOnce(Option<&V>) -> (Option<V>, R),
    ) -> R
    where
        K: Borrow<Q> + for<'a> From<&'a Q>,
        Q: Hash + Eq + ?Sized,
    {
        #[cfg(not(snapshot_receiver_loom))]
        {
            match self.inner.entry(K::from(key)) {
                dashmap::Entry::Occupied(mut o) => {
                    let (new, r) = f(Some(o.get()));
                    if let Some(v) = new {
                        o.insert(v);
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
            let (new, r) = f(map.get(key));
            if let Some(v) = new {
                map.insert(K::from(key), v);
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
    pub(crate) fn upsert_with<Q, R>(
        &self,
        key: &Q,
        f: impl FnOnce(Option<&V>) -> (Option<V>, R),
    ) -> R
    where
        K: Borrow<Q> + for<'a> From<&'a Q>,
        Q: Hash + Eq + ?Sized,
        V: Clone,
    {
        let seen = self.inner.lock().unwrap().get(key).cloned();
        let (new, r) = f(seen.as_ref());
        if let Some(v) = new {
            self.inner.lock().unwrap().insert(K::from(key), v);
        }
        r
    }

    /// A copy of the value stored for `key`.
    pub(crate) fn get_cloned<Q>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
        V: Clone,
    {
        #[cfg(not(snapshot_receiver_loom))]
        {
            self.inner.get(key).map(|v| v.clone())
        }
        #[cfg(snapshot_receiver_loom)]
        {
            self.inner.lock().unwrap().get(key).cloned()
        }
    }

    /// Keeps only the entries for which `keep` is true; returns how many were removed.
    pub(crate) fn retain(&self, mut keep: impl FnMut(&K, &V) -> bool) -> usize {
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

    /// Stores `value` under `key`, replacing what was there.
    pub(crate) fn insert(&self, key: K, value: V) {
        #[cfg(not(snapshot_receiver_loom))]
        {
            self.inner.insert(key, value);
        }
        #[cfg(snapshot_receiver_loom)]
        {
            self.inner.lock().unwrap().insert(key, value);
        }
    }

    /// Removes the entry for `key` if `pred` holds for its value.
    pub(crate) fn remove_if<Q>(&self, key: &Q, pred: impl FnOnce(&V) -> bool)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        #[cfg(not(snapshot_receiver_loom))]
        {
            self.inner.remove_if(key, |_, v| pred(v));
        }
        #[cfg(snapshot_receiver_loom)]
        {
            let mut map = self.inner.lock().unwrap();
            if map.get(key).is_some_and(pred) {
                map.remove(key);
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
}
