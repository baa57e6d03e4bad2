//! A seeded generator of large delivery streams with duplicates, reordering,
//! variants and holds (shared by the JetStream tests and
//! `examples/jetstream_bench.rs`).
//!
//! Every event identity belongs to one object, so a stream's outcome depends
//! only on each object's own arrival order: that is what the JetStream
//! partitions preserve, so a single in-memory replay in stream order is the
//! reference for any number of consuming processes.

/// A generated stream.
pub struct Generated {
    /// Objects `obj-0` .. `obj-{objects-1}`, all known at version 0.
    pub objects: u64,
    /// Bodies in arrival (publish) order.
    pub bodies: Vec<String>,
}

/// Versions per object.
const VERSIONS: u64 = 20;

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

fn body(event: &str, object: &str, version: Option<u64>, at: &str, state: &str) -> String {
    let version = version.map_or(String::new(), |v| format!("\"object_version\":{v},"));
    format!(
        r#"{{"event_id":"{event}","object_id":"{object}",{version}"occurred_at":"{at}","type":"card.snapshot","state":{state}}}"#
    )
}

/// The same event re-encoded: other key order and whitespace (a semantic
/// duplicate with other bytes, which the broker's window does not catch).
fn reencoded(event: &str, object: &str, version: u64, at: &str, o: u64) -> String {
    format!(
        "{{ \"state\": {{ \"o\": {o}, \"v\": {version} }},\n  \"type\": \"card.snapshot\", \"occurred_at\": \"{at}\",\n  \"object_version\": {version}, \"object_id\": \"{object}\", \"event_id\": \"{event}\" }}"
    )
}

/// About `deliveries` deliveries over `deliveries / 30` objects of 20
/// versions each: every event once, a third of them again byte for byte, a
/// fifth again re-encoded; one object in 40 gets a changed variant of one
/// event (conflict, pause, later events held), one in 40 a second event
/// with an equal version and another state, one in 40 an event without a
/// version; a few events for unknown objects, three malformed bodies and
/// one body over the identifier limit (rejected).
/// Shuffled with `seed`. `at` is every event's `occurred_at`.
pub fn generate(deliveries: usize, seed: u64, at: &str) -> Generated {
    let objects = (deliveries as u64 / 30).max(1);
    let mut out = Vec::with_capacity(deliveries + deliveries / 10);
    for o in 0..objects {
        let object = format!("obj-{o}");
        for v in 1..=VERSIONS {
            let id = format!("e-{o}-{v}");
            let b = body(
                &id,
                &object,
                Some(v),
                at,
                &format!("{{\"v\":{v},\"o\":{o}}}"),
            );
            let h = mix(seed ^ (o << 8) ^ v);
            if h.is_multiple_of(3) {
                out.push(b.clone());
            }
            if h.is_multiple_of(5) {
                out.push(reencoded(&id, &object, v, at, o));
            }
            out.push(b);
        }
        let half = VERSIONS / 2;
        match o % 40 {
            7 => out.push(body(
                &format!("e-{o}-{half}"),
                &object,
                Some(half),
                at,
                &format!("{{\"v\":{half},\"o\":{o},\"variant\":true}}"),
            )),
            13 => out.push(body(
                &format!("e-{o}-same-version"),
                &object,
                Some(half),
                at,
                &format!("{{\"v\":{half},\"o\":{o},\"other\":true}}"),
            )),
            21 => out.push(body(
                &format!("e-{o}-no-version"),
                &object,
                None,
                at,
                "{\"v\":0}",
            )),
            _ => {}
        }
    }
    for k in 0..(objects / 100).max(1) {
        out.push(body(
            &format!("e-ghost-{k}"),
            &format!("ghost-{k}"),
            Some(1),
            at,
            "{\"v\":1}",
        ));
    }
    // An event_id over the default 256-byte limit: rejected, never recorded.
    out.push(body(&"e".repeat(300), "obj-0", Some(1), at, "{\"v\":1}"));
    out.push("not json {".to_owned());
    out.push("[1,2,3]".to_owned());
    out.push(r#"{"event_id":"e-dup-key","event_id":"e-dup-key-2","object_id":"obj-0"}"#.to_owned());
    let mut x = seed | 1;
    for i in (1..out.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.swap(i, (x % (i as u64 + 1)) as usize);
    }
    Generated {
        objects,
        bodies: out,
    }
}

/// The fixture file text (docs/CONTRACT.md §6 format) of a generated stream: every
/// object at version 0 with state `{"v":0}`, every body as `raw`.
pub fn fixture_json(g: &Generated) -> String {
    let initial: serde_json::Map<String, serde_json::Value> = (0..g.objects)
        .map(|o| {
            (
                format!("obj-{o}"),
                serde_json::json!({"version": 0, "state": {"v": 0}}),
            )
        })
        .collect();
    let deliveries: Vec<serde_json::Value> = g
        .bodies
        .iter()
        .map(|b| serde_json::json!({"raw": b}))
        .collect();
    serde_json::json!({"initial_state": initial, "deliveries": deliveries}).to_string()
}
