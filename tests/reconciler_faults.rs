//! The reconciler where it can break (issue 47; docs/CONTRACT.md §4, *The
//! service fetches authorities itself*), with the real `serve` binary on
//! SQLite and PostgreSQL against a test authority on loopback:
//! - `serve --authority` killed (SIGKILL) while every fetch it sent waits
//!   for its answer, then started again on the same store: the new process
//!   finds what needs an authority in the store and fetches it again; every
//!   paused object converges, every delivery acknowledged before the kill
//!   is still recorded (its redelivery is its duplicate), and each object
//!   has exactly one authoritative replacement;
//! - the authority refusing (503) for a while: the breaker opens after its
//!   failures, nothing but one probe per open spell goes out, deliveries
//!   keep being accepted (none answered `retry`), and once the authority
//!   answers the probe closes the breaker and every paused object
//!   converges.

use crate::durability::drop_schema;
use crate::serve::{envelope, objects_fixture, scratch, Server, NEW_SECRET};
use snapshot_receiver::store::StoreReader;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How the test authority answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Holds every request until the mode changes (a slow authority).
    Hold,
    /// 503 Service Unavailable, at once.
    Refuse,
    /// The object's snapshot at [`AUTHORITY_VERSION`].
    Answer,
}

/// The version the authority knows every object at.
const AUTHORITY_VERSION: u64 = 3;

/// One request the test authority received.
#[derive(Clone, Debug)]
struct Asked {
    /// The request's path (`/objects/obj-0`).
    path: String,
    /// When it arrived.
    arrived: Instant,
    /// When it was answered (`None`: not yet).
    answered: Option<Instant>,
    /// The mode it was answered in.
    mode: Option<Mode>,
}

/// An HTTP authority on loopback whose answers the test switches
/// ([`Mode`]), in a thread with a runtime of its own; it stops when
/// dropped.
struct Authority {
    /// `http://127.0.0.1:PORT/objects/{object_id}`.
    template: String,
    asked: Arc<Mutex<Vec<Asked>>>,
    mode: Arc<tokio::sync::watch::Sender<Mode>>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl Authority {
    fn start(mode: Mode) -> Self {
        let asked: Arc<Mutex<Vec<Asked>>> = Arc::default();
        let (mode, _) = tokio::sync::watch::channel(mode);
        let mode = Arc::new(mode);
        let (record, modes) = (asked.clone(), mode.clone());
        let app =
            axum::Router::new().fallback(move |request: axum::http::Request<axum::body::Body>| {
                let (record, modes) = (record.clone(), modes.clone());
                async move { answer(request.uri().path(), &record, &modes).await }
            });
        let (addr, stop) = crate::common::loopback::serve(app);
        Self {
            template: format!("http://{addr}/objects/{{object_id}}"),
            asked,
            mode,
            _stop: stop,
        }
    }

    /// Answers in `mode` from now on (held requests too).
    fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    fn asked(&self) -> Vec<Asked> {
        self.asked.lock().unwrap().clone()
    }
}

/// The test authority's answer to a request for `path`, in the mode set
/// when it is answered.
async fn answer(
    path: &str,
    record: &Mutex<Vec<Asked>>,
    modes: &tokio::sync::watch::Sender<Mode>,
) -> axum::http::Response<axum::body::Body> {
    let mut mode = modes.subscribe();
    let index = {
        let mut asked = record.lock().unwrap();
        asked.push(Asked {
            path: path.to_owned(),
            arrived: Instant::now(),
            answered: None,
            mode: None,
        });
        asked.len() - 1
    };
    let answered = loop {
        let now = *mode.borrow_and_update();
        if now != Mode::Hold {
            break now;
        }
        if mode.changed().await.is_err() {
            break Mode::Refuse;
        }
    };
    {
        let mut asked = record.lock().unwrap();
        asked[index].answered = Some(Instant::now());
        asked[index].mode = Some(answered);
    }
    let object = path.rsplit('/').next().unwrap_or_default();
    let (status, body) = match answered {
        Mode::Answer => (
            200,
            format!(
                r#"{{"object_id":"{object}","version":{AUTHORITY_VERSION},"state":{{"v":"authority"}},"as_of":"2026-12-06T08:00:00Z"}}"#
            ),
        ),
        _ => (503, "down for maintenance".to_owned()),
    };
    axum::http::Response::builder()
        .status(status)
        .body(axum::body::Body::from(body))
        .unwrap()
}

/// Polls `check` every 50 ms until it holds, for at most 30 s.
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(Instant::now() < deadline, "not within 30 s: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `serve` on `store` with the authority and `extra` flags; the objects
/// `obj-0` .. `obj-5` known at version 0.
fn serve(dir: &std::path::Path, store: &str, schema: Option<&str>, extra: &[&str]) -> Server {
    let fixture = objects_fixture(dir, 6);
    let mut args = vec!["--initial", &fixture, "--store", store];
    if let Some(schema) = schema {
        args.extend(["--store-schema", schema]);
    }
    args.extend(extra);
    Server::start_env(&args, &[("SNAPSHOT_RECEIVER_WEBHOOK_SECRET", NEW_SECRET)])
}

/// Posts `body` signed; the decision, which must be acknowledged.
fn post(server: &Server, body: &str) -> String {
    let reply = server.post_signed(NEW_SECRET, body);
    let answer = reply.json();
    assert_eq!(
        (reply.status, answer["ack"].as_str()),
        (200, Some("acknowledge")),
        "{body}: {}",
        reply.body
    );
    answer["decision"].as_str().unwrap().to_owned()
}

/// Pauses `obj-{o}` with a variant: e-{o}-1 at version 1 applied, then
/// e-{o}-1 with another state (conflict, paused), then e-{o}-2 at version 2
/// held behind the pause. The bodies posted, with their decisions.
fn pause(server: &Server, o: usize) -> Vec<(String, String)> {
    let object = format!("obj-{o}");
    let first = envelope(&format!("e-{o}-1"), &object, 1, r#"{"v":1}"#);
    let variant = envelope(&format!("e-{o}-1"), &object, 1, r#"{"v":"other"}"#);
    let next = envelope(&format!("e-{o}-2"), &object, 2, r#"{"v":2}"#);
    let mut sent = Vec::new();
    for (body, expected) in [(first, "applied"), (variant, "conflict"), (next, "held")] {
        let decision = post(server, &body);
        assert_eq!(decision, expected, "{body}");
        sent.push((body, decision));
    }
    sent
}

/// `obj-{o}` as the server shows it: (version, paused).
fn shown(server: &Server, o: usize) -> (u64, bool) {
    let object = server.get(&format!("/objects/obj-{o}")).json();
    (
        object["version"].as_u64().unwrap(),
        object["paused"].as_bool().unwrap(),
    )
}

/// The value of the metric line starting with `name` (with its labels).
fn metric(server: &Server, name: &str) -> Option<f64> {
    let metrics = server.get("/metrics").body;
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// Objects paused by a variant in both tests: `obj-0` .. `obj-3`.
const PAUSED: usize = 4;

/// Killed while every fetch waits for its answer, started again on the
/// same store (see the module doc).
fn killed_during_fetches(store: &str, schema: Option<&str>) {
    let dir = scratch("reconciler-kill");
    let authority = Authority::start(Mode::Hold);
    // Rescans an hour apart: after the restart only the start-up scan of
    // the store can find the paused objects.
    let flags = [
        "--authority",
        &authority.template,
        "--authority-rescan",
        "3600",
        "--authority-rate",
        "0",
    ];
    let server = serve(&dir, store, schema, &flags);
    let mut acknowledged = Vec::new();
    for o in 0..PAUSED {
        acknowledged.extend(pause(&server, o));
    }
    for o in PAUSED..6 {
        let body = envelope(&format!("e-{o}-1"), &format!("obj-{o}"), 1, r#"{"v":1}"#);
        assert_eq!(post(&server, &body), "applied");
        acknowledged.push((body, "applied".to_owned()));
    }
    eventually("a fetch of every paused object in flight", || {
        authority.asked().len() == PAUSED
    });
    let status = server.kill();
    assert!(!status.success(), "{status:?}");
    let reader = StoreReader::open(store, schema).unwrap();
    let stored: Vec<(String, u64, bool)> = reader
        .objects(true)
        .unwrap()
        .into_iter()
        .map(|o| (o.object_id, o.version, o.paused))
        .collect();
    let expected: Vec<(String, u64, bool)> =
        (0..PAUSED).map(|o| (format!("obj-{o}"), 1, true)).collect();
    assert_eq!(stored, expected, "paused in the store when killed");

    let server = serve(&dir, store, schema, &flags);
    eventually(
        "every paused object fetched again by the new process",
        || authority.asked().len() == 2 * PAUSED,
    );
    authority.set(Mode::Answer);
    eventually("every paused object converged", || {
        (0..PAUSED).all(|o| shown(&server, o) == (AUTHORITY_VERSION, false))
    });
    // Each object asked once by each process, no more.
    let mut paths: Vec<String> = authority.asked().into_iter().map(|a| a.path).collect();
    paths.sort();
    let mut expected: Vec<String> = (0..PAUSED)
        .flat_map(|o| [format!("/objects/obj-{o}"), format!("/objects/obj-{o}")])
        .collect();
    expected.sort();
    assert_eq!(paths, expected);
    // Nothing acknowledged was lost: each redelivery is a duplicate of its
    // first decision.
    for (body, decision) in &acknowledged {
        let reply = server.post_signed(NEW_SECRET, body);
        let answer = reply.json();
        let original = match decision.as_str() {
            "conflict" => "conflict (event_variant)",
            "held" => "held (paused)",
            other => other,
        };
        assert_eq!(
            (
                answer["decision"].as_str(),
                answer["original_decision"].as_str()
            ),
            (Some("duplicate"), Some(original)),
            "{body}: {}",
            reply.body
        );
    }
    // Exactly one authoritative replacement per paused object, none for
    // the others; e-{o}-2 (version 2) decided again: stale.
    for o in 0..6 {
        let object = format!("obj-{o}");
        let audit = reader.audit_for_object(&object).unwrap();
        let authority_lines: Vec<(Option<u64>, bool)> = audit
            .iter()
            .filter(|l| l.kind == "authority")
            .map(|l| (l.version, l.replacement))
            .collect();
        let expected = if o < PAUSED {
            vec![(Some(AUTHORITY_VERSION), true)]
        } else {
            vec![]
        };
        assert_eq!(authority_lines, expected, "{object}");
        if o < PAUSED {
            let redecided: Vec<Option<&str>> = audit
                .iter()
                .filter(|l| l.kind == "reevaluated")
                .map(|l| l.decision.as_deref())
                .collect();
            assert_eq!(redecided, [Some("stale")], "{object}");
        }
    }
    assert_eq!(
        metric(
            &server,
            "snapshot_receiver_authority_fetches_total{outcome=\"applied\"}"
        ),
        Some(PAUSED as f64)
    );
    let (status, rest) = server.stop();
    assert!(status.success(), "{rest}");
}

#[test]
fn killed_during_fetches_every_paused_object_converges_after_a_restart_on_sqlite() {
    let dir = scratch("reconciler-kill-store");
    let store = format!("sqlite:{}", dir.join("rx.db").display());
    killed_during_fetches(&store, None);
}

#[test]
fn killed_during_fetches_every_paused_object_converges_after_a_restart_on_postgres() {
    let Some(url) = crate::durability::pg_url() else {
        return;
    };
    let schema = format!("sr_reconciler_kill_{}", std::process::id());
    drop_schema(&url, &schema);
    killed_during_fetches(&url, Some(&schema));
    drop_schema(&url, &schema);
}

/// Failures in a row that open the breaker, in the test below.
const BREAKER_FAILURES: usize = 3;

/// How long the breaker stays open, in the test below.
const BREAKER_OPEN: Duration = Duration::from_secs(1);

/// The authority refusing, then back (see the module doc).
fn authority_down_then_back(store: &str, schema: Option<&str>) {
    let dir = scratch("reconciler-down");
    let authority = Authority::start(Mode::Refuse);
    // One fetch at a time (so that the failures that open the breaker are
    // exactly its threshold), no rate limit, backoff from 50 ms.
    let flags = [
        "--authority",
        &authority.template,
        "--authority-concurrency",
        "1",
        "--authority-rate",
        "0",
        "--authority-backoff",
        "0.05",
        "--authority-backoff-max",
        "1",
        "--authority-breaker-failures",
        "3",
        "--authority-breaker-open",
        "1",
        "--authority-rescan",
        "3600",
    ];
    let server = serve(&dir, store, schema, &flags);
    for o in 0..PAUSED {
        pause(&server, o);
    }
    eventually("the breaker's threshold of failures", || {
        authority.asked().len() >= BREAKER_FAILURES
    });
    // While the authority is down, deliveries keep being accepted: for each
    // paused object ten more held behind its pause, and forty applied to
    // each of the others. None is answered `retry`.
    for v in 2..42u64 {
        for o in 0..6 {
            let (event, object) = (format!("m-{o}-{v}"), format!("obj-{o}"));
            let state = format!(r#"{{"v":{v},"n":"more"}}"#);
            let (body, expected) = match o < PAUSED {
                true if v >= 12 => continue,
                true => (envelope(&event, &object, 2, &state), "held"),
                false => (envelope(&event, &object, v, &state), "applied"),
            };
            assert_eq!(post(&server, &body), expected, "{body}");
        }
    }
    // Down until two probes were refused after the threshold's failures.
    eventually("two probes refused", || {
        let asked = authority.asked();
        asked.len() >= BREAKER_FAILURES + 2 && asked.iter().all(|a| a.answered.is_some())
    });
    let third = authority.asked()[BREAKER_FAILURES - 1].answered.unwrap();
    authority.set(Mode::Answer);
    let back = Instant::now();
    eventually("every paused object converged", || {
        (0..PAUSED).all(|o| shown(&server, o) == (AUTHORITY_VERSION, false))
    });
    let asked = authority.asked();
    let refused: Vec<&Asked> = asked
        .iter()
        .filter(|a| a.mode == Some(Mode::Refuse))
        .collect();
    let answered: Vec<&Asked> = asked
        .iter()
        .filter(|a| a.mode == Some(Mode::Answer))
        .collect();
    // The refused fetches come first; after the threshold's, each one is
    // the probe of an open spell: it went out no sooner than the breaker's
    // open time after the refusal before it was answered.
    assert_eq!(refused.len() + answered.len(), asked.len(), "{asked:#?}");
    for pair in refused[BREAKER_FAILURES - 1..].windows(2) {
        let gap = pair[1].arrived.duration_since(pair[0].answered.unwrap());
        assert!(
            gap >= BREAKER_OPEN,
            "a fetch {gap:?} after a refusal while the breaker was open: {asked:#?}"
        );
    }
    // So while down: the threshold, and at most one probe per open spell.
    let down = back.duration_since(third);
    let spells = (down.as_secs_f64() / BREAKER_OPEN.as_secs_f64()).floor() as usize;
    assert!(
        refused.len() <= BREAKER_FAILURES + spells,
        "{} fetches refused in {down:?}: {asked:#?}",
        refused.len()
    );
    // Back: one applied answer per paused object (the first one the probe
    // that closed the breaker), nothing else.
    let mut paths: Vec<&str> = answered.iter().map(|a| a.path.as_str()).collect();
    paths.sort();
    let expected: Vec<String> = (0..PAUSED).map(|o| format!("/objects/obj-{o}")).collect();
    assert_eq!(paths, expected);
    assert_eq!(
        (
            metric(
                &server,
                "snapshot_receiver_authority_fetches_total{outcome=\"unavailable\"}"
            ),
            metric(
                &server,
                "snapshot_receiver_authority_fetches_total{outcome=\"applied\"}"
            ),
            metric(&server, "snapshot_receiver_authority_breaker"),
            metric(&server, "snapshot_receiver_authority_waiting"),
        ),
        (
            Some(refused.len() as f64),
            Some(PAUSED as f64),
            Some(0.0),
            Some(0.0)
        )
    );
    // Nothing lost: the held events were decided again (stale), the others
    // applied in order.
    for o in PAUSED..6 {
        assert_eq!(shown(&server, o), (41, false), "obj-{o}");
    }
    let reader = StoreReader::open(store, schema).unwrap();
    for o in 0..PAUSED {
        let stale = reader
            .audit_for_object(&format!("obj-{o}"))
            .unwrap()
            .into_iter()
            .filter(|l| l.kind == "reevaluated" && l.decision.as_deref() == Some("stale"))
            .count();
        assert_eq!(stale, 11, "obj-{o}: e-{o}-2 and ten more, stale");
    }
    let (status, rest) = server.stop();
    assert!(status.success(), "{rest}");
}

#[test]
fn authority_down_then_back_the_breaker_opens_and_closes_on_sqlite() {
    let dir = scratch("reconciler-down-store");
    let store = format!("sqlite:{}", dir.join("rx.db").display());
    authority_down_then_back(&store, None);
}

#[test]
fn authority_down_then_back_the_breaker_opens_and_closes_on_postgres() {
    let Some(url) = crate::durability::pg_url() else {
        return;
    };
    let schema = format!("sr_reconciler_down_{}", std::process::id());
    drop_schema(&url, &schema);
    authority_down_then_back(&url, Some(&schema));
    drop_schema(&url, &schema);
}
