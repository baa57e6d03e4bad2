//! The serde wire forms: what the engine's answers look like as JSON. They
//! are the field names and values of the replay report (docs/CONTRACT.md
//! §7): the replay prints its lines through these same forms, so a
//! serialized [`Receipt`] is a delivery line without its `step` and
//! `phase`, with `ack_meaning` (the words a replay line leaves out) last.
//!
//! - [`Decision`], [`Verdict`] and [`Outcome`]: [`DecisionFields`]
//!   (`decision`, `reason`, `conflict`, `original_decision`);
//! - [`Receipt`]: [`LineFields`], then `ack_meaning`; a [`Reevaluation`]:
//!   [`LineFields`];
//! - [`ReconcileReport`]: the authority line's [`LineFields`], then
//!   `previous_version`, `forced_over` and `reevaluated` (one [`LineFields`]
//!   per re-evaluated event);
//! - [`ObjectState`]: `object_id`, `version`, `state`, `paused`, `deleted`
//!   (only when `true`), `held`;
//! - [`AuditRecord`]: `seq`, `at`, `event_id`, `object_id`, `kind`, then the
//!   fields of its kind;
//! - [`EffectRecord`]: `seq`, `at`, `object_id`, `version`, `state`, `cause`,
//!   `forced_over` (only for a forced authority); `seq` is the step's
//!   number in the receiver-wide sequence the audit trail shares, so
//!   effects' numbers rise but skip the steps that replaced nothing;
//! - [`AuthoritativeSnapshot`] deserializes from `object_id`, `version`,
//!   `state`, and optionally `as_of` and `force`.
//!
//! Times are RFC 3339 UTC strings, versions unsigned integers, states the
//! JSON value as received (key order kept).

use crate::audit::{AuditEntry, AuditRecord};
use crate::clock::{format_rfc3339, parse_rfc3339};
use crate::decision::{Ack, Decision, Verdict};
use crate::engine::{
    AuthoritativeSnapshot, Cause, EffectRecord, ObjectState, Outcome, Overridden, Receipt,
    ReconcileReport, Reevaluation, ReevaluationOutcome,
};
use crate::envelope::StateJson;
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use std::sync::Arc;

/// The decision part of a replay line: `decision` (a wire name such as
/// `applied`, `held`, `duplicate`, or `retry` / `reject` when nothing was
/// recorded, `authority`, `authority_refused`, `unresolved` on
/// reconciliation lines), `reason` (hold reason, or the code of a retry or
/// refusal: [`crate::RetryReason::as_str`], [`crate::RejectReason::as_str`]),
/// `conflict` (conflict kind) and `original_decision` (for a duplicate, the
/// first decision as its `Display` words it, for example `held (paused)`).
/// Fields that do not apply are `null`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DecisionFields {
    /// The decision's wire name.
    pub decision: Option<&'static str>,
    /// Hold reason, or why there is no decision.
    pub reason: Option<String>,
    /// Conflict kind.
    pub conflict: Option<&'static str>,
    /// For a duplicate: the original decision in words.
    pub original_decision: Option<String>,
}

impl From<Decision> for DecisionFields {
    fn from(d: Decision) -> Self {
        match d {
            Decision::Duplicate { original } => Self {
                decision: Some("duplicate"),
                original_decision: Some(original.to_string()),
                ..Self::default()
            },
            d => Self {
                decision: Some(d.as_str()),
                reason: d.reason().map(|r| r.as_str().to_owned()),
                conflict: d.conflict().map(|k| k.as_str()),
                original_decision: None,
            },
        }
    }
}

impl From<Verdict> for DecisionFields {
    fn from(v: Verdict) -> Self {
        Decision::from(v).into()
    }
}

impl From<&Outcome> for DecisionFields {
    fn from(o: &Outcome) -> Self {
        match o {
            Outcome::Decided(d) => (*d).into(),
            // The stable code (`store_failed`, `body_too_large`, ...), as the
            // counters and docs/CONTRACT.md §3.6 name it; the words, with the
            // limit and the size, are the receipt's `ack_meaning`.
            Outcome::Retry(why) => Self {
                decision: Some("retry"),
                reason: Some(why.as_str().to_owned()),
                ..Self::default()
            },
            Outcome::Rejected(why) => Self {
                decision: Some("reject"),
                reason: Some(why.as_str().to_owned()),
                ..Self::default()
            },
        }
    }
}

/// One replay line without its `step` and `phase` (docs/CONTRACT.md §7),
/// in the wire order: `event_id`, `object_id`, the four decision fields (as
/// [`DecisionFields`]), `version`, `state`, `paused` (the object after the
/// step), `replacement`, `ack`. Fields that do not apply are `null`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LineFields {
    /// Event identity.
    pub event_id: Option<Arc<str>>,
    /// Object identity.
    pub object_id: Option<Arc<str>>,
    /// The decision's wire name (see [`DecisionFields::decision`]).
    pub decision: Option<&'static str>,
    /// Hold reason, or why there is no decision.
    pub reason: Option<String>,
    /// Conflict kind.
    pub conflict: Option<&'static str>,
    /// For a duplicate: the original decision in words.
    pub original_decision: Option<String>,
    /// The object's version after the step.
    pub version: Option<u64>,
    /// The object's state after the step.
    pub state: Option<StateJson>,
    /// The object's paused flag after the step.
    pub paused: Option<bool>,
    /// Whether the step replaced the object's state.
    pub replacement: Option<bool>,
    /// What to tell the sender (deliveries only).
    pub ack: Option<Ack>,
}

impl LineFields {
    /// Fields with `decision`, `reason`, `conflict` and
    /// `original_decision` from `d`, everything else `None`.
    pub fn of_decision(d: DecisionFields) -> Self {
        Self {
            decision: d.decision,
            reason: d.reason,
            conflict: d.conflict,
            original_decision: d.original_decision,
            ..Self::default()
        }
    }

    /// These fields with `version`, `state` and `paused` from `object`
    /// (left as they are when it is `None`).
    pub fn with_object(mut self, object: Option<&ObjectState>) -> Self {
        if let Some(o) = object {
            self.version = Some(o.version);
            self.state = Some(o.state.clone());
            self.paused = Some(o.paused);
        }
        self
    }

    /// The authority line of a reconciliation: decision `authority`, the
    /// reason `forced over version N` for a forced authority, the object
    /// after the authority step.
    pub fn authority(report: &ReconcileReport) -> Self {
        Self {
            object_id: Some(report.after_authority.object_id.clone()),
            replacement: Some(report.replacement),
            ..Self::of_decision(DecisionFields {
                decision: Some("authority"),
                reason: report
                    .forced
                    .as_ref()
                    .map(|over| format!("forced over version {}", over.version)),
                ..DecisionFields::default()
            })
        }
        .with_object(Some(&report.after_authority))
    }

    /// The line of one re-evaluated held event of `object_id` (a
    /// reconciliation names its object once): its new decision, or
    /// `unresolved` with how it was held.
    pub fn reevaluation(object_id: Option<Arc<str>>, r: &Reevaluation) -> Self {
        let (decision, replacement) = match r.outcome {
            ReevaluationOutcome::Decided(v, replacement) => (v.into(), replacement),
            ReevaluationOutcome::Unresolved(held_as) => (
                DecisionFields {
                    decision: Some("unresolved"),
                    reason: held_as.detail().map(str::to_owned),
                    ..DecisionFields::default()
                },
                false,
            ),
        };
        Self {
            event_id: Some(r.event_id.clone()),
            object_id,
            replacement: Some(replacement),
            ..Self::of_decision(decision)
        }
        .with_object(r.object.as_ref())
    }
}

impl From<&Receipt> for LineFields {
    /// The receipt's line; an `applied` that created the object
    /// ([`Receipt::created`]) has the reason `created`.
    fn from(r: &Receipt) -> Self {
        let mut decision = DecisionFields::from(&r.outcome);
        if r.created {
            decision.reason = Some("created".to_owned());
        }
        Self {
            event_id: r.event_id.clone(),
            object_id: r.object_id.clone(),
            replacement: Some(r.replacement),
            ack: Some(r.ack()),
            ..Self::of_decision(decision)
        }
        .with_object(r.object.as_ref())
    }
}

impl Serialize for Decision {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        DecisionFields::from(*self).serialize(s)
    }
}

impl Serialize for Verdict {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        DecisionFields::from(*self).serialize(s)
    }
}

impl Serialize for Outcome {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        DecisionFields::from(self).serialize(s)
    }
}

/// A receipt: its [`LineFields`], then `ack_meaning` (what the
/// acknowledgement means to the sender, in words): the fields and order of
/// `serve`'s HTTP receipt.
impl Serialize for Receipt {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Wire {
            #[serde(flatten)]
            line: LineFields,
            ack_meaning: String,
        }
        Wire {
            line: LineFields::from(self),
            ack_meaning: self.ack_meaning(),
        }
        .serialize(s)
    }
}

impl Serialize for Reevaluation {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let id = self.object.as_ref().map(|o| o.object_id.clone());
        LineFields::reevaluation(id, self).serialize(s)
    }
}

impl Serialize for ObjectState {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let deleted = self.deleted();
        let mut map = s.serialize_map(Some(5 + usize::from(deleted)))?;
        map.serialize_entry("object_id", &self.object_id)?;
        map.serialize_entry("version", &self.version)?;
        map.serialize_entry("state", &self.state)?;
        map.serialize_entry("paused", &self.paused)?;
        if deleted {
            map.serialize_entry("deleted", &true)?;
        }
        map.serialize_entry("held", &self.held)?;
        map.end()
    }
}

/// What a forced authority replaced: `{"version": n, "state": ...}`.
impl Serialize for Overridden {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(2))?;
        map.serialize_entry("version", &self.version)?;
        map.serialize_entry("state", &self.state)?;
        map.end()
    }
}

impl Serialize for ReconcileReport {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Wire<'a> {
            #[serde(flatten)]
            line: LineFields,
            previous_version: Option<u64>,
            #[serde(skip_serializing_if = "Option::is_none")]
            forced_over: Option<&'a Overridden>,
            reevaluated: Vec<LineFields>,
        }
        let id = &self.after_authority.object_id;
        Wire {
            line: LineFields::authority(self),
            previous_version: self.previous_version,
            forced_over: self.forced.as_ref(),
            reevaluated: self
                .reevaluated
                .iter()
                .map(|r| LineFields::reevaluation(Some(id.clone()), r))
                .collect(),
        }
        .serialize(s)
    }
}

impl Serialize for EffectRecord {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let forced = self.forced.is_some();
        let mut map = s.serialize_map(Some(6 + usize::from(forced)))?;
        map.serialize_entry("seq", &self.seq)?;
        map.serialize_entry("at", &format_rfc3339(self.at))?;
        map.serialize_entry("object_id", &self.object_id)?;
        map.serialize_entry("version", &self.version)?;
        map.serialize_entry("state", &self.state)?;
        map.serialize_entry("cause", &self.cause.wire())?;
        if let Some(over) = &self.forced {
            map.serialize_entry("forced_over", over)?;
        }
        map.end()
    }
}

/// An effect as a relay sends it: `{"effect_id", "position", "at",
/// "object_id", "version", "state", "cause"}`, `cause` as in the history
/// (the applied event's identity, or `authority`); a coalescing relay's
/// send of the newest state adds `"replaces": [{"effect_id", "position",
/// "version"}, ...]`, the earlier effects it stands for, oldest first.
impl Serialize for crate::relay::Effect {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let entries = if self.replaces.is_empty() { 7 } else { 8 };
        let mut map = s.serialize_map(Some(entries))?;
        map.serialize_entry("effect_id", &self.id.to_string())?;
        map.serialize_entry("position", &self.position)?;
        map.serialize_entry("at", &format_rfc3339(self.at))?;
        map.serialize_entry("object_id", &self.object_id)?;
        map.serialize_entry("version", &self.version)?;
        map.serialize_entry("state", &self.state)?;
        map.serialize_entry("cause", self.cause_event.as_deref().unwrap_or("authority"))?;
        if !self.replaces.is_empty() {
            #[derive(Serialize)]
            struct Wire {
                effect_id: String,
                position: u64,
                version: u64,
            }
            let replaced: Vec<Wire> = self
                .replaces
                .iter()
                .map(|r| Wire {
                    effect_id: r.id.to_string(),
                    position: r.position,
                    version: r.version,
                })
                .collect();
            map.serialize_entry("replaces", &replaced)?;
        }
        map.end()
    }
}

impl Cause {
    /// The wire form of a cause, as the replay's history prints it: the
    /// applied event's identity, or `authority`.
    pub fn wire(&self) -> &str {
        match self {
            Cause::Event(id) => id,
            Cause::Authority(_) => "authority",
        }
    }
}

impl Serialize for AuditRecord {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Wire<'a> {
            seq: u64,
            at: String,
            event_id: &'a Option<Arc<str>>,
            object_id: &'a Option<Arc<str>>,
            #[serde(flatten)]
            entry: Entry<'a>,
        }
        #[derive(Serialize)]
        #[serde(tag = "kind", rename_all = "snake_case")]
        enum Entry<'a> {
            Delivery {
                #[serde(flatten)]
                decision: DecisionFields,
                version: Option<u64>,
                replacement: bool,
                /// Whether the replacement created the object (present
                /// only when it did).
                #[serde(skip_serializing_if = "std::ops::Not::not")]
                created: bool,
                body: &'a str,
            },
            Malformed {
                #[serde(flatten)]
                decision: DecisionFields,
                error: &'a str,
                /// The bytes as text (invalid UTF-8 replaced by U+FFFD).
                body: String,
            },
            Paused {
                cause_event: &'a str,
            },
            Authority {
                version: u64,
                previous_version: Option<u64>,
                as_of: String,
                replacement: bool,
                #[serde(skip_serializing_if = "Option::is_none")]
                forced_over: Option<&'a Overridden>,
            },
            AuthorityRefused {
                version: u64,
                current_version: u64,
            },
            Reevaluated {
                #[serde(flatten)]
                decision: DecisionFields,
                held_as: String,
                replacement: bool,
            },
            Unresolved {
                #[serde(flatten)]
                decision: DecisionFields,
                superseded_by: u64,
            },
        }
        let entry = match &self.entry {
            AuditEntry::Delivery {
                decision,
                version,
                replacement,
                created,
                body,
            } => Entry::Delivery {
                decision: (*decision).into(),
                version: *version,
                replacement: *replacement,
                created: *created,
                body,
            },
            AuditEntry::Malformed { bytes, error } => Entry::Malformed {
                decision: Verdict::Held(crate::HoldReason::Malformed).into(),
                error,
                body: String::from_utf8_lossy(bytes).into_owned(),
            },
            AuditEntry::Paused { cause_event } => Entry::Paused { cause_event },
            AuditEntry::Authority {
                version,
                previous,
                as_of,
                replacement,
                forced,
            } => Entry::Authority {
                version: *version,
                previous_version: *previous,
                as_of: format_rfc3339(*as_of),
                replacement: *replacement,
                forced_over: forced.as_ref(),
            },
            AuditEntry::AuthorityRefused { version, current } => Entry::AuthorityRefused {
                version: *version,
                current_version: *current,
            },
            AuditEntry::Reevaluated {
                held_as,
                decision,
                replacement,
            } => Entry::Reevaluated {
                decision: (*decision).into(),
                held_as: held_as.to_string(),
                replacement: *replacement,
            },
            AuditEntry::Unresolved {
                held_as,
                superseded_by,
            } => Entry::Unresolved {
                decision: DecisionFields {
                    decision: Some("unresolved"),
                    reason: held_as.detail().map(str::to_owned),
                    ..DecisionFields::default()
                },
                superseded_by: *superseded_by,
            },
        };
        Wire {
            seq: self.seq,
            at: format_rfc3339(self.at),
            event_id: &self.event_id,
            object_id: &self.object_id,
            entry,
        }
        .serialize(s)
    }
}

/// The JSON an authority returns for one object.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SnapshotWire {
    object_id: String,
    version: u64,
    state: Box<serde_json::value::RawValue>,
    #[serde(default)]
    as_of: Option<String>,
    #[serde(default)]
    force: bool,
}

impl<'de> Deserialize<'de> for AuthoritativeSnapshot {
    /// Reads `{"object_id": "...", "version": n, "state": <any JSON>}` with
    /// optional `"as_of"` (RFC 3339; absent: the system time when it is
    /// read) and `"force"` (default `false`, docs/CONTRACT.md §4, *Force*).
    /// Other fields are refused, so a misspelt `force` is an error rather
    /// than a silent no. The state is checked as a delivery's is
    /// (docs/CONTRACT.md §2: for example no duplicate keys).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let w = SnapshotWire::deserialize(d)?;
        let as_of = match &w.as_of {
            None => std::time::SystemTime::now(),
            Some(text) => parse_rfc3339(text).ok_or_else(|| {
                D::Error::custom(format!("as_of: not an RFC 3339 time: {text:?}"))
            })?,
        };
        AuthoritativeSnapshot::new(&w.object_id, w.version, w.state.get(), as_of)
            .map(|s| s.forced(w.force))
            .map_err(|e| D::Error::custom(format!("state: {e}")))
    }
}
