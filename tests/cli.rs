//! The command-line tool, as a user runs it.

use std::process::Output;

fn run(args: &[&str]) -> Output {
    crate::common::cli().args(args).output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

#[test]
fn replay_text_shows_every_step_and_the_final_state() {
    let o = run(&["replay", "fixtures/B62-15-events.json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    // The final section ends where the counters (issue 7) begin.
    let before_counters = out.split("\n\n== counters (this run) ==").next().unwrap();
    let tail: Vec<&str> = before_counters
        .lines()
        .rev()
        .take(9)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    assert_eq!(
        tail,
        [
            "== final ==",
            r#"card-7 v14 {"stage":"archived","label":"Map v2"}"#,
            r#"card-8 v5 {"stage":"ready","label":"Chart"}"#,
            "replacements (this run): 2 event + 2 authority = 4",
            "unresolved inputs:",
            "  e-204 on card-8: missing_version (superseded by authority v5)",
            "  e-202 on card-7: event_variant (superseded by authority v14)",
            "  e-208 on card-8: unsupported_type (superseded by authority v5)",
            "  e-207 on card-9: unknown_object (held)",
        ]
    );
    let row = |n: &str| {
        out.lines()
            .find(|l| l.starts_with(n))
            .unwrap()
            .split_whitespace()
            .take(4)
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(row("  2 "), "2 e-201 card-7 duplicate");
    assert!(out.contains(" duplicate (original: applied) "));
    assert_eq!(row("  6 "), "6 e-202 card-7 conflict");
    assert!(out.contains("conflict (event_variant)"));
    assert_eq!(row(" 13 "), "13 e-203 card-7 equal");
    assert_eq!(row(" 17 "), "17 e-205 card-8 stale");
    assert!(
        out.contains("ack means: responsibility accepted for reconciliation; state not applied")
    );
}

#[test]
fn replay_json_lines_use_the_spec_field_names() {
    let o = run(&["replay", "fixtures/B62-15-events.json", "--format", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 18);
    let first = lines[0].as_object().unwrap();
    let keys: Vec<&str> = first.keys().map(String::as_str).collect();
    let mut expected = [
        "step",
        "phase",
        "event_id",
        "object_id",
        "decision",
        "reason",
        "conflict",
        "original_decision",
        "version",
        "state",
        "paused",
        "replacement",
        "ack",
    ];
    expected.sort_unstable();
    let mut keys_sorted = keys.clone();
    keys_sorted.sort_unstable();
    assert_eq!(keys_sorted, expected);
    assert_eq!(lines[1]["decision"], "duplicate");
    assert_eq!(lines[1]["original_decision"], "applied");
    assert_eq!(lines[4]["reason"], "missing_version");
    assert_eq!(lines[8]["conflict"], "version_state");
    assert_eq!(lines[10]["phase"], "reconcile");
    assert_eq!(lines[10]["decision"], "authority");
    assert_eq!(lines[10]["replacement"], true);
    let last = &lines[17];
    assert_eq!(last["phase"], "final");
    assert_eq!(
        last["cards"],
        serde_json::json!({
            "card-7": {"version": 14, "state": {"stage": "archived", "label": "Map v2"}, "paused": false},
            "card-8": {"version": 5, "state": {"stage": "ready", "label": "Chart"}, "paused": false}
        })
    );
    assert_eq!(
        last["replacements"],
        serde_json::json!({"event": 2, "authority": 2})
    );
    let unresolved: Vec<&str> = last["unresolved"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["event_id"].as_str().unwrap())
        .collect();
    assert_eq!(unresolved, ["e-204", "e-202", "e-208", "e-207"]);
}

fn bad_input(args: &[&str], expected: &str) {
    let o = run(args);
    assert_eq!(o.status.code(), Some(2), "{args:?}");
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(
        err.contains(expected),
        "{err:?} should contain {expected:?}"
    );
    assert!(!err.contains("panicked"));
    assert_eq!(stdout(&o), "", "nothing on stdout for {args:?}");
}

#[test]
fn bad_input_is_one_clear_line_and_exit_code_2() {
    let dir = std::env::temp_dir().join(format!("sr-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_owned()
    };
    bad_input(
        &["replay", "no/such/file.json"],
        "error: no/such/file.json: cannot read: No such file or directory",
    );
    let p = write("invalid.json", "{\"initial_state\": ");
    bad_input(
        &["replay", &p],
        &format!("error: {p}: not a valid fixture: initial_state: EOF while parsing a value"),
    );
    let p = write("shape.json", r#"{"initial_state": {}, "deliveries": {}}"#);
    bad_input(
        &["replay", &p],
        "not a valid fixture: deliveries: invalid type: map, expected a sequence at line 1 column 36",
    );
    // Not an object: a JSON array would otherwise be read member by member.
    for (name, text, found) in [
        ("array.json", "[]", "an array"),
        ("tuple.json", r#"[null, {}, []]"#, "an array"),
        ("string.json", r#"  "deliveries""#, "a string"),
        ("number.json", "\n42", "a number"),
        ("null.json", "null", "null"),
        ("empty.json", " \n", "nothing"),
        ("text.json", "deliveries: []", "text that is not JSON"),
        // Text whose first letter starts a JSON literal is still not JSON.
        ("sentence.json", "this is not json", "text that is not JSON"),
        ("yaml.json", "name: x", "text that is not JSON"),
        ("false.json", "falsehood", "text that is not JSON"),
        ("true.json", " true", "a boolean"),
    ] {
        let p = write(name, text);
        bad_input(
            &["replay", &p],
            &format!("error: {p}: not a valid fixture: expected a JSON object, found {found}"),
        );
    }
    // `deliveries` is required (docs/CONTRACT.md §6), `initial_state` is not.
    let p = write("no-deliveries.json", r#"{"initial_state": {}}"#);
    bad_input(
        &["replay", &p],
        &format!("error: {p}: not a valid fixture: missing field `deliveries` at line 1 column 21"),
    );
    let p = write(
        "both.json",
        r#"{"initial_state": {}, "deliveries": [{"body": {}, "raw": "{}"}]}"#,
    );
    bad_input(
        &["replay", &p],
        &format!("{p}: deliveries[0]: needs exactly one of `body` or `raw`"),
    );
    let p = write(
        "version.json",
        r#"{"initial_state": {"c": {"version": -1, "state": {}}}, "deliveries": []}"#,
    );
    bad_input(
        &["replay", &p],
        &format!(
            "error: {p}: not a valid fixture: initial_state.c.version: invalid value: \
             integer `-1`, expected u64 at line 1 column 38"
        ),
    );
    // A type error deep in the file names its field's path from the top.
    let p = write(
        "deep.json",
        r#"{"deliveries": [{"body": {}}, {"raw": 7}], "authority": []}"#,
    );
    bad_input(
        &["replay", &p],
        &format!(
            "error: {p}: not a valid fixture: deliveries[1].raw: invalid type: integer `7`, \
             expected a string at line 1 column 39"
        ),
    );
    let p = write(
        "force.json",
        r#"{"deliveries": [], "authority": [{"object_id": "c", "version": 1, "state": {}, "as_of": "2024-01-01T08:00:00Z", "force": "yes"}]}"#,
    );
    bad_input(
        &["replay", &p],
        &format!(
            "error: {p}: not a valid fixture: authority[0].force: invalid type: string \"yes\", \
             expected a boolean at line 1 column 126"
        ),
    );
    let p = write(
        "state.json",
        r#"{"initial_state": {"c": {"version": 1, "state": {"a":1,"a":2}}}, "deliveries": []}"#,
    );
    bad_input(
        &["replay", &p],
        "initial state of `c` is invalid: duplicate key \"a\"",
    );
    let p = write(
        "when.json",
        r#"{"initial_state": {}, "deliveries": [], "authority": [{"object_id": "c", "version": 1, "state": {}, "as_of": "noon"}]}"#,
    );
    bad_input(
        &["replay", &p],
        "authority[0].as_of: not an RFC 3339 time: \"noon\"",
    );
    bad_input(
        &[
            "replay",
            "fixtures/B62-15-events.json",
            "--now",
            "yesterday",
        ],
        "--now: not an RFC 3339 time",
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn replay_with_history_lists_each_accepted_snapshot_once() {
    let o = run(&["replay", "fixtures/shipments-rehearsal.json", "--history"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let history: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("history"))
        .skip(1)
        .take_while(|l| l.starts_with("  ") && l.contains("<-"))
        .map(|l| l.split(" <- ").nth(1).unwrap())
        .collect();
    assert_eq!(
        history,
        [
            "acme/evt-801 (effect #1)",
            "acme/evt-802 (effect #4)",
            "acme/evt-803 (effect #5)",
            "authority (effect #9)",
            "globex/evt-801 (effect #8)",
        ]
    );
    assert!(
        out.contains("acme/SHP-1 v11 {\"id\":\"SHP-1\",\"revision\":11,\"status\":\"delivered\"}")
    );
}

#[test]
fn verbose_replay_traces_a_span_per_delivery_with_its_decision() {
    let o = run(&[
        "-v",
        "replay",
        "fixtures/B62-15-events.json",
        "--format",
        "json",
    ]);
    assert!(o.status.success());
    let err = stderr(&o);
    let spans: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("delivery recorded"))
        .collect();
    assert_eq!(spans.len(), 10, "{err}");
    assert!(
        spans[0].contains(
            r#"delivery{event_id="e-201" object_id="card-7" decision=applied ack="acknowledge"}"#
        ),
        "{}",
        spans[0]
    );
    assert!(
        spans[5].contains("decision=conflict (event_variant)"),
        "{}",
        spans[5]
    );
    // Without -v only warnings are printed: nothing here.
    let quiet = run(&["replay", "fixtures/B62-15-events.json"]);
    assert_eq!(stderr(&quiet), "");
}

#[test]
fn a_fixture_without_initial_state_starts_with_no_objects() {
    let dir = std::env::temp_dir().join(format!("sr-cli-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("empty-state.json");
    std::fs::write(&path, r#"{"deliveries": []}"#).unwrap();
    let o = run(&["replay", path.to_str().unwrap(), "--format", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let line: serde_json::Value = serde_json::from_str(stdout(&o).trim_end()).unwrap();
    assert_eq!(
        line,
        serde_json::json!({
            "step": 1, "phase": "final", "event_id": null, "object_id": null,
            "decision": null, "reason": null, "conflict": null, "original_decision": null,
            "version": null, "state": null, "paused": null, "replacement": null, "ack": null,
            "cards": {}, "replacements": {"event": 0, "authority": 0}, "counts": "this_run",
            "unresolved": []
        })
    );
    // A delivery for an object nobody introduced is parked as unknown.
    let body = crate::common::body("e-1", "card-1", Some("1"), crate::common::T, "{}");
    std::fs::write(&path, format!(r#"{{"deliveries": [{{"body": {body}}}]}}"#)).unwrap();
    let o = run(&["replay", path.to_str().unwrap(), "--format", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let first: serde_json::Value =
        serde_json::from_str(stdout(&o).lines().next().unwrap()).unwrap();
    assert_eq!(
        (&first["decision"], &first["reason"]),
        (
            &serde_json::json!("held"),
            &serde_json::json!("unknown_object")
        )
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_fixture_file_with_a_byte_order_mark_replays_as_without_one() {
    let dir = std::env::temp_dir().join(format!("sr-cli-bom-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plain = std::fs::read(crate::common::repo("fixtures/B62-15-events.json")).unwrap();
    let (once, twice) = (dir.join("bom.json"), dir.join("bom-twice.json"));
    std::fs::write(&once, [&b"\xef\xbb\xbf"[..], &plain].concat()).unwrap();
    std::fs::write(&twice, [&b"\xef\xbb\xbf\xef\xbb\xbf"[..], &plain].concat()).unwrap();
    let expected = run(&["replay", "fixtures/B62-15-events.json", "--format", "json"]);
    let o = run(&["replay", once.to_str().unwrap(), "--format", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), stdout(&expected));
    // Only one is skipped: a second is text that is not JSON.
    let o = run(&["replay", twice.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o),
        format!(
            "error: {}: not a valid fixture: expected a JSON object, found text that is not JSON\n",
            twice.display()
        )
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A fixture with ids longer than the table's usual columns: an event is
/// applied, another at the same version with another state conflicts, that
/// one is sent again (a duplicate of a conflict, one of the longest
/// decisions), and an authority older than the object is refused.
fn long_fixture(dir: &std::path::Path) -> String {
    use crate::common::{body, T};
    let object = "card-with-a-long-identity";
    let applied = body("e-a-long-event-id-1", object, Some("2"), T, r#"{"s":"b"}"#);
    let conflict = body("e-a-long-event-id-2", object, Some("2"), T, r#"{"s":"c"}"#);
    let fixture = format!(
        r#"{{"initial_state": {{"{object}": {{"version": 1, "state": {{"s":"a"}}}}}},
            "deliveries": [{{"body": {applied}}}, {{"body": {conflict}}}, {{"body": {conflict}}}],
            "authority": [{{"object_id": "{object}", "version": 0, "state": {{"s":"a"}},
                           "as_of": "{T}"}}]}}"#
    );
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("long.json");
    std::fs::write(&path, fixture).unwrap();
    path.to_str().unwrap().to_owned()
}

#[test]
fn the_text_table_stays_aligned_for_long_ids_and_decisions() {
    let dir = std::env::temp_dir().join(format!("sr-cli-long-{}", std::process::id()));
    let fixture = long_fixture(&dir);
    let o = run(&["replay", &fixture]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let table: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("== deliveries"))
        .take_while(|l| !l.starts_with("== final"))
        .collect();
    // Every column is as wide as its widest cell: the ids (19 and 25
    // characters) and the refused authority's reason.
    let expected = [
        "== deliveries (arrival order) ==",
        "  #  event               object                    decision                                                                                                                                          ver paused repl  ack         state after",
        "  1  e-a-long-event-id-1 card-with-a-long-identity applied                                                                                                                                             2 false  yes   acknowledge {\"s\":\"b\"}",
        "     ack means: recorded and done",
        "  2  e-a-long-event-id-2 card-with-a-long-identity conflict (version_state)                                                                                                                            2 true   no    acknowledge {\"s\":\"b\"}",
        "     ack means: responsibility accepted for reconciliation; state not applied",
        "  3  e-a-long-event-id-2 card-with-a-long-identity duplicate (original: conflict (version_state))                                                                                                      2 true   no    acknowledge {\"s\":\"b\"}",
        "     ack means: responsibility accepted for reconciliation; state not applied",
        "",
        "== reconciliation ==",
        "  4  -                   card-with-a-long-identity authority_refused (authority for `card-with-a-long-identity` has version 0, older than the object's version 2; refused, the object is unchanged)    2 true   no    -           {\"s\":\"b\"}",
        "",
    ];
    assert_eq!(table, expected, "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_expected_reject_or_refusal_prints_nothing_on_stderr_without_v() {
    let dir = std::env::temp_dir().join(format!("sr-cli-quiet-{}", std::process::id()));
    let fixture = long_fixture(&dir);
    // Every body names ids longer than 8 bytes: three rejects, then a
    // refused authority (older than the object).
    let args = [
        "replay",
        &fixture,
        "--max-id-bytes",
        "8",
        "--format",
        "json",
    ];
    let o = run(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let decisions: Vec<String> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["decision"].to_string())
        .collect();
    assert_eq!(
        decisions,
        [
            r#""reject""#,
            r#""reject""#,
            r#""reject""#,
            r#""authority_refused""#,
            "null"
        ]
    );
    assert_eq!(stderr(&o), "");
    // With -v they are there, at info.
    let o = run(&[&["-v"][..], &args].concat());
    let err = stderr(&o);
    let info: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("delivery rejected") || l.contains("authority older"))
        .collect();
    assert_eq!(info.len(), 4, "{err}");
    assert!(info.iter().all(|l| l.contains(" INFO ")), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The subcommands of this build (the suite's: every feature).
const COMMANDS: [&str; 11] = [
    "replay",
    "publish",
    "consume",
    "loadtest",
    "serve",
    "sign",
    "inspect",
    "audit",
    "reconcile",
    "purge",
    "fill",
];

/// No line of any `--help` or `-h` is wider than 100 characters (clap
/// itself wraps only with its `wrap_help` feature; the tool wraps).
#[test]
fn every_help_line_fits_in_100_columns() {
    let mut checked = 0;
    for command in std::iter::once("").chain(COMMANDS) {
        for flag in ["--help", "-h"] {
            let args: Vec<&str> = [command, flag]
                .into_iter()
                .filter(|a| !a.is_empty())
                .collect();
            let o = run(&args);
            assert!(o.status.success(), "{args:?}: {}", stderr(&o));
            let text = stdout(&o);
            for line in text.lines() {
                assert!(
                    line.chars().count() <= 100,
                    "{args:?}: a line of {} characters:\n{line}",
                    line.chars().count()
                );
                checked += 1;
            }
            // Nothing was lost: every word of the unwrapped help is there.
            assert!(text.contains("Usage: snapshot-receiver"), "{text}");
        }
    }
    assert!(checked > 500, "{checked} lines");
    // A clap note is kept whole, on one line.
    let serve = stdout(&run(&["serve", "--help"]));
    assert!(
        serve.lines().any(|l| l
            .trim_end()
            .ends_with("[env: SNAPSHOT_RECEIVER_OPERATOR_TOKEN]")),
        "{serve}"
    );
}

/// A number flag's bad value is answered in words, naming the flag and the
/// value once (Rust's `invalid digit found in string` and `invalid float
/// literal`, and clap's `0 is not in 1..18446744073709551615`, are not words).
#[test]
fn number_flags_are_refused_in_words() {
    let fixture = "fixtures/B62-15-events.json";
    for (args, said) in [
        (
            vec!["replay", fixture, "--audit-retention", "a week"],
            "error: invalid value 'a week' for '--audit-retention <SECONDS>': not a number (for example 30 or 0.5)",
        ),
        (
            vec!["replay", fixture, "--max-body-bytes", "1MB"],
            "error: invalid value '1MB' for '--max-body-bytes <BYTES>': not a whole number (digits only, for example 64)",
        ),
        (
            vec!["replay", fixture, "--max-held-per-object", "99999999999999999999999"],
            "error: invalid value '99999999999999999999999' for '--max-held-per-object <EVENTS>': too large a number for this flag",
        ),
        (
            vec!["replay", fixture, "--max-depth", "0"],
            "error: invalid value '0' for '--max-depth <LEVELS>': 0 is out of range: expected a whole number, 1 or more",
        ),
        (
            vec!["purge", "--store", "sqlite:x.db", "--batch", "many"],
            "error: invalid value 'many' for '--batch <ROWS>': not a whole number, 1 or more (digits only)",
        ),
        (
            vec!["loadtest", "--objects", "ten"],
            "error: invalid value 'ten' for '--objects <OBJECTS>': not a whole number (digits only, for example 64)",
        ),
    ] {
        let o = run(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = stderr(&o);
        assert_eq!(err.lines().next(), Some(said), "{args:?}: {err}");
        for rust in ["invalid digit", "invalid float", "is not in", "number too large"] {
            assert!(!err.contains(rust), "{args:?}: {err}");
        }
    }
}

/// One cause, one exit code and one message, whichever command meets it:
/// a PostgreSQL server that does not answer is 1 (the store could not be
/// opened) from every command that opens a store, and the message names
/// the location once; a `--store` that is not a location is 2, named with
/// its flag before anything is opened.
#[test]
fn a_store_that_does_not_answer_exits_1_from_every_command() {
    // Port 1 of loopback: nothing listens there.
    let url = "postgres://postgres@127.0.0.1:1/test";
    let expected = format!(
        "error: store failure: postgres: cannot connect to {url}: error connecting to server: \
         Connection refused (os error 111)"
    );
    let dir = crate::serve::scratch("unanswered-store");
    let snapshot = dir.join("snapshot.jsonl");
    std::fs::write(
        &snapshot,
        r#"{"object_id":"card-7","version":14,"state":{},"as_of":"2024-01-01T08:00:20Z"}"#,
    )
    .unwrap();
    let snapshot = snapshot.to_str().unwrap();
    let fixture = crate::common::repo("fixtures/B62-15-events.json");
    for args in [
        vec!["replay", fixture.to_str().unwrap(), "--store", url],
        vec!["serve", "--listen", "127.0.0.1:0", "--store", url],
        vec!["inspect", "--store", url],
        vec!["audit", "--store", url, "--event", "e-201"],
        vec!["reconcile", "--store", url, "--snapshot", snapshot],
        vec!["purge", "--store", url],
    ] {
        let o = crate::common::cli()
            .args(&args)
            .current_dir(&dir)
            .output()
            .unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.trim_end(), expected, "{args:?}");
        assert_eq!(err.matches(url).count(), 1, "{args:?}: {err}");
    }
    for args in [
        vec![
            "replay",
            "fixtures/B62-15-events.json",
            "--store",
            "sqlite:",
        ],
        vec!["serve", "--store", "sqlite:"],
        vec!["inspect", "--store", "sqlite:"],
    ] {
        let o = run(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(
            err.lines().next(),
            Some(
                "error: invalid value 'sqlite:' for '--store <LOCATION>': `sqlite:` has no path: \
                 write sqlite:PATH, for example sqlite:receiver.db"
            ),
            "{args:?}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A cause the error's own message already holds is not printed again
/// (async-nats' connection error repeats its source's text, which repeats
/// the operating system's).
#[test]
fn an_unreachable_nats_server_is_named_once() {
    let dir = crate::serve::scratch("unanswered-nats");
    let store = format!("sqlite:{}", dir.join("c.db").display());
    let o = run(&[
        "consume",
        "--nats",
        "nats://127.0.0.1:1",
        "--stream",
        "S",
        "--store",
        &store,
    ]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(
        err.trim_end(),
        "error: cannot connect to NATS at nats://127.0.0.1:1: IO error: Connection refused (os error 111)"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `fill --held` writes held events on paused objects: a receiver on the
/// store keeps none of their bodies in memory and reads them back when a
/// reconciliation decides the events again (docs/CONTRACT.md §9).
#[test]
fn fill_writes_held_events_a_receiver_decides_after_reconciliation() {
    use snapshot_receiver::core::engine::{ReevaluationOutcome, STORED_WAITING_OVERHEAD};
    use snapshot_receiver::AuthoritativeSnapshot;
    let dir = std::env::temp_dir().join(format!("sr-fill-held-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let store = format!("sqlite:{}", dir.join("held.db").display());
    let o = crate::common::cli()
        .args([
            "fill",
            "--store",
            &store,
            "--objects",
            "3",
            "--receipts",
            "0",
        ])
        .args(["--held", "5", "--held-bytes", "500"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        format!(
            "filled {store}: 3 objects and 0 receipts and 5 held events on 3 paused objects written; the store holds 3 objects and 0 identities\n"
        )
    );
    crate::common::runtime().block_on(async {
        let rx = snapshot_receiver::Receiver::builder()
            .store(&store)
            .build()
            .unwrap();
        let held: Vec<(u64, bool, usize)> = rx
            .objects()
            .await
            .iter()
            .map(|o| (o.version, o.paused, o.held))
            .collect();
        assert_eq!(held, [(1, true, 2), (1, true, 2), (1, true, 1)]);
        assert_eq!(
            rx.memory_bytes().await.waiting,
            5 * ("fill-h-0".len() + STORED_WAITING_OVERHEAD)
        );
        let authority =
            AuthoritativeSnapshot::new("obj-0", 1, r#"{"v":1}"#, std::time::UNIX_EPOCH).unwrap();
        let report = rx.reconcile(authority).await.unwrap();
        let lines: Vec<(String, String)> = report
            .reevaluated
            .iter()
            .map(|r| match r.outcome {
                ReevaluationOutcome::Decided(v, _) => (r.event_id.to_string(), v.code()),
                ReevaluationOutcome::Unresolved(v) => (r.event_id.to_string(), v.code()),
            })
            .collect();
        assert_eq!(
            lines,
            [
                ("fill-h-0".to_owned(), "applied".to_owned()),
                ("fill-h-3".to_owned(), "equal".to_owned())
            ]
        );
        assert_eq!(rx.object("obj-0").await.unwrap().version, 2);
        rx.shutdown().await;
    });
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `fill` writes objects and receipts a receiver then resumes from: the
/// body of a filled receipt is a duplicate of it, another content under its
/// id a variant, a new event is applied; a second fill of the store is
/// refused (exit 2) and writes nothing.
#[test]
fn fill_writes_objects_and_receipts_a_receiver_resumes_from() {
    use snapshot_receiver::{ConflictKind, Decision, Receiver, Verdict};
    let dir = std::env::temp_dir().join(format!("sr-fill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let store = format!("sqlite:{}", dir.join("big.db").display());
    let fill = |extra: &[&str]| {
        crate::common::cli()
            .args([
                "fill",
                "--store",
                &store,
                "--objects",
                "7",
                "--receipts",
                "25",
            ])
            .args(extra)
            .output()
            .unwrap()
    };
    let o = fill(&["--batch", "10"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        format!(
            "filled {store}: 7 objects and 25 receipts written; the store holds 7 objects and 25 identities\n"
        )
    );
    let again = fill(&[]);
    assert_eq!(again.status.code(), Some(2), "{}", stdout(&again));
    assert_eq!(
        stderr(&again),
        "error: the store already holds receipts among fill-e-0..fill-e-24: fill an empty store\n"
    );
    crate::common::runtime().block_on(async {
        let rx = Receiver::builder().store(&store).build().unwrap();
        assert_eq!(rx.objects().await.len(), 7);
        let filled = r#"{"event_id":"fill-e-10","object_id":"obj-3","object_version":1,"type":"card.snapshot","state":{"v":1}}"#;
        assert_eq!(
            rx.deliver(filled.as_bytes()).await.decision(),
            Some(Decision::Duplicate {
                original: Verdict::Applied
            })
        );
        let other = r#"{"event_id":"fill-e-11","object_id":"obj-4","object_version":1,"type":"card.snapshot","state":{"v":2}}"#;
        assert_eq!(
            rx.deliver(other.as_bytes()).await.decision(),
            Some(Decision::Conflict(ConflictKind::EventVariant))
        );
        let new = r#"{"event_id":"e-1","object_id":"obj-6","object_version":2,"type":"card.snapshot","state":{"v":2}}"#;
        assert_eq!(rx.deliver(new.as_bytes()).await.decision(), Some(Decision::Applied));
        rx.shutdown().await;
    });
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--log-format json` writes every log line as one JSON object on stderr,
/// its keys in the documented order, and keeps stdout as it is.
#[test]
fn log_format_json_writes_one_object_per_line_with_the_delivery_fields() {
    let json = run(&[
        "--log-format",
        "json",
        "-v",
        "replay",
        "fixtures/B62-15-events.json",
    ]);
    assert!(json.status.success(), "{}", stderr(&json));
    let text = run(&["-v", "replay", "fixtures/B62-15-events.json"]);
    assert_eq!(stdout(&json), stdout(&text));
    let err = stderr(&json);
    let lines: Vec<serde_json::Value> = err
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(lines.len(), stderr(&text).lines().count());
    let mut first = lines[0].clone();
    let time = first["time"].take();
    assert!(
        snapshot_receiver::parse_rfc3339(time.as_str().unwrap()).is_some(),
        "{time}"
    );
    assert_eq!(
        first,
        serde_json::json!({
            "time": null,
            "level": "info",
            "target": "snapshot_receiver::receiver",
            "message": "delivery recorded",
            "event_id": "e-201",
            "object_id": "card-7",
            "decision": "applied",
            "ack": "acknowledge",
        })
    );
    // The keys' order, on the text (a parsed map sorts them).
    assert!(
        err.lines().next().unwrap().starts_with(r#"{"time":""#)
            && err.lines().next().unwrap().contains(r#"Z","level":"info","target":"snapshot_receiver::receiver","message":"delivery recorded","event_id":"e-201","object_id":"card-7","decision":"applied","ack":"acknowledge"}"#),
        "{err}"
    );
}

/// A `--log-format` the tool does not know is refused naming the choices.
#[test]
fn an_unknown_log_format_is_refused_naming_the_choices() {
    let o = run(&[
        "--log-format",
        "yaml",
        "replay",
        "fixtures/B62-15-events.json",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("invalid value 'yaml' for '--log-format <LOG_FORMAT>'")
            && stderr(&o).contains("[possible values: text, json]"),
        "{}",
        stderr(&o)
    );
}

/// `replay` in text escapes what a sender chose: an object id with a
/// colour change, a line break and a right-to-left override, an event id
/// with a C1 CSI, a bell and an isolate are shown as `\u{..}` / `\n`, in
/// the table and in the final section; the JSON Lines keep them as sent.
#[test]
fn replay_text_escapes_control_characters_of_ids() {
    let object = "card-\u{1b}[31mX\nforged line\u{202e}";
    let event = "e-\u{9b}2J\u{7}\u{2066}1";
    let (object_shown, event_shown) = (
        r"card-\u{1b}[31mX\nforged line\u{202e}",
        r"e-\u{9b}2J\u{7}\u{2066}1",
    );
    let fixture = serde_json::json!({
        "initial_state": {object: {"version": 1, "state": {"stage": "queued"}}},
        "deliveries": [{
            "transport": {"attempt": 1, "received_at": "2024-01-01T08:00:01Z"},
            "body": {
                "event_id": event, "object_id": object, "object_version": 2,
                "occurred_at": "2024-01-01T08:00:00Z", "type": "card.snapshot",
                "state": {"stage": "ready\u{7}"}
            }
        }]
    });
    let dir = std::env::temp_dir().join(format!("sr-cli-escape-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("hostile.json");
    std::fs::write(&path, fixture.to_string()).unwrap();
    let path = path.to_str().unwrap();

    let o = run(&["replay", path]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    // Nothing a terminal would act on: no control character but the line
    // ends, no bidi control.
    assert!(
        !out.chars().any(|c| (c.is_control() && c != '\n')
            || ('\u{2066}'..='\u{2069}').contains(&c)
            || ('\u{202a}'..='\u{202e}').contains(&c)),
        "{out:?}"
    );
    let row = out.lines().find(|l| l.starts_with("  1  ")).unwrap();
    assert!(
        row.starts_with(&format!("  1  {event_shown} {object_shown} applied ")),
        "{row:?}"
    );
    // The state's escape is JSON's (a JSON text), shown as it arrived.
    assert!(row.ends_with(r#"{"stage":"ready\u0007"}"#), "{row:?}");
    let final_line = out
        .lines()
        .skip_while(|l| *l != "== final ==")
        .nth(1)
        .unwrap();
    assert_eq!(
        final_line,
        format!(r#"{object_shown} v2 {{"stage":"ready\u0007"}}"#)
    );

    let o = run(&["replay", path, "--format", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let first: serde_json::Value =
        serde_json::from_str(stdout(&o).lines().next().unwrap()).unwrap();
    assert_eq!(
        (&first["event_id"], &first["object_id"]),
        (&serde_json::json!(event), &serde_json::json!(object))
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn replay_says_what_is_wrong_with_a_malformed_body() {
    let dir = std::env::temp_dir().join(format!("sr-cli-malformed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("malformed.json");
    // A number, then an object with a duplicate key: both held as malformed,
    // each with what is wrong and where.
    let raw_dup = r#"{\"event_id\":\"e-1\",\"object_id\":\"card-7\",\"object_id\":\"card-8\"}"#;
    std::fs::write(
        &path,
        format!(
            r#"{{"initial_state": {{"card-7": {{"version": 1, "state": {{}}}}}},
                "deliveries": [{{"raw": "5"}}, {{"raw": "{raw_dup}"}}]}}"#
        ),
    )
    .unwrap();
    let o = run(&["replay", path.to_str().unwrap(), "--format", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let details: Vec<&serde_json::Value> = lines.iter().map(|l| &l["detail"]).collect();
    assert_eq!(
        details,
        [
            &serde_json::json!("top-level value is a number, not an object at byte 0"),
            &serde_json::json!("duplicate key \"object_id\" at byte 39"),
            // The final line has no detail.
            &serde_json::Value::Null,
        ]
    );
    assert_eq!(lines[2].get("detail"), None, "the final line leaves it out");
    let o = run(&["replay", path.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("\n     malformed: top-level value is a number, not an object at byte 0\n"),
        "{text}"
    );
    assert!(
        text.contains("\n     malformed: duplicate key \"object_id\" at byte 39\n"),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
