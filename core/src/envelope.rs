//! Envelope parsing (docs/CONTRACT.md §2): raw bytes → a validated [`Delivery`] with its
//! semantic fingerprint, or a refusal.
//!
//! The body is parsed once, in a single pass without building a tree
//! (`canon.rs`); the state stays as the original text and is only re-read
//! when someone displays it.

use crate::canon::{self, CanonErrorKind, Kind, Member};
use crate::clock::Timestamp;
use crate::decision::{EventFacts, VersionField};
use crate::profile::{compose, resolve, Pointer, Profile};
use crate::trace::TraceContext;
use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;
use xxhash_rust::xxh3::xxh3_128;

/// The deepest nesting the parser ever goes, whatever [`Limits::max_depth`]
/// says: the parser recurses once per level, and 1024 levels fit a default
/// 2 MiB thread stack with room to spare (see `canon.rs`). An
/// [`crate::AuthoritativeSnapshot`] is read under it: it is built before it
/// meets a receiver's configuration.
pub(crate) const DEPTH_CEILING: usize = 1024;

/// Size limits checked before anything is recorded. A body over any of them is
/// refused with [`crate::Ack::Reject`]: not recorded, not acknowledged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest accepted body, in bytes. Default 1 MiB.
    pub max_body_bytes: usize,
    /// Deepest accepted JSON nesting (the top-level object is depth 1). Default 64.
    /// Values above 1024 are clamped to 1024 to keep the parser's stack bounded.
    pub max_depth: usize,
    /// Longest accepted `event_id` / `object_id`, in bytes of UTF-8. Default 256.
    pub max_id_bytes: usize,
    /// Most events held for one known object before new holds get `retry`. Default 10,000.
    pub max_held_per_object: usize,
    /// Most events parked for one unknown object before new ones get `retry`. Default 1,000.
    pub max_parked_per_object: usize,
    /// Most events parked for unknown objects plus malformed bodies held, per
    /// shard, before new ones get `retry`. Default 100,000.
    pub max_parked_per_shard: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: 1 << 20,
            max_depth: 64,
            max_id_bytes: 256,
            max_held_per_object: 10_000,
            max_parked_per_object: 1_000,
            max_parked_per_shard: 100_000,
        }
    }
}

/// Why a body was refused without being recorded ([`crate::Ack::Reject`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RejectReason {
    /// The body is larger than [`Limits::max_body_bytes`] (HTTP 413).
    #[error("body is {size} bytes, over the limit of {limit}")]
    BodyTooLarge {
        /// The body's size in bytes.
        size: usize,
        /// The configured limit in bytes.
        limit: usize,
    },
    /// The body nests deeper than [`Limits::max_depth`] (HTTP 400).
    #[error("JSON nesting deeper than the limit of {limit}")]
    TooDeep {
        /// The configured depth limit.
        limit: usize,
    },
    /// An identifier is longer than [`Limits::max_id_bytes`] (HTTP 400).
    #[error("`{field}` is {len} bytes, over the limit of {limit}")]
    IdTooLong {
        /// `event_id` or `object_id`.
        field: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The configured limit in bytes.
        limit: usize,
    },
    /// An identifier contains U+0000 (the JSON escape `\u0000`), which
    /// PostgreSQL text cannot hold: refused by every backend alike, memory
    /// included, so that the same body gets the same answer everywhere
    /// (HTTP 400).
    #[error("`{field}` contains U+0000 (`\\u0000`), which no id may hold")]
    NulInId {
        /// `event_id` or `object_id`.
        field: &'static str,
    },
    /// The durable store refused what this delivery would write (a value it
    /// cannot hold, a row over its size limit): nothing of it was recorded
    /// and the rest of its commit group committed without it. Never the
    /// answer of the in-memory receiver (HTTP 422).
    #[error("the store refused to record this delivery: {cause}")]
    StoreRefused {
        /// The store's reason, in its words.
        cause: String,
    },
}

impl RejectReason {
    /// A stable snake_case name: `body_too_large`, `too_deep`,
    /// `id_too_long`, `nul_in_id` or `store_refused`.
    pub fn as_str(&self) -> &'static str {
        match self {
            RejectReason::BodyTooLarge { .. } => "body_too_large",
            RejectReason::TooDeep { .. } => "too_deep",
            RejectReason::IdTooLong { .. } => "id_too_long",
            RejectReason::NulInId { .. } => "nul_in_id",
            RejectReason::StoreRefused { .. } => "store_refused",
        }
    }
}

/// The text of a JSON state snapshot, exactly as it arrived (a slice of the
/// body it came in, shared, not copied).
#[derive(Clone)]
pub struct StateJson {
    /// The whole body the state came in (or the authority's state text).
    text: Arc<str>,
    /// Byte range of the state inside `text`.
    range: std::ops::Range<usize>,
}

impl StateJson {
    /// Validates `text` as one JSON value (docs/CONTRACT.md §2 rules: no duplicate keys).
    /// Returns the state and its semantic digest.
    pub(crate) fn parse(text: &str, max_depth: usize) -> Result<(Self, u128), canon::CanonError> {
        let digest = canon::digest(text, max_depth.min(DEPTH_CEILING))?;
        // The parser ignored one leading byte-order mark; the state's text
        // leaves it out too.
        let value = text.strip_prefix('\u{feff}').unwrap_or(text);
        let trimmed = value.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\r'));
        let start = trimmed.as_ptr() as usize - text.as_ptr() as usize;
        Ok((
            Self {
                text: Arc::from(text),
                range: start..start + trimmed.len(),
            },
            digest.0,
        ))
    }

    /// A state read back from a store, which wrote it from a state that
    /// was checked when it arrived: taken as it is, not parsed again.
    pub(crate) fn trusted(text: impl Into<Arc<str>>) -> Self {
        let text: Arc<str> = text.into();
        let len = text.len();
        Self {
            text,
            range: 0..len,
        }
    }

    /// Bytes of text this state keeps alive: the whole body it came in
    /// (shared with the envelope and the trail), not only the state's part.
    pub(crate) fn text_len(&self) -> usize {
        self.text.len()
    }

    /// The state's JSON text as received (original key order and spacing).
    pub fn as_str(&self) -> &str {
        &self.text[self.range.clone()]
    }

    /// The state's JSON text without insignificant whitespace; key order,
    /// escapes and number literals are kept as received.
    pub fn compact(&self) -> String {
        canon::compact(self.as_str())
    }

    /// The state as a `serde_json::Value` (numbers beyond f64 precision are
    /// rounded by serde_json; use [`StateJson::as_str`] for the exact text).
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::from_str(self.as_str()).unwrap_or(serde_json::Value::Null)
    }

    /// The state `null`: a tombstone.
    pub(crate) fn null() -> (Self, u128) {
        let (state, digest) =
            Self::parse("null", 1).unwrap_or_else(|_| unreachable!("null is JSON"));
        (state, digest)
    }

    /// Whether the state is JSON `null` (a tombstone: the object was deleted).
    pub fn is_null(&self) -> bool {
        self.as_str() == "null"
    }
}

impl fmt::Debug for StateJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.compact())
    }
}

impl fmt::Display for StateJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.compact())
    }
}

impl serde::Serialize for StateJson {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let raw = serde_json::value::RawValue::from_string(self.compact())
            .map_err(serde::ser::Error::custom)?;
        raw.serialize(s)
    }
}

/// A parsed envelope that names its event and object (docs/CONTRACT.md §2).
#[derive(Clone, Debug)]
pub(crate) struct Envelope {
    /// The whole body as received; kept for the audit trail and held evidence.
    pub(crate) body: Arc<str>,
    /// Event identity.
    pub(crate) event_id: Arc<str>,
    /// Resource (object) identity: a slice of `body` until the owning shard
    /// swaps in its own copy ([`Envelope::share_object_id`]).
    pub(crate) object_id: IdText,
    /// The `object_version` field.
    pub(crate) version: VersionField,
    /// Whether `type` is a supported type.
    pub(crate) supported_type: bool,
    /// `occurred_at`, read once while parsing (the fingerprint needs the
    /// instant); informational, never an ordering key.
    pub(crate) occurred_at: OccurredAt,
    /// The `state` snapshot and its semantic digest, when present.
    pub(crate) state: Option<(StateJson, u128)>,
    /// Semantic fingerprint of the six envelope fields.
    pub(crate) fingerprint: u128,
    /// The trace context the delivery came with (transport metadata, not
    /// the body: no part of the fingerprint), carried to the effect it
    /// makes when applied; dropped when the event is held.
    pub(crate) trace: Option<Arc<TraceContext>>,
}

/// An identity read from a body: still a slice of the body (nothing
/// allocated while the delivery is parsed and routed), or a shared string.
#[derive(Clone, Debug)]
pub(crate) enum IdText {
    /// Byte range of the id inside the envelope's `body` (a one-part id
    /// without escapes is its literal's content, verbatim).
    InBody(std::ops::Range<usize>),
    /// The id as its own string: decoded, composed, or the owning shard's copy.
    Shared(Arc<str>),
}

impl IdText {
    /// The id's text; `body` is the text it was read from.
    fn as_str<'a>(&'a self, body: &'a str) -> &'a str {
        match self {
            IdText::InBody(range) => &body[range.clone()],
            IdText::Shared(id) => id,
        }
    }

    /// The id as a shared string (allocates when it is a slice of `body`).
    fn to_shared(&self, body: &str) -> Arc<str> {
        match self {
            IdText::InBody(range) => Arc::from(&body[range.clone()]),
            IdText::Shared(id) => id.clone(),
        }
    }
}

/// What an envelope's `occurred_at` says about its age.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OccurredAt {
    /// No `occurred_at`: the field is absent or `null`, or the profile maps
    /// none. The event makes no claim about its age; the expired-identity
    /// rule cannot apply and the version check alone protects the state.
    Absent,
    /// An RFC 3339 timestamp ([`Timestamp::parse`]): the instant it names.
    /// However far back (1969, year 0001), it is older than the window
    /// when it lies more than the window before the clock.
    At(Timestamp),
    /// Present but not an RFC 3339 timestamp (another format, no offset, a
    /// number, ...). It cannot show that the event is recent, so it counts
    /// as older than the window: an event that would change state or raise
    /// a conflict without an identity record is held (`expired_identity`)
    /// rather than trusted.
    Unreadable,
}

impl OccurredAt {
    /// Reads the `occurred_at` member, if any; when it names an instant,
    /// its digest becomes that instant's, so that every rendering of the
    /// same instant is the same content (a value that does not parse keeps
    /// its JSON digest: it is compared as text).
    fn read(member: Option<&mut Member<'_>>) -> Self {
        let Some(m) = member.filter(|m| m.kind != Kind::Null) else {
            return OccurredAt::Absent;
        };
        match m.string().and_then(|text| Timestamp::parse(&text)) {
            Some(t) => {
                m.digest = canon::instant_digest(t.secs, t.nanos, t.leap_second);
                OccurredAt::At(t)
            }
            None => OccurredAt::Unreadable,
        }
    }
}

impl Envelope {
    /// The object identity.
    pub(crate) fn object_id(&self) -> &str {
        self.object_id.as_str(&self.body)
    }

    /// The object identity as a shared string: a reference count once the
    /// shard shared its copy, else a new allocation.
    pub(crate) fn object_id_shared(&self) -> Arc<str> {
        self.object_id.to_shared(&self.body)
    }

    /// Makes `id` (the same text, typically the owning shard's key of the
    /// object) this envelope's object identity, so that every later copy of
    /// it (receipt, registry record, held event) shares one allocation.
    pub(crate) fn share_object_id(&mut self, id: Arc<str>) {
        debug_assert_eq!(&*id, self.object_id());
        self.object_id = IdText::Shared(id);
    }

    /// Whether the event counts as older than `retention` before `now` for
    /// the expired-identity rule (docs/CONTRACT.md §5), see [`OccurredAt`].
    pub(crate) fn older_than(&self, now: SystemTime, retention: std::time::Duration) -> bool {
        match self.occurred_at {
            OccurredAt::Absent => false,
            OccurredAt::At(t) => t.older_than(now, retention),
            OccurredAt::Unreadable => true,
        }
    }

    /// What the pure rules need; `older_than_retention` comes from the clock.
    pub(crate) fn facts(&self, older_than_retention: bool) -> EventFacts {
        EventFacts {
            supported_type: self.supported_type,
            version: self.version,
            state: self.state.as_ref().map(|(_, d)| *d),
            older_than_retention,
        }
    }
}

/// A body that cannot name its event: not UTF-8, not a JSON object, duplicate
/// keys, or no string `event_id` / `object_id`. Held with its bytes (docs/CONTRACT.md §2).
#[derive(Clone, Debug)]
pub(crate) struct MalformedBody {
    /// The exact bytes received.
    pub(crate) bytes: Arc<[u8]>,
    /// What is wrong and where, in one line.
    pub(crate) error: String,
    /// The `event_id`, when one could still be read (for display only).
    pub(crate) event_id: Option<Arc<str>>,
    /// The `object_id`, when one could still be read (for display only).
    pub(crate) object_id: Option<Arc<str>>,
}

impl MalformedBody {
    /// The XXH3-128 digest of the exact bytes: how a redelivery of the same
    /// malformed body is recognised (it has no trustworthy identity).
    pub(crate) fn digest(&self) -> u128 {
        xxh3_128(&self.bytes)
    }
}

/// One delivery, parsed and ready for an actor: a well-formed envelope or a
/// malformed body. Made by [`crate::BodyParser::parse`].
#[derive(Clone, Debug)]
pub struct Delivery(pub(crate) Parsed);

/// The two shapes of a [`Delivery`].
#[derive(Clone, Debug)]
pub(crate) enum Parsed {
    /// The body names its event and object.
    Event(Envelope),
    /// It does not.
    Malformed(MalformedBody),
}

impl Delivery {
    /// The same delivery carrying `trace`, the W3C trace context it came
    /// with (an HTTP request's `traceparent` and `tracestate`, for
    /// example): when the delivery is applied, its effect keeps the trace
    /// ([`crate::Effect::trace`]) for the relays that hand it on. A
    /// delivery that is not applied (a duplicate, stale, held, ...) makes
    /// no effect and keeps no trace; a malformed body keeps none either.
    pub fn with_trace(mut self, trace: TraceContext) -> Self {
        if let Parsed::Event(e) = &mut self.0 {
            e.trace = Some(Arc::new(trace));
        }
        self
    }

    /// The trace context given with [`Delivery::with_trace`], if any.
    pub fn trace(&self) -> Option<&TraceContext> {
        match &self.0 {
            Parsed::Event(e) => e.trace.as_deref(),
            Parsed::Malformed(_) => None,
        }
    }

    /// The event identity, when the body has one.
    pub fn event_id(&self) -> Option<&str> {
        match &self.0 {
            Parsed::Event(e) => Some(&e.event_id),
            Parsed::Malformed(m) => m.event_id.as_deref(),
        }
    }

    /// The object identity, when the body has one.
    pub fn object_id(&self) -> Option<&str> {
        match &self.0 {
            Parsed::Event(e) => Some(e.object_id()),
            Parsed::Malformed(m) => m.object_id.as_deref(),
        }
    }

    /// Whether this delivery counts as older than `retention` before `now`
    /// for the expired-identity rule (docs/CONTRACT.md §5): its
    /// `occurred_at` names an instant more than `retention` before `now`, or
    /// is present but not an RFC 3339 timestamp. `false` for a body that
    /// does not name its event, or without an `occurred_at`.
    pub fn older_than(&self, now: SystemTime, retention: std::time::Duration) -> bool {
        match &self.0 {
            Parsed::Event(e) => e.older_than(now, retention),
            Parsed::Malformed(_) => false,
        }
    }

    /// The body as the audit trail records it: the text parsed (a leading
    /// byte order mark left out) for an envelope, the exact bytes received
    /// for a malformed body. Two deliveries with the same bytes here are
    /// the same delivery to the store, which is how a delivery the store
    /// refused is recognised among the steps decided again.
    pub fn body(&self) -> &[u8] {
        match &self.0 {
            Parsed::Event(e) => e.body.as_bytes(),
            Parsed::Malformed(m) => &m.bytes,
        }
    }

    /// What is wrong with a malformed body and where, in one line (for
    /// example `top-level value is a number, not an object at byte 0`); `None` for a
    /// body that names its event. The audit trail keeps the same text.
    pub fn malformed_reason(&self) -> Option<&str> {
        match &self.0 {
            Parsed::Event(_) => None,
            Parsed::Malformed(m) => Some(&m.error),
        }
    }

    /// The semantic fingerprint of the six envelope fields (docs/CONTRACT.md §2), when
    /// the body names its event (`None` for a malformed body). Every encoding
    /// of the same content has the same fingerprint; it is the value the
    /// registry keeps as [`crate::IdentityRecord::fingerprint`].
    pub fn fingerprint(&self) -> Option<u128> {
        match &self.0 {
            Parsed::Event(e) => Some(e.fingerprint),
            Parsed::Malformed(_) => None,
        }
    }
}

/// Per-thread buffers of [`parse`]: the top-level members of one body and
/// the envelope fields resolved from them. Both are empty between bodies;
/// keeping their allocations saves growing two vectors per delivery.
#[derive(Default)]
struct Buffers {
    /// See [`canon::parse_object_into`]; `'static` only while parked (empty).
    members: Vec<Member<'static>>,
    /// One entry per fingerprint slot, in the profile's slot order (see
    /// [`fingerprint`]); `'static` only while parked (empty).
    fields: Vec<Option<Member<'static>>>,
}

/// Buffers longer than this many elements are not kept after a body, so one
/// huge body does not pin its memory in every thread that parsed it.
const BUFFERS_KEEP: usize = 1024;

thread_local! {
    /// This thread's parked [`Buffers`]; a nested parse finds the cell empty
    /// and allocates its own.
    static BUFFERS: Cell<Buffers> = const {
        Cell::new(Buffers { members: Vec::new(), fields: Vec::new() })
    };
}

/// This thread's [`Buffers`], lent to one body's parse and handed back on drop.
struct Lease<'a> {
    /// The body's top-level members.
    members: Vec<Member<'a>>,
    /// The resolved envelope fields.
    fields: Vec<Option<Member<'a>>>,
}

impl Lease<'_> {
    fn take() -> Self {
        let Buffers { members, fields } = BUFFERS.with(Cell::take);
        Lease { members, fields }
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let mut parked = Buffers::default();
        if self.members.capacity() <= BUFFERS_KEEP {
            parked.members = canon::recycle(std::mem::take(&mut self.members));
        }
        if self.fields.capacity() <= BUFFERS_KEEP {
            parked.fields = canon::recycle(std::mem::take(&mut self.fields));
        }
        BUFFERS.with(|cell| cell.set(parked));
    }
}

/// Parses one body with `profile`. `Err` is a refusal over a limit;
/// everything else, however broken, becomes a [`Delivery`] that an actor will
/// record.
pub(crate) fn parse(
    bytes: &[u8],
    limits: &Limits,
    profile: &Profile,
) -> Result<Delivery, RejectReason> {
    if bytes.len() > limits.max_body_bytes {
        return Err(RejectReason::BodyTooLarge {
            size: bytes.len(),
            limit: limits.max_body_bytes,
        });
    }
    let malformed = |error: String, ids: [Option<Arc<str>>; 2]| {
        let [event_id, object_id] = ids;
        Ok(Delivery(Parsed::Malformed(MalformedBody {
            bytes: Arc::from(bytes),
            error,
            event_id,
            object_id,
        })))
    };
    let text = match canon::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => return malformed(e.to_string(), [None, None]),
    };
    let max_depth = limits.max_depth.min(DEPTH_CEILING);
    let mut lease = Lease::take();
    let Lease { members, fields } = &mut lease;
    match canon::parse_object_into(text, max_depth, members) {
        Ok(()) => {}
        Err(e) if matches!(e.kind, CanonErrorKind::TooDeep { .. }) => {
            return Err(RejectReason::TooDeep { limit: max_depth })
        }
        Err(e) => return malformed(e.to_string(), [None, None]),
    }
    // Every mapped field, resolved once, in the fingerprint's slot order. The
    // document was validated whole, so resolving cannot fail; treat a failure
    // like an absent field all the same.
    let get = |p: &Pointer| resolve(members, p, max_depth).ok().flatten();
    fields.clear();
    for p in profile.event_id.iter().chain(&profile.object_id) {
        let mut field = get(p);
        if let Some(m) = field.as_mut().filter(|_| profile.integer_ids) {
            // An integer id is its text: `12` and `"12"` are the same id.
            if let Some(text) = integer_id(m) {
                m.digest = canon::string_digest(text);
            }
        }
        fields.push(field);
    }
    for p in &profile.version {
        fields.push(get(p));
    }
    let occurred_slot = fields.len();
    for p in [&profile.occurred_at, &profile.event_type, &profile.state] {
        fields.push(p.as_ref().and_then(get));
    }
    let occurred_at = OccurredAt::read(fields[occurred_slot].as_mut());
    let (event_fields, rest) = fields.split_at(profile.event_id.len());
    let (object_fields, rest) = rest.split_at(profile.object_id.len());
    let (version_fields, rest) = rest.split_at(profile.version.len());
    let [_occurred_at, type_field, state_field] = rest else {
        unreachable!("three optional slots follow the pointer lists")
    };

    let ids = |pointers, fields| id_field(text, profile, pointers, fields, limits);
    let event_id = match ids(&profile.event_id, event_fields)? {
        Ok(id) => id.to_shared(text),
        Err(why) => {
            let object_id = ids(&profile.object_id, object_fields)?.ok();
            return malformed(why, [None, object_id.map(|id| id.to_shared(text))]);
        }
    };
    let object_id = match ids(&profile.object_id, object_fields)? {
        Ok(id) => id,
        Err(why) => return malformed(why, [Some(event_id), None]),
    };
    let mut versions = version_fields
        .iter()
        .flatten()
        .filter(|m| m.kind != Kind::Null);
    let version = match versions.next() {
        None => VersionField::Missing,
        // Several places agree only if each is the same valid integer.
        Some(first) => match canon::is_unsigned_integer_literal(first.raw) {
            Some(v) if versions.all(|m| canon::is_unsigned_integer_literal(m.raw) == Some(v)) => {
                VersionField::Valid(v)
            }
            _ => VersionField::Invalid,
        },
    };
    let event_type = type_field.as_ref().and_then(Member::string);
    let class = profile.classify(event_type.as_deref());
    let fingerprint = fingerprint(fields);

    let body: Arc<str> = Arc::from(text);
    let state = if class == Some(true) {
        // A delete is a tombstone: version kept, state null.
        Some(StateJson::null())
    } else {
        state_field.as_ref().map(|m| {
            let start = m.raw.as_ptr() as usize - text.as_ptr() as usize;
            let json = StateJson {
                text: body.clone(),
                range: start..start + m.raw.len(),
            };
            (json, m.digest.0)
        })
    };
    Ok(Delivery(Parsed::Event(Envelope {
        body,
        event_id,
        object_id,
        version,
        supported_type: class.is_some(),
        occurred_at,
        state,
        fingerprint,
        trace: None,
    })))
}

/// The semantic fingerprint of an envelope: XXH3-128 over every mapped
/// field's slot in the profile's fixed order (`fields`, see [`parse`]), a
/// present field as `1` and its 16-byte little-endian digest, an absent one as
/// 17 zero bytes. A field's digest is its JSON value's, except an
/// `occurred_at` that names an instant (the instant's, see
/// [`OccurredAt::read`]) and an integer id under [`Profile::integer_ids`]
/// (its text's, see [`integer_id`]). Transport metadata never enters it.
/// The value is stored (registry, durable receipts): a change to what a slot
/// holds makes receipts stored before the change disagree with redeliveries
/// of their events, until they leave the retention window.
fn fingerprint(fields: &[Option<Member<'_>>]) -> u128 {
    const SLOT: usize = 17;
    // Eight slots cover the built-in profiles without allocating.
    let mut on_stack = [0u8; 8 * SLOT];
    let mut on_heap = Vec::new();
    let input = if fields.len() <= 8 {
        &mut on_stack[..fields.len() * SLOT]
    } else {
        on_heap.resize(fields.len() * SLOT, 0);
        &mut on_heap[..]
    };
    for (slot, field) in input.chunks_exact_mut(SLOT).zip(fields) {
        if let Some(m) = field {
            slot[0] = 1;
            slot[1..].copy_from_slice(&m.digest.0.to_le_bytes());
        }
    }
    xxh3_128(input)
}

/// The text of an id given as a JSON integer ([`Profile::integer_ids`]):
/// a number literal of digits only, which JSON writes without leading zeros,
/// so the text is the integer's one decimal spelling. `None` for anything
/// else: a string, a sign, a fraction or an exponent (`-12`, `12.0`, `1e1`).
fn integer_id<'a>(m: &Member<'a>) -> Option<&'a str> {
    let digits = m.kind == Kind::Number && m.raw.bytes().all(|b| b.is_ascii_digit());
    digits.then_some(m.raw)
}

/// Reads a (possibly composite) identity from its resolved parts (`found`,
/// one per pointer) of the body `text`: `Err` for an over-long id (a
/// refusal), `Ok(Err(why))` when a part is absent or not a string
/// (malformed), naming the pointer. A one-part id without escapes comes back
/// as a range of `text`, anything else as its own string.
fn id_field<'a>(
    text: &'a str,
    profile: &Profile,
    pointers: &[Pointer],
    found: &[Option<Member<'a>>],
    limits: &Limits,
) -> Result<Result<IdText, String>, RejectReason> {
    let part = |p: &Pointer, m: &Option<Member<'a>>| {
        let Some(m) = m else {
            return Err(if profile.name == "card" {
                format!("missing field `{}`", &p.as_str()[1..])
            } else {
                format!("missing `{p}` (profile `{}`)", profile.name)
            });
        };
        let integer = || {
            integer_id(m)
                .filter(|_| profile.integer_ids)
                .map(Cow::Borrowed)
        };
        m.string().or_else(integer).ok_or_else(|| {
            let expected = if profile.integer_ids {
                "a string or an integer (digits only: no sign, fraction or exponent)"
            } else {
                "a string"
            };
            if profile.name == "card" {
                format!("field `{}` must be {expected}", &p.as_str()[1..])
            } else {
                format!("`{p}` must be {expected} (profile `{}`)", profile.name)
            }
        })
    };
    let empty = || {
        let names: Vec<&str> = pointers.iter().map(Pointer::as_str).collect();
        Ok(Err(format!("empty identity at `{}`", names.join("`, `"))))
    };
    let id = if let ([p], [m]) = (pointers, found) {
        // One part (every built-in identity but the shipment's): no vector.
        let part = match part(p, m) {
            Ok(part) => part,
            Err(why) => return Ok(Err(why)),
        };
        if part.is_empty() {
            return empty();
        }
        match part {
            // A borrowed part is a slice of `text`: keep its range.
            Cow::Borrowed(id) => {
                let start = id.as_ptr() as usize - text.as_ptr() as usize;
                IdText::InBody(start..start + id.len())
            }
            Cow::Owned(_) => IdText::Shared(compose(std::slice::from_ref(&part))),
        }
    } else {
        let mut parts = Vec::with_capacity(pointers.len());
        for (p, m) in pointers.iter().zip(found) {
            match part(p, m) {
                Ok(part) => parts.push(part),
                Err(why) => return Ok(Err(why)),
            }
        }
        if parts.iter().any(|p| p.is_empty()) {
            return empty();
        }
        IdText::Shared(compose(&parts))
    };
    let field = || {
        if std::ptr::eq(pointers, profile.event_id.as_slice()) {
            "event_id"
        } else {
            "object_id"
        }
    };
    let id_text = id.as_str(text);
    let len = id_text.len();
    if len > limits.max_id_bytes {
        let field = field();
        return Err(RejectReason::IdTooLong {
            field,
            len,
            limit: limits.max_id_bytes,
        });
    }
    if id_text.contains('\0') {
        return Err(RejectReason::NulInId { field: field() });
    }
    Ok(Ok(id))
}

#[cfg(all(test, not(snapshot_receiver_loom)))]
mod tests {
    use super::*;

    fn types() -> Profile {
        Profile::card()
    }

    fn event(body: &str) -> Envelope {
        match parse(body.as_bytes(), &Limits::default(), &types())
            .unwrap()
            .0
        {
            Parsed::Event(e) => e,
            Parsed::Malformed(m) => panic!("malformed: {}", m.error),
        }
    }

    fn malformed(body: &[u8]) -> String {
        match parse(body, &Limits::default(), &types()).unwrap().0 {
            Parsed::Event(e) => panic!("parsed as event {}", e.event_id),
            Parsed::Malformed(m) => m.error,
        }
    }

    /// The capacities of this thread's parked buffers: top-level members,
    /// resolved fields.
    fn parked() -> (usize, usize) {
        BUFFERS.with(|cell| {
            let buffers = cell.take();
            let capacities = (buffers.members.capacity(), buffers.fields.capacity());
            cell.set(buffers);
            capacities
        })
    }

    fn parked_members() -> usize {
        parked().0
    }

    #[test]
    fn the_member_buffer_is_parked_for_the_next_body_unless_huge() {
        event(BASE);
        // BASE has 6 top-level members; the card profile resolves 6 fields.
        let (members, fields) = parked();
        assert!(members >= 6 && fields >= 6, "{members} {fields}");
        // 2,000 extra top-level members: over the 1,024 kept.
        let extra: String = (0..2_000).map(|i| format!(",\"x{i}\":0")).collect();
        let huge = format!("{}{extra}}}", &BASE[..BASE.len() - 1]);
        assert_eq!(event(&huge).event_id.as_ref(), "e-1");
        assert_eq!(parked_members(), 0);
        event(BASE);
        assert!(parked_members() >= 6, "{}", parked_members());
    }

    #[test]
    fn a_profile_of_more_than_eight_fields_fingerprints_every_one() {
        let mut profile = Profile::card();
        profile.event_id = ["/e1", "/e2", "/e3", "/e4", "/e5", "/e6"]
            .iter()
            .map(|p| Pointer::parse(p).unwrap())
            .collect();
        // 6 + 1 + 1 + 3 = 11 slots: past the 8 kept on the stack.
        let fingerprint = |last: &str, state: &str| {
            let body = format!(
                r#"{{"e1":"a","e2":"b","e3":"c","e4":"d","e5":"e","e6":"{last}","object_id":"card-7","object_version":3,"occurred_at":"2024-01-01T08:00:00Z","type":"card.snapshot","state":{state}}}"#
            );
            match parse(body.as_bytes(), &Limits::default(), &profile)
                .unwrap()
                .0
            {
                Parsed::Event(e) => e.fingerprint,
                Parsed::Malformed(m) => panic!("malformed: {}", m.error),
            }
        };
        let base = fingerprint("f", r#"{"n":1}"#);
        assert_eq!(fingerprint("f", r#"{ "n" : 1 }"#), base);
        assert_ne!(fingerprint("f", r#"{"n":2}"#), base, "the last slot counts");
        assert_ne!(
            fingerprint("g", r#"{"n":1}"#),
            base,
            "the sixth id part counts"
        );
    }

    const BASE: &str = r#"{"event_id":"e-1","object_id":"card-7","object_version":12,"occurred_at":"2024-01-01T08:00:00Z","type":"card.snapshot","state":{"stage":"ready","label":"Map"}}"#;

    #[test]
    fn reencoding_keeps_the_fingerprint_transport_fields_do_not_count() {
        let a = event(BASE);
        let b = event(
            "{ \"state\" : {\"label\":\"M\\u0061p\", \"stage\":\"ready\"},\n \"type\":\"card.snapshot\", \"occurred_at\":\"2024-01-01T08:00:00Z\",\
             \"object_version\": 12, \"object_id\":\"card-7\", \"event_id\":\"e-1\", \"attempt\": 2 }",
        );
        assert_eq!(a.fingerprint, b.fingerprint);
        assert_eq!(a.state.as_ref().unwrap().1, b.state.as_ref().unwrap().1);
        assert_eq!(
            b.state.as_ref().unwrap().0.compact(),
            r#"{"label":"M\u0061p","stage":"ready"}"#
        );
    }

    #[test]
    fn every_semantic_field_changes_the_fingerprint() {
        let base = event(BASE).fingerprint;
        for changed in [
            BASE.replace("\"e-1\"", "\"e-2\""),
            BASE.replace("card-7", "card-8"),
            BASE.replace(":12", ":13"),
            BASE.replace("08:00:00Z", "08:00:01Z"),
            BASE.replace("\"Map\"", "\"Map \""),
            BASE.replace(",\"occurred_at\":\"2024-01-01T08:00:00Z\"", ""),
        ] {
            assert_ne!(event(&changed).fingerprint, base, "{changed}");
        }
        // The same value spelled differently is the same version.
        assert_eq!(event(&BASE.replace(":12", ":12 ")).fingerprint, base);
    }

    #[test]
    fn versions_are_unsigned_integer_literals() {
        let v = |lit: &str| event(&BASE.replace(":12", &format!(":{lit}"))).version;
        assert_eq!(v("0"), VersionField::Valid(0));
        assert_eq!(v("18446744073709551615"), VersionField::Valid(u64::MAX));
        for bad in [
            "18446744073709551616",
            "10.0",
            "1e1",
            "-1",
            "\"12\"",
            "true",
            "[12]",
        ] {
            assert_eq!(v(bad), VersionField::Invalid, "{bad}");
        }
        assert_eq!(v("null"), VersionField::Missing);
        assert_eq!(
            event(&BASE.replace("\"object_version\":12,", "")).version,
            VersionField::Missing
        );
    }

    #[test]
    fn types_and_times() {
        assert!(event(BASE).supported_type);
        assert!(!event(&BASE.replace("card.snapshot", "card.comment")).supported_type);
        assert!(!event(&BASE.replace("\"card.snapshot\"", "7")).supported_type);
        let at_t = OccurredAt::At(Timestamp {
            secs: 1_704_096_000,
            nanos: 0,
            leap_second: false,
        });
        assert_eq!(event(BASE).occurred_at, at_t);
        let escaped = BASE.replace("08:00:00Z", "08:00:00\\u005a");
        assert_eq!(event(&escaped).occurred_at, at_t);
        let with =
            |value: &str| event(&BASE.replace("\"2024-01-01T08:00:00Z\"", value)).occurred_at;
        assert_eq!(with("\"2024-01-01T03:00:00-05:00\""), at_t);
        assert_eq!(with("\"yesterday\""), OccurredAt::Unreadable);
        assert_eq!(with("7"), OccurredAt::Unreadable);
        assert_eq!(with("null"), OccurredAt::Absent);
        let without = BASE.replace(",\"occurred_at\":\"2024-01-01T08:00:00Z\"", "");
        assert_eq!(event(&without).occurred_at, OccurredAt::Absent);
    }

    #[test]
    fn malformed_bodies_name_what_is_wrong() {
        assert_eq!(
            malformed(b"[1]"),
            "top-level value is an array, not an object at byte 0"
        );
        assert!(
            malformed(b"{\"event_id\":\"e\",\"event_id\":\"f\",\"object_id\":\"o\"}")
                .starts_with("duplicate key \"event_id\"")
        );
        assert_eq!(
            malformed(b"{\"object_id\":\"o\"}"),
            "missing field `event_id`"
        );
        assert_eq!(
            malformed(b"{\"event_id\":1,\"object_id\":\"o\"}"),
            "field `event_id` must be a string"
        );
        assert_eq!(
            malformed(b"{\"event_id\":\"e\"}"),
            "missing field `object_id`"
        );
        assert!(malformed(b"\xff{}").contains("UTF-8"));
    }

    fn delivery(body: &str, profile: &Profile) -> Delivery {
        parse(body.as_bytes(), &Limits::default(), profile).unwrap()
    }

    #[test]
    fn state_text_is_kept_as_received_and_trimmed() {
        let (state, digest) =
            StateJson::parse("\u{feff} \t{ \"b\" : [1, 2.50],\n\"a\":null }\r\n", 8).unwrap();
        assert_eq!(state.as_str(), "{ \"b\" : [1, 2.50],\n\"a\":null }");
        assert_eq!(state.compact(), r#"{"b":[1,2.50],"a":null}"#);
        assert_eq!(format!("{state:?}"), state.compact());
        assert_eq!(state.to_string(), state.compact());
        assert_eq!(
            serde_json::to_string(&state).unwrap(),
            r#"{"b":[1,2.50],"a":null}"#
        );
        assert_eq!(
            state.to_value(),
            serde_json::json!({"a": null, "b": [1, 2.5]})
        );
        assert!(!state.is_null());
        let (same, same_digest) = StateJson::parse(r#"{"a":null,"b":[1,2.5]}"#, 8).unwrap();
        assert_eq!(
            (same_digest, same.as_str()),
            (digest, r#"{"a":null,"b":[1,2.5]}"#)
        );
        let (null, null_digest) = StateJson::null();
        assert!(null.is_null());
        assert_eq!((null.as_str(), null.compact()), ("null", "null".to_owned()));
        assert_eq!(null_digest, StateJson::parse(" null ", 1).unwrap().1);
        assert_ne!(null_digest, digest);
        // The depth limit is the state's own (capped by the ceiling).
        assert!(StateJson::parse("[[1]]", 1).is_err());
        assert!(StateJson::parse("[[1]]", 2).is_ok());
    }

    #[test]
    fn a_delivery_names_its_identities_age_and_fingerprint() {
        let card = types();
        let d = delivery(BASE, &card);
        assert_eq!((d.event_id(), d.object_id()), (Some("e-1"), Some("card-7")));
        assert_eq!(d.fingerprint(), Some(event(BASE).fingerprint));
        let t = crate::parse_rfc3339("2024-01-01T08:00:00Z").unwrap();
        let hour = std::time::Duration::from_secs(3600);
        assert!(!d.older_than(t + hour, hour));
        assert!(d.older_than(t + hour + std::time::Duration::from_secs(1), hour));
        // Without an `occurred_at` the event makes no claim: never older.
        let without = BASE.replace(",\"occurred_at\":\"2024-01-01T08:00:00Z\"", "");
        assert!(!delivery(&without, &card).older_than(t + 1000 * hour, hour));
        let unreadable = BASE.replace("\"2024-01-01T08:00:00Z\"", "\"soon\"");
        assert!(delivery(&unreadable, &card).older_than(t, hour));
        // A malformed body keeps what it could read, and has no fingerprint
        // or age.
        let m = delivery(
            r#"{"event_id":7,"object_id":"card-7","occurred_at":"1970-01-01T00:00:00Z"}"#,
            &card,
        );
        assert_eq!((m.event_id(), m.object_id()), (None, Some("card-7")));
        assert_eq!(m.fingerprint(), None);
        assert!(!m.older_than(t, hour));
        let m = delivery(r#"{"event_id":"e-9"}"#, &card);
        assert_eq!((m.event_id(), m.object_id()), (Some("e-9"), None));
    }

    #[test]
    fn facts_and_shared_ids() {
        let mut e = event(BASE);
        let facts = e.facts(true);
        assert_eq!(
            facts,
            EventFacts {
                supported_type: true,
                version: VersionField::Valid(12),
                state: Some(e.state.as_ref().unwrap().1),
                older_than_retention: true,
            }
        );
        assert!(!e.facts(false).older_than_retention);
        assert_eq!(&*e.object_id_shared(), "card-7");
        let shared: Arc<str> = Arc::from("card-7");
        e.share_object_id(shared.clone());
        assert!(Arc::ptr_eq(&e.object_id_shared(), &shared));
        assert_eq!(e.object_id(), "card-7");
        // A body without a state has no state digest.
        let no_state = BASE.replace(",\"state\":{\"stage\":\"ready\",\"label\":\"Map\"}", "");
        assert_eq!(event(&no_state).facts(false).state, None);
        // A delete is a tombstone: state null.
        let deleted = event(&BASE.replace("card.snapshot", "card.deleted"));
        assert!(deleted.state.as_ref().unwrap().0.is_null());
        assert!(deleted.supported_type);
    }

    #[test]
    fn composite_and_integer_ids() {
        let shipment = Profile::shipment();
        let body = r#"{"tenant_id":"acme/eu","event_id":450,"type":"shipment.updated","shipment":{"id":"50%","revision":3}}"#;
        let d = delivery(body, &shipment);
        assert_eq!(
            (d.event_id(), d.object_id()),
            (Some("acme%2Feu/450"), Some("acme%2Feu/50%25"))
        );
        // An integer id is its text: 450 and "450" are the same event.
        let quoted = body.replace(":450", ":\"450\"");
        assert_eq!(delivery(&quoted, &shipment).fingerprint(), d.fingerprint());
        assert_eq!(
            delivery(&quoted, &shipment).event_id(),
            Some("acme%2Feu/450")
        );
        // Not digits only: not an id.
        for bad in ["-450", "4.5", "45e1"] {
            let m = delivery(&body.replace("450", bad), &shipment);
            assert_eq!(m.event_id(), None, "{bad}");
        }
        // Without integer ids, a number is no id.
        let m = delivery(&BASE.replace("\"e-1\"", "1"), &types());
        assert_eq!(m.event_id(), None);
        // An empty part makes the whole identity empty: malformed.
        let empty = delivery(&body.replace("\"acme/eu\"", "\"\""), &shipment);
        assert_eq!((empty.event_id(), empty.object_id()), (None, None));
        let empty = delivery(&BASE.replace("\"e-1\"", "\"\""), &types());
        assert_eq!(empty.event_id(), None);
        assert_eq!(
            malformed(BASE.replace("\"card-7\"", "\"\"").as_bytes()),
            "empty identity at `/object_id`"
        );
        // Two revisions must agree.
        let both = body.replace("}}", "},\"shipment_revision\":3}");
        let e = |b: &str| match delivery(b, &shipment).0 {
            Parsed::Event(e) => e.version,
            Parsed::Malformed(m) => panic!("{}", m.error),
        };
        assert_eq!(e(&both), VersionField::Valid(3));
        let disagree = both.replace("\"shipment_revision\":3", "\"shipment_revision\":4");
        assert_eq!(e(&disagree), VersionField::Invalid);
        // An event id over the limit names its field.
        let limits = Limits {
            max_id_bytes: 3,
            ..Limits::default()
        };
        assert_eq!(
            parse(
                BASE.replace("\"card-7\"", "\"c\"")
                    .replace("\"e-1\"", "\"e-12\"")
                    .as_bytes(),
                &limits,
                &types()
            )
            .unwrap_err(),
            RejectReason::IdTooLong {
                field: "event_id",
                len: 3 + 1,
                limit: 3
            }
        );
    }

    #[test]
    fn a_nul_in_an_id_is_refused_naming_the_field_and_a_nul_in_the_state_is_kept() {
        let refused = |body: &str| parse(body.as_bytes(), &Limits::default(), &types()).err();
        let nul = |field| Some(RejectReason::NulInId { field });
        assert_eq!(
            refused(&BASE.replace("\"e-1\"", r#""e-\u0000""#)),
            nul("event_id")
        );
        assert_eq!(
            refused(&BASE.replace("\"card-7\"", r#""\u0000""#)),
            nul("object_id")
        );
        // Refused also when the other id is missing (the body would be malformed).
        let no_event = BASE.replace("\"event_id\":\"e-1\",", "");
        assert_eq!(
            refused(&no_event.replace("\"card-7\"", r#""c\u0000""#)),
            nul("object_id")
        );
        // Another escape of a control character is an ordinary id.
        assert_eq!(refused(&BASE.replace("\"e-1\"", r#""e-\u0001""#)), None);
        // The state may hold U+0000: it is stored as the JSON text received.
        let state = BASE.replace("\"Map\"", r#""M\u0000p""#);
        assert_eq!(
            event(&state).state.unwrap().0.as_str(),
            r#"{"stage":"ready","label":"M\u0000p"}"#
        );
        assert_eq!(
            RejectReason::NulInId { field: "event_id" }.as_str(),
            "nul_in_id"
        );
    }

    #[test]
    fn limits_refuse_at_one_over() {
        let limits = Limits {
            max_body_bytes: BASE.len(),
            max_id_bytes: 6,
            ..Limits::default()
        };
        assert!(parse(BASE.as_bytes(), &limits, &types()).is_ok());
        let longer = BASE.replace("card-7", "card-77");
        assert_eq!(
            parse(longer.as_bytes(), &limits, &types()).unwrap_err(),
            RejectReason::BodyTooLarge {
                size: BASE.len() + 1,
                limit: BASE.len()
            }
        );
        let limits = Limits {
            max_body_bytes: 1 << 20,
            ..limits
        };
        assert_eq!(
            parse(longer.as_bytes(), &limits, &types()).unwrap_err(),
            RejectReason::IdTooLong {
                field: "object_id",
                len: 7,
                limit: 6
            }
        );
        let deep = BASE
            .replace("{\"stage\"", "[[{\"stage\"")
            .replace("\"Map\"}", "\"Map\"}]]");
        let limits = Limits {
            max_depth: 3,
            ..Limits::default()
        };
        assert_eq!(
            parse(deep.as_bytes(), &limits, &types()).unwrap_err(),
            RejectReason::TooDeep { limit: 3 }
        );
        let limits = Limits {
            max_depth: 4,
            ..Limits::default()
        };
        assert!(parse(deep.as_bytes(), &limits, &types()).is_ok());
    }
}
