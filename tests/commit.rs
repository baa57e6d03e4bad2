//! What an acknowledgement promises with a durable store, each claim forced
//! deterministically: the SQLite commit is fsynced before the receipt is
//! handed out, a failed group commit spanning several shards rolls every
//! one of them back (held queues included), `shutdown()` decides what was
//! already queued, and a restart resumes parked and malformed inputs.

use crate::common::fsync_vfs;
use crate::common::{body, t, T};
use crate::store::temp_db;
use futures_util::FutureExt;
use snapshot_receiver::core::error_chain;
use snapshot_receiver::store::{Fault, FaultyStore, SqliteOptions, SqliteStore, StoreError};
use snapshot_receiver::{
    core::shard_of, Ack, AuthoritativeSnapshot, Clock, ConflictKind, Decision, HoldReason,
    ManualClock, Outcome, Receipt, Receiver, ReceiverBuilder, RetryReason,
};
use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Bounds every wait of these tests: a hang fails the test instead.
pub(crate) const PATIENCE: Duration = Duration::from_secs(60);

/// A receipt being awaited.
pub(crate) type Pending = Pin<Box<dyn Future<Output = Receipt> + Send>>;

/// Starts a delivery and polls it once: the body is parsed and queued in its
/// shard's mailbox (which has room), its receipt is not awaited.
pub(crate) fn queue(rx: &Receiver, body: String) -> Pending {
    let rx = rx.clone();
    let mut pending: Pending = Box::pin(async move { rx.deliver(body.as_bytes()).await });
    assert!(
        (&mut pending).now_or_never().is_none(),
        "a queued delivery cannot be decided before its shard ran"
    );
    pending
}

pub(crate) fn card(object: &str, event: &str, version: u64, state: &str) -> String {
    body(event, object, Some(&version.to_string()), T, state)
}

pub(crate) fn count(path: &Path, sql: &str) -> i64 {
    rusqlite::Connection::open(path)
        .unwrap()
        .query_row(sql, [], |r| r.get(0))
        .unwrap()
}

/// Commits held at a gate and a chosen commit failed, for a SQLite store
/// under test (see [`Script::open`]).
#[derive(Default)]
pub(crate) struct Script {
    /// The gate and the commit count, behind one lock.
    state: Mutex<ScriptState>,
    /// Wakes the committer at the gate and the test waiting for it.
    changed: Condvar,
    /// The commit number that fails ([`Fault::Failed`]); 0: none.
    pub(crate) fail_at: AtomicU64,
    /// From this commit number on every commit fails; 0: none.
    pub(crate) fail_from: AtomicU64,
}

#[derive(Default)]
struct ScriptState {
    /// Commits attempted so far.
    attempts: u64,
    /// The next commit waits at the gate until the test opens it.
    hold_next: bool,
    /// A commit is waiting at the gate.
    waiting: bool,
}

impl Script {
    /// The store: a SQLite file behind a [`FaultyStore`] whose fault chooser
    /// runs this script on the committer's thread before each commit.
    pub(crate) fn open(
        path: &Path,
        script: Arc<Script>,
    ) -> Result<FaultyStore<SqliteStore>, StoreError> {
        let sqlite = SqliteStore::open(path.to_str().unwrap(), SqliteOptions::default())?;
        Ok(FaultyStore::with_faults(sqlite, move |n| {
            script.before_commit(n)
        }))
    }

    /// Commit `n` is about to run: wait at the gate if it is closed, then
    /// fail it if it is the chosen one.
    fn before_commit(&self, n: u64) -> Option<Fault> {
        let mut state = self.state.lock().unwrap();
        state.attempts = n;
        if state.hold_next {
            state.waiting = true;
            self.changed.notify_all();
            let (mut state, timeout) = self
                .changed
                .wait_timeout_while(state, PATIENCE, |s| s.hold_next)
                .unwrap();
            assert!(!timeout.timed_out(), "commit {n} was never released");
            state.waiting = false;
        }
        let from = self.fail_from.load(Ordering::SeqCst);
        (n == self.fail_at.load(Ordering::SeqCst) || (from != 0 && n >= from))
            .then_some(Fault::Failed)
    }

    /// A builder of a receiver with `shards` shards on the clock at
    /// [`t`], whose store is the SQLite file `path` under this script.
    pub(crate) fn builder(self: &Arc<Self>, path: &Path, shards: usize) -> ReceiverBuilder {
        let (p, s) = (path.to_owned(), self.clone());
        Receiver::builder()
            .shards(shards)
            .clock(Arc::new(ManualClock::new(t())) as Arc<dyn Clock>)
            .store_with(move || Script::open(&p, s))
    }

    pub(crate) fn hold_next(&self) {
        self.state.lock().unwrap().hold_next = true;
    }

    /// Blocks until a commit waits at the gate; returns its number.
    fn wait_held(&self) -> u64 {
        let state = self
            .changed
            .wait_timeout_while(self.state.lock().unwrap(), PATIENCE, |s| !s.waiting)
            .unwrap()
            .0;
        assert!(state.waiting, "no commit reached the gate");
        state.attempts
    }

    /// How many commits were attempted so far.
    fn attempts(&self) -> u64 {
        self.state.lock().unwrap().attempts
    }

    pub(crate) fn release(&self) {
        self.state.lock().unwrap().hold_next = false;
        self.changed.notify_all();
    }
}

/// Waits (a blocking wait, off the runtime's thread) until a commit is held
/// at the gate; returns its number.
pub(crate) async fn commit_held(script: &Arc<Script>) -> u64 {
    let script = script.clone();
    tokio::task::spawn_blocking(move || script.wait_held())
        .await
        .unwrap()
}

/// The first `n` object ids `card-N` that [`shard_of`] gives to `shard`.
fn objects_on(shard: usize, shards: usize, n: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("card-{i}"))
        .filter(|id| shard_of(id, shards) == shard)
        .take(n)
        .collect()
}

/// The first object id `card-N` that [`shard_of`] gives to `shard`.
fn object_on(shard: usize, shards: usize) -> String {
    objects_on(shard, shards, 1).remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_fsyncs_the_wal_before_each_acknowledgement_and_a_failed_fsync_answers_retry() {
    let path = temp_db("fsync");
    let (probe, uri) = fsync_vfs::watch(&path);
    let clock = Arc::new(ManualClock::new(t()));
    let open = move || SqliteStore::open(&uri, SqliteOptions::default());
    let rx = Receiver::builder()
        .clock(clock.clone() as Arc<dyn Clock>)
        .object("card-7", 10, r#"{"v":10}"#)
        .store_with(open.clone())
        .build()
        .unwrap();
    // The journal in force: WAL (the mode is kept in the file itself).
    let mode: String = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    // With synchronous=FULL every commit fsyncs the WAL, and the receipt
    // waits for it; NORMAL would fsync it only at checkpoints.
    for v in 11..=13u64 {
        let before = probe.wal_syncs();
        let r = rx
            .deliver(card("card-7", &format!("e-{v}"), v, &format!("{{\"v\":{v}}}")).as_bytes())
            .await;
        assert_eq!(r.decision(), Some(Decision::Applied));
        assert_eq!(
            probe.wal_syncs() - before,
            1,
            "fsyncs of the WAL between the delivery of e-{v} and its receipt"
        );
    }
    // The disk refuses the fsync: the commit fails at that step, the
    // delivery gets retry and nothing of it is recorded.
    probe.fail_wal_syncs(true);
    let e14 = card("card-7", "e-14", 14, r#"{"v":14}"#);
    let r = rx.deliver(e14.as_bytes()).await;
    probe.fail_wal_syncs(false);
    assert_eq!(r.ack(), Ack::Retry);
    match &r.outcome {
        Outcome::Retry(why @ RetryReason::StoreFailed(_)) => {
            let why = error_chain(why);
            assert!(why.contains("disk I/O error"), "{why}");
        }
        other => panic!("{other:?}"),
    }
    assert!(rx.context().registry().get("e-14").is_none());
    assert_eq!(rx.object("card-7").await.unwrap().version, 13);
    assert_eq!(
        count(
            &path,
            "SELECT count(*) FROM receipts WHERE event_id = 'e-14'"
        ),
        0
    );
    // The next attempt is fsynced and acknowledged; a restart finds it.
    let before = probe.wal_syncs();
    assert_eq!(
        rx.deliver(e14.as_bytes()).await.decision(),
        Some(Decision::Applied)
    );
    assert_eq!(probe.wal_syncs() - before, 1);
    rx.shutdown().await;
    drop(rx);
    let rx = Receiver::builder()
        .clock(clock as Arc<dyn Clock>)
        .object("card-7", 10, r#"{"v":10}"#)
        .store_with(open)
        .build()
        .unwrap();
    let o = rx.object("card-7").await.unwrap();
    assert_eq!(
        (o.version, o.state.compact()),
        (14, r#"{"v":14}"#.to_owned())
    );
    assert_eq!(
        count(
            &path,
            "SELECT count(*) FROM receipts WHERE decision = 'applied'"
        ),
        4
    );
    rx.shutdown().await;
}

/// Pauses `object` (a variant of its first event) and holds one more event
/// on it: afterwards it is paused with two held inputs.
async fn pause_with_held(rx: &Receiver, object: &str) {
    let first = card(object, &format!("{object}-e1"), 1, r#"{"n":1}"#);
    let variant = card(object, &format!("{object}-e1"), 1, r#"{"n":"changed"}"#);
    let later = card(object, &format!("{object}-e2"), 2, r#"{"n":2}"#);
    assert_eq!(
        rx.deliver(first.as_bytes()).await.decision(),
        Some(Decision::Applied)
    );
    assert_eq!(
        rx.deliver(variant.as_bytes()).await.decision(),
        Some(Decision::Conflict(ConflictKind::EventVariant))
    );
    assert_eq!(
        rx.deliver(later.as_bytes()).await.decision(),
        Some(Decision::Held(HoldReason::Paused))
    );
    let o = rx.object(object).await.unwrap();
    assert_eq!((o.version, o.paused, o.held), (1, true, 2), "{object}");
}

// A current-thread runtime: the test's task observes the shard tasks only
// between their polls, so once a step's registry record is visible its
// commit has been handed to the committer.
#[tokio::test]
async fn a_failed_group_commit_of_two_shards_rolls_both_back_held_queues_included() {
    let path = temp_db("rollback-shards");
    let script = Arc::new(Script::default());
    let shards = 3;
    let (a, b, c) = (
        object_on(0, shards),
        object_on(1, shards),
        object_on(2, shards),
    );
    let rx = script
        .builder(&path, shards)
        .object(&a, 0, "{}")
        .object(&b, 0, "{}")
        .object(&c, 0, "{}")
        .build()
        .unwrap();
    pause_with_held(&rx, &b).await;
    pause_with_held(&rx, &c).await;
    let unresolved = rx.unresolved().await;
    let audit = rx.audit().await.len();
    let held_rows = count(&path, "SELECT count(*) FROM held");

    // Shard 0's commit is held at the gate; meanwhile shards 1 and 2 each hold
    // one more event and hand their writes to the committer, which puts them
    // into one transaction once the gate opens. That transaction fails.
    script.hold_next();
    let on_a = queue(&rx, card(&a, "a-e1", 1, "{}"));
    let gated = commit_held(&script).await;
    script.fail_at.store(gated + 1, Ordering::SeqCst);
    let on_b = queue(&rx, card(&b, &format!("{b}-e3"), 3, r#"{"n":3}"#));
    let on_c = queue(&rx, card(&c, &format!("{c}-e3"), 3, r#"{"n":3}"#));
    let deadline = Instant::now() + PATIENCE;
    while [&b, &c]
        .iter()
        .any(|o| rx.context().registry().get(&format!("{o}-e3")).is_none())
    {
        assert!(Instant::now() < deadline, "shards 1 and 2 did not decide");
        tokio::task::yield_now().await;
    }
    script.release();
    assert_eq!(on_a.await.decision(), Some(Decision::Applied));
    let failed = RetryReason::StoreFailed(StoreError::Failed(format!(
        "injected failure of commit {}",
        gated + 1
    )));
    // The same commit number: both steps were in the one failed transaction.
    assert_eq!(on_b.await.outcome, Outcome::Retry(failed.clone()));
    assert_eq!(on_c.await.outcome, Outcome::Retry(failed));

    // Both shards are as before the failed batch: held queues, pauses,
    // unresolved inputs, audit and registry; the file has no row of it.
    for o in [&b, &c] {
        let state = rx.object(o).await.unwrap();
        assert_eq!(
            (state.version, state.paused, state.held),
            (1, true, 2),
            "{o}"
        );
        assert!(rx.context().registry().get(&format!("{o}-e3")).is_none());
    }
    assert_eq!(rx.unresolved().await, unresolved);
    assert_eq!(rx.audit().await.len(), audit + 1, "only a-e1's record");
    assert_eq!(count(&path, "SELECT count(*) FROM held"), held_rows);
    // Redelivered, each is held once.
    for o in [&b, &c] {
        let again = card(o, &format!("{o}-e3"), 3, r#"{"n":3}"#);
        assert_eq!(
            rx.deliver(again.as_bytes()).await.decision(),
            Some(Decision::Held(HoldReason::Paused))
        );
        assert_eq!(rx.object(o).await.unwrap().held, 3, "{o}");
    }
    assert_eq!(count(&path, "SELECT count(*) FROM held"), held_rows + 2);
    rx.shutdown().await;
}

// Pipelining: a shard keeps deciding while its group commits; when that
// commit fails, what it decided on top of it is undone and decided again.
// A current-thread runtime, as above.
#[tokio::test]
async fn a_failed_commit_undoes_the_steps_decided_on_top_of_it_and_decides_them_again() {
    let path = temp_db("pipelined-rollback");
    let script = Arc::new(Script::default());
    let rx = script
        .builder(&path, 1)
        .object("card-7", 10, r#"{"v":10}"#)
        .build()
        .unwrap();
    let e1 = card("card-7", "e-1", 11, r#"{"v":11}"#);
    script.hold_next();
    let first = queue(&rx, e1.clone());
    let gated = commit_held(&script).await;
    script.fail_at.store(gated, Ordering::SeqCst);
    // While e-1's group waits at the gate, the shard decides a redelivery of
    // e-1 (a duplicate of the uncommitted first record) and e-2 on top of it.
    let redelivery = queue(&rx, e1);
    let second = queue(&rx, card("card-7", "e-2", 12, r#"{"v":12}"#));
    let deadline = Instant::now() + PATIENCE;
    while rx.context().registry().get("e-2").is_none() {
        assert!(
            Instant::now() < deadline,
            "the shard did not decide while its commit was in flight"
        );
        tokio::task::yield_now().await;
    }
    script.release();
    let failed = RetryReason::StoreFailed(StoreError::Failed(format!(
        "injected failure of commit {gated}"
    )));
    assert_eq!(first.await.outcome, Outcome::Retry(failed));
    // Decided again on the rolled-back state: the redelivery is now the
    // first record of e-1, and e-2 applies on top of it.
    assert_eq!(redelivery.await.decision(), Some(Decision::Applied));
    assert_eq!(second.await.decision(), Some(Decision::Applied));
    let o = rx.object("card-7").await.unwrap();
    assert_eq!(
        (o.version, o.state.compact()),
        (12, r#"{"v":12}"#.to_owned())
    );
    assert_eq!(
        count(
            &path,
            "SELECT count(*) FROM receipts WHERE event_id IN ('e-1', 'e-2') AND decision = 'applied'"
        ),
        2
    );
    assert_eq!(
        count(
            &path,
            "SELECT CAST(version AS INTEGER) FROM objects WHERE object_id = 'card-7'"
        ),
        12
    );
    rx.shutdown().await;
}

// A current-thread runtime, as above.
#[tokio::test]
async fn shutdown_decides_every_delivery_queued_before_the_mailboxes_closed() {
    let path = temp_db("shutdown-drain");
    let script = Arc::new(Script::default());
    // Two objects on each of the two shards.
    let objects: Vec<String> = (0..2).flat_map(|shard| objects_on(shard, 2, 2)).collect();
    let mut builder = script.builder(&path, 2).mailbox_capacity(64);
    for o in &objects {
        builder = builder.object(o, 0, "{}");
    }
    let rx = builder.build().unwrap();
    let event = |o: &String, v: u64| card(o, &format!("{o}-e{v}"), v, &format!("{{\"v\":{v}}}"));

    // A first burst is queued; the first commit it causes waits at the gate.
    script.hold_next();
    let mut pending: Vec<(String, Pending)> = Vec::new();
    for v in 1..=5 {
        for o in &objects {
            pending.push((format!("{o}-e{v}"), queue(&rx, event(o, v))));
        }
    }
    commit_held(&script).await;
    // Shut down without awaiting anything: the shutdown request goes into
    // every mailbox behind the first burst ...
    let mut shutdown = Box::pin(rx.shutdown());
    assert!((&mut shutdown).now_or_never().is_none());
    // ... and a second burst behind it, before any shard saw the request.
    for v in 6..=10 {
        for o in &objects {
            pending.push((format!("{o}-e{v}"), queue(&rx, event(o, v))));
        }
    }
    script.release();
    shutdown.await;
    // Every queued delivery was decided (each object's events in order: all
    // applied) and recorded; none is lost.
    let mut decided = BTreeMap::new();
    for (id, receipt) in pending {
        let r = receipt.await;
        decided.insert(id, r.outcome);
    }
    let wrong: Vec<_> = decided
        .iter()
        .filter(|(_, o)| **o != Outcome::Decided(Decision::Applied))
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of 40 not applied: {wrong:?}",
        wrong.len()
    );
    // After the shutdown: retry.
    let late = rx.deliver(event(&objects[0], 11).as_bytes()).await;
    assert_eq!(late.outcome, Outcome::Retry(RetryReason::ShuttingDown));
    drop(rx);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let mut st = conn
        .prepare("SELECT event_id, decision FROM receipts")
        .unwrap();
    let stored: BTreeMap<String, String> = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let expected: BTreeMap<String, String> = decided
        .keys()
        .map(|id| (id.clone(), "applied".to_owned()))
        .collect();
    assert_eq!(stored, expected);
    assert_eq!(
        count(
            &path,
            "SELECT count(*) FROM objects WHERE version = '00000000000000000010'"
        ),
        4
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_resumes_parked_and_malformed_inputs() {
    let path = temp_db("restart-parked");
    let location = format!("sqlite:{}", path.display());
    let clock = Arc::new(ManualClock::new(t()));
    let build = || {
        Receiver::builder()
            .clock(clock.clone() as Arc<dyn Clock>)
            .object("card-7", 10, "{}")
            .store(&location)
            .build()
            .unwrap()
    };
    let parked = card("card-9", "e-9", 1, r#"{"stage":"ready"}"#);
    let duplicate_key =
        r#"{"event_id":"e-m","object_id":"card-7","type":"card.snapshot","type":"x"}"#;
    let not_json = "{\"event_id\": \"e-n\"";
    let rx = build();
    assert_eq!(
        rx.deliver(parked.as_bytes()).await.decision(),
        Some(Decision::Held(HoldReason::UnknownObject))
    );
    for malformed in [duplicate_key, not_json] {
        assert_eq!(
            rx.deliver(malformed.as_bytes()).await.decision(),
            Some(Decision::Held(HoldReason::Malformed))
        );
    }
    let listed = |u: &[snapshot_receiver::core::UnresolvedInput]| -> Vec<(Option<String>, Option<String>, &'static str)> {
        u.iter()
            .map(|u| {
                (
                    u.event_id.as_deref().map(str::to_owned),
                    u.object_id.as_deref().map(str::to_owned),
                    u.reason(),
                )
            })
            .collect()
    };
    let expected = vec![
        (
            Some("e-9".to_owned()),
            Some("card-9".to_owned()),
            "unknown_object",
        ),
        (None, None, "malformed"),
        (None, None, "malformed"),
    ];
    assert_eq!(listed(&rx.unresolved().await), expected);
    rx.shutdown().await;
    drop(rx);

    // The restarted receiver lists the same inputs ...
    let rx = build();
    assert_eq!(listed(&rx.unresolved().await), expected);
    // ... a malformed body again is a duplicate of its hold (known by the
    // digest of its bytes, also after the restart), held no second time ...
    assert_eq!(
        rx.deliver(duplicate_key.as_bytes()).await.decision(),
        Some(Decision::Duplicate {
            original: snapshot_receiver::Verdict::Held(HoldReason::Malformed)
        })
    );
    // ... and the parked event is decided when an authority introduces card-9.
    let report = rx
        .reconcile(AuthoritativeSnapshot::new("card-9", 0, "{}", t()).unwrap())
        .await
        .unwrap();
    assert_eq!(report.reevaluated.len(), 1, "{report:?}");
    let o = rx.object("card-9").await.unwrap();
    assert_eq!(
        (o.version, o.state.compact()),
        (1, r#"{"stage":"ready"}"#.to_owned())
    );
    assert_eq!(
        listed(&rx.unresolved().await),
        [(None, None, "malformed"), (None, None, "malformed")]
    );
    rx.shutdown().await;
}

/// Two shards, `first` on shard 0 with `e-1` applied, and a variant of
/// `e-1` naming `other` (shard 1) whose commit waits at the gate while the
/// receiver shuts down and shard 0, with nothing to do, reaches the end of
/// its mailbox. Its commit, once released, pauses `first` on shard 0.
/// Returns the variant's outcome and `first`'s and `other`'s paused flags
/// in the store after the shutdown.
async fn variant_pausing_a_shard_that_is_shutting_down(
    name: &str,
    script: &Arc<Script>,
    before_release: impl FnOnce(u64),
) -> (Outcome, (i64, i64)) {
    let path = temp_db(name);
    let (first, other) = (object_on(0, 2), object_on(1, 2));
    let rx = script
        .builder(&path, 2)
        .object(&first, 1, "{}")
        .object(&other, 1, "{}")
        .build()
        .unwrap();
    let e1 = card(&first, "e-1", 2, r#"{"n":1}"#);
    assert_eq!(
        rx.deliver(e1.as_bytes()).await.decision(),
        Some(Decision::Applied)
    );
    script.hold_next();
    let variant = queue(&rx, card(&other, "e-1", 2, r#"{"n":1}"#));
    let gated = commit_held(script).await;
    let mut shutdown = Box::pin(rx.shutdown());
    assert!((&mut shutdown).now_or_never().is_none());
    tokio::time::sleep(Duration::from_millis(200)).await;
    before_release(gated);
    script.release();
    shutdown.await;
    let outcome = variant.await.outcome;
    let paused = |id: &str| {
        count(
            &path,
            &format!("SELECT paused FROM objects WHERE object_id = '{id}'"),
        )
    };
    (outcome, (paused(&first), paused(&other)))
}

const VARIANT: Outcome = Outcome::Decided(Decision::Conflict(ConflictKind::EventVariant));

// A current-thread runtime, as above.
#[tokio::test]
async fn a_pause_raised_while_another_shard_shuts_down_is_still_recorded() {
    let script = Arc::new(Script::default());
    let result = variant_pausing_a_shard_that_is_shutting_down("late-pause", &script, |_| {}).await;
    assert_eq!(
        result,
        (VARIANT, (1, 1)),
        "both objects of the variant are paused in the store"
    );
}

// A current-thread runtime, as above.
#[tokio::test]
async fn at_shutdown_a_pause_the_store_keeps_refusing_is_tried_three_times_then_given_up() {
    let script = Arc::new(Script::default());
    let s = script.clone();
    let variant_commit = Arc::new(AtomicU64::new(0));
    let v = variant_commit.clone();
    // Every commit after the variant's fails. The pause of the first
    // record's object committed with the variant; shard 0 then writes the
    // flag again with its memory's pause: that write is tried, put back,
    // tried again, and given up after three tries (the failed pause waits
    // in the inbox between tries, it is not sent straight back to the
    // store), and the store still holds the object paused.
    let result = variant_pausing_a_shard_that_is_shutting_down("refused-pause", &script, |gated| {
        v.store(gated, Ordering::SeqCst);
        s.fail_from.store(gated + 1, Ordering::SeqCst);
    })
    .await;
    assert_eq!(result, (VARIANT, (1, 1)));
    assert_eq!(
        script.attempts() - variant_commit.load(Ordering::SeqCst),
        3,
        "tries of the pause after the variant's commit"
    );
}

// A current-thread runtime, as above.
#[tokio::test]
async fn a_shard_decides_at_most_256_deliveries_on_top_of_the_group_in_the_store() {
    let path = temp_db("group-bound");
    let script = Arc::new(Script::default());
    let rx = script
        .builder(&path, 1)
        .object("card-1", 0, "{}")
        .build()
        .unwrap();
    let event = |v: u64| card("card-1", &format!("e-{v}"), v, &format!("{{\"v\":{v}}}"));
    // The first delivery's commit waits at the gate while 600 more queue
    // up, a hundred at a time (tokio's cooperative budget lets one poll of
    // the test send about 128), with the shard task running in between.
    script.hold_next();
    let mut pending = vec![queue(&rx, event(1))];
    commit_held(&script).await;
    for hundred in 0..6 {
        pending.extend((2..=101).map(|v| queue(&rx, event(hundred * 100 + v))));
        tokio::task::yield_now().await;
    }
    script.release();
    for receipt in pending {
        assert_eq!(receipt.await.outcome, Outcome::Decided(Decision::Applied));
    }
    // The group decided on top of the held one was cut at one shard step
    // batch of 256.
    let groups = rx.store_stats().unwrap().deliveries_per_commit();
    assert_eq!(groups.max, 256);
    rx.shutdown().await;
}
