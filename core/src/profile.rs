//! Envelope profiles: a declarative mapping from a provider's payload to the
//! envelope fields the rules need (event identity, object identity, version,
//! type, state), with JSON Pointers (RFC 6901), so that other webhook shapes
//! work without code.
//!
//! Built in: `card` (the docs/CONTRACT.md §2 envelope, the default), `shipment`
//! (tenant-scoped identities, the revision in either of two places) and
//! `generic` (`id`, `data.object.id`, a version pointer chosen by the user).

use crate::canon::{self, CanonError, Member};
use serde::Deserialize;
use std::fmt;
use std::sync::Arc;

/// A JSON Pointer (RFC 6901) into a payload. Only object members are
/// followed (array indexes are not supported).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pointer {
    /// The pointer as written, for error messages.
    text: String,
    /// Its reference tokens, unescaped (`~1` → `/`, `~0` → `~`).
    segments: Vec<String>,
}

impl Pointer {
    /// Parses a pointer such as `/data/object/id`.
    ///
    /// # Errors
    /// [`ProfileError`] when it is empty or does not start with `/`.
    pub fn parse(text: &str) -> Result<Self, ProfileError> {
        let Some(rest) = text.strip_prefix('/') else {
            return Err(ProfileError(format!(
                "pointer {text:?} must start with '/' (RFC 6901)"
            )));
        };
        let mut segments = Vec::new();
        for raw in rest.split('/') {
            // RFC 6901: `~` only as `~0` or `~1`.
            let escapes_ok = raw
                .match_indices('~')
                .all(|(i, _)| matches!(raw.as_bytes().get(i + 1), Some(b'0' | b'1')));
            if !escapes_ok {
                return Err(ProfileError(format!(
                    "pointer {text:?} has a `~` not followed by 0 or 1 (RFC 6901)"
                )));
            }
            segments.push(raw.replace("~1", "/").replace("~0", "~"));
        }
        Ok(Self {
            text: text.to_owned(),
            segments,
        })
    }

    /// The pointer as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for Pointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// A profile that could not be loaded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ProfileError(pub String);

/// How to read the envelope fields out of a payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    /// The profile's name, for messages.
    pub name: String,
    /// Event identity: one pointer, or several whose string values are
    /// joined with `/` (each part with `%` and `/` percent-escaped), e.g.
    /// tenant + event id, so identities of different tenants never collide.
    pub event_id: Vec<Pointer>,
    /// Object (resource) identity, composed the same way.
    pub object_id: Vec<Pointer>,
    /// Where the version may be: any one of these; if several are present
    /// they must agree, else the version is invalid.
    pub version: Vec<Pointer>,
    /// Informational time (RFC 3339); never an ordering key.
    pub occurred_at: Option<Pointer>,
    /// The event type; `None`: every payload is a snapshot.
    pub event_type: Option<Pointer>,
    /// The complete state snapshot.
    pub state: Option<Pointer>,
    /// Types that carry a snapshot; empty with no `delete_types`: any type.
    pub types: Vec<String>,
    /// Types that delete the object: stored as a tombstone (state `null`).
    pub delete_types: Vec<String>,
    /// Whether an identity part may be a JSON integer as well as a string.
    /// Its decimal text is then the id, so `12` and `"12"` name the same
    /// object (and the same event) and fingerprint alike. Only digits are
    /// accepted: a sign, fraction or exponent (`-12`, `12.0`, `1e1`) leaves
    /// the body malformed, because those have no single text. Off for
    /// `card` and `generic`, on for `shipment`; `"integer_ids": true` in a
    /// profile file.
    pub integer_ids: bool,
    /// Whether an event for an object the receiver does not know creates
    /// it when it carries a valid version and a snapshot (a tombstone
    /// creates it deleted): decided `applied` and recorded as a creation,
    /// instead of `held` / `unknown_object` (docs/CONTRACT.md §3.2). Off for
    /// every built-in profile, as the contract's default;
    /// `"create_on_first_snapshot": true` in a profile file. For a receiver
    /// that starts with an empty store and has no other source of its
    /// objects (no initial state, no authority).
    pub create_on_first_snapshot: bool,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn pointers(self, field: &str) -> Result<Vec<Pointer>, ProfileError> {
        let list = match self {
            OneOrMany::One(p) => vec![p],
            OneOrMany::Many(ps) => ps,
        };
        if list.is_empty() {
            return Err(ProfileError(format!(
                "`{field}` needs at least one pointer"
            )));
        }
        list.iter().map(|p| Pointer::parse(p)).collect()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    name: String,
    event_id: OneOrMany,
    object_id: OneOrMany,
    version: OneOrMany,
    #[serde(default)]
    occurred_at: Option<String>,
    #[serde(default, rename = "type")]
    event_type: Option<String>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    types: Vec<String>,
    #[serde(default)]
    delete_types: Vec<String>,
    #[serde(default)]
    integer_ids: bool,
    #[serde(default)]
    create_on_first_snapshot: bool,
}

fn ptrs(list: &[&str]) -> Vec<Pointer> {
    list.iter()
        .map(|p| Pointer::parse(p).unwrap_or_else(|_| unreachable!("built-in pointer {p}")))
        .collect()
}

impl Profile {
    /// Whether object ids are scoped by tenant: composed of several parts
    /// (joined with `/`), the first being the tenant (`shipment`:
    /// `tenant_id/shipment.id`). The reconciler serves such tenants
    /// round-robin ([`crate::reconciler::tenant_of`]).
    pub fn tenant_scoped(&self) -> bool {
        self.object_id.len() > 1
    }

    /// The docs/CONTRACT.md §2 card envelope: `event_id`, `object_id`, `object_version`,
    /// `occurred_at`, `type` (`card.snapshot`; `card.deleted` deletes), `state`.
    pub fn card() -> Self {
        Self {
            name: "card".to_owned(),
            event_id: ptrs(&["/event_id"]),
            object_id: ptrs(&["/object_id"]),
            version: ptrs(&["/object_version"]),
            occurred_at: ptrs(&["/occurred_at"]).pop(),
            event_type: ptrs(&["/type"]).pop(),
            state: ptrs(&["/state"]).pop(),
            types: vec!["card.snapshot".to_owned()],
            delete_types: vec!["card.deleted".to_owned()],
            integer_ids: false,
            create_on_first_snapshot: false,
        }
    }

    /// Shipment webhooks: identities scoped by `tenant_id` (event
    /// `tenant_id/event_id`, object `tenant_id/shipment.id`), the revision in
    /// `shipment.revision` or `shipment_revision`, the state the `shipment`
    /// object. Carrier scan times inside it are data, never an order. Ids
    /// may be JSON integers ([`Profile::integer_ids`]).
    pub fn shipment() -> Self {
        Self {
            name: "shipment".to_owned(),
            event_id: ptrs(&["/tenant_id", "/event_id"]),
            object_id: ptrs(&["/tenant_id", "/shipment/id"]),
            version: ptrs(&["/shipment/revision", "/shipment_revision"]),
            occurred_at: ptrs(&["/occurred_at"]).pop(),
            event_type: ptrs(&["/type"]).pop(),
            state: ptrs(&["/shipment"]).pop(),
            types: vec!["shipment.updated".to_owned()],
            delete_types: vec!["shipment.deleted".to_owned()],
            // Shipment providers number their shipments (`"id": 450789469`).
            integer_ids: true,
            create_on_first_snapshot: false,
        }
    }

    /// Generic webhooks that carry `id`, `type` and `data.object` with an
    /// `id`; the version is at `version` (a pointer, for example
    /// `/data/object/version`). Every type is a snapshot.
    ///
    /// # Errors
    /// [`ProfileError`] for an invalid pointer.
    pub fn generic(version: &str) -> Result<Self, ProfileError> {
        Ok(Self {
            name: "generic".to_owned(),
            event_id: ptrs(&["/id"]),
            object_id: ptrs(&["/data/object/id"]),
            version: vec![Pointer::parse(version)?],
            occurred_at: None,
            event_type: ptrs(&["/type"]).pop(),
            state: ptrs(&["/data/object"]).pop(),
            types: Vec::new(),
            delete_types: Vec::new(),
            integer_ids: false,
            create_on_first_snapshot: false,
        })
    }

    /// A built-in profile by name: `card`, `shipment`, or `generic` (whose
    /// version pointer defaults to `/data/object/version`).
    ///
    /// # Errors
    /// [`ProfileError`] naming the known profiles.
    pub fn named(name: &str) -> Result<Self, ProfileError> {
        match name {
            "card" => Ok(Self::card()),
            "shipment" => Ok(Self::shipment()),
            "generic" => Self::generic("/data/object/version"),
            other => Err(ProfileError(format!(
                "unknown profile {other:?}: expected card, shipment or generic (or --profile-file)"
            ))),
        }
    }

    /// Reads a profile from its JSON form, for example
    /// `{"name": "orders", "event_id": "/id", "object_id": ["/shop", "/order/id"],
    ///   "version": "/order/revision", "type": "/type", "state": "/order",
    ///   "types": ["order.updated"], "delete_types": ["order.deleted"],
    ///   "integer_ids": true, "create_on_first_snapshot": true}`
    /// (`integer_ids` and `create_on_first_snapshot` are optional, default
    /// `false`).
    ///
    /// # Errors
    /// [`ProfileError`] naming the problem.
    pub fn from_json(text: &str) -> Result<Self, ProfileError> {
        let f: ProfileFile = serde_json::from_str(text)
            .map_err(|e| ProfileError(format!("not a valid profile: {e}")))?;
        let one = |p: Option<String>| p.as_deref().map(Pointer::parse).transpose();
        Ok(Self {
            name: f.name,
            event_id: f.event_id.pointers("event_id")?,
            object_id: f.object_id.pointers("object_id")?,
            version: f.version.pointers("version")?,
            occurred_at: one(f.occurred_at)?,
            event_type: one(f.event_type)?,
            state: one(f.state)?,
            types: f.types,
            delete_types: f.delete_types,
            integer_ids: f.integer_ids,
            create_on_first_snapshot: f.create_on_first_snapshot,
        })
    }

    /// What an event for an unknown object may do under this profile.
    pub fn unknown_objects(&self) -> crate::decision::UnknownObjectPolicy {
        if self.create_on_first_snapshot {
            crate::decision::UnknownObjectPolicy::CreateOnFirstSnapshot
        } else {
            crate::decision::UnknownObjectPolicy::Park
        }
    }

    /// Whether `event_type` is accepted; `Some(true)` for a delete.
    pub(crate) fn classify(&self, event_type: Option<&str>) -> Option<bool> {
        if self.event_type.is_none() || (self.types.is_empty() && self.delete_types.is_empty()) {
            return Some(false);
        }
        let t = event_type?;
        if self.delete_types.iter().any(|d| d == t) {
            Some(true)
        } else {
            self.types.iter().any(|s| s == t).then_some(false)
        }
    }
}

impl Default for Profile {
    fn default() -> Self {
        Self::card()
    }
}

/// Finds the member a pointer names; `Ok(None)` when a segment is absent or
/// a parent is not an object. `members` are the document's top-level members.
pub(crate) fn resolve<'a>(
    members: &[Member<'a>],
    pointer: &Pointer,
    max_depth: usize,
) -> Result<Option<Member<'a>>, CanonError> {
    let mut segments = pointer.segments.iter();
    let Some(first) = segments.next() else {
        return Ok(None);
    };
    let Some(mut current) = members.iter().find(|m| m.key == *first).cloned() else {
        return Ok(None);
    };
    for segment in segments {
        if current.kind != canon::Kind::Object {
            return Ok(None);
        }
        let inner = canon::parse_object(current.raw, max_depth)?;
        match inner.into_iter().find(|m| m.key == *segment) {
            Some(m) => current = m,
            None => return Ok(None),
        }
    }
    Ok(Some(current))
}

/// Joins the parts of a composite identity: `%` and `/` in a part are
/// percent-escaped, parts are joined with `/`.
pub(crate) fn compose(parts: &[std::borrow::Cow<'_, str>]) -> Arc<str> {
    if let [only] = parts {
        return Arc::from(only.as_ref());
    }
    let escaped: Vec<String> = parts
        .iter()
        .map(|p| p.replace('%', "%25").replace('/', "%2F"))
        .collect();
    Arc::from(escaped.join("/"))
}

#[cfg(all(test, not(snapshot_receiver_loom)))]
mod tests {
    use super::*;

    #[test]
    fn pointers_unescape_and_must_start_with_a_slash() {
        let p = Pointer::parse("/a~1b/c~0d").unwrap();
        assert_eq!(p.segments, ["a/b", "c~d"]);
        assert_eq!(
            Pointer::parse("data/id").unwrap_err().to_string(),
            "pointer \"data/id\" must start with '/' (RFC 6901)"
        );
        assert_eq!(
            Pointer::parse("/a/~2b").unwrap_err().to_string(),
            "pointer \"/a/~2b\" has a `~` not followed by 0 or 1 (RFC 6901)"
        );
        assert!(Pointer::parse("/a~").is_err());
    }

    #[test]
    fn resolve_follows_objects_only() {
        let text = r#"{"data":{"object":{"id":"o-1","n":[1]}},"x":1}"#;
        let members = canon::parse_object(text, 8).unwrap();
        let get = |p: &str| {
            resolve(&members, &Pointer::parse(p).unwrap(), 8)
                .unwrap()
                .map(|m| m.raw)
        };
        assert_eq!(get("/data/object/id"), Some("\"o-1\""));
        assert_eq!(get("/data/object/n"), Some("[1]"));
        assert_eq!(get("/data/missing"), None);
        assert_eq!(get("/x/y"), None);
    }

    #[test]
    fn composite_ids_cannot_collide() {
        let c = |a: &str, b: &str| compose(&[a.into(), b.into()]);
        assert_eq!(&*c("acme", "SHP-1"), "acme/SHP-1");
        assert_ne!(c("a/b", "c"), c("a", "b/c"));
        assert_eq!(&*c("a/b", "c"), "a%2Fb/c");
    }

    #[test]
    fn profile_files() {
        let p = Profile::from_json(
            r#"{"name":"orders","event_id":"/id","object_id":["/shop","/order/id"],
                "version":"/order/revision","type":"/type","state":"/order","types":["order.updated"]}"#,
        )
        .unwrap();
        assert_eq!(p.object_id.len(), 2);
        assert!(!p.integer_ids, "off unless the file says so");
        assert_eq!(p.classify(Some("order.updated")), Some(false));
        let numbered = Profile::from_json(
            r#"{"name":"orders","event_id":"/id","object_id":"/order/id","version":"/v",
                "integer_ids":true}"#,
        )
        .unwrap();
        assert!(numbered.integer_ids);
        assert!(
            !numbered.create_on_first_snapshot,
            "off unless the file says so"
        );
        let creating = Profile::from_json(
            r#"{"name":"orders","event_id":"/id","object_id":"/order/id","version":"/v",
                "create_on_first_snapshot":true}"#,
        )
        .unwrap();
        assert_eq!(
            creating.unknown_objects(),
            crate::decision::UnknownObjectPolicy::CreateOnFirstSnapshot
        );
        for p in [
            Profile::card(),
            Profile::shipment(),
            Profile::generic("/v").unwrap(),
        ] {
            assert_eq!(
                p.unknown_objects(),
                crate::decision::UnknownObjectPolicy::Park
            );
        }
        let err = Profile::from_json(
            r#"{"name":"x","event_id":"/id","object_id":"/o","version":"/v","create_on_first_snapshot":1}"#,
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("not a valid profile: invalid type: integer `1`, expected a boolean"),
            "{err}"
        );
        let err = Profile::from_json(
            r#"{"name":"x","event_id":"/id","object_id":"/o","version":"/v","integer_ids":"yes"}"#,
        )
        .unwrap_err();
        assert!(
            err.to_string().starts_with(
                "not a valid profile: invalid type: string \"yes\", expected a boolean"
            ),
            "{err}"
        );
        assert_eq!(p.classify(Some("order.created")), None);
        let err =
            Profile::from_json(r#"{"name":"x","event_id":"id","object_id":"/o","version":"/v"}"#)
                .unwrap_err();
        assert_eq!(
            err.to_string(),
            "pointer \"id\" must start with '/' (RFC 6901)"
        );
        let err = Profile::from_json(r#"{"name":"x"}"#).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("not a valid profile: missing field `event_id`"),
            "{err}"
        );
        assert_eq!(
            Profile::named("stripe").unwrap_err().to_string(),
            "unknown profile \"stripe\": expected card, shipment or generic (or --profile-file)"
        );
        assert_eq!(Profile::card().classify(Some("card.deleted")), Some(true));
        assert_eq!(Profile::generic("/v").unwrap().classify(None), Some(false));
    }
}
