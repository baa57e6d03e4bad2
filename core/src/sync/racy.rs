//! TEST-ONLY BROKEN VARIANT (`--cfg snapshot_receiver_loom_broken`, with the
//! loom flag): the loom map's `upsert_with` as a check-then-insert, which the
//! loom models must catch.

use super::ConcurrentMap;
use std::hash::Hash;

impl<K: Eq + Hash + Clone, V: Clone> ConcurrentMap<K, V> {
    /// A check-then-insert: reads the slot under the lock, releases it, runs
    /// `f` on that copy, then locks again and inserts, overwriting whatever
    /// another thread stored in between. Two racing first inserts can both
    /// win; the loom models must catch that.
    pub(crate) fn upsert_with<R>(
        &self,
        key: K,
        f: impl FnOnce(Option<(&K, &V)>) -> (Option<V>, R),
    ) -> R {
        let seen = self
            .inner
            .lock()
            .get_key_value(&key)
            .map(|(k, v)| (k.clone(), v.clone()));
        let (new, r) = f(seen.as_ref().map(|(k, v)| (k, v)));
        if let Some(v) = new {
            let mut map = self.inner.lock();
            map.remove(&key);
            map.insert(key, v);
        }
        r
    }
}
