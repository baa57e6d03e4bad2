//! The `snapshot-receiver` command-line tool.
//!
//! # Layout
//! - `main.rs` (this file): the argument parser and the tracing subscriber;
//! - `error`: the tool's error types and the one place where errors become
//!   exit codes and messages;
//! - `options`: the option groups several commands share (limits, profile,
//!   output format);
//! - `redact`: URLs without their passwords and tokens, for whatever
//!   prints or logs one;
//! - `terminal`: strings a client chose, escaped for the text output
//!   (control and bidi characters shown as `\u{1b}`, `\n`, ...);
//! - `log`: the log lines on stderr, as text or JSON Lines;
//! - `config` (with `serve`): `serve`'s environment variables, `--config
//!   FILE` and `--print-config`, read where the parser is built;
//! - `cmd/`: one file per subcommand, each with the writers of what it
//!   prints: `replay`, `publish`, `consume`, `loadtest` (its report writers
//!   in `loadtest/report.rs`), `serve` (the HTTP front door, in `serve/`).
//!
//! Exit codes ([`error::EXIT_STATUS`], docs/DEPLOYMENT.md): 0 success; 2 bad
//! input or a refusal to start (missing file, invalid JSON, wrong fixture
//! shape, bad arguments, a store location this build cannot open, `loadtest`
//! on a store that is not empty); 3 and 4 a store that is missing or is not
//! a receiver's; 1 anything else, among it a store that cannot be opened,
//! read or written and a `loadtest` whose correctness check failed.

mod cmd;
#[cfg(feature = "serve")]
mod config;
mod error;
mod log;
mod options;
#[cfg(feature = "otlp")]
mod otlp;
mod redact;
mod terminal;

use clap::{Parser, Subcommand};
use error::{exit_code, InputError, EXIT_STATUS};
use std::process::ExitCode;

/// The tool's allocator (feature `mimalloc`, part of `full`): cheaper than
/// glibc malloc when deliveries are freed on another thread than the one
/// that parsed them (see Cargo.toml and docs/BENCHMARKS.md).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Turns transparent huge pages off for this process (Linux, with the
/// `mimalloc` feature). mimalloc asks the kernel for huge pages on its
/// arenas and gives freed memory back a second later, so that every page it
/// touches again is a fresh 2 MiB page the kernel zeroes first: under a
/// durable load that zeroing took 11 to 20 % of the process's CPU, 2 % with
/// them off (docs/BENCHMARKS.md, the relays). The kernel
/// applies the flag to mappings made before the call too (Linux 4.13 and
/// later); a kernel that refuses it leaves the default, which is only
/// slower.
#[cfg(all(feature = "mimalloc", target_os = "linux"))]
// unsafe: std has no prctl; the libc call is the only way to set the flag.
#[allow(unsafe_code)]
fn no_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE takes plain integers and reads or writes
    // no memory of the caller's.
    let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if rc != 0 {
        tracing::debug!(
            error = %std::io::Error::last_os_error(),
            "transparent huge pages left as the kernel has them"
        );
    }
}

/// Applies incoming events to local object state without treating arrival
/// order as truth.
#[derive(Parser)]
#[command(name = "snapshot-receiver", version, about, after_help = build_note())]
struct Cli {
    /// More log output on stderr (-v: info, -vv: debug, -vvv: trace); RUST_LOG (`level` or `target=level`, comma-separated) overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// How log lines on stderr are written: `text` for a person, `json` for a log pipeline (one
    /// object per line: time, level, target, message, then the fields such as event_id,
    /// object_id, decision, effect_id, relay, attempt).
    #[arg(
        long,
        value_enum,
        default_value_t,
        global = true,
        env = "SNAPSHOT_RECEIVER_LOG_FORMAT"
    )]
    log_format: log::LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replays a fixture (docs/CONTRACT.md §6): every delivery in arrival order, then the
    /// authority snapshots, then the final state.
    #[command(after_help = EXIT_STATUS)]
    Replay(cmd::replay::ReplayArgs),
    /// Publishes a fixture's deliveries, in order and with their duplicates,
    /// to a partitioned JetStream stream (created when absent).
    #[cfg(feature = "jetstream")]
    #[command(after_help = EXIT_STATUS)]
    Publish(cmd::publish::PublishArgs),
    /// Consumes a partitioned JetStream stream into a durable receiver. Run
    /// several processes on one PostgreSQL database: they share the
    /// partitions through leases. Prints JSON Lines (partitions taken and
    /// released, retries, terminations, and a summary at the end).
    #[cfg(feature = "jetstream")]
    #[command(after_help = EXIT_STATUS)]
    Consume(cmd::consume::ConsumeArgs),
    /// Generates a seeded stream of raw JSON deliveries (not timed), drives it
    /// through the receiver, and reports throughput, acknowledgement latency,
    /// peak RSS and an order-independent correctness check (exit 1 when the
    /// check fails, 2 when the run is refused).
    #[cfg(feature = "loadtest")]
    #[command(after_help = cmd::loadtest::EXIT_STATUS)]
    Loadtest(cmd::loadtest::LoadtestArgs),
    /// Runs the receiver behind HTTP: POST /events (signed webhooks, answered
    /// after the decision is recorded), operator endpoints, metrics and
    /// health. Stops on SIGTERM or ctrl-c after answering what is in flight.
    #[cfg(feature = "serve")]
    #[command(after_help = EXIT_STATUS)]
    Serve(Box<cmd::serve::ServeArgs>),
    /// Signs a body the way a Standard Webhooks sender does (a `whsec_`
    /// secret, HMAC-SHA256 over `id.timestamp.body`) and prints the three
    /// headers, or posts it (`--post URL`) and prints the answer.
    #[cfg(feature = "serve")]
    #[command(after_help = cmd::sign::EXIT_STATUS)]
    Sign(cmd::sign::SignArgs),
    /// Forwards the effects a durable store records to the application
    /// (`--forward URL`, as `serve --forward` does) without serving: a
    /// named relay that resumes at its cursor. Stops on SIGTERM or ctrl-c
    /// after saving its progress.
    #[cfg(feature = "serve")]
    #[command(after_help = EXIT_STATUS)]
    Relay(cmd::relay::RelayArgs),
    /// Fetches authoritative snapshots (`--authority URL`, as `serve
    /// --authority` does) for the objects of a durable store that need
    /// one, without serving: paused objects, objects holding events an
    /// authority can settle, parked unknown objects. Stops on SIGTERM or
    /// ctrl-c.
    #[cfg(feature = "serve")]
    #[command(after_help = EXIT_STATUS)]
    Reconciler(cmd::reconciler::ReconcilerCommandArgs),
    /// Shows what a durable store holds: deliveries by decision, paused
    /// objects and what paused them, held events by reason, parked unknown
    /// objects, identities. Read-only; safe while a receiver writes a SQLite
    /// or PostgreSQL store (an lsm: store is read while no process holds it).
    #[command(after_help = EXIT_STATUS)]
    Inspect(cmd::inspect::InspectArgs),
    /// Prints the audit trail of one event (--event) or one object
    /// (--object) in the order it was recorded. Read-only.
    #[command(after_help = EXIT_STATUS)]
    Audit(cmd::audit::AuditArgs),
    /// Applies authoritative snapshots (JSON Lines) to a durable store
    /// through the receiver's reconciliation: un-pauses, re-decides held
    /// events; `"force": true` replaces a newer object. Checks every line
    /// first: one bad line and nothing is applied.
    #[command(after_help = EXIT_STATUS)]
    Reconcile(cmd::reconcile::ReconcileArgs),
    /// Writes objects and receipts straight into a durable store, in large
    /// transactions (no decisions, no audit rows), to try a receiver at
    /// scale: its start-up, the identity filter's scan, the working set.
    #[command(after_help = EXIT_STATUS)]
    Fill(cmd::fill::FillArgs),
    /// Removes what is past its retention window from a durable store: event
    /// identities, then audit rows, history rows and resolved held rows, in
    /// batches (rows of events still held, parked or unresolved are kept).
    #[command(after_help = EXIT_STATUS)]
    Purge(cmd::purge::PurgeArgs),
    /// Shows the relays of a durable store (cursor, lag, parked and failed
    /// effects) and changes them: retry failed effects, skip one, rewind a
    /// relay. A running relay reads its state again at its next save.
    #[command(after_help = EXIT_STATUS)]
    Relays(cmd::relays::RelaysArgs),
    /// A command this build left out: says which feature brings it.
    #[command(external_subcommand)]
    Other(Vec<String>),
}

/// The commands a feature of this package adds, with that feature.
const FEATURE_COMMANDS: [(&str, &str, bool); 5] = [
    ("serve", "serve", cfg!(feature = "serve")),
    ("sign", "serve", cfg!(feature = "serve")),
    ("publish", "jetstream", cfg!(feature = "jetstream")),
    ("consume", "jetstream", cfg!(feature = "jetstream")),
    ("loadtest", "loadtest", cfg!(feature = "loadtest")),
];

/// The note under the top-level `--help`: what this build left out, and
/// the install command that adds it.
fn build_note() -> String {
    let mut left_out: Vec<String> = FEATURE_COMMANDS
        .iter()
        .filter(|(_, _, built)| !built)
        .map(|(name, _, _)| format!("`{name}`"))
        .collect();
    if !cfg!(feature = "postgres") {
        left_out.push("postgres:// stores".to_owned());
    }
    if left_out.is_empty() {
        return "This build has every feature (`full`).".to_owned();
    }
    format!(
        "This build leaves out {}: each needs a feature of the cli package \
         (`serve`, `postgres`, `jetstream`, `loadtest`, or `full` for all), for example\n  {}",
        left_out.join(", "),
        error::install_with("serve")
    )
}

/// The error for a command this build does not have: a known one names its
/// feature and the install command that adds it, anything else is an
/// unknown command.
fn missing_command(args: &[String]) -> anyhow::Error {
    let name = args.first().map_or("", String::as_str);
    match FEATURE_COMMANDS.iter().find(|(n, _, _)| *n == name) {
        Some((_, feature, _)) => anyhow::Error::new(InputError::new(format!(
            "`{name}` is not in this build: it needs the `{feature}` feature ({})",
            error::install_with(feature)
        ))),
        None => anyhow::Error::new(InputError::new(format!(
            "unknown command `{name}`; see snapshot-receiver --help"
        ))),
    }
}

/// The widest line `--help` and the parser's errors print: clap wraps only
/// with its `wrap_help` feature (three more crates in the default build),
/// so [`wrap`] does it.
const HELP_WIDTH: usize = 100;

/// `text` with every line wider than `width` characters broken between
/// words. A continuation line is indented as far as the text it continues:
/// past the flag or command name in `  --flag <V>  text` and `  name  text`
/// lines (the first run of two spaces after the line's indent, within the
/// first half of the width), else as far as the line itself. A clap note
/// in brackets is not broken ([`words`]).
fn wrap(text: &str, width: usize) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (line, newline) = match line.strip_suffix('\n') {
            Some(l) => (l, "\n"),
            None => (line, ""),
        };
        if line.chars().count() <= width {
            out.push_str(line);
            out.push_str(newline);
            continue;
        }
        let lead = line.len() - line.trim_start().len();
        let hang = line[lead..]
            .find("  ")
            .map(|gap| lead + gap)
            .map(|gap| gap + line[gap..].len() - line[gap..].trim_start().len())
            .filter(|&at| line[..at].chars().count() <= width / 2)
            .unwrap_or(lead);
        let indent = " ".repeat(line[..hang].chars().count());
        let mut current = line[..hang].to_owned();
        let mut room = width.saturating_sub(current.chars().count());
        let mut first_word = true;
        for word in words(&line[hang..]) {
            let len = word.chars().count();
            if !first_word && len + 1 > room {
                out.push_str(current.trim_end());
                out.push('\n');
                current = indent.clone();
                room = width.saturating_sub(indent.len());
                first_word = true;
            }
            if !first_word {
                current.push(' ');
                room = room.saturating_sub(1);
            }
            current.push_str(&word);
            room = room.saturating_sub(len);
            first_word = false;
        }
        out.push_str(current.trim_end());
        out.push_str(newline);
    }
    out
}

/// The words of `text`, where clap's notes (`[default: 5]`, `[env: NAME]`)
/// count as one word each, so that none is broken across lines.
fn words(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut open = false;
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        match out.last_mut() {
            Some(last) if open => {
                last.push(' ');
                last.push_str(word);
            }
            _ => out.push(word.to_owned()),
        }
        if word.starts_with('[') {
            open = true;
        }
        if word.ends_with(']') {
            open = false;
        }
    }
    out
}

/// A parser error about a number said in words: clap passes on Rust's own
/// (`invalid digit found in string`, `invalid float literal`). `None` for
/// any other error.
fn number_in_words(e: &clap::Error) -> Option<String> {
    use clap::error::ContextKind;
    use std::num::IntErrorKind;
    let source = std::error::Error::source(e)?;
    let why = if let Some(int) = source.downcast_ref::<std::num::ParseIntError>() {
        match int.kind() {
            IntErrorKind::Empty => "empty: a whole number is needed",
            IntErrorKind::PosOverflow => "too large a number for this flag",
            IntErrorKind::NegOverflow => "too small a number for this flag",
            _ => "not a whole number (digits only, for example 64)",
        }
    } else if source.downcast_ref::<std::num::ParseFloatError>().is_some() {
        "not a number (for example 30 or 0.5)"
    } else {
        return None;
    };
    let arg = e.get(ContextKind::InvalidArg)?;
    let value = e.get(ContextKind::InvalidValue)?;
    Some(format!(
        "error: invalid value '{value}' for '{arg}': {why}\n\nFor more information, try '--help'.\n"
    ))
}

/// Prints what clap answered instead of parsed arguments (help and version
/// on stdout, wrapped at [`HELP_WIDTH`]; a usage error on stderr); its exit
/// code.
fn parser_answer(e: &clap::Error) -> ExitCode {
    use clap::error::{ContextKind, ContextValue};
    use std::io::Write as _;
    let mut text = number_in_words(e).unwrap_or_else(|| e.render().to_string());
    // A refused value is quoted: a URL's secrets hidden.
    if let Some(ContextValue::String(value)) = e.get(ContextKind::InvalidValue) {
        text = redact::in_text(&text, value);
    }
    // Help is wrapped; an error stays on its line, as the tool's own do.
    let text = if e.use_stderr() {
        text
    } else {
        wrap(&text, HELP_WIDTH)
    };
    // A reader that went away (`--help | head`) is not an error of ours.
    let _ = if e.use_stderr() {
        std::io::stderr().write_all(text.as_bytes())
    } else {
        std::io::stdout().write_all(text.as_bytes())
    };
    ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2))
}

fn main() -> ExitCode {
    let cli = match parse() {
        Ok(Some(cli)) => cli,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => return parser_answer(&e),
    };
    #[cfg(feature = "otlp")]
    let _export = match &cli.command {
        Command::Serve(args) => {
            match init_tracing(cli.verbose, cli.log_format, args.otlp_endpoint.as_deref()) {
                Ok(export) => export,
                Err(e) => {
                    eprintln!("error: {}", terminal::escape_lines(&e));
                    return ExitCode::from(2);
                }
            }
        }
        _ => init_tracing(cli.verbose, cli.log_format, None).unwrap_or_default(),
    };
    #[cfg(not(feature = "otlp"))]
    init_tracing(cli.verbose, cli.log_format);
    #[cfg(all(feature = "mimalloc", target_os = "linux"))]
    no_huge_pages();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        // A reader that went away (`| head`) is not an error of ours.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}", terminal::escape_lines(&error::describe(&e)));
            ExitCode::from(exit_code(&e))
        }
    }
}

/// The command line parsed; `None` when it was answered already (`serve
/// --print-config`). With `serve`, its environment variables and `--config`
/// file are read too (the `config` module).
fn parse() -> Result<Option<Cli>, clap::Error> {
    #[cfg(feature = "serve")]
    {
        use clap::{CommandFactory as _, FromArgMatches as _};
        match config::parse(Cli::command(), std::env::args_os().collect())? {
            config::Parsed::Run(matches) => Cli::from_arg_matches(&matches).map(Some),
            config::Parsed::Printed => Ok(None),
        }
    }
    #[cfg(not(feature = "serve"))]
    Cli::try_parse().map(Some)
}

/// Installs the subscriber that writes log lines on stderr: warnings by
/// default, more with each `-v`; `RUST_LOG` (comma-separated `level` or
/// `target=level` directives, as `tracing_subscriber::filter::Targets`
/// reads them) overrides both. A `RUST_LOG` that does not parse is named on
/// stderr and the default applies. `format` says how lines are written
/// (text, or JSON Lines: see the `log` module).
fn init_tracing(
    verbose: u8,
    format: log::LogFormat,
    #[cfg(feature = "otlp")] otlp_endpoint: Option<&str>,
) -> TracingGuard {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    // Without -v only warnings, which need the operator's attention: an
    // expected answer (a reject over a limit, a refused authority) is logged
    // at info, so a replay or a load test prints nothing here by default.
    let default = match verbose {
        0 => tracing::Level::WARN,
        1 => tracing::Level::INFO,
        2 => tracing::Level::DEBUG,
        _ => tracing::Level::TRACE,
    };
    let filter = match std::env::var("RUST_LOG") {
        Ok(text) if !text.trim().is_empty() => {
            text.parse::<tracing_subscriber::filter::Targets>()
                .unwrap_or_else(|e| {
                    eprintln!("warning: RUST_LOG={text:?} is not `level` or `target=level` directives ({e}); using {default}");
                    tracing_subscriber::filter::Targets::new().with_default(default)
                })
        }
        _ => tracing_subscriber::filter::Targets::new().with_default(default),
    };
    // Text lines escape what they quote (an id with ESC or a newline
    // cannot forge a line); JSON escapes it by itself.
    let text = (format == log::LogFormat::Text)
        .then(|| tracing_subscriber::fmt::layer().with_writer(terminal::EscapedStderr));
    let json = (format == log::LogFormat::Json).then(log::JsonLines::stderr);
    #[cfg(feature = "otlp")]
    if let Some(endpoint) = otlp_endpoint {
        use tracing_subscriber::Layer as _;
        // The log lines keep their own filter; the exported spans are
        // those at info and above, whatever the console shows.
        let (otlp, export) = otlp::layer(endpoint)?;
        tracing_subscriber::registry()
            .with(tracing_subscriber::Layer::and_then(text, json).with_filter(filter))
            .with(otlp.with_filter(
                tracing_subscriber::filter::Targets::new().with_default(tracing::Level::INFO),
            ))
            .init();
        return Ok(Some(export));
    }
    tracing_subscriber::registry()
        .with(text)
        .with(json)
        .with(filter)
        .init();
    #[cfg(feature = "otlp")]
    return Ok(None);
}

/// What [`init_tracing`] hands back: with OTLP export, the exporter to keep
/// until exit (its drop exports what is still batched), or why it could
/// not start.
#[cfg(feature = "otlp")]
type TracingGuard = Result<Option<otlp::Export>, String>;
/// Without OTLP export, nothing.
#[cfg(not(feature = "otlp"))]
type TracingGuard = ();

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Replay(args) => cmd::replay::run(args),
        #[cfg(feature = "jetstream")]
        Command::Publish(args) => cmd::publish::run(args),
        #[cfg(feature = "jetstream")]
        Command::Consume(args) => cmd::consume::run(args),
        #[cfg(feature = "loadtest")]
        Command::Loadtest(args) => cmd::loadtest::run(args),
        #[cfg(feature = "serve")]
        Command::Serve(args) => cmd::serve::run(*args),
        #[cfg(feature = "serve")]
        Command::Sign(args) => cmd::sign::run(args),
        #[cfg(feature = "serve")]
        Command::Relay(args) => cmd::relay::run(args),
        #[cfg(feature = "serve")]
        Command::Reconciler(args) => cmd::reconciler::run(args),
        Command::Inspect(args) => cmd::inspect::run(args),
        Command::Audit(args) => cmd::audit::run(args),
        Command::Reconcile(args) => cmd::reconcile::run(args),
        Command::Purge(args) => cmd::purge::run(args),
        Command::Fill(args) => cmd::fill::run(args),
        Command::Relays(args) => cmd::relays::run(args),
        Command::Other(args) => Err(missing_command(&args)),
    }
}
