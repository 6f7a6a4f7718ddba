//! The RDS path state machine and engine against a hostile peer, through the simulator;
//! the operations and invariants are in `src/rds.rs`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: dataplane_fuzz::rds::Input| {
    dataplane_fuzz::rds::run(&input);
});
