//! `RsSge::read` and `RsIomap::read` (entries a peer RDMA-writes into our target list) never
//! panic, and emit(parse(b)) gives back the bytes parsed, in either byte order.
#![no_main]
use dp_rsocket::wire::{RsIomap, RsSge};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&order, b)) = data.split_first() else {
        return;
    };
    let be = order & 1 == 1;
    if let Some(s) = RsSge::read(b, be) {
        assert_eq!(s.to_bytes(be)[..], b[..RsSge::LEN]);
    }
    if let Some(m) = RsIomap::read(b, be) {
        assert_eq!(m.to_bytes(be)[..], b[..RsIomap::LEN]);
    }
});
