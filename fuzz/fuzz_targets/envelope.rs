//! Envelope parser + fingerprint on arbitrary bytes (see `src/envelope.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    snapshot_receiver_fuzz::envelope::check(data);
});
