//! The outbox has no gaps (docs/CONTRACT.md §10): a reader that asks for
//! the effects after the last position it saw, while 64 producers deliver,
//! sees every effect exactly once, in memory, on SQLite and on PostgreSQL
//! with two receivers sharing one database; per object, positions follow
//! versions. And the control: a cursor of step numbers (what the outbox
//! was read by before positions) misses an effect that became visible
//! after a higher number.

use crate::common::{runtime, t, versioned};
use crate::durability::{drop_schema, pg_url};
use crate::store::temp_db;
use snapshot_receiver::core::engine::{Handover, Pipeline, Reply, ShardSet, Work};
use snapshot_receiver::core::{Config, Context, Shard};
use snapshot_receiver::store::{PostgresStore, SqliteOptions, SqliteStore, Store};
use snapshot_receiver::{Clock, Effect, EffectId, ManualClock, Receiver};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

/// The issue's load, scaled for a debug build: 64 producers, 200 objects,
/// each object's versions delivered in order by one producer.
pub(crate) const PRODUCERS: u64 = 64;
pub(crate) const OBJECTS: u64 = 200;
const VERSIONS: u64 = 12;
/// The longest a test here waits for the producers or the reader: the
/// slowest run (PostgreSQL, 16 shards, a debug build) takes seconds.
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(300);
/// In memory deliveries are cheap: more of them, so that the reader's
/// polls fall between the shards' publications often.
const MEMORY_VERSIONS: u64 = 60;

/// How many versions of each object the producers deliver on `backend`.
pub(crate) fn versions(backend: &str) -> u64 {
    if backend == "memory" {
        MEMORY_VERSIONS
    } else {
        VERSIONS
    }
}

/// Held by a test while its PostgreSQL receivers run: two receivers of 16
/// shards hold dozens of connections (one per shard for reads), so these
/// tests take turns rather than exhaust the server's connections beside
/// the rest of the suite.
pub(crate) static POSTGRES_TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Receivers over one backend, all of them fed by the producers.
pub(crate) fn build(
    backend: &str,
    shards: usize,
    name: &str,
) -> (Vec<Receiver>, Option<(String, String)>) {
    let base = |schema_owner: usize| {
        let mut b = Receiver::builder()
            .clock(Arc::new(ManualClock::new(t())) as Arc<dyn Clock>)
            .shards(shards)
            .trail_capacity(1_000_000);
        if schema_owner == 0 {
            for o in 0..OBJECTS {
                b = b.object(&format!("obj-{o}"), 0, r#"{"v":0}"#);
            }
        }
        b
    };
    match backend {
        "memory" => (vec![base(0).build().unwrap()], None),
        "sqlite" => {
            let path = temp_db(&format!("outbox-{name}"));
            let path = path.to_str().unwrap().to_owned();
            let rx = base(0)
                .store_with(move || SqliteStore::open(&path, SqliteOptions::default()))
                .build()
                .unwrap();
            (vec![rx], None)
        }
        "postgres" => {
            let url = pg_url().expect("checked by the caller");
            let schema = format!("sr_outbox_{name}_{}", std::process::id());
            drop_schema(&url, &schema);
            // Two receivers, as two processes would run: each its own
            // committer, connection and run origin; nothing shared but the
            // database. The second opens the store the first seeded.
            let receivers = (0..2)
                .map(|i| {
                    let (url, schema) = (url.clone(), schema.clone());
                    base(i)
                        .store_with(move || PostgresStore::connect_in_schema(&url, Some(&schema)))
                        .build()
                        .unwrap()
                })
                .collect();
            (receivers, Some((url, schema)))
        }
        other => panic!("no backend {other}"),
    }
}

/// The producers: each delivers its objects' versions 1..=`versions` in
/// order, answered `applied` (a `retry` is delivered again).
pub(crate) fn spawn_producers(
    receivers: &[Receiver],
    versions: u64,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut producers = Vec::new();
    for p in 0..PRODUCERS {
        let receivers = receivers.to_vec();
        producers.push(tokio::spawn(async move {
            for v in 1..=versions {
                for o in (p..OBJECTS).step_by(PRODUCERS as usize) {
                    // Each version of an object by the next receiver in
                    // turn: with two, one object's effects are committed by
                    // both "processes", one after the other.
                    let rx = &receivers[(v as usize) % receivers.len()];
                    let (_, body) = versioned(o, v);
                    // `retry` (a group decided again too often after the
                    // other receiver's commits) asks the sender to redeliver.
                    let mut receipt = rx.deliver(body.as_bytes()).await;
                    while receipt.ack() == snapshot_receiver::Ack::Retry {
                        receipt = rx.deliver(body.as_bytes()).await;
                    }
                    assert_eq!(
                        receipt.decision(),
                        Some(snapshot_receiver::Decision::Applied),
                        "{receipt:?}"
                    );
                }
            }
        }));
    }
    producers
}

/// Runs the load and a reader polling `after(cursor)` until the producers
/// are done and the outbox read to its end; returns what the reader saw,
/// in the order it saw it.
async fn produce_and_poll(receivers: &[Receiver], versions: u64) -> Vec<Effect> {
    let done = Arc::new(AtomicBool::new(false));
    let producers = spawn_producers(receivers, versions);
    // The reader polls from a thread of its own, as a relay beside the
    // receiver would, so its reads fall between the shards' publications.
    let reader = {
        let rx = receivers[0].clone();
        let done = done.clone();
        std::thread::spawn(move || {
            let local = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            local.block_on(async move {
                let mut seen: Vec<Effect> = Vec::new();
                let mut cursor = 0;
                let deadline = std::time::Instant::now() + PATIENCE;
                loop {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "the reader waited {PATIENCE:?} for the producers to finish and the \
                         outbox to be read to its end: cursor at {cursor}, {} effects seen, \
                         producers done: {}",
                        seen.len(),
                        done.load(Ordering::Acquire)
                    );
                    let finished = done.load(Ordering::Acquire);
                    let batch = rx.outbox(cursor, 500).await.unwrap();
                    // The cursor is the last position handled, as a relay
                    // keeps it; what the reader missed is counted at the end.
                    if let Some(last) = batch.last() {
                        cursor = last.position;
                    }
                    let empty = batch.is_empty();
                    seen.extend(batch);
                    if finished && empty {
                        break seen;
                    }
                }
            })
        })
    };
    for p in producers {
        tokio::time::timeout(PATIENCE, p)
            .await
            .unwrap_or_else(|_| panic!("a producer's deliveries not answered in {PATIENCE:?}"))
            .unwrap();
    }
    done.store(true, Ordering::Release);
    tokio::task::spawn_blocking(move || reader.join().unwrap())
        .await
        .unwrap()
}

/// Every effect seen once, all of them, per object in version order.
async fn check(receivers: &[Receiver], seen: &[Effect], versions: u64, label: &str) {
    let all = receivers[0].outbox(0, usize::MAX).await.unwrap();
    assert_eq!(
        all.len() as u64,
        OBJECTS * versions,
        "{label}: one effect per delivery"
    );
    let ids: Vec<EffectId> = seen.iter().map(|e| e.id).collect();
    let unique: HashSet<EffectId> = ids.iter().copied().collect();
    assert_eq!(unique.len(), ids.len(), "{label}: an effect seen twice");
    let expected: HashSet<EffectId> = all.iter().map(|e| e.id).collect();
    let missed = expected.difference(&unique).count();
    assert_eq!(missed, 0, "{label}: the reader missed {missed} effects");
    // Gap-free: the reader saw positions 1, 2, 3, ... in order.
    let positions: Vec<u64> = seen.iter().map(|e| e.position).collect();
    assert_eq!(
        positions,
        (1..=OBJECTS * versions).collect::<Vec<_>>(),
        "{label}"
    );
    let mut last: HashMap<&str, u64> = HashMap::new();
    for e in seen {
        let previous = last.insert(&e.object_id, e.version).unwrap_or(0);
        assert!(
            e.version > previous,
            "{label}: {} v{} at position {} after v{previous}",
            e.object_id,
            e.version,
            e.position
        );
    }
}

fn cursor_run(backend: &str, shards: usize) {
    if backend == "postgres" && pg_url().is_none() {
        return;
    }
    let name = format!("{backend}_{shards}");
    let _turn = (backend == "postgres").then(|| {
        POSTGRES_TURN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    });
    runtime().block_on(async {
        let (receivers, pg) = build(backend, shards, &name);
        let versions = versions(backend);
        let seen = produce_and_poll(&receivers, versions).await;
        check(&receivers, &seen, versions, &name).await;
        for rx in &receivers {
            rx.shutdown().await;
        }
        if let Some((url, schema)) = pg {
            drop_schema(&url, &schema);
        }
    });
}

#[test]
fn memory_reader_misses_nothing_1_shard() {
    cursor_run("memory", 1);
}

#[test]
fn memory_reader_misses_nothing_4_shards() {
    cursor_run("memory", 4);
}

#[test]
fn memory_reader_misses_nothing_16_shards() {
    cursor_run("memory", 16);
}

#[test]
fn sqlite_reader_misses_nothing_1_shard() {
    cursor_run("sqlite", 1);
}

#[test]
fn sqlite_reader_misses_nothing_4_shards() {
    cursor_run("sqlite", 4);
}

#[test]
fn sqlite_reader_misses_nothing_16_shards() {
    cursor_run("sqlite", 16);
}

#[test]
fn postgres_two_receivers_reader_misses_nothing_1_shard() {
    cursor_run("postgres", 1);
}

#[test]
fn postgres_two_receivers_reader_misses_nothing_4_shards() {
    cursor_run("postgres", 4);
}

#[test]
fn postgres_two_receivers_reader_misses_nothing_16_shards() {
    cursor_run("postgres", 16);
}

/// A reply token that keeps nothing: these tests read the store.
struct Ignore;
impl Reply for Ignore {
    fn answer(self, _: snapshot_receiver::core::engine::Answer<'_>) {}
}

/// Two shards, one object each, each with one applied delivery decided;
/// shard 0's step takes the lower sequence number.
fn two_decided_shards() -> (
    ShardSet<()>,
    Pipeline<Ignore>,
    Pipeline<Ignore>,
    Vec<snapshot_receiver::store::Write>,
) {
    let ctx = Context::new(
        Config {
            shards: 2,
            ..Config::default()
        },
        Arc::new(ManualClock::new(
            UNIX_EPOCH + std::time::Duration::from_secs(1),
        )),
    );
    // Objects that route to shard 0 and to shard 1.
    let mut by_shard: BTreeMap<usize, u64> = BTreeMap::new();
    for o in 0.. {
        by_shard
            .entry(snapshot_receiver::core::route(Some(&format!("obj-{o}")), 2))
            .or_insert(o);
        if by_shard.len() == 2 {
            break;
        }
    }
    let mut shards = vec![Shard::new(), Shard::new()];
    let mut seeds = Vec::new();
    for (shard, o) in &by_shard {
        let id = format!("obj-{o}");
        shards[*shard]
            .insert_object(&ctx, &id, 0, r#"{"v":0}"#)
            .unwrap();
        seeds.push(snapshot_receiver::store::Write::Seed(
            Shard::seed_row(&ctx, &id, 0, r#"{"v":0}"#).unwrap(),
        ));
    }
    let set = ShardSet::durable(ctx, shards, ());
    let mut pipelines = (Pipeline::new(0), Pipeline::new(1));
    for (shard, o) in &by_shard {
        let (_, body) = versioned(*o, 1);
        let work = Work::Deliver(set.ctx().parser().parse(body.as_bytes()).unwrap(), Ignore);
        match shard {
            0 => pipelines.0.decide(&set, [work]),
            _ => pipelines.1.decide(&set, [work]),
        }
    }
    (set, pipelines.0, pipelines.1, seeds)
}

fn writes(
    set: &ShardSet<()>,
    pipeline: &mut Pipeline<Ignore>,
) -> Vec<snapshot_receiver::store::Write> {
    match pipeline.hand_over(set) {
        Handover::Commit(writes) => writes,
        other => panic!("a group to commit, not {other:?}"),
    }
}

/// The must-fail control, as a regression test of the old numbering:
/// shard 0's step is numbered first but its group commits second. A reader
/// by step number that read between the two commits has passed shard 0's
/// number and never sees its effect; the reader by outbox position sees
/// both, in commit order.
#[test]
#[allow(deprecated)]
fn a_cursor_of_step_numbers_misses_an_effect_committed_late_positions_do_not() {
    let (set, mut first, mut second, seeds) = two_decided_shards();
    let path = temp_db("outbox-control");
    let mut store = SqliteStore::open(path.to_str().unwrap(), SqliteOptions::default()).unwrap();
    store.commit(&seeds).unwrap();
    let mut outbox = store.outbox_store().unwrap().expect("a file store");
    let early = writes(&set, &mut first);
    let late = writes(&set, &mut second);
    // The later-numbered step commits first.
    store.commit(&late).unwrap();
    let by_seq = store.replacements_since(0).unwrap();
    let by_position = outbox.effects_after(0, 10).unwrap();
    let seq_cursor = by_seq.iter().map(|r| r.key.seq).max().unwrap();
    let position_cursor = by_position.last().unwrap().position;
    store.commit(&early).unwrap();
    let seq_after = store.replacements_since(seq_cursor).unwrap();
    let position_after = outbox.effects_after(position_cursor, 10).unwrap();
    // Step numbers: the first step's effect is behind the cursor for good.
    assert_eq!(by_seq.len(), 1);
    assert!(seq_after.is_empty(), "{seq_after:?}");
    assert_eq!(store.replacements_since(0).unwrap().len(), 2);
    // Positions: commit order, each seen once.
    assert_eq!(by_position.len(), 1);
    assert_eq!(position_after.len(), 1);
    assert_eq!(
        (by_position[0].position, position_after[0].position),
        (1, 2)
    );
    assert!(position_after[0].id.seq < by_position[0].id.seq);
}

/// The same trap in memory: a reader that asks the shards one after the
/// other by step number passes a number another shard publishes after its
/// turn; the outbox gives the effect its position when it is published.
#[test]
fn in_memory_a_reader_by_step_number_misses_what_the_outbox_position_keeps() {
    let ctx = Context::new(
        Config {
            shards: 2,
            ..Config::default()
        },
        Arc::new(ManualClock::new(
            UNIX_EPOCH + std::time::Duration::from_secs(1),
        )),
    );
    let ids: Vec<u64> = (0..)
        .scan(BTreeMap::new(), |found: &mut BTreeMap<usize, u64>, o| {
            found
                .entry(snapshot_receiver::core::route(Some(&format!("obj-{o}")), 2))
                .or_insert(o);
            Some(found.clone())
        })
        .find(|found| found.len() == 2)
        .unwrap()
        .into_values()
        .collect();
    let mut shards = vec![Shard::new(), Shard::new()];
    for (shard, o) in ids.iter().enumerate() {
        shards[shard]
            .insert_object(&ctx, &format!("obj-{o}"), 0, r#"{"v":0}"#)
            .unwrap();
    }
    let set = ShardSet::new(ctx, shards, ());
    let deliver = |shard: usize| {
        let (_, body) = versioned(ids[shard], 1);
        set.deliver(shard, set.ctx().parser().parse(body.as_bytes()).unwrap())
    };
    // The old reader's turn at shard 0 comes before shard 0's step...
    let at_shard_0 = set.read(0, |s| s.effects_since(0).unwrap());
    deliver(0);
    deliver(1);
    // ...and its turn at shard 1 after shard 1's.
    let at_shard_1 = set.read(1, |s| s.effects_since(0).unwrap());
    let cursor = at_shard_0
        .iter()
        .chain(&at_shard_1)
        .map(|r| r.seq)
        .max()
        .unwrap();
    let later: usize = (0..2)
        .map(|shard| set.read(shard, |s| s.effects_since(cursor).unwrap().len()))
        .sum();
    assert_eq!((at_shard_0.len(), at_shard_1.len(), later), (0, 1, 0));
    // Shard 0's effect (the lower number) is never seen by that reader.
    let outbox = set.outbox().expect("kept in memory");
    let positions: Vec<(u64, u64)> = outbox
        .after(0, 10)
        .unwrap()
        .iter()
        .map(|e| (e.position, e.id.seq))
        .collect();
    assert_eq!(positions.len(), 2);
    assert_eq!(positions[0].0, 1);
    assert!(
        positions[0].1 < positions[1].1,
        "published in step order here"
    );
}

/// Issue D1: per object, outbox positions follow versions also when
/// several effects of one object commit in one group. One shard decides
/// versions 1 to 3 of `obj-0` and of `obj-1`, interleaved, as one group;
/// the store numbers the six history rows as they were decided.
fn one_group_of_several_versions(store: &mut dyn Store) -> Vec<(String, u64, u64)> {
    let ctx = Context::new(
        Config {
            shards: 1,
            ..Config::default()
        },
        Arc::new(ManualClock::new(
            UNIX_EPOCH + std::time::Duration::from_secs(1),
        )),
    );
    let mut shard = Shard::new();
    let mut seeds = Vec::new();
    for o in 0..2 {
        let id = format!("obj-{o}");
        shard.insert_object(&ctx, &id, 0, r#"{"v":0}"#).unwrap();
        seeds.push(snapshot_receiver::store::Write::Seed(
            Shard::seed_row(&ctx, &id, 0, r#"{"v":0}"#).unwrap(),
        ));
    }
    let set = ShardSet::durable(ctx, vec![shard], ());
    let mut pipeline = Pipeline::new(0);
    let works: Vec<Work<Ignore>> = (1..=3)
        .flat_map(|v| [(0, v), (1, v)])
        .map(|(o, v)| {
            let (_, body) = versioned(o, v);
            Work::Deliver(set.ctx().parser().parse(body.as_bytes()).unwrap(), Ignore)
        })
        .collect();
    pipeline.decide(&set, works);
    let group = writes(&set, &mut pipeline);
    let histories = group
        .iter()
        .filter(|w| matches!(w, snapshot_receiver::store::Write::Effect(_)))
        .count();
    assert_eq!(histories, 6, "one group holding all six effects");
    store.commit(&seeds).unwrap();
    store.commit(&group).unwrap();
    let mut outbox = store.outbox_store().unwrap().expect("a durable store");
    outbox
        .effects_after(0, 100)
        .unwrap()
        .iter()
        .map(|e| (e.object_id.to_string(), e.version, e.position))
        .collect()
}

/// What [`one_group_of_several_versions`] must read back: positions 1 to 6
/// in the order decided, so each object's in version order.
fn decided_order() -> Vec<(String, u64, u64)> {
    (1..=3)
        .flat_map(|v| [(0, v), (1, v)])
        .zip(1..)
        .map(|((o, v), position)| (format!("obj-{o}"), v, position))
        .collect()
}

#[test]
fn sqlite_one_group_of_several_versions_of_an_object_is_numbered_in_version_order() {
    let path = temp_db("outbox-one-group");
    let mut store = SqliteStore::open(path.to_str().unwrap(), SqliteOptions::default()).unwrap();
    assert_eq!(one_group_of_several_versions(&mut store), decided_order());
}

#[test]
fn postgres_one_group_of_several_versions_of_an_object_is_numbered_in_version_order() {
    let Some(url) = pg_url() else { return };
    let schema = format!("sr_outbox_one_group_{}", std::process::id());
    drop_schema(&url, &schema);
    let mut store = PostgresStore::connect_in_schema(&url, Some(&schema)).unwrap();
    let numbered = one_group_of_several_versions(&mut store);
    drop(store);
    drop_schema(&url, &schema);
    assert_eq!(numbered, decided_order());
}
