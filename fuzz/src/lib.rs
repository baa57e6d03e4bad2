//! Shared code of the fuzz targets (see `fuzz_targets/` and `run.sh`).
//!
//! - `json`: an independent strict JSON model (tree parser, canonical form of
//!   semantic content, a re-encoder that changes only what docs/CONTRACT.md §2 ignores);
//! - `envelope`: target (a), `Context::parse` and the fingerprint checked
//!   against the model;
//! - `engine`: target (b), the decision engine fed arbitrary delivery
//!   sequences, replayed twice.

pub mod engine;
pub mod envelope;
pub mod json;
