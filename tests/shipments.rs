//! Tombstones, profiles, the shipment rehearsal, effects, history and the
//! authority source.

use crate::common::{body, decision_text, receiver_with_profile, t, T};
use snapshot_receiver::{
    authority::{AuthorityError, AuthoritySource, FetchOptions, FixtureAuthority},
    fixture::Fixture,
    replay::replay,
    AuthoritativeSnapshot, Clock, Config, ConflictKind, Decision, EqualVersionPolicy, HoldReason,
    ManualClock, Profile, Receiver, Verdict,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn shipment(event: &str, tenant: &str, revision: Option<u64>, status: &str) -> String {
    let rev = revision.map_or(String::new(), |r| format!(",\"revision\":{r}"));
    format!(
        r#"{{"event_id":"{event}","tenant_id":"{tenant}","type":"shipment.updated","occurred_at":"{T}","shipment":{{"id":"SHP-1"{rev},"status":"{status}"}}}}"#
    )
}

#[test]
fn the_shipment_rehearsal_fixture_replays_as_expected() {
    let fixture = Fixture::load(&crate::common::repo("fixtures/shipments-rehearsal.json")).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let lines = rt.block_on(replay(&fixture, None)).unwrap().lines;
    let got: Vec<(String, String)> = lines
        .iter()
        .filter(|l| l.event_id.is_some())
        .map(|l| (l.event_id.as_deref().unwrap().to_owned(), decision_text(l)))
        .collect();
    let expected = [
        ("acme/evt-801", "applied"),
        ("acme/evt-797", "stale"),
        ("acme/evt-801", "duplicate applied"),
        ("acme/evt-802", "applied"),
        ("acme/evt-803", "applied"),
        ("acme/evt-790", "held missing_version"),
        ("acme/evt-805", "held invalid_version"),
        // The same event id in another tenant is another event.
        ("globex/evt-801", "applied"),
        ("acme/evt-790", "unresolved missing_version"),
        ("acme/evt-805", "unresolved invalid_version"),
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(got, expected);
    let last = lines.last().unwrap();
    let cards: Vec<(String, u64)> = last
        .cards
        .as_ref()
        .unwrap()
        .iter()
        .map(|(k, c)| (k.to_string(), c.version))
        .collect();
    assert_eq!(
        cards,
        [
            ("acme/SHP-1".to_owned(), 11),
            ("globex/SHP-1".to_owned(), 3)
        ]
    );
    let r = last.replacements.unwrap();
    assert_eq!((r.event, r.authority), (4, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shipment_rehearsal_effects_fire_once_per_replacement() {
    let rx = receiver_with_profile(
        Profile::shipment(),
        &[("acme/SHP-1", 5, r#"{"id":"SHP-1","revision":5}"#)],
    );
    let d = |e: &str, r: Option<u64>, s: &str| shipment(e, "acme", r, s);
    assert_eq!(
        rx.deliver(d("e-8", Some(8), "in_transit").as_bytes())
            .await
            .decision(),
        Some(Decision::Applied)
    );
    assert_eq!(
        rx.deliver(d("e-7", Some(7), "picked_up").as_bytes())
            .await
            .decision(),
        Some(Decision::Stale)
    );
    assert_eq!(rx.object("acme/SHP-1").await.unwrap().version, 8);
    // Replaying the revision-8 event: no second effect.
    assert_eq!(
        rx.deliver(d("e-8", Some(8), "in_transit").as_bytes())
            .await
            .decision(),
        Some(Decision::Duplicate {
            original: Verdict::Applied
        })
    );
    assert_eq!(rx.outbox(0, 10).await.unwrap().len(), 1);
    // Revisions 9 and 10 at once.
    let send = |b: String| {
        let rx = rx.clone();
        tokio::spawn(async move { rx.deliver(b.as_bytes()).await })
    };
    let (t9, t10) = (
        send(d("e-9", Some(9), "out_for_delivery")),
        send(d("e-10", Some(10), "delivered")),
    );
    let (r9, r10) = (t9.await.unwrap(), t10.await.unwrap());
    assert_eq!(r10.decision(), Some(Decision::Applied));
    assert!(matches!(
        r9.decision(),
        Some(Decision::Applied | Decision::Stale)
    ));
    assert_eq!(rx.object("acme/SHP-1").await.unwrap().version, 10);
    let effects = rx.outbox(0, 10).await.unwrap();
    let replaced = 2 + usize::from(r9.decision() == Some(Decision::Applied));
    assert_eq!(effects.len(), replaced, "one effect per replacement");
    let causes: Vec<String> = effects
        .iter()
        .map(|e| e.cause_event.as_deref().unwrap_or("authority").to_owned())
        .collect();
    let mut unique = causes.clone();
    unique.dedup();
    assert_eq!(unique, causes, "never two effects for one event");
    // A relay that remembers its cursor sees nothing new.
    let cursor = effects.last().unwrap().position;
    assert!(rx.outbox(cursor, 10).await.unwrap().is_empty());
    // An older payload without a revision is held, then resolved by the authority source.
    let old = d("e-old", None, "picked_up");
    assert_eq!(
        rx.deliver(old.as_bytes()).await.decision(),
        Some(Decision::Held(HoldReason::MissingVersion))
    );
    assert_eq!(
        rx.needing_authority().await,
        [Arc::<str>::from("acme/SHP-1")]
    );
    let authority = FixtureAuthority::new([AuthoritativeSnapshot::new(
        "acme/SHP-1",
        10,
        r#"{"id":"SHP-1","revision":10,"status":"delivered"}"#,
        t(),
    )
    .unwrap()]);
    let summary = rx
        .reconcile_from(Arc::new(authority), FetchOptions::default())
        .await;
    assert_eq!(summary.reconciled.len(), 1);
    assert_eq!(
        format!("{:?}", summary.reconciled[0].1.reevaluated[0].outcome),
        "Unresolved(Held(MissingVersion))"
    );
    assert!(rx.needing_authority().await.is_empty());
    // The authority equals the object (revision 10, delivered): no
    // replacement, so no history entry and no effect (docs/CONTRACT.md §4).
    assert!(!summary.reconciled[0].1.replacement);
    assert_eq!(rx.history("acme/SHP-1").await.len(), replaced);
}

#[tokio::test]
async fn both_revision_fields_must_agree() {
    let rx = receiver_with_profile(Profile::shipment(), &[("acme/SHP-1", 5, "{}")]);
    let both = r#"{"event_id":"e","tenant_id":"acme","type":"shipment.updated","shipment_revision":9,"shipment":{"id":"SHP-1","revision":9}}"#;
    assert_eq!(
        rx.deliver(both.as_bytes()).await.decision(),
        Some(Decision::Applied)
    );
    let differ = r#"{"event_id":"f","tenant_id":"acme","type":"shipment.updated","shipment_revision":11,"shipment":{"id":"SHP-1","revision":10}}"#;
    assert_eq!(
        rx.deliver(differ.as_bytes()).await.decision(),
        Some(Decision::Held(HoldReason::InvalidVersion))
    );
}

#[tokio::test]
async fn tenants_never_touch_each_other_even_when_ids_collide() {
    let rx = receiver_with_profile(
        Profile::shipment(),
        &[("acme/SHP-1", 1, "{}"), ("globex/SHP-1", 1, "{}")],
    );
    assert_eq!(
        rx.deliver(shipment("e-1", "acme", Some(2), "a").as_bytes())
            .await
            .decision(),
        Some(Decision::Applied)
    );
    // Same event id and shipment id, other tenant: a different event, a different object.
    assert_eq!(
        rx.deliver(shipment("e-1", "globex", Some(2), "b").as_bytes())
            .await
            .decision(),
        Some(Decision::Applied)
    );
    // A variant in acme pauses acme only.
    assert_eq!(
        rx.deliver(shipment("e-1", "acme", Some(2), "changed").as_bytes())
            .await
            .decision(),
        Some(Decision::Conflict(ConflictKind::EventVariant))
    );
    assert!(rx.object("acme/SHP-1").await.unwrap().paused);
    assert!(!rx.object("globex/SHP-1").await.unwrap().paused);
    // An authority for acme resolves acme only.
    let snap = AuthoritativeSnapshot::new("acme/SHP-1", 3, "{}", t()).unwrap();
    rx.reconcile(snap).await.unwrap();
    assert_eq!(rx.object("globex/SHP-1").await.unwrap().version, 2);
    // A tenant id with a slash cannot forge another tenant's identity.
    let forged = r#"{"event_id":"SHP-1","tenant_id":"acme/e-1","type":"shipment.updated","shipment":{"id":"x","revision":1}}"#;
    let r = rx.deliver(forged.as_bytes()).await;
    assert_eq!(r.event_id.as_deref(), Some("acme%2Fe-1/SHP-1"));
}

#[tokio::test]
async fn a_profile_that_does_not_match_names_the_missing_pointer() {
    let rx = receiver_with_profile(
        Profile::generic("/data/object/version").unwrap(),
        &[("o-1", 1, "{}")],
    );
    let r = rx
        .deliver(br#"{"id":"evt_1","type":"x.updated","data":{"obj":{"id":"o-1"}}}"#)
        .await;
    assert_eq!(r.decision(), Some(Decision::Held(HoldReason::Malformed)));
    let trail = rx.audit().await;
    let error = match &trail[0].entry {
        snapshot_receiver::AuditEntry::Malformed { error, .. } => error.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(error, "missing `/data/object/id` (profile `generic`)");
    let ok = br#"{"id":"evt_2","type":"x.updated","data":{"object":{"id":"o-1","version":2,"name":"n"}}}"#;
    assert_eq!(rx.deliver(ok).await.decision(), Some(Decision::Applied));
    assert_eq!(
        rx.object("o-1").await.unwrap().state.compact(),
        r#"{"id":"o-1","version":2,"name":"n"}"#
    );
}

#[tokio::test]
async fn deletes_are_tombstones_and_late_updates_never_resurrect() {
    let rx = receiver_with_profile(Profile::card(), &[("card-7", 1, r#"{"n":1}"#)]);
    let delete = format!(
        r#"{{"event_id":"d-1","object_id":"card-7","object_version":3,"occurred_at":"{T}","type":"card.deleted"}}"#
    );
    let r = rx.deliver(delete.as_bytes()).await;
    assert_eq!(
        (r.decision(), r.replacement),
        (Some(Decision::Applied), true)
    );
    let o = rx.object("card-7").await.unwrap();
    assert!(o.deleted(), "deleted, not missing");
    assert_eq!(o.version, 3);
    // The late update after the delete.
    let late = body("u-2", "card-7", Some("2"), T, r#"{"n":2}"#);
    assert_eq!(
        rx.deliver(late.as_bytes()).await.decision(),
        Some(Decision::Stale)
    );
    // An equal version with a state is a conflict, never a resurrection.
    let equal = body("u-3", "card-7", Some("3"), T, r#"{"n":3}"#);
    assert_eq!(
        rx.deliver(equal.as_bytes()).await.decision(),
        Some(Decision::Conflict(ConflictKind::VersionState))
    );
    assert!(rx.object("card-7").await.unwrap().state.is_null());
    // A snapshot with state null deletes too; a higher version recreates.
    let rx = receiver_with_profile(Profile::card(), &[("card-8", 1, r#"{"n":1}"#)]);
    rx.deliver(body("d-2", "card-8", Some("2"), T, "null").as_bytes())
        .await;
    assert!(rx.object("card-8").await.unwrap().state.is_null());
    let again = body("u-4", "card-8", Some("4"), T, r#"{"n":4}"#);
    assert_eq!(
        rx.deliver(again.as_bytes()).await.decision(),
        Some(Decision::Applied)
    );
    assert_eq!(
        rx.object("card-8").await.unwrap().state.compact(),
        r#"{"n":4}"#
    );
    let history: Vec<u64> = rx
        .history("card-8")
        .await
        .iter()
        .map(|h| h.version)
        .collect();
    assert_eq!(history, [2, 4]);
}

#[tokio::test]
async fn equal_version_policy_ignore_follows_the_reducer() {
    let rx = Receiver::builder()
        .config(Config {
            equal_versions: EqualVersionPolicy::Ignore,
            ..Config::default()
        })
        .clock(Arc::new(ManualClock::new(t())) as Arc<dyn Clock>)
        .object("card-7", 5, r#"{"n":5}"#)
        .build()
        .unwrap();
    let r = rx
        .deliver(body("e-1", "card-7", Some("5"), T, r#"{"n":6}"#).as_bytes())
        .await;
    assert_eq!(r.decision(), Some(Decision::Stale));
    let o = rx.object("card-7").await.unwrap();
    assert_eq!(
        (o.paused, o.state.compact()),
        (false, r#"{"n":5}"#.to_owned())
    );
}

/// Fails the first `failures` fetches of every object, and counts how many
/// fetches run at once.
struct Flaky {
    failures: usize,
    calls: AtomicUsize,
    running: AtomicUsize,
    most: AtomicUsize,
}

impl AuthoritySource for Flaky {
    async fn fetch(
        &self,
        object_id: &str,
    ) -> Result<Option<AuthoritativeSnapshot>, AuthorityError> {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::task::yield_now().await;
        self.running.fetch_sub(1, Ordering::SeqCst);
        if self.calls.fetch_add(1, Ordering::SeqCst) < self.failures {
            return Err(AuthorityError::unavailable("unavailable"));
        }
        Ok(Some(
            AuthoritativeSnapshot::new(object_id, 100, r#"{"n":100}"#, t()).unwrap(),
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_authority_source_is_retried_with_bounded_concurrency() {
    let objects: Vec<String> = (0..10).map(|i| format!("c-{i}")).collect();
    let mut b = Receiver::builder().clock(Arc::new(ManualClock::new(t())) as Arc<dyn Clock>);
    for o in &objects {
        b = b.object(o, 1, r#"{"n":1}"#);
    }
    let rx = b.build().unwrap();
    for o in &objects {
        // A version conflict pauses each object.
        rx.deliver(body(&format!("x-{o}"), o, Some("1"), T, r#"{"n":2}"#).as_bytes())
            .await;
    }
    assert_eq!(rx.needing_authority().await.len(), 10);
    let source = Arc::new(Flaky {
        failures: 3,
        calls: AtomicUsize::new(0),
        running: AtomicUsize::new(0),
        most: AtomicUsize::new(0),
    });
    let options = FetchOptions {
        concurrency: 2,
        attempts: 3,
        backoff: Duration::from_millis(1),
    };
    let summary = rx.reconcile_from(source.clone(), options).await;
    assert_eq!(summary.reconciled.len(), 10);
    assert!(summary.unavailable.is_empty());
    assert_eq!(
        source.calls.load(Ordering::SeqCst),
        13,
        "10 successes after 3 failures"
    );
    assert!(source.most.load(Ordering::SeqCst) <= 2);
    for o in rx.objects().await {
        assert_eq!((o.version, o.paused), (100, false));
    }
    // A source that never answers leaves the objects as they are, named.
    let rx2 = Receiver::builder().object("p", 1, "{}").build().unwrap();
    rx2.deliver(
        body(
            "x",
            "p",
            Some("1"),
            "2099-01-01T00:00:00Z",
            r#"{"other":1}"#,
        )
        .as_bytes(),
    )
    .await;
    let never = Arc::new(Flaky {
        failures: usize::MAX,
        calls: AtomicUsize::new(0),
        running: AtomicUsize::new(0),
        most: AtomicUsize::new(0),
    });
    let summary = rx2.reconcile_from(never, options).await;
    assert_eq!(summary.unavailable.len(), 1);
    assert_eq!(
        summary.unavailable[0].1.to_string(),
        "unavailable: unavailable"
    );
    assert!(rx2.object("p").await.unwrap().paused);
}
