//! The axum embedding example (`examples/http_receiver.rs`) driven over
//! loopback: duplicated and reordered requests, retry and reject mappings.

#[allow(dead_code)]
#[path = "../examples/http_receiver.rs"]
mod http_receiver;

use crate::common::receiver_at;
use snapshot_receiver::{fixture::Fixture, Clock, Limits, ManualClock, Receiver};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Serves the example's router on 127.0.0.1:0; returns the address.
async fn serve(receiver: Receiver) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, http_receiver::router(receiver))
            .await
            .unwrap();
    });
    addr
}

/// One HTTP/1.1 request on its own connection: status, headers (lowercase
/// names), body.
async fn post(addr: std::net::SocketAddr, body: &[u8]) -> (u16, Vec<(String, String)>, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /deliveries HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_owned()))
        .collect();
    (status, headers, body.to_owned())
}

fn fixture() -> Fixture {
    Fixture::load(&crate::common::repo("fixtures/B62-15-events.json")).unwrap()
}

/// The reference fixture's clock (its latest authority `as_of`), so that
/// 2024 events are within the retention window.
fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(fixture().default_now().unwrap()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicated_and_reordered_requests_get_200_and_the_state_of_a_direct_run() {
    let fixture = fixture();
    let served = receiver_at(clock());
    let direct = receiver_at(clock());
    let addr = serve(served.clone()).await;
    // Reordered, with duplicates: (fixture row - 1).
    let order = [3, 0, 2, 0, 1, 5, 4, 6, 8, 7, 9, 3, 5, 0];
    for i in order {
        let body = &fixture.deliveries[i].body;
        let (status, _, text) = post(addr, body).await;
        let expected = direct.deliver(body).await;
        assert_eq!(status, 200, "row {}: {text}", i + 1);
        let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            answer["decision"],
            expected.decision().unwrap().as_str(),
            "row {}",
            i + 1
        );
    }
    let (a, b) = (served.objects().await, direct.objects().await);
    assert_eq!(a.len(), 2);
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(
            (&x.object_id, x.version, x.state.compact(), x.paused),
            (&y.object_id, y.version, y.state.compact(), y.paused)
        );
    }
    // card-7: e-201 applied v12, then the e-202 variant paused it.
    assert_eq!((a[0].version, a[0].paused), (12, true));
    // card-8: e-206 applied v4, then the version conflict e-205 paused it.
    assert_eq!((a[1].version, a[1].paused), (4, true));
    assert_eq!(served.counters().await, direct.counters().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_is_503_with_retry_after_and_rejects_are_413_or_400() {
    let receiver = Receiver::builder()
        .clock(clock() as Arc<dyn Clock>)
        .object("card-8", 3, r#"{"stage":"ready","label":"Chart"}"#)
        .limits(Limits {
            max_body_bytes: 2048,
            max_depth: 8,
            max_id_bytes: 32,
            max_held_per_object: 1,
            ..Limits::default()
        })
        .build()
        .unwrap();
    let addr = serve(receiver.clone()).await;
    let held = |id: &str| {
        format!(
            r#"{{"event_id":"{id}","object_id":"card-8","occurred_at":"2024-01-01T08:00:08Z","type":"card.snapshot","state":{{"stage":"blocked"}}}}"#
        )
    };
    // The first hold fills card-8's held queue (limit 1)...
    let (status, _, text) = post(addr, held("e-h1").as_bytes()).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("\"held\""), "{text}");
    // ... so the next one cannot be recorded: 503, come back later.
    let (status, headers, text) = post(addr, held("e-h2").as_bytes()).await;
    assert_eq!(status, 503, "{text}");
    assert!(
        headers.contains(&("retry-after".to_owned(), "1".to_owned())),
        "{headers:?}"
    );
    assert!(receiver.context().registry().get("e-h2").is_none());
    // A redelivery of the recorded one is still a 200 duplicate.
    let (status, _, text) = post(addr, held("e-h1").as_bytes()).await;
    assert_eq!(status, 200);
    assert!(text.contains("\"duplicate\""), "{text}");

    // Over the size limit: 413, not recorded.
    let big = format!(
        r#"{{"event_id":"e-big","object_id":"card-8","object_version":9,"occurred_at":"2024-01-01T08:00:08Z","type":"card.snapshot","state":{{"pad":"{}"}}}}"#,
        "x".repeat(3000)
    );
    let (status, _, text) = post(addr, big.as_bytes()).await;
    assert_eq!(status, 413, "{text}");
    // Far over it: axum refuses before buffering, also 413.
    let (status, _, _) = post(addr, &vec![b' '; 100_000]).await;
    assert_eq!(status, 413);
    // Too deep, or an identifier too long: 400.
    let deep = format!(
        r#"{{"event_id":"e-deep","object_id":"card-8","object_version":9,"occurred_at":"2024-01-01T08:00:08Z","type":"card.snapshot","state":{}1{}}}"#,
        "[".repeat(20),
        "]".repeat(20)
    );
    let (status, _, text) = post(addr, deep.as_bytes()).await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("too_deep"), "{text}");
    let long = held(&"e".repeat(40));
    let (status, _, text) = post(addr, long.as_bytes()).await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("id_too_long"), "{text}");
    for id in ["e-big", "e-deep", "e-h2"] {
        assert!(receiver.context().registry().get(id).is_none(), "{id}");
    }
    let card = receiver.object("card-8").await.unwrap();
    assert_eq!((card.version, card.held), (3, 1));
}
