//! How the log-structured store lays its rows out: the keys (byte strings
//! whose order is the order a scan needs) and the values (postcard, a
//! compact serde format).

use crate::store::rows::{audit_kind, ns_time, time_ns, verdict};
use crate::store::{
    AuditRow, EffectRow, HeldKey, HeldRow, HeldStatus, ObjectRow, ReceiptRow, StoreError,
    VariantRow,
};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::sync::Arc;
use std::time::SystemTime;

/// The longest key the store takes, bytes (fjall's limit: a key's length
/// is a u16).
pub(super) const MAX_KEY: usize = u16::MAX as usize;

/// A u64 as a key part: big-endian, so that byte order is numeric order.
pub(super) fn be(n: u64) -> [u8; 8] {
    n.to_be_bytes()
}

/// Reads a key part written by [`be`] at `at`.
pub(super) fn read_be(key: &[u8], at: usize) -> Result<u64, StoreError> {
    key.get(at..at + 8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
        .ok_or_else(|| corrupt("key", "a number part is cut short"))
}

/// A stored time as a key part (nanoseconds since the Unix epoch; stored
/// times start there, so the value is never negative).
pub(super) fn time_key(t: SystemTime) -> [u8; 8] {
    be(time_ns(t).max(0) as u64)
}

/// The key of a row identified by (origin, sequence number): held rows and
/// their bodies.
pub(super) fn held_key(key: HeldKey) -> Vec<u8> {
    let mut k = Vec::with_capacity(16);
    k.extend_from_slice(&be(key.origin));
    k.extend_from_slice(&be(key.seq));
    k
}

/// Reads [`held_key`] back from the last 16 bytes of `key`.
pub(super) fn held_key_at_end(key: &[u8]) -> Result<HeldKey, StoreError> {
    let at = key
        .len()
        .checked_sub(16)
        .ok_or_else(|| corrupt("key", "a held key is cut short"))?;
    Ok(HeldKey {
        origin: read_be(key, at)?,
        seq: read_be(key, at + 8)?,
    })
}

/// An id as the first part of a longer key: its length (4 bytes,
/// big-endian), then its bytes, so that one id's keys never interleave
/// with another's that it starts.
pub(super) fn id_prefix(id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(4 + id.len() + 16);
    k.extend_from_slice(&(id.len() as u32).to_be_bytes());
    k.extend_from_slice(id.as_bytes());
    k
}

/// A time-ordered index key: the time, then `rest` (which makes it unique).
pub(super) fn by_time(t: SystemTime, rest: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + rest.len());
    k.extend_from_slice(&time_key(t));
    k.extend_from_slice(rest);
    k
}

/// A stored row this version cannot read.
pub(super) fn corrupt(what: &str, why: impl std::fmt::Display) -> StoreError {
    StoreError::Failed(format!("lsm: corrupt {what} row: {why}"))
}

/// Encodes a value.
pub(super) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, StoreError> {
    postcard::to_stdvec(value).map_err(|e| StoreError::Failed(format!("lsm: cannot encode: {e}")))
}

/// Decodes a value of `what`.
pub(super) fn decode<'a, T: Deserialize<'a>>(what: &str, bytes: &'a [u8]) -> Result<T, StoreError> {
    postcard::from_bytes(bytes).map_err(|e| corrupt(what, e))
}

/// An object's value (its key is its id).
#[derive(Serialize, Deserialize)]
pub(super) struct Object<'a> {
    pub(super) version: u64,
    pub(super) paused: bool,
    #[serde(borrow)]
    pub(super) state: Cow<'a, str>,
}

impl<'a> Object<'a> {
    pub(super) fn of(row: &'a ObjectRow) -> Self {
        Self {
            version: row.version,
            paused: row.paused,
            state: Cow::Borrowed(&row.state),
        }
    }

    pub(super) fn row(self, object_id: &[u8]) -> Result<ObjectRow, StoreError> {
        Ok(ObjectRow {
            object_id: Arc::from(utf8("object", object_id)?),
            version: self.version,
            state: self.state.into_owned(),
            paused: self.paused,
        })
    }
}

/// A key read back as text.
pub(super) fn utf8<'k>(what: &str, key: &'k [u8]) -> Result<&'k str, StoreError> {
    std::str::from_utf8(key).map_err(|e| corrupt(what, e))
}

/// A receipt's value (its key is the event id).
#[derive(Serialize, Deserialize)]
pub(super) struct Receipt<'a> {
    pub(super) fingerprint: u128,
    #[serde(borrow)]
    pub(super) object_id: Cow<'a, str>,
    #[serde(borrow)]
    pub(super) decision: Cow<'a, str>,
    pub(super) first_seen: u64,
}

impl<'a> Receipt<'a> {
    pub(super) fn of(row: &'a ReceiptRow) -> Self {
        Self {
            fingerprint: row.fingerprint,
            object_id: Cow::Borrowed(&row.object_id),
            decision: Cow::Owned(row.decision.code()),
            first_seen: time_ns(row.first_seen).max(0) as u64,
        }
    }

    pub(super) fn row(self, event_id: &[u8]) -> Result<ReceiptRow, StoreError> {
        Ok(ReceiptRow {
            event_id: Arc::from(utf8("receipt", event_id)?),
            fingerprint: self.fingerprint,
            object_id: Arc::from(&*self.object_id),
            decision: verdict(&self.decision)?,
            first_seen: ns_time(self.first_seen as i64),
            retention_cutoff: None,
        })
    }
}

/// A variant's value (its key: [`id_prefix`] of the event id, then the
/// fingerprint, 16 bytes big-endian).
#[derive(Serialize, Deserialize)]
pub(super) struct Variant<'a> {
    #[serde(borrow)]
    pub(super) object_id: Cow<'a, str>,
    pub(super) first_seen: u64,
}

/// The key of a variant.
pub(super) fn variant_key(event_id: &str, fingerprint: u128) -> Vec<u8> {
    let mut k = id_prefix(event_id);
    k.extend_from_slice(&fingerprint.to_be_bytes());
    k
}

/// A variant read back from its key and value.
pub(super) fn variant_row(key: &[u8], value: &[u8]) -> Result<VariantRow, StoreError> {
    let v: Variant<'_> = decode("variant", value)?;
    let (id, fp) = split_id_prefix(key)?;
    let fp: [u8; 16] = fp
        .try_into()
        .map_err(|_| corrupt("variant", "its fingerprint is not 16 bytes"))?;
    Ok(VariantRow {
        event_id: Arc::from(utf8("variant", id)?),
        fingerprint: u128::from_be_bytes(fp),
        object_id: Arc::from(&*v.object_id),
        first_seen: ns_time(v.first_seen as i64),
    })
}

/// Splits a key that starts with an [`id_prefix`] into the id and the rest.
pub(super) fn split_id_prefix(key: &[u8]) -> Result<(&[u8], &[u8]), StoreError> {
    let len = key
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_be_bytes)
        .ok_or_else(|| corrupt("key", "an id's length is cut short"))? as usize;
    let id = key
        .get(4..4 + len)
        .ok_or_else(|| corrupt("key", "an id is cut short"))?;
    Ok((id, &key[4 + len..]))
}

/// A held row's value, without its body (kept apart, so that a start-up
/// reads none: docs/CONTRACT.md §9). Its key is [`held_key`].
#[derive(Serialize, Deserialize)]
pub(super) struct Held<'a> {
    /// Arrival order among held rows (a store-wide counter).
    pub(super) arrival: u64,
    pub(super) at: u64,
    #[serde(borrow)]
    pub(super) event_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub(super) object_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub(super) held_as: Cow<'a, str>,
    #[serde(borrow)]
    pub(super) status: Cow<'a, str>,
    pub(super) superseded_by: Option<u64>,
    #[serde(borrow)]
    pub(super) detail: Option<Cow<'a, str>>,
}

impl<'a> Held<'a> {
    pub(super) fn of(row: &'a HeldRow, arrival: u64) -> Self {
        Self {
            arrival,
            at: time_ns(row.at).max(0) as u64,
            event_id: row.event_id.as_deref().map(Cow::Borrowed),
            object_id: row.object_id.as_deref().map(Cow::Borrowed),
            held_as: Cow::Owned(row.held_as.code()),
            status: Cow::Borrowed(row.status.as_str()),
            superseded_by: row.superseded_by,
            detail: row.detail.as_deref().map(Cow::Borrowed),
        }
    }

    /// Whether reconciliation decided it (its rows may then be purged).
    pub(super) fn resolved(&self) -> bool {
        self.status == HeldStatus::Resolved.as_str()
    }

    pub(super) fn row(self, key: HeldKey, body: Arc<[u8]>) -> Result<HeldRow, StoreError> {
        Ok(HeldRow {
            key,
            at: ns_time(self.at as i64),
            event_id: self.event_id.map(|s| Arc::from(&*s)),
            object_id: self.object_id.map(|s| Arc::from(&*s)),
            held_as: verdict(&self.held_as)?,
            body,
            status: HeldStatus::parse(&self.status)
                .ok_or_else(|| corrupt("held", format!("status {:?}", self.status)))?,
            superseded_by: self.superseded_by,
            detail: self.detail.map(Cow::into_owned),
        })
    }
}

/// An audit row's value (its key: a store-wide counter, the order recorded).
#[derive(Serialize, Deserialize)]
pub(super) struct Audit<'a> {
    pub(super) origin: u64,
    pub(super) seq: u64,
    pub(super) at: u64,
    #[serde(borrow)]
    pub(super) event_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub(super) object_id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub(super) kind: Cow<'a, str>,
    #[serde(borrow)]
    pub(super) decision: Option<Cow<'a, str>>,
    pub(super) version: Option<u64>,
    pub(super) replacement: bool,
    #[serde(borrow)]
    pub(super) detail: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub(super) body: Option<Cow<'a, [u8]>>,
}

impl<'a> Audit<'a> {
    pub(super) fn of(row: &'a AuditRow) -> Self {
        Self {
            origin: row.key.origin,
            seq: row.key.seq,
            at: time_ns(row.at).max(0) as u64,
            event_id: row.event_id.as_deref().map(Cow::Borrowed),
            object_id: row.object_id.as_deref().map(Cow::Borrowed),
            kind: Cow::Borrowed(row.kind),
            decision: row.decision.as_deref().map(Cow::Borrowed),
            version: row.version,
            replacement: row.replacement,
            detail: row.detail.as_deref().map(Cow::Borrowed),
            body: row.body.as_deref().map(Cow::Borrowed),
        }
    }

    pub(super) fn row(self) -> Result<AuditRow, StoreError> {
        Ok(AuditRow {
            key: HeldKey {
                origin: self.origin,
                seq: self.seq,
            },
            at: ns_time(self.at as i64),
            event_id: self.event_id.map(|s| Arc::from(&*s)),
            object_id: self.object_id.map(|s| Arc::from(&*s)),
            kind: audit_kind(&self.kind)?,
            decision: self.decision.map(Cow::into_owned),
            version: self.version,
            replacement: self.replacement,
            detail: self.detail.map(Cow::into_owned),
            body: self.body.map(|b| Arc::from(&*b)),
        })
    }
}

/// A history (and outbox) row's value (its key: its outbox position).
#[derive(Serialize, Deserialize)]
pub(super) struct Effect<'a> {
    pub(super) origin: u64,
    pub(super) seq: u64,
    pub(super) at: u64,
    #[serde(borrow)]
    pub(super) object_id: Cow<'a, str>,
    pub(super) version: u64,
    #[serde(borrow)]
    pub(super) state: Cow<'a, str>,
    #[serde(borrow)]
    pub(super) cause_event: Option<Cow<'a, str>>,
    pub(super) trace: Option<String>,
}

impl<'a> Effect<'a> {
    pub(super) fn of(row: &'a EffectRow) -> Self {
        Self {
            origin: row.key.origin,
            seq: row.key.seq,
            at: time_ns(row.at).max(0) as u64,
            object_id: Cow::Borrowed(&row.object_id),
            version: row.version,
            state: Cow::Borrowed(&row.state),
            cause_event: row.cause_event.as_deref().map(Cow::Borrowed),
            trace: row.trace.as_ref().map(|t| t.to_stored()),
        }
    }

    pub(super) fn row(self) -> Result<EffectRow, StoreError> {
        let trace = self
            .trace
            .map(|t| {
                snapshot_receiver_core::TraceContext::from_stored(&t)
                    .map(Arc::new)
                    .map_err(|e| corrupt("history", format!("its trace context: {e}")))
            })
            .transpose()?;
        Ok(EffectRow {
            key: HeldKey {
                origin: self.origin,
                seq: self.seq,
            },
            at: ns_time(self.at as i64),
            object_id: Arc::from(&*self.object_id),
            version: self.version,
            state: self.state.into_owned(),
            cause_event: self.cause_event.map(|s| Arc::from(&*s)),
            trace,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_keys_sort_as_times_and_id_prefixes_keep_ids_apart() {
        let early = std::time::UNIX_EPOCH + std::time::Duration::from_secs(255);
        let late = std::time::UNIX_EPOCH + std::time::Duration::from_secs(256);
        assert!(time_key(early) < time_key(late));
        // "a" and "ab": with a plain concatenation the variant keys of "a"
        // would sort among those of "ab".
        let a = variant_key("a", u128::MAX);
        let ab = variant_key("ab", 0);
        assert!(!ab.starts_with(&id_prefix("a")));
        assert!(a.starts_with(&id_prefix("a")));
        let (id, rest) = split_id_prefix(&a).unwrap();
        assert_eq!((id, rest.len()), (&b"a"[..], 16));
    }
}
