//! `serve --forward URL` and the `relay` command over loopback
//! (docs/CONTRACT.md §10): every effect POSTed to a sink, signed with
//! Standard Webhooks under the forwarding secret, `webhook-id` = the effect
//! id; per object in version order; a 503 with `Retry-After` honoured and
//! the effect re-sent with the same id; a relay command that resumes at
//! its cursor; options checked by name.

use crate::common::{cli, repo};
use crate::serve::{envelope, mac, scratch, within_seconds, Server, NEW_SECRET, OLD_SECRET};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde_json::Value;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One request the sink received.
#[derive(Clone, Debug)]
pub(crate) struct Got {
    /// The `webhook-id` header.
    pub(crate) id: String,
    /// Whether the signature checked with [`NEW_SECRET`].
    pub(crate) signed: bool,
    /// The body as JSON.
    pub(crate) body: Value,
    /// What the sink answered.
    pub(crate) status: u16,
    /// When it arrived.
    at: Instant,
    /// When it arrived, in whole seconds since the Unix epoch (the test's
    /// own clock).
    received: u64,
    /// The `webhook-timestamp` header as sent.
    timestamp: String,
    /// The `Host` header as sent.
    host: Option<String>,
    /// The `traceparent` header, when sent (tests/trace.rs).
    pub(crate) traceparent: Option<String>,
    /// The `tracestate` header, when sent.
    pub(crate) tracestate: Option<String>,
}

/// What the sink answers: by the effect's object and version, and how
/// many times that id came before, the status and a `Retry-After` value;
/// status 0: no answer at all.
pub(crate) type Policy = dyn Fn(&str, u64, usize) -> (u16, Option<String>) + Send + Sync;

/// An HTTP sink on loopback, recording every request. It can be stopped
/// like a crashed process ([`Sink::kill`]) and started again on its port
/// ([`Sink::revive`]).
pub(crate) struct Sink {
    /// `http://127.0.0.1:PORT/hook`.
    pub(crate) url: String,
    got: Arc<Mutex<Vec<Got>>>,
    policy: Arc<Policy>,
    /// Where it listens.
    addr: std::net::SocketAddr,
    /// Whether answers are held ([`Sink::hold_answers`]).
    holding: Arc<std::sync::atomic::AtomicBool>,
    /// The server while it runs.
    running: Mutex<Option<Running>>,
}

/// A sink's server: its thread runs a runtime of its own until `stop` is
/// sent (or dropped), then drops the runtime, which closes the listener
/// and every connection, answered or not.
struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

/// Whether the Standard Webhooks signature of `body` checks.
fn signed(headers: &axum::http::HeaderMap, body: &[u8]) -> bool {
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let key = BASE64
        .decode(NEW_SECRET.strip_prefix("whsec_").unwrap())
        .unwrap();
    let (id, ts) = (get("webhook-id"), get("webhook-timestamp"));
    let tag = mac(&key, &[id.as_bytes(), b".", ts.as_bytes(), b".", body]);
    get("webhook-signature") == format!("v1,{}", BASE64.encode(tag))
}

/// Now, in whole seconds since the Unix epoch.
fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Starts a sink's server on `addr`, recording into `record`: the
/// address it listens on, or why it could not bind.
fn listen(
    addr: std::net::SocketAddr,
    policy: Arc<Policy>,
    record: Arc<Mutex<Vec<Got>>>,
    holding: Arc<std::sync::atomic::AtomicBool>,
) -> std::io::Result<(std::net::SocketAddr, Running)> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = match tokio::net::TcpListener::bind(addr).await {
                Ok(listener) => listener,
                Err(e) => {
                    tx.send(Err(e)).unwrap();
                    return;
                }
            };
            tx.send(Ok(listener.local_addr().unwrap())).unwrap();
            let app = axum::Router::new().route(
                "/hook",
                axum::routing::post(
                    move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                        let (record, policy) = (record.clone(), policy.clone());
                        let holding = holding.clone();
                        async move {
                            let json: Value = serde_json::from_slice(&body).unwrap();
                            let id = headers
                                .get("webhook-id")
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("")
                                .to_owned();
                            let (status, retry_after) = {
                                let mut got = record.lock().unwrap();
                                let before = got.iter().filter(|g| g.id == id).count();
                                let (status, retry_after) = policy(
                                    json["object_id"].as_str().unwrap_or(""),
                                    json["version"].as_u64().unwrap_or(0),
                                    before,
                                );
                                got.push(Got {
                                    id,
                                    signed: signed(&headers, &body),
                                    body: json,
                                    status,
                                    at: Instant::now(),
                                    received: unix_now(),
                                    timestamp: headers
                                        .get("webhook-timestamp")
                                        .and_then(|v| v.to_str().ok())
                                        .unwrap_or("")
                                        .to_owned(),
                                    host: headers
                                        .get("host")
                                        .and_then(|v| v.to_str().ok())
                                        .map(str::to_owned),
                                    traceparent: headers
                                        .get("traceparent")
                                        .and_then(|v| v.to_str().ok())
                                        .map(str::to_owned),
                                    tracestate: headers
                                        .get("tracestate")
                                        .and_then(|v| v.to_str().ok())
                                        .map(str::to_owned),
                                });
                                (status, retry_after)
                            };
                            if status == 0 || holding.load(std::sync::atomic::Ordering::SeqCst) {
                                // Never answered.
                                std::future::pending::<()>().await;
                            }
                            let mut response = axum::http::Response::builder().status(status);
                            if let Some(value) = retry_after {
                                response = response.header("retry-after", value);
                            }
                            response.body(axum::body::Body::empty()).unwrap()
                        }
                    },
                ),
            );
            tokio::select! {
                served = async { axum::serve(listener, app).await } => served.unwrap(),
                // Stopped (or the sink dropped): the listener goes with
                // this future, the connections with the runtime.
                _ = stopped => {}
            }
        });
    });
    match rx.recv().unwrap() {
        Ok(bound) => Ok((bound, Running { stop, thread })),
        Err(e) => {
            thread.join().unwrap();
            Err(e)
        }
    }
}

impl Sink {
    pub(crate) fn start(policy: Box<Policy>) -> Sink {
        let got: Arc<Mutex<Vec<Got>>> = Arc::default();
        let policy: Arc<Policy> = policy.into();
        let holding = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (addr, running) = listen(
            ([127, 0, 0, 1], 0).into(),
            policy.clone(),
            got.clone(),
            holding.clone(),
        )
        .expect("a sink on a free loopback port");
        Sink {
            url: format!("http://{addr}/hook"),
            got,
            policy,
            addr,
            holding,
            running: Mutex::new(Some(running)),
        }
    }

    /// Stops at once, as a crashed destination: its port refuses
    /// connections and every open connection is closed, a request in it
    /// answered or not. Returns once all are closed.
    pub(crate) fn kill(&self) {
        let running = self.running.lock().unwrap().take();
        if let Some(Running { stop, thread }) = running {
            let _ = stop.send(());
            thread.join().unwrap();
        }
    }

    /// While `on`, every request is recorded with the policy's answer but
    /// not answered, as by a destination that did the work and stopped
    /// before it said so ([`Sink::kill`] cuts them).
    pub(crate) fn hold_answers(&self, on: bool) {
        self.holding.store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// Starts again on the same port, with what it received so far.
    pub(crate) fn revive(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let running = loop {
            match listen(
                self.addr,
                self.policy.clone(),
                self.got.clone(),
                self.holding.clone(),
            ) {
                Ok((_, running)) => break running,
                // Another socket took the port meanwhile; it lets go soon.
                Err(e) if Instant::now() < deadline => {
                    eprintln!("sink on {}: {e}; trying again", self.addr);
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("sink on {}: cannot listen again: {e}", self.addr),
            }
        };
        *self.running.lock().unwrap() = Some(running);
    }

    pub(crate) fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }

    /// The requests answered 2xx.
    pub(crate) fn accepted(&self) -> Vec<Got> {
        self.got()
            .into_iter()
            .filter(|g| (200..300).contains(&g.status))
            .collect()
    }

    /// Waits until `n` requests were answered 2xx.
    pub(crate) fn wait_accepted(&self, n: usize) -> Vec<Got> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let accepted = self.accepted();
            if accepted.len() >= n {
                return accepted;
            }
            assert!(
                Instant::now() < deadline,
                "{} of {n}: {:?}",
                accepted.len(),
                self.got()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Where a forwarding test keeps its store: a SQLite file in a scratch
/// folder, or a schema of the PostgreSQL test server (dropped when this
/// is dropped). Every test here that parks effects runs on both
/// (docs/CONTRACT.md §10: a refused effect never stops the others, on
/// every store).
pub(crate) struct CliStore {
    /// `--store ...` (and `--store-schema ...`).
    args: Vec<String>,
    /// The PostgreSQL server and schema, to drop at the end.
    pg: Option<(String, String)>,
}

impl CliStore {
    /// A SQLite file in the scratch folder `name`.
    pub(crate) fn sqlite(name: &str) -> CliStore {
        let path = scratch(name).join("rx.db");
        CliStore {
            args: vec!["--store".to_owned(), format!("sqlite:{}", path.display())],
            pg: None,
        }
    }

    /// A fresh schema named after `name` (lower case); `None` (the test
    /// skipped) without a server outside CI.
    pub(crate) fn postgres(name: &str) -> Option<CliStore> {
        let url = crate::durability::pg_url()?;
        let schema = format!("sr_fw_{name}_{}", std::process::id());
        crate::durability::drop_schema(&url, &schema);
        Some(CliStore {
            args: vec![
                "--store".to_owned(),
                url.clone(),
                "--store-schema".to_owned(),
                schema.clone(),
            ],
            pg: Some((url, schema)),
        })
    }

    /// The store's arguments, then `rest`.
    pub(crate) fn with<'a>(&'a self, rest: &[&'a str]) -> Vec<&'a str> {
        self.args
            .iter()
            .map(String::as_str)
            .chain(rest.iter().copied())
            .collect()
    }
}

impl Drop for CliStore {
    fn drop(&mut self) {
        if let Some((url, schema)) = &self.pg {
            crate::durability::drop_schema(url, schema);
        }
    }
}

/// Per object, the versions accepted, in the order they were accepted.
fn versions(accepted: &[Got]) -> HashMap<String, Vec<u64>> {
    let mut by: HashMap<String, Vec<u64>> = HashMap::new();
    for g in accepted {
        by.entry(g.body["object_id"].as_str().unwrap().to_owned())
            .or_default()
            .push(g.body["version"].as_u64().unwrap());
    }
    by
}

fn fixture() -> String {
    repo("fixtures/B62-15-events.json").display().to_string()
}

fn post_ok(server: &Server, event: &str, object: &str, version: u64) {
    let reply = server.post(&[], &envelope(event, object, version, r#"{"stage":"x"}"#));
    assert_eq!(reply.status, 200, "{}", reply.body);
}

#[test]
fn serve_forwards_every_effect_signed_in_order_and_honours_retry_after() {
    forwards_every_effect(&CliStore::sqlite("forward"));
}

#[test]
fn on_postgres_serve_forwards_every_effect_signed_in_order_and_honours_retry_after() {
    let Some(store) = CliStore::postgres("retry_after") else {
        return;
    };
    forwards_every_effect(&store);
}

fn forwards_every_effect(store: &CliStore) {
    // card-7 v12 is refused once with 503 and Retry-After: 1.
    let sink = Sink::start(Box::new(|object, version, before| {
        if (object, version, before) == ("card-7", 12, 0) {
            (503, Some("1".to_owned()))
        } else {
            (204, None)
        }
    }));
    let server = Server::start(&store.with(&[
        "--initial",
        &fixture(),
        "--forward",
        &sink.url,
        "--forward-secret",
        NEW_SECRET,
        "--forward-schedule",
        "0,0",
    ]));
    assert!(
        server
            .banner
            .ends_with(&format!("; forwarding: {} as relay forward\n", sink.url)),
        "{}",
        server.banner
    );
    post_ok(&server, "e-11", "card-7", 11);
    post_ok(&server, "e-12", "card-7", 12);
    post_ok(&server, "e-13", "card-7", 13);
    post_ok(&server, "e-4", "card-8", 4);
    // A redelivery replaces nothing: no effect.
    post_ok(&server, "e-11", "card-7", 11);
    let accepted = sink.wait_accepted(4);
    // The relay's counters on /metrics, each in the guide's table.
    let deadline = Instant::now() + Duration::from_secs(30);
    let metrics = loop {
        let text = server.get("/metrics").body;
        if text.contains("snapshot_receiver_relay_deliveries_total{relay=\"forward\"} 4") {
            break text;
        }
        assert!(Instant::now() < deadline, "{text}");
        std::thread::sleep(Duration::from_millis(20));
    };
    for expected in [
        "snapshot_receiver_relay_attempts_total{relay=\"forward\"} 5",
        "snapshot_receiver_relay_refusals_total{relay=\"forward\"} 1",
        "snapshot_receiver_relay_in_flight{relay=\"forward\"} 0",
    ] {
        assert!(metrics.contains(expected), "{expected}: {metrics}");
    }
    let table = crate::doc_commands::metrics_table();
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("snapshot_receiver_relay_"))
    {
        let series = line.split_whitespace().next().unwrap();
        assert_eq!(crate::doc_commands::undocumented(&table, series), None);
    }
    let (status, rest) = server.stop();
    assert!(status.success(), "{status:?}");
    assert!(rest.ends_with("stopped\n"), "{rest}");
    let got = sink.got();
    assert_eq!(got.len(), 5, "four effects and one re-send: {got:?}");
    assert!(
        got.iter().all(|g| g.signed),
        "every request signed: {got:?}"
    );
    let host = sink.url["http://".len()..].strip_suffix("/hook").unwrap();
    for g in &got {
        // Standard Webhooks timestamps are whole seconds since the epoch:
        // a verifier compares them with its own clock (and the signature
        // above checked with the value as sent).
        let sent: u64 = g.timestamp.parse().unwrap_or_else(|e| panic!("{g:?}: {e}"));
        assert!(
            sent.abs_diff(g.received) <= 5,
            "webhook-timestamp {sent} is not within 5 s of {} (seconds)",
            g.received
        );
        // An origin-form request names its host in `Host` (RFC 9112 §3.2).
        assert_eq!(g.host.as_deref(), Some(host), "{g:?}");
    }
    // webhook-id is the effect id, stable over the re-send.
    for g in &got {
        assert_eq!(g.body["effect_id"].as_str(), Some(g.id.as_str()));
        assert!(g.id.starts_with("ef_"), "{}", g.id);
    }
    let by = versions(&accepted);
    assert_eq!(by["card-7"], [11, 12, 13]);
    assert_eq!(by["card-8"], [4]);
    let positions: Vec<u64> = accepted
        .iter()
        .map(|g| g.body["position"].as_u64().unwrap())
        .collect();
    let mut sorted = positions.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, [1, 2, 3, 4]);
    let v12: Vec<&Got> = got
        .iter()
        .filter(|g| g.body["version"] == 12 && g.body["object_id"] == "card-7")
        .collect();
    assert_eq!(v12.iter().map(|g| g.status).collect::<Vec<_>>(), [503, 204]);
    assert_eq!(v12[0].id, v12[1].id);
    assert!(
        v12[1].at.duration_since(v12[0].at) >= Duration::from_millis(900),
        "Retry-After: 1 honoured over a schedule of 0 s"
    );
    let mut keys: Vec<&String> = accepted[0].body.as_object().unwrap().keys().collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "at",
            "cause",
            "effect_id",
            "object_id",
            "position",
            "state",
            "version"
        ]
    );
    assert_eq!(accepted[0].body["state"], serde_json::json!({"stage": "x"}));
}

/// Runs the `relay` command on `store` to `sink` (with `extra`
/// arguments) until `wait` returns, then stops it with SIGTERM (it must
/// exit 0). Returns its first line of stdout, the rest, and its stderr.
fn relay_command(
    store: &CliStore,
    sink: &Sink,
    extra: &[&str],
    wait: impl FnOnce(&Sink),
) -> (String, String, String) {
    let mut child = cli()
        .arg("relay")
        .args(store.with(&["--forward", &sink.url]))
        .args(["--forward-secret", NEW_SECRET])
        .args(extra)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    wait(sink);
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    assert!(child.wait().unwrap().success());
    let (mut rest, mut stderr) = (String::new(), String::new());
    stdout.read_to_string(&mut rest).unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (first, rest, stderr)
}

/// [`relay_command`] until `sink` accepted `until` requests: its first
/// line of stdout and the rest.
fn run_relay(store: &CliStore, sink: &Sink, until: usize) -> (String, String) {
    let (first, rest, _) = relay_command(store, sink, &[], |sink| {
        sink.wait_accepted(until);
    });
    (first, rest)
}

/// A SQLite store (in the scratch folder `name`) where `serve` recorded
/// `events` (event, object, version), each applied.
fn recorded_store(name: &str, events: &[(&str, &str, u64)]) -> CliStore {
    recorded(CliStore::sqlite(name), events)
}

/// `store`, where `serve` recorded `events` (event, object, version), each
/// applied.
fn recorded(store: CliStore, events: &[(&str, &str, u64)]) -> CliStore {
    let server = Server::start(&store.with(&["--initial", &fixture()]));
    for (event, object, version) in events {
        post_ok(&server, event, object, *version);
    }
    assert!(server.stop().0.success());
    store
}

/// An effect refused with its schedule exhausted is said on stderr at the
/// default log level (a warning naming the relay, the effect and the
/// answer), not only in `relays`.
#[test]
fn the_relay_command_warns_of_an_effect_parked_failed() {
    warns_of_a_failed_effect(CliStore::sqlite("relay-command-refused"));
}

#[test]
fn on_postgres_the_relay_command_warns_of_an_effect_parked_failed() {
    let Some(store) = CliStore::postgres("warns") else {
        return;
    };
    warns_of_a_failed_effect(store);
}

fn warns_of_a_failed_effect(store: CliStore) {
    let sink = Sink::start(Box::new(|_, _, _| (500, None)));
    let store = recorded(store, &[("e-11", "card-7", 11)]);
    let (_, _, stderr) = relay_command(&store, &sink, &["--forward-schedule", ""], |sink| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while sink.got().is_empty() {
            assert!(Instant::now() < deadline, "nothing reached the sink");
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    let warning = stderr
        .lines()
        .find(|l| l.contains("effect refused and its schedule exhausted"))
        .unwrap_or_else(|| panic!("no warning in {stderr:?}"));
    assert!(warning.contains("WARN"), "{warning}");
    assert!(warning.contains("relay=forward"), "{warning}");
    assert!(warning.contains("object_id=card-7"), "{warning}");
    assert!(
        warning.contains("error=\"HTTP 500 Internal Server Error\""),
        "{warning}"
    );
}

#[test]
fn the_relay_command_forwards_what_a_store_recorded_and_resumes_at_its_cursor() {
    let sink = Sink::start(Box::new(|_, _, _| (200, None)));
    let store = recorded_store(
        "relay-command",
        &[("e-11", "card-7", 11), ("e-12", "card-7", 12)],
    );
    let (first, last) = run_relay(&store, &sink, 2);
    assert_eq!(
        first,
        format!("relaying effects to {} as relay forward\n", sink.url)
    );
    assert_eq!(
        last,
        "stopped at position 2 (2 delivered, 0 parked, 0 failed)\n"
    );
    // One more effect; the relay resumes after the two it forwarded.
    let server = Server::start(&store.with(&["--initial", &fixture()]));
    post_ok(&server, "e-13", "card-7", 13);
    assert!(server.stop().0.success());
    let (_, last) = run_relay(&store, &sink, 3);
    assert_eq!(
        last,
        "stopped at position 3 (1 delivered, 0 parked, 0 failed)\n"
    );
    assert_eq!(versions(&sink.accepted())["card-7"], [11, 12, 13]);
    assert_eq!(sink.got().len(), 3, "nothing sent twice");
}

#[test]
fn forwarding_options_are_checked_by_name() {
    let cases: [(&[&str], &str); 12] = [
        (
            &["serve", "--store", "memory", "--forward", "http://user:PASSWORD@127.0.0.1:9/hook", "--forward-secret", NEW_SECRET],
            "--forward \"http://user:***@127.0.0.1:9/hook\": a user name or password in the URL would travel in clear text",
        ),
        (
            &["serve", "--store", "memory", "--webhook-secret", OLD_SECRET, "--webhook-secret", NEW_SECRET, "--forward", "http://127.0.0.1:9/hook", "--forward-secret", NEW_SECRET],
            "--forward-secret is one of the webhook secrets (--webhook-secret or SNAPSHOT_RECEIVER_WEBHOOK_SECRET): effects are signed with a secret of their own",
        ),
        (
            &["serve", "--store", "memory", "--forward", "https://example.test/hook", "--forward-secret", NEW_SECRET],
            "--forward \"https://example.test/hook\": only http:// is spoken; put a TLS-terminating proxy on loopback for https",
        ),
        (
            &["serve", "--store", "memory", "--forward", "http://127.0.0.1:9/hook"],
            "--forward needs a signing secret: --forward-secret whsec_... or SNAPSHOT_RECEIVER_FORWARD_SECRET",
        ),
        (
            &["serve", "--store", "memory", "--forward", "http://127.0.0.1:9/hook", "--forward-secret", NEW_SECRET, "--forward-schedule", "5,5m"],
            "--forward-schedule \"5,5m\": entry 2 (\"5m\") is not whole seconds",
        ),
        (
            &["relay", "--store", "memory", "--forward", "http://127.0.0.1:9/hook", "--forward-secret", NEW_SECRET],
            "--store memory: a relay reads a durable store (sqlite:PATH or postgres://...); to forward from memory, use serve --forward",
        ),
        (
            &["serve", "--store", "memory", "--forward-nats", "nats://127.0.0.1:9", "--forward-subject", "fx.>"],
            "--forward-subject \"fx.>\": not a subject prefix (no spaces, wildcards or trailing dot)",
        ),
        (
            &["relay", "--store", "sqlite:x.db"],
            "relay needs a destination: --forward URL (or --forward-nats URL)",
        ),
        (
            &["serve", "--store", "memory", "--forward", "http://127.0.0.1:9/hook", "--forward-secret", NEW_SECRET, "--forward-lease", "0"],
            "invalid value '0' for '--forward-lease <SECONDS>': 0 is not in 1..",
        ),
        (
            &["serve", "--store", "memory", "--forward", "http://127.0.0.1:9/hook", "--forward-secret", NEW_SECRET, "--forward-relay", ""],
            "--forward-relay \"\": must be 1 to 200 characters",
        ),
        (
            &["serve", "--store", "memory", "--forward", "http://127.0.0.1:99999/hook", "--forward-secret", NEW_SECRET],
            "--forward \"http://127.0.0.1:99999/hook\": the port is not a number from 1 to 65535",
        ),
        (
            &["serve", "--store", "memory", "--forward", "http://127.0.0.1:9/hook", "--forward-secret", NEW_SECRET, "--forward-schedule", "5,90000"],
            "--forward-schedule \"5,90000\": entry 2 (\"90000\") is above 86400 s (24 h), the longest wait",
        ),
    ];
    for (args, message) in cases {
        let output = within_seconds(
            30,
            cli()
                .args(args)
                .env_remove("SNAPSHOT_RECEIVER_FORWARD_SECRET"),
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
        assert!(!stderr.contains("PASSWORD"), "{args:?}: {stderr}");
    }
}

/// A store location refused while the arguments are read is quoted with
/// its password hidden, in the parser's words and the library's alike
/// (the value's secrets are hidden wherever the error quotes them).
#[test]
fn a_refused_store_location_is_quoted_without_its_password() {
    let output = within_seconds(
        30,
        cli().args(["inspect", "--store", "mysql://u:PASSWORD@h/db"]),
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with(
            "error: invalid value 'mysql://u:***@h/db' for '--store <LOCATION>': unsupported \
             scheme `mysql` in \"mysql://u:***@h/db\""
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("PASSWORD"), "{stderr}");
}

/// `sign --post` to a URL with a password names it, when it cannot
/// connect, with the password hidden.
#[test]
fn sign_post_names_its_url_without_the_password() {
    // Port 1 on loopback: nothing listens there.
    let url = "http://u:PASSWORD@127.0.0.1:1/events";
    let output = within_seconds(
        30,
        cli().args([
            "sign", "--data", "{}", "--secret", NEW_SECRET, "--post", url,
        ]),
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with(
            "error: --post http://u:***@127.0.0.1:1/events: cannot connect to 127.0.0.1:1"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("PASSWORD"), "{stderr}");
}

/// `url` with the password `PASSWORD` in its userinfo (its user, or
/// `user`).
fn with_password(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let authority = rest.split('/').next().unwrap();
    match authority.split_once('@') {
        Some((user, _)) => format!(
            "{scheme}://{}:PASSWORD@{}",
            user.split(':').next().unwrap(),
            &rest[user.len() + 1..]
        ),
        None => format!("{scheme}://user:PASSWORD@{rest}"),
    }
}

/// A token in the destination's query is not printed: the banner and the
/// `relay` command's first line write it `***`.
#[test]
fn a_token_in_the_forwarding_url_is_not_printed() {
    let url = "http://127.0.0.1:9/hook?from=rx&token=T0KEN";
    let server = Server::start(&[
        "--store",
        "memory",
        "--forward",
        url,
        "--forward-secret",
        NEW_SECRET,
    ]);
    assert!(
        server.banner.ends_with(
            "; forwarding: http://127.0.0.1:9/hook?from=rx&token=*** as relay forward\n"
        ),
        "{}",
        server.banner
    );
    assert!(server.stop().0.success());
    let store = recorded_store("relay-command-token", &[]);
    let mut child = cli()
        .arg("relay")
        .args(store.with(&["--forward", url]))
        .args(["--forward-secret", NEW_SECRET])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(
        first,
        "relaying effects to http://127.0.0.1:9/hook?from=rx&token=*** as relay forward\n"
    );
}

/// A PostgreSQL store and a NATS server given with passwords: `serve`'s
/// banner and everything it prints and logs name them with the password
/// hidden (`user:***@`).
#[test]
fn serve_prints_store_and_forwarding_urls_without_their_passwords() {
    let Some(pg) = crate::durability::pg_url() else {
        return;
    };
    let Some(nats) = crate::jetstream::nats_url() else {
        return;
    };
    let (pg, nats) = (with_password(&pg), with_password(&nats));
    let schema = format!("sr_forward_redact_{}", std::process::id());
    crate::durability::drop_schema(&pg, &schema);
    let mut command = Server::command(
        &[
            "--store",
            &pg,
            "--store-schema",
            &schema,
            "--forward-nats",
            &nats,
            // The largest body whose effect fits NATS's default max_payload.
            "--max-body-bytes",
            "1047712",
        ],
        &[],
    );
    let mut child = command
        .env_remove("RUST_LOG")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let server = Server::attach(child);
    let hidden = |url: &str| url.replace(":PASSWORD@", ":***@");
    assert!(
        server
            .banner
            .starts_with(&format!("store: {}; ", hidden(&pg))),
        "{}",
        server.banner
    );
    assert!(
        server.banner.ends_with(&format!(
            "; forwarding: {} (JetStream, subjects effects.<object>) as relay forward\n",
            hidden(&nats)
        )),
        "{}",
        server.banner
    );
    let (status, rest) = server.stop();
    assert!(status.success(), "{status:?}");
    let mut log = String::new();
    stderr.read_to_string(&mut log).unwrap();
    crate::durability::drop_schema(&pg, &schema);
    assert!(!rest.contains("PASSWORD"), "{rest}");
    assert!(!log.contains("PASSWORD"), "{log}");
}

/// `relays` on `store` with `args`: exit code, stdout and stderr.
pub(crate) fn relays_at(store: &CliStore, args: &[&str]) -> (Option<i32>, String, String) {
    let output = within_seconds(30, cli().arg("relays").args(store.with(args)));
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// `relays --store ...` with `args`: exit code, stdout and stderr.
pub(crate) fn relays(store: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let output = within_seconds(30, cli().args(["relays", "--store", store]).args(args));
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn an_operator_sees_a_failed_effect_retries_it_and_rewinds_the_relay() {
    operator_retries_and_rewinds(&CliStore::sqlite("relays-command"));
}

#[test]
fn on_postgres_an_operator_sees_a_failed_effect_retries_it_and_rewinds_the_relay() {
    let Some(store) = CliStore::postgres("operator") else {
        return;
    };
    operator_retries_and_rewinds(&store);
}

/// Changes an operator may ask of relay `forward` with card-8 v4 failed at
/// position 2 and v5 waiting at 3 (the last position), which the `relays`
/// command and `POST /relays` refuse alike, by one rule
/// (`store::change_relay`): the change, the relay, the position, the HTTP
/// status and the error both give.
const REFUSED_CHANGES: [(&str, &str, Option<u64>, u16, &str); 5] = [
    (
        "skip",
        "forward",
        Some(9),
        404,
        "relay \"forward\" has no parked effect at position 9",
    ),
    (
        "retry",
        "forward",
        Some(3),
        404,
        "relay \"forward\" has no failed effect at position 3",
    ),
    (
        "retry",
        "nobody",
        None,
        404,
        "no relay named \"nobody\" in this store",
    ),
    (
        "skip",
        "nobody",
        Some(2),
        404,
        "no relay named \"nobody\" in this store",
    ),
    (
        "rewind",
        "forward",
        Some(99),
        400,
        "position 99 is past the last outbox position 3",
    ),
];

fn operator_retries_and_rewinds(store: &CliStore) {
    // card-8 v4 is refused (500) until the destination is fixed.
    let fixed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sink = {
        let fixed = fixed.clone();
        Sink::start(Box::new(move |object, version, _| {
            if (object, version) == ("card-8", 4)
                && !fixed.load(std::sync::atomic::Ordering::SeqCst)
            {
                (500, None)
            } else {
                (200, None)
            }
        }))
    };
    // No retries: the first refusal parks it failed.
    let server = Server::start(&store.with(&[
        "--initial",
        &fixture(),
        "--forward",
        &sink.url,
        "--forward-secret",
        NEW_SECRET,
        "--forward-schedule",
        "",
    ]));
    post_ok(&server, "e-11", "card-7", 11);
    post_ok(&server, "e-4", "card-8", 4);
    post_ok(&server, "e-5", "card-8", 5);
    // Until the relay's saved cursor passed all three (v5 parked behind
    // v4 sends nothing), as its gauge on /metrics says.
    relay_forward_at(&server, 3, 1);
    assert!(server.stop().0.success());
    let failed_id = sink
        .got()
        .iter()
        .find(|g| g.body["version"] == 4)
        .map(|g| g.id.clone())
        .unwrap();
    let (code, out, err) = relays_at(store, &[]);
    assert_eq!(code, Some(0), "{err}");
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("last outbox position: 3"));
    assert_eq!(
        lines.next(),
        Some("relay forward: position 3, 0 after it, 2 parked (1 failed): 2 not delivered, not running")
    );
    assert_eq!(
        lines.next(),
        Some(
            format!(
                "  failed 2 card-8 v4 ({failed_id}, 1 attempt(s)): HTTP 500 Internal Server Error"
            )
            .as_str()
        )
    );
    let waiting = lines.next().unwrap();
    assert!(waiting.starts_with("  waiting 3 card-8 v5 (ef_"), "{out}");
    assert!(waiting.ends_with(", 0 attempt(s))"), "{out}");
    assert_eq!(lines.next(), None);
    // Refused by name, in the words `POST /relays` uses.
    for (change, relay, position, _, error) in REFUSED_CHANGES {
        let mut args = vec![format!("--{change}"), relay.to_owned()];
        if let Some(p) = position {
            args.extend(["--position".to_owned(), p.to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, out, err) = relays_at(store, &args);
        assert_eq!(code, Some(2), "{args:?}: {out}");
        assert_eq!(
            err.lines().last(),
            Some(format!("error: {error}").as_str()),
            "{args:?}"
        );
    }
    let (code, _, err) = relays_at(store, &["--position", "2"]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains(
            "--position 2: says where --retry, --skip or --rewind applies; give one of them"
        ),
        "{err}"
    );
    // The destination is fixed; the operator retries; a relay delivers
    // card-8 v4 then v5.
    fixed.store(true, std::sync::atomic::Ordering::SeqCst);
    let (code, out, _) = relays_at(store, &["--retry", "forward"]);
    assert_eq!(code, Some(0));
    assert!(
        out.starts_with("forward: 1 failed effect(s) to be retried now\n"),
        "{out}"
    );
    let (_, last) = run_relay(store, &sink, 3);
    assert_eq!(
        last,
        "stopped at position 3 (2 delivered, 0 parked, 0 failed)\n"
    );
    assert_eq!(versions(&sink.accepted())["card-8"], [4, 5]);
    // Rewound to 1: card-8's two effects again, with their same ids.
    let (code, out, _) = relays_at(
        store,
        &["--rewind", "forward", "--position", "1", "--format", "json"],
    );
    assert_eq!(code, Some(0));
    let json: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(json["changed"], "forward: rewound to position 1");
    assert_eq!(json["relays"][0]["position"], 1);
    assert_eq!(json["relays"][0]["lag"], 2);
    assert_eq!(json["relays"][0]["undelivered"], 2);
    let (_, last) = run_relay(store, &sink, 5);
    assert_eq!(
        last,
        "stopped at position 3 (2 delivered, 0 parked, 0 failed)\n"
    );
    let accepted = sink.accepted();
    assert_eq!(accepted[3].id, accepted[1].id);
    assert_eq!(accepted[4].id, accepted[2].id);
}

#[test]
fn serve_forwards_to_jetstream_with_the_effect_id_as_message_id() {
    let Some(nats) = crate::jetstream::nats_url() else {
        return;
    };
    let prefix = format!("fx{}", std::process::id());
    let stream = format!("SR_forward_{}", std::process::id());
    let runtime = crate::common::runtime();
    let js = runtime.block_on(async {
        let js = async_nats::jetstream::new(async_nats::connect(&nats).await.unwrap());
        let _ = js.delete_stream(&stream).await;
        js.create_stream(async_nats::jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{prefix}.>")],
            ..Default::default()
        })
        .await
        .unwrap();
        js
    });
    let dir = scratch("forward-nats");
    let store = format!("sqlite:{}", dir.join("rx.db").display());
    let server = Server::start(&[
        "--store",
        &store,
        "--initial",
        &fixture(),
        "--forward-nats",
        &nats,
        "--forward-subject",
        &prefix,
        // The largest body limit whose effects fit the server's default
        // max_payload (a 1 MiB limit is refused: tests/jetstream.rs).
        "--max-body-bytes",
        "1047712",
    ]);
    assert!(
        server.banner.ends_with(&format!(
            "; forwarding: {nats} (JetStream, subjects {prefix}.<object>) as relay forward\n"
        )),
        "{}",
        server.banner
    );
    post_ok(&server, "e-11", "card-7", 11);
    post_ok(&server, "e-12", "card-7", 12);
    post_ok(&server, "e-4", "card-8", 4);
    let messages = runtime.block_on(async {
        let mut s = js.get_stream(&stream).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while s.info().await.unwrap().state.messages < 3 {
            assert!(
                Instant::now() < deadline,
                "{:?}",
                s.info().await.unwrap().state
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut messages = Vec::new();
        for seq in 1..=3 {
            let m = s.get_raw_message(seq).await.unwrap();
            let id = m
                .headers
                .get(async_nats::header::NATS_MESSAGE_ID)
                .map(|v| v.as_str().to_owned())
                .unwrap();
            let body: Value = serde_json::from_slice(&m.payload).unwrap();
            messages.push((m.subject.to_string(), id, body));
        }
        messages
    });
    assert!(server.stop().0.success());
    // Per object in version order, each on its object's subject, its
    // message id the effect id.
    let mut by: HashMap<String, Vec<u64>> = HashMap::new();
    for (subject, id, body) in &messages {
        assert_eq!(body["effect_id"].as_str(), Some(id.as_str()));
        let object = body["object_id"].as_str().unwrap();
        assert_eq!(*subject, format!("{prefix}.{object}"));
        by.entry(object.to_owned())
            .or_default()
            .push(body["version"].as_u64().unwrap());
    }
    assert_eq!(by["card-7"], [11, 12]);
    assert_eq!(by["card-8"], [4]);
    // A re-send (same message id) inside the stream's duplicate window is
    // dropped by the broker.
    runtime.block_on(async {
        let (subject, id, body) = &messages[0];
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
        let ack = js
            .publish_with_headers(
                subject.clone(),
                headers,
                serde_json::to_vec(body).unwrap().into(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(ack.duplicate);
        let mut s = js.get_stream(&stream).await.unwrap();
        assert_eq!(s.info().await.unwrap().state.messages, 3);
        js.delete_stream(&stream).await.unwrap();
    });
}

#[test]
fn an_attempt_without_an_answer_is_cut_at_the_timeout_and_retried() {
    cut_at_the_timeout(&CliStore::sqlite("forward-timeout"));
}

#[test]
fn on_postgres_an_attempt_without_an_answer_is_cut_at_the_timeout_and_retried() {
    let Some(store) = CliStore::postgres("timeout") else {
        return;
    };
    cut_at_the_timeout(&store);
}

fn cut_at_the_timeout(store: &CliStore) {
    // card-7 v11's first attempt is never answered (status 0: the sink
    // holds the request open); without the per-attempt timeout the relay
    // would wait on it forever.
    let sink = Sink::start(Box::new(|object, version, before| {
        if (object, version, before) == ("card-7", 11, 0) {
            (0, None)
        } else {
            (204, None)
        }
    }));
    let server = Server::start(&store.with(&[
        "--initial",
        &fixture(),
        "--forward",
        &sink.url,
        "--forward-secret",
        NEW_SECRET,
        "--forward-schedule",
        "0",
        "--forward-timeout",
        "1",
    ]));
    post_ok(&server, "e-11", "card-7", 11);
    let accepted = sink.wait_accepted(1);
    assert!(server.stop().0.success());
    let got = sink.got();
    assert_eq!(
        got.iter()
            .map(|g| (g.status, g.id.as_str()))
            .collect::<Vec<_>>(),
        [(0, accepted[0].id.as_str()), (204, accepted[0].id.as_str())],
        "the same effect again after the cut attempt"
    );
}

/// An operator request to `serve` with the token `tok`.
fn operator(server: &Server, method: &str, path: &str) -> crate::serve::Reply {
    server.request(
        method,
        path,
        &[("authorization", "Bearer tok".to_owned())],
        b"",
    )
}

/// `serve` on a new SQLite store in the scratch directory `name`, with the
/// fixture's objects, forwarding to `url` under [`NEW_SECRET`] with the
/// `extra` options, its operator token `tok`.
fn serve_forwarding(name: &str, url: &str, extra: &[&str]) -> Server {
    let dir = scratch(name);
    let store = format!("sqlite:{}", dir.join("rx.db").display());
    let fixture = fixture();
    let mut args = vec![
        "--store",
        &store,
        "--initial",
        &fixture,
        "--forward",
        url,
        "--forward-secret",
        NEW_SECRET,
        "--operator-token",
        "tok",
    ];
    args.extend_from_slice(extra);
    Server::start(&args)
}

/// Polls `GET /relays` until relay `forward` is at `position` with
/// `parked` parked effects; its JSON then.
fn relay_at(server: &Server, position: u64, parked: usize) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let reply = operator(server, "GET", "/relays");
        assert_eq!(reply.status, 200, "{}", reply.body);
        let json = reply.json();
        let relay = json["relays"][0].clone();
        if relay["position"] == position && relay["parked"].as_array().map(Vec::len) == Some(parked)
        {
            return relay;
        }
        assert!(Instant::now() < deadline, "{json}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Issue 36 item 5: the relays on the status page, `GET /relays` and
/// `inspect`; the operator's retry, skip and rewind over HTTP, behind the
/// operator token, refused by name when they name nothing.
#[test]
fn an_operator_sees_relays_on_the_page_and_retries_skips_and_rewinds_over_http() {
    operator_over_http(&CliStore::sqlite("relays-http"));
}

#[test]
fn on_postgres_an_operator_sees_relays_on_the_page_and_retries_skips_and_rewinds_over_http() {
    let Some(store) = CliStore::postgres("http") else {
        return;
    };
    operator_over_http(&store);
}

fn operator_over_http(store: &CliStore) {
    let fixed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sink = {
        let fixed = fixed.clone();
        Sink::start(Box::new(move |object, version, _| {
            if (object, version) == ("card-8", 4)
                && !fixed.load(std::sync::atomic::Ordering::SeqCst)
            {
                (500, None)
            } else {
                (200, None)
            }
        }))
    };
    let server = Server::start(&store.with(&[
        "--initial",
        &fixture(),
        "--forward",
        &sink.url,
        "--forward-secret",
        NEW_SECRET,
        "--forward-schedule",
        "",
        "--operator-token",
        "tok",
    ]));
    post_ok(&server, "e-11", "card-7", 11);
    post_ok(&server, "e-4", "card-8", 4);
    post_ok(&server, "e-5", "card-8", 5);
    let relay = relay_at(&server, 3, 2);
    assert_eq!(relay["name"], "forward");
    assert_eq!(relay["lag"], 0);
    assert_eq!(relay["undelivered"], 2, "the two parked: {relay}");
    assert_eq!(relay["failed"], 1);
    assert_eq!(relay["missed"], 0);
    assert_eq!(relay["running"], true);
    assert_eq!(relay["behind_window"], false);
    assert_eq!(relay["parked"][0]["status"], "failed");
    assert_eq!(relay["parked"][0]["position"], 2);
    assert_eq!(relay["parked"][1]["status"], "waiting");
    let failed_id = relay["parked"][0]["effect_id"].as_str().unwrap().to_owned();
    assert_eq!(
        sink.got()
            .iter()
            .find(|g| g.body["version"] == 4)
            .unwrap()
            .id,
        failed_id
    );
    // The page: the relay's row and its failed effect.
    let page = operator(&server, "GET", "/").body;
    assert!(
        page.contains(
            "<tr id=\"relay-forward\"><td class=\"name\">forward</td>\
             <td class=\"n position\">3</td><td class=\"n lag\">0</td>\
             <td class=\"n parked\">2</td><td class=\"n failed\">1</td>\
             <td class=\"n undelivered\">2</td><td class=\"n missed\">0</td>"
        ),
        "{page}"
    );
    assert!(
        page.contains(&format!(
            "<tr class=\"failed-effect\"><td class=\"relay\">forward</td>\
             <td class=\"n position\">2</td><td class=\"effect\">{failed_id}</td>\
             <td class=\"object\">card-8</td><td class=\"n\">4</td><td class=\"n\">1</td>\
             <td class=\"error\">HTTP 500 Internal Server Error</td></tr>"
        )),
        "{page}"
    );
    // Without the token: 401, nothing changed.
    let reply = server.request("POST", "/relays/forward/retry", &[], b"");
    assert_eq!(reply.status, 401, "{}", reply.body);
    let reply = server.request("GET", "/relays", &[], b"");
    assert_eq!(reply.status, 401, "{}", reply.body);
    // Refused by name.
    let reply = operator(&server, "POST", "/relays/forward/skip");
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert_eq!(
        reply.json()["error"],
        "this change needs ?position=P (an outbox position)"
    );
    // The changes the `relays` command refuses, refused alike.
    for (change, relay, position, status, error) in REFUSED_CHANGES {
        let query = position.map_or_else(String::new, |p| format!("?position={p}"));
        let path = format!("/relays/{relay}/{change}{query}");
        let reply = operator(&server, "POST", &path);
        assert_eq!(reply.status, status, "{path}: {}", reply.body);
        assert_eq!(reply.json()["error"], error, "{path}");
    }
    let reply = operator(&server, "POST", "/relays/forward/rewind?position=x");
    assert_eq!(reply.status, 400, "{}", reply.body);
    assert!(
        reply.json()["error"]
            .as_str()
            .unwrap()
            .starts_with("bad query: "),
        "{}",
        reply.body
    );
    assert_eq!(relay_at(&server, 3, 2)["failed"], 1);
    // The destination is fixed; the operator retries: v4 then v5.
    fixed.store(true, std::sync::atomic::Ordering::SeqCst);
    let reply = operator(&server, "POST", "/relays/forward/retry");
    assert_eq!(reply.status, 200, "{}", reply.body);
    let json = reply.json();
    assert_eq!(
        json["changed"],
        "forward: 1 failed effect(s) to be retried now"
    );
    assert_eq!(json["relay"]["failed"], 0);
    relay_at(&server, 3, 0);
    assert_eq!(versions(&sink.wait_accepted(3))["card-8"], [4, 5]);
    // Rewound to 1: card-8's two effects again, with their same ids.
    let reply = operator(&server, "POST", "/relays/forward/rewind?position=1");
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.json()["changed"], "forward: rewound to position 1");
    let accepted = sink.wait_accepted(5);
    assert_eq!(accepted[3].id, accepted[1].id);
    assert_eq!(accepted[4].id, accepted[2].id);
    relay_at(&server, 3, 0);
    assert!(server.stop().0.success());
    // inspect shows the relay, stopped.
    let output = within_seconds(30, cli().arg("inspect").args(store.with(&[])));
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(
        out.ends_with(
            "\n== relays (last outbox position 3) ==\n\
             relay forward: position 3, 0 after it, 0 parked (0 failed): 0 not delivered, not running\n"
        ),
        "{out}"
    );
    let output = within_seconds(
        30,
        cli().arg("inspect").args(store.with(&["--format", "json"])),
    );
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["relays"]["last_position"], 3);
    assert_eq!(json["relays"]["history_window_seconds"], 604_800);
    assert_eq!(json["relays"]["relays"][0]["name"], "forward");
    assert_eq!(json["relays"]["relays"][0]["lag"], 0);
    assert_eq!(json["relays"]["relays"][0]["undelivered"], 0);
}

/// A relay with a failed effect older than the history window is reported
/// behind it by `inspect` and `relays` (the purge keeps the effect).
#[test]
fn inspect_and_relays_report_a_relay_behind_the_history_window() {
    behind_the_window(&CliStore::sqlite("relays-behind"));
}

#[test]
fn on_postgres_inspect_and_relays_report_a_relay_behind_the_history_window() {
    let Some(store) = CliStore::postgres("behind") else {
        return;
    };
    behind_the_window(&store);
}

fn behind_the_window(store: &CliStore) {
    let sink = Sink::start(Box::new(|object, _, _| {
        if object == "card-8" {
            (500, None)
        } else {
            (200, None)
        }
    }));
    let server = Server::start(&store.with(&[
        "--initial",
        &fixture(),
        "--forward",
        &sink.url,
        "--forward-secret",
        NEW_SECRET,
        "--forward-schedule",
        "",
    ]));
    post_ok(&server, "e-4", "card-8", 4);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !server
        .get("/metrics")
        .body
        .contains("snapshot_receiver_relay_failed{relay=\"forward\"} 1")
    {
        assert!(
            Instant::now() < deadline,
            "waited 60 s for card-8 v4 parked failed (relay_failed 1 on /metrics)"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(server.stop().0.success());
    // The effect was decided a moment ago: inside a window of a day,
    // behind a window of 0 s.
    let (code, out, err) = relays_at(store, &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!out.contains("behind the history window"), "{out}");
    let (code, out, err) = relays_at(store, &["--history-retention", "0"]);
    assert_eq!(code, Some(0), "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[1],
        "relay forward: position 1, 0 after it, 1 parked (1 failed): 1 not delivered, not running"
    );
    assert!(
        lines[2].starts_with("  behind the history window: its oldest pending effect (20"),
        "{out}"
    );
    assert!(
        lines[2].ends_with(
            ") is older than the window; the purge keeps it and what follows until the relay passes it"
        ),
        "{out}"
    );
    let output = within_seconds(
        30,
        cli()
            .arg("inspect")
            .args(store.with(&["--history-retention", "0", "--format", "json"])),
    );
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["relays"]["relays"][0]["behind_window"], true);
    assert_eq!(json["relays"]["history_window_seconds"], 0);
    let (code, _, err) = relays_at(store, &["--rewind", "forward", "--position", "7"]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("position 7 is past the last outbox position 1"),
        "{err}"
    );
}

/// In memory, `GET /relays` reads the process's relays (no history
/// window).
#[test]
fn get_relays_reads_an_in_memory_servers_relays() {
    let sink = Sink::start(Box::new(|_, _, _| (200, None)));
    let server = Server::start(&[
        "--store",
        "memory",
        "--initial",
        &fixture(),
        "--forward",
        &sink.url,
        "--forward-secret",
        NEW_SECRET,
    ]);
    post_ok(&server, "e-11", "card-7", 11);
    sink.wait_accepted(1);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let json = server.get("/relays").json();
        if json["relays"][0]["position"] == 1 {
            assert_eq!(json["last_position"], 1);
            assert_eq!(json["history_window_seconds"], Value::Null);
            assert_eq!(json["relays"][0]["name"], "forward");
            assert_eq!(json["relays"][0]["lag"], 0);
            break;
        }
        assert!(Instant::now() < deadline, "{json}");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(server.stop().0.success());
}

/// Waits (60 s at most) until `serve`'s relay `forward` has saved its
/// cursor at `position` with `failed` effects parked failed, as its gauges
/// on `/metrics` say.
fn relay_forward_at(server: &Server, position: u64, failed: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let metrics = server.get("/metrics").body;
        let at = format!("snapshot_receiver_relay_position{{relay=\"forward\"}} {position}\n");
        let parked = format!("snapshot_receiver_relay_failed{{relay=\"forward\"}} {failed}\n");
        if metrics.contains(&at) && metrics.contains(&parked) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "waited 60 s for the relay at position {position} with {failed} failed: {metrics}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Records in `store` (a store location) objects `obj-0` .. `obj-{objects-1}`
/// at version 0, then versions 1 to `versions` of each, every one
/// `applied` (the bodies' events occurred at T: the receiver's clock is
/// there).
fn applied_versions(store: &str, objects: u64, versions: u64) {
    crate::common::runtime().block_on(async {
        let clock = Arc::new(snapshot_receiver::ManualClock::new(crate::common::t()));
        let mut builder = snapshot_receiver::Receiver::builder()
            .clock(clock as Arc<dyn snapshot_receiver::Clock>)
            .store(store);
        for o in 0..objects {
            builder = builder.object(&format!("obj-{o}"), 0, r#"{"v":0}"#);
        }
        let rx = builder.build().unwrap();
        for v in 1..=versions {
            for o in 0..objects {
                let (_, b) = crate::common::versioned(o, v);
                let receipt = rx.deliver(b.as_bytes()).await;
                assert_eq!(
                    receipt.decision(),
                    Some(snapshot_receiver::Decision::Applied)
                );
            }
        }
        rx.shutdown().await;
    });
}

/// A long catch-up is logged: the `relay` command started on 1,100
/// effects says it is catching up, then that it caught up.
#[test]
fn the_relay_command_logs_a_long_catch_up() {
    let dir = scratch("relay-catch-up");
    let path = dir.join("rx.db");
    let store = format!("sqlite:{}", path.display());
    applied_versions(&store, 11, 100);
    let sink = Sink::start(Box::new(|_, _, _| (200, None)));
    let mut child = cli()
        .args([
            "relay",
            "-v",
            "--store",
            &store,
            "--forward",
            &sink.url,
            "--forward-secret",
            NEW_SECRET,
            "--forward-rate",
            "100000",
        ])
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    sink.wait_accepted(1100);
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let mut lines = stderr.lines();
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    for line in lines.by_ref() {
        let line = line.unwrap();
        if line.contains("relay catching up") || line.contains("relay caught up") {
            seen.push(line.clone());
        }
        if line.contains("relay caught up") || Instant::now() > deadline {
            break;
        }
    }
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    assert!(child.wait().unwrap().success());
    assert!(
        seen[0].contains("relay catching up: 1100 effects behind"),
        "{seen:?}"
    );
    assert!(
        seen.last().unwrap().contains("relay caught up: passed "),
        "{seen:?}"
    );
}

/// `--forward-coalesce`: the destination down while card-8 v4, v5 and v6
/// wait, it receives card-8 once when it is back: v6, its body's
/// `replaces` naming v4 and v5 (their effect ids, positions, versions).
#[test]
fn forward_coalesce_sends_the_newest_state_naming_what_it_replaces() {
    coalesce_newest(&CliStore::sqlite("forward-coalesce"));
}

#[test]
fn on_postgres_forward_coalesce_sends_the_newest_state_naming_what_it_replaces() {
    let Some(store) = CliStore::postgres("coalesce") else {
        return;
    };
    coalesce_newest(&store);
}

fn coalesce_newest(store: &CliStore) {
    let up = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sink = {
        let up = up.clone();
        Sink::start(Box::new(move |_, _, _| {
            if up.load(std::sync::atomic::Ordering::SeqCst) {
                (200, None)
            } else {
                (503, None)
            }
        }))
    };
    let server = Server::start(&store.with(&[
        "--initial",
        &fixture(),
        "--forward",
        &sink.url,
        "--forward-secret",
        NEW_SECRET,
        "--forward-schedule",
        "1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1",
        "--forward-coalesce",
    ]));
    post_ok(&server, "e-4", "card-8", 4);
    post_ok(&server, "e-5", "card-8", 5);
    post_ok(&server, "e-6", "card-8", 6);
    // Down until a refused request carried v6 (all three waiting).
    let deadline = Instant::now() + Duration::from_secs(60);
    while !sink.got().iter().any(|g| g.body["version"] == 6) {
        assert!(Instant::now() < deadline, "{:?}", sink.got());
        std::thread::sleep(Duration::from_millis(10));
    }
    up.store(true, std::sync::atomic::Ordering::SeqCst);
    let accepted = sink.wait_accepted(1);
    assert!(server.stop().0.success());
    assert_eq!(accepted.len(), 1, "{accepted:?}");
    let body = &accepted[0].body;
    assert!(accepted[0].signed);
    assert_eq!(body["version"], 6);
    assert_eq!(body["position"], 3);
    assert_eq!(accepted[0].id, body["effect_id"].as_str().unwrap());
    let replaces = body["replaces"].as_array().unwrap();
    let versions: Vec<(u64, u64)> = replaces
        .iter()
        .map(|r| {
            (
                r["position"].as_u64().unwrap(),
                r["version"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(versions, [(1, 4), (2, 5)]);
    // Their ids are the ones v4 and v5 were refused with, if they were
    // sent alone before the relay read the next ones.
    for r in replaces {
        let id = r["effect_id"].as_str().unwrap();
        let sent = sink.got().into_iter().find(|g| g.id == id);
        assert!(
            sent.is_none_or(|g| g.body["version"] == r["version"]),
            "{id}"
        );
        // Made by the same run as v6: the same origin.
        let origin = |id: &str| id.rsplit_once('_').unwrap().0.to_owned();
        assert_eq!(origin(id), origin(&accepted[0].id));
    }
}

/// How [`RawSink`] answers a request.
#[derive(Clone, Copy, Debug)]
enum RawAnswer {
    /// `status` with an empty body (`Content-Length: 0`); with `close`,
    /// the sink closes the connection without having said so (no
    /// `Connection: close`), as the next request on it arrives, unread:
    /// the race a destination that closes after its answer leaves open (a
    /// request crossing the close), made certain.
    Empty { status: u16, close: bool },
    /// `status` with a body of `length` bytes (`None`: chunked, without
    /// end), "oops oops ...", written until done or refused.
    Long { status: u16, length: Option<u64> },
    /// `status` with a body of exactly `length` bytes, the connection
    /// kept for the next request.
    Sized { status: u16, length: usize },
}

/// One answer [`RawSink`] gave.
#[derive(Clone, Debug)]
struct RawGot {
    /// The `webhook-id` it answered.
    id: String,
    /// Bytes of the body the socket took (written to the kernel).
    sent: u64,
    /// Whether writing is over (done, or the connection refused more).
    over: bool,
    /// Which connection it came on: 0 for the first the sink accepted.
    connection: usize,
}

/// A destination on raw TCP, for answers axum would not give: a body
/// without end, a connection closed after an answer without saying so.
struct RawSink {
    /// `http://127.0.0.1:PORT/hook`.
    url: String,
    /// Every answer, in the order the requests came.
    got: Arc<Mutex<Vec<RawGot>>>,
    /// Stops the server when dropped.
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// What [`RawSink`] answers: by the effect's object and version.
type RawPolicy = dyn Fn(&str, u64) -> RawAnswer + Send + Sync;

impl RawSink {
    fn start(policy: Box<RawPolicy>) -> RawSink {
        let policy: Arc<RawPolicy> = policy.into();
        let got: Arc<Mutex<Vec<RawGot>>> = Arc::default();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (tx, rx) = std::sync::mpsc::channel();
        let record = got.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                tx.send(listener.local_addr().unwrap()).unwrap();
                let accept = async {
                    for connection in 0.. {
                        let (socket, _) = listener.accept().await.unwrap();
                        tokio::spawn(Self::serve(
                            socket,
                            connection,
                            policy.clone(),
                            record.clone(),
                        ));
                    }
                };
                tokio::select! {
                    () = accept => {}
                    _ = stopped => {}
                }
            });
        });
        let addr = rx.recv().unwrap();
        RawSink {
            url: format!("http://{addr}/hook"),
            got,
            _stop: stop,
        }
    }

    /// Answers the requests of one connection.
    async fn serve(
        mut socket: tokio::net::TcpStream,
        connection: usize,
        policy: Arc<RawPolicy>,
        got: Arc<Mutex<Vec<RawGot>>>,
    ) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut buffer = Vec::new();
        loop {
            // The head, then a body of Content-Length bytes.
            let head_end = loop {
                if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                    break at + 4;
                }
                let mut chunk = [0u8; 4096];
                match socket.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                }
            };
            let head = String::from_utf8_lossy(&buffer[..head_end]).to_lowercase();
            let header = |name: &str| {
                head.lines()
                    .find_map(|l| l.strip_prefix(&format!("{name}: ")).map(str::to_owned))
            };
            let length: usize = header("content-length").unwrap().trim().parse().unwrap();
            while buffer.len() < head_end + length {
                let mut chunk = [0u8; 4096];
                match socket.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                }
            }
            let body: Value = serde_json::from_slice(&buffer[head_end..head_end + length]).unwrap();
            buffer.drain(..head_end + length);
            let answer = policy(
                body["object_id"].as_str().unwrap(),
                body["version"].as_u64().unwrap(),
            );
            let index = {
                let mut got = got.lock().unwrap();
                got.push(RawGot {
                    id: header("webhook-id").unwrap().trim().to_owned(),
                    sent: 0,
                    over: false,
                    connection,
                });
                got.len() - 1
            };
            let over = |sent: u64| {
                let mut got = got.lock().unwrap();
                got[index].sent = sent;
                got[index].over = true;
            };
            match answer {
                RawAnswer::Empty { status, close } => {
                    let head = format!("HTTP/1.1 {status} Whatever\r\ncontent-length: 0\r\n\r\n");
                    let written = socket.write_all(head.as_bytes()).await;
                    over(0);
                    if written.is_err() {
                        return;
                    }
                    if close {
                        // Until the next request's first bytes (or the
                        // client's close), then closed with them unread.
                        let mut first = [0u8; 1];
                        let _ = socket.peek(&mut first).await;
                        return;
                    }
                }
                RawAnswer::Sized { status, length } => {
                    let answer = format!(
                        "HTTP/1.1 {status} Whatever\r\ncontent-length: {length}\r\n\r\n{}",
                        "x".repeat(length)
                    );
                    let written = socket.write_all(answer.as_bytes()).await;
                    over(length as u64);
                    if written.is_err() {
                        return;
                    }
                }
                RawAnswer::Long { status, length } => {
                    let framing = match length {
                        Some(n) => format!("content-length: {n}"),
                        None => "transfer-encoding: chunked".to_owned(),
                    };
                    let head = format!("HTTP/1.1 {status} Whatever\r\n{framing}\r\n\r\n");
                    if socket.write_all(head.as_bytes()).await.is_err() {
                        over(0);
                        return;
                    }
                    let text = "oops ".repeat(64 * 1024 / 5);
                    let mut sent = 0u64;
                    loop {
                        let part = match length {
                            Some(n) if sent >= n => break,
                            Some(n) => &text.as_bytes()[..text.len().min((n - sent) as usize)],
                            None => text.as_bytes(),
                        };
                        let written = match length {
                            Some(_) => socket.write_all(part).await,
                            None => {
                                let chunk =
                                    [format!("{:x}\r\n", part.len()).as_bytes(), part, b"\r\n"]
                                        .concat();
                                socket.write_all(&chunk).await
                            }
                        };
                        if written.is_err() {
                            break;
                        }
                        sent += part.len() as u64;
                        got.lock().unwrap()[index].sent = sent;
                    }
                    over(sent);
                    return;
                }
            }
        }
    }

    fn got(&self) -> Vec<RawGot> {
        self.got.lock().unwrap().clone()
    }

    /// Waits until `n` answers were given and written to their end or
    /// refused (not a timed assertion: the bound only keeps a broken run
    /// from hanging).
    fn wait_over(&self, n: usize) -> Vec<RawGot> {
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let got = self.got();
            if got.len() >= n && got.iter().all(|g| g.over) {
                return got;
            }
            assert!(Instant::now() < deadline, "{got:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The value of the series `series` (its whole name with labels) in a
/// Prometheus text page; 0 when absent (a counter never raised).
fn metric(page: &str, series: &str) -> u64 {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0)
}

/// An answer is read only as far as the relay needs it: a 200 with a
/// 1,000,000,000-byte body and one with a body without end are each a
/// delivery, the connection closed after a few KB; a 500 with a body
/// without end is a refusal quoting its start. What the destination
/// managed to send is bounded (the socket buffers on both sides and the
/// client's read buffer), not the body's length nor the attempt's
/// timeout.
#[test]
fn a_long_or_endless_answer_is_read_only_as_far_as_needed() {
    let sink = RawSink::start(Box::new(|object, version| match (object, version) {
        ("card-7", 11) => RawAnswer::Long {
            status: 200,
            length: Some(1_000_000_000),
        },
        ("card-7", 12) => RawAnswer::Long {
            status: 200,
            length: None,
        },
        _ => RawAnswer::Long {
            status: 500,
            length: None,
        },
    }));
    // A long timeout: reading a body to its end would not be cut early.
    let server = serve_forwarding(
        "forward-long-answer",
        &sink.url,
        &["--forward-schedule", "", "--forward-timeout", "120"],
    );
    post_ok(&server, "e-11", "card-7", 11);
    post_ok(&server, "e-12", "card-7", 12);
    post_ok(&server, "e-4", "card-8", 4);
    // card-7's two delivered, card-8 v4 refused and parked failed.
    let relay = relay_at(&server, 3, 1);
    assert_eq!(relay["failed"], 1, "{relay}");
    assert_eq!(relay["parked"][0]["version"], 4, "{relay}");
    assert_eq!(
        relay["parked"][0]["error"],
        format!(
            "HTTP 500 Internal Server Error: {}...",
            "oops ".repeat(40).trim_end()
        ),
        "{relay}"
    );
    let metrics = server.get("/metrics").body;
    assert_eq!(
        metric(
            &metrics,
            "snapshot_receiver_relay_deliveries_total{relay=\"forward\"}"
        ),
        2,
        "{metrics}"
    );
    assert_eq!(
        metric(
            &metrics,
            "snapshot_receiver_relay_attempts_total{relay=\"forward\"}"
        ),
        3,
        "{metrics}"
    );
    let got = sink.wait_over(3);
    assert!(server.stop().0.success());
    assert_eq!(got.len(), 3, "each effect sent once: {got:?}");
    for answer in &got {
        assert!(
            answer.sent < 16 * 1024 * 1024,
            "{} bytes of an answer's body went out before the relay let go: {got:?}",
            answer.sent
        );
    }
}

/// An answer read to its end within the relay's limit (4,096 bytes of
/// body, exactly) leaves its connection for the next request; one byte
/// more and the connection is closed, the next request on a new one.
#[test]
fn an_answer_of_exactly_the_limit_keeps_its_connection() {
    let sink = RawSink::start(Box::new(|_, version| RawAnswer::Sized {
        status: 200,
        length: if version == 12 { 4097 } else { 4096 },
    }));
    let server = serve_forwarding("forward-answer-limit", &sink.url, &[]);
    // One object: its effects go one after the other.
    for version in 11..=13 {
        post_ok(&server, &format!("e-{version}"), "card-7", version);
    }
    let relay = relay_at(&server, 3, 0);
    assert_eq!(relay["undelivered"], 0, "{relay}");
    let got = sink.wait_over(3);
    assert!(server.stop().0.success());
    assert_eq!(
        got.iter()
            .map(|g| (g.sent, g.connection))
            .collect::<Vec<_>>(),
        [(4096, 0), (4097, 0), (4096, 1)],
        "{got:?}"
    );
}

/// A 503 or a 429 whose `Retry-After` is an HTTP date 40 s ahead (RFC
/// 9110 §10.2.3) parks the effect until at least that date, over a
/// schedule of 20 s; a 500 with the same header waits on the schedule
/// alone (only those two statuses ask for a wait). Read in the due time of
/// `GET /relays` (no waiting on a clock).
#[test]
fn a_retry_after_date_parks_the_effect_until_that_date() {
    for status in [503, 429, 500] {
        let (parked, date, sent) = parked_after_retry_after_date(status);
        let due = snapshot_receiver::parse_rfc3339(parked["due"].as_str().unwrap()).unwrap();
        let shown = httpdate::fmt_http_date(date);
        if status == 500 {
            assert!(
                due + Duration::from_secs(10) < date,
                "{status}: due {} not on the 20 s schedule but near {shown}",
                parked["due"]
            );
            continue;
        }
        assert!(
            due >= date,
            "{status}: due {} before the date asked for, {shown}",
            parked["due"]
        );
        // Not longer than asked for either (the relay's clock read a moment
        // after the sink's).
        assert!(
            due.duration_since(date).unwrap() < Duration::from_secs(10),
            "{status}: due {} long after {shown}",
            parked["due"]
        );
        assert_eq!(sent, 1, "{status}: not tried again yet");
    }
}

/// One effect refused with `status` and a `Retry-After` date 40 s ahead,
/// forwarded on a schedule of 20 s: its parked row (checked `retrying`
/// after one attempt, with the status as its error), the date asked for,
/// and the requests the sink got.
fn parked_after_retry_after_date(status: u16) -> (Value, std::time::SystemTime, usize) {
    let asked = Arc::new(Mutex::new(None));
    let sink = {
        let asked = asked.clone();
        Sink::start(Box::new(move |_, _, _| {
            // Whole seconds, as an HTTP date has them.
            let date = std::time::UNIX_EPOCH + Duration::from_secs(unix_now() + 40);
            *asked.lock().unwrap() = Some(date);
            (status, Some(httpdate::fmt_http_date(date)))
        }))
    };
    let server = serve_forwarding(
        &format!("forward-retry-after-date-{status}"),
        &sink.url,
        &["--forward-schedule", "20"],
    );
    post_ok(&server, "e-11", "card-7", 11);
    let relay = relay_at(&server, 1, 1);
    assert!(server.stop().0.success());
    let parked = relay["parked"][0].clone();
    assert_eq!(parked["status"], "retrying", "{relay}");
    assert_eq!(parked["attempts"], 1, "{relay}");
    let reason = axum::http::StatusCode::from_u16(status).unwrap();
    assert_eq!(parked["error"], format!("HTTP {reason}"), "{relay}");
    let date = asked.lock().unwrap().unwrap();
    (parked, date, sink.got().len())
}

/// A `Retry-After` that is neither seconds nor a date (`soon`) adds no
/// wait, the schedule's 0 s stands and the effect goes again at once, and
/// is said on a debug line.
#[test]
fn a_retry_after_that_is_neither_seconds_nor_a_date_is_ignored_with_a_debug_line() {
    let sink = Sink::start(Box::new(|_, _, before| {
        if before == 0 {
            (503, Some("soon".to_owned()))
        } else {
            (204, None)
        }
    }));
    let dir = scratch("forward-retry-after-garbage");
    let store = format!("sqlite:{}", dir.join("rx.db").display());
    let fixture = fixture();
    let mut command = Server::command(
        &[
            "-vv",
            "--store",
            &store,
            "--initial",
            &fixture,
            "--forward",
            &sink.url,
            "--forward-secret",
            NEW_SECRET,
            "--forward-schedule",
            "0",
        ],
        &[],
    );
    let mut child = command
        .env_remove("RUST_LOG")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Drained as it comes: a debug log can fill the pipe.
    let stderr = child.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut text = String::new();
        BufReader::new(stderr).read_to_string(&mut text).unwrap();
        text
    });
    let server = Server::attach(child);
    post_ok(&server, "e-11", "card-7", 11);
    let accepted = sink.wait_accepted(1);
    assert!(server.stop().0.success());
    let log = log.join().unwrap();
    let got = sink.got();
    assert_eq!(
        got.iter()
            .map(|g| (g.status, g.id.as_str()))
            .collect::<Vec<_>>(),
        [
            (503, accepted[0].id.as_str()),
            (204, accepted[0].id.as_str())
        ]
    );
    let line = log
        .lines()
        .find(|l| l.contains("Retry-After is neither seconds nor an HTTP date; ignored"))
        .unwrap_or_else(|| panic!("no debug line in {log}"));
    assert!(line.contains("DEBUG"), "{line}");
    assert!(line.contains("soon"), "{line}");
}

/// A destination that closes its connection after each answer, without
/// `Connection: close`: a request that crosses that close on a kept-alive
/// connection (here every request on a reused connection: the sink
/// closes as it arrives) is sent again at once on a new one, not
/// refused. 60 effects of 20 objects waiting at once: 60 attempts, 60
/// deliveries, each effect received once.
#[test]
fn a_kept_alive_connection_the_destination_closed_is_not_a_refusal() {
    let dir = scratch("forward-closed-connections");
    let store = format!("sqlite:{}", dir.join("rx.db").display());
    applied_versions(&store, 20, 3);
    let sink = RawSink::start(Box::new(|_, _| RawAnswer::Empty {
        status: 200,
        close: true,
    }));
    let server = Server::start(&[
        "--store",
        &store,
        "--forward",
        &sink.url,
        "--forward-secret",
        NEW_SECRET,
        "--forward-rate",
        "100000",
    ]);
    let deadline = Instant::now() + Duration::from_secs(120);
    let metrics = loop {
        let page = server.get("/metrics").body;
        if metric(
            &page,
            "snapshot_receiver_relay_deliveries_total{relay=\"forward\"}",
        ) >= 60
        {
            break page;
        }
        assert!(Instant::now() < deadline, "{page}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(server.stop().0.success());
    for (series, expected) in [
        (
            "snapshot_receiver_relay_deliveries_total{relay=\"forward\"}",
            60,
        ),
        (
            "snapshot_receiver_relay_attempts_total{relay=\"forward\"}",
            60,
        ),
        (
            "snapshot_receiver_relay_refusals_total{relay=\"forward\"}",
            0,
        ),
    ] {
        assert_eq!(metric(&metrics, series), expected, "{series}: {metrics}");
    }
    let got = sink.got();
    let mut ids: Vec<&str> = got.iter().map(|g| g.id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(
        (got.len(), ids.len()),
        (60, 60),
        "each effect once: {got:?}"
    );
}

/// Issue A, end to end on PostgreSQL: a destination that refuses one object
/// (410 for card-8, 200 for the rest). Every other effect is delivered
/// once; card-8 v4 is tried on its schedule (the first attempt and the
/// schedule's two, 1 s apart, not a round re-sent every half second), then
/// parked `failed`, v5 waiting behind it; the relay's cursor passes all
/// five. (Each save that parked an effect used to fail there: the relay
/// re-sent the same round for ever.)
#[test]
fn on_postgres_an_object_its_destination_refuses_is_parked_on_its_schedule_and_the_others_go() {
    let Some(url) = crate::durability::pg_url() else {
        return;
    };
    let schema = format!("sr_forward_gone_{}", std::process::id());
    crate::durability::drop_schema(&url, &schema);
    let sink = Sink::start(Box::new(|object, _, _| {
        if object == "card-8" {
            (410, None)
        } else {
            (200, None)
        }
    }));
    let server = Server::start(&[
        "--store",
        &url,
        "--store-schema",
        &schema,
        "--initial",
        &fixture(),
        "--forward",
        &sink.url,
        "--forward-secret",
        NEW_SECRET,
        "--forward-schedule",
        "1,1",
    ]);
    post_ok(&server, "e-11", "card-7", 11);
    post_ok(&server, "e-4", "card-8", 4);
    post_ok(&server, "e-12", "card-7", 12);
    post_ok(&server, "e-5", "card-8", 5);
    post_ok(&server, "e-13", "card-7", 13);
    relay_forward_at(&server, 5, 1);
    assert!(server.stop().0.success());
    let got = sink.got();
    let by = versions(&sink.accepted());
    assert_eq!(by["card-7"], [11, 12, 13]);
    assert!(!by.contains_key("card-8"), "{got:?}");
    let summary: Vec<(String, u64, u16)> = got
        .iter()
        .map(|g| {
            (
                g.body["object_id"].as_str().unwrap().to_owned(),
                g.body["version"].as_u64().unwrap(),
                g.status,
            )
        })
        .filter(|(o, _, _)| o == "card-8")
        .collect();
    assert_eq!(
        summary,
        [
            ("card-8".to_owned(), 4, 410),
            ("card-8".to_owned(), 4, 410),
            ("card-8".to_owned(), 4, 410)
        ],
        "v4 tried three times, v5 never (it waits behind v4)"
    );
    assert_eq!(
        got.len(),
        6,
        "card-7 once each, card-8 v4 three times: {got:?}"
    );
    let tries: Vec<Instant> = got
        .iter()
        .filter(|g| g.body["object_id"] == "card-8")
        .map(|g| g.at)
        .collect();
    // Each wait is the schedule's 1 s times a factor drawn from 0.8 to 1.2
    // (RelayOptions::schedule): at least 800 ms.
    for pair in tries.windows(2) {
        let gap = pair[1].duration_since(pair[0]);
        assert!(
            gap >= Duration::from_millis(800),
            "a retry {gap:?} after the attempt before it, the schedule says 1 s (-20 % at most)"
        );
    }
    let store = [url.as_str(), "--store-schema", schema.as_str()];
    let output = within_seconds(30, cli().args(["relays", "--store"]).args(store));
    let out = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(output.status.code(), Some(0), "{out}");
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("last outbox position: 5"));
    assert_eq!(
        lines.next(),
        Some("relay forward: position 5, 0 after it, 2 parked (1 failed): 2 not delivered, not running")
    );
    let failed = lines.next().unwrap();
    assert!(failed.starts_with("  failed 2 card-8 v4 (ef_"), "{out}");
    assert!(failed.ends_with(", 3 attempt(s)): HTTP 410 Gone"), "{out}");
    let waiting = lines.next().unwrap();
    assert!(waiting.starts_with("  waiting 4 card-8 v5 (ef_"), "{out}");
    assert_eq!(lines.next(), None);
    crate::durability::drop_schema(&url, &schema);
}

/// A failed forward attempt is seen at the default log level (no `-v`): a
/// warning naming the relay, the effect, its object, the attempt and the
/// answer, with when it is tried next. A destination refusing everything
/// (20 objects, each refused on its first attempt and the schedule's 5)
/// gives one such line per 10 s (the rest counted into the next line's
/// `suppressed`), and one warning per effect parked failed.
#[test]
fn a_refused_attempt_is_a_warning_and_a_flood_of_them_a_few_lines() {
    refusals_logged(&CliStore::sqlite("forward-refusals-logged"));
}

#[test]
fn on_postgres_a_refused_attempt_is_a_warning_and_a_flood_of_them_a_few_lines() {
    let Some(store) = CliStore::postgres("refusals_logged") else {
        return;
    };
    refusals_logged(&store);
}

fn refusals_logged(store: &CliStore) {
    let sink = Sink::start(Box::new(|_, _, _| (503, None)));
    let fixture = crate::serve::objects_fixture(&scratch("forward-refusals-fixture"), 20);
    let mut command = Server::command(
        &store.with(&[
            "--log-format",
            "json",
            "--initial",
            &fixture,
            "--forward",
            &sink.url,
            "--forward-secret",
            NEW_SECRET,
            "--forward-schedule",
            "0,0,0,0,0",
        ]),
        &[],
    );
    let mut child = command
        .env_remove("RUST_LOG")
        .env_remove("SNAPSHOT_RECEIVER_LOG_FORMAT")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut text = String::new();
        BufReader::new(stderr).read_to_string(&mut text).unwrap();
        text
    });
    let server = Server::attach(child);
    let started = Instant::now();
    for o in 0..20 {
        post_ok(&server, &format!("e-{o}"), &format!("obj-{o}"), 1);
    }
    // 6 attempts of each of 20 effects, then every one parked failed.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let page = server.get("/metrics").body;
        if metric(&page, "snapshot_receiver_relay_failed{relay=\"forward\"}") == 20 {
            break;
        }
        assert!(Instant::now() < deadline, "{page}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = started.elapsed();
    assert!(server.stop().0.success());
    let log = log.join().unwrap();
    let got = sink.got();
    assert_eq!(got.len(), 120, "{got:?}");
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let about = |prefix: &str| -> Vec<&Value> {
        lines
            .iter()
            .filter(|l| l["message"].as_str().unwrap_or("").starts_with(prefix))
            .collect()
    };
    let retried = about("effect refused; tried again later");
    // The gate lets one line through per 10 s.
    let bound = 1 + (took.as_secs() / 10) as usize;
    assert!(
        !retried.is_empty() && retried.len() <= bound,
        "{} lines for 100 refusals tried again in {took:?}: {log}",
        retried.len()
    );
    let first = retried[0];
    assert_eq!(first["level"], "warn", "{first}");
    assert_eq!(first["relay"], "forward", "{first}");
    assert_eq!(first["attempt"], 1, "{first}");
    assert_eq!(first["error"], "HTTP 503 Service Unavailable", "{first}");
    assert_eq!(first["suppressed"], 0, "{first}");
    let effect = first["effect_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{first}"));
    let sent = got
        .iter()
        .find(|g| g.id == effect)
        .unwrap_or_else(|| panic!("{effect} never sent: {got:?}"));
    assert_eq!(first["object_id"], sent.body["object_id"], "{first}");
    let next = first["next"].as_str().unwrap_or_else(|| panic!("{first}"));
    assert!(
        snapshot_receiver::parse_rfc3339(next).is_some(),
        "next is RFC 3339: {first}"
    );
    // Each effect parked failed is a warning of its own.
    let failed = about("effect refused and its schedule exhausted");
    assert_eq!(failed.len(), 20, "{log}");
    assert!(
        failed
            .iter()
            .all(|l| l["level"] == "warn" && l["attempt"] == 6),
        "{log}"
    );
}

/// `GET /metrics`: every family has its `# HELP` line before its
/// `# TYPE` line, and the families come sorted by name, in the same order
/// at every scrape (the exporter's own order is a hash map's).
#[test]
fn metrics_are_described_and_sorted_the_same_at_every_scrape() {
    let sink = Sink::start(Box::new(|_, _, _| (204, None)));
    let store = CliStore::sqlite("metrics-sorted");
    let server = Server::start(&store.with(&[
        "--initial",
        &fixture(),
        "--forward",
        &sink.url,
        "--forward-secret",
        NEW_SECRET,
    ]));
    post_ok(&server, "e-11", "card-7", 11);
    post_ok(&server, "e-4", "card-8", 4);
    sink.wait_accepted(2);
    assert_eq!(server.get("/nowhere").status, 404);
    let families = |page: &str| -> Vec<String> {
        let lines: Vec<&str> = page.lines().collect();
        lines
            .iter()
            .enumerate()
            .filter_map(|(i, l)| {
                let name = l.strip_prefix("# TYPE ")?.split(' ').next()?;
                let help = i
                    .checked_sub(1)
                    .and_then(|j| lines[j].strip_prefix("# HELP "))
                    .and_then(|h| h.strip_prefix(name))
                    .and_then(|h| h.strip_prefix(' '));
                assert!(
                    help.is_some_and(|h| !h.is_empty()),
                    "{name} has no # HELP line before its # TYPE: {page}"
                );
                Some(name.to_owned())
            })
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let first = loop {
        let page = server.get("/metrics").body;
        if metric(
            &page,
            "snapshot_receiver_relay_deliveries_total{relay=\"forward\"}",
        ) == 2
        {
            break page;
        }
        assert!(Instant::now() < deadline, "{page}");
        std::thread::sleep(Duration::from_millis(20));
    };
    let second = server.get("/metrics").body;
    assert!(server.stop().0.success());
    let (a, b) = (families(&first), families(&second));
    assert_eq!(a, b, "the same families in the same order");
    let mut sorted = a.clone();
    sorted.sort();
    assert_eq!(a, sorted, "sorted by name");
    for name in [
        "snapshot_receiver_decisions_total",
        "snapshot_receiver_http_responses_total",
        "snapshot_receiver_memory_bytes",
        "snapshot_receiver_relay_attempts_total",
        "snapshot_receiver_relay_lag_seconds",
    ] {
        assert!(a.iter().any(|f| f == name), "{name} in {a:?}");
    }
    assert!(
        first
            .lines()
            .any(|l| l
                == "# HELP snapshot_receiver_decisions_total Deliveries decided, by decision."),
        "{first}"
    );
    assert!(
        first.lines().any(|l| l
            == "# HELP snapshot_receiver_http_responses_total HTTP responses, by route as declared and status code."),
        "{first}"
    );
}

/// A sink that answers every request `503 Service Unavailable` (no
/// `Retry-After`), reading and dropping each body, keeping connections
/// alive: the address's URL and the count of requests answered.
fn refusing_sink() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::Write as _;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let answered = count.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let answered = answered.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut writer = stream;
                loop {
                    let mut length = 0usize;
                    loop {
                        let mut line = String::new();
                        match reader.read_line(&mut line) {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        }
                        if line == "\r\n" {
                            break;
                        }
                        if let Some((name, value)) = line.split_once(':') {
                            if name.eq_ignore_ascii_case("content-length") {
                                length = value.trim().parse().unwrap();
                            }
                        }
                    }
                    let mut body = vec![0; length];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    let answer = "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n";
                    if writer.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                    answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
    });
    (url, count)
}

/// Issue 48 items 1 and 11: the relay's memory is inside the memory
/// budget. `serve --memory-budget 16MiB` on SQLite forwards to a sink that
/// answers every request 503; 120 deliveries of 480 KiB states are each
/// refused and parked, then retried every second. A parked effect keeps
/// only its head (its state is read back when due) and a round reads at
/// most a quarter of the relay's 1 MiB part (one such state), so the
/// server's peak resident size stays within 80 MiB (five times the
/// budget) of what it was before the deliveries, and its figure for the
/// relay on `/metrics` within the relay's part. Measured: this run grows
/// the server by 34 MiB without a relay (the budget's parts, the
/// allocator's and SQLite's slack) and by 48 to 55 MiB with it; a relay
/// that keeps the 120 states it parked (56 MiB) grows it by 100 MiB
/// (before: 41 → 157 MiB). Started again on the same store with
/// the 121 effects parked, it opens them as heads: its peak stays within
/// the same bound of the first start.
#[test]
fn a_relay_refused_by_its_destination_keeps_its_memory_inside_the_budget() {
    const MIB: u64 = 1 << 20;
    const OBJECTS: usize = 120;
    let dir = scratch("relay-memory");
    let store = format!("sqlite:{}", dir.join("inbox.db").display());
    let fixture = dir.join("objects.json");
    let initial: serde_json::Map<String, Value> = (0..=OBJECTS)
        .map(|n| {
            let id = if n == OBJECTS {
                "warm".to_owned()
            } else {
                format!("obj-{n}")
            };
            (id, serde_json::json!({"version": 0, "state": {}}))
        })
        .collect();
    std::fs::write(
        &fixture,
        serde_json::json!({"initial_state": initial, "deliveries": [], "authority": []})
            .to_string(),
    )
    .unwrap();
    let (url, answered) = refusing_sink();
    let args = [
        "--store",
        &store,
        "--initial",
        fixture.to_str().unwrap(),
        "--memory-budget",
        "16MiB",
        "--forward",
        &url,
        "--forward-secret",
        NEW_SECRET,
        "--forward-schedule",
        "1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1",
    ];
    let server = Server::start(&args);
    // Warm: one small effect, refused and parked.
    post_ok(&server, "e-warm", "warm", 1);
    let began = Instant::now();
    while answered.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "the sink got nothing"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (start, _) = crate::serve_limits::resident(server.pid());
    let state = format!(r#"{{"pad":"{}"}}"#, "x".repeat(480 * 1024));
    let posting = Instant::now();
    for n in 0..OBJECTS {
        let reply = server.post(
            &[],
            &envelope(&format!("e-{n}"), &format!("obj-{n}"), 1, &state),
        );
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    // Every effect refused, parked, and retried at least once more.
    let parked = |server: &Server, refusals: u64| {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let page = server.get("/metrics").body;
            if metric(&page, "snapshot_receiver_relay_parked{relay=\"forward\"}")
                == OBJECTS as u64 + 1
                && metric(
                    &page,
                    "snapshot_receiver_relay_refusals_total{relay=\"forward\"}",
                ) >= refusals
            {
                return page;
            }
            assert!(Instant::now() < deadline, "waited 120 s: {page}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    eprintln!("posted in {:?}", posting.elapsed());
    let page = parked(&server, 2 * (OBJECTS as u64 + 1));
    eprintln!("parked and retried after {:?}", posting.elapsed());
    let used = metric(
        &page,
        "snapshot_receiver_memory_bytes{part=\"relay\",kind=\"used\"}",
    );
    let part = metric(
        &page,
        "snapshot_receiver_memory_bytes{part=\"relay\",kind=\"budget\"}",
    );
    let (end, peak) = crate::serve_limits::resident(server.pid());
    eprintln!(
        "resident MiB: start {:.1}, end {:.1}, peak {:.1}; relay holds {used} bytes",
        start as f64 / MIB as f64,
        end as f64 / MIB as f64,
        peak as f64 / MIB as f64,
    );
    assert_eq!(part, MIB, "a sixteenth of 16 MiB");
    assert!(
        used > 0 && used <= part,
        "the relay holds {used} bytes, its part is {part}"
    );
    assert!(
        peak <= start + 80 * MIB,
        "peak resident {:.1} MiB, more than 80 MiB (five times the budget) over the {:.1} MiB before the deliveries",
        peak as f64 / MIB as f64,
        start as f64 / MIB as f64,
    );
    assert!(server.stop().0.success());
    // Again on the same store: 121 effects parked from the start.
    let server = Server::start(&args);
    parked(&server, OBJECTS as u64 + 1);
    let (again, peak) = crate::serve_limits::resident(server.pid());
    eprintln!(
        "started again, resident MiB: {:.1}, peak {:.1}",
        again as f64 / MIB as f64,
        peak as f64 / MIB as f64,
    );
    assert!(
        peak <= start + 80 * MIB,
        "started again with 121 parked: peak resident {:.1} MiB, more than 80 MiB over the first start's {:.1} MiB",
        peak as f64 / MIB as f64,
        start as f64 / MIB as f64,
    );
    assert!(server.stop().0.success());
}
