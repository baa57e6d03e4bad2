//! W3C Trace Context (<https://www.w3.org/TR/trace-context/>): the
//! `traceparent` and `tracestate` a sender puts on a delivery, checked
//! here and carried with the effect the delivery makes, so that a relay can
//! continue the same trace on the request that hands the effect on
//! (docs/CONTRACT.md §10).
//!
//! Pure: parsing, formatting and the form a store keeps. A new span id
//! (random) is the caller's: the engine draws no random numbers.

use std::fmt;
use std::sync::Arc;

/// The most `tracestate` text kept: the specification's limit for the
/// whole list (512 characters); a longer one is dropped, the
/// `traceparent` kept.
pub const MAX_TRACESTATE: usize = 512;

/// The most list members a `tracestate` may have (32).
const MAX_TRACESTATE_MEMBERS: usize = 32;

/// A trace context (W3C Trace Context, level 1): the trace a delivery
/// belongs to, the sender's span it came from, its flags, and the vendors'
/// `tracestate` as received.
///
/// Made by [`TraceContext::parse`] from the two headers; written back with
/// [`TraceContext::traceparent`] (always version `00`). A relay forwarding
/// an effect sends [`TraceContext::child`] with a new span id of its own,
/// so the destination's span is a child of the forward attempt, in the
/// same trace.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TraceContext {
    /// The trace's id (16 bytes, never all zero): what every span of the
    /// trace shares.
    trace_id: [u8; 16],
    /// The id of the span the context came from (8 bytes, never all zero):
    /// the parent of the next span.
    parent_id: [u8; 8],
    /// The trace flags (bit 0: sampled), kept as received.
    flags: u8,
    /// The `tracestate` list as received (whitespace around it trimmed),
    /// when present and well formed; shared, since every copy of one
    /// effect carries the same text.
    state: Option<Arc<str>>,
}

/// Why a `traceparent` was not taken. A delivery with one is decided
/// as if it had none: a trace is never a reason to refuse a delivery.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TraceContextError {
    /// Not `version-traceid-parentid-flags` with 2, 32, 16 and 2 lowercase
    /// hexadecimal digits (version `00`: exactly 55 characters).
    #[error("traceparent {0:?} is not version-traceid-parentid-flags in lowercase hex")]
    Format(String),
    /// Version `ff`, which the specification forbids.
    #[error("traceparent version ff is forbidden")]
    Version,
    /// A trace id of all zeros.
    #[error("traceparent trace id is all zeros")]
    ZeroTraceId,
    /// A parent id of all zeros.
    #[error("traceparent parent id is all zeros")]
    ZeroParentId,
}

impl TraceContextError {
    /// A short code naming the reason (`format`, `version`,
    /// `zero_trace_id`, `zero_parent_id`), for a counter's label.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Format(_) => "format",
            Self::Version => "version",
            Self::ZeroTraceId => "zero_trace_id",
            Self::ZeroParentId => "zero_parent_id",
        }
    }
}

/// The lowercase hex digits of `text` as bytes, or `None` for any other
/// character (the specification refuses uppercase).
fn hex_bytes<const N: usize>(digits: &[u8]) -> Option<[u8; N]> {
    if digits.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        out[i] = (hex_digit(pair[0])? << 4) | hex_digit(pair[1])?;
    }
    Some(out)
}

fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

/// Lowercase hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    out
}

/// Whether `text` is a `tracestate` list the specification allows, as far
/// as a relay that only passes it on needs to know: at most
/// [`MAX_TRACESTATE`] characters of printable ASCII, at most 32 members,
/// each `key=value` with a non-empty key.
fn tracestate_ok(text: &str) -> bool {
    if text.len() > MAX_TRACESTATE || !text.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        return false;
    }
    let mut members = 0;
    for member in text.split(',').map(str::trim).filter(|m| !m.is_empty()) {
        members += 1;
        match member.split_once('=') {
            Some((key, value)) if !key.is_empty() && !value.is_empty() => {}
            _ => return false,
        }
    }
    members <= MAX_TRACESTATE_MEMBERS
}

impl TraceContext {
    /// Reads a `traceparent` header value and, when given, the
    /// `tracestate` header (several headers joined with `,`).
    ///
    /// Version `00` must be exactly `00-<32 hex>-<16 hex>-<2 hex>`; a
    /// higher version (not `ff`) is read by its first 55 characters, the
    /// next one, if any, a `-` (the specification's rule for versions it
    /// does not know yet). A `tracestate` that is not a well-formed list
    /// is dropped and the `traceparent` kept, as the specification says.
    ///
    /// # Errors
    /// [`TraceContextError`] when the `traceparent` is not one.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Result<Self, TraceContextError> {
        let text = traceparent.trim();
        let format = || TraceContextError::Format(text.chars().take(80).collect());
        let b = text.as_bytes();
        let version = b.get(..2).and_then(hex_bytes::<1>).ok_or_else(format)?[0];
        if version == 0xff {
            return Err(TraceContextError::Version);
        }
        let fits = if version == 0 {
            text.len() == 55
        } else {
            text.len() == 55 || (text.len() > 55 && text.as_bytes()[55] == b'-')
        };
        if !fits || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return Err(format());
        }
        let trace_id = hex_bytes::<16>(&b[3..35]).ok_or_else(format)?;
        let parent_id = hex_bytes::<8>(&b[36..52]).ok_or_else(format)?;
        let flags = hex_bytes::<1>(&b[53..55]).ok_or_else(format)?[0];
        if trace_id == [0; 16] {
            return Err(TraceContextError::ZeroTraceId);
        }
        if parent_id == [0; 8] {
            return Err(TraceContextError::ZeroParentId);
        }
        let state = tracestate
            .map(str::trim)
            .filter(|s| !s.is_empty() && tracestate_ok(s))
            .map(Arc::from);
        Ok(Self {
            trace_id,
            parent_id,
            flags,
            state,
        })
    }

    /// The trace id (16 bytes).
    pub fn trace_id(&self) -> [u8; 16] {
        self.trace_id
    }

    /// The parent (span) id (8 bytes): the sender's span, or in a context
    /// made by [`TraceContext::child`], the new span's.
    pub fn parent_id(&self) -> [u8; 8] {
        self.parent_id
    }

    /// The trace flags as received (bit 0: sampled).
    pub fn flags(&self) -> u8 {
        self.flags
    }

    /// Whether the sender sampled the trace (flag bit 0).
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// The `tracestate` list as received, when there was a well-formed one.
    pub fn tracestate(&self) -> Option<&str> {
        self.state.as_deref()
    }

    /// The trace id as 32 lowercase hex digits (how logs and trace
    /// backends show it).
    pub fn trace_id_hex(&self) -> String {
        hex(&self.trace_id)
    }

    /// The parent id as 16 lowercase hex digits.
    pub fn parent_id_hex(&self) -> String {
        hex(&self.parent_id)
    }

    /// The `traceparent` header value, version `00`:
    /// `00-<trace id>-<parent id>-<flags>`.
    pub fn traceparent(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            hex(&self.trace_id),
            hex(&self.parent_id),
            self.flags
        )
    }

    /// The same trace continued by a new span `span_id` (the caller's,
    /// random): same trace id, flags and `tracestate`, `span_id` as the
    /// parent id the next hop sees. `None` for an all-zero `span_id`, which
    /// is not a span id.
    pub fn child(&self, span_id: [u8; 8]) -> Option<Self> {
        (span_id != [0; 8]).then(|| Self {
            parent_id: span_id,
            ..self.clone()
        })
    }

    /// The form a store keeps in one text column: the `traceparent`, and
    /// when there is a `tracestate`, a line feed and the `tracestate`
    /// (neither header can hold a line feed).
    pub fn to_stored(&self) -> String {
        match &self.state {
            Some(state) => format!("{}\n{state}", self.traceparent()),
            None => self.traceparent(),
        }
    }

    /// Reads back [`TraceContext::to_stored`].
    ///
    /// # Errors
    /// [`TraceContextError`] when the text's first line is not a
    /// `traceparent`.
    pub fn from_stored(text: &str) -> Result<Self, TraceContextError> {
        let (parent, state) = match text.split_once('\n') {
            Some((parent, state)) => (parent, Some(state)),
            None => (text, None),
        };
        Self::parse(parent, state)
    }

    /// The bytes this context holds, counted where it is kept (the
    /// in-memory history and outbox): the struct and its `tracestate`.
    pub fn bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.state.as_ref().map_or(0, |s| s.len())
    }
}

impl fmt::Debug for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TraceContext")
            .field("traceparent", &self.traceparent())
            .field("tracestate", &self.state)
            .finish()
    }
}

impl fmt::Display for TraceContext {
    /// The `traceparent` form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.traceparent())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_specification_example_parses_and_formats_back() {
        let t =
            TraceContext::parse(EXAMPLE, Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")).unwrap();
        assert_eq!(t.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.parent_id_hex(), "00f067aa0ba902b7");
        assert_eq!(t.flags(), 1);
        assert!(t.sampled());
        assert_eq!(t.traceparent(), EXAMPLE);
        assert_eq!(
            t.tracestate(),
            Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
        );
        assert_eq!(TraceContext::from_stored(&t.to_stored()).unwrap(), t);
        let plain = TraceContext::parse(EXAMPLE, None).unwrap();
        assert_eq!(plain.to_stored(), EXAMPLE);
        assert_eq!(TraceContext::from_stored(EXAMPLE).unwrap(), plain);
    }

    #[test]
    fn invalid_traceparents_are_refused_with_their_reason() {
        let cases: [(&str, TraceContextError); 10] = [
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                TraceContextError::ZeroTraceId,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                TraceContextError::ZeroParentId,
            ),
            (
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                TraceContextError::Version,
            ),
            (
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
                TraceContextError::Format(
                    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01".into(),
                ),
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
                TraceContextError::Format(
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x".into(),
                ),
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
                TraceContextError::Format(
                    "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01".into(),
                ),
            ),
            (
                "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                TraceContextError::Format(
                    "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
                ),
            ),
            ("", TraceContextError::Format(String::new())),
            (
                "00-é4bf92f3577b34da6a3ce929d0e0e47-00f067aa0ba902b7-01",
                TraceContextError::Format(
                    "00-é4bf92f3577b34da6a3ce929d0e0e47-00f067aa0ba902b7-01".into(),
                ),
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
                TraceContextError::Format(
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g".into(),
                ),
            ),
        ];
        for (text, why) in cases {
            assert_eq!(TraceContext::parse(text, None), Err(why), "{text:?}");
        }
    }

    #[test]
    fn a_later_version_is_read_by_its_first_55_characters() {
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03-what-comes";
        let t = TraceContext::parse(later, None).unwrap();
        assert_eq!(
            t.traceparent(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03"
        );
        assert!(TraceContext::parse(
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03x",
            None
        )
        .is_err());
    }

    #[test]
    fn a_malformed_tracestate_is_dropped_and_the_traceparent_kept() {
        let long = format!("k={}", "v".repeat(MAX_TRACESTATE));
        let many: Vec<String> = (0..33).map(|i| format!("k{i}=v")).collect();
        for state in ["novalue", "=v", "a=b\u{7f}", long.as_str(), &many.join(",")] {
            let t = TraceContext::parse(EXAMPLE, Some(state)).unwrap();
            assert_eq!(t.tracestate(), None, "{state:?}");
        }
        let t = TraceContext::parse(EXAMPLE, Some("  a=1 , b=2 ")).unwrap();
        assert_eq!(t.tracestate(), Some("a=1 , b=2"));
    }

    #[test]
    fn a_child_keeps_the_trace_and_flags_with_the_new_span() {
        let t = TraceContext::parse(EXAMPLE, Some("a=1")).unwrap();
        let child = t.child([1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        assert_eq!(
            child.traceparent(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0102030405060708-01"
        );
        assert_eq!(child.tracestate(), Some("a=1"));
        assert_eq!(t.child([0; 8]), None);
    }
}
