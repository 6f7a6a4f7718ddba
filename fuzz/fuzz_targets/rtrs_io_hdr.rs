//! RTRS IO headers (`RdmaWriteRepr`, `RdmaReadRepr`) and the `usr_len` rule: parsing never
//! panics, a read's descriptor length is within the limit it was given, and what parses
//! re-emits to itself.
#![no_main]
use dp_rtrs::wire::io::data_len;
use dp_rtrs::wire::{RdmaRead, RdmaReadRepr, RdmaWrite, RdmaWriteRepr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|x: (u32, u32, &[u8])| {
    let (max_len, off, data) = x;
    if let Ok(w) = RdmaWrite::new_checked(data).and_then(|p| RdmaWriteRepr::parse(&p)) {
        let mut b = [0u8; 4];
        w.emit(&mut b);
        assert_eq!(
            RdmaWriteRepr::parse(&RdmaWrite::new_checked(&b[..]).unwrap()),
            Ok(w)
        );
        if let Ok(d) = data_len(off, w.usr_len) {
            assert_eq!(d + u32::from(w.usr_len), off);
        }
    }
    if let Ok(r) = RdmaReadRepr::parse(&RdmaRead::new_unchecked(data), max_len) {
        if let Some(d) = r.desc {
            assert!(d.len != 0 && d.len <= max_len);
        }
        let mut b = [0u8; 24];
        let n = r.buffer_len();
        r.emit(&mut b[..n]);
        let back = RdmaReadRepr::parse(&RdmaRead::new_unchecked(&b[..n]), max_len).unwrap();
        let want = RdmaReadRepr {
            need_inval: r.need_inval && r.desc.is_some(),
            ..r
        };
        assert_eq!(back, want);
    }
});
