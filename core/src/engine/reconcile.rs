//! Reconciliation from authoritative snapshots (docs/CONTRACT.md §4).

use crate::audit::AuditEntry;
use crate::canon::CanonError;
use crate::engine::{Cause, Context, ObjectActor, ObjectState, Reevaluation, Replacement, Shard};
use crate::envelope::StateJson;
use crate::write::{Expect, Write};
use std::sync::Arc;
use std::time::SystemTime;

/// An authoritative snapshot of one object from a separately trusted source
/// (docs/CONTRACT.md §4): `{object_id, version, state, as_of}`.
#[derive(Clone, Debug)]
pub struct AuthoritativeSnapshot {
    /// Resource identity.
    pub object_id: Arc<str>,
    /// The authority's version (u64).
    pub version: u64,
    /// The authority's state.
    pub state: StateJson,
    /// Semantic digest of `state`.
    pub(crate) state_digest: u128,
    /// When the authority's snapshot was taken (RFC 3339 UTC in fixtures).
    pub as_of: SystemTime,
}

impl AuthoritativeSnapshot {
    /// Builds a snapshot; `state_json` is the state's JSON text.
    ///
    /// # Errors
    /// `state_json` is not valid JSON under the rules of docs/CONTRACT.md §2 (for example
    /// it has a duplicate key); the error names what and where.
    pub fn new(
        object_id: &str,
        version: u64,
        state_json: &str,
        as_of: SystemTime,
    ) -> Result<Self, CanonError> {
        let (state, state_digest) = StateJson::parse(state_json, 1024)?;
        Ok(Self {
            object_id: Arc::from(object_id),
            version,
            state,
            state_digest,
            as_of,
        })
    }
}

/// Why an authoritative snapshot was not applied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReconcileError {
    /// The authority is older than the object; the object stays as it is.
    #[error("authority for `{object_id}` has version {offered}, older than the object's version {current}; refused, the object is unchanged")]
    AuthorityOlder {
        /// The object.
        object_id: Arc<str>,
        /// The authority's version.
        offered: u64,
        /// The object's version, which stays.
        current: u64,
    },
    /// The receiver is shutting down.
    #[error("the receiver is shutting down")]
    ShuttingDown,
    /// The durable store could not commit the reconciliation; nothing changed.
    #[error("the durable store could not record the reconciliation")]
    StoreFailed(#[source] crate::store::StoreError),
}

/// What one authoritative snapshot did.
#[derive(Clone, Debug)]
pub struct ReconcileReport {
    /// The object after the authority step (before re-evaluation).
    pub after_authority: ObjectState,
    /// The object's version before, or `None` when the authority introduced it.
    pub previous_version: Option<u64>,
    /// Each held event re-evaluated, in arrival order.
    pub reevaluated: Vec<Reevaluation>,
}

impl Shard {
    /// Applies an authoritative snapshot (docs/CONTRACT.md §4): replaces the state when its
    /// version is >= the object's (or introduces an unknown object), clears the
    /// pause, then re-decides the object's held and parked events in arrival
    /// order. What cannot be decided stays as named unresolved input.
    ///
    /// # Errors
    /// [`ReconcileError::AuthorityOlder`] when the authority is older than the
    /// object; the refusal is recorded in the audit trail and nothing changes.
    pub fn reconcile(
        &mut self,
        ctx: &Context,
        snapshot: &AuthoritativeSnapshot,
    ) -> Result<ReconcileReport, ReconcileError> {
        let id = &snapshot.object_id;
        self.begin_step(&[id], None);
        let seq = ctx.next_seq();
        let (previous_version, held) = match self.objects.get_mut(id) {
            Some(object) if snapshot.version < object.version => {
                let current = object.version;
                self.append(ctx, seq, None, Some(id.clone()), || {
                    AuditEntry::AuthorityRefused {
                        version: snapshot.version,
                        current,
                    }
                });
                // An answer the caller gets as `AuthorityOlder`: not a warning.
                tracing::info!(object_id = %id, offered = snapshot.version, current, "authority older than the object refused");
                return Err(ReconcileError::AuthorityOlder {
                    object_id: id.clone(),
                    offered: snapshot.version,
                    current,
                });
            }
            Some(object) => {
                let previous = object.version;
                object.version = snapshot.version;
                object.state = snapshot.state.clone();
                object.state_digest = snapshot.state_digest;
                object.paused = false;
                (Some(previous), std::mem::take(&mut object.held))
            }
            None => {
                let parked = self.parked.remove(id).unwrap_or_default();
                self.parked_total -= parked.len();
                self.objects.insert(
                    id.clone(),
                    ObjectActor {
                        version: snapshot.version,
                        state: snapshot.state.clone(),
                        state_digest: snapshot.state_digest,
                        paused: false,
                        held: Vec::new(),
                    },
                );
                (None, parked)
            }
        };
        self.counters.authority_replacements += 1;
        if let Some(row) = self.objects.get(id).map(|o| o.row(id)) {
            self.write(|| Write::Object {
                row,
                expect: Expect::AtMost(snapshot.version),
            });
        }
        self.record_replacement(
            ctx,
            Replacement {
                seq,
                at: ctx.clock().now(),
                object_id: id.clone(),
                version: snapshot.version,
                state: snapshot.state.clone(),
                cause: Cause::Authority(snapshot.as_of),
            },
        );
        self.append(ctx, seq, None, Some(id.clone()), || AuditEntry::Authority {
            version: snapshot.version,
            previous: previous_version,
            as_of: snapshot.as_of,
        });
        tracing::info!(object_id = %id, version = snapshot.version, ?previous_version, "authoritative replacement");
        let after_authority = self.object(id).expect("the object was just stored");
        let reevaluated = self.reevaluate(ctx, id, snapshot.version, held);
        Ok(ReconcileReport {
            after_authority,
            previous_version,
            reevaluated,
        })
    }
}
