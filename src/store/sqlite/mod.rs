//! SQLite (rusqlite, bundled library): the embedded durable store, for one
//! receiver process. WAL journal; `synchronous=FULL` by default, so a commit
//! that returned is on disk (the WAL is fsynced at every commit).
//!
//! Another process may write the file beside it (the `reconcile` and `purge`
//! operator commands): every commit is an `IMMEDIATE` transaction that waits
//! up to [`SqliteOptions::busy_timeout`] for the other's write lock, and its
//! conditions are checked against the stored rows, so a row the other
//! process changed is a [`StoreError::Conflict`], reloaded and decided again.

use super::group::{self, Group, ObjectWrite};
use super::pointer::{self, StateAt};
use super::stats::PhaseClock;
use super::{
    audit_kind, cutoff_ns, ns_time, parse_version, time_ns, verdict, version_text, AuditRow,
    CommitPhases, Expect, HeldKey, HeldRow, HeldStatus, Loaded, ObjectRow, ReceiptRow, Records,
    ReplacementRow, Store, StoreError, VariantRow, Write,
};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The schema, created if absent. Versions are 20-digit zero-padded text
/// (every u64 fits; text order is numeric order); times are nanoseconds
/// since the Unix epoch.
pub(crate) const SCHEMA: &str = "
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
/// body, the indexes the purge reads by.
const RETENTION_SCHEMA: &str = "
CREATE INDEX IF NOT EXISTS audit_at ON audit (at_ns);
CREATE INDEX IF NOT EXISTS replacements_at ON replacements (at_ns);
CREATE INDEX IF NOT EXISTS held_event ON held (event_id);
";

/// Most free pages one `PRAGMA incremental_vacuum` returns to the file
/// system after a purge batch (4 KiB pages: 8 MiB), so that the batch's
/// transaction stays short.
const VACUUM_PAGES: u32 = 2048;

/// How to open a SQLite store.
#[derive(Clone, Debug)]
pub struct SqliteOptions {
    /// `PRAGMA synchronous`: `FULL` (default: a commit survives power loss),
    /// `NORMAL` (a commit survives a process crash but maybe not power loss).
    pub synchronous: String,
    /// How long a commit waits for another connection's lock. Default 5 s.
    pub busy_timeout: Duration,
    /// `PRAGMA max_page_count`, to bound the file (a full file fails commits). Default: none.
    pub max_page_count: Option<u64>,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            synchronous: "FULL".to_owned(),
            busy_timeout: Duration::from_secs(5),
            max_page_count: None,
        }
    }
}

/// The SQLite store.
pub struct SqliteStore {
    /// One connection, used only by the committer thread.
    conn: Connection,
    /// Time spent committing, by phase (see [`Store::phases`]).
    phases: CommitPhases,
}

/// The backend's error as a [`StoreError`]: a value or row over SQLite's
/// size limits (`SQLITE_TOOBIG`) is [`StoreError::Refused`] (committing it
/// again fails again), anything else [`StoreError::Backend`].
fn failed(e: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    let any: &dyn std::any::Any = &e;
    if let Some(e) = any.downcast_ref::<rusqlite::Error>() {
        if e.sqlite_error_code() == Some(rusqlite::ErrorCode::TooBig) {
            return StoreError::Refused {
                cause: format!("sqlite: {e}"),
                body: None,
            };
        }
    }
    StoreError::backend("sqlite", e)
}

/// The operating system's reason a database file at `path` cannot be
/// opened for writing, when there is one to find (SQLite's own message,
/// `unable to open database file`, does not carry it): the file's, or its
/// directory's when the file does not exist.
fn why_not_openable(path: &str) -> Option<String> {
    let file = std::path::Path::new(path);
    if file.exists() {
        return std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(file)
            .err()
            .map(|e| e.to_string());
    }
    let dir = match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => std::path::Path::new("."),
    };
    match std::fs::metadata(dir) {
        Err(e) => Some(format!("directory {}: {e}", dir.display())),
        Ok(meta) if !meta.is_dir() => Some(format!("{} is not a directory", dir.display())),
        Ok(_) => None,
    }
}

fn flag(b: bool) -> i64 {
    i64::from(b)
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path` and its schema.
    ///
    /// # Errors
    /// [`StoreError::Failed`] naming the path when it cannot be opened.
    pub fn open(path: &str, options: SqliteOptions) -> Result<Self, StoreError> {
        let conn = Connection::open(path).map_err(|e| match why_not_openable(path) {
            Some(os) => StoreError::Failed(format!("sqlite: cannot open {path}: {os}")),
            None => StoreError::Failed(format!("sqlite: cannot open {path}: {e}")),
        })?;
        conn.busy_timeout(options.busy_timeout).map_err(failed)?;
        // Before the first table is created, so that a new store returns
        // the pages its purges free (an existing store keeps its mode until
        // `purge --vacuum` rebuilds it).
        conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")
            .map_err(failed)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(failed)?;
        conn.pragma_update(None, "synchronous", &options.synchronous)
            .map_err(failed)?;
        if let Some(pages) = options.max_page_count {
            conn.pragma_update(
                None,
                "max_page_count",
                i64::try_from(pages).unwrap_or(i64::MAX),
            )
            .map_err(failed)?;
        }
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
        Ok(Self {
            conn,
            phases: CommitPhases::default(),
        })
    }

    /// One write of a row-by-row group; `bodies`: the group's delivery
    /// audit rows, where a replacement's state may lie.
    /// Rebuilds the file with `auto_vacuum = INCREMENTAL` (`VACUUM`), for a
    /// store created before this mode was set, so that its purges return
    /// freed pages to the file system from then on; also returns every free
    /// page now. Rewrites the whole file (it needs as much free disk space
    /// again) and holds the write lock meanwhile: run it when no receiver
    /// writes the store (the `purge --vacuum` command).
    ///
    /// # Errors
    /// [`StoreError::Backend`] when SQLite cannot rebuild the file.
    pub fn vacuum(&mut self) -> Result<(), StoreError> {
        self.conn
            .execute_batch("PRAGMA auto_vacuum = INCREMENTAL; VACUUM;")
            .map_err(failed)
    }

    /// The store's `PRAGMA auto_vacuum` mode: 0 none, 1 full, 2 incremental.
    ///
    /// # Errors
    /// [`StoreError::Backend`] when SQLite cannot answer.
    pub fn auto_vacuum(&self) -> Result<i64, StoreError> {
        self.conn
            .query_row("PRAGMA auto_vacuum", [], |r| r.get(0))
            .map_err(failed)
    }

    fn apply(
        tx: &rusqlite::Transaction<'_>,
        write: &Write,
        bodies: &std::collections::HashMap<HeldKey, &AuditRow>,
    ) -> Result<(), StoreError> {
        match write {
            Write::Receipt(r) => insert_receipt(tx, r)?,
            Write::Variant(v) => insert_variant(tx, v)?,
            Write::Object { row, expect } => match *expect {
                Expect::Version { version, paused } => write_object(tx, row, version, paused)?,
                Expect::Absent => {
                    if insert_object_if_absent(tx, row)? == 0 {
                        return Err(exists(&row.object_id));
                    }
                }
                Expect::AtMost(v) => {
                    let n = tx
                        .prepare_cached(
                            "INSERT INTO objects (object_id, version, state, paused) VALUES (?1, ?2, ?3, ?4)
                             ON CONFLICT (object_id) DO UPDATE
                             SET version = excluded.version, state = excluded.state, paused = excluded.paused
                             WHERE objects.version <= ?5",
                        )
                        .and_then(|mut st| {
                            st.execute(params![
                                &*row.object_id,
                                version_text(row.version),
                                row.state,
                                flag(row.paused),
                                version_text(v)
                            ])
                        })
                        .map_err(failed)?;
                    if n == 0 {
                        return Err(changed(&row.object_id));
                    }
                }
            },
            Write::Seed(row) => {
                insert_object_if_absent(tx, row)?;
            }
            Write::Pause { object_id } => {
                let n = tx
                    .prepare_cached("UPDATE objects SET paused = 1 WHERE object_id = ?1")
                    .and_then(|mut st| st.execute(params![&**object_id]))
                    .map_err(failed)?;
                if n == 0 {
                    return Err(StoreError::Conflict(format!(
                        "object {object_id} to pause is not stored"
                    )));
                }
            }
            Write::Check {
                object_id,
                version,
                paused,
            } => check_object(tx, object_id, *version, *paused)?,
            Write::Held(h) => insert_held(tx, h)?,
            Write::HeldStatus {
                key,
                status,
                superseded_by,
            } => {
                tx.prepare_cached(
                    "UPDATE held SET status = ?3, superseded_by = ?4 WHERE origin = ?1 AND seq = ?2",
                )
                .and_then(|mut st| {
                    st.execute(params![
                        key.origin as i64,
                        key.seq as i64,
                        status.as_str(),
                        superseded_by.map(version_text)
                    ])
                })
                .map_err(failed)?;
            }
            Write::Replacement(r) => insert_replacement(tx, r, pointer::state_at(bodies, r))?,
            Write::Audit(a) => insert_audit(tx, a)?,
        }
        Ok(())
    }

    /// A folded group: each table's rows together, one write (or check) per
    /// object; every statement prepared once per connection.
    fn apply_group(tx: &rusqlite::Transaction<'_>, group: &Group<'_>) -> Result<(), StoreError> {
        for r in &group.receipts {
            insert_receipt(tx, r)?;
        }
        for v in &group.variants {
            insert_variant(tx, v)?;
        }
        for o in &group.objects {
            let read_version = o.read_version.map(version_text);
            let read_paused = o.read_paused.map(flag);
            // Each condition applies only when a decision of the group read
            // it (see `ObjectStep`); the row is found by its key either way.
            let n = match &o.write {
                ObjectWrite::Check => tx
                    .prepare_cached(
                        "SELECT count(*) FROM objects WHERE object_id = ?1
                         AND (?2 IS NULL OR version = ?2) AND (?3 IS NULL OR paused = ?3)",
                    )
                    .and_then(|mut st| {
                        st.query_row(params![&**o.object_id, read_version, read_paused], |r| {
                            r.get::<_, i64>(0)
                        })
                    })
                    .map(|n| n as usize),
                ObjectWrite::Pause => tx
                    .prepare_cached(
                        "UPDATE objects SET paused = 1 WHERE object_id = ?1
                         AND (?2 IS NULL OR version = ?2) AND (?3 IS NULL OR paused = ?3)",
                    )
                    .and_then(|mut st| {
                        st.execute(params![&**o.object_id, read_version, read_paused])
                    }),
                ObjectWrite::Row(row) => tx
                    .prepare_cached(
                        "UPDATE objects SET version = ?2, state = ?3, paused = ?4 WHERE object_id = ?1
                         AND (?5 IS NULL OR version = ?5) AND (?6 IS NULL OR paused = ?6)",
                    )
                    .and_then(|mut st| {
                        st.execute(params![
                            &**o.object_id,
                            version_text(row.version),
                            row.state,
                            flag(row.paused),
                            read_version,
                            read_paused
                        ])
                    }),
            }
            .map_err(failed)?;
            if n == 0 {
                return Err(changed(o.object_id));
            }
        }
        for h in &group.held {
            insert_held(tx, h)?;
        }
        for a in &group.audit {
            insert_audit(tx, a)?;
        }
        let bodies = pointer::delivery_bodies(group.audit.iter().copied());
        for r in &group.replacements {
            insert_replacement(tx, r, pointer::state_at(&bodies, r))?;
        }
        Ok(())
    }

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
}

impl SqliteStore {
    /// Runs `writes` in one transaction and commits it (`keep`) or rolls it
    /// back ([`Store::probe`]).
    fn run(&mut self, writes: &[Write], keep: bool) -> Result<(), StoreError> {
        let mut clock = PhaseClock::start();
        let group = group::fold(writes);
        clock.lap(&mut self.phases.encode);
        // One transaction per group: with `synchronous=FULL`, one fsync.
        // Dropping `tx` on an error rolls the transaction back.
        let executed = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(failed)
            .and_then(|tx| {
                match &group {
                    Some(group) => Self::apply_group(&tx, group)?,
                    None => {
                        let bodies = pointer::bodies_of(writes);
                        for w in writes {
                            Self::apply(&tx, w, &bodies)?;
                        }
                    }
                }
                Ok(tx)
            });
        clock.lap(&mut self.phases.execute);
        if !keep {
            return executed.and_then(|tx| tx.rollback().map_err(failed));
        }
        let result = executed.and_then(|tx| tx.commit().map_err(failed));
        clock.lap(&mut self.phases.commit);
        result
    }
}

impl Store for SqliteStore {
    fn commit(&mut self, writes: &[Write]) -> Result<(), StoreError> {
        self.run(writes, true)
    }

    fn probe(&mut self, writes: &[Write]) -> Result<(), StoreError> {
        self.run(writes, false)
    }

    fn load(&mut self, receipts_since: SystemTime) -> Result<Loaded, StoreError> {
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

    fn refresh(
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

    fn refresh_variants(&mut self, event_ids: &[Arc<str>]) -> Result<Vec<VariantRow>, StoreError> {
        let mut found = Vec::new();
        for id in event_ids {
            found.extend(self.variants_where("WHERE event_id = ?1", &&**id)?);
        }
        Ok(found)
    }

    fn purge_receipts(&mut self, before: SystemTime) -> Result<u64, StoreError> {
        let mut removed = 0;
        for table in ["receipts", "receipt_variants"] {
            removed += self
                .conn
                .execute(
                    &format!("DELETE FROM {table} WHERE first_seen_ns < ?1"),
                    [time_ns(before)],
                )
                .map(|n| n as u64)
                .map_err(failed)?;
        }
        Ok(removed)
    }

    fn purge_records(
        &mut self,
        records: Records,
        before: SystemTime,
        limit: usize,
    ) -> Result<u64, StoreError> {
        let before = time_ns(before);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(failed)?;
        let removed = match records {
            Records::Audit => purge_audit(&tx, before, limit)?,
            Records::History => tx
                .prepare_cached(
                    "DELETE FROM replacements WHERE rowid IN
                     (SELECT rowid FROM replacements WHERE at_ns < ?1 ORDER BY at_ns LIMIT ?2)",
                )
                .and_then(|mut st| st.execute(params![before, limit]))
                .map(|n| n as u64)
                .map_err(failed)?,
            Records::Resolved => tx
                .prepare_cached(
                    "DELETE FROM held WHERE rowid IN (SELECT rowid FROM held
                     WHERE status = 'resolved' AND at_ns < ?1 LIMIT ?2)",
                )
                .and_then(|mut st| st.execute(params![before, limit]))
                .map(|n| n as u64)
                .map_err(failed)?,
        };
        if removed > 0 {
            // Returns the pages the batch freed (a no-op on a store created
            // without `auto_vacuum`: see `purge --vacuum`).
            // Stepped to the end: the pragma frees one page per row it
            // returns (`execute_batch` would step it once).
            let mut st = tx
                .prepare(&format!("PRAGMA incremental_vacuum({VACUUM_PAGES})"))
                .map_err(failed)?;
            let mut pages = st.query([]).map_err(failed)?;
            while pages.next().map_err(failed)?.is_some() {}
            drop(pages);
            drop(st);
        }
        tx.commit().map_err(failed)?;
        Ok(removed)
    }

    fn replacements_since(&mut self, after: u64) -> Result<Vec<ReplacementRow>, StoreError> {
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

    fn phases(&self) -> CommitPhases {
        self.phases
    }

    fn audit(&mut self) -> Result<Vec<AuditRow>, StoreError> {
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

/// One batch of the audit purge: at most `limit` audit rows recorded before
/// `before` that justify nothing still held (docs/CONTRACT.md §9: not a row
/// of an event identity or step whose held row is not resolved, not a row
/// of a paused object), nor the rows of the highest sequence number, from
/// which a restarted receiver numbers its steps (so an outbox cursor stays
/// valid however much is purged). A history row
/// that takes its state from a deleted audit row gets the state copied in
/// first. Returns the rows deleted.
fn purge_audit(tx: &rusqlite::Transaction<'_>, before: i64, limit: i64) -> Result<u64, StoreError> {
    let rows: Vec<(i64, i64, i64)> = tx
        .prepare_cached(
            "SELECT a.rowid, a.origin, a.seq FROM audit AS a
             WHERE a.at_ns < ?1 AND a.seq < (SELECT max(seq) FROM audit)
               AND NOT EXISTS (SELECT 1 FROM held AS h WHERE h.status <> 'resolved'
                               AND h.origin = a.origin AND h.seq = a.seq)
               AND NOT EXISTS (SELECT 1 FROM held AS h WHERE h.status <> 'resolved'
                               AND h.event_id = a.event_id)
               AND NOT EXISTS (SELECT 1 FROM objects AS o WHERE o.paused = 1
                               AND o.object_id = a.object_id)
             ORDER BY a.at_ns LIMIT ?2",
        )
        .and_then(|mut st| {
            st.query_map(params![before, limit], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })?
            .collect()
        })
        .map_err(failed)?;
    let mut removed = 0;
    for (rowid, origin, seq) in &rows {
        tx.prepare_cached(
            "UPDATE replacements SET
                 state = (SELECT CAST(substr(a.body, replacements.state_at + 1, replacements.state_len) AS TEXT)
                          FROM audit AS a WHERE a.rowid = ?1),
                 state_at = NULL, state_len = NULL
             WHERE origin = ?2 AND seq = ?3 AND state_at IS NOT NULL",
        )
        .and_then(|mut st| st.execute(params![rowid, origin, seq]))
        .map_err(failed)?;
        removed += tx
            .prepare_cached("DELETE FROM audit WHERE rowid = ?1")
            .and_then(|mut st| st.execute([rowid]))
            .map_err(failed)? as u64;
    }
    Ok(removed)
}

/// The conflict of an object an event created that another writer created
/// first.
fn exists(object_id: &str) -> StoreError {
    StoreError::Conflict(format!("object {object_id} to create exists already"))
}

/// The conflict of an object whose row is no longer as the decision read it.
fn changed(object_id: &str) -> StoreError {
    StoreError::Conflict(format!("object {object_id} changed since it was read"))
}

/// Inserts a receipt, replacing one that expired by the row's retention
/// cut-off (docs/CONTRACT.md §5: the purge may not have run yet), and
/// deletes the variants recorded before it: they belonged to the expired
/// receipt (or to one already purged). A live receipt is a conflict
/// (another receiver recorded the identity first).
fn insert_receipt(tx: &rusqlite::Transaction<'_>, r: &ReceiptRow) -> Result<(), StoreError> {
    let n = tx
        .prepare_cached(
            "INSERT INTO receipts (event_id, fingerprint, object_id, decision, first_seen_ns)
             VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (event_id) DO UPDATE
             SET fingerprint = excluded.fingerprint, object_id = excluded.object_id,
                 decision = excluded.decision, first_seen_ns = excluded.first_seen_ns
             WHERE receipts.first_seen_ns <= ?6",
        )
        .and_then(|mut st| {
            st.execute(params![
                &*r.event_id,
                &r.fingerprint.to_le_bytes()[..],
                &*r.object_id,
                r.decision.code(),
                time_ns(r.first_seen),
                cutoff_ns(r.retention_cutoff)
            ])
        })
        .map_err(failed)?;
    if n == 0 {
        return Err(StoreError::Conflict(format!(
            "receipt for {} already exists",
            r.event_id
        )));
    }
    tx.prepare_cached("DELETE FROM receipt_variants WHERE event_id = ?1 AND first_seen_ns < ?2")
        .and_then(|mut st| st.execute(params![&*r.event_id, time_ns(r.first_seen)]))
        .map_err(failed)?;
    Ok(())
}

/// [`Write::Variant`]: the variant's row, unique on (event id, fingerprint);
/// an existing row means another process (or an earlier run) recorded this
/// variant first: a conflict, after which the copy is decided again as its
/// duplicate.
fn insert_variant(tx: &rusqlite::Transaction<'_>, v: &VariantRow) -> Result<(), StoreError> {
    let n = tx
        .prepare_cached(
            "INSERT INTO receipt_variants (event_id, fingerprint, object_id, first_seen_ns)
             VALUES (?1, ?2, ?3, ?4) ON CONFLICT (event_id, fingerprint) DO NOTHING",
        )
        .and_then(|mut st| {
            st.execute(params![
                &*v.event_id,
                &v.fingerprint.to_le_bytes()[..],
                &*v.object_id,
                time_ns(v.first_seen)
            ])
        })
        .map_err(failed)?;
    if n == 0 {
        return Err(StoreError::Conflict(format!(
            "variant {:032x} of {} already recorded",
            v.fingerprint, v.event_id
        )));
    }
    Ok(())
}

/// Inserts `row` unless its object has a row already; the number of rows
/// inserted (0 or 1).
fn insert_object_if_absent(
    tx: &rusqlite::Transaction<'_>,
    row: &ObjectRow,
) -> Result<usize, StoreError> {
    tx.prepare_cached(
        "INSERT INTO objects (object_id, version, state, paused) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (object_id) DO NOTHING",
    )
    .and_then(|mut st| {
        st.execute(params![
            &*row.object_id,
            version_text(row.version),
            row.state,
            flag(row.paused)
        ])
    })
    .map_err(failed)
}

/// Writes an object row if the stored row still has the version and pause
/// flag the decision read (a replacement also needs the stored version
/// below the new one: the conditional update of a transactional inbox).
fn write_object(
    tx: &rusqlite::Transaction<'_>,
    row: &ObjectRow,
    read_version: u64,
    read_paused: bool,
) -> Result<(), StoreError> {
    let sql = if row.version > read_version {
        "UPDATE objects SET version = ?2, state = ?3, paused = ?4
         WHERE object_id = ?1 AND version < ?2 AND version = ?5 AND paused = ?6"
    } else {
        "UPDATE objects SET version = ?2, state = ?3, paused = ?4
         WHERE object_id = ?1 AND version = ?5 AND paused = ?6"
    };
    let n = tx
        .prepare_cached(sql)
        .and_then(|mut st| {
            st.execute(params![
                &*row.object_id,
                version_text(row.version),
                row.state,
                flag(row.paused),
                version_text(read_version),
                flag(read_paused)
            ])
        })
        .map_err(failed)?;
    if n == 0 {
        return Err(changed(&row.object_id));
    }
    Ok(())
}

/// Checks that a row the decision read and did not change is still as read.
fn check_object(
    tx: &rusqlite::Transaction<'_>,
    object_id: &str,
    version: u64,
    paused: bool,
) -> Result<(), StoreError> {
    let found: Option<i64> = tx
        .prepare_cached(
            "SELECT 1 FROM objects WHERE object_id = ?1 AND version = ?2 AND paused = ?3",
        )
        .and_then(|mut st| {
            st.query_row(
                params![object_id, version_text(version), flag(paused)],
                |r| r.get(0),
            )
            .optional()
        })
        .map_err(failed)?;
    match found {
        Some(_) => Ok(()),
        None => Err(changed(object_id)),
    }
}

fn insert_held(tx: &rusqlite::Transaction<'_>, h: &HeldRow) -> Result<(), StoreError> {
    tx.prepare_cached(
        "INSERT INTO held (origin, seq, at_ns, event_id, object_id, held_as, body, status, superseded_by, detail)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )
    .and_then(|mut st| {
        st.execute(params![
            h.key.origin as i64,
            h.key.seq as i64,
            time_ns(h.at),
            h.event_id.as_deref(),
            h.object_id.as_deref(),
            h.held_as.code(),
            &h.body[..],
            h.status.as_str(),
            h.superseded_by.map(version_text),
            h.detail
        ])
    })
    .map_err(failed)?;
    Ok(())
}

/// A history row; with `at`, its state is not stored again but read from
/// the body of its step's audit row (see [`pointer::state_at`]).
fn insert_replacement(
    tx: &rusqlite::Transaction<'_>,
    r: &ReplacementRow,
    at: StateAt,
) -> Result<(), StoreError> {
    tx.prepare_cached(
        "INSERT INTO replacements (origin, seq, at_ns, object_id, version, state, cause_event, state_at, state_len)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    )
    .and_then(|mut st| {
        st.execute(params![
            r.key.origin as i64,
            r.key.seq as i64,
            time_ns(r.at),
            &*r.object_id,
            version_text(r.version),
            pointer::state_column(r, at),
            r.cause_event.as_deref(),
            at.map(|(offset, _)| offset),
            at.map(|(_, len)| len)
        ])
    })
    .map_err(failed)?;
    Ok(())
}

fn insert_audit(tx: &rusqlite::Transaction<'_>, a: &AuditRow) -> Result<(), StoreError> {
    tx.prepare_cached(
        "INSERT INTO audit (origin, seq, at_ns, event_id, object_id, kind, decision, version, replacement, detail, body)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    )
    .and_then(|mut st| {
        st.execute(params![
            a.key.origin as i64,
            a.key.seq as i64,
            time_ns(a.at),
            a.event_id.as_deref(),
            a.object_id.as_deref(),
            a.kind,
            a.decision,
            a.version.map(version_text),
            flag(a.replacement),
            a.detail,
            a.body.as_deref()
        ])
    })
    .map_err(failed)?;
    Ok(())
}
