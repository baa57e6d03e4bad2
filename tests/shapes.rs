//! One shape per thing: the library's serialized receipt and `serve`'s HTTP
//! receipt are the same JSON (fields, order, values) for the same delivery;
//! a `Notification` serializes as its record with a `kind`.

use crate::serve::Server;
use snapshot_receiver::{fixture::Fixture, Notification, Receiver};

/// The reference fixture's card-7 (v10) and the e-901 event that applies v11.
const EVENT: &str = r#"{"event_id":"e-901","object_id":"card-7","object_version":11,"type":"card.snapshot","state":{"stage":"ready","label":"Map"}}"#;

/// A library receiver seeded with the reference fixture's objects.
fn seeded() -> Receiver {
    let fixture = Fixture::load(&crate::common::repo("fixtures/B62-15-events.json")).unwrap();
    let mut builder = Receiver::builder();
    for (id, version, state) in &fixture.initial_state {
        builder = builder.object(id, *version, state);
    }
    builder.build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_library_and_http_receipts_are_the_same_json() {
    let fixture = crate::common::repo("fixtures/B62-15-events.json");
    let fixture = fixture.display().to_string();
    let server = tokio::task::spawn_blocking(move || {
        Server::start(&["--store", "memory", "--initial", &fixture])
    })
    .await
    .unwrap();
    let rx = seeded();
    for step in ["applied", "duplicate"] {
        let library = serde_json::to_string(&rx.deliver(EVENT.as_bytes()).await).unwrap();
        let http = server.post(&[], EVENT);
        assert_eq!(http.status, 200, "{step}");
        assert_eq!(http.body, library, "{step}");
    }
    assert_eq!(
        serde_json::to_string(&rx.deliver(EVENT.as_bytes()).await).unwrap(),
        r#"{"event_id":"e-901","object_id":"card-7","decision":"duplicate","reason":null,"conflict":null,"original_decision":"applied","version":11,"state":{"stage":"ready","label":"Map"},"paused":false,"replacement":false,"ack":"acknowledge","ack_meaning":"recorded and done"}"#
    );
    rx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_serializes_as_its_record_with_a_kind() {
    let rx = seeded();
    let mut notices = rx.subscribe();
    rx.deliver(EVENT.as_bytes()).await;
    let mut seen = Vec::new();
    for _ in 0..2 {
        let notice: Notification = notices.recv().await.unwrap();
        seen.push(serde_json::to_value(&notice).unwrap());
    }
    let effect = seen
        .iter()
        .find(|n| n["kind"] == "effect")
        .expect("an effect");
    let decision = seen
        .iter()
        .find(|n| n["kind"] == "decision")
        .expect("a decision");
    assert_eq!(
        decision,
        &serde_json::json!({
            "kind": "decision", "event_id": "e-901", "object_id": "card-7",
            "decision": "applied", "reason": null, "conflict": null,
            "original_decision": null, "version": 11,
            "state": {"stage": "ready", "label": "Map"}, "paused": false,
            "replacement": true, "ack": "acknowledge", "ack_meaning": "recorded and done",
        })
    );
    assert_eq!(
        (&effect["object_id"], &effect["version"], &effect["cause"]),
        (
            &serde_json::json!("card-7"),
            &serde_json::json!(11),
            &serde_json::json!("e-901")
        )
    );
    // `kind` comes first, then the record's own fields.
    let text =
        serde_json::to_string(&Notification::Decision(rx.deliver(EVENT.as_bytes()).await)).unwrap();
    assert!(
        text.starts_with(r#"{"kind":"decision","event_id":"e-901","#),
        "{text}"
    );
    rx.shutdown().await;
}
