//! A peer's shared segment as the shm provider validates and reads it (`QpSegView::attach`,
//! `UdSegView::attach`, then the inbound slot or datagram at position `n`); the checks are
//! in `dp_shm::fuzzing::seg_attach`. Input: selector byte (bit 0: queue pair, else UD),
//! memfd length (u32 LE), `n` (u64 LE), the released bounce position (u64 LE), then the
//! segment's first bytes.
#![no_main]
use dataplane_fuzz::take_le;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut d = data;
    let qp = take_le::<1>(&mut d) & 1 == 1;
    let mapped = take_le::<4>(&mut d) as u32;
    let n = take_le::<8>(&mut d);
    let tail = take_le::<8>(&mut d);
    dp_shm::fuzzing::seg_attach(qp, mapped, n, tail, d);
});
