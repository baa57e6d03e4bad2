//! Every limit at its boundary (issue 7): exactly at the limit is decided,
//! one over is refused with the exact reason, and a refusal records nothing.

use crate::common::{body, json_lines, t, T};
use snapshot_receiver::{
    Ack, AuthoritativeSnapshot, Decision, HoldReason, Limits, ManualClock, Outcome, Receipt,
    Receiver, RejectReason, RetryReason, Verdict,
};
use std::sync::Arc;

const READY: &str = r#"{"stage":"ready","label":"Map"}"#;

/// Everything a receiver has recorded, as far as its API shows: identities,
/// audit records, unresolved inputs, and every object with its held count.
#[derive(Debug, PartialEq, Eq)]
pub struct Recorded {
    pub identities: usize,
    pub audit: usize,
    pub unresolved: usize,
    /// (object id, version, compact state, paused, held)
    pub objects: Vec<(String, u64, String, bool, usize)>,
}

pub async fn recorded(rx: &Receiver) -> Recorded {
    Recorded {
        identities: rx.context().registry().len(),
        audit: rx.audit().await.len(),
        unresolved: rx.unresolved().await.len(),
        objects: rx
            .objects()
            .await
            .into_iter()
            .map(|o| {
                let id = o.object_id.to_string();
                (id, o.version, o.state.compact(), o.paused, o.held)
            })
            .collect(),
    }
}

/// Delivers `bytes`, expects it refused with `outcome`, and checks that the
/// receiver recorded nothing: same identities, audit, unresolved inputs and
/// objects as before.
pub async fn refused(rx: &Receiver, bytes: &[u8], outcome: Outcome) -> Receipt {
    let before = recorded(rx).await;
    let r = rx.deliver(bytes).await;
    assert_eq!(r.outcome, outcome);
    let ack = match outcome {
        Outcome::Rejected(_) => Ack::Reject,
        Outcome::Retry(_) => Ack::Retry,
        Outcome::Decided(_) => unreachable!("not a refusal"),
    };
    assert_eq!(r.ack(), ack);
    assert!(!r.replacement);
    assert_eq!(recorded(rx).await, before, "a refusal records nothing");
    r
}

fn receiver_with(limits: Limits, shards: usize) -> Receiver {
    Receiver::builder()
        .clock(Arc::new(ManualClock::new(t())))
        .limits(limits)
        .shards(shards)
        .object("card-7", 10, r#"{"stage":"queued","label":"Map"}"#)
        .object("card-007", 1, "{}")
        .build()
        .unwrap()
}

fn decided(r: &Receipt) -> Decision {
    assert_eq!(r.ack(), Ack::Acknowledge, "{:?}", r.outcome);
    r.decision().expect("a recorded decision")
}

#[test]
fn the_documented_defaults() {
    let d = Limits::default();
    assert_eq!(d.max_body_bytes, 1_048_576);
    assert_eq!(d.max_depth, 64);
    assert_eq!(d.max_id_bytes, 256);
    assert_eq!(d.max_held_per_object, 10_000);
    assert_eq!(d.max_parked_per_object, 1_000);
    assert_eq!(d.max_parked_per_shard, 100_000);
}

#[tokio::test]
async fn body_size_at_the_limit_is_decided_one_byte_over_is_rejected() {
    let b = body("e-1", "card-7", Some("12"), T, READY);
    let limit = b.len();
    let rx = receiver_with(
        Limits {
            max_body_bytes: limit,
            ..Limits::default()
        },
        16,
    );
    // The same content with one trailing space: one byte over.
    let over = format!("{b} ");
    refused(
        &rx,
        over.as_bytes(),
        Outcome::Rejected(RejectReason::BodyTooLarge {
            size: limit + 1,
            limit,
        }),
    )
    .await;
    assert!(rx.context().registry().get("e-1").is_none());
    // The sender kept its copy; the body at the limit is decided.
    assert_eq!(decided(&rx.deliver(b.as_bytes()).await), Decision::Applied);
}

/// A state of nesting depth `levels` (the state object itself is level 1):
/// the whole body is one level deeper.
fn nested_state(levels: usize) -> String {
    format!(
        "{{\"a\":{}{}}}",
        "[".repeat(levels - 1),
        "]".repeat(levels - 1)
    )
}

#[tokio::test]
async fn depth_at_the_limit_is_decided_one_level_deeper_is_rejected() {
    let rx = receiver_with(
        Limits {
            max_depth: 5,
            ..Limits::default()
        },
        16,
    );
    let over = body("e-1", "card-7", Some("12"), T, &nested_state(5));
    refused(
        &rx,
        over.as_bytes(),
        Outcome::Rejected(RejectReason::TooDeep { limit: 5 }),
    )
    .await;
    let at = body("e-1", "card-7", Some("12"), T, &nested_state(4));
    assert_eq!(decided(&rx.deliver(at.as_bytes()).await), Decision::Applied);
}

#[tokio::test]
async fn depth_limits_above_1024_act_as_1024() {
    // Keeps the recursive parser's stack bounded whatever is configured.
    let rx = receiver_with(
        Limits {
            max_depth: 1_000_000,
            ..Limits::default()
        },
        16,
    );
    let over = body("e-1", "card-7", Some("12"), T, &nested_state(1024));
    refused(
        &rx,
        over.as_bytes(),
        Outcome::Rejected(RejectReason::TooDeep { limit: 1024 }),
    )
    .await;
    let at = body("e-1", "card-7", Some("12"), T, &nested_state(1023));
    assert_eq!(decided(&rx.deliver(at.as_bytes()).await), Decision::Applied);
}

#[tokio::test]
async fn id_length_at_the_limit_is_decided_one_byte_over_is_rejected() {
    let rx = receiver_with(
        Limits {
            max_id_bytes: 8,
            ..Limits::default()
        },
        16,
    );
    let over_event = body("e-3456789", "card-7", Some("12"), T, READY);
    refused(
        &rx,
        over_event.as_bytes(),
        Outcome::Rejected(RejectReason::IdTooLong {
            field: "event_id",
            len: 9,
            limit: 8,
        }),
    )
    .await;
    let over_object = body("e-1", "card-0007", Some("2"), T, READY);
    refused(
        &rx,
        over_object.as_bytes(),
        Outcome::Rejected(RejectReason::IdTooLong {
            field: "object_id",
            len: 9,
            limit: 8,
        }),
    )
    .await;
    let at = body("e-345678", "card-007", Some("2"), T, READY);
    assert_eq!(decided(&rx.deliver(at.as_bytes()).await), Decision::Applied);

    // Lengths are bytes of the decoded id: `\u00e9` (é) counts 2, not 6.
    let escaped = body(r"e-\u00e9\u00e9\u00e9", "card-7", Some("12"), T, READY);
    assert_eq!(
        decided(&rx.deliver(escaped.as_bytes()).await),
        Decision::Applied
    );
    assert!(rx.context().registry().get("e-ééé").is_some());
    let over_multibyte = body("e-éééx", "card-7", Some("13"), T, READY);
    refused(
        &rx,
        over_multibyte.as_bytes(),
        Outcome::Rejected(RejectReason::IdTooLong {
            field: "event_id",
            len: 9,
            limit: 8,
        }),
    )
    .await;
}

#[tokio::test]
async fn held_queue_at_the_limit_then_retry_until_reconciled() {
    let rx = receiver_with(
        Limits {
            max_held_per_object: 2,
            ..Limits::default()
        },
        16,
    );
    let missing = |id: &str| body(id, "card-7", None, T, READY);
    for id in ["h-1", "h-2"] {
        let r = rx.deliver(missing(id).as_bytes()).await;
        assert_eq!(decided(&r), Decision::Held(HoldReason::MissingVersion));
    }
    assert_eq!(rx.object("card-7").await.unwrap().held, 2);
    let full = Outcome::Retry(RetryReason::HeldQueueFull { limit: 2 });
    refused(&rx, missing("h-3").as_bytes(), full.clone()).await;
    assert!(rx.context().registry().get("h-3").is_none());

    // A redelivery of something already held is still a duplicate.
    let r = rx.deliver(missing("h-1").as_bytes()).await;
    assert_eq!(
        decided(&r),
        Decision::Duplicate {
            original: Verdict::Held(HoldReason::MissingVersion)
        }
    );
    // A variant would be held too: retry, and the first record stays.
    let variant = body("h-1", "card-7", None, T, r#"{"stage":"other"}"#);
    refused(&rx, variant.as_bytes(), full).await;
    // A full queue does not stop events that are not held.
    let r = rx
        .deliver(body("e-1", "card-7", Some("12"), T, READY).as_bytes())
        .await;
    assert_eq!(decided(&r), Decision::Applied);

    // Reconciliation empties the queue; the sender's redelivery is decided.
    let authority = AuthoritativeSnapshot::new("card-7", 12, READY, t()).unwrap();
    rx.reconcile(authority).await.unwrap();
    assert_eq!(rx.object("card-7").await.unwrap().held, 0);
    let r = rx.deliver(missing("h-3").as_bytes()).await;
    assert_eq!(decided(&r), Decision::Held(HoldReason::MissingVersion));
}

#[tokio::test]
async fn parking_per_object_at_the_limit_then_retry() {
    let rx = receiver_with(
        Limits {
            max_parked_per_object: 2,
            ..Limits::default()
        },
        16,
    );
    let unknown = |id: &str, object: &str| body(id, object, Some("1"), T, READY);
    for id in ["p-1", "p-2"] {
        let r = rx.deliver(unknown(id, "card-9").as_bytes()).await;
        assert_eq!(decided(&r), Decision::Held(HoldReason::UnknownObject));
    }
    refused(
        &rx,
        unknown("p-3", "card-9").as_bytes(),
        Outcome::Retry(RetryReason::ParkingFull { limit: 2 }),
    )
    .await;
    // Another unknown object has its own allowance.
    let r = rx.deliver(unknown("p-4", "card-10").as_bytes()).await;
    assert_eq!(decided(&r), Decision::Held(HoldReason::UnknownObject));
}

#[tokio::test]
async fn parking_per_shard_at_the_limit_then_retry_until_introduced() {
    let rx = receiver_with(
        Limits {
            max_parked_per_shard: 3,
            ..Limits::default()
        },
        1,
    );
    let unknown = |id: &str, object: &str| body(id, object, Some("1"), T, READY);
    for (id, object) in [("p-1", "card-9"), ("p-2", "card-10"), ("p-3", "card-11")] {
        let r = rx.deliver(unknown(id, object).as_bytes()).await;
        assert_eq!(decided(&r), Decision::Held(HoldReason::UnknownObject));
    }
    let p4 = unknown("p-4", "card-12");
    refused(
        &rx,
        p4.as_bytes(),
        Outcome::Retry(RetryReason::ParkingFull { limit: 3 }),
    )
    .await;
    // Introducing card-9 un-parks its event; the redelivery now parks.
    let authority = AuthoritativeSnapshot::new("card-9", 1, READY, t()).unwrap();
    rx.reconcile(authority).await.unwrap();
    let r = rx.deliver(p4.as_bytes()).await;
    assert_eq!(decided(&r), Decision::Held(HoldReason::UnknownObject));
}

fn cli(args: &[&str]) -> std::process::Output {
    crate::common::cli().args(args).output().unwrap()
}

#[test]
fn replay_takes_the_limits_as_flags() {
    let fixture = "fixtures/B62-15-events.json";
    // No room to park: e-207 (card-9 is unknown) is answered `retry` and
    // nothing about it is recorded, so it is not an unresolved input.
    let o = cli(&[
        "replay",
        fixture,
        "--format",
        "json",
        "--max-parked-per-object",
        "0",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines: Vec<serde_json::Value> = json_lines(o.stdout);
    assert_eq!(
        lines.len(),
        18,
        "the docs/CONTRACT.md §7 lines, no counters line"
    );
    let e207 = &lines[9];
    assert_eq!(e207["event_id"], "e-207");
    assert_eq!(e207["decision"], "retry");
    assert_eq!(e207["ack"], "retry");
    assert_eq!(e207["reason"], "parking_full");
    let unresolved: Vec<&str> = lines[17]["unresolved"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["event_id"].as_str().unwrap())
        .collect();
    assert_eq!(unresolved, ["e-204", "e-202", "e-208"]);

    // Text mode shows it in the counters.
    let o = cli(&["replay", fixture, "--max-parked-per-object", "0"]);
    let out = String::from_utf8(o.stdout).unwrap();
    let counters = out.split("== counters (this run) ==\n").nth(1).unwrap();
    assert!(counters
        .lines()
        .any(|l| l.split_whitespace().eq(["retry.parking_full", "1"])));
    assert!(counters
        .lines()
        .any(|l| l.split_whitespace().eq(["held.unknown_object", "0"])));

    // The defaults are in the help; nonsense is a usage error (exit code 2).
    let help = String::from_utf8(cli(&["replay", "--help"]).stdout).unwrap();
    assert!(help.contains("[default: 1048576]"), "{help}");
    for bad in [["--max-depth", "0"], ["--max-body-bytes", "lots"]] {
        let o = cli(&["replay", fixture, bad[0], bad[1]]);
        assert_eq!(o.status.code(), Some(2), "{bad:?}");
        assert!(String::from_utf8_lossy(&o.stderr).contains(bad[0]));
    }
}

// Regression: an initial state nested deeper than 1024 levels overflowed the
// stack when max_depth was configured above 1024 (the clamp covered bodies only).
#[tokio::test]
async fn initial_state_depth_is_clamped_too() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let err = Receiver::builder()
        .limits(Limits {
            max_depth: usize::MAX,
            ..Limits::default()
        })
        .object("c", 1, &deep)
        .build()
        .err()
        .expect("refused");
    assert_eq!(
        err.to_string(),
        "initial state of `c` is invalid: nesting deeper than max_depth 1024 at byte 1024"
    );
}

/// What a thread-local tracing subscriber at `level` printed while `f` ran
/// on a current-thread runtime (so every event is on this thread).
fn logged_at(level: tracing_subscriber::filter::LevelFilter, f: impl AsyncFnOnce()) -> String {
    use tracing_subscriber::util::SubscriberInitExt as _;
    #[derive(Clone, Default)]
    struct Buffer(Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let _guard = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish()
        .set_default();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f());
    let text = buffer.0.lock().unwrap().clone();
    String::from_utf8(text).unwrap()
}

#[test]
fn a_reject_is_an_answer_logged_at_info_not_a_warning() {
    // One body over the id limit through `deliver`, one through `deliver_batch`.
    let long = body(&"e".repeat(300), "card-7", Some("12"), T, READY);
    let deliver_both = async || {
        let rx = receiver_with(Limits::default(), 2);
        assert_eq!(rx.deliver(long.as_bytes()).await.ack(), Ack::Reject);
        let batch = rx.deliver_batch(&[long.as_bytes()]).await;
        assert_eq!(batch[0].ack(), Ack::Reject);
        rx.shutdown().await;
    };
    assert_eq!(
        logged_at(tracing_subscriber::filter::LevelFilter::WARN, deliver_both),
        ""
    );
    let info = logged_at(tracing_subscriber::filter::LevelFilter::INFO, deliver_both);
    let rejected: Vec<&str> = info
        .lines()
        .filter(|l| l.contains("delivery rejected"))
        .collect();
    assert_eq!(rejected.len(), 2, "{info}");
    assert!(rejected.iter().all(|l| l.contains(" INFO ")), "{info}");
    assert!(rejected[1].contains("index=0"), "{info}");
}
