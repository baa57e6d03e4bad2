//! Receiver::subscribe: decisions and effects, published only after the
//! commit; a lagging subscriber gets broadcast's `Lagged`.

use crate::store::temp_db;
use snapshot_receiver::store::{FaultyStore, SqliteOptions, SqliteStore};
use snapshot_receiver::{
    AuthoritativeSnapshot, Decision, ManualClock, Notification, Outcome, Receiver,
};
use std::sync::Arc;
use tokio::sync::broadcast::error::TryRecvError;

/// Event `event` raising c-1 to `version`, state `{"v":version}`.
pub(crate) fn body(event: &str, version: u64) -> String {
    format!(
        r#"{{"event_id":"{event}","object_id":"c-1","object_version":{version},"occurred_at":"2099-01-01T00:00:00Z","type":"card.snapshot","state":{{"v":{version}}}}}"#
    )
}

/// A notification in a few words: `decision e-1 applied`, `effect 2 e-1`.
pub(crate) fn seen(n: &Notification) -> String {
    match n {
        Notification::Decision(r) => format!(
            "decision {} {}",
            r.event_id.as_deref().unwrap_or("-"),
            r.decision().map_or("none".to_owned(), |d| d.to_string())
        ),
        Notification::Effect(e) => format!("effect {} {}", e.version, e.cause.wire()),
        other => format!("{other:?}"),
    }
}

pub(crate) fn drain(sub: &mut tokio::sync::broadcast::Receiver<Notification>) -> Vec<String> {
    let mut all = Vec::new();
    loop {
        match sub.try_recv() {
            Ok(n) => all.push(seen(&n)),
            Err(TryRecvError::Empty) => return all,
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test]
async fn decisions_then_their_effects_in_step_order() {
    let rx = Receiver::builder()
        .clock(Arc::new(ManualClock::new(crate::common::t())))
        .object("c-1", 1, "{}")
        .build()
        .unwrap();
    let mut sub = rx.subscribe();
    rx.deliver(body("e-2", 2).as_bytes()).await;
    rx.deliver(body("e-2", 2).as_bytes()).await; // a redelivery: no effect
    rx.deliver(body("e-1", 1).as_bytes()).await; // stale
    let big = vec![b' '; 2 << 20];
    assert!(matches!(
        rx.deliver(&big).await.outcome,
        Outcome::Rejected(_)
    ));
    let snapshot: AuthoritativeSnapshot =
        serde_json::from_str(r#"{"object_id":"c-1","version":5,"state":{"v":5}}"#).unwrap();
    rx.reconcile(snapshot).await.unwrap();
    assert_eq!(
        drain(&mut sub),
        [
            "decision e-2 applied",
            "effect 2 e-2",
            "decision e-2 duplicate (original: applied)",
            "decision e-1 stale",
            "effect 5 authority",
        ]
    );
    rx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_published_for_a_commit_that_failed() {
    let path = temp_db("subscribe-faulty");
    let p = path.clone();
    // Commit 1 seeds the object, commit 2 (the first delivery) fails.
    let rx = Receiver::builder()
        .shards(1)
        .clock(Arc::new(ManualClock::new(crate::common::t())))
        .object("c-1", 1, "{}")
        .store_with(move || {
            SqliteStore::open(p.to_str().unwrap(), SqliteOptions::default())
                .map(|s| FaultyStore::new(s, |n| n == 2))
        })
        .build()
        .unwrap();
    let mut sub = rx.subscribe();
    let first = rx.deliver(body("e-2", 2).as_bytes()).await;
    assert!(matches!(first.outcome, Outcome::Retry(_)), "{first:?}");
    assert_eq!(drain(&mut sub), Vec::<String>::new());
    let again = rx.deliver(body("e-2", 2).as_bytes()).await;
    assert_eq!(again.decision(), Some(Decision::Applied));
    assert_eq!(drain(&mut sub), ["decision e-2 applied", "effect 2 e-2"]);
    rx.shutdown().await;
}

#[tokio::test]
async fn a_subscriber_that_falls_behind_gets_lagged_then_the_newest() {
    let rx = Receiver::builder()
        .subscriber_capacity(2)
        .clock(Arc::new(ManualClock::new(crate::common::t())))
        .object("c-1", 0, "{}")
        .build()
        .unwrap();
    let mut sub = rx.subscribe();
    for v in 1..=5 {
        rx.deliver(body(&format!("e-{v}"), v).as_bytes()).await;
    }
    // Ten notifications, room for two: the eight oldest are lost. Every
    // delivery was answered, so what was published is already there:
    // `try_recv` fails the test on a missing notification instead of
    // waiting forever for it.
    assert_eq!(sub.try_recv().unwrap_err(), TryRecvError::Lagged(8));
    assert_eq!(drain(&mut sub), ["decision e-5 applied", "effect 5 e-5"]);
    rx.shutdown().await;
}
