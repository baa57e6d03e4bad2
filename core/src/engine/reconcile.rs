//! Reconciliation from authoritative snapshots (docs/CONTRACT.md §4).

use super::fetch::{Fetch, Missing};
use super::objects::HeldQueue;
use crate::audit::AuditEntry;
use crate::canon::CanonError;
use crate::engine::{
    Cause, Context, EffectRecord, ObjectActor, ObjectState, Overridden, Reevaluation, Shard,
};
use crate::envelope::{StateJson, DEPTH_CEILING};
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
    /// An operator's override (docs/CONTRACT.md §4, *Force*): replace what
    /// the object holds even when it is newer than this snapshot (an object
    /// re-created upstream with its version counter restarted). The audit
    /// trail and the history keep what it replaced. Default `false`: an
    /// authority older than the object is refused.
    pub force: bool,
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
        let (state, state_digest) = StateJson::parse(state_json, DEPTH_CEILING)?;
        Ok(Self {
            object_id: Arc::from(object_id),
            version,
            state,
            state_digest,
            as_of,
            force: false,
        })
    }

    /// This snapshot with [`AuthoritativeSnapshot::force`] set to `force`.
    pub fn forced(mut self, force: bool) -> Self {
        self.force = force;
        self
    }
}

/// Why an authoritative snapshot was not applied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReconcileError {
    /// The authority is older than the object and not forced; the object
    /// stays as it is.
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
    /// Whether the authority replaced the object's state (an authoritative
    /// replacement, counted, with one effect): `false` when the object was
    /// equal to it in version and state.
    pub replacement: bool,
    /// For a forced authority older than the object: the version and state
    /// it replaced.
    pub forced: Option<Overridden>,
    /// Each held event re-evaluated, in arrival order.
    pub reevaluated: Vec<Reevaluation>,
}

impl Shard {
    /// Applies an authoritative snapshot (docs/CONTRACT.md §4): replaces the
    /// state when its version is higher than the object's, or equal with
    /// another state (or introduces an unknown object); replaces nothing when
    /// the object is equal to it in version and state; clears the pause,
    /// then re-decides the object's held and parked events in arrival order.
    /// What cannot be decided stays as named unresolved input. A snapshot
    /// with [`AuthoritativeSnapshot::force`] also replaces an object newer
    /// than itself.
    ///
    /// # Errors
    /// [`ReconcileError::AuthorityOlder`] when the authority is older than the
    /// object and not forced; the refusal is recorded in the audit trail and
    /// nothing changes.
    /// [`ReconcileError::StoreFailed`] when the shard is bounded
    /// ([`Shard::bound_objects`]) and the object is only in the store (its
    /// driver reads it first, as [`crate::engine::Pipeline`] does), or its
    /// read failed; nothing changed.
    pub fn reconcile(
        &mut self,
        ctx: &Context,
        snapshot: &AuthoritativeSnapshot,
    ) -> Result<ReconcileReport, ReconcileError> {
        self.reconcile_step(ctx, snapshot)
            .unwrap_or_else(|fetch| Err(ReconcileError::StoreFailed(fetch.not_read())))
    }

    /// [`Shard::reconcile`] for a driver that reads: `Err` when the object
    /// must be read from the store first (nothing changed; hand the rows
    /// to [`Shard::fetched`] and reconcile again).
    pub(crate) fn reconcile_step(
        &mut self,
        ctx: &Context,
        snapshot: &AuthoritativeSnapshot,
    ) -> Result<Result<ReconcileReport, ReconcileError>, Fetch> {
        // The object first, then the bodies of the events it decides again
        // (docs/CONTRACT.md §9: they stay in the store until then).
        let ready = self
            .fault_in(ctx, &snapshot.object_id)
            .and_then(|()| self.bodies_to_read(ctx, &snapshot.object_id));
        match ready {
            Ok(()) => {}
            Err(Missing::Fetch(fetch)) => return Err(fetch),
            Err(Missing::Failed(e)) => return Ok(Err(ReconcileError::StoreFailed(e))),
        }
        let report = self.reconcile_resident(ctx, snapshot);
        self.touch(&snapshot.object_id);
        Ok(report)
    }

    /// [`Shard::reconcile`] once the object is in memory (or known absent).
    fn reconcile_resident(
        &mut self,
        ctx: &Context,
        snapshot: &AuthoritativeSnapshot,
    ) -> Result<ReconcileReport, ReconcileError> {
        let id = &snapshot.object_id;
        self.begin_step(&[id], None);
        let seq = ctx.next_seq();
        let mut forced = None;
        let older = self
            .objects
            .get(id)
            .map(|o| o.version)
            .filter(|&current| snapshot.version < current && !snapshot.force);
        if let Some(current) = older {
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
        let known = self.objects.with(id, |object| {
            let previous = object.version;
            let replacement =
                snapshot.version != object.version || snapshot.state_digest != object.state_digest;
            // Checked against the row as read: another writer that changed
            // it meanwhile (another process applying this very authority,
            // say) makes the step decided again on what it stored, so one
            // authority never makes two effects.
            let expect = Expect::Version {
                version: object.version,
                paused: object.paused,
            };
            if snapshot.version < object.version {
                forced = Some(Overridden {
                    version: object.version,
                    state: object.state.clone(),
                });
            }
            if replacement {
                object.version = snapshot.version;
                object.state = snapshot.state.clone();
                object.state_digest = snapshot.state_digest;
            }
            // An equal authority keeps the object's own text of the state.
            object.paused = false;
            (Some(previous), replacement, expect, object.held.take())
        });
        let (previous_version, replacement, expect, held) = match known {
            Some(found) => found,
            None => {
                let mut parked = self.parked.remove(id).unwrap_or_default();
                self.parked_total -= parked.len();
                self.parked_bytes -= parked.bytes();
                self.objects.insert(
                    id.clone(),
                    ObjectActor {
                        version: snapshot.version,
                        state: snapshot.state.clone(),
                        state_digest: snapshot.state_digest,
                        paused: false,
                        held: HeldQueue::default(),
                        used: 0,
                    },
                );
                (None, true, Expect::Absent, parked.take())
            }
        };
        if let Some(row) = self.objects.get(id).map(|o| o.row(id)) {
            self.write(|| Write::Object { row, expect });
        }
        if replacement {
            self.counters.authority_replacements += 1;
            self.record_replacement(
                ctx,
                EffectRecord {
                    seq,
                    at: ctx.clock().now(),
                    object_id: id.clone(),
                    version: snapshot.version,
                    state: snapshot.state.clone(),
                    cause: Cause::Authority(snapshot.as_of),
                    forced: forced.clone(),
                    trace: None,
                },
            );
        }
        self.append(ctx, seq, None, Some(id.clone()), || AuditEntry::Authority {
            version: snapshot.version,
            previous: previous_version,
            as_of: snapshot.as_of,
            replacement,
            forced: forced.clone(),
        });
        match &forced {
            Some(over) => {
                tracing::info!(object_id = %id, version = snapshot.version, overridden = over.version, "forced authority replaced a newer object")
            }
            None if replacement => {
                tracing::info!(object_id = %id, version = snapshot.version, ?previous_version, "authoritative replacement")
            }
            None => {
                tracing::info!(object_id = %id, version = snapshot.version, "authority equal to the object: nothing replaced")
            }
        }
        let after_authority = self.object(id).expect("the object was just stored");
        let reevaluated = self.reevaluate(ctx, id, snapshot.version, held);
        Ok(ReconcileReport {
            after_authority,
            previous_version,
            replacement,
            forced,
            reevaluated,
        })
    }
}

#[cfg(test)]
mod tests {
    //! Re-decisions after an authority (docs/CONTRACT.md §4).
    use crate::engine::Shard;
    use crate::engine::{AuthoritativeSnapshot, Config, Context, Outcome, ReevaluationOutcome};
    use crate::{ConflictKind, Decision, ManualClock, Verdict};
    use std::sync::Arc;
    use std::time::{Duration, UNIX_EPOCH};

    fn body(event_id: &str, version: u64, stage: &str) -> String {
        format!(
            concat!(
                r#"{{"event_id":"{}","object_id":"card-1","object_version":{},"#,
                r#""occurred_at":"2099-01-01T00:00:00Z","type":"card.snapshot","#,
                r#""state":{{"stage":"{}"}}}}"#
            ),
            event_id, version, stage
        )
    }

    fn deliver(ctx: &Context, shard: &mut Shard, body: &str) -> Outcome {
        let delivery = ctx.parser().parse(body.as_bytes()).unwrap();
        shard.deliver(ctx, delivery).receipt.outcome
    }

    // A background reconciler fetched card-1 in a loop: the authority
    // confirmed v4 "ready", the held v4 "blocked" paused it again each time.
    #[test]
    fn another_state_at_the_authoritys_own_version_is_superseded_not_paused_again() {
        let clock = ManualClock::new(UNIX_EPOCH + Duration::from_secs(100 * 86_400));
        let ctx = Context::new(Config::default(), Arc::new(clock));
        let mut shard = Shard::new();
        shard
            .insert_object(&ctx, "card-1", 3, r#"{"stage":"queued"}"#)
            .unwrap();
        let applied = deliver(&ctx, &mut shard, &body("e-1", 4, "ready"));
        assert_eq!(applied, Outcome::Decided(Decision::Applied));
        let twin = deliver(&ctx, &mut shard, &body("e-2", 4, "blocked"));
        let conflict = Verdict::Conflict(ConflictKind::VersionState);
        assert_eq!(
            twin,
            Outcome::Decided(Decision::Conflict(ConflictKind::VersionState))
        );
        let authority =
            AuthoritativeSnapshot::new("card-1", 4, r#"{"stage":"ready"}"#, UNIX_EPOCH).unwrap();
        let report = shard.reconcile(&ctx, &authority).unwrap();
        assert!(!report.replacement);
        assert_eq!(report.reevaluated.len(), 1);
        assert_eq!(
            report.reevaluated[0].outcome,
            ReevaluationOutcome::Unresolved(conflict)
        );
        let card = shard.object("card-1").unwrap();
        assert_eq!((card.version, card.paused, card.held), (4, false, 0));
        assert_eq!(card.state.compact(), r#"{"stage":"ready"}"#);
        let unresolved = shard.unresolved();
        assert_eq!(unresolved.len(), 1);
        assert_eq!(
            (
                &*unresolved[0].event_id.clone().unwrap(),
                unresolved[0].superseded_by
            ),
            ("e-2", Some(4))
        );
        // A conflict at a version above the authority's still pauses
        // again: the authority has not settled that version.
        let paused_again = [
            (
                body("e-5", 4, "other"),
                Decision::Conflict(ConflictKind::VersionState),
            ),
            (
                body("e-6", 6, "ready"),
                Decision::Held(crate::HoldReason::Paused),
            ),
            (
                body("e-7", 6, "blocked"),
                Decision::Held(crate::HoldReason::Paused),
            ),
        ];
        for (b, want) in paused_again {
            assert_eq!(deliver(&ctx, &mut shard, &b), Outcome::Decided(want));
        }
        let again = shard.reconcile(&ctx, &authority).unwrap();
        let outcomes: Vec<_> = again.reevaluated.iter().map(|r| r.outcome).collect();
        assert_eq!(
            outcomes,
            [
                ReevaluationOutcome::Unresolved(conflict),
                ReevaluationOutcome::Decided(Verdict::Applied, true),
                ReevaluationOutcome::Decided(conflict, false),
            ]
        );
        let card = shard.object("card-1").unwrap();
        assert_eq!((card.version, card.paused, card.held), (6, true, 1));
    }
}
