//! An identity whose record expired but that the purge has not removed yet
//! (docs/CONTRACT.md §5): a redelivery is decided as a new event, in memory
//! and on SQLite and PostgreSQL alike, and the stored receipt (with the
//! variants recorded for it) gives way to the new one instead of making the
//! store refuse the step (`retry`) until the next purge.

use crate::common::{body, t, T};
use crate::durability::{drop_schema, pg, pg_url};
use crate::store::temp_db;
use snapshot_receiver::store::{
    PostgresStore, ReceiptRow, SqliteOptions, SqliteStore, Store, StoreError, VariantRow, Write,
};
use snapshot_receiver::{Clock, ManualClock, Outcome, Receiver, Verdict};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One hour: the identities of the script expire within a test.
const RETENTION: Duration = Duration::from_secs(3600);

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn receipt(event: &str, fingerprint: u128, seen: u64, cutoff: Option<u64>) -> Write {
    Write::Receipt(ReceiptRow {
        event_id: Arc::from(event),
        fingerprint,
        object_id: Arc::from("a"),
        decision: Verdict::Stale,
        first_seen: at(seen),
        retention_cutoff: cutoff.map(at),
    })
}

fn variant(event: &str, fingerprint: u128, seen: u64) -> Write {
    Write::Variant(VariantRow {
        event_id: Arc::from(event),
        fingerprint,
        object_id: Arc::from("a"),
        first_seen: at(seen),
    })
}

/// A write the group fold does not cover: with it, a store cuts the group
/// in parts (the runs before and after it folded, the seed alone).
fn unfoldable(n: u64) -> Write {
    Write::Seed(snapshot_receiver::store::ObjectRow {
        object_id: Arc::from(format!("seed-{n}")),
        version: 0,
        state: "{}".to_owned(),
        paused: false,
    })
}

/// A stored receipt or variant: (fingerprint, first seen in seconds).
type Seen = (u128, u64);

/// The stored receipt of `event` and its variants, sorted.
fn stored(store: &mut dyn Store, event: &str) -> (Option<Seen>, Vec<Seen>) {
    let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_secs();
    let ids = [Arc::<str>::from(event)];
    let (_, receipts) = store.refresh(&[], &ids).unwrap();
    let mut variants: Vec<Seen> = store
        .refresh_variants(&ids)
        .unwrap()
        .iter()
        .map(|v| (v.fingerprint, secs(v.first_seen)))
        .collect();
    variants.sort_unstable();
    let receipt = receipts
        .first()
        .map(|r| (r.fingerprint, secs(r.first_seen)));
    (receipt, variants)
}

fn expect_conflict(result: Result<(), StoreError>, says: &str) {
    match result {
        Err(StoreError::Conflict(text)) => assert!(text.contains(says), "{text}"),
        other => panic!("expected a conflict saying {says:?}, got {other:?}"),
    }
}

/// The store's receipt insert, folded alone or in a group cut in parts
/// (`beside a seed`): an expired receipt is replaced and its variants go
/// with it; a live one, or one first seen just after the cut-off, is a
/// conflict; a variant recorded again in the group that replaces its
/// receipt takes the place of its old row.
fn expired_receipts_give_way(store: &mut dyn Store, path: &str, exists: &str) {
    let mut seeds = 0;
    let mut commit = |store: &mut dyn Store, mut writes: Vec<Write>| {
        if path == "beside a seed" {
            seeds += 1;
            writes.push(unfoldable(seeds));
        }
        store.commit(&writes)
    };
    // e-1 first seen at 100 s, with variants at 150 s and 190 s.
    commit(store, vec![receipt("e-1", 1, 100, None)]).unwrap();
    commit(store, vec![variant("e-1", 7, 150), variant("e-1", 8, 190)]).unwrap();
    // A cut-off before 100 s: the receipt is live, the insert a conflict.
    expect_conflict(
        commit(store, vec![receipt("e-1", 2, 160, Some(99))]),
        exists,
    );
    assert_eq!(
        stored(store, "e-1"),
        (Some((1, 100)), vec![(7, 150), (8, 190)]),
        "{path}"
    );
    // A cut-off at exactly 100 s: expired (at least one window old). The
    // new receipt replaces it; the variants recorded before it go.
    commit(store, vec![receipt("e-1", 2, 200, Some(100))]).unwrap();
    assert_eq!(stored(store, "e-1"), (Some((2, 200)), vec![]), "{path}");
    // The new receipt is live for a step whose cut-off is before 200 s.
    expect_conflict(
        commit(store, vec![receipt("e-1", 3, 250, Some(199))]),
        exists,
    );
    assert_eq!(stored(store, "e-1"), (Some((2, 200)), vec![]), "{path}");
    // Variants recorded after the new receipt are its own and stay while
    // it is live.
    commit(store, vec![variant("e-1", 9, 210)]).unwrap();
    commit(store, vec![variant("e-1", 10, 220)]).unwrap();
    assert_eq!(
        stored(store, "e-1"),
        (Some((2, 200)), vec![(9, 210), (10, 220)]),
        "{path}"
    );
    // A group that replaces the receipt and records one of the old
    // variants' contents again: that old row gives way, the other goes.
    commit(
        store,
        vec![receipt("e-1", 4, 400, Some(200)), variant("e-1", 9, 401)],
    )
    .unwrap();
    assert_eq!(
        stored(store, "e-1"),
        (Some((4, 400)), vec![(9, 401)]),
        "{path}"
    );
    // A receipt whose old row was purged while its variants were not: the
    // orphans go too.
    commit(store, vec![variant("e-2", 5, 50)]).unwrap();
    commit(store, vec![receipt("e-2", 1, 60, None)]).unwrap();
    assert_eq!(stored(store, "e-2"), (Some((1, 60)), vec![]), "{path}");
    // Without a cut-off (a clock less than one window past the epoch),
    // nothing stored counts as expired, not even a receipt at the epoch.
    commit(store, vec![receipt("e-3", 1, 0, None)]).unwrap();
    expect_conflict(commit(store, vec![receipt("e-3", 2, 5, None)]), exists);
    assert_eq!(stored(store, "e-3"), (Some((1, 0)), vec![]), "{path}");
}

#[test]
fn sqlite_replaces_an_expired_receipt_and_its_variants() {
    for path in ["folded", "beside a seed"] {
        let file = temp_db(&format!("expired-receipt-{}", path.replace(' ', "-")));
        let mut store =
            SqliteStore::open(&file.display().to_string(), SqliteOptions::default()).unwrap();
        expired_receipts_give_way(&mut store, path, "already exists");
    }
}

#[test]
fn postgres_replaces_an_expired_receipt_and_its_variants() {
    let Some(url) = pg_url() else { return };
    for path in ["folded", "beside a seed"] {
        let exists = "1 of the group's 1 receipts already exist";
        let schema = format!(
            "sr_expired_receipt_{}_{}",
            path.replace(' ', "_"),
            std::process::id()
        );
        drop_schema(&url, &schema);
        let mut store = PostgresStore::connect_in_schema(&url, Some(&schema)).unwrap();
        expired_receipts_give_way(&mut store, path, exists);
        drop(store);
        drop_schema(&url, &schema);
    }
}

/// A receiver with card-7 v10 and card-8 v3, a one-hour retention and no
/// periodic purge, on `clock`; `store`: its location.
fn receiver(clock: &Arc<ManualClock>, store: Option<(&str, Option<&str>)>) -> Receiver {
    let mut b = Receiver::builder()
        .retention(RETENTION)
        .purge_interval(None)
        .clock(clock.clone() as Arc<dyn Clock>)
        .object("card-7", 10, r#"{"stage":"queued"}"#)
        .object("card-8", 3, r#"{"stage":"ready"}"#);
    if let Some((location, schema)) = store {
        b = b.store(location);
        if let Some(schema) = schema {
            b = b.store_schema(schema);
        }
    }
    b.build().unwrap()
}

/// A delivery's outcome in words: the decision as `Display` writes it, or
/// `retry: why`.
async fn decide(rx: &Receiver, event: &str, object: &str, version: &str, state: &str) -> String {
    let b = body(event, object, Some(version), T, state);
    match rx.deliver(b.as_bytes()).await.outcome {
        Outcome::Decided(d) => d.to_string(),
        Outcome::Retry(why) => format!("retry: {}", snapshot_receiver::core::error_chain(&why)),
        Outcome::Rejected(why) => format!("reject: {why}"),
    }
}

const A: &str = r#"{"stage":"ready"}"#;
const C: &str = r#"{"stage":"review"}"#;
const D: &str = r#"{"stage":"blocked"}"#;

/// The script, on a clock starting at T: e-1 applied to card-7 and e-2 to
/// card-8, a variant of e-2 at T+59 min (card-8 paused); then, at T+61 min,
/// both first records have expired (the variant has not) and nothing purged
/// them. `restart`: a store-backed receiver is built again before the
/// redeliveries and at the end (`None`: in memory, no restart).
async fn script(clock: &Arc<ManualClock>, store: Option<(&str, Option<&str>)>) -> Vec<String> {
    let mut out = Vec::new();
    let rx = receiver(clock, store);
    out.push(decide(&rx, "e-1", "card-7", "12", A).await);
    out.push(decide(&rx, "e-2", "card-8", "4", C).await);
    clock.set(t() + Duration::from_secs(59 * 60));
    out.push(decide(&rx, "e-2", "card-8", "4", D).await);
    clock.set(t() + Duration::from_secs(61 * 60));
    let rx = match store {
        Some(_) => {
            rx.shutdown().await;
            drop(rx);
            receiver(clock, store)
        }
        None => rx,
    };
    // Decided as new events: the version rule, as for a first delivery.
    out.push(decide(&rx, "e-1", "card-7", "12", A).await);
    out.push(decide(&rx, "e-2", "card-8", "4", C).await);
    // The variant belonged to the expired record: against the new first
    // record its content is a new variant, and then a resent one.
    out.push(decide(&rx, "e-2", "card-8", "4", D).await);
    out.push(decide(&rx, "e-2", "card-8", "4", D).await);
    if store.is_some() {
        rx.shutdown().await;
        drop(rx);
        let rx = receiver(clock, store);
        out.push(decide(&rx, "e-1", "card-7", "12", A).await);
        out.push(decide(&rx, "e-2", "card-8", "4", C).await);
        out.push(decide(&rx, "e-2", "card-8", "4", D).await);
        rx.shutdown().await;
    }
    out
}

const BEFORE: [&str; 3] = ["applied", "applied", "conflict (event_variant)"];
const REDELIVERED: [&str; 4] = [
    "equal",
    "held (paused)",
    "conflict (event_variant)",
    "duplicate (original: conflict (event_variant))",
];
const AFTER_RESTART: [&str; 3] = [
    "duplicate (original: equal)",
    "duplicate (original: held (paused))",
    "duplicate (original: conflict (event_variant))",
];

fn expected(restarts: bool) -> Vec<String> {
    let mut all: Vec<&str> = BEFORE.iter().chain(&REDELIVERED).copied().collect();
    if restarts {
        all.extend(AFTER_RESTART);
    }
    all.into_iter().map(str::to_owned).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_an_expired_identity_is_decided_as_a_new_event() {
    let clock = Arc::new(ManualClock::new(t()));
    assert_eq!(script(&clock, None).await, expected(false));
}

/// (event id, decision, first seen) of every stored receipt, and
/// (event id, first seen) of every stored variant, times in minutes after T.
type Rows = (Vec<(String, String, i64)>, Vec<(String, i64)>);

fn minutes(ns: i64) -> i64 {
    let t = t().duration_since(UNIX_EPOCH).unwrap().as_nanos() as i64;
    (ns - t) / 60_000_000_000
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqlite_an_expired_identity_is_decided_as_a_new_event_and_replaces_its_rows() {
    let path = temp_db("expired-identity");
    let location = format!("sqlite:{}", path.display());
    let clock = Arc::new(ManualClock::new(t()));
    assert_eq!(
        script(&clock, Some((&location, None))).await,
        expected(true)
    );
    let conn = rusqlite::Connection::open(&path).unwrap();
    let receipts = conn
        .prepare("SELECT event_id, decision, first_seen_ns FROM receipts ORDER BY event_id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, minutes(r.get(2)?))))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let variants = conn
        .prepare("SELECT event_id, first_seen_ns FROM receipt_variants ORDER BY event_id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, minutes(r.get(1)?))))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    assert_eq!((receipts, variants), replaced_rows());
}

/// After the script: both receipts are the redeliveries' (at T+61 min), and
/// e-2's one variant is the one recorded against its new receipt.
fn replaced_rows() -> Rows {
    (
        vec![
            ("e-1".to_owned(), "equal".to_owned(), 61),
            ("e-2".to_owned(), "held:paused".to_owned(), 61),
        ],
        vec![("e-2".to_owned(), 61)],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_an_expired_identity_is_decided_as_a_new_event_and_replaces_its_rows() {
    let Some(url) = pg_url() else { return };
    let schema = format!("sr_expired_identity_{}", std::process::id());
    drop_schema(&url, &schema);
    let clock = Arc::new(ManualClock::new(t()));
    assert_eq!(
        script(&clock, Some((&url, Some(&schema)))).await,
        expected(true)
    );
    let sql = format!("SET search_path TO {schema}");
    let rows: Rows = pg(&url, move |c| {
        c.batch_execute(&sql).unwrap();
        let receipts = c
            .query(
                "SELECT event_id, decision, first_seen_ns FROM receipts ORDER BY event_id",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), minutes(r.get(2))))
            .collect();
        let variants = c
            .query(
                "SELECT event_id, first_seen_ns FROM receipt_variants ORDER BY event_id",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), minutes(r.get(1))))
            .collect();
        (receipts, variants)
    });
    assert_eq!(rows, replaced_rows());
    drop_schema(&url, &schema);
}
