//! Integration tests, one binary with topic modules.

mod common;

mod acknowledgement;
mod authorities;
mod authority_fetch;
mod authority_ops;
mod backends_agree;
mod batch;
mod cli;
mod commit;
mod concurrency;
mod counters;
mod create_on_first_snapshot;
mod doc_commands;
mod durability;
mod embedding_example;
mod expired_identity;
mod field_input;
mod forward;
mod forward_kills;
mod fuzz_corpus;
mod group_commit;
mod hostile;
mod http_example;
mod isolation;
mod jetstream;
mod limits;
mod loadtest;
#[cfg(feature = "lsm")]
mod lsm;
mod malformed_replay;
mod memory_budget;
mod operate;
mod otlp;
mod outbox;
mod pipeline;
mod properties;
mod readme;
mod reconciler;
mod reconciler_faults;
mod redo;
mod reducer;
mod reference_fixture;
mod refresh_order;
mod relay;
mod relay_operator;
mod relay_store;
mod replay_runs;
mod retention;
mod rules;
mod serve;
mod serve_auth;
mod serve_config;
mod serve_isolation;
// unsafe: the open-file limit of the test process and of a `serve` child
// (getrlimit, setrlimit in `pre_exec`) and SIGTERM to it, through libc: std
// has neither call.
#[allow(unsafe_code)]
mod serve_limits;
mod serve_notes;
mod shapes;
mod shipments;
mod store;
mod store_locations;
mod subscribe;
mod trace;
mod trail;
mod variants;
mod waiting_bodies;
mod wire;
mod working_set;
