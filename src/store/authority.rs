//! A reconciler's own connection to a durable store ([`AuthorityStore`]),
//! written once for both backends over their [`Sql`] connections: the
//! pages of object ids a resync reads, and the table `authority_waits`,
//! one row per object waiting for an authority after a fetch that did not
//! settle it (docs/CONTRACT.md §4), which `inspect` and the status page
//! read without the process.

use super::outbox::Sql;
use super::rows::{time_ns, Columns};
use super::sql::{int, stored, text, Cells, Value};
use super::{AuthorityStore, StoreError};
use snapshot_receiver_core::reconciler::WaitRecord;
use std::sync::Arc;

/// Replaces an object's row with its last failed fetch.
const SAVE_WAIT: &str = "INSERT INTO authority_waits
    (object_id, reasons, outcome, error, attempts, since_ns, next_try_ns, at_ns)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
    ON CONFLICT (object_id) DO UPDATE SET reasons = excluded.reasons,
        outcome = excluded.outcome, error = excluded.error, attempts = excluded.attempts,
        since_ns = excluded.since_ns, next_try_ns = excluded.next_try_ns, at_ns = excluded.at_ns";

/// A reconciler's connection to one backend.
pub(super) struct SqlAuthority<C> {
    /// Its own connection (never the committer's).
    conn: C,
}

impl<C: Sql> SqlAuthority<C> {
    pub(super) fn new(conn: C) -> Self {
        Self { conn }
    }
}

impl<C: Sql> AuthorityStore for SqlAuthority<C> {
    fn object_ids(&mut self, after: &str, limit: usize) -> Result<Vec<Arc<str>>, StoreError> {
        self.conn
            .rows(
                "SELECT object_id FROM objects WHERE object_id > $1 ORDER BY object_id LIMIT $2",
                &[text(after), int(stored(limit as u64))],
            )?
            .iter()
            .map(|row| Cells::new("authority", row).text(0).map(Arc::from))
            .collect()
    }

    fn save_waits(&mut self, records: &[WaitRecord]) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        self.conn.begin()?;
        let written = records.iter().try_for_each(|record| {
            match record {
                WaitRecord::Failed(w) => {
                    let reasons = w.reasons.to_string();
                    let params: [Value<'_>; 8] = [
                        text(&w.object_id),
                        text(&reasons),
                        text(w.outcome),
                        text(&w.error),
                        int(i64::from(w.attempts)),
                        int(time_ns(w.since)),
                        Value::Int(w.next_try.map(time_ns)),
                        int(time_ns(w.at)),
                    ];
                    self.conn.execute(SAVE_WAIT, &params)?;
                }
                WaitRecord::Settled(object_id) => {
                    self.conn.execute(
                        "DELETE FROM authority_waits WHERE object_id = $1",
                        &[text(object_id)],
                    )?;
                }
            }
            Ok(())
        });
        match written {
            Ok(()) => self.conn.commit(),
            Err(e) => {
                self.conn.rollback();
                Err(e)
            }
        }
    }
}
