//! The refresh after a conflict reads identities before objects: a step of
//! another process that commits between the two reads must never give its
//! receipt with its object as it was before that step. The interleaving is
//! forced with a second PostgreSQL session that holds the receipts table
//! while its step is uncommitted.

use crate::durability::{drop_schema, pg, pg_url};
use snapshot_receiver::store::{ObjectRow, PostgresStore, Store, Write};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

#[test]
fn postgres_refresh_never_pairs_a_receipt_with_its_object_as_before() {
    let Some(url) = pg_url() else { return };
    let schema = format!("sr_refresh_order_{}", std::process::id());
    drop_schema(&url, &schema);
    let mut store = PostgresStore::connect_in_schema(&url, Some(&schema)).unwrap();
    store
        .commit(&[Write::Seed(ObjectRow {
            object_id: Arc::from("x"),
            version: 0,
            state: r#"{"v":0}"#.to_owned(),
            paused: false,
        })])
        .unwrap();

    // Another process's step: e-1 applied to x (its receipt and x at v1 in
    // one transaction), holding the receipts table until it is released.
    let (ready_tx, ready_rx) = mpsc::channel::<i32>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let writer = {
        let (url, schema) = (url.clone(), schema.clone());
        std::thread::spawn(move || {
            let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
            let pid: i32 = c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
            let mut tx = c.transaction().unwrap();
            tx.batch_execute(&format!(
                "SET LOCAL search_path TO {schema};
                 LOCK TABLE receipts IN ACCESS EXCLUSIVE MODE;
                 INSERT INTO receipts (event_id, fingerprint, object_id, decision, first_seen_ns)
                     VALUES ('e-1', '\\x00000000000000000000000000000001', 'x', 'applied', 1);
                 UPDATE objects SET version = '00000000000000000001', state = '{{\"v\":1}}'
                     WHERE object_id = 'x';"
            ))
            .unwrap();
            ready_tx.send(pid).unwrap();
            release_rx.recv().unwrap();
            tx.commit().unwrap();
        })
    };
    let writer_pid = ready_rx.recv().unwrap();

    // The refresh starts while the step is uncommitted ...
    let reader = std::thread::spawn(move || {
        let result = store.refresh(&[Arc::from("x")], &[Arc::from("e-1")]);
        (store, result)
    });
    // ... and waits for the writer at its receipts read; the step commits
    // only then, between that read and any read that comes after it.
    let blocked = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE {writer_pid} = ANY(pg_blocking_pids(pid))"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let sql = blocked.clone();
        if pg(&url, move |c| {
            c.query_one(&sql, &[]).unwrap().get::<_, i64>(0)
        }) == 1
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the refresh never waited for the writer"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    release_tx.send(()).unwrap();
    writer.join().unwrap();
    let (store, result) = reader.join().unwrap();
    let (objects, receipts) = result.unwrap();

    let receipts: Vec<(String, String)> = receipts
        .iter()
        .map(|r| (r.event_id.to_string(), r.decision.code()))
        .collect();
    let objects: Vec<(String, u64, String)> = objects
        .iter()
        .map(|o| (o.object_id.to_string(), o.version, o.state.clone()))
        .collect();
    // The receipt read waited for the commit and found e-1: the object read
    // after it sees the step's x at v1.
    assert_eq!(
        (receipts, objects),
        (
            vec![("e-1".to_owned(), "applied".to_owned())],
            vec![("x".to_owned(), 1, r#"{"v":1}"#.to_owned())]
        )
    );
    drop(store);
    drop_schema(&url, &schema);
}
