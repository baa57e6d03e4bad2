//! [`StoreReader`]: read-only views of a durable store, for operators and
//! read endpoints, safe beside a receiver process that is writing the store.
//!
//! The reader never creates, migrates or locks anything beyond one read:
//! - SQLite: a read-only connection; each call reads in one transaction, so
//!   it sees one committed snapshot of the (WAL) database while a receiver
//!   keeps committing, and never blocks the receiver's commits;
//! - PostgreSQL: each call is one `REPEATABLE READ READ ONLY` transaction,
//!   so the counts of one summary agree with each other.
//!
//! A location that does not exist is [`StoreError::Missing`]; a database or
//! schema without the receiver's tables is [`StoreError::NotAStore`]; neither
//! creates anything. Stored codes are turned into the wire names of the
//! replay report (docs/CONTRACT.md §7): `decision`, `reason`, `conflict`,
//! `original_decision`, `version`, `state`, `paused`. Nothing here decides
//! anything; the decisions were made by the engine and are only read back.
//!
//! Every call blocks the calling thread for its queries: from async code,
//! call it inside `tokio::task::spawn_blocking`.
//!
//! The reader is above the backends, as the committer is: each backend
//! gives one read-only connection (`SqliteReadOnly` in `sqlite/read.rs`,
//! `PgConnection` in `postgres/read.rs`), whose `read` runs one call's
//! queries in one transaction; the reader dispatches to the one its
//! location names, writes its SQL once for both (`sql.rs`), and decodes the
//! rows with the decoders the backends load with (`rows.rs`). No backend
//! uses the reader.

use super::relay_report::{status, ParkedLine};
use super::rows::{
    audit_row, held_row, ns_time, object_row, parked, parked_effects, relay_row, verdict, Columns,
    AUDIT_COLUMNS, AUDIT_COLUMNS_IN_PLACE, HELD_COLUMNS, OBJECT_COLUMNS, PARKED_RELAY,
    RELAY_COLUMNS, RELAY_COLUMNS_BEFORE_BACKLOG,
};
use super::sql::{int, stored, text, Cell, Cells, Reads, Value};
use super::{AuditRow, HeldRow, ObjectRow, StoreError};
use crate::locks::lock;
use crate::{format_rfc3339, Decision, Verdict};
use serde::Serialize;
use serde_json::value::RawValue;
use std::collections::BTreeMap;
use std::sync::Mutex;

#[cfg(feature = "lsm")]
#[path = "reader_lsm.rs"]
mod lsm_views;

/// The decision wire names a summary always lists (docs/CONTRACT.md §7), so
/// that a machine reading it finds every key, zero or not.
const DECISIONS: [&str; 6] = ["applied", "conflict", "duplicate", "equal", "held", "stale"];

/// A read-only handle on a durable store (SQLite file or PostgreSQL
/// schema). `Send + Sync`: share it behind an `Arc`; calls from several
/// threads take turns on its one connection.
pub struct StoreReader {
    /// The location as given, without a password, for messages.
    location: String,
    /// The connection of the backend the location names.
    backend: Backend,
}

/// One backend's connection. A std `Mutex`: a call holds it for its queries
/// only, on a blocking thread, never across an `.await`.
enum Backend {
    /// A read-only SQLite connection.
    #[cfg(feature = "sqlite")]
    Sqlite(Mutex<super::sqlite::SqliteReadOnly>),
    /// A PostgreSQL connection, reopened after it is lost.
    #[cfg(feature = "postgres")]
    Postgres(Box<Mutex<super::postgres::PgConnection>>),
    /// The log-structured store's keyspace (the receiver's, when this
    /// process has it open), read by views of its own.
    #[cfg(feature = "lsm")]
    Lsm(super::lsm::LsmRows),
}

/// What a summary of the store counts ([`StoreReader::summary`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StoreSummary {
    /// The store's location (`sqlite:PATH`, or the PostgreSQL URL without
    /// its password and the schema).
    pub location: String,
    /// Recorded deliveries by decision wire name (`applied`, `conflict`,
    /// `duplicate`, `equal`, `held`, `stale`; every key present), every run
    /// the store has seen. `retry` and `reject` are never recorded.
    pub decisions: BTreeMap<String, u64>,
    /// Objects the store knows (tombstones included).
    pub objects: u64,
    /// Objects paused until reconciliation.
    pub paused_objects: u64,
    /// Objects whose state is a tombstone (`null`).
    pub deleted_objects: u64,
    /// Events still held (held, parked or malformed), by reason: a hold
    /// reason (`paused`, `unknown_object`, `missing_version`, ...) or, for
    /// held conflict evidence, the conflict kind (`event_variant`,
    /// `version_state`).
    pub held: BTreeMap<String, u64>,
    /// Unresolved inputs an authority superseded (kept and named, docs/CONTRACT.md §4).
    pub superseded: u64,
    /// Unknown objects with parked events, sorted by object id.
    pub parked: Vec<ParkedObject>,
    /// Event identities recorded (first records within retention that were
    /// not purged yet).
    pub identities: u64,
    /// Variants recorded for those identities (docs/CONTRACT.md §3.1).
    pub variants: u64,
    /// When the oldest identity still stored was recorded (RFC 3339 UTC);
    /// `null` without identities.
    pub oldest_identity_at: Option<String>,
    /// When the newest audit row was recorded (RFC 3339 UTC); `null` for an
    /// empty store.
    pub last_recorded_at: Option<String>,
}

/// An unknown object with parked events.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ParkedObject {
    /// The object identity the events name.
    pub object_id: String,
    /// How many events are parked for it.
    pub events: u64,
}

/// One stored object ([`StoreReader::object`], [`StoreReader::objects`]).
#[derive(Clone, Debug, Serialize)]
pub struct StoredObject {
    /// Object identity.
    pub object_id: String,
    /// Version (u64).
    pub version: u64,
    /// State, the stored JSON text (`null`: a tombstone).
    pub state: Box<RawValue>,
    /// Paused until reconciliation.
    pub paused: bool,
    /// Whether the state is a tombstone (`null`).
    pub deleted: bool,
    /// Why it is paused: `event_variant` or `version_state`; `null` when
    /// not paused (or when the audit row of the pause is missing).
    pub pause_reason: Option<String>,
    /// The event whose decision paused it; `null` when not paused.
    pub paused_by: Option<String>,
    /// When it was paused (RFC 3339 UTC); `null` when not paused.
    pub paused_at: Option<String>,
}

impl PartialEq for StoredObject {
    fn eq(&self, other: &Self) -> bool {
        self.object_id == other.object_id
            && self.version == other.version
            && self.state.get() == other.state.get()
            && self.paused == other.paused
            && self.deleted == other.deleted
            && self.pause_reason == other.pause_reason
            && self.paused_by == other.paused_by
            && self.paused_at == other.paused_at
    }
}

/// What the store keeps of one object waiting for an authority after a
/// fetch that did not settle it ([`StoreReader::authority_waits`]),
/// written by the reconciler that fetched (docs/CONTRACT.md §4).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AuthorityWaitLine {
    /// The object.
    pub object_id: String,
    /// Why it waited then, comma-separated (`paused,missing_version`).
    pub reasons: String,
    /// The last fetch's outcome label: `absent`, `older`, `wrong_object`,
    /// `unavailable`, `timeout`, `bad_answer`, `not_applied` (or
    /// `applied`/`unchanged` when the snapshot left needs behind).
    pub outcome: String,
    /// That outcome in words (as the authority or the receiver said it:
    /// escape it before showing it on a terminal).
    pub error: String,
    /// Fetches the reconciler made for it.
    pub attempts: u64,
    /// Since when it waited, RFC 3339 UTC.
    pub since: String,
    /// When the reconciler fetches it next, RFC 3339 UTC (`None`: not
    /// planned).
    pub next_try: Option<String>,
    /// When the outcome came, RFC 3339 UTC.
    pub at: String,
}

/// One held event ([`StoreReader::held`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HeldEvent {
    /// Event identity; `null` for a malformed body that named none.
    pub event_id: Option<String>,
    /// The object it names; `null` when the body named none.
    pub object_id: Option<String>,
    /// `held`, or `conflict` for held conflict evidence.
    pub decision: String,
    /// The hold reason, or the conflict kind for conflict evidence.
    pub reason: String,
    /// `held` (known object), `parked` (unknown object) or `malformed`.
    pub status: String,
    /// When it was held (RFC 3339 UTC).
    pub held_at: String,
    /// What is wrong, for a malformed body.
    pub detail: Option<String>,
    /// The body as received (invalid UTF-8 replaced by U+FFFD).
    pub body: String,
    /// For a variant (`conflict`, `event_variant`) that names another
    /// object than its event's first record: the first record's object,
    /// which the variant paused too (docs/CONTRACT.md §3.1); `null`
    /// otherwise, or when the first record has left the store.
    pub first_record_object_id: Option<String>,
}

/// One audit row ([`StoreReader::audit_for_event`],
/// [`StoreReader::audit_for_object`], [`StoreReader::recent_audit`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AuditLine {
    /// The step's sequence number in the run (receiver start) that recorded it.
    pub seq: u64,
    /// When it was recorded (RFC 3339 UTC).
    pub at: String,
    /// Event identity, if any.
    pub event_id: Option<String>,
    /// Object identity, if any.
    pub object_id: Option<String>,
    /// `delivery`, `malformed`, `paused`, `authority`, `authority_refused`,
    /// `reevaluated` or `unresolved`.
    pub kind: String,
    /// The decision wire name: a delivery's (`applied`, `duplicate`, ...),
    /// a re-decision's, `authority`, `authority_refused` or `unresolved`;
    /// `null` for a pause.
    pub decision: Option<String>,
    /// Hold reason; for `unresolved` what it was held as; for a forced
    /// authority `forced over version N`; for a refused one why.
    pub reason: Option<String>,
    /// Conflict kind of a `conflict`.
    pub conflict: Option<String>,
    /// For a `duplicate`: the first decision (for example `held (paused)`).
    pub original_decision: Option<String>,
    /// The object's version after the step, or the authority's version.
    pub version: Option<u64>,
    /// Whether the step replaced the object's state.
    pub replacement: bool,
    /// Extra facts in words (what was paused by which variant, previous
    /// version, what a body held as).
    pub detail: Option<String>,
    /// The body as received, for a delivery (invalid UTF-8 replaced by
    /// U+FFFD); for a forced authority the state it replaced.
    pub body: Option<String>,
}

impl StoreReader {
    /// Opens `location` for reading: `sqlite:PATH` (feature `sqlite`) or a
    /// `postgres://` / `postgresql://` URL (feature `postgres`) with the
    /// tables in `schema` (`None`: the connection's search path), the
    /// locations [`super::open_in_schema`] takes. Checks that the receiver's
    /// tables are there; creates nothing.
    ///
    /// # Errors
    /// [`StoreError::Missing`] for a SQLite file that does not exist;
    /// [`StoreError::NotAStore`] for a file that is not a SQLite database, a
    /// PostgreSQL schema that does not exist, or tables missing (named);
    /// [`StoreError::InvalidLocation`] for a location that does not parse
    /// ([`super::Location`]), for `memory` (nothing outside a receiver's
    /// process can read its memory) and for a schema given for a SQLite
    /// location; [`StoreError::Failed`] for a feature this build left out or
    /// a server that cannot be reached. Every message names the location.
    pub fn open(location: &str, schema: Option<&str>) -> Result<Self, StoreError> {
        let parsed = super::Location::parse(location)?;
        super::check_schema(&parsed, schema)?;
        match parsed {
            super::Location::Memory => Err(StoreError::InvalidLocation(
                "`memory` cannot be read: an in-memory store lives inside the process that runs \
                 the receiver; read a sqlite:PATH or postgres:// store"
                    .to_owned(),
            )),
            #[cfg(feature = "sqlite")]
            super::Location::Sqlite(path) => Ok(Self {
                location: location.to_owned(),
                backend: Backend::Sqlite(Mutex::new(super::sqlite::SqliteReadOnly::open(
                    &path, location,
                )?)),
            }),
            #[cfg(not(feature = "sqlite"))]
            super::Location::Sqlite(path) => Err(StoreError::Failed(format!(
                "cannot read sqlite:{path}: this build of snapshot-receiver has no `sqlite` feature"
            ))),
            #[cfg(feature = "postgres")]
            super::Location::Postgres(url) => {
                let connection = super::postgres::PgConnection::open(&url, schema)?;
                Ok(Self {
                    location: connection.name().to_owned(),
                    backend: Backend::Postgres(Box::new(Mutex::new(connection))),
                })
            }
            #[cfg(not(feature = "postgres"))]
            super::Location::Postgres(_) => Err(super::no_postgres()),
            #[cfg(feature = "lsm")]
            super::Location::Lsm(path) => Ok(Self {
                location: location.to_owned(),
                backend: Backend::Lsm(super::lsm::LsmRows::open(&path)?),
            }),
            #[cfg(not(feature = "lsm"))]
            super::Location::Lsm(path) => Err(StoreError::Failed(format!(
                "cannot read lsm:{path}: this build of snapshot-receiver has no `lsm` feature"
            ))),
        }
    }

    /// The location read, as messages name it (a PostgreSQL URL without its
    /// password, with the schema).
    pub fn location(&self) -> &str {
        &self.location
    }

    /// Counts of the whole store, read in one transaction.
    ///
    /// # Errors
    /// [`StoreError::Failed`] / [`StoreError::Backend`] when the store
    /// cannot be read or holds a row this version cannot read.
    pub fn summary(&self) -> Result<StoreSummary, StoreError> {
        #[cfg(feature = "lsm")]
        if let Some(found) = self.on_lsm(|rows| lsm_views::summary(rows, &self.location)) {
            return found;
        }
        self.read(|r| {
            let mut decisions: BTreeMap<String, u64> =
                DECISIONS.iter().map(|d| ((*d).to_owned(), 0)).collect();
            for row in r.rows(
                "SELECT decision, count(*) FROM audit
                 WHERE kind IN ('delivery', 'malformed') GROUP BY decision",
                &[],
            )? {
                let row = cells(&row);
                let code = row.opt_text(0)?.unwrap_or_default();
                let decision = delivery_wire(&code)?.decision;
                *decisions.entry(decision).or_default() += count(row.int(1)?);
            }
            let objects = r.rows(
                "SELECT count(*),
                        coalesce(sum(CASE WHEN paused THEN 1 ELSE 0 END), 0),
                        coalesce(sum(CASE WHEN state = 'null' THEN 1 ELSE 0 END), 0)
                 FROM objects",
                &[],
            )?;
            let (objects, paused_objects, deleted_objects) = match objects.first() {
                Some(row) => {
                    let row = cells(row);
                    (count(row.int(0)?), count(row.int(1)?), count(row.int(2)?))
                }
                None => (0, 0, 0),
            };
            let mut held = BTreeMap::new();
            let mut superseded = 0;
            for row in r.rows(
                "SELECT held_as, status, count(*) FROM held
                 WHERE status <> 'resolved' GROUP BY held_as, status",
                &[],
            )? {
                let row = cells(&row);
                let n = count(row.int(2)?);
                if row.text(1)? == "superseded" {
                    superseded += n;
                } else {
                    let (_, reason) = held_wire(verdict(&row.text(0)?)?);
                    *held.entry(reason).or_default() += n;
                }
            }
            let parked = r
                .rows(
                    "SELECT object_id, count(*) FROM held
                     WHERE status = 'parked' AND object_id IS NOT NULL
                     GROUP BY object_id ORDER BY object_id",
                    &[],
                )?
                .iter()
                .map(|row| {
                    let row = cells(row);
                    Ok(ParkedObject {
                        object_id: row.text(0)?,
                        events: count(row.int(1)?),
                    })
                })
                .collect::<Result<_, StoreError>>()?;
            let receipts = r.rows("SELECT count(*), min(first_seen_ns) FROM receipts", &[])?;
            let (identities, oldest) = match receipts.first() {
                Some(row) => {
                    let row = cells(row);
                    (count(row.int(0)?), row.opt_int(1)?)
                }
                None => (0, None),
            };
            let variants = match r
                .rows("SELECT count(*) FROM receipt_variants", &[])?
                .first()
            {
                Some(row) => count(cells(row).int(0)?),
                None => 0,
            };
            let last = match r.rows("SELECT max(at_ns) FROM audit", &[])?.first() {
                Some(row) => cells(row).opt_int(0)?,
                None => None,
            };
            Ok(StoreSummary {
                location: self.location.clone(),
                decisions,
                objects,
                paused_objects,
                deleted_objects,
                held,
                superseded,
                parked,
                identities,
                variants,
                oldest_identity_at: oldest.map(time_text),
                last_recorded_at: last.map(time_text),
            })
        })
    }

    /// One object as stored, with the cause of its pause; `None` when the
    /// store does not know it.
    ///
    /// # Errors
    /// As [`StoreReader::summary`].
    pub fn object(&self, object_id: &str) -> Result<Option<StoredObject>, StoreError> {
        #[cfg(feature = "lsm")]
        if let Some(found) = self.on_lsm(|rows| lsm_views::object(rows, object_id)) {
            return found;
        }
        self.read(|r| {
            let Some(row) = r
                .rows(
                    &format!("SELECT {OBJECT_COLUMNS} FROM objects WHERE object_id = $1"),
                    &[text(object_id)],
                )?
                .first()
                .map(|row| object_row(&cells(row)))
                .transpose()?
            else {
                return Ok(None);
            };
            let mut object = StoredObject::of(row)?;
            if object.paused {
                let causes = r.rows(
                    "SELECT object_id, event_id, kind, decision, at_ns FROM audit
                     WHERE object_id = $1 AND (kind = 'paused'
                       OR (kind IN ('delivery', 'reevaluated') AND decision LIKE 'conflict:%'))
                     ORDER BY {order} DESC LIMIT 1",
                    &[text(object_id)],
                )?;
                if let Some(row) = causes.first() {
                    pause_cause(&mut object, &cells(row))?;
                }
            }
            Ok(Some(object))
        })
    }

    /// Every stored object sorted by object id, or only the paused ones,
    /// each paused one with the cause of its pause.
    ///
    /// # Errors
    /// As [`StoreReader::summary`].
    pub fn objects(&self, paused_only: bool) -> Result<Vec<StoredObject>, StoreError> {
        #[cfg(feature = "lsm")]
        if let Some(found) = self.on_lsm(|rows| lsm_views::objects(rows, paused_only)) {
            return found;
        }
        self.read(|r| {
            let filter = if paused_only { "WHERE paused" } else { "" };
            let mut objects = r
                .rows(
                    &format!(
                        "SELECT {OBJECT_COLUMNS} FROM objects {filter}
                         ORDER BY object_id"
                    ),
                    &[],
                )?
                .iter()
                .map(|row| StoredObject::of(object_row(&cells(row))?))
                .collect::<Result<Vec<_>, _>>()?;
            if objects.iter().any(|o| o.paused) {
                // One pass over the pausing rows; the last one of each object
                // is what paused it (it has been paused ever since).
                let mut last: BTreeMap<String, Vec<Cell>> = BTreeMap::new();
                for row in r.rows(
                    "SELECT object_id, event_id, kind, decision, at_ns FROM audit
                     WHERE object_id IS NOT NULL AND (kind = 'paused'
                       OR (kind IN ('delivery', 'reevaluated') AND decision LIKE 'conflict:%'))
                     ORDER BY {order}",
                    &[],
                )? {
                    if let Some(id) = cells(&row).opt_text(0)? {
                        last.insert(id, row);
                    }
                }
                for object in objects.iter_mut().filter(|o| o.paused) {
                    if let Some(row) = last.remove(&object.object_id) {
                        pause_cause(object, &cells(&row))?;
                    }
                }
            }
            Ok(objects)
        })
    }

    /// The events still held (held, parked or malformed), in arrival order;
    /// with `reason`, only those held for it (a hold reason such as
    /// `paused`, or a conflict kind for conflict evidence). An unknown
    /// reason matches nothing.
    ///
    /// # Errors
    /// As [`StoreReader::summary`].
    pub fn held(&self, reason: Option<&str>) -> Result<Vec<HeldEvent>, StoreError> {
        #[cfg(feature = "lsm")]
        if let Some(found) = self.on_lsm(|rows| lsm_views::held(rows, reason)) {
            return found;
        }
        // The stored codes a reason stands for: `held:<reason>` and
        // `conflict:<kind>`.
        let codes = reason.map(|r| (format!("held:{r}"), format!("conflict:{r}")));
        self.read(|r| {
            let (filter, params) = match &codes {
                Some((held, conflict)) => {
                    ("AND held_as IN ($1, $2)", vec![text(held), text(conflict)])
                }
                None => ("", Vec::new()),
            };
            // `HELD_COLUMNS`, then the first record's object of a variant.
            r.rows(
                &format!(
                    "SELECT {HELD_COLUMNS},
                            CASE WHEN held_as = 'conflict:event_variant' THEN
                                (SELECT r.object_id FROM receipts AS r
                                 WHERE r.event_id = held.event_id) END
                     FROM held
                     WHERE status IN ('held', 'parked', 'malformed') {filter}
                     ORDER BY at_ns, {{order}}"
                ),
                &params,
            )?
            .iter()
            .map(|row| {
                let row = cells(row);
                Ok(HeldEvent::of(held_row(&row)?, row.opt_text(10)?))
            })
            .collect()
        })
    }

    /// The last error of each object waiting for an authority, as the
    /// reconciler that fetched wrote it, by object id (byte order). A row stays until
    /// the object converges through a reconciler, so a caller shows it
    /// beside what the store says needs an authority now. A store written
    /// only by a version before reconcilers has none.
    ///
    /// # Errors
    /// As [`StoreReader::summary`].
    pub fn authority_waits(&self) -> Result<Vec<AuthorityWaitLine>, StoreError> {
        #[cfg(feature = "lsm")]
        if let Some(found) = self.on_lsm(lsm_views::authority_waits) {
            return found;
        }
        self.read(|r| {
            if !r.has_table("authority_waits")? {
                return Ok(Vec::new());
            }
            r.rows(
                "SELECT object_id, reasons, outcome, error, attempts, since_ns, next_try_ns,
                        at_ns
                 FROM authority_waits ORDER BY object_id",
                &[],
            )?
            .iter()
            .map(|row| {
                let row = cells(row);
                let at = |ns: i64| format_rfc3339(ns_time(ns));
                Ok(AuthorityWaitLine {
                    object_id: row.text(0)?,
                    reasons: row.text(1)?,
                    outcome: row.text(2)?,
                    error: row.text(3)?,
                    attempts: count(row.int(4)?),
                    since: at(row.int(5)?),
                    next_try: row.opt_int(6)?.map(at),
                    at: at(row.int(7)?),
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()
            .map(|mut waits| {
                // Byte order, whatever the database's collation.
                waits.sort_by(|a, b| a.object_id.cmp(&b.object_id));
                waits
            })
        })
    }

    /// The audit trail of one event identity, in the order it was recorded.
    ///
    /// # Errors
    /// As [`StoreReader::summary`].
    pub fn audit_for_event(&self, event_id: &str) -> Result<Vec<AuditLine>, StoreError> {
        #[cfg(feature = "lsm")]
        if let Some(found) =
            self.on_lsm(|rows| lsm_views::audit(rows, |a| a.event_id.as_deref() == Some(event_id)))
        {
            return found;
        }
        self.audit_where("WHERE event_id = $1", &[text(event_id)], false)
    }

    /// The audit trail of one object, in the order it was recorded.
    ///
    /// # Errors
    /// As [`StoreReader::summary`].
    pub fn audit_for_object(&self, object_id: &str) -> Result<Vec<AuditLine>, StoreError> {
        #[cfg(feature = "lsm")]
        if let Some(found) = self
            .on_lsm(|rows| lsm_views::audit(rows, |a| a.object_id.as_deref() == Some(object_id)))
        {
            return found;
        }
        self.audit_where("WHERE object_id = $1", &[text(object_id)], false)
    }

    /// The store's relays (docs/CONTRACT.md §10) at `now`, each judged
    /// against the history `window` ([`super::RelaysReport`]), read in one
    /// transaction. A store written only by a version before relays has
    /// none; one written before the relays' backlog was kept has it
    /// unknown ([`super::RelayStatus::backlogged`] `None`).
    ///
    /// # Errors
    /// As [`StoreReader::summary`].
    pub fn relays(
        &self,
        now: std::time::SystemTime,
        window: Option<std::time::Duration>,
    ) -> Result<super::RelaysReport, StoreError> {
        #[cfg(feature = "lsm")]
        if let Some(found) = self.on_lsm(|rows| lsm_views::relays(rows, now, window)) {
            return found;
        }
        let report = |last: u64, relays| super::RelaysReport {
            last_position: last,
            history_window_seconds: window.map(|w| w.as_secs()),
            relays,
        };
        self.read(|r| {
            if !r.has_table("relay_parked")? || !r.has_table("outbox")? {
                return Ok(report(0, Vec::new()));
            }
            let last = match r.rows("SELECT last FROM outbox", &[])?.first() {
                Some(row) => count(cells(row).int(0)?),
                None => 0,
            };
            let mut parked_lines: BTreeMap<String, Vec<ParkedLine>> = BTreeMap::new();
            for row in r.rows(&parked_effects(""), &[])? {
                let row = cells(&row);
                let line = ParkedLine::of(&parked(&row)?);
                parked_lines
                    .entry(row.text(PARKED_RELAY)?)
                    .or_default()
                    .push(line);
            }
            let columns = if r.has_column("relays", "parked_bytes")? {
                RELAY_COLUMNS
            } else {
                RELAY_COLUMNS_BEFORE_BACKLOG
            };
            let mut relays = Vec::new();
            for row in r.rows(&format!("SELECT {columns} FROM relays ORDER BY name"), &[])? {
                let relay = relay_row(&cells(&row))?;
                let next = match r
                    .rows(
                        "SELECT position, at_ns FROM replacements WHERE position > $1
                         ORDER BY position LIMIT 1",
                        &[int(stored(relay.position))],
                    )?
                    .first()
                {
                    Some(row) => {
                        let row = cells(row);
                        Some((count(row.int(0)?), ns_time(row.int(1)?)))
                    }
                    None => None,
                };
                let lines = parked_lines.remove(&relay.name).unwrap_or_default();
                relays.push(status(relay, lines, next, last, now, window));
            }
            Ok(report(last, relays))
        })
    }

    /// The last `limit` audit rows of the whole store (its last commits),
    /// oldest first.
    ///
    /// # Errors
    /// As [`StoreReader::summary`].
    pub fn recent_audit(&self, limit: usize) -> Result<Vec<AuditLine>, StoreError> {
        #[cfg(feature = "lsm")]
        if let Some(found) = self.on_lsm(|rows| lsm_views::recent_audit(rows, limit)) {
            return found;
        }
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut lines = self.audit_where("", &[int(limit)], true)?;
        lines.reverse();
        Ok(lines)
    }

    fn audit_where(
        &self,
        filter: &str,
        params: &[Value<'_>],
        newest_first: bool,
    ) -> Result<Vec<AuditLine>, StoreError> {
        self.read(|r| {
            let tail = if newest_first {
                "ORDER BY {order} DESC LIMIT $1"
            } else {
                "ORDER BY {order}"
            };
            // A store created before repeated bodies were stored once,
            // read without migrating it, keeps every body in place.
            let columns = if r.has_column("audit", "body_seq")? {
                AUDIT_COLUMNS
            } else {
                AUDIT_COLUMNS_IN_PLACE
            };
            r.rows(
                &format!("SELECT {columns} FROM audit {filter} {tail}"),
                params,
            )?
            .iter()
            .map(|row| AuditLine::of(audit_row(&cells(row))?))
            .collect()
        })
    }

    /// `view` of the log-structured store's rows when that is what this
    /// reads, guarded (a panic of the LSM library on a damaged file is an
    /// error); `None` for another backend.
    #[cfg(feature = "lsm")]
    fn on_lsm<T>(
        &self,
        view: impl FnOnce(&super::lsm::LsmRows) -> Result<T, StoreError>,
    ) -> Option<Result<T, StoreError>> {
        match &self.backend {
            Backend::Lsm(rows) => Some(crate::store::lsm::guarded("read", || view(rows))),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// Runs `f` in one read transaction of the backend.
    fn read<T>(
        &self,
        f: impl FnOnce(&mut dyn Reads) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        match &self.backend {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite(conn) => lock(conn).read(f),
            #[cfg(feature = "postgres")]
            Backend::Postgres(conn) => lock(conn).read(f),
            // Its views read it without SQL (each method dispatches first).
            #[cfg(feature = "lsm")]
            Backend::Lsm(_) => Err(StoreError::Failed(format!(
                "{}: an lsm store is not read through SQL",
                self.location
            ))),
        }
    }
}

impl std::fmt::Debug for StoreReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreReader")
            .field("location", &self.location)
            .finish_non_exhaustive()
    }
}

/// One row read back, as the row decoders read it.
fn cells(row: &[Cell]) -> Cells<'_> {
    Cells::new("reader", row)
}

/// A count read back (never negative).
fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// Stored nanoseconds as RFC 3339 UTC.
fn time_text(ns: i64) -> String {
    format_rfc3339(ns_time(ns))
}

/// A decision in the §7 wire fields.
struct Wire {
    decision: String,
    reason: Option<String>,
    conflict: Option<String>,
    original_decision: Option<String>,
}

/// A stored delivery decision code (`applied`, `held:paused`,
/// `duplicate:conflict:event_variant`, ...) in the §7 wire fields.
fn delivery_wire(code: &str) -> Result<Wire, StoreError> {
    if let Some(original) = code.strip_prefix("duplicate:") {
        let original = verdict(original)?;
        return Ok(Wire {
            decision: "duplicate".to_owned(),
            reason: None,
            conflict: None,
            original_decision: Some(original.to_string()),
        });
    }
    let (decision, reason, conflict) = verdict_wire(code)?;
    Ok(Wire {
        decision,
        reason,
        conflict,
        original_decision: None,
    })
}

/// A stored verdict code as (decision, reason, conflict).
fn verdict_wire(code: &str) -> Result<(String, Option<String>, Option<String>), StoreError> {
    let decision = Decision::from(verdict(code)?);
    Ok((
        decision.as_str().to_owned(),
        decision.reason().map(|r| r.as_str().to_owned()),
        decision.conflict().map(|k| k.as_str().to_owned()),
    ))
}

/// What a held row was held as: (decision, reason), the reason being the
/// conflict kind for conflict evidence.
fn held_wire(v: Verdict) -> (String, String) {
    (
        v.as_str().to_owned(),
        v.detail().unwrap_or_else(|| v.as_str()).to_owned(),
    )
}

impl StoredObject {
    /// An object row as the operator sees it (no pause cause yet).
    fn of(row: ObjectRow) -> Result<Self, StoreError> {
        let object_id = row.object_id.to_string();
        let deleted = row.state == "null";
        let state = RawValue::from_string(row.state).map_err(|e| {
            StoreError::Failed(format!("stored state of {object_id} is not JSON: {e}"))
        })?;
        Ok(Self {
            object_id,
            version: row.version,
            state,
            paused: row.paused,
            deleted,
            pause_reason: None,
            paused_by: None,
            paused_at: None,
        })
    }
}

/// Fills the pause cause from an audit row `object_id, event_id, kind,
/// decision, at_ns` that paused the object.
fn pause_cause(object: &mut StoredObject, row: &dyn Columns) -> Result<(), StoreError> {
    pause_cause_of(
        object,
        &row.text(2)?,
        row.opt_text(3)?.as_deref(),
        row.opt_text(1)?.as_deref(),
        ns_time(row.int(4)?),
    )
}

/// Fills the pause cause from what paused the object: the audit row's
/// kind, decision code, event and time.
fn pause_cause_of(
    object: &mut StoredObject,
    kind: &str,
    decision: Option<&str>,
    event_id: Option<&str>,
    at: std::time::SystemTime,
) -> Result<(), StoreError> {
    object.pause_reason = Some(if kind == "paused" {
        // A variant naming another object paused this one (docs/CONTRACT.md §3.1).
        "event_variant".to_owned()
    } else {
        let (_, _, conflict) = verdict_wire(decision.unwrap_or_default())?;
        conflict.unwrap_or_default()
    });
    object.paused_by = event_id.map(str::to_owned);
    object.paused_at = Some(format_rfc3339(at));
    Ok(())
}

impl HeldEvent {
    /// A held row as the operator sees it; `first`: the object of its
    /// event's first record, for a variant (`None` otherwise).
    fn of(row: HeldRow, first: Option<String>) -> Self {
        let (decision, reason) = held_wire(row.held_as);
        let object_id = row.object_id.as_deref().map(str::to_owned);
        Self {
            event_id: row.event_id.as_deref().map(str::to_owned),
            first_record_object_id: first.filter(|first| Some(first) != object_id.as_ref()),
            object_id,
            decision,
            reason,
            status: row.status.as_str().to_owned(),
            held_at: format_rfc3339(row.at),
            detail: row.detail,
            body: String::from_utf8_lossy(&row.body).into_owned(),
        }
    }
}

impl AuditLine {
    /// An audit row with the §7 wire names.
    fn of(row: AuditRow) -> Result<Self, StoreError> {
        let kind = row.kind;
        let detail = row.detail;
        let (decision, reason, conflict, original_decision) = match (kind, row.decision.as_deref())
        {
            ("delivery" | "malformed" | "reevaluated", Some(code)) => {
                let w = delivery_wire(code)?;
                (Some(w.decision), w.reason, w.conflict, w.original_decision)
            }
            ("authority", Some("forced")) => (
                Some("authority".to_owned()),
                // "forced over version N, state ...; as of ...": the §7 reason
                // is its first part.
                detail
                    .as_deref()
                    .and_then(|d| d.split(',').next())
                    .map(str::to_owned),
                None,
                None,
            ),
            ("authority", _) => (Some("authority".to_owned()), None, None, None),
            ("authority_refused", _) => (Some(kind.to_owned()), detail.clone(), None, None),
            ("unresolved", Some(code)) => {
                let (_, held_as) = held_wire(verdict(code)?);
                (Some("unresolved".to_owned()), Some(held_as), None, None)
            }
            _ => (None, None, None, None),
        };
        Ok(Self {
            seq: row.key.seq,
            at: format_rfc3339(row.at),
            event_id: row.event_id.as_deref().map(str::to_owned),
            object_id: row.object_id.as_deref().map(str::to_owned),
            kind: kind.to_owned(),
            decision,
            reason,
            conflict,
            original_decision,
            version: row.version,
            replacement: row.replacement,
            detail,
            body: row.body.map(|b| String::from_utf8_lossy(&b).into_owned()),
        })
    }
}
