//! loom models of snapshot-receiver's concurrent cases, run on the code that
//! ships: the real [`Registry`](snapshot_receiver_core::Registry), the real
//! [`Shard`](snapshot_receiver_core::Shard) step
//! ([`Shard::deliver`](snapshot_receiver_core::Shard::deliver),
//! [`Shard::pause`](snapshot_receiver_core::Shard::pause),
//! [`Shard::reconcile`](snapshot_receiver_core::Shard::reconcile)) and the
//! real [`Context`](snapshot_receiver_core::Context), with the core crate's
//! sync facade (`core/src/sync/`) switched to loom.
//!
//! Nothing here is compiled unless the project flag is set; run the suite with
//! `loom-tests/run.sh` (see README.md, *Model checking with loom*). The models
//! live in `tests/models/`; this library is their harness:
//! - `World`: one receiver's shipped shard driver (the core's
//!   `engine::ShardSet`: the shards, each behind a loom mutex, their pause
//!   inboxes, routing by `object_id`), as the tokio receiver drives it;
//!   model 7 drives a durable shard with the core's `engine::Pipeline`;
//! - `explore`: runs one `loom::model` and reports how many interleavings
//!   it explored.
//!
//! Why a flag of our own and not plain `--cfg loom`: `RUSTFLAGS` reaches every
//! crate in the build, and tokio compiles parts of itself out (and expects
//! its own loom setup) under `cfg(loom)`. Under `snapshot_receiver_loom`,
//! tokio and every other dependency build exactly as usual, so the main
//! crate's tokio router compiles unchanged and needs no feature gate; it is
//! simply not used by the models.

#[cfg(snapshot_receiver_loom)]
mod harness;

#[cfg(snapshot_receiver_loom)]
pub use harness::*;
