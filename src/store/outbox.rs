//! The outbox and the relays of a durable store (docs/CONTRACT.md §10),
//! written once for both backends: the [`OutboxStore`] over [`Sql`], a
//! connection of the relay's own that each backend implements
//! (`sqlite/outbox.rs`, `postgres/outbox.rs`).
//!
//! Positions are given as history rows commit (the schema of each backend
//! says how), so reading `position > cursor ORDER BY position` never skips
//! an effect. A relay's row (`relays`) holds its cursor, generation and
//! lease; its parked effects (`relay_parked`) point at their history rows
//! by position, which the purge keeps until the relay is done with them.
//! Each save also records whether the relay is backlogged, since when, and
//! its parked heads' bytes, for the operator's views.

use super::rows::{
    effect, parked, parked_effects, relay_row, time_ns, Columns, EFFECT_COLUMNS, EFFECT_FROM,
    RELAY_COLUMNS,
};
use super::sql::{int, stored, text, Cell, Cells, Value};
use super::{OutboxStore, StoreError};
use snapshot_receiver_core::engine::Effect;
use snapshot_receiver_core::relay::{ParkedEffect, RelayRow, RelaySave};
use std::time::{Duration, SystemTime};

/// The condition on a history row the purge may delete: every relay has
/// passed its effect, and none holds it parked (docs/CONTRACT.md §10).
pub(super) const RELAYS_PASSED: &str =
    "position <= (SELECT coalesce(min(position), 9223372036854775807) FROM relays)
     AND NOT EXISTS (SELECT 1 FROM relay_parked AS p WHERE p.position = replacements.position)";

/// One row read back, as the row decoders read it.
fn cells(row: &[Cell]) -> Cells<'_> {
    Cells::new("outbox", row)
}

/// The longest lease written, in nanoseconds (about 31 years): the store's
/// clock plus it stays far inside a signed 64-bit count, whatever lease a
/// caller asks for.
const MAX_LEASE_NS: i64 = 1_000_000_000_000_000_000;

/// `lease` in nanoseconds, at most [`MAX_LEASE_NS`].
fn lease_ns(lease: Duration) -> i64 {
    i64::try_from(lease.as_nanos()).map_or(MAX_LEASE_NS, |ns| ns.min(MAX_LEASE_NS))
}

/// A relay's own connection to one backend, for SQL written once
/// (`sql.rs`).
pub(super) trait Sql: Send + 'static {
    /// An SQL expression for the store's own clock, in nanoseconds since
    /// the Unix epoch (UTC): leases are written and compared on it, so
    /// that two processes with different clocks agree on when a lease ends
    /// (docs/CONTRACT.md §10).
    const NOW_NS: &'static str;

    /// Every row of `sql`, each as its cells in column order.
    fn rows(&mut self, sql: &str, params: &[Value<'_>]) -> Result<Vec<Vec<Cell>>, StoreError>;
    /// Runs `sql`; the rows it changed.
    fn execute(&mut self, sql: &str, params: &[Value<'_>]) -> Result<u64, StoreError>;
    /// Starts a write transaction (SQLite: `BEGIN IMMEDIATE`, so that it
    /// waits for the write lock at once rather than fail at its first write).
    fn begin(&mut self) -> Result<(), StoreError>;
    /// Commits it.
    fn commit(&mut self) -> Result<(), StoreError>;
    /// Rolls it back (after an error; a failure here is the backend's to
    /// report at the next use).
    fn rollback(&mut self);
}

/// The outbox and relays of one store, on a connection of their own.
pub(super) struct SqlOutbox<C> {
    /// The relay's connection.
    conn: C,
}

impl<C: Sql> SqlOutbox<C> {
    pub(super) fn new(conn: C) -> Self {
        Self { conn }
    }

    /// Runs `f` in one write transaction: committed when it returns `Ok`,
    /// rolled back otherwise.
    fn transaction<T>(
        &mut self,
        f: impl FnOnce(&mut C) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.conn.begin()?;
        match f(&mut self.conn) {
            Ok(out) => {
                self.conn.commit()?;
                Ok(out)
            }
            Err(e) => {
                self.conn.rollback();
                Err(e)
            }
        }
    }

    fn relay(conn: &mut C, name: &str) -> Result<Option<RelayRow>, StoreError> {
        let sql = format!("SELECT {RELAY_COLUMNS} FROM relays WHERE name = $1");
        conn.rows(&sql, &[text(name)])?
            .first()
            .map(|r| relay_row(&cells(r)))
            .transpose()
    }

    /// Raises relay `name`'s generation (an operator changed it).
    fn bump(conn: &mut C, name: &str, now: SystemTime) -> Result<(), StoreError> {
        conn.execute(
            "UPDATE relays SET generation = generation + 1, updated_ns = $2 WHERE name = $1",
            &[text(name), int(time_ns(now))],
        )?;
        Ok(())
    }
}

impl<C: Sql> OutboxStore for SqlOutbox<C> {
    fn effects_after(&mut self, after: u64, limit: usize) -> Result<Vec<Effect>, StoreError> {
        // The store was migrated when it was opened: it has the column.
        let sql = format!(
            "SELECT {EFFECT_COLUMNS} FROM {EFFECT_FROM} WHERE r.position > $1 \
             ORDER BY r.position LIMIT $2"
        );
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.conn
            .rows(&sql, &[int(stored(after)), int(limit)])?
            .iter()
            .map(|r| effect(&cells(r)))
            .collect()
    }

    /// Two reads: the positions and state lengths of at most `limit`
    /// effects (no state read), then the effects up to the cut.
    fn effects_within(
        &mut self,
        after: u64,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<Effect>, StoreError> {
        let sizes = self.conn.rows(
            "SELECT r.position, {state_bytes} FROM replacements AS r WHERE r.position > $1 \
             ORDER BY r.position LIMIT $2",
            &[
                int(stored(after)),
                int(i64::try_from(limit).unwrap_or(i64::MAX)),
            ],
        )?;
        let mut through = None;
        let mut bytes = 0u64;
        for row in &sizes {
            let row = cells(row);
            let len = u64::try_from(row.opt_int(1)?.unwrap_or(0)).unwrap_or(0);
            bytes = bytes.saturating_add(len);
            if through.is_some() && bytes > max_bytes as u64 {
                break;
            }
            through = Some(row.int(0)?);
        }
        let Some(through) = through else {
            return Ok(Vec::new());
        };
        let sql = format!(
            "SELECT {EFFECT_COLUMNS} FROM {EFFECT_FROM} WHERE r.position > $1 \
             AND r.position <= $2 ORDER BY r.position"
        );
        self.conn
            .rows(&sql, &[int(stored(after)), int(through)])?
            .iter()
            .map(|r| effect(&cells(r)))
            .collect()
    }

    fn effects_at(&mut self, positions: &[u64]) -> Result<Vec<Effect>, StoreError> {
        let mut effects = Vec::with_capacity(positions.len());
        let sql = format!("SELECT {EFFECT_COLUMNS} FROM {EFFECT_FROM} WHERE r.position = $1");
        let mut sorted = positions.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        for position in sorted {
            if let Some(row) = self.conn.rows(&sql, &[int(stored(position))])?.first() {
                effects.push(effect(&cells(row))?);
            }
        }
        Ok(effects)
    }

    fn last_position(&mut self) -> Result<u64, StoreError> {
        let rows = self.conn.rows("SELECT last FROM outbox", &[])?;
        Ok(rows.first().map_or(Ok(0), |r| cells(r).int(0))? as u64)
    }

    fn open_relay(
        &mut self,
        name: &str,
        start: u64,
        owner: Option<&str>,
        now: SystemTime,
        lease: Duration,
    ) -> Result<RelayRow, StoreError> {
        let now_ns = time_ns(now);
        self.transaction(|c| {
            c.execute(
                "INSERT INTO relays (name, position, generation, owner, lease_until_ns, updated_ns)
                 VALUES ($1, $2, 0, NULL, NULL, $3) ON CONFLICT (name) DO NOTHING",
                &[text(name), int(stored(start)), int(now_ns)],
            )?;
            if let Some(owner) = owner {
                // The lease on the store's clock, not the caller's `now`
                // (which only dates the change). A lease has lapsed at its
                // end: one let go (a lease of zero, ending when it was
                // saved) is free at once, also within the same tick of the
                // store's clock (SQLite's counts milliseconds).
                let take = format!(
                    "UPDATE relays SET
                         generation = generation + CASE WHEN owner = $2 THEN 0 ELSE 1 END,
                         owner = $2, lease_until_ns = {now} + $3, updated_ns = $4
                     WHERE name = $1 AND (owner IS NULL OR owner = $2 OR lease_until_ns <= {now})",
                    now = C::NOW_NS
                );
                c.execute(
                    &take,
                    &[text(name), text(owner), int(lease_ns(lease)), int(now_ns)],
                )?;
            }
            Self::relay(c, name)?
                .ok_or_else(|| StoreError::Failed(format!("relay {name} was not created")))
        })
    }

    fn relays(&mut self) -> Result<Vec<RelayRow>, StoreError> {
        let sql = format!("SELECT {RELAY_COLUMNS} FROM relays ORDER BY name");
        self.conn
            .rows(&sql, &[])?
            .iter()
            .map(|r| relay_row(&cells(r)))
            .collect()
    }

    fn save_relay(
        &mut self,
        name: &str,
        generation: u64,
        owner: &str,
        save: &RelaySave,
        now: SystemTime,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let now_ns = time_ns(now);
        // The lease renewed on the store's clock (as in `open_relay`).
        let renew = format!(
            "UPDATE relays SET
                 position = CASE WHEN position > $2 THEN position ELSE $2 END,
                 lease_until_ns = {now} + $3, updated_ns = $4,
                 backlogged_since_ns = $7, parked_bytes = $8
             WHERE name = $1 AND generation = $5 AND owner = $6",
            now = C::NOW_NS
        );
        self.transaction(|c| {
            let held = c.execute(
                &renew,
                &[
                    text(name),
                    int(stored(save.position)),
                    int(lease_ns(lease)),
                    int(now_ns),
                    int(stored(generation)),
                    text(owner),
                    Value::Int(save.backlogged_since.map(time_ns)),
                    int(stored(save.parked_bytes)),
                ],
            )?;
            if held == 0 {
                return Ok(false);
            }
            for p in &save.park {
                c.execute(
                    "INSERT INTO relay_parked
                         (relay, position, object_id, status, attempts, due_ns, error, updated_ns)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                     ON CONFLICT (relay, position) DO UPDATE SET
                         status = excluded.status, attempts = excluded.attempts,
                         due_ns = excluded.due_ns, error = excluded.error,
                         updated_ns = excluded.updated_ns",
                    &[
                        text(name),
                        int(stored(p.effect.position)),
                        text(&p.effect.object_id),
                        text(p.status.as_str()),
                        int(i64::from(p.attempts)),
                        Value::Int(p.due.map(time_ns)),
                        Value::Text(p.error.as_deref()),
                        int(time_ns(p.updated)),
                    ],
                )?;
            }
            for position in &save.unpark {
                c.execute(
                    "DELETE FROM relay_parked WHERE relay = $1 AND position = $2",
                    &[text(name), int(stored(*position))],
                )?;
            }
            Ok(true)
        })
    }

    fn parked(&mut self, name: &str) -> Result<Vec<ParkedEffect>, StoreError> {
        self.conn
            .rows(&parked_effects("WHERE p.relay = $1"), &[text(name)])?
            .iter()
            .map(|r| parked(&cells(r)))
            .collect()
    }

    fn retry_failed(
        &mut self,
        name: &str,
        position: Option<u64>,
        now: SystemTime,
    ) -> Result<u64, StoreError> {
        let now_ns = time_ns(now);
        self.transaction(|c| {
            let retried = match position {
                Some(p) => c.execute(
                    "UPDATE relay_parked SET status = 'retrying', attempts = 0, due_ns = $3,
                         updated_ns = $3
                     WHERE relay = $1 AND position = $2 AND status = 'failed'",
                    &[text(name), int(stored(p)), int(now_ns)],
                )?,
                None => c.execute(
                    "UPDATE relay_parked SET status = 'retrying', attempts = 0, due_ns = $2,
                         updated_ns = $2
                     WHERE relay = $1 AND status = 'failed'",
                    &[text(name), int(now_ns)],
                )?,
            };
            if retried > 0 {
                Self::bump(c, name, now)?;
            }
            Ok(retried)
        })
    }

    fn skip(&mut self, name: &str, position: u64, now: SystemTime) -> Result<bool, StoreError> {
        self.transaction(|c| {
            let skipped = c.execute(
                "DELETE FROM relay_parked WHERE relay = $1 AND position = $2",
                &[text(name), int(stored(position))],
            )?;
            if skipped > 0 {
                Self::bump(c, name, now)?;
            }
            Ok(skipped > 0)
        })
    }

    fn rewind(
        &mut self,
        name: &str,
        position: u64,
        now: SystemTime,
    ) -> Result<Option<RelayRow>, StoreError> {
        self.transaction(|c| {
            let n = c.execute(
                "UPDATE relays SET position = $2, generation = generation + 1, updated_ns = $3
                 WHERE name = $1",
                &[text(name), int(stored(position)), int(time_ns(now))],
            )?;
            if n == 0 {
                return Ok(None);
            }
            c.execute(
                "DELETE FROM relay_parked WHERE relay = $1 AND position > $2",
                &[text(name), int(stored(position))],
            )?;
            Self::relay(c, name)
        })
    }
}
