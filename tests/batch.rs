//! `Receiver::deliver_batch`: the same receipts as one `deliver` call per
//! body, in the caller's order, whatever the shards do.

use crate::common::{body, receiver, receiver_at, t, T};
use snapshot_receiver::store::StoreError;
use snapshot_receiver::{fixture::Fixture, Ack, ManualClock, Receipt, Receiver};
use std::sync::Arc;

/// What a caller reads off a receipt: event, decision (or ack meaning),
/// acknowledgement, object version, state, paused flag, replacement.
type Seen = (
    Option<String>,
    String,
    Ack,
    Option<u64>,
    Option<String>,
    Option<bool>,
    bool,
);

fn seen(r: &Receipt) -> Seen {
    (
        r.event_id.as_deref().map(str::to_owned),
        r.decision()
            .map_or_else(|| r.ack_meaning(), |d| d.to_string()),
        r.ack(),
        r.object.as_ref().map(|o| o.version),
        r.object.as_ref().map(|o| o.state.compact()),
        r.object.as_ref().map(|o| o.paused),
        r.replacement,
    )
}

fn fixture_bodies() -> Vec<Vec<u8>> {
    let fixture = Fixture::load(&crate::common::repo("fixtures/B62-15-events.json")).unwrap();
    fixture.deliveries.into_iter().map(|d| d.body).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_deliveries_in_one_batch_get_the_receipts_of_one_call_each() {
    let bodies = fixture_bodies();
    let one = receiver();
    let mut expected = Vec::new();
    for b in &bodies {
        expected.push(seen(&one.deliver(b).await));
    }
    let many = receiver();
    let got: Vec<Seen> = many.deliver_batch(&bodies).await.iter().map(seen).collect();
    assert_eq!(got, expected);
    let decisions: Vec<&str> = got.iter().map(|s| s.1.as_str()).collect();
    assert_eq!(
        decisions,
        [
            "applied",
            "duplicate (original: applied)",
            "stale",
            "applied",
            "held (missing_version)",
            "conflict (event_variant)",
            "held (paused)",
            "held (unsupported_type)",
            "conflict (version_state)",
            "held (unknown_object)",
        ]
    );
    let state = |r: &Receiver| {
        let r = r.clone();
        async move {
            r.objects()
                .await
                .into_iter()
                .map(|o| {
                    (
                        o.object_id.to_string(),
                        o.version,
                        o.state.compact(),
                        o.paused,
                    )
                })
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(state(&many).await, state(&one).await);
    assert_eq!(many.metrics(), one.metrics());
    assert_eq!(many.metrics()["decision.held"], 4);
    assert_eq!(many.audit().await.len(), one.audit().await.len());
    one.shutdown().await;
    many.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_keep_their_place_and_an_empty_batch_is_empty() {
    let rx = Receiver::builder()
        .limits(snapshot_receiver::Limits {
            max_body_bytes: 300,
            ..Default::default()
        })
        .clock(Arc::new(ManualClock::new(t())))
        .object("card-7", 10, r#"{"stage":"queued","label":"Map"}"#)
        .build()
        .unwrap();
    assert!(rx.deliver_batch::<&[u8]>(&[]).await.is_empty());
    let big = body(
        "e-9",
        "card-7",
        Some("13"),
        T,
        &format!("\"{}\"", "x".repeat(400)),
    );
    let bodies = [
        body("e-1", "card-7", Some("11"), T, r#"{"a":1}"#),
        big,
        body("e-2", "card-7", Some("12"), T, r#"{"a":2}"#),
    ];
    let got: Vec<Seen> = rx.deliver_batch(&bodies).await.iter().map(seen).collect();
    assert_eq!(got[0].1, "applied");
    assert_eq!(got[0].3, Some(11));
    assert_eq!(got[1].2, Ack::Reject);
    assert!(got[1].1.contains("over the limit of 300"), "{}", got[1].1);
    assert_eq!((got[2].1.as_str(), got[2].3), ("applied", Some(12)));
    assert_eq!(rx.metrics()["reject.body_too_large"], 1);
    rx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_shutdown_every_delivery_of_a_batch_gets_retry_with_its_ids() {
    let rx = receiver_at(Arc::new(ManualClock::new(t())));
    rx.shutdown().await;
    let bodies = fixture_bodies();
    let got = rx.deliver_batch(&bodies).await;
    assert_eq!(got.len(), 10);
    assert!(got.iter().all(|r| r.ack() == Ack::Retry));
    assert_eq!(got[3].event_id.as_deref(), Some("e-206"));
    assert_eq!(got[3].object_id.as_deref(), Some("card-8"));
    assert_eq!(rx.metrics()["retry.shutting_down"], 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_batches_apply_each_event_once_and_converge() {
    let rx = Receiver::builder()
        .shards(4)
        .mailbox_capacity(2)
        .clock(Arc::new(ManualClock::new(t())))
        .object("obj-0", 0, "{}")
        .object("obj-1", 0, "{}")
        .object("obj-2", 0, "{}")
        .build()
        .unwrap();
    // Three producers send every version of three objects, each in its own
    // order and in batches of 5.
    let all: Vec<String> = (0..3u64)
        .flat_map(|o| (1..=30u64).map(move |v| crate::common::versioned(o, v).1))
        .collect();
    let mut tasks = Vec::new();
    for p in 0..3u64 {
        let rx = rx.clone();
        let mut mine = all.clone();
        crate::common::shuffle(&mut mine, 17 + p);
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for chunk in mine.chunks(5) {
                out.extend(rx.deliver_batch(chunk).await);
            }
            out
        }));
    }
    let mut receipts = Vec::new();
    for t in tasks {
        receipts.extend(t.await.unwrap());
    }
    assert_eq!(receipts.len(), 270);
    let firsts = receipts
        .iter()
        .filter(|r| !r.decision().unwrap().to_string().starts_with("duplicate"))
        .count();
    assert_eq!(firsts, 90);
    let applied = receipts.iter().filter(|r| r.replacement).count() as u64;
    assert_eq!(rx.counters().await.event_replacements, applied);
    for o in rx.objects().await {
        assert_eq!(
            (o.version, o.state.compact(), o.paused),
            (30, r#"{"v":30}"#.to_owned(), false)
        );
    }
    rx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_on_a_failing_store_answers_retry_for_its_part_and_the_resend_goes_through() {
    use snapshot_receiver::store::{FaultyStore, SqliteOptions, SqliteStore};
    use snapshot_receiver::{Outcome, RetryReason};
    let path = crate::store::temp_db("batch-faulty");
    let p = path.clone();
    // Commit 1 seeds the initial objects, commit 2 is the first batch, 3 the second.
    let rx = Receiver::builder()
        .shards(1)
        .clock(Arc::new(ManualClock::new(t())))
        .object("card-7", 10, r#"{"stage":"queued","label":"Map"}"#)
        .store_with(move || {
            SqliteStore::open(p.to_str().unwrap(), SqliteOptions::default())
                .map(|s| FaultyStore::new(s, |n| n == 3))
        })
        .build()
        .unwrap();
    let v = |id: &str, version: &str| {
        body(
            id,
            "card-7",
            Some(version),
            T,
            &format!("{{\"v\":{version}}}"),
        )
    };
    let first = [v("e-1", "11"), v("e-2", "12")];
    let got: Vec<Seen> = rx.deliver_batch(&first).await.iter().map(seen).collect();
    assert_eq!(
        (got[0].1.as_str(), got[1].1.as_str()),
        ("applied", "applied")
    );
    let second = [v("e-3", "13"), v("e-1", "11"), v("e-4", "9")];
    let failed = rx.deliver_batch(&second).await;
    let why = Outcome::Retry(RetryReason::StoreFailed(StoreError::Failed(
        "injected failure of commit 3".into(),
    )));
    assert!(failed.iter().all(|r| r.outcome == why), "{failed:?}");
    assert_eq!(failed[2].event_id.as_deref(), Some("e-4"));
    // Nothing of the failed batch stayed: the resend is decided afresh.
    assert!(rx.context().registry().get("e-3").is_none());
    let again: Vec<Seen> = rx.deliver_batch(&second).await.iter().map(seen).collect();
    let decisions: Vec<&str> = again.iter().map(|s| s.1.as_str()).collect();
    assert_eq!(
        decisions,
        ["applied", "duplicate (original: applied)", "stale"]
    );
    assert_eq!(again[0].3, Some(13));
    let stored = rx.stored_audit().await.unwrap();
    assert_eq!(stored.len(), 5);
    rx.shutdown().await;
}
