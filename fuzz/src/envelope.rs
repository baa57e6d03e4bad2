//! Target (a): `BodyParser::parse` (the context's parser) on arbitrary bytes, checked against the
//! independent model in `json.rs`, plus the fingerprint properties.

use super::json::{self, Rng, Value};
use snapshot_receiver_core::{Config, Context, Limits, ManualClock};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

/// Small limits, so that short fuzz inputs reach every refusal.
pub fn limits() -> Limits {
    Limits {
        max_body_bytes: 3000,
        max_depth: 16,
        max_id_bytes: 24,
        ..Limits::default()
    }
}

fn context() -> &'static Context {
    static CTX: OnceLock<Context> = OnceLock::new();
    CTX.get_or_init(|| {
        let config = Config {
            limits: limits(),
            ..Config::default()
        };
        Context::new(config, Arc::new(ManualClock::new(SystemTime::UNIX_EPOCH)))
    })
}

/// The six envelope fields, in the order the fingerprint uses (docs/CONTRACT.md §2).
const FIELDS: [&str; 6] = [
    "event_id",
    "object_id",
    "object_version",
    "occurred_at",
    "type",
    "state",
];

/// What the model says a body must become.
#[derive(Debug)]
pub enum Expect {
    /// Refused over a limit; the `RejectReason::as_str` name.
    Reject(&'static str),
    /// Held as malformed: no identity.
    Malformed,
    /// A well-formed envelope.
    Event {
        event_id: String,
        object_id: String,
        /// Canonical text of the six semantic fields (absent ≠ null).
        canonical: String,
        /// Every top-level member, for re-encoding.
        members: Vec<(String, Value)>,
    },
}

/// The model of `envelope::parse`, in the same order of checks: size, UTF-8,
/// the JSON grammar (depth refusals in document order), top-level object,
/// id lengths and U+0000 in ids, ids present as strings.
pub fn model(bytes: &[u8], limits: &Limits) -> Expect {
    if bytes.len() > limits.max_body_bytes {
        return Expect::Reject("body_too_large");
    }
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Expect::Malformed;
    };
    let members = match json::parse(text, limits.max_depth.min(1024)) {
        Err(json::Error::TooDeep) => return Expect::Reject("too_deep"),
        Err(json::Error::Invalid) => return Expect::Malformed,
        Ok(Value::Object(members)) => members,
        Ok(_) => return Expect::Malformed,
    };
    let get = |name: &str| members.iter().find(|(k, _)| k == name).map(|(_, v)| v);
    let id = |name: &str| match get(name) {
        Some(Value::String(s)) if s.len() > limits.max_id_bytes => Err("id_too_long"),
        // U+0000 is refused by every backend alike (PostgreSQL text cannot hold it).
        Some(Value::String(s)) if s.contains('\0') => Err("nul_in_id"),
        // An empty id names nothing: malformed, like a missing one.
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        _ => Ok(None),
    };
    // A refused id is refused even when the other id is missing; the
    // event id is checked first.
    let (event_id, object_id) = match (id("event_id"), id("object_id")) {
        (Err(why), _) | (_, Err(why)) => return Expect::Reject(why),
        (Ok(e), Ok(o)) => (e, o),
    };
    let (Some(event_id), Some(object_id)) = (event_id, object_id) else {
        return Expect::Malformed;
    };
    let mut canonical = String::new();
    for f in FIELDS {
        match get(f) {
            Some(Value::String(s)) if f == "occurred_at" && instant(s).is_some() => {
                // The instant it names, not its text (no JSON value's
                // canonical text starts with `@`).
                let (secs, nanos, leap) = instant(s).unwrap_or_default();
                canonical.push_str(&format!(
                    "1@{secs}.{nanos:09}{}",
                    if leap { "L" } else { "" }
                ));
            }
            Some(v) => {
                canonical.push('1');
                json::canonical(v, &mut canonical);
            }
            None => canonical.push('0'),
        }
        canonical.push('|');
    }
    Expect::Event {
        event_id,
        object_id,
        canonical,
        members,
    }
}

/// The instant an RFC 3339 `date-time` names, written independently of the
/// receiver's reader: (seconds since 1970 in UTC, nanoseconds, leap second).
/// `T`, `t` or a space between date and time, a fraction of any length (cut
/// to nine digits), `Z`, `z` or `+hh:mm` / `-hh:mm` with hh <= 23; a leap
/// second (`:60`) only as a month's last second in UTC, counted from the
/// second before it.
pub fn instant(text: &str) -> Option<(i64, u32, bool)> {
    let b = text.as_bytes();
    let num = |from: usize, len: usize| -> Option<i64> {
        let part = b.get(from..from + len)?;
        part.iter()
            .all(u8::is_ascii_digit)
            .then(|| part.iter().fold(0, |n, d| n * 10 + i64::from(d - b'0')))
    };
    let at = |i: usize, c: &[u8]| b.get(i).is_some_and(|x| c.contains(x));
    if !(at(4, b"-") && at(7, b"-") && at(10, b"Tt ") && at(13, b":") && at(16, b":")) {
        return None;
    }
    let (year, month, day) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    let (hour, minute, second) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
    let leap_year = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let month_days = [
        31,
        if leap_year { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if !(1..=12).contains(&month) || day < 1 || day > month_days[month as usize - 1] {
        return None;
    }
    if hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut i = 19;
    let mut nanos = 0u32;
    if at(i, b".") {
        i += 1;
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            if i - start < 9 {
                nanos = nanos * 10 + u32::from(b[i] - b'0');
            }
            i += 1;
        }
        if i == start {
            return None;
        }
        nanos *= 10u32.pow(9 - (i - start).min(9) as u32);
    }
    let offset = if at(i, b"Zz") && i + 1 == b.len() {
        0
    } else if at(i, b"+-") && at(i + 3, b":") && i + 6 == b.len() {
        let (h, m) = (num(i + 1, 2)?, num(i + 4, 2)?);
        if h > 23 || m > 59 {
            return None;
        }
        let sign = if b[i] == b'-' { -1 } else { 1 };
        sign * (h * 3600 + m * 60)
    } else {
        return None;
    };
    // Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's
    // days_from_civil).
    let (y, m) = if month <= 2 {
        (year - 1, month + 9)
    } else {
        (year, month - 3)
    };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let leap = second == 60;
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second.min(59) - offset;
    if leap {
        // The second after it must start a month, in UTC.
        let next = secs + 1;
        let day_of = next.div_euclid(86_400);
        if next.rem_euclid(86_400) != 0 || civil_day(day_of) != 1 {
            return None;
        }
    }
    Some((secs, nanos, leap))
}

/// The day of the month of `days` since 1970-01-01 (H. Hinnant's
/// civil_from_days).
fn civil_day(days: i64) -> i64 {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    doy - (153 * mp + 2) / 5 + 1
}

/// Fingerprints and canonical texts seen so far in this process, both ways,
/// bounded so that a long run cannot exhaust memory.
#[derive(Default)]
struct Seen {
    by_fingerprint: HashMap<u128, String>,
    by_canonical: HashMap<String, u128>,
}

const SEEN_LIMIT: usize = 50_000;

fn seen() -> &'static Mutex<Seen> {
    static SEEN: OnceLock<Mutex<Seen>> = OnceLock::new();
    SEEN.get_or_init(Mutex::default)
}

/// Two bodies share a fingerprint exactly when the model says their semantic
/// content is equal (over every input this process has seen).
fn remember(fingerprint: u128, canonical: &str) {
    let mut seen = seen().lock().unwrap();
    if seen.by_fingerprint.len() > SEEN_LIMIT {
        *seen = Seen::default();
    }
    if let Some(other) = seen.by_fingerprint.get(&fingerprint) {
        assert_eq!(
            other, canonical,
            "two different semantic contents share the fingerprint {fingerprint:032x}"
        );
    }
    if let Some(&other) = seen.by_canonical.get(canonical) {
        assert_eq!(
            other, fingerprint,
            "one semantic content has two fingerprints: {canonical}"
        );
    }
    seen.by_fingerprint
        .insert(fingerprint, canonical.to_owned());
    seen.by_canonical.insert(canonical.to_owned(), fingerprint);
}

fn seed(data: &[u8]) -> u64 {
    // FNV-1a: any stable hash will do.
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The whole check for one input.
pub fn check(data: &[u8]) {
    let ctx = context();
    let limits = limits();
    let got = ctx.parser().parse(data);
    let expect = model(data, &limits);
    let (delivery, event_id, object_id, canonical, members) = match (got, expect) {
        (Err(why), Expect::Reject(name)) => {
            assert_eq!(why.as_str(), name, "refusal reason");
            return;
        }
        (Ok(d), Expect::Malformed) => {
            assert_eq!(d.fingerprint(), None, "a malformed body has no fingerprint");
            return;
        }
        (
            Ok(d),
            Expect::Event {
                event_id,
                object_id,
                canonical,
                members,
            },
        ) => (d, event_id, object_id, canonical, members),
        (got, expect) => panic!("parser says {got:?}, the model says {expect:?}"),
    };
    assert_eq!(delivery.event_id(), Some(event_id.as_str()));
    assert_eq!(delivery.object_id(), Some(object_id.as_str()));
    let fingerprint = delivery.fingerprint().expect("a well-formed envelope");
    remember(fingerprint, &canonical);

    // Re-encode twice: other member order, whitespace, escapes and number
    // spellings; transport members dropped or added. Same fingerprint.
    let mut rng = Rng::new(seed(data));
    for _ in 0..2 {
        let attempt = (
            "attempt".to_owned(),
            Value::Number(json::Number {
                negative: false,
                digits: "2".to_owned(),
                exponent: 0,
                raw: "2".to_owned(),
            }),
        );
        let mut kept: Vec<&(String, Value)> = members
            .iter()
            .filter(|(k, _)| FIELDS.contains(&k.as_str()) || !rng.chance(3))
            .collect();
        if !kept.iter().any(|(k, _)| k == "attempt") && rng.chance(2) {
            kept.push(&attempt);
        }
        let mut text = String::new();
        json::encode_members(kept, &mut rng, &mut text);
        if text.len() > limits.max_body_bytes {
            continue;
        }
        match model(text.as_bytes(), &limits) {
            Expect::Event { canonical: c, .. } => {
                assert_eq!(c, canonical, "harness bug: re-encoding changed the content")
            }
            other => panic!("harness bug: re-encoding is {other:?}: {text}"),
        }
        let again = ctx
            .parser()
            .parse(text.as_bytes())
            .unwrap_or_else(|e| panic!("re-encoding refused ({e}): {text}"));
        assert_eq!(
            again.fingerprint(),
            Some(fingerprint),
            "re-encoding changed the fingerprint:\n{}\n{text}",
            String::from_utf8_lossy(data)
        );
    }
}
