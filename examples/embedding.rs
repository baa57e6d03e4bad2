//! Embedding the receiver in a tokio service: build it with one builder
//! setter per option, deliver a few bodies, print each receipt as JSON
//! (serde_json, the replay report's field names), reconcile an unknown
//! object from an authority's JSON, and print what a subscriber saw:
//! every decision and effect, each published after its step was recorded.
//!
//! Run it with `cargo run --example embedding`; `tests/embedding_example.rs`
//! checks its output line by line.

use snapshot_receiver::{
    parse_rfc3339, AuthoritativeSnapshot, Limits, ManualClock, Notification, Profile, Receiver,
};
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

/// What the example delivers, in this order: a newer version, its
/// redelivery, an older version, and an event for an object nobody knows
/// yet (held until an authority introduces it).
const BODIES: [&str; 4] = [
    r#"{"event_id":"e-11","object_id":"card-7","object_version":11,"occurred_at":"2024-01-01T07:59:00Z","type":"card.snapshot","state":{"stage":"ready"}}"#,
    r#"{"event_id":"e-11","object_id":"card-7","object_version":11,"occurred_at":"2024-01-01T07:59:00Z","type":"card.snapshot","state":{"stage":"ready"}}"#,
    r#"{"event_id":"e-9","object_id":"card-7","object_version":9,"occurred_at":"2024-01-01T07:58:00Z","type":"card.snapshot","state":{"stage":"draft"}}"#,
    r#"{"event_id":"e-3","object_id":"card-8","object_version":3,"occurred_at":"2024-01-01T07:57:00Z","type":"card.snapshot","state":{"stage":"sent"}}"#,
];

/// What the authority returns for `card-8`.
const AUTHORITY: &str = r#"{"object_id":"card-8","version":2,"state":{"stage":"queued"},"as_of":"2024-01-01T07:59:30Z"}"#;

/// Runs the example, writing its report to `out`.
///
/// # Errors
/// Building the receiver, reading the authority's JSON, reconciling, or
/// writing to `out`.
pub async fn run(out: &mut impl Write) -> Result<(), Box<dyn std::error::Error>> {
    // A fixed clock so the output is the same on every run; a service
    // leaves the default (the system clock).
    let now = parse_rfc3339("2024-01-01T08:00:00Z").ok_or("not an RFC 3339 time")?;
    let receiver = Receiver::builder()
        .clock(Arc::new(ManualClock::new(now)))
        .shards(4)
        .profile(Profile::card())
        .retention(Duration::from_secs(24 * 3600))
        .purge_interval(Some(Duration::from_secs(600)))
        .limits(Limits::default())
        .audit(true)
        .trail_capacity(1_000)
        .subscriber_capacity(64)
        .object("card-7", 10, r#"{"stage":"queued"}"#)
        .build()?;
    let mut notifications = receiver.subscribe();

    for body in BODIES {
        let receipt = receiver.deliver(body.as_bytes()).await;
        writeln!(out, "receipt {}", serde_json::to_string(&receipt)?)?;
    }
    let snapshot: AuthoritativeSnapshot = serde_json::from_str(AUTHORITY)?;
    let report = receiver.reconcile(snapshot).await?;
    writeln!(out, "reconcile {}", serde_json::to_string(&report)?)?;
    let card = receiver.object("card-8").await.ok_or("card-8 is known")?;
    writeln!(out, "object {}", serde_json::to_string(&card)?)?;
    receiver.shutdown().await;

    // Everything is committed by now: read what the subscriber was sent.
    while let Ok(notification) = notifications.try_recv() {
        match notification {
            Notification::Decision(receipt) => writeln!(
                out,
                "subscriber: decision {} on {}: {}",
                receipt.event_id.as_deref().unwrap_or("-"),
                receipt.object_id.as_deref().unwrap_or("-"),
                receipt
                    .decision()
                    .map_or_else(String::new, |d| d.to_string()),
            )?,
            Notification::Effect(effect) => writeln!(
                out,
                "subscriber: effect {}",
                serde_json::to_string(&effect)?
            )?,
            other => writeln!(out, "subscriber: {other:?}")?,
        }
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    run(&mut std::io::stdout().lock()).await
}
