//! SQLite's side of the outbox and relays (`store/outbox.rs`): a relay's
//! own read-write connection to the file. WAL mode lets it read effects
//! while the committer writes; its saves are short `IMMEDIATE`
//! transactions that wait up to the store's busy timeout for the
//! committer's lock.

use super::checkpoint::Watch;
use super::{failed, read};
use crate::store::outbox::{Sql, SqlOutbox};
use crate::store::sql::{Cell, Value};
use crate::store::StoreError;
use std::time::Duration;

/// A relay's connection to the SQLite file.
pub(super) struct SqliteSql {
    conn: rusqlite::Connection,
    /// How long a save waits for the write lock.
    busy_timeout: Duration,
}

/// How long a save waiting for the committer's write lock sleeps between
/// two tries. SQLite's own busy handler backs off to 100 ms sleeps, which
/// the committer's back-to-back commits keep losing: under load a relay's
/// saves then took 40 to 240 ms, and effects waited that long for the
/// next round.
const LOCK_RETRY: Duration = Duration::from_millis(1);

/// Opens the relays' connection to the store at `path` (see [`connect`]).
pub(super) fn open(
    path: &str,
    setup: super::Connect,
    watch: Option<&std::sync::Arc<Watch>>,
) -> Result<SqlOutbox<SqliteSql>, StoreError> {
    connect(path, setup, "relays", watch).map(SqlOutbox::new)
}

/// A read-write connection of its own to the store at `path`, `what` it is
/// for named in an error (relays, a reconciler). With `watch`, its commits
/// report to the store's checkpoint thread and run no checkpoint
/// themselves; without, it runs none either (the committer's connection
/// does).
pub(super) fn connect(
    path: &str,
    setup: super::Connect,
    what: &str,
    watch: Option<&std::sync::Arc<Watch>>,
) -> Result<SqliteSql, StoreError> {
    let mut conn = rusqlite::Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| StoreError::Failed(format!("sqlite: cannot open {path} for {what}: {e}")))?;
    setup.apply(&conn).map_err(failed)?;
    let busy_timeout = setup.busy_timeout;
    // Checkpoints are the committer's: with SQLite's default (every 1,000
    // pages) a relay's save past that mark copied the whole WAL into the
    // database and synced it, on the relay's thread, under ingest.
    conn.pragma_update(None, "wal_autocheckpoint", 0)
        .map_err(failed)?;
    // These commits need not wait for the disk: a relay's cursor and
    // parked effects only say what was already sent, and a reconciler's
    // last errors are found again, so a power loss that takes back the last
    // of them makes a relay send those effects again (at least once, with
    // their ids); the committer's next commit, synced, makes the frames
    // before it durable too. A kill loses nothing (WAL).
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(failed)?;
    if let Some(watch) = watch {
        watch.watch(&mut conn).map_err(failed)?;
    }
    Ok(SqliteSql { conn, busy_timeout })
}

impl Sql for SqliteSql {
    /// SQLite's clock (`julianday('now')`, the same value for the whole
    /// statement), in whole milliseconds (its precision) as nanoseconds.
    /// On one machine's file this is that machine's clock, the one its
    /// processes read too; reading it in SQL keeps the lease on one clock
    /// whatever time a caller passes.
    const NOW_NS: &'static str =
        "(CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000000)";

    fn rows(&mut self, sql: &str, params: &[Value<'_>]) -> Result<Vec<Vec<Cell>>, StoreError> {
        read::rows(&self.conn, sql, params, failed)
    }

    fn execute(&mut self, sql: &str, params: &[Value<'_>]) -> Result<u64, StoreError> {
        let mut st = self
            .conn
            .prepare_cached(&read::translate(sql))
            .map_err(failed)?;
        st.execute(read::values(params).as_slice())
            .map(|n| n as u64)
            .map_err(failed)
    }

    /// Takes the write lock, trying every [`LOCK_RETRY`] until the busy
    /// timeout passed (SQLite's own waits are off meanwhile).
    fn begin(&mut self) -> Result<(), StoreError> {
        self.conn.busy_timeout(Duration::ZERO).map_err(failed)?;
        let deadline = std::time::Instant::now() + self.busy_timeout;
        let begun = loop {
            match self.conn.execute_batch("BEGIN IMMEDIATE") {
                Err(rusqlite::Error::SqliteFailure(e, _))
                    if e.code == rusqlite::ErrorCode::DatabaseBusy
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(LOCK_RETRY);
                }
                other => break other,
            }
        };
        self.conn.busy_timeout(self.busy_timeout).map_err(failed)?;
        begun.map_err(failed)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch file with one table, and a second connection to it.
    fn file(name: &str) -> (String, rusqlite::Connection) {
        let path =
            std::env::temp_dir().join(format!("sr-relay-lock-{name}-{}.db", std::process::id()));
        let path = path.display().to_string();
        remove(&path);
        let other = rusqlite::Connection::open(&path).unwrap();
        other
            .execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t (n INTEGER);")
            .unwrap();
        (path, other)
    }

    /// The numbers in the scratch table, in order.
    fn numbers(conn: &rusqlite::Connection) -> Vec<i64> {
        conn.prepare("SELECT n FROM t ORDER BY n")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    /// Removes the scratch file at `path` and its WAL and index.
    fn remove(path: &str) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{path}{suffix}"));
        }
    }

    /// Every connection the store opens has the page cache it was given:
    /// the committer's, a shard's, the relays' and a reconciler's.
    #[test]
    fn each_connection_of_the_store_keeps_the_page_cache_it_was_given() {
        use crate::store::Store as _;
        let (path, _) = file("cache");
        remove(&path);
        let cache_kib = |conn: &rusqlite::Connection| -> i64 {
            conn.query_row("PRAGMA cache_size", [], |r| r.get(0))
                .unwrap()
        };
        let options = crate::store::SqliteOptions {
            cache_bytes: 300 << 10,
            ..Default::default()
        };
        let mut store = super::super::SqliteStore::open(&path, options).unwrap();
        assert_eq!(cache_kib(&store.conn), -300);
        let source = super::super::read::SqliteObjects::open(&path, store.connect).unwrap();
        assert_eq!(cache_kib(&source.conn), -300);
        let relays = connect(&path, store.connect, "relays", None).unwrap();
        assert_eq!(cache_kib(&relays.conn), -300);
        assert!(store.outbox_store().unwrap().is_some());
        assert_eq!(super::super::connection_cache(64 << 20, 8), 2_000 << 10);
        assert_eq!(super::super::connection_cache(8 << 20, 8), 1 << 20);
        assert_eq!(super::super::connection_cache(1 << 20, 8), 256 << 10);
        assert_eq!(super::super::connection_cache(1 << 20, 0), 1 << 20);
        drop((store, source, relays));
        remove(&path);
    }

    /// A save waits for a write lock another connection holds, takes it
    /// once it is let go, and gives up with SQLite's own "database is
    /// locked" once the busy timeout passed; its waits leave the
    /// connection's busy timeout as it was.
    #[test]
    fn a_save_waits_for_the_write_lock_up_to_the_busy_timeout() {
        let (path, other) = file("wait");
        let mut relay = SqliteSql {
            conn: rusqlite::Connection::open(&path).unwrap(),
            busy_timeout: Duration::from_secs(10),
        };
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        let holder = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            other
                .execute_batch("INSERT INTO t VALUES (1); COMMIT")
                .unwrap();
            other
        });
        relay.begin().unwrap();
        relay.execute("INSERT INTO t VALUES (2)", &[]).unwrap();
        relay.commit().unwrap();
        let other = holder.join().unwrap();
        assert_eq!(numbers(&other), [1, 2]);

        relay.busy_timeout = Duration::from_millis(20);
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        let refused = relay.begin().unwrap_err();
        let cause = std::error::Error::source(&refused).map(ToString::to_string);
        assert_eq!(
            (refused.to_string(), cause.as_deref()),
            (
                "store failure: sqlite".to_owned(),
                Some("database is locked")
            ),
        );
        other.execute_batch("COMMIT").unwrap();
        // The connection's own timeout is back: it is what reads wait.
        let waits: i64 = relay
            .conn
            .query_row("PRAGMA busy_timeout", [], |r| r.get(0))
            .unwrap();
        assert_eq!(waits, 20);
        remove(&path);
    }

    /// A save whose statement failed rolls its transaction back: nothing
    /// it wrote stays, the write lock goes at once (another connection
    /// takes it without waiting), and the next save begins anew.
    #[test]
    fn a_rolled_back_save_writes_nothing_and_lets_the_write_lock_go() {
        let (path, other) = file("rollback");
        let mut relay = SqliteSql {
            conn: rusqlite::Connection::open(&path).unwrap(),
            busy_timeout: Duration::from_secs(10),
        };
        relay.begin().unwrap();
        relay.execute("INSERT INTO t VALUES (1)", &[]).unwrap();
        let failed = relay
            .execute("INSERT INTO missing VALUES (1)", &[])
            .unwrap_err();
        let cause = std::error::Error::source(&failed).map(ToString::to_string);
        assert_eq!(cause.as_deref(), Some("no such table: missing"));
        relay.rollback();
        other.busy_timeout(Duration::ZERO).unwrap();
        other.execute_batch("BEGIN IMMEDIATE; COMMIT").unwrap();
        relay.begin().unwrap();
        relay.execute("INSERT INTO t VALUES (2)", &[]).unwrap();
        relay.commit().unwrap();
        assert_eq!(numbers(&other), [2]);
        remove(&path);
    }
}
