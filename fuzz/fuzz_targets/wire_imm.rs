//! Immediates (`RsMsg`: 3-bit op, 29-bit data; `RsCtrl` codes) and the scaled iomap size
//! byte: every value decodes, and encoding what was decoded gives it back.
#![no_main]
use dp_rsocket::wire::{RsCtrl, RsMsg, scale_decode, scale_encode, scale_round};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|x: (u32, u8, u32)| {
    let (imm, e, v) = x;
    let m = RsMsg(imm);
    assert_eq!(RsMsg::new(u32::from(m.op()), m.data()), m);
    assert_eq!(RsMsg::with(m.op(), m.data()), m);
    assert_eq!(u32::from(RsCtrl::from(m.data())), m.data());
    assert_eq!(scale_encode(scale_decode(e)), e);
    assert_eq!(scale_round(scale_round(v)), scale_round(v));
});
