//! PostgreSQL, crashes and several receivers sharing one database.

use crate::common::{body, stream, t, T};
use crate::store::temp_db;
use crate::variants::replay_json;
use snapshot_receiver::store::PostgresStore;
use snapshot_receiver::{Ack, Clock, Decision, ManualClock, Outcome, Receiver, RetryReason};
use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::Arc;

/// The PostgreSQL server the tests use: `SNAPSHOT_RECEIVER_PG_URL`, or the
/// loopback server `.ci/run` starts. `None` (test skipped) only outside CI.
pub(crate) fn pg_url() -> Option<String> {
    let url = std::env::var("SNAPSHOT_RECEIVER_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let probe = url.clone();
    // The synchronous client must not run on a tokio runtime thread.
    let reachable =
        std::thread::spawn(move || postgres::Client::connect(&probe, postgres::NoTls).is_ok())
            .join()
            .unwrap();
    if reachable {
        Some(url)
    } else {
        crate::common::skip::skip(&format!(
            "PostgreSQL is not reachable at {url} (set SNAPSHOT_RECEIVER_PG_URL; .ci/run starts one)"
        ));
        None
    }
}

/// Runs SQL on a fresh connection, off the runtime.
pub(crate) fn pg<T: Send + 'static>(
    url: &str,
    f: impl FnOnce(&mut postgres::Client) -> T + Send + 'static,
) -> T {
    let url = url.to_owned();
    std::thread::spawn(move || f(&mut postgres::Client::connect(&url, postgres::NoTls).unwrap()))
        .join()
        .unwrap()
}

fn schema(name: &str) -> String {
    format!("sr_{name}_{}", std::process::id())
}

pub(crate) fn drop_schema(url: &str, schema: &str) {
    let sql = format!("DROP SCHEMA IF EXISTS {schema} CASCADE");
    pg(url, move |c| c.batch_execute(&sql).unwrap());
}

pub(crate) fn pg_count(url: &str, schema: &str, sql: &str) -> i64 {
    let sql = format!("SET search_path TO {schema}; {sql}");
    pg(url, move |c| {
        let mut parts = sql.splitn(2, "; ");
        c.batch_execute(parts.next().unwrap()).unwrap();
        c.query_one(parts.next().unwrap(), &[])
            .unwrap()
            .get::<_, i64>(0)
    })
}

fn pg_receiver(url: &str, schema: &str, clock: &Arc<ManualClock>, objects: u64) -> Receiver {
    let (url, schema) = (url.to_owned(), schema.to_owned());
    let mut b = Receiver::builder()
        .clock(clock.clone() as Arc<dyn Clock>)
        .store_with(move || PostgresStore::connect_in_schema(&url, Some(&schema)));
    for o in 0..objects {
        b = b.object(&format!("obj-{o}"), 0, r#"{"v":0}"#);
    }
    b.build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_records_resumes_and_survives_a_killed_connection() {
    let Some(base) = pg_url() else { return };
    let s = schema("kill");
    drop_schema(&base, &s);
    let app = format!("sr_kill_{}", std::process::id());
    let url = format!("{base}?application_name={app}");
    let clock = Arc::new(ManualClock::new(t()));
    let rx = pg_receiver(&url, &s, &clock, 2);
    let b1 = body("e-1", "obj-0", Some("1"), T, r#"{"v":1}"#);
    let b2 = body("e-2", "obj-0", Some("2"), T, r#"{"v":2}"#);
    assert_eq!(
        rx.deliver(b1.as_bytes()).await.decision(),
        Some(Decision::Applied)
    );
    // Kill the receiver's connection between two transactions.
    let kill = format!("SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{app}') k");
    let killed = pg(&base, move |c| {
        c.query_one(&kill, &[]).unwrap().get::<_, i64>(0)
    });
    assert_eq!(killed, 1);
    let r = rx.deliver(b2.as_bytes()).await;
    assert_eq!(r.ack(), Ack::Retry);
    assert!(
        matches!(&r.outcome, Outcome::Retry(RetryReason::StoreFailed(_))),
        "{:?}",
        r.outcome
    );
    assert!(rx.context().registry().get("e-2").is_none());
    assert_eq!(rx.object("obj-0").await.unwrap().version, 1);
    // The next attempt reconnects and commits.
    assert_eq!(
        rx.deliver(b2.as_bytes()).await.decision(),
        Some(Decision::Applied)
    );
    rx.shutdown().await;
    drop(rx);
    // A restart resumes from the database; a redelivery is a duplicate.
    let rx = pg_receiver(&url, &s, &clock, 2);
    assert_eq!(rx.object("obj-0").await.unwrap().version, 2);
    assert_eq!(
        rx.deliver(b1.as_bytes()).await.decision(),
        Some(Decision::Duplicate {
            original: snapshot_receiver::Verdict::Applied
        })
    );
    rx.shutdown().await;
    assert_eq!(pg_count(&base, &s, "SELECT count(*) FROM receipts"), 2);
    drop_schema(&base, &s);
}

/// Deliveries of one body a sender makes before a test gives up on `retry`.
const MAX_ATTEMPTS: u32 = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_receivers_on_one_postgres_database_converge_with_one_receipt_per_event() {
    let Some(url) = pg_url() else { return };
    let s = schema("two");
    drop_schema(&url, &s);
    let clock = Arc::new(ManualClock::new(t()));
    // Two receivers: two registries, two routers; only the database is shared.
    let a = pg_receiver(&url, &s, &clock, 30);
    let b = pg_receiver(&url, &s, &clock, 30);
    let mut tasks = Vec::new();
    for (rx, seed) in [
        (a.clone(), 7),
        (b.clone(), 11),
        (a.clone(), 13),
        (b.clone(), 17),
    ] {
        tasks.push(tokio::spawn(async move {
            let mut retries = 0;
            for (id, body) in stream(30, 12, seed) {
                // A sender redelivers on retry, a bounded number of times: a
                // store that keeps failing fails the test instead of hanging it.
                for attempt in 1.. {
                    let r = rx.deliver(body.as_bytes()).await;
                    if r.ack() != Ack::Retry {
                        break;
                    }
                    assert!(
                        attempt < MAX_ATTEMPTS,
                        "{id}: retry {attempt} times in a row, last {:?}",
                        r.outcome
                    );
                    retries += 1;
                }
            }
            retries
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    a.shutdown().await;
    b.shutdown().await;
    assert_eq!(pg_count(&url, &s, "SELECT count(*) FROM receipts"), 30 * 12);
    assert_eq!(
        pg_count(&url, &s, "SELECT count(DISTINCT event_id) FROM receipts"),
        30 * 12
    );
    assert_eq!(
        pg_count(&url, &s, "SELECT count(*) FROM objects WHERE version = '00000000000000000012' AND state = '{\"v\":12}' AND NOT paused"),
        30
    );
    // Each event was applied at most once across both receivers.
    assert_eq!(
        pg_count(&url, &s, "SELECT count(*) FROM (SELECT event_id FROM audit WHERE decision = 'applied' GROUP BY event_id HAVING count(*) > 1) d"),
        0
    );
    drop_schema(&url, &s);
}

/// How many deliveries of `stream` raise their object's version on arrival
/// (a sequential model: the replay delivers in this order).
fn raised(stream: &[(String, String)]) -> u64 {
    let mut seen = HashSet::new();
    let mut current: BTreeMap<String, u64> = BTreeMap::new();
    let mut n = 0;
    for (id, b) in stream {
        let v: serde_json::Value = serde_json::from_str(b).unwrap();
        let (object, version) = (
            v["object_id"].as_str().unwrap().to_owned(),
            v["object_version"].as_u64().unwrap(),
        );
        if seen.insert(id.clone()) && version > *current.get(&object).unwrap_or(&0) {
            current.insert(object, version);
            n += 1;
        }
    }
    n
}

/// Writes a fixture file for `stream`, with every object at version 0.
fn fixture_file(name: &str, objects: u64, deliveries: &[(String, String)]) -> String {
    let initial: BTreeMap<String, serde_json::Value> = (0..objects)
        .map(|o| {
            (
                format!("obj-{o}"),
                serde_json::json!({"version": 0, "state": {"v": 0}}),
            )
        })
        .collect();
    let deliveries: Vec<serde_json::Value> = deliveries
        .iter()
        .map(|(_, b)| serde_json::json!({"transport": {"received_at": T}, "raw": b}))
        .collect();
    let text = serde_json::json!({"initial_state": initial, "deliveries": deliveries}).to_string();
    let path = temp_db(name).with_extension("json");
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

/// Every stored receipt of the store at `location` (event id → decision),
/// and the stored audit rows, read through the library's store.
fn stored(
    location: &str,
) -> (
    BTreeMap<String, String>,
    Vec<snapshot_receiver::store::AuditRow>,
) {
    let mut store = snapshot_receiver::store::open(location).unwrap();
    let receipts = store
        .load(std::time::UNIX_EPOCH)
        .unwrap()
        .receipts
        .into_iter()
        .map(|r| (r.event_id.to_string(), r.decision.code()))
        .collect();
    (receipts, store.audit().unwrap())
}

/// A `replay` on the store of `scheme` killed (SIGKILL) part-way, then run
/// again with every delivery: nothing it acknowledged is lost, and the
/// store ends as an uninterrupted run's.
fn crash_with_sigkill_then_redelivery(scheme: &str) {
    let events = stream(200, 25, 99);
    let fixture = fixture_file(&format!("crash-fixture-{scheme}"), 200, &events);
    let (clean, crashed) = (
        temp_db(&format!("crash-clean-{scheme}")),
        temp_db(&format!("crash-killed-{scheme}")),
    );
    for dir in [&clean, &crashed] {
        let _ = std::fs::remove_dir_all(dir);
    }
    let store = |p: &std::path::Path| format!("{scheme}:{}", p.display());

    let uninterrupted = replay_json(&["replay", &fixture, "--store", &store(&clean)]);

    // Kill the second run part-way, remembering every acknowledged line it printed.
    let mut child = crate::common::spawn_quiet(
        crate::common::cli()
            .args([
                "replay",
                &fixture,
                "--store",
                &store(&crashed),
                "--format",
                "json",
            ])
            .stdout(Stdio::piped()),
    );
    let mut acknowledged = HashSet::new();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    while acknowledged.len() < 2500 {
        let line: serde_json::Value =
            serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
        if line["ack"] == "acknowledge" {
            acknowledged.insert(line["event_id"].as_str().unwrap().to_owned());
        }
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let (after_kill, _) = stored(&store(&crashed));
    let lost: Vec<&String> = acknowledged
        .iter()
        .filter(|id| !after_kill.contains_key(*id))
        .collect();
    assert!(lost.is_empty(), "acknowledged but not recorded: {lost:?}");
    assert!(after_kill.len() < 5000, "the run was interrupted part-way");

    // Restart and redeliver everything.
    let resumed = replay_json(&["replay", &fixture, "--store", &store(&crashed)]);
    let (a, b) = (uninterrupted.last().unwrap(), resumed.last().unwrap());
    assert_eq!(a["cards"], b["cards"]);
    assert_eq!(a["replacements"]["event"], raised(&events));
    // Each run counts its own replacements: the resumed run's summary agrees
    // with its own lines, and the two runs together made as many as the
    // uninterrupted one (the stored audit trail holds both runs).
    let applied_lines = resumed
        .iter()
        .filter(|l| l["decision"] == "applied" && l["replacement"] == true)
        .count();
    assert_eq!(b["replacements"]["event"], applied_lines);
    assert_eq!(b["counts"], "this_run");
    let (clean_receipts, _) = stored(&store(&clean));
    let (crashed_receipts, audit) = stored(&store(&crashed));
    assert_eq!(clean_receipts, crashed_receipts);
    let replaced = audit
        .iter()
        .filter(|a| a.replacement && a.kind == "delivery")
        .count();
    assert_eq!(replaced as u64, raised(&events));
    let mut applied = HashSet::new();
    let twice: Vec<_> = audit
        .iter()
        .filter(|a| a.decision.as_deref() == Some("applied"))
        .filter_map(|a| a.event_id.clone())
        .filter(|id| !applied.insert(id.clone()))
        .collect();
    assert_eq!(
        twice,
        Vec::<std::sync::Arc<str>>::new(),
        "no event applied twice"
    );
}

#[test]
fn sqlite_crash_with_sigkill_then_redelivery_equals_an_uninterrupted_run() {
    crash_with_sigkill_then_redelivery("sqlite");
}

#[cfg(feature = "lsm")]
#[test]
fn lsm_crash_with_sigkill_then_redelivery_equals_an_uninterrupted_run() {
    crash_with_sigkill_then_redelivery("lsm");
}

#[test]
fn two_cli_processes_on_one_postgres_database_equal_one_in_memory_run() {
    let Some(url) = pg_url() else { return };
    let s = schema("cli");
    drop_schema(&url, &s);
    let one = fixture_file("two-a", 100, &stream(100, 20, 3));
    let other = fixture_file("two-b", 100, &stream(100, 20, 5));
    let spawn = |f: &str| {
        crate::common::cli()
            .args([
                "replay",
                f,
                "--store",
                &url,
                "--store-schema",
                &s,
                "--format",
                "json",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (p1, p2) = (spawn(&one), spawn(&other));
    let (o1, o2) = (
        p1.wait_with_output().unwrap(),
        p2.wait_with_output().unwrap(),
    );
    for o in [&o1, &o2] {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let retries = [o1.stdout, o2.stdout]
        .iter()
        .flat_map(|o| {
            String::from_utf8_lossy(o)
                .lines()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter(|l| l.contains("\"ack\":\"retry\""))
        .count();
    assert_eq!(retries, 0);
    let memory = replay_json(&["replay", &one]);
    let expected = memory.last().unwrap()["cards"].as_object().unwrap().len() as i64;
    assert_eq!(expected, 100);
    assert_eq!(pg_count(&url, &s, "SELECT count(*) FROM receipts"), 2000);
    assert_eq!(
        pg_count(&url, &s, "SELECT count(*) FROM objects WHERE version = '00000000000000000020' AND state = '{\"v\":20}' AND NOT paused"),
        expected
    );
    assert_eq!(
        pg_count(&url, &s, "SELECT count(*) FROM (SELECT event_id FROM audit WHERE decision = 'applied' GROUP BY event_id HAVING count(*) > 1) d"),
        0
    );
    drop_schema(&url, &s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_connection_killed_mid_transaction_changes_nothing() {
    let Some(url) = pg_url() else { return };
    let s = schema("midtx");
    drop_schema(&url, &s);
    let clock = Arc::new(ManualClock::new(t()));
    let rx = pg_receiver(&url, &s, &clock, 1);
    // A trigger makes the server end the receiver's own session in the middle
    // of the transaction that records e-kill: after its receipt insert and
    // object update, at its audit insert.
    let setup = format!(
        "SET search_path TO {s};
         CREATE FUNCTION kill_me() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF NEW.event_id = 'e-kill' THEN PERFORM pg_terminate_backend(pg_backend_pid()); END IF;
           RETURN NEW;
         END $$;
         CREATE TRIGGER kill_me BEFORE INSERT ON audit FOR EACH ROW EXECUTE FUNCTION kill_me();"
    );
    pg(&url, move |c| c.batch_execute(&setup).unwrap());
    let b = body("e-kill", "obj-0", Some("1"), T, r#"{"v":1}"#);
    let r = rx.deliver(b.as_bytes()).await;
    assert_eq!(r.ack(), Ack::Retry, "{:?}", r.outcome);
    assert_eq!(pg_count(&url, &s, "SELECT count(*) FROM receipts"), 0);
    assert_eq!(
        pg_count(
            &url,
            &s,
            "SELECT count(*) FROM objects WHERE version = '00000000000000000000'"
        ),
        1
    );
    assert_eq!(rx.object("obj-0").await.unwrap().version, 0);
    assert!(rx.context().registry().get("e-kill").is_none());
    let teardown = format!("SET search_path TO {s}; DROP TRIGGER kill_me ON audit;");
    pg(&url, move |c| c.batch_execute(&teardown).unwrap());
    assert_eq!(
        rx.deliver(b.as_bytes()).await.decision(),
        Some(Decision::Applied)
    );
    assert_eq!(pg_count(&url, &s, "SELECT count(*) FROM receipts"), 1);
    rx.shutdown().await;
    drop_schema(&url, &s);
}
