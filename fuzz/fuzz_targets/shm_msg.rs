//! The shm provider's connection-management decoder (`Msg::decode`, fed every datagram a
//! peer sends on its control socket); the checks are in `dp_shm::fuzzing::cm_msg`.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| dp_shm::fuzzing::cm_msg(data));
