//! [`BodyParser`]: bytes → [`Delivery`] without an engine, and
//! [`shard_of`], the routing rule every layer shares.

use crate::envelope::{self, Delivery, Limits, RejectReason};
use crate::profile::Profile;

/// Parses delivery bodies under one [`Profile`] and one set of [`Limits`]:
/// what a publisher, a partitioner or a front door needs to read a body the
/// way the receiver will, without building an engine [`crate::Context`]
/// (which also holds a registry and a clock).
///
/// ```
/// use snapshot_receiver_core::{shard_of, BodyParser};
///
/// let parser = BodyParser::default(); // card profile, default limits
/// let body = br#"{"event_id":"e-1","object_id":"card-7","object_version":3,
///     "occurred_at":"2024-01-01T08:00:00Z","type":"card.snapshot","state":{}}"#;
/// let delivery = parser.parse(body).expect("within the limits");
/// assert_eq!(delivery.event_id(), Some("e-1"));
/// assert_eq!(shard_of("card-7", 16), shard_of(delivery.object_id().unwrap(), 16));
/// ```
#[derive(Clone, Debug, Default)]
pub struct BodyParser {
    /// Size and depth bounds: a body over them is refused, not parsed.
    limits: Limits,
    /// Where the envelope fields are in a body.
    profile: Profile,
}

impl BodyParser {
    /// A parser with these limits and this profile.
    pub fn new(limits: Limits, profile: Profile) -> Self {
        Self { limits, profile }
    }

    /// Parses one body (`docs/CONTRACT.md` §2): `Ok` with a validated
    /// envelope and its fingerprint, or with a malformed body that a shard
    /// will hold; `Err` only for a body over a limit (not recorded,
    /// [`crate::Ack::Reject`]).
    ///
    /// # Errors
    /// [`RejectReason`] naming the limit the body is over.
    pub fn parse(&self, body: &[u8]) -> Result<Delivery, RejectReason> {
        envelope::parse(body, &self.limits, &self.profile)
    }

    /// The limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The profile.
    pub fn profile(&self) -> &Profile {
        &self.profile
    }
}

/// The shard (0-based, below `shards`; `shards` 0 counts as 1) that owns
/// `object_id`: xxh3-64 of the id's UTF-8 bytes modulo `shards`, the same in
/// every process, on every run and on every platform. The receiver routes
/// deliveries and pause requests with it, and the JetStream publisher picks
/// partitions with it, so a partition's objects are one receiver's.
pub fn shard_of(object_id: &str, shards: usize) -> usize {
    (xxhash_rust::xxh3::xxh3_64(object_id.as_bytes()) % shards.max(1) as u64) as usize
}

/// The shard that runs a delivery naming `object_id`: its object's owner
/// ([`shard_of`]); a body that names no object (malformed) is held by shard 0.
/// The receiver, a resumed store and the loom models all route with it.
pub fn route(object_id: Option<&str>, shards: usize) -> usize {
    object_id.map_or(0, |id| shard_of(id, shards))
}
