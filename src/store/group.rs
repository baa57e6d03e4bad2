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
//! A pause (a variant of one of the object's events was seen, possibly by
//! another shard) sets the flag whatever the version: folded too, it leaves
//! the row's version as the condition of the next decision that reads it.
//!
//! Writes the fold does not cover (seeds, authoritative snapshots,
//! held-status changes: build time and reconciliation; the creation of an
//! object by its first versioned snapshot; a variant's pause of another
//! shard's object) cut the group into [`parts`]: each run between them is
//! folded on its own, and they are applied alone, in step order, in the
//! same transaction, so that a run's conditions read the rows the parts
//! before it left. A run whose chains do not link up is applied row by row
//! in step order instead, where every condition is checked by the database
//! as before: that path reports the same conflict the folded one would.

use super::{AuditRow, EffectRow, Expect, HeldRow, ObjectRow, ReceiptRow, VariantRow, Write};
use std::borrow::Cow;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

/// One part of a group's writes, applied in order within the group's
/// transaction.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Part<'a> {
    /// A run of consecutive writes, folded (one write or check per object,
    /// one list per table).
    Folded(Group<'a>),
    /// Consecutive writes applied one by one, in step order: writes the
    /// fold does not cover, or a run whose chains do not link up.
    Rows(&'a [Write]),
}

/// Cuts a group's writes into the fewest [`Part`]s: the runs between the
/// writes [`fold`] does not cover, each folded when its chains link up, and
/// those writes on their own. Applied in order, the parts write what the
/// writes applied one by one would.
pub(crate) fn parts(writes: &[Write]) -> Vec<Part<'_>> {
    let mut cuts: Vec<(Range<usize>, bool)> = Vec::new();
    let mut start = 0;
    for (i, write) in writes.iter().enumerate() {
        if !foldable(write) {
            cuts.push((start..i, true));
            cuts.push((i..i + 1, false));
            start = i + 1;
        }
    }
    cuts.push((start..writes.len(), true));
    let mut parts: Vec<Part<'_>> = Vec::new();
    let mut rows: Option<Range<usize>> = None;
    for (range, fold_it) in cuts {
        if range.is_empty() {
            continue;
        }
        let folded = if fold_it {
            fold(&writes[range.clone()])
        } else {
            None
        };
        match folded {
            Some(group) => {
                if let Some(r) = rows.take() {
                    parts.push(Part::Rows(&writes[r]));
                }
                parts.push(Part::Folded(group));
            }
            // Adjacent row-by-row writes form one part.
            None => match &mut rows {
                Some(r) => r.end = range.end,
                None => rows = Some(range),
            },
        }
    }
    if let Some(r) = rows {
        parts.push(Part::Rows(&writes[r]));
    }
    parts
}

/// Whether [`fold`] covers this write.
fn foldable(write: &Write) -> bool {
    !matches!(
        write,
        Write::Object {
            expect: Expect::Absent,
            ..
        } | Write::Seed(_)
            | Write::HeldStatus { .. }
            | Write::PauseIfStored { .. }
    )
}

/// What a group leaves in one object's row.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ObjectWrite<'a> {
    /// Nothing: the group's steps only read the row (stale, equal, held),
    /// so it is checked, not written.
    Check,
    /// Only the pause flag is set (a variant of one of its events was seen).
    Pause,
    /// The whole row after the group's last step on it.
    Row(Cow<'a, ObjectRow>),
}

/// One object's net change in a group.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ObjectStep<'a> {
    /// The object.
    pub(crate) object_id: &'a Arc<str>,
    /// The version the stored row must have when the group commits: what
    /// the group's first decision on the object read. `None`: any version
    /// (the group only paused the object, no decision read it).
    pub(crate) read_version: Option<u64>,
    /// The pause flag the stored row must have (`None`: any, as above).
    pub(crate) read_paused: Option<bool>,
    /// What the group leaves in the row.
    pub(crate) write: ObjectWrite<'a>,
}

impl ObjectStep<'_> {
    /// Version and pause flag after the steps so far (`None`: as stored).
    fn now(&self) -> (Option<u64>, Option<bool>) {
        match &self.write {
            ObjectWrite::Check => (self.read_version, self.read_paused),
            ObjectWrite::Pause => (self.read_version, Some(true)),
            ObjectWrite::Row(r) => (Some(r.version), Some(r.paused)),
        }
    }
}

/// A group's writes, one list per table.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Group<'a> {
    /// Receipts of first deliveries, sorted by event identity (so that two
    /// processes inserting the same identities wait for each other in one
    /// order and cannot deadlock).
    pub(crate) receipts: Vec<&'a ReceiptRow>,
    /// Variants of event identities, sorted by event identity and
    /// fingerprint (the same reason).
    pub(crate) variants: Vec<&'a VariantRow>,
    /// One entry per object, sorted by object identity (the order a store
    /// takes their row locks in, for the same reason).
    pub(crate) objects: Vec<ObjectStep<'a>>,
    /// Held inputs, in step order.
    pub(crate) held: Vec<&'a HeldRow>,
    /// Audit rows, in step order.
    pub(crate) audit: Vec<&'a AuditRow>,
    /// State replacements, in step order.
    pub(crate) replacements: Vec<&'a EffectRow>,
}

/// One step's use of an object row.
enum Use<'a> {
    /// A decision read the row as (version, paused) and, with `Some`, wrote
    /// this row.
    Read(u64, bool, Option<&'a ObjectRow>),
    /// An unconditional pause.
    Pause,
}

/// Folds a run of writes; `None` when they must be applied row by row (a
/// write the fold does not cover, or an object whose steps do not chain).
fn fold(writes: &[Write]) -> Option<Group<'_>> {
    let mut group = Group::default();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for write in writes {
        let (object_id, what) = match write {
            Write::Receipt(r) => {
                group.receipts.push(r);
                continue;
            }
            Write::Variant(v) => {
                group.variants.push(v);
                continue;
            }
            Write::Held(h) => {
                group.held.push(h);
                continue;
            }
            Write::Audit(a) => {
                group.audit.push(a);
                continue;
            }
            Write::Effect(r) => {
                group.replacements.push(r);
                continue;
            }
            Write::Object {
                row,
                expect: Expect::Version { version, paused },
            } => (&row.object_id, Use::Read(*version, *paused, Some(row))),
            Write::Check {
                object_id,
                version,
                paused,
            } => (object_id, Use::Read(*version, *paused, None)),
            Write::Pause { object_id } => (object_id, Use::Pause),
            Write::Object {
                expect: Expect::Absent,
                ..
            }
            | Write::Seed(_)
            | Write::HeldStatus { .. }
            // Another shard's object, paused only if stored: a variant's
            // rare write, applied row by row.
            | Write::PauseIfStored { .. } => return None,
        };
        step(&mut group, &mut index, object_id, what)?;
    }
    group
        .receipts
        .sort_unstable_by(|a, b| a.event_id.cmp(&b.event_id));
    group
        .variants
        .sort_unstable_by(|a, b| (&a.event_id, a.fingerprint).cmp(&(&b.event_id, b.fingerprint)));
    group
        .objects
        .sort_unstable_by(|a, b| a.object_id.cmp(b.object_id));
    Some(group)
}

/// Adds one step on an object: the first sets the condition, each later one
/// must start from the row the previous steps left (`None` if it does not).
fn step<'a>(
    group: &mut Group<'a>,
    index: &mut HashMap<&'a str, usize>,
    object_id: &'a Arc<str>,
    what: Use<'a>,
) -> Option<()> {
    let Some(&i) = index.get(&**object_id) else {
        index.insert(object_id, group.objects.len());
        group.objects.push(match what {
            Use::Read(version, paused, row) => ObjectStep {
                object_id,
                read_version: Some(version),
                read_paused: Some(paused),
                write: row.map_or(ObjectWrite::Check, |r| ObjectWrite::Row(Cow::Borrowed(r))),
            },
            Use::Pause => ObjectStep {
                object_id,
                read_version: None,
                read_paused: None,
                write: ObjectWrite::Pause,
            },
        });
        return Some(());
    };
    let o = &mut group.objects[i];
    match what {
        Use::Read(version, paused, row) => {
            let (now_version, now_paused) = o.now();
            match now_version {
                Some(v) if v != version => return None,
                // Only paused so far: the stored version is what this decision read.
                None => o.read_version = Some(version),
                Some(_) => {}
            }
            match now_paused {
                Some(p) if p != paused => return None,
                None => o.read_paused = Some(paused),
                Some(_) => {}
            }
            if let Some(row) = row {
                o.write = ObjectWrite::Row(Cow::Borrowed(row));
            }
        }
        Use::Pause => {
            o.write = match std::mem::replace(&mut o.write, ObjectWrite::Check) {
                ObjectWrite::Check | ObjectWrite::Pause => ObjectWrite::Pause,
                ObjectWrite::Row(row) => {
                    let mut row = row.into_owned();
                    row.paused = true;
                    ObjectWrite::Row(Cow::Owned(row))
                }
            };
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::HeldKey;
    use crate::Verdict;
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
            retention_cutoff: None,
        })
    }

    /// (object, read version, read pause flag, what is written) per object, in order.
    fn net(group: &Group<'_>) -> Vec<(String, Option<u64>, Option<bool>, String)> {
        group
            .objects
            .iter()
            .map(|o| {
                let write = match &o.write {
                    ObjectWrite::Check => "check".to_owned(),
                    ObjectWrite::Pause => "pause".to_owned(),
                    ObjectWrite::Row(r) => format!("v{} paused {}", r.version, r.paused),
                };
                (
                    o.object_id.to_string(),
                    o.read_version,
                    o.read_paused,
                    write,
                )
            })
            .collect()
    }

    fn pause(id: &str) -> Write {
        Write::Pause {
            object_id: Arc::from(id),
        }
    }

    fn variant(event: &str, fingerprint: u128) -> Write {
        Write::Variant(VariantRow {
            event_id: Arc::from(event),
            fingerprint,
            object_id: Arc::from("b"),
            first_seen: UNIX_EPOCH,
        })
    }

    #[test]
    fn variants_fold_into_their_own_list_in_key_order() {
        let writes = [
            variant("e-2", 1),
            update("b", 4, 5),
            variant("e-1", 9),
            pause("b"),
            variant("e-1", 3),
        ];
        let group = fold(&writes).expect("variants and pauses fold");
        let keys: Vec<(&str, u128)> = group
            .variants
            .iter()
            .map(|v| (&*v.event_id, v.fingerprint))
            .collect();
        assert_eq!(keys, [("e-1", 3), ("e-1", 9), ("e-2", 1)]);
        assert_eq!(
            net(&group),
            [(
                "b".to_owned(),
                Some(4),
                Some(false),
                "v5 paused true".to_owned()
            )]
        );
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
            [
                ("a".to_owned(), Some(9), Some(false), "check".to_owned()),
                (
                    "b".to_owned(),
                    Some(4),
                    Some(false),
                    "v8 paused false".to_owned()
                )
            ]
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
    fn a_pause_keeps_the_version_as_the_condition_of_the_next_decision() {
        let paused_update = Write::Object {
            row: row("c", 6, true),
            expect: Expect::Version {
                version: 5,
                paused: true,
            },
        };
        let writes = [
            update("a", 4, 5),
            pause("a"),
            check("b", 2),
            pause("b"),
            pause("c"),
            paused_update,
            pause("d"),
        ];
        let group = fold(&writes).expect("the chains link up");
        assert_eq!(
            net(&group),
            [
                (
                    "a".to_owned(),
                    Some(4),
                    Some(false),
                    "v5 paused true".to_owned()
                ),
                ("b".to_owned(), Some(2), Some(false), "pause".to_owned()),
                // Paused first: the stored version must be the one the
                // decision after the pause read; the flag is set either way.
                ("c".to_owned(), Some(5), None, "v6 paused true".to_owned()),
                ("d".to_owned(), None, None, "pause".to_owned()),
            ]
        );
        // After a pause, a decision that saw the object running does not chain.
        assert_eq!(fold(&[pause("e"), check("e", 3)]), None);
    }

    /// Which parts a group is cut into: `F` a folded run (its objects),
    /// `R` writes applied one by one (how many).
    fn shape(writes: &[Write]) -> Vec<String> {
        parts(writes)
            .iter()
            .map(|p| match p {
                Part::Folded(g) => {
                    let ids: Vec<&str> = g.objects.iter().map(|o| &**o.object_id).collect();
                    format!("F{ids:?}")
                }
                Part::Rows(rows) => format!("R{}", rows.len()),
            })
            .collect()
    }

    fn introduce(id: &str) -> Write {
        Write::Object {
            row: row(id, 1, false),
            expect: Expect::Absent,
        }
    }

    fn resolve(seq: u64) -> Write {
        Write::HeldStatus {
            key: HeldKey { origin: 1, seq },
            status: crate::store::HeldStatus::Resolved,
            superseded_by: None,
        }
    }

    #[test]
    fn writes_outside_the_fold_cut_the_group_and_the_runs_between_fold() {
        let others = [
            Write::Seed(row("a", 0, false)),
            resolve(2),
            introduce("c"),
            Write::PauseIfStored {
                event_id: Arc::from("e-1"),
                fingerprint: 3,
                object_id: Arc::from("c"),
                audit: crate::store::AuditRow {
                    key: HeldKey { origin: 1, seq: 3 },
                    at: UNIX_EPOCH,
                    event_id: None,
                    object_id: None,
                    kind: "pause",
                    decision: None,
                    version: None,
                    replacement: false,
                    detail: None,
                    body: None,
                },
            },
        ];
        for other in others {
            let writes = [update("b", 4, 5), other, update("b", 5, 6), check("d", 1)];
            assert_eq!(shape(&writes), ["F[\"b\"]", "R1", "F[\"b\", \"d\"]"]);
        }
        // Only such writes: one part, row by row.
        assert_eq!(shape(&[resolve(1), resolve(2)]), ["R2"]);
        assert_eq!(shape(&[]), Vec::<String>::new());
    }

    #[test]
    fn adjacent_row_by_row_writes_form_one_part() {
        // Two writes outside the fold side by side, then a run whose chain
        // does not link: all three parts are one, in order.
        let writes = [
            update("a", 1, 2),
            resolve(1),
            introduce("c"),
            update("b", 4, 5),
            update("b", 4, 6),
            resolve(2),
            check("a", 2),
        ];
        assert_eq!(shape(&writes), ["F[\"a\"]", "R5", "F[\"a\"]"]);
        let Part::Rows(rows) = &parts(&writes)[1] else {
            panic!("the second part is row by row")
        };
        assert_eq!(*rows, &writes[1..6]);
    }
}
