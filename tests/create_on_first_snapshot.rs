//! A profile option that lets an object's first versioned snapshot create
//! it (`create_on_first_snapshot`, docs/CONTRACT.md §3.2): off by default;
//! on, an event for an unknown object with a valid version and a snapshot is
//! `applied` and recorded as a creation, and the rules after it are the
//! usual ones (a lower version is stale, a redelivery a duplicate, a
//! tombstone creates the object deleted).

use crate::common::{body, cli, json_lines, t, T};
use crate::durability::{drop_schema, pg, pg_url};
use crate::store::temp_db;
use snapshot_receiver::store::{
    Expect, ObjectRow, PostgresStore, SqliteOptions, SqliteStore, Store, StoreError, Write,
};
use snapshot_receiver::{
    Clock, Config, Decision, HoldReason, ManualClock, Profile, Receiver, Verdict,
};
use std::sync::Arc;

/// `replay --format json` of the fixture, every line exactly.
const REPLAY: [&str; 13] = [
    r#"{"step":1,"phase":"delivery","event_id":"e-301","object_id":"card-9","decision":"applied","reason":"created","conflict":null,"original_decision":null,"version":3,"state":{"stage":"ready","label":"Table"},"paused":false,"replacement":true,"ack":"acknowledge"}"#,
    r#"{"step":2,"phase":"delivery","event_id":"e-301","object_id":"card-9","decision":"duplicate","reason":null,"conflict":null,"original_decision":"applied","version":3,"state":{"stage":"ready","label":"Table"},"paused":false,"replacement":false,"ack":"acknowledge"}"#,
    r#"{"step":3,"phase":"delivery","event_id":"e-302","object_id":"card-9","decision":"stale","reason":null,"conflict":null,"original_decision":null,"version":3,"state":{"stage":"ready","label":"Table"},"paused":false,"replacement":false,"ack":"acknowledge"}"#,
    r#"{"step":4,"phase":"delivery","event_id":"e-304","object_id":"card-10","decision":"applied","reason":"created","conflict":null,"original_decision":null,"version":5,"state":null,"paused":false,"replacement":true,"ack":"acknowledge"}"#,
    r#"{"step":5,"phase":"delivery","event_id":"e-305","object_id":"card-10","decision":"stale","reason":null,"conflict":null,"original_decision":null,"version":5,"state":null,"paused":false,"replacement":false,"ack":"acknowledge"}"#,
    r#"{"step":6,"phase":"delivery","event_id":"e-306","object_id":"card-10","decision":"applied","reason":null,"conflict":null,"original_decision":null,"version":6,"state":{"stage":"ready","label":"Back"},"paused":false,"replacement":true,"ack":"acknowledge"}"#,
    r#"{"step":7,"phase":"delivery","event_id":"e-307","object_id":"card-11","decision":"held","reason":"unknown_object","conflict":null,"original_decision":null,"version":null,"state":null,"paused":null,"replacement":false,"ack":"acknowledge"}"#,
    r#"{"step":8,"phase":"delivery","event_id":"e-308","object_id":"card-11","decision":"applied","reason":"created","conflict":null,"original_decision":null,"version":1,"state":{"stage":"ready","label":"Chart"},"paused":false,"replacement":true,"ack":"acknowledge"}"#,
    r#"{"step":9,"phase":"delivery","event_id":"e-309","object_id":"card-12","decision":"held","reason":"expired_identity","conflict":null,"original_decision":null,"version":null,"state":null,"paused":null,"replacement":false,"ack":"acknowledge"}"#,
    r#"{"step":10,"phase":"delivery","event_id":"e-310","object_id":"card-7","decision":"applied","reason":null,"conflict":null,"original_decision":null,"version":11,"state":{"stage":"ready","label":"Map"},"paused":false,"replacement":true,"ack":"acknowledge"}"#,
    r#"{"step":11,"phase":"reconcile","event_id":null,"object_id":"card-11","decision":"authority","reason":null,"conflict":null,"original_decision":null,"version":2,"state":{"stage":"done","label":"Chart"},"paused":false,"replacement":true,"ack":null}"#,
    r#"{"step":12,"phase":"reconcile","event_id":"e-307","object_id":"card-11","decision":"unresolved","reason":"missing_version","conflict":null,"original_decision":null,"version":2,"state":{"stage":"done","label":"Chart"},"paused":false,"replacement":false,"ack":null}"#,
    r#"{"step":13,"phase":"final","event_id":null,"object_id":null,"decision":null,"reason":null,"conflict":null,"original_decision":null,"version":null,"state":null,"paused":null,"replacement":null,"ack":null,"cards":{"card-10":{"version":6,"state":{"stage":"ready","label":"Back"},"paused":false},"card-11":{"version":2,"state":{"stage":"done","label":"Chart"},"paused":false},"card-7":{"version":11,"state":{"stage":"ready","label":"Map"},"paused":false},"card-9":{"version":3,"state":{"stage":"ready","label":"Table"},"paused":false}},"replacements":{"event":5,"authority":1},"counts":"this_run","unresolved":[{"event_id":"e-307","object_id":"card-11","reason":"missing_version","status":"superseded","superseded_by":2},{"event_id":"e-309","object_id":"card-12","reason":"expired_identity","status":"held","superseded_by":null}]}"#,
];

fn replay(args: &[&str]) -> Vec<serde_json::Value> {
    let mut all = vec![
        "replay",
        "fixtures/create-on-first-snapshot.json",
        "--format",
        "json",
    ];
    all.extend(args);
    let o = cli().args(&all).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    json_lines(o.stdout)
}

#[test]
fn the_fixture_replays_with_creations_exactly() {
    let expected: Vec<serde_json::Value> = REPLAY
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let got = replay(&[]);
    assert_eq!(got.len(), expected.len());
    for (got, expected) in got.iter().zip(&expected) {
        assert_eq!(got, expected);
    }
}

#[test]
fn without_the_option_the_same_deliveries_are_parked() {
    // `--profile card`: the fixture's deliveries under the contract's default.
    let lines = replay(&["--profile", "card"]);
    let decisions: Vec<(String, String)> = lines
        .iter()
        .filter(|l| l["phase"] == "delivery")
        .map(|l| {
            let word = |k: &str| l[k].as_str().unwrap_or("-").to_owned();
            (
                word("event_id"),
                format!("{} {}", word("decision"), word("reason")),
            )
        })
        .collect();
    let held = "held unknown_object".to_owned();
    assert_eq!(
        decisions,
        [
            ("e-301".to_owned(), held.clone()),
            ("e-301".to_owned(), "duplicate -".to_owned()),
            ("e-302".to_owned(), held.clone()),
            ("e-304".to_owned(), held.clone()),
            ("e-305".to_owned(), held.clone()),
            ("e-306".to_owned(), held.clone()),
            ("e-307".to_owned(), held.clone()),
            ("e-308".to_owned(), held.clone()),
            ("e-309".to_owned(), held.clone()),
            ("e-310".to_owned(), "applied -".to_owned()),
        ]
    );
    // Only the authority brings an object in: card-11, introduced.
    let last = lines.last().unwrap();
    assert_eq!(
        last["cards"],
        serde_json::json!({
            "card-7": {"version": 11, "state": {"stage": "ready", "label": "Map"}, "paused": false},
            "card-11": {"version": 2, "state": {"stage": "done", "label": "Chart"}, "paused": false}
        })
    );
}

/// A receiver that knows no objects, with the option on, on `clock`.
fn creating(clock: &Arc<ManualClock>, location: &str, schema: Option<&str>) -> Receiver {
    let config = Config {
        profile: Profile {
            name: "card-create".to_owned(),
            create_on_first_snapshot: true,
            ..Profile::card()
        },
        ..Config::default()
    };
    let mut b = Receiver::builder()
        .config(config)
        .clock(clock.clone() as Arc<dyn Clock>)
        .store(location);
    if let Some(schema) = schema {
        b = b.store_schema(schema);
    }
    b.build().unwrap()
}

fn tombstone(event: &str, object: &str, version: u64) -> String {
    format!(
        r#"{{"event_id":"{event}","object_id":"{object}","object_version":{version},"occurred_at":"{T}","type":"card.deleted"}}"#
    )
}

/// (decision, created) of one delivery.
async fn deliver(rx: &Receiver, body: &str) -> (Option<Decision>, bool) {
    let r = rx.deliver(body.as_bytes()).await;
    (r.decision(), r.created)
}

/// (version, state, paused, held) of an object.
async fn object(rx: &Receiver, id: &str) -> Option<(u64, String, bool, usize)> {
    rx.object(id)
        .await
        .map(|o| (o.version, o.state.compact(), o.paused, o.held))
}

/// Creations survive a restart with their receipts, the parked event that
/// joined a created object's queue stays held there, and the audit trail
/// marks the creation. `held_status`: the stored status of e-307's row.
async fn creations_persist(location: &str, schema: Option<&str>, held_status: impl Fn() -> String) {
    let clock = Arc::new(ManualClock::new(t()));
    let applied = Some(Decision::Applied);
    let rx = creating(&clock, location, schema);
    let table = body("e-301", "card-9", Some("3"), T, r#"{"stage":"ready"}"#);
    assert_eq!(deliver(&rx, &table).await, (applied, true));
    assert_eq!(
        deliver(&rx, &tombstone("e-304", "card-10", 5)).await,
        (applied, true)
    );
    let no_version = body("e-307", "card-11", None, T, r#"{"stage":"blocked"}"#);
    assert_eq!(
        deliver(&rx, &no_version).await,
        (Some(Decision::Held(HoldReason::UnknownObject)), false)
    );
    let chart = body("e-308", "card-11", Some("1"), T, r#"{"stage":"ready"}"#);
    assert_eq!(deliver(&rx, &chart).await, (applied, true));
    // Applied to a known object: not a creation.
    let later = body("e-311", "card-9", Some("4"), T, r#"{"stage":"done"}"#);
    assert_eq!(deliver(&rx, &later).await, (applied, false));
    rx.shutdown().await;
    drop(rx);

    let rx = creating(&clock, location, schema);
    assert_eq!(
        object(&rx, "card-9").await,
        Some((4, r#"{"stage":"done"}"#.to_owned(), false, 0))
    );
    assert_eq!(
        object(&rx, "card-10").await,
        Some((5, "null".to_owned(), false, 0))
    );
    assert_eq!(
        object(&rx, "card-11").await,
        Some((1, r#"{"stage":"ready"}"#.to_owned(), false, 1))
    );
    let duplicate = Some(Decision::Duplicate {
        original: Verdict::Applied,
    });
    assert_eq!(deliver(&rx, &table).await, (duplicate, false));
    let lower = body("e-302", "card-9", Some("2"), T, r#"{"stage":"queued"}"#);
    assert_eq!(deliver(&rx, &lower).await, (Some(Decision::Stale), false));
    let ghost = body("e-305", "card-10", Some("4"), T, r#"{"stage":"ghost"}"#);
    assert_eq!(deliver(&rx, &ghost).await, (Some(Decision::Stale), false));
    let unresolved: Vec<(String, String, Option<u64>)> = rx
        .unresolved()
        .await
        .iter()
        .map(|u| {
            let id = u.object_id.as_deref().unwrap_or("-").to_owned();
            (id, u.reason().to_owned(), u.superseded_by)
        })
        .collect();
    assert_eq!(
        unresolved,
        [("card-11".to_owned(), "unknown_object".to_owned(), None)]
    );
    let audit: Vec<(String, String, Option<String>)> = rx
        .stored_audit()
        .await
        .unwrap()
        .iter()
        .filter(|a| a.kind == "delivery")
        .map(|a| {
            let event = a.event_id.as_deref().unwrap_or("-").to_owned();
            (event, a.decision.clone().unwrap(), a.detail.clone())
        })
        .collect();
    let created = || Some("created: the object was unknown".to_owned());
    let row = |e: &str, d: &str, detail: Option<String>| (e.to_owned(), d.to_owned(), detail);
    assert_eq!(
        audit,
        [
            row("e-301", "applied", created()),
            row("e-304", "applied", created()),
            row("e-307", "held:unknown_object", None),
            row("e-308", "applied", created()),
            row("e-311", "applied", None),
            row("e-301", "duplicate:applied", None),
            row("e-302", "stale", None),
            row("e-305", "stale", None),
        ]
    );
    assert_eq!(held_status(), "held");
    rx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqlite_creations_persist_across_a_restart() {
    let path = temp_db("create-on-first-snapshot");
    let location = format!("sqlite:{}", path.display());
    creations_persist(&location, None, || {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.query_row(
            "SELECT status FROM held WHERE event_id = 'e-307'",
            [],
            |r| r.get(0),
        )
        .unwrap()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_creations_persist_across_a_restart() {
    let Some(url) = pg_url() else { return };
    let schema = format!("sr_create_first_{}", std::process::id());
    drop_schema(&url, &schema);
    let sql = format!("SET search_path TO {schema}");
    let status_url = url.clone();
    creations_persist(&url, Some(&schema), move || {
        let sql = sql.clone();
        pg(&status_url, move |c| {
            c.batch_execute(&sql).unwrap();
            c.query_one("SELECT status FROM held WHERE event_id = 'e-307'", &[])
                .unwrap()
                .get(0)
        })
    })
    .await;
    drop_schema(&url, &schema);
}

/// Two writers creating one object: the second insert is a conflict (the
/// step is then decided again on the stored row), on both stores.
fn a_second_creation_conflicts(store: &mut dyn Store) {
    let create = |version: u64| {
        [Write::Object {
            row: ObjectRow {
                object_id: Arc::from("card-9"),
                version,
                state: "{}".to_owned(),
                paused: false,
            },
            expect: Expect::Absent,
        }]
    };
    store.commit(&create(3)).unwrap();
    match store.commit(&create(4)) {
        Err(StoreError::Conflict(text)) => {
            assert!(
                text.contains("object card-9 to create exists already"),
                "{text}"
            )
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    let (objects, _) = store.refresh(&[Arc::from("card-9")], &[]).unwrap();
    let versions: Vec<u64> = objects.iter().map(|o| o.version).collect();
    assert_eq!(versions, [3]);
}

#[test]
fn sqlite_a_second_creation_of_one_object_conflicts() {
    let path = temp_db("create-twice");
    let mut store =
        SqliteStore::open(&path.display().to_string(), SqliteOptions::default()).unwrap();
    a_second_creation_conflicts(&mut store);
}

#[test]
fn postgres_a_second_creation_of_one_object_conflicts() {
    let Some(url) = pg_url() else { return };
    let schema = format!("sr_create_twice_{}", std::process::id());
    drop_schema(&url, &schema);
    let mut store = PostgresStore::connect_in_schema(&url, Some(&schema)).unwrap();
    a_second_creation_conflicts(&mut store);
    drop(store);
    drop_schema(&url, &schema);
}
