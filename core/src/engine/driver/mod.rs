//! The driver of a receiver's shards: what decides who answers when. It
//! touches no channel, socket or clock of its own (as raft-rs's `RawNode`
//! drives `Raft`): the caller brings the work, commits the writes it is
//! handed and reports the result; the driver runs the steps and answers
//! through the caller's reply tokens.
//!
//! Two parts:
//! - [`ShardSet`]: the shards, each behind a lock, with its pause inbox.
//!   It routes ([`ShardSet::route`]), queues the pauses a step raises for
//!   the shard owning their object ([`ShardSet::queue_pause`]), runs them
//!   before that shard's next step, lets a caller run the step of an idle
//!   shard ([`ShardSet::try_deliver`]) and runs a batch of work in memory
//!   ([`ShardSet::run_batch`]).
//! - [`Pipeline`]: one durable shard's group commit, pipelined. It decides
//!   what arrives on top of the uncommitted journal ([`Pipeline::decide`]),
//!   hands one group at a time to the store ([`Pipeline::hand_over`]),
//!   answers a group only once the store reported it durable
//!   ([`Pipeline::settle`]), and after a conflict with another writer
//!   decides the group again on the rows reloaded ([`Pipeline::reloaded`]).
//!
//! Notifications (decisions, effects) and wake-ups leave through the
//! caller's [`Outlet`], called while the shard is locked, so that one
//! shard's notifications leave in step order. Every lock is the core's
//! sync facade's, so the loom models check this code as it ships.
//!
//! ```
//! use snapshot_receiver_core::engine::{
//!     Answer, Config, Context, Handover, Outlet, Pipeline, Reply, Shard, ShardSet, Work,
//! };
//! use snapshot_receiver_core::{Decision, ManualClock, Receipt, EffectRecord};
//! use std::sync::{mpsc, Arc};
//! use std::time::UNIX_EPOCH;
//!
//! /// Nobody listens to notifications; a pause needs no wake-up here.
//! struct Quiet;
//! impl Outlet for Quiet {
//!     fn listening(&self) -> bool { false }
//!     fn decision(&self, _: &Receipt) {}
//!     fn effect(&self, _: EffectRecord) {}
//!     fn wake(&self, _: usize) {}
//! }
//! /// The caller's reply token: a channel end.
//! struct Tx(mpsc::Sender<Receipt>);
//! impl Reply for Tx {
//!     fn answer(self, answer: Answer<'_>) {
//!         if let Answer::Delivered(receipt) = answer { let _ = self.0.send(receipt); }
//!     }
//! }
//!
//! let ctx = Context::new(Config::default(), Arc::new(ManualClock::new(UNIX_EPOCH)));
//! let mut shard = Shard::new();
//! shard.insert_object(&ctx, "card-7", 10, r#"{"stage":"queued"}"#)?;
//! let set = ShardSet::durable(ctx, vec![shard], Quiet);
//! let mut pipeline = Pipeline::new(0);
//! let body = br#"{"event_id":"e-1","object_id":"card-7","object_version":11,
//!     "occurred_at":"2099-01-01T00:00:00Z","type":"card.snapshot","state":{"stage":"ready"}}"#;
//! let (tx, rx) = mpsc::channel();
//! pipeline.decide(&set, [Work::Deliver(set.ctx().parser().parse(body)?, Tx(tx))]);
//! let Handover::Commit(writes) = pipeline.hand_over(&set) else { unreachable!() };
//! assert!(rx.try_recv().is_err(), "no answer before the commit");
//! // ... the store commits `writes` in one transaction, then:
//! assert!(!writes.is_empty());
//! assert!(pipeline.settle(&set, Ok(())).is_none());
//! assert_eq!(rx.try_recv()?.decision(), Some(Decision::Applied));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use super::fetch::{Fetch, Missing};
use super::{
    AuthoritativeSnapshot, Context, EffectRecord, PauseRequest, Receipt, ReconcileError,
    ReconcileReport, Shard,
};
use crate::envelope::{Delivery, RejectReason};
use std::sync::Arc;

mod pipeline;
mod set;
#[cfg(all(test, not(snapshot_receiver_loom)))]
mod tests;

pub use pipeline::{Handover, Next, Pipeline, MAX_BATCH, MAX_SHUTDOWN_ROUNDS};
pub use set::{ShardSet, Stepper};

/// How many times a group is decided again after write conflicts with other
/// receiver processes before its callers get `retry`.
pub const MAX_REDO: usize = 8;

/// Where what leaves a shard goes: notifications and wake-ups. Every method
/// is called while the shard that made the call is locked (so one shard's
/// notifications leave in step order), and must not block or touch the
/// [`ShardSet`].
pub trait Outlet {
    /// Whether anyone listens to notifications: the shard then records its
    /// effects for [`Outlet::effect`] (see [`Shard::tap_effects`]).
    fn listening(&self) -> bool;
    /// A recorded step's decision (in memory right after the step; durable
    /// after its group committed). Only called while [`Outlet::listening`].
    fn decision(&self, receipt: &Receipt);
    /// A state replacement the step made, after its decision. Only called
    /// while [`Outlet::listening`].
    fn effect(&self, effect: EffectRecord);
    /// Shard `shard` has something to do: a pause was queued for it (its
    /// driver should run its next step, or [`ShardSet::run_pauses`], soon),
    /// or the last driver that could raise one went quiet (a driver waiting
    /// to stop asks [`Pipeline::next`] again).
    fn wake(&self, shard: usize);
}

/// No one listens, and nothing needs waking: for a driver that steps every
/// shard itself, one call after the other (a queued pause runs before its
/// shard's next step or read).
impl Outlet for () {
    fn listening(&self) -> bool {
        false
    }
    fn decision(&self, _: &Receipt) {}
    fn effect(&self, _: EffectRecord) {}
    fn wake(&self, _: usize) {}
}

/// A caller's reply token: how the answer of one [`Work`] reaches its
/// caller (a oneshot sender, a part of a batch, a closure).
pub trait Reply {
    /// Hands the caller its answer; the answer to a [`Work`] is always the
    /// [`Answer`] of the same kind. Called while the shard is locked.
    fn answer(self, answer: Answer<'_>);
}

/// What one [`Work`] is answered.
pub enum Answer<'a> {
    /// The receipt of a [`Work::Deliver`].
    Delivered(Receipt),
    /// The receipts of a [`Work::DeliverMany`], in its order.
    DeliveredMany(Vec<Receipt>),
    /// The result of a [`Work::Reconcile`].
    Reconciled(Result<ReconcileReport, ReconcileError>),
    /// A [`Work::Read`]: the shard as the steps before it left it (with a
    /// durable store: committed).
    Read(&'a Shard),
}

/// One piece of work for a shard, with the caller's reply token.
#[derive(Debug)]
pub enum Work<R> {
    /// One delivery.
    Deliver(Delivery, R),
    /// Deliveries decided one after the other and answered together.
    DeliverMany(Vec<Delivery>, R),
    /// An authoritative snapshot ([`Shard::reconcile`]).
    Reconcile(AuthoritativeSnapshot, R),
    /// A read of the shard, answered after the work before it.
    Read(R),
}

/// One work item as the driver keeps it until it is answered.
pub(super) enum Item<R> {
    /// A queued pause, run before the work that followed its queueing.
    Pause(PauseRequest),
    /// The delivery (taken out once decided in memory, where no redo is
    /// possible) and the reply (taken out once answered).
    Deliver(Option<Delivery>, Option<R>),
    /// The deliveries (each taken out once decided in memory).
    DeliverMany(Vec<Option<Delivery>>, R),
    Reconcile(AuthoritativeSnapshot, R),
    Read(R),
}

impl<R> From<Work<R>> for Item<R> {
    fn from(work: Work<R>) -> Self {
        match work {
            Work::Deliver(d, r) => Item::Deliver(Some(d), Some(r)),
            Work::DeliverMany(ds, r) => Item::DeliverMany(ds.into_iter().map(Some).collect(), r),
            Work::Reconcile(s, r) => Item::Reconcile(s, r),
            Work::Read(r) => Item::Read(r),
        }
    }
}

impl<R> Item<R> {
    /// The event identities this item's deliveries name (their receipts
    /// are read ahead for a bounded registry).
    fn event_ids(&self) -> Vec<&Arc<str>> {
        let deliveries: Vec<&Delivery> = match self {
            Item::Deliver(delivery, _) => delivery.iter().collect(),
            Item::DeliverMany(deliveries, _) => deliveries.iter().flatten().collect(),
            _ => Vec::new(),
        };
        deliveries
            .into_iter()
            .filter_map(|d| match &d.0 {
                crate::envelope::Parsed::Event(event) => Some(&event.event_id),
                crate::envelope::Parsed::Malformed(_) => None,
            })
            .collect()
    }

    /// The objects this item's steps name (read ahead for a bounded shard).
    fn object_ids(&self) -> Vec<&str> {
        match self {
            Item::Pause(pause) => vec![&*pause.object_id],
            Item::Deliver(delivery, _) => delivery.iter().filter_map(Delivery::object_id).collect(),
            Item::DeliverMany(deliveries, _) => deliveries
                .iter()
                .flatten()
                .filter_map(Delivery::object_id)
                .collect(),
            Item::Reconcile(snapshot, _) => vec![&*snapshot.object_id],
            Item::Read(_) => Vec::new(),
        }
    }
}

/// The effects of one step, published with it.
type Effects = Vec<EffectRecord>;

/// What deciding one [`Item`] produced, handed out once it may be.
pub(super) enum Done {
    /// A pause, or a read: nothing to hand out but the answer itself.
    Nothing,
    /// A pause whose object could not be read from the store: nothing
    /// changed, and it goes back to the inbox.
    Unread(PauseRequest),
    Delivered(Receipt, Option<PauseRequest>, Effects),
    DeliveredMany(Vec<(Receipt, Option<PauseRequest>, Effects)>),
    Reconciled(Result<ReconcileReport, ReconcileError>, Effects),
}

/// What running one item produced ([`process`]).
pub(super) enum Ran {
    /// It was decided.
    Done(Done),
    /// It stopped, nothing of its current step changed: the shard needs
    /// this read from the store first. The item runs again afterwards from
    /// where it stopped (the steps a [`Item::DeliverMany`] decided before
    /// are in the `Done` given back).
    Fetch(Fetch, Option<Done>),
}

/// Runs one item on the shard, after what `partial` holds (a run of the
/// item that stopped for a read). In memory (`consume`), the deliveries
/// are moved out (no redo is possible, so no copy is needed) and nothing
/// is read: a bounded shard's miss is answered `retry`, as
/// [`Shard::deliver`] does. A delivery among the `refused` ones is
/// answered `reject` without being decided.
fn process<R>(
    shard: &mut Shard,
    ctx: &Context,
    item: &mut Item<R>,
    consume: bool,
    refused: &[Refusal],
    partial: Option<Done>,
) -> Ran {
    match item {
        Item::Pause(pause) => match shard.pause(ctx, pause) {
            Ok(_) => Ran::Done(Done::Nothing),
            Err(Missing::Fetch(fetch)) if !consume => Ran::Fetch(fetch, None),
            Err(_) => Ran::Done(Done::Unread(pause.clone())),
        },
        Item::Deliver(delivery, _) => {
            let step = match refuse(delivery, refused) {
                Some(step) => Ok(Some(step)),
                None => deliver(shard, ctx, delivery, consume),
            };
            match step {
                Ok(Some((receipt, pause, effects))) => {
                    Ran::Done(Done::Delivered(receipt, pause, effects))
                }
                Ok(None) => Ran::Done(Done::Nothing),
                Err(fetch) => Ran::Fetch(fetch, None),
            }
        }
        Item::DeliverMany(deliveries, _) => {
            // Outside memory no delivery is taken out, so the steps done
            // so far are as many as the deliveries decided.
            let mut steps = match partial {
                Some(Done::DeliveredMany(steps)) => steps,
                _ => Vec::new(),
            };
            for d in deliveries.iter_mut().skip(steps.len()) {
                let step = match refuse(d, refused) {
                    Some(step) => Ok(Some(step)),
                    None => deliver(shard, ctx, d, consume),
                };
                match step {
                    Ok(Some(step)) => steps.push(step),
                    Ok(None) => {}
                    Err(fetch) => {
                        // Nothing decided yet: the item is not half decided.
                        let partial = (!steps.is_empty()).then_some(Done::DeliveredMany(steps));
                        return Ran::Fetch(fetch, partial);
                    }
                }
            }
            Ran::Done(Done::DeliveredMany(steps))
        }
        Item::Reconcile(snapshot, _) => {
            let result = if consume {
                shard.reconcile(ctx, snapshot)
            } else {
                match shard.reconcile_step(ctx, snapshot) {
                    Ok(result) => result,
                    Err(fetch) => return Ran::Fetch(fetch, None),
                }
            };
            Ran::Done(Done::Reconciled(result, shard.take_effects()))
        }
        Item::Read(_) => Ran::Done(Done::Nothing),
    }
}

/// A delivery the store refused to record: its exact body, and the
/// store's cause ([`StoreError::Refused`]).
type Refusal = (Arc<[u8]>, String);

/// The `reject` answer of a delivery whose body is among the `refused`
/// ones (the store could not hold its rows): not decided, nothing of it
/// recorded. `None` for any other delivery, or one already taken.
fn refuse(
    delivery: &Option<Delivery>,
    refused: &[Refusal],
) -> Option<(Receipt, Option<PauseRequest>, Effects)> {
    let delivery = delivery.as_ref()?;
    let (_, cause) = refused
        .iter()
        .find(|(body, _)| **body == *delivery.body())?;
    let why = RejectReason::StoreRefused {
        cause: cause.clone(),
    };
    Some((Receipt::refused(delivery, why), None, Vec::new()))
}

/// Decides one delivery of an item; `Ok(None)` if it was already taken,
/// `Err` (nothing changed) when the shard must read from the store first
/// (never in memory: `consume`).
fn deliver(
    shard: &mut Shard,
    ctx: &Context,
    slot: &mut Option<Delivery>,
    consume: bool,
) -> Result<Option<(Receipt, Option<PauseRequest>, Effects)>, Fetch> {
    let step = if consume {
        let Some(delivery) = slot.take() else {
            return Ok(None);
        };
        shard.deliver(ctx, delivery)
    } else {
        let Some(delivery) = slot.clone() else {
            return Ok(None);
        };
        shard.step(ctx, delivery).map_err(|stopped| stopped.1)?
    };
    Ok(Some((step.receipt, step.pause, shard.take_effects())))
}
