//! The PostgreSQL schema: the tables, created if absent (in the store's
//! schema, itself created if absent), and what a store created by an older
//! version lacks, added when it is opened.

use super::failed;
use crate::store::StoreError;
use postgres::Client;

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
    trace_context TEXT,                      -- W3C traceparent [LF tracestate]; NULL: none
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
    body        BYTEA,                       -- NULL with body_seq: see add_repeat_column
    body_seq    BIGINT,                      -- the row of this origin holding the same bytes
    PRIMARY KEY (origin, seq)
);
CREATE INDEX IF NOT EXISTS audit_at ON audit (at_ns);
-- The outbox's positions (docs/CONTRACT.md §10): the one row of `outbox`
-- holds the last position given. A commit takes its positions from it as
-- its last statement (see GROUP in the source), and its row lock, held to
-- the commit, orders positions by commit over every process.
CREATE TABLE IF NOT EXISTS outbox (
    one  BOOLEAN PRIMARY KEY CHECK (one),
    last BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS relays (
    name           TEXT PRIMARY KEY,
    position       BIGINT NOT NULL,
    generation     BIGINT NOT NULL,
    owner          TEXT,
    lease_until_ns BIGINT,
    updated_ns     BIGINT NOT NULL,
    backlogged_since_ns BIGINT,
    parked_bytes   BIGINT
);
CREATE TABLE IF NOT EXISTS relay_parked (
    relay      TEXT NOT NULL,
    position   BIGINT NOT NULL,
    object_id  TEXT NOT NULL,
    status     TEXT NOT NULL,
    attempts   BIGINT NOT NULL,
    due_ns     BIGINT,
    error      TEXT,
    updated_ns BIGINT NOT NULL,
    PRIMARY KEY (relay, position)
);
CREATE INDEX IF NOT EXISTS relay_parked_position ON relay_parked (position);
-- What a reconciler keeps for the operator (docs/CONTRACT.md §4): one row
-- per object waiting for an authority after a fetch that did not settle it,
-- deleted when it converges; an older store gains it when opened.
CREATE TABLE IF NOT EXISTS authority_waits (
    object_id   TEXT PRIMARY KEY,
    reasons     TEXT NOT NULL,
    outcome     TEXT NOT NULL,
    error       TEXT NOT NULL,
    attempts    BIGINT NOT NULL,
    since_ns    BIGINT NOT NULL,
    next_try_ns BIGINT,
    at_ns       BIGINT NOT NULL
);
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

/// Creates the schema (when one is named: `schema`, already checked by
/// `location::check_schema_name`, and quoted) and the tables if absent, and adds what
/// a store created by an older version lacks.
pub(super) fn create(client: &mut Client, schema: Option<&str>) -> Result<(), StoreError> {
    // Two processes creating the schema or tables at once can race in
    // the catalog: serialise that with an advisory lock.
    client
        .batch_execute("SELECT pg_advisory_lock(7140715)")
        .map_err(failed)?;
    let mut setup = String::new();
    if let Some(schema) = schema {
        let quoted = crate::store::location::quoted_schema(schema);
        setup = format!("CREATE SCHEMA IF NOT EXISTS {quoted}; SET search_path TO {quoted};");
    }
    setup.push_str(SCHEMA);
    let created = client
        .batch_execute(&setup)
        .and_then(|()| add_history_columns(client))
        .and_then(|()| add_paused_index(client))
        .and_then(|()| add_positions(client))
        .and_then(|()| widen_parked_attempts(client))
        .and_then(|()| add_repeat_column(client))
        .and_then(|()| add_relay_backlog(client))
        .map_err(failed);
    client
        .batch_execute("SELECT pg_advisory_unlock(7140715)")
        .map_err(failed)?;
    created
}

/// Adds the partial index of paused objects that start-up reads instead of
/// scanning every object (docs/CONTRACT.md §9) to a store without it. Only
/// when missing: `CREATE INDEX IF NOT EXISTS` takes the table's share lock
/// even when the index exists, and a second process opening the store while
/// the first seeds its objects would then deadlock with it.
fn add_paused_index(client: &mut Client) -> Result<(), postgres::Error> {
    if !index_exists(client, "objects_paused")? {
        client.batch_execute(
            "CREATE INDEX IF NOT EXISTS objects_paused ON objects (object_id) WHERE paused",
        )?;
    }
    Ok(())
}

/// Whether the current schema's table `table` has the column `column`.
fn column_exists(client: &mut Client, table: &str, column: &str) -> Result<bool, postgres::Error> {
    let rows = client.query(
        "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema()
         AND table_name::text = $1 AND column_name::text = $2",
        &[&table, &column],
    )?;
    Ok(!rows.is_empty())
}

/// Whether the current schema has the index `index`.
fn index_exists(client: &mut Client, index: &str) -> Result<bool, postgres::Error> {
    let rows = client.query(
        "SELECT 1 FROM pg_indexes WHERE schemaname = current_schema() AND indexname::text = $1",
        &[&index],
    )?;
    Ok(!rows.is_empty())
}

/// Adds the history's columns a store created by an earlier version lacks:
/// the pointer into the audit body (docs/CONTRACT.md §9; `state_at`,
/// `state_len`, `NULL`: the state is in the row) and the trace context
/// (§10: the W3C trace context an applied delivery came with, `NULL` for
/// rows already there). Each only when its first column is missing, so
/// that opening a current store takes no table lock.
fn add_history_columns(client: &mut Client) -> Result<(), postgres::Error> {
    let missing = [
        (
            "state_at",
            "ALTER TABLE replacements ADD COLUMN IF NOT EXISTS state_at BIGINT,
                                      ADD COLUMN IF NOT EXISTS state_len BIGINT",
        ),
        (
            "trace_context",
            "ALTER TABLE replacements ADD COLUMN IF NOT EXISTS trace_context TEXT",
        ),
    ];
    for (column, alter) in missing {
        if !column_exists(client, "replacements", column)? {
            client.batch_execute(alter)?;
        }
    }
    Ok(())
}

/// A redelivery's exact bytes stored once (docs/CONTRACT.md §9): an audit
/// row whose `body_seq` is set keeps no `body`; its bytes are those of the
/// audit row (`origin`, `body_seq`), and the purge finds the rows pointing
/// at a row it deletes by the partial index, copying the bytes into them
/// first. A store created before it gains the column (`NULL`: every body
/// in place) and the index, each only when missing (as above, so that
/// opening a current store takes no table lock).
fn add_repeat_column(client: &mut Client) -> Result<(), postgres::Error> {
    if !column_exists(client, "audit", "body_seq")? {
        client.batch_execute("ALTER TABLE audit ADD COLUMN IF NOT EXISTS body_seq BIGINT")?;
    }
    if !index_exists(client, "audit_body_seq")? {
        client.batch_execute(
            "CREATE INDEX IF NOT EXISTS audit_body_seq ON audit (origin, body_seq)
             WHERE body_seq IS NOT NULL",
        )?;
    }
    Ok(())
}

/// Widens `relay_parked.attempts` to BIGINT in a store created when it
/// was an INTEGER (int4): the relay writes a 64-bit count, which PostgreSQL
/// refuses to bind to an int4 column, so that every save that parked an
/// effect failed. Only when it is int4, so that opening a current store
/// takes no table lock.
fn widen_parked_attempts(client: &mut Client) -> Result<(), postgres::Error> {
    let narrow = client.query(
        "SELECT 1 FROM information_schema.columns WHERE table_schema = current_schema()
         AND table_name = 'relay_parked' AND column_name = 'attempts'
         AND data_type = 'integer'",
        &[],
    )?;
    if !narrow.is_empty() {
        client.batch_execute("ALTER TABLE relay_parked ALTER COLUMN attempts TYPE BIGINT")?;
    }
    Ok(())
}

/// Adds the relays' backlog (docs/CONTRACT.md §9: whether a relay is
/// backlogged, since when, its parked heads' bytes, written with each
/// save) to a store created without it; a relay already there has it
/// unknown (`NULL`) until its next save. Only when missing, so that
/// opening a current store takes no table lock.
fn add_relay_backlog(client: &mut Client) -> Result<(), postgres::Error> {
    if !column_exists(client, "relays", "parked_bytes")? {
        client.batch_execute(
            "ALTER TABLE relays ADD COLUMN IF NOT EXISTS backlogged_since_ns BIGINT,
                                ADD COLUMN IF NOT EXISTS parked_bytes BIGINT",
        )?;
    }
    Ok(())
}

/// Adds outbox positions (docs/CONTRACT.md §10) to a store created without
/// them: the column and its unique index, only when missing (as above, so
/// that opening a current store takes no table lock); then numbers the
/// history rows that have none, in the order they were inserted, after the
/// highest position given, and starts the counter after them.
fn add_positions(client: &mut Client) -> Result<(), postgres::Error> {
    if !column_exists(client, "replacements", "position")? {
        client
            .batch_execute("ALTER TABLE replacements ADD COLUMN IF NOT EXISTS position BIGINT")?;
    }
    if !index_exists(client, "replacements_position")? {
        client.batch_execute(
            "CREATE UNIQUE INDEX IF NOT EXISTS replacements_position ON replacements (position)",
        )?;
    }
    let unnumbered = client.query_one(
        "SELECT EXISTS (SELECT 1 FROM replacements WHERE position IS NULL)
             OR NOT EXISTS (SELECT 1 FROM outbox)",
        &[],
    )?;
    if unnumbered.get::<_, bool>(0) {
        let mut tx = client.transaction()?;
        tx.batch_execute("LOCK TABLE replacements IN SHARE ROW EXCLUSIVE MODE")?;
        tx.execute(
            "UPDATE replacements AS r SET position = n.k + h.highest
             FROM (SELECT id, row_number() OVER (ORDER BY id) AS k
                   FROM replacements WHERE position IS NULL) AS n,
                  (SELECT coalesce(max(position), 0) AS highest FROM replacements) AS h
             WHERE r.id = n.id",
            &[],
        )?;
        tx.execute(
            "INSERT INTO outbox (one, last)
             VALUES (TRUE, (SELECT coalesce(max(position), 0) FROM replacements))
             ON CONFLICT (one) DO NOTHING",
            &[],
        )?;
        tx.commit()?;
    }
    Ok(())
}
