//! RTRS immediates: type and payload round-trip, an IO response's payload round-trips, and a
//! geometry's split of any payload is in range and encodes back to the payload.
#![no_main]
use dp_rtrs::wire::{Geometry, Imm, IoRsp, imm::PAYLOAD_MASK};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|x: (u32, u16, u8)| {
    let (raw, qd, cs_bits) = x;
    let i = Imm(raw);
    assert_eq!(Imm::new(i.raw_ty(), i.payload()), i);
    assert_eq!(Imm::with(i.ty(), i.payload()), i);
    let r = IoRsp::decode(i.payload());
    assert_eq!(r.payload(), i.payload());
    assert!(r.errno <= 0 && r.errno > -512);
    if let Ok(g) = Geometry::new(qd, 1 << (cs_bits % 28)) {
        if let Some((id, off)) = g.split(raw) {
            assert!(id < g.queue_depth() && off < g.chunk_size());
            assert_eq!(g.encode(id, off), Some(raw & PAYLOAD_MASK));
        }
    }
});
