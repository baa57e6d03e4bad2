//! The log-structured store (feature `lsm`, location `lsm:DIR`): the same
//! rows as the SQLite store, kept in fjall, an embedded LSM tree (a journal
//! appended at every commit, memtables flushed to sorted runs, runs merged
//! in the background). A B-tree writes every page a commit touches, twice
//! (WAL and checkpoint), and a delivery touches random pages (its event
//! identity's, its object's); an LSM tree writes a commit's rows once to
//! its journal and later in sorted batches (docs/BENCHMARKS.md, *Bytes
//! written per delivery*).
//!
//! One process at a time: the store takes an exclusive lock on its
//! directory, and a second process that opens it is refused with a
//! message naming the directory. Within the process the committer is the
//! only writer of the decision rows, so a write's condition is checked by
//! reading the row before the commit's batch goes in; each commit is one
//! atomic batch, made durable (`PersistMode::SyncAll`: the journal
//! fsynced) before it returns, as SQLite's `synchronous=FULL`.
//!
//! Relays and a reconciler get handles of their own on the same keyspace
//! ([`Store::outbox_store`], [`Store::authority_store`]), in the same
//! process, and so does a [`crate::store::StoreReader`]: the open
//! keyspaces of the process are registered by directory. What it does not
//! give: a second process (see above).

mod codec;
mod operator;
mod outbox;
mod read;
mod write;

pub(in crate::store) use operator::{LsmRows, RelayRows};

use crate::store::stats::PhaseClock;
use crate::store::{
    AuditRow, CommitPhases, EffectRow, Loaded, ObjectRow, ObjectSource, ReceiptRow, Records, Store,
    StoreError, VariantRow, Write,
};
use fjall::{PartitionCreateOptions, PartitionHandle, PersistMode};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

/// The format of the rows this version writes, kept in the store (`meta`,
/// key `format`): a store of another format is refused, not misread.
const FORMAT: u64 = 1;

/// The keyspace's directory inside the store's: a store exists once it
/// does.
const KEYSPACE: &str = "keyspace";

/// The smallest write buffer fjall accepts (it asserts at least 1 MiB).
const MIN_WRITE_BUFFER_BYTES: usize = 1 << 20;

/// What a memtable keeps in memory per byte fjall counts against its
/// write buffer (the keys' and values' lengths and 9 bytes of each): the
/// skip list's node and the keys' and values' own allocations come on top.
/// Measured by `benches/lsm-probe` (`memtable`: the resident size a
/// memtable of 64 counted MiB adds): 4.0 for 16-byte keys without a value
/// (the index partitions), 2.3 for 30-byte keys with 60-byte values (the
/// receipts), 1.4 with 300-byte values (audit, history, objects). A
/// delivery's rows mix to about 1.7, rounded up.
const MEMTABLE_COST: usize = 2;

/// fjall's block cache and write buffer (the memtable bytes past which it
/// flushes them to sorted runs, over all partitions, as fjall counts them),
/// in bytes, for an engine given `part` bytes of the receiver's memory
/// budget ([`crate::MemoryBudget::store`]): a sixth for the cache (the
/// working set above it already keeps the objects read most), the rest for
/// the memtables at [`MEMTABLE_COST`] each counted byte, at least 1 MiB
/// counted. Below 32 counted MiB a write buffer halved the rate at 1,000
/// objects (`loadtest`, docs/BENCHMARKS.md): the default part (96 MiB)
/// gives 40. A batch passes the write buffer by at most its own size
/// before fjall waits for a flush.
pub(crate) fn engine_sizes(part: usize) -> (usize, usize) {
    let cache = part / 6;
    let write_buffer = ((part - cache) / MEMTABLE_COST).max(MIN_WRITE_BUFFER_BYTES);
    (cache, write_buffer)
}

/// The bytes an engine of these sizes keeps at most: its cache and its
/// memtables' resident size.
pub(crate) fn engine_bytes((cache, write_buffer): (usize, usize)) -> usize {
    cache + write_buffer * MEMTABLE_COST
}

/// Journal bytes past which fjall flushes the memtables it holds (its
/// default). Measured with `loadtest` (docs/BENCHMARKS.md): 128 MiB kept a
/// smaller directory but halved the rate at 1,000 objects and took 39 %
/// off it at a million; 64 MiB with half the cache and write buffer, 56 %.
const JOURNAL_BYTES: u64 = 512 << 20;

/// How long an opening waits for another to close the store (a receiver
/// rebuilt in the same process while the old one's committer is still
/// closing it), as SQLite's busy timeout.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The partitions (fjall's tables) of the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Part {
    /// Object id → version, pause flag, state.
    Objects,
    /// Object id of each paused object → nothing (start-up reads these).
    Paused,
    /// Event id → the first record.
    Receipts,
    /// First seen, event id → nothing (the identity purge's order).
    ReceiptsByTime,
    /// Event id (length-prefixed), fingerprint → object, first seen.
    Variants,
    /// Origin, seq → a held row without its body.
    Held,
    /// Origin, seq → a held row's exact body.
    HeldBodies,
    /// Event id (length-prefixed), origin, seq → nothing, for each held row
    /// not resolved (the audit purge keeps their event's rows).
    HeldEvents,
    /// Held at, origin, seq → nothing, for each resolved held row.
    ResolvedByTime,
    /// Counter → an audit row, in the order recorded.
    Audit,
    /// At, counter → nothing (the audit purge's order).
    AuditByTime,
    /// Outbox position → a history row.
    History,
    /// At, position → nothing (the history purge's order).
    HistoryByTime,
    /// The counters and the format.
    Meta,
    /// Relay name → its cursor, generation and lease.
    Relays,
    /// Relay name (length-prefixed), position → a parked effect's status.
    RelayParked,
    /// Object id → the last error of an object waiting for an authority.
    AuthorityWaits,
}

impl Part {
    const ALL: [Part; 17] = [
        Part::Objects,
        Part::Paused,
        Part::Receipts,
        Part::ReceiptsByTime,
        Part::Variants,
        Part::Held,
        Part::HeldBodies,
        Part::HeldEvents,
        Part::ResolvedByTime,
        Part::Audit,
        Part::AuditByTime,
        Part::History,
        Part::HistoryByTime,
        Part::Meta,
        Part::Relays,
        Part::RelayParked,
        Part::AuthorityWaits,
    ];

    fn name(self) -> &'static str {
        match self {
            Part::Objects => "objects",
            Part::Paused => "paused",
            Part::Receipts => "receipts",
            Part::ReceiptsByTime => "receipts_by_time",
            Part::Variants => "variants",
            Part::Held => "held",
            Part::HeldBodies => "held_bodies",
            Part::HeldEvents => "held_events",
            Part::ResolvedByTime => "resolved_by_time",
            Part::Audit => "audit",
            Part::AuditByTime => "audit_by_time",
            Part::History => "history",
            Part::HistoryByTime => "history_by_time",
            Part::Meta => "meta",
            Part::Relays => "relays",
            Part::RelayParked => "relay_parked",
            Part::AuthorityWaits => "authority_waits",
        }
    }
}

/// The keyspace and its partitions, shared by the committer, the shards'
/// object sources, relays and readers of one process, and the lock that
/// keeps every other process out while any of them is open (released
/// last: fields drop in order).
struct Db {
    keyspace: fjall::Keyspace,
    parts: Vec<PartitionHandle>,
    /// One change of the relays' rows at a time (each reads, then writes).
    relay_lock: std::sync::Mutex<()>,
    /// Whether a committer ([`LsmStore`]) writes it: one at a time.
    writer: std::sync::atomic::AtomicBool,
    _lock: std::fs::File,
}

/// The stores open in this process, by canonical directory: a reader or a
/// second handle shares the keyspace instead of waiting for its lock.
static OPEN: std::sync::Mutex<Vec<(PathBuf, std::sync::Weak<Db>)>> =
    std::sync::Mutex::new(Vec::new());

impl Db {
    fn part(&self, part: Part) -> &PartitionHandle {
        &self.parts[part as usize]
    }
}

/// The store's counters, kept in `meta` and advanced by each commit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counters {
    /// The last audit row's counter.
    audit: u64,
    /// The last outbox position given.
    position: u64,
    /// The highest step sequence number stored.
    max_seq: u64,
    /// The last held row's arrival number.
    held: u64,
}

impl Counters {
    const KEYS: [&'static [u8]; 4] = [b"audit", b"position", b"max_seq", b"held"];

    fn values(&self) -> [u64; 4] {
        [self.audit, self.position, self.max_seq, self.held]
    }
}

/// The error of the LSM library as a [`StoreError`].
fn failed(e: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::backend("lsm", e)
}

/// The log-structured store; see the module's documentation.
pub struct LsmStore {
    db: Arc<Db>,
    counters: Counters,
    phases: CommitPhases,
}

impl LsmStore {
    /// Opens (creating if needed) the store in the directory `path`, as its
    /// one writer, with the default budget's store part for fjall's cache
    /// and write buffer ([`LsmStore::open_sized`]).
    ///
    /// # Errors
    /// As [`LsmStore::open_sized`].
    pub fn open(path: &str) -> Result<Self, StoreError> {
        Self::open_sized(path, crate::MemoryBudget::default().store)
    }

    /// Opens (creating if needed) the store in the directory `path`, as its
    /// one writer, its engine (fjall's block cache and write buffer) sized
    /// to `memory` bytes (at least 1 MiB). A keyspace this process has
    /// open already (a reader's) keeps the sizes it was opened with.
    ///
    /// # Errors
    /// [`StoreError::Failed`] naming the directory when it cannot be
    /// created or locked, another process holds it, or another store of
    /// this process writes it (after waiting up to 5 s for either to close
    /// it); [`StoreError::NotAStore`] when it holds a store of another
    /// format; [`StoreError::Backend`] when fjall cannot open it.
    pub fn open_sized(path: &str, memory: usize) -> Result<Self, StoreError> {
        let db = shared(path, Some(memory))?;
        let until = std::time::Instant::now() + LOCK_WAIT;
        while db.writer.swap(true, std::sync::atomic::Ordering::AcqRel) {
            if std::time::Instant::now() >= until {
                return Err(StoreError::Failed(format!(
                    "lsm:{path} is open in another receiver of this process: an lsm store takes \
                     one writer at a time"
                )));
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let meta = db.part(Part::Meta);
        let mut counters = [0u64; 4];
        for (n, key) in counters.iter_mut().zip(Counters::KEYS) {
            if let Some(v) = meta.get(key).map_err(failed)? {
                *n = codec::read_be(&v, 0)?;
            }
        }
        let [audit, position, max_seq, held] = counters;
        Ok(Self {
            db,
            counters: Counters {
                audit,
                position,
                max_seq,
                held,
            },
            phases: CommitPhases::default(),
        })
    }

    /// Runs `writes` in one batch and commits it (`keep`), or only checks
    /// them ([`Store::probe`]).
    fn run(&mut self, writes: &[Write], keep: bool) -> Result<(), StoreError> {
        let mut clock = PhaseClock::start();
        let mut tx = write::Tx::new(&self.db, self.counters);
        clock.lap(&mut self.phases.encode);
        let applied = writes.iter().try_for_each(|w| tx.apply(w));
        clock.lap(&mut self.phases.execute);
        applied?;
        if !keep {
            return Ok(());
        }
        let counters = tx.commit()?;
        self.counters = counters;
        clock.lap(&mut self.phases.commit);
        Ok(())
    }
}

/// The keyspace of the store in `path`: the one this process has open, or
/// opened now. `create` (a writer's, with the bytes of its engine): a
/// directory that is missing or empty becomes a new store; a directory
/// that holds other files is refused, never taken over. A reader opens
/// with the default budget's store part.
fn shared(path: &str, create: Option<usize>) -> Result<Arc<Db>, StoreError> {
    let (cache, write_buffer) =
        engine_sizes(create.unwrap_or(crate::MemoryBudget::default().store));
    let create = create.is_some();
    let dir = PathBuf::from(path);
    let keyspace_dir = dir.join(KEYSPACE);
    match std::fs::metadata(&dir) {
        Ok(meta) if !meta.is_dir() => {
            return Err(StoreError::NotAStore(format!(
                "lsm:{path} is a file: an lsm store is a directory"
            )))
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !create => {
            return Err(StoreError::Missing(format!(
                "lsm:{path}: no such directory"
            )))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(&dir)
                .map_err(|e| StoreError::Failed(format!("lsm: cannot create {path}: {e}")))?;
        }
        Err(e) => return Err(StoreError::Failed(format!("lsm: cannot open {path}: {e}"))),
    }
    let canonical = dir
        .canonicalize()
        .map_err(|e| StoreError::Failed(format!("lsm: cannot open {path}: {e}")))?;
    let mut open = crate::locks::lock(&OPEN);
    open.retain(|(_, db)| db.strong_count() > 0);
    if let Some(db) = open
        .iter()
        .find(|(p, _)| *p == canonical)
        .and_then(|(_, db)| db.upgrade())
    {
        return Ok(db);
    }
    let lock = lock(&dir, path)?;
    // Decided under the lock: whether this directory is a new store.
    let fresh = !keyspace_dir.exists();
    if fresh {
        if !create {
            return Err(StoreError::Missing(format!(
                "lsm:{path}: no store in this directory"
            )));
        }
        let empty = std::fs::read_dir(&dir)
            .map_err(|e| StoreError::Failed(format!("lsm: cannot read {path}: {e}")))?
            .next()
            .is_none();
        if !empty {
            return Err(StoreError::NotAStore(format!(
                "lsm:{path} holds other files and no store: a new lsm store needs an empty or \
                 missing directory"
            )));
        }
    } else if !keyspace_dir.join("version").exists() {
        // fjall would start a new keyspace over what is left.
        return Err(damaged(path, "its keyspace has no version file"));
    }
    // What each journal holds before fjall replays it: it drops a tail
    // that is not a whole batch, which an operator should hear about.
    let written = journal_ends(&keyspace_dir.join(JOURNALS));
    let (keyspace, parts) = guarded(path, || {
        let keyspace = fjall::Config::new(&keyspace_dir)
            .cache_size(cache as u64)
            .max_write_buffer_size(write_buffer as u64)
            .max_journaling_size(JOURNAL_BYTES)
            .open()
            .map_err(|e| damaged(path, e))?;
        let parts = Part::ALL
            .iter()
            .map(|p| keyspace.open_partition(p.name(), PartitionCreateOptions::default()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| damaged(path, e))?;
        Ok((keyspace, parts))
    })?;
    report_dropped_tails(path, &written);
    let db = Arc::new(Db {
        keyspace,
        parts,
        relay_lock: std::sync::Mutex::new(()),
        writer: std::sync::atomic::AtomicBool::new(false),
        _lock: lock,
    });
    let meta = db.part(Part::Meta);
    match meta.get(b"format").map_err(|e| damaged(path, e))? {
        None if fresh => {
            meta.insert(b"format", FORMAT.to_be_bytes())
                .map_err(failed)?;
            db.keyspace.persist(PersistMode::SyncAll).map_err(failed)?;
        }
        None => return Err(damaged(path, "its format record is missing")),
        Some(v) if *v == FORMAT.to_be_bytes() => {}
        Some(v) => {
            return Err(StoreError::NotAStore(format!(
                "lsm:{path}: the store's format is {:?}, this version reads format {FORMAT}",
                codec::read_be(&v, 0).ok()
            )))
        }
    }
    open.push((canonical, Arc::downgrade(&db)));
    Ok(db)
}

/// The journals' directory inside the keyspace's.
const JOURNALS: &str = "journals";

/// Each journal file in `dir` with the end of what was written to it: the
/// offset after its last byte that is not zero (fjall makes a journal
/// file long ahead of its batches and leaves the rest zeros). A directory
/// or file that cannot be read is left out: fjall's own opening names it.
fn journal_ends(dir: &Path) -> Vec<(PathBuf, u64)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter_map(|file| last_written(&file).ok().map(|end| (file, end)))
        .collect()
}

/// The offset after the last byte of `file` that is not zero, reading it
/// from its end in blocks of 64 KiB.
fn last_written(file: &Path) -> std::io::Result<u64> {
    use std::io::{Read, Seek, SeekFrom};
    const BLOCK: u64 = 64 << 10;
    let mut f = std::fs::File::open(file)?;
    let mut end = f.metadata()?.len();
    let mut buf = vec![0u8; BLOCK as usize];
    while end > 0 {
        let start = end.saturating_sub(BLOCK);
        let block = &mut buf[..(end - start) as usize];
        f.seek(SeekFrom::Start(start))?;
        f.read_exact(block)?;
        if let Some(i) = block.iter().rposition(|b| *b != 0) {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

/// Warns, for each journal fjall shortened while replaying it, how many
/// written bytes it dropped: the tail of a batch a killed process had not
/// finished (it was never acknowledged), or everything after a damaged
/// spot (acknowledged batches lost). fjall drops them without a word.
fn report_dropped_tails(path: &str, written: &[(PathBuf, u64)]) {
    for (file, end) in written {
        let now = std::fs::metadata(file).map_or(*end, |m| m.len());
        if now < *end {
            tracing::warn!(
                store = %format!("lsm:{path}"),
                journal = %file.file_name().unwrap_or_default().to_string_lossy(),
                dropped_bytes = end - now,
                "the store's journal ended in bytes that are not a whole batch: they were dropped \
                 (a process killed while writing leaves such a tail and loses nothing it \
                 acknowledged; a damaged journal loses the batches after the damage)"
            );
        }
    }
}

/// The error of a store whose files cannot be read as one.
fn damaged(path: &str, why: impl std::fmt::Display) -> StoreError {
    StoreError::NotAStore(format!(
        "lsm:{path}: the store is damaged or not an lsm store ({why}); it was not changed"
    ))
}

/// Runs `f`, turning a panic of the LSM library (it asserts on some damaged
/// files) into an error naming the store: a damaged file fails the call,
/// never the process.
pub(in crate::store) fn guarded<T>(
    what: &str,
    f: impl FnOnce() -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let why = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("a panic");
        Err(StoreError::Failed(format!(
            "lsm: {what}: the store's files are damaged: {why}"
        )))
    })
}

impl Drop for LsmStore {
    fn drop(&mut self) {
        self.db
            .writer
            .store(false, std::sync::atomic::Ordering::Release);
    }
}

/// Locks the store's directory itself (not a file in it, which could be
/// deleted while held), waiting up to [`LOCK_WAIT`] for another opening to
/// close it; then names the directory another process holds.
fn lock(dir: &Path, path: &str) -> Result<std::fs::File, StoreError> {
    let file = std::fs::File::open(dir)
        .map_err(|e| StoreError::Failed(format!("lsm: cannot open {path}: {e}")))?;
    let until = std::time::Instant::now() + LOCK_WAIT;
    loop {
        let busy = match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(std::fs::TryLockError::WouldBlock) => format!(
                "lsm:{path} is open in another process: an lsm store takes one process at a time"
            ),
            Err(std::fs::TryLockError::Error(e)) => {
                let why = format!("lsm: cannot lock {path}: {e}");
                return Err(StoreError::Failed(why));
            }
        };
        if std::time::Instant::now() >= until {
            return Err(StoreError::Failed(busy));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

impl Store for LsmStore {
    fn commit(&mut self, writes: &[Write]) -> Result<(), StoreError> {
        guarded("commit", || self.run(writes, true))
    }

    fn probe(&mut self, writes: &[Write]) -> Result<(), StoreError> {
        guarded("probe", || self.run(writes, false))
    }

    fn load(&mut self, receipts_since: SystemTime) -> Result<Loaded, StoreError> {
        guarded("load", || {
            crate::store::load::load(
                &mut read::Reads::new(&self.db),
                receipts_since,
                crate::store::load::Objects::All,
            )
        })
    }

    fn load_resident(&mut self, receipts_since: SystemTime) -> Result<Loaded, StoreError> {
        guarded("load_resident", || {
            crate::store::load::load(
                &mut read::Reads::new(&self.db),
                receipts_since,
                crate::store::load::Objects::Pinned,
            )
        })
    }

    fn object_source(&mut self) -> Result<Option<Box<dyn ObjectSource>>, StoreError> {
        Ok(Some(Box::new(read::Source(self.db.clone()))))
    }

    fn outbox_store(&mut self) -> Result<Option<Box<dyn crate::store::OutboxStore>>, StoreError> {
        Ok(Some(Box::new(outbox::LsmOutbox(self.db.clone()))))
    }

    fn authority_store(
        &mut self,
    ) -> Result<Option<Box<dyn crate::store::AuthorityStore>>, StoreError> {
        Ok(Some(Box::new(outbox::LsmOutbox(self.db.clone()))))
    }

    fn objects(&mut self) -> Result<Vec<ObjectRow>, StoreError> {
        guarded("objects", || read::Reads::new(&self.db).all_objects())
    }

    fn refresh(
        &mut self,
        objects: &[Arc<str>],
        receipts: &[Arc<str>],
    ) -> Result<(Vec<ObjectRow>, Vec<ReceiptRow>), StoreError> {
        guarded("refresh", || {
            // Receipts first: a receipt commits with its object's change.
            let reads = read::Reads::new(&self.db);
            let receipts = reads.receipts(receipts, None)?;
            Ok((reads.objects(objects)?, receipts))
        })
    }

    fn refresh_variants(&mut self, event_ids: &[Arc<str>]) -> Result<Vec<VariantRow>, StoreError> {
        guarded("refresh_variants", || {
            read::Reads::new(&self.db).variants_of(event_ids)
        })
    }

    fn purge_receipts(&mut self, before: SystemTime) -> Result<u64, StoreError> {
        guarded("purge_receipts", || {
            write::purge_identities(&self.db, before)
        })
    }

    fn purge_records(
        &mut self,
        records: Records,
        before: SystemTime,
        limit: usize,
    ) -> Result<u64, StoreError> {
        guarded("purge_records", || {
            write::purge_records(&self.db, self.counters.max_seq, records, before, limit)
        })
    }

    fn audit(&mut self) -> Result<Vec<AuditRow>, StoreError> {
        guarded("audit", || read::Reads::new(&self.db).audit())
    }

    fn replacements_since(&mut self, after: u64) -> Result<Vec<EffectRow>, StoreError> {
        guarded("replacements_since", || {
            read::Reads::new(&self.db).replacements_since(after)
        })
    }

    fn phases(&self) -> CommitPhases {
        self.phases
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_of_the_lsm_library_is_an_error_naming_the_call() {
        let failed: Result<(), StoreError> = guarded("load", || panic!("Invalid compression"));
        assert_eq!(
            failed_text(failed),
            "store failure: lsm: load: the store's files are damaged: Invalid compression"
        );
        let formatted: Result<(), StoreError> = guarded("read", || panic!("block {}", 7));
        assert_eq!(
            failed_text(formatted),
            "store failure: lsm: read: the store's files are damaged: block 7"
        );
        assert_eq!(guarded("read", || Ok(3)).ok(), Some(3));
    }

    #[test]
    fn the_engine_takes_its_part_a_sixth_for_the_cache_and_the_memtables_at_their_cost() {
        assert_eq!(engine_sizes(96 << 20), (16 << 20, 40 << 20));
        assert_eq!(engine_bytes(engine_sizes(96 << 20)), 96 << 20);
        assert_eq!(engine_sizes(6 << 20), (1 << 20, 2560 << 10));
        // fjall refuses (asserts) a write buffer below 1 MiB: the smallest
        // engine takes a little more than its part.
        assert_eq!(engine_sizes(3 << 20), (512 << 10, 1280 << 10));
        assert_eq!(engine_sizes(1536 << 10), (256 << 10, 1 << 20));
        assert_eq!(
            engine_bytes(engine_sizes(1536 << 10)),
            (2 << 20) + (256 << 10)
        );
        assert_eq!(engine_sizes(0), (0, 1 << 20));
        let dir = std::env::temp_dir().join(format!("sr-lsm-sized-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = LsmStore::open_sized(dir.to_str().unwrap(), 12 << 20).unwrap();
        assert_eq!(store.db.keyspace.cache_capacity(), 2 << 20);
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_end_of_a_journal_is_after_its_last_byte_that_is_not_zero() {
        let file = std::env::temp_dir().join(format!("sr-lsm-journal-{}", std::process::id()));
        // Written bytes, then zeros across more than one block.
        let mut bytes = vec![0u8; 200_000];
        bytes[..70_000].fill(7);
        bytes[69_999] = 0;
        bytes[69_998] = 1;
        std::fs::write(&file, &bytes).unwrap();
        assert_eq!(last_written(&file).unwrap(), 69_999);
        std::fs::write(&file, vec![0u8; 100]).unwrap();
        assert_eq!(last_written(&file).unwrap(), 0);
        std::fs::write(&file, [9u8]).unwrap();
        assert_eq!(last_written(&file).unwrap(), 1);
        std::fs::remove_file(&file).unwrap();
    }

    fn failed_text(r: Result<(), StoreError>) -> String {
        r.err().map(|e| e.to_string()).unwrap_or_default()
    }
}
