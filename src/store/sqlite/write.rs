//! The SQLite commit path: a group's writes in one `IMMEDIATE`
//! transaction (folded, or row by row), and the purges.

use super::{failed, flag, SqliteStore};
use crate::store::group::{self, Group, ObjectWrite, Part};
use crate::store::outbox::RELAYS_PASSED;
use crate::store::pointer::{self, StateAt};
use crate::store::repeat::{Placement, Plan};
use crate::store::rows::{
    changed, cutoff_ns, exists, first_record_not_stored, not_stored, receipt_recorded, time_ns,
    variant_recorded, version_text,
};
use crate::store::stats::PhaseClock;
use crate::store::{
    AuditRow, EffectRow, Expect, HeldKey, HeldRow, ObjectRow, ReceiptRow, Records, StoreError,
    VariantRow, Write,
};
use rusqlite::{params, OptionalExtension, TransactionBehavior};
use std::time::SystemTime;

/// Most free pages one `PRAGMA incremental_vacuum` returns to the file
/// system after a purge batch (4 KiB pages: 8 MiB), so that the batch's
/// transaction stays short.
const VACUUM_PAGES: u32 = 2048;

impl SqliteStore {
    /// One write of a row-by-row group; `bodies`: the group's delivery
    /// audit rows, where a replacement's state may lie; `plan`: where the
    /// audit rows' bodies go.
    pub(super) fn apply(
        tx: &rusqlite::Transaction<'_>,
        write: &Write,
        bodies: &std::collections::HashMap<HeldKey, &AuditRow>,
        plan: &Plan,
    ) -> Result<(), StoreError> {
        match write {
            Write::Receipt(r) => insert_receipt(tx, r)?,
            Write::Variant(v) => insert_variant(tx, v)?,
            Write::Object { row, expect } => match *expect {
                Expect::Version { version, paused } => write_object(tx, row, version, paused)?,
                Expect::Absent => {
                    if insert_object_if_absent(tx, row)? == 0 {
                        return Err(exists(&row.object_id));
                    }
                }
            },
            Write::Seed(row) => {
                insert_object_if_absent(tx, row)?;
            }
            Write::Pause { object_id } => {
                let n = tx
                    .prepare_cached("UPDATE objects SET paused = 1 WHERE object_id = ?1")
                    .and_then(|mut st| st.execute(params![&**object_id]))
                    .map_err(failed)?;
                if n == 0 {
                    return Err(not_stored(object_id));
                }
            }
            Write::PauseIfStored {
                event_id,
                fingerprint,
                object_id,
                audit,
            } => {
                let stored = tx
                    .prepare_cached(
                        "SELECT 1 FROM receipts WHERE event_id = ?1 AND fingerprint = ?2",
                    )
                    .and_then(|mut st| {
                        st.exists(params![&**event_id, &fingerprint.to_le_bytes()[..]])
                    })
                    .map_err(failed)?;
                if !stored {
                    return Err(first_record_not_stored(event_id));
                }
                let n = tx
                    .prepare_cached("UPDATE objects SET paused = 1 WHERE object_id = ?1")
                    .and_then(|mut st| st.execute(params![&**object_id]))
                    .map_err(failed)?;
                if n > 0 {
                    insert_audit(tx, audit, plan)?;
                }
            }
            Write::Check {
                object_id,
                version,
                paused,
            } => check_object(tx, object_id, *version, *paused)?,
            Write::Held(h) => insert_held(tx, h)?,
            Write::HeldStatus {
                key,
                status,
                superseded_by,
            } => {
                tx.prepare_cached(
                    "UPDATE held SET status = ?3, superseded_by = ?4 WHERE origin = ?1 AND seq = ?2",
                )
                .and_then(|mut st| {
                    st.execute(params![
                        key.origin as i64,
                        key.seq as i64,
                        status.as_str(),
                        superseded_by.map(version_text)
                    ])
                })
                .map_err(failed)?;
            }
            Write::Effect(r) => insert_replacement(tx, r, pointer::state_at(bodies, r))?,
            Write::Audit(a) => insert_audit(tx, a, plan)?,
        }
        Ok(())
    }

    /// A folded group: each table's rows together, one write (or check) per
    /// object; every statement prepared once per connection.
    fn apply_group(
        tx: &rusqlite::Transaction<'_>,
        group: &Group<'_>,
        bodies: &std::collections::HashMap<HeldKey, &AuditRow>,
        plan: &Plan,
    ) -> Result<(), StoreError> {
        for r in &group.receipts {
            insert_receipt(tx, r)?;
        }
        for v in &group.variants {
            insert_variant(tx, v)?;
        }
        for o in &group.objects {
            let read_version = o.read_version.map(version_text);
            let read_paused = o.read_paused.map(flag);
            // Each condition applies only when a decision of the group read
            // it (see `ObjectStep`); the row is found by its key either way.
            let n = match &o.write {
                ObjectWrite::Check => tx
                    .prepare_cached(
                        "SELECT count(*) FROM objects WHERE object_id = ?1
                         AND (?2 IS NULL OR version = ?2) AND (?3 IS NULL OR paused = ?3)",
                    )
                    .and_then(|mut st| {
                        st.query_row(params![&**o.object_id, read_version, read_paused], |r| {
                            r.get::<_, i64>(0)
                        })
                    })
                    .map(|n| n as usize),
                ObjectWrite::Pause => tx
                    .prepare_cached(
                        "UPDATE objects SET paused = 1 WHERE object_id = ?1
                         AND (?2 IS NULL OR version = ?2) AND (?3 IS NULL OR paused = ?3)",
                    )
                    .and_then(|mut st| {
                        st.execute(params![&**o.object_id, read_version, read_paused])
                    }),
                ObjectWrite::Row(row) => tx
                    .prepare_cached(
                        "UPDATE objects SET version = ?2, state = ?3, paused = ?4 WHERE object_id = ?1
                         AND (?5 IS NULL OR version = ?5) AND (?6 IS NULL OR paused = ?6)",
                    )
                    .and_then(|mut st| {
                        st.execute(params![
                            &**o.object_id,
                            version_text(row.version),
                            row.state,
                            flag(row.paused),
                            read_version,
                            read_paused
                        ])
                    }),
            }
            .map_err(failed)?;
            if n == 0 {
                return Err(changed(o.object_id));
            }
        }
        for h in &group.held {
            insert_held(tx, h)?;
        }
        for a in &group.audit {
            insert_audit(tx, a, plan)?;
        }
        for r in &group.replacements {
            insert_replacement(tx, r, pointer::state_at(bodies, r))?;
        }
        Ok(())
    }

    /// Runs `writes` in one transaction and commits it (`keep`) or rolls it
    /// back ([`crate::store::Store::probe`]).
    pub(super) fn run(&mut self, writes: &[Write], keep: bool) -> Result<(), StoreError> {
        let mut clock = PhaseClock::start();
        let parts = group::parts(writes);
        clock.lap(&mut self.phases.encode);
        // One transaction per group: with `synchronous=FULL`, one fsync.
        // Dropping `tx` on an error rolls the transaction back.
        let audit_rows = crate::store::repeat::audit_rows(writes);
        let plan = self.recent.plan(audit_rows.iter().copied());
        let bodies = pointer::delivery_bodies(audit_rows.iter().copied());
        let unfolded = &mut self.phases.unfolded;
        let executed = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(failed)
            .and_then(|tx| {
                for part in &parts {
                    match part {
                        Part::Folded(group) => Self::apply_group(&tx, group, &bodies, &plan)?,
                        Part::Rows(rows) => {
                            *unfolded += rows.len() as u64;
                            for w in *rows {
                                Self::apply(&tx, w, &bodies, &plan)?;
                            }
                        }
                    }
                }
                Ok(tx)
            });
        clock.lap(&mut self.phases.execute);
        if !keep {
            return executed.and_then(|tx| tx.rollback().map_err(failed));
        }
        let result = executed.and_then(|tx| tx.commit().map_err(failed));
        if result.is_ok() {
            self.recent.remember(audit_rows, &plan);
        }
        self.hold_at_bound();
        clock.lap(&mut self.phases.commit);
        result
    }

    pub(super) fn purge_identities(&mut self, before: SystemTime) -> Result<u64, StoreError> {
        let mut removed = 0;
        for table in ["receipts", "receipt_variants"] {
            removed += self
                .conn
                .execute(
                    &format!("DELETE FROM {table} WHERE first_seen_ns < ?1"),
                    [time_ns(before)],
                )
                .map(|n| n as u64)
                .map_err(failed)?;
        }
        Ok(removed)
    }

    pub(super) fn purge_batch(
        &mut self,
        records: Records,
        before: SystemTime,
        limit: usize,
    ) -> Result<u64, StoreError> {
        let before = time_ns(before);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(failed)?;
        let removed = match records {
            Records::Audit => purge_audit(&tx, before, limit)?,
            Records::History => tx
                .prepare_cached(&format!(
                    "DELETE FROM replacements WHERE rowid IN
                     (SELECT rowid FROM replacements WHERE at_ns < ?1 AND {RELAYS_PASSED}
                      ORDER BY at_ns LIMIT ?2)"
                ))
                .and_then(|mut st| st.execute(params![before, limit]))
                .map(|n| n as u64)
                .map_err(failed)?,
            Records::Resolved => tx
                .prepare_cached(
                    "DELETE FROM held WHERE rowid IN (SELECT rowid FROM held
                     WHERE status = 'resolved' AND at_ns < ?1 LIMIT ?2)",
                )
                .and_then(|mut st| st.execute(params![before, limit]))
                .map(|n| n as u64)
                .map_err(failed)?,
        };
        if removed > 0 {
            // Returns the pages the batch freed (a no-op on a store created
            // without `auto_vacuum`: see `purge --vacuum`).
            // Stepped to the end: the pragma frees one page per row it
            // returns (`execute_batch` would step it once).
            let mut st = tx
                .prepare(&format!("PRAGMA incremental_vacuum({VACUUM_PAGES})"))
                .map_err(failed)?;
            let mut pages = st.query([]).map_err(failed)?;
            while pages.next().map_err(failed)?.is_some() {}
            drop(pages);
            drop(st);
        }
        tx.commit().map_err(failed)?;
        self.hold_at_bound();
        Ok(removed)
    }
}

/// One batch of the audit purge: at most `limit` audit rows recorded before
/// `before` that justify nothing still held (docs/CONTRACT.md §9: not a row
/// of an event identity or step whose held row is not resolved, not a row
/// of a paused object), nor the rows of the highest sequence number, from
/// which a restarted receiver numbers its steps (so an outbox cursor stays
/// valid however much is purged). A history row
/// that takes its state from a deleted audit row gets the state copied in
/// first, and so does an audit row that takes its body from it. Returns the
/// rows deleted.
fn purge_audit(tx: &rusqlite::Transaction<'_>, before: i64, limit: i64) -> Result<u64, StoreError> {
    let rows: Vec<(i64, i64, i64)> = tx
        .prepare_cached(
            "SELECT a.rowid, a.origin, a.seq FROM audit AS a
             WHERE a.at_ns < ?1 AND a.seq < (SELECT max(seq) FROM audit)
               AND NOT EXISTS (SELECT 1 FROM held AS h WHERE h.status <> 'resolved'
                               AND h.origin = a.origin AND h.seq = a.seq)
               AND NOT EXISTS (SELECT 1 FROM held AS h WHERE h.status <> 'resolved'
                               AND h.event_id = a.event_id)
               AND NOT EXISTS (SELECT 1 FROM objects AS o WHERE o.paused = 1
                               AND o.object_id = a.object_id)
             ORDER BY a.at_ns LIMIT ?2",
        )
        .and_then(|mut st| {
            st.query_map(params![before, limit], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })?
            .collect()
        })
        .map_err(failed)?;
    let mut removed = 0;
    for (rowid, origin, seq) in &rows {
        tx.prepare_cached(
            "UPDATE replacements SET
                 state = (SELECT CAST(substr(a.body, replacements.state_at + 1, replacements.state_len) AS TEXT)
                          FROM audit AS a WHERE a.rowid = ?1),
                 state_at = NULL, state_len = NULL
             WHERE origin = ?2 AND seq = ?3 AND state_at IS NOT NULL",
        )
        .and_then(|mut st| st.execute(params![rowid, origin, seq]))
        .map_err(failed)?;
        // The rows whose body is this row's (a redelivery's exact bytes,
        // see `insert_audit`) take a copy of it.
        tx.prepare_cached(
            "UPDATE audit SET body = (SELECT a.body FROM audit AS a WHERE a.rowid = ?1), body_seq = NULL
             WHERE origin = ?2 AND body_seq = ?3",
        )
        .and_then(|mut st| st.execute(params![rowid, origin, seq]))
        .map_err(failed)?;
        removed += tx
            .prepare_cached("DELETE FROM audit WHERE rowid = ?1")
            .and_then(|mut st| st.execute([rowid]))
            .map_err(failed)? as u64;
    }
    Ok(removed)
}

/// Inserts a receipt, replacing one that expired by the row's retention
/// cut-off (docs/CONTRACT.md §5: the purge may not have run yet), and
/// deletes the variants recorded before it: they belonged to the expired
/// receipt (or to one already purged). A live receipt is a conflict
/// (another receiver recorded the identity first).
fn insert_receipt(tx: &rusqlite::Transaction<'_>, r: &ReceiptRow) -> Result<(), StoreError> {
    let n = tx
        .prepare_cached(
            "INSERT INTO receipts (event_id, fingerprint, object_id, decision, first_seen_ns)
             VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (event_id) DO UPDATE
             SET fingerprint = excluded.fingerprint, object_id = excluded.object_id,
                 decision = excluded.decision, first_seen_ns = excluded.first_seen_ns
             WHERE receipts.first_seen_ns <= ?6",
        )
        .and_then(|mut st| {
            st.execute(params![
                &*r.event_id,
                &r.fingerprint.to_le_bytes()[..],
                &*r.object_id,
                r.decision.code(),
                time_ns(r.first_seen),
                cutoff_ns(r.retention_cutoff)
            ])
        })
        .map_err(failed)?;
    if n == 0 {
        return Err(receipt_recorded(&r.event_id));
    }
    tx.prepare_cached("DELETE FROM receipt_variants WHERE event_id = ?1 AND first_seen_ns < ?2")
        .and_then(|mut st| st.execute(params![&*r.event_id, time_ns(r.first_seen)]))
        .map_err(failed)?;
    Ok(())
}

/// [`Write::Variant`]: the variant's row, unique on (event id, fingerprint);
/// an existing row means another process (or an earlier run) recorded this
/// variant first: a conflict, after which the copy is decided again as its
/// duplicate.
fn insert_variant(tx: &rusqlite::Transaction<'_>, v: &VariantRow) -> Result<(), StoreError> {
    let n = tx
        .prepare_cached(
            "INSERT INTO receipt_variants (event_id, fingerprint, object_id, first_seen_ns)
             VALUES (?1, ?2, ?3, ?4) ON CONFLICT (event_id, fingerprint) DO NOTHING",
        )
        .and_then(|mut st| {
            st.execute(params![
                &*v.event_id,
                &v.fingerprint.to_le_bytes()[..],
                &*v.object_id,
                time_ns(v.first_seen)
            ])
        })
        .map_err(failed)?;
    if n == 0 {
        return Err(variant_recorded(v));
    }
    Ok(())
}

/// Inserts `row` unless its object has a row already; the number of rows
/// inserted (0 or 1).
fn insert_object_if_absent(
    tx: &rusqlite::Transaction<'_>,
    row: &ObjectRow,
) -> Result<usize, StoreError> {
    tx.prepare_cached(
        "INSERT INTO objects (object_id, version, state, paused) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (object_id) DO NOTHING",
    )
    .and_then(|mut st| {
        st.execute(params![
            &*row.object_id,
            version_text(row.version),
            row.state,
            flag(row.paused)
        ])
    })
    .map_err(failed)
}

/// Writes an object row if the stored row still has the version and pause
/// flag the decision read (a replacement also needs the stored version
/// below the new one: the conditional update of a transactional inbox).
fn write_object(
    tx: &rusqlite::Transaction<'_>,
    row: &ObjectRow,
    read_version: u64,
    read_paused: bool,
) -> Result<(), StoreError> {
    let sql = if row.version > read_version {
        "UPDATE objects SET version = ?2, state = ?3, paused = ?4
         WHERE object_id = ?1 AND version < ?2 AND version = ?5 AND paused = ?6"
    } else {
        "UPDATE objects SET version = ?2, state = ?3, paused = ?4
         WHERE object_id = ?1 AND version = ?5 AND paused = ?6"
    };
    let n = tx
        .prepare_cached(sql)
        .and_then(|mut st| {
            st.execute(params![
                &*row.object_id,
                version_text(row.version),
                row.state,
                flag(row.paused),
                version_text(read_version),
                flag(read_paused)
            ])
        })
        .map_err(failed)?;
    if n == 0 {
        return Err(changed(&row.object_id));
    }
    Ok(())
}

/// Checks that a row the decision read and did not change is still as read.
fn check_object(
    tx: &rusqlite::Transaction<'_>,
    object_id: &str,
    version: u64,
    paused: bool,
) -> Result<(), StoreError> {
    let found: Option<i64> = tx
        .prepare_cached(
            "SELECT 1 FROM objects WHERE object_id = ?1 AND version = ?2 AND paused = ?3",
        )
        .and_then(|mut st| {
            st.query_row(
                params![object_id, version_text(version), flag(paused)],
                |r| r.get(0),
            )
            .optional()
        })
        .map_err(failed)?;
    match found {
        Some(_) => Ok(()),
        None => Err(changed(object_id)),
    }
}

fn insert_held(tx: &rusqlite::Transaction<'_>, h: &HeldRow) -> Result<(), StoreError> {
    tx.prepare_cached(
        "INSERT INTO held (origin, seq, at_ns, event_id, object_id, held_as, body, status, superseded_by, detail)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )
    .and_then(|mut st| {
        st.execute(params![
            h.key.origin as i64,
            h.key.seq as i64,
            time_ns(h.at),
            h.event_id.as_deref(),
            h.object_id.as_deref(),
            h.held_as.code(),
            &h.body[..],
            h.status.as_str(),
            h.superseded_by.map(version_text),
            h.detail
        ])
    })
    .map_err(failed)?;
    Ok(())
}

/// A history row; with `at`, its state is not stored again but read from
/// the body of its step's audit row (see [`pointer::state_at`]). It takes
/// the next outbox position, which the schema's trigger then counts: in
/// commit order, since one writer at a time commits.
fn insert_replacement(
    tx: &rusqlite::Transaction<'_>,
    r: &EffectRow,
    at: StateAt,
) -> Result<(), StoreError> {
    tx.prepare_cached(
        "INSERT INTO replacements (origin, seq, at_ns, object_id, version, state, cause_event, state_at, state_len, trace_context, position)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, (SELECT last + 1 FROM outbox))",
    )
    .and_then(|mut st| {
        st.execute(params![
            r.key.origin as i64,
            r.key.seq as i64,
            time_ns(r.at),
            &*r.object_id,
            version_text(r.version),
            pointer::state_column(r, at),
            r.cause_event.as_deref(),
            at.map(|(offset, _)| offset),
            at.map(|(_, len)| len),
            r.trace.as_ref().map(|t| t.to_stored())
        ])
    })
    .map_err(failed)?;
    Ok(())
}

/// An audit row. A redelivery whose exact bytes another audit row of its
/// origin holds (`plan`: one of this transaction, or a committed one,
/// checked here byte for byte) stores no body but that row's sequence
/// number (`body_seq`).
fn insert_audit(
    tx: &rusqlite::Transaction<'_>,
    a: &AuditRow,
    plan: &Plan,
) -> Result<(), StoreError> {
    let body_seq = match (plan.of(a), a.body.as_deref()) {
        (Placement::Same(seq), Some(_)) => Some(seq),
        (Placement::Check(seq), Some(body)) => tx
            .prepare_cached(
                "SELECT 1 FROM audit WHERE origin = ?1 AND seq = ?2 AND body = ?3 AND body_seq IS NULL",
            )
            .and_then(|mut st| st.exists(params![a.key.origin as i64, seq, body]))
            .map_err(failed)?
            .then_some(seq),
        _ => None,
    };
    tx.prepare_cached(
        "INSERT INTO audit (origin, seq, at_ns, event_id, object_id, kind, decision, version, replacement, detail, body, body_seq)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
    )
    .and_then(|mut st| {
        st.execute(params![
            a.key.origin as i64,
            a.key.seq as i64,
            time_ns(a.at),
            a.event_id.as_deref(),
            a.object_id.as_deref(),
            a.kind,
            a.decision,
            a.version.map(version_text),
            flag(a.replacement),
            a.detail,
            if body_seq.is_some() {
                None
            } else {
                a.body.as_deref()
            },
            body_seq
        ])
    })
    .map_err(failed)?;
    Ok(())
}
