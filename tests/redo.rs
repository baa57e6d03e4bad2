//! The lost-race path of a durable store, forced deterministically: a commit
//! whose conditions no longer hold (another receiver process changed the
//! row, or recorded the identity first) makes the shard reload the rows and
//! decide its batch again, up to 8 times; a ninth conflict in a row answers
//! `retry`.

use crate::common::{body, t, T};
use crate::durability::{drop_schema, pg, pg_url};
use crate::store::temp_db;
use snapshot_receiver::store::{
    Fault, FaultyStore, PostgresStore, SqliteOptions, SqliteStore, Store, StoreError,
};
use snapshot_receiver::{Clock, Decision, ManualClock, Outcome, Receiver, RetryReason, Verdict};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

fn card7(event: &str, version: u64, state: &str) -> String {
    body(event, "card-7", Some(&version.to_string()), T, state)
}

fn ns(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH).unwrap().as_nanos() as i64
}

/// One receipt's decision code as a SQLite file holds it.
fn sqlite_receipt(path: &std::path::Path, event_id: &str) -> Option<String> {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row(
        "SELECT decision FROM receipts WHERE event_id = ?1",
        [event_id],
        |r| r.get(0),
    )
    .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_conflicts_in_a_row_are_redone_and_the_ninth_answers_retry() {
    let path = temp_db("redo-count");
    let p = path.clone();
    // How many of the next commits conflict, and how many were attempted.
    let conflicts = Arc::new(AtomicU64::new(0));
    let attempts = Arc::new(AtomicU64::new(0));
    let (c, a) = (conflicts.clone(), attempts.clone());
    let rx = Receiver::builder()
        .clock(Arc::new(ManualClock::new(t())) as Arc<dyn Clock>)
        .object("card-7", 10, r#"{"n":0}"#)
        .store_with(move || {
            let inner = SqliteStore::open(p.to_str().unwrap(), SqliteOptions::default())?;
            Ok(FaultyStore::with_faults(inner, move |_| {
                a.fetch_add(1, Ordering::SeqCst);
                let left = c.load(Ordering::SeqCst);
                (left > 0).then(|| {
                    c.store(left - 1, Ordering::SeqCst);
                    Fault::Conflict
                })
            }))
        })
        .build()
        .unwrap();
    // Commit 1 seeded card-7.
    assert_eq!(attempts.load(Ordering::SeqCst), 1);

    // Eight conflicts: decided nine times, committed by the ninth attempt.
    conflicts.store(8, Ordering::SeqCst);
    let r = rx.deliver(card7("e-1", 12, r#"{"n":1}"#).as_bytes()).await;
    assert_eq!(r.outcome, Outcome::Decided(Decision::Applied));
    assert_eq!(attempts.load(Ordering::SeqCst), 1 + 9);
    assert_eq!(conflicts.load(Ordering::SeqCst), 0);
    assert_eq!(sqlite_receipt(&path, "e-1").as_deref(), Some("applied"));
    let o = rx.object("card-7").await.unwrap();
    assert_eq!(
        (o.version, o.state.compact()),
        (12, r#"{"n":1}"#.to_owned())
    );

    // Nine conflicts: the ninth attempt's conflict answers retry.
    conflicts.store(9, Ordering::SeqCst);
    let r = rx.deliver(card7("e-2", 13, r#"{"n":2}"#).as_bytes()).await;
    assert_eq!(
        r.outcome,
        Outcome::Retry(RetryReason::StoreFailed(StoreError::Conflict(
            "injected conflict at commit 19".to_owned()
        )))
    );
    assert_eq!(attempts.load(Ordering::SeqCst), 10 + 9);
    // Nothing of it was recorded, in memory or in the file.
    assert!(rx.context().registry().get("e-2").is_none());
    let o = rx.object("card-7").await.unwrap();
    assert_eq!(
        (o.version, o.state.compact()),
        (12, r#"{"n":1}"#.to_owned())
    );
    assert_eq!(sqlite_receipt(&path, "e-2"), None);
    // The sender redelivers and it goes through at once.
    let r = rx.deliver(card7("e-2", 13, r#"{"n":2}"#).as_bytes()).await;
    assert_eq!(r.outcome, Outcome::Decided(Decision::Applied));
    assert_eq!(attempts.load(Ordering::SeqCst), 20);
    rx.shutdown().await;
}

/// Where the "other process" of the race tests writes: the receiver's own
/// SQLite file or PostgreSQL schema, through a connection of its own.
enum Other {
    Sqlite(std::path::PathBuf),
    Postgres { url: String, schema: String },
}

impl Other {
    /// Another process raised `object_id` to `version` with `state`.
    fn raise(&self, object_id: &str, version: u64, state: &str) {
        let sql = "UPDATE objects SET version = $1, state = $2 WHERE object_id = $3";
        let version = format!("{version:020}");
        match self {
            Other::Sqlite(path) => {
                let conn = rusqlite::Connection::open(path).unwrap();
                let n = conn
                    .execute(&sql.replace('$', "?"), (version, state, object_id))
                    .unwrap();
                assert_eq!(n, 1);
            }
            Other::Postgres { url, schema } => {
                let (schema, state, object_id) =
                    (schema.clone(), state.to_owned(), object_id.to_owned());
                let n = pg(url, move |c| {
                    c.batch_execute(&format!("SET search_path TO {schema}"))
                        .unwrap();
                    c.execute(sql, &[&version, &state, &object_id]).unwrap()
                });
                assert_eq!(n, 1);
            }
        }
    }

    /// Another process recorded the first receipt of `event_id`.
    fn record(&self, event_id: &str, fingerprint: u128, object_id: &str, decision: &str) {
        let fingerprint = fingerprint.to_le_bytes().to_vec();
        let sql = "INSERT INTO receipts (event_id, fingerprint, object_id, decision, first_seen_ns)
                   VALUES ($1, $2, $3, $4, $5)";
        match self {
            Other::Sqlite(path) => {
                let conn = rusqlite::Connection::open(path).unwrap();
                conn.execute(
                    &sql.replace('$', "?"),
                    (event_id, fingerprint, object_id, decision, ns(t())),
                )
                .unwrap();
            }
            Other::Postgres { url, schema } => {
                let (schema, event_id, object_id, decision) = (
                    schema.clone(),
                    event_id.to_owned(),
                    object_id.to_owned(),
                    decision.to_owned(),
                );
                pg(url, move |c| {
                    c.batch_execute(&format!("SET search_path TO {schema}"))
                        .unwrap();
                    c.execute(
                        sql,
                        &[&event_id, &fingerprint, &object_id, &decision, &ns(t())],
                    )
                    .unwrap()
                });
            }
        }
    }

    /// The stored first decision of `event_id`.
    fn receipt(&self, event_id: &str) -> Option<String> {
        match self {
            Other::Sqlite(path) => sqlite_receipt(path, event_id),
            Other::Postgres { url, schema } => {
                let (schema, event_id) = (schema.clone(), event_id.to_owned());
                pg(url, move |c| {
                    c.batch_execute(&format!("SET search_path TO {schema}"))
                        .unwrap();
                    c.query_opt(
                        "SELECT decision FROM receipts WHERE event_id = $1",
                        &[&event_id],
                    )
                    .unwrap()
                    .map(|r| r.get(0))
                })
            }
        }
    }
}

/// Another process changes card-7 behind the receiver's back, then records
/// an identity first: each time the receiver's commit conflicts, it reloads
/// and decides again against what the other process committed. (A commit
/// that went through would not be attempted again: two attempts per delivery
/// are the conflict and the redo.)
async fn lost_races<S: Store>(
    other: Other,
    open: impl FnOnce() -> Result<S, StoreError> + Send + 'static,
) {
    let attempts = Arc::new(AtomicU64::new(0));
    let counted = attempts.clone();
    let rx = Receiver::builder()
        .clock(Arc::new(ManualClock::new(t())) as Arc<dyn Clock>)
        .object("card-7", 10, r#"{"n":0}"#)
        .store_with(move || {
            Ok(FaultyStore::with_faults(open()?, move |_| {
                counted.fetch_add(1, Ordering::SeqCst);
                None
            }))
        })
        .build()
        .unwrap();
    // The identity filter's start-up scan (of an empty store) is done
    // before the first delivery, so what each delivery reads is fixed.
    crate::working_set::filter_ready(&rx).await;
    assert_eq!(attempts.load(Ordering::SeqCst), 1, "the seeding commit");
    // A stale v9 reads card-7 into the working set (a receiver reads an
    // object it does not hold from the store, and would see the other
    // process's change below): from here on the change is behind its back.
    let r = rx.deliver(card7("e-0", 9, r#"{"n":-1}"#).as_bytes()).await;
    assert_eq!(r.outcome, Outcome::Decided(Decision::Stale));
    assert_eq!(attempts.load(Ordering::SeqCst), 2, "e-0's commit");

    // The other process raised card-7 to v15: this receiver still holds v10,
    // decides `applied` for v12, its conditional update finds v15 and
    // conflicts; reloaded, v12 is `stale`.
    other.raise("card-7", 15, r#"{"by":"other"}"#);
    let r = rx.deliver(card7("e-1", 12, r#"{"n":1}"#).as_bytes()).await;
    assert_eq!(r.outcome, Outcome::Decided(Decision::Stale));
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        4,
        "a conflict, then the redo"
    );
    let o = rx.object("card-7").await.unwrap();
    assert_eq!(
        (o.version, o.state.compact(), o.paused),
        (15, r#"{"by":"other"}"#.to_owned(), false)
    );
    assert_eq!(other.receipt("e-1").as_deref(), Some("stale"));

    // The other process applied e-2 (v16) first: its receipt exists, but
    // this receiver's identity filter does not know it (it was recorded
    // after the start-up scan, by another process), so the copy is claimed
    // as new and decided `applied`; the store's unique receipt and card-7's
    // v16 make the commit conflict, and after the reload the copy is a
    // duplicate that reports the other process's decision
    // (docs/CONTRACT.md §9); the state is the other's.
    let e2 = card7("e-2", 16, r#"{"n":2}"#);
    let fingerprint = rx
        .context()
        .parser()
        .parse(e2.as_bytes())
        .unwrap()
        .fingerprint()
        .unwrap();
    other.record("e-2", fingerprint, "card-7", "applied");
    other.raise("card-7", 16, r#"{"n":2}"#);
    let r = rx.deliver(e2.as_bytes()).await;
    assert_eq!(
        r.outcome,
        Outcome::Decided(Decision::Duplicate {
            original: Verdict::Applied
        })
    );
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        6,
        "a conflict, then the redo: the filter ruled e-2 out"
    );
    // The conflict reloaded card-7: memory holds the other process's v16.
    let o = rx.object("card-7").await.unwrap();
    assert_eq!(
        (o.version, o.state.compact()),
        (16, r#"{"n":2}"#.to_owned())
    );
    assert_eq!(rx.counters().await.event_replacements, 0);
    rx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_row_another_process_changed_is_reloaded_and_decided_again() {
    let path = temp_db("redo-race");
    let p = path.clone();
    lost_races(Other::Sqlite(path), move || {
        SqliteStore::open(p.to_str().unwrap(), SqliteOptions::default())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_row_another_process_changed_is_reloaded_and_decided_again() {
    let Some(url) = pg_url() else { return };
    let schema = format!("sr_redo_{}", std::process::id());
    drop_schema(&url, &schema);
    let (u, s) = (url.clone(), schema.clone());
    lost_races(
        Other::Postgres {
            url: url.clone(),
            schema: schema.clone(),
        },
        move || PostgresStore::connect_in_schema(&u, Some(&s)),
    )
    .await;
    drop_schema(&url, &schema);
}
