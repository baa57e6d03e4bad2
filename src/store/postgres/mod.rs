//! PostgreSQL (the synchronous `postgres` client, run on the committer
//! thread) for several receiver processes sharing one database.
//!
//! Correctness across processes comes from the database, not from any
//! in-process router. A group commit whose writes fold (see `group.rs`: the
//! deliveries and pauses of the shards, the common case) is one statement,
//! [`GROUP`](write::GROUP), sent in one round trip with one array per column, that commits
//! on its own at READ COMMITTED:
//! - every object row the group read is locked in object order and must
//!   still have the version and pause flag its first decision read (a
//!   replacement writes a higher version than that, so the stored version is
//!   below the incoming one), and only locked rows are written;
//! - the receipt inserts are unique on `event_id`: a stored receipt is
//!   replaced only when it expired by the row's retention cut-off
//!   (`ON CONFLICT DO UPDATE ... WHERE`, which locks and re-reads a row
//!   another transaction is writing), taking the variants recorded before
//!   the new receipt with it; no row inserted or replaced means another
//!   process recorded the identity first and it is live. The variant
//!   inserts are unique on (`event_id`, fingerprint) likewise;
//! - a count short of the group's raises `serialization_failure` or
//!   `unique_violation` inside the statement, so nothing of it is committed.
//!
//! Any other group (seeds, authoritative snapshots, held-status changes) is
//! one transaction of one statement per write: the receipt insert as above,
//! an object write as a conditional `UPDATE ... WHERE version < :incoming AND
//! version = :read AND paused = :read` (a replacement) or `... WHERE version
//! = :read AND paused = :read`, and a decision that changed nothing re-reads
//! its row with `SELECT ... FOR UPDATE`.
//!
//! Either way every decision holds the row lock of its object until commit
//! and is checked against the committed row. When a condition fails, or
//! PostgreSQL reports a serialization failure, a deadlock or a unique
//! violation, nothing is committed, and the receiver reloads the rows and
//! decides again.

mod outbox;
mod read;
mod schema;
mod write;

pub(super) use read::PgConnection;

use super::{
    load, AuditRow, CommitPhases, EffectRow, Loaded, ObjectRow, ObjectSource, OutboxStore,
    ReceiptRow, Records, Store, StoreError, VariantRow, Write,
};
use postgres::{Client, NoTls};
use std::sync::Arc;
use std::time::SystemTime;
use write::Statements;

/// The PostgreSQL store.
pub struct PostgresStore {
    /// The connection string, to reconnect after a lost connection.
    url: String,
    /// The schema the tables live in (created if absent); `None`: the
    /// connection's default search path.
    schema: Option<String>,
    /// The live connection and its statements; `None` after a failure until
    /// the next use reconnects.
    conn: Option<(Client, Statements)>,
    /// Time spent committing, by phase (see [`Store::phases`]).
    phases: CommitPhases,
    /// The bodies this store committed in place lately, which a
    /// redelivery's audit row may point at instead of storing them again.
    recent: crate::store::repeat::RecentBodies,
}

/// The error with its cause: the driver's own text ("db error", "error
/// connecting to server") hides what the server or the socket said.
fn describe(e: &postgres::Error) -> String {
    match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}

fn failed(e: postgres::Error) -> StoreError {
    use postgres::error::SqlState;
    match e.code() {
        Some(c)
            if *c == SqlState::T_R_SERIALIZATION_FAILURE
                || *c == SqlState::T_R_DEADLOCK_DETECTED
                || *c == SqlState::UNIQUE_VIOLATION =>
        {
            StoreError::Conflict(format!("postgres: {}", describe(&e)))
        }
        // A value the server cannot hold (U+0000 or bytes that are not
        // UTF-8 in text, a character outside the encoding) or a row over a
        // limit (an index entry too large): the same rows fail the same way
        // again.
        Some(c)
            if *c == SqlState::CHARACTER_NOT_IN_REPERTOIRE
                || *c == SqlState::UNTRANSLATABLE_CHARACTER
                || *c == SqlState::PROGRAM_LIMIT_EXCEEDED =>
        {
            StoreError::Refused {
                cause: format!("postgres: {}", describe(&e)),
                body: None,
            }
        }
        _ => StoreError::Failed(format!("postgres: {}", describe(&e))),
    }
}

impl PostgresStore {
    /// Connects to `url` (for example `postgres://postgres@127.0.0.1:5432/test`)
    /// and creates the tables if absent.
    ///
    /// # Errors
    /// [`StoreError::Failed`] when the server cannot be reached or refuses.
    pub fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_in_schema(url, None)
    }

    /// Like [`PostgresStore::connect`], with the tables in `schema` (created
    /// if absent), so that several receivers or test runs can share a database.
    ///
    /// # Errors
    /// [`StoreError::Failed`] when the server cannot be reached or refuses.
    pub fn connect_in_schema(url: &str, schema: Option<&str>) -> Result<Self, StoreError> {
        if let Some(s) = schema {
            crate::store::location::check_schema_name(s)?;
        }
        let mut store = Self {
            url: url.to_owned(),
            schema: schema.map(str::to_owned),
            conn: None,
            phases: CommitPhases::default(),
            recent: Default::default(),
        };
        store.connection()?;
        Ok(store)
    }

    fn connection(&mut self) -> Result<&mut (Client, Statements), StoreError> {
        if self.conn.as_ref().is_some_and(|(c, _)| c.is_closed()) {
            self.conn = None;
        }
        if self.conn.is_none() {
            let mut client = Client::connect(&self.url, NoTls).map_err(|e| {
                StoreError::Failed(format!(
                    "postgres: cannot connect to {}: {}",
                    redact(&self.url),
                    describe(&e)
                ))
            })?;
            schema::create(&mut client, self.schema.as_deref())?;
            let statements = write::prepare(&mut client).map_err(failed)?;
            self.conn = Some((client, statements));
        }
        self.conn
            .as_mut()
            .ok_or_else(|| StoreError::Failed("postgres: no connection".to_owned()))
    }

    /// Drops a connection that failed, so that the next call reconnects.
    fn check<T>(&mut self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        if matches!(result, Err(StoreError::Failed(_))) {
            self.conn = None;
        }
        result
    }
}

/// The URL without its password, for error messages.
pub(super) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let userinfo = &url[s + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{user}@{}", &url[..s + 3], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

impl Store for PostgresStore {
    fn commit(&mut self, writes: &[Write]) -> Result<(), StoreError> {
        let result = self.try_commit(writes);
        self.check(result)
    }

    fn probe(&mut self, writes: &[Write]) -> Result<(), StoreError> {
        let result = self.try_probe(writes);
        self.check(result)
    }

    fn load(&mut self, receipts_since: SystemTime) -> Result<Loaded, StoreError> {
        let result = self.try_load(receipts_since, load::Objects::All);
        self.check(result)
    }

    fn load_resident(&mut self, receipts_since: SystemTime) -> Result<Loaded, StoreError> {
        let result = self.try_load(receipts_since, load::Objects::Pinned);
        self.check(result)
    }

    fn object_source(&mut self) -> Result<Option<Box<dyn ObjectSource>>, StoreError> {
        let source = read::PgObjects::start(self.url.clone(), self.schema.clone())?;
        Ok(Some(Box::new(source)))
    }

    fn outbox_store(&mut self) -> Result<Option<Box<dyn OutboxStore>>, StoreError> {
        let outbox = outbox::open(&self.url, self.schema.as_deref())?;
        Ok(Some(Box::new(outbox)))
    }

    fn authority_store(
        &mut self,
    ) -> Result<Option<Box<dyn crate::store::AuthorityStore>>, StoreError> {
        let conn = outbox::connect(&self.url, self.schema.as_deref())?;
        Ok(Some(Box::new(crate::store::authority::SqlAuthority::new(
            conn,
        ))))
    }

    fn objects(&mut self) -> Result<Vec<ObjectRow>, StoreError> {
        let result = self.try_all_objects();
        self.check(result)
    }

    fn refresh(
        &mut self,
        objects: &[Arc<str>],
        receipts: &[Arc<str>],
    ) -> Result<(Vec<ObjectRow>, Vec<ReceiptRow>), StoreError> {
        let result = self.try_refresh(objects, receipts);
        self.check(result)
    }

    fn refresh_variants(&mut self, event_ids: &[Arc<str>]) -> Result<Vec<VariantRow>, StoreError> {
        let result = self.try_refresh_variants(event_ids);
        self.check(result)
    }

    fn purge_receipts(&mut self, before: SystemTime) -> Result<u64, StoreError> {
        let result = self.try_purge_receipts(before);
        self.check(result)
    }

    fn purge_records(
        &mut self,
        records: Records,
        before: SystemTime,
        limit: usize,
    ) -> Result<u64, StoreError> {
        let result = self.try_purge_records(records, before, limit);
        self.check(result)
    }

    fn audit(&mut self) -> Result<Vec<AuditRow>, StoreError> {
        let result = self.try_audit();
        self.check(result)
    }

    fn phases(&self) -> CommitPhases {
        self.phases
    }

    fn replacements_since(&mut self, after: u64) -> Result<Vec<EffectRow>, StoreError> {
        let result = self.try_replacements_since(after);
        self.check(result)
    }
}

/// The server the unit tests use: `SNAPSHOT_RECEIVER_PG_URL`, or the local
/// one. `None` (skip) when unreachable, except under `CI`, where a
/// missing server fails the test.
#[cfg(test)]
fn test_server() -> Option<String> {
    let url = std::env::var("SNAPSHOT_RECEIVER_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    match postgres::Client::connect(&url, postgres::NoTls) {
        Ok(_) => Some(url),
        Err(e) if std::env::var_os("CI").is_some() => {
            panic!("PostgreSQL is not reachable at {url}: {e}")
        }
        Err(e) => {
            eprintln!("skipping: PostgreSQL is not reachable at {url}: {e}");
            None
        }
    }
}
