//! Effects and the relays that hand them out (docs/CONTRACT.md §10), below
//! the engine: the engine makes effects ([`Effect`]), the stores keep them
//! and the relays' rows ([`RelayRow`], [`ParkedEffect`], [`RelaySave`]),
//! and a relay's loop is the sans-IO [`RelayDriver`], which the library's
//! relay task, the cluster simulation and the unit tests drive alike.
//!
//! Layout:
//! - this file: the effect ([`Effect`], its id [`EffectId`], a reference
//!   to one it stands for [`EffectRef`]), a relay's stored rows, a
//!   destination's refusal ([`HandlerError`]) and the relay's constants;
//! - `plan`: one round's planning (chains of an object's effects, parked
//!   effects settled after the answers);
//! - `driver`: the loop around it ([`RelayDriver::next`] answers what to do
//!   next: open, read, send, save, wait, stop);
//! - `catch_up`: when a relay far behind logs its progress ([`CatchUp`]).
//!
//! Nothing here waits, reads a clock or touches a store: times are handed
//! in (`SystemTime`, the relay's wall clock), store results reported back.

use crate::envelope::StateJson;
use crate::write::{EffectRow, HeldKey};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

mod catch_up;
mod driver;
mod plan;
#[cfg(all(test, not(snapshot_receiver_loom)))]
mod tests;

pub use catch_up::{CatchUp, CatchUpLine, CATCH_UP_EFFECTS, CATCH_UP_EVERY};
pub use driver::{
    Jitter, Next, Notice, RelayDriver, RelayProgress, RelaySettings, RoundRead, SaveKind,
};

/// The retry schedule of the senders the relay's destinations know (Svix's):
/// after a refused first attempt, tries again after 5 s, 5 min, 30 min,
/// 2 h, 5 h, 10 h and 10 h, eight attempts in all (each wait jittered, see
/// [`Jitter`]).
pub const DEFAULT_SCHEDULE: [Duration; 7] = [
    Duration::from_secs(5),
    Duration::from_secs(5 * 60),
    Duration::from_secs(30 * 60),
    Duration::from_secs(2 * 3600),
    Duration::from_secs(5 * 3600),
    Duration::from_secs(10 * 3600),
    Duration::from_secs(10 * 3600),
];

/// The longest a relay waits between two attempts at an effect (24 h): a
/// longer [`HandlerError::retry_after`] (a destination's `Retry-After`)
/// counts as this, and schedule entries above it are refused.
pub const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

/// How long a relay waits after a store error before it tries again.
pub const STORE_RETRY: Duration = Duration::from_millis(500);

/// A destination's refusal of an effect: it is tried again on the relay's
/// schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandlerError {
    /// Why, in words (kept with the parked effect).
    pub message: String,
    /// The destination asked to wait at least this long (an HTTP
    /// `Retry-After`, RFC 9110 §10.2.3, for example).
    pub retry_after: Option<Duration>,
}

impl HandlerError {
    /// A refusal for `message`.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retry_after: None,
        }
    }

    /// The same refusal, asking to wait at least `wait`.
    pub fn retry_after(mut self, wait: Duration) -> Self {
        self.retry_after = Some(wait);
        self
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for HandlerError {}

/// The stable identity of an effect: the receiver run that made it (its
/// random origin) and the sequence number of the step that made it, the
/// key of its row in a durable store. The same effect keeps this id
/// however often a relay sends it, so a destination can drop a re-send;
/// two effects never share one, even across stores and processes.
///
/// It displays as `ef_<origin, 16 hex digits>_<seq>`, the `webhook-id` a
/// forwarded effect is signed with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EffectId {
    /// Random per receiver start (see [`HeldKey::origin`]).
    pub origin: u64,
    /// The sequence number of the step that made the effect in that run.
    pub seq: u64,
}

impl fmt::Display for EffectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ef_{:016x}_{}", self.origin, self.seq)
    }
}

impl From<HeldKey> for EffectId {
    fn from(key: HeldKey) -> Self {
        Self {
            origin: key.origin,
            seq: key.seq,
        }
    }
}

/// One effect as a relay reads it from the outbox and hands it on: with
/// its outbox position and stable id (the step's [`crate::EffectRecord`],
/// once published or committed; stored as a [`crate::write::EffectRow`]).
#[derive(Clone, Debug)]
pub struct Effect {
    /// Its place in the outbox: 1, 2, 3, ... in the order effects became
    /// visible (published in memory, committed with a store), without
    /// gaps; per object, positions follow versions.
    pub position: u64,
    /// Its stable identity ([`EffectId`]).
    pub id: EffectId,
    /// When the step that made it was decided, on the receiver's clock.
    pub at: SystemTime,
    /// The object whose state was replaced.
    pub object_id: Arc<str>,
    /// Its new version (u64).
    pub version: u64,
    /// Its new state (JSON; `null`: deleted).
    pub state: StateJson,
    /// The event whose snapshot replaced it; `None` for an authoritative
    /// snapshot (docs/CONTRACT.md §4).
    pub cause_event: Option<Arc<str>>,
    /// The earlier effects of its object this one stands for, oldest
    /// first: filled only by a coalescing relay
    /// (`RelayOptions::coalesce`), which sends this effect, the newest
    /// state, in their place. Empty as the outbox reads it.
    pub replaces: Vec<EffectRef>,
    /// The W3C trace context of the delivery that made it
    /// ([`crate::Delivery::with_trace`]): a relay's handler continues the
    /// trace on the request that hands the effect on (a `traceparent`
    /// with the same trace id and a new parent id of its own,
    /// [`crate::TraceContext::child`]). `None` when the delivery came
    /// without one, and for authoritative snapshots and held events
    /// applied later.
    pub trace: Option<Arc<crate::TraceContext>>,
}

/// A reference to an effect (its id, position and version, not its
/// state): in [`Effect::replaces`], an effect a coalescing relay did not
/// send because a newer one of its object carried the newest state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EffectRef {
    /// Its stable id.
    pub id: EffectId,
    /// Its outbox position.
    pub position: u64,
    /// Its version (u64).
    pub version: u64,
}

impl From<&Effect> for EffectRef {
    fn from(e: &Effect) -> Self {
        Self {
            id: e.id,
            position: e.position,
            version: e.version,
        }
    }
}

/// An effect without its state: what a relay keeps of an effect it
/// parked ([`ParkedEffect::effect`]), so that a parked effect costs a few
/// hundred bytes however large its state. The state is read back from
/// the store when the effect is due (`OutboxStore::effects_at`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EffectHead {
    /// Its outbox position.
    pub position: u64,
    /// Its stable id.
    pub id: EffectId,
    /// When the step that made it was decided, on the receiver's clock.
    pub at: SystemTime,
    /// The object whose state was replaced.
    pub object_id: Arc<str>,
    /// Its new version (u64).
    pub version: u64,
    /// The length of its state's text, in bytes: what reading it back
    /// costs (a round reads parked states within its bytes).
    pub bytes: usize,
}

impl Effect {
    /// Its head: everything but the state.
    pub fn head(&self) -> EffectHead {
        EffectHead {
            position: self.position,
            id: self.id,
            at: self.at,
            object_id: self.object_id.clone(),
            version: self.version,
            bytes: self.bytes(),
        }
    }

    /// The length of its state's text, in bytes.
    pub fn bytes(&self) -> usize {
        self.state.as_str().len()
    }

    /// The effect of a store's history row at `position`. The state text is
    /// taken as stored: the store wrote it from a state that was checked
    /// when it arrived.
    pub fn from_row(position: u64, row: EffectRow) -> Self {
        Self {
            position,
            id: row.key.into(),
            at: row.at,
            object_id: row.object_id,
            version: row.version,
            state: StateJson::trusted(row.state),
            cause_event: row.cause_event,
            replaces: Vec::new(),
            trace: row.trace,
        }
    }
}

/// A relay's record in a store (docs/CONTRACT.md §10): how far it got and
/// who runs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelayRow {
    /// The relay's name (its key).
    pub name: String,
    /// Its cursor: every effect at or below this outbox position was
    /// delivered, or parked ([`ParkedEffect`]); it reads what follows.
    pub position: u64,
    /// Raised by every change made outside the relay's own run (an
    /// operator's retry, skip or rewind; a new owner taking it over): a
    /// relay whose save names another generation was overtaken, and reads
    /// its cursor and parked effects again.
    pub generation: u64,
    /// The run that holds the relay's lease (`None`: nobody).
    pub owner: Option<String>,
    /// When the lease ends unless renewed.
    pub lease_until: Option<SystemTime>,
    /// When the row last changed.
    pub updated: SystemTime,
    /// Since when the relay is backlogged, as of its last save: its parked
    /// effects' heads reached their ceiling
    /// ([`RelaySettings::parked_ceiling`]), so its cursor stops. `None`:
    /// not backlogged, or never saved by a version that records it.
    pub backlogged_since: Option<SystemTime>,
    /// The bytes its parked effects' heads took in its memory
    /// ([`ParkedEffect::memory_bytes`]) as of its last save; `None`: never
    /// saved by a version that records it (a store written by an older
    /// version, or a relay not saved yet).
    pub parked_bytes: Option<u64>,
}

impl RelayRow {
    /// A relay the store did not know, starting after outbox position
    /// `start`, held by nobody.
    pub fn new(name: &str, start: u64, now: SystemTime) -> Self {
        Self {
            name: name.to_owned(),
            position: start,
            generation: 0,
            owner: None,
            lease_until: None,
            updated: now,
            backlogged_since: None,
            parked_bytes: None,
        }
    }

    /// Gives `owner` the relay's lease until `now + lease` when it is free:
    /// held by nobody or by `owner` already, or a lease that ended at or
    /// before `now` (as the SQL stores count it: a lease let go, ending at
    /// the release, is taken at once). A new owner raises the generation
    /// (a save of the run it overtook is refused). Held by another run,
    /// the row is unchanged.
    pub fn take_lease(&mut self, owner: &str, now: SystemTime, lease: Duration) {
        let free = self.owner.as_deref().is_none_or(|o| o == owner)
            || self.lease_until.is_some_and(|until| until <= now);
        if free {
            if self.owner.as_deref() != Some(owner) {
                self.generation += 1;
            }
            self.owner = Some(owner.to_owned());
            self.lease_until = Some(now + lease);
            self.updated = now;
        }
    }

    /// A save of `owner`'s run at `generation`: the cursor moves to
    /// `save.position` (never back), the backlog is recorded as the save
    /// says ([`RelaySave::backlogged_since`], [`RelaySave::parked_bytes`])
    /// and the lease is renewed until `now + lease`. `false`, and nothing
    /// changed, when the relay moved to another generation or owner
    /// meanwhile. (The parked effects themselves are the store's to keep.)
    pub fn save(
        &mut self,
        generation: u64,
        owner: &str,
        save: &RelaySave,
        now: SystemTime,
        lease: Duration,
    ) -> bool {
        if self.generation != generation || self.owner.as_deref() != Some(owner) {
            return false;
        }
        self.position = self.position.max(save.position);
        self.backlogged_since = save.backlogged_since;
        self.parked_bytes = Some(save.parked_bytes);
        self.lease_until = Some(now + lease);
        self.updated = now;
        true
    }
}

/// What became of a parked effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParkedStatus {
    /// Its destination refused it; it is tried again at
    /// [`ParkedEffect::due`].
    Retrying,
    /// Its retry schedule is exhausted: it waits for an operator to retry
    /// or skip it, and its object's later effects wait behind it.
    Failed,
    /// An earlier effect of its object is parked: it goes once that one is
    /// delivered or skipped.
    Waiting,
}

impl ParkedStatus {
    /// The stored text: `retrying`, `failed` or `waiting`.
    pub fn as_str(self) -> &'static str {
        match self {
            ParkedStatus::Retrying => "retrying",
            ParkedStatus::Failed => "failed",
            ParkedStatus::Waiting => "waiting",
        }
    }

    /// Reads the stored text back.
    pub fn parse(text: &str) -> Option<Self> {
        [
            ParkedStatus::Retrying,
            ParkedStatus::Failed,
            ParkedStatus::Waiting,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }
}

/// Bytes a parked effect costs a relay besides its object id and error
/// text: the head and its entry in the relay's map of parked effects
/// (about 150 bytes of fields and 100 of map node, rounded up).
pub const PARKED_OVERHEAD: usize = 256;

/// An effect a relay took out of its way: refused by its destination, or
/// behind such an effect of the same object. The relay's cursor may pass it;
/// the store keeps it (and its effect) until it is delivered or skipped.
/// Only the effect's head is kept here ([`EffectHead`]): its state stays in
/// the store until the effect is due.
#[derive(Clone, Debug)]
pub struct ParkedEffect {
    /// The effect's head (its position is the row's key with the relay's
    /// name).
    pub effect: EffectHead,
    /// What became of it.
    pub status: ParkedStatus,
    /// Attempts made so far.
    pub attempts: u32,
    /// When it is tried next ([`ParkedStatus::Retrying`]).
    pub due: Option<SystemTime>,
    /// The destination's last refusal, in words.
    pub error: Option<String>,
    /// When the row last changed.
    pub updated: SystemTime,
}

impl ParkedEffect {
    /// `effect` parked `waiting` at `now`: behind a parked effect of its
    /// object, no attempt made.
    pub fn waiting(effect: &Effect, now: SystemTime) -> Self {
        Self {
            effect: effect.head(),
            status: ParkedStatus::Waiting,
            attempts: 0,
            due: None,
            error: None,
            updated: now,
        }
    }

    /// What it costs a relay's memory, in bytes (an estimate:
    /// [`PARKED_OVERHEAD`] plus its object id and error text).
    pub fn memory_bytes(&self) -> usize {
        PARKED_OVERHEAD + self.effect.object_id.len() + self.error.as_ref().map_or(0, String::len)
    }
}

/// One save of a relay's progress: in one transaction, the parked effects
/// written, those delivered or skipped removed, then the cursor moved, the
/// backlog recorded and the lease renewed, only if the relay is still the
/// generation and owner it read.
#[derive(Clone, Debug, Default)]
pub struct RelaySave {
    /// Parked effects to insert or replace.
    pub park: Vec<ParkedEffect>,
    /// Positions of parked effects that are done (delivered or skipped).
    pub unpark: Vec<u64>,
    /// The new cursor (never below the stored one).
    pub position: u64,
    /// Since when the relay is backlogged once the save is made (its
    /// parked heads at their ceiling, [`RelaySettings::parked_ceiling`]);
    /// `None`: not backlogged. Kept in the relay's row for the operator
    /// ([`RelayRow::backlogged_since`]).
    pub backlogged_since: Option<SystemTime>,
    /// The bytes the relay's parked effects' heads take once the save is
    /// made ([`ParkedEffect::memory_bytes`]), kept in its row
    /// ([`RelayRow::parked_bytes`]).
    pub parked_bytes: u64,
}
