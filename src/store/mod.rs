//! Durable stores: SQLite (feature `sqlite`, on by default) and PostgreSQL
//! (feature `postgres`), and the [`Committer`] that group-commits the steps
//! of every shard.
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

mod committer;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod group;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod reader;
#[cfg(feature = "sqlite")]
mod sqlite;
mod stats;

pub use committer::{Committer, CommitterConfig};
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use postgres::PostgresStore;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "sqlite", feature = "postgres"))))]
pub use reader::{AuditLine, HeldEvent, ParkedObject, StoreReader, StoreSummary, StoredObject};
pub use snapshot_receiver_core::store::{
    CommitPhases, Fault, FaultyStore, PhaseTime, Store, StoreError,
};
pub use snapshot_receiver_core::write::{
    AuditRow, Expect, HeldKey, HeldRow, HeldStatus, Loaded, ObjectRow, ReceiptRow, Reloaded,
    ReplacementRow, VariantRow, Write,
};
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use sqlite::{SqliteOptions, SqliteStore};
pub use stats::{CommitStats, GroupSizes};

/// The stored encodings both backends share.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use snapshot_receiver_core::write::{
    audit_kind, cutoff_ns, ns_time, parse_version, time_ns, verdict, version_text,
};

/// Opens a store from a location: `sqlite:PATH` (feature `sqlite`) or
/// `postgres://...` / `postgresql://...`, a libpq-style URL (feature
/// `postgres`).
///
/// # Errors
/// [`StoreError::Failed`] for an unknown scheme, a scheme whose feature this
/// build left out (the message names the feature), or a store that cannot be
/// opened.
pub fn open(location: &str) -> Result<Box<dyn Store>, StoreError> {
    open_in_schema(location, None)
}

/// Like [`open`], with the PostgreSQL schema that holds the tables (created
/// if absent; `None`: the connection's default search path). Several
/// receivers, or test runs, can share one database in separate schemas.
///
/// # Errors
/// As [`open`]; also [`StoreError::Failed`] when `schema` is given for a
/// SQLite location (a SQLite file has no schemas).
pub fn open_in_schema(location: &str, schema: Option<&str>) -> Result<Box<dyn Store>, StoreError> {
    if let Some(path) = location.strip_prefix("sqlite:") {
        if let Some(schema) = schema {
            return Err(StoreError::Failed(format!(
                "schema {schema:?} given for sqlite:{path}: only a PostgreSQL store has schemas"
            )));
        }
        #[cfg(feature = "sqlite")]
        return Ok(Box::new(SqliteStore::open(path, SqliteOptions::default())?));
        #[cfg(not(feature = "sqlite"))]
        return Err(StoreError::Failed(format!(
            "cannot open sqlite:{path}: this build of snapshot-receiver has no `sqlite` feature"
        )));
    }
    if location.starts_with("postgres://") || location.starts_with("postgresql://") {
        #[cfg(feature = "postgres")]
        return Ok(Box::new(PostgresStore::connect_in_schema(
            location, schema,
        )?));
        #[cfg(not(feature = "postgres"))]
        return Err(StoreError::Failed(
            "cannot open a postgres:// store: this build of snapshot-receiver has no `postgres` feature"
                .to_owned(),
        ));
    }
    Err(StoreError::Failed(format!(
        "unknown store {location:?}: expected sqlite:PATH or postgres://..."
    )))
}
