//! What every shard shares: the configuration and the [`Context`] (registry,
//! clock, step numbering).

use super::budget::MemoryBudget;
use crate::clock::Clock;
use crate::decision::EqualVersionPolicy;
use crate::envelope::Limits;
use crate::parser::BodyParser;
use crate::profile::Profile;
use crate::registry::{Registry, DEFAULT_RETENTION};
use crate::sync::{AtomicU64, Ordering};
use crate::write::HeldKey;
use std::sync::Arc;
use std::time::Duration;

/// The default [`Config::trail_capacity`]: 10,000 audit records (and as
/// many replacements) in memory, over all shards.
pub const DEFAULT_TRAIL_CAPACITY: usize = 10_000;

/// Receiver configuration. `Config::default()` is the contract's defaults.
#[derive(Clone, Debug)]
pub struct Config {
    /// Number of shard tasks the router spreads objects over. Default 16.
    pub shards: usize,
    /// How long event identities are trusted (docs/CONTRACT.md §5). Default 24 h.
    pub retention: Duration,
    /// Size and queue limits.
    pub limits: Limits,
    /// How payloads map to envelope fields. Default [`Profile::card`] (docs/CONTRACT.md §2).
    pub profile: Profile,
    /// What an equal version with a different state means. Default
    /// [`EqualVersionPolicy::Conflict`] (docs/CONTRACT.md §3).
    pub equal_versions: EqualVersionPolicy,
    /// Keep the audit trail, history and outbox in memory (every decision with
    /// its body), up to [`Config::trail_capacity`]. Default true; a service
    /// with a durable store, or a load test, may turn it off (the store keeps
    /// them).
    pub audit: bool,
    /// Most audit records kept in memory, over all shards, and separately
    /// most replacements (history and outbox); older ones are evicted first.
    /// Each shard keeps its share, `trail_capacity / shards` rounded up, so
    /// memory stays bounded however long the receiver runs. The durable
    /// store keeps the whole trail; a reader asking the memory for evicted
    /// records gets a [`crate::TrailGap`]. Default
    /// [`DEFAULT_TRAIL_CAPACITY`] (10,000 records: about 5 MB of audit
    /// records with 250-byte bodies); `usize::MAX` keeps everything (the
    /// fixture replay does: fixtures are small).
    pub trail_capacity: usize,
    /// Event identities the registry makes room for up front. Growing the
    /// table rehashes one of its shards while holding that shard's lock
    /// (about 10–16 ms per shard at a million identities on the project's
    /// machines), and every delivery whose identity falls in that shard
    /// waits meanwhile; a receiver that knows roughly how many identities
    /// its retention window holds avoids those stalls. Memory is taken at
    /// build (about 21 B per identity of room). Default 0: grow as needed.
    pub identity_capacity: usize,
    /// What the receiver may keep in memory, in bytes, part by part
    /// (docs/CONTRACT.md §9). Default [`MemoryBudget::default`]: 512 MiB
    /// in all ([`super::DEFAULT_MEMORY_BUDGET`]).
    pub memory: MemoryBudget,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            shards: 16,
            retention: DEFAULT_RETENTION,
            limits: Limits::default(),
            profile: Profile::card(),
            equal_versions: EqualVersionPolicy::Conflict,
            audit: true,
            trail_capacity: DEFAULT_TRAIL_CAPACITY,
            identity_capacity: 0,
            memory: MemoryBudget::default(),
        }
    }
}

/// What every shard shares: the event-identity registry, the clock, the
/// configuration and the receiver-wide audit sequence.
pub struct Context {
    /// The shared event-identity registry.
    pub(super) registry: Registry,
    /// The clock retention is measured on.
    pub(super) clock: Arc<dyn Clock>,
    /// The configuration.
    pub(super) config: Config,
    /// Reads bodies under `config.limits` and `config.profile`.
    parser: BodyParser,
    /// Next audit sequence number; an atomic because every shard draws from it.
    seq: AtomicU64,
    /// Random per start: with the sequence number it keys stored rows, so
    /// that receiver processes sharing a database never collide.
    pub(crate) origin: u64,
}

impl Context {
    /// A context with an empty registry whose retention is `config.retention`.
    pub fn new(config: Config, clock: Arc<dyn Clock>) -> Self {
        Self {
            registry: Registry::with_capacity(config.retention, config.identity_capacity),
            clock,
            parser: BodyParser::new(config.limits.clone(), config.profile.clone()),
            config,
            seq: AtomicU64::new(1),
            origin: new_origin(),
        }
    }

    /// The store key of a row made by step `seq` of this run.
    pub(crate) fn key(&self, seq: u64) -> HeldKey {
        HeldKey {
            origin: self.origin,
            seq,
        }
    }

    /// Whether objects `a` and `b` belong to the same shard among
    /// [`Config::shards`] ([`crate::shard_of`]).
    pub fn same_shard(&self, a: &str, b: &str) -> bool {
        crate::shard_of(a, self.config.shards) == crate::shard_of(b, self.config.shards)
    }

    /// The shared event-identity registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The body parser under this configuration's [`Config::limits`] and
    /// [`Config::profile`]: the one way bodies become deliveries
    /// ([`BodyParser::parse`], docs/CONTRACT.md §2).
    pub fn parser(&self) -> &BodyParser {
        &self.parser
    }

    /// Continues the step numbering after `last` (a resumed store's highest).
    pub(crate) fn continue_after(&self, last: u64) {
        self.seq.fetch_max(last + 1, Ordering::Relaxed);
    }

    /// How many audit records (and replacements) each shard keeps in
    /// memory: its share of [`Config::trail_capacity`].
    pub(crate) fn trail_share(&self) -> usize {
        self.config
            .trail_capacity
            .div_ceil(self.config.shards.max(1))
    }

    /// Bytes of records (and, separately, of replacements) each shard
    /// keeps in memory: its share of [`MemoryBudget::trail`].
    pub(crate) fn trail_bytes_share(&self) -> usize {
        MemoryBudget::share(self.config.memory.trail, self.config.shards)
    }

    /// Bytes of waiting bodies each shard may keep: its share of
    /// [`MemoryBudget::waiting`].
    pub(crate) fn waiting_share(&self) -> usize {
        MemoryBudget::share(self.config.memory.waiting, self.config.shards)
    }

    /// Bytes of objects each shard keeps: its share of
    /// [`MemoryBudget::objects`].
    pub(crate) fn objects_share(&self) -> usize {
        MemoryBudget::share(self.config.memory.objects, self.config.shards)
    }

    pub(crate) fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }
}

/// A random positive 63-bit number per receiver start.
fn new_origin() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    ahash::RandomState::new().hash_one((now, std::process::id())) & (i64::MAX as u64)
}
