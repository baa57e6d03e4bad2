//! The decision rules of docs/CONTRACT.md §3, as pure synchronous functions.
//!
//! Everything that decides what a delivery means lives here: the actors, the
//! reconciliation step, the loom models and the CLI all call these functions
//! and never re-implement a rule. Nothing in this module touches shared
//! state, a clock or tokio.

use serde::Serialize;
use std::fmt;

/// Why two records that should describe the same thing disagree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ConflictKind {
    /// The same `event_id` arrived with different semantic content.
    EventVariant,
    /// Two events claim the same `object_version` for one object with different states.
    VersionState,
}

/// Why a delivery was held instead of applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldReason {
    /// The object is paused until reconciliation.
    Paused,
    /// The `object_id` names an object this receiver does not know; it is not created.
    UnknownObject,
    /// `object_version` is absent or `null`.
    MissingVersion,
    /// `object_version` is not a JSON integer literal in `0..=u64::MAX`.
    InvalidVersion,
    /// The `type` is absent, not a string, or not one this receiver supports.
    UnsupportedType,
    /// The body is not a JSON object, has duplicate keys, lacks `event_id`/`object_id`,
    /// or is a supported type without a `state`.
    Malformed,
    /// No identity record exists, the event is older than the retention window and it
    /// would change state or raise a conflict: it is not trusted (docs/CONTRACT.md §5).
    ExpiredIdentity,
}

/// The decision recorded for the *first* delivery of an event identity.
///
/// A later delivery with the same content is a [`Decision::Duplicate`] carrying
/// this value, which is why it excludes `Duplicate` itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// The event's version was higher: its state replaced the object's state.
    Applied,
    /// The event's version was lower than the object's: recorded, no change.
    Stale,
    /// Same version, same state: recorded, no new effect.
    Equal,
    /// The evidence contradicts itself: the event is held and the object paused.
    Conflict(ConflictKind),
    /// The event was held without changing state.
    Held(HoldReason),
}

/// Exactly one decision per delivery (docs/CONTRACT.md §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Decision {
    /// See [`Verdict::Applied`].
    Applied,
    /// See [`Verdict::Stale`].
    Stale,
    /// See [`Verdict::Equal`].
    Equal,
    /// See [`Verdict::Conflict`].
    Conflict(ConflictKind),
    /// See [`Verdict::Held`].
    Held(HoldReason),
    /// The same event identity with the same semantic content was already decided:
    /// no new effect, and `original` is the decision the first delivery got (the
    /// lost-acknowledgement case).
    Duplicate {
        /// The decision recorded for the first delivery of this event identity.
        original: Verdict,
    },
}

/// What an acknowledgement to the sender means (docs/CONTRACT.md §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ack {
    /// The decision is recorded: the sender may forget the delivery.
    Acknowledge,
    /// Nothing was recorded or changed: the sender must redeliver.
    Retry,
    /// The body breaks a configured limit: not recorded, not acknowledged; the
    /// sender keeps its copy (an HTTP layer would answer 413 or 400).
    Reject,
}

impl Ack {
    /// The wire name: `acknowledge`, `retry` or `reject`.
    pub fn as_str(self) -> &'static str {
        match self {
            Ack::Acknowledge => "acknowledge",
            Ack::Retry => "retry",
            Ack::Reject => "reject",
        }
    }
}

impl ConflictKind {
    /// Both conflict kinds.
    pub const ALL: [ConflictKind; 2] = [ConflictKind::EventVariant, ConflictKind::VersionState];

    /// The wire name: `event_variant` or `version_state`.
    pub fn as_str(self) -> &'static str {
        match self {
            ConflictKind::EventVariant => "event_variant",
            ConflictKind::VersionState => "version_state",
        }
    }
}

impl HoldReason {
    /// Every hold reason, in declaration order.
    pub const ALL: [HoldReason; 7] = [
        HoldReason::Paused,
        HoldReason::UnknownObject,
        HoldReason::MissingVersion,
        HoldReason::InvalidVersion,
        HoldReason::UnsupportedType,
        HoldReason::Malformed,
        HoldReason::ExpiredIdentity,
    ];

    /// The wire name, for example `missing_version`.
    pub fn as_str(self) -> &'static str {
        match self {
            HoldReason::Paused => "paused",
            HoldReason::UnknownObject => "unknown_object",
            HoldReason::MissingVersion => "missing_version",
            HoldReason::InvalidVersion => "invalid_version",
            HoldReason::UnsupportedType => "unsupported_type",
            HoldReason::Malformed => "malformed",
            HoldReason::ExpiredIdentity => "expired_identity",
        }
    }
}

impl Verdict {
    /// The wire name of the decision: `applied`, `stale`, `equal`, `conflict` or `held`.
    pub fn as_str(self) -> &'static str {
        Decision::from(self).as_str()
    }

    /// The hold reason or conflict kind as a wire name (`missing_version`,
    /// `event_variant`, ...); `None` for the other verdicts.
    pub fn detail(self) -> Option<&'static str> {
        match self {
            Verdict::Held(r) => Some(r.as_str()),
            Verdict::Conflict(k) => Some(k.as_str()),
            _ => None,
        }
    }

    /// A stable text code for storage: `applied`, `stale`, `equal`,
    /// `conflict:<kind>` or `held:<reason>`. [`Verdict::from_code`] reads it back.
    pub fn code(self) -> String {
        match self.detail() {
            Some(detail) => format!("{}:{detail}", self.as_str()),
            None => self.as_str().to_owned(),
        }
    }

    /// Parses a code written by [`Verdict::code`]; `None` for anything else.
    pub fn from_code(code: &str) -> Option<Self> {
        Some(match code.split_once(':') {
            None => match code {
                "applied" => Verdict::Applied,
                "stale" => Verdict::Stale,
                "equal" => Verdict::Equal,
                _ => return None,
            },
            Some(("held", r)) => Verdict::Held(*HoldReason::ALL.iter().find(|x| x.as_str() == r)?),
            Some(("conflict", k)) => {
                Verdict::Conflict(*ConflictKind::ALL.iter().find(|x| x.as_str() == k)?)
            }
            Some(_) => return None,
        })
    }

    /// A one-byte code for this verdict, the registry's compact form: 0, 1, 2
    /// for applied, stale, equal; `0x10 +` the kind's index in
    /// [`ConflictKind::ALL`]; `0x20 +` the reason's index in [`HoldReason::ALL`].
    /// [`Verdict::from_byte`] reads it back.
    pub(crate) fn to_byte(self) -> u8 {
        fn index<T: PartialEq>(all: &[T], x: &T) -> u8 {
            // The lists have 2 and 7 entries and contain every value.
            all.iter().position(|y| y == x).unwrap_or(0) as u8
        }
        match self {
            Verdict::Applied => 0,
            Verdict::Stale => 1,
            Verdict::Equal => 2,
            Verdict::Conflict(k) => 0x10 + index(&ConflictKind::ALL, &k),
            Verdict::Held(r) => 0x20 + index(&HoldReason::ALL, &r),
        }
    }

    /// Reads a code written by [`Verdict::to_byte`]; `None` for any other byte.
    pub(crate) fn from_byte(code: u8) -> Option<Self> {
        Some(match code {
            0 => Verdict::Applied,
            1 => Verdict::Stale,
            2 => Verdict::Equal,
            0x10..=0x1f => Verdict::Conflict(*ConflictKind::ALL.get(usize::from(code - 0x10))?),
            0x20..=0x2f => Verdict::Held(*HoldReason::ALL.get(usize::from(code - 0x20))?),
            _ => return None,
        })
    }

    /// Whether this verdict replaced the object's state.
    pub fn is_replacement(self) -> bool {
        self == Verdict::Applied
    }

    /// Whether the event was retained as held evidence (a hold or a conflict).
    pub fn is_hold(self) -> bool {
        matches!(self, Verdict::Held(_) | Verdict::Conflict(_))
    }
}

impl From<Verdict> for Decision {
    fn from(v: Verdict) -> Self {
        match v {
            Verdict::Applied => Decision::Applied,
            Verdict::Stale => Decision::Stale,
            Verdict::Equal => Decision::Equal,
            Verdict::Conflict(k) => Decision::Conflict(k),
            Verdict::Held(r) => Decision::Held(r),
        }
    }
}

impl Decision {
    /// The wire name: `applied`, `duplicate`, `stale`, `equal`, `conflict` or `held`.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Applied => "applied",
            Decision::Stale => "stale",
            Decision::Equal => "equal",
            Decision::Conflict(_) => "conflict",
            Decision::Held(_) => "held",
            Decision::Duplicate { .. } => "duplicate",
        }
    }

    /// The decision as a [`Verdict`]; `None` for a duplicate.
    pub fn as_verdict(self) -> Option<Verdict> {
        Some(match self {
            Decision::Applied => Verdict::Applied,
            Decision::Stale => Verdict::Stale,
            Decision::Equal => Verdict::Equal,
            Decision::Conflict(k) => Verdict::Conflict(k),
            Decision::Held(r) => Verdict::Held(r),
            Decision::Duplicate { .. } => return None,
        })
    }

    /// The hold reason, for `held` decisions.
    pub fn reason(self) -> Option<HoldReason> {
        match self {
            Decision::Held(r) => Some(r),
            _ => None,
        }
    }

    /// The conflict kind, for `conflict` decisions.
    pub fn conflict(self) -> Option<ConflictKind> {
        match self {
            Decision::Conflict(k) => Some(k),
            _ => None,
        }
    }

    /// The original decision, for `duplicate` decisions.
    pub fn original(self) -> Option<Verdict> {
        match self {
            Decision::Duplicate { original } => Some(original),
            _ => None,
        }
    }

    /// How a duplicate reads for people: `duplicate (original: applied)`,
    /// `duplicate (original: conflict (event_variant))`, where `original` is
    /// the first decision as its `Display` writes it. `Display for Decision`
    /// and the command-line tool's replay table (which has the original
    /// only as text) both word a duplicate with this.
    pub fn duplicate_of<T: fmt::Display>(original: T) -> impl fmt::Display {
        /// The wording of [`Decision::duplicate_of`].
        struct DuplicateOf<T>(T);
        impl<T: fmt::Display> fmt::Display for DuplicateOf<T> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "duplicate (original: {})", self.0)
            }
        }
        DuplicateOf(original)
    }

    /// Every recorded decision is acknowledged: `held` and `conflict` mean the
    /// receiver accepted responsibility for reconciliation, the rest that the
    /// delivery is done.
    pub fn ack(self) -> Ack {
        Ack::Acknowledge
    }

    /// The acknowledgement meaning in words, for people reading a replay.
    pub fn ack_meaning(self) -> &'static str {
        match self {
            Decision::Duplicate { original } => Decision::from(original).ack_meaning(),
            Decision::Held(_) | Decision::Conflict(_) => {
                "responsibility accepted for reconciliation; state not applied"
            }
            _ => "recorded and done",
        }
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Decision::Conflict(k) => write!(f, "conflict ({})", k.as_str()),
            Decision::Held(r) => write!(f, "held ({})", r.as_str()),
            Decision::Duplicate { original } => {
                Decision::duplicate_of(Decision::from(original)).fmt(f)
            }
            d => f.write_str(d.as_str()),
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Decision::from(*self).fmt(f)
    }
}

/// What the envelope says about `object_version` (docs/CONTRACT.md §2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VersionField {
    /// A JSON integer literal in `0..=u64::MAX`.
    Valid(u64),
    /// Absent or `null`.
    Missing,
    /// Anything else: a string, a fraction, an exponent, a sign, or beyond `u64`.
    Invalid,
}

/// What the rules need to know about the object an event names, at the moment
/// the event is decided. `None` (no view) means the object is unknown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectView {
    /// The object's current version.
    pub version: u64,
    /// The semantic digest of the object's current state (equal digests mean equal states).
    pub state: u128,
    /// Whether the object is paused until reconciliation.
    pub paused: bool,
}

/// What the rules need to know about one event once its identity check passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventFacts {
    /// Whether the `type` is one the receiver supports.
    pub supported_type: bool,
    /// The `object_version` field.
    pub version: VersionField,
    /// The semantic digest of the event's `state`; `None` when the field is absent.
    pub state: Option<u128>,
    /// The event is older than the retention window (by `occurred_at`), so a
    /// missing identity record cannot tell it from an old replay (docs/CONTRACT.md §5).
    pub older_than_retention: bool,
}

/// What an equal version with a different state means.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EqualVersionPolicy {
    /// docs/CONTRACT.md §3: a `conflict` (`version_state`); the event is held and the
    /// object paused.
    #[default]
    Conflict,
    /// The last-writer-wins reducer's rule ([`crate::apply_events`]): equal
    /// versions are duplicates; the event is recorded as `stale` and changes
    /// nothing.
    Ignore,
}

/// What an event for an object the receiver does not know may do
/// (docs/CONTRACT.md §3.2). Chosen per profile
/// ([`crate::Profile::create_on_first_snapshot`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UnknownObjectPolicy {
    /// The contract's default: the event is `held` / `unknown_object`
    /// (parked) until an authority introduces the object.
    #[default]
    Park,
    /// An event that carries a valid version and a snapshot (a tombstone
    /// included) creates the object: `applied`, recorded as a creation. One
    /// without a valid version is parked as under [`UnknownObjectPolicy::Park`];
    /// one older than the retention window is `held` / `expired_identity`
    /// like any other change of state (docs/CONTRACT.md §5).
    CreateOnFirstSnapshot,
}

/// Rules 2–4 of docs/CONTRACT.md §3 for an event whose identity is new: validity, pause,
/// version comparison, then the expired-identity policy of docs/CONTRACT.md §5.
///
/// `object` is `None` when the object is unknown; `unknown_objects` says
/// whether such an event is parked or may create the object.
pub fn decide_new(
    event: &EventFacts,
    object: Option<&ObjectView>,
    equal_versions: EqualVersionPolicy,
    unknown_objects: UnknownObjectPolicy,
) -> Verdict {
    decide_new_aged(
        event,
        || event.older_than_retention,
        object,
        equal_versions,
        unknown_objects,
    )
}

/// [`decide_new`] with the age check asked for only when the verdict depends
/// on it (docs/CONTRACT.md §5: an event that would be applied or raise a conflict), so a
/// caller can leave `occurred_at` unparsed for the other verdicts.
/// `event.older_than_retention` is ignored; `older_than_retention` is called
/// at most once.
pub(crate) fn decide_new_aged(
    event: &EventFacts,
    older_than_retention: impl FnOnce() -> bool,
    object: Option<&ObjectView>,
    equal_versions: EqualVersionPolicy,
    unknown_objects: UnknownObjectPolicy,
) -> Verdict {
    if !event.supported_type {
        return Verdict::Held(HoldReason::UnsupportedType);
    }
    let Some(state) = event.state else {
        return Verdict::Held(HoldReason::Malformed);
    };
    let Some(object) = object else {
        return match (unknown_objects, event.version) {
            // A creation changes state: the retention rule guards it too.
            (UnknownObjectPolicy::CreateOnFirstSnapshot, VersionField::Valid(_)) => {
                if older_than_retention() {
                    Verdict::Held(HoldReason::ExpiredIdentity)
                } else {
                    Verdict::Applied
                }
            }
            _ => Verdict::Held(HoldReason::UnknownObject),
        };
    };
    let version = match event.version {
        VersionField::Valid(v) => v,
        VersionField::Missing => return Verdict::Held(HoldReason::MissingVersion),
        VersionField::Invalid => return Verdict::Held(HoldReason::InvalidVersion),
    };
    if object.paused {
        return Verdict::Held(HoldReason::Paused);
    }
    let verdict = match compare_versions(version, state, object) {
        Verdict::Conflict(_) if equal_versions == EqualVersionPolicy::Ignore => Verdict::Stale,
        v => v,
    };
    let age_matters = matches!(verdict, Verdict::Applied | Verdict::Conflict(_));
    if age_matters && older_than_retention() {
        Verdict::Held(HoldReason::ExpiredIdentity)
    } else {
        verdict
    }
}

/// Rule 4 of docs/CONTRACT.md §3: the version comparison alone.
pub fn compare_versions(version: u64, state: u128, object: &ObjectView) -> Verdict {
    use std::cmp::Ordering::*;
    match version.cmp(&object.version) {
        Greater => Verdict::Applied,
        Less => Verdict::Stale,
        Equal if state == object.state => Verdict::Equal,
        Equal => Verdict::Conflict(ConflictKind::VersionState),
    }
}

/// Whether reconciliation can decide a held event again with the normal rules
/// (docs/CONTRACT.md §4). Holds that lack evidence (no usable version, unsupported type,
/// malformed body), the conflicting variant itself and untrusted expired
/// identities stay named unresolved input, superseded by the authority.
pub fn reevaluable(held_as: Verdict) -> bool {
    matches!(
        held_as,
        Verdict::Held(HoldReason::Paused)
            | Verdict::Held(HoldReason::UnknownObject)
            | Verdict::Conflict(ConflictKind::VersionState)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(version: VersionField, state: u128) -> EventFacts {
        EventFacts {
            supported_type: true,
            version,
            state: Some(state),
            older_than_retention: false,
        }
    }
    const C: EqualVersionPolicy = EqualVersionPolicy::Conflict;
    const P: UnknownObjectPolicy = UnknownObjectPolicy::Park;
    const OBJ: ObjectView = ObjectView {
        version: 10,
        state: 7,
        paused: false,
    };

    #[test]
    fn version_rules() {
        let v = VersionField::Valid;
        assert_eq!(
            decide_new(&facts(v(11), 1), Some(&OBJ), C, P),
            Verdict::Applied
        );
        assert_eq!(
            decide_new(&facts(v(9), 1), Some(&OBJ), C, P),
            Verdict::Stale
        );
        assert_eq!(
            decide_new(&facts(v(10), 7), Some(&OBJ), C, P),
            Verdict::Equal
        );
        assert_eq!(
            decide_new(&facts(v(10), 8), Some(&OBJ), C, P),
            Verdict::Conflict(ConflictKind::VersionState)
        );
    }

    #[test]
    fn the_age_is_asked_for_only_when_it_can_change_the_verdict() {
        let v = VersionField::Valid;
        let asked = std::cell::Cell::new(0);
        let older = || {
            asked.set(asked.get() + 1);
            true
        };
        for (f, verdict) in [
            (facts(v(9), 1), Verdict::Stale),
            (facts(v(10), 7), Verdict::Equal),
            (
                facts(VersionField::Missing, 1),
                Verdict::Held(HoldReason::MissingVersion),
            ),
        ] {
            assert_eq!(decide_new_aged(&f, older, Some(&OBJ), C, P), verdict);
        }
        assert_eq!(asked.get(), 0);
        let expired = Verdict::Held(HoldReason::ExpiredIdentity);
        assert_eq!(
            decide_new_aged(&facts(v(11), 1), older, Some(&OBJ), C, P),
            expired
        );
        assert_eq!(
            decide_new_aged(&facts(v(10), 8), older, Some(&OBJ), C, P),
            expired
        );
        assert_eq!(asked.get(), 2);
        let young = decide_new_aged(&facts(v(11), 1), || false, Some(&OBJ), C, P);
        assert_eq!(young, Verdict::Applied);
    }

    #[test]
    fn equal_version_policy_ignore_records_stale() {
        let f = facts(VersionField::Valid(10), 8);
        assert_eq!(
            decide_new(&f, Some(&OBJ), EqualVersionPolicy::Ignore, P),
            Verdict::Stale
        );
        let f = facts(VersionField::Valid(10), 7);
        assert_eq!(
            decide_new(&f, Some(&OBJ), EqualVersionPolicy::Ignore, P),
            Verdict::Equal
        );
    }

    #[test]
    fn validity_comes_before_pause_and_version() {
        let paused = ObjectView {
            paused: true,
            ..OBJ
        };
        let mut f = facts(VersionField::Valid(11), 1);
        assert_eq!(
            decide_new(&f, Some(&paused), C, P),
            Verdict::Held(HoldReason::Paused)
        );
        assert_eq!(
            decide_new(&f, None, C, P),
            Verdict::Held(HoldReason::UnknownObject)
        );
        f.version = VersionField::Missing;
        assert_eq!(
            decide_new(&f, Some(&paused), C, P),
            Verdict::Held(HoldReason::MissingVersion)
        );
        f.version = VersionField::Invalid;
        assert_eq!(
            decide_new(&f, Some(&OBJ), C, P),
            Verdict::Held(HoldReason::InvalidVersion)
        );
        f.state = None;
        assert_eq!(
            decide_new(&f, Some(&OBJ), C, P),
            Verdict::Held(HoldReason::Malformed)
        );
        f.supported_type = false;
        assert_eq!(
            decide_new(&f, None, C, P),
            Verdict::Held(HoldReason::UnsupportedType)
        );
    }

    #[test]
    fn expired_identity_only_guards_changes_and_conflicts() {
        let mut f = facts(VersionField::Valid(11), 1);
        f.older_than_retention = true;
        assert_eq!(
            decide_new(&f, Some(&OBJ), C, P),
            Verdict::Held(HoldReason::ExpiredIdentity)
        );
        f.version = VersionField::Valid(10);
        assert_eq!(
            decide_new(&f, Some(&OBJ), C, P),
            Verdict::Held(HoldReason::ExpiredIdentity)
        );
        f.state = Some(7);
        assert_eq!(decide_new(&f, Some(&OBJ), C, P), Verdict::Equal);
        f.version = VersionField::Valid(3);
        assert_eq!(decide_new(&f, Some(&OBJ), C, P), Verdict::Stale);
    }

    #[test]
    fn a_first_versioned_snapshot_creates_an_unknown_object_only_when_allowed() {
        const CREATE: UnknownObjectPolicy = UnknownObjectPolicy::CreateOnFirstSnapshot;
        let parked = Verdict::Held(HoldReason::UnknownObject);
        let mut f = facts(VersionField::Valid(0), 1);
        // Off (the default): parked, whatever the event carries.
        assert_eq!(UnknownObjectPolicy::default(), P);
        assert_eq!(decide_new(&f, None, C, P), parked);
        // On: a valid version and a snapshot create the object (version 0
        // too; a tombstone is a snapshot whose digest is that of `null`).
        assert_eq!(decide_new(&f, None, C, CREATE), Verdict::Applied);
        f.version = VersionField::Valid(u64::MAX);
        assert_eq!(decide_new(&f, None, C, CREATE), Verdict::Applied);
        // A known object is decided by its version as always.
        assert_eq!(decide_new(&f, Some(&OBJ), C, CREATE), Verdict::Applied);
        f.version = VersionField::Valid(3);
        assert_eq!(decide_new(&f, Some(&OBJ), C, CREATE), Verdict::Stale);
        // Without a valid version nothing can be created: parked.
        for version in [VersionField::Missing, VersionField::Invalid] {
            f.version = version;
            assert_eq!(decide_new(&f, None, C, CREATE), parked);
        }
        // Validity before the object: no state, an unsupported type.
        f.version = VersionField::Valid(5);
        f.state = None;
        assert_eq!(
            decide_new(&f, None, C, CREATE),
            Verdict::Held(HoldReason::Malformed)
        );
        f.supported_type = false;
        assert_eq!(
            decide_new(&f, None, C, CREATE),
            Verdict::Held(HoldReason::UnsupportedType)
        );
        // A creation is a change of state: an event older than the window
        // is not trusted to make it; its age is asked for only then.
        let mut f = facts(VersionField::Valid(5), 1);
        f.older_than_retention = true;
        assert_eq!(
            decide_new(&f, None, C, CREATE),
            Verdict::Held(HoldReason::ExpiredIdentity)
        );
        let asked = std::cell::Cell::new(0);
        let older = || {
            asked.set(asked.get() + 1);
            true
        };
        f.version = VersionField::Missing;
        assert_eq!(decide_new_aged(&f, older, None, C, CREATE), parked);
        assert_eq!(decide_new_aged(&f, older, None, C, P), parked);
        assert_eq!(asked.get(), 0);
    }

    #[test]
    fn every_recorded_decision_is_acknowledged_with_its_meaning() {
        assert_eq!(Decision::Applied.ack(), Ack::Acknowledge);
        assert_eq!(Decision::Applied.ack_meaning(), "recorded and done");
        let held = Decision::Held(HoldReason::Paused);
        assert_eq!(held.ack(), Ack::Acknowledge);
        assert_eq!(
            held.ack_meaning(),
            "responsibility accepted for reconciliation; state not applied"
        );
        let dup = Decision::Duplicate {
            original: Verdict::Applied,
        };
        assert_eq!(dup.to_string(), "duplicate (original: applied)");
        assert_eq!(dup.original(), Some(Verdict::Applied));
    }

    #[test]
    fn codes_round_trip() {
        let all = [
            Verdict::Applied,
            Verdict::Stale,
            Verdict::Equal,
            Verdict::Conflict(ConflictKind::EventVariant),
            Verdict::Conflict(ConflictKind::VersionState),
            Verdict::Held(HoldReason::Paused),
            Verdict::Held(HoldReason::ExpiredIdentity),
        ];
        for v in all {
            assert_eq!(Verdict::from_code(&v.code()), Some(v));
        }
        assert_eq!(
            Verdict::Held(HoldReason::MissingVersion).code(),
            "held:missing_version"
        );
        assert_eq!(Verdict::from_code("held:nope"), None);
        assert_eq!(Verdict::from_code("duplicate"), None);
    }

    #[test]
    fn byte_codes_round_trip_and_are_distinct() {
        let all: Vec<Verdict> = [Verdict::Applied, Verdict::Stale, Verdict::Equal]
            .into_iter()
            .chain(ConflictKind::ALL.map(Verdict::Conflict))
            .chain(HoldReason::ALL.map(Verdict::Held))
            .collect();
        let codes: std::collections::HashSet<u8> = all.iter().map(|v| v.to_byte()).collect();
        assert_eq!(codes.len(), all.len());
        for v in all {
            assert_eq!(Verdict::from_byte(v.to_byte()), Some(v));
        }
        for code in [3, 0x12, 0x27, 0x30, 0xff] {
            assert_eq!(Verdict::from_byte(code), None, "{code:#x}");
        }
    }

    #[test]
    fn reevaluable_holds() {
        assert!(reevaluable(Verdict::Held(HoldReason::Paused)));
        assert!(reevaluable(Verdict::Conflict(ConflictKind::VersionState)));
        assert!(!reevaluable(Verdict::Conflict(ConflictKind::EventVariant)));
        assert!(!reevaluable(Verdict::Held(HoldReason::MissingVersion)));
        assert!(!reevaluable(Verdict::Held(HoldReason::ExpiredIdentity)));
    }
}
