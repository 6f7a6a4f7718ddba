//! The rsocket stream state machine driven by a hostile peer through the simulator; the
//! operations and invariants are in `src/stream.rs`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: dataplane_fuzz::stream::Input| {
    dataplane_fuzz::stream::run(&input);
});
