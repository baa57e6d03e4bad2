//! Forwarding effects to the application over HTTP (`serve --forward URL`
//! and the `relay` command): a durable relay (docs/CONTRACT.md §10) whose
//! handler POSTs each effect, signed with Standard Webhooks under a secret
//! of its own, `webhook-id` = the effect id. An effect with a trace
//! context (the delivery's `traceparent`) is sent with a `traceparent`
//! continuing that trace: the same trace id and flags, the forward
//! attempt's own span id as the parent id (and the `tracestate` as it
//! came).
//!
//! An answer 2xx is a delivery; any other answer, no answer within the
//! timeout, or a connection that fails is a refusal, tried again on the
//! relay's schedule (a 429 or 503 with `Retry-After`, seconds or an HTTP
//! date, waits at least that long). Of an answer only the status and the
//! first [`ANSWER_LIMIT`] bytes of its body are read; a connection whose
//! answer goes on is closed. A kept-alive connection that the destination
//! closed is not a refusal: the request goes again on a new one. Requests
//! are paced to a rate per destination, so that a catch-up after downtime
//! does not flood the application.

use super::serve::{trace, webhook};
use crate::error::InputError;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use snapshot_receiver::relay::{HandlerError, HandlerFuture, RelayOptions, MAX_WAIT};
use snapshot_receiver::{Effect, TraceContext};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tracing::Instrument as _;

/// The environment variable holding the forwarding secret when no
/// `--forward-secret` is given.
pub(crate) const FORWARD_SECRET_ENV: &str = "SNAPSHOT_RECEIVER_FORWARD_SECRET";

/// How effects are forwarded: shared by `serve` and `relay`.
#[derive(clap::Args, Debug)]
pub(crate) struct ForwardArgs {
    /// POST every effect (state replacement) to this `http://HOST[:PORT]/PATH`,
    /// at least once, per object in version order, signed with Standard
    /// Webhooks (`webhook-id` = the effect id, stable across re-sends).
    #[arg(long, value_name = "URL")]
    pub(crate) forward: Option<String>,
    /// Publish every effect to JetStream on this NATS server instead
    /// (`nats://HOST:PORT`), to the subject `<--forward-subject>.<object>`
    /// with `Nats-Msg-Id` = the effect id; a stream must take those
    /// subjects.
    #[cfg(feature = "jetstream")]
    #[arg(long, value_name = "URL", conflicts_with = "forward")]
    pub(crate) forward_nats: Option<String>,
    /// The subjects' prefix for --forward-nats.
    #[cfg(feature = "jetstream")]
    #[arg(long, value_name = "PREFIX", default_value = "effects")]
    forward_subject: String,
    /// The secret effects are signed with, `whsec_<base64>` (default:
    /// SNAPSHOT_RECEIVER_FORWARD_SECRET). Not the secret deliveries are
    /// checked with.
    #[arg(long, value_name = "SECRET", env = FORWARD_SECRET_ENV, hide_env_values = true)]
    forward_secret: Option<String>,
    /// The relay's name in the store: its cursor and parked effects are
    /// kept under it, and a restarted relay of this name resumes there.
    #[arg(long, value_name = "NAME", default_value = "forward")]
    forward_relay: String,
    /// Seconds the relay's hold on its name lasts without being renewed
    /// (it renews it at every save, at least every third of it). A relay
    /// that crashed keeps its name this long: a restarted one resumes
    /// forwarding once it lapsed.
    #[arg(long, value_name = "SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..))]
    forward_lease: u64,
    /// Seconds an attempt may take (connect, send, answer) before it
    /// counts as refused.
    #[arg(long, value_name = "SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..))]
    forward_timeout: u64,
    /// The waits, in seconds, between a refused attempt and the next
    /// (comma-separated); an effect refused once more is parked `failed`
    /// until an operator retries or skips it.
    #[arg(
        long,
        value_name = "SECONDS,...",
        default_value = "5,300,1800,7200,18000,36000,36000"
    )]
    forward_schedule: String,
    /// Most requests per second to the destination.
    #[arg(long, value_name = "N", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..))]
    forward_rate: u64,
    /// Most objects whose effects are in flight at once (one effect per
    /// object at a time).
    #[arg(long, value_name = "N", default_value_t = 16,
          value_parser = clap::value_parser!(u64).range(1..=4096))]
    forward_concurrency: u64,
    /// When several effects of one object are waiting (the destination
    /// down or slow), send only the newest, its body's `replaces` naming
    /// the earlier ones (effect id, position, version). Off by default:
    /// for destinations that keep state, not for those that need every
    /// transition.
    #[arg(long)]
    forward_coalesce: bool,
}

/// A checked destination and the relay options to run it with.
pub(crate) struct Forward {
    /// The relay's options (name, schedule, concurrency).
    pub(crate) options: RelayOptions,
    /// The handler.
    pub(crate) destination: Target,
    /// The URL for the banner, its secrets hidden ([`crate::redact::url`]).
    pub(crate) url: String,
}

impl ForwardArgs {
    /// The destination, when `--forward` is given.
    ///
    /// # Errors
    /// An [`InputError`] naming the option: a URL that is not
    /// `http://HOST[:PORT]/...`, a missing or malformed secret, a schedule
    /// that is not whole seconds.
    pub(crate) fn resolve(&self) -> Result<Option<Forward>, InputError> {
        #[cfg(feature = "jetstream")]
        if let Some(url) = &self.forward_nats {
            let prefix = self.forward_subject.trim();
            if prefix.is_empty() || prefix.contains([' ', '*', '>']) || prefix.ends_with('.') {
                return Err(InputError::new(format!(
                    "--forward-subject {prefix:?}: not a subject prefix (no spaces, wildcards or trailing dot)"
                )));
            }
            return Ok(Some(Forward {
                options: self.options()?,
                destination: Target::Nats {
                    url: url.clone(),
                    prefix: prefix.to_owned(),
                },
                url: format!(
                    "{} (JetStream, subjects {prefix}.<object>)",
                    crate::redact::url(url)
                ),
            }));
        }
        let Some(url) = &self.forward else {
            return Ok(None);
        };
        let secret = self.forward_secret.clone().ok_or_else(|| {
            InputError::new(format!(
                "--forward needs a signing secret: --forward-secret whsec_... or {FORWARD_SECRET_ENV}"
            ))
        })?;
        let destination = HttpDestination::new(
            url,
            secret,
            Duration::from_secs(self.forward_timeout),
            self.forward_rate,
        )?;
        Ok(Some(Forward {
            options: self.options()?,
            destination: Target::Http(destination),
            url: crate::redact::url(url),
        }))
    }

    /// The relay's options: name, schedule, concurrency, coalescing, lease.
    fn options(&self) -> Result<RelayOptions, InputError> {
        let name = &self.forward_relay;
        if let Some(why) = RelayOptions::name_problem(name) {
            return Err(InputError::new(format!("--forward-relay {name:?}: {why}")));
        }
        Ok(RelayOptions {
            schedule: parse_schedule(&self.forward_schedule)?,
            concurrency: usize::try_from(self.forward_concurrency).unwrap_or(usize::MAX),
            coalesce: self.forward_coalesce,
            lease: Duration::from_secs(self.forward_lease),
            ..RelayOptions::new(self.forward_relay.clone())
        })
    }
}

/// Where a forwarding relay sends effects.
pub(crate) enum Target {
    /// POSTed over HTTP.
    Http(HttpDestination),
    /// Published to JetStream (connected when the relay starts).
    #[cfg(feature = "jetstream")]
    Nats {
        /// The NATS server.
        url: String,
        /// The subjects' prefix.
        prefix: String,
    },
}

impl Forward {
    /// Refuses a forwarding secret that is one of the secrets deliveries
    /// are checked with (`webhook_secrets`, read under `scheme`): whoever
    /// could check the effects' signatures could then sign deliveries.
    /// Compared as keys, so `whsec_` spellings of one key are one secret.
    ///
    /// # Errors
    /// An [`InputError`] naming both options (never the secret).
    pub(crate) fn check_secret_apart(
        &self,
        webhook_secrets: &[String],
        scheme: &webhook::Scheme,
    ) -> Result<(), InputError> {
        let Target::Http(http) = &self.destination else {
            return Ok(());
        };
        let standard = webhook::Scheme::Standard {
            tolerance: Duration::ZERO,
        };
        let Ok(key) = webhook::secret_key(&http.inner.secret, &standard) else {
            return Ok(());
        };
        if webhook_secrets
            .iter()
            .any(|s| webhook::secret_key(s, scheme).is_ok_and(|k| k == key))
        {
            return Err(InputError::new(
                "--forward-secret is one of the webhook secrets (--webhook-secret or \
                 SNAPSHOT_RECEIVER_WEBHOOK_SECRET): effects are signed with a secret of their \
                 own, or the application could sign deliveries to this server; make one with \
                 `openssl rand -base64 32` and give it as whsec_<base64>",
            ));
        }
        Ok(())
    }

    /// Starts the relay on `receiver`, whose deliveries are bodies of up
    /// to `max_body_bytes` bytes.
    ///
    /// # Errors
    /// An [`InputError`] when the destination cannot be reached at start
    /// (JetStream), its server's `max_payload` cannot take the effect of
    /// such a body (JetStream), or the relay cannot start.
    pub(crate) async fn start(
        self,
        receiver: &snapshot_receiver::Receiver,
        #[cfg_attr(not(feature = "jetstream"), allow(unused_variables))] max_body_bytes: usize,
    ) -> Result<snapshot_receiver::relay::Relay, InputError> {
        let started = match self.destination {
            Target::Http(http) => receiver.relay(self.options, http).await,
            #[cfg(feature = "jetstream")]
            Target::Nats { url, prefix } => {
                let nats =
                    snapshot_receiver::jetstream::JetStreamDestination::connect(&url, prefix)
                        .await
                        .map_err(|e| {
                            let why = crate::redact::in_text(&e.to_string(), &url);
                            InputError::new(format!("--forward-nats: {why}"))
                        })?;
                nats.check_body_limit(max_body_bytes).map_err(|e| {
                    InputError::new(format!(
                        "--forward-nats {}: {e} (the body limit is --max-body-bytes; \
                         max_payload is set in the NATS server's configuration)",
                        crate::redact::url(&url)
                    ))
                })?;
                receiver.relay(self.options, nats).await
            }
        };
        started.map_err(|e| InputError::new(format!("--forward: {e}")))
    }
}

/// `5,300,...` as waits; empty text is no retry at all.
fn parse_schedule(text: &str) -> Result<Vec<Duration>, InputError> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    text.split(',')
        .enumerate()
        .map(|(i, part)| {
            let bad = |why: &str| {
                InputError::new(format!(
                    "--forward-schedule {text:?}: entry {} ({:?}) {why}",
                    i + 1,
                    part.trim()
                ))
            };
            let wait = part
                .trim()
                .parse::<u64>()
                .map(Duration::from_secs)
                .map_err(|_| bad("is not whole seconds"))?;
            if wait > MAX_WAIT {
                return Err(bad("is above 86400 s (24 h), the longest wait"));
            }
            Ok(wait)
        })
        .collect()
}

/// Spaces requests `1 / rate` apart: each takes the next free slot.
struct Pacer {
    /// The gap between two requests.
    gap: Duration,
    /// The next free slot. A std mutex: held to take a slot, never across
    /// an await.
    next: Mutex<tokio::time::Instant>,
}

impl Pacer {
    fn new(rate: u64) -> Self {
        Self {
            gap: Duration::from_nanos(1_000_000_000 / rate.max(1)),
            next: Mutex::new(tokio::time::Instant::now()),
        }
    }

    /// Takes the first free slot at or after `now`.
    fn slot(&self, now: tokio::time::Instant) -> tokio::time::Instant {
        let mut next = self
            .next
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let slot = (*next).max(now);
        *next = slot + self.gap;
        slot
    }

    /// Waits for this request's slot.
    async fn wait(&self) {
        let slot = self.slot(tokio::time::Instant::now());
        tokio::time::sleep_until(slot).await;
    }
}

/// The most of an answer's body that is read: enough for a refusal's
/// excerpt and to reuse the connection after a short answer. A longer
/// body is not read on: its connection is closed.
const ANSWER_LIMIT: usize = 4096;

/// The most of an answer's body a refusal's message quotes, in bytes.
const EXCERPT_LIMIT: usize = 200;

/// One HTTP destination.
struct Destination {
    /// The request target effects are POSTed to: the URL's path and query.
    target: http::Uri,
    /// The `Host` header.
    host: String,
    /// Kept-alive connections to the destination's `host:port`.
    pool: super::pool::Pool<Full<Bytes>>,
    /// The Standard Webhooks secret (`whsec_...`), checked at start.
    secret: String,
    /// Most time one attempt may take.
    timeout: Duration,
    /// The rate limit.
    pacer: Pacer,
}

/// The relay handler that POSTs effects to one destination. Cheap to
/// clone.
#[derive(Clone)]
pub(crate) struct HttpDestination {
    inner: Arc<Destination>,
}

impl HttpDestination {
    /// A destination POSTing to `url` (`http://HOST[:PORT]/PATH`), signed
    /// with `secret` (`whsec_<base64>`), each attempt cut after `timeout`,
    /// at most `rate` requests per second.
    ///
    /// # Errors
    /// An [`InputError`] naming `--forward` or `--forward-secret`: a URL
    /// that is not `http://HOST[:PORT]/...`, a malformed secret.
    pub(crate) fn new(
        url: &str,
        secret: String,
        timeout: Duration,
        rate: u64,
    ) -> Result<Self, InputError> {
        let shown = crate::redact::url(url);
        let bad = |why: String| InputError::new(format!("--forward {shown:?}: {why}"));
        let uri: http::Uri = url.parse().map_err(|e| bad(format!("not a URL ({e})")))?;
        if uri.scheme_str() != Some("http") {
            return Err(bad(
                "only http:// is spoken; put a TLS-terminating proxy on loopback for https"
                    .to_owned(),
            ));
        }
        let authority = uri
            .authority()
            .ok_or_else(|| bad("no host".to_owned()))?
            .clone();
        if authority.as_str().contains('@') {
            return Err(bad(
                "a user name or password in the URL would travel in clear text; give the \
                 destination a path only it knows, or check the signature there"
                    .to_owned(),
            ));
        }
        let address = socket_address(&authority).map_err(bad)?;
        // Requests name the path and query only (origin form, RFC 9112
        // §3.2.1); the host goes in the Host header.
        let target: http::Uri = uri
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str)
            .parse()
            .map_err(|e| bad(format!("not a URL path ({e})")))?;
        webhook::standard_signature(&secret, "check", "0", b"")
            .map_err(|e| InputError::new(format!("--forward-secret: {e}")))?;
        Ok(Self {
            inner: Arc::new(Destination {
                target,
                host: authority.as_str().to_owned(),
                pool: super::pool::Pool::new(address),
                secret,
                timeout,
                pacer: Pacer::new(rate),
            }),
        })
    }
}

impl snapshot_receiver::relay::Handler for HttpDestination {
    fn handle(&self, effect: Effect) -> HandlerFuture {
        let inner = self.inner.clone();
        let span = super::serve::trace::forward_span(&effect);
        Box::pin(
            async move {
                inner.pacer.wait().await;
                let deadline = tokio::time::Instant::now() + inner.timeout;
                inner.post(&effect, deadline).await
            }
            .instrument(span),
        )
    }
}

impl Destination {
    /// The signed request for `body`, the effect `id`, with the attempt's
    /// trace context, if any.
    fn request(
        &self,
        id: &str,
        body: Bytes,
        trace: Option<&TraceContext>,
    ) -> Result<http::Request<Full<Bytes>>, HandlerError> {
        let timestamp = unix_seconds(SystemTime::now()).to_string();
        let signature = webhook::standard_signature(&self.secret, id, &timestamp, &body)
            .map_err(|e| HandlerError::new(format!("cannot sign: {e}")))?;
        let mut request = http::Request::post(self.target.clone())
            .header(http::header::HOST, &self.host)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(webhook::ID_HEADER, id)
            .header(webhook::TIMESTAMP_HEADER, &timestamp)
            .header(webhook::SIGNATURE_HEADER, &signature);
        if let Some(trace) = trace {
            request = request.header(trace::TRACEPARENT, trace.traceparent());
            if let Some(state) = trace.tracestate() {
                request = request.header(trace::TRACESTATE, state);
            }
        }
        request
            .body(Full::new(body))
            .map_err(|e| HandlerError::new(format!("cannot build the request: {e}")))
    }

    /// The effect signed and POSTed until its answer's head: the answer
    /// and the connection it came on (a kept-alive connection closed under
    /// it is replaced once: [`super::pool::Pool::send`]; the effect id makes
    /// this POST one the destination may see twice).
    async fn send(
        &self,
        effect: &Effect,
    ) -> Result<
        (
            super::pool::Connection<Full<Bytes>>,
            http::Response<hyper::body::Incoming>,
        ),
        HandlerError,
    > {
        let body = Bytes::from(
            serde_json::to_vec(effect)
                .map_err(|e| HandlerError::new(format!("the effect does not serialize: {e}")))?,
        );
        let id = effect.id.to_string();
        // One span id per attempt (a re-send on a new connection is the
        // same attempt).
        let trace = effect
            .trace
            .as_ref()
            .map(|t| trace::attempt(t, &tracing::Span::current()));
        self.pool
            .send(|| {
                self.request(&id, body.clone(), trace.as_ref())
                    .map_err(|e| e.message)
            })
            .await
            .map_err(HandlerError::new)
    }

    /// One attempt: the effect signed and POSTed, its answer's status
    /// taken, and at most [`ANSWER_LIMIT`] bytes of its body read, all
    /// before `deadline` (the head) or by then (the body: a body still
    /// coming then is cut, the status stands). A connection whose answer
    /// was read to its end goes back to the idle ones; any other is
    /// closed.
    async fn post(
        &self,
        effect: &Effect,
        deadline: tokio::time::Instant,
    ) -> Result<(), HandlerError> {
        let (connection, response) = tokio::time::timeout_at(deadline, self.send(effect))
            .await
            .map_err(|_| {
                HandlerError::new(format!("no answer within {} s", self.timeout.as_secs()))
            })??;
        let status = response.status();
        let retry_after = response
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|value| {
                let wait = value
                    .to_str()
                    .ok()
                    .and_then(|text| retry_after_wait(text, SystemTime::now()));
                if wait.is_none() {
                    tracing::debug!(
                        value = ?value,
                        "Retry-After is neither seconds nor an HTTP date; ignored"
                    );
                }
                wait
            });
        let mut excerpt = Vec::new();
        let whole =
            tokio::time::timeout_at(deadline, read_answer(response.into_body(), &mut excerpt))
                .await
                .unwrap_or(false);
        if whole {
            self.pool.put_back(connection);
        } else {
            drop(connection);
        }
        if status.is_success() {
            return Ok(());
        }
        let mut message = format!("HTTP {status}");
        let excerpt = quote(&excerpt);
        if !excerpt.is_empty() {
            message.push_str(": ");
            message.push_str(&excerpt);
        }
        let refusal = HandlerError::new(message);
        Err(match retry_after {
            Some(wait)
                if status == http::StatusCode::TOO_MANY_REQUESTS
                    || status == http::StatusCode::SERVICE_UNAVAILABLE =>
            {
                refusal.retry_after(wait)
            }
            _ => refusal,
        })
    }
}

/// Reads `body` into `into` until its end or [`ANSWER_LIMIT`] bytes:
/// whether it ended within them (and without an error).
async fn read_answer(mut body: hyper::body::Incoming, into: &mut Vec<u8>) -> bool {
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return false;
        };
        if let Some(data) = frame.data_ref() {
            let room = ANSWER_LIMIT.saturating_sub(into.len());
            into.extend_from_slice(&data[..data.len().min(room)]);
            if data.len() > room {
                return false;
            }
        }
    }
    true
}

/// The start of an answer's body for a refusal's message: at most
/// [`EXCERPT_LIMIT`] bytes, as UTF-8 (invalid bytes replaced), control
/// characters as spaces, trimmed; `...` after a cut.
fn quote(body: &[u8]) -> String {
    let cut = body.len() > EXCERPT_LIMIT;
    let text = String::from_utf8_lossy(&body[..body.len().min(EXCERPT_LIMIT)]);
    let mut text: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_owned();
    if cut && !text.is_empty() {
        text.push_str("...");
    }
    text
}

/// Seconds since the Unix epoch (0 before it): the Standard Webhooks
/// `webhook-timestamp`.
fn unix_seconds(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The wait a `Retry-After` value asks for, at `now` (RFC 9110 §10.2.3):
/// delay-seconds (digits only; too many to count is the longest wait the
/// relay takes), or an HTTP-date less `now`, zero for a date in the past.
/// An HTTP-date is an IMF-fixdate (`Fri, 31 Dec 1999 23:59:59 GMT`) or one
/// of the obsolete forms a recipient must accept (RFC 9110 §5.6.7:
/// `Friday, 31-Dec-99 23:59:59 GMT`, `Fri Dec 31 23:59:59 1999`). `None`
/// for anything else.
pub(crate) fn retry_after_wait(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return Some(value.parse::<u64>().map_or(MAX_WAIT, Duration::from_secs));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The `host:port` to connect to for an `http://` URL's `authority` (port
/// 80 when none is given; IPv6 brackets dropped).
///
/// # Errors
/// A port that is not a number from 1 to 65535, as a sentence.
pub(crate) fn socket_address(authority: &http::uri::Authority) -> Result<String, String> {
    let port = match authority.as_str().get(authority.host().len()..) {
        Some("") | None => 80,
        Some(_) => authority
            .port_u16()
            .filter(|p| *p > 0)
            .ok_or_else(|| "the port is not a number from 1 to 65535".to_owned())?,
    };
    Ok(format!(
        "{}:{port}",
        authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']'),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_parse_or_name_the_bad_entry() {
        assert_eq!(
            parse_schedule("5, 300,0").unwrap(),
            [
                Duration::from_secs(5),
                Duration::from_secs(300),
                Duration::ZERO
            ]
        );
        assert_eq!(parse_schedule("").unwrap(), Vec::<Duration>::new());
        assert_eq!(
            parse_schedule("5,5m").unwrap_err().to_string(),
            "--forward-schedule \"5,5m\": entry 2 (\"5m\") is not whole seconds"
        );
        assert_eq!(
            parse_schedule("86400,86401").unwrap_err().to_string(),
            "--forward-schedule \"86400,86401\": entry 2 (\"86401\") is above 86400 s (24 h), \
             the longest wait"
        );
    }

    /// The request names the path and query only (origin form), the host
    /// goes in `Host`, the port defaults to 80; a port out of range or
    /// credentials in the URL are refused by name.
    #[test]
    fn destinations_post_to_the_path_and_refuse_bad_ports_and_credentials() {
        const SECRET: &str = "whsec_c2VjcmV0LWJlaW5nLXJvdGF0ZWQtb3V0";
        let made = |url: &str| {
            HttpDestination::new(url, SECRET.to_owned(), Duration::from_secs(1), 10)
                .map(|d| {
                    let d = &d.inner;
                    (
                        d.target.to_string(),
                        d.host.clone(),
                        d.pool.address().to_owned(),
                    )
                })
                .map_err(|e| e.to_string())
        };
        assert_eq!(
            made("http://127.0.0.1:9000/effects?from=relay"),
            Ok((
                "/effects?from=relay".to_owned(),
                "127.0.0.1:9000".to_owned(),
                "127.0.0.1:9000".to_owned()
            ))
        );
        assert_eq!(
            made("http://[::1]/"),
            Ok(("/".to_owned(), "[::1]".to_owned(), "::1:80".to_owned()))
        );
        assert_eq!(
            made("http://app.internal"),
            Ok((
                "/".to_owned(),
                "app.internal".to_owned(),
                "app.internal:80".to_owned()
            ))
        );
        for port in ["99999", "0"] {
            let url = format!("http://127.0.0.1:{port}/effects");
            assert_eq!(
                made(&url),
                Err(format!(
                    "--forward {url:?}: the port is not a number from 1 to 65535"
                ))
            );
        }
        // Refused, and the password not repeated.
        assert_eq!(
            made("http://user:PASSWORD@127.0.0.1:9001/effects").unwrap_err(),
            "--forward \"http://user:***@127.0.0.1:9001/effects\": a user name or password in \
             the URL would travel in clear text; give the destination a path only it knows, or \
             check the signature there"
        );
    }

    /// `Retry-After` as seconds or as an HTTP-date in its three forms
    /// (RFC 9110 §10.2.3, §5.6.7); a date in the past is no wait; anything
    /// else is none.
    #[test]
    fn retry_after_is_seconds_or_an_http_date() {
        // Fri, 31 Dec 1999 23:59:47 GMT: 12 s before the dates below.
        let now = UNIX_EPOCH + Duration::from_secs(946_684_787);
        let wait = |text: &str| retry_after_wait(text, now);
        assert_eq!(wait("120"), Some(Duration::from_secs(120)));
        assert_eq!(wait(" 0 "), Some(Duration::ZERO));
        assert_eq!(wait("99999999999999999999999"), Some(MAX_WAIT));
        for date in [
            "Fri, 31 Dec 1999 23:59:59 GMT",
            "Friday, 31-Dec-99 23:59:59 GMT",
            "Fri Dec 31 23:59:59 1999",
        ] {
            assert_eq!(wait(date), Some(Duration::from_secs(12)), "{date}");
        }
        // Already past: no extra wait.
        assert_eq!(wait("Fri, 31 Dec 1999 23:59:00 GMT"), Some(Duration::ZERO));
        assert_eq!(wait("Sun, 06 Nov 1994 08:49:37 GMT"), Some(Duration::ZERO));
        for garbage in [
            "",
            "soon",
            "-5",
            "+5",
            "1.5",
            "5 s",
            "Fri, 31 Dec 1999 23:59:59 CET",
            "Fri, 32 Dec 1999 23:59:59 GMT",
            "31 Dec 1999 23:59:59",
        ] {
            assert_eq!(wait(garbage), None, "{garbage:?}");
        }
    }

    /// A refusal quotes the start of the answer's body on one line.
    #[test]
    fn a_refusal_quotes_the_start_of_the_answer() {
        assert_eq!(quote(b""), "");
        assert_eq!(
            quote(b"  {\"error\":\n\"db down\"}\r\n"),
            "{\"error\": \"db down\"}"
        );
        assert_eq!(quote(b"caf\xc3"), "caf\u{fffd}");
        let long = vec![b'x'; EXCERPT_LIMIT + 1];
        assert_eq!(quote(&long), format!("{}...", "x".repeat(EXCERPT_LIMIT)));
        // Exactly the limit: whole, nothing cut.
        let whole = vec![b'x'; EXCERPT_LIMIT];
        assert_eq!(quote(&whole), "x".repeat(EXCERPT_LIMIT));
    }

    /// Every forwarding option reaches the relay's options: a mutant
    /// that drops one (the defaults stand in) fails here.
    #[test]
    fn every_forwarding_option_reaches_the_relay() {
        #[derive(clap::Parser)]
        struct Command {
            #[command(flatten)]
            forward: ForwardArgs,
        }
        let args = <Command as clap::Parser>::try_parse_from([
            "forward",
            "--forward-relay",
            "app-1",
            "--forward-schedule",
            "1,2",
            "--forward-concurrency",
            "3",
            "--forward-lease",
            "7",
            "--forward-coalesce",
        ])
        .unwrap();
        let options = args.forward.options().unwrap();
        assert_eq!(
            (
                options.name.as_str(),
                options.schedule,
                options.concurrency,
                options.lease,
                options.coalesce
            ),
            (
                "app-1",
                vec![Duration::from_secs(1), Duration::from_secs(2)],
                3,
                Duration::from_secs(7),
                true
            )
        );
    }

    /// A forwarding secret equal to a webhook secret as a key (another
    /// `whsec_` spelling of it) is refused; one apart from every webhook
    /// secret passes.
    #[test]
    fn the_forwarding_secret_is_refused_only_when_it_is_a_webhook_secret() {
        const FORWARD: &str = "whsec_c2VjcmV0LWJlaW5nLXJvdGF0ZWQtb3V0";
        const SAME_KEY: &str = "whsec_ c2VjcmV0LWJlaW5nLXJvdGF0ZWQtb3V0 ";
        const OTHER: &str = "whsec_b3RoZXItc2VjcmV0LW9mLWRlbGl2ZXJpZXM=";
        let forward = Forward {
            options: RelayOptions::new("forward".to_owned()),
            destination: Target::Http(
                HttpDestination::new(
                    "http://127.0.0.1:9/hook",
                    FORWARD.to_owned(),
                    Duration::from_secs(1),
                    10,
                )
                .unwrap(),
            ),
            url: String::new(),
        };
        let scheme = webhook::Scheme::Standard {
            tolerance: Duration::from_secs(300),
        };
        let check = |secrets: &[&str]| {
            let secrets: Vec<String> = secrets.iter().map(|s| (*s).to_owned()).collect();
            forward
                .check_secret_apart(&secrets, &scheme)
                .map_err(|e| e.to_string())
        };
        assert_eq!(check(&[OTHER]), Ok(()));
        assert_eq!(check(&[]), Ok(()));
        let refused = check(&[OTHER, SAME_KEY]).unwrap_err();
        assert!(
            refused.starts_with("--forward-secret is one of the webhook secrets"),
            "{refused}"
        );
    }

    /// Requests wait for their slots: three at once at 4 per second take
    /// half a second on the (paused) clock.
    #[tokio::test(start_paused = true)]
    async fn requests_wait_for_their_slots() {
        let pacer = Pacer::new(4);
        let start = tokio::time::Instant::now();
        for _ in 0..3 {
            pacer.wait().await;
        }
        assert_eq!(start.elapsed(), Duration::from_millis(500));
    }

    #[test]
    fn the_pacer_spaces_requests_at_the_rate() {
        let pacer = Pacer::new(4);
        let start = tokio::time::Instant::now();
        let slots: Vec<Duration> = (0..5).map(|_| pacer.slot(start) - start).collect();
        // Five requests at once: slots 250 ms apart, the first at once.
        assert_eq!(
            slots,
            (0..5)
                .map(|i| Duration::from_millis(250 * i))
                .collect::<Vec<_>>()
        );
        // A request after a quiet second goes at once.
        let later = start + Duration::from_secs(3);
        assert_eq!(pacer.slot(later), later);
    }
}
