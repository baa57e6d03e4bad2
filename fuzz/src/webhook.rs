//! Target (c): the webhook signature check of `serve`
//! (`cli/src/cmd/serve/webhook.rs`, compiled here by its path as
//! `super::verifier`) on arbitrary header values and bodies, checked against
//! a model of the Standard Webhooks rules and the generic header form.
//!
//! An input is `id \n timestamp \n signature \n body`: the first three lines
//! are the values of `webhook-id`, `webhook-timestamp` and
//! `webhook-signature` (a line that is not a valid header value leaves its
//! header out), the rest is the body. Each input is checked
//!
//! - as sent, under the Standard scheme (tolerance [`TOLERANCE`] s, clock at
//!   [`NOW`]): never a panic, and the refusal the model names;
//! - with the signature line replaced by the right `v1,` tag for its id,
//!   timestamp and body: accepted exactly when the timestamp is readable
//!   and within the tolerance;
//! - with the signature line as the generic header (`sha256=` + hex, and
//!   base64): accepted exactly when it decodes to the body's MAC.

use super::verifier::{Encoding, Refusal, Scheme, Verifier};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use hmac::{KeyInit, Mac};
use http::{HeaderMap, HeaderName, HeaderValue};
use std::time::{Duration, SystemTime};

/// The secret every check signs with (the Standard Webhooks example's).
pub const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
/// The clock of every check, Unix seconds (the specification example's send time).
pub const NOW: u64 = 1_614_265_330;
/// The Standard scheme's tolerance, seconds.
pub const TOLERANCE: u64 = 300;
/// The generic form's header and prefix.
const GENERIC_HEADER: &str = "x-signature";
const GENERIC_PREFIX: &str = "sha256=";

/// The four parts of an input.
pub struct Input<'a> {
    pub id: &'a [u8],
    pub timestamp: &'a [u8],
    pub signature: &'a [u8],
    pub body: &'a [u8],
}

/// Splits an input at its first three newlines (missing parts are empty).
pub fn split(data: &[u8]) -> Input<'_> {
    let mut parts = data.splitn(4, |&b| b == b'\n');
    let mut next = || parts.next().unwrap_or(&[]);
    Input {
        id: next(),
        timestamp: next(),
        signature: next(),
        body: next(),
    }
}

fn standard() -> Verifier {
    Verifier::new(
        Scheme::Standard {
            tolerance: Duration::from_secs(TOLERANCE),
        },
        &[SECRET.to_owned()],
    )
    .expect("the example secret is valid")
}

fn generic(encoding: Encoding) -> Verifier {
    Verifier::new(
        Scheme::Generic {
            header: HeaderName::from_static(GENERIC_HEADER),
            encoding,
            prefix: GENERIC_PREFIX.to_owned(),
        },
        &[SECRET.to_owned()],
    )
    .expect("the example secret is valid")
}

fn key() -> Vec<u8> {
    BASE64
        .decode(SECRET.strip_prefix("whsec_").expect("whsec_ form"))
        .expect("base64")
}

/// HMAC-SHA256 of the concatenated `parts` under the secret.
fn tag(parts: &[&[u8]]) -> Vec<u8> {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key()).expect("any key length");
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().to_vec()
}

/// The value a header would be read as: visible ASCII (and tab), trimmed,
/// not empty; `None` when the header is absent or unreadable.
fn readable(value: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(value).ok()?;
    if !text
        .bytes()
        .all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
    {
        return None;
    }
    Some(text.trim()).filter(|t| !t.is_empty())
}

/// `headers` with each `(name, value)` whose value is a valid header value.
fn headers(pairs: &[(&'static str, &[u8])]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in pairs {
        if let Ok(value) = HeaderValue::from_bytes(value) {
            headers.insert(*name, value);
        }
    }
    headers
}

/// The largest Unix second the clock can hold (`SystemTime` on a 64-bit
/// `time_t`): a later timestamp is unreadable, not a panic.
const LAST_SECOND: u64 = i64::MAX as u64;

/// The model's answer for the Standard scheme, as a refusal code or `ok`.
fn model(id: &[u8], timestamp: &[u8], signature: &[u8], body: &[u8]) -> &'static str {
    let (Some(id), Some(ts), Some(sigs)) = (readable(id), readable(timestamp), readable(signature))
    else {
        return "missing_signature";
    };
    let seconds = match ts.parse::<u64>() {
        Ok(s) if s <= LAST_SECOND => s,
        _ => return "bad_timestamp",
    };
    if seconds.abs_diff(NOW) > TOLERANCE {
        return "timestamp_outside_tolerance";
    }
    let right = tag(&[id.as_bytes(), b".", ts.as_bytes(), b".", body]);
    let matches = sigs
        .split(' ')
        .filter_map(|entry| entry.strip_prefix("v1,"))
        .any(|b64| BASE64.decode(b64).is_ok_and(|t| t == right));
    if matches {
        "ok"
    } else {
        "signature_mismatch"
    }
}

fn code(result: &Result<(), Refusal>) -> &'static str {
    match result {
        Ok(()) => "ok",
        Err(refusal) => refusal.code(),
    }
}

/// Runs every check on `data`; returns the Standard scheme's answer to the
/// input as sent (`ok` or the refusal code). Panics when a check fails.
pub fn check(data: &[u8]) -> &'static str {
    let input = split(data);
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(NOW);
    let standard = standard();
    let sent = headers(&[
        ("webhook-id", input.id),
        ("webhook-timestamp", input.timestamp),
        ("webhook-signature", input.signature),
    ]);
    let answer = code(&standard.verify(&sent, input.body, now));
    let expected = model(input.id, input.timestamp, input.signature, input.body);
    assert_eq!(answer, expected, "as sent");

    // Signed right: only the timestamp (or an unreadable header) refuses it.
    if let (Some(id), Some(ts)) = (readable(input.id), readable(input.timestamp)) {
        let right = format!(
            "v1,{}",
            BASE64.encode(tag(&[id.as_bytes(), b".", ts.as_bytes(), b".", input.body]))
        );
        let signed = headers(&[
            ("webhook-id", input.id),
            ("webhook-timestamp", input.timestamp),
            ("webhook-signature", right.as_bytes()),
        ]);
        let answer = code(&standard.verify(&signed, input.body, now));
        assert_eq!(
            answer,
            model(input.id, input.timestamp, right.as_bytes(), input.body),
            "signed right"
        );
        assert_ne!(answer, "signature_mismatch", "signed right");
        assert_ne!(answer, "missing_signature", "signed right");
    }

    // The generic form: the signature line as its header.
    let right = tag(&[input.body]);
    let value = readable(input.signature);
    for (encoding, decode) in [
        (Encoding::Hex, decode_hex as fn(&str) -> Option<Vec<u8>>),
        (Encoding::Base64, |s: &str| BASE64.decode(s).ok()),
    ] {
        let answer = code(&generic(encoding).verify(
            &headers(&[(GENERIC_HEADER, input.signature)]),
            input.body,
            now,
        ));
        let expected = match value {
            None => "missing_signature",
            Some(v) => match v.strip_prefix(GENERIC_PREFIX).and_then(decode) {
                Some(t) if t == right => "ok",
                _ => "signature_mismatch",
            },
        };
        assert_eq!(answer, expected, "generic {encoding:?}");
    }
    expected
}

/// Hex digits (either case) to bytes, the model's own decoder.
fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}
