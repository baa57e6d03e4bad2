//! Operating the reconciler (issue 47, item 5; docs/CONTRACT.md §4): the
//! last error of each object waiting for an authority is kept in the store
//! (an older store gains its table when opened) and cleared when the
//! object converges; `inspect` shows it, escaped; the queue stays inside
//! its memory part; a resync pages through the store's object ids.

use crate::common::{body, t, T};
use crate::durability::pg;
use crate::relay::At;
use snapshot_receiver::authority::{AuthorityError, AuthoritySource};
use snapshot_receiver::reconciler::{Reconciler, ReconcilerOptions};
use snapshot_receiver::store::{AuthorityWaitLine, Store, StoreReader};
use snapshot_receiver::{
    AuthoritativeSnapshot, Clock, ConflictKind, Decision, ManualClock, Receiver,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const DONE: &str = r#"{"stage":"done","label":"Map"}"#;

/// What [`Switch`] answers.
#[derive(Clone, Debug)]
enum Answer {
    /// A snapshot of the object asked at this version, state [`DONE`].
    Snapshot(u64),
    /// A snapshot of another object, named so.
    Other(&'static str),
}

/// A test authority answering what it was last told, counting calls.
struct Switch {
    answer: Mutex<Answer>,
    calls: AtomicUsize,
}

impl Switch {
    fn new(answer: Answer) -> Arc<Self> {
        Arc::new(Self {
            answer: Mutex::new(answer),
            calls: AtomicUsize::new(0),
        })
    }

    fn set(&self, answer: Answer) {
        *self.answer.lock().unwrap() = answer;
    }
}

impl AuthoritySource for Switch {
    async fn fetch(
        &self,
        object_id: &str,
    ) -> Result<Option<AuthoritativeSnapshot>, AuthorityError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let answer = self.answer.lock().unwrap().clone();
        Ok(Some(match answer {
            Answer::Snapshot(v) => AuthoritativeSnapshot::new(object_id, v, DONE, t()).unwrap(),
            Answer::Other(other) => AuthoritativeSnapshot::new(other, 99, DONE, t()).unwrap(),
        }))
    }
}

/// Fast options: short backoff, rescans an hour apart.
fn options() -> ReconcilerOptions {
    ReconcilerOptions {
        rate: None,
        backoff_base: Duration::from_millis(20),
        backoff_max: Duration::from_millis(100),
        rescan: Duration::from_secs(3600),
        seed: Some(7),
        ..ReconcilerOptions::default()
    }
}

/// A receiver on `at` with card-7 v10.
fn build(at: &At) -> Receiver {
    at.store(
        Receiver::builder()
            .clock(Arc::new(ManualClock::new(t())) as Arc<dyn Clock>)
            .object("card-7", 10, r#"{"stage":"queued","label":"Map"}"#),
    )
    .build()
    .unwrap()
}

/// An event v11 applied on the object, then its variant: the object
/// paused.
async fn pause(rx: &Receiver, object_id: &str) {
    let event_id = format!("e-{object_id}");
    let first = body(&event_id, object_id, Some("11"), T, DONE);
    let variant = body(&event_id, object_id, Some("11"), T, r#"{"stage":"other"}"#);
    assert_eq!(
        rx.deliver(first.as_bytes()).await.decision(),
        Some(Decision::Applied)
    );
    assert_eq!(
        rx.deliver(variant.as_bytes()).await.decision(),
        Some(Decision::Conflict(ConflictKind::EventVariant))
    );
}

/// A read-only reader of `at`.
fn reader(at: &At) -> StoreReader {
    match at {
        At::Sqlite(path) => StoreReader::open(&format!("sqlite:{path}"), None).unwrap(),
        At::Postgres(url, schema) => StoreReader::open(url, Some(schema)).unwrap(),
        At::Lsm(_) => panic!("operator reads need a sqlite or postgres store"),
    }
}

/// The stored last errors, read off the runtime's threads.
async fn waits(at: &At) -> Vec<AuthorityWaitLine> {
    let at = at.clone();
    tokio::task::spawn_blocking(move || reader(&at).authority_waits().unwrap())
        .await
        .unwrap()
}

/// Waits (at most 20 s) until the stored last errors satisfy `done`.
async fn until_stored(at: &At, what: &str, done: impl Fn(&[AuthorityWaitLine]) -> bool) {
    for _ in 0..2000 {
        if done(&waits(at).await) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not reached; stored {:?}", waits(at).await);
}

/// Waits (at most 20 s) until `done` holds for the reconciler's state.
async fn until(reconciler: &Reconciler, what: &str, done: impl Fn(usize, u64) -> bool) {
    for _ in 0..2000 {
        let s = reconciler.status();
        if done(s.waiting, s.fetches.applied) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not reached; status {:?}", reconciler.status());
}

/// Drops the table of last errors, as a store written before it was.
fn drop_table(at: &At) {
    match at {
        At::Sqlite(path) => rusqlite::Connection::open(path)
            .unwrap()
            .execute_batch("DROP TABLE authority_waits")
            .unwrap(),
        At::Postgres(url, schema) => {
            let sql = format!("DROP TABLE {schema}.authority_waits");
            pg(url, move |c| c.batch_execute(&sql).unwrap());
        }
        At::Lsm(_) => panic!("operator reads need a sqlite or postgres store"),
    }
}

/// The authority answers card-7 older than it is: the store keeps the
/// error (reasons, outcome, words, attempts, next try); once it answers
/// well, card-7 converges and the row goes. With `old`, the store is first
/// made as one written before the table: read, it has no last errors;
/// opened by a receiver, it gains the table.
async fn last_errors_are_kept_and_cleared(at: At, old: bool) {
    if old {
        let rx = build(&at);
        rx.shutdown().await;
        drop(rx);
        drop_table(&at);
        assert_eq!(
            waits(&at).await,
            [],
            "a store without the table reads as none"
        );
    }
    let rx = build(&at);
    pause(&rx, "card-7").await;
    let source = Switch::new(Answer::Snapshot(5));
    let reconciler = rx.reconciler(source.clone(), options()).unwrap();
    until_stored(&at, "the older answer stored", |w| {
        w.len() == 1 && w[0].attempts >= 2
    })
    .await;
    let w = &waits(&at).await[0];
    assert_eq!(
        (&*w.object_id, &*w.reasons, &*w.outcome, &*w.error),
        (
            "card-7",
            "paused",
            "older",
            "the authority's version 5 is older than the object's 11: refused"
        )
    );
    assert!(w.next_try.is_some(), "{w:?}");
    // What the process shows says the same.
    let shown = reconciler.waiting();
    assert_eq!(shown[0].last_error.as_deref(), Some(&*w.error));
    source.set(Answer::Snapshot(12));
    until(&reconciler, "card-7 converged", |waiting, applied| {
        waiting == 0 && applied == 1
    })
    .await;
    until_stored(&at, "the row deleted", <[_]>::is_empty).await;
    assert!(!rx.object("card-7").await.unwrap().paused);
    reconciler.stop().await.unwrap();
    rx.shutdown().await;
    at.done();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_last_errors_are_kept_in_the_store_and_cleared_on_convergence() {
    last_errors_are_kept_and_cleared(At::sqlite("authority-waits"), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_store_from_before_the_table_opens_and_gains_it() {
    last_errors_are_kept_and_cleared(At::sqlite("authority-waits-old"), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_last_errors_are_kept_in_the_store_and_cleared_on_convergence() {
    if let Some(at) = At::postgres("authority_waits") {
        last_errors_are_kept_and_cleared(at, false).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_store_from_before_the_table_opens_and_gains_it() {
    if let Some(at) = At::postgres("authority_waits_old") {
        last_errors_are_kept_and_cleared(at, true).await;
    }
}

/// `inspect` lists card-7 waiting with the last error a reconciler wrote:
/// in text with the control characters of the answer's object id escaped
/// as the rest of the text output escapes them, in JSON as the error is.
#[test]
fn inspect_shows_the_stored_last_error_escaped() {
    let at = At::sqlite("authority-inspect");
    crate::common::runtime().block_on(async {
        let rx = build(&at);
        pause(&rx, "card-7").await;
        let source = Switch::new(Answer::Other("evil\u{1b}[2J\u{202e}"));
        let reconciler = rx.reconciler(source, options()).unwrap();
        until_stored(&at, "the wrong object stored", |w| w.len() == 1).await;
        reconciler.stop().await.unwrap();
        rx.shutdown().await;
    });
    let At::Sqlite(path) = &at else {
        unreachable!()
    };
    let store = format!("sqlite:{path}");
    let text = crate::common::cli()
        .args(["inspect", "--store", &store])
        .output()
        .unwrap();
    assert!(text.status.success(), "{text:?}");
    let text = String::from_utf8(text.stdout).unwrap();
    let line = text
        .lines()
        .skip_while(|l| *l != "== waiting for an authority ==")
        .nth(1)
        .unwrap();
    assert!(line.starts_with("card-7: paused; last error at "), "{line}");
    assert!(
        line.contains(
            " attempts: the answer is about another object, `evil\\u{1b}[2J\\u{202e}`: ignored, next try "
        ),
        "{line}"
    );
    assert!(!text.contains('\u{1b}'), "{text}");
    let json = crate::common::cli()
        .args(["inspect", "--store", &store, "--format", "json"])
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let waiting = &json["waiting_for_authority"][0];
    assert_eq!(waiting["object_id"], "card-7");
    assert_eq!(waiting["reasons"], serde_json::json!(["paused"]));
    assert_eq!(waiting["last_error"]["outcome"], "wrong_object");
    assert_eq!(
        waiting["last_error"]["error"],
        "the answer is about another object, `evil\u{1b}[2J\u{202e}`: ignored"
    );
}

/// Many paused objects, a work queue with room for five entries: the bytes
/// it counts never pass its part (nor does the receiver's count of them),
/// needs past it wait in what the receiver holds and are found again, and
/// every object converges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_paused_objects_converge_through_a_queue_held_inside_its_memory_part() {
    let ids: Vec<String> = (0..30).map(|i| format!("obj-{i:02}")).collect();
    let mut b = Receiver::builder().clock(Arc::new(ManualClock::new(t())) as Arc<dyn Clock>);
    for id in &ids {
        b = b.object(id, 10, r#"{"stage":"queued"}"#);
    }
    let rx = b.build().unwrap();
    for id in &ids {
        pause(&rx, id).await;
    }
    assert_eq!(rx.authority_needs().await.len(), 30);
    let part = 5 * ("obj-00".len() + snapshot_receiver::core::reconciler::ENTRY_OVERHEAD);
    let reconciler = rx
        .reconciler(
            Switch::new(Answer::Snapshot(12)),
            ReconcilerOptions {
                memory: Some(part),
                ..options()
            },
        )
        .unwrap();
    for _ in 0..3000 {
        let status = reconciler.status();
        assert!(status.memory <= part, "{status:?}");
        assert!(rx.memory_bytes().await.authority <= part);
        if status.fetches.applied == 30 && status.waiting == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let status = reconciler.status();
    assert_eq!(
        (status.fetches.applied, status.waiting),
        (30, 0),
        "{status:?}"
    );
    assert!(status.memory_peak <= part, "{status:?}");
    assert!(status.deferred >= 25, "{status:?}");
    assert!(rx.authority_needs().await.is_empty());
    reconciler.stop().await.unwrap();
    assert_eq!(
        rx.memory_bytes().await.authority,
        0,
        "given back when it stops"
    );
}

/// The store's own connection pages through its object ids by a cursor:
/// each page after the last id of the one before, in id order, none
/// twice; and a resync whose queue has room for three entries fetches
/// every stored object once (most of them outside the working set), its
/// bytes never past its part.
async fn a_resync_pages_through_the_store(at: At) {
    let ids: Vec<String> = (0..25).map(|i| format!("obj-{i:02}")).collect();
    let mut b = Receiver::builder()
        .clock(Arc::new(ManualClock::new(t())) as Arc<dyn Clock>)
        .working_set(2);
    for id in &ids {
        b = b.object(id, 10, r#"{"stage":"queued"}"#);
    }
    let rx = at.store(b).build().unwrap();
    let opened = at.clone();
    let paged = tokio::task::spawn_blocking(move || {
        // The synchronous PostgreSQL client is opened off the runtime.
        let mut store: Box<dyn Store> = match &opened {
            At::Sqlite(path) => Box::new(
                snapshot_receiver::store::SqliteStore::open(path, Default::default()).unwrap(),
            ),
            At::Postgres(url, schema) => Box::new(
                snapshot_receiver::store::PostgresStore::connect_in_schema(url, Some(schema))
                    .unwrap(),
            ),
            At::Lsm(_) => panic!("operator reads need a sqlite or postgres store"),
        };
        let mut conn = store.authority_store().unwrap().unwrap();
        let (mut after, mut pages) = (String::new(), Vec::new());
        loop {
            let page = conn.object_ids(&after, 10).unwrap();
            let len = page.len();
            if let Some(last) = page.last() {
                after = last.to_string();
            }
            pages.push(page.iter().map(|id| id.to_string()).collect::<Vec<_>>());
            if len < 10 {
                break pages;
            }
            assert!(pages.len() < 10, "the cursor does not move on: {pages:?}");
        }
    })
    .await
    .unwrap();
    assert_eq!(paged.iter().map(Vec::len).collect::<Vec<_>>(), [10, 10, 5]);
    assert_eq!(paged.concat(), ids);
    let part = 3 * ("obj-00".len() + snapshot_receiver::core::reconciler::ENTRY_OVERHEAD);
    let source = Switch::new(Answer::Snapshot(12));
    let reconciler = rx
        .reconciler(
            source.clone(),
            ReconcilerOptions {
                memory: Some(part),
                resync: Some(Duration::from_secs(3600)),
                ..options()
            },
        )
        .unwrap();
    until(&reconciler, "every object resynced", |waiting, applied| {
        waiting == 0 && applied == 25
    })
    .await;
    let status = reconciler.status();
    assert!(status.memory_peak <= part, "{status:?}");
    assert_eq!(source.calls.load(Ordering::SeqCst), 25, "each once");
    for id in &ids {
        assert_eq!(rx.object(id).await.unwrap().version, 12, "{id}");
    }
    reconciler.stop().await.unwrap();
    rx.shutdown().await;
    at.done();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_resync_pages_through_the_store_by_a_cursor() {
    a_resync_pages_through_the_store(At::sqlite("authority-resync")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_resync_pages_through_the_store_by_a_cursor() {
    if let Some(at) = At::postgres("authority_resync") {
        a_resync_pages_through_the_store(at).await;
    }
}

/// Rows of `table` about `event_id` in the store `at`.
fn rows_of(at: &At, table: &str, event_id: &str) -> i64 {
    let sql = format!("SELECT count(*) FROM {table} WHERE event_id = '{event_id}'");
    match at {
        At::Sqlite(path) => rusqlite::Connection::open(path)
            .unwrap()
            .query_row(&sql, [], |r| r.get(0))
            .unwrap(),
        At::Postgres(url, schema) => crate::durability::pg_count(url, schema, &sql),
        At::Lsm(_) => panic!("operator reads need a sqlite or postgres store"),
    }
}

/// Two receivers on one store, both holding card-7 paused with e-3 held
/// behind the pause. B reconciles card-7 (e-3 equal: its row resolved),
/// then its purge removes the resolved row. A's reconciliation of card-7
/// reads e-3's body back, finds none, and goes on without it (decided
/// again on the stored v12, equal): it no longer fails until a restart,
/// and writes nothing about e-3.
async fn a_held_row_settled_and_purged_by_another_process(at: At) {
    let a = build(&at);
    pause(&a, "card-7").await;
    let held = body("e-3", "card-7", Some("12"), T, DONE);
    assert_eq!(
        a.deliver(held.as_bytes()).await.decision(),
        Some(Decision::Held(snapshot_receiver::HoldReason::Paused))
    );
    let clock = Arc::new(ManualClock::new(t()));
    let b = at
        .store(
            Receiver::builder()
                .clock(clock.clone() as Arc<dyn Clock>)
                .object("card-7", 10, r#"{"stage":"queued","label":"Map"}"#)
                .audit_retention(Duration::from_secs(60)),
        )
        .build()
        .unwrap();
    let snapshot = || AuthoritativeSnapshot::new("card-7", 12, DONE, t()).unwrap();
    let report = b.reconcile(snapshot()).await.unwrap();
    let lines: Vec<&str> = report.reevaluated.iter().map(|r| &*r.event_id).collect();
    assert_eq!(lines, ["e-card-7", "e-3"], "the variant, then e-3 (equal)");
    clock.advance(Duration::from_secs(3600));
    let purged = b.purge_expired_records().await.unwrap();
    assert_eq!(purged.resolved, 1, "{purged:?}");
    let check = at.clone();
    let left = tokio::task::spawn_blocking(move || rows_of(&check, "held", "e-3"))
        .await
        .unwrap();
    assert_eq!(left, 0, "the resolved row was purged");
    let audit = |at: &At| {
        let at = at.clone();
        tokio::task::spawn_blocking(move || rows_of(&at, "audit", "e-3"))
    };
    let audit_before = audit(&at).await.unwrap();
    // A still holds e-3 in memory, its body only in the store.
    for attempt in 0..2 {
        let report = a
            .reconcile(snapshot())
            .await
            .unwrap_or_else(|e| panic!("attempt {attempt}: {e}"));
        // Decided again on the stored v12 (equal); at the first, the
        // variant is named unresolved again; e-3 is never decided.
        let lines: Vec<&str> = report.reevaluated.iter().map(|r| &*r.event_id).collect();
        let expected: &[&str] = if attempt == 0 { &["e-card-7"] } else { &[] };
        assert_eq!(
            (report.replacement, &lines[..]),
            (false, expected),
            "attempt {attempt}: {report:?}"
        );
    }
    assert!(a.authority_needs().await.is_empty());
    assert!(!a.object("card-7").await.unwrap().paused);
    assert!(
        a.unresolved()
            .await
            .iter()
            .all(|u| u.event_id.as_deref() != Some("e-3")),
        "e-3 left A's memory"
    );
    // Nothing about e-3 was written.
    assert_eq!(audit(&at).await.unwrap(), audit_before);
    a.shutdown().await;
    b.shutdown().await;
    at.done();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_held_row_settled_and_purged_by_another_process_does_not_fail_reconciliation() {
    a_held_row_settled_and_purged_by_another_process(At::sqlite("authority-purged")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_held_row_settled_and_purged_by_another_process_does_not_fail_reconciliation() {
    if let Some(at) = At::postgres("authority_purged") {
        a_held_row_settled_and_purged_by_another_process(at).await;
    }
}
