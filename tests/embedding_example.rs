//! The embedding example (`examples/embedding.rs`) run in-process, its
//! output checked line by line.

#[allow(dead_code)]
#[path = "../examples/embedding.rs"]
mod embedding;

#[tokio::test]
async fn the_embedding_example_prints_receipts_the_report_and_what_a_subscriber_saw() {
    let mut out = Vec::new();
    embedding::run(&mut out).await.unwrap();
    let text = String::from_utf8(out).unwrap();
    let expected = [
        r#"receipt {"event_id":"e-11","object_id":"card-7","decision":"applied","reason":null,"conflict":null,"original_decision":null,"version":11,"state":{"stage":"ready"},"paused":false,"replacement":true,"ack":"acknowledge","ack_meaning":"recorded and done"}"#,
        r#"receipt {"event_id":"e-11","object_id":"card-7","decision":"duplicate","reason":null,"conflict":null,"original_decision":"applied","version":11,"state":{"stage":"ready"},"paused":false,"replacement":false,"ack":"acknowledge","ack_meaning":"recorded and done"}"#,
        r#"receipt {"event_id":"e-9","object_id":"card-7","decision":"stale","reason":null,"conflict":null,"original_decision":null,"version":11,"state":{"stage":"ready"},"paused":false,"replacement":false,"ack":"acknowledge","ack_meaning":"recorded and done"}"#,
        r#"receipt {"event_id":"e-3","object_id":"card-8","decision":"held","reason":"unknown_object","conflict":null,"original_decision":null,"version":null,"state":null,"paused":null,"replacement":false,"ack":"acknowledge","ack_meaning":"responsibility accepted for reconciliation; state not applied"}"#,
        r#"reconcile {"event_id":null,"object_id":"card-8","decision":"authority","reason":null,"conflict":null,"original_decision":null,"version":2,"state":{"stage":"queued"},"paused":false,"replacement":true,"ack":null,"previous_version":null,"reevaluated":[{"event_id":"e-3","object_id":"card-8","decision":"applied","reason":null,"conflict":null,"original_decision":null,"version":3,"state":{"stage":"sent"},"paused":false,"replacement":true,"ack":null}]}"#,
        r#"object {"object_id":"card-8","version":3,"state":{"stage":"sent"},"paused":false,"held":0}"#,
        "subscriber: decision e-11 on card-7: applied",
        r#"subscriber: effect {"seq":1,"at":"2024-01-01T08:00:00Z","object_id":"card-7","version":11,"state":{"stage":"ready"},"cause":"e-11"}"#,
        "subscriber: decision e-11 on card-7: duplicate (original: applied)",
        "subscriber: decision e-9 on card-7: stale",
        "subscriber: decision e-3 on card-8: held (unknown_object)",
        r#"subscriber: effect {"seq":5,"at":"2024-01-01T08:00:00Z","object_id":"card-8","version":2,"state":{"stage":"queued"},"cause":"authority"}"#,
        r#"subscriber: effect {"seq":6,"at":"2024-01-01T08:00:00Z","object_id":"card-8","version":3,"state":{"stage":"sent"},"cause":"e-3"}"#,
    ];
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines, expected);
}
