//! [`super::StoreReader`]'s views of a log-structured store (`lsm:DIR`):
//! the same views as the SQL backends', made from the rows the store
//! decodes ([`crate::store::lsm::LsmRows`]) with the reader's own wire
//! names, counts and pause causes. Each view reads at one instant of the
//! keyspace; the audit views scan the trail (the store has no index by
//! event or object for them).

use super::{
    delivery_wire, held_wire, pause_cause_of, AuditLine, AuthorityWaitLine, HeldEvent,
    ParkedObject, StoreSummary, StoredObject, DECISIONS,
};
use crate::format_rfc3339;
use crate::store::lsm::LsmRows;
use crate::store::relay_report::{status, ParkedLine};
use crate::store::{AuditRow, HeldStatus, RelaysReport, StoreError};
use std::collections::BTreeMap;

/// Whether an audit row records what paused its object: a `paused` row,
/// or a delivery or re-decision that was a conflict.
fn pauses(a: &AuditRow) -> bool {
    a.kind == "paused"
        || (matches!(a.kind, "delivery" | "reevaluated")
            && a.decision
                .as_deref()
                .is_some_and(|d| d.starts_with("conflict:")))
}

/// Fills `object`'s pause cause from the row that paused it.
fn cause(object: &mut StoredObject, a: &AuditRow) -> Result<(), StoreError> {
    pause_cause_of(
        object,
        a.kind,
        a.decision.as_deref(),
        a.event_id.as_deref(),
        a.at,
    )
}

pub(super) fn summary(rows: &LsmRows, location: &str) -> Result<StoreSummary, StoreError> {
    let mut decisions: BTreeMap<String, u64> =
        DECISIONS.iter().map(|d| ((*d).to_owned(), 0)).collect();
    let mut last = None;
    for a in rows.audit(|_| true)? {
        last = last.max(Some(a.at));
        if matches!(a.kind, "delivery" | "malformed") {
            let wire = delivery_wire(a.decision.as_deref().unwrap_or_default())?;
            *decisions.entry(wire.decision).or_default() += 1;
        }
    }
    let objects = rows.objects(false)?;
    let mut held = BTreeMap::new();
    let mut superseded = 0;
    let mut parked: BTreeMap<String, u64> = BTreeMap::new();
    for (h, _) in rows.held()? {
        if h.status == HeldStatus::Superseded {
            superseded += 1;
            continue;
        }
        *held.entry(held_wire(h.held_as).1).or_default() += 1;
        if let (HeldStatus::Parked, Some(id)) = (h.status, &h.object_id) {
            *parked.entry(id.to_string()).or_default() += 1;
        }
    }
    let (identities, oldest, variants) = rows.identities()?;
    Ok(StoreSummary {
        location: location.to_owned(),
        decisions,
        objects: objects.len() as u64,
        paused_objects: objects.iter().filter(|o| o.paused).count() as u64,
        deleted_objects: objects.iter().filter(|o| o.state == "null").count() as u64,
        held,
        superseded,
        parked: parked
            .into_iter()
            .map(|(object_id, events)| ParkedObject { object_id, events })
            .collect(),
        identities,
        variants,
        oldest_identity_at: oldest.map(format_rfc3339),
        last_recorded_at: last.map(format_rfc3339),
    })
}

pub(super) fn object(rows: &LsmRows, object_id: &str) -> Result<Option<StoredObject>, StoreError> {
    let Some(row) = rows.object(object_id)? else {
        return Ok(None);
    };
    let mut object = StoredObject::of(row)?;
    if object.paused {
        let last = rows
            .audit(|a| a.object_id.as_deref() == Some(object_id) && pauses(a))?
            .pop();
        if let Some(a) = last {
            cause(&mut object, &a)?;
        }
    }
    Ok(Some(object))
}

pub(super) fn objects(rows: &LsmRows, paused_only: bool) -> Result<Vec<StoredObject>, StoreError> {
    let mut objects = rows
        .objects(paused_only)?
        .into_iter()
        .map(StoredObject::of)
        .collect::<Result<Vec<_>, _>>()?;
    if objects.iter().any(|o| o.paused) {
        // The last pausing row of each object is what paused it.
        let mut last: BTreeMap<String, AuditRow> = BTreeMap::new();
        for a in rows.audit(|a| a.object_id.is_some() && pauses(a))? {
            let id = a.object_id.as_deref().unwrap_or_default().to_owned();
            last.insert(id, a);
        }
        for object in objects.iter_mut().filter(|o| o.paused) {
            if let Some(a) = last.remove(&object.object_id) {
                cause(object, &a)?;
            }
        }
    }
    Ok(objects)
}

pub(super) fn held(rows: &LsmRows, reason: Option<&str>) -> Result<Vec<HeldEvent>, StoreError> {
    let codes = reason.map(|r| (format!("held:{r}"), format!("conflict:{r}")));
    Ok(rows
        .held()?
        .into_iter()
        .filter(|(h, _)| h.status != HeldStatus::Superseded)
        .filter(|(h, _)| match &codes {
            Some((held, conflict)) => {
                let code = h.held_as.code();
                code == *held || code == *conflict
            }
            None => true,
        })
        .map(|(h, first)| {
            let variant = h.held_as.code() == "conflict:event_variant";
            HeldEvent::of(h, first.filter(|_| variant))
        })
        .collect())
}

pub(super) fn authority_waits(rows: &LsmRows) -> Result<Vec<AuthorityWaitLine>, StoreError> {
    rows.waits()
}

pub(super) fn audit(
    rows: &LsmRows,
    keep: impl Fn(&AuditRow) -> bool,
) -> Result<Vec<AuditLine>, StoreError> {
    rows.audit(keep)?.into_iter().map(AuditLine::of).collect()
}

pub(super) fn recent_audit(rows: &LsmRows, limit: usize) -> Result<Vec<AuditLine>, StoreError> {
    let mut lines = rows
        .recent_audit(limit)?
        .into_iter()
        .map(AuditLine::of)
        .collect::<Result<Vec<_>, _>>()?;
    lines.reverse();
    Ok(lines)
}

pub(super) fn relays(
    rows: &LsmRows,
    now: std::time::SystemTime,
    window: Option<std::time::Duration>,
) -> Result<RelaysReport, StoreError> {
    let crate::store::lsm::RelayRows {
        last,
        relays,
        parked,
    } = rows.relays()?;
    let mut lines: BTreeMap<String, Vec<ParkedLine>> = BTreeMap::new();
    for (relay, p) in &parked {
        lines
            .entry(relay.clone())
            .or_default()
            .push(ParkedLine::of(p));
    }
    let mut statuses = Vec::new();
    for relay in relays {
        let next = rows.next_effect(relay.position)?;
        let parked = lines.remove(&relay.name).unwrap_or_default();
        statuses.push(status(relay, parked, next, last, now, window));
    }
    Ok(RelaysReport {
        last_position: last,
        history_window_seconds: window.map(|w| w.as_secs()),
        relays: statuses,
    })
}
