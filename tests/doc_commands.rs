//! Every command block of the README and the guides (README.md, docs/*.md,
//! loom-tests/README.md), run as written or skipped for a reason written
//! down here; and every link between those documents resolves.
//!
//! A block is fenced as ```sh, ```bash, ```shell or ```console (a console
//! block's commands start with `$ `; the lines after one are its output).
//! Each command in it (continuation lines joined, a `for ... done` loop as
//! one) must match exactly one entry of [`PLANS`] (its document and the
//! start of its text), and every entry must match a command: a block added
//! to a document without an entry fails the test, and so does an entry
//! left behind by a block that changed or went away.
//!
//! The commands of one document that run are one bash session
//! (`set -eE -o pipefail`), in document order, in a scratch directory that
//! has the repository's `fixtures/` (a symbolic link), so a variable a block
//! sets is there for the blocks after it, as in a reader's shell. They run
//! as written except for these substitutions, which every command gets:
//! - `cargo run FLAGS --` (naming no other target than the tool) and
//!   `target/release/snapshot-receiver` become `snapshot-receiver`, and
//!   that is this test's build of the tool (first on `PATH`); the flags are
//!   checked as a skipped command's are (below);
//! - `postgres://postgres@127.0.0.1:5432/test` becomes the test server
//!   (`SNAPSHOT_RECEIVER_PG_URL`; without one the document's session is
//!   skipped, except under `CI`), and `--store-schema inbox` a schema of
//!   this run (dropped at the end);
//! - `/tmp/` becomes the scratch directory, and `127.0.0.1:8080` a free
//!   port of loopback.
//!
//! Every command's cargo flags are checked, run or not (the packages,
//! features and targets it names exist: `cargo tree` and `cargo metadata`,
//! offline), and every repository path any command names must exist. A
//! `cargo run` of the tool must build the features its own command needs
//! (`serve` for `serve` and `sign`, `jetstream` for `publish` and
//! `consume`, `loadtest`, `postgres` for a `postgres://` store): the test
//! runs it on its all-features build, and without that check a command
//! that fails as written, for want of a feature, would pass here.

use crate::common::repo_root;
use serde_json::Value;
use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What the test does with a command.
#[derive(Debug)]
enum Plan {
    /// Run; it must exit 0.
    Run,
    /// Run; it must exit 0, and the document's next fenced block after the
    /// command's own shows its standard output (with that of the block's
    /// other `RunShows` commands, in order; the shown block is found in
    /// what they printed, so a block may show only the end of it).
    RunShows,
    /// A measurement: run with these replacements (sizes scaled down), so
    /// its flags and its exit status (the load tests' correctness check)
    /// are checked, not its figures.
    Scaled(&'static [(&'static str, &'static str)]),
    /// A server the document's next blocks talk to: started in the
    /// background with `--listen 127.0.0.1:PORT` appended (the document
    /// relies on the default 127.0.0.1:8080), waited for until it prints
    /// `listening on`, stopped with SIGTERM when the session ends.
    Server,
    /// Run by the test named here (`file::function`), which checks more
    /// than an exit status.
    CoveredBy(&'static str),
    /// Not run, for this reason.
    Skip(&'static str),
}

use Plan::*;

const WHOLE_SUITE: &str = "runs the whole test suite, this test included";
const RELEASE_BUILD: &str =
    "a release build of the whole tool (about 20 minutes on a 2-core machine): the test uses its own build";
const STORE_SIZE: &str = "the store-size measurement: 100,000 deliveries replayed by a release build into a SQLite file (minutes)";
const LOOM: &str = "runs the loom models (release builds under other RUSTFLAGS, several minutes): loom-tests/run.sh is .ci/run's step";
/// The load tests, scaled down: a few thousand deliveries instead of millions.
const FEWER: &[(&str, &str)] = &[
    ("--deliveries 2000000", "--deliveries 3000"),
    ("--deliveries 1000000", "--deliveries 3000"),
    ("--deliveries 100000", "--deliveries 3000"),
    ("--deliveries 50000", "--deliveries 3000"),
    // Without --deliveries: 10,000 objects x 20 versions and more.
    (
        "--target compare --batch 64",
        "--target compare --batch 64 --deliveries 3000",
    ),
];

/// Every command of the documents: (document, start of the command, plan).
/// The start is matched against the command with its continuation lines
/// joined by one space.
const PLANS: &[(&str, &str, Plan)] = &[
    // README.md
    ("README.md", "cargo run -- replay fixtures/B62-15-events.json", RunShows),
    (
        "README.md",
        "cargo test --quiet",
        Skip("the quick tests: every default member's tests with default features, a build of their own (minutes)"),
    ),
    ("README.md", "cargo test --locked --all-features", Skip(WHOLE_SUITE)),
    (
        "README.md",
        "cargo install --locked --path cli --features serve",
        Skip("installs the tool into ~/.cargo/bin (a release build of the serve feature, at most 150 crates)"),
    ),
    ("README.md", "export SNAPSHOT_RECEIVER_WEBHOOK_SECRET=", Run),
    ("README.md", "export SNAPSHOT_RECEIVER_OPERATOR_TOKEN=", Run),
    (
        "README.md",
        "snapshot-receiver serve --initial fixtures/B62-15-events.json",
        CoveredBy("tests/readme.rs::the_readme_service_walkthrough_answers_as_shown"),
    ),
    (
        "README.md",
        "snapshot-receiver sign --post http://127.0.0.1:8080/events",
        CoveredBy("tests/readme.rs::the_readme_service_walkthrough_answers_as_shown"),
    ),
    (
        "README.md",
        "mkdir -p authority && echo",
        CoveredBy("tests/readme.rs::the_readme_service_walkthrough_answers_as_shown"),
    ),
    (
        "README.md",
        "python3 -m http.server 9001",
        CoveredBy("tests/readme.rs::the_readme_service_walkthrough_answers_as_shown"),
    ),
    (
        "README.md",
        "until curl -s -H \"Authorization: Bearer $SNAPSHOT_RECEIVER_OPERATOR_TOKEN\" http://127.0.0.1:8080/objects/card-7",
        CoveredBy("tests/readme.rs::the_readme_service_walkthrough_answers_as_shown"),
    ),
    (
        "README.md",
        "curl -s -w '\\n' -H \"Authorization: Bearer $SNAPSHOT_RECEIVER_OPERATOR_TOKEN\" http://127.0.0.1:8080/objects/card-7",
        CoveredBy("tests/readme.rs::the_readme_service_walkthrough_answers_as_shown"),
    ),
    ("README.md", "export SNAPSHOT_RECEIVER_FORWARD_SECRET=", Run),
    (
        "README.md",
        "snapshot-receiver relay --store sqlite:snapshot-receiver.db --forward",
        CoveredBy("tests/forward.rs::the_relay_command_forwards_what_a_store_recorded_and_resumes_at_its_cursor"),
    ),
    // docs/BENCHMARKS-jetstream.md
    (
        "docs/BENCHMARKS-jetstream.md",
        "cargo build --release -p snapshot-receiver-cli --features full --bin snapshot-receiver",
        Skip(RELEASE_BUILD),
    ),
    (
        "docs/BENCHMARKS-jetstream.md",
        "cargo build --release -p snapshot-receiver --features sqlite,postgres,jetstream --example jetstream_bench",
        Skip("a release build of the JetStream benchmark (several minutes)"),
    ),
    (
        "docs/BENCHMARKS-jetstream.md",
        "target/release/examples/jetstream_bench",
        Skip("the JetStream benchmark: 1 to 3 consumer processes over hundreds of thousands of messages (tens of minutes)"),
    ),
    ("docs/BENCHMARKS-jetstream.md", "cargo build --release --features full", Skip(RELEASE_BUILD)),
    (
        "docs/BENCHMARKS-jetstream.md",
        "cargo run --release --example jetstream_bench --",
        Skip("the JetStream benchmark (tens of minutes, after a release build)"),
    ),
    // docs/BENCHMARKS.md
    (
        "docs/BENCHMARKS.md",
        "python3 benches/store-size/stream.py 100000",
        Skip(STORE_SIZE),
    ),
    (
        "docs/BENCHMARKS.md",
        "target/release/snapshot-receiver replay /tmp/stream.json",
        Skip(STORE_SIZE),
    ),
    (
        "docs/BENCHMARKS.md",
        "sqlite3 /tmp/s.db",
        Skip("reads the store-size run's file with the sqlite3 shell (a measurement, not a check; tests/retention.rs checks the sizes)"),
    ),
    (
        "docs/BENCHMARKS.md",
        "bash benches/run-all.sh",
        Skip("every load measurement, release builds (about 10 minutes)"),
    ),
    (
        "docs/BENCHMARKS.md",
        "bash benches/waiting-startup.sh",
        Skip("the start-up on 100,000 waiting bodies: a release build, a filled store, a serve (minutes)"),
    ),
    (
        "docs/BENCHMARKS.md",
        "benches/serve-http/run.sh",
        Skip("serve against the axum example under wrk, release builds (tens of minutes)"),
    ),
    (
        "docs/BENCHMARKS.md",
        "cargo bench --bench receiver",
        Skip("all criterion groups (about 6 minutes)"),
    ),
    (
        "docs/BENCHMARKS.md",
        "target/release/snapshot-receiver loadtest",
        Scaled(FEWER),
    ),
    (
        "docs/BENCHMARKS.md",
        "cargo run --release --example memory -- 1000000",
        Skip("a release build of the memory example, then a million objects and identities per measurement"),
    ),
    (
        "docs/BENCHMARKS.md",
        "cargo tree -p snapshot-receiver -e normal --prefix none",
        Skip("counts the crates of the library's tree: a figure of the table above it, not a check"),
    ),
    (
        "docs/BENCHMARKS.md",
        "/usr/bin/time -f",
        Skip("a cold debug build of the library in an empty target directory (minutes)"),
    ),
    (
        "docs/BENCHMARKS.md",
        "cargo build --release -p snapshot-receiver-cli --features full",
        Skip(RELEASE_BUILD),
    ),
    ("docs/BENCHMARKS.md", "cargo build --release --features full", Skip(RELEASE_BUILD)),
    (
        "docs/BENCHMARKS.md",
        "cargo build --release --locked -p snapshot-receiver-cli --features serve",
        Skip("a release build of the serve feature (several minutes)"),
    ),
    (
        "docs/BENCHMARKS.md",
        "bash benches/store-writes.sh",
        Skip("the bytes-written measurements: a release build of every feature, then six load tests of 200,000 deliveries (minutes)"),
    ),
    (
        "docs/BENCHMARKS.md",
        "bash benches/pg-writes.sh",
        Skip("the PostgreSQL bytes and inbox measurements: a release build, two load tests and four pgbench pairs against a server (minutes)"),
    ),
    (
        "docs/BENCHMARKS.md",
        "bash benches/lsm-probe/run.sh",
        Skip("the LSM probe: a release build of its own workspace (fjall and SQLite), then eight runs up to 2,000,000 deliveries (about 15 minutes)"),
    ),
    (
        "docs/BENCHMARKS.md",
        "bash benches/relay.sh",
        Skip("the relay measurements: a release build of every feature, then 16 load tests of 100,000 deliveries and five more (minutes)"),
    ),
    (
        "docs/BENCHMARKS.md",
        "BIN=old/snapshot-receiver ONLY=1 bash benches/relay.sh",
        Skip("the relay's cost pairs alone for a binary built before (needs that binary; minutes)"),
    ),
    (
        "docs/BENCHMARKS.md",
        "python3 benches/memory_siege.py",
        Skip("the memory siege: thousands of 1 MiB or 100,000 small signed requests against a release build (minutes each)"),
    ),
    (
        "docs/BENCHMARKS.md",
        "valgrind --tool=callgrind",
        Skip("needs valgrind, and its `<tag>` is a name the reader picks"),
    ),
    (
        "docs/BENCHMARKS.md",
        "callgrind_annotate",
        Skip("reads the valgrind run's output (the command above)"),
    ),
    ("docs/BENCHMARKS.md", "bin=target/release/snapshot-receiver", Run),
    ("docs/BENCHMARKS.md", "args=\"--objects 1000", Run),
    (
        "docs/BENCHMARKS.md",
        "for batch in 1 64; do",
        Skip("creates a PostgreSQL database per run with psql; the same in-memory and SQLite runs are the loadtest lines above, run scaled"),
    ),
    (
        "docs/BENCHMARKS.md",
        "for o_d in",
        Skip("up to a million objects and two million deliveries a run on SQLite, release build (minutes each)"),
    ),
    (
        "docs/BENCHMARKS.md",
        "psql -h 127.0.0.1 -U postgres -c \"CREATE DATABASE lt\"",
        Skip("creates the PostgreSQL database of the scale run below"),
    ),
    (
        "docs/BENCHMARKS.md",
        "$bin loadtest --soak --deliveries 20000000",
        Skip("22 million deliveries through a durable receiver (about 35 minutes, a 13 GB file)"),
    ),
    (
        "docs/BENCHMARKS.md",
        "$bin loadtest --objects 1000000",
        Skip("a million objects seeded into PostgreSQL and 200,000 deliveries, release build (about two minutes)"),
    ),
    // docs/CONTRACT.md
    (
        "docs/CONTRACT.md",
        "cargo run --release -- replay fixtures/shipments-rehearsal.json --history",
        Run,
    ),
    // docs/DEPLOYMENT.md
    // The reference fixture with its times moved into the last hour.
    ("docs/DEPLOYMENT.md", "sed \"s/2024-01-01T08:/", Run),
    (
        "docs/DEPLOYMENT.md",
        "snapshot-receiver publish /tmp/deliveries.json",
        CoveredBy("tests/jetstream.rs::three_consumers_one_killed_and_restarted_equal_one_in_memory_replay"),
    ),
    (
        "docs/DEPLOYMENT.md",
        "snapshot-receiver consume --nats",
        CoveredBy("tests/jetstream.rs::three_consumers_one_killed_and_restarted_equal_one_in_memory_replay"),
    ),
    (
        "docs/DEPLOYMENT.md",
        "cargo run -- replay fixtures/B62-15-events.json --store sqlite:inbox.db",
        Run,
    ),
    (
        "docs/DEPLOYMENT.md",
        "cargo run --features postgres -- replay fixtures/B62-15-events.json --store postgres://",
        Run,
    ),
    (
        "docs/DEPLOYMENT.md",
        "cargo run --release -- fill --store sqlite:/tmp/big.db",
        Scaled(&[("--objects 100000 --receipts 5000000", "--objects 100 --receipts 3000")]),
    ),
    ("docs/DEPLOYMENT.md", "cargo run --release -- inspect --store sqlite:/tmp/big.db", Run),
    // docs/HOSTILE-INPUT.md
    (
        "docs/HOSTILE-INPUT.md",
        "cargo install cargo-fuzz",
        Skip("installs a cargo subcommand"),
    ),
    (
        "docs/HOSTILE-INPUT.md",
        "fuzz/run.sh",
        Skip("fuzzing: a nightly toolchain and cargo-fuzz, 60 s or more per target"),
    ),
    (
        "docs/HOSTILE-INPUT.md",
        "MINIMIZE=1 fuzz/run.sh",
        Skip("fuzzing: a nightly toolchain and cargo-fuzz, 10 minutes per target"),
    ),
    // docs/SERVE.md
    ("docs/SERVE.md", "export SNAPSHOT_RECEIVER_WEBHOOK_SECRET=", Run),
    ("docs/SERVE.md", "export SNAPSHOT_RECEIVER_OPERATOR_TOKEN=", Run),
    (
        "docs/SERVE.md",
        "snapshot-receiver serve --initial fixtures/B62-15-events.json",
        Server,
    ),
    ("docs/SERVE.md", "secret=whsec_", Run),
    ("docs/SERVE.md", "body='{\"event_id\":\"e-901\"", Run),
    ("docs/SERVE.md", "id=\"msg-$(date +%s%N)\"; ts=$(date +%s)", Run),
    ("docs/SERVE.md", "key=$(printf", Run),
    ("docs/SERVE.md", "sig=$(printf", Run),
    // The signed event: its receipt is checked by
    // serve::the_readme_curl_example_works_as_written.
    ("docs/SERVE.md", "curl -s -X POST http://127.0.0.1:8080/events", Run),
    (
        "docs/SERVE.md",
        "snapshot-receiver sign --secret \"$secret\" --post",
        RunShows,
    ),
    (
        "docs/SERVE.md",
        "curl -s -w '\\n' -H \"Authorization: Bearer change-me\" 'http://127.0.0.1:8080/objects?paused=true'",
        Run,
    ),
    (
        "docs/SERVE.md",
        "snapshot-receiver inspect --store sqlite:snapshot-receiver.db",
        Run,
    ),
    (
        "docs/SERVE.md",
        "curl -s -w '\\n' -X POST http://127.0.0.1:8080/reconcile",
        RunShows,
    ),
    // docs/TESTING.md
    (
        "docs/TESTING.md",
        "cargo install cargo-mutants --locked",
        Skip("installs a cargo subcommand"),
    ),
    (
        "docs/TESTING.md",
        "CARGO_PROFILE_DEV_DEBUG=0 CARGO_PROFILE_TEST_DEBUG=0 cargo mutants",
        Skip("mutation testing (the core, the front door, the shard task and commit group, the working set and identity filter, the take-over code, the identity scan, retention, the receiver's builder): 1 to 80 minutes each on a 2-core machine"),
    ),
    (
        "docs/TESTING.md",
        "bash sim/run.sh",
        Skip("the cluster simulation (a release build, 10,000 seeds or a million): sim/run.sh is .ci/run's step"),
    ),
    (
        "docs/TESTING.md",
        "cargo run --release -p snapshot-receiver-sim -- --seed 288",
        Skip("a release build of the simulator; sim/tests/sim.rs replays seed 288 under cargo test"),
    ),
    // loom-tests/README.md
    ("loom-tests/README.md", "loom-tests/run.sh", Skip(LOOM)),
    (
        "loom-tests/README.md",
        "RUSTFLAGS=\"--cfg snapshot_receiver_loom\" LOOM_MAX_PREEMPTIONS=5",
        Skip(LOOM),
    ),
    (
        "loom-tests/README.md",
        "RUSTFLAGS=\"--cfg snapshot_receiver_loom --cfg snapshot_receiver_loom_broken\"",
        Skip(LOOM),
    ),
];

/// The documents checked, relative to the repository's top folder.
fn documents() -> Vec<String> {
    let mut docs: Vec<String> = std::fs::read_dir(repo_root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    docs.sort();
    docs.insert(0, "README.md".to_owned());
    docs.push("loom-tests/README.md".to_owned());
    docs
}

fn read(doc: &str) -> String {
    std::fs::read_to_string(repo_root().join(doc)).unwrap_or_else(|e| panic!("{doc}: {e}"))
}

/// A fenced block: its info string, the line of its opening fence (from 1)
/// and its lines with their numbers.
struct Block {
    lang: String,
    line: usize,
    lines: Vec<(usize, String)>,
}

const SHELL: [&str; 4] = ["sh", "bash", "shell", "console"];

/// The fenced blocks of `doc`; a fence without a language is an error (a
/// command block must say it is one).
fn blocks(doc: &str, text: &str) -> Result<Vec<Block>, String> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let t = line.trim_start();
        match open.take() {
            Some(block) if t.trim_end() == "```" => out.push(block),
            Some(mut block) => {
                block.lines.push((n, line.to_owned()));
                open = Some(block);
            }
            None if t.starts_with("```") => {
                let lang = t[3..].trim().to_owned();
                if lang.is_empty() {
                    return Err(format!(
                        "{doc}:{n}: a fenced block without a language (```sh for commands, ```text for output)"
                    ));
                }
                open = Some(Block {
                    lang,
                    line: n,
                    lines: Vec::new(),
                });
            }
            None => {}
        }
    }
    match open {
        Some(block) => Err(format!("{doc}:{}: a fenced block never closed", block.line)),
        None => Ok(out),
    }
}

/// One command of a block.
#[derive(Debug)]
struct Cmd {
    doc: String,
    /// The line it starts on.
    line: usize,
    /// The index of its block in the document's blocks.
    block: usize,
    /// As bash reads it (continuations kept).
    text: String,
    /// On one line: continuations joined by one space, runs of spaces as one.
    key: String,
    /// What a console block shows after it.
    shown: Option<String>,
}

/// `line` without a trailing `# comment` (a `#` outside quotes after a space).
fn strip_comment(line: &str) -> &str {
    let (mut single, mut double, mut prev) = (false, false, ' ');
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && prev.is_whitespace() => return line[..i].trim_end(),
            _ => {}
        }
        prev = c;
    }
    line
}

/// How far `line` opens (+) or closes (-) a compound command.
fn depth_change(line: &str) -> i32 {
    strip_comment(line)
        .split(|c: char| c.is_whitespace() || c == ';')
        .map(|word| match word {
            "for" | "while" | "until" | "if" | "case" => 1,
            "done" | "fi" | "esac" => -1,
            _ => 0,
        })
        .sum()
}

fn one_line(text: &str) -> String {
    text.replace("\\\n", " ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The commands of `doc`'s shell blocks.
fn commands(doc: &str, blocks: &[Block]) -> Vec<Cmd> {
    let mut out = Vec::new();
    for (b, block) in blocks.iter().enumerate() {
        if !SHELL.contains(&block.lang.as_str()) {
            continue;
        }
        let console = block.lang == "console";
        let mut current: Option<(usize, String)> = None;
        let mut depth = 0;
        for (n, raw) in &block.lines {
            let t = raw.trim();
            let line = if current.is_some() {
                raw.as_str()
            } else if console {
                match t.strip_prefix("$ ") {
                    Some(command) => command,
                    None => {
                        // Output of the previous command.
                        if let Some(last) = out.last_mut().filter(|c: &&mut Cmd| c.block == b) {
                            let shown = last.shown.get_or_insert_with(String::new);
                            shown.push_str(raw);
                            shown.push('\n');
                        }
                        continue;
                    }
                }
            } else if t.is_empty() || t.starts_with('#') {
                continue;
            } else {
                raw.as_str()
            };
            let (_, text) = current.get_or_insert_with(|| (*n, String::new()));
            text.push_str(line);
            text.push('\n');
            depth += depth_change(line);
            if !strip_comment(line).trim_end().ends_with('\\') && depth <= 0 {
                let (start, text) = current.take().unwrap();
                out.push(Cmd {
                    doc: doc.to_owned(),
                    line: start,
                    block: b,
                    key: one_line(strip_comment(&text.replace("\\\n", " "))),
                    text,
                    shown: None,
                });
                depth = 0;
            }
        }
        if let Some((start, _)) = current {
            out.push(Cmd {
                doc: doc.to_owned(),
                line: start,
                block: b,
                key: String::new(),
                text: String::new(),
                shown: None,
            });
        }
    }
    out
}

/// The plan of `cmd`, or why there is none.
fn plan_of(cmd: &Cmd) -> Result<usize, String> {
    let matching: Vec<usize> = PLANS
        .iter()
        .enumerate()
        .filter(|(_, (doc, start, _))| *doc == cmd.doc && cmd.key.starts_with(start))
        .map(|(i, _)| i)
        .collect();
    match matching[..] {
        [i] => Ok(i),
        [] if cmd.key.is_empty() => Err(format!(
            "{}:{}: a command whose continuation or loop never ends",
            cmd.doc, cmd.line
        )),
        [] => Err(format!(
            "{}:{}: `{}` is in no entry of PLANS (tests/doc_commands.rs): run it, or skip it with the reason",
            cmd.doc, cmd.line, cmd.key
        )),
        _ => Err(format!(
            "{}:{}: `{}` matches {} entries of PLANS",
            cmd.doc,
            cmd.line,
            cmd.key,
            matching.len()
        )),
    }
}

/// The words of a command line, quotes removed (enough for the flags and
/// paths checked here).
fn words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let (mut word, mut quote, mut any) = (String::new(), None, false);
    for c in one_line(strip_comment(&one_line(text))).chars() {
        match (quote, c) {
            (None, '\'' | '"') => {
                quote = Some(c);
                any = true;
            }
            (Some(q), c) if c == q => quote = None,
            (None, c) if c.is_whitespace() => {
                if any {
                    out.push(std::mem::take(&mut word));
                }
                any = false;
            }
            (_, c) => {
                word.push(c);
                any = true;
            }
        }
    }
    if any {
        out.push(word);
    }
    out
}

/// Every repository path `cmd` names exists (a word whose first component
/// is a top-level folder or file of the repository).
fn check_paths(cmd: &Cmd, problems: &mut Vec<String>) {
    let root = repo_root();
    for word in words(&cmd.text) {
        let word = word.trim_end_matches([';', ')']);
        let path = word.split_once('=').map_or(word, |(_, v)| v);
        if path.starts_with('-') || path.contains(['$', '<', '*', ':']) || !path.contains('/') {
            continue;
        }
        let first = path.split('/').next().unwrap();
        if first.is_empty() || first == "target" || !root.join(first).exists() {
            continue;
        }
        if !root.join(path).exists() {
            problems.push(format!(
                "{}:{}: `{}` names {path}, which is not in the repository",
                cmd.doc, cmd.line, cmd.key
            ));
        }
    }
}

/// `cargo metadata --no-deps` of the workspace.
fn metadata() -> Value {
    let o = cargo()
        .args([
            "metadata",
            "--offline",
            "--no-deps",
            "--format-version",
            "1",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn cargo() -> Command {
    let mut command = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()));
    command.current_dir(repo_root());
    command
}

/// A `cargo build|run|test|bench|install|tree` command: the packages and features it selects resolve (`cargo tree`), and the
/// binaries, examples and benches it names are targets of those packages.
fn check_cargo(cmd: &Cmd, meta: &Value, problems: &mut Vec<String>) {
    let words = words(&cmd.text);
    let Some(at) = words.iter().position(|w| w == "cargo") else {
        return;
    };
    // Only the first command of a pipeline (`cargo tree ... | sed`).
    let words: Vec<&str> = words[at + 1..]
        .iter()
        .map(String::as_str)
        .take_while(|w| *w != "|")
        .collect();
    let Some((&sub, rest)) = words.split_first() else {
        return;
    };
    if !["build", "run", "test", "bench", "install", "tree"].contains(&sub) {
        return;
    }
    if sub == "install" && !rest.contains(&"--path") {
        return; // a crate from the registry
    }
    let mut tree: Vec<String> = ["tree", "--offline", "--depth", "0", "-e", "normal"]
        .map(str::to_owned)
        .to_vec();
    let mut packages = Vec::new();
    let mut targets = Vec::new();
    let mut args = rest.iter();
    while let Some(&arg) = args.next() {
        match arg {
            "--" => break,
            "-p" | "--package" => {
                let p = args.next().unwrap().to_string();
                tree.extend(["-p".to_owned(), p.clone()]);
                packages.push(p);
            }
            "--features" | "-F" => {
                tree.extend(["--features".to_owned(), args.next().unwrap().to_string()])
            }
            "--all-features" | "--no-default-features" => tree.push(arg.to_owned()),
            "--path" => {
                let manifest = format!("{}/Cargo.toml", args.next().unwrap());
                tree.extend(["--manifest-path".to_owned(), manifest.clone()]);
                let dir = repo_root().join(&manifest).canonicalize().unwrap();
                for p in meta["packages"].as_array().unwrap() {
                    if Path::new(p["manifest_path"].as_str().unwrap()) == dir {
                        packages.push(p["name"].as_str().unwrap().to_owned());
                    }
                }
            }
            "--bin" | "--example" | "--bench" | "--test" => {
                let kind = &arg[2..];
                targets.push((kind.to_owned(), args.next().unwrap().to_string()))
            }
            _ => {}
        }
    }
    let mut o = cargo().args(&tree).output().unwrap();
    if !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("--offline") {
        // A package not downloaded yet (loom, before the loom step of a
        // fresh CI run): resolved with the network.
        tree.retain(|a| a != "--offline");
        o = cargo().args(&tree).output().unwrap();
    }
    if !o.status.success() {
        problems.push(format!(
            "{}:{}: `{}`: {}",
            cmd.doc,
            cmd.line,
            cmd.key,
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    let defaults: Vec<&str> = meta["workspace_default_members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_str().unwrap())
        .collect();
    for (kind, name) in targets {
        let found = meta["packages"].as_array().unwrap().iter().any(|p| {
            let selected = if packages.is_empty() {
                defaults.contains(&p["id"].as_str().unwrap())
            } else {
                packages.iter().any(|n| n == p["name"].as_str().unwrap())
            };
            selected
                && p["targets"].as_array().unwrap().iter().any(|t| {
                    t["name"] == name.as_str()
                        && t["kind"]
                            .as_array()
                            .unwrap()
                            .contains(&kind.as_str().into())
                })
        });
        if !found {
            problems.push(format!(
                "{}:{}: `{}`: no {kind} target named {name} in the packages it selects",
                cmd.doc, cmd.line, cmd.key
            ));
        }
    }
}

/// The features of the tool's package that `flags` (a `cargo run`'s flags
/// before `--`) build, with those each one enables.
fn built_features(flags: &[&str], meta: &Value) -> BTreeSet<String> {
    let cli = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "snapshot-receiver-cli")
        .unwrap();
    let table = cli["features"].as_object().unwrap();
    let mut wanted: Vec<String> = Vec::new();
    let mut defaults = true;
    let mut flags = flags.iter();
    while let Some(&flag) = flags.next() {
        match flag {
            "--features" | "-F" => wanted.extend(
                flags
                    .next()
                    .unwrap()
                    .split([',', ' '])
                    .filter(|f| !f.is_empty())
                    .map(str::to_owned),
            ),
            "--all-features" => wanted.extend(table.keys().cloned()),
            "--no-default-features" => defaults = false,
            _ => {}
        }
    }
    if defaults {
        wanted.push("default".to_owned());
    }
    let mut built = BTreeSet::new();
    while let Some(feature) = wanted.pop() {
        if !built.insert(feature.clone()) {
            continue;
        }
        // Plain names are this package's own features; `dep:x` and `x/y`
        // are not.
        for item in table[&feature].as_array().into_iter().flatten() {
            let item = item.as_str().unwrap();
            if table.contains_key(item) {
                wanted.push(item.to_owned());
            }
        }
    }
    built
}

/// A `cargo run` of the tool builds the features its command needs (see
/// the module's comment).
fn check_features(cmd: &Cmd, meta: &Value, problems: &mut Vec<String>) {
    let words = words(&cmd.text);
    let Some(at) = words
        .windows(2)
        .position(|w| w[0] == "cargo" && w[1] == "run")
    else {
        return;
    };
    let words: Vec<&str> = words[at + 2..].iter().map(String::as_str).collect();
    let Some(dash) = words.iter().position(|w| *w == "--") else {
        return;
    };
    let (flags, args) = (&words[..dash], &words[dash + 1..]);
    // Another package's or target's run (the simulator, an example).
    let other = flags.windows(2).any(|w| {
        matches!(w[0], "-p" | "--package") && w[1] != "snapshot-receiver-cli"
            || matches!(w[0], "--example" | "--bin") && w[1] != "snapshot-receiver"
    });
    if other {
        return;
    }
    let built = built_features(flags, meta);
    let mut needed: Vec<&str> = match args.first() {
        Some(&("serve" | "sign")) => vec!["serve"],
        Some(&("publish" | "consume")) => vec!["jetstream"],
        Some(&"loadtest") => vec!["loadtest"],
        _ => Vec::new(),
    };
    if args.iter().any(|a| a.starts_with("postgres://")) {
        needed.push("postgres");
    }
    for feature in needed {
        if !built.contains(feature) {
            problems.push(format!(
                "{}:{}: `{}`: its build has no `{feature}` feature, which the command needs \
                 (add `--features {feature}`)",
                cmd.doc, cmd.line, cmd.key
            ));
        }
    }
}

/// A `CoveredBy` names a test function that exists.
fn check_covered(cmd: &Cmd, by: &str, problems: &mut Vec<String>) {
    let (file, function) = by.split_once("::").unwrap();
    let source = std::fs::read_to_string(repo_root().join(file)).unwrap_or_default();
    if !source.contains(&format!("fn {function}(")) {
        problems.push(format!(
            "{}:{}: covered by {by}, which does not exist",
            cmd.doc, cmd.line
        ));
    }
}

/// The text a command runs, after the substitutions every command gets.
fn substituted(text: &str, port: u16, pg: Option<&str>, schema: &str, dir: &Path) -> String {
    let mut text = text.replace("target/release/snapshot-receiver", "snapshot-receiver");
    // `cargo run FLAGS -- ARGS` (the tool's binary: no other target named).
    let mut from = 0;
    while let Some(at) = text[from..].find("cargo run ").map(|i| from + i) {
        let Some(end) = text[at..].find(" -- ").map(|i| at + i) else {
            break;
        };
        let flags = &text[at..end];
        if ["--example", "--bench", "--test", "--bin"]
            .iter()
            .any(|f| flags.contains(f))
        {
            from = end;
            continue;
        }
        text.replace_range(at..end + 3, "snapshot-receiver");
        from = at;
    }
    if let Some(url) = pg {
        text = text.replace("postgres://postgres@127.0.0.1:5432/test", url);
    }
    text.replace("--store-schema inbox", &format!("--store-schema {schema}"))
        .replace("/tmp/", &format!("{}/", dir.display()))
        .replace("127.0.0.1:8080", &format!("127.0.0.1:{port}"))
}

/// A fresh scratch directory with the repository's fixtures.
fn scratch(doc: &str) -> PathBuf {
    let dir = crate::serve::scratch(&format!("doc-{}", doc.replace('/', "-")));
    std::os::unix::fs::symlink(repo_root().join("fixtures"), dir.join("fixtures")).unwrap();
    dir
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The sections of `output` between `@@doc LINE` markers, by line.
fn sections(output: &str) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = Vec::new();
    for line in output.split_inclusive('\n') {
        match line.trim_end().strip_prefix("@@doc ") {
            Some(n) => out.push((n.parse().unwrap(), String::new())),
            None => {
                if let Some((_, text)) = out.last_mut() {
                    text.push_str(line);
                }
            }
        }
    }
    out
}

/// Runs the commands of `doc` that run, in one bash session; the problems.
fn run_document(doc: &str, text_blocks: &[Block], cmds: &[(&Cmd, &Plan)]) -> Vec<String> {
    let needs_pg = cmds.iter().any(|(c, _)| c.text.contains("postgres://"));
    let pg = if needs_pg {
        match crate::durability::pg_url() {
            Some(url) => Some(url),
            None => return Vec::new(), // skipped, said on stderr
        }
    } else {
        None
    };
    let schema = format!("sr_doc_{}", std::process::id());
    let dir = scratch(doc);
    let port = free_port();
    let mut script = String::from(
        "set -eE -o pipefail\n\
         __doc_pids=()\n\
         trap 'echo \"@@failed $__doc_line $?\" >&2' ERR\n\
         trap 'exit 143' TERM\n\
         trap 'for p in \"${__doc_pids[@]}\"; do kill -TERM \"$p\" 2>/dev/null || true; wait \"$p\" 2>/dev/null || true; done' EXIT\n",
    );
    for (cmd, plan) in cmds {
        let mut text = substituted(&cmd.text, port, pg.as_deref(), &schema, &dir);
        if let Scaled(replacements) = plan {
            for (from, to) in *replacements {
                text = text.replace(from, to);
            }
        }
        let n = cmd.line;
        script.push_str(&format!(
            "__doc_line={n}; printf '\\n@@doc {n}\\n'; printf '\\n@@doc {n}\\n' >&2\n"
        ));
        if let Server = plan {
            let log = dir.join(format!("server-{n}.log"));
            let log = log.display();
            script.push_str(&format!(
                "{} --listen 127.0.0.1:{port} >{log} 2>&1 &\n\
                 __doc_pids+=($!)\n\
                 for _ in $(seq 1 1200); do grep -q '^listening on' {log} && break; \
                 kill -0 $! 2>/dev/null || break; sleep 0.1; done\n\
                 grep -q '^listening on' {log} || {{ cat {log} >&2; false; }}\n",
                strip_comment(text.trim_end())
            ));
        } else {
            script.push_str(&text);
        }
    }
    let mut child = Command::new("bash")
        .args(["-c", &script])
        .current_dir(&dir)
        .env(
            "PATH",
            format!(
                "{}:{}",
                Path::new(env!("CARGO_BIN_EXE_snapshot-receiver"))
                    .parent()
                    .unwrap()
                    .display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .env_remove("SNAPSHOT_RECEIVER_WEBHOOK_SECRET")
        .env_remove("SNAPSHOT_RECEIVER_OPERATOR_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pipe = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            r.read_to_string(&mut s).unwrap();
            s
        })
    };
    let out = pipe(Box::new(child.stdout.take().unwrap()));
    let err = pipe(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + Duration::from_secs(600);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = Command::new("kill").arg(child.id().to_string()).status();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (stdout, stderr) = (out.join().unwrap(), err.join().unwrap());
    if let Some(url) = &pg {
        crate::durability::drop_schema(url, &schema);
    }
    let outputs = sections(&stdout);
    let errors = sections(&stderr);
    let mut problems = Vec::new();
    if !status.success() {
        let failed = stderr
            .lines()
            .find_map(|l| l.strip_prefix("@@failed "))
            .and_then(|l| l.split_once(' '));
        let message = match failed {
            Some((line, code)) => {
                let line: usize = line.parse().unwrap();
                let cmd = cmds.iter().find(|(c, _)| c.line == line).unwrap().0;
                let said = errors
                    .iter()
                    .find(|(n, _)| *n == line)
                    .map_or("", |(_, e)| e.as_str());
                format!(
                    "{doc}:{line}: `{}` exited with {code}; its stderr:\n{}",
                    cmd.key,
                    said.replace(&format!("@@failed {line} {code}"), "").trim()
                )
            }
            None => format!("{doc}: the session ended with {status}; stderr:\n{stderr}"),
        };
        problems.push(message);
        return problems;
    }
    let output_of = |cmd: &Cmd| {
        outputs
            .iter()
            .find(|(n, _)| *n == cmd.line)
            .map_or(String::new(), |(_, o)| o.trim().to_owned())
    };
    for (cmd, _) in cmds {
        if let Some(shown) = &cmd.shown {
            let got = output_of(cmd);
            if got != shown.trim() {
                problems.push(format!(
                    "{doc}:{}: `{}` printed\n{got}\nnot what the document shows:\n{}",
                    cmd.line,
                    cmd.key,
                    shown.trim()
                ));
            }
        }
    }
    // The block after a block with `RunShows` commands shows what they
    // print, in order.
    let shows: BTreeSet<usize> = cmds
        .iter()
        .filter(|(_, plan)| matches!(plan, RunShows))
        .map(|(c, _)| c.block)
        .collect();
    for b in shows {
        let showing: Vec<&Cmd> = cmds
            .iter()
            .filter(|(c, plan)| c.block == b && matches!(plan, RunShows))
            .map(|(c, _)| *c)
            .collect();
        let got = showing
            .iter()
            .map(|c| output_of(c))
            .collect::<Vec<_>>()
            .join("\n");
        let Some(next) = text_blocks.get(b + 1) else {
            problems.push(format!(
                "{doc}:{}: no block after it shows the output",
                text_blocks[b].line
            ));
            continue;
        };
        let shown = next
            .lines
            .iter()
            .map(|(_, l)| l.as_str())
            .collect::<Vec<_>>()
            .join("\n");
        if !got.contains(shown.trim()) {
            problems.push(format!(
                "{doc}:{}: the block shown at line {} is not what {} printed:\n{got}",
                showing[0].line,
                next.line,
                showing
                    .iter()
                    .map(|c| format!("`{}`", c.key))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    problems
}

#[test]
fn every_command_block_of_the_documents_runs_as_written_or_is_skipped_for_a_reason() {
    let meta = metadata();
    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    let (mut run, mut skipped, mut covered) = (0, 0, 0);
    let (mut blocks_run, mut blocks_partly, mut blocks_not_run) = (0, 0, 0);
    for doc in documents() {
        let text = read(&doc);
        let blocks = match blocks(&doc, &text) {
            Ok(blocks) => blocks,
            Err(e) => {
                problems.push(e);
                continue;
            }
        };
        let cmds = commands(&doc, &blocks);
        let mut runs = Vec::new();
        for cmd in &cmds {
            check_paths(cmd, &mut problems);
            check_cargo(cmd, &meta, &mut problems);
            check_features(cmd, &meta, &mut problems);
            let i = match plan_of(cmd) {
                Ok(i) => i,
                Err(e) => {
                    problems.push(e);
                    continue;
                }
            };
            used.insert(i);
            let plan = &PLANS[i].2;
            match plan {
                Skip(reason) => {
                    assert!(!reason.is_empty());
                    skipped += 1;
                }
                CoveredBy(by) => {
                    check_covered(cmd, by, &mut problems);
                    covered += 1;
                }
                Run | RunShows | Scaled(_) | Server => {
                    runs.push((cmd, plan));
                    run += 1;
                }
            }
        }
        for (b, _) in blocks
            .iter()
            .enumerate()
            .filter(|(_, b)| SHELL.contains(&b.lang.as_str()))
        {
            let all = cmds.iter().filter(|c| c.block == b).count();
            match runs.iter().filter(|(c, _)| c.block == b).count() {
                0 => blocks_not_run += 1,
                n if n == all => blocks_run += 1,
                _ => blocks_partly += 1,
            }
        }
        if !runs.is_empty() {
            problems.extend(run_document(&doc, &blocks, &runs));
        }
    }
    for (i, (doc, start, _)) in PLANS.iter().enumerate() {
        if !used.contains(&i) {
            problems.push(format!(
                "PLANS has an entry for `{start}` in {doc}, which has no such command"
            ));
        }
    }
    eprintln!(
        "{run} commands run, {covered} covered by other tests, {skipped} skipped; \
         shell blocks: {blocks_run} run whole, {blocks_partly} in part, {blocks_not_run} not run here"
    );
    assert!(problems.is_empty(), "\n{}", problems.join("\n\n"));
}

/// The anchors of `text`'s headings, as GitHub makes them: lowercased,
/// punctuation dropped, spaces as `-`, a repeated one with `-1`, `-2`, ...
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        let Some(heading) = line.strip_prefix('#').filter(|_| !fenced) else {
            continue;
        };
        let slug: String = heading
            .trim_start_matches('#')
            .trim()
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let mut unique = slug.clone();
        let mut n = 0;
        while out.contains(&unique) {
            n += 1;
            unique = format!("{slug}-{n}");
        }
        out.insert(unique);
    }
    out
}

/// The lines of `text` outside fenced blocks, with their numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// The folders and files at the repository's top a path in a document can
/// start with.
fn top_level() -> BTreeSet<String> {
    std::fs::read_dir(repo_root())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name != "target" && !name.starts_with('.') || name == ".ci")
        .collect()
}

#[test]
fn every_link_between_the_documents_resolves() {
    let root = repo_root().canonicalize().unwrap();
    let top = top_level();
    let mut problems = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = read(&doc);
        let here = root.join(&doc);
        let dir = here.parent().unwrap();
        for (n, line) in prose(&text) {
            // [text](target): a file of the repository, and its #anchor.
            let mut rest = line;
            while let Some(at) = rest.find("](") {
                let after = &rest[at + 2..];
                let Some(end) = after.find(')') else { break };
                let target = &after[..end];
                rest = &after[end..];
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
                let file = if path.is_empty() {
                    here.clone()
                } else {
                    dir.join(path)
                };
                let Ok(file) = file.canonicalize() else {
                    problems.push(format!("{doc}:{n}: the link ({target}) names no file"));
                    continue;
                };
                if !file.starts_with(&root) {
                    problems.push(format!(
                        "{doc}:{n}: the link ({target}) leaves the repository"
                    ));
                    continue;
                }
                if !anchor.is_empty() {
                    let theirs = std::fs::read_to_string(&file).unwrap_or_default();
                    if !anchors(&theirs).contains(anchor) {
                        problems.push(format!(
                            "{doc}:{n}: the link ({target}) names no heading of {}",
                            file.strip_prefix(&root).unwrap().display()
                        ));
                    }
                }
            }
            // `path/in/the/repository`: a path written in code from the
            // repository's top (as the documents write them) exists.
            for (i, span) in line.split('`').enumerate() {
                let path = span.split_once(':').map_or(span, |(p, _)| p);
                let first = path.split('/').next().unwrap();
                if i % 2 == 0
                    || !path.contains('/')
                    || path.contains(|c: char| c.is_whitespace() || "*<>{}$…".contains(c))
                    || !top.contains(first)
                {
                    continue;
                }
                checked += 1;
                if !root.join(path).exists() {
                    problems.push(format!(
                        "{doc}:{n}: `{span}` names a path that is not in the repository"
                    ));
                }
            }
        }
    }
    eprintln!("{checked} links and paths checked");
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

/// One row of the metrics table, docs/OPERATIONS.md's *Metrics*: the one
/// home of the counters' names, which the counter tests read.
pub(crate) struct MetricRow {
    /// The counter's name (`snapshot_receiver_decisions_total`).
    name: String,
    /// Its label names.
    labels: BTreeSet<String>,
    /// The values of its one label; empty when any value (the row says
    /// what they are) or no label.
    values: Vec<String>,
    /// The group of its readable keys (`decision` for `decision.<value>`);
    /// `None` for `serve`'s own counters.
    group: Option<String>,
}

/// The code spans of `cell`.
fn code_spans(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The rows of docs/OPERATIONS.md's metrics table.
pub(crate) fn metrics_table() -> Vec<MetricRow> {
    let text = read("docs/OPERATIONS.md");
    let at = text
        .find("\n## Metrics\n")
        .expect("docs/OPERATIONS.md has a Metrics section");
    text[at..]
        .lines()
        .skip_while(|l| !l.starts_with("| counter |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            assert_eq!(cells.len(), 4, "docs/OPERATIONS.md, Metrics: {l}");
            let labels: BTreeSet<String> = code_spans(cells[1]).into_iter().collect();
            MetricRow {
                name: code_spans(cells[0]).remove(0),
                values: if labels.len() == 1 {
                    code_spans(cells[2])
                } else {
                    Vec::new()
                },
                labels,
                group: code_spans(cells[3])
                    .first()
                    .and_then(|k| k.strip_suffix(".<value>"))
                    .map(str::to_owned),
            }
        })
        .collect()
}

/// The readable keys the table documents (`decision.applied`, ...).
pub(crate) fn documented_keys(rows: &[MetricRow]) -> BTreeSet<String> {
    rows.iter()
        .filter_map(|r| Some((r.group.as_ref()?, &r.values)))
        .flat_map(|(group, values)| values.iter().map(move |v| format!("{group}.{v}")))
        .collect()
}

/// Why `series` (`name{label=value,...}`, the values quoted or not, as the
/// Prometheus text and a facade recorder write it) is not in the table;
/// `None` when it is, with its label names and a value the row lists.
pub(crate) fn undocumented(rows: &[MetricRow], series: &str) -> Option<String> {
    let (name, labels) = series.split_once('{').unwrap_or((series, "}"));
    let labels: Vec<(&str, &str)> = labels
        .trim_end_matches('}')
        .split(',')
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap();
            (k, v.trim_matches('"'))
        })
        .collect();
    let Some(row) = rows.iter().find(|r| r.name == name) else {
        return Some(format!(
            "{series}: no counter {name} in docs/OPERATIONS.md's Metrics table"
        ));
    };
    let names: BTreeSet<String> = labels.iter().map(|(k, _)| k.to_string()).collect();
    if names != row.labels {
        return Some(format!(
            "{series}: the table gives {name} the labels {:?}",
            row.labels
        ));
    }
    match labels[..] {
        [(_, value)] if !row.values.is_empty() && !row.values.iter().any(|v| v == value) => {
            Some(format!(
                "{series}: the table lists {:?} as {name}'s values",
                row.values
            ))
        }
        _ => None,
    }
}
