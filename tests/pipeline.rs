//! The durable commit pipeline's edges, each on a second path beside the
//! one test that covered it (issue 24): notifications leave once per
//! delivery and only after its commit, on the redo and batch paths; the
//! steps decided on top of a failed commit are decided again, in a batch
//! and as a restart reads them back.

use crate::commit::{card, commit_held, count, queue, Script, PATIENCE};
use crate::common::t;
use crate::store::temp_db;
use crate::subscribe::{body, drain};
use futures_util::FutureExt;
use snapshot_receiver::store::{Fault, FaultyStore, SqliteOptions, SqliteStore, StoreError};
use snapshot_receiver::{
    AuthoritativeSnapshot, Clock, Decision, ManualClock, Outcome, Receipt, Receiver, RetryReason,
    Verdict,
};
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// No notification.
const NOTHING: [&str; 0] = [];

/// A batch's receipts being awaited.
type PendingBatch = Pin<Box<dyn Future<Output = Vec<Receipt>> + Send>>;

/// Starts a [`Receiver::deliver_batch`] call and polls it once: its parts
/// are queued in their shards' mailboxes, its receipts are not awaited.
fn queue_batch(rx: &Receiver, bodies: Vec<String>) -> PendingBatch {
    let rx = rx.clone();
    let mut pending: PendingBatch = Box::pin(async move { rx.deliver_batch(&bodies).await });
    assert!(
        (&mut pending).now_or_never().is_none(),
        "a queued batch cannot be decided before its shard ran"
    );
    pending
}

/// Each receipt's decision (`None` for a retry or a reject).
fn decisions(receipts: &[Receipt]) -> Vec<Option<Decision>> {
    receipts.iter().map(Receipt::decision).collect()
}

/// Waits, yielding to the shard tasks, until the registry knows `event_id`
/// (its step was decided, committed or not).
async fn decided(rx: &Receiver, event_id: &str) {
    let deadline = Instant::now() + PATIENCE;
    while rx.context().registry().get(event_id).is_none() {
        assert!(Instant::now() < deadline, "{event_id} was never decided");
        tokio::task::yield_now().await;
    }
}

/// A one-shard receiver on the SQLite file `path` whose commit number `n`
/// conflicts while `conflict_at` holds `n` (0: none).
fn conflicting(path: &Path, conflict_at: Arc<AtomicU64>) -> Receiver {
    let path = path.to_str().unwrap().to_owned();
    Receiver::builder()
        .shards(1)
        .clock(Arc::new(ManualClock::new(t())) as Arc<dyn Clock>)
        .object("c-1", 1, "{}")
        .store_with(move || {
            let inner = SqliteStore::open(&path, SqliteOptions::default())?;
            Ok(FaultyStore::with_faults(inner, move |n| {
                (n == conflict_at.load(Ordering::SeqCst)).then_some(Fault::Conflict)
            }))
        })
        .build()
        .unwrap()
}

/// A one-shard receiver on the SQLite file `path` behind a [`Script`] (its
/// commits can be held and failed), with `object` at `version`.
fn gated(path: &Path, object: &str, version: u64, state: &str) -> (Receiver, Arc<Script>) {
    let script = Arc::new(Script::default());
    let rx = script
        .builder(path, 1)
        .object(object, version, state)
        .build()
        .unwrap();
    (rx, script)
}

/// A new one-shard receiver resumed from the SQLite file `path`, as after a
/// restart.
fn reopened(path: &Path) -> Receiver {
    Receiver::builder()
        .shards(1)
        .clock(Arc::new(ManualClock::new(t())) as Arc<dyn Clock>)
        .store(&format!("sqlite:{}", path.display()))
        .build()
        .unwrap()
}

// A group whose commit conflicts is decided again and committed by the
// redo: its subscribers hear of each delivery once, after that commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_redo_publishes_each_decision_once() {
    let path = temp_db("pipeline-redo-once");
    let conflict_at = Arc::new(AtomicU64::new(0));
    let rx = conflicting(&path, conflict_at.clone());
    let mut sub = rx.subscribe();
    // Commit 1 seeded c-1; commit 2 (e-2's group) conflicts, commit 3 is its redo.
    conflict_at.store(2, Ordering::SeqCst);
    let r = rx.deliver(body("e-2", 2).as_bytes()).await;
    assert_eq!(r.decision(), Some(Decision::Applied));
    assert_eq!(drain(&mut sub), ["decision e-2 applied", "effect 2 e-2"]);
    // A batch: commit 4 conflicts, commit 5 is its redo.
    conflict_at.store(4, Ordering::SeqCst);
    let receipts = rx.deliver_batch(&[body("e-3", 3), body("e-4", 4)]).await;
    assert_eq!(
        decisions(&receipts),
        [Some(Decision::Applied), Some(Decision::Applied)]
    );
    assert_eq!(
        drain(&mut sub),
        [
            "decision e-3 applied",
            "effect 3 e-3",
            "decision e-4 applied",
            "effect 4 e-4"
        ]
    );
    rx.shutdown().await;
    assert_eq!(count(&path, "SELECT count(*) FROM receipts"), 3);
}

// Another process raised c-1 behind the receiver's back: the first decision
// (applied) is never committed, the redo's (stale) is, and only the redo's
// is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redo_that_changes_the_decision_publishes_only_the_committed_one() {
    let path = temp_db("pipeline-redo-changed");
    // No injected conflict: the other connection's change makes a real one.
    let rx = conflicting(&path, Arc::new(AtomicU64::new(0)));
    let mut sub = rx.subscribe();
    let n = rusqlite::Connection::open(&path)
        .unwrap()
        .execute(
            "UPDATE objects SET version = ?1, state = ?2 WHERE object_id = 'c-1'",
            (format!("{:020}", 5), r#"{"v":5}"#),
        )
        .unwrap();
    assert_eq!(n, 1);
    let r = rx.deliver(body("e-2", 2).as_bytes()).await;
    assert_eq!(r.decision(), Some(Decision::Stale));
    assert_eq!(drain(&mut sub), ["decision e-2 stale"]);
    assert_eq!(rx.object("c-1").await.unwrap().version, 5);
    rx.shutdown().await;
}

// While a batch's commit is held at the gate nothing of it is published;
// once committed, all of it; of a batch whose commit fails, nothing. The
// same for an authority's effect.
#[tokio::test]
async fn a_batch_is_published_only_after_its_commit() {
    let path = temp_db("pipeline-batch-publish");
    let (rx, script) = gated(&path, "c-1", 1, "{}");
    let mut sub = rx.subscribe();
    script.hold_next();
    let batch = queue_batch(&rx, vec![body("e-2", 2), body("e-3", 3)]);
    commit_held(&script).await;
    // Decided (the registry knows both) and not committed: not published.
    decided(&rx, "e-3").await;
    assert_eq!(drain(&mut sub), NOTHING, "published before the commit");
    script.release();
    assert_eq!(
        decisions(&batch.await),
        [Some(Decision::Applied), Some(Decision::Applied)]
    );
    assert_eq!(
        drain(&mut sub),
        [
            "decision e-2 applied",
            "effect 2 e-2",
            "decision e-3 applied",
            "effect 3 e-3"
        ]
    );

    // A batch whose commit fails is not published; sent again, it is.
    script.hold_next();
    let batch = queue_batch(&rx, vec![body("e-4", 4), body("e-5", 5)]);
    let gated = commit_held(&script).await;
    script.fail_at.store(gated, Ordering::SeqCst);
    script.release();
    let failed = Outcome::Retry(RetryReason::StoreFailed(StoreError::Failed(format!(
        "injected failure of commit {gated}"
    ))));
    let outcomes: Vec<Outcome> = batch.await.into_iter().map(|r| r.outcome).collect();
    assert_eq!(outcomes, [failed.clone(), failed]);
    assert_eq!(drain(&mut sub), NOTHING);
    let receipts = rx.deliver_batch(&[body("e-4", 4), body("e-5", 5)]).await;
    assert_eq!(
        decisions(&receipts),
        [Some(Decision::Applied), Some(Decision::Applied)]
    );
    assert_eq!(
        drain(&mut sub),
        [
            "decision e-4 applied",
            "effect 4 e-4",
            "decision e-5 applied",
            "effect 5 e-5"
        ]
    );

    // An authority's effect, held at the gate, then committed.
    script.hold_next();
    let snapshot: AuthoritativeSnapshot =
        serde_json::from_str(r#"{"object_id":"c-1","version":9,"state":{"v":9}}"#).unwrap();
    let reconciling = {
        let rx = rx.clone();
        tokio::spawn(async move { rx.reconcile(snapshot).await })
    };
    commit_held(&script).await;
    assert_eq!(drain(&mut sub), NOTHING, "published before the commit");
    script.release();
    assert!(reconciling.await.unwrap().is_ok());
    assert_eq!(drain(&mut sub), ["effect 9 authority"]);
    rx.shutdown().await;
}

// The steps a batch decided on top of a commit that then failed are decided
// again on the rolled-back state: their answers say so, and so does the
// file a restarted receiver reads.
#[tokio::test]
async fn a_batch_decided_on_top_of_a_failed_commit_is_decided_again_and_stored() {
    let path = temp_db("pipeline-batch-redecided");
    let (rx, script) = gated(&path, "card-7", 10, r#"{"v":10}"#);
    let e1 = card("card-7", "e-1", 11, r#"{"v":11}"#);
    script.hold_next();
    let first = queue(&rx, e1.clone());
    let gated = commit_held(&script).await;
    script.fail_at.store(gated, Ordering::SeqCst);
    // While e-1's group waits at the gate, a batch is decided on top of it:
    // a redelivery of e-1 (a duplicate of the uncommitted record), e-2 and
    // e-3.
    let batch = queue_batch(
        &rx,
        vec![
            e1.clone(),
            card("card-7", "e-2", 12, r#"{"v":12}"#),
            card("card-7", "e-3", 13, r#"{"v":13}"#),
        ],
    );
    decided(&rx, "e-3").await;
    script.release();
    let failed = RetryReason::StoreFailed(StoreError::Failed(format!(
        "injected failure of commit {gated}"
    )));
    assert_eq!(first.await.outcome, Outcome::Retry(failed));
    // Decided again: the redelivery is now e-1's first record.
    assert_eq!(
        decisions(&batch.await),
        [
            Some(Decision::Applied),
            Some(Decision::Applied),
            Some(Decision::Applied)
        ]
    );
    let o = rx.object("card-7").await.unwrap();
    assert_eq!(
        (o.version, o.state.compact()),
        (13, r#"{"v":13}"#.to_owned())
    );
    rx.shutdown().await;
    drop(rx);

    // A restart reads back what the answers said.
    assert_eq!(
        count(
            &path,
            "SELECT count(*) FROM receipts WHERE event_id IN ('e-1', 'e-2', 'e-3') AND decision = 'applied'"
        ),
        3
    );
    let rx = reopened(&path);
    let o = rx.object("card-7").await.unwrap();
    assert_eq!(
        (o.version, o.state.compact()),
        (13, r#"{"v":13}"#.to_owned())
    );
    let again = rx
        .deliver_batch(&[e1, card("card-7", "e-3", 13, r#"{"v":13}"#)])
        .await;
    let applied = Some(Decision::Duplicate {
        original: Verdict::Applied,
    });
    assert_eq!(decisions(&again), [applied, applied]);
    rx.shutdown().await;
}

// A delivery decided on top of a commit that then failed gets the same
// answer when decided again (it applies either way); what tells the two
// apart is what was stored: a restarted receiver reads it back.
#[tokio::test]
async fn a_step_decided_on_top_of_a_failed_commit_is_stored_when_decided_again() {
    let path = temp_db("pipeline-restart-redecided");
    let (rx, script) = gated(&path, "card-7", 10, r#"{"v":10}"#);
    script.hold_next();
    let first = queue(&rx, card("card-7", "e-1", 11, r#"{"v":11}"#));
    let gated = commit_held(&script).await;
    script.fail_at.store(gated, Ordering::SeqCst);
    let e2 = card("card-7", "e-2", 12, r#"{"v":12}"#);
    let second = queue(&rx, e2.clone());
    decided(&rx, "e-2").await;
    script.release();
    assert!(matches!(first.await.outcome, Outcome::Retry(_)));
    assert_eq!(second.await.decision(), Some(Decision::Applied));
    rx.shutdown().await;
    drop(rx);

    let rx = reopened(&path);
    let o = rx.object("card-7").await.unwrap();
    assert_eq!(
        (o.version, o.state.compact()),
        (12, r#"{"v":12}"#.to_owned())
    );
    assert_eq!(
        rx.deliver(e2.as_bytes()).await.decision(),
        Some(Decision::Duplicate {
            original: Verdict::Applied
        })
    );
    // e-1 was never recorded: sent again, it is stale against v12.
    let e1 = card("card-7", "e-1", 11, r#"{"v":11}"#);
    assert_eq!(
        rx.deliver(e1.as_bytes()).await.decision(),
        Some(Decision::Stale)
    );
    rx.shutdown().await;
    assert_eq!(
        count(
            &path,
            "SELECT count(*) FROM receipts WHERE event_id = 'e-2' AND decision = 'applied'"
        ),
        1
    );
}
