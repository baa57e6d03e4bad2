//! The `snapshot-receiver` command-line tool.
//!
//! Errors are mapped to exit codes in one place (`main`): 0 success, 2 bad
//! input (missing file, invalid JSON, wrong fixture shape, bad arguments),
//! 1 anything else.

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use snapshot_receiver::{
    format_rfc3339, jetstream, parse_rfc3339, replay_with, BuildError, Config, Fixture, Phase,
    Receiver, ReplayLine, ReplayOptions,
};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Applies incoming events to local object state without treating arrival
/// order as truth.
#[derive(Parser)]
#[command(name = "snapshot-receiver", version, about)]
struct Cli {
    /// More log output on stderr (-v: info, -vv: debug, -vvv: trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replays a fixture (SPEC §6): every delivery in arrival order, then the
    /// authority snapshots, then the final state.
    Replay {
        /// The fixture file, for example fixtures/B62-15-events.json.
        fixture: PathBuf,
        /// Output format: a readable table, or JSON Lines (SPEC §7 field names).
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// The replay clock (RFC 3339 UTC); default: the fixture's latest
        /// authority `as_of` or `transport.received_at`.
        #[arg(long)]
        now: Option<String>,
        /// Record every step durably before acknowledging it: `sqlite:PATH`
        /// or `postgres://USER@HOST:PORT/DB`. Default: in memory. On an
        /// existing store the receiver resumes where it stopped.
        #[arg(long, value_name = "LOCATION")]
        store: Option<String>,
        /// PostgreSQL only: the schema for the tables (created if absent).
        #[arg(long, value_name = "NAME", requires = "store")]
        store_schema: Option<String>,
    },
    /// Publishes a fixture's deliveries, in order and with their duplicates,
    /// to a partitioned JetStream stream (created when absent).
    Publish {
        /// The fixture whose deliveries are published.
        fixture: PathBuf,
        /// The NATS server.
        #[arg(long, default_value = "nats://127.0.0.1:4222", value_name = "URL")]
        nats: String,
        /// The stream.
        #[arg(long, value_name = "NAME")]
        stream: String,
        /// Partitions of a new stream (default 64); must match an existing one.
        #[arg(long, value_name = "P")]
        partitions: Option<u32>,
        /// Subjects of a new stream are PREFIX.<partition> (default: the stream name).
        #[arg(long, value_name = "PREFIX")]
        subject_prefix: Option<String>,
    },
    /// Consumes a partitioned JetStream stream into a durable receiver. Run
    /// several processes on one PostgreSQL database: they share the
    /// partitions through leases. Prints JSON Lines (partitions taken and
    /// released, retries, terminations, and a summary at the end).
    Consume {
        /// The NATS server.
        #[arg(long, default_value = "nats://127.0.0.1:4222", value_name = "URL")]
        nats: String,
        /// The stream.
        #[arg(long, value_name = "NAME")]
        stream: String,
        /// The durable store: `postgres://USER@HOST:PORT/DB` (shared by the
        /// processes) or `sqlite:PATH` (one process).
        #[arg(long, value_name = "LOCATION")]
        store: String,
        /// PostgreSQL only: the schema for the tables (created if absent).
        #[arg(long, value_name = "NAME")]
        store_schema: Option<String>,
        /// Seeds the objects of this fixture's `initial_state` that the store does not have.
        #[arg(long, value_name = "FIXTURE")]
        initial: Option<PathBuf>,
        /// The partition count this process expects (default: the stream's).
        #[arg(long, value_name = "P")]
        partitions: Option<u32>,
        /// This process's name among the consumers of the stream (default: HOST-PID).
        #[arg(long, value_name = "NAME")]
        member: Option<String>,
        /// Seconds a partition lease lives without renewal.
        #[arg(long, value_name = "SECONDS", default_value_t = 5.0)]
        lease_ttl: f64,
        /// Seconds JetStream waits for an acknowledgement before redelivering.
        #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
        ack_wait: f64,
        /// Seconds of delay asked for when a delivery could not be recorded (retry).
        #[arg(long, value_name = "SECONDS", default_value_t = 1.0)]
        retry_delay: f64,
        /// Exit when no message arrived for this many seconds.
        #[arg(long, value_name = "SECONDS")]
        idle_exit: Option<f64>,
        /// Also print one line per acknowledged message.
        #[arg(long)]
        print_acks: bool,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
}

/// An error caused by the user's input: exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct InputError(String);

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.verbose);
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            if e.downcast_ref::<InputError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

fn init_tracing(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Replay {
            fixture,
            format,
            now,
            store,
            store_schema,
        } => {
            let now =
                match now {
                    None => None,
                    Some(text) => Some(parse_rfc3339(&text).ok_or_else(|| {
                        InputError(format!("--now: not an RFC 3339 time: {text:?}"))
                    })?),
                };
            let fixture = Fixture::load(&fixture).map_err(|e| InputError(e.to_string()))?;
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("cannot start the tokio runtime")?;
            let options = ReplayOptions {
                now,
                store,
                schema: store_schema,
            };
            let mut out = std::io::stdout().lock();
            let mut text = TextWriter::default();
            if let (Format::Text, Some(at)) = (format, now.or_else(|| fixture.default_now())) {
                writeln!(out, "replay clock: {}", format_rfc3339(at))?;
            }
            let mut failure: Option<std::io::Error> = None;
            let result = runtime.block_on(replay_with(&fixture, options, |line| {
                if failure.is_some() {
                    return;
                }
                // Each line is printed (and flushed) as soon as it is recorded.
                let written = match format {
                    Format::Json => serde_json::to_writer(&mut out, line)
                        .map_err(std::io::Error::from)
                        .and_then(|()| writeln!(out)),
                    Format::Text => text.line(&mut out, line),
                };
                failure = written.and_then(|()| out.flush()).err();
            }));
            if let Some(e) = failure {
                return Err(e.into());
            }
            result.map_err(|e| match e {
                BuildError::InvalidState { .. } => anyhow::Error::new(InputError(e.to_string())),
                other => anyhow::Error::new(other),
            })
        }
        Command::Publish {
            fixture,
            nats,
            stream,
            partitions,
            subject_prefix,
        } => publish(
            &fixture,
            &nats,
            &stream,
            partitions,
            subject_prefix.as_deref(),
        ),
        Command::Consume {
            nats,
            stream,
            store,
            store_schema,
            initial,
            partitions,
            member,
            lease_ttl,
            ack_wait,
            retry_delay,
            idle_exit,
            print_acks,
        } => {
            let seconds = |name: &str, s: f64| {
                std::time::Duration::try_from_secs_f64(s)
                    .map_err(|_| InputError(format!("--{name}: not a number of seconds: {s}")))
            };
            let options = jetstream::ConsumeOptions {
                stream,
                partitions,
                member,
                lease_ttl: seconds("lease-ttl", lease_ttl)?,
                ack_wait: seconds("ack-wait", ack_wait)?,
                retry_delay: seconds("retry-delay", retry_delay)?,
                idle_exit: idle_exit.map(|s| seconds("idle-exit", s)).transpose()?,
                ..jetstream::ConsumeOptions::default()
            };
            consume(
                &nats,
                &store,
                store_schema,
                initial.as_deref(),
                options,
                print_acks,
            )
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")
}

/// `publish`: the fixture's deliveries, in order, to the stream.
fn publish(
    fixture: &std::path::Path,
    nats: &str,
    stream: &str,
    partitions: Option<u32>,
    prefix: Option<&str>,
) -> anyhow::Result<()> {
    let fixture = Fixture::load(fixture).map_err(|e| InputError(e.to_string()))?;
    runtime()?.block_on(async {
        let client = jetstream::connect(nats).await?;
        let publisher = jetstream::Publisher::new(client, stream, partitions, prefix).await?;
        let report = publisher
            .publish_all(fixture.deliveries.iter().map(|d| &d.body))
            .await?;
        let secs = report.elapsed.as_secs_f64();
        println!(
            "{}",
            serde_json::json!({
                "event": "published",
                "stream": stream,
                "partitions": publisher.layout().partitions,
                "subjects": format!("{}.<partition>", publisher.layout().subject_prefix),
                "published": report.published,
                "dropped_as_duplicate": report.dropped_as_duplicate,
                "seconds": secs,
                "per_second": if secs > 0.0 { report.published as f64 / secs } else { 0.0 },
            })
        );
        Ok(())
    })
}

/// `consume`: a durable receiver fed by the stream until SIGTERM, ctrl-c or
/// the idle time; JSON Lines on stdout, a summary last.
fn consume(
    nats: &str,
    store: &str,
    schema: Option<String>,
    initial: Option<&std::path::Path>,
    options: jetstream::ConsumeOptions,
    print_acks: bool,
) -> anyhow::Result<()> {
    let initial = match initial {
        Some(path) => {
            Fixture::load(path)
                .map_err(|e| InputError(e.to_string()))?
                .initial_state
        }
        None => Vec::new(),
    };
    runtime()?.block_on(async {
        // Keeping the audit trail in memory would grow without bound: the store has it.
        let mut builder = Receiver::builder().config(Config {
            audit: false,
            ..Config::default()
        });
        for (id, version, state) in &initial {
            builder = builder.object(id, *version, state);
        }
        let url = store.to_owned();
        builder = match schema {
            Some(schema) if url.starts_with("postgres") => builder.store_with(move || {
                snapshot_receiver::store::PostgresStore::connect_in_schema(&url, Some(&schema))
            }),
            Some(_) => {
                return Err(InputError("--store-schema needs a postgres:// store".into()).into())
            }
            None => builder.store(&url),
        };
        let receiver = builder.build()?;
        let client = jetstream::connect(nats).await?;
        let shutdown = tokio_util::sync::CancellationToken::new();
        let signals = tokio::spawn(stop_on_signal(shutdown.clone()));
        let sink: jetstream::EventSink = std::sync::Arc::new(move |event| {
            if let Some(line) = event_line(event, print_acks) {
                // Line-buffered: each line is out before the next event.
                let _ = writeln!(std::io::stdout().lock(), "{line}");
            }
        });
        let report = jetstream::consume(&receiver, client, options, shutdown, sink).await;
        signals.abort();
        receiver.shutdown().await;
        let report = report?;
        let ms = |t: Option<std::time::SystemTime>| {
            t.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_millis() as u64)
        };
        println!(
            "{}",
            serde_json::json!({
                "event": "summary",
                "member": report.member,
                "acknowledged": report.acknowledged,
                "retried": report.retried,
                "terminated": report.terminated,
                "ack_failures": report.ack_failures,
                "partitions_taken": report.partitions_taken,
                "first_message_unix_ms": ms(report.first_message),
                "last_ack_unix_ms": ms(report.last_ack),
                "per_second": report.rate(),
            })
        );
        Ok(())
    })
}

/// Cancels `token` on SIGTERM or ctrl-c.
async fn stop_on_signal(token: tokio_util::sync::CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    token.cancel();
}

/// The JSON line of a consume event (`None`: not printed).
fn event_line(event: &jetstream::ConsumeEvent, print_acks: bool) -> Option<serde_json::Value> {
    use jetstream::ConsumeEvent as E;
    Some(match event {
        E::Joined { member, partitions } => {
            serde_json::json!({"event": "joined", "member": member, "partitions": partitions})
        }
        E::Took { partition } => serde_json::json!({"event": "took", "partition": partition}),
        E::Released { partition } => {
            serde_json::json!({"event": "released", "partition": partition})
        }
        E::Lost { partition } => serde_json::json!({"event": "lost", "partition": partition}),
        E::Acknowledged {
            partition,
            stream_sequence,
            delivered,
            event_id,
            decision,
        } if print_acks => serde_json::json!({
            "event": "ack",
            "partition": partition,
            "seq": stream_sequence,
            "delivered": delivered,
            "event_id": event_id.as_deref(),
            "decision": decision.as_str(),
        }),
        E::Acknowledged { .. } => return None,
        E::Retry {
            partition,
            stream_sequence,
            reason,
        } => {
            serde_json::json!({"event": "retry", "partition": partition, "seq": stream_sequence, "reason": reason})
        }
        E::Terminated {
            partition,
            stream_sequence,
            reason,
        } => {
            serde_json::json!({"event": "terminated", "partition": partition, "seq": stream_sequence, "reason": reason})
        }
        _ => return None,
    })
}

fn opt<T: std::fmt::Display>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// Prints the text table line by line, with a heading per phase.
#[derive(Default)]
struct TextWriter {
    phase: Option<Phase>,
}

impl TextWriter {
    fn line(&mut self, out: &mut impl Write, line: &ReplayLine) -> std::io::Result<()> {
        if self.phase != Some(line.phase) {
            self.phase = Some(line.phase);
            match line.phase {
                Phase::Delivery => writeln!(
                    out,
                    "\n== deliveries (arrival order) ==\n{:>3}  {:<7} {:<8} {:<34} {:>4} {:<6} {:<5} {:<11} state after",
                    "#", "event", "object", "decision", "ver", "paused", "repl", "ack"
                )?,
                Phase::Reconcile => writeln!(out, "\n== reconciliation ==")?,
                Phase::Final => writeln!(out, "\n== final ==")?,
            }
        }
        if line.phase == Phase::Final {
            return write_final(out, line);
        }
        let mut decision = line.decision.unwrap_or("-").to_owned();
        if let Some(detail) = line
            .reason
            .as_ref()
            .or(line.conflict.map(str::to_owned).as_ref())
        {
            decision = format!("{decision} ({detail})");
        }
        if let Some(original) = &line.original_decision {
            decision = format!("{decision} of {original}");
        }
        writeln!(
            out,
            "{:>3}  {:<7} {:<8} {:<34} {:>4} {:<6} {:<5} {:<11} {}",
            line.step,
            opt(&line.event_id),
            opt(&line.object_id),
            decision,
            opt(&line.version),
            opt(&line.paused),
            line.replacement
                .map_or("-", |r| if r { "yes" } else { "no" }),
            line.ack.map_or("-", |a| a.as_str()),
            opt(&line.state),
        )?;
        if let Some(meaning) = &line.ack_meaning {
            writeln!(out, "{:>5}ack means: {meaning}", "")?;
        }
        Ok(())
    }
}

fn write_final(out: &mut impl Write, line: &ReplayLine) -> std::io::Result<()> {
    for (id, card) in line.cards.iter().flatten() {
        writeln!(
            out,
            "{id} v{} {}{}",
            card.version,
            card.state,
            if card.paused { " (paused)" } else { "" }
        )?;
    }
    if let Some(r) = line.replacements {
        writeln!(
            out,
            "replacements: {} event + {} authority = {}",
            r.event,
            r.authority,
            r.event + r.authority
        )?;
    }
    let unresolved = line.unresolved.as_deref().unwrap_or_default();
    if unresolved.is_empty() {
        writeln!(out, "unresolved: none")?;
    } else {
        writeln!(out, "unresolved inputs:")?;
        for u in unresolved {
            let by = u
                .superseded_by
                .map_or_else(String::new, |v| format!(" by authority v{v}"));
            writeln!(
                out,
                "  {} on {}: {} ({}{by})",
                opt(&u.event_id),
                opt(&u.object_id),
                u.reason,
                u.status
            )?;
        }
    }
    Ok(())
}
