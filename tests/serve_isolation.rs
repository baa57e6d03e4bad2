//! `serve` and U+0000 (issue: every backend accepts the same inputs), and a
//! signed malformed body replayed (it is recognised by its bytes): the
//! requests an attacker sent, with what `serve` answers now on the memory,
//! SQLite and PostgreSQL stores.

use crate::common::{cli, repo};
use crate::durability::{drop_schema, pg_url};
use crate::serve::{envelope, scratch, within_seconds, Server};
use serde_json::Value;

/// `whsec_` and the base64 of `isolation-secret-0123456789abcdef`.
const SECRET: &str = "whsec_aXNvbGF0aW9uLXNlY3JldC0wMTIzNDU2Nzg5YWJjZGVm";

/// The reference fixture (card-7 v10, card-8 v3).
fn fixture() -> String {
    repo("fixtures/B62-15-events.json").display().to_string()
}

/// A running `serve`: its store's label, the server, and for PostgreSQL the
/// URL and schema to drop.
type Running = (String, Server, Option<(String, String)>);

/// `serve` on each store this machine has: memory, a SQLite file, and a
/// PostgreSQL schema when a server is reachable (dropped afterwards by the
/// caller with the returned name).
fn servers(name: &str) -> Vec<Running> {
    let dir = scratch(name);
    let sqlite = format!("sqlite:{}", dir.join("inbox.db").display());
    let initial = fixture();
    let base = ["--initial", initial.as_str(), "--webhook-secret", SECRET];
    let mut out = Vec::new();
    for (label, store) in [("memory", "memory"), ("sqlite", sqlite.as_str())] {
        let mut args = base.to_vec();
        args.extend(["--store", store]);
        out.push((label.to_owned(), Server::start(&args), None));
    }
    if let Some(url) = pg_url() {
        let schema = format!("sr_serve_{name}_{}", std::process::id());
        drop_schema(&url, &schema);
        let mut args = base.to_vec();
        args.extend(["--store", url.as_str(), "--store-schema", schema.as_str()]);
        let server = Server::start(&args);
        out.push(("postgres".to_owned(), server, Some((url, schema))));
    }
    out
}

#[test]
fn an_event_with_nul_in_an_id_is_400_nul_in_id_on_every_store_and_the_next_event_is_applied() {
    let event_nul = envelope(r"e-\u0000-1", "card-7", 11, r#"{"stage":"ready"}"#);
    let object_nul = envelope("e-2", r"card-\u0000", 1, "{}");
    for (label, server, pg) in servers("nul") {
        let reply = server.post_signed(SECRET, &event_nul);
        assert_eq!(reply.status, 400, "{label}: {reply:?}");
        let json = reply.json();
        assert_eq!(
            (&json["decision"], &json["reason"], &json["ack"]),
            (
                &Value::from("reject"),
                &Value::from("nul_in_id"),
                &Value::from("reject")
            ),
            "{label}: {json}"
        );
        assert_eq!(
            json["ack_meaning"],
            "not recorded, not acknowledged: `event_id` contains U+0000 (`\\u0000`), which no id may hold",
            "{label}"
        );
        let reply = server.post_signed(SECRET, &object_nul);
        assert_eq!(reply.status, 400, "{label}: {reply:?}");
        assert_eq!(reply.json()["reason"], "nul_in_id", "{label}");
        // The same again: still 400 (not a retry loop), and an ordinary
        // event right after is applied.
        assert_eq!(
            server.post_signed(SECRET, &event_nul).status,
            400,
            "{label}"
        );
        let ok = envelope("e-3", "card-7", 11, r#"{"stage":"ready"}"#);
        let reply = server.post_signed(SECRET, &ok);
        assert_eq!(reply.status, 200, "{label}: {reply:?}");
        assert_eq!(reply.json()["decision"], "applied", "{label}");
        let metrics = server.get("/metrics").body;
        assert!(
            metrics
                .lines()
                .any(|l| l == "snapshot_receiver_rejects_total{reason=\"nul_in_id\"} 3"),
            "{label}: {metrics}"
        );
        if label != "memory" {
            // `%00` in a read parameter: the client's mistake.
            for path in [
                "/audit?event_id=e-%00",
                "/audit?object_id=card-%00",
                "/objects/card-%00",
                "/held?reason=%00",
            ] {
                let reply = server.get(path);
                assert_eq!(reply.status, 400, "{label} {path}: {reply:?}");
                assert!(
                    reply.json()["error"]
                        .as_str()
                        .unwrap()
                        .ends_with("contains U+0000 (%00), which no id may hold"),
                    "{label} {path}: {reply:?}"
                );
            }
            assert_eq!(server.get("/audit?event_id=e-3").status, 200, "{label}");
        }
        drop(server);
        if let Some((url, schema)) = pg {
            drop_schema(&url, &schema);
        }
    }
}

#[test]
fn a_fixture_object_id_with_nul_is_refused_at_start_up_naming_the_id_on_every_store() {
    let dir = scratch("nul-fixture");
    let file = dir.join("nul.json");
    std::fs::write(
        &file,
        r#"{"initial_state": {"card-\u0000-9": {"version": 1, "state": {}}}, "deliveries": [], "authority": []}"#,
    )
    .unwrap();
    let sqlite = format!("sqlite:{}", dir.join("inbox.db").display());
    let mut stores = vec![vec!["--store".to_owned(), "memory".to_owned()]];
    stores.push(vec!["--store".to_owned(), sqlite]);
    let pg = pg_url().map(|url| (url, format!("sr_serve_nulfix_{}", std::process::id())));
    if let Some((url, schema)) = &pg {
        stores.push(vec![
            "--store".to_owned(),
            url.clone(),
            "--store-schema".to_owned(),
            schema.clone(),
        ]);
    }
    for store in stores {
        let out = within_seconds(
            60,
            cli()
                .args(["serve", "--listen", "127.0.0.1:0", "--initial"])
                .arg(&file)
                .args(&store),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{store:?}: {stderr}");
        assert!(
            stderr.contains(r#"initial object id "card-\0-9" is refused: it contains U+0000 (`\u0000`), which no id may hold"#),
            "{store:?}: {stderr}"
        );
    }
    if let Some((url, schema)) = pg {
        drop_schema(&url, &schema);
    }
}

#[test]
fn a_signed_malformed_body_replayed_fifty_times_is_held_once_on_every_store() {
    // Valid JSON, a duplicate key: malformed, held with its bytes.
    let body = r#"{"event_id":"m-1","object_id":"card-7","object_version":11,"object_version":12,"type":"card.snapshot","state":{}}"#;
    for (label, server, pg) in servers("malformed") {
        let mut decisions = std::collections::BTreeMap::new();
        for _ in 0..50 {
            let reply = server.post_signed(SECRET, body);
            assert_eq!(reply.status, 200, "{label}: {reply:?}");
            let json = reply.json();
            let what = format!(
                "{} {} {}",
                json["decision"], json["reason"], json["original_decision"]
            );
            *decisions.entry(what).or_insert(0) += 1;
        }
        let expected: std::collections::BTreeMap<String, i32> = [
            ("\"duplicate\" null \"held (malformed)\"".to_owned(), 49),
            ("\"held\" \"malformed\" null".to_owned(), 1),
        ]
        .into_iter()
        .collect();
        assert_eq!(decisions, expected, "{label}");
        if label != "memory" {
            let held = server.get("/held?reason=malformed").json();
            assert_eq!(held.as_array().map(Vec::len), Some(1), "{label}: {held}");
        }
        drop(server);
        if let Some((url, schema)) = pg {
            drop_schema(&url, &schema);
        }
    }
}
