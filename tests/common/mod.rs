//! Helpers shared by the test modules.

// unsafe: a SQLite VFS is a table of C callbacks (FFI) that count fsyncs.
#[allow(unsafe_code)]
pub mod fsync_vfs;
pub mod loopback;
// unsafe: the skipped tests' list is printed from an `atexit` handler
// (libtest has no hook at the end of the run; std has no `atexit`).
#[allow(unsafe_code)]
pub mod skip;
pub mod stream_gen;

use snapshot_receiver::{parse_rfc3339, Clock, ManualClock, Receiver};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::SystemTime;

/// The repository's top folder: fixtures, the fuzz corpus and the README
/// commands' relative paths start there (the suite is built by the `cli`
/// package, whose own folder is the tests' working directory).
pub fn repo_root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// `path` (relative to the repository's top folder).
pub fn repo(path: &str) -> PathBuf {
    repo_root().join(path)
}

/// The `snapshot-receiver` binary, run from the repository's top folder.
pub fn cli() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_snapshot-receiver"));
    command.current_dir(repo_root());
    command
}

/// Spawns `command` (stdout as the caller set it) so that its stderr stays
/// out of the test run's output unless asked for: with `RUST_LOG` set it is
/// this process's stderr; otherwise each line is copied into the test's
/// captured output, which the harness prints only for a failing test (or
/// with `--nocapture`). A child's inherited stderr would bypass that
/// capture and print its log lines on every `cargo test`.
pub fn spawn_quiet(command: &mut Command) -> Child {
    if std::env::var_os("RUST_LOG").is_some() {
        return command.stderr(Stdio::inherit()).spawn().unwrap();
    }
    let mut child = command.stderr(Stdio::piped()).spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    // A thread spawned by the test shares its output capture; it ends when
    // the child closes its stderr.
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            eprintln!("[child stderr] {line}");
        }
    });
    child
}

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

/// A receiver under `profile` with `objects` (id, version, state JSON), on
/// a manual clock at [`t`].
pub fn receiver_with_profile(
    profile: snapshot_receiver::Profile,
    objects: &[(&str, u64, &str)],
) -> Receiver {
    let mut b = Receiver::builder()
        .profile(profile)
        .clock(Arc::new(ManualClock::new(t())) as Arc<dyn Clock>);
    for (id, v, s) in objects {
        b = b.object(id, *v, s);
    }
    b.build().unwrap()
}

/// The unresolved inputs of `rx`, each as its event id and reason, in
/// arrival order (every one must have an event id).
pub async fn unresolved_named(rx: &Receiver) -> Vec<(String, &'static str)> {
    rx.unresolved()
        .await
        .iter()
        .map(|u| (u.event_id.as_deref().unwrap().to_owned(), u.reason()))
        .collect()
}

/// The semantic fingerprint `rx` gives `body` (it must be a well-formed event).
pub fn fingerprint(rx: &Receiver, body: &str) -> u128 {
    rx.context()
        .parser()
        .parse(body.as_bytes())
        .unwrap()
        .fingerprint()
        .unwrap_or_else(|| panic!("malformed: {body}"))
}

/// A replay line's decision with its detail (hold reason, conflict kind or
/// original decision), as `held missing_version`; the line must have a decision.
pub fn decision_text(line: &snapshot_receiver::core::LineFields) -> String {
    let detail = line
        .reason
        .clone()
        .or(line.conflict.map(str::to_owned))
        .or(line.original_decision.clone());
    match detail {
        Some(x) => format!("{} {x}", line.decision.unwrap()),
        None => line.decision.unwrap().to_owned(),
    }
}

/// A command's JSON Lines output (UTF-8), each line parsed.
pub fn json_lines(stdout: Vec<u8>) -> Vec<serde_json::Value> {
    String::from_utf8(stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The bodies recorded in the audit trail for `event_id`, in order.
pub async fn delivered_bodies(rx: &Receiver, event_id: &str) -> Vec<String> {
    rx.audit_for_event(event_id)
        .await
        .into_iter()
        .filter_map(|r| match r.entry {
            snapshot_receiver::AuditEntry::Delivery { body, .. } => Some(body.to_string()),
            _ => None,
        })
        .collect()
}

/// The body of event `e-{o}-{v}`: object `obj-{o}` at version `v`, state `{"v":v}`.
pub fn versioned(o: u64, v: u64) -> (String, String) {
    let id = format!("e-{o}-{v}");
    let b = body(
        &id,
        &format!("obj-{o}"),
        Some(&v.to_string()),
        T,
        &format!("{{\"v\":{v}}}"),
    );
    (id, b)
}

/// A small deterministic shuffle (xorshift), different per seed.
pub fn shuffle<X>(items: &mut [X], seed: u64) {
    let mut x = seed | 1;
    for i in (1..items.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        items.swap(i, (x % (i as u64 + 1)) as usize);
    }
}

/// A conflict-free stream with duplicates: `objects` × `versions` events,
/// each delivered once, every third twice, in a seeded shuffled order.
pub fn stream(objects: u64, versions: u64, seed: u64) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = (0..objects)
        .flat_map(|o| (1..=versions).map(move |v| (o, v)))
        .flat_map(|(o, v)| {
            let copies = if (o + v) % 3 == 0 { 2 } else { 1 };
            std::iter::repeat_n(versioned(o, v), copies)
        })
        .collect();
    shuffle(&mut out, seed);
    out
}

/// A two-worker multi-thread runtime, for tests that drive async code from a
/// plain `#[test]`.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}
