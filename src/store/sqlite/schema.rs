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
    position    INTEGER,                     -- outbox position, in commit order (see OUTBOX_SCHEMA)
    trace_context TEXT,                      -- W3C traceparent [LF tracestate]; NULL: none
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
    body        BLOB,                        -- NULL with body_seq: see REPEAT_SCHEMA
    body_seq    INTEGER,                     -- the row of this origin holding the same bytes
    PRIMARY KEY (origin, seq)
);
";

/// A redelivery's exact bytes stored once (docs/CONTRACT.md §9): an audit
/// row whose `body_seq` is set keeps no `body`; its bytes are those of the
/// audit row (`origin`, `body_seq`). The purge finds the rows pointing at a
/// row it deletes by this index, and copies the bytes into them first. A
/// store created before it gains the column (`NULL`: every body in place)
/// when opened.
const REPEAT_SCHEMA: &str = "
CREATE INDEX IF NOT EXISTS audit_body_seq ON audit (origin, body_seq) WHERE body_seq IS NOT NULL;
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

/// The outbox's positions and the relays (docs/CONTRACT.md §10): the one
/// row of `outbox` holds the last position given. A history row inserted
/// takes the next one (`insert_replacement`), and this trigger counts it in
/// the same transaction; SQLite lets one writer at a time commit, so
/// positions follow commit order, without gaps.
const OUTBOX_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS outbox (
    one  INTEGER PRIMARY KEY CHECK (one = 1),
    last INTEGER NOT NULL                    -- the last outbox position given
);
CREATE UNIQUE INDEX IF NOT EXISTS replacements_position ON replacements (position);
CREATE TRIGGER IF NOT EXISTS replacements_count_position AFTER INSERT ON replacements
BEGIN UPDATE outbox SET last = last + 1; END;
CREATE TABLE IF NOT EXISTS relays (
    name           TEXT PRIMARY KEY,
    position       INTEGER NOT NULL,         -- every effect up to it delivered or parked
    generation     INTEGER NOT NULL,         -- raised by operators and new owners
    owner          TEXT,                     -- the run holding the lease
    lease_until_ns INTEGER,
    updated_ns     INTEGER NOT NULL,
    backlogged_since_ns INTEGER,             -- as of its last save; NULL: not backlogged
    parked_bytes   INTEGER                   -- its parked heads' bytes then; NULL: not recorded
);
CREATE TABLE IF NOT EXISTS relay_parked (
    relay      TEXT NOT NULL,
    position   INTEGER NOT NULL,             -- the effect's outbox position
    object_id  TEXT NOT NULL,
    status     TEXT NOT NULL,                -- retrying, failed, waiting
    attempts   INTEGER NOT NULL,
    due_ns     INTEGER,
    error      TEXT,
    updated_ns INTEGER NOT NULL,
    PRIMARY KEY (relay, position)
);
CREATE INDEX IF NOT EXISTS relay_parked_position ON relay_parked (position);
";

/// What a reconciler keeps for the operator (docs/CONTRACT.md §4): one row
/// per object waiting for an authority after a fetch that did not settle
/// it, deleted when the object converges. A store created before it gains
/// the table when opened; `inspect` reads a store without it as having
/// none.
pub(crate) const AUTHORITY_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS authority_waits (
    object_id   TEXT PRIMARY KEY,
    reasons     TEXT NOT NULL,               -- why it waits: paused,missing_version, ...
    outcome     TEXT NOT NULL,               -- the last fetch's: older, absent, unavailable, ...
    error       TEXT NOT NULL,               -- that outcome in words
    attempts    INTEGER NOT NULL,            -- fetches made by the process that wrote it
    since_ns    INTEGER NOT NULL,            -- waiting since (that process's first note)
    next_try_ns INTEGER,                     -- its next fetch; NULL: none planned
    at_ns       INTEGER NOT NULL             -- when the outcome came
);
";

/// Gives every history row of a store created before outbox positions one,
/// after the highest given (`?1`), in the order they were inserted, and
/// starts the counter after them.
const BACKFILL_POSITIONS: &str = "
UPDATE replacements SET position = ?1 + n.k
FROM (SELECT rowid AS r, row_number() OVER (ORDER BY rowid) AS k
      FROM replacements WHERE position IS NULL) AS n
WHERE replacements.rowid = n.r";

/// Runs `alter` when `table` has no column `column` (a store an older
/// version created).
fn add_if_missing(
    conn: &Connection,
    table: &str,
    column: &str,
    alter: &str,
) -> Result<(), StoreError> {
    let present: bool = conn
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2)",
            [table, column],
            |r| r.get(0),
        )
        .map_err(failed)?;
    if !present {
        conn.execute_batch(alter).map_err(failed)?;
    }
    Ok(())
}

/// Creates the tables if absent and adds what a store created by an older
/// version lacks (the history's pointer into the audit body, the indexes
/// the purge reads by, the outbox positions and the relays, the history's
/// trace context, the reconciler's last errors, the audit's pointer to a
/// repeated body, the relays' backlog).
pub(super) fn migrate(conn: &Connection) -> Result<(), StoreError> {
    conn.execute_batch(SCHEMA).map_err(failed)?;
    add_if_missing(
        conn,
        "replacements",
        "state_at",
        "ALTER TABLE replacements ADD COLUMN state_at INTEGER;
         ALTER TABLE replacements ADD COLUMN state_len INTEGER;",
    )?;
    conn.execute_batch(RETENTION_SCHEMA).map_err(failed)?;
    add_if_missing(
        conn,
        "replacements",
        "position",
        "ALTER TABLE replacements ADD COLUMN position INTEGER;",
    )?;
    conn.execute_batch(OUTBOX_SCHEMA).map_err(failed)?;
    // The trace context an applied delivery came with (docs/CONTRACT.md
    // §10); the rows already there have none.
    add_if_missing(
        conn,
        "replacements",
        "trace_context",
        "ALTER TABLE replacements ADD COLUMN trace_context TEXT;",
    )?;
    conn.execute_batch(AUTHORITY_SCHEMA).map_err(failed)?;
    add_if_missing(
        conn,
        "audit",
        "body_seq",
        "ALTER TABLE audit ADD COLUMN body_seq INTEGER;",
    )?;
    conn.execute_batch(REPEAT_SCHEMA).map_err(failed)?;
    // The relays' backlog (docs/CONTRACT.md §9), kept with each save; a
    // relay of an older store has it unknown until its next save.
    add_if_missing(
        conn,
        "relays",
        "parked_bytes",
        "ALTER TABLE relays ADD COLUMN backlogged_since_ns INTEGER;
         ALTER TABLE relays ADD COLUMN parked_bytes INTEGER;",
    )?;
    let unnumbered: bool = conn
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM replacements WHERE position IS NULL)
             OR NOT EXISTS (SELECT 1 FROM outbox)",
            [],
            |r| r.get(0),
        )
        .map_err(failed)?;
    if unnumbered {
        let tx =
            rusqlite::Transaction::new_unchecked(conn, rusqlite::TransactionBehavior::Immediate)
                .map_err(failed)?;
        let highest: i64 = tx
            .query_row(
                "SELECT coalesce(max(position), 0) FROM replacements",
                [],
                |r| r.get(0),
            )
            .map_err(failed)?;
        tx.execute(BACKFILL_POSITIONS, [highest]).map_err(failed)?;
        tx.execute(
            "INSERT OR IGNORE INTO outbox (one, last)
             VALUES (1, (SELECT coalesce(max(position), 0) FROM replacements))",
            [],
        )
        .map_err(failed)?;
        tx.commit().map_err(failed)?;
    }
    Ok(())
}
