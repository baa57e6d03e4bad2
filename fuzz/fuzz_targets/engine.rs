//! The decision engine fed arbitrary delivery sequences (see `src/engine.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use snapshot_receiver_fuzz::engine::{run, Scenario};

fuzz_target!(|scenario: Scenario| {
    let _counters = run(&scenario);
});
