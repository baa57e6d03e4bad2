//! serve's webhook signature check on arbitrary header values and bodies
//! (see `src/webhook.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    snapshot_receiver_fuzz::webhook::check(data);
});
