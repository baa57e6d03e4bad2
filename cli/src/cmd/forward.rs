//! Forwarding effects to the application over HTTP (`serve --forward URL`
//! and the `relay` command): a durable relay (docs/CONTRACT.md §10) whose
//! handler POSTs each effect, signed with Standard Webhooks under a secret
//! of its own, `webhook-id` = the effect id.
//!
//! An answer 2xx is a delivery; any other answer, no answer within the
//! timeout, or a connection that fails is a refusal, tried again on the
//! relay's schedule (a 429 or 503 with `Retry-After` in seconds waits at
//! least that long). Requests are paced to a rate per destination, so that
//! a catch-up after downtime does not flood the application.

use super::serve::webhook;
use crate::error::InputError;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use snapshot_receiver::relay::{HandlerError, HandlerFuture, RelayOptions, MAX_WAIT};
use snapshot_receiver::Effect;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
    /// The URL, for the banner.
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
                url: format!("{url} (JetStream, subjects {prefix}.<object>)"),
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
            url: url.clone(),
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
                        .map_err(|e| InputError::new(format!("--forward-nats: {e}")))?;
                nats.check_body_limit(max_body_bytes).map_err(|e| {
                    InputError::new(format!(
                        "--forward-nats {url}: {e} (the body limit is --max-body-bytes; \
                         max_payload is set in the NATS server's configuration)"
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

/// A connection's request half.
type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// One HTTP destination.
struct Destination {
    /// The request target effects are POSTed to: the URL's path and query.
    target: http::Uri,
    /// The `Host` header.
    host: String,
    /// `host:port` to connect to.
    address: String,
    /// The Standard Webhooks secret (`whsec_...`), checked at start.
    secret: String,
    /// Most time one attempt may take.
    timeout: Duration,
    /// The rate limit.
    pacer: Pacer,
    /// Kept-alive connections not in use. A std mutex: held to take or put
    /// one back.
    idle: Mutex<Vec<Sender>>,
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
        let bad = |why: String| InputError::new(format!("--forward {url:?}: {why}"));
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
        let port = match authority.as_str().get(authority.host().len()..) {
            Some("") | None => 80,
            Some(_) => authority
                .port_u16()
                .filter(|p| *p > 0)
                .ok_or_else(|| bad("the port is not a number from 1 to 65535".to_owned()))?,
        };
        let address = format!(
            "{}:{port}",
            authority
                .host()
                .trim_start_matches('[')
                .trim_end_matches(']'),
        );
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
                address,
                secret,
                timeout,
                pacer: Pacer::new(rate),
                idle: Mutex::new(Vec::new()),
            }),
        })
    }
}

impl snapshot_receiver::relay::Handler for HttpDestination {
    fn handle(&self, effect: Effect) -> HandlerFuture {
        let inner = self.inner.clone();
        Box::pin(async move {
            inner.pacer.wait().await;
            let timeout = inner.timeout;
            match tokio::time::timeout(timeout, inner.post(&effect)).await {
                Ok(result) => result,
                Err(_) => Err(HandlerError::new(format!(
                    "no answer within {} s",
                    timeout.as_secs()
                ))),
            }
        })
    }
}

impl Destination {
    /// A ready connection: an idle one, or a new one.
    async fn connection(&self) -> Result<Sender, HandlerError> {
        loop {
            let idle = self
                .idle
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .pop();
            match idle {
                Some(mut sender) => {
                    if sender.ready().await.is_ok() {
                        return Ok(sender);
                    }
                }
                None => break,
            }
        }
        let stream = tokio::net::TcpStream::connect(&self.address)
            .await
            .map_err(|e| HandlerError::new(format!("cannot connect to {}: {e}", self.address)))?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| HandlerError::new(format!("HTTP handshake: {e}")))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(sender)
    }

    /// One attempt: the effect signed and POSTed, its answer read.
    async fn post(&self, effect: &Effect) -> Result<(), HandlerError> {
        let body = serde_json::to_vec(effect)
            .map_err(|e| HandlerError::new(format!("the effect does not serialize: {e}")))?;
        let id = effect.id.to_string();
        let timestamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
            .to_string();
        let signature = webhook::standard_signature(&self.secret, &id, &timestamp, &body)
            .map_err(|e| HandlerError::new(format!("cannot sign: {e}")))?;
        let request = http::Request::post(self.target.clone())
            .header(http::header::HOST, &self.host)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(webhook::ID_HEADER, &id)
            .header(webhook::TIMESTAMP_HEADER, &timestamp)
            .header(webhook::SIGNATURE_HEADER, &signature)
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| HandlerError::new(format!("cannot build the request: {e}")))?;
        let mut sender = self.connection().await?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| HandlerError::new(format!("no answer: {e}")))?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        // Read the answer to its end, so that the connection can be reused.
        let _ = response.into_body().collect().await;
        self.idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(sender);
        if status.is_success() {
            return Ok(());
        }
        let refusal = HandlerError::new(format!("HTTP {status}"));
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
                    (d.target.to_string(), d.host.clone(), d.address.clone())
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
        let url = "http://user:pw@127.0.0.1:9001/effects";
        assert_eq!(
            made(url).unwrap_err(),
            format!(
                "--forward {url:?}: a user name or password in the URL would travel in clear \
                 text; give the destination a path only it knows, or check the signature there"
            )
        );
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
