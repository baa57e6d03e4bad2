//! `serve`: the receiver behind an HTTP front door.
//!
//! # Layout
//! - `mod.rs` (this file): the arguments, the start-up checks, the router
//!   and the graceful shutdown;
//! - `net`: the accept loop, the connection ceiling and time limits, the
//!   body deadline, the framing check and the panic catcher's answer;
//! - `webhook`: Standard Webhooks and generic HMAC-SHA256 signatures;
//! - `events`: `POST /events` and the receipt it answers with;
//! - `operator`: `POST /reconcile` and `POST /purge` behind a bearer token;
//! - `health`: `GET /metrics`, `/healthz`, `/readyz` and the response counter;
//! - `read`: `GET /objects`, `/held`, `/audit` from the durable store;
//! - `relays`: `GET /relays` and the operator's retry, skip and rewind;
//! - `page`: `GET /`, the status page;
//! - `warn`: repeated log lines summarised per kind and interval.
//!
//! The library stays free of HTTP: everything here is the tool's.
//!
//! Request handling works on a client's bytes: no arithmetic that can
//! overflow, no `unwrap`, no indexing that can panic (the lints below), and
//! a panic that still happens is answered 500 for that request alone
//! (`net::panic_response`).
#![deny(
    clippy::arithmetic_side_effects,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing
)]
// In the unit tests a panic is a failed test, not a client crashing a worker.
#![cfg_attr(
    test,
    allow(
        clippy::arithmetic_side_effects,
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing
    )
)]

mod events;
mod health;
mod login;
mod net;
mod operator;
mod page;
mod read;
mod relays;
pub(crate) mod trace;
mod warn;
pub(crate) mod webhook;

use crate::error::InputError;
use crate::options::{LimitArgs, ProfileArgs};
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use snapshot_receiver::{Config, Limits, Receiver};
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use webhook::{Encoding, Scheme, Verifier};

/// The store `serve` uses when `--store` is not given: a SQLite file in the
/// working directory.
pub(crate) const DEFAULT_STORE: &str = "sqlite:snapshot-receiver.db";

/// The start-up warning of a server that knows no object (none seeded
/// with `--initial`, none in the store) and whose profile does not create
/// objects: every delivery is `held` / `unknown_object` and parked until an
/// authority introduces its object (docs/CONTRACT.md §3.2). Logged at
/// WARN once, after the stdout lines.
pub(crate) const NO_OBJECTS: &str = "no objects known: deliveries for unknown objects will be parked; give --initial, a profile with create_on_first_snapshot, or an authority";

/// The environment variable holding webhook secrets (separated by
/// whitespace) when no `--webhook-secret` is given.
pub(crate) const SECRETS_ENV: &str = "SNAPSHOT_RECEIVER_WEBHOOK_SECRET";

/// The arguments of `serve`.
#[derive(clap::Args)]
pub(crate) struct ServeArgs {
    /// The address to listen on, HOST:PORT with HOST an IP address or a
    /// name that resolves (`localhost:8080`; port 0: any free port; the
    /// bound address is printed on stdout). A non-loopback address needs a
    /// webhook secret or --insecure.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:8080")]
    listen: String,
    /// Where decisions are recorded before they are acknowledged:
    /// `sqlite:PATH`, `postgres://USER@HOST:PORT/DB`, `lsm:DIR` (feature
    /// `lsm`), or `memory` (nothing survives the process). On an existing
    /// store the receiver resumes.
    #[arg(long, value_name = "LOCATION", default_value = DEFAULT_STORE,
          value_parser = crate::options::store_location)]
    store: String,
    /// PostgreSQL only: the schema for the tables (created if absent).
    #[arg(long, value_name = "NAME")]
    store_schema: Option<String>,
    /// Seeds the objects of this fixture's `initial_state` that the store
    /// does not have (a fresh store knows no objects).
    #[arg(long, value_name = "FIXTURE")]
    initial: Option<PathBuf>,
    #[command(flatten)]
    profile: ProfileArgs,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    retention: crate::options::RetentionArgs,
    /// Most objects kept in memory with a durable store (the working set),
    /// over all shards, each its share rounded up; the others are read from
    /// the store when a delivery names them. Paused objects and objects
    /// holding events always stay. Ignored with --store memory.
    #[arg(long, value_name = "OBJECTS",
          default_value_t = snapshot_receiver::DEFAULT_WORKING_SET)]
    working_set: usize,
    /// Most committed event identities kept in memory with a durable
    /// store, over all shards, each its share rounded up; the others'
    /// receipts are read from the store when a delivery names them (a
    /// duplicate still gets its first decision). Ignored with --store memory.
    #[arg(long, value_name = "IDENTITIES",
          default_value_t = snapshot_receiver::DEFAULT_IDENTITY_CACHE)]
    identity_cache: usize,
    /// What the receiver may keep in memory in all: a size such as
    /// `512MiB`, `2GiB` or `600MB`, or bytes (at least 16 MiB). Five
    /// sixteenths go to the working set of objects, three sixteenths to
    /// the store's engine (SQLite's page caches, the lsm store's cache and
    /// memtables; what it does not take goes to the objects), an eighth
    /// each to the identity cache, held/parked bodies and deliveries not yet answered (request
    /// bodies from their head on, before they are read), a sixteenth to
    /// the forwarding relay (parked effects' heads and a round's states;
    /// past it the relay's cursor stops), a thirty-second each to the
    /// in-memory trail and the reconciler's queue.
    /// Caches evict past their part; past the parts that cannot leave
    /// memory, deliveries are answered 503 `memory_full` with
    /// Retry-After. The count bounds (--working-set, --identity-cache)
    /// still apply.
    #[arg(long, value_name = "SIZE", default_value = "512MiB",
          value_parser = crate::options::memory_size)]
    memory_budget: usize,
    /// Event identities per retention window the filter of stored
    /// identities is sized for (about 2.4 bytes each), 0 for none: a
    /// delivery whose identity it rules out is decided without reading the
    /// store. Built in the background from the stored receipts after
    /// start-up. At most 1,000,000,000 (about 2.4 GB). Ignored with
    /// --store memory.
    #[arg(long, value_name = "IDENTITIES",
          default_value_t = snapshot_receiver::DEFAULT_IDENTITY_FILTER as u64,
          value_parser = crate::options::whole::<u64>(0, snapshot_receiver::MAX_IDENTITY_FILTER as u64))]
    identity_filter: u64,
    /// A webhook signing secret (repeat it to accept several while rotating).
    /// Standard Webhooks form `whsec_<base64>`; with --signature-header also
    /// any text (its bytes are the key). Default: the whitespace-separated
    /// secrets in SNAPSHOT_RECEIVER_WEBHOOK_SECRET.
    #[arg(long = "webhook-secret", value_name = "SECRET")]
    webhook_secrets: Vec<String>,
    /// How far `webhook-timestamp` may be from this server's clock, either
    /// way, before a request is refused as a possible replay.
    #[arg(long, value_name = "SECONDS", default_value_t = 300)]
    signature_tolerance: u64,
    /// Generic form instead of Standard Webhooks: the header holding the
    /// HMAC-SHA256 of the raw body (for example X-Hub-Signature-256).
    #[arg(long, value_name = "NAME")]
    signature_header: Option<String>,
    /// Generic form: how the header writes the MAC.
    #[arg(long, value_enum, value_name = "ENCODING", default_value_t = Encoding::Hex,
          requires = "signature_header")]
    signature_encoding: Encoding,
    /// Generic form: text before the MAC in the header (for example `sha256=`).
    #[arg(
        long,
        value_name = "TEXT",
        default_value = "",
        requires = "signature_header"
    )]
    signature_prefix: String,
    /// Accept unsigned deliveries on a non-loopback address.
    #[arg(long)]
    insecure: bool,
    /// The bearer token of the operator endpoints (POST /reconcile, POST
    /// /purge; without one they answer 403). When set, the read endpoints
    /// and the status page need it too.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "SNAPSHOT_RECEIVER_OPERATOR_TOKEN",
        hide_env_values = true
    )]
    operator_token: Option<String>,
    /// Seconds a sender is asked to wait (`Retry-After`) after a 503.
    #[arg(long, value_name = "SECONDS", default_value_t = 1)]
    retry_after: u64,
    /// Seconds to wait for requests in flight after the listener closed
    /// (see --shutdown-delay) before closing their connections (unanswered,
    /// so their senders redeliver). Connections without a request in flight
    /// are closed at once.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    shutdown_timeout: u64,
    /// Repeated log lines of one kind (the store refusing writes, refused
    /// signatures or tokens, bodies over the limit, 5xx answers) are
    /// written once, then summarised: one line per kind per this many
    /// seconds with the count of those not written. /metrics counts every one.
    #[arg(long, value_name = "SECONDS", default_value_t = 10,
          value_parser = crate::options::whole::<u64>(1, u64::MAX))]
    log_summary_interval: u64,
    /// Seconds between SIGTERM / ctrl-c and closing the listener: meanwhile
    /// `/readyz` answers 503 `stopping` and requests are still served, so a
    /// load balancer sees the server leave before connections are refused.
    /// A second signal ends the delay.
    #[arg(long, value_name = "SECONDS", default_value_t = 5)]
    shutdown_delay: u64,
    /// Seconds a connection has to send a complete request head, from its
    /// accept or from the previous response; then it is closed.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    header_timeout: u64,
    /// Seconds a request has to send its whole body once its head arrived,
    /// whatever the rate; then it is answered 408 and its connection closed.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    body_timeout: u64,
    /// Seconds a kept-alive connection may wait with no request; then it is
    /// closed.
    #[arg(long, value_name = "SECONDS", default_value_t = 5)]
    idle_timeout: u64,
    /// Open connections at most. At it, a new connection is let in by
    /// closing the one unchanged longest among those without a request
    /// (kept-alive between requests, or still sending its head), else the
    /// request whose body has waited longest (503 over_capacity); when
    /// every one has a request being decided, 8 spare connections answer
    /// /healthz and /readyz and refuse the rest with 503 over_capacity.
    /// Default: the soft open-file limit (RLIMIT_NOFILE) minus 64 kept for
    /// the store, its reader, the logs and the spares.
    #[arg(long, value_name = "N", value_parser = crate::options::whole::<u64>(1, u64::MAX))]
    max_connections: Option<u64>,
    /// Export spans (OpenTelemetry, OTLP over HTTP with protobuf bodies)
    /// to the collector at this URL, `http://HOST:PORT` (they go to
    /// `URL/v1/traces`, batched): the span of each delivery request, in the
    /// trace of its `traceparent` when it has one, and of each forward
    /// attempt, in the trace its effect kept. Only in builds with the
    /// `otlp` feature.
    #[cfg(feature = "otlp")]
    #[arg(long, value_name = "URL")]
    pub(crate) otlp_endpoint: Option<String>,
    #[command(flatten)]
    forward: super::forward::ForwardArgs,
    #[command(flatten)]
    reconciler: super::authority::ReconcilerArgs,
}

/// What every handler shares.
pub(crate) struct App {
    /// The receiver the deliveries go to.
    receiver: Receiver,
    /// The signature check; `None` accepts unsigned deliveries.
    verifier: Option<Verifier>,
    /// The operator endpoints' token; `None` turns them off.
    operator: Option<operator::OperatorToken>,
    /// Renders the `metrics` facade's counters for `GET /metrics`.
    prometheus: metrics_exporter_prometheus::PrometheusHandle,
    /// The durable store's read-only view, for the read endpoints and the
    /// page; `None` in memory. An `Arc`: each read moves a handle to a
    /// blocking thread.
    reader: Option<Arc<snapshot_receiver::store::StoreReader>>,
    /// Whether decisions go to a durable store (what `/readyz` checks).
    durable: bool,
    /// The store as given, for the banner (a URL's secrets hidden).
    store_label: String,
    /// The `Retry-After` value of every 503.
    retry_after: HeaderValue,
    /// The receiver's body limit, for the answer to a body refused while read.
    max_body_bytes: usize,
    /// The bytes of request bodies from their head to their answer, under
    /// the queued part of the memory budget ([`net::guard`] reserves them
    /// before a body is read), and the authority's answers while they are
    /// read. An `Arc`: the authority holds it too.
    receiving: Arc<snapshot_receiver::core::engine::QueuedBytes>,
    /// Set when a shutdown signal arrived: `/readyz` answers 503.
    stopping: AtomicBool,
    /// Keeps repeated log lines to one per kind per interval. An `Arc`: the
    /// task that writes the summaries holds it too.
    warnings: Arc<warn::WarnLimiter>,
    /// Cancelled when the listener closes (after the shutdown delay):
    /// bodies still being read end with 503.
    closing: CancellationToken,
    /// The connection limits.
    net: net::NetLimits,
    /// Set when a commit failed because the store is full, cleared by the
    /// next recorded decision: `/readyz` answers 503 `store full`.
    store_full: AtomicBool,
    /// The relays' connection of `GET /relays` and the relay changes,
    /// opened at the first call (in memory: the process's relays).
    outbox: tokio::sync::Mutex<Option<Box<dyn snapshot_receiver::store::OutboxStore>>>,
    /// The history window relays are judged against (`None` in memory).
    history: Option<Duration>,
    /// The reconciler fetching from `--authority`, for the status page;
    /// taken out to be stopped at shutdown. A std mutex: held to read its
    /// status or take it, never across an await.
    reconciler: std::sync::Mutex<Option<snapshot_receiver::reconciler::Reconciler>>,
    /// The relay this server runs (`--forward`): its name and its counts,
    /// for what only the running process knows (whether it is backlogged).
    relay: Option<(String, snapshot_receiver::relay::RelayWatch)>,
}

impl App {
    /// `report` with what this server knows of the relay it runs: whether
    /// it is backlogged.
    pub(crate) fn live(&self, report: &mut snapshot_receiver::store::RelaysReport) {
        if let Some((name, watch)) = &self.relay {
            report.mark_backlogged(name, watch.progress().backlogged);
        }
    }
}

/// A JSON response.
pub(crate) fn json_response(status: StatusCode, body: &impl serde::Serialize) -> Response {
    let text = serde_json::to_string(body).unwrap_or_else(|e| {
        format!("{{\"error\":\"response could not be written\",\"reason\":\"{e}\"}}")
    });
    (
        status,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        text,
    )
        .into_response()
}

/// The routes around `app`, in [`layers`].
fn router(app: Arc<App>) -> Router {
    let routes = Router::new()
        .route("/events", post(events::deliver))
        .route("/reconcile", post(operator::reconcile))
        .route("/purge", post(operator::purge))
        .route("/relays", get(relays::list))
        .route("/relays/{name}/retry", post(relays::retry))
        .route("/relays/{name}/skip", post(relays::skip))
        .route("/relays/{name}/rewind", post(relays::rewind))
        .route("/metrics", get(health::metrics))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/", get(page::status))
        .route("/login", get(login::form).post(login::login))
        .route("/logout", get(login::logout))
        .route("/objects", get(read::objects))
        .route("/objects/{id}", get(read::object))
        .route("/held", get(read::held))
        .route("/audit", get(read::audit));
    layers(routes, app)
}

/// `routes` in the middleware every request passes, innermost first: the
/// framing check and body deadline, the security headers, the panic catcher,
/// the response counter, the body limit, the tracing span.
fn layers(routes: Router<Arc<App>>, app: Arc<App>) -> Router {
    // One byte above the receiver's own limit: the receiver decides every
    // body it could accept; axum refuses only what the receiver would refuse
    // too, without buffering it whole.
    let limit = app.max_body_bytes.saturating_add(1);
    routes
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            net::guard,
        ))
        .layer(axum::middleware::from_fn(page::security_headers))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            net::panic_response,
        ))
        .layer(axum::middleware::from_fn(health::count_responses))
        .layer(DefaultBodyLimit::max(limit))
        .layer(
            tower_http::trace::TraceLayer::new_for_http().make_span_with(
                |request: &axum::http::Request<axum::body::Body>| {
                    let webhook_id = webhook::message_id(request.headers()).unwrap_or("");
                    tracing::info_span!(
                        "request",
                        method = %request.method(),
                        path = %request.uri().path(),
                        webhook_id,
                    )
                },
            )
            // tower-http's default writes an ERROR line per 5xx: one per
            // delivery during a store outage. Limited like the others.
            .on_failure({
                let app = app.clone();
                move |class: tower_http::classify::ServerErrorsFailureClass,
                      latency: Duration,
                      _: &tracing::Span| {
                    if app.warnings.admit(warn::WarnKind::ServerError) {
                        tracing::error!(classification = %class, latency_ms = latency.as_millis(), "response failed");
                    }
                }
            }),
        )
        .with_state(app)
}

/// The secrets: `--webhook-secret` values, else the environment variable's.
pub(crate) fn secrets(given: Vec<String>) -> Vec<String> {
    if !given.is_empty() {
        return given;
    }
    std::env::var(SECRETS_ENV)
        .map(|all| all.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// A store location fit for a log line: a URL's secrets hidden
/// ([`crate::redact::url`]).
fn store_label(location: &str) -> String {
    crate::redact::url(location)
}

/// The addresses `--listen` names: an IP address and port, or a host name
/// and port resolved by the system (`localhost:8080`).
///
/// # Errors
/// An [`InputError`] naming the text when it is not HOST:PORT or the name
/// does not resolve.
fn listen_addresses(text: &str) -> Result<Vec<SocketAddr>, InputError> {
    use std::net::ToSocketAddrs as _;
    let addresses: Vec<SocketAddr> = text
        .to_socket_addrs()
        .map_err(|e| {
            InputError::new(format!(
                "--listen {text}: expected HOST:PORT, for example 127.0.0.1:8080 or localhost:8080 ({e})"
            ))
        })?
        .collect();
    if addresses.is_empty() {
        return Err(InputError::new(format!(
            "--listen {text}: the name resolves to no address"
        )));
    }
    Ok(addresses)
}

/// Runs `serve` until SIGTERM or ctrl-c.
pub(crate) fn run(args: ServeArgs) -> anyhow::Result<()> {
    let secrets = secrets(args.webhook_secrets);
    let scheme = match &args.signature_header {
        None => Scheme::Standard {
            tolerance: Duration::from_secs(args.signature_tolerance),
        },
        Some(name) => Scheme::Generic {
            header: axum::http::HeaderName::try_from(name.to_ascii_lowercase()).map_err(|_| {
                InputError::new(format!("--signature-header: not a header name: {name:?}"))
            })?,
            encoding: args.signature_encoding,
            prefix: args.signature_prefix,
        },
    };
    let verifier = if secrets.is_empty() {
        if args.signature_header.is_some() {
            return Err(InputError::new(
                "--signature-header needs a secret (--webhook-secret or SNAPSHOT_RECEIVER_WEBHOOK_SECRET)",
            )
            .into());
        }
        None
    } else {
        Some(Verifier::new(scheme, &secrets).map_err(InputError::new)?)
    };
    let addresses = listen_addresses(&args.listen)?;
    if verifier.is_none() && !addresses.iter().all(|a| a.ip().is_loopback()) && !args.insecure {
        return Err(InputError::new(format!(
            "refusing to listen on {} without a webhook secret: anyone who reaches it could \
             record deliveries; give --webhook-secret (or SNAPSHOT_RECEIVER_WEBHOOK_SECRET), \
             listen on a loopback address, or pass --insecure",
            args.listen
        ))
        .into());
    }
    let operator = match args.operator_token.as_deref().map(str::trim) {
        Some("") => return Err(InputError::new("--operator-token: empty token").into()),
        Some(token) => Some(operator::OperatorToken::new(token).map_err(InputError::new)?),
        None => None,
    };
    let profile = args.profile.resolve()?;
    let limits: Limits = args.limits.into();
    let initial = match &args.initial {
        Some(path) => super::load_fixture(path)?.initial_state,
        None => Vec::new(),
    };
    let forward = args.forward.resolve()?;
    if let (Some(forward), Some(verifier)) = (&forward, &verifier) {
        forward.check_secret_apart(&secrets, verifier.scheme())?;
    }
    // Read by the argument parser already (`options::store_location`).
    let location = snapshot_receiver::store::Location::parse(&args.store)?;
    let durable = !location.is_memory();
    // Request bodies count against the queued part from their head to
    // their answer (`net::guard`), apart from the receiver's own queue,
    // which counts them again only while they are decided.
    let queued_part = snapshot_receiver::MemoryBudget::split(args.memory_budget)
        .map_err(|e| InputError::new(format!("--memory-budget: {e}")))?
        .queued;
    let receiving = Arc::new(snapshot_receiver::core::engine::QueuedBytes::new(
        queued_part,
    ));
    // Checked before anything starts; the reconciler starts with the
    // receiver.
    let authority = args.reconciler.authority.resolve(
        profile
            .as_ref()
            .unwrap_or(&snapshot_receiver::Profile::card()),
        &limits,
        receiving.clone(),
    )?;
    if let (Some(authority), Some(verifier)) = (&authority, &verifier) {
        authority.check_secret_apart(&secrets, verifier.scheme())?;
    }
    let net_limits = net::NetLimits {
        header_timeout: Duration::from_secs(args.header_timeout),
        body_timeout: Duration::from_secs(args.body_timeout),
        idle_timeout: Duration::from_secs(args.idle_timeout),
        max_connections: match args.max_connections {
            Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
            None => net::default_max_connections(),
        },
    };
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| anyhow::anyhow!("cannot install the metrics recorder: {e}"))?;
    health::describe_metrics();
    let runtime = super::runtime()?;
    runtime.block_on(async {
        // Listening first: a server that cannot listen creates no store.
        let listener = tokio::net::TcpListener::bind(&addresses[..])
            .await
            .map_err(|e| InputError::new(format!("--listen {}: {e}", args.listen)))?;
        let mut config = Config {
            limits: limits.clone(),
            // No trail in memory: with a durable store the store keeps
            // it, and with `--store memory` no endpoint reads it (the
            // read endpoints answer 404 there), so it would only hold
            // memory. Forwarding from memory reads the in-memory outbox,
            // which the trail's capacity bounds.
            audit: forward.is_some() && !durable,
            ..Config::default()
        };
        if let Some(profile) = profile {
            config.profile = profile;
        }
        let creates_objects = config.profile.create_on_first_snapshot;
        let records = args.retention.resolve()?;
        let mut builder = Receiver::builder()
            .config(config)
            .audit_retention(records.audit)
            .history_retention(records.history)
            .working_set(args.working_set)
            .identity_cache(args.identity_cache)
            .memory_budget(args.memory_budget)
            // In range (the parser's bound), so it fits a usize.
            .identity_filter(usize::try_from(args.identity_filter).unwrap_or(usize::MAX));
        for (id, version, state) in &initial {
            builder = builder.object(id, *version, state);
        }
        if durable {
            if let Some(schema) = &args.store_schema {
                builder = builder.store_schema(schema);
            }
            builder = builder.store(&args.store);
        } else if args.store_schema.is_some() {
            return Err(InputError::new("--store-schema needs a postgres:// store").into());
        }
        // The store's errors name its location (a URL without its password).
        let receiver = builder.build().map_err(crate::error::receiver_error)?;
        // Opened after the receiver created the tables.
        let reader = if durable {
            let (location, schema) = (args.store.clone(), args.store_schema.clone());
            let reader = tokio::task::spawn_blocking(move || {
                snapshot_receiver::store::StoreReader::open(&location, schema.as_deref())
            })
            .await??;
            Some(Arc::new(reader))
        } else {
            None
        };
        // The relay starts before the first line: effects recorded from
        // then on are forwarded (and those of earlier runs the relay has
        // not passed).
        let mut forward_name = String::new();
        let (relay, forwarding) = match forward {
            Some(f) => {
                let label = format!(
                    "; forwarding: {} as relay {}",
                    crate::terminal::shown(&f.url),
                    crate::terminal::shown(&f.options.name)
                );
                forward_name = f.options.name.clone();
                let relay = f.start(&receiver, limits.max_body_bytes).await?;
                (Some(relay), label)
            }
            None => (None, String::new()),
        };
        // The reconciler starts with the receiver: what the store holds
        // that needs an authority is fetched from now on.
        let (reconciler, fetching) = match authority {
            Some(authority) => {
                let label = format!("; authority: {}", crate::terminal::shown(authority.shown()));
                let reconciler = receiver
                    .reconciler(Arc::new(authority), args.reconciler.options())
                    .map_err(|e| InputError::new(format!("--authority: {e}")))?;
                (Some(reconciler), label)
            }
            None => (None, String::new()),
        };
        // Whether the start-up lines say that nothing will be applied yet:
        // no object seeded, none stored, and a profile that does not
        // create objects (docs/CONTRACT.md §3.2). Read once, before the
        // first line.
        let no_objects = match (&reader, initial.is_empty() && !creates_objects) {
            (_, false) => false,
            (None, true) => true,
            (Some(reader), true) => {
                let reader = reader.clone();
                tokio::task::spawn_blocking(move || reader.summary())
                    .await??
                    .objects
                    == 0
            }
        };
        let bound = listener.local_addr()?;
        let app = Arc::new(App {
            receiver: receiver.clone(),
            verifier,
            operator,
            prometheus,
            reader,
            durable,
            store_label: store_label(&args.store),
            retry_after: HeaderValue::from(args.retry_after),
            max_body_bytes: limits.max_body_bytes,
            receiving: receiving.clone(),
            stopping: AtomicBool::new(false),
            warnings: Arc::new(warn::WarnLimiter::new(Duration::from_secs(
                args.log_summary_interval,
            ))),
            closing: CancellationToken::new(),
            net: net_limits,
            store_full: AtomicBool::new(false),
            outbox: tokio::sync::Mutex::new(None),
            history: durable.then_some(records.history),
            reconciler: std::sync::Mutex::new(reconciler),
            relay: relay.as_ref().map(|r| (forward_name.clone(), r.watch())),
        });
        let summaries = tokio::spawn(app.warnings.clone().run());
        // Before the first line says the service is up: a SIGTERM from then
        // on drains (one sent as soon as the line is read used to kill the
        // process, when it came before the handler was installed).
        let stopped = super::stop_signal();
        {
            let signatures = match app.verifier.as_ref().map(|v| (v.scheme(), v.secrets())) {
                None => "off (unsigned deliveries accepted)".to_owned(),
                Some((Scheme::Standard { tolerance }, n)) => format!(
                    "Standard Webhooks, {n} secret(s), tolerance {} s",
                    tolerance.as_secs()
                ),
                Some((Scheme::Generic { header, .. }, n)) => {
                    format!("generic header {header}, {n} secret(s)")
                }
            };
            // The first line on stdout: scripts and tests read the address
            // here. A closed stdout does not stop the service.
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "listening on http://{bound}");
            let _ = writeln!(
                out,
                "store: {}; signatures: {signatures}; operator endpoints: {}{forwarding}{fetching}",
                crate::terminal::shown(&app.store_label),
                if app.operator.is_some() { "on" } else { "off" }
            );
            let _ = out.flush();
        }
        // A warning (shown at the default level, on stderr with the other
        // log lines): stdout's start-up lines keep their fixed shape for
        // the scripts that read them.
        if no_objects {
            tracing::warn!("{NO_OBJECTS}");
        }
        tracing::info!(
            max_connections = net_limits.max_connections,
            header_timeout_s = args.header_timeout,
            body_timeout_s = args.body_timeout,
            idle_timeout_s = args.idle_timeout,
            "connection limits"
        );
        net::install_panic_hook();
        let server = tokio::spawn(net::serve(
            listener,
            router(app.clone()),
            net_limits,
            app.closing.clone(),
            Duration::from_secs(args.shutdown_timeout),
        ));
        stopped.await;
        app.stopping.store(true, Ordering::Relaxed);
        let delay = Duration::from_secs(args.shutdown_delay);
        tracing::info!(
            "shutdown signal: /readyz answers 503; the listener closes in {} s",
            delay.as_secs()
        );
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = super::stop_signal() => {}
        }
        tracing::info!("no new connections; answering what is in flight");
        app.closing.cancel();
        server.await?;
        // Nothing more is fetched; the fetches in flight are applied
        // before the receiver stops.
        let reconciler = app
            .reconciler
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(reconciler) = reconciler {
            reconciler.stop().await?;
        }
        // Every answered request was answered after its commit; what is
        // still queued is decided and committed before the shards stop.
        receiver.shutdown().await;
        // The relay after the receiver: what the last commits recorded is
        // in the outbox, and its progress is saved for the next run.
        if let Some(relay) = relay {
            relay.stop().await?;
        }
        // The counts of the last interval, which no tick will write.
        summaries.abort();
        app.warnings.summarise();
        drop(app);
        drop(receiver);
        let _ = writeln!(std::io::stdout(), "stopped");
        Ok(())
    })
}

#[cfg(test)]
impl App {
    /// An app around `receiver` for handler tests: unsigned deliveries, no
    /// operator token, no store reader, the default connection limits.
    pub(crate) fn for_tests(receiver: Receiver, durable: bool) -> Self {
        Self {
            receiver,
            verifier: None,
            operator: None,
            prometheus: metrics_exporter_prometheus::PrometheusBuilder::new()
                .build_recorder()
                .handle(),
            reader: None,
            durable,
            store_label: "test".to_owned(),
            retry_after: HeaderValue::from(1u64),
            max_body_bytes: Limits::default().max_body_bytes,
            receiving: Arc::new(snapshot_receiver::core::engine::QueuedBytes::new(
                snapshot_receiver::MemoryBudget::default().queued,
            )),
            stopping: AtomicBool::new(false),
            warnings: Arc::new(warn::WarnLimiter::new(Duration::from_secs(10))),
            closing: CancellationToken::new(),
            net: net::NetLimits {
                header_timeout: Duration::from_secs(10),
                body_timeout: Duration::from_secs(30),
                idle_timeout: Duration::from_secs(5),
                max_connections: 16,
            },
            store_full: AtomicBool::new(false),
            outbox: tokio::sync::Mutex::new(None),
            history: None,
            reconciler: std::sync::Mutex::new(None),
            relay: None,
        }
    }
}
