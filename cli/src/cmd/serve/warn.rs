//! Log lines a client cannot multiply: [`WarnLimiter`] lets the first line
//! of each [`WarnKind`] through, counts the repeats, and writes one summary
//! line per kind per interval with their count. `/metrics` still counts
//! every one (the call sites increment their counters before asking here).
//!
//! A store outage answered every delivery 503 with a warning of its own
//! (57,038 lines in 12 s); with the limiter a flood of one kind is one line
//! when it starts and one line per interval while it lasts, plus a last
//! summary when it stops (or at shutdown).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// What a repeated log line is about; each kind is limited on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WarnKind {
    /// The store could not record a step: a delivery, reconcile or purge
    /// answered 503 `store_failed` (WARN).
    StoreFailed,
    /// A read endpoint or `/readyz` could not read the store (WARN).
    StoreRead,
    /// Any 5xx answer, as the request trace sees it (ERROR).
    ServerError,
    /// A delivery's signature was refused, 401 (WARN).
    SignatureRefused,
    /// An operator or read request without the operator's token, 401 (WARN).
    OperatorRefused,
    /// A body over the size limit, 413 (WARN).
    BodyTooLarge,
}

impl WarnKind {
    /// Every kind, in the order of [`WarnLimiter`]'s counters.
    const ALL: [WarnKind; 6] = [
        WarnKind::StoreFailed,
        WarnKind::StoreRead,
        WarnKind::ServerError,
        WarnKind::SignatureRefused,
        WarnKind::OperatorRefused,
        WarnKind::BodyTooLarge,
    ];

    /// The kind's name in summary lines (`kind = ...`).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            WarnKind::StoreFailed => "store_failed",
            WarnKind::StoreRead => "store_read_failed",
            WarnKind::ServerError => "server_error",
            WarnKind::SignatureRefused => "signature_refused",
            WarnKind::OperatorRefused => "operator_token_refused",
            WarnKind::BodyTooLarge => "body_too_large",
        }
    }

    /// The level its lines (and its summary) are written at.
    fn level(self) -> tracing::Level {
        match self {
            // A refusal is the operator's business too (a sender with an old
            // secret, a client over the limit): it is seen at the default
            // level, limited like the rest.
            WarnKind::StoreFailed
            | WarnKind::StoreRead
            | WarnKind::SignatureRefused
            | WarnKind::OperatorRefused
            | WarnKind::BodyTooLarge => tracing::Level::WARN,
            WarnKind::ServerError => tracing::Level::ERROR,
        }
    }
}

/// One kind's state: two atomics, so the hot path takes no lock.
#[derive(Default)]
struct Counter {
    /// Set by the line let through; while set, the kind's lines are counted
    /// instead of written. Cleared by the end of an interval that counted
    /// none, so the first line after a quiet interval is written at once.
    open: AtomicBool,
    /// Lines counted instead of written since the last summary.
    suppressed: AtomicU64,
}

/// Per-kind limiter of repeated log lines (see the module doc).
///
/// [`admit`](Self::admit) is called where a line would be written;
/// [`summarise`](Self::summarise) once per interval (a task of `serve`) and
/// once at shutdown.
pub(crate) struct WarnLimiter {
    /// How often [`summarise`](Self::summarise) runs: named in its lines.
    interval: Duration,
    /// One counter per [`WarnKind::ALL`] entry, indexed by the kind.
    counters: [Counter; WarnKind::ALL.len()],
}

impl WarnLimiter {
    /// A limiter whose summaries are `interval` apart.
    pub(crate) fn new(interval: Duration) -> Self {
        Self {
            interval,
            counters: Default::default(),
        }
    }

    /// The counter of `kind` (destructured rather than indexed: the serve
    /// modules deny indexing, which could panic).
    fn counter(&self, kind: WarnKind) -> &Counter {
        let [store_failed, store_read, server_error, signature, operator, body] = &self.counters;
        match kind {
            WarnKind::StoreFailed => store_failed,
            WarnKind::StoreRead => store_read,
            WarnKind::ServerError => server_error,
            WarnKind::SignatureRefused => signature,
            WarnKind::OperatorRefused => operator,
            WarnKind::BodyTooLarge => body,
        }
    }

    /// Whether the caller writes its line of `kind` now: `true` for the
    /// first since the kind was last quiet for a whole interval, `false`
    /// (the line counted for the next summary) otherwise.
    pub(crate) fn admit(&self, kind: WarnKind) -> bool {
        let counter = self.counter(kind);
        // The load keeps a flood from writing the shared flag on every call.
        if !counter.open.load(Ordering::Relaxed) && !counter.open.swap(true, Ordering::AcqRel) {
            return true;
        }
        counter.suppressed.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// Ends an interval: each kind's count of lines not written since the
    /// last call, for the kinds that have one. A kind that counted none is
    /// quiet again, and its next line is written at once. (A line counted
    /// between the two steps is not lost: it is in the next interval's count.)
    pub(crate) fn end_interval(&self) -> Vec<(WarnKind, u64)> {
        let mut counts = Vec::new();
        for kind in WarnKind::ALL {
            let counter = self.counter(kind);
            match counter.suppressed.swap(0, Ordering::AcqRel) {
                0 => counter.open.store(false, Ordering::Release),
                n => counts.push((kind, n)),
            }
        }
        counts
    }

    /// [`end_interval`](Self::end_interval), writing one summary line per
    /// kind with a count, at the kind's level.
    pub(crate) fn summarise(&self) {
        let seconds = self.interval.as_secs();
        for (kind, suppressed) in self.end_interval() {
            let kind_name = kind.as_str();
            macro_rules! summary {
                ($level:expr) => {
                    tracing::event!(
                        $level,
                        kind = kind_name,
                        suppressed,
                        "{suppressed} more `{kind_name}` lines not written (one line per kind per \
                         {seconds} s; /metrics counts every one)"
                    )
                };
            }
            match kind.level() {
                tracing::Level::ERROR => summary!(tracing::Level::ERROR),
                tracing::Level::WARN => summary!(tracing::Level::WARN),
                _ => summary!(tracing::Level::INFO),
            }
        }
    }

    /// Runs [`summarise`](Self::summarise) every interval, for as long as
    /// the runtime runs it.
    pub(crate) async fn run(self: std::sync::Arc<Self>) {
        let mut ticks = tokio::time::interval(self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is immediate: an interval ends one interval later.
        ticks.tick().await;
        loop {
            ticks.tick().await;
            self.summarise();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Collects the formatted lines of a test subscriber.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Lines {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }

        /// A subscriber writing plain lines (no colour, time or target)
        /// into these.
        fn subscriber(&self) -> impl tracing::Subscriber {
            let lines = self.clone();
            tracing_subscriber::fmt()
                .with_writer(move || lines.clone())
                .with_ansi(false)
                .without_time()
                .with_target(false)
                .finish()
        }
    }

    /// Three intervals of one kind's flood and a quiet one, with another
    /// kind alongside: the exact lines written.
    #[test]
    fn one_line_per_kind_per_interval_with_the_count() {
        let lines = Lines::default();
        let subscriber = lines.subscriber();
        let limiter = WarnLimiter::new(Duration::from_secs(10));
        tracing::subscriber::with_default(subscriber, || {
            let warn = |kind| {
                if limiter.admit(kind) {
                    tracing::warn!(kind = kind.as_str(), "line");
                }
            };
            for _ in 0..1_000 {
                warn(WarnKind::StoreFailed);
            }
            warn(WarnKind::SignatureRefused);
            assert_eq!(
                limiter.end_interval(),
                [(WarnKind::StoreFailed, 999)],
                "the first of each kind was written"
            );
            for _ in 0..500 {
                warn(WarnKind::StoreFailed);
            }
            limiter.summarise();
            // A quiet interval for both: each is closed again.
            limiter.summarise();
            warn(WarnKind::StoreFailed);
            warn(WarnKind::StoreFailed);
            limiter.summarise();
        });
        assert_eq!(
            lines.text(),
            " WARN line kind=\"store_failed\"\n\
             \x20WARN line kind=\"signature_refused\"\n\
             \x20WARN 500 more `store_failed` lines not written (one line per kind per 10 s; \
             /metrics counts every one) kind=\"store_failed\" suppressed=500\n\
             \x20WARN line kind=\"store_failed\"\n\
             \x20WARN 1 more `store_failed` lines not written (one line per kind per 10 s; \
             /metrics counts every one) kind=\"store_failed\" suppressed=1\n"
        );
    }

    /// `serve`'s interval task: a summary at the end of each interval that
    /// counted lines, none for a quiet one (tokio's paused clock, so the
    /// intervals pass without waiting).
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn the_interval_task_writes_each_intervals_summary() {
        let lines = Lines::default();
        let subscriber = lines.subscriber();
        let _guard = tracing::subscriber::set_default(subscriber);
        let limiter = Arc::new(WarnLimiter::new(Duration::from_secs(10)));
        let task = tokio::spawn(limiter.clone().run());
        let admitted: Vec<bool> = (0..3).map(|_| limiter.admit(WarnKind::StoreRead)).collect();
        assert_eq!(admitted, [true, false, false]);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(
            lines.text(),
            "",
            "no summary before the first interval ends"
        );
        let summary = |n: u64| {
            format!(
                " WARN {n} more `store_read_failed` lines not written (one line per kind per \
                 10 s; /metrics counts every one) kind=\"store_read_failed\" suppressed={n}\n"
            )
        };
        // The interval ends at 10 s.
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(lines.text(), summary(2));
        assert!(
            !limiter.admit(WarnKind::StoreRead),
            "still counted: the flood goes on"
        );
        // At 20 s the second summary; at 30 s a quiet interval writes nothing.
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert_eq!(lines.text(), summary(2) + &summary(1));
        assert!(
            limiter.admit(WarnKind::StoreRead),
            "quiet again after the quiet interval"
        );
        task.abort();
    }

    /// Threads racing on one kind: exactly one is let through, and every
    /// other call is in the count.
    #[test]
    fn racing_threads_lose_no_count() {
        let limiter = Arc::new(WarnLimiter::new(Duration::from_secs(10)));
        let admitted: u64 = (0..4)
            .map(|_| {
                let limiter = limiter.clone();
                std::thread::spawn(move || {
                    (0..10_000)
                        .filter(|_| limiter.admit(WarnKind::BodyTooLarge))
                        .count() as u64
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .sum();
        assert_eq!(admitted, 1);
        assert_eq!(limiter.end_interval(), [(WarnKind::BodyTooLarge, 39_999)]);
    }
}
