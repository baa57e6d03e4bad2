//! Sender authentication for `POST /events`: HMAC-SHA256 webhook signatures,
//! checked on the raw body before the receiver sees it.
//!
//! Two forms:
//! - **Standard Webhooks** (the specification at standardwebhooks.com): the
//!   headers `webhook-id`, `webhook-timestamp` (Unix seconds) and
//!   `webhook-signature`, a space-separated list of `v1,<base64>` entries;
//!   the signed content is `{id}.{timestamp}.{body}`; a timestamp further
//!   than the tolerance from the clock, in either direction, is refused
//!   (replay protection). Any listed `v1` signature matching any configured
//!   secret passes, so a sender and a receiver can rotate secrets one at a
//!   time. Entries of other versions (`v1a`, asymmetric) are ignored.
//! - **Generic** (providers that sign the raw body their own way): one
//!   header whose value is an optional prefix (such as `sha256=`) followed by
//!   the HMAC-SHA256 of the body in hex or base64. It carries no timestamp,
//!   so it has no replay window of its own: a replayed body is decided by the
//!   receiver's event-identity registry (a `duplicate`).
//!
//! A secret written `whsec_<base64>` (the Standard Webhooks form) is keyed
//! with its base64-decoded bytes; in the generic form a secret without that
//! prefix is keyed with its bytes as given. Comparison is constant-time
//! (`Mac::verify_slice`).

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
        header: axum::http::HeaderName,
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
    /// `webhook-timestamp` is not an integer number of seconds.
    #[error("`webhook-timestamp` is not Unix seconds: {0:?}")]
    BadTimestamp(String),
    /// `webhook-timestamp` is further than the tolerance from the clock.
    #[error("`webhook-timestamp` is {off_by_seconds} s from this server's clock, beyond the tolerance of {tolerance_seconds} s")]
    OutsideTolerance {
        /// Distance from the clock in seconds (either direction).
        off_by_seconds: u64,
        /// The configured tolerance in seconds.
        tolerance_seconds: u64,
    },
    /// No signature in the header matches the body under any secret.
    #[error("no signature matches the body under any configured secret")]
    NoMatch,
}

impl Refusal {
    /// A stable snake_case name for the response and the metrics label.
    pub(crate) fn code(&self) -> &'static str {
        match self {
            Refusal::MissingHeader(_) => "missing_signature",
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
            let key = secret_key(secret, &scheme)
                .map_err(|e| format!("webhook secret #{}: {e}", i + 1))?;
            keys.push(
                HmacSha256::new_from_slice(&key)
                    .map_err(|e| format!("webhook secret #{}: {e}", i + 1))?,
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
        headers: &axum::http::HeaderMap,
        body: &[u8],
        now: SystemTime,
    ) -> Result<(), Refusal> {
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .ok_or_else(|| Refusal::MissingHeader(name.to_owned()))
        };
        match &self.scheme {
            Scheme::Standard { tolerance } => {
                let id = header(ID_HEADER)?;
                let timestamp = header(TIMESTAMP_HEADER)?;
                let signatures = header(SIGNATURE_HEADER)?;
                let seconds: u64 = timestamp
                    .parse()
                    .map_err(|_| Refusal::BadTimestamp(timestamp.to_owned()))?;
                let sent = SystemTime::UNIX_EPOCH + Duration::from_secs(seconds);
                let off = match now.duration_since(sent) {
                    Ok(behind) => behind,
                    Err(ahead) => ahead.duration(),
                };
                if off > *tolerance {
                    return Err(Refusal::OutsideTolerance {
                        off_by_seconds: off.as_secs(),
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
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    digits
        .chunks(2)
        .map(|pair| Some(nibble(pair[0])? << 4 | nibble(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderMap, HeaderValue};

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    /// The example of the Standard Webhooks specification's reference
    /// libraries: this secret, id, timestamp and body give this signature.
    #[test]
    fn the_specification_example_verifies() {
        let verifier = Verifier::new(
            Scheme::Standard {
                tolerance: Duration::from_secs(300),
            },
            &[SECRET.to_owned()],
        )
        .unwrap();
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
        let body = br#"{"test": 2432232314}"#;
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1614265330);
        assert_eq!(verifier.verify(&headers, body, at), Ok(()));
        // Six minutes later (tolerance five): refused, either direction.
        let later = at + Duration::from_secs(360);
        assert_eq!(
            verifier.verify(&headers, body, later),
            Err(Refusal::OutsideTolerance {
                off_by_seconds: 360,
                tolerance_seconds: 300
            })
        );
        let earlier = at - Duration::from_secs(301);
        assert_eq!(
            verifier.verify(&headers, body, earlier).unwrap_err().code(),
            "timestamp_outside_tolerance"
        );
        // One byte of the body changed.
        assert_eq!(
            verifier.verify(&headers, br#"{"test": 2432232315}"#, at),
            Err(Refusal::NoMatch)
        );
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
            header: axum::http::HeaderName::from_static("x-signature"),
            encoding: Encoding::Hex,
            prefix: String::new(),
        };
        assert_eq!(secret_key("plain", &generic).unwrap(), b"plain");
        assert_eq!(decode_hex("0aFf"), Some(vec![0x0a, 0xff]));
        assert_eq!(decode_hex("0aF"), None);
        assert_eq!(decode_hex("zz"), None);
    }
}
