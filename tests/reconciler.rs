//! The background reconciler (issue 47; docs/CONTRACT.md §4, *The service
//! fetches authorities itself*): a paused object converges with no operator
//! step, in memory, on SQLite and on PostgreSQL; bad answers change nothing;
//! a restart fetches again what the store holds.

use crate::common::{body, t, T};
use crate::relay::At;
use snapshot_receiver::authority::{AuthorityError, AuthoritySource};
use snapshot_receiver::reconciler::{
    BreakerState, FetchOutcome, NeedReason, NeedReasons, Reconciler, ReconcilerOptions,
};
use snapshot_receiver::{
    AuthoritativeSnapshot, Clock, ConflictKind, Decision, HoldReason, ManualClock, Receiver,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const QUEUED: &str = r#"{"stage":"queued","label":"Map"}"#;
const READY: &str = r#"{"stage":"ready","label":"Map"}"#;
const DONE: &str = r#"{"stage":"done","label":"Map"}"#;

/// What a [`Scripted`] authority answers for an object.
#[derive(Clone, Debug)]
enum Answer {
    /// A snapshot of the object asked at this version, state [`DONE`].
    Snapshot(u64),
    /// A snapshot of this other object.
    Other(&'static str),
    /// No such object.
    Absent,
    /// A failure.
    Fail(AuthorityError),
}

/// A test authority: answers after `latency` with what `script` says for
/// the call (its answers in turn, the last one repeated), counting calls.
struct Scripted {
    latency: Duration,
    script: Mutex<Vec<Answer>>,
    calls: AtomicUsize,
}

impl Scripted {
    fn new(latency: Duration, script: Vec<Answer>) -> Arc<Self> {
        Arc::new(Self {
            latency,
            script: Mutex::new(script),
            calls: AtomicUsize::new(0),
        })
    }

    /// From now on, answers `answer` to every call.
    fn answer(&self, answer: Answer) {
        *self.script.lock().unwrap() = vec![answer];
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl AuthoritySource for Scripted {
    async fn fetch(
        &self,
        object_id: &str,
    ) -> Result<Option<AuthoritativeSnapshot>, AuthorityError> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.latency).await;
        let answer = {
            let script = self.script.lock().unwrap();
            script[call.min(script.len() - 1)].clone()
        };
        match answer {
            Answer::Snapshot(v) => Ok(Some(
                AuthoritativeSnapshot::new(object_id, v, DONE, t()).unwrap(),
            )),
            Answer::Other(other) => Ok(Some(
                AuthoritativeSnapshot::new(other, 99, DONE, t()).unwrap(),
            )),
            Answer::Absent => Ok(None),
            Answer::Fail(e) => Err(e),
        }
    }
}

/// Fast options for tests: short backoff, the rescans an hour apart (so
/// that only decisions and the first scan feed the queue).
fn options() -> ReconcilerOptions {
    ReconcilerOptions {
        rate: None,
        backoff_base: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        breaker_failures: 3,
        breaker_open: Duration::from_millis(300),
        rescan: Duration::from_secs(3600),
        seed: Some(7),
        ..ReconcilerOptions::default()
    }
}

/// A receiver with card-7 v10 and card-8 v3, in memory or on `at`.
fn build(at: Option<&At>) -> Receiver {
    let b = Receiver::builder()
        .clock(Arc::new(ManualClock::new(t())) as Arc<dyn Clock>)
        .object("card-7", 10, QUEUED)
        .object("card-8", 3, r#"{"stage":"ready","label":"Chart"}"#);
    match at {
        Some(at) => at.store(b).build().unwrap(),
        None => b.build().unwrap(),
    }
}

/// The fixture's card-7 variant: e-1 v11 applied, e-1 again with another
/// state (a variant: card-7 paused), then e-2 v12 held behind the pause.
async fn pause_card_7(rx: &Receiver) {
    let first = body("e-1", "card-7", Some("11"), T, READY);
    let variant = body("e-1", "card-7", Some("11"), T, r#"{"stage":"other"}"#);
    let next = body("e-2", "card-7", Some("12"), T, DONE);
    assert_eq!(
        rx.deliver(first.as_bytes()).await.decision(),
        Some(Decision::Applied)
    );
    assert_eq!(
        rx.deliver(variant.as_bytes()).await.decision(),
        Some(Decision::Conflict(ConflictKind::EventVariant))
    );
    assert_eq!(
        rx.deliver(next.as_bytes()).await.decision(),
        Some(Decision::Held(HoldReason::Paused))
    );
}

/// Waits (at most 20 s) until `done` holds for the reconciler's state.
async fn until(
    reconciler: &Reconciler,
    what: &str,
    done: impl Fn(&snapshot_receiver::reconciler::ReconcilerStatus) -> bool,
) {
    for _ in 0..2000 {
        if done(&reconciler.status()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what}: not reached; status {:?}", reconciler.status());
}

/// card-7 as (version, state, paused).
async fn card_7(rx: &Receiver) -> (u64, String, bool) {
    let o = rx.object("card-7").await.unwrap();
    (o.version, o.state.compact(), o.paused)
}

/// The variant pauses card-7 after the reconciler started (its first scan
/// found nothing, its next is an hour away): the decision alone makes it
/// fetch, and card-7 converges to the authority with no operator step.
async fn a_paused_object_converges(at: Option<&At>) {
    let rx = build(at);
    let source = Scripted::new(Duration::from_millis(5), vec![Answer::Snapshot(12)]);
    let reconciler = rx.reconciler(source.clone(), options()).unwrap();
    let first = body("e-1", "card-7", Some("11"), T, READY);
    let variant = body("e-1", "card-7", Some("11"), T, r#"{"stage":"other"}"#);
    let next = body("e-2", "card-7", Some("12"), T, DONE);
    assert_eq!(
        rx.deliver(first.as_bytes()).await.decision(),
        Some(Decision::Applied)
    );
    assert_eq!(
        rx.deliver(variant.as_bytes()).await.decision(),
        Some(Decision::Conflict(ConflictKind::EventVariant))
    );
    // The reconciler is running: e-2 is held behind the pause, or, when the
    // authority's v12 came first, equal to it.
    let e2 = rx.deliver(next.as_bytes()).await.decision();
    assert!(
        matches!(
            e2,
            Some(Decision::Held(HoldReason::Paused) | Decision::Equal)
        ),
        "{e2:?}"
    );
    until(&reconciler, "one snapshot applied", |s| {
        s.fetches.applied == 1 && s.waiting == 0
    })
    .await;
    assert_eq!(card_7(&rx).await, (12, DONE.to_owned(), false));
    // Nothing left to settle (a held e-2 was re-decided: equal).
    assert!(rx.authority_needs().await.is_empty());
    // One fetch applied; a second (equal, changing nothing) only when e-2's
    // hold was noted after the first answer was checked.
    let status = reconciler.status();
    assert_eq!(
        (status.fetches.applied, status.breaker),
        (1, BreakerState::Closed { failures: 0 })
    );
    assert!(status.fetches.unchanged <= 1, "{status:?}");
    assert_eq!(status.fetches.total(), 1 + status.fetches.unchanged);
    assert_eq!(source.calls() as u64, status.fetches.total());
    reconciler.stop().await.unwrap();
    rx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_a_paused_object_converges_with_no_operator_step() {
    a_paused_object_converges(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_paused_object_converges_with_no_operator_step() {
    let at = At::sqlite("reconciler-converges");
    a_paused_object_converges(Some(&at)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_paused_object_converges_with_no_operator_step() {
    let Some(at) = At::postgres("reconciler_converges") else {
        return;
    };
    a_paused_object_converges(Some(&at)).await;
    at.done();
}

/// A durable receiver stopped with card-7 paused: the next run's reconciler
/// finds the need in what the store holds (its first scan) and fetches.
#[cfg(feature = "lsm")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lsm_a_paused_object_converges_with_no_operator_step() {
    let at = At::lsm("reconciler-converges-lsm");
    a_paused_object_converges(Some(&at)).await;
}

#[cfg(feature = "lsm")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lsm_a_restart_fetches_again_what_the_store_holds() {
    a_restart_fetches_again(&At::lsm("reconciler-restart-lsm")).await;
}

async fn a_restart_fetches_again(at: &At) {
    let rx = build(Some(at));
    pause_card_7(&rx).await;
    rx.shutdown().await;
    drop(rx);
    let rx = build(Some(at));
    let needs = rx.authority_needs().await;
    assert_eq!(needs.len(), 1);
    assert_eq!(
        (&*needs[0].object_id, needs[0].reasons),
        ("card-7", NeedReasons::default().with(NeedReason::Paused))
    );
    let source = Scripted::new(Duration::ZERO, vec![Answer::Snapshot(12)]);
    let reconciler = rx.reconciler(source.clone(), options()).unwrap();
    until(&reconciler, "the stored pause fetched", |s| {
        s.fetches.total() == 1 && s.waiting == 0
    })
    .await;
    assert_eq!(card_7(&rx).await, (12, DONE.to_owned(), false));
    reconciler.stop().await.unwrap();
    rx.shutdown().await;
    drop(rx);
    // And the third run has nothing to fetch.
    let rx = build(Some(at));
    assert!(rx.authority_needs().await.is_empty());
    rx.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_restart_fetches_again_what_the_store_holds() {
    a_restart_fetches_again(&At::sqlite("reconciler-restart")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_restart_fetches_again_what_the_store_holds() {
    let Some(at) = At::postgres("reconciler_restart") else {
        return;
    };
    a_restart_fetches_again(&at).await;
    at.done();
}

/// A bad answer (`answer`) changes nothing: card-7 stays paused, the outcome
/// is counted and shown in `waiting`; once the authority answers well, it
/// converges.
async fn a_bad_answer_changes_nothing(answer: Answer, label: &str, error: &str) {
    let rx = build(None);
    pause_card_7(&rx).await;
    let source = Scripted::new(Duration::ZERO, vec![answer]);
    let reconciler = rx.reconciler(source.clone(), options()).unwrap();
    until(&reconciler, "two bad answers", |s| s.fetches.total() >= 2).await;
    assert_eq!(card_7(&rx).await, (11, READY.to_owned(), true));
    // Nothing about another object was recorded.
    assert!(rx.object("card-x").await.is_none());
    assert_eq!(rx.object("card-8").await.unwrap().version, 3);
    let waiting = reconciler.waiting();
    assert_eq!(waiting.len(), 1);
    assert_eq!(
        (
            &*waiting[0].object_id,
            waiting[0].reasons.to_string(),
            waiting[0].last_error.as_deref()
        ),
        ("card-7", "paused".to_owned(), Some(error))
    );
    let status = reconciler.status();
    let counted = match label {
        "older" => status.fetches.older,
        "wrong_object" => status.fetches.wrong_object,
        "absent" => status.fetches.absent,
        "bad_answer" => status.fetches.bad_answer,
        other => panic!("{other}"),
    };
    assert_eq!(counted, status.fetches.total(), "{status:?}");
    // The authority answers well: asked for now, card-7 converges.
    source.answer(Answer::Snapshot(12));
    assert_eq!(
        reconciler.fetch_now("card-7").await.unwrap(),
        FetchOutcome::Applied
    );
    assert_eq!(card_7(&rx).await, (12, DONE.to_owned(), false));
    assert!(reconciler.waiting().is_empty());
    reconciler.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authority_older_than_the_object_is_refused_and_tried_again() {
    a_bad_answer_changes_nothing(
        Answer::Snapshot(5),
        "older",
        "the authority's version 5 is older than the object's 11: refused",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_of_another_object_records_nothing() {
    a_bad_answer_changes_nothing(
        Answer::Other("card-x"),
        "wrong_object",
        "the answer is about another object, `card-x`: ignored",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_such_object_leaves_a_paused_object_paused() {
    a_bad_answer_changes_nothing(Answer::Absent, "absent", "the authority has no such object")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_answer_changes_nothing() {
    a_bad_answer_changes_nothing(
        Answer::Fail(AuthorityError::bad_answer("the body is not JSON")),
        "bad_answer",
        "bad_answer: the body is not JSON",
    )
    .await;
}

/// An event for an object the receiver does not know is parked; the
/// authority has no such object: it stays parked, tried again on the slow
/// schedule. Once the authority has it, the snapshot creates it and the
/// parked event is decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_unknown_object_stays_parked_until_the_authority_has_it() {
    let rx = build(None);
    let source = Scripted::new(Duration::ZERO, vec![Answer::Absent]);
    let reconciler = rx.reconciler(source.clone(), options()).unwrap();
    let parked = body("e-9", "card-99", Some("4"), T, READY);
    assert_eq!(
        rx.deliver(parked.as_bytes()).await.decision(),
        Some(Decision::Held(HoldReason::UnknownObject))
    );
    until(&reconciler, "asked once", |s| s.fetches.absent == 1).await;
    assert!(rx.object("card-99").await.is_none());
    let w = reconciler.waiting();
    assert_eq!(
        (&*w[0].object_id, w[0].reasons.to_string()),
        ("card-99", "unknown_object".to_owned())
    );
    // The slow schedule: the longest backoff (200 ms ± 20 %) after the answer.
    let next = w[0].next_try.unwrap();
    let wait = next
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_default();
    assert!(wait <= Duration::from_millis(240), "{wait:?}");
    source.answer(Answer::Snapshot(5));
    until(&reconciler, "created", |s| s.fetches.applied == 1).await;
    let o = rx.object("card-99").await.unwrap();
    // Created at v5 by the authority; the parked v4 event is then stale.
    assert_eq!((o.version, o.paused), (5, false));
    assert!(rx.authority_needs().await.is_empty());
    reconciler.stop().await.unwrap();
}

/// The authority down: the breaker opens after three failures, and while it
/// is open nothing but its probes goes; back up, the probe closes it and
/// every paused object converges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authority_down_opens_the_breaker_and_every_object_converges_when_it_is_back() {
    let rx = build(None);
    for o in 0..6 {
        let id = format!("c-{o}");
        rx.reconcile(AuthoritativeSnapshot::new(&id, 1, QUEUED, t()).unwrap())
            .await
            .unwrap();
        // The same version with another state: a conflict pauses it.
        let conflict = body(&format!("x-{o}"), &id, Some("1"), T, READY);
        assert_eq!(
            rx.deliver(conflict.as_bytes()).await.decision(),
            Some(Decision::Conflict(ConflictKind::VersionState))
        );
    }
    let down = AuthorityError::unavailable("connection refused");
    let source = Scripted::new(Duration::ZERO, vec![Answer::Fail(down)]);
    let reconciler = rx
        .reconciler(
            source.clone(),
            ReconcilerOptions {
                concurrency: 1,
                breaker_open: Duration::from_secs(3600),
                ..options()
            },
        )
        .unwrap();
    until(&reconciler, "the breaker open", |s| {
        matches!(s.breaker, BreakerState::Open { .. })
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Three failures opened it; nothing went since.
    assert_eq!(source.calls(), 3);
    assert_eq!(reconciler.status().fetches.unavailable, 3);
    assert_eq!(reconciler.status().waiting, 6);
    // Back: an operator's request goes through the open breaker and its
    // answer closes it; the rest follow.
    source.answer(Answer::Snapshot(2));
    assert_eq!(
        reconciler.fetch_now("c-0").await.unwrap(),
        FetchOutcome::Applied
    );
    until(&reconciler, "every object converged", |s| {
        s.waiting == 0 && s.fetches.applied == 6
    })
    .await;
    assert_eq!(
        reconciler.status().breaker,
        BreakerState::Closed { failures: 0 }
    );
    for o in 0..6 {
        let obj = rx.object(&format!("c-{o}")).await.unwrap();
        assert_eq!((obj.version, obj.paused), (2, false), "c-{o}");
    }
    reconciler.stop().await.unwrap();
}

/// A slow authority: each attempt past its deadline counts as a timeout,
/// and nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_past_its_deadline_times_out() {
    let rx = build(None);
    pause_card_7(&rx).await;
    let source = Scripted::new(Duration::from_secs(5), vec![Answer::Snapshot(12)]);
    let reconciler = rx
        .reconciler(
            source.clone(),
            ReconcilerOptions {
                attempt_timeout: Duration::from_millis(50),
                ..options()
            },
        )
        .unwrap();
    until(&reconciler, "a timeout", |s| s.fetches.timeout >= 1).await;
    assert_eq!(card_7(&rx).await, (11, READY.to_owned(), true));
    assert_eq!(
        reconciler.waiting()[0].last_error.as_deref(),
        Some("timeout: no answer within 0.050 s")
    );
    reconciler.stop().await.unwrap();
}

#[test]
fn options_out_of_range_are_refused_with_their_name() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let rx = build(None);
        let source = Scripted::new(Duration::ZERO, vec![Answer::Absent]);
        let bad = |o: ReconcilerOptions| match rx.reconciler(source.clone(), o) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("accepted"),
        };
        assert_eq!(
            bad(ReconcilerOptions {
                concurrency: 0,
                ..options()
            }),
            "reconciler options: concurrency: must be at least 1"
        );
        assert_eq!(
            bad(ReconcilerOptions {
                attempt_timeout: Duration::ZERO,
                ..options()
            }),
            "reconciler options: attempt timeout: must be above 0"
        );
    });
}

/// What needs an authority, by reason: a paused object, held events with no
/// version and of an unsupported type, a parked unknown object; not an
/// event held because its identity expired (none here), nor the rest.
#[tokio::test]
async fn needs_are_derived_from_what_the_receiver_holds_with_their_reasons() {
    let rx = build(None);
    pause_card_7(&rx).await;
    let no_version = body("e-3", "card-8", None, T, READY);
    let unsupported = r#"{"event_id":"e-4","object_id":"card-8","object_version":4,"type":"card.renamed","state":{}}"#;
    let unknown = body("e-5", "card-50", Some("1"), T, READY);
    for b in [no_version.as_str(), unsupported, unknown.as_str()] {
        assert!(matches!(
            rx.deliver(b.as_bytes()).await.decision(),
            Some(Decision::Held(_))
        ));
    }
    let needs: Vec<(String, String)> = rx
        .authority_needs()
        .await
        .into_iter()
        .map(|n| (n.object_id.to_string(), n.reasons.to_string()))
        .collect();
    assert_eq!(
        needs,
        [
            ("card-50".to_owned(), "unknown_object".to_owned()),
            ("card-7".to_owned(), "paused".to_owned()),
            (
                "card-8".to_owned(),
                "missing_version,unsupported_type".to_owned()
            ),
        ]
    );
    assert_eq!(
        rx.needing_authority().await,
        [
            Arc::from("card-50"),
            Arc::from("card-7"),
            Arc::from("card-8")
        ]
    );
}

/// One fetch in flight per object: asking for an object whose fetch is out
/// joins it (one call to the authority, the same outcome for both).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_joins_the_fetch_in_flight() {
    let rx = build(None);
    pause_card_7(&rx).await;
    let source = Scripted::new(Duration::from_millis(200), vec![Answer::Snapshot(12)]);
    let reconciler = rx.reconciler(source.clone(), options()).unwrap();
    until(&reconciler, "the fetch out", |s| s.in_flight == 1).await;
    let (a, b) = tokio::join!(
        reconciler.fetch_now("card-7"),
        reconciler.fetch_now("card-7")
    );
    assert_eq!(
        (a.unwrap(), b.unwrap()),
        (FetchOutcome::Applied, FetchOutcome::Applied)
    );
    assert_eq!(source.calls(), 1);
    reconciler.stop().await.unwrap();
}

/// Every fetch is counted through the metrics facade by its outcome, under
/// a name and label the guide's table lists (docs/OPERATIONS.md, Metrics).
#[test]
fn fetches_are_counted_by_outcome_through_the_metrics_facade() {
    let capture = crate::counters::Capture::default();
    // A local recorder is per thread: a current-thread runtime keeps the
    // reconciler's task on this thread.
    metrics::with_local_recorder(&capture, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let rx = build(None);
                pause_card_7(&rx).await;
                let source = Scripted::new(
                    Duration::ZERO,
                    vec![
                        Answer::Snapshot(5),
                        Answer::Other("card-x"),
                        Answer::Snapshot(12),
                    ],
                );
                let reconciler = rx.reconciler(source, options()).unwrap();
                until(&reconciler, "converged", |s| {
                    s.fetches.applied == 1 && s.waiting == 0
                })
                .await;
                reconciler.stop().await.unwrap();
            });
    });
    let seen: Vec<(String, u64)> = capture
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|(k, _)| k.starts_with("snapshot_receiver_authority_fetches_total"))
        .map(|(k, v)| (k.clone(), v.load(Ordering::Relaxed)))
        .collect();
    assert_eq!(
        seen,
        [
            (
                "snapshot_receiver_authority_fetches_total{outcome=applied}".to_owned(),
                1
            ),
            (
                "snapshot_receiver_authority_fetches_total{outcome=older}".to_owned(),
                1
            ),
            (
                "snapshot_receiver_authority_fetches_total{outcome=wrong_object}".to_owned(),
                1
            ),
        ]
    );
    let table = crate::doc_commands::metrics_table();
    for (series, _) in &seen {
        assert_eq!(crate::doc_commands::undocumented(&table, series), None);
    }
}

/// With a resync period, every object not confirmed by an authority for
/// that long is fetched, needed or not (Kubernetes informers' resync): here
/// both objects, neither paused nor holding anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resync_fetches_every_object_not_confirmed_for_the_period() {
    let rx = build(None);
    assert!(rx.authority_needs().await.is_empty());
    let source = Scripted::new(Duration::ZERO, vec![Answer::Snapshot(12)]);
    let reconciler = rx
        .reconciler(
            source.clone(),
            ReconcilerOptions {
                resync: Some(Duration::from_secs(3600)),
                ..options()
            },
        )
        .unwrap();
    until(&reconciler, "both resynced", |s| {
        s.fetches.applied == 2 && s.waiting == 0
    })
    .await;
    for o in ["card-7", "card-8"] {
        let obj = rx.object(o).await.unwrap();
        assert_eq!(
            (obj.version, obj.state.compact()),
            (12, DONE.to_owned()),
            "{o}"
        );
    }
    // Confirmed within the period: not fetched again before it ends.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(source.calls(), 2);
    reconciler.stop().await.unwrap();
}

/// Two receivers on one PostgreSQL database, each with a reconciler, both
/// fetch the paused card-7 and apply the authority: never two conflicting
/// applies (the authority's version decides); both read card-7 converged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_two_processes_fetch_one_object_and_apply_it_once() {
    let Some(at) = At::postgres("reconciler_two") else {
        return;
    };
    let a = build(Some(&at));
    pause_card_7(&a).await;
    // Started after the pause: it resumes card-7 paused from the store.
    let b = build(Some(&at));
    assert_eq!(b.authority_needs().await.len(), 1);
    let source = Scripted::new(Duration::from_millis(20), vec![Answer::Snapshot(12)]);
    let ra = a.reconciler(source.clone(), options()).unwrap();
    let rb = b.reconciler(source.clone(), options()).unwrap();
    for r in [&ra, &rb] {
        until(r, "settled", |s| s.fetches.total() >= 1 && s.waiting == 0).await;
    }
    for rx in [&a, &b] {
        assert_eq!(card_7(rx).await, (12, DONE.to_owned(), false));
    }
    let (url, schema) = match &at {
        At::Postgres(url, schema) => (url.clone(), schema.clone()),
        At::Sqlite(_) | At::Lsm(_) => unreachable!(),
    };
    // One replacement: an authority's write is conditional on the row it
    // read, so the second process's apply conflicts with the first's
    // commit and is decided again on the stored v12 (equal: no effect).
    let count = |sql: &str| crate::durability::pg_count(&url, &schema, sql);
    let authority = "FROM replacements WHERE cause_event IS NULL AND object_id = 'card-7'";
    assert_eq!(count(&format!("SELECT count(*) {authority}")), 1);
    assert_eq!(
        count(&format!(
            "SELECT count(*) {authority} AND (version <> '00000000000000000012' OR state <> '{DONE}')"
        )),
        0
    );
    assert_eq!(
        count("SELECT count(*) FROM objects WHERE object_id = 'card-7' AND version = '00000000000000000012' AND NOT paused"),
        1
    );
    let (sa, sb) = (ra.status().fetches, rb.status().fetches);
    assert_eq!(
        sa.applied + sb.applied + sa.unchanged + sb.unchanged,
        2,
        "{sa:?} {sb:?}"
    );
    ra.stop().await.unwrap();
    rb.stop().await.unwrap();
    a.shutdown().await;
    b.shutdown().await;
    at.done();
}

/// One authority applied by two receivers sharing a store makes one
/// effect: the second read card-7 (v11, paused) before the first
/// committed v12, so its write conflicts with what is stored and the step
/// is decided again on the stored v12, equal to the authority.
fn one_authority_applied_by_two_receivers_makes_one_effect(at: At) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let a = build(Some(&at));
        pause_card_7(&a).await;
        // Started after the pause: card-7 v11 paused is in its memory.
        let b = build(Some(&at));
        let snapshot = || AuthoritativeSnapshot::new("card-7", 12, DONE, t()).unwrap();
        let first = a.reconcile(snapshot()).await.unwrap();
        let second = b.reconcile(snapshot()).await.unwrap();
        assert_eq!(
            (first.replacement, second.replacement),
            (true, false),
            "the second apply is decided again on the stored v12"
        );
        assert_eq!(second.previous_version, Some(12));
        let effects = b.outbox(0, 100).await.unwrap();
        let versions: Vec<(String, u64)> = effects
            .iter()
            .map(|e| (e.object_id.to_string(), e.version))
            .collect();
        assert_eq!(
            versions,
            [("card-7".to_owned(), 11), ("card-7".to_owned(), 12)],
            "one effect for e-1 and one for the authority"
        );
        for rx in [&a, &b] {
            assert_eq!(card_7(rx).await, (12, DONE.to_owned(), false));
        }
        a.shutdown().await;
        b.shutdown().await;
    });
    at.done();
}

#[test]
fn sqlite_one_authority_applied_by_two_receivers_makes_one_effect() {
    one_authority_applied_by_two_receivers_makes_one_effect(At::sqlite("reconciler_once"));
}

#[test]
fn postgres_one_authority_applied_by_two_receivers_makes_one_effect() {
    if let Some(at) = At::postgres("reconciler_once") {
        one_authority_applied_by_two_receivers_makes_one_effect(at);
    }
}

/// More needs at once than the reconciler's intake holds (the subscriber
/// capacity, 4 here): those past it are dropped there, and the scan that
/// the overflow asks for finds them (the rescans are an hour apart), so
/// every object converges, each replaced by its authority once.
#[test]
fn needs_past_the_reconcilers_intake_are_found_by_the_scan_it_asks_for() {
    const OBJECTS: usize = 1_500;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut b = Receiver::builder()
            .clock(Arc::new(ManualClock::new(t())) as Arc<dyn Clock>)
            .subscriber_capacity(4);
        let ids: Vec<String> = (0..OBJECTS).map(|i| format!("obj-{i:04}")).collect();
        for id in &ids {
            b = b.object(id, 1, QUEUED);
        }
        let rx = b.build().unwrap();
        let source = Scripted::new(Duration::ZERO, vec![Answer::Snapshot(2)]);
        let reconciler = rx.reconciler(source.clone(), options()).unwrap();
        // Its first scan (nothing to find) done before the deliveries, so
        // that only the intake and the scan its overflow asks for remain.
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Each object gets an event with no version: held, a need each.
        let bodies: Vec<Vec<u8>> = ids
            .iter()
            .enumerate()
            .map(|(i, id)| body(&format!("e-{i}"), id, None, T, READY).into_bytes())
            .collect();
        let receipts = rx.deliver_batch(&bodies).await;
        assert!(receipts
            .iter()
            .all(|r| r.decision() == Some(Decision::Held(HoldReason::MissingVersion))));
        for _ in 0..3000 {
            if rx.authority_needs().await.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let left = rx.authority_needs().await;
        assert!(
            left.is_empty(),
            "{} of {OBJECTS} objects still need an authority after 30 s, first {:?}",
            left.len(),
            left.first()
        );
        // Each object replaced once by its authority; a scan that read an
        // object before its answer landed may fetch it again, which finds
        // it equal (unchanged) and writes nothing.
        assert_eq!(rx.metrics()["authority.applied"], OBJECTS as u64);
        let status = reconciler.status();
        assert_eq!(status.fetches.applied, OBJECTS as u64);
        assert_eq!(
            source.calls() as u64,
            status.fetches.applied + status.fetches.unchanged,
            "{status:?}"
        );
        reconciler.stop().await.unwrap();
    });
}
