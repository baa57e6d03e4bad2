//! Durable named relays (docs/CONTRACT.md §10): every effect handed to the
//! handler at least once, with its stable id; per object in version order,
//! never two of one object at once, objects in parallel up to the bound;
//! a refused effect retried on the schedule, then parked `failed` and
//! visible, its object's later effects waiting behind it; the cursor in
//! the store, so that a restarted relay resumes at it; relays of
//! different names apart.

use crate::common::{body, runtime, t, versioned, T};
use crate::durability::{drop_schema, pg_url};
use crate::outbox::{build, spawn_producers, versions, OBJECTS};
use crate::store::temp_db;
use snapshot_receiver::relay::{
    HandlerError, HandlerFuture, RelayOptions, RelayProgress, RelayStart,
};
use snapshot_receiver::store::{
    relays_report, ParkedEffect, ParkedStatus, RelaySave, RelaysReport, SqliteOptions, SqliteStore,
    StoreReader,
};
use snapshot_receiver::{Clock, Effect, EffectId, ManualClock, Receiver};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Long enough for any wait in these tests; a relay that needs it failed.
const PATIENCE: Duration = Duration::from_secs(60);

/// What the destination saw, in the order it accepted it.
#[derive(Default)]
struct Sink {
    /// Every accepted effect: id, object, version.
    accepted: Mutex<Vec<(EffectId, String, u64)>>,
    /// Objects with an effect in the handler now.
    busy: Mutex<HashSet<String>>,
    /// Effects in the handler now, and the most there were at once.
    in_flight: AtomicUsize,
    most: AtomicUsize,
    /// An object was handed two effects at once.
    overlapped: Mutex<Vec<String>>,
}

impl Sink {
    /// A handler that accepts every effect after a short await (so that
    /// objects overlap).
    fn handler(self: &Arc<Self>) -> impl Fn(Effect) -> HandlerFuture + Send + Sync + 'static {
        let sink = self.clone();
        move |effect: Effect| {
            let sink = sink.clone();
            Box::pin(async move {
                let object = effect.object_id.to_string();
                if !sink.busy.lock().unwrap().insert(object.clone()) {
                    sink.overlapped.lock().unwrap().push(object.clone());
                }
                let now = sink.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                sink.most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_micros(200)).await;
                sink.in_flight.fetch_sub(1, Ordering::SeqCst);
                sink.busy.lock().unwrap().remove(&object);
                sink.accepted
                    .lock()
                    .unwrap()
                    .push((effect.id, object, effect.version));
                Ok(())
            })
        }
    }

    fn accepted(&self) -> Vec<(EffectId, String, u64)> {
        self.accepted.lock().unwrap().clone()
    }
}

/// Per object, the versions in the order the sink accepted them.
fn versions_by_object(accepted: &[(EffectId, String, u64)]) -> HashMap<String, Vec<u64>> {
    let mut by: HashMap<String, Vec<u64>> = HashMap::new();
    for (_, object, version) in accepted {
        by.entry(object.clone()).or_default().push(*version);
    }
    by
}

fn relay_under_load(backend: &str) {
    if backend == "postgres" && pg_url().is_none() {
        return;
    }
    let name = format!("relay_{backend}");
    let _turn = (backend == "postgres").then(|| {
        crate::outbox::POSTGRES_TURN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    });
    runtime().block_on(async {
        let (receivers, pg) = build(backend, 4, &name);
        let sink = Arc::new(Sink::default());
        let options = RelayOptions {
            concurrency: 4,
            batch: 64,
            poll_interval: Duration::from_millis(1),
            ..RelayOptions::new("app")
        };
        let relay = receivers[0].relay(options, sink.handler()).await.unwrap();
        let versions = versions(backend);
        for p in spawn_producers(&receivers, versions) {
            p.await.unwrap();
        }
        let total = OBJECTS * versions;
        let progress = relay.wait_for(total, PATIENCE).await;
        relay.stop().await.unwrap();
        assert_eq!(progress.position, total, "{name}: {progress:?}");
        assert_eq!(progress.parked, 0);
        let accepted = sink.accepted();
        // Every effect once (nothing was refused, so nothing re-sent).
        assert_eq!(accepted.len() as u64, total, "{name}");
        let ids: HashSet<EffectId> = accepted.iter().map(|(id, _, _)| *id).collect();
        let all: HashSet<EffectId> = receivers[0]
            .outbox(0, usize::MAX)
            .await
            .unwrap()
            .iter()
            .map(|e| e.id)
            .collect();
        assert_eq!(ids, all, "{name}: the effects the outbox holds");
        // Per object in version order, one at a time; objects in parallel,
        // never more than the bound.
        let expected: Vec<u64> = (1..=versions).collect();
        for (object, seen) in versions_by_object(&accepted) {
            assert_eq!(seen, expected, "{name}: {object}");
        }
        assert_eq!(*sink.overlapped.lock().unwrap(), Vec::<String>::new());
        let most = sink.most.load(Ordering::SeqCst);
        assert!((2..=4).contains(&most), "{name}: {most} at once");
        // The cursor is in the store.
        let mut outbox = receivers[0].outbox_store().await.unwrap();
        let rows = tokio::task::spawn_blocking(move || outbox.relays().unwrap())
            .await
            .unwrap();
        assert_eq!(
            rows.iter()
                .map(|r| (r.name.as_str(), r.position, r.owner.is_some()))
                .collect::<Vec<_>>(),
            [("app", total, true)]
        );
        // On PostgreSQL, the read-only reader's report of the relays is the
        // relay connection's (SQLite: relays_behind_the_window_...).
        if let Some((url, schema)) = pg.clone() {
            let mut outbox = receivers[0].outbox_store().await.unwrap();
            let (ours, read) = tokio::task::spawn_blocking(move || {
                let now = std::time::SystemTime::now();
                let window = Some(Duration::from_secs(60));
                let ours =
                    snapshot_receiver::store::relays_report(outbox.as_mut(), now, window).unwrap();
                let reader =
                    snapshot_receiver::store::StoreReader::open(&url, Some(&schema)).unwrap();
                (ours, reader.relays(now, window).unwrap())
            })
            .await
            .unwrap();
            assert_eq!(ours, read);
            assert_eq!(
                (
                    ours.last_position,
                    ours.relays[0].position,
                    ours.relays[0].lag
                ),
                (total, total, 0)
            );
        }
        for rx in &receivers {
            rx.shutdown().await;
        }
        if let Some((url, schema)) = pg {
            drop_schema(&url, &schema);
        }
    });
}

#[test]
fn memory_relay_hands_every_effect_once_per_object_in_order() {
    relay_under_load("memory");
}

#[test]
fn sqlite_relay_hands_every_effect_once_per_object_in_order() {
    relay_under_load("sqlite");
}

#[test]
fn postgres_relay_beside_two_receivers_hands_every_effect_once_in_order() {
    relay_under_load("postgres");
}

/// A receiver on the SQLite file at `path`, objects 1 to 3 known.
fn on_file(path: &str) -> Receiver {
    on(&At::Sqlite(path.to_owned()))
}

/// Where a relay test keeps its store: every test that parks effects runs
/// on both (docs/CONTRACT.md §10: a refused effect never stops the others,
/// on every store).
#[derive(Clone, Debug)]
pub(crate) enum At {
    /// A SQLite file.
    Sqlite(String),
    /// A schema of the PostgreSQL test server: URL, schema.
    Postgres(String, String),
    /// A directory of the log-structured store (feature `lsm`).
    #[cfg_attr(not(feature = "lsm"), allow(dead_code))]
    Lsm(String),
}

impl At {
    /// A fresh SQLite file named after the test.
    pub(crate) fn sqlite(name: &str) -> At {
        At::Sqlite(temp_db(name).to_str().unwrap().to_owned())
    }

    /// A fresh (dropped, then created by the first receiver) schema named
    /// after the test; `None` (the test skipped) without a server outside CI.
    pub(crate) fn postgres(name: &str) -> Option<At> {
        let url = pg_url()?;
        let schema = format!("sr_{name}_{}", std::process::id());
        drop_schema(&url, &schema);
        Some(At::Postgres(url, schema))
    }

    /// A fresh directory of the log-structured store named after the test.
    #[cfg(feature = "lsm")]
    pub(crate) fn lsm(name: &str) -> At {
        let path = temp_db(name);
        let _ = std::fs::remove_dir_all(&path);
        At::Lsm(path.to_str().unwrap().to_owned())
    }

    /// A builder whose receiver keeps its store here.
    pub(crate) fn store(
        &self,
        b: snapshot_receiver::ReceiverBuilder,
    ) -> snapshot_receiver::ReceiverBuilder {
        match self.clone() {
            At::Sqlite(path) => {
                b.store_with(move || SqliteStore::open(&path, SqliteOptions::default()))
            }
            At::Postgres(url, schema) => b.store_with(move || {
                snapshot_receiver::store::PostgresStore::connect_in_schema(&url, Some(&schema))
            }),
            At::Lsm(path) => b.store(&format!("lsm:{path}")),
        }
    }

    /// Drops a PostgreSQL schema once the test is done.
    pub(crate) fn done(&self) {
        if let At::Postgres(url, schema) = self {
            drop_schema(url, schema);
        }
    }
}

/// A receiver on the store `at`, objects 1 to 3 known.
fn on(at: &At) -> Receiver {
    let mut b = Receiver::builder().clock(Arc::new(ManualClock::new(t())) as Arc<dyn Clock>);
    for o in 1..=3 {
        b = b.object(&format!("obj-{o}"), 0, r#"{"v":0}"#);
    }
    at.store(b).build().unwrap()
}

/// Delivers versions `from..=to` of object `o` (all applied).
async fn deliver(rx: &Receiver, o: u64, versions: std::ops::RangeInclusive<u64>) {
    for v in versions {
        let (_, b) = versioned(o, v);
        let receipt = rx.deliver(b.as_bytes()).await;
        assert_eq!(
            receipt.decision(),
            Some(snapshot_receiver::Decision::Applied),
            "{receipt:?}"
        );
    }
}

fn quick(name: &str) -> RelayOptions {
    RelayOptions {
        poll_interval: Duration::from_millis(1),
        schedule: vec![Duration::from_millis(5), Duration::from_millis(5)],
        lease: Duration::from_secs(1),
        ..RelayOptions::new(name)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_relay_resumes_at_its_cursor_and_names_progress_apart() {
    let path = temp_db("relay-restart");
    let path = path.to_str().unwrap();
    let rx = on_file(path);
    deliver(&rx, 1, 1..=5).await;
    let sink = Arc::new(Sink::default());
    let relay = rx.relay(quick("app"), sink.handler()).await.unwrap();
    assert_eq!(relay.wait_for(5, PATIENCE).await.position, 5);
    relay.stop().await.unwrap();
    rx.shutdown().await;
    drop(rx);
    // A new process on the same file: two more effects.
    let rx = on_file(path);
    deliver(&rx, 1, 6..=7).await;
    let again = Arc::new(Sink::default());
    let relay = rx.relay(quick("app"), again.handler()).await.unwrap();
    assert_eq!(relay.wait_for(7, PATIENCE).await.position, 7);
    relay.stop().await.unwrap();
    let versions = |s: &Sink| s.accepted().iter().map(|a| a.2).collect::<Vec<_>>();
    assert_eq!(versions(&sink), [1, 2, 3, 4, 5]);
    assert_eq!(versions(&again), [6, 7], "resumed at its cursor");
    // Another name starts at the beginning and keeps its own cursor; one
    // started at the end sees only what comes next.
    let audit = Arc::new(Sink::default());
    let relay = rx.relay(quick("audit"), audit.handler()).await.unwrap();
    assert_eq!(relay.wait_for(7, PATIENCE).await.position, 7);
    relay.stop().await.unwrap();
    assert_eq!(versions(&audit), [1, 2, 3, 4, 5, 6, 7]);
    let tail = Arc::new(Sink::default());
    let options = RelayOptions {
        start: RelayStart::End,
        ..quick("tail")
    };
    let relay = rx.relay(options, tail.handler()).await.unwrap();
    assert_eq!(relay.wait_for(7, PATIENCE).await.position, 7);
    deliver(&rx, 1, 8..=8).await;
    assert_eq!(relay.wait_for(8, PATIENCE).await.position, 8);
    relay.stop().await.unwrap();
    assert_eq!(versions(&tail), [8]);
    let mut store = rx.outbox_store().await.unwrap();
    let rows = tokio::task::spawn_blocking(move || store.relays().unwrap())
        .await
        .unwrap();
    assert_eq!(
        rows.iter()
            .map(|r| (r.name.as_str(), r.position))
            .collect::<Vec<_>>(),
        [("app", 7), ("audit", 7), ("tail", 8)]
    );
    rx.shutdown().await;
}

/// Whether to refuse object, version, at its attempt (0: the first).
type Refuse = dyn Fn(&str, u64, usize) -> bool + Send + Sync;

/// A destination that refuses what `refuse` says (by object and version),
/// counting every attempt; otherwise accepts like [`Sink`].
struct Picky {
    sink: Arc<Sink>,
    attempts: Mutex<Vec<(String, u64)>>,
    refuse: Box<Refuse>,
}

impl Picky {
    fn handler(self: &Arc<Self>) -> impl Fn(Effect) -> HandlerFuture + Send + Sync + 'static {
        let picky = self.clone();
        let accept = self.sink.handler();
        move |effect: Effect| {
            let object = effect.object_id.to_string();
            let earlier = {
                let mut attempts = picky.attempts.lock().unwrap();
                let earlier = attempts
                    .iter()
                    .filter(|(o, v)| *o == object && *v == effect.version)
                    .count();
                attempts.push((object.clone(), effect.version));
                earlier
            };
            if (picky.refuse)(&object, effect.version, earlier) {
                let why = format!(
                    "{object} v{} refused (attempt {})",
                    effect.version,
                    earlier + 1
                );
                return Box::pin(async move { Err(HandlerError::new(why)) });
            }
            accept(effect)
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_effects_are_retried_in_order_then_failed_visibly_and_retried_by_an_operator() {
    refused_effects(At::sqlite("relay-refusals")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_refused_effects_are_retried_in_order_then_failed_visibly_and_retried() {
    let Some(at) = At::postgres("relay_refusals") else {
        return;
    };
    refused_effects(at.clone()).await;
    at.done();
}

#[cfg(feature = "lsm")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_lsm_refused_effects_are_retried_in_order_then_failed_visibly_and_retried() {
    refused_effects(At::lsm("relay-refusals-lsm")).await;
}

async fn refused_effects(at: At) {
    let rx = on(&at);
    // obj-1: v2 refused twice, then accepted. obj-2: v1 always refused
    // (until the operator's retry). obj-3: accepted.
    let fixed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let picky = Arc::new(Picky {
        sink: Arc::new(Sink::default()),
        attempts: Mutex::new(Vec::new()),
        refuse: {
            let fixed = fixed.clone();
            Box::new(move |object, version, earlier| match (object, version) {
                ("obj-1", 2) => earlier < 2,
                ("obj-2", 1) => !fixed.load(Ordering::SeqCst),
                _ => false,
            })
        },
    });
    deliver(&rx, 1, 1..=3).await;
    deliver(&rx, 2, 1..=2).await;
    deliver(&rx, 3, 1..=2).await;
    let relay = rx.relay(quick("app"), picky.handler()).await.unwrap();
    // Everything but obj-2 goes; obj-2's v1 exhausts its three attempts.
    let wait_failed = async {
        loop {
            let p = relay.progress();
            if p.failed == 1 && p.position == 7 && p.parked == 2 {
                break p;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let progress = tokio::time::timeout(PATIENCE, wait_failed)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "waited {PATIENCE:?} for position 7 with 2 parked, 1 failed: {:?}",
                relay.progress()
            )
        });
    assert_eq!(
        (progress.position, progress.parked, progress.failed),
        (7, 2, 1)
    );
    let by = versions_by_object(&picky.sink.accepted());
    assert_eq!(by["obj-1"], [1, 2, 3], "v3 only after v2 was accepted");
    assert_eq!(by["obj-3"], [1, 2]);
    assert!(!by.contains_key("obj-2"));
    let tries = |o: &str, v: u64| {
        picky
            .attempts
            .lock()
            .unwrap()
            .iter()
            .filter(|a| a.0 == o && a.1 == v)
            .count()
    };
    assert_eq!(tries("obj-1", 2), 3);
    assert_eq!(
        tries("obj-2", 1),
        3,
        "the first attempt and the schedule's two"
    );
    assert_eq!(tries("obj-2", 2), 0, "never handed out behind a failed one");
    // The failed effect is visible in the store, with its object's next.
    let mut store = rx.outbox_store().await.unwrap();
    let (parked, store) =
        tokio::task::spawn_blocking(move || (store.parked("app").unwrap(), store))
            .await
            .unwrap();
    let mut store = store;
    assert_eq!(
        parked
            .iter()
            .map(|p| (
                p.effect.object_id.to_string(),
                p.effect.version,
                p.status,
                p.attempts,
                p.error.clone()
            ))
            .collect::<Vec<_>>(),
        [
            (
                "obj-2".to_owned(),
                1,
                ParkedStatus::Failed,
                3,
                Some("obj-2 v1 refused (attempt 3)".to_owned())
            ),
            ("obj-2".to_owned(), 2, ParkedStatus::Waiting, 0, None),
        ]
    );
    // The destination is fixed; the operator retries the failed effects.
    fixed.store(true, Ordering::SeqCst);
    let retried = tokio::task::spawn_blocking(move || {
        store
            .retry_failed("app", None, std::time::SystemTime::now())
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(retried, 1);
    let progress = relay.wait_for(7, PATIENCE).await;
    relay.stop().await.unwrap();
    assert_eq!((progress.parked, progress.failed), (0, 0), "{progress:?}");
    let by = versions_by_object(&picky.sink.accepted());
    assert_eq!(by["obj-2"], [1, 2]);
    rx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_relay_hands_out_again_with_the_same_ids_nothing_lost() {
    let path = temp_db("relay-crash");
    let rx = on_file(path.to_str().unwrap());
    deliver(&rx, 1, 1..=3).await;
    // The first run's handler accepts v1 and v2, then hangs on v3: the
    // run is killed with v3 in the handler and its round unsaved.
    let first = Arc::new(Sink::default());
    let hang = {
        let accept = first.handler();
        move |effect: Effect| {
            if effect.version == 3 {
                return Box::pin(std::future::pending()) as HandlerFuture;
            }
            accept(effect)
        }
    };
    let relay = rx.relay(quick("app"), hang).await.unwrap();
    let handed = async {
        while first.accepted().len() < 2 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    tokio::time::timeout(PATIENCE, handed)
        .await
        .unwrap_or_else(|_| panic!("waited {PATIENCE:?} for the first run to accept v1 and v2"));
    let before: RelayProgress = relay.progress();
    relay.abort();
    assert_eq!(
        before.position, 0,
        "nothing saved while v3 is in the handler"
    );
    // The next run waits for the lease to lapse, then hands out all three.
    let second = Arc::new(Sink::default());
    let relay = rx.relay(quick("app"), second.handler()).await.unwrap();
    assert_eq!(relay.wait_for(3, PATIENCE).await.position, 3);
    relay.stop().await.unwrap();
    let ids = |s: &Sink| s.accepted().iter().map(|a| (a.0, a.2)).collect::<Vec<_>>();
    let (first, second) = (ids(&first), ids(&second));
    assert_eq!(second.iter().map(|a| a.1).collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!(first[..], second[..2], "re-sent with the same effect ids");
    rx.shutdown().await;
}

#[tokio::test]
async fn options_out_of_range_are_refused_by_name() {
    let rx = Receiver::builder().build().unwrap();
    let handler = |_: Effect| async { Ok::<(), HandlerError>(()) };
    for (options, message) in [
        (
            RelayOptions::new(""),
            "relay options: name \"\": must be 1 to 200 characters",
        ),
        (
            RelayOptions::new("app\nforged line"),
            "relay options: name \"app\\nforged line\": control characters would garble the reports that show it",
        ),
        (
            RelayOptions {
                concurrency: 0,
                ..RelayOptions::new("a")
            },
            "relay options: concurrency: must be at least 1",
        ),
        (
            RelayOptions {
                batch: 0,
                ..RelayOptions::new("a")
            },
            "relay options: batch: must be at least 1",
        ),
        (
            RelayOptions {
                lease: Duration::from_millis(10),
                ..RelayOptions::new("a")
            },
            "relay options: lease: 10ms is below 1 s",
        ),
        (
            RelayOptions {
                schedule: vec![Duration::from_secs(5), Duration::from_secs(86_401)],
                ..RelayOptions::new("a")
            },
            "relay options: schedule entry 2 (86401 s): above the longest wait, 86400 s (24 h)",
        ),
    ] {
        let error = rx.relay(options, handler).await.err().expect("refused");
        assert_eq!(error.to_string(), message);
    }
    rx.shutdown().await;
}

/// A round longer than the lease keeps the relay: one object's three
/// effects take 1.5 s each at the destination (4.5 s, the lease 1 s), and
/// a second run of the same relay, on a second receiver of the same file,
/// started meanwhile, hands nothing out until the first stops (it would
/// have taken the lapsed lease and sent the three again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_longer_than_the_lease_keeps_the_relay_from_a_second_run() {
    let path = temp_db("relay-long-round");
    let path = path.to_str().unwrap();
    let first_rx = on_file(path);
    deliver(&first_rx, 1, 1..=3).await;
    let slow = |effect: Effect| async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let _ = effect;
        Ok::<(), HandlerError>(())
    };
    let options = RelayOptions {
        lease: Duration::from_secs(1),
        ..quick("app")
    };
    let first = first_rx.relay(options.clone(), slow).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second_rx = on_file(path);
    let sink = Arc::new(Sink::default());
    let second = second_rx.relay(options, sink.handler()).await.unwrap();
    let progress = first.wait_for(3, PATIENCE).await;
    assert_eq!(progress.position, 3, "{progress:?}");
    assert_eq!(
        sink.accepted(),
        [],
        "the second run handed effects out while the first held the relay"
    );
    first.stop().await.unwrap();
    let taken_over = second.wait_for(3, PATIENCE).await;
    assert_eq!(taken_over.position, 3, "{taken_over:?}");
    second.stop().await.unwrap();
    assert_eq!(sink.accepted(), [], "nothing was left to hand out");
    first_rx.shutdown().await;
    second_rx.shutdown().await;
}

/// An in-memory receiver whose outbox holds one effect: `c-1` at version
/// 1, from `e-1`.
async fn one_effect_in_memory() -> Receiver {
    one_effect(None).await
}

/// A receiver (in memory, or on the store `at`) whose outbox holds one
/// effect: `c-1` at version 1, from `e-1`.
async fn one_effect(at: Option<&At>) -> Receiver {
    let b = Receiver::builder()
        .clock(Arc::new(ManualClock::new(t())) as Arc<dyn Clock>)
        .object("c-1", 0, r#"{"a":0}"#);
    let rx = match at {
        Some(at) => at.store(b),
        None => b,
    }
    .build()
    .unwrap();
    let b = body("e-1", "c-1", Some("1"), T, r#"{"a":1}"#);
    rx.deliver(b.as_bytes()).await;
    rx
}

/// A destination asking to wait longer than anything a clock can add (a
/// `Retry-After` of u64::MAX seconds) parks its effect for the longest
/// wait, 24 h, and the relay goes on: no overflow ends its task.
#[tokio::test]
async fn a_retry_after_beyond_any_clock_parks_the_effect_for_the_longest_wait() {
    retry_after_beyond_any_clock(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_a_retry_after_beyond_any_clock_parks_the_effect_for_the_longest_wait() {
    let Some(at) = At::postgres("relay_retry_after") else {
        return;
    };
    retry_after_beyond_any_clock(Some(&at)).await;
    at.done();
}

async fn retry_after_beyond_any_clock(at: Option<&At>) {
    let rx = one_effect(at).await;
    let refuse = |_: Effect| async {
        Err::<(), HandlerError>(
            HandlerError::new("come back later").retry_after(Duration::from_secs(u64::MAX)),
        )
    };
    let relay = rx.relay(quick("app"), refuse).await.unwrap();
    let start = std::time::Instant::now();
    while relay.progress().parked == 0 && start.elapsed() < PATIENCE {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let progress = relay.progress();
    assert_eq!((progress.position, progress.parked), (1, 1), "{progress:?}");
    relay.stop().await.expect("the relay's task ended normally");
    let mut store = rx.outbox_store().await.unwrap();
    let parked = tokio::task::spawn_blocking(move || store.parked("app").unwrap())
        .await
        .unwrap();
    assert_eq!(parked.len(), 1, "{parked:?}");
    let p = &parked[0];
    assert_eq!(
        (p.status, p.attempts, p.due),
        (
            ParkedStatus::Retrying,
            1,
            Some(p.updated + snapshot_receiver::relay::MAX_WAIT)
        )
    );
    rx.shutdown().await;
}

/// In memory, a relay runs on the process's outbox: a body delivered, its
/// effect handed out with the id the outbox gives it.
#[tokio::test]
async fn an_in_memory_relay_hands_out_the_outbox_effect() {
    let rx = one_effect_in_memory().await;
    let sink = Arc::new(Sink::default());
    let relay = rx.relay(quick("app"), sink.handler()).await.unwrap();
    assert_eq!(relay.wait_for(1, PATIENCE).await.position, 1);
    relay.stop().await.unwrap();
    let effect = rx.outbox(0, 1).await.unwrap().remove(0);
    assert_eq!(sink.accepted(), [(effect.id, "c-1".to_owned(), 1)]);
    rx.shutdown().await;
}

/// The history purge never deletes an effect a relay has not passed or
/// holds parked: a relay that never ran past position 1, and a relay
/// holding positions 2 (failed) and 3 (waiting behind it). Once both are
/// gone, the purge takes the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_purge_keeps_what_a_relay_has_not_passed() {
    history_purge_keeps(At::sqlite("relay-retention")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_the_history_purge_keeps_what_a_relay_has_not_passed() {
    let Some(at) = At::postgres("relay_retention") else {
        return;
    };
    history_purge_keeps(at.clone()).await;
    at.done();
}

#[cfg(feature = "lsm")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_lsm_the_history_purge_keeps_what_a_relay_has_not_passed() {
    history_purge_keeps(At::lsm("relay-retention-lsm")).await;
}

async fn history_purge_keeps(at: At) {
    let clock = Arc::new(ManualClock::new(t()));
    let rx = at
        .store(
            Receiver::builder()
                .clock(clock.clone() as Arc<dyn Clock>)
                .purge_interval(None)
                .history_retention(Duration::from_secs(60))
                .object("obj-1", 0, r#"{"v":0}"#),
        )
        .build()
        .unwrap();
    deliver(&rx, 1, 1..=3).await;
    // "stuck" refuses v2 with no retries left: failed at once.
    let refuse_v2 = |effect: Effect| async move {
        if effect.version == 2 {
            Err(HandlerError::new("no"))
        } else {
            Ok(())
        }
    };
    let options = RelayOptions {
        schedule: Vec::new(),
        ..quick("stuck")
    };
    let relay = rx.relay(options, refuse_v2).await.unwrap();
    let progress = async {
        loop {
            let p = relay.progress();
            if p.position == 3 && p.failed == 1 {
                break p;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let progress = tokio::time::timeout(PATIENCE, progress)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "waited {PATIENCE:?} for position 3 with v2 failed: {:?}",
                relay.progress()
            )
        });
    assert_eq!((progress.parked, progress.failed), (2, 1));
    relay.stop().await.unwrap();
    // "idle" is at position 1 and does not run.
    let mut store = rx.outbox_store().await.unwrap();
    let store = tokio::task::spawn_blocking(move || {
        store
            .open_relay(
                "idle",
                1,
                None,
                std::time::SystemTime::now(),
                Duration::from_secs(1),
            )
            .unwrap();
        store
    })
    .await
    .unwrap();
    clock.set(t() + Duration::from_secs(600));
    let positions = |rx: Receiver| async move {
        rx.outbox(0, 10)
            .await
            .unwrap()
            .iter()
            .map(|e| e.position)
            .collect::<Vec<_>>()
    };
    // Only position 1: below every relay's cursor and not parked.
    assert_eq!(rx.purge_expired_records().await.unwrap().history, 1);
    assert_eq!(positions(rx.clone()).await, [2, 3]);
    // "idle" passes them, but "stuck" holds 2 and 3 parked.
    let mut store = store;
    let store = tokio::task::spawn_blocking(move || {
        store
            .rewind("idle", 3, std::time::SystemTime::now())
            .unwrap()
            .unwrap();
        store
    })
    .await
    .unwrap();
    assert_eq!(rx.purge_expired_records().await.unwrap().history, 0);
    // The operator skips both: nothing holds them any more.
    let mut store = store;
    tokio::task::spawn_blocking(move || {
        let now = std::time::SystemTime::now();
        assert!(store.skip("stuck", 2, now).unwrap());
        assert!(store.skip("stuck", 3, now).unwrap());
        assert!(!store.skip("stuck", 3, now).unwrap());
    })
    .await
    .unwrap();
    assert_eq!(rx.purge_expired_records().await.unwrap().history, 2);
    assert_eq!(positions(rx.clone()).await, Vec::<u64>::new());
    rx.shutdown().await;
}

/// Item 5 of issue 36, retention: a relay is never silently skipped. One
/// whose oldest pending effect is older than the history window is
/// reported behind it (and the purge keeps that effect); one created after
/// the purge took effects it never saw reports them missed, before it runs
/// (`missed`) and when it resumes past them (its progress and counter).
/// The read-only reader and the relay connection give the same report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_behind_the_window_or_past_purged_effects_are_reported() {
    let path = temp_db("relay-behind");
    let path = path.to_str().unwrap().to_owned();
    let clock = Arc::new(ManualClock::new(t()));
    let file = path.clone();
    let rx = Receiver::builder()
        .clock(clock.clone() as Arc<dyn Clock>)
        .purge_interval(None)
        .history_retention(Duration::from_secs(60))
        .object("obj-1", 0, r#"{"v":0}"#)
        .store_with(move || SqliteStore::open(&file, SqliteOptions::default()))
        .build()
        .unwrap();
    deliver(&rx, 1, 1..=3).await;
    let window = Some(Duration::from_secs(60));
    // Both reads of the report, at `now`: the relay connection's and the
    // reader's, which must agree.
    let report = |now: std::time::SystemTime| {
        let (rx, path) = (rx.clone(), path.clone());
        async move {
            let mut store = rx.outbox_store().await.unwrap();
            tokio::task::spawn_blocking(move || {
                let ours = relays_report(store.as_mut(), now, window).unwrap();
                let reader = StoreReader::open(&format!("sqlite:{path}"), None).unwrap();
                let read = reader.relays(now, window).unwrap();
                assert_eq!(ours, read);
                ours
            })
            .await
            .unwrap()
        }
    };
    let empty = report(t()).await;
    assert_eq!(
        empty,
        RelaysReport {
            last_position: 3,
            history_window_seconds: Some(60),
            relays: Vec::new()
        }
    );
    // "early" exists from position 1 and does not run.
    let mut store = rx.outbox_store().await.unwrap();
    tokio::task::spawn_blocking(move || {
        store
            .open_relay("early", 1, None, t(), Duration::from_secs(1))
            .unwrap();
    })
    .await
    .unwrap();
    // Within the window: pending, not behind.
    let r = report(t() + Duration::from_secs(30)).await;
    let early = &r.relays[0];
    assert_eq!(
        (early.name.as_str(), early.position, early.lag, early.missed),
        ("early", 1, 2, 0)
    );
    assert_eq!(
        early.oldest_pending.as_deref(),
        Some("2024-01-01T08:00:00Z")
    );
    assert!(!early.behind_window);
    // Ten minutes on: its effects 2 and 3 are older than the window; the
    // purge takes only 1 and reports "early" behind the window.
    clock.set(t() + Duration::from_secs(600));
    assert_eq!(rx.purge_expired_records().await.unwrap().history, 1);
    let r = report(t() + Duration::from_secs(600)).await;
    assert!(r.relays[0].behind_window, "{r:?}");
    assert_eq!((r.relays[0].lag, r.relays[0].missed), (2, 0));
    // Once "early" passes them, the purge takes them too.
    let mut store = rx.outbox_store().await.unwrap();
    tokio::task::spawn_blocking(move || {
        store
            .rewind("early", 3, std::time::SystemTime::now())
            .unwrap()
            .unwrap();
    })
    .await
    .unwrap();
    assert_eq!(rx.purge_expired_records().await.unwrap().history, 2);
    // "late" is created now, from the beginning: 1 to 3 are gone.
    let mut store = rx.outbox_store().await.unwrap();
    tokio::task::spawn_blocking(move || {
        store
            .open_relay("late", 0, None, t(), Duration::from_secs(1))
            .unwrap();
    })
    .await
    .unwrap();
    let r = report(t() + Duration::from_secs(600)).await;
    let late = r.relays.iter().find(|r| r.name == "late").unwrap();
    assert_eq!((late.position, late.lag, late.missed), (0, 3, 3));
    assert_eq!(late.oldest_pending, None);
    // It runs; version 4 comes (position 4): it resumes past 1 to 3 and
    // says how many.
    let sink = Arc::new(Sink::default());
    let relay = rx.relay(quick("late"), sink.handler()).await.unwrap();
    deliver(&rx, 1, 4..=4).await;
    let progress = relay.wait_for(4, PATIENCE).await;
    relay.stop().await.unwrap();
    assert_eq!(
        (progress.position, progress.missed, progress.last),
        (4, 3, 4)
    );
    assert_eq!(
        sink.accepted()
            .iter()
            .map(|(_, o, v)| (o.as_str(), *v))
            .collect::<Vec<_>>(),
        [("obj-1", 4)]
    );
    let r = report(t() + Duration::from_secs(600)).await;
    let late = r.relays.iter().find(|r| r.name == "late").unwrap();
    assert_eq!((late.position, late.lag, late.missed), (4, 0, 0));
    rx.shutdown().await;
}

/// Issue 36 item 4: a coalescing relay, its destination down while four
/// versions of one object wait, sends that object once when it is back:
/// the newest state, naming the three it replaces (ids, positions,
/// versions, oldest first); an object with one effect is sent as it is.
/// The cursor passes all of them only once that send was accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coalescing_relay_sends_the_newest_state_naming_what_it_replaces() {
    coalescing(At::sqlite("relay-coalesce")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_a_coalescing_relay_sends_the_newest_state_naming_what_it_replaces() {
    let Some(at) = At::postgres("relay_coalesce") else {
        return;
    };
    coalescing(at.clone()).await;
    at.done();
}

#[cfg(feature = "lsm")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_lsm_a_coalescing_relay_sends_the_newest_state_naming_what_it_replaces() {
    coalescing(At::lsm("relay-coalesce-lsm")).await;
}

async fn coalescing(at: At) {
    let rx = on(&at);
    let down = Arc::new(std::sync::atomic::AtomicBool::new(true));
    // Every call: the effect's object, version and replaced versions, and
    // whether it was accepted.
    type Call = (String, u64, Vec<(EffectId, u64, u64)>, bool);
    let calls: Arc<Mutex<Vec<Call>>> = Arc::default();
    let handler = {
        let (down, calls) = (down.clone(), calls.clone());
        move |effect: Effect| {
            let (down, calls) = (down.clone(), calls.clone());
            async move {
                let accepted = !down.load(Ordering::SeqCst);
                calls.lock().unwrap().push((
                    effect.object_id.to_string(),
                    effect.version,
                    effect
                        .replaces
                        .iter()
                        .map(|r| (r.id, r.position, r.version))
                        .collect(),
                    accepted,
                ));
                if accepted {
                    Ok(())
                } else {
                    Err(HandlerError::new("down"))
                }
            }
        }
    };
    let options = RelayOptions {
        coalesce: true,
        schedule: vec![Duration::from_millis(20); 1000],
        ..quick("coalescing")
    };
    let relay = rx.relay(options, handler).await.unwrap();
    deliver(&rx, 1, 1..=4).await;
    // Down: wait until a refused call carried version 4 (all four wait).
    let refused_v4 = async {
        while !calls
            .lock()
            .unwrap()
            .iter()
            .any(|(o, v, _, ok)| o == "obj-1" && *v == 4 && !ok)
        {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    };
    tokio::time::timeout(PATIENCE, refused_v4)
        .await
        .unwrap_or_else(|_| panic!("waited {PATIENCE:?} for a refused call carrying obj-1 v4"));
    assert_eq!(relay.progress().delivered, 0);
    deliver(&rx, 2, 1..=1).await;
    down.store(false, Ordering::SeqCst);
    let progress = relay.wait_for(5, PATIENCE).await;
    relay.stop().await.unwrap();
    assert_eq!(
        (
            progress.position,
            progress.parked,
            progress.delivered,
            progress.coalesced
        ),
        (5, 0, 5, 3),
        "{progress:?}"
    );
    let effects = rx.outbox(0, 10).await.unwrap();
    let of = |object: &str, version: u64| {
        let e = effects
            .iter()
            .find(|e| &*e.object_id == object && e.version == version)
            .unwrap();
        (e.id, e.position, e.version)
    };
    // Objects go in parallel: by object.
    let mut accepted: Vec<Call> = calls
        .lock()
        .unwrap()
        .iter()
        .filter(|c| c.3)
        .cloned()
        .collect();
    accepted.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        accepted,
        [
            (
                "obj-1".to_owned(),
                4,
                vec![of("obj-1", 1), of("obj-1", 2), of("obj-1", 3)],
                true
            ),
            ("obj-2".to_owned(), 1, vec![], true),
        ]
    );
    // Restarted, it hands nothing out again: the cursor passed all five.
    let again = Arc::new(Sink::default());
    let relay = rx
        .relay(
            RelayOptions {
                coalesce: true,
                ..quick("coalescing")
            },
            again.handler(),
        )
        .await
        .unwrap();
    let progress = relay.wait_for(5, PATIENCE).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    relay.stop().await.unwrap();
    assert_eq!(progress.position, 5);
    assert!(again.accepted().is_empty());
    rx.shutdown().await;
}

/// A rewind keeps what the relay holds parked at or below its position
/// (it comes again only with what is above): parked at 2, a rewind to 2
/// keeps it, and the next run delivers it; a rewind to 1 drops it (it
/// comes again as new). Where the rule lives: `OutboxStore::rewind`, on
/// every store.
fn a_rewind_keeps_what_is_parked_at_or_below_it(backend: &str) {
    if backend == "postgres" && pg_url().is_none() {
        return;
    }
    let name = format!("rewind_{backend}");
    let _turn = (backend == "postgres").then(|| {
        crate::outbox::POSTGRES_TURN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    });
    runtime().block_on(async {
        let (receivers, pg) = build(backend, 1, &name);
        let rx = receivers[0].clone();
        deliver(&rx, 1, 1..=3).await;
        let mut store = rx.outbox_store().await.unwrap();
        let (store, parked) = tokio::task::spawn_blocking(move || {
            let now = std::time::SystemTime::now();
            let lease = Duration::from_secs(1);
            let row = store.open_relay("r", 0, Some("op"), now, lease).unwrap();
            let effects = store.effects_after(0, 10).unwrap();
            assert_eq!(
                effects.iter().map(|e| e.position).collect::<Vec<_>>(),
                [1, 2, 3]
            );
            let save = RelaySave {
                park: vec![ParkedEffect {
                    effect: effects[1].head(),
                    status: ParkedStatus::Retrying,
                    attempts: 1,
                    due: Some(now),
                    error: Some("503".to_owned()),
                    updated: now,
                }],
                unpark: Vec::new(),
                position: 3,
                ..RelaySave::default()
            };
            assert!(store
                .save_relay("r", row.generation, "op", &save, now, Duration::ZERO)
                .unwrap());
            let at = |s: &mut Box<dyn snapshot_receiver::store::OutboxStore>| {
                s.parked("r")
                    .unwrap()
                    .iter()
                    .map(|p| p.effect.position)
                    .collect::<Vec<_>>()
            };
            let row = store.rewind("r", 2, now).unwrap().unwrap();
            assert_eq!(row.position, 2);
            let kept = at(&mut store);
            (store, (kept, effects[1].id))
        })
        .await
        .unwrap();
        let (kept, parked_id) = parked;
        assert_eq!(kept, [2], "{backend}: parked at the rewind's position");
        // The next run delivers it (and 3 after it), then nothing is parked.
        let sink = Arc::new(Sink::default());
        let relay = rx.relay(quick("r"), sink.handler()).await.unwrap();
        let progress = relay.wait_for(3, PATIENCE).await;
        relay.stop().await.unwrap();
        assert_eq!((progress.position, progress.parked), (3, 0), "{backend}");
        let ids: Vec<EffectId> = sink.accepted().iter().map(|(id, _, _)| *id).collect();
        assert!(ids.contains(&parked_id), "{backend}: {ids:?}");
        // Parked again at 2, a rewind to 1 drops it: it comes again as new.
        let mut store = store;
        let label = backend.to_owned();
        tokio::task::spawn_blocking(move || {
            let now = std::time::SystemTime::now();
            let row = store
                .open_relay("r", 0, Some("op2"), now, Duration::from_secs(1))
                .unwrap();
            let effect = store.effects_after(1, 1).unwrap().remove(0);
            let save = RelaySave {
                park: vec![ParkedEffect {
                    effect: effect.head(),
                    status: ParkedStatus::Failed,
                    attempts: 3,
                    due: None,
                    error: None,
                    updated: now,
                }],
                ..RelaySave::default()
            };
            assert!(store
                .save_relay("r", row.generation, "op2", &save, now, Duration::ZERO)
                .unwrap());
            assert_eq!(store.parked("r").unwrap().len(), 1);
            store.rewind("r", 1, now).unwrap().unwrap();
            assert_eq!(store.parked("r").unwrap().len(), 0, "{label}: dropped");
        })
        .await
        .unwrap();
        for r in receivers {
            r.shutdown().await;
        }
        if let Some((url, schema)) = pg {
            drop_schema(&url, &schema);
        }
    });
}

#[test]
fn memory_a_rewind_keeps_what_is_parked_at_or_below_it() {
    a_rewind_keeps_what_is_parked_at_or_below_it("memory");
}

#[test]
fn sqlite_a_rewind_keeps_what_is_parked_at_or_below_it() {
    a_rewind_keeps_what_is_parked_at_or_below_it("sqlite");
}

#[test]
fn postgres_a_rewind_keeps_what_is_parked_at_or_below_it() {
    a_rewind_keeps_what_is_parked_at_or_below_it("postgres");
}

/// Issue 48 item 11: a bounded backlog. A relay whose part of the memory
/// takes three parked heads (`RelayOptions::memory`: twice three heads of
/// 265 bytes) before a destination that refuses everything reads three of
/// the eight effects, parks them and is backlogged: its cursor stays at 3
/// (the other five wait in the store, not in memory) while it retries what
/// it parked. Once the destination accepts, the parked effects go, the
/// backlog clears and the relay reads the rest: all eight delivered, none
/// parked.
///
/// The backlog is kept in the relay's row with its saves, for the
/// operator's views (the relay connection's report and, on a durable
/// store, the read-only reader's): backlogged, since when and the three
/// heads' bytes; stopped and run again while still backlogged, the row
/// keeps the first run's start; cleared, the row says not backlogged.
async fn a_refused_relay_is_backlogged_at_its_ceiling(rx: Receiver, label: &str, at: Option<&At>) {
    for o in 1..=8 {
        deliver(&rx, o, 1..=1).await;
    }
    let open = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sink = Arc::new(Sink::default());
    let accept = Arc::new(sink.handler());
    let handler = {
        let (open, accept) = (open.clone(), accept.clone());
        move |effect: Effect| -> HandlerFuture {
            if open.load(Ordering::SeqCst) {
                accept(effect)
            } else {
                Box::pin(async { Err(HandlerError::new("down")) })
            }
        }
    };
    // A head: 256 bytes, "obj-N" and the refusal "down".
    let head = snapshot_receiver::core::relay::PARKED_OVERHEAD + 5 + 4;
    let options = RelayOptions {
        memory: Some(2 * 3 * head),
        schedule: vec![Duration::from_millis(100); 100],
        ..quick("backlog")
    };
    // The relay as its row says, from the relay connection and (a durable
    // store) the read-only reader, which must agree.
    let stored = || {
        let (rx, at) = (rx.clone(), at.cloned());
        async move {
            let mut store = rx.outbox_store().await.unwrap();
            tokio::task::spawn_blocking(move || {
                let now = std::time::SystemTime::now();
                let ours = relays_report(store.as_mut(), now, None).unwrap();
                let reader = match at {
                    Some(At::Sqlite(path)) => {
                        Some(StoreReader::open(&format!("sqlite:{path}"), None))
                    }
                    Some(At::Postgres(url, schema)) => Some(StoreReader::open(&url, Some(&schema))),
                    Some(At::Lsm(_)) => None,
                    None => None,
                };
                if let Some(reader) = reader {
                    let read = reader.unwrap().relays(now, None).unwrap();
                    let backlog = |r: &RelaysReport| {
                        r.relays
                            .iter()
                            .map(|s| (s.backlogged, s.backlogged_since.clone(), s.parked_bytes))
                            .collect::<Vec<_>>()
                    };
                    assert_eq!(backlog(&ours), backlog(&read));
                }
                let r = ours.relays.into_iter().next().unwrap();
                (r.backlogged, r.backlogged_since, r.parked_bytes)
            })
            .await
            .unwrap()
        }
    };
    let heads = Some(3 * head as u64);
    let relay = rx.relay(options.clone(), handler.clone()).await.unwrap();
    // Watched through a `RelayWatch` (what a status page holds), then
    // through the relay itself: both read what the relay publishes.
    let watch = relay.watch();
    let deadline = std::time::Instant::now() + PATIENCE;
    let backlogged = loop {
        let p = watch.progress();
        if p.backlogged && p.parked == 3 && p.refusals >= 6 {
            break p;
        }
        assert!(std::time::Instant::now() < deadline, "{label}: {p:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let now = relay.progress();
    assert_eq!(
        (now.backlogged, now.parked, now.position),
        (true, 3, 3),
        "{label}: {now:?}"
    );
    assert_eq!(
        (backlogged.position, backlogged.last, backlogged.delivered),
        (3, 8, 0),
        "{label}: the cursor stops at the ceiling, after refusals of what it parked"
    );
    // Three heads, and at most a round's three states of 7 bytes, each
    // counted again while with the destination.
    let state = r#"{"v":1}"#.len();
    assert!(
        (3 * head..=3 * head + 3 * 2 * state).contains(&backlogged.memory),
        "{label}: {} bytes held",
        backlogged.memory
    );
    // Its next save records the backlog (an empty round renews the lease
    // every third of it), and the release on stopping keeps it.
    let deadline = std::time::Instant::now() + PATIENCE;
    let since = loop {
        match stored().await {
            (Some(true), Some(since), bytes) => {
                assert_eq!(bytes, heads, "{label}");
                break since;
            }
            other => assert!(std::time::Instant::now() < deadline, "{label}: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    relay.stop().await.unwrap();
    assert_eq!(
        stored().await,
        (Some(true), Some(since.clone()), heads),
        "{label}: stopped"
    );
    // Run again, still refused: backlogged at once; its saves (the
    // release on stopping at least) keep the first run's start.
    let relay = rx.relay(options.clone(), handler.clone()).await.unwrap();
    let deadline = std::time::Instant::now() + PATIENCE;
    while !(relay.progress().backlogged && relay.progress().refusals >= 3) {
        assert!(std::time::Instant::now() < deadline, "{label}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    relay.stop().await.unwrap();
    assert_eq!(
        stored().await,
        (Some(true), Some(since), heads),
        "{label}: run again"
    );
    open.store(true, Ordering::SeqCst);
    let relay = rx.relay(options, handler).await.unwrap();
    let done = relay.wait_for(8, PATIENCE).await;
    relay.stop().await.unwrap();
    assert_eq!(
        (done.position, done.parked, done.backlogged),
        (8, 0, false),
        "{label}"
    );
    assert_eq!(
        stored().await,
        (Some(false), None, Some(0)),
        "{label}: cleared"
    );
    let mut objects: Vec<String> = sink.accepted().into_iter().map(|(_, o, _)| o).collect();
    objects.sort();
    assert_eq!(
        objects,
        (1..=8).map(|o| format!("obj-{o}")).collect::<Vec<_>>(),
        "{label}"
    );
    rx.shutdown().await;
}

/// Objects 1 to 8 known, on `at` or in memory.
fn eight(at: Option<&At>) -> Receiver {
    let mut b = Receiver::builder().clock(Arc::new(ManualClock::new(t())) as Arc<dyn Clock>);
    for o in 1..=8 {
        b = b.object(&format!("obj-{o}"), 0, r#"{"v":0}"#);
    }
    match at {
        Some(at) => at.store(b),
        None => b,
    }
    .build()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_relay_is_backlogged_at_its_ceiling_on_sqlite_postgres_and_in_memory() {
    let sqlite = At::sqlite("relay-backlog");
    a_refused_relay_is_backlogged_at_its_ceiling(eight(Some(&sqlite)), "sqlite", Some(&sqlite))
        .await;
    if let Some(pg) = At::postgres("relay_backlog") {
        a_refused_relay_is_backlogged_at_its_ceiling(eight(Some(&pg)), "postgres", Some(&pg)).await;
        pg.done();
    }
    a_refused_relay_is_backlogged_at_its_ceiling(eight(None), "memory", None).await;
}

/// A handler that panics, when called or when its answer is first polled,
/// refuses the effect with the panic's message; the relay goes on and,
/// its schedule (two retries) exhausted, parks the effect `failed`.
#[tokio::test]
async fn a_handler_that_panics_refuses_the_effect_and_the_relay_goes_on() {
    handler_panics(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_a_handler_that_panics_refuses_the_effect_and_the_relay_goes_on() {
    if pg_url().is_some() {
        handler_panics(true).await;
    }
}

async fn handler_panics(on_postgres: bool) {
    let when_called = |_: Effect| -> HandlerFuture { panic!("boom when called") };
    let when_polled =
        |_: Effect| -> HandlerFuture { Box::pin(async { panic!("boom when polled") }) };
    type Boxed = Box<dyn Fn(Effect) -> HandlerFuture + Send + Sync>;
    let handlers: [(Boxed, &str, &str); 2] = [
        (
            Box::new(when_called),
            "the handler panicked: boom when called",
            "relay_panics_called",
        ),
        (
            Box::new(when_polled),
            "the handler panicked: boom when polled",
            "relay_panics_polled",
        ),
    ];
    for (handler, error, name) in handlers {
        let at = if on_postgres {
            At::postgres(name)
        } else {
            None
        };
        let rx = one_effect(at.as_ref()).await;
        let relay = rx
            .relay(quick("app"), move |e: Effect| handler(e))
            .await
            .unwrap();
        let start = std::time::Instant::now();
        while relay.progress().failed == 0 && start.elapsed() < PATIENCE {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        relay.stop().await.expect("the relay's task ended normally");
        let mut store = rx.outbox_store().await.unwrap();
        let parked = tokio::task::spawn_blocking(move || store.parked("app").unwrap())
            .await
            .unwrap();
        let found: Vec<_> = parked
            .iter()
            .map(|p| (p.status, p.attempts, p.error.clone()))
            .collect();
        assert_eq!(
            found,
            [(ParkedStatus::Failed, 3, Some(error.to_owned()))],
            "{name}"
        );
        rx.shutdown().await;
        if let Some(at) = at {
            at.done();
        }
    }
}
