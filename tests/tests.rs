//! Integration tests, one binary with topic modules.

mod common;

mod batch;
mod cli;
mod concurrency;
mod counters;
mod durability;
mod fuzz_corpus;
mod group_commit;
mod hostile;
mod http_example;
mod jetstream;
mod limits;
#[cfg(feature = "loadtest")]
mod loadtest;
mod properties;
mod reducer;
mod reference_fixture;
mod rules;
mod shipments;
mod store;
