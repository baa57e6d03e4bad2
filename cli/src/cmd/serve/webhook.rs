//! Sender authentication for `POST /events`: HMAC-SHA256 webhook signatures,
//! checked on the raw body before the receiver sees it.
//!
//! Two forms:
//! - **Standard Webhooks** (the specification at standardwebhooks.com): the
//!   headers `webhook-id`, `webhook-timestamp` (Unix seconds) and
//!   `webhook-signature`, a space-separated list of `v1,<base64>` entries;
//!   the signed content is `{id}.{timestamp}.{body}`; a timestamp further
//!   than the tolerance from the clock, in either direction, is refused
//!   (replay protection). The distance is counted from the clock's instant,
//!   fractions of a second included, as the Python and Go Standard
//!   Webhooks libraries count it (the JavaScript one rounds the clock down
//!   to its second, and accepts a timestamp up to a second older): exactly the tolerance off is accepted, any fraction past it
//!   refused, the message naming the distance to the millisecond. Any listed `v1` signature matching any configured
//!   secret passes, so a sender and a receiver can rotate secrets one at a
//!   time. Entries of other versions (`v1a`, asymmetric) are ignored.
//!   Svix, the most common sender of this scheme, names the same three
//!   headers `svix-id`, `svix-timestamp` and `svix-signature`; they are
//!   read the same way. A request carries one set: a request with any
//!   `webhook-*` header and any `svix-*` header of the three is refused
//!   (`mixed_signature_headers`), whatever their values, so that no
//!   signature can be checked over an id or a timestamp taken from the
//!   other set. (Svix's own libraries take each `svix-*` header over its
//!   `webhook-*` twin one by one; a sender sends one set, and a request
//!   carrying both was made by something else.)
//! - Each header the scheme reads is sent once: a second `webhook-id`,
//!   `webhook-timestamp` or `webhook-signature` line (or Svix's, or the
//!   generic header) is refused (`repeated_signature_header`) rather than
//!   one of them read, so no signature is checked over a value that a
//!   proxy or a framework reading the other line would not see.
//! - **Generic** (providers that sign the raw body their own way): one
//!   header whose value is an optional prefix (such as `sha256=`) followed by
//!   the HMAC-SHA256 of the body in hex or base64. It carries no timestamp,
//!   so it has no replay window of its own: a replayed body is decided by the
//!   receiver's event-identity registry (a `duplicate`).
//!
//! A secret written `whsec_<base64>` (the Standard Webhooks form) is keyed
//! with its base64-decoded bytes; in the generic form a secret without that
//! prefix is keyed with its bytes as given. Comparison is constant-time
//! (`Mac::verify_slice`) and over the whole 32-byte digest: a tag of any
//! other length (a truncated one included) never matches.
//!
//! Every value here comes from an unauthenticated client: nothing panics on
//! any header or body (checked arithmetic only; a timestamp beyond what the
//! clock can represent is `bad_timestamp`). The fuzz target `webhook`
//! (fuzz/src/webhook.rs) compiles this file by its path, as the test suite
//! does, so it names only external crates (no `crate::` or `super::`).

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use hmac::{KeyInit, Mac};
use std::time::{Duration, SystemTime};

/// HMAC-SHA256, the MAC both forms use.
type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// The Standard Webhooks header carrying the message id.
pub(crate) const ID_HEADER: &str = "webhook-id";
/// The Standard Webhooks header carrying the send time (Unix seconds).
pub(crate) const TIMESTAMP_HEADER: &str = "webhook-timestamp";
/// The Standard Webhooks header carrying the signatures.
pub(crate) const SIGNATURE_HEADER: &str = "webhook-signature";
/// Svix's name for [`ID_HEADER`].
pub(crate) const SVIX_ID_HEADER: &str = "svix-id";
/// Svix's name for [`TIMESTAMP_HEADER`].
pub(crate) const SVIX_TIMESTAMP_HEADER: &str = "svix-timestamp";
/// Svix's name for [`SIGNATURE_HEADER`].
pub(crate) const SVIX_SIGNATURE_HEADER: &str = "svix-signature";

/// The Standard Webhooks names and Svix's, in the same order.
const HEADER_SETS: [[&str; 3]; 2] = [
    [ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADER],
    [SVIX_ID_HEADER, SVIX_TIMESTAMP_HEADER, SVIX_SIGNATURE_HEADER],
];

/// Which set of names a Standard Webhooks request uses: the one it has any
/// header of (`webhook-*` when it has none, so that the refusal names the
/// specification's header).
///
/// # Errors
/// [`Refusal::MixedHeaders`] when it has headers of both sets.
fn header_set(headers: &http::HeaderMap) -> Result<&'static [&'static str; 3], Refusal> {
    let [standard, svix] = HEADER_SETS
        .each_ref()
        .map(|set| set.iter().any(|name| headers.contains_key(*name)));
    match (standard, svix) {
        (true, true) => Err(Refusal::MixedHeaders),
        (false, true) => Ok(&HEADER_SETS[1]),
        _ => Ok(&HEADER_SETS[0]),
    }
}

/// The id of a Standard Webhooks request under either set of names (for
/// the request's log span), `None` when it has none.
pub(crate) fn message_id(headers: &http::HeaderMap) -> Option<&str> {
    headers
        .get(ID_HEADER)
        .or_else(|| headers.get(SVIX_ID_HEADER))
        .and_then(|v| v.to_str().ok())
}

/// How the generic form encodes the MAC in its header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Encoding {
    // Lowercase or uppercase hexadecimal (GitHub, Shopify-like "sha256=..." headers).
    Hex,
    // Standard base64 with padding.
    Base64,
}

/// Which signature form the sender uses.
#[derive(Clone, Debug)]
pub(crate) enum Scheme {
    /// Standard Webhooks, with the timestamp tolerance (both directions).
    Standard {
        /// How far `webhook-timestamp` may be from the clock.
        tolerance: Duration,
    },
    /// One header holding `prefix` + the body's MAC in `encoding`.
    Generic {
        /// The header name, lowercase.
        header: http::HeaderName,
        /// How the MAC is written.
        encoding: Encoding,
        /// Text before the MAC (for example `sha256=`), possibly empty.
        prefix: String,
    },
}

/// Why a request's signature was refused (HTTP 401; nothing is recorded).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    /// A header the scheme needs is absent or not visible ASCII.
    #[error("missing or unreadable `{0}` header")]
    MissingHeader(String),
    /// A header the scheme reads is sent more than once.
    #[error("the `{0}` header is sent more than once: a sender sends it once")]
    RepeatedHeader(String),
    /// Both `webhook-*` and `svix-*` signature headers are present.
    #[error("both `webhook-*` and `svix-*` signature headers are present: a sender sends one set")]
    MixedHeaders,
    /// `webhook-timestamp` is not an integer number of seconds.
    #[error("`webhook-timestamp` is not Unix seconds: {0:?}")]
    BadTimestamp(String),
    /// `webhook-timestamp` is further than the tolerance from the clock.
    #[error("`webhook-timestamp` is {} s from this server's clock, beyond the tolerance of {tolerance_seconds} s", seconds_text(*.off_by))]
    OutsideTolerance {
        /// How far the timestamp is from the clock's instant (either
        /// direction), fractions of a second included.
        off_by: Duration,
        /// The configured tolerance in seconds.
        tolerance_seconds: u64,
    },
    /// No signature in the header matches the body under any secret.
    #[error("no signature matches the body under any configured secret")]
    NoMatch,
}

/// `d` in seconds as a refusal names it: whole seconds as an integer
/// (`301`), otherwise to the millisecond (`300.001`).
fn seconds_text(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        d.as_secs().to_string()
    } else {
        format!("{:.3}", d.as_secs_f64())
    }
}

impl Refusal {
    /// A stable snake_case name for the response and the metrics label.
    pub(crate) fn code(&self) -> &'static str {
        match self {
            Refusal::MissingHeader(_) => "missing_signature",
            Refusal::RepeatedHeader(_) => "repeated_signature_header",
            Refusal::MixedHeaders => "mixed_signature_headers",
            Refusal::BadTimestamp(_) => "bad_timestamp",
            Refusal::OutsideTolerance { .. } => "timestamp_outside_tolerance",
            Refusal::NoMatch => "signature_mismatch",
        }
    }
}

/// Checks signatures of one scheme against one or more secrets.
#[derive(Clone)]
pub(crate) struct Verifier {
    /// The form the sender signs in.
    scheme: Scheme,
    /// One keyed MAC per secret, cloned per check: keying hashes the key
    /// once at start instead of on every request.
    keys: Vec<HmacSha256>,
}

/// Decodes one secret into HMAC key bytes: `whsec_<base64>` decoded, or
/// (generic form only) the text's own bytes.
///
/// # Errors
/// A message naming the problem (never the secret itself).
pub(crate) fn secret_key(secret: &str, scheme: &Scheme) -> Result<Vec<u8>, String> {
    let key = match secret.strip_prefix("whsec_") {
        Some(encoded) => BASE64
            .decode(encoded.trim())
            .map_err(|e| format!("a `whsec_` secret must be base64 after the prefix ({e})"))?,
        None if matches!(scheme, Scheme::Standard { .. }) => return Err(
            "a Standard Webhooks secret is written `whsec_<base64>` (the form the sender shows)"
                .to_owned(),
        ),
        None => secret.as_bytes().to_vec(),
    };
    if key.is_empty() {
        return Err("the secret is empty".to_owned());
    }
    Ok(key)
}

impl Verifier {
    /// A verifier for `scheme` accepting a signature made with any of `secrets`.
    ///
    /// # Errors
    /// A message saying which secret (by position, 1-based) is unusable.
    pub(crate) fn new(scheme: Scheme, secrets: &[String]) -> Result<Self, String> {
        let mut keys = Vec::with_capacity(secrets.len());
        for (i, secret) in secrets.iter().enumerate() {
            let position = i.saturating_add(1);
            let key = secret_key(secret, &scheme)
                .map_err(|e| format!("webhook secret #{position}: {e}"))?;
            keys.push(
                HmacSha256::new_from_slice(&key)
                    .map_err(|e| format!("webhook secret #{position}: {e}"))?,
            );
        }
        Ok(Self { scheme, keys })
    }

    /// The scheme, for the start-up line.
    pub(crate) fn scheme(&self) -> &Scheme {
        &self.scheme
    }

    /// How many secrets are accepted.
    pub(crate) fn secrets(&self) -> usize {
        self.keys.len()
    }

    /// Checks the request's signature over `body` at clock reading `now`.
    ///
    /// # Errors
    /// The [`Refusal`]: the request must be answered 401 and not recorded.
    pub(crate) fn verify(
        &self,
        headers: &http::HeaderMap,
        body: &[u8],
        now: SystemTime,
    ) -> Result<(), Refusal> {
        let header = |name: &str| {
            let mut lines = headers.get_all(name).iter();
            let first = lines.next();
            if lines.next().is_some() {
                return Err(Refusal::RepeatedHeader(name.to_owned()));
            }
            first
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .ok_or_else(|| Refusal::MissingHeader(name.to_owned()))
        };
        match &self.scheme {
            Scheme::Standard { tolerance } => {
                let [id_name, timestamp_name, signature_name] = header_set(headers)?;
                let id = header(id_name)?;
                let timestamp = header(timestamp_name)?;
                let signatures = header(signature_name)?;
                let seconds: u64 = timestamp
                    .parse()
                    .map_err(|_| Refusal::BadTimestamp(timestamp.to_owned()))?;
                // Seconds past what the clock can represent (from 2^63 on
                // with a 64-bit `time_t`) cannot be within any tolerance.
                if SystemTime::UNIX_EPOCH
                    .checked_add(Duration::from_secs(seconds))
                    .is_none()
                {
                    return Err(Refusal::BadTimestamp(timestamp.to_owned()));
                }
                // From the clock's instant, fractions included, as the
                // Python and Go libraries count (a clock before 1970 reads
                // as the epoch).
                let now_since = now
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap_or(Duration::ZERO);
                let stamped = Duration::from_secs(seconds);
                let off_by = now_since.abs_diff(stamped);
                if off_by > *tolerance {
                    return Err(Refusal::OutsideTolerance {
                        off_by,
                        tolerance_seconds: tolerance.as_secs(),
                    });
                }
                let candidates: Vec<Vec<u8>> = signatures
                    .split(' ')
                    .filter_map(|entry| entry.strip_prefix("v1,"))
                    .filter_map(|b64| BASE64.decode(b64).ok())
                    .collect();
                self.any_matches(&candidates, |mac| feed_standard(mac, id, timestamp, body))
            }
            Scheme::Generic {
                header: name,
                encoding,
                prefix,
            } => {
                let value = header(name.as_str())?;
                let Some(encoded) = value.strip_prefix(prefix.as_str()) else {
                    return Err(Refusal::NoMatch);
                };
                let decoded = match encoding {
                    Encoding::Hex => decode_hex(encoded),
                    Encoding::Base64 => BASE64.decode(encoded).ok(),
                };
                let candidates: Vec<Vec<u8>> = decoded.into_iter().collect();
                self.any_matches(&candidates, |mac| mac.update(body))
            }
        }
    }

    /// Whether any candidate tag is the MAC of the content `feed` writes,
    /// under any key; every comparison is constant-time.
    fn any_matches(
        &self,
        candidates: &[Vec<u8>],
        feed: impl Fn(&mut HmacSha256),
    ) -> Result<(), Refusal> {
        if candidates.is_empty() {
            return Err(Refusal::NoMatch);
        }
        for key in &self.keys {
            let mut mac = key.clone();
            feed(&mut mac);
            for tag in candidates {
                if mac.clone().verify_slice(tag).is_ok() {
                    return Ok(());
                }
            }
        }
        Err(Refusal::NoMatch)
    }
}

/// Writes the content Standard Webhooks signs, `{id}.{timestamp}.{body}`,
/// into `mac`: the one definition the verifier checks and `sign` signs.
fn feed_standard(mac: &mut HmacSha256, id: &str, timestamp: &str, body: &[u8]) {
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
}

/// The `webhook-signature` value a Standard Webhooks sender puts on `body`
/// sent as message `id` at `timestamp` (Unix seconds, as text):
/// `v1,<base64 of HMAC-SHA256>` keyed with the `whsec_` secret's bytes.
///
/// # Errors
/// The secret's problem, as [`secret_key`] says it.
pub(crate) fn standard_signature(
    secret: &str,
    id: &str,
    timestamp: &str,
    body: &[u8],
) -> Result<String, String> {
    let key = secret_key(
        secret,
        &Scheme::Standard {
            tolerance: Duration::ZERO,
        },
    )?;
    let mut mac = HmacSha256::new_from_slice(&key).map_err(|e| e.to_string())?;
    feed_standard(&mut mac, id, timestamp, body);
    Ok(format!("v1,{}", BASE64.encode(mac.finalize().into_bytes())))
}

/// Hex text to bytes (either case); `None` when it is not an even number of
/// hex digits.
fn decode_hex(text: &str) -> Option<Vec<u8>> {
    let digits = text.as_bytes();
    if !digits.len().is_multiple_of(2) {
        return None;
    }
    digits
        .chunks_exact(2)
        .map(|pair| {
            // `from_str_radix` alone would take a sign (`+f`).
            if !pair.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue};

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    /// The specification example's body.
    const EXAMPLE_BODY: &[u8] = br#"{"test": 2432232314}"#;

    /// The specification example's signing time (its `webhook-timestamp`).
    fn example_time() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1614265330)
    }

    /// A Standard Webhooks verifier of [`SECRET`], tolerance five minutes.
    fn standard_verifier() -> Verifier {
        Verifier::new(
            Scheme::Standard {
                tolerance: Duration::from_secs(300),
            },
            &[SECRET.to_owned()],
        )
        .unwrap()
    }

    /// The example of the Standard Webhooks specification's reference
    /// libraries: this secret, id, timestamp and body give this signature.
    #[test]
    fn the_specification_example_verifies() {
        let verifier = standard_verifier();
        let mut headers = HeaderMap::new();
        headers.insert(
            ID_HEADER,
            HeaderValue::from_static("msg_p5jXN8AQM9LWM0D4loKWxJek"),
        );
        headers.insert(TIMESTAMP_HEADER, HeaderValue::from_static("1614265330"));
        headers.insert(
            SIGNATURE_HEADER,
            HeaderValue::from_static("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="),
        );
        let body = EXAMPLE_BODY;
        let at = example_time();
        assert_eq!(verifier.verify(&headers, body, at), Ok(()));
        // Six minutes later (tolerance five): refused, either direction.
        let later = at + Duration::from_secs(360);
        assert_eq!(
            verifier.verify(&headers, body, later),
            Err(Refusal::OutsideTolerance {
                off_by: Duration::from_secs(360),
                tolerance_seconds: 300
            })
        );
        let earlier = at - Duration::from_secs(301);
        assert_eq!(
            verifier.verify(&headers, body, earlier).unwrap_err().code(),
            "timestamp_outside_tolerance"
        );
        // Exactly the tolerance off, either way: accepted. Past it by any
        // fraction of a second: refused, as the Python and Go Standard
        // Webhooks libraries refuse it (`timestamp < now - tolerance` on
        // the clock's instant), naming the distance to the millisecond.
        for now in [at + Duration::from_secs(300), at - Duration::from_secs(300)] {
            assert_eq!(verifier.verify(&headers, body, now), Ok(()), "{now:?}");
        }
        let refusal = |off_by| Refusal::OutsideTolerance {
            off_by,
            tolerance_seconds: 300,
        };
        for (now, off_by) in [
            (
                at + Duration::from_millis(300_001),
                Duration::from_millis(300_001),
            ),
            (
                at - Duration::from_millis(300_001),
                Duration::from_millis(300_001),
            ),
            (at + Duration::from_secs(301), Duration::from_secs(301)),
        ] {
            assert_eq!(
                verifier.verify(&headers, body, now),
                Err(refusal(off_by)),
                "{now:?}"
            );
        }
        assert_eq!(
            refusal(Duration::from_secs(301)).to_string(),
            "`webhook-timestamp` is 301 s from this server's clock, beyond the tolerance of 300 s"
        );
        assert_eq!(
            refusal(Duration::from_millis(300_001)).to_string(),
            "`webhook-timestamp` is 300.001 s from this server's clock, beyond the tolerance of 300 s"
        );
        // One byte of the body changed.
        assert_eq!(
            verifier.verify(&headers, br#"{"test": 2432232315}"#, at),
            Err(Refusal::NoMatch)
        );
    }

    /// The specification example's headers under `names` (a [`HEADER_SETS`] entry).
    fn example_headers(names: &[&'static str; 3]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        let values = [
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            "1614265330",
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
        ];
        for (name, value) in names.iter().zip(values) {
            headers.insert(*name, HeaderValue::from_static(value));
        }
        headers
    }

    /// Svix's header names carry the same scheme; a request with headers of
    /// both sets is refused, even when each set alone would verify.
    #[test]
    fn svix_header_names_and_no_mix() {
        let verifier = standard_verifier();
        let body = EXAMPLE_BODY;
        let at = example_time();
        let svix = example_headers(&HEADER_SETS[1]);
        assert_eq!(verifier.verify(&svix, body, at), Ok(()));
        assert_eq!(message_id(&svix), Some("msg_p5jXN8AQM9LWM0D4loKWxJek"));
        // A svix set missing one header names the svix header.
        let mut partial = svix.clone();
        partial.remove(SVIX_TIMESTAMP_HEADER);
        assert_eq!(
            verifier.verify(&partial, body, at),
            Err(Refusal::MissingHeader("svix-timestamp".to_owned()))
        );
        // Both complete sets, or one header of the other set: refused.
        for (i, extra) in HEADER_SETS[0].iter().enumerate() {
            let mut mixed = svix.clone();
            mixed.insert(*extra, example_headers(&HEADER_SETS[0])[*extra].clone());
            assert_eq!(
                verifier.verify(&mixed, body, at),
                Err(Refusal::MixedHeaders)
            );
            let mut mixed = example_headers(&HEADER_SETS[0]);
            mixed.insert(HEADER_SETS[1][i], svix[HEADER_SETS[1][i]].clone());
            assert_eq!(
                verifier.verify(&mixed, body, at).unwrap_err().code(),
                "mixed_signature_headers"
            );
        }
        let mut both = svix.clone();
        both.extend(example_headers(&HEADER_SETS[0]));
        assert_eq!(verifier.verify(&both, body, at), Err(Refusal::MixedHeaders));
    }

    /// Issue 37: a second line of any header the scheme reads is refused,
    /// naming it, whether it repeats the first value or not and whichever
    /// line holds the right value (a second `webhook-id` was read as its
    /// first line's value).
    #[test]
    fn a_header_sent_twice_is_refused_naming_it() {
        let standard = standard_verifier();
        let body = EXAMPLE_BODY;
        let at = example_time();
        for names in &HEADER_SETS {
            let good = example_headers(names);
            assert_eq!(standard.verify(&good, body, at), Ok(()));
            for name in names {
                for second in [good[*name].clone(), HeaderValue::from_static("msg_other")] {
                    for good_first in [true, false] {
                        let mut twice = good.clone();
                        if good_first {
                            twice.append(*name, second.clone());
                        } else {
                            twice.insert(*name, second.clone());
                            twice.append(*name, good[*name].clone());
                        }
                        assert_eq!(
                            standard.verify(&twice, body, at),
                            Err(Refusal::RepeatedHeader((*name).to_owned())),
                            "{name}: {second:?}, the right one first: {good_first}"
                        );
                    }
                }
            }
        }
        let refusal = Refusal::RepeatedHeader("webhook-id".to_owned());
        assert_eq!(refusal.code(), "repeated_signature_header");
        assert_eq!(
            refusal.to_string(),
            "the `webhook-id` header is sent more than once: a sender sends it once"
        );
        // The generic form's header too.
        let generic = Verifier::new(
            Scheme::Generic {
                header: http::HeaderName::from_static("x-signature"),
                encoding: Encoding::Hex,
                prefix: "sha256=".to_owned(),
            },
            &[SECRET.to_owned()],
        )
        .unwrap();
        let key = secret_key(SECRET, generic.scheme()).unwrap();
        let mut mac = HmacSha256::new_from_slice(&key).unwrap();
        mac.update(body);
        let tag = format!("sha256={}", hex(&mac.finalize().into_bytes()));
        let mut headers = HeaderMap::new();
        headers.insert("x-signature", HeaderValue::from_str(&tag).unwrap());
        assert_eq!(generic.verify(&headers, body, at), Ok(()));
        headers.append("x-signature", HeaderValue::from_str(&tag).unwrap());
        assert_eq!(
            generic.verify(&headers, body, at),
            Err(Refusal::RepeatedHeader("x-signature".to_owned()))
        );
    }

    /// The lengths a tag is tried at besides the digest's 32 bytes: empty,
    /// one byte, half, one short, one over.
    const WRONG_LENGTHS: [usize; 5] = [0, 1, 16, 31, 33];

    /// The correct tag cut to `len` bytes from the left (its first bytes,
    /// what a MAC compared on the sender's length would accept) or from the
    /// right, or lengthened by one byte.
    fn cut(tag: &[u8], len: usize, from_left: bool) -> Vec<u8> {
        match len.checked_sub(tag.len()) {
            Some(extra) => [tag, &vec![0x5a; extra]].concat(),
            None if from_left => tag[..len].to_vec(),
            None => tag[tag.len() - len..].to_vec(),
        }
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// A tag of any length but the full digest is refused, in the Standard
    /// Webhooks form and in the generic form in hex and in base64; the full
    /// tag passes. This is the test that the whole tag is compared (the
    /// comparison's constant time is `verify_slice`'s, over 32 bytes).
    #[test]
    fn a_tag_of_any_other_length_is_refused() {
        let at = example_time();
        let body = EXAMPLE_BODY;
        let key = BASE64.decode(&SECRET["whsec_".len()..]).unwrap();
        let full = |content: &[u8]| {
            let mut mac = HmacSha256::new_from_slice(&key).unwrap();
            mac.update(content);
            mac.finalize().into_bytes().to_vec()
        };
        let standard = standard_verifier();
        let signed = full(b"msg_p5jXN8AQM9LWM0D4loKWxJek.1614265330.{\"test\": 2432232314}");
        assert_eq!(signed.len(), 32);
        let generic = |encoding| {
            Verifier::new(
                Scheme::Generic {
                    header: http::HeaderName::from_static("x-signature"),
                    encoding,
                    prefix: "sha256=".to_owned(),
                },
                &[SECRET.to_owned()],
            )
            .unwrap()
        };
        let (hex_form, base64_form) = (generic(Encoding::Hex), generic(Encoding::Base64));
        let body_tag = full(body);
        for len in WRONG_LENGTHS.into_iter().chain([32]) {
            for from_left in [true, false] {
                let expected = if len == 32 {
                    Ok(())
                } else {
                    Err(Refusal::NoMatch)
                };
                let case = format!(
                    "{len} bytes, cut from the {}",
                    if from_left { "left" } else { "right" }
                );
                let mut headers = example_headers(&HEADER_SETS[0]);
                let tag = BASE64.encode(cut(&signed, len, from_left));
                headers.insert(SIGNATURE_HEADER, format!("v1,{tag}").parse().unwrap());
                assert_eq!(
                    standard.verify(&headers, body, at),
                    expected,
                    "standard, {case}"
                );
                for (verifier, text) in [
                    (&hex_form, hex(&cut(&body_tag, len, from_left))),
                    (&base64_form, BASE64.encode(cut(&body_tag, len, from_left))),
                ] {
                    let mut headers = HeaderMap::new();
                    headers.insert("x-signature", format!("sha256={text}").parse().unwrap());
                    assert_eq!(
                        verifier.verify(&headers, body, at),
                        expected,
                        "generic {text:?}, {case}"
                    );
                }
            }
        }
    }

    /// `sign`'s signature of the specification example is the
    /// specification's signature.
    #[test]
    fn the_specification_example_signs() {
        assert_eq!(
            standard_signature(
                SECRET,
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                "1614265330",
                br#"{"test": 2432232314}"#
            ),
            Ok("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=".to_owned())
        );
        assert_eq!(
            standard_signature("plain", "i", "1", b"{}"),
            Err("a Standard Webhooks secret is written `whsec_<base64>` (the form the sender shows)".to_owned())
        );
    }

    #[test]
    fn secrets_and_hex() {
        let standard = Scheme::Standard {
            tolerance: Duration::from_secs(1),
        };
        assert!(secret_key("plain", &standard).is_err());
        assert!(secret_key("whsec_", &standard).is_err());
        assert!(secret_key("whsec_!!", &standard).is_err());
        assert_eq!(secret_key("whsec_YWJj", &standard).unwrap(), b"abc");
        let generic = Scheme::Generic {
            header: http::HeaderName::from_static("x-signature"),
            encoding: Encoding::Hex,
            prefix: String::new(),
        };
        assert_eq!(secret_key("plain", &generic).unwrap(), b"plain");
        assert_eq!(decode_hex("0aFf"), Some(vec![0x0a, 0xff]));
        assert_eq!(decode_hex("0aF"), None);
        assert_eq!(decode_hex("zz"), None);
    }
}
