//! Integration tests, one binary with topic modules.

mod common;

mod authorities;
mod batch;
mod cli;
mod commit;
mod concurrency;
mod counters;
mod create_on_first_snapshot;
mod durability;
mod embedding_example;
mod expired_identity;
mod field_input;
mod fuzz_corpus;
mod group_commit;
mod hostile;
mod http_example;
mod jetstream;
mod limits;
mod loadtest;
mod operate;
mod properties;
mod redo;
mod reducer;
mod reference_fixture;
mod refresh_order;
mod replay_runs;
mod rules;
mod serve;
mod shipments;
mod store;
mod store_locations;
mod subscribe;
mod trail;
mod variants;
mod wire;
