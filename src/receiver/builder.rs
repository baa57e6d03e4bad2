//! [`ReceiverBuilder`]: configuration, seeding, and resuming from a durable store.

use super::shard_task::{Outlet, ShardTask, Shards};
use super::{Inner, Receiver};
use crate::core::engine;
use crate::core::{Context, DecisionCounters, IdentityFilter, Shard};
use crate::store::{
    Committer, CommitterConfig, EngineMemory, Location, ObjectRow, Retention, Store, StoreError,
    Write,
};
use crate::{Clock, Config, SystemClock};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// Why a [`Receiver`] could not be built.
#[derive(Debug)]
#[non_exhaustive]
pub enum BuildError {
    /// `build` was called outside a tokio runtime.
    NoRuntime,
    /// An initial object's state is not valid JSON under docs/CONTRACT.md §2.
    InvalidState {
        /// The object.
        object_id: String,
        /// What is wrong.
        error: crate::CanonError,
    },
    /// An initial object's id contains U+0000, which no id may hold: a
    /// delivery naming it would be refused (`nul_in_id`) and PostgreSQL
    /// text cannot store it, so every backend refuses it alike. The id is
    /// shown with the character escaped.
    NulInObjectId {
        /// The object id as given.
        object_id: String,
    },
    /// A configuration value is out of range.
    InvalidConfig(&'static str),
    /// The total given to [`ReceiverBuilder::memory_budget`] is below
    /// [`crate::MIN_MEMORY_BUDGET`].
    MemoryBudget(crate::BudgetError),
    /// The durable store could not be opened or read, or its location does
    /// not read as one ([`StoreError::InvalidLocation`]). The message
    /// carries the cause, down to the backend's own words (`database or
    /// disk is full`, the operating system's error for a bad path, a
    /// feature this build left out), so the error has no
    /// [`std::error::Error::source`] of its own: match the [`StoreError`]
    /// to tell causes apart.
    Store(StoreError),
}

impl std::fmt::Display for BuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BuildError::NoRuntime => {
                f.write_str("Receiver::build must be called inside a tokio runtime")
            }
            BuildError::InvalidState { object_id, error } => {
                write!(f, "initial state of `{object_id}` is invalid: {error}")
            }
            BuildError::NulInObjectId { object_id } => write!(
                f,
                "initial object id {object_id:?} is refused: it contains U+0000 (`\\u0000`), which no id may hold"
            ),
            BuildError::InvalidConfig(what) => write!(f, "invalid configuration: {what}"),
            BuildError::MemoryBudget(e) => write!(f, "invalid configuration: memory_budget: {e}"),
            BuildError::Store(e) => {
                write!(f, "cannot open or read the durable store: {e}")?;
                let mut cause = std::error::Error::source(e);
                while let Some(c) = cause {
                    write!(f, ": {c}")?;
                    cause = c.source();
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for BuildError {}

/// Opens a store on the committer thread.
type StoreOpener = Box<dyn FnOnce() -> Result<Box<dyn Store>, StoreError> + Send>;

/// How the builder was told to reach its store.
enum StoreChoice {
    /// A location for [`crate::store::open_in_schema`].
    Location(String),
    /// A caller's own opener.
    Opener(StoreOpener),
}

/// Configures and starts a [`Receiver`].
pub struct ReceiverBuilder {
    /// The configuration being built.
    config: Config,
    /// The clock retention is measured on.
    clock: Arc<dyn Clock>,
    /// Initial objects: id, version, state JSON text.
    objects: Vec<(String, u64, String)>,
    /// The durable store, if any (default: in memory only).
    store: Option<StoreChoice>,
    /// The PostgreSQL schema of a store given by location.
    schema: Option<String>,
    /// Group-commit bounds for the durable store.
    committer: CommitterConfig,
    /// Notifications each subscriber may fall behind by.
    subscriber_capacity: usize,
    /// Messages each shard's mailbox holds.
    mailbox_capacity: usize,
    /// How often identities past retention are purged (`None`: never on its own).
    purge_interval: Option<Duration>,
    /// The audit and history windows of the durable store.
    records: Retention,
    /// Most objects a durable receiver keeps in memory.
    working_set: usize,
    /// Most committed event identities a durable receiver keeps in memory.
    identity_cache: usize,
    /// Identities per retention window the filter of stored identities is
    /// sized for (0: no filter).
    identity_filter: usize,
    /// The total of [`ReceiverBuilder::memory_budget`], split when built.
    memory_total: Option<usize>,
}

/// The default [`ReceiverBuilder::mailbox_capacity`]: 1024 messages per shard.
const DEFAULT_MAILBOX_CAPACITY: usize = 1024;

/// The default [`ReceiverBuilder::working_set`]: 100,000 objects, about
/// 55 MB of object state at the measured 530 bytes an object (more for
/// larger states), which fits a small container beside the identities.
pub const DEFAULT_WORKING_SET: usize = 100_000;

/// The default [`ReceiverBuilder::identity_cache`]: 500,000 event
/// identities, about 85 MB at the measured 170 bytes an identity (its
/// record and its place in the eviction queue).
pub const DEFAULT_IDENTITY_CACHE: usize = 500_000;

/// The default [`ReceiverBuilder::identity_filter`]: 10,000,000 event
/// identities per retention window (about 115 a second over 24 hours), in
/// 23 MiB (23,962,656 bytes).
pub const DEFAULT_IDENTITY_FILTER: usize = 10_000_000;

/// The largest [`ReceiverBuilder::identity_filter`]: 1,000,000,000 event
/// identities per retention window, about 2.4 GB (its memory is allocated
/// when the receiver is built, so a larger one is refused, not attempted).
pub const MAX_IDENTITY_FILTER: usize = 1_000_000_000;

/// Initial objects seeded into a durable store per transaction.
const SEED_ROWS: usize = 10_000;

/// The default [`ReceiverBuilder::purge_interval`]: every hour.
const DEFAULT_PURGE_INTERVAL: Duration = Duration::from_secs(3600);

impl Default for ReceiverBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl ReceiverBuilder {
    /// A builder with the default configuration ([`Config::default`]), the
    /// system clock, no initial objects and no durable store.
    pub fn new() -> Self {
        Self {
            config: Config::default(),
            clock: Arc::new(SystemClock),
            objects: Vec::new(),
            store: None,
            schema: None,
            committer: CommitterConfig::default(),
            subscriber_capacity: super::DEFAULT_SUBSCRIBER_CAPACITY,
            mailbox_capacity: DEFAULT_MAILBOX_CAPACITY,
            purge_interval: Some(DEFAULT_PURGE_INTERVAL),
            records: Retention::default(),
            working_set: DEFAULT_WORKING_SET,
            identity_cache: DEFAULT_IDENTITY_CACHE,
            memory_total: None,
            identity_filter: DEFAULT_IDENTITY_FILTER,
        }
    }

    /// Most objects a receiver with a durable store keeps in memory, over
    /// all shards (default [`DEFAULT_WORKING_SET`]; 0 counts as 1 a shard).
    /// Each shard keeps its share, rounded up. The store holds every
    /// object: one not in memory is read from it before its delivery is
    /// decided (with the others of its batch, in one read), and once a
    /// group is committed the least recently used objects beyond the bound
    /// leave memory. Paused objects, objects holding events and objects
    /// with writes not yet committed always stay, so the bound can be
    /// passed by them; decisions never depend on it (docs/CONTRACT.md §9).
    /// A store that cannot open a second connection (SQLite in memory, a
    /// store of the caller's own without [`Store::object_source`]) keeps
    /// every object in memory, and the in-memory receiver has no bound.
    pub fn working_set(mut self, objects: usize) -> Self {
        self.working_set = objects;
        self
    }

    /// Most committed event identities a receiver with a durable store
    /// keeps in memory, over all shards (default [`DEFAULT_IDENTITY_CACHE`];
    /// 0 counts as 1 a shard), where its objects are read on demand (see
    /// [`ReceiverBuilder::working_set`]: the same stores). Each shard keeps
    /// its share of the records it committed or read back, oldest out
    /// first. The store holds every receipt within retention: a delivery
    /// whose identity is not in memory reads its receipt first (with the
    /// others of its batch, in one read), so a duplicate of an evicted
    /// identity still gets its original decision, and start-up loads no
    /// receipts at all. Identities with writes not yet committed always
    /// stay; variants stay in memory within retention. Decisions never
    /// depend on it (docs/CONTRACT.md §9).
    pub fn identity_cache(mut self, identities: usize) -> Self {
        self.identity_cache = identities;
        self
    }

    /// How many event identities per retention window the filter of stored
    /// identities is sized for (default [`DEFAULT_IDENTITY_FILTER`]; 0: no
    /// filter), where identities are read on demand (see
    /// [`ReceiverBuilder::identity_cache`]). Memory holds about 2.4 bytes
    /// per identity of this size (two Bloom filters, for the identities
    /// first seen in this window and in the one before, each sized for all
    /// of it at a 1 % false positive rate), allocated when the receiver is
    /// built. Size it for the identities of the busiest window: beyond the
    /// size, more new identities are read.
    /// It knows every identity this receiver evicted and, once a scan of the
    /// store's receipts started with the receiver is done (in the
    /// background: deliveries do not wait), every receipt stored before: a
    /// delivery whose identity it has certainly never seen is decided
    /// without reading the store. Until the scan is done, and for about 1 %
    /// of new identities at this size (more beyond it), the receipt is read
    /// as without a filter. A receipt another process commits meanwhile is
    /// caught by the store's unique receipts, as any race between processes
    /// is. Decisions never depend on it ([`crate::Receiver::memory`] shows
    /// whether it is ready and how many reads it spared). At most
    /// [`MAX_IDENTITY_FILTER`]: [`ReceiverBuilder::build`] refuses a larger
    /// one with [`BuildError::InvalidConfig`].
    pub fn identity_filter(mut self, identities: usize) -> Self {
        self.identity_filter = identities;
        self
    }

    /// Replaces the whole engine configuration (every [`Config`] option at
    /// once; the setters below change one option each, and a setter called
    /// after this one still applies). The receiver's own runtime knobs
    /// ([`ReceiverBuilder::mailbox_capacity`],
    /// [`ReceiverBuilder::purge_interval`], the store, the committer, the
    /// subscriber capacity) are not part of [`Config`] and keep their values.
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// What the receiver may keep in memory in all, in bytes (default
    /// [`crate::DEFAULT_MEMORY_BUDGET`], 512 MiB; at least
    /// [`crate::MIN_MEMORY_BUDGET`], 16 MiB), divided the default way
    /// ([`crate::MemoryBudget::split`]): five sixteenths for the working
    /// set of objects, three sixteenths for the store's engine (its caches
    /// and write buffers; what it does not take goes to the working set, so
    /// half for objects in memory and on PostgreSQL), an eighth each for
    /// the identity cache, the bodies of waiting events and the deliveries
    /// not yet answered, a sixteenth for the relays (their parked effects'
    /// heads and a round's states; past it a relay's cursor stops), a
    /// thirty-second each for the in-memory trail and the reconciler's
    /// queue.
    /// Caches evict past their part; what cannot leave memory (waiting
    /// bodies, queued deliveries, an in-memory receiver's objects) answers
    /// `retry` ([`crate::RetryReason::MemoryFull`]) past its part. To set
    /// the parts one by one, give [`Config::memory`] instead. The counts
    /// ([`ReceiverBuilder::working_set`], [`ReceiverBuilder::identity_cache`])
    /// still apply: whichever bound is reached first evicts.
    ///
    /// [`ReceiverBuilder::build`] fails with [`BuildError::MemoryBudget`]
    /// for a total below the smallest.
    pub fn memory_budget(mut self, total_bytes: usize) -> Self {
        self.memory_total = Some(total_bytes);
        self
    }

    /// Number of shard tasks (default 16, at least 1). See [`Config::shards`].
    pub fn shards(mut self, shards: usize) -> Self {
        self.config.shards = shards;
        self
    }

    /// Capacity of each shard task's mailbox, in messages (default 1024, at
    /// least 1; 0 makes [`ReceiverBuilder::build`] fail with
    /// [`BuildError::InvalidConfig`]). A full mailbox makes
    /// [`Receiver::deliver`] wait until the shard task takes a message
    /// (backpressure); memory is not taken up front.
    pub fn mailbox_capacity(mut self, capacity: usize) -> Self {
        self.mailbox_capacity = capacity;
        self
    }

    /// Event identities the registry makes room for up front (default 0;
    /// see [`Config::identity_capacity`]).
    pub fn identity_capacity(mut self, identities: usize) -> Self {
        self.config.identity_capacity = identities;
        self
    }

    /// How long event identities are trusted, as a [`Duration`] (default
    /// 24 h; docs/CONTRACT.md §5). See [`Config::retention`].
    pub fn retention(mut self, retention: Duration) -> Self {
        self.config.retention = retention;
        self
    }

    /// How often the receiver purges event identities older than the
    /// retention window ([`ReceiverBuilder::retention`]) on its own, as a
    /// [`Duration`] (default every hour, the first purge one interval after
    /// [`ReceiverBuilder::build`]); `None`: only when
    /// [`Receiver::purge_expired_identities`] is called. A failed periodic
    /// purge is logged (`warn`) and retried at the next tick.
    pub fn purge_interval(mut self, every: Option<Duration>) -> Self {
        self.purge_interval = every;
        self
    }

    /// How long the durable store keeps audit rows, as a [`Duration`]
    /// measured on the receiver's clock (default 7 days,
    /// [`crate::store::DEFAULT_AUDIT_RETENTION`]); older rows are purged on
    /// the purge interval and by [`Receiver::purge_expired_records`], except
    /// those that justify an event still held, parked or unresolved
    /// (docs/CONTRACT.md §9). Held rows already resolved follow the same
    /// window.
    pub fn audit_retention(mut self, window: Duration) -> Self {
        self.records.audit = window;
        self
    }

    /// How long the durable store keeps replacement-history (outbox) rows,
    /// as a [`Duration`] (default 7 days,
    /// [`crate::store::DEFAULT_HISTORY_RETENTION`]); purged like the audit
    /// rows ([`ReceiverBuilder::audit_retention`]).
    pub fn history_retention(mut self, window: Duration) -> Self {
        self.records.history = window;
        self
    }

    /// Most rows one purge transaction deletes, in rows (default
    /// [`crate::store::PURGE_BATCH_ROWS`], at least 1): each batch commits
    /// on its own, and deliveries commit between batches.
    pub fn purge_batch(mut self, rows: usize) -> Self {
        self.records.batch = rows;
        self
    }

    /// Size and queue limits (bytes, nesting depth, events per queue;
    /// default [`crate::Limits::default`]). See [`Config::limits`].
    pub fn limits(mut self, limits: crate::Limits) -> Self {
        self.config.limits = limits;
        self
    }

    /// How payloads map to envelope fields (default [`crate::Profile::card`];
    /// docs/CONTRACT.md §2). See [`Config::profile`].
    pub fn profile(mut self, profile: crate::Profile) -> Self {
        self.config.profile = profile;
        self
    }

    /// What an equal version with a different state means (default
    /// [`crate::EqualVersionPolicy::Conflict`]; docs/CONTRACT.md §3). See
    /// [`Config::equal_versions`].
    pub fn equal_versions(mut self, policy: crate::EqualVersionPolicy) -> Self {
        self.config.equal_versions = policy;
        self
    }

    /// Whether the audit trail, history and outbox are kept in memory
    /// (default `true`, bounded by [`ReceiverBuilder::trail_capacity`]); a
    /// durable store keeps them either way. See [`Config::audit`].
    pub fn audit(mut self, keep: bool) -> Self {
        self.config.audit = keep;
        self
    }

    /// Most audit records (and, separately, most replacements) kept in
    /// memory over all shards, in records; older ones are evicted first
    /// (default [`crate::DEFAULT_TRAIL_CAPACITY`], 10,000; `usize::MAX`
    /// keeps everything). See [`Config::trail_capacity`].
    pub fn trail_capacity(mut self, records: usize) -> Self {
        self.config.trail_capacity = records;
        self
    }

    /// The clock retention is measured on (default: the system clock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Adds a known object with its version and state (JSON text).
    pub fn object(mut self, object_id: &str, version: u64, state_json: &str) -> Self {
        self.objects
            .push((object_id.to_owned(), version, state_json.to_owned()));
        self
    }

    /// Where the receiver records its steps, as a [`Location`]: `sqlite:PATH`
    /// or `postgres://...` record every step before acknowledging it;
    /// `memory` (the default, also when this is never called) keeps
    /// everything in the process. With a durable store, initial objects
    /// only seed objects the store does not have, and the receiver resumes
    /// states, pauses, held events and identities (within retention) from
    /// it. The location is read by [`ReceiverBuilder::build`], which
    /// refuses one that does not parse ([`BuildError::Store`] with
    /// [`StoreError::InvalidLocation`]).
    pub fn store(mut self, location: &str) -> Self {
        self.store = Some(StoreChoice::Location(location.to_owned()));
        self
    }

    /// The PostgreSQL schema of the store given to [`ReceiverBuilder::store`]
    /// (created if absent); see [`crate::store::open_in_schema`]. Setting it
    /// for a SQLite or `memory` location makes [`ReceiverBuilder::build`] fail.
    pub fn store_schema(mut self, schema: &str) -> Self {
        self.schema = Some(schema.to_owned());
        self
    }

    /// Like [`ReceiverBuilder::store`] with a store built by `open`, which
    /// runs on the committer thread (for example a
    // A link only where the type is built (feature `postgres`).
    #[cfg_attr(
        feature = "postgres",
        doc = "[`crate::store::PostgresStore`] in its own schema, or a"
    )]
    #[cfg_attr(
        not(feature = "postgres"),
        doc = "`PostgresStore` in its own schema, or a"
    )]
    /// [`crate::store::FaultyStore`] in tests).
    pub fn store_with<S: Store>(
        mut self,
        open: impl FnOnce() -> Result<S, StoreError> + Send + 'static,
    ) -> Self {
        self.store = Some(StoreChoice::Opener(Box::new(move || {
            open().map(|s| Box::new(s) as Box<dyn Store>)
        })));
        self
    }

    /// Group-commit bounds (default [`CommitterConfig::default`]).
    pub fn committer(mut self, config: CommitterConfig) -> Self {
        self.committer = config;
        self
    }

    /// How many notifications ([`Receiver::subscribe`]) a subscriber may
    /// fall behind by before it loses the oldest, in notifications (default
    /// [`super::DEFAULT_SUBSCRIBER_CAPACITY`], at least 1). The same bound
    /// holds a background reconciler's intake ([`Receiver::reconciler`]):
    /// needs past it are dropped there and found by a scan of the shards.
    pub fn subscriber_capacity(mut self, notifications: usize) -> Self {
        self.subscriber_capacity = notifications;
        self
    }

    /// Starts the shard tasks on the current tokio runtime. With a durable
    /// store it first opens and loads the store, blocking the calling thread
    /// until that is done.
    ///
    /// # Errors
    /// [`BuildError::NoRuntime`] outside a runtime, [`BuildError::InvalidState`]
    /// for an initial state that is not valid JSON, [`BuildError::InvalidConfig`]
    /// for zero shards, a zero mailbox or an identity filter over
    /// [`MAX_IDENTITY_FILTER`], [`BuildError::Store`] when the store cannot
    /// be opened or read.
    pub fn build(self) -> Result<Receiver, BuildError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| BuildError::NoRuntime)?;
        if self.config.shards == 0 {
            return Err(BuildError::InvalidConfig("shards must be at least 1"));
        }
        if self.mailbox_capacity == 0 {
            return Err(BuildError::InvalidConfig(
                "mailbox_capacity must be at least 1",
            ));
        }
        if self.identity_filter > MAX_IDENTITY_FILTER {
            return Err(BuildError::InvalidConfig(
                "identity_filter must be at most 1,000,000,000 identities (about 2.4 GB)",
            ));
        }
        if self.records.batch == 0 {
            return Err(BuildError::InvalidConfig("purge_batch must be at least 1"));
        }
        if self.subscriber_capacity == 0 {
            return Err(BuildError::InvalidConfig(
                "subscriber_capacity must be at least 1",
            ));
        }
        let (notices, _) = tokio::sync::broadcast::channel(self.subscriber_capacity);
        let mut config = self.config;
        if let Some(total) = self.memory_total {
            config.memory = crate::MemoryBudget::split(total).map_err(BuildError::MemoryBudget)?;
        }
        let n = config.shards;
        // One source more than shards for the identity filter's scan.
        let scans = usize::from(self.identity_filter > 0);
        // The store's engine is sized from the budget's store part; what it
        // does not take goes to the working set (a store given as an
        // opener sizes itself, outside the budget).
        let engine = EngineMemory::for_receiver(config.memory.store, n, scans);
        let opener: Option<StoreOpener> = match self.store {
            None => {
                config.memory = config.memory.with_store_engine(0);
                None
            }
            Some(StoreChoice::Opener(open)) => {
                config.memory = config.memory.with_store_engine(0);
                Some(open)
            }
            Some(StoreChoice::Location(text)) => {
                let location = Location::parse(&text).map_err(BuildError::Store)?;
                crate::store::check_schema(&location, self.schema.as_deref())
                    .map_err(BuildError::Store)?;
                config.memory = config.memory.with_store_engine(engine.taken(&location));
                if location.is_memory() {
                    None
                } else {
                    let schema = self.schema;
                    Some(Box::new(move || {
                        crate::store::open_location(&location, schema.as_deref(), engine)
                    }))
                }
            }
        };
        let queued_limit = config.memory.queued;
        let ctx = Context::new(config, self.clock);
        let mut shards: Vec<Shard> = (0..n).map(|_| Shard::new()).collect();
        // Every initial object is checked before anything is stored. The
        // in-memory receiver holds them; a durable one only seeds the store
        // with their rows and resumes from it, so a million initial objects
        // are never all built as actors at once.
        let mut seeds: Vec<ObjectRow> = Vec::new();
        for (id, version, state) in self.objects {
            if id.contains('\0') {
                return Err(BuildError::NulInObjectId { object_id: id });
            }
            if opener.is_none() {
                shards[crate::core::shard_of(&id, n)]
                    .insert_object(&ctx, &id, version, &state)
                    .map_err(|error| BuildError::InvalidState {
                        object_id: id.clone(),
                        error,
                    })?;
                continue;
            }
            let row = Shard::seed_row(&ctx, &id, version, &state);
            seeds.push(row.map_err(|error| BuildError::InvalidState {
                object_id: id.clone(),
                error,
            })?);
        }
        // In object order, the last value of an id given twice.
        let seeds = engine::seed_rows(seeds);
        // One connection per shard for what a bounded shard reads.
        let mut sources = Vec::new();
        let store = match opener {
            None => None,
            Some(open) => {
                let committer =
                    Committer::start(open, self.committer).map_err(BuildError::Store)?;
                // In transactions of SEED_ROWS rows: a stored row of an
                // earlier run wins over a seed, so a build that fails half
                // way seeds the rest next time.
                let mut seeds = seeds.into_iter().peekable();
                while seeds.peek().is_some() {
                    let chunk = seeds.by_ref().take(SEED_ROWS).map(Write::Seed).collect();
                    committer
                        .commit_blocking(chunk)
                        .map_err(BuildError::Store)?;
                }
                let since = ctx.clock().now().checked_sub(ctx.config().retention);
                let since = since.unwrap_or(std::time::UNIX_EPOCH);
                let resumed = committer
                    .resume_blocking(since, n + scans)
                    .map_err(BuildError::Store)?;
                // The bound is the receiver's; each shard keeps its share.
                let bounds = engine::Bounds {
                    objects: self.working_set,
                    identities: self.identity_cache,
                };
                let started = engine::start_shards(&ctx, &mut shards, resumed, bounds)
                    .map_err(BuildError::Store)?;
                sources = started.shards;
                // The scan's source is the one beyond the shards' (none
                // without a filter, or when every object was loaded).
                if let Some(source) = started.scans.into_iter().next() {
                    let window = ctx.config().retention;
                    let filter = Arc::new(IdentityFilter::new(
                        self.identity_filter,
                        window,
                        random_seed(),
                    ));
                    ctx.registry().track_stored(filter.clone());
                    super::identity_scan::start(source, &filter, ctx.clock().clone(), window)
                        .map_err(|e| {
                            BuildError::Store(StoreError::Failed(format!(
                                "cannot start the identity filter's scan: {e}"
                            )))
                        })?;
                }
                Some(Arc::new(committer))
            }
        };
        let mailbox_capacity = self.mailbox_capacity;
        let outlet = Outlet::new(notices.clone(), n, self.subscriber_capacity);
        // A durable store: every shard journals its steps (after the resume).
        let shards: Arc<Shards> = Arc::new(match store {
            None => Shards::new(ctx, shards, outlet),
            Some(_) => Shards::durable(ctx, shards, outlet),
        });
        let mut mailboxes = Vec::with_capacity(n);
        let mut tasks = Vec::with_capacity(n);
        let mut sources = sources.into_iter();
        for index in 0..n {
            let (tx, rx) = mpsc::channel(mailbox_capacity);
            mailboxes.push(tx);
            let task = ShardTask {
                shards: shards.clone(),
                index,
                mailbox: rx,
                store: store.clone(),
                source: sources.next(),
            };
            tasks.push(runtime.spawn(task.run()));
        }
        let receiver = Receiver {
            inner: Arc::new(Inner {
                mailboxes,
                shards,
                stopping: AtomicBool::new(false),
                tasks: Mutex::new(tasks),
                store,
                records: self.records,
                purge: Mutex::new(None),
                metrics: DecisionCounters::new(),
                notices,
                relays: Arc::default(),
                outbox: Arc::default(),
                queued: crate::core::engine::QueuedBytes::new(queued_limit),
                relay_bytes: Arc::default(),
                authority_bytes: Arc::default(),
            }),
        };
        if let Some(every) = self.purge_interval {
            let weak = Arc::downgrade(&receiver.inner);
            let purge = runtime.spawn(async move {
                let mut ticks = tokio::time::interval(every);
                ticks.tick().await;
                loop {
                    ticks.tick().await;
                    // Holds no handle between ticks: the receiver can drop.
                    let Some(inner) = weak.upgrade() else { break };
                    let receiver = Receiver { inner };
                    if let Err(e) = receiver.purge_expired_identities().await {
                        tracing::warn!(error = %e, "periodic purge of event identities failed");
                    }
                    if let Err(e) = receiver.purge_expired_records().await {
                        tracing::warn!(error = %e, "periodic purge of audit and history rows failed");
                    }
                }
            });
            *crate::locks::lock(&receiver.inner.purge) = Some(purge);
        }
        Ok(receiver)
    }
}

/// A seed for the identity filter's hash, different in every process (the
/// standard library's random hasher keys), so that no client can choose
/// event ids that all fall on the same bits.
fn random_seed() -> u128 {
    use std::hash::BuildHasher;
    let keys = std::collections::hash_map::RandomState::new();
    (u128::from(keys.hash_one(1_u8)) << 64) | u128::from(keys.hash_one(2_u8))
}

#[cfg(test)]
mod tests {
    use super::random_seed;

    /// The identity filter's seed is not a constant: two seeds differ, and
    /// each has both of its 64-bit halves keyed (with a fixed or half-empty
    /// seed a client could learn which event ids share the filter's bits).
    #[test]
    fn the_identity_filters_seed_differs_each_time_in_all_128_bits() {
        let (a, b) = (random_seed(), random_seed());
        assert_ne!(a, b);
        for seed in [a, b] {
            assert!(seed >> 64 != 0 && seed as u64 != 0, "{seed:#x}");
        }
    }
}
