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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
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
        metric_in(&self.get("/metrics").unwrap().body, series)
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

/// The value of the metric line of `metrics` starting with `series` (0
/// when absent).
fn metric_in(metrics: &str, series: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0)
}

/// `GET path` on the kept-alive connection `stream`: the status line and
/// the body.
fn get_on(stream: &TcpStream, path: &str) -> (String, String) {
    let mut writer = stream.try_clone().unwrap();
    writer
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .unwrap();
    writer
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let (status, body) = crate::serve::read_response(&mut BufReader::new(writer));
    (status, String::from_utf8(body).unwrap())
}

/// Whether the server has closed `stream` already (without waiting).
fn closed_now(stream: &TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let closed = !still_open(stream);
    stream.set_nonblocking(false).unwrap();
    closed
}

/// A request head declaring a body of 100 bytes and waiting for `100
/// Continue` before sending it: once that came, the server is reading the
/// body.
fn body_awaited(addr: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .write_all(
            b"POST /events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 100\r\nExpect: 100-continue\r\n\r\n",
        )
        .unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut continued = [0u8; 25];
    stream.read_exact(&mut continued).unwrap();
    assert_eq!(&continued, b"HTTP/1.1 100 Continue\r\n\r\n");
    stream
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

/// Issue 37 item 2 (issue 20 item 2 before it): with the file limit at
/// 1,024 (a ceiling of 960), one client opens 1,100 connections, idle and
/// half-sent (`GET /heal`) by turns, and holds them. The 140 it opened
/// first give way to the last 140, a health check gets in at the full
/// ceiling (the 141st gives way to it), a signed event too, and SIGTERM
/// with the rest stuck stops the server within 2 s. (Before: the 140 last
/// were closed, and probes were refused until the header timeout freed
/// places.)
#[test]
fn at_a_1024_file_limit_1100_idle_and_half_sent_connections_give_way_oldest_first_and_sigterm_is_quick(
) {
    const CEILING: usize = 1_024 - 64;
    raise_own_file_limit(5_000);
    let dir = scratch("ceiling");
    let store = format!("sqlite:{}", dir.join("inbox.db").display());
    let server = Serve::start(
        &[
            "--store",
            &store,
            "--webhook-secret",
            SECRET,
            // Nothing closes by time while the test runs.
            "--header-timeout",
            "600",
            "--idle-timeout",
            "600",
            "--shutdown-delay",
            "0",
        ],
        Some(1_024),
    );
    let held: Vec<TcpStream> = (0..1_100)
        .map(|i| {
            if i % 2 == 0 {
                TcpStream::connect(&server.addr).unwrap()
            } else {
                slow(&server.addr).unwrap()
            }
        })
        .collect();
    let over = held.len() - CEILING;
    for (i, stream) in held.iter().enumerate().take(over) {
        let mut stream = stream.try_clone().unwrap();
        assert!(
            closed_within(&mut stream, Duration::from_secs(30)),
            "connection {i} of the {over} first gives way"
        );
    }
    let healthz = server.get("/healthz").unwrap();
    assert_eq!(
        (healthz.status, healthz.body.as_str()),
        (200, r#"{"status":"ok"}"#)
    );
    assert!(closed_within(
        &mut held[over].try_clone().unwrap(),
        Duration::from_secs(30)
    ));
    for (i, stream) in held.iter().enumerate().skip(over + 1) {
        assert!(!closed_now(stream), "connection {i} is still open");
    }
    // Asked on the last idle connection (a new one would take a place):
    // exactly the 141 told to give way, none refused or timed out.
    let (status, metrics) = get_on(&held[held.len() - 2], "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK\r\n");
    for (series, expected) in [
        (
            "snapshot_receiver_http_connections_closed_total{reason=\"gave_way\"}",
            over as u64 + 1,
        ),
        ("snapshot_receiver_http_connections_over_ceiling_total", 0),
        ("snapshot_receiver_http_connections_spare_total", 0),
        (
            "snapshot_receiver_http_connections_closed_total{reason=\"header_timeout\"}",
            0,
        ),
    ] {
        assert_eq!(metric_in(&metrics, series), expected, "{series}\n{metrics}");
    }
    let body = envelope("e-1100", "card-7", 11, r#"{"stage":"ready"}"#);
    let headers = standard_headers(SECRET, now_seconds(), &body);
    let event = try_http(&server.addr, "POST", "/events", &headers, body.as_bytes()).unwrap();
    assert_eq!(event.status, 200, "{event:?}");
    assert_eq!(event.json()["decision"], "applied");

    // SIGTERM with the rest stuck: stopped within 2 s, stuck connections
    // closed rather than waited for.
    server.terminate();
    let (took, rest) = server.exits_within(Duration::from_secs(2));
    assert_eq!(rest, "stopped\n", "stopped after {took:?}");
    drop(held);
}

/// One client holding `n` connections open, idle (even slots) or with a
/// half-sent head (odd slots), and reopening each one the server closes,
/// until stopped. Its [`SIEGE_THREADS`] threads each keep a share, so that
/// a connect the kernel delays (a dropped SYN is sent again after 1 s)
/// holds up only its own thread's share.
struct Siege {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<u64>>,
}

/// The threads of a [`Siege`].
const SIEGE_THREADS: usize = 4;

impl Siege {
    /// Starts it and returns once it opened its `n` connections.
    fn start(addr: &str, n: usize) -> Siege {
        let stop = Arc::new(AtomicBool::new(false));
        let (opened_all, first_pass) = std::sync::mpsc::channel();
        let threads = (0..SIEGE_THREADS)
            .map(|t| {
                let share = n / SIEGE_THREADS + usize::from(t < n % SIEGE_THREADS);
                let (addr, stop, opened_all) = (addr.to_owned(), stop.clone(), opened_all.clone());
                std::thread::spawn(move || {
                    let mut held: Vec<Option<TcpStream>> = (0..share).map(|_| None).collect();
                    let mut opened = 0u64;
                    let mut told = false;
                    while !stop.load(Ordering::Relaxed) {
                        if !told && opened >= share as u64 {
                            let _ = opened_all.send(());
                            told = true;
                        }
                        for (i, slot) in held.iter_mut().enumerate() {
                            if slot.as_ref().is_some_and(still_open) {
                                continue;
                            }
                            *slot = None;
                            let Ok(mut stream) = TcpStream::connect(&addr) else {
                                continue;
                            };
                            if i % 2 == 1 {
                                let _ = stream.write_all(b"GET /heal");
                            }
                            stream.set_nonblocking(true).unwrap();
                            *slot = Some(stream);
                            opened += 1;
                        }
                        wait_for_any_closed(&held, Duration::from_millis(100));
                    }
                    opened
                })
            })
            .collect();
        for _ in 0..SIEGE_THREADS {
            first_pass.recv().unwrap();
        }
        Siege { stop, threads }
    }

    /// Stops it: how many connections it opened in all.
    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.threads.into_iter().map(|t| t.join().unwrap()).sum()
    }
}

/// Waits up to `wait` for the server to close (or write to) any of `held`.
fn wait_for_any_closed(held: &[Option<TcpStream>], wait: Duration) {
    use std::os::fd::AsRawFd as _;
    let mut fds: Vec<libc::pollfd> = held
        .iter()
        .flatten()
        .map(|stream| libc::pollfd {
            fd: stream.as_raw_fd(),
            events: libc::POLLIN | libc::POLLRDHUP,
            revents: 0,
        })
        .collect();
    // SAFETY: poll reads and writes only the `fds.len()` entries of the
    // vector it is given, which lives for the call.
    unsafe {
        libc::poll(
            fds.as_mut_ptr(),
            libc::nfds_t::try_from(fds.len()).unwrap(),
            i32::try_from(wait.as_millis()).unwrap(),
        );
    }
}

/// Whether the server has not closed this non-blocking stream.
fn still_open(stream: &TcpStream) -> bool {
    match stream.peek(&mut [0u8; 1]) {
        Ok(0) => false,
        Ok(_) => true,
        Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
    }
}

/// One request of [`probe`]: its status, how long after the first try it
/// was answered, and on which try.
#[derive(Clone, Copy, Debug)]
struct Answered {
    status: u16,
    took: Duration,
    tries: u32,
}

/// Sends one request (on a new connection each try, retried after 50 ms
/// while refused) until it is answered or `give_up` passed.
fn probe(
    addr: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
    give_up: Duration,
) -> Option<Answered> {
    let start = Instant::now();
    let mut tries = 0;
    loop {
        tries += 1;
        let method = if body.is_empty() { "GET" } else { "POST" };
        if let Ok(reply) = try_http(addr, method, path, headers, body) {
            return Some(Answered {
                status: reply.status,
                took: start.elapsed(),
                tries,
            });
        }
        if start.elapsed() >= give_up {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Issue 37 item 2, the measurement: with the file limit at 1,024 (ceiling
/// 960) and the default timeouts, one client reopening 1,100 idle and
/// half-sent connections while another sends 83 health checks and 83
/// signed events, one of each every 100 ms. At least 95 % of each (79 of
/// 83) are answered 200 on their first try within 2 s (the issue's target;
/// with the new connection refused at the ceiling, as before, 56 and 67
/// of 83 health checks were in two runs), every one is answered in the end and every event
/// applied once; the figures are printed (docs/DEPLOYMENT.md has them).
#[test]
fn one_client_reopening_1100_connections_leaves_probes_and_signed_events_answered() {
    const PROBES: usize = 83;
    raise_own_file_limit(5_000);
    let dir = scratch("siege");
    let store = format!("sqlite:{}", dir.join("inbox.db").display());
    let server = Serve::start(
        &[
            "--store",
            &store,
            "--webhook-secret",
            SECRET,
            "--shutdown-delay",
            "0",
        ],
        Some(1_024),
    );
    let siege = Siege::start(&server.addr, 1_100);
    let give_up = Duration::from_secs(30);
    let within = Duration::from_secs(2);
    let mut health = Vec::new();
    let mut events = Vec::new();
    for i in 0..PROBES {
        health.push(probe(&server.addr, "/healthz", &[], b"", give_up));
        let version = 100 + i as u64;
        let body = envelope(
            &format!("e-siege-{i}"),
            "card-7",
            version,
            r#"{"stage":"ready"}"#,
        );
        let headers = standard_headers(SECRET, now_seconds(), &body);
        events.push(probe(
            &server.addr,
            "/events",
            &headers,
            body.as_bytes(),
            give_up,
        ));
        // One of each every 100 ms or so, over the siege's timeouts.
        std::thread::sleep(Duration::from_millis(100));
    }
    let opened = siege.stop();
    let ok = |a: &&Answered| a.status == 200;
    let first_try = |answers: &[Option<Answered>]| {
        answers
            .iter()
            .flatten()
            .filter(ok)
            .filter(|a| a.tries == 1)
            .count()
    };
    let in_time = |answers: &[Option<Answered>]| {
        answers
            .iter()
            .flatten()
            .filter(ok)
            .filter(|a| a.took <= within)
            .count()
    };
    let slowest = |answers: &[Option<Answered>]| answers.iter().flatten().map(|a| a.took).max();
    eprintln!(
        "siege of 1,100 connections ({opened} opened in all): answered 200 on the first try: \
         {} of {PROBES} health checks, {} of {PROBES} signed events; within 2 s (retrying \
         every 50 ms): {} and {}; slowest {:?} and {:?}",
        first_try(&health),
        first_try(&events),
        in_time(&health),
        in_time(&events),
        slowest(&health),
        slowest(&events),
    );
    for (what, answers) in [("health check", &health), ("signed event", &events)] {
        let first_try_in_time = answers
            .iter()
            .flatten()
            .filter(|a| a.status == 200 && a.tries == 1 && a.took <= within)
            .count();
        assert!(
            first_try_in_time >= 79,
            "{first_try_in_time} of {PROBES} {what}s answered on the first try within 2 s"
        );
        for (i, answer) in answers.iter().enumerate() {
            assert_eq!(
                answer.map(|a| a.status),
                Some(200),
                "{what} {i} of {PROBES}"
            );
        }
    }
    // Each event applied once (none cut after its decision and sent again).
    let metrics = server.get("/metrics").unwrap().body;
    assert_eq!(
        metric_in(
            &metrics,
            "snapshot_receiver_decisions_total{decision=\"applied\"}"
        ),
        PROBES as u64,
        "{metrics}"
    );
    assert_eq!(
        metric_in(
            &metrics,
            "snapshot_receiver_decisions_total{decision=\"duplicate\"}"
        ),
        0
    );
}

/// Issue 37 item 2, each rule at a ceiling of 4: a kept-alive connection
/// between requests, a half-sent head and a new connection with nothing
/// sent give way in the order they last changed (the kept-alive one at its
/// last answer); a request whose body is still arriving gives way only when
/// no connection without a request is left, and is answered `503
/// over_capacity` with `Retry-After`.
#[test]
fn at_the_ceiling_connections_without_a_request_give_way_oldest_first_then_bodies_still_arriving() {
    let server = Serve::start(
        &[
            "--store",
            "memory",
            "--max-connections",
            "4",
            "--header-timeout",
            "600",
            "--idle-timeout",
            "600",
            "--body-timeout",
            "600",
        ],
        None,
    );
    let addr = server.addr.as_str();
    let kept_alive = TcpStream::connect(addr).unwrap();
    assert_eq!(get_on(&kept_alive, "/healthz").0, "HTTP/1.1 200 OK\r\n");
    let half_sent = slow(addr).unwrap();
    // Accepted after the two above (the listener takes them in order).
    let body_a = body_awaited(addr);
    let idle = TcpStream::connect(addr).unwrap();
    // Each new one is reading its body before the next connects.
    let mut bodies = vec![body_a];
    for (i, gives_way) in [&kept_alive, &half_sent, &idle].into_iter().enumerate() {
        bodies.push(body_awaited(addr));
        assert!(
            closed_within(&mut gives_way.try_clone().unwrap(), Duration::from_secs(30)),
            "the connection unchanged longest without a request gives way ({i})"
        );
    }
    // Only bodies still arriving are left: the first gives way to this one.
    let asks = TcpStream::connect(addr).unwrap();
    let mut cut = String::new();
    bodies[0].read_to_string(&mut cut).unwrap();
    let (head, body) = cut.split_once("\r\n\r\n").unwrap();
    assert!(
        head.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{cut}"
    );
    let head = head.to_ascii_lowercase();
    assert!(head.contains("\r\nretry-after: 1"), "{cut}");
    assert!(head.contains("\r\nconnection: close"), "{cut}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(body).unwrap(),
        serde_json::json!({
            "error": "over_capacity",
            "detail": "the connection ceiling was reached while the request body was still \
                       arriving, and this request had waited longest for it; nothing was \
                       recorded: send it again after Retry-After seconds",
        })
    );
    for (i, stream) in bodies.iter().enumerate().skip(1) {
        assert!(!closed_now(stream), "body {i} still arriving is not cut");
    }
    let (status, metrics) = get_on(&asks, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK\r\n");
    for (series, expected) in [
        (
            "snapshot_receiver_http_connections_closed_total{reason=\"gave_way\"}",
            4,
        ),
        (
            "snapshot_receiver_http_rejects_total{reason=\"over_capacity\"}",
            1,
        ),
        ("snapshot_receiver_http_connections_over_ceiling_total", 0),
    ] {
        assert_eq!(metric_in(&metrics, series), expected, "{series}\n{metrics}");
    }
}

/// Without `--max-connections` the ceiling is the open-file limit minus 64:
/// with a limit of 100, 36 connections are held, and the 37th is let in by
/// closing the first.
#[test]
fn the_default_ceiling_is_the_open_file_limit_minus_64() {
    let server = Serve::start(
        &[
            "--store",
            "memory",
            "--header-timeout",
            "600",
            "--idle-timeout",
            "600",
        ],
        Some(100),
    );
    let held: Vec<TcpStream> = (0..36)
        .map(|_| TcpStream::connect(&server.addr).unwrap())
        .collect();
    let extra = TcpStream::connect(&server.addr).unwrap();
    // Asked on the 37th: one connection gave way to it, none before.
    let (_, metrics) = get_on(&extra, "/metrics");
    assert_eq!(
        metric_in(
            &metrics,
            "snapshot_receiver_http_connections_closed_total{reason=\"gave_way\"}"
        ),
        1,
        "{metrics}"
    );
    assert!(closed_within(
        &mut held[0].try_clone().unwrap(),
        Duration::from_secs(30)
    ));
    for (i, stream) in held.iter().enumerate().skip(1) {
        assert!(!closed_now(stream), "connection {i} is still open");
    }
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
    // Declared at the limit (1 MiB), sent nothing: once waited forever.
    let (status, text) = raw(
        &server.addr,
        b"POST /events HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n",
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

/// Issue 37 item 4: a body declared over the limit is answered 413 from its
/// head, unread: with `Expect: 100-continue` no `100 Continue` comes first
/// (it used to), and `Content-Length: 2147483648` with nothing sent is not
/// kept waiting for the body timeout (it used to get 408 after it). At the
/// limit, `100 Continue`, then the body is decided.
#[test]
fn a_body_declared_over_the_limit_is_413_at_once_without_100_continue() {
    let server = Serve::start(
        &[
            "--store",
            "memory",
            "--max-body-bytes",
            "512",
            "--body-timeout",
            "600",
        ],
        None,
    );
    for (expect, length) in [
        ("Expect: 100-continue\r\n", 513u64),
        ("Expect: 100-continue\r\n", 2_147_483_648),
        ("", 2_147_483_648),
    ] {
        let head = format!(
            "POST /events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Length: {length}\r\n{expect}\r\n"
        );
        // A 408 would come after 600 s: the read gives up after 60.
        let (status, text) = raw(&server.addr, head.as_bytes(), Duration::from_secs(60));
        let case = format!("{expect:?} {length}: {text}");
        assert_eq!(status, Some(413), "{case}");
        assert!(!text.contains("100 Continue"), "{case}");
        assert!(
            text.to_ascii_lowercase()
                .contains("\r\nconnection: close\r\n"),
            "{case}"
        );
        assert_eq!(
            json_of(&text),
            serde_json::json!({
                "event_id": null, "object_id": null, "decision": "reject",
                "reason": "body_too_large", "conflict": null, "original_decision": null,
                "version": null, "state": null, "paused": null, "replacement": false,
                "ack": "reject",
                "ack_meaning": format!(
                    "not recorded, not acknowledged: body is {length} bytes, over the limit of 512"
                ),
            }),
            "{case}"
        );
    }
    let body = envelope("e-1302", "card-7", 11, r#"{"stage":"ready"}"#);
    let body = format!("{body}{}", " ".repeat(512 - body.len()));
    let mut stream = TcpStream::connect(&server.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    stream
        .write_all(
            b"POST /events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 512\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n",
        )
        .unwrap();
    let mut continued = [0u8; 25];
    stream.read_exact(&mut continued).unwrap();
    assert_eq!(&continued, b"HTTP/1.1 100 Continue\r\n\r\n");
    stream.write_all(body.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert_eq!(json_of(&answer)["decision"], "applied", "{answer}");
    assert_eq!(
        server.metric("snapshot_receiver_http_rejects_total{reason=\"body_too_large\"}"),
        3
    );
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

/// Sends a request head declaring a body of `length` bytes for
/// `POST /events` with `Expect: 100-continue`: the stream and the server's
/// first answer, `100 Continue` (the body is reserved and being read) or
/// its refusal, read to the close.
fn head_expecting(addr: &str, length: usize) -> (TcpStream, String) {
    head_framed_expecting(addr, &format!("Content-Length: {length}"))
}

/// [`head_expecting`] with the body's framing header line given (such as
/// `Transfer-Encoding: chunked`).
fn head_framed_expecting(addr: &str, framing: &str) -> (TcpStream, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .write_all(
            format!(
                "POST /events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                 {framing}\r\nExpect: 100-continue\r\n\r\n"
            )
            .as_bytes(),
        )
        .unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut got = Vec::new();
    let mut byte = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        assert_eq!(stream.read(&mut byte).unwrap(), 1, "closed: {got:?}");
        got.push(byte[0]);
    }
    if !got.starts_with(b"HTTP/1.1 100 ") {
        stream.read_to_end(&mut got).unwrap();
    }
    (stream, String::from_utf8(got).unwrap())
}

/// [`head_expecting`] again every 20 ms until it is answered `100
/// Continue` (a reservation given back when a client went away is given
/// back once the server saw it go), 30 s at most: the stream.
fn head_admitted(addr: &str, length: usize) -> TcpStream {
    let start = Instant::now();
    loop {
        let (stream, answer) = head_expecting(addr, length);
        if answer == "HTTP/1.1 100 Continue\r\n\r\n" {
            return stream;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "a body of {length} bytes still refused after 30 s: {answer}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A `card.snapshot` delivery for the unknown object `object_id` at
/// `version` (parked: a waiting body always gets in when none waits in its
/// shard), padded to exactly `length` bytes.
fn delivery_of_length(event_id: &str, object_id: &str, version: u64, length: usize) -> String {
    let bare = envelope(event_id, object_id, version, r#"{"pad":""}"#);
    let pad = "x".repeat(length - bare.len());
    let body = envelope(
        event_id,
        object_id,
        version,
        &format!(r#"{{"pad":"{pad}"}}"#),
    );
    assert_eq!(body.len(), length);
    body
}

/// Bodies being received count against the queued part of the memory
/// budget from their head to their answer. With `--memory-budget 16MiB`
/// the part is 2,097,152 bytes, and a body reserves its `Content-Length`
/// plus 512 bytes: after one of 1 MiB (1,049,088 reserved), one of
/// 1,047,552 bytes fills the part exactly and is read, one byte more is
/// answered 503 `memory_full` at its head, unread (no `100 Continue`), and
/// so is a chunked body (it reserves the body limit).
/// What a client that went away had reserved comes back, and so does what
/// an answered body had.
#[test]
fn a_body_past_the_queued_part_is_503_memory_full_at_its_head_and_its_bytes_come_back() {
    const MIB: usize = 1 << 20;
    let rest = 2 * MIB - (MIB + 512) - 512;
    assert_eq!(rest, 1_047_552);
    let server = Serve::start(&["--store", "memory", "--memory-budget", "16MiB"], None);
    let addr = server.addr.as_str();
    let (first, answer) = head_expecting(addr, MIB);
    assert_eq!(answer, "HTTP/1.1 100 Continue\r\n\r\n");
    let (_, refused) = head_expecting(addr, rest + 1);
    let (head, body) = refused.split_once("\r\n\r\n").unwrap();
    assert!(
        head.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{refused}"
    );
    let head = head.to_ascii_lowercase();
    assert!(head.contains("\r\nretry-after: 1"), "{refused}");
    assert!(head.contains("\r\nconnection: close"), "{refused}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(body).unwrap(),
        serde_json::json!({
            "event_id": null,
            "object_id": null,
            "decision": "retry",
            "reason": "memory_full",
            "conflict": null,
            "original_decision": null,
            "version": null,
            "state": null,
            "paused": null,
            "replacement": false,
            "ack": "retry",
            "ack_meaning": "not recorded, redeliver: the memory budget for queued is full \
                            (2097152 bytes)",
        })
    );
    // A chunked body's length is not known before its end: it reserves the
    // body limit, 1 MiB, which does not fit either.
    let (_, chunked) = head_framed_expecting(addr, "Transfer-Encoding: chunked");
    assert!(
        chunked.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{chunked}"
    );
    let (exact, answer) = head_expecting(addr, rest);
    assert_eq!(
        answer, "HTTP/1.1 100 Continue\r\n\r\n",
        "fills the part exactly"
    );
    assert_eq!(
        server.metric("snapshot_receiver_http_rejects_total{reason=\"memory_full\"}"),
        2
    );
    // Both clients go away with their bodies unsent: their bytes come back.
    drop((first, exact));
    let mut whole = head_admitted(addr, MIB);
    // Both came back: 1,049,088 and 1,048,064 bytes fill the part again.
    let held = head_admitted(addr, rest);
    // A body read to its end and answered gives its bytes back before its
    // answer leaves: one of 1 MiB is read at once after it.
    whole
        .write_all(delivery_of_length("e-whole", "ghost", 1, MIB).as_bytes())
        .unwrap();
    let (status, body) = crate::serve::read_response(&mut BufReader::new(whole));
    assert_eq!(
        status,
        "HTTP/1.1 200 OK\r\n",
        "{}",
        String::from_utf8_lossy(&body)
    );
    let (_next, answer) = head_expecting(addr, MIB);
    assert_eq!(
        answer, "HTTP/1.1 100 Continue\r\n\r\n",
        "the answered body's bytes came back"
    );
    drop(held);
}

/// The resident size of process `pid` now and its peak so far (`VmRSS`,
/// `VmHWM` of /proc/PID/status), in bytes.
pub(crate) fn resident(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.trim().strip_suffix(" kB"))
            .and_then(|kib| kib.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/{pid}/status"))
            * 1024
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// `POST /events` of `body` with `headers` as a careful client sends it:
/// the head with `Expect: 100-continue`, the body only after `100
/// Continue`. The final answer's status line and body (a refusal at the
/// head is read to the close).
fn post_expecting(addr: &str, headers: &[(&str, String)], body: &[u8]) -> (String, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let mut head = format!(
        "POST /events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nExpect: 100-continue\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let (status, answer) = crate::serve::read_response(&mut reader);
    if !status.starts_with("HTTP/1.1 100 ") {
        return (status, String::from_utf8(answer).unwrap());
    }
    stream.write_all(body).unwrap();
    let (status, answer) = crate::serve::read_response(&mut reader);
    (status, String::from_utf8(answer).unwrap())
}

/// Bodies still arriving or not yet authenticated are inside the memory
/// budget. With `--memory-budget 64MiB` and a secret, 600 connections each
/// send a head with a wrong signature, `Content-Length: 1048576` and all
/// of the body but its last byte (before: each body was read whole before
/// its signature was checked, 1,177 MiB resident); then 64 signed bodies of
/// 1 MiB are sent at once (before: 138 to 201 MiB over the budget). The
/// queued part (8 MiB) lets 7 of the 600 in, the other 593 are answered
/// 503 `memory_full` at their head; every signed body is answered 200 or
/// 503 `memory_full`, some 200; and the server's peak resident size stays
/// within 64 MiB of what it was before the siege.
#[test]
fn six_hundred_wrongly_signed_bodies_and_64_signed_ones_at_once_stay_inside_the_memory_budget() {
    const MIB: usize = 1 << 20;
    const SIEGE: usize = 600;
    raise_own_file_limit(2048);
    let server = Serve::start(
        &[
            "--store",
            "memory",
            "--memory-budget",
            "64MiB",
            "--webhook-secret",
            SECRET,
            "--body-timeout",
            "600",
        ],
        None,
    );
    let addr = server.addr.as_str();
    let pid = server.child.id();
    // Warm: one answered delivery of each kind.
    let warm = delivery_of_length("e-warm", "ghost", 1, 1000);
    let signed = standard_headers(SECRET, now_seconds(), &warm);
    assert_eq!(
        post_expecting(addr, &signed, warm.as_bytes()).0,
        "HTTP/1.1 200 OK\r\n"
    );
    let (start, _) = resident(pid);
    let wrong = vec![
        ("webhook-id", "msg_wrong".to_owned()),
        ("webhook-timestamp", now_seconds().to_string()),
        (
            "webhook-signature",
            "v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=".to_owned(),
        ),
    ];
    let mut head = format!(
        "POST /events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {MIB}\r\n"
    );
    for (name, value) in &wrong {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut siege: Vec<(TcpStream, usize)> = (0..SIEGE)
        .map(|_| {
            let mut stream = TcpStream::connect(addr).unwrap();
            stream.write_all(head.as_bytes()).unwrap();
            stream.set_nonblocking(true).unwrap();
            (stream, MIB - 1)
        })
        .collect();
    // Every body sent but its last byte, or its connection closed by the
    // server; round robin, as far as each socket takes.
    let chunk = vec![b' '; 64 * 1024];
    let began = Instant::now();
    while siege.iter().any(|(_, left)| *left > 0) {
        assert!(
            began.elapsed() < Duration::from_secs(300),
            "the siege's bodies not sent within 300 s"
        );
        let mut progressed = false;
        for (stream, left) in siege.iter_mut().filter(|(_, left)| *left > 0) {
            match stream.write(&chunk[..(*left).min(chunk.len())]) {
                Ok(n) => {
                    *left -= n;
                    progressed |= n > 0;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                // Answered at its head and closed.
                Err(_) => *left = 0,
            }
        }
        if !progressed {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    // The server reads what the kernel still buffers: wait until its
    // resident size has not grown for a second (15 s at most).
    let (mut during, _) = resident(pid);
    let (mut grew, settling) = (Instant::now(), Instant::now());
    while grew.elapsed() < Duration::from_secs(1) && settling.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(100));
        let (now, _) = resident(pid);
        if now > during {
            (during, grew) = (now, Instant::now());
        }
    }
    let (_, peak_siege) = resident(pid);
    assert!(
        peak_siege <= start + 64 * MIB as u64,
        "peak resident {:.1} MiB during the siege, more than 64 MiB over the {:.1} MiB before it",
        peak_siege as f64 / MIB as f64,
        start as f64 / MIB as f64,
    );
    let refused = 593;
    let metrics = server.get("/metrics").unwrap().body;
    assert_eq!(
        metric_in(
            &metrics,
            "snapshot_receiver_http_rejects_total{reason=\"memory_full\"}"
        ),
        refused,
        "{metrics}"
    );
    // The 7 bodies let in go away unsent: their bytes come back (one of
    // 1 MiB is let in again; a second after that, the others too).
    drop(siege);
    drop(head_admitted(addr, MIB));
    std::thread::sleep(Duration::from_secs(1));
    let signed: Vec<(String, String)> = std::thread::scope(|scope| {
        let sends: Vec<_> = (0..64u64)
            .map(|n| {
                scope.spawn(move || {
                    let body = delivery_of_length(&format!("e-{n}"), &format!("ghost-{n}"), 1, MIB);
                    let headers = standard_headers(SECRET, now_seconds(), &body);
                    post_expecting(addr, &headers, body.as_bytes())
                })
            })
            .collect();
        sends.into_iter().map(|s| s.join().unwrap()).collect()
    });
    let mut ok = 0;
    for (status, body) in &signed {
        if status == "HTTP/1.1 200 OK\r\n" {
            ok += 1;
            continue;
        }
        assert_eq!(status, "HTTP/1.1 503 Service Unavailable\r\n", "{body}");
        let answer: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(answer["reason"], "memory_full", "{body}");
    }
    let (end, peak) = resident(pid);
    eprintln!(
        "resident MiB: start {:.1}, during the siege {:.1} (peak {:.1}), end {:.1}, peak {:.1}; \
         signed bodies answered 200: {ok} of 64",
        start as f64 / MIB as f64,
        during as f64 / MIB as f64,
        peak_siege as f64 / MIB as f64,
        end as f64 / MIB as f64,
        peak as f64 / MIB as f64,
    );
    assert!(ok > 0, "some signed body was decided: {signed:?}");
    assert!(
        peak <= start + 64 * MIB as u64,
        "peak resident {:.1} MiB, more than 64 MiB over the {:.1} MiB before the siege",
        peak as f64 / MIB as f64,
        start as f64 / MIB as f64,
    );
}
