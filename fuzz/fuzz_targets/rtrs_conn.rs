//! RTRS connect request and response (`ConnReqRepr`, `ConnRspRepr`): parsing never panics,
//! what parses re-emits to the same meaning, and an accept that passes `check_accept` has a
//! geometry whose every chunk and offset round-trips through the 28-bit immediate.
#![no_main]
use dp_rtrs::wire::{ConnReq, ConnReqRepr, ConnRsp, ConnRspRepr, PROTO_VER};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = ConnReq::new_checked(data).and_then(|p| ConnReqRepr::parse(&p)) {
        assert!(r.cid < r.cid_num && r.cid_num <= 4096);
        let b = r.to_bytes();
        let back = ConnReqRepr::parse(&ConnReq::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(
            back,
            ConnReqRepr {
                version: PROTO_VER,
                ..r
            }
        );
    }
    if let Ok(r) = ConnRsp::new_checked(data).and_then(|p| ConnRspRepr::parse(&p)) {
        let b = r.to_bytes();
        let back = ConnRspRepr::parse(&ConnRsp::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(
            back,
            ConnRspRepr {
                version: PROTO_VER,
                ..r
            }
        );
        if let Ok(g) = r.check_accept() {
            for id in [0, g.queue_depth() - 1] {
                for off in [0, g.chunk_size() - 1] {
                    let p = g.encode(id, off).unwrap();
                    assert_eq!(g.split(p), Some((id, off)));
                }
            }
        }
    }
});
