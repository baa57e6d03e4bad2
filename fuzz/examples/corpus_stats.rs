//! What the engine corpus exercises: every corpus input run once (with all
//! its checks), and the counters of all of them added up.
//!
//!   cargo run --release --manifest-path fuzz/Cargo.toml --example corpus_stats
use snapshot_receiver_fuzz::engine::{decode, run};
use std::collections::BTreeMap;

fn main() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/corpus/engine");
    let mut total: BTreeMap<String, u64> = BTreeMap::new();
    let mut inputs = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        let Some(scenario) = decode(&bytes) else {
            continue;
        };
        inputs += 1;
        for (k, v) in run(&scenario) {
            *total.entry(k).or_default() += v;
        }
    }
    println!("{inputs} scenarios");
    for (k, v) in total {
        println!("{k:<24} {v}");
    }
}
