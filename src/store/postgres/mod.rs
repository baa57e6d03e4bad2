//! PostgreSQL (the synchronous `postgres` client, run on the committer
//! thread) for several receiver processes sharing one database.
//!
//! Correctness across processes comes from the database, not from any
//! in-process router. A group commit whose writes fold (see `group.rs`: the
//! deliveries and pauses of the shards, the common case) is one statement,
//! [`GROUP`], sent in one round trip with one array per column, that commits
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

use super::group::{self, Group, ObjectWrite};
use super::pointer::{self, StateAt};
use super::stats::PhaseClock;
use super::{
    audit_kind, cutoff_ns, ns_time, parse_version, time_ns, verdict, version_text, AuditRow,
    CommitPhases, Expect, HeldKey, HeldRow, HeldStatus, Loaded, ObjectRow, ReceiptRow, Records,
    ReplacementRow, Store, StoreError, VariantRow, Write,
};
use postgres::{Client, NoTls, Statement};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS receipts (
    event_id      TEXT PRIMARY KEY,
    fingerprint   BYTEA NOT NULL,
    object_id     TEXT NOT NULL,
    decision      TEXT NOT NULL,
    first_seen_ns BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS receipts_first_seen ON receipts (first_seen_ns);
CREATE TABLE IF NOT EXISTS receipt_variants (
    event_id      TEXT NOT NULL,
    fingerprint   BYTEA NOT NULL,
    object_id     TEXT NOT NULL,
    first_seen_ns BIGINT NOT NULL,
    PRIMARY KEY (event_id, fingerprint)
);
CREATE INDEX IF NOT EXISTS receipt_variants_first_seen ON receipt_variants (first_seen_ns);
CREATE TABLE IF NOT EXISTS objects (
    object_id TEXT PRIMARY KEY,
    version   TEXT NOT NULL CHECK (length(version) = 20),
    state     TEXT NOT NULL,
    paused    BOOLEAN NOT NULL
);
CREATE TABLE IF NOT EXISTS held (
    id            BIGINT GENERATED ALWAYS AS IDENTITY,
    origin        BIGINT NOT NULL,
    seq           BIGINT NOT NULL,
    at_ns         BIGINT NOT NULL,
    event_id      TEXT,
    object_id     TEXT,
    held_as       TEXT NOT NULL,
    body          BYTEA NOT NULL,
    status        TEXT NOT NULL,
    superseded_by TEXT,
    detail        TEXT,
    PRIMARY KEY (origin, seq)
);
CREATE INDEX IF NOT EXISTS held_status ON held (status);
CREATE TABLE IF NOT EXISTS replacements (
    id          BIGINT GENERATED ALWAYS AS IDENTITY,
    origin      BIGINT NOT NULL,
    seq         BIGINT NOT NULL,
    at_ns       BIGINT NOT NULL,
    object_id   TEXT NOT NULL,
    version     TEXT NOT NULL,
    state       TEXT NOT NULL,
    cause_event TEXT,
    PRIMARY KEY (origin, seq)
);
CREATE INDEX IF NOT EXISTS replacements_at ON replacements (at_ns);
CREATE INDEX IF NOT EXISTS held_event ON held (event_id);
CREATE TABLE IF NOT EXISTS audit (
    id          BIGINT GENERATED ALWAYS AS IDENTITY,
    origin      BIGINT NOT NULL,
    seq         BIGINT NOT NULL,
    at_ns       BIGINT NOT NULL,
    event_id    TEXT,
    object_id   TEXT,
    kind        TEXT NOT NULL,
    decision    TEXT,
    version     TEXT,
    replacement BOOLEAN NOT NULL,
    detail      TEXT,
    body        BYTEA,
    PRIMARY KEY (origin, seq)
);
CREATE INDEX IF NOT EXISTS audit_at ON audit (at_ns);
-- The last step of a group commit (see GROUP in the source): a count short
-- of the group's aborts the statement, so nothing of the group is committed.
CREATE OR REPLACE FUNCTION snapshot_receiver_check_group(
    objects_as_read BIGINT, objects BIGINT,
    rows_written BIGINT, rows_to_write BIGINT,
    receipts_inserted BIGINT, receipts BIGINT,
    variants_inserted BIGINT, variants BIGINT) RETURNS BIGINT
LANGUAGE plpgsql AS $$
BEGIN
    IF objects_as_read <> objects OR rows_written <> rows_to_write THEN
        RAISE EXCEPTION '% of the group''s % objects changed since they were read',
            objects - objects_as_read, objects
            USING ERRCODE = 'serialization_failure';
    END IF;
    IF receipts_inserted <> receipts THEN
        RAISE EXCEPTION '% of the group''s % receipts already exist',
            receipts - receipts_inserted, receipts
            USING ERRCODE = 'unique_violation';
    END IF;
    IF variants_inserted <> variants THEN
        RAISE EXCEPTION '% of the group''s % variants already exist',
            variants - variants_inserted, variants
            USING ERRCODE = 'unique_violation';
    END IF;
    RETURN objects + receipts + variants;
END
$$;
";

/// Prepared statements of one connection: one per write kind for the
/// row-by-row path, one for a whole folded group.
struct Statements {
    receipt: Statement,
    /// Deletes the variants of an identity recorded before its new receipt.
    old_variants: Statement,
    variant: Statement,
    replace: Statement,
    flag: Statement,
    authority: Statement,
    /// Inserts an object if absent: a seed, or an object an event created.
    seed: Statement,
    pause: Statement,
    check: Statement,
    held: Statement,
    held_status: Statement,
    audit: Statement,
    replacement: Statement,
    /// A whole folded group in one statement that commits on its own.
    group: Statement,
}

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
            if s.is_empty() || !s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(StoreError::Failed(format!(
                    "schema name {s:?} must be ASCII letters, digits and underscores"
                )));
            }
        }
        let mut store = Self {
            url: url.to_owned(),
            schema: schema.map(str::to_owned),
            conn: None,
            phases: CommitPhases::default(),
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
            // Two processes creating the schema or tables at once can race in
            // the catalog: serialise that with an advisory lock.
            client
                .batch_execute("SELECT pg_advisory_lock(7140715)")
                .map_err(failed)?;
            let mut setup = String::new();
            if let Some(schema) = &self.schema {
                setup =
                    format!("CREATE SCHEMA IF NOT EXISTS {schema}; SET search_path TO {schema};");
            }
            setup.push_str(SCHEMA);
            let created = client
                .batch_execute(&setup)
                .and_then(|()| add_state_pointer(&mut client))
                .map_err(failed);
            client
                .batch_execute("SELECT pg_advisory_unlock(7140715)")
                .map_err(failed)?;
            created?;
            let statements = prepare(&mut client).map_err(failed)?;
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

/// Adds the history's pointer into the audit body (docs/CONTRACT.md §9) to
/// a store created without it: `state_at`, `state_len` (`NULL`: the state
/// is in the row). Only when missing, so that opening a current store
/// takes no table lock.
fn add_state_pointer(client: &mut Client) -> Result<(), postgres::Error> {
    let present = client.query(
        "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema()
         AND table_name = 'replacements' AND column_name = 'state_at'",
        &[],
    )?;
    if present.is_empty() {
        client.batch_execute(
            "ALTER TABLE replacements ADD COLUMN IF NOT EXISTS state_at BIGINT,
                                      ADD COLUMN IF NOT EXISTS state_len BIGINT",
        )?;
    }
    Ok(())
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

fn prepare(c: &mut Client) -> Result<Statements, postgres::Error> {
    Ok(Statements {
        receipt: c.prepare(
            "INSERT INTO receipts (event_id, fingerprint, object_id, decision, first_seen_ns)
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (event_id) DO UPDATE
             SET fingerprint = excluded.fingerprint, object_id = excluded.object_id,
                 decision = excluded.decision, first_seen_ns = excluded.first_seen_ns
             WHERE receipts.first_seen_ns <= $6",
        )?,
        old_variants: c.prepare(
            "DELETE FROM receipt_variants WHERE event_id = $1 AND first_seen_ns < $2",
        )?,
        variant: c.prepare(
            "INSERT INTO receipt_variants (event_id, fingerprint, object_id, first_seen_ns)
             VALUES ($1, $2, $3, $4) ON CONFLICT (event_id, fingerprint) DO NOTHING",
        )?,
        replace: c.prepare(
            "UPDATE objects SET version = $2, state = $3, paused = $4
             WHERE object_id = $1 AND version < $2 AND version = $5 AND paused = $6",
        )?,
        flag: c.prepare(
            "UPDATE objects SET version = $2, state = $3, paused = $4
             WHERE object_id = $1 AND version = $5 AND paused = $6",
        )?,
        authority: c.prepare(
            "INSERT INTO objects (object_id, version, state, paused) VALUES ($1, $2, $3, $4)
             ON CONFLICT (object_id) DO UPDATE
             SET version = excluded.version, state = excluded.state, paused = excluded.paused
             WHERE objects.version <= $5",
        )?,
        seed: c.prepare(
            "INSERT INTO objects (object_id, version, state, paused) VALUES ($1, $2, $3, $4)
             ON CONFLICT (object_id) DO NOTHING",
        )?,
        pause: c.prepare("UPDATE objects SET paused = TRUE WHERE object_id = $1")?,
        check: c.prepare(
            "SELECT 1 FROM objects WHERE object_id = $1 AND version = $2 AND paused = $3 FOR UPDATE",
        )?,
        held: c.prepare(
            "INSERT INTO held (origin, seq, at_ns, event_id, object_id, held_as, body, status, superseded_by, detail)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )?,
        held_status: c.prepare(
            "UPDATE held SET status = $3, superseded_by = $4 WHERE origin = $1 AND seq = $2",
        )?,
        replacement: c.prepare(
            "INSERT INTO replacements (origin, seq, at_ns, object_id, version, state, cause_event, state_at, state_len)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )?,
        audit: c.prepare(
            "INSERT INTO audit (origin, seq, at_ns, event_id, object_id, kind, decision, version, replacement, detail, body)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )?,
        group: c.prepare(GROUP)?,
    })
}

/// A folded group as one statement, sent in one round trip and committed on
/// its own (no `BEGIN` / `COMMIT`: a single statement is its own
/// transaction, and the driver returns only after the server's
/// `ReadyForQuery`, that is after the commit and, with
/// `synchronous_commit=on`, its WAL flush).
///
/// The arbitration between processes: `locked` locks every object row of
/// the group (FOR UPDATE, in object order, so that two processes cannot
/// deadlock on them) if and only if it still has the version and pause flag
/// the group's first decision on it read; under READ COMMITTED a row another
/// transaction changed meanwhile is re-read once its lock is granted and
/// counted only if it still matches. `written` changes only locked rows,
/// taking the values to write from `locked` itself: joining `written` back
/// to `o` made the planner (which guesses 10 rows for any `unnest`) pick a
/// nested loop over the two CTEs, quadratic in the group's objects (1,645
/// objects: 2.7 million comparisons, 710 of a commit's 738 ms).
/// Receipts are unique on `event_id` and variants on (`event_id`,
/// fingerprint): a row that exists is not inserted, except that a receipt
/// first seen at or before its row's retention cut-off (`$45`, expired but
/// not purged yet, docs/CONTRACT.md §5) is replaced, and `old_variants`
/// deletes the variants recorded before the new receipt (the expired
/// one's; a variant the same group records again replaces its old row in
/// `variants_in` instead, since one statement must not both delete and
/// insert a row). The final check
/// compares the counts with the group's and raises `serialization_failure`
/// (objects) or `unique_violation` (receipts, variants) when one is short, which aborts the statement: nothing of the group is
/// committed, and the store answers [`StoreError::Conflict`].
const GROUP: &str = "
WITH o AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::bool[], $4::bool[],
                         $5::text[], $6::text[], $7::bool[])
        AS o (object_id, read_version, read_paused, write, version, state, paused)
),
locked AS (
    SELECT objects.object_id, o.write, o.version, o.state, o.paused
    FROM objects JOIN o USING (object_id)
    WHERE (o.read_version IS NULL OR objects.version = o.read_version)
      AND (o.read_paused IS NULL OR objects.paused = o.read_paused)
    ORDER BY objects.object_id
    FOR UPDATE OF objects
),
written AS (
    UPDATE objects SET version = coalesce(l.version, objects.version),
                       state = coalesce(l.state, objects.state),
                       paused = l.paused
    FROM locked AS l
    WHERE l.write AND objects.object_id = l.object_id
    RETURNING 1
),
receipts_in AS (
    INSERT INTO receipts AS r (event_id, fingerprint, object_id, decision, first_seen_ns)
    SELECT * FROM unnest($8::text[], $9::bytea[], $10::text[], $11::text[], $12::int8[])
    ON CONFLICT (event_id) DO UPDATE
    SET fingerprint = excluded.fingerprint, object_id = excluded.object_id,
        decision = excluded.decision, first_seen_ns = excluded.first_seen_ns
    WHERE r.first_seen_ns <= (SELECT c.cutoff FROM unnest($8::text[], $45::int8[])
                              AS c (event_id, cutoff) WHERE c.event_id = excluded.event_id)
    RETURNING 1
),
old_variants AS (
    DELETE FROM receipt_variants v
    USING unnest($8::text[], $12::int8[]) AS n (event_id, first_seen_ns)
    WHERE v.event_id = n.event_id AND v.first_seen_ns < n.first_seen_ns
      AND NOT EXISTS (SELECT 1 FROM unnest($41::text[], $42::bytea[]) AS w (event_id, fingerprint)
                      WHERE w.event_id = v.event_id AND w.fingerprint = v.fingerprint)
),
held_in AS (
    INSERT INTO held (origin, seq, at_ns, event_id, object_id, held_as, body, status, superseded_by, detail)
    SELECT * FROM unnest($13::int8[], $14::int8[], $15::int8[], $16::text[], $17::text[],
                         $18::text[], $19::bytea[], $20::text[], $21::text[], $22::text[])
),
audit_in AS (
    INSERT INTO audit (origin, seq, at_ns, event_id, object_id, kind, decision, version, replacement, detail, body)
    SELECT * FROM unnest($23::int8[], $24::int8[], $25::int8[], $26::text[], $27::text[],
                         $28::text[], $29::text[], $30::text[], $31::bool[], $32::text[], $33::bytea[])
),
replacements_in AS (
    INSERT INTO replacements (origin, seq, at_ns, object_id, version, state, cause_event, state_at, state_len)
    SELECT * FROM unnest($34::int8[], $35::int8[], $36::int8[], $37::text[], $38::text[],
                         $39::text[], $40::text[], $46::int8[], $47::int8[])
),
variants_in AS (
    INSERT INTO receipt_variants AS v (event_id, fingerprint, object_id, first_seen_ns)
    SELECT * FROM unnest($41::text[], $42::bytea[], $43::text[], $44::int8[])
    ON CONFLICT (event_id, fingerprint) DO UPDATE
    SET object_id = excluded.object_id, first_seen_ns = excluded.first_seen_ns
    WHERE v.event_id = ANY($8::text[]) AND v.first_seen_ns < excluded.first_seen_ns
    RETURNING 1
)
SELECT snapshot_receiver_check_group(
    (SELECT count(*) FROM locked), (SELECT count(*) FROM o),
    (SELECT count(*) FROM written), (SELECT count(*) FROM o WHERE o.write),
    (SELECT count(*) FROM receipts_in), cardinality($8::text[]),
    (SELECT count(*) FROM variants_in), cardinality($41::text[]))
";

/// One batch of the audit purge ([`Store::purge_records`]), in one
/// statement: at most `$2` audit rows recorded before `$1` that justify
/// nothing still held (docs/CONTRACT.md §9: not a row of an event identity
/// or step whose held row is not resolved, not a row of a paused object),
/// nor the rows of the highest sequence number, from which a restarted
/// receiver numbers its steps; a history row that takes its state from one of them gets the state
/// copied in first. Counts the audit rows deleted.
const PURGE_AUDIT: &str = "
WITH batch AS (
    SELECT a.id, a.origin, a.seq, a.body FROM audit AS a
    WHERE a.at_ns < $1 AND a.seq < (SELECT max(seq) FROM audit)
      AND NOT EXISTS (SELECT 1 FROM held AS h WHERE h.status <> 'resolved'
                      AND h.origin = a.origin AND h.seq = a.seq)
      AND NOT EXISTS (SELECT 1 FROM held AS h WHERE h.status <> 'resolved'
                      AND h.event_id = a.event_id)
      AND NOT EXISTS (SELECT 1 FROM objects AS o WHERE o.paused AND o.object_id = a.object_id)
    ORDER BY a.at_ns LIMIT $2
),
kept AS (
    UPDATE replacements AS r
    SET state = convert_from(substring(b.body FROM (r.state_at + 1)::int FOR r.state_len::int), 'UTF8'),
        state_at = NULL, state_len = NULL
    FROM batch AS b
    WHERE r.origin = b.origin AND r.seq = b.seq AND r.state_at IS NOT NULL
)
DELETE FROM audit AS a USING batch AS b WHERE a.id = b.id
";

/// A folded group's statement parameters, one array per column.
struct Columns<'a> {
    /// One entry per object.
    objects: ObjectColumns<'a>,
    /// Receipts of first deliveries.
    receipts: ReceiptColumns<'a>,
    /// Variants of event identities.
    variants: VariantColumns<'a>,
    /// Held inputs.
    held: HeldColumns<'a>,
    /// Audit rows.
    audit: AuditColumns<'a>,
    /// State replacements.
    replacements: ReplacementColumns<'a>,
}

/// The group's objects as columns.
#[derive(Default)]
struct ObjectColumns<'a> {
    object_id: Vec<&'a str>,
    /// The version the group's first decision read (`NULL`: none read it).
    read_version: Vec<Option<String>>,
    /// The pause flag it read (`NULL`: none read it).
    read_paused: Vec<Option<bool>>,
    /// Whether the row is written (`false`: only checked and locked).
    write: Vec<bool>,
    /// The version written (`NULL`: kept, for a pause).
    version: Vec<Option<String>>,
    /// The state written (`NULL`: kept, for a pause).
    state: Vec<Option<&'a str>>,
    /// The pause flag written.
    paused: Vec<Option<bool>>,
}

/// Variants as columns.
struct VariantColumns<'a> {
    event_id: Vec<&'a str>,
    /// 16 bytes, little-endian.
    fingerprint: Vec<[u8; 16]>,
    object_id: Vec<&'a str>,
    first_seen: Vec<i64>,
}

impl<'a> VariantColumns<'a> {
    fn of(variants: &[&'a VariantRow]) -> Self {
        Self {
            event_id: variants.iter().map(|v| &*v.event_id).collect(),
            fingerprint: variants
                .iter()
                .map(|v| v.fingerprint.to_le_bytes())
                .collect(),
            object_id: variants.iter().map(|v| &*v.object_id).collect(),
            first_seen: variants.iter().map(|v| time_ns(v.first_seen)).collect(),
        }
    }
}

/// Receipts as columns.
struct ReceiptColumns<'a> {
    event_id: Vec<&'a str>,
    /// 16 bytes, little-endian.
    fingerprint: Vec<[u8; 16]>,
    object_id: Vec<&'a str>,
    decision: Vec<String>,
    first_seen: Vec<i64>,
    /// [`ReceiptRow::retention_cutoff`] in stored nanoseconds (`-1`: none).
    cutoff: Vec<i64>,
}

impl<'a> Columns<'a> {
    fn of(group: &'a Group<'_>) -> Self {
        let mut objects = ObjectColumns::default();
        for o in &group.objects {
            let (write, version, state, paused) = match &o.write {
                ObjectWrite::Check => (false, None, None, None),
                ObjectWrite::Pause => (true, None, None, Some(true)),
                ObjectWrite::Row(row) => (
                    true,
                    Some(version_text(row.version)),
                    Some(row.state.as_str()),
                    Some(row.paused),
                ),
            };
            objects.object_id.push(&**o.object_id);
            objects.read_version.push(o.read_version.map(version_text));
            objects.read_paused.push(o.read_paused);
            objects.write.push(write);
            objects.version.push(version);
            objects.state.push(state);
            objects.paused.push(paused);
        }
        let r = &group.receipts;
        Self {
            objects,
            receipts: ReceiptColumns {
                event_id: r.iter().map(|r| &*r.event_id).collect(),
                fingerprint: r.iter().map(|r| r.fingerprint.to_le_bytes()).collect(),
                object_id: r.iter().map(|r| &*r.object_id).collect(),
                decision: r.iter().map(|r| r.decision.code()).collect(),
                first_seen: r.iter().map(|r| time_ns(r.first_seen)).collect(),
                cutoff: r.iter().map(|r| cutoff_ns(r.retention_cutoff)).collect(),
            },
            variants: VariantColumns::of(&group.variants),
            held: HeldColumns::of(&group.held),
            audit: AuditColumns::of(&group.audit),
            replacements: ReplacementColumns::of(
                &group.replacements,
                &pointer::delivery_bodies(group.audit.iter().copied()),
            ),
        }
    }

    /// Runs [`GROUP`]: one round trip, committed when it returns `Ok`.
    fn commit(&self, client: &mut Client, st: &Statements) -> Result<(), StoreError> {
        let (o, r, v) = (&self.objects, &self.receipts, &self.variants);
        let fingerprints: Vec<&[u8]> = r.fingerprint.iter().map(|f| &f[..]).collect();
        let variant_fingerprints: Vec<&[u8]> = v.fingerprint.iter().map(|f| &f[..]).collect();
        let (h, a, p) = (&self.held, &self.audit, &self.replacements);
        client
            .query_one(
                &st.group,
                &[
                    &o.object_id,
                    &o.read_version,
                    &o.read_paused,
                    &o.write,
                    &o.version,
                    &o.state,
                    &o.paused, // objects
                    &r.event_id,
                    &fingerprints,
                    &r.object_id,
                    &r.decision,
                    &r.first_seen, // receipts
                    &h.origin,
                    &h.seq,
                    &h.at,
                    &h.event_id,
                    &h.object_id,
                    &h.held_as,
                    &h.body,
                    &h.status,
                    &h.superseded_by,
                    &h.detail, // held
                    &a.origin,
                    &a.seq,
                    &a.at,
                    &a.event_id,
                    &a.object_id,
                    &a.kind,
                    &a.decision,
                    &a.version,
                    &a.replacement,
                    &a.detail,
                    &a.body, // audit
                    &p.origin,
                    &p.seq,
                    &p.at,
                    &p.object_id,
                    &p.version,
                    &p.state,
                    &p.cause_event, // replacements
                    &v.event_id,
                    &variant_fingerprints,
                    &v.object_id,
                    &v.first_seen, // variants
                    &r.cutoff,     // receipts' retention cut-offs
                    &p.state_at,
                    &p.state_len, // replacements' pointers into the audit bodies
                ],
            )
            .map_err(failed)?;
        Ok(())
    }
}

/// Held rows as columns.
struct HeldColumns<'a> {
    origin: Vec<i64>,
    seq: Vec<i64>,
    at: Vec<i64>,
    event_id: Vec<Option<&'a str>>,
    object_id: Vec<Option<&'a str>>,
    held_as: Vec<String>,
    body: Vec<&'a [u8]>,
    status: Vec<&'static str>,
    superseded_by: Vec<Option<String>>,
    detail: Vec<Option<&'a str>>,
}

impl<'a> HeldColumns<'a> {
    fn of(rows: &[&'a HeldRow]) -> Self {
        Self {
            origin: rows.iter().map(|h| h.key.origin as i64).collect(),
            seq: rows.iter().map(|h| h.key.seq as i64).collect(),
            at: rows.iter().map(|h| time_ns(h.at)).collect(),
            event_id: rows.iter().map(|h| h.event_id.as_deref()).collect(),
            object_id: rows.iter().map(|h| h.object_id.as_deref()).collect(),
            held_as: rows.iter().map(|h| h.held_as.code()).collect(),
            body: rows.iter().map(|h| &h.body[..]).collect(),
            status: rows.iter().map(|h| h.status.as_str()).collect(),
            superseded_by: rows
                .iter()
                .map(|h| h.superseded_by.map(version_text))
                .collect(),
            detail: rows.iter().map(|h| h.detail.as_deref()).collect(),
        }
    }
}

/// Audit rows as columns.
struct AuditColumns<'a> {
    origin: Vec<i64>,
    seq: Vec<i64>,
    at: Vec<i64>,
    event_id: Vec<Option<&'a str>>,
    object_id: Vec<Option<&'a str>>,
    kind: Vec<&'static str>,
    decision: Vec<Option<&'a str>>,
    version: Vec<Option<String>>,
    replacement: Vec<bool>,
    detail: Vec<Option<&'a str>>,
    body: Vec<Option<&'a [u8]>>,
}

impl<'a> AuditColumns<'a> {
    fn of(rows: &[&'a AuditRow]) -> Self {
        Self {
            origin: rows.iter().map(|a| a.key.origin as i64).collect(),
            seq: rows.iter().map(|a| a.key.seq as i64).collect(),
            at: rows.iter().map(|a| time_ns(a.at)).collect(),
            event_id: rows.iter().map(|a| a.event_id.as_deref()).collect(),
            object_id: rows.iter().map(|a| a.object_id.as_deref()).collect(),
            kind: rows.iter().map(|a| a.kind).collect(),
            decision: rows.iter().map(|a| a.decision.as_deref()).collect(),
            version: rows.iter().map(|a| a.version.map(version_text)).collect(),
            replacement: rows.iter().map(|a| a.replacement).collect(),
            detail: rows.iter().map(|a| a.detail.as_deref()).collect(),
            body: rows.iter().map(|a| a.body.as_deref()).collect(),
        }
    }
}

/// Replacement rows as columns.
struct ReplacementColumns<'a> {
    origin: Vec<i64>,
    seq: Vec<i64>,
    at: Vec<i64>,
    object_id: Vec<&'a str>,
    version: Vec<String>,
    /// Empty where the state is read from the audit body (`state_at`).
    state: Vec<&'a str>,
    cause_event: Vec<Option<&'a str>>,
    /// Byte offset of the state in the body of the step's audit row.
    state_at: Vec<Option<i64>>,
    /// Its length in bytes.
    state_len: Vec<Option<i64>>,
}

impl<'a> ReplacementColumns<'a> {
    /// `bodies`: the group's delivery audit rows (see
    /// [`pointer::state_at`]).
    fn of(rows: &[&'a ReplacementRow], bodies: &HashMap<HeldKey, &AuditRow>) -> Self {
        let at: Vec<StateAt> = rows.iter().map(|r| pointer::state_at(bodies, r)).collect();
        Self {
            origin: rows.iter().map(|r| r.key.origin as i64).collect(),
            seq: rows.iter().map(|r| r.key.seq as i64).collect(),
            at: rows.iter().map(|r| time_ns(r.at)).collect(),
            object_id: rows.iter().map(|r| &*r.object_id).collect(),
            version: rows.iter().map(|r| version_text(r.version)).collect(),
            state: rows
                .iter()
                .zip(&at)
                .map(|(r, at)| pointer::state_column(r, *at))
                .collect(),
            cause_event: rows.iter().map(|r| r.cause_event.as_deref()).collect(),
            state_at: at.iter().map(|a| a.map(|(offset, _)| offset)).collect(),
            state_len: at.iter().map(|a| a.map(|(_, len)| len)).collect(),
        }
    }
}

/// Inserts `row` unless its object has a row already (`st.seed`); the
/// number of rows inserted (0 or 1).
fn insert_object_if_absent(
    tx: &mut postgres::Transaction<'_>,
    st: &Statements,
    row: &ObjectRow,
) -> Result<u64, StoreError> {
    tx.execute(
        &st.seed,
        &[
            &&*row.object_id,
            &version_text(row.version),
            &row.state,
            &row.paused,
        ],
    )
    .map_err(failed)
}

/// One write of a row-by-row group; `bodies`: the group's delivery audit
/// rows, where a replacement's state may lie.
fn apply(
    tx: &mut postgres::Transaction<'_>,
    st: &Statements,
    write: &Write,
    bodies: &HashMap<HeldKey, &AuditRow>,
) -> Result<(), StoreError> {
    let conflict = |what: String| Err(StoreError::Conflict(what));
    match write {
        Write::Receipt(r) => {
            let n = tx
                .execute(
                    &st.receipt,
                    &[
                        &&*r.event_id,
                        &&r.fingerprint.to_le_bytes()[..],
                        &&*r.object_id,
                        &r.decision.code(),
                        &time_ns(r.first_seen),
                        &cutoff_ns(r.retention_cutoff),
                    ],
                )
                .map_err(failed)?;
            if n == 0 {
                return conflict(format!("receipt for {} already exists", r.event_id));
            }
            // The receipt was inserted or replaced an expired one: the
            // variants recorded before it were the expired receipt's.
            tx.execute(&st.old_variants, &[&&*r.event_id, &time_ns(r.first_seen)])
                .map_err(failed)?;
        }
        Write::Variant(v) => insert_variant(tx, st, v)?,
        Write::Object { row, expect } => {
            let (statement, read_version, read_paused) = match *expect {
                Expect::Version { version, paused } if row.version > version => {
                    (&st.replace, version, paused)
                }
                Expect::Version { version, paused } => (&st.flag, version, paused),
                Expect::Absent => {
                    if insert_object_if_absent(tx, st, row)? == 0 {
                        return conflict(format!(
                            "object {} to create exists already",
                            row.object_id
                        ));
                    }
                    return Ok(());
                }
                Expect::AtMost(v) => {
                    let n = tx
                        .execute(
                            &st.authority,
                            &[
                                &&*row.object_id,
                                &version_text(row.version),
                                &row.state,
                                &row.paused,
                                &version_text(v),
                            ],
                        )
                        .map_err(failed)?;
                    if n == 0 {
                        return conflict(format!(
                            "object {} is newer than the authority",
                            row.object_id
                        ));
                    }
                    return Ok(());
                }
            };
            let n = tx
                .execute(
                    statement,
                    &[
                        &&*row.object_id,
                        &version_text(row.version),
                        &row.state,
                        &row.paused,
                        &version_text(read_version),
                        &read_paused,
                    ],
                )
                .map_err(failed)?;
            if n == 0 {
                return conflict(format!(
                    "object {} changed since it was read",
                    row.object_id
                ));
            }
        }
        Write::Seed(row) => {
            insert_object_if_absent(tx, st, row)?;
        }
        Write::Pause { object_id } => {
            if tx.execute(&st.pause, &[&&**object_id]).map_err(failed)? == 0 {
                return conflict(format!("object {object_id} to pause is not stored"));
            }
        }
        Write::Check {
            object_id,
            version,
            paused,
        } => {
            let rows = tx
                .query(&st.check, &[&&**object_id, &version_text(*version), paused])
                .map_err(failed)?;
            if rows.is_empty() {
                return conflict(format!("object {object_id} changed since it was read"));
            }
        }
        Write::Held(h) => {
            tx.execute(
                &st.held,
                &[
                    &(h.key.origin as i64),
                    &(h.key.seq as i64),
                    &time_ns(h.at),
                    &h.event_id.as_deref(),
                    &h.object_id.as_deref(),
                    &h.held_as.code(),
                    &&h.body[..],
                    &h.status.as_str(),
                    &h.superseded_by.map(version_text),
                    &h.detail,
                ],
            )
            .map_err(failed)?;
        }
        Write::HeldStatus {
            key,
            status,
            superseded_by,
        } => {
            tx.execute(
                &st.held_status,
                &[
                    &(key.origin as i64),
                    &(key.seq as i64),
                    &status.as_str(),
                    &superseded_by.map(version_text),
                ],
            )
            .map_err(failed)?;
        }
        Write::Replacement(r) => {
            let at = pointer::state_at(bodies, r);
            tx.execute(
                &st.replacement,
                &[
                    &(r.key.origin as i64),
                    &(r.key.seq as i64),
                    &time_ns(r.at),
                    &&*r.object_id,
                    &version_text(r.version),
                    &pointer::state_column(r, at),
                    &r.cause_event.as_deref(),
                    &at.map(|(offset, _)| offset),
                    &at.map(|(_, len)| len),
                ],
            )
            .map_err(failed)?;
        }
        Write::Audit(a) => {
            tx.execute(
                &st.audit,
                &[
                    &(a.key.origin as i64),
                    &(a.key.seq as i64),
                    &time_ns(a.at),
                    &a.event_id.as_deref(),
                    &a.object_id.as_deref(),
                    &a.kind,
                    &a.decision,
                    &a.version.map(version_text),
                    &a.replacement,
                    &a.detail,
                    &a.body.as_deref(),
                ],
            )
            .map_err(failed)?;
        }
    }
    Ok(())
}

/// [`Write::Variant`]: the variant's row, unique on (event id, fingerprint).
/// A concurrent insert of the same variant waits for the other transaction;
/// once that commits, no row is inserted here: another process recorded this
/// variant first, so the batch conflicts and is decided again (a duplicate).
fn insert_variant(
    tx: &mut postgres::Transaction<'_>,
    st: &Statements,
    v: &VariantRow,
) -> Result<(), StoreError> {
    let n = tx
        .execute(
            &st.variant,
            &[
                &&*v.event_id,
                &&v.fingerprint.to_le_bytes()[..],
                &&*v.object_id,
                &time_ns(v.first_seen),
            ],
        )
        .map_err(failed)?;
    if n == 0 {
        return Err(StoreError::Conflict(format!(
            "variant {:032x} of {} already recorded",
            v.fingerprint, v.event_id
        )));
    }
    Ok(())
}

fn variant_row(r: &postgres::Row) -> Result<VariantRow, StoreError> {
    let event_id: String = r.get(0);
    let fp: [u8; 16] = r
        .get::<_, Vec<u8>>(1)
        .try_into()
        .map_err(|_| StoreError::Failed(format!("corrupt variant fingerprint of {event_id}")))?;
    Ok(VariantRow {
        event_id: Arc::from(event_id),
        fingerprint: u128::from_le_bytes(fp),
        object_id: Arc::from(r.get::<_, String>(2)),
        first_seen: ns_time(r.get(3)),
    })
}

fn object_row(r: &postgres::Row) -> Result<ObjectRow, StoreError> {
    Ok(ObjectRow {
        object_id: Arc::from(r.get::<_, String>(0)),
        version: parse_version(r.get(1))?,
        state: r.get(2),
        paused: r.get(3),
    })
}

fn receipt_row(r: &postgres::Row) -> Result<ReceiptRow, StoreError> {
    let event_id: String = r.get(0);
    let fp: [u8; 16] = r
        .get::<_, Vec<u8>>(1)
        .try_into()
        .map_err(|_| StoreError::Failed(format!("corrupt fingerprint of {event_id}")))?;
    Ok(ReceiptRow {
        event_id: Arc::from(event_id),
        fingerprint: u128::from_le_bytes(fp),
        object_id: Arc::from(r.get::<_, String>(2)),
        decision: verdict(r.get(3))?,
        first_seen: ns_time(r.get(4)),
        retention_cutoff: None,
    })
}

impl PostgresStore {
    fn try_commit(&mut self, writes: &[Write]) -> Result<(), StoreError> {
        // (Re)connecting, when needed, is not part of the phases.
        self.connection()?;
        let clock = PhaseClock::start();
        let group = group::fold(writes);
        let (client, st) = self
            .conn
            .as_mut()
            .ok_or_else(|| StoreError::Failed("postgres: no connection".to_owned()))?;
        Self::run_commit(client, st, writes, group.as_ref(), &mut self.phases, clock)
    }

    /// [`Store::probe`]: the writes row by row in one transaction, rolled
    /// back (row by row, each value reaches the server as it would folded).
    fn try_probe(&mut self, writes: &[Write]) -> Result<(), StoreError> {
        self.connection()?;
        let (client, st) = self
            .conn
            .as_mut()
            .ok_or_else(|| StoreError::Failed("postgres: no connection".to_owned()))?;
        let mut tx = client.transaction().map_err(failed)?;
        let bodies = pointer::bodies_of(writes);
        for w in writes {
            apply(&mut tx, st, w, &bodies)?;
        }
        tx.rollback().map_err(failed)
    }

    /// A folded group: its one statement. Otherwise one transaction with
    /// the writes row by row, then the commit.
    fn run_commit(
        client: &mut Client,
        st: &Statements,
        writes: &[Write],
        group: Option<&Group<'_>>,
        phases: &mut CommitPhases,
        mut clock: PhaseClock,
    ) -> Result<(), StoreError> {
        if let Some(group) = group {
            let columns = Columns::of(group);
            clock.lap(&mut phases.encode);
            // Statement and commit are one round trip: counted as executing.
            let result = columns.commit(client, st);
            clock.lap(&mut phases.execute);
            return result;
        }
        clock.lap(&mut phases.encode);
        // Dropping `tx` on an error rolls the transaction back.
        let bodies = pointer::bodies_of(writes);
        let executed = client.transaction().map_err(failed).and_then(|mut tx| {
            for w in writes {
                apply(&mut tx, st, w, &bodies)?;
            }
            Ok(tx)
        });
        clock.lap(&mut phases.execute);
        let result = executed.and_then(|tx| tx.commit().map_err(failed));
        clock.lap(&mut phases.commit);
        result
    }

    fn try_load(&mut self, since: SystemTime) -> Result<Loaded, StoreError> {
        let (c, _) = self.connection()?;
        // Identities before objects: a variant (or receipt) read here was
        // committed with its object change (a pause), which the object read
        // below then sees.
        let receipts = c
            .query(
                "SELECT event_id, fingerprint, object_id, decision, first_seen_ns FROM receipts WHERE first_seen_ns >= $1",
                &[&time_ns(since)],
            )
            .map_err(failed)?
            .iter()
            .map(receipt_row)
            .collect::<Result<_, _>>()?;
        let variants = c
            .query(
                "SELECT event_id, fingerprint, object_id, first_seen_ns FROM receipt_variants WHERE first_seen_ns >= $1",
                &[&time_ns(since)],
            )
            .map_err(failed)?
            .iter()
            .map(variant_row)
            .collect::<Result<_, _>>()?;
        let objects = c
            .query(
                "SELECT object_id, version, state, paused FROM objects ORDER BY object_id",
                &[],
            )
            .map_err(failed)?
            .iter()
            .map(object_row)
            .collect::<Result<_, _>>()?;
        let held = c
            .query(
                "SELECT origin, seq, at_ns, event_id, object_id, held_as, body, status, superseded_by, detail
                 FROM held WHERE status <> 'resolved' ORDER BY at_ns, id",
                &[],
            )
            .map_err(failed)?
            .iter()
            .map(|r| {
                let status: String = r.get(7);
                Ok(HeldRow {
                    key: HeldKey {
                        origin: r.get::<_, i64>(0) as u64,
                        seq: r.get::<_, i64>(1) as u64,
                    },
                    at: ns_time(r.get(2)),
                    event_id: r.get::<_, Option<String>>(3).map(Arc::from),
                    object_id: r.get::<_, Option<String>>(4).map(Arc::from),
                    held_as: verdict(r.get(5))?,
                    body: Arc::from(r.get::<_, Vec<u8>>(6)),
                    status: HeldStatus::parse(&status)
                        .ok_or_else(|| StoreError::Failed(format!("corrupt held status {status:?}")))?,
                    superseded_by: r.get::<_, Option<&str>>(8).map(parse_version).transpose()?,
                    detail: r.get(9),
                })
            })
            .collect::<Result<_, StoreError>>()?;
        let max_seq = c
            .query_one("SELECT coalesce(max(seq), 0) FROM audit", &[])
            .map_err(failed)?
            .get::<_, i64>(0) as u64;
        Ok(Loaded {
            objects,
            held,
            receipts,
            variants,
            max_seq,
        })
    }

    fn try_refresh(
        &mut self,
        objects: &[Arc<str>],
        receipts: &[Arc<str>],
    ) -> Result<(Vec<ObjectRow>, Vec<ReceiptRow>), StoreError> {
        let (c, _) = self.connection()?;
        let ids: Vec<&str> = objects.iter().map(|s| &**s).collect();
        let events: Vec<&str> = receipts.iter().map(|s| &**s).collect();
        // Identities before objects, as in `try_load`. Each statement reads
        // what was committed when it started (READ COMMITTED), and a receipt
        // commits with its object change: a receipt read here was committed
        // before the object read below starts, which then sees its change.
        // Read the other way round, a step committing between the two reads
        // would give its receipt with the object as it was before it.
        let receipts = c
            .query(
                "SELECT event_id, fingerprint, object_id, decision, first_seen_ns FROM receipts WHERE event_id = ANY($1)",
                &[&events],
            )
            .map_err(failed)?
            .iter()
            .map(receipt_row)
            .collect::<Result<_, _>>()?;
        let objects = c
            .query(
                "SELECT object_id, version, state, paused FROM objects WHERE object_id = ANY($1)",
                &[&ids],
            )
            .map_err(failed)?
            .iter()
            .map(object_row)
            .collect::<Result<_, _>>()?;
        Ok((objects, receipts))
    }

    fn try_refresh_variants(
        &mut self,
        event_ids: &[Arc<str>],
    ) -> Result<Vec<VariantRow>, StoreError> {
        let (c, _) = self.connection()?;
        let events: Vec<&str> = event_ids.iter().map(|s| &**s).collect();
        c.query(
            "SELECT event_id, fingerprint, object_id, first_seen_ns FROM receipt_variants WHERE event_id = ANY($1)",
            &[&events],
        )
        .map_err(failed)?
        .iter()
        .map(variant_row)
        .collect()
    }

    fn try_audit(&mut self) -> Result<Vec<AuditRow>, StoreError> {
        let (c, _) = self.connection()?;
        c.query(
            "SELECT origin, seq, at_ns, event_id, object_id, kind, decision, version, replacement, detail, body
             FROM audit ORDER BY id",
            &[],
        )
        .map_err(failed)?
        .iter()
        .map(|r| {
            Ok(AuditRow {
                key: HeldKey {
                    origin: r.get::<_, i64>(0) as u64,
                    seq: r.get::<_, i64>(1) as u64,
                },
                at: ns_time(r.get(2)),
                event_id: r.get::<_, Option<String>>(3).map(Arc::from),
                object_id: r.get::<_, Option<String>>(4).map(Arc::from),
                kind: audit_kind(r.get(5))?,
                decision: r.get(6),
                version: r.get::<_, Option<&str>>(7).map(parse_version).transpose()?,
                replacement: r.get(8),
                detail: r.get(9),
                body: r.get::<_, Option<Vec<u8>>>(10).map(Arc::from),
            })
        })
        .collect()
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
        let result = self.try_load(receipts_since);
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
        let result = self.connection().and_then(|(c, _)| {
            let mut removed = 0;
            for table in ["receipts", "receipt_variants"] {
                removed += c
                    .execute(
                        &format!("DELETE FROM {table} WHERE first_seen_ns < $1"),
                        &[&time_ns(before)],
                    )
                    .map_err(failed)?;
            }
            Ok(removed)
        });
        self.check(result)
    }

    fn purge_records(
        &mut self,
        records: Records,
        before: SystemTime,
        limit: usize,
    ) -> Result<u64, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let sql = match records {
            Records::Audit => PURGE_AUDIT,
            Records::History => {
                "DELETE FROM replacements WHERE id IN
                 (SELECT id FROM replacements WHERE at_ns < $1 ORDER BY at_ns LIMIT $2)"
            }
            Records::Resolved => {
                "DELETE FROM held WHERE id IN
                 (SELECT id FROM held WHERE status = 'resolved' AND at_ns < $1 LIMIT $2)"
            }
        };
        // One statement: its own short transaction. The space is left to
        // autovacuum, which makes the dead rows' room reusable.
        let result = self
            .connection()
            .and_then(|(c, _)| c.execute(sql, &[&time_ns(before), &limit]).map_err(failed));
        self.check(result)
    }

    fn audit(&mut self) -> Result<Vec<AuditRow>, StoreError> {
        let result = self.try_audit();
        self.check(result)
    }

    fn phases(&self) -> CommitPhases {
        self.phases
    }

    fn replacements_since(&mut self, after: u64) -> Result<Vec<ReplacementRow>, StoreError> {
        let result = self.connection().and_then(|(c, _)| {
            c.query(
                "SELECT r.origin, r.seq, r.at_ns, r.object_id, r.version,
                        CASE WHEN r.state_at IS NULL THEN r.state
                             ELSE convert_from(substring(a.body FROM (r.state_at + 1)::int
                                                                FOR r.state_len::int), 'UTF8') END,
                        r.cause_event
                 FROM replacements AS r
                 LEFT JOIN audit AS a ON r.state_at IS NOT NULL AND a.origin = r.origin AND a.seq = r.seq
                 WHERE r.seq > $1 ORDER BY r.seq, r.id",
                &[&(after as i64)],
            )
            .map_err(failed)?
            .iter()
            .map(|r| {
                Ok(ReplacementRow {
                    key: HeldKey {
                        origin: r.get::<_, i64>(0) as u64,
                        seq: r.get::<_, i64>(1) as u64,
                    },
                    at: ns_time(r.get(2)),
                    object_id: Arc::from(r.get::<_, String>(3)),
                    version: parse_version(r.get(4))?,
                    // NULL only when the audit body the row points at is
                    // gone, which the audit purge never leaves.
                    state: r.get::<_, Option<String>>(5).ok_or_else(|| {
                        StoreError::Failed(format!(
                            "corrupt history row {}: its state's audit body is missing",
                            r.get::<_, i64>(1)
                        ))
                    })?,
                    cause_event: r.get::<_, Option<String>>(6).map(Arc::from),
                })
            })
            .collect()
        });
        self.check(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The server the tests use: `SNAPSHOT_RECEIVER_PG_URL`, or the local
    /// one. `None` (skip) when unreachable, except under `CI`, where a
    /// missing server fails the test.
    fn server() -> Option<String> {
        let url = std::env::var("SNAPSHOT_RECEIVER_PG_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        match Client::connect(&url, NoTls) {
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

    /// The sum of one counter over every node of a text plan.
    fn plan_total(plan: &[String], counter: &str) -> u64 {
        plan.iter()
            .filter_map(|line| line.trim().strip_prefix(counter))
            .filter_map(|rest| rest.trim_start_matches(':').trim().parse::<u64>().ok())
            .sum()
    }

    /// The group statement's work grows with the group, not with its
    /// square: with 2,000 objects in one group the server compares each
    /// object with its own row only. (A join between two of its CTEs once
    /// made the planner, which guesses 10 rows for any `unnest`, pick a
    /// nested loop that compared every object with every other: 2.7
    /// million comparisons for 1,645 objects.) The plan counters are
    /// counts, not times, so the check does not depend on the machine.
    #[test]
    fn the_group_statement_compares_each_object_with_its_own_row_only() {
        let Some(url) = server() else { return };
        let schema = format!("plan_check_{}", std::process::id());
        let mut store = PostgresStore::connect_in_schema(&url, Some(&schema)).unwrap();
        let (client, _) = store.connection().unwrap();
        const N: usize = 2_000;
        client
            .execute(
                "INSERT INTO objects (object_id, version, state, paused)
                 SELECT 'o-' || i, lpad('1', 20, '0'), '{}', false FROM generate_series(1, $1) i",
                &[&(N as i32)],
            )
            .unwrap();
        // The store's prepared statement runs with a generic plan after its
        // first executions, planned without the arrays' lengths; force that
        // plan here (a one-off query would be planned for these arrays).
        // Which join the planner picks then depends on the tables' statistics
        // at that moment; without hash and merge joins, every join is a
        // nested loop, so the statement is linear only if each object
        // reaches its row through an index, whatever the statistics say.
        client
            .batch_execute(&format!(
                "SET plan_cache_mode = force_generic_plan; SET enable_hashjoin = off;
                 SET enable_mergejoin = off; PREPARE plan_check AS {GROUP}"
            ))
            .unwrap();
        // EXPLAIN EXECUTE takes no protocol parameters: array literals.
        let array = |item: &dyn Fn(usize) -> String, ty: &str| {
            let items: Vec<String> = (1..=N).map(item).collect();
            format!("'{{{}}}'::{ty}[]", items.join(","))
        };
        let mut args = vec![
            array(&|i| format!("o-{i}"), "text"),
            array(&|_| version_text(1), "text"),
            array(&|_| "false".into(), "bool"),
            array(&|_| "true".into(), "bool"),
            array(&|_| version_text(2), "text"),
            array(&|_| "2".into(), "text"),
            array(&|_| "false".into(), "bool"),
        ];
        // Receipts (5), held (10), audit (11), replacements (7), variants
        // (4), cut-offs (1), replacements' state pointers (2): all empty.
        let empty = [
            "text", "bytea", "text", "text", "int8", // receipts
            "int8", "int8", "int8", "text", "text", "text", "bytea", "text", "text", "text",
            "int8", "int8", "int8", "text", "text", "text", "text", "text", "bool", "text",
            "bytea", "int8", "int8", "int8", "text", "text", "text", "text", // replacements
            "text", "bytea", "text", "int8", "int8", // variants, cut-offs
            "int8", "int8", // state pointers
        ];
        args.extend(empty.iter().map(|ty| format!("'{{}}'::{ty}[]")));
        assert_eq!(args.len(), 47);
        let mut tx = client.transaction().unwrap();
        let plan: Vec<String> = tx
            .query(
                &format!(
                    "EXPLAIN (ANALYZE, FORMAT TEXT) EXECUTE plan_check({})",
                    args.join(", ")
                ),
                &[],
            )
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        let written: i64 = tx
            .query_one(
                "SELECT count(*) FROM objects WHERE version = $1",
                &[&version_text(2)],
            )
            .unwrap()
            .get(0);
        tx.rollback().unwrap();
        client
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .unwrap();
        assert_eq!(written, N as i64, "every object of the group written");
        let compared = plan_total(&plan, "Rows Removed by Join Filter");
        assert!(
            compared < N as u64,
            "the group statement discarded {compared} joined rows for a group of {N} \
             objects; its plan:\n{}",
            plan.join("\n")
        );
    }
}
