//! The `snapshot-receiver` command-line tool.
//!
//! Errors are mapped to exit codes in one place (`main`): 0 success, 2 bad
//! input (missing file, invalid JSON, wrong fixture shape, bad arguments),
//! 1 anything else.

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use snapshot_receiver::{
    format_rfc3339, parse_rfc3339, replay_with, BuildError, EqualVersionPolicy, Fixture, Limits,
    MetricsSnapshot, Phase, Profile, ProfileError, ReplayLine, ReplayOptions,
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
        /// Envelope profile: card (SPEC §2), shipment or generic. Default: the
        /// fixture's `profile`, else card.
        #[arg(long, value_name = "NAME", conflicts_with = "profile_file")]
        profile: Option<String>,
        /// A profile in a JSON file (pointers for event_id, object_id, version, ...).
        #[arg(long, value_name = "PATH")]
        profile_file: Option<PathBuf>,
        /// With `--profile generic`: where the version is (a JSON Pointer).
        #[arg(long, value_name = "POINTER", default_value = "/data/object/version")]
        version_pointer: String,
        /// An equal version with a different state: `conflict` (SPEC §3, pause)
        /// or `ignore` (recorded as stale, the reducer's rule).
        #[arg(long, value_enum, default_value_t = EqualVersions::Conflict)]
        equal_versions: EqualVersions,
        /// Print each object's history of accepted snapshots (the effects) at the end.
        #[arg(long)]
        history: bool,
        #[command(flatten)]
        limits: LimitArgs,
    },
}

/// The receiver's limits (see docs/HOSTILE-INPUT.md). A body over a size,
/// depth or id limit is answered `reject`; a delivery that would pass a queue
/// limit is answered `retry`. Neither is recorded.
#[derive(clap::Args)]
struct LimitArgs {
    /// Largest accepted body in bytes; larger bodies are rejected (HTTP 413).
    #[arg(long, value_name = "BYTES", default_value_t = Limits::default().max_body_bytes)]
    max_body_bytes: usize,
    /// Deepest accepted JSON nesting (the top-level object is depth 1; values
    /// above 1024 act as 1024); deeper bodies are rejected (HTTP 400).
    #[arg(long, value_name = "LEVELS", default_value_t = Limits::default().max_depth,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    max_depth: usize,
    /// Longest accepted `event_id` / `object_id`, in bytes of decoded UTF-8;
    /// longer ids are rejected (HTTP 400).
    #[arg(long, value_name = "BYTES", default_value_t = Limits::default().max_id_bytes)]
    max_id_bytes: usize,
    /// Most events held for one known object; one more hold is answered `retry`.
    #[arg(long, value_name = "EVENTS", default_value_t = Limits::default().max_held_per_object)]
    max_held_per_object: usize,
    /// Most events parked for one unknown object; one more is answered `retry`.
    #[arg(long, value_name = "EVENTS", default_value_t = Limits::default().max_parked_per_object)]
    max_parked_per_object: usize,
    /// Most events parked for unknown objects per shard; one more is answered `retry`.
    #[arg(long, value_name = "EVENTS", default_value_t = Limits::default().max_parked_per_shard)]
    max_parked_per_shard: usize,
}

impl From<LimitArgs> for Limits {
    fn from(a: LimitArgs) -> Self {
        Limits {
            max_body_bytes: a.max_body_bytes,
            max_depth: a.max_depth,
            max_id_bytes: a.max_id_bytes,
            max_held_per_object: a.max_held_per_object,
            max_parked_per_object: a.max_parked_per_object,
            max_parked_per_shard: a.max_parked_per_shard,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum EqualVersions {
    Conflict,
    Ignore,
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
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
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
            profile,
            profile_file,
            version_pointer,
            equal_versions,
            history,
            limits,
        } => {
            let profile = match (profile.as_deref(), profile_file) {
                (Some("generic"), _) => Some(Profile::generic(&version_pointer)),
                (Some(name), _) => Some(Profile::named(name)),
                (None, Some(path)) => Some(
                    std::fs::read_to_string(&path)
                        .map_err(|e| ProfileError(format!("{}: cannot read: {e}", path.display())))
                        .and_then(|text| Profile::from_json(&text))
                        .map_err(|e| ProfileError(format!("{}: {e}", path.display()))),
                ),
                (None, None) => None,
            }
            .transpose()
            .map_err(|e| InputError(format!("--profile: {e}")))?;
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
                profile,
                equal_versions: match equal_versions {
                    EqualVersions::Conflict => EqualVersionPolicy::Conflict,
                    EqualVersions::Ignore => EqualVersionPolicy::Ignore,
                },
                history,
                limits: limits.into(),
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
            let counters = result.map_err(|e| match e {
                BuildError::InvalidState { .. } => anyhow::Error::new(InputError(e.to_string())),
                other => anyhow::Error::new(other),
            })?;
            // Counters only in text: the JSON Lines stay exactly SPEC §7.
            if let Format::Text = format {
                write_counters(&mut out, &counters)?;
            }
            Ok(())
        }
    }
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
                    "\n== deliveries (arrival order) ==\n{:>3}  {:<12} {:<12} {:<34} {:>4} {:<6} {:<5} {:<11} state after",
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
            "{:>3}  {:<12} {:<12} {:<34} {:>4} {:<6} {:<5} {:<11} {}",
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
        let state = if card.deleted {
            "deleted (tombstone)".to_owned()
        } else {
            card.state.to_string()
        };
        let paused = if card.paused { " (paused)" } else { "" };
        writeln!(out, "{id} v{} {state}{paused}", card.version)?;
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
    if let Some(history) = &line.history {
        writeln!(out, "history (accepted snapshots; one effect each):")?;
        for (id, entries) in history {
            for h in entries {
                writeln!(
                    out,
                    "  {id} v{} {} <- {} (effect #{})",
                    h.version, h.state, h.cause, h.seq
                )?;
            }
        }
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

/// The receiver's counters after the replay, one `key value` per line, every
/// counter (zeros included) so the list has the same shape on every run.
fn write_counters(out: &mut impl Write, counters: &MetricsSnapshot) -> std::io::Result<()> {
    writeln!(out, "\n== counters ==")?;
    let width = counters.keys().map(String::len).max().unwrap_or(0);
    for (key, value) in counters {
        writeln!(out, "{key:<width$} {value}")?;
    }
    Ok(())
}
