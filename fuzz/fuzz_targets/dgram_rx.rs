//! The datagram rsocket's receive validation (`dgram/rx.rs`): a datagram on the UDP path
//! from an IPv4 or IPv6 sender, or a UD receive claiming any byte count; the checks are in
//! `dp_rsocket::dgram::fuzzing`. Input: selector byte, claimed UD length (u32 LE), bytes.
#![no_main]
use dataplane_fuzz::take_le;
use dp_rsocket::dgram::fuzzing::{dgram_ud, dgram_udp};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut d = data;
    let sel = take_le::<1>(&mut d);
    let byte_len = take_le::<4>(&mut d) as u32;
    match sel % 4 {
        0 => dgram_udp(d, "10.0.0.1:7471".parse().unwrap()),
        1 => dgram_udp(d, "[fe80::1]:7471".parse().unwrap()),
        2 => dgram_ud(d, byte_len, false),
        _ => dgram_ud(d, byte_len, true),
    }
});
