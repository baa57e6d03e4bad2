//! The journal of a shard's uncommitted steps, for durable stores: the
//! [`Write`]s to commit, grouped as the driver takes them ([`PendingGroup`]),
//! and the before-images to roll back to when a commit fails; and the rows
//! a step's records become ([`effect_row`], [`audit_row`]). Plain data
//! below the shard: what a shard does with it (the persist handshake) is
//! `handshake.rs`.

use super::objects::HeldQueue;
use super::{ObjectActor, ReplacementCounts};
use crate::audit::{AuditEntry, AuditRecord};
use crate::decision::Decision;
use crate::write::{AuditRow, HeldKey, Write};
use std::collections::VecDeque;
use std::sync::Arc;
/// Uncommitted writes and how to undo them.
#[derive(Default)]
pub(crate) struct Journal {
    /// What the store must commit, in step order: the steps run since the
    /// last [`Shard::take_writes`](super::Shard::take_writes).
    pub(crate) writes: Vec<Write>,
    /// Before-images of every step not yet reported committed, undone in
    /// reverse order on a failed commit.
    pub(super) undo: Vec<Undo>,
    /// Objects the uncommitted steps read or wrote (reloaded after a conflict).
    pub(crate) objects: Vec<Arc<str>>,
    /// Event identities the uncommitted steps looked up (reloaded after a conflict).
    pub(crate) receipts: Vec<Arc<str>>,
    /// Held events (object, row) whose bodies leave memory once their
    /// group commits, when bodies stay in the store
    /// ([`Shard::bodies_in_store`](super::Shard::bodies_in_store)): holds the steps made, and bodies read
    /// back to be decided again.
    pub(crate) bodies: Vec<(Arc<str>, HeldKey)>,
    /// Where each group taken by [`Shard::take_writes`](super::Shard::take_writes) and not yet reported
    /// committed ends in the three lists above, oldest first: a commit
    /// forgets exactly its own group's before-images, never those of the
    /// steps decided on top of it.
    pub(super) taken: VecDeque<Cut>,
    /// The number the next [`Shard::take_writes`](super::Shard::take_writes) gives its group (kept
    /// across a rollback, so a group taken before it is never mistaken for
    /// one taken after).
    pub(super) next_group: u64,
}

/// A group of steps closed by [`Shard::take_writes`](super::Shard::take_writes): its number and the
/// writes to commit in one transaction. It must come back to the shard,
/// by [`Shard::committed`](super::Shard::committed) once the writes are durable or by
/// [`Shard::rolled_back`](super::Shard::rolled_back) when they are not; the oldest taken group first.
#[must_use = "a taken group must be reported with Shard::committed or Shard::rolled_back"]
#[derive(Debug)]
pub struct PendingGroup {
    /// Its place among the shard's groups, from 1 (0: taken without a journal).
    pub(super) number: u64,
    /// The writes of its steps, in step order, until handed over.
    pub(super) writes: Vec<Write>,
}

impl PendingGroup {
    /// The group's number: 1 for the shard's first taken group, then one
    /// more for each (0 without a journal).
    pub fn number(&self) -> u64 {
        self.number
    }

    /// Whether the group's steps changed nothing a store keeps (it must
    /// still be reported, as committed: there is nothing to fail).
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// The writes not handed over yet, in step order.
    pub fn writes(&self) -> &[Write] {
        &self.writes
    }

    /// Takes the writes out, to hand them to the store; the group itself
    /// stays with the driver, to be reported.
    pub fn hand_over(&mut self) -> Vec<Write> {
        std::mem::take(&mut self.writes)
    }
}

/// The end of one taken group in a [`Journal`]'s lists.
#[derive(Clone, Copy)]
pub(super) struct Cut {
    /// The group's number.
    pub(super) number: u64,
    /// Length of `undo` when the group was taken.
    pub(super) undo: usize,
    /// Length of `objects` then.
    pub(super) objects: usize,
    /// Length of `receipts` then.
    pub(super) receipts: usize,
    /// Length of `bodies` then.
    pub(super) bodies: usize,
}

/// One before-image, undone in reverse order on a failed commit.
pub(super) enum Undo {
    /// The object as it was (`None`: it did not exist).
    Object(Arc<str>, Option<ObjectActor>),
    /// The object's parked events as they were.
    Parked(Arc<str>, Option<HeldQueue>),
    /// Lengths of the append-only lists and the counters.
    Lengths {
        audit: u64,
        malformed: usize,
        superseded: usize,
        parked_total: usize,
        parked_bytes: usize,
        counters: ReplacementCounts,
        replacements: u64,
        tapped: usize,
    },
    /// A first record this step put in the shared registry: event identity,
    /// fingerprint, first seen.
    Identity(Arc<str>, u128, std::time::SystemTime),
    /// A variant this step recorded in the shared registry.
    Variant(Arc<str>, u128),
}

/// What the rolled-back steps read or wrote: the rows to reload from the
/// store before deciding again after a conflict.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Touched {
    /// Objects the steps read or wrote.
    pub objects: Vec<Arc<str>>,
    /// Event identities the steps looked up in the registry (their
    /// receipts and variants are reloaded).
    pub receipts: Vec<Arc<str>>,
}

/// The store's row for a replacement (history and outbox).
pub(crate) fn effect_row(origin: u64, r: &crate::engine::EffectRecord) -> crate::write::EffectRow {
    crate::write::EffectRow {
        key: HeldKey { origin, seq: r.seq },
        at: r.at,
        object_id: r.object_id.clone(),
        version: r.version,
        state: r.state.compact(),
        cause_event: match &r.cause {
            crate::engine::Cause::Event(id) => Some(id.clone()),
            crate::engine::Cause::Authority(_) => None,
        },
        trace: r.trace.clone(),
    }
}

/// The store's row for an audit record.
pub(crate) fn audit_row(origin: u64, record: &AuditRecord) -> AuditRow {
    let mut row = AuditRow {
        key: HeldKey {
            origin,
            seq: record.seq,
        },
        at: record.at,
        event_id: record.event_id.clone(),
        object_id: record.object_id.clone(),
        kind: "",
        decision: None,
        version: None,
        replacement: false,
        detail: None,
        body: None,
    };
    match &record.entry {
        AuditEntry::Delivery {
            decision,
            version,
            replacement,
            created,
            body,
        } => {
            row.kind = "delivery";
            if *created {
                row.detail = Some("created: the object was unknown".to_owned());
            }
            row.decision = Some(match decision {
                Decision::Duplicate { original } => format!("duplicate:{}", original.code()),
                d => d.as_verdict().map_or_else(String::new, |v| v.code()),
            });
            row.version = *version;
            row.replacement = *replacement;
            row.body = Some(Arc::from(body.as_bytes()));
        }
        AuditEntry::Malformed { bytes, error } => {
            row.kind = "malformed";
            row.decision = Some("held:malformed".to_owned());
            row.detail = Some(error.clone());
            row.body = Some(bytes.clone());
        }
        AuditEntry::Paused { cause_event } => {
            row.kind = "paused";
            row.detail = Some(format!("variant of {cause_event}"));
        }
        AuditEntry::Authority {
            version,
            previous,
            as_of,
            replacement,
            forced,
        } => {
            row.kind = "authority";
            row.version = Some(*version);
            row.replacement = *replacement;
            let as_of = crate::clock::format_rfc3339(*as_of);
            match forced {
                // The decision column marks the override; the body keeps the
                // state it replaced, so the stored row alone can undo it.
                Some(over) => {
                    row.decision = Some("forced".to_owned());
                    row.detail = Some(format!(
                        "forced over version {}, state {}; as of {as_of}",
                        over.version, over.state
                    ));
                    row.body = Some(Arc::from(over.state.compact().as_bytes()));
                }
                None => {
                    let previous =
                        previous.map_or_else(|| "none (introduced)".to_owned(), |v| v.to_string());
                    let unchanged = if *replacement {
                        ""
                    } else {
                        "; equal to the object, nothing replaced"
                    };
                    row.detail = Some(format!(
                        "previous version {previous}; as of {as_of}{unchanged}"
                    ));
                }
            }
        }
        AuditEntry::AuthorityRefused { version, current } => {
            row.kind = "authority_refused";
            row.version = Some(*version);
            row.detail = Some(format!("older than the object's version {current}"));
        }
        AuditEntry::Reevaluated {
            held_as,
            decision,
            replacement,
        } => {
            row.kind = "reevaluated";
            row.decision = Some(decision.code());
            row.replacement = *replacement;
            row.detail = Some(format!("held as {}", held_as.code()));
        }
        AuditEntry::Unresolved {
            held_as,
            superseded_by,
        } => {
            row.kind = "unresolved";
            row.decision = Some(held_as.code());
            row.version = Some(*superseded_by);
        }
    }
    row
}
