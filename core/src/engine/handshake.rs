//! The persist handshake: how a shard's driver hands a step's writes to a
//! durable store and reports back (the journal itself, [`Journal`], is
//! `journal.rs`: the [`Write`]s to commit and the before-images to roll
//! back to when the commit fails). Without a journal (the in-memory
//! receiver) nothing is copied.
//!
//! The driver of a shard (a tokio task, a loom thread, a user's own loop):
//! 1. [`Shard::enable_journal`] once, after [`resume`] put the stored rows back;
//! 2. runs steps ([`Shard::deliver`], [`Shard::pause`], [`Shard::reconcile`]),
//!    holding their answers back;
//! 3. [`Shard::take_writes`], which closes a numbered [`PendingGroup`], and
//!    commits its writes ([`PendingGroup::hand_over`]) in one transaction;
//! 4. on success [`Shard::committed`] with that group, then hands out the
//!    answers; on failure [`Shard::rolled_back`] with it (memory and registry are as after
//!    the last step reported committed; every answer not yet handed out
//!    becomes `retry`, or its step is run again); on a conflict with another
//!    writer, [`Shard::rolled_back`], reload the [`Touched`] rows,
//!    [`Shard::refresh`] with them, and run the steps again.
//!
//! Pipelined: between 3 and 4 the driver may run more steps on top of the
//! uncommitted ones (deciding what arrived while the commit is in flight).
//! Each [`Shard::take_writes`] closes a group and numbers it, as raft-rs
//! numbers its `Ready`; [`Shard::committed`] takes the oldest taken group
//! back (another one is refused: the driver has lost count) and forgets only
//! its before-images; [`Shard::rolled_back`] undoes every step not yet
//! reported committed, the later group's included (they were decided on top
//! of the failed one). The driver hands the store one group at a time: the
//! next group's writes are taken only after the previous commit was
//! reported, so a group never commits on top of one that failed. The
//! core's [`crate::engine::Pipeline`] is such a driver.

use super::journal::{Cut, Journal, PendingGroup, Touched, Undo};
use super::{Context, HeldEvent, ObjectActor, Shard};
use crate::write::{ObjectRow, ReceiptRow, Reloaded, VariantRow, Write};
use std::sync::Arc;

impl Shard {
    /// Turns the journal on: from now on every step records its writes for a
    /// durable store and the before-images to undo it. Call it once, after
    /// [`resume`].
    pub fn enable_journal(&mut self) {
        self.journal = Some(Journal::default());
    }

    /// Records the before-images a step may change.
    pub(crate) fn begin_step(&mut self, objects: &[&Arc<str>], event_id: Option<&Arc<str>>) {
        let Some(journal) = self.journal.as_mut() else {
            return;
        };
        journal.undo.push(Undo::Lengths {
            audit: self.audit.total(),
            malformed: self.malformed.len(),
            superseded: self.superseded.len(),
            parked_total: self.parked_total,
            parked_bytes: self.parked_bytes,
            counters: self.counters,
            replacements: self.replacements.total(),
            tapped: self.tapped.as_ref().map_or(0, Vec::len),
        });
        for id in objects {
            journal
                .undo
                .push(Undo::Object((*id).clone(), self.objects.get(*id).cloned()));
            journal
                .undo
                .push(Undo::Parked((*id).clone(), self.parked.get(*id).cloned()));
            journal.objects.push((*id).clone());
        }
        if let Some(id) = event_id {
            journal.receipts.push(id.clone());
        }
    }

    /// Adds a write to the current step (no-op without a journal).
    pub(crate) fn write(&mut self, write: impl FnOnce() -> Write) {
        if let Some(journal) = self.journal.as_mut() {
            journal.writes.push(write());
        }
    }

    /// Whether steps are journaled for a durable store.
    pub(crate) fn journaled(&self) -> bool {
        self.journal.is_some()
    }

    /// The store rows of every known object, sorted by object id (seeding a
    /// store in that order lets two processes take row locks in the same
    /// order).
    pub fn object_rows(&self) -> Vec<ObjectRow> {
        let mut rows: Vec<ObjectRow> = self.objects.iter().map(|(id, o)| o.row(id)).collect();
        rows.sort_by(|a, b| a.object_id.cmp(&b.object_id));
        rows
    }

    /// Notes that this step created the first record of `receipt`.
    pub(crate) fn note_receipt(&mut self, receipt: ReceiptRow) {
        if self.controls.evict_uncommitted.is_on() {
            // The must-fail control: evictable before its commit.
            let record = (
                receipt.event_id.clone(),
                receipt.fingerprint,
                receipt.first_seen,
            );
            self.queue_identities([record]);
        }
        if let Some(journal) = self.journal.as_mut() {
            journal.undo.push(Undo::Identity(
                receipt.event_id.clone(),
                receipt.fingerprint,
                receipt.first_seen,
            ));
            journal.writes.push(Write::Receipt(receipt));
        }
    }

    /// Notes that this step recorded the variant `variant`.
    pub(crate) fn note_variant(&mut self, variant: VariantRow) {
        if let Some(journal) = self.journal.as_mut() {
            journal
                .undo
                .push(Undo::Variant(variant.event_id.clone(), variant.fingerprint));
            journal.writes.push(Write::Variant(variant));
        }
    }

    /// Closes a group: the steps run since the last [`Shard::take_writes`]
    /// (or [`Shard::rolled_back`]), numbered, with their writes in step
    /// order to commit in one transaction. The group comes back with
    /// [`Shard::committed`] or [`Shard::rolled_back`]. Its writes are empty
    /// without a journal, or when the steps changed nothing a store keeps
    /// (the group must still be reported, as committed: there is nothing to
    /// fail).
    pub fn take_writes(&mut self) -> PendingGroup {
        let Some(journal) = self.journal.as_mut() else {
            return PendingGroup {
                number: 0,
                writes: Vec::new(),
            };
        };
        journal.next_group += 1;
        journal.taken.push_back(Cut {
            number: journal.next_group,
            undo: journal.undo.len(),
            objects: journal.objects.len(),
            receipts: journal.receipts.len(),
            bodies: journal.bodies.len(),
        });
        PendingGroup {
            number: journal.next_group,
            writes: std::mem::take(&mut journal.writes),
        }
    }

    /// Reports that `group`, the oldest group taken by [`Shard::take_writes`]
    /// and not reported yet, is durable: its before-images are forgotten and
    /// its steps' answers may go out. Steps run after it was taken stay
    /// uncommitted (pipelining).
    ///
    /// # Panics
    /// When `group` is not the oldest unreported group of this shard (a
    /// driver that lost count of its groups would forget the wrong
    /// before-images).
    pub fn committed(&mut self, group: PendingGroup) {
        let Some(journal) = self.journal.as_mut() else {
            return;
        };
        let oldest = journal.taken.front().map(|c| c.number);
        assert_eq!(
            oldest,
            Some(group.number),
            "Shard::committed: group {} reported, but the oldest unreported group is {oldest:?}",
            group.number
        );
        let Some(cut) = journal.taken.pop_front() else {
            return;
        };
        // The group's first records are as the store holds them now: a
        // bounded registry may let them go.
        let committed: Vec<_> = journal
            .undo
            .drain(..cut.undo)
            .filter_map(|undo| match undo {
                Undo::Identity(id, fingerprint, first_seen) => Some((id, fingerprint, first_seen)),
                _ => None,
            })
            .collect();
        journal.objects.drain(..cut.objects);
        journal.receipts.drain(..cut.receipts);
        let bodies: Vec<_> = journal.bodies.drain(..cut.bodies).collect();
        for later in &mut journal.taken {
            later.undo -= cut.undo;
            later.objects -= cut.objects;
            later.receipts -= cut.receipts;
            later.bodies -= cut.bodies;
        }
        // The group's holds are in the store: their bodies are read back
        // from there when they are decided again.
        for (object_id, key) in bodies {
            self.drop_body(&object_id, key);
        }
        if self.controls.evict_uncommitted.is_on() {
            // The control queued them when they were decided.
            return;
        }
        self.queue_identities(committed);
    }

    /// Reports that the commit of `group` (the oldest unreported group)
    /// failed: puts the shard back as it was after the last step reported
    /// committed (undoing the failed group and every step decided on top of
    /// it, later taken groups included), first records and variants in the
    /// shared registry included, and returns the rows those steps touched.
    /// None of those steps may be acknowledged: the failed group's answer
    /// `retry`, the later ones are decided again.
    ///
    /// # Panics
    /// When `group` is not the oldest unreported group of this shard.
    pub fn rolled_back(&mut self, ctx: &Context, group: PendingGroup) -> Touched {
        let Some(journal) = self.journal.take() else {
            return Touched::default();
        };
        let oldest = journal.taken.front().map(|c| c.number);
        assert_eq!(
            oldest,
            Some(group.number),
            "Shard::rolled_back: group {} reported, but the oldest unreported group is {oldest:?}",
            group.number
        );
        let next_group = journal.next_group;
        for undo in journal.undo.into_iter().rev() {
            match undo {
                Undo::Object(id, Some(before)) => {
                    self.objects.insert(id, before);
                }
                Undo::Object(id, None) => {
                    self.objects.remove(&id);
                }
                Undo::Parked(id, Some(before)) => {
                    self.parked.insert(id, before);
                }
                Undo::Parked(id, None) => {
                    self.parked.remove(&id);
                }
                Undo::Lengths {
                    audit,
                    malformed,
                    superseded,
                    parked_total,
                    parked_bytes,
                    counters,
                    replacements,
                    tapped,
                } => {
                    if let Some(t) = self.tapped.as_mut() {
                        t.truncate(tapped);
                    }
                    self.replacements.truncate_total(replacements);
                    self.audit.truncate_total(audit);
                    self.truncate_malformed(malformed);
                    self.superseded.truncate(superseded);
                    self.parked_total = parked_total;
                    self.parked_bytes = parked_bytes;
                    self.counters = counters;
                }
                Undo::Identity(event_id, fingerprint, _) => {
                    ctx.registry().remove_first(&event_id, fingerprint);
                }
                Undo::Variant(event_id, fingerprint) => {
                    ctx.registry().remove_variant(&event_id, fingerprint);
                }
            }
        }
        self.journal = Some(Journal {
            next_group,
            ..Journal::default()
        });
        // What is left in memory is committed: bodies restored with the
        // objects leave memory again.
        if self.bodies_in_store() {
            for (object_id, _) in &journal.bodies {
                self.drop_bodies(object_id);
            }
            for object_id in &journal.objects {
                self.drop_bodies(object_id);
            }
        }
        Touched {
            objects: journal.objects,
            receipts: journal.receipts,
        }
    }

    /// After a conflict: replaces the cached object rows and registry records
    /// (first records and variants) with what the store holds (the rows of
    /// [`Touched`], reloaded). A stored state that is not valid JSON is
    /// logged and the cached row kept.
    pub fn refresh(&mut self, ctx: &Context, reloaded: Reloaded) {
        let Reloaded {
            objects,
            receipts,
            variants,
        } = reloaded;
        for row in objects {
            // Under the configured depth, as a resume reads stored states
            // (`Shard::insert_object`).
            let max_depth = ctx.config().limits.max_depth;
            let Ok((state, digest)) = crate::envelope::StateJson::parse(&row.state, max_depth)
            else {
                tracing::error!(object_id = %row.object_id, "stored state is not valid JSON; keeping the cached row");
                continue;
            };
            // An object another writer created (an authority, or an event
            // under `create_on_first_snapshot`): the events parked for it
            // join its held queue, as on a restart.
            if let Some(mut actor) = self.objects.get_mut(&row.object_id) {
                actor.version = row.version;
                actor.state = state;
                actor.state_digest = digest;
                actor.paused = row.paused;
                continue;
            }
            let parked = self.parked.remove(&row.object_id).unwrap_or_default();
            self.parked_total -= parked.len();
            self.parked_bytes -= parked.bytes();
            self.objects.insert(
                row.object_id,
                ObjectActor {
                    version: row.version,
                    state,
                    state_digest: digest,
                    paused: row.paused,
                    held: parked,
                    used: 0,
                },
            );
        }
        // Variants before the receipts: a claim that sees a restored record
        // finds its variants already there.
        for v in variants {
            ctx.registry().restore_variant(v);
        }
        let mut restored = Vec::with_capacity(receipts.len());
        for r in receipts {
            restored.push((r.event_id.clone(), r.fingerprint, r.first_seen));
            ctx.registry().restore(r);
        }
        // As stored: a bounded registry may let them go again.
        self.queue_identities(restored);
    }
}

/// Puts what a durable store holds back into `shards` (the receiver's shards,
/// objects routed by [`crate::shard_of`]): objects, pauses,
/// held and parked events (their bodies parsed again), malformed bodies,
/// superseded inputs, and the receipts and variants within retention. The
/// replacement counters are not resumed: [`Shard::counters`] counts what
/// this run did (earlier runs' replacements are in the store's audit trail
/// and history).
///
/// # Errors
/// [`crate::store::StoreError::Failed`] when a stored state is not valid JSON.
pub fn resume(
    ctx: &Context,
    shards: &mut [Shard],
    loaded: crate::write::Loaded,
) -> Result<(), crate::store::StoreError> {
    use crate::envelope::Parsed;
    use crate::store::StoreError;
    use crate::write::HeldStatus;
    let n = shards.len();
    ctx.continue_after(loaded.max_seq);
    for row in loaded.objects {
        let shard = &mut shards[crate::shard_of(&row.object_id, n)];
        shard
            .insert_object(ctx, &row.object_id, row.version, &row.state)
            .map_err(|e| StoreError::Failed(format!("stored state of {}: {e}", row.object_id)))?;
        if let Some(mut o) = shard.objects.get_mut(&row.object_id) {
            o.paused = row.paused;
        }
    }
    for v in loaded.variants {
        ctx.registry().restore_variant(v);
    }
    for r in loaded.receipts {
        // A bounded shard (the owner of the receipt's object) may let it go
        // again: it is as stored.
        let record = (r.event_id.clone(), r.fingerprint, r.first_seen);
        shards[crate::shard_of(&r.object_id, n)].queue_identities([record]);
        ctx.registry().restore(r);
    }
    for h in loaded.held {
        let index = crate::route(h.object_id.as_deref(), n);
        let shard = &mut shards[index];
        let seq = ctx.next_seq();
        if shard.bounded() {
            // Its body stays in the store (docs/CONTRACT.md §9), read back
            // when the event is decided again: the row's own columns say
            // what it is.
            resume_without_body(shard, seq, h);
            continue;
        }
        let parsed = ctx.parser().parse(&h.body).map(|d| d.0);
        match (h.status, parsed) {
            (HeldStatus::Superseded, _) => shard.superseded.push(crate::engine::UnresolvedInput {
                seq,
                event_id: h.event_id,
                object_id: h.object_id,
                held_as: h.held_as,
                superseded_by: h.superseded_by,
            }),
            (HeldStatus::Held | HeldStatus::Parked, Ok(Parsed::Event(event))) => {
                let object_id = event.object_id_shared();
                let held = HeldEvent::new(seq, h.key, h.held_as, event);
                shard.wait(object_id, held);
            }
            (_, parsed) => {
                let error = match parsed {
                    Ok(Parsed::Malformed(m)) => m.error,
                    Err(reject) => format!("stored body now refused: {reject}"),
                    Ok(Parsed::Event(_)) => h.detail.unwrap_or_default(),
                };
                shard.hold_malformed(
                    seq,
                    h.key,
                    crate::envelope::MalformedBody {
                        bytes: h.body,
                        error,
                        event_id: h.event_id,
                        object_id: h.object_id,
                    },
                );
            }
        }
    }
    Ok(())
}

/// Puts a stored held row back into a shard whose waiting bodies stay in
/// the store, without its body: a held or parked event under its object, a
/// superseded input, or a malformed input (also a held or parked row
/// without the ids of one) whose digest is read when needed.
fn resume_without_body(shard: &mut Shard, seq: u64, h: crate::write::HeldRow) {
    use crate::write::HeldStatus;
    match (h.status, h.event_id, h.object_id) {
        (HeldStatus::Superseded, event_id, object_id) => {
            shard.superseded.push(crate::engine::UnresolvedInput {
                seq,
                event_id,
                object_id,
                held_as: h.held_as,
                superseded_by: h.superseded_by,
            })
        }
        (HeldStatus::Held | HeldStatus::Parked, Some(event_id), Some(object_id)) => {
            let held = HeldEvent {
                seq,
                key: h.key,
                held_as: h.held_as,
                event_id,
                event: None,
            };
            shard.wait(object_id, held);
        }
        (_, event_id, object_id) => shard.resume_malformed(seq, h.key, event_id, object_id),
    }
}

impl Shard {
    /// Puts a resumed held event under its object: in its held queue when
    /// the object is known here, parked otherwise.
    fn wait(&mut self, object_id: Arc<str>, held: HeldEvent) {
        if let Some(mut o) = self.objects.get_mut(&object_id) {
            o.held.push(held);
            return;
        }
        self.parked_total += 1;
        self.parked_bytes += super::objects::held_bytes(&held);
        self.parked.entry(object_id).or_default().push(held);
    }
}

#[cfg(test)]
mod tests {
    use crate::engine::{Config, Context, Outcome, Shard};
    use crate::{Decision, ManualClock, Verdict};
    use std::sync::Arc;
    use std::time::UNIX_EPOCH;

    fn body(event_id: &str, version: u64) -> String {
        format!(
            concat!(
                r#"{{"event_id":"{}","object_id":"card-7","object_version":{},"#,
                r#""occurred_at":"2099-01-01T00:00:00Z","type":"card.snapshot","state":{{"v":{}}}}}"#
            ),
            event_id, version, version
        )
    }

    fn setup() -> (Context, Shard) {
        let ctx = Context::new(Config::default(), Arc::new(ManualClock::new(UNIX_EPOCH)));
        let mut shard = Shard::new();
        shard
            .insert_object(&ctx, "card-7", 10, r#"{"v":10}"#)
            .unwrap();
        shard.enable_journal();
        (ctx, shard)
    }

    fn decide(ctx: &Context, shard: &mut Shard, event_id: &str, version: u64) -> Outcome {
        let delivery = ctx
            .parser()
            .parse(body(event_id, version).as_bytes())
            .unwrap();
        shard.deliver(ctx, delivery).receipt.outcome
    }

    #[test]
    fn a_commit_forgets_only_its_own_group_and_a_later_failure_undoes_the_rest() {
        // Pipelined: e-1 is in the store's hands when e-2 is decided on top.
        let (ctx, mut shard) = setup();
        decide(&ctx, &mut shard, "e-1", 11);
        let first = shard.take_writes();
        assert_eq!(
            decide(&ctx, &mut shard, "e-2", 12),
            Outcome::Decided(Decision::Applied)
        );
        assert!(!first.is_empty());
        assert_eq!(first.number(), 1);
        shard.committed(first);
        let second = shard.take_writes();
        assert!(!second.is_empty());
        assert_eq!(second.number(), 2);
        let touched = shard.rolled_back(&ctx, second);
        // Back to e-1's committed step, not to before it.
        assert_eq!(shard.object("card-7").unwrap().version, 11);
        assert_eq!(
            ctx.registry().get("e-1").unwrap().decision,
            Verdict::Applied
        );
        assert!(ctx.registry().get("e-2").is_none());
        assert_eq!(touched.receipts, [Arc::from("e-2")]);
    }

    #[test]
    #[should_panic(
        expected = "Shard::committed: group 2 reported, but the oldest unreported group is Some(1)"
    )]
    fn a_group_reported_before_an_older_one_is_refused() {
        let (ctx, mut shard) = setup();
        decide(&ctx, &mut shard, "e-1", 11);
        let first = shard.take_writes();
        decide(&ctx, &mut shard, "e-2", 12);
        let second = shard.take_writes();
        // Reporting the later group first would forget e-1's before-images.
        shard.committed(second);
        drop(first);
    }

    #[test]
    fn group_numbers_go_on_after_a_rollback() {
        let (ctx, mut shard) = setup();
        decide(&ctx, &mut shard, "e-1", 11);
        let first = shard.take_writes();
        assert_eq!(first.number(), 1);
        let _ = shard.rolled_back(&ctx, first);
        decide(&ctx, &mut shard, "e-1", 11);
        let again = shard.take_writes();
        assert_eq!(again.number(), 2);
        shard.committed(again);
        assert_eq!(shard.object("card-7").unwrap().version, 11);
    }

    #[test]
    fn a_refresh_reads_stored_states_under_the_configured_depth() {
        let mut config = Config::default();
        config.limits.max_depth = 3;
        let ctx = Context::new(config, Arc::new(ManualClock::new(UNIX_EPOCH)));
        let mut shard = Shard::new();
        shard
            .insert_object(&ctx, "card-7", 10, r#"{"v":10}"#)
            .unwrap();
        let row = |version: u64, state: &str| crate::write::ObjectRow {
            object_id: Arc::from("card-7"),
            version,
            state: state.to_owned(),
            paused: false,
        };
        let reload = |objects| crate::write::Reloaded {
            objects,
            receipts: Vec::new(),
            variants: Vec::new(),
        };
        // Depth 3 (object, object, array): within the limit, taken.
        shard.refresh(&ctx, reload(vec![row(11, r#"{"a":{"b":[1]}}"#)]));
        let object = shard.object("card-7").unwrap();
        assert_eq!(
            (object.version, object.state.as_str()),
            (11, r#"{"a":{"b":[1]}}"#)
        );
        // Depth 4: deeper than the configured limit, the cached row stays.
        shard.refresh(&ctx, reload(vec![row(12, r#"{"a":{"b":[[1]]}}"#)]));
        let object = shard.object("card-7").unwrap();
        assert_eq!(
            (object.version, object.state.as_str()),
            (11, r#"{"a":{"b":[1]}}"#)
        );
    }

    #[test]
    fn a_failed_group_takes_the_steps_decided_on_top_of_it_back_too() {
        let (ctx, mut shard) = setup();
        decide(&ctx, &mut shard, "e-1", 11);
        let in_flight = shard.take_writes();
        // A redelivery of e-1 on top of the uncommitted first record.
        assert_eq!(
            decide(&ctx, &mut shard, "e-1", 11),
            Outcome::Decided(Decision::Duplicate {
                original: Verdict::Applied
            })
        );
        let _ = shard.rolled_back(&ctx, in_flight);
        assert_eq!(shard.object("card-7").unwrap().version, 10);
        assert!(ctx.registry().get("e-1").is_none());
        // Decided again on the rolled-back state, the redelivery is the first record.
        assert_eq!(
            decide(&ctx, &mut shard, "e-1", 11),
            Outcome::Decided(Decision::Applied)
        );
    }
}
