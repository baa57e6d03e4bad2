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
use snapshot_receiver::{
    fixture::Fixture, Decision, Limits, ManualClock, Outcome, Receipt, Receiver,
};
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

/// Whether `r` held its event on an existing object that is not paused
/// (the object then holds it, as a missing version does).
fn holds_on_object(r: &Receipt) -> bool {
    matches!(r.outcome, Outcome::Decided(Decision::Held(_)))
        && r.object.as_ref().is_some_and(|o| !o.paused)
}

/// Where a run keeps its decisions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backend {
    Memory,
    Sqlite,
    Postgres,
    /// The log-structured store (`lsm:DIR`), in a build with the feature.
    Lsm,
}

/// The durable backends a run compares with memory besides PostgreSQL:
/// SQLite, and the log-structured store when this build has it.
pub(crate) fn embedded_backends() -> Vec<Backend> {
    let mut backends = vec![Backend::Sqlite];
    if cfg!(feature = "lsm") {
        backends.push(Backend::Lsm);
    }
    backends
}

/// One setup: its objects, limits and profile, and its bodies with the
/// clock of each (`None`: the clock stays where it is).
pub(crate) struct Setup {
    pub(crate) name: String,
    pub(crate) objects: Vec<(String, u64, String)>,
    pub(crate) limits: Limits,
    pub(crate) profile: Option<snapshot_receiver::Profile>,
    pub(crate) bodies: Vec<(Vec<u8>, Option<std::time::SystemTime>)>,
}

/// How a run is made besides its backend.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RunOptions {
    /// The receiver's working set (`usize::MAX`: every object stays).
    pub(crate) working_set: usize,
    /// The receiver's identity cache (`usize::MAX`: every identity stays).
    pub(crate) identity_cache: usize,
    /// Bodies per `deliver_batch` call.
    pub(crate) batch: usize,
    /// Shut the receiver down once this many bodies are decided (at the
    /// next batch boundary) and build it again on the same store (durable
    /// backends only).
    pub(crate) restart_after: Option<usize>,
    /// Also shut down and build again once at the first batch boundary
    /// after a delivery was held on an object that is not paused (durable
    /// backends only): that object holds events, and start-up must load it
    /// although it is not paused.
    pub(crate) restart_on_hold: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            working_set: usize::MAX,
            identity_cache: usize::MAX,
            batch: BATCH,
            restart_after: None,
            restart_on_hold: false,
        }
    }
}

/// What a run leaves: every receipt in words, the objects at the end, and
/// (durable backends) the stored audit rows in words, in order.
pub(crate) struct Run {
    pub(crate) receipts: Vec<String>,
    pub(crate) objects: Vec<String>,
    pub(crate) audit: Vec<String>,
    /// Group commits the store refused as conflicts, every run of the
    /// receiver together (durable backends).
    pub(crate) conflicts: u64,
    /// Event identities in the registry at the end.
    pub(crate) identities: usize,
    /// Identities the filter of stored identities spared a read, every run
    /// of the receiver together.
    pub(crate) spared: u64,
}

/// Decides `setup` on `backend` (one shard, so the order of every step is
/// the order of the bodies); returns every receipt in words and the
/// objects at the end.
async fn run(setup: &Setup, backend: Backend, pg: Option<&str>) -> (Vec<String>, Vec<String>) {
    let run = run_with(setup, backend, pg, "agree", RunOptions::default()).await;
    (run.receipts, run.objects)
}

/// Every object of `rx` as one line (id, version, state, paused, held
/// events), sorted.
async fn object_lines(rx: &Receiver) -> Vec<String> {
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
    objects
}

/// Decides `setup` on `backend` as `options` say; `label` keeps the store
/// apart from other runs of the same setup.
pub(crate) async fn run_with(
    setup: &Setup,
    backend: Backend,
    pg: Option<&str>,
    label: &str,
    options: RunOptions,
) -> Run {
    let clock = Arc::new(ManualClock::new(t()));
    let tag = setup
        .name
        .replace(|c: char| !c.is_ascii_alphanumeric(), "_");
    // PostgreSQL folds unquoted names to lower case, and the store refuses
    // a schema name it would fold: the fixtures' names have capitals.
    let schema = format!("sr_{label}_{tag}_{}", std::process::id()).to_ascii_lowercase();
    let path = temp_db(&format!("{label}-{tag}"));
    let _ = std::fs::remove_dir_all(format!("{}.lsm", path.display()));
    if let (Backend::Postgres, Some(url)) = (backend, pg) {
        drop_schema(url, &schema);
    }
    let build = || {
        let mut builder = Receiver::builder()
            .shards(1)
            .clock(clock.clone())
            .limits(setup.limits.clone())
            .working_set(options.working_set)
            .identity_cache(options.identity_cache);
        if let Some(p) = &setup.profile {
            builder = builder.profile(p.clone());
        }
        for (id, version, state) in &setup.objects {
            builder = builder.object(id, *version, state);
        }
        match backend {
            Backend::Memory => {}
            Backend::Sqlite => {
                builder = builder.store(&format!("sqlite:{}", path.display()));
            }
            Backend::Postgres => {
                let url = pg.expect("a PostgreSQL run has a server");
                builder = builder.store(url).store_schema(&schema);
            }
            Backend::Lsm => {
                builder = builder.store(&format!("lsm:{}.lsm", path.display()));
            }
        }
        builder
            .build()
            .unwrap_or_else(|e| panic!("{} on {backend:?}: {e}", setup.name))
    };
    let mut rx = build();
    crate::working_set::filter_ready(&rx).await;
    let mut spared = 0;
    let mut receipts = Vec::with_capacity(setup.bodies.len());
    let mut pending: Vec<&[u8]> = Vec::new();
    let mut restart = options.restart_after.filter(|_| backend != Backend::Memory);
    let mut restart_on_hold = options.restart_on_hold && backend != Backend::Memory;
    // A delivery was held on an object that is not paused.
    let mut held_on_object = false;
    let mut conflicts = 0;
    for (i, (body, at)) in setup.bodies.iter().enumerate() {
        // At the first batch boundary from that point on: batching is part
        // of the stream (the deliveries decided with a variant in one
        // group see the object it pauses still unpaused).
        let at_point = restart.is_some_and(|after| i >= after);
        let on_hold = restart_on_hold && held_on_object;
        if (at_point || on_hold) && pending.is_empty() {
            if at_point {
                restart = None;
            }
            if on_hold {
                restart_on_hold = false;
            }
            conflicts += rx.store_stats().map_or(0, |s| s.conflicts);
            spared += rx.memory().await.map_or(0, |m| m.identities_spared);
            let before = object_lines(&rx).await;
            rx.shutdown().await;
            drop(rx);
            rx = build();
            crate::working_set::filter_ready(&rx).await;
            // What start-up resumed: every object as it was, its pause and
            // its held events included (an object that holds events but is
            // not paused must be loaded too).
            assert_eq!(
                object_lines(&rx).await,
                before,
                "{}: objects after the restart at body {i} on {backend:?}",
                setup.name
            );
        }
        if let Some(at) = at {
            // A clock change: the bodies before it are decided first.
            for r in rx.deliver_batch(&pending).await {
                held_on_object |= holds_on_object(&r);
                receipts.push(words(&r));
            }
            pending.clear();
            clock.set(*at);
        }
        pending.push(body);
        if pending.len() == options.batch {
            for r in rx.deliver_batch(&pending).await {
                held_on_object |= holds_on_object(&r);
                receipts.push(words(&r));
            }
            pending.clear();
        }
    }
    for r in rx.deliver_batch(&pending).await {
        receipts.push(words(&r));
    }
    let objects = object_lines(&rx).await;
    // After the reads above: each shard ran the pauses queued for it and
    // committed them before answering, so the audit holds them.
    let audit = match backend {
        Backend::Memory => Vec::new(),
        _ => rx
            .stored_audit()
            .await
            .unwrap_or_else(|e| panic!("{}: stored audit on {backend:?}: {e}", setup.name))
            .iter()
            .map(|a| {
                format!(
                    "{:?} {:?} {:?} {} {:?} {:?} {} {:?} {:?}",
                    a.at,
                    a.event_id,
                    a.object_id,
                    a.kind,
                    a.decision,
                    a.version,
                    a.replacement,
                    a.detail,
                    a.body.as_deref().map(String::from_utf8_lossy)
                )
            })
            .collect(),
    };
    conflicts += rx.store_stats().map_or(0, |s| s.conflicts);
    spared += rx.memory().await.map_or(0, |m| m.identities_spared);
    let identities = rx.context().registry().len();
    rx.shutdown().await;
    if let (Backend::Postgres, Some(url)) = (backend, pg) {
        drop_schema(url, &schema);
    }
    Run {
        receipts,
        objects,
        audit,
        conflicts,
        identities,
        spared,
    }
}

/// Runs `setup` on every backend and compares each with memory: the first
/// receipt that differs is named with its body.
async fn agree(setup: &Setup) -> usize {
    let url = pg_url();
    let memory = run(setup, Backend::Memory, None).await;
    let mut backends = embedded_backends();
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
pub(crate) fn corpus_objects() -> Vec<(String, u64, String)> {
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
pub(crate) const ENGINE_OPS: usize = 8;

/// The two fuzz corpora as setups: every body of the envelope corpus, and
/// the first [`ENGINE_OPS`] deliveries of each engine scenario.
pub(crate) fn corpus_setups() -> Vec<Setup> {
    let envelope_bodies: Vec<_> = corpus("envelope")
        .iter()
        .map(|f| (std::fs::read(f).unwrap(), None))
        .collect();
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
    vec![
        Setup {
            name: "envelope corpus".to_owned(),
            objects: corpus_objects(),
            limits: envelope::limits(),
            profile: None,
            bodies: envelope_bodies,
        },
        Setup {
            name: "engine corpus".to_owned(),
            objects: corpus_objects(),
            limits: envelope::limits(),
            profile: None,
            bodies,
        },
    ]
}

/// Every fixture of the bank in `fixtures/` as a setup, in file order.
pub(crate) fn fixture_setups() -> Vec<Setup> {
    let dir = crate::common::repo("fixtures");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    // The bank also holds files in other formats (a deliveries list).
    files
        .iter()
        .filter_map(|file| Fixture::load(file).ok().map(|f| (file, f)))
        .map(|(file, fixture)| Setup {
            name: file.file_stem().unwrap().to_string_lossy().into_owned(),
            objects: fixture.initial_state.clone(),
            limits: Limits::default(),
            profile: fixture.profile.clone(),
            bodies: fixture
                .deliveries
                .iter()
                .map(|d| (d.body.clone(), d.received_at))
                .collect(),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_corpus_body_gets_the_same_receipt_in_memory_on_sqlite_and_on_postgres() {
    for setup in corpus_setups() {
        assert_eq!(agree(&setup).await, setup.bodies.len());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fixture_delivery_gets_the_same_receipt_in_memory_on_sqlite_and_on_postgres() {
    let mut decided = 0;
    let mut fixtures = 0;
    for setup in fixture_setups() {
        fixtures += 1;
        decided += agree(&setup).await;
    }
    assert_eq!(
        (fixtures, decided),
        (14, 79),
        "fixtures and deliveries decided"
    );
}
