//! Bounded memory: the in-memory audit trail and replacements keep the most
//! recent `trail_capacity` records, oldest evicted first; readers asking
//! for evicted records get a `TrailGap`; the durable store keeps everything.

use snapshot_receiver::{
    core::shard_of, Config, OutboxError, OutboxGap, Receiver, TrailGap, DEFAULT_TRAIL_CAPACITY,
};

fn body(event: &str, object: &str, version: u64) -> String {
    format!(
        r#"{{"event_id":"{event}","object_id":"{object}","object_version":{version},"occurred_at":"2099-01-01T00:00:00Z","type":"card.snapshot","state":{{"v":{version}}}}}"#
    )
}

#[test]
fn the_default_configuration_is_bounded() {
    assert_eq!(Config::default().trail_capacity, DEFAULT_TRAIL_CAPACITY);
    assert_eq!(DEFAULT_TRAIL_CAPACITY, 10_000);
}

#[allow(deprecated)] // pins the history read by step number
#[tokio::test]
async fn one_shard_keeps_the_last_capacity_records_and_reports_the_gap() {
    let rx = Receiver::builder()
        .shards(1)
        .trail_capacity(8)
        .object("c-1", 0, "{}")
        .build()
        .unwrap();
    for v in 1..=20 {
        rx.deliver(body(&format!("e-{v}"), "c-1", v).as_bytes())
            .await;
    }
    // One audit record and one replacement per delivery, numbered 1..=20.
    let seqs: Vec<u64> = rx.audit().await.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, (13..=20).collect::<Vec<_>>());
    assert_eq!(
        rx.effects_since(0).await.unwrap_err(),
        TrailGap {
            after: 0,
            evicted_through: 12
        }
    );
    assert_eq!(
        rx.effects_since(11).await.unwrap_err().to_string(),
        "records after sequence number 11 were asked for, but those up to 12 were evicted \
         from memory (trail_capacity); the durable store keeps them"
    );
    let effects: Vec<u64> = rx
        .effects_since(12)
        .await
        .unwrap()
        .iter()
        .map(|r| r.version)
        .collect();
    assert_eq!(effects, (13..=20).collect::<Vec<_>>());
    assert_eq!(
        rx.effects_since(18).await.unwrap().len(),
        2,
        "a cursor above the gap reads on"
    );
    let history: Vec<u64> = rx.history("c-1").await.iter().map(|r| r.version).collect();
    assert_eq!(history, (13..=20).collect::<Vec<_>>());
    // The outbox keeps as many effects, by position: the same gap, never a hole.
    match rx.outbox(0, 100).await {
        Err(OutboxError::Gap(gap)) => assert_eq!(
            gap,
            OutboxGap {
                after: 0,
                evicted_through: 12
            }
        ),
        other => panic!("a gap, not {other:?}"),
    }
    let kept: Vec<(u64, u64)> = rx
        .outbox(12, 100)
        .await
        .unwrap()
        .iter()
        .map(|e| (e.position, e.version))
        .collect();
    assert_eq!(kept, (13..=20).map(|v| (v, v)).collect::<Vec<_>>());
    rx.shutdown().await;
}

/// A receiver of two shards and a trail capacity of 8 (4 per shard), with
/// two objects at version 0, `a-0` and the first `b-N` on the other shard.
fn two_shards() -> (Receiver, &'static str, String) {
    let a = "a-0";
    let b = (1..)
        .map(|i| format!("b-{i}"))
        .find(|id| shard_of(id, 2) != shard_of(a, 2))
        .unwrap();
    let rx = Receiver::builder()
        .shards(2)
        .trail_capacity(8)
        .object(a, 0, "{}")
        .object(&b, 0, "{}")
        .build()
        .unwrap();
    (rx, a, b)
}

#[allow(deprecated)] // pins the history read by step number
#[tokio::test]
async fn shards_share_the_capacity_and_the_audit_has_no_holes() {
    let (rx, a, b) = two_shards();
    // a gets 10 events, then b gets 3: a's shard has evicted up to seq 6,
    // b's nothing, so its 3 records and a's last 4 are the trail after 6.
    for v in 1..=10 {
        rx.deliver(body(&format!("a{v}"), a, v).as_bytes()).await;
    }
    for v in 1..=3 {
        rx.deliver(body(&format!("b{v}"), &b, v).as_bytes()).await;
    }
    let seqs: Vec<u64> = rx.audit().await.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, (7..=13).collect::<Vec<_>>());
    assert_eq!(rx.effects_since(5).await.unwrap_err().evicted_through, 6);
    assert_eq!(rx.effects_since(6).await.unwrap().len(), 7);
    rx.shutdown().await;
}

#[allow(deprecated)] // pins the history read by step number
#[tokio::test]
async fn the_durable_store_keeps_what_memory_evicted() {
    let dir = std::env::temp_dir().join(format!("trail-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("trail.db");
    let _ = std::fs::remove_file(&path);
    let rx = Receiver::builder()
        .shards(1)
        .trail_capacity(4)
        .store(&format!("sqlite:{}", path.display()))
        .object("c-1", 0, "{}")
        .build()
        .unwrap();
    for v in 1..=12 {
        rx.deliver(body(&format!("e-{v}"), "c-1", v).as_bytes())
            .await;
    }
    assert_eq!(rx.audit().await.len(), 4);
    assert!(rx.effects_since(0).await.is_err());
    assert_eq!(rx.stored_audit().await.unwrap().len(), 12);
    let stored: Vec<u64> = rx
        .stored_effects_since(0)
        .await
        .unwrap()
        .iter()
        .map(|r| r.version)
        .collect();
    assert_eq!(stored, (1..=12).collect::<Vec<_>>());
    rx.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[allow(deprecated)] // pins the history read by step number
#[tokio::test]
async fn interleaved_shards_cut_the_audit_at_the_latest_eviction() {
    // Each round sends b one event and a three: sequence numbers alternate
    // between the shards, a's shard evicts, b's keeps all four of its records.
    let (rx, a, b) = two_shards();
    let mut va = 0;
    for vb in 1..=4 {
        rx.deliver(body(&format!("b{vb}"), &b, vb).as_bytes()).await;
        for _ in 0..3 {
            va += 1;
            rx.deliver(body(&format!("a{va}"), a, va).as_bytes()).await;
        }
    }
    // b: seq 1, 5, 9, 13 (all kept); a: seq 2-4, 6-8, 10-12, 14-16, of
    // which 12, 14, 15, 16 are kept: evicted through 11. Records of b at 1,
    // 5 and 9 would sit before a hole (a's 2-4, 6-8, 10, 11 are gone): the
    // merged trail starts after the latest eviction of any shard.
    let audit = rx.audit().await;
    let seen: Vec<(u64, &str)> = audit
        .iter()
        .map(|r| (r.seq, r.event_id.as_deref().unwrap_or("-")))
        .collect();
    assert_eq!(
        seen,
        [
            (12, "a9"),
            (13, "b4"),
            (14, "a10"),
            (15, "a11"),
            (16, "a12")
        ]
    );
    assert_eq!(
        rx.effects_since(10).await.unwrap_err(),
        TrailGap {
            after: 10,
            evicted_through: 11
        }
    );
    let effects: Vec<u64> = rx
        .effects_since(11)
        .await
        .unwrap()
        .iter()
        .map(|r| r.seq)
        .collect();
    assert_eq!(effects, [12, 13, 14, 15, 16]);
    rx.shutdown().await;
}
