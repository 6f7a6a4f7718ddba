//! RDS-IB private data: parsing (v4 and v6 layouts) and version negotiation never panic;
//! what parses emits back equal; a negotiated version is 3.1 or 4.x. The RDMA window
//! announcement after it (`peer_window`): never panics, and what `append_window` writes
//! reads back.
#![no_main]
use dp_rds::fabric::{CM_PRIVATE_MAX, WINDOW_EXT_LEN, append_window, peer_window};
use dp_rds::wire::ib::{IbConnPrivRepr, IbVersion, check_reply, negotiate_passive};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for v6 in [false, true] {
        if let Ok(v) = negotiate_passive(data, v6) {
            assert!(v == IbVersion::V3_1 || v.major() == 4);
        }
        if let Ok(v) = check_reply(data, v6, IbVersion::V4_1) {
            assert!(v >= IbVersion::V3_1);
        }
        if let Ok(r) = IbConnPrivRepr::parse(data, v6) {
            assert_eq!(r.is_v6(), v6);
            let (b, n) = r.to_bytes();
            assert_eq!(IbConnPrivRepr::parse(&b[..n], v6), Ok(r));
            let base = peer_window(data, n);
            let mut ext = [0u8; 128];
            ext[..n].copy_from_slice(&b[..n]);
            let m = append_window(&mut ext, n, base);
            if n + WINDOW_EXT_LEN <= CM_PRIVATE_MAX {
                assert_eq!(m, n + WINDOW_EXT_LEN);
                assert_eq!(peer_window(&ext[..m], n), base);
            } else {
                assert_eq!(m, n, "no room: nothing appended");
            }
        }
        for at in [32, 56] {
            let _ = peer_window(data, at);
        }
    }
});
