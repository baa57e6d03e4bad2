//! The log-structured store (`lsm:DIR`) beside SQLite: purges that keep
//! what justifies a hold, one process at a time, a row the store cannot
//! hold refused for its delivery alone, and the operator commands naming
//! what they cannot read. Its decisions are compared with memory and
//! SQLite in `backends_agree` and `working_set`; its crash test is in
//! `durability`.

use crate::common::t;
use crate::store::temp_db;
use snapshot_receiver::store::{
    self, AuditRow, EffectRow, HeldKey, HeldRow, HeldStatus, ObjectRow, Records, Write,
};
use snapshot_receiver::{Limits, ManualClock, Outcome, Receiver, Verdict};
use std::sync::Arc;
use std::time::Duration;

/// A fresh location of `scheme` named `name`.
fn location(scheme: &str, name: &str) -> String {
    let path = temp_db(&format!("lsm-{name}-{scheme}"));
    let _ = std::fs::remove_dir_all(&path);
    format!("{scheme}:{}", path.display())
}

fn audit(seq: u64, event: &str, object: &str, at: std::time::SystemTime) -> AuditRow {
    AuditRow {
        key: HeldKey { origin: 7, seq },
        at,
        event_id: Some(event.into()),
        object_id: Some(object.into()),
        kind: "delivery",
        decision: Some("applied".to_owned()),
        version: Some(seq),
        replacement: true,
        detail: None,
        body: Some(Arc::from(&b"{}"[..])),
    }
}

fn object(id: &str, paused: bool) -> ObjectRow {
    ObjectRow {
        object_id: id.into(),
        version: 1,
        state: "{}".to_owned(),
        paused,
    }
}

/// Seven audit rows, two history rows and two held rows, all recorded at
/// `t()`; then every kind purged with a cut-off after them.
fn purged(location: &str) -> (Vec<u64>, Vec<u64>, Vec<u64>) {
    let mut store = store::open(location).unwrap();
    let at = t();
    let held = |seq: u64, status: HeldStatus| HeldRow {
        key: HeldKey { origin: 7, seq },
        at,
        event_id: Some(format!("e{seq}").into()),
        object_id: Some("free".into()),
        held_as: Verdict::from_code("held:missing_version").unwrap(),
        body: Arc::from(&b"{\"event_id\":\"x\"}"[..]),
        status,
        superseded_by: None,
        detail: None,
    };
    let effect = |seq: u64| EffectRow {
        key: HeldKey { origin: 7, seq },
        at,
        object_id: "free".into(),
        version: seq,
        state: "{}".to_owned(),
        cause_event: None,
        trace: None,
    };
    let mut writes = vec![
        Write::Seed(object("free", false)),
        Write::Seed(object("stopped", true)),
        // 1: nothing holds it. 2: its step's held row is not resolved. 3: a
        // later row of the same event is held (4). 5: its object is paused.
        // 6: its step's held row was resolved. 7: the highest seq.
        Write::Audit(audit(1, "e1", "free", at)),
        Write::Audit(audit(2, "e2", "free", at)),
        Write::Audit(audit(3, "e4", "free", at)),
        Write::Audit(audit(4, "e4", "free", at)),
        Write::Audit(audit(5, "e5", "stopped", at)),
        Write::Audit(audit(6, "e6", "free", at)),
        Write::Audit(audit(7, "e7", "free", at)),
        Write::Held(held(2, HeldStatus::Held)),
        Write::Held(held(4, HeldStatus::Parked)),
        Write::Held(held(6, HeldStatus::Held)),
        Write::Effect(effect(1)),
        Write::Effect(effect(6)),
    ];
    store.commit(&writes).unwrap();
    writes.clear();
    store
        .commit(&[Write::HeldStatus {
            key: HeldKey { origin: 7, seq: 6 },
            status: HeldStatus::Resolved,
            superseded_by: None,
        }])
        .unwrap();
    let before = at + Duration::from_secs(1);
    let counts = Records::ALL.map(|r| store.purge_records(r, before, 100).unwrap());
    assert_eq!(
        counts,
        [2, 2, 1],
        "audit, history, resolved rows purged on {location}"
    );
    // Nothing is left to purge.
    let again = Records::ALL.map(|r| store.purge_records(r, before, 100).unwrap());
    assert_eq!(again, [0, 0, 0]);
    let audit_left = store.audit().unwrap().iter().map(|a| a.key.seq).collect();
    let history_left = store
        .replacements_since(0)
        .unwrap()
        .iter()
        .map(|e| e.key.seq)
        .collect();
    let held_left = store
        .load(std::time::UNIX_EPOCH)
        .unwrap()
        .held
        .iter()
        .map(|h| h.key.seq)
        .collect();
    (audit_left, history_left, held_left)
}

#[test]
fn purges_keep_what_justifies_a_hold_on_sqlite_and_on_lsm() {
    for scheme in ["sqlite", "lsm"] {
        let (audit, history, held) = purged(&location(scheme, "purge"));
        assert_eq!(audit, vec![2, 3, 4, 5, 7], "audit rows kept on {scheme}");
        assert_eq!(history, Vec::<u64>::new(), "history rows kept on {scheme}");
        assert_eq!(held, vec![2, 4], "held rows kept on {scheme}");
    }
}

#[test]
fn a_second_writer_of_an_lsm_store_is_refused_until_the_first_closes() {
    let location = location("lsm", "lock");
    let first = store::open(&location).unwrap();
    let second = store::open(&location).err().map(|e| e.to_string());
    assert_eq!(
        second.as_deref(),
        Some(&*format!(
            "store failure: {location} is open in another receiver of this process: an lsm \
             store takes one writer at a time"
        ))
    );
    drop(first);
    assert!(store::open(&location).is_ok());
}

/// `inspect --format json` of `location`, as JSON.
fn inspect(location: &str) -> serde_json::Value {
    let out = crate::common::cli()
        .args(["inspect", "--store", location, "--format", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_operator_commands_read_an_lsm_store_as_they_read_sqlite() {
    let fixture = crate::common::repo("fixtures/B62-15-events.json");
    let fixture = fixture.to_str().unwrap();
    let mut views = Vec::new();
    for scheme in ["sqlite", "lsm"] {
        let location = location(scheme, "operator");
        let replay = crate::common::cli()
            .args(["replay", fixture, "--store", &location])
            .output()
            .unwrap();
        assert!(replay.status.success());
        let mut inspected = inspect(&location);
        // The location is the one thing that differs.
        assert_eq!(inspected["summary"]["location"], location.as_str());
        inspected["summary"]["location"] = serde_json::Value::Null;
        let audit = crate::common::cli()
            .args(["audit", "--store", &location, "--object", "card-7"])
            .output()
            .unwrap();
        assert!(
            audit.status.success(),
            "{}",
            String::from_utf8_lossy(&audit.stderr)
        );
        views.push((inspected, String::from_utf8(audit.stdout).unwrap()));
    }
    let (lsm, sqlite) = (views.pop().unwrap(), views.pop().unwrap());
    assert_eq!(lsm.0, sqlite.0, "inspect --format json");
    assert_eq!(lsm.1, sqlite.1, "audit --object card-7");
    // What the fixture leaves: e-207 parked on card-9, nothing paused.
    assert_eq!(lsm.0["summary"]["parked"][0]["object_id"], "card-9");
    assert_eq!(lsm.0["summary"]["paused_objects"], 0);
    assert!(lsm.1.contains("e-203"), "{}", lsm.1);
}

/// The reader's lists on rows the fixture does not leave: paused objects
/// among others, and a variant held on one object whose event was first
/// recorded on another (the reader names that object). The same on both
/// stores.
#[test]
fn the_reader_lists_paused_objects_and_names_a_held_variants_first_object() {
    let mut seen = Vec::new();
    for scheme in ["sqlite", "lsm"] {
        let location = location(scheme, "reader-lists");
        let mut store = store::open(&location).unwrap();
        let held = |seq: u64, event: &str, held_as: &str| HeldRow {
            key: HeldKey { origin: 7, seq },
            at: t(),
            event_id: Some(event.into()),
            object_id: Some("card-1".into()),
            held_as: Verdict::from_code(held_as).unwrap(),
            body: Arc::from(&b"{}"[..]),
            status: HeldStatus::Held,
            superseded_by: None,
            detail: None,
        };
        let mut first = receipt("e-1", 1);
        first.object_id = "card-9".into();
        store
            .commit(&[
                Write::Seed(object("card-1", true)),
                Write::Seed(object("card-2", false)),
                Write::Seed(object("card-3", true)),
                Write::Receipt(first),
                Write::Held(held(1, "e-1", "conflict:event_variant")),
                Write::Held(held(2, "e-2", "held:paused")),
            ])
            .unwrap();
        drop(store);
        let reader = store::StoreReader::open(&location, None).unwrap();
        let paused: Vec<String> = reader
            .objects(true)
            .unwrap()
            .into_iter()
            .map(|o| o.object_id)
            .collect();
        let all = reader.objects(false).unwrap().len();
        let one = reader
            .object("card-2")
            .unwrap()
            .map(|o| (o.object_id, o.paused));
        let held: Vec<(Option<String>, String, Option<String>)> = reader
            .held(None)
            .unwrap()
            .into_iter()
            .map(|h| (h.event_id, h.decision, h.first_record_object_id))
            .collect();
        seen.push((paused, all, one, held));
    }
    let expected = (
        vec!["card-1".to_owned(), "card-3".to_owned()],
        3,
        Some(("card-2".to_owned(), false)),
        vec![
            (
                Some("e-1".to_owned()),
                "conflict".to_owned(),
                Some("card-9".to_owned()),
            ),
            (Some("e-2".to_owned()), "held".to_owned(), None),
        ],
    );
    assert_eq!(seen, vec![expected.clone(), expected]);
}

#[cfg(feature = "serve")]
#[test]
fn a_store_another_process_holds_is_named_and_a_missing_one_is_not_created() {
    let location = location("lsm", "held-elsewhere");
    let path = location.strip_prefix("lsm:").unwrap().to_owned();
    let missing = crate::common::cli()
        .args(["inspect", "--store", &location])
        .output()
        .unwrap();
    // Exit 3: no such store.
    assert_eq!(missing.status.code(), Some(3));
    assert_eq!(
        String::from_utf8_lossy(&missing.stderr).trim_end(),
        format!("error: no such store: {location}: no such directory")
    );
    assert!(
        !std::path::Path::new(&path).exists(),
        "inspect created the store"
    );
    // A server holds the store open.
    let mut holder = crate::common::cli()
        .args(["serve", "--listen", "127.0.0.1:0", "--store", &location])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(60);
    while !std::path::Path::new(&path)
        .join("keyspace/version")
        .exists()
    {
        assert!(
            std::time::Instant::now() < until,
            "the replay never opened the store"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = crate::common::cli()
        .args(["inspect", "--store", &location])
        .output()
        .unwrap();
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim_end(),
        format!(
            "error: store failure: {location} is open in another process: an lsm store takes \
             one process at a time"
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_over_the_key_limit_is_rejected_alone_and_the_group_commits() {
    let long = "x".repeat(70_000);
    let body = |event: &str, version: u64| {
        format!(
            r#"{{"event_id":"{event}","object_id":"card","object_version":{version},"occurred_at":"2024-01-01T08:00:00Z","type":"card.snapshot","state":{{"v":{version}}}}}"#
        )
        .into_bytes()
    };
    let rx = Receiver::builder()
        .shards(1)
        .clock(Arc::new(ManualClock::new(t())))
        .limits(Limits {
            max_id_bytes: 100_000,
            ..Limits::default()
        })
        .object("card", 1, "{}")
        .store(&location("lsm", "long-id"))
        .build()
        .unwrap();
    let bodies = [body("e-1", 2), body(&long, 3), body("e-3", 4)];
    let receipts = rx
        .deliver_batch(&bodies.iter().map(Vec::as_slice).collect::<Vec<_>>())
        .await;
    let outcomes: Vec<String> = receipts
        .iter()
        .map(|r| match &r.outcome {
            Outcome::Decided(d) => d.to_string(),
            Outcome::Retry(why) => format!("retry {why}"),
            Outcome::Rejected(why) => format!("reject {}: {why}", why.as_str()),
        })
        .collect();
    assert_eq!(outcomes[0], "applied");
    assert!(
        outcomes[1].starts_with("reject store_refused: ")
            && outcomes[1].contains(
                "a key of table receipts is 70000 bytes, over the store's limit of 65535"
            ),
        "{}",
        outcomes[1]
    );
    assert_eq!(outcomes[2], "applied");
    let card = rx
        .objects()
        .await
        .into_iter()
        .find(|o| &*o.object_id == "card")
        .unwrap();
    assert_eq!(card.version, 4);
    rx.shutdown().await;
}

fn receipt(event: &str, fingerprint: u128) -> snapshot_receiver::store::ReceiptRow {
    snapshot_receiver::store::ReceiptRow {
        event_id: event.into(),
        fingerprint,
        object_id: "a".into(),
        decision: Verdict::Applied,
        first_seen: t(),
        retention_cutoff: None,
    }
}

/// What each write kind's condition answers on `location`, one group at a
/// time: every message, then the objects and receipts the store kept.
fn conditions(location: &str) -> (Vec<String>, Vec<String>) {
    use snapshot_receiver::store::{Expect, VariantRow};
    let mut store = store::open(location).unwrap();
    let row = |id: &str, version: u64| ObjectRow {
        version,
        ..object(id, false)
    };
    let variant = VariantRow {
        event_id: "e1".into(),
        fingerprint: 9,
        object_id: "a".into(),
        first_seen: t(),
    };
    let groups: Vec<Vec<Write>> = vec![
        // A group reads its own writes: the object it introduces, then
        // replaces on what it introduced.
        vec![
            Write::Object {
                row: row("a", 1),
                expect: Expect::Absent,
            },
            Write::Object {
                row: row("a", 2),
                expect: Expect::Version {
                    version: 1,
                    paused: false,
                },
            },
            Write::Receipt(receipt("e1", 1)),
        ],
        // Each condition that no longer holds, and the group with it
        // leaves nothing (the seed of `b` included).
        vec![
            Write::Seed(object("b", false)),
            Write::Receipt(receipt("e1", 2)),
        ],
        vec![Write::Object {
            row: row("a", 3),
            expect: Expect::Absent,
        }],
        vec![Write::Object {
            row: row("a", 3),
            expect: Expect::Version {
                version: 1,
                paused: false,
            },
        }],
        vec![Write::Check {
            object_id: "a".into(),
            version: 2,
            paused: true,
        }],
        vec![Write::Pause {
            object_id: "nobody".into(),
        }],
        vec![Write::PauseIfStored {
            event_id: "e1".into(),
            fingerprint: 5,
            object_id: "a".into(),
            audit: audit(1, "e1", "a", t()),
        }],
        vec![Write::Variant(variant.clone())],
        vec![Write::Variant(variant)],
    ];
    let mut answers = Vec::new();
    for (i, group) in groups.iter().enumerate() {
        // A probe answers as the commit would, and keeps nothing.
        let probed = store.probe(group).map_err(|e| e.to_string());
        let committed = store.commit(group).map_err(|e| e.to_string());
        assert_eq!(
            probed, committed,
            "group {i}: probe and commit differ on {location}"
        );
        answers.push(format!("{i}: {committed:?}"));
    }
    let objects = store
        .objects()
        .unwrap()
        .iter()
        .map(|o| format!("{} v{} paused {}", o.object_id, o.version, o.paused))
        .chain(
            store
                .load(std::time::UNIX_EPOCH)
                .unwrap()
                .receipts
                .iter()
                .map(|r| format!("{} {}", r.event_id, r.fingerprint)),
        )
        .collect();
    (answers, objects)
}

#[test]
fn every_condition_answers_the_same_on_sqlite_and_on_lsm() {
    let conflict = |why: &str| format!("Err(\"concurrent change: {why}\")");
    for scheme in ["sqlite", "lsm"] {
        let (answers, kept) = conditions(&location(scheme, "conditions"));
        assert_eq!(
            answers,
            vec![
                "0: Ok(())".to_owned(),
                format!("1: {}", conflict("receipt for e1 already exists")),
                format!("2: {}", conflict("object a to create exists already")),
                format!("3: {}", conflict("object a changed since it was read")),
                format!("4: {}", conflict("object a changed since it was read")),
                // SQLite folds a lone pause into the group's statements,
                // which name the row as changed.
                format!(
                    "5: {}",
                    conflict(match scheme {
                        "sqlite" => "object nobody changed since it was read",
                        _ => "object nobody to pause is not stored",
                    })
                ),
                format!(
                    "6: {}",
                    conflict("the first record of e1 is not stored yet: its variant waits for it")
                ),
                "7: Ok(())".to_owned(),
                format!(
                    "8: {}",
                    conflict("variant 00000000000000000000000000000009 of e1 already recorded")
                ),
            ],
            "on {scheme}"
        );
        assert_eq!(kept, vec!["a v2 paused false", "e1 1"], "on {scheme}");
    }
}

/// A `replay` of the reference fixture on `location`: exit code, stderr.
fn replay_on(location: &str) -> (Option<i32>, String) {
    let fixture = crate::common::repo("fixtures/B62-15-events.json");
    let out = crate::common::cli()
        .args(["replay", fixture.to_str().unwrap(), "--store", location])
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).trim_end().to_owned(),
    )
}

#[test]
fn a_directory_that_is_not_a_store_is_refused_and_left_as_it_was() {
    let location = location("lsm", "not-a-store");
    let path = std::path::PathBuf::from(location.strip_prefix("lsm:").unwrap());
    // A file where the directory would be.
    std::fs::write(&path, b"mine").unwrap();
    assert_eq!(
        replay_on(&location),
        (
            Some(4),
            format!("error: not a snapshot-receiver store: {location} is a file: an lsm store is a directory")
        )
    );
    assert_eq!(std::fs::read(&path).unwrap(), b"mine");
    // A directory holding someone else's files.
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    std::fs::write(path.join("notes.txt"), b"mine").unwrap();
    assert_eq!(
        replay_on(&location),
        (
            Some(4),
            format!(
                "error: not a snapshot-receiver store: {location} holds other files and no store: \
                 a new lsm store needs an empty or missing directory"
            )
        )
    );
    assert_eq!(
        std::fs::read_dir(&path).unwrap().count(),
        1,
        "nothing was added"
    );
    // A store that lost its keyspace's version file: refused, not started over.
    std::fs::remove_dir_all(&path).unwrap();
    assert_eq!(replay_on(&location).0, Some(0));
    std::fs::remove_file(path.join("keyspace/version")).unwrap();
    let journals = |p: &std::path::Path| {
        let mut names: Vec<_> = std::fs::read_dir(p.join("keyspace/journals"))
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.file_name(), e.metadata().unwrap().len())
            })
            .collect();
        names.sort();
        names
    };
    let before = journals(&path);
    let damaged = format!(
        "error: not a snapshot-receiver store: {location}: the store is damaged or not an lsm \
         store (its keyspace has no version file); it was not changed"
    );
    assert_eq!(replay_on(&location), (Some(4), damaged.clone()));
    let inspect = crate::common::cli()
        .args(["inspect", "--store", &location])
        .output()
        .unwrap();
    assert_eq!(inspect.status.code(), Some(4));
    assert_eq!(String::from_utf8_lossy(&inspect.stderr).trim_end(), damaged);
    assert_eq!(journals(&path), before, "the journal was rewritten");
}

/// A journal that ends in bytes that are not a whole batch (a write a
/// killed process did not finish, or damage): fjall replays the batches
/// before them and drops them; the opening says how many it dropped, once,
/// and the store reads as before.
#[test]
fn a_journal_tail_that_is_not_a_whole_batch_is_dropped_and_the_operator_is_told() {
    use std::io::Write as _;
    let location = location("lsm", "torn-tail");
    let path = std::path::PathBuf::from(location.strip_prefix("lsm:").unwrap());
    let fixture = crate::common::repo("fixtures/B62-15-events.json");
    let replay = crate::common::cli()
        .args(["replay", fixture.to_str().unwrap(), "--store", &location])
        .output()
        .unwrap();
    assert!(replay.status.success());
    let inspect = || {
        let out = crate::common::cli()
            .args(["inspect", "--store", &location, "--format", "json"])
            .output()
            .unwrap();
        assert!(out.status.success());
        (
            String::from_utf8(out.stdout).unwrap(),
            String::from_utf8(out.stderr).unwrap(),
        )
    };
    // The first opening drops the zeros fjall wrote ahead: nothing to say.
    let (before, quiet) = inspect();
    assert!(!quiet.contains("dropped"), "{quiet}");
    let journal = path.join("keyspace/journals/0");
    let whole = std::fs::metadata(&journal).unwrap().len();
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&journal)
        .unwrap();
    file.write_all(&[0xAB; 100]).unwrap();
    drop(file);
    let (after, told) = inspect();
    assert_eq!(after, before, "the store reads as before");
    assert!(
        told.contains("WARN") && told.contains("dropped_bytes=100") && told.contains("journal=0"),
        "{told}"
    );
    assert_eq!(std::fs::metadata(&journal).unwrap().len(), whole);
    let (_, again) = inspect();
    assert!(!again.contains("dropped"), "told once: {again}");
}

/// A purge of more identities than fjall's 16 MiB memtables hold (480,000,
/// about 55 MB of tombstones in each of two partitions): it commits in
/// batches while it walks the time index, through memtable rotations, and
/// counts every identity once.
#[test]
fn purging_more_identities_than_a_memtable_holds_finishes() {
    let location = location("lsm", "big-purge");
    let mut store = store::open(&location).unwrap();
    let batch = 20_000u32;
    let groups = 24u32;
    for g in 0..groups {
        let writes: Vec<Write> = (0..batch)
            .map(|i| {
                let n = g * batch + i;
                let mut r = receipt(&format!("event-{n:08}-{}", "p".repeat(100)), u128::from(n));
                r.first_seen = t() + Duration::from_millis(u64::from(n));
                Write::Receipt(r)
            })
            .collect();
        store.commit(&writes).unwrap();
    }
    let before = t() + Duration::from_secs(3600);
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let purged = store.purge_receipts(before);
        let _ = done.send(purged.map_err(|e| e.to_string()));
    });
    let purged = finished
        .recv_timeout(Duration::from_secs(120))
        .expect("the purge did not finish in 120 s");
    assert_eq!(purged, Ok(u64::from(batch * groups)));
}
