//! `DsUdpHeader::parse` (the header of every datagram on the UDP path) never panics, says a
//! header length that fits what it read, and parse(emit(h)) == h for every h it yields.
#![no_main]
use dp_rsocket::wire::DsUdpHeader;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&family, b)) = data.split_first() else {
        return;
    };
    let v6 = family & 1 == 1;
    let Ok((h, len)) = DsUdpHeader::parse(b, v6) else {
        return;
    };
    assert!(len <= b.len() && len == h.buffer_len());
    let mut out = vec![0u8; h.buffer_len()];
    h.emit(&mut out);
    assert_eq!(DsUdpHeader::parse(&out, v6), Ok((h, len)));
});
