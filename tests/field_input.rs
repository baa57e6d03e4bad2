//! Field cases (issue 13) about how senders write the envelope: a leading
//! byte-order mark, timestamps before 1970, the same instant rendered
//! differently, and ids sent as JSON integers. Each fixture named here is
//! replayed with its exact lines.

use crate::common::{
    body, decision_text, delivered_bodies, fingerprint, receiver, receiver_with_profile, repo, t, T,
};
use crate::store::temp_db;
use snapshot_receiver::{
    core::ReevaluationOutcome,
    fixture::Fixture,
    parse_rfc3339,
    replay::{replay_with, ReplayLine, ReplayOptions},
    AuditEntry, AuthoritativeSnapshot, Clock, ConflictKind, Decision, HoldReason, ManualClock,
    Profile, Receiver, Verdict,
};
use std::sync::Arc;

const READY: &str = r#"{"stage":"ready","label":"Map"}"#;

/// Replays a fixture and returns each delivery line as
/// `event object decision version`, e.g. `e-301 card-3 duplicate applied v2`
/// (`-` where the line has no value).
async fn replayed(path: &str, options: ReplayOptions) -> Vec<String> {
    let fixture = Fixture::load(&repo(path)).unwrap();
    let mut lines: Vec<ReplayLine> = Vec::new();
    replay_with(&fixture, options, |l| lines.push(l.clone()))
        .await
        .unwrap();
    lines
        .iter()
        .filter(|l| l.step <= fixture.deliveries.len())
        .map(|l| {
            let decision = decision_text(l);
            format!(
                "{} {} {decision} {}",
                l.event_id.as_deref().unwrap_or("-"),
                l.object_id.as_deref().unwrap_or("-"),
                l.version.map_or("-".to_owned(), |v| format!("v{v}")),
            )
        })
        .collect()
}

/// The errors of the malformed bodies in `rx`'s audit trail, in order.
async fn malformed_errors(rx: &Receiver) -> Vec<String> {
    rx.audit()
        .await
        .into_iter()
        .filter_map(|r| match r.entry {
            AuditEntry::Malformed { error, .. } => Some(error),
            _ => None,
        })
        .collect()
}

fn card_with_integer_ids() -> Profile {
    Profile {
        name: "card-integer-ids".to_owned(),
        integer_ids: true,
        ..Profile::card()
    }
}

// ---- 2. A leading byte-order mark -----------------------------------------

/// Issue 13 item 2: a sender that prefixes its bodies with U+FEFF.
#[tokio::test]
async fn one_leading_byte_order_mark_is_ignored_and_the_content_is_the_same() {
    let rx = receiver();
    let plain = body("e-301", "card-7", Some("12"), T, READY);
    let marked = format!("\u{feff}{plain}");
    assert_eq!(&marked.as_bytes()[..3], b"\xEF\xBB\xBF");
    assert_eq!(fingerprint(&rx, &marked), fingerprint(&rx, &plain));

    let r = rx.deliver(marked.as_bytes()).await;
    assert_eq!(r.decision(), Some(Decision::Applied));
    assert_eq!(
        (r.event_id.as_deref(), r.object_id.as_deref()),
        (Some("e-301"), Some("card-7"))
    );
    let r = rx.deliver(plain.as_bytes()).await;
    let original = Verdict::Applied;
    assert_eq!(r.decision(), Some(Decision::Duplicate { original }));
    // The other way round: the plain body first, the marked one a duplicate.
    let second = body("e-302", "card-7", Some("13"), T, READY);
    let r = rx.deliver(second.as_bytes()).await;
    assert_eq!(r.decision(), Some(Decision::Applied));
    let r = rx.deliver(format!("\u{feff}{second}").as_bytes()).await;
    assert_eq!(r.decision(), Some(Decision::Duplicate { original }));

    // The state is the object's text without the mark; the audit trail
    // keeps the body exactly as it came.
    let card = rx.object("card-7").await.unwrap();
    assert_eq!((card.version, card.state.as_str()), (13, READY));
    let bodies = delivered_bodies(&rx, "e-301").await;
    assert_eq!(bodies, [marked.clone(), plain]);
}

/// Issue 13 item 2 on the batch path and on bodies read back from a store.
#[tokio::test]
async fn a_marked_body_is_read_the_same_in_a_batch_and_after_a_restart() {
    let rx = receiver();
    let marked = format!("\u{feff}{}", body("e-311", "card-8", Some("4"), T, READY));
    let r = rx.deliver_batch(&[marked.as_bytes()]).await;
    assert_eq!(r[0].decision(), Some(Decision::Applied));

    // Parked for an unknown object, stored, read back after a restart and
    // decided when an authority introduces the object.
    let path = temp_db("field-input-bom");
    let location = format!("sqlite:{}", path.display());
    let clock = Arc::new(ManualClock::new(t()));
    let build = || {
        Receiver::builder()
            .clock(clock.clone() as Arc<dyn Clock>)
            .store(&location)
            .build()
            .unwrap()
    };
    let rx = build();
    let marked = format!("\u{feff}{}", body("e-312", "card-x", Some("2"), T, READY));
    let r = rx.deliver(marked.as_bytes()).await;
    assert_eq!(
        r.decision(),
        Some(Decision::Held(HoldReason::UnknownObject))
    );
    rx.shutdown().await;
    let rx = build();
    let authority = AuthoritativeSnapshot::new("card-x", 1, "{}", t()).unwrap();
    let report = rx.reconcile(authority).await.unwrap();
    let got: Vec<(&str, &ReevaluationOutcome)> = report
        .reevaluated
        .iter()
        .map(|r| (&*r.event_id, &r.outcome))
        .collect();
    let applied = ReevaluationOutcome::Decided(Verdict::Applied, true);
    assert_eq!(got, [("e-312", &applied)]);
    let card = rx.object("card-x").await.unwrap();
    assert_eq!((card.version, card.state.as_str()), (2, READY));
    // An authority's state text may carry one mark too; the state is the
    // text without it.
    let marked_state = format!("\u{feff} {READY}");
    let authority = AuthoritativeSnapshot::new("card-y", 1, &marked_state, t()).unwrap();
    rx.reconcile(authority).await.unwrap();
    let card = rx.object("card-y").await.unwrap();
    assert_eq!(
        (card.state.as_str(), card.state.compact()),
        (READY, READY.to_owned())
    );
    assert_eq!(
        card.state.to_value(),
        serde_json::json!({"stage": "ready", "label": "Map"})
    );
    // The stored body still carries its mark: a redelivery without it is
    // the same content.
    let plain = marked.trim_start_matches('\u{feff}');
    let r = rx.deliver(plain.as_bytes()).await;
    assert_eq!(
        r.decision(),
        Some(Decision::Duplicate {
            original: Verdict::Held(HoldReason::UnknownObject)
        })
    );
    rx.shutdown().await;
}

/// Issue 13 item 2, the fixture: one mark ignored, misplaced marks malformed,
/// U+FEFF inside a string kept as data.
#[tokio::test]
async fn the_bom_fixture_replays_as_expected() {
    let lines = replayed("fixtures/bom.json", ReplayOptions::default()).await;
    assert_eq!(
        lines,
        [
            "e-301 card-3 applied v2",
            "e-301 card-3 duplicate applied v2",
            "- - held malformed -",
            "- - held malformed -",
            "- - held malformed -",
            "e-305 card-3 applied v3",
        ]
    );
    // Replayed again to read the audit trail: each misplaced mark is named
    // where it is.
    let fixture = Fixture::load(&repo("fixtures/bom.json")).unwrap();
    let rx = receiver();
    for d in &fixture.deliveries[2..5] {
        rx.deliver(&d.body).await;
    }
    assert_eq!(
        malformed_errors(&rx).await,
        [
            "misplaced byte-order mark at byte 3",
            "misplaced byte-order mark at byte 1",
            "misplaced byte-order mark at byte 161",
        ]
    );
}

// ---- 3. Timestamps before 1970 or far back ---------------------------------

/// Issue 13 item 3: every shape `occurred_at` can take, decided for an event
/// that would apply (card-5 at v1, the event v2), with no identity record, a
/// 24 h window and the clock at 2024-01-01T09:00:00Z. `same as`: a rendering
/// of the same instant, which must give the same fingerprint.
#[tokio::test]
async fn occurred_at_of_every_shape_against_the_retention_window() {
    const HELD: Option<Decision> = Some(Decision::Held(HoldReason::ExpiredIdentity));
    const APPLIED: Option<Decision> = Some(Decision::Applied);
    #[rustfmt::skip]
    let cases: &[(&str, Option<&str>, Option<Decision>)] = &[
        // Before 1970 and far back: older than the window, however far.
        ("1969-12-31T23:59:59Z", Some("1970-01-01T00:59:59+01:00"), HELD),
        ("1969-07-20T20:17:40.5Z", Some("1969-07-20T15:17:40.500-05:00"), HELD),
        ("0001-01-01T00:00:00Z", Some("0000-12-31T23:00:00-01:00"), HELD),
        ("0000-01-01T00:00:00+01:00", None, HELD),
        ("1970-01-01T00:00:00Z", Some("1970-01-01t00:00:00z"), HELD),
        // The window's edge: exactly 24 h is inside, a nanosecond more is not.
        ("2023-12-31T09:00:00Z", Some("2023-12-31T04:00:00-05:00"), APPLIED),
        ("2023-12-31T08:59:59.999999999Z", Some("2023-12-31T09:59:59.999999999+01:00"), HELD),
        // Recent, in every rendering RFC 3339 allows.
        ("2024-01-01T08:00:00Z", Some("2024-01-01T08:00:00.000Z"), APPLIED),
        ("2024-01-01T08:00:00.123456789Z", Some("2024-01-01T03:00:00.123456789-05:00"), APPLIED),
        ("2024-01-01T08:00:00.1234567891Z", Some("2024-01-01T08:00:00.123456789Z"), APPLIED),
        ("2024-01-01t08:00:00z", Some("2024-01-01T08:00:00Z"), APPLIED),
        ("2024-01-01 08:00:00Z", Some("2024-01-01T08:00:00Z"), APPLIED),
        ("2024-01-01T13:30:00+05:30", Some("2024-01-01T08:00:00Z"), APPLIED),
        ("2024-01-01T08:00:00-00:00", Some("2024-01-01T08:00:00+00:00"), APPLIED),
        // A leap second is an instant (a month's last UTC second).
        ("2023-12-31T23:59:60Z", Some("2023-12-31T18:59:60-05:00"), APPLIED),
        ("2016-12-31T23:59:60.5Z", Some("2017-01-01T00:59:60.500+01:00"), HELD),
        // Far ahead is not old.
        ("9999-12-31T23:59:59Z", Some("9999-12-31T22:59:59-01:00"), APPLIED),
        // Not RFC 3339: it cannot show the event is recent, so it counts as old.
        ("2024-01-01T08:00:00", None, HELD),
        ("2024-01-01T08:00Z", None, HELD),
        ("2024-01-01T08:00:00+0500", None, HELD),
        ("2024-01-01_08:00:00Z", None, HELD),
        ("2024-01-01T23:59:60Z", None, HELD),
        ("2024-01-01T24:00:00Z", None, HELD),
        ("yesterday", None, HELD),
    ];
    let now = parse_rfc3339("2024-01-01T09:00:00Z").unwrap();
    for &(at, same_as, expected) in cases {
        let rx = Receiver::builder()
            .clock(Arc::new(ManualClock::new(now)) as Arc<dyn Clock>)
            .object("card-5", 1, r#"{"n":1}"#)
            .build()
            .unwrap();
        let b = body("e-505", "card-5", Some("2"), at, r#"{"n":2}"#);
        let r = rx.deliver(b.as_bytes()).await;
        assert_eq!(r.decision(), expected, "{at}");
        let version = if expected == APPLIED { 2 } else { 1 };
        assert_eq!(rx.object("card-5").await.unwrap().version, version, "{at}");
        if let Some(other) = same_as {
            let o = body("e-505", "card-5", Some("2"), other, r#"{"n":2}"#);
            assert_eq!(
                fingerprint(&rx, &o),
                fingerprint(&rx, &b),
                "{at} vs {other}"
            );
            let r = rx.deliver(o.as_bytes()).await;
            let original = match expected {
                APPLIED => Verdict::Applied,
                _ => Verdict::Held(HoldReason::ExpiredIdentity),
            };
            assert_eq!(
                r.decision(),
                Some(Decision::Duplicate { original }),
                "{at} vs {other}"
            );
        }
    }
    // `null` or no `occurred_at` makes no claim about age: the version check
    // alone decides (the rule cannot apply).
    for b in [
        body("e-1", "card-7", Some("12"), T, READY).replace("\"2024-01-01T08:00:00Z\"", "null"),
        body("e-2", "card-7", Some("13"), T, READY)
            .replace(",\"occurred_at\":\"2024-01-01T08:00:00Z\"", ""),
    ] {
        let rx = receiver();
        assert_eq!(rx.deliver(b.as_bytes()).await.decision(), APPLIED, "{b}");
    }
    // A number is not an RFC 3339 timestamp either.
    let rx = receiver();
    let epoch_seconds = body("e-3", "card-7", Some("12"), T, READY)
        .replace("\"2024-01-01T08:00:00Z\"", "1704096000");
    assert_eq!(rx.deliver(epoch_seconds.as_bytes()).await.decision(), HELD);
}

/// Issue 13 item 3, the fixture, replayed with `--now 2024-01-01T09:00:00Z`.
#[tokio::test]
async fn the_old_timestamps_fixture_replays_as_expected() {
    let options = ReplayOptions {
        now: parse_rfc3339("2024-01-01T09:00:00Z"),
        ..ReplayOptions::default()
    };
    let lines = replayed("fixtures/old-timestamps.json", options).await;
    assert_eq!(
        lines,
        [
            "e-505 card-5 held expired_identity v1",
            "e-506 card-5 held expired_identity v1",
            "e-507 card-5 held expired_identity v1",
            "e-508 card-5 held expired_identity v1",
            "e-509 card-5 applied v2",
        ]
    );
}

// ---- 4. The same instant, rendered differently ------------------------------

/// Issue 13 item 4: a redelivery that only re-renders `occurred_at` is a
/// duplicate; a changed instant is a variant.
#[tokio::test]
async fn a_rerendered_occurred_at_is_the_same_content() {
    let rx = receiver();
    let first = body("e-401", "card-7", Some("12"), T, READY);
    assert_eq!(
        rx.deliver(first.as_bytes()).await.decision(),
        Some(Decision::Applied)
    );
    let original = Verdict::Applied;
    for at in [
        "2024-01-01T03:00:00-05:00",
        "2024-01-01T08:00:00.000Z",
        "2024-01-01T08:00:00.000000000+00:00",
        "2024-01-01t08:00:00z",
        "2024-01-01T08:00:00\\u005A",
    ] {
        let again = body("e-401", "card-7", Some("12"), at, READY);
        let r = rx.deliver(again.as_bytes()).await;
        assert_eq!(r.decision(), Some(Decision::Duplicate { original }), "{at}");
    }
    // A leap second is not the second before it, at any fraction.
    let rx2 = receiver();
    let leap = |at| fingerprint(&rx2, &body("e-406", "card-7", Some("12"), at, READY));
    assert_eq!(
        leap("2016-12-31T23:59:60.5Z"),
        leap("2016-12-31T18:59:60.5-05:00")
    );
    assert_ne!(
        leap("2016-12-31T23:59:60.5Z"),
        leap("2016-12-31T23:59:59.5Z")
    );
    assert_ne!(
        leap("2016-12-31T23:59:60.5Z"),
        leap("2016-12-31T23:59:60.25Z")
    );
    let changed = body(
        "e-401",
        "card-7",
        Some("12"),
        "2024-01-01T08:00:00.000000001Z",
        READY,
    );
    let r = rx.deliver(changed.as_bytes()).await;
    assert_eq!(
        r.decision(),
        Some(Decision::Conflict(ConflictKind::EventVariant))
    );
    assert!(rx.object("card-7").await.unwrap().paused);
}

/// Issue 13 item 4: a value that does not parse is compared as text, and no
/// text can stand in for an instant.
#[tokio::test]
async fn an_unparsed_occurred_at_is_compared_as_text() {
    let rx = receiver();
    let held = Some(Decision::Held(HoldReason::ExpiredIdentity));
    let b = body("e-402", "card-7", Some("12"), "Jan 1 2024 08:00", READY);
    assert_eq!(rx.deliver(b.as_bytes()).await.decision(), held);
    let original = Verdict::Held(HoldReason::ExpiredIdentity);
    let r = rx.deliver(b.as_bytes()).await;
    assert_eq!(r.decision(), Some(Decision::Duplicate { original }));
    // The same text spelled with an escape is the same text...
    let escaped = body(
        "e-402",
        "card-7",
        Some("12"),
        "Jan 1 2024 08\\u003a00",
        READY,
    );
    let r = rx.deliver(escaped.as_bytes()).await;
    assert_eq!(r.decision(), Some(Decision::Duplicate { original }));
    // ... other text is a variant, even for the same time of day.
    let other = body("e-402", "card-7", Some("12"), "Jan 01 2024 08:00", READY);
    let r = rx.deliver(other.as_bytes()).await;
    assert_eq!(
        r.decision(),
        Some(Decision::Conflict(ConflictKind::EventVariant))
    );

    // An instant and a string whose bytes are exactly the instant's encoding
    // (seconds 0x3A3A3A3A3A, nanoseconds 0x30303030, little-endian, no leap
    // second): different fingerprints, because the instant is hashed apart
    // from every JSON string.
    let rx = receiver();
    let instant = body(
        "e-403",
        "card-7",
        Some("12"),
        "9894-11-17T06:54:50.808464432Z",
        READY,
    );
    let lookalike = body(
        "e-403",
        "card-7",
        Some("12"),
        ":::::\\u0000\\u0000\\u00000000\\u0000",
        READY,
    );
    assert_ne!(fingerprint(&rx, &instant), fingerprint(&rx, &lookalike));
}

/// Issue 13 item 4: only the envelope's `occurred_at` is read as an instant;
/// a time inside the state is data and compares as text.
#[tokio::test]
async fn a_time_inside_the_state_is_compared_as_text() {
    let rx = receiver();
    let a = body(
        "e-404",
        "card-7",
        Some("12"),
        T,
        r#"{"at":"2024-01-01T08:00:00Z"}"#,
    );
    assert_eq!(
        rx.deliver(a.as_bytes()).await.decision(),
        Some(Decision::Applied)
    );
    let b = body(
        "e-405",
        "card-7",
        Some("12"),
        T,
        r#"{"at":"2024-01-01T03:00:00-05:00"}"#,
    );
    let r = rx.deliver(b.as_bytes()).await;
    assert_eq!(
        r.decision(),
        Some(Decision::Conflict(ConflictKind::VersionState))
    );
}

/// Issue 13 item 4, the fixture.
#[tokio::test]
async fn the_rerendered_timestamps_fixture_replays_as_expected() {
    let lines = replayed(
        "fixtures/rerendered-timestamps.json",
        ReplayOptions::default(),
    )
    .await;
    assert_eq!(
        lines,
        [
            "e-401 card-4 applied v2",
            "e-401 card-4 duplicate applied v2",
            "e-401 card-4 duplicate applied v2",
            "e-401 card-4 duplicate applied v2",
            "e-402 card-4 held expired_identity v2",
            "e-402 card-4 duplicate held (expired_identity) v2",
            "e-402 card-4 conflict event_variant v2",
            "e-401 card-4 conflict event_variant v2",
        ]
    );
}

// ---- 7. Numeric ids -----------------------------------------------------------

/// Issue 13 item 7: the card profile takes string ids only (the default).
#[tokio::test]
async fn the_card_profile_refuses_integer_ids_by_default() {
    assert!(!Profile::card().integer_ids);
    assert!(!Profile::generic("/v").unwrap().integer_ids);
    let rx = receiver_with_profile(Profile::card(), &[("12", 1, "{}")]);
    let b = body("e-701", "12", Some("2"), T, "{}").replace("\"12\"", "12");
    let r = rx.deliver(b.as_bytes()).await;
    assert_eq!(r.decision(), Some(Decision::Held(HoldReason::Malformed)));
    assert_eq!(
        malformed_errors(&rx).await,
        ["field `object_id` must be a string"]
    );
}

/// Issue 13 item 7: with `integer_ids`, `12` and `"12"` name the same object
/// and the same event, and re-rendering an id is the same content.
#[tokio::test]
async fn integer_ids_are_their_decimal_text() {
    let rx = receiver_with_profile(card_with_integer_ids(), &[("12", 1, r#"{"n":1}"#)]);
    let as_integer = |event: &str, v: u64| {
        body(
            event,
            "12",
            Some(&v.to_string()),
            T,
            &format!("{{\"n\":{v}}}"),
        )
        .replace("\"object_id\":\"12\"", "\"object_id\":12")
    };
    let r = rx.deliver(as_integer("e-701", 2).as_bytes()).await;
    assert_eq!(r.decision(), Some(Decision::Applied));
    assert_eq!(r.object_id.as_deref(), Some("12"));
    let r = rx
        .deliver(body("e-702", "12", Some("3"), T, r#"{"n":3}"#).as_bytes())
        .await;
    assert_eq!(r.decision(), Some(Decision::Applied));
    assert_eq!(rx.object("12").await.unwrap().version, 3);
    // The first event again with a string id: the same content.
    let resent = body("e-701", "12", Some("2"), T, r#"{"n":2}"#);
    assert_eq!(
        fingerprint(&rx, &resent),
        fingerprint(&rx, &as_integer("e-701", 2))
    );
    let r = rx.deliver(resent.as_bytes()).await;
    let original = Verdict::Applied;
    assert_eq!(r.decision(), Some(Decision::Duplicate { original }));
    // An integer event id, and the largest and smallest integers.
    let b = as_integer("e-703", 4).replace("\"event_id\":\"e-703\"", "\"event_id\":703");
    let r = rx.deliver(b.as_bytes()).await;
    assert_eq!(
        (r.event_id.as_deref(), r.decision()),
        (Some("703"), Some(Decision::Applied))
    );
    let big = "123456789012345678901234567890";
    let rx = receiver_with_profile(card_with_integer_ids(), &[(big, 1, "{}"), ("0", 1, "{}")]);
    for id in [big, "0"] {
        let b = body("e-1", id, Some("2"), T, "{}").replace(&format!("\"{id}\""), id);
        let b = b.replace("\"e-1\"", &format!("\"e-{id}\""));
        let r = rx.deliver(b.as_bytes()).await;
        assert_eq!(
            (r.object_id.as_deref(), r.decision()),
            (Some(id), Some(Decision::Applied))
        );
    }
}

/// Issue 13 item 7: only digits; a sign, fraction or exponent has no single
/// text and stays malformed, with a message that says what is accepted.
#[tokio::test]
async fn integer_ids_are_digits_only() {
    let rx = receiver_with_profile(card_with_integer_ids(), &[("12", 1, "{}")]);
    for (n, literal) in ["12.0", "-12", "1.2e1", "12e0", "-0", "true"]
        .iter()
        .enumerate()
    {
        let b = body(&format!("e-{n}"), "12", Some("2"), T, "{}").replace("\"12\"", literal);
        let r = rx.deliver(b.as_bytes()).await;
        assert_eq!(
            r.decision(),
            Some(Decision::Held(HoldReason::Malformed)),
            "{literal}"
        );
    }
    let why = "`/object_id` must be a string or an integer (digits only: no sign, fraction or \
               exponent) (profile `card-integer-ids`)";
    assert_eq!(malformed_errors(&rx).await, vec![why.to_owned(); 6]);
}

/// Issue 13 item 7: the shipment profile takes integer shipment ids (its
/// providers number their shipments), the fixture.
#[tokio::test]
async fn the_numeric_id_fixtures_replay_as_expected() {
    assert!(Profile::shipment().integer_ids);
    let lines = replayed(
        "fixtures/numeric-ids-shipment.json",
        ReplayOptions::default(),
    )
    .await;
    assert_eq!(
        lines,
        [
            "acme/evt-901 acme/450789469 applied v3",
            "acme/evt-902 acme/450789469 applied v4",
            "acme/evt-901 acme/450789469 duplicate applied v4",
            "acme/evt-903 - held malformed -",
        ]
    );
    let lines = replayed("fixtures/numeric-ids.json", ReplayOptions::default()).await;
    assert_eq!(
        lines,
        [
            "e-701 12 applied v2",
            "e-702 12 applied v3",
            "e-701 12 duplicate applied v3",
            "703 12 applied v4",
            "e-704 - held malformed -",
            "e-705 - held malformed -",
            "e-706 - held malformed -",
        ]
    );
    // The same deliveries under the plain card profile.
    let options = ReplayOptions {
        profile: Some(Profile::card()),
        ..ReplayOptions::default()
    };
    let lines = replayed("fixtures/numeric-ids.json", options).await;
    assert_eq!(
        lines,
        [
            "e-701 - held malformed -",
            "e-702 12 applied v3",
            "e-701 12 stale v3",
            "- - held malformed -",
            "e-704 - held malformed -",
            "e-705 - held malformed -",
            "e-706 - held malformed -",
        ]
    );
}
