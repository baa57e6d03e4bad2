//! Re-sent variants (issue 13, item 1): a copy of a variant already recorded
//! is a `duplicate` of `conflict (event_variant)`, in memory, after a restart
//! and between processes sharing a SQLite file or PostgreSQL
//! (docs/CONTRACT.md §3.1).

use crate::common::{body, cli, fingerprint, json_lines, receiver, repo, t, unresolved_named, T};
use crate::durability::{drop_schema, pg, pg_url};
use crate::store::temp_db;
use snapshot_receiver::store::{
    FaultyStore, PostgresStore, SqliteOptions, SqliteStore, StoreError,
};
use snapshot_receiver::{
    fixture::Fixture, replay::replay, AuditEntry, AuthoritativeSnapshot, Clock, ConflictKind,
    Decision, Limits, ManualClock, Outcome, Receiver, ReceiverBuilder, RetryReason, Verdict,
};
use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::Arc;

const VARIANT: Decision = Decision::Conflict(ConflictKind::EventVariant);
const DUPLICATE_OF_VARIANT: Decision = Decision::Duplicate {
    original: Verdict::Conflict(ConflictKind::EventVariant),
};

/// One replay line in a few words: event, object, decision with its reason,
/// conflict kind or original decision, then version, paused flag,
/// replacement and ack (`-` where a field is null).
pub(crate) fn brief(line: &serde_json::Value) -> String {
    let text = |k: &str| match &line[k] {
        serde_json::Value::Null => "-".to_owned(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut decision = text("decision");
    if let Some(detail) = line["reason"].as_str().or(line["conflict"].as_str()) {
        decision = format!("{decision} ({detail})");
    }
    if let Some(original) = line["original_decision"].as_str() {
        decision = format!("{decision} of {original}");
    }
    format!(
        "{} {} {decision} v{} paused={} repl={} {}",
        text("event_id"),
        text("object_id"),
        text("version"),
        text("paused"),
        text("replacement"),
        text("ack")
    )
}

/// The replay lines of `args` (`--format json` added), each as JSON; the
/// command must succeed.
pub(crate) fn replay_json(args: &[&str]) -> Vec<serde_json::Value> {
    let out = cli()
        .args(args)
        .args(["--format", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    json_lines(out.stdout)
}

/// The delivery and reconcile lines of a replay, in brief.
pub(crate) fn briefs(lines: &[serde_json::Value]) -> Vec<String> {
    lines
        .iter()
        .filter(|l| l["phase"] != "final")
        .map(brief)
        .collect()
}

/// The final line's unresolved inputs as `event object reason status`.
pub(crate) fn unresolved(last: &serde_json::Value) -> Vec<String> {
    last["unresolved"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| {
            format!(
                "{} {} {} {}",
                u["event_id"].as_str().unwrap_or("-"),
                u["object_id"].as_str().unwrap_or("-"),
                u["reason"].as_str().unwrap(),
                u["status"].as_str().unwrap()
            )
        })
        .collect()
}

/// fixtures/resent-variant.json, replayed in memory (the issue's input).
const RESENT: [&str; 5] = [
    r#"e-1 c-1 applied v2 paused=false repl=true acknowledge"#,
    r#"e-1 c-1 conflict (event_variant) v2 paused=true repl=false acknowledge"#,
    r#"e-1 c-1 duplicate of conflict (event_variant) v2 paused=true repl=false acknowledge"#,
    r#"e-1 c-1 duplicate of conflict (event_variant) v2 paused=true repl=false acknowledge"#,
    r#"e-2 c-1 held (paused) v2 paused=true repl=false acknowledge"#,
];

fn c1(event_id: &str, version: u64, s: &str) -> String {
    body(
        event_id,
        "c-1",
        Some(&version.to_string()),
        T,
        &format!(r#"{{"s":"{s}"}}"#),
    )
}

async fn decide(rx: &Receiver, body: &str) -> Option<Decision> {
    rx.deliver(body.as_bytes()).await.decision()
}

#[tokio::test]
async fn resent_variant_fixture_is_one_conflict_then_duplicates_in_memory() {
    let fixture = Fixture::load(&repo("fixtures/resent-variant.json")).unwrap();
    let report = replay(&fixture, None).await.unwrap();
    let lines: Vec<serde_json::Value> = report
        .lines
        .iter()
        .map(|l| serde_json::to_value(l).unwrap())
        .collect();
    assert_eq!(briefs(&lines), RESENT);
    let last = lines.last().unwrap();
    assert_eq!(
        last["cards"],
        serde_json::json!({"c-1": {"version": 2, "state": {"s": "b"}, "paused": true}})
    );
    // The variant is held once and named once.
    assert_eq!(
        unresolved(last),
        ["e-1 c-1 event_variant held", "e-2 c-1 paused held"]
    );
    // The two copies count as duplicates, not as conflicts.
    let non_zero: BTreeMap<&str, u64> = report
        .counters
        .iter()
        .filter(|(_, &v)| v > 0)
        .map(|(k, &v)| (k.as_str(), v))
        .collect();
    assert_eq!(
        non_zero,
        BTreeMap::from([
            ("conflict.event_variant", 1),
            ("decision.applied", 1),
            ("decision.conflict", 1),
            ("decision.duplicate", 2),
            ("decision.held", 1),
            ("held.paused", 1),
        ])
    );
}

// Regression: with a held queue of two, copies 2 and 3 of the variant and the
// next real event on c-1 were answered `retry`, blocking the object.
#[test]
fn a_resent_variant_never_fills_the_held_queue() {
    let lines = replay_json(&[
        "replay",
        "fixtures/resent-variant.json",
        "--max-held-per-object",
        "2",
    ]);
    assert_eq!(briefs(&lines), RESENT);
    assert_eq!(
        unresolved(lines.last().unwrap()),
        ["e-1 c-1 event_variant held", "e-2 c-1 paused held"]
    );
}

/// Three contents of `e-1` at version 2 of `c-1`: the first, then two variants.
fn three_contents_of_e1() -> [String; 3] {
    ["b", "CHANGED", "OTHER"].map(|s| c1("e-1", 2, s))
}

#[tokio::test]
async fn a_third_content_is_a_new_variant_and_each_variant_is_held_once() {
    let rx = Receiver::builder()
        .clock(Arc::new(ManualClock::new(t())))
        .object("c-1", 1, r#"{"s":"a"}"#)
        .build()
        .unwrap();
    let [first, changed, other] = three_contents_of_e1();
    assert_eq!(decide(&rx, &first).await, Some(Decision::Applied));
    assert_eq!(decide(&rx, &changed).await, Some(VARIANT));
    assert_eq!(decide(&rx, &other).await, Some(VARIANT));
    assert_eq!(decide(&rx, &changed).await, Some(DUPLICATE_OF_VARIANT));
    assert_eq!(decide(&rx, &other).await, Some(DUPLICATE_OF_VARIANT));
    // The first record is still the first content's.
    assert_eq!(
        decide(&rx, &first).await,
        Some(Decision::Duplicate {
            original: Verdict::Applied
        })
    );
    assert_eq!(
        rx.context().registry().variants("e-1"),
        [fingerprint(&rx, &changed), fingerprint(&rx, &other)]
    );
    let card = rx.object("c-1").await.unwrap();
    assert_eq!((card.version, card.paused, card.held), (2, true, 2));
    let named = unresolved_named(&rx).await;
    assert_eq!(
        named,
        [
            ("e-1".to_owned(), "event_variant"),
            ("e-1".to_owned(), "event_variant")
        ]
    );
}

#[tokio::test]
async fn a_resent_variant_is_a_duplicate_even_when_the_held_queue_is_full() {
    let rx = Receiver::builder()
        .clock(Arc::new(ManualClock::new(t())))
        .limits(Limits {
            max_held_per_object: 1,
            ..Limits::default()
        })
        .object("c-1", 1, r#"{"s":"a"}"#)
        .build()
        .unwrap();
    let [first, changed, other] = three_contents_of_e1();
    assert_eq!(decide(&rx, &first).await, Some(Decision::Applied));
    assert_eq!(decide(&rx, &changed).await, Some(VARIANT));
    // The queue (one event) is full: the copy needs no room ...
    assert_eq!(decide(&rx, &changed).await, Some(DUPLICATE_OF_VARIANT));
    // ... a new variant does, and is not recorded.
    assert_eq!(
        rx.deliver(other.as_bytes()).await.outcome,
        Outcome::Retry(RetryReason::HeldQueueFull { limit: 1 })
    );
    assert_eq!(
        rx.context().registry().variants("e-1"),
        [fingerprint(&rx, &changed)]
    );
    assert_eq!(rx.object("c-1").await.unwrap().held, 1);
}

#[tokio::test]
async fn a_resent_variant_naming_another_object_pauses_nothing_again() {
    let rx = receiver();
    let first = body("e-1", "card-7", Some("12"), T, r#"{"n":1}"#);
    let variant = body("e-1", "card-8", Some("4"), T, r#"{"n":1}"#);
    assert_eq!(decide(&rx, &first).await, Some(Decision::Applied));
    assert_eq!(decide(&rx, &variant).await, Some(VARIANT));
    assert!(rx.object("card-7").await.unwrap().paused);
    // card-7's authority clears its pause ...
    let authority = AuthoritativeSnapshot::new("card-7", 12, r#"{"n":1}"#, t()).unwrap();
    rx.reconcile(authority).await.unwrap();
    assert!(!rx.object("card-7").await.unwrap().paused);
    // ... and the re-sent variant does not pause it (nor hold it) again.
    assert_eq!(decide(&rx, &variant).await, Some(DUPLICATE_OF_VARIANT));
    assert!(!rx.object("card-7").await.unwrap().paused);
    assert_eq!(rx.object("card-8").await.unwrap().held, 1);
    let pauses = rx
        .audit_for_object("card-7")
        .await
        .into_iter()
        .filter(|r| matches!(r.entry, AuditEntry::Paused { .. }))
        .count();
    assert_eq!(pauses, 1);
}

/// A variant that pauses an object of another shard wakes that shard's
/// task: the pause is in the store without any further delivery or read
/// for it (a read or a delivery would run the pause first anyway).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_for_an_idle_shard_is_recorded_without_waiting_for_its_next_message() {
    let path = temp_db("pause-wakes-idle-shard");
    let (first, other) = ("card-7", "card-8");
    assert_ne!(
        snapshot_receiver::core::shard_of(first, 16),
        snapshot_receiver::core::shard_of(other, 16),
        "the test needs the two objects on two shards"
    );
    let rx = Receiver::builder()
        .clock(Arc::new(ManualClock::new(t())) as Arc<dyn Clock>)
        .object(first, 1, r#"{"n":0}"#)
        .object(other, 1, r#"{"n":0}"#)
        .store(&format!("sqlite:{}", path.display()))
        .build()
        .unwrap();
    let e1 = body("e-1", first, Some("12"), T, r#"{"n":1}"#);
    let variant = body("e-1", other, Some("4"), T, r#"{"n":1}"#);
    assert_eq!(decide(&rx, &e1).await, Some(Decision::Applied));
    assert_eq!(decide(&rx, &variant).await, Some(VARIANT));
    let sql = "SELECT paused FROM objects WHERE object_id = 'card-7'";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while count(&path, sql) != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "card-7 is not paused in the store 10 s after the variant was answered"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    rx.shutdown().await;
}

fn sqlite_builder(clock: &Arc<ManualClock>, location: &str) -> ReceiverBuilder {
    Receiver::builder()
        .clock(clock.clone() as Arc<dyn Clock>)
        .object("c-1", 1, r#"{"s":"a"}"#)
        .store(location)
}

fn count(path: &std::path::Path, sql: &str) -> i64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_sqlite_restart_a_resent_variant_is_still_a_duplicate() {
    let path = temp_db("resent-variant");
    let location = format!("sqlite:{}", path.display());
    let clock = Arc::new(ManualClock::new(t()));
    let (first, changed, other) = (
        c1("e-1", 2, "b"),
        c1("e-1", 2, "CHANGED"),
        c1("e-1", 2, "OTHER"),
    );
    let rx = sqlite_builder(&clock, &location).build().unwrap();
    assert_eq!(decide(&rx, &first).await, Some(Decision::Applied));
    assert_eq!(decide(&rx, &changed).await, Some(VARIANT));
    rx.shutdown().await;
    drop(rx);

    let rx = sqlite_builder(&clock, &location).build().unwrap();
    // Resumed with the receipt's variants: the copy is answered from memory
    // (without the loaded row it would take a failed insert and a reload).
    assert_eq!(
        rx.context().registry().variants("e-1"),
        [fingerprint(&rx, &changed)]
    );
    assert_eq!(decide(&rx, &changed).await, Some(DUPLICATE_OF_VARIANT));
    assert_eq!(decide(&rx, &other).await, Some(VARIANT));
    assert_eq!(decide(&rx, &other).await, Some(DUPLICATE_OF_VARIANT));
    let card = rx.object("c-1").await.unwrap();
    assert_eq!((card.version, card.paused, card.held), (2, true, 2));
    rx.shutdown().await;
    drop(rx);
    assert_eq!(count(&path, "SELECT count(*) FROM receipts"), 1);
    assert_eq!(count(&path, "SELECT count(*) FROM receipt_variants"), 2);
    assert_eq!(
        count(&path, "SELECT count(*) FROM held WHERE event_id = 'e-1'"),
        2
    );
}

#[test]
fn the_fixture_replayed_again_on_its_sqlite_file_is_all_duplicates() {
    let path = temp_db("resent-variant-cli");
    let store = format!("sqlite:{}", path.display());
    let args = ["replay", "fixtures/resent-variant.json", "--store", &store];
    assert_eq!(briefs(&replay_json(&args)), RESENT);
    let again = replay_json(&args);
    assert_eq!(
        briefs(&again),
        [
            "e-1 c-1 duplicate of applied v2 paused=true repl=false acknowledge",
            "e-1 c-1 duplicate of conflict (event_variant) v2 paused=true repl=false acknowledge",
            "e-1 c-1 duplicate of conflict (event_variant) v2 paused=true repl=false acknowledge",
            "e-1 c-1 duplicate of conflict (event_variant) v2 paused=true repl=false acknowledge",
            "e-2 c-1 duplicate of held (paused) v2 paused=true repl=false acknowledge",
        ]
    );
    assert_eq!(
        unresolved(again.last().unwrap()),
        ["e-1 c-1 event_variant held", "e-2 c-1 paused held"]
    );
    assert_eq!(count(&path, "SELECT count(*) FROM receipt_variants"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_variant_whose_commit_failed_is_forgotten_and_decided_again() {
    let path = temp_db("variant-rollback");
    let p = path.clone();
    let clock = Arc::new(ManualClock::new(t()));
    // Commit 1 seeds c-1, commit 2 records e-1, commit 3 (the variant) fails.
    let rx = Receiver::builder()
        .clock(clock.clone() as Arc<dyn Clock>)
        .object("c-1", 1, r#"{"s":"a"}"#)
        .store_with(move || {
            SqliteStore::open(p.to_str().unwrap(), SqliteOptions::default())
                .map(|s| FaultyStore::new(s, |n| n == 3))
        })
        .build()
        .unwrap();
    let (first, changed) = (c1("e-1", 2, "b"), c1("e-1", 2, "CHANGED"));
    assert_eq!(decide(&rx, &first).await, Some(Decision::Applied));
    let r = rx.deliver(changed.as_bytes()).await;
    assert_eq!(
        r.outcome,
        Outcome::Retry(RetryReason::StoreFailed(StoreError::Failed(
            "injected failure of commit 3".into()
        )))
    );
    // Nothing of it is left: no variant in the registry, no pause, no row.
    assert!(rx.context().registry().variants("e-1").is_empty());
    let card = rx.object("c-1").await.unwrap();
    assert_eq!((card.paused, card.held), (false, 0));
    assert_eq!(count(&path, "SELECT count(*) FROM receipt_variants"), 0);
    // The redelivery is the conflict, its copy the duplicate.
    assert_eq!(decide(&rx, &changed).await, Some(VARIANT));
    assert_eq!(decide(&rx, &changed).await, Some(DUPLICATE_OF_VARIANT));
    rx.shutdown().await;
    assert_eq!(count(&path, "SELECT count(*) FROM receipt_variants"), 1);
}

fn schema(name: &str) -> String {
    format!("sr_fc2_{name}_{}", std::process::id())
}

fn pg_count(url: &str, schema: &str, sql: &str) -> i64 {
    let (search, sql) = (format!("SET search_path TO {schema}"), sql.to_owned());
    pg(url, move |c| {
        c.batch_execute(&search).unwrap();
        c.query_one(&sql, &[]).unwrap().get::<_, i64>(0)
    })
}

fn pg_receiver(url: &str, schema: &str) -> Receiver {
    let (url, schema) = (url.to_owned(), schema.to_owned());
    Receiver::builder()
        .clock(Arc::new(ManualClock::new(t())))
        .object("c-1", 1, r#"{"s":"a"}"#)
        .store_with(move || PostgresStore::connect_in_schema(&url, Some(&schema)))
        .build()
        .unwrap()
}

/// Two receivers sharing only their store (`count` runs SQL on it), both
/// started before e-1 exists, so neither knows what the other records: each
/// variant is recorded (and held) once, its copies are duplicates.
async fn two_receivers_record_each_variant_once(
    a: Receiver,
    b: Receiver,
    count: impl Fn(&str) -> i64,
) {
    let (first, changed, other) = (
        c1("e-1", 2, "b"),
        c1("e-1", 2, "CHANGED"),
        c1("e-1", 2, "OTHER"),
    );
    assert_eq!(decide(&a, &first).await, Some(Decision::Applied));
    // b's first attempt to record e-1 loses to a's receipt; decided again,
    // it is the variant.
    assert_eq!(decide(&b, &changed).await, Some(VARIANT));
    // a does not know the variant: its insert loses to b's row, and decided
    // again it is a duplicate.
    assert_eq!(decide(&a, &changed).await, Some(DUPLICATE_OF_VARIANT));
    assert_eq!(decide(&b, &changed).await, Some(DUPLICATE_OF_VARIANT));
    // A third content races on both receivers: one conflict, one duplicate.
    let (ra, rb) = tokio::join!(a.deliver(other.as_bytes()), b.deliver(other.as_bytes()));
    let mut got = [ra.decision(), rb.decision()];
    got.sort_by_key(|d| *d == Some(VARIANT));
    assert_eq!(got, [Some(DUPLICATE_OF_VARIANT), Some(VARIANT)]);
    a.shutdown().await;
    b.shutdown().await;
    drop((a, b));
    assert_eq!(count("SELECT count(*) FROM receipts"), 1);
    assert_eq!(count("SELECT count(*) FROM receipt_variants"), 2);
    assert_eq!(count("SELECT count(*) FROM held WHERE event_id = 'e-1'"), 2);
    assert_eq!(
        count("SELECT count(*) FROM audit WHERE decision = 'duplicate:conflict:event_variant'"),
        3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_receivers_on_one_postgres_schema_record_each_variant_once() {
    let Some(url) = pg_url() else { return };
    let s = schema("variants");
    drop_schema(&url, &s);
    let (a, b) = (pg_receiver(&url, &s), pg_receiver(&url, &s));
    two_receivers_record_each_variant_once(a, b, |sql| pg_count(&url, &s, sql)).await;
    drop_schema(&url, &s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_receivers_on_one_sqlite_file_record_each_variant_once() {
    let path = temp_db("variants-two-receivers");
    let location = format!("sqlite:{}", path.display());
    let clock = Arc::new(ManualClock::new(t()));
    let a = sqlite_builder(&clock, &location).build().unwrap();
    let b = sqlite_builder(&clock, &location).build().unwrap();
    two_receivers_record_each_variant_once(a, b, |sql| count(&path, sql)).await;
}

/// Writes a fixture with c-1 at v1 and `bodies` as deliveries; returns its path.
fn fixture_file(name: &str, bodies: &[String]) -> String {
    let deliveries: Vec<serde_json::Value> = bodies
        .iter()
        .map(|b| serde_json::json!({"transport": {"received_at": T}, "raw": b}))
        .collect();
    let text = serde_json::json!({
        "initial_state": {"c-1": {"version": 1, "state": {"s": "a"}}},
        "deliveries": deliveries,
    });
    let path = temp_db(name).with_extension("json");
    std::fs::write(&path, text.to_string()).unwrap();
    path.to_str().unwrap().to_owned()
}

/// Two `replay` processes on one store (`store`: its `--store` arguments;
/// `count` runs SQL on it) deliver the same variant at once: one records the
/// conflict, the other's copy is its duplicate; fixture files are named
/// after `name`.
fn two_processes_record_a_variant_once(name: &str, store: &[&str], count: impl Fn(&str) -> i64) {
    let (first, changed, other) = (
        c1("e-1", 2, "b"),
        c1("e-1", 2, "CHANGED"),
        c1("e-1", 2, "OTHER"),
    );
    let setup = fixture_file(&format!("{name}-setup"), std::slice::from_ref(&first));
    let lines = replay_json(&[&["replay", setup.as_str()][..], store].concat());
    assert_eq!(
        briefs(&lines),
        ["e-1 c-1 applied v2 paused=false repl=true acknowledge"]
    );
    // Two processes deliver the same variant at once.
    let racing = fixture_file(&format!("{name}-race"), std::slice::from_ref(&changed));
    let spawn = || {
        cli()
            .args(["replay", racing.as_str(), "--format", "json"])
            .args(store)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (p1, p2) = (spawn(), spawn());
    let mut decided = Vec::new();
    for out in [
        p1.wait_with_output().unwrap(),
        p2.wait_with_output().unwrap(),
    ] {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let first: serde_json::Value = json_lines(out.stdout).remove(0);
        decided.push(brief(&first));
    }
    decided.sort();
    assert_eq!(
        decided,
        [
            "e-1 c-1 conflict (event_variant) v2 paused=true repl=false acknowledge",
            "e-1 c-1 duplicate of conflict (event_variant) v2 paused=true repl=false acknowledge",
        ]
    );
    // A later process: the known variant is a duplicate, a new one a conflict.
    let later = fixture_file(&format!("{name}-later"), &[changed, other.clone(), other]);
    let lines = replay_json(&[&["replay", later.as_str()][..], store].concat());
    assert_eq!(
        briefs(&lines),
        [
            "e-1 c-1 duplicate of conflict (event_variant) v2 paused=true repl=false acknowledge",
            "e-1 c-1 conflict (event_variant) v2 paused=true repl=false acknowledge",
            "e-1 c-1 duplicate of conflict (event_variant) v2 paused=true repl=false acknowledge",
        ]
    );
    assert_eq!(count("SELECT count(*) FROM receipt_variants"), 2);
    assert_eq!(count("SELECT count(*) FROM held WHERE event_id = 'e-1'"), 2);
}

#[test]
fn two_cli_processes_on_one_postgres_schema_record_a_variant_once() {
    let Some(url) = pg_url() else { return };
    let s = schema("variants_cli");
    drop_schema(&url, &s);
    let store = ["--store", url.as_str(), "--store-schema", s.as_str()];
    two_processes_record_a_variant_once("variants", &store, |sql| pg_count(&url, &s, sql));
    drop_schema(&url, &s);
}

#[test]
fn two_cli_processes_on_one_sqlite_file_record_a_variant_once() {
    let path = temp_db("variants-two-processes");
    let location = format!("sqlite:{}", path.display());
    let store = ["--store", location.as_str()];
    two_processes_record_a_variant_once("variants-sqlite", &store, |sql| count(&path, sql));
}
