//! The exact [`SequentialModel`]: what a receiver must answer to every
//! delivery of a [`Stream`] when the deliveries are decided one after another
//! in stream order (the engine, or a single producer).
//!
//! It is deliberately not the engine's code: it never parses a body,
//! fingerprints anything or calls the core crate. It works from what the
//! generator knows about each delivery (which event, which copy) and applies
//! the contract's rules in their order (identity, validity, pause, version)
//! to a plain per-object record, so a rule bug in the engine cannot cancel
//! out in the comparison.

use crate::code::{Code, APPLIED, DUPLICATE, EQUAL, EVENT_VARIANT, HELD, STALE, VERSION_STATE};
use crate::generate::{CopyKind, Role, Stream};

/// `held (unknown_object)`.
const HELD_UNKNOWN: Code = HELD + 1;

/// Which content of an event a delivery carries. Every copy other than a
/// variant repeats the event's own content (byte for byte or re-encoded),
/// and the generator gives every distinct event its own state, so two
/// deliveries carry the same state exactly when they have the same content.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Content {
    /// Index into [`Stream::events`].
    pub(crate) event: u32,
    /// Whether it is the event's conflicting variant.
    pub(crate) variant: bool,
}

/// One known object in the model.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ModelObject {
    /// Current version (0: the initial state).
    pub(crate) version: u64,
    /// The content whose state it holds; `None`: the initial state.
    pub(crate) state: Option<Content>,
    /// Paused by a conflict (and not reconciled since).
    pub(crate) paused: bool,
    /// Events held for it (paused holds and both kinds of conflict).
    pub(crate) held: usize,
}

/// The outcome of deciding a whole stream in order.
pub(crate) struct SequentialModel {
    /// The code every delivery must get, in stream order.
    pub(crate) codes: Vec<Code>,
    /// Every known object at the end, by index.
    pub(crate) objects: Vec<ModelObject>,
    /// How many deliveries replaced an object's state (`applied`).
    pub(crate) replacements: u64,
    /// How many reconciliations replaced an object's state.
    pub(crate) authority_replacements: u64,
}

/// An event held for a known object in the model, for its re-decision.
#[derive(Clone, Copy, Debug)]
struct HeldModel {
    /// Its content.
    content: Content,
    /// Its version.
    version: u64,
    /// How it was held: `held (paused)`, or either kind of conflict.
    held_as: Code,
}

impl SequentialModel {
    /// Decides every delivery of `stream` in stream order; with `reconcile`, the object a conflict
    /// names is reconciled right after it from the generator's truth (its
    /// highest version, that version's own content), as an authority
    /// answering at once would (`run_engine_reconciling`): the version and
    /// state replaced when they differ, the pause cleared, and the held
    /// events decided again in arrival order (docs/CONTRACT.md §4): a
    /// variant is superseded, another state at the authority's own version
    /// too; the rest by the version rules.
    pub(crate) fn run_with(stream: &Stream, reconcile: bool) -> Self {
        let initial = ModelObject {
            version: 0,
            state: None,
            paused: false,
            held: 0,
        };
        let mut objects = vec![initial; stream.spec.objects];
        // Per event identity: the content of its first record, that
        // record's decision and the object it named; whether a variant of
        // it was recorded.
        let mut first: Vec<Option<(bool, Code, u32)>> = vec![None; stream.events.len()];
        let mut variant_recorded = vec![false; stream.events.len()];
        let mut codes = Vec::with_capacity(stream.len());
        let mut replacements = 0u64;
        let mut authority_replacements = 0u64;
        let mut held: Vec<Vec<HeldModel>> = vec![Vec::new(); stream.spec.objects];
        // Per known object: the event whose original content is its truth.
        let mut truth: Vec<Option<u32>> = vec![None; stream.spec.objects];
        let want = &stream.expectation().objects;
        for (k, e) in stream.events.iter().enumerate() {
            if e.role == Role::Base && e.version == want[e.object as usize].version {
                truth[e.object as usize] = Some(k as u32);
            }
        }
        for s in &stream.sent {
            let k = s.event as usize;
            let e = stream.events[k];
            // The object this copy names (a variant may name another one
            // than its event's own content) and the version it carries.
            let (object, version) = e.named(s.copy);
            let content = Content {
                event: s.event,
                variant: s.copy == CopyKind::Variant,
            };
            let code = match first[k] {
                // 1. identity: the same content again is a duplicate of the
                //    first record's decision.
                Some((variant, decided, _)) if variant == content.variant => DUPLICATE + decided,
                // A variant already recorded: a duplicate of its conflict.
                Some(_) if variant_recorded[k] => DUPLICATE + EVENT_VARIANT,
                // A new variant: held, and its object paused; so is the
                // object the first record named, when that is another one
                // (every known object either record names).
                Some((_, _, first_object)) => {
                    variant_recorded[k] = true;
                    let o = &mut objects[object as usize];
                    o.paused = true;
                    o.held += 1;
                    held[object as usize].push(HeldModel {
                        content,
                        version,
                        held_as: EVENT_VARIANT,
                    });
                    objects[first_object as usize].paused = true;
                    EVENT_VARIANT
                }
                None => {
                    let decided = match e.role {
                        // 2. validity: an unknown object is parked.
                        Role::Ghost => HELD_UNKNOWN,
                        Role::Base | Role::Twin => {
                            let o = &mut objects[object as usize];
                            if o.paused {
                                // 3. pause: held for reconciliation.
                                o.held += 1;
                                held[object as usize].push(HeldModel {
                                    content,
                                    version,
                                    held_as: HELD,
                                });
                                HELD
                            } else if version > o.version {
                                // 4. version.
                                o.version = version;
                                o.state = Some(content);
                                replacements += 1;
                                APPLIED
                            } else if version < o.version {
                                STALE
                            } else if o.state == Some(content) {
                                EQUAL
                            } else {
                                o.paused = true;
                                o.held += 1;
                                held[object as usize].push(HeldModel {
                                    content,
                                    version,
                                    held_as: VERSION_STATE,
                                });
                                VERSION_STATE
                            }
                        }
                    };
                    first[k] = Some((content.variant, decided, object));
                    decided
                }
            };
            codes.push(code);
            if reconcile && (code == EVENT_VARIANT || code == VERSION_STATE) {
                if let Some(t) = truth[object as usize] {
                    let i = object as usize;
                    let truth = (
                        stream.events[t as usize].version,
                        Content {
                            event: t,
                            variant: false,
                        },
                    );
                    let (applied, replaced) = Self::reconcile(&mut objects[i], &mut held[i], truth);
                    replacements += applied;
                    authority_replacements += u64::from(replaced);
                }
            }
        }
        SequentialModel {
            codes,
            objects,
            replacements,
            authority_replacements,
        }
    }

    /// Reconciles `o` to `truth` (version, content) and decides its `held`
    /// events again, in arrival order: how many of them were applied, and
    /// whether the authority replaced the state.
    fn reconcile(
        o: &mut ModelObject,
        held: &mut Vec<HeldModel>,
        (version, content): (u64, Content),
    ) -> (u64, bool) {
        let replaced = o.version != version || o.state != Some(content);
        o.version = version;
        o.state = Some(content);
        o.paused = false;
        let mut applied = 0;
        let mut still = Vec::new();
        for h in held.drain(..) {
            if h.held_as == EVENT_VARIANT {
                // The variant itself: superseded by the authority.
                continue;
            }
            if o.paused {
                still.push(h);
            } else if h.version > o.version {
                o.version = h.version;
                o.state = Some(h.content);
                applied += 1;
            } else if h.version < o.version || o.state == Some(h.content) {
                // Stale or equal: decided, no longer held.
            } else if h.version == version {
                // Another state at the authority's own version: superseded.
            } else {
                o.paused = true;
                still.push(h);
            }
        }
        *held = still;
        o.held = held.len();
        (applied, replaced)
    }
}

#[cfg(test)]
mod tests {
    use crate::generate::{generate, CopyKind};
    use crate::spec::LoadSpec;
    use crate::{check, run_engine};

    /// Every event of 4 objects gets a variant, nearly all of them naming
    /// another object: nothing else (no redelivery, no pair, no ghost).
    fn crossing() -> LoadSpec {
        LoadSpec {
            objects: 4,
            versions: 3,
            duplicate_rate: 0.0,
            reorder_window: 2,
            variant_rate: 0.99,
            cross_variant_rate: 0.99,
            conflict_rate: 0.0,
            unknown_rate: 0.0,
            payload_bytes: 0,
            seed: 3,
            ..LoadSpec::default()
        }
    }

    #[test]
    fn a_variant_naming_another_object_pauses_both_and_the_engine_agrees() {
        let stream = generate(&crossing()).unwrap();
        let crossed: Vec<_> = stream.events.iter().filter(|e| e.cross.is_some()).collect();
        assert_eq!((stream.events.len(), crossed.len()), (12, 12));
        // The variant's body names the other object at its own version.
        let (i, s) = stream
            .sent
            .iter()
            .enumerate()
            .find(|(_, s)| s.copy == CopyKind::Variant)
            .unwrap();
        let e = stream.events[s.event as usize];
        let (other, version) = e.cross.unwrap();
        assert_ne!(other, e.object);
        assert_eq!(version, (1 << 32) + u64::from(s.event));
        let body: serde_json::Value = serde_json::from_slice(stream.body(i)).unwrap();
        assert_eq!(body["object_id"], format!("card-{other}"));
        assert_eq!(body["object_version"], version);
        // In stream order the engine gives every receipt and object the
        // model gives (one shard: the pause is in the variant's own step).
        let run = run_engine(&stream);
        let report = check(&stream, stream.expectation(), &run);
        assert_eq!(report.failures, Vec::<String>::new());
        assert!(stream.expectation().objects.iter().all(|o| o.paused));
    }

    #[test]
    fn the_model_pauses_the_object_the_first_record_named() {
        // Seed 22: the one variant (delivery 5, of event 1) names card-0,
        // its event's first record (delivery 1) card-2, and card-2's next
        // event (delivery 7) comes after it, with nothing else paused.
        let spec = LoadSpec {
            objects: 3,
            versions: 4,
            variant_rate: 0.1,
            seed: 22,
            ..crossing()
        };
        let stream = generate(&spec).unwrap();
        let model = super::SequentialModel::run_with(&stream, false);
        let named: Vec<u32> = stream.sent.iter().map(|s| stream.named(*s).0).collect();
        assert_eq!(named, [2, 2, 0, 2, 0, 0, 0, 2, 1, 1, 1, 0, 1]);
        assert_eq!(
            (stream.sent[1].event, stream.sent[1].copy),
            (1, CopyKind::Original)
        );
        assert_eq!(
            (stream.sent[5].event, stream.sent[5].copy),
            (1, CopyKind::Variant)
        );
        // Applied until the variant; then card-0 (the variant's) and card-2
        // (the first record's) hold their new events; card-1 runs on.
        assert_eq!(model.codes, [1, 1, 1, 1, 1, 4, 8, 8, 1, 1, 1, 8, 1]);
        let objects: Vec<_> = model.objects.iter().map(|o| (o.paused, o.held)).collect();
        assert_eq!(objects, [(true, 3), (false, 0), (true, 1)]);
        // The engine decides it so, in stream order.
        let run = run_engine(&stream);
        assert_eq!(
            check(&stream, stream.expectation(), &run).failures,
            Vec::<String>::new()
        );
    }
}
