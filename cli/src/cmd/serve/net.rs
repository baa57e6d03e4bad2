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
//! At the connection ceiling (`--max-connections`) the connections that
//! have no request in flight, kept-alive ones waiting for their next
//! request and new ones still sending their head, give way to a new
//! connection, the one unchanged for the longest first; after them the
//! requests whose body is still arriving (answered `503 over_capacity`).
//! A request being decided is never cut. When nothing can give way, a few
//! spare connections ([`SPARE`]) answer the probes and refuse everything
//! else with `503 over_capacity`. The order is nginx's (it closes its idle
//! keep-alive and not-yet-read connections, least recently used first,
//! when its connections run short), extended to heads still arriving,
//! which nginx keeps; docs/DEPLOYMENT.md says why.
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
use snapshot_receiver::core::engine::{Reservation, QUEUED_OVERHEAD};
use snapshot_receiver::{Outcome, Receipt, RetryReason};
use std::collections::{HashMap, HashSet};
use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
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
/// runtime's own (epoll, signal pipe), the listener, the [`SPARE`]
/// connections and those still closing after giving way ([`MAX_CLOSING`]).
pub(crate) const FD_RESERVE: u64 = 64;

/// The ceiling when the open-file limit cannot be read or is unlimited.
const UNLIMITED_CEILING: usize = 65_536;

/// Connections accepted past the ceiling when none under it can give way
/// (every one has a request being decided): they answer `/healthz` and
/// `/readyz`, refuse the rest with `503 over_capacity`, and close after one
/// answer. Taken from [`FD_RESERVE`].
pub(crate) const SPARE: usize = 8;

/// Connections told to give way whose descriptors are not yet closed, at
/// most; past it a new connection is not let in by closing another. Taken
/// from [`FD_RESERVE`] (with [`SPARE`], 24 of its 64).
const MAX_CLOSING: usize = 16;

/// How long the accept loop waits for connections told to give way to
/// close when [`MAX_CLOSING`] of them still are; then the new connection
/// goes to the spares, or is closed at once.
const CLOSING_WAIT: Duration = Duration::from_secs(1);

/// The order of the connections' changes of state (accept, request head,
/// response): the lower, the longer ago. A counter rather than a clock: two
/// changes never tie, and the order is the order they happened in.
static CHANGES: AtomicU64 = AtomicU64::new(0);

/// The next change's place in [`CHANGES`].
fn next_change() -> u64 {
    CHANGES.fetch_add(1, Ordering::Relaxed)
}

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

/// What one connection's parts share: its reader, its requests, its
/// watchdog and the accept loop.
#[derive(Debug)]
struct Activity {
    /// Requests between their head and their response.
    in_flight: AtomicUsize,
    /// A byte arrived since the last response (a new request began).
    reading: AtomicBool,
    /// When the last response was made, or the connection accepted.
    last_done: Mutex<Instant>,
    /// The place in [`CHANGES`] of its last accept, head or response.
    changed_at: AtomicU64,
    /// A request's body has not been read to its end.
    body_pending: AtomicBool,
    /// Cancelled by the accept loop when this connection gives way to a
    /// new one at the ceiling.
    give_way: CancellationToken,
    /// A head on this connection named both length headers.
    ambiguous_length: AtomicBool,
    /// Wakes the watchdog when the above change.
    changed: tokio::sync::Notify,
}

/// Where a connection stands in the order connections give way at the
/// ceiling: its class (0: no request in flight, idle or sending its head;
/// 1: a request whose body is still arriving), then its last change of
/// state ([`CHANGES`]); the lowest gives way first.
type Rank = (u8, u64);

impl Activity {
    fn new() -> Self {
        Self {
            in_flight: AtomicUsize::new(0),
            reading: AtomicBool::new(false),
            last_done: Mutex::new(Instant::now()),
            changed_at: AtomicU64::new(next_change()),
            body_pending: AtomicBool::new(false),
            give_way: CancellationToken::new(),
            ambiguous_length: AtomicBool::new(false),
            changed: tokio::sync::Notify::new(),
        }
    }

    /// Its [`Rank`]; `None` while a request is being decided (its body
    /// read, its answer not yet made): that one never gives way.
    fn rank(&self) -> Option<Rank> {
        let at = self.changed_at.load(Ordering::Acquire);
        if self.in_flight.load(Ordering::Acquire) == 0 {
            Some((0, at))
        } else if self.body_pending.load(Ordering::Acquire) {
            Some((1, at))
        } else {
            None
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

    /// A request's head arrived (with a body still to read when
    /// `body_pending`); the guard marks its response.
    fn begin(self: &Arc<Self>, body_pending: bool) -> InFlight {
        self.body_pending.store(body_pending, Ordering::Release);
        self.changed_at.store(next_change(), Ordering::Release);
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
        self.0.body_pending.store(false, Ordering::Release);
        self.0.changed_at.store(next_change(), Ordering::Release);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.changed.notify_one();
    }
}

/// A request body that marks its connection's [`Activity::body_pending`]
/// false once it is read to its end (or fails).
struct Tracked {
    inner: Incoming,
    activity: Arc<Activity>,
}

impl http_body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        let ended = match &polled {
            Poll::Ready(None | Some(Err(_))) => true,
            Poll::Ready(Some(Ok(_))) => this.inner.is_end_stream(),
            Poll::Pending => false,
        };
        if ended {
            this.activity.body_pending.store(false, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Where a new connection goes at the ceiling ([`admission`]); `K` names
/// a connection of the pools.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Admission<K> {
    /// Under the ceiling: it is served.
    Open,
    /// At the ceiling: `K` gives way, and it is served.
    Replace(K),
    /// At the ceiling, nothing can give way: a spare connection.
    Spare,
    /// The spares are full too: the spare `K` gives way to it.
    ReplaceSpare(K),
    /// Closed at once, unanswered.
    Refuse,
}

/// The connection of `pool` that gives way first: the lowest [`Rank`].
fn first_to_give_way<K: Copy>(pool: &HashMap<K, Arc<Activity>>) -> Option<K> {
    pool.iter()
        .filter_map(|(key, activity)| Some((activity.rank()?, *key)))
        .min_by_key(|(rank, _)| *rank)
        .map(|(_, key)| key)
}

/// Where a new connection goes, given the connections under the ceiling
/// (`open`, at most `ceiling`), the spares, and how many connections that
/// gave way are still closing.
fn admission<K: Copy>(
    open: &HashMap<K, Arc<Activity>>,
    ceiling: usize,
    spare: &HashMap<K, Arc<Activity>>,
    closing: usize,
) -> Admission<K> {
    if open.len() < ceiling {
        return Admission::Open;
    }
    let may_close = closing < MAX_CLOSING;
    if let Some(key) = first_to_give_way(open).filter(|_| may_close) {
        return Admission::Replace(key);
    }
    if spare.len() < SPARE {
        return Admission::Spare;
    }
    match first_to_give_way(spare).filter(|_| may_close) {
        Some(key) => Admission::ReplaceSpare(key),
        None => Admission::Refuse,
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

/// Marks a request on a spare connection (read by [`guard`]).
#[derive(Clone, Copy, Debug)]
struct OnSpare;

/// A request's connection's [`Activity::give_way`] (read by [`guard`]: a
/// body still arriving when it is cancelled ends with `503 over_capacity`).
#[derive(Clone, Debug)]
struct GiveWay(CancellationToken);

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
const BODY_GAVE_WAY: u8 = 3;

/// A request body that ends in an error when its deadline passes, the
/// server stops listening or its connection gives way at the ceiling,
/// saying which in `tripped`.
struct Deadline {
    inner: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
    stop: Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
    give_way: Option<Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>>,
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
        } else if this
            .give_way
            .as_mut()
            .is_some_and(|gave| gave.as_mut().poll(cx).is_ready())
        {
            BODY_GAVE_WAY
        } else {
            return Poll::Pending;
        };
        this.tripped.store(why, Ordering::Release);
        // The handler sees only that the body ended early; `guard` answers
        // from `tripped`, which says why.
        Poll::Ready(Some(Err(axum::Error::new(
            "the request body was cut by the body timeout, the shutdown or the connection ceiling",
        ))))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The `Content-Length` a request head declares, if it has one (hyper
/// refused the request already when it is not one decimal number).
fn declared_length(headers: &axum::http::HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// `503 over_capacity` with `Retry-After` and `Connection: close`, counted
/// in `snapshot_receiver_http_rejects_total{reason="over_capacity"}`.
fn over_capacity(app: &App, detail: &str) -> Response {
    metrics::counter!("snapshot_receiver_http_rejects_total", "reason" => "over_capacity")
        .increment(1);
    let mut response = closing(json_response(
        StatusCode::SERVICE_UNAVAILABLE,
        &serde_json::json!({"error": "over_capacity", "detail": detail}),
    ));
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, app.retry_after.clone());
    response
}

/// Reserves the bytes of `request`'s body from [`App::receiving`] (the
/// queued part of the memory budget) before a byte of it is read: its
/// `Content-Length`, or the body limit when it is sent chunked (its length
/// is not known before its end), plus [`QUEUED_OVERHEAD`]. `None` for a
/// request without a body. As in the receiver's own queue, a body always
/// gets in when nothing else is reserved.
fn body_reservation<'a>(
    app: &'a App,
    request: &Request,
) -> Option<Result<Reservation<'a>, RetryReason>> {
    if http_body::Body::is_end_stream(request.body()) {
        return None;
    }
    let length = declared_length(request.headers()).map_or(app.max_body_bytes, |size| {
        usize::try_from(size).unwrap_or(usize::MAX)
    });
    Some(
        app.receiving
            .reserve(length.saturating_add(QUEUED_OVERHEAD)),
    )
}

/// `503` with `Retry-After` and `Connection: close` for a request whose
/// body would pass the queued part of the memory budget, answered at its
/// head, its body unread: the receipt the receiver gives a delivery past
/// that part (`retry`, `memory_full`), without an event or object id (none
/// was read). Counted in
/// `snapshot_receiver_http_rejects_total{reason="memory_full"}`.
fn memory_full(app: &App, why: RetryReason) -> Response {
    metrics::counter!("snapshot_receiver_http_rejects_total", "reason" => "memory_full")
        .increment(1);
    let receipt = Receipt {
        event_id: None,
        object_id: None,
        outcome: Outcome::Retry(why),
        object: None,
        replacement: false,
        created: false,
    };
    closing(super::events::respond(app, &receipt))
}

/// Middleware of every route, before the body is read: refuses a request
/// whose head named both length headers (400) or declared a body over the
/// limit (413, so an `Expect: 100-continue` gets no `100 Continue` and a
/// declared length with no body waits for nothing), and a request on a
/// spare connection other than a probe (503 `over_capacity`), and a body
/// that would pass the queued part of the memory budget (503
/// `memory_full`, [`body_reservation`]); then puts the body deadline on
/// the request body (408 when it passes, 503 when the server stops
/// listening meanwhile or the connection gives way at the ceiling). The
/// body's reservation is held until the answer is made.
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
    let limit = u64::try_from(app.max_body_bytes).unwrap_or(u64::MAX);
    if let Some(size) = declared_length(request.headers()).filter(|&size| size > limit) {
        // Its body is left unread: the connection cannot carry another request.
        return closing(super::events::body_too_large(&app, size));
    }
    if request.extensions().get::<OnSpare>().is_some()
        && !matches!(request.uri().path(), "/healthz" | "/readyz")
    {
        return over_capacity(
            &app,
            "every connection under the ceiling has a request being decided; nothing was \
             recorded: send it again after Retry-After seconds",
        );
    }
    // Held until the answer is made: the body's bytes count against the
    // budget from its head on, whether or not it is ever authenticated.
    let _receiving = match body_reservation(&app, &request) {
        None => None,
        Some(Ok(reservation)) => Some(reservation),
        Some(Err(why)) => return memory_full(&app, why),
    };
    let tripped = Arc::new(AtomicU8::new(BODY_READING));
    let body_timeout = app.net.body_timeout;
    let give_way = request
        .extensions()
        .get::<GiveWay>()
        .map(|gave| Box::pin(gave.0.clone().cancelled_owned()));
    let request = request.map(|inner| {
        Body::new(Deadline {
            inner,
            deadline: Box::pin(tokio::time::sleep(body_timeout)),
            stop: Box::pin(app.closing.clone().cancelled_owned()),
            give_way,
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
        BODY_GAVE_WAY => over_capacity(
            &app,
            "the connection ceiling was reached while the request body was still arriving, \
             and this request had waited longest for it; nothing was recorded: send it again \
             after Retry-After seconds",
        ),
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

/// The connections of the accept loop, by their task.
type Pool = HashMap<tokio::task::Id, Arc<Activity>>;

/// Every connection of the accept loop: under the ceiling, the spares, and
/// those told to give way whose task has not ended (their descriptors are
/// still open).
#[derive(Default)]
struct Pools {
    open: Pool,
    spare: Pool,
    closing: HashSet<tokio::task::Id>,
}

impl Pools {
    /// Makes room for a new connection under `ceiling`: whether it goes to
    /// the spares, or `None` when it is to be closed at once. A connection
    /// told to give way is counted in
    /// `snapshot_receiver_http_connections_closed_total{reason="gave_way"}`.
    fn make_room(&mut self, ceiling: usize) -> Option<bool> {
        let (pool, on_spare, key) =
            match admission(&self.open, ceiling, &self.spare, self.closing.len()) {
                Admission::Open => return Some(false),
                Admission::Spare => return Some(true),
                Admission::Refuse => return None,
                Admission::Replace(key) => (&mut self.open, false, key),
                Admission::ReplaceSpare(key) => (&mut self.spare, true, key),
            };
        if let Some(activity) = pool.remove(&key) {
            activity.give_way.cancel();
            self.closing.insert(key);
            metrics::counter!("snapshot_receiver_http_connections_closed_total", "reason" => "gave_way")
                .increment(1);
        }
        Some(on_spare)
    }

    /// A connection's task ended: its place is free.
    fn ended(&mut self, done: Result<(tokio::task::Id, ()), tokio::task::JoinError>) {
        let key = match done {
            Ok((key, ())) => key,
            Err(e) => e.id(),
        };
        self.open.remove(&key);
        self.spare.remove(&key);
        self.closing.remove(&key);
    }
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
    let mut connections = JoinSet::new();
    let mut pools = Pools::default();
    let mut accept_errors = 0u64;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    // The places of connections that ended meanwhile are free.
                    while let Some(done) = connections.try_join_next_with_id() {
                        pools.ended(done);
                    }
                    // Those told to give way close when next polled: wait
                    // for them (the new one waits accepted) rather than
                    // refusing it for want of descriptors.
                    if pools.closing.len() >= MAX_CLOSING {
                        let _ = tokio::time::timeout(CLOSING_WAIT, async {
                            while pools.closing.len() >= MAX_CLOSING {
                                let Some(done) = connections.join_next_with_id().await else {
                                    break;
                                };
                                pools.ended(done);
                            }
                        })
                        .await;
                    }
                    let Some(on_spare) = pools.make_room(limits.max_connections) else {
                        metrics::counter!("snapshot_receiver_http_connections_over_ceiling_total")
                            .increment(1);
                        drop(stream);
                        continue;
                    };
                    // Latency over throughput: answers are small.
                    let _ = stream.set_nodelay(true);
                    let activity = Arc::new(Activity::new());
                    let task = connections.spawn(connection(
                        stream,
                        router.clone(),
                        limits,
                        close.clone(),
                        activity.clone(),
                        on_spare,
                    ));
                    if on_spare {
                        metrics::counter!("snapshot_receiver_http_connections_spare_total").increment(1);
                        pools.spare.insert(task.id(), activity);
                    } else {
                        pools.open.insert(task.id(), activity);
                    }
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
            Some(done) = connections.join_next_with_id(), if !connections.is_empty() => {
                pools.ended(done);
            }
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

/// Serves one connection until it ends, a limit closes it, it gives way
/// at the ceiling (`activity.give_way`), or `close`. A spare connection
/// (`on_spare`) serves one request.
async fn connection(
    stream: tokio::net::TcpStream,
    router: axum::Router,
    limits: NetLimits,
    close: CancellationToken,
    activity: Arc<Activity>,
    on_spare: bool,
) {
    let (read_half, write_half) = stream.into_split();
    connection_halves(
        read_half, write_half, router, limits, close, activity, on_spare,
    )
    .await;
}

/// [`connection`] on a connection's two halves (a socket's, or an in-memory
/// pipe's in the tests, whose clock is paused).
async fn connection_halves<R, W>(
    read_half: R,
    write_half: W,
    router: axum::Router,
    limits: NetLimits,
    close: CancellationToken,
    activity: Arc<Activity>,
    on_spare: bool,
) where
    R: AsyncRead + Send + Unpin + 'static,
    W: tokio::io::AsyncWrite + Send + Unpin + 'static,
{
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
            let in_flight = activity.begin(!http_body::Body::is_end_stream(request.body()));
            let mut request = request.map(|inner| {
                Body::new(Tracked {
                    inner,
                    activity: activity.clone(),
                })
            });
            let extensions = request.extensions_mut();
            extensions.insert(GiveWay(activity.give_way.clone()));
            if on_spare {
                extensions.insert(OnSpare);
            }
            if activity.ambiguous_length.load(Ordering::Acquire) {
                extensions.insert(AmbiguousLength);
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
        .keep_alive(!on_spare);
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
            // Counted by the accept loop when it told it to.
            () = activity.give_way.cancelled(), if !draining => {
                if activity.in_flight.load(Ordering::Acquire) == 0 {
                    break None;
                }
                // Its body, if still arriving, ends with 503 (`guard`);
                // the connection closes after the answer.
                conn.as_mut().graceful_shutdown();
                draining = true;
            }
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
    use super::{admission, Activity, Admission, FramingScan, InRequest, MAX_CLOSING, SPARE};
    use axum::body::Body;
    use axum::routing::get;
    use std::collections::HashMap;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::time::Instant;
    use tower::ServiceExt as _;

    /// A connection in one of the states of [`Activity::rank`], its last
    /// change at `at`.
    #[derive(Clone, Copy)]
    enum State {
        /// No request in flight (idle, or sending its head).
        Idle,
        /// A request whose body is still arriving.
        Body,
        /// A request being decided.
        Deciding,
    }

    fn conn(state: State, at: u64) -> Arc<Activity> {
        let activity = Activity::new();
        activity.changed_at.store(at, Ordering::Relaxed);
        match state {
            State::Idle => {}
            State::Body => {
                activity.in_flight.store(1, Ordering::Relaxed);
                activity.body_pending.store(true, Ordering::Relaxed);
            }
            State::Deciding => activity.in_flight.store(1, Ordering::Relaxed),
        }
        Arc::new(activity)
    }

    /// Connections named 0, 1, ... in the states given, changed at the
    /// times given.
    fn pool(states: &[(State, u64)]) -> HashMap<usize, Arc<Activity>> {
        states
            .iter()
            .enumerate()
            .map(|(key, (state, at))| (key, conn(*state, *at)))
            .collect()
    }

    /// Issue 37 item 2: the order in which connections give way at the
    /// ceiling.
    #[test]
    fn idle_and_half_sent_connections_give_way_first_oldest_first_then_bodies_never_decisions() {
        use State::{Body as B, Deciding as D, Idle as I};
        let none = HashMap::new();
        // Under the ceiling: no one gives way.
        assert_eq!(
            admission(&pool(&[(I, 1), (I, 2)]), 3, &none, 0),
            Admission::Open
        );
        // At it: the idle one unchanged longest, whatever the order of the
        // keys, and before a body older than it.
        let open = pool(&[(I, 9), (B, 1), (I, 4), (D, 0), (I, 7)]);
        assert_eq!(admission(&open, 5, &none, 0), Admission::Replace(2));
        // No idle one: the body waited for longest; never one being decided.
        let open = pool(&[(B, 8), (D, 1), (B, 3), (B, 5)]);
        assert_eq!(admission(&open, 4, &none, 0), Admission::Replace(2));
        // Every one being decided: a spare, while there is one.
        let deciding = pool(&[(D, 1), (D, 2)]);
        assert_eq!(admission(&deciding, 2, &none, 0), Admission::Spare);
        let spares: Vec<(State, u64)> = (0..SPARE as u64).map(|at| (D, at)).collect();
        let mut spares = spares;
        assert_eq!(
            admission(&deciding, 2, &pool(&spares), 0),
            Admission::Refuse
        );
        // The spares full: the spare unchanged longest without a request.
        spares[3] = (I, 40);
        spares[5] = (I, 30);
        assert_eq!(
            admission(&deciding, 2, &pool(&spares), 0),
            Admission::ReplaceSpare(5)
        );
        // Too many still closing: no one is told to give way.
        let open = pool(&[(I, 1), (I, 2)]);
        assert_eq!(
            admission(&open, 2, &none, MAX_CLOSING - 1),
            Admission::Replace(0)
        );
        assert_eq!(admission(&open, 2, &none, MAX_CLOSING), Admission::Spare);
        assert_eq!(
            admission(&deciding, 2, &pool(&spares), MAX_CLOSING),
            Admission::Refuse
        );
    }

    /// An answer is a change of state: of two idle connections, the one
    /// whose request head came first but whose answer was made last is not
    /// the one unchanged longest (the head alone would make it so).
    #[test]
    fn an_answer_counts_as_a_change_of_its_connection() {
        let answered = Arc::new(Activity::new());
        let in_flight = answered.begin(false);
        let idle = Arc::new(Activity::new());
        drop(idle.begin(false));
        drop(in_flight);
        let open: HashMap<usize, Arc<Activity>> = [(0, answered.clone()), (1, idle.clone())]
            .into_iter()
            .collect();
        assert_eq!(
            admission(&open, 2, &HashMap::new(), 0),
            Admission::Replace(1)
        );
    }

    /// Reads one answer from the kept-alive `stream` (a minute at most):
    /// its status line, or `None` when the server closed it first.
    async fn status_on(stream: &mut tokio::net::TcpStream) -> Option<String> {
        let answer = tokio::time::timeout(Duration::from_secs(60), response(stream))
            .await
            .expect("answered or closed within a minute");
        answer.map(|(status, _)| status)
    }

    /// At the ceiling of 2 connections: `a` sends its request head first,
    /// `b` connects after it and is answered, then `a` is answered. A third
    /// connection makes `b` give way (unchanged longest since its answer),
    /// not `a`, whose answer came last though its head came first.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn at_the_ceiling_the_connection_answered_last_stays_and_the_one_idle_longest_gives_way()
    {
        let Gated {
            addr,
            entered,
            release,
            close,
            server,
        } = gated(2).await;
        let healthz = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
        let ok = Some("HTTP/1.1 200 OK".to_owned());
        let mut a = tokio::net::TcpStream::connect(addr).await.unwrap();
        a.write_all(b"GET /decide HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        entered.await.unwrap();
        let mut b = tokio::net::TcpStream::connect(addr).await.unwrap();
        b.write_all(healthz).await.unwrap();
        assert_eq!(status_on(&mut b).await, ok);
        release.notify_one();
        assert_eq!(status_on(&mut a).await, ok);
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(healthz).await.unwrap();
        assert_eq!(
            status_on(&mut c).await,
            ok,
            "the third connection is served"
        );
        a.write_all(healthz).await.unwrap();
        assert_eq!(
            status_on(&mut a).await,
            ok,
            "a, answered last, is still open and served"
        );
        assert_eq!(status_on(&mut b).await, None, "b, idle longest, gave way");
        close.cancel();
        server.await.unwrap();
    }

    /// A server whose `GET /decide` holds its answer until `release` is
    /// notified (`entered` fires when it starts), beside `/healthz`, under a
    /// ceiling of `max_connections` and timeouts of an hour.
    struct Gated {
        addr: std::net::SocketAddr,
        entered: tokio::sync::oneshot::Receiver<()>,
        release: Arc<tokio::sync::Notify>,
        close: tokio_util::sync::CancellationToken,
        server: tokio::task::JoinHandle<()>,
    }

    async fn gated(max_connections: usize) -> Gated {
        let receiver = snapshot_receiver::Receiver::builder().build().unwrap();
        let app = Arc::new(super::super::App::for_tests(receiver, false));
        let (entered_tx, entered) = tokio::sync::oneshot::channel::<()>();
        let entered_tx = Arc::new(std::sync::Mutex::new(Some(entered_tx)));
        let release = Arc::new(tokio::sync::Notify::new());
        let routes = axum::Router::new()
            .route("/healthz", get(super::super::health::healthz))
            .route(
                "/decide",
                get({
                    let release = release.clone();
                    move || async move {
                        if let Some(tx) = entered_tx.lock().unwrap().take() {
                            tx.send(()).unwrap();
                        }
                        release.notified().await;
                        "decided"
                    }
                }),
            );
        let router = super::super::layers(routes, app);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hour = Duration::from_secs(3600);
        let limits = super::NetLimits {
            header_timeout: hour,
            body_timeout: hour,
            idle_timeout: hour,
            max_connections,
        };
        let close = tokio_util::sync::CancellationToken::new();
        let server = tokio::spawn(super::serve(listener, router, limits, close.clone(), hour));
        Gated {
            addr,
            entered,
            release,
            close,
            server,
        }
    }

    /// Writes `request` on a new connection to `addr` and reads until the
    /// server closes it (a minute at most: a broken variant fails rather
    /// than hangs).
    async fn exchange(addr: std::net::SocketAddr, request: &[u8]) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(request).await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(60), stream.read_to_end(&mut answer))
            .await
            .expect("answered and closed within a minute")
            .unwrap();
        String::from_utf8(answer).unwrap()
    }

    /// Issue 37 item 2: with every connection under the ceiling a request
    /// being decided, a spare connection answers `/healthz` and refuses a
    /// delivery with `503 over_capacity`; the request being decided is not
    /// cut.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_every_connection_deciding_a_spare_answers_the_probe_and_refuses_the_rest() {
        let Gated {
            addr,
            entered,
            release,
            close,
            server,
        } = gated(1).await;
        let deciding = tokio::spawn(exchange(
            addr,
            b"GET /decide HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        ));
        entered.await.unwrap();
        let probe = exchange(addr, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(probe.starts_with("HTTP/1.1 200 OK\r\n"), "{probe}");
        assert!(probe.ends_with("\r\n\r\n{\"status\":\"ok\"}"), "{probe}");
        let refused = exchange(
            addr,
            b"POST /decide HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
        )
        .await;
        assert!(
            refused.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{refused}"
        );
        let head = refused.to_ascii_lowercase();
        assert!(head.contains("\r\nretry-after: 1\r\n"), "{refused}");
        assert!(head.contains("\r\nconnection: close\r\n"), "{refused}");
        assert!(
            refused.ends_with(
                "{\"detail\":\"every connection under the ceiling has a request being decided; \
                 nothing was recorded: send it again after Retry-After seconds\",\
                 \"error\":\"over_capacity\"}"
            ),
            "{refused}"
        );
        release.notify_one();
        let decided = deciding.await.unwrap();
        assert!(decided.starts_with("HTTP/1.1 200 OK\r\n"), "{decided}");
        assert!(decided.ends_with("\r\n\r\ndecided"), "{decided}");
        close.cancel();
        server.await.unwrap();
    }

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
            Arc::new(super::Activity::new()),
            false,
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

    /// A connection whose next request has begun to arrive is not idle: its
    /// head, started 0.8 s after the last response and finished 0.5 s
    /// later (past the 1 s idle timeout, well within the 60 s header
    /// timeout), is answered.
    #[tokio::test(start_paused = true)]
    async fn a_request_head_arriving_past_the_idle_timeout_is_answered() {
        use tokio::io::AsyncWriteExt as _;
        let mut client = connected(limits(1, 30));
        let healthz = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
        let ok = Some((
            "HTTP/1.1 200 OK".to_owned(),
            r#"{"status":"ok"}"#.to_owned(),
        ));
        client.write_all(healthz).await.unwrap();
        assert_eq!(response(&mut client).await, ok);
        let answered = Instant::now();
        tokio::time::sleep(Duration::from_millis(800)).await;
        client.write_all(&healthz[..23]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        client.write_all(&healthz[23..]).await.unwrap();
        assert_eq!(response(&mut client).await, ok);
        assert_eq!(answered.elapsed(), Duration::from_millis(1300));
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
