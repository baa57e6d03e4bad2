//! What a replay counts on a store with earlier runs, and what it says when
//! its clock fell back to the wall clock (issue 13, items 8 and 9).

use crate::common::{body, cli, json_lines, t, T};
use crate::store::temp_db;
use crate::variants::{briefs, replay_json};
use snapshot_receiver::{core::ReplacementCounts, Clock, ManualClock, Receiver};
use std::sync::Arc;

/// The B62 fixture's lines on a store that already has its first run: every
/// delivery is a duplicate, both authorities equal their objects.
const RERUN: [&str; 12] = [
    "e-201 card-7 duplicate of applied v14 paused=false repl=false acknowledge",
    "e-201 card-7 duplicate of applied v14 paused=false repl=false acknowledge",
    "e-202 card-7 duplicate of stale v14 paused=false repl=false acknowledge",
    "e-206 card-8 duplicate of applied v5 paused=false repl=false acknowledge",
    "e-204 card-8 duplicate of held (missing_version) v5 paused=false repl=false acknowledge",
    "e-202 card-7 duplicate of conflict (event_variant) v14 paused=false repl=false acknowledge",
    "e-203 card-7 duplicate of held (paused) v14 paused=false repl=false acknowledge",
    "e-208 card-8 duplicate of held (unsupported_type) v5 paused=false repl=false acknowledge",
    "e-205 card-8 duplicate of conflict (version_state) v5 paused=false repl=false acknowledge",
    "e-207 card-9 duplicate of held (unknown_object) v- paused=- repl=false acknowledge",
    "- card-7 authority v14 paused=false repl=false -",
    "- card-8 authority v5 paused=false repl=false -",
];

#[test]
fn three_runs_on_one_sqlite_file_each_count_only_their_own_run() {
    let path = temp_db("three-runs");
    let store = format!("sqlite:{}", path.display());
    let args = [
        "replay",
        "fixtures/B62-15-events.json",
        "--store",
        &store,
        "--history",
    ];
    let first = replay_json(&args);
    let last = first.last().unwrap();
    assert_eq!(
        (last["replacements"].clone(), last["counts"].clone()),
        (
            serde_json::json!({"event": 2, "authority": 2}),
            serde_json::json!("this_run")
        )
    );
    let causes = |last: &serde_json::Value| -> Vec<String> {
        last["history"]
            .as_object()
            .unwrap()
            .iter()
            .flat_map(|(id, entries)| {
                entries.as_array().unwrap().iter().map(move |h| {
                    format!("{id} v{} <- {}", h["version"], h["cause"].as_str().unwrap())
                })
            })
            .collect()
    };
    assert_eq!(
        causes(last),
        [
            "card-7 v12 <- e-201",
            "card-7 v14 <- authority",
            "card-8 v4 <- e-206",
            "card-8 v5 <- authority"
        ]
    );
    for run in [2, 3] {
        let lines = replay_json(&args);
        assert_eq!(briefs(&lines), RERUN, "run {run}");
        let last = lines.last().unwrap();
        assert_eq!(
            last["replacements"],
            serde_json::json!({"event": 0, "authority": 0}),
            "run {run}"
        );
        assert_eq!(last["history"], serde_json::json!({}), "run {run}");
        assert_eq!(last["counts"], "this_run");
    }
    // The text form of a fourth run labels the counts and agrees with them.
    let out = cli().args(args).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let final_section: Vec<&str> = text
        .split("\n== final ==\n")
        .nth(1)
        .unwrap()
        .split("\n\n== counters (this run) ==\n")
        .next()
        .unwrap()
        .lines()
        .collect();
    assert_eq!(
        final_section,
        [
            r#"card-7 v14 {"stage":"archived","label":"Map v2"}"#,
            r#"card-8 v5 {"stage":"ready","label":"Chart"}"#,
            "replacements (this run): 0 event + 0 authority = 0",
            "history (this run's accepted snapshots; one effect each):",
            "unresolved inputs:",
            "  e-204 on card-8: missing_version (superseded by authority v5)",
            "  e-202 on card-7: event_variant (superseded by authority v14)",
            "  e-208 on card-8: unsupported_type (superseded by authority v5)",
            "  e-207 on card-9: unknown_object (held)",
        ]
    );
    let counters: Vec<&str> = text
        .split("\n== counters (this run) ==\n")
        .nth(1)
        .unwrap()
        .lines()
        .filter(|l| !l.trim_end().ends_with(" 0"))
        .collect();
    assert_eq!(
        counters
            .iter()
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect::<Vec<_>>(),
        ["authority.unchanged 2", "decision.duplicate 10"]
    );
    // The store holds every run: the four effects of the first.
    let conn = rusqlite::Connection::open(&path).unwrap();
    let stored: i64 = conn
        .query_row("SELECT count(*) FROM replacements", [], |r| r.get(0))
        .unwrap();
    assert_eq!(stored, 4);
}

#[allow(deprecated)] // pins the history read by step number
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_and_counters_are_this_runs_and_the_store_keeps_the_rest() {
    let path = temp_db("history-scope");
    let location = format!("sqlite:{}", path.display());
    let clock = Arc::new(ManualClock::new(t()));
    let build = || {
        Receiver::builder()
            .clock(clock.clone() as Arc<dyn Clock>)
            .object("card-7", 10, r#"{"n":10}"#)
            .store(&location)
            .build()
            .unwrap()
    };
    let rx = build();
    rx.deliver(body("e-1", "card-7", Some("11"), T, r#"{"n":11}"#).as_bytes())
        .await;
    assert_eq!(rx.history("card-7").await.len(), 1);
    rx.shutdown().await;
    drop(rx);

    let rx = build();
    rx.deliver(body("e-2", "card-7", Some("12"), T, r#"{"n":12}"#).as_bytes())
        .await;
    let versions = |h: Vec<snapshot_receiver::EffectRecord>| -> Vec<u64> {
        h.into_iter().map(|r| r.version).collect()
    };
    assert_eq!(versions(rx.history("card-7").await), [12]);
    assert_eq!(versions(rx.effects_since(0).await.unwrap()), [12]);
    assert_eq!(
        rx.counters().await,
        ReplacementCounts {
            event_replacements: 1,
            authority_replacements: 0
        }
    );
    assert_eq!(rx.metrics()["decision.applied"], 1);
    let stored: Vec<u64> = rx
        .stored_effects_since(0)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.version)
        .collect();
    assert_eq!(stored, [11, 12]);
    rx.shutdown().await;
}

const NOTE: &str = "note: no --now, no transport.received_at and no authority as_of, so the \
replay clock is the wall clock, and 2 of 2 deliveries occurred more than 24 h before it (held \
as expired_identity where they would apply or conflict); pass --now RFC3339 to replay as of the \
fixture's time\n";

#[test]
fn a_replay_on_the_wall_clock_notes_its_old_deliveries_once() {
    let out = cli()
        .args([
            "replay",
            "fixtures/no-clock-anchor.json",
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8(out.stderr).unwrap(), NOTE);
    let lines: Vec<serde_json::Value> = json_lines(out.stdout);
    assert_eq!(
        briefs(&lines),
        [
            "e-901 card-5 held (expired_identity) v1 paused=false repl=false acknowledge",
            "e-902 card-5 equal v1 paused=false repl=false acknowledge",
        ]
    );
    // Text mode says it too, once.
    let out = cli()
        .args(["replay", "fixtures/no-clock-anchor.json"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8(out.stderr).unwrap(), NOTE);
    // Anchored with --now: the fixture's own time, no note.
    let out = cli()
        .args([
            "replay",
            "fixtures/no-clock-anchor.json",
            "--now",
            "2024-01-01T09:00:00Z",
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8(out.stderr).unwrap(), "");
    let lines: Vec<serde_json::Value> = json_lines(out.stdout);
    assert_eq!(
        briefs(&lines),
        [
            "e-901 card-5 applied v2 paused=false repl=true acknowledge",
            "e-902 card-5 stale v2 paused=false repl=false acknowledge",
        ]
    );
}

#[test]
fn a_wall_clock_replay_of_recent_deliveries_has_no_note() {
    let path = temp_db("fresh").with_extension("json");
    let fresh = body(
        "e-1",
        "card-5",
        Some("2"),
        "2999-01-01T00:00:00Z",
        r#"{"n":2}"#,
    );
    let fixture = serde_json::json!({
        "initial_state": {"card-5": {"version": 1, "state": {"n": 1}}},
        "deliveries": [{"raw": fresh}],
    });
    std::fs::write(&path, fixture.to_string()).unwrap();
    let out = cli()
        .args(["replay", path.to_str().unwrap(), "--format", "json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8(out.stderr).unwrap(), "");
    let first: serde_json::Value = json_lines(out.stdout).remove(0);
    assert_eq!(first["decision"], "applied");
}
