//! Operating a durable store: the read-only [`StoreReader`] and the
//! `inspect`, `audit`, `reconcile` and `purge` commands, on real SQLite
//! files and a real PostgreSQL server, also beside a receiver process that
//! is writing the store.

use crate::durability::{drop_schema, pg, pg_url};
use crate::store::temp_db;
use snapshot_receiver::store::{StoreError, StoreReader};
use snapshot_receiver::{Ack, Clock, Fixture, ManualClock, Receiver};
use std::sync::Arc;

/// A PostgreSQL schema of this test run.
fn schema(name: &str) -> String {
    format!("sr_op_{name}_{}", std::process::id())
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
    let path = temp_db("operate-reader");
    let location = format!("sqlite:{}", path.display());
    seed(&location, None).await;
    let r = reader(&location, None).unwrap();
    assert_eq!(r.location(), location);
    check_seeded(&r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_reader_shows_paused_objects_held_events_and_trails() {
    let Some(url) = pg_url() else { return };
    let schema = schema("reader");
    drop_schema(&url, &schema);
    seed(&url, Some(&schema)).await;
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
