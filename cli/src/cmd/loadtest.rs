//! `loadtest`: a seeded delivery stream driven through the receiver (or a
//! baseline), checked, and reported; the report writers are in `report`.

mod relay;
mod report;

use crate::error::InputError;
use crate::options::Format;
use anyhow::Context as _;
use clap::ValueEnum;
use snapshot_receiver::BuildError;
use std::io::Write;

/// The exit codes of `loadtest`, as `--help` lists them (see `exit_code` in
/// main.rs for where they are set).
pub(crate) const EXIT_STATUS: &str = "Exit status:
  0  the run finished and the correctness check passed
  1  the correctness check failed (the report is printed first), the run broke off,
     or the store could not be opened, read or written
  2  the run was refused before it started: a flag out of range, a --store this build
     cannot open, a store that already holds receipts";

/// The arguments of `loadtest`.
#[derive(clap::Args)]
pub(crate) struct LoadtestArgs {
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
    /// Run the receiver on a durable store: `sqlite:PATH`, `postgres://...`
    /// or `lsm:DIR` (it should be empty: the check expects a first run).
    #[arg(long, value_name = "LOCATION", value_parser = crate::options::store_location)]
    store: Option<String>,
    /// The receiver's memory budget: a size such as `512MiB` or `2GiB`, or
    /// bytes (at least 16 MiB), divided as `serve --memory-budget` divides
    /// it. Default 512 MiB. Ignored by the mutex and the engine.
    #[arg(long, value_name = "SIZE", value_parser = crate::options::memory_size)]
    memory_budget: Option<usize>,
    /// Output format: readable text, or one JSON object.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// A soak run instead: --deliveries new events (default 2,000,000) over
    /// --objects objects, built as they are sent, through a receiver with the
    /// default configuration except --retention-ms and --purge-ms, sampling
    /// the resident set size; reports it after warm-up and at the end. Uses
    /// --objects, --deliveries, --producers, --payload, --shards and
    /// --store (a durable receiver with the default working set and
    /// identity cache; the store should be empty).
    #[arg(long)]
    soak: bool,
    /// Run a relay on the loaded receiver (needs --store): `handler` hands
    /// every effect to an in-process handler that only records it (the
    /// relay's own cost); `http` forwards with `serve --forward`'s handler
    /// to a sink on loopback answering 204; `jetstream` publishes to a
    /// stream made for the run on --relay-nats (deleted after); `poll` is a
    /// hand-written relay whose cursor is a step number (to count what it
    /// misses). Reports effects reached, missed, re-sent, out of order, the
    /// rate and the time from answer to arrival; exit 1 when a relay other
    /// than `poll` missed one.
    #[arg(long, value_enum, value_name = "KIND")]
    relay: Option<relay::RelayKind>,
    /// With --relay: start it only once every delivery was answered, to
    /// time a catch-up over the whole outbox.
    #[arg(long, requires = "relay")]
    relay_catch_up: bool,
    /// With --relay: most objects whose effects are in flight at once.
    #[arg(long, default_value_t = 64, requires = "relay")]
    relay_concurrency: usize,
    /// With --relay jetstream: the NATS server.
    #[arg(long, value_name = "URL", default_value = "nats://127.0.0.1:4222")]
    relay_nats: String,
    /// Reconcile nothing: paused objects stay paused and their held events
    /// wait, as the check then expects. By default, when the stream has
    /// variants or equal-version conflicts, an in-process authority serves
    /// the generator's truth (each object's highest version and its state):
    /// the receiver runs its reconciler against it and the run waits, after
    /// the last delivery, for every object to be un-paused; the mutex and
    /// the engine reconcile each conflict's object in line, with no latency.
    /// Never with --relay (its check counts the effects of events only).
    #[arg(long)]
    no_authority: bool,
    /// How long the in-process authority takes to answer, in milliseconds.
    #[arg(long, default_value_t = 5, conflicts_with = "no_authority")]
    authority_latency_ms: u64,
    /// An authority outage: it answers `unavailable` from this many
    /// milliseconds after the delivery phase starts, for
    /// --authority-down-for-ms.
    #[arg(
        long,
        value_name = "MS",
        requires = "authority_down_for_ms",
        conflicts_with = "no_authority"
    )]
    authority_down_after_ms: Option<u64>,
    /// How long the authority outage lasts, in milliseconds.
    #[arg(long, value_name = "MS", requires = "authority_down_after_ms")]
    authority_down_for_ms: Option<u64>,
    /// With --soak: the retention window for event identities, in milliseconds.
    #[arg(long, default_value_t = 2000, requires = "soak")]
    retention_ms: u64,
    /// With --soak: how often the receiver purges expired identities, in milliseconds.
    #[arg(long, default_value_t = 500, requires = "soak")]
    purge_ms: u64,
}

/// What `--target` drives. (No doc comments on the values: they would add a
/// list to --help that repeats the `--target` text.)
#[derive(Clone, Copy, ValueEnum)]
enum LoadTarget {
    Receiver,
    Mutex,
    Engine,
    Compare,
}

/// Runs `loadtest`: exit 1 (an error) when a check failed, after the report
/// was printed; an [`InputError`] (exit 2) when it refuses to start.
pub(crate) fn run(args: LoadtestArgs) -> anyhow::Result<()> {
    use indicatif::{ProgressBar, ProgressStyle};
    use snapshot_receiver_loadgen::{self as loadgen, LoadMode, LoadSpec, Report, RunOptions};
    use std::io::IsTerminal;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    if args.soak {
        return soak(&args);
    }
    let relay = args.relay.map(|kind| relay::RelaySetup {
        kind,
        catch_up: args.relay_catch_up,
        concurrency: args.relay_concurrency,
        nats: args.relay_nats.clone(),
    });
    if let Some(setup) = &relay {
        relay::check(setup, args.store.as_deref())?;
        if !matches!(args.target, LoadTarget::Receiver) {
            return Err(InputError::new(
                "--relay runs beside the receiver: it cannot be used with --target mutex, \
                 engine or compare",
            )
            .into());
        }
    }
    let spec = LoadSpec {
        objects: args.objects,
        versions: args.versions,
        deliveries: args.deliveries,
        duplicate_rate: args.duplicates,
        reorder_window: args.reorder_window,
        variant_rate: args.variants,
        // Variants naming another object are the cluster simulation's.
        cross_variant_rate: 0.0,
        conflict_rate: args.conflicts,
        unknown_rate: args.unknown,
        payload_bytes: args.payload,
        seed: args.seed,
    };
    let mode = match args.rate {
        None => LoadMode::Closed,
        Some(rate) if rate.is_finite() && rate > 0.0 => LoadMode::Open { rate },
        Some(rate) => {
            return Err(InputError::new(format!("--rate must be positive, got {rate}")).into())
        }
    };
    for (flag, value, most) in [
        ("--producers", args.producers, 4096),
        ("--shards", args.shards, 4096),
        ("--batch", args.batch, 1 << 20),
        ("--rounds", args.rounds, 1000),
        ("--workers", args.workers.unwrap_or(1), 1024),
    ] {
        if !(1..=most).contains(&value) {
            return Err(
                InputError::new(format!("{flag} must be from 1 to {most}, got {value}")).into(),
            );
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
        return Err(InputError::new(
            "--store cannot be used with --target compare: the baselines keep no store, and a \
             store filled by one round would fail the next round's check",
        )
        .into());
    }
    // Reconcile when something can pause (see --no-authority); not beside
    // a relay, whose check counts the effects of events only.
    let pauses = args.variants > 0.0 || args.conflicts > 0.0;
    let authority = (!args.no_authority && args.relay.is_none() && pauses).then(|| {
        let ms = std::time::Duration::from_millis;
        loadgen::AuthorityOptions {
            latency: ms(args.authority_latency_ms),
            outage: args
                .authority_down_after_ms
                .zip(args.authority_down_for_ms)
                .map(|(after, length)| loadgen::Outage {
                    after: ms(after),
                    length: ms(length),
                }),
            ..loadgen::AuthorityOptions::default()
        }
    });
    let tty = std::io::stderr().is_terminal();
    let spinner = if tty {
        let s = ProgressBar::new_spinner().with_message("generating the delivery stream");
        s.enable_steady_tick(std::time::Duration::from_millis(100));
        s
    } else {
        ProgressBar::hidden()
    };
    let stream = Arc::new(loadgen::generate(&spec).map_err(InputError::wrap)?);
    spinner.finish_and_clear();

    let progress = Arc::new(AtomicU64::new(0));
    let answers = relay
        .as_ref()
        .filter(|r| !r.catch_up)
        .map(|_| Arc::new(loadgen::AnswerTimes::new(stream.len())));
    let opts = RunOptions {
        answers: answers.clone(),
        producers: args.producers,
        mode,
        shards: args.shards,
        record_latency: true,
        progress: Some(progress.clone()),
        store: args.store.clone(),
        memory_budget: args.memory_budget,
        batch: args.batch,
        authority: authority.clone(),
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
    if let Some(setup) = relay {
        let opts = RunOptions {
            batch: args.batch,
            ..opts
        };
        let answer_of = answer_lookup(&stream, answers);
        let (run, relayed) = runtime
            .block_on(loadgen::run_receiver_beside(
                &stream,
                &opts,
                move |receiver, answered| relay::run(setup, receiver, answered, answer_of),
            ))
            .map_err(refused)?;
        finished.store(true, Ordering::Relaxed);
        if let Some(painter) = painter {
            let _ = painter.join();
        }
        let relayed = relayed.map_err(|e| anyhow::anyhow!("the relay failed: {e}"))?;
        let check = loadgen::check(&stream, stream.expectation(), &run);
        let report = Report::new("receiver", &stream, &opts, &run, check);
        let mut out = std::io::stdout().lock();
        match args.format {
            Format::Json => {
                serde_json::to_writer(
                    &mut out,
                    &serde_json::json!({"load": report, "relay": relayed}),
                )?;
                writeln!(out)?;
            }
            Format::Text => {
                report::write_load_report(&mut out, &report)?;
                relayed.write(&mut out)?;
            }
        }
        out.flush()?;
        if !report.ok {
            return Err(check_failed(&report));
        }
        if !relayed.ok() {
            anyhow::bail!(
                "relay check failed: {} of {} effects missed, {} re-sent under another id, {} \
                 objects out of order, {} unknown arrivals",
                relayed.missed,
                relayed.effects,
                relayed.resent_with_another_id,
                relayed.out_of_order_objects,
                relayed.unknown
            );
        }
        return Ok(());
    }
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
                    .map_err(refused)?,
            ),
            LoadTarget::Mutex => (
                "mutex",
                runtime.block_on(loadgen::run_global_mutex(&stream, &opts)),
            ),
            LoadTarget::Engine => {
                let run = if authority.is_some() {
                    loadgen::run_engine_reconciling(&stream)
                } else {
                    loadgen::run_engine(&stream)
                };
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
            Format::Text => report::write_comparison(&mut out, &comparison)?,
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
        Format::Text => report::write_load_report(&mut out, &report)?,
    }
    out.flush()?;
    if !report.ok {
        return Err(check_failed(&report));
    }
    Ok(())
}

/// The earliest answer of each event of `stream`, by event id, once the
/// run filled `answers` (always `None` without them).
fn answer_lookup(
    stream: &snapshot_receiver_loadgen::Stream,
    answers: Option<std::sync::Arc<snapshot_receiver_loadgen::AnswerTimes>>,
) -> impl Fn(&str) -> Option<std::time::Instant> + Send + 'static {
    let mut deliveries: std::collections::HashMap<String, Vec<usize>> =
        std::collections::HashMap::new();
    if answers.is_some() {
        for i in 0..stream.len() {
            if let Some(id) = stream.event_id(i) {
                deliveries.entry(id).or_default().push(i);
            }
        }
    }
    move |event| {
        let answers = answers.as_ref()?;
        deliveries
            .get(event)?
            .iter()
            .filter_map(|&i| answers.get(i))
            .min()
    }
}

/// Runs `loadtest --soak` and prints its report; exit 1 when its check failed.
fn soak(args: &LoadtestArgs) -> anyhow::Result<()> {
    use snapshot_receiver_loadgen::{run_soak, SoakSpec};
    use std::time::Duration;
    for (flag, value, most) in [
        ("--producers", args.producers, 4096),
        ("--shards", args.shards, 4096),
        ("--objects", args.objects, 100_000_000),
    ] {
        if !(1..=most).contains(&value) {
            return Err(
                InputError::new(format!("{flag} must be from 1 to {most}, got {value}")).into(),
            );
        }
    }
    if args.retention_ms == 0 || args.purge_ms == 0 {
        return Err(InputError::new("--retention-ms and --purge-ms must be above 0").into());
    }
    let base = SoakSpec::default();
    let spec = SoakSpec {
        objects: args.objects,
        deliveries: args.deliveries.map_or(base.deliveries, |d| d as u64),
        producers: args.producers,
        payload_bytes: args.payload,
        config: snapshot_receiver::Config {
            shards: args.shards,
            retention: Duration::from_millis(args.retention_ms),
            memory: match args.memory_budget {
                Some(total) => snapshot_receiver::MemoryBudget::split(total)
                    .map_err(|e| InputError::new(format!("--memory-budget: {e}")))?,
                None => snapshot_receiver::MemoryBudget::default(),
            },
            ..snapshot_receiver::Config::default()
        },
        purge_interval: Some(Duration::from_millis(args.purge_ms)),
        store: args.store.clone(),
        ..base
    };
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    if let Some(w) = args.workers {
        runtime.worker_threads(w);
    }
    let runtime = runtime.build().context("cannot start the tokio runtime")?;
    let report = runtime.block_on(run_soak(&spec, None)).map_err(refused)?;
    let mut out = std::io::stdout().lock();
    match args.format {
        Format::Json => {
            serde_json::to_writer(&mut out, &report)?;
            writeln!(out)?;
        }
        Format::Text => report::write_soak_report(&mut out, &report)?,
    }
    out.flush()?;
    if !report.ok() {
        anyhow::bail!("soak check failed: {}", report.failures.join("; "));
    }
    Ok(())
}

/// Why the receiver did not start: a refusal (exit 2) of what the user
/// gave, a store error with its kind's exit code (1 for a store that cannot
/// be opened), no runtime (1).
fn refused(e: BuildError) -> anyhow::Error {
    let message = "cannot start the receiver";
    match e {
        BuildError::Store(_) | BuildError::NoRuntime => {
            crate::error::receiver_error(e).context(message)
        }
        other => anyhow::Error::new(other).context(InputError::new(message)),
    }
}

/// The error of a run whose correctness check failed (exit 1).
fn check_failed(report: &snapshot_receiver_loadgen::Report) -> anyhow::Error {
    anyhow::anyhow!(
        "correctness check failed ({}): {} of {} assertions; first: {}",
        report.target,
        report.check.failed,
        report.check.assertions,
        report.check.failures.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use snapshot_receiver_loadgen::{self as loadgen, LoadSpec, Report, RunOptions};

    #[test]
    fn a_failed_check_exits_1_and_a_refused_start_exits_2() {
        let spec = LoadSpec {
            objects: 20,
            versions: 3,
            ..LoadSpec::default()
        };
        let stream = loadgen::generate(&spec).unwrap();
        let run = loadgen::run_engine(&stream);
        let mut wrong = stream.expectation().clone();
        wrong.objects[0].paused = !wrong.objects[0].paused;
        let check = loadgen::check(&stream, &wrong, &run);
        let report = Report::new("engine", &stream, &RunOptions::default(), &run, check);
        assert!(!report.ok);
        let failed = check_failed(&report);
        assert_eq!(crate::error::exit_code(&failed), 1, "{failed:#}");

        let store_in_use = refused(BuildError::InvalidConfig(
            "the store already holds receipts",
        ));
        assert_eq!(crate::error::exit_code(&store_in_use), 2);
        assert_eq!(
            format!("{store_in_use:#}"),
            "cannot start the receiver: invalid configuration: the store already holds receipts"
        );
        assert_eq!(crate::error::exit_code(&refused(BuildError::NoRuntime)), 1);
    }
}
