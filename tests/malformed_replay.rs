//! A malformed body is recognised by the digest of its exact bytes: replayed,
//! it is `duplicate (original: held (malformed))` and adds no held row, in
//! memory and after a restart on SQLite and on PostgreSQL (docs/CONTRACT.md
//! §2; a captured signed body replayed within its tolerance can no longer
//! fill the parking).

use crate::common::t;
use crate::durability::{drop_schema, pg_url};
use crate::isolation::pg_counts;
use crate::store::temp_db;
use snapshot_receiver::{
    Decision, HoldReason, ManualClock, Outcome, Receiver, ReceiverBuilder, Verdict,
};
use std::sync::Arc;

/// Valid JSON with a duplicate key: malformed, held with its bytes.
const BODY: &[u8] = br#"{"event_id":"m-1","object_id":"card-7","object_version":11,"object_version":12,"type":"card.snapshot","state":{}}"#;

/// Another malformed body (not UTF-8): its own hold.
const OTHER: &[u8] = b"{\"event_id\":\"m-2\",\xff}";

fn builder() -> ReceiverBuilder {
    Receiver::builder()
        .clock(Arc::new(ManualClock::new(t())))
        .object("card-7", 10, "{}")
}

/// Delivers `BODY` `times` times; returns how many were held and how many
/// were duplicates of that hold (anything else fails).
async fn replay(rx: &Receiver, times: usize) -> (usize, usize) {
    let held = Decision::Held(HoldReason::Malformed);
    let duplicate = Decision::Duplicate {
        original: Verdict::Held(HoldReason::Malformed),
    };
    let (mut h, mut d) = (0, 0);
    for i in 0..times {
        let r = rx.deliver(BODY).await;
        match r.outcome {
            Outcome::Decided(x) if x == held => h += 1,
            Outcome::Decided(x) if x == duplicate => d += 1,
            other => panic!("replay {i}: {other:?}"),
        }
    }
    (h, d)
}

/// Held malformed inputs the receiver reports.
async fn held_malformed(rx: &Receiver) -> usize {
    rx.unresolved()
        .await
        .iter()
        .filter(|u| u.held_as == Verdict::Held(HoldReason::Malformed))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_replays_of_one_malformed_body_give_one_held_row_and_forty_nine_duplicates_in_memory()
{
    let rx = builder().build().unwrap();
    assert_eq!(replay(&rx, 50).await, (1, 49));
    assert_eq!(held_malformed(&rx).await, 1);
    // Other bytes are another body.
    let r = rx.deliver(OTHER).await;
    assert_eq!(r.decision(), Some(Decision::Held(HoldReason::Malformed)));
    assert_eq!(held_malformed(&rx).await, 2);
    // Every delivery is in the audit trail: 50 + 1.
    assert_eq!(rx.audit().await.len(), 51);
    rx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_body_is_still_a_duplicate_after_a_restart_on_sqlite() {
    let path = temp_db("malformed-replay");
    let location = format!("sqlite:{}", path.display());
    let rx = builder().store(&location).build().unwrap();
    assert_eq!(replay(&rx, 50).await, (1, 49));
    rx.shutdown().await;
    let rx = builder().store(&location).build().unwrap();
    assert_eq!(replay(&rx, 10).await, (0, 10));
    assert_eq!(held_malformed(&rx).await, 1);
    rx.shutdown().await;
    let conn = rusqlite::Connection::open(&path).unwrap();
    let count = |sql: &str| -> i64 { conn.query_row(sql, [], |r| r.get(0)).unwrap() };
    assert_eq!(count("SELECT count(*) FROM held"), 1);
    assert_eq!(
        count("SELECT count(*) FROM audit WHERE decision = 'duplicate:held:malformed'"),
        59
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_body_is_still_a_duplicate_after_a_restart_on_postgres() {
    let Some(url) = pg_url() else { return };
    let schema = format!("sr_malformed_replay_{}", std::process::id());
    drop_schema(&url, &schema);
    let open = || builder().store(&url).store_schema(&schema).build().unwrap();
    let rx = open();
    assert_eq!(replay(&rx, 50).await, (1, 49));
    rx.shutdown().await;
    let rx = open();
    assert_eq!(replay(&rx, 10).await, (0, 10));
    assert_eq!(held_malformed(&rx).await, 1);
    rx.shutdown().await;
    let counts = pg_counts(
        &url,
        &schema,
        ["held", "audit WHERE decision = 'duplicate:held:malformed'"],
    );
    assert_eq!(counts, [1, 59]);
    drop_schema(&url, &schema);
}
