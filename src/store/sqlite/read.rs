//! Reading SQLite: the rows a receiver loads and reloads
//! ([`crate::store::Store::load`], [`crate::store::Store::refresh`]), and
//! the read-only connection of a [`crate::store::StoreReader`].

use super::{failed, SqliteStore};
use crate::store::load::{self, LoadReads};
use crate::store::rows::{
    audit_row, held_body, held_columns_without_body, held_row, object_row, receipt_row,
    replacement_row, stored_identity, variant_row, Columns, AUDIT_COLUMNS, HELD_BODY_COLUMNS,
    HELD_COLUMNS, IDENTITY_COLUMNS, OBJECT_COLUMNS, PINNED_OBJECTS, RECEIPT_COLUMNS,
    VARIANT_COLUMNS,
};
use crate::store::sql::{check_tables, text, Cell, Cells, Reads, Value};
use crate::store::{
    AuditRow, EffectRow, HeldBody, HeldKey, HeldRow, Loaded, ObjectRow, ReceiptRow, StoreError,
    VariantRow,
};
use std::sync::Arc;
use std::time::SystemTime;

impl Columns for rusqlite::Row<'_> {
    fn int(&self, i: usize) -> Result<i64, StoreError> {
        self.get(i).map_err(failed)
    }

    fn opt_int(&self, i: usize) -> Result<Option<i64>, StoreError> {
        self.get(i).map_err(failed)
    }

    fn opt_text(&self, i: usize) -> Result<Option<String>, StoreError> {
        self.get(i).map_err(failed)
    }

    fn opt_bytes(&self, i: usize) -> Result<Option<Vec<u8>>, StoreError> {
        self.get(i).map_err(failed)
    }

    fn flag(&self, i: usize) -> Result<bool, StoreError> {
        self.get::<_, i64>(i).map(|n| n != 0).map_err(failed)
    }

    fn text(&self, i: usize) -> Result<String, StoreError> {
        self.get(i).map_err(failed)
    }

    fn bytes(&self, i: usize) -> Result<Vec<u8>, StoreError> {
        self.get(i).map_err(failed)
    }
}

/// Every row of `st` with `params`, decoded by `row`.
fn select<T>(
    st: &mut rusqlite::Statement<'_>,
    params: impl rusqlite::Params,
    row: fn(&dyn Columns) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    let mut rows = st.query(params).map_err(failed)?;
    let mut out = Vec::new();
    while let Some(r) = rows.next().map_err(failed)? {
        out.push(row(r)?);
    }
    Ok(out)
}

impl LoadReads for SqliteStore {
    fn receipts_since(&mut self, since_ns: i64) -> Result<Vec<ReceiptRow>, StoreError> {
        self.receipts_where("WHERE first_seen_ns >= ?1", &since_ns)
    }

    fn variants_since(&mut self, since_ns: i64) -> Result<Vec<VariantRow>, StoreError> {
        self.variants_where("WHERE first_seen_ns >= ?1", &since_ns)
    }

    fn objects(&mut self) -> Result<Vec<ObjectRow>, StoreError> {
        self.objects_where("ORDER BY object_id", &[])
    }

    fn pinned_objects(&mut self) -> Result<Vec<ObjectRow>, StoreError> {
        self.objects_where(PINNED_OBJECTS, &[])
    }

    fn unresolved(&mut self, bodies: bool) -> Result<Vec<HeldRow>, StoreError> {
        let columns = if bodies {
            HELD_COLUMNS.to_owned()
        } else {
            held_columns_without_body("x''")
        };
        let mut st = self
            .conn
            .prepare(&format!(
                "SELECT {columns} FROM held WHERE status <> 'resolved' ORDER BY at_ns, rowid"
            ))
            .map_err(failed)?;
        select(&mut st, [], held_row)
    }

    fn max_seq(&mut self) -> Result<u64, StoreError> {
        self.conn
            .query_row("SELECT coalesce(max(seq), 0) FROM audit", [], |r| {
                r.get::<_, i64>(0)
            })
            .map(|n| n as u64)
            .map_err(failed)
    }
}

impl SqliteStore {
    /// Every row of the cached statement `sql` with one parameter, decoded
    /// by `row`.
    fn select_where<T>(
        &self,
        sql: &str,
        param: &dyn rusqlite::ToSql,
        row: fn(&dyn Columns) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        let mut st = self.conn.prepare_cached(sql).map_err(failed)?;
        select(&mut st, [param], row)
    }

    /// The stored variants matching `filter` (with one parameter).
    fn variants_where(
        &self,
        filter: &str,
        param: &dyn rusqlite::ToSql,
    ) -> Result<Vec<VariantRow>, StoreError> {
        let sql = format!("SELECT {VARIANT_COLUMNS} FROM receipt_variants {filter}");
        self.select_where(&sql, param, variant_row)
    }

    /// The stored receipts matching `filter` (with one parameter).
    fn receipts_where(
        &self,
        filter: &str,
        param: &dyn rusqlite::ToSql,
    ) -> Result<Vec<ReceiptRow>, StoreError> {
        let sql = format!("SELECT {RECEIPT_COLUMNS} FROM receipts {filter}");
        self.select_where(&sql, param, receipt_row)
    }

    /// The stored objects matching `filter`: all of them without `ids`,
    /// otherwise the filter with each id as its one parameter.
    fn objects_where(&self, filter: &str, ids: &[Arc<str>]) -> Result<Vec<ObjectRow>, StoreError> {
        let mut st = self
            .conn
            .prepare_cached(&format!("SELECT {OBJECT_COLUMNS} FROM objects {filter}"))
            .map_err(failed)?;
        if ids.is_empty() {
            return select(&mut st, [], object_row);
        }
        let mut all = Vec::new();
        for id in ids {
            all.extend(select(&mut st, [&**id], object_row)?);
        }
        Ok(all)
    }

    pub(super) fn loaded(
        &mut self,
        receipts_since: SystemTime,
        which: load::Objects,
    ) -> Result<Loaded, StoreError> {
        load::load(self, receipts_since, which)
    }

    /// Every stored object, in object order.
    pub(super) fn all_objects(&mut self) -> Result<Vec<ObjectRow>, StoreError> {
        self.objects_where("ORDER BY object_id", &[])
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

    pub(super) fn replacements_after(&mut self, after: u64) -> Result<Vec<EffectRow>, StoreError> {
        let mut st = self
            .conn
            .prepare(
                "SELECT r.origin, r.seq, r.at_ns, r.object_id, r.version,
                        CASE WHEN r.state_at IS NULL THEN r.state
                             ELSE CAST(substr(a.body, r.state_at + 1, r.state_len) AS TEXT) END,
                        r.cause_event, r.trace_context
                 FROM replacements AS r
                 LEFT JOIN audit AS a ON r.state_at IS NOT NULL AND a.origin = r.origin AND a.seq = r.seq
                 WHERE r.seq > ?1 ORDER BY r.seq, r.rowid",
            )
            .map_err(failed)?;
        select(&mut st, [after as i64], replacement_row)
    }

    pub(super) fn audit_rows(&mut self) -> Result<Vec<AuditRow>, StoreError> {
        let mut st = self
            .conn
            .prepare(&format!("SELECT {AUDIT_COLUMNS} FROM audit ORDER BY rowid"))
            .map_err(failed)?;
        select(&mut st, [], audit_row)
    }
}

/// The error of a SQLite read.
fn sqlite_failed(e: rusqlite::Error) -> StoreError {
    StoreError::backend("sqlite: read", e)
}

/// A read-only connection to a SQLite store: what a
/// [`crate::store::StoreReader`] reads a `sqlite:PATH` location with.
pub(in crate::store) struct SqliteReadOnly(rusqlite::Connection);

impl SqliteReadOnly {
    /// Opens `path` read-only and checks that it holds the receiver's
    /// tables; creates nothing. `location` names it in messages.
    ///
    /// # Errors
    /// [`StoreError::Missing`] for a file that does not exist;
    /// [`StoreError::NotAStore`] for a file that is not a SQLite database,
    /// or that lacks the receiver's tables (named);
    /// [`StoreError::Failed`] for a file that cannot be opened or read;
    /// [`StoreError::Backend`] when its busy timeout cannot be set.
    pub(in crate::store) fn open(path: &str, location: &str) -> Result<Self, StoreError> {
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
        Ok(Self(conn))
    }

    /// Runs `f` in one read transaction: it sees one committed snapshot of
    /// the (WAL) file while a receiver keeps committing.
    ///
    /// # Errors
    /// `f`'s error; [`StoreError::Backend`] when the transaction cannot be
    /// begun or ended.
    pub(in crate::store) fn read<T>(
        &mut self,
        f: impl FnOnce(&mut dyn Reads) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let tx = self.0.transaction().map_err(sqlite_failed)?;
        let mut reads = SqliteReads(tx);
        let out = f(&mut reads)?;
        reads.0.finish().map_err(sqlite_failed)?;
        Ok(out)
    }
}

/// A read transaction on SQLite.
struct SqliteReads<'c>(rusqlite::Transaction<'c>);

impl Reads for SqliteReads<'_> {
    fn rows(&mut self, sql: &str, params: &[Value<'_>]) -> Result<Vec<Vec<Cell>>, StoreError> {
        rows(&self.0, sql, params, sqlite_failed)
    }
    fn has_table(&mut self, name: &str) -> Result<bool, StoreError> {
        let rows = self.rows(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = $1",
            &[text(name)],
        )?;
        let count = rows.first().map(|r| Cells::new("reader", r).int(0));
        Ok(count.transpose()?.is_some_and(|n| n > 0))
    }
    fn has_column(&mut self, table: &str, column: &str) -> Result<bool, StoreError> {
        let rows = self.rows(
            "SELECT count(*) FROM pragma_table_info($1) WHERE name = $2",
            &[text(table), text(column)],
        )?;
        let count = rows.first().map(|r| Cells::new("reader", r).int(0));
        Ok(count.transpose()?.is_some_and(|n| n > 0))
    }
}

/// A history row's state: its own column, or the slice of its step's
/// audit body it points at.
const STATE: &str = "CASE WHEN r.state_at IS NULL THEN r.state \
     ELSE CAST(substr(a.body, r.state_at + 1, r.state_len) AS TEXT) END";

/// The length in bytes of a history row's state (as [`STATE`] reads it),
/// without reading an audit body.
const STATE_BYTES: &str = "CASE WHEN r.state_at IS NULL THEN length(CAST(r.state AS BLOB)) \
     ELSE r.state_len END";

/// SQL written once for both backends (`store/sql.rs`) as SQLite runs it:
/// `{order}` is the rowid, `{state}` is [`STATE`], `{state_bytes}` is
/// [`STATE_BYTES`], and `$n` becomes `?n`,
/// the n-th parameter (`$n` is a name in SQLite, numbered by first
/// appearance).
pub(super) fn translate(sql: &str) -> String {
    sql.replace("{order}", "rowid")
        .replace("{state_bytes}", STATE_BYTES)
        .replace("{state}", STATE)
        .replace('$', "?")
}

/// The parameters as rusqlite binds them.
pub(super) fn values<'a>(params: &'a [Value<'a>]) -> Vec<&'a dyn rusqlite::ToSql> {
    params
        .iter()
        .map(|p| match p {
            Value::Int(n) => n as &dyn rusqlite::ToSql,
            Value::Text(s) => s as &dyn rusqlite::ToSql,
        })
        .collect()
}

/// Every row of `sql` (written once for both backends, see [`translate`])
/// with `params` on `conn`, each as its cells in column order; `failed`
/// is the error of a statement that fails.
pub(super) fn rows(
    conn: &rusqlite::Connection,
    sql: &str,
    params: &[Value<'_>],
    failed: fn(rusqlite::Error) -> StoreError,
) -> Result<Vec<Vec<Cell>>, StoreError> {
    let mut st = conn.prepare_cached(&translate(sql)).map_err(failed)?;
    let columns = st.column_count();
    let mut rows = st.query(values(params).as_slice()).map_err(failed)?;
    let mut out = Vec::new();
    while let Some(row) = rows.next().map_err(failed)? {
        out.push(cells(row, columns)?);
    }
    Ok(out)
}

/// The first `columns` values of `row` as cells.
fn cells(row: &rusqlite::Row<'_>, columns: usize) -> Result<Vec<Cell>, StoreError> {
    use rusqlite::types::ValueRef;
    let mut cells = Vec::with_capacity(columns);
    for i in 0..columns {
        cells.push(match row.get_ref(i).map_err(sqlite_failed)? {
            ValueRef::Null => Cell::Null,
            ValueRef::Integer(n) => Cell::Int(n),
            // No column the reader asks for is a float.
            ValueRef::Real(x) => Cell::Int(x as i64),
            // Checked whole first (the common, valid case is one fast
            // pass); only invalid text takes the replacing copy.
            ValueRef::Text(t) => Cell::Text(match std::str::from_utf8(t) {
                Ok(text) => text.to_owned(),
                Err(_) => String::from_utf8_lossy(t).into_owned(),
            }),
            ValueRef::Blob(b) => Cell::Bytes(b.to_vec()),
        });
    }
    Ok(cells)
}

/// A shard's own read-only connection to the SQLite file, for the objects
/// and receipts it does not hold in memory ([`crate::store::ObjectSource`]). WAL mode
/// lets it read while the committer writes; each read is its own
/// transaction, so it sees every commit reported before it started.
pub(super) struct SqliteObjects {
    pub(super) conn: rusqlite::Connection,
}

impl SqliteObjects {
    /// Opens `path` read-only, set up as `connect` says (lock wait, page
    /// cache).
    pub(super) fn open(path: &str, connect: super::Connect) -> Result<Self, StoreError> {
        use rusqlite::OpenFlags;
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = rusqlite::Connection::open_with_flags(path, flags).map_err(|e| {
            StoreError::Failed(format!("sqlite: cannot open {path} to read objects: {e}"))
        })?;
        connect.apply(&conn).map_err(failed)?;
        Ok(Self { conn })
    }
}

/// `ids` as one JSON array, so that one statement takes any number of them
/// (`json_each(?1)` turns it back into rows); `what` names them in an error.
fn json_ids(ids: &[Arc<str>], what: &str) -> Result<String, StoreError> {
    serde_json::to_string(ids).map_err(|e| StoreError::Failed(format!("sqlite: {what}: {e}")))
}

impl crate::store::ObjectSource for SqliteObjects {
    fn held_bodies(&mut self, keys: &[HeldKey]) -> Result<Vec<HeldBody>, StoreError> {
        // One look-up by the primary key each: a reconciliation reads one
        // object's few held events.
        let mut st = self
            .conn
            .prepare_cached(&format!(
                "SELECT {HELD_BODY_COLUMNS} FROM held WHERE origin = ?1 AND seq = ?2"
            ))
            .map_err(failed)?;
        let mut bodies = Vec::with_capacity(keys.len());
        for k in keys {
            bodies.extend(select(&mut st, [k.origin as i64, k.seq as i64], held_body)?);
        }
        Ok(bodies)
    }

    fn receipts(
        &mut self,
        event_ids: &[Arc<str>],
        since: SystemTime,
    ) -> Result<Vec<ReceiptRow>, StoreError> {
        if event_ids.is_empty() {
            return Ok(Vec::new());
        }
        let list = json_ids(event_ids, "event ids")?;
        let mut st = self
            .conn
            .prepare_cached(&format!(
                "SELECT {RECEIPT_COLUMNS} FROM receipts \
                 WHERE event_id IN (SELECT value FROM json_each(?1)) AND first_seen_ns >= ?2"
            ))
            .map_err(failed)?;
        select(
            &mut st,
            rusqlite::params![list, crate::store::rows::time_ns(since)],
            receipt_row,
        )
    }

    fn receipt_ids(
        &mut self,
        after: &str,
        since: SystemTime,
        limit: usize,
    ) -> Result<Vec<(Arc<str>, SystemTime)>, StoreError> {
        let mut st = self
            .conn
            .prepare_cached(&format!(
                "SELECT {IDENTITY_COLUMNS} FROM receipts \
                 WHERE event_id > ?1 AND first_seen_ns >= ?2 ORDER BY event_id LIMIT ?3"
            ))
            .map_err(failed)?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        select(
            &mut st,
            rusqlite::params![after, crate::store::rows::time_ns(since), limit],
            stored_identity,
        )
    }

    fn objects(&mut self, ids: &[Arc<str>]) -> Result<Vec<ObjectRow>, StoreError> {
        match ids {
            [] => Ok(Vec::new()),
            [id] => {
                let mut st = self
                    .conn
                    .prepare_cached(&format!(
                        "SELECT {OBJECT_COLUMNS} FROM objects WHERE object_id = ?1"
                    ))
                    .map_err(failed)?;
                select(&mut st, [&**id], object_row)
            }
            _ => {
                let list = json_ids(ids, "object ids")?;
                let mut st = self
                    .conn
                    .prepare_cached(&format!(
                        "SELECT {OBJECT_COLUMNS} FROM objects \
                         WHERE object_id IN (SELECT value FROM json_each(?1))"
                    ))
                    .map_err(failed)?;
                select(&mut st, [list], object_row)
            }
        }
    }
}
