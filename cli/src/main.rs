//! The `snapshot-receiver` command-line tool.
//!
//! # Layout
//! - `main.rs` (this file): the argument parser, the tracing subscriber and
//!   the one place where errors become exit codes;
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
mod options;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// The tool's allocator (feature `mimalloc`, on by default): cheaper than
/// glibc malloc when deliveries are freed on another thread than the one
/// that parsed them (see Cargo.toml and docs/BENCHMARKS.md).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    /// Replays a fixture (docs/CONTRACT.md §6): every delivery in arrival order, then the
    /// authority snapshots, then the final state.
    Replay(cmd::replay::ReplayArgs),
    /// Publishes a fixture's deliveries, in order and with their duplicates,
    /// to a partitioned JetStream stream (created when absent).
    Publish(cmd::publish::PublishArgs),
    /// Consumes a partitioned JetStream stream into a durable receiver. Run
    /// several processes on one PostgreSQL database: they share the
    /// partitions through leases. Prints JSON Lines (partitions taken and
    /// released, retries, terminations, and a summary at the end).
    Consume(cmd::consume::ConsumeArgs),
    /// Generates a seeded stream of raw JSON deliveries (not timed), drives it
    /// through the receiver, and reports throughput, acknowledgement latency,
    /// peak RSS and an order-independent correctness check (exit 1 when the
    /// check fails, 2 when the run is refused).
    #[command(after_help = cmd::loadtest::EXIT_STATUS)]
    Loadtest(cmd::loadtest::LoadtestArgs),
    /// Runs the receiver behind HTTP: POST /events (signed webhooks, answered
    /// after the decision is recorded), operator endpoints, metrics and
    /// health. Stops on SIGTERM or ctrl-c after answering what is in flight.
    Serve(Box<cmd::serve::ServeArgs>),
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
    /// Removes event-identity records older than the retention window from
    /// a durable store.
    #[command(after_help = OPERATOR_EXIT_STATUS)]
    Purge(cmd::purge::PurgeArgs),
}

/// The exit codes of the operator commands, shown by their `--help`.
const OPERATOR_EXIT_STATUS: &str = "\
Exit status:
  0  done
  1  any other failure (the store could not be read or written, for example
     SQLite busy past its 5 s timeout; reconcile: the snapshots printed
     before the failure were applied, the rest not)
  2  bad arguments (an unreadable --snapshot file, a bad --now)
  3  no such store (a SQLite file that does not exist; nothing is created)
  4  not a receiver store (no receiver tables in the file or schema, a schema
     that does not exist, a file that is not SQLite; nothing is created)
  5  reconcile: a bad snapshot line (its number and what is wrong are
     printed); nothing was applied
  6  reconcile: a snapshot was refused as older than its object (not forced);
     the other lines were applied";

/// A failure with an exit code of its own, for the operator commands.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
struct Exit {
    /// The exit code.
    code: u8,
    /// What went wrong, in one line.
    message: String,
}

impl Exit {
    fn new(code: u8, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// Exit code: the store named does not exist.
const EXIT_NO_STORE: u8 = 3;

/// Exit code: the location holds no receiver store.
const EXIT_NOT_A_STORE: u8 = 4;

/// Exit code: a bad line in `reconcile --snapshot`; nothing was applied.
const EXIT_BAD_SNAPSHOT: u8 = 5;

/// Exit code: `reconcile` refused a snapshot older than its object.
const EXIT_SNAPSHOT_REFUSED: u8 = 6;

/// An error caused by the user's input, or a refusal to start with what the
/// user gave: exit code [`EXIT_REFUSED`]. Its message (and sources) are the
/// wrapped error's.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
struct InputError(Box<dyn std::error::Error + Send + Sync>);

impl InputError {
    /// An input error with this message.
    fn new(message: impl Into<String>) -> Self {
        Self(message.into().into())
    }
}

/// The exit code of bad input and of a refusal to start.
const EXIT_REFUSED: u8 = 2;

/// The exit code of every other failure, among them a failed `loadtest` check.
const EXIT_FAILED: u8 = 1;

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

/// The exit code of a failed command: an [`Exit`]'s own code; for a store
/// error anywhere in the chain that says the store is missing or is not a
/// receiver's, [`EXIT_NO_STORE`] or [`EXIT_NOT_A_STORE`]; [`EXIT_REFUSED`]
/// when an [`InputError`] is the error or its context; else [`EXIT_FAILED`].
fn exit_code(e: &anyhow::Error) -> u8 {
    use snapshot_receiver::store::StoreError;
    if let Some(exit) = e.downcast_ref::<Exit>() {
        return exit.code;
    }
    for cause in e.chain() {
        match cause.downcast_ref::<StoreError>() {
            Some(StoreError::Missing(_)) => return EXIT_NO_STORE,
            Some(StoreError::NotAStore(_)) => return EXIT_NOT_A_STORE,
            _ => {}
        }
    }
    if e.downcast_ref::<InputError>().is_some() {
        EXIT_REFUSED
    } else {
        EXIT_FAILED
    }
}

fn init_tracing(verbose: u8) {
    // Without -v only warnings, which need the operator's attention: an
    // expected answer (a reject over a limit, a refused authority) is logged
    // at info, so a replay or a load test prints nothing here by default.
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
        Command::Replay(args) => cmd::replay::run(args),
        Command::Publish(args) => cmd::publish::run(args),
        Command::Consume(args) => cmd::consume::run(args),
        Command::Loadtest(args) => cmd::loadtest::run(args),
        Command::Serve(args) => cmd::serve::run(*args),
        Command::Inspect(args) => cmd::inspect::run(args),
        Command::Audit(args) => cmd::audit::run(args),
        Command::Reconcile(args) => cmd::reconcile::run(args),
        Command::Purge(args) => cmd::purge::run(args),
    }
}
