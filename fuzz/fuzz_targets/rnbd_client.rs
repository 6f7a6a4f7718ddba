//! The RNBD client session against a hostile server and a failing transport; the
//! operations and invariants are in `src/rnbd_client.rs`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: dataplane_fuzz::rnbd_client::Input| {
    dataplane_fuzz::rnbd_client::run(&input);
});
