//! Strict RFC 8259 JSON parsing into 128-bit *semantic* digests.
//!
//! Two documents have the same digest exactly when they carry the same semantic content:
//! object key order and insignificant whitespace never matter, array order always does;
//! strings compare by code points after escape decoding (no Unicode normalisation);
//! numbers compare by exact decimal value (`1` = `1.0` = `10e-1`, `-0` = `0`, never via f64);
//! `null`, `true`, `false`, numbers and strings are all distinct. A duplicate object key
//! anywhere is an error. One UTF-8 byte-order mark before the document is ignored (RFC 8259
//! §8.1); one anywhere else outside a string is an error.
//!
//! No tree is built: a single recursive-descent pass hashes every value bottom-up with
//! XXH3-128, using the value's type tag as the seed. Containers hash their element count and
//! child digests; objects sort their member digests first, so key order cannot matter.
//! Recursion depth is bounded by `max_depth`: callers must keep it modest (<= 1024). Each
//! nesting level costs about 0.6 KiB of stack in release builds and 1.2 KiB in debug builds
//! (objects; arrays less), so 1024 levels fit a default 2 MiB thread stack with room to spare.

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::HashSet;
use std::fmt;
use xxhash_rust::xxh3::xxh3_128_with_seed;

/// 128-bit semantic digest of one JSON value.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub(crate) struct Digest(pub(crate) u128);

/// The type of a JSON value.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    /// `null`
    Null,
    /// `true` or `false`
    Bool,
    /// A number literal.
    Number,
    /// A string literal.
    String,
    /// `[...]`
    Array,
    /// `{...}`
    Object,
}

/// One member of the top-level object, as returned by [`parse_object`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Member<'a> {
    /// The decoded key (borrowed from the input when the key literal has no escapes).
    pub(crate) key: Cow<'a, str>,
    /// Exact source text of the value, without surrounding whitespace.
    pub(crate) raw: &'a str,
    /// The type of the value.
    pub(crate) kind: Kind,
    /// Digest of the value alone (the key is not included); equals `digest(raw)`.
    pub(crate) digest: Digest,
    /// For a string value: its literal has no escapes, so its value is the
    /// text between the quotes (no second pass needed to decode it).
    pub(crate) plain: bool,
}

impl<'a> Member<'a> {
    /// The decoded value when it is a string (borrowed from the input when the
    /// literal has no escapes); `None` for any other kind.
    pub(crate) fn string(&self) -> Option<Cow<'a, str>> {
        match self.kind {
            Kind::String if self.plain => Some(Cow::Borrowed(&self.raw[1..self.raw.len() - 1])),
            Kind::String => decode_string(self.raw),
            _ => None,
        }
    }
}

/// Why a document was rejected, and the byte offset in the input where it was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CanonError {
    /// What is wrong.
    pub(crate) kind: CanonErrorKind,
    /// Byte offset in the input where the problem was found.
    pub(crate) offset: usize,
}

/// The kinds of [`CanonError`]. Offsets given below are those reported in `CanonError::offset`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CanonErrorKind {
    /// The input is empty or whitespace only (offset: end of the input).
    Empty,
    /// The bytes are not UTF-8 (offset: first invalid byte); only from [`from_utf8`].
    InvalidUtf8,
    /// A UTF-8 byte-order mark outside a string literal, other than the one
    /// leading mark that is ignored (offset: the mark). Inside a string,
    /// U+FEFF is an ordinary character.
    ByteOrderMark,
    /// Any other grammar violation, with a short description (offset: the offending byte).
    Syntax(&'static str),
    /// A raw U+0000..U+001F inside a string literal (offset: that byte).
    ControlCharacterInString,
    /// An unknown escape or a `\u` without four hex digits (offset: the backslash).
    InvalidEscape,
    /// A `\u` high surrogate not followed by a `\u` low surrogate, or a lone low surrogate
    /// (offset: the backslash of the first escape).
    LoneSurrogate,
    /// A number whose integer part has a leading zero, such as `01` (offset: the zero).
    LeadingZero,
    /// A number exponent with more than 30 digits (offset: the first exponent digit).
    ExponentOutOfRange,
    /// Non-whitespace after the top-level value (offset: the first such byte).
    TrailingCharacters,
    /// Containers nested deeper than `max_depth` (offset: the first bracket too deep).
    TooDeep { max_depth: usize },
    /// An object has the same decoded key twice (offset: the opening quote of the repeat).
    DuplicateKey { key: String },
    /// [`parse_object`] found a valid document whose top-level value is not an object
    /// (offset: the start of that value).
    NotAnObject { found: Kind },
}

impl fmt::Display for CanonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use CanonErrorKind::*;
        match &self.kind {
            Empty => f.write_str("empty input: no JSON value")?,
            InvalidUtf8 => f.write_str("invalid UTF-8")?,
            ByteOrderMark => f.write_str("misplaced byte-order mark")?,
            Syntax(what) => f.write_str(what)?,
            ControlCharacterInString => f.write_str("unescaped control character in string")?,
            InvalidEscape => f.write_str("invalid escape sequence in string")?,
            LoneSurrogate => f.write_str("unpaired UTF-16 surrogate escape")?,
            LeadingZero => f.write_str("number has a leading zero")?,
            ExponentOutOfRange => write!(
                f,
                "number exponent has more than {MAX_EXPONENT_DIGITS} digits"
            )?,
            TrailingCharacters => f.write_str("unexpected characters after the JSON value")?,
            TooDeep { max_depth } => write!(f, "nesting deeper than max_depth {max_depth}")?,
            DuplicateKey { key } => write!(f, "duplicate key {key:?}")?,
            NotAnObject { found } => {
                let found = match found {
                    Kind::Null => "null",
                    Kind::Bool => "a boolean",
                    Kind::Number => "a number",
                    Kind::String => "a string",
                    Kind::Array => "an array",
                    Kind::Object => "an object",
                };
                write!(f, "top-level value is {found}, not an object")?
            }
        }
        write!(f, " at byte {}", self.offset)
    }
}

impl std::error::Error for CanonError {}

/// Parses a document whose top-level value must be an object and returns its members in
/// source order. The whole document is validated (any [`CanonErrorKind`] but `InvalidUtf8`);
/// a valid non-object document gives `NotAnObject`. `max_depth` bounds container nesting:
/// the top-level value is depth 1, so `{"a":[1]}` needs `max_depth >= 2`.
pub(crate) fn parse_object(text: &str, max_depth: usize) -> Result<Vec<Member<'_>>, CanonError> {
    let mut members = Vec::new();
    parse_object_into(text, max_depth, &mut members)?;
    Ok(members)
}

/// [`parse_object`] into a caller's vector (cleared first), so that a caller parsing many
/// bodies can keep one allocation. On `Err` the vector's contents are unspecified.
pub(crate) fn parse_object_into<'a>(
    text: &'a str,
    max_depth: usize,
    members: &mut Vec<Member<'a>>,
) -> Result<(), CanonError> {
    members.clear();
    Parser::pooled(text, max_depth).document(Some(members))?;
    Ok(())
}

/// Digest of a whole JSON document (any top-level value). Errors: any [`CanonErrorKind`]
/// except `InvalidUtf8` and `NotAnObject`. `max_depth` bounds container nesting (the
/// top-level value is depth 1; `[[1]]` has depth 2; scalars never add depth).
pub(crate) fn digest(text: &str, max_depth: usize) -> Result<Digest, CanonError> {
    Parser::pooled(text, max_depth)
        .document(None)
        .map(|(_, d)| Digest(d))
}

/// Returns `Some(v)` only for a plain integer literal: ASCII digits only, no sign, fraction,
/// exponent or surrounding whitespace, no leading zero (except `"0"` itself), value within
/// `u64`. Everything else is `None`, e.g. `"-0"`, `"10.0"`, `"1e1"`, `"01"`,
/// `"18446744073709551616"`.
pub(crate) fn is_unsigned_integer_literal(raw: &str) -> Option<u64> {
    let bytes = raw.as_bytes();
    let plain = !bytes.is_empty() && bytes.iter().all(u8::is_ascii_digit);
    if !plain || (bytes.len() > 1 && bytes[0] == b'0') {
        return None;
    }
    raw.parse().ok() // digits only, so `parse` cannot see a `+`; it rejects overflow
}

/// Decodes the source text of one JSON string literal, quotes included, into its value:
/// borrowed when the literal has no escapes, owned otherwise. `None` if `raw` is not exactly
/// one valid string literal (no surrounding whitespace allowed).
pub(crate) fn decode_string(raw: &str) -> Option<Cow<'_, str>> {
    let mut p = Parser::new(raw, 0);
    if p.peek() != Some(b'"') {
        return None;
    }
    let plain = p.string().ok()?;
    if p.pos != raw.len() {
        return None;
    }
    Some(plain.map_or_else(
        || Cow::Owned(std::mem::take(&mut p.string_buf)),
        Cow::Borrowed,
    ))
}

/// Empties `v` and returns its allocation as a vector of `U`, an element type of the same
/// size and alignment (in practice the same type with another lifetime), so that a buffer
/// whose elements borrowed one input can be kept for the next. The allocation is reused
/// through std's in-place `collect`; were that ever not to apply, the result is simply a
/// new empty vector (the next use allocates again, nothing else changes).
pub(crate) fn recycle<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter()
        .map(|_| unreachable!("the vector is empty"))
        .collect()
}

/// Re-encodes a valid JSON document compactly: insignificant whitespace removed, everything
/// else (key order, escapes, number literals) kept byte for byte. This is a lexical pass: it
/// does not validate, and for invalid input the result is unspecified (but it never panics).
pub(crate) fn compact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let (mut in_string, mut escaped, mut copied) = (false, false, 0);
    for (i, &b) in text.as_bytes().iter().enumerate() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else if b == b'"' {
            in_string = true;
        } else if is_whitespace(b) {
            // `copied` and `i` are 0, the length, or next to ASCII bytes: char boundaries.
            out.push_str(&text[copied..i]);
            copied = i + 1;
        }
    }
    out.push_str(&text[copied..]);
    out
}

/// Checks that `bytes` is UTF-8; `InvalidUtf8` at the offset of the first invalid byte.
pub(crate) fn from_utf8(bytes: &[u8]) -> Result<&str, CanonError> {
    std::str::from_utf8(bytes).map_err(|e| CanonError {
        kind: CanonErrorKind::InvalidUtf8,
        offset: e.valid_up_to(),
    })
}

/// Exponent literals longer than this are rejected, so exponents always fit an i128.
const MAX_EXPONENT_DIGITS: usize = 30;
/// Objects with more members than this check duplicates with a hash set instead of a scan.
const SMALL_OBJECT: usize = 16;
const BOM: &[u8] = b"\xEF\xBB\xBF";

// Type tags, used as XXH3 seeds so that values of different types never share an encoding.
const TAG_NULL: u64 = 1;
const TAG_FALSE: u64 = 2;
const TAG_TRUE: u64 = 3;
const TAG_NUMBER: u64 = 4;
const TAG_STRING: u64 = 5;
const TAG_ARRAY: u64 = 6;
const TAG_OBJECT: u64 = 7;
const TAG_MEMBER: u64 = 8;
/// Not a JSON type: the instant an envelope's `occurred_at` names
/// ([`instant_digest`]); its own seed keeps it apart from every JSON value's
/// digest, the string's in particular.
const TAG_INSTANT: u64 = 9;

/// The digest of the JSON string whose decoded value is `s`: what any literal
/// spelling `s` digests to.
pub(crate) fn string_digest(s: &str) -> Digest {
    Digest(xxh3_128_with_seed(s.as_bytes(), TAG_STRING))
}

/// The digest of an instant: `secs` since the Unix epoch (UTC), `nanos`
/// within that second, and whether it was a leap second. Never equal to a
/// JSON value's digest (its own seed), so a text that is not a timestamp
/// cannot stand in for one.
pub(crate) fn instant_digest(secs: i64, nanos: u32, leap_second: bool) -> Digest {
    let mut input = [0u8; 13];
    input[..8].copy_from_slice(&secs.to_le_bytes());
    input[8..12].copy_from_slice(&nanos.to_le_bytes());
    input[12] = u8::from(leap_second);
    Digest(xxh3_128_with_seed(&input, TAG_INSTANT))
}

// `Syntax` error descriptions.
const EXPECTED_VALUE: &str = "expected a JSON value";
const EXPECTED_KEY: &str = "expected '\"' to start an object key";
const EXPECTED_COLON: &str = "expected ':' after object key";
const AFTER_MEMBER: &str = "expected ',' or '}' after object member";
const AFTER_ELEMENT: &str = "expected ',' or ']' after array element";
const UNTERMINATED: &str = "unterminated string";
const INVALID_LITERAL: &str = "invalid literal";
const EXPECTED_DIGIT: &str = "expected digit";
const EXPECTED_FRACTION: &str = "expected digit after decimal point";
const EXPECTED_EXPONENT: &str = "expected digit in exponent";

fn is_whitespace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// Whether `b` ends the plain run of a string literal: a quote, a backslash or a control
/// character (which is an error there).
fn is_string_special(b: u8) -> bool {
    b == b'"' || b == b'\\' || b < 0x20
}

/// The position of the first byte at or after `pos` for which [`is_string_special`] holds (or
/// the end of `bytes`). Reads eight bytes at a time: most of a body is string content, and a
/// byte-at-a-time loop was the parser's largest cost.
fn skip_plain_string_bytes(bytes: &[u8], mut pos: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // The classic "has less" bit trick: sets the high bit of every byte of `w` below `n`
    // (n <= 0x80), and possibly of bytes above such a byte (a borrow), never below one. With
    // `w ^ (ONES * b)` and n = 1 it flags bytes equal to `b`.
    let has_less = |w: u64, n: u64| w.wrapping_sub(ONES * n) & !w & HIGHS;
    let mut words = bytes.get(pos..).unwrap_or_default().chunks_exact(8);
    for word in &mut words {
        let Ok(word) = <[u8; 8]>::try_from(word) else {
            break;
        };
        let w = u64::from_le_bytes(word);
        let special = has_less(w, 0x20)
            | has_less(w ^ (ONES * u64::from(b'"')), 1)
            | has_less(w ^ (ONES * u64::from(b'\\')), 1);
        if special != 0 {
            // Little-endian: the lowest flagged byte comes first, and it is exact (a wrong
            // flag can only sit above a right one).
            return pos + (special.trailing_zeros() / 8) as usize;
        }
        pos += 8;
    }
    while bytes.get(pos).is_some_and(|&b| !is_string_special(b)) {
        pos += 1;
    }
    pos
}

type Parsed<T> = Result<T, CanonError>;

/// The parser's growable buffers, kept per thread between documents ([`Parser::pooled`]):
/// allocating and growing them afresh for every body was about a tenth of the engine's
/// instructions. Each is emptied before reuse; none carries anything from one document to
/// the next.
struct Scratch {
    /// See [`Parser::hash_buf`].
    hash_buf: Vec<u8>,
    /// See [`Parser::string_buf`].
    string_buf: String,
    /// See [`Parser::digests`].
    digests: Vec<u128>,
    /// See [`Parser::keys`]; `'static` only while parked (always empty then).
    keys: Vec<Cow<'static, str>>,
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch::EMPTY
    }
}

impl Scratch {
    const EMPTY: Scratch = Scratch {
        hash_buf: Vec::new(),
        string_buf: String::new(),
        digests: Vec::new(),
        keys: Vec::new(),
    };
}

/// Buffers bigger than this many bytes are not kept after a document, so one huge body does
/// not pin its memory in every thread that parsed it.
const SCRATCH_KEEP_BYTES: usize = 64 * 1024;

thread_local! {
    /// This thread's parked [`Scratch`]; a `Cell` that a parser empties while it runs (a
    /// nested or re-entrant parse finds it empty and allocates its own buffers).
    static SCRATCH: Cell<Scratch> = const { Cell::new(Scratch::EMPTY) };
}

/// Recursive-descent parser state. Scratch buffers are shared by all nesting levels:
/// `digests` and `keys` are stacks where each open container owns the tail it pushed.
struct Parser<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
    depth: usize,
    max_depth: usize,
    /// Hash input being assembled (numbers, members, container summaries).
    hash_buf: Vec<u8>,
    /// Decoded value of the last string literal that contained escapes.
    string_buf: String,
    /// Child digests of the open containers.
    digests: Vec<u128>,
    /// Keys of the open objects that are still small enough for linear duplicate checks.
    keys: Vec<Cow<'a, str>>,
    /// Whether the buffers came from this thread's [`SCRATCH`] and go back there on drop.
    pooled: bool,
    /// Whether the last string value parsed had no escapes (see [`Member::plain`]).
    last_string_plain: bool,
}

impl<'a> Parser<'a> {
    /// A parser with empty buffers of its own (for short literals: nothing to reuse).
    fn new(text: &'a str, max_depth: usize) -> Self {
        Self::with(text, max_depth, Scratch::default(), false)
    }

    /// A parser that borrows this thread's scratch buffers and returns them when dropped.
    fn pooled(text: &'a str, max_depth: usize) -> Self {
        Self::with(text, max_depth, SCRATCH.with(Cell::take), true)
    }

    fn with(text: &'a str, max_depth: usize, scratch: Scratch, pooled: bool) -> Self {
        Parser {
            text,
            bytes: text.as_bytes(),
            pos: 0,
            depth: 0,
            max_depth,
            hash_buf: scratch.hash_buf,
            string_buf: scratch.string_buf,
            digests: scratch.digests,
            keys: scratch.keys,
            pooled,
            last_string_plain: false,
        }
    }

    fn error<T>(&self, offset: usize, kind: CanonErrorKind) -> Parsed<T> {
        // A stray byte-order mark is named as such, wherever the grammar
        // tripped over it (only on the error path: no cost otherwise).
        let misplaced_bom = matches!(
            kind,
            CanonErrorKind::Syntax(_) | CanonErrorKind::TrailingCharacters
        ) && self
            .bytes
            .get(offset..)
            .is_some_and(|rest| rest.starts_with(BOM));
        let kind = if misplaced_bom {
            CanonErrorKind::ByteOrderMark
        } else {
            kind
        };
        Err(CanonError { kind, offset })
    }

    fn syntax<T>(&self, what: &'static str) -> Parsed<T> {
        self.error(self.pos, CanonErrorKind::Syntax(what))
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn eat(&mut self, b: u8) -> bool {
        let hit = self.peek() == Some(b);
        self.pos += usize::from(hit);
        hit
    }

    fn skip_whitespace(&mut self) {
        while self.peek().is_some_and(is_whitespace) {
            self.pos += 1;
        }
    }

    fn skip_digits(&mut self) -> &'a [u8] {
        let start = self.pos;
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.pos += 1;
        }
        &self.bytes[start..self.pos]
    }

    /// Parses the whole input as one value surrounded by optional whitespace, after one
    /// optional leading byte-order mark. With `members`, the value must be an object whose
    /// members are collected.
    fn document(&mut self, members: Option<&mut Vec<Member<'a>>>) -> Parsed<(Kind, u128)> {
        // RFC 8259 §8.1 lets a parser ignore one leading byte-order mark; a
        // second one, or one anywhere else outside a string, is an error.
        if self.bytes.starts_with(BOM) {
            self.pos = BOM.len();
        }
        self.skip_whitespace();
        let start = self.pos;
        if start == self.bytes.len() {
            return self.error(start, CanonErrorKind::Empty);
        }
        let want_object = members.is_some();
        let (kind, digest) = match members {
            Some(members) if self.peek() == Some(b'{') => {
                (Kind::Object, self.object(Some(members))?)
            }
            _ => self.value()?,
        };
        self.skip_whitespace();
        if self.pos != self.bytes.len() {
            return self.error(self.pos, CanonErrorKind::TrailingCharacters);
        }
        if want_object && kind != Kind::Object {
            return self.error(start, CanonErrorKind::NotAnObject { found: kind });
        }
        Ok((kind, digest))
    }

    /// Parses one value after optional leading whitespace; returns its kind and digest.
    /// (Recursive: containers come back here, so this and `array`/`object` keep their stack
    /// frames small and leave all non-recursive work to helpers.)
    fn value(&mut self) -> Parsed<(Kind, u128)> {
        self.skip_whitespace();
        match self.peek() {
            Some(b'{') => self.object(None).map(|d| (Kind::Object, d)),
            Some(b'[') => self.array().map(|d| (Kind::Array, d)),
            Some(b'"') => self.string_value().map(|d| (Kind::String, d)),
            Some(b'-' | b'0'..=b'9') => self.number().map(|d| (Kind::Number, d)),
            Some(b't') => self.literal(b"true", Kind::Bool, TAG_TRUE),
            Some(b'f') => self.literal(b"false", Kind::Bool, TAG_FALSE),
            Some(b'n') => self.literal(b"null", Kind::Null, TAG_NULL),
            _ => self.syntax(EXPECTED_VALUE),
        }
    }

    fn string_value(&mut self) -> Parsed<u128> {
        let plain = self.string()?;
        self.last_string_plain = plain.is_some();
        let decoded = plain.unwrap_or(self.string_buf.as_str());
        Ok(string_digest(decoded).0)
    }

    fn literal(&mut self, word: &[u8], kind: Kind, tag: u64) -> Parsed<(Kind, u128)> {
        if !self.bytes[self.pos..].starts_with(word) {
            return self.syntax(INVALID_LITERAL);
        }
        self.pos += word.len();
        Ok((kind, xxh3_128_with_seed(&[], tag)))
    }

    /// Consumes an opening bracket, enforcing `max_depth` before any recursion happens.
    fn enter(&mut self) -> Parsed<()> {
        if self.depth == self.max_depth {
            let max_depth = self.max_depth;
            return self.error(self.pos, CanonErrorKind::TooDeep { max_depth });
        }
        self.depth += 1;
        self.pos += 1;
        Ok(())
    }

    /// Pops the child digests pushed since `base` and hashes `count || digests` under `tag`.
    fn close(&mut self, tag: u64, base: usize, sorted: bool) -> u128 {
        let children = &mut self.digests[base..];
        if sorted {
            children.sort_unstable();
        }
        self.hash_buf.clear();
        self.hash_buf
            .extend_from_slice(&(children.len() as u64).to_le_bytes());
        for child in children.iter() {
            self.hash_buf.extend_from_slice(&child.to_le_bytes());
        }
        self.digests.truncate(base);
        self.depth -= 1;
        xxh3_128_with_seed(&self.hash_buf, tag)
    }

    fn array(&mut self) -> Parsed<u128> {
        self.enter()?;
        let base = self.digests.len();
        self.skip_whitespace();
        let mut done = self.eat(b']');
        while !done {
            let (_, element) = self.value()?;
            self.digests.push(element);
            done = self.separator(b']', AFTER_ELEMENT)?;
        }
        Ok(self.close(TAG_ARRAY, base, false))
    }

    fn object(&mut self, mut members: Option<&mut Vec<Member<'a>>>) -> Parsed<u128> {
        self.enter()?;
        let base = self.digests.len();
        let key_base = self.keys.len();
        let mut large_keys = None;
        self.skip_whitespace();
        let mut done = self.eat(b'}');
        while !done {
            let key = self.member_key(key_base, &mut large_keys)?;
            let value_at = self.pos;
            let (kind, value) = self.value()?;
            self.member(key, value_at, kind, value, members.as_deref_mut());
            done = self.separator(b'}', AFTER_MEMBER)?;
        }
        self.keys.truncate(key_base);
        Ok(self.close(TAG_OBJECT, base, true))
    }

    /// After an element or member: consumes `,` (returns false) or `close` (returns true).
    fn separator(&mut self, close: u8, expected: &'static str) -> Parsed<bool> {
        self.skip_whitespace();
        if self.eat(close) {
            return Ok(true);
        }
        if !self.eat(b',') {
            return self.syntax(expected);
        }
        Ok(false)
    }

    /// Parses `"key" :` and the whitespace around it, checks the key is new, and returns it decoded.
    fn member_key(
        &mut self,
        key_base: usize,
        large_keys: &mut Option<HashSet<Cow<'a, str>>>,
    ) -> Parsed<Cow<'a, str>> {
        self.skip_whitespace();
        let key_at = self.pos;
        if self.peek() != Some(b'"') {
            return self.syntax(EXPECTED_KEY);
        }
        let key = match self.string()? {
            Some(plain) => Cow::Borrowed(plain),
            None => Cow::Owned(self.string_buf.clone()),
        };
        self.remember_key(key.clone(), key_at, key_base, large_keys)?;
        self.skip_whitespace();
        if !self.eat(b':') {
            return self.syntax(EXPECTED_COLON);
        }
        self.skip_whitespace(); // so that the value's `raw` text starts at `pos`
        Ok(key)
    }

    /// Pushes the member digest (decoded key length, key bytes, value digest) and, when
    /// collecting top-level members, the member itself. The value ends at `pos`.
    fn member(
        &mut self,
        key: Cow<'a, str>,
        value_at: usize,
        kind: Kind,
        value: u128,
        members: Option<&mut Vec<Member<'a>>>,
    ) {
        self.hash_buf.clear();
        self.hash_buf
            .extend_from_slice(&(key.len() as u64).to_le_bytes());
        self.hash_buf.extend_from_slice(key.as_bytes());
        self.hash_buf.extend_from_slice(&value.to_le_bytes());
        self.digests
            .push(xxh3_128_with_seed(&self.hash_buf, TAG_MEMBER));
        if let Some(members) = members {
            // A valid value starts and ends with an ASCII byte: char boundaries.
            let raw = &self.text[value_at..self.pos];
            let digest = Digest(value);
            members.push(Member {
                key,
                raw,
                kind,
                digest,
                plain: kind == Kind::String && self.last_string_plain,
            });
        }
    }

    /// Records `key` for the object whose keys start at `key_base`, failing if it is already
    /// there. Small objects scan the shared `keys` stack; past `SMALL_OBJECT` keys, the
    /// object's keys move into its own hash set so large objects stay linear time.
    fn remember_key(
        &mut self,
        key: Cow<'a, str>,
        at: usize,
        key_base: usize,
        large_keys: &mut Option<HashSet<Cow<'a, str>>>,
    ) -> Parsed<()> {
        let known = match large_keys {
            Some(set) => set.contains(&key),
            None => self.keys[key_base..].contains(&key),
        };
        if known {
            let key = key.into_owned();
            return self.error(at, CanonErrorKind::DuplicateKey { key });
        }
        match large_keys {
            Some(set) => {
                set.insert(key);
            }
            None => {
                self.keys.push(key);
                if self.keys.len() - key_base > SMALL_OBJECT {
                    *large_keys = Some(self.keys.drain(key_base..).collect());
                }
            }
        }
        Ok(())
    }

    /// Parses the string literal whose opening quote is at `pos`. Returns the raw content
    /// when it has no escapes (no allocation); otherwise decodes it into `string_buf` and
    /// returns `None`.
    fn string(&mut self) -> Parsed<Option<&'a str>> {
        let text = self.text;
        self.pos += 1;
        let start = self.pos;
        let mut copied = start; // raw bytes before this are already in `string_buf`
        let mut escaped = false;
        loop {
            self.pos = skip_plain_string_bytes(self.bytes, self.pos);
            match self.peek() {
                None => return self.syntax(UNTERMINATED),
                Some(b'"') => break,
                Some(b'\\') => {
                    if !escaped {
                        self.string_buf.clear();
                        escaped = true;
                    }
                    // Slice ends are quotes, backslashes or escape ends: all ASCII.
                    self.string_buf.push_str(&text[copied..self.pos]);
                    self.escape()?;
                    copied = self.pos;
                }
                Some(0x00..=0x1F) => {
                    return self.error(self.pos, CanonErrorKind::ControlCharacterInString)
                }
                Some(_) => self.pos += 1,
            }
        }
        let end = self.pos;
        self.pos += 1;
        if escaped {
            self.string_buf.push_str(&text[copied..end]);
            return Ok(None);
        }
        Ok(Some(&text[start..end]))
    }

    /// Decodes the escape whose backslash is at `pos` into `string_buf`.
    fn escape(&mut self) -> Parsed<()> {
        let at = self.pos;
        let (c, len) = match self.bytes.get(at + 1) {
            Some(b'"') => ('"', 2),
            Some(b'\\') => ('\\', 2),
            Some(b'/') => ('/', 2),
            Some(b'b') => ('\u{8}', 2),
            Some(b'f') => ('\u{c}', 2),
            Some(b'n') => ('\n', 2),
            Some(b'r') => ('\r', 2),
            Some(b't') => ('\t', 2),
            Some(b'u') => {
                let unit = self.hex4(at + 2)?;
                let (code, len) = match unit {
                    // UTF-16: a high surrogate must be immediately followed by a `\u` escape
                    // holding a low surrogate; together they encode one astral code point.
                    0xD800..=0xDBFF => {
                        if self.bytes.get(at + 6..at + 8) != Some(b"\\u") {
                            return self.error(at, CanonErrorKind::LoneSurrogate);
                        }
                        let low = self.hex4(at + 8)?;
                        if !(0xDC00..=0xDFFF).contains(&low) {
                            return self.error(at, CanonErrorKind::LoneSurrogate);
                        }
                        (0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00), 12)
                    }
                    0xDC00..=0xDFFF => return self.error(at, CanonErrorKind::LoneSurrogate),
                    _ => (unit, 6),
                };
                match char::from_u32(code) {
                    Some(c) => (c, len),
                    None => return self.error(at, CanonErrorKind::LoneSurrogate), // unreachable
                }
            }
            _ => return self.error(at, CanonErrorKind::InvalidEscape),
        };
        self.string_buf.push(c);
        self.pos = at + len;
        Ok(())
    }

    /// Reads the four hex digits at `at`; `InvalidEscape` at the escape's backslash if not.
    fn hex4(&self, at: usize) -> Parsed<u32> {
        let digits = self.bytes.get(at..at + 4).unwrap_or_default();
        let value = digits.iter().try_fold(0, |acc, &b| {
            char::from(b).to_digit(16).map(|d| acc * 16 + d)
        });
        match value {
            Some(value) if digits.len() == 4 => Ok(value),
            _ => self.error(at - 2, CanonErrorKind::InvalidEscape),
        }
    }

    /// Parses `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?` and hashes its exact
    /// value as (sign, significant digits without leading/trailing zeros, exponent), with
    /// value = sign * digits * 10^exponent. Zero is always `+`, no digits, exponent 0.
    fn number(&mut self) -> Parsed<u128> {
        let negative = self.eat(b'-');
        let int_digits = match self.peek() {
            Some(b'0') => {
                self.pos += 1;
                if self.peek().is_some_and(|b| b.is_ascii_digit()) {
                    return self.error(self.pos - 1, CanonErrorKind::LeadingZero);
                }
                &b"0"[..]
            }
            Some(b'1'..=b'9') => self.skip_digits(),
            _ => return self.syntax(EXPECTED_DIGIT),
        };
        let mut frac_digits: &[u8] = &[];
        if self.eat(b'.') {
            frac_digits = self.skip_digits();
            if frac_digits.is_empty() {
                return self.syntax(EXPECTED_FRACTION);
            }
        }
        let mut exponent: i128 = 0;
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.pos += 1;
            let negative_exponent = self.eat(b'-');
            if !negative_exponent {
                self.eat(b'+');
            }
            let digits_at = self.pos;
            let digits = self.skip_digits();
            if digits.is_empty() {
                return self.syntax(EXPECTED_EXPONENT);
            }
            if digits.len() > MAX_EXPONENT_DIGITS {
                return self.error(digits_at, CanonErrorKind::ExponentOutOfRange);
            }
            exponent = digits
                .iter()
                .fold(0, |acc, d| acc * 10 + i128::from(d - b'0'));
            if negative_exponent {
                exponent = -exponent;
            }
        }
        // Bounds: |exponent| < 10^30 and digit counts < 2^64, so nothing here overflows i128.
        let all = int_digits.iter().chain(frac_digits);
        let total = int_digits.len() + frac_digits.len();
        let leading = all.clone().take_while(|&&d| d == b'0').count();
        let is_zero = leading == total;
        let trailing = if is_zero {
            0
        } else {
            all.clone().rev().take_while(|&&d| d == b'0').count()
        };
        let exponent = if is_zero {
            0
        } else {
            exponent - frac_digits.len() as i128 + trailing as i128
        };
        self.hash_buf.clear();
        self.hash_buf
            .push(if negative && !is_zero { b'-' } else { b'+' });
        self.hash_buf.extend_from_slice(&exponent.to_le_bytes()); // fixed width: unambiguous
        self.hash_buf
            .extend(all.skip(leading).take(total - leading - trailing));
        Ok(xxh3_128_with_seed(&self.hash_buf, TAG_NUMBER))
    }
}

impl Drop for Parser<'_> {
    fn drop(&mut self) {
        if !self.pooled {
            return;
        }
        let keep = |bytes: usize| bytes <= SCRATCH_KEEP_BYTES;
        let mut scratch = Scratch::EMPTY;
        if keep(self.hash_buf.capacity()) {
            scratch.hash_buf = std::mem::take(&mut self.hash_buf);
            scratch.hash_buf.clear();
        }
        if keep(self.string_buf.capacity()) {
            scratch.string_buf = std::mem::take(&mut self.string_buf);
            scratch.string_buf.clear();
        }
        if keep(self.digests.capacity() * size_of::<u128>()) {
            scratch.digests = std::mem::take(&mut self.digests);
            scratch.digests.clear();
        }
        if keep(self.keys.capacity() * size_of::<Cow<'_, str>>()) {
            scratch.keys = recycle(std::mem::take(&mut self.keys));
        }
        SCRATCH.with(|s| s.set(scratch));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::fmt::Write as _;
    use CanonErrorKind::*;

    fn dg(text: &str) -> Digest {
        digest(text, 64).unwrap_or_else(|e| panic!("{text:?}: {e}"))
    }

    fn fails(text: &str, max_depth: usize) -> (CanonErrorKind, usize) {
        let e = digest(text, max_depth).expect_err(text);
        (e.kind, e.offset)
    }

    /// Each group holds spellings of one value; every group is a different value.
    const GROUPS: &[&[&str]] = &[
        &[
            r#"{"a":1,"b":[true,null]}"#,
            " { \"b\" : [ true ,\tnull ] ,\r\n\"a\":1 } ",
            // One leading byte-order mark is ignored (RFC 8259 §8.1).
            "\u{feff}{\"a\":1,\"b\":[true,null]}",
            "\u{feff} {\"b\":[true,null],\"a\":1}",
        ],
        // Inside a string U+FEFF is a character like any other.
        &["\"\u{feff}x\"", r#""\ufeffx""#, "\u{feff}\"\u{feff}x\""],
        &["\"x\"", "\u{feff}\"x\""],
        &[r#""\u00e9""#, "\"é\"", r#""\u00E9""#],
        &[r#""e\u0301""#, "\"e\u{301}\""],
        &[r#""\/""#, r#""/""#, r#""\u002f""#],
        &[r#""\ud83d\ude00""#, "\"😀\"", r#""\uD83D\uDE00""#],
        &[
            "1", "1.0", "1e0", "10e-1", "0.1e1", "100E-2", "1E+0", "0.001e3",
        ],
        &["-0", "0", "0.0", "-0e5", "0E-7", "-0.000"],
        &["9007199254740993"],
        &["9007199254740992", "9.007199254740992e15"],
        &["0.1", "1e-1", "0.10"],
        &["0.10000000000000001"],
        &["1e400", "10e399", "0.1e401"],
        &["1e401"],
        &["-1", "-1.00", "-10E-1"],
        &["10", "1e1", "1.0E+1"],
        &["[1,2]", "[ 1 , 2.0 ]"],
        &["[2,1]"],
        &["[[1],2]"],
        &["[1,[2]]"],
        &[r#"{"a":null}"#],
        &["{}", "{ }"],
        &["[]", "[ ]"],
        &["[[]]"],
        &["[{}]"],
        &[r#""1""#],
        &["true"],
        &[r#""true""#],
        &["false"],
        &["null"],
        &[r#""null""#],
        &[r#""""#],
        &[r#"["a","b"]"#],
        &[r#"["ab"]"#],
        &[r#"{"a":1,"b":2}"#, r#"{"b":2,"a":1}"#],
        &[r#"{"a":2,"b":1}"#],
        &[r#"{"a":"b"}"#],
        &[r#"{"b":"a"}"#],
        &[r#"{"ab":""}"#],
        &[
            r#"{"x":{"y":{"a":1,"b":[2,{"c":3,"d":4}]},"z":0}}"#,
            r#"{"x":{"z":0e3,"y":{"b":[2,{"d":4,"c":3}],"a":1}}}"#,
        ],
        &[r#"{"x":{"y":{"a":1,"b":[2,{"c":3,"d":5}]},"z":0}}"#],
    ];

    #[test]
    fn equal_spellings_have_equal_digests_and_different_values_differ() {
        let mut seen = Vec::new();
        for group in GROUPS {
            let first = dg(group[0]);
            for text in &group[1..] {
                assert_eq!(dg(text), first, "{text} vs {}", group[0]);
            }
            assert!(
                !seen.contains(&first),
                "{} collides with an earlier group",
                group[0]
            );
            seen.push(first);
        }
    }

    #[test]
    fn error_kinds_and_offsets() {
        let long_exp = format!("1e{}", "1".repeat(31));
        let ok_exp = format!("[1e-{},0]", "9".repeat(30));
        assert!(digest(&ok_exp, 4).is_ok());
        let cases: &[(&str, CanonErrorKind, usize)] = &[
            ("", Empty, 0),
            (" \t\r\n", Empty, 4),
            // One leading byte-order mark is ignored; any other outside a string is named.
            ("\u{feff}", Empty, 3),
            ("\u{feff} \n", Empty, 5),
            ("\u{feff}\u{feff}{}", ByteOrderMark, 3),
            (" \u{feff}{}", ByteOrderMark, 1),
            ("{}\u{feff}", ByteOrderMark, 2),
            ("{} \u{feff}", ByteOrderMark, 3),
            ("{\u{feff}\"a\":1}", ByteOrderMark, 1),
            ("{\"a\"\u{feff}:1}", ByteOrderMark, 4),
            ("{\"a\":\u{feff}1}", ByteOrderMark, 5),
            ("{\"a\":1\u{feff}}", ByteOrderMark, 6),
            ("[1\u{feff}]", ByteOrderMark, 2),
            // A byte-order mark's first byte alone is not one.
            ("\u{fef0}{}", Syntax(EXPECTED_VALUE), 0),
            (r#"{"a" 1}"#, Syntax(EXPECTED_COLON), 5),
            ("[1,]", Syntax(EXPECTED_VALUE), 3),
            (r#"{"a":1,}"#, Syntax(EXPECTED_KEY), 7),
            (r#"{"a":1 "b":2}"#, Syntax(AFTER_MEMBER), 7),
            ("[1 2]", Syntax(AFTER_ELEMENT), 3),
            ("'a'", Syntax(EXPECTED_VALUE), 0),
            ("{'a':1}", Syntax(EXPECTED_KEY), 1),
            ("/* c */ 1", Syntax(EXPECTED_VALUE), 0),
            ("[1] // c", TrailingCharacters, 4),
            ("+1", Syntax(EXPECTED_VALUE), 0),
            (".5", Syntax(EXPECTED_VALUE), 0),
            ("1.", Syntax(EXPECTED_FRACTION), 2),
            ("1.e3", Syntax(EXPECTED_FRACTION), 2),
            ("-", Syntax(EXPECTED_DIGIT), 1),
            ("NaN", Syntax(EXPECTED_VALUE), 0),
            ("-Infinity", Syntax(EXPECTED_DIGIT), 1),
            ("tru", Syntax(INVALID_LITERAL), 0),
            ("nul", Syntax(INVALID_LITERAL), 0),
            ("\"abc", Syntax(UNTERMINATED), 4),
            ("[\u{0}]", Syntax(EXPECTED_VALUE), 1),
            ("01", LeadingZero, 0),
            ("[-00.5]", LeadingZero, 2),
            ("1e", Syntax(EXPECTED_EXPONENT), 2),
            ("1e+", Syntax(EXPECTED_EXPONENT), 3),
            (&long_exp, ExponentOutOfRange, 2),
            ("\"a\u{0}\"", ControlCharacterInString, 2),
            ("\"a\u{1f}\"", ControlCharacterInString, 2),
            ("\"a\nb\"", ControlCharacterInString, 2),
            (r#""\x""#, InvalidEscape, 1),
            (r#""\U0041""#, InvalidEscape, 1),
            (r#""ab\u12G4""#, InvalidEscape, 3),
            (r#""\u12""#, InvalidEscape, 1),
            (r#""\ud800\u12""#, InvalidEscape, 7),
            (r#""\ud800""#, LoneSurrogate, 1),
            (r#""\udc00""#, LoneSurrogate, 1),
            (r#""x\ud800\u0041""#, LoneSurrogate, 2),
            (r#""\ud800\ud800""#, LoneSurrogate, 1),
            (r#""\ud800\n""#, LoneSurrogate, 1),
            ("{} x", TrailingCharacters, 3),
            ("1 2", TrailingCharacters, 2),
            ("truex", TrailingCharacters, 4),
            (r#"{"a":1,"a":2}"#, DuplicateKey { key: "a".into() }, 7),
            (
                r#"{"x":{"k":1,"k":1}}"#,
                DuplicateKey { key: "k".into() },
                12,
            ),
            (r#"{"a":1,"\u0061":2}"#, DuplicateKey { key: "a".into() }, 7),
            (
                r#"[{"é":1,"\u00e9":[}]"#,
                DuplicateKey { key: "é".into() },
                9,
            ),
        ];
        for (text, kind, offset) in cases {
            assert_eq!(fails(text, 64), (kind.clone(), *offset), "{text:?}");
        }
        assert_eq!(fails("[[1]]", 1), (TooDeep { max_depth: 1 }, 1));
        assert_eq!(fails(r#"{"a":{}}"#, 1), (TooDeep { max_depth: 1 }, 5));
        assert_eq!(fails("[]", 0), (TooDeep { max_depth: 0 }, 0));
        assert!(digest("[[1]]", 2).is_ok() && digest("\"s\"", 0).is_ok());
        let not_object = |text| {
            parse_object(text, 8)
                .map(|_| ())
                .map_err(|e| (e.kind, e.offset))
        };
        assert_eq!(
            not_object(" [1]"),
            Err((NotAnObject { found: Kind::Array }, 1))
        );
        assert_eq!(
            not_object("null"),
            Err((NotAnObject { found: Kind::Null }, 0))
        );
        assert_eq!(not_object("[1,"), Err((Syntax(EXPECTED_VALUE), 3)));
        assert_eq!(
            not_object(r#"{"a":1,"a":1}"#),
            Err((DuplicateKey { key: "a".into() }, 7))
        );
        assert_eq!(
            from_utf8(b"ab\xffc"),
            Err(CanonError {
                kind: InvalidUtf8,
                offset: 2
            })
        );
        assert_eq!(from_utf8("é".as_bytes()), Ok("é"));
        let e = digest(r#"{"a":1,"a":2}"#, 8).unwrap_err();
        assert_eq!(e.to_string(), "duplicate key \"a\" at byte 7");
        assert_eq!(fails("[[1]]", 1).0, TooDeep { max_depth: 1 });
        let e = digest("[[1]]", 1).unwrap_err();
        assert_eq!(e.to_string(), "nesting deeper than max_depth 1 at byte 1");
    }

    #[test]
    fn parse_object_returns_members_in_source_order() {
        let text = "{ \"b\" : [1, 2] , \"\\u0061\":\"x\\n\" ,\"c\":-0.0,\"d\":{\"e\":null}}";
        let members = parse_object(text, 2).unwrap();
        let got: Vec<_> = members
            .iter()
            .map(|m| (m.key.as_ref(), m.raw, m.kind))
            .collect();
        assert_eq!(
            got,
            [
                ("b", "[1, 2]", Kind::Array),
                ("a", r#""x\n""#, Kind::String),
                ("c", "-0.0", Kind::Number),
                ("d", r#"{"e":null}"#, Kind::Object),
            ]
        );
        assert!(matches!(members[0].key, Cow::Borrowed(_)));
        assert!(matches!(members[1].key, Cow::Owned(_)));
        assert_eq!(members[2].digest, dg("0"));
        for m in &members {
            assert_eq!(m.digest, dg(m.raw));
            let decoded = (m.kind == Kind::String).then(|| decode_string(m.raw));
            assert_eq!(m.string(), decoded.flatten());
        }
        assert_eq!(members[1].string().as_deref(), Some("x\n"));
        let plain = parse_object(r#"{"k":"v w","n":"a\"b","e":""}"#, 1).unwrap();
        assert!(matches!(plain[0].string(), Some(Cow::Borrowed("v w"))));
        assert_eq!(plain[1].string().as_deref(), Some("a\"b"));
        assert!(matches!(plain[2].string(), Some(Cow::Borrowed(""))));
        assert!(parse_object(" {} ", 1).unwrap().is_empty());
        assert_eq!(
            parse_object(text, 1).unwrap_err().kind,
            TooDeep { max_depth: 1 }
        );
    }

    #[test]
    fn unsigned_integer_literals() {
        assert_eq!(is_unsigned_integer_literal("0"), Some(0));
        assert_eq!(is_unsigned_integer_literal("12"), Some(12));
        assert_eq!(
            is_unsigned_integer_literal("18446744073709551615"),
            Some(u64::MAX)
        );
        assert_eq!(is_unsigned_integer_literal("18446744073709551616"), None);
        for raw in [
            "-1", "-0", "10.0", "1e1", "01", " 1", "1 ", "\"1\"", "+1", "",
        ] {
            assert_eq!(is_unsigned_integer_literal(raw), None, "{raw:?}");
        }
    }

    #[test]
    fn decode_string_and_compact() {
        assert_eq!(decode_string(r#""abc""#), Some(Cow::Borrowed("abc")));
        assert_eq!(
            decode_string(r#""a\u00e9\ud83d\ude00\/\"\\\b\f\n\r\t""#).unwrap(),
            "aé😀/\"\\\u{8}\u{c}\n\r\t"
        );
        assert_eq!(decode_string(r#""\ud800""#), None);
        for raw in ["abc", "\"a\" ", " \"a\"", "\"a", "\"\u{1}\"", "\"a\"\"", ""] {
            assert_eq!(decode_string(raw), None, "{raw:?}");
        }
        let text = " {\n \"a b\" : [ 1.50 , \"x \\\" \\t y\" ,\ttrue ] ,\r\"c\":{ } } ";
        assert_eq!(compact(text), r#"{"a b":[1.50,"x \" \t y",true],"c":{}}"#);
        assert_eq!(compact(r#"["\\" , "\\\""]"#), r#"["\\","\\\""]"#);
    }

    #[test]
    fn scratch_is_reused_and_starts_empty() {
        // A duplicate key leaves keys and digests on the stacks; the next document must not
        // see them.
        let dup = r#"{"a":{"b":1,"b":2}}"#;
        assert_eq!(fails(dup, 4).0, DuplicateKey { key: "b".into() });
        assert_eq!(dg(r#"{"b":1}"#), dg(r#"{ "b" : 1 }"#));
        assert!(parse_object(r#"{"b":1,"a":{"b":2}}"#, 4).is_ok());
        // A vector that borrowed one input keeps its allocation for the next.
        let text = String::from("borrowed");
        let mut v: Vec<Cow<'_, str>> = Vec::with_capacity(8);
        v.push(Cow::Borrowed(&text));
        let v: Vec<Cow<'static, str>> = recycle(v);
        assert!(v.is_empty() && v.capacity() >= 8);
    }

    /// The capacity of this thread's parked digest stack.
    fn parked_digests() -> usize {
        SCRATCH.with(|cell| {
            let scratch = cell.take();
            let capacity = scratch.digests.capacity();
            cell.set(scratch);
            capacity
        })
    }

    fn parked_keys() -> usize {
        SCRATCH.with(|cell| {
            let scratch = cell.take();
            let capacity = scratch.keys.capacity();
            cell.set(scratch);
            capacity
        })
    }

    /// `depth` nested objects, each with 15 keys of its own open while the
    /// next one is parsed: 15 × `depth` keys on the shared stack at once.
    fn nested_objects(depth: usize) -> String {
        let own: String = (0..15).map(|k| format!("\"k{k}\":0,")).collect();
        format!(
            "{}0{}",
            format!("{{{own}\"n\":").repeat(depth),
            "}".repeat(depth)
        )
    }

    #[test]
    fn a_document_with_many_open_keys_does_not_pin_the_key_stack() {
        // 2 levels: 30 keys (720 bytes) parked for the next document.
        digest(&nested_objects(2), 8).unwrap();
        assert!(parked_keys() >= 30, "{}", parked_keys());
        // 200 levels: 3,000 keys of 24 bytes are over the 64 KiB kept.
        digest(&nested_objects(200), 256).unwrap();
        assert_eq!(parked_keys(), 0);
    }

    #[test]
    fn a_huge_document_does_not_pin_its_buffers() {
        // 100 elements: the digest stack (1.6 KB) is parked for the next document.
        let small = format!("[{}0]", "0,".repeat(99));
        digest(&small, 4).unwrap();
        assert!(parked_digests() >= 100, "{}", parked_digests());
        // 5,000 elements: 5,000 16-byte digests are over the 64 KiB kept.
        let huge = format!("[{}0]", "0,".repeat(4_999));
        digest(&huge, 4).unwrap();
        assert_eq!(parked_digests(), 0);
    }

    #[test]
    fn plain_string_runs_stop_at_the_first_special_byte() {
        let naive = |bytes: &[u8], pos: usize| {
            (pos..bytes.len())
                .find(|&i| is_string_special(bytes[i]))
                .unwrap_or(bytes.len())
        };
        // Every pair of special bytes (and near misses: borrows, high bytes) at every pair
        // of offsets of runs up to 18 bytes.
        let probes = [
            b'a', b'"', b'\\', 0x00, 0x01, 0x1f, b' ', b'!', b'#', b'[', b']', 0x7f, 0x80, 0xff,
        ];
        for len in 0..19 {
            for at in 0..len {
                for second in at..len {
                    for &p in &probes {
                        for &q in &probes {
                            let mut bytes = vec![b'a'; len];
                            bytes[second] = q;
                            bytes[at] = p;
                            for start in 0..=len {
                                let got = skip_plain_string_bytes(&bytes, start);
                                assert_eq!(got, naive(&bytes, start), "{bytes:?} from {start}");
                            }
                        }
                    }
                }
            }
        }
    }

    /// Runs `f` on a thread with the default 2 MiB stack, to prove recursion is bounded.
    fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let thread = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(f)
            .unwrap();
        thread.join().unwrap()
    }

    #[test]
    fn deep_nesting_is_bounded_by_max_depth() {
        let deep =
            |n: usize, open: &str, close: &str| format!("{}1{}", open.repeat(n), close.repeat(n));
        let hostile = deep(10_000, "[", "]");
        assert_eq!(fails(&hostile, 128), (TooDeep { max_depth: 128 }, 128));
        let unclosed = "[".repeat(10_000);
        assert_eq!(fails(&unclosed, 1024), (TooDeep { max_depth: 1024 }, 1024));
        on_small_stack(move || {
            assert!(digest(&deep(1000, "[", "]"), 1024).is_ok());
            let objects = deep(1024, "{\"k\":", "}"); // the worst case: deepest objects
            assert!(digest(&objects, 1024).is_ok());
            let too_deep = (TooDeep { max_depth: 1023 }, 1023 * 5);
            assert_eq!(fails(&objects, 1023), too_deep);
            let too_deep = (TooDeep { max_depth: 1024 }, 1024);
            assert_eq!(fails(&deep(1025, "[", "]"), 1024), too_deep);
        });
    }

    #[test]
    fn huge_strings_numbers_and_objects() {
        let big = "x".repeat(1 << 20);
        assert_eq!(
            dg(&format!("\"{big}\"")),
            dg(&format!("\"{}\\u0078\"", &big[1..]))
        );
        assert_ne!(dg(&format!("\"{big}\"")), dg(&format!("\"{big}x\"")));

        let digits: String = (0..10_000)
            .map(|i| char::from(b'1' + (i % 9) as u8))
            .collect();
        let mut changed = digits.clone();
        changed.pop();
        changed.push('0');
        assert_ne!(dg(&digits), dg(&changed));
        assert_eq!(dg(&digits), dg(&format!("{digits}.000")));
        assert_eq!(dg(&digits), dg(&format!("0.{digits}e10000")));
        assert_ne!(dg(&digits), dg(&format!("0.{digits}e9999")));

        // Around the switch from linear scans to a hash set (SMALL_OBJECT), and with a large
        // object nested inside a small one, which share the key stack.
        for n in 1..40 {
            let body: Vec<String> = (0..n).map(|i| format!("\"{i}\":0")).collect();
            let body = body.join(",");
            assert!(digest(&format!("{{{body}}}"), 1).is_ok());
            let dup = (DuplicateKey { key: "0".into() }, body.len() + 2);
            assert_eq!(fails(&format!("{{{body},\"0\":1}}"), 1), dup);
            let nested = format!("{{\"0\":{{{body}}},\"1\":{{\"0\":[]}}}}");
            assert!(digest(&nested, 3).is_ok(), "{:?}", digest(&nested, 3));
            assert_eq!(fails(&nested, 2).0, TooDeep { max_depth: 2 });
            let dup_after = format!("{{\"0\":{{{body}}},\"0\":1}}");
            assert_eq!(fails(&dup_after, 2).0, DuplicateKey { key: "0".into() });
        }

        let keys: Vec<String> = (0..100_000).map(|i| format!("\"k{i}\":{i}")).collect();
        let object = format!("{{{}}}", keys.join(","));
        let forward = dg(&object);
        let reversed: Vec<&str> = keys.iter().rev().map(String::as_str).collect();
        assert_eq!(dg(&format!("{{{}}}", reversed.join(","))), forward);
        let with_duplicate = format!("{{{},\"k5\":0}}", keys.join(","));
        let at = with_duplicate.len() - 7;
        assert_eq!(
            fails(&with_duplicate, 2),
            (DuplicateKey { key: "k5".into() }, at)
        );
        assert_eq!(parse_object(&object, 1).unwrap().len(), 100_000);
    }

    // ---- property tests -------------------------------------------------------------

    /// A generated JSON value. Numbers are `-? mantissa * 10^exp` with a canonical mantissa.
    #[derive(Clone, Debug)]
    enum V {
        Null,
        Bool(bool),
        Num(bool, String, i32),
        Str(String),
        Arr(Vec<V>),
        Obj(Vec<(String, V)>),
    }

    /// Randomised encoder: key order, whitespace, escapes and (if `vary`) number spelling
    /// all depend on `seed` (splitmix64). With `space == false` no whitespace is written,
    /// but the same random choices are made.
    struct Enc {
        seed: u64,
        vary: bool,
        space: bool,
        out: String,
    }

    impl Enc {
        fn new(seed: u64, vary: bool, space: bool) -> Self {
            Enc {
                seed,
                vary,
                space,
                out: String::new(),
            }
        }
        fn run(v: &V, seed: u64, vary: bool, space: bool) -> String {
            let mut e = Enc::new(seed, vary, space);
            e.value(v);
            e.out
        }
        fn below(&mut self, n: usize) -> usize {
            self.seed = self.seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.seed;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) % n as u64) as usize
        }
        fn ws(&mut self) {
            for _ in 0..self.below(3) {
                let c = [' ', '\t', '\n', '\r'][self.below(4)];
                if self.space {
                    self.out.push(c);
                }
            }
        }
        fn value(&mut self, v: &V) {
            self.ws();
            match v {
                V::Null => self.out.push_str("null"),
                V::Bool(b) => self.out.push_str(if *b { "true" } else { "false" }),
                V::Num(neg, mantissa, exp) => self.number(*neg, mantissa, *exp),
                V::Str(s) => self.string(s),
                V::Arr(items) => {
                    self.out.push('[');
                    for (i, item) in items.iter().enumerate() {
                        self.out.push_str(if i == 0 { "" } else { "," });
                        self.value(item);
                    }
                    self.ws();
                    self.out.push(']');
                }
                V::Obj(members) => {
                    let mut order: Vec<usize> = (0..members.len()).collect();
                    for i in (1..order.len()).rev() {
                        let j = self.below(i + 1);
                        order.swap(i, j);
                    }
                    self.out.push('{');
                    for (n, &i) in order.iter().enumerate() {
                        self.out.push_str(if n == 0 { "" } else { "," });
                        self.ws();
                        self.string(&members[i].0);
                        self.ws();
                        self.out.push(':');
                        self.value(&members[i].1);
                    }
                    self.ws();
                    self.out.push('}');
                }
            }
            self.ws();
        }
        fn string(&mut self, s: &str) {
            self.out.push('"');
            for c in s.chars() {
                let short = match c {
                    '"' => "\\\"",
                    '\\' => "\\\\",
                    '/' => "\\/",
                    '\n' => "\\n",
                    '\t' => "\\t",
                    '\r' => "\\r",
                    '\u{8}' => "\\b",
                    '\u{c}' => "\\f",
                    _ => "",
                };
                match self.below(4) {
                    0 => {
                        for unit in c.encode_utf16(&mut [0; 2]) {
                            let _ = if self.below(2) == 0 {
                                write!(self.out, "\\u{unit:04x}")
                            } else {
                                write!(self.out, "\\u{unit:04X}")
                            };
                        }
                    }
                    1 if !short.is_empty() => self.out.push_str(short),
                    _ if c == '"' || c == '\\' || c < ' ' => {
                        let _ = write!(self.out, "\\u{:04x}", u32::from(c));
                    }
                    _ => self.out.push(c),
                }
            }
            self.out.push('"');
        }
        /// Writes `digits` (the mantissa plus k extra zeros) as `int.frac` with z leading
        /// fraction zeros and the exponent that keeps the value unchanged.
        fn number(&mut self, neg: bool, mantissa: &str, exp: i32) {
            let zero = mantissa == "0";
            if neg || (zero && self.vary && self.below(2) == 0) {
                self.out.push('-');
            }
            if !self.vary {
                assert_eq!(exp, 0, "plain spelling is for integers");
                return self.out.push_str(mantissa);
            }
            let extra = if zero { 0 } else { self.below(4) };
            let digits = format!("{mantissa}{}", "0".repeat(extra));
            let frac_len = self.below(digits.len() + 1);
            let (int, frac) = digits.split_at(digits.len() - frac_len);
            let z = if int.is_empty() { self.below(3) } else { 0 };
            self.out.push_str(if int.is_empty() { "0" } else { int });
            if !frac.is_empty() {
                let _ = write!(self.out, ".{}{frac}", "0".repeat(z));
            }
            let e = i64::from(exp) - extra as i64 + frac_len as i64 + z as i64;
            if e != 0 || self.below(2) == 0 {
                let marker = ["e", "E"][self.below(2)];
                let plus = if e >= 0 && self.below(2) == 0 {
                    "+"
                } else {
                    ""
                };
                let _ = write!(self.out, "{marker}{plus}{e}");
            }
        }
    }

    fn arb_string() -> impl Strategy<Value = String> {
        let special = prop::sample::select(vec![
            '"', '\\', '/', '\n', '\u{0}', '\u{1f}', 'é', '😀', '\u{301}',
        ]);
        let chars = prop_oneof![3 => prop::char::range('a', 'c'), 1 => any::<char>(), 1 => special];
        prop::collection::vec(chars, 0..5).prop_map(|c| c.into_iter().collect())
    }

    /// Values of depth <= 4. With `int_only`, numbers are integers with |n| < 2^53.
    fn arb_value(int_only: bool) -> impl Strategy<Value = V> {
        let int = |n: i64| V::Num(n < 0, n.unsigned_abs().to_string(), 0);
        let num = if int_only {
            prop_oneof![
                (-3i64..3).prop_map(int),
                (1 - (1i64 << 53)..1i64 << 53).prop_map(int)
            ]
            .boxed()
        } else {
            prop_oneof![
                (any::<bool>(), 0u32..1000).prop_map(|(neg, n)| V::Num(
                    neg && n != 0,
                    n.to_string(),
                    0
                )),
                (any::<bool>(), "[1-9][0-9]{0,24}", -30i32..30)
                    .prop_map(|(neg, m, e)| V::Num(neg, m, e)),
            ]
            .boxed()
        };
        let leaf = prop_oneof![
            Just(V::Null),
            any::<bool>().prop_map(V::Bool),
            num,
            arb_string().prop_map(V::Str)
        ];
        leaf.prop_recursive(4, 48, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(V::Arr),
                prop::collection::btree_map(arb_string(), inner, 0..5)
                    .prop_map(|m| V::Obj(m.into_iter().collect())),
            ]
        })
    }

    /// One small random change (which may happen to leave the value equal).
    fn mutate(v: &mut V, e: &mut Enc) {
        match v {
            V::Arr(items) if !items.is_empty() && e.below(3) > 0 => {
                let i = e.below(items.len());
                if e.below(2) == 0 {
                    mutate(&mut items[i], e)
                } else {
                    drop(items.remove(i))
                }
            }
            V::Obj(members) if !members.is_empty() && e.below(3) > 0 => {
                let i = e.below(members.len());
                let renamed = format!("{}b", members[i].0);
                match e.below(3) {
                    0 => mutate(&mut members[i].1, e),
                    1 if !members.iter().any(|(k, _)| *k == renamed) => members[i].0 = renamed,
                    _ => drop(members.remove(i)),
                }
            }
            V::Arr(items) => items.push(V::Null),
            V::Obj(members) if !members.iter().any(|(k, _)| k == "new") => {
                members.push(("new".into(), V::Null))
            }
            leaf => {
                let leaves = [
                    V::Null,
                    V::Bool(true),
                    V::Num(false, "1".into(), 0),
                    V::Str("a".into()),
                    V::Arr(vec![]),
                ];
                *leaf = leaves[e.below(leaves.len())].clone();
            }
        }
    }

    fn jcs(text: &str) -> String {
        let value: serde_json::Value = serde_json::from_str(text).unwrap();
        serde_jcs::to_string(&value).unwrap()
    }

    proptest! {
        #[test]
        fn equivalent_encodings_have_equal_digests(v in arb_value(false), s1: u64, s2: u64) {
            let (a, b) = (Enc::run(&v, s1, true, true), Enc::run(&v, s2, true, true));
            prop_assert_eq!(dg(&a), dg(&b), "{} vs {}", a, b);
            prop_assert_eq!(dg(&a), dg(&Enc::run(&v, !s1, true, false)));
            // One leading byte-order mark changes nothing.
            prop_assert_eq!(dg(&a), dg(&format!("\u{feff}{b}")));
            let wrapped = format!("{{\"k\":{a}}}");
            let member = parse_object(&wrapped, 64).unwrap().remove(0);
            let decoded = (member.kind == Kind::String).then(|| decode_string(member.raw));
            prop_assert_eq!(member.string(), decoded.flatten());
        }

        #[test]
        fn digest_equality_agrees_with_jcs(
            v in arb_value(true), other in arb_value(true), mode in 0..3u8, s1: u64, s2: u64,
        ) {
            let w = match mode {
                0 => v.clone(),
                1 => { let mut w = v.clone(); mutate(&mut w, &mut Enc::new(s1 ^ s2, false, false)); w }
                _ => other,
            };
            let (a, b) = (Enc::run(&v, s1, false, true), Enc::run(&w, s2, false, true));
            let same = dg(&a) == dg(&b);
            prop_assert_eq!(same, jcs(&a) == jcs(&b), "{} vs {}", a, b);
            // With a leading byte-order mark (which serde_json refuses, so JCS
            // sees the text without it), the digests still agree with JCS.
            prop_assert_eq!(dg(&format!("\u{feff}{a}")) == dg(&b), same, "marked {} vs {}", a, b);
            prop_assert!(mode != 0 || same);
        }

        #[test]
        fn compact_keeps_value_and_digest(v in arb_value(false), seed: u64) {
            let text = Enc::run(&v, seed, true, true);
            let compacted = compact(&text);
            prop_assert_eq!(&compacted, &Enc::run(&v, seed, true, false));
            let parse = |t: &str| serde_json::from_str::<serde_json::Value>(t).unwrap();
            prop_assert_eq!(parse(&compacted), parse(&text));
            prop_assert_eq!(dg(&compacted), dg(&text));
        }

        #[test]
        fn arbitrary_input_never_panics(text in r#"[\[\]{}",:0-9eE+\-. a-z\\u\x00é]{0,40}"#) {
            let _ = (digest(&text, 3), decode_string(&text), compact(&text));
            for m in parse_object(&text, 3).unwrap_or_default() {
                let decoded = (m.kind == Kind::String).then(|| decode_string(m.raw));
                prop_assert_eq!(m.string(), decoded.flatten());
            }
        }
    }
}
