//! The `snapshot-receiver` command-line tool.
//!
//! # Layout
//! - `main.rs` (this file): the argument parser and the tracing subscriber;
//! - `error`: the tool's error types and the one place where errors become
//!   exit codes;
//! - `options`: the option groups several commands share (limits, profile,
//!   output format);
//! - `cmd/`: one file per subcommand, each with the writers of what it
//!   prints: `replay`, `publish`, `consume`, `loadtest` (its report writers
//!   in `loadtest/report.rs`), `serve` (the HTTP front door, in `serve/`).
//!
//! Exit codes: 0 success; 2 bad input or a refusal to start (missing file,
//! invalid JSON, wrong fixture shape, bad arguments, a store that cannot be
//! used, `loadtest` on a store that is not empty); 1 anything else, among it
//! a `loadtest` whose correctness check failed.

mod cmd;
mod error;
mod options;

use clap::{Parser, Subcommand};
use error::{exit_code, InputError, OPERATOR_EXIT_STATUS};
use std::process::ExitCode;

/// The tool's allocator (feature `mimalloc`, part of `full`): cheaper than
/// glibc malloc when deliveries are freed on another thread than the one
/// that parsed them (see Cargo.toml and docs/BENCHMARKS.md).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Applies incoming events to local object state without treating arrival
/// order as truth.
#[derive(Parser)]
#[command(name = "snapshot-receiver", version, about, after_help = build_note())]
struct Cli {
    /// More log output on stderr (-v: info, -vv: debug, -vvv: trace); RUST_LOG (`level` or `target=level`, comma-separated) overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Replays a fixture (docs/CONTRACT.md §6): every delivery in arrival order, then the
    /// authority snapshots, then the final state.
    Replay(cmd::replay::ReplayArgs),
    /// Publishes a fixture's deliveries, in order and with their duplicates,
    /// to a partitioned JetStream stream (created when absent).
    #[cfg(feature = "jetstream")]
    Publish(cmd::publish::PublishArgs),
    /// Consumes a partitioned JetStream stream into a durable receiver. Run
    /// several processes on one PostgreSQL database: they share the
    /// partitions through leases. Prints JSON Lines (partitions taken and
    /// released, retries, terminations, and a summary at the end).
    #[cfg(feature = "jetstream")]
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
    Serve(Box<cmd::serve::ServeArgs>),
    /// Signs a body the way a Standard Webhooks sender does (a `whsec_`
    /// secret, HMAC-SHA256 over `id.timestamp.body`) and prints the three
    /// headers, or posts it (`--post URL`) and prints the answer.
    #[cfg(feature = "serve")]
    Sign(cmd::sign::SignArgs),
    /// Forwards the effects a durable store records to the application
    /// (`--forward URL`, as `serve --forward` does) without serving: a
    /// named relay that resumes at its cursor. Stops on SIGTERM or ctrl-c
    /// after saving its progress.
    #[cfg(feature = "serve")]
    Relay(cmd::relay::RelayArgs),
    /// Shows what a durable store holds: deliveries by decision, paused
    /// objects and what paused them, held events by reason, parked unknown
    /// objects, identities. Read-only; safe while a receiver writes the store.
    #[command(after_help = OPERATOR_EXIT_STATUS)]
    Inspect(cmd::inspect::InspectArgs),
    /// Prints the audit trail of one event (--event) or one object
    /// (--object) in the order it was recorded. Read-only.
    #[command(after_help = OPERATOR_EXIT_STATUS)]
    Audit(cmd::audit::AuditArgs),
    /// Applies authoritative snapshots (JSON Lines) to a durable store
    /// through the receiver's reconciliation: un-pauses, re-decides held
    /// events; `"force": true` replaces a newer object. Checks every line
    /// first: one bad line and nothing is applied.
    #[command(after_help = OPERATOR_EXIT_STATUS)]
    Reconcile(cmd::reconcile::ReconcileArgs),
    /// Removes what is past its retention window from a durable store: event
    /// identities, then audit rows, history rows and resolved held rows, in
    /// batches (rows of events still held, parked or unresolved are kept).
    #[command(after_help = OPERATOR_EXIT_STATUS)]
    Purge(cmd::purge::PurgeArgs),
    /// Shows the relays of a durable store (cursor, lag, parked and failed
    /// effects) and changes them: retry failed effects, skip one, rewind a
    /// relay. A running relay reads its state again at its next save.
    #[command(after_help = OPERATOR_EXIT_STATUS)]
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
/// the one command that builds the whole tool.
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
        "This build leaves out {}. The whole tool:\n  cargo install --locked --path cli --features full",
        left_out.join(", ")
    )
}

/// The error for a command this build does not have: a known one names its
/// feature, anything else is an unknown command.
fn missing_command(args: &[String]) -> anyhow::Error {
    let name = args.first().map_or("", String::as_str);
    match FEATURE_COMMANDS.iter().find(|(n, _, _)| *n == name) {
        Some((_, feature, _)) => anyhow::Error::new(InputError::new(format!(
            "`{name}` is not in this build: it needs the `{feature}` feature \
             (cargo install --locked --path cli --features {feature}, or --features full)"
        ))),
        None => anyhow::Error::new(InputError::new(format!(
            "unknown command `{name}`; see snapshot-receiver --help"
        ))),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.verbose);
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
            eprintln!("error: {e:#}");
            ExitCode::from(exit_code(&e))
        }
    }
}

/// Installs the subscriber that writes log lines on stderr: warnings by
/// default, more with each `-v`; `RUST_LOG` (comma-separated `level` or
/// `target=level` directives, as `tracing_subscriber::filter::Targets`
/// reads them) overrides both. A `RUST_LOG` that does not parse is named on
/// stderr and the default applies.
fn init_tracing(verbose: u8) {
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
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .with(filter)
        .init();
}

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
        Command::Inspect(args) => cmd::inspect::run(args),
        Command::Audit(args) => cmd::audit::run(args),
        Command::Reconcile(args) => cmd::reconcile::run(args),
        Command::Purge(args) => cmd::purge::run(args),
        Command::Relays(args) => cmd::relays::run(args),
        Command::Other(args) => Err(missing_command(&args)),
    }
}
