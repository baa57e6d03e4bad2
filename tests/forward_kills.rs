//! Forwarding through crashes (docs/CONTRACT.md §10), under load on
//! loopback: `serve --forward` killed (SIGKILL) at random points and
//! started again on its SQLite store; apart, the destination stopped
//! (its port refusing connections, or requests cut half-way) and started
//! again on its port while `serve` runs. Once the relay drained: the store
//! holds one effect per event answered `applied`; every request carried a
//! stored effect's id with that effect's body, so a re-send is the same id
//! and the same body; every stored effect was accepted at least once; per
//! object, first acceptances come in version order; and every event
//! answered `applied` before or between the crashes has its effect at the
//! destination.
//!
//! The random points come from a seed each test prints first (shown with
//! a failure); `SNAPSHOT_RECEIVER_KILL_SEED=N` runs the tests with seed N.

use crate::common::runtime;
use crate::forward::{relays, Got, Sink};
use crate::serve::{
    envelope, now_seconds, objects_fixture, scratch, standard_headers, try_http, Server,
    NEW_SECRET, OLD_SECRET,
};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Objects `obj-0` .. `obj-23`, known at version 0.
const OBJECTS: u64 = 24;
/// Versions 1 to 20 of each: 480 effects.
const VERSIONS: u64 = 20;
/// Threads posting events; producer `p` sends the objects `o` with
/// `o % PRODUCERS == p`, in version order.
const PRODUCERS: u64 = 4;
/// The environment variable that fixes the seed.
const SEED_ENV: &str = "SNAPSHOT_RECEIVER_KILL_SEED";
/// Long enough for any wait here; a run that needs it failed.
const PATIENCE: Duration = Duration::from_secs(60);
/// How long the sink may take nothing new before an [`At::Accepted`]
/// point is given up (the relay restarts and retries within 1 s).
const STALL: Duration = Duration::from_secs(3);
/// The forwarding options both tests share: a relay that lets its name go
/// 1 s after a crash, retries every second, cuts an attempt after 2 s and
/// sends at most 150 requests a second (so that it is still catching up
/// when the load is over, and a crash finds it half-way through a round).
const FORWARDING: [&str; 8] = [
    "--forward-schedule",
    "1,1,1,1,1,1,1,1,1,1",
    "--forward-lease",
    "1",
    "--forward-timeout",
    "2",
    "--forward-rate",
    "150",
];

/// SplitMix64: small, seeded, the same on every platform.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `from..to`.
    fn within(&mut self, from: u64, to: u64) -> u64 {
        from + self.next() % (to - from)
    }
}

/// The seed of a run: [`SEED_ENV`] when set, else the clock's; printed.
fn seed(test: &str) -> u64 {
    let seed = match std::env::var(SEED_ENV) {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{SEED_ENV}={text:?}: not a whole number")),
        Err(_) => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    };
    eprintln!("{test}: seed {seed} ({SEED_ENV}={seed} runs it again)");
    seed
}

/// One event a producer posts, and the decision its first answer gives.
struct Send {
    event: String,
    object: u64,
    version: u64,
    body: String,
    /// `applied`, `duplicate` (the same event again) or `stale` (an older
    /// version under a new event id).
    expected: &'static str,
}

/// Producer `p`'s events in order: each of its objects' versions 1 to
/// [`VERSIONS`], about one in six sent twice, about one in eight followed
/// by a stale event (the version before, another state).
fn plan(p: u64, rng: &mut Rng) -> Vec<Send> {
    let mut sends = Vec::new();
    for v in 1..=VERSIONS {
        for o in (p..OBJECTS).step_by(PRODUCERS as usize) {
            let event = format!("e-{o}-{v}");
            let body = envelope(&event, &format!("obj-{o}"), v, &format!(r#"{{"v":{v}}}"#));
            let fresh = |event: &str, body: &str, expected| Send {
                event: event.to_owned(),
                object: o,
                version: v,
                body: body.to_owned(),
                expected,
            };
            sends.push(fresh(&event, &body, "applied"));
            if rng.within(0, 6) == 0 {
                sends.push(fresh(&event, &body, "duplicate"));
            }
            if v > 1 && rng.within(0, 8) == 0 {
                let late = format!("e-{o}-{v}-late");
                let body = envelope(&late, &format!("obj-{o}"), v - 1, r#"{"late":true}"#);
                sends.push(fresh(&late, &body, "stale"));
            }
        }
    }
    sends
}

/// What the producers share with the test.
#[derive(Default)]
struct Load {
    /// The server's address now (a restarted server has another port).
    addr: Mutex<String>,
    /// Events answered so far.
    answered: AtomicU64,
    /// Servers killed so far.
    kills: AtomicU64,
    /// Events answered `applied`: object, version, kills before the answer.
    applied: Mutex<Vec<(u64, u64, u64)>>,
    /// Attempts that got no answer (the server down, or killed under
    /// them) or a 503, each sent again.
    cut: AtomicU64,
}

/// Posts `sends` in order, signed, each until it is answered 200: a
/// refused or cut connection (the server down), or a 503, is tried again
/// on the server's address then. The first answer is the expected
/// decision; after a cut attempt it may be `duplicate` (the server
/// recorded it, then died before answering).
fn produce(load: &Load, sends: Vec<Send>) {
    for send in sends {
        let deadline = Instant::now() + PATIENCE;
        let mut cut = false;
        let decision = loop {
            let addr = load.addr.lock().unwrap().clone();
            let headers = standard_headers(OLD_SECRET, now_seconds(), &send.body);
            match try_http(&addr, "POST", "/events", &headers, send.body.as_bytes()) {
                Ok(reply) if reply.status == 200 => {
                    break reply.json()["decision"].as_str().unwrap().to_owned();
                }
                // A store too busy to record it: sent again, as the
                // answer asks.
                Ok(reply) if reply.status == 503 => {}
                Ok(reply) => panic!("{}: {reply:?}", send.event),
                Err(_) => {}
            }
            cut = true;
            load.cut.fetch_add(1, Ordering::Relaxed);
            assert!(
                Instant::now() < deadline,
                "{}: no answer within {PATIENCE:?}",
                send.event
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(
            decision == send.expected || (cut && decision == "duplicate"),
            "{}: {decision}, expected {} (cut before: {cut})",
            send.event,
            send.expected
        );
        if decision == "applied" {
            let kills = load.kills.load(Ordering::SeqCst);
            load.applied
                .lock()
                .unwrap()
                .push((send.object, send.version, kills));
        }
        load.answered.fetch_add(1, Ordering::SeqCst);
    }
}

/// When a crash comes.
#[derive(Clone, Copy, Debug)]
enum At {
    /// Once the producers had this many answers (during the load).
    Answered(u64),
    /// Once the sink accepted this many distinct effects (the relay
    /// catching up, maybe after the load).
    Accepted(u64),
}

/// Waits until `at`; or, for [`At::Accepted`], until the sink took
/// nothing new for [`STALL`]: a relay that lost effects never gets there,
/// and the checks after the drain say which it lost.
fn wait_until(at: At, load: &Load, sink: &Sink) {
    let deadline = Instant::now() + PATIENCE;
    let (mut last, mut since) = (0, Instant::now());
    loop {
        let (now, wanted) = match at {
            At::Answered(n) => (load.answered.load(Ordering::SeqCst), n),
            At::Accepted(n) => (accepted_ids(sink) as u64, n),
        };
        if now >= wanted {
            return;
        }
        if now != last {
            (last, since) = (now, Instant::now());
        } else if matches!(at, At::Accepted(_)) && since.elapsed() > STALL {
            eprintln!("{at:?}: {now} accepted, nothing new for {STALL:?}; crashing now");
            return;
        }
        assert!(Instant::now() < deadline, "{at:?} not reached: {now}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The effect ids the sink accepted (2xx), each once.
fn accepted_ids(sink: &Sink) -> usize {
    sink.accepted()
        .iter()
        .map(|g| g.id.as_str())
        .collect::<HashSet<_>>()
        .len()
}

/// The value of the relay's `series` on `/metrics`.
fn gauge(metrics: &str, series: &str) -> Option<f64> {
    let prefix = format!("{series}{{relay=\"forward\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

/// Waits until the relay's saved cursor is at the last of the
/// [`OBJECTS`] × [`VERSIONS`] effects with nothing parked.
fn drained(server: &Server) {
    let total = (OBJECTS * VERSIONS) as f64;
    let deadline = Instant::now() + PATIENCE;
    loop {
        let metrics = server.get("/metrics").body;
        let position = gauge(&metrics, "snapshot_receiver_relay_position");
        let parked = gauge(&metrics, "snapshot_receiver_relay_parked");
        if position == Some(total) && parked == Some(0.0) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the relay did not drain: position {position:?} of {total}, {parked:?} parked"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The store's effects in position order, each as the relay sends it.
fn stored_effects(store: &str) -> Vec<Value> {
    runtime().block_on(async {
        let rx = snapshot_receiver::Receiver::builder()
            .store(store)
            .build()
            .unwrap();
        let effects = rx.outbox(0, usize::MAX).await.unwrap();
        rx.shutdown().await;
        effects
            .iter()
            .map(|e| serde_json::to_value(e).unwrap())
            .collect()
    })
}

/// The checks of a drained run, given the store's effects, every request
/// the sink received and the events answered `applied`. Returns the
/// requests, the acceptances and the re-sends among those, for the log.
fn check(stored: &[Value], got: &[Got], applied: &[(u64, u64, u64)]) -> (usize, usize, usize) {
    let key = |e: &Value| {
        (
            e["object_id"].as_str().unwrap().to_owned(),
            e["version"].as_u64().unwrap(),
        )
    };
    // One effect per object and version: nothing an `applied` answer
    // acknowledged lost, nothing made twice.
    let mut held: Vec<(String, u64)> = stored.iter().map(key).collect();
    held.sort();
    let mut expected: Vec<(String, u64)> = (0..OBJECTS)
        .flat_map(|o| (1..=VERSIONS).map(move |v| (format!("obj-{o}"), v)))
        .collect();
    expected.sort();
    assert_eq!(held, expected, "the store's effects");
    let by_id: HashMap<&str, &Value> = stored
        .iter()
        .map(|e| (e["effect_id"].as_str().unwrap(), e))
        .collect();
    assert_eq!(by_id.len(), stored.len(), "effect ids are unique");
    // Every request: signed, a stored effect's id, that effect's body.
    for g in got {
        assert!(g.signed, "{} not signed: {}", g.id, g.body);
        let Some(effect) = by_id.get(g.id.as_str()) else {
            panic!(
                "webhook-id {} names no stored effect (status {}): {}",
                g.id, g.status, g.body
            );
        };
        assert_eq!(
            &g.body, *effect,
            "webhook-id {}: not the stored effect's body",
            g.id
        );
    }
    // Every stored effect accepted at least once; per object, the first
    // acceptances in version order.
    let accepted: Vec<&Got> = got
        .iter()
        .filter(|g| (200..300).contains(&g.status))
        .collect();
    let mut first: HashSet<&str> = HashSet::new();
    let mut order: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for g in &accepted {
        if first.insert(g.id.as_str()) {
            let (object, version) = key(&g.body);
            order.entry(object).or_default().push(version);
        }
    }
    let never: Vec<String> = stored
        .iter()
        .filter(|e| !first.contains(e["effect_id"].as_str().unwrap()))
        .map(|e| {
            let (object, version) = key(e);
            format!("{} ({object} v{version})", e["position"])
        })
        .collect();
    assert!(
        never.is_empty(),
        "{} of {} stored effects never accepted, at positions {:?}{}",
        never.len(),
        stored.len(),
        &never[..never.len().min(12)],
        if never.len() > 12 { " ..." } else { "" }
    );
    let mut in_store: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for e in stored {
        let (object, version) = key(e);
        in_store.entry(object).or_default().push(version);
    }
    for (object, versions) in &in_store {
        assert_eq!(
            order.get(object),
            Some(versions),
            "{object}: first acceptances against the store's order"
        );
    }
    // Every event answered `applied` has its effect at the destination.
    let delivered: HashSet<(String, u64)> = accepted.iter().map(|g| key(&g.body)).collect();
    for (o, v, kills) in applied {
        assert!(
            delivered.contains(&(format!("obj-{o}"), *v)),
            "obj-{o} v{v} was answered applied after {kills} kill(s) and never accepted"
        );
    }
    (got.len(), accepted.len(), accepted.len() - first.len())
}

/// After a drained run stopped: `relays` shows the relay at the last
/// position, nothing parked.
fn relay_passed_everything(store: &str) {
    let total = OBJECTS * VERSIONS;
    let (code, out, err) = relays(store, &[]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        out,
        format!(
            "last outbox position: {total}\n\
             relay forward: position {total}, 0 after it, 0 parked (0 failed): 0 not delivered, not running\n"
        )
    );
}

/// Where the crashes of a run come: `during` of them at random numbers of
/// the `sends` producer answers, spread over the load; then `after` at
/// random numbers of accepted effects, spread over the second half of the
/// [`OBJECTS`] × [`VERSIONS`] (the relay catching up).
fn crash_points(rng: &mut Rng, sends: u64, during: u64, after: u64) -> Vec<At> {
    let total = OBJECTS * VERSIONS;
    let mut points: Vec<At> = (0..during)
        .map(|i| {
            let span = sends * 8 / 10 / during;
            At::Answered(rng.within(sends / 10 + i * span, sends / 10 + (i + 1) * span))
        })
        .collect();
    points.extend((0..after).map(|i| {
        let span = total * 4 / 10 / after;
        At::Accepted(rng.within(total / 2 + i * span, total / 2 + (i + 1) * span))
    }));
    points
}

/// A test's `serve --forward` on a new store of [`OBJECTS`] objects: the
/// store, the arguments (to start it again), the load's shared state and
/// each producer's plan.
struct Scene {
    store: String,
    args: Vec<String>,
    load: Load,
    plans: Vec<Vec<Send>>,
    /// Events the plans post, in all.
    sends: u64,
}

impl Scene {
    /// Starts `serve` forwarding to `sink`, in the scratch folder `name`.
    fn start(name: &str, sink: &Sink, rng: &mut Rng) -> (Self, Server) {
        let dir = scratch(name);
        let fixture = objects_fixture(&dir, OBJECTS as usize);
        let store = format!("sqlite:{}", dir.join("rx.db").display());
        let mut args: Vec<String> = [
            "--store",
            &store,
            "--initial",
            &fixture,
            "--webhook-secret",
            OLD_SECRET,
            "--forward",
            &sink.url,
            "--forward-secret",
            NEW_SECRET,
        ]
        .map(str::to_owned)
        .to_vec();
        args.extend(FORWARDING.map(str::to_owned));
        let server = start(&args);
        let load = Load::default();
        *load.addr.lock().unwrap() = server.addr.clone();
        let plans: Vec<Vec<Send>> = (0..PRODUCERS).map(|p| plan(p, rng)).collect();
        let sends = plans.iter().map(Vec::len).sum::<usize>() as u64;
        let scene = Self {
            store,
            args,
            load,
            plans,
            sends,
        };
        (scene, server)
    }
}

/// `serve` with `args`.
fn start(args: &[String]) -> Server {
    Server::start(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// What [`finish`] found: the events answered `applied`, [`check`]'s
/// counts (requests, accepted, re-sent) and the relay's refusals as
/// `/metrics` counted them.
type Finished = (Vec<(u64, u64, u64)>, (usize, usize, usize), Option<f64>);

/// Once the load is done: waits for the relay to drain, stops `server`
/// (it must say `stopped`), checks the relay passed everything and what
/// `sink` got against the store.
fn finish(
    server: Server,
    store: &str,
    applied: Mutex<Vec<(u64, u64, u64)>>,
    sink: &Sink,
) -> Finished {
    drained(&server);
    let refusals = gauge(
        &server.get("/metrics").body,
        "snapshot_receiver_relay_refusals_total",
    );
    let (status, rest) = server.stop();
    assert!(status.success(), "{status:?}");
    assert!(rest.ends_with("stopped\n"), "{rest}");
    relay_passed_everything(store);
    let applied = applied.into_inner().unwrap();
    let counts = check(&stored_effects(store), &sink.got(), &applied);
    (applied, counts, refusals)
}

/// `serve --forward` killed three times at random points (twice while
/// four producers post, once while the relay catches up), each time started
/// again on its store after a moment; the destination always up.
#[test]
fn serve_killed_under_load_forwards_every_effect_at_least_once_in_order() {
    let mut rng = Rng(seed("serve_killed_under_load"));
    let sink = Sink::start(Box::new(|_, _, _| (204, None)));
    let (
        Scene {
            store,
            args,
            load,
            plans,
            sends,
        },
        server,
    ) = Scene::start("forward-kill-serve", &sink, &mut rng);
    // Each a few milliseconds after its point; down a moment.
    let points: Vec<(At, u64, u64)> = crash_points(&mut rng, sends, 2, 1)
        .into_iter()
        .map(|at| (at, rng.within(0, 30), rng.within(0, 300)))
        .collect();
    let started = Instant::now();
    let server = std::thread::scope(|s| {
        let mut server = server;
        let producers: Vec<_> = plans
            .into_iter()
            .map(|sends| {
                let load = &load;
                s.spawn(move || produce(load, sends))
            })
            .collect();
        for &(at, after_ms, down_ms) in &points {
            wait_until(at, &load, &sink);
            std::thread::sleep(Duration::from_millis(after_ms));
            let status = server.kill();
            assert!(!status.success(), "{status:?}");
            let kills = load.kills.fetch_add(1, Ordering::SeqCst) + 1;
            eprintln!(
                "kill {kills} ({at:?}) at {:?}: {} of {sends} events answered, {} effects accepted",
                started.elapsed(),
                load.answered.load(Ordering::SeqCst),
                accepted_ids(&sink)
            );
            std::thread::sleep(Duration::from_millis(down_ms));
            server = start(&args);
            *load.addr.lock().unwrap() = server.addr.clone();
        }
        for p in producers {
            p.join().unwrap();
        }
        server
    });
    let (applied, (requests, accepted, resent), _) = finish(server, &store, load.applied, &sink);
    eprintln!(
        "{:?}: {} applied, {} attempts sent again; {requests} requests, {accepted} accepted, {resent} re-sent",
        started.elapsed(),
        applied.len(),
        load.cut.load(Ordering::Relaxed)
    );
}

/// The destination stopped four times at random points (twice while four
/// producers post, twice while the relay catches up), `serve` running
/// throughout, and started again on its port after a moment. Half of the
/// stops close its port at once (connections refused, open ones dropped);
/// the other half come after it held the requests that came in for a
/// moment without answering: those of odd versions not taken, those of
/// even versions taken (recorded as accepted), the answer lost with the
/// connection, so that they must come again with the same id and body.
#[test]
fn a_destination_stopped_under_load_gets_every_effect_at_least_once_in_order() {
    let mut rng = Rng(seed("destination_stopped_under_load"));
    let holding = Arc::new(AtomicBool::new(false));
    let sink = {
        let holding = holding.clone();
        Sink::start(Box::new(move |_, version, _| {
            if holding.load(Ordering::SeqCst) && version % 2 == 1 {
                (0, None)
            } else {
                (204, None)
            }
        }))
    };
    let (
        Scene {
            store,
            load,
            plans,
            sends,
            ..
        },
        server,
    ) = Scene::start("forward-kill-sink", &sink, &mut rng);
    let first_mode = rng.within(0, 2);
    // Each: holding first or not (alternating), how many requests to hold
    // (at most a second), how long down.
    let points: Vec<(At, bool, usize, u64)> = crash_points(&mut rng, sends, 2, 2)
        .into_iter()
        .enumerate()
        .map(|(i, at)| {
            (
                at,
                (i as u64 + first_mode) % 2 == 1,
                rng.within(1, 8) as usize,
                rng.within(100, 1000),
            )
        })
        .collect();
    let started = Instant::now();
    let mut held = 0;
    std::thread::scope(|s| {
        let producers: Vec<_> = plans
            .into_iter()
            .map(|sends| {
                let load = &load;
                s.spawn(move || produce(load, sends))
            })
            .collect();
        for &(at, hold, want, down_ms) in &points {
            wait_until(at, &load, &sink);
            if hold {
                let before = sink.got().len();
                holding.store(true, Ordering::SeqCst);
                sink.hold_answers(true);
                let deadline = Instant::now() + Duration::from_secs(1);
                while sink.got().len() - before < want && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(1));
                }
                held += sink.got().len() - before;
            }
            sink.kill();
            holding.store(false, Ordering::SeqCst);
            sink.hold_answers(false);
            eprintln!(
                "destination stopped ({at:?}, {}) at {:?}: {} of {sends} events answered, {} effects accepted",
                if hold { "after holding" } else { "port closed" },
                started.elapsed(),
                load.answered.load(Ordering::SeqCst),
                accepted_ids(&sink)
            );
            std::thread::sleep(Duration::from_millis(down_ms));
            sink.revive();
        }
        for p in producers {
            p.join().unwrap();
        }
    });
    let (applied, (requests, accepted, resent), refusals) =
        finish(server, &store, load.applied, &sink);
    eprintln!(
        "{:?}: {} applied; {requests} requests ({held} held, then cut), {accepted} accepted, {resent} re-sent, {refusals:?} refused",
        started.elapsed(),
        applied.len(),
    );
}
