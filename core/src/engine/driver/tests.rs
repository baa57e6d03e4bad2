use super::*;
use crate::engine::{Config, Outcome, RetryReason};
use crate::store::StoreError;
use crate::write::Reloaded;
use crate::{Decision, ManualClock, Verdict};
use std::cell::RefCell;
use std::sync::Arc;
use std::time::UNIX_EPOCH;

fn body(event_id: &str, object_id: &str, version: u64) -> Vec<u8> {
    format!(
        concat!(
            r#"{{"event_id":"{}","object_id":"{}","object_version":{},"#,
            r#""occurred_at":"2099-01-01T00:00:00Z","type":"card.snapshot","state":{{"v":{}}}}}"#
        ),
        event_id, object_id, version, version
    )
    .into_bytes()
}

/// Records the shards it was asked to wake.
#[derive(Default)]
struct Wakes(RefCell<Vec<usize>>);

impl Outlet for Wakes {
    fn listening(&self) -> bool {
        false
    }
    fn decision(&self, _: &Receipt) {}
    fn effect(&self, _: EffectRecord) {}
    fn wake(&self, shard: usize) {
        self.0.borrow_mut().push(shard);
    }
}

/// Answers into a shared list, in the order given.
struct Into<'a>(&'a RefCell<Vec<Receipt>>);

impl Reply for Into<'_> {
    fn answer(self, answer: Answer<'_>) {
        match answer {
            Answer::Delivered(r) => self.0.borrow_mut().push(r),
            Answer::DeliveredMany(rs) => self.0.borrow_mut().extend(rs),
            _ => panic!("only deliveries here"),
        }
    }
}

/// A context of `shards` shards on a manual clock at the Unix epoch.
fn ctx(shards: usize) -> Context {
    Context::new(
        Config {
            shards,
            ..Config::default()
        },
        Arc::new(ManualClock::new(UNIX_EPOCH)),
    )
}

fn set(durable: bool) -> ShardSet<Wakes> {
    let ctx = ctx(1);
    let mut shard = Shard::new();
    shard
        .insert_object(&ctx, "card-7", 10, r#"{"v":10}"#)
        .unwrap();
    if durable {
        ShardSet::durable(ctx, vec![shard], Wakes::default())
    } else {
        ShardSet::new(ctx, vec![shard], Wakes::default())
    }
}

fn work<'a>(
    set: &ShardSet<Wakes>,
    answers: &'a RefCell<Vec<Receipt>>,
    event: &str,
    v: u64,
) -> Work<Into<'a>> {
    Work::Deliver(
        set.ctx().parser().parse(&body(event, "card-7", v)).unwrap(),
        Into(answers),
    )
}

fn decisions(answers: &RefCell<Vec<Receipt>>) -> Vec<Option<Decision>> {
    answers.borrow().iter().map(Receipt::decision).collect()
}

#[test]
fn a_group_is_answered_only_once_its_commit_is_reported() {
    let set = set(true);
    let answers = RefCell::new(Vec::new());
    let mut pipeline = Pipeline::new(0);
    pipeline.decide(&set, [work(&set, &answers, "e-1", 11)]);
    let Handover::Commit(writes) = pipeline.hand_over(&set) else {
        panic!("e-1 writes");
    };
    assert!(!writes.is_empty());
    // Decided on top of the group in flight, handed over after it.
    pipeline.decide(&set, [work(&set, &answers, "e-2", 12)]);
    assert!(matches!(pipeline.hand_over(&set), Handover::Idle));
    assert!(answers.borrow().is_empty());
    assert!(pipeline.settle(&set, Ok(())).is_none());
    assert_eq!(decisions(&answers), [Some(Decision::Applied)]);
    assert!(matches!(pipeline.hand_over(&set), Handover::Commit(_)));
    assert!(pipeline.settle(&set, Ok(())).is_none());
    assert_eq!(decisions(&answers), [Some(Decision::Applied); 2]);
    assert_eq!(set.read(0, |s| s.object("card-7").unwrap().version), 12);
}

#[test]
fn a_failed_group_answers_retry_and_what_was_decided_on_top_is_decided_again() {
    let set = set(true);
    let answers = RefCell::new(Vec::new());
    let mut pipeline = Pipeline::new(0);
    pipeline.decide(&set, [work(&set, &answers, "e-1", 11)]);
    assert!(matches!(pipeline.hand_over(&set), Handover::Commit(_)));
    // A redelivery, on top of the uncommitted first record: a duplicate.
    pipeline.decide(&set, [work(&set, &answers, "e-1", 11)]);
    let failed = Err(StoreError::Failed("disk full".to_owned()));
    assert!(pipeline.settle(&set, failed).is_none());
    let first = answers.borrow()[0].outcome.clone();
    assert!(
        matches!(first, Outcome::Retry(RetryReason::StoreFailed(StoreError::Failed(ref e))) if e == "disk full"),
        "{first:?}"
    );
    // Decided again on the rolled-back state: the first record now.
    assert_eq!(pipeline.decided(), 1);
    assert!(matches!(pipeline.hand_over(&set), Handover::Commit(_)));
    assert!(pipeline.settle(&set, Ok(())).is_none());
    assert_eq!(decisions(&answers), [None, Some(Decision::Applied)]);
    assert_eq!(
        set.ctx().registry().get("e-1").unwrap().decision,
        Verdict::Applied
    );
}

#[test]
fn a_conflict_rolls_back_reloads_and_decides_the_group_again() {
    let set = set(true);
    let answers = RefCell::new(Vec::new());
    let mut pipeline = Pipeline::new(0);
    pipeline.decide(&set, [work(&set, &answers, "e-1", 11)]);
    assert!(matches!(pipeline.hand_over(&set), Handover::Commit(_)));
    let touched = pipeline
        .settle(&set, Err(StoreError::Conflict("card-7 changed".to_owned())))
        .expect("rows to reload");
    assert_eq!(touched.objects, [Arc::from("card-7")]);
    assert_eq!(touched.receipts, [Arc::from("e-1")]);
    assert!(
        answers.borrow().is_empty(),
        "no answer before the redo commits"
    );
    pipeline.reloaded(&set, Ok(Reloaded::default()));
    assert!(matches!(pipeline.hand_over(&set), Handover::Commit(_)));
    assert!(pipeline.settle(&set, Ok(())).is_none());
    assert_eq!(decisions(&answers), [Some(Decision::Applied)]);
}

#[test]
fn a_refused_delivery_is_rejected_and_the_rest_of_its_group_commits_even_after_a_conflict() {
    let set = set(true);
    let answers = RefCell::new(Vec::new());
    let mut pipeline = Pipeline::new(0);
    let poison = body("e-1", "card-7", 11);
    pipeline.decide(
        &set,
        [
            work(&set, &answers, "e-1", 11),
            work(&set, &answers, "e-2", 12),
        ],
    );
    assert!(matches!(pipeline.hand_over(&set), Handover::Commit(_)));
    let refused = Err(StoreError::Refused {
        cause: "cannot hold U+0000".to_owned(),
        body: Some(Arc::from(poison)),
    });
    assert!(pipeline.settle(&set, refused).is_none());
    assert!(answers.borrow().is_empty(), "no answer before the commit");
    assert_eq!(pipeline.decided(), 2, "the whole group decided again");
    // The group decided again meets a conflict: the refusal still holds.
    assert!(matches!(pipeline.hand_over(&set), Handover::Commit(_)));
    let conflict = Err(StoreError::Conflict("card-7 changed".to_owned()));
    let touched = pipeline.settle(&set, conflict).expect("rows to reload");
    assert_eq!(touched.receipts, [Arc::from("e-2")]);
    pipeline.reloaded(&set, Ok(Reloaded::default()));
    assert!(matches!(pipeline.hand_over(&set), Handover::Commit(_)));
    assert!(pipeline.settle(&set, Ok(())).is_none());
    assert_eq!(
        outcomes(&answers),
        [
            Outcome::Rejected(crate::RejectReason::StoreRefused {
                cause: "cannot hold U+0000".to_owned()
            }),
            Outcome::Decided(Decision::Applied),
        ]
    );
    assert!(set.ctx().registry().get("e-1").is_none(), "nothing of e-1");
    assert_eq!(set.read(0, |s| s.object("card-7").unwrap().version), 12);
}

#[test]
fn a_busy_shard_leaves_the_delivery_to_its_caller() {
    let set = set(false);
    let mut slot = Some(
        set.ctx()
            .parser()
            .parse(&body("e-1", "card-7", 11))
            .unwrap(),
    );
    let stepper = set.stepper(0);
    assert!(set.try_deliver(0, &mut slot).is_none());
    assert!(slot.is_some(), "still the caller's, for the mailbox");
    drop(stepper);
    let receipt = set.try_deliver(0, &mut slot).expect("idle now");
    assert_eq!(receipt.decision(), Some(Decision::Applied));
    assert!(slot.is_none());
}

#[test]
fn a_pause_waits_in_its_owners_inbox_and_runs_before_its_next_step() {
    let set = set(false);
    set.queue_pause(PauseRequest {
        object_id: "card-7".into(),
        cause_event: "e-0".into(),
        recorded: None,
    });
    assert_eq!(*set.outlet().0.borrow(), [0]);
    assert_eq!(set.queued_pauses(0), 1);
    let step = set.deliver(
        0,
        set.ctx()
            .parser()
            .parse(&body("e-1", "card-7", 11))
            .unwrap(),
    );
    assert_eq!(
        step.receipt.decision(),
        Some(Decision::Held(crate::HoldReason::Paused))
    );
    assert_eq!(set.queued_pauses(0), 0);
}

/// A store holding `card-1`..`card-9` at version 0 that records the
/// ids of each object read.
#[derive(Clone, Default)]
struct Reads(Arc<std::sync::Mutex<Vec<Vec<String>>>>);

impl crate::store::ObjectSource for Reads {
    fn objects(&mut self, ids: &[Arc<str>]) -> Result<Vec<crate::write::ObjectRow>, StoreError> {
        self.0
            .lock()
            .unwrap()
            .push(ids.iter().map(|id| id.to_string()).collect());
        Ok(ids
            .iter()
            .map(|id| crate::write::ObjectRow {
                object_id: id.clone(),
                version: 0,
                state: r#"{"v":0}"#.to_owned(),
                paused: false,
            })
            .collect())
    }
    fn receipts(
        &mut self,
        _: &[Arc<str>],
        _: std::time::SystemTime,
    ) -> Result<Vec<crate::write::ReceiptRow>, StoreError> {
        Ok(Vec::new())
    }
    fn receipt_ids(
        &mut self,
        _: &str,
        _: std::time::SystemTime,
        _: usize,
    ) -> Result<Vec<(Arc<str>, std::time::SystemTime)>, StoreError> {
        Ok(Vec::new())
    }
}

#[test]
fn a_bounded_shard_reads_the_objects_of_a_whole_batch_in_one_read() {
    let ctx = ctx(1);
    let reads = Reads::default();
    let mut shard = Shard::new();
    shard.bound_objects(8);
    let set = ShardSet::durable(ctx, vec![shard], Wakes::default());
    let answers = RefCell::new(Vec::new());
    let works: Vec<_> = [("e-1", "card-1"), ("e-2", "card-2"), ("e-3", "card-3")]
        .into_iter()
        .map(|(event, object)| {
            Work::Deliver(
                set.ctx().parser().parse(&body(event, object, 1)).unwrap(),
                Into(&answers),
            )
        })
        .collect();
    let mut pipeline = Pipeline::new(0);
    pipeline.decide(&set, works);
    let Next::Fetch(fetch) = pipeline.next(&set) else {
        panic!("the batch's objects are read first");
    };
    assert!(reads.0.lock().unwrap().is_empty(), "the step read nothing");
    let rows = fetch.read(&mut reads.clone());
    pipeline.fetched(&set, &fetch, rows);
    assert_eq!(*reads.0.lock().unwrap(), [["card-1", "card-2", "card-3"]]);
    assert!(matches!(pipeline.next(&set), Next::Commit(_)));
    assert!(pipeline.settle(&set, Ok(())).is_none());
    assert_eq!(decisions(&answers), [Some(Decision::Applied); 3]);
}

/// A durable set of one shard keeping one object, every object only in
/// the store ([`Reads`]).
fn bounded_to_one() -> ShardSet<Wakes> {
    let ctx = ctx(1);
    let mut shard = Shard::new();
    shard.bound_objects(1);
    ShardSet::durable(ctx, vec![shard], Wakes::default())
}

/// Does what `pipeline` asks until it waits: reads through `reads`, and
/// commits every group. Returns what it did, in order.
fn pump(set: &ShardSet<Wakes>, pipeline: &mut Pipeline<Into<'_>>, reads: &Reads) -> Vec<String> {
    let mut did = Vec::new();
    loop {
        match pipeline.next(set) {
            Next::Fetch(fetch) => {
                did.push(format!("fetch {:?}", fetch.objects));
                let rows = fetch.read(&mut reads.clone());
                pipeline.fetched(set, &fetch, rows);
            }
            Next::Commit(_) => {
                did.push("commit".to_owned());
                assert!(pipeline.settle(set, Ok(())).is_none());
            }
            Next::Rejoin => pipeline.decide(set, []),
            Next::Wait { .. } | Next::Stop => return did,
        }
    }
}

/// card-1's first record is e-1 (card-1 then leaves memory for card-3),
/// committed and answered; the answers are cleared.
fn card_1_evicted<'a>(
    set: &ShardSet<Wakes>,
    pipeline: &mut Pipeline<Into<'a>>,
    reads: &Reads,
    answers: &'a RefCell<Vec<Receipt>>,
) {
    for (event, object) in [("e-1", "card-1"), ("e-3", "card-3")] {
        let delivery = set.ctx().parser().parse(&body(event, object, 1)).unwrap();
        pipeline.decide(set, [Work::Deliver(delivery, Into(answers))]);
        pump(set, pipeline, reads);
    }
    assert_eq!(decisions(answers), [Some(Decision::Applied); 2]);
    assert!(
        set.read(0, |s| s.object("card-1")).is_none(),
        "card-1 evicted"
    );
    answers.borrow_mut().clear();
}

/// One item: e-2 (card-2) and a variant of e-1 naming card-2. The variant
/// pauses card-1, which only the store holds, and its step is the first
/// to know it must be read.
fn variant_batch<'a>(set: &ShardSet<Wakes>, answers: &'a RefCell<Vec<Receipt>>) -> Work<Into<'a>> {
    let parse = |event: &str, v: u64| set.ctx().parser().parse(&body(event, "card-2", v)).unwrap();
    Work::DeliverMany(vec![parse("e-2", 1), parse("e-1", 2)], Into(answers))
}

/// Reads the fetch `pipeline` asks for next through `reads`, or `result`
/// when given; returns the objects it named.
fn serve(
    set: &ShardSet<Wakes>,
    pipeline: &mut Pipeline<Into<'_>>,
    reads: &Reads,
    result: Option<Result<crate::engine::Fetched, StoreError>>,
) -> Vec<String> {
    let Next::Fetch(fetch) = pipeline.next(set) else {
        panic!("a read is asked for");
    };
    let rows = result.unwrap_or_else(|| fetch.read(&mut reads.clone()));
    pipeline.fetched(set, &fetch, rows);
    fetch.objects.iter().map(|id| id.to_string()).collect()
}

/// After [`card_1_evicted`]: e-4 (card-3 v2) is in the store's hands
/// while [`variant_batch`] is decided on top, and its variant's step asks
/// for card-1; that read, handed out and not answered.
fn card_1_read_out_behind_e_4<'a>(
    set: &ShardSet<Wakes>,
    pipeline: &mut Pipeline<Into<'a>>,
    reads: &Reads,
    answers: &'a RefCell<Vec<Receipt>>,
) -> crate::engine::Fetch {
    card_1_evicted(set, pipeline, reads, answers);
    let e4 = set.ctx().parser().parse(&body("e-4", "card-3", 2)).unwrap();
    pipeline.decide(set, [Work::Deliver(e4, Into(answers))]);
    assert!(matches!(pipeline.hand_over(set), Handover::Commit(_)));
    pipeline.decide(set, [variant_batch(set, answers)]);
    assert_eq!(serve(set, pipeline, reads, None), ["card-2"]);
    let Next::Fetch(card_1) = pipeline.next(set) else {
        panic!("the variant's step asks for card-1");
    };
    card_1
}

/// The answers' outcomes, in order.
fn outcomes(answers: &RefCell<Vec<Receipt>>) -> Vec<Outcome> {
    answers.borrow().iter().map(|r| r.outcome.clone()).collect()
}

const CONFLICT: Option<Decision> = Some(Decision::Conflict(crate::ConflictKind::EventVariant));

#[test]
fn a_step_that_misses_an_object_stops_and_its_item_resumes_after_the_read() {
    let reads = Reads::default();
    let set = bounded_to_one();
    let answers = RefCell::new(Vec::new());
    let mut pipeline = Pipeline::new(0);
    card_1_evicted(&set, &mut pipeline, &reads, &answers);
    let e4 = set.ctx().parser().parse(&body("e-4", "card-3", 2)).unwrap();
    let works = [
        Work::Deliver(e4, Into(&answers)),
        variant_batch(&set, &answers),
    ];
    pipeline.decide(&set, works);
    // The batch's own read (card-2), then e-4 and e-2 are decided, then the
    // variant stops: e-4's group is not handed over while e-2's item is
    // half decided (one item's steps commit together).
    assert_eq!(serve(&set, &mut pipeline, &reads, None), ["card-2"]);
    assert!(matches!(pipeline.hand_over(&set), Handover::Idle));
    assert_eq!(
        pump(&set, &mut pipeline, &reads),
        [r#"fetch ["card-1"]"#, "commit"]
    );
    let applied = Some(Decision::Applied);
    assert_eq!(decisions(&answers), [applied, applied, CONFLICT]);
    assert_eq!(
        *reads.0.lock().unwrap(),
        [["card-1"], ["card-3"], ["card-2"], ["card-1"]]
    );
    let card_1 = set.read(0, |s| s.object("card-1")).expect("read back");
    assert!(card_1.paused, "the variant paused card-1");
}

#[test]
fn a_failed_read_a_step_asked_for_is_its_retry_and_its_objects_for_the_batch() {
    let reads = Reads::default();
    let set = bounded_to_one();
    let answers = RefCell::new(Vec::new());
    let mut pipeline = Pipeline::new(0);
    card_1_evicted(&set, &mut pipeline, &reads, &answers);
    // After the variant, e-5 (card-2 v3) and e-6 (card-4 v1) in the same
    // batch.
    let Work::DeliverMany(mut batch, reply) = variant_batch(&set, &answers) else {
        unreachable!("one item");
    };
    for (event, object, v) in [("e-5", "card-2", 3), ("e-6", "card-4", 1)] {
        batch.push(set.ctx().parser().parse(&body(event, object, v)).unwrap());
    }
    pipeline.decide(&set, [Work::DeliverMany(batch, reply)]);
    assert_eq!(
        serve(&set, &mut pipeline, &reads, None),
        ["card-2", "card-4"]
    );
    let lost = StoreError::Failed("connection lost".to_owned());
    let failed = serve(&set, &mut pipeline, &reads, Some(Err(lost.clone())));
    assert_eq!(failed, ["card-1"]);
    assert_eq!(pump(&set, &mut pipeline, &reads), ["commit"]);
    // The variant's retry holds back e-5, of its object (card-2) and
    // later in the batch, not e-6 (card-4).
    let retry = Outcome::Retry(RetryReason::StoreFailed(lost));
    let applied = Outcome::Decided(Decision::Applied);
    assert_eq!(
        outcomes(&answers),
        [applied.clone(), retry.clone(), retry, applied]
    );
    // Nothing of the variant was recorded: delivered again, it is decided.
    pipeline.decide(&set, [variant_batch(&set, &answers)]);
    pump(&set, &mut pipeline, &reads);
    assert_eq!(answers.borrow()[5].decision(), CONFLICT);
}

#[test]
fn an_item_half_decided_when_the_group_before_it_fails_starts_over() {
    let reads = Reads::default();
    let set = bounded_to_one();
    let answers = RefCell::new(Vec::new());
    let mut pipeline = Pipeline::new(0);
    let card_1 = card_1_read_out_behind_e_4(&set, &mut pipeline, &reads, &answers);
    // e-4's commit fails: e-2's step, decided on top, is rolled back too.
    let down = StoreError::Failed("server closed the connection".to_owned());
    assert!(pipeline.settle(&set, Err(down.clone())).is_none());
    pipeline.fetched(&set, &card_1, card_1.read(&mut reads.clone()));
    pump(&set, &mut pipeline, &reads);
    assert_eq!(
        outcomes(&answers),
        [
            Outcome::Retry(RetryReason::StoreFailed(down)),
            Outcome::Decided(Decision::Applied),
            Outcome::Decided(Decision::Conflict(crate::ConflictKind::EventVariant)),
        ]
    );
    let card_2 = set.read(0, |s| s.object("card-2")).expect("in memory");
    assert_eq!(card_2.version, 1, "e-2 applied again after the rollback");
}

#[test]
fn a_read_that_ends_while_a_refused_group_reloads_decides_nothing_until_the_rows_are_back() {
    let reads = Reads::default();
    let set = bounded_to_one();
    let answers = RefCell::new(Vec::new());
    let mut pipeline = Pipeline::new(0);
    let card_1 = card_1_read_out_behind_e_4(&set, &mut pipeline, &reads, &answers);
    // Another writer changed a row e-4's group read: the group is refused
    // and reloads; card-1's read ends meanwhile.
    let touched = pipeline.settle(&set, Err(StoreError::Conflict("card-3 changed".to_owned())));
    assert!(touched.is_some());
    pipeline.fetched(&set, &card_1, card_1.read(&mut reads.clone()));
    assert_eq!(
        pipeline.decided(),
        0,
        "nothing decided on rows being reloaded"
    );
    assert!(set.ctx().registry().variants("e-1").is_empty());
    pipeline.reloaded(&set, Ok(Reloaded::default()));
    pump(&set, &mut pipeline, &reads);
    let applied = Some(Decision::Applied);
    assert_eq!(decisions(&answers), [applied, applied, CONFLICT]);
}

#[test]
fn a_pause_queued_while_the_store_is_read_is_decided_before_the_work_that_came_after_it() {
    let reads = Reads::default();
    let set = bounded_to_one();
    let answers = RefCell::new(Vec::new());
    let mut pipeline = Pipeline::new(0);
    card_1_evicted(&set, &mut pipeline, &reads, &answers);
    // e-9 names card-2, which only the store holds: its read goes out.
    let e9 = set.ctx().parser().parse(&body("e-9", "card-2", 1)).unwrap();
    pipeline.decide(&set, [Work::Deliver(e9, Into(&answers))]);
    let Next::Fetch(card_2) = pipeline.next(&set) else {
        panic!("card-2 is read first");
    };
    // Meanwhile a variant elsewhere pauses card-3, and then e-10 (card-3)
    // arrives: it waits behind the read, and behind the pause.
    set.queue_pause(PauseRequest {
        object_id: Arc::from("card-3"),
        cause_event: Arc::from("e-8"),
        recorded: None,
    });
    let e10 = set
        .ctx()
        .parser()
        .parse(&body("e-10", "card-3", 2))
        .unwrap();
    pipeline.decide(&set, [Work::Deliver(e10, Into(&answers))]);
    pipeline.fetched(&set, &card_2, card_2.read(&mut reads.clone()));
    assert_eq!(pump(&set, &mut pipeline, &reads), ["commit"]);
    assert_eq!(
        decisions(&answers),
        [
            Some(Decision::Applied),
            Some(Decision::Held(crate::HoldReason::Paused))
        ]
    );
}

#[test]
fn a_group_decided_again_after_a_refusal_goes_whole_when_a_read_splits_it() {
    // Objects and receipts only in the store: each delivery's receipt is
    // read before it is decided.
    let mut shard = Shard::new();
    shard.bound_objects(8);
    shard.bound_identities(8);
    let set = ShardSet::durable(ctx(1), vec![shard], Wakes::default());
    let reads = Reads::default();
    let answers = RefCell::new(Vec::new());
    let mut pipeline = Pipeline::new(0);
    let poison = body("e-4", "card-3", 2);
    let works: Vec<_> = [
        b"not json".to_vec(),
        body("e-9", "card-3", 1),
        poison.clone(),
    ]
    .iter()
    .map(|b| Work::Deliver(set.ctx().parser().parse(b).unwrap(), Into(&answers)))
    .collect();
    pipeline.decide(&set, works);
    assert_eq!(serve(&set, &mut pipeline, &reads, None), ["card-3"]);
    assert!(matches!(pipeline.next(&set), Next::Commit(_)));
    let refused = Err(StoreError::Refused {
        cause: "cannot hold U+0000".to_owned(),
        body: Some(Arc::from(poison)),
    });
    assert!(pipeline.settle(&set, refused).is_none());
    // Decided again: the batch's read of the receipts fails, the malformed
    // body is decided, and e-9 stops for a read of its own.
    let lost = StoreError::Failed("connection lost".to_owned());
    serve(&set, &mut pipeline, &reads, Some(Err(lost)));
    assert_eq!(pipeline.decided(), 1);
    assert!(
        matches!(pipeline.hand_over(&set), Handover::Idle),
        "a group decided again is not handed over in parts"
    );
    serve(&set, &mut pipeline, &reads, None);
    assert_eq!(pump(&set, &mut pipeline, &reads), ["commit"]);
    assert_eq!(
        outcomes(&answers),
        [
            Outcome::Decided(Decision::Held(crate::HoldReason::Malformed)),
            Outcome::Decided(Decision::Applied),
            Outcome::Rejected(crate::RejectReason::StoreRefused {
                cause: "cannot hold U+0000".to_owned()
            }),
        ]
    );
}

/// A durable set of two shards, with `card-7` on shard 0 (single-shard
/// [`set`] objects are re-placed by routing among two).
fn two_shards() -> ShardSet<Wakes> {
    let ctx = ctx(2);
    let mut shards = vec![Shard::new(), Shard::new()];
    let owner = crate::shard_of("card-7", 2);
    shards[owner]
        .insert_object(&ctx, "card-7", 10, r#"{"v":10}"#)
        .unwrap();
    ShardSet::durable(ctx, shards, Wakes::default())
}

/// A pause of card-7 raised by a variant of e-9 elsewhere, for its owner
/// to record (no store wrote it yet).
fn card_7_paused_by_e_9() -> PauseRequest {
    PauseRequest {
        object_id: Arc::from("card-7"),
        cause_event: Arc::from("e-9"),
        recorded: None,
    }
}

/// What `next` says, with the commit's writes counted.
fn said<R: Reply>(pipeline: &mut Pipeline<R>, set: &ShardSet<Wakes>) -> String {
    match pipeline.next(set) {
        Next::Commit(writes) => format!("commit {}", writes.len()),
        Next::Fetch(fetch) => format!("fetch {:?} {:?}", fetch.objects, fetch.receipts),
        Next::Rejoin => "rejoin".to_owned(),
        Next::Wait {
            commit,
            wake,
            receive,
        } => format!("wait commit={commit} wake={wake} receive={receive}"),
        Next::Stop => "stop".to_owned(),
    }
}

#[test]
fn an_open_idle_pipeline_waits_for_work_and_wake_ups() {
    let set = set(true);
    let mut pipeline: Pipeline<Into<'_>> = Pipeline::new(0);
    assert_eq!(
        said(&mut pipeline, &set),
        "wait commit=false wake=true receive=256"
    );
    // Woken for a queued pause, with work still arriving: it is decided at once.
    set.queue_pause(card_7_paused_by_e_9());
    pipeline.woken(&set);
    assert_eq!((pipeline.decided(), set.queued_pauses(0)), (1, 0));
    assert_eq!(said(&mut pipeline, &set), "commit 2");
    assert!(pipeline.settle(&set, Ok(())).is_none());
    // A shutdown arrived: wake-ups no longer count, what was accepted does.
    pipeline.closing();
    assert_eq!(
        said(&mut pipeline, &set),
        "wait commit=false wake=false receive=256"
    );
}

#[test]
fn a_decided_group_is_committed_then_its_callers_may_rejoin_once() {
    let set = set(true);
    let answers = RefCell::new(Vec::new());
    let mut pipeline = Pipeline::new(0);
    pipeline.decide(&set, [work(&set, &answers, "e-1", 11)]);
    // e-1's receipt, audit row, object, outbox row (no rejoin before an answer).
    let Next::Commit(writes) = pipeline.next(&set) else {
        panic!("e-1 is handed over")
    };
    assert!(!writes.is_empty());
    pipeline.decide(&set, [work(&set, &answers, "e-2", 12)]);
    assert_eq!(
        said(&mut pipeline, &set),
        "wait commit=true wake=true receive=255"
    );
    assert!(pipeline.settle(&set, Ok(())).is_none());
    assert_eq!(said(&mut pipeline, &set), "rejoin");
    // The callers sent nothing more: the group on top goes now.
    pipeline.decide(&set, []);
    assert!(said(&mut pipeline, &set).starts_with("commit "));
    assert!(pipeline.settle(&set, Ok(())).is_none());
    assert_eq!(decisions(&answers), [Some(Decision::Applied); 2]);
    // Nothing decided: no rejoin, waiting again.
    assert_eq!(
        said(&mut pipeline, &set),
        "wait commit=false wake=true receive=256"
    );
}

#[test]
fn a_full_group_or_a_waiting_read_takes_no_more_work() {
    let set = set(true);
    let answers = RefCell::new(Vec::new());
    let mut full = Pipeline::new(0);
    full.decide(&set, [work(&set, &answers, "g-0", 11)]);
    assert!(matches!(full.next(&set), Next::Commit(_)));
    let on_top = (1..MAX_BATCH as u64).map(|i| work(&set, &answers, &format!("g-{i}"), 11 + i));
    full.decide(&set, on_top);
    assert_eq!(
        said(&mut full, &set),
        "wait commit=true wake=true receive=1"
    );
    full.decide(&set, [work(&set, &answers, "g-last", 1_000)]);
    assert_eq!(full.room(), 0);
    assert_eq!(
        said(&mut full, &set),
        "wait commit=true wake=false receive=0"
    );
    assert!(full.settle(&set, Ok(())).is_none());

    // A read on top of a group in flight: it must see the shard as that
    // group leaves it, so nothing more is taken until it is answered.
    let mut reading = Pipeline::new(0);
    reading.decide(&set, [work(&set, &answers, "h-1", 2_000)]);
    assert!(matches!(reading.next(&set), Next::Commit(_)));
    reading.decide(&set, [Work::Read(Into(&answers))]);
    assert_eq!(
        said(&mut reading, &set),
        "wait commit=true wake=false receive=0"
    );
}

#[test]
fn a_drained_driver_stops_only_once_no_other_can_raise_a_pause() {
    let set = two_shards();
    let owner = crate::shard_of("card-7", 2);
    let other = 1 - owner;
    let mut a: Pipeline<Into<'_>> = Pipeline::new(owner);
    let mut b: Pipeline<Into<'_>> = Pipeline::new(other);
    a.drained();
    // The other shard's driver may still queue a pause for card-7.
    assert_eq!(said(&mut a, &set), "wait commit=false wake=true receive=0");
    assert!(set.outlet().0.borrow().is_empty());
    // It does (as a variant it decided would), then drains too.
    set.queue_pause(card_7_paused_by_e_9());
    assert_eq!(*set.outlet().0.borrow(), [owner]);
    b.drained();
    // b is the last to go quiet: every shard is woken; nothing is queued
    // for b, so it stops.
    assert_eq!(said(&mut b, &set), "stop");
    assert_eq!(*set.outlet().0.borrow(), [owner, 0, 1]);
    // a records the pause before it stops.
    assert_eq!(said(&mut a, &set), "commit 2");
    assert!(a.settle(&set, Ok(())).is_none());
    assert_eq!(said(&mut a, &set), "stop");
    assert!(set.read(owner, |s| s.object("card-7").unwrap().paused));
}

#[test]
fn a_drained_driver_keeps_recording_pauses_while_another_can_still_raise_them() {
    // Each round's pause is recorded, and another arrives before the next
    // round: only rounds the store refused count towards giving up.
    let set = two_shards();
    let owner = crate::shard_of("card-7", 2);
    let mut a: Pipeline<Into<'_>> = Pipeline::new(owner);
    a.drained();
    for round in 0..=MAX_SHUTDOWN_ROUNDS + 1 {
        set.queue_pause(card_7_paused_by_e_9());
        let said = said(&mut a, &set);
        assert!(said.starts_with("commit"), "round {round}: {said}");
        assert!(a.settle(&set, Ok(())).is_none());
    }
    assert_eq!(said(&mut a, &set), "wait commit=false wake=true receive=0");
}

#[test]
fn a_drained_driver_gives_up_on_pauses_the_store_keeps_refusing() {
    let set = set(true);
    let mut pipeline: Pipeline<Into<'_>> = Pipeline::new(0);
    set.queue_pause(card_7_paused_by_e_9());
    pipeline.drained();
    // A wake-up once drained decides nothing: the rounds are next's to count.
    pipeline.woken(&set);
    assert_eq!(pipeline.decided(), 0);
    for _ in 0..MAX_SHUTDOWN_ROUNDS {
        assert_eq!(said(&mut pipeline, &set), "commit 2");
        let failed = Err(StoreError::Failed("disk full".to_owned()));
        assert!(pipeline.settle(&set, failed).is_none());
        assert_eq!(set.queued_pauses(0), 1, "the pause is back in the inbox");
    }
    assert_eq!(said(&mut pipeline, &set), "stop");
    assert_eq!(set.queued_pauses(0), 1);
}
