//! How much time the machine itself takes away from busy threads.
//!
//! `cargo run --release --example jitter -- [THREADS] [SECONDS]` (default 2
//! threads, 5 s): each thread reads the clock in a tight loop and counts the
//! gaps longer than 0.5 ms between two reads: time in which it was not
//! running although it never blocked. docs/BENCHMARKS.md uses it to show
//! that on a 2-vCPU VM two busy threads lose milliseconds at a time while
//! one does not, which bounds any open-loop tail latency measured there.

use std::time::{Duration, Instant};

/// Gaps longer than this count as time taken away.
const GAP: Duration = Duration::from_micros(500);

fn main() {
    let mut args = std::env::args().skip(1);
    let threads: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2);
    let seconds: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let run = Duration::from_secs(seconds);
    let handles: Vec<_> = (0..threads.max(1))
        .map(|_| {
            std::thread::spawn(move || {
                let start = Instant::now();
                let mut last = start;
                let (mut count, mut total, mut longest) = (0u64, Duration::ZERO, Duration::ZERO);
                while last - start < run {
                    let now = Instant::now();
                    let gap = now - last;
                    if gap > GAP {
                        count += 1;
                        total += gap;
                        longest = longest.max(gap);
                    }
                    last = now;
                }
                (count, total, longest)
            })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        let Ok((count, total, longest)) = h.join() else {
            eprintln!("thread {i} panicked");
            std::process::exit(1);
        };
        println!(
            "thread {i}: {count} gaps over 0.5 ms, {:.1} ms in all ({:.2} % of {seconds} s), longest {:.1} ms",
            total.as_secs_f64() * 1e3,
            total.as_secs_f64() * 100.0 / run.as_secs_f64(),
            longest.as_secs_f64() * 1e3
        );
    }
}
