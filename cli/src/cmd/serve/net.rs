//! The listener: serve's own accept loop over hyper's HTTP/1.1 connections,
//! with the limits `axum::serve` does not expose.
//!
//! The limits, what happens when each is exceeded and the counters are one
//! table in `docs/DEPLOYMENT.md` (*`serve` facing senders directly*, and
//! *Metrics*).
//!
//! The header timeout is hyper's (`http1::Builder::header_read_timeout`):
//! it runs from the accept, or from the previous response on a kept-alive
//! connection, until the request head is complete. The idle timeout is this
//! module's: a connection with no request in flight and no byte of a new
//! request is closed after it. The body deadline (`guard`) runs from the
//! request head to the body's last byte, whatever the rate.
//!
//! hyper drops `Content-Length` when a head also has `Transfer-Encoding`
//! (RFC 9112 §6.3: the body is read as chunked, the connection closed after)
//! and hands the request on; the head is the only place the two are seen
//! together, so the connection's reader scans the head lines itself
//! ([`FramingScan`]) and the request is refused, as RFC 9112 §6.3 allows a
//! server to (a request smuggling attempt through a proxy in front).
//!
//! On shutdown ([`serve`]'s `close` token): the listener closes, every
//! connection without a request in flight is closed at once (slow heads,
//! idle keep-alives), bodies still being read end with `503 stopping`, and
//! the requests in flight get the drain window; then what is left is closed.

use super::{json_response, App};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use http_body::Frame;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

/// File descriptors the default connection ceiling leaves to everything
/// else: the store's files or sockets and its reader's, stdio and logs, the
/// runtime's own (epoll, signal pipe), the listener.
pub(crate) const FD_RESERVE: u64 = 64;

/// The ceiling when the open-file limit cannot be read or is unlimited.
const UNLIMITED_CEILING: usize = 65_536;

/// The front door's connection limits (flags of `serve`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NetLimits {
    /// From the accept (or the previous response) to a complete request head.
    pub(crate) header_timeout: Duration,
    /// From a complete request head to the body's last byte.
    pub(crate) body_timeout: Duration,
    /// How long a connection may wait with no request in flight and no
    /// byte of a new one.
    pub(crate) idle_timeout: Duration,
    /// Open connections at most; one more is closed at once.
    pub(crate) max_connections: usize,
}

/// The default connection ceiling: the process's soft open-file limit
/// (`RLIMIT_NOFILE`) minus [`FD_RESERVE`], at least 1.
// unsafe: std has no getrlimit; the libc call is the only way to read it.
#[allow(unsafe_code)]
pub(crate) fn default_max_connections() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes only into the struct it is given, which
    // lives for the call.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    if rc != 0 || limit.rlim_cur == libc::RLIM_INFINITY {
        return UNLIMITED_CEILING;
    }
    usize::try_from(limit.rlim_cur.saturating_sub(FD_RESERVE))
        .unwrap_or(UNLIMITED_CEILING)
        .max(1)
}

/// Scans the bytes a connection receives for a request head that names
/// both `Content-Length` and `Transfer-Encoding`.
///
/// Lines end at LF (CR LF included: httparse takes both); a block of lines
/// ends at an empty line, as a head does. Only the start of each line is
/// kept (as long as the longer name), so the scan needs no buffer beyond
/// that. Body bytes are scanned too: a body holding such lines followed by
/// an empty line is refused as well, which no sender's JSON body does.
#[derive(Debug, Default)]
pub(crate) struct FramingScan {
    /// The current line's first bytes, lowercased.
    start: [u8; FramingScan::KEEP],
    /// How many bytes of the current line were seen (saturating).
    len: usize,
    /// The current block named `Content-Length`.
    length: bool,
    /// The current block named `Transfer-Encoding`.
    encoding: bool,
}

impl FramingScan {
    /// Bytes kept of each line: `transfer-encoding:` is 18.
    const KEEP: usize = 18;

    /// Feeds `bytes`; true when a block with both headers ended in them.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> bool {
        let mut found = false;
        for &b in bytes {
            if b == b'\n' {
                found |= self.end_line();
                continue;
            }
            if let Some(slot) = self.start.get_mut(self.len) {
                *slot = b.to_ascii_lowercase();
            }
            self.len = self.len.saturating_add(1);
        }
        found
    }

    /// The line ended: classify it, or end the block on an empty line.
    fn end_line(&mut self) -> bool {
        let kept = self.start.get(..self.len.min(Self::KEEP)).unwrap_or(&[]);
        let mut found = false;
        if kept.is_empty() || kept == b"\r" {
            found = self.length && self.encoding;
            self.length = false;
            self.encoding = false;
        } else if kept.starts_with(b"content-length:") {
            self.length = true;
        } else if kept.starts_with(b"transfer-encoding:") {
            self.encoding = true;
        }
        self.len = 0;
        found
    }
}

/// What one connection's parts share: its reader, its requests and its
/// watchdog.
#[derive(Debug)]
struct Activity {
    /// Requests between their head and their response.
    in_flight: AtomicUsize,
    /// A byte arrived since the last response (a new request began).
    reading: AtomicBool,
    /// When the last response was made, or the connection accepted.
    last_done: Mutex<Instant>,
    /// A head on this connection named both length headers.
    ambiguous_length: AtomicBool,
    /// Wakes the watchdog when the above change.
    changed: tokio::sync::Notify,
}

impl Activity {
    fn new() -> Self {
        Self {
            in_flight: AtomicUsize::new(0),
            reading: AtomicBool::new(false),
            last_done: Mutex::new(Instant::now()),
            ambiguous_length: AtomicBool::new(false),
            changed: tokio::sync::Notify::new(),
        }
    }

    /// When the connection counts as idle for too long: `None` while a
    /// request is in flight or a new one is arriving.
    fn idle_deadline(&self, idle: Duration) -> Option<Instant> {
        if self.in_flight.load(Ordering::Acquire) != 0 || self.reading.load(Ordering::Acquire) {
            return None;
        }
        let since = *self.last_done.lock().unwrap_or_else(|e| e.into_inner());
        Some(since.checked_add(idle).unwrap_or(since))
    }

    /// A request's head arrived; the guard marks its response.
    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_one();
        InFlight(self.clone())
    }
}

/// One request in flight on a connection; dropped when its response is made.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        *self.0.last_done.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        self.0.reading.store(false, Ordering::Release);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.changed.notify_one();
    }
}

/// The read half of a connection's socket, watched: marks the arrival of a
/// new request's bytes and scans heads for ambiguous framing. (The write
/// half goes to hyper as it is, joined with this by `tokio::io::join`.)
struct Watched<S> {
    inner: S,
    activity: Arc<Activity>,
    scan: FramingScan,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let new = buf.filled().get(before..).unwrap_or(&[]);
            if !new.is_empty() {
                if !this.activity.reading.swap(true, Ordering::AcqRel) {
                    this.activity.changed.notify_one();
                }
                if this.scan.feed(new) {
                    this.activity
                        .ambiguous_length
                        .store(true, Ordering::Release);
                }
            }
        }
        polled
    }
}

/// Marks a request whose connection's head named both length headers
/// (read by [`guard`]).
#[derive(Clone, Copy, Debug)]
struct AmbiguousLength;

thread_local! {
    /// Set while a request's future is polled: the panic hook logs only the
    /// first panic of a request handler.
    static IN_REQUEST: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A future polled with [`IN_REQUEST`] set.
struct InRequest<F>(Pin<Box<F>>);

impl<F: std::future::Future> std::future::Future for InRequest<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let was = IN_REQUEST.with(|flag| flag.replace(true));
        let polled = self.0.as_mut().poll(cx);
        IN_REQUEST.with(|flag| flag.set(was));
        polled
    }
}

/// Panics of request handlers since the hook was installed.
static REQUEST_PANICS: AtomicUsize = AtomicUsize::new(0);
/// How many of them the hook wrote out (one).
static REQUEST_PANICS_LOGGED: AtomicUsize = AtomicUsize::new(0);

/// Installs the process's panic hook: a panic in a request handler (answered
/// 500 by the router's panic catcher) is written in full the first time and
/// only counted after that (`snapshot_receiver_http_panics_total`), so a
/// client repeating the request cannot flood the log; any other panic is
/// written as before.
pub(crate) fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !IN_REQUEST.with(std::cell::Cell::get) {
                previous(info);
            } else if REQUEST_PANICS.fetch_add(1, Ordering::Relaxed) == 0 {
                REQUEST_PANICS_LOGGED.fetch_add(1, Ordering::Relaxed);
                previous(info);
                tracing::error!(
                    "a request handler panicked (answered 500); further handler panics are \
                     counted in snapshot_receiver_http_panics_total, not logged"
                );
            }
        }));
    });
}

/// The answer to a request whose handler panicked.
pub(crate) fn panic_response(_panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    metrics::counter!("snapshot_receiver_http_panics_total").increment(1);
    json_response(
        StatusCode::INTERNAL_SERVER_ERROR,
        &serde_json::json!({
            "error": "internal_error",
            "detail": "the request could not be handled; nothing was recorded for it",
        }),
    )
}

/// Why a request's body stopped being read ([`Deadline`]).
const BODY_READING: u8 = 0;
const BODY_TIMED_OUT: u8 = 1;
const BODY_STOPPING: u8 = 2;

/// A request body that ends in an error when its deadline passes or the
/// server stops listening, saying which in `tripped`.
struct Deadline {
    inner: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
    stop: Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
    tripped: Arc<AtomicU8>,
}

impl http_body::Body for Deadline {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame);
        }
        let why = if this.deadline.as_mut().poll(cx).is_ready() {
            BODY_TIMED_OUT
        } else if this.stop.as_mut().poll(cx).is_ready() {
            BODY_STOPPING
        } else {
            return Poll::Pending;
        };
        this.tripped.store(why, Ordering::Release);
        // The handler sees only that the body ended early; `guard` answers
        // from `tripped`, which says why.
        Poll::Ready(Some(Err(axum::Error::new(
            "the request body was cut by the body timeout or the shutdown",
        ))))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Middleware of every route: refuses a request whose head named both
/// length headers (400), and puts the body deadline on the request body
/// (408 when it passes, 503 when the server stops listening meanwhile).
pub(crate) async fn guard(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    if request.extensions().get::<AmbiguousLength>().is_some() {
        metrics::counter!("snapshot_receiver_http_rejects_total", "reason" => "ambiguous_length")
            .increment(1);
        return closing(json_response(
            StatusCode::BAD_REQUEST,
            &serde_json::json!({
                "error": "ambiguous_length",
                "detail": "the request head has both Content-Length and Transfer-Encoding \
                           (RFC 9112 section 6.3); nothing was recorded",
            }),
        ));
    }
    let tripped = Arc::new(AtomicU8::new(BODY_READING));
    let body_timeout = app.net.body_timeout;
    let request = request.map(|inner| {
        Body::new(Deadline {
            inner,
            deadline: Box::pin(tokio::time::sleep(body_timeout)),
            stop: Box::pin(app.closing.clone().cancelled_owned()),
            tripped: tripped.clone(),
        })
    });
    let response = next.run(request).await;
    match tripped.load(Ordering::Acquire) {
        BODY_TIMED_OUT => {
            metrics::counter!("snapshot_receiver_http_connections_closed_total", "reason" => "body_timeout")
                .increment(1);
            closing(json_response(
                StatusCode::REQUEST_TIMEOUT,
                &serde_json::json!({
                    "error": "body_timeout",
                    "detail": format!(
                        "the request body was not received within {} s; nothing was recorded",
                        body_timeout.as_secs_f64()
                    ),
                }),
            ))
        }
        BODY_STOPPING => {
            let mut response = closing(json_response(
                StatusCode::SERVICE_UNAVAILABLE,
                &serde_json::json!({
                    "error": "stopping",
                    "detail": "the server stopped before the request body was received; nothing was recorded",
                }),
            ));
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, app.retry_after.clone());
            response
        }
        _ => response,
    }
}

/// `response` with `Connection: close` (hyper then closes the connection
/// after it, whatever is left of the request unread).
fn closing(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// Serves `router` on `listener` within `limits` until `close` is
/// cancelled; then closes the idle and slow connections, waits up to
/// `drain` for the requests in flight, and closes the rest.
pub(crate) async fn serve(
    listener: TcpListener,
    router: axum::Router,
    limits: NetLimits,
    close: CancellationToken,
    drain: Duration,
) {
    let open = Arc::new(AtomicUsize::new(0));
    let mut connections = JoinSet::new();
    let mut accept_errors = 0u64;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    if open.load(Ordering::Acquire) >= limits.max_connections {
                        metrics::counter!("snapshot_receiver_http_connections_over_ceiling_total")
                            .increment(1);
                        drop(stream);
                        continue;
                    }
                    // Latency over throughput: answers are small.
                    let _ = stream.set_nodelay(true);
                    open.fetch_add(1, Ordering::AcqRel);
                    let (router, close, open) = (router.clone(), close.clone(), open.clone());
                    connections.spawn(async move {
                        connection(stream, router, limits, close).await;
                        open.fetch_sub(1, Ordering::AcqRel);
                    });
                }
                Err(e) => {
                    // Out of file descriptors (EMFILE) or the like: the
                    // accept would fail again at once; wait a little.
                    metrics::counter!("snapshot_receiver_http_accept_errors_total").increment(1);
                    if accept_errors == 0 {
                        tracing::warn!(error = %e, "cannot accept a connection (later failures are counted in snapshot_receiver_http_accept_errors_total)");
                    }
                    accept_errors = accept_errors.saturating_add(1);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            () = close.cancelled() => break,
        }
    }
    drop(listener);
    let drained = tokio::time::timeout(drain, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            "requests still in flight after {} s: closing their connections unanswered",
            drain.as_secs()
        );
        connections.shutdown().await;
    }
}

/// Serves one connection until it ends, a limit closes it, or `close`.
async fn connection(
    stream: tokio::net::TcpStream,
    router: axum::Router,
    limits: NetLimits,
    close: CancellationToken,
) {
    let (read_half, write_half) = stream.into_split();
    connection_halves(read_half, write_half, router, limits, close).await;
}

/// [`connection`] on a connection's two halves (a socket's, or an in-memory
/// pipe's in the tests, whose clock is paused).
async fn connection_halves<R, W>(
    read_half: R,
    write_half: W,
    router: axum::Router,
    limits: NetLimits,
    close: CancellationToken,
) where
    R: AsyncRead + Send + Unpin + 'static,
    W: tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(tokio::io::join(
        Watched {
            inner: read_half,
            activity: activity.clone(),
            scan: FramingScan::default(),
        },
        write_half,
    ));
    let service = hyper::service::service_fn({
        let activity = activity.clone();
        move |request: hyper::Request<Incoming>| {
            let in_flight = activity.begin();
            let mut request = request.map(Body::new);
            if activity.ambiguous_length.load(Ordering::Acquire) {
                request.extensions_mut().insert(AmbiguousLength);
            }
            let router = router.clone();
            InRequest(Box::pin(async move {
                let response = router.oneshot(request).await;
                drop(in_flight);
                response
            }))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let mut draining = false;
    let closed_by: Option<&'static str> = loop {
        let idle_at = activity.idle_deadline(limits.idle_timeout);
        tokio::select! {
            served = conn.as_mut() => break match served {
                Err(e) if e.is_timeout() => Some("header_timeout"),
                _ => None,
            },
            () = sleep_until(idle_at) => {
                if activity.idle_deadline(limits.idle_timeout).is_some_and(|at| at <= Instant::now()) {
                    break Some("idle_timeout");
                }
            }
            () = activity.changed.notified() => {}
            () = close.cancelled(), if !draining => {
                if activity.in_flight.load(Ordering::Acquire) == 0 {
                    break Some("shutdown");
                }
                conn.as_mut().graceful_shutdown();
                draining = true;
            }
        }
    };
    if let Some(reason) = closed_by {
        metrics::counter!("snapshot_receiver_http_connections_closed_total", "reason" => reason)
            .increment(1);
    }
}

/// Sleeps until `at`; never returns for `None`.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::{FramingScan, InRequest};
    use axum::body::Body;
    use axum::routing::get;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::time::Instant;
    use tower::ServiceExt as _;

    /// Issue 20 item 1: a panic in a handler used to drop the connection
    /// unanswered, uncounted, with a backtrace per request.
    #[test]
    fn a_handler_panic_is_answered_500_counted_and_logged_once() {
        super::install_panic_hook();
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        metrics::with_local_recorder(&recorder, || {
            runtime.block_on(async {
                let receiver = snapshot_receiver::Receiver::builder().build().unwrap();
                let app = Arc::new(super::super::App::for_tests(receiver, false));
                let routes = axum::Router::new().route(
                    "/boom",
                    get(|| async {
                        let ids: Vec<u64> = Vec::new();
                        ids[7].to_string()
                    }),
                );
                let router = super::super::layers(routes, app);
                for _ in 0..3 {
                    let request = axum::http::Request::get("/boom").body(Body::empty()).unwrap();
                    let response = InRequest(Box::pin(router.clone().oneshot(request)))
                        .await
                        .unwrap();
                    assert_eq!(response.status(), 500);
                    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                        .await
                        .unwrap();
                    assert_eq!(
                        &body[..],
                        br#"{"detail":"the request could not be handled; nothing was recorded for it","error":"internal_error"}"#
                    );
                }
            })
        });
        let metrics = handle.render();
        assert!(
            metrics
                .lines()
                .any(|l| l == "snapshot_receiver_http_panics_total 3"),
            "{metrics}"
        );
        assert_eq!(super::REQUEST_PANICS.load(Ordering::Relaxed), 3);
        assert_eq!(super::REQUEST_PANICS_LOGGED.load(Ordering::Relaxed), 1);
    }

    /// One connection to an app with `limits`, served over an in-memory
    /// pipe by [`super::connection_halves`] (a paused clock then governs
    /// every timer): the client's end.
    fn connected(limits: super::NetLimits) -> tokio::io::DuplexStream {
        let receiver = snapshot_receiver::Receiver::builder().build().unwrap();
        let mut app = super::super::App::for_tests(receiver, false);
        app.net = limits;
        let router = super::super::router(Arc::new(app));
        let (client, server) = tokio::io::duplex(64 * 1024);
        let (read_half, write_half) = tokio::io::split(server);
        tokio::spawn(super::connection_halves(
            read_half,
            write_half,
            router,
            limits,
            tokio_util::sync::CancellationToken::new(),
        ));
        client
    }

    /// Reads one response from `client`: its status line and body (`None`
    /// when the server closed the connection first).
    async fn response<S: tokio::io::AsyncRead + Unpin>(client: &mut S) -> Option<(String, String)> {
        use tokio::io::AsyncReadExt as _;
        let mut got = Vec::new();
        let mut byte = [0u8; 1];
        while !got.ends_with(b"\r\n\r\n") {
            if client.read(&mut byte).await.unwrap() == 0 {
                assert!(got.is_empty(), "closed within a response head: {got:?}");
                return None;
            }
            got.push(byte[0]);
        }
        let head = String::from_utf8(got).unwrap();
        let length: usize = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length: ")?
                    .parse()
                    .ok()
            })
            .unwrap();
        let mut body = vec![0u8; length];
        client.read_exact(&mut body).await.unwrap();
        let status = head.lines().next().unwrap().to_owned();
        Some((status, String::from_utf8(body).unwrap()))
    }

    fn limits(idle: u64, body: u64) -> super::NetLimits {
        super::NetLimits {
            header_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(body),
            idle_timeout: Duration::from_secs(idle),
            max_connections: 16,
        }
    }

    /// The idle timeout counts from the last response, not from the accept:
    /// a kept-alive connection asking every 0.6 s is served for 4.8 s with
    /// an idle timeout of 1 s, then closed 1 s after its last response.
    #[tokio::test(start_paused = true)]
    async fn the_idle_timeout_counts_from_the_last_response_not_from_the_accept() {
        use tokio::io::AsyncWriteExt as _;
        let mut client = connected(limits(1, 30));
        let accepted = Instant::now();
        for n in 0..8 {
            client
                .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "request {n}, {:?} after the accept: closed ({e})",
                        accepted.elapsed()
                    )
                });
            let answer = response(&mut client).await;
            assert_eq!(
                answer,
                Some((
                    "HTTP/1.1 200 OK".to_owned(),
                    r#"{"status":"ok"}"#.to_owned()
                )),
                "request {n}, {:?} after the accept",
                accepted.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(600)).await;
        }
        assert_eq!(accepted.elapsed(), Duration::from_millis(4800));
        // 0.6 s since the last response; closed 0.4 s later.
        assert_eq!(response(&mut client).await, None);
        let closed = accepted.elapsed();
        assert!(
            (Duration::from_millis(5200)..=Duration::from_millis(5201)).contains(&closed),
            "closed {closed:?} after the accept"
        );
    }

    /// The body deadline is one deadline for the whole body: a body dripped
    /// a byte every 0.3 s, far more often than the 2 s deadline, is cut
    /// 2 s after its head with 408, after 7 of its 100 bytes.
    #[tokio::test(start_paused = true)]
    async fn a_body_dripped_in_past_the_body_deadline_is_408_however_often_a_chunk_arrives() {
        use std::sync::atomic::AtomicUsize;
        use tokio::io::AsyncWriteExt as _;
        let client = connected(limits(5, 2));
        let (mut reader, mut writer) = tokio::io::split(client);
        writer
            .write_all(b"POST /events HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
            .await
            .unwrap();
        let head_sent = Instant::now();
        let dripped = Arc::new(AtomicUsize::new(0));
        let drip = tokio::spawn({
            let dripped = dripped.clone();
            async move {
                for _ in 0..100 {
                    if writer.write_all(b" ").await.is_err() {
                        return;
                    }
                    dripped.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
        });
        let answer = response(&mut reader).await.unwrap();
        let answered = head_sent.elapsed();
        assert_eq!(
            answer,
            (
                "HTTP/1.1 408 Request Timeout".to_owned(),
                r#"{"detail":"the request body was not received within 2 s; nothing was recorded","error":"body_timeout"}"#
                    .to_owned()
            ),
            "answered {answered:?} after the head, {} bytes dripped",
            dripped.load(Ordering::Relaxed)
        );
        assert!(
            (Duration::from_secs(2)..=Duration::from_millis(2001)).contains(&answered),
            "answered {answered:?} after the head"
        );
        assert_eq!(dripped.load(Ordering::Relaxed), 7);
        drip.abort();
    }

    fn scan(input: &[&[u8]]) -> bool {
        let mut scan = FramingScan::default();
        input
            .iter()
            .fold(false, |found, bytes| found | scan.feed(bytes))
    }

    #[test]
    fn both_length_headers_in_one_head_are_seen_in_any_order_case_and_split() {
        let head = b"POST /events HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert!(scan(&[head]));
        let reversed =
            b"POST /events HTTP/1.1\r\ntransfer-encoding: chunked\r\nCONTENT-LENGTH: 5\r\n\r\n";
        assert!(scan(&[reversed]));
        // Bare LF line ends (httparse takes them), one byte at a time.
        let lf = b"POST / HTTP/1.1\nContent-Length: 5\nTransfer-Encoding: chunked\n\n";
        let bytes: Vec<&[u8]> = lf.chunks(1).collect();
        assert!(scan(&bytes));
        // Not before the head is complete.
        assert!(!scan(&[
            b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n"
        ]));
    }

    #[test]
    fn one_length_header_per_head_is_fine_across_kept_alive_requests() {
        let two = b"POST /events HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}\
                    POST /events HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n";
        assert!(!scan(&[two]));
        // A header merely starting like one, or a value naming the other.
        let near = b"GET / HTTP/1.1\r\nContent-Lengthy: 1\r\nX-Note: transfer-encoding: chunked\r\nContent-Length: 0\r\n\r\n";
        assert!(!scan(&[near]));
    }
}
