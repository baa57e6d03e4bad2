//! The SQLite schema: the tables, created if absent, and what a store
//! created by an older version lacks, added when it is opened.

use super::failed;
use crate::store::StoreError;
use rusqlite::Connection;

/// The schema, created if absent. Versions are 20-digit zero-padded text
/// (every u64 fits; text order is numeric order); times are nanoseconds
/// since the Unix epoch.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS receipts (
    event_id      TEXT PRIMARY KEY,          -- event identity: one receipt each
    fingerprint   BLOB NOT NULL,             -- 16 bytes, little-endian u128
    object_id     TEXT NOT NULL,
    decision      TEXT NOT NULL,             -- first decision, e.g. applied, held:paused
    first_seen_ns INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS receipts_first_seen ON receipts (first_seen_ns);
CREATE TABLE IF NOT EXISTS receipt_variants (
    event_id      TEXT NOT NULL,             -- an event identity with a receipt
    fingerprint   BLOB NOT NULL,             -- a content other than the receipt's
    object_id     TEXT NOT NULL,
    first_seen_ns INTEGER NOT NULL,
    PRIMARY KEY (event_id, fingerprint)      -- each variant decided once
);
CREATE INDEX IF NOT EXISTS receipt_variants_first_seen ON receipt_variants (first_seen_ns);
CREATE TABLE IF NOT EXISTS objects (
    object_id TEXT PRIMARY KEY,
    version   TEXT NOT NULL CHECK (length(version) = 20),
    state     TEXT NOT NULL,
    paused    INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS held (
    origin        INTEGER NOT NULL,
    seq           INTEGER NOT NULL,
    at_ns         INTEGER NOT NULL,
    event_id      TEXT,
    object_id     TEXT,
    held_as       TEXT NOT NULL,
    body          BLOB NOT NULL,             -- the exact bytes received
    status        TEXT NOT NULL,             -- held, parked, malformed, resolved, superseded
    superseded_by TEXT,
    detail        TEXT,
    PRIMARY KEY (origin, seq)
);
CREATE INDEX IF NOT EXISTS held_status ON held (status);
CREATE TABLE IF NOT EXISTS replacements (
    origin      INTEGER NOT NULL,
    seq         INTEGER NOT NULL,
    at_ns       INTEGER NOT NULL,
    object_id   TEXT NOT NULL,
    version     TEXT NOT NULL,
    state       TEXT NOT NULL,               -- '': in the audit row's body, see state_at
    cause_event TEXT,                        -- NULL: an authoritative snapshot
    state_at    INTEGER,                     -- byte offset of the state in audit.body of (origin, seq)
    state_len   INTEGER,                     -- its length in bytes
    PRIMARY KEY (origin, seq)
);
CREATE TABLE IF NOT EXISTS audit (
    origin      INTEGER NOT NULL,
    seq         INTEGER NOT NULL,
    at_ns       INTEGER NOT NULL,
    event_id    TEXT,
    object_id   TEXT,
    kind        TEXT NOT NULL,
    decision    TEXT,
    version     TEXT,
    replacement INTEGER NOT NULL,
    detail      TEXT,
    body        BLOB,
    PRIMARY KEY (origin, seq)
);
";

/// What stores created before the retention windows lack, added when they
/// are opened (docs/CONTRACT.md §9): the history's pointer into the audit
/// body, the indexes the purge reads by, and the partial index of paused
/// objects that start-up reads instead of scanning every object.
const RETENTION_SCHEMA: &str = "
CREATE INDEX IF NOT EXISTS audit_at ON audit (at_ns);
CREATE INDEX IF NOT EXISTS replacements_at ON replacements (at_ns);
CREATE INDEX IF NOT EXISTS held_event ON held (event_id);
CREATE INDEX IF NOT EXISTS objects_paused ON objects (object_id) WHERE paused;
";

/// Creates the tables if absent and adds what a store created by an older
/// version lacks (the history's pointer into the audit body, the indexes
/// the purge reads by).
pub(super) fn migrate(conn: &Connection) -> Result<(), StoreError> {
    conn.execute_batch(SCHEMA).map_err(failed)?;
    let columns: Vec<String> = conn
        .prepare("SELECT name FROM pragma_table_info('replacements')")
        .and_then(|mut st| st.query_map([], |r| r.get(0))?.collect())
        .map_err(failed)?;
    if !columns.iter().any(|c| c == "state_at") {
        conn.execute_batch(
            "ALTER TABLE replacements ADD COLUMN state_at INTEGER;
             ALTER TABLE replacements ADD COLUMN state_len INTEGER;",
        )
        .map_err(failed)?;
    }
    conn.execute_batch(RETENTION_SCHEMA).map_err(failed)?;
    Ok(())
}
