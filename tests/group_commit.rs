//! The arbitration of a folded group commit, against the stores themselves:
//! a group's writes are checked and written table by table (PostgreSQL: one
//! statement for the whole group), and it must stay exact between
//! processes: unique receipts, the version condition, all or nothing.

use crate::durability::{drop_schema, pg, pg_url};
use crate::store::temp_db;
use snapshot_receiver::store::{
    AuditRow, Expect, HeldKey, HeldStatus, ObjectRow, PostgresStore, ReceiptRow, SqliteOptions,
    SqliteStore, Store, StoreError, Write,
};
use snapshot_receiver::Verdict;
use std::sync::Arc;
use std::time::{Duration, Instant, UNIX_EPOCH};

fn row(object: &str, version: u64) -> ObjectRow {
    ObjectRow {
        object_id: Arc::from(object),
        version,
        state: format!("{{\"v\":{version}}}"),
        paused: false,
    }
}

/// The writes of one applied delivery, as a shard makes them: its receipt,
/// the conditional object write (the decision read `from`) and its audit row
/// (step `seq`, unique per test).
fn applied(seq: u64, event: &str, object: &str, from: u64, to: u64) -> Vec<Write> {
    vec![
        Write::Receipt(ReceiptRow {
            event_id: Arc::from(event),
            fingerprint: u128::from(to),
            object_id: Arc::from(object),
            decision: Verdict::Applied,
            first_seen: UNIX_EPOCH + Duration::from_secs(to),
            retention_cutoff: None,
        }),
        Write::Object {
            row: row(object, to),
            expect: Expect::Version {
                version: from,
                paused: false,
            },
        },
        Write::Audit(AuditRow {
            key: HeldKey { origin: 1, seq },
            at: UNIX_EPOCH + Duration::from_secs(to),
            event_id: Some(Arc::from(event)),
            object_id: Some(Arc::from(object)),
            kind: "delivery",
            decision: Some("applied".to_owned()),
            version: Some(to),
            replacement: true,
            detail: None,
            body: Some(Arc::from(&b"{}"[..])),
        }),
    ]
}

/// What a store holds: (object, version) rows, receipts and audit rows.
fn contents(store: &mut dyn Store) -> (Vec<(String, u64)>, Vec<String>, usize) {
    let loaded = store.load(UNIX_EPOCH).unwrap();
    let objects = loaded
        .objects
        .iter()
        .map(|o| (o.object_id.to_string(), o.version))
        .collect();
    let mut receipts: Vec<String> = loaded
        .receipts
        .iter()
        .map(|r| r.event_id.to_string())
        .collect();
    receipts.sort();
    (objects, receipts, store.audit().unwrap().len())
}

/// A group of two deliveries on two objects in which the second decision's
/// condition no longer holds: the whole group is refused and nothing of it
/// is stored, the first object's valid write and both receipts included.
/// `changed` and `exists` are what the store says about a failed version
/// condition and an existing receipt.
fn a_group_with_one_failing_condition_commits_nothing(
    store: &mut dyn Store,
    changed: &str,
    exists: &str,
) {
    let conflict = |result: Result<(), StoreError>, why: &str| match result {
        Err(StoreError::Conflict(text)) => assert!(text.contains(why), "{text}"),
        other => panic!("expected a conflict saying {why:?}, got {other:?}"),
    };
    store
        .commit(&[Write::Seed(row("a", 0)), Write::Seed(row("b", 0))])
        .unwrap();
    store.commit(&applied(1, "e-b1", "b", 0, 1)).unwrap();
    let before = contents(store);
    assert_eq!(
        before,
        (
            vec![("a".to_owned(), 0), ("b".to_owned(), 1)],
            vec!["e-b1".to_owned()],
            1
        )
    );
    // "b" is at 1 now; this group's decision on it read 0.
    let mut group = applied(2, "e-a1", "a", 0, 1);
    group.extend(applied(3, "e-b2", "b", 0, 2));
    conflict(store.commit(&group), changed);
    assert_eq!(contents(store), before);
    // A receipt that exists already refuses the group the same way.
    let mut group = applied(2, "e-a1", "a", 0, 1);
    group.extend(applied(3, "e-b1", "b", 1, 2));
    conflict(store.commit(&group), exists);
    assert_eq!(contents(store), before);
    // Decided again on the stored rows, the same deliveries commit.
    let mut group = applied(2, "e-a1", "a", 0, 1);
    group.extend(applied(3, "e-b2", "b", 1, 2));
    store.commit(&group).unwrap();
    assert_eq!(
        contents(store),
        (
            vec![("a".to_owned(), 1), ("b".to_owned(), 2)],
            vec!["e-a1".to_owned(), "e-b1".to_owned(), "e-b2".to_owned()],
            3
        )
    );
}

#[test]
fn sqlite_a_group_with_one_failing_condition_commits_nothing() {
    let path = temp_db("group-conflict");
    let mut store =
        SqliteStore::open(&path.display().to_string(), SqliteOptions::default()).unwrap();
    a_group_with_one_failing_condition_commits_nothing(
        &mut store,
        "object b changed since it was read",
        "receipt for e-b1 already exists",
    );
}

/// Runs `test` on a PostgreSQL store in a new schema `sr_{name}_{pid}`,
/// dropped afterwards (nothing without a test server).
fn in_postgres_schema(name: &str, test: impl FnOnce(&mut dyn Store)) {
    let Some(url) = pg_url() else { return };
    let schema = format!("sr_{name}_{}", std::process::id());
    drop_schema(&url, &schema);
    let mut store = PostgresStore::connect_in_schema(&url, Some(&schema)).unwrap();
    test(&mut store);
    drop(store);
    drop_schema(&url, &schema);
}

#[test]
fn postgres_a_group_with_one_failing_condition_commits_nothing() {
    in_postgres_schema("group_conflict", |store| {
        a_group_with_one_failing_condition_commits_nothing(
            store,
            "1 of the group's 2 objects changed since they were read",
            "1 of the group's 2 receipts already exist",
        )
    });
}

/// A group that carries a reconciler's writes (an authority introducing
/// object `d`, a held input resolved) among deliveries: the runs around them
/// still commit through the folded statements, and only those two writes go
/// one statement each (`unfolded`). The run after the introduction reads
/// the row it left (`d` from 5 to 6). A failing condition in a later run
/// refuses the whole group, the introduction included.
fn a_reconciler_write_folds_the_runs_around_it(store: &mut dyn Store) {
    let seeds = [Write::Seed(row("a", 0)), Write::Seed(row("b", 0))];
    store.commit(&seeds).unwrap();
    let resolve = Write::HeldStatus {
        key: HeldKey { origin: 1, seq: 90 },
        status: HeldStatus::Resolved,
        superseded_by: Some(5),
    };
    let introduce = Write::Object {
        row: row("d", 5),
        expect: Expect::Absent,
    };
    let group = |b_from: u64| {
        let mut group = applied(1, "e-a1", "a", 0, 1);
        group.push(resolve.clone());
        group.extend(applied(2, "e-b1", "b", b_from, 1));
        group.extend(applied(3, "e-a2", "a", 1, 2));
        group.push(introduce.clone());
        group.extend(applied(4, "e-d1", "d", 5, 6));
        group
    };
    let before = contents(store);
    match store.commit(&group(7)) {
        Err(StoreError::Conflict(_)) => {}
        other => panic!("expected a conflict on b, got {other:?}"),
    }
    assert_eq!(contents(store), before);
    let phases = store.phases();
    store.commit(&group(0)).unwrap();
    assert_eq!(
        contents(store),
        (
            vec![
                ("a".to_owned(), 2),
                ("b".to_owned(), 1),
                ("d".to_owned(), 6)
            ],
            ["e-a1", "e-a2", "e-b1", "e-d1"].map(String::from).to_vec(),
            4
        )
    );
    assert_eq!(store.phases().since(&phases).unfolded, 2);
}

#[test]
fn sqlite_a_reconciler_write_folds_the_runs_around_it() {
    let path = temp_db("group-reconciler");
    let mut store =
        SqliteStore::open(&path.display().to_string(), SqliteOptions::default()).unwrap();
    a_reconciler_write_folds_the_runs_around_it(&mut store);
}

#[test]
fn postgres_a_reconciler_write_folds_the_runs_around_it() {
    in_postgres_schema(
        "group_reconciler",
        a_reconciler_write_folds_the_runs_around_it,
    );
}

/// How many sessions named `app_a` / `app_b` wait for a lock.
fn waiting(url: &str, apps: [&str; 2]) -> i64 {
    let sql = format!(
        "SELECT count(*) FROM pg_stat_activity
         WHERE application_name IN ('{}', '{}') AND wait_event_type = 'Lock'",
        apps[0], apps[1]
    );
    pg(url, move |c| c.query_one(&sql, &[]).unwrap().get(0))
}

#[test]
fn two_processes_racing_on_one_object_through_the_group_statement_give_one_winner() {
    let Some(url) = pg_url() else { return };
    let schema = format!("sr_group_race_{}", std::process::id());
    drop_schema(&url, &schema);
    let apps = [
        format!("sr_race_a_{}", std::process::id()),
        format!("sr_race_b_{}", std::process::id()),
    ];
    let mut setup = PostgresStore::connect_in_schema(&url, Some(&schema)).unwrap();
    setup.commit(&[Write::Seed(row("x", 0))]).unwrap();
    // Two stores, as two receiver processes would have, both deciding on
    // "x" as they read it: version 0.
    let stores: Vec<PostgresStore> = apps
        .iter()
        .map(|app| {
            let url = format!("{url}?application_name={app}");
            PostgresStore::connect_in_schema(&url, Some(&schema)).unwrap()
        })
        .collect();
    // A third session holds x's row lock, so that both groups are inside
    // their statement, waiting for it, before either can commit.
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let (held_tx, held_rx) = std::sync::mpsc::channel::<()>();
    let holder = {
        let (url, schema) = (url.clone(), schema.clone());
        std::thread::spawn(move || {
            let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            let mut tx = c.transaction().unwrap();
            tx.batch_execute(&format!(
                "SET LOCAL search_path TO {schema}; SELECT 1 FROM objects WHERE object_id = 'x' FOR UPDATE"
            ))
            .unwrap();
            held_tx.send(()).unwrap();
            release_rx.recv().unwrap();
            tx.rollback().unwrap();
        })
    };
    held_rx.recv().unwrap();
    let racers: Vec<_> = stores
        .into_iter()
        .zip([("e-a", 1), ("e-b", 2)])
        .map(|(mut store, (event, to))| {
            std::thread::spawn(move || store.commit(&applied(to, event, "x", 0, to)))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while waiting(&url, [&apps[0], &apps[1]]) < 2 {
        assert!(
            Instant::now() < deadline,
            "both groups never waited for the row lock"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    release_tx.send(()).unwrap();
    holder.join().unwrap();
    let results: Vec<Result<(), StoreError>> =
        racers.into_iter().map(|r| r.join().unwrap()).collect();
    let winners: Vec<usize> = (0..2).filter(|&i| results[i].is_ok()).collect();
    assert_eq!(winners.len(), 1, "exactly one winner: {results:?}");
    let loser = 1 - winners[0];
    assert!(
        matches!(&results[loser], Err(StoreError::Conflict(why)) if why.contains("1 of the group's 1 objects changed since they were read")),
        "{:?}",
        results[loser]
    );
    let (version, event) = [(1, "e-a"), (2, "e-b")][winners[0]];
    assert_eq!(
        contents(&mut setup),
        (vec![("x".to_owned(), version)], vec![event.to_owned()], 1)
    );
    drop(setup);
    drop_schema(&url, &schema);
}
