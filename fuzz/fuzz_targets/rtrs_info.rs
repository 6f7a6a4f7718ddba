//! RTRS service messages: `InfoReqRepr` (the path name rules), `InfoRsp::chunk_table` (every
//! chunk it hands out lies inside a descriptor of the table, under that descriptor's key),
//! `RkeyRspRepr`; none panics, and what parses re-emits to itself.
#![no_main]
use dp_rtrs::wire::{Geometry, InfoReq, InfoReqRepr, InfoRsp, RkeyRsp, RkeyRspRepr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|x: (u16, u8, &[u8])| {
    let (qd, cs_bits, data) = x;
    if let Ok(r) = InfoReq::new_checked(data).and_then(|p| InfoReqRepr::parse(&p)) {
        let name = r.pathname.as_bytes();
        assert!(!name.is_empty() && !name.iter().any(|&c| c == 0 || c == b'/' || c == b'.'));
        let mut b = [0u8; 272];
        r.emit(&mut InfoReq::new_unchecked(&mut b[..]));
        assert_eq!(
            InfoReqRepr::parse(&InfoReq::new_checked(&b[..]).unwrap()),
            Ok(r)
        );
    }
    if let Ok(g) = Geometry::new(qd.max(1) % 512 + 1, 1 << (cs_bits % 20 + 1)) {
        let mut rbufs = vec![(0u64, 0u32); usize::from(g.queue_depth())];
        if let Ok(v) = InfoRsp::new_checked(data)
            && v.chunk_table(&g, &mut rbufs).is_ok()
        {
            let cs = u64::from(g.chunk_size());
            for &(addr, key) in &rbufs {
                assert!(v.descs().any(|d| d.key == key
                    && addr >= d.addr
                    && addr + cs <= d.addr + u64::from(d.len)));
            }
        }
    }
    if let Ok(r) = RkeyRsp::new_checked(data).and_then(|p| RkeyRspRepr::parse(&p)) {
        let b = r.to_bytes();
        assert_eq!(
            RkeyRspRepr::parse(&RkeyRsp::new_checked(&b[..]).unwrap()),
            Ok(r)
        );
    }
});
