//! A pure, synchronous last-writer-wins reducer keyed by version: the batch
//! form of the rules for consumers that only need "newest version wins".
//!
//! Unlike the receiver it has no event identities, no pause and no
//! conflicts: equal versions are duplicates and are ignored (the receiver's
//! [`crate::EqualVersionPolicy::Ignore`]), and a delete is a tombstone that
//! keeps its version so that an older update cannot bring the record back.

use std::collections::HashMap;
use std::hash::Hash;

/// One stored record: its version (u64) and its data; `data: None` is a
/// tombstone (the record was deleted at `version`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record<T> {
    /// The version that wrote this record.
    pub version: u64,
    /// The data, or `None` for a tombstone.
    pub data: Option<T>,
}

/// One event of a batch: the record it writes, at which version, with what
/// data (`None` deletes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event<K, T> {
    /// The record's identity.
    pub id: K,
    /// The event's version (u64).
    pub version: u64,
    /// The new data, or `None` for a delete.
    pub data: Option<T>,
}

/// Applies `events` to `state` and returns the new state; `state` is not
/// modified. An event applies when its record is absent or its version is
/// greater than the stored one; anything else (older, or an equal version:
/// a duplicate) is ignored. Deletes are stored as tombstones.
///
/// Applying a batch twice gives the same result as applying it once, and any
/// order of a batch gives the same result (for each record the highest version
/// wins, provided one version always carries the same data). Cost: O(|state| +
/// |events|) expected — one copy of the state, one hash lookup per event.
///
/// ```
/// use snapshot_receiver_core::reducer::{apply_events, Event, Record};
/// use std::collections::HashMap;
///
/// let state: HashMap<&str, Record<&str>> = HashMap::new();
/// let batch = [
///     Event { id: "a", version: 2, data: Some("new") },
///     Event { id: "a", version: 1, data: Some("old") },
/// ];
/// let next = apply_events(&state, &batch);
/// assert_eq!(next["a"], Record { version: 2, data: Some("new") });
/// assert!(state.is_empty(), "the input is not modified");
/// ```
pub fn apply_events<K, T>(
    state: &HashMap<K, Record<T>>,
    events: &[Event<K, T>],
) -> HashMap<K, Record<T>>
where
    K: Eq + Hash + Clone,
    T: Clone,
{
    let mut out = state.clone();
    out.reserve(events.len().min(1 << 20));
    for e in events {
        match out.get_mut(&e.id) {
            Some(current) if e.version <= current.version => {}
            Some(current) => {
                current.version = e.version;
                current.data = e.data.clone();
            }
            None => {
                out.insert(
                    e.id.clone(),
                    Record {
                        version: e.version,
                        data: e.data.clone(),
                    },
                );
            }
        }
    }
    out
}

#[cfg(all(test, not(snapshot_receiver_loom)))]
mod tests {
    use super::*;

    fn ev(
        id: &'static str,
        version: u64,
        data: Option<&'static str>,
    ) -> Event<&'static str, &'static str> {
        Event { id, version, data }
    }

    #[test]
    fn each_record_keeps_its_highest_version_and_others_are_kept() {
        let rec = |version, data| Record { version, data };
        let state = HashMap::from([("a", rec(5, Some("a5"))), ("b", rec(1, Some("b1")))]);
        let next = apply_events(
            &state,
            &[
                ev("c", 2, Some("c2")),
                ev("a", 4, Some("a4")),
                ev("c", 1, Some("c1")),
                ev("d", 7, None),
                ev("c", 3, Some("c3")),
            ],
        );
        assert_eq!(
            next,
            HashMap::from([
                ("a", rec(5, Some("a5"))),
                ("b", rec(1, Some("b1"))),
                ("c", rec(3, Some("c3"))),
                ("d", rec(7, None)),
            ])
        );
        assert_eq!(apply_events(&next, &[]), next);
        assert!(apply_events::<&str, &str>(&HashMap::new(), &[]).is_empty());
    }

    #[test]
    fn a_late_update_after_a_delete_does_not_resurrect() {
        let state = HashMap::from([(
            "a",
            Record {
                version: 1,
                data: Some("v1"),
            },
        )]);
        let next = apply_events(&state, &[ev("a", 3, None), ev("a", 2, Some("late"))]);
        assert_eq!(
            next["a"],
            Record {
                version: 3,
                data: None
            }
        );
        // A higher version after the delete recreates it.
        let again = apply_events(&next, &[ev("a", 4, Some("back"))]);
        assert_eq!(
            again["a"],
            Record {
                version: 4,
                data: Some("back")
            }
        );
        // Equal versions are duplicates: the first one stays.
        let dup = apply_events(&again, &[ev("a", 4, Some("other"))]);
        assert_eq!(
            dup["a"],
            Record {
                version: 4,
                data: Some("back")
            }
        );
        assert_eq!(
            state["a"],
            Record {
                version: 1,
                data: Some("v1")
            }
        );
    }
}
