//! Fetching authoritative snapshots over HTTP (docs/CONTRACT.md §4, *The
//! service fetches authorities itself*): `reconcile --fetch OBJECT
//! --authority URL` on a store seeded with the reference fixture, against
//! a test authority on loopback, on SQLite and PostgreSQL. A good answer
//! un-pauses the object; each bad answer changes nothing and exits with its
//! own code; the token travels in the request only.

use crate::durability::drop_schema;
use crate::operate::{seeded_postgres, seeded_sqlite};
use snapshot_receiver::store::StoreReader;
use std::process::Output;
use std::sync::{Arc, Mutex};

/// The bearer token the tests give the authority (from the environment).
const TOKEN: &str = "t0ken-not-to-be-shown";

/// card-7's authority of the fixture (as of T+20s).
const CARD7_V14: &str = r#"{"object_id":"card-7","version":14,"state":{"stage":"archived","label":"Map v2"},"as_of":"2024-01-01T08:00:20Z"}"#;

/// What the test authority answers for a request path: status, headers
/// and body.
pub(crate) type Answers = dyn Fn(&str) -> (u16, Vec<(&'static str, String)>, String) + Send + Sync;

/// One request the test authority received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Asked {
    /// The method and the request target (`GET /objects/card-7`).
    pub(crate) line: String,
    /// The `Authorization` header, if any.
    pub(crate) authorization: Option<String>,
}

/// An HTTP authority on loopback, in a thread with a runtime of its own,
/// answering every path with [`Answers`] and recording each request; it
/// stops when dropped.
pub(crate) struct TestAuthority {
    /// `http://127.0.0.1:PORT`.
    pub(crate) url: String,
    asked: Arc<Mutex<Vec<Asked>>>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl TestAuthority {
    pub(crate) fn start(answers: Box<Answers>) -> Self {
        let answers: Arc<Answers> = answers.into();
        let asked: Arc<Mutex<Vec<Asked>>> = Arc::default();
        let record = asked.clone();
        let app =
            axum::Router::new().fallback(move |request: axum::http::Request<axum::body::Body>| {
                let (answers, record) = (answers.clone(), record.clone());
                async move {
                    let target = request
                        .uri()
                        .path_and_query()
                        .map_or("/", |p| p.as_str())
                        .to_owned();
                    record.lock().unwrap().push(Asked {
                        line: format!("{} {target}", request.method()),
                        authorization: request
                            .headers()
                            .get("authorization")
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_owned),
                    });
                    let (status, headers, body) = answers(&target);
                    let mut response = axum::http::Response::builder().status(status);
                    for (name, value) in headers {
                        response = response.header(name, value);
                    }
                    response.body(axum::body::Body::from(body)).unwrap()
                }
            });
        let (addr, stop) = crate::common::loopback::serve(app);
        Self {
            url: format!("http://{addr}"),
            asked,
            _stop: stop,
        }
    }

    /// Answers `status` with `body` for every path.
    pub(crate) fn answering(status: u16, headers: &[(&'static str, &str)], body: &str) -> Self {
        let headers: Vec<(&'static str, String)> =
            headers.iter().map(|(n, v)| (*n, (*v).to_owned())).collect();
        let body = body.to_owned();
        Self::start(Box::new(move |_| (status, headers.clone(), body.clone())))
    }

    /// The requests so far.
    pub(crate) fn asked(&self) -> Vec<Asked> {
        self.asked.lock().unwrap().clone()
    }
}

/// `reconcile --fetch OBJECT --authority URL` on the store, the token in
/// the environment.
fn fetch(object: &str, url: &str, location: &str, schema: Option<&str>, extra: &[&str]) -> Output {
    let mut command = crate::common::cli();
    command
        .args(["reconcile", "--fetch", object, "--authority", url])
        .args(["--store", location])
        .args(extra)
        .env("SNAPSHOT_RECEIVER_AUTHORITY_TOKEN", TOKEN)
        .env_remove("SNAPSHOT_RECEIVER_AUTHORITY_SECRET");
    if let Some(schema) = schema {
        command.args(["--store-schema", schema]);
    }
    crate::serve::within_seconds(60, &mut command)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// Everything a reader sees of the store, to compare before and after.
fn seen(location: &str, schema: Option<&str>) -> String {
    let (location, schema) = (location.to_owned(), schema.map(str::to_owned));
    std::thread::spawn(move || {
        let r = StoreReader::open(&location, schema.as_deref()).unwrap();
        format!(
            "{:?}\n{:?}\n{:?}\n{:?}",
            r.summary().unwrap(),
            r.objects(false).unwrap(),
            r.held(None).unwrap(),
            r.recent_audit(1000).unwrap()
        )
    })
    .join()
    .unwrap()
}

/// Each bad answer for card-8: exit code and message; the store as it was,
/// and the token in no output.
fn bad_answers_change_nothing(location: &str, schema: Option<&str>) {
    let before = seen(location, schema);
    let card8_v14 = CARD7_V14.replace("card-7", "card-8");
    let cases: Vec<(TestAuthority, i32, String)> = vec![
        (
            TestAuthority::answering(200, &[], CARD7_V14),
            9,
            "a bad answer from the authority at {URL}/objects/{object_id}: the answer is about \
             object \"card-7\", not \"card-8\""
                .to_owned(),
        ),
        (
            TestAuthority::answering(200, &[], r#"{"object_id":"card-8","version":"5"}"#),
            9,
            "a bad answer from the authority at {URL}/objects/{object_id}: not a snapshot: \
             version: invalid type: string \"5\", expected u64 at line 1 column 35"
                .to_owned(),
        ),
        (
            TestAuthority::answering(200, &[], &card8_v14.replace("Map v2", &"x".repeat(600))),
            9,
            "a bad answer from the authority at {URL}/objects/{object_id}: the answer is 706 \
             bytes, over the body limit of 512"
                .to_owned(),
        ),
        (
            TestAuthority::answering(301, &[("location", "http://127.0.0.1:9/elsewhere")], ""),
            9,
            "a bad answer from the authority at {URL}/objects/{object_id}: HTTP 301 Moved \
             Permanently: a redirect to \"http://127.0.0.1:9/elsewhere\", not followed; the \
             authority's URL is the one to give"
                .to_owned(),
        ),
        (
            TestAuthority::answering(404, &[], "no such card"),
            7,
            "the authority at {URL}/objects/{object_id} has no such object (HTTP 404 or 410)"
                .to_owned(),
        ),
        (
            TestAuthority::answering(503, &[("retry-after", "30")], "maintenance"),
            8,
            "the authority at {URL}/objects/{object_id} is unavailable: HTTP 503 Service \
             Unavailable: maintenance (it asks for 30 s before the next try)"
                .to_owned(),
        ),
    ];
    for (authority, code, message) in cases {
        let url = format!("{}/objects/{{object_id}}", authority.url);
        let o = fetch(
            "card-8",
            &url,
            location,
            schema,
            &["--max-body-bytes", "512"],
        );
        let stderr = text(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{stderr}");
        assert_eq!(
            stderr,
            format!(
                "error: --fetch card-8: {}; nothing changed\n",
                message.replace("{URL}", &authority.url)
            )
        );
        assert_eq!(text(&o.stdout), "");
        assert!(!stderr.contains(TOKEN));
        assert_eq!(
            authority.asked(),
            [crate::authority_fetch::Asked {
                line: "GET /objects/card-8".to_owned(),
                authorization: Some(format!("Bearer {TOKEN}")),
            }]
        );
        assert_eq!(seen(location, schema), before, "nothing changed");
    }
}

/// The good answer: card-7 un-paused at v14, e-203 equal, the variant
/// unresolved; an older answer for card-8 refused (exit 6).
fn a_good_answer_reconciles(location: &str, schema: Option<&str>) {
    let authority = TestAuthority::start(Box::new(|target| match target {
        "/objects/card-7" => (200, vec![], CARD7_V14.to_owned()),
        _ => (
            200,
            vec![],
            r#"{"object_id":"card-8","version":3,"state":{},"as_of":"2024-01-01T08:00:20Z"}"#
                .to_owned(),
        ),
    }));
    let url = format!("{}/objects/{{object_id}}", authority.url);
    let o = fetch("card-7", &url, location, schema, &[]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(
        text(&o.stdout),
        "fetched: card-7 authority v14, replaced, not paused {\"stage\":\"archived\",\"label\":\"Map v2\"}\n\
         \x20 e-202 unresolved (event_variant) v14, not paused\n\
         \x20 e-203 equal v14, not paused\n"
    );
    let o = fetch("card-8", &url, location, schema, &["--format", "json"]);
    assert_eq!(o.status.code(), Some(6), "{}", text(&o.stderr));
    assert_eq!(
        text(&o.stderr),
        "error: --fetch: authority for `card-8` has version 3, older than the object's version \
         4; refused, the object is unchanged\n"
    );
    assert_eq!(
        text(&o.stdout),
        "{\"fetched\":\"card-8\",\"step\":1,\"phase\":\"reconcile\",\"event_id\":null,\
         \"object_id\":\"card-8\",\"decision\":\"authority_refused\",\"reason\":\"authority \
         for `card-8` has version 3, older than the object's version 4; refused, the object is \
         unchanged\",\"conflict\":null,\"original_decision\":null,\"version\":4,\"state\":\
         {\"stage\":\"review\",\"label\":\"Chart\"},\"paused\":true,\"replacement\":false,\
         \"ack\":null}\n"
    );
    let (location, schema) = (location.to_owned(), schema.map(str::to_owned));
    let objects = std::thread::spawn(move || {
        StoreReader::open(&location, schema.as_deref())
            .unwrap()
            .objects(false)
            .unwrap()
    })
    .join()
    .unwrap();
    let view: Vec<_> = objects
        .iter()
        .map(|o| (o.object_id.as_str(), o.version, o.state.get(), o.paused))
        .collect();
    assert_eq!(
        view,
        [
            (
                "card-7",
                14,
                r#"{"stage":"archived","label":"Map v2"}"#,
                false
            ),
            ("card-8", 4, r#"{"stage":"review","label":"Chart"}"#, true),
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn fetching_by_hand_reconciles_or_changes_nothing_on_sqlite() {
    let location = seeded_sqlite("authority-fetch").await;
    bad_answers_change_nothing(&location, None);
    a_good_answer_reconciles(&location, None);
}

#[tokio::test(flavor = "multi_thread")]
async fn fetching_by_hand_reconciles_or_changes_nothing_on_postgres() {
    let Some((url, schema)) = seeded_postgres("authority_fetch").await else {
        return;
    };
    bad_answers_change_nothing(&url, Some(&schema));
    a_good_answer_reconciles(&url, Some(&schema));
    drop_schema(&url, &schema);
}

/// Flags checked by name before anything is fetched or opened.
#[test]
fn fetch_flags_are_checked_by_name() {
    let o = crate::common::cli()
        .args([
            "reconcile",
            "--fetch",
            "card-7",
            "--store",
            "sqlite:nowhere.db",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).starts_with(
            "error: the following required arguments were not provided:\n  --authority <URL>"
        ),
        "{}",
        text(&o.stderr)
    );
    let o = crate::common::cli()
        .args([
            "reconcile",
            "--fetch",
            "card-7",
            "--store",
            "sqlite:nowhere.db",
        ])
        .args(["--authority", "http://127.0.0.1:9/objects"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        text(&o.stderr),
        "error: --authority \"http://127.0.0.1:9/objects\": no placeholder: put {object_id} (or \
         {tenant} and {id}) where the object's id goes\n"
    );
    let o = crate::common::cli()
        .args([
            "reconcile",
            "--fetch",
            "card-7",
            "--store",
            "sqlite:nowhere.db",
        ])
        .args(["--authority", "http://127.0.0.1:9/{object_id}"])
        .env("SNAPSHOT_RECEIVER_AUTHORITY_TOKEN", TOKEN)
        .env("SNAPSHOT_RECEIVER_AUTHORITY_SECRET", "whsec_eA==")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        text(&o.stderr),
        "error: SNAPSHOT_RECEIVER_AUTHORITY_TOKEN and SNAPSHOT_RECEIVER_AUTHORITY_SECRET are \
         both set: the authority takes a bearer token or signed requests, unset one\n"
    );
}

/// card-7's snapshot at version 12 (the README's walkthrough).
const CARD7_V12: &str = r#"{"object_id":"card-7","version":12,"state":{"stage":"ready","label":"Map"},"as_of":"2026-12-06T08:00:00Z"}"#;

/// An authority that knows card-7 at version 12 and no other object.
fn card7_authority() -> TestAuthority {
    TestAuthority::start(Box::new(|target| match target {
        "/objects/card-7" => (200, vec![], CARD7_V12.to_owned()),
        _ => (404, vec![], String::new()),
    }))
}

/// Polls `check` every 100 ms until it holds, for at most 30 s.
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !check() {
        assert!(
            std::time::Instant::now() < deadline,
            "not within 30 s: {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The README's walkthrough with `--authority`: the variant pauses card-7,
/// the service fetches card-7 from the authority and un-pauses it, with no
/// operator step.
fn the_service_unpauses_from_its_authority(store: &str, schema: Option<&str>) {
    let authority = card7_authority();
    let template = format!("{}/objects/{{object_id}}", authority.url);
    let fixture = crate::common::repo("fixtures/B62-15-events.json")
        .display()
        .to_string();
    let mut args = vec![
        "--initial",
        &fixture,
        "--store",
        store,
        "--authority",
        &template,
    ];
    if let Some(schema) = schema {
        args.extend(["--store-schema", schema]);
    }
    let secret = crate::serve::NEW_SECRET;
    let server = crate::serve::Server::start_env(
        &args,
        &[
            ("SNAPSHOT_RECEIVER_WEBHOOK_SECRET", secret),
            ("SNAPSHOT_RECEIVER_AUTHORITY_TOKEN", TOKEN),
        ],
    );
    assert!(
        server
            .banner
            .trim_end()
            .ends_with(&format!("; authority: {template}")),
        "{}",
        server.banner
    );
    let event = r#"{"event_id":"e-901","object_id":"card-7","object_version":11,"type":"card.snapshot","state":{"stage":"ready","label":"Map"}}"#;
    let reply = server.post_signed(secret, event);
    assert_eq!(reply.json()["decision"], "applied", "{}", reply.body);
    assert!(authority.asked().is_empty(), "nothing needed an authority");
    let variant = event.replace(r#""label":"Map""#, r#""label":"Map draft""#);
    let reply = server.post_signed(secret, &variant);
    assert_eq!(
        (
            reply.json()["decision"].as_str(),
            reply.json()["paused"].as_bool()
        ),
        (Some("conflict"), Some(true)),
        "{}",
        reply.body
    );
    eventually("card-7 un-paused by the authority", || {
        server.get("/objects/card-7").json()["paused"] == false
    });
    let mut object = server.get("/objects/card-7").json();
    assert!(object["paused_at"].is_null() || object.get("paused_at").is_none());
    if let Some(map) = object.as_object_mut() {
        map.remove("paused_at");
    }
    assert_eq!(
        object,
        serde_json::json!({"object_id": "card-7", "version": 12,
            "state": {"stage": "ready", "label": "Map"}, "paused": false, "deleted": false,
            "pause_reason": null, "paused_by": null})
    );
    assert_eq!(
        authority.asked(),
        [Asked {
            line: "GET /objects/card-7".to_owned(),
            authorization: Some(format!("Bearer {TOKEN}")),
        }]
    );
    let metrics = server.get("/metrics").body;
    assert!(
        metrics
            .lines()
            .any(|l| l == "snapshot_receiver_authority_fetches_total{outcome=\"applied\"} 1"),
        "{metrics}"
    );
    let page = server.get("/").body;
    assert!(
        page.contains("<p class=\"none\" id=\"waiting-none\">none</p>"),
        "{page}"
    );
    assert!(!page.contains(TOKEN) && !metrics.contains(TOKEN));
    let (status, rest) = server.stop();
    assert!(status.success(), "{rest}");
}

#[test]
fn the_service_unpauses_from_its_authority_on_sqlite() {
    let dir = crate::serve::scratch("authority-serve");
    let store = format!("sqlite:{}", dir.join("rx.db").display());
    the_service_unpauses_from_its_authority(&store, None);
}

#[test]
fn the_service_unpauses_from_its_authority_on_postgres() {
    let Some(url) = crate::durability::pg_url() else {
        return;
    };
    let schema = format!("sr_authority_serve_{}", std::process::id());
    drop_schema(&url, &schema);
    the_service_unpauses_from_its_authority(&url, Some(&schema));
    drop_schema(&url, &schema);
}

/// The `reconciler` command beside a receiver in another process: card-8,
/// paused in the store before it starts, and card-7, paused by that
/// receiver while it runs, are both fetched and un-paused.
async fn the_reconciler_command_follows_the_store(location: &str, schema: Option<&str>) {
    let authority = TestAuthority::start(Box::new(|target| {
        match target {
        "/objects/card-7" => (200, vec![], CARD7_V14.to_owned()),
        "/objects/card-8" => (
            200,
            vec![],
            r#"{"object_id":"card-8","version":5,"state":{"stage":"ready","label":"Chart"},"as_of":"2024-01-01T08:00:20Z"}"#
                .to_owned(),
        ),
        _ => (404, vec![], String::new()),
    }
    }));
    let template = format!("{}/objects/{{object_id}}", authority.url);
    let mut command = crate::common::cli();
    command
        .args(["reconciler", "--store", location, "--authority", &template])
        .args(["--authority-rescan", "1"])
        .env_remove("SNAPSHOT_RECEIVER_AUTHORITY_TOKEN")
        .stdout(std::process::Stdio::piped());
    if let Some(schema) = schema {
        command.args(["--store-schema", schema]);
    }
    let child = crate::common::spawn_quiet(&mut command);
    let objects = || {
        let (location, schema) = (location.to_owned(), schema.map(str::to_owned));
        std::thread::spawn(move || {
            StoreReader::open(&location, schema.as_deref())
                .unwrap()
                .objects(false)
                .unwrap()
                .into_iter()
                .map(|o| (o.object_id, o.version, o.paused))
                .collect::<Vec<_>>()
        })
        .join()
        .unwrap()
    };
    eventually("card-7 and card-8 un-paused", || {
        objects()
            == [
                ("card-7".to_owned(), 14, false),
                ("card-8".to_owned(), 5, false),
            ]
    });
    // Another receiver on the store pauses card-7 again: a new event at
    // version 15, then its variant.
    let mut builder = snapshot_receiver::Receiver::builder().store(location);
    if let Some(schema) = schema {
        builder = builder.store_schema(schema);
    }
    let rx = builder.build().unwrap();
    let event = r#"{"event_id":"e-950","object_id":"card-7","object_version":15,"type":"card.snapshot","state":{"stage":"done","label":"Map"}}"#;
    rx.deliver(event.as_bytes()).await;
    let variant = event.replace("done", "undone");
    let receipt = rx.deliver(variant.as_bytes()).await;
    assert_eq!(receipt.object.as_ref().map(|o| o.paused), Some(true));
    rx.shutdown().await;
    drop(rx);
    // The authority is still at 14: refused as older, card-7 stays paused;
    // the reconciler asked for it again.
    eventually("card-7 fetched again", || {
        authority
            .asked()
            .iter()
            .filter(|a| a.line == "GET /objects/card-7")
            .count()
            >= 2
    });
    assert_eq!(
        objects(),
        [
            ("card-7".to_owned(), 15, true),
            ("card-8".to_owned(), 5, false),
        ]
    );
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success());
    let stdout = text(&output.stdout);
    assert!(
        stdout.starts_with(&format!(
            "fetching authoritative snapshots from {template} for the objects of "
        )),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_reconciler_command_follows_the_store_on_sqlite() {
    let location = seeded_sqlite("authority-reconciler").await;
    the_reconciler_command_follows_the_store(&location, None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_reconciler_command_follows_the_store_on_postgres() {
    let Some((url, schema)) = seeded_postgres("authority_reconciler").await else {
        return;
    };
    the_reconciler_command_follows_the_store(&url, Some(&schema)).await;
    drop_schema(&url, &schema);
}

/// `serve --print-config` shows the authority's flags, the URL's password
/// redacted and no credential of the environment; a signing secret that is
/// a webhook secret is refused at start.
#[test]
fn serve_shows_the_authority_flags_and_keeps_its_credentials_apart() {
    let o = crate::common::cli()
        .args(["serve", "--print-config", "--store", "memory"])
        .args([
            "--authority",
            "http://u:pw@h:81/{object_id}",
            "--authority-resync",
            "3600",
        ])
        .env("SNAPSHOT_RECEIVER_AUTHORITY_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let printed = text(&o.stdout);
    let authority: Vec<&str> = printed
        .lines()
        .filter(|l| l.contains("authority"))
        .collect();
    assert_eq!(
        authority,
        [
            "authority = \"http://u:<redacted>@h:81/{object_id}\"  # flag",
            "authority-timeout = 10  # default",
            "authority-concurrency = 8  # default",
            "authority-rate = 50  # default",
            "authority-burst = 10  # default",
            "authority-backoff = 1  # default",
            "authority-backoff-max = 300  # default",
            "authority-breaker-failures = 5  # default",
            "authority-breaker-open = 30  # default",
            "authority-resync = 3600  # flag",
            "authority-rescan = 30  # default",
        ]
    );
    assert!(!printed.contains(TOKEN));
    let secret = crate::serve::NEW_SECRET;
    let o = crate::serve::within_seconds(
        30,
        crate::common::cli()
            .args(["serve", "--listen", "127.0.0.1:0", "--store", "memory"])
            .args(["--authority", "http://127.0.0.1:9/{object_id}"])
            .env("SNAPSHOT_RECEIVER_WEBHOOK_SECRET", secret)
            .env("SNAPSHOT_RECEIVER_AUTHORITY_SECRET", secret)
            .env_remove("SNAPSHOT_RECEIVER_AUTHORITY_TOKEN"),
    );
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        text(&o.stderr),
        "error: SNAPSHOT_RECEIVER_AUTHORITY_SECRET is one of the webhook secrets \
         (--webhook-secret or SNAPSHOT_RECEIVER_WEBHOOK_SECRET): requests to the authority are \
         signed with a secret of their own, or the authority could sign deliveries to this \
         server; make one with `openssl rand -base64 32` and give it as whsec_<base64>\n"
    );
}

/// The library's defaults are the flags' defaults.
#[test]
fn the_flags_defaults_are_the_librarys() {
    let d = snapshot_receiver::reconciler::ReconcilerOptions::default();
    assert_eq!(
        (
            d.concurrency,
            d.rate,
            d.burst,
            d.attempt_timeout,
            d.backoff_base,
            d.backoff_max,
            d.breaker_failures,
            d.breaker_open,
            d.resync,
            d.rescan
        ),
        (
            8,
            Some(50.0),
            10,
            std::time::Duration::from_secs(10),
            std::time::Duration::from_secs(1),
            std::time::Duration::from_secs(300),
            5,
            std::time::Duration::from_secs(30),
            None,
            std::time::Duration::from_secs(30)
        )
    );
}
