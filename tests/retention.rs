//! Retention of the audit trail and the replacement history
//! (docs/CONTRACT.md §9) on real SQLite files and PostgreSQL: windows on the
//! receiver's injectable clock, exact counts of rows purged and kept, the
//! rows of held, parked and unresolved events kept, the SQLite file flat
//! over three short windows, and a restart after a purge.

use crate::common::{body, cli, t};
use crate::durability::{drop_schema, pg, pg_url};
use crate::store::temp_db;
use snapshot_receiver::store::{PostgresStore, Purged, SqliteOptions, SqliteStore, StoreReader};
use snapshot_receiver::{
    Ack, AuthoritativeSnapshot, Clock, Decision, HoldReason, ManualClock, Receiver,
    ReceiverBuilder, Verdict,
};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const MIN: Duration = Duration::from_secs(60);

/// Rows of each table, as a test counts them.
#[derive(Debug, PartialEq, Eq)]
struct Rows {
    audit: i64,
    replacements: i64,
    held: i64,
    receipts: i64,
}

/// Counts a store's rows, whatever the backend.
type Counter = Box<dyn Fn() -> Rows + Send + Sync>;

fn sqlite_rows(path: &Path) -> Rows {
    let conn = rusqlite::Connection::open(path).unwrap();
    let n = |table: &str| -> i64 {
        conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
            .unwrap()
    };
    Rows {
        audit: n("audit"),
        replacements: n("replacements"),
        held: n("held"),
        receipts: n("receipts"),
    }
}

fn pg_rows(url: &str, schema: &str) -> Rows {
    let sql = format!(
        "SELECT (SELECT count(*) FROM {schema}.audit), (SELECT count(*) FROM {schema}.replacements),
                (SELECT count(*) FROM {schema}.held), (SELECT count(*) FROM {schema}.receipts)"
    );
    pg(url, move |c| {
        let r = c.query_one(&sql, &[]).unwrap();
        Rows {
            audit: r.get(0),
            replacements: r.get(1),
            held: r.get(2),
            receipts: r.get(3),
        }
    })
}

/// The receiver of these tests: card-1, card-2 and card-3 known at v0,
/// audit rows kept 10 min, history rows 20 min, purges of 3 rows per
/// transaction, no periodic purge (the test purges).
fn builder(clock: &Arc<ManualClock>) -> ReceiverBuilder {
    Receiver::builder()
        .clock(clock.clone() as Arc<dyn Clock>)
        .purge_interval(None)
        .audit_retention(10 * MIN)
        .history_retention(20 * MIN)
        .purge_batch(3)
        .object("card-1", 0, r#"{"n":0}"#)
        .object("card-2", 0, r#"{"n":0}"#)
        .object("card-3", 0, r#"{"n":0}"#)
}

fn at(offset: Duration) -> String {
    snapshot_receiver::format_rfc3339(t() + offset)
}

/// The deliveries at T: nine audit rows, one history row for each of
/// e-1 and e-5, and four held rows (e-3 missing its version, redelivered
/// once, e-4 parked for card-9, e-6 a version_state conflict that pauses
/// card-3, a malformed body).
async fn first_deliveries(rx: &Receiver) {
    let t0 = at(Duration::ZERO);
    let e1 = body("e-1", "card-1", Some("1"), &t0, r#"{"n":1}"#);
    let e3 = body("e-3", "card-2", None, &t0, r#"{"n":3}"#);
    let cases: [(String, Decision); 9] = [
        (e1.clone(), Decision::Applied),
        (
            e1,
            Decision::Duplicate {
                original: Verdict::Applied,
            },
        ),
        (
            body("e-2", "card-1", Some("0"), &t0, r#"{"n":0}"#),
            Decision::Stale,
        ),
        (e3.clone(), Decision::Held(HoldReason::MissingVersion)),
        (
            e3,
            Decision::Duplicate {
                original: Verdict::Held(HoldReason::MissingVersion),
            },
        ),
        (
            body("e-4", "card-9", Some("1"), &t0, r#"{"n":4}"#),
            Decision::Held(HoldReason::UnknownObject),
        ),
        (
            body("e-5", "card-3", Some("1"), &t0, r#"{"n":5}"#),
            Decision::Applied,
        ),
        (
            body("e-6", "card-3", Some("1"), &t0, r#"{"n":6}"#),
            Decision::Conflict(snapshot_receiver::ConflictKind::VersionState),
        ),
        (
            "{\"event_id\":".to_owned(),
            Decision::Held(HoldReason::Malformed),
        ),
    ];
    for (body, decision) in cases {
        let receipt = rx.deliver(body.as_bytes()).await;
        assert_eq!(receipt.decision(), Some(decision), "{body}");
    }
}

/// The states of the stored history, in order.
async fn history(rx: &Receiver) -> Vec<(String, u64, String)> {
    rx.outbox(0, usize::MAX)
        .await
        .unwrap()
        .into_iter()
        .map(|e| {
            (
                e.object_id.to_string(),
                e.version,
                e.state.as_str().to_owned(),
            )
        })
        .collect()
}

/// Delivers `body`, which must apply, then reads the stored effects after
/// the outbox cursor `last`: (object, version) of each.
async fn applied_then_effects_after(rx: &Receiver, body: &str, last: u64) -> Vec<(String, u64)> {
    assert_eq!(
        rx.deliver(body.as_bytes()).await.decision(),
        Some(Decision::Applied),
        "{body}"
    );
    rx.outbox(last, usize::MAX)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.object_id.to_string(), e.version))
        .collect()
}

/// The windows, purge counts and kept rows on one store; `open` builds the
/// receiver on it (again after a restart), `rows` counts its tables.
async fn windows_purge_exactly(
    open: impl Fn(ReceiverBuilder) -> ReceiverBuilder,
    rows: Counter,
    reader: impl Fn() -> StoreReader,
) {
    // The reader's PostgreSQL client blocks: off the runtime's async path.
    let trail =
        |event: &str| tokio::task::block_in_place(|| reader().audit_for_event(event).unwrap());
    let clock = Arc::new(ManualClock::new(t()));
    let rx = open(builder(&clock)).build().unwrap();
    first_deliveries(&rx).await;
    // Nothing is older than a window yet.
    assert_eq!(rx.purge_expired_records().await.unwrap(), Purged::default());
    // e-7 at T+15 min: inside both windows at every purge below.
    clock.set(t() + 15 * MIN);
    let e7 = body("e-7", "card-1", Some("2"), &at(15 * MIN), r#"{"n":7}"#);
    assert_eq!(
        rx.deliver(e7.as_bytes()).await.decision(),
        Some(Decision::Applied)
    );
    let before = rows();
    assert_eq!(
        before,
        Rows {
            audit: 10,
            replacements: 3,
            held: 4,
            receipts: 7
        }
    );
    let e3_trail = trail("e-3");
    assert_eq!(e3_trail.len(), 2);
    let states = history(&rx).await;
    assert_eq!(
        states,
        [
            ("card-1".into(), 1, r#"{"n":1}"#.into()),
            ("card-3".into(), 1, r#"{"n":5}"#.into()),
            ("card-1".into(), 2, r#"{"n":7}"#.into()),
        ]
    );

    // T+15 min: audit rows before T+5 min may go. Of the nine at T only
    // e-1's two and e-2's justify nothing still held: e-3's two (held: the
    // step that held it and its redelivery), e-4 (parked), e-6 (held
    // conflict) and the malformed body stay, and so does e-5, a row of
    // card-3, which e-6 paused.
    assert_eq!(
        rx.purge_expired_records().await.unwrap(),
        Purged {
            audit: 3,
            history: 0,
            resolved: 0
        }
    );
    assert_eq!(rows().audit, 7);
    assert_eq!(rows().held, 4);
    assert_eq!(trail("e-1"), []);
    assert_eq!(trail("e-3"), e3_trail);
    assert_eq!(trail("e-4").len(), 1);
    assert_eq!(trail("e-5").len(), 1);
    assert_eq!(trail("e-6").len(), 1);
    // e-1's history row took its state from e-1's audit body: it was
    // copied in before the body went, and reads the same.
    assert_eq!(history(&rx).await, states);

    // T+25 min: history rows before T+5 min go (e-1's and e-5's); e-7's
    // audit row, at T+15 min, is not older than T+15 min and stays.
    clock.set(t() + 25 * MIN);
    assert_eq!(
        rx.purge_expired_records().await.unwrap(),
        Purged {
            audit: 0,
            history: 2,
            resolved: 0
        }
    );
    assert_eq!(
        history(&rx).await,
        [("card-1".into(), 2, r#"{"n":7}"#.into())]
    );

    // An authority introduces card-9 at v0: the parked e-4 (v1) applies,
    // its held row is resolved, and two audit rows and two history rows
    // are recorded at T+25 min.
    let authority = AuthoritativeSnapshot::new("card-9", 0, r#"{"n":9}"#, t() + 25 * MIN).unwrap();
    rx.reconcile(authority).await.unwrap();
    assert_eq!(rx.object("card-9").await.unwrap().version, 1);

    // T+40 min: audit rows before T+30 min go: e-4's delivery (no longer
    // held), e-7's and the authority's (T+25 min), but not e-4's
    // re-decision, the row of the highest sequence number; the resolved
    // held row of e-4 (held at T) goes with them; e-7's history row (T+15
    // min) is older than T+20 min, the two at T+25 min are not. Still kept:
    // e-3 held, card-3's rows (paused), the malformed body.
    clock.set(t() + 40 * MIN);
    assert_eq!(
        rx.purge_expired_records().await.unwrap(),
        Purged {
            audit: 3,
            history: 1,
            resolved: 1
        }
    );
    assert_eq!(
        rows(),
        Rows {
            audit: 6,
            replacements: 2,
            held: 3,
            receipts: 7
        }
    );
    assert_eq!(trail("e-3"), e3_trail);
    assert_eq!(trail("e-4").len(), 1);
    assert_eq!(trail("e-7"), []);
    assert_eq!(
        tokio::task::block_in_place(|| reader().held(None).unwrap())
            .iter()
            .map(|h| h.event_id.clone())
            .collect::<Vec<_>>(),
        [Some("e-3".to_owned()), Some("e-6".to_owned()), None]
    );
    let last = rx
        .outbox(0, usize::MAX)
        .await
        .unwrap()
        .last()
        .unwrap()
        .position;
    rx.shutdown().await;
    drop(rx);

    // A restart after the purge: identities inside their window (24 h)
    // are still duplicates with their first decision, whose audit rows are
    // gone; held queues and pauses are as before.
    let rx = open(builder(&clock)).build().unwrap();
    // The first step after the restart: its effect is numbered after every
    // effect before it, so an outbox cursor stays valid across the purge.
    let e8 = body("e-8", "card-1", Some("3"), &at(40 * MIN), r#"{"n":8}"#);
    assert_eq!(
        applied_then_effects_after(&rx, &e8, last).await,
        [("card-1".to_owned(), 3)]
    );
    let t0 = at(Duration::ZERO);
    for (body, original) in [
        (
            body("e-1", "card-1", Some("1"), &t0, r#"{"n":1}"#),
            Verdict::Applied,
        ),
        (
            body("e-2", "card-1", Some("0"), &t0, r#"{"n":0}"#),
            Verdict::Stale,
        ),
        (e7, Verdict::Applied),
    ] {
        assert_eq!(
            rx.deliver(body.as_bytes()).await.decision(),
            Some(Decision::Duplicate { original }),
            "{body}"
        );
    }
    let card3 = rx.object("card-3").await.unwrap();
    assert_eq!((card3.version, card3.paused, card3.held), (1, true, 1));
    assert_eq!(rx.object("card-2").await.unwrap().held, 1);
    rx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_windows_purge_exact_rows_and_keep_what_is_held() {
    let path = temp_db("retention-windows");
    let location = format!("sqlite:{}", path.display());
    let (p, l) = (path.clone(), location.clone());
    windows_purge_exactly(
        move |b| b.store(&l),
        Box::new(move || sqlite_rows(&p)),
        || StoreReader::open(&location, None).unwrap(),
    )
    .await;
    purge_command(&format!("sqlite:{}", path.display()), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_windows_purge_exact_rows_and_keep_what_is_held() {
    let Some(url) = pg_url() else { return };
    let schema = format!("sr_retention_{}", std::process::id());
    drop_schema(&url, &schema);
    let (u, s) = (url.clone(), schema.clone());
    let (u2, s2) = (url.clone(), schema.clone());
    let (u3, s3) = (url.clone(), schema.clone());
    windows_purge_exactly(
        move |b| {
            let (u, s) = (u.clone(), s.clone());
            b.store_with(move || PostgresStore::connect_in_schema(&u, Some(&s)))
        },
        Box::new(move || pg_rows(&u2, &s2)),
        move || StoreReader::open(&u3, Some(&s3)).unwrap(),
    )
    .await;
    purge_command(&url, Some(&schema));
    drop_schema(&url, &schema);
}

/// A held row resolved by an authority is purged after the audit window,
/// whatever the history window (docs/CONTRACT.md §9): e-1, parked at T for
/// card-9, is applied when an authority introduces card-9 at T; at T+15
/// min the audit window (`audit`) has passed its row or not, the history
/// window (`history`) the other way round. `open` gives the receiver its
/// store, `rows` counts the store's tables.
async fn resolved_held_rows_follow_the_audit_window(
    open: impl Fn(ReceiverBuilder) -> ReceiverBuilder,
    rows: Counter,
    audit: Duration,
    history: Duration,
) {
    let clock = Arc::new(ManualClock::new(t()));
    let rx = open(
        Receiver::builder()
            .clock(clock.clone() as Arc<dyn Clock>)
            .purge_interval(None)
            .audit_retention(audit)
            .history_retention(history),
    )
    .build()
    .unwrap();
    let e1 = body(
        "e-1",
        "card-9",
        Some("1"),
        &at(Duration::ZERO),
        r#"{"n":1}"#,
    );
    assert_eq!(
        rx.deliver(e1.as_bytes()).await.decision(),
        Some(Decision::Held(HoldReason::UnknownObject))
    );
    let authority = AuthoritativeSnapshot::new("card-9", 0, r#"{"n":0}"#, t()).unwrap();
    rx.reconcile(authority).await.unwrap();
    assert_eq!(rx.object("card-9").await.unwrap().version, 1);
    // Three audit rows (e-1 parked, the authority, e-1 applied), two
    // history rows (the authority's and e-1's), e-1's held row resolved.
    let before = rows();
    assert_eq!((before.audit, before.replacements, before.held), (3, 2, 1));
    clock.set(t() + 15 * MIN);
    let purged = rx.purge_expired_records().await.unwrap();
    // The audit rows of the highest sequence number (e-1 applied) stay.
    let expected = Purged {
        audit: if audit < 15 * MIN { 2 } else { 0 },
        history: if history < 15 * MIN { 2 } else { 0 },
        resolved: if audit < 15 * MIN { 1 } else { 0 },
    };
    assert_eq!(
        purged, expected,
        "audit window {audit:?}, history window {history:?}"
    );
    assert_eq!(rows().held, 1 - expected.resolved as i64);
    rx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_resolved_held_rows_follow_the_audit_window_not_the_history_window() {
    for (name, audit, history) in [("short-audit", 10, 60), ("long-audit", 60, 10)] {
        let path = temp_db(&format!("retention-resolved-{name}"));
        let location = format!("sqlite:{}", path.display());
        resolved_held_rows_follow_the_audit_window(
            move |b| b.store(&location),
            Box::new(move || sqlite_rows(&path)),
            audit * MIN,
            history * MIN,
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_resolved_held_rows_follow_the_audit_window_not_the_history_window() {
    let Some(url) = pg_url() else { return };
    for (name, audit, history) in [("short", 10, 60), ("long", 60, 10)] {
        let schema = format!("sr_resolved_{name}_{}", std::process::id());
        drop_schema(&url, &schema);
        let (u, s) = (url.clone(), schema.clone());
        let (u2, s2) = (url.clone(), schema.clone());
        resolved_held_rows_follow_the_audit_window(
            move |b| {
                let (u, s) = (u.clone(), s.clone());
                b.store_with(move || PostgresStore::connect_in_schema(&u, Some(&s)))
            },
            Box::new(move || pg_rows(&u2, &s2)),
            audit * MIN,
            history * MIN,
        )
        .await;
        drop_schema(&url, &schema);
    }
}

/// `purge` on the store the test above left, at T+60 min with the same
/// windows: before T+50 min, e-4's re-decision (T+25 min) and three of the
/// restart's four audit rows (T+40 min) go, not e-8's, the highest
/// sequence number; the two history rows at T+25 min go (before T+40 min),
/// e-8's, at T+40 min, stays. Printed per table.
fn purge_command(location: &str, schema: Option<&str>) {
    let mut args = vec![
        "purge".to_owned(),
        "--store".to_owned(),
        location.to_owned(),
        "--now".to_owned(),
        at(60 * MIN),
        "--audit-retention".to_owned(),
        "600".to_owned(),
        "--history-retention".to_owned(),
        "1200".to_owned(),
        "--batch".to_owned(),
        "4".to_owned(),
        "--format".to_owned(),
        "json".to_owned(),
    ];
    if let Some(schema) = schema {
        args.extend(["--store-schema".to_owned(), schema.to_owned()]);
    }
    let out = cli().args(&args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&v["purged"], &v["audit"], &v["history"], &v["resolved"]),
        (&0.into(), &4.into(), &2.into(), &0.into()),
        "{v}"
    );
    assert_eq!(v["audit_retention_seconds"], 600.0);
    assert_eq!(v["vacuumed"], false);
}

/// Store file size after a checkpoint (the WAL copied into the file).
fn checkpointed_size(path: &Path) -> u64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    drop(conn);
    std::fs::metadata(path).unwrap().len()
}

/// Three audit windows of a minute (identities, audit and history alike),
/// 1,500 new events with ~250-byte bodies each, a purge at the end of each:
/// the file ends within 10 % of its size after the first window, and once
/// every window has passed the purge gives the pages back to the file
/// system (`auto_vacuum = INCREMENTAL`, `incremental_vacuum`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_file_stays_flat_over_three_audit_windows() {
    const PER_WINDOW: u64 = 1500;
    let path = temp_db("retention-soak");
    let clock = Arc::new(ManualClock::new(t()));
    let p = path.display().to_string();
    let mut b = Receiver::builder()
        .clock(clock.clone() as Arc<dyn Clock>)
        .purge_interval(None)
        .retention(MIN)
        .audit_retention(MIN)
        .history_retention(MIN)
        .store_with(move || {
            SqliteStore::open(
                &p,
                SqliteOptions {
                    synchronous: "NORMAL".to_owned(),
                    ..SqliteOptions::default()
                },
            )
        });
    for o in 0..100 {
        b = b.object(&format!("card-{o}"), 0, r#"{"n":0}"#);
    }
    let rx = b.build().unwrap();
    let pad = "p".repeat(150);
    let mut sizes = Vec::new();
    for window in 0..3u64 {
        let start = t() + MIN * window as u32;
        for chunk in 0..(PER_WINDOW / 100) {
            clock.set(start + Duration::from_millis(chunk * 60_000 / (PER_WINDOW / 100)));
            let now = snapshot_receiver::format_rfc3339(clock.now());
            let bodies: Vec<String> = (0..100)
                .map(|o| {
                    let v = window * (PER_WINDOW / 100) + chunk + 1;
                    body(
                        &format!("e-{o}-{v}"),
                        &format!("card-{o}"),
                        Some(&v.to_string()),
                        &now,
                        &format!(r#"{{"n":{v},"pad":"{pad}"}}"#),
                    )
                })
                .collect();
            for r in rx.deliver_batch(&bodies).await {
                assert_eq!(r.ack(), Ack::Acknowledge);
            }
        }
        clock.set(start + MIN);
        rx.purge_expired_identities().await.unwrap();
        let purged = rx.purge_expired_records().await.unwrap();
        // The window before this one, exactly: every delivery made one
        // audit row and one history row.
        let expect = if window == 0 { 0 } else { PER_WINDOW };
        assert_eq!((purged.audit, purged.history), (expect, expect));
        sizes.push(checkpointed_size(&path));
    }
    let (first, last) = (sizes[0] as f64, sizes[2] as f64);
    assert!(
        (last - first).abs() <= first * 0.10,
        "file sizes after each window: {sizes:?}"
    );
    // Every window over: the purge leaves one audit row (the highest
    // sequence number, where a restart numbers from), and the file gives
    // the room back.
    clock.set(t() + 10 * MIN);
    let effects = rx.outbox(0, usize::MAX).await.unwrap();
    let last = effects.last().unwrap().position;
    rx.purge_expired_identities().await.unwrap();
    let purged = rx.purge_expired_records().await.unwrap();
    assert_eq!((purged.audit, purged.history), (PER_WINDOW - 1, PER_WINDOW));
    rx.shutdown().await;
    drop(rx);
    let empty = checkpointed_size(&path);
    assert!(
        (empty as f64) < first * 0.5,
        "after the last purge {empty} bytes, after the first window {first}"
    );
    let conn = rusqlite::Connection::open(&path).unwrap();
    let mode: i64 = conn
        .query_row("PRAGMA auto_vacuum", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        mode, 2,
        "a new store is created with auto_vacuum = INCREMENTAL"
    );
    drop(conn);
    // A restart on the purged store numbers its steps after the last one
    // recorded: a relay's outbox cursor still sees the next effect.
    let p = path.display().to_string();
    let rx = Receiver::builder()
        .clock(clock.clone() as Arc<dyn Clock>)
        .purge_interval(None)
        .store_with(move || SqliteStore::open(&p, SqliteOptions::default()))
        .build()
        .unwrap();
    let next = body(
        "e-next",
        "card-0",
        Some("1000"),
        &at(10 * MIN),
        r#"{"n":1000}"#,
    );
    assert_eq!(
        applied_then_effects_after(&rx, &next, last).await,
        [("card-0".to_owned(), 1000)]
    );
    rx.shutdown().await;
}

/// A store created before `auto_vacuum` was set keeps its mode until
/// `purge --vacuum` rebuilds it once.
#[test]
fn purge_vacuum_converts_an_old_store_to_incremental_auto_vacuum() {
    let path = temp_db("retention-vacuum");
    {
        // As an older build left it: a table created before any auto_vacuum.
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch("PRAGMA auto_vacuum = NONE; CREATE TABLE objects (object_id TEXT PRIMARY KEY, version TEXT NOT NULL CHECK (length(version) = 20), state TEXT NOT NULL, paused INTEGER NOT NULL);")
            .unwrap();
    }
    let path_text = path.display().to_string();
    let store = SqliteStore::open(&path_text, SqliteOptions::default()).unwrap();
    assert_eq!(store.auto_vacuum().unwrap(), 0);
    drop(store);
    let location = format!("sqlite:{path_text}");
    let out = cli()
        .args([
            "purge",
            "--store",
            &location,
            "--vacuum",
            "--now",
            &at(Duration::ZERO),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("purged 0 audit rows and 0 resolved held rows (audit retention 604800 s), 0 history rows (history retention 604800 s); file rebuilt (VACUUM)\n"),
        "{text}"
    );
    let store = SqliteStore::open(&path_text, SqliteOptions::default()).unwrap();
    assert_eq!(store.auto_vacuum().unwrap(), 2);
    // PostgreSQL leaves the room to autovacuum: the flag is refused there.
    let out = cli()
        .args([
            "purge",
            "--store",
            "postgres://127.0.0.1:1/none",
            "--vacuum",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "error: --vacuum: only a SQLite store is vacuumed (PostgreSQL leaves it to autovacuum)\n"
    );
}

/// A history row as a store made before the state pointer (origin 1, seq
/// 1: card-1 v0 by an authority), then one delivery through a receiver on
/// it: the old row reads as before, the new one takes its state from the
/// delivery's body.
async fn an_old_history_table_is_extended(
    open: impl Fn(ReceiverBuilder) -> ReceiverBuilder,
    columns: impl Fn() -> Vec<(String, Option<i64>)>,
) {
    let clock = Arc::new(ManualClock::new(t()));
    let rx = open(builder(&clock)).build().unwrap();
    let e1 = body(
        "e-1",
        "card-1",
        Some("1"),
        &at(Duration::ZERO),
        r#"{"n":1}"#,
    );
    assert_eq!(
        rx.deliver(e1.as_bytes()).await.decision(),
        Some(Decision::Applied)
    );
    assert_eq!(
        history(&rx).await,
        [
            ("card-1".into(), 0, r#"{"n":0}"#.into()),
            ("card-1".into(), 1, r#"{"n":1}"#.into()),
        ]
    );
    rx.shutdown().await;
    // The state is stored once: in the audit row's body, where it starts
    // after `"state":`.
    let offset = e1.find(r#"{"n":1}"#).unwrap() as i64;
    assert_eq!(
        columns(),
        [
            (r#"{"n":0}"#.to_owned(), None),
            (String::new(), Some(offset))
        ]
    );
}

/// The history table as SQLite stores were created before the pointer.
const OLD_SQLITE_REPLACEMENTS: &str = "CREATE TABLE replacements (
    origin INTEGER NOT NULL, seq INTEGER NOT NULL, at_ns INTEGER NOT NULL,
    object_id TEXT NOT NULL, version TEXT NOT NULL, state TEXT NOT NULL,
    cause_event TEXT, PRIMARY KEY (origin, seq));
INSERT INTO replacements VALUES (1, 1, 0, 'card-1', '00000000000000000000', '{\"n\":0}', NULL);";

/// The same on PostgreSQL.
const OLD_PG_REPLACEMENTS: &str = "CREATE TABLE replacements (
    id BIGINT GENERATED ALWAYS AS IDENTITY, origin BIGINT NOT NULL, seq BIGINT NOT NULL,
    at_ns BIGINT NOT NULL, object_id TEXT NOT NULL, version TEXT NOT NULL,
    state TEXT NOT NULL, cause_event TEXT, PRIMARY KEY (origin, seq));
INSERT INTO replacements (origin, seq, at_ns, object_id, version, state)
    VALUES (1, 1, 0, 'card-1', '00000000000000000000', '{\"n\":0}');";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_from_before_the_state_pointer_is_extended() {
    let path = temp_db("retention-old-history");
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch(OLD_SQLITE_REPLACEMENTS)
        .unwrap();
    let location = format!("sqlite:{}", path.display());
    an_old_history_table_is_extended(
        move |b| b.store(&location),
        || {
            let conn = rusqlite::Connection::open(&path).unwrap();
            let mut st = conn
                .prepare("SELECT state, state_at FROM replacements ORDER BY seq")
                .unwrap();
            st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                .unwrap()
                .map(Result::unwrap)
                .collect()
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_from_before_the_state_pointer_is_extended() {
    let Some(url) = pg_url() else { return };
    let schema = format!("sr_retention_old_{}", std::process::id());
    drop_schema(&url, &schema);
    let create =
        format!("CREATE SCHEMA {schema}; SET search_path TO {schema}; {OLD_PG_REPLACEMENTS}");
    pg(&url, move |c| c.batch_execute(&create).unwrap());
    let (u, s) = (url.clone(), schema.clone());
    let (u2, s2) = (url.clone(), schema.clone());
    an_old_history_table_is_extended(
        move |b| {
            let (u, s) = (u.clone(), s.clone());
            b.store_with(move || PostgresStore::connect_in_schema(&u, Some(&s)))
        },
        move || {
            let sql = format!("SELECT state, state_at FROM {s2}.replacements ORDER BY seq");
            pg(&u2, move |c| {
                c.query(&sql, &[])
                    .unwrap()
                    .iter()
                    .map(|r| (r.get(0), r.get(1)))
                    .collect()
            })
        },
    )
    .await;
    drop_schema(&url, &schema);
}

/// The audit rows of e-1 as stored: (seq, body in place, body_seq).
type Placed = Vec<(i64, Option<Vec<u8>>, Option<i64>)>;

/// A redelivery's exact bytes are stored once (docs/CONTRACT.md §9): e-1
/// applied at T, the same bytes at T+8 min point at its row, a re-encoded
/// copy (one space more) keeps its own; every read returns each copy's
/// bytes. At T+15 min the purge takes the row at T and copies its bytes
/// into the redelivery first. `placed` reads the stored columns.
async fn repeated_bytes_are_stored_once(
    open: impl Fn(ReceiverBuilder) -> ReceiverBuilder,
    placed: impl Fn() -> Placed,
    reader: impl Fn() -> StoreReader,
) {
    let bodies = || {
        tokio::task::block_in_place(|| reader().audit_for_event("e-1").unwrap())
            .into_iter()
            .map(|line| line.body.unwrap())
            .collect::<Vec<_>>()
    };
    let clock = Arc::new(ManualClock::new(t()));
    let rx = open(builder(&clock)).build().unwrap();
    let e1 = body(
        "e-1",
        "card-1",
        Some("1"),
        &at(Duration::ZERO),
        r#"{"n":1}"#,
    );
    let spaced = e1.replacen(',', ", ", 1);
    let duplicate = Some(Decision::Duplicate {
        original: Verdict::Applied,
    });
    assert_eq!(
        rx.deliver(e1.as_bytes()).await.decision(),
        Some(Decision::Applied)
    );
    clock.set(t() + 8 * MIN);
    assert_eq!(rx.deliver(e1.as_bytes()).await.decision(), duplicate);
    assert_eq!(rx.deliver(spaced.as_bytes()).await.decision(), duplicate);
    let rows = placed();
    let seq: Vec<i64> = rows.iter().map(|r| r.0).collect();
    let (e1b, spacedb) = (e1.as_bytes().to_vec(), spaced.as_bytes().to_vec());
    assert_eq!(
        rows,
        [
            (seq[0], Some(e1b.clone()), None),
            (seq[1], None, Some(seq[0])),
            (seq[2], Some(spacedb.clone()), None),
        ]
    );
    assert_eq!(bodies(), [e1.clone(), e1.clone(), spaced.clone()]);

    clock.set(t() + 15 * MIN);
    assert_eq!(
        rx.purge_expired_records().await.unwrap(),
        Purged {
            audit: 1,
            history: 0,
            resolved: 0
        }
    );
    assert_eq!(
        placed(),
        [
            (seq[1], Some(e1b.clone()), None),
            (seq[2], Some(spacedb.clone()), None)
        ]
    );
    assert_eq!(bodies(), [e1.clone(), spaced.clone()]);
    assert_eq!(
        history(&rx).await,
        [("card-1".into(), 1, r#"{"n":1}"#.into())]
    );
    // The same bytes once more: the row the store remembers them by is
    // gone, so they are stored in place.
    assert_eq!(rx.deliver(e1.as_bytes()).await.decision(), duplicate);
    let rows = placed();
    assert_eq!(
        rows,
        [
            (seq[1], Some(e1b.clone()), None),
            (seq[2], Some(spacedb), None),
            (rows[2].0, Some(e1b), None)
        ]
    );
    assert_eq!(bodies(), [e1.clone(), spaced, e1]);
    rx.shutdown().await;
}

fn sqlite_placed(path: &Path, event: &str) -> Placed {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut st = conn
        .prepare("SELECT seq, body, body_seq FROM audit WHERE event_id = ?1 ORDER BY seq")
        .unwrap();
    st.query_map([event], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_repeated_bytes_are_stored_once() {
    let path = temp_db("retention-repeats");
    let location = format!("sqlite:{}", path.display());
    let l = location.clone();
    repeated_bytes_are_stored_once(
        move |b| b.store(&l),
        || sqlite_placed(&path, "e-1"),
        || StoreReader::open(&location, None).unwrap(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_repeated_bytes_are_stored_once() {
    let Some(url) = pg_url() else { return };
    let schema = format!("sr_retention_repeats_{}", std::process::id());
    drop_schema(&url, &schema);
    let (u, s) = (url.clone(), schema.clone());
    let (u2, s2) = (url.clone(), schema.clone());
    let (u3, s3) = (url.clone(), schema.clone());
    repeated_bytes_are_stored_once(
        move |b| {
            let (u, s) = (u.clone(), s.clone());
            b.store_with(move || PostgresStore::connect_in_schema(&u, Some(&s)))
        },
        move || {
            let sql = format!(
                "SELECT seq, body, body_seq FROM {s2}.audit WHERE event_id = 'e-1' ORDER BY seq"
            );
            pg(&u2, move |c| {
                c.query(&sql, &[])
                    .unwrap()
                    .iter()
                    .map(|r| (r.get(0), r.get(1), r.get(2)))
                    .collect()
            })
        },
        move || StoreReader::open(&u3, Some(&s3)).unwrap(),
    )
    .await;
    drop_schema(&url, &schema);
}

/// The first copy of e-1 in `fixtures/store-before-repeats/stream.json`.
const FIXTURE_E1: &str = r#"{"event_id":"e-1","type":"card.snapshot","object_id":"card-1","object_version":1,"occurred_at":"2024-01-01T08:00:00Z","state":{"n":1}}"#;

/// A store the version before repeated bodies were stored once wrote
/// (`fixtures/store-before-repeats/`, made as its README says): read
/// without migrating it, then opened by a receiver, which adds the column;
/// the old rows read as before, e-1's copy after the restart keeps its
/// bytes in place (nothing remembered of before it), and a new event's
/// exact redelivery points at its first copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_from_before_repeated_bodies_is_read_then_migrated() {
    let path = temp_db("retention-before-repeats");
    std::fs::copy(
        crate::common::repo("fixtures/store-before-repeats/store.db"),
        &path,
    )
    .unwrap();
    let location = format!("sqlite:{}", path.display());
    let bodies = |event: &str| {
        tokio::task::block_in_place(|| {
            StoreReader::open(&location, None)
                .unwrap()
                .audit_for_event(event)
                .unwrap()
        })
        .into_iter()
        .map(|line| line.body.unwrap())
        .collect::<Vec<_>>()
    };
    let columns = || {
        let conn = rusqlite::Connection::open(&path).unwrap();
        let mut st = conn
            .prepare("SELECT name FROM pragma_table_info('audit') WHERE name = 'body_seq'")
            .unwrap();
        st.query_map([], |r| r.get::<_, String>(0)).unwrap().count()
    };
    assert_eq!(columns(), 0);
    assert_eq!(bodies("e-1"), [FIXTURE_E1, FIXTURE_E1]);

    let now = snapshot_receiver::parse_rfc3339("2024-01-01T08:01:00Z").unwrap();
    let clock = Arc::new(ManualClock::new(now));
    let rx = Receiver::builder()
        .clock(clock.clone() as Arc<dyn Clock>)
        .purge_interval(None)
        .store(&location)
        .build()
        .unwrap();
    assert_eq!(columns(), 1);
    let duplicate = Some(Decision::Duplicate {
        original: Verdict::Applied,
    });
    assert_eq!(
        rx.deliver(FIXTURE_E1.as_bytes()).await.decision(),
        duplicate
    );
    let e3 = body(
        "e-3",
        "card-1",
        Some("2"),
        "2024-01-01T08:00:30Z",
        r#"{"n":3}"#,
    );
    assert_eq!(
        rx.deliver(e3.as_bytes()).await.decision(),
        Some(Decision::Applied)
    );
    assert_eq!(rx.deliver(e3.as_bytes()).await.decision(), duplicate);
    rx.shutdown().await;
    let old = sqlite_placed(&path, "e-1");
    let e1b = FIXTURE_E1.as_bytes().to_vec();
    assert_eq!(
        old.iter().map(|r| (r.1.clone(), r.2)).collect::<Vec<_>>(),
        [
            (Some(e1b.clone()), None),
            (Some(e1b.clone()), None),
            (Some(e1b), None)
        ]
    );
    let new = sqlite_placed(&path, "e-3");
    assert_eq!(
        new.iter().map(|r| (r.1.clone(), r.2)).collect::<Vec<_>>(),
        [(Some(e3.as_bytes().to_vec()), None), (None, Some(new[0].0))]
    );
    assert_eq!(bodies("e-1"), [FIXTURE_E1; 3]);
    assert_eq!(bodies("e-3"), [e3.clone(), e3]);
}

/// The same on PostgreSQL: a store as this version creates it, less the
/// column (dropped with its index: the audit table as the version before
/// created it), with e-1's delivery (origin 1, seq 1), is read by
/// `audit_for_event` without migrating it; a store opened on it gains
/// `body_seq` back and reads the row the same.
#[test]
fn postgres_store_from_before_repeated_bodies_is_read_then_migrated() {
    let Some(url) = pg_url() else { return };
    let schema = format!("sr_retention_old_audit_{}", std::process::id());
    drop_schema(&url, &schema);
    let open = || {
        let (u, s) = (url.clone(), schema.clone());
        PostgresStore::connect_in_schema(&u, Some(&s)).unwrap();
    };
    open();
    let old = format!(
        "SET search_path TO {schema}; ALTER TABLE audit DROP COLUMN body_seq CASCADE;
         INSERT INTO audit (origin, seq, at_ns, event_id, object_id, kind, decision, version, replacement, body)
         VALUES (1, 1, 0, 'e-1', 'card-1', 'delivery', 'stale', '00000000000000000000', FALSE,
                 convert_to('{}', 'UTF8'))",
        FIXTURE_E1.replace('\'', "''")
    );
    pg(&url, move |c| c.batch_execute(&old).unwrap());
    let columns = || {
        let sql = format!(
            "SELECT count(*) FROM information_schema.columns WHERE table_schema = '{schema}'
             AND table_name = 'audit' AND column_name = 'body_seq'"
        );
        pg(&url, move |c| {
            c.query_one(&sql, &[]).unwrap().get::<_, i64>(0)
        })
    };
    let read = || {
        StoreReader::open(&url, Some(&schema))
            .unwrap()
            .audit_for_event("e-1")
            .unwrap()
            .into_iter()
            .map(|line| line.body.unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(columns(), 0);
    assert_eq!(read(), [FIXTURE_E1]);
    open();
    assert_eq!(columns(), 1);
    assert_eq!(read(), [FIXTURE_E1]);
    drop_schema(&url, &schema);
}
