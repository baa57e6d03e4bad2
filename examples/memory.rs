//! Memory per idle tracked object and per remembered event identity.
//!
//! `cargo run --release --example memory -- [COUNT]` (default 1,000,000).
//! Each measurement runs in a child process of its own, so memory freed by
//! one cannot be reused (and hidden) by the next.
//!
//! Reports two numbers for each structure, as deltas over COUNT items:
//! - heap: bytes the program asked the allocator for and still holds (a
//!   counting global allocator; excludes malloc's own headers and rounding);
//! - RSS: growth of the resident set (`VmRSS`), which includes them.
//!
//! Objects are measured the way the receiver holds them: 16 shards of
//! logical per-object actors (no task, no channel per object), each with the
//! minimal state `{}` so that the state payload (2 bytes) is excluded.
//! Identities are measured twice: the registry alone (every record naming the
//! object `card-1`), and through the engine, where deliveries are parsed and
//! decided as in the receiver and records name 1,000 objects. Either way each
//! record holds its own copy of the event and object ids (one block per
//! identity, see `core/src/registry/key.rs`).

use snapshot_receiver::core::{Context, Registry, Shard};
use snapshot_receiver::{Config, ManualClock, Verdict, DEFAULT_RETENTION};
use snapshot_receiver_loadgen::current_rss_bytes;
use std::alloc::{GlobalAlloc, Layout, System};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;

/// The system allocator, counting the bytes currently allocated.
struct Counting;

/// Bytes currently allocated through [`Counting`].
static LIVE: AtomicIsize = AtomicIsize::new(0);

// unsafe: `GlobalAlloc` is an unsafe trait; the example counts the bytes
// the receiver holds.
// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged; the counter has no effect on the memory returned.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Heap and RSS at one moment.
#[derive(Clone, Copy)]
struct Mark {
    heap: isize,
    rss: u64,
}

fn mark() -> Mark {
    Mark {
        heap: LIVE.load(Ordering::Relaxed),
        rss: current_rss_bytes().unwrap_or(0),
    }
}

fn report(what: &str, before: Mark, count: usize) {
    let after = mark();
    let heap = (after.heap - before.heap) as f64 / count as f64;
    let rss = (after.rss as f64 - before.rss as f64) / count as f64;
    println!("{what:<52} heap {heap:>7.1} B   RSS {rss:>7.1} B");
}

const SCENARIOS: [&str; 4] = ["objects", "registry", "registry-36", "engine"];

fn main() {
    let count: usize = std::env::args()
        .nth(1)
        .map(|a| a.replace('_', "").parse().expect("COUNT must be a number"))
        .unwrap_or(1_000_000);
    match std::env::args().nth(2) {
        Some(scenario) => run(&scenario, count),
        None => {
            println!("{count} items; per item:");
            let exe = std::env::current_exe().expect("own path");
            for scenario in SCENARIOS {
                let status = std::process::Command::new(&exe)
                    .arg(count.to_string())
                    .arg(scenario)
                    .status()
                    .expect("child runs");
                assert!(status.success(), "{scenario} failed");
            }
        }
    }
}

fn run(scenario: &str, count: usize) {
    let now = snapshot_receiver::parse_rfc3339("2024-01-01T08:01:00Z").expect("valid time");
    let config = Config {
        audit: false,
        ..Config::default()
    };
    let ctx = Context::new(config, Arc::new(ManualClock::new(now)));
    let mut id = String::new();
    match scenario {
        // Idle tracked objects, spread over 16 shards like the receiver does.
        "objects" => {
            let before = mark();
            let mut shards: Vec<Shard> = (0..16).map(|_| Shard::new()).collect();
            for i in 0..count {
                id.clear();
                let _ = write!(id, "card-{i}");
                shards[snapshot_receiver::core::shard_of(&id, 16)]
                    .insert_object(&ctx, &id, 0, "{}")
                    .expect("valid state");
            }
            report("idle object (16 shards, state `{}`)", before, count);
        }
        // The registry alone: ids like `e-123456-7` (or padded to 36 bytes),
        // every record naming the object `card-1`.
        "registry" | "registry-36" => {
            let width = if scenario == "registry" { 0 } else { 36 };
            let registry = Registry::new(DEFAULT_RETENTION);
            let object: Arc<str> = Arc::from("card-1");
            let before = mark();
            for i in 0..count {
                id.clear();
                let _ = write!(id, "e-{i}-7");
                while id.len() < width {
                    id.push('x');
                }
                registry.claim(&id, i as u128, &object, now, || Some(Verdict::Applied));
            }
            let label = if width == 0 {
                "~11-byte ids"
            } else {
                "36-byte ids"
            };
            report(
                &format!("identity, registry alone ({label})"),
                before,
                count,
            );
        }
        // Through the engine: 1,000 known objects, `count` distinct events,
        // each applied (a higher version every time). What stays per event is
        // its identity record (the latest state is one per object).
        "engine" => {
            let mut shard = Shard::new();
            let objects = 1_000usize;
            for o in 0..objects {
                shard
                    .insert_object(&ctx, &format!("card-{o}"), 0, "{}")
                    .expect("valid state");
            }
            let before = mark();
            let mut body = String::new();
            for i in 0..count {
                body.clear();
                let _ = write!(
                    body,
                    r#"{{"event_id":"e-{i}-7","object_id":"card-{}","object_version":{},"occurred_at":"2024-01-01T08:00:00Z","type":"card.snapshot","state":{{}}}}"#,
                    i % objects,
                    i / objects + 1
                );
                let delivery = ctx.parser().parse(body.as_bytes()).expect("within limits");
                let step = shard.deliver(&ctx, delivery);
                assert!(step.receipt.decision().is_some());
            }
            report("identity, through the engine (~11-byte ids)", before, count);
            assert_eq!(ctx.registry().len(), count);
        }
        other => panic!("unknown scenario {other}; one of {SCENARIOS:?}"),
    }
}
