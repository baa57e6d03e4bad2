//! Reading PostgreSQL: the rows a receiver loads and reloads
//! ([`crate::store::Store::load`], [`crate::store::Store::refresh`]), and
//! the connection of a [`crate::store::StoreReader`].

use super::{failed, PostgresStore};
use crate::store::load::{self, LoadReads};
use crate::store::rows::{
    audit_row, held_body, held_columns_without_body, held_row, object_row, receipt_row,
    replacement_row, stored_identity, variant_row, Columns, AUDIT_COLUMNS, HELD_BODY_COLUMNS,
    HELD_COLUMNS, IDENTITY_COLUMNS, OBJECT_COLUMNS, PINNED_OBJECTS, RECEIPT_COLUMNS,
    VARIANT_COLUMNS,
};
use crate::store::sql::{check_tables, text, Cell, Cells, Reads, Value};
use crate::store::{
    AuditRow, EffectRow, HeldBody, HeldKey, HeldRow, Loaded, ObjectRow, ReceiptRow, StoreError,
    VariantRow,
};
use postgres::types::ToSql;
use postgres::Client;
use std::sync::Arc;
use std::time::SystemTime;

impl Columns for postgres::Row {
    fn int(&self, i: usize) -> Result<i64, StoreError> {
        self.try_get(i).map_err(failed)
    }

    fn opt_int(&self, i: usize) -> Result<Option<i64>, StoreError> {
        self.try_get(i).map_err(failed)
    }

    fn opt_text(&self, i: usize) -> Result<Option<String>, StoreError> {
        self.try_get(i).map_err(failed)
    }

    fn opt_bytes(&self, i: usize) -> Result<Option<Vec<u8>>, StoreError> {
        self.try_get(i).map_err(failed)
    }

    fn flag(&self, i: usize) -> Result<bool, StoreError> {
        self.try_get(i).map_err(failed)
    }

    fn text(&self, i: usize) -> Result<String, StoreError> {
        self.try_get(i).map_err(failed)
    }

    fn bytes(&self, i: usize) -> Result<Vec<u8>, StoreError> {
        self.try_get(i).map_err(failed)
    }
}

/// Every row of `sql` with `params`, decoded by `row`.
fn select<T>(
    c: &mut Client,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
    row: fn(&dyn Columns) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    c.query(sql, params)
        .map_err(failed)?
        .iter()
        .map(|r| row(r))
        .collect()
}

impl LoadReads for Client {
    fn receipts_since(&mut self, since_ns: i64) -> Result<Vec<ReceiptRow>, StoreError> {
        let sql = format!("SELECT {RECEIPT_COLUMNS} FROM receipts WHERE first_seen_ns >= $1");
        select(self, &sql, &[&since_ns], receipt_row)
    }

    fn variants_since(&mut self, since_ns: i64) -> Result<Vec<VariantRow>, StoreError> {
        let sql =
            format!("SELECT {VARIANT_COLUMNS} FROM receipt_variants WHERE first_seen_ns >= $1");
        select(self, &sql, &[&since_ns], variant_row)
    }

    fn objects(&mut self) -> Result<Vec<ObjectRow>, StoreError> {
        let sql = format!("SELECT {OBJECT_COLUMNS} FROM objects ORDER BY object_id");
        select(self, &sql, &[], object_row)
    }

    fn pinned_objects(&mut self) -> Result<Vec<ObjectRow>, StoreError> {
        let sql = format!("SELECT {OBJECT_COLUMNS} FROM objects {PINNED_OBJECTS}");
        select(self, &sql, &[], object_row)
    }

    fn unresolved(&mut self, bodies: bool) -> Result<Vec<HeldRow>, StoreError> {
        let columns = if bodies {
            HELD_COLUMNS.to_owned()
        } else {
            held_columns_without_body("''::bytea")
        };
        let sql =
            format!("SELECT {columns} FROM held WHERE status <> 'resolved' ORDER BY at_ns, id");
        select(self, &sql, &[], held_row)
    }

    fn max_seq(&mut self) -> Result<u64, StoreError> {
        let row = self
            .query_one("SELECT coalesce(max(seq), 0) FROM audit", &[])
            .map_err(failed)?;
        Ok(row.int(0)? as u64)
    }
}

impl PostgresStore {
    pub(super) fn try_load(
        &mut self,
        since: SystemTime,
        which: load::Objects,
    ) -> Result<Loaded, StoreError> {
        let (c, _) = self.connection()?;
        load::load(c, since, which)
    }

    pub(super) fn try_all_objects(&mut self) -> Result<Vec<ObjectRow>, StoreError> {
        let (c, _) = self.connection()?;
        LoadReads::objects(c)
    }

    pub(super) fn try_refresh(
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
        let receipts = select(
            c,
            &format!("SELECT {RECEIPT_COLUMNS} FROM receipts WHERE event_id = ANY($1)"),
            &[&events],
            receipt_row,
        )?;
        let objects = select(
            c,
            &format!("SELECT {OBJECT_COLUMNS} FROM objects WHERE object_id = ANY($1)"),
            &[&ids],
            object_row,
        )?;
        Ok((objects, receipts))
    }

    pub(super) fn try_refresh_variants(
        &mut self,
        event_ids: &[Arc<str>],
    ) -> Result<Vec<VariantRow>, StoreError> {
        let (c, _) = self.connection()?;
        let events: Vec<&str> = event_ids.iter().map(|s| &**s).collect();
        select(
            c,
            &format!("SELECT {VARIANT_COLUMNS} FROM receipt_variants WHERE event_id = ANY($1)"),
            &[&events],
            variant_row,
        )
    }

    pub(super) fn try_audit(&mut self) -> Result<Vec<AuditRow>, StoreError> {
        let (c, _) = self.connection()?;
        select(
            c,
            &format!("SELECT {AUDIT_COLUMNS} FROM audit ORDER BY id"),
            &[],
            audit_row,
        )
    }

    pub(super) fn try_replacements_since(
        &mut self,
        after: u64,
    ) -> Result<Vec<EffectRow>, StoreError> {
        let (c, _) = self.connection()?;
        select(
            c,
            "SELECT r.origin, r.seq, r.at_ns, r.object_id, r.version,
                    CASE WHEN r.state_at IS NULL THEN r.state
                         ELSE convert_from(substring(a.body FROM (r.state_at + 1)::int
                                                            FOR r.state_len::int), 'UTF8') END,
                    r.cause_event, r.trace_context
             FROM replacements AS r
             LEFT JOIN audit AS a ON r.state_at IS NOT NULL AND a.origin = r.origin AND a.seq = r.seq
             WHERE r.seq > $1 ORDER BY r.seq, r.id",
            &[&(after as i64)],
            replacement_row,
        )
    }
}

/// A PostgreSQL connection for reading, with what it needs to reconnect:
/// what a [`crate::store::StoreReader`] reads a `postgres://` location
/// with, and the relays' connection (`outbox.rs`).
pub(in crate::store) struct PgConnection {
    /// The connection string.
    url: String,
    /// The schema holding the tables, if not the default search path.
    schema: Option<String>,
    /// The location for messages (URL without password, schema).
    name: String,
    /// The live connection; `None` after it was lost.
    pub(super) client: Option<postgres::Client>,
}

impl PgConnection {
    /// Connects to `url` with the tables in `schema` (`None`: the
    /// connection's search path) and checks that the receiver's tables are
    /// there; creates nothing.
    ///
    /// # Errors
    /// [`StoreError::Failed`] for a schema name that is not ASCII letters,
    /// digits and underscores; [`StoreError::Backend`] for a server that
    /// cannot be reached; [`StoreError::NotAStore`] for a schema that does
    /// not exist or tables missing (named).
    pub(in crate::store) fn open(url: &str, schema: Option<&str>) -> Result<Self, StoreError> {
        let mut name = super::redact(url);
        if let Some(s) = schema {
            crate::store::location::check_schema_name(s)?;
            name = format!("{name} schema {s}");
        }
        let mut connection = Self {
            url: url.to_owned(),
            schema: schema.map(str::to_owned),
            name,
            client: None,
        };
        connection.client()?;
        Ok(connection)
    }

    /// The live client, connecting (and checking the tables) when there is none.
    pub(super) fn client(&mut self) -> Result<&mut postgres::Client, StoreError> {
        if self
            .client
            .as_ref()
            .is_some_and(postgres::Client::is_closed)
        {
            self.client = None;
        }
        let client = match self.client.take() {
            Some(client) => client,
            None => self.connect()?,
        };
        Ok(self.client.insert(client))
    }

    fn connect(&self) -> Result<postgres::Client, StoreError> {
        let name = &self.name;
        let failed = |e: postgres::Error| StoreError::backend(format!("postgres: {name}"), e);
        let mut client = postgres::Client::connect(&self.url, postgres::NoTls)
            .map_err(|e| StoreError::backend(format!("postgres: cannot connect to {name}"), e))?;
        if let Some(schema) = &self.schema {
            let exists = client
                .query_opt("SELECT 1 FROM pg_namespace WHERE nspname = $1", &[schema])
                .map_err(failed)?;
            if exists.is_none() {
                return Err(StoreError::NotAStore(format!(
                    "{name}: the schema {schema} does not exist"
                )));
            }
            let quoted = crate::store::location::quoted_schema(schema);
            client
                .batch_execute(&format!("SET search_path TO {quoted}"))
                .map_err(failed)?;
        }
        let found: Vec<String> = client
            .query(
                "SELECT table_name::text FROM information_schema.tables
                 WHERE table_schema = current_schema()",
                &[],
            )
            .map_err(failed)?
            .iter()
            .map(|row| row.get(0))
            .collect();
        check_tables(name, &found)?;
        Ok(client)
    }

    /// The location read, for messages: the URL without its password, and
    /// the schema.
    pub(in crate::store) fn name(&self) -> &str {
        &self.name
    }

    /// Runs `f` in one `REPEATABLE READ READ ONLY` transaction, so that
    /// what it reads agrees with itself; connects first when the connection
    /// was lost.
    ///
    /// # Errors
    /// `f`'s error; as [`PgConnection::open`] when connecting again;
    /// [`StoreError::Backend`] when the transaction cannot be begun or
    /// committed. After a [`StoreError::Backend`] the connection is
    /// dropped: the next call opens it again.
    pub(in crate::store) fn read<T>(
        &mut self,
        f: impl FnOnce(&mut dyn Reads) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let result = self.read_once(f);
        if matches!(result, Err(StoreError::Backend { .. })) {
            // A lost connection is opened again by the next call.
            self.client = None;
        }
        result
    }

    /// [`PgConnection::read`] on the connection as it is.
    fn read_once<T>(
        &mut self,
        f: impl FnOnce(&mut dyn Reads) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let tx = self
            .client()?
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .map_err(pg_failed)?;
        let mut reads = PgReads(tx);
        let out = f(&mut reads)?;
        reads.0.commit().map_err(pg_failed)?;
        Ok(out)
    }
}

impl Drop for PgConnection {
    fn drop(&mut self) {
        // The synchronous client shuts its own runtime down when dropped,
        // which panics on a tokio runtime thread (a server's handler that
        // dropped the last `Arc<StoreReader>`): drop it on a thread of its own.
        if let Some(client) = self.client.take() {
            if tokio::runtime::Handle::try_current().is_ok() {
                std::thread::spawn(move || drop(client));
            }
        }
    }
}

/// The error of a PostgreSQL read.
fn pg_failed(e: postgres::Error) -> StoreError {
    StoreError::backend("postgres: read", e)
}

/// A read transaction on PostgreSQL.
struct PgReads<'c>(postgres::Transaction<'c>);

impl Reads for PgReads<'_> {
    fn rows(&mut self, sql: &str, params: &[Value<'_>]) -> Result<Vec<Vec<Cell>>, StoreError> {
        let rows = self
            .0
            .query(&translate(sql), &values(params))
            .map_err(pg_failed)?;
        rows.iter().map(cells).collect()
    }
    fn has_table(&mut self, name: &str) -> Result<bool, StoreError> {
        let rows = self.rows(
            "SELECT count(*) FROM information_schema.tables
             WHERE table_schema = current_schema() AND table_name::text = $1",
            &[text(name)],
        )?;
        let count = rows.first().map(|r| Cells::new("reader", r).int(0));
        Ok(count.transpose()?.is_some_and(|n| n > 0))
    }
    fn has_column(&mut self, table: &str, column: &str) -> Result<bool, StoreError> {
        let rows = self.rows(
            "SELECT count(*) FROM information_schema.columns
             WHERE table_schema = current_schema() AND table_name::text = $1
             AND column_name::text = $2",
            &[text(table), text(column)],
        )?;
        let count = rows.first().map(|r| Cells::new("reader", r).int(0));
        Ok(count.transpose()?.is_some_and(|n| n > 0))
    }
}

/// A history row's state: its own column, or the slice of its step's
/// audit body it points at.
const STATE: &str = "CASE WHEN r.state_at IS NULL THEN r.state \
     ELSE convert_from(substring(a.body FROM (r.state_at + 1)::int FOR r.state_len::int), 'UTF8') END";

/// The length in bytes of a history row's state (as [`STATE`] reads it),
/// without reading an audit body.
const STATE_BYTES: &str =
    "CASE WHEN r.state_at IS NULL THEN octet_length(r.state) ELSE r.state_len END";

/// SQL written once for both backends (`store/sql.rs`) as PostgreSQL runs
/// it: `{order}` is the `id` column, `{state}` is [`STATE`],
/// `{state_bytes}` is [`STATE_BYTES`].
pub(super) fn translate(sql: &str) -> String {
    sql.replace("{order}", "id")
        .replace("{state_bytes}", STATE_BYTES)
        .replace("{state}", STATE)
}

/// The parameters as the driver binds them.
pub(super) fn values<'a>(params: &'a [Value<'a>]) -> Vec<&'a (dyn ToSql + Sync)> {
    params
        .iter()
        .map(|p| match p {
            Value::Int(n) => n as &(dyn ToSql + Sync),
            Value::Text(s) => s as &(dyn ToSql + Sync),
        })
        .collect()
}

/// One row's values as cells, whatever their column types.
pub(super) fn cells(row: &postgres::Row) -> Result<Vec<Cell>, StoreError> {
    use postgres::types::Type;
    let mut cells = Vec::with_capacity(row.len());
    for (i, column) in row.columns().iter().enumerate() {
        let cell = match *column.type_() {
            Type::INT8 => row.try_get::<_, Option<i64>>(i).map(|v| v.map(Cell::Int)),
            Type::INT4 => row
                .try_get::<_, Option<i32>>(i)
                .map(|v| v.map(|n| Cell::Int(n.into()))),
            Type::BOOL => row
                .try_get::<_, Option<bool>>(i)
                .map(|v| v.map(|b| Cell::Int(i64::from(b)))),
            Type::BYTEA => row
                .try_get::<_, Option<Vec<u8>>>(i)
                .map(|v| v.map(Cell::Bytes)),
            _ => row
                .try_get::<_, Option<String>>(i)
                .map(|v| v.map(Cell::Text)),
        }
        .map_err(pg_failed)?
        .unwrap_or(Cell::Null);
        cells.push(cell);
    }
    Ok(cells)
}

/// Where a reading thread sends the rows of one request.
type ReplyTo<T> = std::sync::mpsc::Sender<Result<Vec<T>, StoreError>>;

/// A request to a shard's reading thread: the ids, and where the rows go.
enum ObjectsRequest {
    /// The rows of these objects.
    Objects(Vec<Arc<str>>, ReplyTo<ObjectRow>),
    /// The receipts of these event identities first seen at or after the
    /// time (stored nanoseconds).
    Receipts(Vec<Arc<str>>, i64, ReplyTo<ReceiptRow>),
    /// A page of event identities: after this one, first seen at or after
    /// the time, at most this many ([`crate::store::ObjectSource::receipt_ids`]).
    ReceiptIds(String, i64, i64, ReplyTo<(Arc<str>, SystemTime)>),
    /// The exact bodies of these held rows (origins, sequence numbers).
    HeldBodies(Vec<i64>, Vec<i64>, ReplyTo<HeldBody>),
}

/// A shard's own PostgreSQL connection for the objects and receipts it does
/// not hold in memory ([`crate::store::ObjectSource`]). The synchronous client cannot
/// run inside the shard's tokio task (it drives a runtime of its own), so
/// the connection lives on a thread of its own and each read is one
/// request to it, answered with the rows of one `= ANY($1)` statement
/// (READ COMMITTED: it sees every commit reported before it started). The
/// thread stops when the source is dropped.
pub(in crate::store) struct PgObjects {
    requests: std::sync::mpsc::Sender<ObjectsRequest>,
}

impl PgObjects {
    /// Starts the reading thread; it connects on its first read, and again
    /// after a failed one.
    pub(in crate::store) fn start(url: String, schema: Option<String>) -> Result<Self, StoreError> {
        let (requests, rx) = std::sync::mpsc::channel::<ObjectsRequest>();
        std::thread::Builder::new()
            .name("snapshot-receiver-objects".to_owned())
            .spawn(move || {
                let mut client: Option<Client> = None;
                for request in rx {
                    let failed = match request {
                        ObjectsRequest::Objects(ids, reply) => {
                            let rows = read_rows(&mut client, &url, schema.as_deref(), |c| {
                                let ids: Vec<&str> = ids.iter().map(|s| &**s).collect();
                                let sql = format!(
                                    "SELECT {OBJECT_COLUMNS} FROM objects WHERE object_id = ANY($1)"
                                );
                                select(c, &sql, &[&ids], object_row)
                            });
                            let failed = rows.is_err();
                            let _ = reply.send(rows);
                            failed
                        }
                        ObjectsRequest::Receipts(ids, since_ns, reply) => {
                            let rows = read_rows(&mut client, &url, schema.as_deref(), |c| {
                                let ids: Vec<&str> = ids.iter().map(|s| &**s).collect();
                                let sql = format!(
                                    "SELECT {RECEIPT_COLUMNS} FROM receipts \
                                     WHERE event_id = ANY($1) AND first_seen_ns >= $2"
                                );
                                select(c, &sql, &[&ids, &since_ns], receipt_row)
                            });
                            let failed = rows.is_err();
                            let _ = reply.send(rows);
                            failed
                        }
                        ObjectsRequest::HeldBodies(origins, seqs, reply) => {
                            let rows = read_rows(&mut client, &url, schema.as_deref(), |c| {
                                let sql = format!(
                                    "SELECT {HELD_BODY_COLUMNS} FROM held \
                                     WHERE (origin, seq) IN \
                                     (SELECT * FROM unnest($1::bigint[], $2::bigint[]))"
                                );
                                select(c, &sql, &[&origins, &seqs], held_body)
                            });
                            let failed = rows.is_err();
                            let _ = reply.send(rows);
                            failed
                        }
                        ObjectsRequest::ReceiptIds(after, since_ns, limit, reply) => {
                            let rows = read_rows(&mut client, &url, schema.as_deref(), |c| {
                                let sql = format!(
                                    "SELECT {IDENTITY_COLUMNS} FROM receipts \
                                     WHERE event_id > $1 AND first_seen_ns >= $2 \
                                     ORDER BY event_id LIMIT $3"
                                );
                                select(c, &sql, &[&after, &since_ns, &limit], stored_identity)
                            });
                            let failed = rows.is_err();
                            let _ = reply.send(rows);
                            failed
                        }
                    };
                    if failed {
                        client = None;
                    }
                }
            })
            .map_err(|e| StoreError::Failed(format!("cannot start a reading thread: {e}")))?;
        Ok(Self { requests })
    }
}

/// The rows `read` selects, connecting first when there is no connection.
fn read_rows<T>(
    client: &mut Option<Client>,
    url: &str,
    schema: Option<&str>,
    read: impl FnOnce(&mut Client) -> Result<Vec<T>, StoreError>,
) -> Result<Vec<T>, StoreError> {
    let c = match client {
        Some(c) if !c.is_closed() => c,
        _ => {
            let cannot = |e: postgres::Error| {
                StoreError::Failed(format!(
                    "postgres: cannot connect to {} to read objects: {}",
                    super::redact(url),
                    super::describe(&e)
                ))
            };
            let mut config: postgres::Config = url.parse().map_err(cannot)?;
            // Named apart from the committer's connection, so that an
            // operator (or a test) can tell the two kinds from each other.
            let name = format!(
                "{} (objects)",
                config.get_application_name().unwrap_or("snapshot-receiver")
            );
            config.application_name(&name);
            let mut c = config.connect(postgres::NoTls).map_err(cannot)?;
            if let Some(schema) = schema {
                let quoted = crate::store::location::quoted_schema(schema);
                c.batch_execute(&format!("SET search_path TO {quoted}"))
                    .map_err(failed)?;
            }
            client.insert(c)
        }
    };
    read(c)
}

impl PgObjects {
    /// Sends the request `make` builds to the reading thread and waits for
    /// its rows.
    fn ask<T>(
        &self,
        make: impl FnOnce(ReplyTo<T>) -> ObjectsRequest,
    ) -> Result<Vec<T>, StoreError> {
        let stopped = || StoreError::Failed("postgres: the reading thread stopped".to_owned());
        let (tx, rx) = std::sync::mpsc::channel();
        self.requests.send(make(tx)).map_err(|_| stopped())?;
        rx.recv().map_err(|_| stopped())?
    }
}

impl crate::store::ObjectSource for PgObjects {
    fn held_bodies(&mut self, keys: &[HeldKey]) -> Result<Vec<HeldBody>, StoreError> {
        let origins = keys.iter().map(|k| k.origin as i64).collect();
        let seqs = keys.iter().map(|k| k.seq as i64).collect();
        self.ask(|reply| ObjectsRequest::HeldBodies(origins, seqs, reply))
    }

    fn objects(&mut self, ids: &[Arc<str>]) -> Result<Vec<ObjectRow>, StoreError> {
        self.ask(|reply| ObjectsRequest::Objects(ids.to_vec(), reply))
    }

    fn receipts(
        &mut self,
        event_ids: &[Arc<str>],
        since: SystemTime,
    ) -> Result<Vec<ReceiptRow>, StoreError> {
        let since_ns = crate::store::rows::time_ns(since);
        self.ask(|reply| ObjectsRequest::Receipts(event_ids.to_vec(), since_ns, reply))
    }

    fn receipt_ids(
        &mut self,
        after: &str,
        since: SystemTime,
        limit: usize,
    ) -> Result<Vec<(Arc<str>, SystemTime)>, StoreError> {
        let since_ns = crate::store::rows::time_ns(since);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.ask(|reply| ObjectsRequest::ReceiptIds(after.to_owned(), since_ns, limit, reply))
    }
}
