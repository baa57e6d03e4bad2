//! An independent model of docs/CONTRACT.md §2 JSON, written for the fuzz targets only:
//! a strict tree-building parser, the canonical form of semantic content, and
//! a re-encoder that changes everything docs/CONTRACT.md §2 says does not matter.
//!
//! It shares no code with `src/canon.rs` (which digests in one pass without a
//! tree), so the two can be checked against each other: same accept/reject
//! decisions, same equalities.

use std::fmt::Write as _;

/// A parsed JSON value. Strings are decoded; numbers keep their exact value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Null,
    Bool(bool),
    Number(Number),
    String(String),
    Array(Vec<Value>),
    /// Members in source order (keys are unique: duplicates are an error).
    Object(Vec<(String, Value)>),
}

/// An exact decimal: `(-1)^negative * digits * 10^exponent`, `digits` without
/// leading or trailing zeros; zero is `digits == ""`, not negative, exponent 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Number {
    pub negative: bool,
    pub digits: String,
    pub exponent: i128,
    /// The literal as written.
    pub raw: String,
}

/// Why a document was refused; the first problem in document order wins, as
/// in `canon.rs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// Nesting deeper than the limit.
    TooDeep,
    /// Anything else: not JSON under docs/CONTRACT.md §2.
    Invalid,
}

/// Exponent literals longer than this are refused (as `canon.rs` does).
const MAX_EXPONENT_DIGITS: usize = 30;

/// Parses a whole document: optional whitespace, one value, optional
/// whitespace. One leading byte-order mark is skipped (RFC 8259 §8.1); any
/// other is not JSON. `max_depth` counts the top-level container as 1.
pub fn parse(text: &str, max_depth: usize) -> Result<Value, Error> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut p = P {
        b: text.as_bytes(),
        s: text,
        i: 0,
        depth: 0,
        max_depth,
    };
    p.ws();
    let v = p.value()?;
    p.ws();
    if p.i != p.b.len() {
        return Err(Error::Invalid);
    }
    Ok(v)
}

struct P<'a> {
    b: &'a [u8],
    s: &'a str,
    i: usize,
    depth: usize,
    max_depth: usize,
}

impl P<'_> {
    fn ws(&mut self) {
        while matches!(self.b.get(self.i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn value(&mut self) -> Result<Value, Error> {
        match self.b.get(self.i) {
            Some(b'{') => self.object(),
            Some(b'[') => self.array(),
            Some(b'"') => self.string().map(Value::String),
            Some(b'-' | b'0'..=b'9') => self.number().map(Value::Number),
            Some(b't') => self.word("true", Value::Bool(true)),
            Some(b'f') => self.word("false", Value::Bool(false)),
            Some(b'n') => self.word("null", Value::Null),
            _ => Err(Error::Invalid),
        }
    }

    fn word(&mut self, w: &str, v: Value) -> Result<Value, Error> {
        if self.s[self.i..].starts_with(w) {
            self.i += w.len();
            Ok(v)
        } else {
            Err(Error::Invalid)
        }
    }

    fn open(&mut self) -> Result<(), Error> {
        if self.depth >= self.max_depth {
            return Err(Error::TooDeep);
        }
        self.depth += 1;
        self.i += 1;
        self.ws();
        Ok(())
    }

    fn array(&mut self) -> Result<Value, Error> {
        self.open()?;
        let mut items = Vec::new();
        if self.b.get(self.i) == Some(&b']') {
            self.i += 1;
        } else {
            loop {
                self.ws();
                items.push(self.value()?);
                self.ws();
                match self.b.get(self.i) {
                    Some(b',') => self.i += 1,
                    Some(b']') => {
                        self.i += 1;
                        break;
                    }
                    _ => return Err(Error::Invalid),
                }
            }
        }
        self.depth -= 1;
        Ok(Value::Array(items))
    }

    fn object(&mut self) -> Result<Value, Error> {
        self.open()?;
        let mut members: Vec<(String, Value)> = Vec::new();
        let mut keys = std::collections::HashSet::new();
        if self.b.get(self.i) == Some(&b'}') {
            self.i += 1;
        } else {
            loop {
                self.ws();
                if self.b.get(self.i) != Some(&b'"') {
                    return Err(Error::Invalid);
                }
                let key = self.string()?;
                if !keys.insert(key.clone()) {
                    return Err(Error::Invalid);
                }
                self.ws();
                if self.b.get(self.i) != Some(&b':') {
                    return Err(Error::Invalid);
                }
                self.i += 1;
                self.ws();
                let v = self.value()?;
                members.push((key, v));
                self.ws();
                match self.b.get(self.i) {
                    Some(b',') => self.i += 1,
                    Some(b'}') => {
                        self.i += 1;
                        break;
                    }
                    _ => return Err(Error::Invalid),
                }
            }
        }
        self.depth -= 1;
        Ok(Value::Object(members))
    }

    fn hex4(&mut self) -> Result<u32, Error> {
        let h = self.s.get(self.i..self.i + 4).ok_or(Error::Invalid)?;
        if !h.bytes().all(|c| c.is_ascii_hexdigit()) {
            return Err(Error::Invalid);
        }
        self.i += 4;
        u32::from_str_radix(h, 16).map_err(|_| Error::Invalid)
    }

    fn string(&mut self) -> Result<String, Error> {
        self.i += 1;
        let mut out = String::new();
        loop {
            let c = self.s[self.i..].chars().next().ok_or(Error::Invalid)?;
            match c {
                '"' => {
                    self.i += 1;
                    return Ok(out);
                }
                '\\' => {
                    self.i += 1;
                    let e = *self.b.get(self.i).ok_or(Error::Invalid)?;
                    self.i += 1;
                    let decoded = match e {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let u = self.hex4()?;
                            if (0xD800..0xDC00).contains(&u) {
                                if self.s.get(self.i..self.i + 2) != Some("\\u") {
                                    return Err(Error::Invalid);
                                }
                                self.i += 2;
                                let low = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&low) {
                                    return Err(Error::Invalid);
                                }
                                let cp = 0x10000 + ((u - 0xD800) << 10) + (low - 0xDC00);
                                char::from_u32(cp).ok_or(Error::Invalid)?
                            } else {
                                char::from_u32(u).ok_or(Error::Invalid)?
                            }
                        }
                        _ => return Err(Error::Invalid),
                    };
                    out.push(decoded);
                }
                c if (c as u32) < 0x20 => return Err(Error::Invalid),
                c => {
                    out.push(c);
                    self.i += c.len_utf8();
                }
            }
        }
    }

    fn digits(&mut self) -> &str {
        let start = self.i;
        while self.b.get(self.i).is_some_and(u8::is_ascii_digit) {
            self.i += 1;
        }
        &self.s[start..self.i]
    }

    fn number(&mut self) -> Result<Number, Error> {
        let start = self.i;
        let negative = self.b[self.i] == b'-';
        if negative {
            self.i += 1;
        }
        let int = self.digits().to_owned();
        if int.is_empty() || (int.len() > 1 && int.starts_with('0')) {
            return Err(Error::Invalid);
        }
        let mut frac = String::new();
        if self.b.get(self.i) == Some(&b'.') {
            self.i += 1;
            frac = self.digits().to_owned();
            if frac.is_empty() {
                return Err(Error::Invalid);
            }
        }
        let mut exp: i128 = 0;
        if matches!(self.b.get(self.i), Some(b'e' | b'E')) {
            self.i += 1;
            let neg = match self.b.get(self.i) {
                Some(b'-') => {
                    self.i += 1;
                    true
                }
                Some(b'+') => {
                    self.i += 1;
                    false
                }
                _ => false,
            };
            let d = self.digits();
            if d.is_empty() || d.len() > MAX_EXPONENT_DIGITS {
                return Err(Error::Invalid);
            }
            exp = d.parse::<i128>().map_err(|_| Error::Invalid)?;
            if neg {
                exp = -exp;
            }
        }
        let raw = self.s[start..self.i].to_owned();
        let all = format!("{int}{frac}");
        let trimmed_start = all.trim_start_matches('0');
        let significant = trimmed_start.trim_end_matches('0');
        if significant.is_empty() {
            return Ok(Number {
                negative: false,
                digits: String::new(),
                exponent: 0,
                raw,
            });
        }
        let trailing = (trimmed_start.len() - significant.len()) as i128;
        Ok(Number {
            negative,
            digits: significant.to_owned(),
            exponent: exp - frac.len() as i128 + trailing,
            raw,
        })
    }
}

/// The canonical text of a value's semantic content: equal exactly when
/// docs/CONTRACT.md §2 says the values are equal (object key order and whitespace do not
/// count, strings compare by code point, numbers by exact value). Lengths
/// and counts are written out so that no two values share a text.
pub fn canonical(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push('n'),
        Value::Bool(b) => out.push(if *b { 't' } else { 'f' }),
        Value::Number(n) => {
            let sign = if n.negative { '-' } else { '+' };
            let _ = write!(out, "#{sign}{}e{};", n.digits, n.exponent);
        }
        Value::String(s) => {
            let _ = write!(out, "s{}:{s}", s.len());
        }
        Value::Array(items) => {
            let _ = write!(out, "[{}:", items.len());
            for i in items {
                canonical(i, out);
            }
            out.push(']');
        }
        Value::Object(members) => {
            let mut sorted: Vec<&(String, Value)> = members.iter().collect();
            sorted.sort_by(|a, b| a.0.cmp(&b.0));
            let _ = write!(out, "{{{}:", members.len());
            for (k, v) in sorted {
                let _ = write!(out, "k{}:{k}", k.len());
                canonical(v, out);
            }
            out.push('}');
        }
    }
}

/// A tiny deterministic generator (xorshift64*), seeded from the input.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }
}

fn ws(r: &mut Rng, out: &mut String) {
    for _ in 0..r.below(3) {
        out.push([' ', '\t', '\n', '\r'][r.below(4) as usize]);
    }
}

/// Writes `s` as a JSON string literal, escaping characters at random (every
/// escape decodes to the same code points).
pub fn encode_string(s: &str, r: &mut Rng, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        let cp = c as u32;
        let must = c == '"' || c == '\\' || cp < 0x20;
        if !must && !r.chance(4) {
            out.push(c);
            continue;
        }
        let short = match c {
            '"' => Some("\\\""),
            '\\' => Some("\\\\"),
            '/' => Some("\\/"),
            '\u{8}' => Some("\\b"),
            '\u{c}' => Some("\\f"),
            '\n' => Some("\\n"),
            '\r' => Some("\\r"),
            '\t' => Some("\\t"),
            _ => None,
        };
        match short {
            Some(e) if r.chance(2) => out.push_str(e),
            _ => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    if r.chance(2) {
                        let _ = write!(out, "\\u{u:04x}");
                    } else {
                        let _ = write!(out, "\\u{u:04X}");
                    }
                }
            }
        }
    }
    out.push('"');
}

/// Writes the exact value of `n` in another (random) spelling: trailing
/// zeros, a moved decimal point, an exponent or none.
pub fn encode_number(n: &Number, r: &mut Rng, out: &mut String) {
    if r.chance(4) {
        out.push_str(&n.raw);
        return;
    }
    if n.digits.is_empty() {
        let zeros = ["0", "-0", "0.0", "0e5", "-0.000E-3", "0E+0"];
        out.push_str(zeros[r.below(zeros.len() as u64) as usize]);
        return;
    }
    let extra = r.below(3) as usize;
    let mut digits = n.digits.clone();
    digits.push_str(&"0".repeat(extra));
    let exponent = n.exponent - extra as i128;
    let (int, frac) = if r.chance(3) {
        // 0.000ddd
        let lead = r.below(3) as usize;
        ("0".to_owned(), format!("{}{digits}", "0".repeat(lead)))
    } else {
        let point = 1 + r.below(digits.len() as u64) as usize;
        (digits[..point].to_owned(), digits[point..].to_owned())
    };
    let exp = exponent + frac.len() as i128;
    let exp_text = exp.abs().to_string();
    if exp_text.len() > MAX_EXPONENT_DIGITS {
        out.push_str(&n.raw);
        return;
    }
    if n.negative {
        out.push('-');
    }
    out.push_str(&int);
    if !frac.is_empty() {
        out.push('.');
        out.push_str(&frac);
    }
    if exp != 0 || r.chance(3) {
        out.push(if r.chance(2) { 'e' } else { 'E' });
        if exp < 0 {
            out.push('-');
        } else if r.chance(2) {
            out.push('+');
        }
        out.push_str(&exp_text);
    }
}

/// Writes `v` with random whitespace, member order, escapes and number
/// spellings: the same semantic content, other bytes.
pub fn encode(v: &Value, r: &mut Rng, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => encode_number(n, r, out),
        Value::String(s) => encode_string(s, r, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                ws(r, out);
                encode(item, r, out);
                ws(r, out);
            }
            ws(r, out);
            out.push(']');
        }
        Value::Object(members) => encode_members(members.iter().collect(), r, out),
    }
}

/// Writes an object from `members` in a random order.
pub fn encode_members(mut members: Vec<&(String, Value)>, r: &mut Rng, out: &mut String) {
    for i in (1..members.len()).rev() {
        members.swap(i, r.below(i as u64 + 1) as usize);
    }
    out.push('{');
    for (i, (k, v)) in members.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        ws(r, out);
        encode_string(k, r, out);
        ws(r, out);
        out.push(':');
        ws(r, out);
        encode(v, r, out);
        ws(r, out);
    }
    ws(r, out);
    out.push('}');
}
