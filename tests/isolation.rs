//! One bad delivery fails only itself (docs/CONTRACT.md, fault isolation):
//! when the store refuses what one delivery would write, the other
//! deliveries of its commit group are recorded as if it were absent, it is
//! answered `reject` (`store_refused`, naming the store's cause), and
//! nothing of it is recorded.

use crate::common::{body, t, T};
use crate::durability::{drop_schema, pg, pg_url};
use crate::store::temp_db;
use snapshot_receiver::store::{
    FaultyStore, PostgresStore, SqliteOptions, SqliteStore, Store, StoreError, Write,
};
use snapshot_receiver::{
    Ack, Decision, Limits, ManualClock, Outcome, Receipt, Receiver, RejectReason,
};
use std::sync::Arc;

/// The event identity a write names, if any.
fn event_of(write: &Write) -> Option<&str> {
    match write {
        Write::Receipt(r) => Some(&r.event_id),
        Write::Variant(v) => Some(&v.event_id),
        Write::Held(h) => h.event_id.as_deref(),
        Write::Audit(a) => a.event_id.as_deref(),
        Write::Effect(r) => r.cause_event.as_deref(),
        _ => None,
    }
}

/// A SQLite store at `path` that refuses every row naming an event whose
/// id starts with `poison`, as a store refuses a value it cannot hold.
fn poisoned(path: &std::path::Path) -> Result<FaultyStore<SqliteStore>, StoreError> {
    let inner = SqliteStore::open(path.to_str().unwrap(), SqliteOptions::default())?;
    Ok(FaultyStore::refusing(inner, |w| {
        event_of(w)
            .filter(|id| id.starts_with("poison"))
            .map(|id| format!("injected: cannot hold a row of {id}"))
    }))
}

fn card(event: &str, object: &str, version: u64) -> String {
    body(
        event,
        object,
        Some(&version.to_string()),
        T,
        &format!("{{\"v\":{version}}}"),
    )
}

/// Event, then decision or reject reason and cause, of each receipt.
fn answers(receipts: &[Receipt]) -> Vec<(String, String)> {
    receipts
        .iter()
        .map(|r| {
            let what = match &r.outcome {
                Outcome::Decided(d) => d.to_string(),
                Outcome::Rejected(why) => format!("reject {}: {why}", why.as_str()),
                Outcome::Retry(why) => format!("retry {why}"),
            };
            (r.event_id.as_deref().unwrap_or("-").to_owned(), what)
        })
        .collect()
}

/// The row counts of `tables` (each a table, optionally with a `WHERE`
/// clause) in `schema`.
pub(crate) fn pg_counts<const N: usize>(url: &str, schema: &str, tables: [&str; N]) -> [i64; N] {
    let queries = tables.map(|t| format!("SELECT count(*) FROM {schema}.{t}"));
    pg(url, move |c| {
        queries.map(|q| c.query_one(&q, &[]).unwrap().get::<_, i64>(0))
    })
}

fn sqlite_count(path: &std::path::Path, sql: &str) -> i64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_delivery_in_a_batch_is_rejected_and_the_others_commit_as_if_it_were_absent() {
    let path = temp_db("isolation-batch");
    let p = path.clone();
    // One shard: the whole batch is one group of one commit.
    let rx = Receiver::builder()
        .shards(1)
        .clock(Arc::new(ManualClock::new(t())))
        .object("card-7", 10, r#"{"v":10}"#)
        .object("card-8", 3, r#"{"v":3}"#)
        .store_with(move || poisoned(&p))
        .build()
        .unwrap();
    let batch = [
        card("e-1", "card-7", 11),
        card("poison-1", "card-7", 12),
        card("e-3", "card-7", 13),
        card("e-4", "card-8", 4),
        // The same event again after the refused one: decided as a first
        // delivery, since the refused one left nothing.
        card("e-1", "card-7", 11),
    ];
    let got = rx.deliver_batch(&batch).await;
    let cause =
        "the store refused to record this delivery: injected: cannot hold a row of poison-1";
    assert_eq!(
        answers(&got),
        [
            ("e-1".to_owned(), "applied".to_owned()),
            (
                "poison-1".to_owned(),
                format!("reject store_refused: {cause}")
            ),
            ("e-3".to_owned(), "applied".to_owned()),
            ("e-4".to_owned(), "applied".to_owned()),
            ("e-1".to_owned(), "duplicate (original: applied)".to_owned()),
        ]
    );
    assert_eq!(got[1].ack(), Ack::Reject);
    assert_eq!(got[1].object_id.as_deref(), Some("card-7"));
    // Nothing of the refused delivery was recorded, in memory or stored.
    assert!(rx.context().registry().get("poison-1").is_none());
    assert_eq!(rx.object("card-7").await.unwrap().version, 13);
    let rows = |table: &str| {
        sqlite_count(
            &path,
            &format!("SELECT count(*) FROM {table} WHERE event_id = 'poison-1'"),
        )
    };
    assert_eq!((rows("receipts"), rows("audit"), rows("held")), (0, 0, 0));
    assert_eq!(
        sqlite_count(&path, "SELECT count(*) FROM audit WHERE kind = 'delivery'"),
        4
    );
    assert_eq!(
        sqlite_count(
            &path,
            "SELECT count(*) FROM replacements WHERE cause_event = 'poison-1'"
        ),
        0
    );
    let stats = rx.store_stats().unwrap();
    assert_eq!(stats.refusals, 1);
    rx.shutdown().await;

    // After a restart on a store that refuses nothing, the refused event is
    // decided afresh (stale: v13 was recorded without it).
    let rx = Receiver::builder()
        .clock(Arc::new(ManualClock::new(t())))
        .store(&format!("sqlite:{}", path.display()))
        .build()
        .unwrap();
    let r = rx.deliver(card("poison-1", "card-7", 12).as_bytes()).await;
    assert_eq!(r.outcome, Outcome::Decided(Decision::Stale));
    let o = rx.object("card-7").await.unwrap();
    assert_eq!(
        (o.version, o.state.compact()),
        (13, r#"{"v":13}"#.to_owned())
    );
    rx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_deliveries_on_several_shards_fail_only_themselves() {
    let path = temp_db("isolation-shards");
    let p = path.clone();
    let mut builder = Receiver::builder()
        .shards(4)
        .clock(Arc::new(ManualClock::new(t())))
        .store_with(move || poisoned(&p));
    for o in 0..16 {
        builder = builder.object(&format!("obj-{o}"), 0, "{}");
    }
    let rx = builder.build().unwrap();
    // Three rounds of 16 objects, one poisoned event every fifth delivery.
    let mut bodies = Vec::new();
    for round in 1..=3u64 {
        for o in 0..16u64 {
            let n = (round - 1) * 16 + o;
            let event = if n % 5 == 2 {
                format!("poison-{n}")
            } else {
                format!("e-{n}")
            };
            bodies.push(card(&event, &format!("obj-{o}"), round));
        }
    }
    let got = rx.deliver_batch(&bodies).await;
    let mut rejected = Vec::new();
    for (n, r) in got.iter().enumerate() {
        let id = r.event_id.as_deref().unwrap();
        if id.starts_with("poison") {
            assert!(
                matches!(&r.outcome, Outcome::Rejected(RejectReason::StoreRefused { cause }) if cause == &format!("injected: cannot hold a row of {id}")),
                "{n}: {r:?}"
            );
            rejected.push(n);
        } else {
            assert_eq!(r.outcome, Outcome::Decided(Decision::Applied), "{n}: {id}");
        }
    }
    assert_eq!(rejected, [2, 7, 12, 17, 22, 27, 32, 37, 42, 47]);
    // Every object ends at round 3 unless its round-3 event was refused.
    for o in 0..16u64 {
        let expected = if (32 + o) % 5 == 2 {
            if (16 + o) % 5 == 2 {
                1
            } else {
                2
            }
        } else {
            3
        };
        let v = rx.object(&format!("obj-{o}")).await.unwrap().version;
        assert_eq!(v, expected, "obj-{o}");
    }
    assert_eq!(
        sqlite_count(
            &path,
            "SELECT count(*) FROM receipts WHERE event_id LIKE 'poison%'"
        ),
        0
    );
    assert_eq!(sqlite_count(&path, "SELECT count(*) FROM receipts"), 38);
    rx.shutdown().await;
}

/// The real thing on PostgreSQL: text cannot hold U+0000, and the server
/// says so with SQLSTATE 22021, which the store reports as a refusal (the
/// receiver's parser refuses such ids before they get here; this is the
/// store's own answer, for whatever else might carry one).
#[test]
fn postgres_refuses_a_nul_in_text_as_a_refusal_not_a_failure() {
    let Some(url) = pg_url() else { return };
    let schema = format!("sr_isolation_nul_{}", std::process::id());
    drop_schema(&url, &schema);
    let (u, s) = (url.clone(), schema.clone());
    let (commit, probe, after) = std::thread::spawn(move || {
        let mut store = PostgresStore::connect_in_schema(&u, Some(&s)).unwrap();
        let row = |id: &str| {
            Write::Seed(snapshot_receiver::store::ObjectRow {
                object_id: Arc::from(id),
                version: 1,
                state: "{}".to_owned(),
                paused: false,
            })
        };
        let writes = [row("card-1"), row("card-\u{0}-2")];
        let commit = store.commit(&writes);
        let probe = store.probe(&writes);
        // The connection is kept: the next commit goes through.
        let after = store.commit(&writes[..1]);
        (commit, probe, after)
    })
    .join()
    .unwrap();
    let refused = |r: &Result<(), StoreError>| match r {
        Err(StoreError::Refused { cause, body: None }) => cause.clone(),
        other => panic!("not a refusal: {other:?}"),
    };
    let cause = refused(&commit);
    assert!(
        cause.contains("invalid byte sequence for encoding \"UTF8\": 0x00"),
        "{cause}"
    );
    assert_eq!(refused(&probe), cause);
    assert_eq!(after, Ok(()));
    let s = schema.clone();
    let n: i64 = pg(&url, move |c| {
        c.query_one(&format!("SELECT count(*) FROM {s}.objects"), &[])
            .unwrap()
            .get(0)
    });
    assert_eq!(n, 1);
    drop_schema(&url, &schema);
}

/// A row PostgreSQL cannot index (an event id over the 2704-byte B-tree
/// entry limit, SQLSTATE 54000, possible when `max_id_bytes` is raised):
/// that delivery is rejected, the rest of its group is committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_postgres_cannot_index_fails_only_its_delivery() {
    let Some(url) = pg_url() else { return };
    let schema = format!("sr_isolation_big_{}", std::process::id());
    drop_schema(&url, &schema);
    let (u, s) = (url.clone(), schema.clone());
    let limits = Limits {
        max_id_bytes: 64 * 1024,
        ..Limits::default()
    };
    let rx = Receiver::builder()
        .shards(1)
        .limits(limits)
        .clock(Arc::new(ManualClock::new(t())))
        .object("card-7", 10, r#"{"v":10}"#)
        .store_with(move || PostgresStore::connect_in_schema(&u, Some(&s)))
        .build()
        .unwrap();
    // 8,000 bytes that do not compress below the limit.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let big: String = (0..8000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'a' + (x % 26) as u8)
        })
        .collect();
    let batch = [
        card("e-1", "card-7", 11),
        card(&big, "card-7", 12),
        card("e-3", "card-7", 13),
    ];
    let got = rx.deliver_batch(&batch).await;
    assert_eq!(got[0].outcome, Outcome::Decided(Decision::Applied));
    assert_eq!(got[2].outcome, Outcome::Decided(Decision::Applied));
    match &got[1].outcome {
        Outcome::Rejected(RejectReason::StoreRefused { cause }) => {
            assert!(cause.contains("index row size"), "{cause}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(got[1].ack(), Ack::Reject);
    assert_eq!(rx.object("card-7").await.unwrap().version, 13);
    rx.shutdown().await;
    let counts = pg_counts(&url, &schema, ["receipts", "audit WHERE kind = 'delivery'"]);
    assert_eq!(counts, [2, 2]);
    drop_schema(&url, &schema);
}

/// What a variant naming another object than its first record writes:
/// its variant row and the pause of the first record's object, on the
/// condition that the store holds that first record (`fingerprint`).
fn variant_of(first_fingerprint: u128) -> Vec<Write> {
    use snapshot_receiver::store::{AuditRow, HeldKey, VariantRow};
    vec![
        Write::Variant(VariantRow {
            event_id: Arc::from("e-1"),
            fingerprint: 2,
            object_id: Arc::from("card-2"),
            first_seen: t(),
        }),
        Write::PauseIfStored {
            event_id: Arc::from("e-1"),
            fingerprint: first_fingerprint,
            object_id: Arc::from("card-1"),
            audit: AuditRow {
                key: HeldKey { origin: 7, seq: 2 },
                at: t(),
                event_id: Some(Arc::from("e-1")),
                object_id: Some(Arc::from("card-1")),
                kind: "paused",
                decision: None,
                version: None,
                replacement: false,
                detail: None,
                body: None,
            },
        },
    ]
}

/// e-1's first record (fingerprint 1, card-1) stored; then a variant
/// decided against a first record with fingerprint 3 (one another shard of
/// this process claimed and will never commit, since the store holds
/// another) is refused as a conflict, nothing of it written; the variant
/// decided against fingerprint 1 commits and pauses card-1.
fn a_variant_commits_only_against_the_first_record_the_store_holds(store: &mut dyn Store) {
    use snapshot_receiver::store::{ObjectRow, ReceiptRow};
    use snapshot_receiver::Verdict;
    let seeds = ["card-1", "card-2"].map(|id| {
        Write::Seed(ObjectRow {
            object_id: Arc::from(id),
            version: 1,
            state: "{}".to_owned(),
            paused: false,
        })
    });
    store.commit(&seeds).unwrap();
    let first = Write::Receipt(ReceiptRow {
        event_id: Arc::from("e-1"),
        fingerprint: 1,
        object_id: Arc::from("card-1"),
        decision: Verdict::Applied,
        first_seen: t(),
        retention_cutoff: None,
    });
    store.commit(&[first]).unwrap();
    let refused = store.commit(&variant_of(3));
    assert_eq!(
        refused,
        Err(StoreError::Conflict(
            "the first record of e-1 is not stored yet: its variant waits for it".to_owned()
        ))
    );
    let paused = |store: &mut dyn Store| {
        let objects = store.objects().unwrap();
        objects
            .iter()
            .find(|o| &*o.object_id == "card-1")
            .unwrap()
            .paused
    };
    assert!(!paused(store), "nothing of the refused variant was written");
    store.commit(&variant_of(1)).unwrap();
    assert!(paused(store));
}

#[test]
fn sqlite_commits_a_variant_only_against_the_first_record_it_holds() {
    let path = temp_db("variant-first-record");
    let mut store = SqliteStore::open(path.to_str().unwrap(), SqliteOptions::default()).unwrap();
    a_variant_commits_only_against_the_first_record_the_store_holds(&mut store);
}

/// Runs `f` on a PostgreSQL store in a fresh schema named after `name`
/// (on a thread of its own: the synchronous client must not run on a
/// runtime), then `after` with the server's URL and the schema, then drops
/// the schema; skipped without a server outside CI.
fn on_postgres(
    name: &str,
    f: impl FnOnce(&mut dyn Store) + Send + 'static,
    after: impl FnOnce(&str, &str),
) {
    let Some(url) = pg_url() else { return };
    let schema = format!("sr_isolation_{name}_{}", std::process::id());
    drop_schema(&url, &schema);
    let (u, s) = (url.clone(), schema.clone());
    std::thread::spawn(move || {
        let mut store = PostgresStore::connect_in_schema(&u, Some(&s)).unwrap();
        f(&mut store);
    })
    .join()
    .unwrap();
    after(&url, &schema);
    drop_schema(&url, &schema);
}

#[test]
fn postgres_commits_a_variant_only_against_the_first_record_it_holds() {
    on_postgres(
        "variant",
        a_variant_commits_only_against_the_first_record_the_store_holds,
        |_, _| {},
    );
}

/// card-1 at version 1, not paused; card-2 at version 1.
fn seed_cards(store: &mut dyn Store) {
    use snapshot_receiver::store::ObjectRow;
    let seeds = ["card-1", "card-2"].map(|id| {
        Write::Seed(ObjectRow {
            object_id: Arc::from(id),
            version: 1,
            state: "{}".to_owned(),
            paused: false,
        })
    });
    store.commit(&seeds).unwrap();
}

/// A decision that changed nothing (stale, equal, held) commits only while
/// its object's row still has the version and the pause flag it was
/// decided on: in a folded group (`Check` alone) and row by row (after a
/// check of the row as it is, a check that read it otherwise does not
/// chain, and the store applies the two one at a time). `folded` is the
/// backend's refusal of a folded group, which counts the rows as read.
fn a_check_commits_only_while_the_row_is_as_read(store: &mut dyn Store, folded: &str) {
    seed_cards(store);
    let check = |version: u64, paused: bool| Write::Check {
        object_id: Arc::from("card-1"),
        version,
        paused,
    };
    let changed = Err(StoreError::Conflict(
        "object card-1 changed since it was read".to_owned(),
    ));
    let refused = Err(StoreError::Conflict(folded.to_owned()));
    // `now`: whether the row is paused now (it stays at version 1).
    let row_by_row = |now: bool, write: Write| [check(1, now), write];
    // As read: both paths commit.
    assert_eq!(store.commit(&[check(1, false)]), Ok(()));
    assert_eq!(store.commit(&row_by_row(false, check(1, false))), Ok(()));
    // Decided on a paused row that is not paused: refused on both paths.
    assert_eq!(store.commit(&[check(1, true)]), refused, "folded group");
    assert_eq!(
        store.commit(&row_by_row(false, check(1, true))),
        changed,
        "row by row"
    );
    // Decided on another version: refused on both paths.
    assert_eq!(store.commit(&[check(2, false)]), refused, "folded group");
    assert_eq!(
        store.commit(&row_by_row(false, check(2, false))),
        changed,
        "row by row"
    );
    // The row paused since: a check that read it unpaused is refused, one
    // that read it paused commits.
    store
        .commit(&[Write::Pause {
            object_id: Arc::from("card-1"),
        }])
        .unwrap();
    assert_eq!(store.commit(&[check(1, false)]), refused, "folded group");
    assert_eq!(
        store.commit(&row_by_row(true, check(1, false))),
        changed,
        "row by row"
    );
    assert_eq!(store.commit(&[check(1, true)]), Ok(()));
    assert_eq!(store.commit(&row_by_row(true, check(1, true))), Ok(()));
}

#[test]
fn sqlite_commits_a_check_only_while_the_row_has_the_version_and_pause_flag_read() {
    let path = temp_db("check-as-read");
    let mut store = SqliteStore::open(path.to_str().unwrap(), SqliteOptions::default()).unwrap();
    a_check_commits_only_while_the_row_is_as_read(
        &mut store,
        "object card-1 changed since it was read",
    );
}

#[test]
fn postgres_commits_a_check_only_while_the_row_has_the_version_and_pause_flag_read() {
    on_postgres(
        "check",
        |store| {
            a_check_commits_only_while_the_row_is_as_read(
                store,
                "postgres: db error: ERROR: 1 of the group's 1 objects changed since they were read",
            )
        },
        |_, _| {},
    );
}

/// A variant's pause of another shard's object the store does not have
/// (card-9: never stored) writes nothing, not even its `paused` audit row;
/// the variant itself commits (the caller counts the rows in its backend).
fn a_pause_of_an_object_not_stored_writes_nothing(store: &mut dyn Store) {
    use snapshot_receiver::store::{ReceiptRow, VariantRow};
    use snapshot_receiver::Verdict;
    seed_cards(store);
    store
        .commit(&[Write::Receipt(ReceiptRow {
            event_id: Arc::from("e-1"),
            fingerprint: 1,
            object_id: Arc::from("card-9"),
            decision: Verdict::Held(snapshot_receiver::HoldReason::UnknownObject),
            first_seen: t(),
            retention_cutoff: None,
        })])
        .unwrap();
    let mut variant = variant_of(1);
    if let Write::PauseIfStored {
        object_id, audit, ..
    } = &mut variant[1]
    {
        *object_id = Arc::from("card-9");
        audit.object_id = Some(Arc::from("card-9"));
    }
    if let Write::Variant(VariantRow { object_id, .. }) = &mut variant[0] {
        *object_id = Arc::from("card-1");
    }
    assert_eq!(store.commit(&variant), Ok(()));
    let objects = store.objects().unwrap();
    let mut ids: Vec<(&str, bool)> = objects.iter().map(|o| (&*o.object_id, o.paused)).collect();
    ids.sort_unstable();
    assert_eq!(ids, [("card-1", false), ("card-2", false)]);
}

#[test]
fn sqlite_pause_of_an_object_not_stored_writes_no_row_and_no_audit() {
    let path = temp_db("pause-not-stored");
    let mut store = SqliteStore::open(path.to_str().unwrap(), SqliteOptions::default()).unwrap();
    a_pause_of_an_object_not_stored_writes_nothing(&mut store);
    drop(store);
    assert_eq!(
        sqlite_count(&path, "SELECT count(*) FROM audit WHERE kind = 'paused'"),
        0
    );
    assert_eq!(
        sqlite_count(&path, "SELECT count(*) FROM receipt_variants"),
        1
    );
}

#[test]
fn postgres_pause_of_an_object_not_stored_writes_no_row_and_no_audit() {
    on_postgres(
        "pause_absent",
        a_pause_of_an_object_not_stored_writes_nothing,
        |url, schema| {
            let tables = ["audit WHERE kind = 'paused'", "receipt_variants"];
            assert_eq!(pg_counts(url, schema, tables), [0, 1]);
        },
    );
}
