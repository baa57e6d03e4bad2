//! Helpers shared by the test modules.

pub mod stream_gen;

use snapshot_receiver::{parse_rfc3339, Clock, ManualClock, Receiver};
use std::sync::Arc;
use std::time::SystemTime;

/// T of the reference fixture.
pub const T: &str = "2024-01-01T08:00:00Z";

pub fn t() -> SystemTime {
    parse_rfc3339(T).unwrap()
}

/// A card.snapshot body; `version` is the literal text of `object_version`
/// (`None` leaves the field out).
pub fn body(
    event_id: &str,
    object_id: &str,
    version: Option<&str>,
    occurred_at: &str,
    state: &str,
) -> String {
    let version = version.map_or(String::new(), |v| format!("\"object_version\":{v},"));
    format!(
        r#"{{"event_id":"{event_id}","object_id":"{object_id}",{version}"occurred_at":"{occurred_at}","type":"card.snapshot","state":{state}}}"#
    )
}

/// A receiver with card-7 v10 and card-8 v3 (the fixture's initial state) on
/// a manual clock standing at T.
pub fn receiver_at(clock: Arc<ManualClock>) -> Receiver {
    Receiver::builder()
        .clock(clock as Arc<dyn Clock>)
        .object("card-7", 10, r#"{"stage":"queued","label":"Map"}"#)
        .object("card-8", 3, r#"{"stage":"ready","label":"Chart"}"#)
        .build()
        .unwrap()
}

pub fn receiver() -> Receiver {
    receiver_at(Arc::new(ManualClock::new(t())))
}
