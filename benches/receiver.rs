//! Throughput benches: `cargo bench --bench receiver` (about 10 minutes on
//! 2 cores). Every group reports deliveries per second
//! (`Throughput::Elements`); see docs/BENCHMARKS.md for the results.
//!
//! Groups:
//! - `engine`: the pure engine on one thread over raw bytes (parse +
//!   fingerprint + decide): the per-core limit;
//! - `receiver`: the full receiver (router, 16 shard tasks, shared registry)
//!   with 1, 2, 4 and 16 producer tasks on a 2-worker tokio runtime, each
//!   delivery its own `Receiver::deliver` call;
//! - `mutex`: the naive baseline, one global `std::sync::Mutex` around one
//!   shard (the same engine), producers parsing outside the lock, one lock
//!   per delivery;
//! - `receiver_batch64` and `mutex_batch64`: the same with 4 and 16
//!   producers handing over 64 deliveries per call
//!   (`Receiver::deliver_batch`; the baseline parses the 64, then locks once);
//! - `parse`: parse + canonical fingerprint alone, by body size;
//! - `objects`: the receiver (4 producers) over 1 k, 100 k and 1 M objects;
//! - `identities`: the engine with 10 k vs 10 M identities already remembered.
//!
//! Each receiver/engine sample is one whole pass over a fresh receiver
//! (`iter_custom`: setup and teardown are not timed).

use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use snapshot_receiver::core::Context;
use snapshot_receiver::Verdict;
use snapshot_receiver_loadgen::{self as loadgen, LoadMode, LoadSpec, RunOptions, Stream};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

// The allocator the `snapshot-receiver` binary uses, so that the benches
// measure what `loadtest` measures (see docs/BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Deliveries per pass (the shape: ~250-byte bodies, 10 k objects,
/// 30 % duplicates).
const DELIVERIES: usize = 200_000;

fn stream(objects: usize, payload: usize, deliveries: usize) -> Arc<Stream> {
    let spec = LoadSpec {
        objects,
        deliveries: Some(deliveries),
        payload_bytes: payload,
        ..LoadSpec::default()
    };
    Arc::new(loadgen::generate(&spec).expect("valid spec"))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn opts(producers: usize) -> RunOptions {
    RunOptions {
        producers,
        mode: LoadMode::Closed,
        shards: 16,
        record_latency: false,
        progress: None,
        store: None,
        memory_budget: None,
        batch: 1,
        answers: None,
        authority: None,
    }
}

fn configure<'a>(
    c: &'a mut Criterion,
    name: &str,
) -> criterion::BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut g = c.benchmark_group(name);
    g.sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    g
}

fn engine_receiver_mutex(c: &mut Criterion) {
    let s = stream(10_000, 250, DELIVERIES);
    let rt = runtime();

    let mut g = configure(c, "engine");
    g.throughput(Throughput::Elements(s.len() as u64));
    g.bench_function("single_thread", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| loadgen::run_engine(&s).elapsed).sum())
    });
    g.finish();

    for (name, baseline, batch, producer_counts) in [
        ("receiver", false, 1, &[1, 2, 4, 16][..]),
        ("mutex", true, 1, &[1, 2, 4, 16][..]),
        ("receiver_batch64", false, 64, &[4, 16][..]),
        ("mutex_batch64", true, 64, &[4, 16][..]),
    ] {
        let opts = |producers| RunOptions {
            batch,
            ..opts(producers)
        };
        let mut g = configure(c, name);
        g.throughput(Throughput::Elements(s.len() as u64));
        for &producers in producer_counts {
            g.bench_with_input(
                BenchmarkId::new("producers", producers),
                &producers,
                |b, &p| {
                    b.iter_custom(|iters| {
                        (0..iters)
                            .map(|_| {
                                if baseline {
                                    rt.block_on(loadgen::run_global_mutex(&s, &opts(p))).elapsed
                                } else {
                                    rt.block_on(loadgen::run_receiver(&s, &opts(p)))
                                        .expect("receiver starts")
                                        .elapsed
                                }
                            })
                            .sum()
                    })
                },
            );
        }
        g.finish();
    }
}

fn parse(c: &mut Criterion) {
    let mut g = c.benchmark_group("parse");
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    g.throughput(Throughput::Elements(1));
    for payload in [250, 1_000, 4_000, 16_000] {
        let s = stream(1_000, payload, 2_000);
        let (ctx, _) = s.engine();
        g.bench_with_input(BenchmarkId::new("bytes", payload), &payload, |b, _| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % s.len();
                ctx.parser().parse(s.body(i)).is_ok()
            })
        });
    }
    g.finish();
}

fn objects(c: &mut Criterion) {
    let rt = runtime();
    let mut g = configure(c, "objects");
    g.throughput(Throughput::Elements(DELIVERIES as u64));
    for objects in [1_000, 100_000, 1_000_000] {
        // Generated lazily: the closure only runs when the filter selects it.
        let mut s = None;
        g.bench_with_input(
            BenchmarkId::new("receiver_4_producers", objects),
            &objects,
            |b, &n| {
                let s = s.get_or_insert_with(|| stream(n, 250, DELIVERIES));
                b.iter_custom(|iters| {
                    (0..iters)
                        .map(|_| {
                            rt.block_on(loadgen::run_receiver(s, &opts(4)))
                                .expect("receiver starts")
                                .elapsed
                        })
                        .sum()
                })
            },
        );
    }
    g.finish();
}

/// A context whose registry already remembers `n` identities, stamped far in
/// the future so that the purge between passes removes only a pass's own
/// records.
fn remembering(s: &Stream, n: usize) -> Context {
    let (ctx, _) = s.engine();
    let future = SystemTime::now() + Duration::from_secs(1_000 * 86_400);
    let object: Arc<str> = Arc::from("card-0");
    let mut id = String::new();
    for i in 0..n {
        use std::fmt::Write;
        id.clear();
        let _ = write!(id, "old-{i}");
        ctx.registry()
            .claim(&id, i as u128, &object, future, || Some(Verdict::Stale));
    }
    ctx
}

fn identities(c: &mut Criterion) {
    let s = stream(10_000, 250, DELIVERIES);
    let mut g = configure(c, "identities");
    g.throughput(Throughput::Elements(s.len() as u64));
    for remembered in [10_000usize, 10_000_000] {
        // Built once, lazily: criterion calls the closure once per sample.
        let mut cache = None;
        g.bench_with_input(
            BenchmarkId::new("engine_remembered", remembered),
            &remembered,
            |b, &n| {
                let ctx: &Context = cache.get_or_insert_with(|| remembering(&s, n));
                let after_pass = Stream::clock().now() + ctx.registry().retention();
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let shard = s.shard(ctx);
                        total += loadgen::run_engine_on(&s, ctx, shard).elapsed;
                        ctx.registry().purge_expired(after_pass);
                    }
                    total
                });
                assert_eq!(ctx.registry().len(), n);
            },
        );
    }
    g.finish();
}

criterion_group!(benches, engine_receiver_mutex, parse, objects, identities);
criterion_main!(benches);
