//! What the committer measures about its group commits: how many, how full
//! (deliveries per commit), how long, and where the committer thread's CPU
//! went (turning writes into statement parameters, executing the
//! statements, the commit itself). A load test reads a [`CommitStats`]
//! snapshot before and after a run and reports the difference.

use hdrhistogram::Histogram;
use snapshot_receiver_core::store::CommitPhases;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use snapshot_receiver_core::store::PhaseTime;
use std::time::Duration;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use std::time::Instant;

/// Times consecutive phases on the calling thread: each [`PhaseClock::lap`]
/// adds the time since the previous one to a [`PhaseTime`].
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) struct PhaseClock {
    /// When the current phase began.
    wall: Instant,
    /// The thread's CPU clock when the current phase began.
    cpu: Duration,
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl PhaseClock {
    /// Starts the first phase now.
    pub(crate) fn start() -> Self {
        Self {
            wall: Instant::now(),
            cpu: thread_cpu_time(),
        }
    }

    /// Ends the current phase, adding its time to `phase`, and starts the next.
    pub(crate) fn lap(&mut self, phase: &mut PhaseTime) {
        let (wall, cpu) = (Instant::now(), thread_cpu_time());
        phase.wall += wall.saturating_duration_since(self.wall);
        phase.cpu += cpu.saturating_sub(self.cpu);
        self.wall = wall;
        self.cpu = cpu;
    }
}

/// CPU time (user + system) the calling thread has used, in nanoseconds
/// resolution (`CLOCK_THREAD_CPUTIME_ID`).
#[cfg(unix)]
#[allow(unsafe_code)]
pub(crate) fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, exclusively borrowed timespec for the call;
    // the clock id is a constant the platform defines.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// Without a per-thread CPU clock the CPU columns stay zero.
#[cfg(not(unix))]
pub(crate) fn thread_cpu_time() -> Duration {
    Duration::ZERO
}

/// Deliveries per committed group that carried a delivery: mean, median
/// and largest, all three over the same groups. A group of only pauses or
/// seeds (the objects of `--initial` at start-up) is left out of all three:
/// counted, it pulled the median to 0 beside a mean of 2.5.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct GroupSizes {
    /// Mean deliveries per commit.
    pub mean: f64,
    /// Median.
    pub p50: u64,
    /// Largest.
    pub max: u64,
}

/// A snapshot of what a [`super::Committer`] has done since it started
/// (see [`super::Committer::stats`]); [`CommitStats::since`] gives what
/// happened between two snapshots.
#[derive(Clone, Debug)]
pub struct CommitStats {
    /// Group commits that committed (each one transaction, one fsync with
    /// SQLite `synchronous=FULL`).
    pub commits: u64,
    /// Group commits refused because a condition no longer held (another
    /// process changed a row): nothing committed, the shards decide again.
    pub conflicts: u64,
    /// Group commits that failed otherwise: nothing committed.
    pub failures: u64,
    /// Shards' groups left out of a group commit because the store refused
    /// a row of one of their deliveries (that delivery is answered
    /// `reject`, the shard decides its other deliveries again).
    pub refusals: u64,
    /// Deliveries recorded by the committed groups (one audit row of kind
    /// `delivery` or `malformed` each).
    pub deliveries: u64,
    /// Writes ([`super::Write`]s) in the committed groups.
    pub writes: u64,
    /// The store's own phase times, every attempt.
    pub phases: CommitPhases,
    /// CPU time the committer thread has used in all (commits, loads,
    /// reloads after conflicts, waking up).
    pub thread_cpu: Duration,
    /// Deliveries per committed group that carried a delivery.
    group: Histogram<u64>,
    /// Wall time of each committed group's `Store::commit`, microseconds.
    commit_us: Histogram<u64>,
}

impl Default for CommitStats {
    fn default() -> Self {
        Self::new()
    }
}

/// Largest group recorded exactly: a group is cut at
/// [`super::CommitterConfig::max_batch_writes`] writes, far below this.
const MAX_GROUP: u64 = 1 << 24;
/// Longest commit recorded exactly, microseconds (one hour).
const MAX_COMMIT_US: u64 = 3_600_000_000;

impl CommitStats {
    /// Nothing recorded yet.
    pub fn new() -> Self {
        Self {
            commits: 0,
            conflicts: 0,
            failures: 0,
            refusals: 0,
            deliveries: 0,
            writes: 0,
            phases: CommitPhases::default(),
            thread_cpu: Duration::ZERO,
            // Bounds are constants inside hdrhistogram's range: cannot fail.
            group: Histogram::new_with_bounds(1, MAX_GROUP, 3)
                .unwrap_or_else(|_| unreachable!("valid histogram bounds")),
            commit_us: Histogram::new_with_bounds(1, MAX_COMMIT_US, 3)
                .unwrap_or_else(|_| unreachable!("valid histogram bounds")),
        }
    }

    /// Records one committed group of `deliveries` deliveries and `writes`
    /// writes whose commit took `took`.
    pub(crate) fn committed(&mut self, deliveries: u64, writes: u64, took: Duration) {
        self.commits += 1;
        self.deliveries += deliveries;
        self.writes += writes;
        // A group of only pauses or seeds holds no delivery: not a size of
        // a group of deliveries (GroupSizes).
        if deliveries > 0 {
            self.group.saturating_record(deliveries);
        }
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.commit_us.saturating_record(us.max(1));
    }

    /// What happened between `earlier` (an older snapshot of the same
    /// committer) and this snapshot.
    pub fn since(&self, earlier: &CommitStats) -> CommitStats {
        let mut group = self.group.clone();
        let mut commit_us = self.commit_us.clone();
        // Both are snapshots of one growing record, so every count of
        // `earlier` is in `self`; should that not hold, keep the totals.
        if group.subtract(&earlier.group).is_err() {
            group = self.group.clone();
        }
        if commit_us.subtract(&earlier.commit_us).is_err() {
            commit_us = self.commit_us.clone();
        }
        CommitStats {
            commits: self.commits.saturating_sub(earlier.commits),
            conflicts: self.conflicts.saturating_sub(earlier.conflicts),
            failures: self.failures.saturating_sub(earlier.failures),
            refusals: self.refusals.saturating_sub(earlier.refusals),
            deliveries: self.deliveries.saturating_sub(earlier.deliveries),
            writes: self.writes.saturating_sub(earlier.writes),
            phases: self.phases.since(&earlier.phases),
            thread_cpu: self.thread_cpu.saturating_sub(earlier.thread_cpu),
            group,
            commit_us,
        }
    }

    /// Deliveries per committed group that carried a delivery (all zero
    /// before the first such commit); see [`GroupSizes`].
    pub fn deliveries_per_commit(&self) -> GroupSizes {
        if self.group.is_empty() {
            return GroupSizes::default();
        }
        GroupSizes {
            mean: self.deliveries as f64 / self.group.len() as f64,
            p50: self.group.value_at_quantile(0.5),
            max: self.group.max(),
        }
    }

    /// The wall time of a committed group's commit at `quantile` (0.5: the
    /// median), to about 0.1 %; zero before the first commit.
    pub fn commit_time(&self, quantile: f64) -> Duration {
        if self.commit_us.is_empty() {
            return Duration::ZERO;
        }
        Duration::from_micros(self.commit_us.value_at_quantile(quantile))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    use snapshot_receiver_core::store::PhaseTime;

    #[test]
    fn since_keeps_only_what_happened_after_the_earlier_snapshot() {
        let mut stats = CommitStats::new();
        stats.committed(0, 1000, Duration::from_millis(40));
        let before = stats.clone();
        for (deliveries, ms) in [(3, 2), (5, 3), (7, 4)] {
            stats.committed(deliveries, deliveries * 4, Duration::from_millis(ms));
        }
        stats.conflicts += 2;
        let run = stats.since(&before);
        assert_eq!((run.commits, run.deliveries, run.writes), (3, 15, 60));
        assert_eq!((run.conflicts, run.failures), (2, 0));
        let sizes = run.deliveries_per_commit();
        assert_eq!((sizes.mean, sizes.p50, sizes.max), (5.0, 5, 7));
        // 3 ms is the median; the seed's 40 ms commit is not part of the run.
        assert_eq!(run.commit_time(0.5), Duration::from_micros(3001));
        assert_eq!(run.commit_time(1.0), Duration::from_micros(4001));
    }

    /// Two seeding groups and two of five deliveries: the sizes are those
    /// of the two groups of deliveries (they were a mean of 2.5 beside a
    /// median of 0).
    #[test]
    fn groups_without_a_delivery_are_not_sizes() {
        let mut stats = CommitStats::new();
        for deliveries in [0, 0, 5, 5] {
            stats.committed(deliveries, 5, Duration::from_millis(1));
        }
        assert_eq!((stats.commits, stats.deliveries), (4, 10));
        let sizes = stats.deliveries_per_commit();
        assert_eq!((sizes.mean, sizes.p50, sizes.max), (5.0, 5, 5));
        // Only seeds: no sizes yet.
        let mut seeds = CommitStats::new();
        seeds.committed(0, 3, Duration::from_millis(1));
        assert_eq!(seeds.deliveries_per_commit(), GroupSizes::default());
    }

    #[test]
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    fn a_phase_clock_adds_each_lap_to_its_phase() {
        let mut phases = CommitPhases::default();
        let mut clock = PhaseClock::start();
        // Burn some CPU so the thread clock moves.
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        clock.lap(&mut phases.encode);
        clock.lap(&mut phases.execute);
        assert!(phases.encode.wall > Duration::ZERO);
        assert!(phases.encode.cpu > Duration::ZERO);
        assert_eq!(phases.commit, PhaseTime::default());
    }
}
