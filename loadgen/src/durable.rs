//! The durable-store side of a load test: an fsync probe on the store's
//! filesystem before the run, and the committer's figures for the run (see
//! [`snapshot_receiver::store::CommitStats`]) as the report shows them.

use snapshot_receiver::store::{CommitStats, GroupSizes};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long the fsync probe writes.
pub const FSYNC_PROBE_TIME: Duration = Duration::from_secs(1);

/// What a durable store did during one run.
#[derive(Clone, Debug)]
pub struct StoreRun {
    /// The committer's figures for the run alone (setup excluded).
    pub stats: CommitStats,
    /// 4 KiB writes + fsync per second on the store's filesystem just before
    /// the run, or why the probe could not run.
    pub fsync_probe: Result<f64, String>,
    /// The process's peak resident set size when the delivery phase ended,
    /// before the check reads every object back from the store, bytes.
    pub peak_rss_before_check: Option<u64>,
    /// What the bounded receiver read back and spared during the run
    /// ([`snapshot_receiver::Receiver::memory`]); `None` when everything
    /// stays in memory.
    pub memory: Option<snapshot_receiver::MemoryStats>,
    /// The memory budget the receiver ran with, once its store's engine
    /// took its part ([`snapshot_receiver::MemoryBudget::store`]).
    pub budget: snapshot_receiver::MemoryBudget,
    /// Bytes the process wrote to storage from the first delivery until
    /// the receiver had shut down its shards (`/proc/self/io`
    /// `write_bytes`: the commits' WAL frames and the checkpoints that ran
    /// meanwhile, the store's checkpoint thread's included; the fsync
    /// probe and the seeding before the run excluded, and so are the
    /// frames still waiting in the WAL for a checkpoint, at most the
    /// store's WAL bound); `None` without `/proc`.
    pub written: Option<u64>,
    /// What the store's files take on disk at the end of the run, bytes
    /// (the blocks the files take, not their length); `None` for another
    /// store.
    pub kept: Option<u64>,
}

/// What the store at `location` takes on disk, bytes: a `sqlite:PATH` file
/// with its `-wal` file if there is one, or every file under an `lsm:DIR`
/// directory (journals and sorted runs); `None` for any other store, or
/// when the files cannot be read.
///
/// A file counts the blocks the file system gave it (`st_blocks` × 512,
/// POSIX `stat`), not its length: the LSM store makes each journal 32 MiB
/// long ahead of its batches, and the part not written yet takes no disk.
/// Where there is no block count (not Unix), the length.
pub fn kept_bytes(location: &str) -> Option<u64> {
    if let Some(dir) = location.strip_prefix("lsm:") {
        return tree_bytes(Path::new(dir)).ok();
    }
    let path = location.strip_prefix("sqlite:")?;
    let file = on_disk(&std::fs::metadata(path).ok()?);
    let wal = std::fs::metadata(format!("{path}-wal")).map_or(0, |m| on_disk(&m));
    Some(file + wal)
}

/// The bytes on disk of every file under `dir`.
fn tree_bytes(dir: &Path) -> std::io::Result<u64> {
    let mut bytes = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        bytes += if meta.is_dir() {
            tree_bytes(&entry.path())?
        } else {
            on_disk(&meta)
        };
    }
    Ok(bytes)
}

/// The bytes one file takes on disk (see [`kept_bytes`]).
fn on_disk(meta: &std::fs::Metadata) -> u64 {
    #[cfg(unix)]
    {
        std::os::unix::fs::MetadataExt::blocks(meta) * 512
    }
    #[cfg(not(unix))]
    {
        meta.len()
    }
}

/// Where the fsync probe writes for a store `location`: the directory of a
/// `sqlite:PATH` file or of an `lsm:DIR` directory; for any other store the
/// system temp directory (a PostgreSQL server's data directory is usually
/// not writable by its clients: on a one-disk machine that is the same
/// device).
pub fn probe_dir(location: &str) -> PathBuf {
    let local = location
        .strip_prefix("sqlite:")
        .or_else(|| location.strip_prefix("lsm:"));
    match local {
        Some(path) => match Path::new(path).parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
            _ => PathBuf::from("."),
        },
        None => std::env::temp_dir(),
    }
}

/// Appends 4 KiB and fsyncs it, again and again for `time`, in a new file
/// in `dir` (removed afterwards); returns the fsyncs per second.
///
/// # Errors
/// The file cannot be created, written or synced: the error names the file.
pub fn probe_fsync(dir: &Path, time: Duration) -> Result<f64, String> {
    let path = dir.join(format!(
        ".snapshot-receiver-fsync-probe-{}",
        std::process::id()
    ));
    let fail = |what: &str, e: std::io::Error| format!("{what} {}: {e}", path.display());
    let mut file = std::fs::File::create(&path).map_err(|e| fail("cannot create", e))?;
    let block = [0x5a_u8; 4096];
    let start = Instant::now();
    let mut syncs = 0u64;
    let result = loop {
        if let Err(e) = file.write_all(&block) {
            break Err(fail("cannot write", e));
        }
        if let Err(e) = file.sync_all() {
            break Err(fail("cannot fsync", e));
        }
        syncs += 1;
        if start.elapsed() >= time {
            break Ok(syncs as f64 / start.elapsed().as_secs_f64());
        }
    };
    drop(file);
    let _ = std::fs::remove_file(&path);
    result
}

/// Commit wall time percentiles, milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct CommitMs {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
}

/// CPU time per delivery by where it went, microseconds. The first is the
/// whole process minus the committer thread: producers, parsing, deciding,
/// building each step's rows and routing. The others are the committer
/// thread's own clock, by phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct CpuSplit {
    /// Everything outside the committer thread (10 ms process clock ticks:
    /// `None` below 0.2 s of process CPU).
    pub outside_committer: Option<f64>,
    /// Folding writes into rows and building statement parameters.
    pub encode: f64,
    /// Executing the statements (binding, B-tree work; on PostgreSQL the
    /// client side of each round trip).
    pub execute: f64,
    /// The commit call (SQLite: writing the WAL frames and the fsync call
    /// itself; PostgreSQL: the client side of the commit round trip).
    pub commit: f64,
    /// The rest of the committer thread: waking up, gathering requests,
    /// answering shards.
    pub committer_other: f64,
}

/// Share of the run's wall time the committer thread spent waiting (off its
/// CPU) inside a phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct WaitShare {
    /// While executing statements (PostgreSQL: the server's work and the
    /// round trips).
    pub execute: f64,
    /// While committing: the fsync (SQLite `synchronous=FULL`) or the
    /// server's WAL flush (PostgreSQL `synchronous_commit=on`).
    pub commit: f64,
}

/// The `store` object of a load-test report.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct StoreReport {
    /// Group commits that committed during the run.
    pub commits: u64,
    /// Deliveries per committed group.
    pub deliveries_per_commit: GroupSizes,
    /// Wall time of one group commit (folding, statements, commit), ms.
    pub commit_ms: CommitMs,
    /// 4 KiB writes + fsync per second on the store's filesystem, measured
    /// for [`FSYNC_PROBE_TIME`] just before the run; `None` when the probe
    /// could not run (see `fsync_probe_error`).
    pub fsync_per_s: Option<f64>,
    /// Why the fsync probe could not run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fsync_probe_error: Option<String>,
    /// Mean deliveries per commit over the deliveries in flight (producers ×
    /// batch, at most the stream): how full the average commit was.
    pub commit_fill: f64,
    /// Group commits refused because a row changed (decided again).
    pub conflicts: u64,
    /// Group commits that failed (answered `retry`).
    pub failures: u64,
    /// Writes the store applied one statement each instead of in a folded
    /// group's statements (seeds, writes of reconciliation, chains that did
    /// not link): a count, every attempt included.
    pub writes_one_by_one: u64,
    /// CPU time per delivery by where it went, microseconds.
    pub cpu_us_per_delivery: CpuSplit,
    /// How much of the run the committer thread spent waiting in a phase.
    pub waiting_share: WaitShare,
    /// Peak resident set size when the delivery phase ended (stream,
    /// seeding and run; not the check, which reads every object back from
    /// the store), bytes.
    pub peak_rss_before_check_bytes: Option<u64>,
    /// The receiver's memory budget in all, bytes.
    pub memory_budget_bytes: usize,
    /// Its working set's part (objects), bytes.
    pub working_set_budget_bytes: usize,
    /// What the store's engine took of it (caches, write buffers), bytes.
    pub store_engine_bytes: usize,
    /// Objects read back from the store (a bounded working set), or `None`.
    pub objects_loaded: Option<u64>,
    /// Reads of receipts from the store, each for a batch's identities
    /// not in memory, or `None`.
    pub identity_reads: Option<u64>,
    /// Identities the filter of stored identities showed to be new, so
    /// that they were decided without a read, or `None`.
    pub identities_spared: Option<u64>,
    /// Bytes the process wrote to storage during the run (see
    /// [`StoreRun::written`]), or `None`.
    pub written_bytes: Option<u64>,
    /// `written_bytes` per delivery.
    pub written_bytes_per_delivery: Option<f64>,
    /// The store's size on disk at the end of the run (see
    /// [`StoreRun::kept`]), or `None`.
    pub kept_bytes: Option<u64>,
    /// `kept_bytes` per delivery (the seeded objects included).
    pub kept_bytes_per_delivery: Option<f64>,
}

impl StoreReport {
    /// The report of `run` over `deliveries` deliveries that took `elapsed`
    /// and `process_cpu` of the whole process's CPU, with `in_flight`
    /// deliveries outstanding at a time.
    pub fn new(
        run: &StoreRun,
        deliveries: usize,
        elapsed: Duration,
        process_cpu: Option<Duration>,
        in_flight: usize,
    ) -> Self {
        let s = &run.stats;
        let per = |d: Duration| d.as_secs_f64() * 1e6 / deliveries.max(1) as f64;
        let p = &s.phases;
        let phases_cpu = p.encode.cpu + p.execute.cpu + p.commit.cpu;
        let sizes = s.deliveries_per_commit();
        let share = |d: Duration| d.as_secs_f64() / elapsed.as_secs_f64().max(1e-9);
        Self {
            commits: s.commits,
            deliveries_per_commit: sizes,
            commit_ms: CommitMs {
                p50: s.commit_time(0.5).as_secs_f64() * 1e3,
                p99: s.commit_time(0.99).as_secs_f64() * 1e3,
            },
            fsync_per_s: run.fsync_probe.as_ref().ok().copied(),
            fsync_probe_error: run.fsync_probe.as_ref().err().cloned(),
            commit_fill: sizes.mean / in_flight.max(1) as f64,
            conflicts: s.conflicts,
            failures: s.failures,
            writes_one_by_one: p.unfolded,
            peak_rss_before_check_bytes: run.peak_rss_before_check,
            memory_budget_bytes: run.budget.total(),
            working_set_budget_bytes: run.budget.objects,
            store_engine_bytes: run.budget.store,
            objects_loaded: run.memory.map(|m| m.objects_loaded),
            identity_reads: run.memory.map(|m| m.identity_reads),
            identities_spared: run.memory.map(|m| m.identities_spared),
            written_bytes: run.written,
            written_bytes_per_delivery: run.written.map(|b| b as f64 / deliveries.max(1) as f64),
            kept_bytes: run.kept,
            kept_bytes_per_delivery: run.kept.map(|b| b as f64 / deliveries.max(1) as f64),
            cpu_us_per_delivery: CpuSplit {
                outside_committer: process_cpu
                    .filter(|c| *c >= Duration::from_millis(200))
                    .map(|c| per(c.saturating_sub(s.thread_cpu))),
                encode: per(p.encode.cpu),
                execute: per(p.execute.cpu),
                commit: per(p.commit.cpu),
                committer_other: per(s.thread_cpu.saturating_sub(phases_cpu)),
            },
            waiting_share: WaitShare {
                execute: share(p.execute.waiting()),
                commit: share(p.commit.waiting()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_writes_next_to_a_sqlite_file_and_elsewhere_in_the_temp_dir() {
        assert_eq!(probe_dir("sqlite:/data/x/lt.db"), PathBuf::from("/data/x"));
        assert_eq!(probe_dir("sqlite:lt.db"), PathBuf::from("."));
        assert_eq!(probe_dir("postgres://u@h/db"), std::env::temp_dir());
    }

    /// A journal made long ahead of its batches counts what was written to
    /// it, not its length; a SQLite file and its WAL count both.
    #[cfg(unix)]
    #[test]
    fn kept_counts_the_blocks_a_file_takes_not_its_length() {
        use std::io::Write;
        let dir = std::env::temp_dir().join(format!("kept-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("journals")).unwrap();
        let mut journal = std::fs::File::create(dir.join("journals/0")).unwrap();
        journal.write_all(&[7u8; 8192]).unwrap();
        journal.set_len(32 << 20).unwrap();
        journal.sync_all().unwrap();
        std::fs::write(dir.join("run"), [1u8; 4096]).unwrap();
        let lsm = kept_bytes(&format!("lsm:{}", dir.display()));
        std::fs::write(dir.join("lt.db"), [1u8; 4096]).unwrap();
        std::fs::write(dir.join("lt.db-wal"), [1u8; 8192]).unwrap();
        let sqlite = kept_bytes(&format!("sqlite:{}", dir.join("lt.db").display()));
        std::fs::remove_dir_all(&dir).unwrap();
        // ext4 and tmpfs give 4 KiB blocks to a file as it is written.
        assert_eq!(lsm, Some(8192 + 4096));
        assert_eq!(sqlite, Some(4096 + 8192));
    }

    #[test]
    fn the_probe_names_a_directory_it_cannot_write() {
        let dir = Path::new("/nonexistent-snapshot-receiver-dir");
        let err = probe_fsync(dir, Duration::from_millis(10)).unwrap_err();
        assert!(
            err.starts_with(
                "cannot create /nonexistent-snapshot-receiver-dir/.snapshot-receiver-fsync-probe-"
            ),
            "{err}"
        );
    }

    #[test]
    fn the_probe_counts_fsyncs_and_leaves_no_file() {
        let dir = std::env::temp_dir();
        let rate = probe_fsync(&dir, Duration::from_millis(20)).unwrap();
        assert!(rate > 0.0);
        let left = dir.join(format!(
            ".snapshot-receiver-fsync-probe-{}",
            std::process::id()
        ));
        assert!(!left.exists());
    }
}
