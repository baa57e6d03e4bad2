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
}

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

/// The exit code of a failed command: [`EXIT_REFUSED`] when an
/// [`InputError`] is the error or its context, else [`EXIT_FAILED`].
fn exit_code(e: &anyhow::Error) -> u8 {
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
    }
}
