//! The reducer's cost is linear in state plus events: time per element stays
//! flat from 1 k to 100 k (criterion reports throughput per element).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use snapshot_receiver_core::reducer::{apply_events, Event, Record};
use std::collections::HashMap;

fn reducer(c: &mut Criterion) {
    let mut group = c.benchmark_group("apply_events");
    group.sample_size(20);
    for n in [1_000u64, 10_000, 100_000] {
        let state: HashMap<u64, Record<u64>> = (0..n)
            .map(|i| {
                (
                    i,
                    Record {
                        version: 1,
                        data: Some(i),
                    },
                )
            })
            .collect();
        // Half the events update existing records, half create new ones.
        let events: Vec<Event<u64, u64>> = (0..n)
            .map(|i| Event {
                id: i * 2,
                version: 2,
                data: Some(i),
            })
            .collect();
        group.throughput(Throughput::Elements(2 * n));
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| apply_events(&state, &events))
        });
    }
    group.finish();
}

criterion_group!(benches, reducer);
criterion_main!(benches);
