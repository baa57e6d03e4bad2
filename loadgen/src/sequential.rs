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
        // Per event identity: the content of its first record and that
        // record's decision; whether a variant of it was recorded.
        let mut first: Vec<Option<(bool, Code)>> = vec![None; stream.events.len()];
        let mut variant_recorded = vec![false; stream.events.len()];
        let mut codes = Vec::with_capacity(stream.len());
        let mut replacements = 0u64;
        for s in &stream.sent {
            let k = s.event as usize;
            let e = stream.events[k];
            let content = Content {
                event: s.event,
                variant: s.copy == CopyKind::Variant,
            };
            let code = match first[k] {
                // 1. identity: the same content again is a duplicate of the
                //    first record's decision.
                Some((variant, decided)) if variant == content.variant => DUPLICATE + decided,
                // A variant already recorded: a duplicate of its conflict.
                Some(_) if variant_recorded[k] => DUPLICATE + EVENT_VARIANT,
                // A new variant: held, and its object paused.
                Some(_) => {
                    variant_recorded[k] = true;
                    let o = &mut objects[e.object as usize];
                    o.paused = true;
                    o.held += 1;
                    EVENT_VARIANT
                }
                None => {
                    let decided = match e.role {
                        // 2. validity: an unknown object is parked.
                        Role::Ghost => HELD_UNKNOWN,
                        Role::Base | Role::Twin => {
                            let o = &mut objects[e.object as usize];
                            if o.paused {
                                // 3. pause: held for reconciliation.
                                o.held += 1;
                                HELD
                            } else if e.version > o.version {
                                // 4. version.
                                o.version = e.version;
                                o.state = Some(content);
                                replacements += 1;
                                APPLIED
                            } else if e.version < o.version {
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
                    first[k] = Some((content.variant, decided));
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
