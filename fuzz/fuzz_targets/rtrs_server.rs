//! The RTRS server against hostile clients, through the simulator's recording driver; the
//! operations and invariants are in `src/rtrs_server.rs`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: dataplane_fuzz::rtrs_server::Input| {
    dataplane_fuzz::rtrs_server::run(&input);
});
