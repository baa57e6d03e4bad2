//! The order-independent correctness [`check`] of a run against the
//! generator's [`Expectation`] (what it can assert: see the crate docs).

use crate::code::{
    describe_code, Code, APPLIED, DUPLICATE, EQUAL, EVENT_VARIANT, HELD, NOT_SENT, REJECT, RETRY,
    STALE, VERSION_STATE,
};
use crate::drive::RunOutcome;
use crate::generate::{CopyKind, Expectation, Role, Stream};
use crate::sequential::{Content, SequentialModel};
use snapshot_receiver::ObjectState;
use std::collections::HashMap;

/// The result of [`check`].
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CheckReport {
    /// How many individual assertions were made.
    pub assertions: u64,
    /// How many failed.
    pub failed: u64,
    /// The first few failures, in words.
    pub failures: Vec<String>,
}

impl CheckReport {
    /// Whether every assertion held.
    pub fn ok(&self) -> bool {
        self.failed == 0
    }

    fn assert(&mut self, holds: bool, message: impl FnOnce() -> String) {
        self.assertions += 1;
        if !holds {
            self.failed += 1;
            if self.failures.len() < 20 {
                self.failures.push(message());
            }
        }
    }
}

/// Compares a run with the expectation. Asserts only what is the same in
/// every interleaving (see the module docs), and asserts it exactly:
/// - every delivery was decided (no retry, reject or missing receipt);
/// - each event identity got exactly one first decision, of an allowed kind
///   for its role; every redelivery is `duplicate` of exactly that decision;
///   every variant is one `conflict (event_variant)`; each equal-version pair
///   is one `applied` and one `conflict (version_state)`;
/// - the decision counts in [`ExpectedCounts`](crate::ExpectedCounts);
/// - every known object exists, unknown objects were not created; paused
///   exactly as expected; a non-paused object is at its expected version with
///   that version's state;
/// - the receiver's counters and held queues agree with the receipts;
/// - every known object, paused or not, holds exactly the events its
///   receipts held and is at the highest version a receipt applied, with
///   the state that delivery carried;
/// - along each producer's own order (see [`RunOutcome::producers`]): after
///   a conflict receipt for an object, every later new event for it is
///   `held (paused)`, and every `applied` is above the versions applied
///   before it;
/// - with one producer (the engine, or `producers == 1`), where the order of
///   every decision is known: every receipt, every object and the
///   replacement count equal those of an exact sequential model of the rules
///   (`SequentialModel`, independent of the engine's code).
///
/// When the run reconciled ([`RunOutcome::authority`]), a paused object is
/// brought to the generator's truth (its highest version, that version's
/// own state) and its held events are decided again; when that happens
/// depends on the reconciler's timing, so the check changes where the
/// timing matters and stays exact elsewhere:
/// - every known object ends un-paused, holding nothing, at its highest
///   version with that version's state (the truth), and the run converged
///   within its drain; an object whose end no receipt applied was replaced
///   by an authority (the receiver counted at least that many authority
///   replacements, and no more than the authority's snapshots);
/// - the event at a paused object's highest version may also be `equal`
///   (it arrived after the authority brought the object there) or, when
///   it has a variant, `conflict (version_state)` (its variant arrived
///   first, after the authority); every other count stays exact, and the
///   first decisions of known objects' events add up exactly;
/// - along a producer's order, no `applied` for an object after the
///   conflict that paused it (the authority leaves nothing higher to apply);
/// - with the engine, which reconciles in line, every receipt is compared
///   with the sequential model reconciling at the same points; with one
///   producer and the receiver's reconciler, every receipt of an object
///   until the conflict that first paused it.
pub fn check(stream: &Stream, expected: &Expectation, run: &RunOutcome) -> CheckReport {
    let mut r = CheckReport::default();
    let reconciled = run.authority.is_some();
    r.assert(run.codes.len() == stream.len(), || {
        format!(
            "{} receipts for {} deliveries",
            run.codes.len(),
            stream.len()
        )
    });
    if run.codes.len() != stream.len() {
        return r;
    }
    // Per event: its first decision, and what its other copies got.
    let mut first: Vec<Code> = vec![NOT_SENT; stream.events.len()];
    for (i, (s, &code)) in stream.sent.iter().zip(&run.codes).enumerate() {
        let is_first = code < DUPLICATE && code != EVENT_VARIANT;
        if matches!(code, RETRY | REJECT | NOT_SENT) {
            r.assert(false, || {
                format!("delivery {i} was not decided: {}", describe_code(code))
            });
            continue;
        }
        if is_first {
            let slot = &mut first[s.event as usize];
            r.assert(*slot == NOT_SENT, || {
                format!(
                    "event {} got a second first decision at delivery {i}: {} after {}",
                    stream.event_name(s.event),
                    describe_code(code),
                    describe_code(*slot)
                )
            });
            *slot = code;
        }
    }
    for (i, (s, &code)) in stream.sent.iter().zip(&run.codes).enumerate() {
        let e = stream.events[s.event as usize];
        let f = first[s.event as usize];
        if e.has_variant {
            // Original and variant, once each: one first decision, one conflict.
            r.assert(code < DUPLICATE, || {
                format!(
                    "delivery {i} of {}: {} in a variant pair",
                    stream.event_name(s.event),
                    describe_code(code)
                )
            });
        } else {
            // One copy is the first record (whichever was decided first);
            // every other copy is a duplicate of its decision.
            r.assert(code == f || code == DUPLICATE + f, || {
                format!(
                    "delivery {i} of {}: expected {}, got {}",
                    stream.event_name(s.event),
                    describe_code(DUPLICATE + f),
                    describe_code(code)
                )
            });
        }
    }
    let mut variant_conflicts = vec![0u8; stream.events.len()];
    for (s, &code) in stream.sent.iter().zip(&run.codes) {
        if code == EVENT_VARIANT {
            variant_conflicts[s.event as usize] += 1;
        }
    }
    let mut has_twin = vec![false; expected.objects.len()];
    for e in stream.events.iter().filter(|e| e.role == Role::Twin) {
        has_twin[e.object as usize] = true;
    }
    for (k, e) in stream.events.iter().enumerate() {
        let got = first[k];
        let name = || stream.event_name(k as u32);
        let o = (e.role != Role::Ghost).then(|| expected.objects[e.object as usize]);
        let allowed: &[Code] = match e.role {
            Role::Ghost => &[HELD + 1],
            Role::Twin => &[APPLIED, VERSION_STATE],
            Role::Base if o.is_some_and(|o| !o.paused && o.version == e.version) => &[APPLIED],
            Role::Base if o.is_some_and(|o| !o.paused) => &[APPLIED, STALE],
            Role::Base
                if o.is_some_and(|o| o.version == e.version) && has_twin[e.object as usize] =>
            {
                &[APPLIED, VERSION_STATE]
            }
            // After an authority brought the object to this version: the
            // original is `equal`, a variant decided first conflicts.
            Role::Base if reconciled && o.is_some_and(|o| o.version == e.version) => {
                if e.has_variant {
                    &[APPLIED, HELD, EQUAL, VERSION_STATE]
                } else {
                    &[APPLIED, HELD, EQUAL]
                }
            }
            Role::Base => &[APPLIED, STALE, HELD],
        };
        r.assert(allowed.contains(&got), || {
            format!(
                "event {}: first decision {}, expected one of [{}]",
                name(),
                describe_code(got),
                allowed
                    .iter()
                    .map(|&c| describe_code(c))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        });
        r.assert(variant_conflicts[k] == u8::from(e.has_variant), || {
            format!(
                "event {}: {} event_variant conflicts, expected {}",
                name(),
                variant_conflicts[k],
                u8::from(e.has_variant)
            )
        });
    }
    // Equal-version pairs: exactly one applied, one version_state.
    let mut pair_conflicts = vec![0u32; expected.objects.len()];
    for (k, e) in stream.events.iter().enumerate() {
        if e.role != Role::Ghost && first[k] == VERSION_STATE {
            pair_conflicts[e.object as usize] += 1;
        }
    }
    for e in &stream.events {
        if e.role == Role::Twin {
            let o = e.object as usize;
            r.assert(pair_conflicts[o] == 1, || {
                format!(
                    "{}: {} version_state conflicts in its equal-version pair, expected 1",
                    Stream::object_id(o),
                    pair_conflicts[o]
                )
            });
        }
    }

    let counts = run.counts();
    let c = expected.counts;
    let mut pairs = vec![
        ("deliveries", stream.len() as u64, c.deliveries),
        ("duplicate", counts.duplicate, c.duplicates),
        (
            "conflict (event_variant)",
            counts.conflict_event_variant,
            c.event_variants,
        ),
        (
            "held (unknown_object)",
            counts.held_unknown_object,
            c.unknown_objects,
        ),
        ("other holds", counts.held_other, 0),
        ("retry", counts.retry, 0),
        ("reject", counts.reject, 0),
        ("missing", counts.missing, 0),
    ];
    if reconciled {
        // `equal` and extra `version_state` conflicts come out of the same
        // first decisions (see above): their sum is exact.
        pairs.push((
            "applied + stale + held (paused) + equal + conflict (version_state)",
            counts.applied
                + counts.stale
                + counts.held_paused
                + counts.equal
                + counts.conflict_version_state,
            c.applied_stale_or_paused + c.version_states,
        ));
        r.assert(counts.conflict_version_state >= c.version_states, || {
            format!(
                "conflict (version_state): {} decisions, expected at least {}",
                counts.conflict_version_state, c.version_states
            )
        });
    } else {
        pairs.extend([
            (
                "conflict (version_state)",
                counts.conflict_version_state,
                c.version_states,
            ),
            (
                "applied + stale + held (paused)",
                counts.applied + counts.stale + counts.held_paused,
                c.applied_stale_or_paused,
            ),
            ("equal", counts.equal, 0),
        ]);
    }
    for (what, got, want) in pairs {
        r.assert(got == want, || {
            format!("{what}: {got} decisions, expected {want}")
        });
    }

    // Final state.
    r.assert(run.objects.len() == expected.objects.len(), || {
        format!(
            "{} objects at the end, expected {} (unknown objects must not be created)",
            run.objects.len(),
            expected.objects.len()
        )
    });
    let mut seen = vec![false; expected.objects.len()];
    let mut held_total = 0u64;
    // Reconciled: objects whose end no receipt applied.
    let mut by_authority = 0u64;
    let receipts = ObjectReceipts::of(stream, &run.codes);
    // In object order, so that a report names the same failures first on
    // every run.
    let mut objects: Vec<&ObjectState> = run.objects.iter().collect();
    objects.sort_by_cached_key(|o| {
        let index = o
            .object_id
            .strip_prefix("card-")
            .and_then(|n| n.parse().ok());
        (index.unwrap_or(usize::MAX), o.object_id.clone())
    });
    for obj in objects {
        held_total += obj.held as u64;
        let Some(i) = obj
            .object_id
            .strip_prefix("card-")
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|&i| i < expected.objects.len())
        else {
            r.assert(false, || format!("unexpected object {}", obj.object_id));
            continue;
        };
        seen[i] = true;
        let want = expected.objects[i];
        if reconciled {
            by_authority += u64::from(receipts.check_reconciled(stream, i, obj, &mut r));
        } else {
            receipts.check_object(stream, i, obj, &mut r);
        }
        // Reconciled, every object ends un-paused at the truth.
        let paused = want.paused && !reconciled;
        r.assert(obj.paused == paused, || {
            format!(
                "{}: paused = {}, expected {}",
                obj.object_id, obj.paused, paused
            )
        });
        if !paused {
            r.assert(obj.version == want.version, || {
                format!(
                    "{}: version {}, expected {}",
                    obj.object_id, obj.version, want.version
                )
            });
            let state_ok = obj.version == want.version && {
                let want_state: serde_json::Value =
                    serde_json::from_str(&stream.expected_state(i, want.version))
                        .unwrap_or(serde_json::Value::Null);
                obj.state.to_value() == want_state
            };
            r.assert(state_ok, || {
                format!(
                    "{}: state {} is not the state of version {}",
                    obj.object_id, obj.state, want.version
                )
            });
            r.assert(obj.held == 0, || {
                format!(
                    "{}: {} held events on a running object",
                    obj.object_id, obj.held
                )
            });
        }
    }
    r.assert(seen.iter().all(|&s| s), || {
        "some known objects are missing".into()
    });
    r.assert(run.counters.event_replacements == counts.applied, || {
        format!(
            "receiver counted {} event replacements, receipts say {} applied",
            run.counters.event_replacements, counts.applied
        )
    });
    if let Some(authority) = &run.authority {
        check_authority(run, authority, by_authority, &mut r);
    } else {
        let held_receipts =
            counts.held_paused + counts.conflict_event_variant + counts.conflict_version_state;
        r.assert(held_total == held_receipts, || {
            format!(
                "objects hold {held_total} events, receipts say {held_receipts} were held on known objects"
            )
        });
    }
    check_producer_order(stream, run, &mut r);
    if run.producers == 1 {
        check_sequential(stream, run, &mut r);
    }
    r
}

/// What reconciliation must have done: converged within the drain, and
/// counted between `by_authority` (objects whose end no receipt applied)
/// and the snapshots it got (or reconciled in line) authority
/// replacements.
fn check_authority(
    run: &RunOutcome,
    authority: &crate::AuthorityRun,
    by_authority: u64,
    r: &mut CheckReport,
) {
    r.assert(authority.converged_after.is_some(), || {
        "some known object still needed an authority when the drain ended".to_owned()
    });
    let made = run.counters.authority_replacements;
    let most = if authority.inline {
        authority.reconciled
    } else {
        authority.answered.snapshots
    };
    r.assert(made >= by_authority && made <= most, || {
        format!(
            "{made} authority replacements, expected from {by_authority} (objects whose end no \
             receipt applied) to {most} (snapshots applied)"
        )
    });
}

/// What the receipts say about one known object: the events held for it and
/// the highest version a receipt applied.
struct ObjectReceipts {
    /// Per known object: `held (paused)` and conflict receipts naming it.
    held: Vec<usize>,
    /// Per known object: the delivery whose `applied` receipt carried its
    /// highest applied version.
    top: Vec<Option<usize>>,
}

impl ObjectReceipts {
    fn of(stream: &Stream, codes: &[Code]) -> Self {
        let n = stream.spec.objects;
        let (mut held, mut top) = (vec![0usize; n], vec![None::<usize>; n]);
        for (i, (s, &code)) in stream.sent.iter().zip(codes).enumerate() {
            let e = stream.events[s.event as usize];
            if e.role == Role::Ghost {
                continue;
            }
            // The object this copy names (a variant may name another one).
            let (o, version) = stream.named(*s);
            let o = o as usize;
            match code {
                HELD | EVENT_VARIANT | VERSION_STATE => held[o] += 1,
                APPLIED => {
                    let top_version = |d: usize| stream.named(stream.sent[d]).1;
                    if top[o].is_none_or(|t| top_version(t) < version) {
                        top[o] = Some(i);
                    }
                }
                _ => {}
            }
        }
        Self { held, top }
    }

    /// The object must hold exactly the events its receipts held, and be at
    /// the highest version a receipt applied with the state that delivery
    /// carried, paused or not: a receiver that wrote a state no receipt
    /// reports (or reported an application it did not make) fails here.
    fn check_object(&self, stream: &Stream, i: usize, obj: &ObjectState, r: &mut CheckReport) {
        let id = &obj.object_id;
        r.assert(obj.held == self.held[i], || {
            format!(
                "{id}: {} held events, its receipts held {}",
                obj.held, self.held[i]
            )
        });
        let (version, state, by) = match self.top[i] {
            Some(d) => {
                let s = stream.sent[d];
                let content = Content {
                    event: s.event,
                    variant: s.copy == CopyKind::Variant,
                };
                (
                    stream.named(s).1,
                    stream.content_state(content),
                    format!("delivery {d} ({})", stream.event_name(s.event)),
                )
            }
            None => (0, Stream::initial_state(i), "no receipt".to_owned()),
        };
        r.assert(obj.version == version, || {
            format!(
                "{id}: version {}, but the highest version its receipts applied is {version} ({by})",
                obj.version
            )
        });
        if obj.version == version {
            let want: serde_json::Value =
                serde_json::from_str(&state).unwrap_or(serde_json::Value::Null);
            r.assert(obj.state.to_value() == want, || {
                format!(
                    "{id}: state {} at version {version} is not the state {by} applied",
                    obj.state
                )
            });
        }
    }
}

impl ObjectReceipts {
    /// Reconciled: the object (checked against the truth by the caller)
    /// holds nothing, and no receipt applied a version above the truth;
    /// returns whether its end differs from what its receipts applied (an
    /// authority must have replaced it).
    fn check_reconciled(
        &self,
        stream: &Stream,
        i: usize,
        obj: &ObjectState,
        r: &mut CheckReport,
    ) -> bool {
        let id = &obj.object_id;
        r.assert(obj.held == 0, || {
            format!(
                "{id}: {} held events after reconciliation (its receipts held {})",
                obj.held, self.held[i]
            )
        });
        let truth = stream.expectation().objects[i].version;
        let Some(d) = self.top[i] else {
            return truth != 0;
        };
        let s = stream.sent[d];
        let version = stream.named(s).1;
        r.assert(version <= truth, || {
            format!(
                "{id}: delivery {d} ({}) applied v{version}, above the highest version v{truth}",
                stream.event_name(s.event)
            )
        });
        s.copy == CopyKind::Variant || version != truth
    }
}

/// The pause and version rules along each producer's own order. For one
/// producer and one object the decisions happened in stream order (see
/// [`RunOutcome::producers`]), so once a producer got a conflict receipt for
/// an object (which paused it), every later event it sends for that object
/// must be `held (paused)` (a duplicate or a variant is decided by identity
/// first), and each `applied` it gets must be above the versions it got
/// applied before. What other producers sent in between is not ordered
/// against it and is not judged here.
fn check_producer_order(stream: &Stream, run: &RunOutcome, r: &mut CheckReport) {
    #[derive(Default)]
    struct Lane {
        /// The delivery whose conflict receipt paused the object.
        paused_at: Option<usize>,
        /// The highest version applied so far, and by which delivery.
        applied: Option<(u64, usize)>,
    }
    let producers = run.producers.max(1);
    let reconciled = run.authority.is_some();
    let mut lanes: HashMap<(u32, usize), Lane> = HashMap::new();
    for (i, (s, &code)) in stream.sent.iter().zip(&run.codes).enumerate() {
        let e = stream.events[s.event as usize];
        if e.role == Role::Ghost || code >= DUPLICATE {
            continue;
        }
        // The object this copy names, and its version (a variant may name
        // another object than its event's own content: the pause of the
        // object the first record named is judged by the sequential model).
        let (object, version) = stream.named(*s);
        let lane = lanes.entry((object, i % producers)).or_default();
        if code == EVENT_VARIANT {
            lane.paused_at.get_or_insert(i);
            continue;
        }
        let object = || Stream::object_id(object as usize);
        if let (Some(p), true) = (lane.paused_at, reconciled) {
            // Held until the authority, then nothing above it to apply.
            r.assert(code != APPLIED, || {
                format!(
                    "delivery {i} ({}, v{}): applied, but {} was paused by the conflict at \
                     delivery {p}, decided before it in the same producer's order, and an \
                     authority leaves nothing higher",
                    stream.event_name(s.event),
                    version,
                    object()
                )
            });
        } else if let Some(p) = lane.paused_at {
            r.assert(code == HELD, || {
                format!(
                    "delivery {i} ({}, v{}): {}, but {} was paused by the conflict at delivery {p}, \
                     decided before it in the same producer's order: expected held (paused)",
                    stream.event_name(s.event),
                    version,
                    describe_code(code),
                    object()
                )
            });
        }
        match code {
            APPLIED => {
                if let Some((v, at)) = lane.applied {
                    r.assert(version > v, || {
                        format!(
                            "delivery {i} ({}): applied v{} on {} after v{v} was applied at \
                             delivery {at}, before it in the same producer's order",
                            stream.event_name(s.event),
                            version,
                            object()
                        )
                    });
                }
                lane.applied = Some((version, i));
            }
            VERSION_STATE => {
                lane.paused_at.get_or_insert(i);
            }
            _ => {}
        }
    }
}

/// With one producer the order of every object's decisions is the stream
/// order: every receipt, every object and the replacement count must be
/// exactly those of the [`SequentialModel`].
///
/// When the run reconciled: the engine reconciles in line, and the model
/// does so at the same points, so everything is compared, the authority
/// replacements too. The receiver's reconciler answers when it answers:
/// its receipts are compared until the conflict that first paused their
/// object (nothing could have reconciled it before), and only the objects
/// that were never paused are compared at the end (the others are checked
/// against the truth).
fn check_sequential(stream: &Stream, run: &RunOutcome, r: &mut CheckReport) {
    let inline = run.authority.as_ref().is_some_and(|a| a.inline);
    let timed = run.authority.is_some() && !inline;
    let model = SequentialModel::run_with(stream, inline);
    // Timed: the objects the model paused so far.
    let mut paused = vec![false; stream.spec.objects];
    for (i, (&got, &want)) in run.codes.iter().zip(&model.codes).enumerate() {
        let s = stream.sent[i];
        let e = stream.events[s.event as usize];
        if timed && e.role != Role::Ghost {
            let object = stream.named(s).0 as usize;
            let was_paused = paused[object];
            if want == EVENT_VARIANT || want == VERSION_STATE {
                // Every object either record names.
                paused[object] = true;
                paused[e.object as usize] = true;
            }
            if was_paused {
                continue;
            }
        }
        r.assert(got == want, || {
            let s = stream.sent[i];
            format!(
                "delivery {i} ({}, {:?}): {}, the sequential model says {}",
                stream.event_name(s.event),
                s.copy,
                describe_code(got),
                describe_code(want)
            )
        });
    }
    for obj in &run.objects {
        let Some((i, m)) = obj
            .object_id
            .strip_prefix("card-")
            .and_then(|n| n.parse::<usize>().ok())
            .and_then(|i| Some((i, model.objects.get(i)?)))
        else {
            continue; // reported by the final-state check
        };
        if timed && paused[i] {
            continue; // checked against the truth
        }
        let state = m
            .state
            .map_or_else(|| Stream::initial_state(i), |c| stream.content_state(c));
        let want: serde_json::Value =
            serde_json::from_str(&state).unwrap_or(serde_json::Value::Null);
        r.assert(
            (obj.version, obj.paused, obj.held) == (m.version, m.paused, m.held)
                && obj.state.to_value() == want,
            || {
                format!(
                    "{}: v{} paused {} held {} state {}, the sequential model says \
                     v{} paused {} held {} state {state}",
                    obj.object_id,
                    obj.version,
                    obj.paused,
                    obj.held,
                    obj.state,
                    m.version,
                    m.paused,
                    m.held
                )
            },
        );
    }
    if timed {
        return;
    }
    r.assert(
        run.counters.event_replacements == model.replacements,
        || {
            format!(
                "{} event replacements, the sequential model made {}",
                run.counters.event_replacements, model.replacements
            )
        },
    );
    r.assert(
        run.counters.authority_replacements == model.authority_replacements,
        || {
            format!(
                "{} authority replacements, the sequential model made {}",
                run.counters.authority_replacements, model.authority_replacements
            )
        },
    );
}

impl Stream {
    fn event_name(&self, event: u32) -> String {
        self.names(&self.events[event as usize]).0
    }
}
