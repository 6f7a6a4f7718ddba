//! The congestion-map codec: any input is refused unless 8192 bytes; an accepted map emits
//! back byte-exact, and the newly-uncongested mask only names ports that were set before
//! and are clear now.
#![no_main]
use dp_rds::wire::CongMap;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Two maps from the input (it is cycled to 2 x 8192 bytes), as an old and a new one.
    if data.is_empty() {
        assert!(CongMap::parse(data).is_err());
        return;
    }
    let bytes: Vec<u8> = data.iter().copied().cycle().take(2 * 8192).collect();
    let old = CongMap::parse(&bytes[..8192]).unwrap();
    let mut m = old.clone();
    let mask = m.update_from_wire(&bytes[8192..]).unwrap();
    assert_eq!(&m.to_bytes()[..], &bytes[8192..]);
    for port in 0..=u16::MAX {
        if old.test(port) && !m.test(port) {
            assert!(mask & (1 << (port % 64)) != 0);
        }
    }
    if data.len() != 8192 {
        assert!(CongMap::parse(data).is_err());
    }
});
