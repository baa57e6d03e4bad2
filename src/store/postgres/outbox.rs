//! PostgreSQL's side of the outbox and relays (`store/outbox.rs`): a
//! relay's own connection, opened again after it is lost. Its saves are
//! short READ COMMITTED transactions; reading effects takes no lock.

use super::failed;
use super::read::{cells, translate, values, PgConnection};
use crate::store::outbox::{Sql, SqlOutbox};
use crate::store::sql::{Cell, Value};
use crate::store::StoreError;

/// A relay's connection to the database.
pub(super) struct PgSql {
    conn: PgConnection,
}

/// Opens the relays' connection to the store at `url` (tables in `schema`).
pub(super) fn open(url: &str, schema: Option<&str>) -> Result<SqlOutbox<PgSql>, StoreError> {
    connect(url, schema).map(SqlOutbox::new)
}

/// A connection of its own to the store at `url` (tables in `schema`), for
/// relays or a reconciler.
pub(super) fn connect(url: &str, schema: Option<&str>) -> Result<PgSql, StoreError> {
    Ok(PgSql {
        conn: PgConnection::open(url, schema)?,
    })
}

impl PgSql {
    /// Runs `f` on the live client; a connection that failed is dropped,
    /// so that the next call connects again.
    fn with<T>(
        &mut self,
        f: impl FnOnce(&mut postgres::Client) -> Result<T, postgres::Error>,
    ) -> Result<T, StoreError> {
        let client = self.conn.client()?;
        let result = f(client);
        if client.is_closed() {
            self.conn.client = None;
        }
        result.map_err(failed)
    }
}

impl Sql for PgSql {
    /// The server's clock when the statement runs (`clock_timestamp()`,
    /// not `now()`, the start of the transaction), exact in nanoseconds
    /// (`extract` gives a numeric).
    const NOW_NS: &'static str = "(extract(epoch FROM clock_timestamp()) * 1000000000)::bigint";

    fn rows(&mut self, sql: &str, params: &[Value<'_>]) -> Result<Vec<Vec<Cell>>, StoreError> {
        let sql = translate(sql);
        let rows = self.with(|c| c.query(&sql, &values(params)))?;
        rows.iter().map(cells).collect()
    }

    fn execute(&mut self, sql: &str, params: &[Value<'_>]) -> Result<u64, StoreError> {
        let sql = translate(sql);
        self.with(|c| c.execute(&sql, &values(params)))
    }

    fn begin(&mut self) -> Result<(), StoreError> {
        self.with(|c| c.batch_execute("BEGIN"))
    }

    fn commit(&mut self) -> Result<(), StoreError> {
        self.with(|c| c.batch_execute("COMMIT"))
    }

    fn rollback(&mut self) {
        if let Err(e) = self.with(|c| c.batch_execute("ROLLBACK")) {
            tracing::debug!(error = %e, "relay transaction not rolled back");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A save whose statement failed rolls its transaction back: nothing
    /// it wrote stays, and the connection, no longer in an aborted
    /// transaction, commits the next save.
    #[test]
    fn a_rolled_back_save_writes_nothing_and_the_next_one_commits() {
        let Some(url) = super::super::test_server() else {
            return;
        };
        let schema = format!("relay_rollback_{}", std::process::id());
        drop(super::super::PostgresStore::connect_in_schema(&url, Some(&schema)).unwrap());
        let mut relay = connect(&url, Some(&schema)).unwrap();
        relay
            .execute("CREATE TEMP TABLE t (n integer)", &[])
            .unwrap();
        relay.begin().unwrap();
        relay.execute("INSERT INTO t VALUES (1)", &[]).unwrap();
        let failed = relay
            .execute("INSERT INTO missing VALUES (1)", &[])
            .unwrap_err();
        assert_eq!(
            failed.to_string(),
            "store failure: postgres: db error: ERROR: relation \"missing\" does not exist"
        );
        relay.rollback();
        relay.begin().unwrap();
        relay.execute("INSERT INTO t VALUES (2)", &[]).unwrap();
        relay.commit().unwrap();
        let rows = relay.rows("SELECT n FROM t ORDER BY n", &[]).unwrap();
        assert_eq!(format!("{rows:?}"), "[[Int(2)]]");
        relay
            .execute(&format!("DROP SCHEMA {schema} CASCADE"), &[])
            .unwrap();
    }
}
