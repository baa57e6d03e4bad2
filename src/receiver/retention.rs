//! The purge of audit and history rows older than their windows
//! (docs/CONTRACT.md §9), in batches through the committer.

use super::Receiver;
use crate::store::{Purged, StoreError};

impl Receiver {
    /// Removes from the durable store the audit rows, history rows and
    /// resolved held rows older than their windows
    /// ([`super::ReceiverBuilder::audit_retention`],
    /// [`super::ReceiverBuilder::history_retention`]; measured on the
    /// receiver's clock), in batches of
    /// [`super::ReceiverBuilder::purge_batch`] rows, each its own
    /// transaction, so that deliveries commit between batches. Rows of
    /// events still held, parked or unresolved, and the audit rows that
    /// justify them, stay. Returns the rows removed per kind; without a
    /// durable store there is nothing to remove (the memory trail is
    /// bounded by [`crate::Config::trail_capacity`]).
    ///
    /// # Errors
    /// The store's [`StoreError`] when a batch could not be deleted (the
    /// batches before it stay deleted).
    pub async fn purge_expired_records(&self) -> Result<Purged, StoreError> {
        let mut purged = Purged::default();
        let Some(store) = &self.inner.store else {
            return Ok(purged);
        };
        let now = self.context().clock().now();
        let retention = self.inner.records;
        let batch = retention.batch();
        for (records, before) in retention.cutoffs(now) {
            while purged.batch_done(
                records,
                store.purge_records(records, before, batch).await?,
                batch,
            ) {}
        }
        Ok(purged)
    }
}
