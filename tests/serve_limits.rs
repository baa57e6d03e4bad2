//! `serve`'s front door under the attacks that once held or crashed it, in
//! bounded form on loopback: slow connections past the process's file
//! limit, a connection ceiling, header / body / idle timeouts, a head with
//! two body lengths, SIGTERM with stuck connections and the readiness
//! delay, the status page's escaping and headers.

use crate::common::{cli, repo, spawn_quiet};
use crate::serve::{
    address_and_banner, envelope, now_seconds, scratch, standard_headers, try_http, Reply,
};
use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, ChildStdout, Stdio};
use std::time::{Duration, Instant};

/// The tests' signing secret (Standard Webhooks form).
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A `serve` process started by these tests.
struct Serve {
    child: Child,
    addr: String,
    stdout: BufReader<ChildStdout>,
}

impl Serve {
    /// `serve --listen 127.0.0.1:0 ARGS...`, with its open-file limit set
    /// to `nofile` (soft and hard) when given.
    fn start(args: &[&str], nofile: Option<u64>) -> Serve {
        // Without `--store`, serve records in ./snapshot-receiver.db, and
        // the tests run it from the repository's top folder.
        assert!(
            args.contains(&"--store"),
            "serve {args:?}: a test names its store (memory, or a file under a scratch folder)"
        );
        let mut command = cli();
        command
            .args(["serve", "--listen", "127.0.0.1:0", "--initial"])
            .arg(repo("fixtures/B62-15-events.json"))
            .args(args)
            .env_remove("SNAPSHOT_RECEIVER_WEBHOOK_SECRET")
            .env_remove("SNAPSHOT_RECEIVER_OPERATOR_TOKEN")
            .stdout(Stdio::piped());
        if let Some(limit) = nofile {
            use std::os::unix::process::CommandExt as _;
            let rlimit = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            // SAFETY: setrlimit is async-signal-safe and touches only the
            // child's own limits, between fork and exec.
            unsafe {
                command.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &rlimit) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        let mut child = spawn_quiet(&mut command);
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let (addr, _banner) = address_and_banner(&mut stdout);
        Serve {
            child,
            addr,
            stdout,
        }
    }

    fn get(&self, path: &str) -> std::io::Result<Reply> {
        try_http(&self.addr, "GET", path, &[], b"")
    }

    /// The value of the metric line starting with `series` (0 when absent).
    fn metric(&self, series: &str) -> u64 {
        let body = self.get("/metrics").unwrap().body;
        body.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0)
    }

    /// Sends SIGTERM.
    fn terminate(&self) {
        let pid = libc::pid_t::try_from(self.child.id()).unwrap();
        // SAFETY: kill has no memory effects; the pid is our own child's.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    }

    /// Waits up to `bound` for the process to exit: how long it took and
    /// the rest of its stdout.
    fn exits_within(mut self, bound: Duration) -> (Duration, String) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "{status}");
                let mut rest = String::new();
                self.stdout.read_to_string(&mut rest).unwrap();
                return (start.elapsed(), rest);
            }
            assert!(
                start.elapsed() < bound,
                "serve still running {bound:?} after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Writes `bytes` on a new connection and reads until the server closes it
/// or `wait` passes: the status (`None` without an answer) and the text.
fn raw(addr: &str, bytes: &[u8], wait: Duration) -> (Option<u16>, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(wait)).unwrap();
    let _ = stream.write_all(bytes);
    let mut got = Vec::new();
    let _ = stream.read_to_end(&mut got);
    let text = String::from_utf8_lossy(&got).into_owned();
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok());
    (status, text)
}

/// The JSON body of a raw answer.
fn json_of(text: &str) -> serde_json::Value {
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {text:?}"))
}

/// Whether the server closes `stream` (EOF or reset) within `wait`.
fn closed_within(stream: &mut TcpStream, wait: Duration) -> bool {
    stream.set_read_timeout(Some(wait)).unwrap();
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

/// A connection that sends the start of a request head and nothing more.
fn slow(addr: &str) -> Option<TcpStream> {
    let mut stream = TcpStream::connect(addr).ok()?;
    // The server may already have closed it (over the ceiling).
    let _ = stream.write_all(b"GET /heal");
    Some(stream)
}

/// This test process's own open-file limit raised to at least `need`.
fn raise_own_file_limit(need: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write only the struct given.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
        if limit.rlim_cur < need {
            assert!(
                limit.rlim_max >= need,
                "this test needs {need} open files; the hard limit is {}",
                limit.rlim_max
            );
            limit.rlim_cur = need;
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
        }
    }
}

/// Issue 20 item 2, as it was broken: with the file limit at 1,024, one
/// client held 1,100 connections that sent only `GET /heal`, and every
/// probe and signed event timed out.
#[test]
fn with_1100_slow_connections_past_a_1024_file_limit_probes_and_events_are_answered_and_sigterm_is_quick(
) {
    const HEADER_TIMEOUT: u64 = 6;
    raise_own_file_limit(2_000);
    let dir = scratch("slow-connections");
    let store = format!("sqlite:{}", dir.join("inbox.db").display());
    let server = Serve::start(
        &[
            "--store",
            &store,
            "--webhook-secret",
            SECRET,
            "--header-timeout",
            &HEADER_TIMEOUT.to_string(),
            "--shutdown-delay",
            "0",
        ],
        Some(1_024),
    );
    let attack_start = Instant::now();
    let held: Vec<TcpStream> = (0..1_100).filter_map(|_| slow(&server.addr)).collect();
    assert_eq!(
        held.len(),
        1_100,
        "every connect succeeds (the backlog takes them)"
    );
    // Answered within the header timeout plus 2 s of the attack: probes
    // retry while the ceiling (1,024 - 64) is full of slow connections.
    let deadline = attack_start + Duration::from_secs(HEADER_TIMEOUT + 2);
    let mut refused = 0u64;
    let healthz = loop {
        match server.get("/healthz") {
            Ok(reply) => break reply,
            Err(_) => refused += 1,
        }
        assert!(
            Instant::now() < deadline,
            "/healthz unanswered {} s into the attack ({refused} attempts refused)",
            HEADER_TIMEOUT + 2
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(healthz.status, 200);
    assert_eq!(healthz.body, r#"{"status":"ok"}"#);
    let body = envelope("e-1100", "card-7", 11, r#"{"stage":"ready"}"#);
    let event = loop {
        let headers = standard_headers(SECRET, now_seconds(), &body);
        match try_http(&server.addr, "POST", "/events", &headers, body.as_bytes()) {
            Ok(reply) => break reply,
            Err(_) => refused += 1,
        }
        assert!(Instant::now() < deadline, "the signed event unanswered");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(event.status, 200, "{event:?}");
    assert_eq!(event.json()["decision"], "applied");
    assert!(
        Instant::now() < deadline,
        "answered {:?} into the attack",
        attack_start.elapsed()
    );
    // Every slow connection the server took was closed by the header
    // timeout, at least a ceiling's worth (1,024 - 64); the others, and the
    // refused probes, were closed at once at the ceiling. (On a loaded
    // machine the first ones may time out before the last ones connect,
    // and then more than a ceiling's worth are taken in all.)
    let ceiling = 1_024 - 64;
    let closed = |server: &Serve| {
        server.metric("snapshot_receiver_http_connections_closed_total{reason=\"header_timeout\"}")
    };
    let over =
        |server: &Serve| server.metric("snapshot_receiver_http_connections_over_ceiling_total");
    let wait = Instant::now() + Duration::from_secs(20);
    while closed(&server) + over(&server) < 1_100 + refused && Instant::now() < wait {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(closed(&server) >= ceiling, "{}", closed(&server));
    assert_eq!(closed(&server) + over(&server), 1_100 + refused);
    drop(held);

    // SIGTERM with 500 stuck connections (under the ceiling): stopped
    // within 2 s, stuck connections closed rather than waited for.
    let stuck: Vec<TcpStream> = (0..500).filter_map(|_| slow(&server.addr)).collect();
    assert_eq!(stuck.len(), 500);
    assert_eq!(server.get("/healthz").unwrap().status, 200);
    server.terminate();
    let (took, rest) = server.exits_within(Duration::from_secs(2));
    assert_eq!(rest, "stopped\n", "stopped after {took:?}");
    drop(stuck);
}

#[test]
fn connections_over_the_ceiling_are_closed_at_once_and_counted() {
    let server = Serve::start(
        &[
            "--store",
            "memory",
            "--max-connections",
            "4",
            "--header-timeout",
            "60",
        ],
        None,
    );
    let held: Vec<TcpStream> = (0..4).map(|_| slow(&server.addr).unwrap()).collect();
    for _ in 0..3 {
        let mut extra = slow(&server.addr).unwrap();
        assert!(
            closed_within(&mut extra, Duration::from_secs(10)),
            "a connection over the ceiling is closed at once"
        );
    }
    // The held ones are still open (their header timeout is a minute).
    for mut stream in held.iter().map(|s| s.try_clone().unwrap()) {
        assert!(!closed_within(&mut stream, Duration::from_millis(200)));
    }
    drop(held);
    // Probes refused while the server has not yet seen the held ones close
    // are counted too.
    let mut refused = 0;
    let metrics = loop {
        match server.get("/metrics") {
            Ok(reply) => break reply.body,
            Err(_) => refused += 1,
        }
        assert!(refused < 200, "/metrics never answered");
        std::thread::sleep(Duration::from_millis(50));
    };
    let line = format!(
        "snapshot_receiver_http_connections_over_ceiling_total {}",
        3 + refused
    );
    assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
}

/// Without `--max-connections` the ceiling is the open-file limit minus 64:
/// with a limit of 100, the 36 first slow connections are held and the
/// next ones are closed at once.
#[test]
fn the_default_ceiling_is_the_open_file_limit_minus_64() {
    let server = Serve::start(&["--store", "memory", "--header-timeout", "60"], Some(100));
    let held: Vec<TcpStream> = (0..36).map(|_| slow(&server.addr).unwrap()).collect();
    for mut stream in held.iter().map(|s| s.try_clone().unwrap()) {
        assert!(
            !closed_within(&mut stream, Duration::from_millis(100)),
            "a connection under the ceiling of 36 is held"
        );
    }
    let mut extra = slow(&server.addr).unwrap();
    assert!(
        closed_within(&mut extra, Duration::from_secs(10)),
        "the 37th connection is over the ceiling of 100 - 64"
    );
}

#[test]
fn a_head_with_content_length_and_transfer_encoding_is_400_and_not_recorded() {
    let server = Serve::start(&["--store", "memory"], None);
    let body = envelope("e-1201", "card-7", 11, r#"{"stage":"ready"}"#);
    let chunked = format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len());
    for order in [
        "Content-Length: 5\r\nTransfer-Encoding: chunked",
        "Transfer-Encoding: chunked\r\nContent-Length: 5",
    ] {
        let request = format!("POST /events HTTP/1.1\r\nHost: x\r\n{order}\r\n\r\n{chunked}");
        let (status, text) = raw(&server.addr, request.as_bytes(), Duration::from_secs(30));
        assert_eq!(status, Some(400), "{order}: {text}");
        assert_eq!(json_of(&text)["error"], "ambiguous_length", "{text}");
        assert!(
            text.to_ascii_lowercase()
                .contains("\r\nconnection: close\r\n"),
            "{text}"
        );
    }
    // Not recorded: the same event sent chunked alone is its first record.
    let request = format!(
        "POST /events HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{chunked}"
    );
    let (status, text) = raw(&server.addr, request.as_bytes(), Duration::from_secs(30));
    assert_eq!(status, Some(200), "{text}");
    assert_eq!(json_of(&text)["decision"], "applied", "{text}");
    assert_eq!(
        server.metric("snapshot_receiver_http_rejects_total{reason=\"ambiguous_length\"}"),
        2
    );
}

#[test]
fn a_body_that_never_arrives_is_408_after_the_body_timeout() {
    let server = Serve::start(&["--store", "memory", "--body-timeout", "1"], None);
    let started = Instant::now();
    // Declared 2 GiB, sent nothing: once waited forever.
    let (status, text) = raw(
        &server.addr,
        b"POST /events HTTP/1.1\r\nHost: x\r\nContent-Length: 2147483648\r\n\r\n",
        Duration::from_secs(30),
    );
    assert_eq!(status, Some(408), "{text}");
    assert_eq!(
        json_of(&text),
        serde_json::json!({
            "error": "body_timeout",
            "detail": "the request body was not received within 1 s; nothing was recorded",
        })
    );
    // Half a body, then nothing.
    let body = envelope("e-1301", "card-7", 11, r#"{"stage":"ready"}"#);
    let half = format!(
        "POST /events HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{}",
        body.len(),
        &body[..body.len() / 2]
    );
    let (status, text) = raw(&server.addr, half.as_bytes(), Duration::from_secs(30));
    assert_eq!(status, Some(408), "{text}");
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(
        server.metric("snapshot_receiver_http_connections_closed_total{reason=\"body_timeout\"}"),
        2
    );
    // Not recorded: the whole body now is the first record.
    let reply = try_http(&server.addr, "POST", "/events", &[], body.as_bytes()).unwrap();
    assert_eq!(reply.json()["decision"], "applied", "{reply:?}");
}

#[test]
fn an_idle_kept_alive_connection_is_closed_after_the_idle_timeout() {
    let server = Serve::start(
        &[
            "--store",
            "memory",
            "--idle-timeout",
            "1",
            "--header-timeout",
            "60",
        ],
        None,
    );
    let mut stream = TcpStream::connect(&server.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    // Two requests on the kept-alive connection, then silence.
    for _ in 0..2 {
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let (status, body) = crate::serve::read_response(&mut reader);
        assert_eq!(status, "HTTP/1.1 200 OK\r\n");
        assert_eq!(body, br#"{"status":"ok"}"#);
    }
    let mut rest = Vec::new();
    assert_eq!(
        reader.read_to_end(&mut rest).unwrap(),
        0,
        "closed by the server"
    );
    assert_eq!(
        server.metric("snapshot_receiver_http_connections_closed_total{reason=\"idle_timeout\"}"),
        1
    );
    assert_eq!(
        server.metric("snapshot_receiver_http_connections_closed_total{reason=\"header_timeout\"}"),
        0
    );
}

/// Issue 24 item 8 and item 7's stopping branch: after SIGTERM, `/readyz`
/// answers 503 `stopping` on a listener that is still open for the
/// shutdown delay, other requests are served, and a second signal ends the
/// delay: the process stops.
#[test]
fn after_sigterm_readyz_is_503_stopping_while_the_listener_stays_open_for_the_delay() {
    // A delay long enough that a loaded machine still gets its requests in
    // during it; the second signal then ends it (without that the server
    // would stay up for the whole delay).
    let server = Serve::start(&["--store", "memory", "--shutdown-delay", "60"], None);
    assert_eq!(
        server.get("/readyz").unwrap().json(),
        serde_json::json!({"status": "ready"})
    );
    server.terminate();
    let signalled = Instant::now();
    let stopping = loop {
        let reply = server
            .get("/readyz")
            .expect("the listener is open during the delay");
        if reply.status == 503 {
            break reply;
        }
        assert_eq!(reply.status, 200, "{reply:?}");
        assert!(signalled.elapsed() < Duration::from_secs(30), "never 503");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(stopping.json(), serde_json::json!({"status": "stopping"}));
    let body = envelope("e-1401", "card-7", 11, r#"{"stage":"ready"}"#);
    let reply = try_http(&server.addr, "POST", "/events", &[], body.as_bytes()).unwrap();
    assert_eq!(reply.json()["decision"], "applied", "{reply:?}");
    let addr = server.addr.clone();
    server.terminate();
    // Within 15 s of the second signal, well before the 60 s delay ends.
    let (_, rest) = server.exits_within(Duration::from_secs(15));
    assert_eq!(rest, "stopped\n");
    assert!(TcpStream::connect(&addr).is_err(), "the listener is closed");
}

/// A body still arriving when the listener closes (SIGTERM, no shutdown
/// delay) is answered 503 `stopping` with `Retry-After` and
/// `Connection: close`; nothing of it is recorded.
#[test]
fn a_body_cut_by_the_shutdown_is_503_stopping_with_retry_after() {
    let server = Serve::start(
        &[
            "--store",
            "memory",
            "--shutdown-delay",
            "0",
            "--body-timeout",
            "120",
        ],
        None,
    );
    let mut stream = TcpStream::connect(&server.addr).unwrap();
    stream
        .write_all(
            b"POST /events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 100\r\n\r\n{\"event_id\":",
        )
        .unwrap();
    // The head is read before the signal: a request in flight, its body
    // incomplete.
    std::thread::sleep(Duration::from_millis(300));
    server.terminate();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut raw = String::new();
    let _ = stream.read_to_string(&mut raw);
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.1 503 "), "{raw}");
    let headers = head.to_ascii_lowercase();
    assert!(headers.contains("\r\nretry-after: "), "{raw}");
    assert!(headers.contains("\r\nconnection: close"), "{raw}");
    let body: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(body["error"], "stopping", "{body}");
    let (_, rest) = server.exits_within(Duration::from_secs(30));
    assert_eq!(rest, "stopped\n");
}

/// Issue 20 item 6: an id with a right-to-left override is shown as its
/// code point; every answer carries the security headers; `/readyz` names
/// no store.
#[test]
fn the_status_page_shows_bidi_controls_escaped_and_sends_security_headers() {
    let dir = scratch("page-bidi");
    let store = format!("sqlite:{}", dir.join("inbox.db").display());
    let server = Serve::start(&["--store", &store], None);
    let body = r#"{"event_id":"e-1501","object_id":"unknown-\u202etxt.exe","object_version":1,"type":"card.snapshot","state":{}}"#;
    let reply = try_http(&server.addr, "POST", "/events", &[], body.as_bytes()).unwrap();
    assert_eq!(reply.json()["reason"], "unknown_object", "{reply:?}");
    let page = server.get("/").unwrap();
    assert_eq!(page.status, 200);
    assert!(
        page.body
            .contains(r#"<td class="object">unknown-<span class="ctl">U+202E</span>txt.exe</td>"#),
        "{}",
        page.body
    );
    assert!(!page.body.contains('\u{202E}'), "{}", page.body);
    for reply in [&page, &reply, &server.get("/readyz").unwrap()] {
        let header = |name: &str| {
            reply
                .headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(
            header("content-security-policy"),
            Some("default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
        );
        assert_eq!(header("x-content-type-options"), Some("nosniff"));
        assert_eq!(header("x-frame-options"), Some("DENY"));
    }
    assert_eq!(server.get("/readyz").unwrap().body, r#"{"status":"ready"}"#);
}
