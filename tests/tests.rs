//! Integration tests, one binary with topic modules.

mod common;

mod cli;
mod concurrency;
mod durability;
mod http_example;
mod jetstream;
mod properties;
mod reference_fixture;
mod rules;
mod store;
