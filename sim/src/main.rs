//! `snapshot-receiver-sim`: runs a range of seeds of the cluster simulation,
//! then the must-fail controls, and prints the seeds run, the faults
//! injected by kind and any failing seed (with its trace).
//!
//! ```text
//! snapshot-receiver-sim [--seeds N] [--from S] [--control-budget N]
//! snapshot-receiver-sim --seed S [--control NAME] [--without KIND,...]  # replay one seed, traced
//! snapshot-receiver-sim --trace-digest [--seeds N] [--from S]  # one digest of the seeds' traces
//! snapshot-receiver-sim --census [--seeds N] [--from S]        # how many seeds catch each control
//! ```

use snapshot_receiver_sim::{run_seed, run_seed_without, shrink, Control, Fault};
use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;
use std::time::Instant;

struct Args {
    seeds: u64,
    from: u64,
    control_budget: Option<u64>,
    seed: Option<u64>,
    control: Control,
    controls: bool,
    without: BTreeSet<Fault>,
    digest: bool,
    census: bool,
}

fn usage(problem: &str) -> ExitCode {
    eprintln!("snapshot-receiver-sim: {problem}");
    let controls: Vec<&str> = [Control::None]
        .into_iter()
        .chain(Control::BROKEN)
        .map(Control::name)
        .collect();
    eprintln!(
        "usage: snapshot-receiver-sim [--seeds N] [--from S] [--control-budget N] [--no-controls]\n\
         \x20      snapshot-receiver-sim --trace-digest [--seeds N] [--from S]\n\
         \x20      snapshot-receiver-sim --census [--seeds N] [--from S]\n\
         \x20      snapshot-receiver-sim --seed S [--control {}] [--without KIND,...]",
        controls.join("|")
    );
    ExitCode::from(2)
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        seeds: 10_000,
        from: 1,
        control_budget: None,
        seed: None,
        control: Control::None,
        controls: true,
        without: BTreeSet::new(),
        digest: false,
        census: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut number = |name: &str| -> Result<u64, String> {
            let v = it.next().ok_or_else(|| format!("{name} needs a number"))?;
            v.parse()
                .map_err(|_| format!("{name}: `{v}` is not a whole number"))
        };
        match flag.as_str() {
            "--seeds" => args.seeds = number("--seeds")?,
            "--from" => args.from = number("--from")?,
            "--control-budget" => args.control_budget = Some(number("--control-budget")?),
            "--seed" => args.seed = Some(number("--seed")?),
            "--no-controls" => args.controls = false,
            "--trace-digest" => args.digest = true,
            "--census" => args.census = true,
            "--without" => {
                let v = it
                    .next()
                    .ok_or("--without needs fault kinds, comma-separated")?;
                for name in v.split(',').filter(|n| !n.is_empty()) {
                    let f = Fault::parse(name)
                        .ok_or_else(|| format!("--without: no fault kind `{name}`"))?;
                    args.without.insert(f);
                }
            }
            "--control" => {
                let v = it.next().ok_or("--control needs a name")?;
                args.control =
                    Control::parse(&v).ok_or_else(|| format!("--control: no control `{v}`"))?;
            }
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => return usage(&e),
    };
    if let Some(seed) = args.seed {
        return replay(seed, args.control, &args.without);
    }
    if args.digest {
        return digest(args.from, args.seeds);
    }
    if args.census {
        return census(args.from, args.seeds);
    }
    let started = Instant::now();
    let mut faults: BTreeMap<Fault, u64> = BTreeMap::new();
    let mut failing = Vec::new();
    let (mut steps, mut deliveries) = (0u64, 0u64);
    // Seeds whose deliveries were not all first decided in publish order:
    // with a delivery lost, delayed or overtaken on its way, and without.
    let mut out_of_order: (u64, Vec<u64>) = (0, Vec::new());
    for seed in args.from..args.from + args.seeds {
        let r = run_seed(seed, Control::None, false);
        for (f, n) in &r.faults {
            *faults.entry(*f).or_default() += n;
        }
        steps += r.steps;
        if !r.publish_order.is_empty() {
            let network = [
                Fault::DeliveryDrop,
                Fault::DeliveryDelay,
                Fault::DeliveryReorder,
            ];
            if network.iter().any(|f| r.faults.contains_key(f)) {
                out_of_order.0 += 1;
            } else {
                out_of_order.1.push(seed);
            }
        }
        deliveries += r.deliveries as u64;
        if !r.failures.is_empty() {
            eprintln!("seed {seed} FAILED:");
            for f in &r.failures {
                eprintln!("  {f}");
            }
            failing.push(seed);
        }
    }
    println!(
        "seeds run: {} (from {} to {}), {:.1} s, {} deliveries, {} events",
        args.seeds,
        args.from,
        args.from + args.seeds - 1,
        started.elapsed().as_secs_f64(),
        deliveries,
        steps
    );
    println!(
        "decided out of publish order (allowed, not kept by the consumer when a delivery is lost or overtaken \
         on its way): {} seeds with such a delivery fault, {} without{}",
        out_of_order.0,
        out_of_order.1.len(),
        if out_of_order.1.is_empty() {
            String::new()
        } else {
            format!(" (seeds {:?})", &out_of_order.1[..out_of_order.1.len().min(10)])
        }
    );
    println!("faults injected by kind:");
    for f in Fault::ALL {
        println!(
            "  {:<30} {}",
            f.name(),
            faults.get(&f).copied().unwrap_or(0)
        );
    }
    let mut ok = failing.is_empty();
    if failing.is_empty() {
        println!("failing seeds: none");
    } else {
        println!(
            "failing seeds: {} (replay one: snapshot-receiver-sim --seed {})",
            failing
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(" "),
            failing[0]
        );
        print_shortest(failing[0], Control::None);
    }
    if args.controls {
        let budget = args.control_budget.unwrap_or(args.seeds);
        for control in Control::BROKEN {
            let t = Instant::now();
            let caught = (args.from..args.from + budget).find_map(|seed| {
                let r = run_seed(seed, control, false);
                (!r.failures.is_empty()).then_some((seed, r.failures))
            });
            match caught {
                Some((seed, failures)) => {
                    println!(
                        "control {}: caught at seed {seed} ({} seeds, {:.1} s): {}",
                        control.name(),
                        seed - args.from + 1,
                        t.elapsed().as_secs_f64(),
                        failures[0]
                    );
                    if let Some(s) = shrink(seed, control) {
                        println!(
                            "  shortest: with {} only: {}",
                            kept(&s.report.faults),
                            replay_command(seed, control, &s.without)
                        );
                    }
                }
                None => {
                    ok = false;
                    println!(
                        "control {}: PASSED {budget} seeds: the invariants do not catch it",
                        control.name()
                    );
                }
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Runs the seeds traced and prints one digest of every trace and failure:
/// two processes (each with its own hash seeds) must print the same.
fn digest(from: u64, seeds: u64) -> ExitCode {
    use std::hash::{Hash, Hasher};
    // SipHash with fixed keys: the same digest in every process.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut lines = 0usize;
    for seed in from..from + seeds {
        let r = run_seed(seed, Control::None, true);
        let trace = r.trace.unwrap_or_default();
        lines += trace.len();
        trace.hash(&mut h);
        r.failures.hash(&mut h);
    }
    println!(
        "trace digest of seeds {from} to {}: {:016x} ({lines} lines)",
        from + seeds - 1,
        h.finish()
    );
    ExitCode::SUCCESS
}

/// How many seeds of the range catch each control (not only the first).
fn census(from: u64, seeds: u64) -> ExitCode {
    for control in Control::BROKEN {
        let caught: Vec<u64> = (from..from + seeds)
            .filter(|&seed| !run_seed(seed, control, false).failures.is_empty())
            .collect();
        println!(
            "control {}: caught by {} of {seeds} seeds (first: {:?})",
            control.name(),
            caught.len(),
            caught.first()
        );
    }
    ExitCode::SUCCESS
}

/// The command that replays `seed` under `control` without `without`.
fn replay_command(seed: u64, control: Control, without: &BTreeSet<Fault>) -> String {
    let mut command = format!("snapshot-receiver-sim --seed {seed}");
    if control != Control::None {
        command += &format!(" --control {}", control.name());
    }
    if !without.is_empty() {
        let names: Vec<&str> = without.iter().map(|f| f.name()).collect();
        command += &format!(" --without {}", names.join(","));
    }
    command
}

/// The fault kinds a run injected, with their counts.
fn kept(faults: &BTreeMap<Fault, u64>) -> String {
    if faults.is_empty() {
        return "no fault".to_owned();
    }
    faults
        .iter()
        .map(|(f, n)| format!("{} x{n}", f.name()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Shrinks a failing seed and prints its shortest trace and failures.
fn print_shortest(seed: u64, control: Control) {
    let Some(s) = shrink(seed, control) else {
        println!("seed {seed} does not fail when run again: the run is not deterministic");
        return;
    };
    println!(
        "shortest trace of seed {seed} (fault kinds left out while it still fails: {} left), replay: {}",
        kept(&s.report.faults),
        replay_command(seed, control, &s.without)
    );
    print_trace(&s.report.trace.unwrap_or_default());
    for f in &s.report.failures {
        println!("  FAILED: {f}");
    }
}

fn print_trace(trace: &[String]) {
    println!("trace ({} lines):", trace.len());
    for line in trace {
        println!("  {line}");
    }
}

/// Runs one seed with its trace, twice: the second run must give the same
/// trace (the run is deterministic).
fn replay(seed: u64, control: Control, without: &BTreeSet<Fault>) -> ExitCode {
    let r = run_seed_without(seed, control, true, without);
    let again = run_seed_without(seed, control, true, without);
    let trace = r.trace.unwrap_or_default();
    print_trace(&trace);
    println!(
        "seed {seed}, control {}: {} deliveries, {} events, {:.3} s simulated",
        control.name(),
        r.deliveries,
        r.steps,
        r.sim_time.as_secs_f64()
    );
    let cfg = snapshot_receiver_sim::config_for(seed);
    match cfg.bounds {
        Some(b) => println!(
            "  {} processes of {} shards; memory bounded per process: objects {}, first records {}, {} filter of stored identities",
            cfg.processes,
            cfg.shards,
            b.objects,
            b.identities,
            if cfg.identity_filter { "a" } else { "no" }
        ),
        None => println!(
            "  {} processes of {} shards, every object and identity in memory",
            cfg.processes, cfg.shards
        ),
    }
    for (f, n) in &r.faults {
        println!("  {:<30} {n}", f.name());
    }
    let same = again.trace.as_deref() == Some(&trace[..]);
    println!(
        "replayed: {}",
        if same {
            "the same trace"
        } else {
            "A DIFFERENT TRACE"
        }
    );
    if !r.publish_order.is_empty() {
        println!("decided out of publish order (allowed):");
        for f in &r.publish_order {
            println!("  {f}");
        }
    }
    if r.failures.is_empty() {
        println!("invariants: held");
    } else {
        println!("invariants: FAILED");
        for f in &r.failures {
            println!("  {f}");
        }
    }
    if r.failures.is_empty() && same {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
