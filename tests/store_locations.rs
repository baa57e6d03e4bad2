//! One set of rules for store locations (`store::Location`) in every
//! command and in the library: `memory` runs a receiver everywhere and is
//! refused, with the reason, where a store is read from outside; an empty
//! `sqlite:` path and unknown schemes are refused with what is wrong; a
//! `serve` that cannot listen creates nothing; `--listen` takes a host
//! name; a store that cannot be opened says why.

use crate::common::{cli, repo, spawn_quiet};
use snapshot_receiver::store::{SqliteOptions, SqliteStore, StoreError};
use snapshot_receiver::{BuildError, Receiver};
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

const FIXTURE: &str = "fixtures/B62-15-events.json";

/// A fresh empty directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "locations-{name}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn run(args: &[&str]) -> Output {
    cli().args(args).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The files in `dir`, sorted.
fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn replay_takes_memory_and_prints_what_it_prints_without_a_store() {
    let default = run(&["replay", FIXTURE]);
    let memory = run(&["replay", FIXTURE, "--store", "memory"]);
    assert_eq!(memory.status.code(), Some(0), "{}", stderr(&memory));
    assert_eq!(
        String::from_utf8_lossy(&memory.stdout),
        String::from_utf8_lossy(&default.stdout)
    );
}

#[test]
fn every_operator_command_refuses_memory_with_the_reason() {
    let why = "error: bad store location: `memory` cannot be read: an in-memory store lives \
               inside the process that runs the receiver; read a sqlite:PATH or postgres:// store\n";
    let dir = scratch("memory");
    let snapshot = dir.join("snapshot.jsonl");
    std::fs::write(
        &snapshot,
        "{\"object_id\":\"card-7\",\"version\":12,\"state\":{},\"as_of\":\"2024-01-01T08:00:00Z\"}\n",
    )
    .unwrap();
    let snapshot = snapshot.display().to_string();
    for args in [
        &["inspect", "--store", "memory"][..],
        &["audit", "--store", "memory", "--object", "card-7"],
        &["purge", "--store", "memory"],
        &["reconcile", "--store", "memory", "--snapshot", &snapshot],
    ] {
        let o = run(args);
        assert_eq!(
            (o.status.code(), stderr(&o).as_str()),
            (Some(2), why),
            "{args:?}"
        );
    }
}

#[test]
fn an_empty_sqlite_path_and_other_schemes_are_refused_in_every_command() {
    let dir = scratch("refused");
    let empty = "`sqlite:` has no path: write sqlite:PATH, for example sqlite:receiver.db";
    let mysql = "unsupported scheme `mysql` in \"mysql://x\": expected memory, \
                 sqlite:PATH, postgres://USER@HOST:PORT/DB or lsm:DIR";
    // One value parser reads --store in every command: the same message,
    // naming the flag and the value once, and exit 2 (bad arguments).
    for (location, why) in [("sqlite:", empty), ("mysql://x", mysql)] {
        let fixture = repo(FIXTURE).display().to_string();
        for args in [
            vec!["replay", fixture.as_str(), "--store", location],
            vec!["inspect", "--store", location],
            vec!["serve", "--listen", "127.0.0.1:0", "--store", location],
        ] {
            let o = cli().current_dir(&dir).args(&args).output().unwrap();
            let err = stderr(&o);
            assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
            assert_eq!(
                err,
                format!(
                    "error: invalid value '{location}' for '--store <LOCATION>': {why}\n\n\
                     For more information, try '--help'.\n"
                ),
                "{args:?}"
            );
        }
    }
    assert_eq!(files(&dir), Vec::<String>::new(), "nothing is created");
}

#[test]
fn a_serve_that_cannot_listen_creates_no_store() {
    let dir = scratch("no-listen");
    // A port this test holds.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let o = cli()
        .current_dir(&dir)
        .args(["serve", "--listen", &addr])
        .env_remove("SNAPSHOT_RECEIVER_WEBHOOK_SECRET")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(
        stderr(&o),
        format!("error: --listen {addr}: Address already in use (os error 98)\n")
    );
    assert_eq!(files(&dir), Vec::<String>::new());
    // A listen address that is not one: refused before anything is created.
    let o = cli()
        .current_dir(&dir)
        .args(["serve", "--listen", "8080"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).starts_with(
            "error: --listen 8080: expected HOST:PORT, for example 127.0.0.1:8080 or localhost:8080 ("
        ),
        "{}",
        stderr(&o)
    );
    assert_eq!(files(&dir), Vec::<String>::new());
}

#[test]
fn serve_listens_on_a_host_name() {
    let dir = scratch("localhost");
    let mut child = spawn_quiet(
        cli()
            .current_dir(&dir)
            .args(["serve", "--listen", "localhost:0", "--store", "memory"])
            .env_remove("SNAPSHOT_RECEIVER_WEBHOOK_SECRET")
            .env_remove("SNAPSHOT_RECEIVER_OPERATOR_TOKEN")
            .stdout(Stdio::piped()),
    );
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let addr = first
        .trim()
        .strip_prefix("listening on http://")
        .unwrap_or_else(|| panic!("{first:?}"));
    let addr: std::net::SocketAddr = addr.parse().unwrap();
    assert!(addr.ip().is_loopback(), "{addr}");
    assert_ne!(addr.port(), 0);
}

#[test]
fn a_path_that_cannot_be_opened_says_why() {
    let o = run(&[
        "replay",
        FIXTURE,
        "--store",
        "sqlite:/nonexistent-dir-of-this-test/receiver.db",
    ]);
    // A store that cannot be opened exits 1 from every command, named once.
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        "error: store failure: sqlite: cannot open \
         /nonexistent-dir-of-this-test/receiver.db: directory /nonexistent-dir-of-this-test: \
         No such file or directory (os error 2)\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_library_reads_locations_by_the_same_rules() {
    // `memory`: a receiver in memory, as with no `.store()` at all.
    let rx = Receiver::builder()
        .object("card-7", 10, r#"{"stage":"draft"}"#)
        .store("memory")
        .build()
        .unwrap();
    assert_eq!(rx.object("card-7").await.unwrap().version, 10);
    assert!(rx.store_stats().is_none(), "no durable store");
    rx.shutdown().await;
    let refused = |location: &str| match Receiver::builder().store(location).build() {
        Err(e @ BuildError::Store(StoreError::InvalidLocation(_))) => e.to_string(),
        Err(other) => panic!("{location:?}: {other}"),
        Ok(_) => panic!("{location:?} accepted"),
    };
    assert_eq!(
        refused("sqlite:"),
        "cannot open or read the durable store: bad store location: `sqlite:` has no path: \
         write sqlite:PATH, for example sqlite:receiver.db"
    );
    assert_eq!(
        refused("mysql://x"),
        "cannot open or read the durable store: bad store location: unsupported scheme `mysql` \
         in \"mysql://x\": expected memory, sqlite:PATH, postgres://USER@HOST:PORT/DB or lsm:DIR"
    );
    let with_schema = Receiver::builder()
        .store("memory")
        .store_schema("s")
        .build()
        .err()
        .unwrap();
    assert_eq!(
        with_schema.to_string(),
        "cannot open or read the durable store: bad store location: schema \"s\" given for \
         memory: only a PostgreSQL store has schemas"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_at_start_up_says_so_in_the_message() {
    let dir = scratch("full");
    let path = dir.join("full.db").display().to_string();
    let mut builder = Receiver::builder().store_with(move || {
        SqliteStore::open(
            &path,
            SqliteOptions {
                max_page_count: Some(12),
                ..SqliteOptions::default()
            },
        )
    });
    let pad = "x".repeat(2000);
    for i in 0..100 {
        builder = builder.object(&format!("card-{i}"), 1, &format!("{{\"pad\":\"{pad}\"}}"));
    }
    let e = builder.build().err().expect("the file is full");
    let message = e.to_string();
    assert!(
        message.starts_with("cannot open or read the durable store: store failure: sqlite")
            && message.ends_with(": database or disk is full"),
        "{message}"
    );
    assert!(
        std::error::Error::source(&e).is_none(),
        "the cause is in the message, once"
    );
}
