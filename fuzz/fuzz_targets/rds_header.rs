//! `HeaderRepr::parse` never panics; what it accepts emits back byte-exact (bar padding
//! and checksum) and re-parses equal; the extension area always iterates to an end.
#![no_main]
use dp_rds::wire::{ExtIter, Header, HeaderRepr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(r) = HeaderRepr::parse(&Header::new_unchecked(data)) else {
        return;
    };
    assert!(r.len as usize <= dp_rds::wire::MAX_MSG_SIZE);
    for csum in [false, true] {
        let b = r.to_bytes(csum);
        assert_eq!(HeaderRepr::parse_bytes(&b), Ok(r));
        assert_eq!(&b[..26], &data[..26]);
        assert_eq!(&b[32..48], &data[32..48]);
    }
    assert!(ExtIter::new(&r.ext).count() <= 16);
});
