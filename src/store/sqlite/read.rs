//! Reading SQLite: the rows a receiver loads and reloads
//! ([`crate::store::Store::load`], [`crate::store::Store::refresh`]), and
//! the read-only connection of a [`crate::store::StoreReader`].

use super::{failed, SqliteStore};
use crate::store::reader::{check_tables, Cell, Param, Reads};
use crate::store::rows::{audit_kind, ns_time, parse_version, time_ns, verdict};
use crate::store::{
    AuditRow, HeldKey, HeldRow, HeldStatus, Loaded, ObjectRow, ReceiptRow, ReplacementRow,
    StoreError, VariantRow,
};
use std::sync::Arc;
use std::time::SystemTime;

impl SqliteStore {
    /// The stored variants matching `filter` (with one parameter).
    fn variants_where(
        &self,
        filter: &str,
        param: &dyn rusqlite::ToSql,
    ) -> Result<Vec<VariantRow>, StoreError> {
        let mut st = self
            .conn
            .prepare_cached(&format!(
                "SELECT event_id, fingerprint, object_id, first_seen_ns FROM receipt_variants {filter}"
            ))
            .map_err(failed)?;
        let rows = st
            .query_map([param], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, Vec<u8>>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, i64>(3)?,
                ))
            })
            .map_err(failed)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(failed)?;
        rows.into_iter()
            .map(|(event_id, fp, object_id, seen)| {
                let fp: [u8; 16] = fp.try_into().map_err(|_| {
                    StoreError::Failed(format!("corrupt variant fingerprint of {event_id}"))
                })?;
                Ok(VariantRow {
                    event_id: Arc::from(event_id),
                    fingerprint: u128::from_le_bytes(fp),
                    object_id: Arc::from(object_id),
                    first_seen: ns_time(seen),
                })
            })
            .collect()
    }

    fn objects_where(&self, filter: &str, ids: &[Arc<str>]) -> Result<Vec<ObjectRow>, StoreError> {
        let mut st = self
            .conn
            .prepare_cached(&format!(
                "SELECT object_id, version, state, paused FROM objects {filter}"
            ))
            .map_err(failed)?;
        let read = |r: &rusqlite::Row<'_>| -> rusqlite::Result<(String, String, String, i64)> {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        };
        let raw: Vec<_> = if ids.is_empty() {
            st.query_map([], read)
                .map_err(failed)?
                .collect::<Result<_, _>>()
        } else {
            let mut all = Vec::new();
            for id in ids {
                all.extend(st.query_map([&**id], read).map_err(failed)?);
            }
            all.into_iter().collect::<Result<_, _>>()
        }
        .map_err(failed)?;
        raw.into_iter()
            .map(|(id, v, state, paused)| {
                Ok(ObjectRow {
                    object_id: Arc::from(id),
                    version: parse_version(&v)?,
                    state,
                    paused: paused != 0,
                })
            })
            .collect()
    }

    fn receipts_where(
        &self,
        filter: &str,
        param: &dyn rusqlite::ToSql,
    ) -> Result<Vec<ReceiptRow>, StoreError> {
        let mut st = self
            .conn
            .prepare_cached(&format!(
                "SELECT event_id, fingerprint, object_id, decision, first_seen_ns FROM receipts {filter}"
            ))
            .map_err(failed)?;
        let rows = st
            .query_map([param], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, Vec<u8>>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, i64>(4)?,
                ))
            })
            .map_err(failed)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(failed)?;
        rows.into_iter()
            .map(|(event_id, fp, object_id, decision, seen)| {
                let fp: [u8; 16] = fp.try_into().map_err(|_| {
                    StoreError::Failed(format!("corrupt fingerprint of {event_id}"))
                })?;
                Ok(ReceiptRow {
                    event_id: Arc::from(event_id),
                    fingerprint: u128::from_le_bytes(fp),
                    object_id: Arc::from(object_id),
                    decision: verdict(&decision)?,
                    first_seen: ns_time(seen),
                    retention_cutoff: None,
                })
            })
            .collect()
    }

    pub(super) fn loaded(&mut self, receipts_since: SystemTime) -> Result<Loaded, StoreError> {
        // Identities before objects: a variant (or receipt) read here was
        // committed with its object change (a pause), which the object read
        // then sees, even with another process writing the file.
        let receipts =
            self.receipts_where("WHERE first_seen_ns >= ?1", &time_ns(receipts_since))?;
        let variants =
            self.variants_where("WHERE first_seen_ns >= ?1", &time_ns(receipts_since))?;
        let objects = self.objects_where("ORDER BY object_id", &[])?;
        let mut st = self
            .conn
            .prepare(
                "SELECT origin, seq, at_ns, event_id, object_id, held_as, body, status, superseded_by, detail
                 FROM held WHERE status <> 'resolved' ORDER BY at_ns, rowid",
            )
            .map_err(failed)?;
        let raw = st
            .query_map([], |r| {
                Ok((
                    (
                        r.get::<_, i64>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, i64>(2)?,
                    ),
                    (
                        r.get::<_, Option<String>>(3)?,
                        r.get::<_, Option<String>>(4)?,
                    ),
                    (
                        r.get::<_, String>(5)?,
                        r.get::<_, Vec<u8>>(6)?,
                        r.get::<_, String>(7)?,
                    ),
                    (
                        r.get::<_, Option<String>>(8)?,
                        r.get::<_, Option<String>>(9)?,
                    ),
                ))
            })
            .map_err(failed)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(failed)?;
        drop(st);
        let mut held = Vec::with_capacity(raw.len());
        for ((origin, seq, at), (event_id, object_id), (held_as, body, status), (by, detail)) in raw
        {
            held.push(HeldRow {
                key: HeldKey {
                    origin: origin as u64,
                    seq: seq as u64,
                },
                at: ns_time(at),
                event_id: event_id.map(Arc::from),
                object_id: object_id.map(Arc::from),
                held_as: verdict(&held_as)?,
                body: Arc::from(body),
                status: HeldStatus::parse(&status)
                    .ok_or_else(|| StoreError::Failed(format!("corrupt held status {status:?}")))?,
                superseded_by: by.as_deref().map(parse_version).transpose()?,
                detail,
            });
        }
        let max_seq = self
            .conn
            .query_row("SELECT coalesce(max(seq), 0) FROM audit", [], |r| {
                r.get::<_, i64>(0)
            })
            .map(|n| n as u64)
            .map_err(failed)?;
        Ok(Loaded {
            objects,
            held,
            receipts,
            variants,
            max_seq,
        })
    }

    pub(super) fn refreshed(
        &mut self,
        objects: &[Arc<str>],
        receipts: &[Arc<str>],
    ) -> Result<(Vec<ObjectRow>, Vec<ReceiptRow>), StoreError> {
        // Receipts before objects, as in `load`: each read sees what was
        // committed when it started, and a receipt commits with its object
        // change, so the object read after it sees that change.
        let mut found = Vec::new();
        for id in receipts {
            found.extend(self.receipts_where("WHERE event_id = ?1", &&**id)?);
        }
        let objects = if objects.is_empty() {
            Vec::new()
        } else {
            self.objects_where("WHERE object_id = ?1", objects)?
        };
        Ok((objects, found))
    }

    pub(super) fn variants_of(
        &mut self,
        event_ids: &[Arc<str>],
    ) -> Result<Vec<VariantRow>, StoreError> {
        let mut found = Vec::new();
        for id in event_ids {
            found.extend(self.variants_where("WHERE event_id = ?1", &&**id)?);
        }
        Ok(found)
    }

    pub(super) fn replacements_after(
        &mut self,
        after: u64,
    ) -> Result<Vec<ReplacementRow>, StoreError> {
        let mut st = self
            .conn
            .prepare(
                "SELECT r.origin, r.seq, r.at_ns, r.object_id, r.version,
                        CASE WHEN r.state_at IS NULL THEN r.state
                             ELSE CAST(substr(a.body, r.state_at + 1, r.state_len) AS TEXT) END,
                        r.cause_event
                 FROM replacements AS r
                 LEFT JOIN audit AS a ON r.state_at IS NOT NULL AND a.origin = r.origin AND a.seq = r.seq
                 WHERE r.seq > ?1 ORDER BY r.seq, r.rowid",
            )
            .map_err(failed)?;
        let rows = st
            .query_map([after as i64], |r| {
                Ok((
                    (
                        r.get::<_, i64>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, i64>(2)?,
                    ),
                    (r.get::<_, String>(3)?, r.get::<_, String>(4)?),
                    (
                        r.get::<_, Option<String>>(5)?,
                        r.get::<_, Option<String>>(6)?,
                    ),
                ))
            })
            .map_err(failed)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(failed)?;
        rows.into_iter()
            .map(
                |((origin, seq, at), (object_id, version), (state, cause))| {
                    Ok(ReplacementRow {
                        key: HeldKey {
                            origin: origin as u64,
                            seq: seq as u64,
                        },
                        at: ns_time(at),
                        object_id: Arc::from(object_id),
                        version: parse_version(&version)?,
                        // NULL only when the audit body the row points at
                        // is gone, which the audit purge never leaves.
                        state: state.ok_or_else(|| {
                            StoreError::Failed(format!(
                                "corrupt history row {seq}: its state's audit body is missing"
                            ))
                        })?,
                        cause_event: cause.map(Arc::from),
                    })
                },
            )
            .collect()
    }

    pub(super) fn audit_rows(&mut self) -> Result<Vec<AuditRow>, StoreError> {
        let mut st = self
            .conn
            .prepare(
                "SELECT origin, seq, at_ns, event_id, object_id, kind, decision, version, replacement, detail, body
                 FROM audit ORDER BY rowid",
            )
            .map_err(failed)?;
        let rows = st
            .query_map([], |r| {
                Ok((
                    (
                        r.get::<_, i64>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, i64>(2)?,
                    ),
                    (
                        r.get::<_, Option<String>>(3)?,
                        r.get::<_, Option<String>>(4)?,
                    ),
                    (
                        r.get::<_, String>(5)?,
                        r.get::<_, Option<String>>(6)?,
                        r.get::<_, Option<String>>(7)?,
                    ),
                    (
                        r.get::<_, i64>(8)?,
                        r.get::<_, Option<String>>(9)?,
                        r.get::<_, Option<Vec<u8>>>(10)?,
                    ),
                ))
            })
            .map_err(failed)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(failed)?;
        rows.into_iter()
            .map(
                |(
                    (origin, seq, at),
                    (event_id, object_id),
                    (kind, decision, version),
                    (repl, detail, body),
                )| {
                    Ok(AuditRow {
                        key: HeldKey {
                            origin: origin as u64,
                            seq: seq as u64,
                        },
                        at: ns_time(at),
                        event_id: event_id.map(Arc::from),
                        object_id: object_id.map(Arc::from),
                        kind: audit_kind(&kind)?,
                        decision,
                        version: version.as_deref().map(parse_version).transpose()?,
                        replacement: repl != 0,
                        detail,
                        body: body.map(Arc::from),
                    })
                },
            )
            .collect()
    }
}

/// The error of a SQLite read.
fn sqlite_failed(e: rusqlite::Error) -> StoreError {
    StoreError::backend("sqlite: read", e)
}

/// Opens `path` read-only and checks that it holds the receiver's tables.
pub(in crate::store) fn open_read_only(
    path: &str,
    location: &str,
) -> Result<rusqlite::Connection, StoreError> {
    use rusqlite::{Connection, ErrorCode, OpenFlags};
    if !std::path::Path::new(path).exists() {
        return Err(StoreError::Missing(format!("{location}: no such file")));
    }
    let not_a_database =
        |e: &rusqlite::Error| e.sqlite_error_code() == Some(ErrorCode::NotADatabase);
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| StoreError::Failed(format!("{location}: cannot open: {e}")))?;
    // A read waits this long for a writer's recovery or checkpoint, never
    // for a commit (WAL readers do not wait for writers).
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .map_err(sqlite_failed)?;
    let found: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
        .and_then(|mut st| {
            st.query_map([], |r| r.get::<_, String>(0))?
                .collect::<Result<_, _>>()
        })
        .map_err(|e| {
            if not_a_database(&e) {
                StoreError::NotAStore(format!("{location}: the file is not a SQLite database"))
            } else {
                StoreError::Failed(format!("{location}: cannot read: {e}"))
            }
        })?;
    check_tables(location, &found)?;
    Ok(conn)
}

/// Runs `f` in one read transaction on `conn` (a [`crate::store::StoreReader`] call).
pub(in crate::store) fn read_in<T>(
    conn: &mut rusqlite::Connection,
    f: impl FnOnce(&mut dyn Reads) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let tx = conn.transaction().map_err(sqlite_failed)?;
    let mut reads = SqliteReads(tx);
    let out = f(&mut reads)?;
    reads.0.finish().map_err(sqlite_failed)?;
    Ok(out)
}

/// A read transaction on SQLite.
struct SqliteReads<'c>(rusqlite::Transaction<'c>);

impl Reads for SqliteReads<'_> {
    fn rows(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Vec<Vec<Cell>>, StoreError> {
        use rusqlite::types::ValueRef;
        use rusqlite::ToSql;
        let sql = sql.replace("{order}", "rowid");
        let mut st = self.0.prepare_cached(&sql).map_err(sqlite_failed)?;
        let columns = st.column_count();
        let values: Vec<&dyn ToSql> = params
            .iter()
            .map(|p| match p {
                Param::Text(s) => s as &dyn ToSql,
                Param::Int(n) => n as &dyn ToSql,
            })
            .collect();
        let mut rows = st.query(values.as_slice()).map_err(sqlite_failed)?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(sqlite_failed)? {
            let mut cells = Vec::with_capacity(columns);
            for i in 0..columns {
                cells.push(match row.get_ref(i).map_err(sqlite_failed)? {
                    ValueRef::Null => Cell::Null,
                    ValueRef::Integer(n) => Cell::Int(n),
                    // No column the reader asks for is a float.
                    ValueRef::Real(x) => Cell::Int(x as i64),
                    ValueRef::Text(t) => Cell::Text(String::from_utf8_lossy(t).into_owned()),
                    ValueRef::Blob(b) => Cell::Bytes(b.to_vec()),
                });
            }
            out.push(cells);
        }
        Ok(out)
    }
}
