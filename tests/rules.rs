//! One test per rule and per hold reason (docs/CONTRACT.md §3, §4, §5).

use crate::common::{body, delivered_bodies, receiver, receiver_at, t, T};
use futures_util::FutureExt;
use snapshot_receiver::{
    Ack, AuditEntry, AuthoritativeSnapshot, ConflictKind, Decision, HoldReason, Limits,
    ManualClock, Outcome, Receiver, ReconcileError, RejectReason, RetryReason, Verdict,
};
use std::sync::Arc;
use std::time::Duration;

const READY: &str = r#"{"stage":"ready","label":"Map"}"#;

fn held(r: HoldReason) -> Option<Decision> {
    Some(Decision::Held(r))
}

async fn version_of(rx: &Receiver, id: &str) -> (u64, String, bool) {
    let o = rx.object(id).await.unwrap();
    (o.version, o.state.compact(), o.paused)
}

#[tokio::test]
async fn same_id_with_only_occurred_at_changed_is_a_variant_conflict() {
    let rx = receiver();
    let first = body("e-1", "card-7", Some("12"), T, READY);
    assert_eq!(
        rx.deliver(first.as_bytes()).await.decision(),
        Some(Decision::Applied)
    );
    let variant = body("e-1", "card-7", Some("12"), "2024-01-01T08:00:01Z", READY);
    let r = rx.deliver(variant.as_bytes()).await;
    assert_eq!(
        r.decision(),
        Some(Decision::Conflict(ConflictKind::EventVariant))
    );
    assert_eq!(r.ack(), Ack::Acknowledge);
    assert_eq!(
        version_of(&rx, "card-7").await,
        (12, READY.to_owned(), true)
    );
    // The first record is untouched.
    let rec = rx.context().registry().get("e-1").unwrap();
    assert_eq!(rec.decision, Verdict::Applied);
    // Both bodies stay in the audit trail.
    let bodies = delivered_bodies(&rx, "e-1").await;
    assert_eq!(bodies, [first, variant]);
}

/// The default test receiver after e-1 took card-7 to version 12 (applied).
async fn with_e1_applied() -> Receiver {
    let rx = receiver();
    rx.deliver(body("e-1", "card-7", Some("12"), T, READY).as_bytes())
        .await;
    rx
}

#[tokio::test]
async fn reencoded_redelivery_is_a_duplicate_reporting_the_original_decision() {
    let rx = with_e1_applied().await;
    // Not the same state: \u00e9 is é, not e.
    let different = body(
        "e-1",
        "card-7",
        Some("12"),
        T,
        r#"{"label":"M\u0061p","stage":"r\u00e9ady"}"#,
    );
    assert_eq!(
        rx.deliver(different.as_bytes()).await.decision(),
        Some(Decision::Conflict(ConflictKind::EventVariant))
    );
    let rx = with_e1_applied().await;
    let same = format!(
        "{{\n  \"type\" : \"card.snapshot\", \"state\": {{\"label\":\"M\\u0061p\" ,\"stage\":\"\\u0072eady\"}},\n \
         \"object_version\": 12, \"occurred_at\":\"{T}\", \"object_id\":\"card\\u002d7\", \"event_id\":\"e-1\", \"attempt\": 3\n}}"
    );
    let r = rx.deliver(same.as_bytes()).await;
    assert_eq!(
        r.decision(),
        Some(Decision::Duplicate {
            original: Verdict::Applied
        })
    );
    assert!(!r.replacement);
    assert_eq!(rx.counters().await.event_replacements, 1);
}

#[tokio::test]
async fn duplicate_of_a_held_event_reports_the_hold() {
    let rx = receiver();
    let b = body("e-1", "card-8", None, T, READY);
    assert_eq!(
        rx.deliver(b.as_bytes()).await.decision(),
        held(HoldReason::MissingVersion)
    );
    assert_eq!(
        rx.deliver(b.as_bytes()).await.decision(),
        Some(Decision::Duplicate {
            original: Verdict::Held(HoldReason::MissingVersion)
        })
    );
    // Held once, not twice.
    assert_eq!(rx.object("card-8").await.unwrap().held, 1);
}

#[tokio::test]
async fn different_id_same_version_same_state_other_time_is_equal() {
    let rx = with_e1_applied().await;
    let other = body(
        "e-9",
        "card-7",
        Some("12"),
        "2024-01-01T09:30:00Z",
        r#"{"label":"Map","stage":"ready"}"#,
    );
    let r = rx.deliver(other.as_bytes()).await;
    assert_eq!(r.decision(), Some(Decision::Equal));
    assert!(!r.replacement);
    assert_eq!(
        version_of(&rx, "card-7").await,
        (12, READY.to_owned(), false)
    );
}

#[tokio::test]
async fn higher_replaces_lower_is_stale_equal_version_other_state_conflicts() {
    let rx = receiver();
    let r = rx
        .deliver(body("e-1", "card-7", Some("11"), T, READY).as_bytes())
        .await;
    assert_eq!(
        (r.decision(), r.replacement),
        (Some(Decision::Applied), true)
    );
    // Gaps are fine: full snapshots.
    let r = rx
        .deliver(body("e-2", "card-7", Some("20"), T, r#"{"stage":"done"}"#).as_bytes())
        .await;
    assert_eq!(r.decision(), Some(Decision::Applied));
    let r = rx
        .deliver(body("e-3", "card-7", Some("15"), T, READY).as_bytes())
        .await;
    assert_eq!(r.decision(), Some(Decision::Stale));
    assert_eq!(
        version_of(&rx, "card-7").await,
        (20, r#"{"stage":"done"}"#.to_owned(), false)
    );
    let r = rx
        .deliver(body("e-4", "card-7", Some("20"), T, r#"{"stage":"other"}"#).as_bytes())
        .await;
    assert_eq!(
        r.decision(),
        Some(Decision::Conflict(ConflictKind::VersionState))
    );
    assert_eq!(
        version_of(&rx, "card-7").await,
        (20, r#"{"stage":"done"}"#.to_owned(), true)
    );
    let r = rx
        .deliver(body("e-5", "card-7", Some("21"), T, READY).as_bytes())
        .await;
    assert_eq!(r.decision(), held(HoldReason::Paused));
    assert_eq!(rx.counters().await.event_replacements, 2);
}

#[tokio::test]
async fn version_zero_is_valid() {
    let rx = Receiver::builder()
        .clock(Arc::new(ManualClock::new(t())))
        .object("c", 0, "{}")
        .build()
        .unwrap();
    let r = rx
        .deliver(body("e-1", "c", Some("0"), T, "{}").as_bytes())
        .await;
    assert_eq!(r.decision(), Some(Decision::Equal));
}

#[tokio::test]
async fn every_hold_reason() {
    let rx = receiver();
    let cases: [(String, HoldReason); 11] = [
        (body("h-1", "card-8", None, T, READY), HoldReason::MissingVersion),
        (body("h-2", "card-8", Some("null"), T, READY), HoldReason::MissingVersion),
        (body("h-3", "card-8", Some("\"5\""), T, READY), HoldReason::InvalidVersion),
        (body("h-4", "card-8", Some("5.0"), T, READY), HoldReason::InvalidVersion),
        (body("h-5", "card-8", Some("5e0"), T, READY), HoldReason::InvalidVersion),
        (body("h-6", "card-8", Some("-5"), T, READY), HoldReason::InvalidVersion),
        (body("h-7", "card-8", Some("18446744073709551616"), T, READY), HoldReason::InvalidVersion),
        (body("h-8", "card-99", Some("1"), T, READY), HoldReason::UnknownObject),
        (body("h-9", "card-8", Some("5"), T, READY).replace("card.snapshot", "card.comment"), HoldReason::UnsupportedType),
        (r#"{"event_id":"h-10","object_id":"card-8","object_version":5,"type":"card.snapshot"}"#.to_owned(), HoldReason::Malformed),
        (r#"{"event_id":"h-11","object_id":"card-8","object_version":5,"type":"card.snapshot","state":{"a":1,"a":2}}"#.to_owned(), HoldReason::Malformed),
    ];
    for (b, reason) in &cases {
        let r = rx.deliver(b.as_bytes()).await;
        assert_eq!(r.decision(), held(*reason), "{b}");
        assert_eq!(r.ack(), Ack::Acknowledge);
        assert!(!r.replacement);
    }
    // Holding changes no state and does not create the unknown object.
    assert_eq!(
        version_of(&rx, "card-8").await,
        (3, r#"{"stage":"ready","label":"Chart"}"#.to_owned(), false)
    );
    assert!(rx.object("card-99").await.is_none());
    for malformed in [
        &b"[1,2]"[..],
        b"not json",
        b"{\"object_id\":\"card-8\"}",
        b"",
        b"\xff\xfe",
    ] {
        assert_eq!(
            rx.deliver(malformed).await.decision(),
            held(HoldReason::Malformed)
        );
    }
    let unresolved = rx.unresolved().await;
    assert_eq!(unresolved.len(), cases.len() + 5);
    // Malformed bodies keep their exact bytes.
    let kept: Vec<Vec<u8>> = rx
        .audit()
        .await
        .into_iter()
        .filter_map(|r| match r.entry {
            AuditEntry::Malformed { bytes, .. } => Some(bytes.to_vec()),
            _ => None,
        })
        .collect();
    assert_eq!(kept.len(), 6, "h-11 and the five bodies above");
    assert_eq!(kept[5], b"\xff\xfe");
}

#[tokio::test]
async fn expired_identity_policy() {
    let clock = Arc::new(ManualClock::new(t()));
    let rx = receiver_at(clock.clone());
    let b = body("e-1", "card-7", Some("12"), T, READY);
    assert_eq!(
        rx.deliver(b.as_bytes()).await.decision(),
        Some(Decision::Applied)
    );
    // Within the window a purge keeps the identity: still a duplicate.
    clock.advance(Duration::from_secs(23 * 3600));
    assert_eq!(rx.purge_expired_identities().await, Ok(0));
    assert_eq!(
        rx.deliver(b.as_bytes()).await.decision(),
        Some(Decision::Duplicate {
            original: Verdict::Applied
        })
    );
    // After the window the record is gone; the version check still protects.
    clock.advance(Duration::from_secs(2 * 3600));
    assert_eq!(rx.purge_expired_identities().await, Ok(1));
    assert_eq!(
        rx.deliver(b.as_bytes()).await.decision(),
        Some(Decision::Equal)
    );
    let old_stale = body("e-2", "card-7", Some("11"), T, READY);
    assert_eq!(
        rx.deliver(old_stale.as_bytes()).await.decision(),
        Some(Decision::Stale)
    );
    // An old event that would change state is not trusted.
    let old_newer = body("e-3", "card-7", Some("13"), T, r#"{"stage":"x"}"#);
    assert_eq!(
        rx.deliver(old_newer.as_bytes()).await.decision(),
        held(HoldReason::ExpiredIdentity)
    );
    let old_conflict = body("e-4", "card-7", Some("12"), T, r#"{"stage":"y"}"#);
    assert_eq!(
        rx.deliver(old_conflict.as_bytes()).await.decision(),
        held(HoldReason::ExpiredIdentity)
    );
    assert_eq!(
        version_of(&rx, "card-7").await,
        (12, READY.to_owned(), false)
    );
    // A recent event is decided normally.
    let recent = body(
        "e-5",
        "card-7",
        Some("13"),
        "2024-01-02T08:30:00Z",
        r#"{"stage":"z"}"#,
    );
    assert_eq!(
        rx.deliver(recent.as_bytes()).await.decision(),
        Some(Decision::Applied)
    );
}

#[tokio::test]
async fn variant_naming_another_known_object_pauses_both() {
    let rx = with_e1_applied().await;
    let r = rx
        .deliver(body("e-1", "card-8", Some("12"), T, READY).as_bytes())
        .await;
    assert_eq!(
        r.decision(),
        Some(Decision::Conflict(ConflictKind::EventVariant))
    );
    assert!(rx.object("card-7").await.unwrap().paused);
    assert!(rx.object("card-8").await.unwrap().paused);
    // Neither applies anything until reconciled.
    let r = rx
        .deliver(body("e-2", "card-7", Some("13"), T, READY).as_bytes())
        .await;
    assert_eq!(r.decision(), held(HoldReason::Paused));
    let pause = rx.audit_for_object("card-7").await.into_iter().any(
        |r| matches!(r.entry, AuditEntry::Paused { ref cause_event } if &**cause_event == "e-1"),
    );
    assert!(pause, "the cross-object pause is in the audit trail");
}

// A caller that runs its step on an idle shard runs the pauses queued for
// that shard first: no read in between, the next delivery is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_raised_by_a_variant_is_seen_by_the_next_delivery_of_the_paused_object() {
    let rx = with_e1_applied().await;
    let r = rx
        .deliver(body("e-1", "card-8", Some("12"), T, READY).as_bytes())
        .await;
    assert_eq!(
        r.decision(),
        Some(Decision::Conflict(ConflictKind::EventVariant))
    );
    let r = rx
        .deliver(body("e-2", "card-7", Some("13"), T, READY).as_bytes())
        .await;
    assert_eq!(r.decision(), held(HoldReason::Paused));
    assert_eq!(rx.object("card-7").await.unwrap().version, 12);
}

#[tokio::test]
async fn authority_older_than_the_object_is_refused() {
    let rx = receiver();
    let older = AuthoritativeSnapshot::new("card-7", 9, r#"{"stage":"old"}"#, t()).unwrap();
    let err = rx.reconcile(older).await.unwrap_err();
    assert_eq!(
        err,
        ReconcileError::AuthorityOlder {
            object_id: "card-7".into(),
            offered: 9,
            current: 10
        }
    );
    assert_eq!(
        err.to_string(),
        "authority for `card-7` has version 9, older than the object's version 10; refused, the object is unchanged"
    );
    assert_eq!(
        version_of(&rx, "card-7").await,
        (10, r#"{"stage":"queued","label":"Map"}"#.to_owned(), false)
    );
    assert_eq!(rx.counters().await.authority_replacements, 0);
}

#[tokio::test]
async fn authority_for_an_unknown_object_introduces_it_and_resolves_parked_events() {
    let rx = receiver();
    let parked = [
        body("p-1", "card-9", Some("3"), T, r#"{"n":3}"#),
        body("p-2", "card-9", Some("1"), T, r#"{"n":1}"#),
        body("p-3", "card-9", None, T, r#"{"n":0}"#),
        body("p-4", "card-9", Some("2"), T, r#"{"n":2}"#),
    ];
    for b in &parked {
        assert_eq!(
            rx.deliver(b.as_bytes()).await.decision(),
            held(HoldReason::UnknownObject)
        );
    }
    let auth = AuthoritativeSnapshot::new("card-9", 2, r#"{"n":2}"#, t()).unwrap();
    let report = rx.reconcile(auth).await.unwrap();
    assert_eq!(report.previous_version, None);
    let got: Vec<(String, String)> = report
        .reevaluated
        .iter()
        .map(|r| (r.event_id.to_string(), format!("{:?}", r.outcome)))
        .collect();
    assert_eq!(
        got,
        [
            ("p-1".to_owned(), "Decided(Applied, true)".to_owned()),
            ("p-2".to_owned(), "Decided(Stale, false)".to_owned()),
            (
                "p-3".to_owned(),
                "Unresolved(Held(MissingVersion))".to_owned()
            ),
            ("p-4".to_owned(), "Decided(Stale, false)".to_owned()),
        ]
    );
    assert_eq!(
        version_of(&rx, "card-9").await,
        (3, r#"{"n":3}"#.to_owned(), false)
    );
    let c = rx.counters().await;
    assert_eq!((c.event_replacements, c.authority_replacements), (1, 1));
}

#[tokio::test]
async fn reconciliation_equal_version_is_a_replacement_and_clears_the_pause() {
    let rx = receiver();
    rx.deliver(body("e-1", "card-7", Some("10"), T, r#"{"x":1}"#).as_bytes())
        .await;
    assert!(rx.object("card-7").await.unwrap().paused);
    let auth = AuthoritativeSnapshot::new("card-7", 10, r#"{"x":1}"#, t()).unwrap();
    let report = rx.reconcile(auth).await.unwrap();
    assert_eq!(report.previous_version, Some(10));
    // The conflicting event equals the authority now.
    assert_eq!(
        format!("{:?}", report.reevaluated[0].outcome),
        "Decided(Equal, false)"
    );
    assert_eq!(
        version_of(&rx, "card-7").await,
        (10, r#"{"x":1}"#.to_owned(), false)
    );
}

#[tokio::test]
async fn limits_reject_or_retry_and_record_nothing() {
    let limits = Limits {
        max_body_bytes: 300,
        max_held_per_object: 1,
        ..Limits::default()
    };
    let rx = Receiver::builder()
        .clock(Arc::new(ManualClock::new(t())))
        .limits(limits)
        .object("card-7", 10, "{}")
        .build()
        .unwrap();
    let big = body(
        "e-1",
        "card-7",
        Some("12"),
        T,
        &format!("{{\"pad\":\"{}\"}}", "x".repeat(300)),
    );
    let r = rx.deliver(big.as_bytes()).await;
    assert_eq!(r.ack(), Ack::Reject);
    assert!(matches!(
        r.outcome,
        Outcome::Rejected(RejectReason::BodyTooLarge { limit: 300, .. })
    ));
    assert!(rx.context().registry().get("e-1").is_none());

    assert_eq!(
        rx.deliver(body("h-1", "card-7", None, T, "{}").as_bytes())
            .await
            .decision(),
        held(HoldReason::MissingVersion)
    );
    let r = rx
        .deliver(body("h-2", "card-7", None, T, "{}").as_bytes())
        .await;
    assert_eq!(
        r.outcome,
        Outcome::Retry(RetryReason::HeldQueueFull { limit: 1 })
    );
    assert_eq!(r.ack(), Ack::Retry);
    assert!(
        rx.context().registry().get("h-2").is_none(),
        "nothing recorded on retry"
    );
    assert_eq!(rx.object("card-7").await.unwrap().held, 1);
}

#[tokio::test]
async fn shutdown_drains_then_answers_retry() {
    let rx = receiver();
    let r = rx
        .deliver(body("e-1", "card-7", Some("12"), T, READY).as_bytes())
        .await;
    assert_eq!(r.decision(), Some(Decision::Applied));
    rx.shutdown().await;
    let r = rx
        .deliver(body("e-2", "card-7", Some("13"), T, READY).as_bytes())
        .await;
    assert_eq!(r.outcome, Outcome::Retry(RetryReason::ShuttingDown));
    assert_eq!(r.ack(), Ack::Retry);
}

/// In memory too, a delivery that reached its mailbox behind the shutdown
/// request (before the shard task closed the mailbox) is decided, not
/// dropped. A current-thread runtime: no shard task runs before both the
/// request and the delivery are in the mailbox.
#[tokio::test]
async fn in_memory_a_delivery_queued_behind_the_shutdown_request_is_decided() {
    let rx = receiver();
    let e1 = body("e-1", "card-7", Some("12"), T, READY);
    let ((), r) = tokio::join!(rx.shutdown(), rx.deliver(e1.as_bytes()));
    assert_eq!(r.outcome, Outcome::Decided(Decision::Applied));
}

/// More deliveries behind the shutdown request than one shard step takes
/// (256): the first batch is decided with the request, the rest by the
/// drain; none is dropped.
#[tokio::test]
async fn in_memory_300_deliveries_behind_the_shutdown_request_are_all_decided() {
    let rx = Receiver::builder()
        .shards(1)
        .mailbox_capacity(512)
        .clock(Arc::new(ManualClock::new(t())) as Arc<dyn snapshot_receiver::Clock>)
        .build()
        .unwrap();
    let mut shutdown = Box::pin(rx.shutdown());
    assert!((&mut shutdown).now_or_never().is_none());
    // All 300 in the mailbox before the shard task runs: no cooperative
    // budget (one poll may otherwise send only about 128).
    let pending: Vec<crate::commit::Pending> = tokio::task::unconstrained(async {
        (1..=300)
            .map(|v| {
                let b = body(&format!("e-{v}"), &format!("card-{v}"), Some("1"), T, READY);
                crate::commit::queue(&rx, b)
            })
            .collect()
    })
    .await;
    shutdown.await;
    let mut outcomes = std::collections::BTreeMap::new();
    for p in pending {
        *outcomes
            .entry(format!("{:?}", p.await.outcome))
            .or_insert(0) += 1;
    }
    assert_eq!(
        outcomes,
        std::collections::BTreeMap::from([("Decided(Held(UnknownObject))".to_owned(), 300)])
    );
}

#[test]
fn build_outside_a_runtime_is_a_clear_error() {
    let err = Receiver::builder().build().err().unwrap();
    assert_eq!(
        err.to_string(),
        "Receiver::build must be called inside a tokio runtime"
    );
}

#[tokio::test]
async fn invalid_initial_state_is_named() {
    let err = Receiver::builder()
        .object("c", 1, r#"{"a":1,"a":2}"#)
        .build()
        .err()
        .unwrap();
    assert!(
        err.to_string()
            .starts_with("initial state of `c` is invalid: duplicate key \"a\""),
        "{err}"
    );
}

#[tokio::test(start_paused = true)]
async fn expired_identities_are_purged_periodically() {
    let clock = Arc::new(ManualClock::new(t()));
    let rx = Receiver::builder()
        .purge_interval(Some(Duration::from_secs(60)))
        .clock(clock.clone())
        .object("card-7", 10, "{}")
        .build()
        .unwrap();
    rx.deliver(body("e-1", "card-7", Some("12"), T, READY).as_bytes())
        .await;
    assert_eq!(rx.context().registry().len(), 1);
    clock.advance(Duration::from_secs(25 * 3600));
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(rx.context().registry().len(), 0);
    rx.shutdown().await;
}

/// A receiver from `builder` on `clock` that has recorded one identity
/// (`event_id`), after which the clock jumps past its retention.
async fn one_expired_identity(
    builder: snapshot_receiver::ReceiverBuilder,
    clock: &Arc<ManualClock>,
    event_id: &str,
) -> Receiver {
    let rx = builder
        .config(snapshot_receiver::Config::default())
        .clock(clock.clone())
        .object("card-7", 10, "{}")
        .build()
        .unwrap();
    rx.deliver(body(event_id, "card-7", Some("12"), T, READY).as_bytes())
        .await;
    clock.advance(Duration::from_secs(25 * 3600));
    rx
}

/// The default purge interval is one hour, and it is the builder's own knob:
/// replacing the engine configuration afterwards keeps it.
#[tokio::test(start_paused = true)]
async fn the_periodic_purge_runs_hourly_by_default_and_survives_a_config() {
    let clock = Arc::new(ManualClock::new(t()));
    let rx = one_expired_identity(Receiver::builder(), &clock, "e-1").await;
    tokio::time::sleep(Duration::from_secs(3599)).await;
    assert_eq!(rx.context().registry().len(), 1);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(rx.context().registry().len(), 0);
    rx.shutdown().await;

    let never = Receiver::builder().purge_interval(None);
    let rx = one_expired_identity(never, &clock, "e-2").await;
    tokio::time::sleep(Duration::from_secs(2 * 3600)).await;
    assert_eq!(rx.context().registry().len(), 1);
    rx.shutdown().await;
}

#[tokio::test]
async fn a_zero_mailbox_is_refused_at_build() {
    let err = Receiver::builder()
        .mailbox_capacity(0)
        .build()
        .err()
        .unwrap();
    assert_eq!(
        err.to_string(),
        "invalid configuration: mailbox_capacity must be at least 1"
    );
}

/// Each setter changes its own setting and keeps every earlier one: the
/// store and the shard count come first, so a setter that started over
/// from a fresh builder would lose them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_builder_setting_keeps_the_ones_set_before_it() {
    let path = crate::store::temp_db("builder-settings");
    let committer = snapshot_receiver::store::CommitterConfig {
        max_batch_writes: 64,
        ..Default::default()
    };
    let rx = Receiver::builder()
        .store(&format!("sqlite:{}", path.display()))
        .shards(3)
        .identity_capacity(1000)
        .equal_versions(snapshot_receiver::EqualVersionPolicy::Ignore)
        .audit(false)
        .committer(committer)
        .trail_capacity(12)
        .build()
        .unwrap();
    let c = rx.context().config();
    assert_eq!(
        (c.shards, c.identity_capacity, c.audit, c.trail_capacity),
        (3, 1000, false, 12)
    );
    assert_eq!(
        c.equal_versions,
        snapshot_receiver::EqualVersionPolicy::Ignore
    );
    assert!(
        rx.store_stats().is_some(),
        "the store set first is the receiver's"
    );
    rx.shutdown().await;
}

#[tokio::test]
async fn malformed_bodies_share_the_parking_limit() {
    let limits = Limits {
        max_parked_per_shard: 2,
        ..Limits::default()
    };
    let rx = Receiver::builder()
        .shards(1)
        .limits(limits)
        .build()
        .unwrap();
    assert_eq!(
        rx.deliver(b"[1]").await.decision(),
        held(HoldReason::Malformed)
    );
    assert_eq!(
        rx.deliver(b"[2]").await.decision(),
        held(HoldReason::Malformed)
    );
    let r = rx.deliver(b"[3]").await;
    assert_eq!(
        r.outcome,
        Outcome::Retry(RetryReason::ParkingFull { limit: 2 })
    );
    assert_eq!(
        rx.unresolved().await.len(),
        2,
        "nothing evicted, nothing added"
    );
}

#[tokio::test]
async fn empty_identities_are_malformed() {
    let rx = receiver();
    for b in [
        body("", "card-7", Some("12"), T, READY),
        body("e-1", "", Some("12"), T, READY),
    ] {
        assert_eq!(
            rx.deliver(b.as_bytes()).await.decision(),
            held(HoldReason::Malformed),
            "{b}"
        );
    }
    let errors: Vec<String> = rx
        .audit()
        .await
        .into_iter()
        .filter_map(|r| match r.entry {
            AuditEntry::Malformed { error, .. } => Some(error),
            _ => None,
        })
        .collect();
    assert_eq!(
        errors,
        [
            "empty identity at `/event_id`",
            "empty identity at `/object_id`"
        ]
    );
}
