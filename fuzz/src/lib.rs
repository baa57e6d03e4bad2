//! Shared code of the fuzz targets (see `fuzz_targets/` and `run.sh`).
//!
//! - `json`: an independent strict JSON model (tree parser, canonical form of
//!   semantic content, a re-encoder that changes only what docs/CONTRACT.md §2 ignores);
//! - `envelope`: target (a), `BodyParser::parse` (through `Context::parser`) and the fingerprint checked
//!   against the model;
//! - `engine`: target (b), the decision engine fed arbitrary delivery
//!   sequences, replayed twice;
//! - `webhook`: target (c), `serve`'s webhook signature check on arbitrary
//!   header values and bodies; `verifier` is that check itself, compiled
//!   from the command-line tool's source file.

pub mod engine;
pub mod envelope;
pub mod json;
#[path = "../../cli/src/cmd/serve/webhook.rs"]
#[allow(dead_code)]
pub mod verifier;
pub mod webhook;
