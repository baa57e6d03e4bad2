//! Durable stores: SQLite (feature `sqlite`, on by default), PostgreSQL
//! (feature `postgres`) and a log-structured store in fjall (feature `lsm`,
//! `lsm/`), and the [`Committer`] that group-commits the steps of every
//! shard.
//!
//! A shard turns each step into a list of [`Write`]s — the event receipt, the
//! object row with the condition its decision assumed, held-event rows and
//! audit rows. The [`Committer`] commits the writes of many shards in one
//! transaction (group commit) and only then are the callers acknowledged. A
//! failed commit changes nothing: the shards roll their in-memory steps back
//! and answer `retry`. A commit whose conditions no longer hold (another
//! receiver process changed the row) is a [`StoreError::Conflict`]: the shards
//! reload the rows and decide again.
//!
//! [`StoreReader`] reads a store without taking it over (operator commands,
//! read endpoints), also while a receiver process writes it.
//!
//! Versions are stored as 20-digit zero-padded decimal text, so that every u64
//! fits and text order is numeric order in both SQLite and PostgreSQL.
//!
//! # Layout
//! `lsm/` keeps the rows in key-value partitions of its own (its module
//! says how) and `reader_lsm.rs` gives the reader its views. The SQL
//! backends: one folder each, `sqlite/` and `postgres/`, each with `schema.rs`
//! (tables and what older stores lack), `write.rs` (the commit path and the
//! purges) and `read.rs` (the rows a receiver loads, and the backend of
//! [`StoreReader`]). Beside them what both share: `committer.rs`,
//! `group.rs` (folding a group's writes), `rows.rs` (the stored encodings and
//! conflicts), `sql.rs` (the cells, parameters and read transactions of
//! the SQL written once for both), `load.rs` (the order of a load's reads),
//! `pointer.rs`, `repeat.rs` (a redelivery's bytes stored once), `stats.rs`, `retention.rs`, `location.rs`, `reader.rs`,
//! `relay_report.rs` (what operators see of the relays),
//! `relay_change.rs` (what they change: retry, skip, rewind) and
//! `authority.rs` (a reconciler's own connection: resync pages and last
//! errors).

#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod authority;
mod committer;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod group;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod load;
mod location;
#[cfg(feature = "lsm")]
mod lsm;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod outbox;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod pointer;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod reader;
mod relay_change;
mod relay_report;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod repeat;
mod retention;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod rows;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod sql;
#[cfg(feature = "sqlite")]
mod sqlite;
mod stats;

pub use committer::{Committer, CommitterConfig, Resumed};
pub use location::Location;
#[cfg(feature = "lsm")]
#[cfg_attr(docsrs, doc(cfg(feature = "lsm")))]
pub use lsm::LsmStore;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use postgres::PostgresStore;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "sqlite", feature = "postgres"))))]
pub use reader::{
    AuditLine, AuthorityWaitLine, HeldEvent, ParkedObject, StoreReader, StoreSummary, StoredObject,
};
pub use relay_change::{change_relay, RelayChange, RelayChangeRefused, RelayChanged};
pub use relay_report::{relays_report, ParkedLine, RelayStatus, RelaysReport};
pub use retention::{
    purge_all, Purged, Retention, DEFAULT_AUDIT_RETENTION, DEFAULT_HISTORY_RETENTION,
    PURGE_BATCH_ROWS,
};
pub use snapshot_receiver_core::relay::{ParkedEffect, ParkedStatus, RelayRow, RelaySave};
pub use snapshot_receiver_core::store::{
    AuthorityStore, CommitPhases, Fault, FaultyStore, ObjectSource, OutboxStore, PhaseTime,
    Records, Store, StoreError,
};
pub use snapshot_receiver_core::write::{
    AuditRow, EffectRow, Expect, HeldBody, HeldKey, HeldRow, HeldStatus, Loaded, ObjectRow,
    ReceiptRow, Reloaded, VariantRow, Write,
};
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use sqlite::{SqliteOptions, SqliteStore, CONNECTION_CACHE_BYTES};
pub use stats::{CommitStats, GroupSizes};

/// Opens a store from a location (see [`Location`]): `sqlite:PATH`
/// (feature `sqlite`), `postgres://...` / `postgresql://...`, a
/// libpq-style URL (feature `postgres`), or `lsm:DIR` (feature `lsm`).
///
/// # Errors
/// [`StoreError::InvalidLocation`] for a location that does not parse, and
/// for `memory`, which is no store to open (a receiver given `memory` opens
/// none); [`StoreError::Failed`] for a scheme whose feature this build left
/// out (the message names the feature); the backend's error for a store
/// that cannot be opened.
pub fn open(location: &str) -> Result<Box<dyn Store>, StoreError> {
    open_in_schema(location, None)
}

/// Like [`open`], with the PostgreSQL schema that holds the tables (created
/// if absent; `None`: the connection's default search path). Several
/// receivers, or test runs, can share one database in separate schemas.
///
/// # Errors
/// As [`open`]; also [`StoreError::InvalidLocation`] when `schema` is given
/// for a location that is not PostgreSQL (a SQLite file has no schemas).
pub fn open_in_schema(location: &str, schema: Option<&str>) -> Result<Box<dyn Store>, StoreError> {
    open_location(
        &Location::parse(location)?,
        schema,
        EngineMemory::default_part(),
    )
}

/// What a store's engine may keep in the process: the memory budget's
/// store part ([`crate::MemoryBudget::store`]), shared by the connections
/// a receiver opens to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EngineMemory {
    /// The store part, bytes.
    pub(crate) part: usize,
    /// The receiver's connections to a SQLite store: the committer's, its
    /// checkpoint's, one per shard and per start-up scan, and room for a
    /// relay's and a reconciler's.
    pub(crate) connections: usize,
}

impl EngineMemory {
    /// The default budget's store part, for one connection's worth.
    pub(crate) fn default_part() -> Self {
        Self {
            part: crate::MemoryBudget::default().store,
            connections: 1,
        }
    }

    /// For a receiver of `shards` shards and `scans` start-up scans.
    pub(crate) fn for_receiver(part: usize, shards: usize, scans: usize) -> Self {
        Self {
            part,
            connections: 2 + shards + scans + 2,
        }
    }

    /// The bytes the engine at `location` takes of the part: the `lsm:`
    /// store's block cache and write buffer, SQLite's page caches, nothing
    /// for PostgreSQL (its caches are the server's) or memory.
    pub(crate) fn taken(self, location: &Location) -> usize {
        match location {
            Location::Memory | Location::Postgres(_) => 0,
            #[cfg(feature = "sqlite")]
            Location::Sqlite(_) => sqlite::connection_cache(self.part, self.connections)
                .saturating_mul(self.connections),
            #[cfg(feature = "lsm")]
            Location::Lsm(_) => lsm::engine_bytes(lsm::engine_sizes(self.part)),
            // A store this build cannot open takes nothing: opening it fails.
            #[allow(unreachable_patterns)]
            _ => 0,
        }
    }
}

/// Opens a parsed location, its engine sized to `memory`; see
/// [`open_in_schema`].
// Only the stores of the `sqlite` and `lsm` features size an engine.
#[cfg_attr(not(any(feature = "sqlite", feature = "lsm")), allow(unused_variables))]
pub(crate) fn open_location(
    location: &Location,
    schema: Option<&str>,
    memory: EngineMemory,
) -> Result<Box<dyn Store>, StoreError> {
    check_schema(location, schema)?;
    match location {
        Location::Memory => Err(StoreError::InvalidLocation(
            "`memory` is no store to open: a receiver given `memory` keeps everything in its process"
                .to_owned(),
        )),
        #[cfg(feature = "sqlite")]
        Location::Sqlite(path) => Ok(Box::new(SqliteStore::open(
            path,
            SqliteOptions {
                cache_bytes: sqlite::connection_cache(memory.part, memory.connections),
                ..SqliteOptions::default()
            },
        )?)),
        #[cfg(not(feature = "sqlite"))]
        Location::Sqlite(path) => Err(StoreError::Failed(format!(
            "cannot open sqlite:{path}: this build of snapshot-receiver has no `sqlite` feature"
        ))),
        #[cfg(feature = "postgres")]
        Location::Postgres(url) => Ok(Box::new(PostgresStore::connect_in_schema(url, schema)?)),
        #[cfg(not(feature = "postgres"))]
        Location::Postgres(_) => Err(no_postgres()),
        #[cfg(feature = "lsm")]
        Location::Lsm(path) => Ok(Box::new(LsmStore::open_sized(path, memory.part)?)),
        #[cfg(not(feature = "lsm"))]
        Location::Lsm(path) => Err(StoreError::Failed(format!(
            "cannot open lsm:{path}: this build of snapshot-receiver has no `lsm` feature"
        ))),
    }
}

/// The refusal of a schema for a location that has none.
pub(crate) fn check_schema(location: &Location, schema: Option<&str>) -> Result<(), StoreError> {
    match (location, schema) {
        (_, None) => Ok(()),
        (Location::Postgres(_), Some(schema)) => location::check_schema_name(schema),
        (Location::Memory, Some(schema)) => Err(StoreError::InvalidLocation(format!(
            "schema {schema:?} given for memory: only a PostgreSQL store has schemas"
        ))),
        (Location::Sqlite(path), Some(schema)) => Err(StoreError::InvalidLocation(format!(
            "schema {schema:?} given for sqlite:{path}: only a PostgreSQL store has schemas"
        ))),
        (Location::Lsm(path), Some(schema)) => Err(StoreError::InvalidLocation(format!(
            "schema {schema:?} given for lsm:{path}: only a PostgreSQL store has schemas"
        ))),
    }
}

/// The error for a `postgres://` location in a build without the feature.
#[cfg(not(feature = "postgres"))]
pub(crate) fn no_postgres() -> StoreError {
    StoreError::Failed(
        "cannot open a postgres:// store: this build of snapshot-receiver has no `postgres` feature"
            .to_owned(),
    )
}
