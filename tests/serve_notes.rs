//! What `serve` tells its operator at start-up about the objects it knows:
//! a server that knows none (nothing seeded with `--initial`, nothing in
//! its store) and whose profile does not create objects parks every
//! delivery as `held` / `unknown_object` (docs/CONTRACT.md §3.2), and says
//! so once, at WARN, after its stdout lines.

use crate::common::repo;
use crate::serve::{scratch, Server};
use serde_json::Value;
use std::io::Read;
use std::process::Stdio;

/// The warning, word for word.
const NO_OBJECTS: &str = "no objects known: deliveries for unknown objects will be parked; give --initial, a profile with create_on_first_snapshot, or an authority";

/// Starts `serve ARGS` with its log lines as JSON (`SNAPSHOT_RECEIVER_LOG_FORMAT`),
/// posts `body` unsigned when given, stops it, and returns the answer's
/// JSON and the log lines it wrote.
fn run(args: &[&str], body: Option<&str>) -> (Option<Value>, Vec<Value>) {
    let mut command = Server::command(args, &[("SNAPSHOT_RECEIVER_LOG_FORMAT", "json")]);
    command.env_remove("RUST_LOG").stderr(Stdio::piped());
    let mut child = command.spawn().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    // Read while the server runs, so that a full pipe never stalls it.
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        stderr.read_to_string(&mut text).unwrap();
        text
    });
    let server = Server::attach(child);
    let answer = body.map(|b| server.post(&[], b).json());
    let (status, _) = server.stop();
    assert!(status.success(), "serve {args:?} ended {status}");
    let logs = reader
        .join()
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    (answer, logs)
}

/// The log lines whose message is the warning (each must be at WARN).
fn warnings(logs: &[Value]) -> usize {
    logs.iter()
        .filter(|l| l["message"] == NO_OBJECTS)
        .inspect(|l| assert_eq!(l["level"], "warn", "{l}"))
        .count()
}

fn fixture() -> String {
    repo("fixtures/B62-15-events.json").display().to_string()
}

/// A fresh store, nothing seeded: the warning, once, and a real-looking
/// event for a new object is parked as it says.
#[test]
fn a_server_that_knows_no_objects_says_deliveries_will_be_parked() {
    let body = r#"{"event_id":"e-1","object_id":"card-1","object_version":1,"type":"card.snapshot","state":{"stage":"queued"}}"#;
    let (answer, logs) = run(&["--store", "memory"], Some(body));
    assert_eq!(warnings(&logs), 1, "{logs:?}");
    let answer = answer.unwrap();
    assert_eq!(answer["decision"], "held", "{answer}");
    assert_eq!(answer["reason"], "unknown_object", "{answer}");

    let dir = scratch("notes-fresh");
    let store = format!("sqlite:{}", dir.join("r.db").display());
    let (_, logs) = run(&["--store", &store], None);
    assert_eq!(warnings(&logs), 1, "{logs:?}");
}

/// Objects seeded with `--initial`, or already in the store, or a profile
/// that creates objects on their first snapshot: no warning.
#[test]
fn a_server_with_objects_or_a_creating_profile_does_not_warn() {
    let dir = scratch("notes-seeded");
    let store = format!("sqlite:{}", dir.join("r.db").display());
    let fixture = fixture();
    let (_, logs) = run(&["--store", &store, "--initial", &fixture], None);
    assert_eq!(warnings(&logs), 0, "{logs:?}");
    // The same store again, without --initial: it holds card-7 and card-8.
    let (_, logs) = run(&["--store", &store], None);
    assert_eq!(warnings(&logs), 0, "{logs:?}");
    let (_, logs) = run(&["--store", "memory", "--initial", &fixture], None);
    assert_eq!(warnings(&logs), 0, "{logs:?}");

    let profile = dir.join("profile.json");
    let creating = repo("fixtures/create-on-first-snapshot.json");
    let text: Value = serde_json::from_str(&std::fs::read_to_string(&creating).unwrap()).unwrap();
    assert_eq!(text["profile"]["create_on_first_snapshot"], true);
    std::fs::write(&profile, text["profile"].to_string()).unwrap();
    let (_, logs) = run(
        &[
            "--store",
            "memory",
            "--profile-file",
            profile.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(warnings(&logs), 0, "{logs:?}");
}

/// docs/OPERATIONS.md quotes the warning word for word (its lines joined).
#[test]
fn the_operations_guide_quotes_the_warning() {
    let text = std::fs::read_to_string(repo("docs/OPERATIONS.md")).unwrap();
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        joined.contains(&format!("`{NO_OBJECTS}`")),
        "docs/OPERATIONS.md does not quote `{NO_OBJECTS}`"
    );
}
