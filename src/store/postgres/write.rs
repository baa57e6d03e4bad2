//! The PostgreSQL commit path: a folded group as one statement
//! ([`GROUP`]), any other group row by row in one transaction, and the
//! purges.

use super::{failed, PostgresStore};
use crate::store::group::{self, Group, ObjectWrite, Part};
use crate::store::pointer::{self, StateAt};
use crate::store::repeat::{Placement, Plan};
use crate::store::rows::{
    changed, cutoff_ns, exists, first_record_not_stored, not_stored, receipt_recorded, time_ns,
    variant_recorded, version_text,
};
use crate::store::stats::PhaseClock;
use crate::store::{
    AuditRow, CommitPhases, EffectRow, Expect, HeldKey, HeldRow, HeldStatus, ObjectRow, ReceiptRow,
    Records, StoreError, VariantRow, Write,
};
use postgres::{Client, GenericClient, Statement};
use std::collections::HashMap;
use std::time::SystemTime;

/// Prepared statements of one connection: one per write kind for the
/// row-by-row path, one for a whole folded group.
pub(super) struct Statements {
    receipt: Statement,
    /// Deletes the variants of an identity recorded before its new receipt.
    old_variants: Statement,
    variant: Statement,
    replace: Statement,
    flag: Statement,
    /// Inserts an object if absent: a seed, or an object an event created.
    seed: Statement,
    pause: Statement,
    check: Statement,
    held: Statement,
    held_status: Statement,
    audit: Statement,
    replacement: Statement,
    /// A whole folded group in one statement that commits on its own.
    group: Statement,
}

pub(super) fn prepare(c: &mut Client) -> Result<Statements, postgres::Error> {
    Ok(Statements {
        receipt: c.prepare(
            "INSERT INTO receipts (event_id, fingerprint, object_id, decision, first_seen_ns)
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (event_id) DO UPDATE
             SET fingerprint = excluded.fingerprint, object_id = excluded.object_id,
                 decision = excluded.decision, first_seen_ns = excluded.first_seen_ns
             WHERE receipts.first_seen_ns <= $6",
        )?,
        old_variants: c.prepare(
            "DELETE FROM receipt_variants WHERE event_id = $1 AND first_seen_ns < $2",
        )?,
        variant: c.prepare(
            "INSERT INTO receipt_variants (event_id, fingerprint, object_id, first_seen_ns)
             VALUES ($1, $2, $3, $4) ON CONFLICT (event_id, fingerprint) DO NOTHING",
        )?,
        replace: c.prepare(
            "UPDATE objects SET version = $2, state = $3, paused = $4
             WHERE object_id = $1 AND version < $2 AND version = $5 AND paused = $6",
        )?,
        flag: c.prepare(
            "UPDATE objects SET version = $2, state = $3, paused = $4
             WHERE object_id = $1 AND version = $5 AND paused = $6",
        )?,
        seed: c.prepare(
            "INSERT INTO objects (object_id, version, state, paused) VALUES ($1, $2, $3, $4)
             ON CONFLICT (object_id) DO NOTHING",
        )?,
        pause: c.prepare("UPDATE objects SET paused = TRUE WHERE object_id = $1")?,
        check: c.prepare(
            "SELECT 1 FROM objects WHERE object_id = $1 AND version = $2 AND paused = $3 FOR UPDATE",
        )?,
        held: c.prepare(
            "INSERT INTO held (origin, seq, at_ns, event_id, object_id, held_as, body, status, superseded_by, detail)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )?,
        held_status: c.prepare(
            "UPDATE held SET status = $3, superseded_by = $4 WHERE origin = $1 AND seq = $2",
        )?,
        replacement: c.prepare(
            "INSERT INTO replacements (origin, seq, at_ns, object_id, version, state, cause_event, state_at, state_len, trace_context)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )?,
        audit: c.prepare(
            "INSERT INTO audit (origin, seq, at_ns, event_id, object_id, kind, decision, version, replacement, detail, body, body_seq)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        )?,
        group: c.prepare(GROUP)?,
    })
}

/// A folded group as one statement, sent in one round trip and committed on
/// its own (no `BEGIN` / `COMMIT`: a single statement is its own
/// transaction, and the driver returns only after the server's
/// `ReadyForQuery`, that is after the commit and, with
/// `synchronous_commit=on`, its WAL flush).
///
/// The arbitration between processes: `locked` locks every object row of
/// the group (FOR UPDATE, in object order, so that two processes cannot
/// deadlock on them) if and only if it still has the version and pause flag
/// the group's first decision on it read; under READ COMMITTED a row another
/// transaction changed meanwhile is re-read once its lock is granted and
/// counted only if it still matches. `written` changes only locked rows,
/// taking the values to write from `locked` itself: joining `written` back
/// to `o` made the planner (which guesses 10 rows for any `unnest`) pick a
/// nested loop over the two CTEs, quadratic in the group's objects (1,645
/// objects: 2.7 million comparisons, 710 of a commit's 738 ms).
/// Receipts are unique on `event_id` and variants on (`event_id`,
/// fingerprint): a row that exists is not inserted, except that a receipt
/// first seen at or before its row's retention cut-off (`$45`, expired but
/// not purged yet, docs/CONTRACT.md §5) is replaced, and `old_variants`
/// deletes the variants recorded before the new receipt (the expired
/// one's; a variant the same group records again replaces its old row in
/// `variants_in` instead, since one statement must not both delete and
/// insert a row). A redelivery whose exact bytes another audit row holds
/// stores `body_seq` instead of its body: a row of the same group (`$50`,
/// compared before), or a committed row (`$49`, proposed by
/// `repeat::RecentBodies`) that `repeated` finds with these bytes; `FOR KEY SHARE` keeps the row from a purge until the commit (a
/// purge that locked it first has deleted it when the lock is granted, and
/// the body is stored in place). Audit rows are inserted in step order
/// (`ORDER BY x.k`: the join may come out in another order, and the trail
/// is read back in insert order). `repeated` reaches each proposed row by
/// its key from the proposals (a lateral subquery, run once per proposal:
/// no join plan can read the whole table for it, and the key's index is
/// the cheapest way to one row at any size the statistics claim; the unit
/// test checks it on a plan made while the table was empty): as a semi join it let a
/// generic plan made while `audit` was nearly empty, and never analysed
/// since (autovacuum off), scan the whole table for every group, so that
/// one call per delivery slowed as the table grew. The final check
/// compares the counts with the group's and raises `serialization_failure`
/// (objects) or `unique_violation` (receipts, variants) when one is short, which aborts the statement: nothing of the group is
/// committed, and the store answers [`StoreError::Conflict`].
pub(super) const GROUP: &str = "
WITH o AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bool[], $4::bool[],
                         $5::text[], $6::text[], $7::bool[])
        AS o (object_id, read_version, read_paused, write, version, state, paused)
),
locked AS (
    SELECT objects.object_id, o.write, o.version, o.state, o.paused
    FROM objects JOIN o USING (object_id)
    WHERE (o.read_version IS NULL OR objects.version = o.read_version)
      AND (o.read_paused IS NULL OR objects.paused = o.read_paused)
    ORDER BY objects.object_id
    FOR UPDATE OF objects
),
written AS (
    UPDATE objects SET version = coalesce(l.version, objects.version),
                       state = coalesce(l.state, objects.state),
                       paused = l.paused
    FROM locked AS l
    WHERE l.write AND objects.object_id = l.object_id
    RETURNING 1
),
receipts_in AS (
    INSERT INTO receipts AS r (event_id, fingerprint, object_id, decision, first_seen_ns)
    SELECT * FROM unnest($8::text[], $9::bytea[], $10::text[], $11::text[], $12::int8[])
    ON CONFLICT (event_id) DO UPDATE
    SET fingerprint = excluded.fingerprint, object_id = excluded.object_id,
        decision = excluded.decision, first_seen_ns = excluded.first_seen_ns
    WHERE r.first_seen_ns <= (SELECT c.cutoff FROM unnest($8::text[], $45::int8[])
                              AS c (event_id, cutoff) WHERE c.event_id = excluded.event_id)
    RETURNING 1
),
old_variants AS (
    DELETE FROM receipt_variants v
    USING unnest($8::text[], $12::int8[]) AS n (event_id, first_seen_ns)
    WHERE v.event_id = n.event_id AND v.first_seen_ns < n.first_seen_ns
      AND NOT EXISTS (SELECT 1 FROM unnest($41::text[], $42::bytea[]) AS w (event_id, fingerprint)
                      WHERE w.event_id = v.event_id AND w.fingerprint = v.fingerprint)
),
held_in AS (
    INSERT INTO held (origin, seq, at_ns, event_id, object_id, held_as, body, status, superseded_by, detail)
    SELECT * FROM unnest($13::int8[], $14::int8[], $15::int8[], $16::text[], $17::text[],
                         $18::text[], $19::bytea[], $20::text[], $21::text[], $22::text[])
),
repeated AS (
    SELECT f.origin, f.seq, f.body
    FROM (SELECT DISTINCT * FROM unnest($23::int8[], $49::int8[]) AS u (origin, seq)
          WHERE u.seq IS NOT NULL) AS p
    CROSS JOIN LATERAL (
        SELECT a.origin, a.seq, a.body FROM audit AS a
        WHERE a.origin = p.origin AND a.seq = p.seq AND a.body_seq IS NULL
        FOR KEY SHARE
    ) AS f
),
audit_in AS (
    INSERT INTO audit (origin, seq, at_ns, event_id, object_id, kind, decision, version, replacement, detail, body, body_seq)
    SELECT x.origin, x.seq, x.at_ns, x.event_id, x.object_id, x.kind, x.decision, x.version,
           x.replacement, x.detail,
           CASE WHEN x.body_same IS NULL AND f.seq IS NULL THEN x.body END,
           coalesce(x.body_same, f.seq)
    FROM unnest($23::int8[], $24::int8[], $25::int8[], $26::text[], $27::text[],
                $28::text[], $29::text[], $30::text[], $31::bool[], $32::text[], $33::bytea[],
                $49::int8[], $50::int8[]) WITH ORDINALITY
         AS x (origin, seq, at_ns, event_id, object_id, kind, decision, version, replacement,
               detail, body, body_from, body_same, k)
    LEFT JOIN repeated AS f ON f.origin = x.origin AND f.seq = x.body_from AND f.body = x.body
    ORDER BY x.k
),
positions AS (
    UPDATE outbox SET last = last + cardinality($34::int8[])
    WHERE cardinality($34::int8[]) > 0
    RETURNING last - cardinality($34::int8[]) AS base
),
replacements_in AS (
    INSERT INTO replacements (origin, seq, at_ns, object_id, version, state, cause_event, state_at, state_len, trace_context, position)
    SELECT r.origin, r.seq, r.at_ns, r.object_id, r.version, r.state, r.cause_event,
           r.state_at, r.state_len, r.trace_context, p.base + r.k
    FROM unnest($34::int8[], $35::int8[], $36::int8[], $37::text[], $38::text[],
                $39::text[], $40::text[], $46::int8[], $47::int8[], $48::text[]) WITH ORDINALITY
         AS r (origin, seq, at_ns, object_id, version, state, cause_event, state_at, state_len, trace_context, k)
    CROSS JOIN positions AS p
),
variants_in AS (
    INSERT INTO receipt_variants AS v (event_id, fingerprint, object_id, first_seen_ns)
    SELECT * FROM unnest($41::text[], $42::bytea[], $43::text[], $44::int8[])
    ON CONFLICT (event_id, fingerprint) DO UPDATE
    SET object_id = excluded.object_id, first_seen_ns = excluded.first_seen_ns
    WHERE v.event_id = ANY($8::text[]) AND v.first_seen_ns < excluded.first_seen_ns
    RETURNING 1
)
SELECT snapshot_receiver_check_group(
    (SELECT count(*) FROM locked), (SELECT count(*) FROM o),
    (SELECT count(*) FROM written), (SELECT count(*) FROM o WHERE o.write),
    (SELECT count(*) FROM receipts_in), cardinality($8::text[]),
    (SELECT count(*) FROM variants_in), cardinality($41::text[]))
";

/// The outbox positions of the history rows a row-by-row transaction
/// inserted (`$1` origins, `$2` sequence numbers, in insert order), taken as
/// its last statement before the commit: the counter's row lock, held to
/// the commit, makes positions follow commit order over every process
/// (docs/CONTRACT.md §10).
const POSITIONS: &str = "
WITH p AS (
    UPDATE outbox SET last = last + cardinality($1::int8[])
    RETURNING last - cardinality($1::int8[]) AS base
)
UPDATE replacements AS r SET position = p.base + k.k
FROM p, unnest($1::int8[], $2::int8[]) WITH ORDINALITY AS k (origin, seq, k)
WHERE r.origin = k.origin AND r.seq = k.seq
";

/// One batch of the audit purge ([`crate::store::Store::purge_records`]),
/// first statement: at most `$2` audit rows recorded before `$1` that
/// justify nothing still held (docs/CONTRACT.md §9: not a row of an event
/// identity or step whose held row is not resolved, not a row of a paused
/// object), nor the rows of the highest sequence number, from which a
/// restarted receiver numbers its steps; locked, so that no group commits a
/// row pointing at one of their bodies once this returns (see `repeated`
/// in [`GROUP`]), and one that did is visible to [`PURGE_AUDIT`].
const PURGE_AUDIT_BATCH: &str = "
SELECT a.id FROM audit AS a
WHERE a.at_ns < $1 AND a.seq < (SELECT max(seq) FROM audit)
  AND NOT EXISTS (SELECT 1 FROM held AS h WHERE h.status <> 'resolved'
                  AND h.origin = a.origin AND h.seq = a.seq)
  AND NOT EXISTS (SELECT 1 FROM held AS h WHERE h.status <> 'resolved'
                  AND h.event_id = a.event_id)
  AND NOT EXISTS (SELECT 1 FROM objects AS o WHERE o.paused AND o.object_id = a.object_id)
ORDER BY a.at_ns LIMIT $2
FOR UPDATE OF a
";

/// Second statement of an audit purge batch, in the same transaction: a
/// history row that takes its state from one of the rows `$1` (their ids)
/// gets the state copied in first, and an audit row outside them that
/// takes its body from one of them the body. Counts the audit rows deleted.
const PURGE_AUDIT: &str = "
WITH batch AS (
    SELECT a.id, a.origin, a.seq, a.body FROM audit AS a WHERE a.id = ANY($1::int8[])
),
kept AS (
    UPDATE replacements AS r
    SET state = convert_from(substring(b.body FROM (r.state_at + 1)::int FOR r.state_len::int), 'UTF8'),
        state_at = NULL, state_len = NULL
    FROM batch AS b
    WHERE r.origin = b.origin AND r.seq = b.seq AND r.state_at IS NOT NULL
),
repeats AS (
    UPDATE audit AS r SET body = b.body, body_seq = NULL
    FROM batch AS b
    WHERE r.origin = b.origin AND r.body_seq = b.seq AND r.id <> ALL($1::int8[])
)
DELETE FROM audit AS a USING batch AS b WHERE a.id = b.id
";

/// A folded group's statement parameters, one array per column.
struct Columns<'a> {
    /// One entry per object.
    objects: ObjectColumns<'a>,
    /// Receipts of first deliveries.
    receipts: ReceiptColumns<'a>,
    /// Variants of event identities.
    variants: VariantColumns<'a>,
    /// Held inputs.
    held: HeldColumns<'a>,
    /// Audit rows.
    audit: AuditColumns<'a>,
    /// State replacements.
    replacements: ReplacementColumns<'a>,
}

/// The group's objects as columns.
#[derive(Default)]
struct ObjectColumns<'a> {
    object_id: Vec<&'a str>,
    /// The version the group's first decision read (`NULL`: none read it).
    read_version: Vec<Option<String>>,
    /// The pause flag it read (`NULL`: none read it).
    read_paused: Vec<Option<bool>>,
    /// Whether the row is written (`false`: only checked and locked).
    write: Vec<bool>,
    /// The version written (`NULL`: kept, for a pause).
    version: Vec<Option<String>>,
    /// The state written (`NULL`: kept, for a pause).
    state: Vec<Option<&'a str>>,
    /// The pause flag written.
    paused: Vec<Option<bool>>,
}

/// Variants as columns.
struct VariantColumns<'a> {
    event_id: Vec<&'a str>,
    /// 16 bytes, little-endian.
    fingerprint: Vec<[u8; 16]>,
    object_id: Vec<&'a str>,
    first_seen: Vec<i64>,
}

impl<'a> VariantColumns<'a> {
    fn of(variants: &[&'a VariantRow]) -> Self {
        Self {
            event_id: variants.iter().map(|v| &*v.event_id).collect(),
            fingerprint: variants
                .iter()
                .map(|v| v.fingerprint.to_le_bytes())
                .collect(),
            object_id: variants.iter().map(|v| &*v.object_id).collect(),
            first_seen: variants.iter().map(|v| time_ns(v.first_seen)).collect(),
        }
    }
}

/// Receipts as columns.
struct ReceiptColumns<'a> {
    event_id: Vec<&'a str>,
    /// 16 bytes, little-endian.
    fingerprint: Vec<[u8; 16]>,
    object_id: Vec<&'a str>,
    decision: Vec<String>,
    first_seen: Vec<i64>,
    /// [`crate::store::ReceiptRow::retention_cutoff`] in stored nanoseconds (`-1`: none).
    cutoff: Vec<i64>,
}

impl<'a> Columns<'a> {
    fn of(group: &'a Group<'_>, bodies: &HashMap<HeldKey, &AuditRow>, plan: &Plan) -> Self {
        let mut objects = ObjectColumns::default();
        for o in &group.objects {
            let (write, version, state, paused) = match &o.write {
                ObjectWrite::Check => (false, None, None, None),
                ObjectWrite::Pause => (true, None, None, Some(true)),
                ObjectWrite::Row(row) => (
                    true,
                    Some(version_text(row.version)),
                    Some(row.state.as_str()),
                    Some(row.paused),
                ),
            };
            objects.object_id.push(&**o.object_id);
            objects.read_version.push(o.read_version.map(version_text));
            objects.read_paused.push(o.read_paused);
            objects.write.push(write);
            objects.version.push(version);
            objects.state.push(state);
            objects.paused.push(paused);
        }
        let r = &group.receipts;
        Self {
            objects,
            receipts: ReceiptColumns {
                event_id: r.iter().map(|r| &*r.event_id).collect(),
                fingerprint: r.iter().map(|r| r.fingerprint.to_le_bytes()).collect(),
                object_id: r.iter().map(|r| &*r.object_id).collect(),
                decision: r.iter().map(|r| r.decision.code()).collect(),
                first_seen: r.iter().map(|r| time_ns(r.first_seen)).collect(),
                cutoff: r.iter().map(|r| cutoff_ns(r.retention_cutoff)).collect(),
            },
            variants: VariantColumns::of(&group.variants),
            held: HeldColumns::of(&group.held),
            audit: AuditColumns::of(&group.audit, plan),
            replacements: ReplacementColumns::of(&group.replacements, bodies),
        }
    }

    /// Runs [`GROUP`]: one round trip; on a client outside a transaction,
    /// committed when it returns `Ok`.
    fn commit(&self, client: &mut impl GenericClient, st: &Statements) -> Result<(), StoreError> {
        let (o, r, v) = (&self.objects, &self.receipts, &self.variants);
        let fingerprints: Vec<&[u8]> = r.fingerprint.iter().map(|f| &f[..]).collect();
        let variant_fingerprints: Vec<&[u8]> = v.fingerprint.iter().map(|f| &f[..]).collect();
        let (h, a, p) = (&self.held, &self.audit, &self.replacements);
        client
            .query_one(
                &st.group,
                &[
                    &o.object_id,
                    &o.read_version,
                    &o.read_paused,
                    &o.write,
                    &o.version,
                    &o.state,
                    &o.paused, // objects
                    &r.event_id,
                    &fingerprints,
                    &r.object_id,
                    &r.decision,
                    &r.first_seen, // receipts
                    &h.origin,
                    &h.seq,
                    &h.at,
                    &h.event_id,
                    &h.object_id,
                    &h.held_as,
                    &h.body,
                    &h.status,
                    &h.superseded_by,
                    &h.detail, // held
                    &a.origin,
                    &a.seq,
                    &a.at,
                    &a.event_id,
                    &a.object_id,
                    &a.kind,
                    &a.decision,
                    &a.version,
                    &a.replacement,
                    &a.detail,
                    &a.body, // audit
                    &p.origin,
                    &p.seq,
                    &p.at,
                    &p.object_id,
                    &p.version,
                    &p.state,
                    &p.cause_event, // replacements
                    &v.event_id,
                    &variant_fingerprints,
                    &v.object_id,
                    &v.first_seen, // variants
                    &r.cutoff,     // receipts' retention cut-offs
                    &p.state_at,
                    &p.state_len, // replacements' pointers into the audit bodies
                    &p.trace,     // replacements' trace contexts
                    &a.body_from, // audit rows' repeated bodies: committed,
                    &a.body_same, // and of the group
                ],
            )
            .map_err(failed)?;
        Ok(())
    }
}

/// Held rows as columns.
struct HeldColumns<'a> {
    origin: Vec<i64>,
    seq: Vec<i64>,
    at: Vec<i64>,
    event_id: Vec<Option<&'a str>>,
    object_id: Vec<Option<&'a str>>,
    held_as: Vec<String>,
    body: Vec<&'a [u8]>,
    status: Vec<&'static str>,
    superseded_by: Vec<Option<String>>,
    detail: Vec<Option<&'a str>>,
}

impl<'a> HeldColumns<'a> {
    fn of(rows: &[&'a HeldRow]) -> Self {
        Self {
            origin: rows.iter().map(|h| h.key.origin as i64).collect(),
            seq: rows.iter().map(|h| h.key.seq as i64).collect(),
            at: rows.iter().map(|h| time_ns(h.at)).collect(),
            event_id: rows.iter().map(|h| h.event_id.as_deref()).collect(),
            object_id: rows.iter().map(|h| h.object_id.as_deref()).collect(),
            held_as: rows.iter().map(|h| h.held_as.code()).collect(),
            body: rows.iter().map(|h| &h.body[..]).collect(),
            status: rows.iter().map(|h| h.status.as_str()).collect(),
            superseded_by: rows
                .iter()
                .map(|h| h.superseded_by.map(version_text))
                .collect(),
            detail: rows.iter().map(|h| h.detail.as_deref()).collect(),
        }
    }
}

/// Audit rows as columns.
struct AuditColumns<'a> {
    origin: Vec<i64>,
    seq: Vec<i64>,
    at: Vec<i64>,
    event_id: Vec<Option<&'a str>>,
    object_id: Vec<Option<&'a str>>,
    kind: Vec<&'static str>,
    decision: Vec<Option<&'a str>>,
    version: Vec<Option<String>>,
    replacement: Vec<bool>,
    detail: Vec<Option<&'a str>>,
    body: Vec<Option<&'a [u8]>>,
    /// The committed row whose body a redelivery may repeat (`NULL`: none).
    body_from: Vec<Option<i64>>,
    /// The row of the group whose body a redelivery repeats (`NULL`: none).
    body_same: Vec<Option<i64>>,
}

impl<'a> AuditColumns<'a> {
    fn of(rows: &[&'a AuditRow], plan: &Plan) -> Self {
        Self {
            origin: rows.iter().map(|a| a.key.origin as i64).collect(),
            seq: rows.iter().map(|a| a.key.seq as i64).collect(),
            at: rows.iter().map(|a| time_ns(a.at)).collect(),
            event_id: rows.iter().map(|a| a.event_id.as_deref()).collect(),
            object_id: rows.iter().map(|a| a.object_id.as_deref()).collect(),
            kind: rows.iter().map(|a| a.kind).collect(),
            decision: rows.iter().map(|a| a.decision.as_deref()).collect(),
            version: rows.iter().map(|a| a.version.map(version_text)).collect(),
            replacement: rows.iter().map(|a| a.replacement).collect(),
            detail: rows.iter().map(|a| a.detail.as_deref()).collect(),
            body: rows.iter().map(|a| a.body.as_deref()).collect(),
            body_from: rows
                .iter()
                .map(|a| match plan.of(a) {
                    Placement::Check(seq) => Some(seq),
                    _ => None,
                })
                .collect(),
            body_same: rows
                .iter()
                .map(|a| match plan.of(a) {
                    Placement::Same(seq) => Some(seq),
                    _ => None,
                })
                .collect(),
        }
    }
}

/// Replacement rows as columns.
struct ReplacementColumns<'a> {
    origin: Vec<i64>,
    seq: Vec<i64>,
    at: Vec<i64>,
    object_id: Vec<&'a str>,
    version: Vec<String>,
    /// Empty where the state is read from the audit body (`state_at`).
    state: Vec<&'a str>,
    cause_event: Vec<Option<&'a str>>,
    /// Byte offset of the state in the body of the step's audit row.
    state_at: Vec<Option<i64>>,
    /// Its length in bytes.
    state_len: Vec<Option<i64>>,
    /// The trace context, stored form ([`snapshot_receiver_core::TraceContext::to_stored`]).
    trace: Vec<Option<String>>,
}

impl<'a> ReplacementColumns<'a> {
    /// `bodies`: the group's delivery audit rows (see
    /// [`pointer::state_at`]).
    fn of(rows: &[&'a EffectRow], bodies: &HashMap<HeldKey, &AuditRow>) -> Self {
        let at: Vec<StateAt> = rows.iter().map(|r| pointer::state_at(bodies, r)).collect();
        Self {
            origin: rows.iter().map(|r| r.key.origin as i64).collect(),
            seq: rows.iter().map(|r| r.key.seq as i64).collect(),
            at: rows.iter().map(|r| time_ns(r.at)).collect(),
            object_id: rows.iter().map(|r| &*r.object_id).collect(),
            version: rows.iter().map(|r| version_text(r.version)).collect(),
            state: rows
                .iter()
                .zip(&at)
                .map(|(r, at)| pointer::state_column(r, *at))
                .collect(),
            cause_event: rows.iter().map(|r| r.cause_event.as_deref()).collect(),
            state_at: at.iter().map(|a| a.map(|(offset, _)| offset)).collect(),
            state_len: at.iter().map(|a| a.map(|(_, len)| len)).collect(),
            trace: rows
                .iter()
                .map(|r| r.trace.as_ref().map(|t| t.to_stored()))
                .collect(),
        }
    }
}

/// Inserts `row` unless its object has a row already (`st.seed`); the
/// number of rows inserted (0 or 1).
fn insert_object_if_absent(
    tx: &mut postgres::Transaction<'_>,
    st: &Statements,
    row: &ObjectRow,
) -> Result<u64, StoreError> {
    tx.execute(
        &st.seed,
        &[
            &&*row.object_id,
            &version_text(row.version),
            &row.state,
            &row.paused,
        ],
    )
    .map_err(failed)
}

/// One write of a row-by-row group; `bodies`: the group's delivery audit
/// rows, where a replacement's state may lie.
fn apply(
    tx: &mut postgres::Transaction<'_>,
    st: &Statements,
    write: &Write,
    bodies: &HashMap<HeldKey, &AuditRow>,
    plan: &Plan,
) -> Result<(), StoreError> {
    match write {
        Write::Receipt(r) => insert_receipt(tx, st, r),
        Write::Variant(v) => insert_variant(tx, st, v),
        Write::Object { row, expect } => match *expect {
            Expect::Version { version, paused } => write_object(tx, st, row, version, paused),
            Expect::Absent => create_object(tx, st, row),
        },
        Write::Seed(row) => insert_object_if_absent(tx, st, row).map(|_| ()),
        Write::Pause { object_id } => pause(tx, st, object_id),
        Write::PauseIfStored {
            event_id,
            fingerprint,
            object_id,
            audit,
        } => pause_if_stored(tx, st, event_id, *fingerprint, object_id, audit, plan),
        Write::Check {
            object_id,
            version,
            paused,
        } => check_object(tx, st, object_id, *version, *paused),
        Write::Held(h) => insert_held(tx, st, h),
        Write::HeldStatus {
            key,
            status,
            superseded_by,
        } => update_held_status(tx, st, *key, *status, *superseded_by),
        Write::Effect(r) => insert_replacement(tx, st, r, pointer::state_at(bodies, r)),
        Write::Audit(a) => insert_audit(tx, st, a, plan),
    }
}

/// [`Write::Receipt`]: inserts a receipt, replacing one that expired by the
/// row's retention cut-off (docs/CONTRACT.md §5: the purge may not have run
/// yet), and deletes the variants recorded before it. A live receipt is a
/// conflict (another process recorded the identity first).
fn insert_receipt(
    tx: &mut postgres::Transaction<'_>,
    st: &Statements,
    r: &ReceiptRow,
) -> Result<(), StoreError> {
    let n = tx
        .execute(
            &st.receipt,
            &[
                &&*r.event_id,
                &&r.fingerprint.to_le_bytes()[..],
                &&*r.object_id,
                &r.decision.code(),
                &time_ns(r.first_seen),
                &cutoff_ns(r.retention_cutoff),
            ],
        )
        .map_err(failed)?;
    if n == 0 {
        return Err(receipt_recorded(&r.event_id));
    }
    // The receipt was inserted or replaced an expired one: the
    // variants recorded before it were the expired receipt's.
    tx.execute(&st.old_variants, &[&&*r.event_id, &time_ns(r.first_seen)])
        .map_err(failed)?;
    Ok(())
}

/// [`Write::Object`] with [`Expect::Version`]: writes the object row if the
/// stored row still has the version and pause flag the decision read
/// (`st.replace`, which also needs the stored version below the new one,
/// for a replacement; `st.flag` otherwise).
fn write_object(
    tx: &mut postgres::Transaction<'_>,
    st: &Statements,
    row: &ObjectRow,
    read_version: u64,
    read_paused: bool,
) -> Result<(), StoreError> {
    let statement = if row.version > read_version {
        &st.replace
    } else {
        &st.flag
    };
    let n = tx
        .execute(
            statement,
            &[
                &&*row.object_id,
                &version_text(row.version),
                &row.state,
                &row.paused,
                &version_text(read_version),
                &read_paused,
            ],
        )
        .map_err(failed)?;
    if n == 0 {
        return Err(changed(&row.object_id));
    }
    Ok(())
}

/// [`Write::Object`] with [`Expect::Absent`]: inserts the row of an object
/// an event created; a row that exists is a conflict (another writer
/// created it first).
fn create_object(
    tx: &mut postgres::Transaction<'_>,
    st: &Statements,
    row: &ObjectRow,
) -> Result<(), StoreError> {
    if insert_object_if_absent(tx, st, row)? == 0 {
        return Err(exists(&row.object_id));
    }
    Ok(())
}

/// [`Write::Pause`]: pauses a stored object; one no writer stored (yet) is
/// a conflict.
fn pause(
    tx: &mut postgres::Transaction<'_>,
    st: &Statements,
    object_id: &str,
) -> Result<(), StoreError> {
    if tx.execute(&st.pause, &[&object_id]).map_err(failed)? == 0 {
        return Err(not_stored(object_id));
    }
    Ok(())
}

/// [`Write::PauseIfStored`]: pauses `object_id` (with its audit row) if it
/// is stored, once the receipt of the variant's first record (`event_id`,
/// `fingerprint`) is; a first record not stored (yet) is a conflict.
fn pause_if_stored(
    tx: &mut postgres::Transaction<'_>,
    st: &Statements,
    event_id: &str,
    fingerprint: u128,
    object_id: &str,
    audit: &AuditRow,
    plan: &Plan,
) -> Result<(), StoreError> {
    let stored = tx
        .query_opt(
            "SELECT 1 FROM receipts WHERE event_id = $1 AND fingerprint = $2",
            &[&event_id, &&fingerprint.to_le_bytes()[..]],
        )
        .map_err(failed)?;
    if stored.is_none() {
        return Err(first_record_not_stored(event_id));
    }
    if tx.execute(&st.pause, &[&object_id]).map_err(failed)? > 0 {
        insert_audit(tx, st, audit, plan)?;
    }
    Ok(())
}

/// [`Write::Check`]: checks that a row the decision read and did not change
/// is still as read, and locks it to the commit (`st.check`, `FOR UPDATE`).
fn check_object(
    tx: &mut postgres::Transaction<'_>,
    st: &Statements,
    object_id: &str,
    version: u64,
    paused: bool,
) -> Result<(), StoreError> {
    let rows = tx
        .query(&st.check, &[&object_id, &version_text(version), &paused])
        .map_err(failed)?;
    if rows.is_empty() {
        return Err(changed(object_id));
    }
    Ok(())
}

/// [`Write::Held`]: one held row.
fn insert_held(
    tx: &mut postgres::Transaction<'_>,
    st: &Statements,
    h: &HeldRow,
) -> Result<(), StoreError> {
    tx.execute(
        &st.held,
        &[
            &(h.key.origin as i64),
            &(h.key.seq as i64),
            &time_ns(h.at),
            &h.event_id.as_deref(),
            &h.object_id.as_deref(),
            &h.held_as.code(),
            &&h.body[..],
            &h.status.as_str(),
            &h.superseded_by.map(version_text),
            &h.detail,
        ],
    )
    .map_err(failed)?;
    Ok(())
}

/// [`Write::HeldStatus`]: a held row's new status.
fn update_held_status(
    tx: &mut postgres::Transaction<'_>,
    st: &Statements,
    key: HeldKey,
    status: HeldStatus,
    superseded_by: Option<u64>,
) -> Result<(), StoreError> {
    tx.execute(
        &st.held_status,
        &[
            &(key.origin as i64),
            &(key.seq as i64),
            &status.as_str(),
            &superseded_by.map(version_text),
        ],
    )
    .map_err(failed)?;
    Ok(())
}

/// [`Write::Effect`]: a history row; with `at`, its state is not
/// stored again but read from the body of its step's audit row (see
/// [`pointer::state_at`]). Its outbox position is given at the end of the
/// transaction ([`number_replacements`]).
fn insert_replacement(
    tx: &mut postgres::Transaction<'_>,
    st: &Statements,
    r: &EffectRow,
    at: StateAt,
) -> Result<(), StoreError> {
    tx.execute(
        &st.replacement,
        &[
            &(r.key.origin as i64),
            &(r.key.seq as i64),
            &time_ns(r.at),
            &&*r.object_id,
            &version_text(r.version),
            &pointer::state_column(r, at),
            &r.cause_event.as_deref(),
            &at.map(|(offset, _)| offset),
            &at.map(|(_, len)| len),
            &r.trace.as_ref().map(|t| t.to_stored()),
        ],
    )
    .map_err(failed)?;
    Ok(())
}

/// [`Write::Audit`]: one audit row.
/// [`Write::Audit`]: an audit row. A redelivery whose exact bytes another
/// audit row of its origin holds (`plan`: one of this transaction, or a
/// committed one, checked here byte for byte and locked against a purge to
/// the commit, as `repeated` in [`GROUP`]) stores no body but that row's
/// sequence number (`body_seq`).
fn insert_audit(
    tx: &mut postgres::Transaction<'_>,
    st: &Statements,
    a: &AuditRow,
    plan: &Plan,
) -> Result<(), StoreError> {
    let body_seq = match (plan.of(a), a.body.as_deref()) {
        (Placement::Same(seq), Some(_)) => Some(seq),
        (Placement::Check(seq), Some(body)) => tx
            .query_opt(
                "SELECT 1 FROM audit WHERE origin = $1 AND seq = $2 AND body = $3
                 AND body_seq IS NULL FOR KEY SHARE",
                &[&(a.key.origin as i64), &seq, &body],
            )
            .map_err(failed)?
            .map(|_| seq),
        _ => None,
    };
    let body = if body_seq.is_some() {
        None
    } else {
        a.body.as_deref()
    };
    tx.execute(
        &st.audit,
        &[
            &(a.key.origin as i64),
            &(a.key.seq as i64),
            &time_ns(a.at),
            &a.event_id.as_deref(),
            &a.object_id.as_deref(),
            &a.kind,
            &a.decision,
            &a.version.map(version_text),
            &a.replacement,
            &a.detail,
            &body,
            &body_seq,
        ],
    )
    .map_err(failed)?;
    Ok(())
}

/// [`Write::Variant`]: the variant's row, unique on (event id, fingerprint).
/// A concurrent insert of the same variant waits for the other transaction;
/// once that commits, no row is inserted here: another process recorded this
/// variant first, so the batch conflicts and is decided again (a duplicate).
fn insert_variant(
    tx: &mut postgres::Transaction<'_>,
    st: &Statements,
    v: &VariantRow,
) -> Result<(), StoreError> {
    let n = tx
        .execute(
            &st.variant,
            &[
                &&*v.event_id,
                &&v.fingerprint.to_le_bytes()[..],
                &&*v.object_id,
                &time_ns(v.first_seen),
            ],
        )
        .map_err(failed)?;
    if n == 0 {
        return Err(variant_recorded(v));
    }
    Ok(())
}

/// Gives the history rows `writes` inserted their outbox positions
/// ([`POSITIONS`]); nothing when there are none (the counter is not locked).
fn number_replacements(
    tx: &mut postgres::Transaction<'_>,
    writes: &[Write],
) -> Result<(), StoreError> {
    let (origins, seqs): (Vec<i64>, Vec<i64>) = writes
        .iter()
        .filter_map(|w| match w {
            Write::Effect(r) => Some((r.key.origin as i64, r.key.seq as i64)),
            _ => None,
        })
        .unzip();
    if origins.is_empty() {
        return Ok(());
    }
    let n = tx.execute(POSITIONS, &[&origins, &seqs]).map_err(failed)?;
    if n != origins.len() as u64 {
        return Err(StoreError::Failed(format!(
            "postgres: {n} of {} history rows numbered",
            origins.len()
        )));
    }
    Ok(())
}

impl PostgresStore {
    pub(super) fn try_commit(&mut self, writes: &[Write]) -> Result<(), StoreError> {
        // (Re)connecting, when needed, is not part of the phases.
        self.connection()?;
        let clock = PhaseClock::start();
        let parts = group::parts(writes);
        let (client, st) = self
            .conn
            .as_mut()
            .ok_or_else(|| StoreError::Failed("postgres: no connection".to_owned()))?;
        let audit_rows = crate::store::repeat::audit_rows(writes);
        let plan = self.recent.plan(audit_rows.iter().copied());
        let bodies = pointer::delivery_bodies(audit_rows.iter().copied());
        let result = Self::run_commit(client, st, &bodies, &parts, &plan, &mut self.phases, clock);
        if result.is_ok() {
            self.recent.remember(audit_rows, &plan);
        }
        result
    }

    /// [`crate::store::Store::probe`]: the writes row by row in one transaction, rolled
    /// back (row by row, each value reaches the server as it would folded).
    pub(super) fn try_probe(&mut self, writes: &[Write]) -> Result<(), StoreError> {
        self.connection()?;
        let (client, st) = self
            .conn
            .as_mut()
            .ok_or_else(|| StoreError::Failed("postgres: no connection".to_owned()))?;
        let mut tx = client.transaction().map_err(failed)?;
        let audit_rows = crate::store::repeat::audit_rows(writes);
        let bodies = pointer::delivery_bodies(audit_rows.iter().copied());
        let plan = self.recent.plan(audit_rows);
        for w in writes {
            apply(&mut tx, st, w, &bodies, &plan)?;
        }
        tx.rollback().map_err(failed)
    }

    /// A group folded whole: its one statement. Otherwise one transaction
    /// with the parts in order (a folded run as its statement, the other
    /// writes row by row, their history rows numbered before the next
    /// part's, so that positions follow the order of the writes), then the
    /// commit.
    fn run_commit(
        client: &mut Client,
        st: &Statements,
        bodies: &HashMap<HeldKey, &AuditRow>,
        parts: &[Part<'_>],
        plan: &Plan,
        phases: &mut CommitPhases,
        mut clock: PhaseClock,
    ) -> Result<(), StoreError> {
        if let [Part::Folded(group)] = parts {
            let columns = Columns::of(group, bodies, plan);
            clock.lap(&mut phases.encode);
            // Statement and commit are one round trip: counted as executing.
            let result = columns.commit(client, st);
            clock.lap(&mut phases.execute);
            return result;
        }
        clock.lap(&mut phases.encode);
        // Dropping `tx` on an error rolls the transaction back.
        let executed = client.transaction().map_err(failed).and_then(|mut tx| {
            for part in parts {
                match part {
                    Part::Folded(group) => Columns::of(group, bodies, plan).commit(&mut tx, st)?,
                    Part::Rows(rows) => {
                        phases.unfolded += rows.len() as u64;
                        for w in *rows {
                            apply(&mut tx, st, w, bodies, plan)?;
                        }
                        number_replacements(&mut tx, rows)?;
                    }
                }
            }
            Ok(tx)
        });
        clock.lap(&mut phases.execute);
        let result = executed.and_then(|tx| tx.commit().map_err(failed));
        clock.lap(&mut phases.commit);
        result
    }

    pub(super) fn try_purge_receipts(&mut self, before: SystemTime) -> Result<u64, StoreError> {
        self.connection().and_then(|(c, _)| {
            let mut removed = 0;
            for table in ["receipts", "receipt_variants"] {
                removed += c
                    .execute(
                        &format!("DELETE FROM {table} WHERE first_seen_ns < $1"),
                        &[&time_ns(before)],
                    )
                    .map_err(failed)?;
            }
            Ok(removed)
        })
    }

    pub(super) fn try_purge_records(
        &mut self,
        records: Records,
        before: SystemTime,
        limit: usize,
    ) -> Result<u64, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let sql: &str = match records {
            Records::Audit => PURGE_AUDIT,
            Records::History => &format!(
                "DELETE FROM replacements WHERE id IN
                 (SELECT id FROM replacements WHERE at_ns < $1 AND {}
                  ORDER BY at_ns LIMIT $2)",
                crate::store::outbox::RELAYS_PASSED
            ),
            Records::Resolved => {
                "DELETE FROM held WHERE id IN
                 (SELECT id FROM held WHERE status = 'resolved' AND at_ns < $1 LIMIT $2)"
            }
        };
        // One statement: its own short transaction (the audit's two, see
        // `PURGE_AUDIT_BATCH`). The space is left to autovacuum, which makes
        // the dead rows' room reusable.
        self.connection().and_then(|(c, _)| {
            if !matches!(records, Records::Audit) {
                return c.execute(sql, &[&time_ns(before), &limit]).map_err(failed);
            }
            let mut tx = c.transaction().map_err(failed)?;
            let ids: Vec<i64> = tx
                .query(PURGE_AUDIT_BATCH, &[&time_ns(before), &limit])
                .map_err(failed)?
                .iter()
                .map(|r| r.get(0))
                .collect();
            let removed = tx.execute(sql, &[&ids]).map_err(failed)?;
            tx.commit().map_err(failed)?;
            Ok(removed)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_server as server;
    use super::*;

    /// The sum of one counter over every node of a text plan.
    fn plan_total(plan: &[String], counter: &str) -> u64 {
        plan.iter()
            .filter_map(|line| line.trim().strip_prefix(counter))
            .filter_map(|rest| rest.trim_start_matches(':').trim().parse::<u64>().ok())
            .sum()
    }

    /// The lines of `EXPLAIN ANALYZE` of the prepared statement `name` run
    /// with `args` (SQL literals) in `tx`.
    fn explain(tx: &mut postgres::Transaction<'_>, name: &str, args: &[String]) -> Vec<String> {
        let sql = format!(
            "EXPLAIN (ANALYZE, FORMAT TEXT) EXECUTE {name}({})",
            args.join(", ")
        );
        tx.query(&sql, &[])
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect()
    }

    /// An audit row of [`literal_args`]: its sequence number and the
    /// committed row whose body it proposes to share.
    type AuditArg = (i64, Option<i64>);

    /// [`GROUP`]'s 50 parameters as SQL literals for `EXPLAIN EXECUTE`
    /// (which takes no protocol parameters): objects `o-1` ... `o-{objects}`
    /// moved from version 1 to 2, and one audit row of origin 1 and body `x`
    /// per `(seq, body_from)`; every other array empty.
    fn literal_args(objects: usize, audit: &[AuditArg]) -> Vec<String> {
        let array = |items: Vec<String>, ty: &str| match items.is_empty() {
            true => format!("'{{}}'::{ty}[]"),
            false => format!("ARRAY[{}]::{ty}[]", items.join(",")),
        };
        let each =
            |item: &dyn Fn(usize) -> String, ty: &str| array((1..=objects).map(item).collect(), ty);
        let rows = |item: &dyn Fn(&AuditArg) -> String, ty: &str| {
            array(audit.iter().map(item).collect(), ty)
        };
        let empty = |types: &[&str]| -> Vec<String> {
            types.iter().map(|ty| array(Vec::new(), ty)).collect()
        };
        let mut args = vec![
            each(&|i| format!("'o-{i}'"), "text"),
            each(&|_| format!("'{}'", version_text(1)), "text"),
            each(&|_| "false".into(), "bool"),
            each(&|_| "true".into(), "bool"),
            each(&|_| format!("'{}'", version_text(2)), "text"),
            each(&|_| "'2'".into(), "text"),
            each(&|_| "false".into(), "bool"),
        ];
        // Receipts (5), held (10).
        args.extend(empty(&["text", "bytea", "text", "text", "int8"]));
        args.extend(empty(&[
            "int8", "int8", "int8", "text", "text", "text", "bytea", "text", "text", "text",
        ]));
        // Audit (11): origin, seq, time, event, object, kind, decision,
        // version, replacement, detail, body.
        args.push(rows(&|_| "1".into(), "int8"));
        args.push(rows(&|(seq, _)| seq.to_string(), "int8"));
        args.push(rows(&|_| "0".into(), "int8"));
        args.extend((0..2).map(|_| rows(&|_| "NULL".into(), "text")));
        args.push(rows(&|_| "'delivery'".into(), "text"));
        args.extend((0..2).map(|_| rows(&|_| "NULL".into(), "text")));
        args.push(rows(&|_| "false".into(), "bool"));
        args.push(rows(&|_| "NULL".into(), "text"));
        args.push(rows(&|_| "'x'::bytea".into(), "bytea"));
        // Replacements (7), variants (4), cut-offs (1), state pointers
        // (2), trace contexts (1).
        args.extend(empty(&[
            "int8", "int8", "int8", "text", "text", "text", "text",
        ]));
        args.extend(empty(&["text", "bytea", "text", "int8", "int8"]));
        args.extend(empty(&["int8", "int8", "text"]));
        // Repeated bodies: a committed row's, none of the group's.
        args.push(rows(
            &|(_, from)| from.map_or("NULL".into(), |f| f.to_string()),
            "int8",
        ));
        args.push(rows(&|_| "NULL".into(), "int8"));
        assert_eq!(args.len(), 50);
        args
    }

    /// A redelivery's proposed body is found by its key, however many audit
    /// rows the table holds and whatever the statistics said when the plan
    /// was made. (As a semi join, a generic plan made while `audit` was
    /// nearly empty, never analysed since, compared every proposal with
    /// every audit row in every group: one call per delivery slowed to a
    /// crawl as the table grew.)
    #[test]
    fn a_proposed_body_is_found_by_its_key_whatever_the_statistics() {
        let Some(url) = server() else { return };
        let schema = format!("plan_repeat_{}", std::process::id());
        let mut store = PostgresStore::connect_in_schema(&url, Some(&schema)).unwrap();
        let (client, _) = store.connection().unwrap();
        // The generic plan, made and cached while `audit` is empty.
        client
            .batch_execute(&format!(
                "SET plan_cache_mode = force_generic_plan; PREPARE plan_repeat AS {GROUP}"
            ))
            .unwrap();
        client
            .batch_execute(&format!(
                "EXECUTE plan_repeat({})",
                literal_args(0, &[]).join(", ")
            ))
            .unwrap();
        const N: i64 = 2_000;
        client
            .execute(
                "INSERT INTO audit (origin, seq, at_ns, kind, replacement, body)
                 SELECT 1, i, 0, 'delivery', false, 'x' FROM generate_series(1, $1::int8) i",
                &[&N],
            )
            .unwrap();
        let args = literal_args(0, &[(N + 1, Some(N)), (N + 2, Some(7)), (N + 3, None)]);
        let mut tx = client.transaction().unwrap();
        let plan = explain(&mut tx, "plan_repeat", &args);
        let stored: Vec<(i64, Option<i64>, bool)> = tx
            .query(
                "SELECT seq, body_seq, body IS NULL FROM audit WHERE seq > $1 ORDER BY seq",
                &[&N],
            )
            .unwrap()
            .iter()
            .map(|row| (row.get(0), row.get(1), row.get(2)))
            .collect();
        tx.rollback().unwrap();
        client
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .unwrap();
        assert_eq!(
            stored,
            [
                (N + 1, Some(N), true),
                (N + 2, Some(7), true),
                (N + 3, None, false)
            ]
        );
        let compared = plan_total(&plan, "Rows Removed by Join Filter")
            + plan_total(&plan, "Rows Removed by Filter");
        assert!(
            compared < 10,
            "the group statement discarded {compared} rows to find 2 proposed bodies among \
             {N} audit rows; its plan:\n{}",
            plan.join("\n")
        );
    }

    /// The group statement's work grows with the group, not with its
    /// square: with 2,000 objects in one group the server compares each
    /// object with its own row only. (A join between two of its CTEs once
    /// made the planner, which guesses 10 rows for any `unnest`, pick a
    /// nested loop that compared every object with every other: 2.7
    /// million comparisons for 1,645 objects.) The plan counters are
    /// counts, not times, so the check does not depend on the machine.
    #[test]
    fn the_group_statement_compares_each_object_with_its_own_row_only() {
        let Some(url) = server() else { return };
        let schema = format!("plan_check_{}", std::process::id());
        let mut store = PostgresStore::connect_in_schema(&url, Some(&schema)).unwrap();
        let (client, _) = store.connection().unwrap();
        const N: usize = 2_000;
        client
            .execute(
                "INSERT INTO objects (object_id, version, state, paused)
                 SELECT 'o-' || i, lpad('1', 20, '0'), '{}', false FROM generate_series(1, $1) i",
                &[&(N as i32)],
            )
            .unwrap();
        // The store's prepared statement runs with a generic plan after its
        // first executions, planned without the arrays' lengths; force that
        // plan here (a one-off query would be planned for these arrays).
        // Which join the planner picks then depends on the tables' statistics
        // at that moment; without hash and merge joins, every join is a
        // nested loop, so the statement is linear only if each object
        // reaches its row through an index, whatever the statistics say.
        client
            .batch_execute(&format!(
                "SET plan_cache_mode = force_generic_plan; SET enable_hashjoin = off;
                 SET enable_mergejoin = off; PREPARE plan_check AS {GROUP}"
            ))
            .unwrap();
        let args = literal_args(N, &[]);
        let mut tx = client.transaction().unwrap();
        let plan = explain(&mut tx, "plan_check", &args);
        let written: i64 = tx
            .query_one(
                "SELECT count(*) FROM objects WHERE version = $1",
                &[&version_text(2)],
            )
            .unwrap()
            .get(0);
        tx.rollback().unwrap();
        client
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .unwrap();
        assert_eq!(written, N as i64, "every object of the group written");
        let compared = plan_total(&plan, "Rows Removed by Join Filter");
        assert!(
            compared < N as u64,
            "the group statement discarded {compared} joined rows for a group of {N} \
             objects; its plan:\n{}",
            plan.join("\n")
        );
    }
}
