//! Integration tests, one binary with topic modules.

mod common;

mod cli;
mod concurrency;
mod durability;
mod jetstream;
mod properties;
mod reference_fixture;
mod rules;
mod store;
