//! Fixtures (docs/CONTRACT.md §6): a JSON file with a profile, initial
//! objects, deliveries in arrival order (with their duplicates) and
//! authority snapshots, read by [`Fixture::load`] / [`Fixture::parse`];
//! [`crate::replay`] runs one through a [`crate::Receiver`], and
//! [`crate::authority::FixtureAuthority`] serves a fixture's snapshots to
//! reconciliation.

use crate::core::parse_rfc3339;
use crate::{AuthoritativeSnapshot, Profile};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::SystemTime;

/// Why a fixture could not be loaded. The message names the file (when there
/// is one) and what is wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FixtureError {
    /// The file could not be read.
    #[error("{path}: cannot read: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The text is not JSON, or not of the fixture shape.
    #[error("{path}: {message}")]
    Shape {
        /// The file (or `<input>`).
        path: String,
        /// What is wrong, with line and column when known.
        message: String,
    },
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FixtureFile {
    /// Optional: a built-in profile name or an inline profile object.
    #[serde(default)]
    profile: Option<serde_json::Value>,
    /// Optional: absent means no objects are known before the first delivery.
    #[serde(default)]
    initial_state: BTreeMap<String, InitialObject>,
    deliveries: Vec<FixtureDeliveryFile>,
    #[serde(default)]
    authority: Vec<AuthorityFile>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct InitialObject {
    version: u64,
    state: Box<serde_json::value::RawValue>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FixtureDeliveryFile {
    #[serde(default)]
    transport: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    body: Option<Box<serde_json::value::RawValue>>,
    #[serde(default)]
    raw: Option<String>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthorityFile {
    object_id: String,
    version: u64,
    state: Box<serde_json::value::RawValue>,
    as_of: String,
    /// docs/CONTRACT.md §4, *Force*: replace even a newer object.
    #[serde(default)]
    force: bool,
}

impl AuthorityFile {
    /// The snapshot; an error names the member (after `place`, for example
    /// `authority[0].`) and what is wrong with it.
    fn snapshot(self, place: &str) -> Result<AuthoritativeSnapshot, String> {
        let as_of = parse_rfc3339(&self.as_of)
            .ok_or_else(|| format!("{place}as_of: not an RFC 3339 time: {:?}", self.as_of))?;
        Ok(
            AuthoritativeSnapshot::new(&self.object_id, self.version, self.state.get(), as_of)
                .map_err(|e| format!("{place}state: {e}"))?
                .forced(self.force),
        )
    }
}

/// Parses one authoritative snapshot written as a JSON object, the shape of
/// a fixture's `authority` entries (docs/CONTRACT.md §6) and of each line of
/// `reconcile --snapshot`: `{"object_id": "card-7", "version": 14, "state":
/// {...}, "as_of": "2024-01-01T08:00:20Z", "force": false}`, `force`
/// optional (default `false`), nothing else allowed. `name` says where the
/// text came from (a file and line) in the error.
///
/// # Errors
/// [`FixtureError::Shape`] naming `name` and the problem: not JSON, not an
/// object, a missing or unknown member, a member of the wrong type (a
/// version that is not a u64 integer), an `as_of` that is not RFC 3339, a
/// state with a duplicate key.
pub fn parse_authority(text: &str, name: &str) -> Result<AuthoritativeSnapshot, FixtureError> {
    let shape = |message: String| FixtureError::Shape {
        path: name.to_owned(),
        message,
    };
    // As for a fixture: a derived struct also reads an array by position.
    if !text.trim_start().starts_with('{') {
        return Err(shape("not a JSON object".to_owned()));
    }
    let file: AuthorityFile =
        from_json(text).map_err(|e| shape(format!("not an authoritative snapshot: {e}")))?;
    file.snapshot("").map_err(shape)
}

/// `text` read as a `T`, as every fixture-shaped input is read (a fixture,
/// a `reconcile --snapshot` line, `serve`'s `POST /reconcile` body).
///
/// # Errors
/// What is wrong, naming the field it is in as a path from the top
/// (`initial_state.card-7.version`, `deliveries[3].raw`) before serde_json's
/// words and their line and column; text after the value is an error too.
pub fn from_json<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, String> {
    let mut reader = serde_json::Deserializer::from_str(text);
    let value = serde_path_to_error::deserialize(&mut reader).map_err(|e| {
        let path = e.path().to_string();
        match path.as_str() {
            "." => e.into_inner().to_string(),
            _ => format!("{path}: {}", e.into_inner()),
        }
    })?;
    reader.end().map_err(|e| e.to_string())?;
    Ok(value)
}

/// One delivery of a fixture: the body's exact bytes and when it was received.
#[derive(Clone, Debug)]
pub struct FixtureDelivery {
    /// The body's bytes (a `body` value's text as written, or a `raw` string).
    pub body: Vec<u8>,
    /// `transport.received_at`, when given: the replay clock for this delivery.
    pub received_at: Option<SystemTime>,
}

/// A fixture in the format of docs/CONTRACT.md §6.
#[derive(Clone, Debug)]
pub struct Fixture {
    /// The envelope profile the fixture's deliveries use (optional field
    /// `profile`: a built-in name or an inline profile; default `card`).
    pub profile: Option<Profile>,
    /// Initial objects: id, version, state JSON text, sorted by id.
    pub initial_state: Vec<(String, u64, String)>,
    /// Deliveries in arrival order.
    pub deliveries: Vec<FixtureDelivery>,
    /// Authoritative snapshots, applied in order after the deliveries.
    pub authority: Vec<AuthoritativeSnapshot>,
}

impl Fixture {
    /// Reads and validates a fixture file.
    ///
    /// # Errors
    /// [`FixtureError::Read`] when the file cannot be read,
    /// [`FixtureError::Shape`] when it is not a valid fixture.
    pub fn load(path: &Path) -> Result<Self, FixtureError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| FixtureError::Read {
            path: name.clone(),
            source,
        })?;
        Self::parse(&text, &name)
    }

    /// Parses fixture text (one leading UTF-8 byte order mark ignored);
    /// `name` is used in error messages.
    ///
    /// # Errors
    /// [`FixtureError::Shape`] naming the problem and where.
    pub fn parse(text: &str, name: &str) -> Result<Self, FixtureError> {
        let shape = |message: String| FixtureError::Shape {
            path: name.to_owned(),
            message,
        };
        // One leading UTF-8 byte order mark is ignored, as for a body (RFC
        // 8259 §8.1 lets a parser ignore it); editors on some systems add it.
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        // A derived struct also reads a JSON array (its members by position),
        // so anything but an object is refused before serde sees it.
        let first = text
            .trim_start_matches([' ', '\t', '\n', '\r'])
            .bytes()
            .next();
        if first != Some(b'{') {
            // Text that does not parse as JSON at all is named as such (a
            // first letter `t`, `f` or `n` is not yet a literal).
            let json = serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok();
            let found = match first {
                None => "nothing",
                Some(_) if !json => "text that is not JSON",
                Some(b'[') => "an array",
                Some(b'"') => "a string",
                Some(b'-' | b'0'..=b'9') => "a number",
                Some(b't' | b'f') => "a boolean",
                Some(b'n') => "null",
                Some(_) => "text that is not JSON",
            };
            return Err(shape(format!(
                "not a valid fixture: expected a JSON object, found {found}"
            )));
        }
        let file: FixtureFile =
            from_json(text).map_err(|e| shape(format!("not a valid fixture: {e}")))?;
        let profile = match file.profile {
            None => None,
            Some(serde_json::Value::String(name)) => {
                Some(Profile::named(&name).map_err(|e| shape(format!("profile: {e}")))?)
            }
            Some(inline) => Some(
                Profile::from_json(&inline.to_string())
                    .map_err(|e| shape(format!("profile: {e}")))?,
            ),
        };
        let initial_state = file
            .initial_state
            .into_iter()
            .map(|(id, o)| (id, o.version, o.state.get().to_owned()))
            .collect();
        let mut deliveries = Vec::with_capacity(file.deliveries.len());
        for (i, d) in file.deliveries.into_iter().enumerate() {
            let at = || format!("deliveries[{i}]");
            let body = match (d.body, d.raw) {
                (Some(body), None) => body.get().as_bytes().to_vec(),
                (None, Some(raw)) => raw.into_bytes(),
                _ => {
                    return Err(shape(format!(
                        "{}: needs exactly one of `body` or `raw`",
                        at()
                    )))
                }
            };
            let received_at = match d.transport.as_ref().and_then(|t| t.get("received_at")) {
                None => None,
                Some(serde_json::Value::String(s)) => Some(parse_rfc3339(s).ok_or_else(|| {
                    shape(format!(
                        "{}.transport.received_at: not an RFC 3339 time: {s:?}",
                        at()
                    ))
                })?),
                Some(other) => {
                    return Err(shape(format!(
                        "{}.transport.received_at: expected an RFC 3339 string, found {other}",
                        at()
                    )))
                }
            };
            deliveries.push(FixtureDelivery { body, received_at });
        }
        let authority = file
            .authority
            .into_iter()
            .enumerate()
            .map(|(i, a)| a.snapshot(&format!("authority[{i}].")).map_err(shape))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            profile,
            initial_state,
            deliveries,
            authority,
        })
    }

    /// The default replay clock: the latest authority `as_of` or
    /// `transport.received_at` in the fixture, so that a fixture decides the
    /// same way on any day. `None` when the fixture has neither.
    pub fn default_now(&self) -> Option<SystemTime> {
        self.authority
            .iter()
            .map(|a| a.as_of)
            .chain(self.deliveries.iter().filter_map(|d| d.received_at))
            .max()
    }
}
