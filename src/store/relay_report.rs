//! What an operator sees of a store's relays (docs/CONTRACT.md §10): each
//! relay's cursor, lag, parked and failed effects, and whether it is
//! behind: effects after its cursor that the outbox no longer holds, or
//! effects it has not delivered that are older than the history window
//! (kept for it by the purge). Read through a relay connection
//! ([`relays_report`]) or a read-only [`super::StoreReader`]
//! (`StoreReader::relays`), both giving the same [`RelaysReport`].

use super::{OutboxStore, StoreError};
use crate::format_rfc3339;
use serde::Serialize;
use snapshot_receiver_core::relay::{ParkedEffect, ParkedStatus, RelayRow};
use std::time::{Duration, SystemTime};

/// A store's relays at one instant. Serializes as the JSON of `GET
/// /relays`, `relays --format json` and the `relays` member of `inspect
/// --format json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RelaysReport {
    /// The last outbox position given (0: no effect yet).
    pub last_position: u64,
    /// The history window the report judged against (seconds); `None` in
    /// memory, where the outbox is bounded by its capacity instead.
    pub history_window_seconds: Option<u64>,
    /// Every relay the store knows, by name.
    pub relays: Vec<RelayStatus>,
}

/// One relay as an operator sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RelayStatus {
    /// Its name.
    pub name: String,
    /// Its cursor: every effect at or below this position was delivered or
    /// parked.
    pub position: u64,
    /// Effects after its cursor (`last_position - position`); its parked
    /// effects are at or below the cursor and not counted here.
    pub lag: u64,
    /// Effects it has not delivered: those after its cursor ([`lag`]) and
    /// those it parked (`lag + parked.len()`). 0 only when it is caught
    /// up and nothing is parked.
    ///
    /// [`lag`]: RelayStatus::lag
    pub undelivered: u64,
    /// Effects after its cursor that the outbox no longer holds (purged
    /// before the relay was created, or evicted from the in-memory outbox):
    /// the relay resumes past them, and says so in its log and in
    /// `snapshot_receiver_relay_missed_total`. 0 for a relay the purge
    /// waited for, which is every relay the store knew when it purged.
    pub missed: u64,
    /// When the oldest effect it has not delivered (parked, or the first
    /// after its cursor) was decided, RFC 3339 UTC; `None` when it is
    /// caught up.
    pub oldest_pending: Option<String>,
    /// Whether that effect is older than the history window: the purge
    /// keeps it, and what follows it, only because this relay has not
    /// passed it.
    pub behind_window: bool,
    /// Raised by every operator change and new owner.
    pub generation: u64,
    /// Whether a run holds its lease now.
    pub running: bool,
    /// The run holding (or last holding) its lease.
    pub owner: Option<String>,
    /// When that lease ends unless renewed, RFC 3339 UTC.
    pub lease_until: Option<String>,
    /// When its record last changed, RFC 3339 UTC.
    pub updated: String,
    /// Of its parked effects, how many are `failed`.
    pub failed: usize,
    /// Its parked effects, by position.
    pub parked: Vec<ParkedLine>,
    /// Whether it is backlogged: its parked effects' heads fill their part
    /// of its process's memory budget, so its cursor stops until parked
    /// effects go (docs/CONTRACT.md §9). Read from the store, as of the
    /// relay's last save; the process that runs it says how it is now
    /// (`serve` for its own relay, [`RelaysReport::mark_backlogged`]).
    /// `None`, and left out of the JSON, when not known: a relay not saved
    /// since the store was written by a version that did not keep it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backlogged: Option<bool>,
    /// Since when it is backlogged, RFC 3339 UTC, as of its last save (a
    /// backlog that outlived a restart keeps its start); `None`, and left
    /// out of the JSON, when it is not backlogged or that is not known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backlogged_since: Option<String>,
    /// The bytes its parked effects' heads took of its memory as of its
    /// last save (about 256 each plus the object id and the last refusal's
    /// text); backlogged at half of its part of the memory budget. `None`,
    /// and left out of the JSON, when not known (as for
    /// [`RelayStatus::backlogged`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parked_bytes: Option<u64>,
}

/// A parked effect as an operator sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ParkedLine {
    /// Its outbox position (what `--skip` and `--retry` name).
    pub position: u64,
    /// Its effect id, `ef_<origin>_<seq>`.
    pub effect_id: String,
    /// Its object.
    pub object_id: String,
    /// Its version.
    pub version: u64,
    /// `retrying`, `failed` or `waiting`.
    pub status: String,
    /// Attempts so far.
    pub attempts: u32,
    /// When it is tried next, RFC 3339 UTC (`retrying` only).
    pub due: Option<String>,
    /// The last refusal, in words.
    pub error: Option<String>,
    /// When the step that made it was decided (not serialized: it is what
    /// [`RelayStatus::oldest_pending`] is computed from).
    #[serde(skip)]
    pub at: SystemTime,
}

impl ParkedLine {
    /// The line of a parked effect.
    pub fn of(p: &ParkedEffect) -> Self {
        Self {
            position: p.effect.position,
            effect_id: p.effect.id.to_string(),
            object_id: p.effect.object_id.to_string(),
            version: p.effect.version,
            status: p.status.as_str().to_owned(),
            attempts: p.attempts,
            due: p.due.map(format_rfc3339),
            error: p.error.clone(),
            at: p.effect.at,
        }
    }
}

/// The first effect after a relay's cursor that the outbox holds: its
/// position and when it was decided.
pub(super) type Next = Option<(u64, SystemTime)>;

/// One relay's status from what was read of it. `window`: the history
/// window (`None`: no window).
pub(super) fn status(
    row: RelayRow,
    parked: Vec<ParkedLine>,
    next: Next,
    last: u64,
    now: SystemTime,
    window: Option<Duration>,
) -> RelayStatus {
    let lag = last.saturating_sub(row.position);
    let missed = match next {
        Some((position, _)) => position.saturating_sub(row.position + 1),
        // Nothing after the cursor is held: all of it is gone.
        None => lag,
    };
    let oldest = parked
        .iter()
        .map(|p| p.at)
        .chain(next.map(|(_, at)| at))
        .min();
    let behind_window = match (oldest, window) {
        (Some(at), Some(window)) => now.checked_sub(window).is_some_and(|cutoff| at < cutoff),
        _ => false,
    };
    let failed = parked
        .iter()
        .filter(|p| p.status == ParkedStatus::Failed.as_str())
        .count();
    RelayStatus {
        lag,
        undelivered: lag + parked.len() as u64,
        missed,
        oldest_pending: oldest.map(format_rfc3339),
        behind_window,
        generation: row.generation,
        running: row.owner.is_some() && row.lease_until.is_some_and(|until| until > now),
        owner: row.owner,
        lease_until: row.lease_until.map(format_rfc3339),
        updated: format_rfc3339(row.updated),
        failed,
        parked,
        position: row.position,
        name: row.name,
        backlogged: row.parked_bytes.map(|_| row.backlogged_since.is_some()),
        backlogged_since: row
            .parked_bytes
            .and(row.backlogged_since)
            .map(format_rfc3339),
        parked_bytes: row.parked_bytes,
    }
}

impl RelaysReport {
    /// Says whether relay `name`, run by the reporting process, is
    /// backlogged now ([`RelayStatus::backlogged`]), over what its last
    /// save recorded: not backlogged, it has no start
    /// ([`RelayStatus::backlogged_since`]); backlogged, it keeps the
    /// recorded one (none when its saves have not recorded it yet). A
    /// relay the report does not hold is left alone.
    pub fn mark_backlogged(&mut self, name: &str, backlogged: bool) {
        for relay in self.relays.iter_mut().filter(|r| r.name == name) {
            relay.backlogged = Some(backlogged);
            if !backlogged {
                relay.backlogged_since = None;
            }
        }
    }
}

/// The relays of `store` at `now`, judged against the history `window`
/// (`None`: no window, as in memory).
///
/// # Errors
/// The store's error when it cannot be read (or, in memory, keeps no
/// outbox).
pub fn relays_report(
    store: &mut dyn OutboxStore,
    now: SystemTime,
    window: Option<Duration>,
) -> Result<RelaysReport, StoreError> {
    let last = store.last_position()?;
    let mut relays = Vec::new();
    for row in store.relays()? {
        let parked = store
            .parked(&row.name)?
            .iter()
            .map(ParkedLine::of)
            .collect();
        let next = store
            .effects_after(row.position, 1)?
            .first()
            .map(|e| (e.position, e.at));
        relays.push(status(row, parked, next, last, now, window));
    }
    Ok(RelaysReport {
        last_position: last,
        history_window_seconds: window.map(|w| w.as_secs()),
        relays,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn row(position: u64) -> RelayRow {
        RelayRow {
            name: "app".to_owned(),
            position,
            generation: 2,
            owner: Some("run".to_owned()),
            lease_until: Some(UNIX_EPOCH + Duration::from_secs(50)),
            updated: UNIX_EPOCH,
            backlogged_since: None,
            parked_bytes: None,
        }
    }

    fn line(position: u64, status: ParkedStatus, at_secs: u64) -> ParkedLine {
        ParkedLine {
            position,
            effect_id: format!("ef_0000000000000001_{position}"),
            object_id: "a".to_owned(),
            version: position,
            status: status.as_str().to_owned(),
            attempts: 1,
            due: None,
            error: None,
            at: UNIX_EPOCH + Duration::from_secs(at_secs),
        }
    }

    const NOW: SystemTime = UNIX_EPOCH;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn lag_and_missed_effects_are_counted_from_what_the_outbox_holds() {
        let now = at(100);
        // Cursor 3 of 10; the next held is 4: nothing missed.
        let s = status(row(3), vec![], Some((4, at(90))), 10, now, None);
        assert_eq!((s.lag, s.missed, s.behind_window), (7, 0, false));
        assert_eq!(s.undelivered, 7);
        assert_eq!(s.oldest_pending.as_deref(), Some("1970-01-01T00:01:30Z"));
        assert!(!s.running, "its lease ended at 50 s");
        // The next held is 8: 4 to 7 are gone.
        let s = status(row(3), vec![], Some((8, at(90))), 10, now, None);
        assert_eq!(s.missed, 4);
        // None held after the cursor: all seven gone.
        let s = status(row(3), vec![], None, 10, now, None);
        assert_eq!((s.missed, s.oldest_pending), (7, None));
        // Caught up.
        let s = status(row(10), vec![], None, 10, NOW, None);
        assert_eq!((s.lag, s.missed, s.undelivered), (0, 0, 0));
        assert!(s.running, "its lease ends at 50 s");
    }

    #[test]
    fn a_relay_is_behind_the_window_when_its_oldest_pending_effect_is_older() {
        let window = Some(Duration::from_secs(60));
        // The first after the cursor was decided at 50 s; at 100 s the
        // window starts at 40 s: inside.
        let s = status(row(3), vec![], Some((4, at(50))), 10, at(100), window);
        assert!(!s.behind_window);
        // At 120 s it starts at 60 s: behind.
        let s = status(row(3), vec![], Some((4, at(50))), 10, at(120), window);
        assert!(s.behind_window);
        // A parked effect older than the first after the cursor counts.
        let parked = vec![
            line(2, ParkedStatus::Failed, 10),
            line(3, ParkedStatus::Waiting, 55),
        ];
        let s = status(row(10), parked, None, 10, at(100), window);
        assert_eq!((s.lag, s.failed, s.behind_window), (0, 1, true));
        // Both parked effects are not delivered, though none is after the
        // cursor.
        assert_eq!(s.undelivered, 2);
        // Parked and after the cursor add up.
        let parked = vec![line(2, ParkedStatus::Retrying, 10)];
        let s = status(row(3), parked, Some((4, at(50))), 10, at(100), window);
        assert_eq!((s.lag, s.undelivered), (7, 8));
        assert_eq!(s.oldest_pending.as_deref(), Some("1970-01-01T00:00:10Z"));
    }

    /// Issue 48 item 11: the backlog as the relay's last save recorded it;
    /// unknown (a row no save recorded it in) stays unknown, and the
    /// running process's word replaces it.
    #[test]
    fn the_backlog_is_read_from_the_relays_row() {
        let unknown = status(row(3), vec![], None, 3, NOW, None);
        assert_eq!(
            (
                unknown.backlogged,
                unknown.backlogged_since,
                unknown.parked_bytes
            ),
            (None, None, None)
        );
        let backlogged = RelayRow {
            backlogged_since: Some(at(70)),
            parked_bytes: Some(1_536),
            ..row(3)
        };
        let s = status(backlogged.clone(), vec![], None, 3, NOW, None);
        assert_eq!(
            (s.backlogged, s.backlogged_since.as_deref(), s.parked_bytes),
            (Some(true), Some("1970-01-01T00:01:10Z"), Some(1_536))
        );
        let clear = RelayRow {
            backlogged_since: None,
            parked_bytes: Some(300),
            ..row(3)
        };
        let s = status(clear, vec![], None, 3, NOW, None);
        assert_eq!(
            (s.backlogged, s.backlogged_since, s.parked_bytes),
            (Some(false), None, Some(300))
        );
        let mut report = RelaysReport {
            last_position: 3,
            history_window_seconds: None,
            relays: vec![status(backlogged, vec![], None, 3, NOW, None)],
        };
        report.mark_backlogged("app", false);
        assert_eq!(
            (
                report.relays[0].backlogged,
                &report.relays[0].backlogged_since
            ),
            (Some(false), &None)
        );
    }
}
