//! Skipped tests, said twice: when one skips (its reason on its captured
//! output) and at the end of the run, where every skipped test is listed
//! with its reason after libtest's summary, so that a run that passed by
//! skipping says so. Under `CI` a skip is a failure instead: `.ci/run`
//! installs and starts everything the suite needs.
//!
//! The skippable tests, by what they need (the README names the same):
//! PostgreSQL (`SNAPSHOT_RECEIVER_PG_URL` or 127.0.0.1:5432), NATS JetStream
//! (`SNAPSHOT_RECEIVER_NATS_URL` or 127.0.0.1:4222), a Python with the
//! webhook libraries (`SNAPSHOT_RECEIVER_PYTHON`), headless Chromium.

use std::sync::{Mutex, Once};

/// Each skipped test's name and reason, in the order they skipped.
/// (A std `Mutex`: the exit handler runs outside any runtime.)
static SKIPPED: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

/// The exit handler is registered once, by the first skip.
static AT_EXIT: Once = Once::new();

/// The calling test is skipped for `reason` (what it needs and how to get
/// it). Under `CI` this panics with the reason, so the test fails.
pub fn skip(reason: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "{reason}: under CI no test may skip (.ci/run must provide what it needs)"
    );
    eprintln!("skipping: {reason}");
    // libtest names each test's thread after the test.
    let test = std::thread::current()
        .name()
        .unwrap_or("(unnamed test thread)")
        .to_owned();
    SKIPPED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push((test, reason.to_owned()));
    // SAFETY: `atexit` with a function that takes nothing and does not
    // unwind (it catches every panic); registered once.
    AT_EXIT.call_once(|| unsafe {
        // A failed registration only loses the list; each skip was said.
        let _ = libc::atexit(print_skipped);
    });
}

/// The list printed at the end of the run: one line per skipped test with
/// its reason, after a count; empty when nothing skipped.
pub fn summary() -> String {
    let skipped = SKIPPED.lock().unwrap_or_else(|e| e.into_inner());
    let mut seen = std::collections::BTreeSet::new();
    let lines: Vec<String> = skipped
        .iter()
        .filter(|entry| seen.insert((*entry).clone()))
        .map(|(test, reason)| format!("  {test}: {reason}"))
        .collect();
    if lines.is_empty() {
        return String::new();
    }
    format!(
        "\n{} test{} skipped (each fails under CI=true):\n{}\n",
        lines.len(),
        if lines.len() == 1 { "" } else { "s" },
        lines.join("\n")
    )
}

/// Writes [`summary`] on stderr as the process exits.
extern "C" fn print_skipped() {
    let _ = std::panic::catch_unwind(|| {
        use std::io::Write as _;
        let _ = std::io::stderr().write_all(summary().as_bytes());
    });
}
