//! A durable receiver's start-up, without IO of its own: what the store is
//! asked for and in which order, how the shards are bounded, and what they
//! resume from. The receiver's builder runs it on its committer's thread
//! and the cluster simulation on its simulated store, so both start the
//! same way:
//! 1. the initial objects become seed rows ([`seed_rows`]), which the
//!    caller commits (a stored row of an earlier run wins over a seed);
//! 2. the store gives one object source per shard and one per start-up
//!    scan, and the rows that must stay in memory ([`resume_from`]);
//! 3. each shard is bounded with its share of the bounds, then the rows
//!    are put back ([`start_shards`]), so that whatever the resume puts
//!    back can leave memory again; the sources are handed back, one to
//!    each shard's driver (which reads what its shard asks for,
//!    [`crate::engine::Next::Fetch`]) and the scans'.

use super::{resume, Context, Shard};
use crate::store::{ObjectSource, Store, StoreError};
use crate::write::{Loaded, ObjectRow};
use std::time::SystemTime;

/// What a store gives a receiver to start from ([`resume_from`]).
pub struct Resumed {
    /// The rows: only those that must stay in memory when `sources` is
    /// `Some` (paused objects, objects holding events, the held rows, the
    /// variants within retention, the last sequence number); every row
    /// otherwise.
    pub loaded: Loaded,
    /// One per shard in shard order, then one per scan; `None` when the
    /// store cannot open another connection to itself (an in-memory or
    /// temporary SQLite database): every object was loaded.
    pub sources: Option<Vec<Box<dyn ObjectSource>>>,
}

impl std::fmt::Debug for Resumed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resumed")
            .field("objects", &self.loaded.objects.len())
            .field("sources", &self.sources.as_ref().map(Vec::len))
            .finish_non_exhaustive()
    }
}

/// The receiver-wide bounds of a durable receiver's memory; each shard
/// keeps its share, rounded up ([`usize::div_ceil`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Objects in memory ([`Shard::bound_objects`]).
    pub objects: usize,
    /// Committed first records in memory ([`Shard::bound_identities`]).
    pub identities: usize,
}

/// The seed rows of `rows` (initial objects made with
/// [`Shard::seed_row`]), in object order: two processes seeding one
/// database at once then take the row locks in the same order and cannot
/// deadlock. Of an id given twice, the last row is kept, as an in-memory
/// receiver keeps the last value.
pub fn seed_rows(mut rows: Vec<ObjectRow>) -> Vec<ObjectRow> {
    rows.reverse();
    // Stable: of equal ids the last given (now first) stays first.
    rows.sort_by(|a, b| a.object_id.cmp(&b.object_id));
    rows.dedup_by(|later, first| later.object_id == first.object_id);
    rows
}

/// Reads from `store` what a receiver resumes from, asking it for
/// `sources` object sources (one per shard, then one per start-up scan):
/// with them, only the rows that must stay in memory
/// ([`Store::load_resident`]); without them, every row ([`Store::load`]).
/// Receipts and variants first seen before `receipts_since` are left out
/// (docs/CONTRACT.md §5).
///
/// # Errors
/// The store's [`StoreError`].
pub fn resume_from(
    store: &mut dyn Store,
    receipts_since: SystemTime,
    sources: usize,
) -> Result<Resumed, StoreError> {
    let mut opened = Vec::with_capacity(sources);
    for _ in 0..sources {
        match store.object_source()? {
            Some(source) => opened.push(source),
            None => {
                return Ok(Resumed {
                    loaded: store.load(receipts_since)?,
                    sources: None,
                })
            }
        }
    }
    Ok(Resumed {
        loaded: store.load_resident(receipts_since)?,
        sources: Some(opened),
    })
}

/// The store's connections a started receiver keeps ([`start_shards`]).
#[derive(Default)]
pub struct Sources {
    /// One per shard, in shard order, for its driver to read what the
    /// shard asks for; empty when every object was loaded.
    pub shards: Vec<Box<dyn ObjectSource>>,
    /// The start-up scans', in order.
    pub scans: Vec<Box<dyn ObjectSource>>,
}

/// Starts `shards` from what the store gave: with sources, each shard is
/// bounded first (its share of `bounds`), then everything is put back
/// ([`resume`]). Returns the sources: the shards' (one each) and the
/// scans'; none when every object was loaded.
///
/// # Errors
/// As [`resume`]: a stored state that is not valid JSON.
pub fn start_shards(
    ctx: &Context,
    shards: &mut [Shard],
    resumed: Resumed,
    bounds: Bounds,
) -> Result<Sources, StoreError> {
    let mut kept = Sources::default();
    if let Some(sources) = resumed.sources {
        let n = shards.len().max(1);
        let (objects, identities) = (bounds.objects.div_ceil(n), bounds.identities.div_ceil(n));
        let mut sources = sources.into_iter();
        for (shard, source) in shards.iter_mut().zip(sources.by_ref()) {
            shard.bound_objects(objects);
            shard.bound_identities(identities);
            kept.shards.push(source);
        }
        kept.scans.extend(sources);
    }
    resume(ctx, shards, resumed.loaded)?;
    Ok(kept)
}

#[cfg(all(test, not(snapshot_receiver_loom)))]
mod tests {
    use super::*;

    fn row(id: &str, version: u64) -> ObjectRow {
        ObjectRow {
            object_id: id.into(),
            version,
            state: format!(r#"{{"v":{version}}}"#),
            paused: false,
        }
    }

    #[test]
    fn seed_rows_are_in_object_order_and_the_last_of_an_id_wins() {
        let rows = seed_rows(vec![row("b", 1), row("a", 1), row("b", 2), row("a", 3)]);
        let got: Vec<(String, u64)> = rows
            .iter()
            .map(|r| (r.object_id.to_string(), r.version))
            .collect();
        assert_eq!(got, [("a".to_owned(), 3), ("b".to_owned(), 2)]);
    }
}
