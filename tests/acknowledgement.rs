//! What an acknowledgement covers: a variant naming another object than its
//! first record pauses that object in the step that answers it, so the pause
//! survives a SIGKILL right after the answer (SQLite and PostgreSQL, the
//! object on the variant's shard or on another), and a second process on
//! the same PostgreSQL database decides no delivery past it (nor past the
//! reconciliation that lifts it).

use crate::durability::{drop_schema, pg_url};
use crate::serve::{envelope, objects_fixture, scratch, Server};
use serde_json::{json, Value};
use snapshot_receiver::core::shard_of;

/// The shards `serve` runs (the builder's default).
const SHARDS: usize = 16;

/// Kill-and-restart tries per case (the two-process test runs four times
/// as many rounds); `SNAPSHOT_RECEIVER_ACK_TRIES` raises it for a longer
/// run.
fn tries() -> usize {
    std::env::var("SNAPSHOT_RECEIVER_ACK_TRIES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(3)
}

/// Fixture objects enough for `pairs` of each kind (16 shards: a pair on
/// one shard needs at most 17 objects more).
fn objects_for(pairs: usize) -> usize {
    pairs * 4 + 64
}

/// Pairs (A, B) of fixture objects, A on `obj-{2i}`'s shard: with `same`,
/// B on A's shard, otherwise on another one. Each pair's objects are used by
/// one try only.
fn pairs(n: usize, same: bool) -> Vec<(String, String)> {
    let mut free: Vec<String> = (0..n).map(|o| format!("obj-{o}")).collect();
    let mut out = Vec::new();
    while let Some(a) = free.first().cloned() {
        free.remove(0);
        let shard = shard_of(&a, SHARDS);
        let Some(at) = free
            .iter()
            .position(|b| (shard_of(b, SHARDS) == shard) == same)
        else {
            break;
        };
        out.push((a, free.remove(at)));
    }
    out
}

/// `serve` on `store` (SQLite path or PostgreSQL URL with a schema), the
/// working set and identity cache at their smallest.
fn start(fixture: &str, store: &[&str], extra: &[&str]) -> Server {
    let mut args = vec![
        "--initial",
        fixture,
        "--working-set",
        "1",
        "--identity-cache",
        "1",
    ];
    args.extend_from_slice(store);
    args.extend_from_slice(extra);
    Server::start(&args)
}

fn post(server: &Server, body: &str) -> Value {
    let reply = server.post(&[], body);
    assert_eq!(reply.status, 200, "{body}: {reply:?}");
    reply.json()
}

/// The decision, its reason and the paused flag of a receipt.
fn decided(receipt: &Value) -> (String, Value, Value) {
    (
        receipt["decision"].as_str().unwrap_or("-").to_owned(),
        receipt["reason"].clone(),
        receipt["paused"].clone(),
    )
}

/// g1 for A (applied), then g1's variant naming B (conflict), SIGKILL as
/// soon as the variant's answer arrived; after a restart on the same store
/// A is paused by g1, a new event for A is held behind the pause, and the
/// variant sent again is a duplicate of the conflict.
fn kill_after_the_variant(fixture: &str, store: &[&str], a: &str, b: &str, tag: &str) {
    let server = start(fixture, store, &[]);
    let g1 = format!("{tag}-g1");
    let first = post(&server, &envelope(&g1, a, 1, r#"{"n":1}"#));
    assert_eq!(
        decided(&first),
        ("applied".into(), json!(null), json!(false))
    );
    let variant = envelope(&g1, b, 1, r#"{"n":2}"#);
    let answer = post(&server, &variant);
    assert_eq!(
        (decided(&answer), &answer["conflict"]),
        (
            ("conflict".into(), json!(null), json!(true)),
            &json!("event_variant")
        ),
        "{answer}"
    );
    // SIGKILL, at once.
    drop(server);

    let server = start(fixture, store, &[]);
    let object = server.get(&format!("/objects/{a}")).json();
    assert_eq!(
        (
            &object["paused"],
            &object["pause_reason"],
            &object["paused_by"]
        ),
        (&json!(true), &json!("event_variant"), &json!(g1)),
        "{a} after the restart ({b} on the same shard: {}): {object}",
        shard_of(a, SHARDS) == shard_of(b, SHARDS)
    );
    let next = post(&server, &envelope(&format!("{tag}-g2"), a, 2, r#"{"n":3}"#));
    assert_eq!(
        decided(&next),
        ("held".into(), json!("paused"), json!(true)),
        "{next}"
    );
    let again = post(&server, &variant);
    assert_eq!(
        (decided(&again), &again["original_decision"]),
        (
            ("duplicate".into(), json!(null), json!(true)),
            &json!("conflict (event_variant)")
        ),
        "{again}"
    );
    drop(server);

    // `inspect` and the audit trail show the variant under both objects:
    // A paused by g1, the variant held on B naming A as its first record's
    // object, and A's trail with g1's pause after g1's delivery.
    let inspect = run(&[&["inspect", "--format", "json"], store].concat());
    let paused: Vec<(&str, &str)> = rows(&inspect["paused"])
        .map(|p| {
            (
                p["object_id"].as_str().unwrap(),
                p["paused_by"].as_str().unwrap(),
            )
        })
        .collect();
    let mut expected = vec![(a, g1.as_str()), (b, g1.as_str())];
    expected.sort();
    assert_eq!(paused, expected, "{inspect}");
    let held: Vec<(&str, &str, &Value)> = rows(&inspect["held"])
        .map(|h| {
            (
                h["event_id"].as_str().unwrap(),
                h["object_id"].as_str().unwrap(),
                &h["first_record_object_id"],
            )
        })
        .collect();
    let g2 = format!("{tag}-g2");
    assert_eq!(
        held,
        vec![(g1.as_str(), b, &json!(a)), (g2.as_str(), a, &json!(null))],
        "{inspect}"
    );
    let trail = crate::common::cli()
        .args([&["audit", "--format", "json", "--object", a], store].concat())
        .output()
        .unwrap();
    assert!(trail.status.success(), "{trail:?}");
    let trail: Vec<[String; 4]> = crate::common::json_lines(trail.stdout)
        .iter()
        .map(|r| {
            ["kind", "event_id", "decision", "reason"]
                .map(|k| r[k].as_str().unwrap_or("-").to_owned())
        })
        .collect();
    let row = |fields: [&str; 4]| fields.map(str::to_owned);
    assert_eq!(
        trail,
        vec![
            row(["delivery", &g1, "applied", "-"]),
            row(["paused", &g1, "-", "-"]),
            row(["delivery", &g2, "held", "paused"]),
        ]
    );
}

/// Runs the command line with `args`; its stdout as JSON.
fn run(args: &[&str]) -> Value {
    let out = crate::common::cli().args(args).output().unwrap();
    assert!(out.status.success(), "{args:?}: {out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn rows(v: &Value) -> impl Iterator<Item = &Value> {
    v.as_array().expect("an array").iter()
}

#[test]
fn a_variants_pause_of_another_object_survives_a_kill_right_after_the_answer_on_sqlite() {
    let dir = scratch("ack-sqlite");
    let n = objects_for(tries());
    let fixture = objects_fixture(&dir, n);
    for same in [false, true] {
        for (i, (a, b)) in pairs(n, same).into_iter().take(tries()).enumerate() {
            let store = format!("sqlite:{}", dir.join(format!("{same}-{i}.db")).display());
            kill_after_the_variant(&fixture, &["--store", &store], &a, &b, &format!("t{i}"));
        }
    }
}

#[test]
fn a_variants_pause_of_another_object_survives_a_kill_right_after_the_answer_on_postgres() {
    let Some(url) = pg_url() else { return };
    let dir = scratch("ack-pg");
    let n = objects_for(tries());
    let fixture = objects_fixture(&dir, n);
    for same in [false, true] {
        for (i, (a, b)) in pairs(n, same).into_iter().take(tries()).enumerate() {
            let schema = format!("sr_ack_{same}_{i}_{}", std::process::id());
            drop_schema(&url, &schema);
            let store = ["--store", &url, "--store-schema", &schema];
            kill_after_the_variant(&fixture, &store, &a, &b, &format!("t{i}"));
            drop_schema(&url, &schema);
        }
    }
}

/// Two `serve` processes on one PostgreSQL database. For each pair (A, B):
/// the second process decides an event for A first (so it holds A in
/// memory, not paused), the first applies g1 to A and answers g1's variant
/// naming B; the second must then hold its next event for A behind the
/// committed pause. The first reconciles A; the second must then apply the
/// event after, not hold it behind the pause it last saw; and after the
/// first applies one more, the second's answer to a duplicate shows that
/// committed version, not the one it last saw.
#[test]
fn a_second_process_decides_no_delivery_past_a_committed_pause_or_unpause() {
    let Some(url) = pg_url() else { return };
    let dir = scratch("ack-two");
    let rounds = tries() * 4;
    let n = objects_for(rounds);
    let fixture = objects_fixture(&dir, n);
    let schema = format!("sr_ack_two_{}", std::process::id());
    drop_schema(&url, &schema);
    let store = ["--store", &url, "--store-schema", &schema];
    let token = ["--operator-token", "two-process-token"];
    let first = start(&fixture, &store, &token);
    let second = start(&fixture, &store, &[]);
    let bearer = vec![("Authorization", "Bearer two-process-token".to_owned())];
    let mut pairs = pairs(n, false);
    pairs.truncate(rounds);
    assert_eq!(pairs.len(), rounds);
    for (i, (a, b)) in pairs.iter().enumerate() {
        let id = |n: u32| format!("two-{i}-g{n}");
        let seen = post(&second, &envelope(&id(0), a, 1, r#"{"n":0}"#));
        assert_eq!(
            decided(&seen),
            ("applied".into(), json!(null), json!(false))
        );
        let applied = post(&first, &envelope(&id(1), a, 2, r#"{"n":1}"#));
        assert_eq!(decided(&applied).0, "applied", "{applied}");
        let variant = post(&first, &envelope(&id(1), b, 1, r#"{"n":2}"#));
        assert_eq!(decided(&variant).0, "conflict", "{variant}");
        let held = post(&second, &envelope(&id(2), a, 3, r#"{"n":3}"#));
        assert_eq!(
            (decided(&held), &held["version"]),
            (("held".into(), json!("paused"), json!(true)), &json!(2)),
            "{a}: the second process decided past the pause: {held}"
        );
        let authority = json!({"object_id": a, "version": 3, "state": {"n": 3}}).to_string();
        let reply = first.request("POST", "/reconcile", &bearer, authority.as_bytes());
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(reply.json()["paused"], json!(false), "{reply:?}");
        let after = post(&second, &envelope(&id(3), a, 4, r#"{"n":4}"#));
        assert_eq!(
            (decided(&after), &after["version"]),
            (("applied".into(), json!(null), json!(false)), &json!(4)),
            "{a}: the second process held past the reconciliation: {after}"
        );
        // A duplicate reports the committed object, not the answering
        // process's view of it.
        let newer = post(&first, &envelope(&id(4), a, 5, r#"{"n":5}"#));
        assert_eq!(decided(&newer).0, "applied", "{newer}");
        let again = post(&second, &envelope(&id(3), a, 4, r#"{"n":4}"#));
        assert_eq!(
            (decided(&again).0, &again["version"], &again["state"]),
            ("duplicate".into(), &json!(5), &json!({"n": 5})),
            "{a}: a duplicate reported a view older than the committed object: {again}"
        );
    }
    drop((first, second));
    drop_schema(&url, &schema);
}
