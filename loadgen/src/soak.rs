//! The soak run: a long stream over a bounded set of objects, through a
//! receiver built from [`Config::default`] with a short retention and the
//! periodic purge running, sampling the process's resident set size (RSS)
//! to show whether memory stays flat once the receiver is warm.
//!
//! Unlike [`crate::generate`], nothing is generated up front (a few million
//! bodies would themselves take gigabytes): each producer builds its bodies
//! as it goes, so what the RSS samples show is the receiver's own memory.

use crate::probe::{cpu_since, current_rss_bytes, process_cpu_time};
use snapshot_receiver::{format_rfc3339, Config, Decision, Outcome, Receiver};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// What a soak run sends and how the receiver is configured.
#[derive(Clone, Debug)]
pub struct SoakSpec {
    /// Known objects (created at version 0 before the run); delivery `i`
    /// names object `i % objects` at version `i / objects + 1`.
    pub objects: usize,
    /// New events to send (redeliveries come on top, see `redeliver_every`).
    pub deliveries: u64,
    /// Concurrent producer tasks; event `i` goes to producer `i % producers`.
    pub producers: usize,
    /// After every `redeliver_every` events a producer sends its previous
    /// body again (a redelivery, decided `duplicate`); 0: none.
    pub redeliver_every: u64,
    /// Target body size in bytes (the state is padded up to it).
    pub payload_bytes: usize,
    /// The receiver's configuration: [`Config::default`] with a short
    /// `retention`, unless the caller wants otherwise.
    pub config: Config,
    /// How often the receiver purges identities past retention
    /// ([`snapshot_receiver::ReceiverBuilder::purge_interval`]); default
    /// every 500 ms, `None`: never.
    pub purge_interval: Option<Duration>,
    /// How often the RSS is sampled.
    pub sample_every: Duration,
    /// The fraction of the events after which the receiver counts as warm
    /// (its registry has filled to what the retention window holds).
    pub warmup: f64,
    /// A durable store for the receiver (a store location, empty: a new
    /// file or schema), with the default working set and identity cache;
    /// `None`: the in-memory receiver.
    pub store: Option<String>,
}

impl Default for SoakSpec {
    fn default() -> Self {
        Self {
            objects: 10_000,
            deliveries: 2_000_000,
            producers: 4,
            redeliver_every: 10,
            payload_bytes: 250,
            config: Config {
                retention: Duration::from_secs(2),
                ..Config::default()
            },
            purge_interval: Some(Duration::from_millis(500)),
            sample_every: Duration::from_millis(250),
            warmup: 0.2,
            store: None,
        }
    }
}

/// One RSS sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RssSample {
    /// Milliseconds since the first delivery.
    pub at_ms: u64,
    /// Deliveries acknowledged by then (redeliveries included).
    pub delivered: u64,
    /// Resident set size, in bytes.
    pub rss_bytes: u64,
}

/// What a soak run measured, and whether its check passed.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SoakReport {
    /// Known objects.
    pub objects: usize,
    /// Deliveries sent (new events and redeliveries).
    pub delivered: u64,
    /// Of which redeliveries.
    pub redelivered: u64,
    /// The receiver's retention window, in milliseconds.
    pub retention_ms: u64,
    /// The receiver's purge interval, in milliseconds (`None`: no purge).
    pub purge_interval_ms: Option<u64>,
    /// [`Config::audit`] of the run.
    pub audit: bool,
    /// The durable store's location, `None`: in memory.
    pub store: Option<String>,
    /// Wall time of the delivery phase, in seconds.
    pub elapsed_s: f64,
    /// CPU time of the process during it (user + system), in seconds.
    pub cpu_s: Option<f64>,
    /// RSS before the receiver was built, in bytes.
    pub rss_before_bytes: u64,
    /// RSS at the first sample after the warm-up fraction of the events.
    pub rss_warm_bytes: u64,
    /// RSS at the end of the delivery phase (before shutdown).
    pub rss_end_bytes: u64,
    /// Highest RSS sampled after the warm-up.
    pub rss_max_after_warm_bytes: u64,
    /// `(end - warm) / warm`, in percent.
    pub growth_after_warm_pct: f64,
    /// Every sample, in order.
    pub samples: Vec<RssSample>,
    /// Deliveries decided `applied`.
    pub applied: u64,
    /// Deliveries decided `stale` (producers race, so an older version of an
    /// object sometimes arrives after a newer one).
    pub stale: u64,
    /// Deliveries decided `duplicate`.
    pub duplicate: u64,
    /// Redeliveries sent a retention window or more after their first
    /// delivery and decided as a new delivery would be (`stale` or
    /// `equal`): their identity had expired (docs/CONTRACT.md §5), which
    /// a run stalled past a short window sees.
    pub expired_redeliveries: u64,
    /// Any other outcome (none expected).
    pub other: u64,
    /// What the check found wrong (empty: passed).
    pub failures: Vec<String>,
}

impl SoakReport {
    /// Whether the check passed: every new event decided `applied` or
    /// `stale`, every redelivery `duplicate`, and every object at the
    /// highest version sent for it.
    pub fn ok(&self) -> bool {
        self.failures.is_empty()
    }
}

/// The id of soak object `i`.
fn object_id(i: usize) -> String {
    format!("soak-{i}")
}

/// The body of event `i`, padded to about `payload` bytes.
fn body(i: u64, objects: usize, payload: usize, occurred_at: &str) -> Vec<u8> {
    let object = (i % objects as u64) as usize;
    let version = i / objects as u64 + 1;
    let mut text = format!(
        "{{\"event_id\":\"s-{i}\",\"object_id\":\"{}\",\"object_version\":{version},\
         \"occurred_at\":\"{occurred_at}\",\"type\":\"card.snapshot\",\
         \"state\":{{\"stage\":\"v{version}\",\"pad\":\"",
        object_id(object)
    );
    let pad = payload.saturating_sub(text.len() + 3);
    text.extend(std::iter::repeat_n('x', pad));
    text.push_str("\"}}");
    text.into_bytes()
}

/// Counts kept by the producers.
#[derive(Default)]
struct Tally {
    delivered: AtomicU64,
    redelivered: AtomicU64,
    applied: AtomicU64,
    stale: AtomicU64,
    duplicate: AtomicU64,
    expired: AtomicU64,
    other: AtomicU64,
    /// Redeliveries not decided `duplicate` (nor, once their identity may
    /// have expired, `stale` or `equal`), and new events decided something
    /// else than `applied` or `stale`.
    unexpected: AtomicU64,
}

/// How a soak counts a redelivery's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Redelivered {
    /// `duplicate`: the identity was remembered.
    Duplicate,
    /// `stale` or `equal`, sent at least a retention window after the
    /// first delivery: the identity may have expired, and the version check
    /// decided it as the contract says.
    Expired,
    /// Anything else.
    Unexpected,
}

/// The class of a redelivery decided `outcome`, sent `waited` after its
/// first delivery, under a retention window of `retention`.
fn redelivered(outcome: &Outcome, waited: Duration, retention: Duration) -> Redelivered {
    match outcome {
        Outcome::Decided(Decision::Duplicate { .. }) => Redelivered::Duplicate,
        Outcome::Decided(Decision::Stale | Decision::Equal) if waited >= retention => {
            Redelivered::Expired
        }
        _ => Redelivered::Unexpected,
    }
}

/// Runs a soak: builds the receiver from `spec.config` and
/// `spec.purge_interval` (the system clock)
/// with `spec.objects` objects at version 0, sends the events from
/// `spec.producers` tasks while a thread samples the RSS, and checks the
/// outcome. `progress` (if any) counts acknowledged deliveries.
///
/// # Errors
/// [`snapshot_receiver::BuildError`] when the receiver cannot be built.
pub async fn run_soak(
    spec: &SoakSpec,
    progress: Option<Arc<AtomicU64>>,
) -> Result<SoakReport, snapshot_receiver::BuildError> {
    let rss_before = current_rss_bytes().unwrap_or(0);
    let mut builder = Receiver::builder()
        .config(spec.config.clone())
        .purge_interval(spec.purge_interval);
    let initial = r#"{"stage":"initial"}"#;
    for i in 0..spec.objects {
        builder = builder.object(&object_id(i), 0, initial);
    }
    if let Some(location) = &spec.store {
        builder = builder.store(location);
    }
    let receiver = builder.build()?;
    let tally = Arc::new(Tally::default());
    let done = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let cpu_start = process_cpu_time();
    let sampler = {
        let (tally, done, every) = (tally.clone(), done.clone(), spec.sample_every);
        std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(every);
                samples.push(RssSample {
                    at_ms: start.elapsed().as_millis() as u64,
                    delivered: tally.delivered.load(Ordering::Relaxed),
                    rss_bytes: current_rss_bytes().unwrap_or(0),
                });
            }
            samples
        })
    };
    let producers = spec.producers.max(1) as u64;
    let retention = spec.config.retention;
    let mut tasks = tokio::task::JoinSet::new();
    for p in 0..producers {
        let (receiver, tally, progress) = (receiver.clone(), tally.clone(), progress.clone());
        let (objects, total, payload, every) = (
            spec.objects.max(1),
            spec.deliveries,
            spec.payload_bytes,
            spec.redeliver_every,
        );
        tasks.spawn(async move {
            let mut previous: Option<(Vec<u8>, Instant)> = None;
            let mut sent = 0u64;
            let mut i = p;
            while i < total {
                let at = format_rfc3339(SystemTime::now());
                let bytes = body(i, objects, payload, &at);
                let sent_at = Instant::now();
                let receipt = receiver.deliver(&bytes).await;
                let counter = match receipt.outcome {
                    Outcome::Decided(Decision::Applied) => &tally.applied,
                    Outcome::Decided(Decision::Stale) => &tally.stale,
                    _ => {
                        tally.unexpected.fetch_add(1, Ordering::Relaxed);
                        &tally.other
                    }
                };
                counter.fetch_add(1, Ordering::Relaxed);
                let mut n = 1;
                sent += 1;
                if every > 0 && sent.is_multiple_of(every) {
                    if let Some((again, first)) = previous.as_ref() {
                        let receipt = receiver.deliver(again).await;
                        match redelivered(&receipt.outcome, first.elapsed(), retention) {
                            Redelivered::Duplicate => {
                                tally.duplicate.fetch_add(1, Ordering::Relaxed);
                            }
                            Redelivered::Expired => {
                                tally.expired.fetch_add(1, Ordering::Relaxed);
                            }
                            Redelivered::Unexpected => {
                                tally.other.fetch_add(1, Ordering::Relaxed);
                                tally.unexpected.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        tally.redelivered.fetch_add(1, Ordering::Relaxed);
                        n += 1;
                    }
                }
                previous = Some((bytes, sent_at));
                tally.delivered.fetch_add(n, Ordering::Relaxed);
                if let Some(progress) = &progress {
                    progress.fetch_add(n, Ordering::Relaxed);
                }
                i += producers;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let elapsed = start.elapsed();
    let cpu = cpu_since(cpu_start);
    let rss_end = current_rss_bytes().unwrap_or(0);
    done.store(true, Ordering::Relaxed);
    let samples = sampler.join().unwrap_or_default();

    let mut failures = Vec::new();
    let unexpected = tally.unexpected.load(Ordering::Relaxed);
    if unexpected > 0 {
        failures.push(format!(
            "{unexpected} deliveries got another decision than applied or stale (new events) \
             or duplicate (redeliveries)"
        ));
    }
    let objects = receiver.objects().await;
    let mut wrong = 0usize;
    for o in &objects {
        let Some(i) = o
            .object_id
            .strip_prefix("soak-")
            .and_then(|i| i.parse::<u64>().ok())
        else {
            continue;
        };
        let n = spec.objects as u64;
        let highest = if i < spec.deliveries % n {
            spec.deliveries / n + 1
        } else {
            spec.deliveries / n
        };
        if o.version != highest {
            wrong += 1;
            if wrong <= 3 {
                failures.push(format!(
                    "{} ends at version {}, expected {highest}",
                    o.object_id, o.version
                ));
            }
        }
    }
    if objects.len() != spec.objects {
        failures.push(format!(
            "{} objects at the end, expected {}",
            objects.len(),
            spec.objects
        ));
    }
    receiver.shutdown().await;

    let warm_after = (spec.deliveries as f64 * spec.warmup) as u64;
    let after_warm: Vec<&RssSample> = samples
        .iter()
        .filter(|s| s.delivered >= warm_after)
        .collect();
    let rss_warm = after_warm.first().map_or(rss_end, |s| s.rss_bytes);
    let rss_max = after_warm
        .iter()
        .map(|s| s.rss_bytes)
        .chain([rss_end])
        .max()
        .unwrap_or(rss_end);
    Ok(SoakReport {
        objects: spec.objects,
        delivered: tally.delivered.load(Ordering::Relaxed),
        redelivered: tally.redelivered.load(Ordering::Relaxed),
        retention_ms: spec.config.retention.as_millis() as u64,
        purge_interval_ms: spec.purge_interval.map(|d| d.as_millis() as u64),
        audit: spec.config.audit,
        store: spec.store.clone(),
        elapsed_s: elapsed.as_secs_f64(),
        cpu_s: cpu.map(|d| d.as_secs_f64()),
        rss_before_bytes: rss_before,
        rss_warm_bytes: rss_warm,
        rss_end_bytes: rss_end,
        rss_max_after_warm_bytes: rss_max,
        growth_after_warm_pct: (rss_end as f64 - rss_warm as f64) / (rss_warm.max(1) as f64)
            * 100.0,
        samples,
        applied: tally.applied.load(Ordering::Relaxed),
        stale: tally.stale.load(Ordering::Relaxed),
        duplicate: tally.duplicate.load(Ordering::Relaxed),
        expired_redeliveries: tally.expired.load(Ordering::Relaxed),
        other: tally.other.load(Ordering::Relaxed),
        failures,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redelivery_is_expired_only_past_the_window_and_as_stale_or_equal() {
        let window = Duration::from_secs(2);
        let dup = Outcome::Decided(Decision::Duplicate {
            original: snapshot_receiver::Verdict::Applied,
        });
        let (stale, equal, applied) = (
            Outcome::Decided(Decision::Stale),
            Outcome::Decided(Decision::Equal),
            Outcome::Decided(Decision::Applied),
        );
        let short = Duration::from_millis(1_999);
        assert_eq!(redelivered(&dup, short, window), Redelivered::Duplicate);
        assert_eq!(redelivered(&dup, window, window), Redelivered::Duplicate);
        assert_eq!(redelivered(&stale, short, window), Redelivered::Unexpected);
        assert_eq!(redelivered(&equal, short, window), Redelivered::Unexpected);
        assert_eq!(redelivered(&stale, window, window), Redelivered::Expired);
        assert_eq!(
            redelivered(&equal, window * 3, window),
            Redelivered::Expired
        );
        // Applied again after expiry would be a new effect: never expected.
        assert_eq!(
            redelivered(&applied, window * 3, window),
            Redelivered::Unexpected
        );
    }

    #[test]
    fn bodies_name_object_and_version_and_reach_the_payload() {
        let b = body(10_003, 10_000, 250, "2026-12-01T00:00:00Z");
        let text = String::from_utf8(b).unwrap();
        assert!(
            text.starts_with(r#"{"event_id":"s-10003","object_id":"soak-3","object_version":2,"#)
        );
        assert_eq!(text.len(), 250);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["state"]["stage"], "v2");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_small_soak_passes_its_check() {
        let spec = SoakSpec {
            objects: 50,
            deliveries: 2_000,
            producers: 3,
            sample_every: Duration::from_millis(5),
            ..SoakSpec::default()
        };
        let report = run_soak(&spec, None).await.unwrap();
        assert_eq!(report.failures, Vec::<String>::new());
        // Each producer redelivers after every 10th of its own events.
        assert_eq!(report.redelivered, 667 / 10 + 667 / 10 + 666 / 10);
        assert_eq!(report.delivered, 2_000 + report.redelivered);
        assert_eq!(report.duplicate, report.redelivered);
        assert_eq!(report.applied + report.stale, 2_000);
        assert_eq!(report.other, 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_small_soak_on_a_sqlite_store_passes_its_check() {
        let path = std::env::temp_dir().join(format!("soak-store-{}.db", std::process::id()));
        let location = format!("sqlite:{}", path.display());
        let spec = SoakSpec {
            objects: 50,
            deliveries: 2_000,
            producers: 3,
            sample_every: Duration::from_millis(5),
            store: Some(location.clone()),
            ..SoakSpec::default()
        };
        let report = run_soak(&spec, None).await.unwrap();
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        assert_eq!(report.failures, Vec::<String>::new());
        assert_eq!(report.store, Some(location));
        assert_eq!(report.redelivered, 667 / 10 + 667 / 10 + 666 / 10);
        assert_eq!(report.duplicate, report.redelivered);
        assert_eq!(report.applied + report.stale, 2_000);
        assert_eq!(report.other, 0);
    }
}
