//! `Msg::parse` never panics on any bytes; what it accepts emits back to the same fields
//! (and re-parses equal), a device name stays within `DEV_NAME_MAX` and holds no NUL, and an
//! IO's byte offset is defined exactly when its sector fits.
#![no_main]
use dp_rnbd::wire::{Close, DEV_NAME_MAX, Io, Msg, Open, OpenRsp, SECTOR, SessInfo, SessInfoRsp};
use libfuzzer_sys::fuzz_target;

fn again(b: &[u8]) -> Msg<'_> {
    Msg::parse(b).expect("an emitted message parses")
}

fuzz_target!(|data: &[u8]| {
    let Ok(m) = Msg::parse(data) else {
        return;
    };
    match m {
        Msg::SessInfo(x) => {
            let mut b = [0u8; SessInfo::LEN];
            x.emit(&mut b);
            assert_eq!(again(&b), m);
        }
        Msg::SessInfoRsp(x) => {
            let mut b = [0u8; SessInfoRsp::LEN];
            x.emit(&mut b);
            assert_eq!(again(&b), m);
        }
        Msg::Open(x) => {
            assert!(x.dev_name.len() <= DEV_NAME_MAX);
            assert!(!x.dev_name.contains(&0));
            let mut b = [0u8; Open::LEN];
            x.emit(&mut b);
            assert_eq!(again(&b), m);
        }
        Msg::OpenRsp(x) => {
            let mut b = [0u8; OpenRsp::LEN];
            x.emit(&mut b);
            assert_eq!(again(&b), m);
        }
        Msg::Io(x) => {
            let mut b = [0u8; Io::LEN];
            x.emit(&mut b);
            assert_eq!(again(&b), m);
            assert_eq!(x.offset(), x.sector.checked_mul(SECTOR));
        }
        Msg::Close(x) => {
            let mut b = [0u8; Close::LEN];
            x.emit(&mut b);
            assert_eq!(again(&b), m);
        }
    }
});
