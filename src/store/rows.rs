//! The stored encodings both backends share: how a row's versions, times,
//! verdicts and audit kinds are written into a store's columns and read
//! back. Versions are 20-digit zero-padded decimal text, so that every u64
//! fits and text order is numeric order in both SQLite and PostgreSQL;
//! times are nanoseconds since the Unix epoch.
//!
//! Each kind of row has one decoder here, over [`Columns`], whoever reads
//! it: a backend's loads (its own rows), the relays (`outbox.rs`) and the
//! reader ([`super::StoreReader`], rows as cells, `sql.rs`).

use super::{
    AuditRow, EffectRow, HeldBody, HeldKey, HeldRow, HeldStatus, ObjectRow, ParkedEffect,
    ParkedStatus, ReceiptRow, RelayRow, StoreError, VariantRow,
};
use snapshot_receiver_core::engine::Effect;
use snapshot_receiver_core::relay::EffectHead;
use snapshot_receiver_core::TraceContext;
use snapshot_receiver_core::Verdict;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A [`super::ReceiptRow::retention_cutoff`] as stored times are compared with it:
/// nanoseconds since the Unix epoch, `-1` (below every stored time) for `None`.
pub(super) fn cutoff_ns(cutoff: Option<SystemTime>) -> i64 {
    cutoff.map_or(-1, time_ns)
}

/// A version as stored: 20-digit zero-padded decimal text.
pub(super) fn version_text(v: u64) -> String {
    format!("{v:020}")
}

/// Reads a stored version.
pub(super) fn parse_version(text: &str) -> Result<u64, StoreError> {
    text.parse()
        .map_err(|_| StoreError::Failed(format!("corrupt version {text:?} in the store")))
}

/// Nanoseconds since the Unix epoch, as stored (i64 reaches the year 2262).
pub(super) fn time_ns(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// Reads a stored time.
pub(super) fn ns_time(ns: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(u64::try_from(ns).unwrap_or(0))
}

/// Reads a stored verdict code.
pub(super) fn verdict(code: &str) -> Result<Verdict, StoreError> {
    Verdict::from_code(code)
        .ok_or_else(|| StoreError::Failed(format!("corrupt decision {code:?} in the store")))
}

/// Maps a stored audit kind back to its static name.
pub(super) fn audit_kind(kind: &str) -> Result<&'static str, StoreError> {
    [
        "delivery",
        "malformed",
        "paused",
        "authority",
        "authority_refused",
        "reevaluated",
        "unresolved",
    ]
    .into_iter()
    .find(|k| *k == kind)
    .ok_or_else(|| StoreError::Failed(format!("corrupt audit kind {kind:?}")))
}

/// One stored row as the decoders below read it: its columns by position,
/// whatever the backend's types (a flag is SQLite's 0/1 integer or a
/// PostgreSQL boolean). Each backend implements it for its row type; a
/// column of another type is the backend's error, never a panic.
pub(super) trait Columns {
    /// An integer column.
    fn int(&self, i: usize) -> Result<i64, StoreError>;
    /// An integer column that may be `NULL`.
    fn opt_int(&self, i: usize) -> Result<Option<i64>, StoreError>;
    /// A text column that may be `NULL`.
    fn opt_text(&self, i: usize) -> Result<Option<String>, StoreError>;
    /// A bytes column that may be `NULL`.
    fn opt_bytes(&self, i: usize) -> Result<Option<Vec<u8>>, StoreError>;
    /// A flag column.
    fn flag(&self, i: usize) -> Result<bool, StoreError>;
    /// A text column.
    fn text(&self, i: usize) -> Result<String, StoreError>;
    /// A bytes column.
    fn bytes(&self, i: usize) -> Result<Vec<u8>, StoreError>;
}

/// The columns [`receipt_row`] reads, in its order.
pub(super) const RECEIPT_COLUMNS: &str =
    "event_id, fingerprint, object_id, decision, first_seen_ns";
/// The columns [`variant_row`] reads, in its order.
pub(super) const VARIANT_COLUMNS: &str = "event_id, fingerprint, object_id, first_seen_ns";
/// The columns [`object_row`] reads, in its order.
pub(super) const OBJECT_COLUMNS: &str = "object_id, version, state, paused";
/// The condition of the objects a receiver that reads the others on demand
/// keeps in memory from the start: paused, or named by an unresolved held row
/// (every status but `resolved`). Each half reads an index (the partial
/// `objects_paused`, `held_status`), so start-up does not scan the objects.
pub(super) const PINNED_OBJECTS: &str = "WHERE object_id IN \
     (SELECT object_id FROM objects WHERE paused \
      UNION SELECT object_id FROM held \
      WHERE status IN ('held', 'parked', 'malformed', 'superseded') AND object_id IS NOT NULL) \
     ORDER BY object_id";
/// The columns [`held_row`] reads, in its order.
pub(super) const HELD_COLUMNS: &str =
    "origin, seq, at_ns, event_id, object_id, held_as, body, status, superseded_by, detail";
/// The columns [`held_row`] reads, the body left out (an empty body in its
/// place): a start-up of shards that read waiting bodies from the store
/// when they decide them again (docs/CONTRACT.md §9). `{empty}` is the
/// backend's empty byte string.
pub(super) fn held_columns_without_body(empty: &str) -> String {
    format!(
        "origin, seq, at_ns, event_id, object_id, held_as, {empty}, status, superseded_by, detail"
    )
}
/// The columns [`held_body`] reads, in its order.
pub(super) const HELD_BODY_COLUMNS: &str = "origin, seq, body";
/// The columns [`audit_row`] reads, in its order, from `audit` (not
/// aliased): a body that repeats another row's exact bytes (`body_seq`,
/// see `repeat.rs`) is read from that row.
pub(super) const AUDIT_COLUMNS: &str =
    "origin, seq, at_ns, event_id, object_id, kind, decision, version, replacement, detail, \
     coalesce(body, (SELECT f.body FROM audit AS f \
                     WHERE f.origin = audit.origin AND f.seq = audit.body_seq))";
/// [`AUDIT_COLUMNS`] of a store an older version created, read without
/// migrating it: every body in place, no `body_seq` column.
pub(super) const AUDIT_COLUMNS_IN_PLACE: &str =
    "origin, seq, at_ns, event_id, object_id, kind, decision, version, replacement, detail, body";

/// A stored fingerprint: 16 bytes, little-endian u128; `what` names it in
/// the error.
fn fingerprint(bytes: Vec<u8>, what: &str, event_id: &str) -> Result<u128, StoreError> {
    let fp: [u8; 16] = bytes
        .try_into()
        .map_err(|_| StoreError::Failed(format!("corrupt {what} of {event_id}")))?;
    Ok(u128::from_le_bytes(fp))
}

/// A stored (origin, seq) key in columns 0 and 1.
fn key(r: &dyn Columns) -> Result<HeldKey, StoreError> {
    Ok(HeldKey {
        origin: r.int(0)? as u64,
        seq: r.int(1)? as u64,
    })
}

/// A receipt read back ([`RECEIPT_COLUMNS`]).
pub(super) fn receipt_row(r: &dyn Columns) -> Result<ReceiptRow, StoreError> {
    let event_id = r.text(0)?;
    Ok(ReceiptRow {
        fingerprint: fingerprint(r.bytes(1)?, "fingerprint", &event_id)?,
        event_id: Arc::from(event_id),
        object_id: Arc::from(r.text(2)?),
        decision: verdict(&r.text(3)?)?,
        first_seen: ns_time(r.int(4)?),
        retention_cutoff: None,
    })
}

/// The columns [`stored_identity`] reads, in its order.
pub(super) const IDENTITY_COLUMNS: &str = "event_id, first_seen_ns";

/// An event identity with when it was first seen ([`IDENTITY_COLUMNS`]).
pub(super) fn stored_identity(r: &dyn Columns) -> Result<(Arc<str>, SystemTime), StoreError> {
    Ok((Arc::from(r.text(0)?), ns_time(r.int(1)?)))
}

/// A variant read back ([`VARIANT_COLUMNS`]).
pub(super) fn variant_row(r: &dyn Columns) -> Result<VariantRow, StoreError> {
    let event_id = r.text(0)?;
    Ok(VariantRow {
        fingerprint: fingerprint(r.bytes(1)?, "variant fingerprint", &event_id)?,
        event_id: Arc::from(event_id),
        object_id: Arc::from(r.text(2)?),
        first_seen: ns_time(r.int(3)?),
    })
}

/// An object read back ([`OBJECT_COLUMNS`]).
pub(super) fn object_row(r: &dyn Columns) -> Result<ObjectRow, StoreError> {
    Ok(ObjectRow {
        object_id: Arc::from(r.text(0)?),
        version: parse_version(&r.text(1)?)?,
        state: r.text(2)?,
        paused: r.flag(3)?,
    })
}

/// A held row read back ([`HELD_COLUMNS`]).
pub(super) fn held_row(r: &dyn Columns) -> Result<HeldRow, StoreError> {
    let status = r.text(7)?;
    Ok(HeldRow {
        key: key(r)?,
        at: ns_time(r.int(2)?),
        event_id: r.opt_text(3)?.map(Arc::from),
        object_id: r.opt_text(4)?.map(Arc::from),
        held_as: verdict(&r.text(5)?)?,
        body: Arc::from(r.bytes(6)?),
        status: HeldStatus::parse(&status)
            .ok_or_else(|| StoreError::Failed(format!("corrupt held status {status:?}")))?,
        superseded_by: r.opt_text(8)?.as_deref().map(parse_version).transpose()?,
        detail: r.opt_text(9)?,
    })
}

/// A held row's key and exact body read back ([`HELD_BODY_COLUMNS`]).
pub(super) fn held_body(r: &dyn Columns) -> Result<HeldBody, StoreError> {
    Ok((key(r)?, Arc::from(r.bytes(2)?)))
}

/// An audit row read back ([`AUDIT_COLUMNS`]).
pub(super) fn audit_row(r: &dyn Columns) -> Result<AuditRow, StoreError> {
    Ok(AuditRow {
        key: key(r)?,
        at: ns_time(r.int(2)?),
        event_id: r.opt_text(3)?.map(Arc::from),
        object_id: r.opt_text(4)?.map(Arc::from),
        kind: audit_kind(&r.text(5)?)?,
        decision: r.opt_text(6)?,
        version: r.opt_text(7)?.as_deref().map(parse_version).transpose()?,
        replacement: r.flag(8)?,
        detail: r.opt_text(9)?,
        body: r.opt_bytes(10)?.map(Arc::from),
    })
}

/// A history row read back: origin, seq, at_ns, object_id, version, the
/// state (its own, or the slice of its step's audit body it points at:
/// each backend's SQL), cause_event and trace_context
/// ([`TraceContext::to_stored`]).
pub(super) fn replacement_row(r: &dyn Columns) -> Result<EffectRow, StoreError> {
    let key = key(r)?;
    Ok(EffectRow {
        key,
        at: ns_time(r.int(2)?),
        object_id: Arc::from(r.text(3)?),
        version: parse_version(&r.text(4)?)?,
        // NULL only when the audit body the row points at is gone, which
        // the audit purge never leaves.
        state: r.opt_text(5)?.ok_or_else(|| {
            StoreError::Failed(format!(
                "corrupt history row {}: its state's audit body is missing",
                key.seq
            ))
        })?,
        cause_event: r.opt_text(6)?.map(Arc::from),
        trace: stored_trace(r.opt_text(7)?, key.seq)?,
    })
}

/// A stored trace context read back; one this version cannot read is a
/// corrupt row (it wrote it from a checked one).
fn stored_trace(text: Option<String>, seq: u64) -> Result<Option<Arc<TraceContext>>, StoreError> {
    text.map(|t| {
        TraceContext::from_stored(&t).map(Arc::new).map_err(|e| {
            StoreError::Failed(format!("corrupt history row {seq}: its trace context: {e}"))
        })
    })
    .transpose()
}

/// The columns [`effect`] reads, in its order (`r`: the history row, `a`
/// its step's audit row).
pub(super) const EFFECT_COLUMNS: &str =
    "r.origin, r.seq, r.at_ns, r.object_id, r.version, {state}, \
     r.cause_event, r.trace_context, r.position";

/// The join [`EFFECT_COLUMNS`] reads from.
pub(super) const EFFECT_FROM: &str = "replacements AS r LEFT JOIN audit AS a \
     ON r.state_at IS NOT NULL AND a.origin = r.origin AND a.seq = r.seq";

/// An effect read back ([`EFFECT_COLUMNS`]).
pub(super) fn effect(r: &dyn Columns) -> Result<Effect, StoreError> {
    let row = replacement_row(r)?;
    let position = u64::try_from(r.int(8)?)
        .map_err(|_| StoreError::Failed("outbox: a negative position".to_owned()))?;
    Ok(Effect::from_row(position, row))
}

/// The columns [`relay_row`] reads, in its order.
pub(super) const RELAY_COLUMNS: &str =
    "name, position, generation, owner, lease_until_ns, updated_ns, \
     backlogged_since_ns, parked_bytes";

/// [`RELAY_COLUMNS`] of a store written by a version before the relays'
/// backlog was kept, read without migrating it: the backlog unknown.
pub(super) const RELAY_COLUMNS_BEFORE_BACKLOG: &str =
    "name, position, generation, owner, lease_until_ns, updated_ns, \
     CAST(NULL AS BIGINT), CAST(NULL AS BIGINT)";

/// A relay read back ([`RELAY_COLUMNS`]).
pub(super) fn relay_row(r: &dyn Columns) -> Result<RelayRow, StoreError> {
    Ok(RelayRow {
        name: r.text(0)?,
        position: r.int(1)? as u64,
        generation: r.int(2)? as u64,
        owner: r.opt_text(3)?,
        lease_until: r.opt_int(4)?.map(ns_time),
        updated: ns_time(r.int(5)?),
        backlogged_since: r.opt_int(6)?.map(ns_time),
        parked_bytes: r
            .opt_int(7)?
            .map(|n| {
                u64::try_from(n)
                    .map_err(|_| StoreError::Failed("relays: a negative parked_bytes".to_owned()))
            })
            .transpose()?,
    })
}

/// The parked effects (`p`) with their history rows (`r`) and those rows'
/// history rows (`r`), by relay and position: the effect's head
/// (origin, seq, at_ns, object_id, version, its state's length in bytes,
/// position; not the state), then status, attempts, due_ns, error and
/// updated_ns, as [`parked`] reads them, and the relay's name (column
/// [`PARKED_RELAY`]). `filter`: a `WHERE` clause, or nothing.
pub(super) fn parked_effects(filter: &str) -> String {
    format!(
        "SELECT r.origin, r.seq, r.at_ns, r.object_id, r.version, {{state_bytes}}, r.position,
                p.status, p.attempts, p.due_ns, p.error, p.updated_ns, p.relay
         FROM relay_parked AS p JOIN replacements AS r ON r.position = p.position
         {filter} ORDER BY p.relay, p.position"
    )
}

/// The column of [`parked_effects`] that names the relay.
pub(super) const PARKED_RELAY: usize = 12;

/// A parked effect read back ([`parked_effects`]): its effect's head only.
pub(super) fn parked(r: &dyn Columns) -> Result<ParkedEffect, StoreError> {
    let key = key(r)?;
    let status = r.text(7)?;
    let count = |n: i64, what: &str| {
        u64::try_from(n).map_err(|_| StoreError::Failed(format!("outbox: a negative {what}")))
    };
    Ok(ParkedEffect {
        effect: EffectHead {
            position: count(r.int(6)?, "position")?,
            id: key.into(),
            at: ns_time(r.int(2)?),
            object_id: Arc::from(r.text(3)?),
            version: parse_version(&r.text(4)?)?,
            bytes: usize::try_from(count(r.opt_int(5)?.unwrap_or(0), "state length")?)
                .unwrap_or(usize::MAX),
        },
        status: ParkedStatus::parse(&status)
            .ok_or_else(|| StoreError::Failed(format!("outbox: parked status {status:?}")))?,
        attempts: u32::try_from(r.int(8)?).unwrap_or(u32::MAX),
        due: r.opt_int(9)?.map(ns_time),
        error: r.opt_text(10)?,
        updated: ns_time(r.int(11)?),
    })
}

/// The conflict of an object an event created that another writer created
/// first.
pub(super) fn exists(object_id: &str) -> StoreError {
    StoreError::Conflict(format!("object {object_id} to create exists already"))
}

/// The conflict of an object whose row is no longer as the decision read it.
pub(super) fn changed(object_id: &str) -> StoreError {
    StoreError::Conflict(format!("object {object_id} changed since it was read"))
}

/// The conflict of a variant whose first record's receipt is not stored
/// (yet): another shard or process has not committed it.
pub(super) fn first_record_not_stored(event_id: &str) -> StoreError {
    StoreError::Conflict(format!(
        "the first record of {event_id} is not stored yet: its variant waits for it"
    ))
}

/// The conflict of a pause of an object no other writer has stored (yet).
pub(super) fn not_stored(object_id: &str) -> StoreError {
    StoreError::Conflict(format!("object {object_id} to pause is not stored"))
}

/// The conflict of a live receipt another writer recorded first.
pub(super) fn receipt_recorded(event_id: &str) -> StoreError {
    StoreError::Conflict(format!("receipt for {event_id} already exists"))
}

/// The conflict of a variant another writer recorded first.
pub(super) fn variant_recorded(v: &VariantRow) -> StoreError {
    StoreError::Conflict(format!(
        "variant {:032x} of {} already recorded",
        v.fingerprint, v.event_id
    ))
}
