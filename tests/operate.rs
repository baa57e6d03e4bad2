//! Operating a durable store: the read-only [`StoreReader`] and the
//! `inspect`, `audit`, `reconcile` and `purge` commands, on real SQLite
//! files and a real PostgreSQL server, also beside a receiver process that
//! is writing the store.

use crate::common::versioned;
use crate::durability::{drop_schema, pg, pg_url};
use crate::store::temp_db;
use snapshot_receiver::store::{StoreError, StoreReader};
use snapshot_receiver::{fixture::Fixture, Ack, Clock, ManualClock, Receiver};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::sync::Arc;

/// A PostgreSQL schema of this test run.
fn schema(name: &str) -> String {
    format!("sr_op_{name}_{}", std::process::id())
}

/// A SQLite store of this run named after `name`, seeded ([`seed`]): its location.
pub(crate) async fn seeded_sqlite(name: &str) -> String {
    let location = format!("sqlite:{}", temp_db(name).display());
    seed(&location, None).await;
    location
}

/// A PostgreSQL schema of this run named after `name` (dropped first),
/// seeded ([`seed`]): the database URL and the schema; `None` without
/// PostgreSQL (the test then skips, or fails under CI).
pub(crate) async fn seeded_postgres(name: &str) -> Option<(String, String)> {
    let url = pg_url()?;
    let schema = schema(name);
    drop_schema(&url, &schema);
    seed(&url, Some(&schema)).await;
    Some((url, schema))
}

fn fixture() -> Fixture {
    Fixture::load(&crate::common::repo("fixtures/B62-15-events.json")).unwrap()
}

/// Records the reference fixture's ten deliveries, without its
/// authorities, in the store at `location`: card-7 paused by the variant of
/// e-202, card-8 paused by e-205, six events held, e-207 parked for card-9.
async fn seed(location: &str, schema: Option<&str>) {
    let f = fixture();
    let clock = Arc::new(ManualClock::new(f.default_now().unwrap()));
    let mut builder = Receiver::builder()
        .clock(clock.clone() as Arc<dyn Clock>)
        .store(location);
    if let Some(schema) = schema {
        builder = builder.store_schema(schema);
    }
    for (id, version, state) in &f.initial_state {
        builder = builder.object(id, *version, state);
    }
    let rx = builder.build().unwrap();
    for d in &f.deliveries {
        clock.set(d.received_at.unwrap());
        assert_eq!(rx.deliver(&d.body).await.ack(), Ack::Acknowledge);
    }
    rx.shutdown().await;
}

/// Opens a reader off the runtime (the PostgreSQL client blocks).
fn reader(location: &str, schema: Option<&str>) -> Result<StoreReader, StoreError> {
    let location = location.to_owned();
    let schema = schema.map(str::to_owned);
    std::thread::spawn(move || StoreReader::open(&location, schema.as_deref()))
        .join()
        .unwrap()
}

/// Everything the reader says about the seeded store, checked exactly.
fn check_seeded(r: &StoreReader) {
    let s = r.summary().unwrap();
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(
        json["decisions"],
        serde_json::json!({"applied": 2, "conflict": 2, "duplicate": 1, "equal": 0, "held": 4, "stale": 1})
    );
    assert_eq!(s.objects, 2);
    assert_eq!(s.paused_objects, 2);
    assert_eq!(s.deleted_objects, 0);
    assert_eq!(
        json["held"],
        serde_json::json!({"event_variant": 1, "missing_version": 1, "paused": 1,
                           "unknown_object": 1, "unsupported_type": 1, "version_state": 1})
    );
    assert_eq!(s.superseded, 0);
    assert_eq!(
        json["parked"],
        serde_json::json!([{"object_id": "card-9", "events": 1}])
    );
    assert_eq!(s.identities, 8);
    assert_eq!(s.variants, 1);
    assert_eq!(
        s.oldest_identity_at.as_deref(),
        Some("2024-01-01T08:00:01Z")
    );
    assert_eq!(s.last_recorded_at.as_deref(), Some("2024-01-01T08:00:19Z"));

    let paused = r.objects(true).unwrap();
    let view: Vec<_> = paused
        .iter()
        .map(|o| {
            (
                o.object_id.as_str(),
                o.version,
                o.state.get(),
                o.pause_reason.as_deref(),
                o.paused_by.as_deref(),
                o.paused_at.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        view,
        [
            (
                "card-7",
                12,
                r#"{"stage":"ready","label":"Map"}"#,
                Some("event_variant"),
                Some("e-202"),
                Some("2024-01-01T08:00:10Z")
            ),
            (
                "card-8",
                4,
                r#"{"stage":"review","label":"Chart"}"#,
                Some("version_state"),
                Some("e-205"),
                Some("2024-01-01T08:00:18Z")
            ),
        ]
    );
    assert_eq!(r.objects(false).unwrap(), paused);
    assert_eq!(r.object("card-8").unwrap().as_ref(), Some(&paused[1]));
    assert_eq!(r.object("card-9").unwrap(), None);

    let held: Vec<_> = r
        .held(None)
        .unwrap()
        .into_iter()
        .map(|h| {
            (
                h.event_id.unwrap(),
                h.object_id.unwrap(),
                h.decision,
                h.reason,
                h.status,
            )
        })
        .collect();
    let expected = [
        ("e-204", "card-8", "held", "missing_version", "held"),
        ("e-202", "card-7", "conflict", "event_variant", "held"),
        ("e-203", "card-7", "held", "paused", "held"),
        ("e-208", "card-8", "held", "unsupported_type", "held"),
        ("e-205", "card-8", "conflict", "version_state", "held"),
        ("e-207", "card-9", "held", "unknown_object", "parked"),
    ]
    .map(|(e, o, d, r, s)| {
        (
            e.to_owned(),
            o.to_owned(),
            d.to_owned(),
            r.to_owned(),
            s.to_owned(),
        )
    });
    assert_eq!(held, expected);
    let paused_held: Vec<_> = r
        .held(Some("paused"))
        .unwrap()
        .into_iter()
        .map(|h| h.event_id.unwrap())
        .collect();
    assert_eq!(paused_held, ["e-203"]);
    let variants: Vec<_> = r
        .held(Some("event_variant"))
        .unwrap()
        .into_iter()
        .map(|h| h.event_id.unwrap())
        .collect();
    assert_eq!(variants, ["e-202"]);
    assert!(r.held(Some("no_such_reason")).unwrap().is_empty());

    // Both deliveries of e-202, in order: the first record, then the variant.
    let trail: Vec<_> = r
        .audit_for_event("e-202")
        .unwrap()
        .into_iter()
        .map(|a| (a.kind, a.decision, a.conflict, a.version, a.at))
        .collect();
    assert_eq!(
        trail,
        [
            (
                "delivery".to_owned(),
                Some("stale".to_owned()),
                None,
                Some(12),
                "2024-01-01T08:00:04Z".to_owned()
            ),
            (
                "delivery".to_owned(),
                Some("conflict".to_owned()),
                Some("event_variant".to_owned()),
                Some(12),
                "2024-01-01T08:00:10Z".to_owned()
            ),
        ]
    );
    let card7: Vec<_> = r
        .audit_for_object("card-7")
        .unwrap()
        .into_iter()
        .map(|a| {
            (
                a.event_id.unwrap(),
                a.decision.unwrap(),
                a.reason,
                a.original_decision,
            )
        })
        .collect();
    assert_eq!(
        card7,
        [
            ("e-201", "applied", None, None),
            ("e-201", "duplicate", None, Some("applied")),
            ("e-202", "stale", None, None),
            ("e-202", "conflict", None, None),
            ("e-203", "held", Some("paused"), None),
        ]
        .map(|(e, d, r, o)| (
            e.to_owned(),
            d.to_owned(),
            r.map(str::to_owned),
            o.map(str::to_owned)
        ))
    );
    let last: Vec<_> = r
        .recent_audit(2)
        .unwrap()
        .into_iter()
        .map(|a| a.event_id.unwrap())
        .collect();
    assert_eq!(last, ["e-205", "e-207"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_reader_shows_paused_objects_held_events_and_trails() {
    let location = seeded_sqlite("operate-reader").await;
    let r = reader(&location, None).unwrap();
    assert_eq!(r.location(), location);
    check_seeded(&r);
}

// The operator's reads decode rows with the receiver's own decoders: a row
// this version would never write (here an audit record of an unknown kind)
// is an error naming it, not a line printed with a default in its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_audit_row_is_an_error_not_a_default() {
    let location = seeded_sqlite("operate-corrupt").await;
    let path = location.strip_prefix("sqlite:").unwrap();
    let changed = rusqlite::Connection::open(path)
        .unwrap()
        .execute(
            "UPDATE audit SET kind = 'bogus'
             WHERE rowid = (SELECT min(rowid) FROM audit WHERE object_id = 'card-7')",
            [],
        )
        .unwrap();
    assert_eq!(changed, 1);
    let o = op(&["audit", "--object", "card-7"], &location, None);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(stdout(&o), "");
    assert_eq!(
        stderr(&o),
        "error: store failure: corrupt audit kind \"bogus\"\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_reader_shows_paused_objects_held_events_and_trails() {
    let Some((url, schema)) = seeded_postgres("reader").await else {
        return;
    };
    let r = reader(&url, Some(&schema)).unwrap();
    assert_eq!(r.location(), format!("{url} schema {schema}"));
    std::thread::scope(|s| s.spawn(|| check_seeded(&r)).join().unwrap());
    drop(r);
    drop_schema(&url, &schema);
}

#[test]
fn a_missing_sqlite_file_is_missing_and_is_not_created() {
    let path = temp_db("operate-missing");
    let location = format!("sqlite:{}", path.display());
    let e = StoreReader::open(&location, None).unwrap_err();
    assert_eq!(
        e,
        StoreError::Missing(format!("{location}: no such file")),
        "{e}"
    );
    assert!(!path.exists());
}

#[test]
fn a_sqlite_file_without_the_tables_is_not_a_store_and_stays_unchanged() {
    let path = temp_db("operate-foreign");
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch("CREATE TABLE objects (x INTEGER); CREATE TABLE notes (y TEXT);")
        .unwrap();
    drop(conn);
    let location = format!("sqlite:{}", path.display());
    let e = StoreReader::open(&location, None).unwrap_err();
    assert_eq!(
        e,
        StoreError::NotAStore(format!(
            "{location} lacks the receiver's tables audit, held, receipt_variants, receipts, replacements"
        ))
    );
    let conn = rusqlite::Connection::open(&path).unwrap();
    let tables: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(tables, 2);

    let text = temp_db("operate-text");
    std::fs::write(&text, "not a database, just text, long enough to be read as a header....................................................").unwrap();
    let location = format!("sqlite:{}", text.display());
    let e = StoreReader::open(&location, None).unwrap_err();
    assert_eq!(
        e,
        StoreError::NotAStore(format!("{location}: the file is not a SQLite database"))
    );
}

#[test]
fn a_postgres_schema_without_the_tables_is_not_a_store_and_nothing_is_created() {
    let Some(url) = pg_url() else { return };
    let absent = schema("absent");
    drop_schema(&url, &absent);
    let e = StoreReader::open(&url, Some(&absent)).unwrap_err();
    assert_eq!(
        e,
        StoreError::NotAStore(format!(
            "{url} schema {absent}: the schema {absent} does not exist"
        ))
    );
    let exists = format!("SELECT count(*) FROM pg_namespace WHERE nspname = '{absent}'");
    assert_eq!(
        pg(&url, move |c| c
            .query_one(&exists, &[])
            .unwrap()
            .get::<_, i64>(0)),
        0
    );

    let empty = schema("empty");
    drop_schema(&url, &empty);
    let create = format!("CREATE SCHEMA {empty}");
    pg(&url, move |c| c.batch_execute(&create).unwrap());
    let e = StoreReader::open(&url, Some(&empty)).unwrap_err();
    assert_eq!(
        e,
        StoreError::NotAStore(format!(
            "{url} schema {empty} has none of the receiver's tables (audit, held, objects, receipt_variants, receipts, replacements)"
        ))
    );
    let tables =
        format!("SELECT count(*) FROM information_schema.tables WHERE table_schema = '{empty}'");
    assert_eq!(
        pg(&url, move |c| c
            .query_one(&tables, &[])
            .unwrap()
            .get::<_, i64>(0)),
        0
    );
    drop_schema(&url, &empty);
}

/// Issue C: a mixed-case `--store-schema` is refused before anything is
/// created (it used to create the lower-case schema with every table, then
/// exit 4 looking for the mixed-case one): `serve`, which creates a store,
/// and `inspect`, which reads one, exit 2 naming the name and the lower-case
/// one to give, and no schema of either spelling exists afterwards.
#[test]
fn a_mixed_case_schema_is_refused_before_anything_is_created() {
    let Some(url) = pg_url() else { return };
    let mixed = format!("sr_Mixed_{}", std::process::id());
    let lower = mixed.to_ascii_lowercase();
    let count = {
        let (url, mixed, lower) = (url.clone(), mixed.clone(), lower.clone());
        move || {
            let (mixed, lower) = (mixed.clone(), lower.clone());
            pg(&url, move |c| {
                c.query_one(
                    "SELECT count(*) FROM pg_namespace WHERE nspname IN ($1, $2)",
                    &[&mixed, &lower],
                )
                .unwrap()
                .get::<_, i64>(0)
            })
        }
    };
    drop_schema(&url, &lower);
    assert_eq!(count(), 0);
    let fixture = crate::common::repo("fixtures/B62-15-events.json");
    let serve = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--initial",
        fixture.to_str().unwrap(),
    ];
    for args in [&serve[..], &["inspect"][..]] {
        let output = op_bounded(args, &url, Some(&mixed));
        let stderr = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "schema name \"{mixed}\": PostgreSQL folds names to lower case (and earlier \
                 versions created the schema {lower} for it): give it in lower case, {lower}"
            )),
            "{args:?}: {stderr}"
        );
        assert_eq!(count(), 0, "{args:?} created a schema");
    }
}

// ---- the commands, as an operator runs them ----

/// `snapshot-receiver ARGS` on the store at `location` (and `schema`).
fn op(args: &[&str], location: &str, schema: Option<&str>) -> Output {
    let mut command = crate::common::cli();
    command.args(args).args(["--store", location]);
    if let Some(schema) = schema {
        command.args(["--store-schema", schema]);
    }
    command.output().unwrap()
}

/// Like [`op`], for a command whose output is short, failing after 60 s
/// instead of waiting (a `relay` that opened what it should refuse would
/// run until stopped).
fn op_bounded(args: &[&str], location: &str, schema: Option<&str>) -> Output {
    let mut command = crate::common::cli();
    command.args(args).args(["--store", location]);
    if let Some(schema) = schema {
        command.args(["--store-schema", schema]);
    }
    crate::serve::within_seconds(60, &mut command)
}

/// Like [`op`], with `stdin` as the standard input.
fn op_stdin(args: &[&str], location: &str, schema: Option<&str>, stdin: &str) -> Output {
    let mut command = crate::common::cli();
    command.args(args).args(["--store", location]);
    if let Some(schema) = schema {
        command.args(["--store-schema", schema]);
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

fn json_lines(o: &Output) -> Vec<serde_json::Value> {
    stdout(o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The authority of the reference fixture for card-7 (v14, un-pauses it).
const CARD7_V14: &str = r#"{"object_id":"card-7","version":14,"state":{"stage":"archived","label":"Map v2"},"as_of":"2024-01-01T08:00:20Z"}"#;

/// An authority for card-8 older than its v4.
const CARD8_V2: &str = r#"{"object_id":"card-8","version":2,"state":{"stage":"ready","label":"Chart"},"as_of":"2024-01-01T08:00:20Z"}"#;

/// [`CARD8_V2`] forced.
const CARD8_V2_FORCED: &str = r#"{"object_id":"card-8","version":2,"state":{"stage":"ready","label":"Chart"},"as_of":"2024-01-01T08:00:20Z","force":true}"#;

/// `inspect` and `audit` on the seeded store: exact text and JSON.
fn check_inspect_and_audit(location: &str, schema: Option<&str>, name: &str) {
    let o = op(&["inspect"], location, schema);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        format!(
            "store: {name}
deliveries recorded: 10 (applied 2, conflict 2, duplicate 1, equal 0, held 4, stale 1)
objects: 2 (2 paused, 0 deleted)
held events: 6 (event_variant 1, missing_version 1, paused 1, unknown_object 1, unsupported_type 1, version_state 1)
superseded inputs: 0
parked unknown objects: 1 (card-9 (1))
event identities: 8, variants: 1, oldest recorded 2024-01-01T08:00:01Z
last recorded: 2024-01-01T08:00:19Z

== paused objects ==
card-7 v12 {{\"stage\":\"ready\",\"label\":\"Map\"}}: event_variant by e-202 at 2024-01-01T08:00:10Z
card-8 v4 {{\"stage\":\"review\",\"label\":\"Chart\"}}: version_state by e-205 at 2024-01-01T08:00:18Z

== held events (arrival order) ==
e-204 on card-8: held (missing_version), held since 2024-01-01T08:00:09Z
e-202 on card-7: conflict (event_variant), held since 2024-01-01T08:00:10Z
e-203 on card-7: held (paused), held since 2024-01-01T08:00:16Z
e-208 on card-8: held (unsupported_type), held since 2024-01-01T08:00:17Z
e-205 on card-8: conflict (version_state), held since 2024-01-01T08:00:18Z
e-207 on card-9: held (unknown_object), parked since 2024-01-01T08:00:19Z

== waiting for an authority ==
card-7: paused
card-8: paused, missing_version, unsupported_type
card-9: unknown_object
"
        )
    );

    let o = op(&["inspect", "--format", "json"], location, schema);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = &json_lines(&o)[0];
    assert_eq!(v["summary"]["identities"], 8);
    assert_eq!(v["summary"]["paused_objects"], 2);
    let paused: Vec<_> = v["paused"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                o["object_id"].clone(),
                o["paused_by"].clone(),
                o["pause_reason"].clone(),
            )
        })
        .collect();
    assert_eq!(
        paused,
        [
            ("card-7".into(), "e-202".into(), "event_variant".into()),
            ("card-8".into(), "e-205".into(), "version_state".into())
        ]
    );
    let held: Vec<_> = v["held"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["event_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(held, ["e-204", "e-202", "e-203", "e-208", "e-205", "e-207"]);

    // The trail of e-202, in the order recorded.
    let o = op(
        &["audit", "--event", "e-202", "--format", "json"],
        location,
        schema,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let trail: Vec<_> = json_lines(&o)
        .iter()
        .map(|a| {
            (
                a["decision"].clone(),
                a["conflict"].clone(),
                a["at"].clone(),
            )
        })
        .collect();
    assert_eq!(
        trail,
        [
            (
                "stale".into(),
                serde_json::Value::Null,
                "2024-01-01T08:00:04Z".into()
            ),
            (
                "conflict".into(),
                "event_variant".into(),
                "2024-01-01T08:00:10Z".into()
            )
        ]
    );
    let o = op(&["audit", "--object", "card-8"], location, schema);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "2024-01-01T08:00:06Z delivery e-206 card-8: applied v4, replaced
2024-01-01T08:00:09Z delivery e-204 card-8: held (missing_version) v4
2024-01-01T08:00:17Z delivery e-208 card-8: held (unsupported_type) v4
2024-01-01T08:00:18Z delivery e-205 card-8: conflict (version_state) v4
"
    );
    let o = op(&["audit", "--object", "card-1"], location, schema);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        format!("no audit rows for object card-1 in {name}\n")
    );
}

/// `reconcile` without force (card-7 un-paused, card-8 refused: exit 6),
/// then forced (card-8 un-paused at v2, e-205 applied again at v4).
fn check_reconcile(location: &str, schema: Option<&str>) {
    let o = op_stdin(
        &["reconcile", "--snapshot", "-", "--format", "json"],
        location,
        schema,
        &format!("{CARD7_V14}\n\n{CARD8_V2}\n"),
    );
    assert_eq!(o.status.code(), Some(6), "{}", stderr(&o));
    assert_eq!(
        stderr(&o),
        "error: 1 of 2 snapshots refused (older than the object, not forced); the others were applied\n"
    );
    let lines: Vec<_> = json_lines(&o)
        .iter()
        .map(|l| {
            (
                l["line"].as_u64().unwrap(),
                l["event_id"].as_str().unwrap_or("-").to_owned(),
                l["object_id"].as_str().unwrap().to_owned(),
                l["decision"].as_str().unwrap().to_owned(),
                l["version"].as_u64().unwrap(),
                l["paused"].as_bool().unwrap(),
            )
        })
        .collect();
    let expected = [
        (1, "-", "card-7", "authority", 14, false),
        (1, "e-202", "card-7", "unresolved", 14, false),
        (1, "e-203", "card-7", "equal", 14, false),
        (3, "-", "card-8", "authority_refused", 4, true),
    ]
    .map(|(n, e, o, d, v, p)| (n, e.to_owned(), o.to_owned(), d.to_owned(), v, p));
    assert_eq!(lines, expected);
    // The §7 field order, `line` first.
    assert!(stdout(&o).starts_with(r#"{"line":1,"step":1,"phase":"reconcile","event_id":null,"object_id":"card-7","decision":"authority""#));

    let path =
        temp_db(&format!("operate-forced-{}", schema.unwrap_or("sqlite"))).with_extension("jsonl");
    std::fs::write(&path, format!("{CARD8_V2_FORCED}\n")).unwrap();
    let o = op(
        &["reconcile", "--snapshot", path.to_str().unwrap()],
        location,
        schema,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        r#"line 1: card-8 authority (forced over version 4) v2, replaced, not paused {"stage":"ready","label":"Chart"}
  e-204 unresolved (missing_version) v2, not paused
  e-208 unresolved (unsupported_type) v2, not paused
  e-205 applied v4, replaced, not paused
"#
    );

    let r = reader(location, schema).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            let objects: Vec<_> = r
                .objects(false)
                .unwrap()
                .into_iter()
                .map(|o| (o.object_id, o.version, o.state.get().to_owned(), o.paused))
                .collect();
            assert_eq!(
                objects,
                [
                    (
                        "card-7".to_owned(),
                        14,
                        r#"{"stage":"archived","label":"Map v2"}"#.to_owned(),
                        false
                    ),
                    (
                        "card-8".to_owned(),
                        4,
                        r#"{"stage":"blocked","label":"Chart"}"#.to_owned(),
                        false
                    ),
                ]
            );
            assert_eq!(r.objects(true).unwrap(), []);
            let s = r.summary().unwrap();
            assert_eq!(s.superseded, 3);
            assert_eq!(
                serde_json::to_value(&s.held).unwrap(),
                serde_json::json!({"unknown_object": 1})
            );
            let card8: Vec<_> = r
                .audit_for_object("card-8")
                .unwrap()
                .into_iter()
                .skip(4)
                .map(|a| (a.kind, a.decision, a.reason, a.version))
                .collect();
            let s = |x: &str| Some(x.to_owned());
            assert_eq!(
                card8,
                [
                    (
                        "authority_refused".to_owned(),
                        s("authority_refused"),
                        s("older than the object's version 4"),
                        Some(2)
                    ),
                    (
                        "authority".to_owned(),
                        s("authority"),
                        s("forced over version 4"),
                        Some(2)
                    ),
                    (
                        "unresolved".to_owned(),
                        s("unresolved"),
                        s("missing_version"),
                        Some(2)
                    ),
                    (
                        "unresolved".to_owned(),
                        s("unresolved"),
                        s("unsupported_type"),
                        Some(2)
                    ),
                    ("reevaluated".to_owned(), s("applied"), None, None),
                ]
            );
        })
        .join()
        .unwrap()
    });
}

/// Everything the reader sees, to compare a store before and after.
fn everything(location: &str, schema: Option<&str>) -> String {
    let r = reader(location, schema).unwrap();
    let location = location.to_owned();
    std::thread::spawn(move || {
        let _ = location;
        format!(
            "{:?}\n{:?}\n{:?}\n{:?}",
            r.summary().unwrap(),
            r.objects(false).unwrap(),
            r.held(None).unwrap(),
            r.recent_audit(1000).unwrap()
        )
    })
    .join()
    .unwrap()
}

/// A file with one good line and one bad line changes nothing (exit 5).
fn check_bad_line_changes_nothing(location: &str, schema: Option<&str>) {
    let before = everything(location, schema);
    let path =
        temp_db(&format!("operate-bad-{}", schema.unwrap_or("sqlite"))).with_extension("jsonl");
    std::fs::write(
        &path,
        format!("{CARD7_V14}\n{{\"object_id\":\"card-8\",\"version\":-1,\"state\":{{}},\"as_of\":\"2024-01-01T08:00:20Z\"}}\n"),
    )
    .unwrap();
    let file = path.to_str().unwrap();
    let o = op(&["reconcile", "--snapshot", file], location, schema);
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    assert_eq!(stdout(&o), "");
    assert_eq!(
        stderr(&o),
        format!("error: {file}:2: not an authoritative snapshot: version: invalid value: integer `-1`, expected u64 at line 1 column 34; nothing was applied\n")
    );
    assert_eq!(everything(location, schema), before);
}

/// After [`check_reconcile`]: card-7 (v14, un-paused) is paused again by
/// e-300, a v14 with another state; the reader names e-300, not e-202 that
/// paused it before.
async fn check_paused_again(location: &str, schema: Option<&str>) {
    let clock = Arc::new(ManualClock::new(
        snapshot_receiver::parse_rfc3339("2024-01-01T08:00:40Z").unwrap(),
    ));
    let mut builder = Receiver::builder()
        .clock(clock as Arc<dyn Clock>)
        .store(location);
    if let Some(schema) = schema {
        builder = builder.store_schema(schema);
    }
    let rx = builder.build().unwrap();
    let body = crate::common::body(
        "e-300",
        "card-7",
        Some("14"),
        "2024-01-01T08:00:39Z",
        r#"{"stage":"done"}"#,
    );
    assert_eq!(
        rx.deliver(body.as_bytes()).await.decision(),
        Some(snapshot_receiver::Decision::Conflict(
            snapshot_receiver::ConflictKind::VersionState
        ))
    );
    rx.shutdown().await;
    let r = reader(location, schema).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            let paused = r.objects(true).unwrap();
            let causes: Vec<_> = paused
                .iter()
                .map(|o| {
                    (
                        o.object_id.as_str(),
                        o.pause_reason.as_deref(),
                        o.paused_by.as_deref(),
                        o.paused_at.as_deref(),
                    )
                })
                .collect();
            assert_eq!(
                causes,
                [(
                    "card-7",
                    Some("version_state"),
                    Some("e-300"),
                    Some("2024-01-01T08:00:40Z")
                )]
            );
            assert_eq!(r.object("card-7").unwrap().as_ref(), Some(&paused[0]));
        })
        .join()
        .unwrap()
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_commands_inspect_audit_reconcile_with_and_without_force() {
    let location = seeded_sqlite("operate-cli").await;
    check_inspect_and_audit(&location, None, &location);
    check_bad_line_changes_nothing(&location, None);
    check_reconcile(&location, None);
    check_paused_again(&location, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_commands_inspect_audit_reconcile_with_and_without_force() {
    let Some((url, schema)) = seeded_postgres("cli").await else {
        return;
    };
    check_inspect_and_audit(&url, Some(&schema), &format!("{url} schema {schema}"));
    check_bad_line_changes_nothing(&url, Some(&schema));
    check_reconcile(&url, Some(&schema));
    check_paused_again(&url, Some(&schema)).await;
    drop_schema(&url, &schema);
}

/// `purge` at 08:00:20 with a 10 s window: the four identities recorded
/// before 08:00:10 go, the variant recorded at 08:00:10 stays.
fn check_purge(location: &str, schema: Option<&str>) {
    let o = op(
        &[
            "purge",
            "--retention",
            "10",
            "--now",
            "2024-01-01T08:00:20Z",
            "--format",
            "json",
        ],
        location,
        schema,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v = &json_lines(&o)[0];
    assert_eq!(v["purged"], 4);
    // The audit and history windows (7 days by default) keep every row.
    assert_eq!(
        (&v["audit"], &v["history"], &v["resolved"]),
        (&0.into(), &0.into(), &0.into())
    );
    assert_eq!(v["before"], "2024-01-01T08:00:10Z");
    assert_eq!(v["identities"], 4);
    assert_eq!(v["variants"], 1);
    assert_eq!(v["oldest_identity_at"], "2024-01-01T08:00:16Z");
    let o = op(
        &[
            "purge",
            "--retention",
            "10",
            "--now",
            "2024-01-01T08:00:20Z",
        ],
        location,
        schema,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "purged 0 identity records (receipts and variants) first recorded before \
         2024-01-01T08:00:10Z (retention 10 s, clock 2024-01-01T08:00:20Z)
purged 0 audit rows and 0 resolved held rows (audit retention 604800 s), 0 history rows (history retention 604800 s)
left: identities 4, variants 1, oldest recorded 2024-01-01T08:00:16Z
"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_purge_removes_identities_older_than_the_window() {
    let location = seeded_sqlite("operate-purge").await;
    check_purge(&location, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_purge_removes_identities_older_than_the_window() {
    let Some((url, schema)) = seeded_postgres("purge").await else {
        return;
    };
    check_purge(&url, Some(&schema));
    drop_schema(&url, &schema);
}

/// `relay` with a destination (which the store checks come before).
const RELAY: [&str; 5] = [
    "relay",
    "--forward",
    "http://127.0.0.1:9/effects",
    "--forward-secret",
    "whsec_c2VjcmV0LWJlaW5nLXJvdGF0ZWQtb3V0",
];

#[test]
fn every_command_on_a_missing_store_exits_3_and_creates_nothing() {
    let path = temp_db("operate-none");
    let location = format!("sqlite:{}", path.display());
    let snapshot = temp_db("operate-none-snapshot").with_extension("jsonl");
    std::fs::write(&snapshot, format!("{CARD7_V14}\n")).unwrap();
    for args in [
        vec!["inspect"],
        vec!["audit", "--event", "e-1"],
        vec!["reconcile", "--snapshot", snapshot.to_str().unwrap()],
        vec!["purge"],
        vec!["relays"],
        RELAY.to_vec(),
    ] {
        let o = op_bounded(&args, &location, None);
        assert_eq!(o.status.code(), Some(3), "{args:?}: {}", stderr(&o));
        assert_eq!(
            stderr(&o),
            format!("error: no such store: {location}: no such file\n"),
            "{args:?}"
        );
        assert!(!path.exists(), "{args:?} created the file");
    }
}

#[test]
fn every_command_on_a_database_that_is_not_a_store_exits_4_and_changes_nothing() {
    let path = temp_db("operate-other");
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch("CREATE TABLE notes (y TEXT);")
        .unwrap();
    let location = format!("sqlite:{}", path.display());
    let snapshot = temp_db("operate-other-snapshot").with_extension("jsonl");
    std::fs::write(&snapshot, format!("{CARD7_V14}\n")).unwrap();
    let pg_store = pg_url().map(|url| {
        let empty = schema("other");
        drop_schema(&url, &empty);
        let create = format!("CREATE SCHEMA {empty}");
        pg(&url, move |c| c.batch_execute(&create).unwrap());
        (url, empty)
    });
    for args in [
        vec!["inspect"],
        vec!["audit", "--object", "card-7"],
        vec!["reconcile", "--snapshot", snapshot.to_str().unwrap()],
        vec!["purge"],
        vec!["relays"],
        RELAY.to_vec(),
    ] {
        let o = op_bounded(&args, &location, None);
        assert_eq!(o.status.code(), Some(4), "{args:?}: {}", stderr(&o));
        assert_eq!(
            stderr(&o),
            format!("error: not a snapshot-receiver store: {location} has none of the receiver's tables (audit, held, objects, receipt_variants, receipts, replacements)\n"),
            "{args:?}"
        );
        let conn = rusqlite::Connection::open(&path).unwrap();
        let tables: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(tables, 1, "{args:?} created tables");
        if let Some((url, empty)) = &pg_store {
            let o = op_bounded(&args, url, Some(empty));
            assert_eq!(o.status.code(), Some(4), "{args:?}: {}", stderr(&o));
            assert_eq!(
                stderr(&o),
                format!("error: not a snapshot-receiver store: {url} schema {empty} has none of the receiver's tables (audit, held, objects, receipt_variants, receipts, replacements)\n"),
                "{args:?}"
            );
            let sql = format!(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = '{empty}'"
            );
            assert_eq!(
                pg(url, move |c| c
                    .query_one(&sql, &[])
                    .unwrap()
                    .get::<_, i64>(0)),
                0
            );
        }
    }
    if let Some((url, empty)) = &pg_store {
        drop_schema(url, empty);
    }
}

/// Deliveries of 50 objects (`obj-0` … `obj-49`, known at v0) at versions 1
/// to 40, in version order: 2,000 `applied` decisions.
fn writer_fixture() -> PathBuf {
    let initial: serde_json::Map<String, serde_json::Value> = (0..50)
        .map(|o| {
            (
                format!("obj-{o}"),
                serde_json::json!({"version": 0, "state": {"v": 0}}),
            )
        })
        .collect();
    let deliveries: Vec<serde_json::Value> = (1..=40)
        .flat_map(|v| (0..50).map(move |o| serde_json::json!({"raw": versioned(o, v).1})))
        .collect();
    let path = temp_db("operate-writer").with_extension("json");
    let fixture = serde_json::json!({"initial_state": initial, "deliveries": deliveries});
    std::fs::write(&path, fixture.to_string()).unwrap();
    path
}

/// The operator commands while another process writes the store: a
/// `replay --store` of [`writer_fixture`] on the seeded store. After its
/// 20th printed (committed) line the test stops reading its output, so it
/// keeps committing until the pipe is full and then waits, alive, with the
/// store open; the commands run meanwhile. Then it finishes; both its
/// decisions and the operator's changes are in the store.
fn check_beside_a_writer(location: &str, schema: Option<&str>) {
    let fixture = writer_fixture();
    let mut command = crate::common::cli();
    command.args([
        "replay",
        fixture.to_str().unwrap(),
        "--format",
        "json",
        "--now",
        "2024-01-01T08:00:30Z",
        "--store",
        location,
    ]);
    if let Some(schema) = schema {
        command.args(["--store-schema", schema]);
    }
    let mut writer = crate::common::spawn_quiet(command.stdout(Stdio::piped()));
    let output = writer.stdout.take().unwrap();
    let (waiting_tx, waiting) = std::sync::mpsc::channel();
    let (resume, resume_rx) = std::sync::mpsc::channel::<()>();
    let drain = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(output).lines() {
            lines.push(line.unwrap());
            if lines.len() == 20 {
                waiting_tx.send(()).unwrap();
                resume_rx.recv().unwrap();
            }
        }
        lines
    });
    waiting.recv().unwrap();

    let o = op(&["inspect", "--format", "json"], location, schema);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = &json_lines(&o)[0];
    assert_eq!(v["summary"]["objects"], 52);
    assert_eq!(v["summary"]["paused_objects"], 2);
    assert!(
        v["summary"]["identities"].as_u64().unwrap() >= 8 + 20,
        "{v}"
    );

    let o = op(
        &["audit", "--object", "card-7", "--format", "json"],
        location,
        schema,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(json_lines(&o).len(), 5);

    let o = op_stdin(
        &["reconcile", "--snapshot", "-"],
        location,
        schema,
        &format!("{CARD7_V14}\n"),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        r#"line 1: card-7 authority v14, replaced, not paused {"stage":"archived","label":"Map v2"}
  e-202 unresolved (event_variant) v14, not paused
  e-203 equal v14, not paused
"#
    );

    // The seeded identities were recorded 08:00:01 to 08:00:19, the
    // writer's at 08:00:30: a cut-off at 08:00:20 removes exactly the eight
    // seeded receipts and the variant.
    let o = op(
        &[
            "purge",
            "--now",
            "2024-01-01T08:00:25Z",
            "--retention",
            "5",
            "--format",
            "json",
        ],
        location,
        schema,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(json_lines(&o)[0]["purged"], 9);

    assert!(
        writer.try_wait().unwrap().is_none(),
        "the writer waits on its full pipe, so it is still running"
    );
    resume.send(()).unwrap();
    let lines = drain.join().unwrap();
    assert!(writer.wait().unwrap().success());
    let decided: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(decided.len(), 2001);
    assert!(decided[..2000]
        .iter()
        .all(|l| l["decision"] == "applied" && l["ack"] == "acknowledge"));

    let r = reader(location, schema).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            let summary = r.summary().unwrap();
            assert_eq!(summary.identities, 2000);
            assert_eq!(summary.variants, 0);
            assert_eq!(summary.objects, 52);
            assert_eq!(summary.paused_objects, 1);
            assert_eq!(summary.decisions["applied"], 2002);
            assert_eq!(summary.superseded, 1);
            assert_eq!(
                serde_json::to_value(&summary.held).unwrap(),
                serde_json::json!({"missing_version": 1, "unknown_object": 1,
                                   "unsupported_type": 1, "version_state": 1})
            );
            let card7 = r.object("card-7").unwrap().unwrap();
            assert_eq!((card7.version, card7.paused), (14, false));
            for o in r.objects(false).unwrap() {
                if o.object_id.starts_with("obj-") {
                    assert_eq!(
                        (o.version, o.state.get()),
                        (40, r#"{"v":40}"#),
                        "{}",
                        o.object_id
                    );
                }
            }
        })
        .join()
        .unwrap()
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_commands_beside_a_receiver_process_writing_the_store() {
    let location = seeded_sqlite("operate-beside").await;
    check_beside_a_writer(&location, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_commands_beside_a_receiver_process_writing_the_store() {
    let Some((url, schema)) = seeded_postgres("beside").await else {
        return;
    };
    check_beside_a_writer(&url, Some(&schema));
    drop_schema(&url, &schema);
}

/// The *Operate a store* example of docs/DEPLOYMENT.md, as written there.
/// What `reconcile` prints for the README's example: the reference
/// deliveries replayed into a store, then its authority file.
const README_RECONCILE: &str = r#"line 1: card-7 authority v14, replaced, not paused {"stage":"archived","label":"Map v2"}
  e-202 unresolved (event_variant) v14, not paused
  e-203 equal v14, not paused
line 2: card-8 authority v5, replaced, not paused {"stage":"ready","label":"Chart"}
  e-204 unresolved (missing_version) v5, not paused
  e-208 unresolved (unsupported_type) v5, not paused
  e-205 stale v5, not paused
"#;

/// Replays the reference deliveries into a new SQLite store named after
/// `name`, then reconciles it from `snapshots`.
fn reconcile_the_reference_deliveries(name: &str, snapshots: &str) -> Output {
    let path = temp_db(name);
    let location = format!("sqlite:{}", path.display());
    let o = crate::common::cli()
        .args([
            "replay",
            "fixtures/B62-15-deliveries.json",
            "--store",
            &location,
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    op(&["reconcile", "--snapshot", snapshots], &location, None)
}

#[test]
fn the_readme_example_reconciles_the_reference_deliveries() {
    let o = reconcile_the_reference_deliveries("operate-readme", "fixtures/B62-15-authority.jsonl");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), README_RECONCILE);
    let readme = std::fs::read_to_string(crate::common::repo("docs/DEPLOYMENT.md")).unwrap();
    assert!(
        readme.contains(README_RECONCILE),
        "docs/DEPLOYMENT.md shows this output"
    );
}

#[test]
fn a_snapshot_file_with_a_byte_order_mark_reconciles_as_without_one() {
    let plain = std::fs::read(crate::common::repo("fixtures/B62-15-authority.jsonl")).unwrap();
    let snapshots = temp_db("operate-bom-snapshots");
    std::fs::write(&snapshots, [&b"\xef\xbb\xbf"[..], &plain].concat()).unwrap();
    let o = reconcile_the_reference_deliveries("operate-bom", snapshots.to_str().unwrap());
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), README_RECONCILE);
}

#[test]
fn a_snapshot_file_with_two_byte_order_marks_is_refused_and_nothing_applied() {
    let plain = std::fs::read(crate::common::repo("fixtures/B62-15-authority.jsonl")).unwrap();
    let twice = [&b"\xef\xbb\xbf\xef\xbb\xbf"[..], &plain].concat();
    let snapshots = temp_db("operate-bom-twice-snapshots");
    std::fs::write(&snapshots, &twice).unwrap();
    let path = temp_db("operate-bom-twice");
    let location = format!("sqlite:{}", path.display());
    // Only one mark is skipped: the second starts the first line, which is
    // then not a JSON object. The same from the standard input.
    let o = reconcile_the_reference_deliveries("operate-bom-twice", snapshots.to_str().unwrap());
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    assert_eq!(stdout(&o), "");
    assert_eq!(
        stderr(&o),
        format!(
            "error: {}:1: not a JSON object; nothing was applied\n",
            snapshots.display()
        )
    );
    let text = String::from_utf8(twice).unwrap();
    let o = op_stdin(&["reconcile", "--snapshot", "-"], &location, None, &text);
    assert_eq!(o.status.code(), Some(5), "{}", stderr(&o));
    assert_eq!(
        stderr(&o),
        "error: <stdin>:1: not a JSON object; nothing was applied\n"
    );
    // Nothing was applied: the plain file still replaces both objects.
    let o = op(
        &["reconcile", "--snapshot", "fixtures/B62-15-authority.jsonl"],
        &location,
        None,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), README_RECONCILE);
}

/// A server shares one reader between its request handlers.
#[test]
fn the_reader_can_be_shared_between_threads() {
    fn shared<T: Send + Sync + 'static>() {}
    shared::<StoreReader>();
    shared::<Arc<StoreReader>>();
}

/// An object id a client chose to take over the operator's terminal: a
/// colour change, a line break with a forged line after it, a
/// right-to-left override.
const HOSTILE_OBJECT: &str = "card-\u{1b}[31mX\nforged line\u{202e}";
/// [`HOSTILE_OBJECT`] as the text output shows it.
const HOSTILE_OBJECT_SHOWN: &str = "card-\\u{1b}[31mX\\nforged line\\u{202e}";
/// An event id with a C1 CSI, a bell and an isolate.
const HOSTILE_EVENT: &str = "e-\u{9b}2J\u{7}\u{2066}1";
/// [`HOSTILE_EVENT`] as the text output shows it.
const HOSTILE_EVENT_SHOWN: &str = "e-\\u{9b}2J\\u{7}\\u{2066}1";
/// A destination's error text with a carriage return and a forged line.
const HOSTILE_ERROR: &str = "refused\r\nrelay app: position 9, 0 after it, 0 parked";
/// [`HOSTILE_ERROR`] as the text output shows it.
const HOSTILE_ERROR_SHOWN: &str = "refused\\r\\nrelay app: position 9, 0 after it, 0 parked";

/// A card.snapshot body of [`HOSTILE_OBJECT`] (JSON-escaped by serde_json).
fn hostile_body(event_id: &str, version: u64, stage: &str) -> String {
    serde_json::json!({
        "event_id": event_id,
        "object_id": HOSTILE_OBJECT,
        "object_version": version,
        "occurred_at": crate::common::T,
        "type": "card.snapshot",
        "state": {"stage": stage},
    })
    .to_string()
}

/// Records, at T: [`HOSTILE_OBJECT`] v1 known; [`HOSTILE_EVENT`] applies
/// v2 (one effect, at outbox position 1); a variant of it (same id,
/// another state) pauses the object. Then relay `app` parks that effect
/// failed with [`HOSTILE_ERROR`]: on SQLite a relay whose destination
/// refuses it (no retry); on PostgreSQL the same rows are written with
/// SQL, because the PostgreSQL store cannot save a parked effect (its
/// `attempts` parameter is bound as int8 to an INTEGER column: "error
/// serializing parameter 4"). The effect's id.
async fn seed_hostile(location: &str, schema: Option<&str>) -> String {
    let clock = Arc::new(ManualClock::new(crate::common::t()));
    let mut builder = Receiver::builder()
        .clock(clock.clone() as Arc<dyn Clock>)
        .store(location)
        .object(HOSTILE_OBJECT, 1, r#"{"stage":"queued"}"#);
    if let Some(schema) = schema {
        builder = builder.store_schema(schema);
    }
    let rx = builder.build().unwrap();
    let applied = rx
        .deliver(hostile_body(HOSTILE_EVENT, 2, "ready").as_bytes())
        .await;
    assert_eq!(
        applied.decision(),
        Some(snapshot_receiver::Decision::Applied),
        "{applied:?}"
    );
    let variant = rx
        .deliver(hostile_body(HOSTILE_EVENT, 2, "done").as_bytes())
        .await;
    assert_eq!(variant.ack(), Ack::Acknowledge, "{variant:?}");
    let effect = rx.outbox(0, 1).await.unwrap().remove(0);
    assert_eq!((effect.position, &*effect.object_id), (1, HOSTILE_OBJECT));
    match schema {
        None => {
            let refuse = |_: snapshot_receiver::Effect| async {
                Err::<(), _>(snapshot_receiver::relay::HandlerError::new(HOSTILE_ERROR))
            };
            let options = snapshot_receiver::relay::RelayOptions {
                poll_interval: std::time::Duration::from_millis(1),
                schedule: Vec::new(),
                lease: std::time::Duration::from_secs(1),
                ..snapshot_receiver::relay::RelayOptions::new("app")
            };
            let relay = rx.relay(options, refuse).await.unwrap();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while relay.progress().failed != 1 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{:?}",
                    relay.progress()
                );
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            relay.stop().await.unwrap();
        }
        Some(schema) => {
            let sql = format!(
                "SET search_path TO {schema};
                 INSERT INTO relays (name, position, generation, owner, lease_until_ns, updated_ns)
                     VALUES ('app', 1, 1, NULL, NULL, 0);"
            );
            let (object, error) = (HOSTILE_OBJECT.to_owned(), HOSTILE_ERROR.to_owned());
            pg(location, move |c| {
                c.batch_execute(&sql).unwrap();
                c.execute(
                    "INSERT INTO relay_parked
                         (relay, position, object_id, status, attempts, due_ns, error, updated_ns)
                         VALUES ('app', 1, $1, 'failed', 1, NULL, $2, 0)",
                    &[&object, &error],
                )
                .unwrap();
            });
        }
    }
    rx.shutdown().await;
    effect.id.to_string()
}

/// `relays` and `inspect` in text show the hostile ids and error escaped,
/// each on the line it belongs to; JSON keeps them as they are.
fn check_hostile_text(location: &str, schema: Option<&str>, name: &str, effect: &str) {
    // The fixture's times are years old: a window that still holds them.
    let window = ["--history-retention", "1000000000"];
    let o = op(&["relays", window[0], window[1]], location, schema);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        format!(
            "last outbox position: 1
relay app: position 1, 0 after it, 1 parked (1 failed): 1 not delivered, not running
  failed 1 {HOSTILE_OBJECT_SHOWN} v2 ({effect}, 1 attempt(s)): {HOSTILE_ERROR_SHOWN}
"
        )
    );
    let o = op(&["relays", "--format", "json"], location, schema);
    assert!(o.status.success(), "{}", stderr(&o));
    let json = &json_lines(&o)[0];
    assert_eq!(json["relays"][0]["parked"][0]["object_id"], HOSTILE_OBJECT);
    assert_eq!(json["relays"][0]["parked"][0]["error"], HOSTILE_ERROR);

    let o = op(&["inspect", window[0], window[1]], location, schema);
    assert!(o.status.success(), "{}", stderr(&o));
    let t = crate::common::T;
    assert_eq!(
        stdout(&o),
        format!(
            "store: {name}
deliveries recorded: 2 (applied 1, conflict 1, duplicate 0, equal 0, held 0, stale 0)
objects: 1 (1 paused, 0 deleted)
held events: 1 (event_variant 1)
superseded inputs: 0
parked unknown objects: none
event identities: 1, variants: 1, oldest recorded {t}
last recorded: {t}

== paused objects ==
{HOSTILE_OBJECT_SHOWN} v2 {{\"stage\":\"ready\"}}: event_variant by {HOSTILE_EVENT_SHOWN} at {t}

== held events (arrival order) ==
{HOSTILE_EVENT_SHOWN} on {HOSTILE_OBJECT_SHOWN}: conflict (event_variant), held since {t}

== waiting for an authority ==
{HOSTILE_OBJECT_SHOWN}: paused

== relays (last outbox position 1) ==
relay app: position 1, 0 after it, 1 parked (1 failed): 1 not delivered, not running
  failed 1 {HOSTILE_OBJECT_SHOWN} v2 ({effect}, 1 attempt(s)): {HOSTILE_ERROR_SHOWN}
"
        )
    );
    let o = op(&["inspect", "--format", "json"], location, schema);
    assert!(o.status.success(), "{}", stderr(&o));
    let json = &json_lines(&o)[0];
    assert_eq!(json["paused"][0]["object_id"], HOSTILE_OBJECT);
    assert_eq!(json["held"][0]["event_id"], HOSTILE_EVENT);

    let o = op(&["audit", "--object", HOSTILE_OBJECT], location, schema);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        format!(
            "{t} delivery {HOSTILE_EVENT_SHOWN} {HOSTILE_OBJECT_SHOWN}: applied v2, replaced
{t} delivery {HOSTILE_EVENT_SHOWN} {HOSTILE_OBJECT_SHOWN}: conflict (event_variant) v2
"
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_text_output_escapes_control_characters_of_ids_and_errors() {
    let location = format!("sqlite:{}", temp_db("operate-hostile").display());
    let effect = seed_hostile(&location, None).await;
    check_hostile_text(&location, None, &location, &effect);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_text_output_escapes_control_characters_of_ids_and_errors() {
    let Some(url) = pg_url() else {
        return;
    };
    let schema = schema("hostile");
    drop_schema(&url, &schema);
    let effect = seed_hostile(&url, Some(&schema)).await;
    check_hostile_text(
        &url,
        Some(&schema),
        &format!("{url} schema {schema}"),
        &effect,
    );
    drop_schema(&url, &schema);
}

/// The log lines on stderr escape what they quote as the text output
/// does: a relay refused by a destination that is down warns with the
/// hostile object id escaped, on one line, and no control character but
/// the line ends reaches stderr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_warning_escapes_the_object_id_it_names() {
    let location = format!("sqlite:{}", temp_db("operate-hostile-log").display());
    seed_hostile(&location, None).await;
    // A port nothing listens on: every attempt fails to connect.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = crate::common::cli()
        .args(["relay", "--store", &location])
        .args(["--forward", &format!("http://127.0.0.1:{port}/hook")])
        .args(["--forward-secret", crate::serve::NEW_SECRET])
        .args(["--forward-schedule", "", "--forward-relay", "log"])
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (lines, got) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let _ = lines.send(line.unwrap());
        }
    });
    let mut seen = Vec::new();
    let warning = loop {
        match got.recv_timeout(std::time::Duration::from_secs(60)) {
            Ok(line) if line.contains("schedule exhausted") => break line,
            Ok(line) => seen.push(line),
            Err(e) => {
                let _ = child.kill();
                panic!("no warning ({e}) in {seen:?}");
            }
        }
    };
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert!(child.wait().unwrap().success());
    reader.join().unwrap();
    seen.extend(got.try_iter());
    assert!(warning.contains(" WARN "), "{warning}");
    assert!(
        warning.contains(&format!(" object_id={HOSTILE_OBJECT_SHOWN} ")),
        "{warning}"
    );
    for line in seen.iter().chain([&warning]) {
        assert!(
            !line
                .chars()
                .any(|c| c.is_control() || ('\u{202a}'..='\u{202e}').contains(&c)),
            "{line:?}"
        );
    }
}
