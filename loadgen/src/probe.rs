//! Process probes from `/proc`: CPU time, resident set size and bytes
//! written to storage.

use std::time::Duration;

/// CPU time (user + system, every thread) this process has used so far, from
/// `/proc/self/stat` (clock ticks of 10 ms); `None` where it is not available.
pub fn process_cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name, which may contain spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split_ascii_whitespace();
    // utime and stime are fields 14 and 15 of the line, 12th and 13th here.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // USER_HZ is 100 on every mainstream Linux architecture.
    Some(Duration::from_millis((utime + stime) * 10))
}

pub(crate) fn cpu_since(start: Option<Duration>) -> Option<Duration> {
    Some(process_cpu_time()?.saturating_sub(start?))
}

/// Peak resident set size of this process (`VmHWM`), in bytes; `None` where
/// `/proc/self/status` is not available.
pub fn peak_rss_bytes() -> Option<u64> {
    proc_status_kib("VmHWM:").map(|k| k * 1024)
}

/// Current resident set size of this process (`VmRSS`), in bytes.
pub fn current_rss_bytes() -> Option<u64> {
    proc_status_kib("VmRSS:").map(|k| k * 1024)
}

/// Bytes this process has caused to be sent to the storage layer so far
/// (`write_bytes` of `/proc/self/io`: the kernel counts a page when a write
/// dirties it, so a file page rewritten before it reached the disk counts
/// once); `None` where it is not available.
pub fn written_bytes() -> Option<u64> {
    let io = std::fs::read_to_string("/proc/self/io").ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

fn proc_status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}
