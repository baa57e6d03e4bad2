//! SQLite (rusqlite, bundled library): the embedded durable store, for one
//! receiver process. WAL journal; `synchronous=FULL` by default, so a commit
//! that returned is on disk (the WAL is fsynced at every commit).
//!
//! Another process may write the file beside it (the `reconcile` and `purge`
//! operator commands): every commit is an `IMMEDIATE` transaction that waits
//! up to [`SqliteOptions::busy_timeout`] for the other's write lock, and its
//! conditions are checked against the stored rows, so a row the other
//! process changed is a [`StoreError::Conflict`], reloaded and decided again.
//!
//! No commit runs a checkpoint: a thread of the store's own copies the WAL
//! into the file beside the committer (`checkpoint.rs`).

mod checkpoint;
mod outbox;
mod read;
mod schema;
mod write;

pub(super) use read::SqliteReadOnly;

use super::{
    load, AuditRow, CommitPhases, EffectRow, Loaded, ObjectRow, ObjectSource, OutboxStore,
    ReceiptRow, Records, Store, StoreError, VariantRow, Write,
};
use rusqlite::Connection;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

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
    /// WAL added since the last checkpoint after which the store's
    /// checkpoint thread copies it into the file, bytes (in whole pages).
    /// Default 16 MiB: the longer the interval, the fewer copies of a page
    /// that many commits change.
    pub checkpoint_bytes: u64,
    /// The most WAL a commit leaves before it waits for the checkpoint
    /// thread to start the WAL over, bytes (in whole pages); from half of
    /// it, the commit after a checkpoint waits so. The WAL file stays
    /// within this plus one group's pages, unless a reader holds a
    /// snapshot past the busy timeout. Default 64 MiB.
    pub wal_bound_bytes: u64,
    /// The page cache of each connection the store opens (the committer's,
    /// its checkpoint thread's, each shard's, a relay's or reconciler's),
    /// bytes (`PRAGMA cache_size`, in whole KiB). Default
    /// [`CONNECTION_CACHE_BYTES`]; a receiver sets it from its memory
    /// budget's store part ([`crate::MemoryBudget::store`]).
    pub cache_bytes: usize,
}

/// The page cache of a SQLite connection by default, bytes: SQLite's own
/// default (2,000 KiB).
pub const CONNECTION_CACHE_BYTES: usize = 2_000 << 10;

/// The smallest page cache a receiver gives a SQLite connection, bytes.
const MIN_CONNECTION_CACHE_BYTES: usize = 256 << 10;

/// The page cache of each of `connections` SQLite connections sharing
/// `part` bytes: `part` divided among them, from 256 KiB to
/// [`CONNECTION_CACHE_BYTES`] each.
pub(crate) fn connection_cache(part: usize, connections: usize) -> usize {
    (part / connections.max(1)).clamp(MIN_CONNECTION_CACHE_BYTES, CONNECTION_CACHE_BYTES)
}

/// Sets the page cache of `conn` to `bytes` (`PRAGMA cache_size` in KiB,
/// given negative).
fn set_cache(conn: &Connection, bytes: usize) -> rusqlite::Result<()> {
    let kib = i64::try_from(bytes / 1024).unwrap_or(i64::MAX).max(1);
    conn.pragma_update(None, "cache_size", -kib)
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            synchronous: "FULL".to_owned(),
            busy_timeout: Duration::from_secs(5),
            max_page_count: None,
            checkpoint_bytes: CHECKPOINT_BYTES,
            wal_bound_bytes: WAL_BOUND_BYTES,
            cache_bytes: CONNECTION_CACHE_BYTES,
        }
    }
}

/// The page size of a store this version creates, bytes. A commit writes
/// every page it changed, whole, to the WAL, and a checkpoint writes it
/// again into the file; most of a delivery's pages are changed at a random
/// place (its object's row, its receipt's key), so the page is most of
/// what a delivery writes. With [`CHECKPOINT_BYTES`], measured by
/// `benches/store-writes.sh` (`write_bytes`, 64 producers, batch 64,
/// 200,000 deliveries; docs/BENCHMARKS.md): 14 % fewer bytes written per
/// delivery than 4 KiB pages checkpointed every 1,000 at 1,000 objects,
/// 27 % at 100,000, for 6 % more file. By the bench's page model, 1 KiB
/// pages write less still at 100,000 objects but more at 1,000, and keep
/// 16 to 23 % more file (an audit row of a 250-byte body fills half a
/// page).
const PAGE_SIZE: i64 = 2048;

/// How much WAL grows before the checkpoint thread copies it into the
/// file ([`SqliteOptions::checkpoint_bytes`]), bytes. A checkpoint writes each page the WAL holds once, however
/// many commits changed it since the last one: the longer the interval,
/// the fewer copies (the bench's page model, 2 KiB pages: 11 % fewer bytes
/// per delivery than at 4 MiB with 1,000 objects, 12 % with 100,000), for
/// a WAL file of up to a few times this size beside the store.
const CHECKPOINT_BYTES: u64 = 16 * 1024 * 1024;

/// The default bound of the WAL ([`SqliteOptions::wal_bound_bytes`]).
const WAL_BOUND_BYTES: u64 = 64 * 1024 * 1024;

/// The SQLite store.
pub struct SqliteStore {
    /// The checkpoint thread and the WAL's frame count its hooks report;
    /// `None` for a database without a WAL file (in memory, temporary),
    /// whose commits checkpoint nothing. Declared before `conn` so that
    /// the thread's connection closes first and the committer's last
    /// close copies what is left.
    checkpointer: Option<checkpoint::Checkpointer>,
    /// One connection, used only by the committer thread.
    conn: Connection,
    /// The checkpoint interval, in pages of this store.
    checkpoint_pages: i64,
    /// Time spent committing, by phase (see [`Store::phases`]).
    phases: CommitPhases,
    /// How every connection it opens is set up (the lock wait and page
    /// cache of [`SqliteOptions`]), the shards' own read connections too.
    connect: Connect,
    /// The bodies this store committed in place lately, which a
    /// redelivery's audit row may point at instead of storing them again.
    recent: crate::store::repeat::RecentBodies,
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

/// How the store's other connections are set up: as its own.
#[derive(Clone, Copy, Debug)]
pub(super) struct Connect {
    /// How long a connection waits for a lock.
    pub(super) busy_timeout: std::time::Duration,
    /// Its page cache, bytes.
    pub(super) cache_bytes: usize,
}

impl Connect {
    /// Sets `conn`'s busy timeout and page cache.
    pub(super) fn apply(self, conn: &Connection) -> rusqlite::Result<()> {
        conn.busy_timeout(self.busy_timeout)?;
        set_cache(conn, self.cache_bytes)
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path` and its schema.
    ///
    /// # Errors
    /// [`StoreError::Failed`] naming the path when it cannot be opened;
    /// [`StoreError::NotAStore`] naming it when the file is not a SQLite
    /// database.
    pub fn open(path: &str, options: SqliteOptions) -> Result<Self, StoreError> {
        let mut conn = Connection::open(path).map_err(|e| match why_not_openable(path) {
            Some(os) => StoreError::Failed(format!("sqlite: cannot open {path}: {os}")),
            None => StoreError::Failed(format!("sqlite: cannot open {path}: {e}")),
        })?;
        let connect = Connect {
            busy_timeout: options.busy_timeout,
            cache_bytes: options.cache_bytes,
        };
        connect.apply(&conn).map_err(failed)?;
        // The first reads of the file: one that is not a database is named
        // as the reader names it (`StoreReader::open`).
        let opening = |e: rusqlite::Error| {
            if e.sqlite_error_code() == Some(rusqlite::ErrorCode::NotADatabase) {
                StoreError::NotAStore(format!("sqlite:{path}: the file is not a SQLite database"))
            } else {
                failed(e)
            }
        };
        // A new store's page size ([`PAGE_SIZE`]) first: SQLite fixes it
        // as soon as another pragma reads the file. An existing store
        // keeps its own.
        conn.pragma_update(None, "page_size", PAGE_SIZE)
            .map_err(opening)?;
        // Before the first table is created, so that a new store returns
        // the pages its purges free (an existing store keeps its mode until
        // `purge --vacuum` rebuilds it).
        conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")
            .map_err(opening)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(opening)?;
        let page_size: i64 = conn
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .map_err(failed)?;
        let pages = |bytes: u64| {
            i64::try_from(bytes / page_size.max(512) as u64)
                .unwrap_or(i64::MAX)
                .max(1)
        };
        let checkpoint_pages = pages(options.checkpoint_bytes);
        let journal: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .map_err(failed)?;
        let file = conn.path().filter(|p| !p.is_empty()).map(str::to_owned);
        let checkpointer = match file {
            Some(file) if journal.eq_ignore_ascii_case("wal") => {
                let checkpointer = checkpoint::Checkpointer::start(
                    &file,
                    &options.synchronous,
                    connect,
                    checkpoint_pages as u64,
                    pages(options.wal_bound_bytes) as u64,
                )
                .map_err(|e| {
                    StoreError::Failed(format!("sqlite: cannot open {path} for checkpoints: {e}"))
                })?;
                // The hook replaces SQLite's automatic checkpoint.
                checkpointer.watch.watch(&mut conn).map_err(failed)?;
                Some(checkpointer)
            }
            _ => {
                conn.pragma_update(None, "wal_autocheckpoint", checkpoint_pages)
                    .map_err(failed)?;
                None
            }
        };
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
        schema::migrate(&conn)?;
        Ok(Self {
            checkpointer,
            conn,
            checkpoint_pages,
            phases: CommitPhases::default(),
            connect,
            recent: Default::default(),
        })
    }

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

    /// The store's page size (`PRAGMA page_size`, fixed when the file was
    /// created) and how many pages of WAL are added between two
    /// checkpoints ([`SqliteOptions::checkpoint_bytes`] in pages: 16 MiB by
    /// default).
    ///
    /// # Errors
    /// [`StoreError::Backend`] when SQLite cannot answer.
    pub fn pages(&self) -> Result<(i64, i64), StoreError> {
        let page_size = self
            .conn
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .map_err(failed)?;
        Ok((page_size, self.checkpoint_pages))
    }

    /// After a commit: waits for the checkpoint thread to start the WAL
    /// over when the commit left it at its bound (see `checkpoint.rs`).
    fn hold_at_bound(&self) {
        if let Some(c) = &self.checkpointer {
            c.watch.hold_at_bound();
        }
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
}

impl Store for SqliteStore {
    fn commit(&mut self, writes: &[Write]) -> Result<(), StoreError> {
        self.run(writes, true)
    }

    fn probe(&mut self, writes: &[Write]) -> Result<(), StoreError> {
        self.run(writes, false)
    }

    fn load(&mut self, receipts_since: SystemTime) -> Result<Loaded, StoreError> {
        self.loaded(receipts_since, load::Objects::All)
    }

    fn load_resident(&mut self, receipts_since: SystemTime) -> Result<Loaded, StoreError> {
        self.loaded(receipts_since, load::Objects::Pinned)
    }

    fn object_source(&mut self) -> Result<Option<Box<dyn ObjectSource>>, StoreError> {
        // A database only this connection sees (in memory, or a temporary
        // file) cannot be read from another: keep every object in memory.
        let path = match self.conn.path() {
            Some(p) if !p.is_empty() => p.to_owned(),
            _ => return Ok(None),
        };
        let source = read::SqliteObjects::open(&path, self.connect)?;
        Ok(Some(Box::new(source)))
    }

    fn outbox_store(&mut self) -> Result<Option<Box<dyn OutboxStore>>, StoreError> {
        // A database only this connection sees has no second connection.
        match self.conn.path() {
            Some(p) if !p.is_empty() => {
                let watch = self.checkpointer.as_ref().map(|c| &c.watch);
                Ok(Some(Box::new(outbox::open(p, self.connect, watch)?)))
            }
            _ => Ok(None),
        }
    }

    fn authority_store(
        &mut self,
    ) -> Result<Option<Box<dyn crate::store::AuthorityStore>>, StoreError> {
        // As for relays: a database only this connection sees has none.
        match self.conn.path() {
            Some(p) if !p.is_empty() => {
                let watch = self.checkpointer.as_ref().map(|c| &c.watch);
                let conn = outbox::connect(p, self.connect, "a reconciler", watch)?;
                Ok(Some(Box::new(crate::store::authority::SqlAuthority::new(
                    conn,
                ))))
            }
            _ => Ok(None),
        }
    }

    fn objects(&mut self) -> Result<Vec<ObjectRow>, StoreError> {
        self.all_objects()
    }

    fn refresh(
        &mut self,
        objects: &[Arc<str>],
        receipts: &[Arc<str>],
    ) -> Result<(Vec<ObjectRow>, Vec<ReceiptRow>), StoreError> {
        self.refreshed(objects, receipts)
    }

    fn refresh_variants(&mut self, event_ids: &[Arc<str>]) -> Result<Vec<VariantRow>, StoreError> {
        self.variants_of(event_ids)
    }

    fn purge_receipts(&mut self, before: SystemTime) -> Result<u64, StoreError> {
        self.purge_identities(before)
    }

    fn purge_records(
        &mut self,
        records: Records,
        before: SystemTime,
        limit: usize,
    ) -> Result<u64, StoreError> {
        self.purge_batch(records, before, limit)
    }

    fn replacements_since(&mut self, after: u64) -> Result<Vec<EffectRow>, StoreError> {
        self.replacements_after(after)
    }

    fn phases(&self) -> CommitPhases {
        self.phases
    }
    fn audit(&mut self) -> Result<Vec<AuditRow>, StoreError> {
        self.audit_rows()
    }
}
