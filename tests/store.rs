//! Durable stores against real SQLite files and a real PostgreSQL server.

use crate::common::{body, t, unresolved_named, versioned, T};
use snapshot_receiver::core::error_chain;
use snapshot_receiver::store::{FaultyStore, SqliteOptions, SqliteStore, StoreError};
use snapshot_receiver::{
    fixture::Fixture, Ack, Clock, Decision, HoldReason, ManualClock, Outcome, Receiver,
    ReceiverBuilder, RetryReason, Verdict,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// A fresh SQLite path under the system temp dir.
pub fn temp_db(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sr-store-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.db"));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    path
}

fn fixture() -> Fixture {
    Fixture::load(&crate::common::repo("fixtures/B62-15-events.json")).unwrap()
}

fn builder(clock: &Arc<ManualClock>) -> ReceiverBuilder {
    Receiver::builder()
        .clock(clock.clone() as Arc<dyn Clock>)
        .object("card-7", 10, r#"{"stage":"queued","label":"Map"}"#)
        .object("card-8", 3, r#"{"stage":"ready","label":"Chart"}"#)
}

fn count(path: &Path, sql: &str) -> i64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

async fn state(rx: &Receiver, id: &str) -> (u64, String, bool, usize) {
    let o = rx.object(id).await.unwrap();
    (o.version, o.state.compact(), o.paused, o.held)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_restart_resumes_states_pauses_held_queues_and_identities() {
    let path = temp_db("restart");
    let location = format!("sqlite:{}", path.display());
    let f = fixture();
    let clock = Arc::new(ManualClock::new(f.default_now().unwrap()));
    let rx = builder(&clock).store(&location).build().unwrap();
    for d in &f.deliveries[..7] {
        assert_eq!(rx.deliver(&d.body).await.ack(), Ack::Acknowledge);
    }
    rx.shutdown().await;
    drop(rx);

    // A new receiver on the same file: the initial objects do not overwrite it.
    let rx = builder(&clock).store(&location).build().unwrap();
    assert_eq!(
        state(&rx, "card-7").await,
        (12, r#"{"stage":"ready","label":"Map"}"#.into(), true, 2)
    );
    assert_eq!(
        state(&rx, "card-8").await,
        (4, r#"{"stage":"review","label":"Chart"}"#.into(), false, 1)
    );
    // The lost-acknowledgement redelivery after a restart.
    let again = rx.deliver(&f.deliveries[0].body).await;
    assert_eq!(
        again.decision(),
        Some(Decision::Duplicate {
            original: Verdict::Applied
        })
    );
    for d in &f.deliveries[7..] {
        rx.deliver(&d.body).await;
    }
    for a in &f.authority {
        rx.reconcile(a.clone()).await.unwrap();
    }
    assert_eq!(
        state(&rx, "card-7").await,
        (
            14,
            r#"{"stage":"archived","label":"Map v2"}"#.into(),
            false,
            0
        )
    );
    assert_eq!(
        state(&rx, "card-8").await,
        (5, r#"{"stage":"ready","label":"Chart"}"#.into(), false, 0)
    );
    // This run's replacements: the two authorities. The two events applied
    // before the restart are counted by the run that applied them.
    let c = rx.counters().await;
    assert_eq!((c.event_replacements, c.authority_replacements), (0, 2));
    let unresolved = unresolved_named(&rx).await;
    assert_eq!(
        unresolved,
        [
            ("e-204".into(), "missing_version"),
            ("e-202".into(), "event_variant"),
            ("e-208".into(), "unsupported_type"),
            ("e-207".into(), "unknown_object"),
        ]
    );
    rx.shutdown().await;
    drop(rx);
    // The stored trail: one receipt per identity, every decision audited.
    assert_eq!(count(&path, "SELECT count(*) FROM receipts"), 8);
    assert_eq!(
        count(&path, "SELECT count(*) FROM audit WHERE kind = 'delivery'"),
        11
    );
    assert_eq!(
        count(
            &path,
            "SELECT count(*) FROM held WHERE status = 'superseded'"
        ),
        3
    );
    assert_eq!(
        count(&path, "SELECT count(*) FROM held WHERE status = 'resolved'"),
        2
    );
    assert_eq!(
        count(
            &path,
            "SELECT count(*) FROM objects WHERE version = '00000000000000000014'"
        ),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_commit_answers_retry_changes_nothing_and_the_next_attempt_succeeds() {
    let path = temp_db("faulty");
    let p = path.clone();
    let clock = Arc::new(ManualClock::new(t()));
    // Commit 1 seeds the initial objects; commit 3 is the second delivery.
    let rx = builder(&clock)
        .store_with(move || {
            SqliteStore::open(p.to_str().unwrap(), SqliteOptions::default())
                .map(|s| FaultyStore::new(s, |n| n == 3))
        })
        .build()
        .unwrap();
    let b1 = body("e-1", "card-7", Some("12"), T, r#"{"n":1}"#);
    let b2 = body("e-2", "card-7", Some("13"), T, r#"{"n":2}"#);
    assert_eq!(
        rx.deliver(b1.as_bytes()).await.decision(),
        Some(Decision::Applied)
    );
    let r = rx.deliver(b2.as_bytes()).await;
    assert_eq!(
        r.outcome,
        Outcome::Retry(RetryReason::StoreFailed(StoreError::Failed(
            "injected failure of commit 3".into()
        )))
    );
    assert_eq!(r.ack(), Ack::Retry);
    // Nothing of the failed step is left in memory or on disk.
    assert!(rx.context().registry().get("e-2").is_none());
    assert_eq!(
        state(&rx, "card-7").await,
        (12, r#"{"n":1}"#.into(), false, 0)
    );
    assert_eq!(rx.counters().await.event_replacements, 1);
    assert_eq!(
        count(
            &path,
            "SELECT count(*) FROM receipts WHERE event_id = 'e-2'"
        ),
        0
    );
    // The sender redelivers and it goes through.
    assert_eq!(
        rx.deliver(b2.as_bytes()).await.decision(),
        Some(Decision::Applied)
    );
    assert_eq!(
        state(&rx, "card-7").await,
        (13, r#"{"n":2}"#.into(), false, 0)
    );
    assert_eq!(rx.stored_audit().await.unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_database_answers_retry_until_the_lock_is_gone() {
    let path = temp_db("locked");
    let p = path.clone();
    let clock = Arc::new(ManualClock::new(t()));
    let options = SqliteOptions {
        busy_timeout: Duration::from_millis(50),
        ..SqliteOptions::default()
    };
    let rx = builder(&clock)
        .store_with(move || SqliteStore::open(p.to_str().unwrap(), options))
        .build()
        .unwrap();
    let blocker = rusqlite::Connection::open(&path).unwrap();
    blocker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let b = body("e-1", "card-7", Some("12"), T, r#"{"n":1}"#);
    let r = rx.deliver(b.as_bytes()).await;
    assert_eq!(r.ack(), Ack::Retry);
    match &r.outcome {
        Outcome::Retry(why @ RetryReason::StoreFailed(_)) => {
            let why = error_chain(why);
            assert!(why.contains("database is locked"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    assert!(rx.context().registry().get("e-1").is_none());
    blocker.execute_batch("COMMIT").unwrap();
    assert_eq!(
        rx.deliver(b.as_bytes()).await.decision(),
        Some(Decision::Applied)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_database_answers_retry_and_a_bigger_one_takes_the_redelivery() {
    let path = temp_db("full");
    let clock = Arc::new(ManualClock::new(t()));
    let open = |pages: u64| {
        let p = path.clone();
        move || {
            SqliteStore::open(
                p.to_str().unwrap(),
                SqliteOptions {
                    max_page_count: Some(pages),
                    ..SqliteOptions::default()
                },
            )
        }
    };
    let rx = builder(&clock).store_with(open(40)).build().unwrap();
    let pad = "x".repeat(3000);
    let mut failed = None;
    for v in 11..200u64 {
        let b = body(
            &format!("e-{v}"),
            "card-7",
            Some(&v.to_string()),
            T,
            &format!("{{\"pad\":\"{pad}\",\"v\":{v}}}"),
        );
        let r = rx.deliver(b.as_bytes()).await;
        if r.ack() == Ack::Retry {
            failed = Some((v, b, r));
            break;
        }
        assert_eq!(r.decision(), Some(Decision::Applied));
    }
    let (v, b, r) = failed.expect("the file fills up");
    match &r.outcome {
        Outcome::Retry(why @ RetryReason::StoreFailed(_)) => {
            let why = error_chain(why);
            assert!(why.contains("full"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(rx.object("card-7").await.unwrap().version, v - 1);
    rx.shutdown().await;
    drop(rx);
    let rx = builder(&clock).store_with(open(100_000)).build().unwrap();
    assert_eq!(rx.object("card-7").await.unwrap().version, v - 1);
    assert_eq!(
        rx.deliver(b.as_bytes()).await.decision(),
        Some(Decision::Applied)
    );
    assert_eq!(rx.object("card-7").await.unwrap().version, v);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purged_receipts_stay_purged_after_restart_and_the_version_check_still_protects() {
    let path = temp_db("purge");
    let location = format!("sqlite:{}", path.display());
    let clock = Arc::new(ManualClock::new(t()));
    let rx = builder(&clock).store(&location).build().unwrap();
    let b = body("e-1", "card-7", Some("12"), T, r#"{"n":1}"#);
    assert_eq!(
        rx.deliver(b.as_bytes()).await.decision(),
        Some(Decision::Applied)
    );
    clock.advance(Duration::from_secs(25 * 3600));
    assert_eq!(rx.purge_expired_identities().await, Ok(1));
    assert_eq!(count(&path, "SELECT count(*) FROM receipts"), 0);
    rx.shutdown().await;
    drop(rx);
    let rx = builder(&clock).store(&location).build().unwrap();
    assert!(rx.context().registry().get("e-1").is_none());
    // An old replay that changes nothing is decided normally ...
    assert_eq!(
        rx.deliver(b.as_bytes()).await.decision(),
        Some(Decision::Equal)
    );
    // An old event without a record that would conflict is not trusted.
    let other = body("e-9", "card-7", Some("12"), T, r#"{"n":2}"#);
    assert_eq!(
        rx.deliver(other.as_bytes()).await.decision(),
        Some(Decision::Held(HoldReason::ExpiredIdentity))
    );
    // The redelivery is the identity's new first record, so a changed copy is a variant.
    let changed = body("e-1", "card-7", Some("12"), T, r#"{"n":2}"#);
    assert_eq!(
        rx.deliver(changed.as_bytes()).await.decision(),
        Some(Decision::Conflict(
            snapshot_receiver::ConflictKind::EventVariant
        ))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_producers_against_sqlite_converge_like_memory() {
    let path = temp_db("group");
    let location = format!("sqlite:{}", path.display());
    let clock = Arc::new(ManualClock::new(t()));
    let mut b = Receiver::builder()
        .clock(clock.clone() as Arc<dyn Clock>)
        .store(&location);
    for o in 0..20 {
        b = b.object(&format!("obj-{o}"), 0, r#"{"v":0}"#);
    }
    let rx = b.build().unwrap();
    let events: Vec<String> = (0..20)
        .flat_map(|o| (1..=10u64).map(move |v| versioned(o, v).1))
        .collect();
    let mut tasks = Vec::new();
    for p in 0..4u64 {
        let rx = rx.clone();
        let mut mine = events.clone();
        // Each producer walks the stream from another starting point.
        mine.rotate_left((p as usize) * 50);
        tasks.push(tokio::spawn(async move {
            let mut acks = Vec::new();
            for e in mine {
                acks.push(rx.deliver(e.as_bytes()).await.ack());
            }
            acks
        }));
    }
    for t in tasks {
        assert!(t.await.unwrap().iter().all(|a| *a == Ack::Acknowledge));
    }
    for o in rx.objects().await {
        assert_eq!(
            (o.version, o.state.compact()),
            (10, r#"{"v":10}"#.to_owned())
        );
    }
    let applied = rx.counters().await.event_replacements;
    rx.shutdown().await;
    drop(rx);
    assert_eq!(count(&path, "SELECT count(*) FROM receipts"), 200);
    assert_eq!(
        count(&path, "SELECT count(*) FROM audit WHERE kind = 'delivery'"),
        800
    );
    assert_eq!(
        count(
            &path,
            "SELECT count(*) FROM audit WHERE decision = 'applied'"
        ),
        applied as i64
    );
    assert_eq!(
        count(
            &path,
            "SELECT count(*) FROM objects WHERE version = '00000000000000000010'"
        ),
        20
    );
}

#[tokio::test]
async fn an_unknown_store_location_is_a_clear_build_error() {
    let err = Receiver::builder()
        .store("mysql://x")
        .build()
        .err()
        .unwrap();
    assert_eq!(
        error_chain(&err),
        "cannot open or read the durable store: bad store location: unsupported scheme `mysql` in \"mysql://x\": expected memory, sqlite:PATH, postgres://USER@HOST:PORT/DB or lsm:DIR"
    );
    let err = Receiver::builder()
        .store("sqlite:/no/such/dir/x.db")
        .build()
        .err()
        .unwrap();
    assert_eq!(
        error_chain(&err),
        "cannot open or read the durable store: store failure: sqlite: cannot open /no/such/dir/x.db: directory /no/such/dir: No such file or directory (os error 2)"
    );
}

/// Event `e-{v}` taking card-7 to version `v` with state `{"v":v}`.
fn card7_at(v: u64) -> String {
    body(
        &format!("e-{v}"),
        "card-7",
        Some(&v.to_string()),
        T,
        &format!("{{\"v\":{v}}}"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_cursor_stays_valid_across_a_restart() {
    let path = temp_db("outbox");
    let location = format!("sqlite:{}", path.display());
    let clock = Arc::new(ManualClock::new(t()));
    let rx = builder(&clock).store(&location).build().unwrap();
    for v in 11..=15u64 {
        rx.deliver(card7_at(v).as_bytes()).await;
    }
    let before = rx.outbox(0, 100).await.unwrap();
    assert_eq!(before.len(), 5);
    let cursor = before.last().unwrap().position;
    assert_eq!(cursor, 5);
    rx.shutdown().await;
    drop(rx);
    let rx = builder(&clock).store(&location).build().unwrap();
    for v in 16..=17u64 {
        rx.deliver(card7_at(v).as_bytes()).await;
    }
    // The relay resumes from its cursor and sees exactly the two new effects.
    let stored: Vec<(u64, u64)> = rx
        .outbox(cursor, 100)
        .await
        .unwrap()
        .iter()
        .map(|e| (e.position, e.version))
        .collect();
    assert_eq!(stored, [(6, 16), (7, 17)]);
    assert_eq!(rx.outbox(0, 100).await.unwrap().len(), 7);
}

/// A store file as earlier versions created it: SQLite's default 4 KiB
/// pages, incremental auto-vacuum, WAL, and the receipts table as they
/// created it (the receiver adds the rest when it opens the file).
const OLD_STORE: &str = "
PRAGMA page_size = 4096;
PRAGMA auto_vacuum = INCREMENTAL;
PRAGMA journal_mode = WAL;
CREATE TABLE receipts (
    event_id TEXT PRIMARY KEY, fingerprint BLOB NOT NULL, object_id TEXT NOT NULL,
    decision TEXT NOT NULL, first_seen_ns INTEGER NOT NULL);
CREATE INDEX receipts_first_seen ON receipts (first_seen_ns);";

/// A new store has 2 KiB pages and lets 16 MiB of WAL (8,192 pages) grow
/// before a commit checkpoints; a store an earlier version created keeps
/// its 4 KiB pages (SQLite fixes them in the file), checkpoints every
/// 16 MiB of them (4,096), and records and finds receipts as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_store_has_2_kib_pages_and_an_earlier_one_keeps_its_4_kib_pages() {
    let new = temp_db("pages-new");
    let store = SqliteStore::open(new.to_str().unwrap(), SqliteOptions::default()).unwrap();
    assert_eq!(store.pages().unwrap(), (2048, 8192));
    drop(store);

    let path = temp_db("pages-old");
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch(OLD_STORE)
        .unwrap();
    let location = format!("sqlite:{}", path.display());
    let f = fixture();
    let clock = Arc::new(ManualClock::new(f.default_now().unwrap()));
    let rx = builder(&clock).store(&location).build().unwrap();
    for d in &f.deliveries[..7] {
        assert_eq!(rx.deliver(&d.body).await.ack(), Ack::Acknowledge);
    }
    rx.shutdown().await;
    drop(rx);
    let rx = builder(&clock).store(&location).build().unwrap();
    let again = rx.deliver(&f.deliveries[0].body).await;
    assert_eq!(
        again.decision(),
        Some(Decision::Duplicate {
            original: Verdict::Applied
        })
    );
    rx.shutdown().await;
    drop(rx);
    let store = SqliteStore::open(path.to_str().unwrap(), SqliteOptions::default()).unwrap();
    assert_eq!(store.pages().unwrap(), (4096, 4096));
    drop(store);
    // One receipt per identity of the seven: e-201, e-202, e-206, e-204, e-203.
    assert_eq!(count(&path, "SELECT count(*) FROM receipts"), 5);
    let check: String = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
}

/// Commits of `objects` new objects each with a 1,000-byte state, one
/// group per call, the ids starting at `from`.
fn seed_group(from: usize, objects: usize) -> Vec<snapshot_receiver::store::Write> {
    use snapshot_receiver::store::{ObjectRow, Write};
    (from..from + objects)
        .map(|i| {
            Write::Seed(ObjectRow {
                object_id: Arc::from(format!("obj-{i:06}").as_str()),
                version: 1,
                state: format!("{{\"pad\":\"{}\"}}", "x".repeat(990)),
                paused: false,
            })
        })
        .collect()
}

/// The WAL file stays within its bound while commits follow one another
/// with no pause: the checkpoint thread starts the WAL over (a `PASSIVE`
/// copy alone never catches up with a writer that keeps appending), and a
/// commit that reaches the bound waits for it. 400 groups of 10 objects
/// (about 10 KiB of rows each, with the index, pointer-map and parent pages
/// it changes: up to 18 of its 2 KiB pages, fewer than 32) against a
/// 256 KiB bound and a 64 KiB checkpoint interval; every row is there
/// after the store is closed and opened again.
#[test]
fn the_wal_stays_within_its_bound_while_commits_go_on() {
    use snapshot_receiver::store::Store;
    let path = temp_db("wal-bound");
    let options = SqliteOptions {
        checkpoint_bytes: 64 * 1024,
        wal_bound_bytes: 256 * 1024,
        ..SqliteOptions::default()
    };
    let mut store = SqliteStore::open(path.to_str().unwrap(), options.clone()).unwrap();
    assert_eq!(store.pages().unwrap(), (2048, 32));
    let wal = PathBuf::from(format!("{}-wal", path.display()));
    // The WAL's header, then frames of a 24-byte header and a page each.
    let frames = |n: u64| 32 + n * (24 + 2048);
    let mut largest = 0;
    for group in 0..400 {
        store.commit(&seed_group(group * 10, 10)).unwrap();
        largest = largest.max(std::fs::metadata(&wal).unwrap().len());
    }
    assert!(
        largest <= frames(128 + 32),
        "the WAL reached {largest} bytes, past 128 frames of bound and 32 of one group ({} bytes)",
        frames(128 + 32)
    );
    assert!(
        largest > frames(32),
        "the WAL never held more than one group ({largest} bytes): the bound was not exercised"
    );
    drop(store);
    let store = SqliteStore::open(path.to_str().unwrap(), options).unwrap();
    drop(store);
    assert_eq!(count(&path, "SELECT count(*) FROM objects"), 4000);
}
