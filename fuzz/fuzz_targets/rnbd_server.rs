//! The RNBD server session against a hostile client; the requests and invariants are in
//! `src/rnbd_server.rs`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: dataplane_fuzz::rnbd_server::Input| {
    dataplane_fuzz::rnbd_server::run(&input);
});
