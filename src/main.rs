//! The `snapshot-receiver` command-line tool.
//!
//! Errors are mapped to exit codes in one place (`main`): 0 success, 2 bad
//! input (missing file, invalid JSON, wrong fixture shape, bad arguments),
//! 1 anything else.

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use snapshot_receiver::{
    format_rfc3339, parse_rfc3339, replay_with_limits, Fixture, Limits, MetricsSnapshot, Phase,
    ReplayLine,
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
            limits,
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
            let report = runtime
                .block_on(replay_with_limits(&fixture, now, limits.into()))
                .map_err(|e| InputError(format!("{}: {e}", "fixture")))?;
            let mut out = std::io::stdout().lock();
            match format {
                Format::Json => {
                    for line in &report.lines {
                        serde_json::to_writer(&mut out, line)?;
                        writeln!(out)?;
                    }
                }
                // Counters only in text: the JSON Lines stay exactly SPEC §7.
                Format::Text => {
                    write_text(&mut out, &report.lines, fixture.default_now())?;
                    write_counters(&mut out, &report.counters)?;
                }
            }
            out.flush()?;
            Ok(())
        }
    }
}

fn opt<T: std::fmt::Display>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn write_text(
    out: &mut impl Write,
    lines: &[ReplayLine],
    clock: Option<std::time::SystemTime>,
) -> std::io::Result<()> {
    if let Some(at) = clock {
        writeln!(out, "replay clock: {}", format_rfc3339(at))?;
    }
    let mut phase = None;
    for line in lines {
        if phase != Some(line.phase) {
            phase = Some(line.phase);
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
            write_final(out, line)?;
            continue;
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
    }
    Ok(())
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
