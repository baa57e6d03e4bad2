//! The serde wire forms: a serialized receipt is a replay delivery line
//! without `step` and `phase`; decisions, object reads, audit records and
//! reconciliation reports use the same field names; an authoritative
//! snapshot deserializes from the JSON an authority returns.

use crate::common::repo;
use snapshot_receiver::{
    fixture::Fixture, format_rfc3339, replay::replay, AuthoritativeSnapshot, Clock, Decision,
    HoldReason, ManualClock, Receiver, Verdict,
};
use std::sync::Arc;

const APPLY: &str = r#"{"event_id":"e-1","object_id":"c-1","object_version":2,"occurred_at":"2099-01-01T00:00:00Z","type":"card.snapshot","state":{"b":1,"a":[1.50]}}"#;

fn json<T: serde::Serialize + ?Sized>(v: &T) -> String {
    serde_json::to_string(v).unwrap()
}

/// Every fixture's delivery lines are its receipts, serialized, with `step`
/// and `phase` in front: the replay prints through the same form.
#[tokio::test]
async fn replay_delivery_lines_are_serialized_receipts_on_every_fixture() {
    let mut checked = 0;
    for entry in std::fs::read_dir(repo("fixtures")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "json") {
            continue; // B62-15-authority.jsonl: snapshot lines, not a fixture
        }
        let fixture = Fixture::load(&path).unwrap();
        let Some(start) = fixture.default_now() else {
            continue; // its clock would be the wall clock: decisions vary by day
        };
        let report = replay(&fixture, None).await.unwrap();
        let clock = Arc::new(ManualClock::new(start));
        let mut builder = Receiver::builder()
            .profile(fixture.profile.clone().unwrap_or_default())
            .trail_capacity(usize::MAX)
            .clock(clock.clone() as Arc<dyn Clock>);
        for (id, version, state) in &fixture.initial_state {
            builder = builder.object(id, *version, state);
        }
        let rx = builder.build().unwrap();
        for (i, d) in fixture.deliveries.iter().enumerate() {
            clock.set(d.received_at.unwrap_or(start));
            let receipt = rx.deliver(&d.body).await;
            let line = json(&report.lines[i]);
            // The receipt is the line without `step` and `phase`, with
            // `ack_meaning` last (a replay line leaves the words out).
            let receipt_json = json(&receipt);
            let meaning = format!(",\"ack_meaning\":{}}}", json(&receipt.ack_meaning()));
            let without = receipt_json
                .strip_suffix(meaning.as_str())
                .unwrap_or_else(|| panic!("{receipt_json} does not end with {meaning}"));
            // A malformed delivery's line also says what is wrong with it
            // (`detail`, last), which a receipt does not carry.
            let detail = report.lines[i]
                .detail
                .as_ref()
                .map_or(String::new(), |d| format!(",\"detail\":{}", json(d)));
            let expected = format!(
                r#"{{"step":{},"phase":"delivery",{}{detail}}}"#,
                i + 1,
                &without[1..]
            );
            assert_eq!(line, expected, "{} delivery {}", path.display(), i + 1);
            assert_eq!(
                report.lines[i].detail.is_some(),
                receipt.decision() == Some(Decision::Held(HoldReason::Malformed)),
                "{} delivery {}: a detail on malformed deliveries only",
                path.display(),
                i + 1
            );
            checked += 1;
        }
        rx.shutdown().await;
    }
    assert!(checked >= 57, "only {checked} deliveries checked");
}

#[test]
fn decisions_and_verdicts_carry_the_four_decision_fields() {
    let dup = Decision::Duplicate {
        original: Verdict::Held(HoldReason::Paused),
    };
    assert_eq!(
        json(&dup),
        r#"{"decision":"duplicate","reason":null,"conflict":null,"original_decision":"held (paused)"}"#
    );
    assert_eq!(
        json(&Verdict::Held(HoldReason::MissingVersion)),
        r#"{"decision":"held","reason":"missing_version","conflict":null,"original_decision":null}"#
    );
    assert_eq!(
        json(&Decision::Conflict(
            snapshot_receiver::ConflictKind::EventVariant
        )),
        r#"{"decision":"conflict","reason":null,"conflict":"event_variant","original_decision":null}"#
    );
}

#[allow(deprecated)] // pins the history read by step number
#[tokio::test]
async fn receipts_objects_audit_records_and_effects_serialize_in_the_replay_names() {
    let at = snapshot_receiver::parse_rfc3339("2024-01-01T08:00:00Z").unwrap();
    let rx = Receiver::builder()
        .clock(Arc::new(ManualClock::new(at)))
        .object("c-1", 1, r#"{"a":0}"#)
        .build()
        .unwrap();
    let receipt = rx.deliver(APPLY.as_bytes()).await;
    assert_eq!(
        json(&receipt),
        r#"{"event_id":"e-1","object_id":"c-1","decision":"applied","reason":null,"conflict":null,"original_decision":null,"version":2,"state":{"b":1,"a":[1.50]},"paused":false,"replacement":true,"ack":"acknowledge","ack_meaning":"recorded and done"}"#
    );
    let rejected = rx.deliver(&vec![b' '; 2 << 20]).await;
    assert_eq!(
        json(&rejected),
        format!(
            r#"{{"event_id":null,"object_id":null,"decision":"reject","reason":{},"conflict":null,"original_decision":null,"version":null,"state":null,"paused":null,"replacement":false,"ack":"reject","ack_meaning":{}}}"#,
            json("body_too_large"),
            json(&format!(
                "not recorded, not acknowledged: body is {} bytes, over the limit of 1048576",
                2 << 20
            ))
        )
    );
    let object = rx.object("c-1").await.unwrap();
    assert_eq!(
        json(&object),
        r#"{"object_id":"c-1","version":2,"state":{"b":1,"a":[1.50]},"paused":false,"held":0}"#
    );
    let audit = rx.audit().await;
    assert_eq!(
        json(&audit[0]),
        format!(
            r#"{{"seq":1,"at":"2024-01-01T08:00:00Z","event_id":"e-1","object_id":"c-1","kind":"delivery","decision":"applied","reason":null,"conflict":null,"original_decision":null,"version":2,"replacement":true,"body":{}}}"#,
            json(&APPLY)
        )
    );
    let effects = rx.effects_since(0).await.unwrap();
    assert_eq!(
        json(&effects[0]),
        r#"{"seq":1,"at":"2024-01-01T08:00:00Z","object_id":"c-1","version":2,"state":{"b":1,"a":[1.50]},"cause":"e-1"}"#
    );
    // The outbox's effect: its id is this run's random origin and the step.
    let effect = rx.outbox(0, 1).await.unwrap().remove(0);
    let id = effect.id;
    assert_eq!(id.seq, 1);
    assert_eq!(
        json(&effect),
        format!(
            r#"{{"effect_id":"ef_{:016x}_1","position":1,"at":"2024-01-01T08:00:00Z","object_id":"c-1","version":2,"state":{{"b":1,"a":[1.50]}},"cause":"e-1"}}"#,
            id.origin
        )
    );
    rx.shutdown().await;
}

#[tokio::test]
async fn a_reconcile_report_is_the_authority_line_with_its_reevaluations() {
    let at = snapshot_receiver::parse_rfc3339("2024-01-01T08:00:00Z").unwrap();
    let rx = Receiver::builder()
        .clock(Arc::new(ManualClock::new(at)))
        .build()
        .unwrap();
    // Unknown object: the event is parked, then decided after the authority.
    rx.deliver(APPLY.as_bytes()).await;
    let snapshot: AuthoritativeSnapshot = serde_json::from_str(
        r#"{"object_id":"c-1","version":1,"state":{"a":0},"as_of":"2024-01-01T07:00:00Z"}"#,
    )
    .unwrap();
    let report = rx.reconcile(snapshot).await.unwrap();
    assert_eq!(
        json(&report),
        r#"{"event_id":null,"object_id":"c-1","decision":"authority","reason":null,"conflict":null,"original_decision":null,"version":1,"state":{"a":0},"paused":false,"replacement":true,"ack":null,"previous_version":null,"reevaluated":[{"event_id":"e-1","object_id":"c-1","decision":"applied","reason":null,"conflict":null,"original_decision":null,"version":2,"state":{"b":1,"a":[1.50]},"paused":false,"replacement":true,"ack":null}]}"#
    );
    rx.shutdown().await;
}

#[test]
fn an_authoritative_snapshot_deserializes_from_what_an_authority_returns() {
    let s: AuthoritativeSnapshot = serde_json::from_str(
        r#"{"object_id":"c-9","version":7,"state":{"z":1,"a":"x"},"as_of":"2024-01-01T08:00:00Z","force":true}"#,
    )
    .unwrap();
    assert_eq!(&*s.object_id, "c-9");
    assert_eq!(s.version, 7);
    assert_eq!(s.state.as_str(), r#"{"z":1,"a":"x"}"#);
    assert_eq!(format_rfc3339(s.as_of), "2024-01-01T08:00:00Z");
    assert!(s.force);
    let plain: AuthoritativeSnapshot =
        serde_json::from_str(r#"{"object_id":"c-9","version":7,"state":null}"#).unwrap();
    assert!(!plain.force);
    assert!(plain.state.is_null());

    let err = |text: &str| {
        serde_json::from_str::<AuthoritativeSnapshot>(text)
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        err(r#"{"object_id":"c-9","version":7,"state":{},"forced":true}"#),
        "unknown field `forced`, expected one of `object_id`, `version`, `state`, `as_of`, `force` at line 1 column 50"
    );
    assert_eq!(
        err(r#"{"object_id":"c-9","state":{}}"#),
        "missing field `version` at line 1 column 30"
    );
    assert_eq!(
        err(r#"{"object_id":"c-9","version":-1,"state":{}}"#),
        "invalid value: integer `-1`, expected u64 at line 1 column 31"
    );
    assert!(
        err(r#"{"object_id":"c-9","version":1,"state":{"a":1,"a":2}}"#).starts_with("state: "),
        "a duplicate key in the state is refused"
    );
    assert!(
        err(r#"{"object_id":"c-9","version":1,"state":{},"as_of":"yesterday"}"#)
            .starts_with(r#"as_of: not an RFC 3339 time: "yesterday""#)
    );
}
