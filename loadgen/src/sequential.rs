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
    /// Paused by a conflict (nothing reconciles in a load test).
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
}

impl SequentialModel {
    /// Decides every delivery of `stream` in stream order.
    pub(crate) fn run(stream: &Stream) -> Self {
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
                                VERSION_STATE
                            }
                        }
                    };
                    first[k] = Some((content.variant, decided, object));
                    decided
                }
            };
            codes.push(code);
        }
        SequentialModel {
            codes,
            objects,
            replacements,
        }
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
        let model = super::SequentialModel::run(&stream);
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
