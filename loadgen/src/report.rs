//! What `loadtest` reports: one run ([`Report`], with its
//! [`LatencySummary`]s) and a `--target compare` [`Comparison`].

use crate::check::CheckReport;
use crate::code::DecisionCounts;
use crate::drive::{LoadMode, RunOptions, RunOutcome};
use crate::durable::StoreReport;
use crate::generate::Stream;
use crate::probe::peak_rss_bytes;
use hdrhistogram::Histogram;
use std::time::Duration;

/// Latency percentiles of a run, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct LatencySummary {
    /// Samples recorded.
    pub count: u64,
    /// Median.
    pub p50: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest.
    pub max: u64,
    /// Mean.
    pub mean: f64,
}

impl LatencySummary {
    /// Summarises a histogram of nanoseconds (all zero when it is empty).
    pub fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        Self {
            count: h.len(),
            p50: h.value_at_quantile(0.50),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
            mean: h.mean(),
        }
    }
}

/// Everything `loadtest` reports about one run; serialised as-is by
/// `--format json`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Report {
    /// What was driven: `receiver`, `mutex` or `engine`.
    pub target: &'static str,
    /// `closed` or `open`.
    pub mode: &'static str,
    /// Open-loop arrival rate (deliveries per second), `None` in closed loop.
    pub rate: Option<f64>,
    /// The generator's seed.
    pub seed: u64,
    /// Known objects.
    pub objects: usize,
    /// Deliveries sent.
    pub deliveries: usize,
    /// Distinct event identities among them.
    pub distinct_events: usize,
    /// Average body size in bytes.
    pub avg_body_bytes: f64,
    /// Producer tasks (1 for the engine).
    pub producers: usize,
    /// Shard tasks (receiver only).
    pub shards: usize,
    /// Most deliveries per producer call (1 for the engine; see
    /// [`RunOptions::batch`]).
    pub batch: usize,
    /// Wall time of the delivery phase, seconds.
    pub elapsed_s: f64,
    /// Deliveries per second.
    pub deliveries_per_s: f64,
    /// Process CPU time per delivery during the run, microseconds (all
    /// threads; steadier than wall time on a shared machine). `None`
    /// without `/proc`, or when the run used under 0.2 s of CPU (the clock
    /// ticks in 10 ms).
    pub cpu_us_per_delivery: Option<f64>,
    /// Acknowledgement latency in nanoseconds (open loop: from the intended send time).
    pub latency_ns: LatencySummary,
    /// Acknowledgement latency from the actual send, in nanoseconds (equal to
    /// `latency_ns` in closed loop).
    pub service_latency_ns: LatencySummary,
    /// Open loop: how long after its intended send time each delivery was
    /// handed to the receiver, in nanoseconds.
    pub send_lateness_ns: LatencySummary,
    /// Peak resident set size of the process (stream included), bytes.
    pub peak_rss_bytes: Option<u64>,
    /// Resident set size once the stream was generated, before the run
    /// (the generator's own share of the peak), bytes.
    pub stream_rss_bytes: Option<u64>,
    /// Decision counts.
    pub decisions: DecisionCounts,
    /// The correctness check.
    pub check: CheckReport,
    /// Whether the check passed.
    pub ok: bool,
    /// With a durable store (`--store`): commits, deliveries per commit,
    /// commit times, the fsync probe and where the CPU went.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<StoreReport>,
    /// When the run reconciled ([`RunOptions::authority`]): what the
    /// authority and the reconciler did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub authority: Option<AuthorityReport>,
}

/// What reconciliation did in one run (see [`crate::AuthorityRun`]).
#[derive(Clone, Debug, serde::Serialize)]
pub struct AuthorityReport {
    /// `inline` (the baselines: each conflict reconciled after its step,
    /// no latency) or `reconciler` (the receiver's, in the background).
    pub how: &'static str,
    /// The authority's latency, milliseconds (`reconciler` only).
    pub latency_ms: Option<f64>,
    /// Authority replacements the receiver counted.
    pub replacements: u64,
    /// What the authority answered (`reconciler` only).
    pub answered: Option<crate::AuthorityCounts>,
    /// The reconciler's fetches by outcome: applied, unchanged, absent,
    /// unavailable, timeout, other (`reconciler` only).
    pub fetches: Option<serde_json::Value>,
    /// Inline: reconciliations made.
    pub reconciled: u64,
    /// Seconds from the last answer until every known object converged;
    /// `None`: not within the drain.
    pub converged_after_s: Option<f64>,
    /// Open loop: from each pausing conflict's decision to its object's
    /// un-pause, nanoseconds (checked every millisecond).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unpause_ns: Option<LatencySummary>,
    /// Open loop: decisions the un-pause tracker missed.
    pub unpause_missed: u64,
}

impl AuthorityReport {
    fn new(opts: &RunOptions, run: &RunOutcome) -> Option<Self> {
        let a = run.authority.as_ref()?;
        Some(Self {
            how: if a.inline { "inline" } else { "reconciler" },
            latency_ms: (!a.inline)
                .then(|| {
                    opts.authority
                        .as_ref()
                        .map(|o| o.latency.as_secs_f64() * 1e3)
                })
                .flatten(),
            replacements: run.counters.authority_replacements,
            answered: (!a.inline).then_some(a.answered),
            fetches: a.fetches.as_ref().map(|f| {
                serde_json::json!({
                    "applied": f.applied,
                    "unchanged": f.unchanged,
                    "absent": f.absent,
                    "unavailable": f.unavailable,
                    "timeout": f.timeout,
                    "other": f.older + f.wrong_object + f.bad_answer + f.not_applied,
                })
            }),
            reconciled: a.reconciled,
            converged_after_s: a.converged_after.map(|d| d.as_secs_f64()),
            unpause_ns: a.unpause.as_ref().map(LatencySummary::of),
            unpause_missed: a.unpause_missed,
        })
    }
}

impl Report {
    /// Assembles the report of one run (reads the peak RSS now).
    pub fn new(
        target: &'static str,
        stream: &Stream,
        opts: &RunOptions,
        run: &RunOutcome,
        check: CheckReport,
    ) -> Self {
        let engine = target == "engine";
        // The engine runs on the calling thread as fast as it goes.
        let mode = if engine { LoadMode::Closed } else { opts.mode };
        Self {
            target,
            mode: match mode {
                LoadMode::Closed => "closed",
                LoadMode::Open { .. } => "open",
            },
            rate: match mode {
                LoadMode::Closed => None,
                LoadMode::Open { rate } => Some(rate),
            },
            seed: stream.spec.seed,
            objects: stream.spec.objects,
            deliveries: stream.len(),
            distinct_events: stream.distinct_events(),
            avg_body_bytes: stream.total_bytes() as f64 / stream.len().max(1) as f64,
            producers: if engine { 1 } else { opts.producers },
            shards: if target == "receiver" { opts.shards } else { 1 },
            batch: if engine { 1 } else { opts.batch.max(1) },
            elapsed_s: run.elapsed.as_secs_f64(),
            deliveries_per_s: run.throughput(),
            // The process CPU clock ticks in 10 ms: below 0.2 s the figure
            // would be off by more than 5 %, so it is left out.
            cpu_us_per_delivery: run
                .cpu
                .filter(|c| *c >= Duration::from_millis(200))
                .map(|c| c.as_secs_f64() * 1e6 / stream.len().max(1) as f64),
            latency_ns: LatencySummary::of(&run.latency),
            service_latency_ns: LatencySummary::of(&run.service_latency),
            send_lateness_ns: LatencySummary::of(&run.send_lateness),
            peak_rss_bytes: peak_rss_bytes(),
            stream_rss_bytes: stream.resident_bytes,
            decisions: run.counts(),
            ok: check.ok(),
            check,
            store: run.store.as_ref().map(|s| {
                let in_flight = (opts.producers.max(1) * opts.batch.max(1)).min(stream.len());
                StoreReport::new(s, stream.len(), run.elapsed, run.cpu, in_flight)
            }),
            authority: AuthorityReport::new(opts, run),
        }
    }
}

/// One round of `loadtest --target compare`: the targets over the same
/// stream, one after the other, and the receiver's ratios to the baselines
/// measured in that round.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ComparisonRound {
    /// The single-thread engine's run.
    pub engine: Report,
    /// The global-mutex baseline's run, at the comparison's batch size.
    pub mutex: Report,
    /// The receiver's run, at the comparison's batch size.
    pub receiver: Report,
    /// Batch above 1 only: the naive baseline, one lock per delivery.
    pub mutex_unbatched: Option<Report>,
    /// Batch above 1 only: the receiver, one `deliver` call per delivery.
    pub receiver_unbatched: Option<Report>,
    /// Receiver deliveries/s ÷ engine deliveries/s in this round.
    pub receiver_over_engine: f64,
    /// Receiver deliveries/s ÷ mutex deliveries/s (same batch size).
    pub receiver_over_mutex: f64,
    /// Batch above 1 only: receiver deliveries/s ÷ the naive baseline's
    /// (one lock per delivery).
    pub receiver_over_unbatched_mutex: Option<f64>,
}

/// Medians over the rounds of a comparison: deliveries/s of each target and
/// the median of the per-round ratios (not the ratio of the medians, so each
/// ratio compares runs taken minutes apart, never across the whole session).
#[derive(Clone, Debug, serde::Serialize)]
pub struct ComparisonMedian {
    /// Engine deliveries per second.
    pub engine: f64,
    /// Mutex baseline deliveries per second.
    pub mutex: f64,
    /// Receiver deliveries per second.
    pub receiver: f64,
    /// Batch above 1 only: the naive baseline's deliveries per second.
    pub mutex_unbatched: Option<f64>,
    /// Batch above 1 only: the unbatched receiver's deliveries per second.
    pub receiver_unbatched: Option<f64>,
    /// Median of the per-round receiver ÷ engine ratios.
    pub receiver_over_engine: f64,
    /// Median of the per-round receiver ÷ mutex ratios.
    pub receiver_over_mutex: f64,
    /// Batch above 1 only: median of the per-round receiver ÷ naive
    /// baseline ratios.
    pub receiver_over_unbatched_mutex: Option<f64>,
}

/// The result of `loadtest --target compare`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Comparison {
    /// Always `compare`.
    pub target: &'static str,
    /// Producer tasks of the mutex and receiver runs.
    pub producers: usize,
    /// Deliveries per producer call of the mutex and receiver runs.
    pub batch: usize,
    /// Receiver shard tasks.
    pub shards: usize,
    /// Every round, in order.
    pub rounds: Vec<ComparisonRound>,
    /// Medians over the rounds.
    pub median: ComparisonMedian,
    /// Whether every run passed its correctness check.
    pub ok: bool,
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

impl Comparison {
    /// Groups reports into rounds of `per_round` consecutive runs (3, or 5
    /// with the unbatched pair; in any order of targets) and computes the
    /// ratios; a round missing a target is dropped.
    pub fn of(reports: Vec<Report>, per_round: usize) -> Self {
        let mut rounds = Vec::new();
        let mut reports = reports.into_iter();
        loop {
            let runs: Vec<Report> = reports.by_ref().take(per_round.max(1)).collect();
            if runs.len() < per_round.max(1) {
                break;
            }
            let batched = runs.iter().map(|r| r.batch).max().unwrap_or(1);
            let pick = |name: &str, batch: usize| {
                runs.iter()
                    .find(|r| r.target == name && r.batch == batch)
                    .cloned()
            };
            let (Some(engine), Some(mutex), Some(receiver)) = (
                pick("engine", 1),
                pick("mutex", batched),
                pick("receiver", batched),
            ) else {
                continue;
            };
            let (mutex_unbatched, receiver_unbatched) = if batched > 1 {
                (pick("mutex", 1), pick("receiver", 1))
            } else {
                (None, None)
            };
            let rate = |r: &Report| r.deliveries_per_s.max(1e-9);
            rounds.push(ComparisonRound {
                receiver_over_engine: receiver.deliveries_per_s / rate(&engine),
                receiver_over_mutex: receiver.deliveries_per_s / rate(&mutex),
                receiver_over_unbatched_mutex: mutex_unbatched
                    .as_ref()
                    .map(|m| receiver.deliveries_per_s / rate(m)),
                engine,
                mutex,
                receiver,
                mutex_unbatched,
                receiver_unbatched,
            });
        }
        let of = |f: &dyn Fn(&ComparisonRound) -> f64| median(rounds.iter().map(f).collect());
        let of_some = |f: &dyn Fn(&ComparisonRound) -> Option<f64>| {
            let values: Option<Vec<f64>> = rounds.iter().map(f).collect();
            values.filter(|v| !v.is_empty()).map(median)
        };
        let median = ComparisonMedian {
            engine: of(&|r| r.engine.deliveries_per_s),
            mutex: of(&|r| r.mutex.deliveries_per_s),
            receiver: of(&|r| r.receiver.deliveries_per_s),
            mutex_unbatched: of_some(&|r| r.mutex_unbatched.as_ref().map(|m| m.deliveries_per_s)),
            receiver_unbatched: of_some(&|r| {
                r.receiver_unbatched.as_ref().map(|m| m.deliveries_per_s)
            }),
            receiver_over_engine: of(&|r| r.receiver_over_engine),
            receiver_over_mutex: of(&|r| r.receiver_over_mutex),
            receiver_over_unbatched_mutex: of_some(&|r| r.receiver_over_unbatched_mutex),
        };
        let first = rounds.first().map(|r| &r.receiver);
        let ok = rounds.iter().all(|r| {
            [&r.engine, &r.mutex, &r.receiver]
                .into_iter()
                .chain(&r.mutex_unbatched)
                .chain(&r.receiver_unbatched)
                .all(|x| x.ok)
        });
        Self {
            target: "compare",
            producers: first.map_or(0, |r| r.producers),
            batch: first.map_or(0, |r| r.batch),
            shards: first.map_or(0, |r| r.shards),
            ok,
            median,
            rounds,
        }
    }

    /// Every run of every round.
    pub fn runs(&self) -> impl Iterator<Item = &Report> {
        self.rounds.iter().flat_map(|r| {
            [&r.engine, &r.mutex, &r.receiver]
                .into_iter()
                .chain(&r.mutex_unbatched)
                .chain(&r.receiver_unbatched)
        })
    }
}
