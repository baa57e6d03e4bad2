//! Fetching authoritative snapshots over HTTP (`serve --authority URL`,
//! `reconcile --fetch`): [`HttpAuthority`], the library's
//! [`AuthoritySource`] for an authority that answers `GET` requests
//! (docs/CONTRACT.md §4, *The service fetches authorities itself*).
//!
//! The URL is a template: `{object_id}` is the object's id, and for a
//! profile whose object ids are scoped by a tenant (two parts, as
//! `shipment`'s) `{tenant}` and `{id}` are its parts; each is
//! percent-encoded (RFC 3986 §2.1, everything but the unreserved
//! characters). Credentials come from the environment only, never from a
//! flag: a bearer token ([`TOKEN_ENV`]), or a secret of the authority's own
//! ([`SECRET_ENV`]) with which each request is signed as Standard Webhooks
//! signs a message, the signed content being the request target (path and
//! query).
//!
//! The answer is one snapshot, `{"object_id": ..., "version": n, "state":
//! {...}, "as_of": "RFC 3339"}` and nothing else, read under the receiver's
//! limits (body size, nesting depth, id length) with its bytes reserved
//! from the memory budget before they are read. What each answer means:
//! - 2xx with such a snapshot of the object asked for: the snapshot;
//! - 404 or 410: the authority has no such object (`Ok(None)`);
//! - 429 or 503: unavailable, with the `Retry-After` wait when it is given
//!   (seconds or an HTTP date);
//! - a redirect (3xx, never followed), a body that is malformed, over a
//!   limit, of another shape or about another object: a bad answer;
//! - any other status, a connection that fails: unavailable;
//! - no whole answer within the per-attempt deadline (a slow, trickling or
//!   endless one): a timeout.

use super::serve::webhook;
use crate::error::InputError;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use snapshot_receiver::authority::{AuthorityError, AuthoritySource};
use snapshot_receiver::core::engine::{QueuedBytes, QUEUED_OVERHEAD};
use snapshot_receiver::{AuthoritativeSnapshot, Limits, Profile};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The environment variable holding the authority's bearer token.
pub(crate) const TOKEN_ENV: &str = "SNAPSHOT_RECEIVER_AUTHORITY_TOKEN";

/// The environment variable holding the secret requests to the authority
/// are signed with (`whsec_<base64>`).
pub(crate) const SECRET_ENV: &str = "SNAPSHOT_RECEIVER_AUTHORITY_SECRET";

/// The most of a refusal's body that is read, to quote it.
const EXCERPT_LIMIT: usize = 200;

/// The most of a body read ahead of the bounded read (the connections'
/// buffer, [`super::pool::READ_BUFFER`]).
const READ_BUFFER: usize = super::pool::READ_BUFFER;

/// Where the authority is and how long one fetch may take: shared by
/// `serve`, `reconcile --fetch` and `reconciler`.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct AuthorityArgs {
    /// Fetch authoritative snapshots with `GET` from this
    /// `http://HOST[:PORT]/PATH` template: `{object_id}` is replaced by
    /// the object's id, and for a tenant-scoped profile (shipment)
    /// `{tenant}` and `{id}` by its parts, each percent-encoded. The bearer
    /// token comes from SNAPSHOT_RECEIVER_AUTHORITY_TOKEN, or requests are
    /// signed (Standard Webhooks, over the path and query) with
    /// SNAPSHOT_RECEIVER_AUTHORITY_SECRET; never from a flag.
    #[arg(long, value_name = "URL")]
    pub(crate) authority: Option<String>,
    /// Seconds one fetch may take (connect, send, the whole answer) before
    /// it counts as timed out.
    #[arg(long, value_name = "SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) authority_timeout: u64,
}

impl AuthorityArgs {
    /// The authority, when `--authority` is given, reading bodies under
    /// `limits` and `profile`, its answers' bytes reserved from `budget`.
    ///
    /// # Errors
    /// An [`InputError`] naming `--authority` or the environment variable:
    /// see [`HttpAuthority::new`].
    pub(crate) fn resolve(
        &self,
        profile: &Profile,
        limits: &Limits,
        budget: Arc<QueuedBytes>,
    ) -> Result<Option<HttpAuthority>, InputError> {
        let Some(url) = &self.authority else {
            return Ok(None);
        };
        let credential = Credential::from_env(
            std::env::var(TOKEN_ENV).ok(),
            std::env::var(SECRET_ENV).ok(),
        )?;
        HttpAuthority::new(
            url,
            credential,
            Duration::from_secs(self.authority_timeout),
            profile,
            limits,
            budget,
        )
        .map(Some)
    }
}

/// How the background reconciler fetches from the authority (`serve
/// --authority`, `reconciler`): the authority and its bounds. Each has the
/// library's default ([`snapshot_receiver::reconciler::ReconcilerOptions`]).
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct ReconcilerArgs {
    #[command(flatten)]
    pub(crate) authority: AuthorityArgs,
    /// Most fetches from the authority in flight at once (one per object
    /// at a time).
    #[arg(long, value_name = "N", default_value_t = 8,
          value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub(crate) authority_concurrency: u64,
    /// Most fetches per second over all objects (a token bucket's refill);
    /// 0: no limit.
    #[arg(long, value_name = "PER_SECOND", default_value_t = 50.0,
          value_parser = non_negative)]
    pub(crate) authority_rate: f64,
    /// Fetches let through at once after a quiet spell (the bucket's size).
    #[arg(long, value_name = "N", default_value_t = 10,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) authority_burst: u32,
    /// Seconds before an object's first fetch again after a failed or
    /// refused one; doubled for each further one (with ±20 % jitter),
    /// never shorter than the authority's Retry-After.
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0,
          value_parser = positive)]
    pub(crate) authority_backoff: f64,
    /// The longest of those waits, in seconds (at most 86400); also the
    /// wait after the authority said it has no such object.
    #[arg(long, value_name = "SECONDS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(crate) authority_backoff_max: u64,
    /// Failures to reach the authority in a row (unavailable, timed out)
    /// that open the circuit breaker: no fetch then but one probe.
    #[arg(long, value_name = "N", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) authority_breaker_failures: u32,
    /// Seconds the breaker stays open before one probe goes.
    #[arg(long, value_name = "SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) authority_breaker_open: u64,
    /// Fetch every object not confirmed by the authority for this many
    /// seconds (recovery after an outage); default: no resync.
    #[arg(long, value_name = "SECONDS",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) authority_resync: Option<u64>,
    /// Seconds between scans of what needs an authority (decisions that
    /// hold or pause are noted at once).
    #[arg(long, value_name = "SECONDS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) authority_rescan: u64,
}

impl ReconcilerArgs {
    /// The library's options these flags give. The reconciler's deadline of
    /// an attempt is the authority's own plus a second, so that the
    /// authority's deadline, which says what it waited for, ends it first.
    pub(crate) fn options(&self) -> snapshot_receiver::reconciler::ReconcilerOptions {
        snapshot_receiver::reconciler::ReconcilerOptions {
            concurrency: usize::try_from(self.authority_concurrency).unwrap_or(usize::MAX),
            rate: (self.authority_rate > 0.0).then_some(self.authority_rate),
            burst: self.authority_burst,
            attempt_timeout: Duration::from_secs(self.authority.authority_timeout)
                + Duration::from_secs(1),
            backoff_base: Duration::from_secs_f64(self.authority_backoff),
            backoff_max: Duration::from_secs(self.authority_backoff_max),
            breaker_failures: self.authority_breaker_failures,
            breaker_open: Duration::from_secs(self.authority_breaker_open),
            resync: self.authority_resync.map(Duration::from_secs),
            rescan: Duration::from_secs(self.authority_rescan),
            ..snapshot_receiver::reconciler::ReconcilerOptions::default()
        }
    }
}

/// A number of at least 0 (`--authority-rate`).
fn non_negative(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(n) if n.is_finite() && n >= 0.0 => Ok(n),
        _ => Err(format!("{text:?} is not a number of at least 0")),
    }
}

/// A number above 0 (`--authority-backoff`).
fn positive(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(n) if n.is_finite() && n > 0.0 && n <= 86_400.0 => Ok(n),
        _ => Err(format!(
            "{text:?} is not a number of seconds above 0 and at most 86400"
        )),
    }
}

/// How requests to the authority prove who sends them.
#[derive(Clone)]
pub(crate) enum Credential {
    /// No credential (an authority on a private network).
    None,
    /// `Authorization: Bearer <token>`.
    Bearer(String),
    /// Standard Webhooks headers signed with this secret (`whsec_...`).
    Secret(String),
}

impl std::fmt::Debug for Credential {
    /// Names the kind, never the value.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Credential::None => "none",
            Credential::Bearer(_) => "bearer token",
            Credential::Secret(_) => "signing secret",
        })
    }
}

impl Credential {
    /// The credential of the environment's [`TOKEN_ENV`] and [`SECRET_ENV`]
    /// values (blank counts as unset).
    ///
    /// # Errors
    /// An [`InputError`] naming the variables when both are set, a token
    /// that cannot be a header value, or a secret that is not
    /// `whsec_<base64>`.
    pub(crate) fn from_env(
        token: Option<String>,
        secret: Option<String>,
    ) -> Result<Self, InputError> {
        let token = token.map(|t| t.trim().to_owned()).filter(|t| !t.is_empty());
        let secret = secret
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty());
        match (token, secret) {
            (Some(_), Some(_)) => Err(InputError::new(format!(
                "{TOKEN_ENV} and {SECRET_ENV} are both set: the authority takes a bearer token \
                 or signed requests, unset one"
            ))),
            (Some(token), None) => {
                http::HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                    InputError::new(format!(
                        "{TOKEN_ENV}: not a token a header can carry (visible ASCII only)"
                    ))
                })?;
                Ok(Credential::Bearer(token))
            }
            (None, Some(secret)) => {
                webhook::standard_signature(&secret, "check", "0", b"")
                    .map_err(|e| InputError::new(format!("{SECRET_ENV}: {e}")))?;
                Ok(Credential::Secret(secret))
            }
            (None, None) => Ok(Credential::None),
        }
    }

    /// The signing secret, if requests are signed.
    pub(crate) fn secret(&self) -> Option<&str> {
        match self {
            Credential::Secret(secret) => Some(secret),
            _ => None,
        }
    }
}

/// One piece of a URL template.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Piece {
    /// Text as written.
    Text(String),
    /// `{object_id}`: the whole id.
    ObjectId,
    /// `{tenant}`: the first part of a two-part id.
    Tenant,
    /// `{id}`: the second part of a two-part id.
    Id,
}

/// An authority reached over HTTP. Cheap to clone.
#[derive(Clone)]
pub(crate) struct HttpAuthority {
    inner: Arc<Inner>,
}

/// What [`HttpAuthority`] shares between its clones.
struct Inner {
    /// The request target's template (path and query).
    target: Vec<Piece>,
    /// The `Host` header.
    host: String,
    /// Kept-alive connections to the authority's `host:port`: fetches
    /// reuse them, as the forwarder does.
    pool: super::pool::Pool<Empty<Bytes>>,
    /// The URL for messages, its secrets hidden.
    shown: String,
    /// How requests prove who sends them.
    credential: Credential,
    /// Most time one fetch may take, from connecting to the answer's end.
    timeout: Duration,
    /// The body, depth and id limits an answer is read under (a delivery's).
    limits: Limits,
    /// Whether the profile's ids may be JSON integers.
    integer_ids: bool,
    /// How many parts the profile's object ids have.
    id_parts: usize,
    /// The memory budget's part answers are read into (serve's queued
    /// part): an answer's bytes are reserved before they are read.
    budget: Arc<QueuedBytes>,
    /// Numbers the signed requests' `webhook-id`s.
    requests: AtomicU64,
}

impl HttpAuthority {
    /// An authority at the template `url`, requests carrying `credential`,
    /// each fetch cut after `timeout`, answers read under `limits` and
    /// `profile`'s id rules, their bytes reserved from `budget`.
    ///
    /// # Errors
    /// An [`InputError`] naming `--authority` (the URL's secrets hidden):
    /// not `http://HOST[:PORT]/...`, credentials or a fragment in the URL,
    /// no placeholder or an unknown one, `{tenant}`/`{id}` with a profile
    /// whose object ids are not two parts.
    pub(crate) fn new(
        url: &str,
        credential: Credential,
        timeout: Duration,
        profile: &Profile,
        limits: &Limits,
        budget: Arc<QueuedBytes>,
    ) -> Result<Self, InputError> {
        let shown = crate::redact::url(url);
        let bad = |why: String| InputError::new(format!("--authority {shown:?}: {why}"));
        let Some(rest) = url.strip_prefix("http://") else {
            return Err(bad(
                "only http:// is spoken; put a TLS-terminating proxy on loopback for https"
                    .to_owned(),
            ));
        };
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, template) = rest.split_at(authority_end);
        if authority.contains(['{', '}']) {
            return Err(bad(
                "placeholders go in the path or query, not the host".to_owned()
            ));
        }
        if template.contains('#') {
            return Err(bad("a fragment is never sent; leave it out".to_owned()));
        }
        let authority: http::uri::Authority = authority
            .parse()
            .map_err(|e| bad(format!("not a host ({e})")))?;
        if authority.as_str().contains('@') {
            return Err(bad(format!(
                "a user name or password in the URL would travel in clear text; give the \
                 token in {TOKEN_ENV}"
            )));
        }
        let address = super::forward::socket_address(&authority).map_err(bad)?;
        let target = parse_template(template).map_err(bad)?;
        let id_parts = profile.object_id.len();
        if target
            .iter()
            .any(|p| matches!(p, Piece::Tenant | Piece::Id))
            && id_parts != 2
        {
            return Err(bad(format!(
                "{{tenant}} and {{id}} are the parts of a tenant-scoped object id (two \
                 parts, as the shipment profile's); the {} profile's object ids have {id_parts}: \
                 use {{object_id}}",
                profile.name
            )));
        }
        // Every id fills the template into a valid request target.
        fill(&target, "x", &["x", "x"])
            .parse::<http::Uri>()
            .map_err(|e| bad(format!("not a URL path ({e})")))?;
        Ok(Self {
            inner: Arc::new(Inner {
                target,
                host: authority.as_str().to_owned(),
                pool: super::pool::Pool::new(address),
                shown,
                credential,
                timeout,
                limits: limits.clone(),
                integer_ids: profile.integer_ids,
                id_parts,
                budget,
                requests: AtomicU64::new(0),
            }),
        })
    }

    /// Refuses an authority secret that is one of the secrets deliveries
    /// are checked with (`webhook_secrets`, read under `scheme`): the
    /// authority could then sign deliveries. Compared as keys.
    ///
    /// # Errors
    /// An [`InputError`] naming both (never the secret).
    pub(crate) fn check_secret_apart(
        &self,
        webhook_secrets: &[String],
        scheme: &webhook::Scheme,
    ) -> Result<(), InputError> {
        let Some(secret) = self.inner.credential.secret() else {
            return Ok(());
        };
        let standard = webhook::Scheme::Standard {
            tolerance: Duration::ZERO,
        };
        let Ok(key) = webhook::secret_key(secret, &standard) else {
            return Ok(());
        };
        if webhook_secrets
            .iter()
            .any(|s| webhook::secret_key(s, scheme).is_ok_and(|k| k == key))
        {
            return Err(InputError::new(format!(
                "{SECRET_ENV} is one of the webhook secrets (--webhook-secret or \
                 SNAPSHOT_RECEIVER_WEBHOOK_SECRET): requests to the authority are signed with a \
                 secret of their own, or the authority could sign deliveries to this server; \
                 make one with `openssl rand -base64 32` and give it as whsec_<base64>"
            )));
        }
        Ok(())
    }

    /// The URL template for messages and banners, its secrets hidden.
    pub(crate) fn shown(&self) -> &str {
        &self.inner.shown
    }

    /// The request target (path and query) for `object_id`.
    ///
    /// # Errors
    /// An unavailable [`AuthorityError`] when the template needs the id's
    /// parts and `object_id` is not a two-part id.
    fn target_for(&self, object_id: &str) -> Result<String, AuthorityError> {
        let inner = &self.inner;
        let parts = if inner.id_parts == 2 {
            split_id(object_id)
        } else {
            None
        };
        let needs_parts = inner
            .target
            .iter()
            .any(|p| matches!(p, Piece::Tenant | Piece::Id));
        let parts = match parts {
            Some(parts) => parts,
            None if needs_parts => {
                return Err(AuthorityError::unavailable(format!(
                    "object id {object_id:?} is not a tenant and an id joined by `/`: the \
                     template's {{tenant}} and {{id}} cannot be filled"
                )))
            }
            None => [String::new(), String::new()],
        };
        Ok(fill(&inner.target, object_id, &[&parts[0], &parts[1]]))
    }
}

impl AuthoritySource for HttpAuthority {
    async fn fetch(
        &self,
        object_id: &str,
    ) -> Result<Option<AuthoritativeSnapshot>, AuthorityError> {
        let target = self.target_for(object_id)?;
        let timeout = self.inner.timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let fetched = tokio::time::timeout_at(deadline, self.inner.attempt(object_id, &target))
            .await
            .unwrap_or_else(|_| {
                Err(AuthorityError::timeout(format!(
                    "no whole answer within {} s",
                    timeout.as_secs_f64()
                )))
            });
        match &fetched {
            Ok(Some(s)) => {
                tracing::debug!(object_id, version = s.version, "authority answered");
            }
            Ok(None) => tracing::debug!(object_id, "authority has no such object"),
            Err(e) => {
                tracing::debug!(object_id, kind = ?e.kind, error = %e, "authority fetch failed")
            }
        }
        fetched
    }
}

impl Inner {
    /// One fetch of `object_id` at `target`, without its deadline.
    async fn attempt(
        &self,
        object_id: &str,
        target: &str,
    ) -> Result<Option<AuthoritativeSnapshot>, AuthorityError> {
        // On a kept-alive connection (a new one when none is ready, or when
        // the authority closed the one taken under the request: a GET is
        // sent again).
        let (connection, response) = self
            .pool
            .send(|| self.request(target).map_err(|e| e.message))
            .await
            .map_err(AuthorityError::unavailable)?;
        let status = response.status();
        // Whether the answer's body was read to its end: only then does its
        // connection go back to the pool.
        let mut whole = false;
        let answer = match status.as_u16() {
            200..=299 => {
                let body = self.read_body(response).await?;
                whole = true;
                parse_answer(&body, object_id, &self.limits, self.integer_ids).map(Some)
            }
            404 | 410 => {
                whole = self.excerpt(response).await.1;
                Ok(None)
            }
            300..=399 => {
                let location = response
                    .headers()
                    .get(http::header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .map_or_else(
                        || "no Location".to_owned(),
                        |to| format!("to {:?}", crate::redact::url(to)),
                    );
                Err(AuthorityError::bad_answer(format!(
                    "HTTP {status}: a redirect {location}, not followed; the authority's URL \
                     is the one to give"
                )))
            }
            _ => {
                let retry_after = response
                    .headers()
                    .get(http::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|text| super::forward::retry_after_wait(text, SystemTime::now()));
                let (excerpt, ended) = self.excerpt(response).await;
                whole = ended;
                let mut message = format!("HTTP {status}");
                if !excerpt.is_empty() {
                    message.push_str(": ");
                    message.push_str(&excerpt);
                }
                let error = AuthorityError::unavailable(message);
                Err(match retry_after {
                    Some(wait)
                        if status == http::StatusCode::TOO_MANY_REQUESTS
                            || status == http::StatusCode::SERVICE_UNAVAILABLE =>
                    {
                        error.with_retry_after(wait)
                    }
                    _ => error,
                })
            }
        };
        if whole {
            self.pool.put_back(connection);
        }
        answer
    }

    /// The `GET` of `target` with the credential's headers.
    fn request(&self, target: &str) -> Result<http::Request<Empty<Bytes>>, AuthorityError> {
        let mut request = http::Request::get(target)
            .header(http::header::HOST, &self.host)
            .header(http::header::ACCEPT, "application/json")
            .header(
                http::header::USER_AGENT,
                concat!("snapshot-receiver/", env!("CARGO_PKG_VERSION")),
            );
        match &self.credential {
            Credential::None => {}
            Credential::Bearer(token) => {
                let mut value =
                    http::HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                        AuthorityError::unavailable("the bearer token is not a header value")
                    })?;
                value.set_sensitive(true);
                request = request.header(http::header::AUTHORIZATION, value);
            }
            Credential::Secret(secret) => {
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default();
                let id = format!(
                    "fetch_{}_{}",
                    now.as_nanos(),
                    self.requests.fetch_add(1, Ordering::Relaxed)
                );
                let timestamp = now.as_secs().to_string();
                let signature =
                    webhook::standard_signature(secret, &id, &timestamp, target.as_bytes())
                        .map_err(|e| AuthorityError::unavailable(format!("cannot sign: {e}")))?;
                request = request
                    .header(webhook::ID_HEADER, id)
                    .header(webhook::TIMESTAMP_HEADER, timestamp)
                    .header(webhook::SIGNATURE_HEADER, signature);
            }
        }
        request
            .body(Empty::new())
            .map_err(|e| AuthorityError::unavailable(format!("cannot build the request: {e}")))
    }

    /// A 2xx answer's body, read whole under the body limit, its bytes
    /// reserved from the budget before they are read.
    ///
    /// # Errors
    /// A bad answer when the body declares or runs over the limit or
    /// breaks off; unavailable when the budget cannot take it now.
    async fn read_body(
        &self,
        response: http::Response<hyper::body::Incoming>,
    ) -> Result<Vec<u8>, AuthorityError> {
        let limit = self.limits.max_body_bytes;
        let declared = response
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if let Some(size) = declared.filter(|&size| size > limit as u64) {
            return Err(AuthorityError::bad_answer(format!(
                "the answer is {size} bytes, over the body limit of {limit}"
            )));
        }
        let expected = declared.map_or(limit, |size| usize::try_from(size).unwrap_or(limit));
        let _reserved = self
            .budget
            .reserve(expected.saturating_add(QUEUED_OVERHEAD))
            .map_err(|why| {
                AuthorityError::unavailable(format!(
                    "an answer of up to {expected} bytes cannot be read now: {why}"
                ))
            })?;
        let mut body = response.into_body();
        let mut read = Vec::with_capacity(expected.min(READ_BUFFER));
        while let Some(frame) = body.frame().await {
            let frame = frame
                .map_err(|e| AuthorityError::bad_answer(format!("the answer broke off: {e}")))?;
            if let Some(data) = frame.data_ref() {
                if read.len() + data.len() > expected {
                    return Err(AuthorityError::bad_answer(match declared {
                        Some(size) => format!("the answer runs past its Content-Length of {size}"),
                        None => format!("the answer is over the body limit of {limit} bytes"),
                    }));
                }
                read.extend_from_slice(data);
            }
        }
        Ok(read)
    }

    /// The start of a refusal's body, quoted on one line (at most
    /// [`EXCERPT_LIMIT`] bytes read, reserved from the budget; nothing
    /// when it cannot be reserved), and whether the body ended within them
    /// (its connection may then be reused).
    async fn excerpt(&self, response: http::Response<hyper::body::Incoming>) -> (String, bool) {
        let Ok(_reserved) = self.budget.reserve(EXCERPT_LIMIT + QUEUED_OVERHEAD) else {
            return (String::new(), false);
        };
        let mut body = response.into_body();
        let mut read = Vec::new();
        let mut cut = false;
        let mut ended = false;
        loop {
            match body.frame().await {
                None => {
                    ended = true;
                    break;
                }
                Some(Err(_)) => break,
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        let room = EXCERPT_LIMIT - read.len();
                        read.extend_from_slice(&data[..data.len().min(room)]);
                        if data.len() > room {
                            cut = true;
                            break;
                        }
                    }
                }
            }
        }
        let text: String = String::from_utf8_lossy(&read)
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        let mut text = text.trim().to_owned();
        if cut && !text.is_empty() {
            text.push_str("...");
        }
        (text, ended)
    }
}

/// An answer as the authority writes it: the fields of a fixture's
/// `authority` entry but `force` (an authority cannot override the
/// object's version; only an operator can), nothing else.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Answer {
    object_id: Box<serde_json::value::RawValue>,
    version: u64,
    state: Box<serde_json::value::RawValue>,
    as_of: String,
}

/// Reads an answer's body as the snapshot of `asked` under `limits`.
///
/// # Errors
/// A bad-answer [`AuthorityError`] saying what is wrong: not UTF-8, nested
/// deeper than the limit, not a JSON object, not a snapshot (a missing or
/// unknown member, a version that is not a u64 integer), an id over the
/// limit or of another object, an `as_of` that is not RFC 3339, a state
/// with a duplicate key.
fn parse_answer(
    body: &[u8],
    asked: &str,
    limits: &Limits,
    integer_ids: bool,
) -> Result<AuthoritativeSnapshot, AuthorityError> {
    let bad = |why: String| AuthorityError::bad_answer(why);
    // One leading byte order mark is ignored, as in a delivery.
    let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    let text = std::str::from_utf8(body).map_err(|e| bad(format!("not UTF-8: {e}")))?;
    if let Some(depth) = nesting_deeper_than(text, limits.max_depth) {
        return Err(bad(format!(
            "nested {depth} levels deep or more, over the depth limit of {}",
            limits.max_depth
        )));
    }
    if !text.trim_start().starts_with('{') {
        return Err(bad("not a JSON object".to_owned()));
    }
    let answer: Answer = snapshot_receiver::fixture::from_json(text)
        .map_err(|e| bad(format!("not a snapshot: {e}")))?;
    let raw_id = answer.object_id.get();
    let object_id: String = if raw_id.starts_with('"') {
        serde_json::from_str(raw_id).map_err(|e| bad(format!("object_id: {e}")))?
    } else if integer_ids && !raw_id.is_empty() && raw_id.bytes().all(|b| b.is_ascii_digit()) {
        raw_id.to_owned()
    } else {
        return Err(bad(format!(
            "object_id: {} is not a string{}",
            excerpt(raw_id),
            if integer_ids {
                " or a whole number"
            } else {
                ""
            }
        )));
    };
    if object_id.len() > limits.max_id_bytes {
        return Err(bad(format!(
            "object_id is {} bytes, over the id limit of {}",
            object_id.len(),
            limits.max_id_bytes
        )));
    }
    if object_id != asked {
        return Err(bad(format!(
            "the answer is about object {:?}, not {asked:?}",
            excerpt(&object_id)
        )));
    }
    let as_of = snapshot_receiver::parse_rfc3339(&answer.as_of).ok_or_else(|| {
        bad(format!(
            "as_of: not an RFC 3339 time: {:?}",
            excerpt(&answer.as_of)
        ))
    })?;
    AuthoritativeSnapshot::new(&object_id, answer.version, answer.state.get(), as_of)
        .map_err(|e| bad(format!("state: {e}")))
}

/// At most 64 characters of `text`, `...` after a cut: ids and values an
/// answer made up are quoted this short.
fn excerpt(text: &str) -> String {
    match text.char_indices().nth(64) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_owned(),
    }
}

/// `Some(limit + 1)` when `text` nests arrays and objects deeper than
/// `limit` (the top-level value is depth 1), counting brackets outside
/// strings; `None` otherwise. Malformed text is left to the parser.
fn nesting_deeper_than(text: &str, limit: usize) -> Option<usize> {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for b in text.bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > limit {
                    return Some(depth);
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

/// The pieces of a template's path and query.
///
/// # Errors
/// What is wrong: a `{` without its `}`, a `}` alone, an unknown
/// placeholder, no placeholder at all.
fn parse_template(template: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut rest = if template.is_empty() { "/" } else { template };
    if !rest.starts_with('/') {
        // `http://host?x={object_id}`: the path is `/`.
        pieces.push(Piece::Text("/".to_owned()));
    }
    while !rest.is_empty() {
        match rest.find(['{', '}']) {
            None => {
                pieces.push(Piece::Text(rest.to_owned()));
                break;
            }
            Some(at) if rest.as_bytes()[at] == b'}' => {
                return Err(format!(
                    "a `}}` without its `{{` at {:?}; the placeholders are {{object_id}}, \
                     {{tenant}} and {{id}}",
                    &rest[at..]
                ))
            }
            Some(at) => {
                if at > 0 {
                    pieces.push(Piece::Text(rest[..at].to_owned()));
                }
                let Some(end) = rest[at..].find('}') else {
                    return Err(format!("a `{{` without its `}}` at {:?}", &rest[at..]));
                };
                let name = &rest[at + 1..at + end];
                pieces.push(match name {
                    "object_id" => Piece::ObjectId,
                    "tenant" => Piece::Tenant,
                    "id" => Piece::Id,
                    other => {
                        return Err(format!(
                            "unknown placeholder {{{other}}}; the placeholders are \
                             {{object_id}}, {{tenant}} and {{id}}"
                        ))
                    }
                });
                rest = &rest[at + end + 1..];
            }
        }
    }
    if !pieces.iter().any(|p| !matches!(p, Piece::Text(_))) {
        return Err(
            "no placeholder: put {object_id} (or {tenant} and {id}) where the object's id goes"
                .to_owned(),
        );
    }
    Ok(pieces)
}

/// The template filled with `object_id` and its two `parts`, each
/// percent-encoded.
fn fill(target: &[Piece], object_id: &str, parts: &[&str; 2]) -> String {
    let mut out = String::new();
    for piece in target {
        match piece {
            Piece::Text(text) => out.push_str(text),
            Piece::ObjectId => encode_into(&mut out, object_id),
            Piece::Tenant => encode_into(&mut out, parts[0]),
            Piece::Id => encode_into(&mut out, parts[1]),
        }
    }
    out
}

/// Appends `text` percent-encoded: every byte but the unreserved
/// characters (RFC 3986 §2.3: letters, digits, `-`, `.`, `_`, `~`) as
/// `%XX`.
fn encode_into(out: &mut String, text: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 15)]));
        }
    }
}

/// The tenant and the id of a two-part object id as a tenant-scoped
/// profile composes it (the parts joined by `/`, `%` and `/` in a part
/// written `%25` and `%2F`); `None` when it is not two parts.
fn split_id(object_id: &str) -> Option<[String; 2]> {
    let (tenant, id) = object_id.split_once('/')?;
    if id.contains('/') {
        return None;
    }
    Some([unescape_part(tenant), unescape_part(id)])
}

/// A part of a composed id with `%25` and `%2F` read back (in one pass:
/// other `%` sequences stay as they are).
fn unescape_part(part: &str) -> String {
    let mut out = String::with_capacity(part.len());
    let mut rest = part;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(after) = tail.strip_prefix("%25") {
            out.push('%');
            rest = after;
        } else if let Some(after) = tail.strip_prefix("%2F") {
            out.push('/');
            rest = after;
        } else {
            out.push('%');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use snapshot_receiver::authority::AuthorityErrorKind;
    use std::sync::Mutex;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    const SNAPSHOT: &str = r#"{"object_id":"card-7","version":14,"state":{"stage":"archived","label":"Map v2"},"as_of":"2024-01-01T08:00:20Z"}"#;

    /// What the test authority writes on each connection.
    #[derive(Clone)]
    enum Reply {
        /// These bytes, then the connection closes.
        Bytes(Vec<u8>),
        /// A head, then a chunk of one byte every `gap`, for ever (a
        /// head left empty: nothing at all).
        Trickle(String, Duration),
    }

    /// A test authority on loopback: answers every connection with
    /// `reply`, recording each request's head.
    struct TestAuthority {
        url: String,
        heads: Arc<Mutex<Vec<String>>>,
    }

    impl TestAuthority {
        async fn start(reply: Reply) -> Self {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let url = format!("http://{}", listener.local_addr().unwrap());
            let heads: Arc<Mutex<Vec<String>>> = Arc::default();
            let recorded = heads.clone();
            tokio::spawn(async move {
                while let Ok((mut socket, _)) = listener.accept().await {
                    let (reply, recorded) = (reply.clone(), recorded.clone());
                    tokio::spawn(async move {
                        let mut head = Vec::new();
                        let mut byte = [0u8; 1];
                        while !head.ends_with(b"\r\n\r\n") {
                            if socket.read(&mut byte).await.unwrap_or(0) == 0 {
                                return;
                            }
                            head.push(byte[0]);
                        }
                        recorded
                            .lock()
                            .unwrap()
                            .push(String::from_utf8(head).unwrap());
                        match reply {
                            Reply::Bytes(bytes) => {
                                let _ = socket.write_all(&bytes).await;
                            }
                            Reply::Trickle(head, gap) => {
                                if head.is_empty() {
                                    std::future::pending::<()>().await;
                                }
                                let _ = socket.write_all(head.as_bytes()).await;
                                loop {
                                    if socket.write_all(b"1\r\n \r\n").await.is_err() {
                                        return;
                                    }
                                    tokio::time::sleep(gap).await;
                                }
                            }
                        }
                        let _ = socket.shutdown().await;
                    });
                }
            });
            Self { url, heads }
        }

        /// Answers `status` with `body` and the extra header lines.
        async fn answering(status: &str, headers: &[&str], body: &str) -> Self {
            let mut text = format!("HTTP/1.1 {status}\r\nconnection: close\r\n");
            for h in headers {
                text.push_str(h);
                text.push_str("\r\n");
            }
            text.push_str(&format!("content-length: {}\r\n\r\n{body}", body.len()));
            Self::start(Reply::Bytes(text.into_bytes())).await
        }

        fn heads(&self) -> Vec<String> {
            self.heads.lock().unwrap().clone()
        }
    }

    fn limits() -> Limits {
        Limits {
            max_body_bytes: 1024,
            max_depth: 8,
            max_id_bytes: 32,
            ..Limits::default()
        }
    }

    fn authority(url: &str, credential: Credential, profile: &Profile) -> HttpAuthority {
        authority_with(
            url,
            credential,
            profile,
            Arc::new(QueuedBytes::new(1 << 20)),
        )
    }

    fn authority_with(
        url: &str,
        credential: Credential,
        profile: &Profile,
        budget: Arc<QueuedBytes>,
    ) -> HttpAuthority {
        HttpAuthority::new(
            url,
            credential,
            Duration::from_millis(500),
            profile,
            &limits(),
            budget,
        )
        .unwrap()
    }

    /// The error of fetching `card-7` from a test authority answering
    /// `status`, `headers` and `body`.
    async fn refused(status: &str, headers: &[&str], body: &str) -> AuthorityError {
        answer(status, headers, body).await.unwrap_err()
    }

    /// What fetching `card-7` from such a test authority gives.
    async fn answer(
        status: &str,
        headers: &[&str],
        body: &str,
    ) -> Result<Option<AuthoritativeSnapshot>, AuthorityError> {
        let server = TestAuthority::answering(status, headers, body).await;
        let source = authority(
            &format!("{}/objects/{{object_id}}", server.url),
            Credential::None,
            &Profile::card(),
        );
        source.fetch("card-7").await
    }

    #[tokio::test]
    async fn a_snapshot_of_the_object_is_fetched_with_the_id_in_the_path() {
        let server = TestAuthority::answering("200 OK", &[], SNAPSHOT).await;
        let source = authority(
            &format!("{}/objects/{{object_id}}?full=1", server.url),
            Credential::Bearer("t0ken".to_owned()),
            &Profile::card(),
        );
        let snapshot = source.fetch("card-7").await.unwrap().unwrap();
        assert_eq!(&*snapshot.object_id, "card-7");
        assert_eq!(snapshot.version, 14);
        assert_eq!(
            snapshot.state.to_string(),
            r#"{"stage":"archived","label":"Map v2"}"#
        );
        assert_eq!(
            snapshot.as_of,
            snapshot_receiver::parse_rfc3339("2024-01-01T08:00:20Z").unwrap()
        );
        assert!(!snapshot.force);
        let heads = server.heads();
        assert_eq!(heads.len(), 1);
        let head = heads[0].to_ascii_lowercase();
        assert!(
            head.starts_with("get /objects/card-7?full=1 http/1.1\r\n"),
            "{head}"
        );
        assert!(
            head.contains("\r\nauthorization: bearer t0ken\r\n"),
            "{head}"
        );
        assert!(head.contains("\r\naccept: application/json\r\n"), "{head}");
    }

    /// A test authority that keeps connections alive: it answers every
    /// request on a connection with `status` and `body` (and a
    /// `Content-Length`), counting the connections it accepted and the
    /// requests it answered.
    async fn keep_alive_authority(
        status: &'static str,
        body: &'static str,
    ) -> (
        String,
        Arc<std::sync::atomic::AtomicUsize>,
        Arc<std::sync::atomic::AtomicUsize>,
    ) {
        use std::sync::atomic::AtomicUsize;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let answered = Arc::new(AtomicUsize::new(0));
        let (a, n) = (accepted.clone(), answered.clone());
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                a.fetch_add(1, Ordering::SeqCst);
                let n = n.clone();
                tokio::spawn(async move {
                    loop {
                        let mut head = Vec::new();
                        let mut byte = [0u8; 1];
                        while !head.ends_with(b"\r\n\r\n") {
                            if socket.read(&mut byte).await.unwrap_or(0) == 0 {
                                return;
                            }
                            head.push(byte[0]);
                        }
                        let reply = format!(
                            "HTTP/1.1 {status}\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if socket.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                        n.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        });
        (url, accepted, answered)
    }

    /// Several fetches from one authority reuse one kept-alive connection,
    /// after a snapshot and after a 404 alike (each answer read to its
    /// end); one whose answer is not read to its end (over the body
    /// limit) is not kept, so the next fetch opens another.
    #[tokio::test]
    async fn fetches_from_one_authority_reuse_a_kept_alive_connection() {
        let (url, accepted, answered) = keep_alive_authority("200 OK", SNAPSHOT).await;
        let source = authority(
            &format!("{url}/objects/{{object_id}}"),
            Credential::None,
            &Profile::card(),
        );
        for _ in 0..5 {
            let snapshot = source.fetch("card-7").await.unwrap().unwrap();
            assert_eq!(snapshot.version, 14);
        }
        assert_eq!(answered.load(Ordering::SeqCst), 5);
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "one connection for five fetches"
        );
        let (url, accepted, _) = keep_alive_authority("404 Not Found", "no such card").await;
        let source = authority(
            &format!("{url}/objects/{{object_id}}"),
            Credential::None,
            &Profile::card(),
        );
        for _ in 0..3 {
            assert!(source.fetch("card-7").await.unwrap().is_none());
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "404s keep it too");
        // 2000 bytes, over the test limit of 1024: refused unread, closed.
        let big: &'static str =
            Box::leak(format!("{{\"pad\":\"{}\"}}", "x".repeat(2000)).into_boxed_str());
        let (url, accepted, _) = keep_alive_authority("200 OK", big).await;
        let source = authority(
            &format!("{url}/objects/{{object_id}}"),
            Credential::None,
            &Profile::card(),
        );
        for _ in 0..2 {
            let e = source.fetch("card-7").await.unwrap_err();
            assert_eq!(e.kind, AuthorityErrorKind::BadAnswer, "{e}");
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            2,
            "an answer not read is not kept"
        );
    }

    #[tokio::test]
    async fn a_missing_or_gone_object_is_none() {
        for status in ["404 Not Found", "410 Gone"] {
            let server = TestAuthority::answering(status, &[], "no such card").await;
            let source = authority(
                &format!("{}/objects/{{object_id}}", server.url),
                Credential::None,
                &Profile::card(),
            );
            assert!(matches!(source.fetch("card-7").await, Ok(None)), "{status}");
        }
    }

    #[tokio::test]
    async fn busy_answers_carry_their_retry_after_other_statuses_none() {
        let e = refused(
            "503 Service Unavailable",
            &["retry-after: 7"],
            "maintenance",
        )
        .await;
        assert_eq!(
            e,
            AuthorityError::unavailable("HTTP 503 Service Unavailable: maintenance")
                .with_retry_after(Duration::from_secs(7))
        );
        // An HTTP date already past: no wait.
        let e = refused(
            "429 Too Many Requests",
            &["retry-after: Sun, 06 Nov 1994 08:49:37 GMT"],
            "",
        )
        .await;
        assert_eq!(
            e,
            AuthorityError::unavailable("HTTP 429 Too Many Requests")
                .with_retry_after(Duration::ZERO)
        );
        // Retry-After counts only with 429 and 503.
        let e = refused("500 Internal Server Error", &["retry-after: 7"], "db\ndown").await;
        assert_eq!(
            e,
            AuthorityError::unavailable("HTTP 500 Internal Server Error: db down")
        );
        let e = refused("503 Service Unavailable", &["retry-after: soon"], "").await;
        assert_eq!(
            e,
            AuthorityError::unavailable("HTTP 503 Service Unavailable")
        );
    }

    #[tokio::test]
    async fn a_redirect_is_not_followed() {
        let server = TestAuthority::answering(
            "302 Found",
            &["location: http://elsewhere.example/x?token=abc"],
            "",
        )
        .await;
        let source = authority(
            &format!("{}/objects/{{object_id}}", server.url),
            Credential::None,
            &Profile::card(),
        );
        assert_eq!(
            source.fetch("card-7").await.err(),
            Some(AuthorityError::bad_answer(
                "HTTP 302 Found: a redirect to \"http://elsewhere.example/x?token=***\", not \
                 followed; the authority's URL is the one to give"
            ))
        );
        assert_eq!(server.heads().len(), 1, "one request, none to the Location");
    }

    #[tokio::test]
    async fn bodies_that_are_not_the_objects_snapshot_are_bad_answers() {
        let deep = format!(
            r#"{{"object_id":"card-7","version":14,"state":{}1{},"as_of":"2024-01-01T08:00:20Z"}}"#,
            "[".repeat(8),
            "]".repeat(8)
        );
        let long_id = "c".repeat(33);
        let long = SNAPSHOT.replace("card-7", &long_id);
        let mut wrong = Vec::new();
        for (body, why) in [
            (
                "{\"object_id\":",
                "not a snapshot: object_id: EOF while parsing a value at line 1 column 13",
            ),
            ("[1,2]", "not a JSON object"),
            (
                &SNAPSHOT.replace("card-7", "card-8"),
                "the answer is about object \"card-8\", not \"card-7\"",
            ),
            (
                &SNAPSHOT.replace("\"version\":14", "\"version\":14.0"),
                "not a snapshot: version: invalid type: floating point `14.0`, expected u64 at \
                 line 1 column 36",
            ),
            (
                &SNAPSHOT.replace("\"version\":14,", ""),
                "not a snapshot: missing field `version` at line 1 column 99",
            ),
            (
                &SNAPSHOT.replace(",\"as_of\"", ",\"force\":true,\"as_of\""),
                "not a snapshot: force: unknown field `force`, expected one of `object_id`, \
                 `version`, `state`, `as_of` at line 1 column 88",
            ),
            (
                &SNAPSHOT.replace("2024-01-01T08:00:20Z", "yesterday"),
                "as_of: not an RFC 3339 time: \"yesterday\"",
            ),
            (
                &SNAPSHOT.replace("\"card-7\"", "7"),
                "object_id: 7 is not a string",
            ),
            (
                &deep,
                "nested 9 levels deep or more, over the depth limit of 8",
            ),
            (&long, "object_id is 33 bytes, over the id limit of 32"),
            (
                &SNAPSHOT.replace(r#""label":"Map v2""#, r#""label":"a","label":"b""#),
                "state: duplicate key \"label\" at byte 32",
            ),
        ] {
            let got = answer("200 OK", &[], body).await;
            if got.as_ref().err() != Some(&AuthorityError::bad_answer(why)) {
                wrong.push(format!("{body}: {got:?}"));
            }
        }
        // Every case is tried; the ones answered otherwise are listed.
        assert_eq!(wrong, Vec::<String>::new());
    }

    #[tokio::test]
    async fn an_answer_over_the_body_limit_is_a_bad_answer_declared_or_not() {
        let big = format!("{{\"pad\":\"{}\"}}", "x".repeat(2000));
        assert_eq!(
            refused("200 OK", &[], &big).await,
            AuthorityError::bad_answer("the answer is 2010 bytes, over the body limit of 1024")
        );
        // Chunked: its length is known at its end only.
        let mut chunked = String::from("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n");
        for _ in 0..5 {
            chunked.push_str(&format!("100\r\n{}\r\n", "x".repeat(256)));
        }
        chunked.push_str("0\r\n\r\n");
        let server = TestAuthority::start(Reply::Bytes(chunked.into_bytes())).await;
        let budget = Arc::new(QueuedBytes::new(1 << 20));
        let source = authority_with(
            &format!("{}/{{object_id}}", server.url),
            Credential::None,
            &Profile::card(),
            budget.clone(),
        );
        assert_eq!(
            source.fetch("card-7").await.err(),
            Some(AuthorityError::bad_answer(
                "the answer is over the body limit of 1024 bytes"
            ))
        );
        assert_eq!(budget.bytes(), 0, "the reservation is given back");
    }

    #[tokio::test]
    async fn an_answer_is_read_only_when_the_budget_can_take_it() {
        let server = TestAuthority::answering("200 OK", &[], SNAPSHOT).await;
        let budget = Arc::new(QueuedBytes::new(2048));
        let source = authority_with(
            &format!("{}/{{object_id}}", server.url),
            Credential::None,
            &Profile::card(),
            budget.clone(),
        );
        let held = budget.reserve(1500).unwrap();
        assert_eq!(
            source.fetch("card-7").await.err(),
            Some(AuthorityError::unavailable(format!(
                "an answer of up to {} bytes cannot be read now: {}",
                SNAPSHOT.len(),
                budget
                    .reserve(SNAPSHOT.len() + QUEUED_OVERHEAD)
                    .unwrap_err()
            )))
        );
        drop(held);
        assert_eq!(source.fetch("card-7").await.unwrap().unwrap().version, 14);
        assert_eq!(budget.bytes(), 0);
    }

    #[tokio::test]
    async fn a_trickling_or_silent_authority_times_out() {
        let trickle = TestAuthority::start(Reply::Trickle(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_owned(),
            Duration::from_millis(20),
        ))
        .await;
        let silent =
            TestAuthority::start(Reply::Trickle(String::new(), Duration::from_secs(60))).await;
        for server in [trickle, silent] {
            let source = authority(
                &format!("{}/{{object_id}}", server.url),
                Credential::None,
                &Profile::card(),
            );
            assert_eq!(
                source.fetch("card-7").await.err(),
                Some(AuthorityError::timeout("no whole answer within 0.5 s"))
            );
        }
    }

    #[tokio::test]
    async fn a_connection_refused_is_unavailable() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        drop(listener);
        let source = authority(
            &format!("http://{address}/{{object_id}}"),
            Credential::None,
            &Profile::card(),
        );
        let e = source.fetch("card-7").await.unwrap_err();
        assert_eq!(e.kind, AuthorityErrorKind::Unavailable);
        assert!(
            e.message
                .starts_with(&format!("cannot connect to {address}: ")),
            "{e}"
        );
    }

    #[tokio::test]
    async fn signed_requests_sign_their_target() {
        const SECRET: &str = "whsec_c2VjcmV0LWJlaW5nLXJvdGF0ZWQtb3V0";
        let body = SNAPSHOT.replace("card-7", "acme/SHP 1");
        let server = TestAuthority::answering("200 OK", &[], &body).await;
        let source = authority(
            &format!("{}/tenants/{{tenant}}/shipments/{{id}}", server.url),
            Credential::Secret(SECRET.to_owned()),
            &Profile::shipment(),
        );
        assert_eq!(
            &*source.fetch("acme/SHP 1").await.unwrap().unwrap().object_id,
            "acme/SHP 1"
        );
        let head = server.heads().remove(0);
        let header = |name: &str| {
            head.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}: ")))
                .unwrap()
                .to_owned()
        };
        let target = "/tenants/acme/shipments/SHP%201";
        assert!(
            head.starts_with(&format!("GET {target} HTTP/1.1\r\n")),
            "{head}"
        );
        let (id, timestamp) = (header("webhook-id"), header("webhook-timestamp"));
        assert_eq!(
            header("webhook-signature"),
            webhook::standard_signature(SECRET, &id, &timestamp, target.as_bytes()).unwrap()
        );
        assert!(!head.to_ascii_lowercase().contains("authorization"));
    }

    #[test]
    fn templates_place_the_percent_encoded_id_and_its_parts() {
        let budget = || Arc::new(QueuedBytes::new(1 << 20));
        let made = |url: &str, profile: &Profile| {
            HttpAuthority::new(
                url,
                Credential::None,
                Duration::from_secs(1),
                profile,
                &limits(),
                budget(),
            )
            .map_err(|e| e.to_string())
        };
        let card = made("http://127.0.0.1:9/o/{object_id}", &Profile::card()).unwrap();
        assert_eq!(card.target_for("a b/ü%").unwrap(), "/o/a%20b%2F%C3%BC%25");
        let query = made("http://h?id={object_id}&v=1", &Profile::card()).unwrap();
        assert_eq!(query.target_for("x.y_z~-1").unwrap(), "/?id=x.y_z~-1&v=1");
        let scoped = made(
            "http://h/t/{tenant}/s/{id}?o={object_id}",
            &Profile::shipment(),
        )
        .unwrap();
        // The parts as the profile composed them: `/` and `%` escaped.
        assert_eq!(
            scoped.target_for("a%2Fb/c%25d").unwrap(),
            "/t/a%2Fb/s/c%25d?o=a%252Fb%2Fc%2525d"
        );
        assert_eq!(
            scoped.target_for("no-tenant"),
            Err(AuthorityError::unavailable(
                "object id \"no-tenant\" is not a tenant and an id joined by `/`: the \
                 template's {tenant} and {id} cannot be filled"
            ))
        );
        for (url, why) in [
            ("https://h/{object_id}", "only http:// is spoken; put a TLS-terminating proxy on loopback for https"),
            ("http://h/objects", "no placeholder: put {object_id} (or {tenant} and {id}) where the object's id goes"),
            ("http://h/{name}", "unknown placeholder {name}; the placeholders are {object_id}, {tenant} and {id}"),
            ("http://h/{object_id", "a `{` without its `}` at \"{object_id\""),
            ("http://h/o}/{object_id}", "a `}` without its `{` at \"}/{object_id}\"; the placeholders are {object_id}, {tenant} and {id}"),
            ("http://{object_id}/x", "placeholders go in the path or query, not the host"),
            ("http://h/{object_id}#top", "a fragment is never sent; leave it out"),
            ("http://h:0/{object_id}", "the port is not a number from 1 to 65535"),
            ("http://u:PASSWORD@h/{object_id}", "a user name or password in the URL would travel in clear text; give the token in SNAPSHOT_RECEIVER_AUTHORITY_TOKEN"),
        ] {
            let shown = crate::redact::url(url);
            assert_eq!(
                made(url, &Profile::card()).err(),
                Some(format!("--authority {shown:?}: {why}")),
                "{url}"
            );
        }
        assert_eq!(
            made("http://h/{tenant}/{id}", &Profile::card()).err(),
            Some(
                "--authority \"http://h/{tenant}/{id}\": {tenant} and {id} are the parts of a \
                 tenant-scoped object id (two parts, as the shipment profile's); the card \
                 profile's object ids have 1: use {object_id}"
                    .to_owned()
            )
        );
    }

    #[test]
    fn credentials_come_from_one_variable_and_never_show() {
        let token = Credential::from_env(Some(" t0ken ".into()), Some("  ".into())).unwrap();
        assert!(matches!(&token, Credential::Bearer(t) if t == "t0ken"));
        assert_eq!(format!("{token:?}"), "bearer token");
        assert!(matches!(
            Credential::from_env(None, Some(String::new())).unwrap(),
            Credential::None
        ));
        assert_eq!(
            Credential::from_env(Some("a".into()), Some("whsec_eA==".into()))
                .unwrap_err()
                .to_string(),
            "SNAPSHOT_RECEIVER_AUTHORITY_TOKEN and SNAPSHOT_RECEIVER_AUTHORITY_SECRET are both \
             set: the authority takes a bearer token or signed requests, unset one"
        );
        assert_eq!(
            Credential::from_env(None, Some("plain".into()))
                .unwrap_err()
                .to_string(),
            "SNAPSHOT_RECEIVER_AUTHORITY_SECRET: a Standard Webhooks secret is written \
             `whsec_<base64>` (the form the sender shows)"
        );
        assert_eq!(
            Credential::from_env(Some("bad\ntoken".into()), None)
                .unwrap_err()
                .to_string(),
            "SNAPSHOT_RECEIVER_AUTHORITY_TOKEN: not a token a header can carry (visible ASCII \
             only)"
        );
        let secret = Credential::from_env(None, Some("whsec_eA==".into())).unwrap();
        assert_eq!(format!("{secret:?}"), "signing secret");
        assert_eq!(secret.secret(), Some("whsec_eA=="));
    }

    #[test]
    fn nesting_is_counted_outside_strings() {
        assert_eq!(nesting_deeper_than(r#"{"a":[{"b":1}]}"#, 3), None);
        assert_eq!(nesting_deeper_than(r#"{"a":[{"b":1}]}"#, 2), Some(3));
        assert_eq!(nesting_deeper_than(r#"{"a":"[[[[\"[["}"#, 1), None);
        assert_eq!(nesting_deeper_than(r#"[{},{},{}]"#, 2), None);
    }
}
