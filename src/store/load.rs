//! [`Store::load`](super::Store::load) as both backends answer it: the
//! reads in the order that keeps them consistent, each backend giving the
//! rows of one query at a time.

use super::rows::time_ns;
use super::{HeldRow, Loaded, ObjectRow, ReceiptRow, StoreError, VariantRow};
use std::time::SystemTime;

/// The queries of a load, one backend's SQL each.
pub(super) trait LoadReads {
    /// The receipts first seen at or after `since_ns` (stored nanoseconds).
    fn receipts_since(&mut self, since_ns: i64) -> Result<Vec<ReceiptRow>, StoreError>;
    /// The variants first seen at or after `since_ns` (stored nanoseconds).
    fn variants_since(&mut self, since_ns: i64) -> Result<Vec<VariantRow>, StoreError>;
    /// Every object, in object order.
    fn objects(&mut self) -> Result<Vec<ObjectRow>, StoreError>;
    /// The objects that must be in memory from the start when the others
    /// are read on demand: paused ones and those with an unresolved held
    /// row, in object order.
    fn pinned_objects(&mut self) -> Result<Vec<ObjectRow>, StoreError>;
    /// The held rows not resolved, in arrival order; with `bodies` false,
    /// each with an empty body (the store keeps it, docs/CONTRACT.md §9).
    fn unresolved(&mut self, bodies: bool) -> Result<Vec<HeldRow>, StoreError>;
    /// The highest step sequence number of the audit (0: none).
    fn max_seq(&mut self) -> Result<u64, StoreError>;
}

/// Which objects a load reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Objects {
    /// Every object ([`crate::store::Store::load`]).
    All,
    /// Only those that must stay in memory
    /// ([`crate::store::Store::load_resident`]), and no receipts: the
    /// shards read them when a delivery names their identity.
    Pinned,
}

/// Everything a receiver resumes from, receipts and variants from
/// `receipts_since` on, and the objects `which` says.
pub(super) fn load(
    reads: &mut impl LoadReads,
    receipts_since: SystemTime,
    which: Objects,
) -> Result<Loaded, StoreError> {
    let since = time_ns(receipts_since);
    // Identities before objects: a variant (or receipt) read here was
    // committed with its object change (a pause), which the object read
    // then sees, even with another process writing the store.
    // Read on demand by a receiver whose shards read objects on demand:
    // start-up does not wait for every identity in the window.
    let receipts = match which {
        Objects::All => reads.receipts_since(since)?,
        Objects::Pinned => Vec::new(),
    };
    let variants = reads.variants_since(since)?;
    let objects = match which {
        Objects::All => reads.objects()?,
        Objects::Pinned => reads.pinned_objects()?,
    };
    // Shards that read objects on demand read waiting bodies the same way,
    // when they decide them again: start-up reads none.
    let held = reads.unresolved(matches!(which, Objects::All))?;
    let max_seq = reads.max_seq()?;
    Ok(Loaded {
        objects,
        held,
        receipts,
        variants,
        max_seq,
    })
}
