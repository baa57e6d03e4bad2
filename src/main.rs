//! The `snapshot-receiver` command-line tool.
//!
//! Errors are mapped to exit codes in one place (`main`): 0 success, 2 bad
//! input (missing file, invalid JSON, wrong fixture shape, bad arguments),
//! 1 anything else.

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use snapshot_receiver::{format_rfc3339, parse_rfc3339, replay, Fixture, Phase, ReplayLine};
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
    /// send time); default: closed loop, as fast as it goes.
    #[arg(long)]
    rate: Option<f64>,
    /// What to drive: the receiver, the naive global-mutex baseline, or the
    /// single-thread engine (the per-core limit; ignores --producers and --rate).
    #[arg(long, value_enum, default_value_t = LoadTarget::Receiver)]
    target: LoadTarget,
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
                .block_on(replay(&fixture, now))
                .map_err(|e| InputError(format!("{}: {e}", "fixture")))?;
            let mut out = std::io::stdout().lock();
            match format {
                Format::Json => {
                    for line in &report.lines {
                        serde_json::to_writer(&mut out, line)?;
                        writeln!(out)?;
                    }
                }
                Format::Text => write_text(&mut out, &report.lines, fixture.default_now())?,
            }
            out.flush()?;
            Ok(())
        }
        #[cfg(feature = "loadtest")]
        Command::Loadtest(args) => loadtest(args),
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
    if args.producers == 0 || args.shards == 0 || args.workers == Some(0) {
        return Err(
            InputError("--producers, --shards and --workers must be at least 1".into()).into(),
        );
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
    };
    // The bar polls the shared counter from its own thread, so producers only
    // pay for one relaxed add per 1024 deliveries.
    let finished = Arc::new(AtomicBool::new(false));
    let painter = tty.then(|| {
        let bar = ProgressBar::new(stream.len() as u64);
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
    let (target, run) = match args.target {
        LoadTarget::Receiver => (
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
            progress.store(stream.len() as u64, Ordering::Relaxed);
            ("engine", run)
        }
    };
    finished.store(true, Ordering::Relaxed);
    if let Some(painter) = painter {
        let _ = painter.join();
    }
    let check = loadgen::check(&stream, stream.expectation(), &run);
    let report = Report::new(target, &stream, &opts, &run, check);
    let mut out = std::io::stdout().lock();
    match args.format {
        Format::Json => {
            serde_json::to_writer(&mut out, &report)?;
            writeln!(out)?;
        }
        Format::Text => write_load_report(&mut out, &report)?,
    }
    out.flush()?;
    if !report.ok {
        anyhow::bail!(
            "correctness check failed: {} of {} assertions; first: {}",
            report.check.failed,
            report.check.assertions,
            report.check.failures.join("; ")
        );
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
        "target: {} ({mode}, {} producers, {} shards)",
        r.target, r.producers, r.shards
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
        let p = &r.pacer_lateness_ns;
        writeln!(
            out,
            "  pacer released late by: p50 {:.1} us, p99 {:.1} us, p99.9 {:.1} us, max {:.1} us",
            us(p.p50),
            us(p.p99),
            us(p.p999),
            us(p.max)
        )?;
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
                Phase::Delivery => {
                    let [n, event, object, decision, ver, paused, repl, ack, state] = [
                        "#",
                        "event",
                        "object",
                        "decision",
                        "ver",
                        "paused",
                        "repl",
                        "ack",
                        "state after",
                    ];
                    writeln!(
                        out,
                        "\n== deliveries (arrival order) ==\n{n:>3}  {event:<7} {object:<8} {decision:<34} {ver:>4} {paused:<6} {repl:<5} {ack:<11} {state}",
                    )?
                }
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
