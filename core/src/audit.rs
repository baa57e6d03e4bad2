//! The append-only audit trail: every decision, every variant, every pause,
//! every authority step and every resolution (docs/CONTRACT.md §3, §4).

use crate::decision::{Decision, Verdict};
use crate::engine::Overridden;
use std::sync::Arc;
use std::time::SystemTime;

/// One entry of the audit trail. Entries are never changed once appended.
#[derive(Clone, Debug)]
pub struct AuditRecord {
    /// Receiver-wide sequence number: the order in which steps were recorded.
    pub seq: u64,
    /// When the step was recorded, on the receiver's clock.
    pub at: SystemTime,
    /// The event identity involved, if any.
    pub event_id: Option<Arc<str>>,
    /// The object involved, if any.
    pub object_id: Option<Arc<str>>,
    /// What happened.
    pub entry: AuditEntry,
}

/// What an [`AuditRecord`] records.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum AuditEntry {
    /// A delivery's decision. `body` is the exact text received (the first
    /// record and any variant both keep theirs).
    Delivery {
        /// The decision.
        decision: Decision,
        /// The object's version after the step (`None`: unknown object).
        version: Option<u64>,
        /// Whether the step replaced the object's state.
        replacement: bool,
        /// Whether that replacement created the object: it was unknown, and
        /// its profile lets a first versioned snapshot create it
        /// ([`crate::Profile::create_on_first_snapshot`]).
        created: bool,
        /// The body as received.
        body: Arc<str>,
    },
    /// A body that could not name its event, held with its exact bytes.
    Malformed {
        /// The bytes as received.
        bytes: Arc<[u8]>,
        /// What is wrong and where.
        error: String,
    },
    /// The object was paused because `cause_event` has a conflicting variant
    /// naming another object.
    Paused {
        /// The event whose variant caused the pause.
        cause_event: Arc<str>,
    },
    /// An authoritative snapshot was applied: it replaced (or introduced)
    /// the object's state, or found it equal in version and state, and it
    /// cleared the pause.
    Authority {
        /// The authority's version.
        version: u64,
        /// The object's version before (`None`: the authority introduced it).
        previous: Option<u64>,
        /// When the authority's snapshot was taken.
        as_of: SystemTime,
        /// Whether it replaced the state: `false` for an authority equal to
        /// the object in version and state (no effect, not counted).
        replacement: bool,
        /// For an authority forced past a newer object: what it replaced.
        forced: Option<Overridden>,
    },
    /// An authoritative snapshot older than the object was refused.
    AuthorityRefused {
        /// The authority's version.
        version: u64,
        /// The object's version, which stays.
        current: u64,
    },
    /// Reconciliation decided a held event again with the normal rules.
    Reevaluated {
        /// How it was held.
        held_as: Verdict,
        /// Its new decision.
        decision: Verdict,
        /// Whether that replaced the object's state.
        replacement: bool,
    },
    /// Reconciliation could not decide a held event: it stays as named
    /// unresolved input, superseded by the authority.
    Unresolved {
        /// How it was held.
        held_as: Verdict,
        /// The authority version that superseded it.
        superseded_by: u64,
    },
}
