//! The reference fixture of docs/CONTRACT.md §6, line by line.

use snapshot_receiver::{
    fixture::Fixture,
    replay::{replay, Phase, ReplayLine},
    Ack,
};

fn lines() -> Vec<ReplayLine> {
    let fixture = Fixture::load(&crate::common::repo("fixtures/B62-15-events.json")).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(replay(&fixture, None)).unwrap().lines
}

/// (event, object, decision, reason, conflict, original, version, paused, replacement, state)
type Row = (
    Option<&'static str>,
    &'static str,
    &'static str,
    Option<&'static str>,
    Option<&'static str>,
    Option<&'static str>,
    Option<u64>,
    Option<bool>,
    bool,
    Option<&'static str>,
);

const MAP_READY: &str = r#"{"stage":"ready","label":"Map"}"#;
const CHART_REVIEW: &str = r#"{"stage":"review","label":"Chart"}"#;
const MAP_V2: &str = r#"{"stage":"archived","label":"Map v2"}"#;
const CHART_READY: &str = r#"{"stage":"ready","label":"Chart"}"#;

const DELIVERIES: [Row; 10] = [
    (
        Some("e-201"),
        "card-7",
        "applied",
        None,
        None,
        None,
        Some(12),
        Some(false),
        true,
        Some(MAP_READY),
    ),
    (
        Some("e-201"),
        "card-7",
        "duplicate",
        None,
        None,
        Some("applied"),
        Some(12),
        Some(false),
        false,
        Some(MAP_READY),
    ),
    (
        Some("e-202"),
        "card-7",
        "stale",
        None,
        None,
        None,
        Some(12),
        Some(false),
        false,
        Some(MAP_READY),
    ),
    (
        Some("e-206"),
        "card-8",
        "applied",
        None,
        None,
        None,
        Some(4),
        Some(false),
        true,
        Some(CHART_REVIEW),
    ),
    (
        Some("e-204"),
        "card-8",
        "held",
        Some("missing_version"),
        None,
        None,
        Some(4),
        Some(false),
        false,
        Some(CHART_REVIEW),
    ),
    (
        Some("e-202"),
        "card-7",
        "conflict",
        None,
        Some("event_variant"),
        None,
        Some(12),
        Some(true),
        false,
        Some(MAP_READY),
    ),
    (
        Some("e-203"),
        "card-7",
        "held",
        Some("paused"),
        None,
        None,
        Some(12),
        Some(true),
        false,
        Some(MAP_READY),
    ),
    (
        Some("e-208"),
        "card-8",
        "held",
        Some("unsupported_type"),
        None,
        None,
        Some(4),
        Some(false),
        false,
        Some(CHART_REVIEW),
    ),
    (
        Some("e-205"),
        "card-8",
        "conflict",
        None,
        Some("version_state"),
        None,
        Some(4),
        Some(true),
        false,
        Some(CHART_REVIEW),
    ),
    (
        Some("e-207"),
        "card-9",
        "held",
        Some("unknown_object"),
        None,
        None,
        None,
        None,
        false,
        None,
    ),
];

const RECONCILE: [Row; 7] = [
    (
        None,
        "card-7",
        "authority",
        None,
        None,
        None,
        Some(14),
        Some(false),
        true,
        Some(MAP_V2),
    ),
    (
        Some("e-202"),
        "card-7",
        "unresolved",
        Some("event_variant"),
        None,
        None,
        Some(14),
        Some(false),
        false,
        Some(MAP_V2),
    ),
    (
        Some("e-203"),
        "card-7",
        "equal",
        None,
        None,
        None,
        Some(14),
        Some(false),
        false,
        Some(MAP_V2),
    ),
    (
        None,
        "card-8",
        "authority",
        None,
        None,
        None,
        Some(5),
        Some(false),
        true,
        Some(CHART_READY),
    ),
    (
        Some("e-204"),
        "card-8",
        "unresolved",
        Some("missing_version"),
        None,
        None,
        Some(5),
        Some(false),
        false,
        Some(CHART_READY),
    ),
    (
        Some("e-208"),
        "card-8",
        "unresolved",
        Some("unsupported_type"),
        None,
        None,
        Some(5),
        Some(false),
        false,
        Some(CHART_READY),
    ),
    (
        Some("e-205"),
        "card-8",
        "stale",
        None,
        None,
        None,
        Some(5),
        Some(false),
        false,
        Some(CHART_READY),
    ),
];

fn check(line: &ReplayLine, row: &Row) {
    let (event, object, decision, reason, conflict, original, version, paused, replacement, state) =
        *row;
    let at = format!("line {}", line.step);
    assert_eq!(line.event_id.as_deref(), event, "{at}");
    assert_eq!(line.object_id.as_deref(), Some(object), "{at}");
    assert_eq!(line.decision, Some(decision), "{at}");
    assert_eq!(line.reason.as_deref(), reason, "{at}");
    assert_eq!(line.conflict, conflict, "{at}");
    assert_eq!(line.original_decision.as_deref(), original, "{at}");
    assert_eq!(line.version, version, "{at}");
    assert_eq!(line.paused, paused, "{at}");
    assert_eq!(line.replacement, Some(replacement), "{at}");
    assert_eq!(
        line.state.as_ref().map(|s| s.compact()),
        state.map(str::to_owned),
        "{at}"
    );
}

#[test]
fn every_delivery_reconciliation_step_and_the_final_state() {
    let lines = lines();
    assert_eq!(lines.len(), 10 + 7 + 1);
    for (i, row) in DELIVERIES.iter().enumerate() {
        assert_eq!(lines[i].phase, Phase::Delivery);
        assert_eq!(lines[i].step, i + 1);
        // Every recorded decision is acknowledged, holds included.
        assert_eq!(lines[i].ack, Some(Ack::Acknowledge));
        check(&lines[i], row);
    }
    let meanings: Vec<&str> = lines[..10]
        .iter()
        .map(|l| l.ack_meaning.as_deref().unwrap())
        .collect();
    let done = "recorded and done";
    let held = "responsibility accepted for reconciliation; state not applied";
    assert_eq!(
        meanings,
        [done, done, done, done, held, held, held, held, held, held]
    );
    for (i, row) in RECONCILE.iter().enumerate() {
        let line = &lines[10 + i];
        assert_eq!(line.phase, Phase::Reconcile);
        assert_eq!(line.ack, None);
        check(line, row);
    }
    let last = &lines[17];
    assert_eq!(last.phase, Phase::Final);
    let cards = last.cards.as_ref().unwrap();
    let cards: Vec<(&str, u64, String, bool)> = cards
        .iter()
        .map(|(id, c)| (&**id, c.version, c.state.compact(), c.paused))
        .collect();
    assert_eq!(
        cards,
        [
            ("card-7", 14, MAP_V2.to_owned(), false),
            ("card-8", 5, CHART_READY.to_owned(), false)
        ]
    );
    let r = last.replacements.unwrap();
    assert_eq!((r.event, r.authority), (2, 2));
    let unresolved: Vec<(&str, &str, &str, &str, Option<u64>)> = last
        .unresolved
        .as_ref()
        .unwrap()
        .iter()
        .map(|u| {
            (
                u.event_id.as_deref().unwrap(),
                u.object_id.as_deref().unwrap(),
                u.reason,
                u.status,
                u.superseded_by,
            )
        })
        .collect();
    assert_eq!(
        unresolved,
        [
            ("e-204", "card-8", "missing_version", "superseded", Some(5)),
            ("e-202", "card-7", "event_variant", "superseded", Some(14)),
            ("e-208", "card-8", "unsupported_type", "superseded", Some(5)),
            ("e-207", "card-9", "unknown_object", "held", None),
        ]
    );
}

#[test]
fn row_two_is_a_raw_reencoding_of_row_one() {
    let text = std::fs::read_to_string(crate::common::repo("fixtures/B62-15-events.json")).unwrap();
    let fixture = Fixture::parse(&text, "fixture").unwrap();
    let (one, two) = (&fixture.deliveries[0].body, &fixture.deliveries[1].body);
    assert_ne!(one, two, "row 2 must differ byte for byte");
    let a: serde_json::Value = serde_json::from_slice(one).unwrap();
    let b: serde_json::Value = serde_json::from_slice(two).unwrap();
    assert_eq!(a, b, "row 2 must carry the same content");
    assert!(text.contains("\"raw\""));
}
