//! NATS JetStream: `publish` and several `consume` processes sharing one
//! PostgreSQL database, with a process killed and restarted, and partitions
//! changing hands.

use crate::common::runtime;
use crate::common::stream_gen::{fixture_json, generate, Generated};
use crate::durability::{drop_schema, pg, pg_url};
use snapshot_receiver::jetstream::{message_id, partition_of};
use snapshot_receiver::{format_rfc3339, Config, Receiver};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// Deliveries in the three-process test. The issue asks for a few hundred
/// thousand; on the 2-core machines this project runs on, with PostgreSQL,
/// NATS, the publisher and three debug-build consumers sharing the cores,
/// 200,000 (160,000 stored after the broker's duplicate window) took 97-133 s
/// alone and up to 205 s beside other builds: the largest size that stays
/// near the three minutes asked for.
const DELIVERIES: usize = 200_000;
/// Partitions of the test streams (divisible by 2 and 3, so that the
/// sorted-member assignment is even).
const PARTITIONS: u32 = 48;

/// The NATS server the tests use: `SNAPSHOT_RECEIVER_NATS_URL`, or the
/// loopback server `.ci/run` starts. `None` (test skipped) only outside CI.
pub(crate) fn nats_url() -> Option<String> {
    let url = std::env::var("SNAPSHOT_RECEIVER_NATS_URL")
        .unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
    let hostport = url
        .trim_start_matches("nats://")
        .trim_end_matches('/')
        .to_owned();
    let reachable = std::net::TcpStream::connect_timeout(
        &hostport
            .parse()
            .unwrap_or_else(|_| "127.0.0.1:4222".parse().unwrap()),
        Duration::from_secs(2),
    )
    .is_ok();
    if reachable {
        Some(url)
    } else {
        crate::common::skip::skip(&format!(
            "NATS JetStream is not reachable at {url} (set SNAPSHOT_RECEIVER_NATS_URL; .ci/run starts one)"
        ));
        None
    }
}

/// Held by each [`Scene`] while it lives: one scene of `consume` processes at
/// a time. Each process holds 17 PostgreSQL connections (one per shard for
/// the objects and receipts it reads, and the committer's), so one scene
/// of three processes holds 51; two scenes at once, beside the rest of the
/// suite and other clients, reached the server's limit of 100 ("sorry, too
/// many clients already") and failed a run under load.
static ONE_SCENE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A stream, its lease bucket and a PostgreSQL schema for one test, removed
/// before and after.
struct Scene {
    pg: String,
    nats: String,
    stream: String,
    schema: String,
    fixture: std::path::PathBuf,
    /// When one of its consumers last printed a line.
    progress: Arc<Mutex<Instant>>,
    /// [`ONE_SCENE_AT_A_TIME`], until the scene is cleaned up (a test that
    /// failed before leaves it poisoned: the next one goes on).
    _alone: std::sync::MutexGuard<'static, ()>,
}

/// How long a scene's consumers may print nothing before a wait past its
/// deadline fails: they print every acknowledgement, partition change and
/// retry, so this long without a line is a hang, not a slow machine.
const STALL: Duration = Duration::from_secs(120);

/// When a wait of a scene gives up: not before `at`, and after it only once
/// its consumers have printed nothing for [`STALL`]. A run slowed down by
/// a loaded machine goes on; a hung one fails.
struct Deadline {
    at: Instant,
    progress: Arc<Mutex<Instant>>,
}

impl Deadline {
    fn passed(&self) -> bool {
        Instant::now() >= self.at && self.progress.lock().unwrap().elapsed() >= STALL
    }
}

impl Scene {
    fn new(name: &str, pg: String, nats: String, g: &Generated) -> Self {
        let alone = ONE_SCENE_AT_A_TIME
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let scene = Self {
            pg,
            nats,
            stream: format!("SR_{name}_{}", std::process::id()),
            schema: format!("sr_js_{name}_{}", std::process::id()),
            fixture: std::env::temp_dir().join(format!("sr-js-{name}-{}.json", std::process::id())),
            progress: Arc::new(Mutex::new(Instant::now())),
            _alone: alone,
        };
        std::fs::write(&scene.fixture, fixture_json(g)).unwrap();
        scene.clean();
        scene
    }

    /// A [`Deadline`] `after` from now.
    fn deadline(&self, after: Duration) -> Deadline {
        Deadline {
            at: Instant::now() + after,
            progress: self.progress.clone(),
        }
    }

    fn clean(&self) {
        drop_schema(&self.pg, &self.schema);
        let (nats, stream) = (self.nats.clone(), self.stream.clone());
        runtime().block_on(async move {
            let js = async_nats::jetstream::new(async_nats::connect(&nats).await.unwrap());
            drop_stream(&js, &stream).await;
        });
    }

    fn publish(&self) -> Child {
        self.publish_file(&self.fixture)
    }

    /// Publishes the deliveries of `fixture` (a fixture file's path).
    fn publish_file(&self, fixture: &std::path::Path) -> Child {
        crate::common::spawn_quiet(
            crate::common::cli()
                .args(["publish", fixture.to_str().unwrap()])
                .args(["--nats", &self.nats, "--stream", &self.stream])
                .args(["--partitions", &PARTITIONS.to_string()])
                .stdout(Stdio::piped()),
        )
    }

    /// Publishes the deliveries of `part` and returns how many the stream
    /// stored (the publisher's count, checked against [`as_stored`]).
    fn publish_part(&self, part: &Generated, name: &str) -> u64 {
        let path = self.fixture.with_extension(format!("{name}.json"));
        std::fs::write(&path, fixture_json(part)).unwrap();
        let report = published(self.publish_file(&path));
        let _ = std::fs::remove_file(&path);
        let stored = report["published"].as_u64().unwrap()
            - report["dropped_as_duplicate"].as_u64().unwrap();
        assert_eq!(
            stored,
            as_stored(part).len() as u64,
            "part {name} as stored"
        );
        stored
    }

    fn consume(&self, member: &str, extra: &[&str]) -> Consumer {
        let mut child = crate::common::spawn_quiet(
            crate::common::cli()
                .args(["consume", "--nats", &self.nats, "--stream", &self.stream])
                .args(["--store", &self.pg, "--store-schema", &self.schema])
                .args(["--initial", self.fixture.to_str().unwrap()])
                // A lease outlives any stall of a loaded machine (renewed
                // every quarter of it): a partition changes hands only when
                // a test stops or kills its holder, never because a renewal
                // came late. A killed holder's partitions move after it.
                .args(["--member", member, "--lease-ttl", "15", "--ack-wait", "4"])
                .args(["--print-acks"])
                .args(extra)
                .stdout(Stdio::piped()),
        );
        let lines = Arc::new(Mutex::new(Vec::new()));
        let out = child.stdout.take().unwrap();
        let sink = lines.clone();
        let progress = self.progress.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let value: serde_json::Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
                sink.lock().unwrap().push(value);
                *progress.lock().unwrap() = Instant::now();
            }
        });
        Consumer {
            member: member.to_owned(),
            child,
            lines,
            reader: Some(reader),
        }
    }

    /// Waits until every message of the stream has been acknowledged on its
    /// partition's consumer.
    fn wait_all_acknowledged(&self, published: u64, deadline: &Deadline) {
        let (nats, stream) = (self.nats.clone(), self.stream.clone());
        runtime().block_on(async move {
            let js = async_nats::jetstream::new(async_nats::connect(&nats).await.unwrap());
            let s = js.get_stream(&stream).await.unwrap();
            loop {
                let mut busy = false;
                for p in 0..PARTITIONS {
                    let info = s.consumer_info(format!("p{p}")).await.unwrap();
                    busy |= info.num_pending > 0 || info.num_ack_pending > 0;
                }
                let mut info = js.get_stream(&stream).await.unwrap();
                let stored = info.info().await.unwrap().state.messages;
                if !busy && stored == published {
                    return;
                }
                assert!(!deadline.passed(), "the stream was not consumed in time");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
    }
}

impl Drop for Scene {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.clean();
            let _ = std::fs::remove_file(&self.fixture);
        }
    }
}

/// One `consume` process and the JSON lines it printed.
struct Consumer {
    member: String,
    child: Child,
    lines: Arc<Mutex<Vec<serde_json::Value>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Consumer {
    fn lines(&self, event: &str) -> Vec<serde_json::Value> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l["event"] == event)
            .cloned()
            .collect()
    }

    fn count(&self, event: &str) -> usize {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l["event"] == event)
            .count()
    }

    /// Partitions taken and not released, from the printed events.
    fn holding(&self) -> BTreeSet<u64> {
        let mut held = BTreeSet::new();
        for l in self.lines.lock().unwrap().iter() {
            let p = l["partition"].as_u64();
            match (l["event"].as_str(), p) {
                (Some("took"), Some(p)) => {
                    held.insert(p);
                }
                (Some("released" | "lost"), Some(p)) => {
                    held.remove(&p);
                }
                _ => {}
            }
        }
        held
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// SIGKILL, then wait for the process and its output.
    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        if let Some(r) = self.reader.take() {
            r.join().unwrap();
        }
    }

    /// Waits for a clean exit (after SIGTERM or the idle time) and returns
    /// the summary line.
    fn finish(&mut self, deadline: &Deadline) -> serde_json::Value {
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "consume {} failed: {status}", self.member);
                break;
            }
            assert!(!deadline.passed(), "consume {} did not stop", self.member);
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Some(r) = self.reader.take() {
            r.join().unwrap();
        }
        let summary = self.lines("summary");
        assert_eq!(summary.len(), 1, "one summary from {}", self.member);
        summary[0].clone()
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_for(what: &str, deadline: &Deadline, mut done: impl FnMut() -> bool) {
    while !done() {
        assert!(!deadline.passed(), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What the database (or the in-memory receiver) ends with.
#[derive(Debug, PartialEq)]
struct Outcome {
    /// object -> (version, state, paused).
    objects: BTreeMap<String, (u64, serde_json::Value, bool)>,
    /// event identity -> first decision code.
    receipts: BTreeMap<String, String>,
    /// (event identity, held-as code) of every held or parked event with an
    /// identity, sorted (malformed bodies have none, and each redelivery of
    /// one is held again by design).
    held: Vec<(String, String)>,
}

fn database(url: &str, schema: &str) -> Outcome {
    let (url, schema) = (url.to_owned(), schema.to_owned());
    pg(&url, move |c| {
        c.batch_execute(&format!("SET search_path TO {schema}"))
            .unwrap();
        let objects = c
            .query("SELECT object_id, version, state, paused FROM objects", &[])
            .unwrap()
            .iter()
            .map(|r| {
                let v: String = r.get(1);
                let s: String = r.get(2);
                (
                    r.get::<_, String>(0),
                    (
                        v.parse().unwrap(),
                        serde_json::from_str(&s).unwrap(),
                        r.get(3),
                    ),
                )
            })
            .collect();
        let receipts = c
            .query("SELECT event_id, decision FROM receipts", &[])
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let mut held: Vec<(String, String)> = c
            .query(
                "SELECT event_id, held_as FROM held WHERE event_id IS NOT NULL AND status <> 'malformed'",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        held.sort();
        Outcome {
            objects,
            receipts,
            held,
        }
    })
}

/// The stream as JetStream stores it: the broker's duplicate window drops an
/// exact re-publish (same `Nats-Msg-Id`); the window (2 minutes) is longer
/// than a test's publish, so every exact copy is dropped.
fn as_stored(g: &Generated) -> Vec<&String> {
    let mut seen = std::collections::HashSet::new();
    g.bodies
        .iter()
        .filter(|b| seen.insert(message_id(b.as_bytes())))
        .collect()
}

/// A single in-memory receiver fed the stored stream in order (each
/// object's deliveries in stream order; objects in parallel).
fn in_memory(g: &Generated) -> Outcome {
    runtime().block_on(async {
        let mut b = Receiver::builder().config(Config {
            audit: false,
            ..Config::default()
        });
        for o in 0..g.objects {
            b = b.object(&format!("obj-{o}"), 0, r#"{"v":0}"#);
        }
        let rx = b.build().unwrap();
        let lanes = 8;
        let mut by_lane: Vec<Vec<String>> = vec![Vec::new(); lanes];
        for body in as_stored(g) {
            by_lane[partition_of(body.as_bytes(), lanes as u32) as usize].push(body.clone());
        }
        let tasks: Vec<_> = by_lane
            .into_iter()
            .map(|bodies| {
                let rx = rx.clone();
                tokio::spawn(async move {
                    for body in bodies {
                        let r = rx.deliver(body.as_bytes()).await;
                        assert_ne!(r.ack(), snapshot_receiver::Ack::Retry);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let objects = rx
            .objects()
            .await
            .into_iter()
            .map(|o| {
                (
                    o.object_id.to_string(),
                    (
                        o.version,
                        serde_json::from_str(o.state.as_str()).unwrap(),
                        o.paused,
                    ),
                )
            })
            .collect();
        let mut receipts = BTreeMap::new();
        for body in &g.bodies {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(body) else {
                continue;
            };
            let Some(id) = v["event_id"].as_str() else {
                continue;
            };
            if let Some(record) = rx.context().registry().get(id) {
                receipts.insert(id.to_owned(), record.decision.code());
            }
        }
        let mut held: Vec<(String, String)> = rx
            .unresolved()
            .await
            .into_iter()
            .filter(|u| u.held_as.code() != "held:malformed")
            .filter_map(|u| Some((u.event_id?.to_string(), u.held_as.code())))
            .collect();
        held.sort();
        rx.shutdown().await;
        Outcome {
            objects,
            receipts,
            held,
        }
    })
}

/// What the stored stream must end as, computed from the stream alone by a
/// small model of the contract's rules (docs/CONTRACT.md §3), independent of
/// the receiver: each object's deliveries in stream order (the partitions
/// keep that order), for the kinds of body the generator makes.
fn model(g: &Generated) -> Outcome {
    /// The semantic content of an envelope: its six fields, absent or a JSON
    /// value (values compare as values; the generator writes integers only).
    type Content = [Option<serde_json::Value>; 6];
    struct Identity {
        /// The first record's content.
        first: Content,
        /// Contents of variants already recorded.
        variants: Vec<Content>,
    }
    let mut objects: BTreeMap<String, (u64, serde_json::Value, bool)> = (0..g.objects)
        .map(|o| (format!("obj-{o}"), (0, serde_json::json!({"v": 0}), false)))
        .collect();
    let mut identities: HashMap<String, Identity> = HashMap::new();
    let mut receipts = BTreeMap::new();
    let mut held = Vec::new();
    for body in as_stored(g) {
        let Ok(serde_json::Value::Object(fields)) = serde_json::from_str(body) else {
            continue; // not JSON, or not an object: malformed, no identity
        };
        if body.matches("\"event_id\"").count() > 1 {
            continue; // a repeated key: malformed, no identity
        }
        let (Some(event_id), Some(object_id)) = (
            fields.get("event_id").and_then(|v| v.as_str()),
            fields.get("object_id").and_then(|v| v.as_str()),
        ) else {
            continue;
        };
        if event_id.len() > 256 {
            continue; // over the id limit: rejected, nothing recorded
        }
        let content: Content = [
            "event_id",
            "object_id",
            "object_version",
            "occurred_at",
            "type",
            "state",
        ]
        .map(|f| fields.get(f).cloned());
        // §3.1: a known identity is a duplicate, or a variant that pauses.
        if let Some(known) = identities.get_mut(event_id) {
            if known.first != content && !known.variants.contains(&content) {
                known.variants.push(content);
                held.push((event_id.to_owned(), "conflict:event_variant".to_owned()));
                if let Some(o) = objects.get_mut(object_id) {
                    o.2 = true;
                }
            }
            continue;
        }
        identities.insert(
            event_id.to_owned(),
            Identity {
                first: content,
                variants: Vec::new(),
            },
        );
        let state = fields["state"].clone();
        let version = fields.get("object_version").and_then(|v| v.as_u64());
        // §3.2 - §3.4, in order.
        let decision = match (objects.get_mut(object_id), version) {
            (None, _) => "held:unknown_object",
            (Some(_), None) => "held:missing_version",
            (Some((_, _, true)), Some(_)) => "held:paused",
            (Some(o), Some(v)) if v > o.0 => {
                (o.0, o.1) = (v, state);
                "applied"
            }
            (Some(o), Some(v)) if v < o.0 => "stale",
            (Some(o), Some(_)) if o.1 == state => "equal",
            (Some(o), Some(_)) => {
                o.2 = true;
                "conflict:version_state"
            }
        };
        if decision.starts_with("held:") || decision == "conflict:version_state" {
            held.push((event_id.to_owned(), decision.to_owned()));
        }
        receipts.insert(event_id.to_owned(), decision.to_owned());
    }
    held.sort();
    Outcome {
        objects,
        receipts,
        held,
    }
}

fn count(url: &str, schema: &str, sql: &str) -> i64 {
    let (url, sql) = (
        url.to_owned(),
        format!("SET search_path TO {schema}; {sql}"),
    );
    pg(&url, move |c| {
        let mut parts = sql.splitn(2, "; ");
        c.batch_execute(parts.next().unwrap()).unwrap();
        c.query_one(parts.next().unwrap(), &[]).unwrap().get(0)
    })
}

fn receipts_of(url: &str, schema: &str) -> BTreeSet<String> {
    database(url, schema).receipts.into_keys().collect()
}

fn published(publisher: Child) -> serde_json::Value {
    let out = publisher.wait_with_output().unwrap();
    assert!(out.status.success(), "publish failed");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The first few keys whose values differ, each with both values.
fn differing<K: Ord + std::fmt::Debug, V: PartialEq + std::fmt::Debug>(
    got: &BTreeMap<K, V>,
    expected: &BTreeMap<K, V>,
) -> Vec<String> {
    let keys: BTreeSet<&K> = got.keys().chain(expected.keys()).collect();
    keys.into_iter()
        .filter(|k| got.get(*k) != expected.get(*k))
        .take(5)
        .map(|k| format!("{k:?}: {:?}, expected {:?}", got.get(k), expected.get(k)))
        .collect()
}

/// Fails with the first few differences when `got` is not `expected`.
fn agrees(what: &str, got: &Outcome, expected: &Outcome) {
    let objects = differing(&got.objects, &expected.objects);
    assert!(
        objects.is_empty(),
        "{what}: objects differ from the model: {objects:?}"
    );
    let receipts = differing(&got.receipts, &expected.receipts);
    assert!(
        receipts.is_empty(),
        "{what}: receipts differ from the model: {receipts:?}"
    );
    assert_eq!(
        got.held, expected.held,
        "{what}: held events differ from the model"
    );
}

/// Checks shared by both tests: the database and one in-memory replay equal
/// the model, one receipt per identity, nothing applied twice, and every
/// acknowledged event recorded with no more acknowledgements than recorded
/// decisions.
fn check_outcome(scene: &Scene, g: &Generated, acked: &[serde_json::Value]) -> (usize, i64, i64) {
    let expected = model(g);
    let db = database(&scene.pg, &scene.schema);
    agrees("the in-memory replay", &in_memory(g), &expected);
    agrees("the database", &db, &expected);
    // Identities the receiver registers: every well-formed body's event_id.
    let identities: BTreeSet<String> = g
        .bodies
        .iter()
        .filter_map(|b| serde_json::from_str::<serde_json::Value>(b).ok())
        .filter_map(|v| v["event_id"].as_str().map(str::to_owned))
        // The body with a duplicate key is malformed: no identity.
        .filter(|id| !id.starts_with("e-dup-key"))
        // Over the identifier limit: rejected, never registered.
        .filter(|id| id.len() <= 256)
        .collect();
    let receipts = count(&scene.pg, &scene.schema, "SELECT count(*) FROM receipts");
    assert_eq!(
        receipts,
        identities.len() as i64,
        "one receipt per event identity"
    );
    assert_eq!(
        count(&scene.pg, &scene.schema, "SELECT count(*) FROM (SELECT event_id FROM audit WHERE decision = 'applied' GROUP BY event_id HAVING count(*) > 1) d"),
        0,
        "an event applied twice"
    );
    let decided = count(
        &scene.pg,
        &scene.schema,
        "SELECT count(*) FROM audit WHERE kind IN ('delivery', 'malformed')",
    );
    assert!(
        acked.len() as i64 <= decided,
        "{} acknowledgements but only {decided} recorded decisions",
        acked.len()
    );
    let recorded: BTreeSet<String> = db.receipts.into_keys().collect();
    let unrecorded: Vec<_> = acked
        .iter()
        .filter_map(|a| a["event_id"].as_str())
        .filter(|id| !recorded.contains(*id))
        .take(5)
        .collect();
    assert!(
        unrecorded.is_empty(),
        "acknowledged, never recorded: {unrecorded:?}"
    );
    (identities.len(), receipts, decided)
}

/// The model the JetStream tests check against, checked itself against a
/// receiver fed the same stream (no server needed): each of the generator's
/// cases (duplicates, re-encodings, variants, equal versions, missing
/// versions, unknown objects, malformed and over-limit bodies) ends as the
/// rules say.
#[test]
fn the_stream_model_agrees_with_an_in_memory_receiver() {
    // Seed 1: a stream in which every case occurs (an equal-version conflict
    // needs its object to stand at exactly that version; most seeds have none).
    let g = generate(30_000, 1, &format_rfc3339(SystemTime::now()));
    let expected = model(&g);
    agrees("the in-memory replay", &in_memory(&g), &expected);
    // Every case the generator makes is in the outcome, re-sent variants too
    // (a copy of an identity's second content, after it was recorded).
    let mut contents: HashMap<String, Vec<serde_json::Value>> = HashMap::new();
    let mut resent = 0;
    for body in as_stored(&g) {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(body) else {
            continue;
        };
        let Some(id) = v["event_id"].as_str() else {
            continue;
        };
        let seen = contents.entry(id.to_owned()).or_default();
        match seen.iter().position(|c| c["state"] == v["state"]) {
            Some(i) if i > 0 => resent += 1,
            Some(_) => {}
            None => seen.push(v),
        }
    }
    assert!(resent > 0, "the stream re-sends variants");
    let decisions: BTreeSet<&str> = expected.receipts.values().map(String::as_str).collect();
    assert_eq!(
        decisions,
        BTreeSet::from([
            "applied",
            "conflict:version_state",
            "held:missing_version",
            "held:paused",
            "held:unknown_object",
            "stale",
        ])
    );
    assert!(expected
        .held
        .iter()
        .any(|(_, h)| h == "conflict:event_variant"));
    assert!(
        expected.objects.values().any(|o| o.2),
        "some objects paused"
    );
}

#[test]
fn three_consumers_one_killed_and_restarted_equal_one_in_memory_replay() {
    let (Some(pg), Some(nats)) = (pg_url(), nats_url()) else {
        return;
    };
    let started = Instant::now();
    let g = generate(DELIVERIES, 8, &format_rfc3339(SystemTime::now()));
    let scene = Scene::new("three", pg, nats, &g);
    // The test takes 2-5 minutes on the shared 2-core machine (up to 5 at a
    // load average of 8 to 13, more than 15 at 22): past 8 minutes it fails
    // only once the consumers stall.
    let deadline = &scene.deadline(Duration::from_secs(480));
    let publisher = scene.publish();
    let a = scene.consume("a", &[]);
    let mut b = scene.consume("b", &[]);
    let c = scene.consume("c", &[]);
    let report = published(publisher);
    let stored =
        report["published"].as_u64().unwrap() - report["dropped_as_duplicate"].as_u64().unwrap();
    assert_eq!(report["published"], g.bodies.len() as u64);

    // Part-way: kill b with SIGKILL.
    let total = |cs: &[&Consumer]| cs.iter().map(|c| c.count("ack")).sum::<usize>();
    wait_for("a third of the stream, with b consuming", deadline, || {
        total(&[&a, &b, &c]) as u64 >= stored / 3 && b.count("ack") > 0 && !b.holding().is_empty()
    });
    b.kill();
    // After the kill every line b printed is read: what it held is exact.
    let b_held = b.holding();
    assert!(!b_held.is_empty(), "b held partitions");
    let b_acked = b.lines("ack");
    let recorded = receipts_of(&scene.pg, &scene.schema);
    let lost: Vec<_> = b_acked
        .iter()
        .filter_map(|l| l["event_id"].as_str())
        .filter(|id| !recorded.contains(*id))
        .take(5)
        .collect();
    assert!(lost.is_empty(), "b acknowledged before recording: {lost:?}");

    // Its partitions move to a and c once its leases expire...
    wait_for("a and c to take b's partitions", deadline, || {
        let now: BTreeSet<u64> = a.holding().union(&c.holding()).copied().collect();
        b_held.is_subset(&now)
    });
    // ... and some come back to its restart.
    let mut b2 = scene.consume("b", &[]);
    wait_for("the restarted b to take partitions", deadline, || {
        b2.count("took") > 0
    });
    scene.wait_all_acknowledged(stored, deadline);
    let consumed_at = started.elapsed();
    for p in [&a, &b2, &c] {
        p.signal("TERM");
    }
    let mut a = a;
    let mut c = c;
    let summaries: Vec<_> = [&mut a, &mut b2, &mut c]
        .into_iter()
        .map(|p| p.finish(deadline))
        .collect();
    for (p, s) in [&a, &b2, &c].iter().zip(&summaries) {
        assert_eq!(s["acknowledged"].as_u64().unwrap() as usize, p.count("ack"));
        assert!(p.holding().is_empty(), "{} released everything", p.member);
    }
    let acked: Vec<serde_json::Value> = [&a, &b, &b2, &c]
        .iter()
        .flat_map(|p| p.lines("ack"))
        .collect();
    // Every stored message was acknowledged once, except those b had
    // acknowledged without living to print it.
    let sequences: BTreeSet<u64> = acked.iter().map(|l| l["seq"].as_u64().unwrap()).collect();
    let terminated = terminated_sequences(&[&a, &b, &b2, &c]).len();
    assert!(terminated <= 1, "only the over-limit body is terminated");
    assert!((sequences.len() as u64) < stored);
    // b can have had up to max_in_flight messages per partition it held
    // acknowledged and not yet printed.
    let unprinted = (b_held.len() * snapshot_receiver::jetstream::DEFAULT_MAX_IN_FLIGHT) as u64;
    assert!(
        sequences.len() as u64 + unprinted >= stored,
        "{} of {stored} messages acknowledged",
        sequences.len()
    );
    let retried: u64 = summaries
        .iter()
        .map(|s| s["retried"].as_u64().unwrap())
        .sum();
    let (identities, receipts, decided) = check_outcome(&scene, &g, &acked);
    eprintln!(
        "three consumers: {} deliveries generated, {} published, {stored} stored (duplicate window dropped {}), \
         {identities} identities, {receipts} receipts, {decided} recorded decisions, {} acknowledgements \
         (b before SIGKILL: {}), {terminated} terminated, {retried} retried after the restart; \
         consumed in {:.1}s, test {:.1}s",
        g.bodies.len(),
        report["published"],
        report["dropped_as_duplicate"],
        acked.len(),
        b_acked.len(),
        consumed_at.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}

/// `g` in three parts by object (`obj-N` by N mod 4: 0 and 1, 2, 3; every
/// other body in the first), so that each object's deliveries stay in stream
/// order and no message of one part is a byte copy of another part's.
fn split_by_object(g: &Generated) -> [Generated; 3] {
    let mut parts: [Vec<String>; 3] = Default::default();
    for body in &g.bodies {
        let object = serde_json::from_str::<serde_json::Value>(body)
            .ok()
            .and_then(|v| {
                v["object_id"]
                    .as_str()?
                    .strip_prefix("obj-")?
                    .parse::<u64>()
                    .ok()
            });
        let part = match object.map(|o| o % 4) {
            Some(2) => 1,
            Some(3) => 2,
            _ => 0,
        };
        parts[part].push(body.clone());
    }
    parts.map(|bodies| Generated {
        objects: g.objects,
        bodies,
    })
}

/// How many of the messages `part` stores fall into `partitions`.
fn stored_on(part: &Generated, partitions: &BTreeSet<u64>) -> usize {
    as_stored(part)
        .iter()
        .filter(|b| partitions.contains(&u64::from(partition_of(b.as_bytes(), PARTITIONS))))
        .count()
}

/// The stream sequences the `consumers` terminated (a message redelivered
/// after the ack wait is terminated once per copy, under one sequence).
fn terminated_sequences(consumers: &[&Consumer]) -> BTreeSet<u64> {
    consumers
        .iter()
        .flat_map(|c| c.lines("terminated"))
        .filter_map(|l| l["seq"].as_u64())
        .collect()
}

/// The stream sequences `consumer` acknowledged in `range`.
fn acked_in(consumer: &Consumer, range: std::ops::RangeInclusive<u64>) -> BTreeSet<u64> {
    consumer
        .lines("ack")
        .iter()
        .filter_map(|l| l["seq"].as_u64())
        .filter(|s| range.contains(s))
        .collect()
}

// Each member's share is published only once it holds its partitions, and
// every count below is exact: the test does not depend on how fast the
// others drained what came before.
#[test]
fn partitions_move_when_a_consumer_stops_and_when_one_joins() {
    let (Some(pg), Some(nats)) = (pg_url(), nats_url()) else {
        return;
    };
    let g = generate(20_000, 5, &format_rfc3339(SystemTime::now()));
    let scene = Scene::new("rebalance", pg, nats, &g);
    // About 3 minutes at a load average of 6 to 13: past 4 minutes the test
    // fails only once the consumers stall.
    let deadline = &scene.deadline(Duration::from_secs(240));
    let [first, second, third] = split_by_object(&g);
    // Stream sequences of each part: 1..=s1, then s1+1..=s2, then s2+1..=s3.
    let s1 = scene.publish_part(&first, "first");
    let mut a = scene.consume("a", &[]);
    let b = scene.consume("b", &[]);
    wait_for("a and b to share the partitions", deadline, || {
        a.holding().len() == PARTITIONS as usize / 2 && b.holding().len() == PARTITIONS as usize / 2
    });
    let (a_held, b_held) = (a.holding(), b.holding());
    let s2 = s1 + scene.publish_part(&second, "second");
    let (for_a, for_b) = (stored_on(&second, &a_held), stored_on(&second, &b_held));
    assert!(
        for_a > 0 && for_b > 0,
        "the second part reaches both: {for_a}, {for_b}"
    );
    // a acknowledges the second part's messages of its partitions, then
    // stops cleanly (SIGTERM).
    wait_for(
        "a to acknowledge its share of the second part",
        deadline,
        || acked_in(&a, s1 + 1..=s2).len() >= for_a,
    );
    a.signal("TERM");
    let a_summary = a.finish(deadline);
    assert!(a.holding().is_empty(), "a released its partitions");
    assert_eq!(acked_in(&a, s1 + 1..=s2).len(), for_a, "a: its share only");
    wait_for("b to take a's partitions", deadline, || {
        b.holding().len() == PARTITIONS as usize
    });
    assert!(a_held.is_subset(&b.holding()));
    // b finishes the first two parts alone ...
    scene.wait_all_acknowledged(s2, deadline);
    // The server counts an acknowledgement before b has its confirmation
    // and prints it: wait for b's lines, then check the count is exact.
    wait_for("b to print its share of the second part", deadline, || {
        acked_in(&b, s1 + 1..=s2).len() >= for_b
    });
    assert_eq!(
        acked_in(&b, s1 + 1..=s2).len(),
        for_b,
        "b: its share of the second part"
    );
    // ... a newcomer gets half of the partitions back from b; then the third
    // part. c can print `took` for a partition before b's `released` line for
    // it is read: wait for both sides.
    let mut c = scene.consume("c", &[]);
    wait_for("c to take half and b to release it", deadline, || {
        c.holding().len() == PARTITIONS as usize / 2 && b.holding().len() == PARTITIONS as usize / 2
    });
    assert!(b.count("released") >= PARTITIONS as usize / 2);
    let (b_kept, c_held) = (b.holding(), c.holding());
    assert!(b_kept.is_disjoint(&c_held));
    let s3 = s2 + scene.publish_part(&third, "third");
    let (for_b3, for_c) = (stored_on(&third, &b_kept), stored_on(&third, &c_held));
    assert!(for_c > 0, "the third part reaches c");
    scene.wait_all_acknowledged(s3, deadline);
    let mut b = b;
    b.signal("TERM");
    c.signal("TERM");
    let (b_summary, c_summary) = (b.finish(deadline), c.finish(deadline));
    // Each message of the third part was acknowledged by the member holding
    // its partition, and c acknowledged nothing else.
    assert_eq!(
        acked_in(&b, s2 + 1..=s3).len(),
        for_b3,
        "b: its share of the third part"
    );
    assert_eq!(
        acked_in(&c, s2 + 1..=s3).len(),
        for_c,
        "c: its share of the third part"
    );
    assert!(
        acked_in(&c, 1..=s2).is_empty(),
        "c: nothing of the first two parts"
    );
    let acked: Vec<serde_json::Value> = [&a, &b, &c].iter().flat_map(|p| p.lines("ack")).collect();
    let sequences: BTreeSet<u64> = acked.iter().map(|l| l["seq"].as_u64().unwrap()).collect();
    assert_eq!(
        sequences.len() as u64 + 1,
        s3,
        "every stored message acknowledged, but the over-limit one"
    );
    // A message redelivered after the ack wait (it waited in the client's
    // buffer behind a slow commit) is decided again: count messages, not
    // answers.
    assert_eq!(
        terminated_sequences(&[&a, &b, &c]).len(),
        1,
        "the over-limit body is terminated"
    );
    for (p, summary) in [(&a, &a_summary), (&b, &b_summary), (&c, &c_summary)] {
        assert_eq!(
            summary["acknowledged"].as_u64().unwrap() as usize,
            p.count("ack"),
            "{}",
            p.member
        );
    }
    check_outcome(&scene, &g, &acked);
}

#[test]
fn a_retry_is_negatively_acknowledged_and_redelivered_and_a_reject_terminated() {
    use snapshot_receiver::jetstream::{self, ConsumeEvent, ConsumeOptions, Publisher};
    use snapshot_receiver::store::{FaultyStore, SqliteOptions, SqliteStore};
    let Some(nats) = nats_url() else { return };
    let g = generate(3_000, 11, &format_rfc3339(SystemTime::now()));
    let stream = format!("SR_retry_{}", std::process::id());
    let db = crate::store::temp_db("jetstream-retry");
    let expected = model(&g);
    runtime().block_on(async {
        let (client, js) = fresh_stream(&nats, &stream).await;
        let report = Publisher::new(client.clone(), &stream, Some(8), None)
            .await
            .unwrap()
            .publish_all(&g.bodies)
            .await
            .unwrap();
        let stored = report.published - report.dropped_as_duplicate;
        // Every fourth commit fails: its deliveries get `retry`.
        let path = db.to_str().unwrap().to_owned();
        let mut b = Receiver::builder().config(Config {
            audit: false,
            ..Config::default()
        });
        for o in 0..g.objects {
            b = b.object(&format!("obj-{o}"), 0, r#"{"v":0}"#);
        }
        let receiver = b
            .store_with(move || {
                Ok(FaultyStore::new(
                    SqliteStore::open(&path, SqliteOptions::default())?,
                    |n| n > 0 && n % 4 == 0,
                ))
            })
            .build()
            .unwrap();
        let (events, sink) = recording_sink();
        let options = ConsumeOptions {
            stream: stream.clone(),
            retry_delay: Duration::from_millis(20),
            lease_ttl: Duration::from_secs(2),
            idle_exit: Some(Duration::from_secs(2)),
            ..ConsumeOptions::default()
        };
        let done = tokio::time::timeout(
            Duration::from_secs(120),
            jetstream::consume(
                &receiver,
                client,
                options,
                tokio_util::sync::CancellationToken::new(),
                sink,
            ),
        )
        .await
        .expect("consume stops after the idle time")
        .unwrap();
        assert!(
            done.retried > 0,
            "failed commits were negatively acknowledged"
        );
        assert_eq!(done.terminated, 1, "the over-limit body");
        assert_eq!(done.acknowledged + done.terminated, stored);
        let events = events.lock().unwrap().clone();
        // A retried message came back and was acknowledged later.
        let retried: BTreeSet<u64> = events
            .iter()
            .filter_map(|e| match e {
                ConsumeEvent::Retry {
                    stream_sequence, ..
                } => Some(*stream_sequence),
                _ => None,
            })
            .collect();
        let redelivered: BTreeSet<u64> = events
            .iter()
            .filter_map(|e| match e {
                ConsumeEvent::Acknowledged {
                    stream_sequence,
                    delivered,
                    ..
                } if *delivered > 1 => Some(*stream_sequence),
                _ => None,
            })
            .collect();
        assert!(!retried.is_empty() && retried.is_subset(&redelivered));
        let objects: BTreeMap<String, (u64, serde_json::Value, bool)> = receiver
            .objects()
            .await
            .into_iter()
            .map(|o| {
                (
                    o.object_id.to_string(),
                    (
                        o.version,
                        serde_json::from_str(o.state.as_str()).unwrap(),
                        o.paused,
                    ),
                )
            })
            .collect();
        let wrong = differing(&objects, &expected.objects);
        assert!(wrong.is_empty(), "objects differ from the model: {wrong:?}");
        receiver.shutdown().await;
        drop_stream(&js, &stream).await;
    });
}

// A message handed back (`retry`) that never comes back, because it was
// settled elsewhere (here: removed from the stream while its redelivery was
// delayed), must not hold its partition for good: once it is overdue
// (retry delay + ack wait + 1 s) and the server counts no unacknowledged
// message beyond those waiting, it is forgotten and the newer messages of
// its object are decided, in stream order.
#[test]
fn a_handed_back_message_settled_elsewhere_stops_holding_its_partition() {
    use snapshot_receiver::jetstream::{self, ConsumeEvent, ConsumeOptions, Publisher};
    use snapshot_receiver::store::{FaultyStore, SqliteOptions, SqliteStore};
    use snapshot_receiver::Decision;
    use std::sync::atomic::{AtomicBool, Ordering};
    let Some(nats) = nats_url() else { return };
    let stream = format!("SR_forget_{}", std::process::id());
    let db = crate::store::temp_db("jetstream-forget");
    runtime().block_on(async {
        let (client, js) = fresh_stream(&nats, &stream).await;
        let publisher = Publisher::new(client.clone(), &stream, Some(1), None)
            .await
            .unwrap();
        publisher.publish_all([card_1(1)]).await.unwrap();
        // The first commit after start-up fails: e-1 gets `retry`.
        let armed = Arc::new(AtomicBool::new(false));
        let fail = armed.clone();
        let path = db.to_str().unwrap().to_owned();
        let receiver = Receiver::builder()
            .object("card-1", 0, r#"{"n":0}"#)
            .store_with(move || {
                let fail = fail.clone();
                Ok(FaultyStore::new(
                    SqliteStore::open(&path, SqliteOptions::default())?,
                    move |_| fail.swap(false, Ordering::SeqCst),
                ))
            })
            .build()
            .unwrap();
        armed.store(true, Ordering::SeqCst);
        let (events, sink) = recording_sink();
        let options = ConsumeOptions {
            stream: stream.clone(),
            retry_delay: Duration::from_secs(4),
            ack_wait: Duration::from_secs(2),
            lease_ttl: Duration::from_secs(2),
            ..ConsumeOptions::default()
        };
        let stop = tokio_util::sync::CancellationToken::new();
        let seen = |want: &dyn Fn(&ConsumeEvent) -> bool| events.lock().unwrap().iter().any(want);
        // Returns how long after e-1 was seen handed back e-2 was seen
        // acknowledged (`None`: not within a minute).
        let watch = async {
            let deadline = Instant::now() + Duration::from_secs(60);
            while !seen(&|e| {
                matches!(
                    e,
                    ConsumeEvent::Retry {
                        stream_sequence: 1,
                        ..
                    }
                )
            }) {
                assert!(Instant::now() < deadline, "e-1 was never handed back");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let handed_back = Instant::now();
            // Settled elsewhere: it will not be redelivered.
            let s = js.get_stream(&stream).await.unwrap();
            s.delete_message(1).await.unwrap();
            publisher.publish_all((2..=4).map(card_1)).await.unwrap();
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut first_decided = None;
            loop {
                if first_decided.is_none()
                    && seen(&|e| {
                        matches!(
                            e,
                            ConsumeEvent::Acknowledged {
                                stream_sequence: 2,
                                ..
                            }
                        )
                    })
                {
                    first_decided = Some(handed_back.elapsed());
                }
                let last = seen(&|e| {
                    matches!(
                        e,
                        ConsumeEvent::Acknowledged {
                            stream_sequence: 4,
                            ..
                        }
                    )
                });
                if last || Instant::now() > deadline {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            stop.cancel();
            first_decided
        };
        let (done, first_decided) = tokio::join!(
            jetstream::consume(&receiver, client, options, stop.clone(), sink),
            watch
        );
        let done = done.unwrap();
        let acknowledged: Vec<(u64, Decision)> = events
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                ConsumeEvent::Acknowledged {
                    stream_sequence,
                    decision,
                    ..
                } => Some((*stream_sequence, *decision)),
                _ => None,
            })
            .collect();
        assert_eq!(
            acknowledged,
            vec![
                (2, Decision::Applied),
                (3, Decision::Applied),
                (4, Decision::Applied)
            ],
            "the messages after the forgotten one are decided, in stream order"
        );
        assert_eq!((done.retried, done.acknowledged), (1, 3));
        // Time alone never forgets, but nothing is forgotten before it is
        // overdue either: 4 s + 2 s + 1 s after the hand-back (less the
        // 20 ms the watch may have seen the hand-back late).
        let first_decided = first_decided.expect("e-2 was acknowledged");
        assert!(
            first_decided >= Duration::from_millis(6_900),
            "e-1 was forgotten {first_decided:?} after it was handed back: before it was overdue"
        );
        let objects = receiver.objects().await;
        assert_eq!(
            objects
                .iter()
                .map(|o| (o.object_id.to_string(), o.version))
                .collect::<Vec<_>>(),
            vec![("card-1".to_owned(), 4)]
        );
        receiver.shutdown().await;
        drop_stream(&js, &stream).await;
    });
}

/// A client of the test server and its JetStream context, with `stream`
/// and its lease bucket deleted first (what an earlier run may have left
/// under that name).
pub(crate) async fn fresh_stream(
    nats: &str,
    stream: &str,
) -> (async_nats::Client, async_nats::jetstream::Context) {
    let client = snapshot_receiver::jetstream::connect(nats).await.unwrap();
    let js = async_nats::jetstream::new(client.clone());
    drop_stream(&js, stream).await;
    (client, js)
}

/// Deletes `stream` and its lease bucket, if they exist.
pub(crate) async fn drop_stream(js: &async_nats::jetstream::Context, stream: &str) {
    let _ = js.delete_stream(stream).await;
    let _ = js.delete_stream(format!("KV_sr-leases-{stream}")).await;
}

/// Event e-`v`: card-1's snapshot at version `v` (state `{"v": v}`),
/// occurring in 2099, so never older than the retention window.
pub(crate) fn card_1(v: u64) -> String {
    format!(
        r#"{{"event_id":"e-{v}","object_id":"card-1","object_version":{v},"occurred_at":"2099-01-01T00:00:00Z","type":"card.snapshot","state":{{"v":{v}}}}}"#
    )
}

/// A sink that keeps every event, and what it kept.
fn recording_sink() -> (
    Arc<Mutex<Vec<snapshot_receiver::jetstream::ConsumeEvent>>>,
    snapshot_receiver::jetstream::EventSink,
) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let kept = events.clone();
    let sink: snapshot_receiver::jetstream::EventSink = Arc::new(move |e| {
        kept.lock().unwrap().push(e.clone());
    });
    (events, sink)
}

/// The server's count of messages acknowledged (or terminated) on the
/// partitions' consumers: deliveries no longer pending. Exact when no
/// message was delivered twice.
async fn acknowledged_on_server(
    js: &async_nats::jetstream::Context,
    stream: &str,
    partitions: u32,
) -> u64 {
    let s = js.get_stream(stream).await.unwrap();
    let mut acked = 0;
    for p in 0..partitions {
        // A partition whose consumer a worker has not created yet has
        // acknowledged nothing.
        let Ok(info) = s.consumer_info(format!("p{p}")).await else {
            continue;
        };
        acked += info.delivered.consumer_sequence - info.num_ack_pending as u64;
    }
    acked
}

// With many messages in flight per partition, the acknowledgements of a
// batch must still wait for the group commit that records it. Commits are
// slowed down (20 ms each) so that a batch acknowledged early would be seen:
// while the stream is consumed, the server's count of acknowledged messages
// is sampled, then the deliveries committed so far; an acknowledgement can
// never be ahead of its commit (the one over-limit body is terminated
// without one).
#[test]
fn many_in_flight_a_message_is_acknowledged_only_after_its_commit() {
    use snapshot_receiver::jetstream::{self, ConsumeOptions, Publisher};
    use snapshot_receiver::store::{FaultyStore, SqliteOptions, SqliteStore};
    let Some(nats) = nats_url() else { return };
    let partitions = 8;
    let g = generate(6_000, 23, &format_rfc3339(SystemTime::now()));
    let stream = format!("SR_ackorder_{}", std::process::id());
    let db = crate::store::temp_db("jetstream-ack-after-commit");
    let expected = model(&g);
    runtime().block_on(async {
        let (client, js) = fresh_stream(&nats, &stream).await;
        let report = Publisher::new(client.clone(), &stream, Some(partitions), None)
            .await
            .unwrap()
            .publish_all(&g.bodies)
            .await
            .unwrap();
        let stored = report.published - report.dropped_as_duplicate;
        assert_eq!(stored, as_stored(&g).len() as u64);
        let path = db.to_str().unwrap().to_owned();
        let mut b = Receiver::builder().config(Config {
            audit: false,
            ..Config::default()
        });
        for o in 0..g.objects {
            b = b.object(&format!("obj-{o}"), 0, r#"{"v":0}"#);
        }
        let receiver = b
            .store_with(move || {
                Ok(FaultyStore::with_faults(
                    SqliteStore::open(&path, SqliteOptions::default())?,
                    |_| {
                        std::thread::sleep(Duration::from_millis(20));
                        None
                    },
                ))
            })
            .build()
            .unwrap();
        let options = ConsumeOptions {
            stream: stream.clone(),
            lease_ttl: Duration::from_secs(2),
            // Long enough that no message is delivered twice.
            ack_wait: Duration::from_secs(60),
            idle_exit: Some(Duration::from_secs(2)),
            ..ConsumeOptions::default()
        };
        let consuming = tokio::spawn({
            let receiver = receiver.clone();
            async move {
                jetstream::consume(
                    &receiver,
                    client,
                    options,
                    tokio_util::sync::CancellationToken::new(),
                    Arc::new(|_: &jetstream::ConsumeEvent| {}),
                )
                .await
            }
        });
        let sampler = async_nats::jetstream::new(jetstream::connect(&nats).await.unwrap());
        let (mut samples, mut ahead, mut max_seen) = (0, Vec::new(), 0);
        let deadline = std::time::Instant::now() + Duration::from_secs(300);
        while !consuming.is_finished() {
            assert!(
                std::time::Instant::now() < deadline,
                "waited 300 s for the consumer to finish the stream: {samples} samples, \
                 {max_seen} acknowledged at most"
            );
            let acked = acknowledged_on_server(&sampler, &stream, partitions).await;
            let committed = receiver.store_stats().unwrap().deliveries;
            samples += 1;
            max_seen = max_seen.max(acked);
            if acked > committed + 1 {
                ahead.push((acked, committed));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let done = tokio::time::timeout(Duration::from_secs(5), consuming)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(
            ahead.is_empty(),
            "acknowledged on the server before committed (acknowledged, committed deliveries): {:?}",
            &ahead[..ahead.len().min(5)]
        );
        assert_eq!(done.terminated, 1, "the over-limit body");
        assert_eq!(done.acknowledged + done.terminated, stored);
        // (Arrivals do wait: a new holder decides nothing for one pull
        // expiry, see `InOrder`; nothing is retried or redelivered.)
        assert_eq!(done.retried, 0, "retried");
        assert_eq!(done.ack_failures, 0, "acknowledgements not confirmed");
        assert_eq!(
            acknowledged_on_server(&sampler, &stream, partitions).await,
            stored
        );
        // The samples saw the stream being consumed, not only its end.
        assert!(samples > 10 && max_seen > 0, "{samples} samples");
        let stats = receiver.store_stats().unwrap();
        assert_eq!(stats.deliveries, stored - 1, "every message but the rejected one committed once");
        assert!(
            stats.commits < stored / 4,
            "many messages per commit: {} commits for {stored} messages",
            stats.commits
        );
        let objects: BTreeMap<String, (u64, serde_json::Value, bool)> = receiver
            .objects()
            .await
            .into_iter()
            .map(|o| {
                (
                    o.object_id.to_string(),
                    (
                        o.version,
                        serde_json::from_str(o.state.as_str()).unwrap(),
                        o.paused,
                    ),
                )
            })
            .collect();
        let wrong = differing(&objects, &expected.objects);
        assert!(wrong.is_empty(), "objects differ from the model: {wrong:?}");
        eprintln!(
            "ack after commit: {stored} messages, {} commits, {samples} samples of acknowledged vs committed",
            stats.commits
        );
        receiver.shutdown().await;
        drop_stream(&js, &stream).await;
    });
}

// A publish whose acknowledgement times out is sent again with the same
// message id; the stream keeps one copy, in publish order, and the counts
// say what was stored. Every first attempt here waits zero time, so it
// times out unless its acknowledgement is already there.
#[test]
fn a_timed_out_publish_is_sent_again_and_stored_once() {
    use snapshot_receiver::jetstream::{self, Publisher};
    let Some(nats) = nats_url() else { return };
    let g = generate(2_000, 29, &format_rfc3339(SystemTime::now()));
    let stream = format!("SR_pubretry_{}", std::process::id());
    runtime().block_on(async {
        let (client, js) = fresh_stream(&nats, &stream).await;
        let report = Publisher::new(client.clone(), &stream, Some(4), None)
            .await
            .unwrap()
            .window(1)
            .ack_timeouts(vec![Duration::ZERO, Duration::from_secs(10)])
            .publish_all(&g.bodies)
            .await
            .unwrap();
        let expected = as_stored(&g);
        assert_eq!(report.published, g.bodies.len() as u64);
        assert_eq!(
            report.published - report.dropped_as_duplicate,
            expected.len() as u64
        );
        assert!(report.ack_retries > 0, "some first attempts timed out");
        // The stream holds each stored body once, in publish order.
        let mut s = js.get_stream(&stream).await.unwrap();
        assert_eq!(
            s.info().await.unwrap().state.messages,
            expected.len() as u64
        );
        for (i, body) in expected.iter().enumerate().step_by(97) {
            let m = s.get_raw_message(i as u64 + 1).await.unwrap();
            assert_eq!(m.payload.as_ref(), body.as_bytes(), "message {}", i + 1);
        }
        eprintln!(
            "publish retry: {} published, {} re-published after a timeout",
            report.published, report.ack_retries
        );
        // Every attempt timing out ends in a clear error.
        let failed = Publisher::new(client, &stream, None, None)
            .await
            .unwrap()
            .window(1)
            .ack_timeouts(vec![Duration::ZERO; 3])
            .publish_all([br#"{"event_id":"e-never","object_id":"obj-0"}"#])
            .await;
        match failed {
            Err(e @ jetstream::JetStreamError::PublishNotConfirmed { .. }) => {
                let text = e.to_string();
                assert!(text.contains("timed out 3 times"), "{text}");
                assert!(text.contains("e-never/"), "{text}");
            }
            // The acknowledgement can beat a zero wait (rarely): then it
            // was stored once like any other.
            Ok(r) => assert_eq!(r.published, 1),
            Err(e) => panic!("unexpected error: {e}"),
        }
        drop_stream(&js, &stream).await;
    });
}

/// Whether `subject` is an acknowledgement subject of `stream` (`$JS.ACK.`
/// then, depending on the server's version, a domain and an account hash,
/// then the stream's name, its consumer and the message's numbers).
fn acknowledges(subject: &str, stream: &str) -> bool {
    subject.starts_with("$JS.ACK.") && subject.split('.').any(|token| token == stream)
}

/// A request the server answers itself, on `client`'s connection: when it
/// returns, the server has read everything the connection sent before it
/// and the connection has read everything the server sent it before the
/// answer (a flush only writes the client's buffer).
async fn round_trip(client: &async_nats::Client) {
    client
        .request("$JS.API.INFO", "".into())
        .await
        .expect("the server answers $JS.API.INFO");
}

// The acknowledgements of a message leave only after the commit that
// records it, checked without timing: the first delivery commit waits at a
// gate until the test opens it. Meanwhile, after a round trip on the
// consumer's connection (whatever it sent has reached the server) and one on
// a second connection watching the stream's acknowledgement subjects, that
// watcher has seen no positive acknowledgement; once the gate opens every message is
// acknowledged once.
#[test]
fn no_acknowledgement_leaves_while_its_commit_is_held() {
    use crate::commit::{commit_held, Script};
    use futures_util::{FutureExt, StreamExt};
    use snapshot_receiver::jetstream::{self, ConsumeEvent, ConsumeOptions, Publisher};
    let Some(nats) = nats_url() else { return };
    let stream = format!("SR_ackgate_{}", std::process::id());
    let path = crate::store::temp_db("jetstream-ack-gate");
    let bodies: Vec<String> = (1..=5)
        .map(|i| {
            format!(
                r#"{{"event_id":"e-{i}","object_id":"c-{i}","object_version":1,"occurred_at":"2099-01-01T00:00:00Z","type":"card.snapshot","state":{{"v":{i}}}}}"#
            )
        })
        .collect();
    runtime().block_on(async {
        let (client, js) = fresh_stream(&nats, &stream).await;
        let report = Publisher::new(client.clone(), &stream, Some(1), None)
            .await
            .unwrap()
            .publish_all(&bodies)
            .await
            .unwrap();
        assert_eq!((report.published, report.dropped_as_duplicate), (5, 0));
        let watcher = jetstream::connect(&nats).await.unwrap();
        // This stream's acknowledgement subjects only, in both of the
        // server's forms: a subscription to every `$JS.ACK.>` also gets
        // the other tests' acknowledgements, which can fill its buffer
        // while the commit is held, and the client then drops messages.
        let mut acks = futures_util::stream::select(
            watcher
                .subscribe(format!("$JS.ACK.{stream}.>"))
                .await
                .unwrap(),
            watcher
                .subscribe(format!("$JS.ACK.*.*.{stream}.>"))
                .await
                .unwrap(),
        );
        watcher.flush().await.unwrap();
        // The positive acknowledgements (`+ACK`, or the empty payload that
        // means the same; not the progress signals) the watcher has received.
        let watched = stream.clone();
        let mut received = move || {
            let mut seen = Vec::new();
            while let Some(Some(m)) = acks.next().now_or_never() {
                if acknowledges(&m.subject, &watched) && matches!(&m.payload[..], b"" | b"+ACK") {
                    seen.push(m.subject.to_string());
                }
            }
            seen
        };

        let script = Arc::new(Script::default());
        let s = script.clone();
        let mut b = Receiver::builder();
        for i in 1..=5 {
            b = b.object(&format!("c-{i}"), 0, "{}");
        }
        let receiver = b
            .store_with(move || Script::open(&path, s))
            .build()
            .unwrap();
        // Commit 1 seeded the objects; the next one is the first delivery's.
        script.hold_next();
        let (events, sink) = recording_sink();
        let options = ConsumeOptions {
            stream: stream.clone(),
            lease_ttl: Duration::from_secs(2),
            // No progress signal or redelivery while the gate is closed.
            ack_wait: Duration::from_secs(60),
            idle_exit: Some(Duration::from_secs(2)),
            ..ConsumeOptions::default()
        };
        let consuming = tokio::spawn({
            let (receiver, client) = (receiver.clone(), client.clone());
            async move {
                jetstream::consume(
                    &receiver,
                    client,
                    options,
                    tokio_util::sync::CancellationToken::new(),
                    sink,
                )
                .await
            }
        });
        let gated = commit_held(&script).await;
        assert_eq!(gated, 2);
        // A round trip on the consumer's connection, then one on the
        // watcher's: the server has read whatever the consumer sent before,
        // and the watcher has received its copies of it.
        round_trip(&client).await;
        round_trip(&watcher).await;
        assert_eq!(
            received(),
            Vec::<String>::new(),
            "acknowledged while the commit was held"
        );
        script.release();
        let done = tokio::time::timeout(Duration::from_secs(120), consuming)
            .await
            .expect("consume stops after the idle time")
            .unwrap()
            .unwrap();
        assert_eq!(
            (done.acknowledged, done.retried, done.terminated),
            (5, 0, 0)
        );
        // As above: the consumer's connection first (the server has read its
        // acknowledgements), then the watcher's (it has received the copies).
        round_trip(&client).await;
        round_trip(&watcher).await;
        assert_eq!(received().len(), 5, "one acknowledgement per message");
        let acknowledged: BTreeSet<Option<Arc<str>>> = events
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                ConsumeEvent::Acknowledged {
                    event_id,
                    decision: snapshot_receiver::Decision::Applied,
                    ..
                } => Some(event_id.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(
            acknowledged,
            (1..=5).map(|i| Some(Arc::from(format!("e-{i}")))).collect()
        );
        receiver.shutdown().await;
        drop_stream(&js, &stream).await;
    });
}

/// The take-over gate: holder `a` pulls e-1..e-5 of card-1 (versions 1 to
/// 5) and dies with their commit held, nothing acknowledged; e-6..e-10
/// follow; holder `b` takes the partition once `a`'s lease expired, while
/// the server still counts `a`'s five messages as unacknowledged. `b` pulls
/// e-6..e-10 and must keep them waiting until e-1..e-5 come back (after the
/// ack wait), then decide all ten in stream order: every one applied, card-1
/// at version 10 (deciding e-6..e-10 first would leave e-1..e-5 `stale`).
/// The ack wait (30 s) is far longer than the lease (10 s), so `b` takes
/// over before the redelivery however slow the machine, and the lease
/// outlives any stall of a loaded machine, so `b` keeps the partition (at
/// a load average of 10 to 14, a 2 s lease was lost and taken again, and
/// e-6..e-10 were delivered twice).
#[test]
fn a_new_holder_decides_the_dead_holders_unacknowledged_messages_first() {
    use crate::commit::{commit_held, Script};
    use snapshot_receiver::jetstream::{self, ConsumeEvent, ConsumeOptions, Publisher};
    use snapshot_receiver::Decision;
    let Some(nats) = nats_url() else { return };
    let stream = format!("SR_takeover_{}", std::process::id());
    let path = crate::store::temp_db("jetstream-takeover");
    let options = |member: &str| ConsumeOptions {
        stream: stream.clone(),
        member: Some(member.to_owned()),
        lease_ttl: Duration::from_secs(10),
        ack_wait: Duration::from_secs(30),
        ..ConsumeOptions::default()
    };
    let main = runtime();
    let js = main.block_on(async {
        let js = async_nats::jetstream::new(jetstream::connect(&nats).await.unwrap());
        drop_stream(&js, &stream).await;
        js
    });
    let pending = |js: &async_nats::jetstream::Context| {
        main.block_on(async {
            let s = js.get_stream(&stream).await.unwrap();
            let info = s.consumer_info("p0").await.unwrap();
            (info.num_pending, info.num_ack_pending)
        })
    };
    let publish = |range: std::ops::RangeInclusive<u64>| {
        main.block_on(async {
            let client = jetstream::connect(&nats).await.unwrap();
            let bodies: Vec<String> = range.map(card_1).collect();
            let report = Publisher::new(client, &stream, Some(1), None)
                .await
                .unwrap()
                .publish_all(&bodies)
                .await
                .unwrap();
            assert_eq!((report.published, report.dropped_as_duplicate), (5, 0));
        });
    };
    publish(1..=5);

    // `a`'s process: a runtime and a connection of its own, dropped at once
    // once its first delivery commit waits at the gate (a SIGKILL).
    let a_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let script = Arc::new(Script::default());
    let a_receiver = a_runtime.block_on(async {
        let s = script.clone();
        Receiver::builder()
            .object("card-1", 0, "{}")
            .store_with(move || Script::open(&path, s))
            .build()
            .unwrap()
    });
    // Commit 1 seeded the object; the next one is the first delivery's.
    script.hold_next();
    let (a_events, a_sink) = recording_sink();
    a_runtime.spawn({
        let (receiver, options, nats) = (a_receiver.clone(), options("a"), nats.clone());
        async move {
            let client = jetstream::connect(&nats).await.unwrap();
            let token = tokio_util::sync::CancellationToken::new();
            jetstream::consume(&receiver, client, options, token, a_sink).await
        }
    });
    assert_eq!(main.block_on(commit_held(&script)), 2);
    a_runtime.shutdown_background();
    assert!(
        !a_events
            .lock()
            .unwrap()
            .iter()
            .any(|e| matches!(e, ConsumeEvent::Acknowledged { .. })),
        "a acknowledged nothing"
    );
    assert_eq!(pending(&js), (0, 5), "a's five messages unacknowledged");
    publish(6..=10);

    let b_receiver = main.block_on(async {
        Receiver::builder()
            .object("card-1", 0, "{}")
            .build()
            .unwrap()
    });
    let stop = tokio_util::sync::CancellationToken::new();
    let (b_events, b_sink) = {
        let (events, record) = recording_sink();
        let seen = events.clone();
        let stop = stop.clone();
        let sink: snapshot_receiver::jetstream::EventSink = Arc::new(move |e| {
            record(e);
            let acknowledged = seen
                .lock()
                .unwrap()
                .iter()
                .filter(|e| matches!(e, ConsumeEvent::Acknowledged { .. }))
                .count();
            if acknowledged == 10 {
                stop.cancel();
            }
        });
        (events, sink)
    };
    let done = main.block_on(async {
        let client = jetstream::connect(&nats).await.unwrap();
        tokio::time::timeout(
            Duration::from_secs(120),
            jetstream::consume(&b_receiver, client, options("b"), stop, b_sink),
        )
        .await
        .expect("b acknowledges the ten messages")
        .unwrap()
    });
    let decided: BTreeMap<u64, (String, Decision, i64)> = b_events
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            ConsumeEvent::Acknowledged {
                stream_sequence,
                event_id,
                decision,
                delivered,
                ..
            } => Some((
                *stream_sequence,
                (event_id.as_deref()?.to_owned(), *decision, *delivered),
            )),
            _ => None,
        })
        .collect();
    // e-1..e-5 delivered a second time (to b), e-6..e-10 once; all applied.
    let expected: BTreeMap<u64, (String, Decision, i64)> = (1..=10)
        .map(|i| {
            let delivered = if i <= 5 { 2 } else { 1 };
            (i, (format!("e-{i}"), Decision::Applied, delivered))
        })
        .collect();
    assert_eq!(decided, expected);
    // e-6..e-10 waited for the older ones; e-1..e-5 too when they came
    // back between two of the gate's questions to the server (asked at
    // most every `partition::INFO_INTERVAL`), which the test does not time.
    assert_eq!(done.acknowledged, 10);
    assert!(
        (5..=10).contains(&done.waited),
        "{} messages waited",
        done.waited
    );
    let card = main.block_on(b_receiver.object("card-1")).unwrap();
    assert_eq!(
        (card.version, card.state.compact()),
        (10, r#"{"v":10}"#.to_owned())
    );
    main.block_on(async {
        b_receiver.shutdown().await;
        drop_stream(&js, &stream).await;
    });
    // `a`'s committer leaves the gate; its process is gone, nothing acknowledges.
    script.release();
    drop(a_receiver);
}

/// A JetStream effect counts as delivered only once a stream acknowledged
/// it. Published to subjects no stream takes, the server answers "no
/// responders": the effect is refused and stays parked (failed, no retry
/// in this schedule), its reason said, nothing delivered. Once a stream
/// takes the subjects, the operator's retry delivers it, stored once with
/// its effect id as `Nats-Msg-Id`.
#[test]
fn an_effect_no_stream_takes_stays_parked_until_a_stream_acknowledges_it() {
    use snapshot_receiver::jetstream::JetStreamDestination;
    use snapshot_receiver::relay::RelayOptions;
    use snapshot_receiver::store::ParkedStatus;
    let Some(nats) = nats_url() else { return };
    runtime().block_on(async {
        let stream = format!("SR_NO_STREAM_{}", std::process::id());
        let prefix = format!("sr-no-stream-{}", std::process::id());
        let (client, js) = fresh_stream(&nats, &stream).await;
        let rx = Receiver::builder()
            .object("card-1", 0, r#"{"v":0}"#)
            .build()
            .unwrap();
        let receipt = rx.deliver(card_1(1).as_bytes()).await;
        assert_eq!(
            receipt.decision(),
            Some(snapshot_receiver::Decision::Applied),
            "{receipt:?}"
        );
        let effect = rx.outbox(0, 1).await.unwrap().remove(0);
        let options = RelayOptions {
            poll_interval: Duration::from_millis(1),
            schedule: Vec::new(),
            lease: Duration::from_secs(1),
            ..RelayOptions::new("js")
        };
        let destination = JetStreamDestination::new(client.clone(), prefix.clone());
        let relay = rx
            .relay(options.clone(), destination.clone())
            .await
            .unwrap();
        // Until it is parked failed, or (wrongly) delivered.
        let deadline = Instant::now() + Duration::from_secs(60);
        while relay.progress().failed == 0 && relay.progress().delivered == 0 {
            assert!(Instant::now() < deadline, "{:?}", relay.progress());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let progress = relay.stop().await.unwrap();
        assert_eq!(
            (
                progress.position,
                progress.delivered,
                progress.parked,
                progress.failed
            ),
            (1, 0, 1, 1),
            "{progress:?}"
        );
        let mut outbox = rx.outbox_store().await.unwrap();
        let parked = outbox.parked("js").unwrap();
        assert_eq!(parked.len(), 1, "{parked:?}");
        assert_eq!(
            (
                parked[0].effect.id,
                parked[0].status,
                parked[0].attempts,
                parked[0].error.as_deref()
            ),
            (
                effect.id,
                ParkedStatus::Failed,
                1,
                Some(
                    format!("no stream takes the subject {prefix}.card-1 (no responders)").as_str()
                )
            )
        );
        // Nothing reached the server's streams under those subjects.
        assert!(js.get_stream(&stream).await.is_err());

        // A stream takes the subjects; the operator retries; a relay
        // delivers it, and the stream holds it once, under its effect id.
        js.create_stream(async_nats::jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{prefix}.>")],
            storage: async_nats::jetstream::stream::StorageType::Memory,
            ..Default::default()
        })
        .await
        .unwrap();
        assert_eq!(
            outbox.retry_failed("js", None, SystemTime::now()).unwrap(),
            1
        );
        let relay = rx.relay(options, destination).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while relay.progress().delivered == 0 {
            assert!(Instant::now() < deadline, "{:?}", relay.progress());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let progress = relay.stop().await.unwrap();
        assert_eq!(
            (progress.position, progress.delivered, progress.parked),
            (1, 1, 0),
            "{progress:?}"
        );
        let mut s = js.get_stream(&stream).await.unwrap();
        assert_eq!(s.info().await.unwrap().state.messages, 1);
        let stored = s
            .get_last_raw_message_by_subject(&format!("{prefix}.card-1"))
            .await
            .unwrap();
        let id = stored
            .headers
            .get(async_nats::header::NATS_MESSAGE_ID)
            .map(|v| v.as_str().to_owned());
        assert_eq!(id, Some(effect.id.to_string()));
        let body: serde_json::Value = serde_json::from_slice(&stored.payload).unwrap();
        assert_eq!(
            (&body["object_id"], &body["version"], &body["state"]),
            (
                &serde_json::json!("card-1"),
                &serde_json::json!(1),
                &serde_json::json!({"v": 1})
            )
        );
        rx.shutdown().await;
        drop_stream(&js, &stream).await;
    });
}

/// The local server's `max_payload` (its default, 1 MiB) and what the
/// largest effect of a 1 MiB body takes: the default body limit does not
/// fit, and the largest limit that does is 864 bytes less.
const SERVER_MAX_PAYLOAD: usize = 1_048_576;
/// The largest body limit whose effects fit in [`SERVER_MAX_PAYLOAD`].
const FITTING_BODY_LIMIT: usize = SERVER_MAX_PAYLOAD - 864;

/// A JetStream destination checks the server's `max_payload` against the
/// largest effect of the body limit: the default 1 MiB limit is refused
/// with both numbers and what would fit; that limit is taken, and the
/// effect of a body of exactly that size is published and acknowledged.
#[test]
fn a_body_limit_whose_effects_cannot_fit_is_refused_and_the_largest_that_fits_delivers() {
    use snapshot_receiver::jetstream::JetStreamDestination;
    use snapshot_receiver::relay::RelayOptions;
    let Some(nats) = nats_url() else { return };
    runtime().block_on(async {
        let stream = format!("SR_PAYLOAD_{}", std::process::id());
        let prefix = format!("sr-payload-{}", std::process::id());
        let (client, js) = fresh_stream(&nats, &stream).await;
        js.create_stream(async_nats::jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{prefix}.>")],
            storage: async_nats::jetstream::stream::StorageType::Memory,
            ..Default::default()
        })
        .await
        .unwrap();
        let destination = JetStreamDestination::new(client, prefix.clone());
        assert_eq!(destination.max_payload(), SERVER_MAX_PAYLOAD);
        let refused = destination
            .check_body_limit(snapshot_receiver::Limits::default().max_body_bytes)
            .unwrap_err();
        assert_eq!(
            refused.to_string(),
            "the NATS server's max_payload is 1048576 bytes, but the effect of a body of up to \
             1048576 bytes (the body limit) takes up to 1049440 bytes: lower the body limit to \
             at most 1047712 bytes, or raise the server's max_payload to at least 1049440 bytes"
        );
        assert!(destination
            .check_body_limit(FITTING_BODY_LIMIT + 1)
            .is_err());
        destination.check_body_limit(FITTING_BODY_LIMIT).unwrap();

        // A receiver with that limit, the largest body it accepts.
        let rx = Receiver::builder()
            .limits(snapshot_receiver::Limits {
                max_body_bytes: FITTING_BODY_LIMIT,
                ..Default::default()
            })
            .object("card-1", 0, r#"{"v":0}"#)
            .build()
            .unwrap();
        let envelope = card_1(1).replace(r#"{"v":1}"#, r#"{"pad":""}"#);
        let pad = "x".repeat(FITTING_BODY_LIMIT - envelope.len());
        let body = envelope.replace(r#"{"pad":""}"#, &format!(r#"{{"pad":"{pad}"}}"#));
        assert_eq!(body.len(), FITTING_BODY_LIMIT);
        let receipt = rx.deliver(body.as_bytes()).await;
        assert_eq!(
            receipt.decision(),
            Some(snapshot_receiver::Decision::Applied),
            "{receipt:?}"
        );
        let options = RelayOptions {
            poll_interval: Duration::from_millis(1),
            schedule: Vec::new(),
            lease: Duration::from_secs(1),
            ..RelayOptions::new("js")
        };
        let relay = rx.relay(options, destination).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while relay.progress().delivered + relay.progress().parked as u64 == 0 {
            assert!(Instant::now() < deadline, "{:?}", relay.progress());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let progress = relay.stop().await.unwrap();
        assert_eq!(
            (progress.position, progress.delivered, progress.parked),
            (1, 1, 0),
            "{progress:?}"
        );
        let stored = js
            .get_stream(&stream)
            .await
            .unwrap()
            .get_last_raw_message_by_subject(&format!("{prefix}.card-1"))
            .await
            .unwrap();
        let effect: serde_json::Value = serde_json::from_slice(&stored.payload).unwrap();
        assert_eq!(
            effect["state"]["pad"].as_str().map(str::len),
            Some(pad.len())
        );
        rx.shutdown().await;
        drop_stream(&js, &stream).await;
    });
}

/// `serve --forward-nats` and `relay --forward-nats` refuse to start when
/// the body limit's largest effect cannot fit the server's `max_payload`,
/// naming both numbers and the flag; with the largest limit that fits,
/// serve starts.
#[test]
fn serve_and_relay_refuse_a_body_limit_the_nats_server_cannot_take() {
    let Some(nats) = nats_url() else { return };
    let refusal = format!(
        "error: --forward-nats {nats}: the NATS server's max_payload is 1048576 bytes, but the \
         effect of a body of up to 1048576 bytes (the body limit) takes up to 1049440 bytes: \
         lower the body limit to at most 1047712 bytes, or raise the server's max_payload to at \
         least 1049440 bytes (the body limit is --max-body-bytes; max_payload is set in the NATS \
         server's configuration)\n"
    );
    let serve = crate::serve::within_seconds(
        60,
        crate::common::cli().args([
            "serve",
            "--store",
            "memory",
            "--listen",
            "127.0.0.1:0",
            "--forward-nats",
            &nats,
        ]),
    );
    assert_eq!(serve.status.code(), Some(2));
    assert_eq!(String::from_utf8_lossy(&serve.stderr), refusal);
    assert_eq!(String::from_utf8_lossy(&serve.stdout), "");

    let dir = std::env::temp_dir().join(format!("sr-payload-relay-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let store = format!("sqlite:{}", dir.join("rx.db").display());
    runtime().block_on(async {
        Receiver::builder()
            .store(&store)
            .build()
            .unwrap()
            .shutdown()
            .await;
    });
    let relay = crate::serve::within_seconds(
        60,
        crate::common::cli().args(["relay", "--store", &store, "--forward-nats", &nats]),
    );
    assert_eq!(relay.status.code(), Some(2));
    assert_eq!(String::from_utf8_lossy(&relay.stderr), refusal);

    let fits = FITTING_BODY_LIMIT.to_string();
    let server = crate::serve::Server::start(&[
        "--store",
        "memory",
        "--forward-nats",
        &nats,
        "--max-body-bytes",
        &fits,
    ]);
    assert_eq!(
        server.banner.trim_end(),
        format!(
            "store: memory; signatures: off (unsigned deliveries accepted); operator endpoints: \
             off; forwarding: {nats} (JetStream, subjects effects.<object>) as relay forward"
        )
    );
    assert!(server.stop().0.success());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `consume` prints what a user needs: a line when it joins, one per
/// partition taken and released, the summary last; a line per message only
/// with `--print-acks`. 10 messages on 4 partitions: 10 lines. The
/// summary's deliveries per commit are those of the commits that carried a
/// delivery (the seeding of `--initial` is not one): a median of at least
/// one, never above the largest, beside a mean of at least one; times in
/// milliseconds to the microsecond.
#[test]
fn consume_prints_a_line_per_partition_and_a_summary_of_groups_of_deliveries() {
    let dir = crate::serve::scratch("consume-lines");
    let store = format!("sqlite:{}", dir.join("rx.db").display());
    consume_lines("sqlite", &[&store]);
}

#[test]
fn on_postgres_consume_prints_a_line_per_partition_and_a_summary_of_groups_of_deliveries() {
    let Some(url) = pg_url() else { return };
    let schema = format!("sr_js_lines_{}", std::process::id());
    drop_schema(&url, &schema);
    consume_lines("pg", &[&url, "--store-schema", &schema]);
    drop_schema(&url, &schema);
}

/// [`consume_prints_a_line_per_partition_and_a_summary_of_groups_of_deliveries`]
/// on the store `store` (`--store`'s value and further arguments), its
/// stream named after `name`.
fn consume_lines(name: &str, store: &[&str]) {
    let Some(nats) = nats_url() else { return };
    // A consume process holds 17 PostgreSQL connections: one at a time
    // with the scenes.
    let _alone = ONE_SCENE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let stream = format!("SR_consume_lines_{name}_{}", std::process::id());
    let fixture = crate::common::repo("fixtures/B62-15-events.json");
    let fixture = fixture.to_str().unwrap();
    let clean = |stream: &str| {
        let (nats, stream) = (nats.clone(), stream.to_owned());
        runtime().block_on(async move {
            let js = async_nats::jetstream::new(async_nats::connect(&nats).await.unwrap());
            drop_stream(&js, &stream).await;
        });
    };
    clean(&stream);
    let report = published(crate::common::spawn_quiet(
        crate::common::cli()
            .args(["publish", fixture, "--nats", &nats, "--stream", &stream])
            .args(["--partitions", "4"])
            .stdout(Stdio::piped()),
    ));
    assert_eq!(report["published"], 10, "{report}");
    let output = crate::serve::within_seconds(
        120,
        crate::common::cli()
            .args(["consume", "--nats", &nats, "--stream", &stream])
            .arg("--store")
            .args(store)
            .args(["--initial", fixture])
            .args(["--idle-exit", "2"])
            .env_remove("RUST_LOG"),
    );
    clean(&stream);
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let events: Vec<&str> = lines.iter().map(|l| l["event"].as_str().unwrap()).collect();
    let count = |e: &str| events.iter().filter(|x| **x == e).count();
    assert_eq!(
        (
            lines.len(),
            count("joined"),
            count("took"),
            count("released"),
            count("summary")
        ),
        (10, 1, 4, 4, 1),
        "{stdout}"
    );
    assert_eq!(events.last(), Some(&"summary"), "{stdout}");
    let summary = &lines[lines.len() - 1];
    assert_eq!(summary["acknowledged"], 10, "{summary}");
    let store = &summary["store"];
    assert_eq!(store["deliveries"], 10, "{summary}");
    let groups = &store["deliveries_per_commit"];
    let (mean, p50, max) = (
        groups["mean"].as_f64().unwrap(),
        groups["p50"].as_u64().unwrap(),
        groups["max"].as_u64().unwrap(),
    );
    assert!(p50 >= 1 && p50 <= max, "{groups}");
    assert!(mean >= 1.0 && mean <= max as f64, "{groups}");
    assert_eq!(
        mean,
        (mean * 100.0).round() / 100.0,
        "two decimals: {groups}"
    );
    for quantile in ["p50", "p99"] {
        let ms = store["commit_ms"][quantile].as_f64().unwrap();
        assert!(ms > 0.0, "{summary}");
        assert_eq!(ms, (ms * 1000.0).round() / 1000.0, "to the µs: {summary}");
    }
}
