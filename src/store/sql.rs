//! SQL written once for both backends: what the reader
//! ([`super::StoreReader`]) and the relays (`outbox.rs`) send through
//! either backend, with [`Value`]s for parameters, and how the rows come
//! back, each as its [`Cell`]s in column order. The row decoders
//! (`rows.rs`) read them through [`Cells`], as they read a backend's own
//! rows. A backend gives the reader one read transaction at a time as
//! [`Reads`], and checks with [`check_tables`] that a store it opens
//! read-only holds the receiver's tables.
//!
//! The SQL text has `$n` parameters in the order they first appear,
//! `{order}` for the column that gives insertion (commit) order, and
//! `{state}` for a history row's state (`r` joined to its step's audit row
//! `a`: its own column, or the slice of the audit body it points at). Each
//! backend translates it (`translate` in `sqlite/read.rs` and
//! `postgres/read.rs`).
//!
//! Below the reader and the relays, beside `rows.rs`: the backends use
//! it, and it uses neither the backends nor the reader.

use super::rows::Columns;
use super::StoreError;

/// The tables of a receiver store, in the order an error lists them.
const TABLES: [&str; 6] = [
    "audit",
    "held",
    "objects",
    "receipt_variants",
    "receipts",
    "replacements",
];

/// A value read from a row, whatever the backend's column type.
#[derive(Debug)]
pub(super) enum Cell {
    /// SQL `NULL`.
    Null,
    /// An integer (PostgreSQL booleans become 0 and 1, as SQLite stores them).
    Int(i64),
    /// Text.
    Text(String),
    /// Bytes.
    Bytes(Vec<u8>),
}

/// A query parameter (`NULL` keeps its type, which PostgreSQL needs).
pub(super) enum Value<'a> {
    /// An integer (`None`: `NULL`).
    Int(Option<i64>),
    /// Text (`None`: `NULL`).
    Text(Option<&'a str>),
}

/// An integer parameter.
pub(super) fn int(n: i64) -> Value<'static> {
    Value::Int(Some(n))
}

/// A text parameter.
pub(super) fn text(s: &str) -> Value<'_> {
    Value::Text(Some(s))
}

/// A position, count or row limit as stored (i64; positions never reach
/// 2^63, a larger limit is no limit).
pub(super) fn stored(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The queries of one call, inside one read transaction.
pub(super) trait Reads {
    /// Every row of `sql` with `params`, each as its cells in column order.
    fn rows(&mut self, sql: &str, params: &[Value<'_>]) -> Result<Vec<Vec<Cell>>, StoreError>;
    /// Whether the store has the table `name` (a store an older version
    /// wrote, read without migrating it, may lack one).
    fn has_table(&mut self, name: &str) -> Result<bool, StoreError>;
    /// Whether the store's table `table` has the column `column` (as
    /// [`Reads::has_table`], an older store may lack one).
    fn has_column(&mut self, table: &str, column: &str) -> Result<bool, StoreError>;
}

/// One row's cells, read as the shared decoders read columns. A column of
/// another type is an error naming what read it, never a panic.
pub(super) struct Cells<'a> {
    /// What reads the row (`outbox`, `reader`), for an error.
    by: &'static str,
    /// The row.
    row: &'a [Cell],
}

impl<'a> Cells<'a> {
    /// `row` as `by` reads it.
    pub(super) fn new(by: &'static str, row: &'a [Cell]) -> Self {
        Self { by, row }
    }

    fn get(&self, i: usize) -> Option<&Cell> {
        self.row.get(i)
    }

    /// [`StoreError::Failed`] for column `i`, which does not hold what
    /// this version stores there.
    fn corrupt(&self, i: usize) -> StoreError {
        StoreError::Failed(format!(
            "{}: column {i} holds {:?}, not what this version stores",
            self.by,
            self.get(i)
        ))
    }
}

impl Columns for Cells<'_> {
    fn int(&self, i: usize) -> Result<i64, StoreError> {
        match self.get(i) {
            Some(Cell::Int(n)) => Ok(*n),
            _ => Err(self.corrupt(i)),
        }
    }

    fn opt_int(&self, i: usize) -> Result<Option<i64>, StoreError> {
        match self.get(i) {
            Some(Cell::Null) => Ok(None),
            _ => self.int(i).map(Some),
        }
    }

    fn opt_text(&self, i: usize) -> Result<Option<String>, StoreError> {
        match self.get(i) {
            Some(Cell::Null) => Ok(None),
            Some(Cell::Text(s)) => Ok(Some(s.clone())),
            Some(Cell::Bytes(b)) => String::from_utf8(b.clone())
                .map(Some)
                .map_err(|_| self.corrupt(i)),
            _ => Err(self.corrupt(i)),
        }
    }

    fn opt_bytes(&self, i: usize) -> Result<Option<Vec<u8>>, StoreError> {
        match self.get(i) {
            Some(Cell::Null) => Ok(None),
            Some(Cell::Bytes(b)) => Ok(Some(b.clone())),
            Some(Cell::Text(s)) => Ok(Some(s.clone().into_bytes())),
            _ => Err(self.corrupt(i)),
        }
    }

    fn flag(&self, i: usize) -> Result<bool, StoreError> {
        self.int(i).map(|n| n != 0)
    }

    fn text(&self, i: usize) -> Result<String, StoreError> {
        self.opt_text(i)?.ok_or_else(|| self.corrupt(i))
    }

    fn bytes(&self, i: usize) -> Result<Vec<u8>, StoreError> {
        self.opt_bytes(i)?.ok_or_else(|| self.corrupt(i))
    }
}

/// [`StoreError::NotAStore`] naming the receiver tables missing from `found`.
pub(super) fn check_tables(location: &str, found: &[String]) -> Result<(), StoreError> {
    let missing: Vec<&str> = TABLES
        .iter()
        .copied()
        .filter(|t| !found.iter().any(|f| f == t))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(StoreError::NotAStore(if missing.len() == TABLES.len() {
        format!(
            "{location} has none of the receiver's tables ({})",
            TABLES.join(", ")
        )
    } else {
        format!(
            "{location} lacks the receiver's tables {}",
            missing.join(", ")
        )
    }))
}
