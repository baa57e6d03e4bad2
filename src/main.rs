//! The `snapshot-receiver` command-line tool.
//!
//! Errors are mapped to exit codes in one place (`main`): 0 success, 2 bad
//! input (missing file, invalid JSON, wrong fixture shape, bad arguments),
//! 1 anything else.

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use snapshot_receiver::{
    format_rfc3339, jetstream, parse_rfc3339, replay_with, BuildError, Config, EqualVersionPolicy,
    Fixture, Limits, MetricsSnapshot, Phase, Profile, ProfileError, Receiver, ReplayLine,
    ReplayOptions,
};
use std::io::Write;
use std::path::PathBuf;

/// The tool's allocator (feature `mimalloc`, on by default): cheaper than
/// glibc malloc when deliveries are freed on another thread than the one
/// that parsed them (see Cargo.toml and docs/BENCHMARKS.md).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
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
    /// Generates a seeded stream of raw JSON deliveries (not timed), drives it
    /// through the receiver, and reports throughput, acknowledgement latency,
    /// peak RSS and an order-independent correctness check (exit 1 when the
    /// check fails).
    #[cfg(feature = "loadtest")]
    Loadtest(LoadtestArgs),
}

#[cfg(feature = "loadtest")]
#[derive(clap::Args)]
struct LoadtestArgs {
    /// Known objects (created at version 0 before the run).
    #[arg(long, default_value_t = 10_000)]
    objects: usize,
    /// Versions per object, when --deliveries is not given.
    #[arg(long, default_value_t = 20)]
    versions: u64,
    /// Exact number of deliveries (events then pick random objects); default:
    /// objects x versions plus variants, conflicts, unknown objects and duplicates.
    #[arg(long)]
    deliveries: Option<usize>,
    /// Fraction of deliveries that are redeliveries of an earlier event.
    #[arg(long, default_value_t = 0.3)]
    duplicates: f64,
    /// How far (in positions) a delivery may move from its natural place.
    #[arg(long, default_value_t = 64)]
    reorder_window: usize,
    /// Fraction of events that also get a conflicting variant (same event_id,
    /// different state); their object ends paused.
    #[arg(long, default_value_t = 0.001)]
    variants: f64,
    /// Fraction of objects that get an equal-version conflict at their highest
    /// version; they end paused.
    #[arg(long, default_value_t = 0.001)]
    conflicts: f64,
    /// Fraction of events that name an unknown object.
    #[arg(long, default_value_t = 0.001)]
    unknown: f64,
    /// Target body size in bytes.
    #[arg(long, default_value_t = 250)]
    payload: usize,
    /// Concurrent producer tasks.
    #[arg(long, default_value_t = 4)]
    producers: usize,
    /// Most deliveries a producer hands over per call: 1 sends each delivery
    /// on its own (`Receiver::deliver`; the mutex baseline locks per
    /// delivery); more uses `Receiver::deliver_batch` (the baseline locks per
    /// batch). In open loop a producer sends what has been released, up to this.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Shard tasks of the receiver.
    #[arg(long, default_value_t = 16)]
    shards: usize,
    /// Tokio worker threads (default: one per core).
    #[arg(long)]
    workers: Option<usize>,
    /// Generator seed: the same options and seed give the same bytes.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Open loop at this many deliveries per second (latency from the intended
    /// send time); default: closed loop, as fast as it goes. Open-loop
    /// producers poll for due deliveries instead of sleeping, so the run
    /// keeps every worker busy and its CPU time per delivery includes that.
    #[arg(long, allow_hyphen_values = true)]
    rate: Option<f64>,
    /// What to drive: the receiver, the naive global-mutex baseline (ignores
    /// --shards and --store), the single-thread engine (the per-core limit;
    /// ignores --producers, --rate, --batch, --shards and --store), or
    /// `compare`: all three over the same stream, --rounds times in rotating
    /// order, with the ratios of each round and their medians.
    #[arg(long, value_enum, default_value_t = LoadTarget::Receiver)]
    target: LoadTarget,
    /// With `--target compare` (ignored otherwise): how many rounds.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Run the receiver on a durable store: `sqlite:PATH` or
    /// `postgres://...` (it should be empty: the check expects a first run).
    #[arg(long, value_name = "LOCATION")]
    store: Option<String>,
    /// Output format: readable text, or one JSON object.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

#[cfg(feature = "loadtest")]
#[derive(Clone, Copy, ValueEnum)]
enum LoadTarget {
    Receiver,
    Mutex,
    Engine,
    Compare,
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
        // A reader that went away (`| head`) is not an error of ours.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            ExitCode::SUCCESS
        }
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
            // The clock line comes with the first recorded line, so that a
            // store that cannot be opened prints nothing on stdout.
            let mut clock_line = match format {
                Format::Text => now
                    .or_else(|| fixture.default_now())
                    .map(|at| format!("replay clock: {}", format_rfc3339(at))),
                Format::Json => None,
            };
            let mut failure: Option<std::io::Error> = None;
            let result = runtime.block_on(replay_with(&fixture, options, |line| {
                if failure.is_some() {
                    return;
                }
                // Each line is printed (and flushed) as soon as it is recorded.
                if let Some(clock) = clock_line.take() {
                    if let Err(e) = writeln!(out, "{clock}") {
                        failure = Some(e);
                        return;
                    }
                }
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
            // The receiver could not be built from what the user gave: an
            // invalid initial state, a store location that cannot be opened.
            let counters = result.map_err(|e| match e {
                BuildError::NoRuntime => anyhow::Error::new(e),
                other => anyhow::Error::new(InputError(other.to_string())),
            })?;
            // Counters only in text: the JSON Lines stay exactly SPEC §7.
            if let Format::Text = format {
                write_counters(&mut out, &counters)?;
            }
            Ok(())
        }
        #[cfg(feature = "loadtest")]
        Command::Loadtest(args) => loadtest(args),
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

#[cfg(feature = "loadtest")]
fn loadtest(args: LoadtestArgs) -> anyhow::Result<()> {
    use indicatif::{ProgressBar, ProgressStyle};
    use snapshot_receiver::loadgen::{self, LoadMode, LoadSpec, Report, RunOptions};
    use std::io::IsTerminal;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    let spec = LoadSpec {
        objects: args.objects,
        versions: args.versions,
        deliveries: args.deliveries,
        duplicate_rate: args.duplicates,
        reorder_window: args.reorder_window,
        variant_rate: args.variants,
        conflict_rate: args.conflicts,
        unknown_rate: args.unknown,
        payload_bytes: args.payload,
        seed: args.seed,
    };
    let mode = match args.rate {
        None => LoadMode::Closed,
        Some(rate) if rate.is_finite() && rate > 0.0 => LoadMode::Open { rate },
        Some(rate) => return Err(InputError(format!("--rate must be positive, got {rate}")).into()),
    };
    for (flag, value, most) in [
        ("--producers", args.producers, 4096),
        ("--shards", args.shards, 4096),
        ("--batch", args.batch, 1 << 20),
        ("--rounds", args.rounds, 1000),
        ("--workers", args.workers.unwrap_or(1), 1024),
    ] {
        if !(1..=most).contains(&value) {
            return Err(InputError(format!("{flag} must be from 1 to {most}, got {value}")).into());
        }
    }
    if let LoadMode::Open { rate } = mode {
        let deliveries = args
            .deliveries
            .unwrap_or(args.objects.saturating_mul(args.versions as usize));
        let seconds = deliveries as f64 / rate;
        if seconds > 60.0 {
            eprintln!("note: open loop at {rate}/s: the run takes at least {seconds:.0} s");
        }
    }
    if matches!(args.target, LoadTarget::Compare) && args.store.is_some() {
        return Err(InputError(
            "--store cannot be used with --target compare: the baselines keep no store, and a \
             store filled by one round would fail the next round's check"
                .into(),
        )
        .into());
    }
    let tty = std::io::stderr().is_terminal();
    let spinner = if tty {
        let s = ProgressBar::new_spinner().with_message("generating the delivery stream");
        s.enable_steady_tick(std::time::Duration::from_millis(100));
        s
    } else {
        ProgressBar::hidden()
    };
    let stream = Arc::new(loadgen::generate(&spec).map_err(|e| InputError(e.to_string()))?);
    spinner.finish_and_clear();

    let progress = Arc::new(AtomicU64::new(0));
    let opts = RunOptions {
        producers: args.producers,
        mode,
        shards: args.shards,
        record_latency: true,
        progress: Some(progress.clone()),
        store: args.store.clone(),
        batch: args.batch,
    };
    // Compare: engine, mutex and receiver in every round, each round in
    // another order, so that a slow spell of a shared machine does not
    // always hit the same target.
    // With --batch above 1, the mutex and the receiver also run one delivery
    // per call, so the batched receiver is compared with the naive
    // (lock-per-delivery) baseline in the same round too.
    let plan: Vec<(LoadTarget, usize)> = match args.target {
        LoadTarget::Compare => {
            let mut round = vec![
                (LoadTarget::Engine, 1),
                (LoadTarget::Mutex, args.batch),
                (LoadTarget::Receiver, args.batch),
            ];
            if args.batch > 1 {
                round.extend([(LoadTarget::Mutex, 1), (LoadTarget::Receiver, 1)]);
            }
            (0..args.rounds)
                .flat_map(|r| {
                    let mut order = round.clone();
                    let k = r % order.len();
                    order.rotate_left(k);
                    order
                })
                .collect()
        }
        t => vec![(t, args.batch)],
    };
    // The bar polls the shared counter from its own thread, so producers only
    // pay for one relaxed add per 1024 deliveries.
    let finished = Arc::new(AtomicBool::new(false));
    let painter = tty.then(|| {
        let bar = ProgressBar::new((stream.len() * plan.len()) as u64);
        bar.set_style(
            ProgressStyle::with_template(
                "{bar:40.cyan/blue} {human_pos}/{human_len} deliveries [{elapsed_precise}] eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        let (progress, finished) = (progress.clone(), finished.clone());
        std::thread::spawn(move || {
            while !finished.load(Ordering::Relaxed) {
                bar.set_position(progress.load(Ordering::Relaxed));
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            bar.finish_and_clear();
        })
    });

    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    if let Some(w) = args.workers {
        runtime.worker_threads(w);
    }
    let runtime = runtime.build().context("cannot start the tokio runtime")?;
    let mut reports = Vec::with_capacity(plan.len());
    for (target, batch) in plan {
        let opts = RunOptions {
            batch,
            ..opts.clone()
        };
        let (name, run) = match target {
            LoadTarget::Receiver | LoadTarget::Compare => (
                "receiver",
                runtime
                    .block_on(loadgen::run_receiver(&stream, &opts))
                    .context("cannot start the receiver")?,
            ),
            LoadTarget::Mutex => (
                "mutex",
                runtime.block_on(loadgen::run_global_mutex(&stream, &opts)),
            ),
            LoadTarget::Engine => {
                let run = loadgen::run_engine(&stream);
                progress.fetch_add(stream.len() as u64, Ordering::Relaxed);
                ("engine", run)
            }
        };
        let check = loadgen::check(&stream, stream.expectation(), &run);
        reports.push(Report::new(name, &stream, &opts, &run, check));
    }
    finished.store(true, Ordering::Relaxed);
    if let Some(painter) = painter {
        let _ = painter.join();
    }
    let mut out = std::io::stdout().lock();
    if let LoadTarget::Compare = args.target {
        let per_round = if args.batch > 1 { 5 } else { 3 };
        let comparison = loadgen::Comparison::of(reports, per_round);
        match args.format {
            Format::Json => {
                serde_json::to_writer(&mut out, &comparison)?;
                writeln!(out)?;
            }
            Format::Text => write_comparison(&mut out, &comparison)?,
        }
        out.flush()?;
        return match comparison.runs().find(|r| !r.ok) {
            Some(bad) => Err(check_failed(bad)),
            None => Ok(()),
        };
    }
    let report = reports.pop().context("one run was planned")?;
    match args.format {
        Format::Json => {
            serde_json::to_writer(&mut out, &report)?;
            writeln!(out)?;
        }
        Format::Text => write_load_report(&mut out, &report)?,
    }
    out.flush()?;
    if !report.ok {
        return Err(check_failed(&report));
    }
    Ok(())
}

#[cfg(feature = "loadtest")]
fn check_failed(report: &snapshot_receiver::loadgen::Report) -> anyhow::Error {
    anyhow::anyhow!(
        "correctness check failed ({}): {} of {} assertions; first: {}",
        report.target,
        report.check.failed,
        report.check.assertions,
        report.check.failures.join("; ")
    )
}

#[cfg(feature = "loadtest")]
fn write_comparison(
    out: &mut impl Write,
    c: &snapshot_receiver::loadgen::Comparison,
) -> std::io::Result<()> {
    let Some(first) = c.runs().next() else {
        return Ok(());
    };
    writeln!(
        out,
        "compare: engine (1 thread), mutex and receiver ({} producers, batch {}, {} shards), {} round{}",
        c.producers,
        c.batch,
        c.shards,
        c.rounds.len(),
        if c.rounds.len() == 1 { "" } else { "s" }
    )?;
    writeln!(
        out,
        "stream: {} deliveries, {} distinct events, {} objects, {:.0} B average body, seed {}",
        first.deliveries, first.distinct_events, first.objects, first.avg_body_bytes, first.seed
    )?;
    let cpu = |r: &snapshot_receiver::loadgen::Report| {
        r.cpu_us_per_delivery
            .map_or(String::new(), |c| format!(" ({c:.2} us CPU)"))
    };
    for (i, round) in c.rounds.iter().enumerate() {
        write!(
            out,
            "round {}: engine {:.0}/s{} | mutex {:.0}/s{} | receiver {:.0}/s{}",
            i + 1,
            round.engine.deliveries_per_s,
            cpu(&round.engine),
            round.mutex.deliveries_per_s,
            cpu(&round.mutex),
            round.receiver.deliveries_per_s,
            cpu(&round.receiver),
        )?;
        if let (Some(m), Some(r)) = (&round.mutex_unbatched, &round.receiver_unbatched) {
            write!(
                out,
                " | unbatched: mutex {:.0}/s{}, receiver {:.0}/s{}",
                m.deliveries_per_s,
                cpu(m),
                r.deliveries_per_s,
                cpu(r)
            )?;
        }
        write!(
            out,
            " | receiver/engine {:.2}, receiver/mutex {:.2}",
            round.receiver_over_engine, round.receiver_over_mutex
        )?;
        match round.receiver_over_unbatched_mutex {
            Some(x) => writeln!(out, ", receiver/unbatched mutex {x:.2}")?,
            None => writeln!(out)?,
        }
    }
    let m = &c.median;
    write!(
        out,
        "median: engine {:.0}/s, mutex {:.0}/s, receiver {:.0}/s",
        m.engine, m.mutex, m.receiver
    )?;
    if let (Some(mu), Some(ru)) = (m.mutex_unbatched, m.receiver_unbatched) {
        write!(
            out,
            ", unbatched mutex {mu:.0}/s, unbatched receiver {ru:.0}/s"
        )?;
    }
    write!(
        out,
        "; receiver/engine {:.2}, receiver/mutex {:.2}",
        m.receiver_over_engine, m.receiver_over_mutex
    )?;
    match m.receiver_over_unbatched_mutex {
        Some(x) => writeln!(out, ", receiver/unbatched mutex {x:.2}")?,
        None => writeln!(out)?,
    }
    let checks: u64 = c.runs().map(|r| r.check.assertions).sum();
    let failed = c.runs().filter(|r| !r.ok).count();
    if failed == 0 {
        writeln!(out, "check: ok in every run ({checks} assertions)")?;
    } else {
        writeln!(out, "check: FAILED in {failed} runs")?;
    }
    Ok(())
}

#[cfg(feature = "loadtest")]
fn write_load_report(
    out: &mut impl Write,
    r: &snapshot_receiver::loadgen::Report,
) -> std::io::Result<()> {
    let us = |ns: u64| ns as f64 / 1000.0;
    let mode = match r.rate {
        Some(rate) => format!("open loop at {rate:.0}/s"),
        None => "closed loop".to_owned(),
    };
    writeln!(
        out,
        "target: {} ({mode}, {} producers, batch {}, {} shards)",
        r.target, r.producers, r.batch, r.shards
    )?;
    writeln!(
        out,
        "stream: {} deliveries, {} distinct events, {} objects, {:.0} B average body, seed {}",
        r.deliveries, r.distinct_events, r.objects, r.avg_body_bytes, r.seed
    )?;
    write!(
        out,
        "throughput: {:.0} deliveries/s ({:.3} s",
        r.deliveries_per_s, r.elapsed_s
    )?;
    match r.cpu_us_per_delivery {
        Some(cpu) => writeln!(out, ", {cpu:.2} us CPU per delivery)")?,
        None => writeln!(out, ")")?,
    }
    let l = &r.latency_ns;
    if l.count > 0 {
        writeln!(
            out,
            "ack latency: p50 {:.1} us, p99 {:.1} us, p99.9 {:.1} us, max {:.1} us",
            us(l.p50),
            us(l.p99),
            us(l.p999),
            us(l.max)
        )?;
    }
    let s = &r.service_latency_ns;
    if r.rate.is_some() && s.count > 0 {
        writeln!(
            out,
            "  from the intended send time; from the actual send: p50 {:.1} us, p99 {:.1} us, p99.9 {:.1} us, max {:.1} us",
            us(s.p50),
            us(s.p99),
            us(s.p999),
            us(s.max)
        )?;
        let p = &r.send_lateness_ns;
        writeln!(
            out,
            "  sent after the intended time by: p50 {:.1} us, p99 {:.1} us, p99.9 {:.1} us, max {:.1} us",
            us(p.p50),
            us(p.p99),
            us(p.p999),
            us(p.max)
        )?;
    }
    if let Some(store) = &r.store {
        write_store_report(out, store, r.producers * r.batch)?;
    }
    match r.peak_rss_bytes {
        Some(b) => writeln!(out, "peak RSS: {:.1} MiB", b as f64 / (1024.0 * 1024.0))?,
        None => writeln!(out, "peak RSS: unknown")?,
    }
    let d = &r.decisions;
    writeln!(
        out,
        "decisions: applied {}, stale {}, duplicate {}, equal {}, conflict event_variant {}, \
         conflict version_state {}, held paused {}, held unknown_object {}, held other {}, \
         retry {}, reject {}",
        d.applied,
        d.stale,
        d.duplicate,
        d.equal,
        d.conflict_event_variant,
        d.conflict_version_state,
        d.held_paused,
        d.held_unknown_object,
        d.held_other,
        d.retry,
        d.reject
    )?;
    if r.ok {
        writeln!(out, "check: ok ({} assertions)", r.check.assertions)?;
    } else {
        writeln!(
            out,
            "check: FAILED ({} of {} assertions)",
            r.check.failed, r.check.assertions
        )?;
        for f in &r.check.failures {
            writeln!(out, "  - {f}")?;
        }
    }
    Ok(())
}

/// The `store:` lines of a load-test report.
#[cfg(feature = "loadtest")]
fn write_store_report(
    out: &mut impl Write,
    s: &snapshot_receiver::loadgen::StoreReport,
    in_flight: usize,
) -> std::io::Result<()> {
    let g = &s.deliveries_per_commit;
    let fsync = match (&s.fsync_per_s, &s.fsync_probe_error) {
        (Some(rate), _) => format!("{rate:.0} fsyncs/s"),
        (None, Some(why)) => format!("failed: {why}"),
        (None, None) => "not run".to_owned(),
    };
    writeln!(
        out,
        "store: {} commits, deliveries per commit mean {:.1} (p50 {}, max {}; {:.0} % of the {} in flight), \
         commit p50 {:.2} ms, p99 {:.2} ms, {} conflicts, {} failed; fsync probe before the run: {fsync}",
        s.commits,
        g.mean,
        g.p50,
        g.max,
        s.commit_fill * 100.0,
        in_flight,
        s.commit_ms.p50,
        s.commit_ms.p99,
        s.conflicts,
        s.failures
    )?;
    let c = &s.cpu_us_per_delivery;
    let outside = c
        .outside_committer
        .map_or_else(|| "unknown".to_owned(), |v| format!("{v:.2} us"));
    writeln!(
        out,
        "  CPU per delivery: outside the committer {outside}, encode {:.2} us, execute {:.2} us, \
         commit {:.2} us, committer other {:.2} us; committer waiting in execute {:.0} %, in commit {:.0} % of the run",
        c.encode,
        c.execute,
        c.commit,
        c.committer_other,
        s.waiting_share.execute * 100.0,
        s.waiting_share.commit * 100.0
    )
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
