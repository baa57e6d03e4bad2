//! Every backend accepts the same inputs (docs/CONTRACT.md, fault
//! isolation): every body of both fuzz corpora and of the fixture bank is
//! decided in memory, on SQLite and on PostgreSQL, and each gets the same
//! receipt on all three, and the objects end the same. A body one store
//! cannot hold (an id with U+0000 on PostgreSQL, before it was refused at
//! parse time) shows up here as `retry` on one backend and a decision on
//! the others.

use crate::common::t;
use crate::durability::{drop_schema, pg_url};
use crate::fuzz_corpus::{corpus, engine, envelope};
use crate::store::temp_db;
use snapshot_receiver::{fixture::Fixture, Limits, ManualClock, Outcome, Receipt, Receiver};
use std::sync::Arc;

/// Bodies per `deliver_batch` call: one group per call on one shard.
const BATCH: usize = 256;

/// A receipt in words: everything a caller can read off it.
fn words(r: &Receipt) -> String {
    let outcome = match &r.outcome {
        Outcome::Decided(d) => d.to_string(),
        Outcome::Retry(why) => format!("retry {why}"),
        Outcome::Rejected(why) => format!("reject {}: {why}", why.as_str()),
    };
    let object = r
        .object
        .as_ref()
        .map(|o| format!("v{} {} paused {}", o.version, o.state.compact(), o.paused));
    format!(
        "{:?} {:?} {outcome} {object:?} replacement {} created {}",
        r.event_id, r.object_id, r.replacement, r.created
    )
}

/// Where a run keeps its decisions.
#[derive(Clone, Copy, Debug)]
enum Backend {
    Memory,
    Sqlite,
    Postgres,
}

/// One setup: its objects, limits and profile, and its bodies with the
/// clock of each (`None`: the clock stays where it is).
struct Setup {
    name: String,
    objects: Vec<(String, u64, String)>,
    limits: Limits,
    profile: Option<snapshot_receiver::Profile>,
    bodies: Vec<(Vec<u8>, Option<std::time::SystemTime>)>,
}

/// Decides `setup` on `backend` (one shard, so the order of every step is
/// the order of the bodies); returns every receipt in words and the
/// objects at the end.
async fn run(setup: &Setup, backend: Backend, pg: Option<&str>) -> (Vec<String>, Vec<String>) {
    let clock = Arc::new(ManualClock::new(t()));
    let mut builder = Receiver::builder()
        .shards(1)
        .clock(clock.clone())
        .limits(setup.limits.clone());
    if let Some(p) = &setup.profile {
        builder = builder.profile(p.clone());
    }
    for (id, version, state) in &setup.objects {
        builder = builder.object(id, *version, state);
    }
    let tag = setup
        .name
        .replace(|c: char| !c.is_ascii_alphanumeric(), "_");
    let schema = format!("sr_agree_{tag}_{}", std::process::id());
    match backend {
        Backend::Memory => {}
        Backend::Sqlite => {
            let path = temp_db(&format!("agree-{tag}"));
            builder = builder.store(&format!("sqlite:{}", path.display()));
        }
        Backend::Postgres => {
            let url = pg.expect("a PostgreSQL run has a server");
            drop_schema(url, &schema);
            builder = builder.store(url).store_schema(&schema);
        }
    }
    let rx = builder
        .build()
        .unwrap_or_else(|e| panic!("{} on {backend:?}: {e}", setup.name));
    let mut receipts = Vec::with_capacity(setup.bodies.len());
    let mut pending: Vec<&[u8]> = Vec::new();
    for (body, at) in &setup.bodies {
        if let Some(at) = at {
            // A clock change: the bodies before it are decided first.
            for r in rx.deliver_batch(&pending).await {
                receipts.push(words(&r));
            }
            pending.clear();
            clock.set(*at);
        }
        pending.push(body);
        if pending.len() == BATCH {
            for r in rx.deliver_batch(&pending).await {
                receipts.push(words(&r));
            }
            pending.clear();
        }
    }
    for r in rx.deliver_batch(&pending).await {
        receipts.push(words(&r));
    }
    let mut objects: Vec<String> = rx
        .objects()
        .await
        .iter()
        .map(|o| {
            format!(
                "{} v{} {} paused {} held {}",
                o.object_id,
                o.version,
                o.state.compact(),
                o.paused,
                o.held
            )
        })
        .collect();
    objects.sort();
    rx.shutdown().await;
    if let (Backend::Postgres, Some(url)) = (backend, pg) {
        drop_schema(url, &schema);
    }
    (receipts, objects)
}

/// Runs `setup` on every backend and compares each with memory: the first
/// receipt that differs is named with its body.
async fn agree(setup: &Setup) -> usize {
    let url = pg_url();
    let memory = run(setup, Backend::Memory, None).await;
    let mut backends = vec![Backend::Sqlite];
    if url.is_some() {
        backends.push(Backend::Postgres);
    }
    for backend in backends {
        let other = run(setup, backend, url.as_deref()).await;
        assert_eq!(memory.0.len(), setup.bodies.len());
        assert_eq!(other.0.len(), memory.0.len(), "{}", setup.name);
        for (i, (m, o)) in memory.0.iter().zip(&other.0).enumerate() {
            assert_eq!(
                m,
                o,
                "{}: body {i} ({:?}) in memory and on {backend:?}",
                setup.name,
                String::from_utf8_lossy(&setup.bodies[i].0)
            );
        }
        assert_eq!(memory.1, other.1, "{}: objects on {backend:?}", setup.name);
    }
    memory.0.len()
}

/// The objects both corpora name (the card fixture's, and the engine
/// target's `obj-0`..`obj-2`; `obj-3` stays unknown).
fn corpus_objects() -> Vec<(String, u64, String)> {
    let mut objects = vec![
        (
            "card-7".to_owned(),
            10,
            r#"{"stage":"queued","label":"Map"}"#.to_owned(),
        ),
        (
            "card-8".to_owned(),
            3,
            r#"{"stage":"ready","label":"Chart"}"#.to_owned(),
        ),
    ];
    for o in 0..3 {
        objects.push((format!("obj-{o}"), 2, "{}".to_owned()));
    }
    objects
}

/// Most operations taken from one engine scenario (the target takes 64),
/// which keeps the run within about a minute on a loaded machine.
const ENGINE_OPS: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_corpus_body_gets_the_same_receipt_in_memory_on_sqlite_and_on_postgres() {
    let envelope_bodies: Vec<_> = corpus("envelope")
        .iter()
        .map(|f| (std::fs::read(f).unwrap(), None))
        .collect();
    let n = envelope_bodies.len();
    let setup = Setup {
        name: "envelope corpus".to_owned(),
        objects: corpus_objects(),
        limits: envelope::limits(),
        profile: None,
        bodies: envelope_bodies,
    };
    assert_eq!(agree(&setup).await, n);

    let mut bodies = Vec::new();
    for f in corpus("engine") {
        let scenario = engine::decode(&std::fs::read(&f).unwrap()).expect("a decodable scenario");
        for op in scenario.ops.iter().take(ENGINE_OPS) {
            match op {
                engine::Op::Deliver(e) => bodies.push((e.encode(), None)),
                engine::Op::Raw(raw) => bodies.push((raw[..raw.len().min(512)].to_vec(), None)),
                engine::Op::Authority { .. } => {}
            }
        }
    }
    assert!(bodies.len() > 3000, "{}", bodies.len());
    let n = bodies.len();
    let setup = Setup {
        name: "engine corpus".to_owned(),
        objects: corpus_objects(),
        limits: envelope::limits(),
        profile: None,
        bodies,
    };
    assert_eq!(agree(&setup).await, n);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fixture_delivery_gets_the_same_receipt_in_memory_on_sqlite_and_on_postgres() {
    let dir = crate::common::repo("fixtures");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    let mut decided = 0;
    let mut fixtures = 0;
    for file in files {
        // The bank also holds files in other formats (a deliveries list).
        let Ok(fixture) = Fixture::load(&file) else {
            continue;
        };
        fixtures += 1;
        let setup = Setup {
            name: file.file_stem().unwrap().to_string_lossy().into_owned(),
            objects: fixture.initial_state.clone(),
            limits: Limits::default(),
            profile: fixture.profile.clone(),
            bodies: fixture
                .deliveries
                .iter()
                .map(|d| (d.body.clone(), d.received_at))
                .collect(),
        };
        decided += agree(&setup).await;
    }
    assert_eq!(
        (fixtures, decided),
        (14, 79),
        "fixtures and deliveries decided"
    );
}
