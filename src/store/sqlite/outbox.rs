//! SQLite's side of the outbox and relays (`store/outbox.rs`): a relay's
//! own read-write connection to the file. WAL mode lets it read effects
//! while the committer writes; its saves are short `IMMEDIATE`
//! transactions that wait up to the store's busy timeout for the
//! committer's lock.

use super::{failed, read::cells};
use crate::store::outbox::{Sql, SqlOutbox, Value};
use crate::store::reader::Cell;
use crate::store::StoreError;
use std::time::Duration;

/// A history row's state: its own column, or the slice of its step's
/// audit body it points at.
const STATE: &str = "CASE WHEN r.state_at IS NULL THEN r.state \
     ELSE CAST(substr(a.body, r.state_at + 1, r.state_len) AS TEXT) END";

/// A relay's connection to the SQLite file.
pub(super) struct SqliteSql {
    conn: rusqlite::Connection,
}

/// Opens the relays' connection to the store at `path`.
pub(super) fn open(path: &str, busy_timeout: Duration) -> Result<SqlOutbox<SqliteSql>, StoreError> {
    let conn = rusqlite::Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| StoreError::Failed(format!("sqlite: cannot open {path} for relays: {e}")))?;
    conn.busy_timeout(busy_timeout).map_err(failed)?;
    Ok(SqlOutbox::new(SqliteSql { conn }))
}

/// The SQL as SQLite numbers its parameters: `$n` is a name in SQLite,
/// numbered by first appearance, `?n` is the n-th.
fn sqlite(sql: &str) -> String {
    sql.replace("{state}", STATE).replace('$', "?")
}

fn values<'a>(params: &'a [Value<'a>]) -> Vec<&'a dyn rusqlite::ToSql> {
    params
        .iter()
        .map(|p| match p {
            Value::Int(n) => n as &dyn rusqlite::ToSql,
            Value::Text(s) => s as &dyn rusqlite::ToSql,
        })
        .collect()
}

impl Sql for SqliteSql {
    fn rows(&mut self, sql: &str, params: &[Value<'_>]) -> Result<Vec<Vec<Cell>>, StoreError> {
        let mut st = self.conn.prepare_cached(&sqlite(sql)).map_err(failed)?;
        let columns = st.column_count();
        let mut rows = st.query(values(params).as_slice()).map_err(failed)?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(failed)? {
            out.push(cells(row, columns)?);
        }
        Ok(out)
    }

    fn execute(&mut self, sql: &str, params: &[Value<'_>]) -> Result<u64, StoreError> {
        let mut st = self.conn.prepare_cached(&sqlite(sql)).map_err(failed)?;
        st.execute(values(params).as_slice())
            .map(|n| n as u64)
            .map_err(failed)
    }

    fn begin(&mut self) -> Result<(), StoreError> {
        self.conn.execute_batch("BEGIN IMMEDIATE").map_err(failed)
    }

    fn commit(&mut self) -> Result<(), StoreError> {
        self.conn.execute_batch("COMMIT").map_err(failed)
    }

    fn rollback(&mut self) {
        if let Err(e) = self.conn.execute_batch("ROLLBACK") {
            tracing::debug!(error = %e, "relay transaction not rolled back (none open)");
        }
    }
}
