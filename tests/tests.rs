//! Integration tests, one binary with topic modules.

mod common;

mod cli;
mod concurrency;
mod durability;
mod properties;
mod reducer;
mod reference_fixture;
mod rules;
mod shipments;
mod store;
