//! One group commit's writes folded into the fewest rows, table by table.
//!
//! The shards hand the committer their steps' writes in step order: for a
//! busy object that is one conditional object write (or one check) per
//! delivery. Within one group, every step on an object after the first
//! starts from the row the previous step wrote, so the whole chain commits
//! exactly as well as one write would: the condition of the chain's first
//! step (the row as the shard read it from the store) and the row of its
//! last step. [`fold`] checks the chain link by link in memory and, when it
//! holds, gives one row (or one check) per object; the inserts (receipts,
//! held inputs, audit and replacement rows) are kept in step order, one list
//! per table, so a store can write each table with one statement.
//!
//! Writes the fold does not cover (seeds, pauses, authoritative snapshots,
//! held-status changes) and chains that do not link up are applied row by row
//! in step order instead, where every condition is checked by the database
//! as before: that path reports the same conflict the folded one would.

use super::{AuditRow, Expect, HeldRow, ObjectRow, ReceiptRow, ReplacementRow, Write};
use std::collections::HashMap;
use std::sync::Arc;

/// One object's net change in a group.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ObjectStep<'a> {
    /// The object.
    pub(crate) object_id: &'a Arc<str>,
    /// The version the row must have when the group commits: what the first
    /// decision of the group on this object read.
    pub(crate) read_version: u64,
    /// The pause flag the first decision read.
    pub(crate) read_paused: bool,
    /// The row after the group's last step on the object; `None`: the steps
    /// only read it (stale, equal, held), so it is checked, not written.
    pub(crate) row: Option<&'a ObjectRow>,
}

/// A group's writes, one list per table.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Group<'a> {
    /// Receipts of first deliveries, sorted by event identity (so that two
    /// processes inserting the same identities wait for each other in one
    /// order and cannot deadlock).
    pub(crate) receipts: Vec<&'a ReceiptRow>,
    /// One entry per object, sorted by object identity (the order a store
    /// takes their row locks in, for the same reason).
    pub(crate) objects: Vec<ObjectStep<'a>>,
    /// Held inputs, in step order.
    pub(crate) held: Vec<&'a HeldRow>,
    /// Audit rows, in step order.
    pub(crate) audit: Vec<&'a AuditRow>,
    /// State replacements, in step order.
    pub(crate) replacements: Vec<&'a ReplacementRow>,
}

/// Folds a group's writes; `None` when they must be applied row by row (a
/// write the fold does not cover, or an object whose steps do not chain).
pub(crate) fn fold(writes: &[Write]) -> Option<Group<'_>> {
    let mut group = Group::default();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for write in writes {
        match write {
            Write::Receipt(r) => group.receipts.push(r),
            Write::Held(h) => group.held.push(h),
            Write::Audit(a) => group.audit.push(a),
            Write::Replacement(r) => group.replacements.push(r),
            Write::Object {
                row,
                expect: Expect::Version { version, paused },
            } => step(
                &mut group,
                &mut index,
                &row.object_id,
                *version,
                *paused,
                Some(row),
            )?,
            Write::Check {
                object_id,
                version,
                paused,
            } => step(&mut group, &mut index, object_id, *version, *paused, None)?,
            Write::Object {
                expect: Expect::AtMost(_),
                ..
            }
            | Write::Seed(_)
            | Write::Pause { .. }
            | Write::HeldStatus { .. } => return None,
        }
    }
    group
        .receipts
        .sort_unstable_by(|a, b| a.event_id.cmp(&b.event_id));
    group
        .objects
        .sort_unstable_by(|a, b| a.object_id.cmp(b.object_id));
    Some(group)
}

/// Adds one step on an object: the first sets the condition, each later one
/// must start from the row the previous step left (`None` if it does not).
fn step<'a>(
    group: &mut Group<'a>,
    index: &mut HashMap<&'a str, usize>,
    object_id: &'a Arc<str>,
    version: u64,
    paused: bool,
    row: Option<&'a ObjectRow>,
) -> Option<()> {
    match index.get(&**object_id) {
        None => {
            index.insert(object_id, group.objects.len());
            group.objects.push(ObjectStep {
                object_id,
                read_version: version,
                read_paused: paused,
                row,
            });
        }
        Some(&i) => {
            let o = &mut group.objects[i];
            let (now_version, now_paused) = o
                .row
                .map_or((o.read_version, o.read_paused), |r| (r.version, r.paused));
            if (now_version, now_paused) != (version, paused) {
                return None;
            }
            if row.is_some() {
                o.row = row;
            }
        }
    }
    Some(())
}

#[cfg(all(test, not(snapshot_receiver_loom)))]
mod tests {
    use super::*;
    use crate::decision::Verdict;
    use crate::store::HeldKey;
    use std::time::UNIX_EPOCH;

    fn row(id: &str, version: u64, paused: bool) -> ObjectRow {
        ObjectRow {
            object_id: Arc::from(id),
            version,
            state: format!("{{\"v\":{version}}}"),
            paused,
        }
    }

    fn update(id: &str, from: u64, to: u64) -> Write {
        Write::Object {
            row: row(id, to, false),
            expect: Expect::Version {
                version: from,
                paused: false,
            },
        }
    }

    fn check(id: &str, version: u64) -> Write {
        Write::Check {
            object_id: Arc::from(id),
            version,
            paused: false,
        }
    }

    fn receipt(event: &str) -> Write {
        Write::Receipt(ReceiptRow {
            event_id: Arc::from(event),
            fingerprint: 7,
            object_id: Arc::from("b"),
            decision: Verdict::Applied,
            first_seen: UNIX_EPOCH,
        })
    }

    /// (object, read version, row version or None) per object, in order.
    fn net(group: &Group<'_>) -> Vec<(String, u64, Option<u64>)> {
        group
            .objects
            .iter()
            .map(|o| {
                (
                    o.object_id.to_string(),
                    o.read_version,
                    o.row.map(|r| r.version),
                )
            })
            .collect()
    }

    #[test]
    fn a_chain_of_steps_on_one_object_becomes_its_first_condition_and_last_row() {
        let writes = [
            receipt("e-2"),
            update("b", 4, 5),
            check("b", 5),
            receipt("e-1"),
            check("a", 9),
            update("b", 5, 8),
            check("b", 8),
        ];
        let group = fold(&writes).expect("the chain links up");
        assert_eq!(
            net(&group),
            [("a".to_owned(), 9, None), ("b".to_owned(), 4, Some(8))]
        );
        let events: Vec<&str> = group.receipts.iter().map(|r| &*r.event_id).collect();
        assert_eq!(events, ["e-1", "e-2"]);
    }

    #[test]
    fn a_step_that_does_not_start_from_the_previous_row_goes_row_by_row() {
        // The second update assumed version 4, but the first left 5: applied
        // in order, its condition fails, and the row-by-row path says so.
        assert_eq!(fold(&[update("b", 4, 5), update("b", 4, 6)]), None);
        assert_eq!(fold(&[check("b", 4), update("b", 5, 6)]), None);
        let paused = Write::Check {
            object_id: Arc::from("b"),
            version: 5,
            paused: true,
        };
        assert_eq!(fold(&[update("b", 4, 5), paused]), None);
    }

    #[test]
    fn writes_outside_the_sets_send_the_group_row_by_row() {
        let others = [
            Write::Seed(row("a", 0, false)),
            Write::Pause {
                object_id: Arc::from("a"),
            },
            Write::Object {
                row: row("a", 3, false),
                expect: Expect::AtMost(3),
            },
            Write::HeldStatus {
                key: HeldKey { origin: 1, seq: 2 },
                status: crate::store::HeldStatus::Resolved,
                superseded_by: None,
            },
        ];
        for other in others {
            assert_eq!(fold(&[update("b", 4, 5), other]), None);
        }
    }
}
