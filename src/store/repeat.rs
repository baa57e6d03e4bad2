//! Exact repeats of a stored body (docs/CONTRACT.md §9: a body is stored
//! once), shared by both backends. A redelivery whose bytes equal those of
//! a delivery this process committed recently does not store them again:
//! its audit row's `body` is `NULL` and `body_seq` names the audit row of
//! the same origin that holds them. Every read returns the body as before
//! (`coalesce` with that row's, see [`crate::store::rows`]), and the audit
//! purge copies the bytes into the rows that point at a row before it
//! deletes it.
//!
//! A redelivery in the same transaction as its first copy points at it
//! (the bytes compared here). Across transactions, the store keeps the
//! hashes of the last [`CAPACITY`] bodies it committed in place; a hash
//! only proposes a row: the backend's insert checks, in the transaction,
//! that the row is still there with exactly these bytes, and stores them in
//! place otherwise.

use super::{AuditRow, HeldKey};
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};

/// How many committed bodies a store remembers by hash: 16,384 entries,
/// about 1 MiB (a redelivery comes within seconds of its first copy).
const CAPACITY: usize = 16_384;

/// The recent bodies a store committed in place, by hash of their bytes.
#[derive(Debug, Default)]
pub(crate) struct RecentBodies {
    /// Hash of a body → the audit row that holds it in place.
    by_hash: HashMap<u64, HeldKey>,
    /// The hashes in the order remembered, oldest first.
    order: VecDeque<(u64, HeldKey)>,
}

/// Whether `a` keeps a delivery's bytes that a later copy may repeat: the
/// audit row of a delivery or a malformed body, with its body.
fn holds_delivery(a: &AuditRow) -> bool {
    (a.kind == "delivery" || a.kind == "malformed") && a.body.is_some()
}

/// Whether `a` is a redelivery (a `duplicate` decision): only a delivery
/// of an identity already recorded can repeat another's bytes. It replaced
/// no state, so no history row points into its body.
fn is_repeat(a: &AuditRow) -> bool {
    holds_delivery(a)
        && !a.replacement
        && a.decision
            .as_deref()
            .is_some_and(|d| d.starts_with("duplicate"))
}

fn hash(body: &[u8]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    body.hash(&mut h);
    h.finish()
}

/// Where an audit row's body goes ([`RecentBodies::plan`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Placement {
    /// In the row's own `body`.
    InPlace,
    /// Nowhere: the row of this sequence number (same origin), written by
    /// the same transaction, holds exactly these bytes.
    Same(i64),
    /// Nowhere if the committed row of this sequence number (same origin)
    /// still holds exactly these bytes, which the insert checks; in place
    /// otherwise.
    Check(i64),
}

/// The placements of one transaction's audit rows, by key (rows without
/// one: in place).
#[derive(Debug, Default)]
pub(crate) struct Plan(HashMap<HeldKey, Placement>);

impl Plan {
    /// Where `a`'s body goes.
    pub(crate) fn of(&self, a: &AuditRow) -> Placement {
        self.0.get(&a.key).copied().unwrap_or(Placement::InPlace)
    }
}

impl RecentBodies {
    /// Where the bodies of `rows` (one transaction's, in insert order) go:
    /// a redelivery repeats a row of the same transaction with exactly its
    /// bytes (compared here) or, failing that, may repeat a committed one
    /// this store remembers by hash (compared by the insert); every other
    /// body stays in place.
    pub(crate) fn plan<'a>(&self, rows: impl IntoIterator<Item = &'a AuditRow>) -> Plan {
        let mut plan = HashMap::new();
        let mut here: HashMap<u64, Vec<&'a AuditRow>> = HashMap::new();
        for a in rows {
            let Some(body) = a.body.as_deref().filter(|_| holds_delivery(a)) else {
                continue;
            };
            let h = hash(body);
            let placement = if is_repeat(a) {
                let same = here.get(&h).and_then(|rows| {
                    rows.iter()
                        .find(|r| r.key.origin == a.key.origin && r.body.as_deref() == Some(body))
                });
                match (same, self.by_hash.get(&h)) {
                    (Some(r), _) => Placement::Same(r.key.seq as i64),
                    (None, Some(k)) if k.origin == a.key.origin && k.seq < a.key.seq => {
                        Placement::Check(k.seq as i64)
                    }
                    _ => Placement::InPlace,
                }
            } else {
                Placement::InPlace
            };
            if placement == Placement::InPlace {
                here.entry(h).or_default().push(a);
            }
            plan.insert(a.key, placement);
        }
        Plan(plan)
    }

    /// After the commit of `rows` as `plan` placed them: remembers the
    /// bodies stored in place, forgetting the oldest past [`CAPACITY`].
    pub(crate) fn remember<'a>(
        &mut self,
        rows: impl IntoIterator<Item = &'a AuditRow>,
        plan: &Plan,
    ) {
        let fresh: Vec<(u64, HeldKey)> = rows
            .into_iter()
            .filter(|a| holds_delivery(a) && plan.of(a) == Placement::InPlace)
            .filter_map(|a| Some((hash(a.body.as_deref()?), a.key)))
            .collect();
        for (h, key) in fresh {
            self.by_hash.insert(h, key);
            self.order.push_back((h, key));
            if self.order.len() > CAPACITY {
                if let Some((old, old_key)) = self.order.pop_front() {
                    if self.by_hash.get(&old) == Some(&old_key) {
                        self.by_hash.remove(&old);
                    }
                }
            }
        }
    }
}

/// The audit rows of one transaction's `writes`, in insert order (folded
/// or not, a group inserts its audit rows in step order).
pub(crate) fn audit_rows(writes: &[super::Write]) -> Vec<&AuditRow> {
    writes
        .iter()
        .filter_map(|w| match w {
            super::Write::Audit(a) => Some(a),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::UNIX_EPOCH;

    fn row(seq: u64, decision: &str, body: &[u8]) -> AuditRow {
        AuditRow {
            key: HeldKey { origin: 7, seq },
            at: UNIX_EPOCH,
            event_id: Some(Arc::from("e-1")),
            object_id: Some(Arc::from("card-1")),
            kind: "delivery",
            decision: Some(decision.to_owned()),
            version: Some(1),
            replacement: false,
            detail: None,
            body: Some(Arc::from(body)),
        }
    }

    /// The placement of `a` alone in a transaction after `recent`.
    fn alone(recent: &RecentBodies, a: &AuditRow) -> Placement {
        recent.plan([a]).of(a)
    }

    #[test]
    fn a_redelivery_of_committed_bytes_points_at_their_row() {
        let mut recent = RecentBodies::default();
        let first = row(3, "stale", b"{\"a\":1}");
        let again = row(4, "duplicate:stale", b"{\"a\":1}");
        assert_eq!(alone(&recent, &again), Placement::InPlace);
        recent.remember([&first], &recent.plan([&first]));
        assert_eq!(alone(&recent, &again), Placement::Check(3));
        // Other bytes, another origin, or a first record: in place.
        let spaced = row(4, "duplicate:stale", b"{\"a\": 1}");
        assert_eq!(alone(&recent, &spaced), Placement::InPlace);
        let mut other = row(4, "duplicate:stale", b"{\"a\":1}");
        other.key.origin = 8;
        assert_eq!(alone(&recent, &other), Placement::InPlace);
        assert_eq!(
            alone(&recent, &row(4, "stale", b"{\"a\":1}")),
            Placement::InPlace
        );
        // A row that points is not remembered: the next copy points at 3.
        let plan = recent.plan([&again]);
        recent.remember([&again], &plan);
        assert_eq!(
            alone(&recent, &row(5, "duplicate:stale", b"{\"a\":1}")),
            Placement::Check(3)
        );
    }

    #[test]
    fn a_redelivery_in_the_same_transaction_points_at_its_first_copy() {
        let recent = RecentBodies::default();
        let rows = [
            row(3, "applied", b"{\"a\":1}"),
            row(4, "duplicate:applied", b"{\"a\": 1}"),
            row(5, "duplicate:applied", b"{\"a\":1}"),
            row(6, "duplicate:applied", b"{\"a\": 1}"),
        ];
        let plan = recent.plan(&rows);
        let placed: Vec<Placement> = rows.iter().map(|a| plan.of(a)).collect();
        assert_eq!(
            placed,
            [
                Placement::InPlace,
                Placement::InPlace,
                Placement::Same(3),
                Placement::Same(4)
            ]
        );
    }

    #[test]
    fn the_oldest_bodies_are_forgotten_past_the_capacity() {
        let mut recent = RecentBodies::default();
        let rows: Vec<AuditRow> = (0..=CAPACITY as u64)
            .map(|i| row(i + 1, "applied", i.to_string().as_bytes()))
            .collect();
        let plan = recent.plan(&rows);
        recent.remember(&rows, &plan);
        let last = CAPACITY as u64 + 1;
        let again = |i: u64| row(last + 1, "duplicate:applied", i.to_string().as_bytes());
        assert_eq!(alone(&recent, &again(0)), Placement::InPlace);
        assert_eq!(alone(&recent, &again(1)), Placement::Check(2));
        assert_eq!(
            alone(&recent, &again(CAPACITY as u64)),
            Placement::Check(last as i64)
        );
        assert_eq!(recent.by_hash.len(), CAPACITY);
    }
}
