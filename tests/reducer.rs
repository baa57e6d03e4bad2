//! Properties of the last-writer-wins batch reducer.

use proptest::prelude::*;
use snapshot_receiver::core::reducer::{apply_events, Event, Record};
use std::collections::{BTreeSet, HashMap};

/// Events over a few ids where one (id, version) always carries the same
/// data (as a versioned source guarantees); `None` data is a delete.
fn batch() -> impl Strategy<Value = Vec<Event<u8, String>>> {
    batch_below(12)
}

/// [`batch`] with versions below `versions`.
fn batch_below(versions: u64) -> impl Strategy<Value = Vec<Event<u8, String>>> {
    proptest::collection::vec((0u8..5, 0..versions), 0..40).prop_map(|raw| {
        raw.into_iter()
            .map(|(id, version)| Event {
                id,
                version,
                // The data is a function of (id, version); some versions delete.
                data: ((u64::from(id) + version) % 3 != 0).then(|| format!("{id}@{version}")),
            })
            .collect()
    })
}

fn state() -> impl Strategy<Value = HashMap<u8, Record<String>>> {
    proptest::collection::hash_map(0u8..5, 0u64..6, 0..5).prop_map(|m| {
        m.into_iter()
            .map(|(id, version)| {
                (
                    id,
                    Record {
                        version,
                        data: Some(format!("{id}@{version}")),
                    },
                )
            })
            .collect()
    })
}

/// The rule written the plainest way, per record id: the highest version
/// among the stored record and the batch wins; on a tie the stored record
/// stays (an equal version is a duplicate), else the first event of the batch
/// with that version gives the data (`None`: a tombstone).
fn model(
    state: &HashMap<u8, Record<String>>,
    batch: &[Event<u8, String>],
) -> HashMap<u8, Record<String>> {
    let ids: BTreeSet<u8> = state
        .keys()
        .copied()
        .chain(batch.iter().map(|e| e.id))
        .collect();
    ids.into_iter()
        .map(|id| {
            let stored = state.get(&id);
            let newest = batch
                .iter()
                .filter(|e| e.id == id && stored.is_none_or(|r| e.version > r.version))
                .fold(None::<&Event<u8, String>>, |best, e| match best {
                    Some(b) if b.version >= e.version => Some(b),
                    _ => Some(e),
                });
            let record = match newest {
                Some(e) => Record {
                    version: e.version,
                    data: e.data.clone(),
                },
                None => stored.cloned().expect("an id of the state or the batch"),
            };
            (id, record)
        })
        .collect()
}

proptest! {
    // Versions as low as the state's, so that ties with a stored record
    // (where a delete in the batch differs from the stored data) are common.
    #[test]
    fn the_result_is_the_models_record_by_record(s in state(), b in batch_below(6)) {
        prop_assert_eq!(apply_events(&s, &b), model(&s, &b));
    }

    #[test]
    fn applying_a_batch_twice_equals_applying_it_once(s in state(), b in batch()) {
        let once = apply_events(&s, &b);
        prop_assert_eq!(apply_events(&once, &b), once);
    }

    #[test]
    fn any_permutation_gives_the_same_result(s in state(), (b, shuffled) in batch().prop_flat_map(|b| (Just(b.clone()), Just(b).prop_shuffle()))) {
        prop_assert_eq!(apply_events(&s, &b), apply_events(&s, &shuffled));
    }

    #[test]
    fn each_record_ends_at_its_highest_version(s in state(), b in batch()) {
        let out = apply_events(&s, &b);
        for (id, record) in &out {
            let highest = b.iter().filter(|e| e.id == *id).map(|e| e.version)
                .chain(s.get(id).map(|r| r.version)).max().unwrap();
            prop_assert_eq!(record.version, highest);
        }
    }
}
