//! The RTRS client session against a hostile server and a failing fabric, through the
//! simulator; the operations and invariants are in `src/rtrs_client.rs`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: dataplane_fuzz::rtrs_client::Input| {
    dataplane_fuzz::rtrs_client::run(&input);
});
