//! The memory budget at the receiver's edge (docs/CONTRACT.md §9): the
//! deliveries accepted and not yet answered stop at their ceiling with
//! `retry` (`memory_full`), and what is reserved is given back when the
//! answer leaves; the total is checked when the receiver is built and when
//! `serve` starts; `/metrics` reports the parts in bytes.

use crate::commit::{card, commit_held, Script, PATIENCE};
use crate::serve::Server;
use crate::store::temp_db;
use snapshot_receiver::core::engine::QUEUED_OVERHEAD;
use snapshot_receiver::{
    BuildError, Config, Decision, MemoryBudget, Outcome, Receiver, RetryReason, MIN_MEMORY_BUDGET,
};
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_retry_at_once_and_takes_deliveries_again_after_the_answer() {
    let path = temp_db("queued-ceiling");
    let script = Arc::new(Script::default());
    let first = card("card-1", "e-1", 1, r#"{"v":1}"#);
    let second = card("card-2", "e-2", 1, r#"{"v":1}"#);
    let each = first.len() + QUEUED_OVERHEAD;
    assert_eq!(second.len() + QUEUED_OVERHEAD, each);
    // Room for one delivery and a half.
    let limit = each + each / 2;
    let config = Config {
        shards: 1,
        memory: MemoryBudget {
            queued: limit,
            ..MemoryBudget::default()
        },
        ..Config::default()
    };
    let rx = script
        .builder(&path, 1)
        .config(config)
        .object("card-1", 0, r#"{"v":0}"#)
        .object("card-2", 0, r#"{"v":0}"#)
        .build()
        .unwrap();
    script.hold_next();
    let waiting = {
        let rx = rx.clone();
        tokio::spawn(async move { rx.deliver(first.as_bytes()).await })
    };
    commit_held(&script).await;
    // e-2 would pass the ceiling while e-1 waits for its commit: `retry`
    // at once, nothing recorded.
    let refused = rx.deliver(second.as_bytes()).await;
    assert_eq!(
        refused.outcome,
        Outcome::Retry(RetryReason::MemoryFull {
            part: "queued",
            limit
        })
    );
    assert_eq!(rx.metrics()["retry.memory_full"], 1);
    script.release();
    let answered = tokio::time::timeout(PATIENCE, waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answered.decision(), Some(Decision::Applied));
    assert_eq!(
        rx.memory_bytes().await.queued,
        0,
        "given back with the answer"
    );
    let again = rx.deliver(second.as_bytes()).await;
    assert_eq!(again.decision(), Some(Decision::Applied));
    rx.shutdown().await;
}

#[tokio::test]
async fn a_batch_over_a_full_queue_answers_every_delivery_retry() {
    let path = temp_db("queued-batch");
    let script = Arc::new(Script::default());
    let bodies: Vec<String> = (1..=3)
        .map(|n| card(&format!("card-{n}"), &format!("e-{n}"), 1, r#"{"v":1}"#))
        .collect();
    let config = Config {
        shards: 2,
        memory: MemoryBudget {
            queued: 1,
            ..MemoryBudget::default()
        },
        ..Config::default()
    };
    let mut builder = script.builder(&path, 2).config(config);
    for n in 1..=3 {
        builder = builder.object(&format!("card-{n}"), 0, r#"{"v":0}"#);
    }
    let rx = builder.build().unwrap();
    script.hold_next();
    // Nothing queued: one batch always gets in, whatever its size.
    let held = {
        let (rx, bodies) = (rx.clone(), bodies.clone());
        tokio::spawn(async move { rx.deliver_batch(&bodies[..2]).await })
    };
    commit_held(&script).await;
    let refused = rx.deliver_batch(&bodies[2..]).await;
    assert_eq!(
        refused
            .iter()
            .map(|r| r.outcome.clone())
            .collect::<Vec<_>>(),
        [Outcome::Retry(RetryReason::MemoryFull {
            part: "queued",
            limit: 1
        })]
    );
    script.release();
    let answered = tokio::time::timeout(PATIENCE, held).await.unwrap().unwrap();
    assert!(answered
        .iter()
        .all(|r| r.decision() == Some(Decision::Applied)));
    assert_eq!(rx.memory_bytes().await.queued, 0);
    rx.shutdown().await;
}

#[tokio::test]
async fn a_budget_below_the_smallest_is_refused_when_built() {
    let e = Receiver::builder()
        .memory_budget(MIN_MEMORY_BUDGET - 1)
        .build()
        .err()
        .expect("refused");
    assert!(matches!(e, BuildError::MemoryBudget(_)), "{e:?}");
    assert_eq!(
        e.to_string(),
        "invalid configuration: memory_budget: a memory budget of 16777215 bytes is below the \
         smallest accepted, 16777216 bytes (16 MiB)"
    );
    // The default total, split: what memory_bytes reports as the budget.
    let rx = Receiver::builder().memory_budget(64 << 20).build().unwrap();
    let used = rx.memory_bytes().await;
    // Without a store, the store's part goes to the objects.
    assert_eq!(
        used.budget,
        MemoryBudget::split(64 << 20).unwrap().with_store_engine(0)
    );
    assert_eq!((used.budget.objects, used.budget.store), (32 << 20, 0));
    assert_eq!(used.budget.total(), 64 << 20);
    assert_eq!((used.objects, used.waiting, used.queued), (0, 0, 0));
    rx.shutdown().await;
}

#[test]
fn serve_refuses_a_bad_memory_budget_in_words_and_reports_the_parts_in_bytes() {
    let out = crate::common::cli()
        .args(["serve", "--store", "memory", "--memory-budget", "1MiB"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "invalid value '1MiB' for '--memory-budget <SIZE>': 1048576 bytes is below the smallest memory budget, 16777216 bytes (16MiB)"
        ),
        "{stderr}"
    );
    let server = Server::start(&["--store", "memory", "--memory-budget", "64MiB"]);
    let metrics = server.get("/metrics").body;
    for line in [
        "snapshot_receiver_memory_bytes{part=\"total\",kind=\"budget\"} 67108864",
        "snapshot_receiver_memory_bytes{part=\"objects\",kind=\"budget\"} 33554432",
        "snapshot_receiver_memory_bytes{part=\"queued\",kind=\"budget\"} 8388608",
        "snapshot_receiver_memory_bytes{part=\"waiting\",kind=\"used\"} 0",
        "snapshot_receiver_memory_bytes{part=\"store\",kind=\"budget\"} 0",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }
    let (status, _) = server.stop();
    assert!(status.success());
}

/// The budget's store part sizes the store's engine, and what the engine
/// does not take goes to the working set: the whole part for memory and
/// PostgreSQL (its caches are its server's), SQLite's page caches (2,000
/// KiB for each of the committer, its checkpoint, 4 shards, the identity
/// filter's scan, a relay and a reconciler), the `lsm:` store's cache and
/// write buffer (the whole part). The total stays the one given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_engine_takes_its_part_and_the_objects_get_the_rest() {
    const MIB: usize = 1 << 20;
    let mut stores = vec![
        ("memory".to_owned(), 0),
        (
            format!("sqlite:{}", temp_db("engine-part").display()),
            9 * 2_048_000,
        ),
    ];
    #[cfg(feature = "lsm")]
    {
        let dir = temp_db("engine-part-lsm");
        let _ = std::fs::remove_dir_all(&dir);
        stores.push((format!("lsm:{}", dir.display()), 96 * MIB));
    }
    let schema = format!("sr_engine_part_{}", std::process::id());
    let pg = crate::durability::pg_url();
    if let Some(url) = &pg {
        crate::durability::drop_schema(url, &schema);
        stores.push((url.clone(), 0));
    }
    for (store, engine) in stores {
        let mut builder = Receiver::builder().shards(4).store(&store);
        if store.starts_with("postgres") {
            builder = builder.store_schema(&schema);
        }
        let rx = builder.memory_budget(512 * MIB).build().unwrap();
        let used = rx.memory_bytes().await;
        assert_eq!(used.budget.store, engine, "{store}");
        assert_eq!(used.budget.objects, 256 * MIB - engine, "{store}");
        assert_eq!(used.budget.total(), 512 * MIB, "{store}");
        assert_eq!(used.store, engine, "{store}");
        rx.shutdown().await;
    }
    if let Some(url) = &pg {
        crate::durability::drop_schema(url, &schema);
    }
}
