//! How a history row points at the body its state came from
//! (docs/CONTRACT.md §9: a body is stored once), shared by both backends.

use super::{AuditRow, EffectRow, HeldKey};
use std::collections::HashMap;

/// Where a replacement's state lies in the body of its step's audit row:
/// `(byte offset, byte length)`, when that body is a delivery's and holds
/// the state's compact text exactly (the common case: a body sent without
/// extra spaces). The history row then stores this instead of the state
/// again, and a read takes the state from the audit row's body.
pub(crate) type StateAt = Option<(i64, i64)>;

/// Of `audit` (a transaction's audit rows), those that may hold a replacement's state, by key.
pub(crate) fn delivery_bodies<'a>(
    audit: impl IntoIterator<Item = &'a AuditRow>,
) -> HashMap<HeldKey, &'a AuditRow> {
    audit
        .into_iter()
        .filter(|a| a.kind == "delivery" && a.replacement && a.body.is_some())
        .map(|a| (a.key, a))
        .collect()
}

/// [`StateAt`] of `r` among `bodies`.
pub(crate) fn state_at(bodies: &HashMap<HeldKey, &AuditRow>, r: &EffectRow) -> StateAt {
    let body = bodies.get(&r.key)?.body.as_deref()?;
    let text = std::str::from_utf8(body).ok()?;
    let at = text.find(r.state.as_str())?;
    Some((i64::try_from(at).ok()?, i64::try_from(r.state.len()).ok()?))
}

/// The state column of a history row: empty when [`StateAt`] points into
/// the audit row's body (a state is never empty JSON text).
pub(crate) fn state_column(r: &EffectRow, at: StateAt) -> &str {
    match at {
        Some(_) => "",
        None => &r.state,
    }
}
