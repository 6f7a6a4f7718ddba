//! `DsHeader::parse` (the header of every datagram on a UD queue pair) never panics, says a
//! header length that fits what it read, and parse(emit(h)) == h for every h it yields.
#![no_main]
use dp_rsocket::wire::DsHeader;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|b: &[u8]| {
    let Ok((h, len)) = DsHeader::parse(b) else {
        return;
    };
    assert!(len <= b.len() && len == h.buffer_len());
    let mut out = vec![0u8; h.buffer_len()];
    h.emit(&mut out);
    assert_eq!(DsHeader::parse(&out), Ok((h, len)));
});
