//! The work queue driven with plain calls: every rule a test, no clock, no
//! IO, no runtime.

use super::*;
use std::collections::HashSet;
use std::time::UNIX_EPOCH;

/// The test's clock: `ms` milliseconds after an epoch.
fn at(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_000_000) + Duration::from_millis(ms)
}

fn id(s: &str) -> Arc<str> {
    Arc::from(s)
}

/// Unlimited rate, backoff 1 s .. 60 s, breaker after 3 failures for 10 s,
/// rescans every hour (so that they stay out of the way).
fn settings() -> ReconcilerSettings {
    ReconcilerSettings {
        concurrency: 4,
        rate: None,
        burst: 1,
        backoff_base: Duration::from_secs(1),
        backoff_max: Duration::from_secs(60),
        breaker_failures: 3,
        breaker_open: Duration::from_secs(10),
        resync: None,
        rescan: Duration::from_secs(3600),
        tenants: false,
        seed: 7,
        memory: usize::MAX,
        resync_page: 1000,
    }
}

fn need(object: &str, reason: NeedReason) -> AuthorityNeed {
    AuthorityNeed {
        object_id: id(object),
        reasons: NeedReasons::default().with(reason),
    }
}

/// A queue whose first scan found `objects` paused, at time 0.
fn queue_with(settings: ReconcilerSettings, objects: &[&str]) -> WorkQueue {
    let mut q = WorkQueue::new(settings, at(0));
    assert_eq!(q.next(at(0)), Next::Scan);
    let needs = objects
        .iter()
        .map(|o| need(o, NeedReason::Paused))
        .collect();
    q.scanned(needs, at(0), at(0));
    q
}

/// Takes every fetch `next` hands out at `now`; the object ids.
fn fetches(q: &mut WorkQueue, now: SystemTime) -> Vec<String> {
    let mut out = Vec::new();
    while let Next::Fetch { object_id, .. } = q.next(now) {
        out.push(object_id.to_string());
    }
    out
}

fn unavailable() -> FetchOutcome {
    FetchOutcome::Failed(AuthorityError::unavailable("connection refused"))
}

#[test]
fn the_first_thing_is_a_scan_then_one_fetch_per_object_needed() {
    let mut q = WorkQueue::new(settings(), at(0));
    assert_eq!(q.next(at(0)), Next::Scan);
    // A scan out: no second one.
    assert_eq!(q.next(at(0)), Next::Wait(None));
    q.scanned(
        vec![
            need("a", NeedReason::Paused),
            need("b", NeedReason::MissingVersion),
        ],
        at(0),
        at(0),
    );
    // "a" noted again, by a decision: still one entry.
    q.note(&id("a"), NeedReason::UnsupportedType, at(0));
    assert_eq!(fetches(&mut q, at(0)), ["a", "b"]);
    assert_eq!(q.status().waiting, 2);
    assert_eq!(q.status().in_flight, 2);
    // The next scan is due after the rescan interval.
    assert_eq!(q.next(at(0)), Next::Wait(Some(Duration::from_secs(3600))));
    assert_eq!(q.next(at(3_600_000)), Next::Scan);
}

#[test]
fn an_applied_answer_forgets_the_object() {
    let mut q = queue_with(settings(), &["a"]);
    assert_eq!(fetches(&mut q, at(0)), ["a"]);
    assert_eq!(
        q.answered(
            &id("a"),
            &FetchOutcome::Applied,
            NeedReasons::default(),
            u64::MAX,
            at(5)
        ),
        None
    );
    assert_eq!(q.status().waiting, 0);
    assert_eq!(q.status().counts.applied, 1);
    assert!(q.waiting(at(5)).is_empty());
}

#[test]
fn a_need_noted_while_in_flight_joins_it() {
    let mut q = queue_with(settings(), &["a"]);
    assert_eq!(fetches(&mut q, at(0)), ["a"]);
    q.note(&id("a"), NeedReason::MissingVersion, at(1));
    // Not a second fetch while the first is out.
    assert_eq!(fetches(&mut q, at(2)), Vec::<String>::new());
    assert_eq!(q.status().in_flight, 1);
    // The answer was checked after the note (seen = now): it settled both.
    let seen = q.seen();
    let none = NeedReasons::default();
    assert_eq!(
        q.answered(&id("a"), &FetchOutcome::Unchanged, none, seen, at(3)),
        None
    );
    assert!(!q.contains("a"));
}

#[test]
fn a_need_noted_after_the_answer_was_checked_is_fetched_again() {
    let mut q = queue_with(settings(), &["a"]);
    assert_eq!(fetches(&mut q, at(0)), ["a"]);
    // The fetch applied its snapshot and checked the object (seen read
    // then); a new pause came after, its note before the answer.
    let seen = q.seen();
    q.note(&id("a"), NeedReason::Paused, at(1));
    let none = NeedReasons::default();
    let next = q
        .answered(&id("a"), &FetchOutcome::Applied, none, seen, at(2))
        .unwrap();
    assert!(next >= at(802) && next <= at(1202), "{next:?}");
    let w = &q.waiting(at(2))[0];
    assert_eq!(
        w.last_error.as_deref(),
        Some("applied, but the object still needs an authority (paused)")
    );
    assert_eq!(fetches(&mut q, next), ["a"]);
}

#[test]
fn what_an_applied_snapshot_leaves_behind_is_fetched_again_after_a_backoff() {
    let mut q = queue_with(settings(), &["a"]);
    let mut now = 0;
    for step in [1u64, 2, 4] {
        assert_eq!(fetches(&mut q, at(now)), ["a"]);
        let left = NeedReasons::default().with(NeedReason::UnsupportedType);
        let seen = q.seen();
        let next = q
            .answered(&id("a"), &FetchOutcome::Applied, left, seen, at(now))
            .unwrap();
        let wait = next.duration_since(at(now)).unwrap();
        let step = Duration::from_secs(step);
        assert!(wait >= step * 4 / 5 && wait <= step * 6 / 5, "{wait:?}");
        now += wait.as_millis() as u64;
    }
    assert_eq!(
        q.waiting(at(now))[0].reasons,
        NeedReasons::default().with(NeedReason::UnsupportedType)
    );
}

#[test]
fn no_more_than_the_concurrency_bound_is_in_flight() {
    let mut q = queue_with(
        ReconcilerSettings {
            concurrency: 2,
            ..settings()
        },
        &["a", "b", "c"],
    );
    assert_eq!(fetches(&mut q, at(0)), ["a", "b"]);
    assert_eq!(q.status().in_flight, 2);
    q.answered(
        &id("a"),
        &FetchOutcome::Applied,
        NeedReasons::default(),
        u64::MAX,
        at(1),
    );
    assert_eq!(fetches(&mut q, at(1)), ["c"]);
}

#[test]
fn the_token_bucket_lets_a_burst_through_then_one_per_interval() {
    let mut q = queue_with(
        ReconcilerSettings {
            rate: Some(2.0),
            burst: 2,
            ..settings()
        },
        &["a", "b", "c", "d"],
    );
    assert_eq!(fetches(&mut q, at(0)), ["a", "b"]);
    // The next token comes 500 ms later (2 per second).
    assert_eq!(q.next(at(0)), Next::Wait(Some(Duration::from_millis(500))));
    assert_eq!(fetches(&mut q, at(499)), Vec::<String>::new());
    assert_eq!(fetches(&mut q, at(500)), ["c"]);
    assert_eq!(fetches(&mut q, at(999)), Vec::<String>::new());
    assert_eq!(fetches(&mut q, at(1000)), ["d"]);
}

#[test]
fn failures_back_off_exponentially_with_jitter_up_to_the_maximum() {
    let mut q = queue_with(settings(), &["a"]);
    let mut now = 0;
    let mut waits = Vec::new();
    for _ in 0..9 {
        assert_eq!(fetches(&mut q, at(now)), ["a"]);
        // Older answers count as failures too, without opening the breaker.
        let older = FetchOutcome::Older {
            offered: 3,
            current: 5,
        };
        let next = q
            .answered(&id("a"), &older, NeedReasons::default(), u64::MAX, at(now))
            .unwrap();
        let wait = next.duration_since(at(now)).unwrap();
        waits.push(wait);
        // Not before it is due.
        let early = now + wait.as_millis() as u64 - 1;
        assert_eq!(fetches(&mut q, at(early)), Vec::<String>::new());
        now += wait.as_millis() as u64;
    }
    // 1, 2, 4, 8, 16, 32, 60, 60, 60 s, each within ±20 %.
    let steps = [1, 2, 4, 8, 16, 32, 60, 60, 60];
    for (wait, step) in waits.iter().zip(steps) {
        let step = Duration::from_secs(step);
        assert!(
            *wait >= step * 4 / 5 && *wait <= step * 6 / 5,
            "{wait:?} is not {step:?} ± 20 %"
        );
    }
    // Jittered: not all the same factor.
    assert_ne!(waits[0] * 2, waits[1]);
    assert_eq!(q.breaker(), BreakerState::Closed { failures: 0 });
    let w = &q.waiting(at(now))[0];
    assert_eq!(
        (w.attempts, w.last_error.as_deref()),
        (
            9,
            Some("the authority's version 3 is older than the object's 5: refused")
        )
    );
}

#[test]
fn retry_after_is_honoured_when_longer_than_the_backoff_only() {
    let mut q = queue_with(settings(), &["a", "b"]);
    assert_eq!(fetches(&mut q, at(0)), ["a", "b"]);
    let long = AuthorityError::unavailable("503").with_retry_after(Duration::from_secs(30));
    let short = AuthorityError::unavailable("503").with_retry_after(Duration::from_millis(10));
    let a = q.answered(
        &id("a"),
        &FetchOutcome::Failed(long),
        NeedReasons::default(),
        u64::MAX,
        at(0),
    );
    assert_eq!(a, Some(at(30_000)));
    let b = q
        .answered(
            &id("b"),
            &FetchOutcome::Failed(short),
            NeedReasons::default(),
            u64::MAX,
            at(0),
        )
        .unwrap();
    // The backoff (1 s ± 20 %), not the 10 ms asked.
    assert!(b >= at(800) && b <= at(1200), "{b:?}");
}

#[test]
fn an_absent_object_is_tried_again_on_the_slow_schedule() {
    let mut q = queue_with(settings(), &["a"]);
    assert_eq!(fetches(&mut q, at(0)), ["a"]);
    let next = q
        .answered(
            &id("a"),
            &FetchOutcome::Absent,
            NeedReasons::default(),
            u64::MAX,
            at(0),
        )
        .unwrap();
    assert!(next >= at(48_000) && next <= at(72_000), "{next:?}");
    let w = &q.waiting(at(0))[0];
    assert_eq!(
        (w.next_try, w.last_error.as_deref()),
        (Some(next), Some("the authority has no such object"))
    );
    assert_eq!(q.status().counts.absent, 1);
}

#[test]
fn the_breaker_opens_after_consecutive_failures_probes_once_and_closes() {
    let mut q = queue_with(settings(), &["a", "b", "c", "d"]);
    assert_eq!(fetches(&mut q, at(0)), ["a", "b", "c", "d"]);
    q.answered(
        &id("a"),
        &unavailable(),
        NeedReasons::default(),
        u64::MAX,
        at(1),
    );
    // A bad answer shows the authority is there: the count starts again.
    let bad = FetchOutcome::Failed(AuthorityError::bad_answer("not JSON"));
    q.answered(&id("b"), &bad, NeedReasons::default(), u64::MAX, at(1));
    assert_eq!(q.breaker(), BreakerState::Closed { failures: 0 });
    q.answered(
        &id("c"),
        &unavailable(),
        NeedReasons::default(),
        u64::MAX,
        at(1),
    );
    q.answered(
        &id("d"),
        &FetchOutcome::Failed(AuthorityError::timeout("10 s")),
        NeedReasons::default(),
        u64::MAX,
        at(1),
    );
    assert_eq!(q.breaker(), BreakerState::Closed { failures: 2 });
    // Every object is due again after its backoff (at most 1.2 s); the
    // third failure opens the breaker.
    let mut again = fetches(&mut q, at(1300));
    again.sort();
    assert_eq!(again, ["a", "b", "c", "d"]);
    q.answered(
        &id("a"),
        &unavailable(),
        NeedReasons::default(),
        u64::MAX,
        at(1300),
    );
    assert_eq!(q.breaker(), BreakerState::Open { until: at(11_300) });
    let opened: Vec<Notice> = q.notices().collect();
    assert_eq!(
        opened,
        [Notice::BreakerOpened {
            until: at(11_300),
            cause: "unavailable: connection refused".to_owned()
        }]
    );
    for o in ["b", "c", "d"] {
        q.answered(
            &id(o),
            &unavailable(),
            NeedReasons::default(),
            u64::MAX,
            at(1300),
        );
    }
    // Open: nothing goes, however due, until its time is up.
    assert_eq!(fetches(&mut q, at(11_299)), Vec::<String>::new());
    assert!(matches!(q.next(at(11_000)), Next::Wait(Some(d)) if d == Duration::from_millis(300)));
    // Half-open: one probe.
    let probe = fetches(&mut q, at(11_300));
    assert_eq!(probe.len(), 1);
    assert_eq!(q.breaker(), BreakerState::HalfOpen { probing: true });
    // The probe fails: open again.
    q.answered(
        &id(&probe[0]),
        &unavailable(),
        NeedReasons::default(),
        u64::MAX,
        at(11_400),
    );
    assert_eq!(q.breaker(), BreakerState::Open { until: at(21_400) });
    let probe = fetches(&mut q, at(21_400));
    assert_eq!(probe.len(), 1);
    q.answered(
        &id(&probe[0]),
        &FetchOutcome::Applied,
        NeedReasons::default(),
        u64::MAX,
        at(21_500),
    );
    assert_eq!(q.breaker(), BreakerState::Closed { failures: 0 });
    assert_eq!(q.notices().next_back(), Some(Notice::BreakerClosed));
    // Closed: the rest go as they are due.
    assert_eq!(fetches(&mut q, at(200_000)).len(), 3);
}

#[test]
fn tenants_are_served_round_robin() {
    let mut q = WorkQueue::new(
        ReconcilerSettings {
            concurrency: 100,
            tenants: true,
            ..settings()
        },
        at(0),
    );
    assert_eq!(q.next(at(0)), Next::Scan);
    let mut needs: Vec<AuthorityNeed> = (1..=4)
        .map(|i| need(&format!("big/{i}"), NeedReason::Paused))
        .collect();
    needs.push(need("small/1", NeedReason::Paused));
    needs.push(need("other/1", NeedReason::Paused));
    q.scanned(needs, at(0), at(0));
    let order = fetches(&mut q, at(0));
    // One of each tenant before a tenant's second.
    let tenants: Vec<&str> = order.iter().map(|o| tenant_of(o, true)).collect();
    assert_eq!(
        tenants[..3].iter().collect::<HashSet<_>>().len(),
        3,
        "{order:?}"
    );
    assert_eq!(&tenants[3..], ["big", "big", "big"]);
}

#[test]
fn without_tenants_objects_go_in_the_order_they_became_due() {
    let mut q = queue_with(settings(), &["z", "a"]);
    q.note(&id("m"), NeedReason::Paused, at(0));
    assert_eq!(fetches(&mut q, at(0)), ["z", "a", "m"]);
}

#[test]
fn a_scan_drops_what_was_settled_elsewhere_but_not_later_needs_or_fetches_out() {
    let mut q = queue_with(settings(), &["a", "b", "c"]);
    assert_eq!(fetches(&mut q, at(0)), ["a", "b", "c"]);
    q.answered(
        &id("a"),
        &unavailable(),
        NeedReasons::default(),
        u64::MAX,
        at(1),
    );
    q.answered(
        &id("b"),
        &unavailable(),
        NeedReasons::default(),
        u64::MAX,
        at(1),
    );
    // "d" noted after the scan started: kept though the scan misses it.
    q.note(&id("d"), NeedReason::MissingVersion, at(6));
    assert_eq!(q.next(at(3_600_000)), Next::Scan);
    // The scan (started at 5) finds only "b": "a" was reconciled by an
    // operator, "c" is in flight.
    q.scanned(vec![need("b", NeedReason::Paused)], at(5), at(7));
    let left: Vec<String> = q
        .waiting(at(7))
        .into_iter()
        .map(|w| format!("{} {}", w.object_id, w.reasons))
        .collect();
    assert_eq!(left, ["b paused", "c ", "d missing_version"]);
    // "c" answers with a failure and has no reason left: it leaves.
    assert_eq!(
        q.answered(
            &id("c"),
            &unavailable(),
            NeedReasons::default(),
            u64::MAX,
            at(8)
        ),
        None
    );
    assert!(!q.contains("c"));
}

#[test]
fn a_resync_fetches_every_object_not_confirmed_for_the_period() {
    let mut q = WorkQueue::new(
        ReconcilerSettings {
            resync: Some(Duration::from_secs(600)),
            ..settings()
        },
        at(0),
    );
    assert_eq!(q.next(at(0)), Next::Scan);
    q.scanned(Vec::new(), at(0), at(0));
    // The first resync starts at once, from the first id.
    assert_eq!(
        q.next(at(0)),
        Next::List {
            after: id(""),
            limit: 1000
        }
    );
    // A page shorter than the limit: the last one.
    q.listed(vec![id("a"), id("b")], at(0));
    assert_eq!(fetches(&mut q, at(0)), ["a", "b"]);
    assert_eq!(
        q.waiting(at(0))[0].reasons,
        NeedReasons::default().with(NeedReason::Resync)
    );
    q.answered(
        &id("a"),
        &FetchOutcome::Unchanged,
        NeedReasons::default(),
        u64::MAX,
        at(1000),
    );
    q.answered(
        &id("b"),
        &FetchOutcome::Applied,
        NeedReasons::default(),
        u64::MAX,
        at(400_000),
    );
    // "c" is reconciled by a need.
    q.note(&id("c"), NeedReason::Paused, at(500_000));
    assert_eq!(fetches(&mut q, at(500_000)), ["c"]);
    q.answered(
        &id("c"),
        &FetchOutcome::Applied,
        NeedReasons::default(),
        u64::MAX,
        at(500_000),
    );
    // Before 600 s no page is read.
    assert_eq!(
        q.next(at(599_999)),
        Next::Wait(Some(Duration::from_millis(1)))
    );
    // At 600 s the next resync: "a" was confirmed 599 s ago: fetched; "b"
    // and "c" within the period: not; "d" never: fetched.
    assert_eq!(
        q.next(at(601_001)),
        Next::List {
            after: id(""),
            limit: 1000
        }
    );
    q.listed(vec![id("a"), id("b"), id("c"), id("d")], at(601_001));
    assert_eq!(fetches(&mut q, at(601_001)), ["a", "d"]);
}

/// A resync reads the object ids page by page: the next page only once
/// the last one's objects were all sent, and only while the memory part
/// has room; a page stopped for want of room goes on from the first id it
/// could not take. Memory counted never passes the part, and every object
/// is fetched once.
#[test]
fn a_resync_pages_through_the_ids_within_the_memory_part() {
    let all: Vec<Arc<str>> = (0..10).map(|i| id(&format!("o-{i}"))).collect();
    // Room for three entries of these ids (3 bytes each).
    let part = 3 * (3 + ENTRY_OVERHEAD);
    let mut q = WorkQueue::new(
        ReconcilerSettings {
            resync: Some(Duration::from_secs(600)),
            resync_page: 4,
            memory: part,
            concurrency: 2,
            ..settings()
        },
        at(0),
    );
    assert_eq!(q.next(at(0)), Next::Scan);
    q.scanned(Vec::new(), at(0), at(0));
    let mut fetched = Vec::new();
    let mut pages = Vec::new();
    let mut now = 0;
    loop {
        now += 1;
        match q.next(at(now)) {
            Next::List { after, limit } => {
                assert_eq!(limit, 4);
                pages.push(after.to_string());
                let page: Vec<Arc<str>> = all
                    .iter()
                    .filter(|o| o.as_ref() > after.as_ref())
                    .take(limit)
                    .cloned()
                    .collect();
                q.listed(page, at(now));
            }
            Next::Fetch { object_id, .. } => {
                fetched.push(object_id.to_string());
                q.answered(
                    &object_id,
                    &FetchOutcome::Applied,
                    NeedReasons::default(),
                    u64::MAX,
                    at(now),
                );
            }
            Next::Wait(_) => break,
            other => panic!("{other:?}"),
        }
        assert!(q.status().memory <= part, "{:?}", q.status());
    }
    let expected: Vec<String> = all.iter().map(|o| o.to_string()).collect();
    assert_eq!(fetched, expected, "each object fetched once, in id order");
    // Three entries fit, so a page stops at the first id without room and
    // the next starts there (the confirmed objects take room too, at most
    // half the part, so fewer entries fit as the resync goes on).
    assert_eq!(pages[0], "");
    assert!(pages.len() >= 4, "{pages:?}");
    assert!(q.status().memory_peak <= part);
    assert!(q.status().deferred > 0);
}

#[test]
fn a_request_goes_first_past_backoff_and_an_open_breaker_and_joins_a_fetch_out() {
    let mut q = queue_with(
        ReconcilerSettings {
            breaker_failures: 1,
            ..settings()
        },
        &["a", "b"],
    );
    assert_eq!(fetches(&mut q, at(0)), ["a", "b"]);
    q.answered(
        &id("a"),
        &unavailable(),
        NeedReasons::default(),
        u64::MAX,
        at(1),
    );
    assert!(matches!(q.breaker(), BreakerState::Open { .. }));
    // "b" is out: asking for it starts nothing.
    q.request(&id("b"), at(2));
    assert_eq!(fetches(&mut q, at(2)), Vec::<String>::new());
    // "a" backs off and the breaker is open: asked for, it goes now.
    q.request(&id("a"), at(3));
    assert_eq!(fetches(&mut q, at(3)), ["a"]);
    // An object nobody needed: fetched once, then forgotten whatever the
    // answer.
    q.request(&id("x"), at(4));
    assert_eq!(fetches(&mut q, at(4)), ["x"]);
    assert_eq!(
        q.answered(
            &id("x"),
            &FetchOutcome::Absent,
            NeedReasons::default(),
            u64::MAX,
            at(5)
        ),
        None
    );
    assert!(!q.contains("x"));
}

#[test]
fn a_stopped_queue_sends_nothing_and_stops_once_answers_are_in() {
    let mut q = queue_with(settings(), &["a", "b"]);
    assert_eq!(fetches(&mut q, at(0)).len(), 2);
    q.stop();
    q.note(&id("c"), NeedReason::Paused, at(0));
    assert_eq!(q.next(at(0)), Next::Wait(None));
    q.answered(
        &id("a"),
        &FetchOutcome::Applied,
        NeedReasons::default(),
        u64::MAX,
        at(1),
    );
    assert_eq!(q.next(at(1)), Next::Wait(None));
    q.answered(
        &id("b"),
        &FetchOutcome::Applied,
        NeedReasons::default(),
        u64::MAX,
        at(1),
    );
    assert_eq!(q.next(at(1)), Next::Stop);
}

#[test]
fn waiting_lists_reasons_since_attempts_and_the_status_the_oldest() {
    let mut q = queue_with(settings(), &["a"]);
    q.note(&id("b"), NeedReason::UnknownObject, at(50));
    q.note(&id("a"), NeedReason::MissingVersion, at(60));
    assert_eq!(fetches(&mut q, at(100)), ["a", "b"]);
    q.answered(
        &id("b"),
        &unavailable(),
        NeedReasons::default(),
        u64::MAX,
        at(200),
    );
    let w = q.waiting(at(200));
    assert_eq!(w.len(), 2);
    assert_eq!(
        (
            &*w[0].object_id,
            w[0].reasons.to_string(),
            w[0].since,
            w[0].attempts,
            w[0].next_try
        ),
        ("a", "paused,missing_version".to_owned(), at(0), 1, None)
    );
    assert_eq!(
        (&*w[1].object_id, w[1].since, w[1].attempts),
        ("b", at(50), 1)
    );
    assert_eq!(
        w[1].last_error.as_deref(),
        Some("unavailable: connection refused")
    );
    let s = q.status();
    assert_eq!(
        (
            s.waiting,
            s.in_flight,
            s.oldest,
            s.counts.unavailable,
            s.counts.total()
        ),
        (2, 1, Some(at(0)), 1, 1)
    );
}

#[test]
fn settings_out_of_range_are_named() {
    let bad = |s: ReconcilerSettings| s.problem().unwrap();
    assert_eq!(
        bad(ReconcilerSettings {
            concurrency: 0,
            ..settings()
        }),
        "concurrency: must be at least 1"
    );
    assert_eq!(
        bad(ReconcilerSettings {
            rate: Some(0.0),
            ..settings()
        }),
        "rate: 0 fetches/s must be above 0"
    );
    assert_eq!(
        bad(ReconcilerSettings {
            backoff_base: Duration::from_secs(120),
            ..settings()
        }),
        "backoff: the base (120s) must be above 0 and at most the maximum (60s)"
    );
    assert_eq!(settings().problem(), None);
    assert_eq!(ReconcilerSettings::default().problem(), None);
}

#[test]
fn held_verdicts_map_to_the_reasons_an_authority_settles() {
    use crate::{ConflictKind, HoldReason, Verdict};
    let of = NeedReason::of_verdict;
    assert_eq!(
        of(Verdict::Conflict(ConflictKind::EventVariant)),
        Some(NeedReason::Paused)
    );
    assert_eq!(
        of(Verdict::Held(HoldReason::UnsupportedType)),
        Some(NeedReason::UnsupportedType)
    );
    assert_eq!(of(Verdict::Held(HoldReason::ExpiredIdentity)), None);
    assert_eq!(of(Verdict::Applied), None);
}

#[test]
fn a_shard_lists_what_an_authority_can_settle_with_the_reasons() {
    use crate::{Config, Context, Shard, SystemClock};
    let ctx = Context::new(Config::default(), Arc::new(SystemClock));
    let mut shard = Shard::new();
    for o in ["card-7", "card-8", "card-9"] {
        shard.insert_object(&ctx, o, 10, r#"{"s":1}"#).unwrap();
    }
    let bodies = [
        // An equal version with another state: card-7 paused.
        r#"{"event_id":"e-1","object_id":"card-7","object_version":10,"type":"card.snapshot","state":{"s":2}}"#,
        // Behind the pause: held (paused), nothing more to settle.
        r#"{"event_id":"e-2","object_id":"card-7","object_version":11,"type":"card.snapshot","state":{"s":3}}"#,
        // card-8: no version, then a type the receiver does not support.
        r#"{"event_id":"e-3","object_id":"card-8","type":"card.snapshot","state":{"s":2}}"#,
        r#"{"event_id":"e-4","object_id":"card-8","object_version":11,"type":"card.renamed","state":{}}"#,
        // card-9: applied; nothing to settle.
        r#"{"event_id":"e-5","object_id":"card-9","object_version":11,"type":"card.snapshot","state":{"s":2}}"#,
        // card-50: unknown, parked.
        r#"{"event_id":"e-6","object_id":"card-50","object_version":1,"type":"card.snapshot","state":{"s":2}}"#,
    ];
    for body in bodies {
        let delivery = ctx.parser().parse(body.as_bytes()).unwrap();
        shard.deliver(&ctx, delivery);
    }
    let listed: Vec<(String, String)> = shard
        .authority_needs()
        .into_iter()
        .map(|n| (n.object_id.to_string(), n.reasons.to_string()))
        .collect();
    let expected = [
        ("card-50", "unknown_object"),
        ("card-7", "paused"),
        ("card-8", "missing_version,unsupported_type"),
    ]
    .map(|(o, r)| (o.to_owned(), r.to_owned()));
    assert_eq!(listed, expected);
    let one = |o: &str| shard.authority_need(o).to_string();
    assert_eq!(
        [
            one("card-7"),
            one("card-8"),
            one("card-9"),
            one("card-50"),
            one("nope")
        ],
        [
            "paused",
            "missing_version,unsupported_type",
            "",
            "unknown_object",
            ""
        ]
    );
    assert_eq!(
        shard.needing_authority(),
        [id("card-50"), id("card-7"), id("card-8")]
    );
}

#[test]
fn a_rescan_asked_for_comes_at_once_but_not_twice_within_a_second() {
    let mut q = queue_with(settings(), &[]);
    // The first scan's result came in at 0: the next asked for waits 1 s.
    q.rescan(at(10));
    assert_eq!(q.next(at(10)), Next::Wait(Some(Duration::from_millis(990))));
    assert_eq!(q.next(at(1000)), Next::Scan);
    q.scanned(vec![need("a", NeedReason::Paused)], at(1000), at(5000));
    // Long after the last: at once.
    q.rescan(at(9000));
    assert_eq!(q.next(at(9000)), Next::Scan);
}

/// The queue's entries count against its memory part: past it a need is
/// not queued (counted as deferred), never lost: once entries leave, a
/// scan is asked for and finds the rest in what the receiver holds. The
/// bytes counted never pass the part, and every object converges.
#[test]
fn needs_past_the_memory_part_wait_in_the_store_and_the_next_scan_finds_them() {
    let all: Vec<String> = (0..20).map(|i| format!("o-{i:02}")).collect();
    // Room for three entries of these ids (4 bytes each).
    let part = 3 * (4 + ENTRY_OVERHEAD);
    let mut q = WorkQueue::new(
        ReconcilerSettings {
            memory: part,
            ..settings()
        },
        at(0),
    );
    // What the receiver holds: every object paused until fetched.
    let mut paused: std::collections::BTreeSet<String> = all.iter().cloned().collect();
    let mut fetched = Vec::new();
    let mut now = 0;
    // Each decision notes its need too: all but three are deferred.
    for o in &all {
        q.note(&id(o), NeedReason::Paused, at(0));
    }
    assert_eq!(q.status().waiting, 3);
    assert_eq!(q.status().deferred, 17);
    for _ in 0..1000 {
        now += 100;
        match q.next(at(now)) {
            Next::Scan => {
                let needs = paused.iter().map(|o| need(o, NeedReason::Paused)).collect();
                q.scanned(needs, at(now), at(now));
            }
            Next::Fetch { object_id, .. } => {
                fetched.push(object_id.to_string());
                paused.remove(&*object_id);
                q.answered(
                    &object_id,
                    &FetchOutcome::Applied,
                    NeedReasons::default(),
                    u64::MAX,
                    at(now),
                );
            }
            Next::Wait(_) if paused.is_empty() => break,
            Next::Wait(_) => {}
            other => panic!("{other:?}"),
        }
        let status = q.status();
        assert!(status.memory <= part, "{status:?}");
        assert!(status.waiting <= 3, "{status:?}");
    }
    assert!(paused.is_empty(), "not converged: {paused:?}");
    fetched.sort();
    assert_eq!(fetched, all, "each object fetched once");
    assert_eq!(q.status().memory, 0);
    assert_eq!(q.status().memory_peak, part);
}

/// What the store keeps for the operator: an answer that leaves the object
/// waiting is a `Failed` record with its last error, attempts and next
/// try; the object's convergence a `Settled` one, as is a scan that finds
/// it settled by someone else.
#[test]
fn failed_answers_are_recorded_and_convergence_clears_them() {
    let mut q = queue_with(settings(), &["a", "b"]);
    assert_eq!(fetches(&mut q, at(0)), ["a", "b"]);
    let next = q
        .answered(
            &id("a"),
            &FetchOutcome::Older {
                offered: 3,
                current: 5,
            },
            NeedReasons::default(),
            0,
            at(10),
        )
        .unwrap();
    let records: Vec<WaitRecord> = q.records().collect();
    assert_eq!(
        records,
        [WaitRecord::Failed(StoredWait {
            object_id: id("a"),
            reasons: NeedReasons::default().with(NeedReason::Paused),
            outcome: "older",
            error: "the authority's version 3 is older than the object's 5: refused".to_owned(),
            attempts: 1,
            since: at(0),
            next_try: Some(next),
            at: at(10),
        })]
    );
    q.answered(
        &id("b"),
        &FetchOutcome::Applied,
        NeedReasons::default(),
        u64::MAX,
        at(20),
    );
    assert_eq!(
        q.records().collect::<Vec<_>>(),
        [WaitRecord::Settled(id("b"))]
    );
    // "a" settled by someone else: the next scan does not list it.
    assert_eq!(q.next(at(3_600_000)), Next::Scan);
    q.scanned(Vec::new(), at(3_600_000), at(3_600_000));
    assert_eq!(
        q.records().collect::<Vec<_>>(),
        [WaitRecord::Settled(id("a"))]
    );
    // Only asked for, and failed: the asker has its answer and the queue
    // forgets it; the store keeps the error, with no next try (the asker
    // may have found the need where the queue does not look).
    q.request(&id("c"), at(3_600_000));
    assert_eq!(fetches(&mut q, at(3_600_000)), ["c"]);
    q.answered(
        &id("c"),
        &unavailable(),
        NeedReasons::default(),
        0,
        at(3_600_001),
    );
    assert_eq!(
        q.records().collect::<Vec<_>>(),
        [WaitRecord::Failed(StoredWait {
            object_id: id("c"),
            reasons: NeedReasons::default(),
            outcome: "unavailable",
            error: "unavailable: connection refused".to_owned(),
            attempts: 1,
            since: at(3_600_000),
            next_try: None,
            at: at(3_600_001),
        })]
    );
    assert!(!q.contains("c"));
}
