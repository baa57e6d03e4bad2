//! The relay's loop, driven with plain calls: every rule of
//! [`RelayDriver`] a test, no store, no clock, no runtime.

use super::*;
use crate::envelope::StateJson;
use std::cell::RefCell;
use std::collections::HashMap;
use std::time::UNIX_EPOCH;

thread_local! {
    /// The effects the test parked, by position: the test's store, which
    /// [`read`] reads parked states back from.
    static STORE: RefCell<HashMap<u64, Effect>> = RefCell::new(HashMap::new());
}

/// The test's wall clock: `secs` after an epoch.
fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_000_000 + secs)
}

fn effect(position: u64, object: &str, version: u64) -> Effect {
    Effect {
        position,
        id: EffectId {
            origin: 7,
            seq: position * 10,
        },
        at: at(0),
        object_id: Arc::from(object),
        version,
        state: StateJson::trusted(format!(r#"{{"v":{version}}}"#)),
        cause_event: None,
        replaces: Vec::new(),
        trace: None,
    }
}

/// An effect whose state is `bytes` bytes long.
fn sized(position: u64, object: &str, bytes: usize) -> Effect {
    let pad = "x".repeat(bytes - r#"{"p":""}"#.len());
    Effect {
        state: StateJson::trusted(format!(r#"{{"p":"{pad}"}}"#)),
        ..effect(position, object, position)
    }
}

fn settings() -> RelaySettings {
    RelaySettings {
        batch: 10,
        concurrency: 4,
        poll_interval: Duration::from_millis(50),
        schedule: vec![Duration::from_secs(10), Duration::from_secs(60)],
        lease: Duration::from_secs(30),
        coalesce: false,
        seed: 42,
        save_every: Duration::ZERO,
        memory: 1 << 20,
    }
}

fn row(position: u64) -> RelayRow {
    RelayRow {
        name: "app".to_owned(),
        position,
        generation: 3,
        owner: Some("run-1".to_owned()),
        lease_until: Some(at(30)),
        updated: at(0),
        backlogged_since: None,
        parked_bytes: None,
    }
}

/// A save moving the cursor to `position`, nothing parked or unparked,
/// not backlogged.
fn to(position: u64) -> RelaySave {
    RelaySave {
        position,
        ..RelaySave::default()
    }
}

/// `e` parked as `status`: its head, its effect kept in the test's store.
fn parked(e: Effect, status: ParkedStatus, attempts: u32, due: Option<SystemTime>) -> ParkedEffect {
    let head = e.head();
    STORE.with(|s| s.borrow_mut().insert(e.position, e));
    ParkedEffect {
        effect: head,
        status,
        attempts,
        due,
        error: None,
        updated: at(0),
    }
}

/// A driver that opened its row at `row(position)` with `parked`, at 0 s,
/// measured (nothing to report) and is about to read.
fn opened(settings: RelaySettings, position: u64, parked: Vec<ParkedEffect>) -> RelayDriver {
    let mut d = RelayDriver::new("run-1", settings, at(0));
    assert!(matches!(d.next(at(0)), Next::Open { lease } if lease == Duration::from_secs(30)));
    d.opened(Ok::<_, String>((row(position), parked)), at(0));
    assert!(matches!(d.next(at(0)), Next::Measure { after } if after == position));
    d.measured(Ok::<_, String>((position, None)), at(0));
    d
}

/// Expects a read after `after` at `now`, reports the parked effects it
/// names from the test's store and `effects` as new (`effects` must be
/// empty when it asks for none); returns the parked positions it named.
fn read(d: &mut RelayDriver, now: SystemTime, after: u64, effects: Vec<Effect>) -> Vec<u64> {
    let named = match d.next(now) {
        Next::Read {
            parked,
            after: a,
            limit,
            ..
        } => {
            assert_eq!(a, after);
            assert!(
                effects.len() <= limit,
                "{} new for a limit of {limit}",
                effects.len()
            );
            parked
        }
        other => panic!("expected a read after {after}, got {other:?}"),
    };
    let parked = STORE.with(|s| {
        let mut s = s.borrow_mut();
        for e in &effects {
            s.insert(e.position, e.clone());
        }
        named.iter().filter_map(|p| s.get(p).cloned()).collect()
    });
    d.read(
        Ok::<_, String>(RoundRead {
            parked,
            new: effects,
        }),
        now,
    );
    named
}

/// Expects a send at `now`: (chain, position).
fn send(d: &mut RelayDriver, now: SystemTime) -> (usize, u64) {
    match d.next(now) {
        Next::Send { chain, effect } => (chain, effect.position),
        other => panic!("expected a send, got {other:?}"),
    }
}

/// Expects a save of `kind` at `now`; returns it.
fn save(d: &mut RelayDriver, now: SystemTime, kind: SaveKind) -> (RelaySave, Duration) {
    match d.next(now) {
        Next::Save {
            kind: k,
            generation,
            save,
            lease,
        } => {
            assert_eq!((k, generation), (kind, 3));
            (save, lease)
        }
        other => panic!("expected a {kind:?} save, got {other:?}"),
    }
}

fn wait(d: &mut RelayDriver, now: SystemTime) -> (Option<Duration>, bool) {
    match d.next(now) {
        Next::Wait { wait, answers } => (wait, answers),
        other => panic!("expected a wait, got {other:?}"),
    }
}

#[test]
fn a_run_waits_while_another_holds_the_lease_then_opens() {
    let mut d = RelayDriver::new("run-1", settings(), at(0));
    assert!(matches!(d.next(at(0)), Next::Open { .. }));
    let mut theirs = row(0);
    theirs.owner = Some("run-0".to_owned());
    d.opened(Ok::<_, String>((theirs, Vec::new())), at(0));
    assert!(matches!(
        d.notices().collect::<Vec<_>>().as_slice(),
        [Notice::Held { owner: Some(o) }] if o == "run-0"
    ));
    // A quarter of the lease, at most 1 s.
    assert_eq!(wait(&mut d, at(0)), (Some(Duration::from_secs(1)), false));
    assert!(matches!(d.next(at(1)), Next::Open { .. }));
    d.opened(Err("disk full"), at(1));
    assert!(matches!(d.notices().next(), Some(Notice::OpenFailed(e)) if e == "disk full"));
    assert_eq!(wait(&mut d, at(1)), (Some(STORE_RETRY), false));
}

#[test]
fn an_idle_relay_polls_or_waits_for_its_next_due_effect() {
    let mut d = opened(settings(), 4, Vec::new());
    read(&mut d, at(1), 4, Vec::new());
    assert_eq!(
        wait(&mut d, at(1)),
        (Some(Duration::from_millis(50)), false)
    );
    // A parked effect due sooner than the poll interval: woken for it.
    let due = at(1) + Duration::from_millis(20);
    let p = parked(effect(3, "a", 1), ParkedStatus::Retrying, 1, Some(due));
    let mut d = opened(settings(), 4, vec![p]);
    read(&mut d, at(1), 4, Vec::new());
    assert_eq!(
        wait(&mut d, at(1)),
        (Some(Duration::from_millis(20)), false)
    );
    read(&mut d, due, 4, Vec::new());
    assert_eq!(send(&mut d, due), (0, 3));
}

#[test]
fn objects_go_in_parallel_each_in_order_up_to_the_concurrency() {
    let mut d = opened(
        RelaySettings {
            concurrency: 2,
            ..settings()
        },
        0,
        Vec::new(),
    );
    read(
        &mut d,
        at(1),
        0,
        vec![
            effect(1, "a", 1),
            effect(2, "b", 1),
            effect(3, "a", 2),
            effect(4, "c", 1),
        ],
    );
    assert_eq!(send(&mut d, at(1)), (0, 1));
    assert_eq!(send(&mut d, at(1)), (1, 2));
    // Two objects out: "c" waits, and "a"'s version 2 waits for version 1.
    assert_eq!(wait(&mut d, at(1)), (Some(Duration::from_secs(9)), true));
    d.answered(0, Ok(()));
    assert_eq!(send(&mut d, at(1)), (0, 3));
    d.answered(1, Ok(()));
    assert_eq!(send(&mut d, at(1)), (2, 4));
    d.answered(0, Ok(()));
    d.answered(2, Ok(()));
    let (s, lease) = save(&mut d, at(2), SaveKind::Round);
    assert_eq!((s.position, s.park.len(), s.unpark.len()), (4, 0, 0));
    assert_eq!(lease, Duration::from_secs(30));
    d.saved(Ok::<_, String>(true), at(2));
    assert_eq!((d.progress().delivered, d.progress().attempts), (4, 4));
    assert!(matches!(d.next(at(2)), Next::Measure { after: 4 }));
    assert_eq!(d.progress().position, 0, "moves with the measure");
    d.measured(Ok::<_, String>((6, None)), at(2));
    assert_eq!((d.progress().position, d.progress().last), (4, 6));
}

#[test]
fn a_refused_effect_is_parked_with_its_object_behind_it_and_the_others_go_on() {
    let mut d = opened(settings(), 0, Vec::new());
    read(
        &mut d,
        at(1),
        0,
        vec![effect(1, "a", 1), effect(2, "a", 2), effect(3, "b", 1)],
    );
    assert_eq!(send(&mut d, at(1)), (0, 1));
    assert_eq!(send(&mut d, at(1)), (1, 3));
    d.answered(0, Err(HandlerError::new("503")));
    d.answered(1, Ok(()));
    let (s, _) = save(&mut d, at(2), SaveKind::Round);
    let parked: Vec<(u64, ParkedStatus, u32)> = s
        .park
        .iter()
        .map(|p| (p.effect.position, p.status, p.attempts))
        .collect();
    assert_eq!(
        parked,
        [
            (1, ParkedStatus::Retrying, 1),
            (2, ParkedStatus::Waiting, 0)
        ]
    );
    assert_eq!(s.position, 3);
    let expected = Jitter::new(42).wait(Duration::from_secs(10), None);
    assert_eq!(s.park[0].due, Some(at(2) + expected));
    d.saved(Ok::<_, String>(true), at(2));
    assert!(matches!(d.notices().next(), Some(Notice::Refused(p)) if p.effect.position == 1));
    assert!(matches!(d.next(at(2)), Next::Measure { after: 3 }));
    d.measured(Ok::<_, String>((3, None)), at(2));
    assert_eq!((d.progress().parked, d.progress().refusals), (2, 1));
    assert_eq!(d.oldest(), Some(at(0)), "the parked effect's time");
}

#[test]
fn an_effect_refused_past_its_schedule_is_parked_failed_and_blocks_its_object() {
    let p = parked(effect(1, "a", 1), ParkedStatus::Retrying, 2, Some(at(0)));
    let mut d = opened(settings(), 1, vec![p]);
    read(&mut d, at(1), 1, vec![effect(2, "a", 2)]);
    assert_eq!(send(&mut d, at(1)), (0, 1));
    d.answered(0, Err(HandlerError::new("410")));
    let (s, _) = save(&mut d, at(2), SaveKind::Round);
    assert_eq!(
        (s.park[0].effect.position, s.park[0].status, s.park[0].due),
        (1, ParkedStatus::Failed, None)
    );
    d.saved(Ok::<_, String>(true), at(2));
    // Failed: nothing of "a" goes again until an operator acts.
    assert!(matches!(d.next(at(3)), Next::Measure { .. }));
    d.measured(Ok::<_, String>((2, None)), at(3));
    assert_eq!(d.progress().failed, 1);
    read(&mut d, at(3), 2, Vec::new());
    assert_eq!(
        wait(&mut d, at(3)),
        (Some(Duration::from_millis(50)), false)
    );
}

/// D1: a destination's `Retry-After` shorter than the schedule's step does
/// not shorten the wait (the longer wins); a longer one lengthens it.
#[test]
fn a_retry_after_shorter_than_the_step_does_not_shorten_the_wait() {
    let jittered = Jitter::new(42).wait(Duration::from_secs(10), None);
    assert!(jittered >= Duration::from_secs(8), "{jittered:?}");
    for (retry_after, expected) in [
        (Duration::from_secs(1), jittered),
        (Duration::from_secs(40), Duration::from_secs(40)),
    ] {
        let mut d = opened(settings(), 0, Vec::new());
        read(&mut d, at(1), 0, vec![effect(1, "a", 1)]);
        assert_eq!(send(&mut d, at(1)), (0, 1));
        d.answered(0, Err(HandlerError::new("429").retry_after(retry_after)));
        let (s, _) = save(&mut d, at(2), SaveKind::Round);
        assert_eq!(
            s.park[0].due,
            Some(at(2) + expected),
            "Retry-After {retry_after:?}"
        );
    }
}

/// C: every retry wait is the step times 0.8 to 1.2, reproducible from the
/// seed, spread over the range, and never above the longest wait.
#[test]
fn retry_waits_are_jittered_within_a_fifth_of_the_step_from_the_seed() {
    let step = Duration::from_secs(100);
    let draws: Vec<Duration> = {
        let mut j = Jitter::new(7);
        (0..2000).map(|_| j.wait(step, None)).collect()
    };
    let mut again = Jitter::new(7);
    assert!(
        draws.iter().all(|w| *w == again.wait(step, None)),
        "not reproducible"
    );
    let (lo, hi) = (draws.iter().min().unwrap(), draws.iter().max().unwrap());
    assert!(
        *lo >= Duration::from_secs(80) && *hi <= Duration::from_secs(120),
        "{lo:?}..{hi:?}"
    );
    assert!(
        *lo < Duration::from_secs(82) && *hi > Duration::from_secs(118),
        "not spread over the range: {lo:?}..{hi:?}"
    );
    let mut j = Jitter::new(7);
    assert!((0..100).all(|_| j.wait(MAX_WAIT, None) <= MAX_WAIT));
    assert_eq!(j.wait(Duration::from_secs(1), Some(MAX_WAIT * 2)), MAX_WAIT);
}

/// D2: a `waiting` effect at the head of its object's queue (the state
/// after an operator skipped the refused one before it) starts its chain.
#[test]
fn a_waiting_effect_at_the_head_of_its_object_goes() {
    let p = parked(effect(2, "a", 2), ParkedStatus::Waiting, 0, None);
    let mut d = opened(settings(), 2, vec![p]);
    read(&mut d, at(1), 2, Vec::new());
    assert_eq!(send(&mut d, at(1)), (0, 2));
    d.answered(0, Ok(()));
    let (s, _) = save(&mut d, at(1), SaveKind::Round);
    assert_eq!((s.unpark.as_slice(), s.park.len()), (&[2][..], 0));
}

/// D3: a round longer than the lease renews it every third of the lease
/// (from the last renewal), so no other run takes the relay over.
#[test]
fn a_long_round_renews_the_lease_every_third_of_it() {
    let mut d = opened(settings(), 0, Vec::new());
    read(&mut d, at(0), 0, vec![effect(1, "a", 1)]);
    assert_eq!(send(&mut d, at(0)), (0, 1));
    assert_eq!(wait(&mut d, at(9)), (Some(Duration::from_secs(1)), true));
    for renewal in [10, 20, 30, 40] {
        let (s, lease) = save(&mut d, at(renewal), SaveKind::Renewal);
        assert_eq!(
            (s.position, s.park.len(), lease),
            (0, 0, Duration::from_secs(30))
        );
        // An answer meanwhile is taken; the next store call waits.
        assert_eq!(wait(&mut d, at(renewal)), (None, true));
        d.saved(Ok::<_, String>(true), at(renewal));
        assert_eq!(
            wait(&mut d, at(renewal + 5)),
            (Some(Duration::from_secs(5)), true)
        );
    }
    d.answered(0, Ok(()));
    let (s, _) = save(&mut d, at(41), SaveKind::Round);
    assert_eq!(s.position, 1);
    // A refused renewal is noted; the round's save finds out.
    let mut d = opened(settings(), 0, Vec::new());
    read(&mut d, at(0), 0, vec![effect(1, "a", 1)]);
    send(&mut d, at(0));
    save(&mut d, at(10), SaveKind::Renewal);
    d.saved(Ok::<_, String>(false), at(10));
    assert!(matches!(d.notices().next(), Some(Notice::RenewalOvertaken)));
}

/// An idle relay whose lease is a third old saves (renewing it) instead
/// of waiting.
#[test]
fn an_idle_relay_renews_its_lease_every_third_of_it() {
    let mut d = opened(settings(), 5, Vec::new());
    read(&mut d, at(9), 5, Vec::new());
    assert!(matches!(wait(&mut d, at(9)), (Some(_), false)));
    read(&mut d, at(10), 5, Vec::new());
    let (s, _) = save(&mut d, at(10), SaveKind::Round);
    assert_eq!((s.position, s.park.len()), (5, 0));
}

/// D4 (the plan's side of a rewind): an effect read again that is still
/// parked goes with its parked state, never a second time as new.
#[test]
fn an_effect_read_again_while_parked_goes_once() {
    let p = parked(effect(2, "a", 2), ParkedStatus::Waiting, 0, None);
    let mut d = opened(settings(), 1, vec![p]);
    read(&mut d, at(1), 1, vec![effect(2, "a", 2), effect(3, "a", 3)]);
    assert_eq!(send(&mut d, at(1)), (0, 2));
    d.answered(0, Ok(()));
    assert_eq!(send(&mut d, at(1)), (0, 3));
    d.answered(0, Ok(()));
    let (s, _) = save(&mut d, at(1), SaveKind::Round);
    assert_eq!((s.unpark.as_slice(), s.position), (&[2][..], 3));
    assert_eq!(d.progress().attempts, 2);
}

#[test]
fn effects_the_outbox_no_longer_keeps_are_counted_missed() {
    let mut d = opened(settings(), 5, Vec::new());
    read(
        &mut d,
        at(1),
        5,
        vec![effect(9, "a", 1), effect(10, "a", 2)],
    );
    assert_eq!(d.progress().missed, 3);
    assert!(matches!(
        d.notices().next(),
        Some(Notice::Missed {
            after: 5,
            missed: 3
        })
    ));
    // No jump, nothing counted.
    let mut d = opened(settings(), 5, Vec::new());
    read(&mut d, at(1), 5, vec![effect(6, "a", 1)]);
    assert_eq!(d.progress().missed, 0);
    let notices: Vec<Notice> = d.notices().collect();
    assert!(notices.is_empty(), "{notices:?}");
}

#[test]
fn a_refused_or_failed_save_reads_the_state_again_and_hands_the_round_out_again() {
    for (result, reopen_at) in [(Ok(false), at(2)), (Err("lost"), at(2) + STORE_RETRY)] {
        let mut d = opened(settings(), 0, Vec::new());
        read(&mut d, at(1), 0, vec![effect(1, "a", 1)]);
        send(&mut d, at(1));
        d.answered(0, Ok(()));
        save(&mut d, at(2), SaveKind::Round);
        d.saved(result, at(2));
        assert_eq!(d.generation(), None, "{result:?}: the state is not kept");
        if reopen_at > at(2) {
            assert_eq!(wait(&mut d, at(2)), (Some(STORE_RETRY), false));
        }
        assert!(matches!(d.next(reopen_at), Next::Open { .. }));
        d.opened(Ok::<_, String>((row(0), Vec::new())), reopen_at);
        assert!(matches!(d.next(reopen_at), Next::Measure { after: 0 }));
        d.measured(Ok::<_, String>((1, None)), reopen_at);
        read(&mut d, reopen_at, 0, vec![effect(1, "a", 1)]);
        assert_eq!(send(&mut d, reopen_at), (0, 1));
    }
}

#[test]
fn a_stopped_relay_finishes_its_round_saves_it_and_lets_its_lease_go() {
    let mut d = opened(settings(), 0, Vec::new());
    read(&mut d, at(1), 0, vec![effect(1, "a", 1)]);
    send(&mut d, at(1));
    d.stop();
    d.answered(0, Ok(()));
    let (s, _) = save(&mut d, at(2), SaveKind::Round);
    assert_eq!(s.position, 1);
    d.saved(Ok::<_, String>(true), at(2));
    let (s, lease) = save(&mut d, at(2), SaveKind::Release);
    assert_eq!((s.position, lease), (1, Duration::ZERO));
    d.saved(Ok::<_, String>(true), at(2));
    assert!(matches!(d.next(at(2)), Next::Stop));
    // Stopped between rounds: the lease goes at once; before it was held,
    // there is nothing to let go.
    let mut d = opened(settings(), 4, Vec::new());
    d.stop();
    assert!(matches!(
        d.next(at(1)),
        Next::Save {
            kind: SaveKind::Release,
            ..
        }
    ));
    let mut d = RelayDriver::new("run-1", settings(), at(0));
    d.stop();
    assert!(matches!(d.next(at(0)), Next::Stop));
}

#[test]
fn a_coalescing_relay_sends_an_objects_newest_effect_for_the_others() {
    let mut d = opened(
        RelaySettings {
            coalesce: true,
            ..settings()
        },
        0,
        Vec::new(),
    );
    read(
        &mut d,
        at(1),
        0,
        vec![effect(1, "a", 1), effect(2, "a", 2), effect(3, "a", 3)],
    );
    match d.next(at(1)) {
        Next::Send { chain: 0, effect } => {
            assert_eq!(effect.position, 3);
            let replaced: Vec<u64> = effect.replaces.iter().map(|r| r.position).collect();
            assert_eq!(replaced, [1, 2]);
        }
        other => panic!("expected one coalesced send, got {other:?}"),
    }
    d.answered(0, Ok(()));
    let (s, _) = save(&mut d, at(1), SaveKind::Round);
    assert_eq!(s.position, 3);
    let p = d.progress();
    assert_eq!((p.delivered, p.coalesced, p.attempts), (3, 2, 1));
    assert!(matches!(d.notices().next(), Some(Notice::Coalesced(2))));
}

#[test]
fn a_long_catch_up_logs_when_it_starts_every_interval_and_when_it_is_done() {
    let mut c = CatchUp::new(256);
    // Less than CATCH_UP_EFFECTS behind: nothing.
    assert_eq!(c.observe(at(0), 0, CATCH_UP_EFFECTS - 1), None);
    assert_eq!(
        c.observe(at(1), 0, 5000),
        Some(CatchUpLine::Started {
            position: 0,
            last: 5000
        })
    );
    // Within the interval: nothing.
    assert_eq!(c.observe(at(5), 1000, 5000), None);
    // An interval after the first line: the rate since it.
    assert_eq!(
        c.observe(at(1) + CATCH_UP_EVERY, 2000, 5000),
        Some(CatchUpLine::Progress {
            position: 2000,
            last: 5000,
            rate: 200.0
        })
    );
    assert_eq!(c.observe(at(12), 2500, 5000), None);
    // Under CATCH_UP_EFFECTS behind, but not within a batch: not yet.
    assert_eq!(c.observe(at(13), 4500, 5200), None);
    assert_eq!(
        c.observe(at(31), 5000, 5200),
        Some(CatchUpLine::Done {
            passed: 5000,
            took: Duration::from_secs(30)
        })
    );
    // Caught up, it stays quiet.
    assert_eq!(c.observe(at(45), 5200, 5200), None);
}

/// Issue 48 item 1: a parked effect is kept as its head; its state is read
/// back only when it is due (a retrying effect not yet due, or a failed
/// one, is not read), and its object's chain starts with it.
#[test]
fn a_parked_effect_keeps_its_head_and_its_state_is_read_back_when_due() {
    let retrying = parked(sized(1, "a", 5000), ParkedStatus::Retrying, 1, Some(at(10)));
    let failed = parked(effect(2, "b", 2), ParkedStatus::Failed, 3, None);
    let behind = parked(effect(3, "a", 3), ParkedStatus::Waiting, 0, None);
    assert_eq!(retrying.effect.bytes, 5000);
    assert_eq!(
        retrying.memory_bytes(),
        PARKED_OVERHEAD + 1,
        "a head: its object id, not its 5000-byte state"
    );
    let mut d = opened(settings(), 3, vec![retrying, failed, behind]);
    assert_eq!(
        d.memory_bytes(),
        3 * (PARKED_OVERHEAD + 1),
        "three heads, no state"
    );
    // Not due yet: nothing read back; "a"'s new effect waits behind.
    assert_eq!(
        read(&mut d, at(5), 3, vec![effect(4, "a", 4)]),
        Vec::<u64>::new()
    );
    let (s, _) = save(&mut d, at(5), SaveKind::Round);
    assert_eq!(
        s.park
            .iter()
            .map(|p| (p.effect.position, p.status))
            .collect::<Vec<_>>(),
        [(4, ParkedStatus::Waiting)]
    );
    d.saved(Ok::<_, String>(true), at(5));
    d.next(at(5));
    d.measured(Ok::<_, String>((4, None)), at(5));
    // Due: its state and those parked behind it are read back, in
    // position order; the failed one stays unread.
    assert_eq!(read(&mut d, at(10), 4, Vec::new()), [1, 3, 4]);
    assert_eq!(
        d.memory_bytes(),
        4 * (PARKED_OVERHEAD + 1) + 5000 + 2 * r#"{"v":3}"#.len(),
        "the round in hand counts its states"
    );
    assert_eq!(send(&mut d, at(10)), (0, 1));
    assert_eq!(
        d.memory_bytes(),
        4 * (PARKED_OVERHEAD + 1) + 5000 + 2 * 7 + 5000,
        "a state with the destination counts again"
    );
    d.answered(0, Ok(()));
    assert_eq!(send(&mut d, at(10)), (0, 3));
    d.answered(0, Ok(()));
    assert_eq!(send(&mut d, at(10)), (0, 4));
    d.answered(0, Ok(()));
    let (s, _) = save(&mut d, at(10), SaveKind::Round);
    assert_eq!(s.unpark, [1, 3, 4]);
    d.saved(Ok::<_, String>(true), at(10));
    assert_eq!(
        d.memory_bytes(),
        PARKED_OVERHEAD + 1,
        "the failed head alone once the round is saved"
    );
}

/// Issue 48 item 1: a round reads new effects within a quarter of the
/// relay's memory (its states count twice while with the destination; the rest of it after the parked states it reads back), at
/// least one; parked states read back stop at the first that does not
/// fit (at least one), and the new effects of an object whose parked
/// effect was left for the next round wait behind it.
#[test]
fn a_round_reads_states_within_a_quarter_of_the_relays_memory() {
    let small = RelaySettings {
        memory: 40_000,
        ..settings()
    };
    assert_eq!(
        (small.parked_ceiling(), small.round_bytes()),
        (20_000, 10_000)
    );
    let mut d = opened(small.clone(), 0, Vec::new());
    match d.next(at(1)) {
        Next::Read {
            parked,
            limit,
            max_bytes,
            ..
        } => assert_eq!((parked.len(), limit, max_bytes), (0, 10, 10_000)),
        other => panic!("{other:?}"),
    }
    // Parked states of 4000 bytes each: two fit the round's 10,000 bytes,
    // the third does not; 2,000 bytes are left for new effects.
    let heads = vec![
        parked(sized(1, "a", 4000), ParkedStatus::Waiting, 0, None),
        parked(sized(2, "b", 4000), ParkedStatus::Waiting, 0, None),
        parked(sized(3, "c", 4000), ParkedStatus::Waiting, 0, None),
    ];
    let mut d = opened(small.clone(), 3, heads);
    let asked = match d.next(at(1)) {
        Next::Read {
            parked,
            limit,
            max_bytes,
            ..
        } => {
            assert_eq!((limit, max_bytes), (10, 2000));
            parked
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(asked, [1, 2]);
    let loaded = STORE.with(|s| asked.iter().map(|p| s.borrow()[p].clone()).collect());
    d.read(
        Ok::<_, String>(RoundRead {
            parked: loaded,
            new: vec![effect(4, "c", 4), effect(5, "d", 1)],
        }),
        at(1),
    );
    assert_eq!(send(&mut d, at(1)), (0, 1));
    assert_eq!(send(&mut d, at(1)), (1, 2));
    assert_eq!(send(&mut d, at(1)), (2, 5), "\"d\" goes; \"c\" waits");
    for chain in 0..3 {
        d.answered(chain, Ok(()));
    }
    let (s, _) = save(&mut d, at(1), SaveKind::Round);
    assert_eq!((s.unpark.as_slice(), s.position), (&[1, 2][..], 5));
    assert_eq!(
        s.park
            .iter()
            .map(|p| (p.effect.position, p.status))
            .collect::<Vec<_>>(),
        [(4, ParkedStatus::Waiting)]
    );
    // One parked state larger than the whole round still goes, alone.
    let mut d = opened(
        small,
        1,
        vec![parked(
            sized(1, "a", 50_000),
            ParkedStatus::Waiting,
            0,
            None,
        )],
    );
    match d.next(at(1)) {
        Next::Read {
            parked,
            limit,
            max_bytes,
            ..
        } => assert_eq!((parked, limit, max_bytes), (vec![1], 0, 0)),
        other => panic!("{other:?}"),
    }
}

/// Issue 48 item 11: parked heads at half of the relay's memory make it
/// backlogged: it reads no new effect (its cursor stops), says so once,
/// and goes on with its parked effects; once they go below the ceiling it
/// reads again and says so. Below the ceiling, a round reads no more new
/// effects than the heads left room for.
#[test]
fn parked_heads_at_their_ceiling_stop_the_cursor_until_they_go() {
    let head = PARKED_OVERHEAD + 1;
    let tight = RelaySettings {
        memory: 2 * (3 * head),
        ..settings()
    };
    // Two heads: room for one more.
    let two = vec![
        parked(effect(1, "a", 1), ParkedStatus::Retrying, 1, Some(at(60))),
        parked(effect(2, "b", 1), ParkedStatus::Retrying, 1, Some(at(60))),
    ];
    let mut d = opened(tight.clone(), 2, two);
    match d.next(at(1)) {
        Next::Read { parked, limit, .. } => assert_eq!((parked.len(), limit), (0, 1)),
        other => panic!("{other:?}"),
    }
    STORE.with(|s| s.borrow_mut().insert(3, effect(3, "c", 1)));
    d.read(
        Ok::<_, String>(RoundRead {
            parked: Vec::new(),
            new: vec![effect(3, "c", 1)],
        }),
        at(1),
    );
    assert_eq!(send(&mut d, at(1)), (0, 3));
    d.answered(0, Err(HandlerError::new("503")));
    let (s, _) = save(&mut d, at(1), SaveKind::Round);
    // The save leaves three heads, at the ceiling: it records the backlog
    // from now, with the heads' bytes, for the operator's views.
    assert_eq!(
        (s.position, s.backlogged_since, s.parked_bytes),
        (3, Some(at(1)), 3 * head as u64 + 3)
    );
    d.saved(Ok::<_, String>(true), at(1));
    d.next(at(1));
    d.measured(Ok::<_, String>((9, None)), at(1));
    assert!(!d.progress().backlogged);
    assert_eq!(d.notices().count(), 1, "the refusal");
    // Three heads: at the ceiling. No new effect is read; the cursor stays.
    match d.next(at(2)) {
        Next::Read {
            parked,
            after,
            limit,
            ..
        } => assert_eq!((parked.len(), after, limit), (0, 3, 0)),
        other => panic!("{other:?}"),
    }
    assert!(d.progress().backlogged);
    assert!(matches!(
        d.notices().collect::<Vec<_>>().as_slice(),
        [Notice::Backlogged { parked: 3, bytes }] if *bytes == 3 * head + "503".len()
    ));
    d.read(Ok::<_, String>(RoundRead::default()), at(2));
    assert!(matches!(wait(&mut d, at(2)), (Some(_), false)));
    // Still backlogged, not said again.
    assert_eq!(read(&mut d, at(3), 3, Vec::new()), Vec::<u64>::new());
    assert_eq!(d.notices().count(), 0);
    // All three come due; two are delivered, one refused again: the
    // relay reads again, as many new effects as one more head takes.
    assert_eq!(read(&mut d, at(60), 3, Vec::new()), [1, 2, 3]);
    assert_eq!(send(&mut d, at(60)), (0, 1));
    assert_eq!(send(&mut d, at(60)), (1, 2));
    assert_eq!(send(&mut d, at(60)), (2, 3));
    d.answered(0, Ok(()));
    d.answered(1, Ok(()));
    d.answered(2, Err(HandlerError::new("503")));
    let (s, _) = save(&mut d, at(60), SaveKind::Round);
    assert_eq!((s.unpark.as_slice(), s.position), (&[1, 2][..], 3));
    // One head left (the refused one, with its error): not backlogged.
    assert_eq!(
        (s.backlogged_since, s.parked_bytes),
        (None, head as u64 + 3)
    );
    d.saved(Ok::<_, String>(true), at(60));
    d.next(at(60));
    d.measured(Ok::<_, String>((9, None)), at(60));
    match d.next(at(61)) {
        Next::Read { after, limit, .. } => assert_eq!((after, limit), (3, 1)),
        other => panic!("{other:?}"),
    }
    assert!(!d.progress().backlogged);
    assert!(matches!(
        d.notices().collect::<Vec<_>>().as_slice(),
        [Notice::Refused(_), Notice::BacklogCleared { parked: 1 }]
    ));
}

/// Issue 48 item 11: the backlog is kept in the relay's row. A relay
/// whose row says it is backlogged since a time, opened again (a restart)
/// with its heads still at the ceiling, keeps that start in its saves (a
/// renewal's and the release's too); a relay below its ceiling records
/// none, whatever its row said.
#[test]
fn a_backlog_outlives_a_restart_with_its_start() {
    let head = PARKED_OVERHEAD + 1;
    let tight = RelaySettings {
        memory: 2 * (2 * head),
        lease: Duration::from_secs(3),
        ..settings()
    };
    let heads = || {
        vec![
            parked(effect(1, "a", 1), ParkedStatus::Failed, 8, None),
            parked(effect(2, "b", 1), ParkedStatus::Failed, 8, None),
        ]
    };
    let backlogged = RelayRow {
        backlogged_since: Some(at(0) - Duration::from_secs(500)),
        parked_bytes: Some(2 * head as u64),
        ..row(2)
    };
    let mut d = RelayDriver::new("run-1", tight.clone(), at(0));
    assert!(matches!(d.next(at(0)), Next::Open { .. }));
    d.opened(Ok::<_, String>((backlogged.clone(), heads())), at(0));
    assert!(matches!(d.next(at(0)), Next::Measure { .. }));
    d.measured(Ok::<_, String>((9, None)), at(0));
    // A lease's third after the open, the empty round is saved to renew
    // the lease.
    assert_eq!(read(&mut d, at(2), 2, Vec::new()), Vec::<u64>::new());
    assert!(d.progress().backlogged);
    let (s, _) = save(&mut d, at(2), SaveKind::Round);
    assert_eq!(
        (s.position, s.backlogged_since, s.parked_bytes),
        (2, backlogged.backlogged_since, 2 * head as u64)
    );
    d.saved(Ok::<_, String>(true), at(2));
    d.stop();
    assert!(matches!(d.next(at(2)), Next::Measure { .. }));
    d.measured(Ok::<_, String>((9, None)), at(2));
    let (s, lease) = save(&mut d, at(2), SaveKind::Release);
    assert_eq!(
        (lease, s.backlogged_since, s.parked_bytes),
        (Duration::ZERO, backlogged.backlogged_since, 2 * head as u64)
    );
    // Given twice the memory, the same heads are below the ceiling: the
    // first save clears what the row said.
    let roomy = RelaySettings {
        memory: 4 * (2 * head),
        ..tight
    };
    let mut d = RelayDriver::new("run-1", roomy, at(0));
    assert!(matches!(d.next(at(0)), Next::Open { .. }));
    d.opened(Ok::<_, String>((backlogged, heads())), at(0));
    d.stop();
    assert!(matches!(d.next(at(0)), Next::Measure { .. }));
    d.measured(Ok::<_, String>((9, None)), at(0));
    let (s, _) = save(&mut d, at(0), SaveKind::Release);
    assert_eq!(
        (s.backlogged_since, s.parked_bytes),
        (None, 2 * head as u64)
    );
}

/// Issue 48 item 6: a waiting effect is parked with no attempt, no due
/// time and no error, as its head.
#[test]
fn a_waiting_parked_effect_is_its_head_with_nothing_tried() {
    let e = sized(7, "a", 100);
    let p = ParkedEffect::waiting(&e, at(3));
    assert_eq!(p.effect, e.head());
    assert_eq!(p.effect.bytes, 100);
    assert_eq!(
        (p.status, p.attempts, p.due, p.error, p.updated),
        (ParkedStatus::Waiting, 0, None, None, at(3))
    );
}

/// Issue 48 item 1: parked states that take a whole round's bytes do not
/// hold new effects back for ever: the round after reads new effects
/// first (none of the parked ones), the one after that parked ones again.
#[test]
fn after_a_round_full_of_parked_states_the_next_reads_new_effects_first() {
    let small = RelaySettings {
        memory: 40_000,
        ..settings()
    };
    let mut d = opened(
        small,
        1,
        vec![parked(
            sized(1, "a", 50_000),
            ParkedStatus::Retrying,
            1,
            Some(at(0)),
        )],
    );
    assert_eq!(read(&mut d, at(1), 1, Vec::new()), [1]);
    assert_eq!(send(&mut d, at(1)), (0, 1));
    d.answered(0, Err(HandlerError::new("503")));
    save(&mut d, at(1), SaveKind::Round);
    d.saved(Ok::<_, String>(true), at(1));
    d.next(at(1));
    d.measured(Ok::<_, String>((2, None)), at(1));
    // Due again at once (a zero wait would do the same): new first.
    match d.next(at(100)) {
        Next::Read {
            parked,
            limit,
            max_bytes,
            ..
        } => assert_eq!((parked, limit, max_bytes), (vec![], 10, 10_000)),
        other => panic!("{other:?}"),
    }
    d.read(
        Ok::<_, String>(RoundRead {
            parked: Vec::new(),
            new: vec![effect(2, "b", 1)],
        }),
        at(100),
    );
    assert_eq!(send(&mut d, at(100)), (0, 2));
    d.answered(0, Ok(()));
    save(&mut d, at(100), SaveKind::Round);
    d.saved(Ok::<_, String>(true), at(100));
    d.next(at(100));
    d.measured(Ok::<_, String>((2, None)), at(100));
    assert_eq!(read(&mut d, at(100), 2, Vec::new()), [1], "parked again");
}

/// The relay's row (docs/CONTRACT.md §10): a free lease is taken (held by
/// nobody, by the same run, or ended at or before now), a new owner raises
/// the generation by one, the same owner renews without raising it, and a
/// lease held by another run leaves the row as it was.
#[test]
fn a_lease_is_taken_when_free_and_a_new_owner_raises_the_generation() {
    let lease = Duration::from_secs(30);
    // Held by nobody: taken, the generation raised by one.
    let mut r = RelayRow::new("app", 4, at(0));
    assert_eq!((r.generation, r.owner.as_deref()), (0, None));
    r.take_lease("run-1", at(1), lease);
    assert_eq!(
        r,
        RelayRow {
            name: "app".to_owned(),
            position: 4,
            generation: 1,
            owner: Some("run-1".to_owned()),
            lease_until: Some(at(31)),
            updated: at(1),
            backlogged_since: None,
            parked_bytes: None,
        }
    );
    // The same run renews: the generation stays.
    r.take_lease("run-1", at(5), lease);
    assert_eq!(
        (r.generation, r.lease_until, r.updated),
        (1, Some(at(35)), at(5))
    );
    // Another run while the lease holds (also a nanosecond before its
    // end): nothing changes.
    let before = r.clone();
    r.take_lease("run-2", at(20), lease);
    assert_eq!(r, before);
    r.take_lease("run-2", at(35) - Duration::from_nanos(1), lease);
    assert_eq!(r, before);
    // At its end the lease has lapsed: taken, generation 2, then 3.
    r.take_lease("run-2", at(35), lease);
    assert_eq!(
        (r.generation, r.owner.as_deref(), r.lease_until),
        (2, Some("run-2"), Some(at(65)))
    );
    r.take_lease("run-1", at(70), lease);
    assert_eq!((r.generation, r.owner.as_deref()), (3, Some("run-1")));
    // From generation 3, a take-over makes it 4 (not 2, not 9).
    r.lease_until = Some(at(70));
    r.take_lease("run-3", at(71), Duration::from_secs(2));
    assert_eq!(
        (r.generation, r.lease_until),
        (4, Some(at(71) + Duration::from_secs(2)))
    );
}

/// A lease let go (a save with a lease of zero, ending at the release) is
/// taken by the next run at the same instant, as on the SQL stores.
#[test]
fn a_released_lease_is_taken_at_the_same_instant() {
    let mut r = row(7);
    assert!(r.save(3, "run-1", &to(7), at(10), Duration::ZERO));
    assert_eq!(r.lease_until, Some(at(10)));
    r.take_lease("run-2", at(10), Duration::from_secs(30));
    assert_eq!(
        (r.owner.as_deref(), r.generation, r.lease_until),
        (Some("run-2"), 4, Some(at(40)))
    );
}

/// A save holds only for the generation and owner the run read: it moves
/// the cursor forward (never back) and renews the lease; refused, the row
/// is unchanged. After A → B → A, A's save at its first generation is
/// refused.
#[test]
fn a_save_holds_only_for_its_generation_and_owner() {
    let lease = Duration::from_secs(30);
    let mut r = row(5);
    assert!(r.save(3, "run-1", &to(9), at(4), lease));
    assert_eq!(
        (r.position, r.lease_until, r.updated),
        (9, Some(at(34)), at(4))
    );
    // Never back.
    assert!(r.save(3, "run-1", &to(2), at(6), lease));
    assert_eq!((r.position, r.lease_until), (9, Some(at(36))));
    let before = r.clone();
    for (generation, owner) in [(2, "run-1"), (3, "run-2"), (4, "run-2")] {
        assert!(
            !r.save(generation, owner, &to(20), at(8), lease),
            "generation {generation}, {owner}"
        );
        assert_eq!(r, before, "generation {generation}, {owner}");
    }
    // A → B → A: run-1 read generation 3; run-2 took over (4); run-1 took
    // it back (5). run-1's stale save at 3 is refused.
    r.take_lease("run-2", at(40), lease);
    r.take_lease("run-1", at(80), lease);
    assert_eq!((r.generation, r.owner.as_deref()), (5, Some("run-1")));
    assert!(!r.save(3, "run-1", &to(30), at(81), lease));
    assert_eq!(r.position, 9);
    assert!(r.save(5, "run-1", &to(30), at(81), lease));
    assert_eq!(r.position, 30);
}

#[test]
fn parked_statuses_are_stored_as_their_names() {
    for (status, text) in [
        (ParkedStatus::Retrying, "retrying"),
        (ParkedStatus::Failed, "failed"),
        (ParkedStatus::Waiting, "waiting"),
    ] {
        assert_eq!(status.as_str(), text);
        assert_eq!(ParkedStatus::parse(text), Some(status));
    }
    for text in ["", "Retrying", "done", "xyzzy"] {
        assert_eq!(ParkedStatus::parse(text), None, "{text:?}");
    }
}

/// The constants as documented: Svix's schedule (5 s, 5 min, 30 min, 2 h,
/// 5 h, 10 h, 10 h) and a longest wait of 24 h.
#[test]
fn the_default_schedule_and_the_longest_wait_are_svix_s() {
    let secs: Vec<u64> = DEFAULT_SCHEDULE.iter().map(Duration::as_secs).collect();
    assert_eq!(secs, [5, 300, 1_800, 7_200, 18_000, 36_000, 36_000]);
    assert_eq!(MAX_WAIT, Duration::from_secs(86_400));
    assert_eq!(STORE_RETRY, Duration::from_millis(500));
}

/// The jitter is splitmix64 (its published first output for seed 0 is
/// 0xe220a8397b1dcdaf): the factor is 800 + output % 401 thousandths, so a
/// step of 1,000 s waits the factor in seconds.
#[test]
fn the_jitter_draws_splitmix64_factors() {
    let step = Duration::from_secs(1_000);
    for (seed, factors) in [(0, [1076, 1076, 1023, 975]), (42, [1053, 1196, 911, 904])] {
        let mut j = Jitter::new(seed);
        let waits: Vec<u64> = (0..4).map(|_| j.wait(step, None).as_secs()).collect();
        assert_eq!(waits, factors, "seed {seed}");
    }
    // The product is exact to the nanosecond: 3 s × 1.076 = 3.228 s.
    assert_eq!(
        Jitter::new(0).wait(Duration::from_secs(3), None),
        Duration::from_millis(3_228)
    );
    // A longer Retry-After wins, a shorter one does not; MAX_WAIT caps both.
    assert_eq!(
        Jitter::new(0).wait(step, Some(Duration::from_secs(1_100))),
        Duration::from_secs(1_100)
    );
    assert_eq!(
        Jitter::new(0).wait(step, Some(Duration::from_secs(1_000))),
        Duration::from_secs(1_076)
    );
    assert_eq!(Jitter::new(0).wait(MAX_WAIT, None), MAX_WAIT);
}

#[test]
fn effects_ids_and_refusals_display_and_convert_exactly() {
    let id = EffectId::from(crate::write::HeldKey {
        origin: 0xab,
        seq: 12,
    });
    assert_eq!((id.origin, id.seq), (0xab, 12));
    assert_eq!(id.to_string(), "ef_00000000000000ab_12");
    assert_eq!(HandlerError::new("503 busy").to_string(), "503 busy");
    let row = crate::write::EffectRow {
        key: crate::write::HeldKey { origin: 1, seq: 2 },
        at: at(3),
        object_id: Arc::from("card-1"),
        version: 4,
        state: r#"{"n":1}"#.to_owned(),
        cause_event: Some(Arc::from("e-1")),
        trace: None,
    };
    let e = Effect::from_row(9, row);
    assert_eq!(
        (e.position, e.id, e.at, &*e.object_id, e.version),
        (9, EffectId { origin: 1, seq: 2 }, at(3), "card-1", 4)
    );
    assert_eq!(
        (e.state.as_str(), e.cause_event.as_deref()),
        (r#"{"n":1}"#, Some("e-1"))
    );
    assert!(e.replaces.is_empty());
    assert_eq!(
        EffectRef::from(&e),
        EffectRef {
            id: EffectId { origin: 1, seq: 2 },
            position: 9,
            version: 4
        }
    );
}

/// The driver's own name, and whether it is between rounds: open, no
/// store call out, no round under way.
#[test]
fn a_relay_is_between_rounds_only_when_open_idle_and_with_no_call_out() {
    let d = RelayDriver::new("run-1", settings(), at(0));
    assert_eq!(d.owner(), "run-1");
    assert!(!d.between_rounds(), "not open");
    let mut d = opened(settings(), 0, Vec::new());
    assert!(d.between_rounds(), "open, about to read");
    assert!(matches!(d.next(at(1)), Next::Read { .. }));
    assert!(!d.between_rounds(), "a read out");
    d.read(
        Ok::<_, String>(RoundRead {
            parked: Vec::new(),
            new: vec![effect(1, "a", 1)],
        }),
        at(1),
    );
    assert!(!d.between_rounds(), "a round under way");
    assert_eq!(send(&mut d, at(1)), (0, 1));
    d.answered(0, Ok(()));
    save(&mut d, at(1), SaveKind::Round);
    assert!(!d.between_rounds(), "its save out");
    d.saved(Ok::<_, String>(true), at(1));
    assert!(d.between_rounds(), "saved, about to measure");
}

/// One store call at a time: a report of a call that is not out (a late
/// or stray answer) changes nothing.
#[test]
fn a_report_of_a_call_not_out_is_ignored() {
    let mut d = opened(settings(), 0, Vec::new());
    assert_eq!(d.progress().last, 0);
    assert!(matches!(d.next(at(1)), Next::Read { after: 0, .. }));
    d.measured(Ok::<_, String>((9, Some(at(0)))), at(1));
    d.opened(Ok::<_, String>((row(7), Vec::new())), at(1));
    d.saved(Ok::<_, String>(true), at(1));
    assert_eq!(d.progress().last, 0, "the stray measure was taken");
    assert_eq!(wait(&mut d, at(1)), (None, false));
    d.read(
        Ok::<_, String>(RoundRead {
            parked: Vec::new(),
            new: vec![effect(1, "a", 1)],
        }),
        at(1),
    );
    assert_eq!(send(&mut d, at(1)), (0, 1));
}

/// The progress counts parked and failed effects apart.
#[test]
fn the_progress_counts_parked_and_failed_effects() {
    let parked = vec![
        parked(effect(1, "a", 1), ParkedStatus::Failed, 3, None),
        parked(effect(2, "a", 2), ParkedStatus::Waiting, 0, None),
        parked(effect(3, "b", 1), ParkedStatus::Retrying, 1, Some(at(50))),
    ];
    let d = opened(settings(), 3, parked);
    let p = d.progress();
    assert_eq!((p.position, p.parked, p.failed), (3, 3, 1));
}

/// While another run holds the lease, a run waits a quarter of the lease
/// (at most 1 s) before trying again.
#[test]
fn a_held_lease_is_tried_again_after_a_quarter_of_it() {
    let mut d = RelayDriver::new(
        "run-1",
        RelaySettings {
            lease: Duration::from_secs(2),
            ..settings()
        },
        at(0),
    );
    assert!(matches!(d.next(at(0)), Next::Open { .. }));
    let mut theirs = row(0);
    theirs.owner = Some("run-0".to_owned());
    d.opened(Ok::<_, String>((theirs, Vec::new())), at(0));
    assert_eq!(
        wait(&mut d, at(0)),
        (Some(Duration::from_millis(500)), false)
    );
}

#[test]
fn a_failed_read_is_noted_and_tried_again_after_the_store_retry() {
    let mut d = opened(settings(), 4, Vec::new());
    assert!(matches!(d.next(at(1)), Next::Read { after: 4, .. }));
    d.read(Err("connection reset"), at(1));
    assert!(matches!(
        d.notices().collect::<Vec<_>>().as_slice(),
        [Notice::ReadFailed(e)] if e == "connection reset"
    ));
    assert_eq!(wait(&mut d, at(1)), (Some(STORE_RETRY), false));
    read(&mut d, at(1) + STORE_RETRY, 4, vec![effect(5, "a", 1)]);
    assert!(d.notices().next().is_none(), "no jump, nothing missed");
    assert_eq!(send(&mut d, at(2)), (0, 5));
}

/// A renewal during a long round carries the cursor as saved.
#[test]
fn a_renewal_carries_the_cursor() {
    let mut d = opened(settings(), 5, Vec::new());
    read(&mut d, at(0), 5, vec![effect(6, "a", 1)]);
    send(&mut d, at(0));
    let (s, lease) = save(&mut d, at(10), SaveKind::Renewal);
    assert_eq!(
        (s.position, s.park.len(), s.unpark.len(), lease),
        (5, 0, 0, Duration::from_secs(30))
    );
}

/// Coalescing counts only what a coalesced send stood for: nothing when
/// the relay does not coalesce, when the chain is one effect, or when the
/// send was refused (then the chain's first effect is parked `retrying`
/// and the others `waiting`).
#[test]
fn only_an_accepted_coalesced_send_counts_coalesced_effects() {
    let coalescing = RelaySettings {
        coalesce: true,
        ..settings()
    };
    // Not coalescing: a chain of two, both accepted.
    let mut d = opened(settings(), 0, Vec::new());
    read(&mut d, at(1), 0, vec![effect(1, "a", 1), effect(2, "a", 2)]);
    for position in [1, 2] {
        assert_eq!(send(&mut d, at(1)), (0, position));
        d.answered(0, Ok(()));
    }
    assert_eq!((d.progress().delivered, d.progress().coalesced), (2, 0));
    assert_eq!(d.notices().count(), 0);
    // Coalescing a chain of one.
    let mut d = opened(coalescing.clone(), 0, Vec::new());
    read(&mut d, at(1), 0, vec![effect(1, "a", 1)]);
    assert_eq!(send(&mut d, at(1)), (0, 1));
    d.answered(0, Ok(()));
    assert_eq!((d.progress().delivered, d.progress().coalesced), (1, 0));
    assert_eq!(d.notices().count(), 0);
    // Coalescing a chain of three, refused.
    let mut d = opened(coalescing, 0, Vec::new());
    read(
        &mut d,
        at(1),
        0,
        vec![effect(1, "a", 1), effect(2, "a", 2), effect(3, "a", 3)],
    );
    assert_eq!(send(&mut d, at(1)), (0, 3));
    d.answered(0, Err(HandlerError::new("503")));
    let p = d.progress();
    assert_eq!((p.delivered, p.coalesced, p.refusals), (0, 0, 1));
    assert_eq!(d.notices().count(), 0);
    let (s, _) = save(&mut d, at(2), SaveKind::Round);
    let parked: Vec<(u64, ParkedStatus, u32)> = s
        .park
        .iter()
        .map(|p| (p.effect.position, p.status, p.attempts))
        .collect();
    assert_eq!(
        parked,
        [
            (1, ParkedStatus::Retrying, 1),
            (2, ParkedStatus::Waiting, 0),
            (3, ParkedStatus::Waiting, 0)
        ]
    );
}

/// Not coalescing, a chain whose second effect is refused delivered its
/// first: that one is passed, the refused one parked.
#[test]
fn a_chain_refused_part_way_delivered_what_was_accepted_before() {
    let mut d = opened(settings(), 0, Vec::new());
    read(&mut d, at(1), 0, vec![effect(1, "a", 1), effect(2, "a", 2)]);
    assert_eq!(send(&mut d, at(1)), (0, 1));
    d.answered(0, Ok(()));
    assert_eq!(send(&mut d, at(1)), (0, 2));
    d.answered(0, Err(HandlerError::new("503")));
    assert_eq!((d.progress().delivered, d.progress().refusals), (1, 1));
    let (s, _) = save(&mut d, at(2), SaveKind::Round);
    let parked: Vec<(u64, ParkedStatus, u32)> = s
        .park
        .iter()
        .map(|p| (p.effect.position, p.status, p.attempts))
        .collect();
    assert_eq!(parked, [(2, ParkedStatus::Retrying, 1)]);
    assert_eq!(s.position, 2);
    // One notice for the refused effect, none for anything else parked.
    d.saved(Ok::<_, String>(true), at(2));
    let notices: Vec<Notice> = d.notices().collect();
    assert!(
        matches!(notices.as_slice(), [Notice::Refused(p)] if p.effect.position == 2),
        "{notices:?}"
    );
}

/// A saved round notes each refused effect it parked (retrying or failed),
/// not the effects parked waiting behind them.
#[test]
fn a_saved_round_notes_its_refused_effects_only() {
    let mut d = opened(settings(), 0, Vec::new());
    read(
        &mut d,
        at(1),
        0,
        vec![effect(1, "a", 1), effect(2, "a", 2), effect(3, "a", 3)],
    );
    assert_eq!(send(&mut d, at(1)), (0, 1));
    d.answered(0, Err(HandlerError::new("503")));
    save(&mut d, at(2), SaveKind::Round);
    d.saved(Ok::<_, String>(true), at(2));
    let refused: Vec<(u64, ParkedStatus)> = d
        .notices()
        .map(|n| match n {
            Notice::Refused(p) => (p.effect.position, p.status),
            other => panic!("unexpected notice {other:?}"),
        })
        .collect();
    assert_eq!(refused, [(1, ParkedStatus::Retrying)]);
}

/// A parked effect due now that the store no longer gives back (the round
/// hands nothing out) leaves the relay waiting a poll, not reading again at
/// the same instant for ever.
#[test]
fn a_due_parked_effect_the_store_does_not_give_back_waits_a_poll() {
    let gone = parked(effect(1, "a", 1), ParkedStatus::Retrying, 1, Some(at(5)));
    let mut d = opened(settings(), 1, vec![gone]);
    match d.next(at(5)) {
        Next::Read { parked, .. } => assert_eq!(parked, [1]),
        other => panic!("expected a read, got {other:?}"),
    }
    d.read(
        Ok::<_, String>(RoundRead {
            parked: Vec::new(),
            new: Vec::new(),
        }),
        at(5),
    );
    assert_eq!(
        wait(&mut d, at(5)),
        (Some(Duration::from_millis(50)), false)
    );
}

/// `ms` milliseconds after the test's epoch.
fn at_ms(ms: u64) -> SystemTime {
    at(0) + Duration::from_millis(ms)
}

/// Hands out `e` as the only new effect of a round read at `now` after
/// `after`, accepted.
fn accepted_round(d: &mut RelayDriver, now: SystemTime, after: u64, e: Effect) {
    let position = e.position;
    read(d, now, after, vec![e]);
    assert_eq!(send(d, now), (0, position));
    d.answered(0, Ok(()));
}

/// With `save_every`, a round whose effects were all accepted moves the
/// cursor in memory and the next round is read at once (no save, no
/// measure); the first round past `save_every` since the last save saves
/// the cursor of them all; a round that parks is saved at once. The
/// progress shows the cursor as saved, what a crash resumes at.
#[test]
fn rounds_that_only_move_the_cursor_are_saved_at_most_every_save_every() {
    let every = RelaySettings {
        save_every: Duration::from_millis(200),
        ..settings()
    };
    let mut d = opened(every.clone(), 0, Vec::new());
    accepted_round(&mut d, at_ms(50), 0, effect(1, "a", 1));
    accepted_round(&mut d, at_ms(100), 1, effect(2, "b", 1));
    assert_eq!(d.progress().position, 0);
    accepted_round(&mut d, at_ms(150), 2, effect(3, "c", 1));
    let (s, _) = save(&mut d, at_ms(200), SaveKind::Round);
    assert_eq!((s.position, s.park.len(), s.unpark.len()), (3, 0, 0));
    d.saved(Ok::<_, String>(true), at_ms(210));
    assert!(matches!(d.next(at_ms(210)), Next::Measure { after: 3 }));
    d.measured(Ok::<_, String>((4, None)), at_ms(210));
    assert_eq!(d.progress().position, 3);
    // 10 ms after that save, a refusal parks: saved at once.
    read(&mut d, at_ms(220), 3, vec![effect(4, "d", 1)]);
    send(&mut d, at_ms(220));
    d.answered(0, Err(HandlerError::new("503")));
    let (s, _) = save(&mut d, at_ms(220), SaveKind::Round);
    assert_eq!((s.position, s.park.len()), (4, 1));
    // A save_every longer than a third of the lease (30 s) waits a third
    // of the lease at most.
    let long = RelaySettings {
        save_every: Duration::from_secs(60),
        ..settings()
    };
    let mut d = opened(long, 0, Vec::new());
    accepted_round(&mut d, at(8), 0, effect(1, "a", 1));
    accepted_round(&mut d, at(9), 1, effect(2, "a", 2));
    let (s, _) = save(&mut d, at(10), SaveKind::Round);
    assert_eq!(s.position, 2);
    // Zero: every round is saved.
    let mut d = opened(settings(), 0, Vec::new());
    accepted_round(&mut d, at_ms(50), 0, effect(1, "a", 1));
    let (s, _) = save(&mut d, at_ms(50), SaveKind::Round);
    assert_eq!(s.position, 1);
}

/// A cursor moved in memory is saved as soon as a read finds nothing new
/// (before the relay waits), and by the release when the relay stops; a
/// save refused then reads the row again: the relay resumes at the
/// cursor the store has, handing out again what followed it.
#[test]
fn an_unsaved_cursor_is_saved_when_nothing_is_new_or_the_relay_stops() {
    let every = RelaySettings {
        save_every: Duration::from_millis(200),
        ..settings()
    };
    let mut d = opened(every.clone(), 0, Vec::new());
    accepted_round(&mut d, at_ms(50), 0, effect(1, "a", 1));
    read(&mut d, at_ms(60), 1, Vec::new());
    let (s, _) = save(&mut d, at_ms(60), SaveKind::Round);
    assert_eq!((s.position, s.park.len()), (1, 0));
    d.saved(Ok::<_, String>(true), at_ms(61));
    assert!(matches!(d.next(at_ms(61)), Next::Measure { after: 1 }));
    d.measured(Ok::<_, String>((1, None)), at_ms(61));
    assert_eq!(d.progress().position, 1);
    // Nothing new and nothing unsaved: a poll.
    read(&mut d, at_ms(70), 1, Vec::new());
    assert_eq!(
        wait(&mut d, at_ms(70)),
        (Some(Duration::from_millis(50)), false)
    );

    // Stopped as the read found nothing new: the release carries it.
    let mut d = opened(every.clone(), 0, Vec::new());
    accepted_round(&mut d, at_ms(50), 0, effect(1, "a", 1));
    read(&mut d, at_ms(50), 1, Vec::new());
    d.stop();
    let (s, lease) = save(&mut d, at_ms(50), SaveKind::Release);
    assert_eq!((s.position, lease), (1, Duration::ZERO));
    d.saved(Ok::<_, String>(true), at_ms(51));
    assert!(matches!(d.next(at_ms(51)), Next::Stop));
    assert_eq!(d.progress().position, 1);

    let mut d = opened(every, 0, Vec::new());
    accepted_round(&mut d, at_ms(50), 0, effect(1, "a", 1));
    read(&mut d, at_ms(60), 1, Vec::new());
    save(&mut d, at_ms(60), SaveKind::Round);
    d.saved(Ok::<_, String>(false), at_ms(60));
    assert!(matches!(d.next(at_ms(60)), Next::Open { .. }));
    d.opened(Ok::<_, String>((row(0), Vec::new())), at_ms(60));
    assert!(matches!(d.next(at_ms(60)), Next::Measure { after: 0 }));
    d.measured(Ok::<_, String>((1, None)), at_ms(60));
    assert_eq!(d.progress().position, 0);
    read(&mut d, at_ms(61), 0, vec![effect(1, "a", 1)]);
    assert_eq!(send(&mut d, at_ms(61)), (0, 1));
}

/// The save of a cursor moved in memory (nothing new read) carries the
/// backlog's figures like every other save: with one effect parked
/// `failed`, its heads' bytes, the same as the release's after it.
#[test]
fn the_save_of_an_unsaved_cursor_carries_the_parked_heads_bytes() {
    let every = RelaySettings {
        save_every: Duration::from_millis(200),
        ..settings()
    };
    let failed = parked(effect(1, "a", 1), ParkedStatus::Failed, 4, None);
    let mut d = opened(every, 1, vec![failed]);
    accepted_round(&mut d, at_ms(50), 1, effect(2, "b", 1));
    read(&mut d, at_ms(60), 2, Vec::new());
    let (flush, _) = save(&mut d, at_ms(60), SaveKind::Round);
    d.saved(Ok::<_, String>(true), at_ms(61));
    d.stop();
    d.next(at_ms(61));
    d.measured(Ok::<_, String>((2, None)), at_ms(61));
    let (release, _) = save(&mut d, at_ms(62), SaveKind::Release);
    assert!(release.parked_bytes > 0);
    assert_eq!(
        (flush.position, flush.parked_bytes),
        (2, release.parked_bytes)
    );
}
