//! The `snapshot-receiver` command-line tool.
//!
//! Errors are mapped to exit codes in one place (`main`): 0 success, 2 bad
//! input (missing file, invalid JSON, wrong fixture shape, bad arguments),
//! 1 anything else.

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use snapshot_receiver::{
    format_rfc3339, parse_rfc3339, replay_with, BuildError, Fixture, Phase, ReplayLine,
    ReplayOptions,
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
